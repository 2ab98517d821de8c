//! Redis with authentication and a database index (this binary's own
//! environment: `MC_REDIS_USERNAME=te-user`, `MC_REDIS_PASSWORD`,
//! `MC_REDIS_DB_INDEX=5`): the server requires a password of its default
//! user and has an ACL user `te-user`; two engines log in as that user,
//! keep their keys in database 5 (not 0) and move byte-verified data.

mod cluster_common;
mod common;

use cluster_common::{buffers, engine, init_env, write_read_sizes};
use common::servers::{Redis, RedisOptions};

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
    }) else {
        return;
    };
    let conn = r.conn_string();
    let a = engine(&conn, "auth-a:1");
    let b = engine(&conn, "auth-b:1");
    let (src, dst, back) = buffers(&a, &b, 2 << 20);
    for key in ["mooncake/rpc_meta/auth-b:1", "mooncake/ram/auth-b:1"] {
        assert!(exists(&r, 5, key), "{key} is not in database 5");
        assert!(!exists(&r, 0, key), "{key} is in database 0");
    }
    let seg = a.open_segment("auth-b:1").expect("open through redis db 5");
    write_read_sizes(&a, seg, &src, &dst, &back, 21);
    a.shutdown();
    b.shutdown();
    assert!(!exists(&r, 5, "mooncake/ram/auth-b:1"), "left behind");
}
