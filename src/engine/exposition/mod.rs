//! The engine's metrics in the Prometheus text exposition format (0.0.4):
//! [`Engine::metrics_text`], served on `MC_TE_METRICS_ADDR` by [`http`]
//! and returned by `te_metrics_text`. Every family is listed in
//! `docs/metrics.md`.
//!
//! The counters are the engine's own (the striped task statistics of
//! [`crate::task_stats`], the devices' counters of the transports, the
//! registry's buffers, the segment cache); a scrape reads them and builds
//! the families with the `prometheus` crate's data model, and its
//! `TextEncoder` writes the text (escaping, the histogram's cumulative
//! buckets, `+Inf`, `_sum` and `_count`). The hot path never sees the
//! crate: it adds to its own stripes.

mod http;

pub(super) use http::MetricsServer;

use super::Engine;
use crate::sync;
use crate::task_stats::{BUCKETS_US, LOCAL_ROUTE, OPS, ROUTES, Snapshot};
use crate::transport::registry::TRANSPORTS;
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

/// The `op` label, by op index (0 READ, 1 WRITE).
const OP_NAMES: [&str; OPS] = ["read", "write"];
/// The `result` label, by result index.
const RESULT_NAMES: [&str; 3] = ["completed", "failed", "canceled"];

/// The `transport` label of route `r`, if the table has one there.
fn route_name(r: usize) -> Option<&'static str> {
    match r {
        LOCAL_ROUTE => Some("local"),
        _ => TRANSPORTS.get(r - 1).map(|e| e.protocol),
    }
}

/// Labels from name-value pairs.
fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(n, v)| {
            let mut l = LabelPair::default();
            l.set_name(n.to_string());
            l.set_value(v.to_string());
            l
        })
        .collect()
}

/// One family and its series, built up by [`Families`].
struct Family {
    inner: MetricFamily,
    metrics: Vec<Metric>,
}

impl Family {
    fn new(name: &str, help: &str, kind: MetricType) -> Family {
        let mut inner = MetricFamily::default();
        inner.set_name(name.to_string());
        inner.set_help(help.to_string());
        inner.set_field_type(kind);
        Family {
            inner,
            metrics: Vec::new(),
        }
    }

    /// A series of a counter or gauge family.
    fn value(&mut self, pairs: &[(&str, &str)], v: f64) -> &mut Self {
        let mut m = Metric::from_label(labels(pairs));
        match self.inner.get_field_type() {
            MetricType::COUNTER => {
                let mut c = Counter::default();
                c.set_value(v);
                m.set_counter(c);
            }
            _ => {
                let mut g = Gauge::default();
                g.set_value(v);
                m.set_gauge(g);
            }
        }
        self.metrics.push(m);
        self
    }

    /// A series of a histogram family: non-cumulative `counts` per bucket
    /// of [`BUCKETS_US`] (and one beyond), their sum in seconds.
    fn histogram(&mut self, pairs: &[(&str, &str)], counts: &[u64], sum: f64) {
        let mut h = Histogram::default();
        let mut total = 0u64;
        let mut buckets = Vec::with_capacity(BUCKETS_US.len());
        for (&le, &n) in BUCKETS_US.iter().zip(counts) {
            total += n;
            let mut b = Bucket::default();
            b.set_upper_bound(le as f64 / 1e6);
            b.set_cumulative_count(total);
            buckets.push(b);
        }
        total += counts.get(BUCKETS_US.len()).copied().unwrap_or(0);
        h.set_bucket(buckets);
        h.set_sample_count(total);
        h.set_sample_sum(sum);
        let mut m = Metric::from_label(labels(pairs));
        m.set_histogram(h);
        self.metrics.push(m);
    }

    fn done(mut self) -> MetricFamily {
        self.inner.set_metric(std::mem::take(&mut self.metrics));
        self.inner
    }
}

/// The families of the task statistics.
fn task_families(snap: &Snapshot) -> Vec<MetricFamily> {
    let routes = || (0..ROUTES).filter_map(|r| route_name(r).map(|n| (r, n)));
    let mut moved = Family::new(
        "transfer_engine_transferred_bytes_total",
        "Bytes moved by tasks that ended, by the transport that ended them and op.",
        MetricType::COUNTER,
    );
    let mut durations = Family::new(
        "transfer_engine_task_duration_seconds",
        "Seconds from a task's submission to its end, by transport and op.",
        MetricType::HISTOGRAM,
    );
    let mut retries = Family::new(
        "transfer_engine_slice_retries_total",
        "Slices posted again after a failure (another rail, the same one, or the peer's \
         refetched descriptor), by transport.",
        MetricType::COUNTER,
    );
    for (r, name) in routes() {
        for (o, op) in OP_NAMES.iter().enumerate() {
            let pairs = [("transport", name), ("op", op)];
            moved.value(&pairs, snap.moved[r][o] as f64);
            durations.histogram(&pairs, &snap.buckets[r][o], snap.seconds[r][o]);
        }
        retries.value(&[("transport", name)], snap.retries[r] as f64);
    }
    let mut tasks = Family::new(
        "transfer_engine_tasks_total",
        "Tasks that ended, by op and result.",
        MetricType::COUNTER,
    );
    for (o, op) in OP_NAMES.iter().enumerate() {
        for (res, result) in RESULT_NAMES.iter().enumerate() {
            tasks.value(&[("op", op), ("result", result)], snap.ended[o][res] as f64);
        }
    }
    let mut inflight = Family::new(
        "transfer_engine_inflight_tasks",
        "Tasks submitted and not ended.",
        MetricType::GAUGE,
    );
    inflight.value(&[], snap.inflight as f64);
    let mut inflight_bytes = Family::new(
        "transfer_engine_inflight_bytes",
        "Bytes requested by the tasks submitted and not ended.",
        MetricType::GAUGE,
    );
    inflight_bytes.value(&[], snap.inflight_bytes as f64);
    let mut out = vec![
        moved.done(),
        tasks.done(),
        inflight.done(),
        inflight_bytes.done(),
        durations.done(),
        retries.done(),
    ];
    if !snap.peers.is_empty() {
        let mut bytes = Family::new(
            "transfer_engine_peer_transferred_bytes_total",
            "Bytes moved by tasks that ended, by peer (MC_TE_METRICS_PEERS of them, the \
             others as \"other\") and op.",
            MetricType::COUNTER,
        );
        let mut tasks = Family::new(
            "transfer_engine_peer_tasks_total",
            "Tasks that ended, by peer and op.",
            MetricType::COUNTER,
        );
        for (peer, by_op) in &snap.peers {
            for (o, op) in OP_NAMES.iter().enumerate() {
                let pairs = [("peer", peer.as_str()), ("op", op)];
                bytes.value(&pairs, by_op[o][0] as f64);
                tasks.value(&pairs, by_op[o][1] as f64);
            }
        }
        out.extend([bytes.done(), tasks.done()]);
    }
    out
}

impl Engine {
    /// The engine's metrics in the Prometheus text exposition format
    /// (version 0.0.4, content type `text/plain; version=0.0.4`), as
    /// `GET /metrics` on `MC_TE_METRICS_ADDR` serves them: tasks, bytes,
    /// durations, retries, registered memory, peers and devices. The
    /// families are described in `docs/metrics.md`.
    ///
    /// Every task is counted, from the engine's creation on.
    pub fn metrics_text(&self) -> String {
        let mut families = task_families(&self.stats.snapshot());
        let mut registered = Family::new(
            "transfer_engine_registered_bytes",
            "Bytes of memory registered with the engine.",
            MetricType::GAUGE,
        );
        let bytes: u64 = sync::read(&self.memory).regions().map(|r| r.length).sum();
        registered.value(&[], bytes as f64);
        families.push(registered.done());
        let mut peers = Family::new(
            "transfer_engine_peers",
            "Open segments whose route over the transport is set up (it moved, or was \
             asked to move, bytes to them).",
            MetricType::GAUGE,
        );
        for (i, e) in TRANSPORTS.iter().enumerate() {
            let n = self.segments.routed_by(i);
            peers.value(&[("transport", e.protocol)], n as f64);
        }
        families.push(peers.done());
        let mut device_bytes = Family::new(
            "transfer_engine_device_transferred_bytes_total",
            "Bytes moved by slices on each local device (NIC) of a rail-based transport.",
            MetricType::COUNTER,
        );
        let mut device_inflight = Family::new(
            "transfer_engine_device_inflight_bytes",
            "Bytes of slices posted on each local device and not finished.",
            MetricType::GAUGE,
        );
        let mut device_pauses = Family::new(
            "transfer_engine_device_pauses_total",
            "Times each local device left selection after failing slices or a failed \
             probe.",
            MetricType::COUNTER,
        );
        let mut endpoints = Family::new(
            "transfer_engine_endpoints",
            "Endpoints (connections to peer devices) the transport's pools hold.",
            MetricType::GAUGE,
        );
        let mut evictions = Family::new(
            "transfer_engine_endpoint_evictions_total",
            "Endpoints the transport's pools evicted to make room (MC_MAX_EP_PER_CTX, the \
             passive endpoint bounds).",
            MetricType::COUNTER,
        );
        for t in self.transports() {
            let protocol = t.kind().protocol;
            for n in t.nic_loads() {
                let pairs = [("transport", protocol), ("device", n.device.as_str())];
                device_bytes.value(&pairs, n.moved_bytes as f64);
                device_inflight.value(&pairs, n.inflight_bytes as f64);
                device_pauses.value(&pairs, n.pauses as f64);
            }
            if let Some(pool) = t.endpoint_pool() {
                endpoints.value(&[("transport", protocol)], pool.size as f64);
                evictions.value(&[("transport", protocol)], pool.evictions as f64);
            }
        }
        families.extend(
            [
                device_bytes,
                device_inflight,
                device_pauses,
                endpoints,
                evictions,
            ]
            .into_iter()
            .filter(|f| !f.metrics.is_empty())
            .map(Family::done),
        );
        let mut text = String::new();
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut text) {
            // Only an empty family fails, and none is encoded empty.
            tracing::warn!("the metrics could not be encoded: {e}");
        }
        text
    }
}
