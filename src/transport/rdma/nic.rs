//! One RDMA device in use: its context, protection domain, completion
//! queue, port, GID and MTU; its endpoints; its worker threads (post and
//! complete work requests); both sides of its handshakes (ours run on the
//! transport's [`Connector`]).

use super::connector::{ConnectJob, Connector};
use super::endpoint::{Ended, Phase, PostJob, Posting, RdmaEndpoint, report};
use super::gid;
use super::handshake::{HandshakeDesc, nic_path, split_nic_path};
use super::pool::{PassiveLimits, Pool, QpTable};
use super::wake::{EventFd, wait_readable};
use super::{GonePeers, RdmaOptions, RdmaTarget};
use crate::error::{Error, Result};
use crate::rpc::{ClientOptions, FrameKind};
use crate::sync;
use crate::transport::Outcome;
use crate::verbs::{
    CompletionChannel, CompletionQueue, ConnectParams, Context, Gid, ProtectionDomain, QueuePair,
    QueuePairCaps, WorkCompletion, gid_to_string, mtu_bytes, mtu_enum, parse_gid,
};
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, TryLockError};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{debug, info, warn};

/// How long an idle worker sleeps between looks at its queues.
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// What one batch of completions ended.
struct Consumed {
    ended: Ended,
    touched: Vec<Arc<RdmaEndpoint>>,
    failed: Vec<(Arc<RdmaEndpoint>, String)>,
}

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
        let port_no = opts.port;
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
        let gid = select_gid(&ctx, port_no, port.gid_table_len, opts.gid_index)?;
        let path_mtu = port.active_mtu.min(mtu_enum(opts.mtu).unwrap_or(5)).max(1);
        let clamp = |want: u32, max: u32, what: &str| {
            if max > 0 && want > max {
                warn!("RDMA device {name}: {what} {want} exceeds the device's {max}; using {max}");
                max
            } else {
                want
            }
        };
        let caps = QueuePairCaps {
            max_wr: clamp(opts.max_wr, limits.max_qp_wr, "MC_MAX_WR"),
            max_sge: clamp(opts.max_sge, limits.max_sge, "MC_MAX_SGE"),
            max_inline: opts.max_inline,
        };
        let max_cqe = clamp(opts.max_cqe, limits.max_cqe, "MC_MAX_CQE_PER_CTX");
        let max_eps = (limits.max_qp as usize / opts.num_qp_per_ep.max(1)).max(1);
        let capacity = if opts.max_ep_per_ctx > max_eps {
            warn!(
                "RDMA device {name}: MC_MAX_EP_PER_CTX {} x MC_NUM_QP_PER_EP {} exceeds the \
                 device's {} queue pairs; using {max_eps} endpoints",
                opts.max_ep_per_ctx, opts.num_qp_per_ep, limits.max_qp
            );
            max_eps
        } else {
            opts.max_ep_per_ctx
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
        let max_mr_size = opts.max_mr_size.min(limits.max_mr_size);
        info!(
            "RDMA device {name}: port {port_no} active, GID index {} ({}), path MTU {} \
             (active {}), LID {}, {} QP(s) per endpoint x {} WRs, CQ {} entries, \
             up to {capacity} endpoints",
            gid.0.index,
            gid.1,
            mtu_bytes(path_mtu),
            mtu_bytes(port.active_mtu),
            port.lid,
            opts.num_qp_per_ep,
            caps.max_wr,
            cq.capacity(),
        );
        let passive = PassiveLimits {
            total: opts.max_passive_ep.min(capacity),
            per_peer: opts.max_passive_ep_per_peer,
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
            pool: Mutex::new(Pool::new(capacity, opts.store_type)),
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
        for i in 0..self.opts.workers {
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
                    self.opts.gid_index,
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

    /// The RTR/RTS parameters towards `gid`/`lid`, peer queue pair `qpn`.
    fn params(&self, remote_gid: Gid, remote_lid: u16, qpn: u32) -> ConnectParams {
        let g = self.gid();
        ConnectParams {
            port: self.port,
            pkey_index: self.opts.pkey_index,
            path_mtu: self.path_mtu,
            sgid_index: g.index as u8,
            remote_gid,
            remote_lid,
            remote_qpn: qpn,
            traffic_class: self.opts.traffic_class,
            service_level: self.opts.service_level.unwrap_or(0),
            max_dest_rd_atomic: self.rd_atomic,
            max_rd_atomic: self.rd_atomic,
            timeout: self.opts.ack_timeout,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            hop_limit: 16,
        }
    }

    /// Our side of a handshake for `ep`.
    fn local_desc(&self, ep: &RdmaEndpoint) -> HandshakeDesc {
        ep.local_desc(&self.path, self.lid, &gid_to_string(&self.gid().gid))
    }

    /// A fresh endpoint to `peer_nic_path` (not yet in the pool).
    fn new_endpoint(&self, peer_nic_path: &str) -> Result<Arc<RdmaEndpoint>> {
        let mut qps = Vec::with_capacity(self.opts.num_qp_per_ep);
        for _ in 0..self.opts.num_qp_per_ep {
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

    /// The endpoint a peer's handshake sets up: the pooled one to
    /// `peer_nic_path`, or a new one within the bounds on endpoints that
    /// handshakes create (at the total bound the least recently active
    /// one gives way); a refusal says why.
    fn passive_endpoint(
        &self,
        peer_nic_path: &str,
    ) -> std::result::Result<Arc<RdmaEndpoint>, String> {
        let mut pool = sync::lock(&self.pool);
        if let Some(ep) = pool.get(peer_nic_path) {
            if ep.phase() != Phase::Failed {
                pool.touch_passive(&ep);
                return Ok(ep);
            }
            pool.remove(&ep);
        }
        let made_room = pool
            .make_room_for_passive(peer_nic_path, self.passive)
            .inspect_err(|why| {
                crate::warn_limited!("RDMA device {}: refused a handshake: {why}", self.name);
            })?;
        if !made_room.is_empty() {
            crate::warn_limited!(
                "RDMA device {}: the endpoints that peers' handshakes created are at the bound \
                 (MC_RDMA_MAX_PASSIVE_EP={}); the least recently active ({}) gave way to {}",
                self.name,
                self.passive.total,
                made_room
                    .iter()
                    .map(|e| e.peer_nic_path.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                peer_nic_path
            );
        }
        let ep = self
            .new_endpoint(peer_nic_path)
            .map_err(|e| e.to_string())?;
        let evicted = pool.insert(ep.clone(), true);
        drop(pool);
        self.evicted(&made_room);
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

    /// Queues a job on the endpoint to `target` and gets it connected or
    /// posted.
    pub fn post(self: &Arc<Self>, target: &RdmaTarget, job: PostJob) {
        if !self.is_active() {
            return report(vec![(job.slice, Outcome::Failed { hard: true })]);
        }
        let ep = match self.endpoint(&target.peer_nic_path) {
            Ok(ep) => ep,
            Err(e) => {
                crate::warn_limited!("{e}");
                return report(vec![(job.slice, Outcome::Failed { hard: true })]);
            }
        };
        ep.set_peer_rpc(&target.rpc_host, target.rpc_port);
        match ep.enqueue(job) {
            Err(job) => report(vec![(job.slice, Outcome::Interrupted)]),
            Ok((Phase::New, _)) => {
                if ep.start_connecting() {
                    self.request_connect(ep, target.clone());
                }
            }
            Ok((_, true)) => self.schedule(ep),
            Ok(_) => {}
        }
    }

    fn request_connect(self: &Arc<Self>, ep: Arc<RdmaEndpoint>, target: RdmaTarget) {
        let server = split_nic_path(&target.peer_nic_path).map_or("", |(s, _)| s);
        if self.gone.is_gone(server) {
            return self.fail_endpoint(
                &ep,
                Outcome::Failed { hard: true },
                "the peer is gone (it answered no Probe); not connecting for now",
            );
        }
        let job = ConnectJob {
            nic: self.clone(),
            ep,
            target,
        };
        if let Err(job) = self.connector.submit(job) {
            self.fail_endpoint(
                &job.ep,
                Outcome::Failed { hard: true },
                "the transport is stopping",
            );
        }
    }

    fn schedule(&self, ep: Arc<RdmaEndpoint>) {
        // The receiver lives as long as the device.
        let _ = self.runnable.0.send(ep);
        self.wake.wake();
    }

    /// Runs our handshake for `ep` (on a connector thread) and schedules
    /// the endpoint, or fails it.
    pub fn connect(&self, ep: &Arc<RdmaEndpoint>, target: &RdmaTarget) {
        if self.stopping.load(Ordering::Acquire) {
            return self.fail_endpoint(ep, Outcome::Interrupted, "the transport is stopping");
        }
        match self.connect_active(ep, target) {
            Ok(()) => {
                debug!("RDMA {} -> {} connected", self.path, ep.peer_nic_path);
                if ep.want_schedule() {
                    self.schedule(ep.clone());
                }
            }
            Err(e) => self.fail_endpoint(ep, Outcome::Failed { hard: true }, &e),
        }
    }

    /// Our handshake to the peer of `ep`, the queue pair setup, and the
    /// ready ACK when the peer wants one.
    fn connect_active(
        &self,
        ep: &RdmaEndpoint,
        target: &RdmaTarget,
    ) -> std::result::Result<(), String> {
        let local = self.local_desc(ep);
        let opts = ClientOptions {
            io_timeout: self.opts.handshake_timeout,
            ..self.opts.rpc.clone()
        };
        let reply = crate::rpc::call(
            &target.rpc_host,
            target.rpc_port,
            FrameKind::Connection,
            &local.to_json(),
            &opts,
        )
        .map_err(|e| {
            format!(
                "handshake with {}:{} failed: {e}",
                target.rpc_host, target.rpc_port
            )
        })?;
        let reply = HandshakeDesc::from_json(&reply)?;
        let gid_text = if reply.local_gid.is_empty() {
            target.peer_gid.clone()
        } else {
            reply.local_gid.clone()
        };
        let lid = if reply.local_gid.is_empty() {
            target.peer_lid
        } else {
            reply.local_lid
        };
        let remote_gid = parse_gid(&gid_text)
            .ok_or_else(|| format!("peer {} sent an invalid GID {gid_text:?}", ep.peer_nic_path))?;
        let need_ack =
            ep.finish_active(&local, &reply, &|qpn| self.params(remote_gid, lid, qpn))?;
        if need_ack {
            let ack = HandshakeDesc {
                ready_ack: Some(true),
                ..local
            };
            let r = crate::rpc::call(
                &target.rpc_host,
                target.rpc_port,
                FrameKind::Connection,
                &ack.to_json(),
                &opts,
            )
            .map_err(|e| format!("sending the ready ACK to {} failed: {e}", ep.peer_nic_path))?;
            let r = HandshakeDesc::from_json(&r)?;
            if !r.reply_msg.is_empty() {
                return Err(format!(
                    "{} refused our ready ACK: {}",
                    ep.peer_nic_path, r.reply_msg
                ));
            }
            if !ep.ack_sent() {
                return Err(format!(
                    "endpoint to {} failed during setup",
                    ep.peer_nic_path
                ));
            }
        }
        Ok(())
    }

    /// The passive side of a handshake addressed to this device, from a
    /// peer the transport verified.
    pub fn accept(&self, req: &HandshakeDesc) -> HandshakeDesc {
        if !self.is_active() {
            return HandshakeDesc::rejection(format!("RDMA device {} is down", self.name));
        }
        if req.ready_ack == Some(true) {
            let ep = {
                let pool = sync::lock(&self.pool);
                pool.get(&req.local_nic_path)
            };
            let result = match &ep {
                Some(ep) => ep.ready_ack(&req.qp_num),
                None => Err("received RDMA ready ACK for unconnected endpoint".into()),
            };
            return match result {
                Ok(()) => {
                    if let Some(ep) = ep {
                        if ep.want_schedule() {
                            self.schedule(ep);
                        }
                    }
                    HandshakeDesc::default()
                }
                Err(why) => HandshakeDesc::rejection(why),
            };
        }
        let Some(remote_gid) = parse_gid(&req.local_gid) else {
            return HandshakeDesc::rejection(format!("Invalid peer GID: {:?}", req.local_gid));
        };
        let params = |qpn| self.params(remote_gid, req.local_lid, qpn);
        for _ in 0..2 {
            let ep = match self.passive_endpoint(&req.local_nic_path) {
                Ok(ep) => ep,
                Err(why) => return HandshakeDesc::rejection(why),
            };
            match ep.accept(req, &params) {
                Ok(()) => {
                    if ep.want_schedule() {
                        self.schedule(ep.clone());
                    }
                    return self.local_desc(&ep);
                }
                Err((true, _)) => {
                    info!(
                        "RDMA device {}: {} connects with new queue pairs (restarted?); \
                         replacing its endpoint",
                        self.name, req.local_nic_path
                    );
                    self.fail_endpoint(
                        &ep,
                        Outcome::Failed { hard: false },
                        "the peer reconnected",
                    );
                }
                Err((false, why)) => {
                    self.fail_endpoint(&ep, Outcome::Failed { hard: true }, &why);
                    return HandshakeDesc::rejection(why);
                }
            }
        }
        HandshakeDesc::rejection("endpoint setup raced with another; retry")
    }

    /// Worker thread: completes and posts work requests until stopped.
    fn work(self: Arc<Self>) {
        let fds = [self.wake.fd(), self.cq.event_fd()];
        let mut wcs: Vec<WorkCompletion> = Vec::with_capacity(64);
        loop {
            if self.halted.load(Ordering::Acquire)
                || (self.stopping.load(Ordering::Acquire) && self.idle())
            {
                break;
            }
            let ready = wait_readable(&fds, IDLE_WAIT);
            if ready[0] {
                self.wake.drain();
            }
            if let Err(e) = self.cq.take_event() {
                warn!(
                    "RDMA device {}: reading the completion channel: {e}",
                    self.name
                );
            }
            self.complete_all(&mut wcs);
            self.post_runnable();
        }
    }

    /// Whether nothing is outstanding or queued (for the workers' exit).
    fn idle(&self) -> bool {
        self.cq_outstanding.load(Ordering::Acquire) == 0 && self.runnable.1.is_empty()
    }

    /// Polls the completion queue dry, re-arms it, and polls once more
    /// (a completion between the last poll and the arming would otherwise
    /// wait for the next event). Completions are taken and matched to
    /// their requests in queue order, one batch at a time under
    /// `poll_lock`: a request without a completion of its own counts as
    /// done only when a later completion of its queue pair is seen, so
    /// completions must not overtake each other between workers. A worker
    /// never waits for that lock: it leaves a wish (`poll_again`) and goes
    /// on posting, and the holder looks again before it returns. Slices
    /// are reported outside the lock.
    fn complete_all(&self, wcs: &mut Vec<WorkCompletion>) {
        let mut armed = false;
        loop {
            self.poll_again.store(true, Ordering::SeqCst);
            let in_order = match self.poll_lock.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            self.poll_again.store(false, Ordering::SeqCst);
            wcs.clear();
            match self.cq.poll(wcs, 64) {
                Ok(0) if !armed => {
                    if let Err(e) = self.cq.arm() {
                        warn!(
                            "RDMA device {}: arming the completion queue: {e}",
                            self.name
                        );
                    }
                    armed = true;
                }
                Ok(0) => {
                    drop(in_order);
                    if !self.poll_again.load(Ordering::SeqCst) {
                        return;
                    }
                    armed = false;
                }
                Ok(_) => {
                    let consumed = self.consume(wcs);
                    drop(in_order);
                    self.settle(consumed);
                }
                Err(e) => {
                    warn!("RDMA device {}: {e}", self.name);
                    return;
                }
            }
        }
    }

    /// Matches completions to their requests.
    fn consume(&self, wcs: &[WorkCompletion]) -> Consumed {
        let mut c = Consumed {
            ended: Vec::with_capacity(wcs.len()),
            touched: Vec::new(),
            failed: Vec::new(),
        };
        for wc in wcs {
            let Some(ep) = self.qps.get(wc.qp_num) else {
                continue;
            };
            let Some(slot) = ep.slot_of(wc.qp_num) else {
                continue;
            };
            let outcome = if wc.ok() {
                Outcome::Done
            } else if wc.flushed() {
                Outcome::Interrupted
            } else if wc.remote_access_error() {
                Outcome::Rejected
            } else {
                let hard = matches!(
                    wc.status,
                    rdma_sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR
                        | rdma_sys::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR
                );
                Outcome::Failed { hard }
            };
            let n = ep.complete(slot, wc.wr_id, outcome, &mut c.ended);
            if !wc.ok() {
                debug!(
                    "RDMA device {}: QP {} request {} ended with {} ({n} request(s) matched)",
                    self.name,
                    wc.qp_num,
                    wc.wr_id,
                    wc.status_name()
                );
            }
            if n == 0 {
                // Left over from a destroyed queue pair.
                continue;
            }
            // Any error, a flush included, means the queue pair is in the
            // error state: the endpoint is replaced.
            if !wc.ok() && !c.failed.iter().any(|(e, _)| Arc::ptr_eq(e, &ep)) {
                c.failed.push((
                    ep.clone(),
                    format!(
                        "work request completed with {} (vendor error {:#x})",
                        wc.status_name(),
                        wc.vendor_err
                    ),
                ));
            }
            if !c.touched.iter().any(|t| Arc::ptr_eq(t, &ep)) {
                c.touched.push(ep);
            }
        }
        c
    }

    /// Reports what completions ended, fails the endpoints that had
    /// errors, and reschedules endpoints that now have room.
    fn settle(&self, c: Consumed) {
        for (ep, why) in c.failed {
            self.fail_endpoint(&ep, Outcome::Interrupted, &why);
        }
        report(c.ended);
        for ep in c.touched {
            if ep.want_schedule() {
                self.schedule(ep);
            }
        }
        // Only those waiting now: posting may add more meanwhile.
        for _ in 0..self.cq_waiting.1.len() {
            let Ok(ep) = self.cq_waiting.1.try_recv() else {
                break;
            };
            if ep.want_schedule() {
                self.schedule(ep);
            }
        }
    }

    fn post_runnable(&self) {
        let max_wr = self.caps.max_wr as usize;
        let cq_cap = self.cq.capacity() as usize;
        let _posting = sync::lock(&self.post_lock);
        loop {
            let Ok(ep) = self.runnable.1.try_recv() else {
                return;
            };
            // Reserve the completion queue room before posting.
            let outstanding = self.cq_outstanding.load(Ordering::Acquire);
            let mut room = cq_cap.saturating_sub(outstanding);
            let (left, ended) = ep.post_queued(max_wr, self.opts.signal_every, &mut room);
            report(ended);
            match left {
                Posting::CqFull => {
                    let _ = self.cq_waiting.0.send(ep);
                }
                Posting::Drained | Posting::QueueFull | Posting::NotReady => {}
            }
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
