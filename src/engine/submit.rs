//! Batches, and the requests submitted to them: the engine's own segment
//! is copied here; a request to a peer goes to the most preferred installed
//! transport that reaches its target, and what that one cannot move goes to
//! the next ([`Fallback`]).

use super::{Engine, LOCAL_SEGMENT_ID, Opcode, Request, refused};
use crate::batch::{Batch, PendingNotify, TaskStatus};
use crate::error::{Error, Result};
use crate::lanes::Finish;
use crate::memory::MemoryRegistry;
use crate::segment::RemoteSegment;
use crate::sync;
use crate::transport::local::{CopyJob, copy_bytes};
use crate::transport::scheduler::planner;
use crate::transport::{
    Fallback, LocalSide, NicLoad, Refresh, Refreshed, Submission, Transfer, Transport,
};
use std::sync::Arc;

/// A request whose task waits for its segment's descriptor.
pub(super) struct Deferred {
    batch: Arc<Batch>,
    task: usize,
    request: Request,
}

/// Where `submit` sends one request.
enum Target {
    /// The engine's own segment.
    Local,
    /// A remote segment, with its cached descriptor.
    Remote(Arc<RemoteSegment>),
    /// A remote segment whose descriptor is refetched first (in the
    /// background).
    AfterRefetch(Arc<RemoteSegment>),
}

/// Shortest interval between refetches of a peer's descriptor for requests
/// it does not cover (memory the peer may have registered since).
const UNCOVERED_REFETCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Hands `xfer` to `chain[i]`, with the rest of the chain as its fallback.
#[allow(clippy::too_many_arguments)]
fn dispatch(
    chain: Arc<[Arc<dyn Transport>]>,
    i: usize,
    batch: Arc<Batch>,
    task: usize,
    seg: Arc<RemoteSegment>,
    local: LocalSide,
    xfer: Transfer,
    refresh: Option<Refresh>,
) {
    let fallback: Option<Fallback> = (i + 1 < chain.len()).then(|| {
        let (chain, batch, seg, local, refresh) = (
            chain.clone(),
            batch.clone(),
            seg.clone(),
            local.clone(),
            refresh.clone(),
        );
        Arc::new(move |part: Transfer| {
            dispatch(
                chain.clone(),
                i + 1,
                batch.clone(),
                task,
                seg.clone(),
                local.clone(),
                part,
                refresh.clone(),
            )
        }) as Fallback
    });
    chain[i].submit(Submission {
        batch,
        task,
        seg,
        xfer,
        local,
        fallback,
        refresh,
    });
}

/// Hands the segment named `name`, as cached after its refetch, to every
/// caller waiting for that refetch when dropped: after the refetch ran, or
/// with `None` when its background job was dropped unrun (a slice waiting
/// on it always ends).
struct Drain {
    engine: std::sync::Weak<Engine>,
    name: String,
    seg: Option<Arc<RemoteSegment>>,
}

impl Drain {
    /// Hands `seg` to the callers (now).
    fn hand(mut self, seg: Option<Arc<RemoteSegment>>) {
        self.seg = seg;
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        let Some(e) = self.engine.upgrade() else {
            return;
        };
        let callers = sync::lock(&e.refreshing)
            .remove(&self.name)
            .unwrap_or_default();
        for f in callers {
            f(self.seg.clone());
        }
    }
}

impl Engine {
    /// Creates a batch with room for `capacity` tasks and returns its id.
    pub fn allocate_batch(&self, capacity: usize) -> Result<u64> {
        let timeout = match self.config.engine.slice_timeout_secs {
            0 => None,
            s => Some(std::time::Duration::from_secs(s)),
        };
        Ok(self
            .batches
            .insert(Arc::new(Batch::new(capacity, timeout)?)))
    }

    fn batch(&self, id: u64) -> Result<Arc<Batch>> {
        self.batches
            .get(id)
            .ok_or_else(|| Error::InvalidArgument(format!("batch id {id:#x} is unknown or freed")))
    }

    /// Refuses `count` more requests to a batch that has no room for them
    /// now (as [`Engine::submit`] would), before the caller reads them.
    pub(crate) fn check_room(&self, batch_id: u64, count: usize) -> Result<()> {
        self.batch(batch_id)?.room_for(count)
    }

    /// Submits requests to a batch. Every check runs before any task is
    /// created, so an error leaves the batch unchanged. Nothing here waits
    /// on a peer: a request whose segment's descriptor must be refetched
    /// first (it does not cover the request, the peer may have restarted,
    /// or `MC_DISABLE_METACACHE`) waits in its task, which the refetch
    /// submits or fails in the background.
    pub fn submit(&self, batch_id: u64, requests: &[Request]) -> Result<()> {
        let batch = self.batch(batch_id)?;
        let mut targets: Vec<Target> = Vec::with_capacity(requests.len());
        let mut refetching: Vec<i32> = Vec::new();
        for r in requests {
            if r.target_id == LOCAL_SEGMENT_ID {
                targets.push(Target::Local);
                continue;
            }
            let seg = self.segments.get(r.target_id).ok_or_else(|| {
                Error::InvalidArgument(format!("segment id {} is not open", r.target_id))
            })?;
            if !refetching.contains(&r.target_id) && self.needs_refetch(&seg, r) {
                refetching.push(r.target_id);
            }
            let speaking = self.speaking(&seg)?;
            if r.length > 0 && speaking.iter().all(|t| t.needs_registered_source()) {
                // RDMA moves bytes from and to registered memory only.
                let memory = sync::read(&self.memory);
                if memory.find(r.source, r.length).is_none() {
                    return Err(Error::AddressNotRegistered(format!(
                        "the source {:#x}+{} is not inside one registered buffer ({} \
                         needs registered local memory)",
                        r.source,
                        r.length,
                        speaking[0].protocol()
                    )));
                }
            }
            targets.push(match refetching.contains(&r.target_id) {
                true => Target::AfterRefetch(seg),
                false => Target::Remote(seg),
            });
        }
        batch.append(requests.len(), |first, _| {
            let memory = sync::read(&self.memory);
            for (i, (r, target)) in requests.iter().zip(&targets).enumerate() {
                match target {
                    Target::Local => self.submit_local(&batch, first + i, r, &memory),
                    Target::Remote(seg) => self.submit_remote(&batch, first + i, r, seg, &memory),
                    Target::AfterRefetch(seg) => self.defer(&batch, first + i, r, seg),
                }
            }
            Ok(())
        })
    }

    /// Whether `r` must wait for its segment's descriptor to be refetched:
    /// without the metadata cache always; when a transfer to a peer that
    /// may restart under the same name (store mode, or fixed P2P ports)
    /// failed since the last fetch; when the descriptor does not cover
    /// `r` (memory the peer registered since, reachable as with Mooncake,
    /// whose initiator does not check) and no refetch for that happened in
    /// the last second, or one is under way.
    fn needs_refetch(&self, seg: &RemoteSegment, r: &Request) -> bool {
        if !self.config.store.metacache {
            return true;
        }
        let same_name_restarts = self.store.is_some() || self.config.rpc.legacy_port_binding;
        if same_name_restarts && seg.freshness.take_refetch() {
            return true;
        }
        r.length > 0
            && !seg.covers(r.target_offset, r.length)
            && (sync::lock(&self.deferred).contains_key(&r.target_id)
                || self
                    .segments
                    .may_refetch_uncovered(r.target_id, UNCOVERED_REFETCH_INTERVAL))
    }

    /// The installed transports that speak a protocol `seg` publishes,
    /// most preferred first; none is [`Error::NotSupportedTransport`].
    fn speaking(&self, seg: &RemoteSegment) -> Result<Vec<Arc<dyn Transport>>> {
        let installed = self.transports();
        let speaking: Vec<_> = installed
            .iter()
            .filter(|t| t.speaks(seg))
            .cloned()
            .collect();
        if speaking.is_empty() {
            return Err(Error::NotSupportedTransport(format!(
                "segment {:?} publishes {:?}, which no installed transport speaks (installed: \
                 {})",
                seg.name,
                seg.desc.protocol,
                if installed.is_empty() {
                    "none".to_string()
                } else {
                    installed
                        .iter()
                        .map(|t| t.protocol())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )));
        }
        Ok(speaking)
    }

    /// Leaves task `task` waiting until the descriptor of `seg` has been
    /// refetched in the background (one refetch serves every request
    /// waiting for it), then submits it.
    fn defer(&self, batch: &Arc<Batch>, task: usize, r: &Request, seg: &RemoteSegment) {
        let mut deferred = sync::lock(&self.deferred);
        let waiting = Deferred {
            batch: batch.clone(),
            task,
            request: *r,
        };
        if let Some(list) = deferred.get_mut(&r.target_id) {
            list.push(waiting);
            return;
        }
        let (id, name) = (r.target_id, seg.name.clone());
        match self.background(&seg.name, Finish::Refuse, move |e| {
            e.refetch_then_submit(id, &name)
        }) {
            Ok(()) => {
                deferred.insert(id, vec![waiting]);
            }
            Err(why) => Self::fail_task(
                batch,
                task,
                format_args!(
                    "the descriptor of segment {:?} cannot be refetched: {}",
                    seg.name,
                    refused(why)
                ),
            ),
        }
    }

    /// The background half of [`Engine::defer`]: refetches the descriptor
    /// of segment `id` and submits the requests that waited for it.
    fn refetch_then_submit(&self, id: i32, name: &str) {
        self.sync_segment(name);
        let waiting = sync::lock(&self.deferred).remove(&id).unwrap_or_default();
        let seg = self.segments.get(id);
        let memory = sync::read(&self.memory);
        for Deferred {
            batch,
            task,
            request,
        } in waiting
        {
            let problem = match &seg {
                None => Some(format!("segment id {id} was closed")),
                Some(seg) => self.speaking(seg).err().map(|e| e.to_string()),
            };
            match (problem, &seg) {
                (None, Some(seg)) => self.submit_remote(&batch, task, &request, seg, &memory),
                (problem, _) => Self::fail_task(
                    &batch,
                    task,
                    format_args!("{}", problem.unwrap_or_default()),
                ),
            }
        }
    }

    /// Fails a task that never reached a transport.
    fn fail_task(batch: &Batch, id: usize, why: std::fmt::Arguments<'_>) {
        crate::warn_limited!("task {id}: {why}");
        batch.note_failure(id, &why.to_string());
        if let Some(task) = batch.slot(id) {
            task.add_slices(1);
            task.finish_slice(0, false);
        }
    }

    /// Why a request's local `source` range cannot be used: NULL, wrapping
    /// the address space, or (with `MC_TE_STRICT_LOCAL`) not inside one
    /// registered buffer.
    fn source_problem(&self, r: &Request, memory: &MemoryRegistry) -> Option<&'static str> {
        if r.source == 0 || r.source.checked_add(r.length).is_none() {
            return Some("the source pointer is NULL or wraps");
        }
        (self.config.engine.strict_local && memory.find(r.source, r.length).is_none())
            .then_some("the source range is not inside one registered buffer (MC_TE_STRICT_LOCAL)")
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
        if memory.find(r.target_offset, r.length).is_none() {
            return Self::fail_task(
                batch,
                id,
                format_args!(
                    "{} bytes at {:#x} are not inside one registered buffer",
                    r.length, r.target_offset
                ),
            );
        }
        if let Some(why) = self.source_problem(r, memory) {
            return Self::fail_task(batch, id, format_args!("{why}"));
        }
        let (src, dst) = match r.opcode {
            Opcode::Write => (r.source, r.target_offset),
            Opcode::Read => (r.target_offset, r.source),
        };
        let cfg = &self.config;
        let n = planner::slice_count(r.length, cfg.sched.slice_size, cfg.sched.fragment_limit);
        task.add_slices(n);
        if n == 1 {
            // SAFETY: the target range was checked against the registry
            // above; the source is the caller's memory, which the C API
            // requires to be valid for `length` bytes.
            unsafe { copy_bytes(src, dst, r.length) };
            task.finish_slice(r.length, true);
            return;
        }
        for (off, len) in planner::slices(r.length, cfg.sched.slice_size, cfg.sched.fragment_limit)
        {
            let batch = batch.clone();
            self.local.dispatch(CopyJob {
                dst: (dst + off) as usize,
                src: (src + off) as usize,
                len: len as usize,
                done: Box::new(move || {
                    if let Some(task) = batch.slot(id) {
                        task.finish_slice(len, true);
                    }
                }),
            });
        }
    }

    /// Sends one request to a remote segment over the installed transport.
    fn submit_remote(
        &self,
        batch: &Arc<Batch>,
        id: usize,
        r: &Request,
        seg: &Arc<RemoteSegment>,
        memory: &MemoryRegistry,
    ) {
        if r.length == 0 {
            if let Some(task) = batch.slot(id) {
                task.add_slices(1);
                task.finish_slice(0, true);
            }
            return;
        }
        // One buffer, or adjacent ones with no gap (slices are cut at their
        // edges).
        let first = seg
            .desc
            .covering(r.target_offset, r.length)
            .and_then(|mut bs| bs.next());
        let Some(buffer) = first.map(|i| &seg.desc.buffers[i]) else {
            return Self::fail_task(
                batch,
                id,
                format_args!(
                    "{} bytes at {:#x} are not inside the buffers of segment {:?} (one \
                     buffer, or adjacent ones with no gap)",
                    r.length, r.target_offset, seg.name
                ),
            );
        };
        if let Some(why) = self.source_problem(r, memory) {
            return Self::fail_task(batch, id, format_args!("{why}"));
        }
        let registered = memory.find(r.source, r.length).is_some();
        let chain: Vec<Arc<dyn Transport>> = self
            .transports()
            .into_iter()
            .filter(|t| t.speaks(seg) && t.reaches(seg, r.target_offset, r.length))
            .filter(|t| registered || !t.needs_registered_source())
            .collect();
        if chain.is_empty() {
            return Self::fail_task(
                batch,
                id,
                format_args!(
                    "no installed transport reaches buffer {:#x} of segment {:?} (it is not \
                     remotely accessible there)",
                    buffer.addr, seg.name
                ),
            );
        }
        let xfer = Transfer {
            local: r.source,
            remote: r.target_offset,
            len: r.length,
            write: r.opcode == Opcode::Write,
        };
        let local = LocalSide::of(memory, r.source);
        let refresh = self.refresher();
        dispatch(
            chain.into(),
            0,
            batch.clone(),
            id,
            seg.clone(),
            local,
            xfer,
            refresh,
        );
    }

    /// The engine's [`Refresh`]: refetches a segment's descriptor in the
    /// background lane of the peer, one refetch for every caller waiting
    /// for it, and hands each the segment as cached afterwards.
    fn refresher(&self) -> Option<Refresh> {
        let me = self.me.get()?.clone();
        let refresh = self.refresher.get_or_init(|| {
            Arc::new(move |name: &str, done: Refreshed| {
                let Some(engine) = me.upgrade() else {
                    return done(None);
                };
                engine.refresh_segment(name, done);
            })
        });
        Some(refresh.clone())
    }

    /// See [`Engine::refresher`].
    fn refresh_segment(&self, name: &str, done: Refreshed) {
        {
            let mut waiting = sync::lock(&self.refreshing);
            if let Some(list) = waiting.get_mut(name) {
                list.push(done);
                return;
            }
            waiting.insert(name.to_string(), vec![done]);
        }
        let drain = Drain {
            engine: self.me.get().cloned().unwrap_or_default(),
            name: name.to_string(),
            seg: None,
        };
        // Refused, the job (and `drain`) is dropped: the callers get `None`.
        let _ = self.background(name, Finish::Refuse, move |e| {
            e.sync_segment(&drain.name);
            let seg = e
                .segments
                .id_of(&drain.name)
                .and_then(|id| e.segments.get(id));
            drain.hand(seg);
        });
    }

    /// Why task `task_id` of batch `batch_id` FAILED, where the engine
    /// knows (a peer that refused the connection or that cannot be
    /// reached, a range it refused, a request that reached no transport);
    /// `None` for a task that did not fail or whose reason is unknown.
    pub fn failure_reason(&self, batch_id: u64, task_id: usize) -> Result<Option<String>> {
        Ok(self
            .batch(batch_id)?
            .failure(task_id)
            .map(|why| why.to_string()))
    }

    /// Submits requests and remembers a notification sent to the owner of
    /// the first request's segment once the whole batch has completed.
    pub fn submit_with_notify(
        &self,
        batch_id: u64,
        requests: &[Request],
        name: String,
        msg: String,
    ) -> Result<()> {
        let first = requests.first().ok_or_else(|| {
            Error::InvalidArgument("no request to attach a notification to".into())
        })?;
        self.submit(batch_id, requests)?;
        self.batch(batch_id)?.set_notify(PendingNotify {
            target_id: first.target_id,
            name,
            msg,
        });
        Ok(())
    }

    /// Status of one task. A caller polling a task that is still running
    /// first lends its thread to one queued local copy, or to one round of
    /// a transport's work ([`Transport::help`]), or else yields its core. When the batch has
    /// completed and carries a notification, it is handed to the
    /// background to send (this call does not wait on the peer).
    pub fn status(&self, batch_id: u64, task_id: usize) -> Result<(TaskStatus, u64)> {
        let batch = self.batch(batch_id)?;
        let mut result = batch.poll(task_id)?;
        if result.0 == TaskStatus::Waiting {
            if self.local.help_one() || sync::read(&self.transports).iter().any(|t| t.help()) {
                result = batch.poll(task_id)?;
            } else {
                // Nothing to lend a hand with: a caller polling in a loop
                // leaves the core to the threads (ours or a peer's on this
                // host) that move its bytes.
                std::thread::yield_now();
            }
        }
        if result.0 == TaskStatus::Completed {
            if self.config.engine.metric {
                if let Some((bytes, latency)) = batch.first_completion(task_id) {
                    self.metrics.record(bytes, latency);
                }
            }
            if let Some(n) = batch.take_notify_if_complete() {
                self.notify_later(batch_id, n);
            }
        }
        Ok(result)
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

    /// Takes every notification received so far, oldest first.
    pub fn take_notifies(&self) -> Vec<(String, String)> {
        self.control.take_notifies()
    }

    /// The installed transports' own counters: (protocol, name, value).
    pub fn transport_counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.transports()
            .iter()
            .flat_map(|t| {
                let p = t.protocol();
                t.counters().into_iter().map(move |(n, v)| (p, n, v))
            })
            .collect()
    }

    /// Per-device load of the installed transports.
    pub fn nic_loads(&self) -> Vec<NicLoad> {
        self.transports()
            .iter()
            .flat_map(|t| t.nic_loads())
            .collect()
    }
}
