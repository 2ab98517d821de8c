//! The engine's own cost per slice: the real [`Scheduler`] (route lookup,
//! rail choice, load accounting, a task's slice counters, the completion
//! path) over a carrier that completes every slice inline, as it is
//! posted, so that nothing but the engine's own work is timed. Driven by
//! `benches/slice_path.rs` (and its smoke run in `cargo test`); built only
//! with feature `bench-internals`, not into the shipped library.

use super::plain::{self, all_pairs, plain_carrier_base, plain_carrier_basics};
use super::{Carrier, Rail, SchedConfig, Scheduler};
use crate::batch::{Batch, TaskStatus};
use crate::metadata::descriptor::{BufferDesc, DeviceDesc, SegmentDesc};
use crate::segment::RemoteSegment;
use crate::topology::PriorityMatrix;
use crate::transport::{LocalSide, Outcome, Slice, Submission, Transfer};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A carrier whose slices complete as they are posted.
struct Null {
    devices: Vec<String>,
}

plain_carrier_base!(Null);

impl Carrier for Null {
    type Target = ();

    plain_carrier_basics!(devices);

    fn rails(&self, seg: &RemoteSegment) -> Vec<Rail<()>> {
        all_pairs(&self.devices, seg)
    }

    fn post(&self, _rail: &Rail<()>, slice: Slice, _remote_key: u32) {
        slice.finish(Outcome::Done)
    }

    fn probe(&self, _rail: &Rail<()>, done: Box<dyn FnOnce(bool) + Send>) {
        done(true)
    }
}

/// The matrix of a host with `nics` NICs on two NUMA nodes: each node's
/// memory prefers its half and may use the other.
fn two_node_matrix(names: &[String]) -> serde_json::Value {
    let (a, b) = names.split_at(names.len() / 2);
    serde_json::json!({ "cpu:0": [a, b], "cpu:1": [b, a] })
}

/// What one run of [`slice_path`] measured.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct SlicePathRun {
    /// Slices completed, over all threads.
    pub slices: u64,
    /// Wall time from the first submit to the last completion.
    pub elapsed: Duration,
    /// CPU time of the submitting threads, added up (on a busy machine
    /// the wall time includes waits for a core; this does not).
    pub cpu: Duration,
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a
    // constant the kernel knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `threads` threads, each submitting batches of `batch` requests of
/// `slices_per_request` 64 KiB slices to one peer segment reached over
/// `nics` local and `nics` peer devices (`nics`² rails), for `duration`.
/// Every task is checked complete with all its bytes.
///
/// # Panics
/// If a task does not complete with every byte (the null carrier moves
/// nothing, so the engine's bookkeeping is what is checked).
#[doc(hidden)]
pub fn slice_path(
    threads: usize,
    nics: usize,
    batch: usize,
    slices_per_request: u64,
    duration: Duration,
) -> SlicePathRun {
    let names: Vec<String> = (0..nics).map(|i| format!("mlx5_{i}")).collect();
    let cfg = SchedConfig::default();
    let matrix = PriorityMatrix::parse(&two_node_matrix(&names).to_string())
        .expect("the bench's matrix parses");
    let sched = Scheduler::new(
        Null {
            devices: names.clone(),
        },
        matrix,
        &cfg,
        plain::kind("null"),
    );
    let base = 0x7f00_0000_0000u64;
    let seg = Arc::new(RemoteSegment {
        name: "peer:12345".into(),
        desc: SegmentDesc {
            name: "peer:12345".into(),
            protocol: "rdma".into(),
            buffers: vec![BufferDesc {
                name: "cpu:0".into(),
                addr: base,
                length: 1 << 40,
                rkey: (0..nics as u32).map(|i| 0x100 + i).collect(),
                lkey: (0..nics as u32).map(|i| 0x100 + i).collect(),
            }],
            devices: names
                .iter()
                .map(|n| DeviceDesc {
                    name: n.clone(),
                    lid: 0,
                    gid: "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:05".into(),
                })
                .collect(),
            priority_matrix: Some(two_node_matrix(&names)),
            ..Default::default()
        },
        ..Default::default()
    });
    let request = slices_per_request * cfg.slice_size;
    let start = Instant::now();
    let counts: Vec<(u64, Duration)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (sched, seg) = (sched.clone(), seg.clone());
                s.spawn(move || {
                    let cpu = thread_cpu();
                    let mut slices = 0u64;
                    while start.elapsed() < duration {
                        let b = Arc::new(Batch::new(batch, None).expect("batch size"));
                        b.append(batch, |first, _| {
                            for task in first..first + batch {
                                let off = task as u64 * request;
                                sched.submit(Submission {
                                    batch: b.clone(),
                                    task,
                                    seg: seg.clone(),
                                    xfer: Transfer {
                                        local: 0x1000_0000 + off,
                                        remote: base + off,
                                        len: request,
                                        write: true,
                                    },
                                    local: LocalSide {
                                        location: "cpu:0".into(),
                                        end: None,
                                        gpu: None,
                                        fence: None,
                                    },
                                    fallback: None,
                                    refresh: None,
                                });
                            }
                            Ok(())
                        })
                        .expect("append");
                        for task in 0..batch {
                            assert_eq!(
                                b.poll(task).expect("task"),
                                (TaskStatus::Completed, request)
                            );
                        }
                        slices += batch as u64 * slices_per_request;
                    }
                    (slices, thread_cpu() - cpu)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("bench thread"))
            .collect()
    });
    SlicePathRun {
        elapsed: start.elapsed(),
        slices: counts.iter().map(|c| c.0).sum(),
        cpu: counts.iter().map(|c| c.1).sum(),
    }
}
