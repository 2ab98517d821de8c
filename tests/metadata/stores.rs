//! The etcd and redis metadata stores against real servers started by the
//! tests (Debian's `etcd-server` and `redis-server`; a test reports itself
//! skipped, `SKIPPED: … not installed`, when the binary is missing, and
//! fails instead with `TE_REQUIRE_SERVERS=1` or `CI=true`).
//!
//! Covered for both: set/get/overwrite/remove, absent keys, the stored
//! bytes (compact JSON + `\n`), values written by another client, non-JSON
//! values, many threads; etcd: failover from a refusing and from a hung
//! first endpoint, every endpoint dead within a bound, a restart on the same
//! data directory; redis: password, ACL user, database index, a restart
//! between calls; both: a down server fails fast and names its address, a
//! hung one fails within the timeout.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::servers::{Blackhole, Etcd, Redis, RedisOptions, dead_addr};
use serde_json::{Value, json};
use transfer_engine::Error;
use transfer_engine::metadata::etcd::EtcdStore;
use transfer_engine::metadata::keys::{rpc_meta_key, segment_key};
use transfer_engine::metadata::redis::RedisStore;
use transfer_engine::metadata::store::MetadataStore;

/// A descriptor-shaped value.
fn descriptor(name: &str, addr: u64) -> Value {
    json!({
        "buffers": [{"addr": addr, "length": 1u64 << 30, "name": name}],
        "name": name, "protocol": "tcp", "tcp_data_port": 15873,
        "tcp_proto_version": 2, "timestamp": "2026-08-22 13:12:18.123456"
    })
}

/// The store contract every backend must keep.
fn contract(store: &dyn MetadataStore, raw: &dyn Fn(&str) -> Option<Vec<u8>>) {
    let key = segment_key(None, "10.0.0.5:12345");
    let rpc = rpc_meta_key(Some("cluster-a"), "10.0.0.5:12345");
    assert_eq!(store.get(&key).unwrap(), None, "absent key");
    store.remove(&key).expect("removing an absent key succeeds");

    let v1 = descriptor("10.0.0.5:12345", 140_234_567_680_000);
    store.set(&key, &v1).unwrap();
    assert_eq!(store.get(&key).unwrap(), Some(v1.clone()));
    // Mooncake's FastWriter form: compact, keys sorted, trailing newline.
    let mut expected = serde_json::to_vec(&v1).unwrap();
    expected.push(b'\n');
    assert_eq!(raw(&key), Some(expected));
    assert!(raw(&key).unwrap().starts_with(b"{\"buffers\":[{\"addr\":"));

    let v2 = descriptor("10.0.0.5:12345", 4096);
    store.set(&key, &v2).unwrap();
    assert_eq!(store.get(&key).unwrap(), Some(v2), "overwrite");

    let meta = json!({"ip_or_host_name": "10.0.0.5", "rpc_port": 12345});
    store.set(&rpc, &meta).unwrap();
    assert_eq!(store.get(&rpc).unwrap(), Some(meta));

    store.remove(&key).unwrap();
    assert_eq!(store.get(&key).unwrap(), None, "removed");
    assert!(store.get(&rpc).unwrap().is_some(), "other keys untouched");
    store.remove(&rpc).unwrap();

    // Odd keys and values round-trip.
    let odd = "mooncake/cluster-é/ram/a b:1";
    let big = json!({"blob": "x".repeat(256 << 10), "n": [1, -2, 3.5, null, true]});
    store.set(odd, &big).unwrap();
    assert_eq!(store.get(odd).unwrap(), Some(big));
    store.remove(odd).unwrap();
}

/// Many threads through one store.
fn threads(store: Arc<dyn MetadataStore>) {
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..20 {
                    let key = format!("mooncake/ram/t{t}");
                    let v = json!({"t": t, "i": i});
                    store.set(&key, &v).unwrap();
                    assert_eq!(store.get(&key).unwrap(), Some(v));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Runs `f` and returns its result and how long it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let r = f();
    (r, start.elapsed())
}

// ---------------------------------------------------------------- etcd

#[test]
fn etcd_contract() {
    let Some(etcd) = Etcd::start() else { return };
    let store = EtcdStore::new(&[etcd.endpoint()]).unwrap();
    assert_eq!(
        store.describe(),
        format!("etcd store at etcd://{}", etcd.endpoint())
    );
    contract(&store, &|k| etcd.get_raw(k));
    threads(Arc::new(store));
}

#[test]
fn etcd_reads_values_written_by_other_clients() {
    let Some(etcd) = Etcd::start() else { return };
    let store = EtcdStore::new(&[etcd.endpoint()]).unwrap();
    etcd.put_raw("k/newline", b"{\"a\":1,\"b\":[2]}\n");
    etcd.put_raw("k/pretty", b"{\n  \"b\" : [ 2 ],\n  \"a\" : 1\n}");
    let want = json!({"a": 1, "b": [2]});
    assert_eq!(store.get("k/newline").unwrap(), Some(want.clone()));
    assert_eq!(store.get("k/pretty").unwrap(), Some(want));

    etcd.put_raw("k/garbage", b"not json");
    etcd.put_raw("k/empty", b"");
    for key in ["k/garbage", "k/empty"] {
        let e = store.get(key).unwrap_err();
        assert!(matches!(e, Error::MalformedJson(_)), "{key}: {e:?}");
        assert!(e.to_string().contains(key), "{e}");
    }
}

#[test]
fn etcd_fails_over_to_a_live_endpoint() {
    let Some(etcd) = Etcd::start() else { return };
    // A refusing first endpoint costs nothing.
    let store = EtcdStore::new(&[dead_addr(), etcd.endpoint()]).unwrap();
    let v = json!({"x": 1});
    let (r, took) = timed(|| store.set("k", &v));
    r.unwrap();
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(store.get("k").unwrap(), Some(v.clone()));

    // A hung first endpoint costs one request timeout, once: the store then
    // starts from the endpoint that answered.
    let hole = Blackhole::new();
    let store = EtcdStore::new(&[hole.addr(), etcd.endpoint()]).unwrap();
    let (r, took) = timed(|| store.get("k"));
    assert_eq!(r.unwrap(), Some(v.clone()));
    assert!(took < Duration::from_secs(8), "{took:?}");
    let (r, took) = timed(|| store.get("k"));
    assert_eq!(r.unwrap(), Some(v));
    assert!(
        took < Duration::from_secs(2),
        "second call skips the hung endpoint: {took:?}"
    );
}

#[test]
fn etcd_all_endpoints_dead_fails_in_bounded_time() {
    let dead = dead_addr();
    let hole = Blackhole::new();
    let store = EtcdStore::new(&[dead.clone(), hole.addr()]).unwrap();
    let (r, took) = timed(|| store.get("k"));
    let e = r.unwrap_err();
    assert!(took < Duration::from_secs(12), "{took:?}");
    let Error::Metadata(msg) = &e else {
        panic!("{e:?}")
    };
    assert!(msg.contains(&dead) && msg.contains(&hole.addr()), "{msg}");
    assert!(msg.contains("check that etcd is running"), "{msg}");
    let (r, took) = timed(|| store.set("k", &json!(1)));
    assert!(r.is_err());
    assert!(took < Duration::from_secs(12), "{took:?}");
}

#[test]
fn etcd_restart_keeps_data_and_down_fails_fast() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let store = EtcdStore::new(&[etcd.endpoint()]).unwrap();
    let v = descriptor("n", 4096);
    store.set("mooncake/ram/n", &v).unwrap();

    etcd.kill();
    let (r, took) = timed(|| store.get("mooncake/ram/n"));
    let e = r.unwrap_err();
    assert!(took < Duration::from_secs(7), "{took:?}");
    assert!(e.to_string().contains(&etcd.endpoint()), "{e}");

    etcd.restart();
    assert_eq!(
        store.get("mooncake/ram/n").unwrap(),
        Some(v),
        "data survives"
    );
    store.remove("mooncake/ram/n").unwrap();
    assert_eq!(store.get("mooncake/ram/n").unwrap(), None);
}

#[test]
fn etcd_hung_endpoint_fails_within_timeout() {
    let hole = Blackhole::new();
    let store = EtcdStore::new(&[hole.addr()]).unwrap();
    let (r, took) = timed(|| store.get("k"));
    let e = r.unwrap_err();
    assert!(took < Duration::from_secs(7), "{took:?}");
    assert!(e.to_string().contains(&hole.addr()), "{e}");
}

// ---------------------------------------------------------------- redis

/// Raw bytes under `key` in database `db`, read by another client.
fn redis_raw(redis: &Redis, db: u8, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut redis.client(db))
        .unwrap()
}

#[test]
fn redis_contract() {
    let Some(redis) = Redis::start() else { return };
    let store = RedisStore::new(&redis.addr(), None, None, 0).unwrap();
    assert_eq!(
        store.describe(),
        format!("redis store at {}", redis.conn_string())
    );
    contract(&store, &|k| redis_raw(&redis, 0, k));
    threads(Arc::new(store));
}

#[test]
fn redis_reads_values_written_by_other_clients() {
    let Some(redis) = Redis::start() else { return };
    let store = RedisStore::new(&redis.conn_string(), None, None, 0).unwrap();
    let mut other = redis.client(0);
    let set = |c: &mut redis::Connection, k: &str, v: &[u8]| {
        redis::cmd("SET").arg(k).arg(v).query::<()>(c).unwrap();
    };
    set(&mut other, "k/newline", b"{\"a\":1,\"b\":[2]}\n");
    set(
        &mut other,
        "k/pretty",
        b"{\n  \"b\" : [ 2 ],\n  \"a\" : 1\n}",
    );
    let want = json!({"a": 1, "b": [2]});
    assert_eq!(store.get("k/newline").unwrap(), Some(want.clone()));
    assert_eq!(store.get("k/pretty").unwrap(), Some(want));

    set(&mut other, "k/garbage", b"not json");
    let e = store.get("k/garbage").unwrap_err();
    assert!(matches!(e, Error::MalformedJson(_)), "{e:?}");
    // A key of another type is a server error, and the connection stays.
    redis::cmd("LPUSH")
        .arg("k/list")
        .arg("x")
        .query::<()>(&mut other)
        .unwrap();
    let e = store.get("k/list").unwrap_err();
    assert!(matches!(e, Error::Metadata(_)), "{e:?}");
    assert!(store.get("k/newline").unwrap().is_some());
}

#[test]
fn redis_password_and_database_index() {
    let options = RedisOptions {
        password: Some("s3cret".into()),
        user: Some(("alice".into(), "wonder".into())),
        tls: None,
    };
    let Some(redis) = Redis::start_with(options) else {
        return;
    };
    let addr = redis.addr();

    let db3 = RedisStore::new(&addr, None, Some("s3cret"), 3).unwrap();
    let db0 = RedisStore::new(&addr, None, Some("s3cret"), 0).unwrap();
    let v = json!({"db": 3});
    db3.set("mooncake/ram/x", &v).unwrap();
    assert_eq!(db3.get("mooncake/ram/x").unwrap(), Some(v.clone()));
    assert_eq!(
        db0.get("mooncake/ram/x").unwrap(),
        None,
        "db 0 does not see db 3"
    );
    assert!(redis_raw(&redis, 3, "mooncake/ram/x").is_some());
    assert!(redis_raw(&redis, 0, "mooncake/ram/x").is_none());

    // An ACL user with its own password.
    let alice = RedisStore::new(&addr, Some("alice"), Some("wonder"), 3).unwrap();
    assert_eq!(alice.get("mooncake/ram/x").unwrap(), Some(v));

    // No password: the server refuses, and the message says what to set.
    let anon = RedisStore::new(&addr, None, None, 0).unwrap();
    let e = anon.get("mooncake/ram/x").unwrap_err();
    assert!(e.to_string().contains("MC_REDIS_PASSWORD"), "{e}");
    let anon3 = RedisStore::new(&addr, None, None, 3).unwrap();
    let e = anon3.set("k", &json!(1)).unwrap_err();
    assert!(e.to_string().contains("MC_REDIS_PASSWORD"), "{e}");
    // Wrong password, wrong user.
    for (user, pass) in [
        (None, "nope"),
        (Some("alice"), "s3cret"),
        (Some("bob"), "wonder"),
    ] {
        let s = RedisStore::new(&addr, user, Some(pass), 0).unwrap();
        let e = s.get("k").unwrap_err();
        assert!(matches!(e, Error::Metadata(_)), "{user:?}: {e:?}");
        assert!(e.to_string().contains("check MC_REDIS_USERNAME"), "{e}");
        assert!(e.to_string().contains(&addr), "{e}");
    }
    // A database the server does not have.
    let s = RedisStore::new(&addr, None, Some("s3cret"), 200).unwrap();
    let e = s.get("k").unwrap_err();
    assert!(e.to_string().contains("MC_REDIS_DB_INDEX=200"), "{e}");
}

#[test]
fn redis_restart_between_calls() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let store = RedisStore::new(&redis.addr(), None, None, 2).unwrap();
    let v = json!({"before": true});
    store.set("k", &v).unwrap();
    assert_eq!(store.get("k").unwrap(), Some(v));

    for round in 0..2 {
        if round == 0 {
            redis.restart();
        } else {
            redis.kill();
            redis.restart();
        }
        // The kept connection is dead; the call reconnects and succeeds.
        let v = json!({"after": round});
        store
            .set("k", &v)
            .unwrap_or_else(|e| panic!("round {round}: first call after restart: {e}"));
        assert_eq!(store.get("k").unwrap(), Some(v));
        assert_eq!(store.get("gone").unwrap(), None);
    }
}

#[test]
fn redis_down_fails_fast_and_names_the_server() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let store = RedisStore::new(&redis.addr(), None, None, 0).unwrap();
    store.set("k", &json!(1)).unwrap();
    redis.stop();
    for _ in 0..2 {
        let (r, took) = timed(|| store.get("k"));
        let e = r.unwrap_err();
        assert!(took < Duration::from_secs(3), "{took:?}");
        assert!(matches!(e, Error::Socket(_)), "{e:?}");
        assert!(e.to_string().contains(&redis.addr()), "{e}");
    }
    redis.restart();
    assert_eq!(
        store.get("k").unwrap(),
        None,
        "works again; nothing persisted"
    );
}

#[test]
fn redis_hung_server_fails_within_timeout() {
    let hole = Blackhole::new();
    let store = RedisStore::new(&hole.addr(), None, Some("pw"), 1).unwrap();
    let (r, took) = timed(|| store.get("k"));
    let e = r.unwrap_err();
    assert!(took < Duration::from_secs(7), "{took:?}");
    assert!(matches!(e, Error::Socket(_)), "{e:?}");
    assert!(e.to_string().contains(&hole.addr()), "{e}");
    let store = RedisStore::new(&hole.addr(), None, None, 0).unwrap();
    let (r, took) = timed(|| store.set("k", &json!(1)));
    assert!(matches!(r, Err(Error::Socket(_))), "{r:?}");
    assert!(took < Duration::from_secs(7), "{took:?}");
}
