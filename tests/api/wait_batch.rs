//! Waiting for a whole batch (`Engine::wait_tasks`, behind the C ABI's
//! `te_wait_batch` and the Python package's synchronous calls): it returns
//! once every task has ended, says whether one failed, leaves every ended
//! task seen (the batch can be freed), and returns at its deadline, or as
//! soon as a task reports TIMEOUT, while a task still runs; a
//! [`Backoff`] between polls of several batches parks on a running one
//! for its nap, and no longer. Against a
//! hand-written Mooncake TCP server that serves the first half of its
//! memory, rejects requests to the third quarter and never answers
//! requests to the last.

use crate::common;

use common::*;
use std::thread;
use std::time::{Duration, Instant};
use transfer_engine::{Backoff, Error, TaskStatus, WaitOutcome};

const BASE: u64 = 0x3000_0000;
const LEN: u64 = 1 << 20;
/// Requests from here on are rejected (ADDR_REJECTED).
const REJECTED: u64 = BASE + LEN / 2;
/// Requests from here on are never answered.
const HUNG: u64 = BASE + 3 * LEN / 4;

/// A server with that policy, and its handshake responder.
fn peer() -> (FakeServer, HandshakeResponder) {
    let server = FakeServer::start(vec![0u8; LEN as usize], BASE, false, |s| {
        if s.header.addr >= HUNG {
            Action::Hang
        } else if s.header.addr >= REJECTED {
            Action::Reject
        } else {
            Action::Serve
        }
    });
    let port = server.port;
    let hs = HandshakeResponder::start(move |rpc| tcp_descriptor(rpc, port, 2, BASE, LEN));
    (server, hs)
}

#[test]
fn a_batch_wait_reports_completed_failed_and_leaves_the_batch_free_to_go() {
    let (server, hs) = peer();
    let e = engine();
    let src = Buf::new(256 << 10, 3);
    let seg = e.open_segment(&hs.name()).expect("open segment");

    // Every byte of 4 WRITEs of 64 KiB lands; the wait says COMPLETED and
    // each task reads COMPLETED after it.
    let b = e.allocate_batch(8).unwrap();
    let reqs: Vec<_> = (0..4u64)
        .map(|i| write_req(src.addr() + (i << 16), seg, BASE + (i << 16), 64 << 10))
        .collect();
    e.submit(b, &reqs).unwrap();
    assert_eq!(e.submitted_tasks(b).unwrap(), 4);
    let deadline = Instant::now() + Duration::from_secs(20);
    assert_eq!(
        e.wait_tasks(b, 4, deadline).unwrap(),
        WaitOutcome::Completed
    );
    for t in 0..4 {
        assert_eq!(e.status(b, t).unwrap(), (TaskStatus::Completed, 64 << 10));
    }
    assert_eq!(server.mem(BASE, 256 << 10), src.snapshot());
    e.free_batch(b).expect("every task was seen by the wait");

    // One rejected among completed ones: FAILED, and only that task failed.
    let b = e.allocate_batch(3).unwrap();
    e.submit(
        b,
        &[
            write_req(src.addr(), seg, BASE, 4096),
            write_req(src.addr(), seg, REJECTED, 4096),
            write_req(src.addr(), seg, BASE + 8192, 4096),
        ],
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    assert_eq!(e.wait_tasks(b, 3, deadline).unwrap(), WaitOutcome::Failed);
    let states: Vec<_> = (0..3).map(|t| e.status(b, t).unwrap().0).collect();
    assert_eq!(
        states,
        [
            TaskStatus::Completed,
            TaskStatus::Failed,
            TaskStatus::Completed
        ]
    );
    e.free_batch(b).expect("every task was seen by the wait");

    // Nothing submitted yet: nothing to wait for.
    let b = e.allocate_batch(1).unwrap();
    assert_eq!(e.submitted_tasks(b).unwrap(), 0);
    assert_eq!(
        e.wait_tasks(b, 0, Instant::now()).unwrap(),
        WaitOutcome::Completed
    );
    e.free_batch(b).unwrap();

    // A freed batch is an error, not a wait.
    let freed = e.wait_tasks(b, 1, Instant::now() + Duration::from_secs(5));
    assert!(matches!(freed, Err(Error::InvalidArgument(_))), "{freed:?}");
    assert!(matches!(
        e.submitted_tasks(b),
        Err(Error::InvalidArgument(_))
    ));
    e.shutdown();
}

#[test]
fn a_batch_wait_returns_at_its_deadline_while_a_task_still_runs() {
    let (_server, hs) = peer();
    let e = engine_with(&[("MC_TCP_STATUS_TIMEOUT_SEC", "30")]);
    let src = Buf::new(4096, 5);
    let seg = e.open_segment(&hs.name()).expect("open segment");
    let b = e.allocate_batch(2).unwrap();
    e.submit(
        b,
        &[
            write_req(src.addr(), seg, BASE, 4096),
            write_req(src.addr(), seg, HUNG, 4096),
        ],
    )
    .unwrap();
    let start = Instant::now();
    let outcome = e
        .wait_tasks(b, 2, start + Duration::from_millis(400))
        .unwrap();
    let took = start.elapsed();
    assert_eq!(outcome, WaitOutcome::TimedOut);
    assert!(
        took >= Duration::from_millis(400),
        "returned early: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "overslept: {took:?}");
    assert_eq!(e.status(b, 0).unwrap().0, TaskStatus::Completed);
    assert_eq!(e.status(b, 1).unwrap().0, TaskStatus::Waiting);
    assert_eq!(e.free_batch(b), Err(Error::BatchBusy), "a task still runs");
    e.shutdown();
}

#[test]
fn a_batch_wait_returns_when_a_task_reports_timeout() {
    let (_server, hs) = peer();
    let e = engine_with(&[
        ("MC_SLICE_TIMEOUT", "1"),
        ("MC_TCP_STATUS_TIMEOUT_SEC", "30"),
    ]);
    let src = Buf::new(4096, 7);
    let seg = e.open_segment(&hs.name()).expect("open segment");
    let b = e.allocate_batch(1).unwrap();
    // The slice timeout runs from the submit.
    let start = Instant::now();
    e.submit(b, &[write_req(src.addr(), seg, HUNG, 4096)])
        .unwrap();
    let outcome = e.wait_tasks(b, 1, start + Duration::from_secs(20)).unwrap();
    let took = start.elapsed();
    assert_eq!(outcome, WaitOutcome::TimedOut);
    assert!(
        took >= Duration::from_secs(1),
        "before MC_SLICE_TIMEOUT: {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "not at the TIMEOUT: {took:?}"
    );
    assert_eq!(e.status(b, 0).unwrap().0, TaskStatus::Timeout);
    e.shutdown();
}

#[test]
fn a_batch_wait_returns_at_the_first_tasks_timeout_not_the_last() {
    let (_server, hs) = peer();
    let e = engine_with(&[
        ("MC_SLICE_TIMEOUT", "1"),
        ("MC_TCP_STATUS_TIMEOUT_SEC", "30"),
    ]);
    let src = Buf::new(4096, 7);
    let seg = e.open_segment(&hs.name()).expect("open segment");
    let b = e.allocate_batch(2).unwrap();
    // Two tasks 0.8 s apart: the first reports TIMEOUT at 1 s, the second
    // at 1.8 s (where the wait used to return).
    let start = Instant::now();
    e.submit(b, &[write_req(src.addr(), seg, HUNG, 4096)])
        .unwrap();
    thread::sleep(Duration::from_millis(800));
    e.submit(b, &[write_req(src.addr(), seg, HUNG + 4096, 4096)])
        .unwrap();
    let outcome = e.wait_tasks(b, 2, start + Duration::from_secs(20)).unwrap();
    let took = start.elapsed();
    println!("two tasks 0.8 s apart: the wait returned {outcome:?} after {took:?}");
    assert_eq!(outcome, WaitOutcome::TimedOut);
    assert!(
        took >= Duration::from_secs(1),
        "before MC_SLICE_TIMEOUT: {took:?}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "not at the first TIMEOUT: {took:?}"
    );
    assert_eq!(e.status(b, 0).unwrap().0, TaskStatus::Timeout);
    e.shutdown();
}

#[test]
fn a_backoff_pause_parks_on_a_running_batch_for_its_nap_and_no_longer() {
    let (_server, hs) = peer();
    let e = engine_with(&[("MC_TCP_STATUS_TIMEOUT_SEC", "30")]);
    let src = Buf::new(4096, 9);
    let seg = e.open_segment(&hs.name()).expect("open segment");
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[write_req(src.addr(), seg, HUNG, 4096)])
        .unwrap();
    let backoff = Backoff::new();
    // Past the millisecond of yields, each pause naps 1 ms: parked on the
    // batch, whose task never ends; slept without one, or with a batch
    // the engine does not know.
    thread::sleep(Duration::from_millis(20));
    for on in [Some((b, 1)), None, Some((u64::MAX, 1))] {
        let start = Instant::now();
        for _ in 0..50 {
            backoff.pause(&e, on);
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(50),
            "{on:?}: 50 naps of 1 ms took {took:?}"
        );
        assert!(
            took < Duration::from_secs(5),
            "{on:?}: 50 naps of 1 ms took {took:?}"
        );
    }
    assert_eq!(e.status(b, 0).unwrap().0, TaskStatus::Waiting);
    e.shutdown();
}
