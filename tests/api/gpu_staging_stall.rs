//! A peer that takes nothing cannot starve the engine's GPU transfers: a
//! 64 MiB WRITE from GPU memory (the CUDA driver double's) to a target
//! stopped with SIGSTOP holds at most half of the TCP transport's staging
//! buffers, so a healthy peer's GPU WRITE and READ meanwhile take what
//! they take alone (they took 308 s before, behind the stuck WRITE); and
//! the stuck WRITE ends FAILED within a few `MC_TCP_MIN_RATE_WINDOW_SEC`
//! (about one window and a second on an idle host; it took 5 to 35
//! windows before, one for every batch of pieces that got the buffers the
//! previous ones gave back). The target is this
//! test binary run as a child with `TE_STALL_CHILD=1`.

use crate::common;

use common::child::ChildTarget;
use common::gpu_double::DriverDouble;
use common::{Buf, engine, engine_with, pattern, read_req, register, run, wait_task, write_req};
use std::time::{Duration, Instant};
use transfer_engine::{Engine, Location, Region, TaskStatus};

const CHILD_VAR: &str = "TE_STALL_CHILD";
const BIG: u64 = 64 << 20;
const LEN: u64 = 1 << 20;
/// `MC_TCP_MIN_RATE_WINDOW_SEC` of the initiator.
const WINDOW: Duration = Duration::from_secs(2);
/// What the healthy peer's transfers may take beside the stuck one.
const HEALTHY: Duration = Duration::from_millis(100);

/// The stopped target, in the child: a 64 MiB buffer, until stdin closes.
fn child() {
    let e = engine();
    let buf = Buf::zeroed(BIG as usize);
    register(&e, &buf, true);
    println!("READY {} {}", e.local_name(), buf.addr());
    for _ in std::io::stdin().lines().map_while(Result::ok) {}
}

fn register_gpu(e: &Engine, addr: u64, len: u64) {
    e.register(&[Region {
        addr,
        length: len,
        location: Location::parse("cuda:0").expect("location"),
        remote_accessible: true,
    }])
    .expect("register");
}

/// Runs one request and returns how long it took; it must complete.
fn timed(e: &Engine, req: transfer_engine::Request) -> Duration {
    let t = Instant::now();
    assert_eq!(run(e, &[req]), vec![TaskStatus::Completed]);
    t.elapsed()
}

#[test]
fn a_stalled_peer_gives_up_its_staging_within_a_window_and_starves_no_other_peer() {
    if std::env::var_os(CHILD_VAR).is_some() {
        return child();
    }
    let cuda = DriverDouble::load();
    let mut stopped = ChildTarget::start(
        module_path!(),
        "a_stalled_peer_gives_up_its_staging_within_a_window_and_starves_no_other_peer",
        CHILD_VAR,
    );
    let window = WINDOW.as_secs().to_string();
    let me = engine_with(&[("MC_TCP_MIN_RATE_WINDOW_SEC", &window)]);
    let healthy = engine();
    let dst = Buf::zeroed(LEN as usize);
    register(&healthy, &dst, true);
    let big = cuda.alloc(BIG as usize, 0);
    let small = cuda.alloc(LEN as usize, 0);
    register_gpu(&me, big, BIG);
    register_gpu(&me, small, LEN);
    cuda.fill(big, BIG as usize, 3);
    cuda.fill(small, LEN as usize, 4);
    let stuck_seg = me
        .open_segment(&stopped.name)
        .expect("open the stopped target");
    let ok_seg = me.open_segment(healthy.local_name()).expect("open");
    // Each alone first, and both targets reached once.
    let alone = (
        timed(&me, write_req(small, ok_seg, dst.addr(), LEN)),
        timed(&me, read_req(small, ok_seg, dst.addr(), LEN)),
    );
    timed(&me, write_req(small, stuck_seg, stopped.first, LEN));

    stopped.signal(libc::SIGSTOP);
    let batch = me.allocate_batch(1).expect("batch");
    let submitted = Instant::now();
    me.submit(batch, &[write_req(big, stuck_seg, stopped.first, BIG)])
        .expect("submit");
    // Let the stuck WRITE take every staging buffer it may.
    std::thread::sleep(Duration::from_millis(200));
    cuda.fill(small, LEN as usize, 5);
    let write = timed(&me, write_req(small, ok_seg, dst.addr(), LEN));
    assert_eq!(dst.snapshot(), pattern(LEN as usize, 5));
    dst.set(0, &pattern(LEN as usize, 6));
    let read = timed(&me, read_req(small, ok_seg, dst.addr(), LEN));
    assert_eq!(cuda.contents(small, LEN as usize), pattern(LEN as usize, 6));
    let status = wait_task(&me, batch, 0, Duration::from_secs(600));
    let failed_after = submitted.elapsed();
    println!(
        "alone: WRITE {:?}, READ {:?}; beside a 64 MiB WRITE to a stopped peer: WRITE \
         {write:?}, READ {read:?}; the stuck WRITE ended {status:?} after {failed_after:?} \
         (window {WINDOW:?})",
        alone.0, alone.1
    );
    assert_eq!(status, TaskStatus::Failed);
    me.free_batch(batch).expect("free");
    assert!(write < HEALTHY && read < HEALTHY, "{write:?} {read:?}");
    // Within a few windows (the minimum rate is judged over a window, and
    // time the I/O thread was held up by a loaded host is not counted
    // against the peer), far below the minute it stayed WAITING before.
    assert!(failed_after < WINDOW * 4, "{failed_after:?}");
    // Resumed, the peer is reached again (once the cooldown passed).
    stopped.signal(libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(1100));
    timed(&me, write_req(small, stuck_seg, stopped.first, LEN));
    stopped.send("bye");
}
