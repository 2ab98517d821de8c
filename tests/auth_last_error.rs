//! Through the C ABI: an engine whose cluster key (MC_TE_AUTH_KEY_FILE, from
//! the process environment as a C caller sets it) differs from its peer's
//! cannot open the peer's segment, and `te_last_error` says why. Alone in
//! its test binary: the process configuration is read once.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::time::{Duration, Instant};
use transfer_engine::{Config, Engine};

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
    let (ours, theirs) = (key_file(1), key_file(2));
    let their_path = theirs.to_str().expect("utf-8").to_string();
    let cfg = Config::from_lookup(move |k| match k {
        "MC_TE_AUTH_KEY_FILE" => Some(their_path.clone()),
        _ => None,
    });
    let peer = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .config(cfg)
        .build()
        .expect("peer");
    peer.install_transport("tcp", None).expect("tcp");
    // SAFETY: no other thread of this test binary reads the environment.
    unsafe { std::env::set_var("MC_TE_AUTH_KEY_FILE", &ours) };
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
    let _ = std::fs::remove_file(ours);
    let _ = std::fs::remove_file(theirs);
}
