//! Engines meeting through a real redis-server (a private instance on a
//! free 127.0.0.1 port without persistence; skipped when redis is not
//! installed, a failure with `TE_REQUIRE_SERVERS=1`):
//!
//! - two engines move byte-verified data both ways;
//! - redis restarted between transfers (its data lost): within ~10 s both
//!   engines' keys are back (read with a raw client), the transfers
//!   continue, and a NEW engine opens the first by name and transfers;
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
use std::time::Duration;

fn redis() -> Option<Store> {
    init_env(&[]);
    Store::redis()
}

#[test]
fn two_engines_through_redis() {
    let Some(store) = redis() else { return };
    two_engines(&store.conn(), ["redis-a:1", "redis-b:1"]);
    for k in ["rpc_meta", "ram"] {
        for n in ["redis-a:1", "redis-b:1"] {
            let key = format!("mooncake/{k}/{n}");
            assert!(!store.has(&key), "{key} left behind after shutdown");
        }
    }
}

#[test]
fn redis_restart_loses_data_and_engines_republish() {
    let Some(mut store) = redis() else { return };
    let conn = store.conn();
    let a = engine(&conn, "rr-a:1");
    let b = engine(&conn, "rr-b:1");
    let (src, dst, back) = buffers(&a, &b, 2 << 20);
    let seg = a.open_segment("rr-b:1").expect("open");
    write_read(&a, seg, (&src, &dst, &back), 1, 100_000, 1);
    let before = store.get("mooncake/ram/rr-b:1").expect("descriptor");

    store.restart();
    assert!(
        !store.has("mooncake/ram/rr-a:1"),
        "redis kept data across the restart; the test needs it lost"
    );
    // Transfers between engines that already know each other go on.
    write_read_sizes(&a, seg, &src, &dst, &back, 2);

    let keys = [
        "mooncake/rpc_meta/rr-a:1",
        "mooncake/ram/rr-a:1",
        "mooncake/rpc_meta/rr-b:1",
        "mooncake/ram/rr-b:1",
    ];
    for key in keys {
        let took = wait_key(&store, key, Duration::from_secs(12));
        println!("{key} back after {took:?}");
    }
    let after = store.get("mooncake/ram/rr-b:1").unwrap();
    assert_eq!(
        after["buffers"], before["buffers"],
        "republished other buffers"
    );
    let rpc = store.get("mooncake/rpc_meta/rr-a:1").unwrap();
    assert_eq!(rpc["ip_or_host_name"], "127.0.0.1", "{rpc}");

    // A new engine finds rr-a:1 by name and moves data with it.
    let c = engine(&conn, "rr-c:1");
    let (src_c, dst_a, back_c) = buffers(&c, &a, 1 << 20);
    let seg_a = c.open_segment("rr-a:1").expect("a new engine opens rr-a:1");
    write_read(&c, seg_a, (&src_c, &dst_a, &back_c), 9, 500_000, 4);
    // And the old engines still reach the store: a sync and a registration.
    a.sync_all_segments();
    write_read(&a, seg, (&src, &dst, &back), 7, 12_345, 3);
    let late = common::Buf::zeroed(4096);
    common::register(&b, &late, true);
    let desc = store.get("mooncake/ram/rr-b:1").unwrap();
    assert!(
        desc["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["addr"].as_u64() == Some(late.addr())),
        "a buffer registered after the restart is not in redis: {desc}"
    );
    c.shutdown();
    a.shutdown();
    b.shutdown();
    for key in keys {
        assert!(!store.has(key), "{key} left behind after shutdown");
    }
}

#[test]
fn peer_restart_picked_up_by_sync() {
    let Some(store) = redis() else { return };
    peer_restart(&store.conn(), Pickup::Sync);
}

#[test]
fn peer_restart_picked_up_after_a_failed_connection() {
    let Some(store) = redis() else { return };
    peer_restart(&store.conn(), Pickup::AfterFailure);
}

#[test]
fn notifications_through_redis() {
    let Some(store) = redis() else { return };
    notifications(&store.conn());
}
