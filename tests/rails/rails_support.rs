//! Shared by the multi-rail integration tests (`rails_pool.rs`,
//! `rails_pool_fifo.rs`, `rails_nic_loads.rs`, `rails_server_fds.rs`), on
//! top of the engines and buffers of `tests/common`.

#![allow(dead_code)]

use crate::common::engine_with;
// Each test binary uses a part of these.
#[allow(unused_imports)]
pub use crate::common::{Buf, engine, pattern};
use std::sync::Arc;
use std::time::{Duration, Instant};
use transfer_engine::TaskStatus;
use transfer_engine::{Engine, Opcode, Request};
use transfer_engine::{Location, Region};

/// Longest a batch may take before the test calls it a hang.
pub const HANG: Duration = Duration::from_secs(60);

/// Registers the whole buffer as "cpu:0".
pub fn register(e: &Engine, b: &Buf) {
    e.register(&[Region {
        addr: b.addr(),
        length: b.len() as u64,
        location: Location::Cpu(0),
        remote_accessible: true,
    }])
    .expect("register");
}

/// Submits `reqs` as one batch and waits for every task; panics on a hang.
pub fn run(e: &Engine, reqs: &[Request]) -> Vec<TaskStatus> {
    let b = e.allocate_batch(reqs.len()).expect("batch");
    e.submit(b, reqs).expect("submit");
    let deadline = Instant::now() + HANG;
    let mut out = Vec::new();
    for i in 0..reqs.len() {
        loop {
            let (s, _) = e.status(b, i).expect("status");
            if s != TaskStatus::Waiting {
                out.push(s);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "task {i} of {} not terminal after {HANG:?}: the engine hangs",
                reqs.len()
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    e.free_batch(b).expect("free batch");
    out
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Established TCP connections of this process (each end counted; both
/// ends are here when the peers are in this process).
pub fn established() -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().to_string();
                    l.strip_prefix("socket:[")?
                        .strip_suffix(']')
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| {
            t.lines()
                .skip(1)
                .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        })
        .filter(|c| c.len() > 9 && c[3] == "01" && inodes.contains(&c[9]))
        .count()
}

/// Open sockets of this process.
pub fn open_sockets() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| {
        d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.to_string_lossy().starts_with("socket:"))
            .count()
    })
}

/// One initiator and 8 targets in this process, configured with
/// `settings` (the caller's, with `MC_MAX_EP_PER_CTX=2`): rounds of WRITE then READ to each target in
/// turn (every endpoint use evicts another), then batches that touch all 8
/// targets at once (endpoints evicted while their slices are in flight),
/// every byte checked on both sides; the process's descriptors do not grow
/// from round to round (evicted endpoints are closed).
pub fn pool_of_two_serves_eight_peers(settings: &[(&str, &str)]) {
    const PEERS: usize = 8;
    const SIZE: usize = 2 << 20;
    let initiator = engine_with(settings);
    let targets: Vec<Arc<Engine>> = (0..PEERS).map(|_| engine_with(settings)).collect();
    let bufs: Vec<Buf> = (0..PEERS)
        .map(|i| Buf::new(SIZE, (100 + i) as u8))
        .collect();
    for (t, b) in targets.iter().zip(&bufs) {
        register(t, b);
    }
    let src = Buf::new(SIZE, 1);
    let dst = Buf::new(SIZE, 2);
    register(&initiator, &src);
    register(&initiator, &dst);
    let segs: Vec<i32> = targets
        .iter()
        .map(|t| {
            initiator
                .open_segment(t.local_name())
                .expect("open segment")
        })
        .collect();

    // Listeners and whatever the handshakes left; every lane adds a
    // client socket here and an accepted one in its target.
    std::thread::sleep(Duration::from_millis(1500));
    let idle_sockets = open_sockets();
    let lanes: usize = std::env::var("MC_TCP_LANES_PER_PEER")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    for round in 0..6u64 {
        // Sequential: each peer in turn, so the pool of 2 keeps evicting.
        for p in 0..PEERS {
            let seed = round * 100 + p as u64;
            // Sizes from sub-slice to many slices, at odd offsets.
            let len = [1usize, 65_537, 300_001, 1 << 20][(round as usize + p) % 4];
            let off = 17 + p * 3 + round as usize;
            src.set(off, &pattern(len, seed as u8));
            dst.set(off, &vec![0xA5; len]);
            let w = Request {
                opcode: Opcode::Write,
                source: src.addr() + off as u64,
                target_id: segs[p],
                target_offset: bufs[p].addr() + off as u64,
                length: len as u64,
            };
            let st = run(&initiator, &[w]);
            assert_eq!(
                st,
                [TaskStatus::Completed],
                "round {round} WRITE to peer {p}"
            );
            assert!(
                bufs[p].get(off, len) == pattern(len, seed as u8),
                "round {round}: peer {p} holds wrong bytes after the WRITE"
            );
            let r = Request {
                opcode: Opcode::Read,
                source: dst.addr() + off as u64,
                ..w
            };
            let st = run(&initiator, &[r]);
            assert_eq!(
                st,
                [TaskStatus::Completed],
                "round {round} READ from peer {p}"
            );
            assert!(
                dst.get(off, len) == pattern(len, seed as u8),
                "round {round}: wrong bytes READ from peer {p}"
            );
        }
        // One batch to all 8 peers at once: 8 endpoints wanted, 2 pooled,
        // so endpoints are evicted with slices in flight.
        let len = 192 << 10;
        let mut writes = Vec::new();
        for p in 0..PEERS {
            let off = 4096 + p * len;
            let seed = 7_000 + round * 100 + p as u64;
            src.set(off, &pattern(len, seed as u8));
            dst.set(off, &vec![0x5A; len]);
            writes.push(Request {
                opcode: Opcode::Write,
                source: src.addr() + off as u64,
                target_id: segs[p],
                target_offset: bufs[p].addr() + (SIZE / 2) as u64,
                length: len as u64,
            });
        }
        let st = run(&initiator, &writes);
        assert!(
            st.iter().all(|s| *s == TaskStatus::Completed),
            "round {round}: concurrent WRITEs to 8 peers: {st:?}"
        );
        let reads: Vec<Request> = writes
            .iter()
            .map(|w| Request {
                opcode: Opcode::Read,
                source: dst.addr() + (w.source - src.addr()),
                ..*w
            })
            .collect();
        let st = run(&initiator, &reads);
        assert!(
            st.iter().all(|s| *s == TaskStatus::Completed),
            "round {round}: concurrent READs from 8 peers: {st:?}"
        );
        for (p, buf) in bufs.iter().enumerate() {
            let off = 4096 + p * len;
            let want = pattern(len, (7_000 + round * 100 + p as u64) as u8);
            assert!(
                buf.get(SIZE / 2, len) == want,
                "round {round}: peer {p} wrong after the concurrent WRITE"
            );
            assert!(
                dst.get(off, len) == want,
                "round {round}: wrong bytes READ concurrently from peer {p}"
            );
        }
        // Retired endpoints are closed about once a second once idle.
        std::thread::sleep(Duration::from_millis(2500));
        let fds = open_fds();
        let sockets = open_sockets();
        let estab = established();
        eprintln!(
            "round {round}: {fds} descriptors, {sockets} sockets ({idle_sockets} before any \
             transfer), {estab} established connection ends"
        );
        // All 8 targets share the initiator's device, so one pool of 2
        // endpoints serves them: at most 2 x lanes connections stay open
        // (both ends counted). Without eviction 8 x lanes would.
        assert!(
            estab <= 2 * 2 * lanes,
            "round {round}: {estab} established connection ends, more than a pool of 2 \
             endpoints of {lanes} lanes holds (both ends counted)"
        );
        // No growth from round to round: never more sockets than 2 pooled
        // endpoints per device for the initiator plus, per target, the
        // sessions it held at once (a data server keeps the handles of
        // ended sessions until its next accept; see rails_server_fds.rs).
        assert!(
            sockets <= idle_sockets + 2 * 2 * 2 * lanes + PEERS * 4 * lanes,
            "round {round}: {sockets} sockets open ({idle_sockets} before any transfer)"
        );
    }
    initiator.shutdown();
    for t in &targets {
        t.shutdown();
    }
}
