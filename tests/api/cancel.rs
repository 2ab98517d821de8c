//! Cancelling batches (`Engine::cancel_batch`, the C ABI's
//! `te_cancel_batch`): bad handles get -1 and a reason; a batch that ended
//! is left as it is; a local copy of 64 MiB stops within its bound and
//! writes nothing afterwards; against a hand-written Mooncake server, a
//! WRITE it never acknowledges holds the cancel PENDING (the server may
//! still store its bytes) while a READ it never answers ends at once; and
//! 1,000 cancels racing completions, frees and the engine's destruction
//! from other threads leave every task ended (this test also runs under
//! AddressSanitizer, `scripts/suites/asan.sh`).

use crate::common;

use common::*;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};
use transfer_engine::{BatchState, CancelOutcome, LOCAL_SEGMENT_ID, Opcode, Request, TaskStatus};

const BASE: u64 = 0x4000_0000;
const LEN: u64 = 1 << 20;
/// Requests from here on are taken and never answered.
const HUNG: u64 = BASE + LEN / 2;

unsafe extern "C" {
    fn te_cancel_batch(engine: *mut c_void, batch_id: u64, timeout_ms: u64) -> c_int;
    fn te_last_error(buf: *mut c_char, len: usize) -> usize;
}

/// The text of this thread's last error.
fn last_error() -> String {
    let mut buf = vec![0 as c_char; 256];
    // SAFETY: `buf` holds 256 bytes.
    unsafe { te_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: te_last_error NUL-terminated it.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn bad_handles_get_minus_one_and_a_reason() {
    // SAFETY: a NULL engine is an invalid argument, not UB.
    let rc = unsafe { te_cancel_batch(std::ptr::null_mut(), 1, 10) };
    assert_eq!(rc, -1);
    assert!(last_error().contains("te_cancel_batch"), "{}", last_error());
    let e = engine();
    assert!(e.cancel_batch(0xdead_beef, Duration::ZERO).is_err());
    let b = e.allocate_batch(1).unwrap();
    e.free_batch(b).unwrap();
    assert!(
        e.cancel_batch(b, Duration::ZERO).is_err(),
        "a freed batch is unknown"
    );
    // An empty batch has nothing to wait for.
    let b = e.allocate_batch(4).unwrap();
    assert_eq!(
        e.cancel_batch(b, Duration::ZERO).unwrap(),
        CancelOutcome::Done
    );
    e.free_batch(b).unwrap();
    e.shutdown();
}

#[test]
fn a_batch_that_ended_keeps_its_statuses() {
    let e = engine();
    let src = Buf::new(LEN as usize, 1);
    let dst = Buf::zeroed(LEN as usize);
    register(&e, &src, false);
    register(&e, &dst, true);
    let b = e.allocate_batch(2).unwrap();
    let reqs = [
        write_req(src.addr(), LOCAL_SEGMENT_ID, dst.addr(), LEN),
        write_req(src.addr(), LOCAL_SEGMENT_ID, 8, LEN),
    ];
    e.submit(b, &reqs).unwrap();
    while e.batch_state(b, 2).unwrap() == BatchState::Waiting {
        thread::yield_now();
    }
    assert_eq!(
        e.cancel_batch(b, Duration::ZERO).unwrap(),
        CancelOutcome::Done
    );
    assert_eq!(e.status(b, 0).unwrap().0, TaskStatus::Completed);
    assert_eq!(e.status(b, 1).unwrap().0, TaskStatus::Failed);
    assert_eq!(dst.snapshot(), src.snapshot());
    e.free_batch(b).unwrap();
    e.shutdown();
}

#[test]
fn a_local_copy_cancelled_writes_nothing_afterwards() {
    const BIG: usize = 64 << 20;
    let e = engine();
    let src = Mapping::filled(BIG, 0x5A);
    let dst = Mapping::filled(BIG, 0);
    register_range(&e, src.addr(), BIG as u64, false);
    register_range(&e, dst.addr(), BIG as u64, true);
    let mut canceled = 0;
    for round in 0..20u32 {
        dst.fill(0);
        let b = e.allocate_batch(1).unwrap();
        e.submit(
            b,
            &[write_req(
                src.addr(),
                LOCAL_SEGMENT_ID,
                dst.addr(),
                BIG as u64,
            )],
        )
        .unwrap();
        thread::sleep(Duration::from_micros(u64::from(round) * 500));
        assert_eq!(
            e.cancel_batch(b, Duration::from_secs(10)).unwrap(),
            CancelOutcome::Done
        );
        let status = e.status(b, 0).unwrap().0;
        assert!(
            matches!(status, TaskStatus::Canceled | TaskStatus::Completed),
            "{status:?}"
        );
        canceled += usize::from(status == TaskStatus::Canceled);
        e.free_batch(b).unwrap();
        // The destination as the cancel left it, then reused.
        dst.fill(0xEE);
        thread::sleep(Duration::from_millis(20));
        assert!(dst.all(0xEE), "a copy wrote after the cancel returned");
    }
    assert!(canceled > 0, "every copy ended before its cancel");
    e.shutdown();
}

#[test]
fn an_unacknowledged_write_holds_the_cancel_and_an_unanswered_read_does_not() {
    let (_server, hs) = hanging_peer(BASE, LEN, HUNG);
    let e = engine();
    let buf = Buf::new(64 << 10, 9);
    register(&e, &buf, false);
    let seg = e.open_segment(&hs.name()).expect("open");
    // A READ the server never answers: its answer would land in our
    // buffer, so it ends at once, and nothing is written when it comes.
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[read_req(buf.addr(), seg, HUNG, 64 << 10)])
        .unwrap();
    thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    assert_eq!(
        e.cancel_batch(b, Duration::from_secs(5)).unwrap(),
        CancelOutcome::Done
    );
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(e.status(b, 0).unwrap().0, TaskStatus::Canceled);
    e.free_batch(b).unwrap();
    // A WRITE the server took and never acknowledged: the server may
    // still store it, so the cancel waits, and says so at its bound.
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[write_req(buf.addr(), seg, HUNG, 64 << 10)])
        .unwrap();
    thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    assert_eq!(
        e.cancel_batch(b, Duration::from_millis(200)).unwrap(),
        CancelOutcome::Pending
    );
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert_eq!(e.status(b, 0).unwrap().0, TaskStatus::Waiting);
    assert!(e.free_batch(b).is_err(), "a pending batch cannot be freed");
    // Requests to the same peer that are answered go on meanwhile.
    let ok = run_within(
        &e,
        &[write_req(buf.addr(), seg, BASE, 64 << 10)],
        Duration::from_secs(20),
    );
    assert_eq!(ok, vec![TaskStatus::Completed]);
    e.shutdown();
}

#[test]
fn a_thousand_cancels_race_completions_frees_and_destroy() {
    const BATCHES: usize = 1000;
    const TASKS: usize = 4;
    const PIECE: u64 = 64 << 10;
    let target = engine();
    let remote = Buf::zeroed((TASKS as u64 * PIECE) as usize);
    register(&target, &remote, true);
    let me = engine();
    let seg = me.open_segment(target.local_name()).expect("open");
    let local = Buf::new((2 * TASKS as u64 * PIECE) as usize, 5);
    register(&me, &local, true);
    let (remote_at, local_at) = (remote.addr(), local.addr());
    let requests = move |i: usize| -> Vec<Request> {
        (0..TASKS as u64)
            .map(|k| {
                let (opcode, target_id, target_offset) = match (i + k as usize) % 3 {
                    0 => (Opcode::Write, seg, remote_at + k * PIECE),
                    1 => (Opcode::Read, seg, remote_at + k * PIECE),
                    _ => (
                        Opcode::Write,
                        LOCAL_SEGMENT_ID,
                        local_at + (TASKS as u64 + k) * PIECE,
                    ),
                };
                Request {
                    opcode,
                    source: local_at + k * PIECE,
                    target_id,
                    target_offset,
                    length: PIECE,
                }
            })
            .collect()
    };
    let (to_cancel, cancels) = mpsc::channel::<u64>();
    let (to_free, frees) = mpsc::channel::<u64>();
    let submitter = {
        let me = me.clone();
        thread::spawn(move || {
            let mut submitted = Vec::new();
            for i in 0..BATCHES {
                let Ok(b) = me.allocate_batch(TASKS) else {
                    break;
                };
                if me.submit(b, &requests(i)).is_err() {
                    break;
                }
                submitted.push(b);
                let _ = to_cancel.send(b);
                let _ = to_free.send(b);
            }
            submitted
        })
    };
    let cancelled = Arc::new(AtomicUsize::new(0));
    let canceller = {
        let (me, cancelled) = (me.clone(), cancelled.clone());
        thread::spawn(move || {
            let (mut done, mut pending) = (0, 0);
            for b in cancels {
                cancelled.fetch_add(1, Ordering::Relaxed);
                match me.cancel_batch(b, Duration::from_secs(10)) {
                    Ok(CancelOutcome::Done) => done += 1,
                    Ok(CancelOutcome::Pending) => pending += 1,
                    // Freed by the other thread first, or destroyed.
                    Err(_) => {}
                }
            }
            (done, pending)
        })
    };
    let freer = {
        let me = me.clone();
        thread::spawn(move || {
            let mut freed = 0;
            for b in frees {
                while matches!(me.batch_state(b, TASKS), Ok(BatchState::Waiting)) {
                    thread::yield_now();
                }
                freed += usize::from(me.free_batch(b).is_ok());
            }
            freed
        })
    };
    // The engine is destroyed while batches are still submitted, cancelled
    // and freed.
    while cancelled.load(Ordering::Relaxed) < BATCHES / 2 {
        thread::yield_now();
    }
    me.shutdown();
    let submitted = submitter.join().expect("submitter");
    let (done, pending) = canceller.join().expect("canceller");
    let freed = freer.join().expect("freer");
    for &b in &submitted {
        if let Ok(state) = me.batch_state(b, TASKS) {
            assert_ne!(state, BatchState::Waiting, "batch {b:#x} never ended");
        }
    }
    println!(
        "{} batches submitted: {done} cancels DONE, {pending} PENDING, {freed} freed",
        submitted.len()
    );
    assert_eq!(pending, 0, "nothing holds a slice of a running peer");
    assert!(!submitted.is_empty());
    target.shutdown();
}
