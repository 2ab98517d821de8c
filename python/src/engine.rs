//! `TransferEngine`: the methods of Mooncake's `mooncake.engine.TransferEngine`
//! with its signatures, defaults and return codes, and beside them methods
//! that take Python buffers and raise `TransferError` with the engine's
//! error text.
//!
//! Rule for arguments: where Mooncake returns a code, the same code is
//! returned (and the reason logged); where Mooncake would crash or read out
//! of bounds (an uninitialized engine, a NULL address, a length beyond the
//! bytes given), a Python exception is raised instead. Every call that can
//! block (network, waiting for transfers, topology discovery) releases the
//! GIL.
//!
//! Rule for objects: a buffer object (not a bare address) handed to a
//! transfer stays alive, with its buffer export, until the engine has
//! ended every byte it moves: an asynchronous batch holds its objects until
//! it is seen finished, a synchronous call that gives up hands them to the
//! abandoned batch, and both release them once the engine has ended the
//! batch or has stopped.

use crate::core::{Core, Failure, OpResult, Piece, lock};
use crate::errors::TransferError;
use crate::local::{Access, Local};
use crate::notify::TransferNotify;
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use std::sync::{Arc, RwLock};
use tracing::error;
use transfer_engine::config;
use transfer_engine::topology::{PriorityMatrix, Topology};
use transfer_engine::{Engine, Opcode};
use transfer_engine::{Location, Region};

/// A transfer engine with the API of Mooncake's `mooncake.engine.TransferEngine`.
///
/// Create it, call `initialize(...)`, register memory, then move bytes to
/// and from peers by name. Methods named as Mooncake's return Mooncake's
/// integer codes; `write`, `read`, `batch_write`, `batch_read`, `register`
/// and `unregister` take Python buffers and raise `TransferError`.
#[pyclass(frozen, module = "transfer_engine._native")]
pub struct TransferEngine {
    core: RwLock<Option<Arc<Core>>>,
}

/// Logs a failure the way Mooncake's binding does and returns its code.
fn code_of(func: &str, f: &Failure) -> i32 {
    error!("{func}: {}", f.message);
    f.code
}

fn raise(f: Failure) -> PyErr {
    TransferError::new_err((f.message, f.code))
}

fn opcode_of(obj: &Bound<'_, PyAny>) -> PyResult<Opcode> {
    let v: i64 = obj.extract().map_err(|_| {
        PyValueError::new_err("opcode must be TransferOpcode.Read (0) or TransferOpcode.Write (1)")
    })?;
    i32::try_from(v)
        .ok()
        .and_then(|v| Opcode::from_raw(v).ok())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "opcode {v} is neither TransferOpcode.Read (0) nor TransferOpcode.Write (1)"
            ))
        })
}

fn access_of(opcode: Opcode) -> Access {
    match opcode {
        Opcode::Write => Access::Read,
        Opcode::Read => Access::Write,
    }
}

/// Local buffers and their pieces; `None` when the three lists differ in
/// length (Mooncake's -1 case).
fn pieces_of(
    buffers: &[Bound<'_, PyAny>],
    peers: &[u64],
    lengths: Option<&[u64]>,
    access: Access,
) -> PyResult<Option<(Vec<Local>, Vec<Piece>)>> {
    if buffers.len() != peers.len() || lengths.is_some_and(|l| l.len() != buffers.len()) {
        return Ok(None);
    }
    let mut locals = Vec::with_capacity(buffers.len());
    let mut pieces = Vec::with_capacity(buffers.len());
    for (i, (obj, &remote)) in buffers.iter().zip(peers).enumerate() {
        let local = Local::extract(obj, access)?;
        let len = local.span(lengths.map(|l| l[i]))?;
        pieces.push(Piece {
            local: local.addr(),
            remote,
            len,
        });
        locals.push(local);
    }
    Ok(Some((locals, pieces)))
}

const SIZE_MISMATCH: &str = "buffers, peer_buffer_addresses and lengths have different sizes";

/// Rejects a NULL address where Mooncake would dereference it.
fn non_null(addr: u64, what: &str) -> PyResult<()> {
    if addr == 0 {
        return Err(PyValueError::new_err(format!("{what} is NULL (0)")));
    }
    Ok(())
}

/// Refuses `[addr, addr + len)` unless it is mapped host memory of this
/// process: a range that wraps or is longer than `isize::MAX`, one with a
/// page no mapping holds (asked of the kernel, which touches nothing), or
/// GPU memory, which these helpers would copy with the CPU.
fn host_memory(addr: u64, len: usize, what: &str) -> PyResult<()> {
    let end = addr
        .checked_add(len as u64)
        .filter(|_| isize::try_from(len).is_ok())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "{what} {addr:#x} and a length of {len} bytes go past the end of memory"
            ))
        })?;
    if !mapped(addr, end) {
        return Err(PyValueError::new_err(format!(
            "{what} {addr:#x}+{len} is not memory of this process (a part of it is not mapped)"
        )));
    }
    match transfer_engine::residence(addr, len as u64) {
        transfer_engine::Residence::Host => Ok(()),
        gpu => Err(PyValueError::new_err(format!(
            "{what} {addr:#x} is {gpu}; this function copies with the CPU"
        ))),
    }
}

/// Whether every page of `[addr, end)` is mapped in this process:
/// `msync(MS_ASYNC)`, which does nothing to memory but fails with ENOMEM
/// where a page of the range is not mapped.
fn mapped(addr: u64, end: u64) -> bool {
    if end == addr {
        return true;
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    let start = addr - addr % page;
    // SAFETY: msync only checks the range's mappings with MS_ASYNC; it
    // reads and writes no memory.
    unsafe {
        libc::msync(
            start as *mut libc::c_void,
            (end - start) as usize,
            libc::MS_ASYNC,
        ) == 0
    }
}

/// The devices of a comma-separated `device_name` (empty: every device).
fn device_list(device_name: Option<&str>) -> Vec<String> {
    device_name
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn cuda_only(name: &str) -> PyErr {
    PyNotImplementedError::new_err(format!(
        "{name} needs a CUDA build of the transfer engine; this build has none (SUPPORT_CUDA is False)"
    ))
}

fn location_regions(entries: &[(u64, u64)], location: &str, remote: bool) -> OpResult<Vec<Region>> {
    let location = Location::parse(location).map_err(|e| Failure::from_engine(&e))?;
    Ok(Region::each(entries, &location, remote))
}

impl TransferEngine {
    /// The initialized engine, or `RuntimeError`.
    fn core(&self) -> PyResult<Arc<Core>> {
        let core = self
            .core
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                PyRuntimeError::new_err(
                    "the TransferEngine is not initialized; call initialize() first",
                )
            })?;
        if core.forked() {
            return Err(PyRuntimeError::new_err(
                "this TransferEngine was initialized in the parent of this forked process, \
                 which cannot use it (close() it, or initialize a new one here)",
            ));
        }
        Ok(core)
    }

    /// Runs `op` on the initialized engine with the GIL released, then
    /// releases, with the GIL, the objects of the batches that ended
    /// meanwhile.
    fn run<T: Send>(&self, py: Python<'_>, op: impl FnOnce(&Core) -> T + Send) -> PyResult<T> {
        let core = self.core()?;
        let out = py.detach(|| op(&core));
        drop(core.take_ended());
        Ok(out)
    }

    /// Creates the engine (`initializeExt` with the connection string
    /// already built) and replaces any earlier one.
    fn start(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        conn: &str,
        devices: &[String],
        auth_key_file: Option<&str>,
    ) -> OpResult<()> {
        // A value the configuration refuses fails here, named (logged and
        // -1, as every failure of `initialize`).
        let cfg = config()
            .map_err(|e| Failure::with_code(-1, "initialize", &e.into()))?
            .clone();
        let cfg = match auth_key_file {
            Some(files) => cfg.with_auth_key_file(files),
            None => cfg,
        };
        let timeout = cfg.engine.transfer_timeout_secs;
        let engine = py
            .detach(|| {
                Engine::builder(conn, local_hostname)
                    .auto_discover(true)
                    .devices(devices)
                    .config(cfg)
                    .build()
            })
            .map_err(|e| Failure::with_code(-1, "initialize", &e))?;
        let old = self
            .core
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .replace(Arc::new(Core::new(engine, timeout)));
        py.detach(move || drop(old));
        Ok(())
    }

    /// A synchronous transfer of `pieces`, whose memory `objects` hold.
    fn sync_transfer(
        &self,
        py: Python<'_>,
        target: &str,
        opcode: Opcode,
        pieces: &[Piece],
        notify: Option<(String, String)>,
        objects: Vec<Local>,
    ) -> PyResult<OpResult<()>> {
        self.run(py, |core| {
            core.transfer_sync(target, opcode, pieces, notify, objects)
        })
    }

    fn async_transfer(
        &self,
        py: Python<'_>,
        target: &str,
        buffers: Vec<Bound<'_, PyAny>>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: Opcode,
    ) -> PyResult<u64> {
        // An uninitialized engine is reported before the arguments.
        self.core()?;
        let Some((locals, pieces)) = pieces_of(
            &buffers,
            &peer_buffer_addresses,
            Some(&lengths),
            access_of(opcode),
        )?
        else {
            error!("batch_transfer_async: {SIZE_MISMATCH}");
            return Ok(0);
        };
        // The batch keeps the objects until it has ended.
        match self.run(py, |core| {
            core.transfer_async(target, opcode, &pieces, locals)
        })? {
            Ok(id) => Ok(id),
            Err(f) => {
                code_of("batch_transfer_async", &f);
                Ok(0)
            }
        }
    }

    fn register_entries(
        &self,
        py: Python<'_>,
        entries: &[(u64, u64)],
        location: &str,
        remote: bool,
    ) -> PyResult<OpResult<()>> {
        let core = self.core()?;
        let regions = match location_regions(entries, location, remote) {
            Ok(r) => r,
            Err(f) => return Ok(Err(f)),
        };
        Ok(py.detach(|| {
            core.engine
                .register(&regions)
                .map_err(|e| Failure::from_engine(&e))
        }))
    }

    fn unregister_addrs(&self, py: Python<'_>, addrs: &[u64]) -> PyResult<OpResult<()>> {
        let core = self.core()?;
        let result = py.detach(|| {
            core.engine
                .unregister(addrs)
                .map_err(|e| Failure::from_engine(&e))
        });
        // Objects pinned by `register` are released once the engine no
        // longer reaches them.
        let released: Vec<Local> = {
            let mut pinned = lock(&core.pinned);
            addrs.iter().filter_map(|a| pinned.remove(a)).collect()
        };
        drop(released);
        Ok(result)
    }

    /// One synchronous transfer of `length` bytes (default: the whole
    /// buffer).
    #[allow(clippy::too_many_arguments)]
    fn sync_one(
        &self,
        py: Python<'_>,
        target: &str,
        buffer: &Bound<'_, PyAny>,
        peer_address: u64,
        length: Option<u64>,
        opcode: Opcode,
        notify: Option<(String, String)>,
    ) -> PyResult<OpResult<()>> {
        let local = Local::extract(buffer, access_of(opcode))?;
        let piece = Piece {
            local: local.addr(),
            remote: peer_address,
            len: local.span(length)?,
        };
        self.sync_transfer(py, target, opcode, &[piece], notify, vec![local])
    }

    /// One synchronous batch; `None` when the lists differ in length.
    #[allow(clippy::too_many_arguments)]
    fn sync_many(
        &self,
        py: Python<'_>,
        target: &str,
        buffers: &[Bound<'_, PyAny>],
        peer_addresses: &[u64],
        lengths: Option<&[u64]>,
        opcode: Opcode,
        notify: Option<(String, String)>,
    ) -> PyResult<Option<OpResult<()>>> {
        let Some((locals, pieces)) =
            pieces_of(buffers, peer_addresses, lengths, access_of(opcode))?
        else {
            return Ok(None);
        };
        self.sync_transfer(py, target, opcode, &pieces, notify, locals)
            .map(Some)
    }
}

/// The integer-returning form of a synchronous transfer: 0 or -1.
fn sync_code(func: &str, r: Option<OpResult<()>>) -> i32 {
    match r {
        Some(Ok(())) => 0,
        Some(Err(f)) => code_of(func, &f),
        None => {
            error!("{func}: {SIZE_MISMATCH}");
            -1
        }
    }
}

/// The raising form of a synchronous transfer.
fn sync_raise(r: Option<OpResult<()>>) -> PyResult<()> {
    match r {
        Some(r) => r.map_err(raise),
        None => Err(PyValueError::new_err(
            "buffers, peer_addresses and lengths have different sizes",
        )),
    }
}

#[pymethods]
impl TransferEngine {
    #[new]
    fn new() -> Self {
        TransferEngine {
            core: RwLock::new(None),
        }
    }

    /// Creates the engine named `local_hostname` whose peers are found
    /// through `metadata_server`: `"P2PHANDSHAKE"`, `"http://host:port/path"`,
    /// `"etcd://host:port"` (or a bare `"host:port"`), `"redis://host:port"`.
    /// The transport is chosen by auto-discovery, as in Mooncake: RDMA on
    /// the machine's RDMA devices (only those of the comma-separated
    /// `device_name`, when given), TCP on a machine without any; `protocol`
    /// only selects Mooncake's GPU allocators, and `"xgmi"` is refused. In P2P mode the engine's
    /// name becomes `"<local_hostname host>:<get_rpc_port()>"`.
    ///
    /// Returns 0, or -1 (logged) when the engine cannot be created.
    #[pyo3(signature = (local_hostname, metadata_server, protocol, device_name = None))]
    fn initialize(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: Option<&str>,
        device_name: Option<&str>,
    ) -> i32 {
        self.initialize_ext(
            py,
            local_hostname,
            metadata_server,
            protocol,
            device_name,
            None,
            None,
        )
    }

    /// `initialize` with the metadata type separate: `metadata_server`
    /// without `"://"` becomes `"<metadata_type>://<metadata_server>"`
    /// (unless it is `"P2PHANDSHAKE"`).
    ///
    /// `auth_key_file` names the cluster key file(s) (`new[,old]`), as
    /// `MC_TE_AUTH_KEY_FILE` does and instead of it.
    ///
    /// Returns 0, or -1 (logged).
    #[pyo3(signature = (local_hostname, metadata_server, protocol, device_name = None, metadata_type = None, auth_key_file = None))]
    #[allow(clippy::too_many_arguments)]
    fn initialize_ext(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: Option<&str>,
        device_name: Option<&str>,
        metadata_type: Option<&str>,
        auth_key_file: Option<&str>,
    ) -> i32 {
        if protocol == Some("xgmi") {
            error!("Protocol 'xgmi' is not exposed in the Python API. Use 'hip' instead.");
            return -1;
        }
        let conn = match metadata_type {
            Some(t) if metadata_server != "P2PHANDSHAKE" && !metadata_server.contains("://") => {
                format!("{t}://{metadata_server}")
            }
            _ => metadata_server.to_string(),
        };
        let devices = device_list(device_name);
        match self.start(py, local_hostname, &conn, &devices, auth_key_file) {
            Ok(()) => 0,
            Err(f) => code_of("initialize", &f),
        }
    }

    /// The engine's metrics in the Prometheus text exposition format
    /// (version 0.0.4), as `GET /metrics` on `MC_TE_METRICS_ADDR` serves
    /// them (see the project's docs/metrics.md).
    fn get_metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        let core = self.core()?;
        Ok(py.detach(|| core.engine.metrics_text()))
    }

    /// The port of the engine's handshake (RPC) listener. In P2P mode peers
    /// open this engine as `"<host>:<port>"`.
    fn get_rpc_port(&self) -> PyResult<i32> {
        Ok(i32::from(self.core()?.engine.rpc_port()))
    }

    /// The name peers open this engine's segment by (`"host:port"` in P2P
    /// mode, `local_hostname` with a metadata store).
    #[getter]
    fn local_name(&self) -> PyResult<String> {
        Ok(self.core()?.engine.local_name().to_string())
    }

    /// Registered memory of at least `length` bytes, from Mooncake's
    /// allocator (2 GiB registered chunks split in blocks of 8 KiB to
    /// 256 MiB; larger requests are registered alone).
    ///
    /// Returns the address, or 0 (logged) when memory cannot be mapped or
    /// registered.
    fn allocate_managed_buffer(&self, py: Python<'_>, length: usize) -> PyResult<u64> {
        let core = self.core()?;
        let result = py.detach(|| lock(&core.managed).allocate(&core.engine, length));
        Ok(result.unwrap_or_else(|e| {
            error!("allocate_managed_buffer({length}): {e}");
            0
        }))
    }

    /// Returns a buffer from `allocate_managed_buffer` to the allocator.
    ///
    /// Returns 0, or -1 (logged) for an address the allocator did not hand
    /// out or that was already freed (Mooncake returns 0 and corrupts its
    /// free list).
    fn free_managed_buffer(
        &self,
        py: Python<'_>,
        buffer_addr: u64,
        length: usize,
    ) -> PyResult<i32> {
        let core = self.core()?;
        let result = py.detach(|| lock(&core.managed).free(&core.engine, buffer_addr, length));
        Ok(match result {
            Ok(()) => 0,
            Err(e) => {
                error!("free_managed_buffer: {e}");
                -1
            }
        })
    }

    /// Writes `length` bytes from local `buffer` to `peer_buffer_address`
    /// in the segment `target_hostname` and waits for the end.
    /// `buffer` is an address or any buffer-protocol object (or tensor).
    ///
    /// Returns 0, or -1 (logged).
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let r = self.sync_one(
            py,
            target_hostname,
            buffer,
            peer_buffer_address,
            Some(length),
            Opcode::Write,
            None,
        )?;
        Ok(sync_code("transfer_sync_write", Some(r)))
    }

    /// Reads `length` bytes at `peer_buffer_address` of the segment
    /// `target_hostname` into local `buffer` and waits for the end.
    ///
    /// Returns 0, or -1 (logged).
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let r = self.sync_one(
            py,
            target_hostname,
            buffer,
            peer_buffer_address,
            Some(length),
            Opcode::Read,
            None,
        )?;
        Ok(sync_code("transfer_sync_read", Some(r)))
    }

    /// One READ or WRITE (`opcode`), waited for. With `notify`, the owner
    /// of the segment receives it (`get_notifies`) once the transfer has
    /// completed. `transport_hint` is accepted and ignored, as in
    /// Mooncake's builds without TENT.
    ///
    /// Returns 0, or -1 (logged).
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
        opcode: &Bound<'_, PyAny>,
        notify: Option<PyRef<'_, TransferNotify>>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let opcode = opcode_of(opcode)?;
        let notify = notify.map(|n| n.pair());
        let r = self.sync_one(
            py,
            target_hostname,
            buffer,
            peer_buffer_address,
            Some(length),
            opcode,
            notify,
        )?;
        Ok(sync_code("transfer_sync", Some(r)))
    }

    /// Writes several local buffers to several peer addresses of one
    /// segment, as one batch, and waits for the end.
    ///
    /// Returns 0, or -1 (logged), also when the lists differ in length.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Bound<'_, PyAny>>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let r = self.sync_many(
            py,
            target_hostname,
            &buffers,
            &peer_buffer_addresses,
            Some(&lengths),
            Opcode::Write,
            None,
        )?;
        Ok(sync_code("batch_transfer_sync_write", r))
    }

    /// Reads several peer ranges of one segment into local buffers, as one
    /// batch, and waits for the end.
    ///
    /// Returns 0, or -1 (logged).
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Bound<'_, PyAny>>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let r = self.sync_many(
            py,
            target_hostname,
            &buffers,
            &peer_buffer_addresses,
            Some(&lengths),
            Opcode::Read,
            None,
        )?;
        Ok(sync_code("batch_transfer_sync_read", r))
    }

    /// A batch of READs or WRITEs (`opcode`) to one segment, waited for;
    /// with `notify`, sent to the segment's owner once all completed.
    ///
    /// Returns 0, or -1 (logged).
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Bound<'_, PyAny>>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: &Bound<'_, PyAny>,
        notify: Option<PyRef<'_, TransferNotify>>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let opcode = opcode_of(opcode)?;
        let notify = notify.map(|n| n.pair());
        let r = self.sync_many(
            py,
            target_hostname,
            &buffers,
            &peer_buffer_addresses,
            Some(&lengths),
            opcode,
            notify,
        )?;
        Ok(sync_code("batch_transfer_sync", r))
    }

    /// Submits a batch of WRITEs and returns its id without waiting; wait
    /// with `get_batch_transfer_status([id])` or `transfer_check_status(id)`.
    /// The batch keeps the buffer objects (not bare addresses, which the
    /// caller keeps valid) until it has ended or the engine is closed.
    ///
    /// Returns the batch id, or 0 (logged).
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_async_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Bound<'_, PyAny>>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> PyResult<u64> {
        let _ = transport_hint;
        self.async_transfer(
            py,
            target_hostname,
            buffers,
            peer_buffer_addresses,
            lengths,
            Opcode::Write,
        )
    }

    /// Submits a batch of READs and returns its id without waiting.
    ///
    /// Returns the batch id, or 0 (logged).
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_async_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Bound<'_, PyAny>>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> PyResult<u64> {
        let _ = transport_hint;
        self.async_transfer(
            py,
            target_hostname,
            buffers,
            peer_buffer_addresses,
            lengths,
            Opcode::Read,
        )
    }

    /// Submits a batch of READs or WRITEs (`opcode`) without waiting.
    ///
    /// Returns the batch id, or 0 (logged).
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_async(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<Bound<'_, PyAny>>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: &Bound<'_, PyAny>,
        transport_hint: &str,
    ) -> PyResult<u64> {
        let _ = transport_hint;
        let opcode = opcode_of(opcode)?;
        self.async_transfer(
            py,
            target_hostname,
            buffers,
            peer_buffer_addresses,
            lengths,
            opcode,
        )
    }

    /// Waits for asynchronous batches: each completed batch is freed.
    ///
    /// Returns 0 when all completed; -1 (logged) at the first failure or
    /// expired deadline (`MC_TRANSFER_TIMEOUT` plus 1 ns per byte), or for
    /// an id that is not a pending asynchronous batch of this engine.
    fn get_batch_transfer_status(&self, py: Python<'_>, batch_ids: Vec<u64>) -> PyResult<i32> {
        Ok(match self.run(py, |core| core.wait_batches(&batch_ids))? {
            Ok(()) => 0,
            Err(f) => code_of("get_batch_transfer_status", &f),
        })
    }

    /// Submits one WRITE and returns its batch id without waiting; poll it
    /// with `transfer_check_status`.
    ///
    /// Returns the batch id, or 0 (logged).
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_submit_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: &str,
    ) -> PyResult<u64> {
        let _ = transport_hint;
        self.async_transfer(
            py,
            target_hostname,
            vec![buffer.clone()],
            vec![peer_buffer_address],
            vec![length],
            Opcode::Write,
        )
    }

    /// Polls a batch from `transfer_submit_write` (or an asynchronous
    /// batch) once, without blocking.
    ///
    /// Returns 1 completed, -1 failed (the batch is freed in both cases),
    /// 0 still running, -2 still running past `MC_SLICE_TIMEOUT` or its
    /// deadline; -1 (logged) for an id that is not a pending asynchronous
    /// batch.
    fn transfer_check_status(&self, py: Python<'_>, batch_id: u64) -> PyResult<i32> {
        Ok(match self.run(py, |core| core.check_status(batch_id))? {
            Ok(code) => code,
            Err(f) => code_of("transfer_check_status", &f),
        })
    }

    /// Cancels an asynchronous batch (one that `batch_transfer_async*` or
    /// `transfer_submit_write` returned): its tasks not yet ended end
    /// cancelled, slices not yet moving are withdrawn, and those a peer is
    /// copying are waited for up to `timeout_ms` milliseconds.
    ///
    /// Returns 0 once no byte of the batch is read or written any more
    /// (the batch is freed and its buffer objects released: they are the
    /// caller's again), 1 when a slice was still held at the timeout (the
    /// batch stays pending: cancel or wait again), -1 (logged) for an id
    /// that is not a pending asynchronous batch.
    #[pyo3(signature = (batch_id, timeout_ms = 1000))]
    fn cancel_batch(&self, py: Python<'_>, batch_id: u64, timeout_ms: u64) -> PyResult<i32> {
        let timeout = std::time::Duration::from_millis(timeout_ms);
        Ok(
            match self.run(py, |core| core.cancel_batch(batch_id, timeout))? {
                Ok(code) => code,
                Err(f) => code_of("cancel_batch", &f),
            },
        )
    }

    /// Copies the first `length` bytes of `src` (bytes, str as UTF-8, or
    /// any buffer) to `dest_address`.
    ///
    /// Returns 0. Raises `ValueError` for address 0, a `length` beyond
    /// `src`, a destination that is not mapped memory of this process, or
    /// GPU memory at `dest_address`; `RuntimeError` when the engine is not
    /// initialized.
    fn write_bytes_to_buffer(
        &self,
        dest_address: u64,
        src: &Bound<'_, PyAny>,
        length: usize,
    ) -> PyResult<i32> {
        self.core()?;
        non_null(dest_address, "dest_address")?;
        let copy = |data: &[u8]| -> PyResult<i32> {
            if length > data.len() {
                return Err(PyValueError::new_err(format!(
                    "length {length} exceeds the {} bytes given",
                    data.len()
                )));
            }
            host_memory(dest_address, length, "dest_address")?;
            // SAFETY: `data` holds at least `length` bytes (checked); the
            // caller vouches for `dest_address`, as with Mooncake's memcpy.
            unsafe {
                std::ptr::copy(data.as_ptr(), dest_address as *mut u8, length);
            }
            Ok(0)
        };
        if let Ok(s) = src.cast::<PyString>() {
            return copy(s.to_str()?.as_bytes());
        }
        let local = Local::extract(src, Access::Read)?;
        let size = local.size().ok_or_else(|| {
            PyValueError::new_err("src must be bytes, str or a buffer, not an address")
        })?;
        // SAFETY: the buffer export (held by `local`) covers `size` bytes.
        let data = unsafe { std::slice::from_raw_parts(local.addr() as *const u8, size as usize) };
        copy(data)
    }

    /// The `length` bytes at `source_address`, as `bytes`.
    ///
    /// Raises `ValueError` for address 0, a range that is not mapped memory
    /// of this process (checked before anything is allocated), and for GPU
    /// memory; `RuntimeError` when the engine is not initialized.
    fn read_bytes_from_buffer<'py>(
        &self,
        py: Python<'py>,
        source_address: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.core()?;
        non_null(source_address, "source_address")?;
        host_memory(source_address, length, "source_address")?;
        // SAFETY: the caller vouches for `length` readable bytes at
        // `source_address`, as with Mooncake's binding.
        let data = unsafe { std::slice::from_raw_parts(source_address as *const u8, length) };
        Ok(PyBytes::new(py, data))
    }

    /// Registers `capacity` bytes at `buffer_addr` (reachable by peers).
    /// `location` is `"cpu:N"`, `"cuda:N"` or `"*"`.
    ///
    /// Returns 0; -1 for a zero length, NULL address or other location
    /// string; -7 when the range overlaps a registered buffer.
    #[pyo3(signature = (buffer_addr, capacity, location = "*"))]
    fn register_memory(
        &self,
        py: Python<'_>,
        buffer_addr: u64,
        capacity: u64,
        location: &str,
    ) -> PyResult<i32> {
        Ok(
            match self.register_entries(py, &[(buffer_addr, capacity)], location, true)? {
                Ok(()) => 0,
                Err(f) => code_of("register_memory", &f),
            },
        )
    }

    /// Unregisters the buffer registered at exactly `buffer_addr`.
    ///
    /// Returns 0, or -3 when no buffer starts there.
    fn unregister_memory(&self, py: Python<'_>, buffer_addr: u64) -> PyResult<i32> {
        Ok(match self.unregister_addrs(py, &[buffer_addr])? {
            Ok(()) => 0,
            Err(f) => code_of("unregister_memory", &f),
        })
    }

    /// Registers several buffers with one location; all or none.
    ///
    /// Returns 0; -1 for a zero length or lists of different lengths; -7
    /// for overlaps.
    #[pyo3(signature = (buffer_addresses, capacities, location = "*"))]
    fn batch_register_memory(
        &self,
        py: Python<'_>,
        buffer_addresses: Vec<u64>,
        capacities: Vec<u64>,
        location: &str,
    ) -> PyResult<i32> {
        if buffer_addresses.len() != capacities.len() {
            error!("batch_register_memory: buffer_addresses and capacities have different sizes");
            return Ok(-1);
        }
        let entries: Vec<(u64, u64)> = buffer_addresses.into_iter().zip(capacities).collect();
        Ok(match self.register_entries(py, &entries, location, true)? {
            Ok(()) => 0,
            Err(f) => code_of("batch_register_memory", &f),
        })
    }

    /// Unregisters several buffers; every registered one is removed.
    ///
    /// Returns 0, or -3 when an address is not a registered base.
    fn batch_unregister_memory(&self, py: Python<'_>, buffer_addresses: Vec<u64>) -> PyResult<i32> {
        Ok(match self.unregister_addrs(py, &buffer_addresses)? {
            Ok(()) => 0,
            Err(f) => code_of("batch_unregister_memory", &f),
        })
    }

    /// The machine's NIC priority matrix as Mooncake's JSON
    /// (`{"cpu:0": [[preferred HCAs], [other HCAs]], ...}`), restricted to
    /// the comma-separated `device_name` list when given. Needs no
    /// initialized engine.
    #[pyo3(signature = (device_name = None))]
    fn get_local_topology(&self, py: Python<'_>, device_name: Option<&str>) -> String {
        let filters = device_list(device_name);
        py.detach(|| {
            // Needs no engine, so a refused configuration gives the
            // defaults here; `initialize` reports it.
            let defaults = transfer_engine::Config::default();
            let cfg = config().unwrap_or(&defaults);
            let matrix = PriorityMatrix::from_topology(&Topology::discover(
                &filters,
                &cfg.topology,
                cfg.rdma.ib_port,
            ))
            .to_json();
            serde_json_pretty(&matrix)
        })
    }

    /// The address of the first buffer segment `segment_name` lists (its
    /// owner's order: ours by address, Mooncake's by registration); this
    /// engine's own name gives its lowest registered buffer.
    ///
    /// Returns the address, or 0 when the segment cannot be opened or has
    /// no buffer.
    fn get_first_buffer_address(&self, py: Python<'_>, segment_name: &str) -> PyResult<u64> {
        let core = self.core()?;
        Ok(py.detach(|| {
            let id = match core.engine.open_segment(segment_name) {
                Ok(id) => id,
                Err(e) => {
                    error!("get_first_buffer_address({segment_name:?}): {e}");
                    return 0;
                }
            };
            core.engine
                .segment_buffers(id)
                .ok()
                .and_then(|b| b.first().map(|b| b.addr))
                .unwrap_or(0)
        }))
    }

    /// The name of the transport that carries data to segment
    /// `segment_name` now (opening it if needed): `"local"` for this
    /// engine's own name, else `"shm"`, `"rdma"` or `"tcp"`, as the last
    /// requests to it went (a fallback, such as shared memory the kernel
    /// refuses, changes it; `te_segment_transport` in C).
    ///
    /// Raises `TransferError` when the segment cannot be opened or no
    /// installed transport (allowed by `MC_TE_REQUIRE_TRANSPORT`) speaks
    /// it.
    fn get_segment_transport(&self, py: Python<'_>, segment_name: &str) -> PyResult<String> {
        let core = self.core()?;
        py.detach(|| {
            let engine = &core.engine;
            engine
                .open_segment(segment_name)
                .and_then(|id| engine.segment_transport(id))
                .map(str::to_string)
                .map_err(|e| {
                    Failure::with_code(
                        e.err_code(),
                        &format!("get_segment_transport({segment_name:?})"),
                        &e,
                    )
                })
        })
        .map_err(raise)
    }

    /// Pre-connects EFA endpoints; this build has no EFA transport.
    ///
    /// Returns 0.
    fn warmup_efa_segment(&self, segment_name: &str) -> i32 {
        let _ = segment_name;
        0
    }

    /// Takes the notifications received so far, oldest first.
    fn get_notifies(&self) -> PyResult<Vec<TransferNotify>> {
        Ok(self
            .core()?
            .engine
            .take_notifies()
            .into_iter()
            .map(|(name, msg)| TransferNotify::from_pair(name, msg))
            .collect())
    }

    /// Checks that the handshake listener of `peer_server_name` answers.
    ///
    /// Returns 0; -101 when the name does not resolve, -102 when the peer
    /// cannot be reached, -200 when a metadata store has no entry for it.
    fn send_probe(&self, py: Python<'_>, peer_server_name: &str) -> PyResult<i32> {
        let core = self.core()?;
        Ok(
            match py.detach(|| core.engine.send_probe(peer_server_name)) {
                Ok(()) => 0,
                Err(e) => code_of("send_probe", &Failure::from_engine(&e)),
            },
        )
    }

    /// Mooncake returns its C++ engine object; there is none here, so
    /// `None` (clients that only log it or pass it on keep working).
    fn get_engine(&self) -> Option<Py<PyAny>> {
        None
    }

    /// Mooncake returns the address of its C++ engine; there is none here,
    /// so `None`.
    fn get_engine_ptr(&self) -> Option<u64> {
        None
    }

    /// CUDA-stream-ordered WRITE (Mooncake CUDA builds only).
    #[pyo3(signature = (*_args, **_kwargs))]
    fn transfer_write_on_cuda(
        &self,
        _args: &Bound<'_, pyo3::types::PyTuple>,
        _kwargs: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<()> {
        Err(cuda_only("transfer_write_on_cuda"))
    }

    /// CUDA-stream-ordered READ (Mooncake CUDA builds only).
    #[pyo3(signature = (*_args, **_kwargs))]
    fn transfer_read_on_cuda(
        &self,
        _args: &Bound<'_, pyo3::types::PyTuple>,
        _kwargs: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<()> {
        Err(cuda_only("transfer_read_on_cuda"))
    }

    /// CUDA-stream-ordered batch WRITE (Mooncake CUDA builds only).
    #[pyo3(signature = (*_args, **_kwargs))]
    fn batch_transfer_write_on_cuda(
        &self,
        _args: &Bound<'_, pyo3::types::PyTuple>,
        _kwargs: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<()> {
        Err(cuda_only("batch_transfer_write_on_cuda"))
    }

    /// CUDA-stream-ordered batch READ (Mooncake CUDA builds only).
    #[pyo3(signature = (*_args, **_kwargs))]
    fn batch_transfer_read_on_cuda(
        &self,
        _args: &Bound<'_, pyo3::types::PyTuple>,
        _kwargs: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<()> {
        Err(cuda_only("batch_transfer_read_on_cuda"))
    }

    // ---- Beyond Mooncake: Python buffers in, exceptions out. ----

    /// Writes local `buffer` (a buffer-protocol object, a CPU tensor, or an
    /// address with `length`) to `peer_address` of segment `target` and
    /// waits. `length` defaults to the whole buffer.
    ///
    /// Raises `TransferError` (with `.code`) on failure.
    #[pyo3(signature = (target, buffer, peer_address, length = None))]
    fn write(
        &self,
        py: Python<'_>,
        target: &str,
        buffer: &Bound<'_, PyAny>,
        peer_address: u64,
        length: Option<u64>,
    ) -> PyResult<()> {
        sync_raise(Some(self.sync_one(
            py,
            target,
            buffer,
            peer_address,
            length,
            Opcode::Write,
            None,
        )?))
    }

    /// Reads from `peer_address` of segment `target` into local `buffer`
    /// (writable) and waits. `length` defaults to the whole buffer.
    ///
    /// Raises `TransferError` (with `.code`) on failure.
    #[pyo3(signature = (target, buffer, peer_address, length = None))]
    fn read(
        &self,
        py: Python<'_>,
        target: &str,
        buffer: &Bound<'_, PyAny>,
        peer_address: u64,
        length: Option<u64>,
    ) -> PyResult<()> {
        sync_raise(Some(self.sync_one(
            py,
            target,
            buffer,
            peer_address,
            length,
            Opcode::Read,
            None,
        )?))
    }

    /// Writes several local buffers to `peer_addresses` of `target` as one
    /// batch and waits; `lengths` default to each buffer's size.
    ///
    /// Raises `TransferError` on failure, `ValueError` for lists of
    /// different lengths.
    #[pyo3(signature = (target, buffers, peer_addresses, lengths = None))]
    fn batch_write(
        &self,
        py: Python<'_>,
        target: &str,
        buffers: Vec<Bound<'_, PyAny>>,
        peer_addresses: Vec<u64>,
        lengths: Option<Vec<u64>>,
    ) -> PyResult<()> {
        sync_raise(self.sync_many(
            py,
            target,
            &buffers,
            &peer_addresses,
            lengths.as_deref(),
            Opcode::Write,
            None,
        )?)
    }

    /// Reads several peer ranges of `target` into local buffers as one
    /// batch and waits.
    ///
    /// Raises `TransferError` on failure, `ValueError` for lists of
    /// different lengths.
    #[pyo3(signature = (target, buffers, peer_addresses, lengths = None))]
    fn batch_read(
        &self,
        py: Python<'_>,
        target: &str,
        buffers: Vec<Bound<'_, PyAny>>,
        peer_addresses: Vec<u64>,
        lengths: Option<Vec<u64>>,
    ) -> PyResult<()> {
        sync_raise(self.sync_many(
            py,
            target,
            &buffers,
            &peer_addresses,
            lengths.as_deref(),
            Opcode::Read,
            None,
        )?)
    }

    /// Registers the memory of `buffer` (writable buffer-protocol object or
    /// CPU tensor) and keeps a reference to it until `unregister`, so it
    /// can be neither freed nor resized meanwhile. Of a tensor, its storage
    /// is kept; a tensor whose storage can be resized (`resize_` would move
    /// the bytes) is refused. Returns its address, which peers target.
    ///
    /// Raises `TransferError` (-1 bad location or empty buffer, -7
    /// overlap), `ValueError` for a tensor with a resizable storage.
    #[pyo3(signature = (buffer, location = "*", remote_accessible = true))]
    fn register(
        &self,
        py: Python<'_>,
        buffer: &Bound<'_, PyAny>,
        location: &str,
        remote_accessible: bool,
    ) -> PyResult<u64> {
        let local = Local::extract_pinned(buffer)?;
        let Some(len) = local.size() else {
            return Err(PyValueError::new_err(
                "register takes a buffer object; use register_memory(address, capacity) for addresses",
            ));
        };
        let addr = local.addr();
        self.register_entries(py, &[(addr, len)], location, remote_accessible)?
            .map_err(raise)?;
        lock(&self.core()?.pinned).insert(addr, local);
        Ok(addr)
    }

    /// Unregisters a buffer given to `register` (the object or its
    /// address) or registered with `register_memory` (its address), and
    /// releases the reference `register` kept.
    ///
    /// Raises `TransferError` (-3 when nothing is registered there).
    fn unregister(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<()> {
        let addr = Local::extract(buffer, Access::Read)?.addr();
        self.unregister_addrs(py, &[addr])?.map_err(raise)
    }

    /// Stops the engine: its listeners and threads end, its metadata is
    /// removed, and every transfer ends (a call other threads are inside
    /// returns an error); once this returns, no peer reads or writes memory
    /// registered with it. Then, with no transfer running any more, managed
    /// buffers, registered objects and the objects of unfinished batches
    /// are released (those a call still running in another thread holds,
    /// once it returns). The object can be initialized again. Idempotent.
    fn close(&self, py: Python<'_>) {
        let old = self.core.write().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(move || {
            // Another thread inside a call holds the core too: stop the
            // engine now rather than when the last holder lets go (a forked
            // child's core is its parent's engine, which it leaves alone).
            if let Some(core) = old.as_ref().filter(|c| !c.forked()) {
                core.engine.shutdown();
            }
            drop(old)
        });
    }

    /// Returns the engine; `with` closes it on exit.
    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Closes the engine; exceptions propagate.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        match self.core.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(c) => format!("<TransferEngine {}>", c.engine.local_name()),
            None => "<TransferEngine (not initialized)>".to_string(),
        }
    }
}

/// Pretty JSON like the `Json::StyledWriter` output Mooncake returns.
fn serde_json_pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}
