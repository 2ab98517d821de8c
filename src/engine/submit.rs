//! Batches, and the requests submitted to them: the engine's own segment
//! is copied here; a request to a peer goes to the most preferred installed
//! transport that reaches its target, and what that one cannot move goes to
//! the next (the chain of [`route`]).

use super::{Engine, LOCAL_SEGMENT_ID, Opcode, Request, refused, route};
use crate::batch::{Batch, NotifyStatus, PendingNotify, TaskRef, TaskStatus};
use crate::error::{Error, Result};
use crate::memory::fence::Fence;
use crate::memory::staging;
use crate::memory::{MemoryRegistry, Residence};
use crate::peer_jobs::Finish;
use crate::segment::RemoteSegment;
use crate::sync;
use crate::task_stats::{DeferredEnds, LOCAL_ROUTE};
use crate::transport::local::{CopyJob, copy_any};
use crate::transport::plug::Plug;
use crate::transport::scheduler::planner;
use crate::transport::{LocalSide, NicLoad, Refresh, Refreshed, Transfer, Transport};
use std::sync::Arc;

/// What a caller waiting for a fetch of a segment's descriptor needs of it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Need {
    /// A fetch begun after the call: without the metadata cache, after a
    /// failure that a restart of the peer may explain, or a key the peer
    /// refused.
    Fresh,
    /// The descriptor listing `[addr, addr + len)`: a fetch begun after
    /// the call, unless the cached descriptor lists the range by the time
    /// one would begin.
    Range {
        /// Start of the range in the peer.
        addr: u64,
        /// Its length.
        len: u64,
    },
}

impl Need {
    /// Whether `seg`, as cached, already gives what is needed.
    fn met_by(self, seg: Option<&RemoteSegment>) -> bool {
        match self {
            Need::Fresh => false,
            Need::Range { addr, len } => len == 0 || seg.is_some_and(|s| s.covers(addr, len)),
        }
    }
}

/// What a caller waiting for a fetch of a segment's descriptor does after
/// it, with the segment as cached then; `None` when it was closed, or the
/// fetch never ran (refused, or the engine is being destroyed).
type AfterFetch = Box<dyn FnOnce(&Engine, Option<Arc<RemoteSegment>>) + Send>;

/// A caller waiting for a fetch of a segment's descriptor.
pub(super) struct Waiter {
    need: Need,
    then: AfterFetch,
}

/// Where `submit` sends one request.
enum Target {
    /// The engine's own segment.
    Local,
    /// A remote segment, with its cached descriptor.
    Remote(Arc<RemoteSegment>),
    /// A remote segment whose descriptor is fetched first (in the
    /// background).
    AfterFetch(Arc<RemoteSegment>, Need),
}

/// Shortest time between the beginnings of two fetches of a peer's
/// descriptor that only look for ranges it does not list, when the first
/// found nothing new: such lookups are at most 20 per peer per second
/// (beyond one per change of its descriptor), and a request to memory the
/// peer never registered fails within this plus one fetch.
const UNLISTED_LOOKUP_GAP: std::time::Duration = std::time::Duration::from_millis(50);

/// The background job that fetches the descriptor of segment `name` for
/// the callers waiting for it. Dropped, it calls them: after its fetch,
/// with the segment as cached then; unrun (refused, or the engine is being
/// destroyed), with `None`, so a request waiting on it always ends.
struct FetchJob {
    engine: std::sync::Weak<Engine>,
    name: String,
    /// The callers it took when it began, and the segment after its fetch.
    taken: Option<(Vec<Waiter>, Option<Arc<RemoteSegment>>)>,
}

impl Drop for FetchJob {
    fn drop(&mut self) {
        let Some(e) = self.engine.upgrade() else {
            return;
        };
        let (waiters, seg) = match self.taken.take() {
            Some(taken) => taken,
            None => (
                sync::lock(&e.refetches)
                    .remove(&self.name)
                    .unwrap_or_default(),
                None,
            ),
        };
        for w in waiters {
            (w.then)(&e, seg.clone());
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
        let mut batch = Batch::new(capacity, timeout)?;
        if self.config.engine.metrics {
            batch = batch.counting(self.stats.clone());
        }
        Ok(self.batches.insert(Arc::new(batch)))
    }

    pub(super) fn batch(&self, id: u64) -> Result<Arc<Batch>> {
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
        let transports = self.transports();
        let mut targets: Vec<Target> = Vec::with_capacity(requests.len());
        // The route each task is counted on until a transport takes it
        // (the most preferred that speaks its peer's descriptor),
        // and the slot of its peer in the per-peer statistics.
        let mut routes: Vec<(usize, u32)> = Vec::with_capacity(requests.len());
        let mut refetching: Vec<i32> = Vec::new();
        // The segment of the request before: a batch mostly goes to one
        // peer, and the cache's lock is shared by every submitting thread.
        let mut last: Option<(i32, Arc<RemoteSegment>)> = None;
        for r in requests {
            if r.target_id == LOCAL_SEGMENT_ID {
                targets.push(Target::Local);
                routes.push((LOCAL_ROUTE, 0));
                continue;
            }
            let seg = match &last {
                Some((id, seg)) if *id == r.target_id => seg.clone(),
                _ => {
                    let seg = self.segments.get(r.target_id).ok_or_else(|| {
                        Error::InvalidArgument(format!("segment id {} is not open", r.target_id))
                    })?;
                    last = Some((r.target_id, seg.clone()));
                    seg
                }
            };
            let need = self.fetch_need(&seg, r);
            if need.is_some() && !refetching.contains(&r.target_id) {
                refetching.push(r.target_id);
            }
            let speaking = Self::speaking(&transports, &seg)?;
            let peer = *seg
                .stats_peer
                .get_or_init(|| self.stats.peer_slot(&seg.name));
            routes.push((speaking[0].kind().route(), peer));
            if r.length > 0 && speaking.iter().all(|t| t.needs_registered_source()) {
                // RDMA moves bytes from and to registered memory only.
                let memory = sync::read(&self.memory);
                if memory.find(r.source, r.length).is_none() {
                    return Err(Error::AddressNotRegistered(format!(
                        "the source {:#x}+{} is not inside one registered buffer ({} \
                         needs registered local memory)",
                        r.source,
                        r.length,
                        speaking[0].kind().protocol
                    )));
                }
            }
            // Behind a request that waits for a fetch, the others to its
            // segment wait too (they are submitted in order).
            targets.push(match (need, refetching.contains(&r.target_id)) {
                (Some(need), _) => Target::AfterFetch(seg, need),
                (None, true) => Target::AfterFetch(
                    seg,
                    Need::Range {
                        addr: r.target_offset,
                        len: r.length,
                    },
                ),
                (None, false) => Target::Remote(seg),
            });
        }
        let _plug = Plug::begin(&transports);
        batch.append(requests.len(), |first, slots| {
            for (t, r) in slots.iter().zip(requests) {
                t.set_target(r.target_id);
            }
            // The ends of the tasks that finish within the call are
            // counted when it returns (before they are published).
            let ends = batch.stats().and_then(|stats| {
                let bytes = requests.iter().fold(0u64, |n, r| n.wrapping_add(r.length));
                stats.submitted(requests.len() as u64, bytes);
                stats.defer_ends(slots.first()?.submitted_at())
            });
            let memory = sync::read(&self.memory);
            for (i, (r, target)) in requests.iter().zip(&targets).enumerate() {
                let (route, peer) = routes[i];
                slots[i].count_submitted(r.opcode == Opcode::Write, route, r.length, peer);
                match target {
                    Target::Local => {
                        self.submit_local(&batch, first + i, r, &memory, ends.as_ref())
                    }
                    Target::Remote(seg) => {
                        self.submit_remote(&transports, &batch, first + i, r, seg, &memory)
                    }
                    Target::AfterFetch(seg, need) => self.defer(&batch, first + i, r, seg, *need),
                }
            }
            Ok(())
        })
    }

    /// Whether `r` must wait for a fetch of its segment's descriptor, and
    /// what it needs of it: without the metadata cache, and when a transfer
    /// to a peer that may restart under the same name (store mode, or fixed
    /// P2P ports) failed since the last fetch, a fresh descriptor; when the
    /// descriptor does not list `r`'s range (memory the peer registered
    /// since, reachable as with Mooncake, whose initiator does not check),
    /// one that lists it, or a fetch begun after `r` that does not.
    fn fetch_need(&self, seg: &RemoteSegment, r: &Request) -> Option<Need> {
        if !self.config.store.metacache {
            return Some(Need::Fresh);
        }
        let same_name_restarts = self.store.is_some() || self.config.rpc.legacy_port_binding;
        if same_name_restarts && seg.freshness.take_refetch() {
            return Some(Need::Fresh);
        }
        let need = Need::Range {
            addr: r.target_offset,
            len: r.length,
        };
        (!need.met_by(Some(seg))).then_some(need)
    }

    /// The installed transports that speak a protocol `seg` publishes,
    /// most preferred first; none is [`Error::NotSupportedTransport`].
    fn speaking<'a>(
        installed: &'a [Arc<dyn Transport>],
        seg: &RemoteSegment,
    ) -> Result<Vec<&'a Arc<dyn Transport>>> {
        let speaking: Vec<_> = installed.iter().filter(|t| t.speaks(seg)).collect();
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
                        .map(|t| t.kind().protocol)
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )));
        }
        Ok(speaking)
    }

    /// Leaves task `task` waiting for a fetch of the descriptor of `seg`
    /// (see [`Engine::after_fetch`]), then submits it.
    fn defer(&self, batch: &Arc<Batch>, task: usize, r: &Request, seg: &RemoteSegment, need: Need) {
        let (batch, request) = (batch.clone(), *r);
        self.after_fetch(
            &seg.name,
            need,
            Box::new(move |e, fetched| e.submit_fetched(&batch, task, &request, fetched)),
        );
    }

    /// Submits a request that waited for a fetch of its segment's
    /// descriptor (`fetched`: the segment after it), or fails it.
    fn submit_fetched(
        &self,
        batch: &Arc<Batch>,
        task: usize,
        r: &Request,
        fetched: Option<Arc<RemoteSegment>>,
    ) {
        // Held open while it is submitted; a task cancelled while it
        // waited ends here instead.
        let Some(t) = batch.slot(task).filter(|t| t.begin()) else {
            return;
        };
        let seg = fetched.and_then(|_| self.segments.get(r.target_id));
        let installed = self.transports();
        let problem = match &seg {
            None => Some(format!(
                "segment id {} was closed, or its descriptor could not be refetched",
                r.target_id
            )),
            Some(seg) => Self::speaking(&installed, seg).err().map(|e| e.to_string()),
        };
        match (problem, seg) {
            (None, Some(seg)) => {
                self.submit_remote(&installed, batch, task, r, &seg, &sync::read(&self.memory))
            }
            (problem, _) => {
                Self::fail_task(batch, task, format_args!("{}", problem.unwrap_or_default()))
            }
        }
        t.finish_slice(0, true);
    }

    /// Calls `then`, in the background lane of the peer, once a fetch of
    /// the descriptor of segment `name` that began after this call has
    /// ended — or, when `need` is a range, once the cached descriptor lists
    /// it at the time such a fetch would begin. Callers share fetches: one
    /// job per segment waits to begin, and takes every caller when it
    /// does, so a fetch under way (which may have read the descriptor
    /// before the peer registered what a later caller wants) never answers
    /// a caller that came after it began. A fetch for ranges only begins
    /// no sooner than [`UNLISTED_LOOKUP_GAP`] after the last one that
    /// found nothing new.
    fn after_fetch(&self, name: &str, need: Need, then: AfterFetch) {
        {
            let mut all = sync::lock(&self.refetches);
            let waiter = Waiter { need, then };
            if let Some(waiting) = all.get_mut(name) {
                waiting.push(waiter);
                return;
            }
            all.insert(name.to_string(), vec![waiter]);
        }
        let job = FetchJob {
            engine: self.me.get().cloned().unwrap_or_default(),
            name: name.to_string(),
            taken: None,
        };
        // Refused, the job is dropped: its callers get `None`.
        let queued = self.background(name, Finish::Refuse, move |e| e.run_fetch(job));
        if let Err(why) = queued {
            crate::log_limit::warn_limited!(
                "the descriptor of segment {name:?} cannot be refetched: {}",
                refused(why)
            );
        }
    }

    /// The background half of [`Engine::after_fetch`].
    fn run_fetch(&self, mut job: FetchJob) {
        let cached = || {
            self.segments
                .id_of(&job.name)
                .and_then(|id| self.segments.get(id))
        };
        let needs_fetch = |waiters: &[Waiter], seg: Option<&RemoteSegment>| {
            waiters.iter().any(|w| !w.need.met_by(seg))
        };
        let seg = cached();
        let delay = {
            let all = sync::lock(&self.refetches);
            let waiting = all.get(&job.name).map_or(&[][..], Vec::as_slice);
            let ranges_only = waiting.iter().all(|w| matches!(w.need, Need::Range { .. }));
            match &seg {
                Some(s) if ranges_only && needs_fetch(waiting, Some(s)) => {
                    s.freshness.lookup_delay(UNLISTED_LOOKUP_GAP)
                }
                _ => std::time::Duration::ZERO,
            }
        };
        if !delay.is_zero() {
            // Callers that come meanwhile join this fetch.
            std::thread::sleep(delay);
        }
        let waiters = sync::lock(&self.refetches)
            .remove(&job.name)
            .unwrap_or_default();
        // Taken now, they are called even if the fetch panics.
        let taken = job.taken.insert((waiters, None));
        let seg = cached();
        if needs_fetch(&taken.0, seg.as_deref()) {
            let began = std::time::Instant::now();
            if !self.refetch_segment(&job.name) {
                if let Some(s) = &seg {
                    s.freshness.found_nothing_new(began);
                }
            }
        }
        taken.1 = cached();
    }

    /// Fails a task that never reached a transport.
    pub(super) fn fail_task(batch: &Batch, id: usize, why: std::fmt::Arguments<'_>) {
        crate::log_limit::warn_limited!("task {id}: {why}");
        batch.note_failure(id, &why.to_string());
        if let Some(task) = batch.slot(id) {
            task.add_slices(1);
            task.finish_slice(0, false);
        }
    }

    /// A slice of a copy within the process failed: the driver refused
    /// to copy GPU memory.
    fn copy_failed(batch: &Batch, id: usize, why: &str) {
        let Some(task) = batch.slot(id) else {
            return;
        };
        if !task.is_canceled() {
            crate::log_limit::warn_limited!("task {id}: {why}");
            batch.note_failure(id, why);
        }
        task.finish_slice(0, false);
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
    fn submit_local(
        &self,
        batch: &Arc<Batch>,
        id: usize,
        r: &Request,
        memory: &MemoryRegistry,
        ends: Option<&DeferredEnds<'_>>,
    ) {
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
        // GPU memory on either side is copied by the CUDA driver.
        let mut gpu = None;
        for (side, addr) in [("source", r.source), ("target", r.target_offset)] {
            match memory.residence(addr, r.length) {
                Residence::Host => {}
                Residence::Device(n) if staging::available() => {
                    gpu.get_or_insert(n);
                }
                residence => {
                    return Self::fail_task(
                        batch,
                        id,
                        format_args!(
                            "the {side} {addr:#x}+{} is {residence}, which a copy within \
                             this process cannot move without its driver's copy calls",
                            r.length
                        ),
                    );
                }
            }
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
            // requires to be valid for `length` bytes. This submission holds
            // the registry's read lock, which unregistering waits for: no
            // buffer either side overlaps goes away during the copy.
            match unsafe { copy_any(src, dst, r.length, gpu) } {
                Ok(()) => task.finish_slice_within(r.length, true, ends),
                Err(why) => Self::copy_failed(batch, id, &why),
            }
            return;
        }
        // The copy threads hold no lock: unregistering a buffer either side
        // overlaps waits for their copies through its fence.
        let mut fences: Vec<Arc<Fence>> = Vec::new();
        for f in memory
            .fences_over(src, r.length)
            .chain(memory.fences_over(dst, r.length))
        {
            if !fences.iter().any(|g| Arc::ptr_eq(f, g)) {
                fences.push(f.clone());
            }
        }
        let fences: Arc<[Arc<Fence>]> = fences.into();
        for (off, len) in planner::slices(r.length, cfg.sched.slice_size, cfg.sched.fragment_limit)
        {
            let batch = batch.clone();
            self.local.dispatch(CopyJob {
                dst: (dst + off) as usize,
                src: (src + off) as usize,
                len: len as usize,
                gpu,
                fences: fences.clone(),
                task: Some(TaskRef::new(batch.clone(), id)),
                done: Box::new(move |copied| match copied {
                    Ok(()) => {
                        if let Some(task) = batch.slot(id) {
                            task.finish_slice(len, true);
                        }
                    }
                    Err(why) => Self::copy_failed(&batch, id, &why),
                }),
            });
        }
    }

    /// Sends one request to a remote segment over the installed transport.
    fn submit_remote(
        &self,
        installed: &[Arc<dyn Transport>],
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
        let reaching: Vec<Arc<dyn Transport>> = installed
            .iter()
            .filter(|t| t.speaks(seg) && t.reaches(seg, r.target_offset, r.length))
            .filter(|t| registered || !t.needs_registered_source())
            .cloned()
            .collect();
        let residence = memory.residence(r.source, r.length);
        if let Residence::Foreign(..) = residence {
            return Self::fail_task(
                batch,
                id,
                format_args!(
                    "the source {:#x}+{} is {residence}, which no transport of this engine \
                     moves yet",
                    r.source, r.length
                ),
            );
        }
        let chain: Vec<Arc<dyn Transport>> = reaching
            .iter()
            .filter(|t| residence == Residence::Host || t.moves_device_memory())
            .cloned()
            .collect();
        if let (Residence::Device(n), true, false) =
            (residence, chain.is_empty(), reaching.is_empty())
        {
            let names: Vec<&str> = reaching.iter().map(|t| t.kind().protocol).collect();
            return Self::fail_task(
                batch,
                id,
                format_args!(
                    "the source {:#x}+{} is memory of GPU {n}, and the transports that reach \
                     segment {:?} ({}) cannot move it: RDMA moves registered GPU memory, and \
                     TCP stages it through host buffers where the CUDA driver can copy it",
                    r.source,
                    r.length,
                    seg.name,
                    names.join(", ")
                ),
            );
        }
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
        let chain = match self.chain(installed, seg, chain) {
            Ok(chain) => chain,
            Err(why) => return Self::fail_task(batch, id, format_args!("{why}")),
        };
        let xfer = Transfer {
            local: r.source,
            remote: r.target_offset,
            len: r.length,
            write: r.opcode == Opcode::Write,
        };
        let gpu = match residence {
            Residence::Device(n) => Some(n),
            _ => None,
        };
        let local = LocalSide::of(memory, r.source, gpu);
        let refresh = self.refresher();
        route::dispatch(
            chain,
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
        let me = self.me.get()?;
        let refresh = self.refresher.get_or_init(|| {
            let me = me.clone();
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
        self.after_fetch(name, Need::Fresh, Box::new(move |_, seg| done(seg)));
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

    /// Where the notification of batch `batch_id` stands: none, pending
    /// (tasks running, or being sent), delivered (the peer's engine took
    /// it) or failed (why). Once every task has ended, asking hands it to
    /// the background to send, as polling a task does.
    pub fn notify_status(&self, batch_id: u64) -> Result<NotifyStatus> {
        let batch = self.batch(batch_id)?;
        if let Some(n) = batch.take_notify_to_send() {
            self.notify_later(batch_id, batch.clone(), n);
        }
        Ok(batch.notify_status())
    }

    /// Status of one task. A caller polling a task that is still running
    /// first lends its thread to one queued local copy or one round of a
    /// transport's work, or else yields its core. When the batch has completed and carries a
    /// notification, it is handed to the background to send (this call does
    /// not wait on the peer).
    pub fn status(&self, batch_id: u64, task_id: usize) -> Result<(TaskStatus, u64)> {
        let batch = self.batch(batch_id)?;
        let mut result = self.poll_task(batch_id, &batch, task_id)?;
        if result.0 == TaskStatus::Waiting {
            if self.lend_a_hand() {
                result = self.poll_task(batch_id, &batch, task_id)?;
            } else {
                // Nothing to lend a hand with: a caller polling in a loop
                // leaves the core to the threads (ours or a peer's on this
                // host) that move its bytes.
                std::thread::yield_now();
            }
        }
        Ok(result)
    }

    /// Status of task `task_id` of `batch` (id `batch_id`), as
    /// [`Batch::poll`] gives it; a task seen COMPLETED is counted in the
    /// metrics once, and once every task has ended the batch's
    /// notification is handed to the background to send (all completed)
    /// or fails unsent.
    pub(super) fn poll_task(
        &self,
        batch_id: u64,
        batch: &Arc<Batch>,
        task_id: usize,
    ) -> Result<(TaskStatus, u64)> {
        let result = batch.poll(task_id)?;
        if result.0 == TaskStatus::Completed && self.config.engine.metric {
            if let Some((bytes, latency)) = batch.first_completion(task_id) {
                self.metrics.record(bytes, latency);
            }
        }
        if matches!(
            result.0,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Canceled
        ) {
            if let Some(n) = batch.take_notify_to_send() {
                self.notify_later(batch_id, batch.clone(), n);
            }
        }
        Ok(result)
    }

    /// Lends the calling thread to one queued local copy, or to one round
    /// of a transport's work (`Transport::help`); false when there was
    /// none.
    pub(super) fn lend_a_hand(&self) -> bool {
        self.local.help_one() || sync::read(&self.transports).iter().any(|t| t.help())
    }

    /// The calling thread stops lending a hand (it is about to park): each
    /// transport takes back the work it left to helpers.
    pub(super) fn stop_helping(&self) {
        sync::read(&self.transports)
            .iter()
            .for_each(|t| t.stop_helping());
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
                let p = t.kind().protocol;
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
