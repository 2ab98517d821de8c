//! Completion channels and completion queues.

use super::library::{
    ibv_ack_cq_events, ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel,
    ibv_destroy_cq, ibv_get_cq_event, ibv_wc_status_str,
};
use super::{Context, check, set_nonblocking};
use rdma_sys::{ibv_comp_channel, ibv_cq, ibv_poll_cq, ibv_req_notify_cq, ibv_wc};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;

/// A completion channel (a file descriptor that becomes readable when an
/// armed completion queue gets a completion), destroyed on drop.
pub struct CompletionChannel {
    ptr: NonNull<ibv_comp_channel>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    /// Creates a non-blocking completion channel on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> io::Result<CompletionChannel> {
        // SAFETY: the context is open (the Arc keeps it so).
        let raw = unsafe { ibv_create_comp_channel(ctx.as_ptr()) };
        let ptr = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        let ch = CompletionChannel {
            ptr,
            ctx: ctx.clone(),
        };
        set_nonblocking(ch.fd())?;
        Ok(ch)
    }

    /// The descriptor to wait on.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is alive; `fd` is a plain field.
        unsafe { (*self.ptr.as_ptr()).fd }
    }

    /// Takes and acknowledges a pending event; returns the
    /// [`CompletionQueue::id`] of the queue it names, `None` when no event
    /// is pending.
    pub fn take_event(&self) -> io::Result<Option<usize>> {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: the channel is alive and non-blocking; out-pointers valid.
        if unsafe { ibv_get_cq_event(self.ptr.as_ptr(), &mut cq, &mut cq_ctx) } != 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: the event names a live CQ of this channel (each holds an
        // Arc to the channel, and the event was raised before it could be
        // destroyed); each event is acknowledged once.
        unsafe { ibv_ack_cq_events(cq, 1) };
        Ok(Some(cq as usize))
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ attached to the channel holds an Arc to it and is
        // destroyed; the channel is destroyed once.
        if let Err(e) = check(unsafe { ibv_destroy_comp_channel(self.ptr.as_ptr()) }) {
            tracing::warn!(
                "ibv_destroy_comp_channel on {} failed: {e}",
                self.ctx.name()
            );
        }
    }
}

/// One work completion, as the transport needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request id given at post time.
    pub wr_id: u64,
    /// `IBV_WC_SUCCESS` (0) or an error status.
    pub status: u32,
    /// The queue pair the request ran on.
    pub qp_num: u32,
    /// Vendor error code, for logs.
    pub vendor_err: u32,
}

impl WorkCompletion {
    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.status == rdma_sys::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// Whether the request was flushed (its queue pair was in error).
    pub fn flushed(&self) -> bool {
        self.status == rdma_sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR
    }

    /// Whether the peer refused the access (bad rkey or range).
    pub fn remote_access_error(&self) -> bool {
        self.status == rdma_sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR
    }

    /// The status as libibverbs names it.
    pub fn status_name(&self) -> String {
        // SAFETY: `ibv_wc_status_str` returns a static string for any value.
        let s = unsafe { ibv_wc_status_str(self.status) };
        if s.is_null() {
            return format!("status {}", self.status);
        }
        // SAFETY: non-NULL, static and NUL-terminated.
        unsafe { std::ffi::CStr::from_ptr(s) }
            .to_string_lossy()
            .into_owned()
    }
}

/// A completion queue bound to a completion channel (which it may share
/// with other queues), destroyed on drop.
pub struct CompletionQueue {
    ptr: NonNull<ibv_cq>,
    channel: Arc<CompletionChannel>,
    capacity: u32,
}

// SAFETY: verbs objects may be used from any thread; libibverbs serializes
// polling internally.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

/// Completions taken per `ibv_poll_cq` call.
const POLL_BATCH: usize = 64;

impl CompletionQueue {
    /// Creates a queue of at least `cqe` entries whose events go to
    /// `channel`.
    pub fn new(channel: &Arc<CompletionChannel>, cqe: u32) -> io::Result<CompletionQueue> {
        let n =
            libc::c_int::try_from(cqe).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the context and channel are alive (Arcs); no CQ context
        // pointer is used.
        let raw = unsafe {
            ibv_create_cq(
                channel.ctx.as_ptr(),
                n,
                std::ptr::null_mut(),
                channel.ptr.as_ptr(),
                0,
            )
        };
        let ptr = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: the CQ was just created; `cqe` is its real size.
        let real = unsafe { (*ptr.as_ptr()).cqe };
        Ok(CompletionQueue {
            ptr,
            channel: channel.clone(),
            capacity: u32::try_from(real).unwrap_or(cqe),
        })
    }

    pub(super) fn as_ptr(&self) -> *mut ibv_cq {
        self.ptr.as_ptr()
    }

    /// Entries the queue holds.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Identifies the queue among those of its channel (what
    /// [`CompletionChannel::take_event`] returns).
    pub fn id(&self) -> usize {
        self.as_ptr() as usize
    }

    /// Asks for an event on the channel at the next completion.
    pub fn arm(&self) -> io::Result<()> {
        // SAFETY: the CQ is alive.
        check(unsafe { ibv_req_notify_cq(self.as_ptr(), 0) })
    }

    /// Appends up to `max` completions to `out`; returns how many.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> io::Result<usize> {
        let mut wcs: [MaybeUninit<ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        let want = max.min(POLL_BATCH) as i32;
        // SAFETY: the CQ is alive and `wcs` has room for `want` entries.
        let n = unsafe { ibv_poll_cq(self.as_ptr(), want, wcs.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq failed ({n})")));
        }
        let n = n as usize;
        // SAFETY: `ibv_poll_cq` wrote the first `n` entries.
        out.extend(
            wcs[..n]
                .iter()
                .map(|wc| unsafe { wc.assume_init_ref() })
                .map(|wc| WorkCompletion {
                    wr_id: wc.wr_id,
                    status: wc.status,
                    qp_num: wc.qp_num,
                    vendor_err: wc.vendor_err,
                }),
        );
        Ok(n)
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc to it and is gone;
        // every event taken was acknowledged; destroyed once.
        if let Err(e) = check(unsafe { ibv_destroy_cq(self.as_ptr()) }) {
            tracing::warn!("ibv_destroy_cq on {} failed: {e}", self.channel.ctx.name());
        }
    }
}
