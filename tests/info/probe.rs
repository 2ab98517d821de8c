//! `--peer`: a live engine of this process probed over the P2P
//! handshake (its buffers' transports, timed READs, `--write` restoring
//! the peer's bytes), and peers that cannot be reached, each failing in
//! under a second with the reason.

use super::{run, texts};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use transfer_engine::{Config, Engine, Location, Region};

/// A cluster key (hex, as `MC_TE_AUTH_KEY` takes it), and another.
const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const OTHER_KEY: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/// An engine on loopback with auto discovery and `vars` as its only
/// settings, with one registered 2 MiB buffer of known bytes.
fn target(vars: &[(&str, &str)]) -> (Arc<Engine>, Vec<u8>) {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let config =
        Config::from_lookup(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()));
    let engine = Engine::builder("P2PHANDSHAKE", "127.0.0.1")
        .auto_discover(true)
        .config(config)
        .build()
        .unwrap();
    let mut buf: Vec<u8> = (0..2 << 20).map(|i: u32| (i % 251) as u8).collect();
    engine
        .register(&[Region {
            addr: buf.as_mut_ptr() as u64,
            length: buf.len() as u64,
            location: Location::Any,
            remote_accessible: true,
        }])
        .unwrap();
    (engine, buf)
}

/// The tool's JSON report of a probe of `engine`, run with `extra`
/// arguments and the variables `env`.
fn probe(engine: &Engine, extra: &[&str], env: &[(&str, &str)]) -> Value {
    let name = engine.local_name();
    let mut args = vec!["--json", "--local-name", "127.0.0.1", "--peer", name];
    args.extend_from_slice(extra);
    let (out, _) = run(&args, env);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}\n{stdout}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Checks the peer section: one buffer, `buf`, reached by `transport`,
/// and both sizes timed over it.
fn check_peer(v: &Value, buf: &[u8], transport: &str, write: bool) {
    let p = &v["peer"];
    assert!(p["open_ms"].as_f64().unwrap() > 0.0, "{p}");
    assert!(p["first_read_ms"].as_f64().unwrap() > 0.0, "{p}");
    let buffers = p["buffers"].as_array().unwrap();
    assert_eq!(buffers.len(), 1, "{p}");
    assert_eq!(buffers[0]["addr"], buf.as_ptr() as u64, "{p}");
    assert_eq!(buffers[0]["length"], buf.len() as u64, "{p}");
    assert_eq!(buffers[0]["transport"], transport, "{p}");
    let trips = p["round_trips"].as_array().unwrap();
    let sizes: Vec<u64> = trips.iter().map(|t| t["bytes"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [4096, 1 << 20], "{p}");
    for t in trips {
        assert_eq!(t["buffer"], buf.as_ptr() as u64, "{t}");
        assert_eq!(t["transport"], transport, "{t}");
        assert!(t["read_ms"].as_f64().unwrap() > 0.0, "{t}");
        assert_eq!(t["write_ms"].is_f64(), write, "{t}");
        assert_eq!(
            t["verified"],
            if write {
                Value::Bool(true)
            } else {
                Value::Null
            }
        );
    }
}

/// The target's bytes as `target` wrote them.
fn unchanged(buf: &[u8]) -> bool {
    buf.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8)
}

#[test]
fn a_live_peer_is_reached_over_shm_and_tcp() {
    let (engine, buf) = target(&[]);
    // Same host: shared memory, where this kernel lets the processes
    // attach; TCP otherwise.
    let v = probe(&engine, &[], &[]);
    let shm = v["peer"]["buffers"][0]["transport"] == "shm";
    check_peer(&v, &buf, if shm { "shm" } else { "tcp" }, false);
    assert!(unchanged(&buf));

    let name = engine.local_name();
    let (out, _) = run(&["--local-name", "127.0.0.1", "--peer", name], &[]);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    let section = &stdout[stdout.find("== peer").unwrap_or_else(|| panic!("{stdout}"))..];
    println!("{section}");
    assert!(section.contains("round trips (READ only"), "{section}");
    assert!(section.contains("   4 KiB at "), "{section}");
    assert!(section.contains("   1 MiB at "), "{section}");

    let v = probe(&engine, &["--write"], &[("MC_TE_SHM", "0")]);
    check_peer(&v, &buf, "tcp", true);
    // The bytes read first were written back.
    assert!(unchanged(&buf));
}

#[test]
fn a_keyed_peer_is_reached_with_its_key() {
    let (engine, buf) = target(&[("MC_TE_AUTH_KEY", KEY)]);
    let v = probe(&engine, &[], &[("MC_TE_AUTH_KEY", KEY), ("MC_TE_SHM", "0")]);
    check_peer(&v, &buf, "tcp", false);
}

/// Runs a probe of `peer` that must fail within `within` with `reason`
/// (any of them) on stderr.
fn fails_within(within: Duration, peer: &str, env: &[(&str, &str)], reasons: &[&str]) {
    let (out, took) = run(&["--local-name", "127.0.0.1", "--peer", peer], env);
    let (stdout, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}\n{stdout}");
    assert!(took < within, "{peer}: {took:?}\n{stderr}");
    assert!(
        reasons.iter().any(|r| stderr.contains(r)),
        "{peer}: none of {reasons:?} in:\n{stderr}"
    );
    eprintln!("{peer} in {took:?}: {stderr}");
    assert!(stderr.contains(&format!("peer {peer}")), "{stderr}");
}

/// [`fails_within`] a second.
fn fails_fast(peer: &str, env: &[(&str, &str)], reasons: &[&str]) {
    fails_within(Duration::from_secs(1), peer, env, reasons);
}

#[test]
fn a_silent_peer_is_given_up_at_the_timeout() {
    // Accepts the handshake's connection and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = listener.local_addr().unwrap().to_string();
    let held = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
    // The default timeout (1 s) and the tool's start.
    fails_within(
        Duration::from_secs(2),
        &peer,
        &[],
        &["no answer within 1000 ms"],
    );
    drop(held.join());
}

#[test]
fn a_refused_port_fails_fast() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    fails_fast(&format!("127.0.0.1:{port}"), &[], &["refused"]);
}

#[test]
fn an_unknown_name_fails_fast() {
    fails_fast(
        "no-such-host.invalid:12345",
        &[],
        &["resolve", "not known", "DNS", "dns"],
    );
}

#[test]
fn a_key_mismatch_fails_fast() {
    let (engine, _buf) = target(&[("MC_TE_AUTH_KEY", KEY)]);
    fails_fast(
        engine.local_name(),
        &[("MC_TE_AUTH_KEY", OTHER_KEY)],
        &["key"],
    );
    // Without a key, the keyed peer refuses too.
    fails_fast(engine.local_name(), &[], &["key"]);
}
