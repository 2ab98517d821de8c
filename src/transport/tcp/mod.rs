//! The TCP transport: Mooncake's wire protocol (v1 and acknowledged v2), a
//! server that validates every request before touching memory and fences
//! every access against unregistration, and on the client side one
//! endpoint per rail (local device, peer device): a set of persistent
//! pipelined lanes, kept in a per-device pool with SIEVE or FIFO eviction.
//!
//! Both sides run on a fixed set of I/O threads ([`io`]); sessions and
//! lanes are state machines on non-blocking sockets. Bounds: threads
//! `MC_TCP_IO_THREADS`; data connections `MC_TCP_MAX_DATA_CONNECTIONS`
//! (and half the process's descriptor limit); idle connections close after
//! `MC_TCP_IDLE_TIMEOUT_SEC` (server) or half of it (client); a request
//! that moves no byte for `MC_TCP_STATUS_TIMEOUT_SEC` fails, and on both
//! sides so does one whose peer takes fewer than
//! `MC_TCP_MIN_RATE_BYTES_PER_SEC` over `MC_TCP_MIN_RATE_WINDOW_SEC`;
//! connections per endpoint `MC_TCP_LANES_PER_PEER`; endpoints per device
//! `MC_MAX_EP_PER_CTX`.

mod bound;
pub mod carrier;
mod io;
mod lane;
mod progress;
mod server;
mod staged;
pub mod wire;

pub use carrier::install;
pub use lane::{LaneTarget, LaneTimeouts};

use super::endpoint::EndpointStore;
use super::{Discovery, Outcome, Slice, TransportConfig, Want};

/// The protocol name of this transport, as `installTransport` and
/// descriptors (Mooncake's `tcp`) write it.
pub const PROTOCOL: &str = "tcp";

/// TCP reaches every peer: auto discovery installs it when no preferred
/// network transport could be.
pub fn auto(_: &Discovery<'_>) -> Want {
    Want::Try
}
use crate::auth::{Keys, Listener, Port};
use crate::error::{Error, Result};
use crate::memory::RemoteMemory;
use crate::sync;
use bound::Board;
use io::{Cmd, IoThreads, Probe};
use lane::{ConnectHealth, LaneShared};
use progress::MinRate;
use server::{DataAuth, ServerShared};
use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tracing::info;

use crate::settings::{Range, Words};

/// `MC_TCP_PROTO`: `1` forces v1 framing, `2` (or unset) uses v2 where
/// the peer supports it.
const TCP_PROTO: Words<bool> = Words(&[("2", false), ("1", true)]);

crate::settings::settings! {
    /// The TCP transport. Each setting (variables, Mooncake's
    /// default and bounds, meaning) is declared once in the table below.
    #[derive(Debug, Clone, PartialEq)]
    pub struct TcpConfig("tcp") {
        /// `MC_TCP_LANES_PER_PEER` (alias `MC_TCP_MAX_CONNECTIONS_PER_PEER`).
        lanes_per_peer: usize = 4,
            ["MC_TCP_LANES_PER_PEER", "MC_TCP_MAX_CONNECTIONS_PER_PEER"], Range(1usize, 16),
            "connections per endpoint (one rail to one peer); also read as \
             `MC_TCP_MAX_CONNECTIONS_PER_PEER`; connections are always pooled",
            mooncake "lanes of the pool that `MC_TCP_ENABLE_CONNECTION_POOL` turns on; by \
             default a connection per request";
        /// `MC_TCP_PROTO=1` forces the v1 framing towards every peer.
        force_v1: bool = false, ["MC_TCP_PROTO"], TCP_PROTO,
            "`1` forces Mooncake's v1 (unacknowledged) framing towards every peer; `2` uses \
             v2 where the peer supports it";
        /// `MC_TCP_STATUS_TIMEOUT_SEC`: a TCP request that moves no byte
        /// for this long fails (both sides).
        status_timeout_secs: u64 = 30, ["MC_TCP_STATUS_TIMEOUT_SEC"], Range(1u64, 3600),
            "seconds: a request that moves no byte this long fails (both sides)",
            mooncake "how long a client waits for a v2 status reply";
        /// `MC_TCP_IO_THREADS`: threads of the TCP transport, serving every
        /// connection of both sides.
        io_threads: usize = default_io_threads(), ["MC_TCP_IO_THREADS"], Range(1usize, 64),
            "threads serving every connection of both sides", shown "one per CPU, at most 4";
        /// `MC_TCP_MAX_DATA_CONNECTIONS`: data connections served at once
        /// (also at most half the descriptor limit).
        max_data_connections: usize = 4096, ["MC_TCP_MAX_DATA_CONNECTIONS"],
            Range(1usize, 1 << 20),
            "data connections served at once (and at most half the descriptor limit)";
        /// `MC_TCP_IDLE_TIMEOUT_SEC`: an idle data connection is closed after
        /// this long by the server, after half of it by the client.
        idle_timeout_secs: u64 = 300, ["MC_TCP_IDLE_TIMEOUT_SEC"], Range(2u64, 86400),
            "seconds: idle data connections are closed (clients close theirs after half of it)";
        /// `MC_TCP_MIN_RATE_BYTES_PER_SEC`: a request in progress, on the data
        /// server or a client connection, fails with its connection reset when
        /// its peer takes fewer bytes per second than this,
        /// averaged over each `MC_TCP_MIN_RATE_WINDOW_SEC` (0 = off).
        min_rate: u64 = 64 << 10, ["MC_TCP_MIN_RATE_BYTES_PER_SEC"], Range(0u64, 1 << 30),
            "a request in progress whose peer moves fewer bytes per second, averaged over \
             each window, is dropped and its connection reset; 0: off";
        /// `MC_TCP_MIN_RATE_WINDOW_SEC`: the window the minimum rate is
        /// averaged over.
        min_rate_window_secs: u64 = 10, ["MC_TCP_MIN_RATE_WINDOW_SEC"], Range(1u64, 3600),
            "seconds: that window";
    };
}

/// Default I/O threads of the TCP transport: one per CPU, at most 4.
pub(crate) fn default_io_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().min(4))
}

/// Longest wait of a rail probe's connect.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The lanes of one rail.
pub struct TcpEndpoint {
    lanes: Vec<Arc<LaneShared>>,
    health: Arc<ConnectHealth>,
}

impl TcpEndpoint {
    fn least_loaded(&self) -> &Arc<LaneShared> {
        let mut best = &self.lanes[0];
        for l in &self.lanes[1..] {
            if l.load() < best.load() {
                best = l;
            }
        }
        best
    }
}

type Pool = EndpointStore<LaneTarget, TcpEndpoint>;

struct Pools {
    /// One pool per local device (`None`: the unbound default rail).
    by_device: HashMap<Option<String>, Pool>,
    closed: bool,
}

/// A running TCP transport.
pub struct TcpTransport {
    io: IoThreads,
    port: u16,
    pools: Mutex<Pools>,
    /// Every lane made, so shutdown can fail what is left in them.
    lanes: Mutex<Vec<Weak<LaneShared>>>,
    next_thread: AtomicUsize,
    lanes_per_peer: usize,
    max_ep_per_ctx: usize,
    store_type: crate::transport::endpoint::EndpointStoreType,
    timeouts: LaneTimeouts,
    /// The cluster keys lanes authenticate with.
    auth: Option<Arc<Keys>>,
}

/// The soft limit on open descriptors of the process.
fn descriptor_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
        rl.rlim_cur
    } else {
        1024
    }
}

impl TcpTransport {
    /// Starts the data server on `listener` over the engine's registered
    /// `memory`, and the I/O threads.
    /// With `auth`, the keys, every connection authenticates: to this
    /// engine, named `names`, and from it to its peers.
    pub fn start(
        listener: TcpListener,
        memory: Arc<dyn RemoteMemory>,
        cfg: TransportConfig<'_>,
        auth: Option<&Arc<Keys>>,
        names: &[&str],
    ) -> Result<TcpTransport> {
        let port = listener
            .local_addr()
            .map_err(|e| Error::Socket(format!("tcp data listener: {e}")))?
            .port();
        let by_fds = usize::try_from(descriptor_limit() / 2).unwrap_or(usize::MAX);
        let max_sessions = cfg.tcp.max_data_connections.min(by_fds.max(16));
        if max_sessions < cfg.tcp.max_data_connections {
            info!(
                "tcp: at most {max_sessions} data connections (half the descriptor limit; MC_TCP_MAX_DATA_CONNECTIONS={})",
                cfg.tcp.max_data_connections
            );
        }
        let stall = Duration::from_secs(cfg.tcp.status_timeout_secs);
        let idle = Duration::from_secs(cfg.tcp.idle_timeout_secs);
        let min_rate = MinRate {
            bytes_per_sec: cfg.tcp.min_rate,
            window: Duration::from_secs(cfg.tcp.min_rate_window_secs),
        };
        let server = Arc::new(ServerShared {
            memory,
            open: AtomicUsize::new(0),
            max_sessions,
            idle_timeout: idle,
            stall,
            min_rate,
            board: Board::new(cfg.tcp.io_threads),
            auth: auth.map(|k| DataAuth {
                listener: Arc::new(Listener::new(k.clone(), Port::Data, names)),
                deadline: Duration::from_secs(cfg.rpc.io_timeout_secs),
            }),
        });
        let io = IoThreads::start(cfg.tcp.io_threads, listener, server)
            .map_err(|e| Error::Socket(format!("tcp I/O threads could not start: {e}")))?;
        info!(port, threads = io.count(), "tcp transport listening");
        Ok(TcpTransport {
            io,
            port,
            pools: Mutex::new(Pools {
                by_device: HashMap::new(),
                closed: false,
            }),
            lanes: Mutex::new(Vec::new()),
            next_thread: AtomicUsize::new(0),
            lanes_per_peer: cfg.tcp.lanes_per_peer,
            max_ep_per_ctx: cfg.endpoints.max_per_ctx,
            auth: auth.cloned(),
            store_type: cfg.endpoints.store_type,
            timeouts: LaneTimeouts {
                connect: Duration::from_secs(cfg.rpc.connect_timeout_secs),
                stall,
                idle: idle / 2,
                min_rate,
            },
        })
    }

    /// The data port peers connect to.
    pub fn data_port(&self) -> u16 {
        self.port
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pools> {
        sync::lock(&self.pools)
    }

    /// The endpoint of a rail: pooled, or created (evicting by policy).
    fn endpoint(&self, device: Option<&str>, target: &LaneTarget) -> Option<Arc<TcpEndpoint>> {
        let key = device.map(str::to_string);
        {
            let pools = self.lock();
            if pools.closed {
                return None;
            }
            if let Some(ep) = pools.by_device.get(&key).and_then(|p| p.get(target)) {
                return Some(ep);
            }
        }
        // Resolved outside the lock: a host name may take a while.
        let addrs = match target.resolve() {
            Ok(a) => a,
            Err(e) => {
                crate::log_limit::warn_limited!("tcp: {}:{}: {e}", target.host, target.port);
                return None;
            }
        };
        let mut pools = self.lock();
        if pools.closed {
            return None;
        }
        let (cap, policy) = (self.max_ep_per_ctx, self.store_type);
        let pool = pools
            .by_device
            .entry(key)
            .or_insert_with(|| EndpointStore::new(cap, policy));
        if let Some(ep) = pool.get(target) {
            return Some(ep);
        }
        let health = Arc::new(ConnectHealth::default());
        let first = self.next_thread.fetch_add(1, Ordering::Relaxed);
        let lanes: Vec<Arc<LaneShared>> = (0..self.lanes_per_peer)
            .map(|i| {
                Arc::new(LaneShared::new(
                    io::next_token(),
                    (first + i) % self.io.count(),
                    target.clone(),
                    addrs.clone(),
                    self.timeouts,
                    health.clone(),
                    self.auth.clone(),
                ))
            })
            .collect();
        {
            let mut all = sync::lock(&self.lanes);
            all.retain(|w| w.strong_count() > 0);
            all.extend(lanes.iter().map(Arc::downgrade));
        }
        let ep = Arc::new(TcpEndpoint { lanes, health });
        let evicted = pool.insert(target.clone(), ep.clone());
        drop(pools);
        for old in evicted {
            self.retire(&old);
        }
        Some(ep)
    }

    /// An endpoint left the pool: its lanes close once their last slice
    /// is done.
    fn retire(&self, ep: &TcpEndpoint) {
        for lane in &ep.lanes {
            lane.retire();
            self.io.send(lane.thread, Cmd::Kick(lane.clone()));
        }
    }

    /// Sends one slice over the rail from local `device` (`None`: unbound)
    /// to `target`, on the endpoint's least-loaded lane.
    pub fn post(&self, device: Option<&str>, target: &LaneTarget, slice: Slice) {
        let mut slice = slice;
        // A lane that closed between the pool lookup and the push (its
        // endpoint was evicted) sends the caller to the pool again.
        for _ in 0..3 {
            let Some(ep) = self.endpoint(device, target) else {
                break;
            };
            let lane = ep.least_loaded();
            match lane.push(slice) {
                Ok(kick) => {
                    if kick {
                        self.io.send(lane.thread, Cmd::Kick(lane.clone()));
                    }
                    return;
                }
                Err(s) => slice = s,
            }
            let mut pools = self.lock();
            let key = device.map(str::to_string);
            if let Some(pool) = pools.by_device.get_mut(&key) {
                if pool.get(target).is_some_and(|cur| Arc::ptr_eq(&cur, &ep)) {
                    pool.remove(target);
                }
            }
        }
        slice.finish(Outcome::Failed { hard: true });
    }

    /// Its endpoint pools, every device together.
    pub fn endpoint_pool(&self) -> crate::transport::EndpointPool {
        let pools = self.lock();
        pools.by_device.values().fold(Default::default(), |sum, p| {
            crate::transport::EndpointPool {
                size: sum.size + p.len() as u64,
                evictions: sum.evictions + p.evictions(),
            }
        })
    }

    /// Why the endpoint of the rail from `device` to `target` last failed
    /// to connect (or to authenticate), until a connection succeeds.
    pub fn connect_failure(&self, device: Option<&str>, target: &LaneTarget) -> Option<String> {
        let pools = self.lock();
        let ep = pools
            .by_device
            .get(&device.map(str::to_string))?
            .peek(target)?;
        ep.health.failure()
    }

    /// Tests in the background whether `target` accepts a connection now
    /// (within a second), and reports it; no data moves. A success also
    /// ends the connect cooldown of the endpoints to `target`.
    pub fn probe(self: &Arc<Self>, target: &LaneTarget, done: Box<dyn FnOnce(bool) + Send>) {
        let addr = match target.resolve() {
            Ok(a) => a[0],
            Err(_) => return done(false),
        };
        let me = Arc::downgrade(self);
        let key = target.clone();
        let done: Box<dyn FnOnce(bool) + Send> = Box::new(move |ok| {
            if let Some(me) = me.upgrade().filter(|_| ok) {
                me.connectable(&key);
            }
            done(ok)
        });
        let i = self.next_thread.fetch_add(1, Ordering::Relaxed);
        self.io.send(
            i,
            Cmd::Probe(Probe {
                target: target.clone(),
                addr,
                deadline: Instant::now() + self.timeouts.connect.min(PROBE_TIMEOUT),
                done,
            }),
        );
    }

    /// `target` accepts connections again: its endpoints may connect now.
    fn connectable(&self, target: &LaneTarget) {
        let pools = self.lock();
        for pool in pools.by_device.values() {
            if let Some(ep) = pool.get(target) {
                ep.health.succeeded();
            }
        }
    }

    /// Fails queued work, closes every connection and joins every thread:
    /// afterwards the transport touches no memory.
    pub fn shutdown(&self) {
        {
            let mut pools = self.lock();
            if pools.closed {
                return;
            }
            pools.closed = true;
            for pool in pools.by_device.values_mut() {
                pool.drain();
            }
        }
        self.io.stop();
        let lanes = std::mem::take(&mut *sync::lock(&self.lanes));
        for lane in lanes.iter().filter_map(Weak::upgrade) {
            lane.close();
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}
