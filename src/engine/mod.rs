//! The engine: this process's registered memory, its batches, the remote
//! segments it opened, the transports it installed, and the handshake
//! listener through which peers reach it. Safe Rust only; the C boundary
//! lives in `crate::ffi`.
//!
//! * [`install`]: installing transports, registering memory with them;
//! * [`submit`]: batches, and sending each request to the best transport
//!   that reaches its target (the engine's own segment is copied here);
//! * [`publish`]: this engine's handshake address and descriptor;
//! * [`peers`]: opening, fetching and refreshing peers' segments,
//!   notifications and probes;
//! * [`control`]: what the handshake listener answers; [`keeper`]: the
//!   store kept up to date; [`metrics`]: `MC_TE_METRIC`'s lines (both on
//!   a [`ticker`] thread); [`exposition`]: the metrics in the Prometheus
//!   text format (`MC_TE_METRICS_ADDR`); background work (sending notifications,
//!   refetching descriptors) waits on peers in lanes
//!   ([`crate::peer_jobs`]), off the callers' threads;
//! * [`route`]: the transports a request to a peer goes to
//!   (`MC_TE_REQUIRE_TRANSPORT`), and which one carries a segment's data
//!   now;
//! * [`wait`]: waiting for a whole batch without spinning.

pub mod cancel;
pub mod config;
pub mod control;
mod exposition;
mod install;
pub use install::AutoChoice;
mod keeper;
mod metrics;
mod peers;
mod publish;
mod route;
mod stall;
mod submit;
mod ticker;
pub mod wait;

use crate::auth::{Keys, Listener, Port};
use crate::batch::Batch;
use crate::engine::config::{Config, ConfigError, ConfigResult};
use crate::error::{Error, Result};
use crate::handle::HandleTable;
use crate::memory::MemoryRegistry;
use crate::metadata::conn::MetadataConn;
use crate::metadata::store::MetadataStore;
use crate::peer_jobs::{Finish, Full, Lanes, Limits, Run};
use crate::rpc::{Cancel, RpcServer};
use crate::segment::SegmentCache;
use crate::sync;
use crate::topology::{PriorityMatrix, Topology};
use crate::transport::Transport;
use crate::transport::local::LocalCopier;
use control::ControlState;
use once_cell::sync::OnceCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use submit::Waiter;
use tracing::{info, warn};

/// Segment id of the engine's own memory (`LOCAL_SEGMENT`).
pub const LOCAL_SEGMENT_ID: i32 = 0;

/// Direction of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// Copy from the target segment into `source`.
    Read,
    /// Copy from `source` into the target segment.
    Write,
}

impl Opcode {
    /// Mooncake's `OPCODE_READ` (0) and `OPCODE_WRITE` (1).
    pub fn from_raw(v: i32) -> Result<Opcode> {
        match v {
            0 => Ok(Opcode::Read),
            1 => Ok(Opcode::Write),
            _ => Err(Error::InvalidArgument(format!(
                "opcode {v} is neither READ (0) nor WRITE (1)"
            ))),
        }
    }
}

/// One request of a batch.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// Direction.
    pub opcode: Opcode,
    /// Local address (read into, or written from).
    pub source: u64,
    /// Segment id from `openSegment`.
    pub target_id: i32,
    /// Absolute address in the target segment's process.
    pub target_offset: u64,
    /// Bytes to move.
    pub length: u64,
}

/// A transfer engine instance.
pub struct Engine {
    local_name: String,
    given_name: String,
    conn: MetadataConn,
    config: Config,
    store: Option<Box<dyn MetadataStore>>,
    rpc: RpcServer,
    rpc_ip: String,
    control: Arc<ControlState>,
    memory: Arc<RwLock<MemoryRegistry>>,
    segments: SegmentCache,
    batches: HandleTable<Batch>,
    local: LocalCopier,
    /// The installed transports, most preferred first.
    transports: RwLock<Vec<Arc<dyn Transport>>>,
    /// What auto discovery did with each transport.
    auto_choices: Mutex<Vec<install::AutoChoice>>,
    topology: Mutex<Option<(Topology, PriorityMatrix)>>,
    keeper: OnceCell<keeper::Keeper>,
    /// A store write of our entries failed; the keeper retries it.
    publish_pending: AtomicBool,
    /// A transport asked for the descriptor to be published again and the
    /// background job doing it has not started yet.
    republish_wanted: AtomicBool,
    /// `MC_TE_METRIC`'s counters and reporter thread.
    metrics: metrics::Metrics,
    /// What its tasks did, for [`Engine::metrics_text`]: every batch
    /// counts its tasks there.
    stats: Arc<crate::task_stats::TaskStats>,
    /// The metrics endpoint (`MC_TE_METRICS_ADDR`), while it serves.
    exposition: Mutex<Option<exposition::MetricsServer>>,
    /// Random per process: with `revision`, the descriptor's generation.
    boot_id: u64,
    revision: std::sync::atomic::AtomicU64,
    /// The loopback address this engine is confined to, if any.
    loopback: Option<IpAddr>,
    /// RDMA devices this engine may use (Mooncake's `TransferEngine`
    /// device filter; empty: all), beside `MC_TE_FILTERS`.
    device_filter: Vec<String>,
    /// Orders what changes the registered memory, the installed transport
    /// and the published descriptor: installs, registrations and shutdown
    /// run one at a time, and none starts once the engine is closed.
    changes: Mutex<()>,
    /// Notifications and descriptor refetches, run off the caller's thread.
    work: Lanes<String>,
    /// Callers waiting for a fetch of a segment's descriptor, by segment
    /// name (requests, a transport's [`crate::transport::Refresh`]): while
    /// a name has any, one background job for it is queued and has not
    /// begun; it takes them all when it begins.
    refetches: Mutex<HashMap<String, Vec<Waiter>>>,
    /// The [`crate::transport::Refresh`] handed to transports.
    refresher: OnceCell<crate::transport::Refresh>,
    /// Cancels this engine's handshake calls when it is destroyed.
    cancel: Arc<Cancel>,
    /// Peer descriptors fetched so far ([`Engine::descriptor_fetches`]).
    fetches: std::sync::atomic::AtomicU64,
    /// The cluster keys (`MC_TE_AUTH_KEY_FILE`): every connection to a
    /// peer and from a peer authenticates with them.
    auth: Option<Arc<Keys>>,
    /// The engine itself, for what its transports and background work
    /// call back.
    me: OnceCell<Weak<Engine>>,
    closed: AtomicBool,
}

/// Why background work was refused, for messages.
fn refused(why: Full) -> &'static str {
    match why {
        Full::Stopped => "the engine is being destroyed",
        Full::Bound => "too much background work is waiting (a peer does not answer)",
    }
}

/// Bounds of an engine's background work: threads, jobs waiting in all and
/// per peer, and how long an idle thread stays.
const BACKGROUND: Limits = Limits {
    threads: 8,
    queued: 65536,
    per_lane: 4096,
    idle_exit: std::time::Duration::from_secs(10),
    thread_name: "te-peer-work",
};

/// How to create an [`Engine`]: its metadata backend and name, and
/// optionally whether it installs transports by itself, which RDMA devices
/// it may use, and its configuration.
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    conn: String,
    local_name: String,
    auto_discover: bool,
    devices: Vec<String>,
    config: Option<std::result::Result<Config, ConfigError>>,
}

impl EngineBuilder {
    /// With `on`, the engine installs transports for the machine it finds,
    /// as Mooncake does (RDMA when RDMA devices exist, else TCP); without,
    /// none until [`Engine::install_transport`]. Off by default.
    pub fn auto_discover(mut self, on: bool) -> EngineBuilder {
        self.auto_discover = on;
        self
    }

    /// Restricts the RDMA devices to those named (Mooncake's device filter;
    /// empty, the default: every device). `MC_TE_FILTERS` applies too.
    pub fn devices(mut self, names: &[String]) -> EngineBuilder {
        self.devices = names.to_vec();
        self
    }

    /// The engine's configuration; by default the process environment's
    /// `MC_*` variables ([`Config::from_env`]). Takes a [`Config`] or what
    /// [`Config::from_lookup`] returns: a [`ConfigError`] there makes
    /// [`EngineBuilder::build`] fail with it.
    pub fn config(mut self, config: impl Into<ConfigResult>) -> EngineBuilder {
        self.config = Some(config.into().0);
        self
    }

    /// Creates the engine: starts its handshake listener, publishes its RPC
    /// address (store mode) and, with auto-discovery, installs transports.
    pub fn build(self) -> Result<Arc<Engine>> {
        let config = match self.config {
            Some(c) => c?,
            None => {
                let c = Config::from_env()?;
                c.warnings.iter().for_each(|w| warn!("{w}"));
                c
            }
        };
        config::unsupported::warn_once(&config.unsupported);
        Engine::start(
            &self.conn,
            &self.local_name,
            self.auto_discover,
            &self.devices,
            config,
        )
    }
}

impl Engine {
    /// The builder of an engine named `local_name` whose peers are found
    /// through `conn`: `"P2PHANDSHAKE"`, `"http://host:port/path"`,
    /// `"etcd://host:port"`, `"redis://host:port"`.
    pub fn builder(conn: &str, local_name: &str) -> EngineBuilder {
        EngineBuilder {
            conn: conn.to_string(),
            local_name: local_name.to_string(),
            auto_discover: false,
            devices: Vec::new(),
            config: None,
        }
    }

    /// An engine with the configuration of the environment: see
    /// [`Engine::builder`].
    pub fn new(conn: &str, local_name: &str, auto_discover: bool) -> Result<Arc<Engine>> {
        Self::builder(conn, local_name)
            .auto_discover(auto_discover)
            .build()
    }

    fn start(
        conn: &str,
        local_name: &str,
        auto_discover: bool,
        device_filter: &[String],
        config: Config,
    ) -> Result<Arc<Engine>> {
        crate::fd_limit::raise();
        let conn = MetadataConn::parse(conn)?;
        let local_name = local_name.trim().trim_start_matches('/').to_string();
        if local_name.is_empty() {
            return Err(Error::InvalidArgument("local server name is empty".into()));
        }
        let auth = config.auth.load()?;
        let store = peers::open_store(&conn, &config)?;
        let loopback = publish::loopback_ip(&local_name, &config);
        let binding = publish::bind_rpc(&conn, &local_name, loopback, &config)?;
        // Both ports answer to one identity: the name peers open this
        // engine by, as they bind their proofs to it.
        let names = [binding.name.as_str()];
        let boot_id = publish::boot_id();
        let control = Arc::new(ControlState::new(
            config.notify,
            publish::instance_of(boot_id),
        ));
        let rpc = RpcServer::start(
            binding.listener,
            control.clone(),
            crate::rpc::ServerOptions {
                auth: auth
                    .clone()
                    .map(|k| Arc::new(Listener::new(k, Port::Handshake, &names))),
                ..crate::rpc::ServerOptions::from_config(&config.rpc)
            },
        )
        .map_err(|e| Error::Socket(format!("handshake listener could not start: {e}")))?;
        let peer_series = config.engine.metrics_peers;
        let engine = Engine {
            given_name: local_name.clone(),
            local_name: binding.name,
            conn,
            config,
            store,
            rpc,
            rpc_ip: binding.ip,
            control,
            memory: Arc::new(RwLock::new(MemoryRegistry::default())),
            segments: SegmentCache::default(),
            batches: HandleTable::new(),
            local: LocalCopier::default(),
            transports: RwLock::default(),
            auto_choices: Mutex::default(),
            topology: Mutex::new(None),
            keeper: OnceCell::new(),
            publish_pending: AtomicBool::new(false),
            republish_wanted: AtomicBool::new(false),
            metrics: metrics::Metrics::default(),
            stats: Arc::new(crate::task_stats::TaskStats::new(peer_series)),
            exposition: Mutex::new(None),
            boot_id,
            revision: Default::default(),
            loopback,
            device_filter: device_filter.to_vec(),
            changes: Mutex::new(()),
            work: Lanes::new(BACKGROUND),
            refetches: Mutex::default(),
            refresher: OnceCell::new(),
            cancel: Arc::default(),
            fetches: Default::default(),
            auth,
            me: OnceCell::new(),
            closed: AtomicBool::new(false),
        };
        if let Err(e) = engine.publish_rpc_meta() {
            engine.discard(false);
            return Err(e);
        }
        let engine = Arc::new(engine);
        let _ = engine.me.set(Arc::downgrade(&engine));
        if let Some(addr) = engine.config.engine.metrics_addr {
            match exposition::MetricsServer::start(
                addr,
                Arc::downgrade(&engine),
                &engine.config.rpc,
            ) {
                Ok(server) => *sync::lock(&engine.exposition) = Some(server),
                Err(e) => {
                    tracing::error!("{e}");
                    engine.discard(true);
                    return Err(e);
                }
            }
        }
        let refresh = match engine.config.store.refresh_interval_secs {
            0 => None,
            s => Some(std::time::Duration::from_secs(s)),
        };
        let stall = match engine.config.engine.stall_report_secs {
            0 => None,
            s => Some(std::time::Duration::from_secs(s)),
        };
        if let Some(k) = keeper::Keeper::start(
            Arc::downgrade(&engine),
            engine.store.is_some(),
            refresh,
            stall,
        ) {
            let _ = engine.keeper.set(k);
        }
        if engine.config.engine.metric {
            engine.metrics.start(
                Arc::downgrade(&engine),
                std::time::Duration::from_secs(engine.config.engine.metric_interval_secs),
            );
        }
        if engine.config.engine.force_hca && !auto_discover && !engine.config.engine.force_tcp {
            info!(
                "MC_FORCE_HCA applies to auto-discovery only; this engine installs its \
                 transports when asked"
            );
        }
        if auto_discover || engine.config.engine.force_tcp {
            if let Err(e) = engine.auto_install() {
                engine.discard(true);
                return Err(e);
            }
        }
        if let Err(e) = engine.require_transports() {
            engine.discard(true);
            return Err(e);
        }
        info!(
            name = %engine.local_name,
            metadata = %engine.conn,
            rpc = %engine.local_ip_and_port(),
            "transfer engine created"
        );
        Ok(engine)
    }

    /// The name peers open this engine's segment by (in P2P mode
    /// `host:port` of the handshake listener).
    pub fn local_name(&self) -> &str {
        &self.local_name
    }

    /// Whether `name` is this engine: its published name, or the name it
    /// was created with (P2P mode rewrites the port; the original name
    /// still opens the local segment).
    pub fn is_own_name(&self, name: &str) -> bool {
        name == self.local_name || name == self.given_name
    }

    /// `ip:port` of the handshake listener (no brackets, as Mooncake).
    pub fn local_ip_and_port(&self) -> String {
        format!("{}:{}", self.rpc_ip, self.rpc.port())
    }

    /// The address the metrics endpoint listens on (`MC_TE_METRICS_ADDR`,
    /// with the real port when it asked for port 0); `None` when off.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        sync::lock(&self.exposition)
            .as_ref()
            .map(exposition::MetricsServer::local_addr)
    }

    /// Port of the handshake listener (Mooncake's `getRpcPort`).
    pub fn rpc_port(&self) -> u16 {
        self.rpc.port()
    }

    /// The installed transports, most preferred first.
    fn transports(&self) -> Vec<Arc<dyn Transport>> {
        sync::read(&self.transports).clone()
    }

    /// Queues `job` in the background lane of `peer`: it runs with the
    /// engine (unless the engine is destroyed first).
    fn background(
        &self,
        peer: &str,
        finish: Finish,
        job: impl FnOnce(&Engine) + Send + 'static,
    ) -> std::result::Result<(), Full> {
        let me = self.me.get().cloned().unwrap_or_default();
        let run = move |run: Run| {
            if let (Run::Now, Some(engine)) = (run, me.upgrade()) {
                job(&engine);
            }
        };
        self.work
            .submit(peer.to_string(), Box::new(run), finish)
            .map_err(|(_, why)| why)
    }

    /// Fails in-flight work, removes this engine's metadata, and stops every
    /// thread it started; idempotent.
    pub fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // An install or registration under way finishes first; none starts
        // after this.
        let _change = sync::lock(&self.changes);
        self.stop_threads();
        self.unpublish(false);
        self.batches.drain();
        info!(name = %self.local_name, "transfer engine destroyed");
    }

    /// Tears down an engine whose creation failed, without the logs of a
    /// destroyed engine (the caller never had it; the failure is reported
    /// once, by the caller): its threads stop, and what it `published` to
    /// the store is removed.
    fn discard(&self, published: bool) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stop_threads();
        if published {
            self.unpublish(true);
        }
    }

    /// Takes the lock that orders installs, registrations and shutdown;
    /// refuses once the engine is closed (`destroyTransferEngine` has begun).
    fn begin_change(&self, call: &str) -> Result<std::sync::MutexGuard<'_, ()>> {
        let guard = sync::lock(&self.changes);
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(format!(
                "{call}: the engine is being destroyed"
            )));
        }
        Ok(guard)
    }

    fn stop_threads(&self) {
        // Notifications of completed batches still go out, waiting on their
        // peers at most the handshake connect timeout; then every handshake
        // call under way is cancelled.
        self.work.drain(std::time::Duration::from_secs(
            self.config.rpc.connect_timeout_secs,
        ));
        self.cancel.cancel();
        self.work.stop();
        if let Some(k) = self.keeper.get() {
            k.stop();
        }
        self.metrics.stop();
        if let Some(server) = sync::lock(&self.exposition).take() {
            server.shutdown();
        }
        self.control.clear_handshakes();
        for t in self.transports() {
            t.shutdown();
        }
        self.rpc.shutdown();
        self.local.shutdown();
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}
