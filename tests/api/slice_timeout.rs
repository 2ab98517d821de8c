//! `MC_SLICE_TIMEOUT`: a task still waiting that long after it was
//! submitted reports TIMEOUT, as Mooncake's `getTransferStatus` does; it is
//! not cancelled and not terminal (the batch cannot be freed yet), and it
//! ends FAILED when the transport gives up on it. Against a server that
//! accepts and reads but never answers, with a 1 s slice timeout and an 8 s
//! status timeout, given to the engine in its `Config`.

use crate::common;

use common::*;
use std::time::{Duration, Instant};
use transfer_engine::Error;
use transfer_engine::TaskStatus;

const BASE: u64 = 0x2000_0000;

#[test]
fn a_task_waiting_past_the_slice_timeout_reports_timeout_then_fails() {
    let server = FakeServer::start(vec![0u8; 1 << 20], BASE, false, |_| Action::Hang);
    let port = server.port;
    let hs = HandshakeResponder::start(|rpc| tcp_descriptor(rpc, port, 2, BASE, 1 << 20));
    let e = engine_with(&[
        ("MC_SLICE_TIMEOUT", "1"),
        ("MC_TCP_STATUS_TIMEOUT_SEC", "8"),
    ]);
    let src = Buf::new(4096, 1);
    let seg = e.open_segment(&hs.name()).expect("open segment");
    let b = e.allocate_batch(1).unwrap();
    let submitted = Instant::now();
    e.submit(b, &[write_req(src.addr(), seg, BASE, 4)]).unwrap();

    // WAITING until a poll after 1 s sees TIMEOUT (the server never
    // answers, so nothing else can end the wait before the status timeout).
    let first = loop {
        let (s, _) = e.status(b, 0).unwrap();
        if s != TaskStatus::Waiting {
            break s;
        }
        assert!(submitted.elapsed() < Duration::from_secs(20), "no TIMEOUT");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(first, TaskStatus::Timeout);
    assert!(
        submitted.elapsed() >= Duration::from_secs(1),
        "TIMEOUT before MC_SLICE_TIMEOUT passed"
    );
    assert_eq!(
        e.free_batch(b),
        Err(Error::BatchBusy),
        "a TIMEOUT task is not terminal"
    );
    // Not cancelled: the transport's own timeout still ends it, and until
    // then every poll says TIMEOUT.
    let last = loop {
        let (s, _) = e.status(b, 0).unwrap();
        if s != TaskStatus::Timeout {
            break s;
        }
        assert!(submitted.elapsed() < Duration::from_secs(90), "never ends");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(last, TaskStatus::Failed);
    e.free_batch(b).unwrap();
    e.shutdown();
}
