//! A real etcd started with TLS (certificates made by the test), client
//! certificates required (`--client-cert-auth`) and etcd's authentication
//! on, with a user allowed the `mooncake/` keys only:
//!
//! - two engines configured with `MC_ETCD_CACERT`, `MC_ETCD_CERT`,
//!   `MC_ETCD_KEY`, `MC_ETCD_USERNAME` and `MC_ETCD_PASSWORD` meet through
//!   `etcd://https://…` and move byte-verified data; their keys are in
//!   etcd;
//! - a wrong CA, a wrong password, no credentials, no client certificate,
//!   and a plain `http://` endpoint on the TLS port each fail with a
//!   message that says what to fix, and the password is in none of them.

use crate::cluster_common;
use crate::common;

use common::servers::Etcd;
use common::tls::Pki;
use serde_json::json;
use transfer_engine::metadata::StoreConfig;
use transfer_engine::metadata::client_tls::TlsFiles;
use transfer_engine::metadata::etcd::EtcdStore;
use transfer_engine::metadata::secret::Secret;
use transfer_engine::metadata::store::MetadataStore;

const USER: &str = "te-user";
const PASSWORD: &str = "te-pass-9d1c7a2f";

/// etcd with TLS, client certificates and authentication on.
fn etcd(pki: &Pki) -> Option<Etcd> {
    let mut etcd = Etcd::start_tls(pki, true)?;
    etcd.enable_auth("root-pass-5e8b", USER, PASSWORD);
    Some(etcd)
}

#[test]
fn engines_meet_through_etcd_with_tls_and_auth() {
    let pki = Pki::new();
    let Some(etcd) = etcd(&pki) else { return };
    cluster_common::init_env(&[
        ("MC_ETCD_CACERT", pki.ca.to_str().unwrap()),
        ("MC_ETCD_CERT", pki.cert.to_str().unwrap()),
        ("MC_ETCD_KEY", pki.key.to_str().unwrap()),
        ("MC_ETCD_USERNAME", USER),
        ("MC_ETCD_PASSWORD", PASSWORD),
    ]);
    let conn = format!("etcd://https://{}", etcd.endpoint());
    let a = cluster_common::engine(&conn, "tls-a:1");
    let b = cluster_common::engine(&conn, "tls-b:1");
    for key in ["mooncake/rpc_meta/tls-b:1", "mooncake/ram/tls-b:1"] {
        assert!(etcd.get_raw(key).is_some(), "{key} is not in etcd");
    }
    a.shutdown();
    b.shutdown();
    cluster_common::two_engines(&conn, ["tls-c:1", "tls-d:1"]);
}

/// The error of a PUT through a store on `endpoint` with `c`.
fn failure(endpoint: &str, c: &StoreConfig) -> String {
    let e = match EtcdStore::from_config(&[endpoint.to_string()], c) {
        Ok(store) => store
            .set("mooncake/ram/x", &json!({"x": 1}))
            .expect_err("the PUT succeeded")
            .to_string(),
        Err(e) => e.to_string(),
    };
    assert!(
        !e.contains(PASSWORD),
        "the message quotes the password: {e}"
    );
    eprintln!("{endpoint}: {e}");
    e
}

#[test]
fn wrong_ca_password_or_certificate_fail_clearly() {
    let pki = Pki::new();
    let Some(etcd) = etcd(&pki) else { return };
    let https = format!("https://{}", etcd.endpoint());
    let good = StoreConfig {
        etcd_auth: Some((USER.into(), Secret::new(PASSWORD))),
        etcd_tls: TlsFiles {
            cacert: Some(pki.ca.clone()),
            cert: Some(pki.cert.clone()),
            key: Some(pki.key.clone()),
        },
        ..StoreConfig::default()
    };
    // The good settings work, and only on the user's keys.
    let store = EtcdStore::from_config(std::slice::from_ref(&https), &good).unwrap();
    store.set("mooncake/ram/ok", &json!({"ok": true})).unwrap();
    assert_eq!(
        store.get("mooncake/ram/ok").unwrap(),
        Some(json!({"ok": true}))
    );
    let e = store.set("other/key", &json!(1)).unwrap_err().to_string();
    assert!(e.contains("permission denied"), "{e}");

    let mut c = good.clone();
    c.etcd_tls.cacert = Some(pki.other_ca.clone());
    let e = failure(&https, &c);
    assert!(
        e.contains("not signed by a CA in MC_ETCD_CACERT="),
        "wrong CA: {e}"
    );

    let mut c = good.clone();
    c.etcd_auth = Some((USER.into(), Secret::new("not-the-password")));
    let e = failure(&https, &c);
    assert!(
        e.contains("authentication as user \"te-user\" failed")
            && e.contains("check MC_ETCD_USERNAME and MC_ETCD_PASSWORD"),
        "wrong password: {e}"
    );

    let mut c = good.clone();
    c.etcd_auth = None;
    let e = failure(&https, &c);
    assert!(
        e.contains("set MC_ETCD_USERNAME and MC_ETCD_PASSWORD"),
        "no credentials: {e}"
    );

    let mut c = good.clone();
    c.etcd_tls.cert = None;
    c.etcd_tls.key = None;
    let e = failure(&https, &c);
    assert!(
        e.contains("MC_ETCD_CERT and MC_ETCD_KEY"),
        "no client cert: {e}"
    );

    let mut c = good.clone();
    c.etcd_tls.cert = Some(pki.cn_cert.clone());
    c.etcd_tls.key = Some(pki.cn_key.clone());
    let e = failure(&https, &c);
    assert!(
        e.contains("MC_ETCD_CERT") && e.contains("CommonName"),
        "a client certificate with a CommonName: {e}"
    );

    let e = failure(&format!("http://{}", etcd.endpoint()), &good);
    assert!(
        e.contains("POST http://"),
        "plain http on the TLS port: {e}"
    );
}

#[test]
fn a_token_etcd_forgot_is_replaced() {
    let pki = Pki::new();
    let Some(mut etcd) = etcd(&pki) else { return };
    let c = StoreConfig {
        etcd_auth: Some((USER.into(), Secret::new(PASSWORD))),
        etcd_tls: TlsFiles {
            cacert: Some(pki.ca.clone()),
            cert: Some(pki.cert.clone()),
            key: Some(pki.key.clone()),
        },
        ..StoreConfig::default()
    };
    let store = EtcdStore::from_config(&[format!("https://{}", etcd.endpoint())], &c).unwrap();
    store.set("mooncake/ram/kept", &json!([1, 2, 3])).unwrap();
    // etcd's simple tokens live in its memory: after a restart the store's
    // token is unknown to it, and the store authenticates again.
    etcd.restart();
    assert_eq!(
        store.get("mooncake/ram/kept").unwrap(),
        Some(json!([1, 2, 3]))
    );
    store.set("mooncake/ram/kept", &json!([4])).unwrap();
    assert_eq!(store.get("mooncake/ram/kept").unwrap(), Some(json!([4])));
}
