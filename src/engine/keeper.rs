//! The metadata keeper: a background thread that, in store mode, checks
//! every few seconds that the engine's own entries are still in the store
//! and republishes them after the store lost them (a restart without
//! persistence), and that refreshes cached peer descriptors every
//! `MC_TE_METADATA_REFRESH_INTERVAL_SECONDS` when that is set.

use super::Engine;
use crate::sync;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::warn;

/// How often the own entries are checked in store mode.
const CHECK_INTERVAL: Duration = Duration::from_secs(3);

/// The running keeper thread.
pub struct Keeper {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

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
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("te-metadata-keeper".into())
            .spawn(move || {
                let mut last_refresh = Instant::now();
                loop {
                    {
                        let (flag, cv) = &*s;
                        let guard = sync::lock(flag);
                        let (guard, _) = cv
                            .wait_timeout_while(guard, tick, |stopped| !*stopped)
                            .unwrap_or_else(|e| e.into_inner());
                        if *guard {
                            return;
                        }
                    }
                    let Some(engine) = engine.upgrade() else {
                        return;
                    };
                    if check_own {
                        engine.ensure_published();
                    }
                    if refresh.is_some_and(|r| last_refresh.elapsed() >= r) {
                        engine.sync_all_segments();
                        last_refresh = Instant::now();
                    }
                }
            })
            .map_err(|e| warn!("metadata keeper could not start: {e}"))
            .ok()?;
        Some(Keeper {
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops the thread and joins it (unless called from it).
    pub fn stop(&self) {
        let (flag, cv) = &*self.stop;
        *sync::lock(flag) = true;
        cv.notify_all();
        if let Some(t) = sync::lock(&self.thread).take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}
