//! Unregister fences copies within the process too: during a 256 MiB
//! `LOCAL_SEGMENT` WRITE between two registered buffers, unregistering
//! the destination (or the source) returns only once no piece of the copy
//! is inside it, and no byte lands in it afterwards: the test maps new
//! zero pages at the address right after the unregister returned, and
//! they must stay zero (before: tens of MB landed in them, and a `munmap`
//! right after unregister killed the process with SIGSEGV); the task
//! ends FAILED. The same for the CUDA driver's copies of GPU memory (its
//! test double's).

use crate::common;

use common::gpu_double::DriverDouble;
use common::{Mapping, engine, register_range, wait_for, wait_task, write_req};
use std::time::Duration;
use transfer_engine::{Engine, LOCAL_SEGMENT_ID, Location, Region, TaskStatus};

const BIG: usize = 256 << 20;
/// Rounds to try for one in which the copy was still running when the
/// unregister returned (it usually is in the first).
const ROUNDS: usize = 20;

/// Bytes of `m` that are not zero.
fn landed(m: &Mapping) -> usize {
    // SAFETY: within our mapping; the copy into it has ended.
    let now = unsafe { std::slice::from_raw_parts(m.addr, m.len) };
    now.iter().filter(|&&b| b != 0).count()
}

/// Submits a LOCAL_SEGMENT WRITE of `len` bytes from `src` to `dst`.
fn start(e: &Engine, src: u64, dst: u64, len: usize) -> u64 {
    let b = e.allocate_batch(1).expect("batch");
    e.submit(b, &[write_req(src, LOCAL_SEGMENT_ID, dst, len as u64)])
        .expect("submit");
    b
}

/// Waits until the copy has landed its first byte in `dst` (its first
/// slice is copied first on some thread).
fn wait_started(dst: &Mapping, fill: u8) {
    wait_for("the copy to begin", Duration::from_secs(30), || {
        // SAFETY: byte 0 of our mapping, written by the copy.
        unsafe { std::ptr::read_volatile(dst.addr) == fill }
    });
}

#[test]
fn no_byte_of_a_local_copy_lands_after_its_destination_is_unregistered() {
    let e = engine();
    let src = Mapping::filled(BIG, 0x5A);
    register_range(&e, src.addr(), BIG as u64, false);
    let mut cut_short = 0;
    for _ in 0..ROUNDS {
        let dst = Mapping::filled(BIG, 0);
        register_range(&e, dst.addr(), BIG as u64, false);
        let b = start(&e, src.addr(), dst.addr(), BIG);
        wait_started(&dst, 0x5A);
        e.unregister(&[dst.addr()]).expect("unregister");
        dst.replace();
        let status = wait_task(&e, b, 0, Duration::from_secs(60));
        e.free_batch(b).expect("free");
        let late = landed(&dst);
        assert_eq!(late, 0, "{late} bytes landed after unregister returned");
        if status == TaskStatus::Failed {
            cut_short += 1;
            break;
        }
        assert_eq!(status, TaskStatus::Completed);
    }
    assert!(
        cut_short > 0,
        "the copy ended before unregister in every round"
    );
    e.shutdown();
}

#[test]
fn unmapping_either_side_right_after_unregister_is_safe() {
    let e = engine();
    for side in ["destination", "source"] {
        let mut failed = false;
        for _ in 0..ROUNDS {
            let src = Mapping::filled(BIG, 0x33);
            let dst = Mapping::filled(BIG, 0);
            register_range(&e, src.addr(), BIG as u64, false);
            register_range(&e, dst.addr(), BIG as u64, false);
            let b = start(&e, src.addr(), dst.addr(), BIG);
            wait_started(&dst, 0x33);
            let (gone, kept) = if side == "destination" {
                (dst, src)
            } else {
                (src, dst)
            };
            e.unregister(&[gone.addr()]).expect("unregister");
            // Before the fence, a copy thread touched the unmapped pages
            // and killed the process.
            drop(gone);
            let status = wait_task(&e, b, 0, Duration::from_secs(60));
            let why = e.failure_reason(b, 0).ok().flatten();
            e.free_batch(b).expect("free");
            e.unregister(&[kept.addr()]).expect("unregister");
            if status == TaskStatus::Failed {
                println!("{side} unmapped mid-copy: FAILED ({why:?})");
                failed = true;
                break;
            }
        }
        assert!(
            failed,
            "the copy ended before unregister in every round ({side})"
        );
    }
    e.shutdown();
}

#[test]
fn no_driver_copy_lands_after_a_gpu_copys_destination_is_unregistered() {
    let cuda = DriverDouble::load();
    let e = engine();
    let dev = cuda.alloc(BIG, 0);
    cuda.fill(dev, BIG, 9);
    e.register(&[Region {
        addr: dev,
        length: BIG as u64,
        location: Location::parse("cuda:0").expect("location"),
        remote_accessible: false,
    }])
    .expect("register");
    let first = common::pattern(1, 9)[0];
    assert_ne!(first, 0);
    let mut cut_short = false;
    for _ in 0..ROUNDS {
        let dst = Mapping::filled(BIG, 0);
        register_range(&e, dst.addr(), BIG as u64, false);
        let copies = cuda.copies();
        let b = start(&e, dev, dst.addr(), BIG);
        wait_started(&dst, first);
        e.unregister(&[dst.addr()]).expect("unregister");
        dst.replace();
        let status = wait_task(&e, b, 0, Duration::from_secs(60));
        e.free_batch(b).expect("free");
        let late = landed(&dst);
        assert_eq!(
            late, 0,
            "{late} bytes of driver copies landed after unregister"
        );
        assert!(cuda.copies() > copies, "the driver double copied");
        if status == TaskStatus::Failed {
            cut_short = true;
            break;
        }
    }
    assert!(cut_short, "the copy ended before unregister in every round");
    e.shutdown();
}
