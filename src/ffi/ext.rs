//! Our own functions beyond Mooncake's 27, declared in
//! `include/transfer_engine_ext.h` and prefixed `te_`: the library version,
//! the text of this thread's last error, the buffers of a segment and the
//! transport that carries its data, memory the engine moves fastest, a
//! wait for a whole batch, its cancel, where its notification stands,
//! and the engine's metrics.
#![allow(non_camel_case_types)]

use super::boundary::{guard, guard_keeping_last_error, with_last_error, write_c_string};
use super::types::{ERR_INVALID_ARGUMENT, batch_id_t, segment_id_t, transfer_engine_t};
use crate::batch::NotifyStatus;
use crate::codes::OK;
use crate::engine::cancel::CancelOutcome;
use crate::engine::wait::WaitOutcome;
use std::ffi::{c_char, c_int, c_void};
use std::time::{Duration, Instant};

/// The version of the library, NUL-terminated.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// One buffer of a segment, from `te_segment_buffers`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct te_buffer_info {
    /// Start address in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// `"cpu:N"`, `"cuda:N"` or `"*"` (NUL-terminated, truncated to 63
    /// bytes); empty when the owner does not publish it (TCP segments).
    pub location: [c_char; 64],
}
/// Typedef of `struct te_buffer_info`.
pub type te_buffer_info_t = te_buffer_info;

// The layout the header gives C.
const _: () = {
    assert!(size_of::<te_buffer_info>() == 80);
    assert!(std::mem::offset_of!(te_buffer_info, length) == 8);
    assert!(std::mem::offset_of!(te_buffer_info, location) == 16);
};

/// The version of the library, e.g. `"0.1.0"`: a static string, never
/// freed. Leaves the last error of the thread as it is.
#[unsafe(no_mangle)]
pub extern "C" fn te_version() -> *const c_char {
    guard_keeping_last_error("te_version", std::ptr::null(), |_| {
        Ok(VERSION.as_ptr().cast())
    })
}

/// Copies the text of the last error of a call made on this thread (any of
/// the Mooncake functions or `te_*`) into `buf`, like
/// `snprintf(buf, len, "%s", msg)`: truncated and NUL-terminated; nothing
/// is written when `buf` is NULL or `len` is 0. Every other call (except
/// `te_version`) clears the text first, so after a call that succeeded
/// there is none, except after `getTransferStatus` of a FAILED task: then
/// it says why the task failed, where the engine knows. This function
/// leaves it as it is.
///
/// Returns the full length of the message (without the NUL), 0 when there
/// is none.
///
/// # Safety
/// `buf` must be NULL or valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn te_last_error(buf: *mut c_char, len: usize) -> usize {
    guard_keeping_last_error("te_last_error", 0, |_| {
        Ok(with_last_error(|msg| {
            write_c_string(msg, buf, len);
            msg.len()
        }))
    })
}

/// Lists the buffers of an open segment (`LOCAL_SEGMENT`: this engine's
/// own registered buffers, by address; another id: the buffers the peer
/// published, in its order): writes min(`capacity`, total) entries to `out`
/// (which may be NULL when `capacity` is 0) and sets `*count` to the total.
///
/// Returns 0, or -1 for a NULL or unknown engine, a segment id that is not
/// open, a NULL `count`, or a NULL `out` with a non-zero `capacity`.
///
/// # Safety
/// `out` must be valid for `capacity` entries; `count` valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn te_segment_buffers(
    engine: transfer_engine_t,
    segment: segment_id_t,
    out: *mut te_buffer_info_t,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    guard("te_segment_buffers", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        if count.is_null() || (out.is_null() && capacity > 0) {
            return Err(call.fail("count is NULL, or out is NULL with a non-zero capacity"));
        }
        let buffers = call.err_code(e.segment_buffers(segment))?;
        for (i, b) in buffers.iter().take(capacity).enumerate() {
            let mut location = [0 as c_char; 64];
            write_c_string(&b.location, location.as_mut_ptr(), location.len());
            // SAFETY: i < capacity, and `out` is valid for `capacity` entries.
            unsafe {
                *out.add(i) = te_buffer_info {
                    addr: b.addr,
                    length: b.length,
                    location,
                }
            };
        }
        // SAFETY: `count` is non-NULL and valid for writing.
        unsafe { *count = buffers.len() };
        Ok(OK)
    })
}

/// Writes the name of the transport that carries data to an open segment
/// now into `buf`, like `snprintf(buf, len, "%s", name)` (truncated and
/// NUL-terminated; the names are at most 5 bytes, so 8 bytes always hold
/// one): `"local"` for `LOCAL_SEGMENT` (copies within the process), else
/// `"shm"`, `"rdma"` or `"tcp"`: the transport the segment's requests went
/// to as last seen, which changes when one hands a part it cannot move on
/// to the next (shared memory the kernel refuses, RDMA rails that all
/// failed: TCP), and back when the most preferred one carries a whole
/// request again; before the first request, the most preferred installed
/// transport that speaks the segment. Each change is logged once, with its
/// reason. With `MC_TE_REQUIRE_TRANSPORT` only the listed transports
/// count.
///
/// Returns 0, or -1 for a NULL or unknown engine, a segment id that is not
/// open, a NULL `buf` or a `len` of 0, or a segment that no installed
/// transport (that `MC_TE_REQUIRE_TRANSPORT` allows) speaks.
///
/// # Safety
/// `buf` must be NULL or valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn te_segment_transport(
    engine: transfer_engine_t,
    segment: segment_id_t,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    guard("te_segment_transport", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        if buf.is_null() || len == 0 {
            return Err(call.fail("buf is NULL or len is 0"));
        }
        let name = call.err_code(e.segment_transport(segment))?;
        write_c_string(name, buf, len);
        Ok(OK)
    })
}

/// Zeroed memory of `size` bytes that the engine moves faster than memory
/// from `malloc`, to register with `registerLocalMemory` like any buffer:
/// with the shared-memory transport installed, a memfd that peers on this
/// host copy with memcpy instead of cross-memory attach.
///
/// Returns NULL (with the reason in `te_last_error`) for a NULL or unknown
/// engine, a `size` of 0, when no installed transport has such memory (use
/// `malloc`), or when the memory cannot be had. Freed with
/// `te_free_buffer` after `unregisterLocalMemory`, or when the engine is
/// destroyed.
#[unsafe(no_mangle)]
pub extern "C" fn te_allocate_buffer(engine: transfer_engine_t, size: usize) -> *mut c_void {
    guard("te_allocate_buffer", std::ptr::null_mut(), |call| {
        let e = call.engine(engine)?;
        let addr = call
            .check(e.allocate_buffer(size).transpose())?
            .ok_or_else(|| {
                call.fail("no installed transport allocates memory (install \"shm\"), use malloc")
            })?;
        Ok(addr as usize as *mut c_void)
    })
}

/// Frees memory from `te_allocate_buffer`; unregister it first.
///
/// Returns 0, or -1 for a NULL or unknown engine, a pointer that is not
/// such memory (or was freed), or memory still registered.
#[unsafe(no_mangle)]
pub extern "C" fn te_free_buffer(engine: transfer_engine_t, addr: *mut c_void) -> c_int {
    guard("te_free_buffer", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        call.err_code(e.free_buffer(addr as u64))?;
        Ok(OK)
    })
}

/// `te_wait_batch`: every task completed.
pub const TE_WAIT_COMPLETED: c_int = 0;
/// `te_wait_batch`: every task ended, and one or more failed or were
/// cancelled (`te_cancel_batch`), or the batch's notification was not
/// delivered (`te_notify_status`).
pub const TE_WAIT_FAILED: c_int = 1;
/// `te_wait_batch`: a task was still running when the timeout passed, or
/// reports TIMEOUT (`MC_SLICE_TIMEOUT`).
pub const TE_WAIT_TIMED_OUT: c_int = 2;

/// The longest wait `te_wait_batch` takes: about 49 days.
const LONGEST_WAIT_MS: u64 = u32::MAX as u64;

/// Waits until every task submitted to the batch so far has ended
/// (COMPLETED, FAILED or CANCELED), one reports TIMEOUT (as soon as the first one
/// has waited `MC_SLICE_TIMEOUT` since its submission), or `timeout_ms`
/// milliseconds have passed (at most about 49 days), instead
/// of the caller polling `getTransferStatus`: for the first millisecond
/// it polls the tasks (doing a share of the engine's work, as
/// `getTransferStatus` does) and yields the CPU between polls, then parks
/// until a task it waits for ends. So a caller waiting for a large
/// transfer leaves its core to the threads that move the bytes (ours, or
/// on this host the peer's), and wakes as soon as the last task ends.
/// Every ended task counts as seen, so after `TE_WAIT_COMPLETED` or
/// `TE_WAIT_FAILED` the batch can be freed; `getTransferStatus` still
/// tells each task's status (and why a task failed).
///
/// Returns `TE_WAIT_COMPLETED` (0), `TE_WAIT_FAILED` (1) or
/// `TE_WAIT_TIMED_OUT` (2); -1 for a NULL or unknown engine, or an
/// unknown or freed batch.
#[unsafe(no_mangle)]
pub extern "C" fn te_wait_batch(
    engine: transfer_engine_t,
    batch_id: batch_id_t,
    timeout_ms: u64,
) -> c_int {
    guard("te_wait_batch", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        let deadline = Instant::now() + Duration::from_millis(timeout_ms.min(LONGEST_WAIT_MS));
        let tasks = call.err_code(e.submitted_tasks(batch_id))?;
        Ok(
            match call.err_code(e.wait_tasks(batch_id, tasks, deadline))? {
                WaitOutcome::Completed => TE_WAIT_COMPLETED,
                WaitOutcome::Failed => {
                    if let Ok(NotifyStatus::Failed(why)) = e.notify_status(batch_id) {
                        call.record(format_args!("the notification was not delivered: {why}"));
                    }
                    TE_WAIT_FAILED
                }
                WaitOutcome::TimedOut => TE_WAIT_TIMED_OUT,
            },
        )
    })
}

/// Copies the engine's metrics in the Prometheus text exposition format
/// (version 0.0.4, what `GET /metrics` on `MC_TE_METRICS_ADDR` serves;
/// the families are described in `docs/metrics.md`) into `buf`, like
/// `snprintf(buf, len, "%s", text)`: truncated and NUL-terminated; nothing
/// is written when `buf` is NULL or `len` is 0 (to ask for the length).
///
/// Returns the full length of the text (without the NUL): call again
/// with a buffer of at least that plus 1 when it was larger than `len - 1`.
/// Returns 0, with the reason in `te_last_error`, for a NULL or unknown
/// engine.
///
/// # Safety
/// `buf` must be NULL or valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn te_metrics_text(
    engine: transfer_engine_t,
    buf: *mut c_char,
    len: usize,
) -> usize {
    guard("te_metrics_text", 0, |call| {
        let e = call.engine(engine)?;
        let text = e.metrics_text();
        write_c_string(&text, buf, len);
        Ok(text.len())
    })
}

/// `te_cancel_batch`: every task of the batch has ended, and none reads or
/// writes a byte any more.
pub const TE_CANCEL_DONE: c_int = 0;
/// `te_cancel_batch`: a slice was still moving when the timeout passed;
/// its task has not ended yet.
pub const TE_CANCEL_PENDING: c_int = 1;

/// Cancels a batch: every task submitted to it that has not ended ends
/// `STATUS_CANCELED` (3), as `getTransferStatus` then reports it (a task
/// whose every byte had already moved ends COMPLETED, one that had failed
/// FAILED). Slices not yet moving are withdrawn on every transport;
/// slices a peer is already copying (a TCP WRITE it has not acknowledged,
/// a shared-memory WRITE the target process is copying, an RDMA work
/// request posted) are waited for up to `timeout_ms` milliseconds (at
/// most about 49 days). Other batches, peers and threads are not
/// disturbed.
///
/// Returns `TE_CANCEL_DONE` (0) once every task of the batch has ended and
/// no byte of any of them is read or written afterwards (the rule of
/// FAILED tasks): the caller may reuse or free their memory, and
/// `freeBatchID` succeeds. Returns `TE_CANCEL_PENDING` (1) when a slice
/// was still held at the timeout: its task stays unended, and a later
/// `te_cancel_batch` or `te_wait_batch` sees it end. Returns -1 for a
/// NULL or unknown engine, or an unknown or freed batch.
#[unsafe(no_mangle)]
pub extern "C" fn te_cancel_batch(
    engine: transfer_engine_t,
    batch_id: batch_id_t,
    timeout_ms: u64,
) -> c_int {
    guard("te_cancel_batch", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        let timeout = Duration::from_millis(timeout_ms.min(LONGEST_WAIT_MS));
        Ok(match call.err_code(e.cancel_batch(batch_id, timeout))? {
            CancelOutcome::Done => TE_CANCEL_DONE,
            CancelOutcome::Pending => TE_CANCEL_PENDING,
        })
    })
}

/// `te_notify_status`: the batch carries no notification.
pub const TE_NOTIFY_NONE: c_int = 0;
/// `te_notify_status`: its tasks are still running, or it is being sent
/// (or sent again while the peer cannot take it).
pub const TE_NOTIFY_PENDING: c_int = 1;
/// `te_notify_status`: the peer's engine accepted it.
pub const TE_NOTIFY_DELIVERED: c_int = 2;
/// `te_notify_status`: it was not delivered and will not be;
/// `te_last_error` says why.
pub const TE_NOTIFY_FAILED: c_int = 3;

/// Where the notification of a batch submitted with
/// `submitTransferWithNotify` stands: `TE_NOTIFY_NONE` (0, none),
/// `TE_NOTIFY_PENDING` (1: a task is still running, or it is being sent),
/// `TE_NOTIFY_DELIVERED` (2: the peer's engine accepted it) or
/// `TE_NOTIFY_FAILED` (3: a task failed or was cancelled, so it was not
/// sent; or the peer did not take it within `MC_TE_NOTIFY_TIMEOUT_SEC`,
/// refused it, may have received it without answering, or restarted since
/// the data reached it; `te_last_error` says which). A notification is
/// sent again only while the peer surely did not get it (its handshake
/// port refuses connections, or its queue is full), so it never arrives
/// twice. Once every task has ended, asking hands it to the background to
/// send, as `getTransferStatus` does. `te_wait_batch` reports such a
/// batch `TE_WAIT_COMPLETED` only once its notification was delivered,
/// and `TE_WAIT_FAILED` when it failed.
///
/// Returns one of those, or -1 for a NULL or unknown engine, or an
/// unknown or freed batch.
#[unsafe(no_mangle)]
pub extern "C" fn te_notify_status(engine: transfer_engine_t, batch_id: batch_id_t) -> c_int {
    guard("te_notify_status", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        Ok(match call.err_code(e.notify_status(batch_id))? {
            NotifyStatus::None => TE_NOTIFY_NONE,
            NotifyStatus::Pending => TE_NOTIFY_PENDING,
            NotifyStatus::Delivered => TE_NOTIFY_DELIVERED,
            NotifyStatus::Failed(why) => {
                call.record(format_args!("the notification was not delivered: {why}"));
                TE_NOTIFY_FAILED
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_batch_refuses_a_null_engine_and_says_so() {
        assert_eq!(
            te_wait_batch(std::ptr::null_mut(), 1, 10),
            ERR_INVALID_ARGUMENT
        );
        let msg = "te_wait_batch: engine handle 0x0 is NULL, unknown or destroyed";
        // SAFETY: NULL buffer with length 0 asks for the length only.
        assert_eq!(unsafe { te_last_error(std::ptr::null_mut(), 0) }, msg.len());
    }

    #[test]
    fn metrics_text_refuses_a_null_engine_and_says_so() {
        let mut buf = [1 as c_char; 4];
        // SAFETY: a NULL engine is an invalid argument; `buf` holds 4 bytes.
        let n = unsafe { te_metrics_text(std::ptr::null_mut(), buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, 0);
        assert_eq!(buf, [1; 4], "nothing written on failure");
        let msg = "te_metrics_text: engine handle 0x0 is NULL, unknown or destroyed";
        // SAFETY: NULL buffer with length 0 asks for the length only.
        assert_eq!(unsafe { te_last_error(std::ptr::null_mut(), 0) }, msg.len());
    }

    #[test]
    fn version_is_the_crate_version() {
        // SAFETY: te_version returns a static NUL-terminated string.
        let v = unsafe { std::ffi::CStr::from_ptr(te_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn last_error_reports_the_last_call_of_this_thread() {
        let mut buf = [0 as c_char; 8];
        // SAFETY: NULL engine and count are invalid arguments, not UB.
        let rc = unsafe {
            te_segment_buffers(
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, ERR_INVALID_ARGUMENT);
        // SAFETY: NULL buffer with length 0 asks for the length only.
        let full = unsafe { te_last_error(std::ptr::null_mut(), 0) };
        let msg = "te_segment_buffers: engine handle 0x0 is NULL, unknown or destroyed";
        assert_eq!(full, msg.len());
        // SAFETY: `buf` holds 8 bytes.
        let again = unsafe { te_last_error(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(again, full, "reading the error does not clear it");
        // SAFETY: te_last_error NUL-terminated `buf`.
        let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(text.to_bytes(), &msg.as_bytes()[..7]);
        // Another thread has its own record.
        // SAFETY: as above.
        let other = std::thread::spawn(|| unsafe { te_last_error(std::ptr::null_mut(), 0) });
        assert_eq!(other.join().unwrap(), 0);
        let _ = te_version();
        // SAFETY: as above.
        assert_eq!(unsafe { te_last_error(std::ptr::null_mut(), 0) }, full);
        // A call that succeeds clears it.
        // SAFETY: a NULL array of size 0 is valid.
        let freed = unsafe { crate::ffi::mooncake::freeNotifsMsgBuf(std::ptr::null_mut(), 0) };
        assert_eq!(freed, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { te_last_error(std::ptr::null_mut(), 0) }, 0);
    }
}
