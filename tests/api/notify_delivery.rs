//! Notifications of `submitTransferWithNotify` are delivered, or the
//! caller knows (`Engine::notify_status`, `te_notify_status`; the wait for
//! the batch reports FAILED): a peer that takes it makes it DELIVERED, once;
//! a peer killed after the data but before the notification makes it
//! FAILED once `MC_TE_NOTIFY_TIMEOUT_SEC` has passed (it was tried again
//! meanwhile), and a peer restarted on the same name in that time refuses
//! it (it is not the process the data went to) and receives nothing; a
//! stopped peer makes it FAILED within the window; a peer whose queue is
//! full refuses it and it FAILS, the queued ones kept. The peers that are
//! killed or stopped are this test binary run again with
//! `TE_NOTIFY_CHILD=1`.

use crate::common;

use common::child::ChildTarget;
use common::*;
use std::time::{Duration, Instant};
use transfer_engine::{Engine, NotifyStatus, WaitOutcome};

const CHILD_VAR: &str = "TE_NOTIFY_CHILD";
/// The name the child's engine takes (`127.0.0.1:PORT`).
const NAME_VAR: &str = "TE_NOTIFY_NAME";
const LEN: usize = 1 << 20;
/// `MC_TE_NOTIFY_TIMEOUT_SEC` of the initiators here.
const WINDOW: Duration = Duration::from_secs(2);

/// The child: an engine named by [`NAME_VAR`] with one buffer; `count`
/// on stdin prints `COUNT n`, the notifications it received so far, and
/// `landed SEED` prints `LANDED true` once the buffer holds the pattern of
/// `SEED` (a WRITE's data arrived).
fn child() {
    let name = std::env::var(NAME_VAR).expect("name");
    let e = Engine::new("P2PHANDSHAKE", &name, false).expect("engine");
    e.install_transport("tcp", None).expect("tcp");
    let buf = Buf::zeroed(LEN);
    register(&e, &buf, true);
    println!("READY {} {}", e.local_name(), buf.addr());
    let mut got = 0;
    for line in std::io::stdin().lines().map_while(Result::ok) {
        if line == "count" {
            got += e.take_notifies().len();
            println!("COUNT {got}");
        } else if let Some(seed) = line.strip_prefix("landed ") {
            let seed: u8 = seed.parse().expect("seed");
            println!("LANDED {}", buf.snapshot() == pattern(LEN, seed));
        }
    }
}

/// An initiator that retries a notification for [`WINDOW`].
fn initiator() -> std::sync::Arc<Engine> {
    engine_with(&[("MC_TE_NOTIFY_TIMEOUT_SEC", &WINDOW.as_secs().to_string())])
}

/// Submits a WRITE of `src` to `addr` of `seg` with a notification, as a
/// batch of one, without polling it (the notification goes once a caller
/// sees the batch end).
fn write_with_notify(e: &Engine, src: &Buf, seg: i32, addr: u64) -> u64 {
    let b = e.allocate_batch(1).expect("batch");
    e.submit_with_notify(
        b,
        &[write_req(src.addr(), seg, addr, LEN as u64)],
        "kv".into(),
        "blocks 1-16 ready".into(),
    )
    .expect("submit");
    b
}

/// Waits for the batch and returns the outcome and the notification's
/// status.
fn finish(e: &Engine, b: u64) -> (WaitOutcome, NotifyStatus, Duration) {
    let t = Instant::now();
    let outcome = e
        .wait_tasks(b, 1, Instant::now() + Duration::from_secs(60))
        .expect("wait");
    let status = e.notify_status(b).expect("status");
    (outcome, status, t.elapsed())
}

/// A free port of 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child whose engine binds the port of `name` (so a restarted one
/// answers to the same name).
fn start_child(test: &str, name: &str) -> ChildTarget {
    ChildTarget::start_with(
        module_path!(),
        test,
        CHILD_VAR,
        &[(NAME_VAR, name), ("MC_LEGACY_RPC_PORT_BINDING", "1")],
    )
}

fn count(c: &mut ChildTarget) -> usize {
    c.send("count");
    c.line("COUNT ").parse().unwrap()
}

/// Waits until the child holds the data of a WRITE from pattern `seed`
/// (the initiator is not polled meanwhile, so its notification waits).
fn landed(c: &mut ChildTarget, seed: u8) {
    wait_for("the data to land", Duration::from_secs(30), || {
        c.send(&format!("landed {seed}"));
        c.line("LANDED ") == "true"
    });
}

#[test]
fn a_notification_taken_by_its_peer_is_delivered_once() {
    let target = engine();
    let dst = Buf::zeroed(LEN);
    register(&target, &dst, true);
    let me = initiator();
    let src = Buf::new(LEN, 4);
    let seg = me.open_segment(target.local_name()).expect("open");
    let b = write_with_notify(&me, &src, seg, dst.addr());
    let (outcome, status, _) = finish(&me, b);
    assert_eq!(outcome, WaitOutcome::Completed);
    assert_eq!(status, NotifyStatus::Delivered);
    assert_eq!(dst.snapshot(), src.snapshot());
    assert_eq!(
        target.take_notifies(),
        vec![("kv".to_string(), "blocks 1-16 ready".to_string())]
    );
    // Asked again, it stays delivered and is not sent again.
    assert_eq!(me.notify_status(b).unwrap(), NotifyStatus::Delivered);
    std::thread::sleep(Duration::from_millis(100));
    assert!(target.take_notifies().is_empty());
    me.free_batch(b).unwrap();
    // A batch without one.
    let b = me.allocate_batch(1).unwrap();
    assert_eq!(me.notify_status(b).unwrap(), NotifyStatus::None);
    me.free_batch(b).unwrap();
    me.shutdown();
    target.shutdown();
}

#[test]
fn a_peer_killed_before_the_notification_fails_it_and_its_restart_gets_none() {
    const TEST: &str = "a_peer_killed_before_the_notification_fails_it_and_its_restart_gets_none";
    if std::env::var_os(CHILD_VAR).is_some() {
        return child();
    }
    let me = initiator();
    let src = Buf::new(LEN, 5);
    // Killed, and nobody on its port: tried again for the window, FAILED.
    let name = format!("127.0.0.1:{}", free_port());
    let mut first = start_child(TEST, &name);
    let seg = me.open_segment(&first.name).expect("open");
    let b = write_with_notify(&me, &src, seg, first.first);
    landed(&mut first, 5);
    first.signal(libc::SIGKILL);
    drop(first);
    let (outcome, status, took) = finish(&me, b);
    assert_eq!(outcome, WaitOutcome::Failed);
    let NotifyStatus::Failed(why) = status else {
        panic!("{status:?}");
    };
    assert!(why.contains("MC_TE_NOTIFY_TIMEOUT_SEC"), "{why}");
    assert!(
        took >= WINDOW / 2 && took < WINDOW + Duration::from_secs(2),
        "FAILED after {took:?}, the window is {WINDOW:?}"
    );
    me.free_batch(b).unwrap();
    // Killed and restarted on the same name before the notification: the
    // new process was not the one the data went to, and refuses it.
    let name = format!("127.0.0.1:{}", free_port());
    let mut old = start_child(TEST, &name);
    let seg = me.open_segment(&old.name).expect("open");
    let b = write_with_notify(&me, &src, seg, old.first);
    landed(&mut old, 5);
    old.signal(libc::SIGKILL);
    drop(old);
    let mut new = start_child(TEST, &name);
    let (outcome, status, _) = finish(&me, b);
    assert_eq!(outcome, WaitOutcome::Failed);
    let NotifyStatus::Failed(why) = status else {
        panic!("{status:?}");
    };
    assert!(why.contains("another incarnation"), "{why}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(count(&mut new), 0, "the restarted peer got a notification");
    me.free_batch(b).unwrap();
    me.shutdown();
}

#[test]
fn a_stopped_peer_fails_the_notification_within_the_window() {
    const TEST: &str = "a_stopped_peer_fails_the_notification_within_the_window";
    if std::env::var_os(CHILD_VAR).is_some() {
        return child();
    }
    let me = initiator();
    let src = Buf::new(LEN, 6);
    let mut peer = start_child(TEST, &format!("127.0.0.1:{}", free_port()));
    let seg = me.open_segment(&peer.name).expect("open");
    let b = write_with_notify(&me, &src, seg, peer.first);
    landed(&mut peer, 6);
    peer.signal(libc::SIGSTOP);
    let (outcome, status, took) = finish(&me, b);
    peer.signal(libc::SIGCONT);
    assert_eq!(outcome, WaitOutcome::Failed);
    assert!(matches!(status, NotifyStatus::Failed(_)), "{status:?}");
    assert!(
        took < WINDOW + Duration::from_secs(2),
        "FAILED after {took:?}, the window is {WINDOW:?}"
    );
    // It was sent once: the resumed peer may take that one, never two.
    assert!(count(&mut peer) <= 1);
    me.free_batch(b).unwrap();
    me.shutdown();
}

#[test]
fn a_full_queue_refuses_the_notification_and_keeps_the_queued_ones() {
    let target = engine_with(&[("MC_NOTIFY_QUEUE_MAX_COUNT", "1")]);
    let dst = Buf::zeroed(LEN);
    register(&target, &dst, true);
    let me = initiator();
    let src = Buf::new(LEN, 7);
    let seg = me.open_segment(target.local_name()).expect("open");
    let first = write_with_notify(&me, &src, seg, dst.addr());
    assert_eq!(finish(&me, first).1, NotifyStatus::Delivered);
    let second = write_with_notify(&me, &src, seg, dst.addr());
    let (outcome, status, took) = finish(&me, second);
    assert_eq!(outcome, WaitOutcome::Failed);
    let NotifyStatus::Failed(why) = status else {
        panic!("{status:?}");
    };
    assert!(why.contains("queue is full"), "{why}");
    assert!(took >= WINDOW / 2, "tried again for the window: {took:?}");
    assert_eq!(target.take_notifies().len(), 1, "the queued one is kept");
    // With room again, the next is delivered.
    let third = write_with_notify(&me, &src, seg, dst.addr());
    assert_eq!(finish(&me, third).1, NotifyStatus::Delivered);
    assert_eq!(target.take_notifies().len(), 1);
    for b in [first, second, third] {
        me.free_batch(b).unwrap();
    }
    me.shutdown();
    target.shutdown();
}
