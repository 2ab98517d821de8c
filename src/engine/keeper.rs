//! The keeper: a background thread that, in store mode, checks every few
//! seconds that the engine's own entries are still in the store and
//! republishes them after the store lost them (a restart without
//! persistence), that refreshes cached peer descriptors every
//! `MC_TE_METADATA_REFRESH_INTERVAL_SECONDS` when that is set, and that
//! logs the tasks waiting longer than `MC_TE_STALL_REPORT_SEC`
//! ([`super::stall`]).

use super::Engine;
use super::ticker::Ticker;
use std::sync::Weak;
use std::time::{Duration, Instant};
use tracing::warn;

/// How often the own entries are checked in store mode.
const CHECK_INTERVAL: Duration = Duration::from_secs(3);
/// How often waiting tasks are looked at: half the stall bound, within
/// these.
const STALL_TICK_MIN: Duration = Duration::from_millis(100);
const STALL_TICK_MAX: Duration = Duration::from_secs(1);

/// The running keeper thread.
pub struct Keeper(Ticker);

impl Keeper {
    /// Starts the keeper for `engine`: checking its own entries when
    /// `check_own`, refreshing peers every `refresh` when set, reporting
    /// tasks waiting longer than `stall` when set. `None` when there is
    /// nothing to keep.
    pub fn start(
        engine: Weak<Engine>,
        check_own: bool,
        refresh: Option<Duration>,
        stall: Option<Duration>,
    ) -> Option<Keeper> {
        let tick = [
            check_own.then_some(CHECK_INTERVAL),
            refresh,
            stall.map(|s| (s / 2).clamp(STALL_TICK_MIN, STALL_TICK_MAX)),
        ]
        .into_iter()
        .flatten()
        .min()?;
        let mut last_refresh = Instant::now();
        let ticker = Ticker::start("te-keeper", engine, tick, move |engine| {
            if check_own {
                engine.ensure_published();
            }
            if refresh.is_some_and(|r| last_refresh.elapsed() >= r) {
                engine.sync_all_segments();
                last_refresh = Instant::now();
            }
            if let Some(after) = stall {
                engine.report_stalls(after);
            }
        })
        .map_err(|e| warn!("the keeper thread could not start: {e}"))
        .ok()?;
        Some(Keeper(ticker))
    }

    /// Stops the thread and joins it (unless called from it).
    pub fn stop(&self) {
        self.0.stop();
    }
}
