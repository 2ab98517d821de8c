//! Rail health and device load.
//!
//! A rail is a (local device, remote device) pair. [`RailHealth`] counts a
//! rail's errors in a sliding window and pauses it, as Mooncake's worker
//! pool does: 5 errors within 5 s, or one hard failure, pause the rail for
//! `MC_RDMA_RAIL_PAUSE_SECONDS`. Afterwards one probe (a connect) tests
//! the rail; it carries slices again once the probe succeeds.
//! [`DeviceLoad`] keeps a local device's in-flight bytes and an EWMA of its
//! bandwidth for `getNicLoadStats`.

use crate::sync;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing::warn;

/// Errors within [`ERROR_WINDOW`] that pause a rail.
pub const ERRORS_TO_PAUSE: usize = 5;
/// The window in which errors count.
pub const ERROR_WINDOW: Duration = Duration::from_secs(5);

#[derive(Default)]
struct RailState {
    errors: VecDeque<Instant>,
    paused_until: Option<Instant>,
    /// The pause ended but no probe has succeeded since: one probe at a
    /// time tests the rail before it carries slices again.
    probation: bool,
    probing: bool,
}

/// Whether a rail may carry a slice now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RailUse {
    /// Healthy: any number of slices.
    Open,
    /// Back from a pause and untested: one probe may test it, after
    /// [`RailHealth::claim_probe`].
    Probe,
    /// Paused, or its probe is still out.
    Closed,
}

/// Error windows and pauses of every rail, keyed by a rail name.
pub struct RailHealth {
    pause: Duration,
    rails: Mutex<HashMap<String, RailState>>,
}

impl RailHealth {
    /// Rails pause for `pause` once they fail.
    pub fn new(pause: Duration) -> RailHealth {
        RailHealth {
            pause,
            rails: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `rail` may carry slices now (unknown rails may).
    pub fn state(&self, rail: &str) -> RailUse {
        self.state_at(rail, Instant::now())
    }

    fn state_at(&self, rail: &str, now: Instant) -> RailUse {
        let mut rails = sync::lock(&self.rails);
        let Some(state) = rails.get_mut(rail) else {
            return RailUse::Open;
        };
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

    /// Takes the probe of a rail on probation; false if another slice
    /// already took it.
    pub fn claim_probe(&self, rail: &str) -> bool {
        let mut rails = sync::lock(&self.rails);
        match rails.get_mut(rail) {
            Some(s) if s.probation && !s.probing && s.paused_until.is_none() => {
                s.probing = true;
                true
            }
            _ => false,
        }
    }

    /// Records a slice or probe that succeeded on `rail`: ends probation.
    pub fn record_success(&self, rail: &str) {
        let mut rails = sync::lock(&self.rails);
        if let Some(s) = rails.get_mut(rail) {
            if s.probation {
                tracing::info!("rail {rail} is healthy again");
            }
            s.probation = false;
            s.probing = false;
        }
    }

    /// Records an error on `rail`; a `hard` one, or any on a rail on
    /// probation, pauses it at once.
    pub fn record_error(&self, rail: &str, hard: bool) {
        self.record_error_at(rail, hard, Instant::now());
    }

    fn record_error_at(&self, rail: &str, hard: bool, now: Instant) {
        let mut rails = sync::lock(&self.rails);
        let state = rails.entry(rail.to_string()).or_default();
        if state.paused_until.is_some_and(|t| now < t) {
            return;
        }
        while state
            .errors
            .front()
            .is_some_and(|&t| now.duration_since(t) >= ERROR_WINDOW)
        {
            state.errors.pop_front();
        }
        state.errors.push_back(now);
        let on_probation = state.probation;
        if hard || on_probation || state.errors.len() >= ERRORS_TO_PAUSE {
            warn!(
                "rail {rail} paused for {:?} after {}",
                self.pause,
                if hard {
                    "a hard failure".to_string()
                } else if on_probation {
                    "a failed probe".to_string()
                } else {
                    format!("{} errors", state.errors.len())
                }
            );
            state.paused_until = Some(now + self.pause);
            state.errors.clear();
            state.probation = false;
            state.probing = false;
        }
    }
}

/// In-flight bytes and bandwidth of one local device.
pub struct DeviceLoad {
    /// Device name.
    pub name: String,
    inflight: AtomicU64,
    ewma: Mutex<Ewma>,
}

struct Ewma {
    bps: f64,
    pending_bytes: u64,
    since: Instant,
}

/// Shortest interval folded into the bandwidth average.
const EWMA_INTERVAL: Duration = Duration::from_millis(100);
/// Weight of the newest interval.
const EWMA_ALPHA: f64 = 0.3;

impl DeviceLoad {
    /// A device with no load.
    pub fn new(name: String) -> DeviceLoad {
        DeviceLoad {
            name,
            inflight: AtomicU64::new(0),
            ewma: Mutex::new(Ewma {
                bps: 0.0,
                pending_bytes: 0,
                since: Instant::now(),
            }),
        }
    }

    /// Bytes posted on the device.
    pub fn start(&self, bytes: u64) {
        self.inflight.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes that finished (`moved` of them successfully).
    pub fn finish(&self, bytes: u64, moved: u64) {
        self.inflight.fetch_sub(bytes, Ordering::Relaxed);
        let mut e = sync::lock(&self.ewma);
        e.pending_bytes += moved;
        Self::fold(&mut e, Instant::now());
    }

    fn fold(e: &mut Ewma, now: Instant) {
        let dt = now.duration_since(e.since);
        if dt < EWMA_INTERVAL {
            return;
        }
        let sample = e.pending_bytes as f64 / dt.as_secs_f64();
        e.bps = EWMA_ALPHA * sample + (1.0 - EWMA_ALPHA) * e.bps;
        e.pending_bytes = 0;
        e.since = now;
    }

    /// Bytes in flight now.
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Bandwidth average in bytes per second (decays while idle).
    pub fn ewma_bps(&self) -> f64 {
        let mut e = sync::lock(&self.ewma);
        Self::fold(&mut e, Instant::now());
        e.bps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(h: &RailHealth, rail: &str, at: Instant) -> bool {
        h.state_at(rail, at) != RailUse::Closed
    }

    #[test]
    fn unknown_rail_is_available() {
        let h = RailHealth::new(Duration::from_secs(30));
        assert_eq!(h.state("10.0.0.1@mlx5_0"), RailUse::Open);
    }

    #[test]
    fn a_rail_back_from_a_pause_is_probed_once() {
        let h = RailHealth::new(Duration::from_secs(2));
        let t = Instant::now();
        h.record_error_at("r", true, t);
        assert_eq!(h.state_at("r", t + Duration::from_secs(3)), RailUse::Probe);
        assert!(h.claim_probe("r"));
        assert!(!h.claim_probe("r"), "one probe at a time");
        assert_eq!(h.state_at("r", t + Duration::from_secs(3)), RailUse::Closed);
        h.record_success("r");
        assert_eq!(h.state_at("r", t + Duration::from_secs(3)), RailUse::Open);
        // A failed probe pauses again at once.
        let t2 = t + Duration::from_secs(4);
        h.record_error_at("r", false, t2);
        for i in 1..4 {
            h.record_error_at("r", false, t2 + Duration::from_millis(i));
        }
        assert_eq!(
            h.state_at("r", t2 + Duration::from_millis(10)),
            RailUse::Open
        );
        h.record_error_at("r", false, t2 + Duration::from_millis(20));
        let back = t2 + Duration::from_secs(3);
        assert_eq!(h.state_at("r", back), RailUse::Probe);
        assert!(h.claim_probe("r"));
        h.record_error_at("r", false, back);
        assert_eq!(
            h.state_at("r", back + Duration::from_millis(1)),
            RailUse::Closed
        );
        assert_eq!(
            h.state_at("r", back + Duration::from_secs(3)),
            RailUse::Probe
        );
    }

    #[test]
    fn four_errors_do_not_pause_five_do() {
        let h = RailHealth::new(Duration::from_secs(30));
        let t = Instant::now();
        for i in 0..4 {
            h.record_error_at("r", false, t + Duration::from_millis(i));
        }
        assert!(open(&h, "r", t + Duration::from_millis(10)));
        h.record_error_at("r", false, t + Duration::from_millis(20));
        assert!(!open(&h, "r", t + Duration::from_millis(30)));
        assert!(!open(&h, "r", t + Duration::from_secs(29)));
        assert!(open(&h, "r", t + Duration::from_secs(31)), "the pause ends");
        assert!(open(&h, "r", t + Duration::from_secs(32)));
    }

    #[test]
    fn hard_failure_pauses_at_once() {
        let h = RailHealth::new(Duration::from_secs(2));
        let t = Instant::now();
        h.record_error_at("r", true, t);
        assert!(!open(&h, "r", t + Duration::from_secs(1)));
        assert!(open(&h, "r", t + Duration::from_secs(3)));
    }

    #[test]
    fn old_errors_leave_the_window() {
        let h = RailHealth::new(Duration::from_secs(30));
        let t = Instant::now();
        for i in 0..4 {
            h.record_error_at("r", false, t + Duration::from_millis(i));
        }
        h.record_error_at("r", false, t + Duration::from_secs(6));
        assert!(open(&h, "r", t + Duration::from_secs(6)));
    }

    #[test]
    fn pausing_one_rail_leaves_others() {
        let h = RailHealth::new(Duration::from_secs(30));
        h.record_error("10.0.0.1@mlx5_bond_0", true);
        assert!(!open(&h, "10.0.0.1@mlx5_bond_0", Instant::now()));
        assert!(open(&h, "10.0.0.1@mlx5_bond_1", Instant::now()));
    }

    #[test]
    fn device_load_counts_and_averages() {
        let d = DeviceLoad::new("eth0".into());
        d.start(100);
        d.start(50);
        assert_eq!(d.inflight(), 150);
        d.finish(100, 100);
        assert_eq!(d.inflight(), 50);
        std::thread::sleep(EWMA_INTERVAL + Duration::from_millis(10));
        d.finish(50, 50);
        assert!(d.ewma_bps() > 0.0);
        assert_eq!(d.inflight(), 0);
    }
}
