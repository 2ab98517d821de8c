//! The 27 functions of Mooncake's `transfer_engine_c.h`.
//!
//! Every function validates its handles and pointers, runs inside the panic
//! guard, and writes outputs only on success. `char *` arguments are copied
//! before return. Two return-code families, as in Mooncake: the functions
//! that return a Status (`submitTransfer`, `submitTransferWithNotify`,
//! `getTransferStatus`, `freeBatchID`) give 0 or a positive code, the others
//! 0 or a negative `ERR_*` (the values of Mooncake's `error.h`; C callers
//! get their names from `transfer_engine_ext.h` as `TE_ERR_*`).

use super::boundary::{Call, c_array, guard, init_logging, insert_engine, write_c_string};
use super::types::*;
use crate::batch::TaskStatus;
use crate::codes::{OK, STATUS_INVALID_ARGUMENT, STATUS_OK};
use crate::engine::{Engine, Opcode, Request};
use crate::error::Error;
use crate::memory::{Location, Region};
use std::ffi::{c_char, c_int, c_void};

/// The body of export `func` that needs only a live engine: runs `f` on it
/// and returns 0, or -1 (logged) for a NULL or unknown engine.
fn with_engine(func: &'static str, engine: transfer_engine_t, f: impl FnOnce(&Engine)) -> c_int {
    guard(func, ERR_INVALID_ARGUMENT, |call| {
        f(call.engine(engine)?.as_ref());
        Ok(OK)
    })
}

/// Creates an engine named `local_server_name` whose peers are found through
/// `metadata_conn_string`: `"P2PHANDSHAKE"` (no server), `"http://host:port/path"`,
/// `"etcd://host:port[,host:port]"`, `"redis://host:port"`, or a plain
/// `"host:port"` list meaning etcd. `ip_or_host_name` and `rpc_port` are
/// ignored, as in Mooncake. With `auto_discover` non-zero the network
/// transport is chosen from the machine's topology, as Mooncake does:
/// `"rdma"` when RDMA devices with an active port exist (unless
/// `MC_FORCE_TCP` is set), `"tcp"` otherwise; `"shm"` is installed beside
/// it for peers on this host (`MC_TE_SHM=0` leaves it out). An engine runs
/// several transports at once (copies within its own segment need none;
/// `installTransport` adds more), and each request takes the best one
/// that reaches its target.
///
/// Returns the engine, or NULL (with an error log) when an argument is NULL,
/// the connection string is malformed, its backend is unavailable, or an
/// `MC_*` variable has a value that is not allowed (`te_last_error` names
/// the variable, its value and what it takes).
///
/// # Safety
/// The strings must be NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn createTransferEngine(
    metadata_conn_string: *const c_char,
    local_server_name: *const c_char,
    ip_or_host_name: *const c_char,
    rpc_port: u64,
    auto_discover: c_int,
) -> transfer_engine_t {
    guard("createTransferEngine", std::ptr::null_mut(), |call| {
        init_logging();
        let _ = (ip_or_host_name, rpc_port);
        let conn = call.string(metadata_conn_string, "metadata_conn_string")?;
        let name = call.string(local_server_name, "local_server_name")?;
        let config = call.check(crate::engine::config::config().map_err(Error::from))?;
        let built = Engine::builder(&conn, &name)
            .auto_discover(auto_discover != 0)
            .config(config.clone())
            .build();
        Ok(insert_engine(call.check(built)?))
    })
}

/// Scans the machine's topology (NUMA nodes, NICs, RDMA devices, GPUs) and
/// keeps it for transports installed later.
///
/// Returns 0, or -1 for a NULL or unknown engine.
///
/// # Safety
/// `engine` must be NULL or a handle from `createTransferEngine`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn discoverTopology(engine: transfer_engine_t) -> c_int {
    with_engine("discoverTopology", engine, |e| {
        e.discover_topology();
    })
}

/// Writes `"ip:port"` of the engine's RPC endpoint into `buf_out`
/// (truncated to `buf_len - 1` bytes and NUL-terminated, like `snprintf`).
///
/// Returns 0, or -1 for a NULL or unknown engine, a NULL buffer or a zero
/// length.
///
/// # Safety
/// `buf_out` must be valid for `buf_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getLocalIpAndPort(
    engine: transfer_engine_t,
    buf_out: *mut c_char,
    buf_len: usize,
) -> c_int {
    guard("getLocalIpAndPort", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        write_text(call, buf_out, buf_len, || e.local_ip_and_port())
    })
}

/// Installs the transport `proto`: `"tcp"`, or `"rdma"` (RDMA READ and
/// WRITE over RDMA devices). When `args` and `args[0]` are non-NULL,
/// `args[0]` is a NIC priority matrix JSON string whose devices are used
/// (network interfaces for tcp, RDMA devices for rdma); otherwise
/// `MC_CUSTOM_TOPO_JSON`, else the discovered topology. Buffers registered
/// earlier are registered with the new transport. An engine runs several
/// transports, as Mooncake's `MultiTransport`: each request goes to the
/// most preferred installed one that reaches its target (RDMA, then TCP).
/// Installing an installed protocol returns the same handle.
///
/// Returns an opaque non-NULL handle, or NULL (with an error log) for a
/// NULL or unknown engine or protocol, a malformed matrix, no usable RDMA
/// device, or a transport that failed to start.
///
/// # Safety
/// `proto` must be NULL or NUL-terminated; `args` NULL or an array whose
/// first element is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn installTransport(
    engine: transfer_engine_t,
    proto: *const c_char,
    args: *mut *mut c_void,
) -> transport_t {
    guard("installTransport", std::ptr::null_mut(), |call| {
        let e = call.engine(engine)?;
        let proto = call.string(proto, "proto")?;
        let matrix = if args.is_null() {
            None
        } else {
            // SAFETY: a non-NULL `args` points to at least one element.
            let first = unsafe { *args };
            if first.is_null() {
                None
            } else {
                Some(call.string(first as *const c_char, "args[0]")?)
            }
        };
        let id = call.check(e.install_transport(&proto, matrix.as_deref()))?;
        Ok(id as usize as transport_t)
    })
}

/// Kept for compatibility: transports stay installed until the engine is
/// destroyed, as in Mooncake.
///
/// Returns 0, or -1 for a NULL or unknown engine or a NULL `proto`.
///
/// # Safety
/// `proto` must be NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uninstallTransport(
    engine: transfer_engine_t,
    proto: *const c_char,
) -> c_int {
    guard("uninstallTransport", ERR_INVALID_ARGUMENT, |call| {
        call.engine(engine)?;
        call.string(proto, "proto")?;
        Ok(OK)
    })
}

/// `openSegment`, after refetching a cached descriptor when `sync`.
fn open_segment(
    call: Call<segment_id_t>,
    engine: transfer_engine_t,
    segment_name: *const c_char,
    sync: bool,
) -> Result<segment_id_t, segment_id_t> {
    let e = call.engine(engine)?;
    let name = call.string(segment_name, "segment_name")?;
    if sync {
        e.sync_segment(&name);
    }
    call.check(e.open_segment(&name))
}

/// Opens the segment of the engine named `segment_name` (leading `/` ignored)
/// and returns its id; the engine's own name gives `LOCAL_SEGMENT` (0).
/// Ids are cached per name and never reused.
///
/// Returns the id, or -1 for a NULL or unknown engine, a NULL or empty name,
/// or a segment whose descriptor cannot be fetched or is invalid.
///
/// # Safety
/// `segment_name` must be NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openSegment(
    engine: transfer_engine_t,
    segment_name: *const c_char,
) -> segment_id_t {
    guard("openSegment", INVALID_SEGMENT, |call| {
        open_segment(call, engine, segment_name, false)
    })
}

/// Like `openSegment`, but first refetches the descriptor of a segment that
/// is already cached.
///
/// Returns the id, or -1 as `openSegment` does.
///
/// # Safety
/// `segment_name` must be NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openSegmentNoCache(
    engine: transfer_engine_t,
    segment_name: *const c_char,
) -> segment_id_t {
    guard("openSegmentNoCache", INVALID_SEGMENT, |call| {
        open_segment(call, engine, segment_name, true)
    })
}

/// Kept for compatibility: segment ids stay valid until the engine is
/// destroyed, as in Mooncake.
///
/// Returns 0, or -1 for a NULL or unknown engine.
///
/// # Safety
/// `engine` must be NULL or a handle from `createTransferEngine`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closeSegment(
    engine: transfer_engine_t,
    segment_id: segment_id_t,
) -> c_int {
    let _ = segment_id;
    with_engine("closeSegment", engine, |_| ())
}

/// Pre-connects EFA endpoints to a segment. This engine has no EFA
/// transport, so there is nothing to warm up.
///
/// Returns 0, or -1 for a NULL or unknown engine.
///
/// # Safety
/// `segment_name` must be NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn warmupEfaSegment(
    engine: transfer_engine_t,
    segment_name: *const c_char,
) -> c_int {
    let _ = segment_name;
    with_engine("warmupEfaSegment", engine, |_| ())
}

/// Drops a segment (any name, local or remote) from this engine's cache of
/// descriptors; the next `openSegment` fetches it again.
///
/// Returns 0, or -1 for a NULL or unknown engine or a NULL or empty name.
///
/// # Safety
/// `segment_name` must be NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn removeLocalSegment(
    engine: transfer_engine_t,
    segment_name: *const c_char,
) -> c_int {
    guard("removeLocalSegment", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        let name = call.string(segment_name, "segment_name")?;
        call.err_code(e.remove_segment(&name))?;
        Ok(OK)
    })
}

/// Destroys an engine: in-flight tasks are driven to a terminal state, its
/// metadata entries are removed, and every thread it started has exited
/// when this returns. A NULL, unknown or already destroyed handle is logged
/// and ignored.
///
/// # Safety
/// `engine` must be NULL or a handle from `createTransferEngine`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn destroyTransferEngine(engine: transfer_engine_t) {
    guard("destroyTransferEngine", (), |call| {
        let e = call.remove_engine(engine)?;
        super::graceful::forget(engine);
        e.shutdown();
        Ok(())
    })
}

/// Registers `(addr, length)` `entries` at `location`.
fn register(
    call: Call<c_int>,
    engine: transfer_engine_t,
    entries: &[(u64, u64)],
    location: *const c_char,
    remote: bool,
) -> Result<c_int, c_int> {
    let e = call.engine(engine)?;
    let location = call.string(location, "location")?;
    let location = call.err_code(Location::parse(&location))?;
    let regions = Region::each(entries, &location, remote);
    call.err_code(e.register(&regions))?;
    Ok(OK)
}

/// Registers `length` bytes at `addr` as memory peers (and local requests)
/// may target. `location` is `"cpu:N"`, `"cuda:N"` or `"*"`; with
/// `remote_accessible` 0 peers cannot reach it.
///
/// Returns 0; -1 for a NULL or unknown engine, NULL `addr` or `location`,
/// zero length or a malformed location; -7 when the range overlaps a
/// registered buffer (also the same address twice).
///
/// # Safety
/// `location` must be NULL or NUL-terminated; the memory must stay valid
/// until it is unregistered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn registerLocalMemory(
    engine: transfer_engine_t,
    addr: *mut c_void,
    length: usize,
    location: *const c_char,
    remote_accessible: c_int,
) -> c_int {
    guard("registerLocalMemory", ERR_INVALID_ARGUMENT, |call| {
        register(
            call,
            engine,
            &[(addr as u64, length as u64)],
            location,
            remote_accessible != 0,
        )
    })
}

/// Unregisters the buffer whose base address is exactly `addr`.
///
/// Returns 0; -1 for a NULL or unknown engine or NULL `addr`; -3 when no
/// buffer starts at `addr`.
///
/// # Safety
/// `engine` must be NULL or a handle from `createTransferEngine`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unregisterLocalMemory(
    engine: transfer_engine_t,
    addr: *mut c_void,
) -> c_int {
    guard("unregisterLocalMemory", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        if addr.is_null() {
            return Err(call.fail("addr is NULL"));
        }
        call.err_code(e.unregister(&[addr as u64]))?;
        Ok(OK)
    })
}

/// Registers `buffer_len` buffers at once, all remote accessible, with one
/// location. All are registered, or none.
///
/// Returns 0 (also for `buffer_len` 0); -1 for a NULL or unknown engine,
/// NULL `buffer_list` or `location`, a `buffer_len` whose size in bytes
/// exceeds `PTRDIFF_MAX`, a NULL address or zero length; -7 when buffers
/// overlap each other or a registered buffer.
///
/// # Safety
/// `buffer_list` must be valid for `buffer_len` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn registerLocalMemoryBatch(
    engine: transfer_engine_t,
    buffer_list: *mut buffer_entry_t,
    buffer_len: usize,
    location: *const c_char,
) -> c_int {
    guard("registerLocalMemoryBatch", ERR_INVALID_ARGUMENT, |call| {
        if buffer_len == 0 {
            call.engine(engine)?;
            return Ok(OK);
        }
        // SAFETY: the caller passes `buffer_len` valid entries.
        let list = call.err_code(unsafe { c_array(buffer_list, buffer_len, "buffer_list") })?;
        let entries: Vec<(u64, u64)> = list
            .iter()
            .map(|b| (b.addr as u64, b.length as u64))
            .collect();
        register(call, engine, &entries, location, true)
    })
}

/// Unregisters buffers by base address. Every listed buffer that is
/// registered is removed.
///
/// Returns 0 (also for `addr_len` 0); -1 for a NULL or unknown engine, a
/// NULL `addr_list` or an `addr_len` whose size in bytes exceeds
/// `PTRDIFF_MAX`; -3 when an address is not a registered base.
///
/// # Safety
/// `addr_list` must be valid for `addr_len` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unregisterLocalMemoryBatch(
    engine: transfer_engine_t,
    addr_list: *mut *mut c_void,
    addr_len: usize,
) -> c_int {
    guard("unregisterLocalMemoryBatch", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        if addr_len == 0 {
            return Ok(OK);
        }
        // SAFETY: the caller passes `addr_len` valid entries.
        let list = call.err_code(unsafe { c_array(addr_list, addr_len, "addr_list") })?;
        let addrs: Vec<u64> = list.iter().map(|&a| a as u64).collect();
        call.err_code(e.unregister(&addrs))?;
        Ok(OK)
    })
}

/// Allocates a batch that holds up to `batch_size` requests.
///
/// Returns the batch id, or `INVALID_BATCH` for a NULL or unknown engine or
/// a `batch_size` above 4194304.
///
/// # Safety
/// `engine` must be NULL or a handle from `createTransferEngine`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn allocateBatchID(
    engine: transfer_engine_t,
    batch_size: usize,
) -> batch_id_t {
    guard("allocateBatchID", INVALID_BATCH, |call| {
        let e = call.engine(engine)?;
        call.check(e.allocate_batch(batch_size))
    })
}

/// Converts C requests, rejecting bad opcodes before anything runs.
fn requests(entries: *const transfer_request, count: usize) -> Result<Vec<Request>, Error> {
    // SAFETY: the caller passes `count` valid entries.
    let list = unsafe { c_array(entries, count, "entries") }?;
    list.iter()
        .map(|r| {
            Ok(Request {
                opcode: Opcode::from_raw(r.opcode)?,
                source: r.source as u64,
                target_id: r.target_id,
                target_offset: r.target_offset,
                length: r.length,
            })
        })
        .collect()
}

/// `submitTransfer`, sending `notify` (name, message) when the batch is
/// seen done.
fn submit(
    call: Call<c_int>,
    engine: transfer_engine_t,
    batch_id: batch_id_t,
    entries: *const transfer_request,
    count: usize,
    notify: Option<(String, String)>,
) -> Result<c_int, c_int> {
    let e = call.engine(engine)?;
    // The room is checked first: a count the batch cannot hold (up to
    // SIZE_MAX) is refused before one request is read.
    let result = e
        .check_room(batch_id, count)
        .and_then(|()| requests(entries, count))
        .and_then(|reqs| match notify {
            None => e.submit(batch_id, &reqs),
            Some((name, msg)) => e.submit_with_notify(batch_id, &reqs, name, msg),
        });
    call.status_code(result)?;
    Ok(STATUS_OK)
}

/// The name and message of a notification, both copied (and each logged
/// when NULL) before either is checked.
fn notify_strings<R: Copy>(call: Call<R>, notify_msg: notify_msg_t) -> Result<(String, String), R> {
    let name = call.string(notify_msg.name, "notify_msg.name");
    let msg = call.string(notify_msg.msg, "notify_msg.msg");
    Ok((name?, msg?))
}

/// Writes `text()` into the caller's `buf_out` of `buf_len` bytes, like
/// `snprintf`; refuses a NULL buffer or a zero length.
fn write_text(
    call: Call<c_int>,
    buf_out: *mut c_char,
    buf_len: usize,
    text: impl FnOnce() -> String,
) -> Result<c_int, c_int> {
    if buf_out.is_null() || buf_len == 0 {
        return Err(call.fail("buf_out is NULL or buf_len is 0"));
    }
    write_c_string(&text(), buf_out, buf_len);
    Ok(OK)
}

/// Submits `count` requests to a batch. Every check runs before any task is
/// created: on error the batch is unchanged. Task ids continue from the
/// batch's earlier submits. Each request completes asynchronously; poll it
/// with `getTransferStatus`.
///
/// Returns 0; 1 for a NULL or unknown engine, an unknown or freed batch,
/// NULL `entries`, a bad opcode or a segment id that is not open; 2 when the
/// batch has no room for `count` more requests (any count up to `SIZE_MAX`:
/// the room is checked before a request is read); 8 when the segment's
/// protocol is not installed.
///
/// # Safety
/// `entries` must be valid for `count` entries; every `source` must stay
/// valid until its task is terminal.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn submitTransfer(
    engine: transfer_engine_t,
    batch_id: batch_id_t,
    entries: *mut transfer_request,
    count: usize,
) -> c_int {
    guard("submitTransfer", STATUS_INVALID_ARGUMENT, |call| {
        submit(call, engine, batch_id, entries, count, None)
    })
}

/// Like `submitTransfer`, and once every task of the batch has been seen
/// COMPLETED by `getTransferStatus`, sends `notify_msg` to the owner of
/// `entries[0].target_id`.
///
/// Returns the codes of `submitTransfer`, and 1 when `count` is 0 or a
/// notify string is NULL.
///
/// # Safety
/// As `submitTransfer`; the notify strings must be NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn submitTransferWithNotify(
    engine: transfer_engine_t,
    batch_id: batch_id_t,
    entries: *mut transfer_request,
    count: usize,
    notify_msg: notify_msg_t,
) -> c_int {
    guard(
        "submitTransferWithNotify",
        STATUS_INVALID_ARGUMENT,
        |call| {
            if count == 0 {
                return Err(call.fail("count is 0"));
            }
            let notify = notify_strings(call, notify_msg)?;
            submit(call, engine, batch_id, entries, count, Some(notify))
        },
    )
}

/// Takes every notification received so far (oldest first). `*size` is set
/// to their number. The engine keeps at most `MC_NOTIFY_QUEUE_MAX_COUNT`
/// (65536) notifications and `MC_NOTIFY_QUEUE_MAX_BYTES` (64 MiB) of names
/// and messages between two calls; beyond, the oldest are dropped (and
/// counted in the log). A notification larger than `MC_NOTIFY_MAX_SIZE`
/// (64 KiB) is refused to its sender.
///
/// Returns a `malloc`ed array to release with `freeNotifsMsgBuf`, or NULL
/// when there are none, on allocation failure, or for a NULL or unknown
/// engine or NULL `size` (then `*size` is 0 when `size` is not NULL).
///
/// # Safety
/// `size` must be NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getNotifsFromEngine(
    engine: transfer_engine_t,
    size: *mut c_int,
) -> *mut notify_msg_t {
    guard("getNotifsFromEngine", std::ptr::null_mut(), |call| {
        if size.is_null() {
            return Err(call.fail("size is NULL"));
        }
        // SAFETY: `size` is non-NULL and valid for writing.
        unsafe { *size = 0 };
        let e = call.engine(engine)?;
        let notifies = e.take_notifies();
        if notifies.is_empty() {
            return Ok(std::ptr::null_mut());
        }
        let array = super::notify::to_c_array(&notifies).ok_or_else(|| {
            call.fail(format_args!(
                "out of memory; {} notifications lost",
                notifies.len()
            ))
        })?;
        // SAFETY: as above.
        unsafe { *size = notifies.len() as c_int };
        Ok(array)
    })
}

/// Releases an array from `getNotifsFromEngine` and its strings.
///
/// Returns 0, or -1 for a NULL array with a non-zero `size` or a negative
/// `size`.
///
/// # Safety
/// `msg` must come from `getNotifsFromEngine` with the `size` it reported,
/// and must not be used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn freeNotifsMsgBuf(msg: *mut notify_msg_t, size: c_int) -> c_int {
    guard("freeNotifsMsgBuf", ERR_INVALID_ARGUMENT, |call| {
        if size < 0 || (msg.is_null() && size > 0) {
            return Err(call.fail("NULL array or negative size"));
        }
        // SAFETY: `msg` came from `getNotifsFromEngine` with `size` entries.
        unsafe { super::notify::free_c_array(msg, size as usize) };
        Ok(OK)
    })
}

/// Sends a notification now to the owner of segment `target_id`.
///
/// Returns 0; -1 for a NULL or unknown engine or a NULL string; -200 for a
/// segment that is not open or a reply without `notify_msg` (the peer
/// refused it, e.g. as larger than its `MC_NOTIFY_MAX_SIZE`); -101, -102 or
/// -103 for name resolution, socket or JSON errors. A refused or reset
/// connection is tried again until `MC_HANDSHAKE_CONNECT_TIMEOUT`.
///
/// # Safety
/// The notify strings must be NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn genNotifyInEngine(
    engine: transfer_engine_t,
    target_id: u64,
    notify_msg: notify_msg_t,
) -> c_int {
    guard("genNotifyInEngine", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        let (name, msg) = notify_strings(call, notify_msg)?;
        call.err_code(e.send_notify(target_id, &name, &msg))?;
        Ok(OK)
    })
}

/// Reads the status of task `task_id` (its position across the batch's
/// submits). `*status` is written only when 0 is returned. When the task
/// FAILED and the engine knows why (a peer that refused the connection
/// or cannot be reached, a range it refused), `te_last_error` says so
/// after this call, which still returns 0.
///
/// Returns 0; 1 for a NULL or unknown engine, an unknown or freed batch, a
/// NULL `status` or a task id not yet submitted.
///
/// # Safety
/// `status` must be NULL or valid for writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getTransferStatus(
    engine: transfer_engine_t,
    batch_id: batch_id_t,
    task_id: usize,
    status: *mut transfer_status,
) -> c_int {
    guard("getTransferStatus", STATUS_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        if status.is_null() {
            return Err(call.fail("status is NULL"));
        }
        let (s, bytes) = call.status_code(e.status(batch_id, task_id))?;
        if s == TaskStatus::Failed {
            if let Ok(Some(why)) = e.failure_reason(batch_id, task_id) {
                call.record(format_args!("task {task_id} FAILED: {why}"));
            }
        }
        // SAFETY: `status` is non-NULL and valid for writing.
        unsafe {
            *status = transfer_status {
                status: s as c_int,
                transferred_bytes: bytes,
            }
        };
        Ok(STATUS_OK)
    })
}

/// Frees a batch. Every task must have been seen terminal (COMPLETED or
/// FAILED) through `getTransferStatus` first.
///
/// Returns 0; 1 for a NULL or unknown engine or an unknown or already freed
/// batch; 4 while a task has not been seen terminal (the batch stays valid).
///
/// # Safety
/// `engine` must be NULL or a handle from `createTransferEngine`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn freeBatchID(engine: transfer_engine_t, batch_id: batch_id_t) -> c_int {
    guard("freeBatchID", STATUS_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        let freed = e.free_batch(batch_id);
        if freed == Err(Error::BatchBusy) {
            // Normal use (a batch freed before its tasks were seen
            // terminal): recorded, not logged.
            call.record(Error::BatchBusy);
            return Err(Error::BatchBusy.status_code());
        }
        call.status_code(freed)?;
        Ok(STATUS_OK)
    })
}

/// Refetches every cached remote segment descriptor and replaces those that
/// changed (a restarted peer, new buffers).
///
/// Returns 0, or -1 for a NULL or unknown engine.
///
/// # Safety
/// `engine` must be NULL or a handle from `createTransferEngine`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncSegmentCache(engine: transfer_engine_t) -> c_int {
    with_engine("syncSegmentCache", engine, |e| e.sync_all_segments())
}

/// Fills `stats` with up to `*count` per-device loads (in-flight bytes and
/// an EWMA bandwidth) and sets `*count` to the number of devices.
///
/// Returns 0, or -1 for a NULL or unknown engine or a NULL pointer.
///
/// # Safety
/// `stats` must be valid for `*count` entries; `count` valid for reading
/// and writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getNicLoadStats(
    engine: transfer_engine_t,
    stats: *mut nic_load_stat_t,
    count: *mut usize,
) -> c_int {
    guard("getNicLoadStats", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        if stats.is_null() || count.is_null() {
            return Err(call.fail("stats or count is NULL"));
        }
        let loads = e.nic_loads();
        // SAFETY: `count` is non-NULL and valid for reading and writing.
        let capacity = unsafe { *count };
        for (i, load) in loads.iter().take(capacity).enumerate() {
            let mut name = [0 as c_char; 64];
            write_c_string(&load.device, name.as_mut_ptr(), name.len());
            // SAFETY: i < *count, and `stats` is valid for *count entries.
            unsafe {
                *stats.add(i) = nic_load_stat {
                    device_name: name,
                    inflight_bytes: load.inflight_bytes,
                    ewma_bandwidth_bps: load.ewma_bandwidth_bps,
                }
            };
        }
        // SAFETY: as above.
        unsafe { *count = loads.len() };
        Ok(OK)
    })
}

/// On SIGINT or SIGTERM, destroys this engine (removing its metadata) before
/// the signal's default action runs.
///
/// A NULL or unknown engine is logged and ignored.
///
/// # Safety
/// `engine` must be NULL or a handle from `createTransferEngine`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn enableGracefulShutdown(engine: transfer_engine_t) {
    guard("enableGracefulShutdown", (), |call| {
        call.engine(engine)?;
        super::graceful::enable(engine);
        Ok(())
    })
}

/// Writes a report of the local NICs (RDMA devices and network interfaces,
/// their NUMA node, speed and addresses) and the NIC priority matrix, as
/// text, or as JSON when `json` is non-zero. Truncated to `buf_len - 1`
/// bytes and NUL-terminated.
///
/// Returns 0, or -1 for a NULL or unknown engine, a NULL buffer or a zero
/// length.
///
/// # Safety
/// `buf_out` must be valid for `buf_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn showLinks(
    engine: transfer_engine_t,
    buf_out: *mut c_char,
    buf_len: usize,
    json: c_int,
) -> c_int {
    guard("showLinks", ERR_INVALID_ARGUMENT, |call| {
        let e = call.engine(engine)?;
        write_text(call, buf_out, buf_len, || e.show_links(json != 0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes::{STATUS_COMPLETED, STATUS_FAILED};
    use crate::engine::config::Config;
    use crate::ffi::ext::te_last_error;
    use std::time::{Duration, Instant};

    fn last_error() -> String {
        let mut buf = vec![0 as c_char; 4096];
        // SAFETY: `buf` is valid for its length.
        unsafe { te_last_error(buf.as_mut_ptr(), buf.len()) };
        // SAFETY: te_last_error NUL-terminated `buf`.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn get_transfer_status_of_a_task_failed_on_a_dead_peer_says_why() {
        let engine = || {
            let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
                .config(Config::default())
                .build()
                .expect("engine");
            e.install_transport("tcp", None).expect("tcp");
            e
        };
        let (a, b) = (engine(), engine());
        let target = vec![0u8; 4096];
        let region = |buf: &[u8]| Region {
            addr: buf.as_ptr() as u64,
            length: buf.len() as u64,
            location: Location::parse("cpu:0").expect("location"),
            remote_accessible: true,
        };
        b.register(&[region(&target)]).expect("register");
        let seg = a.open_segment(b.local_name()).expect("open");
        // Its listeners close: every connection to it is refused.
        b.shutdown();
        let src = vec![7u8; 4096];
        let batch = a.allocate_batch(1).expect("batch");
        a.submit(
            batch,
            &[Request {
                opcode: Opcode::Write,
                source: src.as_ptr() as u64,
                target_id: seg,
                target_offset: target.as_ptr() as u64,
                length: 4096,
            }],
        )
        .expect("submit");
        let handle = insert_engine(a);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut st = transfer_status {
                status: -1,
                transferred_bytes: 0,
            };
            // SAFETY: `handle` is live; `st` is valid for writing.
            assert_eq!(unsafe { getTransferStatus(handle, batch, 0, &mut st) }, 0);
            assert_ne!(st.status, STATUS_COMPLETED);
            if st.status == STATUS_FAILED {
                break;
            }
            assert!(Instant::now() < deadline, "not FAILED within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        let why = last_error();
        assert!(
            why.starts_with("getTransferStatus: task 0 FAILED: "),
            "{why}"
        );
        assert!(why.contains("Connection refused"), "{why}");
        assert_eq!(target, vec![0u8; 4096]);
        // SAFETY: `handle` is live.
        assert_eq!(unsafe { freeBatchID(handle, batch) }, 0);
        assert_eq!(last_error(), "", "a call that succeeds clears it");
        // SAFETY: `handle` is live and not used after.
        unsafe { destroyTransferEngine(handle) };
    }
}
