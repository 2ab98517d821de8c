//! A metadata store that is down or hung makes `Engine::new`
//! (`createTransferEngine`) and `open_segment` (`openSegment`) fail within
//! a bound (15 s) with an error naming the store, not hang: etcd, redis
//! and http, refusing and silent servers. Engines that already know each
//! other keep moving data while the store is down, and find new peers
//! again once it is back (redis and http lose their data on the restart:
//! the keeper republishes).

use crate::cluster_common;
use crate::common;

use cluster_common::{Store, buffers, engine, init_env, poll, write_read};
use common::servers::{Blackhole, dead_addr};
use std::time::{Duration, Instant};
use transfer_engine::Engine;
use transfer_engine::metadata::server::MetadataServer;

const BOUND: Duration = Duration::from_secs(15);

/// `Engine::new(conn)` fails within [`BOUND`] with an error mentioning
/// `port`.
fn new_fails(conn: &str, port: &str) {
    init_env(&[]);
    let start = Instant::now();
    let res = Engine::builder(conn, "down-x:1")
        .config(cluster_common::config())
        .build();
    let took = start.elapsed();
    let err = match res {
        Ok(_) => panic!("Engine::new({conn:?}) succeeded with the store down"),
        Err(e) => e.to_string(),
    };
    println!("Engine::new({conn:?}) failed after {took:?}: {err}");
    assert!(took < BOUND, "Engine::new({conn:?}) took {took:?}");
    assert!(
        err.contains(port),
        "the error for {conn:?} does not name the store ({port}): {err}"
    );
}

fn port_of(addr: &str) -> String {
    addr.rsplit_once(':').unwrap().1.to_string()
}

#[test]
fn new_fails_when_etcd_is_down_or_hung() {
    let dead = dead_addr();
    new_fails(&format!("etcd://{dead}"), &port_of(&dead));
    new_fails(&dead, &port_of(&dead));
    let dead2 = dead_addr();
    new_fails(&format!("etcd://{dead},{dead2}"), &port_of(&dead2));
    let hole = Blackhole::new();
    new_fails(&format!("etcd://{}", hole.addr()), &port_of(&hole.addr()));
}

#[test]
fn new_fails_when_redis_is_down_or_hung() {
    let dead = dead_addr();
    new_fails(&format!("redis://{dead}"), &port_of(&dead));
    let hole = Blackhole::new();
    new_fails(&format!("redis://{}", hole.addr()), &port_of(&hole.addr()));
}

#[test]
fn new_fails_when_http_is_down_or_hung() {
    let dead = dead_addr();
    new_fails(&format!("http://{dead}/metadata"), &port_of(&dead));
    let hole = Blackhole::new();
    new_fails(
        &format!("http://{}/metadata", hole.addr()),
        &port_of(&hole.addr()),
    );
}

/// `f` fails within [`BOUND`]; returns the error text.
fn fails_in_time<T>(what: &str, f: impl FnOnce() -> transfer_engine::Result<T>) -> String {
    let start = Instant::now();
    let res = f();
    let took = start.elapsed();
    let err = match res {
        Ok(_) => panic!("{what} succeeded with the store down"),
        Err(e) => e.to_string(),
    };
    println!("{what} failed after {took:?}: {err}");
    assert!(took < BOUND, "{what} took {took:?}");
    err
}

/// With engines A, B, C up: A opens B; the store goes down (`stop`); A
/// still moves data with B; opening C fails in time; a sync returns in time
/// and keeps B usable; the store comes back (`start`) and A opens C.
fn store_goes_down(conn: &str, port: u16, stop: impl FnOnce(), start: impl FnOnce()) {
    let a = engine(conn, "dn-a:1");
    let b = engine(conn, "dn-b:1");
    let c = engine(conn, "dn-c:1");
    let (src, dst, back) = buffers(&a, &b, 1 << 20);
    // C's buffer is registered (and published) before the store goes down.
    let (src2, dst_c, back2) = buffers(&a, &c, 1 << 20);
    let seg = a.open_segment("dn-b:1").unwrap();
    write_read(&a, seg, (&src, &dst, &back), 1, 4096, 1);

    stop();
    write_read(&a, seg, (&src, &dst, &back), 3, 300_000, 2);
    let err = fails_in_time("open_segment(dn-c:1)", || a.open_segment("dn-c:1"));
    assert!(
        err.contains(&port.to_string()),
        "the error does not name the store (port {port}): {err}"
    );
    fails_in_time("open_segment(never:1)", || a.open_segment("never:1"));
    let t = Instant::now();
    a.sync_all_segments();
    assert!(
        t.elapsed() < BOUND,
        "sync_all_segments took {:?}",
        t.elapsed()
    );
    write_read(&a, seg, (&src, &dst, &back), 5, 65_537, 3);

    start();
    let (ok, took) = poll(BOUND, || a.open_segment("dn-c:1").is_ok());
    assert!(
        ok,
        "dn-c:1 not openable within {took:?} of the store's return"
    );
    println!("dn-c:1 openable {took:?} after the store came back");
    let seg_c = a.open_segment("dn-c:1").unwrap();
    write_read(&a, seg_c, (&src2, &dst_c, &back2), 7, 200_001, 4);
    a.shutdown();
    b.shutdown();
    c.shutdown();
}

#[test]
fn open_segment_fails_while_etcd_is_down() {
    init_env(&[]);
    let Some(store) = Store::etcd() else { return };
    let (conn, port) = (store.conn(), store.port());
    let store = std::cell::RefCell::new(store);
    store_goes_down(
        &conn,
        port,
        || store.borrow_mut().stop(),
        || store.borrow_mut().restart(),
    );
}

#[test]
fn open_segment_fails_while_redis_is_down() {
    init_env(&[]);
    let Some(store) = Store::redis() else { return };
    let (conn, port) = (store.conn(), store.port());
    let store = std::cell::RefCell::new(store);
    store_goes_down(
        &conn,
        port,
        || store.borrow_mut().stop(),
        || store.borrow_mut().restart(),
    );
}

#[test]
fn open_segment_fails_while_http_is_down() {
    init_env(&[]);
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).unwrap();
    let (conn, addr) = (server.url(), server.local_addr());
    let slot = std::cell::RefCell::new(Some(server));
    store_goes_down(
        &conn,
        addr.port(),
        || slot.borrow_mut().take().unwrap().shutdown(),
        || {
            // In memory: the data is gone, the keeper republishes.
            let s = MetadataServer::start(&addr.to_string(), "/metadata", None)
                .expect("restart the metadata server on its port");
            *slot.borrow_mut() = Some(s);
        },
    );
}
