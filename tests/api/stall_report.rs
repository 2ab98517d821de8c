//! The stall report (`MC_TE_STALL_REPORT_SEC`): a task still waiting that
//! long after its submission is logged once, naming its peer, the
//! transport carrying it, its outstanding slices and what they wait for
//! (here a TCP rail with the bytes of a WRITE a hand-written Mooncake
//! server took and never acknowledged); a task that ends in time is not.
//! The engine runs in a child (this test binary again, `TE_STALL_REPORT_CHILD`
//! set), whose log on stderr the test reads.

use crate::common;

use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

const CHILD_VAR: &str = "TE_STALL_REPORT_CHILD";
const BASE: u64 = 0x5000_0000;
const LEN: u64 = 1 << 20;
/// Requests from here on are taken and never answered.
const HUNG: u64 = BASE + LEN / 2;

/// The child: a WRITE the server never acknowledges and one it does, then
/// three seconds of waiting with the report at one second.
fn child() {
    transfer_engine::init_logging();
    let (_server, hs) = hanging_peer(BASE, LEN, HUNG);
    let e = engine_with(&[("MC_TE_STALL_REPORT_SEC", "1")]);
    let buf = Buf::new(64 << 10, 3);
    register(&e, &buf, false);
    let seg = e.open_segment(&hs.name()).expect("open");
    let ok = run_within(
        &e,
        &[write_req(buf.addr(), seg, BASE, 64 << 10)],
        Duration::from_secs(20),
    );
    assert_eq!(ok, vec![transfer_engine::TaskStatus::Completed]);
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[write_req(buf.addr(), seg, HUNG, 64 << 10)])
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    eprintln!("CHILD SEGMENT {}", hs.name());
    e.shutdown();
}

#[test]
fn a_task_waiting_past_the_bound_is_logged_once_with_what_it_waits_for() {
    if std::env::var_os(CHILD_VAR).is_some() {
        return child();
    }
    let test = "a_task_waiting_past_the_bound_is_logged_once_with_what_it_waits_for";
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            &common::test_path(module_path!(), test),
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_VAR, "1")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run the child");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed: {log}");
    let segment = log
        .lines()
        .find_map(|l| l.strip_prefix("CHILD SEGMENT "))
        .expect("the child named its segment");
    let stalls: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("MC_TE_STALL_REPORT_SEC"))
        .collect();
    assert_eq!(stalls.len(), 1, "one task stalled, logged once: {log}");
    let line = stalls[0];
    println!("{line}");
    for want in [
        "task 0 of batch",
        &format!("to segment {segment:?} over tcp"),
        "1 of 1 slice(s) outstanding",
        "B in flight",
    ] {
        assert!(line.contains(want), "{want:?} missing from: {line}");
    }
}
