//! Through the C ABI: an engine whose cluster key (MC_TE_AUTH_KEY_FILE, from
//! the process environment as a C caller sets it) differs from its peer's
//! cannot open the peer's segment, and `te_last_error` says why. The C ABI
//! reads the process environment, once: the test runs in a child process
//! of this binary started with that variable in its environment.

use crate::common;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::process::Command;
use std::time::{Duration, Instant};
use transfer_engine::{Config, Engine};

/// Set in the child's environment: the peer's key file.
const CHILD_VAR: &str = "TE_AUTH_LAST_ERROR_PEER_KEY";
/// What the child prints once every assertion held.
const CHILD_DONE: &str = "CHILD DONE";

unsafe extern "C" {
    fn createTransferEngine(
        metadata_conn_string: *const c_char,
        local_server_name: *const c_char,
        ip_or_host_name: *const c_char,
        rpc_port: u64,
        auto_discover: c_int,
    ) -> *mut c_void;
    fn openSegment(engine: *mut c_void, segment_name: *const c_char) -> i32;
    fn destroyTransferEngine(engine: *mut c_void);
    fn te_last_error(buf: *mut c_char, len: usize) -> usize;
}

fn last_error() -> String {
    let mut buf = vec![0 as c_char; 4096];
    // SAFETY: `buf` is valid for its length.
    unsafe { te_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: te_last_error NUL-terminates what it writes.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn key_file(seed: u8) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("te-auth-ffi-{}-{seed}", std::process::id()));
    let hex: String = (0..32u8).map(|i| format!("{:02x}", i ^ seed)).collect();
    std::fs::write(&p, hex).expect("key file");
    p
}

#[test]
fn a_peer_with_another_key_fails_open_segment_and_te_last_error_says_so() {
    if let Some(theirs) = std::env::var_os(CHILD_VAR) {
        return child(theirs.to_str().expect("utf-8").to_string());
    }
    let (ours, theirs) = (key_file(1), key_file(2));
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            &common::test_path(
                module_path!(),
                "a_peer_with_another_key_fails_open_segment_and_te_last_error_says_so",
            ),
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_VAR, &theirs)
        .env("MC_TE_AUTH_KEY_FILE", &ours)
        .output()
        .expect("run the child");
    let _ = std::fs::remove_file(ours);
    let _ = std::fs::remove_file(theirs);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "the child exited with {}", out.status);
    // Not a child that ran no test.
    assert!(text.contains(CHILD_DONE), "the child did not run the test");
}

/// The test, in a process whose environment names our key file: a peer
/// with the key of `their_path`, and an engine through the C ABI.
fn child(their_path: String) {
    let cfg = Config::from_lookup(move |k| match k {
        "MC_TE_AUTH_KEY_FILE" => Some(their_path.clone()),
        _ => None,
    });
    let peer = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .config(cfg)
        .build()
        .expect("peer");
    peer.install_transport("tcp", None).expect("tcp");
    let conn = CString::new("P2PHANDSHAKE").unwrap();
    let name = CString::new("127.0.0.1").unwrap();
    // SAFETY: valid NUL-terminated strings.
    let e = unsafe { createTransferEngine(conn.as_ptr(), name.as_ptr(), name.as_ptr(), 0, 0) };
    assert!(!e.is_null(), "createTransferEngine: {}", last_error());
    let seg = CString::new(peer.local_name()).unwrap();
    let t0 = Instant::now();
    // SAFETY: `e` is a live engine; `seg` is NUL-terminated.
    let id = unsafe { openSegment(e, seg.as_ptr()) };
    let err = last_error();
    assert!(id < 0, "opened with another key");
    assert!(
        err.contains("authentication refused by the peer: wrong key"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    // SAFETY: `e` is live and not used after.
    unsafe { destroyTransferEngine(e) };
    println!("{CHILD_DONE}");
}
