//! Thousands of idle connections to the data port, as an attacker would
//! hold them (the engines' configuration: `MC_TCP_MAX_DATA_CONNECTIONS=
//! 256`, `MC_TCP_IDLE_TIMEOUT_SEC=3`). The server holds at most 256 of them
//! and no thread per connection; a real peer still moves verified bytes and
//! the handshake port still answers; idle sessions are closed after the
//! timeout.

use crate::common;

use common::handshake::{FrameKind, call};
use common::proc::{fds, raise_fd_limit, threads};
use common::*;
use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

const CAP: usize = 256;
const ATTACKERS: usize = 3000;

/// Whether the server closed this connection (EOF or reset).
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

#[test]
fn idle_connections_are_bounded_and_real_peers_are_served() {
    let cap = CAP.to_string();
    let settings = [
        ("MC_TCP_MAX_DATA_CONNECTIONS", cap.as_str()),
        ("MC_TCP_IDLE_TIMEOUT_SEC", "3"),
    ];
    raise_fd_limit(2 * ATTACKERS + 1000);
    let target = engine_with(&settings);
    let initiator = engine_with(&settings);
    let mem = Buf::new(4 << 20, 1);
    register(&target, &mem, true);
    let port = data_port(&target);
    let threads_before = threads();
    let fds_before = fds();

    let mut attackers: Vec<TcpStream> = (0..ATTACKERS)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let held_by_server = fds() - fds_before - ATTACKERS;
    println!(
        "{ATTACKERS} idle connections: threads {threads_before} -> {}, server-side descriptors {held_by_server}",
        threads()
    );
    // Transient threads (the handshake listener's) may come and go.
    assert!(
        threads() <= threads_before + 2,
        "threads grew with the connections: {threads_before} -> {}",
        threads()
    );
    assert!(
        held_by_server <= CAP + 8,
        "the server holds {held_by_server} connections (cap {CAP})"
    );

    // A real peer, while the attacker holds its connections.
    let seg = initiator
        .open_segment(target.local_name())
        .expect("open the target's segment through the handshake port");
    let src = Buf::new(4 << 20, 9);
    let back = Buf::zeroed(4 << 20);
    let st = run(
        &initiator,
        &[write_req(src.addr(), seg, mem.addr(), 4 << 20)],
    );
    assert_eq!(st, [transfer_engine::TaskStatus::Completed]);
    let st = run(
        &initiator,
        &[read_req(back.addr(), seg, mem.addr(), 4 << 20)],
    );
    assert_eq!(st, [transfer_engine::TaskStatus::Completed]);
    assert!(back.snapshot() == src.snapshot(), "bytes differ");
    let (host, rpc) = target
        .local_ip_and_port()
        .rsplit_once(':')
        .map(|(h, p)| (h.to_string(), p.parse::<u16>().unwrap()))
        .unwrap();
    call(&host, rpc, FrameKind::Probe, &serde_json::json!({})).expect("the handshake port answers");

    // Idle sessions are closed after MC_TCP_IDLE_TIMEOUT_SEC.
    std::thread::sleep(Duration::from_secs(5));
    let open = attackers
        .iter_mut()
        .map(closed_by_server)
        .filter(|closed| !closed)
        .count();
    assert_eq!(
        open, 0,
        "{open} idle connections are still open after the timeout"
    );
    drop(attackers);
    initiator.shutdown();
    target.shutdown();
}
