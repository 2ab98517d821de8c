//! What the store says about an engine stays true across store outages and
//! name reuse:
//!
//! - a buffer unregistered while etcd is down is gone from etcd once it is
//!   back (the keeper must not leave the old descriptor there), and a WRITE
//!   to it from a new peer fails without touching it;
//! - a registration that failed because redis was down is not advertised,
//!   neither on the handshake port nor in redis after its restart;
//! - a new engine that takes the name of one still running (a quick
//!   restart) is findable after the old one shuts down and deletes the
//!   shared keys;
//! - a peer restarted before the connection to its dead predecessor failed
//!   is picked up by the next submit.

use crate::cluster_common;
use crate::common;

use cluster_common::{
    Pickup, Store, buffers, engine, init_env, one, peer_restart, poll, write_read,
};
use common::{Buf, descriptor, register, write_req};
use serde_json::Value;
use std::time::Duration;
use transfer_engine::TaskStatus;

fn addrs(desc: &Value) -> Vec<u64> {
    desc["buffers"]
        .as_array()
        .map(|a| a.iter().filter_map(|b| b["addr"].as_u64()).collect())
        .unwrap_or_default()
}

#[test]
fn unregister_while_etcd_is_down_reaches_etcd_when_it_is_back() {
    init_env(&[]);
    let Some(mut store) = Store::etcd() else {
        return;
    };
    let conn = store.conn();
    let b = engine(&conn, "ud-b:1");
    let x = Buf::zeroed(65536);
    let y = Buf::zeroed(65536);
    register(&b, &x, true);
    register(&b, &y, true);
    assert!(addrs(&store.get("mooncake/ram/ud-b:1").unwrap()).contains(&y.addr()));

    store.stop();
    let res = b.unregister(&[y.addr()]);
    println!("unregister while etcd is down: {res:?}");
    store.restart();

    let (ok, took) = poll(Duration::from_secs(12), || {
        !addrs(&store.get("mooncake/ram/ud-b:1").unwrap()).contains(&y.addr())
    });
    let stale = store.get("mooncake/ram/ud-b:1").unwrap();
    // Whatever etcd says, a WRITE to Y from a new peer must fail.
    let c = engine(&conn, "ud-c:1");
    let src = Buf::new(4096, 1);
    register(&c, &src, true);
    y.set(0, &[0xEE; 65536]);
    let seg = c.open_segment("ud-b:1").unwrap();
    let w = write_req(src.addr(), seg, y.addr(), 4096);
    assert_eq!(
        one(&c, w),
        TaskStatus::Failed,
        "a WRITE to an unregistered buffer"
    );
    assert!(
        y.snapshot() == vec![0xEE; 65536],
        "an unregistered buffer was written"
    );
    assert!(
        ok,
        "{took:?} after etcd came back it still advertises the buffer {:#x} that ud-b:1 \
         unregistered while etcd was down: {stale}",
        y.addr()
    );
    c.shutdown();
    b.shutdown();
}

#[test]
fn failed_registration_is_not_advertised() {
    init_env(&[]);
    let Some(mut store) = Store::redis() else {
        return;
    };
    let conn = store.conn();
    let b = engine(&conn, "fr-b:1");
    let x = Buf::zeroed(65536);
    register(&b, &x, true);

    store.stop();
    let y = Buf::zeroed(65536);
    let res = b.register(&[transfer_engine::Region {
        addr: y.addr(),
        length: y.len() as u64,
        location: transfer_engine::Location::Cpu(0),
        remote_accessible: true,
    }]);
    println!("register while redis is down: {res:?}");
    let registered = res.is_ok();
    let served = descriptor(&b);
    store.restart();
    cluster_common::wait_key(&store, "mooncake/ram/fr-b:1", Duration::from_secs(12));
    let stored = store.get("mooncake/ram/fr-b:1").unwrap();
    // Whatever is advertised, a WRITE to Y must fail and leave Y alone.
    let c = engine(&conn, "fr-c:1");
    let src = Buf::new(4096, 1);
    register(&c, &src, true);
    y.set(0, &[0xEE; 65536]);
    let seg = c.open_segment("fr-b:1").unwrap();
    let w = write_req(src.addr(), seg, y.addr(), 4096);
    if !registered {
        assert_eq!(
            one(&c, w),
            TaskStatus::Failed,
            "a WRITE to a buffer never registered"
        );
        assert!(
            y.snapshot() == vec![0xEE; 65536],
            "a buffer never registered was written"
        );
    }
    let (in_served, in_stored) = (
        addrs(&served).contains(&y.addr()),
        addrs(&stored).contains(&y.addr()),
    );
    assert!(
        in_served == registered && in_stored == registered,
        "register returned {res:?}, yet buffer {:#x} is advertised on the handshake port: \
         {in_served}, in redis after its restart: {in_stored}\nserved: {served}\nstored: {stored}",
        y.addr()
    );
    assert!(addrs(&stored).contains(&x.addr()));
    c.shutdown();
    b.shutdown();
}

/// B' takes B's name while B still runs; B's shutdown deletes the shared
/// keys; B''s keeper must put them back so new peers find B'.
fn quick_restart(store: &Store) {
    let conn = store.conn();
    let b = engine(&conn, "qr-b:1");
    let x = Buf::zeroed(65536);
    register(&b, &x, true);
    let b2 = engine(&conn, "qr-b:1");
    let y = Buf::zeroed(1 << 20);
    register(&b2, &y, true);
    b.shutdown();
    drop(b);
    let (ok, took) = poll(Duration::from_secs(12), || {
        store
            .get("mooncake/ram/qr-b:1")
            .is_some_and(|d| addrs(&d).contains(&y.addr()))
            && store.has("mooncake/rpc_meta/qr-b:1")
    });
    assert!(ok, "B''s keys not back within {took:?}");
    println!("B''s keys back after {took:?}");
    let c = engine(&conn, "qr-c:1");
    let src = Buf::zeroed(1 << 20);
    let back = Buf::zeroed(1 << 20);
    register(&c, &src, true);
    register(&c, &back, true);
    let seg = c.open_segment("qr-b:1").expect("open B'");
    write_read(&c, seg, (&src, &y, &back), 5, 400_000, 8);
    c.shutdown();
    b2.shutdown();
}

#[test]
fn quick_restart_under_the_same_name_etcd() {
    init_env(&[]);
    let Some(store) = Store::etcd() else { return };
    quick_restart(&store);
}

#[test]
fn quick_restart_under_the_same_name_redis() {
    init_env(&[]);
    let Some(store) = Store::redis() else { return };
    quick_restart(&store);
}

/// B dies, B' comes up, and only then does A's transfer with B's cached
/// descriptor fail; A's next submit uses B''s descriptor.
#[test]
fn peer_restarted_before_the_failure_is_noticed() {
    init_env(&[]);
    let Some(store) = Store::etcd() else { return };
    peer_restart(&store.conn(), Pickup::FailureAfterRestart);
}

#[test]
fn unchanged_peer_keeps_working_after_sync() {
    init_env(&[]);
    let Some(store) = Store::redis() else { return };
    let conn = store.conn();
    let a = engine(&conn, "us-a:1");
    let b = engine(&conn, "us-b:1");
    let (src, dst, back) = buffers(&a, &b, 1 << 20);
    let seg = a.open_segment("us-b:1").unwrap();
    write_read(&a, seg, (&src, &dst, &back), 1, 100_000, 1);
    for i in 0..3 {
        a.sync_all_segments();
        write_read(&a, seg, (&src, &dst, &back), 3 + i, 50_000, 2 + i as u8);
    }
    // A buffer registered later is found at its first use: a request to
    // memory the cached descriptor does not list refetches it, as Mooncake
    // reaches it (its TCP initiator does not check).
    let z = Buf::zeroed(65536);
    register(&b, &z, true);
    write_read(&a, seg, (&src, &z, &back), 0, 65536, 7);
    // Memory B never registered still fails, after that refetch too.
    let never = Buf::zeroed(4096);
    let w = write_req(src.addr(), seg, never.addr(), 4096);
    assert_eq!(one(&a, w), TaskStatus::Failed, "unregistered memory");
    a.shutdown();
    b.shutdown();
}
