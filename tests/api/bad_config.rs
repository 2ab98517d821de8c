//! A value of an `MC_*` variable that is not allowed fails engine creation
//! with an error naming the variable, the value and what it takes: through
//! the Rust builder (a lookup, or the process environment) and through the
//! C ABI (`createTransferEngine` returns NULL and `te_last_error` says
//! why). The C ABI reads the process environment, once: those tests run
//! in a child process of this binary started with the bad value in its
//! environment. A Mooncake variable this engine does not read fails
//! nothing: each one set is named in one warning per process. The same
//! children check `MC_LOG_DIR`, which the library's logging setup reads.

use crate::common;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::process::Command;
use transfer_engine::{Config, ConfigError, Engine, Error};

/// Set in the child's environment: which test the child runs.
const CHILD_VAR: &str = "TE_BAD_CONFIG_CHILD";
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

fn lookup(vars: &[(&'static str, &'static str)]) -> Result<Config, ConfigError> {
    let vars = vars.to_vec();
    Config::from_lookup(move |k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
}

/// The error of an engine built with `vars`.
fn build_error(vars: &[(&'static str, &'static str)]) -> Error {
    match Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .config(lookup(vars))
        .build()
    {
        Ok(e) => {
            e.shutdown();
            panic!("an engine was built with {vars:?}")
        }
        Err(e) => e,
    }
}

#[test]
fn a_bad_value_fails_the_builder_naming_variable_value_and_range() {
    for (vars, want) in [
        (
            &[("MC_SLICE_SIZE", "abc")][..],
            "MC_SLICE_SIZE=abc is not a number in 1..=1099511627776",
        ),
        (
            &[("MC_SLICE_SIZE", "0")][..],
            "MC_SLICE_SIZE=0 is not a number in 1..=1099511627776",
        ),
        (
            &[("MC_TCP_LANES_PER_PEER", "17")][..],
            "MC_TCP_LANES_PER_PEER=17 is not a number in 1..=16",
        ),
        (
            &[("MC_ENDPOINT_STORE_TYPE", "LRU")][..],
            "MC_ENDPOINT_STORE_TYPE=LRU is not one of SIEVE or FIFO",
        ),
        (
            &[("MC_MTU", "1500")][..],
            "MC_MTU=1500 is not one of 512, 1024, 2048 or 4096",
        ),
        (
            &[("MC_MIN_RPC_PORT", "40000")][..],
            "MC_MIN_RPC_PORT=40000 is not a number in 1024..=65535 outside 32768..=60999",
        ),
    ] {
        let e = build_error(vars);
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("invalid argument: bad configuration: {want}")
        );
    }
    // Every refused value is named at once.
    let e = build_error(&[("MC_SLICE_SIZE", "abc"), ("MC_SHM_THREADS", "0")]);
    let text = e.to_string();
    assert!(
        text.contains("MC_SLICE_SIZE=abc is not a number in 1..=1099511627776")
            && text.contains("MC_SHM_THREADS=0 is not a number in 1..=64"),
        "{text}"
    );
}

#[test]
fn values_allowed_before_are_still_allowed() {
    // 0 turns the slice timeout off, as unset does; Mooncake's spelling of
    // the port range and the older name of the lanes are read.
    let c = lookup(&[
        ("MC_SLICE_TIMEOUT", "0"),
        ("MC_MIN_PRC_PORT", "2000"),
        ("MC_MAX_PRC_PORT", "3000"),
        ("MC_TCP_MAX_CONNECTIONS_PER_PEER", "2"),
        ("MC_TE_METRIC", "2"),
        ("MC_LEGACY_RPC_PORT_BINDING", ""),
    ])
    .expect("allowed");
    assert_eq!(c.engine.slice_timeout_secs, 0);
    assert_eq!((c.rpc.min_port, c.rpc.max_port), (2000, 3000));
    assert_eq!(c.tcp.lanes_per_peer, 2);
    assert!(!c.engine.metric && c.rpc.legacy_port_binding);
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .config(lookup(&[("MC_SLICE_TIMEOUT", "0")]))
        .build()
        .expect("engine");
    e.shutdown();
}

/// Runs `test` of this file in a child process with `env` set; the child
/// runs the part after `if let Some(..) = child()`.
fn in_child(test: &str, env: &[(&str, &str)]) {
    child_output(test, env);
}

/// [`in_child`], giving the child's stdout and stderr.
fn child_output(test: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        &common::test_path(module_path!(), test),
        "--exact",
        "--nocapture",
    ])
    .env(CHILD_VAR, test);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the child");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "the child exited with {}", out.status);
    // Not a child that ran no test.
    assert!(text.contains(CHILD_DONE), "the child did not run the test");
    text
}

#[test]
fn a_set_unsupported_variable_is_named_once_in_the_log() {
    const TEST: &str = "a_set_unsupported_variable_is_named_once_in_the_log";
    let vars = ["MC_CONN_PAUSE_TTL_MS", "MC_TCP_SLICE_SIZE"];
    if std::env::var_os(CHILD_VAR).is_none() {
        let log = child_output(TEST, &[(vars[0], "1000"), (vars[1], "1")]);
        for var in vars {
            let lines: Vec<&str> = log.lines().filter(|l| l.contains(var)).collect();
            assert_eq!(lines.len(), 1, "{var} is not named once: {log}");
            assert!(
                lines[0].contains("WARN") && lines[0].contains("not supported"),
                "{}",
                lines[0]
            );
        }
        return;
    }
    // Three engines, through the C ABI and the builder: one line each.
    let conn = CString::new("P2PHANDSHAKE").unwrap();
    let name = CString::new("127.0.0.1").unwrap();
    for _ in 0..2 {
        // SAFETY: valid NUL-terminated strings.
        let e = unsafe { createTransferEngine(conn.as_ptr(), name.as_ptr(), name.as_ptr(), 0, 0) };
        assert!(!e.is_null(), "{}", last_error());
        // SAFETY: `e` is live and not used after.
        unsafe { destroyTransferEngine(e) };
    }
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .build()
        .expect("engine");
    e.shutdown();
    assert_eq!(transfer_engine::config().unwrap().unsupported, vars);
    println!("{CHILD_DONE}");
}

#[test]
fn mc_log_dir_sends_the_library_s_log_to_a_file_there() {
    const TEST: &str = "mc_log_dir_sends_the_library_s_log_to_a_file_there";
    if std::env::var_os(CHILD_VAR).is_none() {
        let dir = std::env::temp_dir().join(format!("te-api-log-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = child_output(TEST, &[("MC_LOG_DIR", dir.to_str().unwrap())]);
        let files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
        assert!(
            name.starts_with("transfer-engine.") && name.ends_with(".log"),
            "{name}"
        );
        let log = std::fs::read_to_string(&files[0]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(log.contains("transfer engine created"), "{log}");
        assert!(!out.contains("transfer engine created"), "{out}");
        // A directory that is not there: named on stderr, which gets the log.
        let missing = std::env::temp_dir().join("te-api-log-dir-not-there");
        let out = child_output(TEST, &[("MC_LOG_DIR", missing.to_str().unwrap())]);
        assert!(
            out.contains(&format!(
                "MC_LOG_DIR={} is not a directory",
                missing.display()
            )),
            "{out}"
        );
        assert!(out.contains("transfer engine created"), "{out}");
        return;
    }
    let conn = CString::new("P2PHANDSHAKE").unwrap();
    let name = CString::new("127.0.0.1").unwrap();
    // SAFETY: valid NUL-terminated strings.
    let e = unsafe { createTransferEngine(conn.as_ptr(), name.as_ptr(), name.as_ptr(), 0, 0) };
    assert!(!e.is_null(), "{}", last_error());
    // SAFETY: `e` is live and not used after.
    unsafe { destroyTransferEngine(e) };
    println!("{CHILD_DONE}");
}

#[test]
fn create_transfer_engine_returns_null_and_te_last_error_names_the_value() {
    const TEST: &str = "create_transfer_engine_returns_null_and_te_last_error_names_the_value";
    if std::env::var_os(CHILD_VAR).is_none() {
        return in_child(TEST, &[("MC_SLICE_SIZE", "abc")]);
    }
    let conn = CString::new("P2PHANDSHAKE").unwrap();
    let name = CString::new("127.0.0.1").unwrap();
    for _ in 0..2 {
        // SAFETY: valid NUL-terminated strings.
        let e = unsafe { createTransferEngine(conn.as_ptr(), name.as_ptr(), name.as_ptr(), 0, 0) };
        if !e.is_null() {
            // SAFETY: `e` is live and not used after.
            unsafe { destroyTransferEngine(e) };
            panic!("an engine was created with MC_SLICE_SIZE=abc");
        }
        let err = last_error();
        assert!(
            err.contains("MC_SLICE_SIZE=abc is not a number in 1..=1099511627776"),
            "{err}"
        );
    }
    println!("{CHILD_DONE}");
}

#[test]
fn the_builder_without_a_config_refuses_the_environment_s_bad_value() {
    const TEST: &str = "the_builder_without_a_config_refuses_the_environment_s_bad_value";
    if std::env::var_os(CHILD_VAR).is_none() {
        return in_child(TEST, &[("MC_HANDSHAKE_WORKERS", "many")]);
    }
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .build()
        .err()
        .expect("refused");
    assert_eq!(
        e.to_string(),
        "invalid argument: bad configuration: MC_HANDSHAKE_WORKERS=many is not a number in \
         1..=64"
    );
    assert!(transfer_engine::config().is_err());
    println!("{CHILD_DONE}");
}

/// Whether this host has an RDMA device (the kernel lists it).
fn has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn mc_te_require_transport_refuses_an_unknown_name_and_accepts_local_alone() {
    let e = build_error(&[("MC_TE_REQUIRE_TRANSPORT", "tcp,nvlink")]);
    assert_eq!(
        e.to_string(),
        "invalid argument: bad configuration: MC_TE_REQUIRE_TRANSPORT=tcp,nvlink is not a \
         comma list of `local`, `shm`, `rdma`, `tcp`"
    );
    let c = lookup(&[("MC_TE_REQUIRE_TRANSPORT", "local")]).expect("allowed");
    assert_eq!(c.engine.require_transport.to_string(), "local");
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .config(c)
        .build()
        .expect("copies within the process are always provided");
    e.shutdown();
}

#[test]
fn mc_te_require_transport_rdma_without_rdma_devices_fails_creation_with_the_reason() {
    const TEST: &str =
        "mc_te_require_transport_rdma_without_rdma_devices_fails_creation_with_the_reason";
    if has_rdma_device() {
        return common::skip("this host has RDMA devices");
    }
    if std::env::var_os(CHILD_VAR).is_none() {
        for auto in [true, false] {
            let e = match Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
                .auto_discover(auto)
                .config(lookup(&[("MC_TE_REQUIRE_TRANSPORT", "rdma")]))
                .build()
            {
                Ok(e) => {
                    e.shutdown();
                    panic!("an engine pinned to rdma was built without RDMA devices")
                }
                Err(e) => e,
            };
            assert!(matches!(e, Error::DeviceNotFound(_)), "{e:?}");
            let text = e.to_string();
            let why = if cfg!(feature = "rdma") {
                "no RDMA device with an active port on this machine"
            } else {
                "not available in this build"
            };
            assert!(
                text.contains("MC_TE_REQUIRE_TRANSPORT=rdma: rdma cannot be used (")
                    && text.contains(why),
                "{text}"
            );
        }
        // With shared memory listed beside it, the engine has one of them.
        let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
            .auto_discover(true)
            .config(lookup(&[("MC_TE_REQUIRE_TRANSPORT", "shm,rdma")]))
            .build()
            .expect("shm is provided");
        assert!(common::descriptor(&e).get("shm").is_some());
        e.shutdown();
        in_child(TEST, &[("MC_TE_REQUIRE_TRANSPORT", "rdma")]);
        return;
    }
    // The C ABI, with and without auto discovery: NULL, and why.
    let conn = CString::new("P2PHANDSHAKE").unwrap();
    let name = CString::new("127.0.0.1").unwrap();
    for auto in [1, 0] {
        // SAFETY: valid NUL-terminated strings.
        let e =
            unsafe { createTransferEngine(conn.as_ptr(), name.as_ptr(), name.as_ptr(), 0, auto) };
        assert!(e.is_null(), "an engine pinned to rdma was created");
        let why = last_error();
        assert!(
            why.contains("MC_TE_REQUIRE_TRANSPORT=rdma: rdma cannot be used ("),
            "{why}"
        );
    }
    println!("{CHILD_DONE}");
}
