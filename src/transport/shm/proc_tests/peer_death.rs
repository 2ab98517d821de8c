//! Peers that die or stop. `kill -9` of the target mid-batch: every slice
//! ends at once (the pidfd says so), later slices to it fail at once, and
//! another target still works. `kill -9` of the initiator mid-stream: the
//! target drops its ring at once and serves another initiator. A stopped
//! target (SIGSTOP): WRITEs fail after `MC_SHM_TIMEOUT_SEC` (plus a tick of
//! at most a second); READs, which we execute, still complete; once it
//! resumes, WRITEs complete again.

use super::buf::Buf;
use super::harness::*;
use crate::engine::config::Config;
use crate::transport::Outcome;
use crate::transport::shm::ShmOptions;
use serde_json::json;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

const SLICE: u64 = 65536;
/// Generous bound for "at once" on a loaded machine (measured: ms).
const AT_ONCE: Duration = Duration::from_secs(5);

#[test]
fn a_killed_target_fails_its_slices_at_once_and_another_still_works() {
    let test =
        two_process_test!("a_killed_target_fails_its_slices_at_once_and_another_still_works");
    let local = Local::start();
    let (doomed, survivor) = (Child::spawn(test, &[], &[]), Child::spawn(test, &[], &[]));
    let len = 64 << 20;
    let src = Buf::zeroed(len as usize);
    // SAFETY: a fresh buffer of ours.
    unsafe { fill(src.addr(), len, 3, 0) };
    let back = Buf::zeroed(len as usize);
    let d_dst = doomed.alloc(len, None, true);
    let d_src = doomed.alloc(len, Some(4), true);
    let peer = doomed.peer_of(&local);
    // Attach first (one slice), then a batch of 2 x 1024 slices.
    assert_eq!(
        local.run(&peer, &[(src.addr(), d_dst, 1, true)]),
        vec![Outcome::Done]
    );
    let (tx, rx) = channel();
    let n = len / SLICE;
    for k in 0..n {
        for write in [true, false] {
            let tx = tx.clone();
            let s = if write {
                (src.addr() + k * SLICE, d_dst + k * SLICE, SLICE, true)
            } else {
                (back.addr() + k * SLICE, d_src + k * SLICE, SLICE, false)
            };
            local.post(&peer, s, move |o| {
                let _ = tx.send((o, Instant::now()));
            });
        }
    }
    let start = Instant::now();
    while local.shm.stats().written + local.shm.stats().read == 1 {
        assert!(start.elapsed() < HANG, "nothing moves");
        std::hint::spin_loop();
    }
    let killed = Instant::now();
    doomed.kill();
    let mut outcomes = Vec::new();
    let mut last = killed;
    for _ in 0..2 * n {
        let (o, at) = rx
            .recv_timeout(HANG)
            .expect("a slice to the dead target never ended");
        outcomes.push(o);
        last = last.max(at);
    }
    let took = last.saturating_duration_since(killed);
    let t = tally(&outcomes);
    println!(
        "killed mid-batch: the last of {} slices ended {took:?} after the kill: {t:?}",
        2 * n
    );
    assert!(took < AT_ONCE, "slices ended {took:?} after the kill");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Done | Outcome::Failed { hard: true })),
        "{t:?}"
    );
    assert!(
        t.contains_key("Failed { hard: true }"),
        "the kill came after the batch: {t:?}"
    );
    // Later slices fail at once.
    let t0 = Instant::now();
    let later = local.run(
        &peer,
        &[
            (src.addr(), d_dst, SLICE, true),
            (back.addr(), d_src, SLICE, false),
        ],
    );
    assert_eq!(later, vec![Outcome::Failed { hard: true }; 2]);
    assert!(t0.elapsed() < AT_ONCE);
    // The survivor works.
    let s_dst = survivor.alloc(4 << 20, None, true);
    let other = survivor.peer_of(&local);
    let batch = slices(src.addr(), s_dst, 64 * SLICE, SLICE, true);
    assert!(
        local
            .run(&other, &batch)
            .iter()
            .all(|o| *o == Outcome::Done)
    );
    let c = survivor.check(s_dst, 4 << 20, 3, 0);
    assert_eq!(c["bad"], json!(0));
    survivor.exit();
    local.shm.shutdown();
}

#[test]
fn a_killed_initiator_loses_its_ring_at_once_and_another_is_served() {
    let test = two_process_test!("a_killed_initiator_loses_its_ring_at_once_and_another_is_served");
    let local = Local::start();
    let t = Buf::zeroed(4 << 20);
    local.register(t.addr(), 4 << 20, true);
    let attach = |c: &Child| {
        let ok = c.call(
            json!({"cmd": "connect", "shm": local.shm.descriptor()}),
            None,
        );
        assert_eq!(ok["ok"], json!(true));
        let src = c.alloc(4 << 20, Some(6), true);
        let r = c.call(
            json!({"cmd": "run", "slices": [[src, t.addr(), 1, true]]}),
            Some(&local),
        );
        assert_eq!(r["outcomes"], json!(["Done"]));
        src
    };
    let doomed = Child::spawn(test, &[], &[]);
    let src = attach(&doomed);
    doomed.call(
        json!({"cmd": "stream", "local": src, "remote": t.addr(), "len": SLICE,
               "write": true, "depth": 256}),
        None,
    );
    let before = local.shm.stats().served;
    let start = Instant::now();
    while local.shm.stats().served < before + (16 << 20) {
        assert!(start.elapsed() < HANG, "the stream does not run");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(local.shm.served_peers(), 1);
    let killed = Instant::now();
    doomed.kill();
    while local.shm.served_peers() != 0 {
        assert!(
            killed.elapsed() < AT_ONCE,
            "the dead initiator's ring stays"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    println!(
        "the dead initiator's ring was dropped {:?} after the kill",
        killed.elapsed()
    );
    let survivor = Child::spawn(test, &[], &[]);
    let src = attach(&survivor);
    let batch = slices(src, t.addr(), 64 * SLICE, SLICE, true);
    survivor.run_expecting(json!(batch), &local, "Done");
    // SAFETY: our buffer; the WRITEs into it have ended.
    let (bad, first) = unsafe { mismatches(t.addr(), 4 << 20, 6, 0) };
    assert_eq!(bad, 0, "first bad byte {first:?}");
    survivor.exit();
    local.shm.shutdown();
}

#[test]
fn a_stopped_target_fails_writes_after_the_timeout_and_works_when_resumed() {
    let test =
        two_process_test!("a_stopped_target_fails_writes_after_the_timeout_and_works_when_resumed");
    let timeout = Duration::from_secs(1);
    let local = Local::with(ShmOptions {
        timeout,
        ..ShmOptions::from_config(&Config::from_env().expect("the MC_* settings").shm)
    });
    let child = Child::spawn(test, &[], &[]);
    let dst = child.alloc(4 << 20, None, true);
    let c_src = child.alloc(4 << 20, Some(8), true);
    let src = Buf::zeroed(4 << 20);
    // SAFETY: a fresh buffer of ours.
    unsafe { fill(src.addr(), 4 << 20, 9, 0) };
    let back = Buf::zeroed(4 << 20);
    let peer = child.peer_of(&local);
    assert_eq!(
        local.run(&peer, &[(src.addr(), dst, 1, true)]),
        vec![Outcome::Done]
    );
    child.stop();
    let writes: Vec<_> = (0..64)
        .map(|k| (src.addr() + k * SLICE, dst + k * SLICE, SLICE, true))
        .collect();
    let t0 = Instant::now();
    let out = local.run(&peer, &writes);
    let took = t0.elapsed();
    println!("WRITEs to a stopped target failed after {took:?} (MC_SHM_TIMEOUT_SEC = {timeout:?})");
    assert!(
        out.iter().all(|o| *o == Outcome::Failed { hard: false }),
        "{:?}",
        tally(&out)
    );
    assert!(took >= timeout, "failed before the timeout: {took:?}");
    assert!(
        took < timeout + Duration::from_secs(1) + AT_ONCE,
        "{took:?}"
    );
    // READs are ours to execute: a stopped target is read all the same.
    let reads: Vec<_> = (0..64)
        .map(|k| (back.addr() + k * SLICE, c_src + k * SLICE, SLICE, false))
        .collect();
    assert!(local.run(&peer, &reads).iter().all(|o| *o == Outcome::Done));
    // SAFETY: our buffer; the READs have ended.
    assert_eq!(unsafe { mismatches(back.addr(), 4 << 20, 8, 0) }.0, 0);
    child.signal(libc::SIGCONT);
    let out = local.run(&peer, &writes);
    assert!(out.iter().all(|o| *o == Outcome::Done), "{:?}", tally(&out));
    let c = child.check(dst, 4 << 20, 9, 0);
    assert_eq!(c["bad"], json!(0));
    child.exit();
    local.shm.shutdown();
}
