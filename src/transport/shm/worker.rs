//! The transport's threads (`MC_SHM_THREADS`), shared by both sides: each
//! executes queued READs, serves the rings of attached initiators, takes
//! the results of our WRITEs, and looks for stalled targets. An idle
//! thread polls for `MC_SHM_SPIN_US`, then sleeps on its epoll set until a
//! peer or this process rings an eventfd or a peer exits; it wakes
//! periodically only while WRITEs are in flight (to notice a stall) or a
//! ring waits for its initiator to activate it (to drop it if it never
//! does).
//!
//! Sleeping without losing a post. Each ring has one "target sleeps" flag
//! in shared memory (and each link an "initiator sleeps" flag, the same
//! way for completions); a peer that publishes work afterwards clears the
//! flag and, if it was set, rings our eventfd, which every thread's epoll
//! set watches (level-triggered). With threads T1..Tn:
//!
//! 1. A thread that found no work counts itself asleep, sets the flag of
//!    every ring, and then scans every ring once more; only if that scan
//!    finds nothing does it wait in epoll. The flag store and the peer's
//!    post are both sequentially consistent, as are the scan's load and
//!    the peer's load of the flag: either the scan sees the post, or the
//!    peer sees the flag and rings.
//! 2. A thread whose scan cannot take a ring's cursor does not conclude the
//!    ring is idle: it marks the cursor, and its holder scans again before
//!    it lets go ([`serve::serve_one`] has the steps).
//! 3. A thread may leave the flags alone when it goes to sleep while
//!    another thread polls (spins): that one goes through step 1 before it
//!    sleeps, so the last thread to sleep always sets them.
//!
//! So a request posted while every thread sleeps wakes one, and one
//! posted while some thread is awake is seen by that thread's next scan
//! (step 2 covers a scan that is under way). A ring rings one sleeper
//! (`EPOLLEXCLUSIVE`) and the peer clears the flag, so while that thread
//! works, later posts wake nobody else: a thread that claims a long copy
//! sets its ring's flag again, so that the next post wakes another thread
//! to serve it meanwhile ([`serve::serve_one`]). While a caller polls for
//! its tasks ([`super::ShmTransport::help`]), the threads leave the
//! results of our WRITEs to it and the targets do not ring us for them,
//! until a millisecond passes without a poll or the caller stops to park
//! ([`super::ShmTransport::stop_helping`], which kicks a thread).
//! The READs a caller queues in one submission kick the threads once, at
//! its end ([`super::ShmTransport::flush`]), or not at all when that
//! caller polls: it does the first round itself there.

use super::poll::Token;
use super::ring::Side;
use super::table::Scan;
use super::{BATCH, BATCH_BYTES, Shared, peer, serve, sys};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often stalls are looked for while WRITEs are in flight.
fn tick(shared: &Shared) -> Duration {
    (shared.opts.timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// The loop of thread `me`.
pub(crate) fn run(shared: &Arc<Shared>, me: usize) {
    let poll = &shared.polls[me];
    let mut events = Vec::new();
    let mut gaps = Gaps::new(shared.opts.spin);
    while !shared.closing() {
        check_stalls(shared);
        if pass(shared, !shared.caller_helps(), Scan::Try(&shared.closing)) {
            gaps.work();
            continue;
        }
        gaps.idle();
        if spin(shared, &gaps) {
            gaps.work();
            continue;
        }
        // Say we sleep, then look once more: whoever posts after that
        // sees the flag and rings. Not needed while another thread polls:
        // it will, before it sleeps itself.
        shared.sleepers.fetch_add(1, Ordering::SeqCst);
        // While a caller polls for its tasks it takes their results itself:
        // our peers need not ring us for each.
        let caller_helps = shared.caller_helps();
        if !shared.spinning.load(Ordering::SeqCst) {
            arm_doorbells(shared, !caller_helps);
        }
        if shared.closing() || pass(shared, !caller_helps, Scan::Try(&shared.closing)) {
            shared.sleepers.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        #[cfg(test)]
        super::test_hooks::preempt();
        // Say we would sleep with no deadline before we look at the
        // WRITEs in flight: a post that makes them more than none then
        // sees us and kicks (both sequentially consistent).
        shared.untimed_sleepers.fetch_add(1, Ordering::SeqCst);
        let timeout = (shared.writes_in_flight.load(Ordering::SeqCst) > 0
            || shared.served().iter().any(|s| !s.verified()))
        .then(|| tick(shared));
        if timeout.is_some() {
            shared.untimed_sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        events.clear();
        poll.wait(timeout, &mut events);
        if timeout.is_none() {
            shared.untimed_sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        shared.sleepers.fetch_sub(1, Ordering::SeqCst);
        handle(shared, &events);
    }
}

/// Tells every peer that a thread of ours sleeps: the next post (and, with
/// `results`, the next completion of our WRITEs) rings our eventfd.
fn arm_doorbells(shared: &Shared, results: bool) {
    for s in shared.served().iter() {
        s.ring.sleep(Side::Target);
    }
    if results {
        for l in shared.links().iter() {
            l.link.ring.sleep(Side::Initiator);
        }
    }
}

/// How soon work comes after one thread found none: an average of the
/// gaps, from the moment a round found nothing to the next round that
/// found something (polling or asleep in between).
struct Gaps {
    average: Duration,
    idle_since: Option<Instant>,
}

impl Gaps {
    fn new(start: Duration) -> Gaps {
        Gaps {
            average: start,
            idle_since: None,
        }
    }

    /// A round found nothing (the gap begins, unless it has).
    fn idle(&mut self) {
        self.idle_since.get_or_insert_with(Instant::now);
    }

    /// A round found work: the gap ends.
    fn work(&mut self) {
        if let Some(since) = self.idle_since.take() {
            self.average = (self.average * 7 + since.elapsed()) / 8;
        }
    }
}

/// Polls for work for a while before the thread sleeps, unless another
/// thread of the transport is polling already (one is enough to pick work
/// up at once, and more would take the cores the copies need), or a
/// caller polling for its tasks does these rounds itself
/// ([`super::ShmTransport::help`]). Only when work has come, on average,
/// within `MC_SHM_SPIN_US` of this thread running out of it, and then for
/// about twice that average: a thread that gets a stream of requests picks
/// each up at once, and one that gets a request now and then (one of many
/// peers of an initiator, on a host with fewer cores than processes) does
/// not burn a core after each. Returns whether work was found.
fn spin(shared: &Shared, gaps: &Gaps) -> bool {
    let most = shared.opts.spin;
    if most.is_zero() || gaps.average > most || shared.caller_helps() {
        return false;
    }
    let budget = (gaps.average * 2).clamp(Duration::from_micros(5), most);
    if shared.spinning.swap(true, Ordering::AcqRel) {
        return false;
    }
    let start = Instant::now();
    let mut found = false;
    let mut polls = 0u32;
    while !shared.closing() {
        if pass(shared, true, Scan::Try(&shared.closing)) {
            found = true;
            break;
        }
        polls = polls.wrapping_add(1);
        if polls % 16 == 0 && start.elapsed() >= budget {
            break;
        }
        std::hint::spin_loop();
    }
    shared.spinning.store(false, Ordering::Release);
    found
}

/// One round over every source of work; whether any was found. `results`:
/// take the results of our WRITEs too (a thread leaves them to a caller
/// that polls for its tasks, see [`Shared::caller_helps`]). `scan`: a
/// thread of the transport first brings its indexes of peers' tables up
/// to date where they changed; a caller's thread never scans one (a round
/// it does stays short however large or hostile a peer's table is).
pub(crate) fn pass(shared: &Shared, results: bool, scan: Scan<'_>) -> bool {
    let mut found = false;
    let (served, links) = (shared.served(), shared.links());
    if let Scan::Try(_) = scan {
        served.iter().for_each(|s| s.refresh(scan));
        links.iter().for_each(|l| l.link.refresh(scan));
    }
    let jobs = shared.reads.take(BATCH, BATCH_BYTES);
    if !jobs.is_empty() {
        if !shared.reads.is_empty() {
            shared.kick();
        }
        // READs only handed back for a newer index are no progress.
        found |= peer::run_reads(shared, jobs, scan);
    }
    for s in served.iter() {
        found |= serve::serve_one(shared, s, scan);
    }
    if results {
        for l in links.iter() {
            found |= l.core.reap(shared, &l.link);
        }
    }
    if shared.draining_links.load(Ordering::SeqCst) > 0 {
        peer::drain(shared, None);
    }
    found
}

/// Acts on what woke the thread: drains eventfds, drops the rings of
/// initiators that exited, fails what is in flight to targets that did.
fn handle(shared: &Shared, events: &[Token]) {
    for &t in events {
        match t {
            // Left readable at shutdown, so that every thread wakes.
            Token::Kick if shared.closing() => {}
            Token::Kick => {
                sys::drain(&shared.kick);
                shared.kicked.store(false, Ordering::SeqCst);
            }
            // A peer posted, completed, or unregistered a buffer (the next
            // pass brings our index of its table up to date).
            Token::Bell(id) => {
                if let Some(s) = shared.served().iter().find(|s| s.id == id) {
                    sys::drain(&s.to_target);
                } else if let Some(l) = shared.links().iter().find(|l| l.core.id == id) {
                    sys::drain(&l.link.to_initiator);
                }
            }
            Token::Death(id) => {
                if let Some(s) = shared.served().iter().find(|s| s.id == id) {
                    tracing::debug!("shm: process {} exited; its ring is dropped", s.initiator);
                    serve::drop_ring(shared, s);
                } else if let Some(l) = shared.links().iter().find(|l| l.core.id == id) {
                    l.core.target_died(shared);
                }
            }
        }
    }
}

/// Fails the WRITEs to targets that completed nothing for
/// `MC_SHM_TIMEOUT_SEC`; one thread per tick does it.
fn check_stalls(shared: &Shared) {
    let now_ms = shared.now_ms();
    let next = shared.next_stall_check.load(Ordering::Relaxed);
    if now_ms < next
        || shared
            .next_stall_check
            .compare_exchange(
                next,
                now_ms + tick(shared).as_millis() as u64,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
    {
        return;
    }
    let now = Instant::now();
    for l in shared.links().iter() {
        l.core.check_stall(shared, now);
    }
    serve::drop_unactivated(shared);
}
