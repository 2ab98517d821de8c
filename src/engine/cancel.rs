//! Cancelling a batch: its tasks not yet ended end CANCELED, and once the
//! cancel reports them ended no byte of theirs is read or written any
//! more, on any transport (the rule FAILED tasks follow). Slices not yet
//! moving are withdrawn (from a TCP lane's queue, a shared-memory ring
//! the target has not begun to copy, an RDMA endpoint's queue, the copy
//! threads' queue); slices under way are waited for, up to a bound: a
//! TCP WRITE sent until its peer acknowledges it, a READ whose answer is
//! arriving ends at once and its bytes are dropped, a shared-memory WRITE
//! the target is copying until the piece it copies, an RDMA work request
//! until its completion.

use super::Engine;
use crate::error::Result;
use std::time::{Duration, Instant};

/// What [`Engine::cancel_batch`] came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Every task of the batch has ended, and none moves a byte any more:
    /// its memory is the caller's again, and the batch may be freed.
    Done,
    /// Some slice was still moving at the bound (a peer copying it, a
    /// WRITE not acknowledged): its task has not ended. A later cancel,
    /// or a wait for the batch, sees it end.
    Pending,
}

/// How long a cancel waits between two requests to the transports to
/// withdraw what they can (a shared-memory WRITE is withdrawn between two
/// pieces the target copies).
const AGAIN_AFTER: Duration = Duration::from_micros(200);

impl Engine {
    /// Cancels batch `batch_id`: every task submitted to it that has not
    /// ended ends CANCELED (one whose every slice had already moved when
    /// the cancel reached it ends COMPLETED, one that failed FAILED).
    /// Waits up to `timeout` for the slices under way; returns
    /// [`CancelOutcome::Done`] once every task of the batch has ended
    /// (each then counts as seen: the batch can be freed), else
    /// [`CancelOutcome::Pending`]. Other batches, peers and threads are
    /// not disturbed.
    pub fn cancel_batch(&self, batch_id: u64, timeout: Duration) -> Result<CancelOutcome> {
        let batch = self.batch(batch_id)?;
        let tasks = batch.cancel();
        let deadline = Instant::now().checked_add(timeout);
        let transports = self.transports();
        loop {
            transports.iter().for_each(|t| t.withdraw_canceled());
            if batch.ended(tasks) {
                return Ok(CancelOutcome::Done);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(CancelOutcome::Pending);
            }
            if self.lend_a_hand() {
                continue;
            }
            self.stop_helping();
            let nap = now + AGAIN_AFTER;
            batch.park_on_waiting(tasks, deadline.map_or(nap, |d| d.min(nap)));
        }
    }
}
