//! The initiator's side of one target: attaching to it in the background,
//! posting WRITEs into its ring and taking their results, executing READs
//! from its memory, and failing what is in flight when it exits, stalls or
//! becomes unreachable.

use super::attach::{self, Link};
use super::cma::{self, Piece};
use super::poll::Token;
use super::reads::{self, ReadJob};
use super::ring::{Ring, Side, Status, Withdrawal};
use super::table::{Backing, Lookup, Scan, SlotView};
use super::{AttachFn, Shared, outcome_of, sys};
use crate::memory::Fence;
use crate::transport::local::copy_fenced;
use crate::transport::{Outcome, Slice};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// How long a target that could not be attached is left alone before the
/// next slice tries again.
const RETRY_AFTER: Duration = Duration::from_secs(10);

enum Phase {
    /// Not attached; the next slice attaches.
    Idle,
    Attaching,
    Attached(Arc<Link>),
    /// Attaching failed or the kernel refused a copy: use another
    /// transport until then.
    Unreachable(Instant),
    /// The target exited.
    Dead,
    /// Its [`super::ShmPeer`] was dropped.
    Detached,
}

/// The WRITEs of the current link: posted ones by position, and those
/// waiting for a free entry.
struct Queue {
    head: u64,
    tail: u64,
    /// Per entry: the slice posted there (`Some(None)`: the slice ended,
    /// withdrawn after the target claimed it, and the entry stays busy
    /// until the target completes it).
    posted: Vec<Option<Option<Slice>>>,
    /// With where the source lies in one of our memfds.
    backlog: VecDeque<(Slice, Option<Backing>)>,
    last_progress: Instant,
}

impl Queue {
    fn new(ring: &Ring) -> Queue {
        Queue {
            head: ring.first_position(),
            tail: ring.first_position(),
            posted: (0..ring.entries()).map(|_| None).collect(),
            backlog: VecDeque::new(),
            last_progress: Instant::now(),
        }
    }

    fn slot(&mut self, pos: u64) -> &mut Option<Option<Slice>> {
        let n = self.posted.len() as u64;
        &mut self.posted[(pos % n) as usize]
    }

    fn busy(&self) -> bool {
        self.tail != self.head || !self.backlog.is_empty()
    }

    /// Moves waiting WRITEs into free entries; whether any was posted.
    fn pump(&mut self, ring: &Ring) -> bool {
        let mut any = false;
        while let Some((s, backing)) = self.backlog.front() {
            let (pos, src, dst, len, backing) = (self.head, s.local, s.remote, s.len, *backing);
            if self.slot(pos).is_some() || !ring.post(pos, src, dst, len, backing) {
                break;
            }
            if self.tail == self.head {
                self.last_progress = Instant::now();
            }
            let s = self.backlog.pop_front().map(|(s, _)| s);
            *self.slot(pos) = Some(s);
            self.head += 1;
            any = true;
        }
        any
    }

    fn advance_tail(&mut self) {
        while self.tail < self.head && self.slot(self.tail).is_none() {
            self.tail += 1;
        }
    }

    /// Ends every slice held that the target is not copying, with how
    /// it ends: a completed one with its result, any other with
    /// `outcome`. Posted ones are withdrawn (claimed ones too, their
    /// entries busy until the target completes them as withdrawn); the
    /// ones the target is copying now stay held, unless `dead` (the target
    /// exited, so it copies nothing any more).
    fn withdraw_all(&mut self, ring: &Ring, outcome: Outcome, dead: bool) -> Vec<(Slice, Outcome)> {
        self.withdraw(ring, outcome, dead, |_| true)
    }

    /// [`Queue::withdraw_all`] of the slices `which` picks only.
    fn withdraw(
        &mut self,
        ring: &Ring,
        outcome: Outcome,
        dead: bool,
        which: impl Fn(&Slice) -> bool,
    ) -> Vec<(Slice, Outcome)> {
        let mut out = Vec::new();
        for pos in self.tail..self.head {
            let Some(held) = self.slot(pos).take() else {
                continue;
            };
            if held.as_ref().is_some_and(|s| !which(s)) {
                *self.slot(pos) = Some(held);
                continue;
            }
            // The entry is free again (`None`), or busy until the target
            // completes it (`Some(None)`), or still ours to wait for.
            let (ended, entry) = match ring.withdraw(pos) {
                Withdrawal::Done => (ring.take(pos).map(outcome_of_status), None),
                Withdrawal::Free => (Some(outcome), None),
                Withdrawal::Held => (Some(outcome), Some(None)),
                Withdrawal::Copying if dead => (Some(outcome), Some(None)),
                Withdrawal::Copying => (None, Some(None)),
            };
            match (held, ended) {
                (Some(s), Some(o)) => {
                    out.push((s, o));
                    *self.slot(pos) = entry;
                }
                (Some(s), None) => *self.slot(pos) = Some(Some(s)),
                (None, _) => *self.slot(pos) = entry,
            }
        }
        self.advance_tail();
        let mut kept = VecDeque::new();
        for (s, backing) in self.backlog.drain(..) {
            if which(&s) {
                out.push((s, outcome));
            } else {
                kept.push_back((s, backing));
            }
        }
        self.backlog = kept;
        out
    }

    /// How many slices are held (posted, and not ended).
    fn held(&self) -> usize {
        self.posted
            .iter()
            .filter(|s| matches!(s, Some(Some(_))))
            .count()
    }
}

struct State {
    phase: Phase,
    /// Slices posted while attaching.
    waiting: Vec<Slice>,
    queue: Option<Queue>,
}

/// A target we are attached to, and the link to it (the transport's list
/// of them is read without taking each target's lock).
#[derive(Clone)]
pub(crate) struct LinkEntry {
    pub core: Arc<PeerCore>,
    pub link: Arc<Link>,
}

/// One target as the initiator sees it.
pub(crate) struct PeerCore {
    /// Identifies the link's descriptors in the poll sets.
    pub id: u64,
    /// The target's pid, from its descriptor.
    pub target_pid: i32,
    shared: Weak<Shared>,
    attach: AttachFn,
    state: Mutex<State>,
    /// The first attach was logged.
    announced: AtomicBool,
    /// The target's completion count when its results were last taken.
    seen: AtomicU64,
    /// A thread that came to take results found the state locked: the
    /// holder has the threads do it once it lets go.
    reap_again: AtomicBool,
}

/// The state of a target, locked. Letting it go hands the results another
/// thread could not take meanwhile to the transport's threads: the lock's
/// holder may be a caller posting, which would not take them, and the
/// thread that wanted to may go to sleep believing there were none.
struct Locked<'a> {
    core: &'a PeerCore,
    /// Always `Some` until dropped.
    guard: Option<MutexGuard<'a, State>>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.core.reap_again.load(Ordering::SeqCst)
            && self.core.reap_again.swap(false, Ordering::SeqCst)
        {
            if let Some(shared) = self.core.shared.upgrade() {
                shared.kick();
            }
        }
    }
}

/// Ends a slice, keeping the counts.
fn finish(shared: &Shared, slice: Slice, outcome: Outcome) {
    if slice.write {
        shared.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
        if outcome == Outcome::Done {
            shared
                .counters
                .written
                .fetch_add(slice.len, Ordering::Relaxed);
        }
    } else if outcome == Outcome::Done {
        shared.counters.read.fetch_add(slice.len, Ordering::Relaxed);
    }
    slice.finish(outcome);
}

fn outcome_of_status(s: Status) -> Outcome {
    match s {
        Status::Done => Outcome::Done,
        Status::Rejected => Outcome::Rejected,
        Status::Failed => Outcome::Failed { hard: false },
        Status::Denied => Outcome::Unreachable,
        // Only a request we withdrew ends so, and its slice ended then.
        Status::Withdrawn => Outcome::Failed { hard: false },
    }
}

impl PeerCore {
    pub fn new(shared: &Arc<Shared>, target_pid: i32, attach: AttachFn) -> Arc<PeerCore> {
        Arc::new(PeerCore {
            id: shared.new_id(),
            target_pid,
            shared: Arc::downgrade(shared),
            attach,
            state: Mutex::new(State {
                phase: Phase::Idle,
                waiting: Vec::new(),
                queue: None,
            }),
            announced: AtomicBool::new(false),
            seen: AtomicU64::new(0),
            reap_again: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> Locked<'_> {
        Locked {
            core: self,
            guard: Some(self.state.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// The link, while attached.
    #[cfg(test)]
    pub fn link(&self) -> Option<Arc<Link>> {
        match &self.lock().phase {
            Phase::Attached(l) => Some(l.clone()),
            _ => None,
        }
    }

    /// Takes one slice (see [`super::ShmTransport::post`]). A READ posted
    /// under a plug waits on the calling thread until the flush
    /// ([`reads::stage`]).
    pub fn post(self: &Arc<Self>, slice: Slice) {
        if !slice.write && crate::transport::plug::plugged() {
            return reads::stage(self, slice);
        }
        let Some(shared) = self.shared.upgrade() else {
            return slice.finish(Outcome::Failed { hard: true });
        };
        // The first WRITE in flight wakes a thread, so that it sleeps with
        // a deadline (to notice a stalled target) from now on.
        if slice.write
            && shared.writes_in_flight.fetch_add(1, Ordering::SeqCst) == 0
            && shared.untimed_sleepers.load(Ordering::SeqCst) > 0
        {
            shared.kick();
        }
        let write = slice.write;
        if self.admit(&shared, write, std::iter::once(slice)) {
            shared.kick();
        }
    }

    /// Takes READs staged under a plug (all to this target), at the flush;
    /// the transport they were queued in, if they were: its threads owe a
    /// wake-up for them.
    pub fn post_staged(self: &Arc<Self>, slices: Vec<Slice>) -> Option<Arc<Shared>> {
        let Some(shared) = self.shared.upgrade() else {
            slices
                .into_iter()
                .for_each(|s| s.finish(Outcome::Failed { hard: true }));
            return None;
        };
        self.admit(&shared, false, slices).then_some(shared)
    }

    /// Hands slices of one kind (`write`: all WRITEs, else all READs) to
    /// the link, or to the attach, or ends them as the target's phase says;
    /// whether READs were queued for a thread (the caller owes it a kick).
    fn admit(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        write: bool,
        slices: impl IntoIterator<Item = Slice>,
    ) -> bool {
        let mut st = self.lock();
        if matches!(&st.phase, Phase::Attached(link) if link.ring.closed()) {
            // The target closed our ring: what is in it is interrupted,
            // and these slices attach again.
            drop(st);
            self.end_link(shared, Phase::Idle, Outcome::Interrupted, false);
            st = self.lock();
        }
        let refuse = match &st.phase {
            Phase::Dead => Outcome::Failed { hard: true },
            Phase::Detached => Outcome::Interrupted,
            Phase::Unreachable(until) if Instant::now() < *until => Outcome::Unreachable,
            Phase::Unreachable(_) | Phase::Idle => {
                st.phase = Phase::Attaching;
                st.waiting.extend(slices);
                drop(st);
                self.start_attach(shared);
                return false;
            }
            Phase::Attaching => {
                st.waiting.extend(slices);
                return false;
            }
            Phase::Attached(link) if !write => {
                let link = link.clone();
                drop(st);
                shared.reads.push(ReadJob::new(
                    self.clone(),
                    link,
                    slices.into_iter().collect(),
                ));
                return true;
            }
            Phase::Attached(link) => {
                let link = link.clone();
                let q = st.queue.as_mut().expect("an attached peer has a queue");
                for s in slices {
                    let backing = shared.table.backing_of(s.local, s.len);
                    q.backlog.push_back((s, backing));
                }
                let posted = q.pump(&link.ring);
                drop(st);
                if posted && link.ring.wake(Side::Target) {
                    sys::signal(&link.to_target);
                }
                return false;
            }
        };
        drop(st);
        slices.into_iter().for_each(|s| finish(shared, s, refuse));
        false
    }

    fn start_attach(self: &Arc<Self>, shared: &Arc<Shared>) {
        let me = self.clone();
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("te-shm-attach".into())
            .spawn(move || me.attach_now(&s));
        let mut attaches = shared.attaches.lock().unwrap_or_else(|e| e.into_inner());
        attaches.retain(|h| !h.is_finished());
        match spawned {
            Ok(h) => attaches.push(h),
            Err(e) => {
                drop(attaches);
                self.unreachable(shared, &format!("cannot start a thread: {e}"));
            }
        }
    }

    /// Runs the attach handshake and the checks; then the waiting slices
    /// go to the link, or, on failure, to another transport.
    fn attach_now(self: &Arc<Self>, shared: &Arc<Shared>) {
        let request = attach::request(shared);
        let linked = (self.attach)(&request)
            .map_err(|e| e.to_string())
            .and_then(|reply| attach::connect(&reply, self.target_pid, &shared.opts));
        let link = match linked {
            Ok(l) => Arc::new(l),
            Err(e) => return self.unreachable(shared, &e),
        };
        let mut st = self.lock();
        if !matches!(st.phase, Phase::Attaching) || shared.closing() {
            // Detached meanwhile, or shutting down: whoever changed the
            // phase failed the waiting slices.
            let waiting = std::mem::take(&mut st.waiting);
            drop(st);
            link.give_up();
            waiting
                .into_iter()
                .for_each(|s| finish(shared, s, Outcome::Interrupted));
            return;
        }
        shared.set_links(|v| {
            v.push(LinkEntry {
                core: self.clone(),
                link: link.clone(),
            })
        });
        let watched = shared
            .watch(&link.to_initiator, Token::Bell(self.id))
            .and_then(|()| {
                shared
                    .watch(&link.pidfd, Token::Death(self.id))
                    .inspect_err(|_| {
                        shared.unwatch(&link.to_initiator);
                    })
            });
        if let Err(e) = watched {
            drop(st);
            shared.set_links(|v| v.retain(|e| !Arc::ptr_eq(&e.core, self)));
            link.give_up();
            return self.unreachable(shared, &format!("epoll: {e}"));
        }
        let mut queue = Queue::new(&link.ring);
        let mut reads = Vec::new();
        for s in std::mem::take(&mut st.waiting) {
            if s.write {
                let backing = shared.table.backing_of(s.local, s.len);
                queue.backlog.push_back((s, backing));
            } else {
                reads.push(s);
            }
        }
        let posted = queue.pump(&link.ring);
        st.queue = Some(queue);
        st.phase = Phase::Attached(link.clone());
        drop(st);
        shared.counters.attached.fetch_add(1, Ordering::Relaxed);
        if !self.announced.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "shm: attached to process {}: data to it goes by shared memory",
                self.target_pid
            );
        }
        if posted && link.ring.wake(Side::Target) {
            sys::signal(&link.to_target);
        }
        if !reads.is_empty() {
            shared
                .reads
                .push(ReadJob::new(self.clone(), link.clone(), reads));
        }
        sys::signal(&shared.kick);
    }

    /// The target cannot be reached by shared memory (for a while): one
    /// log line per interval, and every slice goes to another transport.
    fn unreachable(self: &Arc<Self>, shared: &Shared, why: &str) {
        crate::log_limit::warn_limited!(
            "shm: process {} cannot be reached by shared memory ({why}); \
             using another transport",
            self.target_pid
        );
        self.end_link(
            shared,
            Phase::Unreachable(Instant::now() + RETRY_AFTER),
            Outcome::Unreachable,
            false,
        );
    }

    /// Leaves the current phase for `phase` (unless detached), drops the
    /// link, and ends every slice held with `outcome`; WRITEs the target
    /// is copying now are waited for ([`drain`]), unless it exited (`dead`).
    fn end_link(self: &Arc<Self>, shared: &Shared, phase: Phase, outcome: Outcome, dead: bool) {
        let mut st = self.lock();
        let old = if matches!(st.phase, Phase::Detached) {
            Phase::Detached
        } else {
            std::mem::replace(&mut st.phase, phase)
        };
        let mut slices: Vec<(Slice, Outcome)> = std::mem::take(&mut st.waiting)
            .into_iter()
            .map(|s| (s, outcome))
            .collect();
        let queue = st.queue.take();
        drop(st);
        if let Phase::Attached(link) = old {
            shared.unwatch(&link.to_initiator);
            shared.unwatch(&link.pidfd);
            shared.set_links(|v| v.retain(|e| !Arc::ptr_eq(&e.core, self)));
            match queue {
                Some(mut q) => {
                    slices.extend(q.withdraw_all(&link.ring, outcome, dead));
                    if q.held() > 0 {
                        let mut d = shared.draining.lock().unwrap_or_else(|e| e.into_inner());
                        d.push(Draining {
                            target_pid: self.target_pid,
                            link,
                            queue: q,
                            outcome,
                        });
                        shared.draining_links.store(d.len(), Ordering::SeqCst);
                    } else {
                        link.give_up();
                    }
                }
                None => link.give_up(),
            }
        }
        for (s, o) in slices {
            finish(shared, s, o);
        }
    }

    /// The target exited: everything in flight fails at once, and so will
    /// every later slice.
    pub fn target_died(self: &Arc<Self>, shared: &Shared) {
        tracing::debug!("shm: process {} exited", self.target_pid);
        self.end_link(shared, Phase::Dead, Outcome::Failed { hard: true }, true);
    }

    /// Fails everything held (shutdown).
    pub fn fail_all(self: &Arc<Self>, outcome: Outcome) {
        if let Some(shared) = self.shared.upgrade() {
            self.end_link(&shared, Phase::Detached, outcome, false);
        }
    }

    /// Whether the target exited or the handle was dropped: this core
    /// moves no more slices.
    pub fn gone(&self) -> bool {
        matches!(self.lock().phase, Phase::Dead | Phase::Detached)
    }

    /// The handle was dropped: fail what is held, detach from the target.
    pub fn detach(self: &Arc<Self>) {
        self.fail_all(Outcome::Interrupted);
    }

    /// Takes the results the target completed, posts waiting WRITEs into
    /// the entries that freed, and notices a ring the target closed.
    /// Returns whether anything happened.
    pub fn reap(self: &Arc<Self>, shared: &Shared, link: &Arc<Link>) -> bool {
        // Nothing completed and the ring open: nothing to take or post.
        let completions = link.ring.completions();
        if completions == self.seen.load(Ordering::Relaxed) && !link.ring.closed() {
            return false;
        }
        let mut done = Vec::new();
        // Another thread holding the lock (a caller posting) does not wait
        // for us, nor we for it: we ask it to have the threads take the
        // results once it lets go ([`Locked`]), then try. Asked before we
        // try (with a fence on both sides), the holder cannot miss it.
        self.reap_again.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        let guard = match self.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        let mut st = Locked {
            core: self,
            guard: Some(guard),
        };
        // Ours to do now; a request made after this is seen below, as it
        // follows a completion counted before it.
        self.reap_again.store(false, Ordering::SeqCst);
        if !matches!(&st.phase, Phase::Attached(l) if Arc::ptr_eq(l, link)) {
            return false;
        }
        self.seen.store(link.ring.completions(), Ordering::Relaxed);
        let Some(q) = st.queue.as_mut().filter(|q| q.busy()) else {
            return false;
        };
        let mut freed = false;
        for pos in q.tail..q.head {
            let slot = q.slot(pos);
            if slot.is_none() {
                continue;
            }
            if let Some(status) = link.ring.take(pos) {
                if let Some(Some(s)) = slot.take() {
                    done.push((s, status));
                }
                freed = true;
            }
        }
        if freed {
            q.advance_tail();
            q.last_progress = Instant::now();
        }
        let posted = q.pump(&link.ring);
        let closed = link.ring.closed();
        drop(st);
        if posted && link.ring.wake(Side::Target) {
            sys::signal(&link.to_target);
        }
        let mut denied = false;
        for (s, status) in done {
            denied |= status == Status::Denied;
            finish(shared, s, outcome_of_status(status));
        }
        if denied {
            self.unreachable(shared, "the kernel does not let it read our memory");
        } else if closed {
            crate::log_limit::warn_limited!(
                "shm: process {} closed our ring (it serves too many peers, or shut down); \
                 what was in it goes to another transport, and the next slice attaches again",
                self.target_pid
            );
            self.end_link(shared, Phase::Idle, Outcome::Interrupted, false);
        }
        freed || posted || closed
    }

    /// Withdraws the WRITEs of cancelled tasks that the target is not
    /// copying (posted, claimed between two pieces, or waiting for an
    /// entry or the attach): the target copies no byte of them afterwards
    /// (see [`super::ring`]), and they end as [`Outcome::Canceled`]. One
    /// it is copying is left to end, or to a later call.
    pub fn withdraw_canceled(self: &Arc<Self>, shared: &Shared) {
        let mut st = self.lock();
        let (mut out, waiting): (Vec<Slice>, Vec<Slice>) = std::mem::take(&mut st.waiting)
            .into_iter()
            .partition(Slice::canceled);
        st.waiting = waiting;
        let mut ended: Vec<(Slice, Outcome)> =
            out.drain(..).map(|s| (s, Outcome::Canceled)).collect();
        if let Phase::Attached(link) = &st.phase {
            let link = link.clone();
            if let Some(q) = st.queue.as_mut() {
                ended.extend(q.withdraw(&link.ring, Outcome::Canceled, false, Slice::canceled));
            }
        }
        drop(st);
        for (s, o) in ended {
            finish(shared, s, o);
        }
    }

    /// Fails the WRITEs in flight if the target completed none for the
    /// timeout: each one is withdrawn first (see [`super::ring`]), so the
    /// target copies nothing of it afterwards. A WRITE the target is
    /// copying at that moment is waited for; while one is, the next tick
    /// withdraws what it can again.
    pub fn check_stall(self: &Arc<Self>, shared: &Shared, now: Instant) {
        let mut st = self.lock();
        let Phase::Attached(link) = &st.phase else {
            return;
        };
        let link = link.clone();
        let Some(q) = st.queue.as_mut().filter(|q| q.busy()) else {
            return;
        };
        if now.saturating_duration_since(q.last_progress) < shared.opts.timeout {
            return;
        }
        let stalled = q.withdraw_all(&link.ring, Outcome::Failed { hard: false }, false);
        let copying = q.held();
        if copying == 0 {
            q.last_progress = now;
        }
        drop(st);
        if !stalled.is_empty() {
            crate::log_limit::warn_limited!(
                "shm: process {} completed no request for {:?} (MC_SHM_TIMEOUT_SEC); \
                 {} WRITE slice(s) to it were withdrawn and go to another transport (or \
                 fail); {copying} it is copying are waited for",
                self.target_pid,
                shared.opts.timeout,
                stalled.len()
            );
        }
        for (s, o) in stalled {
            finish(shared, s, o);
        }
    }
}

/// A link that ended while its target was copying some of its WRITEs:
/// kept until each of them ends (see [`drain`]).
pub(crate) struct Draining {
    target_pid: i32,
    link: Arc<Link>,
    queue: Queue,
    /// How the WRITEs end that are withdrawn rather than completed.
    outcome: Outcome,
}

/// Ends the WRITEs of ended links that their targets were copying, as
/// soon as each is completed or can be withdrawn (or its target exited);
/// a link with none left is given up. `wait`: keep going until none is
/// left or this passes (shutdown), then give the rest up with a log line.
pub(crate) fn drain(shared: &Shared, wait: Option<Duration>) {
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    loop {
        let mut ended = Vec::new();
        let left = {
            let mut d = shared.draining.lock().unwrap_or_else(|e| e.into_inner());
            d.retain_mut(|l| {
                let dead = sys::exited(&l.link.pidfd);
                ended.extend(l.queue.withdraw_all(&l.link.ring, l.outcome, dead));
                let done = l.queue.held() == 0;
                if done {
                    l.link.give_up();
                }
                !done
            });
            shared.draining_links.store(d.len(), Ordering::SeqCst);
            d.len()
        };
        for (s, o) in ended {
            finish(shared, s, o);
        }
        let Some(wait) = wait.filter(|_| left > 0) else {
            return;
        };
        if start.elapsed() >= wait {
            let d = std::mem::take(&mut *shared.draining.lock().unwrap_or_else(|e| e.into_inner()));
            shared.draining_links.store(0, Ordering::SeqCst);
            for mut l in d {
                let rest = l.queue.withdraw_all(&l.link.ring, l.outcome, true);
                tracing::warn!(
                    "shm: process {} is still copying {} WRITE slice(s) after {wait:?}; \
                     they fail, and it may still complete their copy",
                    l.target_pid,
                    rest.len()
                );
                l.link.give_up();
                for (s, o) in rest {
                    finish(shared, s, o);
                }
            }
            return;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// Executes READs, batching those to the same target into one copy: each
/// range is checked in the target's table before the copy and again
/// after. `scan`: whether this thread may bring our index of a target's
/// table up to date; READs that an older index cannot answer go back to
/// the queue for a thread that can. Returns whether any READ ended.
pub(crate) fn run_reads(shared: &Shared, jobs: Vec<ReadJob>, scan: Scan<'_>) -> bool {
    let mut jobs = jobs.into_iter().peekable();
    let mut ended = false;
    while let Some(mut first) = jobs.next() {
        while let Some(j) = jobs.next_if(|j| Arc::ptr_eq(&j.link, &first.link)) {
            first.slices.extend(j.slices);
            first.asked = first.asked.max(j.asked);
        }
        let taken = first.slices.len();
        match read_group(shared, first, scan) {
            Some(later) => {
                ended |= later.slices.len() < taken;
                shared.reads.push(later);
            }
            None => ended = true,
        }
    }
    ended
}

/// Executes one target's READs; returns those the index could not answer
/// yet ([`Lookup::Stale`]).
fn read_group(shared: &Shared, mut job: ReadJob, scan: Scan<'_>) -> Option<ReadJob> {
    let slices = std::mem::take(&mut job.slices);
    let (core, link) = (job.core.clone(), job.link.clone());
    let index = link.table.index(scan);
    link.maps.prune(&index);
    let mut pieces = Vec::with_capacity(slices.len());
    let mut checked = Vec::with_capacity(slices.len());
    let mut later = Vec::new();
    let mut unknown = false;
    for slice in slices {
        if slice.canceled() {
            finish(shared, slice, Outcome::Canceled);
            continue;
        }
        let view = match index.lookup(slice.remote, slice.len, job.asked) {
            Lookup::Found(v) if v.accessible() => v,
            Lookup::Found(_) | Lookup::Missing => {
                finish(shared, slice, Outcome::Rejected);
                continue;
            }
            Lookup::Unknown => {
                unknown = true;
                finish(shared, slice, Outcome::Unreachable);
                continue;
            }
            Lookup::Stale => {
                later.push(slice);
                continue;
            }
        };
        if let Some(outcome) = read_mapped(shared, &link, &view, &slice) {
            finish(shared, slice, outcome);
            continue;
        }
        pieces.push(Piece {
            local: slice.local,
            remote: slice.remote,
            len: slice.len,
        });
        checked.push((slice, view));
    }
    if unknown {
        crate::log_limit::warn_limited!(
            "shm: a READ from process {} is outside the buffers its table shows \
             (the table is full, MC_SHM_TABLE_SLOTS, or could not be read whole); \
             using another transport",
            core.target_pid
        );
    }
    if !later.is_empty() && !index.fresh() {
        // Not up to date, and this thread may not scan: wake one that may.
        shared.kick_now();
    }
    let later = (!later.is_empty()).then(|| ReadJob {
        slices: later,
        ..job
    });
    if pieces.is_empty() {
        return later;
    }
    // Our registered buffers the READs land in stay registered during the
    // copy; a READ whose buffer was unregistered since it was posted fails.
    let mut inside = Vec::with_capacity(checked.len());
    let mut refused = vec![false; checked.len()];
    for ((s, _), refused) in checked.iter().zip(refused.iter_mut()) {
        match s.local_fence.as_deref().map(Fence::enter) {
            Some(Some(g)) => inside.push(g),
            Some(None) => *refused = true,
            None => {}
        }
    }
    let kept: Vec<Piece>;
    let copied = if refused.contains(&true) {
        kept = pieces
            .iter()
            .zip(&refused)
            .filter(|(_, r)| !**r)
            .map(|(p, _)| *p)
            .collect();
        &kept
    } else {
        &pieces
    };
    // SAFETY: each local range is the destination of a READ slice: memory
    // the engine checked (or the caller vouched for) and that nobody else
    // touches until the slice ends, which happens after this call; where it
    // is registered, we are inside its fence.
    let results = unsafe { cma::read_from(link.pid, copied) };
    drop(inside);
    let mut results = results.into_iter();
    let mut last_error = None;
    let mut read = 0;
    let outcomes: Vec<Outcome> = checked
        .iter()
        .zip(&refused)
        .map(|((slice, view), &refused)| {
            if refused {
                return Outcome::Local;
            }
            // One result per piece copied, in order.
            match results.next() {
                Some(Ok(())) if link.table.unchanged(view) => {
                    read += slice.len;
                    Outcome::Done
                }
                Some(Ok(())) | None => Outcome::Failed { hard: false },
                Some(Err(e)) => {
                    last_error = Some(e);
                    outcome_of(e)
                }
            }
        })
        .collect();
    // Counted once for the group (the counter is shared by every thread),
    // and before any slice ends, so a caller that sees its batch done sees
    // its bytes counted.
    shared.counters.read.fetch_add(read, Ordering::Relaxed);
    for ((slice, _), outcome) in checked.into_iter().zip(outcomes) {
        slice.finish(outcome);
    }
    match last_error {
        Some(cma::CopyError::Denied) => {
            core.unreachable(shared, "the kernel does not let us read its memory")
        }
        Some(cma::CopyError::Gone) => core.target_died(shared),
        _ => {}
    }
    later
}

/// A READ from a memfd-backed buffer of the target, by memcpy from our
/// mapping of it, checked against the table after the copy; `None` if the
/// buffer is not in a memfd we can map. The copy holds the fences of our
/// registered buffers the destination overlaps (unregistering one stops
/// it, and the READ fails).
fn read_mapped(shared: &Shared, link: &Link, view: &SlotView, s: &Slice) -> Option<Outcome> {
    let b = view.backing?;
    let at = Backing {
        offset: b.offset.checked_add(s.remote - view.addr)?,
        ..b
    };
    let map = link.maps.get(&link.pidfd, &at, s.len)?;
    // SAFETY: the source lies inside the mapping (`PeerMaps::get` checked
    // it against its size, which is sealed); the destination is the READ's
    // local buffer, ours until the slice ends, and fenced where it is
    // registered. The target may write the source meanwhile, as it may
    // during a copy over TCP.
    let copied = unsafe {
        copy_fenced(
            map.ptr().add(at.offset as usize) as u64,
            s.local,
            s.len,
            None,
            s.local_fence.as_slice(),
        )
    };
    if copied.is_err() {
        return Some(Outcome::Local);
    }
    shared.counters.mapped.fetch_add(s.len, Ordering::Relaxed);
    Some(if link.table.unchanged(view) {
        Outcome::Done
    } else {
        Outcome::Failed { hard: false }
    })
}

/// Waits for the attach threads (shutdown).
pub(crate) fn join_attaches(shared: &Shared) {
    let handles = std::mem::take(&mut *shared.attaches.lock().unwrap_or_else(|e| e.into_inner()));
    for h in handles {
        if h.join().is_err() {
            tracing::warn!("shm: an attach thread panicked");
        }
    }
}
