//! Who gives way at the data port's connection bound
//! (`MC_TCP_MAX_DATA_CONNECTIONS`): the session whose peer took the fewest
//! bytes per second lately (see [`super::progress`]), among all I/O
//! threads; of equals, the one quiet the longest. A session accepted less
//! than [`YOUNG`] ago counts as taking at least [`YOUNG_RATE`], so that a
//! new connection has the time to show what it moves before it is compared
//! with the others: older sessions slower than that give way first, and a
//! session making good progress never gives way to a new one while a
//! slower one is open.
//!
//! Each I/O thread publishes on the [`Board`] the standing of its session
//! that would give way first. The thread that accepts a connection at the
//! bound closes its own such session if none stands lower elsewhere, and
//! otherwise asks the thread that holds the lowest to close it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A session accepted this recently is young.
pub const YOUNG: Duration = Duration::from_secs(1);
/// The rate a young session counts as taking at least.
pub const YOUNG_RATE: u64 = 64 << 10;
/// The standing of no session: nothing to close.
pub const NONE: u64 = u64::MAX;

/// Bits of a standing that order sessions of equal rate by quiet time, in
/// milliseconds (up to 70 minutes).
const QUIET_BITS: u32 = 22;
const QUIET_MAX: u64 = (1 << QUIET_BITS) - 1;
/// Rates beyond this (2 TB/s) count as equal.
const RATE_MAX: u64 = (1 << 41) - 1;

/// A session's standing as one number, lowest gives way first: by the
/// bytes per second its peer took lately, then by how long it has been
/// quiet (longest first).
pub fn standing(rate: u64, quiet: Duration) -> u64 {
    let ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
    (rate.min(RATE_MAX) << QUIET_BITS) | (QUIET_MAX - ms.min(QUIET_MAX))
}

/// The rate part of a standing.
pub fn rate_of(standing: u64) -> u64 {
    standing >> QUIET_BITS
}

/// The lowest standing of each I/O thread's sessions.
pub struct Board {
    lowest: Box<[AtomicU64]>,
}

impl Board {
    /// A board for `threads` I/O threads, none with a session yet.
    pub fn new(threads: usize) -> Board {
        Board {
            lowest: (0..threads.max(1)).map(|_| AtomicU64::new(NONE)).collect(),
        }
    }

    /// Thread `me`'s lowest standing now.
    pub fn publish(&self, me: usize, standing: u64) {
        self.lowest[me].store(standing, Ordering::Relaxed);
    }

    /// The thread other than `me` whose published standing is the lowest,
    /// and that standing; `None` if no other thread has a session to
    /// close.
    pub fn lowest_other(&self, me: usize) -> Option<(usize, u64)> {
        self.lowest
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != me)
            .map(|(i, s)| (i, s.load(Ordering::Relaxed)))
            .filter(|(_, s)| *s != NONE)
            .min_by_key(|(_, s)| *s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slower_first_then_quiet_longer_first() {
        let s = |rate, ms| standing(rate, Duration::from_millis(ms));
        assert!(s(100, 0) < s(101, 60_000));
        assert!(s(100, 5_000) < s(100, 1_000));
        assert!(s(100, 2) < s(100, 1));
        assert!(s(100, 1 << 30) < s(100, 1 << 21));
        assert!(s(RATE_MAX * 4, 0) < NONE);
        assert_eq!(rate_of(s(12345, 700)), 12345);
    }

    #[test]
    fn the_lowest_other_thread() {
        let b = Board::new(3);
        assert_eq!(b.lowest_other(0), None);
        b.publish(1, 50);
        b.publish(2, 40);
        b.publish(0, 10);
        assert_eq!(b.lowest_other(0), Some((2, 40)));
        assert_eq!(b.lowest_other(2), Some((0, 10)));
        b.publish(0, NONE);
        assert_eq!(b.lowest_other(2), Some((1, 50)));
    }
}
