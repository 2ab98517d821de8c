//! Waiting for batches without holding the GIL: the state of a whole batch,
//! a poll loop with a deadline, and a backoff that yields the CPU first and
//! then sleeps, so many waiting Python threads leave the cores to the
//! engine's own threads.

use std::thread;
use std::time::{Duration, Instant};
use transfer_engine::engine::Engine;
use transfer_engine::engine::batch::TaskStatus;
use transfer_engine::error::Result;

/// Where a batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchState {
    /// A task is still running.
    Waiting,
    /// Every task completed.
    Completed,
    /// Every task is terminal and at least one failed (or timed out).
    Failed,
}

/// The state of the `tasks` tasks of `batch`. Every terminal task is
/// recorded as seen, so the batch can be freed once this is not `Waiting`.
pub fn batch_state(engine: &Engine, batch: u64, tasks: usize) -> Result<BatchState> {
    let mut waiting = false;
    let mut failed = false;
    for task in 0..tasks {
        match engine.status(batch, task)?.0 {
            TaskStatus::Completed => {}
            TaskStatus::Failed | TaskStatus::Timeout | TaskStatus::Canceled => failed = true,
            _ => waiting = true,
        }
    }
    Ok(match (waiting, failed) {
        (true, _) => BatchState::Waiting,
        (false, true) => BatchState::Failed,
        (false, false) => BatchState::Completed,
    })
}

/// What waiting for a batch ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every task completed.
    Completed,
    /// Every task ended and one failed.
    Failed,
    /// The deadline passed with a task still running.
    TimedOut,
}

/// Polls `batch` until it is no longer waiting or `deadline` passes.
pub fn wait_batch(engine: &Engine, batch: u64, tasks: usize, deadline: Instant) -> Result<Outcome> {
    let backoff = Backoff::new();
    loop {
        match batch_state(engine, batch, tasks)? {
            BatchState::Completed => return Ok(Outcome::Completed),
            BatchState::Failed => return Ok(Outcome::Failed),
            BatchState::Waiting if Instant::now() >= deadline => return Ok(Outcome::TimedOut),
            BatchState::Waiting => backoff.pause(),
        }
    }
}

/// The deadline of a synchronous transfer, as Mooncake's Python binding
/// computes it: `MC_TRANSFER_TIMEOUT` plus one nanosecond per byte.
pub fn deadline(start: Instant, timeout: Duration, bytes: u64) -> Instant {
    start + timeout + Duration::from_nanos(bytes)
}

/// How long a waiter only yields before it starts to sleep: longer than a
/// small transfer takes on a busy machine, so those are noticed at once.
const YIELD_FOR: Duration = Duration::from_millis(1);
/// The longest sleep between two polls.
const LONGEST_NAP: Duration = Duration::from_millis(1);

/// Yields the CPU for the first [`YIELD_FOR`], then sleeps an eighth of the
/// time waited so far (at most [`LONGEST_NAP`]): a long
/// transfer is noticed at most about 12% after it ends, and threads waiting
/// on long transfers leave the cores to the engine's threads.
pub struct Backoff {
    start: Instant,
}

impl Backoff {
    /// A backoff starting now.
    pub fn new() -> Backoff {
        Backoff {
            start: Instant::now(),
        }
    }

    /// Waits a little before the next poll.
    pub fn pause(&self) {
        let waited = self.start.elapsed();
        if waited < YIELD_FOR {
            thread::yield_now();
        } else {
            thread::sleep((waited / 8).min(LONGEST_NAP));
        }
    }
}
