//! The initiator's own memory over TCP: a WRITE source or READ destination
//! that is unregistered mid-transfer is neither read nor written once
//! `unregister` returned (the lane sends and receives its payload inside
//! the buffer's fence), and one the caller unmapped (the caller's bug: the
//! kernel refuses it with EFAULT) fails with its reason instead of sending
//! the lane into a loop of reconnects (before: 4,649 connects in 5 s, the
//! task WAITING for over 60 s, valid WRITEs to the same peer timing out).

use crate::common;

use common::{Mapping, engine, read_req, register_range, wait_for, wait_task, write_req};
use std::time::{Duration, Instant};
use transfer_engine::{Engine, TaskStatus};

const BIG: usize = 256 << 20;
const SMALL: usize = 1 << 20;
/// Rounds to try for one in which the transfer was still running when the
/// unregister returned.
const ROUNDS: usize = 10;
/// Far below the minute the task stayed WAITING before.
const PROMPT: Duration = Duration::from_secs(10);

/// A target engine with a zeroed buffer of `len` bytes, and an initiator
/// that opened it.
fn pair(len: usize) -> (std::sync::Arc<Engine>, std::sync::Arc<Engine>, Mapping, i32) {
    let target = engine();
    let dst = Mapping::filled(len, 0);
    register_range(&target, dst.addr(), len as u64, true);
    let me = engine();
    let seg = me.open_segment(target.local_name()).expect("open");
    (target, me, dst, seg)
}

fn submit(e: &Engine, req: transfer_engine::Request) -> u64 {
    let b = e.allocate_batch(1).expect("batch");
    e.submit(b, &[req]).expect("submit");
    b
}

/// Whether any byte of `m` is `b`.
fn holds(m: &Mapping, b: u8) -> bool {
    // SAFETY: within our mapping, whose writers have ended.
    unsafe { std::slice::from_raw_parts(m.addr, m.len) }.contains(&b)
}

#[test]
fn a_write_source_unregistered_mid_transfer_is_not_read_afterwards() {
    let (target, me, dst, seg) = pair(BIG);
    let mut cut_short = false;
    for _ in 0..ROUNDS {
        dst.fill(0x11);
        let src = Mapping::filled(BIG, 0x5A);
        register_range(&me, src.addr(), BIG as u64, false);
        let b = submit(&me, write_req(src.addr(), seg, dst.addr(), BIG as u64));
        wait_for("the WRITE to begin", Duration::from_secs(30), || {
            // SAFETY: byte 0 of the target's mapping, written by the WRITE.
            unsafe { std::ptr::read_volatile(dst.addr) == 0x5A }
        });
        me.unregister(&[src.addr()]).expect("unregister");
        // What is read from here on is new memory: zeros, then 0xEE.
        src.remap(0xEE);
        let status = wait_task(&me, b, 0, Duration::from_secs(60));
        let why = me.failure_reason(b, 0).ok().flatten();
        me.free_batch(b).expect("free");
        assert!(
            !holds(&dst, 0xEE) && !holds(&dst, 0),
            "bytes read after unregister reached the peer"
        );
        if status == TaskStatus::Failed {
            println!("WRITE cut short by unregister: {why:?}");
            cut_short = true;
            break;
        }
    }
    assert!(
        cut_short,
        "the WRITE ended before unregister in every round"
    );
    me.shutdown();
    target.shutdown();
}

#[test]
fn a_read_destination_unregistered_mid_transfer_is_not_written_afterwards() {
    let target = engine();
    let src = Mapping::filled(BIG, 0x77);
    register_range(&target, src.addr(), BIG as u64, true);
    let me = engine();
    let seg = me.open_segment(target.local_name()).expect("open");
    let mut cut_short = false;
    for _ in 0..ROUNDS {
        let dst = Mapping::filled(BIG, 0);
        register_range(&me, dst.addr(), BIG as u64, false);
        let b = submit(&me, read_req(dst.addr(), seg, src.addr(), BIG as u64));
        wait_for("the READ to begin", Duration::from_secs(30), || {
            // SAFETY: byte 0 of our mapping, written by the READ.
            unsafe { std::ptr::read_volatile(dst.addr) == 0x77 }
        });
        me.unregister(&[dst.addr()]).expect("unregister");
        dst.replace();
        let status = wait_task(&me, b, 0, Duration::from_secs(60));
        me.free_batch(b).expect("free");
        assert!(
            !holds(&dst, 0x77),
            "the READ wrote after unregister returned"
        );
        if status == TaskStatus::Failed {
            cut_short = true;
            break;
        }
    }
    assert!(cut_short, "the READ ended before unregister in every round");
    me.shutdown();
    target.shutdown();
}

#[test]
fn a_write_from_memory_the_kernel_refuses_fails_and_the_peer_stays_usable() {
    let (target, me, dst, seg) = pair(BIG);
    let src = Mapping::filled(BIG, 0x42);
    let b = submit(&me, write_req(src.addr(), seg, dst.addr(), BIG as u64));
    // The caller's bug: its source becomes memory nobody may read (the
    // kernel answers EFAULT), while the WRITE runs.
    // SAFETY: MAP_FIXED over our own mapping, which nothing of ours reads
    // afterwards but the engine's system calls.
    let p = unsafe {
        libc::mmap(
            src.addr.cast(),
            BIG,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(p.cast::<u8>(), src.addr);
    let t = Instant::now();
    let status = wait_task(&me, b, 0, Duration::from_secs(120));
    let took = t.elapsed();
    let why = me.failure_reason(b, 0).ok().flatten();
    me.free_batch(b).expect("free");
    println!("a WRITE from refused memory ended {status:?} after {took:?}: {why:?}");
    assert_eq!(status, TaskStatus::Failed);
    assert!(took < PROMPT, "{took:?}");
    assert!(
        why.as_deref().is_some_and(|w| w.contains("local memory")),
        "{why:?}"
    );
    // A valid WRITE to the same peer goes through at once.
    let ok = Mapping::filled(SMALL, 0x24);
    let t = Instant::now();
    assert_eq!(
        common::run(&me, &[write_req(ok.addr(), seg, dst.addr(), SMALL as u64)]),
        vec![TaskStatus::Completed]
    );
    assert!(t.elapsed() < PROMPT);
    // SAFETY: within the target's mapping; the WRITE has completed.
    let landed = unsafe { std::slice::from_raw_parts(dst.addr, SMALL) };
    assert!(landed.iter().all(|&b| b == 0x24));
    me.shutdown();
    target.shutdown();
}
