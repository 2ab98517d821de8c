//! Redis with authentication and a database index (the engines'
//! configuration: `MC_REDIS_USERNAME=te-user`, `MC_REDIS_PASSWORD`,
//! `MC_REDIS_DB_INDEX=5`): the server requires a password of its default
//! user and has an ACL user `te-user`; two engines log in as that user,
//! keep their keys in database 5 (not 0) and move byte-verified data; after
//! a redis restart (data lost) they log in again and republish into
//! database 5, where a new engine finds them.

use crate::cluster_common;
use crate::common;

use cluster_common::{buffers, engine, init_env, poll, write_read, write_read_sizes};
use common::servers::{Redis, RedisOptions};
use std::time::Duration;

fn exists(r: &Redis, db: u8, key: &str) -> bool {
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query(&mut r.client(db))
        .expect("EXISTS");
    n == 1
}

#[test]
fn acl_user_and_database_index() {
    init_env(&[
        ("MC_REDIS_USERNAME", "te-user"),
        ("MC_REDIS_PASSWORD", "te-user-secret"),
        ("MC_REDIS_DB_INDEX", "5"),
    ]);
    let Some(r) = Redis::start_with(RedisOptions {
        password: Some("default-secret".into()),
        user: Some(("te-user".into(), "te-user-secret".into())),
        tls: None,
    }) else {
        return;
    };
    let conn = r.conn_string();
    let a = engine(&conn, "auth-a:1");
    let b = engine(&conn, "auth-b:1");
    let (src, dst, back) = buffers(&a, &b, 2 << 20);
    let mut r = r;
    for key in ["mooncake/rpc_meta/auth-b:1", "mooncake/ram/auth-b:1"] {
        assert!(exists(&r, 5, key), "{key} is not in database 5");
        assert!(!exists(&r, 0, key), "{key} is in database 0");
    }
    let seg = a.open_segment("auth-b:1").expect("open through redis db 5");
    write_read_sizes(&a, seg, &src, &dst, &back, 21);

    // A restart loses everything; the engines log in again as te-user and
    // republish into database 5, not 0.
    r.restart();
    let (ok, took) = poll(Duration::from_secs(12), || {
        ["a", "b"].iter().all(|n| {
            exists(&r, 5, &format!("mooncake/rpc_meta/auth-{n}:1"))
                && exists(&r, 5, &format!("mooncake/ram/auth-{n}:1"))
        })
    });
    assert!(ok, "keys not back in database 5 within {took:?}");
    for key in ["mooncake/rpc_meta/auth-b:1", "mooncake/ram/auth-b:1"] {
        assert!(!exists(&r, 0, key), "{key} republished into database 0");
    }
    let c = engine(&conn, "auth-c:1");
    let (src_c, dst_b, back_c) = buffers(&c, &b, 1 << 20);
    let seg_b = c
        .open_segment("auth-b:1")
        .expect("a new engine opens auth-b:1");
    write_read(&c, seg_b, (&src_c, &dst_b, &back_c), 3, 333_333, 4);
    c.shutdown();
    a.shutdown();
    b.shutdown();
    assert!(!exists(&r, 5, "mooncake/ram/auth-b:1"), "left behind");
}
