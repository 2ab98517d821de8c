//! One RDMA device in use: its context, protection domain, completion
//! queue, port, GID and MTU, and its endpoints. Both sides of its
//! handshakes are in [`connect`]; its worker threads in [`worker`].

mod connect;
mod worker;

use super::Connector;
use super::endpoint::{Phase, RdmaEndpoint, report};
use super::gid;
use super::handshake::{nic_path, split_nic_path};
use super::pool::{PassiveLimits, Pool, QpTable};
use super::wake::EventFd;
use super::{GonePeers, RdmaOptions};
use crate::error::{Error, Result};
use crate::sync;
use crate::transport::Outcome;
use crate::verbs::{
    CompletionChannel, CompletionQueue, Context, Gid, ProtectionDomain, QueuePair, QueuePairCaps,
    mtu_bytes, mtu_enum,
};
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{debug, info, warn};

/// The selected GID of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidChoice {
    /// Index in the port's table.
    pub index: u32,
    /// The GID.
    pub gid: Gid,
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
    cq: Arc<CompletionQueue>,
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
    qps: QpTable,
    /// Endpoints with slices to post (a lock-free queue: completions add
    /// to it).
    runnable: (Sender<Arc<RdmaEndpoint>>, Receiver<Arc<RdmaEndpoint>>),
    /// Serializes posting, so the completion queue's room is not handed
    /// out twice.
    post_lock: Mutex<()>,
    /// Serializes taking completions (see [`Nic::complete_all`]).
    poll_lock: Mutex<()>,
    /// A worker wanted to take completions while another held
    /// `poll_lock`: the holder looks again before it returns.
    poll_again: AtomicBool,
    /// Endpoints waiting for room in the completion queue.
    cq_waiting: (Sender<Arc<RdmaEndpoint>>, Receiver<Arc<RdmaEndpoint>>),
    cq_outstanding: Arc<AtomicUsize>,
    wake: EventFd,
    connector: Arc<Connector>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// No new work; workers finish what is outstanding.
    stopping: AtomicBool,
    /// Workers exit now.
    halted: AtomicBool,
    /// Peers whose process is gone (shared by the transport's devices).
    gone: Arc<GonePeers>,
}

impl Nic {
    /// Opens device `name` and sets it up: port `MC_IB_PORT` must be
    /// active; GID, MTU and limits are chosen and logged. Threads start
    /// with [`Nic::start`]; its handshakes run on `connector`.
    pub fn open(
        name: &str,
        server: &str,
        opts: &Arc<RdmaOptions>,
        gone: &Arc<GonePeers>,
        connector: &Arc<Connector>,
    ) -> Result<Nic> {
        let ctx_err = |what: &str, e: std::io::Error| {
            Error::Context(format!("RDMA device {name}: {what} failed: {e}"))
        };
        let ctx = Arc::new(Context::open(name).map_err(|e| ctx_err("opening it", e))?);
        let limits = ctx.limits().map_err(|e| ctx_err("ibv_query_device", e))?;
        let port_no = opts.cfg.ib_port;
        if port_no > limits.ports {
            return Err(Error::Context(format!(
                "RDMA device {name} has {} port(s); MC_IB_PORT={port_no} does not exist",
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
        let channel = Arc::new(
            CompletionChannel::new(&ctx).map_err(|e| ctx_err("ibv_create_comp_channel", e))?,
        );
        let cq = Arc::new(
            CompletionQueue::new(&channel, max_cqe).map_err(|e| ctx_err("ibv_create_cq", e))?,
        );
        cq.arm().map_err(|e| ctx_err("ibv_req_notify_cq", e))?;
        let wake = EventFd::new().map_err(|e| ctx_err("eventfd", e))?;
        let max_mr_size = opts.cfg.max_mr_size.min(limits.max_mr_size);
        info!(
            "RDMA device {name}: port {port_no} active, GID index {} ({}), path MTU {} \
             (active {}), LID {}, {} QP(s) per endpoint x {} WRs, CQ {} entries, \
             up to {capacity} endpoints",
            gid.0.index,
            gid.1,
            mtu_bytes(path_mtu),
            mtu_bytes(port.active_mtu),
            port.lid,
            opts.cfg.num_qp_per_ep,
            caps.max_wr,
            cq.capacity(),
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
            cq,
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
            qps: QpTable::default(),
            runnable: crossbeam_channel::unbounded(),
            post_lock: Mutex::new(()),
            poll_lock: Mutex::new(()),
            poll_again: AtomicBool::new(false),
            cq_waiting: crossbeam_channel::unbounded(),
            cq_outstanding: Arc::new(AtomicUsize::new(0)),
            wake,
            connector: connector.clone(),
            threads: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            halted: AtomicBool::new(false),
            gone: gone.clone(),
        })
    }

    /// Starts the worker threads.
    pub fn start(self: &Arc<Self>) -> Result<()> {
        let mut threads = sync::lock(&self.threads);
        for i in 0..self.opts.cfg.workers_per_ctx {
            let me = self.clone();
            let t = std::thread::Builder::new()
                .name(format!("te-rdma-{}-{i}", self.name))
                .spawn(move || me.work())
                .map_err(|e| Error::Context(format!("starting an RDMA worker thread: {e}")))?;
            threads.push(t);
        }
        Ok(())
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
    /// every endpoint, or puts it back with a fresh look at its GID.
    pub fn set_active(&self, up: bool) {
        if up {
            if let Ok(port) = self.ctx.port(self.port) {
                if let Ok(g) = select_gid(
                    &self.ctx,
                    self.port,
                    port.gid_table_len,
                    self.opts.cfg.gid_index,
                ) {
                    if g.0 != self.gid() {
                        info!(
                            "RDMA device {}: GID now index {} ({})",
                            self.name, g.0.index, g.1
                        );
                        *sync::write(&self.gid) = g.0;
                    }
                }
            }
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

    /// A fresh endpoint to `peer_nic_path` (not yet in the pool).
    fn new_endpoint(&self, peer_nic_path: &str) -> Result<Arc<RdmaEndpoint>> {
        let mut qps = Vec::with_capacity(self.opts.cfg.num_qp_per_ep);
        for _ in 0..self.opts.cfg.num_qp_per_ep {
            let qp = QueuePair::new(&self.pd, &self.cq, self.caps).map_err(|e| {
                Error::Endpoint(format!(
                    "RDMA device {}: creating a queue pair failed: {e}",
                    self.name
                ))
            })?;
            qps.push(qp);
        }
        let ep = Arc::new(RdmaEndpoint::new(
            peer_nic_path.to_string(),
            qps,
            self.opts.completion_timeout,
            self.cq_outstanding.clone(),
        ));
        self.qps.add(&ep);
        Ok(ep)
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
        crate::warn_limited!(
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
        if let Some(ep) = self.qps.get(qp_num) {
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
                    "RDMA device {}: no completion from {} for {timeout:?}; tearing the \
                     endpoint down and failing its slices over",
                    self.name, ep.peer_nic_path
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
            self.qps.forget(ep);
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
        self.qps.clear();
        while self.runnable.1.try_recv().is_ok() {}
        while self.cq_waiting.1.try_recv().is_ok() {}
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
