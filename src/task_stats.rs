//! What an engine's tasks did, for its Prometheus metrics: tasks submitted
//! and ended (by op and result), bytes they moved and how long they took
//! (by route and op), and slices retried (by route). Each counter is
//! striped ([`crate::stripe`]): the submitting and completing threads bump
//! their own cache line with a relaxed add, no lock, and a scrape adds the
//! stripes up ([`TaskStats::snapshot`]).
//!
//! A task is counted submitted once ([`TaskStats::submitted`], from
//! `Task::count_submitted`) and ended once, when its status leaves WAITING
//! (`Task::count_end`); in flight are those submitted and not ended.
//! Routes are numbered by the engine: 0 its own segment's copies, then its
//! transport table in order; this module names none.

use crate::stripe::{Padded, STRIPES, stripe};
use crate::sync;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Routes a task may take: the local copies and each transport of the
/// table (checked against the table where the engine names them).
pub(crate) const ROUTES: usize = 4;

/// The route of the tasks to the engine's own segment; each transport's
/// is [`crate::transport::Kind::route`].
pub(crate) const LOCAL_ROUTE: usize = 0;

/// READ and WRITE.
pub(crate) const OPS: usize = 2;

/// How a task ended: COMPLETED, FAILED, CANCELED.
pub(crate) const RESULTS: usize = 3;

/// Upper bounds of the task duration buckets in microseconds (Mooncake's
/// latency buckets); one more bucket holds what is slower.
pub(crate) const BUCKETS_US: [u64; 19] = [
    10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000,
    500_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000,
];

/// The bucket of a duration of `us` microseconds.
pub(crate) fn bucket_of(us: u64) -> usize {
    BUCKETS_US.partition_point(|&b| b < us)
}

/// One stripe of every counter.
#[derive(Default)]
struct Stripe {
    submitted: AtomicU64,
    submitted_bytes: AtomicU64,
    ended: [[AtomicU64; RESULTS]; OPS],
    /// Bytes requested by the tasks that ended.
    ended_bytes: AtomicU64,
    moved: [[AtomicU64; OPS]; ROUTES],
    buckets: [[[AtomicU64; BUCKETS_US.len() + 1]; OPS]; ROUTES],
    nanos: [[AtomicU64; OPS]; ROUTES],
    retries: [AtomicU64; ROUTES],
}

/// The counters of one engine's tasks.
pub(crate) struct TaskStats {
    stripes: Box<[Padded<Stripe>; STRIPES]>,
    /// Per-peer counters, when some peers get series of their own.
    peers: Option<PeerStats>,
}

/// Bytes moved and tasks ended by peer, for the first peers that asked
/// for a slot; the others share the last slot ("other"). A peer's slot
/// is looked up once per descriptor of its segment (the segment keeps
/// it), so the hot path only adds.
struct PeerStats {
    /// The names of the peers with a slot of their own, by slot.
    names: Mutex<Vec<String>>,
    /// Peers with a slot of their own, at most.
    max: usize,
    /// By stripe: `[slot][op][bytes, tasks]`, flattened.
    stripes: Box<[Padded<Box<[AtomicU64]>>]>,
}

impl PeerStats {
    fn at(slot: usize, op: usize, what: usize) -> usize {
        (slot * OPS + op) * 2 + what
    }
}

impl std::fmt::Debug for TaskStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskStats").finish_non_exhaustive()
    }
}

impl Default for TaskStats {
    fn default() -> Self {
        TaskStats::new(0)
    }
}

/// How one task ended, as [`TaskStats::ended`] counts it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct End {
    /// Its route.
    pub route: usize,
    /// 0 READ, 1 WRITE.
    pub op: usize,
    /// 0 COMPLETED, 1 FAILED, 2 CANCELED.
    pub result: usize,
    /// Bytes it asked to move.
    pub requested: u64,
    /// Bytes it moved.
    pub moved: u64,
    /// From its submission to its end.
    pub took: Duration,
    /// Its peer's slot + 1 ([`TaskStats::peer_slot`]), 0 for none.
    pub peer: u32,
}

/// The sums of every counter at one time.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Snapshot {
    /// Tasks submitted and not ended.
    pub inflight: u64,
    /// The bytes they asked to move.
    pub inflight_bytes: u64,
    /// Tasks ended, by op and result.
    pub ended: [[u64; RESULTS]; OPS],
    /// Bytes moved, by route and op.
    pub moved: [[u64; OPS]; ROUTES],
    /// Task durations, by route and op: the count in each bucket (not
    /// cumulative), the last one beyond [`BUCKETS_US`].
    pub buckets: [[[u64; BUCKETS_US.len() + 1]; OPS]; ROUTES],
    /// The sum of those durations in seconds, by route and op.
    pub seconds: [[f64; OPS]; ROUTES],
    /// Slices retried, by route.
    pub retries: [u64; ROUTES],
    /// By peer (its name, `other` last): bytes moved and tasks ended, by
    /// op.
    pub peers: Vec<(String, [[u64; 2]; OPS])>,
}

impl TaskStats {
    /// Counters with series of their own for at most `peers` peers.
    pub(crate) fn new(peers: usize) -> TaskStats {
        let peers = (peers > 0).then(|| PeerStats {
            names: Mutex::new(Vec::new()),
            max: peers,
            stripes: (0..STRIPES)
                .map(|_| {
                    Padded(
                        (0..(peers + 1) * OPS * 2)
                            .map(|_| AtomicU64::new(0))
                            .collect(),
                    )
                })
                .collect(),
        });
        TaskStats {
            stripes: Box::default(),
            peers,
        }
    }

    /// The slot + 1 of the peer named `name` in the per-peer counters
    /// (given on first ask while there is room, else the shared "other"
    /// one); 0 when per-peer counting is off.
    pub(crate) fn peer_slot(&self, name: &str) -> u32 {
        let Some(p) = &self.peers else {
            return 0;
        };
        let mut names = sync::lock(&p.names);
        let slot = match names.iter().position(|n| n == name) {
            Some(i) => i,
            None if names.len() < p.max => {
                names.push(name.to_string());
                names.len() - 1
            }
            None => p.max,
        };
        slot as u32 + 1
    }

    fn mine(&self) -> &Stripe {
        &self.stripes[stripe()].0
    }

    /// Counts a task of `bytes` submitted.
    pub(crate) fn submitted(&self, bytes: u64) {
        let s = self.mine();
        s.submitted.fetch_add(1, Ordering::Relaxed);
        s.submitted_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts a task's end.
    pub(crate) fn ended(&self, end: End) {
        let s = self.mine();
        let (r, o) = (end.route.min(ROUTES - 1), end.op.min(OPS - 1));
        s.ended[o][end.result.min(RESULTS - 1)].fetch_add(1, Ordering::Relaxed);
        s.ended_bytes.fetch_add(end.requested, Ordering::Relaxed);
        if end.moved > 0 {
            s.moved[r][o].fetch_add(end.moved, Ordering::Relaxed);
        }
        let us = u64::try_from(end.took.as_micros()).unwrap_or(u64::MAX);
        s.buckets[r][o][bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(end.took.as_nanos()).unwrap_or(u64::MAX);
        s.nanos[r][o].fetch_add(nanos, Ordering::Relaxed);
        if let (Some(p), Some(slot)) = (&self.peers, (end.peer as usize).checked_sub(1)) {
            let counts = &p.stripes[stripe()].0;
            let slot = slot.min(p.max);
            counts[PeerStats::at(slot, o, 0)].fetch_add(end.moved, Ordering::Relaxed);
            counts[PeerStats::at(slot, o, 1)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a slice retried on `route` (another rail, the same one, or
    /// the peer's refetched descriptor).
    pub(crate) fn retried(&self, route: usize) {
        self.mine().retries[route.min(ROUTES - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// The sums over the stripes. The ends are read before the
    /// submissions, so a task that ends meanwhile is never in flight
    /// less than zero.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let sum = |f: &dyn Fn(&Stripe) -> &AtomicU64| -> u64 {
            self.stripes.iter().fold(0u64, |acc, s| {
                acc.wrapping_add(f(&s.0).load(Ordering::Relaxed))
            })
        };
        let mut out = Snapshot::default();
        let ended_bytes = sum(&|s| &s.ended_bytes);
        for o in 0..OPS {
            for res in 0..RESULTS {
                out.ended[o][res] = sum(&|s| &s.ended[o][res]);
            }
        }
        for r in 0..ROUTES {
            out.retries[r] = sum(&|s| &s.retries[r]);
            for o in 0..OPS {
                out.moved[r][o] = sum(&|s| &s.moved[r][o]);
                out.seconds[r][o] = sum(&|s| &s.nanos[r][o]) as f64 / 1e9;
                for b in 0..=BUCKETS_US.len() {
                    out.buckets[r][o][b] = sum(&|s| &s.buckets[r][o][b]);
                }
            }
        }
        if let Some(p) = &self.peers {
            let mut names = sync::lock(&p.names).clone();
            names.push("other".to_string());
            out.peers = names
                .into_iter()
                .enumerate()
                .map(|(slot, name)| {
                    let mut by_op = [[0u64; 2]; OPS];
                    for (o, counts) in by_op.iter_mut().enumerate() {
                        for (what, c) in counts.iter_mut().enumerate() {
                            *c = p.stripes.iter().fold(0u64, |acc, s| {
                                let i = PeerStats::at(slot.min(p.max), o, what);
                                acc.wrapping_add(s.0[i].load(Ordering::Relaxed))
                            });
                        }
                    }
                    (name, by_op)
                })
                .collect();
        }
        let ended: u64 = out.ended.iter().flatten().sum();
        out.inflight = sum(&|s| &s.submitted).saturating_sub(ended);
        out.inflight_bytes = sum(&|s| &s.submitted_bytes).saturating_sub(ended_bytes);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_peers_get_slots_and_the_rest_share_other() {
        assert_eq!(TaskStats::new(0).peer_slot("a"), 0, "off");
        let stats = TaskStats::new(2);
        let (a, b) = (stats.peer_slot("a"), stats.peer_slot("b"));
        assert_eq!((a, b, stats.peer_slot("a")), (1, 2, 1));
        let (c, d) = (stats.peer_slot("c"), stats.peer_slot("d"));
        assert_eq!((c, d), (3, 3), "beyond the bound: other");
        for (peer, moved) in [(a, 5), (b, 7), (c, 11), (d, 13), (0, 17)] {
            stats.ended(End {
                route: 1,
                op: 1,
                result: 0,
                requested: moved,
                moved,
                took: Duration::ZERO,
                peer,
            });
        }
        let snap = stats.snapshot();
        let peers: Vec<(&str, u64, u64)> = snap
            .peers
            .iter()
            .map(|(n, c)| (n.as_str(), c[1][0], c[1][1]))
            .collect();
        assert_eq!(peers, [("a", 5, 1), ("b", 7, 1), ("other", 24, 2)]);
    }

    #[test]
    fn buckets_follow_their_upper_bounds() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(10), 0);
        assert_eq!(bucket_of(11), 1);
        assert_eq!(bucket_of(10_000_000), BUCKETS_US.len() - 1);
        assert_eq!(bucket_of(10_000_001), BUCKETS_US.len());
    }

    #[test]
    fn counts_from_many_threads_add_up() {
        let stats = TaskStats::default();
        std::thread::scope(|s| {
            for t in 0..12 {
                let stats = &stats;
                s.spawn(move || {
                    for _ in 0..1000 {
                        stats.submitted(10);
                    }
                    for _ in 0..999 {
                        stats.ended(End {
                            route: t % ROUTES,
                            op: t % OPS,
                            result: t % RESULTS,
                            requested: 10,
                            moved: 4,
                            took: Duration::from_micros(15),
                            peer: 0,
                        });
                    }
                    stats.retried(t % ROUTES);
                });
            }
        });
        let snap = stats.snapshot();
        assert_eq!(snap.inflight, 12);
        assert_eq!(snap.inflight_bytes, 120);
        assert_eq!(snap.ended.iter().flatten().sum::<u64>(), 12 * 999);
        assert_eq!(snap.moved.iter().flatten().sum::<u64>(), 12 * 999 * 4);
        assert_eq!(snap.retries.iter().sum::<u64>(), 12);
        let in_second_bucket: u64 = snap.buckets.iter().flatten().map(|b| b[1]).sum();
        assert_eq!(in_second_bucket, 12 * 999);
        let secs: f64 = snap.seconds.iter().flatten().sum();
        assert!((secs - 12.0 * 999.0 * 15e-6).abs() < 1e-9);
    }
}
