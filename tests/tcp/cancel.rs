//! Cancelling transfers over TCP between two engines of this process: a
//! 64 MiB WRITE and a 64 MiB READ cancelled at random points, 20 rounds
//! each; once the cancel returns DONE the caller reuses its buffer at
//! once, and not one byte lands afterwards (at the target for a WRITE, in
//! the local buffer for a READ). Cancelling one batch leaves another to
//! the same peer running to completion.

use crate::common;

use common::{Mapping, Rng, engine, read_req, register_range, wait_task, write_req};
use std::time::{Duration, Instant};
use transfer_engine::{CancelOutcome, Engine, Opcode, TaskStatus};

const LEN: usize = 64 << 20;
const ROUNDS: usize = 20;
/// Bound of each cancel: a running peer answers far sooner.
const BOUND: Duration = Duration::from_secs(10);
/// How long the test watches for bytes landing after a cancel returned.
const WATCH: Duration = Duration::from_millis(100);

fn submit(e: &Engine, req: transfer_engine::Request) -> u64 {
    let b = e.allocate_batch(1).expect("batch");
    e.submit(b, &[req]).expect("submit");
    b
}

/// The p-th percentile of `v` (sorted here).
fn percentile(v: &mut [Duration], p: usize) -> Duration {
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)]
}

/// 20 rounds of `opcode`: submit 64 MiB, cancel after a random delay
/// within about the time a whole transfer takes, refill the local buffer
/// at once, and check that nothing landed after the cancel.
fn rounds(opcode: Opcode) {
    let target = engine();
    let remote = Mapping::filled(LEN, 0x11);
    register_range(&target, remote.addr(), LEN as u64, true);
    let me = engine();
    let seg = me.open_segment(target.local_name()).expect("open");
    let local = Mapping::filled(LEN, 0x5A);
    register_range(&me, local.addr(), LEN as u64, false);
    let req = || match opcode {
        Opcode::Write => write_req(local.addr(), seg, remote.addr(), LEN as u64),
        Opcode::Read => read_req(local.addr(), seg, remote.addr(), LEN as u64),
    };
    // One whole transfer sets the range of the random delays.
    let start = Instant::now();
    let b = submit(&me, req());
    assert_eq!(
        wait_task(&me, b, 0, Duration::from_secs(120)),
        TaskStatus::Completed
    );
    me.free_batch(b).expect("free");
    let whole = start.elapsed();
    let mut rng = Rng::new(0xCA7C_E110 ^ opcode as u64);
    let mut latencies = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..ROUNDS {
        match opcode {
            Opcode::Write => {
                remote.fill(0x11);
                local.fill(0x5A);
            }
            Opcode::Read => {
                remote.fill(0x5A);
                local.fill(0x11);
            }
        }
        let b = submit(&me, req());
        let delay = whole.mul_f64((rng.next() % 1000) as f64 / 1000.0);
        std::thread::sleep(delay);
        let t = Instant::now();
        let outcome = me.cancel_batch(b, BOUND).expect("cancel");
        latencies.push(t.elapsed());
        assert_eq!(outcome, CancelOutcome::Done, "a running peer holds nothing");
        // Reused at once: what the engine still moved would show.
        local.fill(0xEE);
        let (status, _) = me.status(b, 0).expect("status");
        assert!(
            matches!(status, TaskStatus::Canceled | TaskStatus::Completed),
            "{status:?}"
        );
        statuses.push(status);
        me.free_batch(b).expect("a cancelled batch can be freed");
        let seen = remote_snapshot(&remote);
        std::thread::sleep(WATCH);
        match opcode {
            Opcode::Write => {
                assert_eq!(
                    remote_snapshot(&remote),
                    seen,
                    "the target changed after the cancel returned"
                );
                // SAFETY: within the target's mapping, which nothing
                // writes any more.
                let bytes = unsafe { std::slice::from_raw_parts(remote.addr, LEN) };
                assert!(
                    !bytes.contains(&0xEE),
                    "bytes read after the cancel reached the target"
                );
            }
            Opcode::Read => assert!(
                local.all(0xEE),
                "a READ wrote the local buffer after the cancel returned"
            ),
        }
    }
    let canceled = statuses
        .iter()
        .filter(|s| **s == TaskStatus::Canceled)
        .count();
    let p50 = percentile(&mut latencies, 50);
    let p99 = percentile(&mut latencies, 99);
    println!(
        "{opcode:?} over TCP: {canceled} of {ROUNDS} cancelled mid-transfer (a whole \
         transfer: {whole:?}); cancel took p50 {p50:?}, p99 {p99:?}"
    );
    assert!(canceled > 0, "every transfer ended before its cancel");
    me.shutdown();
    target.shutdown();
}

/// A digest of the target's bytes.
fn remote_snapshot(m: &Mapping) -> u64 {
    // SAFETY: within the mapping, which is page-aligned and a multiple of
    // 8 bytes long; writers may still be at work, which is what the
    // comparison of two digests finds.
    let words = unsafe { std::slice::from_raw_parts(m.addr as *const u64, m.len / 8) };
    words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
        (h ^ w).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn a_write_cancelled_at_random_points_moves_no_byte_afterwards() {
    rounds(Opcode::Write);
}

#[test]
fn a_read_cancelled_at_random_points_writes_no_byte_afterwards() {
    rounds(Opcode::Read);
}

#[test]
fn cancelling_one_batch_leaves_another_to_the_same_peer_running() {
    let target = engine();
    let remote = Mapping::filled(2 * LEN, 0);
    register_range(&target, remote.addr(), 2 * LEN as u64, true);
    let me = engine();
    let seg = me.open_segment(target.local_name()).expect("open");
    let a = Mapping::filled(LEN, 0xA1);
    let b = Mapping::filled(LEN, 0xB2);
    register_range(&me, a.addr(), LEN as u64, false);
    register_range(&me, b.addr(), LEN as u64, false);
    let kept = submit(
        &me,
        write_req(b.addr(), seg, remote.addr() + LEN as u64, LEN as u64),
    );
    let dropped = submit(&me, write_req(a.addr(), seg, remote.addr(), LEN as u64));
    assert_eq!(
        me.cancel_batch(dropped, BOUND).expect("cancel"),
        CancelOutcome::Done
    );
    assert_eq!(
        wait_task(&me, kept, 0, Duration::from_secs(120)),
        TaskStatus::Completed
    );
    // SAFETY: within the target's mapping; the WRITEs have ended.
    let second = unsafe { std::slice::from_raw_parts(remote.addr.add(LEN), LEN) };
    assert!(second.iter().all(|&x| x == 0xB2), "the other batch was cut");
    me.free_batch(kept).expect("free");
    me.free_batch(dropped).expect("free");
    me.shutdown();
    target.shutdown();
}
