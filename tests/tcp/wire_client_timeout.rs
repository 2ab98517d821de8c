//! `MC_TCP_STATUS_TIMEOUT_SEC` bounds how long our initiator waits for a v2
//! status word: against a server that accepts and reads but never answers,
//! a WRITE and a READ FAIL within a bounded time (2 s, given to the
//! engine in its `Config`).

use crate::common;

use common::*;
use std::time::{Duration, Instant};
use transfer_engine::TaskStatus;

const BASE: u64 = 0x2000_0000;

#[test]
fn silent_v2_server_fails_requests_after_the_status_timeout() {
    let server = FakeServer::start(vec![0u8; 1 << 20], BASE, false, |_| Action::Hang);
    let port = server.port;
    let hs = HandshakeResponder::start(|rpc| tcp_descriptor(rpc, port, 2, BASE, 1 << 20));
    let e = engine_with(&[("MC_TCP_STATUS_TIMEOUT_SEC", "2")]);
    let src = Buf::new(4096, 1);
    let dst = Buf::zeroed(4096);
    let seg = e.open_segment(&hs.name()).expect("open segment");
    let t0 = Instant::now();
    let b = e.allocate_batch(2).unwrap();
    e.submit(
        b,
        &[
            write_req(src.addr(), seg, BASE, 4),
            read_req(dst.addr(), seg, BASE + 4096, 4),
        ],
    )
    .unwrap();
    for i in 0..2 {
        assert_eq!(
            wait_task(&e, b, i, Duration::from_secs(10)),
            TaskStatus::Failed,
            "task {i}"
        );
    }
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(10), "failed after {took:?}");
    assert!(server.accepted() >= 1 && !server.seen().is_empty());
    assert_eq!(dst.snapshot(), vec![0u8; 4096], "nothing was read");
    e.free_batch(b).unwrap();
    e.shutdown();
}
