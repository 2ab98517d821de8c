//! Our handshake listener (spec §3) spoken to from raw sockets: frames are
//! built and parsed byte by byte here (`[u64 LE length][u8 type][JSON]`,
//! length = 1 + payload), not with the library's frame codec.

use crate::common;

use common::*;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

const PROMPT: Duration = Duration::from_secs(2);

/// A typed frame, by hand.
fn typed(kind: u8, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u64 + 1;
    let mut f: Vec<u8> = (0..8).map(|i| (len >> (8 * i)) as u8).collect();
    f.push(kind);
    f.extend_from_slice(payload);
    f
}

/// An old-protocol frame (no type byte), by hand.
fn untyped(payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u64;
    let mut f: Vec<u8> = (0..8).map(|i| (len >> (8 * i)) as u8).collect();
    f.extend_from_slice(payload);
    f
}

/// Sends `frame`, reads the whole reply until the server closes (it
/// half-closes after replying; we then close too).
fn exchange(port: u16, frame: &[u8]) -> Vec<u8> {
    let mut c = connect(port);
    c.write_all(frame).unwrap();
    let reply = read_until_closed(&mut c, Duration::from_secs(10));
    drop(c);
    reply
}

/// Splits a reply into (type byte, JSON), checking the length field.
fn parse_typed(reply: &[u8]) -> (u8, Value) {
    assert!(reply.len() >= 9, "short reply {reply:02x?}");
    let len = reply[..8]
        .iter()
        .enumerate()
        .fold(0u64, |w, (i, b)| w | u64::from(*b) << (8 * i));
    assert_eq!(len as usize, reply.len() - 8, "length = 1 + payload length");
    let payload = &reply[9..];
    assert_eq!(
        payload.last(),
        Some(&b'\n'),
        "FastWriter-style trailing newline"
    );
    (
        reply[8],
        serde_json::from_slice(payload).expect("reply JSON"),
    )
}

fn probe_ok(port: u16) {
    let t0 = Instant::now();
    let (kind, v) = parse_typed(&exchange(port, &typed(3, b"{}\n")));
    assert_eq!(kind, 3);
    assert_eq!(v, json!({"status": "success"}));
    let took = t0.elapsed();
    assert!(took < PROMPT, "probe took {took:?}");
}

#[test]
fn probe_gets_success() {
    let e = engine();
    let port = handshake_port(&e);
    probe_ok(port);
    // The server half-closes after its reply, and waits for our EOF.
    let mut c = connect(port);
    c.write_all(&typed(3, b"{}")).unwrap();
    let mut reply = Vec::new();
    c.read_to_end(&mut reply).unwrap();
    assert_eq!(parse_typed(&reply).1["status"], "success");
    c.shutdown(Shutdown::Write).unwrap();
    e.shutdown();
}

#[test]
fn metadata_returns_our_descriptor() {
    let e = engine();
    let mem = Buf::new(1 << 16, 1);
    let private = Buf::new(4096, 2);
    register(&e, &mem, true);
    register(&e, &private, false);
    // The request carries the caller's own descriptor, which is ignored.
    let caller = tcp_descriptor(1, 2, 2, 0x1000_0000, 4096).to_string() + "\n";
    let (kind, d) = parse_typed(&exchange(handshake_port(&e), &typed(1, caller.as_bytes())));
    assert_eq!(kind, 1);
    assert_eq!(d["name"], Value::from(e.local_name()));
    assert_eq!(d["protocol"], "tcp");
    assert_eq!(d["tcp_proto_version"].as_u64(), Some(2));
    let port = d["tcp_data_port"].as_u64().expect("integer tcp_data_port");
    assert!(port > 0 && port <= 65535);
    assert!(d["timestamp"].is_string());
    let buffers = d["buffers"].as_array().expect("buffers");
    for b in buffers {
        assert!(b["addr"].is_u64() && b["addr"].as_u64() != Some(0), "{b}");
        assert!(
            b["length"].is_u64() && b["length"].as_u64() != Some(0),
            "{b}"
        );
        assert!(!b["name"].as_str().unwrap_or("").is_empty(), "{b}");
    }
    assert!(
        buffers.iter().any(
            |b| b["addr"].as_u64() == Some(mem.addr()) && b["length"].as_u64() == Some(1 << 16)
        ),
        "the registered buffer is published: {d}"
    );
    // The published data port serves the published buffer.
    let mut c = connect(port as u16);
    c.write_all(&raw_header(100, mem.addr() + 5, 0x80)).unwrap();
    let mut got = [0u8; 108];
    c.read_exact(&mut got).unwrap();
    assert_eq!(got[..8], status_bytes(OK_WORD));
    assert_eq!(got[8..], mem.get(5, 100));
    e.shutdown();
}

#[test]
fn notify_is_queued_for_the_engine() {
    let e = engine();
    let (kind, v) = parse_typed(&exchange(
        handshake_port(&e),
        &typed(2, br#"{"name":"n","notify_msg":"m"}"#),
    ));
    assert_eq!(kind, 2);
    assert!(v.get("notify_msg").is_some(), "reply {v}");
    assert_eq!(e.take_notifies(), vec![("n".to_string(), "m".to_string())]);
    assert!(e.take_notifies().is_empty());
    e.shutdown();
}

#[test]
fn connection_request_is_refused_without_rdma() {
    let e = engine();
    let req = json!({
        "local_nic_path": "10.0.0.1:12345@mlx5_0", "local_lid": 0,
        "local_gid": "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01",
        "peer_nic_path": format!("{}@mlx5_0", e.local_name()),
        "qp_num": [17, 18], "reply_msg": ""
    });
    let (kind, v) = parse_typed(&exchange(
        handshake_port(&e),
        &typed(0, req.to_string().as_bytes()),
    ));
    assert_eq!(kind, 0);
    let msg = v["reply_msg"].as_str().expect("reply_msg string");
    assert!(!msg.is_empty(), "a refusal carries a reason");
    e.shutdown();
}

#[test]
fn legacy_untyped_frame_is_answered_without_type_byte() {
    let e = engine();
    let req =
        json!({"local_nic_path": "a@b", "peer_nic_path": "c@d", "qp_num": [], "reply_msg": ""});
    let reply = exchange(handshake_port(&e), &untyped(req.to_string().as_bytes()));
    assert!(reply.len() > 8);
    let len = reply[..8]
        .iter()
        .enumerate()
        .fold(0u64, |w, (i, b)| w | u64::from(*b) << (8 * i));
    assert_eq!(len as usize, reply.len() - 8, "length = payload length");
    assert_eq!(reply[8], b'{', "no type byte before the JSON");
    let v: Value = serde_json::from_slice(&reply[8..]).expect("JSON");
    // Legacy frames are Connection requests, refused here.
    assert!(!v["reply_msg"].as_str().unwrap_or("").is_empty(), "{v}");
    e.shutdown();
}

#[test]
fn frames_at_the_limits_are_served() {
    let e = engine();
    let port = handshake_port(&e);
    // Length 790 encodes as 16 03 00 ...: TLS-like, but a valid frame.
    let mut payload = b"{}".to_vec();
    payload.resize(789, b' ');
    let f = typed(3, &payload);
    assert_eq!(&f[..3], &[0x16, 0x03, 0x00]);
    assert_eq!(parse_typed(&exchange(port, &f)).0, 3);
    // Exactly the 1 MiB default limit (type byte included).
    let mut payload = b"{}".to_vec();
    payload.resize((1 << 20) - 1, b' ');
    let (kind, v) = parse_typed(&exchange(port, &typed(3, &payload)));
    assert_eq!((kind, v["status"].as_str()), (3, Some("success")));
    e.shutdown();
}

/// Bad frames and silent clients each lose only their own connection
/// (closed without a reply), while other clients are served promptly.
#[test]
fn bad_frames_close_only_their_connection() {
    let e = engine();
    let port = handshake_port(&e);
    let mut big = ((1u64 << 20) + 2).to_le_bytes().to_vec();
    big.push(1);
    big.extend_from_slice(&[b' '; 4096]);
    let mut tls = vec![
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    tls.extend(Rng::new(7).bytes(32));
    let mut truncated = typed(1, &[b' '; 100]);
    truncated.truncate(30);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("zero length", 0u64.to_le_bytes().to_vec()),
        ("length over 1 MiB", big),
        (
            "HTTP request",
            b"GET /metadata HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
        ("TLS ClientHello", tls),
        ("bad JSON", typed(1, b"{\"name\": oops")),
        ("bad legacy JSON", untyped(b"{{{{")),
        ("truncated frame", truncated),
        ("silent client", Vec::new()),
    ];
    // All bad clients connect first and stay connected.
    let mut bad: Vec<(&str, TcpStream)> = cases
        .iter()
        .map(|(what, bytes)| {
            let mut c = connect(port);
            if !bytes.is_empty() {
                c.write_all(bytes).unwrap();
            }
            (*what, c)
        })
        .collect();
    // Meanwhile a good client is served at once, several times.
    for _ in 0..3 {
        probe_ok(port);
    }
    // Every bad connection is closed by the server, without a reply.
    for (what, c) in &mut bad {
        let got = read_until_closed(c, Duration::from_secs(15));
        assert!(got.is_empty(), "{what}: got a reply {got:02x?}");
    }
    probe_ok(port);
    // A silent client arriving after all that does not delay others either.
    let _silent = connect(port);
    probe_ok(port);
    e.shutdown();
}
