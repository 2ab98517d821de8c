//! RDMA on real verbs (soft-RoCE in the VM of `scripts/rdma-vm/`): engines
//! of node A (`rxe_a0`, `rxe_a1`) and node B (`rxe_b0`, `rxe_b1`) in one
//! process. Every byte is verified; faults are real (a stale key the
//! device refuses, a link taken down, engines destroyed mid-transfer).
//! Run with `--ignored --test-threads 1` inside the VM.

use crate::common;
use crate::rdma_support as rdma;

use common::{Buf, pattern, read_req, register, register_range, run_within, write_req};
use rdma::{A, B};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use transfer_engine::TaskStatus;
use transfer_engine::metadata::http::HttpStore;
use transfer_engine::metadata::keys::segment_key;
use transfer_engine::metadata::server::MetadataServer;
use transfer_engine::metadata::store::MetadataStore;
use transfer_engine::{Engine, Location, Region, Request};

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
fn a_peer_that_registers_its_buffer_again_is_reached_with_its_new_key() {
    setup();
    let a = rdma::engine(&[A[0].0, A[1].0]);
    let b = rdma::engine(&[B[0].0, B[1].0]);
    let len = 4 * MIB;
    let remote = Buf::zeroed(len);
    register(&b, &remote, true);
    let local = Buf::zeroed(len);
    register(&a, &local, true);
    let seg = a.open_segment(b.local_name()).expect("open");
    round_trip(&a, seg, &local, &remote, len - 8, 1);
    // Fillers take the freed memory regions' slots, so the buffer's new
    // regions have new keys; `a`'s cached descriptor keeps the old ones.
    let fillers: Vec<Buf> = (0..2).map(|_| Buf::zeroed(64 << 10)).collect();
    for round in 0..3u8 {
        b.unregister(&[remote.addr()]).expect("unregister");
        for f in &fillers {
            b.unregister(&[f.addr()]).ok();
            register(&b, f, true);
        }
        register(&b, &remote, true);
        // Every slice is refused under the old key, the descriptor is
        // refetched once, and the slices go again: no task fails.
        let data = pattern(len - 8, 10 + round);
        local.set(1, &data);
        let reqs: Vec<Request> = (0..4)
            .map(|i| {
                let off = (i * MIB) as u64;
                let n = if i == 3 { MIB - 8 } else { MIB };
                write_req(
                    local.addr() + 1 + off,
                    seg,
                    remote.addr() + 3 + off,
                    n as u64,
                )
            })
            .collect();
        let got = run_within(&a, &reqs, T);
        assert!(all_completed(&got), "round {round}: {got:?}");
        assert_eq!(remote.get(3, len - 8), data, "round {round}: every byte");
        round_trip(&a, seg, &local, &remote, len - 8, 20 + round);
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

/// The GID `a` publishes for its first device.
fn served_gid(a: &Engine) -> String {
    common::descriptor(a)["devices"][0]["gid"]
        .as_str()
        .expect("a published GID")
        .to_string()
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn an_address_change_moves_the_engine_to_the_new_gid() {
    setup();
    // With a metadata store: the new GID is served at handshakes and
    // written to the store.
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).expect("server");
    let store = HttpStore::new(&server.url()).expect("store client");
    let a = rdma::engine_named(&server.url(), "127.0.0.1:7001", &[A[0].0]);
    let b = rdma::engine_named(&server.url(), "127.0.0.1:7002", &[B[0].0]);
    let stored_gid = || {
        store
            .get(&segment_key(None, a.local_name()))
            .expect("store get")
            .and_then(|d| d["devices"][0]["gid"].as_str().map(str::to_string))
    };
    let local = Buf::zeroed(4 * MIB);
    let remote = Buf::zeroed(4 * MIB);
    register(&a, &local, true);
    register(&b, &remote, true);
    let seg = a.open_segment(b.local_name()).expect("open");
    round_trip(&a, seg, &local, &remote, MIB + 5, 1);
    assert_eq!(served_gid(&a), rdma::v4_gid("198.18.0.1"));
    assert_eq!(stored_gid(), Some(rdma::v4_gid("198.18.0.1")));
    // B has endpoints to A's old GID too.
    let back = b.open_segment(a.local_name()).expect("open A");
    round_trip(&b, back, &remote, &local, 65537, 2);

    let old_qps = rdma::rc_qpns(A[0].0);
    assert!(!old_qps.is_empty(), "A has endpoints on the old GID");
    let new = "198.18.0.11";
    let moved = rdma::Readdressed::va0(new);
    eprintln!("va0 is {new} now");
    common::wait_for(
        "A publishes the GID of the new address",
        Duration::from_secs(20),
        || served_gid(&a) == rdma::v4_gid(new),
    );
    common::wait_for("the store has it too", Duration::from_secs(10), || {
        stored_gid() == Some(rdma::v4_gid(new))
    });
    // The endpoints built on the old GID are retired: their queue pairs
    // are destroyed (without a transfer that would find them broken).
    common::wait_for(
        "A's queue pairs of the old GID are gone",
        Duration::from_secs(20),
        || {
            let now = rdma::rc_qpns(A[0].0);
            old_qps.iter().all(|q| !now.contains(q))
        },
    );
    // The old address is gone from every interface, so a transfer that
    // completes went over the new GID; both directions, every byte.
    let sent = rdma::sent(A[0].0);
    round_trip(&a, seg, &local, &remote, MIB + 7, 3);
    round_trip(&b, back, &remote, &local, 3 * MIB + 1, 4);
    assert!(rdma::sent(A[0].0) > sent, "rxe_a0 carried the transfers");
    a.shutdown();
    b.shutdown();
    server.shutdown();
    drop(moved);
    rdma::wait_port_active(A[0].0, Duration::from_secs(30));
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn a_second_rdma_name_is_published_and_used() {
    setup();
    // MC_RDMA_BIND_ADDRESS: A's NIC paths carry 198.18.0.1 (its rail-0
    // address) while its handshake listener keeps its name 127.0.0.1:port.
    let mut config = rdma::config();
    config.rdma.bind_address = Some("198.18.0.1".into());
    let a = Engine::builder("P2PHANDSHAKE", "127.0.0.1")
        .config(config)
        .build()
        .expect("engine");
    a.install_transport("rdma", Some(&rdma::matrix(&[A[0].0])))
        .expect("install rdma");
    let b = rdma::engine(&[B[0].0]);
    let port = a.rpc_port();
    let desc = common::descriptor(&a);
    assert_eq!(desc["name"], a.local_name());
    assert_eq!(desc["rdma_server_name"], format!("198.18.0.1:{port}"));
    assert!(
        common::descriptor(&b).get("rdma_server_name").is_none(),
        "published only when set"
    );
    let la = Buf::zeroed(2 * MIB);
    let lb = Buf::zeroed(2 * MIB);
    register(&a, &la, true);
    register(&b, &lb, true);
    // B reaches A through A's second name, and A's handshakes to B name
    // themselves by it.
    let to_a = b.open_segment(a.local_name()).expect("open A");
    round_trip(&b, to_a, &lb, &la, MIB + 3, 5);
    let to_b = a.open_segment(b.local_name()).expect("open B");
    round_trip(&a, to_b, &la, &lb, MIB + 9, 6);
    a.shutdown();
    b.shutdown();
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn install_rules_and_descriptor() {
    setup();
    // auto_discover installs RDMA when devices exist.
    let e = rdma::bare_engine(true);
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
    let e = rdma::bare_engine(false);
    e.install_transport("rdma", Some(&rdma::matrix(&["mlx5_9", A[1].0])))
        .expect("install");
    let d = common::descriptor(&e);
    assert_eq!(d["devices"].as_array().unwrap().len(), 1, "{d}");
    assert_eq!(d["devices"][0]["name"], A[1].0);
    e.shutdown();
    let e = rdma::bare_engine(false);
    assert!(
        e.install_transport("rdma", Some(&rdma::matrix(&["mlx5_9"])))
            .is_err()
    );
    e.shutdown();
}

/// A P2P engine with RDMA on `devs` whose memory regions hold at most
/// `max_mr` bytes, registering on its devices in parallel or not.
fn split_engine(devs: &[&str], max_mr: u64, parallel: bool) -> std::sync::Arc<Engine> {
    let mut cfg = rdma::config();
    cfg.rdma.max_mr_size = max_mr;
    cfg.rdma.parallel_reg_mr = Some(parallel);
    cfg.rdma.max_concurrent_reg_mr = if parallel { 2 } else { 0 };
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1")
        .config(cfg)
        .build()
        .expect("engine");
    e.install_transport("rdma", Some(&rdma::matrix(devs)))
        .expect("install rdma");
    e
}

/// Checks that `d` publishes `len` bytes at `addr` as consecutive entries
/// of at most `max` bytes, each with a key per device; returns the count.
fn split_entries(d: &serde_json::Value, addr: u64, len: u64, max: u64) -> usize {
    let devices = d["devices"].as_array().expect("devices").len();
    let entries: Vec<&serde_json::Value> = d["buffers"]
        .as_array()
        .expect("buffers")
        .iter()
        .filter(|b| {
            let a = b["addr"].as_u64().unwrap();
            a >= addr && a < addr + len
        })
        .collect();
    let mut at = addr;
    let mut rkeys = Vec::new();
    for b in &entries {
        assert_eq!(b["addr"].as_u64().unwrap(), at, "consecutive entries: {d}");
        let n = b["length"].as_u64().unwrap();
        assert!(n > 0 && n <= max, "entry of {n} bytes: {d}");
        assert_eq!(b["name"], "cpu:0", "{d}");
        assert_eq!(b["lkey"].as_array().unwrap().len(), devices, "{d}");
        let rk = b["rkey"].as_array().unwrap();
        assert_eq!(rk.len(), devices, "{d}");
        rkeys.extend(rk.iter().map(|k| k.as_u64().unwrap()));
        at += n;
    }
    assert_eq!(at, addr + len, "the entries cover the buffer: {d}");
    let mut distinct = rkeys.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        rkeys.len(),
        "a region per piece and device: {d}"
    );
    entries.len()
}

/// WRITE `len` bytes from `local + lo` to `remote + ro` and READ them back
/// to `local + lo`; checks every byte and that the bytes around the
/// target range are untouched.
fn crossing_round_trip(
    a: &Engine,
    seg: i32,
    (local, remote): (&Buf, &Buf),
    (lo, ro, len): (usize, usize, usize),
    seed: u8,
) {
    let data = pattern(len, seed);
    local.set(lo, &data);
    remote.set(ro - 1, &[0]);
    remote.set(ro + len, &[0]);
    let w = write_req(
        local.addr() + lo as u64,
        seg,
        remote.addr() + ro as u64,
        len as u64,
    );
    assert!(
        all_completed(&run_within(a, &[w], T)),
        "WRITE {lo}->{ro}+{len}"
    );
    assert_eq!(remote.get(ro, len), data, "WRITE {lo}->{ro}+{len}");
    assert_eq!(remote.get(ro - 1, 1), [0], "the byte before is untouched");
    assert_eq!(remote.get(ro + len, 1), [0], "the byte after is untouched");
    local.set(lo, &vec![0u8; len]);
    let r = read_req(
        local.addr() + lo as u64,
        seg,
        remote.addr() + ro as u64,
        len as u64,
    );
    assert!(
        all_completed(&run_within(a, &[r], T)),
        "READ {ro}+{len}->{lo}"
    );
    assert_eq!(local.get(lo, len), data, "READ {ro}+{len}->{lo}");
}

/// Memory regions of `devs`, from `rdma resource show`.
fn mrs(devs: &[&str]) -> u64 {
    devs.iter().map(|d| rdma::resources(d).3).sum()
}

const SPLIT_LEN: usize = 5 * MIB + 333;

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn buffers_above_the_largest_memory_region_are_split_across_local_pieces() {
    setup();
    let (adevs, bdevs) = ([A[0].0, A[1].0], [B[0].0, B[1].0]);
    // Both sides register in pieces of 1 MiB: A on its devices in
    // parallel (MC_ENABLE_PARALLEL_REG_MR=1, two at once), B one after
    // another.
    let a = split_engine(&adevs, MIB as u64, true);
    let b = split_engine(&bdevs, MIB as u64, false);
    let before = (mrs(&adevs), mrs(&bdevs));
    let local = Buf::zeroed(SPLIT_LEN);
    let remote = Buf::zeroed(SPLIT_LEN);
    register(&a, &local, true);
    register(&b, &remote, true);
    let (da, db) = (common::descriptor(&a), common::descriptor(&b));
    let len = SPLIT_LEN as u64;
    assert_eq!(split_entries(&da, local.addr(), len, MIB as u64), 6);
    assert_eq!(split_entries(&db, remote.addr(), len, MIB as u64), 6);
    assert_eq!(
        (mrs(&adevs), mrs(&bdevs)),
        (before.0 + 12, before.1 + 12),
        "six regions on each of two devices"
    );
    let seg = a.open_segment(b.local_name()).expect("open");
    // Each crosses an edge between local pieces at an odd offset; the
    // remote side stays inside one published entry.
    let piece = |i: usize| local.addr() as usize + i * MIB;
    let edge = |i: usize| piece(i) - local.addr() as usize;
    for (i, (lo, ro, n)) in [
        (edge(1) - 4097, 2 * MIB + 5, 300_001),
        (edge(3) - 70_001, 4 * MIB + 1, MIB - 2),
        (edge(5) - 1, MIB + 7, 334),
    ]
    .into_iter()
    .enumerate()
    {
        crossing_round_trip(&a, seg, (&local, &remote), (lo, ro, n), i as u8);
    }
    // Unregistering deregisters every piece on every device.
    a.unregister(&[local.addr()]).expect("unregister");
    b.unregister(&[remote.addr()]).expect("unregister");
    assert_eq!(
        (mrs(&adevs), mrs(&bdevs)),
        before,
        "every piece deregistered"
    );
    a.shutdown();
    b.shutdown();
}

/// Needs the scheduler's cut at the edges of the peer's buffer entries
/// (issue 18, section 3 item 5, on another branch until merged): without
/// it a request that spans two of the peer's entries is refused.
#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn buffers_above_the_largest_memory_region_are_split_across_remote_entries() {
    setup();
    let (adevs, bdevs) = ([A[0].0, A[1].0], [B[0].0, B[1].0]);
    let a = split_engine(&adevs, MIB as u64, true);
    let b = split_engine(&bdevs, MIB as u64, false);
    let local = Buf::zeroed(SPLIT_LEN);
    let remote = Buf::zeroed(SPLIT_LEN);
    register(&a, &local, true);
    register(&b, &remote, true);
    let seg = a.open_segment(b.local_name()).expect("open");
    // Across remote entries only (local within one piece), then across
    // every edge of both sides at different offsets, the whole buffer
    // but its first and last bytes.
    for (i, (lo, ro, n)) in [(MIB + 11, 3 * MIB - 5000, 600_000), (1, 3, SPLIT_LEN - 4)]
        .into_iter()
        .enumerate()
    {
        crossing_round_trip(&a, seg, (&local, &remote), (lo, ro, n), 10 + i as u8);
    }
    a.shutdown();
    b.shutdown();
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn a_wildcard_buffer_is_published_with_its_numa_node() {
    setup();
    // Never written: an RDMA registration pins (faults in) their pages,
    // and the first page's node is what peers see: for a buffer registered
    // before RDMA is installed, and for one registered after.
    let before = Buf::zeroed(3 * MIB);
    let after = Buf::zeroed(3 * MIB);
    let wildcard = |b: &Buf| Region {
        addr: b.addr(),
        length: b.len() as u64,
        location: Location::Any,
        remote_accessible: true,
    };
    let e = rdma::bare_engine(false);
    e.register(&[wildcard(&before)]).expect("register");
    e.install_transport("rdma", Some(&rdma::matrix(&[A[0].0])))
        .expect("install rdma");
    e.register(&[wildcard(&after)]).expect("register");
    let nodes: Vec<String> = std::fs::read_dir("/sys/devices/system/node")
        .expect("NUMA nodes in sysfs")
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("node")
                .map(String::from)
        })
        .collect();
    let d = common::descriptor(&e);
    let buffers = d["buffers"].as_array().expect("buffers");
    assert_eq!(buffers.len(), 2, "{d}");
    for b in buffers {
        let name = b["name"].as_str().expect("name").to_string();
        let node = name.strip_prefix("cpu:").unwrap_or_else(|| panic!("{d}"));
        assert!(
            nodes.iter().any(|n| n == node),
            "{name} not among {nodes:?}"
        );
        if nodes.len() == 1 {
            assert_eq!(name, format!("cpu:{}", nodes[0]));
        }
    }
    e.shutdown();
}
