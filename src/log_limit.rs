//! Rate-limited log lines, so that a fault produces a readable log.
//!
//! A fault repeats: a dead peer fails every slice sent to it, an attacker
//! opens connections as fast as they are refused. [`warn_limited!`] logs the
//! first occurrence at a call site, then at most one line per interval,
//! each saying how many similar lines were suppressed since the last one.
//! [`LogLimits`] does the same per key, a few lines per interval each: the
//! C boundary logs every failing call through it, one key per function.
//!
//! ```text
//! warn_limited!("slice to {peer} failed: {e}");
//! ```

use crate::sync;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shortest interval between two lines of one call site, once it has
/// written its burst.
pub const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// What one call site (or one key) logged in its current interval.
#[derive(Clone, Copy)]
struct Window {
    /// When the interval began (with its first line).
    start: Instant,
    /// Lines written in it.
    logged: u32,
    /// Lines suppressed since the last one written.
    suppressed: u64,
}

/// Whether a line at `now` is written, given the state of its call site:
/// the first `burst` lines of an interval are, with the number suppressed
/// before them (`Some(n)`); the rest are counted and suppressed (`None`).
fn admit_window(slot: &mut Option<Window>, now: Instant, burst: u32) -> Option<u64> {
    match slot {
        Some(w) if now.duration_since(w.start) < LOG_INTERVAL => {
            if w.logged < burst {
                w.logged += 1;
                Some(std::mem::take(&mut w.suppressed))
            } else {
                w.suppressed += 1;
                None
            }
        }
        slot => {
            let suppressed = slot.map_or(0, |w| w.suppressed);
            *slot = Some(Window {
                start: now,
                logged: 1,
                suppressed: 0,
            });
            Some(suppressed)
        }
    }
}

/// The state of one call site: its current interval and what it
/// suppressed.
pub struct LogLimit {
    burst: u32,
    state: Mutex<Option<Window>>,
}

impl Default for LogLimit {
    fn default() -> Self {
        Self::new()
    }
}

impl LogLimit {
    /// A call site that has not logged yet and writes one line per
    /// interval.
    pub const fn new() -> LogLimit {
        LogLimit {
            burst: 1,
            state: Mutex::new(None),
        }
    }

    /// Whether to log now: `Some(n)` with the number of lines suppressed
    /// since the last one, or `None` to suppress this one.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        admit_window(&mut sync::lock(&self.state), now, self.burst)
    }
}

/// One [`LogLimit`] per key (the name of a C function, say), for a call
/// site that logs on behalf of several callers: each key writes its first
/// `burst` lines of an interval, then is counted and suppressed. The keys
/// are `'static` names from a fixed set, so the table stays small.
pub struct LogLimits {
    burst: u32,
    keys: Mutex<Vec<(&'static str, Option<Window>)>>,
}

impl LogLimits {
    /// No key has logged yet; each writes up to `burst` lines per interval.
    pub const fn with_burst(burst: u32) -> LogLimits {
        LogLimits {
            burst,
            keys: Mutex::new(Vec::new()),
        }
    }

    /// [`LogLimit::admit`] for `key`.
    pub fn admit(&self, key: &'static str) -> Option<u64> {
        self.admit_at(key, Instant::now())
    }

    fn admit_at(&self, key: &'static str, now: Instant) -> Option<u64> {
        let mut keys = sync::lock(&self.keys);
        let at = match keys.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                keys.push((key, None));
                keys.len() - 1
            }
        };
        admit_window(&mut keys[at].1, now, self.burst)
    }
}

/// The end of a line written after `0` suppressed ones: nothing, else
/// how many there were.
pub struct Suppressed(pub u64);

impl fmt::Display for Suppressed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => Ok(()),
            n => write!(f, " ({n} similar line(s) suppressed since the last one)"),
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
            tracing::$level!(
                "{}{}",
                format_args!($($arg)+),
                $crate::log_limit::Suppressed(suppressed)
            );
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
        let s = Duration::from_secs;
        assert_eq!(l.admit_at(t), Some(0));
        for k in 1..=100 {
            assert_eq!(l.admit_at(t + Duration::from_millis(k)), None);
        }
        assert_eq!(l.admit_at(t + s(6)), Some(100));
        assert_eq!(l.admit_at(t + s(7)), None);
        assert_eq!(l.admit_at(t + s(12)), Some(1));
    }

    #[test]
    fn each_key_writes_its_burst_then_counts() {
        let l = LogLimits::with_burst(3);
        let t = Instant::now();
        let ms = Duration::from_millis;
        for k in 0..3 {
            assert_eq!(l.admit_at("a", t + ms(k)), Some(0), "line {k} of the burst");
        }
        for k in 3..1000 {
            assert_eq!(l.admit_at("a", t + ms(k)), None);
        }
        // Another key has its own burst.
        assert_eq!(l.admit_at("b", t + ms(1000)), Some(0));
        // The next interval's first line carries the count, then a burst.
        let next = t + LOG_INTERVAL + ms(1);
        assert_eq!(l.admit_at("a", next), Some(997));
        assert_eq!(l.admit_at("a", next), Some(0));
        assert_eq!(l.admit_at("a", next), Some(0));
        assert_eq!(l.admit_at("a", next), None);
        // Counts survive a long quiet spell.
        assert_eq!(l.admit_at("a", next + Duration::from_secs(3600)), Some(1));
        assert_eq!(Suppressed(0).to_string(), "");
        assert_eq!(
            Suppressed(997).to_string(),
            " (997 similar line(s) suppressed since the last one)"
        );
    }

    #[test]
    fn the_macro_compiles_with_formatting() {
        for i in 0..3 {
            warn_limited!("line {i} of {}", 3);
        }
    }
}
