//! RDMA on real verbs (soft-RoCE in the VM of `scripts/rdma-vm/`): engines
//! of node A (`rxe_a0`, `rxe_a1`) and node B (`rxe_b0`, `rxe_b1`) in one
//! process. Every byte is verified; faults are real (a stale key the
//! device refuses, a link taken down, engines destroyed mid-transfer).
//! Run with `--ignored --test-threads 1` inside the VM.

mod common;
#[path = "rdma_support/mod.rs"]
mod rdma;

use common::{Buf, pattern, read_req, register, register_range, run_within, write_req};
use rdma::{A, B};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use transfer_engine::TaskStatus;
use transfer_engine::{Engine, Request};

const MIB: usize = 1 << 20;
const T: Duration = Duration::from_secs(60);

fn setup() {
    rdma::setup(&[
        ("MC_RDMA_COMPLETION_TIMEOUT", "3"),
        ("MC_RDMA_RAIL_PAUSE_SECONDS", "2"),
    ]);
}

fn all_completed(s: &[TaskStatus]) -> bool {
    s.iter().all(|s| *s == TaskStatus::Completed)
}

/// WRITE then READ back `len` bytes at odd offsets; checks every byte.
fn round_trip(a: &Engine, seg: i32, local: &Buf, remote: &Buf, len: usize, seed: u8) {
    let data = pattern(len, seed);
    local.set(1, &data);
    let w = write_req(local.addr() + 1, seg, remote.addr() + 3, len as u64);
    assert!(all_completed(&run_within(a, &[w], T)), "WRITE of {len}");
    assert_eq!(
        remote.get(3, len),
        data,
        "the target holds what was written ({len} B)"
    );
    local.set(1, &vec![0u8; len]);
    let r = read_req(local.addr() + 1, seg, remote.addr() + 3, len as u64);
    assert!(all_completed(&run_within(a, &[r], T)), "READ of {len}");
    assert_eq!(
        local.get(1, len),
        data,
        "READ brings back every byte ({len} B)"
    );
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn two_rails_carry_verified_bytes_both_ways() {
    setup();
    let a = rdma::engine(&[A[0].0, A[1].0]);
    let b = rdma::engine(&[B[0].0, B[1].0]);
    let local = Buf::zeroed(40 * MIB);
    let remote = Buf::zeroed(40 * MIB);
    register(&a, &local, true);
    register(&b, &remote, true);
    let seg = a.open_segment(b.local_name()).expect("open");
    let before: Vec<u64> = A.iter().map(|(d, _)| rdma::sent(d)).collect();
    for (i, len) in [1usize, 4095, 65537, MIB + 13, 32 * MIB + 1]
        .into_iter()
        .enumerate()
    {
        round_trip(&a, seg, &local, &remote, len, i as u8);
    }
    // Four threads at once, each on its own range.
    std::thread::scope(|s| {
        for t in 0..4usize {
            let (a, local, remote) = (&a, &local, &remote);
            s.spawn(move || {
                for round in 0..3u8 {
                    let len = MIB + 7 * t;
                    let off = 1 + t * 2 * MIB;
                    let data = pattern(len, 40 + round + t as u8);
                    local.set(off, &data);
                    let w = write_req(
                        local.addr() + off as u64,
                        seg,
                        remote.addr() + off as u64,
                        len as u64,
                    );
                    assert!(all_completed(&run_within(a, &[w], T)));
                    let back = off + MIB * 8 * 4;
                    let r = read_req(
                        local.addr() + back as u64,
                        seg,
                        remote.addr() + off as u64,
                        len as u64,
                    );
                    assert!(all_completed(&run_within(a, &[r], T)));
                    assert_eq!(local.get(back, len), data, "thread {t} round {round}");
                }
            });
        }
    });
    let after: Vec<u64> = A.iter().map(|(d, _)| rdma::sent(d)).collect();
    for (i, (b4, af)) in before.iter().zip(&after).enumerate() {
        assert!(
            af > b4,
            "{} sent no packets: both rails carry slices",
            A[i].0
        );
    }
    let loads = a.nic_loads();
    assert_eq!(
        loads.iter().map(|l| l.device.as_str()).collect::<Vec<_>>(),
        vec![A[0].0, A[1].0],
        "getNicLoadStats lists the RDMA devices"
    );
    a.shutdown();
    b.shutdown();
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn bad_remote_ranges_fail_without_touching_a_byte() {
    setup();
    let a = rdma::engine(&[A[0].0]);
    let b = rdma::engine(&[B[0].0]);
    let local = Buf::new(4 * MIB, 1);
    register(&a, &local, true);
    let open = Buf::new(MIB, 2);
    let closed = Buf::new(MIB, 3);
    let dropped = Buf::new(MIB, 4);
    register(&b, &open, true);
    register(&b, &closed, false);
    register(&b, &dropped, true);
    let seg = a.open_segment(b.local_name()).expect("open");
    // Warm the endpoint up with a valid request.
    round_trip(&a, seg, &local, &open, 4096, 9);
    let snap = |x: &Buf| x.snapshot();
    let (open0, closed0) = (snap(&open), snap(&closed));

    let bad = [
        // Past the end, spanning the end, before the start.
        write_req(local.addr(), seg, open.addr() + MIB as u64, 16),
        write_req(local.addr(), seg, open.addr() + MIB as u64 - 8, 16),
        read_req(local.addr(), seg, open.addr() - 4096, 16),
        // A buffer registered without remote access.
        write_req(local.addr(), seg, closed.addr(), 4096),
        read_req(local.addr(), seg, closed.addr(), 4096),
    ];
    for r in bad {
        assert_eq!(run_within(&a, &[r], T), vec![TaskStatus::Failed], "{r:?}");
    }
    assert_eq!(snap(&open), open0, "no byte of the open buffer moved");
    assert_eq!(snap(&closed), closed0, "no byte of the closed buffer moved");

    // The device itself refuses a key that is no longer valid: B drops a
    // buffer whose key A still has in its cached descriptor.
    let dropped0 = snap(&dropped);
    b.unregister(&[dropped.addr()]).expect("unregister");
    let w = write_req(local.addr(), seg, dropped.addr() + 1, 64 * 1024);
    assert_eq!(run_within(&a, &[w], T), vec![TaskStatus::Failed]);
    let r = read_req(local.addr() + 1, seg, dropped.addr(), 4096);
    let local_before = local.get(1, 4096);
    assert_eq!(run_within(&a, &[r], T), vec![TaskStatus::Failed]);
    assert_eq!(
        snap(&dropped),
        dropped0,
        "the device wrote nothing with a revoked key"
    );
    assert_eq!(
        local.get(1, 4096),
        local_before,
        "a refused READ wrote nothing locally"
    );

    // The peer serves valid requests afterwards (a new endpoint).
    round_trip(&a, seg, &local, &open, 300_001, 10);
    a.shutdown();
    b.shutdown();
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn simultaneous_setup_from_both_sides() {
    setup();
    for round in 0..3u8 {
        let a = rdma::engine(&[A[0].0]);
        let b = rdma::engine(&[B[0].0]);
        let (la, lb) = (Buf::new(MIB, round), Buf::new(MIB, round + 50));
        register(&a, &la, true);
        register(&b, &lb, true);
        let sa = a.open_segment(b.local_name()).expect("open b");
        let sb = b.open_segment(a.local_name()).expect("open a");
        let start = Arc::new(Barrier::new(2));
        std::thread::scope(|s| {
            for (e, seg, local, remote) in [(&a, sa, &la, &lb), (&b, sb, &lb, &la)] {
                let start = start.clone();
                s.spawn(move || {
                    start.wait();
                    // Each side writes the upper half of the other's buffer
                    // from its lower half.
                    let h = MIB as u64 / 2;
                    let w = write_req(local.addr(), seg, remote.addr() + h, 65536);
                    assert!(all_completed(&run_within(e, &[w], T)), "round {round}");
                });
            }
        });
        assert_eq!(lb.get(MIB / 2, 65536), la.get(0, 65536));
        assert_eq!(la.get(MIB / 2, 65536), lb.get(0, 65536));
        a.shutdown();
        b.shutdown();
    }
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn restarted_peers_with_the_same_name_are_reached_again() {
    setup();
    let meta =
        transfer_engine::metadata::server::MetadataServer::start("127.0.0.1:0", "/metadata", None)
            .expect("metadata server");
    let conn = meta.url();
    let a = rdma::engine_named(&conn, "node-a", &[A[0].0]);
    let local = Buf::new(2 * MIB, 7);
    register(&a, &local, true);
    for generation in 0..2u8 {
        // The target restarts under the same name (same NIC path).
        let b = rdma::engine_named(&conn, "node-b", &[B[0].0]);
        let remote = Buf::zeroed(2 * MIB);
        register(&b, &remote, true);
        let seg = a.open_segment("node-b").expect("open");
        let data = pattern(MIB, 60 + generation);
        local.set(0, &data);
        let deadline = Instant::now() + Duration::from_secs(40);
        // The first requests after the restart may fail (the old endpoint
        // stops completing); then the new process is reached.
        loop {
            let w = write_req(local.addr(), seg, remote.addr() + 5, MIB as u64);
            if all_completed(&run_within(&a, &[w], T)) {
                break;
            }
            assert!(Instant::now() < deadline, "restarted target never reached");
        }
        assert_eq!(remote.get(5, MIB), data, "generation {generation}");
        b.shutdown();
    }
    // The initiator restarts under the same name: the target replaces the
    // endpoint connected to the old queue pairs.
    let b = rdma::engine_named(&conn, "node-b", &[B[0].0]);
    let remote = Buf::zeroed(MIB);
    register(&b, &remote, true);
    for generation in 0..2u8 {
        let a2 = rdma::engine_named(&conn, "node-a2", &[A[0].0]);
        let l2 = Buf::new(MIB, 90 + generation);
        register(&a2, &l2, true);
        let seg = a2.open_segment("node-b").expect("open");
        let w = write_req(l2.addr(), seg, remote.addr(), 65536);
        assert!(all_completed(&run_within(&a2, &[w], T)));
        assert_eq!(remote.get(0, 65536), l2.get(0, 65536));
        a2.shutdown();
    }
    a.shutdown();
    b.shutdown();
    meta.shutdown();
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn unregister_with_work_in_flight_ends_every_access() {
    setup();
    let a = rdma::engine(&[A[0].0, A[1].0]);
    let b = rdma::engine(&[B[0].0, B[1].0]);
    let remote = Buf::new(32 * MIB, 5);
    register(&b, &remote, true);
    let seg = a.open_segment(b.local_name()).expect("open");
    for victim in ["local", "remote"] {
        let local = Buf::zeroed(32 * MIB);
        register(&a, &local, true);
        // 32 READs of 1 MiB in flight.
        let reqs: Vec<Request> = (0..32)
            .map(|i| {
                read_req(
                    local.addr() + (i * MIB) as u64,
                    seg,
                    remote.addr() + (i * MIB) as u64,
                    MIB as u64,
                )
            })
            .collect();
        let batch = a.allocate_batch(reqs.len()).unwrap();
        a.submit(batch, &reqs).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let t0 = Instant::now();
        if victim == "local" {
            a.unregister(&[local.addr()]).expect("unregister local");
        } else {
            b.unregister(&[remote.addr()]).expect("unregister remote");
        }
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(10), "unregister took {took:?}");
        let frozen = local.snapshot();
        let mut done = 0;
        for i in 0..reqs.len() {
            match common::wait_task(&a, batch, i, T) {
                TaskStatus::Completed => done += 1,
                TaskStatus::Failed => {}
                s => panic!("task {i}: {s:?}"),
            }
        }
        a.free_batch(batch).unwrap();
        if victim == "local" {
            std::thread::sleep(Duration::from_millis(500));
            assert_eq!(
                local.snapshot(),
                frozen,
                "no byte lands after unregister returned"
            );
        }
        eprintln!("{victim} unregistered after 50 ms: {done}/32 READs completed, took {took:?}");
        if victim == "remote" {
            // The remote buffer is gone: every access with its key fails.
            let w = write_req(local.addr(), seg, remote.addr(), 4096);
            let before = remote.snapshot();
            assert_eq!(run_within(&a, &[w], T), vec![TaskStatus::Failed]);
            assert_eq!(
                remote.snapshot(),
                before,
                "nothing written through a revoked key"
            );
            a.unregister(&[local.addr()]).unwrap();
        }
    }
    a.shutdown();
    b.shutdown();
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn destroy_with_work_in_flight_releases_every_resource() {
    setup();
    let devs = [A[0].0, A[1].0, B[0].0, B[1].0];
    let baseline: Vec<_> = devs.iter().map(|d| rdma::resources(d)).collect();
    for round in 0..2 {
        let a = rdma::engine(&[A[0].0, A[1].0]);
        let b = rdma::engine(&[B[0].0, B[1].0]);
        let local = Buf::zeroed(16 * MIB);
        let remote = Buf::new(16 * MIB, 3);
        register(&a, &local, true);
        register(&b, &remote, true);
        let seg = a.open_segment(b.local_name()).expect("open");
        let reqs: Vec<Request> = (0..16)
            .map(|i| {
                let off = (i * MIB) as u64;
                if i % 2 == 0 {
                    read_req(local.addr() + off, seg, remote.addr() + off, MIB as u64)
                } else {
                    write_req(local.addr() + off, seg, remote.addr() + off, MIB as u64)
                }
            })
            .collect();
        let batch = a.allocate_batch(16).unwrap();
        a.submit(batch, &reqs).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let t0 = Instant::now();
        // Round 0 destroys the initiator first, round 1 the target.
        let (first, second) = if round == 0 { (&a, &b) } else { (&b, &a) };
        first.shutdown();
        second.shutdown();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "destroy took {:?}",
            t0.elapsed()
        );
        let frozen = local.snapshot();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            local.snapshot(),
            frozen,
            "no byte lands after destroy returned"
        );
        drop((a, b));
        let now: Vec<_> = devs.iter().map(|d| rdma::resources(d)).collect();
        assert_eq!(
            now, baseline,
            "PDs, CQs, QPs and MRs back to the baseline (round {round})"
        );
    }
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn a_rail_taken_down_mid_run_fails_over_and_is_used_again() {
    setup();
    let a = rdma::engine(&[A[0].0, A[1].0]);
    let b = rdma::engine(&[B[0].0, B[1].0]);
    let local = Buf::zeroed(16 * MIB);
    let remote = Buf::zeroed(16 * MIB);
    register(&a, &local, true);
    register(&b, &remote, true);
    let seg = a.open_segment(b.local_name()).expect("open");
    let stop = AtomicBool::new(false);
    let batches = AtomicU64::new(0);
    std::thread::scope(|s| {
        let worker = s.spawn(|| {
            let mut round = 0u8;
            while !stop.load(Ordering::Acquire) {
                round = round.wrapping_add(1);
                let len = 2 * MIB;
                let data = pattern(len, round);
                local.set(0, &data);
                let w: Vec<Request> = (0..4)
                    .map(|k| {
                        write_req(
                            local.addr() + (k * len / 4) as u64,
                            seg,
                            remote.addr() + (k * len / 4) as u64 + 1,
                            (len / 4) as u64,
                        )
                    })
                    .collect();
                let st = run_within(&a, &w, T);
                assert!(all_completed(&st), "WRITE batch {round}: {st:?}");
                assert_eq!(remote.get(1, len), data, "round {round}");
                let back = 8 * MIB;
                let r = read_req(
                    local.addr() + back as u64,
                    seg,
                    remote.addr() + 1,
                    len as u64,
                );
                assert!(all_completed(&run_within(&a, &[r], T)), "READ {round}");
                assert_eq!(local.get(back, len), data, "read back, round {round}");
                batches.fetch_add(1, Ordering::Relaxed);
            }
        });
        let wait_batches = |n: u64| {
            let start = batches.load(Ordering::Relaxed);
            let deadline = Instant::now() + Duration::from_secs(60);
            while batches.load(Ordering::Relaxed) < start + n {
                assert!(!worker.is_finished(), "the transfer thread stopped");
                assert!(Instant::now() < deadline, "no progress");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        wait_batches(3);
        let guard = rdma::LinkGuard(A[0].1);
        rdma::set_link(A[0].1, false);
        eprintln!("{} is down", A[0].1);
        std::thread::sleep(Duration::from_millis(500));
        let down_at = rdma::sent(A[0].0);
        wait_batches(5);
        let down_after = rdma::sent(A[0].0);
        assert!(
            down_after - down_at < 50,
            "{} kept sending while its link was down ({} packets)",
            A[0].0,
            down_after - down_at
        );
        drop(guard);
        rdma::wait_port_active(A[0].0, Duration::from_secs(30));
        eprintln!("{} is up again", A[0].1);
        // After the rail pause (2 s) and a probe, rail 0 carries slices again.
        let deadline = Instant::now() + Duration::from_secs(60);
        let up_at = rdma::sent(A[0].0);
        while rdma::sent(A[0].0) < up_at + 200 {
            assert!(Instant::now() < deadline, "{} never used again", A[0].0);
            wait_batches(1);
        }
        stop.store(true, Ordering::Release);
        worker.join().expect("transfer thread");
    });
    a.shutdown();
    b.shutdown();
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn install_rules_and_descriptor() {
    setup();
    // auto_discover installs RDMA when devices exist.
    let e = Engine::new("P2PHANDSHAKE", "127.0.0.1", true).expect("engine");
    let buf = Buf::zeroed(4096);
    register_range(&e, buf.addr(), 4096, false);
    let d = common::descriptor(&e);
    assert_eq!(d["protocol"], "rdma", "{d}");
    assert_eq!(d["tcp_data_port"], 0);
    let devices = d["devices"].as_array().expect("devices");
    assert!(!devices.is_empty(), "{d}");
    for dev in devices {
        let gid = dev["gid"].as_str().unwrap();
        assert_eq!(gid.len(), 47, "{gid}");
        assert!(
            gid.starts_with("00:00:00:00:00:00:00:00:00:00:ff:ff:"),
            "IPv4 GID: {gid}"
        );
        assert!(dev["lid"].is_u64());
    }
    let b0 = &d["buffers"][0];
    assert_eq!(b0["name"], "cpu:0");
    assert_eq!(b0["lkey"].as_array().unwrap().len(), devices.len());
    assert!(
        b0["rkey"].as_array().unwrap().is_empty(),
        "no rkey without remote access"
    );
    assert!(d["priority_matrix"].is_object());
    // Installing it again returns the same transport; TCP installs beside
    // it: the descriptor still says rdma (what Mooncake peers read), with
    // the TCP data port and devices for peers that have no RDMA.
    let rdma = e.install_transport("rdma", None).expect("rdma again");
    let tcp = e.install_transport("tcp", None).expect("tcp beside rdma");
    assert_ne!(rdma, tcp);
    let d = common::descriptor(&e);
    assert_eq!(d["protocol"], "rdma", "{d}");
    assert_ne!(d["tcp_data_port"], 0, "{d}");
    assert!(d["tcp_devices"].is_array(), "{d}");
    assert_eq!(
        d["buffers"][0]["lkey"].as_array().unwrap().len(),
        devices.len()
    );
    e.shutdown();
    // A matrix naming devices this machine lacks leaves them out.
    let e = Engine::new("P2PHANDSHAKE", "127.0.0.1", false).expect("engine");
    e.install_transport("rdma", Some(&rdma::matrix(&["mlx5_9", A[1].0])))
        .expect("install");
    let d = common::descriptor(&e);
    assert_eq!(d["devices"].as_array().unwrap().len(), 1, "{d}");
    assert_eq!(d["devices"][0]["name"], A[1].0);
    e.shutdown();
    let e = Engine::new("P2PHANDSHAKE", "127.0.0.1", false).expect("engine");
    assert!(
        e.install_transport("rdma", Some(&rdma::matrix(&["mlx5_9"])))
            .is_err()
    );
    e.shutdown();
}
