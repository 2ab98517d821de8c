//! The RDMA transport's core: devices, registrations, endpoints, the
//! passive handshake, the monitor.

use super::RdmaConfig;
use super::admission::PeerLookup;
use super::admission::{Admission, AdmissionLimits, LOOKUP_CONNECT_TIMEOUT};
use super::endpoint::{PostJob, report};
use super::handshake::{HandshakeDesc, split_nic_path};
use super::nic::{GidRefresh, Nic};
use super::registry::{DeviceDomain, RegisterOptions, Registration, Registry};
use super::wake::{EventFd, wait_readable};
use crate::auth::Keys;
use crate::error::{Error, Result};
use crate::peer_jobs::{Lanes, Limits};
use crate::rpc::{ClientOptions, FrameKind};
use crate::sync;
use crate::transport::endpoint::EndpointConfig;
use crate::transport::{Outcome, Republish, Slice, TransportConfig};
use crate::verbs::{AsyncEventKind, gid_to_string, parse_gid};
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How often the monitor runs its checks.
const MONITOR_INTERVAL: Duration = Duration::from_millis(500);

/// Bound on the Probe that tells a gone peer from one stalled queue pair.
const PEER_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long shutdown waits for flushed completions before destroying
/// queue pairs regardless.
/// A connector thread without handshakes for this long ends.
const CONNECTOR_IDLE_EXIT: Duration = Duration::from_secs(10);

/// The active side's handshakes, in lanes shared by the transport's
/// devices: those to one peer (one handshake listener address) run one at
/// a time, in order, those to different peers at once, on at most
/// `MC_RDMA_CONNECT_THREADS` threads; a peer that does not answer holds one
/// thread, for one handshake timeout at a time, and delays only its own
/// endpoints.
pub(crate) type Connector = Lanes<(String, u16)>;

const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The transport's settings, from the configuration.
#[derive(Debug, Clone)]
pub struct RdmaOptions {
    /// The RDMA part of the configuration.
    pub cfg: RdmaConfig,
    /// The endpoint pools' part.
    pub endpoints: EndpointConfig,
    /// `MC_RDMA_COMPLETION_TIMEOUT`.
    pub completion_timeout: Duration,
    /// Bound on one handshake exchange and on the wait for a ready ACK
    /// (twice `MC_HANDSHAKE_CONNECT_TIMEOUT`, 10 s by default, as
    /// Mooncake's fixed 10 s).
    pub handshake_timeout: Duration,
    /// Handshake client options.
    pub rpc: ClientOptions,
    /// The cluster keys our handshakes authenticate with.
    pub auth: Option<Arc<Keys>>,
    /// How long a peer found gone is not connected to again
    /// (`MC_RDMA_RAIL_PAUSE_SECONDS`).
    pub peer_gone_for: Duration,
    /// Bounds of the lookups behind the passive handshake's check.
    pub admission: AdmissionLimits,
}

impl RdmaOptions {
    /// The settings of a configuration.
    pub fn from_config(c: TransportConfig<'_>) -> RdmaOptions {
        RdmaOptions {
            cfg: c.rdma.clone(),
            endpoints: c.endpoints.clone(),
            completion_timeout: Duration::from_secs(c.rdma.completion_timeout_secs),
            handshake_timeout: Duration::from_secs(2 * c.rpc.connect_timeout_secs),
            rpc: ClientOptions::from_config(c.rpc),
            auth: None,
            peer_gone_for: Duration::from_secs(c.sched.rail_pause_secs),
            admission: admission_limits(c),
        }
    }
}

/// The lookups' bounds: `MC_RDMA_PEER_LOOKUPS_PER_SEC`; half the handshake
/// workers at once; a fetch within the lookup connect bound and
/// `MC_HANDSHAKE_IO_TIMEOUT`, and a frame waits for another's lookup at
/// most that long.
fn admission_limits(c: TransportConfig<'_>) -> AdmissionLimits {
    let io = Duration::from_secs(c.rpc.io_timeout_secs);
    let rpc = ClientOptions {
        connect_timeout: LOOKUP_CONNECT_TIMEOUT
            .min(Duration::from_secs(c.rpc.connect_timeout_secs)),
        io_timeout: io,
        ..ClientOptions::from_config(c.rpc)
    };
    AdmissionLimits {
        per_sec: c.rdma.peer_lookups_per_sec,
        concurrent: (c.rpc.workers / 2).max(1),
        capacity: c.rdma.max_passive_ep.max(1024),
        wait: rpc.connect_timeout + io,
        rpc,
    }
}

/// A peer device as the scheduler names it for one rail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaTarget {
    /// `<peer server name>@<peer device>`.
    pub peer_nic_path: String,
    /// Host of the peer's handshake listener.
    pub rpc_host: String,
    /// Port of the peer's handshake listener.
    pub rpc_port: u16,
    /// The device's GID from the peer's descriptor (used when the
    /// handshake reply carries none).
    pub peer_gid: String,
    /// The device's LID from the peer's descriptor.
    pub peer_lid: u16,
}

/// One of our devices as published in the segment descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// GID in Mooncake's text form.
    pub gid: String,
}

/// One published piece of a registered buffer (the whole buffer unless
/// it is larger than the largest memory region) and its keys, per device
/// in device order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferKeys {
    /// Start address of the piece.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// Local keys.
    pub lkey: Vec<u32>,
    /// Remote keys; empty when the buffer is not remotely accessible.
    pub rkey: Vec<u32>,
}

/// A running RDMA transport.
pub struct RdmaTransport {
    nics: RwLock<Vec<Arc<Nic>>>,
    names: Vec<String>,
    registry: Registry,
    opts: Arc<RdmaOptions>,
    connector: Arc<Connector>,
    admission: Admission,
    monitor: Mutex<Option<JoinHandle<()>>>,
    monitor_stop: Arc<EventFd>,
    closed: AtomicBool,
}

impl RdmaTransport {
    /// Opens `devices` (in that order, the published device order) for the
    /// engine named `server_name` and starts their threads. A device that
    /// cannot be used is left out with a warning; none usable is
    /// [`Error::DeviceNotFound`].
    /// Its handshakes authenticate with the cluster keys `auth`; when a
    /// device's GID changes it calls `republish`.
    pub fn start(
        devices: &[String],
        server_name: &str,
        cfg: TransportConfig<'_>,
        auth: Option<Arc<Keys>>,
        republish: Republish,
    ) -> Result<RdmaTransport> {
        let opts = Arc::new(RdmaOptions {
            auth,
            ..RdmaOptions::from_config(cfg)
        });
        let defaults = RdmaConfig::default();
        if let (Some(i), true) = (
            opts.cfg.gid_index,
            opts.cfg.auto_gid_max_retries != defaults.auto_gid_max_retries,
        ) {
            info!(
                "MC_AUTO_GID_MAX_RETRIES does not apply: MC_GID_INDEX={i} fixes the GID, so \
                 there is no ranked GID to try next"
            );
        }
        let gone = Arc::new(GonePeers::default());
        let connector = Arc::new(Lanes::new(Limits {
            threads: opts.cfg.connect_threads,
            queued: usize::MAX,
            per_lane: usize::MAX,
            idle_exit: CONNECTOR_IDLE_EXIT,
            thread_name: "te-rdma-conn",
        }));
        let mut nics = Vec::new();
        for name in devices {
            match Nic::open(name, server_name, &opts, &gone, &connector, &republish) {
                Ok(n) => nics.push(Arc::new(n)),
                Err(e) => warn!("{e}; device {name} is not used"),
            }
        }
        if nics.is_empty() {
            connector.stop();
            return Err(Error::DeviceNotFound(format!(
                "no usable RDMA device among {devices:?} (each needs an active port and a GID)"
            )));
        }
        let names: Vec<String> = nics.iter().map(|n| n.name.clone()).collect();
        let stop = Arc::new(EventFd::new().map_err(|e| Error::Context(format!("eventfd: {e}")))?);
        let t = Transport {
            nics: nics.clone(),
            stop: stop.clone(),
            rpc: opts.rpc.clone(),
            gone,
            gone_for: opts.peer_gone_for,
        };
        let admission = Admission::new(opts.admission.clone());
        // From here on, an error drops the transport, which stops what
        // started.
        let transport = RdmaTransport {
            nics: RwLock::new(nics.clone()),
            names,
            registry: Registry::default(),
            opts,
            connector,
            admission,
            monitor: Mutex::new(None),
            monitor_stop: stop,
            closed: AtomicBool::new(false),
        };
        for n in &nics {
            n.start()?;
        }
        let monitor = std::thread::Builder::new()
            .name("te-rdma-monitor".into())
            .spawn(move || t.run())
            .map_err(|e| Error::Context(format!("starting the RDMA monitor thread: {e}")))?;
        *sync::lock(&transport.monitor) = Some(monitor);
        info!("rdma transport on {:?}", transport.names);
        Ok(transport)
    }

    fn nic(&self, device: usize) -> Option<Arc<Nic>> {
        sync::read(&self.nics).get(device).cloned()
    }

    /// Names of the devices in use, in index order.
    pub fn device_names(&self) -> &[String] {
        &self.names
    }

    /// The devices as published: name, LID and GID, in index order.
    pub fn devices(&self) -> Vec<DeviceInfo> {
        sync::read(&self.nics)
            .iter()
            .map(|n| DeviceInfo {
                name: n.name.clone(),
                lid: n.lid,
                gid: gid_to_string(&n.gid().gid),
            })
            .collect()
    }

    /// Whether device `device` takes slices now (its port is up).
    pub fn device_usable(&self, device: usize) -> bool {
        self.nic(device).is_some_and(|n| n.is_active())
    }

    /// Registers `[addr, addr + len)` on every device, with remote read
    /// and write when `remote`, in pieces of at most the devices' largest
    /// memory region; returns the pieces and keys to publish.
    ///
    /// # Safety
    /// The range must be mapped memory of this process that stays mapped
    /// until [`RdmaTransport::unregister`] returns for it.
    pub unsafe fn register(&self, addr: u64, len: u64, remote: bool) -> Result<Vec<BufferKeys>> {
        let nics = sync::read(&self.nics);
        let domains: Vec<DeviceDomain<'_>> = nics
            .iter()
            .map(|n| DeviceDomain {
                name: &n.name,
                pd: Some(&n.pd),
            })
            .collect();
        let opts = RegisterOptions {
            remote,
            relaxed: self.opts.cfg.relaxed_ordering,
            max_mr_size: nics.iter().map(|n| n.max_mr_size).min().unwrap_or(0),
            parallel: self.opts.cfg.parallel_reg_mr,
            max_concurrent: self.opts.cfg.max_concurrent_reg_mr,
        };
        // SAFETY: guaranteed by the caller.
        let reg = unsafe { self.registry.register(&domains, addr, len, opts)? };
        Ok(published(&reg))
    }

    /// The published pieces and keys of the buffer registered at `addr`.
    pub fn keys(&self, addr: u64) -> Option<Vec<BufferKeys>> {
        self.registry.get(addr).map(|reg| published(&reg))
    }

    /// The end of the registered piece holding `addr` when its buffer was
    /// registered in several pieces: a work request must not cross it.
    pub fn piece_end(&self, addr: u64) -> Option<u64> {
        self.registry.piece_end(addr)
    }

    /// Unregisters the buffer at `addr` once the work requests using it
    /// have ended (bounded by the completion timeout); returns whether one
    /// was registered there.
    pub fn unregister(&self, addr: u64) -> bool {
        let wait = self.opts.completion_timeout + MONITOR_INTERVAL * 4;
        self.registry.unregister(addr, wait)
    }

    /// Moves `slice` over device `device` to the peer device `target`
    /// with the peer's key `rkey` for its remote range. The local range
    /// must lie in one registered buffer (else the slice is rejected).
    pub fn post(&self, device: usize, target: &RdmaTarget, slice: Slice, rkey: u32) {
        if self.closed.load(Ordering::Acquire) {
            return slice.finish(Outcome::Failed { hard: false });
        }
        let Some(nic) = self.nic(device) else {
            return slice.finish(Outcome::Failed { hard: true });
        };
        if slice.len > u64::from(u32::MAX >> 1) {
            crate::log_limit::warn_limited!(
                "a slice of {} bytes is too large for one RDMA work request",
                slice.len
            );
            return slice.finish(Outcome::Rejected);
        }
        let Some((lkey, guard)) = self.registry.hold(slice.local, slice.len, device) else {
            crate::log_limit::warn_limited!(
                "{} bytes at {:#x} are not inside a registered buffer (unregistered \
                 while in flight?); the slice fails",
                slice.len,
                slice.local
            );
            return slice.finish(Outcome::Rejected);
        };
        nic.post(
            target,
            PostJob {
                slice,
                lkey,
                rkey,
                _hold: Some(guard),
            },
        );
    }

    /// Tests the rail from device `device` to `target` in the background:
    /// connects an endpoint if there is none and completes a zero-length
    /// RDMA WRITE on it; reports whether that worked.
    /// Its endpoint pools, every device together.
    pub fn endpoint_pool(&self) -> crate::transport::EndpointPool {
        crate::sync::read(&self.nics)
            .iter()
            .map(|n| n.endpoint_pool())
            .fold(Default::default(), |sum, p| {
                crate::transport::EndpointPool {
                    size: sum.size + p.size,
                    evictions: sum.evictions + p.evictions,
                }
            })
    }

    pub fn probe(&self, device: usize, target: &RdmaTarget, done: Box<dyn FnOnce(bool) + Send>) {
        let slice = Slice {
            local: 0,
            remote: 0,
            len: 0,
            write: true,
            local_gpu: None,
            local_fence: None,
            task: None,
            done: Box::new(move |o| done(o == Outcome::Done)),
        };
        match self.nic(device) {
            Some(nic) if !self.closed.load(Ordering::Acquire) => nic.post(
                target,
                PostJob {
                    slice,
                    lkey: 0,
                    rkey: 0,
                    _hold: None,
                },
            ),
            _ => report(vec![(slice, Outcome::Failed { hard: true })]),
        }
    }

    /// Looks up what peers publish with `lookup` from now on (the passive
    /// handshake's check refuses every request until then).
    pub fn set_peer_lookup(&self, lookup: PeerLookup) {
        self.admission.set_lookup(lookup);
    }

    /// Answers a peer's Connection request that came from `from` (the
    /// passive side of the handshake).
    pub fn accept(&self, request: &Value, from: SocketAddr) -> Value {
        let reply = match HandshakeDesc::from_json(request) {
            Err(e) => HandshakeDesc::rejection(e),
            Ok(_) if self.closed.load(Ordering::Acquire) => {
                HandshakeDesc::rejection("the RDMA transport is shutting down")
            }
            Ok(req) => self.accept_desc(&req, from),
        };
        if !reply.reply_msg.is_empty() {
            debug!(
                "refused a connection request from {from}: {}",
                reply.reply_msg
            );
        }
        reply.to_json()
    }

    fn accept_desc(&self, req: &HandshakeDesc, from: SocketAddr) -> HandshakeDesc {
        let Some((_, device)) = split_nic_path(&req.peer_nic_path) else {
            return HandshakeDesc::rejection(format!(
                "Invalid peer_nic_path in handshake: {:?}",
                req.peer_nic_path
            ));
        };
        let nic = sync::read(&self.nics)
            .iter()
            .find(|n| n.name == device)
            .cloned();
        let nic = match nic {
            None => {
                return HandshakeDesc::rejection(format!(
                    "Local RDMA context not found for handshake NIC: {device}"
                ));
            }
            Some(n) if n.path != req.peer_nic_path => {
                return HandshakeDesc::rejection(format!(
                    "Invalid argument: peer nic path inconsistency, expect {}, while got {}",
                    n.path, req.peer_nic_path
                ));
            }
            Some(n) => n,
        };
        let Some((server, peer_device)) = split_nic_path(&req.local_nic_path) else {
            return HandshakeDesc::rejection(format!(
                "Parse peer nic path failed: {:?}",
                req.local_nic_path
            ));
        };
        // A ready ACK may carry no GID; every other message needs one.
        let gid = parse_gid(&req.local_gid);
        if gid.is_none() && req.ready_ack != Some(true) {
            return HandshakeDesc::rejection(format!("Invalid peer GID: {:?}", req.local_gid));
        }
        if let Err(why) = self
            .admission
            .check(server, peer_device, gid.as_ref(), from.ip())
        {
            crate::log_limit::warn_limited!("refused an RDMA handshake from {from}: {why}");
            return HandshakeDesc::rejection(why);
        }
        nic.accept(req)
    }

    /// Fails queued and in-flight work (each slice ends exactly once),
    /// stops every thread, and releases every queue pair, memory region
    /// and device.
    pub fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.monitor_stop.wake();
        if let Some(t) = sync::lock(&self.monitor).take() {
            let _ = t.join();
        }
        self.connector.stop();
        let nics = std::mem::take(&mut *sync::write(&self.nics));
        for n in &nics {
            n.shutdown(SHUTDOWN_GRACE);
        }
        self.registry.clear();
        drop(nics);
    }
}

/// What is published of a registration: its pieces and their keys.
fn published(reg: &Registration) -> Vec<BufferKeys> {
    reg.pieces()
        .iter()
        .map(|p| BufferKeys {
            addr: p.addr,
            len: p.len,
            lkey: p.lkeys(),
            rkey: p.rkeys(reg.remote()),
        })
        .collect()
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Peers (server names) whose process is gone, until when: no handshake
/// is attempted with them meanwhile.
#[derive(Default)]
pub(crate) struct GonePeers {
    until: Mutex<HashMap<String, Instant>>,
}

impl GonePeers {
    /// Marks `server` gone for `dur`.
    fn mark(&self, server: &str, dur: Duration) {
        sync::lock(&self.until).insert(server.to_string(), Instant::now() + dur);
    }

    /// Whether `server` is marked gone now.
    pub(crate) fn is_gone(&self, server: &str) -> bool {
        let mut m = sync::lock(&self.until);
        match m.get(server) {
            Some(t) if *t > Instant::now() => true,
            Some(_) => {
                m.remove(server);
                false
            }
            None => false,
        }
    }
}

/// What the monitor thread holds.
struct Transport {
    nics: Vec<Arc<Nic>>,
    stop: Arc<EventFd>,
    rpc: ClientOptions,
    gone: Arc<GonePeers>,
    gone_for: Duration,
}

impl Transport {
    /// Handles asynchronous events and runs the periodic checks until
    /// stopped.
    fn run(self) {
        let mut fds = vec![self.stop.fd()];
        fds.extend(self.nics.iter().map(|n| n.context().async_fd()));
        let mut last = std::time::Instant::now();
        loop {
            let ready = wait_readable(&fds, MONITOR_INTERVAL);
            if ready[0] {
                return;
            }
            for (nic, _) in self.nics.iter().zip(&ready[1..]).filter(|(_, r)| **r) {
                self.events(nic);
            }
            if last.elapsed() >= MONITOR_INTERVAL {
                last = std::time::Instant::now();
                let mut stalled: Vec<(String, Option<(String, u16)>)> = Vec::new();
                for nic in &self.nics {
                    for s in nic.maintain() {
                        if !stalled.contains(&s) {
                            stalled.push(s);
                        }
                    }
                }
                for (server, rpc) in stalled {
                    self.check_peer(&server, rpc);
                }
            }
        }
    }

    /// An endpoint to `server` stopped completing: if its handshake
    /// listener does not answer a Probe either, the process is gone, and
    /// every endpoint to it fails over at once.
    fn check_peer(&self, server: &str, rpc: Option<(String, u16)>) {
        let Some((host, port)) = rpc else {
            return;
        };
        let opts = ClientOptions {
            connect_timeout: PEER_PROBE_TIMEOUT,
            io_timeout: PEER_PROBE_TIMEOUT,
            ..self.rpc.clone()
        };
        let probe = crate::rpc::call(&host, port, FrameKind::Probe, &serde_json::json!({}), &opts);
        if let Err(e) = probe {
            warn!(
                "RDMA peer {server} does not answer on {host}:{port} ({e}); failing every \
                 endpoint to it and not connecting to it for {:?}",
                self.gone_for
            );
            self.gone.mark(server, self.gone_for);
            for nic in &self.nics {
                nic.fail_peer(server);
            }
        }
    }

    /// The GID table may have changed: rank it again (the device publishes
    /// a new GID and retires its endpoints when the choice changed).
    fn gid_event(nic: &Nic) {
        match nic.refresh_gid() {
            GidRefresh::Unchanged => debug!("RDMA device {}: the GID in use stays", nic.name),
            GidRefresh::Changed(_) => {}
            GidRefresh::Failed(why) => {
                warn!(
                    "RDMA device {}: no usable GID after a GID change ({why}); retiring its \
                     endpoints",
                    nic.name
                );
                nic.fail_all(Outcome::Interrupted);
            }
        }
    }

    fn events(&self, nic: &Nic) {
        loop {
            let ev = match nic.context().next_async_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => return,
                Err(e) => {
                    warn!("RDMA device {}: reading async events: {e}", nic.name);
                    return;
                }
            };
            // Each port of a multi-port HCA is a rail with its own context,
            // and every context hears every port's events.
            if ev.port.is_some_and(|p| p != nic.port()) {
                continue;
            }
            info!(
                "RDMA device {}: async event {:?} (type {})",
                nic.name, ev.kind, ev.raw
            );
            match ev.kind {
                AsyncEventKind::PortError
                | AsyncEventKind::DeviceFatal
                | AsyncEventKind::CqError => nic.set_active(false),
                AsyncEventKind::PortActive => {
                    Self::gid_event(nic);
                    nic.set_active(true);
                }
                AsyncEventKind::GidChange => Self::gid_event(nic),
                AsyncEventKind::QpError => {
                    if let Some(q) = ev.qp_num {
                        nic.fail_qp(q);
                    }
                }
                AsyncEventKind::PortChange | AsyncEventKind::Other => {}
            }
        }
    }
}
