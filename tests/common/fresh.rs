//! The registration pattern of consumers, between two engines of this
//! process: the target registers a new buffer, tells the initiator with a
//! notification, and the initiator WRITEs to it and READs it back at once,
//! before its cached descriptor of the target lists the buffer. Every byte
//! is checked; a task that FAILS is counted (the verdict is the caller's).

use super::{Buf, pattern, read_req, register, wait_task, write_req};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use transfer_engine::{Engine, TaskStatus};

/// Longest a task may take before the run calls it a hang.
const HANG: Duration = Duration::from_secs(60);

/// What a run did.
#[derive(Debug)]
pub struct Fresh {
    /// Buffers registered and then written and read.
    pub rounds: usize,
    /// Tasks that FAILED (two per round: the WRITE and the READ).
    pub failed: usize,
    /// Wall time of the run.
    pub took: Duration,
    /// Descriptor fetches the initiator made during the run.
    pub fetches: u64,
}

impl std::fmt::Display for Fresh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rounds: {} of {} tasks FAILED, {:.2?}, {} descriptor fetches",
            self.rounds,
            self.failed,
            2 * self.rounds,
            self.took,
            self.fetches
        )
    }
}

/// The pattern written in round `round`.
fn data(len: usize, round: usize) -> Vec<u8> {
    pattern(len, (round % 251) as u8 + 1)
}

/// The first notification `initiator` holds or receives within [`HANG`]:
/// the address its message names.
fn heard(initiator: &Engine) -> Vec<u64> {
    let deadline = Instant::now() + HANG;
    loop {
        let got: Vec<u64> = initiator
            .take_notifies()
            .into_iter()
            .map(|(_, msg)| msg.parse().expect("a buffer address"))
            .collect();
        if !got.is_empty() {
            return got;
        }
        assert!(Instant::now() < deadline, "no notification within {HANG:?}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Submits one request as a batch of one and returns the batch.
fn submit(e: &Engine, r: transfer_engine::Request) -> u64 {
    let b = e.allocate_batch(1).expect("batch");
    e.submit(b, &[r]).expect("submit");
    b
}

/// Waits for the only task of batch `b` and frees it.
fn finish(e: &Engine, b: u64) -> TaskStatus {
    let s = wait_task(e, b, 0, HANG);
    e.free_batch(b).expect("free batch");
    s
}

/// `rounds` rounds of: `target` registers a new buffer of `len` bytes
/// (and unregisters the one of four rounds before, keeping its memory, so
/// every buffer has an address never registered before), notifies
/// `initiator`, which at once WRITEs a pattern into it and then READs it
/// back.
pub fn register_notify_transfer(
    target: &Engine,
    initiator: &Engine,
    rounds: usize,
    len: usize,
) -> Fresh {
    const KEEP: usize = 4;
    let src = Buf::zeroed(len);
    let back = Buf::zeroed(len);
    register(initiator, &src, true);
    register(initiator, &back, true);
    let seg = initiator
        .open_segment(target.local_name())
        .expect("open the target");
    let to_initiator = target
        .open_segment(initiator.local_name())
        .expect("open the initiator") as u64;
    let fetches = initiator.descriptor_fetches();
    let t0 = Instant::now();
    let mut kept: std::collections::VecDeque<Buf> = Default::default();
    let mut unregistered = Vec::with_capacity(rounds);
    let mut failed = 0;
    for round in 0..rounds {
        let fresh = Buf::zeroed(len);
        register(target, &fresh, true);
        target
            .send_notify(to_initiator, "fresh", &fresh.addr().to_string())
            .expect("notify");
        let addr = heard(initiator)[0];
        assert_eq!(addr, fresh.addr());
        let bytes = data(len, round);
        src.set(0, &bytes);
        let w = submit(initiator, write_req(src.addr(), seg, addr, len as u64));
        match finish(initiator, w) {
            TaskStatus::Completed => assert!(
                fresh.snapshot() == bytes,
                "round {round}: the WRITE completed but the target holds other bytes"
            ),
            _ => failed += 1,
        }
        back.set(0, &vec![0; len]);
        let r = submit(initiator, read_req(back.addr(), seg, addr, len as u64));
        match finish(initiator, r) {
            TaskStatus::Completed => assert!(
                back.snapshot() == fresh.snapshot(),
                "round {round}: the READ completed with other bytes than the target's"
            ),
            _ => failed += 1,
        }
        kept.push_back(fresh);
        if kept.len() > KEEP {
            let old = kept.pop_front().unwrap();
            target.unregister(&[old.addr()]).expect("unregister");
            unregistered.push(old);
        }
    }
    let run = Fresh {
        rounds,
        failed,
        took: t0.elapsed(),
        fetches: initiator.descriptor_fetches() - fetches,
    };
    // The engines may be used again: nothing freed here stays registered.
    unregister_all(target, kept.iter());
    unregister_all(initiator, [&src, &back]);
    run
}

/// Unregisters `bufs` from `e`.
fn unregister_all<'a>(e: &Engine, bufs: impl IntoIterator<Item = &'a Buf>) {
    let addrs: Vec<u64> = bufs.into_iter().map(Buf::addr).collect();
    e.unregister(&addrs).expect("unregister");
}

/// A target thread registers a new buffer of `len` bytes every `period`,
/// `count` of them, notifying `initiator` of each; the initiator submits a
/// WRITE to each as soon as it hears of it (while earlier ones may still
/// be in flight), and a READ back once that WRITE is done.
pub fn registrations_every(
    target: &Engine,
    initiator: &Engine,
    period: Duration,
    count: usize,
    len: usize,
) -> Fresh {
    let src = Buf::zeroed(count * len);
    let back = Buf::zeroed(count * len);
    for i in 0..count {
        src.set(i * len, &data(len, i));
    }
    register(initiator, &src, true);
    register(initiator, &back, true);
    let seg = initiator
        .open_segment(target.local_name())
        .expect("open the target");
    let to_initiator = target
        .open_segment(initiator.local_name())
        .expect("open the initiator") as u64;
    let fetches = initiator.descriptor_fetches();
    let t0 = Instant::now();
    let registered: Mutex<Vec<Buf>> = Mutex::new(Vec::new());
    let mut failed = 0;
    let mut written: Vec<bool> = Vec::new();
    std::thread::scope(|s| {
        let producer = s.spawn(|| {
            for _ in 0..count {
                let fresh = Buf::zeroed(len);
                register(target, &fresh, true);
                let addr = fresh.addr();
                registered.lock().unwrap().push(fresh);
                target
                    .send_notify(to_initiator, "fresh", &addr.to_string())
                    .expect("notify");
                std::thread::sleep(period);
            }
        });
        // (round, batch, is the READ) of every task in flight.
        let mut flying: Vec<(usize, u64, bool)> = Vec::new();
        let mut addrs: Vec<u64> = Vec::new();
        let mut done = 0;
        written.resize(count, false);
        let deadline = Instant::now() + HANG + period * count as u32;
        while done < count {
            assert!(Instant::now() < deadline, "the run hangs");
            // Its notifications are queued before it ends.
            let finished = producer.is_finished();
            for addr in initiator.take_notifies().into_iter().map(|(_, m)| m) {
                let i = addrs.len();
                addrs.push(addr.parse().expect("a buffer address"));
                let w = write_req(src.addr() + (i * len) as u64, seg, addrs[i], len as u64);
                flying.push((i, submit(initiator, w), false));
            }
            let mut still = Vec::new();
            for (i, b, read) in flying.drain(..) {
                let (status, _) = initiator.status(b, 0).expect("status");
                if status == TaskStatus::Waiting {
                    still.push((i, b, read));
                    continue;
                }
                initiator.free_batch(b).expect("free batch");
                if status != TaskStatus::Completed {
                    failed += 1;
                }
                if read {
                    if status == TaskStatus::Completed {
                        assert!(
                            back.get(i * len, len) == data(len, i),
                            "buffer {i}: the READ brought back other bytes than were written"
                        );
                    }
                    done += 1;
                } else {
                    written[i] = status == TaskStatus::Completed;
                    let r = read_req(back.addr() + (i * len) as u64, seg, addrs[i], len as u64);
                    still.push((i, submit(initiator, r), true));
                }
            }
            flying = still;
            if finished && flying.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        if let Err(panic) = producer.join() {
            std::panic::resume_unwind(panic);
        }
        assert_eq!(done, count, "buffers written and read back");
    });
    let took = t0.elapsed();
    let fetches = initiator.descriptor_fetches() - fetches;
    let registered = registered.into_inner().unwrap();
    for (i, b) in registered.iter().enumerate() {
        assert!(
            !written[i] || b.snapshot() == data(len, i),
            "buffer {i}: the WRITE completed but the target holds other bytes"
        );
    }
    unregister_all(target, &registered);
    unregister_all(initiator, [&src, &back]);
    Fresh {
        rounds: count,
        failed,
        took,
        fetches,
    }
}
