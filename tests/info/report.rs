//! The report without a peer: every section, as text and as JSON, with a
//! variable of the test's environment shown as set there.

use super::{run, texts};
use serde_json::Value;

/// A variable of the test's own, and a secret that must not be printed.
const ENV: &[(&str, &str)] = &[
    ("MC_SLICE_SIZE", "131072"),
    ("MC_REDIS_PASSWORD", "not-to-be-printed"),
];

#[test]
fn text_has_every_section() {
    let (out, _) = run(&[], ENV);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    for section in [
        "transfer-engine ",
        "== devices",
        "NUMA nodes:",
        "network interfaces:",
        "== priority matrix",
        "== transports (auto discovery)",
        "== settings",
    ] {
        assert!(stdout.contains(section), "no {section:?} in:\n{stdout}");
    }
    assert!(
        stdout.contains("MC_SLICE_SIZE = 131072 (128 KiB) (environment; default 65536"),
        "{stdout}"
    );
    assert!(stdout.contains("MC_RETRY_CNT = 9 (default)"), "{stdout}");
    assert!(
        stdout.contains("MC_REDIS_PASSWORD = <set> (environment"),
        "{stdout}"
    );
    assert!(!stdout.contains("not-to-be-printed"), "{stdout}");
}

#[test]
fn json_is_one_object_with_every_key() {
    let (out, _) = run(&["--json"], ENV);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    for key in [
        "version",
        "features",
        "devices",
        "priority_matrix",
        "transports",
        "settings",
    ] {
        assert!(v.get(key).is_some(), "no {key:?} in {v}");
    }
    assert!(v.get("peer").is_none(), "{v}");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["features"]["rdma"], cfg!(feature = "rdma"));
    assert_eq!(v["features"]["hwloc"], cfg!(feature = "hwloc"));
    assert!(!v["devices"]["numa_nodes"].as_array().unwrap().is_empty());
    let net = v["devices"]["net"].as_array().unwrap();
    assert!(
        net.iter().any(|n| n["loopback"] == true && n["up"] == true),
        "{net:?}"
    );
    assert!(v["priority_matrix"].is_object(), "{v}");

    let transports = v["transports"].as_array().unwrap();
    let of = |p: &str| transports.iter().find(|t| t["protocol"] == p).cloned();
    let tcp = of("tcp").unwrap_or_else(|| panic!("{transports:?}"));
    let rdma = of("rdma").unwrap_or_else(|| panic!("{transports:?}"));
    // The test machines have no RDMA device: TCP is the network transport.
    assert_eq!(tcp["installed"], true, "{tcp}");
    assert_eq!(rdma["installed"], false, "{rdma}");
    assert_eq!(rdma["why"], "no RDMA device with an active port", "{rdma}");

    let settings = v["settings"].as_array().unwrap();
    let by = |var: &str| {
        settings
            .iter()
            .find(|s| s["variables"].as_array().unwrap().iter().any(|x| x == var))
            .cloned()
            .unwrap_or_else(|| panic!("no {var} in {settings:?}"))
    };
    let slice = by("MC_SLICE_SIZE");
    assert_eq!(slice["source"], "environment", "{slice}");
    assert_eq!(slice["set_by"], "MC_SLICE_SIZE", "{slice}");
    assert_eq!(slice["value"], "131072 (128 KiB)", "{slice}");
    assert_eq!(slice["default"], "65536 (64 KiB)", "{slice}");
    let retry = by("MC_RETRY_CNT");
    assert_eq!(retry["source"], "default", "{retry}");
    assert!(retry.get("set_by").is_none(), "{retry}");
    assert_eq!(by("MC_REDIS_PASSWORD")["value"], "<set>");
    assert!(!stdout.contains("not-to-be-printed"));
}

#[test]
fn a_setting_turned_off_says_why_its_transport_is_left_out() {
    let (out, _) = run(&["--json"], &[("MC_TE_SHM", "0")]);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    let shm = v["transports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["protocol"] == "shm")
        .cloned()
        .unwrap();
    assert_eq!(shm["installed"], false, "{shm}");
    assert_eq!(shm["why"], "MC_TE_SHM is off", "{shm}");
}

#[test]
fn a_refused_setting_fails_with_its_name() {
    let (out, _) = run(&[], &[("MC_SLICE_SIZE", "abc")]);
    let (_, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("MC_SLICE_SIZE=abc"), "{stderr}");
}
