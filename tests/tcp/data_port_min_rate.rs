//! The minimum rate of a request on the data port (the engine's
//! configuration: `MC_TCP_MIN_RATE_BYTES_PER_SEC=8192`,
//! `MC_TCP_MIN_RATE_WINDOW_SEC=3`), with no pressure on the connection
//! bound. A READ drained 1 KiB a second and a WRITE whose payload trickles
//! 64 bytes a second keep moving within `MC_TCP_STATUS_TIMEOUT_SEC`, yet
//! each is dropped once it has been in progress for a window, and the drop
//! is logged; a READ and a WRITE of 8 MiB paced at 1 MiB/s (128 times the
//! minimum, for several windows: the READ is larger than what the kernel's
//! socket buffers absorb; a stall of the pacing thread is made up
//! afterwards) complete with every byte right.

use crate::common;

use common::readers::{Reader, Took};
use common::*;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

const MIN_RATE: usize = 8 << 10;
const WINDOW: Duration = Duration::from_secs(3);
/// The paced requests' length and pace.
const PACED: usize = 8 << 20;
const PACE: f64 = (1 << 20) as f64;
/// How long after its window a slow request may still be open: a "no
/// hang" verdict.
const SLACK: Duration = Duration::from_secs(20);

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

/// Bytes allowed by `PACE` after `start`, at most `len`.
fn allowed(start: Instant, len: usize) -> usize {
    ((start.elapsed().as_secs_f64() * PACE) as usize).min(len)
}

/// A READ of `PACED` bytes taken at `PACE`; returns whether all arrived.
fn paced_read(port: u16, addr: u64, seed: u8) -> bool {
    let mut r = Reader::open(port, 64 << 10, addr, PACED, seed, 0);
    let start = Instant::now();
    while !r.done() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "paced READ hangs"
        );
        let want = allowed(start, PACED + 8).saturating_sub(r.got());
        if want > 0 && r.take(want) == Took::Closed {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A v2 WRITE of `data` sent at `PACE`; returns whether it was
/// acknowledged with OK.
fn paced_write(port: u16, addr: u64, data: &[u8]) -> bool {
    let mut s = connect(port);
    if s.write_all(&raw_header(data.len() as u64, addr, 0x81))
        .is_err()
    {
        return false;
    }
    let start = Instant::now();
    let mut sent = 0;
    while sent < data.len() {
        let upto = allowed(start, data.len());
        if upto > sent {
            if s.write_all(&data[sent..upto]).is_err() {
                return false;
            }
            sent = upto;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut w = [0u8; 8];
    s.read_exact(&mut w).is_ok() && word_of(&w) == OK_WORD
}

/// A v2 WRITE of 1 MiB whose payload trickles 64 bytes a second; returns
/// how long after the header the server closed the connection.
fn trickled_write(port: u16, addr: u64) -> Duration {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(&raw_header(1 << 20, addr, 0x81)).unwrap();
    let start = Instant::now();
    s.set_nonblocking(true).unwrap();
    loop {
        assert!(
            start.elapsed() < WINDOW + SLACK,
            "a WRITE trickling 64 bytes a second is still served after {:?}",
            start.elapsed()
        );
        let mut b = [0u8; 8];
        match s.read(&mut b) {
            Ok(0) => return start.elapsed(),
            Ok(n) => panic!("the server answered {n} bytes to an unfinished WRITE"),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => return start.elapsed(),
        }
        if matches!(s.write(&[0xEE; 64]), Err(e) if e.kind() != ErrorKind::WouldBlock) {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A READ of 64 MiB through a 4 KiB receive buffer, drained 1 KiB a
/// second; returns how long after the request the server closed it.
fn drained_read(port: u16, addr: u64, seed: u8) -> Duration {
    let mut r = Reader::open(port, 4096, addr, 64 << 20, seed, 0);
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < WINDOW + SLACK,
            "a READ drained 1 KiB a second is still served after {:?} ({} bytes taken)",
            start.elapsed(),
            r.got()
        );
        if r.take(1024) == Took::Closed {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn requests_slower_than_the_minimum_rate_are_dropped() {
    let (min_rate, window) = (MIN_RATE.to_string(), WINDOW.as_secs().to_string());
    let warnings = Arc::new(Mutex::new(Vec::new()));
    tracing_subscriber::registry()
        .with(Warnings(warnings.clone()))
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .init();
    let target = engine_with(&[
        ("MC_TCP_MIN_RATE_BYTES_PER_SEC", min_rate.as_str()),
        ("MC_TCP_MIN_RATE_WINDOW_SEC", window.as_str()),
    ]);
    let bait = Buf::new(64 << 20, 3);
    register(&target, &bait, true);
    let decoy = Buf::new(1 << 20, 4);
    register(&target, &decoy, true);
    let landing = Buf::zeroed(PACED);
    register(&target, &landing, true);
    let port = data_port(&target);
    let (bait_at, decoy_at, landing_at) = (bait.addr(), decoy.addr(), landing.addr());

    let drained = std::thread::spawn(move || drained_read(port, bait_at, 3));
    let trickled = std::thread::spawn(move || trickled_write(port, decoy_at));
    let read = std::thread::spawn(move || paced_read(port, bait_at, 3));
    let payload = pattern(PACED, 5);
    let written = paced_write(port, landing_at, &payload);

    let drained = drained.join().unwrap();
    let trickled = trickled.join().unwrap();
    println!("dropped after {drained:?} (slow READ) and {trickled:?} (slow WRITE)");
    for (what, after) in [("READ", drained), ("WRITE", trickled)] {
        assert!(
            after >= WINDOW,
            "the slow {what} was dropped after {after:?}, before its window of {WINDOW:?}"
        );
    }
    assert!(
        read.join().unwrap(),
        "a READ taken at 128 times the minimum rate was dropped"
    );
    assert!(
        written,
        "a WRITE sent at 128 times the minimum rate was not acknowledged"
    );
    assert!(
        landing.snapshot() == payload,
        "the paced WRITE's bytes differ"
    );
    let warnings = warnings.lock().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("MC_TCP_MIN_RATE_BYTES_PER_SEC")),
        "no warning names the minimum rate: {warnings:?}"
    );
    target.shutdown();
}
