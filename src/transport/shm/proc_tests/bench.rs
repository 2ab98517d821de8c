//! Benchmark of the shared-memory transport, two processes, one run,
//! medians of several rounds (ignored by default; run in release):
//!
//! ```text
//! cargo test --release --lib proc_tests::bench -- --ignored --nocapture
//! ```
//!
//! As `scripts/bench-local.sh` does for local copies, requests walk rings
//! of blocks (1 MiB blocks: 64 MiB rings, so memory, not cache, is the
//! limit; 4 KiB blocks: 256 KiB rings) and the memcpy baseline copies the
//! same blocks, on one thread and split over `MC_SHM_THREADS` threads.
//!
//! * 1 MiB requests (16 slices of 64 KiB, the planner's default), 8 in
//!   flight, WRITE and READ, between heap buffers (cross-memory attach)
//!   and between buffers of the transport's allocator (memfd mappings);
//! * 4 KiB requests in batches of 64, WRITE and READ, requests/s, both
//!   kinds of buffers;
//! * the two copy mechanisms alone, the same blocks: memcpy from a mapping
//!   of the peer's memfd against `process_vm_readv` from the peer.

use super::buf::Buf;
use super::harness::*;
use crate::engine::config::Config;
use crate::transport::Outcome;
use crate::transport::shm::{ShmPeer, cma, sys};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const ROUNDS: usize = 7;
const ROUND_TIME: Duration = Duration::from_millis(300);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Median over the rounds of `ops` per second, where `op` does `ops` units.
fn rate(mut op: impl FnMut() -> f64) -> f64 {
    median(
        (0..ROUNDS)
            .map(|_| {
                let start = Instant::now();
                let mut units = 0.0;
                while start.elapsed() < ROUND_TIME {
                    units += op();
                }
                units / start.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// Posts every slice and waits for all (one wakeup per batch).
fn batch(local: &Local, peer: &ShmPeer, slices: &[(u64, u64, u64, bool)]) {
    let left = Arc::new(AtomicUsize::new(slices.len()));
    let (tx, rx) = channel();
    for &s in slices {
        let (left, tx) = (left.clone(), tx.clone());
        local.post(peer, s, move |o| {
            assert_eq!(o, Outcome::Done);
            if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                tx.send(()).unwrap();
            }
        });
    }
    rx.recv_timeout(HANG).expect("a batch never ended");
}

/// Rate of requests of `len` bytes, each split over `threads` threads
/// (this one and helpers that spin for the next request); `copy(n, i)`
/// does part `i` of request `n`.
fn split_rate(len: u64, threads: usize, copy: Arc<dyn Fn(u64, u64) + Send + Sync>) -> f64 {
    let generation = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let helpers: Vec<_> = (1..threads)
        .map(|i| {
            let (g, f, copy) = (generation.clone(), finished.clone(), copy.clone());
            std::thread::spawn(move || {
                let mut seen = 0;
                loop {
                    let now = loop {
                        let n = g.load(Ordering::Acquire);
                        if n != seen {
                            break n;
                        }
                        std::hint::spin_loop();
                    };
                    if now == usize::MAX {
                        return;
                    }
                    seen = now;
                    copy(now as u64, i as u64);
                    f.fetch_add(1, Ordering::AcqRel);
                }
            })
        })
        .collect();
    let r = rate(|| {
        finished.store(0, Ordering::Release);
        let n = generation.fetch_add(1, Ordering::AcqRel) + 1;
        copy(n as u64, 0);
        while finished.load(Ordering::Acquire) != threads - 1 {
            std::hint::spin_loop();
        }
        len as f64
    });
    generation.store(usize::MAX, Ordering::Release);
    helpers.into_iter().for_each(|h| h.join().unwrap());
    r
}

fn gb(bytes_per_sec: f64) -> String {
    format!("{:.2} GB/s", bytes_per_sec / 1e9)
}

/// One kind of buffers on both sides: our source and destination rings,
/// and the child's.
struct Rings {
    src: u64,
    dst: u64,
    c_src: u64,
    c_dst: u64,
}

impl Rings {
    fn new(local: &Local, child: &Child, len: u64, shared: bool, keep: &mut Vec<Buf>) -> Rings {
        let src = local.buffer(len, shared, keep);
        // SAFETY: a fresh buffer of ours.
        unsafe { fill(src, len, 1, 0) };
        let dst = local.buffer(len, shared, keep);
        // SAFETY: as above (fault its pages in before timing).
        unsafe { std::ptr::write_bytes(dst as *mut u8, 0, len as usize) };
        local.register(src, len, true);
        local.register(dst, len, true);
        Rings {
            src,
            dst,
            c_src: child.alloc_in(len, Some(2), true, shared),
            c_dst: child.alloc_in(len, None, true, shared),
        }
    }

    /// The slices of request `i` (block `i` of the ring), cut at `slice`.
    fn request(
        &self,
        i: u64,
        block: u64,
        ring: u64,
        slice: u64,
        write: bool,
    ) -> Vec<(u64, u64, u64, bool)> {
        let off = (i * block) % ring;
        (0..block / slice)
            .map(|k| {
                let o = off + k * slice;
                if write {
                    (self.src + o, self.c_dst + o, slice, true)
                } else {
                    (self.dst + o, self.c_src + o, slice, false)
                }
            })
            .collect()
    }
}

/// Requests of `block` bytes walking a ring of `ring` bytes, `depth` at a
/// time; bytes (or requests, with `count_requests`) per second.
#[allow(clippy::too_many_arguments)]
fn transfer_rate(
    local: &Local,
    peer: &ShmPeer,
    r: &Rings,
    block: u64,
    ring: u64,
    depth: u64,
    write: bool,
    count_requests: bool,
) -> f64 {
    let slice = block.min(65536);
    let mut next = 0;
    rate(|| {
        let mut all = Vec::new();
        for _ in 0..depth {
            all.extend(r.request(next, block, ring, slice, write));
            next += 1;
        }
        batch(local, peer, &all);
        if count_requests {
            depth as f64
        } else {
            (depth * block) as f64
        }
    })
}

/// Rate of `depth` blocks of `block` bytes per round, walking rings of
/// `ring` bytes, each round split over `threads`: `copy(off, len)` copies
/// the part at offset `off` of the rings.
fn ring_rate(
    block: u64,
    ring: u64,
    depth: u64,
    threads: usize,
    copy: impl Fn(u64, u64) + Send + Sync + 'static,
) -> f64 {
    let span = block * depth;
    let part = span / threads as u64;
    let copy = move |n, i| copy((n * span + i * part) % ring, part);
    split_rate(span, threads, Arc::new(copy))
}

/// memcpy of the same blocks: `depth` blocks per round, split over
/// `threads`.
fn memcpy_ring_rate(src: u64, dst: u64, block: u64, ring: u64, depth: u64, threads: usize) -> f64 {
    ring_rate(block, ring, depth, threads, move |off, len| {
        // SAFETY: disjoint parts of two rings of ours (`ring` is a
        // multiple of the bytes of a round).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (src + off) as *const u8,
                (dst + off) as *mut u8,
                len as usize,
            )
        }
    })
}

#[test]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
fn shm_bench() {
    let test = two_process_test!("shm_bench");
    let threads = Config::from_env().expect("the MC_* settings").shm.threads;
    let local = Local::start();
    let child = Child::spawn(test, &[], &[]);
    let ring = 64 * MIB;
    let mut keep = Vec::new();
    let heap = Rings::new(&local, &child, ring, false, &mut keep);
    let memfd = Rings::new(&local, &child, ring, true, &mut keep);
    let peer = child.peer_of(&local);
    batch(&local, &peer, &[(heap.src, heap.c_dst, 1, true)]);

    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "shm bench: {cpus} CPUs, MC_SHM_THREADS={threads}, MC_SHM_SPIN_US={}, medians of {ROUNDS} rounds of {ROUND_TIME:?}",
        Config::from_env().expect("the MC_* settings").shm.spin_us
    );
    let depth = 8;
    let m1 = memcpy_ring_rate(heap.src, heap.dst, MIB, ring, depth, 1);
    let mn = memcpy_ring_rate(heap.src, heap.dst, MIB, ring, depth, threads);
    println!(
        "  memcpy 1 MiB blocks, 64 MiB rings: 1 thread {}, {threads} threads {}",
        gb(m1),
        gb(mn)
    );
    let best = m1.max(mn);
    for (name, r) in [("heap", &heap), ("memfd", &memfd)] {
        for write in [true, false] {
            let v = transfer_rate(&local, &peer, r, MIB, ring, depth, write, false);
            println!(
                "  shm {} 1 MiB, {name} buffers, {depth} in flight: {}  ({:.2}x the better memcpy)",
                if write { "WRITE" } else { "READ " },
                gb(v),
                v / best
            );
        }
    }
    for (name, r) in [("heap", &heap), ("memfd", &memfd)] {
        for write in [true, false] {
            let v = transfer_rate(&local, &peer, r, 4096, 64 * 4096, 64, write, true);
            println!(
                "  shm {} 4 KiB, batches of 64, {name} buffers: {:.2} M requests/s",
                if write { "WRITE" } else { "READ " },
                v / 1e6
            );
        }
    }
    // The data is right (the last rounds wrote and read whole blocks).
    for r in [&heap, &memfd] {
        let c = child.check(r.c_dst, 4096, 1, 0);
        assert_eq!(c["bad"], json!(0));
        // SAFETY: our ring; every READ has ended.
        assert_eq!(unsafe { mismatches(r.dst, MIB, 2, 0) }.0, 0);
    }

    // The two copy mechanisms alone, from the child's memfd ring.
    let m = child.call(json!({"cmd": "memfd", "len": ring, "seed": 3}), None);
    let (fd, m_addr) = (
        m["fd"].as_u64().unwrap() as i32,
        m["addr"].as_u64().unwrap(),
    );
    let pidfd = sys::pidfd_open(child.pid()).unwrap();
    let mine = sys::pidfd_getfd(&pidfd, fd).unwrap();
    let mapped = sys::Mapping::new(&mine, ring as usize, false).unwrap();
    for t in [1, threads] {
        let mm = memcpy_ring_rate(mapped.ptr() as u64, heap.dst, MIB, ring, depth, t);
        let cma = cma_ring_rate(child.pid(), m_addr, heap.dst, MIB, ring, depth, t);
        println!(
            "  1 MiB blocks from the peer, {t} thread(s): memcpy from a memfd mapping {}, process_vm_readv {}",
            gb(mm),
            gb(cma)
        );
    }
    // SAFETY: our ring; the copies have ended.
    assert_eq!(unsafe { mismatches(heap.dst, MIB, 3, 0) }.0, 0);
    child.exit();
    drop(peer);
    local.shm.shutdown();
}

/// `process_vm_readv` of the same blocks from `pid`: `depth` blocks per
/// round, split over `threads`.
fn cma_ring_rate(
    pid: i32,
    remote: u64,
    dst: u64,
    block: u64,
    ring: u64,
    depth: u64,
    threads: usize,
) -> f64 {
    ring_rate(block, ring, depth, threads, move |off, len| {
        let piece = cma::Piece {
            local: dst + off,
            remote: remote + off,
            len,
        };
        // SAFETY: a part of our ring only this thread writes now.
        let r = unsafe { cma::read_from(pid, &[piece]) };
        assert!(r[0].is_ok());
    })
}
