//! No call but opening a segment and destroying the engine waits on a
//! peer: with the target process stopped (SIGSTOP: its kernel still
//! accepts connections, nobody answers), `getTransferStatus` on a completed
//! batch with a notification returns at once (the notification goes out
//! from the background and arrives once the peer runs again), a submit to
//! memory the cached descriptor does not list returns at once and its task
//! waits (then completes with the right bytes once the peer answers the
//! refetch), and destroying an engine whose background refetch waits on
//! the stopped peer returns at once. The target is this test binary run
//! as a child with `TE_WAIT_CHILD=1`, driven over its stdin and stdout.

use crate::common;

use common::child::ChildTarget;
use common::*;
use std::time::{Duration, Instant};
use transfer_engine::Engine;
use transfer_engine::TaskStatus;

const CHILD_VAR: &str = "TE_WAIT_CHILD";
const LEN: usize = 4096;
/// Far below the 60 s a handshake reply is waited for, and the 5 s a
/// refetch or notification could take before the fix at the very least.
const QUICK: Duration = Duration::from_secs(2);

/// The target, in the child: one buffer registered at start; on `REGISTER`
/// a second one; notifications received are printed as `NOTIFY name msg`.
fn child() {
    let e = engine();
    let first = Buf::zeroed(LEN);
    register(&e, &first, true);
    let second = Buf::zeroed(LEN);
    println!("READY {} {}", e.local_name(), first.addr());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    loop {
        for (name, msg) in e.take_notifies() {
            println!("NOTIFY {name} {msg}");
        }
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(cmd) if cmd == "REGISTER" => {
                register(&e, &second, true);
                println!("REGISTERED {}", second.addr());
            }
            Ok(cmd) if cmd == "DUMP" => println!("DUMP {:?}", second.snapshot()),
            Ok(_) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// The target of test `test`, in a child process.
fn start_target(test: &str) -> ChildTarget {
    ChildTarget::start(module_path!(), test, CHILD_VAR)
}

fn is_child() -> bool {
    std::env::var_os(CHILD_VAR).is_some()
}

/// Runs `f`, asserting that it returns within [`QUICK`].
fn quick<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    assert!(
        t.elapsed() < QUICK,
        "{what} took {:?} with the peer stopped",
        t.elapsed()
    );
    out
}

#[test]
fn polling_a_batch_with_a_notification_does_not_wait_on_a_stopped_peer() {
    if is_child() {
        return child();
    }
    let mut target =
        start_target("polling_a_batch_with_a_notification_does_not_wait_on_a_stopped_peer");
    let e = engine();
    let src = Buf::new(LEN, 7);
    let seg = e.open_segment(&target.name).expect("open the target");
    let b = e.allocate_batch(1).expect("batch");
    e.submit_with_notify(
        b,
        &[write_req(src.addr(), seg, target.first, LEN as u64)],
        "done".into(),
        "batch-1".into(),
    )
    .expect("submit");
    // Long enough for a 4 KiB WRITE on loopback; the first poll comes
    // after the stop, so it is the one that finds the batch complete.
    std::thread::sleep(Duration::from_secs(2));
    target.signal(libc::SIGSTOP);
    let (status, bytes) = quick("getTransferStatus", || e.status(b, 0).expect("status"));
    assert_eq!(
        (status, bytes),
        (TaskStatus::Completed, LEN as u64),
        "the WRITE did not complete within 2 s"
    );
    std::thread::sleep(Duration::from_secs(1));
    target.signal(libc::SIGCONT);
    let got = target.line("NOTIFY ");
    assert_eq!(got, "done batch-1");
    e.free_batch(b).expect("free");
    e.shutdown();
}

#[test]
fn a_submit_to_memory_registered_later_does_not_wait_on_a_stopped_peer() {
    if is_child() {
        return child();
    }
    let mut target =
        start_target("a_submit_to_memory_registered_later_does_not_wait_on_a_stopped_peer");
    let e = engine();
    let seg = e.open_segment(&target.name).expect("open the target");
    target.send("REGISTER");
    let second: u64 = target.line("REGISTERED ").parse().unwrap();
    target.signal(libc::SIGSTOP);
    let src = Buf::new(LEN, 9);
    let b = e.allocate_batch(1).expect("batch");
    quick("submitTransfer", || {
        e.submit(b, &[write_req(src.addr(), seg, second, LEN as u64)])
            .expect("submit")
    });
    let (status, _) = quick("getTransferStatus", || e.status(b, 0).expect("status"));
    assert_eq!(status, TaskStatus::Waiting);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(e.status(b, 0).unwrap().0, TaskStatus::Waiting);
    target.signal(libc::SIGCONT);
    assert_eq!(
        wait_task(&e, b, 0, Duration::from_secs(60)),
        TaskStatus::Completed
    );
    e.free_batch(b).expect("free");
    target.send("DUMP");
    let dump = target.line("DUMP ");
    assert_eq!(dump, format!("{:?}", src.snapshot()), "bytes in the target");
    e.shutdown();
}

#[test]
fn destroy_does_not_wait_out_a_refetch_from_a_stopped_peer() {
    if is_child() {
        return child();
    }
    let mut target = start_target("destroy_does_not_wait_out_a_refetch_from_a_stopped_peer");
    let e: std::sync::Arc<Engine> = engine();
    let seg = e.open_segment(&target.name).expect("open the target");
    target.send("REGISTER");
    let second: u64 = target.line("REGISTERED ").parse().unwrap();
    target.signal(libc::SIGSTOP);
    let src = Buf::new(LEN, 3);
    let b = e.allocate_batch(1).expect("batch");
    quick("submitTransfer", || {
        e.submit(b, &[write_req(src.addr(), seg, second, LEN as u64)])
            .expect("submit")
    });
    // The refetch is under way: connected, waiting for the reply.
    std::thread::sleep(Duration::from_millis(500));
    quick("destroy", || e.shutdown());
}

#[test]
fn a_notification_queued_at_destroy_is_still_sent() {
    if is_child() {
        return;
    }
    let (a, b) = (engine(), engine());
    let dst = Buf::zeroed(LEN);
    register(&b, &dst, true);
    let src = Buf::new(LEN, 5);
    let seg = a.open_segment(b.local_name()).expect("open b");
    // Twenty batches in flight; each notification is queued when its
    // batch is seen complete, and they go out one at a time (one peer).
    let batches: Vec<u64> = (0..20)
        .map(|round| {
            let batch = a.allocate_batch(1).expect("batch");
            a.submit_with_notify(
                batch,
                &[write_req(src.addr(), seg, dst.addr(), LEN as u64)],
                "bye".into(),
                format!("round-{round}"),
            )
            .expect("submit");
            batch
        })
        .collect();
    for &batch in &batches {
        assert_eq!(
            wait_task(&a, batch, 0, Duration::from_secs(30)),
            TaskStatus::Completed
        );
        a.free_batch(batch).expect("free");
    }
    // Destroyed right after the last completion was seen: the queued
    // notifications still go out.
    a.shutdown();
    let mut got = Vec::new();
    wait_for("20 notifications", Duration::from_secs(10), || {
        got.extend(b.take_notifies());
        got.len() >= 20
    });
    let want: Vec<(String, String)> = (0..20)
        .map(|r| ("bye".to_string(), format!("round-{r}")))
        .collect();
    assert_eq!(got, want, "every notification, in order");
    b.shutdown();
}
