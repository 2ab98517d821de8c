//! The scheduler's unit tests: retries, fallback, slicing, rail choice,
//! paused devices, refused keys.

use super::job::RailSet;
use super::rails::RailUse;
use super::*;
use crate::batch::{Batch, TaskStatus};
use crate::metadata::descriptor::{BufferDesc, SegmentDesc};
use crate::transport::{Fallback, LocalSide, Outcome, Refresh, Slice, Transfer};
use std::sync::Mutex;

/// Rails numbered 0..n; a slice posted on any rail but `good` fails.
struct Rails {
    names: Vec<String>,
    n: usize,
    good: usize,
}

plain::plain_carrier_base!(Rails);

impl Carrier for Rails {
    type Target = ();

    plain::plain_carrier_basics!(names);

    fn rails(&self, seg: &RemoteSegment) -> Vec<Rail<()>> {
        (0..self.n)
            .map(|i| Rail {
                key: format!("rail{i}@{}", seg.name),
                device: None,
                peer_device: None,
                target: (),
            })
            .collect()
    }

    fn post(&self, rail: &Rail<()>, slice: Slice, _remote_key: u32) {
        slice.finish(if rail.key.starts_with(&format!("rail{}@", self.good)) {
            Outcome::Done
        } else {
            Outcome::Failed { hard: false }
        });
    }

    fn probe(&self, _rail: &Rail<()>, done: Box<dyn FnOnce(bool) + Send>) {
        done(false)
    }
}

#[test]
fn a_retry_reaches_every_rail_beyond_64() {
    let (n, good) = (70, 64);
    let cfg = SchedConfig {
        retry_cnt: 127,
        ..SchedConfig::default()
    };
    let carrier = Rails {
        names: Vec::new(),
        n,
        good,
    };
    let matrix = PriorityMatrix::parse("{}").unwrap();
    let sched = Scheduler::new(carrier, matrix, &cfg, plain::kind("test"));
    let seg = peer(0, &[(0x1000, 4096, 0)]);
    let batch = Arc::new(Batch::new(1, None).unwrap());
    let memory = MemoryRegistry::default();
    let xfer = Transfer {
        local: 0x9000,
        remote: 0x1000,
        len: 4096,
        write: true,
    };
    let local = LocalSide::of(&memory, 0x9000, None);
    submit_to(&sched, &batch, &seg, xfer, local, None, None);
    // Rail 64 is the one rail that works: a retry must not take it for
    // rail 0, which failed first.
    assert_eq!(batch.poll(0).unwrap(), (TaskStatus::Completed, 4096));
}

#[test]
fn a_slice_out_of_rails_goes_to_the_fallback() {
    let carrier = Rails {
        names: Vec::new(),
        n: 3,
        good: usize::MAX,
    };
    let matrix = PriorityMatrix::parse("{}").unwrap();
    let sched = Scheduler::new(
        carrier,
        matrix,
        &SchedConfig::default(),
        plain::kind("test"),
    );
    let seg = peer(0, &[(0x1000, 1 << 20, 0)]);
    let batch = Arc::new(Batch::new(1, None).unwrap());
    let parts = Arc::new(Mutex::new(Vec::new()));
    let (b, p) = (batch.clone(), parts.clone());
    // The next transport: counts the part on the task and moves it.
    let fallback: Fallback = Arc::new(move |part: Transfer| {
        p.lock().unwrap().push((part.remote, part.len));
        let t = b.slot(0).unwrap();
        t.add_slices(1);
        t.finish_slice(part.len, true);
    });
    let len = 3 * 65536;
    let xfer = Transfer {
        local: 0x9000,
        remote: 0x1000,
        len,
        write: true,
    };
    let local = LocalSide::of(&MemoryRegistry::default(), 0x9000, None);
    submit_to(&sched, &batch, &seg, xfer, local, Some(fallback), None);
    // Every rail fails: each slice goes to the fallback, whole, and the
    // task completes with the bytes the fallback moved.
    assert_eq!(batch.poll(0).unwrap(), (TaskStatus::Completed, len));
    let mut got = parts.lock().unwrap().clone();
    got.sort();
    assert_eq!(
        got,
        (0..3)
            .map(|i| (0x1000 + i * 65536, 65536))
            .collect::<Vec<_>>()
    );
}

/// What [`Recorder`] saw of one slice.
#[derive(Debug, Clone, PartialEq)]
struct Posted {
    device: usize,
    local: u64,
    remote: u64,
    len: u64,
    key: u32,
}

/// Local devices `d0..`, each with a rail to every peer device; records
/// every slice, fails those on `failing` devices, and completes the
/// others at once or, when `hold`, when the test says.
#[derive(Default)]
struct Recorder {
    names: Vec<String>,
    failing: Vec<usize>,
    limit: Option<u64>,
    /// The peer's key now: slices with another are refused.
    want_key: Option<u32>,
    hold: bool,
    posted: Mutex<Vec<Posted>>,
    held: Mutex<Vec<Slice>>,
}

plain::plain_carrier_base!(Arc<Recorder>);

impl Carrier for Arc<Recorder> {
    type Target = ();

    plain::plain_carrier_basics!(names);

    fn rails(&self, seg: &RemoteSegment) -> Vec<Rail<()>> {
        plain::all_pairs(&self.names, seg)
    }

    fn local_limit(&self, addr: u64) -> Option<u64> {
        self.limit.filter(|&l| addr < l)
    }

    fn post(&self, rail: &Rail<()>, slice: Slice, key: u32) {
        let device = rail.device.unwrap();
        self.posted.lock().unwrap().push(Posted {
            device,
            local: slice.local,
            remote: slice.remote,
            len: slice.len,
            key,
        });
        if self.want_key.is_some_and(|k| k != key) {
            slice.finish(Outcome::Rejected)
        } else if self.failing.contains(&device) {
            slice.finish(Outcome::Failed { hard: false })
        } else if self.hold {
            self.held.lock().unwrap().push(slice)
        } else {
            slice.finish(Outcome::Done)
        }
    }

    fn probe(&self, _rail: &Rail<()>, done: Box<dyn FnOnce(bool) + Send>) {
        done(false)
    }
}

/// A peer with `peer_devices` devices (any number, for carriers that
/// ignore them) and `buffers` as (addr, len, rkey).
fn peer(peer_devices: usize, buffers: &[(u64, u64, u32)]) -> Arc<RemoteSegment> {
    Arc::new(RemoteSegment {
        name: "peer".into(),
        desc: SegmentDesc {
            protocol: "rdma".into(),
            devices: (0..peer_devices)
                .map(|j| crate::metadata::descriptor::DeviceDesc {
                    name: format!("p{j}"),
                    lid: 0,
                    gid: "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:05".into(),
                })
                .collect(),
            buffers: buffers
                .iter()
                .map(|&(addr, length, key)| BufferDesc {
                    name: "cpu:0".into(),
                    addr,
                    length,
                    rkey: vec![key; peer_devices],
                    lkey: vec![key; peer_devices],
                })
                .collect(),
            ..Default::default()
        },
        ..Default::default()
    })
}

/// Submits one request from `location`, with `refresh` if given, and
/// returns its batch.
fn send<C: Carrier>(
    sched: &Arc<Scheduler<C>>,
    seg: &Arc<RemoteSegment>,
    location: &str,
    local: u64,
    remote: u64,
    len: u64,
    refresh: Option<Refresh>,
) -> Arc<Batch> {
    let batch = Arc::new(Batch::new(1, None).unwrap());
    let xfer = Transfer {
        local,
        remote,
        len,
        write: true,
    };
    let side = LocalSide {
        location: location.into(),
        end: None,
        gpu: None,
        fence: None,
    };
    submit_to(sched, &batch, seg, xfer, side, None, refresh);
    batch
}

/// Submits `xfer` as the one task of `batch`.
fn submit_to<C: Carrier>(
    sched: &Arc<Scheduler<C>>,
    batch: &Arc<Batch>,
    seg: &Arc<RemoteSegment>,
    xfer: Transfer,
    local: LocalSide,
    fallback: Option<Fallback>,
    refresh: Option<Refresh>,
) {
    batch
        .append(1, |first, _| {
            sched.submit(Submission {
                batch: batch.clone(),
                task: first,
                seg: seg.clone(),
                xfer,
                local,
                fallback,
                refresh,
            });
            Ok(())
        })
        .unwrap();
}

#[test]
fn slices_are_cut_at_remote_buffer_edges_and_local_limits() {
    let rec = Arc::new(Recorder {
        names: vec!["d0".into()],
        limit: Some(0x90_0000 + 70_000),
        ..Default::default()
    });
    let matrix = PriorityMatrix::parse("{}").unwrap();
    let sched = Scheduler::new(
        rec.clone(),
        matrix,
        &SchedConfig::default(),
        plain::kind("test"),
    );
    let edge = 0x1_0000 + 100_000;
    let seg = peer(1, &[(0x1_0000, 100_000, 11), (edge, 200_000, 22)]);
    let (local, remote, len) = (0x90_0000, 0x1_0000 + 50, 200_000);
    let batch = send(&sched, &seg, "cpu:0", local, remote, len, None);
    assert_eq!(batch.poll(0).unwrap(), (TaskStatus::Completed, len));
    let got: Vec<(u64, u64, u32)> = rec
        .posted
        .lock()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p.local - local, p.remote - remote);
            (p.remote - remote, p.len, p.key)
        })
        .collect();
    // Slices of 64 KiB (the last absorbing a short tail), cut at the
    // local piece's end (70000) and the first buffer's (99950); each
    // with its own buffer's key.
    assert_eq!(
        got,
        vec![
            (0, 65536, 11),
            (65536, 70_000 - 65536, 11),
            (70_000, 99_950 - 70_000, 11),
            (99_950, 131_072 - 99_950, 22),
            (131_072, 200_000 - 131_072, 22),
        ]
    );
}

#[test]
fn round_robin_takes_turns_where_least_loaded_would_not() {
    // `cpu:1` prefers d0 only; `cpu:0` both devices.
    let matrix = r#"{"cpu:0": [["d0", "d1"], []], "cpu:1": [["d0"], ["d1"]]}"#;
    let run = |round_robin: bool| {
        let rec = Arc::new(Recorder {
            names: vec!["d0".into(), "d1".into()],
            hold: true,
            ..Default::default()
        });
        let cfg = SchedConfig {
            round_robin,
            ..SchedConfig::default()
        };
        let sched = Scheduler::new(
            rec.clone(),
            PriorityMatrix::parse(matrix).unwrap(),
            &cfg,
            plain::kind("test"),
        );
        let seg = peer(1, &[(0x1_0000, 1 << 30, 7)]);
        // Loads d0 with 8 slices, then sends 4 that may use either.
        let busy = send(&sched, &seg, "cpu:1", 0x90_0000, 0x1_0000, 8 << 16, None);
        let spread = send(&sched, &seg, "cpu:0", 0x90_0000, 0x1_0000, 4 << 16, None);
        let devices: Vec<usize> = rec.posted.lock().unwrap()[8..]
            .iter()
            .map(|p| p.device)
            .collect();
        for s in rec.held.lock().unwrap().drain(..) {
            s.finish(Outcome::Done);
        }
        assert_eq!(busy.poll(0).unwrap(), (TaskStatus::Completed, 8 << 16));
        assert_eq!(spread.poll(0).unwrap(), (TaskStatus::Completed, 4 << 16));
        devices
    };
    assert_eq!(run(false), vec![1; 4], "least loaded: all on d1");
    let rr = run(true);
    assert_eq!(rr.iter().filter(|&&d| d == 0).count(), 2, "{rr:?}");
    assert!(rr.windows(2).all(|w| w[0] != w[1]), "in turn: {rr:?}");
}

#[test]
fn a_device_failing_on_every_rail_leaves_selection() {
    // d0 fails on each of its 10 rails; d1 works.
    let rec = Arc::new(Recorder {
        names: vec!["d0".into(), "d1".into()],
        failing: vec![0],
        ..Default::default()
    });
    let matrix = PriorityMatrix::parse("{}").unwrap();
    let sched = Scheduler::new(
        rec.clone(),
        matrix,
        &SchedConfig::default(),
        plain::kind("test"),
    );
    let seg = peer(10, &[(0x1_0000, 1 << 30, 7)]);
    for i in 0..200u64 {
        let b = send(
            &sched,
            &seg,
            "cpu:0",
            0x90_0000,
            0x1_0000 + i * 4096,
            4096,
            None,
        );
        assert_eq!(b.poll(0).unwrap(), (TaskStatus::Completed, 4096));
    }
    let posted = rec.posted.lock().unwrap();
    let on_d0 = posted.iter().filter(|p| p.device == 0).count();
    // Its rails alone would take 5 errors each (50) before pausing; the
    // device leaves after 32 failures in a row.
    assert_eq!(on_d0, rails::DEVICE_FAILURES_TO_PAUSE as usize);
    assert_eq!(sched.loads[0].state(), RailUse::Closed);
    assert_eq!(sched.loads[1].state(), RailUse::Open);
}

/// Waits (boundedly) for a task to leave WAITING.
fn wait(batch: &Batch) -> (TaskStatus, u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = batch.poll(0).unwrap();
        if s.0 != TaskStatus::Waiting || std::time::Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_refused_key_is_retried_once_with_the_refetched_descriptor() {
    let len = 3 * 65536;
    // The peer holds the buffer under key `now`; the cached descriptor
    // says 7; a refetch says `refetched`.
    let run = |now: u32, refetched: u32| {
        let rec = Arc::new(Recorder {
            names: vec!["d0".into()],
            want_key: Some(now),
            ..Default::default()
        });
        let matrix = PriorityMatrix::parse("{}").unwrap();
        let sched = Scheduler::new(
            rec.clone(),
            matrix,
            &SchedConfig::default(),
            plain::kind("test"),
        );
        let seg = peer(2, &[(0x1_0000, 1 << 20, 7)]);
        let fresh = peer(2, &[(0x1_0000, 1 << 20, refetched)]);
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = calls.clone();
        // As the engine: a refetch on another thread, never inline.
        let refresh: Refresh = Arc::new(move |name: &str, done| {
            assert_eq!(name, "peer");
            c.fetch_add(1, Ordering::Relaxed);
            let fresh = fresh.clone();
            std::thread::spawn(move || done(Some(fresh)));
        });
        let b = send(
            &sched,
            &seg,
            "cpu:0",
            0x90_0000,
            0x1_0000,
            len,
            Some(refresh),
        );
        let status = wait(&b);
        (status, calls, rec)
    };
    // The task may end as soon as one slice fails, before the others
    // are refused and refetch: what they do is read once it shows,
    // within a few seconds (the refetches return at once).
    let settled = |calls: &std::sync::atomic::AtomicUsize,
                   rec: &Recorder,
                   done: &dyn Fn(usize, &[u32]) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let keys: Vec<u32> = rec.posted.lock().unwrap().iter().map(|p| p.key).collect();
            let n = calls.load(Ordering::Relaxed);
            if done(n, &keys) || std::time::Instant::now() > deadline {
                return (n, keys);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // Re-registered (new key 8): each slice is retried with it.
    let (status, calls, rec) = run(8, 8);
    assert_eq!(status, (TaskStatus::Completed, len));
    let (calls, keys) = settled(&calls, &rec, &|_, _| true);
    // A slice refused after an earlier slice's refetch landed moves to
    // the refetched descriptor without one of its own.
    assert!((1..=3).contains(&calls), "{calls} refetches");
    assert_eq!(keys.iter().filter(|&&k| k == 8).count(), 3, "{keys:?}");
    // The refetched descriptor is unchanged: the slices fail, once.
    let (status, calls, rec) = run(8, 7);
    assert_eq!(status.0, TaskStatus::Failed);
    let (calls, keys) = settled(&calls, &rec, &|n, _| n >= 3);
    assert_eq!((calls, keys), (3, vec![7; 3]));
    // Refused again after the refetch: no second refetch. A slice posted
    // after an earlier slice's refetch landed goes with key 9 at once and
    // does not refetch either, so there are one to three refetches.
    let (status, calls, rec) = run(10, 9);
    assert_eq!(status.0, TaskStatus::Failed);
    let (calls, keys) = settled(&calls, &rec, &|_, keys| {
        keys.iter().filter(|&&k| k == 9).count() >= 3
    });
    assert!((1..=3).contains(&calls), "{calls} refetches");
    assert_eq!(keys.iter().filter(|&&k| k == 9).count(), 3, "{keys:?}");
    assert!(!keys.contains(&10), "{keys:?}");
}

#[test]
fn rail_sets_are_exact() {
    let mut s = RailSet::default();
    assert!(!s.contains(0) && s.len() == 0);
    s.insert(0);
    s.insert(64);
    s.insert(200);
    assert!(s.contains(0) && s.contains(64) && s.contains(200));
    assert!(!s.contains(1) && !s.contains(128) && !s.contains(1000));
    assert_eq!(s.len(), 3);
}
