//! The slice scheduler, shared by the rail-based transports (TCP, RDMA):
//! splits a request into slices, picks a rail for each, and retries a
//! failed slice on another rail up to `MC_RETRY_CNT` times. Rails that fail
//! are paused (see [`rails`]); `getNicLoadStats` reads the per-device loads
//! kept here. A slice that runs out of rails or attempts goes to the
//! request's fallback (the next transport), else fails its task; one whose
//! address range the peer rejects fails at once.
//!
//! A rail pairs a local device with a peer device; a [`Carrier`] (one per
//! transport) says which rails lead to a peer and moves one slice over
//! one rail, and holds what else makes it a [`Transport`]: registration,
//! its descriptor keys, its handshake. A [`Scheduler`] over a carrier is
//! the transport the engine installs. The first choice is the least-loaded open rail among those
//! the priority matrices prefer: our matrix for the local buffer's
//! location, and the peer's published matrix for the target buffer's
//! location (Mooncake's rule). A retry walks the rails the slice has not
//! failed on, deterministically.

pub mod planner;
pub mod rails;

use crate::batch::Batch;
use crate::error::Result;
use crate::memory::{MemoryRegistry, Region};
use crate::metadata::descriptor::SegmentDesc;
use crate::segment::RemoteSegment;
use crate::sync;
use crate::topology::PriorityMatrix;
use crate::transport::{
    Fallback, Handshake, LocalSide, NicLoad, Outcome, Slice, Submission, Transfer, Transport,
};
use rails::{DeviceLoad, RailHealth, RailUse};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::debug;

/// Descriptor field that changes when its owner restarts or changes its
/// buffers (ignored by Mooncake).
pub const GENERATION_KEY: &str = "generation";

/// How the scheduler slices requests and retries slices. Parsed from `MC_*`
/// variables by [`crate::engine::config::Config::from_env`]; the defaults are
/// Mooncake's.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedConfig {
    /// `MC_SLICE_SIZE`: bytes per slice of a large request (65536).
    pub slice_size: u64,
    /// Derived from `MC_FRAGMENT_RATIO`: a tail up to this size joins the
    /// previous slice (16384, or `slice_size / ratio`).
    pub fragment_limit: u64,
    /// `MC_RETRY_CNT`: attempts per slice before its task fails (9, 1..=127).
    pub retry_cnt: u32,
    /// `MC_RDMA_RAIL_PAUSE_SECONDS` (30, 1..=3599).
    pub rail_pause_secs: u64,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            slice_size: 65536,
            fragment_limit: 16384,
            retry_cnt: 9,
            rail_pause_secs: 30,
        }
    }
}

/// Name of the device load of a rail bound to no local device.
const DEFAULT_DEVICE: &str = "default";

/// One rail to a peer: a local device, a peer device, and what the
/// transport needs to reach it.
#[derive(Debug, Clone)]
pub struct Rail<T> {
    /// Health key: `local@segment/remote`.
    pub key: String,
    /// Index into the carrier's devices; `None` for an unbound rail.
    pub device: Option<usize>,
    /// Index into the peer descriptor's `devices`, if it has any.
    pub peer_device: Option<usize>,
    /// The transport's address of the peer device.
    pub target: T,
}

/// What the scheduler needs of a transport, and what the transport adds
/// to make it a [`Transport`].
pub trait Carrier: Send + Sync + 'static {
    /// The transport's address of a peer device.
    type Target: Clone + Send + Sync + std::fmt::Debug + 'static;

    /// See [`Transport::protocol`].
    fn protocol(&self) -> &'static str;

    /// See [`Transport::rank`].
    fn rank(&self) -> u8;

    /// See [`Transport::descriptor_rank`].
    fn descriptor_rank(&self) -> Option<u8>;

    /// See [`Transport::register`].
    ///
    /// # Safety
    /// As [`Transport::register`].
    unsafe fn register(&self, _region: &Region) -> Result<()> {
        Ok(())
    }

    /// See [`Transport::unregister`].
    fn unregister(&self, _addr: u64) {}

    /// See [`Transport::publish`]; `matrix` is the local priority matrix.
    fn publish(&self, desc: &mut SegmentDesc, memory: &MemoryRegistry, matrix: &PriorityMatrix);

    /// See [`Transport::handshake`].
    fn handshake(&self) -> Option<Handshake> {
        None
    }

    /// See [`Transport::speaks`].
    fn speaks(&self, seg: &RemoteSegment) -> bool;

    /// Whether the peer publishes what this transport needs to reach its
    /// buffer `buffer` (an index into `seg.desc.buffers`).
    fn reaches(&self, seg: &RemoteSegment, buffer: usize) -> bool;

    /// See [`Transport::needs_registered_source`].
    fn needs_registered_source(&self) -> bool {
        false
    }

    /// Local device names; rails index into them.
    fn devices(&self) -> &[String];

    /// The rails to a segment (at least one if it can be reached at all).
    fn rails(&self, seg: &RemoteSegment) -> Vec<Rail<Self::Target>>;

    /// Moves one slice over `rail`; `remote_key` is the peer's key for
    /// the target buffer on the rail's peer device (0 where none).
    fn post(&self, rail: &Rail<Self::Target>, slice: Slice, remote_key: u32);

    /// Tests a rail back from a pause without user data.
    fn probe(&self, rail: &Rail<Self::Target>, done: Box<dyn FnOnce(bool) + Send>);

    /// Whether local device `device` can carry slices now.
    fn device_usable(&self, _device: usize) -> bool {
        true
    }

    /// Largest slice the transport moves at once.
    fn max_slice(&self) -> u64 {
        u64::MAX
    }

    /// Whether some rails are bound to no local device (their load is
    /// reported as device `default`).
    fn unbound_rails(&self) -> bool {
        false
    }

    /// Whether slices still go to paused rails when every rail to the
    /// peer is paused (rather than failing at once).
    fn uses_paused_rails(&self) -> bool {
        true
    }

    /// Whether a slice may go back to a rail it had an error on (not a
    /// failed connect) once every rail failed: true where an error ends
    /// only the connection it happened on, which is replaced.
    fn retries_failed_rails(&self) -> bool {
        false
    }

    /// Fails in-flight work and stops.
    fn shutdown(&self);
}

/// The rails to one peer segment, with the peer's preferences.
#[derive(Debug)]
pub struct Route<T> {
    rails: Vec<Rail<T>>,
    peer_matrix: Option<PriorityMatrix>,
    peer_devices: Vec<String>,
}

/// A slice with what it needs to be retried.
struct Job<T> {
    batch: Arc<Batch>,
    task: usize,
    local: u64,
    remote: u64,
    len: u64,
    write: bool,
    location: String,
    seg: Arc<RemoteSegment>,
    /// Index of the target buffer in the peer's descriptor.
    buffer: Option<usize>,
    route: Arc<Route<T>>,
    attempt: u32,
    rail: usize,
    /// Rails this slice failed on.
    tried: RailSet,
    /// Rails this slice failed on hard (could not connect).
    dead: RailSet,
    /// Where the slice goes when no rail is left.
    fallback: Option<Fallback>,
}

/// A set of rail indexes, exact for any number of rails; allocates only
/// when a rail is added (a slice that failed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct RailSet(Vec<u64>);

impl RailSet {
    fn insert(&mut self, rail: usize) {
        let word = rail / 64;
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << (rail % 64);
    }

    fn contains(&self, rail: usize) -> bool {
        self.0
            .get(rail / 64)
            .is_some_and(|w| w & (1 << (rail % 64)) != 0)
    }

    fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
}

/// Picks rails for slices and retries failed ones on other rails.
pub struct Scheduler<C: Carrier> {
    carrier: C,
    matrix: PriorityMatrix,
    /// One per device, and the unbound rails' last.
    loads: Vec<DeviceLoad>,
    rail_loads: Mutex<HashMap<String, u64>>,
    health: Arc<RailHealth>,
    retry_cnt: u32,
    slice_size: u64,
    fragment_limit: u64,
    closed: AtomicBool,
    /// Itself, for the completions of the slices it posts.
    me: std::sync::Weak<Scheduler<C>>,
}

impl<C: Carrier> Scheduler<C> {
    /// A scheduler over `carrier` whose local devices are chosen by
    /// `matrix`.
    pub fn new(carrier: C, matrix: PriorityMatrix, cfg: &SchedConfig) -> Arc<Scheduler<C>> {
        let mut loads: Vec<DeviceLoad> = carrier
            .devices()
            .iter()
            .map(|d| DeviceLoad::new(d.clone()))
            .collect();
        loads.push(DeviceLoad::new(DEFAULT_DEVICE.into()));
        let slice_size = cfg.slice_size.min(carrier.max_slice());
        Arc::new_cyclic(|me| Scheduler {
            carrier,
            matrix,
            loads,
            rail_loads: Mutex::new(HashMap::new()),
            health: Arc::new(RailHealth::new(Duration::from_secs(cfg.rail_pause_secs))),
            retry_cnt: cfg.retry_cnt,
            fragment_limit: cfg.fragment_limit.min(slice_size),
            slice_size,
            closed: AtomicBool::new(false),
            me: me.clone(),
        })
    }

    fn route(&self, seg: &RemoteSegment) -> Route<C::Target> {
        let rails = self.carrier.rails(seg);
        debug!(
            "route to {}: {:?}",
            seg.name,
            rails.iter().map(|r| &r.key).collect::<Vec<_>>()
        );
        let peer_matrix = seg
            .desc
            .priority_matrix
            .as_ref()
            .and_then(|m| PriorityMatrix::parse(&m.to_string()).ok());
        Route {
            rails,
            peer_matrix,
            peer_devices: seg.desc.devices.iter().map(|d| d.name.clone()).collect(),
        }
    }

    /// The cached rails to `seg`, worked out on first use.
    fn route_of(&self, seg: &RemoteSegment) -> Arc<Route<C::Target>> {
        seg.routes.get_or_insert(|| self.route(seg))
    }

    fn load_of(&self, rail: &Rail<C::Target>) -> &DeviceLoad {
        &self.loads[rail.device.unwrap_or(self.loads.len() - 1)]
    }

    /// Rail indexes in selection order for a local and a peer location:
    /// open rails that both matrices prefer first, then the rest (every
    /// usable rail when none is open, for carriers that use paused rails);
    /// with the number preferred, and the rails back from a pause that wait
    /// for a probe.
    fn candidates(
        &self,
        route: &Route<C::Target>,
        location: &str,
        peer_location: &str,
    ) -> (Vec<usize>, usize, Vec<usize>) {
        let (pref, _) = self
            .matrix
            .entry(location)
            .or_else(|| self.matrix.entry("*"))
            .unwrap_or((&[], &[]));
        let devices = self.carrier.devices();
        let peer_pref: Option<&[String]> = route.peer_matrix.as_ref().and_then(|m| {
            m.entry(peer_location)
                .or_else(|| m.entry("*"))
                .map(|(p, _)| p)
                .filter(|p| !p.is_empty())
        });
        let preferred = |r: &Rail<C::Target>| {
            let local = match r.device {
                None => true,
                Some(i) => pref.is_empty() || pref.contains(&devices[i]),
            };
            let peer = match (peer_pref, r.peer_device) {
                (Some(p), Some(j)) => route.peer_devices.get(j).is_some_and(|n| p.contains(n)),
                _ => true,
            };
            local && peer
        };
        let usable = |r: &Rail<C::Target>| r.device.is_none_or(|i| self.carrier.device_usable(i));
        let mut open = Vec::with_capacity(route.rails.len());
        let mut probes = Vec::new();
        for (i, rail) in route.rails.iter().enumerate() {
            if !usable(rail) {
                continue;
            }
            match self.health.state(&rail.key) {
                RailUse::Open => open.push(i),
                RailUse::Probe => probes.push(i),
                RailUse::Closed => {}
            }
        }
        if open.is_empty() && self.carrier.uses_paused_rails() {
            open = (0..route.rails.len())
                .filter(|&i| usable(&route.rails[i]))
                .collect();
            if open.is_empty() {
                open = (0..route.rails.len()).collect();
            }
        }
        let (mut first, rest): (Vec<usize>, Vec<usize>) =
            open.into_iter().partition(|&i| preferred(&route.rails[i]));
        let n_pref = first.len();
        first.extend(rest);
        (first, n_pref, probes)
    }

    /// The rail for a slice, among rails it has not failed on: on the
    /// first attempt the least-loaded open rail of the preferred group, on a
    /// retry the deterministic walk (then, for carriers that allow it, over
    /// the rails that only had errors). `None` when no rail is left. A rail
    /// back from a pause is probed in the background; it takes slices
    /// again once that succeeds.
    fn pick(
        &self,
        route: &Route<C::Target>,
        location: &str,
        peer_location: &str,
        attempt: u32,
        tried: &RailSet,
        dead: &RailSet,
    ) -> Option<usize> {
        let (order, n_pref, probes) = self.candidates(route, location, peer_location);
        for i in probes {
            let rail = &route.rails[i];
            if self.health.claim_probe(&rail.key) {
                let (health, key) = (self.health.clone(), rail.key.clone());
                self.carrier.probe(
                    rail,
                    Box::new(move |ok| match ok {
                        true => health.record_success(&key),
                        false => health.record_error(&key, true),
                    }),
                );
            }
        }
        let untried = |i: &usize| !tried.contains(*i);
        if attempt == 0 {
            let preferred: Vec<usize> = order[..n_pref].iter().copied().filter(untried).collect();
            let group: Vec<usize> = if preferred.is_empty() {
                order.iter().copied().filter(untried).collect()
            } else {
                preferred
            };
            let loads = sync::lock(&self.rail_loads);
            return group
                .into_iter()
                .min_by_key(|&i| loads.get(&route.rails[i].key).copied().unwrap_or(0));
        }
        let mut left: Vec<usize> = order.iter().copied().filter(untried).collect();
        if left.is_empty() && self.carrier.retries_failed_rails() {
            // Every rail failed once: those that only had an error (not a
            // failed connect) are tried again, up to `MC_RETRY_CNT`.
            left = order.into_iter().filter(|i| !dead.contains(*i)).collect();
        }
        (!left.is_empty()).then(|| left[(attempt as usize - 1) % left.len()])
    }

    /// Moves one request to a remote segment: slices counted on the task
    /// first, then each posted on its rail. Slices never cross the end of
    /// the local registered buffer that holds the source.
    pub fn submit(self: &Arc<Self>, sub: Submission) {
        let Submission {
            batch,
            task,
            seg,
            xfer,
            local: LocalSide { location, end },
            fallback,
        } = sub;
        let Transfer {
            local,
            remote,
            len,
            write,
        } = xfer;
        let Some(t) = batch.slot(task) else {
            return;
        };
        let boundary = end.map(|e| e.saturating_sub(local));
        let buffer = seg.desc.find_buffer(remote, len);
        let peer_location = buffer.map_or("*", |b| seg.desc.buffers[b].name.as_str());
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
        let route = self.route_of(&seg);
        let none = RailSet::default();
        for (off, n) in pieces {
            let Some(rail) = self.pick(&route, &location, peer_location, 0, &none, &none) else {
                let part = Transfer {
                    local: local + off,
                    remote: remote + off,
                    len: n,
                    write,
                };
                let handed = Submission::fall_back(&fallback, part);
                t.finish_slice(0, handed);
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
                seg: seg.clone(),
                buffer,
                route: route.clone(),
                attempt: 0,
                rail,
                tried: RailSet::default(),
                dead: RailSet::default(),
                fallback: fallback.clone(),
            });
        }
    }

    fn post(self: &Arc<Self>, job: Job<C::Target>) {
        let route = job.route.clone();
        let rail = &route.rails[job.rail];
        self.load_of(rail).start(job.len);
        *sync::lock(&self.rail_loads)
            .entry(rail.key.clone())
            .or_default() += job.len;
        let remote_key = match (job.buffer, rail.peer_device) {
            (Some(b), Some(j)) => job.seg.desc.buffers[b].rkey.get(j).copied().unwrap_or(0),
            _ => 0,
        };
        let (local, remote, len, write) = (job.local, job.remote, job.len, job.write);
        let me = self.clone();
        let slice = Slice {
            local,
            remote,
            len,
            write,
            done: Box::new(move |o| me.finished(job, o)),
        };
        self.carrier.post(rail, slice, remote_key);
    }

    fn finished(self: &Arc<Self>, mut job: Job<C::Target>, outcome: Outcome) {
        let rail = &job.route.rails[job.rail];
        let moved = if outcome == Outcome::Done { job.len } else { 0 };
        self.load_of(rail).finish(job.len, moved);
        if let Some(l) = sync::lock(&self.rail_loads).get_mut(&rail.key) {
            *l = l.saturating_sub(job.len);
        }
        let task = job.batch.slot(job.task);
        let charge = match outcome {
            Outcome::Done => {
                self.health.record_success(&rail.key);
                if let Some(t) = task {
                    t.finish_slice(job.len, true);
                }
                return;
            }
            Outcome::Rejected => {
                if let Some(t) = task {
                    t.finish_slice(job.len, false);
                }
                return;
            }
            Outcome::Failed { hard } => Some(hard),
            // The rail's transport cannot reach the peer: as a rail that
            // cannot connect.
            Outcome::Unreachable => Some(true),
            Outcome::Interrupted => None,
        };
        if let Some(hard) = charge {
            self.health.record_error(&rail.key, hard);
            job.seg.freshness.mark_stale();
            job.tried.insert(job.rail);
            if hard {
                job.dead.insert(job.rail);
            }
        }
        job.attempt += 1;
        let closed = self.closed.load(Ordering::Acquire);
        let peer_location = job
            .buffer
            .map_or("*", |b| job.seg.desc.buffers[b].name.as_str());
        // Not the rail's fault: the same rail again, unless it is out.
        let same_rail_usable = || {
            let (order, _, _) = self.candidates(&job.route, &job.location, peer_location);
            order.contains(&job.rail) && !job.tried.contains(job.rail)
        };
        let next = if closed || job.attempt >= self.retry_cnt {
            None
        } else if charge.is_none() && same_rail_usable() {
            Some(job.rail)
        } else {
            self.pick(
                &job.route,
                &job.location,
                peer_location,
                job.attempt,
                &job.tried,
                &job.dead,
            )
        };
        let Some(next) = next else {
            let part = Transfer {
                local: job.local,
                remote: job.remote,
                len: job.len,
                write: job.write,
            };
            // The next transport takes the slice over (its slices are
            // counted before this one ends, so the task stays open).
            if !closed && Submission::fall_back(&job.fallback, part) {
                if let Some(t) = task {
                    t.finish_slice(0, true);
                }
                return;
            }
            if !closed {
                crate::warn_limited!(
                    "slice of {} bytes at {:#x} failed after {} attempt(s) on {} rail(s)",
                    job.len,
                    job.remote,
                    job.attempt,
                    job.tried.len()
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

    /// Per-device in-flight bytes and bandwidth.
    pub fn nic_loads(&self) -> Vec<NicLoad> {
        let n = self.loads.len() - usize::from(!self.carrier.unbound_rails());
        self.loads[..n]
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
        self.carrier.shutdown();
    }
}

impl<C: Carrier> Transport for Scheduler<C> {
    fn protocol(&self) -> &'static str {
        self.carrier.protocol()
    }

    fn rank(&self) -> u8 {
        self.carrier.rank()
    }

    fn descriptor_rank(&self) -> Option<u8> {
        self.carrier.descriptor_rank()
    }

    unsafe fn register(&self, region: &Region) -> Result<()> {
        // SAFETY: the caller keeps the region mapped until it is
        // unregistered, as this trait method requires.
        unsafe { self.carrier.register(region) }
    }

    fn unregister(&self, addr: u64) {
        self.carrier.unregister(addr)
    }

    fn publish(&self, desc: &mut SegmentDesc, memory: &MemoryRegistry) {
        self.carrier.publish(desc, memory, &self.matrix)
    }

    fn handshake(&self) -> Option<Handshake> {
        self.carrier.handshake()
    }

    fn speaks(&self, seg: &RemoteSegment) -> bool {
        self.carrier.speaks(seg)
    }

    fn reaches(&self, seg: &RemoteSegment, remote: u64, len: u64) -> bool {
        seg.desc
            .find_buffer(remote, len)
            .is_some_and(|b| self.carrier.reaches(seg, b))
    }

    fn needs_registered_source(&self) -> bool {
        self.carrier.needs_registered_source()
    }

    fn submit(&self, submission: Submission) {
        match self.me.upgrade() {
            Some(me) => Scheduler::submit(&me, submission),
            // Only while the scheduler is being dropped: nothing runs.
            None => {
                if let Some(t) = submission.batch.slot(submission.task) {
                    t.add_slices(1);
                    t.finish_slice(0, false);
                }
            }
        }
    }

    fn nic_loads(&self) -> Vec<NicLoad> {
        Scheduler::nic_loads(self)
    }

    fn shutdown(&self) {
        Scheduler::shutdown(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::TaskStatus;
    use crate::metadata::descriptor::{BufferDesc, SegmentDesc};

    /// Rails numbered 0..n; a slice posted on any rail but `good` fails.
    struct Rails {
        names: Vec<String>,
        n: usize,
        good: usize,
    }

    impl Carrier for Rails {
        type Target = usize;

        fn protocol(&self) -> &'static str {
            "test"
        }

        fn rank(&self) -> u8 {
            0
        }

        fn descriptor_rank(&self) -> Option<u8> {
            None
        }

        fn publish(&self, _: &mut SegmentDesc, _: &MemoryRegistry, _: &PriorityMatrix) {}

        fn speaks(&self, _: &RemoteSegment) -> bool {
            true
        }

        fn reaches(&self, _: &RemoteSegment, _: usize) -> bool {
            true
        }

        fn devices(&self) -> &[String] {
            &self.names
        }

        fn rails(&self, seg: &RemoteSegment) -> Vec<Rail<usize>> {
            (0..self.n)
                .map(|i| Rail {
                    key: format!("rail{i}@{}", seg.name),
                    device: None,
                    peer_device: None,
                    target: i,
                })
                .collect()
        }

        fn post(&self, rail: &Rail<usize>, slice: Slice, _remote_key: u32) {
            slice.finish(if rail.target == self.good {
                Outcome::Done
            } else {
                Outcome::Failed { hard: false }
            });
        }

        fn probe(&self, _rail: &Rail<usize>, done: Box<dyn FnOnce(bool) + Send>) {
            done(false)
        }

        fn shutdown(&self) {}
    }

    #[test]
    fn a_retry_reaches_every_rail_beyond_64() {
        let (n, good) = (70, 64);
        let cfg = SchedConfig {
            retry_cnt: 127,
            ..SchedConfig::default()
        };
        let carrier = Rails {
            names: Vec::new(),
            n,
            good,
        };
        let matrix = PriorityMatrix::parse("{}").unwrap();
        let sched = Scheduler::new(carrier, matrix, &cfg);
        let seg = Arc::new(RemoteSegment {
            name: "peer".into(),
            desc: SegmentDesc {
                protocol: "tcp".into(),
                buffers: vec![BufferDesc {
                    name: "peer".into(),
                    addr: 0x1000,
                    length: 4096,
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        });
        let batch = Arc::new(Batch::new(1, None).unwrap());
        let memory = MemoryRegistry::default();
        batch
            .append(1, |first, _| {
                sched.submit(Submission {
                    batch: batch.clone(),
                    task: first,
                    seg: seg.clone(),
                    xfer: Transfer {
                        local: 0x9000,
                        remote: 0x1000,
                        len: 4096,
                        write: true,
                    },
                    local: LocalSide::of(&memory, 0x9000),
                    fallback: None,
                });
                Ok(())
            })
            .unwrap();
        // Rail 64 is the one rail that works: a retry must not take it for
        // rail 0, which failed first.
        assert_eq!(batch.poll(0).unwrap(), (TaskStatus::Completed, 4096));
    }

    #[test]
    fn a_slice_out_of_rails_goes_to_the_fallback() {
        let carrier = Rails {
            names: Vec::new(),
            n: 3,
            good: usize::MAX,
        };
        let matrix = PriorityMatrix::parse("{}").unwrap();
        let sched = Scheduler::new(carrier, matrix, &SchedConfig::default());
        let seg = Arc::new(RemoteSegment {
            name: "peer".into(),
            desc: SegmentDesc {
                protocol: "tcp".into(),
                buffers: vec![BufferDesc {
                    name: "peer".into(),
                    addr: 0x1000,
                    length: 1 << 20,
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        });
        let batch = Arc::new(Batch::new(1, None).unwrap());
        let parts = Arc::new(Mutex::new(Vec::new()));
        let (b, p) = (batch.clone(), parts.clone());
        // The next transport: counts the part on the task and moves it.
        let fallback: Fallback = Arc::new(move |part: Transfer| {
            p.lock().unwrap().push((part.remote, part.len));
            let t = b.slot(0).unwrap();
            t.add_slices(1);
            t.finish_slice(part.len, true);
        });
        let len = 3 * 65536;
        batch
            .append(1, |first, _| {
                sched.submit(Submission {
                    batch: batch.clone(),
                    task: first,
                    seg: seg.clone(),
                    xfer: Transfer {
                        local: 0x9000,
                        remote: 0x1000,
                        len,
                        write: true,
                    },
                    local: LocalSide::of(&MemoryRegistry::default(), 0x9000),
                    fallback: Some(fallback),
                });
                Ok(())
            })
            .unwrap();
        // Every rail fails: each slice goes to the fallback, whole, and the
        // task completes with the bytes the fallback moved.
        assert_eq!(batch.poll(0).unwrap(), (TaskStatus::Completed, len));
        let mut got = parts.lock().unwrap().clone();
        got.sort();
        assert_eq!(
            got,
            (0..3)
                .map(|i| (0x1000 + i * 65536, 65536))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn rail_sets_are_exact() {
        let mut s = RailSet::default();
        assert!(!s.contains(0) && s.len() == 0);
        s.insert(0);
        s.insert(64);
        s.insert(200);
        assert!(s.contains(0) && s.contains(64) && s.contains(200));
        assert!(!s.contains(1) && !s.contains(128) && !s.contains(1000));
        assert_eq!(s.len(), 3);
    }
}
