//! The deadline of Mooncake's synchronous calls. Waiting itself (the
//! state of a whole batch, and a wait with a deadline that polls for the
//! first millisecond and then parks until a task ends, so many waiting
//! Python threads leave the cores to the engine's own threads) is the
//! engine's ([`transfer_engine::Engine::wait_tasks`]), shared with C
//! callers' `te_wait_batch`.

use std::time::{Duration, Instant};

/// The deadline of a synchronous transfer, as Mooncake's Python binding
/// computes it: `MC_TRANSFER_TIMEOUT` plus one nanosecond per byte.
pub fn deadline(start: Instant, timeout: Duration, bytes: u64) -> Instant {
    start + timeout + Duration::from_nanos(bytes)
}
