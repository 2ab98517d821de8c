//! Our initiator against hand-written Mooncake peers: a handshake responder
//! that publishes a descriptor, and TCP data servers (legacy v1, current
//! v2, and broken ones) over a Vec mapped at a fake base address. The
//! server side decodes every header by hand and checks what arrives.

use crate::common;

use common::*;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use transfer_engine::TaskStatus;
use transfer_engine::{Engine, Request};

const BASE: u64 = 0x1000_0000;
const FAIL_WITHIN: Duration = Duration::from_secs(10);
use TaskStatus::{Completed, Failed};

/// A peer: a fake data server plus the responder that publishes it with a
/// descriptor advertising `advertised` bytes at BASE.
struct Peer {
    server: FakeServer,
    hs: HandshakeResponder,
}

impl Peer {
    fn start(
        real: usize,
        advertised: u64,
        version: Option<u32>,
        legacy: bool,
        policy: impl Fn(&Seen) -> Action + Send + Sync + 'static,
    ) -> Peer {
        let server = FakeServer::start(vec![0u8; real], BASE, legacy, policy);
        let data_port = server.port;
        let hs = HandshakeResponder::start(|rpc| {
            let mut d = tcp_descriptor(rpc, data_port, version.unwrap_or(1), BASE, advertised);
            if version.is_none() {
                d.as_object_mut().unwrap().remove("tcp_proto_version");
            }
            d
        });
        Peer { server, hs }
    }

    fn open(&self, e: &Engine) -> i32 {
        let seg = e.open_segment(&self.hs.name()).expect("open segment");
        assert!(seg > 0);
        // Our engine sent its own descriptor with the Metadata request.
        let reqs = self.hs.requests.lock().unwrap().clone();
        assert_eq!(reqs.len(), 1, "one descriptor fetch");
        assert_eq!(reqs[0]["protocol"], "tcp");
        assert_eq!(reqs[0]["name"], Value::from(e.local_name()));
        seg
    }
}

/// Writes `sizes` bytes from `src` at increasing offsets (with gaps) of the
/// peer, one batch; returns the (offset, len) pairs.
fn spread(sizes: &[usize]) -> Vec<(usize, usize)> {
    let mut off = 3;
    sizes
        .iter()
        .map(|&n| {
            let r = (off, n);
            off += n + 17;
            r
        })
        .collect()
}

fn writes(src: &Buf, seg: i32, at: &[(usize, usize)]) -> Vec<Request> {
    at.iter()
        .map(|&(o, n)| write_req(src.addr() + o as u64, seg, BASE + o as u64, n as u64))
        .collect()
}

fn reads(dst: &Buf, seg: i32, at: &[(usize, usize)]) -> Vec<Request> {
    at.iter()
        .map(|&(o, n)| read_req(dst.addr() + o as u64, seg, BASE + o as u64, n as u64))
        .collect()
}

fn all(n: usize, s: TaskStatus) -> Vec<TaskStatus> {
    vec![s; n]
}

/// Mooncake's legacy (v1) server: no status words. Our initiator must not
/// set 0x80 (the legacy server would misread it and closes instead).
#[test]
fn legacy_v1_server_write_then_read() {
    // Advertise 1 MiB, hold 768 KiB: requests beyond are rejected by the
    // server; the poisoned range at 640 KiB closes mid-transfer.
    let poison = BASE + (640 << 10);
    let peer = Peer::start(768 << 10, 1 << 20, Some(1), true, move |s| {
        if s.header.addr >= poison && s.header.addr < poison + (64 << 10) {
            Action::PartialThenClose(100)
        } else {
            Action::Serve
        }
    });
    let e = engine();
    let src = Buf::new(512 << 10, 5);
    let dst = Buf::zeroed(512 << 10);
    register(&e, &src, true);
    register(&e, &dst, true);
    let seg = peer.open(&e);

    let at = spread(&[1, 4095, 65536, 65537, 100_000, 3]);
    assert_eq!(run(&e, &writes(&src, seg, &at)), all(at.len(), Completed));
    // v1 COMPLETED means "sent", not "stored": wait for the bytes to land.
    for &(o, n) in &at {
        wait_for("v1 WRITE stored", Duration::from_secs(20), || {
            peer.server.mem(BASE + o as u64, n) == src.get(o, n)
        });
    }
    assert_eq!(run(&e, &reads(&dst, seg, &at)), all(at.len(), Completed));
    for &(o, n) in &at {
        assert_eq!(dst.get(o, n), src.get(o, n), "READ at {o}");
    }
    // Gaps were never written.
    assert_eq!(peer.server.mem(BASE, 3), vec![0u8; 3]);

    // A READ the server rejects (v1: it just closes) fails; the next
    // request reconnects and completes.
    let bad = read_req(dst.addr(), seg, BASE + (900 << 10), 64);
    assert_eq!(run_within(&e, &[bad], FAIL_WITHIN), vec![Failed]);
    // A READ cut short by the server closing fails.
    let cut = read_req(dst.addr(), seg, poison, 4096);
    assert_eq!(run_within(&e, &[cut], FAIL_WITHIN), vec![Failed]);
    let again = reads(&dst, seg, &at[4..5]);
    dst.set(at[4].0, &vec![0u8; at[4].1]);
    assert_eq!(run(&e, &again), vec![Completed]);
    assert_eq!(dst.get(at[4].0, at[4].1), src.get(at[4].0, at[4].1));

    let seen = peer.server.seen();
    assert!(seen.iter().any(|s| s.header.opcode == 1));
    assert!(seen.iter().any(|s| s.header.opcode == 0));
    for s in &seen {
        assert!(
            s.header.opcode == 0 || s.header.opcode == 1,
            "v1 peer got opcode {:#x}",
            s.header.opcode
        );
    }
    e.shutdown();
}

/// A descriptor without `tcp_proto_version` means v1 (spec §2.2).
#[test]
fn descriptor_without_version_means_v1() {
    let peer = Peer::start(1 << 20, 1 << 20, None, true, |_| Action::Serve);
    let e = engine();
    let src = Buf::new(200_000, 6);
    let dst = Buf::zeroed(200_000);
    let seg = peer.open(&e);
    let at = [(0usize, 200_000usize)];
    assert_eq!(run(&e, &writes(&src, seg, &at)), vec![Completed]);
    wait_for("v1 WRITE stored", Duration::from_secs(20), || {
        peer.server.mem(BASE, 200_000) == src.snapshot()
    });
    assert_eq!(run(&e, &reads(&dst, seg, &at)), vec![Completed]);
    assert!(dst.snapshot() == src.snapshot());
    assert!(
        peer.server
            .seen()
            .iter()
            .all(|s| s.header.opcode & 0x80 == 0)
    );
    e.shutdown();
}

/// The current (v2) server: every opcode carries 0x80, and a COMPLETED
/// WRITE is already stored at the peer (the ack follows the last byte).
#[test]
fn v2_server_write_then_read() {
    let peer = Peer::start(1 << 20, 1 << 20, Some(2), false, |_| Action::Serve);
    let e = engine();
    let src = Buf::new(1 << 20, 7);
    let dst = Buf::zeroed(1 << 20);
    register(&e, &src, true);
    let seg = peer.open(&e);
    let at = spread(&[1, 4095, 65536, 65537, 100_000, 81_920, 81_921, 300_000]);
    assert_eq!(run(&e, &writes(&src, seg, &at)), all(at.len(), Completed));
    for &(o, n) in &at {
        assert_eq!(
            peer.server.mem(BASE + o as u64, n),
            src.get(o, n),
            "COMPLETED v2 WRITE at {o} is visible at once"
        );
    }
    assert_eq!(run(&e, &reads(&dst, seg, &at)), all(at.len(), Completed));
    for &(o, n) in &at {
        assert_eq!(dst.get(o, n), src.get(o, n));
    }
    let seen = peer.server.seen();
    assert!(seen.iter().any(|s| s.header.opcode == 0x81));
    assert!(seen.iter().any(|s| s.header.opcode == 0x80));
    assert!(
        seen.iter()
            .all(|s| s.header.opcode == 0x81 || s.header.opcode == 0x80),
        "v2 opcodes carry 0x80"
    );
    e.shutdown();
}

/// The server answers ADDR_REJECTED: the task FAILS, nothing is stored,
/// and the next request reconnects and COMPLETES.
#[test]
fn v2_rejection_fails_the_task_and_the_next_request_completes() {
    let peer = Peer::start(512 << 10, 1 << 20, Some(2), false, |_| Action::Serve);
    let e = engine();
    let src = Buf::new(64 << 10, 8);
    let dst = Buf::zeroed(64 << 10);
    let seg = peer.open(&e);
    let beyond = BASE + (600 << 10);
    for round in 0..3 {
        let w = write_req(src.addr(), seg, beyond, 4096);
        assert_eq!(
            run_within(&e, &[w], FAIL_WITHIN),
            vec![Failed],
            "round {round}"
        );
        let ok = write_req(src.addr(), seg, BASE + 64, 4096);
        assert_eq!(run(&e, &[ok]), vec![Completed], "round {round}");
        assert_eq!(peer.server.mem(BASE + 64, 4096), src.get(0, 4096));
        let r = read_req(dst.addr(), seg, beyond, 4096);
        assert_eq!(
            run_within(&e, &[r], FAIL_WITHIN),
            vec![Failed],
            "round {round}"
        );
        let ok = read_req(dst.addr(), seg, BASE + 64, 4096);
        assert_eq!(run(&e, &[ok]), vec![Completed], "round {round}");
        assert_eq!(dst.get(0, 4096), src.get(0, 4096));
        dst.set(0, &[0u8; 4096]);
    }
    // A big rejected WRITE (the server closes while we still stream).
    let w = write_req(src.addr(), seg, beyond, 64 << 10);
    assert_eq!(run_within(&e, &[w], FAIL_WITHIN), vec![Failed]);
    assert!(
        peer.server.accepted() >= 2,
        "rejections closed connections, later requests reconnected"
    );
    let ok = write_req(src.addr(), seg, BASE, 64 << 10);
    assert_eq!(run(&e, &[ok]), vec![Completed]);
    assert_eq!(peer.server.mem(BASE, 64 << 10), src.snapshot());
    e.shutdown();
}

/// A status word without the MCTV magic fails the task.
#[test]
fn malformed_status_word_fails_the_task() {
    let bad = BASE + (512 << 10);
    let peer = Peer::start(1 << 20, 1 << 20, Some(2), false, move |s| {
        if s.header.addr >= bad {
            Action::BadStatus
        } else {
            Action::Serve
        }
    });
    let e = engine();
    let src = Buf::new(64 << 10, 9);
    let dst = Buf::zeroed(64 << 10);
    let seg = peer.open(&e);
    let w = write_req(src.addr(), seg, bad + 128, 1000);
    assert_eq!(run_within(&e, &[w], FAIL_WITHIN), vec![Failed]);
    let r = read_req(dst.addr(), seg, bad + 128, 1000);
    assert_eq!(run_within(&e, &[r], FAIL_WITHIN), vec![Failed]);
    let ok = write_req(src.addr(), seg, BASE, 1000);
    assert_eq!(run(&e, &[ok]), vec![Completed]);
    let ok = read_req(dst.addr(), seg, BASE, 1000);
    assert_eq!(run(&e, &[ok]), vec![Completed]);
    assert_eq!(dst.get(0, 1000), src.get(0, 1000));
    e.shutdown();
}

/// A server that closes mid-transfer fails the task (no hang), WRITE and
/// READ, and the engine carries on.
#[test]
fn server_closing_mid_transfer_fails_the_task() {
    let cut = BASE + (1 << 20);
    let peer = Peer::start(2 << 20, 2 << 20, Some(2), false, move |s| {
        if s.header.addr >= cut {
            Action::PartialThenClose(1000)
        } else {
            Action::Serve
        }
    });
    let e = engine();
    let src = Buf::new(1 << 20, 10);
    let dst = Buf::zeroed(1 << 20);
    let seg = peer.open(&e);
    for len in [4096u64, 1 << 20] {
        let t0 = Instant::now();
        let w = write_req(src.addr(), seg, cut, len);
        assert_eq!(
            run_within(&e, &[w], FAIL_WITHIN),
            vec![Failed],
            "WRITE {len}"
        );
        let r = read_req(dst.addr(), seg, cut, len);
        assert_eq!(
            run_within(&e, &[r], FAIL_WITHIN),
            vec![Failed],
            "READ {len}"
        );
        assert!(t0.elapsed() < 2 * FAIL_WITHIN);
    }
    let ok = write_req(src.addr(), seg, BASE, 1 << 20);
    assert_eq!(run(&e, &[ok]), vec![Completed]);
    let ok = read_req(dst.addr(), seg, BASE, 1 << 20);
    assert_eq!(run(&e, &[ok]), vec![Completed]);
    assert!(dst.snapshot() == src.snapshot());
    e.shutdown();
}

/// Checks that the headers of `op` tile `[start, start + len)` exactly.
fn assert_tiled(seen: &[Seen], op: u8, start: u64, len: u64) -> usize {
    let mut parts: Vec<_> = seen
        .iter()
        .filter(|s| s.header.opcode == op)
        .map(|s| (s.header.addr, s.header.size))
        .collect();
    parts.sort();
    let mut at = start;
    for &(a, n) in &parts {
        assert_eq!(a, at, "slices of opcode {op:#x} leave a gap or overlap");
        assert!(n > 0);
        at += n;
    }
    assert_eq!(
        at,
        start + len,
        "slices of opcode {op:#x} cover the request"
    );
    parts.len()
}

/// One 4 MiB request is sliced, the slices spread over several lanes
/// (connections), each slice its own header at the right address.
#[test]
fn large_request_is_sliced_over_several_connections() {
    let len = 4usize << 20;
    let peer = Peer::start(len + 4096, len as u64 + 4096, Some(2), false, |_| {
        Action::Serve
    });
    let e = engine();
    let src = Buf::new(len, 11);
    let dst = Buf::zeroed(len);
    let seg = peer.open(&e);
    let at = BASE + 1000;
    assert_eq!(
        run(&e, &[write_req(src.addr(), seg, at, len as u64)]),
        vec![Completed]
    );
    assert!(peer.server.mem(at, len) == src.snapshot());
    let seen = peer.server.seen();
    let n = assert_tiled(&seen, 0x81, at, len as u64);
    assert!(n >= 2, "a 4 MiB request is sliced ({n} slices)");
    let conns: std::collections::HashSet<_> = seen.iter().map(|s| s.conn).collect();
    assert!(
        conns.len() >= 2 && peer.server.accepted() >= 2,
        "slices spread over several connections ({} used)",
        conns.len()
    );
    assert_eq!(
        run(&e, &[read_req(dst.addr(), seg, at, len as u64)]),
        vec![Completed]
    );
    assert!(dst.snapshot() == src.snapshot());
    assert_tiled(&peer.server.seen(), 0x80, at, len as u64);
    e.shutdown();
}

/// 100 small WRITEs in one batch all complete and all arrive.
#[test]
fn hundred_small_writes_in_one_batch() {
    let peer = Peer::start(1 << 20, 1 << 20, Some(2), false, |_| Action::Serve);
    let e = engine();
    let src = Buf::new(1 << 20, 12);
    let seg = peer.open(&e);
    let sizes: Vec<usize> = (0..100).map(|i| 1 + (i * 37) % 3000).collect();
    let at = spread(&sizes);
    assert_eq!(run(&e, &writes(&src, seg, &at)), all(100, Completed));
    for &(o, n) in &at {
        assert_eq!(peer.server.mem(BASE + o as u64, n), src.get(o, n));
    }
    let mut got: Vec<_> = peer
        .server
        .seen()
        .iter()
        .map(|s| (s.header.addr, s.header.size))
        .collect();
    got.sort();
    let want: Vec<_> = at
        .iter()
        .map(|&(o, n)| (BASE + o as u64, n as u64))
        .collect();
    assert_eq!(got, want, "each WRITE is one header at its address");
    e.shutdown();
}

/// The peer dies (listener and every socket dropped) while a 64 MiB READ
/// is in flight: the task FAILS promptly, not after a stall timeout.
#[test]
fn peer_killed_during_large_read_fails_promptly() {
    let len = 64usize << 20;
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let mut peer = Peer::start(len, len as u64, Some(2), false, move |_| {
        if count.fetch_add(1, Ordering::AcqRel) < 16 {
            Action::Serve
        } else {
            Action::PartialThenHang(1000)
        }
    });
    let e = engine();
    let dst = Buf::zeroed(len);
    let seg = peer.open(&e);
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[read_req(dst.addr(), seg, BASE, len as u64)])
        .unwrap();
    wait_for("READ in flight", Duration::from_secs(30), || {
        served.load(Ordering::Acquire) > 16
    });
    assert_eq!(e.status(b, 0).unwrap().0, TaskStatus::Waiting);
    let t0 = Instant::now();
    peer.server.kill();
    assert_eq!(wait_task(&e, b, 0, FAIL_WITHIN), Failed);
    assert!(t0.elapsed() < FAIL_WITHIN);
    e.free_batch(b).unwrap();
    e.shutdown();
}

/// Shutdown with work in flight against a server that never answers
/// returns within 5 s, leaves no task WAITING, and closes every data
/// connection (so nothing still reads the caller's memory).
#[test]
fn shutdown_with_work_in_flight_returns_promptly() {
    let peer = Peer::start(32 << 20, 32 << 20, Some(2), false, |_| Action::Hang);
    let e = engine();
    let src = Buf::new(16 << 20, 13);
    let dst = Buf::zeroed(4 << 20);
    let seg = peer.open(&e);
    let mut reqs: Vec<Request> = (0..16)
        .map(|i| write_req(src.addr() + (i << 20), seg, BASE + (i << 20), 1 << 20))
        .collect();
    reqs.extend((0..4).map(|i| {
        read_req(
            dst.addr() + (i << 20),
            seg,
            BASE + (16 << 20) + (i << 20),
            1 << 20,
        )
    }));
    let b = e.allocate_batch(reqs.len()).unwrap();
    e.submit(b, &reqs).unwrap();
    // 20 requests spread by load over the 4 default lanes: every lane
    // connects and sends (the server sees each connection's first header).
    wait_for(
        "every lane has work in flight",
        Duration::from_secs(20),
        || peer.server.seen().len() >= 4,
    );
    for i in 0..reqs.len() {
        assert_eq!(e.status(b, i).unwrap().0, TaskStatus::Waiting, "task {i}");
    }
    let t0 = Instant::now();
    e.shutdown();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    for i in 0..reqs.len() {
        // The batch may be gone with the engine; if it is still there, the
        // task must be terminal.
        if let Ok((s, _)) = e.status(b, i) {
            assert_ne!(s, TaskStatus::Waiting, "task {i} left WAITING");
        }
    }
    let accepted = peer.server.accepted();
    assert!(accepted >= 4);
    wait_for(
        "every data connection closed by the engine",
        Duration::from_secs(5),
        || peer.server.ended() >= accepted,
    );
    assert_eq!(
        peer.server.accepted(),
        accepted,
        "no connection after shutdown"
    );
}

/// A descriptor whose buffer wraps the address space is not trusted: the
/// segment does not open, and the engine does not panic.
#[test]
fn descriptor_buffer_wrapping_the_address_space() {
    let server = FakeServer::start(vec![0u8; 4096], BASE, false, |_| Action::Serve);
    let port = server.port;
    let top = u64::MAX - 0xfff;
    let hs = HandshakeResponder::start(|rpc| tcp_descriptor(rpc, port, 2, top, 0x2000));
    let e = engine();
    let src = Buf::new(4096, 14);
    assert!(
        e.open_segment(&hs.name()).is_err(),
        "a wrapping buffer must be rejected"
    );
    drop(src);
    e.shutdown();
}

/// v1 WRITEs larger than the socket takes at once, to a server that
/// reads slowly: every send stops mid-payload, and the lane waits for the
/// socket instead of looking for an answer a v1 WRITE never gets.
#[test]
fn v1_writes_that_fill_the_socket_complete() {
    let n = 64 << 20;
    let peer = Peer::start(n, n as u64, Some(1), true, |_| Action::Paced {
        chunk: 64 << 10,
        every: Duration::from_millis(1),
    });
    let e = engine();
    let src = Buf::new(n, 15);
    register(&e, &src, true);
    let seg = peer.open(&e);
    let w = write_req(src.addr(), seg, BASE, n as u64);
    assert_eq!(
        run_within(&e, &[w], Duration::from_secs(30)),
        vec![Completed]
    );
    // v1 COMPLETED means "sent", not "stored": wait for the bytes to land.
    wait_for("v1 WRITE stored", Duration::from_secs(30), || {
        peer.server.mem(BASE, n) == src.get(0, n)
    });
    e.shutdown();
}

/// A v2 server that answers OK to a WRITE before taking its payload is
/// broken (or hostile): the task fails at once instead of the lane
/// looking for more answers without end.
#[test]
fn a_status_word_before_the_write_payload_fails_the_task() {
    let n = 16 << 20;
    let peer = Peer::start(n, n as u64, Some(2), false, |_| Action::EarlyStatus);
    let slice = n.to_string();
    let e = engine_with(&[("MC_SLICE_SIZE", &slice)]);
    let src = Buf::new(n, 16);
    register(&e, &src, true);
    let seg = peer.open(&e);
    let w = write_req(src.addr(), seg, BASE, n as u64);
    assert_eq!(run_within(&e, &[w], FAIL_WITHIN), vec![Failed]);
    e.shutdown();
}
