//! Rail health, device health and device load.
//!
//! A rail is a (local device, remote device) pair. Its [`RailCell`] counts
//! its errors in a sliding window and pauses it, as Mooncake's worker pool
//! does: 5 errors within 5 s, or one hard failure, pause the rail for
//! `MC_RDMA_RAIL_PAUSE_SECONDS`. Afterwards one probe (a connect) tests
//! the rail; it carries slices again once the probe succeeds.
//! [`RailHealth`] hands out one cell per rail key; a route resolves its
//! rails' cells once, so a slice touches only atomics: the cell's
//! "open" flag and its in-flight bytes (a mutex is taken only on an error,
//! a pause ending or a probe).
//!
//! A local device whose slices keep failing, [`DEVICE_FAILURES_TO_PAUSE`]
//! in a row with no success between (Mooncake's context failure count),
//! leaves selection the same way and comes back through a probe of one of
//! its rails. Failures count once per round: the slices in flight when
//! one failure is counted (an endpoint torn down fails them all at once)
//! do not count again; a slice posted after it does. [`DeviceLoad`] keeps a device's in-flight bytes and an EWMA
//! of its bandwidth for `getNicLoadStats`, in counters the slice path
//! updates without a lock (the average is folded when it is read).

use crate::stripe::{Padded, STRIPES, stripe};
use crate::sync;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::warn;

/// Errors within [`ERROR_WINDOW`] that pause a rail.
pub const ERRORS_TO_PAUSE: usize = 5;
/// The window in which errors count.
pub const ERROR_WINDOW: Duration = Duration::from_secs(5);
/// Failed slices in a row, with no success between, that take a local
/// device out of selection (Mooncake's `kContextFailureThreshold`).
pub const DEVICE_FAILURES_TO_PAUSE: u32 = 32;

#[derive(Default)]
struct GateState {
    errors: VecDeque<Instant>,
    paused_until: Option<Instant>,
    /// The pause ended but no probe has succeeded since: one probe at a
    /// time tests the rail before it carries slices again.
    probation: bool,
    probing: bool,
}

/// Whether a rail (or device) may carry a slice now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailUse {
    /// Healthy: any number of slices.
    Open,
    /// Back from a pause and untested: one probe may test it, after
    /// [`Gate::claim_probe`].
    Probe,
    /// Paused, or its probe is still out.
    Closed,
}

/// The pause and probation of one rail or device: an atomic "open" flag
/// read on every slice, and the state behind it, locked only while it is
/// not open or an error is recorded.
pub struct Gate {
    name: String,
    pause: Duration,
    /// Neither paused nor on probation.
    open: AtomicBool,
    /// Pauses so far.
    pauses: AtomicU64,
    state: Mutex<GateState>,
}

impl Gate {
    fn new(name: String, pause: Duration) -> Gate {
        Gate {
            name,
            pause,
            open: AtomicBool::new(true),
            pauses: AtomicU64::new(0),
            state: Mutex::new(GateState::default()),
        }
    }

    /// Whether it may carry slices now.
    pub fn state(&self) -> RailUse {
        if self.open.load(Ordering::Acquire) {
            return RailUse::Open;
        }
        self.state_at(Instant::now())
    }

    fn state_at(&self, now: Instant) -> RailUse {
        let mut state = sync::lock(&self.state);
        if let Some(t) = state.paused_until {
            if now < t {
                return RailUse::Closed;
            }
            state.paused_until = None;
            state.errors.clear();
            state.probation = true;
            state.probing = false;
        }
        match (state.probation, state.probing) {
            (false, _) => RailUse::Open,
            (true, false) => RailUse::Probe,
            (true, true) => RailUse::Closed,
        }
    }

    /// Takes the probe of a gate on probation; false if another slice
    /// already took it.
    pub fn claim_probe(&self) -> bool {
        let mut s = sync::lock(&self.state);
        if s.probation && !s.probing && s.paused_until.is_none() {
            s.probing = true;
            true
        } else {
            false
        }
    }

    /// Records a slice or probe that succeeded: ends probation.
    pub fn record_success(&self) {
        if self.open.load(Ordering::Acquire) {
            return;
        }
        let mut s = sync::lock(&self.state);
        if s.paused_until.is_some() {
            // A slice posted before the pause finished well: the pause
            // stands until its probe.
            return;
        }
        if s.probation {
            tracing::info!("{} is healthy again", self.name);
        }
        s.probation = false;
        s.probing = false;
        self.open.store(true, Ordering::Release);
    }

    /// Pauses at once (the caller holds the state), saying why.
    fn pause_locked(&self, s: &mut GateState, now: Instant, why: &str) {
        warn!("{} paused for {:?} after {why}", self.name, self.pause);
        s.paused_until = Some(now + self.pause);
        s.errors.clear();
        s.probation = false;
        s.probing = false;
        self.pauses.fetch_add(1, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }

    /// Records an error: `hard` ones, and any while on probation, pause at
    /// once; others when `window` of them fall within [`ERROR_WINDOW`].
    fn record_error_at(&self, hard: bool, window: Option<usize>, now: Instant) {
        let mut s = sync::lock(&self.state);
        if s.paused_until.is_some_and(|t| now < t) {
            return;
        }
        while s
            .errors
            .front()
            .is_some_and(|&t| now.duration_since(t) >= ERROR_WINDOW)
        {
            s.errors.pop_front();
        }
        s.errors.push_back(now);
        let why = if hard {
            "a hard failure".to_string()
        } else if s.probation {
            "a failed probe".to_string()
        } else if window.is_some_and(|n| s.errors.len() >= n) {
            format!("{} errors", s.errors.len())
        } else {
            return;
        };
        self.pause_locked(&mut s, now, &why);
    }
}

/// One rail's health and in-flight bytes, shared by every route that uses
/// the rail. The bytes are striped like a device's counters: every thread
/// posting or completing slices updates a cache line of its own.
pub struct RailCell {
    /// Bytes posted on the rail and not finished, by stripe.
    load: [Counter; STRIPES],
    gate: Gate,
}

/// One stripe of a rail's in-flight bytes (it alone may wrap; the sum
/// over the stripes does not).
type Counter = Padded<AtomicU64>;

impl RailCell {
    /// Whether the rail may carry slices now.
    pub fn state(&self) -> RailUse {
        self.gate.state()
    }

    /// Takes the rail's probe; see [`Gate::claim_probe`].
    pub fn claim_probe(&self) -> bool {
        self.gate.claim_probe()
    }

    /// Records a slice or probe that succeeded on the rail.
    pub fn record_success(&self) {
        self.gate.record_success()
    }

    /// Records an error on the rail; a `hard` one, or any on a rail on
    /// probation, pauses it at once, else [`ERRORS_TO_PAUSE`] within
    /// [`ERROR_WINDOW`] do.
    pub fn record_error(&self, hard: bool) {
        self.gate
            .record_error_at(hard, Some(ERRORS_TO_PAUSE), Instant::now())
    }

    /// Bytes in flight on the rail.
    pub fn load(&self) -> u64 {
        self.load
            .iter()
            .fold(0u64, |sum, c| sum.wrapping_add(c.0.load(Ordering::Relaxed)))
    }

    /// Counts `bytes` posted on the rail.
    pub fn start(&self, bytes: u64) {
        self.load[stripe()].0.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts `bytes` that finished on the rail.
    pub fn finish(&self, bytes: u64) {
        self.load[stripe()].0.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The cells of every rail, keyed by a rail name; a refetched descriptor's
/// new route finds its rails' cells (their pauses and loads) here.
pub struct RailHealth {
    pause: Duration,
    rails: Mutex<HashMap<String, Arc<RailCell>>>,
}

impl RailHealth {
    /// Rails pause for `pause` once they fail.
    pub fn new(pause: Duration) -> RailHealth {
        RailHealth {
            pause,
            rails: Mutex::new(HashMap::new()),
        }
    }

    /// The cell of rail `key`, made on first use.
    pub fn cell(&self, key: &str) -> Arc<RailCell> {
        let mut rails = sync::lock(&self.rails);
        if let Some(c) = rails.get(key) {
            return c.clone();
        }
        let c = Arc::new(RailCell {
            load: Default::default(),
            gate: Gate::new(format!("rail {key}"), self.pause),
        });
        rails.insert(key.to_string(), c.clone());
        c
    }
}

/// One stripe of a device's byte counters. Its `inflight` alone may wrap
/// (a slice may start on one thread and finish on another); the sum over
/// the stripes does not.
#[derive(Default)]
#[repr(align(64))]
struct Stripe {
    inflight: AtomicU64,
    /// Bytes moved successfully, ever.
    moved: AtomicU64,
}

/// In-flight bytes, bandwidth and health of one local device.
pub struct DeviceLoad {
    /// Device name.
    pub name: String,
    stripes: [Stripe; STRIPES],
    /// Failed slices since the last success.
    failures: AtomicU32,
    /// Counted failures so far: a slice posted under an older value failed
    /// with those already counted.
    round: AtomicU64,
    gate: Gate,
    ewma: Mutex<Ewma>,
}

struct Ewma {
    bps: f64,
    /// `moved` when it was last folded.
    folded: u64,
    since: Instant,
}

/// Shortest interval folded into the bandwidth average.
const EWMA_INTERVAL: Duration = Duration::from_millis(100);
/// Weight of the newest interval.
const EWMA_ALPHA: f64 = 0.3;

impl DeviceLoad {
    /// A device with no load; it leaves selection for `pause` once its
    /// slices keep failing.
    pub fn new(name: String, pause: Duration) -> DeviceLoad {
        DeviceLoad {
            gate: Gate::new(format!("device {name}"), pause),
            name,
            stripes: Default::default(),
            failures: AtomicU32::new(0),
            round: AtomicU64::new(0),
            ewma: Mutex::new(Ewma {
                bps: 0.0,
                folded: 0,
                since: Instant::now(),
            }),
        }
    }

    /// Bytes posted on the device.
    pub fn start(&self, bytes: u64) {
        self.stripe().inflight.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes that finished (`moved` of them successfully).
    pub fn finish(&self, bytes: u64, moved: u64) {
        let s = self.stripe();
        s.inflight.fetch_sub(bytes, Ordering::Relaxed);
        if moved > 0 {
            s.moved.fetch_add(moved, Ordering::Relaxed);
        }
    }

    fn stripe(&self) -> &Stripe {
        &self.stripes[stripe()]
    }

    /// The sum of a counter over the stripes.
    fn total(&self, counter: impl Fn(&Stripe) -> &AtomicU64) -> u64 {
        self.stripes.iter().fold(0u64, |sum, s| {
            sum.wrapping_add(counter(s).load(Ordering::Relaxed))
        })
    }

    /// Whether the device may carry slices now.
    pub fn state(&self) -> RailUse {
        self.gate.state()
    }

    /// Takes the device's probe; see [`Gate::claim_probe`].
    pub fn claim_probe(&self) -> bool {
        self.gate.claim_probe()
    }

    /// A slice (or probe) succeeded on the device.
    pub fn record_success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        self.gate.record_success();
    }

    /// The failure round a slice posted now belongs to (see
    /// [`record_failure`](Self::record_failure)).
    pub fn round(&self) -> u64 {
        self.round.load(Ordering::Relaxed)
    }

    /// A slice (or probe) posted in `round` failed on one of the device's
    /// rails: unless a failure of that round was counted already, the
    /// [`DEVICE_FAILURES_TO_PAUSE`]th in a row, or a failed probe, takes
    /// the device out of selection.
    pub fn record_failure(&self, round: u64) {
        self.record_failure_at(round, Instant::now())
    }

    fn record_failure_at(&self, round: u64, now: Instant) {
        if self
            .round
            .compare_exchange(round, round + 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let mut s = sync::lock(&self.gate.state);
        if s.paused_until.is_some_and(|t| now < t) {
            return;
        }
        let why = if s.probation {
            "a failed probe".to_string()
        } else if n >= DEVICE_FAILURES_TO_PAUSE {
            format!("{n} failed slices in a row on its rails")
        } else {
            return;
        };
        self.failures.store(0, Ordering::Relaxed);
        self.gate.pause_locked(&mut s, now, &why);
    }

    /// Bytes in flight now.
    pub fn inflight(&self) -> u64 {
        self.total(|s| &s.inflight)
    }

    /// Bytes moved successfully, ever.
    pub fn moved(&self) -> u64 {
        self.total(|s| &s.moved)
    }

    /// Times the device left selection (paused after failing slices or
    /// a failed probe).
    pub fn pauses(&self) -> u64 {
        self.gate.pauses.load(Ordering::Relaxed)
    }

    /// Bandwidth average in bytes per second (decays while idle): the
    /// bytes moved since the last fold, spread evenly over the intervals
    /// that passed, each folded with weight [`EWMA_ALPHA`].
    pub fn ewma_bps(&self) -> f64 {
        let mut e = sync::lock(&self.ewma);
        let now = Instant::now();
        let dt = now.duration_since(e.since);
        if dt >= EWMA_INTERVAL {
            let moved = self.total(|s| &s.moved);
            let sample = moved.wrapping_sub(e.folded) as f64 / dt.as_secs_f64();
            let intervals = (dt.as_secs_f64() / EWMA_INTERVAL.as_secs_f64()).floor();
            let keep = (1.0 - EWMA_ALPHA).powf(intervals);
            e.bps = sample + keep * (e.bps - sample);
            e.folded = moved;
            e.since = now;
        }
        e.bps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rail(pause: u64) -> RailCell {
        RailCell {
            load: Default::default(),
            gate: Gate::new("rail r".into(), Duration::from_secs(pause)),
        }
    }

    fn error_at(r: &RailCell, hard: bool, at: Instant) {
        r.gate.record_error_at(hard, Some(ERRORS_TO_PAUSE), at)
    }

    fn open(r: &RailCell, at: Instant) -> bool {
        r.gate.state_at(at) != RailUse::Closed
    }

    /// A rail pausing for `pause` seconds that had four soft errors, one
    /// per millisecond from the returned instant (one short of a pause).
    fn rail_with_four_errors(pause: u64) -> (RailCell, Instant) {
        let (r, t) = (rail(pause), Instant::now());
        for i in 0..4 {
            error_at(&r, false, t + Duration::from_millis(i));
        }
        (r, t)
    }

    #[test]
    fn unknown_rail_is_available() {
        let h = RailHealth::new(Duration::from_secs(30));
        assert_eq!(h.cell("10.0.0.1@mlx5_0").state(), RailUse::Open);
    }

    #[test]
    fn a_rail_back_from_a_pause_is_probed_once() {
        let r = rail(2);
        let t = Instant::now();
        error_at(&r, true, t);
        assert_eq!(r.gate.state_at(t + Duration::from_secs(3)), RailUse::Probe);
        assert!(r.claim_probe());
        assert!(!r.claim_probe(), "one probe at a time");
        assert_eq!(r.gate.state_at(t + Duration::from_secs(3)), RailUse::Closed);
        r.record_success();
        assert_eq!(r.gate.state_at(t + Duration::from_secs(3)), RailUse::Open);
        assert_eq!(r.state(), RailUse::Open, "the fast path sees it open");
        // A failed probe pauses again at once.
        let t2 = t + Duration::from_secs(4);
        error_at(&r, false, t2);
        for i in 1..4 {
            error_at(&r, false, t2 + Duration::from_millis(i));
        }
        assert_eq!(
            r.gate.state_at(t2 + Duration::from_millis(10)),
            RailUse::Open
        );
        error_at(&r, false, t2 + Duration::from_millis(20));
        let back = t2 + Duration::from_secs(3);
        assert_eq!(r.gate.state_at(back), RailUse::Probe);
        assert!(r.claim_probe());
        error_at(&r, false, back);
        assert_eq!(
            r.gate.state_at(back + Duration::from_millis(1)),
            RailUse::Closed
        );
        assert_eq!(
            r.gate.state_at(back + Duration::from_secs(3)),
            RailUse::Probe
        );
    }

    #[test]
    fn four_errors_do_not_pause_five_do() {
        let (r, t) = rail_with_four_errors(30);
        assert!(open(&r, t + Duration::from_millis(10)));
        assert_eq!(r.state(), RailUse::Open);
        error_at(&r, false, t + Duration::from_millis(20));
        assert!(!open(&r, t + Duration::from_millis(30)));
        assert!(!open(&r, t + Duration::from_secs(29)));
        assert!(open(&r, t + Duration::from_secs(31)), "the pause ends");
        assert!(open(&r, t + Duration::from_secs(32)));
    }

    #[test]
    fn hard_failure_pauses_at_once() {
        let r = rail(2);
        let t = Instant::now();
        error_at(&r, true, t);
        assert!(!open(&r, t + Duration::from_secs(1)));
        assert!(open(&r, t + Duration::from_secs(3)));
    }

    #[test]
    fn old_errors_leave_the_window() {
        let (r, t) = rail_with_four_errors(30);
        error_at(&r, false, t + Duration::from_secs(6));
        assert!(open(&r, t + Duration::from_secs(6)));
    }

    #[test]
    fn pausing_one_rail_leaves_others() {
        let h = RailHealth::new(Duration::from_secs(30));
        h.cell("10.0.0.1@mlx5_bond_0").record_error(true);
        assert_eq!(h.cell("10.0.0.1@mlx5_bond_0").state(), RailUse::Closed);
        assert_eq!(h.cell("10.0.0.1@mlx5_bond_1").state(), RailUse::Open);
        assert!(Arc::ptr_eq(
            &h.cell("10.0.0.1@mlx5_bond_0"),
            &h.cell("10.0.0.1@mlx5_bond_0")
        ));
    }

    #[test]
    fn device_load_counts_and_averages() {
        let d = DeviceLoad::new("eth0".into(), Duration::from_secs(30));
        d.start(100);
        d.start(50);
        assert_eq!(d.inflight(), 150);
        d.finish(100, 100);
        assert_eq!(d.inflight(), 50);
        std::thread::sleep(EWMA_INTERVAL + Duration::from_millis(10));
        d.finish(50, 50);
        assert!(d.ewma_bps() > 0.0);
        assert_eq!(d.inflight(), 0);
        assert_eq!(d.moved(), 150);
    }

    #[test]
    fn a_device_failing_in_a_row_leaves_selection_until_its_probe() {
        let d = DeviceLoad::new("mlx5_0".into(), Duration::from_secs(2));
        let t = Instant::now();
        // A success between failures restarts the count.
        for _ in 0..DEVICE_FAILURES_TO_PAUSE - 1 {
            d.record_failure_at(d.round(), t);
        }
        d.record_success();
        let stale = d.round();
        for _ in 0..DEVICE_FAILURES_TO_PAUSE - 1 {
            d.record_failure_at(d.round(), t);
        }
        // Slices in flight since an earlier failure do not count again.
        for _ in 0..100 {
            d.record_failure_at(stale, t);
        }
        assert_eq!(d.state(), RailUse::Open);
        assert_eq!(d.pauses(), 0);
        d.record_failure_at(d.round(), t);
        assert_eq!(d.gate.state_at(t + Duration::from_secs(1)), RailUse::Closed);
        assert_eq!(d.pauses(), 1);
        // Back from the pause: one probe; a failed probe pauses it again.
        let back = t + Duration::from_secs(3);
        assert_eq!(d.gate.state_at(back), RailUse::Probe);
        assert!(d.claim_probe() && !d.claim_probe());
        d.record_failure_at(d.round(), back);
        assert_eq!(d.gate.state_at(back), RailUse::Closed);
        let again = back + Duration::from_secs(3);
        assert_eq!(d.gate.state_at(again), RailUse::Probe);
        assert!(d.claim_probe());
        d.record_success();
        assert_eq!(d.state(), RailUse::Open);
    }
}
