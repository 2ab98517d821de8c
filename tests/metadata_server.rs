//! The HTTP metadata server and the HTTP store client together: routes and
//! status codes, persistence across a restart, and failure on a dead port.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use transfer_engine::error::Error;
use transfer_engine::metadata::descriptor::{BufferDesc, SegmentDesc};
use transfer_engine::metadata::http::HttpStore;
use transfer_engine::metadata::keys::{RpcMeta, rpc_meta_key, segment_key};
use transfer_engine::metadata::server::MetadataServer;
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
