//! Slow READ drainers hold the data port's connection bound (the engines'
//! configuration: `MC_TCP_MAX_DATA_CONNECTIONS=32` and no minimum rate,
//! `MC_TCP_MIN_RATE_BYTES_PER_SEC=0`, so that only the bound's choice of
//! the session to close can let anyone in). Each drainer READs a 64 MiB
//! buffer through a 16 KiB receive buffer and takes 1 KiB every 2 s, and
//! 2 MiB at once every 20 s: the server's kernel holds up to 4 MiB of the
//! reply and lets the server send again only once about 1 MiB of it is
//! taken, so the bursts are what keeps the server moving a byte within
//! `MC_TCP_STATUS_TIMEOUT_SEC` (before the bound chose by progress, 48 such
//! drainers held a bound of 32 for good). 48 of them, reopened when the
//! server closes them. At the bound the session making the least progress
//! gives way: a real peer opens the segment and moves verified bytes, a raw
//! reader taking its reply at a steady 2 MiB/s keeps its connection to the
//! last byte, and the server holds at most 32 sessions and no thread per
//! connection.
//!
//! The figure in `docs/guarantees.md` ("Connections") is this test with
//! the numbers (the variables given win over the defaults above):
//! `MC_TCP_MAX_DATA_CONNECTIONS=256 TE_SLOW_READERS=300 cargo test --test
//! data_port_slow_readers -- --nocapture`, with or without
//! `MC_TCP_MIN_RATE_BYTES_PER_SEC=65536`; `TE_SLOW_READERS_HOLD_SEC` (4)
//! is how long the drainers hold the port before the real peer arrives,
//! `TE_SLOW_READERS_BURST` (2097152) the bytes of a burst, 0 for none.

use crate::common;

use common::proc::{fds, raise_fd_limit, threads};
use common::readers::{Reader, Took};
use common::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use transfer_engine::TaskStatus;

/// The buffer the drainers READ, whole.
const BAIT: usize = 64 << 20;
const BAIT_SEED: u8 = 3;
/// What a drainer takes per pass, how often, and its receive buffer.
const SIP: usize = 1024;
const SIP_EVERY: Duration = Duration::from_secs(2);
const DRAINER_RCVBUF: usize = 16 << 10;
/// Every this many passes a drainer takes a burst instead (the drainers
/// take turns): enough for the server's kernel to let it send again.
const BURST_EVERY: usize = 10;
const BURST: usize = 2 << 20;
/// The steady reader: how much of the bait it READs, at what pace.
const STEADY: usize = 16 << 20;
const STEADY_RATE: f64 = (2 << 20) as f64;
/// The real peer's round: a WRITE and a READ back of this many bytes.
const ROUND: usize = 4 << 20;
/// How long the real peer's tasks may wait: a "no starvation" verdict.
const PEER_DEADLINE: Duration = Duration::from_secs(45);

/// A number from the environment, else `default`.
fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Takes up to `n` bytes of a drainer's reply, as long as they keep
/// coming.
fn gulp(c: &mut Reader, n: usize) -> Took {
    let mut got = 0;
    let mut dry = 0;
    while got < n && dry < 200 {
        match c.take(n - got) {
            Took::Closed => return Took::Closed,
            Took::Bytes(0) => {
                dry += 1;
                std::thread::sleep(Duration::from_micros(100));
            }
            Took::Bytes(k) => {
                got += k;
                dry = 0;
            }
        }
    }
    Took::Bytes(got)
}

/// Takes the steady reader's reply at [`STEADY_RATE`] on average (a stall
/// of this thread is made up afterwards); `Err` with the bytes taken if the
/// server closed the connection first.
fn read_steadily(mut r: Reader) -> Result<Duration, usize> {
    let start = Instant::now();
    while !r.done() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the steady reader took only {} bytes in 120 s",
            r.got()
        );
        let allowed = (start.elapsed().as_secs_f64() * STEADY_RATE) as usize;
        if let Took::Closed = r.take(allowed.saturating_sub(r.got()).min(1 << 20)) {
            return Err(r.got());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(start.elapsed())
}

#[test]
fn slow_readers_give_way_to_a_real_peer() {
    let cap = setting("MC_TCP_MAX_DATA_CONNECTIONS", 32);
    let drainers = setting("TE_SLOW_READERS", cap + 16);
    let burst = setting("TE_SLOW_READERS_BURST", BURST);
    let cap_value = cap.to_string();
    let mut settings = vec![("MC_TCP_MAX_DATA_CONNECTIONS", cap_value.as_str())];
    // A minimum rate given in the environment applies; none by default.
    if std::env::var_os("MC_TCP_MIN_RATE_BYTES_PER_SEC").is_none() {
        settings.push(("MC_TCP_MIN_RATE_BYTES_PER_SEC", "0"));
    }
    raise_fd_limit(2 * drainers + 1000);
    let target = engine_with(&settings);
    let initiator = engine_with(&settings);
    let bait = Buf::new(BAIT, BAIT_SEED);
    register(&target, &bait, true);
    let mem = Buf::new(ROUND, 1);
    register(&target, &mem, true);
    let port = data_port(&target);
    let bait_at = bait.addr();
    let threads_before = threads();
    let fds_before = fds();

    // The steady reader connects while there is room.
    let steady = Reader::open(port, 256 << 10, bait_at, STEADY, BAIT_SEED, 0);
    let steady = std::thread::spawn(move || read_steadily(steady));

    let stop = Arc::new(AtomicBool::new(false));
    let reopened = Arc::new(AtomicUsize::new(0));
    let sipped = Arc::new(AtomicUsize::new(0));
    let drain = {
        let (stop, reopened, sipped) = (stop.clone(), reopened.clone(), sipped.clone());
        std::thread::spawn(move || {
            let open = || Reader::open(port, DRAINER_RCVBUF, bait_at, BAIT, BAIT_SEED, 0);
            let mut conns: Vec<Reader> = (0..drainers).map(|_| open()).collect();
            let mut pass = 0;
            while !stop.load(Ordering::Relaxed) {
                pass += 1;
                for (i, c) in conns.iter_mut().enumerate() {
                    let took = if burst > 0 && (pass + i) % BURST_EVERY == 0 {
                        gulp(c, burst)
                    } else {
                        c.take(SIP)
                    };
                    match took {
                        Took::Bytes(n) => {
                            sipped.fetch_add(n, Ordering::Relaxed);
                        }
                        Took::Closed => {
                            reopened.fetch_add(1, Ordering::Relaxed);
                            *c = open();
                        }
                    }
                }
                let next = Instant::now() + SIP_EVERY;
                while !stop.load(Ordering::Relaxed) && Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })
    };
    // Every drainer connected, the first ones past their first sips.
    std::thread::sleep(Duration::from_secs(
        setting("TE_SLOW_READERS_HOLD_SEC", 4) as u64
    ));
    // Sockets of this process now beyond the start: the drainers' and the
    // steady reader's, and the server's sessions.
    let held = (fds() - fds_before).saturating_sub(drainers + 1);
    let threads_held = threads();
    println!(
        "{drainers} slow drainers, cap {cap}: the server holds {held} sessions; threads {threads_before} -> {threads_held}"
    );
    assert!(
        held <= cap + 8,
        "the server holds {held} sessions (cap {cap})"
    );
    assert!(
        held >= cap / 2,
        "the drainers do not fill the bound ({held} sessions held, cap {cap})"
    );
    // The test's own two threads, and transient ones of the handshake
    // listener.
    assert!(
        threads_held <= threads_before + 4,
        "threads grew with the connections: {threads_before} -> {threads_held}"
    );

    // A real peer arrives.
    let t = Instant::now();
    let seg = initiator
        .open_segment(target.local_name())
        .expect("open the target's segment through the handshake port");
    let src = Buf::new(ROUND, 9);
    let back = Buf::zeroed(ROUND);
    let w = run_within(
        &initiator,
        &[write_req(src.addr(), seg, mem.addr(), ROUND as u64)],
        PEER_DEADLINE,
    );
    let r = run_within(
        &initiator,
        &[read_req(back.addr(), seg, mem.addr(), ROUND as u64)],
        PEER_DEADLINE,
    );
    let took = t.elapsed();
    println!(
        "a real peer opened the segment, WRITE {:?} and READ {:?} of {} MiB, in {took:?} while {drainers} slow drainers held the data port",
        w[0],
        r[0],
        ROUND >> 20
    );
    assert_eq!(
        (w[0], r[0]),
        (TaskStatus::Completed, TaskStatus::Completed),
        "the real peer's WRITE and READ under the drainers"
    );
    assert!(back.snapshot() == src.snapshot(), "bytes differ");
    assert!(mem.snapshot() == src.snapshot(), "the WRITE did not land");

    let steady = steady.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    drain.join().unwrap();
    println!(
        "the server closed {} drainers, which took {} bytes in all",
        reopened.load(Ordering::Relaxed),
        sipped.load(Ordering::Relaxed)
    );
    match steady {
        Ok(d) => println!("the steady reader took its {} MiB in {d:?}", STEADY >> 20),
        Err(got) => panic!(
            "the steady reader's connection was closed after {got} of {} bytes, while slower drainers held theirs",
            STEADY + 8
        ),
    }
    initiator.shutdown();
    target.shutdown();
}
