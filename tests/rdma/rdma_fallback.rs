//! Several transports per engine: engines with RDMA and TCP installed move
//! bytes over RDMA while it works; when every RDMA rail to the peer is
//! down (both of the initiator's links taken down), the slices fall back
//! to TCP and the transfers still complete, every byte verified, and
//! over RDMA again once the links are back. Run inside the soft-RoCE VM
//! (scripts/rdma-vm/) with `--ignored --test-threads 1`.

use crate::common;
use crate::rdma_support as rdma;

use common::{Buf, pattern, read_req, register, run_within, write_req};
use rdma::{A, B};
use std::time::Duration;
use transfer_engine::{Engine, TaskStatus};

const MIB: usize = 1 << 20;

/// An engine with RDMA on `devs` and TCP, with RDMA timeouts short enough
/// that a dead link is given up on quickly.
fn engine(devs: &[&str]) -> std::sync::Arc<Engine> {
    let mut config = rdma::config();
    config.rdma.completion_timeout_secs = 2;
    config.sched.rail_pause_secs = 2;
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1")
        .config(config)
        .build()
        .expect("engine");
    e.install_transport("rdma", Some(&rdma::matrix(devs)))
        .expect("rdma");
    e.install_transport("tcp", None).expect("tcp");
    e
}

/// WRITE then READ back `len` bytes; checks every byte.
fn round_trip(a: &Engine, seg: i32, local: &Buf, remote: &Buf, len: usize, seed: u8) {
    let data = pattern(len, seed);
    local.set(0, &data);
    let w = write_req(local.addr(), seg, remote.addr() + 5, len as u64);
    let t = Duration::from_secs(120);
    assert_eq!(run_within(a, &[w], t), [TaskStatus::Completed], "WRITE");
    assert_eq!(
        remote.get(5, len),
        data,
        "the target holds what was written"
    );
    local.set(0, &vec![0u8; len]);
    let r = read_req(local.addr(), seg, remote.addr() + 5, len as u64);
    assert_eq!(run_within(a, &[r], t), [TaskStatus::Completed], "READ");
    assert_eq!(local.get(0, len), data, "READ brings back every byte");
}

fn rdma_sent() -> u64 {
    A.iter().map(|(dev, _)| rdma::sent(dev)).sum()
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn rdma_falls_back_to_tcp_when_its_rails_are_down() {
    rdma::setup(&[]);
    let a = engine(&[A[0].0, A[1].0]);
    let b = engine(&[B[0].0, B[1].0]);
    let local = Buf::zeroed(8 * MIB);
    let remote = Buf::zeroed(8 * MIB);
    register(&a, &local, true);
    register(&b, &remote, true);
    let d = common::descriptor(&b);
    assert_eq!(d["protocol"], "rdma", "what Mooncake peers read: {d}");
    assert_ne!(d["tcp_data_port"], 0, "{d}");
    let seg = a.open_segment(b.local_name()).expect("open");

    let before = rdma_sent();
    round_trip(&a, seg, &local, &remote, 4 * MIB, 1);
    assert!(rdma_sent() > before + 1000, "RDMA carried the first round");

    let guards = [rdma::LinkGuard(A[0].1), rdma::LinkGuard(A[1].1)];
    for (_, iface) in A {
        rdma::set_link(iface, false);
    }
    for seed in 2..5 {
        round_trip(&a, seg, &local, &remote, 4 * MIB, seed);
    }
    eprintln!("with both RDMA links down, 3 rounds of 4 MiB went over TCP");

    drop(guards);
    for (dev, _) in A {
        rdma::wait_port_active(dev, Duration::from_secs(30));
    }
    // Paused rails come back after their pause; RDMA carries again.
    std::thread::sleep(Duration::from_secs(3));
    let before = rdma_sent();
    for seed in 5..8 {
        round_trip(&a, seg, &local, &remote, 4 * MIB, seed);
    }
    assert!(
        rdma_sent() > before + 1000,
        "RDMA carries again once the links are back"
    );
    a.shutdown();
    b.shutdown();
}
