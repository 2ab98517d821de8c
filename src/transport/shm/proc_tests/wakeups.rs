//! No request waits for a wakeup that never comes. Back-to-back 4 KiB
//! WRITEs, one at a time, to a target with four threads whose racy points
//! yield or sleep at random (`test_hooks::preempt`): every WRITE completes,
//! none in 500 ms or more (a lost wakeup waits for a periodic check, a
//! second here, or the stall timeout). Before the ring's cursor asked
//! its holder to scan again, a thread that found the cursor held went to
//! sleep as if the ring were idle, and the request waited out the timeout.
//!
//! And no attach request holds the target's resources longer than the
//! bound: 500 rings requested and never activated are released within
//! `MC_SHM_TIMEOUT_SEC`, while a real initiator is served throughout.

use super::buf::Buf;
use super::harness::*;
use crate::engine::config::Config;
use crate::transport::Outcome;
use crate::transport::shm::ShmOptions;
use serde_json::json;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

/// How long the stress runs: 20 s (`TE_SHM_STALL_SECS` changes it).
fn stress_time() -> Duration {
    let secs = std::env::var("TE_SHM_STALL_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    Duration::from_secs(secs)
}

#[test]
fn batch_one_writes_never_wait_for_a_lost_wakeup() {
    let test = two_process_test!("batch_one_writes_never_wait_for_a_lost_wakeup");
    const LEN: u64 = 4096;
    // A stall waits for the initiator's next tick (timeout / 4, at most a
    // second) or its timeout: both far above the bound of a slow request.
    let timeout = Duration::from_secs(8);
    let slow_bound = Duration::from_millis(500);
    let local = Local::with(ShmOptions {
        timeout,
        ..ShmOptions::from_config(&Config::from_env().expect("the MC_* settings").shm)
    });
    let child = Child::spawn(test, &[("MC_SHM_THREADS", "4")], &[]);
    let dst = child.alloc(LEN, None, true);
    let src = Buf::new(LEN as usize, 7);
    let peer = child.peer_of(&local);
    assert_eq!(
        local.run(&peer, &[(src.addr(), dst, LEN, true)]),
        vec![Outcome::Done]
    );
    child.call(json!({"cmd": "preempt", "on": true}), None);
    let (tx, rx) = channel();
    let start = Instant::now();
    let (mut n, mut worst, mut slow, mut failed) = (0u64, Duration::ZERO, 0u64, 0u64);
    while start.elapsed() < stress_time() {
        let t = Instant::now();
        let tx = tx.clone();
        local.post(&peer, (src.addr(), dst, LEN, true), move |o| {
            let _ = tx.send(o);
        });
        let o = rx.recv_timeout(HANG).expect("a WRITE never ended");
        let took = t.elapsed();
        worst = worst.max(took);
        n += 1;
        if o != Outcome::Done {
            failed += 1;
        }
        if took >= slow_bound {
            slow += 1;
        }
        if failed + slow > 0 {
            break;
        }
    }
    child.call(json!({"cmd": "preempt", "on": false}), None);
    println!("{n} WRITEs of 4 KiB, one at a time: the slowest took {worst:?}");
    assert_eq!(
        (failed, slow),
        (0, 0),
        "WRITEs that failed, or took {slow_bound:?} or more, after {n}"
    );
    drop(peer);
    child.exit();
    local.shm.shutdown();
}

/// Descriptors open in process `pid`.
fn fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the child's descriptors")
        .count()
}

#[test]
fn rings_never_activated_are_released_and_a_real_initiator_is_served() {
    let test =
        two_process_test!("rings_never_activated_are_released_and_a_real_initiator_is_served");
    const LEN: u64 = 65536;
    let local = Local::start();
    let child = Child::spawn(
        test,
        &[("MC_SHM_TIMEOUT_SEC", "1"), ("MC_SHM_MAX_PEERS", "256")],
        &[],
    );
    let dst = child.alloc(LEN, None, true);
    let src = Buf::new(LEN as usize, 5);
    let peer = child.peer_of(&local);
    let write = || local.run(&peer, &[(src.addr(), dst, LEN, true)]);
    assert_eq!(write(), vec![Outcome::Done]);
    let baseline = fds(child.pid());
    // Attach requests in our name that we never activate.
    let shm = child.descriptor();
    let request = json!({
        "version": shm["version"],
        "boot_id": shm["boot_id"],
        "pid": std::process::id(),
        "table_fd": 0,
        "table_nonce": 1,
    });
    let flood = Instant::now();
    for _ in 0..500 {
        let reply = child.call(json!({"cmd": "attach", "request": request}), None);
        assert!(reply["reply"].get("ring_fd").is_some(), "{reply}");
    }
    let peak = fds(child.pid());
    let rings = child.call(json!({"cmd": "stats"}), None)["served_peers"].clone();
    println!("after 500 attach requests: {peak} descriptors (baseline {baseline}), {rings} rings");
    assert!(rings.as_u64().unwrap() <= 256, "{rings} rings");
    // The real initiator is still served, at once.
    assert_eq!(write(), vec![Outcome::Done]);
    // The rings nobody activated go within the timeout (plus a tick).
    loop {
        let now = fds(child.pid());
        if now <= baseline {
            println!(
                "descriptors back to {now} {:?} after the flood",
                flood.elapsed()
            );
            break;
        }
        assert!(
            flood.elapsed() < Duration::from_secs(5),
            "{now} descriptors in the target, {baseline} before the flood"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(write(), vec![Outcome::Done]);
    let c = child.check(dst, LEN, 5, 0);
    assert_eq!(c["bad"], json!(0));
    drop(peer);
    child.exit();
    local.shm.shutdown();
}
