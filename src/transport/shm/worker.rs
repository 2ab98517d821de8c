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
//! 3. One ring wakes every waiting thread, but the peer cleared the flag,
//!    so a later post would ring nobody while the woken thread is busy (a
//!    long copy) and the others still wait. So a thread that wakes while
//!    others still sleep sets the flags again: every post made while any
//!    thread waits in epoll finds a flag set, until the last sleeper woke.
//!
//! So a request posted while every thread sleeps wakes one, and one
//! posted while some thread is awake is seen by that thread's next scan
//! (step 2 covers a scan that is under way), or by a sleeper that step 3
//! makes the peer ring.

use super::poll::Token;
use super::ring::Side;
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
    while !shared.closing() {
        check_stalls(shared);
        if pass(shared) || spin(shared) {
            continue;
        }
        // Say we sleep, then look once more: whoever posts after that
        // sees the flag and rings.
        shared.sleepers.fetch_add(1, Ordering::SeqCst);
        arm_doorbells(shared);
        if shared.closing() || pass(shared) {
            shared.sleepers.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        #[cfg(test)]
        super::test_hooks::preempt();
        let timeout = (shared.writes_in_flight.load(Ordering::Relaxed) > 0
            || shared.served().iter().any(|s| !s.verified()))
        .then(|| tick(shared));
        events.clear();
        poll.wait(timeout, &mut events);
        if shared.sleepers.fetch_sub(1, Ordering::SeqCst) > 1 {
            // The peer that woke us cleared the flags; the threads still
            // asleep want the next post rung too, or it would wait for
            // whatever we are about to copy.
            arm_doorbells(shared);
        }
        handle(shared, &events);
    }
}

/// Tells every peer that a thread of ours sleeps: the next post or
/// completion rings our eventfd.
fn arm_doorbells(shared: &Shared) {
    for s in shared.served().iter() {
        s.ring.sleep(Side::Target);
    }
    for l in shared.links().iter() {
        if let Some(link) = l.link() {
            link.ring.sleep(Side::Initiator);
        }
    }
}

/// Polls for work for `MC_SHM_SPIN_US`, unless another thread of the
/// transport is polling already (one is enough to pick work up at once,
/// and more would take the cores the copies need). Returns whether work
/// was found.
fn spin(shared: &Shared) -> bool {
    if shared.opts.spin.is_zero() || shared.spinning.swap(true, Ordering::AcqRel) {
        return false;
    }
    let start = Instant::now();
    let mut found = false;
    let mut polls = 0u32;
    while !shared.closing() {
        if pass(shared) {
            found = true;
            break;
        }
        polls = polls.wrapping_add(1);
        if polls % 16 == 0 && start.elapsed() >= shared.opts.spin {
            break;
        }
        std::hint::spin_loop();
    }
    shared.spinning.store(false, Ordering::Release);
    found
}

/// One round over every source of work; whether any was found.
pub(crate) fn pass(shared: &Shared) -> bool {
    let mut found = false;
    let mut jobs = Vec::new();
    let mut bytes = 0u64;
    while jobs.len() < BATCH && bytes < BATCH_BYTES {
        match shared.reads_rx.try_recv() {
            Ok(j) => {
                bytes = bytes.saturating_add(j.slice.len);
                jobs.push(j);
            }
            Err(_) => break,
        }
    }
    if !jobs.is_empty() {
        found = true;
        if !shared.reads_rx.is_empty() {
            shared.kick();
        }
        peer::run_reads(shared, jobs);
    }
    for s in shared.served().iter() {
        found |= serve::serve_one(shared, s);
    }
    for l in shared.links().iter() {
        found |= l.reap(shared);
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
            // A peer posted, completed, or unregistered a buffer (drop our
            // mappings of those it no longer names).
            Token::Bell(id) => {
                if let Some(s) = shared.served().iter().find(|s| s.id == id) {
                    sys::drain(&s.to_target);
                    s.prune();
                } else if let Some(l) = shared.links().iter().find(|l| l.id == id) {
                    if let Some(link) = l.link() {
                        sys::drain(&link.to_initiator);
                        link.maps.prune(&link.table);
                    }
                }
            }
            Token::Death(id) => {
                if let Some(s) = shared.served().iter().find(|s| s.id == id) {
                    tracing::debug!("shm: process {} exited; its ring is dropped", s.initiator);
                    serve::drop_ring(shared, s);
                } else if let Some(l) = shared.links().iter().find(|l| l.id == id) {
                    l.target_died(shared);
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
        l.check_stall(shared, now);
    }
    serve::drop_unactivated(shared);
}
