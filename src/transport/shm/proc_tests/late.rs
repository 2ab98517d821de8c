//! No byte of a slice moves once it has ended. A WRITE reported failed is
//! never copied afterwards, whatever the target was doing when it stopped
//! answering: stopped (SIGSTOP) in the middle of a 64 MiB transfer, or
//! holding a claimed WRITE before its copy for longer than
//! `MC_SHM_TIMEOUT_SEC`. The initiator then refills its source, as a
//! caller that saw FAILED and reused its buffer does; once the target runs
//! again, not one byte of the new pattern may reach it, and a newer WRITE
//! to the same place must stay. READs, which the initiator executes, are
//! checked the same way from the other side.

use super::buf::Buf;
use super::harness::*;
use crate::engine::config::Config;
use crate::transport::Outcome;
use crate::transport::shm::{ShmOptions, ShmPeer};
use serde_json::json;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

/// The initiator's stall timeout in these tests.
const TIMEOUT: Duration = Duration::from_millis(300);
/// Bytes moved per round of the stopped-target test.
const LEN: u64 = 64 << 20;

/// Rounds per case: 3 (`TE_SHM_LATE_ROUNDS` changes it; 20 take about
/// five minutes on two cores, in a debug build).
fn rounds() -> u64 {
    std::env::var("TE_SHM_LATE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

fn local() -> Local {
    local_with(TIMEOUT)
}

/// An initiator whose stall timeout is `timeout`.
fn local_with(timeout: Duration) -> Local {
    Local::with(ShmOptions {
        timeout,
        ..ShmOptions::from_config(&Config::from_env().expect("the MC_* settings").shm)
    })
}

/// Waits until the child's copies have settled: its served byte count
/// stays the same for 100 ms.
fn settle(child: &Child) {
    let served = || child.call(json!({"cmd": "stats"}), None)["served"].clone();
    let mut last = served();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = served();
        if now == last {
            return;
        }
        last = now;
    }
}

/// What one round of the stopped-target test saw.
#[derive(Debug, Default)]
struct Tally {
    failed_rounds: u64,
    completed_rounds: u64,
    /// Rounds whose slices did not all end while the target was stopped
    /// (it was copying one; they ended once it resumed).
    waited_rounds: u64,
}

/// What the rounds of one case move: `LEN` bytes in slices of `slice`
/// between our `mine` and the child's `theirs`.
struct Case<'a> {
    local: &'a Local,
    child: &'a Child,
    peer: &'a ShmPeer,
    mine: u64,
    theirs: u64,
    slice: u64,
    write: bool,
}

/// One round of `case` with the patterns `old` (moved) and `new` (written
/// into our buffer once the transfer failed): the child is stopped as soon
/// as the first slice completes, and resumed once every slice has ended
/// or, if one is still being copied, after three timeouts.
fn stopped_round(case: &Case<'_>, old: u8, new: u8, tally: &mut Tally) {
    let Case {
        local,
        child,
        peer,
        mine,
        theirs,
        slice,
        write,
    } = *case;
    child.call(
        json!({"cmd": "fill", "addr": theirs, "len": LEN, "value": 0}),
        None,
    );
    if write {
        // SAFETY: our buffer, idle between rounds.
        unsafe { fill(mine, LEN, old, 0) };
    } else {
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(mine as *mut u8, 0, LEN as usize) };
        // The child's bytes are the old pattern.
        child.call(
            json!({"cmd": "fill_pattern", "addr": theirs, "len": LEN, "seed": old}),
            None,
        );
    }
    let (tx, rx) = channel();
    let n = LEN / slice;
    let before = local.shm.stats();
    for k in 0..n {
        let tx = tx.clone();
        local.post(
            peer,
            (mine + k * slice, theirs + k * slice, slice, write),
            move |o| {
                let _ = tx.send(o);
            },
        );
    }
    // Stop the target mid-copy: right after the first slice completed.
    let start = Instant::now();
    loop {
        let s = local.shm.stats();
        if s.written + s.read > before.written + before.read {
            break;
        }
        assert!(start.elapsed() < HANG, "nothing moves");
        std::hint::spin_loop();
    }
    child.stop();
    let mut outcomes = Vec::new();
    let mut stopped = true;
    while outcomes.len() < n as usize {
        let wait = if stopped { 2 * TIMEOUT + TIMEOUT } else { HANG };
        match rx.recv_timeout(wait) {
            Ok(o) => outcomes.push(o),
            Err(_) if stopped => {
                // A slice the target is copying is waited for.
                tally.waited_rounds += 1;
                child.signal(libc::SIGCONT);
                stopped = false;
            }
            Err(e) => panic!("a slice never ended: {e}"),
        }
    }
    let failed = outcomes.iter().any(|o| *o != Outcome::Done);
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Done | Outcome::Failed { hard: false })),
        "{:?}",
        tally_outcomes(&outcomes)
    );
    if failed {
        tally.failed_rounds += 1;
        // The caller saw FAILED and reuses its buffer.
        // SAFETY: every slice using it has ended.
        unsafe { fill(mine, LEN, new, 0) };
    } else {
        tally.completed_rounds += 1;
    }
    if stopped {
        child.signal(libc::SIGCONT);
    }
    settle(child);
    if write {
        let late = child.call(
            json!({"cmd": "count_late", "addr": theirs, "len": LEN, "old": old, "new": new}),
            None,
        );
        assert_eq!(
            late["late"],
            json!(0),
            "bytes written into our source after the WRITE ended reached the target"
        );
        if !failed {
            let c = child.check(theirs, LEN, old, 0);
            assert_eq!(c["bad"], json!(0), "a completed WRITE's bytes");
        }
    } else if failed {
        // SAFETY: our buffer; every READ into it has ended.
        let (bad, first) = unsafe { mismatches(mine, LEN, new, 0) };
        assert_eq!(
            bad, 0,
            "a READ wrote into our buffer after it ended ({first:?})"
        );
    } else {
        // SAFETY: as above.
        let (bad, first) = unsafe { mismatches(mine, LEN, old, 0) };
        assert_eq!(bad, 0, "a completed READ's bytes ({first:?})");
    }
}

fn tally_outcomes(o: &[Outcome]) -> std::collections::HashMap<String, usize> {
    tally(o)
}

/// The stopped-target test for one kind of buffers on both sides
/// (`shared`: the transports' memfd buffers, else heap memory).
fn stopped_target(test: &str, shared: bool) {
    let local = local();
    let child = Child::spawn(test, &[], &[]);
    let mut keep = Vec::new();
    let mine = local.buffer(LEN, shared, &mut keep);
    local.register(mine, LEN, true);
    let theirs = child.alloc_in(LEN, None, true, shared);
    let peer = child.peer_of(&local);
    for write in [true, false] {
        for slice in [64 << 10, 1 << 20] {
            let mut t = Tally::default();
            let case = Case {
                local: &local,
                child: &child,
                peer: &peer,
                mine,
                theirs,
                slice,
                write,
            };
            // At least `rounds()` rounds; a WRITE case goes on (up to ten
            // times as many) until one stop came mid-copy, which a loaded
            // host makes rarer (the target finishes before its SIGSTOP).
            let mut r = 0;
            while r < rounds() || (write && t.failed_rounds == 0 && r < 10 * rounds()) {
                let old = (2 * r % 250 + 1) as u8;
                stopped_round(&case, old, old + 1, &mut t);
                r += 1;
            }
            println!(
                "{} {} KiB slices, {} buffers: {t:?}",
                if write { "WRITE" } else { "READ" },
                slice >> 10,
                if shared { "memfd" } else { "heap" }
            );
            if write {
                assert!(
                    t.failed_rounds > 0,
                    "no round failed: the stop never came mid-copy ({t:?})"
                );
            }
        }
    }
    drop(peer);
    child.exit();
    local.shm.shutdown();
}

// The argument: whether the buffers are the transports' memfd ones.
two_process_tests!(stopped_target {
    a_write_failed_against_a_stopped_target_is_never_copied_afterwards_heap(false),
    a_write_failed_against_a_stopped_target_is_never_copied_afterwards_memfd(true),
});

/// One WRITE of `len` bytes from `src` to `dst`, waited for.
fn write(local: &Local, peer: &ShmPeer, src: u64, dst: u64, len: u64) -> Outcome {
    local.run(peer, &[(src, dst, len, true)])[0]
}

#[test]
fn a_claimed_write_held_past_the_timeout_is_never_copied_after_it_failed() {
    let test =
        two_process_test!("a_claimed_write_held_past_the_timeout_is_never_copied_after_it_failed");
    const N: u64 = 256 << 10;
    // The held WRITE's entry stays busy until its thread is released, so
    // the stall window of the newer WRITE runs from the withdrawal: a
    // whole second, not to take a loaded machine (the test suite on two
    // cores) for a stalled target.
    let local = local_with(Duration::from_secs(1));
    // Two threads in the target: one is held, the other serves the rest.
    let child = Child::spawn(test, &[("MC_SHM_THREADS", "2")], &[]);
    let dst = child.alloc(N, None, true);
    let a = Buf::zeroed(N as usize);
    let b = Buf::zeroed(N as usize);
    let peer = child.peer_of(&local);
    let mut late_rounds = 0;
    for reuse in [false, true] {
        for r in 0..rounds() {
            let (sa, sb, sc) = (
                (3 * r % 240 + 1) as u8,
                (3 * r % 240 + 2) as u8,
                (3 * r % 240 + 3) as u8,
            );
            // SAFETY: our buffers, idle between rounds.
            unsafe {
                fill(a.addr(), N, sa, 0);
                fill(b.addr(), N, sb, 0);
            }
            child.call(json!({"cmd": "hold", "n": 1}), None);
            let (tx, rx) = channel();
            local.post(&peer, (a.addr(), dst, N, true), move |o| {
                let _ = tx.send(o);
            });
            let start = Instant::now();
            while child.call(json!({"cmd": "held"}), None)["held"] != json!(1) {
                assert!(start.elapsed() < HANG, "the WRITE is never claimed");
                std::thread::sleep(Duration::from_millis(1));
            }
            // Held past the timeout: the WRITE fails (it was withdrawn).
            let o = rx.recv_timeout(HANG).expect("the held WRITE never ended");
            assert_eq!(o, Outcome::Failed { hard: false });
            if reuse {
                // SAFETY: the WRITE from it has ended.
                unsafe { fill(a.addr(), N, sc, 0) };
            }
            // A newer WRITE to the same place, as the retry on another
            // transport would make, is served by the other thread.
            assert_eq!(write(&local, &peer, b.addr(), dst, N), Outcome::Done);
            child.call(json!({"cmd": "release"}), None);
            while child.call(json!({"cmd": "held"}), None)["held"] != json!(0) {
                std::thread::sleep(Duration::from_millis(1));
            }
            settle(&child);
            let c = child.check(dst, N, sb, 0);
            if c["bad"] != json!(0) {
                late_rounds += 1;
            }
        }
    }
    assert_eq!(
        late_rounds, 0,
        "rounds in which a failed WRITE was copied after a newer one"
    );
    // The link still works.
    assert_eq!(write(&local, &peer, b.addr(), dst, N), Outcome::Done);
    drop(peer);
    child.exit();
    local.shm.shutdown();
}
