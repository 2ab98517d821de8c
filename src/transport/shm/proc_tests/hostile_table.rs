//! A hostile process of the same user and its registration table: every
//! slot left mid-update forever, the high-water mark at the end, the epoch
//! bumped every 50 µs (so that peers scan it again and again), or a table
//! far larger than a peer may publish. A target that serves it, or an
//! initiator that READs from it, still serves every other peer at once; a
//! caller's round of the transport's work (what `getTransferStatus` does)
//! stays under a millisecond of its thread's time; shutdown is prompt; and
//! a table larger than `MC_SHM_PEER_TABLE_SLOTS` is refused at attach and
//! never read.

use super::buf::Buf;
use super::harness::*;
use crate::engine::config::Config;
use crate::transport::Outcome;
use crate::transport::shm::ShmOptions;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SLICE: u64 = 65536;
/// The caller's bound: one round of the transport's work on its thread.
const ROUND: Duration = Duration::from_millis(1);

/// CPU time the calling thread has used (what a round costs it, whatever
/// else the host runs meanwhile).
fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// What a polling caller saw: rounds done, and the longest one in its
/// thread's CPU time and in wall time.
#[derive(Debug, Default)]
struct Rounds {
    calls: u64,
    most_cpu: Duration,
    most_wall: Duration,
}

/// Does rounds of the transport's work on this thread, as a caller polling
/// its tasks does, until `stop`.
fn poll_rounds(local: &Local, stop: &AtomicBool) -> Rounds {
    let mut r = Rounds::default();
    while !stop.load(Ordering::SeqCst) {
        let (c0, w0) = (thread_cpu(), Instant::now());
        local.shm.help();
        r.most_wall = r.most_wall.max(w0.elapsed());
        r.most_cpu = r.most_cpu.max(thread_cpu().saturating_sub(c0));
        r.calls += 1;
    }
    r
}

/// Resident memory of this process.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Has `child` attach to `local` and WRITE one byte into `dst` from a
/// fresh buffer of its own (from its memfd allocator if `shared`); returns
/// that buffer, filled with pattern `seed`, and the outcome.
fn attach_writer(child: &Child, local: &Local, dst: u64, seed: u8, shared: bool) -> (u64, Value) {
    let ok = child.call(
        json!({"cmd": "connect", "shm": local.shm.descriptor()}),
        None,
    );
    assert_eq!(ok["ok"], json!(true));
    let src = child.alloc_in(4 << 20, Some(seed), true, shared);
    let r = child.call(
        json!({"cmd": "run", "slices": [[src, dst, 1, true]]}),
        Some(local),
    );
    (src, r["outcomes"][0].clone())
}

fn local_with_bound(peer_table_slots: usize) -> Local {
    let mut opts = ShmOptions::from_config(&Config::from_env().expect("the MC_* settings").shm);
    opts.peer_table_slots = opts.peer_table_slots.max(peer_table_slots);
    Local::with(opts)
}

/// A hostile initiator with a table of `slots` slots, all torn, its epoch
/// churning, streams WRITEs into us (the target) while an honest initiator
/// writes 8 verified batches and a caller of ours polls: the honest
/// batches take well under a second each (they took about 10 s when each
/// scan retried every torn slot 10,000 times), every round of the caller
/// stays under a millisecond of CPU, the hostile WRITEs still complete (by
/// cross-memory attach), and shutdown is prompt (77.6 s at 262,144 slots
/// before; now each scan stops after its time budget or at shutdown).
fn torn_initiator_table(test: &str, slots: usize) {
    let local = local_with_bound(slots);
    let len = 8u64 << 20;
    let dst = Buf::zeroed(len as usize);
    local.register(dst.addr(), len, true);
    let slots_env = slots.to_string();
    let hostile = Child::spawn(test, &[("MC_SHM_TABLE_SLOTS", &slots_env)], &[]);
    let honest = Child::spawn(test, &[], &[]);
    let (h_src, first) = attach_writer(&hostile, &local, dst.addr(), 1, true);
    assert_eq!(first, json!("Done"));
    let (src, first) = attach_writer(&honest, &local, dst.addr() + (4 << 20), 2, false);
    assert_eq!(first, json!("Done"));
    hostile.call(
        json!({"cmd": "tear_table", "from": 0, "to": slots, "hwm": slots}),
        None,
    );
    hostile.call(json!({"cmd": "churn_table", "on": true}), None);
    hostile.call(
        json!({"cmd": "stream", "local": h_src, "remote": dst.addr(), "len": SLICE,
               "write": true, "depth": 32}),
        None,
    );
    let stop = AtomicBool::new(false);
    let batch = json!(slices(src, dst.addr() + (4 << 20), 4 << 20, SLICE, true));
    let (rounds, slowest) = std::thread::scope(|sc| {
        let poller = sc.spawn(|| poll_rounds(&local, &stop));
        let mut slowest = Duration::ZERO;
        for _ in 0..8 {
            let t = Instant::now();
            honest.run_expecting(batch.clone(), &local, "Done");
            slowest = slowest.max(t.elapsed());
        }
        stop.store(true, Ordering::SeqCst);
        (poller.join().unwrap(), slowest)
    });
    let counts = hostile.call(json!({"cmd": "stop_stream"}), None);
    // SAFETY: our buffer; the honest WRITEs into it have ended.
    let (bad, at) = unsafe { mismatches(dst.addr() + (4 << 20), 4 << 20, 2, 0) };
    let t = Instant::now();
    local.shm.shutdown();
    let shutdown = t.elapsed();
    println!(
        "a torn table of {slots} slots, churning: honest 4 MiB batches took at most \
         {slowest:?}; {} caller rounds, the longest {:?} CPU ({:?} wall); the hostile \
         stream {counts}; shutdown {shutdown:?}",
        rounds.calls, rounds.most_cpu, rounds.most_wall
    );
    assert_eq!(bad, 0, "first bad byte at {at:?}");
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
    assert!(rounds.calls > 0);
    assert!(rounds.most_cpu < ROUND, "{rounds:?}");
    assert!(
        counts["Done"].as_u64().unwrap_or(0) > 0,
        "the hostile WRITEs still complete: {counts}"
    );
    assert!(shutdown < Duration::from_secs(2), "{shutdown:?}");
    hostile.kill();
    honest.exit();
}

two_process_tests!(torn_initiator_table {
    a_torn_churning_initiator_table_holds_no_thread_of_the_target(1 << 16),
    a_torn_initiator_table_of_a_million_slots_is_read_within_its_budget(1 << 20),
});

#[test]
fn a_torn_target_table_keeps_its_intact_buffer_and_sends_the_rest_elsewhere() {
    let test = two_process_test!(
        "a_torn_target_table_keeps_its_intact_buffer_and_sends_the_rest_elsewhere"
    );
    let local = Local::start();
    let child = Child::spawn(test, &[], &[]);
    let len = 4u64 << 20;
    let c_src = child.alloc(len, Some(5), true);
    let peer = child.peer_of(&local);
    let back = Buf::zeroed(len as usize);
    assert_eq!(
        local.run(&peer, &[(back.addr(), c_src, SLICE, false)]),
        vec![Outcome::Done]
    );
    // Every slot but the buffer's own (slot 0) torn, the epoch churning.
    let slots = 1 << 16;
    child.call(
        json!({"cmd": "tear_table", "from": 1, "to": slots, "hwm": slots}),
        None,
    );
    child.call(json!({"cmd": "churn_table", "on": true}), None);
    let stop = AtomicBool::new(false);
    let reads = slices(back.addr(), c_src, len, SLICE, false);
    let beyond = (back.addr(), c_src + (64 << 20), SLICE, false);
    let (rounds, outcomes, outside, took) = std::thread::scope(|sc| {
        let poller = sc.spawn(|| poll_rounds(&local, &stop));
        let t = Instant::now();
        let outcomes = local.run(&peer, &reads);
        let outside = local.run(&peer, &[beyond]);
        let took = t.elapsed();
        stop.store(true, Ordering::SeqCst);
        (poller.join().unwrap(), outcomes, outside, took)
    });
    println!(
        "READs from a torn, churning table: {:?} and {outside:?} in {took:?}; {} caller \
         rounds, the longest {:?} CPU ({:?} wall)",
        tally(&outcomes),
        rounds.calls,
        rounds.most_cpu,
        rounds.most_wall
    );
    assert!(outcomes.iter().all(|o| *o == Outcome::Done), "{outcomes:?}");
    // SAFETY: our buffer; its READs have ended.
    let (bad, at) = unsafe { mismatches(back.addr(), len, 5, 0) };
    assert_eq!(bad, 0, "first bad byte at {at:?}");
    assert_eq!(outside, vec![Outcome::Unreachable], "not found: elsewhere");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(rounds.most_cpu < ROUND, "{rounds:?}");
    child.call(json!({"cmd": "churn_table", "on": false}), None);
    let t = Instant::now();
    local.shm.shutdown();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    child.exit();
}

#[test]
fn a_table_larger_than_the_bound_is_refused_both_ways_and_costs_no_memory() {
    let test =
        two_process_test!("a_table_larger_than_the_bound_is_refused_both_ways_and_costs_no_memory");
    let local = Local::start();
    let dst = Buf::zeroed(1 << 20);
    local.register(dst.addr(), 1 << 20, true);
    // A 16M-slot (1 GiB) table, claimed used to the end, never written.
    let slots = 1usize << 24;
    let child = Child::spawn(test, &[("MC_SHM_TABLE_SLOTS", &slots.to_string())], &[]);
    child.call(
        json!({"cmd": "tear_table", "from": 0, "to": 0, "hwm": slots}),
        None,
    );
    let before = rss();
    // The child WRITEs to us: its table is refused, the WRITE goes elsewhere.
    let (_, first) = attach_writer(&child, &local, dst.addr(), 3, false);
    assert_eq!(first, json!("Unreachable"));
    // We READ from it: refused at attach likewise.
    let c_src = child.alloc(1 << 20, Some(4), true);
    let peer = child.peer_of(&local);
    let back = Buf::zeroed(1 << 20);
    assert_eq!(
        local.run(&peer, &[(back.addr(), c_src, SLICE, false)]),
        vec![Outcome::Unreachable]
    );
    let grew = rss().saturating_sub(before);
    println!("a declared 1 GiB table: refused both ways; our memory grew {grew} bytes");
    assert!(grew < 32 << 20, "{grew} bytes");
    assert_eq!(local.shm.served_peers(), 0);
    local.shm.shutdown();
    child.exit();
}
