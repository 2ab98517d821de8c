//! The stall report: a task still waiting `MC_TE_STALL_REPORT_SEC` after
//! its submission is logged once, by the keeper thread, naming its peer,
//! the transport carrying data to it, its outstanding slices, and what the
//! transports say those wait for (`Transport::describe_waits`: rails with
//! bytes in flight or paused, a shared-memory target copying, a full
//! ring). At most [`MOST_PER_LOOK`] tasks are logged one by one per look;
//! the rest are counted in one more line.

use super::{Engine, LOCAL_SEGMENT_ID};
use crate::batch::Stalled;
use std::time::Duration;
use tracing::warn;

/// Stalled tasks logged one by one per look; beyond, one line counts them.
const MOST_PER_LOOK: usize = 16;

impl Engine {
    /// Logs the tasks of every batch that have waited `after` since their
    /// submission and were not logged yet.
    pub(super) fn report_stalls(&self, after: Duration) {
        let mut logged = 0;
        let mut more = 0;
        for (id, batch) in self.batches.entries() {
            for s in batch.stalled(after) {
                if logged == MOST_PER_LOOK {
                    more += 1;
                    continue;
                }
                logged += 1;
                warn!(
                    "task {} of batch {id:#x} has waited {:.1}s (MC_TE_STALL_REPORT_SEC={}): {}",
                    s.task,
                    s.waited.as_secs_f64(),
                    after.as_secs(),
                    self.stall_context(&s)
                );
            }
        }
        if more > 0 {
            warn!(
                "{more} more task(s) have waited over {}s (MC_TE_STALL_REPORT_SEC)",
                after.as_secs()
            );
        }
    }

    /// What a stalled task waits for: its peer, transport, outstanding
    /// slices and the transports' account of them.
    fn stall_context(&self, s: &Stalled) -> String {
        let outstanding = format!(
            "{} of {} slice(s) outstanding",
            s.slices.saturating_sub(s.ended),
            s.slices
        );
        if s.target == LOCAL_SEGMENT_ID {
            return format!(
                "a copy within this engine, {outstanding} (the copy threads are busy, or a \
                 GPU copy is stuck in the driver)"
            );
        }
        let Some(seg) = self.segments.get(s.target) else {
            return format!("to segment id {} (closed since), {outstanding}", s.target);
        };
        if s.slices == 0 {
            return format!(
                "to segment {:?}, waiting for its descriptor to be fetched",
                seg.name
            );
        }
        let carrier = self.segment_transport(s.target).unwrap_or("no transport");
        let waits: Vec<String> = self
            .transports()
            .iter()
            .filter_map(|t| {
                t.describe_waits(&seg)
                    .map(|w| format!("{}: {w}", t.kind().protocol))
            })
            .collect();
        format!(
            "to segment {:?} over {carrier}, {outstanding}; {}",
            seg.name,
            if waits.is_empty() {
                "no transport holds a slice of it in flight".to_string()
            } else {
                waits.join("; ")
            }
        )
    }
}
