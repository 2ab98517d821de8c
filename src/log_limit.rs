//! Rate-limited log lines, so that a fault produces a readable log.
//!
//! A fault repeats: a dead peer fails every slice sent to it, an attacker
//! opens connections as fast as they are refused. [`warn_limited!`] logs the
//! first occurrence at a call site, then at most one line per interval,
//! each saying how many similar lines were suppressed since the last one.
//!
//! ```text
//! warn_limited!("slice to {peer} failed: {e}");
//! ```

use crate::sync;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shortest interval between two lines of one call site.
pub const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// The state of one call site: when it last logged and how many lines it
/// suppressed since.
pub struct LogLimit {
    state: Mutex<Option<(Instant, u64)>>,
}

impl Default for LogLimit {
    fn default() -> Self {
        Self::new()
    }
}

impl LogLimit {
    /// A call site that has not logged yet.
    pub const fn new() -> LogLimit {
        LogLimit {
            state: Mutex::new(None),
        }
    }

    /// Whether to log now: `Some(n)` with the number of lines suppressed
    /// since the last one, or `None` to suppress this one.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now(), LOG_INTERVAL)
    }

    fn admit_at(&self, now: Instant, interval: Duration) -> Option<u64> {
        let mut s = sync::lock(&self.state);
        match &mut *s {
            Some((last, suppressed)) if now.duration_since(*last) < interval => {
                *suppressed += 1;
                None
            }
            slot => {
                let suppressed = slot.map_or(0, |(_, n)| n);
                *slot = Some((now, 0));
                Some(suppressed)
            }
        }
    }
}

/// Logs at most one line per [`LOG_INTERVAL`] from this call site, at the
/// given `tracing` level macro; a line after suppressed ones ends with how
/// many there were.
macro_rules! log_limited {
    ($level:ident, $($arg:tt)+) => {{
        static LIMIT: $crate::log_limit::LogLimit = $crate::log_limit::LogLimit::new();
        if let Some(suppressed) = LIMIT.admit() {
            if suppressed == 0 {
                tracing::$level!($($arg)+);
            } else {
                tracing::$level!(
                    "{} ({} similar line(s) suppressed in the last {:?})",
                    format_args!($($arg)+),
                    suppressed,
                    $crate::log_limit::LOG_INTERVAL
                );
            }
        }
    }};
}

pub(crate) use log_limited;

/// [`log_limited!`] at WARN.
macro_rules! warn_limited {
    ($($arg:tt)+) => { $crate::log_limit::log_limited!(warn, $($arg)+) };
}
pub(crate) use warn_limited;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_line_passes_then_one_per_interval_with_a_count() {
        let l = LogLimit::new();
        let t = Instant::now();
        let i = Duration::from_secs(5);
        assert_eq!(l.admit_at(t, i), Some(0));
        for k in 1..=100 {
            assert_eq!(l.admit_at(t + Duration::from_millis(k), i), None);
        }
        assert_eq!(l.admit_at(t + Duration::from_secs(6), i), Some(100));
        assert_eq!(l.admit_at(t + Duration::from_secs(7), i), None);
        assert_eq!(l.admit_at(t + Duration::from_secs(12), i), Some(1));
    }

    #[test]
    fn the_macro_compiles_with_formatting() {
        for i in 0..3 {
            warn_limited!("line {i} of {}", 3);
        }
    }
}
