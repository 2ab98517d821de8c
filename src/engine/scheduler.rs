//! The slice scheduler: splits a request into slices, picks a rail for each
//! (local device by the buffer's location through the priority matrix,
//! then the least-loaded rail to the peer), and retries a failed slice on
//! another rail up to `MC_RETRY_CNT` times. Rails that fail are paused (see
//! [`super::rails`]). A task fails only when a slice runs out of attempts
//! or the peer rejects its address range.
//!
//! For TCP a device is a network interface; a rail pairs a local interface
//! with a peer interface on the same subnet. A peer that publishes no
//! devices (a Mooncake peer) is reached over one unbound rail.

use super::NicLoad;
use super::batch::Batch;
use super::memory::MemoryRegistry;
use super::planner;
use super::rails::{DeviceLoad, RailHealth, RailUse};
use super::segment::RemoteSegment;
use crate::config::Config;
use crate::topology::{IfAddr, NetInterface, PriorityMatrix};
use crate::transport::tcp::{LaneTarget, TcpTransport};
use crate::transport::{Outcome, Slice};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Descriptor field listing a host's TCP devices (ignored by Mooncake).
pub const TCP_DEVICES_KEY: &str = "tcp_devices";

/// Descriptor field that changes when its owner restarts or changes its
/// buffers (ignored by Mooncake).
pub const GENERATION_KEY: &str = "generation";

/// Name of the device load of the unbound rail.
const DEFAULT_DEVICE: &str = "default";

/// A local network interface used as a TCP device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpDevice {
    /// Interface name.
    pub name: String,
    /// The address lanes bind to.
    pub addr: IfAddr,
}

impl TcpDevice {
    /// The device entry published in our descriptor.
    pub fn to_json(&self) -> Value {
        json!({"name": self.name, "addr": self.addr.ip.to_string(), "prefix_len": self.addr.prefix_len})
    }

    /// Parses one published device; `None` if malformed.
    pub fn from_json(v: &Value) -> Option<TcpDevice> {
        let name = v.get("name")?.as_str()?.to_string();
        let ip: IpAddr = v.get("addr")?.as_str()?.parse().ok()?;
        let prefix_len = u8::try_from(v.get("prefix_len")?.as_u64()?).ok()?;
        (!name.is_empty()).then_some(TcpDevice {
            name,
            addr: IfAddr { ip, prefix_len },
        })
    }
}

/// The usable address of an interface: its first IPv4, else its first
/// IPv6 that is not link-local.
fn device_addr(nic: &NetInterface) -> Option<IfAddr> {
    let v4 = nic.addrs.iter().find(|a| a.ip.is_ipv4());
    let v6 = nic.addrs.iter().find(|a| match a.ip {
        IpAddr::V6(v6) => !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80,
        IpAddr::V4(_) => false,
    });
    v4.or(v6).copied()
}

/// The TCP devices named by `matrix`, with their addresses, in matrix
/// order; names missing here or without an address are skipped (logged).
pub fn tcp_devices(
    matrix: &PriorityMatrix,
    nics: &[NetInterface],
    filters: &[String],
) -> Vec<TcpDevice> {
    let mut out = Vec::new();
    for name in matrix.devices() {
        if !filters.is_empty() && !filters.contains(name) {
            continue;
        }
        match nics.iter().find(|n| &n.name == name).and_then(device_addr) {
            Some(addr) => out.push(TcpDevice {
                name: name.clone(),
                addr,
            }),
            None => warn!("tcp device {name} has no usable address here; not used"),
        }
    }
    out
}

/// One rail to a peer.
#[derive(Debug, Clone)]
pub struct Rail {
    /// Health key: `local@segment/remote`.
    key: String,
    /// Index into the scheduler's devices; `None` for the unbound rail.
    device: Option<usize>,
    target: LaneTarget,
}

/// The rails to one peer segment.
#[derive(Debug)]
pub struct Route {
    rails: Vec<Rail>,
    /// Set when a connection to the peer failed: its descriptor is
    /// refetched before the next submit (it may have restarted).
    stale: AtomicBool,
    /// When the descriptor was last refetched for that reason.
    refetched: Mutex<Option<Instant>>,
}

/// Shortest interval between refetches of a failing peer's descriptor.
const REFETCH_INTERVAL: Duration = Duration::from_secs(5);

impl Route {
    /// Whether to refetch the peer's descriptor now: a connection failed
    /// since the route was made, and no refetch for that happened in the
    /// last few seconds (so a peer that stays unreachable does not make
    /// every submit wait on it).
    pub fn take_refetch(&self) -> bool {
        if !self.stale.swap(false, Ordering::AcqRel) {
            return false;
        }
        let mut last = self.refetched.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < REFETCH_INTERVAL) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// Marks the route fresh again (the descriptor was refetched unchanged).
    pub fn refreshed(&self) {
        self.stale.store(false, Ordering::Release);
    }
}

/// One request to a remote segment, as the scheduler moves it.
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    /// Local address.
    pub local: u64,
    /// Address in the peer process.
    pub remote: u64,
    /// Bytes.
    pub len: u64,
    /// WRITE (true) or READ.
    pub write: bool,
}

/// A slice with what it needs to be retried.
struct Job {
    batch: Arc<Batch>,
    task: usize,
    local: u64,
    remote: u64,
    len: u64,
    write: bool,
    location: String,
    route: Arc<Route>,
    attempt: u32,
    rail: usize,
    /// Rails this slice failed on (bit `i % 64` for rail `i`).
    tried: u64,
}

fn bit(rail: usize) -> u64 {
    1 << (rail % 64)
}

/// Picks rails for slices and retries failed ones on other rails.
pub struct Scheduler {
    tcp: Arc<TcpTransport>,
    devices: Vec<TcpDevice>,
    matrix: PriorityMatrix,
    /// One per device, and the unbound rail's last.
    loads: Vec<DeviceLoad>,
    rail_loads: Mutex<HashMap<String, u64>>,
    health: Arc<RailHealth>,
    retry_cnt: u32,
    slice_size: u64,
    fragment_limit: u64,
    force_v1: bool,
    closed: AtomicBool,
}

impl Scheduler {
    /// A scheduler over `tcp` with local `devices` chosen by `matrix`.
    pub fn new(
        tcp: Arc<TcpTransport>,
        devices: Vec<TcpDevice>,
        matrix: PriorityMatrix,
        cfg: &Config,
    ) -> Scheduler {
        let mut loads: Vec<DeviceLoad> = devices
            .iter()
            .map(|d| DeviceLoad::new(d.name.clone()))
            .collect();
        loads.push(DeviceLoad::new(DEFAULT_DEVICE.into()));
        Scheduler {
            tcp,
            devices,
            matrix,
            loads,
            rail_loads: Mutex::new(HashMap::new()),
            health: Arc::new(RailHealth::new(Duration::from_secs(cfg.rail_pause_secs))),
            retry_cnt: cfg.retry_cnt,
            slice_size: cfg.slice_size,
            fragment_limit: cfg.fragment_limit,
            force_v1: cfg.tcp_force_v1,
            closed: AtomicBool::new(false),
        }
    }

    /// The transport.
    pub fn tcp(&self) -> &TcpTransport {
        &self.tcp
    }

    /// The local devices, for the published descriptor.
    pub fn devices(&self) -> &[TcpDevice] {
        &self.devices
    }

    /// The rails to `seg`: pairs of a local and a peer device on one
    /// subnet, or else one unbound rail to the segment's data host.
    pub fn route(&self, seg: &RemoteSegment) -> Route {
        let port = seg.desc.tcp_data_port;
        let v2 = seg.desc.tcp_proto_version >= 2 && !self.force_v1;
        let peer: Vec<TcpDevice> = seg
            .desc
            .extra
            .get(TCP_DEVICES_KEY)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(TcpDevice::from_json).collect())
            .unwrap_or_default();
        let mut rails = Vec::new();
        for (i, local) in self.devices.iter().enumerate() {
            for remote in peer.iter().filter(|r| local.addr.same_subnet(r.addr.ip)) {
                rails.push(Rail {
                    key: format!("{}@{}/{}", local.name, seg.name, remote.name),
                    device: Some(i),
                    target: LaneTarget {
                        bind: Some(local.addr.ip),
                        host: remote.addr.ip.to_string(),
                        port,
                        v2,
                    },
                });
            }
        }
        if rails.is_empty() {
            rails.push(Rail {
                key: format!("{DEFAULT_DEVICE}@{}", seg.name),
                device: None,
                target: LaneTarget {
                    bind: None,
                    host: seg.data_host.clone(),
                    port,
                    v2,
                },
            });
        }
        debug!(
            "route to {}: {:?}",
            seg.name,
            rails.iter().map(|r| &r.key).collect::<Vec<_>>()
        );
        Route {
            rails,
            stale: AtomicBool::new(false),
            refetched: Mutex::new(None),
        }
    }

    fn load_of(&self, rail: &Rail) -> &DeviceLoad {
        &self.loads[rail.device.unwrap_or(self.devices.len())]
    }

    /// Rail indexes in selection order for a location: open rails whose
    /// local device the matrix prefers first, then the rest (every rail
    /// when none is open); with the number preferred, and the rails back
    /// from a pause that wait for a probe.
    fn candidates(&self, route: &Route, location: &str) -> (Vec<usize>, usize, Vec<usize>) {
        let (pref, _) = self
            .matrix
            .entry(location)
            .or_else(|| self.matrix.entry("*"))
            .unwrap_or((&[], &[]));
        let preferred = |r: &Rail| match r.device {
            None => true,
            Some(i) => pref.is_empty() || pref.contains(&self.devices[i].name),
        };
        let mut open = Vec::with_capacity(route.rails.len());
        let mut probes = Vec::new();
        for (i, rail) in route.rails.iter().enumerate() {
            match self.health.state(&rail.key) {
                RailUse::Open => open.push(i),
                RailUse::Probe => probes.push(i),
                RailUse::Closed => {}
            }
        }
        if open.is_empty() {
            open = (0..route.rails.len()).collect();
        }
        let (mut first, rest): (Vec<usize>, Vec<usize>) =
            open.into_iter().partition(|&i| preferred(&route.rails[i]));
        let n_pref = first.len();
        first.extend(rest);
        (first, n_pref, probes)
    }

    /// The rail for a slice, among rails it has not failed on: on the
    /// first attempt the least-loaded open rail of the preferred group, on a
    /// retry the deterministic walk. `None` when no rail is left. A rail
    /// back from a pause is probed with a connect in the background; it
    /// takes slices again once that succeeds.
    fn pick(&self, route: &Route, location: &str, attempt: u32, tried: u64) -> Option<usize> {
        let (order, n_pref, probes) = self.candidates(route, location);
        for i in probes {
            let rail = &route.rails[i];
            if self.health.claim_probe(&rail.key) {
                let (health, key) = (self.health.clone(), rail.key.clone());
                self.tcp.probe(
                    &rail.target,
                    Box::new(move |ok| match ok {
                        true => health.record_success(&key),
                        false => health.record_error(&key, true),
                    }),
                );
            }
        }
        let untried = |i: &usize| tried & bit(*i) == 0;
        if attempt == 0 {
            let preferred: Vec<usize> = order[..n_pref].iter().copied().filter(untried).collect();
            let group: Vec<usize> = if preferred.is_empty() {
                order.iter().copied().filter(untried).collect()
            } else {
                preferred
            };
            let loads = self.rail_loads.lock().unwrap_or_else(|e| e.into_inner());
            return group
                .into_iter()
                .min_by_key(|&i| loads.get(&route.rails[i].key).copied().unwrap_or(0));
        }
        let left: Vec<usize> = order.into_iter().filter(untried).collect();
        (!left.is_empty()).then(|| left[(attempt as usize - 1) % left.len()])
    }

    /// Moves one request to a remote segment: slices counted on the task
    /// first, then each posted on its rail. Slices never cross the end of
    /// the local registered buffer that holds the source.
    pub fn submit(
        self: &Arc<Self>,
        batch: &Arc<Batch>,
        task: usize,
        seg: &RemoteSegment,
        memory: &MemoryRegistry,
        xfer: Transfer,
    ) {
        let Transfer {
            local,
            remote,
            len,
            write,
        } = xfer;
        let Some(t) = batch.slot(task) else {
            return;
        };
        let region = memory.find(local, 1);
        let location = region.map_or_else(|| "*".to_string(), |r| r.location.to_string());
        let boundary = region.map(|r| r.end() - local);
        let mut pieces = Vec::new();
        for (off, n) in planner::slices(len, self.slice_size, self.fragment_limit) {
            match boundary {
                Some(b) if off < b && off + n > b => {
                    pieces.push((off, b - off));
                    pieces.push((b, off + n - b));
                }
                _ => pieces.push((off, n)),
            }
        }
        t.add_slices(pieces.len() as u64);
        let route = seg.route.get_or_init(|| Arc::new(self.route(seg))).clone();
        for (off, n) in pieces {
            let Some(rail) = self.pick(&route, &location, 0, 0) else {
                t.finish_slice(n, false);
                continue;
            };
            self.post(Job {
                batch: batch.clone(),
                task,
                local: local + off,
                remote: remote + off,
                len: n,
                write,
                location: location.clone(),
                route: route.clone(),
                attempt: 0,
                rail,
                tried: 0,
            });
        }
    }

    fn post(self: &Arc<Self>, job: Job) {
        let rail = &job.route.rails[job.rail];
        self.load_of(rail).start(job.len);
        *self
            .rail_loads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(rail.key.clone())
            .or_default() += job.len;
        let device = rail.device.map(|i| self.devices[i].name.as_str());
        let target = rail.target.clone();
        let (local, remote, len, write) = (job.local, job.remote, job.len, job.write);
        let me = self.clone();
        let slice = Slice {
            local,
            remote,
            len,
            write,
            done: Box::new(move |o| me.finished(job, o)),
        };
        self.tcp.post(device, &target, slice);
    }

    fn finished(self: &Arc<Self>, mut job: Job, outcome: Outcome) {
        let rail = &job.route.rails[job.rail];
        let moved = if outcome == Outcome::Done { job.len } else { 0 };
        self.load_of(rail).finish(job.len, moved);
        if let Some(l) = self
            .rail_loads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&rail.key)
        {
            *l = l.saturating_sub(job.len);
        }
        let task = job.batch.slot(job.task);
        match outcome {
            Outcome::Done => {
                self.health.record_success(&rail.key);
                if let Some(t) = task {
                    t.finish_slice(job.len, true);
                }
            }
            Outcome::Rejected => {
                if let Some(t) = task {
                    t.finish_slice(job.len, false);
                }
            }
            Outcome::Failed { hard } => {
                self.health.record_error(&rail.key, hard);
                job.route.stale.store(true, Ordering::Release);
                job.attempt += 1;
                job.tried |= bit(job.rail);
                let closed = self.closed.load(Ordering::Acquire);
                let next = if closed || job.attempt >= self.retry_cnt {
                    None
                } else {
                    self.pick(&job.route, &job.location, job.attempt, job.tried)
                };
                let Some(next) = next else {
                    if !closed {
                        crate::warn_limited!(
                            "slice of {} bytes at {:#x} failed after {} attempt(s) on {} rail(s)",
                            job.len,
                            job.remote,
                            job.attempt,
                            job.tried.count_ones()
                        );
                    }
                    if let Some(t) = task {
                        t.finish_slice(job.len, false);
                    }
                    return;
                };
                job.rail = next;
                debug!(
                    "retrying a slice on rail {} (attempt {})",
                    job.route.rails[job.rail].key, job.attempt
                );
                self.post(job);
            }
        }
    }

    /// Per-device in-flight bytes and bandwidth.
    pub fn nic_loads(&self) -> Vec<NicLoad> {
        self.loads
            .iter()
            .map(|d| NicLoad {
                device: d.name.clone(),
                inflight_bytes: d.inflight(),
                ewma_bandwidth_bps: d.ewma_bps(),
            })
            .collect()
    }

    /// Stops retrying and closes the transport (in-flight slices fail).
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        self.tcp.shutdown();
    }
}
