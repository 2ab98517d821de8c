//! A peer's descriptor is bounded before this engine uses it: a descriptor
//! listing more devices (`MC_PEER_MAX_DEVICES`), more buffers
//! (`MC_PEER_MAX_BUFFERS`) or more bytes (`MC_PEER_MAX_DESCRIPTOR_BYTES`, for
//! stores) than allowed makes `openSegment` fail with an error naming the
//! bound, so a hostile peer cannot make us hold what it lists, or connect to
//! thousands of addresses it chose. Peers are hand-written: a P2P handshake
//! responder, and values put into a real redis and our HTTP metadata server.

use crate::cluster_common;
use crate::common;

use cluster_common::{engine, init_env};
use common::servers::Redis;
use common::{HandshakeResponder, skip, tcp_descriptor};
use serde_json::{Value, json};
use transfer_engine::Engine;
use transfer_engine::metadata::keys::{rpc_meta_key, segment_key};
use transfer_engine::metadata::server::MetadataServer;

const MAX_BUFFERS: usize = 100;
const MAX_BYTES: usize = 65536;

fn env() {
    init_env(&[
        ("MC_PEER_MAX_BUFFERS", "100"),
        ("MC_PEER_MAX_DESCRIPTOR_BYTES", "65536"),
    ]);
}

fn p2p_engine() -> std::sync::Arc<Engine> {
    env();
    engine("P2PHANDSHAKE", "127.0.0.1:0")
}

/// Opens the segment a responder serves with `desc` and returns the error.
fn open_error(desc: Value) -> String {
    let e = p2p_engine();
    let peer = HandshakeResponder::start(|_| desc);
    match e.open_segment(&peer.name()) {
        Ok(id) => panic!("segment {} opened as {id} despite its size", peer.name()),
        Err(err) => err.to_string(),
    }
}

fn with(mut desc: Value, key: &str, v: Value) -> Value {
    desc.as_object_mut().unwrap().insert(key.into(), v);
    desc
}

#[test]
fn ten_thousand_tcp_devices_are_refused() {
    // Addresses in our loopback subnet: without the bound, each would be
    // a rail that this engine connects to.
    let devices: Vec<Value> = (0..10_000u32)
        .map(|i| json!({"name": format!("eth{i}"), "addr": format!("127.1.{}.{}", i / 250, i % 250 + 1), "prefix_len": 8}))
        .collect();
    let desc = with(
        tcp_descriptor(1, 1, 2, 0x1000, 4096),
        "tcp_devices",
        Value::Array(devices),
    );
    let err = open_error(desc);
    assert!(
        err.contains("10000 TCP devices") && err.contains("MC_PEER_MAX_DEVICES"),
        "{err}"
    );
}

#[test]
fn too_many_rdma_devices_are_refused() {
    let devices: Vec<Value> = (0..65)
        .map(|i| json!({"name": format!("mlx5_{i}"), "lid": 0, "gid": "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01"}))
        .collect();
    let desc = json!({
        "name": "peer", "protocol": "rdma", "timestamp": "",
        "devices": devices, "buffers": [], "priority_matrix": {},
    });
    let err = open_error(desc);
    assert!(
        err.contains("65 RDMA devices") && err.contains("MC_PEER_MAX_DEVICES"),
        "{err}"
    );
}

#[test]
fn too_many_buffers_are_refused_and_the_bound_itself_is_accepted() {
    let buffers = |n: usize| -> Value {
        (0..n)
            .map(|i| json!({"name": "x", "addr": 0x10000 + i * 4096, "length": 4096}))
            .collect()
    };
    let desc = with(
        tcp_descriptor(1, 1, 2, 0x1000, 4096),
        "buffers",
        buffers(MAX_BUFFERS + 1),
    );
    let err = open_error(desc);
    assert!(
        err.contains(&format!("{} buffers", MAX_BUFFERS + 1))
            && err.contains("MC_PEER_MAX_BUFFERS"),
        "{err}"
    );

    let e = p2p_engine();
    let ok = with(
        tcp_descriptor(1, 1, 2, 0x1000, 4096),
        "buffers",
        buffers(MAX_BUFFERS),
    );
    let peer = HandshakeResponder::start(|_| ok);
    e.open_segment(&peer.name())
        .expect("a descriptor at the bound opens");
}

/// A descriptor of more than `MAX_BYTES` bytes, valid otherwise.
fn big_descriptor(name: &str) -> Value {
    let buffers: Vec<Value> = (0..90)
        .map(|i| json!({"name": "x".repeat(1000), "addr": 0x10000 + i * 4096, "length": 4096}))
        .collect();
    let desc = with(
        tcp_descriptor(1, 1, 2, 0x1000, 4096),
        "buffers",
        Value::Array(buffers),
    );
    let desc = with(desc, "name", Value::from(name));
    assert!(desc.to_string().len() > MAX_BYTES);
    desc
}

fn rpc_meta() -> String {
    json!({"ip_or_host_name": "127.0.0.1", "rpc_port": 1}).to_string()
}

#[test]
fn an_oversized_value_in_redis_is_refused() {
    env();
    let Some(redis) = Redis::start() else {
        return skip("redis-server is not installed");
    };
    let mut c = redis.client(0);
    let name = "big-peer:1";
    let _: () = redis::cmd("SET")
        .arg(segment_key(None, name))
        .arg(big_descriptor(name).to_string())
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(rpc_meta_key(None, name))
        .arg(rpc_meta())
        .query(&mut c)
        .unwrap();
    let e = engine(&redis.conn_string(), "small-peer:1");
    let err = e
        .open_segment(name)
        .expect_err("an oversized descriptor opened")
        .to_string();
    assert!(err.contains("MC_PEER_MAX_DESCRIPTOR_BYTES"), "{err}");
}

#[test]
fn an_oversized_value_in_the_http_store_is_refused() {
    env();
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).expect("server");
    let name = "big-peer:1";
    let put = |key: String, body: String| {
        let url = format!("{}?key={key}", server.url());
        let resp = ureq::put(&url).send(body.as_bytes()).expect("PUT");
        assert_eq!(resp.status().as_u16(), 200);
    };
    put(segment_key(None, name), big_descriptor(name).to_string());
    put(rpc_meta_key(None, name), rpc_meta());
    let e = engine(&server.url(), "small-peer:1");
    let err = e
        .open_segment(name)
        .expect_err("an oversized descriptor opened")
        .to_string();
    assert!(err.contains("MC_PEER_MAX_DESCRIPTOR_BYTES"), "{err}");
    server.shutdown();
}
