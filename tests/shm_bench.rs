//! Benchmark of the shared-memory transport, two processes, one run,
//! medians of several rounds (ignored by default; run in release):
//!
//! ```text
//! cargo test --release --test shm_bench -- --ignored --nocapture
//! ```
//!
//! * 1 MiB requests (16 slices of 64 KiB, the planner's default), WRITE
//!   and READ, against memcpy of 1 MiB in the same run, on one thread and
//!   split over `MC_SHM_THREADS` threads;
//! * 4 KiB requests in batches of 64, WRITE and READ, requests/s;
//! * what a shared memfd mapping would give instead of cross-memory
//!   attach: memcpy from a mapping of the peer's memfd against
//!   `process_vm_readv` from the peer, 1 MiB, one and several threads.

mod common;
mod shm_support;

use common::Buf;
use serde_json::json;
use shm_support::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};
use transfer_engine::config::Config;
use transfer_engine::transport::Outcome;
use transfer_engine::transport::shm::{ShmPeer, cma, sys};

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
/// (this one and helpers that spin for the next request); `copy(i)` does
/// part `i`.
fn split_rate(len: u64, threads: usize, copy: Arc<dyn Fn(u64) + Send + Sync>) -> f64 {
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
                    copy(i as u64);
                    f.fetch_add(1, Ordering::AcqRel);
                }
            })
        })
        .collect();
    let r = rate(|| {
        finished.store(0, Ordering::Release);
        generation.fetch_add(1, Ordering::AcqRel);
        copy(0);
        while finished.load(Ordering::Acquire) != threads - 1 {
            std::hint::spin_loop();
        }
        len as f64
    });
    generation.store(usize::MAX, Ordering::Release);
    helpers.into_iter().for_each(|h| h.join().unwrap());
    r
}

/// memcpy of `len` bytes from `src` to `dst`, split over `threads`.
fn memcpy_rate(src: u64, dst: u64, len: u64, threads: usize) -> f64 {
    let part = len / threads as u64;
    split_rate(
        len,
        threads,
        Arc::new(move |i| {
            // SAFETY: disjoint parts of two buffers of ours (the source
            // may be a read-only mapping).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (src + i * part) as *const u8,
                    (dst + i * part) as *mut u8,
                    part as usize,
                )
            }
        }),
    )
}

/// `process_vm_readv` of `len` bytes from `pid`, split over `threads`.
fn cma_rate(pid: i32, remote: u64, dst: u64, len: u64, threads: usize) -> f64 {
    let part = len / threads as u64;
    split_rate(
        len,
        threads,
        Arc::new(move |i| {
            let piece = cma::Piece {
                local: dst + i * part,
                remote: remote + i * part,
                len: part,
            };
            // SAFETY: a part of our buffer only this thread writes.
            let r = unsafe { cma::read_from(pid, &[piece]) };
            assert!(r[0].is_ok());
        }),
    )
}

fn gb(bytes_per_sec: f64) -> String {
    format!("{:.2} GB/s", bytes_per_sec / 1e9)
}

#[test]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
fn shm_bench() {
    if is_child() {
        return child_main();
    }
    let threads = Config::from_env().shm_threads;
    let local = Local::start();
    let child = Child::spawn("shm_bench", &[], &[]);
    let src = Buf::zeroed(MIB as usize);
    // SAFETY: a fresh buffer of ours.
    unsafe { fill(src.addr(), MIB, 1, 0) };
    let dst = Buf::zeroed(MIB as usize);
    local.register(src.addr(), MIB, true);
    local.register(dst.addr(), MIB, true);
    let c_dst = child.alloc(MIB, None, true);
    let c_src = child.alloc(MIB, Some(2), true);
    let peer = child.peer_of(&local);
    batch(&local, &peer, &[(src.addr(), c_dst, 1, true)]);

    let memcpy_1 = memcpy_rate(src.addr(), dst.addr(), MIB, 1);
    let memcpy_n = memcpy_rate(src.addr(), dst.addr(), MIB, threads);
    let slices = |write: bool, slice: u64| -> Vec<(u64, u64, u64, bool)> {
        (0..MIB / slice)
            .map(|k| {
                let off = k * slice;
                if write {
                    (src.addr() + off, c_dst + off, slice, true)
                } else {
                    (dst.addr() + off, c_src + off, slice, false)
                }
            })
            .collect()
    };
    let (w64k, r64k) = (slices(true, 65536), slices(false, 65536));
    let write_1m = rate(|| {
        batch(&local, &peer, &w64k);
        MIB as f64
    });
    let read_1m = rate(|| {
        batch(&local, &peer, &r64k);
        MIB as f64
    });
    let small = |write: bool| -> Vec<(u64, u64, u64, bool)> {
        (0..64u64)
            .map(|k| {
                let off = k * 8192 + 64;
                if write {
                    (src.addr() + off, c_dst + off, 4096, true)
                } else {
                    (dst.addr() + off, c_src + off, 4096, false)
                }
            })
            .collect()
    };
    let (w4k, r4k) = (small(true), small(false));
    let write_4k = rate(|| {
        batch(&local, &peer, &w4k);
        64.0
    });
    let read_4k = rate(|| {
        batch(&local, &peer, &r4k);
        64.0
    });
    // The data is right (the last rounds).
    let c = child.call(
        json!({"cmd": "check", "addr": c_dst, "len": MIB, "seed": 1, "from": 0}),
        None,
    );
    assert_eq!(c["bad"], json!(0));
    // SAFETY: our buffer; every READ has ended.
    assert_eq!(unsafe { mismatches(dst.addr(), MIB, 2, 0) }.0, 0);

    // Shared memfd mapping against cross-memory attach, same bytes.
    let m = child.call(json!({"cmd": "memfd", "len": MIB, "seed": 3}), None);
    let (fd, m_addr) = (
        m["fd"].as_u64().unwrap() as i32,
        m["addr"].as_u64().unwrap(),
    );
    let pidfd = sys::pidfd_open(child.pid()).unwrap();
    let mine = sys::pidfd_getfd(&pidfd, fd).unwrap();
    // SAFETY: a new read-only shared mapping of the peer's memfd.
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MIB as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&mine),
            0,
        )
    };
    assert_ne!(mapped, libc::MAP_FAILED);
    let memfd_1 = memcpy_rate(mapped as u64, dst.addr(), MIB, 1);
    let memfd_n = memcpy_rate(mapped as u64, dst.addr(), MIB, threads);
    let cma_1 = cma_rate(child.pid(), m_addr, dst.addr(), MIB, 1);
    let cma_n = cma_rate(child.pid(), m_addr, dst.addr(), MIB, threads);
    // SAFETY: our buffer; the copies have ended.
    assert_eq!(unsafe { mismatches(dst.addr(), MIB, 3, 0) }.0, 0);

    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "shm bench: {cpus} CPUs, MC_SHM_THREADS={threads}, medians of {ROUNDS} rounds of {ROUND_TIME:?}"
    );
    println!("  memcpy 1 MiB, 1 thread               {}", gb(memcpy_1));
    println!(
        "  memcpy 1 MiB, {threads} threads              {}",
        gb(memcpy_n)
    );
    println!(
        "  shm WRITE 1 MiB (16 x 64 KiB)        {}  ({:.2}x memcpy 1T, {:.2}x {threads}T)",
        gb(write_1m),
        write_1m / memcpy_1,
        write_1m / memcpy_n
    );
    println!(
        "  shm READ 1 MiB (16 x 64 KiB)         {}  ({:.2}x memcpy 1T, {:.2}x {threads}T)",
        gb(read_1m),
        read_1m / memcpy_1,
        read_1m / memcpy_n
    );
    println!(
        "  shm WRITE 4 KiB, batches of 64       {:.2} M requests/s",
        write_4k / 1e6
    );
    println!(
        "  shm READ 4 KiB, batches of 64        {:.2} M requests/s",
        read_4k / 1e6
    );
    println!(
        "  memcpy from a memfd mapping, 1 MiB, 1 thread    {}",
        gb(memfd_1)
    );
    println!(
        "  memcpy from a memfd mapping, 1 MiB, {threads} threads   {}",
        gb(memfd_n)
    );
    println!(
        "  process_vm_readv, 1 MiB, 1 thread               {}",
        gb(cma_1)
    );
    println!(
        "  process_vm_readv, 1 MiB, {threads} threads              {}",
        gb(cma_n)
    );
    // SAFETY: unmaps the mapping made above.
    unsafe { libc::munmap(mapped, MIB as usize) };
    child.call(json!({"cmd": "exit"}), None);
    drop(peer);
    local.shm.shutdown();
}
