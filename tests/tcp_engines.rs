//! Two engines in one process move bytes over TCP: P2P handshake and the
//! HTTP metadata server, WRITE and READ, verified byte for byte.

mod common;

use std::sync::Arc;
use transfer_engine::TaskStatus;
use transfer_engine::metadata::server::MetadataServer;
use transfer_engine::{Engine, Opcode, Request};
use transfer_engine::{Location, Region};

fn engine(conn: &str, name: &str) -> Arc<Engine> {
    let e = Engine::new(conn, name, false).expect("engine");
    e.install_transport("tcp", None).expect("tcp");
    e
}

fn register(e: &Engine, buf: &mut [u8], remote: bool) {
    e.register(&[Region {
        addr: buf.as_mut_ptr() as u64,
        length: buf.len() as u64,
        location: Location::Cpu(0),
        remote_accessible: remote,
    }])
    .expect("register");
}

fn run(e: &Engine, reqs: &[Request]) -> Vec<TaskStatus> {
    let b = e.allocate_batch(reqs.len()).unwrap();
    e.submit(b, reqs).unwrap();
    let mut out = Vec::new();
    for i in 0..reqs.len() {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let (s, _) = e.status(b, i).unwrap();
            if s != TaskStatus::Waiting {
                out.push(s);
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "task {i} did not finish"
            );
            std::thread::yield_now();
        }
    }
    e.free_batch(b).unwrap();
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// P2P names become `host:port` of each engine's listener; with a store
/// they are kept verbatim, so they must differ.
fn round_trip(conn: &str, names: [&str; 2]) {
    let target = engine(conn, names[0]);
    let initiator = engine(conn, names[1]);
    let mut remote = vec![0u8; 8 << 20];
    register(&target, &mut remote, true);
    let mut local = pattern(8 << 20, 7);
    let mut back = vec![0u8; 8 << 20];
    register(&initiator, &mut local, true);
    let seg = initiator
        .open_segment(target.local_name())
        .expect("open segment");
    assert!(seg > 0);
    let base = remote.as_ptr() as u64;
    let sizes = [1usize, 4095, 65536, 65537, 1 << 20, (3 << 20) + 13];
    let mut off = 3usize;
    let mut reqs = Vec::new();
    for &len in &sizes {
        reqs.push(Request {
            opcode: Opcode::Write,
            source: local.as_ptr() as u64 + off as u64,
            target_id: seg,
            target_offset: base + off as u64,
            length: len as u64,
        });
        off += len + 5;
    }
    assert!(
        run(&initiator, &reqs)
            .iter()
            .all(|s| *s == TaskStatus::Completed)
    );
    for r in &reqs {
        let o = (r.target_offset - base) as usize;
        assert_eq!(
            &remote[o..o + r.length as usize],
            &local[o..o + r.length as usize]
        );
    }
    let reads: Vec<Request> = reqs
        .iter()
        .map(|r| Request {
            opcode: Opcode::Read,
            source: back.as_mut_ptr() as u64 + (r.target_offset - base),
            ..*r
        })
        .collect();
    assert!(
        run(&initiator, &reads)
            .iter()
            .all(|s| *s == TaskStatus::Completed)
    );
    for r in &reads {
        let o = (r.target_offset - base) as usize;
        assert_eq!(
            &back[o..o + r.length as usize],
            &remote[o..o + r.length as usize]
        );
    }
    // Out of the peer's buffers: FAILED, nothing written.
    let bad = Request {
        opcode: Opcode::Write,
        source: local.as_ptr() as u64,
        target_id: seg,
        target_offset: base + remote.len() as u64 - 10,
        length: 20,
    };
    assert_eq!(run(&initiator, &[bad]), vec![TaskStatus::Failed]);
    initiator.shutdown();
    target.shutdown();
}

#[test]
fn p2p_write_and_read() {
    round_trip("P2PHANDSHAKE", ["127.0.0.1", "127.0.0.1"]);
}

#[test]
fn http_metadata_write_and_read() {
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).unwrap();
    round_trip(&server.url(), ["target.example:1", "initiator.example:2"]);
    server.shutdown();
}

#[test]
fn many_threads_share_an_initiator() {
    let target = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let initiator = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let mut remote = vec![0u8; 8 << 20];
    register(&target, &mut remote, true);
    let seg = initiator.open_segment(target.local_name()).unwrap();
    let base = remote.as_ptr() as u64;
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            let e = initiator.clone();
            std::thread::spawn(move || {
                let chunk = 1 << 20;
                let data = pattern(chunk, t);
                let mut back = vec![0u8; chunk];
                let at = base + u64::from(t) * chunk as u64;
                let w = Request {
                    opcode: Opcode::Write,
                    source: data.as_ptr() as u64,
                    target_id: seg,
                    target_offset: at,
                    length: chunk as u64,
                };
                assert_eq!(run(&e, &[w]), vec![TaskStatus::Completed]);
                let r = Request {
                    opcode: Opcode::Read,
                    source: back.as_mut_ptr() as u64,
                    ..w
                };
                assert_eq!(run(&e, &[r]), vec![TaskStatus::Completed]);
                assert!(back == data, "thread {t} read back other bytes");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    initiator.shutdown();
    target.shutdown();
}

/// A buffer the target registers after the initiator cached its
/// descriptor is reachable (the descriptor is fetched again), as with
/// Mooncake; memory the target never registered still fails.
#[test]
fn buffers_registered_after_open_are_reachable() {
    let target = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let initiator = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let mut first = vec![0u8; 4096];
    register(&target, &mut first, true);
    let seg = initiator.open_segment(target.local_name()).unwrap();
    let mut late = vec![0u8; 1 << 20];
    register(&target, &mut late, true);
    let data = pattern(late.len(), 9);
    let w = Request {
        opcode: Opcode::Write,
        source: data.as_ptr() as u64,
        target_id: seg,
        target_offset: late.as_ptr() as u64,
        length: data.len() as u64,
    };
    assert_eq!(run(&initiator, &[w]), vec![TaskStatus::Completed]);
    assert!(late == data, "the late buffer holds other bytes");
    let unregistered = vec![0u8; 4096];
    let bad = Request {
        target_offset: unregistered.as_ptr() as u64,
        length: 16,
        ..w
    };
    assert_eq!(run(&initiator, &[bad]), vec![TaskStatus::Failed]);
    initiator.shutdown();
    target.shutdown();
}

/// A request over buffers the target registered separately but adjacent
/// (one descriptor entry each, no gap: how a buffer larger than a NIC's
/// largest memory region is published) is cut at their edges and moves;
/// one across a gap between buffers fails and writes nothing.
#[test]
fn a_request_spans_adjacent_remote_buffers() {
    let target = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let initiator = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let len = 4 << 20;
    let mut remote = vec![0u8; len];
    // [0, a) and [a, b) adjacent; [b + gap, len) after a gap.
    let (a, b, gap) = ((1 << 20) + 12345, (3 << 20) + 7, 4096);
    let base = remote.as_mut_ptr() as u64;
    for (from, to) in [(0, a), (a, b), (b + gap, len)] {
        target
            .register(&[Region {
                addr: base + from as u64,
                length: (to - from) as u64,
                location: Location::Cpu(0),
                remote_accessible: true,
            }])
            .expect("register");
    }
    let mut local = pattern(len, 3);
    register(&initiator, &mut local, true);
    let mut back = vec![0u8; len];
    register(&initiator, &mut back, true);
    let seg = initiator.open_segment(target.local_name()).unwrap();
    let (from, to) = (100, b - 100);
    let w = Request {
        opcode: Opcode::Write,
        source: local.as_ptr() as u64 + from as u64,
        target_id: seg,
        target_offset: base + from as u64,
        length: (to - from) as u64,
    };
    assert_eq!(run(&initiator, &[w]), vec![TaskStatus::Completed]);
    let across_gap = Request {
        source: local.as_ptr() as u64 + (b - 100) as u64,
        target_offset: base + (b - 100) as u64,
        length: (gap + 200) as u64,
        ..w
    };
    assert_eq!(run(&initiator, &[across_gap]), vec![TaskStatus::Failed]);
    let r = Request {
        opcode: Opcode::Read,
        source: back.as_mut_ptr() as u64 + from as u64,
        ..w
    };
    assert_eq!(run(&initiator, &[r]), vec![TaskStatus::Completed]);
    initiator.shutdown();
    target.shutdown();
    // Every byte: the written range holds the pattern, the rest (the gap
    // included) is untouched; the read brought the range back.
    let mut expected = vec![0u8; len];
    expected[from..to].copy_from_slice(&local[from..to]);
    assert!(remote == expected, "the target's buffers hold other bytes");
    assert!(back == expected, "the read brought back other bytes");
}

/// `auto_discover` with no RDMA device installs TCP, as Mooncake does.
#[test]
fn auto_discover_installs_tcp() {
    let target = Engine::new("P2PHANDSHAKE", "127.0.0.1", true).expect("engine");
    let initiator = Engine::new("P2PHANDSHAKE", "127.0.0.1", true).expect("engine");
    let mut remote = vec![0u8; 1 << 20];
    register(&target, &mut remote, true);
    let data = pattern(1 << 20, 3);
    let seg = initiator
        .open_segment(target.local_name())
        .expect("open segment");
    let w = Request {
        opcode: Opcode::Write,
        source: data.as_ptr() as u64,
        target_id: seg,
        target_offset: remote.as_ptr() as u64,
        length: data.len() as u64,
    };
    assert_eq!(run(&initiator, &[w]), vec![TaskStatus::Completed]);
    assert!(remote == data);
    initiator.shutdown();
    target.shutdown();
}

/// `MC_FORCE_HCA` makes auto-discovery install RDMA or fail, as Mooncake:
/// on a machine without an active RDMA device the engine is not created
/// (without the variable it falls back to TCP, above).
#[test]
fn force_hca_refuses_to_fall_back_to_tcp() {
    let active = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.flatten().any(|dev| {
                std::fs::read_to_string(dev.path().join("ports/1/state"))
                    .is_ok_and(|s| s.contains("ACTIVE"))
            })
        })
        .unwrap_or(false);
    if active {
        return common::skip("this machine has an active RDMA device");
    }
    let mut config = transfer_engine::Config::default();
    config.engine.force_hca = true;
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1")
        .auto_discover(true)
        .config(config.clone())
        .build();
    let err = e.err().expect("no engine without an RDMA device");
    assert!(err.to_string().contains("MC_FORCE_HCA"), "{err}");
    // MC_FORCE_TCP does not override it.
    config.engine.force_tcp = true;
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1")
        .auto_discover(true)
        .config(config)
        .build();
    assert!(e.is_err(), "MC_FORCE_HCA wins over MC_FORCE_TCP");
}

/// Bracketed IPv6 names: the engine is renamed `[::1]:port` and peers open
/// it by that name.
#[test]
fn ipv6_names_work() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        common::skip("no IPv6 loopback on this machine");
        return;
    }
    let target = engine("P2PHANDSHAKE", "[::1]");
    let initiator = engine("P2PHANDSHAKE", "::1");
    assert!(
        target.local_name().starts_with("[::1]:"),
        "{}",
        target.local_name()
    );
    let mut remote = vec![0u8; 256 << 10];
    register(&target, &mut remote, true);
    let data = pattern(256 << 10, 9);
    let mut back = vec![0u8; 256 << 10];
    let seg = initiator
        .open_segment(target.local_name())
        .expect("open segment");
    let w = Request {
        opcode: Opcode::Write,
        source: data.as_ptr() as u64,
        target_id: seg,
        target_offset: remote.as_ptr() as u64,
        length: data.len() as u64,
    };
    let r = Request {
        opcode: Opcode::Read,
        source: back.as_mut_ptr() as u64,
        ..w
    };
    assert_eq!(run(&initiator, &[w]), vec![TaskStatus::Completed]);
    assert_eq!(run(&initiator, &[r]), vec![TaskStatus::Completed]);
    assert!(remote == data && back == data);
    initiator.shutdown();
    target.shutdown();
}

/// A malformed priority matrix is rejected as malformed JSON and installs
/// nothing; a good one naming no usable interface still installs TCP.
#[test]
fn install_checks_the_priority_matrix() {
    use transfer_engine::Error;
    let e = Engine::new("P2PHANDSHAKE", "127.0.0.1", false).expect("engine");
    for bad in [
        "{",
        "[]",
        r#"{"cpu:0": [["eth0"]]}"#,
        r#"{"cpu:0": "eth0"}"#,
    ] {
        assert!(
            matches!(
                e.install_transport("tcp", Some(bad)),
                Err(Error::MalformedJson(_))
            ),
            "{bad} must be rejected"
        );
    }
    assert!(
        e.install_transport("tcp", Some(r#"{"cpu:0": [["no-such-nic"], []]}"#))
            .is_ok()
    );
    assert!(
        e.install_transport("tcp", None).is_ok(),
        "installing twice returns the same transport"
    );
    e.shutdown();
}
