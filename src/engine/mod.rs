//! The engine: registered memory, batches and tasks, segments, and the
//! dispatch of requests to transports. Safe Rust only; the C boundary lives
//! in `crate::ffi`.

pub mod batch;
pub mod memory;
pub mod planner;

use crate::config::{Config, config};
use crate::error::{Error, Result};
use crate::handle::HandleTable;
use crate::metadata::conn::MetadataConn;
use crate::transport::local::{CopyJob, LocalCopier, copy_bytes};
use batch::{Batch, TaskStatus};
use memory::{MemoryRegistry, Region};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tracing::{info, warn};

/// Segment id of the engine's own memory (`LOCAL_SEGMENT`).
pub const LOCAL_SEGMENT_ID: i32 = 0;

/// Direction of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// Copy from the target segment into `source`.
    Read,
    /// Copy from `source` into the target segment.
    Write,
}

impl Opcode {
    /// Mooncake's `OPCODE_READ` (0) and `OPCODE_WRITE` (1).
    pub fn from_raw(v: i32) -> Result<Opcode> {
        match v {
            0 => Ok(Opcode::Read),
            1 => Ok(Opcode::Write),
            _ => Err(Error::InvalidArgument(format!(
                "opcode {v} is neither READ (0) nor WRITE (1)"
            ))),
        }
    }
}

/// One request of a batch.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// Direction.
    pub opcode: Opcode,
    /// Local address (read into, or written from).
    pub source: u64,
    /// Segment id from `openSegment`.
    pub target_id: i32,
    /// Absolute address in the target segment's process.
    pub target_offset: u64,
    /// Bytes to move.
    pub length: u64,
}

/// A transfer engine instance.
pub struct Engine {
    local_name: String,
    conn: MetadataConn,
    config: &'static Config,
    memory: RwLock<MemoryRegistry>,
    batches: HandleTable<Batch>,
    local: LocalCopier,
    notifies: Mutex<VecDeque<(String, String)>>,
    closed: AtomicBool,
}

/// Load of one local device, for `getNicLoadStats`.
#[derive(Debug, Clone, PartialEq)]
pub struct NicLoad {
    /// Device name.
    pub device: String,
    /// Bytes posted and not yet completed.
    pub inflight_bytes: u64,
    /// Exponentially weighted bandwidth, bytes per second.
    pub ewma_bandwidth_bps: f64,
}

impl Engine {
    /// Creates an engine named `local_name` with the metadata backend of
    /// `conn`.
    pub fn new(conn: &str, local_name: &str, auto_discover: bool) -> Result<Engine> {
        let conn = MetadataConn::parse(conn)?;
        let local_name = local_name.trim().trim_start_matches('/').to_string();
        if local_name.is_empty() {
            return Err(Error::InvalidArgument("local server name is empty".into()));
        }
        if conn != MetadataConn::P2p {
            return Err(Error::NotImplemented(format!(
                "the {} metadata backend ({conn}) is not available in this build yet; \
                 use P2PHANDSHAKE",
                conn.backend()
            )));
        }
        info!(name = %local_name, metadata = %conn, auto_discover, "transfer engine created");
        Ok(Engine {
            local_name,
            conn,
            config: config(),
            memory: RwLock::new(MemoryRegistry::default()),
            batches: HandleTable::new(),
            local: LocalCopier::default(),
            notifies: Mutex::new(VecDeque::new()),
            closed: AtomicBool::new(false),
        })
    }

    /// The name peers open this engine's segment by.
    pub fn local_name(&self) -> &str {
        &self.local_name
    }

    /// The metadata backend.
    pub fn metadata(&self) -> &MetadataConn {
        &self.conn
    }

    /// Registers buffers: all of them, or none on error.
    pub fn register(&self, regions: &[Region]) -> Result<()> {
        let mut memory = self.memory.write().unwrap_or_else(|e| e.into_inner());
        memory.insert(regions)
    }

    /// Unregisters buffers by base address; every known one is removed and
    /// the first error is returned.
    pub fn unregister(&self, addrs: &[u64]) -> Result<()> {
        let mut memory = self.memory.write().unwrap_or_else(|e| e.into_inner());
        let mut first_err = None;
        for &addr in addrs {
            if let Err(e) = memory.remove(addr) {
                warn!("unregister: {e}");
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Resolves a segment name to its id: the own name (or `""`) is
    /// `LOCAL_SEGMENT`.
    pub fn open_segment(&self, name: &str) -> Result<i32> {
        let name = name.trim_start_matches('/');
        if name.is_empty() {
            return Err(Error::InvalidArgument("segment name is empty".into()));
        }
        if name == self.local_name {
            return Ok(LOCAL_SEGMENT_ID);
        }
        Err(Error::NotImplemented(format!(
            "segment {name:?} is remote; remote segments need a networked transport"
        )))
    }

    /// Creates a batch with room for `capacity` tasks and returns its id.
    pub fn allocate_batch(&self, capacity: usize) -> Result<u64> {
        Ok(self.batches.insert(Arc::new(Batch::new(capacity)?)))
    }

    fn batch(&self, id: u64) -> Result<Arc<Batch>> {
        self.batches
            .get(id)
            .ok_or_else(|| Error::InvalidArgument(format!("batch id {id:#x} is unknown or freed")))
    }

    /// Submits requests to a batch. Every check runs before any task is
    /// created, so an error leaves the batch unchanged.
    pub fn submit(&self, batch_id: u64, requests: &[Request]) -> Result<()> {
        let batch = self.batch(batch_id)?;
        for r in requests {
            if r.target_id != LOCAL_SEGMENT_ID {
                return Err(Error::InvalidArgument(format!(
                    "segment id {} is not open",
                    r.target_id
                )));
            }
        }
        batch.append(requests.len(), |first, _| {
            let memory = self.memory.read().unwrap_or_else(|e| e.into_inner());
            for (i, r) in requests.iter().enumerate() {
                self.submit_local(&batch, first + i, r, &memory);
            }
            Ok(())
        })
    }

    /// Runs one request against this process's own registered memory.
    fn submit_local(&self, batch: &Arc<Batch>, id: usize, r: &Request, memory: &MemoryRegistry) {
        let Some(task) = batch.slot(id) else {
            return;
        };
        if r.length == 0 {
            task.add_slices(1);
            task.finish_slice(0, true);
            return;
        }
        let target_ok = memory.find(r.target_offset, r.length).is_some();
        let source_ok = r.source != 0 && r.source.checked_add(r.length).is_some();
        if !target_ok || !source_ok {
            warn!(
                "task {id}: {} of {} bytes at {:#x} fails: {}",
                if r.opcode == Opcode::Read {
                    "READ"
                } else {
                    "WRITE"
                },
                r.length,
                r.target_offset,
                if target_ok {
                    "the source pointer is NULL or wraps"
                } else {
                    "the target range is not inside one registered buffer"
                }
            );
            task.add_slices(1);
            task.finish_slice(0, false);
            return;
        }
        let (src, dst) = match r.opcode {
            Opcode::Write => (r.source, r.target_offset),
            Opcode::Read => (r.target_offset, r.source),
        };
        let cfg = self.config;
        let n = planner::slice_count(r.length, cfg.slice_size, cfg.fragment_limit);
        task.add_slices(n);
        if n == 1 {
            // SAFETY: the target range was checked against the registry
            // above; the source is the caller's memory, which the C API
            // requires to be valid for `length` bytes.
            unsafe { copy_bytes(src, dst, r.length) };
            task.finish_slice(r.length, true);
            return;
        }
        for (off, len) in planner::slices(r.length, cfg.slice_size, cfg.fragment_limit) {
            self.local.dispatch(CopyJob {
                batch: batch.clone(),
                task: id,
                dst: (dst + off) as usize,
                src: (src + off) as usize,
                len: len as usize,
            });
        }
    }

    /// Status of one task. A caller polling a task that is still running
    /// first lends its thread to one queued local copy.
    pub fn status(&self, batch_id: u64, task_id: usize) -> Result<(TaskStatus, u64)> {
        let batch = self.batch(batch_id)?;
        let first = batch.poll(task_id)?;
        if first.0 != TaskStatus::Waiting || !self.local.help_one() {
            return Ok(first);
        }
        batch.poll(task_id)
    }

    /// Frees a batch once every task was seen terminal.
    pub fn free_batch(&self, batch_id: u64) -> Result<()> {
        match self.batches.remove_if(batch_id, Batch::all_observed) {
            Ok(_) => Ok(()),
            Err(Some(_)) => Err(Error::BatchBusy),
            Err(None) => Err(Error::InvalidArgument(format!(
                "batch id {batch_id:#x} is unknown or freed"
            ))),
        }
    }

    /// Installs a transport by protocol name and returns its handle.
    pub fn install_transport(&self, proto: &str, matrix: Option<&str>) -> Result<u64> {
        let _ = matrix;
        Err(Error::NotImplemented(format!(
            "transport {proto:?} is not available in this build; local transfers need none"
        )))
    }

    /// Refetches the descriptor of `name` if it is cached.
    pub fn sync_segment(&self, name: &str) {
        let _ = name;
    }

    /// Refetches every cached remote descriptor.
    pub fn sync_all_segments(&self) {}

    /// Drops `name` from the descriptor cache.
    pub fn remove_segment(&self, name: &str) -> Result<()> {
        if name.trim_start_matches('/').is_empty() {
            return Err(Error::InvalidArgument("segment name is empty".into()));
        }
        Ok(())
    }

    /// Submits requests and remembers a notification for the batch.
    pub fn submit_with_notify(
        &self,
        batch_id: u64,
        requests: &[Request],
        name: String,
        msg: String,
    ) -> Result<()> {
        let _ = (batch_id, requests, name, msg);
        Err(Error::NotImplemented(
            "notifications need a networked transport".into(),
        ))
    }

    /// Sends a notification to the owner of segment `target_id`.
    pub fn send_notify(&self, target_id: u64, name: &str, msg: &str) -> Result<()> {
        let _ = (target_id, name, msg);
        Err(Error::Metadata(
            "notifications need a networked transport".into(),
        ))
    }

    /// Takes every notification received so far, oldest first.
    pub fn take_notifies(&self) -> Vec<(String, String)> {
        self.notifies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect()
    }

    /// Per-device load of the installed transports.
    pub fn nic_loads(&self) -> Vec<NicLoad> {
        Vec::new()
    }

    /// Stops every thread the engine started; idempotent.
    pub fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.local.shutdown();
        self.batches.drain();
        info!(name = %self.local_name, "transfer engine destroyed");
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}
impl Engine {
    pub fn discover_topology(&self) {}
    pub fn local_ip_and_port(&self) -> String {
        String::new()
    }
    pub fn show_links(&self, _j: bool) -> String {
        String::new()
    }
}
