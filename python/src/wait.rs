//! Waiting for batches without holding the GIL: the state of a whole batch,
//! a poll loop with a deadline, and a backoff that yields the CPU first and
//! then sleeps, so many waiting Python threads leave the cores to the
//! engine's own threads.

use std::thread;
use std::time::{Duration, Instant};
use transfer_engine::Engine;
use transfer_engine::Result;
use transfer_engine::TaskStatus;

/// Where a batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchState {
    /// A task is still running.
    Waiting,
    /// A task is still running past `MC_SLICE_TIMEOUT`: the engine reports
    /// it TIMEOUT, but it is not cancelled and may still end.
    TimedOut,
    /// Every task completed.
    Completed,
    /// Every task ended and at least one failed.
    Failed,
}

/// The state of the `tasks` tasks of `batch`. Every ended task is recorded
/// as seen, so the batch can be freed once it is `Completed` or `Failed`.
pub fn batch_state(engine: &Engine, batch: u64, tasks: usize) -> Result<BatchState> {
    let (mut waiting, mut timed_out, mut failed) = (false, false, false);
    for task in 0..tasks {
        match engine.status(batch, task)?.0 {
            TaskStatus::Completed => {}
            TaskStatus::Failed => failed = true,
            TaskStatus::Timeout => timed_out = true,
            _ => waiting = true,
        }
    }
    Ok(if timed_out {
        BatchState::TimedOut
    } else if waiting {
        BatchState::Waiting
    } else if failed {
        BatchState::Failed
    } else {
        BatchState::Completed
    })
}

/// What waiting for a batch ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every task completed.
    Completed,
    /// Every task ended and one failed.
    Failed,
    /// A task is still running at the deadline, or past `MC_SLICE_TIMEOUT`.
    TimedOut,
}

/// Polls `batch` until it ends, the engine reports a task TIMEOUT, or
/// `deadline` passes (Mooncake's synchronous calls stop at either).
pub fn wait_batch(engine: &Engine, batch: u64, tasks: usize, deadline: Instant) -> Result<Outcome> {
    let backoff = Backoff::new();
    loop {
        match batch_state(engine, batch, tasks)? {
            BatchState::Completed => return Ok(Outcome::Completed),
            BatchState::Failed => return Ok(Outcome::Failed),
            BatchState::TimedOut => return Ok(Outcome::TimedOut),
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
