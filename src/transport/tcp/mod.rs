//! The TCP transport: Mooncake's wire protocol (v1 and acknowledged v2),
//! a server that validates every request before touching memory, and on
//! the client side one endpoint per rail (local device, peer device): a set
//! of persistent pipelined lanes, kept in a per-device pool with SIEVE or
//! FIFO eviction and retired in two phases.

mod lane;
mod server;
pub mod wire;

pub use lane::{LaneTarget, LaneTimeouts, connect_target};
pub use server::request_allowed;

use super::endpoint::{Endpoint, EndpointStore, Retiring};
use super::{Outcome, Slice};
use crate::config::Config;
use crate::engine::memory::MemoryRegistry;
use crate::error::{Error, Result};
use lane::Lane;
use server::TcpServer;
use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{info, warn};

/// Longest wait of a rail probe's connect.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How often retired endpoints are checked for their last slice.
const REAP_INTERVAL: Duration = Duration::from_secs(1);

/// The lanes of one rail.
pub struct TcpEndpoint {
    lanes: Vec<Lane>,
    failed: Arc<AtomicBool>,
}

impl TcpEndpoint {
    fn least_loaded(&self) -> &Lane {
        let mut best = &self.lanes[0];
        for l in &self.lanes[1..] {
            if l.load() < best.load() {
                best = l;
            }
        }
        best
    }
}

impl Endpoint for TcpEndpoint {
    fn quiescent(&self) -> bool {
        self.lanes.iter().all(|l| l.load() == 0)
    }

    fn close(&self) {
        for l in &self.lanes {
            l.shutdown();
        }
    }
}

type Pool = EndpointStore<LaneTarget, TcpEndpoint>;

struct Pools {
    /// One pool per local device (`None`: the unbound default rail).
    by_device: HashMap<Option<String>, Pool>,
    retiring: Retiring<TcpEndpoint>,
    closed: bool,
}

struct Shared {
    pools: Mutex<Pools>,
    wake: Condvar,
}

/// A running TCP transport.
pub struct TcpTransport {
    server: TcpServer,
    shared: Arc<Shared>,
    reaper: Mutex<Option<JoinHandle<()>>>,
    probes: Mutex<Vec<JoinHandle<()>>>,
    config: Config,
    timeouts: LaneTimeouts,
}

impl TcpTransport {
    /// Starts the data server on `listener` over the buffers of `memory`.
    pub fn start(
        listener: TcpListener,
        memory: Arc<RwLock<MemoryRegistry>>,
        cfg: &Config,
    ) -> Result<TcpTransport> {
        let stall = Duration::from_secs(cfg.tcp_status_timeout_secs);
        let server = TcpServer::start(listener, memory, stall)
            .map_err(|e| Error::Socket(format!("tcp data server could not start: {e}")))?;
        let shared = Arc::new(Shared {
            pools: Mutex::new(Pools {
                by_device: HashMap::new(),
                retiring: Retiring::default(),
                closed: false,
            }),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let reaper = std::thread::Builder::new()
            .name("te-tcp-reaper".into())
            .spawn(move || reap_loop(&s))
            .map_err(|e| Error::Socket(format!("tcp reaper thread could not start: {e}")))?;
        info!(port = server.port(), "tcp transport listening");
        Ok(TcpTransport {
            server,
            shared,
            reaper: Mutex::new(Some(reaper)),
            probes: Mutex::new(Vec::new()),
            config: cfg.clone(),
            timeouts: LaneTimeouts {
                connect: Duration::from_secs(cfg.handshake_connect_timeout_secs),
                stall,
            },
        })
    }

    /// The data port peers connect to.
    pub fn data_port(&self) -> u16 {
        self.server.port()
    }

    /// The endpoint of a rail: pooled, or created (evicting by policy).
    fn endpoint(&self, device: Option<&str>, target: &LaneTarget) -> Option<Arc<TcpEndpoint>> {
        let mut pools = self.shared.pools.lock().unwrap_or_else(|e| e.into_inner());
        if pools.closed {
            return None;
        }
        let key = device.map(str::to_string);
        let pool = pools.by_device.entry(key).or_insert_with(|| {
            EndpointStore::new(self.config.max_ep_per_ctx, self.config.endpoint_store_type)
        });
        let mut retire = Vec::new();
        if let Some(ep) = pool.get(target) {
            if !ep.failed.load(Ordering::Acquire) {
                return Some(ep);
            }
            retire.extend(pool.remove(target));
        }
        let failed = Arc::new(AtomicBool::new(false));
        let mut lanes = Vec::with_capacity(self.config.tcp_lanes_per_peer);
        for i in 0..self.config.tcp_lanes_per_peer {
            match Lane::start(
                target.clone(),
                self.timeouts,
                format!("te-tcp-lane-{i}"),
                failed.clone(),
            ) {
                Ok(l) => lanes.push(l),
                Err(e) => warn!(
                    "tcp: could not start lane {i} to {}:{}: {e}",
                    target.host, target.port
                ),
            }
        }
        if lanes.is_empty() {
            pools.retiring.retire(retire);
            return None;
        }
        let ep = Arc::new(TcpEndpoint { lanes, failed });
        retire.extend(pool.insert(target.clone(), ep.clone()));
        // The reaper closes them once quiescent (never under this lock:
        // closing joins lane threads that may be re-sending a slice).
        pools.retiring.retire(retire);
        Some(ep)
    }

    /// Sends one slice over the rail from local `device` (`None`: unbound)
    /// to `target`, on the endpoint's least-loaded lane.
    pub fn post(&self, device: Option<&str>, target: &LaneTarget, slice: Slice) {
        match self.endpoint(device, target) {
            Some(ep) => ep.least_loaded().send(slice),
            None => slice.finish(Outcome::Failed { hard: true }),
        }
    }

    /// Tests in the background whether `target` accepts a connection now
    /// (within a second), and reports it; no data moves.
    pub fn probe(&self, target: &LaneTarget, done: Box<dyn FnOnce(bool) + Send>) {
        let target = target.clone();
        let timeout = self.timeouts.connect.min(PROBE_TIMEOUT);
        let mut probes = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        probes.retain(|t| !t.is_finished());
        let spawned = std::thread::Builder::new()
            .name("te-tcp-probe".into())
            .spawn(move || done(connect_target(&target, timeout).is_ok()));
        match spawned {
            Ok(t) => probes.push(t),
            Err(e) => warn!("tcp: could not start a rail probe: {e}"),
        }
    }

    /// Fails queued work, closes every connection and joins every thread.
    pub fn shutdown(&self) {
        let endpoints = {
            let mut pools = self.shared.pools.lock().unwrap_or_else(|e| e.into_inner());
            pools.closed = true;
            let mut all: Vec<Arc<TcpEndpoint>> = Vec::new();
            for pool in pools.by_device.values_mut() {
                all.extend(pool.drain());
            }
            pools.retiring.retire(all);
            std::mem::take(&mut pools.retiring)
        };
        self.shared.wake.notify_all();
        if let Some(t) = self.reaper.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
        let mut endpoints = endpoints;
        endpoints.close_all();
        let probes = std::mem::take(&mut *self.probes.lock().unwrap_or_else(|e| e.into_inner()));
        for t in probes {
            let _ = t.join();
        }
        self.server.shutdown();
    }
}

/// Closes retired endpoints once their last slice is done, about once a
/// second, until the transport shuts down.
fn reap_loop(shared: &Shared) {
    let mut pools = shared.pools.lock().unwrap_or_else(|e| e.into_inner());
    while !pools.closed {
        let (guard, _) = shared
            .wake
            .wait_timeout(pools, REAP_INTERVAL)
            .unwrap_or_else(|e| e.into_inner());
        pools = guard;
        if !pools.retiring.is_empty() {
            // Close outside the lock: closing joins lane threads whose last
            // slices may need the pool to be re-sent elsewhere.
            let mut batch = std::mem::take(&mut pools.retiring);
            drop(pools);
            let still = batch.reclaim();
            pools = shared.pools.lock().unwrap_or_else(|e| e.into_inner());
            if still > 0 {
                pools.retiring.retire_from(&mut batch);
            }
        }
    }
}
