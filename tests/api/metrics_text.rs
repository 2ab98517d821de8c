//! The engine's Prometheus metrics after known traffic: local copies and
//! TCP between two engines (shared memory beside it when this host lets
//! the transport run), WRITE and READ, tasks that fail; the counters equal
//! what moved, nothing is in flight once the batches ended, the duration
//! histograms count every task. The endpoint on `MC_TE_METRICS_ADDR`
//! answers `GET /metrics` (404 elsewhere) while a client that never
//! reads and one that sends an oversize request are connected, and stops
//! with its engine; an address that cannot be listened on fails the
//! engine's creation, naming it.

use crate::common;

use common::{Buf, read_req, register, run, write_req};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};
use transfer_engine::{Engine, LOCAL_SEGMENT_ID, TaskStatus};

/// The value of the sample `name{labels}` (labels as the text writes
/// them, in order), or `None` when the text has none.
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{labels}}}")
    };
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(&key)?.strip_prefix(' ')?.parse().ok())
}

/// [`sample`], which must exist.
fn value(text: &str, name: &str, labels: &str) -> u64 {
    sample(text, name, labels).unwrap_or_else(|| panic!("no {name}{{{labels}}} in:\n{text}")) as u64
}

/// The metrics once no task is in flight: a task's end is counted by
/// the thread that finishes its last slice, a moment after its status
/// shows it ended.
fn settled(e: &Engine) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = e.metrics_text();
        if value(&text, "transfer_engine_inflight_tasks", "") == 0 {
            return text;
        }
        assert!(Instant::now() < deadline, "tasks still in flight:\n{text}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn counters_equal_what_moved_over_each_transport() {
    let target = common::engine();
    let initiator = common::engine();
    let remote = Buf::new(1 << 20, 1);
    register(&target, &remote, true);
    let local = Buf::new(1 << 20, 2);
    register(&initiator, &local, true);
    let seg = initiator.open_segment(target.local_name()).unwrap();
    let before = initiator.metrics_text();
    assert_eq!(
        value(&before, "transfer_engine_registered_bytes", ""),
        1 << 20
    );
    assert_eq!(
        value(
            &before,
            "transfer_engine_tasks_total",
            "op=\"write\",result=\"canceled\""
        ),
        0,
        "every result has a series from the start"
    );

    // TCP: 3 WRITEs and 2 READs of known sizes, and 1 WRITE that fails
    // (outside the peer's buffers).
    let (r, l) = (remote.addr(), local.addr());
    let writes = [4096u64, 65536, 300_000];
    let reads = [8192u64, 100_000];
    let mut reqs: Vec<_> = writes
        .iter()
        .enumerate()
        .map(|(i, &n)| write_req(l + (i as u64) * 400_000 % (1 << 19), seg, r, n))
        .collect();
    reqs.extend(
        reads
            .iter()
            .map(|&n| read_req(l + (1 << 19), seg, r + 4096, n)),
    );
    assert!(
        run(&initiator, &reqs)
            .iter()
            .all(|s| *s == TaskStatus::Completed)
    );
    let bad = [write_req(l, seg, r + (4 << 20), 4096)];
    assert_eq!(run(&initiator, &bad), [TaskStatus::Failed]);

    // Local copies: 2 WRITEs and 1 READ within the initiator's buffer.
    let copies = [
        write_req(l, LOCAL_SEGMENT_ID, l + (1 << 19), 4096),
        write_req(l, LOCAL_SEGMENT_ID, l + (1 << 19), 1 << 18),
        read_req(l, LOCAL_SEGMENT_ID, l + (1 << 19), 12345),
    ];
    assert!(
        run(&initiator, &copies)
            .iter()
            .all(|s| *s == TaskStatus::Completed)
    );

    let text = settled(&initiator);
    let bytes = |t: &str, op: &str| {
        value(
            &text,
            "transfer_engine_transferred_bytes_total",
            &format!("transport=\"{t}\",op=\"{op}\""),
        )
    };
    assert_eq!(bytes("tcp", "write"), writes.iter().sum::<u64>());
    assert_eq!(bytes("tcp", "read"), reads.iter().sum::<u64>());
    assert_eq!(bytes("local", "write"), 4096 + (1 << 18));
    assert_eq!(bytes("local", "read"), 12345);
    assert_eq!(bytes("shm", "write") + bytes("rdma", "read"), 0);
    let tasks = |op: &str, result: &str| {
        value(
            &text,
            "transfer_engine_tasks_total",
            &format!("op=\"{op}\",result=\"{result}\""),
        )
    };
    assert_eq!(tasks("write", "completed"), 3 + 2);
    assert_eq!(tasks("read", "completed"), 2 + 1);
    assert_eq!(tasks("write", "failed"), 1);
    assert_eq!(tasks("read", "failed") + tasks("write", "canceled"), 0);
    assert_eq!(value(&text, "transfer_engine_inflight_bytes", ""), 0);
    let count = |t: &str, op: &str| {
        value(
            &text,
            "transfer_engine_task_duration_seconds_count",
            &format!("transport=\"{t}\",op=\"{op}\""),
        )
    };
    assert_eq!(count("tcp", "write"), 3 + 1, "the failed task too");
    assert_eq!(count("tcp", "read"), 2);
    assert_eq!((count("local", "write"), count("local", "read")), (2, 1));
    let inf = value(
        &text,
        "transfer_engine_task_duration_seconds_bucket",
        "transport=\"tcp\",op=\"write\",le=\"+Inf\"",
    );
    assert_eq!(inf, 4);
    assert_eq!(
        value(&text, "transfer_engine_peers", "transport=\"tcp\""),
        1
    );
    // The TCP transport's devices account for the bytes it moved.
    let device_bytes: u64 = text
        .lines()
        .filter(|l| {
            l.starts_with("transfer_engine_device_transferred_bytes_total{transport=\"tcp\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(
        device_bytes,
        writes.iter().sum::<u64>() + reads.iter().sum::<u64>()
    );
    // The target counts nothing it did not submit.
    let served = settled(&target);
    assert_eq!(
        value(
            &served,
            "transfer_engine_tasks_total",
            "op=\"write\",result=\"completed\""
        ),
        0
    );
}

#[test]
fn per_peer_series_are_bounded() {
    let initiator = common::engine_with(&[("MC_TE_METRICS_PEERS", "1")]);
    initiator.metrics_text(); // counting from here
    let local = Buf::new(1 << 16, 2);
    register(&initiator, &local, true);
    let targets: Vec<_> = (0..3).map(|_| common::engine()).collect();
    let bufs: Vec<_> = targets
        .iter()
        .map(|t| {
            let b = Buf::new(1 << 16, 1);
            register(t, &b, true);
            b
        })
        .collect();
    for (i, (t, b)) in targets.iter().zip(&bufs).enumerate() {
        let seg = initiator.open_segment(t.local_name()).unwrap();
        let reqs = [write_req(
            local.addr(),
            seg,
            b.addr(),
            1000 * (i as u64 + 1),
        )];
        assert_eq!(run(&initiator, &reqs), [TaskStatus::Completed]);
    }
    let text = settled(&initiator);
    let first = targets[0].local_name();
    let peer = |p: &str| {
        value(
            &text,
            "transfer_engine_peer_transferred_bytes_total",
            &format!("peer=\"{p}\",op=\"write\""),
        )
    };
    assert_eq!(peer(first), 1000);
    assert_eq!(peer("other"), 2000 + 3000);
    let series = text
        .lines()
        .filter(|l| l.starts_with("transfer_engine_peer_transferred_bytes_total{"))
        .count();
    assert_eq!(series, 2 * 2, "one peer and other, by op");
}

/// `GET path` on a new connection; the whole response.
fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn the_endpoint_serves_beside_hostile_clients_and_stops_with_its_engine() {
    let e = common::engine_with(&[("MC_TE_METRICS_ADDR", "127.0.0.1:0")]);
    let addr = e.metrics_addr().expect("serving");
    let b = Buf::new(8192, 1);
    register(&e, &b, true);
    let copy = [write_req(b.addr(), LOCAL_SEGMENT_ID, b.addr() + 4096, 4096)];
    assert_eq!(run(&e, &copy), [TaskStatus::Completed]);

    // A client that sends a request and never reads the replies, and one
    // that sends a head larger than any request.
    let mut silent = TcpStream::connect(addr).unwrap();
    for _ in 0..64 {
        silent
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
    }
    let mut oversize = TcpStream::connect(addr).unwrap();
    oversize
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = oversize.write_all(b"GET /metrics HTTP/1.1\r\nX-Pad: ");
    let _ = oversize.write_all(&vec![b'a'; 64 << 10]);

    let reply = get(addr, "/metrics");
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
    assert!(
        reply.contains("Content-Type: text/plain; version=0.0.4\r\n"),
        "{reply}"
    );
    let body = reply.split("\r\n\r\n").nth(1).unwrap();
    assert_eq!(
        value(
            body,
            "transfer_engine_transferred_bytes_total",
            "transport=\"local\",op=\"write\""
        ),
        4096
    );
    assert_eq!(body, settled(&e), "the same text as metrics_text");
    let missing = get(addr, "/other");
    assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
    let mut answer = Vec::new();
    let _ = oversize.shutdown(Shutdown::Write);
    oversize
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = oversize.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
        "{answer}"
    );

    // A scrape in progress holds the engine until it is written, so the
    // endpoint stops when the last one ends (within the bound).
    drop(e);
    let stopping = std::time::Instant::now();
    while TcpStream::connect(addr).is_ok() {
        assert!(
            stopping.elapsed() < Duration::from_secs(10),
            "still serving 10 s after its engine was dropped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(silent);
}

#[test]
fn tasks_are_counted_from_the_engine_creation_unless_counting_is_off() {
    let bytes = |t: &str| {
        value(
            t,
            "transfer_engine_transferred_bytes_total",
            "transport=\"local\",op=\"write\"",
        )
    };
    for (counting, want) in [("1", 8192), ("0", 0)] {
        let e = common::engine_with(&[("MC_TE_METRICS", counting)]);
        let b = Buf::new(8192, 1);
        register(&e, &b, true);
        let copy = [write_req(b.addr(), LOCAL_SEGMENT_ID, b.addr() + 4096, 4096)];
        // Moved before anything asked for the text: counted all the same.
        assert_eq!(run(&e, &copy), [TaskStatus::Completed]);
        assert_eq!(run(&e, &copy), [TaskStatus::Completed]);
        assert_eq!(bytes(&settled(&e)), want, "MC_TE_METRICS={counting}");
        e.shutdown();
    }
}

#[test]
fn an_address_that_cannot_be_listened_on_fails_the_engine() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let err = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .config(common::config_with(&[("MC_TE_METRICS_ADDR", &addr)]))
        .build()
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains(&format!("MC_TE_METRICS_ADDR={addr}")),
        "{err}"
    );
    let bad = transfer_engine::Config::from_lookup(|k| {
        (k == "MC_TE_METRICS_ADDR").then(|| "localhost".to_string())
    })
    .unwrap_err();
    assert!(
        bad.to_string()
            .contains("MC_TE_METRICS_ADDR=localhost is not an address"),
        "{bad}"
    );
}

#[test]
fn endpoint_pools_report_their_size_and_evictions() {
    // One endpoint per device: a second peer evicts the first one's.
    let me = common::engine_with(&[("MC_MAX_EP_PER_CTX", "1")]);
    let src = Buf::new(4096, 2);
    register(&me, &src, false);
    let pools = |t: &str| {
        (
            value(t, "transfer_engine_endpoints", "transport=\"tcp\""),
            value(
                t,
                "transfer_engine_endpoint_evictions_total",
                "transport=\"tcp\"",
            ),
        )
    };
    assert_eq!(pools(&me.metrics_text()), (0, 0));
    let peers: Vec<_> = (0..3).map(|_| common::engine()).collect();
    for (i, peer) in peers.iter().enumerate() {
        let dst = Buf::zeroed(4096);
        register(peer, &dst, true);
        let seg = me.open_segment(peer.local_name()).expect("open");
        let w = [write_req(src.addr(), seg, dst.addr(), 4096)];
        assert_eq!(run(&me, &w), [TaskStatus::Completed]);
        assert_eq!(dst.snapshot(), src.snapshot());
        assert_eq!(pools(&me.metrics_text()), (1, i as u64), "after peer {i}");
        peer.shutdown();
    }
    me.shutdown();
}
