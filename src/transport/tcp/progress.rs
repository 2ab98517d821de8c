//! What a data-port session gets done: the bytes its peer has taken, as
//! seen at each sweep of the I/O thread: bytes received from the peer, and
//! bytes sent that the peer has acknowledged. Bytes still in our reply
//! queue or in the kernel's send queue do not count, so a reader that
//! lets the kernel absorb a few MiB of its reply and then drains a KiB now
//! and then is seen as what it is.
//!
//! Two rules read it. A request in progress (part of a request received,
//! or a reply not yet handed to the kernel, without a break between sweeps)
//! must have its peer take at least `MC_TCP_MIN_RATE_BYTES_PER_SEC`
//! averaged over each `MC_TCP_MIN_RATE_WINDOW_SEC`, or its connection is
//! reset ([`Progress::judge`]). And at the connection bound, the session
//! whose peer took the fewest bytes per second over the last two to four
//! seconds gives way ([`Progress::rate`]).

use std::time::{Duration, Instant};

/// The recent rate covers the current and the previous window of this
/// length.
const RATE_WINDOW: Duration = Duration::from_secs(2);
/// The shortest span a rate is counted over: what a connection takes in
/// its first moments (a receive buffer's worth) is not a rate.
const MIN_SPAN: Duration = Duration::from_secs(1);

/// A window in which the peer of a request in progress took too little.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slow {
    /// Bytes the peer took in the window.
    pub bytes: u64,
    /// The window's length.
    pub over: Duration,
}

/// The bytes a session's peer has taken, over time.
#[derive(Debug)]
pub struct Progress {
    /// Bytes taken in all, at the last observation.
    taken: u64,
    /// Start of the current rate window, and `taken` then.
    window: (Instant, u64),
    /// Start of the previous rate window, and `taken` then.
    prev: (Instant, u64),
    /// Start of the current window of the request in progress, and
    /// `taken` then; `None` with no request in progress.
    stretch: Option<(Instant, u64)>,
}

/// `bytes` per `over`, in bytes per second.
fn per_second(bytes: u64, over: Duration) -> u64 {
    let rate = u128::from(bytes) * 1_000_000_000 / over.as_nanos().max(1);
    u64::try_from(rate).unwrap_or(u64::MAX)
}

impl Progress {
    /// A session accepted at `now`.
    pub fn new(now: Instant) -> Progress {
        Progress {
            taken: 0,
            window: (now, 0),
            prev: (now, 0),
            stretch: None,
        }
    }

    /// Records the bytes taken in all between sweeps.
    pub fn took(&mut self, taken: u64) {
        self.taken = self.taken.max(taken);
    }

    /// Records, at a sweep, the bytes taken in all, whether a request is
    /// in progress now, and whether none was at some moment since the last
    /// sweep (`broke`): that ends the window of the request in progress.
    pub fn observe(&mut self, now: Instant, taken: u64, in_progress: bool, broke: bool) {
        self.took(taken);
        if now.saturating_duration_since(self.window.0) >= RATE_WINDOW {
            self.prev = self.window;
            self.window = (now, self.taken);
        }
        if !in_progress || broke {
            self.stretch = None;
        }
        if in_progress && self.stretch.is_none() {
            self.stretch = Some((now, self.taken));
        }
    }

    /// Starts the window of the request in progress again: the thread
    /// serving the session was held up, and the time lost was not the
    /// peer's.
    pub fn forgive(&mut self, now: Instant) {
        if let Some(s) = &mut self.stretch {
            *s = (now, self.taken);
        }
    }

    /// Judges the request in progress once its window has lasted `window`,
    /// then starts the next: `Err` if its peer took fewer than `min_rate`
    /// bytes per second of it (never with `min_rate` 0).
    pub fn judge(&mut self, now: Instant, min_rate: u64, window: Duration) -> Result<(), Slow> {
        let Some((since, at)) = self.stretch else {
            return Ok(());
        };
        let over = now.saturating_duration_since(since);
        if over < window {
            return Ok(());
        }
        self.stretch = Some((now, self.taken));
        let bytes = self.taken - at;
        if u128::from(bytes) * 1_000_000_000 < u128::from(min_rate) * over.as_nanos() {
            Err(Slow { bytes, over })
        } else {
            Ok(())
        }
    }

    /// Bytes per second taken over the current and the previous rate
    /// window (over at least a second).
    pub fn rate(&self, now: Instant) -> u64 {
        let span = now.saturating_duration_since(self.prev.0).max(MIN_SPAN);
        per_second(self.taken - self.prev.1, span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(10);
    const S: Duration = Duration::from_millis(100);

    /// Observes every sweep from `from` for `len`, the peer taking
    /// `per_sweep` bytes each; returns the first verdict against.
    fn run(
        p: &mut Progress,
        from: Instant,
        len: Duration,
        taken: &mut u64,
        per_sweep: u64,
        min_rate: u64,
    ) -> Option<(Duration, Slow)> {
        let mut t = from;
        while t < from + len {
            t += S;
            *taken += per_sweep;
            p.observe(t, *taken, true, false);
            if let Err(s) = p.judge(t, min_rate, W) {
                return Some((t - from, s));
            }
        }
        None
    }

    #[test]
    fn a_slow_request_is_judged_after_its_window() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        let mut taken = 0;
        // 1 KiB a second against 64 KiB/s.
        let (after, slow) = run(&mut p, t0, 3 * W, &mut taken, 102, 65536).expect("dropped");
        assert!(after >= W && after <= W + 2 * S, "judged after {after:?}");
        assert!(slow.bytes < 65536 * 10 && slow.over >= W);
    }

    #[test]
    fn a_request_at_the_minimum_rate_passes_every_window() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        let mut taken = 0;
        assert_eq!(run(&mut p, t0, 5 * W, &mut taken, 6554, 65536), None);
        assert_eq!(run(&mut p, t0, 5 * W, &mut taken, 10, 0), None, "0 is off");
    }

    #[test]
    fn idle_time_between_requests_does_not_count() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        let mut t = t0;
        // Short requests with pauses: each break starts a new window.
        for _ in 0..300 {
            t += S;
            p.observe(t, 0, true, true);
            assert_eq!(p.judge(t, 65536, W), Ok(()));
        }
        // Idle sessions are never judged.
        p.observe(t + 3 * W, 0, false, false);
        assert_eq!(p.judge(t + 3 * W, 65536, W), Ok(()));
    }

    #[test]
    fn a_stall_of_the_thread_is_forgiven() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        p.observe(t0, 0, true, false);
        let late = t0 + 2 * W;
        p.observe(late, 100, true, false);
        p.forgive(late);
        assert_eq!(p.judge(late, 65536, W), Ok(()));
        assert!(p.judge(late + W, 65536, W).is_err());
    }

    #[test]
    fn rate_is_recent_and_spans_at_least_a_second() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        // A burst in the first 100 ms counts over a second.
        p.observe(t0 + S, 1 << 20, true, false);
        assert_eq!(p.rate(t0 + S), 1 << 20);
        // Then nothing: the burst leaves the window after two rolls.
        let mut t = t0 + S;
        for _ in 0..50 {
            t += S;
            p.observe(t, 1 << 20, true, false);
        }
        assert_eq!(p.rate(t), 0);
        // A steady 1.25 MiB/s shows as that.
        let mut taken = 1 << 20;
        for _ in 0..50 {
            t += S;
            taken += 128 << 10;
            p.observe(t, taken, true, false);
        }
        let r = p.rate(t);
        assert!((1200 << 10..=1300 << 10).contains(&r), "rate {r}");
    }
}
