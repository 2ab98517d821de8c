//! `MC_TCP_PROTO=1` forces the legacy (v1) framing towards a peer whose
//! descriptor says `tcp_proto_version: 2` (Mooncake's
//! PooledLegacyInitiatorInteroperatesWithCurrentServer), given to the
//! engine in its `Config`.

use crate::common;

use common::*;
use std::time::Duration;
use transfer_engine::TaskStatus;

const BASE: u64 = 0x3000_0000;

#[test]
fn forced_v1_initiator_talks_to_a_current_server() {
    let server = FakeServer::start(vec![0u8; 1 << 20], BASE, false, |_| Action::Serve);
    let port = server.port;
    let hs = HandshakeResponder::start(|rpc| tcp_descriptor(rpc, port, 2, BASE, 1 << 20));
    let e = engine_with(&[("MC_TCP_PROTO", "1")]);
    let src = Buf::new(300_000, 2);
    let dst = Buf::zeroed(300_000);
    let seg = e.open_segment(&hs.name()).expect("open segment");
    let w = write_req(src.addr(), seg, BASE + 10, 300_000);
    assert_eq!(run(&e, &[w]), vec![TaskStatus::Completed]);
    // v1: COMPLETED once sent; the bytes land shortly after.
    wait_for("v1 WRITE stored", Duration::from_secs(20), || {
        server.mem(BASE + 10, 300_000) == src.snapshot()
    });
    let r = read_req(dst.addr(), seg, BASE + 10, 300_000);
    assert_eq!(run(&e, &[r]), vec![TaskStatus::Completed]);
    assert!(dst.snapshot() == src.snapshot());
    let seen = server.seen();
    assert!(seen.iter().any(|s| s.header.opcode == 1));
    assert!(seen.iter().any(|s| s.header.opcode == 0));
    assert!(
        seen.iter().all(|s| s.header.opcode & 0x80 == 0),
        "MC_TCP_PROTO=1 sends no 0x80 flag"
    );
    e.shutdown();
}
