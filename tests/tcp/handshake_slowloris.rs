//! A slowloris against the handshake port: hundreds of raw-socket clients
//! that connect and say nothing, or trickle a frame one byte at a time, and
//! reconnect as soon as the server closes them. Meanwhile a real client's
//! Probe and Metadata calls are all served promptly, and the process does not
//! grow a thread per attacking connection.

use crate::common;

use common::handshake::{FrameKind, call};
use common::proc::threads;
use common::*;
use serde_json::json;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Attacking connections held open at once: more than the listener's
/// default connection bound (256).
const ATTACKERS: usize = 400;
/// How long the real client keeps calling under attack.
const UNDER_ATTACK: Duration = Duration::from_secs(8);
/// Longest a real call may take under attack.
const PROMPT: Duration = Duration::from_secs(3);
/// Upper bound on the attack thread's life, whatever happens to the test.
const ATTACK_LIMIT: Duration = Duration::from_secs(60);

/// What the attack did.
#[derive(Default)]
struct AttackStats {
    /// Connections currently open (from the attacker's view).
    open: AtomicUsize,
    /// Connections opened in all.
    opened: AtomicUsize,
    /// Connections the server closed (EOF or reset).
    closed: AtomicUsize,
}

/// One attacking connection: silent, or trickling one byte of a frame
/// (declaring 1000 payload bytes) every 100 ms, never completing it within
/// the server's deadline.
struct Attacker {
    stream: TcpStream,
    trickle: bool,
    sent: usize,
    next_byte: Instant,
}

fn attack(addr: SocketAddr, stop: Arc<AtomicBool>, stats: Arc<AttackStats>) {
    let mut frame = 1001u64.to_le_bytes().to_vec();
    frame.push(1);
    frame.extend_from_slice(&[b' '; 1000]);
    let mut slots: Vec<Option<Attacker>> = (0..ATTACKERS).map(|_| None).collect();
    let end = Instant::now() + ATTACK_LIMIT;
    let mut buf = [0u8; 256];
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        for (i, slot) in slots.iter_mut().enumerate() {
            let Some(a) = slot else {
                // Reopen at once; a full backlog bounds the connect.
                if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(100)) {
                    s.set_nonblocking(true).unwrap();
                    *slot = Some(Attacker {
                        stream: s,
                        trickle: i % 2 == 1,
                        sent: 0,
                        next_byte: Instant::now(),
                    });
                    stats.opened.fetch_add(1, Ordering::Relaxed);
                    stats.open.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            };
            let mut alive = match a.stream.read(&mut buf) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => true,
                // EOF, a reset, or a reply to a frame that is never complete.
                _ => false,
            };
            if alive && a.trickle && a.sent < frame.len() && Instant::now() >= a.next_byte {
                match a.stream.write(&frame[a.sent..a.sent + 1]) {
                    Ok(n) => a.sent += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(_) => alive = false,
                }
                a.next_byte = Instant::now() + Duration::from_millis(100);
            }
            if !alive {
                *slot = None;
                stats.closed.fetch_add(1, Ordering::Relaxed);
                stats.open.fetch_sub(1, Ordering::Relaxed);
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn slow_and_silent_clients_do_not_deny_the_handshake_service() {
    let e = engine();
    let port = handshake_port(&e);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let threads_before = threads();

    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(AttackStats::default());
    let attacker = {
        let (stop, stats) = (stop.clone(), stats.clone());
        thread::spawn(move || attack(addr, stop, stats))
    };
    wait_for(
        "the attacker holds most of its connections",
        Duration::from_secs(20),
        || stats.open.load(Ordering::Relaxed) >= ATTACKERS * 3 / 4,
    );
    let start = Instant::now();
    let (mut attempted, mut served) = (0usize, 0usize);
    let mut latencies = Vec::new();
    let mut failures = Vec::new();
    let mut max_threads = threads();
    while start.elapsed() < UNDER_ATTACK {
        let kind = if attempted % 2 == 0 {
            FrameKind::Probe
        } else {
            FrameKind::Metadata
        };
        attempted += 1;
        let t = Instant::now();
        match call("127.0.0.1", port, kind, &json!({})) {
            Ok(reply) => {
                let ok = match kind {
                    FrameKind::Probe => reply == json!({"status": "success"}),
                    _ => reply["name"] == json!(e.local_name()),
                };
                assert!(ok, "{kind:?} reply {reply}");
                served += 1;
                latencies.push(t.elapsed());
            }
            Err(err) => failures.push(format!("{kind:?} after {:?}: {err}", t.elapsed())),
        }
        max_threads = max_threads.max(threads());
        thread::sleep(Duration::from_millis(50));
    }
    let held = stats.open.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    attacker.join().expect("attacker thread");

    latencies.sort();
    let median = latencies.get(latencies.len() / 2).copied();
    let worst = latencies.last().copied();
    // A connect whose SYN found the listen backlog full waits for the
    // kernel's retransmission (1 s).
    let slow = latencies
        .iter()
        .filter(|l| **l > Duration::from_millis(500))
        .count();
    println!(
        "under a slowloris of {ATTACKERS} connections ({} opened, {} closed by the server, \
         {held} open at the end): {served}/{attempted} calls served, median {median:?}, \
         worst {worst:?}, {slow} over 500 ms; threads {threads_before} before, at most \
         {max_threads} during",
        stats.opened.load(Ordering::Relaxed),
        stats.closed.load(Ordering::Relaxed),
    );
    assert!(failures.is_empty(), "calls failed: {failures:#?}");
    assert!(served >= 20, "only {served} calls in {UNDER_ATTACK:?}");
    let worst = worst.expect("served calls");
    assert!(worst < PROMPT, "slowest call took {worst:?}");
    // The attack thread, and nothing per attacking connection.
    assert!(
        max_threads <= threads_before + 2,
        "threads grew from {threads_before} to {max_threads}"
    );
    // The server closed attackers (deadline or eviction) and kept serving.
    assert!(stats.closed.load(Ordering::Relaxed) > 0);
    e.shutdown();
}
