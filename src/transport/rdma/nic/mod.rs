//! One RDMA device in use: its context, protection domain, completion
//! queue, port, GID and MTU, and its endpoints. Both sides of its
//! handshakes are in [`connect`]; its worker threads in [`worker`].

mod connect;
mod worker;

use super::Connector;
use super::endpoint::{CqRoom, Phase, RdmaEndpoint, report};
use super::gid;
use super::handshake::{nic_path, split_nic_path};
use super::pool::{EndpointSlab, PassiveLimits, Pool};
use super::wake::EventFd;
use super::{GonePeers, RdmaOptions};
use crate::error::{Error, Result};
use crate::sync;
use crate::transport::{Outcome, Republish};
use crate::verbs::{
    CompletionChannel, CompletionQueue, Context, Gid, ProtectionDomain, QueuePair, QueuePairCaps,
    gid_to_string, mtu_bytes, mtu_enum,
};
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{debug, info, warn};

/// One completion queue of a device.
struct Cq {
    cq: Arc<CompletionQueue>,
    /// Index of its channel in `Nic::channels`.
    channel: usize,
    /// Requests outstanding on it, against its capacity.
    room: Arc<CqRoom>,
    /// Endpoints waiting for room in it.
    waiting: (Sender<Arc<RdmaEndpoint>>, Receiver<Arc<RdmaEndpoint>>),
}

/// The selected GID of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidChoice {
    /// Index in the port's table.
    pub index: u32,
    /// The GID.
    pub gid: Gid,
}

/// What a fresh look at the GID table found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GidRefresh {
    /// The GID in use is still the one to use.
    Unchanged,
    /// Another GID is in use now; the text says which.
    Changed(String),
    /// No usable GID (the previous one stays); the text says why.
    Failed(String),
}

/// One device in use.
pub struct Nic {
    /// Device name.
    pub name: String,
    /// Our NIC path: `<server name>@<device>`.
    pub path: String,
    ctx: Arc<Context>,
    /// The protection domain memory is registered in.
    pub pd: Arc<ProtectionDomain>,
    /// The completion channels (`MC_NUM_COMP_CHANNELS_PER_CTX`).
    channels: Vec<Arc<CompletionChannel>>,
    /// The completion queues (`MC_NUM_CQ_PER_CTX`): queue `i` is polled
    /// by worker `i % MC_WORKERS_PER_CTX` alone.
    cqs: Vec<Cq>,
    /// Round robin of new endpoints over `cqs`.
    next_cq: AtomicUsize,
    port: u8,
    /// LID of the port (0 on RoCE).
    pub lid: u16,
    gid: RwLock<GidChoice>,
    path_mtu: u32,
    caps: QueuePairCaps,
    rd_atomic: u8,
    /// Largest memory region the device takes.
    pub max_mr_size: u64,
    opts: Arc<RdmaOptions>,
    /// Bounds on the endpoints peers' handshakes create.
    passive: PassiveLimits,
    active: AtomicBool,
    pool: Mutex<Pool>,
    /// Endpoints whose queue pairs may still complete, by the index their
    /// work request ids carry.
    slab: EndpointSlab,
    /// Endpoints with slices to post (a lock-free queue: completions add
    /// to it).
    runnable: (Sender<Arc<RdmaEndpoint>>, Receiver<Arc<RdmaEndpoint>>),
    /// Workers asleep (or about to be): only then does [`Nic::schedule`]
    /// write to `wake`.
    sleepers: AtomicUsize,
    wake: EventFd,
    connector: Arc<Connector>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// No new work; workers finish what is outstanding.
    stopping: AtomicBool,
    /// Workers exit now.
    halted: AtomicBool,
    /// Peers whose process is gone (shared by the transport's devices).
    gone: Arc<GonePeers>,
    /// Asks the engine to publish the descriptor again (the GID changed).
    republish: Republish,
    /// GIDs our handshakes tried in a row whose queue pairs refused RTR
    /// with EINVAL (`MC_AUTO_GID_MAX_RETRIES`).
    gids_tried: Mutex<Vec<GidChoice>>,
}

impl Nic {
    /// Its endpoint pool: endpoints held and evicted so far.
    pub fn endpoint_pool(&self) -> crate::transport::EndpointPool {
        crate::sync::lock(&self.pool).stats()
    }

    /// Opens rail `name` (a device's port `MC_IB_PORT`, or `<device>:<port>`)
    /// and sets it up: the port must be active; GID, MTU and limits are chosen and logged. Threads start
    /// with [`Nic::start`]; its handshakes run on `connector`.
    pub fn open(
        name: &str,
        server: &str,
        opts: &Arc<RdmaOptions>,
        gone: &Arc<GonePeers>,
        connector: &Arc<Connector>,
        republish: &Republish,
    ) -> Result<Nic> {
        let ctx_err = |what: &str, e: std::io::Error| {
            Error::Context(format!("RDMA device {name}: {what} failed: {e}"))
        };
        // A rail name: the device for port MC_IB_PORT, or `<device>:<port>`.
        let (device, port_no) = crate::topology::parse_rail(name, opts.cfg.ib_port);
        let ctx = Arc::new(Context::open(device).map_err(|e| ctx_err("opening it", e))?);
        let limits = ctx.limits().map_err(|e| ctx_err("ibv_query_device", e))?;
        if port_no > limits.ports {
            return Err(Error::Context(format!(
                "RDMA device {device} has {} port(s); port {port_no} (MC_IB_PORT or the \
                 name's suffix) does not exist",
                limits.ports
            )));
        }
        let port = ctx
            .port(port_no)
            .map_err(|e| ctx_err("ibv_query_port", e))?;
        if !port.active {
            return Err(Error::Context(format!(
                "RDMA device {name}: port {port_no} is not active (state {})",
                port.state
            )));
        }
        let gid = select_gid(&ctx, port_no, port.gid_table_len, opts.cfg.gid_index)?;
        let path_mtu = port
            .active_mtu
            .min(mtu_enum(opts.cfg.mtu).unwrap_or(5))
            .max(1);
        let clamp = |want: u32, max: u32, what: &str| {
            if max > 0 && want > max {
                warn!("RDMA device {name}: {what} {want} exceeds the device's {max}; using {max}");
                max
            } else {
                want
            }
        };
        let caps = QueuePairCaps {
            max_wr: clamp(opts.cfg.max_wr, limits.max_qp_wr, "MC_MAX_WR"),
            max_sge: clamp(opts.cfg.max_sge, limits.max_sge, "MC_MAX_SGE"),
            max_inline: opts.cfg.max_inline,
        };
        let max_cqe = clamp(
            opts.cfg.max_cqe_per_ctx,
            limits.max_cqe,
            "MC_MAX_CQE_PER_CTX",
        );
        let max_eps = (limits.max_qp as usize / opts.cfg.num_qp_per_ep.max(1)).max(1);
        let capacity = if opts.endpoints.max_per_ctx > max_eps {
            warn!(
                "RDMA device {name}: MC_MAX_EP_PER_CTX {} x MC_NUM_QP_PER_EP {} exceeds the \
                 device's {} queue pairs; using {max_eps} endpoints",
                opts.endpoints.max_per_ctx, opts.cfg.num_qp_per_ep, limits.max_qp
            );
            max_eps
        } else {
            opts.endpoints.max_per_ctx
        };
        let rd_atomic = 16u32
            .min(limits.max_qp_rd_atom.max(1))
            .min(limits.max_qp_init_rd_atom.max(1)) as u8;
        let pd = Arc::new(ProtectionDomain::new(&ctx).map_err(|e| ctx_err("ibv_alloc_pd", e))?);
        let channels = (0..opts
            .cfg
            .num_comp_channels_per_ctx
            .min(opts.cfg.num_cq_per_ctx))
            .map(|_| CompletionChannel::new(&ctx).map(Arc::new))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| ctx_err("ibv_create_comp_channel", e))?;
        let mut cqs = Vec::with_capacity(opts.cfg.num_cq_per_ctx);
        for i in 0..opts.cfg.num_cq_per_ctx {
            let channel = i % channels.len();
            let cq = CompletionQueue::new(&channels[channel], max_cqe)
                .map_err(|e| ctx_err("ibv_create_cq", e))?;
            cqs.push(Cq {
                room: Arc::new(CqRoom::new(cq.capacity() as usize)),
                cq: Arc::new(cq),
                channel,
                waiting: crossbeam_channel::unbounded(),
            });
        }
        let wake = EventFd::new().map_err(|e| ctx_err("eventfd", e))?;
        let max_mr_size = opts.cfg.max_mr_size.min(limits.max_mr_size);
        info!(
            "RDMA device {name}: port {port_no} active, GID index {} ({}), path MTU {} \
             (active {}), LID {}, {} QP(s) per endpoint x {} WRs, {} CQ(s) of {} entries \
             on {} channel(s), up to {capacity} endpoints",
            gid.0.index,
            gid.1,
            mtu_bytes(path_mtu),
            mtu_bytes(port.active_mtu),
            port.lid,
            opts.cfg.num_qp_per_ep,
            caps.max_wr,
            cqs.len(),
            cqs[0].cq.capacity(),
            channels.len(),
        );
        let passive = PassiveLimits {
            total: opts.cfg.max_passive_ep.min(capacity),
            per_peer: opts.cfg.max_passive_ep_per_peer,
        };
        Ok(Nic {
            name: name.to_string(),
            path: nic_path(server, name),
            ctx,
            pd,
            channels,
            cqs,
            next_cq: AtomicUsize::new(0),
            port: port_no,
            lid: port.lid,
            gid: RwLock::new(gid.0),
            path_mtu,
            caps,
            rd_atomic,
            max_mr_size,
            opts: opts.clone(),
            passive,
            active: AtomicBool::new(true),
            pool: Mutex::new(Pool::new(capacity, opts.endpoints.store_type)),
            slab: EndpointSlab::default(),
            runnable: crossbeam_channel::unbounded(),
            sleepers: AtomicUsize::new(0),
            wake,
            connector: connector.clone(),
            threads: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            halted: AtomicBool::new(false),
            gone: gone.clone(),
            republish: republish.clone(),
            gids_tried: Mutex::default(),
        })
    }

    /// Starts the worker threads, on the CPUs of the device's NUMA node
    /// where it has one.
    pub fn start(self: &Arc<Self>) -> Result<()> {
        let cpus = worker::node_cpus_for(&self.name);
        worker::log_placement(&self.name, &cpus);
        let mut threads = sync::lock(&self.threads);
        for i in 0..self.opts.cfg.workers_per_ctx {
            let me = self.clone();
            let cpus = cpus.clone();
            let t = std::thread::Builder::new()
                .name(format!("te-rdma-{}-{i}", self.name))
                .spawn(move || {
                    if let Some(cpus) = cpus {
                        worker::pin(&me.name, &cpus);
                    }
                    me.work(i)
                })
                .map_err(|e| Error::Context(format!("starting an RDMA worker thread: {e}")))?;
            threads.push(t);
        }
        Ok(())
    }

    /// The port the device is used on.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The device context (for asynchronous events).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The GID in use.
    pub fn gid(&self) -> GidChoice {
        *sync::read(&self.gid)
    }

    /// Whether the device takes slices (its port is up).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire) && !self.stopping.load(Ordering::Acquire)
    }

    /// Takes the device out of selection (port or device error), failing
    /// every endpoint, or puts it back (see [`Nic::refresh_gid`] for its
    /// GID).
    pub fn set_active(&self, up: bool) {
        if up {
            if !self.active.swap(true, Ordering::AcqRel) {
                info!(
                    "RDMA device {}: port {} is active again; back in selection",
                    self.name, self.port
                );
            }
        } else if self.active.swap(false, Ordering::AcqRel) {
            warn!(
                "RDMA device {}: port {} is down; taken out of selection",
                self.name, self.port
            );
            self.fail_all(Outcome::Failed { hard: true });
        }
    }

    /// Looks at the GID table again (a GID change, a port back up): ranks
    /// it (or takes `MC_GID_INDEX`'s entry) and uses the GID chosen. When
    /// that is another GID, the engine publishes the descriptor again and
    /// every endpoint, built on the old GID, is retired: what it carries
    /// fails over, and new endpoints handshake with the new GID.
    pub fn refresh_gid(&self) -> GidRefresh {
        let port = match self.ctx.port(self.port) {
            Ok(p) => p,
            Err(e) => return GidRefresh::Failed(format!("ibv_query_port failed: {e}")),
        };
        let (chosen, text) = match select_gid(
            &self.ctx,
            self.port,
            port.gid_table_len,
            self.opts.cfg.gid_index,
        ) {
            Ok(g) => g,
            Err(e) => return GidRefresh::Failed(e.to_string()),
        };
        let old = self.gid();
        if chosen == old {
            return GidRefresh::Unchanged;
        }
        *sync::write(&self.gid) = chosen;
        let change = format!(
            "index {} ({}) -> index {} ({text})",
            old.index,
            gid_to_string(&old.gid),
            chosen.index
        );
        warn!(
            "RDMA device {}: GID changed, {change}; publishing it and retiring the endpoints \
             built on the old one",
            self.name
        );
        (self.republish)();
        self.fail_all(Outcome::Interrupted);
        GidRefresh::Changed(change)
    }

    /// After a queue pair refused RTR with EINVAL on each GID of `tried`:
    /// with ranked GIDs (`MC_GID_INDEX` unset), switches the device to the
    /// best ranked GID not tried yet (the engine publishes it) and returns
    /// it; `None` when there is none (or the index is fixed).
    pub(super) fn reprobe_gid(&self, tried: &[GidChoice]) -> Option<GidChoice> {
        if self.opts.cfg.gid_index.is_some() {
            return None;
        }
        let port = self.ctx.port(self.port).ok()?;
        let candidates = gid::probe(&self.ctx, self.port, port.gid_table_len);
        let tried: Vec<(u32, Gid)> = tried.iter().map(|g| (g.index, g.gid)).collect();
        let next = gid::next_untried(&candidates, &tried)?;
        let choice = GidChoice {
            index: next.index,
            gid: next.gid,
        };
        let old = std::mem::replace(&mut *sync::write(&self.gid), choice);
        warn!(
            "RDMA device {}: a queue pair refused RTR with GID index {}; re-probed the GID \
             table and switched to index {} ({})",
            self.name,
            old.index,
            choice.index,
            gid::describe(next)
        );
        if old != choice {
            (self.republish)();
        }
        Some(choice)
    }

    /// A fresh endpoint to `peer_nic_path` (not yet in the pool).
    fn new_endpoint(&self, peer_nic_path: &str) -> Result<Arc<RdmaEndpoint>> {
        let cq_index = self.next_cq.fetch_add(1, Ordering::Relaxed) % self.cqs.len();
        let cq = &self.cqs[cq_index];
        let mut qps = Vec::with_capacity(self.opts.cfg.num_qp_per_ep);
        for _ in 0..self.opts.cfg.num_qp_per_ep {
            let qp = QueuePair::new(&self.pd, &cq.cq, self.caps).map_err(|e| {
                Error::Endpoint(format!(
                    "RDMA device {}: creating a queue pair failed: {e}",
                    self.name
                ))
            })?;
            qps.push(qp);
        }
        self.slab
            .insert(|tag| {
                Arc::new(RdmaEndpoint::new(
                    peer_nic_path.to_string(),
                    tag,
                    qps,
                    self.opts.completion_timeout,
                    (cq_index, cq.room.clone()),
                ))
            })
            .ok_or_else(|| {
                Error::Endpoint(format!(
                    "RDMA device {}: too many endpoints whose queue pairs exist",
                    self.name
                ))
            })
    }

    /// Retires endpoints that left the pool to make room: each drains,
    /// then closes.
    fn evicted(&self, evicted: &[Arc<RdmaEndpoint>]) {
        for old in evicted {
            debug!(
                "RDMA device {}: endpoint to {} evicted",
                self.name, old.peer_nic_path
            );
            old.retire(false, Outcome::Interrupted);
        }
    }

    /// The pooled endpoint to `peer_nic_path`, or a new one (which may
    /// evict another).
    fn endpoint(&self, peer_nic_path: &str) -> Result<Arc<RdmaEndpoint>> {
        let mut pool = sync::lock(&self.pool);
        if let Some(ep) = pool.get(peer_nic_path) {
            if ep.phase() != Phase::Failed {
                return Ok(ep);
            }
            pool.remove(&ep);
        }
        let ep = self.new_endpoint(peer_nic_path)?;
        let evicted = pool.insert(ep.clone(), false);
        self.evicted(&evicted);
        Ok(ep)
    }

    /// Takes `ep` out of the pool for good (broken); its queued slices end
    /// with `outcome`, its posted ones as their queue pairs flush.
    pub fn fail_endpoint(&self, ep: &Arc<RdmaEndpoint>, outcome: Outcome, why: &str) {
        if ep.phase() == Phase::Failed && ep.retired() {
            return;
        }
        crate::log_limit::warn_limited!(
            "RDMA device {}: endpoint to {} failed: {why}",
            self.name,
            ep.peer_nic_path
        );
        // An endpoint still in the pool moves to the retiring list; an
        // evicted one is there already.
        sync::lock(&self.pool).remove(ep);
        report(ep.retire(true, outcome));
    }

    /// Fails the endpoint of queue pair `qp_num` (a fatal queue pair event).
    pub fn fail_qp(&self, qp_num: u32) {
        // A rare event: a scan of the endpoints is fine.
        let ep = self
            .slab
            .all()
            .into_iter()
            .find(|e| e.qpns().contains(&qp_num));
        if let Some(ep) = ep {
            self.fail_endpoint(
                &ep,
                Outcome::Interrupted,
                "its queue pair hit a fatal error",
            );
        }
    }

    /// Fails every endpoint (device down, shutdown).
    pub fn fail_all(&self, outcome: Outcome) {
        let all = sync::lock(&self.pool).drain();
        for ep in all {
            report(ep.retire(true, outcome));
        }
    }

    /// Periodic checks: endpoints whose queue pairs stopped completing
    /// fail over, overdue ready ACKs fail, retired endpoints that are done
    /// close. Returns the peers of the endpoints that stalled (server name
    /// and, if known, handshake address).
    pub fn maintain(&self) -> Vec<(String, Option<(String, u16)>)> {
        let mut stalled = Vec::new();
        let eps = sync::lock(&self.pool).all();
        let timeout = self.opts.completion_timeout;
        for ep in &eps {
            if ep.is_closed() {
                continue;
            }
            if ep.stalled(timeout) {
                warn!(
                    "RDMA device {}: no completion from {} for {timeout:?} ({} request(s) of {} \
                     bytes in flight); tearing the endpoint down and failing its slices over",
                    self.name,
                    ep.peer_nic_path,
                    ep.load().requests(),
                    ep.load().bytes()
                );
                self.fail_endpoint(ep, Outcome::Failed { hard: true }, "completions stopped");
                report(ep.destroy(Outcome::Failed { hard: true }));
                if let Some((server, _)) = split_nic_path(&ep.peer_nic_path) {
                    stalled.push((server.to_string(), ep.peer_rpc()));
                }
            } else if ep.ready_ack_overdue(self.opts.handshake_timeout) {
                self.fail_endpoint(
                    ep,
                    Outcome::Failed { hard: true },
                    "no ready ACK from the peer",
                );
            }
        }
        self.reclaim();
        stalled
    }

    /// Fails every endpoint to the peer `server` (its process is gone):
    /// what they carry fails over now instead of each stalling in turn.
    pub fn fail_peer(&self, server: &str) {
        let eps = sync::lock(&self.pool).all();
        for ep in eps {
            let to_peer = split_nic_path(&ep.peer_nic_path).is_some_and(|(s, _)| s == server);
            if !to_peer || ep.is_closed() {
                continue;
            }
            self.fail_endpoint(&ep, Outcome::Failed { hard: true }, "the peer is gone");
            report(ep.destroy(Outcome::Failed { hard: true }));
        }
    }

    /// Closes retired endpoints that are quiescent (outside the pool lock:
    /// closing reports slices, whose callbacks may post again).
    fn reclaim(&self) {
        let mut batch = sync::lock(&self.pool).take_retiring();
        if batch.is_empty() {
            return;
        }
        let closed = batch.reclaim();
        sync::lock(&self.pool).put_back_retiring(&mut batch);
        for ep in &closed {
            self.slab.remove(ep);
        }
    }

    /// Stops: fails every endpoint (their queue pairs flush), waits up to
    /// `grace` for the workers to see the flushed completions, joins the
    /// threads, then destroys every queue pair, failing what is left.
    pub fn shutdown(&self, grace: Duration) {
        self.stopping.store(true, Ordering::Release);
        self.fail_all(Outcome::Interrupted);
        let deadline = std::time::Instant::now() + grace;
        while !self.idle() && std::time::Instant::now() < deadline {
            self.wake.wake();
            std::thread::sleep(Duration::from_millis(5));
        }
        self.halted.store(true, Ordering::Release);
        self.wake.wake();
        let threads = std::mem::take(&mut *sync::lock(&self.threads));
        for t in threads {
            if t.join().is_err() {
                warn!("an RDMA thread of {} panicked", self.name);
            }
        }
        let eps = {
            let mut pool = sync::lock(&self.pool);
            pool.drain();
            pool.take_retiring()
        };
        for ep in eps.iter() {
            if !ep.is_closed() {
                report(ep.destroy(Outcome::Interrupted));
            }
        }
        self.slab.clear();
        while self.runnable.1.try_recv().is_ok() {}
        for cq in &self.cqs {
            while cq.waiting.1.try_recv().is_ok() {}
        }
    }
}

/// The GID of `MC_GID_INDEX`, or the best ranked one; with its log text.
fn select_gid(
    ctx: &Context,
    port: u8,
    table_len: u32,
    index: Option<u32>,
) -> Result<(GidChoice, String)> {
    let name = ctx.name();
    let candidates = gid::probe(ctx, port, table_len);
    let chosen = match index {
        Some(i) => {
            let c = candidates.iter().find(|c| c.index == i).ok_or_else(|| {
                Error::Context(format!(
                    "RDMA device {name}: MC_GID_INDEX={i} is not a non-null entry of port \
                     {port}'s GID table ({table_len} entries)"
                ))
            })?;
            if c.netdev.is_none() {
                warn!("RDMA device {name}: GID index {i} has no network device");
            }
            c
        }
        None => {
            let ranked = gid::rank(&candidates);
            let (i, tier) = ranked.first().copied().ok_or_else(|| {
                Error::Context(format!(
                    "RDMA device {name}: no usable GID on port {port}; set MC_GID_INDEX"
                ))
            })?;
            debug!("RDMA device {name}: GID index {i} chosen ({tier:?})");
            candidates
                .iter()
                .find(|c| c.index == i)
                .expect("ranked from candidates")
        }
    };
    Ok((
        GidChoice {
            index: chosen.index,
            gid: chosen.gid,
        },
        gid::describe(chosen),
    ))
}
