//! The passive side of the RDMA handshake under attack, on real verbs
//! (soft-RoCE in the VM of `scripts/rdma-vm/`). Connection frames are
//! built by hand and sent from raw sockets bound to 127.0.0.2, an address
//! no engine publishes (it stands for another host), while engines named
//! `127.0.0.1:<port>` move verified bytes:
//!
//! - frames claiming the NIC path of a peer that streams WRITEs are all
//!   refused, its endpoint is never replaced, and no task fails;
//! - a flood of made-up NIC paths creates no endpoint, and the flooded
//!   engine's own completions keep their pace (printed: endpoint count and
//!   completion latency, quiet and under the flood);
//! - peers that do verify (the frame comes from their published host, with
//!   a GID they publish) hold a bounded number of passive endpoints, per
//!   peer and in total, and a real peer streaming WRITEs keeps its
//!   endpoint while they churn at the bound.
//!
//! One configuration per process (the bounds below); run with
//! `--ignored --test-threads 1` inside the VM.

use crate::common;
use crate::rdma_support as rdma;

use common::{Buf, HandshakeResponder, handshake_port, pattern, register, run_within, write_req};
use rdma::{A, B};
use serde_json::{Value, json};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use transfer_engine::Engine;
use transfer_engine::TaskStatus;

const MIB: usize = 1 << 20;
const T: Duration = Duration::from_secs(60);
/// `MC_RDMA_MAX_PASSIVE_EP` of this process.
const MAX_PASSIVE: usize = 12;
/// `MC_RDMA_MAX_PASSIVE_EP_PER_PEER` of this process.
const MAX_PER_PEER: usize = 3;
/// Queue pairs per endpoint (`MC_NUM_QP_PER_EP`, the default).
const QP_PER_EP: usize = 2;

fn setup() {
    rdma::setup(&[
        ("MC_RDMA_COMPLETION_TIMEOUT", "3"),
        ("MC_RDMA_RAIL_PAUSE_SECONDS", "2"),
        ("MC_RDMA_MAX_PASSIVE_EP", "12"),
        ("MC_RDMA_MAX_PASSIVE_EP_PER_PEER", "3"),
    ]);
}

fn attacker() -> IpAddr {
    IpAddr::from([127, 0, 0, 2])
}

fn loopback() -> IpAddr {
    IpAddr::from([127, 0, 0, 1])
}

/// The NIC path of `dev` of engine `e`.
fn path(e: &Engine, dev: &str) -> String {
    format!("{}@{dev}", e.local_name())
}

/// A Connection request as Mooncake's active side sends it.
fn request(from_path: &str, gid: &str, to_path: &str, qps: [u32; 2], ack: Option<bool>) -> Value {
    let mut v = json!({
        "payload": "",
        "local_nic_path": from_path,
        "local_lid": 0,
        "local_gid": gid,
        "peer_nic_path": to_path,
        "qp_num": qps,
        "reply_msg": "",
    });
    if let Some(a) = ack {
        v["ready_ack"] = Value::Bool(a);
    }
    v
}

/// Streams 1 MiB WRITEs from `a` to `seg` until `stop`, each checked byte
/// for byte; returns (completed and verified, failed, wrong bytes) and the
/// latency of each completed WRITE.
fn stream(
    a: &Engine,
    seg: i32,
    local: &Buf,
    remote: &Buf,
    stop: &AtomicBool,
) -> ((u64, u64, u64), Vec<Duration>) {
    let (mut ok, mut failed, mut wrong) = (0u64, 0u64, 0u64);
    let mut lat = Vec::new();
    let mut round = 0u8;
    while !stop.load(Ordering::Acquire) {
        round = round.wrapping_add(1);
        let data = pattern(MIB, round);
        local.set(0, &data);
        let off = u64::from(round % 7);
        let w = write_req(local.addr(), seg, remote.addr() + off, MIB as u64);
        let t0 = Instant::now();
        let st = run_within(a, &[w], T);
        if st == [TaskStatus::Completed] {
            lat.push(t0.elapsed());
            if remote.get(off as usize, MIB) == data {
                ok += 1;
            } else {
                wrong += 1;
            }
        } else {
            failed += 1;
        }
    }
    ((ok, failed, wrong), lat)
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn frames_claiming_a_peers_path_from_another_host_are_refused() {
    setup();
    let a = rdma::engine(&[A[0].0]);
    let b = rdma::engine(&[B[0].0]);
    let local = Buf::zeroed(2 * MIB);
    let remote = Buf::zeroed(2 * MIB);
    register(&a, &local, true);
    register(&b, &remote, true);
    let seg = a.open_segment(b.local_name()).expect("open");
    // The endpoint a -> b exists on both sides before the attack.
    let w = write_req(local.addr(), seg, remote.addr(), 4096);
    assert_eq!(run_within(&a, &[w], T), [TaskStatus::Completed]);
    let b_qps = rdma::rc_qpns(B[0].0);
    assert_eq!(b_qps.len(), QP_PER_EP, "b's endpoint to a: {b_qps:?}");

    let claimed = path(&a, A[0].0);
    let target = path(&b, B[0].0);
    let port = handshake_port(&b);
    // The GID a publishes for its device, and another NIC's.
    let (own_gid, other_gid) = (rdma::gid(A[0].0), rdma::gid(A[1].0));
    let stop = AtomicBool::new(false);
    let (mut sent, mut refused) = (0u32, 0u32);
    let ((ok, failed, wrong), _) = std::thread::scope(|s| {
        let streamer = s.spawn(|| stream(&a, seg, &local, &remote, &stop));
        // Let the stream run before the first frame.
        std::thread::sleep(Duration::from_secs(2));
        for i in 0..60u32 {
            let qps = [5000 + 2 * i, 5001 + 2 * i];
            let req = match i % 4 {
                0 => request(&claimed, &other_gid, &target, qps, Some(false)),
                1 => request(&claimed, &own_gid, &target, qps, Some(false)),
                // A sender without ready ACKs (older Mooncake).
                2 => request(&claimed, &own_gid, &target, qps, None),
                _ => request(&claimed, &own_gid, &target, qps, Some(true)),
            };
            let reply = rdma::send_connection(attacker(), port, &req);
            sent += 1;
            if rdma::refused(&reply) {
                refused += 1;
            } else {
                eprintln!("frame {i} accepted: {reply:?}");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        stop.store(true, Ordering::Release);
        streamer.join().expect("streamer")
    });
    let after = rdma::rc_qpns(B[0].0);
    eprintln!(
        "spoofed frames from 127.0.0.2: {refused} of {sent} refused; a's 1 MiB WRITEs meanwhile: \
         {ok} verified, {failed} failed, {wrong} with wrong bytes; b's queue pairs {b_qps:?} -> \
         {after:?}"
    );
    assert_eq!(refused, sent, "every frame from 127.0.0.2 is refused");
    assert_eq!((failed, wrong), (0, 0), "no WRITE fails or lands wrong");
    assert!(ok >= 5, "the stream made progress ({ok} WRITEs)");
    assert_eq!(after, b_qps, "b's endpoint to a was never replaced");

    // The same frame from a's published host is well formed and taken: a
    // restarted peer connects with new queue pairs.
    let req = request(&claimed, &own_gid, &target, [7000, 7001], Some(false));
    let reply = rdma::send_connection(loopback(), port, &req);
    assert!(!rdma::refused(&reply), "from 127.0.0.1: {reply:?}");
    assert_eq!(reply.unwrap()["local_nic_path"], target);
    a.shutdown();
    b.shutdown();
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn made_up_paths_create_no_endpoints_and_completions_keep_their_pace() {
    setup();
    // b is flooded, and is itself an initiator whose WRITEs to a are timed.
    let a = rdma::engine(&[A[0].0]);
    let b = rdma::engine(&[B[0].0]);
    let local = Buf::zeroed(2 * MIB);
    let remote = Buf::zeroed(2 * MIB);
    register(&b, &local, true);
    register(&a, &remote, true);
    let seg = b.open_segment(a.local_name()).expect("open");
    let w = write_req(local.addr(), seg, remote.addr(), 4096);
    assert_eq!(run_within(&b, &[w], T), [TaskStatus::Completed]);
    let qps0 = rdma::rc_qpns(B[0].0).len();
    let port = handshake_port(&b);
    let target = path(&b, B[0].0);
    let gid = rdma::gid(A[1].0);

    let stop = AtomicBool::new(false);
    let ((_, failed0, wrong0), mut quiet) = std::thread::scope(|s| {
        let t = s.spawn(|| stream(&b, seg, &local, &remote, &stop));
        std::thread::sleep(Duration::from_secs(8));
        stop.store(true, Ordering::Release);
        t.join().expect("quiet stream")
    });
    assert_eq!((failed0, wrong0), (0, 0));

    // The flood: 4 senders, distinct made-up paths (hosts of a documentation
    // range, unroutable here), for at most 20 s or 4000 frames.
    let stop = AtomicBool::new(false);
    let next = AtomicU64::new(0);
    let sent = AtomicU64::new(0);
    let refused = AtomicU64::new(0);
    let max_qps = Mutex::new(qps0);
    let flood_start = Instant::now();
    let ((ok, failed, wrong), mut loaded) = std::thread::scope(|s| {
        let t = s.spawn(|| stream(&b, seg, &local, &remote, &stop));
        let senders: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= 4000 || flood_start.elapsed() > Duration::from_secs(20) {
                            return;
                        }
                        let made_up = format!(
                            "198.51.100.{}:{}@mlx5_{}",
                            1 + i % 250,
                            20000 + i / 250,
                            i % 4
                        );
                        let qps = [100_000 + 2 * i as u32, 100_001 + 2 * i as u32];
                        let req = request(&made_up, &gid, &target, qps, Some(false));
                        let reply = rdma::send_connection(attacker(), port, &req);
                        sent.fetch_add(1, Ordering::Relaxed);
                        if rdma::refused(&reply) {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        while senders.iter().any(|h| !h.is_finished()) {
            let n = rdma::rc_qpns(B[0].0).len();
            let mut m = max_qps.lock().unwrap();
            *m = (*m).max(n);
            drop(m);
            std::thread::sleep(Duration::from_millis(250));
        }
        stop.store(true, Ordering::Release);
        t.join().expect("stream under the flood")
    });
    let flood_secs = flood_start.elapsed().as_secs_f64();
    let sent = sent.load(Ordering::Relaxed);
    let refused = refused.load(Ordering::Relaxed);
    let max_qps = *max_qps.lock().unwrap();
    let after = rdma::rc_qpns(B[0].0).len();
    let (q50, q99, qmax) = rdma::percentiles(&mut quiet);
    let (l50, l99, lmax) = rdma::percentiles(&mut loaded);
    println!(
        "FIGURES flood of made-up paths: {sent} frames in {flood_secs:.1} s, {refused} refused; \
         b's endpoints on {} (queue pairs / {QP_PER_EP}): {} before, max {} during, {} after; \
         b's 1 MiB WRITE latency quiet p50 {q50:?} p99 {q99:?} max {qmax:?} ({} WRITEs), \
         under the flood p50 {l50:?} p99 {l99:?} max {lmax:?} ({} WRITEs, {failed} failed)",
        B[0].0,
        qps0 / QP_PER_EP,
        max_qps / QP_PER_EP,
        after / QP_PER_EP,
        quiet.len(),
        loaded.len(),
    );
    assert_eq!((failed, wrong), (0, 0), "b's own WRITEs all land");
    assert!(ok >= 5, "b's stream made progress under the flood ({ok})");
    assert!(
        max_qps <= qps0 + QP_PER_EP * MAX_PASSIVE,
        "b held {max_qps} queue pairs (bound: {qps0} + {QP_PER_EP} x {MAX_PASSIVE})"
    );
    assert_eq!(refused, sent, "made-up paths are refused");
    a.shutdown();
    b.shutdown();
}

/// A peer that publishes 127.0.0.1 and `devices` devices, all with `gid`:
/// its handshake listener serves the descriptor, as a Mooncake peer's does.
fn fake_peer(devices: usize, gid: &str) -> HandshakeResponder {
    let gid = gid.to_string();
    HandshakeResponder::start(move |port| {
        let devs: Vec<Value> = (0..devices)
            .map(|d| json!({"name": format!("dev{d}"), "lid": 0, "gid": gid}))
            .collect();
        json!({
            "name": format!("127.0.0.1:{port}"),
            "protocol": "rdma",
            "tcp_data_port": 0,
            "tcp_proto_version": 1,
            "timestamp": "2026-01-01 00:00:00.000000",
            "devices": devs,
            "buffers": [],
            "priority_matrix": {},
        })
    })
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn verified_peers_hold_bounded_passive_endpoints_and_a_busy_peer_keeps_its_own() {
    setup();
    let a = rdma::engine(&[A[0].0]);
    let b = rdma::engine(&[B[0].0]);
    let local = Buf::zeroed(2 * MIB);
    let remote = Buf::zeroed(2 * MIB);
    register(&a, &local, true);
    register(&b, &remote, true);
    let seg = a.open_segment(b.local_name()).expect("open");
    let w = write_req(local.addr(), seg, remote.addr(), 4096);
    assert_eq!(run_within(&a, &[w], T), [TaskStatus::Completed]);
    let b_qps = rdma::rc_qpns(B[0].0);
    assert_eq!(b_qps.len(), QP_PER_EP);

    // 8 peers on a's host, 5 devices each: 40 passive endpoints wanted.
    let gid = rdma::gid(A[0].0);
    let peers: Vec<HandshakeResponder> = (0..8).map(|_| fake_peer(5, &gid)).collect();
    let target = path(&b, B[0].0);
    let port = handshake_port(&b);
    let stop = AtomicBool::new(false);
    let accepted = Arc::new(Mutex::new(vec![0usize; peers.len()]));
    let max_qps = Mutex::new(0usize);
    let acks_refused = AtomicU64::new(0);
    let ((ok, failed, wrong), _) = std::thread::scope(|s| {
        let streamer = s.spawn(|| stream(&a, seg, &local, &remote, &stop));
        // a streams for a while before the peers arrive.
        std::thread::sleep(Duration::from_secs(5));
        let mut qpn = 200_000u32;
        for round in 0..2 {
            for (p, peer) in peers.iter().enumerate() {
                for d in 0..5 {
                    let from = format!("{}@dev{d}", peer.name());
                    let req = request(&from, &gid, &target, [qpn, qpn + 1], Some(false));
                    qpn += 2;
                    let reply = rdma::send_connection(loopback(), port, &req);
                    if !rdma::refused(&reply) {
                        if round == 0 {
                            accepted.lock().unwrap()[p] += 1;
                        }
                        // The ready ACK: the endpoint serves (and is kept)
                        // until it gives way.
                        let ack = request(&from, &gid, &target, [qpn - 2, qpn - 1], Some(true));
                        if rdma::refused(&rdma::send_connection(loopback(), port, &ack)) {
                            acks_refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    let n = rdma::rc_qpns(B[0].0).len();
                    let mut m = max_qps.lock().unwrap();
                    *m = (*m).max(n);
                }
            }
        }
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Release);
        streamer.join().expect("streamer")
    });
    let accepted = accepted.lock().unwrap().clone();
    let max_qps = *max_qps.lock().unwrap();
    let after = rdma::rc_qpns(B[0].0);
    println!(
        "FIGURES verified peers: accepted per peer {accepted:?} (bound {MAX_PER_PEER}); b's queue \
         pairs on {}: max {max_qps} during, {} after (bound {} endpoints of {QP_PER_EP}); a's \
         1 MiB WRITEs meanwhile: {ok} verified, {failed} failed, {wrong} wrong",
        B[0].0,
        after.len(),
        MAX_PASSIVE,
    );
    assert_eq!(
        acks_refused.load(Ordering::Relaxed),
        0,
        "ready ACKs refused"
    );
    for (p, n) in accepted.iter().enumerate() {
        assert!(*n <= MAX_PER_PEER, "peer {p} got {n} passive endpoints");
        assert!(*n >= 1, "peer {p} verified and was served");
    }
    // Evicted endpoints close at the monitor's next pass.
    common::wait_for(
        "b's passive endpoints within the bound",
        Duration::from_secs(20),
        || rdma::rc_qpns(B[0].0).len() <= QP_PER_EP * MAX_PASSIVE,
    );
    assert_eq!((failed, wrong), (0, 0), "a's WRITEs all land");
    assert!(ok >= 5, "a's stream made progress ({ok})");
    assert!(
        b_qps.iter().all(|q| rdma::rc_qpns(B[0].0).contains(q)),
        "b kept its endpoint to a, which moves bytes, while the others churned"
    );
    drop(peers);
    a.shutdown();
    b.shutdown();
}
