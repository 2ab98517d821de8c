//! Redis over TLS (`rediss://`): a real redis-server serving TLS only
//! (`--port 0 --tls-port`), requiring client certificates signed by the
//! test's CA (`--tls-auth-clients yes`) and a password. Two engines
//! configured with `MC_REDIS_CACERT`, `MC_REDIS_CERT`, `MC_REDIS_KEY` and
//! `MC_REDIS_PASSWORD` meet through it and move byte-verified data; their keys are in redis. A store with
//! another CA, or without a client certificate, fails with a message that
//! says what to set; plain `redis://` on the TLS port fails.

use crate::cluster_common;
use crate::common;

use common::servers::{Redis, RedisOptions, RedisTls};
use common::tls::Pki;
use serde_json::json;
use transfer_engine::metadata::StoreConfig;
use transfer_engine::metadata::client_tls::TlsFiles;
use transfer_engine::metadata::redis::RedisStore;
use transfer_engine::metadata::secret::Secret;
use transfer_engine::metadata::store::MetadataStore;

const PASSWORD: &str = "redis-tls-secret-41";

#[test]
fn engines_meet_through_redis_over_tls() {
    let pki = Pki::new();
    cluster_common::init_env(&[
        ("MC_REDIS_CACERT", pki.ca.to_str().unwrap()),
        ("MC_REDIS_CERT", pki.cert.to_str().unwrap()),
        ("MC_REDIS_KEY", pki.key.to_str().unwrap()),
        ("MC_REDIS_PASSWORD", PASSWORD),
    ]);
    let Some(r) = Redis::start_with(RedisOptions {
        password: Some(PASSWORD.into()),
        user: None,
        tls: Some(RedisTls {
            ca: pki.ca.clone(),
            cert: pki.cert.clone(),
            key: pki.key.clone(),
        }),
    }) else {
        return;
    };
    let conn = r.conn_string();
    assert!(conn.starts_with("rediss://"), "{conn}");
    let a = cluster_common::engine(&conn, "tls-a:1");
    let b = cluster_common::engine(&conn, "tls-b:1");
    let mut client = r.client(0);
    for key in ["mooncake/rpc_meta/tls-b:1", "mooncake/ram/tls-b:1"] {
        let n: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query(&mut client)
            .expect("EXISTS");
        assert_eq!(n, 1, "{key} is not in redis");
    }
    a.shutdown();
    b.shutdown();
    cluster_common::two_engines(&conn, ["tls-c:1", "tls-d:1"]);

    // What a wrong setting says.
    let good = StoreConfig {
        redis_password: Some(Secret::new(PASSWORD)),
        redis_tls: TlsFiles {
            cacert: Some(pki.ca.clone()),
            cert: Some(pki.cert.clone()),
            key: Some(pki.key.clone()),
        },
        ..StoreConfig::default()
    };
    let fail = |tls: bool, c: &StoreConfig| {
        let e = RedisStore::from_config(&r.addr(), tls, c)
            .and_then(|s| s.set("mooncake/ram/x", &json!(1)))
            .expect_err("the SET succeeded")
            .to_string();
        assert!(
            !e.contains(PASSWORD),
            "the message quotes the password: {e}"
        );
        eprintln!("{e}");
        e
    };
    let mut c = good.clone();
    c.redis_tls.cacert = Some(pki.other_ca.clone());
    let e = fail(true, &c);
    assert!(
        e.contains("invalid peer certificate") && e.contains("signed by a CA in MC_REDIS_CACERT="),
        "{e}"
    );
    let mut c = good.clone();
    c.redis_tls.cert = None;
    c.redis_tls.key = None;
    let e = fail(true, &c);
    assert!(
        e.contains("requires client certificates needs MC_REDIS_CERT and MC_REDIS_KEY"),
        "{e}"
    );
    fail(false, &good);
}
