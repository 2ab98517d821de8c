//! What an engine's tasks did, for its Prometheus metrics: tasks submitted
//! and ended (by op and result), bytes they moved and how long they took
//! (by route and op), and slices retried (by route). Every thread that
//! counts has a block of its own ([`crate::thread_counters`]): an update is
//! a relaxed load and store on a cache line no other thread writes, and a
//! scrape adds the blocks up ([`TaskStats::snapshot`]).
//!
//! A task end counts one duration bucket (by route, op and result), its
//! duration, the bytes it moved and the bytes it asked for; the tasks
//! ended by op and result and the histogram by route and op are sums of
//! those buckets, and in flight are those submitted (counted once per
//! submit call) less those ended, all derived at scrape time.
//!
//! The ends of tasks that finish on the thread submitting them, within
//! the submit call (copies within the process, refusals), are counted
//! when the call returns ([`TaskStats::defer_ends`]): the status of a
//! task is visible only from then on, so that is the end its caller can
//! see, and one clock read serves all of them.
//!
//! Routes are numbered by the engine: 0 its own segment's copies, then its
//! transport table in order; this module names none.

use crate::stripe::{Padded, STRIPES, stripe};
use crate::sync;
use crate::thread_counters::{PerThread, Writer};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Duration buckets, the last one beyond [`BUCKETS_US`].
const BUCKETS: usize = BUCKETS_US.len() + 1;

/// The bucket of a duration of `us` microseconds.
pub(crate) fn bucket_of(us: u64) -> usize {
    BUCKETS_US.partition_point(|&b| b < us)
}

/// [`Block::scope`] when no submit call defers ends.
const NO_SCOPE: u64 = u64::MAX;

/// One thread's counters.
#[repr(align(64))]
struct Block {
    submitted: AtomicU64,
    submitted_bytes: AtomicU64,
    /// Bytes requested by the tasks that ended.
    ended_bytes: AtomicU64,
    moved: [[AtomicU64; OPS]; ROUTES],
    nanos: [[AtomicU64; OPS]; ROUTES],
    retries: [AtomicU64; ROUTES],
    buckets: [[[[AtomicU64; BUCKETS]; RESULTS]; OPS]; ROUTES],
    /// The owner's own state, never summed: the submission time of the
    /// tasks of the submit call in progress on the thread
    /// ([`TaskStats::defer_ends`]), or [`NO_SCOPE`].
    scope: AtomicU64,
    /// Ends deferred to the scope's close, by route, op and result.
    deferred: [[[AtomicU64; RESULTS]; OPS]; ROUTES],
}

impl Default for Block {
    fn default() -> Self {
        Block {
            submitted: AtomicU64::default(),
            submitted_bytes: AtomicU64::default(),
            ended_bytes: AtomicU64::default(),
            moved: Default::default(),
            nanos: Default::default(),
            retries: Default::default(),
            buckets: Default::default(),
            scope: AtomicU64::new(NO_SCOPE),
            deferred: Default::default(),
        }
    }
}

impl Block {
    /// Counts `count` tasks of `route`, `op` and `result` that took
    /// `nanos` each.
    fn add_durations(
        &self,
        w: &Writer<'_, Block>,
        (route, op, result): (usize, usize, usize),
        count: u64,
        nanos: u64,
    ) {
        w.add(
            &self.buckets[route][op][result][bucket_of(nanos / 1000)],
            count,
        );
        w.add(&self.nanos[route][op], nanos.wrapping_mul(count));
    }
}

/// The counters of one engine's tasks.
pub(crate) struct TaskStats {
    blocks: PerThread<Block>,
    /// Per-peer counters, when some peers get series of their own.
    peers: Option<PeerStats>,
}

/// Bytes moved and tasks ended by peer, for the first peers that asked
/// for a slot; the others share the last slot ("other"). A peer's slot
/// is looked up once per descriptor of its segment (the segment keeps
/// it), so the hot path only adds (striped atomic adds: per-peer series
/// are opt-in).
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
    /// When it was submitted (`clock::now_nanos`).
    pub submitted: u64,
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
    pub buckets: [[[u64; BUCKETS]; OPS]; ROUTES],
    /// The sum of those durations in seconds, by route and op.
    pub seconds: [[f64; OPS]; ROUTES],
    /// Slices retried, by route.
    pub retries: [u64; ROUTES],
    /// By peer (its name, `other` last): bytes moved and tasks ended, by
    /// op.
    pub peers: Vec<(String, [[u64; 2]; OPS])>,
}

/// Ends deferred on this thread until the submit call returns: dropped,
/// it counts them, with one clock read ([`TaskStats::defer_ends`]).
pub(crate) struct DeferredEnds<'a> {
    stats: &'a TaskStats,
    /// When the call's tasks were submitted.
    submitted: u64,
    /// The thread's block (it closes on the thread that opened it).
    w: Writer<'a, Block>,
}

impl DeferredEnds<'_> {
    /// Whether it defers the ends of tasks counted in `stats` and
    /// submitted at `submitted`.
    pub(crate) fn holds(&self, stats: &TaskStats, submitted: u64) -> bool {
        std::ptr::eq(self.stats, stats) && self.submitted == submitted
    }

    /// Counts the end of a task it [holds](DeferredEnds::holds), its
    /// duration when it is dropped.
    #[inline]
    pub(crate) fn end(&self, end: End) {
        let (r, o, res) = (
            end.route % ROUTES,
            end.op % OPS,
            end.result.min(RESULTS - 1),
        );
        let b = self.w.block;
        self.w.add(&b.ended_bytes, end.requested);
        self.w.add(&b.moved[r][o], end.moved);
        self.w.add(&b.deferred[r][o][res], 1);
        if self.stats.peers.is_some() {
            self.stats.ended_by_peer(o, &end);
        }
    }
}

impl Drop for DeferredEnds<'_> {
    fn drop(&mut self) {
        let w = &self.w;
        let b = w.block;
        b.scope.store(NO_SCOPE, Ordering::Relaxed);
        let mut took = None;
        for (r, by_route) in b.deferred.iter().enumerate() {
            for (o, by_op) in by_route.iter().enumerate() {
                for (res, deferred) in by_op.iter().enumerate() {
                    let count = deferred.load(Ordering::Relaxed);
                    if count == 0 {
                        continue;
                    }
                    deferred.store(0, Ordering::Relaxed);
                    let took = *took.get_or_insert_with(|| {
                        crate::clock::now_nanos().saturating_sub(self.submitted)
                    });
                    b.add_durations(w, (r, o, res), count, took);
                }
            }
        }
    }
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
            blocks: PerThread::default(),
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

    /// Counts `tasks` tasks of `bytes` in all submitted.
    pub(crate) fn submitted(&self, tasks: u64, bytes: u64) {
        let w = self.blocks.writer();
        w.add(&w.block.submitted, tasks);
        w.add(&w.block.submitted_bytes, bytes);
    }

    /// Defers the ends of the tasks submitted at `submitted` that end on
    /// this thread until the returned guard is dropped (when the submit
    /// call returns); `None` (ends counted as they come) when a deferral
    /// is open already on this thread, or the thread has no block of its
    /// own.
    pub(crate) fn defer_ends(&self, submitted: u64) -> Option<DeferredEnds<'_>> {
        let w = self.blocks.writer();
        let scope = &w.block.scope;
        let free = w.owned() && scope.load(Ordering::Relaxed) == NO_SCOPE && submitted != NO_SCOPE;
        if !free {
            return None;
        }
        scope.store(submitted, Ordering::Relaxed);
        Some(DeferredEnds {
            stats: self,
            submitted,
            w,
        })
    }

    /// Counts a task's end.
    #[inline]
    pub(crate) fn ended(&self, end: End) {
        let (r, o, res) = (
            end.route % ROUTES,
            end.op % OPS,
            end.result.min(RESULTS - 1),
        );
        let w = self.blocks.writer();
        let b = w.block;
        w.add(&b.ended_bytes, end.requested);
        w.add(&b.moved[r][o], end.moved);
        if w.owned() && b.scope.load(Ordering::Relaxed) == end.submitted {
            w.add(&b.deferred[r][o][res], 1);
        } else {
            Self::ended_now(&w, (r, o, res), end.submitted);
        }
        if self.peers.is_some() {
            self.ended_by_peer(o, &end);
        }
    }

    /// Counts the duration of a task that ended now.
    #[inline(never)]
    fn ended_now(w: &Writer<'_, Block>, key: (usize, usize, usize), submitted: u64) {
        let took = crate::clock::now_nanos().saturating_sub(submitted);
        w.block.add_durations(w, key, 1, took);
    }

    /// Counts a task's end in the per-peer counters.
    #[cold]
    fn ended_by_peer(&self, o: usize, end: &End) {
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
        let w = self.blocks.writer();
        w.add(&w.block.retries[route.min(ROUTES - 1)], 1);
    }

    /// The sums over the threads' blocks. The ends are read before the
    /// submissions, so a task that ends meanwhile is never in flight
    /// less than zero.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut out = Snapshot::default();
        let (mut submitted, mut submitted_bytes, mut ended_bytes) = (0u64, 0u64, 0u64);
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut nanos = [[0u64; OPS]; ROUTES];
        let add = |to: &mut u64, c: &AtomicU64| *to = to.wrapping_add(get(c));
        self.blocks.each(|b| {
            add(&mut ended_bytes, &b.ended_bytes);
            out.retries
                .iter_mut()
                .zip(&b.retries)
                .for_each(|(t, c)| add(t, c));
            for (r, by_route) in b.buckets.iter().enumerate() {
                for (o, by_op) in by_route.iter().enumerate() {
                    add(&mut out.moved[r][o], &b.moved[r][o]);
                    add(&mut nanos[r][o], &b.nanos[r][o]);
                    for (res, buckets) in by_op.iter().enumerate() {
                        for (k, c) in buckets.iter().enumerate() {
                            add(&mut out.buckets[r][o][k], c);
                            add(&mut out.ended[o][res], c);
                        }
                    }
                }
            }
        });
        self.blocks.each(|b| {
            add(&mut submitted, &b.submitted);
            add(&mut submitted_bytes, &b.submitted_bytes);
        });
        for (seconds, nanos) in out.seconds.iter_mut().zip(&nanos) {
            for (s, n) in seconds.iter_mut().zip(nanos) {
                *s = *n as f64 / 1e9;
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
        out.inflight = submitted.saturating_sub(ended);
        out.inflight_bytes = submitted_bytes.saturating_sub(ended_bytes);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
                submitted: crate::clock::now_nanos(),
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
        crate::clock::now_nanos();
        std::thread::sleep(Duration::from_millis(1));
        std::thread::scope(|s| {
            for t in 0..12 {
                let stats = &stats;
                s.spawn(move || {
                    stats.submitted(1000, 10_000);
                    for _ in 0..999 {
                        stats.ended(End {
                            route: t % ROUTES,
                            op: t % OPS,
                            result: t % RESULTS,
                            requested: 10,
                            moved: 4,
                            submitted: crate::clock::now_nanos() - 15_000,
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
        let at_least_15us: u64 = snap
            .buckets
            .iter()
            .flatten()
            .map(|b| b[1..].iter().sum::<u64>())
            .sum();
        assert_eq!(
            at_least_15us,
            12 * 999,
            "one duration each, none under 15 us"
        );
        let secs: f64 = snap.seconds.iter().flatten().sum();
        assert!(secs >= 12.0 * 999.0 * 15e-6, "{secs}");
    }
}
