//! Waiting for a batch: the state of all its tasks at once, and a wait
//! that polls them for the first millisecond (lending a hand to the
//! engine's work as [`Engine::status`] does, once per look at the batch,
//! and yielding the CPU), then parks until a task ends, so callers
//! waiting on large transfers leave the cores to the threads that move
//! their bytes and wake as soon as those end. [`Backoff`] paces waits
//! that poll several batches, parked on one of them between polls.

use super::Engine;
use crate::batch::{Batch, TaskStatus};
use crate::error::Result;
use std::thread;
use std::time::{Duration, Instant};

/// Where the tasks of a batch stand together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchState {
    /// A task is still running.
    Waiting,
    /// A task is still running past `MC_SLICE_TIMEOUT`: the engine reports
    /// it TIMEOUT, but it is not cancelled and may still end.
    TimedOut,
    /// Every task completed.
    Completed,
    /// Every task ended and at least one failed or was cancelled.
    Failed,
}

/// What waiting for a batch ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Every task completed.
    Completed,
    /// Every task ended and one failed or was cancelled.
    Failed,
    /// A task is still running at the deadline, or past `MC_SLICE_TIMEOUT`.
    TimedOut,
}

impl Engine {
    /// The state of the first `tasks` tasks of batch `batch_id`. Every
    /// ended task is recorded as seen, so the batch can be freed once it
    /// is `Completed` or `Failed`. While one is still running, the caller
    /// lends a hand to the engine's work once, not once per task as
    /// [`Engine::status`] would.
    pub fn batch_state(&self, batch_id: u64, tasks: usize) -> Result<BatchState> {
        self.tasks_state(batch_id, &*self.batch(batch_id)?, tasks, true)
    }

    /// [`Engine::batch_state`] of `batch`, lending a hand only with `lend`.
    fn tasks_state(
        &self,
        batch_id: u64,
        batch: &Batch,
        tasks: usize,
        lend: bool,
    ) -> Result<BatchState> {
        let (mut waiting, mut timed_out, mut failed) = (false, false, false);
        for task in 0..tasks {
            match self.poll_task(batch_id, batch, task)?.0 {
                TaskStatus::Completed => {}
                TaskStatus::Failed | TaskStatus::Canceled => failed = true,
                TaskStatus::Timeout => timed_out = true,
                _ => waiting = true,
            }
        }
        if lend && (waiting || timed_out) {
            self.lend_a_hand();
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

    /// How many tasks have been submitted to batch `batch_id` so far.
    pub fn submitted_tasks(&self, batch_id: u64) -> Result<usize> {
        Ok(self.batch(batch_id)?.submitted())
    }

    /// Waits until the first `tasks` tasks of batch `batch_id` have ended,
    /// one of them reports TIMEOUT, or `deadline` passes. For the first
    /// millisecond it polls, lending a hand and yielding; then it stops
    /// helping (the transports take back what they left to helpers) and
    /// parks until one of its waiting tasks ends (the thread that ends a
    /// task wakes the callers parked on it), so it wakes when the transfer
    /// does and spends no CPU meanwhile.
    pub fn wait_tasks(
        &self,
        batch_id: u64,
        tasks: usize,
        deadline: Instant,
    ) -> Result<WaitOutcome> {
        let start = Instant::now();
        let mut parked = false;
        loop {
            let batch = self.batch(batch_id)?;
            match self.tasks_state(batch_id, &batch, tasks, !parked)? {
                BatchState::Completed => return Ok(WaitOutcome::Completed),
                BatchState::Failed => return Ok(WaitOutcome::Failed),
                BatchState::TimedOut => return Ok(WaitOutcome::TimedOut),
                BatchState::Waiting if Instant::now() >= deadline => {
                    return Ok(WaitOutcome::TimedOut);
                }
                BatchState::Waiting if !parked && start.elapsed() < YIELD_FOR => {
                    thread::yield_now()
                }
                BatchState::Waiting => {
                    if !parked {
                        // Work a transport leaves to helping callers goes
                        // back to its threads before this one sleeps.
                        parked = true;
                        self.stop_helping();
                    }
                    batch.park_on_waiting(tasks, deadline);
                }
            }
        }
    }
}

/// How long a waiter only yields before it parks or sleeps: longer than a
/// small transfer takes on a busy machine, so those are noticed at once.
const YIELD_FOR: Duration = Duration::from_millis(1);
/// The longest sleep between two polls.
const LONGEST_NAP: Duration = Duration::from_millis(1);

/// Paces a wait that polls several batches: yields the CPU for the first
/// millisecond, then naps an eighth of the time waited so far (at most
/// 1 ms) between polls, parked on a batch still running so that its end
/// wakes the caller at once. The other batches are still looked at after
/// each nap (a failure among them ends such a wait), and threads waiting
/// on long transfers leave the cores to the engine's threads.
pub struct Backoff {
    start: Instant,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// A backoff starting now.
    pub fn new() -> Backoff {
        Backoff {
            start: Instant::now(),
        }
    }

    /// Waits a little before the next poll. After the first millisecond,
    /// with `on` (a batch of `engine` and how many of its tasks are
    /// waited for, one of them still running and none past
    /// `MC_SLICE_TIMEOUT`), the caller stops helping and parks until one
    /// of those tasks ends or the nap passes; without, it sleeps the nap.
    pub fn pause(&self, engine: &Engine, on: Option<(u64, usize)>) {
        let waited = self.start.elapsed();
        if waited < YIELD_FOR {
            thread::yield_now();
            return;
        }
        let nap = (waited / 8).min(LONGEST_NAP);
        match on.and_then(|(id, tasks)| Some((engine.batch(id).ok()?, tasks))) {
            Some((batch, tasks)) => {
                // Work a transport leaves to helping callers goes back to
                // its threads, as before `Engine::wait_tasks` parks.
                engine.stop_helping();
                batch.park_on_waiting(tasks, Instant::now() + nap);
            }
            None => thread::sleep(nap),
        }
    }
}
