//! `MC_TE_METRIC`: the engine's periodic statistics line, as Mooncake's
//! metrics reporter writes it. The bytes of completed tasks and their
//! latencies (from submission to the first status call that saw them
//! completed, once per task, as Mooncake counts them) are added up, and a
//! thread owned by the engine logs, every `MC_TE_METRIC_INTERVAL_SECONDS`,
//! the throughput over the interval, the latency distribution, and each
//! device's bandwidth average and bytes in flight (`getNicLoadStats`). An
//! interval without completed tasks logs nothing. The thread stops when
//! the engine is destroyed.

use super::Engine;
use super::ticker::Ticker;
use crate::sync;
use crate::task_stats::{BUCKETS_US, bucket_of};
use crate::transport::NicLoad;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;
use tracing::{info, warn};

/// Counters of completed tasks, and the reporter thread.
#[derive(Default)]
pub(super) struct Metrics {
    bytes: AtomicU64,
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
    reporter: Mutex<Option<Ticker>>,
}

/// What one interval saw.
struct Interval {
    bytes: u64,
    counts: [u64; BUCKETS_US.len() + 1],
}

impl Metrics {
    /// Counts one completed task of `bytes` that took `latency`.
    pub(super) fn record(&self, bytes: u64, latency: Duration) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// Takes what was counted since the last call.
    fn take(&self) -> Interval {
        let mut counts = [0; BUCKETS_US.len() + 1];
        for (c, b) in counts.iter_mut().zip(&self.buckets) {
            *c = b.swap(0, Ordering::Relaxed);
        }
        Interval {
            bytes: self.bytes.swap(0, Ordering::Relaxed),
            counts,
        }
    }

    /// Starts the reporter of `engine`, one line every `interval`.
    pub(super) fn start(&self, engine: Weak<Engine>, interval: Duration) {
        let spawned = Ticker::start("te-metrics", engine, interval, move |engine| {
            let taken = engine.metrics.take();
            if let Some(line) = report(interval, &taken, &engine.nic_loads()) {
                info!(engine = %engine.local_name, "{line}");
            }
        });
        match spawned {
            Ok(t) => {
                info!(
                    "metrics reporting started (MC_TE_METRIC; every {}s)",
                    interval.as_secs()
                );
                *sync::lock(&self.reporter) = Some(t);
            }
            Err(e) => warn!("MC_TE_METRIC: the metrics thread could not start: {e}"),
        }
    }

    /// Stops the reporter and joins it (unless called from it).
    pub(super) fn stop(&self) {
        if let Some(t) = sync::lock(&self.reporter).take() {
            t.stop();
        }
    }
}

/// The line of one interval, in Mooncake's words, with the devices'
/// loads appended; `None` when no task completed in it.
fn report(interval: Duration, taken: &Interval, nics: &[NicLoad]) -> Option<String> {
    const MB: f64 = 1024.0 * 1024.0;
    let total: u64 = taken.counts.iter().sum();
    if total == 0 && taken.bytes == 0 {
        return None;
    }
    let secs = interval.as_secs_f64().max(f64::MIN_POSITIVE);
    let mut line = format!(
        "[Metrics] Transfer Engine Stats (over last {}s):",
        interval.as_secs()
    );
    if taken.bytes > 0 {
        let _ = write!(
            line,
            " Throughput: {:.2} MB/s",
            taken.bytes as f64 / secs / MB
        );
    }
    if total > 0 {
        let _ = write!(line, " | Latency Distribution (count={total}): ");
        let mut first = true;
        for (i, &n) in taken.counts.iter().enumerate() {
            let pct = n as f64 * 100.0 / total as f64;
            if n == 0 || pct < 0.1 {
                continue;
            }
            if !first {
                line.push_str(", ");
            }
            first = false;
            match BUCKETS_US.get(i) {
                Some(hi) => {
                    let lo = if i == 0 { 0 } else { BUCKETS_US[i - 1] };
                    let _ = write!(line, "{lo}-{hi}μs:{pct:.1}%");
                }
                None => {
                    let _ = write!(line, ">{}μs:{pct:.1}%", BUCKETS_US[BUCKETS_US.len() - 1]);
                }
            }
        }
    }
    if !nics.is_empty() {
        line.push_str(" | NICs:");
        for (i, n) in nics.iter().enumerate() {
            let _ = write!(
                line,
                "{} {} {:.2} MB/s avg, {} B in flight",
                if i == 0 { "" } else { "," },
                n.device,
                n.ewma_bandwidth_bps / MB,
                n.inflight_bytes
            );
        }
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_mooncake() {
        let m = Metrics::default();
        assert!(report(Duration::from_secs(5), &m.take(), &[]).is_none());
        m.record(10 << 20, Duration::from_micros(15));
        m.record(0, Duration::from_micros(300));
        m.record(0, Duration::from_micros(250));
        m.record(0, Duration::from_secs(11));
        let nics = [NicLoad {
            device: "mlx5_0".into(),
            inflight_bytes: 4096,
            ewma_bandwidth_bps: 2.0 * 1024.0 * 1024.0,
            moved_bytes: 0,
            pauses: 0,
        }];
        let line = report(Duration::from_secs(5), &m.take(), &nics).unwrap();
        assert_eq!(
            line,
            "[Metrics] Transfer Engine Stats (over last 5s): Throughput: 2.00 MB/s | Latency \
             Distribution (count=4): 10-20μs:25.0%, 200-500μs:50.0%, >10000000μs:25.0% | NICs: \
             mlx5_0 2.00 MB/s avg, 4096 B in flight"
        );
        // Taking empties the counters.
        assert!(report(Duration::from_secs(5), &m.take(), &nics).is_none());
    }
}
