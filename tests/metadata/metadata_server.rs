//! The HTTP metadata server and the HTTP store client together: routes and
//! status codes, persistence across a restart, and failure on a dead port.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;
use transfer_engine::Error;
use transfer_engine::metadata::descriptor::{BufferDesc, SegmentDesc};
use transfer_engine::metadata::http::HttpStore;
use transfer_engine::metadata::keys::{RpcMeta, rpc_meta_key, segment_key};
use transfer_engine::metadata::server::{MetadataServer, ServerOptions};
use transfer_engine::metadata::store::MetadataStore;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("te-metadata-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Sends one raw HTTP/1.1 request and returns (status, body).
fn raw(addr: SocketAddr, method: &str, target: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn tcp_desc() -> SegmentDesc {
    SegmentDesc {
        name: "10.0.0.5:12345".into(),
        protocol: "tcp".into(),
        tcp_data_port: 15873,
        tcp_proto_version: 2,
        timestamp: "2026-08-22 13:12:18.123456".into(),
        buffers: vec![BufferDesc {
            name: "10.0.0.5:12345".into(),
            addr: 0x7f00_0000_1000,
            length: 1 << 30,
            ..BufferDesc::default()
        }],
        ..SegmentDesc::default()
    }
}

#[test]
fn store_round_trip_through_server() {
    let dir = TempDir::new("store");
    let server =
        MetadataServer::start("127.0.0.1:0", "/metadata", Some(dir.0.join("data.json"))).unwrap();
    let url = server.url();
    assert_eq!(
        url,
        format!("http://127.0.0.1:{}/metadata", server.local_addr().port())
    );
    let store = HttpStore::new(&url).unwrap();

    let key = segment_key(None, "10.0.0.5:12345");
    assert_eq!(store.get(&key).unwrap(), None);

    let desc = tcp_desc();
    store.set(&key, &desc.to_json()).unwrap();
    let got = store.get(&key).unwrap().unwrap();
    assert_eq!(SegmentDesc::from_json(&got).unwrap(), desc);

    // PUT overwrites.
    let mut newer = desc.clone();
    newer.buffers[0].length = 4096;
    store.set(&key, &newer.to_json()).unwrap();
    let got = SegmentDesc::from_json(&store.get(&key).unwrap().unwrap()).unwrap();
    assert_eq!(got.buffers[0].length, 4096);

    let rpc_key = rpc_meta_key(Some("c1"), "10.0.0.5:12345");
    let meta = RpcMeta {
        ip_or_host_name: "10.0.0.5".into(),
        rpc_port: 16001,
    };
    store.set(&rpc_key, &meta.to_json()).unwrap();
    assert_eq!(
        RpcMeta::from_json(&store.get(&rpc_key).unwrap().unwrap()).unwrap(),
        meta
    );

    store.remove(&key).unwrap();
    assert_eq!(store.get(&key).unwrap(), None);
    // Removing an absent key succeeds.
    store.remove(&key).unwrap();
    server.shutdown();
}

#[test]
fn raw_http_status_codes() {
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).unwrap();
    let addr = server.local_addr();
    let k = "/metadata?key=mooncake%2Fram%2Fh%3A1";

    assert_eq!(raw(addr, "GET", k, b""), (404, "metadata not found".into()));
    let value = br#"{"a":1,  "b" : [2]}"#;
    assert_eq!(raw(addr, "PUT", k, value).0, 200);
    // GET returns exactly the bytes that were PUT.
    assert_eq!(
        raw(addr, "GET", k, b""),
        (200, String::from_utf8(value.to_vec()).unwrap())
    );
    assert_eq!(raw(addr, "PUT", k, b"{\"a\":2}").0, 200);
    assert_eq!(raw(addr, "GET", k, b"").1, "{\"a\":2}");
    assert_eq!(raw(addr, "DELETE", k, b"").0, 200);
    assert_eq!(raw(addr, "DELETE", k, b"").0, 200);
    assert_eq!(raw(addr, "GET", k, b"").0, 404);

    assert_eq!(raw(addr, "GET", "/metadata", b"").0, 400);
    assert_eq!(raw(addr, "PUT", "/metadata?other=1", b"{}").0, 400);
    assert_eq!(raw(addr, "POST", k, b"{}").0, 405);
    assert_eq!(raw(addr, "PATCH", k, b"{}").0, 405);
    assert_eq!(raw(addr, "GET", "/elsewhere?key=x", b"").0, 404);

    // The store client sees a server error as Error::Metadata, a GET body
    // that is not JSON as Error::MalformedJson.
    assert_eq!(raw(addr, "PUT", "/metadata?key=bad", b"not json").0, 200);
    let store = HttpStore::new(&server.url()).unwrap();
    assert!(matches!(store.get("bad"), Err(Error::MalformedJson(_))));
    let wrong_path = HttpStore::new(&format!("http://{addr}/elsewhere")).unwrap();
    assert!(matches!(
        wrong_path.set("k", &json!({})),
        Err(Error::Metadata(_))
    ));
    server.shutdown();
}

#[test]
fn data_survives_restart() {
    let dir = TempDir::new("restart");
    let file = dir.0.join("data.json");
    let key = segment_key(Some("prod"), "10.0.0.5:12345");
    let desc = tcp_desc();
    {
        let server = MetadataServer::start("127.0.0.1:0", "/metadata", Some(file.clone())).unwrap();
        let store = HttpStore::new(&server.url()).unwrap();
        store.set(&key, &desc.to_json()).unwrap();
        store.set("gone", &json!(1)).unwrap();
        store.remove("gone").unwrap();
        server.shutdown();
    }
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", Some(file.clone())).unwrap();
    let store = HttpStore::new(&server.url()).unwrap();
    let got = store.get(&key).unwrap().unwrap();
    assert_eq!(SegmentDesc::from_json(&got).unwrap(), desc);
    assert_eq!(store.get("gone").unwrap(), None);
    server.shutdown();

    // A corrupt data file stops the server from starting instead of being
    // silently replaced.
    std::fs::write(&file, b"{not json").unwrap();
    assert!(MetadataServer::start("127.0.0.1:0", "/metadata", Some(file)).is_err());
}

#[test]
fn closed_port_fails_fast() {
    // Bind then drop a listener: the port is almost certainly closed now.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = HttpStore::new(&format!("http://127.0.0.1:{port}/metadata")).unwrap();
    let start = Instant::now();
    for result in [
        store.get("k").map(|_| ()),
        store.set("k", &json!({})),
        store.remove("k"),
    ] {
        assert!(
            matches!(result, Err(Error::Socket(_) | Error::Metadata(_))),
            "{result:?}"
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn silent_server_times_out() {
    // Accepts connections (kernel backlog) but never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let store = HttpStore::new(&format!("http://{addr}/metadata")).unwrap();
    let start = Instant::now();
    let result = store.get("k");
    assert!(
        matches!(result, Err(Error::Socket(_) | Error::Metadata(_))),
        "{result:?}"
    );
    let took = start.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    drop(listener);
}

/// Connections that trickle a request one byte at a time (16 in the
/// headers, 16 in a PUT body), held open by a thread until `stop`.
fn trickle(addr: SocketAddr, stop: Arc<AtomicBool>) -> thread::JoinHandle<usize> {
    thread::spawn(move || {
        let body = vec![b'x'; 4096];
        let mut conns: Vec<(TcpStream, Vec<u8>, usize)> = (0..32)
            .map(|i| {
                let s = TcpStream::connect(addr).unwrap();
                s.set_nodelay(true).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
                let head = format!(
                    "PUT /metadata?key=slow{i} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let mut req = head.into_bytes();
                let sent = if i % 2 == 0 { 0 } else { req.len() };
                if sent > 0 {
                    (&s).write_all(&req).unwrap();
                }
                req.extend_from_slice(&body);
                (s, req, sent)
            })
            .collect();
        let end = Instant::now() + Duration::from_secs(60);
        let mut bytes = 0;
        while !stop.load(Ordering::Relaxed) && Instant::now() < end {
            for (s, req, sent) in &mut conns {
                if *sent < req.len() && s.write_all(&req[*sent..*sent + 1]).is_ok() {
                    *sent += 1;
                    bytes += 1;
                }
            }
            thread::sleep(Duration::from_millis(200));
        }
        bytes
    })
}

#[test]
fn slow_clients_do_not_block_others() {
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).unwrap();
    let addr = server.local_addr();
    let k = "/metadata?key=fast";
    assert_eq!(raw(addr, "PUT", k, b"{\"v\":1}").0, 200);
    let stop = Arc::new(AtomicBool::new(false));
    let slow = trickle(addr, stop.clone());
    thread::sleep(Duration::from_millis(500));
    let mut worst = Duration::ZERO;
    for i in 0..10 {
        let t = Instant::now();
        assert_eq!(
            raw(addr, "GET", k, b""),
            (200, "{\"v\":1}".into()),
            "GET {i}"
        );
        let v = format!("{{\"v\":{i}}}");
        assert_eq!(raw(addr, "PUT", "/metadata?key=other", v.as_bytes()).0, 200);
        worst = worst.max(t.elapsed());
        thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    let trickled = slow.join().unwrap();
    println!("32 slow clients ({trickled} bytes trickled): worst GET+PUT {worst:?}");
    assert!(worst < Duration::from_secs(2), "{worst:?}");
    server.shutdown();
}

/// Reads one response (head and `Content-Length` body) from `s`; returns
/// (status, body).
fn read_response(s: &mut TcpStream) -> (u16, String) {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "closed mid-head: {got:?}");
        got.push(byte[0]);
    }
    let head = String::from_utf8(got).unwrap();
    let status = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (status, String::from_utf8(body).unwrap())
}

#[test]
fn keep_alive_chunked_bodies_and_expect_continue() {
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).unwrap();
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // curl's way of sending a large body: ask first, then send chunks.
    s.write_all(
        b"PUT /metadata?key=k HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\
          Transfer-Encoding: chunked\r\n\r\n",
    )
    .unwrap();
    let mut cont = [0u8; 25];
    s.read_exact(&mut cont).unwrap();
    assert_eq!(&cont, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"7\r\n{\"a\":1,\r\n5\r\n\"b\":2\r\n1\r\n}\r\n0\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut s).0, 200);
    // The same connection serves the next requests, pipelined.
    s.write_all(
        b"GET /metadata?key=k HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /metadata?key=none HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    assert_eq!(read_response(&mut s), (200, "{\"a\":1,\"b\":2}".into()));
    assert_eq!(read_response(&mut s), (404, "metadata not found".into()));
    server.shutdown();
}

#[test]
fn body_limit_and_bad_requests() {
    let opts = ServerOptions {
        max_body: 1000,
        ..ServerOptions::default()
    };
    let server = MetadataServer::start_with("127.0.0.1:0", "/metadata", None, opts).unwrap();
    let addr = server.local_addr();
    let k = "/metadata?key=big";
    assert_eq!(raw(addr, "PUT", k, &[b'x'; 1000]).0, 200);
    assert_eq!(raw(addr, "PUT", k, &[b'y'; 1001]).0, 413);
    assert_eq!(raw(addr, "GET", k, b""), (200, "x".repeat(1000)));
    assert_eq!(raw(addr, "PUT", k, &[0xff, 0xfe]).0, 400);
    // Not HTTP at all: an answer of 400, and the connection closes.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&[
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, b'\r', b'\n', b'\r', b'\n',
    ])
    .unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    assert!(
        resp.starts_with(b"HTTP/1.1 400 "),
        "{:?}",
        String::from_utf8_lossy(&resp)
    );
    server.shutdown();
}

#[test]
fn slow_and_idle_clients_are_closed_at_the_deadline() {
    let opts = ServerOptions {
        timeout: Duration::from_secs(1),
        ..ServerOptions::default()
    };
    let server = MetadataServer::start_with("127.0.0.1:0", "/metadata", None, opts).unwrap();
    let addr = server.local_addr();
    let t = Instant::now();
    let idle = TcpStream::connect(addr).unwrap();
    let slow = TcpStream::connect(addr).unwrap();
    (&slow)
        .write_all(b"PUT /metadata?key=s HTTP/1.1\r\nContent-Length: 100\r\n\r\n")
        .unwrap();
    // A byte every 100 ms keeps it busy, not alive: it is closed at the
    // deadline from its start.
    while t.elapsed() < Duration::from_secs(4) && (&slow).write_all(b"x").is_ok() {
        thread::sleep(Duration::from_millis(100));
    }
    for mut s in [idle, slow] {
        s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
        let mut rest = Vec::new();
        if let Err(e) = s.read_to_end(&mut rest) {
            // A reset is a close with our bytes unread; a timeout is not.
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
        }
        assert!(rest.is_empty(), "no response to an incomplete request");
    }
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    server.shutdown();
}

#[test]
fn at_the_connection_bound_idle_clients_make_room() {
    let opts = ServerOptions {
        max_connections: 4,
        ..ServerOptions::default()
    };
    let server = MetadataServer::start_with("127.0.0.1:0", "/metadata", None, opts).unwrap();
    let addr = server.local_addr();
    let silent: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for i in 0..5 {
        let t = Instant::now();
        assert_eq!(raw(addr, "GET", "/metadata?key=x", b"").0, 404, "GET {i}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
    drop(silent);
    server.shutdown();
}

/// Writes `bytes` until done or the server stops taking them; true if all
/// were sent.
fn send_all(s: &mut TcpStream, bytes: &[u8]) -> bool {
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).is_ok()
}

#[test]
fn chunk_framing_counts_against_the_request_bound() {
    let opts = ServerOptions {
        max_body: 1 << 20,
        max_buffered: 8 << 20,
        ..ServerOptions::default()
    };
    let server = MetadataServer::start_with("127.0.0.1:0", "/metadata", None, opts).unwrap();
    let addr = server.local_addr();
    // A client half way through a 1 MiB PUT.
    let value: Vec<u8> = (0..1 << 20).map(|i| b'a' + (i % 26) as u8).collect();
    let mut victim = TcpStream::connect(addr).unwrap();
    victim
        .write_all(
            format!(
                "PUT /metadata?key=victim HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                value.len()
            )
            .as_bytes(),
        )
        .unwrap();
    victim.write_all(&value[..value.len() / 2]).unwrap();
    // One byte of body per chunk, each chunk with 4000 bytes of extension:
    // 16 MiB sent for a body of 4 KiB, far within --max-body.
    let mut attacker = TcpStream::connect(addr).unwrap();
    let chunk = format!("1;ext={}\r\nx\r\n", "e".repeat(4000));
    let mut sent = 0;
    let mut complete = send_all(
        &mut attacker,
        b"PUT /metadata?key=attacker HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    let batch = chunk.repeat(16);
    while complete && sent < 16 << 20 {
        complete = send_all(&mut attacker, batch.as_bytes());
        sent += batch.len();
    }
    // Refused as too large once its raw bytes passed the bound, not
    // closed for want of buffer space.
    let reply = read_until_closed(&mut attacker);
    assert!(
        reply.starts_with(b"HTTP/1.1 413 "),
        "after {sent} bytes sent: {:?}",
        String::from_utf8_lossy(&reply[..reply.len().min(200)])
    );
    // The other client's request was kept, and completes.
    victim
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    victim.write_all(&value[value.len() / 2..]).unwrap();
    assert_eq!(read_response(&mut victim).0, 200);
    let (status, body) = raw(addr, "GET", "/metadata?key=victim", b"");
    assert_eq!(status, 200);
    assert!(body.as_bytes() == value, "the stored value differs");
    server.shutdown();
}

/// Reads until the server closes (EOF or reset), within 20 s.
fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
            Err(e) => panic!("reading until the server closes: {e}"),
        }
    }
}

#[test]
fn store_bounds_refuse_growth_with_507() {
    let opts = ServerOptions {
        max_keys: 100,
        max_total_bytes: 64 << 10,
        ..ServerOptions::default()
    };
    let server = MetadataServer::start_with("127.0.0.1:0", "/metadata", None, opts).unwrap();
    let addr = server.local_addr();
    // One kept-alive connection PUTs new keys as fast as it is answered.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let value = [b'v'; 100];
    let mut statuses = Vec::new();
    for i in 0..1000 {
        let mut req = format!(
            "PUT /metadata?key=k{i:04} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            value.len()
        )
        .into_bytes();
        req.extend_from_slice(&value);
        s.write_all(&req).unwrap();
        statuses.push(read_response(&mut s));
    }
    // 100 keys of 105 bytes: the key bound, not the byte bound.
    for (i, (status, body)) in statuses.iter().enumerate() {
        let want = if i < 100 { 200 } else { 507 };
        assert_eq!(*status, want, "PUT {i}: {body}");
    }
    assert_eq!(statuses[100].1, "metadata store full");
    // Replacing a key is not a new key; growing it beyond the bytes is
    // refused and leaves it as it was.
    assert_eq!(raw(addr, "PUT", "/metadata?key=k0000", b"{}").0, 200);
    let big = vec![b'b'; 60 << 10];
    assert_eq!(raw(addr, "PUT", "/metadata?key=k0001", &big).0, 507);
    assert_eq!(
        raw(addr, "GET", "/metadata?key=k0001", b""),
        (200, "v".repeat(100))
    );
    // Removing keys makes room again.
    for i in 1..=10 {
        let k = format!("/metadata?key=k{i:04}");
        assert_eq!(raw(addr, "DELETE", &k, b"").0, 200);
    }
    assert_eq!(raw(addr, "PUT", "/metadata?key=new", b"1").0, 200);
    assert_eq!(raw(addr, "PUT", "/metadata?key=k0001", &big).0, 507);
    assert_eq!(
        raw(addr, "GET", "/metadata?key=k0000", b""),
        (200, "{}".into())
    );
    server.shutdown();
}
