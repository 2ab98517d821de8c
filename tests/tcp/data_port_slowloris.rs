//! A slowloris on the data port (the engines' configuration:
//! `MC_TCP_MAX_DATA_CONNECTIONS=64`): 200 connections that trickle a byte
//! every second, half of them never finishing a request header and half a
//! WRITE payload, reopened as soon as the server closes them. The server
//! keeps at most 64 sessions, and a real peer moving verified bytes at the
//! same time is served: at the bound, a connection whose request has been
//! incomplete the longest makes room, and a header must arrive whole
//! within 10 s.

use crate::common;

use common::*;
use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use transfer_engine::TaskStatus;

const CAP: usize = 64;
const ATTACKERS: usize = 200;
const ROUND: usize = 4 << 20;

/// One attacking connection: its socket and whether it trickles a header
/// (else a WRITE payload).
struct Trickler {
    s: TcpStream,
    header: bool,
}

fn open(port: u16, header: bool, target: u64) -> Option<Trickler> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_nonblocking(true).ok()?;
    let h = raw_header(1 << 20, target, 0x81);
    // A header trickler sends 10 of the 24 header bytes; a payload
    // trickler the whole header and the first payload byte.
    let first: Vec<u8> = if header {
        h[..10].to_vec()
    } else {
        let mut v = h.to_vec();
        v.push(0xEE);
        v
    };
    s.write_all(&first).ok()?;
    Some(Trickler { s, header })
}

#[test]
fn trickling_connections_do_not_lock_out_a_real_peer() {
    let cap = CAP.to_string();
    let settings = [("MC_TCP_MAX_DATA_CONNECTIONS", cap.as_str())];
    let target = engine_with(&settings);
    let initiator = engine_with(&settings);
    let mem = Buf::new(ROUND, 1);
    register(&target, &mem, true);
    // The tricklers' WRITEs go to a buffer of their own.
    let decoy = Buf::new(1 << 20, 2);
    register(&target, &decoy, true);
    let port = data_port(&target);
    let base = mem.addr();
    let decoy_at = decoy.addr();

    let stop = Arc::new(AtomicBool::new(false));
    let reopened = Arc::new(AtomicUsize::new(0));
    let attack = {
        let (stop, reopened) = (stop.clone(), reopened.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut conns: Vec<Option<Trickler>> = (0..ATTACKERS)
                .map(|i| open(port, i % 2 == 0, decoy_at))
                .collect();
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_secs(1));
                for (i, c) in conns.iter_mut().enumerate() {
                    let alive = c.as_mut().is_some_and(|t| {
                        // One byte of the header's rest or of the payload.
                        let b = if t.header { 0u8 } else { 0xEE };
                        !matches!(t.s.write(&[b]), Err(e) if e.kind() != std::io::ErrorKind::WouldBlock)
                    });
                    if !alive {
                        reopened.fetch_add(1, Ordering::Relaxed);
                        *c = open(port, i % 2 == 0, decoy_at);
                    }
                }
            }
        })
    };
    std::thread::sleep(Duration::from_secs(2));

    let seg = initiator
        .open_segment(target.local_name())
        .expect("open the target");
    let src = Buf::new(ROUND, 7);
    let back = Buf::zeroed(ROUND);
    let start = Instant::now();
    let mut rounds = 0;
    while start.elapsed() < Duration::from_secs(14) {
        let t = Instant::now();
        let w = run_within(
            &initiator,
            &[write_req(src.addr(), seg, base, ROUND as u64)],
            Duration::from_secs(30),
        );
        let r = run_within(
            &initiator,
            &[read_req(back.addr(), seg, base, ROUND as u64)],
            Duration::from_secs(30),
        );
        assert_eq!(
            (w[0], r[0]),
            (TaskStatus::Completed, TaskStatus::Completed),
            "round {rounds} under the slowloris"
        );
        assert!(
            back.snapshot() == src.snapshot(),
            "round {rounds}: bytes differ"
        );
        rounds += 1;
        if t.elapsed() > Duration::from_secs(1) {
            println!("round {rounds} took {:?}", t.elapsed());
        }
    }
    stop.store(true, Ordering::Relaxed);
    attack.join().unwrap();
    let reopened = reopened.load(Ordering::Relaxed);
    println!(
        "{rounds} verified rounds during the slowloris; the server closed {reopened} trickling connections"
    );
    assert!(
        reopened >= ATTACKERS - CAP,
        "only {reopened} trickling connections were closed (cap {CAP})"
    );
    initiator.shutdown();
    target.shutdown();
}
