//! What a data connection gets done: the bytes its peer has taken, as
//! seen at each sweep of the I/O thread ([`Traffic`]): bytes received from
//! the peer, and bytes sent that the peer has acknowledged. Bytes still in
//! our queues or in the kernel's send queue do not count, so a peer that
//! lets the kernel absorb a few MiB and then drains a KiB now and then is
//! seen as what it is.
//!
//! Two rules read it. A request in progress must have its peer take at
//! least `MC_TCP_MIN_RATE_BYTES_PER_SEC` averaged over each
//! `MC_TCP_MIN_RATE_WINDOW_SEC`, or its connection is reset
//! ([`Progress::sweep`]): on the data port, a request part of which was
//! received, or whose reply is not yet handed to the kernel; on a client
//! lane, a request of its pipeline not yet answered in full. Time with
//! nothing in progress, and time in which the I/O thread itself was held
//! up, is not counted; nor is a window by whose end every request in
//! progress at its start has finished (a peer that answers everything
//! asked is not slow, however little was asked). And at the connection
//! bound, the session whose peer took the fewest bytes per second over the
//! last two to four seconds gives way ([`Progress::rate`]).

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// The recent rate covers the current and the previous window of this
/// length.
const RATE_WINDOW: Duration = Duration::from_secs(2);
/// The shortest span a rate is counted over: what a connection takes in
/// its first moments (a receive buffer's worth) is not a rate.
const MIN_SPAN: Duration = Duration::from_secs(1);

/// The least a request in progress must get done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinRate {
    /// Bytes per second its peer must take at least (0: no minimum).
    pub bytes_per_sec: u64,
    /// The window the rate is averaged over.
    pub window: Duration,
}

impl MinRate {
    /// Whether there is no minimum.
    pub fn off(&self) -> bool {
        self.bytes_per_sec == 0
    }
}

/// A window in which the peer of a request in progress took too little.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slow {
    /// Bytes the peer took in the window.
    pub bytes: u64,
    /// The window's length.
    pub over: Duration,
    /// The minimum it fell short of.
    pub rule: MinRate,
}

impl std::fmt::Display for Slow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its peer took {} bytes in {:?}, less than MC_TCP_MIN_RATE_BYTES_PER_SEC={} (averaged over MC_TCP_MIN_RATE_WINDOW_SEC={})",
            self.bytes,
            self.over,
            self.rule.bytes_per_sec,
            self.rule.window.as_secs()
        )
    }
}

/// The bytes one connection has moved, in all.
#[derive(Debug, Default)]
pub struct Traffic {
    received: u64,
    sent: u64,
    /// Of `sent`, the bytes the peer had acknowledged when last asked.
    acked: u64,
}

impl Traffic {
    /// Records bytes received from the peer.
    pub fn add_received(&mut self, n: usize) {
        self.received += n as u64;
    }

    /// Records bytes handed to the kernel for the peer.
    pub fn add_sent(&mut self, n: usize) {
        self.sent += n as u64;
    }

    /// Bytes the peer has taken: received from it, and sent to it and
    /// acknowledged (the kernel of `fd` is asked how much of what was sent
    /// it still holds).
    pub fn taken(&mut self, fd: RawFd) -> u64 {
        if self.acked < self.sent {
            if let Ok(queued) = super::wire::unacknowledged(fd) {
                let acked = self.sent.saturating_sub(queued as u64);
                self.acked = self.acked.max(acked);
            }
        }
        self.received + self.acked
    }
}

/// Requests of a connection that finish in order: how many have, and how
/// many will have once those in progress now have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requests {
    /// Requests finished in all.
    pub finished: u64,
    /// `finished` once every request in progress now has finished.
    pub due: u64,
}

/// A connection as a sweep of its I/O thread finds it.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// Bytes its peer has taken in all ([`Traffic::taken`]).
    pub taken: u64,
    /// Its requests, where it counts them: a window by whose end every
    /// request in progress at its start has finished is not slow.
    pub requests: Option<Requests>,
    /// Whether a request is in progress now.
    pub in_progress: bool,
    /// Whether none was at some moment since the last sweep: that ends the
    /// window of the request in progress.
    pub broke: bool,
    /// Whether the thread serving the connection was held up since the
    /// last sweep: the time lost was not the peer's, and the window of the
    /// request in progress starts again.
    pub held_up: bool,
}

/// Where the window of the request in progress started.
#[derive(Debug, Clone, Copy)]
struct Stretch {
    since: Instant,
    /// Bytes taken in all then.
    taken: u64,
    /// Requests finished in all once those in progress then have.
    due: Option<u64>,
}

/// The bytes a connection's peer has taken, over time.
#[derive(Debug)]
pub struct Progress {
    /// Bytes taken in all, at the last observation.
    taken: u64,
    /// The connection's requests, at the last observation.
    requests: Option<Requests>,
    /// Start of the current rate window, and `taken` then.
    window: (Instant, u64),
    /// Start of the previous rate window, and `taken` then.
    prev: (Instant, u64),
    /// The window of the request in progress; `None` with no request in
    /// progress.
    stretch: Option<Stretch>,
}

/// `bytes` per `over`, in bytes per second.
fn per_second(bytes: u64, over: Duration) -> u64 {
    let rate = u128::from(bytes) * 1_000_000_000 / over.as_nanos().max(1);
    u64::try_from(rate).unwrap_or(u64::MAX)
}

impl Progress {
    /// A connection opened at `now`.
    pub fn new(now: Instant) -> Progress {
        Progress {
            taken: 0,
            requests: None,
            window: (now, 0),
            prev: (now, 0),
            stretch: None,
        }
    }

    /// Records the bytes taken in all between sweeps.
    pub fn took(&mut self, taken: u64) {
        self.taken = self.taken.max(taken);
    }

    /// Records what a sweep found at `now` and judges the request in
    /// progress once its window has lasted `rule.window`, then starts the
    /// next: `Err` if its peer took fewer than `rule.bytes_per_sec` bytes
    /// per second of it and did not finish every request in progress at
    /// its start (never with no minimum).
    pub fn sweep(&mut self, now: Instant, seen: Seen, rule: MinRate) -> Result<(), Slow> {
        self.observe(now, &seen);
        if seen.held_up {
            self.stretch = self.stretch.map(|_| self.mark(now));
        }
        self.judge(now, rule)
    }

    fn observe(&mut self, now: Instant, seen: &Seen) {
        self.took(seen.taken);
        self.requests = seen.requests;
        if now.saturating_duration_since(self.window.0) >= RATE_WINDOW {
            self.prev = self.window;
            self.window = (now, self.taken);
        }
        if !seen.in_progress || seen.broke {
            self.stretch = None;
        }
        if seen.in_progress && self.stretch.is_none() {
            self.stretch = Some(self.mark(now));
        }
    }

    /// A window of the request in progress starting at `now`.
    fn mark(&self, now: Instant) -> Stretch {
        Stretch {
            since: now,
            taken: self.taken,
            due: self.requests.map(|r| r.due),
        }
    }

    fn judge(&mut self, now: Instant, rule: MinRate) -> Result<(), Slow> {
        let Some(start) = self.stretch else {
            return Ok(());
        };
        let over = now.saturating_duration_since(start.since);
        if over < rule.window {
            return Ok(());
        }
        self.stretch = Some(self.mark(now));
        let bytes = self.taken - start.taken;
        let finished = self.requests.map_or(0, |r| r.finished);
        let answered = start.due.is_some_and(|due| finished >= due);
        if answered
            || u128::from(bytes) * 1_000_000_000 >= u128::from(rule.bytes_per_sec) * over.as_nanos()
        {
            Ok(())
        } else {
            Err(Slow { bytes, over, rule })
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

    const S: Duration = Duration::from_millis(100);
    const RULE: MinRate = MinRate {
        bytes_per_sec: 65536,
        window: Duration::from_secs(10),
    };
    const W: Duration = RULE.window;

    /// A sweep of a connection with a request in progress.
    fn busy(taken: u64) -> Seen {
        Seen {
            taken,
            requests: None,
            in_progress: true,
            broke: false,
            held_up: false,
        }
    }

    /// Sweeps from `from` for `len`, the peer taking `per_sweep` bytes
    /// each time; returns the first verdict against.
    fn run(
        p: &mut Progress,
        from: Instant,
        len: Duration,
        taken: &mut u64,
        per_sweep: u64,
        rule: MinRate,
    ) -> Option<(Duration, Slow)> {
        let mut t = from;
        while t < from + len {
            t += S;
            *taken += per_sweep;
            if let Err(s) = p.sweep(t, busy(*taken), rule) {
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
        let (after, slow) = run(&mut p, t0, 3 * W, &mut taken, 102, RULE).expect("dropped");
        assert!(after >= W && after <= W + 2 * S, "judged after {after:?}");
        assert!(slow.bytes < 65536 * 10 && slow.over >= W);
        assert!(
            slow.to_string()
                .contains("MC_TCP_MIN_RATE_BYTES_PER_SEC=65536")
        );
    }

    #[test]
    fn a_request_at_the_minimum_rate_passes_every_window() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        let mut taken = 0;
        assert_eq!(run(&mut p, t0, 5 * W, &mut taken, 6554, RULE), None);
        let off = MinRate {
            bytes_per_sec: 0,
            ..RULE
        };
        assert_eq!(
            run(&mut p, t0, 5 * W, &mut taken, 10, off),
            None,
            "0 is off"
        );
    }

    #[test]
    fn idle_time_between_requests_does_not_count() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        let mut t = t0;
        // Short requests with pauses: each break starts a new window.
        for _ in 0..300 {
            t += S;
            let seen = Seen {
                broke: true,
                ..busy(0)
            };
            assert_eq!(p.sweep(t, seen, RULE), Ok(()));
        }
        // Idle connections are never judged.
        let idle = Seen {
            in_progress: false,
            ..busy(0)
        };
        assert_eq!(p.sweep(t + 3 * W, idle, RULE), Ok(()));
        assert_eq!(p.sweep(t + 5 * W, idle, RULE), Ok(()));
    }

    #[test]
    fn a_stall_of_the_thread_is_forgiven() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        assert_eq!(p.sweep(t0, busy(0), RULE), Ok(()));
        let late = t0 + 2 * W;
        let held_up = Seen {
            held_up: true,
            ..busy(100)
        };
        assert_eq!(p.sweep(late, held_up, RULE), Ok(()));
        assert!(p.sweep(late + W, busy(100), RULE).is_err());
    }

    #[test]
    fn a_window_that_finishes_what_was_asked_at_its_start_is_not_slow() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        // Small requests, two always in flight, each answered within the
        // window: a few bytes a second, never slow.
        let mut t = t0;
        let mut finished = 0;
        for i in 0..(5 * W.as_millis() / S.as_millis()) as u64 {
            t += S;
            if i % 4 == 0 {
                finished += 1;
            }
            let seen = Seen {
                requests: Some(Requests {
                    finished,
                    due: finished + 2,
                }),
                ..busy(finished * 100)
            };
            assert_eq!(p.sweep(t, seen, RULE), Ok(()), "at {:?}", t - t0);
        }
        // The peer stops answering: the requests in flight at the start of
        // the next window are still there at its end.
        let stuck = Seen {
            requests: Some(Requests {
                finished,
                due: finished + 2,
            }),
            ..busy(finished * 100)
        };
        let mut verdict = Ok(());
        for _ in 0..(2 * W.as_millis() / S.as_millis()) {
            t += S;
            verdict = p.sweep(t, stuck, RULE);
            if verdict.is_err() {
                break;
            }
        }
        assert!(verdict.is_err(), "a peer that answers nothing passed");
    }

    #[test]
    fn rate_is_recent_and_spans_at_least_a_second() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        // A burst in the first 100 ms counts over a second.
        assert_eq!(p.sweep(t0 + S, busy(1 << 20), RULE), Ok(()));
        assert_eq!(p.rate(t0 + S), 1 << 20);
        // Then nothing: the burst leaves the window after two rolls.
        let mut t = t0 + S;
        for _ in 0..50 {
            t += S;
            let _ = p.sweep(t, busy(1 << 20), RULE);
        }
        assert_eq!(p.rate(t), 0);
        // A steady 1.25 MiB/s shows as that.
        let mut taken = 1 << 20;
        for _ in 0..50 {
            t += S;
            taken += 128 << 10;
            let _ = p.sweep(t, busy(taken), RULE);
        }
        let r = p.rate(t);
        assert!((1200 << 10..=1300 << 10).contains(&r), "rate {r}");
    }
}
