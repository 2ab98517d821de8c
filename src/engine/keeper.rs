//! The metadata keeper: a background thread that, in store mode, checks
//! every few seconds that the engine's own entries are still in the store
//! and republishes them after the store lost them (a restart without
//! persistence), and that refreshes cached peer descriptors every
//! `MC_TE_METADATA_REFRESH_INTERVAL_SECONDS` when that is set.

use super::Engine;
use super::ticker::Ticker;
use std::sync::Weak;
use std::time::{Duration, Instant};
use tracing::warn;

/// How often the own entries are checked in store mode.
const CHECK_INTERVAL: Duration = Duration::from_secs(3);

/// The running keeper thread.
pub struct Keeper(Ticker);

impl Keeper {
    /// Starts the keeper for `engine`: checking its own entries when
    /// `check_own`, refreshing peers every `refresh` when set. `None` when
    /// there is nothing to keep.
    pub fn start(
        engine: Weak<Engine>,
        check_own: bool,
        refresh: Option<Duration>,
    ) -> Option<Keeper> {
        if !check_own && refresh.is_none() {
            return None;
        }
        let tick = match (check_own, refresh) {
            (true, Some(r)) => r.min(CHECK_INTERVAL),
            (true, None) => CHECK_INTERVAL,
            (false, Some(r)) => r,
            (false, None) => return None,
        };
        let mut last_refresh = Instant::now();
        let ticker = Ticker::start("te-metadata-keeper", engine, tick, move |engine| {
            if check_own {
                engine.ensure_published();
            }
            if refresh.is_some_and(|r| last_refresh.elapsed() >= r) {
                engine.sync_all_segments();
                last_refresh = Instant::now();
            }
        })
        .map_err(|e| warn!("metadata keeper could not start: {e}"))
        .ok()?;
        Some(Keeper(ticker))
    }

    /// Stops the thread and joins it (unless called from it).
    pub fn stop(&self) {
        self.0.stop();
    }
}
