//! Registration racing installation and unregistration over RDMA: threads
//! register and unregister buffers while another installs the RDMA
//! transport, and while engines are destroyed with registrations under
//! way. Afterwards every memory region the devices hold belongs to a
//! buffer that is registered and published, and once everything is
//! unregistered (or the engine destroyed) the devices hold none of ours:
//! no remote-accessible memory region is left that nothing tracks. And
//! requests racing registration: a buffer the target registered a moment
//! ago (its initiator's cached descriptor does not list it) is reached at
//! once. Run inside the soft-RoCE VM (scripts/rdma-vm/).

use crate::common;
use crate::rdma_support as rdma;

use common::{Buf, descriptor};
use rdma::{A, B};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use transfer_engine::{Location, Region};

const THREADS: usize = 4;
const ROUNDS: usize = 40;

fn region(b: &Buf) -> Region {
    Region {
        addr: b.addr(),
        length: b.len() as u64,
        location: Location::Any,
        remote_accessible: true,
    }
}

/// Memory regions on `dev` now.
fn mrs(dev: &str) -> u64 {
    rdma::resources(dev).3
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn registrations_racing_install_and_destroy_leave_no_region_behind() {
    rdma::setup(&[]);
    let dev = A[0].0;
    let baseline = mrs(dev);
    for round in 0..ROUNDS {
        let e = rdma::bare_engine(false);
        let start = Arc::new(Barrier::new(THREADS + 1));
        let installed = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (e, start, installed) = (e.clone(), start.clone(), installed.clone());
                thread::spawn(move || {
                    // Even ones are unregistered again at the end, odd ones
                    // kept.
                    let bufs: Vec<(Buf, bool)> = (0..4)
                        .map(|i| (Buf::zeroed(64 << 10), i % 2 == 1))
                        .collect();
                    start.wait();
                    // Registered and unregistered while the transport is
                    // being installed, each at an address used once (kept
                    // until the round ends).
                    let mut churned = Vec::new();
                    while !installed.load(Ordering::Acquire) {
                        let b = Buf::zeroed(4096);
                        e.register(&[region(&b)]).expect("register");
                        e.unregister(&[b.addr()]).expect("unregister");
                        churned.push(b);
                    }
                    for (b, keep) in &bufs {
                        e.register(&[region(b)]).expect("register");
                        if !keep {
                            e.unregister(&[b.addr()]).expect("unregister");
                        }
                    }
                    drop(churned);
                    bufs
                })
            })
            .collect();
        start.wait();
        e.install_transport("rdma", Some(&rdma::matrix(&[dev])))
            .expect("install rdma");
        installed.store(true, Ordering::Release);
        let bufs: Vec<(Buf, bool)> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect();
        // Every buffer still registered is published with its keys, and the
        // device holds exactly one region per published buffer.
        let published = descriptor(&e)["buffers"].as_array().unwrap().clone();
        let registered: Vec<&Buf> = bufs
            .iter()
            .filter(|(_, keep)| *keep)
            .map(|(b, _)| b)
            .collect();
        assert_eq!(
            published.len(),
            registered.len(),
            "round {round}: published {published:?}"
        );
        assert!(
            published
                .iter()
                .all(|b| b["rkey"].as_array().is_some_and(|k| k.len() == 1)),
            "round {round}: a buffer without its key: {published:?}"
        );
        assert_eq!(
            mrs(dev) - baseline,
            registered.len() as u64,
            "round {round}: memory regions on {dev}"
        );
        if round % 2 == 0 {
            let addrs: Vec<u64> = registered.iter().map(|b| b.addr()).collect();
            e.unregister(&addrs).expect("unregister the rest");
        } else {
            // Destroy while another thread keeps registering: every
            // registration either ends before the destroy or is refused.
            let late = Buf::zeroed(64 << 10);
            let e2 = e.clone();
            let racer = thread::spawn(move || {
                for _ in 0..50 {
                    if e2.register(&[region(&late)]).is_ok() {
                        let _ = e2.unregister(&[late.addr()]);
                    }
                }
                late
            });
            e.shutdown();
            drop(racer.join().expect("racer"));
        }
        drop(e);
        assert_eq!(mrs(dev), baseline, "round {round}: regions left behind");
        drop(bufs);
    }
}

/// The registration pattern of consumers over RDMA, on P2P and HTTP
/// metadata: the target registers a buffer, notifies, and the initiator
/// WRITEs and READs it at once, before its cached descriptor (with the
/// keys RDMA needs) lists it: 300 rounds, then a buffer every 10 ms (100),
/// each written as soon as it is announced. No task fails, RDMA carries
/// the bytes, and every byte is checked.
#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn buffers_registered_a_moment_ago_are_reachable() {
    rdma::setup(&[]);
    let server =
        transfer_engine::metadata::server::MetadataServer::start("127.0.0.1:0", "/metadata", None)
            .expect("server");
    for (conn, names) in [
        ("P2PHANDSHAKE".to_string(), ["127.0.0.1", "127.0.0.1"]),
        (server.url(), ["127.0.0.1:7101", "127.0.0.1:7102"]),
    ] {
        let target = rdma::engine_named(&conn, names[0], &[B[0].0, B[1].0]);
        let initiator = rdma::engine_named(&conn, names[1], &[A[0].0, A[1].0]);
        let sent = || A.iter().map(|(d, _)| rdma::sent(d)).sum::<u64>();
        let before = sent();
        let run = common::fresh::register_notify_transfer(&target, &initiator, 300, 4096 + 13);
        eprintln!("register, notify, WRITE and READ at once over RDMA ({conn}): {run}");
        assert_eq!(run.failed, 0, "{run}");
        let run = common::fresh::registrations_every(
            &target,
            &initiator,
            std::time::Duration::from_millis(10),
            100,
            65536 + 7,
        );
        eprintln!("a buffer every 10 ms over RDMA ({conn}): {run}");
        assert_eq!(run.failed, 0, "{run}");
        // At least a packet for each WRITE and READ of the 300 rounds and
        // the 100 buffers.
        assert!(
            sent() - before >= 2 * 400,
            "RDMA sent {} packets",
            sent() - before
        );
        initiator.shutdown();
        target.shutdown();
    }
    server.shutdown();
}
