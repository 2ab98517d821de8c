//! One initiator, two target processes, on real verbs (soft-RoCE in the VM
//! of `scripts/rdma-vm/`): the first target is stopped with SIGSTOP before
//! the initiator's first request to it, so that request's handshake hangs
//! (up to twice `MC_HANDSHAKE_CONNECT_TIMEOUT`, 40 s here); the second
//! target must meanwhile get its transfers, verified byte for byte, within
//! a bound far below that hang. The targets are this same test binary, run
//! with `TE_RDMA_CONNECTOR_CHILD=<device>`. Run with `--ignored
//! --test-threads 1` inside the VM.

use crate::common;
use crate::rdma_support as rdma;

use common::{Buf, pattern, read_req, register, run_within, write_req};
use rdma::{A, B};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use transfer_engine::TaskStatus;

const CHILD_VAR: &str = "TE_RDMA_CONNECTOR_CHILD";
const TEST: &str = "a_stopped_peer_does_not_delay_connections_to_another";
const MIB: usize = 1 << 20;
/// The bound on each transfer to the peer that runs, far below the 40 s a
/// handshake with the stopped peer hangs.
const BOUND: Duration = Duration::from_secs(15);

fn setup() {
    rdma::setup(&[
        ("MC_HANDSHAKE_CONNECT_TIMEOUT", "20"),
        ("MC_RDMA_COMPLETION_TIMEOUT", "5"),
        ("MC_RDMA_RAIL_PAUSE_SECONDS", "2"),
    ]);
}

/// The target, in a child: serves a buffer until its stdin closes.
fn child(dev: &str) {
    setup();
    let e = rdma::engine(&[dev]);
    let mem = Buf::zeroed(4 * MIB);
    register(&e, &mem, true);
    println!("CHILD READY {} {}", e.local_name(), mem.addr());
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    e.shutdown();
}

/// A target process on `dev`; returns it with its segment name and buffer.
fn spawn_target(dev: &str) -> (Child, String, u64) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([
            &common::test_path(module_path!(), TEST),
            "--exact",
            "--nocapture",
            "--ignored",
        ])
        .env(CHILD_VAR, dev)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // Its log would land amid the parent's test report.
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn a target");
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.find("CHILD READY ").map(|at| l[at + 12..].to_string()))
        .expect("the target's READY line");
    // Drained until the target exits, so its writes never fail.
    std::thread::spawn(move || lines.for_each(drop));
    let (name, base) = ready.split_once(' ').unwrap();
    (c, name.to_string(), base.parse().unwrap())
}

fn signal(c: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child this test spawned and has not
    // reaped.
    let rc = unsafe { libc::kill(c.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({}, {sig})", c.id());
}

/// Ends a target: resumed, stdin closed, killed if it does not exit.
fn finish(mut c: Child) {
    signal(&c, libc::SIGCONT);
    drop(c.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if c.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    let _ = c.wait();
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn a_stopped_peer_does_not_delay_connections_to_another() {
    if let Ok(dev) = std::env::var(CHILD_VAR) {
        return child(&dev);
    }
    setup();
    let (stopped, name1, base1) = spawn_target(B[0].0);
    let (running, name2, base2) = spawn_target(B[1].0);
    // One device: before the fix, one connector thread served both peers.
    let a = rdma::engine(&[A[0].0]);
    let local = Buf::zeroed(8 * MIB);
    register(&a, &local, true);
    let seg1 = a.open_segment(&name1).expect("open target 1");
    let seg2 = a.open_segment(&name2).expect("open target 2");
    signal(&stopped, libc::SIGSTOP);
    std::thread::scope(|s| {
        // The request to the stopped peer: its handshake hangs.
        let hung = s.spawn(|| {
            let w = write_req(local.addr(), seg1, base1, 64 * 1024);
            let t0 = Instant::now();
            let st = run_within(&a, &[w], Duration::from_secs(180));
            (st, t0.elapsed())
        });
        std::thread::sleep(Duration::from_secs(1));
        // The running peer: WRITE then READ back, each within the bound.
        let mut took = Vec::new();
        for round in 0..4u8 {
            let data = pattern(MIB, round);
            local.set(MIB, &data);
            let t0 = Instant::now();
            let w = write_req(local.addr() + MIB as u64, seg2, base2 + 1, MIB as u64);
            let st = run_within(&a, &[w], Duration::from_secs(120));
            let r = read_req(local.addr() + 4 * MIB as u64, seg2, base2 + 1, MIB as u64);
            let st2 = run_within(&a, &[r], Duration::from_secs(120));
            let dt = t0.elapsed();
            took.push(dt);
            eprintln!("round {round} to the running peer: {st:?} {st2:?} in {dt:?}");
            assert_eq!(st, [TaskStatus::Completed], "WRITE, round {round}");
            assert_eq!(st2, [TaskStatus::Completed], "READ, round {round}");
            assert_eq!(local.get(4 * MIB, MIB), data, "bytes, round {round}");
            assert!(
                dt < BOUND,
                "round {round} to the running peer took {dt:?} while the other peer is stopped"
            );
        }
        eprintln!("the running peer was served in {took:?} while the other is stopped");
        signal(&stopped, libc::SIGCONT);
        let (st, dt) = hung.join().expect("the hung request");
        eprintln!("the request to the stopped peer ended {st:?} after {dt:?}");
        assert_ne!(st, [TaskStatus::Waiting]);
    });
    a.shutdown();
    finish(stopped);
    finish(running);
}
