//! A background thread of the engine that wakes every interval and runs
//! one step with the engine, until it is stopped or the engine is gone
//! (the metadata keeper, the metrics reporter).

use super::Engine;
use crate::sync;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// A running periodic thread.
pub(super) struct Ticker {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Ticker {
    /// Starts thread `name`: every `interval` it runs `step` with `engine`
    /// while the engine lives and the ticker is not stopped.
    pub(super) fn start(
        name: &str,
        engine: Weak<Engine>,
        interval: Duration,
        mut step: impl FnMut(&Engine) + Send + 'static,
    ) -> std::io::Result<Ticker> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                loop {
                    {
                        let (flag, cv) = &*s;
                        let guard = sync::lock(flag);
                        let (guard, _) = cv
                            .wait_timeout_while(guard, interval, |stopped| !*stopped)
                            .unwrap_or_else(|e| e.into_inner());
                        if *guard {
                            return;
                        }
                    }
                    let Some(engine) = engine.upgrade() else {
                        return;
                    };
                    step(&engine);
                }
            })?;
        Ok(Ticker {
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops the thread and joins it (unless called from it).
    pub(super) fn stop(&self) {
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
