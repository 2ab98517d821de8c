//! Engines meeting through a real etcd (a private instance on free
//! 127.0.0.1 ports with a temporary data directory; skipped when etcd is
//! not installed, a failure with `TE_REQUIRE_SERVERS=1`):
//!
//! - two engines by `etcd://`, by a plain `host:port`, and by two endpoints
//!   whose first is dead, move byte-verified data both ways;
//! - the keys of spec §2.1 are in etcd while an engine lives (its
//!   descriptor with the registered buffer and a `generation`) and gone
//!   after `shutdown()`;
//! - etcd restarted on the same data directory between transfers: the
//!   transfers continue and a new engine finds the old ones;
//! - a peer that restarts with new buffers is picked up by
//!   `sync_all_segments()` and after a failed connection, and its old
//!   buffers are never touched;
//! - notifications in store mode.

use crate::cluster_common;
use crate::common;

use cluster_common::{
    Pickup, Store, buffers, engine, init_env, notifications, peer_restart, two_engines, wait_key,
    write_read, write_read_sizes,
};
use common::servers::dead_addr;
use std::time::Duration;

fn etcd() -> Option<Store> {
    init_env(&[]);
    Store::etcd()
}

#[test]
fn two_engines_through_etcd() {
    let Some(store) = etcd() else { return };
    two_engines(&store.conn(), ["etcd-a:1", "etcd-b:1"]);
}

#[test]
fn plain_host_port_means_etcd() {
    let Some(store) = etcd() else { return };
    let Store::Etcd(e) = &store else {
        unreachable!()
    };
    two_engines(&e.endpoint(), ["plain-a:1", "plain-b:1"]);
    assert!(
        !store.has("mooncake/rpc_meta/plain-a:1"),
        "entries removed after shutdown"
    );
}

#[test]
fn first_endpoint_dead_fails_over_to_the_second() {
    let Some(store) = etcd() else { return };
    let Store::Etcd(e) = &store else {
        unreachable!()
    };
    let conn = format!("etcd://{},{}", dead_addr(), e.endpoint());
    two_engines(&conn, ["fo-a:1", "fo-b:1"]);
}

#[test]
fn keys_live_in_etcd_while_the_engine_lives() {
    let Some(store) = etcd() else { return };
    let conn = store.conn();
    let a = engine(&conn, "keys-a:1");
    let b = engine(&conn, "keys-b:1");
    let (_src, dst, _back) = buffers(&a, &b, 65536);
    let rpc = store
        .get("mooncake/rpc_meta/keys-b:1")
        .expect("rpc_meta of keys-b:1");
    assert_eq!(rpc["ip_or_host_name"], "127.0.0.1", "{rpc}");
    assert!(rpc["rpc_port"].as_u64().is_some_and(|p| p > 0), "{rpc}");
    let desc = store.get("mooncake/ram/keys-b:1").expect("descriptor");
    assert_eq!(desc["name"], "keys-b:1");
    assert_eq!(desc["protocol"], "tcp");
    let bufs = desc["buffers"].as_array().expect("buffers");
    assert!(
        bufs.iter().any(|x| x["addr"].as_u64() == Some(dst.addr())
            && x["length"].as_u64() == Some(dst.len() as u64)),
        "the registered buffer is not in {desc}"
    );
    let g1 = desc["generation"].clone();
    assert!(g1.is_string(), "no generation in {desc}");
    // Unregistering publishes a new generation without the buffer.
    b.unregister(&[dst.addr()]).unwrap();
    let desc2 = store.get("mooncake/ram/keys-b:1").expect("descriptor");
    assert_ne!(desc2["generation"], g1, "unregistering kept the generation");
    assert!(
        !desc2["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["addr"].as_u64() == Some(dst.addr())),
        "an unregistered buffer is still published: {desc2}"
    );
    b.shutdown();
    assert!(
        !store.has("mooncake/rpc_meta/keys-b:1"),
        "rpc_meta left behind"
    );
    assert!(
        !store.has("mooncake/ram/keys-b:1"),
        "descriptor left behind"
    );
    assert!(
        store.has("mooncake/ram/keys-a:1"),
        "the other engine's key went too"
    );
    a.shutdown();
}

#[test]
fn etcd_restart_between_transfers() {
    let Some(mut store) = etcd() else { return };
    let conn = store.conn();
    let a = engine(&conn, "rs-a:1");
    let b = engine(&conn, "rs-b:1");
    let (src, dst, back) = buffers(&a, &b, 2 << 20);
    let seg = a.open_segment("rs-b:1").expect("open");
    write_read(&a, seg, (&src, &dst, &back), 1, 100_000, 1);

    store.restart();
    // Same data directory: the entries survived.
    assert!(store.has("mooncake/ram/rs-a:1") && store.has("mooncake/ram/rs-b:1"));
    write_read_sizes(&a, seg, &src, &dst, &back, 2);
    // Engines keep using etcd after its restart: a sync and a new engine.
    a.sync_all_segments();
    write_read(&a, seg, (&src, &dst, &back), 7, 12_345, 3);
    let c = engine(&conn, "rs-c:1");
    let (src_c, dst_a, back_c) = buffers(&c, &a, 1 << 20);
    let seg_a = c.open_segment("rs-a:1").expect("a new engine opens rs-a:1");
    write_read(&c, seg_a, (&src_c, &dst_a, &back_c), 9, 500_000, 4);
    // Registration after the restart reaches etcd.
    let late = common::Buf::zeroed(4096);
    common::register(&b, &late, true);
    let desc = store.get("mooncake/ram/rs-b:1").unwrap();
    assert!(
        desc["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["addr"].as_u64() == Some(late.addr())),
        "a buffer registered after the restart is not in etcd: {desc}"
    );
    // A SIGKILL and restart too.
    if let Store::Etcd(e) = &mut store {
        e.kill();
        e.restart();
    }
    write_read(&c, seg_a, (&src_c, &dst_a, &back_c), 11, 77_777, 5);
    wait_key(&store, "mooncake/rpc_meta/rs-c:1", Duration::from_secs(5));
    c.shutdown();
    a.shutdown();
    b.shutdown();
}

#[test]
fn peer_restart_picked_up_by_sync() {
    let Some(store) = etcd() else { return };
    peer_restart(&store.conn(), Pickup::Sync);
}

#[test]
fn peer_restart_picked_up_after_a_failed_connection() {
    let Some(store) = etcd() else { return };
    // A separate store: the same names as the test above.
    peer_restart(&store.conn(), Pickup::AfterFailure);
}

#[test]
fn notifications_through_etcd() {
    let Some(store) = etcd() else { return };
    notifications(&store.conn());
}
