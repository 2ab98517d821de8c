//! An endpoint: the `MC_NUM_QP_PER_EP` RC queue pairs between one local
//! device and one peer NIC path, shared by both directions, with the
//! slices waiting for them and the work requests in flight on each.
//!
//! Life cycle: `New` -> `Connecting` (our handshake is out) or set up
//! directly by the peer's handshake -> `WaitReadyAck` (queue pairs at RTS,
//! the confirming message not yet exchanged) -> `Connected` -> `Failed`.
//! An endpoint never goes back: a failed one leaves the pool and a fresh
//! one (new queue pairs) replaces it. One that is evicted drains: it takes
//! no new slices, finishes those it has, then closes.

use super::handshake::HandshakeDesc;
use super::registry::MrGuard;
use super::wr_id::WrId;
use crate::batch;
use crate::sync;
use crate::transport::endpoint::Endpoint;
use crate::transport::{Outcome, Slice};
use crate::verbs::{ConnectParams, QueuePair, WorkRequest};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A slice ready to post: the keys of both sides and the hold on the
/// local registration.
pub struct PostJob {
    /// The slice.
    pub slice: Slice,
    /// Local key of the local range (0 for a probe).
    pub lkey: u32,
    /// Peer's key of the remote range (0 for a probe).
    pub rkey: u32,
    /// Keeps the local buffer registered while the request runs.
    pub _hold: Option<MrGuard>,
}

/// Slices that ended, to report once no lock is held.
pub type Ended = Vec<(Slice, Outcome)>;

/// Reports every ended slice.
pub fn report(ended: Ended) {
    for (slice, outcome) in ended {
        slice.finish(outcome);
    }
}

/// Where an endpoint is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Created, never connected.
    New,
    /// Our handshake is on its way.
    Connecting,
    /// Queue pairs at RTS; the ready ACK is not yet exchanged.
    WaitReadyAck,
    /// Serving.
    Connected,
    /// Out of service for good.
    Failed,
}

struct State {
    phase: Phase,
    peer_qpns: Vec<u32>,
    /// When `WaitReadyAck` began.
    ready_since: Option<Instant>,
    /// Left the pool (evicted or failed) at this time.
    retired_at: Option<Instant>,
}

struct Posted {
    seq: u64,
    job: PostJob,
}

/// The requests of one queue pair, under their own lock: completions
/// take it without waiting for a post in progress (which holds the queue
/// pair's lock across the system call).
struct Track {
    /// Work requests in flight, in posting order: consecutive sequence
    /// numbers (a request that could not be posted takes none).
    posted: VecDeque<Posted>,
    /// The sequence number of the next request posted.
    next_seq: u64,
    last_progress: Instant,
}

/// The room of one completion queue: requests outstanding on it are
/// reserved before they are posted, so it never overflows, without a lock
/// around posting.
pub struct CqRoom {
    capacity: usize,
    outstanding: AtomicUsize,
}

impl CqRoom {
    /// The room of a queue of `capacity` entries.
    pub fn new(capacity: usize) -> CqRoom {
        CqRoom {
            capacity,
            outstanding: AtomicUsize::new(0),
        }
    }

    /// Reserves room for up to `want` requests; returns how many.
    fn reserve(&self, want: usize) -> usize {
        let mut cur = self.outstanding.load(Ordering::Acquire);
        loop {
            let n = want.min(self.capacity.saturating_sub(cur));
            if n == 0 {
                return 0;
            }
            match self.outstanding.compare_exchange_weak(
                cur,
                cur + n,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return n,
                Err(now) => cur = now,
            }
        }
    }

    /// Gives back room for `n` requests (they ended or were not posted).
    fn release(&self, n: usize) {
        if n > 0 {
            self.outstanding.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Requests outstanding.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    /// Whether a request would find room.
    pub fn has_room(&self) -> bool {
        self.outstanding() < self.capacity
    }
}

/// One queue pair. Lock order: `qp`, then `track`.
struct QpSlot {
    qp_num: u32,
    /// `None` once destroyed; held while posting.
    qp: Mutex<Option<QueuePair>>,
    track: Mutex<Track>,
}

struct Queue {
    jobs: VecDeque<PostJob>,
    scheduled: bool,
    /// The queue pair the next post starts with: posts of a few requests
    /// each still spread over all of them.
    next_slot: usize,
    /// [`batch::cancels`] when the queue was last looked through for
    /// requests of cancelled tasks.
    cancels_seen: u64,
}

/// The queue pairs to one peer NIC path.
pub struct RdmaEndpoint {
    /// The peer NIC path (`<server>@<device>`), the pool key.
    pub peer_nic_path: String,
    /// Its index in the device's endpoint slab (see [`WrId`]).
    tag: u64,
    /// Which of the device's completion queues its queue pairs use.
    cq_index: usize,
    slots: Vec<QpSlot>,
    state: Mutex<State>,
    queue: Mutex<Queue>,
    /// The peer's handshake address, once we sent it a slice.
    peer_rpc: Mutex<Option<(String, u16)>>,
    /// How long a retired endpoint may wait for its work requests.
    give_up: Duration,
    closed: AtomicBool,
    /// The room of its completion queue.
    cq: Arc<CqRoom>,
    /// Its last setup failed at RTR with EINVAL.
    rtr_einval: AtomicBool,
    /// Requests of ours that ended through a completion.
    completed: AtomicU64,
    /// The load of this rail (this device to the peer NIC), kept by the
    /// workers without a lock.
    load: RailLoad,
}

/// The load of one rail: what is posted and not yet ended.
#[derive(Default)]
pub struct RailLoad {
    requests: AtomicUsize,
    bytes: AtomicU64,
}

impl RailLoad {
    fn add(&self, requests: usize, bytes: u64) {
        self.requests.fetch_add(requests, Ordering::AcqRel);
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    fn sub(&self, requests: usize, bytes: u64) {
        self.requests.fetch_sub(requests, Ordering::AcqRel);
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Requests posted and not yet ended.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::Acquire)
    }

    /// Their bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }
}

/// What posting from an endpoint left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posting {
    /// Nothing is waiting.
    Drained,
    /// Slices wait for room in a queue pair: a completion on this
    /// endpoint reschedules it.
    QueueFull,
    /// Slices wait for room in the completion queue.
    CqFull,
    /// Slices wait for the connection.
    NotReady,
}

impl RdmaEndpoint {
    /// An endpoint over `qps` (freshly created, in RESET), whose
    /// completions name it by `tag` and arrive on completion queue
    /// `cq_index`, whose room is `cq`.
    pub fn new(
        peer_nic_path: String,
        tag: u64,
        qps: Vec<QueuePair>,
        give_up: Duration,
        (cq_index, cq): (usize, Arc<CqRoom>),
    ) -> RdmaEndpoint {
        let now = Instant::now();
        RdmaEndpoint {
            peer_nic_path,
            tag,
            cq_index,
            slots: qps
                .into_iter()
                .map(|qp| QpSlot {
                    qp_num: qp.qp_num(),
                    qp: Mutex::new(Some(qp)),
                    track: Mutex::new(Track {
                        posted: VecDeque::new(),
                        next_seq: 0,
                        last_progress: now,
                    }),
                })
                .collect(),
            state: Mutex::new(State {
                phase: Phase::New,
                peer_qpns: Vec::new(),
                ready_since: None,
                retired_at: None,
            }),
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                scheduled: false,
                next_slot: 0,
                cancels_seen: batch::cancels(),
            }),
            peer_rpc: Mutex::new(None),
            give_up,
            closed: AtomicBool::new(false),
            cq,
            rtr_einval: AtomicBool::new(false),
            completed: AtomicU64::new(0),
            load: RailLoad::default(),
        }
    }

    /// The load of its rail.
    pub fn load(&self) -> &RailLoad {
        &self.load
    }

    /// Its tag in the device's endpoint slab.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The index of its completion queue in the device's.
    pub fn cq_index(&self) -> usize {
        self.cq_index
    }

    /// Remembers the peer's handshake address.
    pub fn set_peer_rpc(&self, host: &str, port: u16) {
        let mut r = sync::lock(&self.peer_rpc);
        if r.is_none() {
            *r = Some((host.to_string(), port));
        }
    }

    /// The peer's handshake address, if known.
    pub fn peer_rpc(&self) -> Option<(String, u16)> {
        sync::lock(&self.peer_rpc).clone()
    }

    /// Our queue pair numbers.
    pub fn qpns(&self) -> Vec<u32> {
        self.slots.iter().map(|s| s.qp_num).collect()
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        sync::lock(&self.state).phase
    }

    /// Whether its last queue pair setup failed because the device refused
    /// RTR with EINVAL (an unusable source GID, `MC_AUTO_GID_MAX_RETRIES`).
    pub fn rtr_einval(&self) -> bool {
        self.rtr_einval.load(Ordering::Acquire)
    }

    /// Whether it left the pool.
    pub fn retired(&self) -> bool {
        sync::lock(&self.state).retired_at.is_some()
    }

    /// Whether its queue pairs are destroyed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Queues a job. Returns the phase seen, and whether the caller must
    /// schedule the endpoint (it is connected and was not scheduled).
    /// A failed endpoint refuses the job (returned).
    pub fn enqueue(&self, job: PostJob) -> Result<(Phase, bool), PostJob> {
        // The phase is read under the queue lock: whoever connects the
        // endpoint changes the phase first, then looks at the queue.
        let mut q = sync::lock(&self.queue);
        let phase = self.phase();
        if phase == Phase::Failed {
            return Err(job);
        }
        q.jobs.push_back(job);
        let schedule = phase == Phase::Connected && !q.scheduled;
        if schedule {
            q.scheduled = true;
        }
        Ok((phase, schedule))
    }

    /// Marks the endpoint scheduled if it has queued jobs and is not;
    /// returns whether the caller must put it on the runnable list.
    pub fn want_schedule(&self) -> bool {
        if self.phase() != Phase::Connected {
            return false;
        }
        let mut q = sync::lock(&self.queue);
        if q.jobs.is_empty() || q.scheduled {
            return false;
        }
        q.scheduled = true;
        true
    }

    /// `New` -> `Connecting`; false if it was not `New`.
    pub fn start_connecting(&self) -> bool {
        let mut s = sync::lock(&self.state);
        if s.phase != Phase::New {
            return false;
        }
        s.phase = Phase::Connecting;
        true
    }

    /// The message describing our side of this endpoint.
    pub fn local_desc(&self, local_nic_path: &str, lid: u16, gid: &str) -> HandshakeDesc {
        HandshakeDesc {
            local_nic_path: local_nic_path.to_string(),
            local_lid: lid,
            local_gid: gid.to_string(),
            peer_nic_path: self.peer_nic_path.clone(),
            qp_num: self.qpns(),
            ready_ack: Some(false),
            reply_msg: String::new(),
        }
    }

    fn connect_qps(
        &self,
        params: &dyn Fn(u32) -> ConnectParams,
        peer: &[u32],
    ) -> Result<(), String> {
        self.rtr_einval.store(false, Ordering::Release);
        if peer.len() != self.slots.len() {
            return Err(format!(
                "QP count mismatch: the peer has {} queue pairs per endpoint, we have {} \
                 (MC_NUM_QP_PER_EP must match on both sides)",
                peer.len(),
                self.slots.len()
            ));
        }
        for (slot, &qpn) in self.slots.iter().zip(peer) {
            let qp = sync::lock(&slot.qp);
            let qp = qp.as_ref().ok_or("the endpoint is closed")?;
            qp.connect(&params(qpn)).map_err(|(stage, e)| {
                self.rtr_einval.store(
                    stage == "RTR" && e.raw_os_error() == Some(libc::EINVAL),
                    Ordering::Release,
                );
                format!(
                    "moving QP {} to {stage} towards {} (peer QP {qpn}) failed: {e}; check the \
                     MTU, GID index and the peer's GID",
                    slot.qp_num, self.peer_nic_path
                )
            })?;
        }
        Ok(())
    }

    /// The active side's second half: our handshake was answered with
    /// `reply`. Connects the queue pairs unless the peer's own handshake
    /// already did (simultaneous open). Returns whether a ready ACK must
    /// be sent before the endpoint serves.
    pub fn finish_active(
        &self,
        local: &HandshakeDesc,
        reply: &HandshakeDesc,
        params: &dyn Fn(u32) -> ConnectParams,
    ) -> Result<bool, String> {
        let mut s = sync::lock(&self.state);
        match s.phase {
            Phase::WaitReadyAck | Phase::Connected => {
                // The peer connected to us while our request was out.
                if s.peer_qpns == reply.qp_num {
                    if reply.ready_ack.is_none() {
                        s.phase = Phase::Connected;
                    }
                    return Ok(reply.ready_ack.is_some() && s.phase != Phase::Connected);
                }
                return Err(format!(
                    "simultaneous setup with {} ended with different queue pairs ({:?} vs {:?})",
                    self.peer_nic_path, s.peer_qpns, reply.qp_num
                ));
            }
            Phase::Connecting => {}
            other => return Err(format!("endpoint to {} is {other:?}", self.peer_nic_path)),
        }
        if !reply.reply_msg.is_empty() {
            return Err(format!(
                "{} refused the connection: {}",
                self.peer_nic_path, reply.reply_msg
            ));
        }
        if reply.local_nic_path != self.peer_nic_path || reply.peer_nic_path != local.local_nic_path
        {
            return Err(format!(
                "handshake reply names {} -> {}, expected {} -> {}",
                reply.local_nic_path, reply.peer_nic_path, self.peer_nic_path, local.local_nic_path
            ));
        }
        self.connect_qps(params, &reply.qp_num)?;
        s.peer_qpns = reply.qp_num.clone();
        let ack = reply.ready_ack.is_some();
        s.phase = if ack {
            s.ready_since = Some(Instant::now());
            Phase::WaitReadyAck
        } else {
            Phase::Connected
        };
        Ok(ack)
    }

    /// The active side's ready ACK was accepted: the endpoint serves.
    pub fn ack_sent(&self) -> bool {
        let mut s = sync::lock(&self.state);
        if s.phase == Phase::WaitReadyAck {
            s.phase = Phase::Connected;
            s.ready_since = None;
            return true;
        }
        s.phase == Phase::Connected
    }

    /// The passive side: the peer's handshake `req` (not a ready ACK).
    /// Connects the queue pairs to the peer's, or confirms an existing
    /// identical connection. `Err(true)`: the endpoint is connected to
    /// other queue pairs (the peer restarted): retire it and use a fresh
    /// one. `Err(false)` with a message: refuse.
    pub fn accept(
        &self,
        req: &HandshakeDesc,
        params: &dyn Fn(u32) -> ConnectParams,
    ) -> Result<(), (bool, String)> {
        let mut s = sync::lock(&self.state);
        match s.phase {
            Phase::Failed => return Err((true, String::new())),
            Phase::WaitReadyAck | Phase::Connected => {
                if s.peer_qpns != req.qp_num {
                    return Err((true, String::new()));
                }
                if req.ready_ack.is_none() {
                    s.phase = Phase::Connected;
                }
                return Ok(());
            }
            Phase::New | Phase::Connecting => {}
        }
        self.connect_qps(params, &req.qp_num)
            .map_err(|e| (false, e))?;
        s.peer_qpns = req.qp_num.clone();
        if req.ready_ack.is_some() {
            s.phase = Phase::WaitReadyAck;
            s.ready_since = Some(Instant::now());
        } else {
            s.phase = Phase::Connected;
        }
        Ok(())
    }

    /// The peer's ready ACK for queue pairs `qpns`.
    pub fn ready_ack(&self, qpns: &[u32]) -> Result<(), String> {
        let mut s = sync::lock(&self.state);
        match s.phase {
            Phase::WaitReadyAck | Phase::Connected if s.peer_qpns == qpns => {
                s.phase = Phase::Connected;
                s.ready_since = None;
                Ok(())
            }
            Phase::WaitReadyAck | Phase::Connected => {
                Err("received stale RDMA ready ACK with mismatched peer QP numbers".into())
            }
            _ => Err("received RDMA ready ACK for unconnected endpoint".into()),
        }
    }

    /// Whether it has waited for a ready ACK longer than `limit`.
    pub fn ready_ack_overdue(&self, limit: Duration) -> bool {
        let s = sync::lock(&self.state);
        s.phase == Phase::WaitReadyAck && s.ready_since.is_some_and(|t| t.elapsed() > limit)
    }

    /// Takes the endpoint out of the pool's service. `fail`: it is broken;
    /// queued slices end with `outcome` (returned to report), and posted
    /// ones end through their completions (flushed) or at close. Otherwise
    /// (eviction) it finishes what it has first.
    pub fn retire(&self, fail: bool, outcome: Outcome) -> Ended {
        {
            let mut s = sync::lock(&self.state);
            s.retired_at.get_or_insert_with(Instant::now);
            if fail {
                s.phase = Phase::Failed;
            }
        }
        if !fail {
            return Vec::new();
        }
        let jobs: Vec<PostJob> = sync::lock(&self.queue).jobs.drain(..).collect();
        let mut ended: Ended = jobs.into_iter().map(|j| (j.slice, outcome)).collect();
        // A queue pair in error flushes its requests; move them there.
        for slot in &self.slots {
            let qp = sync::lock(&slot.qp);
            let busy = !sync::lock(&slot.track).posted.is_empty();
            if let (Some(qp), true) = (qp.as_ref(), busy) {
                if let Err(e) = qp.to_error() {
                    tracing::debug!("QP {} to ERR: {e}", slot.qp_num);
                }
            }
        }
        ended.shrink_to_fit();
        ended
    }

    /// Posts queued jobs within each queue pair's room (`max_wr`) and the
    /// completion queue's room (reserved before each post), as one chain
    /// per queue pair (starting one queue pair further each call) in which
    /// every `signal_every`-th request and the last are signaled. Returns what is left waiting, and the slices
    /// whose post failed.
    pub fn post_queued(&self, max_wr: usize, signal_every: usize) -> (Posting, Ended) {
        let signal_every = signal_every.max(1);
        let mut ended = Vec::new();
        let mut q = sync::lock(&self.queue);
        q.scheduled = false;
        // Requests of cancelled tasks are withdrawn before they are posted
        // (posted ones cannot be: their completions end them).
        let cancels = batch::cancels();
        if cancels != q.cancels_seen {
            q.cancels_seen = cancels;
            let (gone, kept): (VecDeque<PostJob>, VecDeque<PostJob>) =
                q.jobs.drain(..).partition(|j| j.slice.canceled());
            q.jobs = kept;
            ended.extend(gone.into_iter().map(|j| (j.slice, Outcome::Canceled)));
        }
        match self.phase() {
            Phase::Connected => {}
            Phase::Failed => {
                ended.extend(q.jobs.drain(..).map(|j| (j.slice, Outcome::Interrupted)));
                return (Posting::Drained, ended);
            }
            _ => return (Posting::NotReady, ended),
        }
        let n_qp = self.slots.len();
        let start = q.next_slot;
        q.next_slot = (start + 1) % n_qp.max(1);
        let mut waiting_for = Posting::Drained;
        for i in 0..n_qp {
            let s = (start + i) % n_qp;
            let slot = &self.slots[s];
            if q.jobs.is_empty() {
                break;
            }
            let qp = sync::lock(&slot.qp);
            let Some(qp) = qp.as_ref() else {
                break;
            };
            let room = max_wr.saturating_sub(sync::lock(&slot.track).posted.len());
            // Spread what is queued over the remaining queue pairs.
            let share = q.jobs.len().div_ceil(n_qp - i);
            if share.min(room) == 0 {
                waiting_for = Posting::QueueFull;
                continue;
            }
            let n = self.cq.reserve(share.min(room));
            if n == 0 {
                waiting_for = Posting::CqFull;
                break;
            }
            // The requests are in the posted list (holding their guards)
            // before the device can complete them.
            let (wrs, bytes) = {
                let mut track = sync::lock(&slot.track);
                let first_seq = track.next_seq;
                let wrs: Vec<WorkRequest> = q
                    .jobs
                    .iter()
                    .take(n)
                    .enumerate()
                    .map(|(k, j)| WorkRequest {
                        wr_id: WrId::encode(self.tag, s, first_seq + k as u64),
                        local_addr: j.slice.local,
                        len: j.slice.len as u32,
                        lkey: j.lkey,
                        remote_addr: j.slice.remote,
                        rkey: j.rkey,
                        write: j.slice.write,
                        signaled: k + 1 == n || (k + 1) % signal_every == 0 || j.slice.len == 0,
                    })
                    .collect();
                if track.posted.is_empty() {
                    track.last_progress = Instant::now();
                }
                let jobs = q.jobs.drain(..n).enumerate();
                track.posted.extend(jobs.map(|(k, job)| Posted {
                    seq: first_seq + k as u64,
                    job,
                }));
                track.next_seq += n as u64;
                let bytes: u64 = wrs.iter().map(|w| u64::from(w.len)).sum();
                (wrs, bytes)
            };
            self.load.add(n, bytes);
            // SAFETY: every local range lies in the registration its job's
            // guard holds (the scheduler cuts slices at buffer ends), and
            // the guard lives in the posted list until the request ends.
            let Err(e) = (unsafe { qp.post(&wrs) }) else {
                continue;
            };
            // The requests not posted are the last of the list: posts to
            // this queue pair hold its lock, and completions and
            // destruction end posted requests only (destruction takes the
            // queue pair's lock first).
            let unposted = n - e.posted;
            let failed: Vec<Posted> = {
                let mut track = sync::lock(&slot.track);
                let at = track.posted.len() - unposted;
                track.next_seq -= unposted as u64;
                track.posted.drain(at..).collect()
            };
            self.cq.release(unposted);
            self.load
                .sub(unposted, failed.iter().map(|p| p.job.slice.len).sum());
            crate::log_limit::warn_limited!(
                "posting to QP {} ({}) failed: {}",
                slot.qp_num,
                self.peer_nic_path,
                e.error
            );
            ended.extend(
                failed
                    .into_iter()
                    .map(|p| (p.job.slice, Outcome::Failed { hard: false })),
            );
        }
        if !q.jobs.is_empty() && waiting_for == Posting::Drained {
            waiting_for = Posting::QueueFull;
        }
        (waiting_for, ended)
    }

    /// A completion of queue pair `qp_num` for the request `id` names:
    /// every earlier request on that queue pair succeeded (RC completes in
    /// order; an unsignaled request produces a completion only if it
    /// fails), this one by `outcome`. A completion for a request the queue
    /// pair does not hold (one already ended, e.g. at [`Self::destroy`])
    /// is ignored. Adds the ended slices to `ended`; returns how many
    /// requests left the queue pair.
    pub fn complete(&self, qp_num: u32, id: WrId, outcome: Outcome, ended: &mut Ended) -> usize {
        let Some(slot) = self.slots.get(id.slot).filter(|s| s.qp_num == qp_num) else {
            return 0;
        };
        let mut track = sync::lock(&slot.track);
        let Some(front) = track.posted.front().map(|p| p.seq) else {
            return 0;
        };
        // Sequence numbers in flight are consecutive and fewer than 2^24
        // (a queue pair holds at most 65535 requests): the low bits find
        // the request.
        let at = (u64::from(id.seq).wrapping_sub(front) & WrId::SEQ_MASK) as usize;
        if at >= track.posted.len() {
            return 0;
        }
        let n = at + 1;
        let mut bytes = 0;
        for (k, p) in track.posted.drain(..n).enumerate() {
            let o = if k == at { outcome } else { Outcome::Done };
            bytes += p.job.slice.len;
            ended.push((p.job.slice, o));
        }
        self.load.sub(n, bytes);
        track.last_progress = Instant::now();
        self.cq.release(n);
        self.completed.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// A number that changes whenever the peer sends a request on one of
    /// the queue pairs (their expected receive PSNs) or a request of ours
    /// completes: tells an endpoint in use from an idle one, also on the
    /// side that only serves the peer's one-sided requests.
    pub fn activity(&self) -> u64 {
        let mut sum = self.completed.load(Ordering::Relaxed);
        for slot in &self.slots {
            if let Some(Ok(psn)) = sync::lock(&slot.qp).as_ref().map(QueuePair::rq_psn) {
                sum = sum.wrapping_add(u64::from(psn));
            }
        }
        sum
    }

    /// Whether a queue pair has had requests outstanding without progress
    /// for longer than `limit`.
    pub fn stalled(&self, limit: Duration) -> bool {
        self.slots.iter().any(|s| {
            let track = sync::lock(&s.track);
            !track.posted.is_empty() && track.last_progress.elapsed() > limit
        })
    }

    /// Destroys the queue pairs (the device stops touching memory for
    /// them) and returns the requests still outstanding and the queued
    /// slices, ended (with `outcome`, and `Interrupted`).
    pub fn destroy(&self, outcome: Outcome) -> Ended {
        let mut ended = Vec::new();
        for slot in &self.slots {
            drop(sync::lock(&slot.qp).take());
            let mut track = sync::lock(&slot.track);
            let n = track.posted.len();
            let bytes = track.posted.iter().map(|p| p.job.slice.len).sum();
            ended.extend(track.posted.drain(..).map(|p| (p.job.slice, outcome)));
            self.cq.release(n);
            self.load.sub(n, bytes);
        }
        ended.extend(
            sync::lock(&self.queue)
                .jobs
                .drain(..)
                .map(|j| (j.slice, Outcome::Interrupted)),
        );
        self.closed.store(true, Ordering::Release);
        ended
    }
}

impl Endpoint for RdmaEndpoint {
    /// Nothing queued or outstanding, and not connecting; or retired for
    /// longer than the completion timeout (what is left is then given up).
    fn quiescent(&self) -> bool {
        let s = sync::lock(&self.state);
        if s.retired_at.is_some_and(|t| t.elapsed() > self.give_up) {
            return true;
        }
        if s.phase == Phase::Connecting {
            return false;
        }
        drop(s);
        self.load.requests() == 0 && sync::lock(&self.queue).jobs.is_empty()
    }

    fn close(&self) {
        let ended = self.destroy(Outcome::Failed { hard: true });
        if !ended.is_empty() {
            crate::log_limit::warn_limited!(
                "endpoint to {} closed with {} request(s) outstanding; they failed",
                self.peer_nic_path,
                ended.len()
            );
        }
        report(ended);
    }
}
