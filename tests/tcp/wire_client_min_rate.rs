//! The minimum rate on our initiator's connections (the engine's
//! configuration: `MC_TCP_MIN_RATE_BYTES_PER_SEC=16384`,
//! `MC_TCP_MIN_RATE_WINDOW_SEC=2`, one lane per peer), against
//! hand-written peers on raw sockets. A peer that trickles a READ's reply
//! 1 KiB a second, and one that reads a WRITE's payload 1 KiB a second
//! through a 4 KiB receive buffer, move a byte well within
//! `MC_TCP_STATUS_TIMEOUT_SEC` (30 s) every time, yet each request FAILS
//! within a few seconds of its window, its connection is reset, and the
//! reset is logged. A READ and a WRITE of 768 KiB paced at 128 KiB/s (8
//! times the minimum, for three windows) complete with every byte right,
//! and so do small READs kept in flight by two callers against a peer
//! that answers each after 200 ms (a latency-bound peer answers all it is
//! asked within a window, however few bytes that is).

use crate::common;

use common::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use transfer_engine::TaskStatus;
use transfer_engine::{Engine, Request};

const BASE: u64 = 0x3000_0000;
const MIN_RATE: usize = 16 << 10;
const WINDOW: Duration = Duration::from_secs(2);
/// How long after its window a slow request may still be WAITING: a
/// "no hang" bound, far below what the old rules allowed (the trickles
/// below last over 1000 s and never stall for 30 s).
const SLACK: Duration = Duration::from_secs(8);
/// The slow requests: 1 MiB, moved 1 KiB a second.
const SLOW_LEN: usize = 1 << 20;
const TRICKLE: Action = Action::Paced {
    chunk: 1024,
    every: Duration::from_secs(1),
};
/// The receive buffer of the peers that read WRITE payloads.
const RCVBUF: usize = 4096;
/// The paced requests: 768 KiB at 16 KiB every 125 ms (128 KiB/s).
const PACED_LEN: usize = 768 << 10;
const PACE: Action = Action::Paced {
    chunk: 16 << 10,
    every: Duration::from_millis(125),
};
/// The latency-bound peer: every request answered 200 ms after it is read.
const LATENCY: Action = Action::Paced {
    chunk: 1 << 20,
    every: Duration::from_millis(200),
};
const SMALL: usize = 64;
const SMALL_PER_CALLER: usize = 10;

/// Keeps the text of every WARN line.
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Message<'a>(&'a mut String);

impl tracing::field::Visit for Message<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut text = String::new();
            event.record(&mut Message(&mut text));
            self.0.lock().unwrap().push(text);
        }
    }
}

/// A fake v2 peer holding `pattern(len, seed)` at BASE, and the responder
/// that publishes it.
struct Peer {
    server: FakeServer,
    hs: HandshakeResponder,
}

impl Peer {
    fn start(len: usize, seed: u8, rcvbuf: Option<usize>, action: Action) -> Peer {
        let mem = pattern(len, seed);
        let server = match rcvbuf {
            Some(n) => FakeServer::start_with_recv_buffer(n, mem, BASE, false, move |_| action),
            None => FakeServer::start(mem, BASE, false, move |_| action),
        };
        let port = server.port;
        let hs = HandshakeResponder::start(|rpc| tcp_descriptor(rpc, port, 2, BASE, len as u64));
        Peer { server, hs }
    }
}

/// Runs one request to its end (at most `within`); its status and how
/// long it took.
fn timed(e: &Engine, req: Request, within: Duration) -> (TaskStatus, Duration) {
    let b = e.allocate_batch(1).expect("batch");
    let start = Instant::now();
    e.submit(b, &[req]).expect("submit");
    let status = wait_task(e, b, 0, within);
    let took = start.elapsed();
    e.free_batch(b).expect("free batch");
    (status, took)
}

/// A request to a peer that moves 1 KiB a second: FAILED within a few
/// seconds of the window, with its connection reset.
fn slow(e: &Engine, peer: &Peer, req: impl FnOnce(i32) -> Request, what: &str) -> Duration {
    let seg = e.open_segment(&peer.hs.name()).expect("open segment");
    let (status, took) = timed(e, req(seg), WINDOW + SLACK);
    assert_eq!(status, TaskStatus::Failed, "the trickled {what}");
    assert!(
        took >= WINDOW,
        "the trickled {what} failed after {took:?}, before its window of {WINDOW:?}"
    );
    wait_for(
        &format!("the trickled {what}'s connection closes"),
        Duration::from_secs(5),
        || peer.server.ended() >= 1,
    );
    took
}

#[test]
fn peers_slower_than_the_minimum_rate_fail_their_requests() {
    let (min_rate, window) = (MIN_RATE.to_string(), WINDOW.as_secs().to_string());
    let warnings = Arc::new(Mutex::new(Vec::new()));
    tracing_subscriber::registry()
        .with(Warnings(warnings.clone()))
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .init();
    let engine = engine_with(&[
        ("MC_TCP_MIN_RATE_BYTES_PER_SEC", min_rate.as_str()),
        ("MC_TCP_MIN_RATE_WINDOW_SEC", window.as_str()),
        ("MC_TCP_LANES_PER_PEER", "1"),
    ]);
    let e: &Engine = &engine;

    let trickled = Peer::start(SLOW_LEN, 1, None, TRICKLE);
    let slow_reader = Peer::start(SLOW_LEN, 2, Some(RCVBUF), TRICKLE);
    let paced_reply = Peer::start(PACED_LEN, 3, None, PACE);
    let paced_reader = Peer::start(PACED_LEN, 4, Some(RCVBUF), PACE);
    let distant = Peer::start(4096, 5, None, LATENCY);

    let read_dst = Buf::zeroed(SLOW_LEN);
    let write_src = Buf::new(SLOW_LEN, 6);
    let paced_dst = Buf::zeroed(PACED_LEN);
    let paced_src = Buf::new(PACED_LEN, 7);
    let small_dst = Buf::zeroed(2 * SMALL_PER_CALLER * SMALL);

    let (slow_read, slow_write, paced, small) = std::thread::scope(|s| {
        let slow_read = s.spawn(|| {
            slow(
                e,
                &trickled,
                |seg| read_req(read_dst.addr(), seg, BASE, SLOW_LEN as u64),
                "READ",
            )
        });
        let slow_write = s.spawn(|| {
            slow(
                e,
                &slow_reader,
                |seg| write_req(write_src.addr(), seg, BASE, SLOW_LEN as u64),
                "WRITE",
            )
        });
        let paced = s.spawn(|| {
            let read_seg = e.open_segment(&paced_reply.hs.name()).expect("open");
            let write_seg = e.open_segment(&paced_reader.hs.name()).expect("open");
            let len = PACED_LEN as u64;
            let start = Instant::now();
            let reqs = [
                read_req(paced_dst.addr(), read_seg, BASE, len),
                write_req(paced_src.addr(), write_seg, BASE, len),
            ];
            let statuses = run_within(e, &reqs, Duration::from_secs(60));
            (statuses, start.elapsed())
        });
        let small = s.spawn(|| {
            let seg = e.open_segment(&distant.hs.name()).expect("open");
            let start = Instant::now();
            // Two callers, each with one small READ at a time: one lane
            // always has a request in flight, and moves a few hundred
            // bytes a second.
            let statuses: Vec<TaskStatus> = std::thread::scope(|s| {
                let callers: Vec<_> = (0..2)
                    .map(|caller| {
                        let small_dst = &small_dst;
                        s.spawn(move || {
                            (0..SMALL_PER_CALLER)
                                .map(|i| {
                                    let at = (caller * SMALL_PER_CALLER + i) * SMALL;
                                    let req = read_req(
                                        small_dst.addr() + at as u64,
                                        seg,
                                        BASE + at as u64,
                                        SMALL as u64,
                                    );
                                    timed(e, req, Duration::from_secs(30)).0
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                callers
                    .into_iter()
                    .flat_map(|c| c.join().unwrap())
                    .collect()
            });
            (statuses, start.elapsed())
        });
        (
            slow_read.join(),
            slow_write.join(),
            paced.join().unwrap(),
            small.join().unwrap(),
        )
    });
    let (paced_statuses, paced_took) = paced;
    let (small_statuses, small_took) = small;
    println!(
        "trickled READ failed after {:?}, slowly read WRITE after {:?}; paced READ and WRITE took {paced_took:?}, small READs {small_took:?}",
        slow_read.as_ref().ok(),
        slow_write.as_ref().ok(),
    );
    // The legitimate transfers first: they must not pay for the rule.
    assert_eq!(
        paced_statuses,
        vec![TaskStatus::Completed; 2],
        "a READ and a WRITE at 8 times the minimum rate"
    );
    assert!(
        paced_dst.snapshot() == pattern(PACED_LEN, 3),
        "the paced READ's bytes differ"
    );
    assert!(
        paced_reader.server.mem(BASE, PACED_LEN) == paced_src.snapshot(),
        "the paced WRITE's bytes differ"
    );
    assert_eq!(
        small_statuses,
        vec![TaskStatus::Completed; 2 * SMALL_PER_CALLER],
        "small READs from a peer that answers each after 200 ms"
    );
    assert!(
        small_dst.snapshot() == pattern(2 * SMALL_PER_CALLER * SMALL, 5),
        "the small READs' bytes differ"
    );
    if let Err(p) = slow_read {
        std::panic::resume_unwind(p);
    }
    if let Err(p) = slow_write {
        std::panic::resume_unwind(p);
    }
    let warnings = warnings.lock().unwrap();
    let ports = [trickled.server.port, slow_reader.server.port];
    assert!(
        warnings.iter().any(|w| {
            w.contains("MC_TCP_MIN_RATE_BYTES_PER_SEC")
                && ports
                    .iter()
                    .any(|p| w.contains(&format!("reset the connection to 127.0.0.1:{p}")))
        }),
        "no warning names the minimum rate and a slow peer: {warnings:?}"
    );
    for port in [
        paced_reply.server.port,
        paced_reader.server.port,
        distant.server.port,
    ] {
        assert!(
            !warnings
                .iter()
                .any(|w| w.contains(&format!("127.0.0.1:{port}"))),
            "a warning about a peer that kept the pace: {warnings:?}"
        );
    }
    drop(warnings);
    e.shutdown();
}
