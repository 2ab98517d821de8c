//! The engine's clock for task times: nanoseconds since a process-wide
//! origin, as a task stores its submission time in one atomic word and
//! its statistics measure its duration from it.

use once_cell::sync::Lazy;
use std::time::Instant;

/// The origin of task submission times.
pub(crate) static EPOCH: Lazy<Instant> = Lazy::new(Instant::now);

/// Nanoseconds since [`EPOCH`].
pub(crate) fn now_nanos() -> u64 {
    u64::try_from(EPOCH.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
