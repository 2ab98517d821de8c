//! `MC_TE_METADATA_REFRESH_INTERVAL_SECONDS=1` (the engines'
//! configuration): an engine picks up a peer that restarted with new buffers
//! by itself, without `sync_all_segments()` and without a failed
//! connection, within a few seconds, through etcd and through redis; the
//! old buffers are never touched. A buffer a peer registers later becomes
//! usable the same way.

use crate::cluster_common;
use crate::common;

use cluster_common::{
    Pickup, Store, buffers, engine, init_env, one, peer_restart, poll, write_read,
};
use std::time::Duration;
use transfer_engine::TaskStatus;

const ENV: &[(&str, &str)] = &[("MC_TE_METADATA_REFRESH_INTERVAL_SECONDS", "1")];

#[test]
fn background_refresh_through_etcd() {
    init_env(ENV);
    let Some(store) = Store::etcd() else { return };
    peer_restart(&store.conn(), Pickup::Refresh);
}

#[test]
fn background_refresh_through_redis() {
    init_env(ENV);
    let Some(store) = Store::redis() else { return };
    peer_restart(&store.conn(), Pickup::Refresh);
}

/// A buffer the peer registers after it was opened is usable without a
/// sync once the refresh has run.
#[test]
fn background_refresh_finds_a_new_buffer() {
    init_env(ENV);
    let Some(store) = Store::redis() else { return };
    let conn = store.conn();
    let a = engine(&conn, "nb-a:1");
    let b = engine(&conn, "nb-b:1");
    let (src, dst, back) = buffers(&a, &b, 1 << 20);
    let seg = a.open_segment("nb-b:1").unwrap();
    write_read(&a, seg, (&src, &dst, &back), 1, 1000, 1);
    let z = common::Buf::zeroed(1 << 20);
    common::register(&b, &z, true);
    let w = common::write_req(src.addr(), seg, z.addr() + 1, 1000);
    let (ok, took) = poll(Duration::from_secs(10), || {
        one(&a, w) == TaskStatus::Completed
    });
    assert!(ok, "the new buffer not usable within {took:?}");
    println!("new buffer usable after {took:?}");
    write_read(&a, seg, (&src, &z, &back), 4097, 500_000, 2);
    a.shutdown();
    b.shutdown();
}
