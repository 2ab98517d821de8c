//! The slice scheduler, shared by the rail-based transports (TCP, RDMA):
//! splits a request into slices, picks a rail for each, and retries a
//! failed slice on another rail up to `MC_RETRY_CNT` times. Rails that fail
//! are paused, and so are local devices whose slices keep failing (see
//! [`rails`]); `getNicLoadStats` reads the per-device loads kept here. A
//! slice that runs out of rails or attempts goes to the request's fallback
//! (the next transport), else fails its task. One whose range or key the
//! peer refuses (`IBV_WC_REM_ACCESS_ERR`: the peer may have registered the
//! buffer again) is retried once with the peer's descriptor refetched in
//! the background, if that descriptor changed; else it fails.
//!
//! A rail pairs a local device with a peer device; a [`Carrier`] (one per
//! transport) says which rails lead to a peer and moves one slice over
//! one rail, and holds what else makes it a [`Transport`]: its
//! [`TransportBase`] (registration, its handshake), its descriptor keys. A [`Scheduler`] over a carrier is
//! the transport the engine installs. The first choice is among the open
//! rails the priority matrices prefer: our matrix for the local buffer's
//! location, and the peer's published matrix for the target buffer's
//! location (Mooncake's rule); the least-loaded one (ties in turn), or with
//! `MC_PATH_ROUNDROBIN` the next in turn. A retry walks the rails the slice
//! has not failed on, deterministically. Slices are cut at the edges of the
//! local buffer, of the carrier's registration pieces and of the peer's
//! buffers, so a request may span adjacent peer buffers.
//!
//! The slice path takes no lock: a route (rails, their health cells, the
//! preferences of both matrices per pair of locations) is worked out once
//! per peer descriptor, a request's candidates (with the rails' loads,
//! which its slices then add to locally) once per request, and a slice
//! touches only atomics, each in a stripe of the thread's own (rail and
//! device byte counters), so threads do not contend.

#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod bench;
#[cfg(any(test, feature = "bench-internals"))]
mod plain;
pub mod planner;
pub mod rails;

use crate::batch::Batch;
use crate::error::Result;
use crate::memory::{MemoryRegistry, Region};
use crate::metadata::descriptor::SegmentDesc;
use crate::segment::{RemoteSegment, RouteSlot};
use crate::topology::PriorityMatrix;
use crate::transport::{
    Fallback, Handshake, Kind, LocalSide, NicLoad, Outcome, Refresh, Slice, Submission, Transfer,
    Transport, TransportBase,
};
use once_cell::sync::OnceCell;
use rails::{DeviceLoad, RailCell, RailHealth, RailUse};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// `MC_PATH_ROUNDROBIN`: the first choice among the preferred open
    /// rails goes round in turn (per thread) instead of to the least
    /// loaded (false).
    pub round_robin: bool,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            slice_size: 65536,
            fragment_limit: 16384,
            retry_cnt: 9,
            rail_pause_secs: 30,
            round_robin: false,
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

/// What the scheduler needs of a transport beside its [`TransportBase`],
/// and what the transport adds to make it a [`Transport`].
pub trait Carrier: TransportBase + 'static {
    /// The transport's address of a peer device.
    type Target: Clone + Send + Sync + std::fmt::Debug + 'static;

    /// See [`Transport::publish`]; `matrix` is the local priority matrix.
    fn publish(&self, desc: &mut SegmentDesc, memory: &MemoryRegistry, matrix: &PriorityMatrix);

    /// Whether the peer publishes what this transport needs to reach its
    /// buffer `buffer` (an index into `seg.desc.buffers`).
    fn reaches(&self, seg: &RemoteSegment, buffer: usize) -> bool;

    /// Local device names; rails index into them.
    fn devices(&self) -> &[String];

    /// The rails to a segment (at least one if it can be reached at all).
    fn rails(&self, seg: &RemoteSegment) -> Vec<Rail<Self::Target>>;

    /// Where a segment keeps this carrier's route to it (worked out on
    /// first use; the scheduler reads it back as its [`Route`]).
    fn routes(seg: &RemoteSegment) -> &RouteSlot;

    /// The end of the carrier's own registration piece holding local
    /// address `addr`, when it registers smaller pieces than the caller's
    /// buffer (slices are not cut across it); `None` when its piece is the
    /// whole buffer.
    fn local_limit(&self, _addr: u64) -> Option<u64> {
        None
    }

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

    /// Why `rail` last failed to connect, while that failure stands (the
    /// reason a task that failed on it reports); `None` when unknown.
    fn failure(&self, _rail: &Rail<Self::Target>) -> Option<String> {
        None
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

/// The rails of a route that both matrices prefer for one pair of
/// locations, and the others, each in rail order.
#[derive(Debug)]
struct Group {
    preferred: Box<[usize]>,
    rest: Box<[usize]>,
}

/// Index of `loc` among `locs`, else of `*`, else `locs.len()` (no entry).
fn slot_of(locs: &[String], loc: &str) -> usize {
    locs.iter()
        .position(|l| l == loc)
        .or_else(|| locs.iter().position(|l| l == "*"))
        .unwrap_or(locs.len())
}

/// The rails to one peer segment, with their health cells and the
/// preferences of both matrices worked out once for every pair of
/// locations (ours, the peer's).
pub struct Route<T> {
    rails: Vec<Rail<T>>,
    /// One per rail.
    cells: Vec<Arc<RailCell>>,
    /// Locations of our matrix; slot `len()` is a location without entry.
    local_locs: Vec<String>,
    /// Locations of the peer's matrix, likewise.
    peer_locs: Vec<String>,
    /// The peer location slot of each buffer of the descriptor.
    buffer_slots: Vec<usize>,
    /// By `local slot * (peer_locs.len() + 1) + peer slot`.
    groups: Vec<Group>,
}

impl<T> std::fmt::Debug for Route<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field(
                "rails",
                &self.rails.iter().map(|r| &r.key).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl<T> Route<T> {
    fn group(&self, local_slot: usize, buffer: Option<usize>) -> &Group {
        let peer = buffer.map_or_else(|| slot_of(&self.peer_locs, "*"), |b| self.buffer_slots[b]);
        &self.groups[local_slot * (self.peer_locs.len() + 1) + peer]
    }
}

/// Rails in selection order: open rails of the preferred group first, then
/// the other open ones; with the number preferred, and each one's bytes in
/// flight when they were listed plus what this request has put on it
/// since (a request's slices read the shared counters once).
struct Candidates {
    order: Vec<usize>,
    n_pref: usize,
    loads: Vec<u64>,
}

/// One request's slices share what does not change between them.
struct Request<C: Carrier> {
    sched: Arc<Scheduler<C>>,
    batch: Arc<Batch>,
    task: usize,
    write: bool,
    /// Slot of the local buffer's location in the route.
    local_slot: usize,
    seg: Arc<RemoteSegment>,
    route: Arc<Route<C::Target>>,
    /// Where the slice goes when no rail is left.
    fallback: Option<Fallback>,
    /// How the peer's descriptor is refetched when it refuses a key.
    refresh: Option<Refresh>,
    /// The request on the peer's refetched descriptor, once a refused
    /// slice found it changed: the other slices move to it when they are
    /// retried (rather than carry the stale key again).
    successor: OnceCell<Arc<Request<C>>>,
}

/// A slice with what it needs to be retried.
struct Job<C: Carrier> {
    req: Arc<Request<C>>,
    local: u64,
    remote: u64,
    len: u64,
    /// Index of the target buffer in the peer's descriptor.
    buffer: Option<usize>,
    attempt: u32,
    rail: usize,
    /// Rails this slice failed on.
    tried: RailSet,
    /// Rails this slice failed on hard (could not connect).
    dead: RailSet,
    /// The peer refused it once and its descriptor was refetched.
    refreshed: bool,
    /// The device's failure round when the slice was posted.
    round: u64,
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

thread_local! {
    /// Per-thread counter of first choices: `MC_PATH_ROUNDROBIN`'s turn,
    /// and where the least-loaded scan starts.
    static TURN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Picks rails for slices and retries failed ones on other rails.
pub struct Scheduler<C: Carrier> {
    carrier: C,
    matrix: PriorityMatrix,
    /// One per device, and the unbound rails' last.
    loads: Vec<DeviceLoad>,
    health: RailHealth,
    retry_cnt: u32,
    slice_size: u64,
    fragment_limit: u64,
    round_robin: bool,
    closed: AtomicBool,
    /// Itself, for the completions of the slices it posts.
    me: std::sync::Weak<Scheduler<C>>,
}

impl<C: Carrier> Scheduler<C> {
    /// A scheduler over `carrier` whose local devices are chosen by
    /// `matrix`.
    pub fn new(carrier: C, matrix: PriorityMatrix, cfg: &SchedConfig) -> Arc<Scheduler<C>> {
        let pause = Duration::from_secs(cfg.rail_pause_secs);
        let mut loads: Vec<DeviceLoad> = carrier
            .devices()
            .iter()
            .map(|d| DeviceLoad::new(d.clone(), pause))
            .collect();
        loads.push(DeviceLoad::new(DEFAULT_DEVICE.into(), pause));
        let slice_size = cfg.slice_size.min(carrier.max_slice());
        Arc::new_cyclic(|me| Scheduler {
            carrier,
            matrix,
            loads,
            health: RailHealth::new(pause),
            retry_cnt: cfg.retry_cnt,
            fragment_limit: cfg.fragment_limit.min(slice_size),
            slice_size,
            round_robin: cfg.round_robin,
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
        let cells = rails.iter().map(|r| self.health.cell(&r.key)).collect();
        let peer_matrix = seg.desc.peer_matrix();
        let local_locs: Vec<String> = self.matrix.locations().map(str::to_owned).collect();
        let peer_locs: Vec<String> = peer_matrix
            .as_ref()
            .map(|m| m.locations().map(str::to_owned).collect())
            .unwrap_or_default();
        let devices = self.carrier.devices();
        let peer_devices = &seg.desc.devices;
        let mut groups = Vec::new();
        for l in 0..=local_locs.len() {
            let pref: &[String] = local_locs
                .get(l)
                .and_then(|loc| self.matrix.entry(loc))
                .map_or(&[], |(p, _)| p);
            for p in 0..=peer_locs.len() {
                let peer_pref: Option<&[String]> = peer_locs
                    .get(p)
                    .zip(peer_matrix.as_ref())
                    .and_then(|(loc, m)| m.entry(loc))
                    .map(|(p, _)| p)
                    .filter(|p| !p.is_empty());
                let preferred = |r: &Rail<C::Target>| {
                    let local = match r.device {
                        None => true,
                        Some(i) => pref.is_empty() || pref.contains(&devices[i]),
                    };
                    let peer = match (peer_pref, r.peer_device) {
                        (Some(p), Some(j)) => {
                            peer_devices.get(j).is_some_and(|d| p.contains(&d.name))
                        }
                        _ => true,
                    };
                    local && peer
                };
                let (preferred, rest): (Vec<usize>, Vec<usize>) =
                    (0..rails.len()).partition(|&i| preferred(&rails[i]));
                groups.push(Group {
                    preferred: preferred.into(),
                    rest: rest.into(),
                });
            }
        }
        let buffer_slots = seg
            .desc
            .buffers
            .iter()
            .map(|b| slot_of(&peer_locs, &b.name))
            .collect();
        Route {
            rails,
            cells,
            local_locs,
            peer_locs,
            buffer_slots,
            groups,
        }
    }

    /// The cached rails to `seg`, worked out on first use (uncached if
    /// the carrier's slot holds another type: never, each carrier has its
    /// own).
    fn route_of(&self, seg: &RemoteSegment) -> Arc<Route<C::Target>> {
        C::routes(seg)
            .get_or_init_arc(|| self.route(seg))
            .unwrap_or_else(|| Arc::new(self.route(seg)))
    }

    fn load_of(&self, rail: &Rail<C::Target>) -> &DeviceLoad {
        &self.loads[rail.device.unwrap_or(self.loads.len() - 1)]
    }

    /// Whether a rail's local device can carry slices (a device of the
    /// carrier's that is up, or no device).
    fn usable(&self, rail: &Rail<C::Target>) -> bool {
        rail.device.is_none_or(|i| self.carrier.device_usable(i))
    }

    /// Rail indexes of `group` in selection order: open rails (on open
    /// devices) that both matrices prefer first, then the rest (every
    /// usable rail when none is open, for carriers that use paused rails).
    /// Rails and devices back from a pause are probed in the background;
    /// they take slices again once that succeeds.
    fn candidates(&self, route: &Route<C::Target>, group: &Group) -> Candidates {
        let mut order = Vec::with_capacity(group.preferred.len() + group.rest.len());
        let mut n_pref = 0;
        for (k, list) in [&group.preferred, &group.rest].into_iter().enumerate() {
            for &i in list.iter() {
                let rail = &route.rails[i];
                if !self.usable(rail) {
                    continue;
                }
                let device = self.load_of(rail);
                let open = match (route.cells[i].state(), device.state()) {
                    (RailUse::Open, RailUse::Open) => true,
                    (RailUse::Probe, _) => {
                        self.probe_rail(route, i);
                        false
                    }
                    (RailUse::Open, RailUse::Probe) => {
                        self.probe_device(route, i);
                        false
                    }
                    _ => false,
                };
                if open {
                    order.push(i);
                    n_pref += usize::from(k == 0);
                }
            }
        }
        if order.is_empty() && self.carrier.uses_paused_rails() {
            let all = || group.preferred.iter().chain(group.rest.iter()).copied();
            order = all().filter(|&i| self.usable(&route.rails[i])).collect();
            if order.is_empty() {
                order = all().collect();
            }
            n_pref = order
                .iter()
                .take_while(|i| group.preferred.contains(i))
                .count();
        }
        let loads = order.iter().map(|&i| route.cells[i].load()).collect();
        Candidates {
            order,
            n_pref,
            loads,
        }
    }

    /// Probes rail `i` back from a pause, unless another slice took its probe.
    fn probe_rail(&self, route: &Route<C::Target>, i: usize) {
        let cell = &route.cells[i];
        if cell.claim_probe() {
            let cell = cell.clone();
            self.carrier.probe(
                &route.rails[i],
                Box::new(move |ok| match ok {
                    true => cell.record_success(),
                    false => cell.record_error(true),
                }),
            );
        }
    }

    /// Probes the device of rail `i`, back from a pause, over that rail.
    fn probe_device(&self, route: &Route<C::Target>, i: usize) {
        if !self.load_of(&route.rails[i]).claim_probe() {
            return;
        }
        let me = self.me.clone();
        let device = route.rails[i].device;
        let round = self.load_of(&route.rails[i]).round();
        self.carrier.probe(
            &route.rails[i],
            Box::new(move |ok| {
                if let Some(me) = me.upgrade() {
                    let load = &me.loads[device.unwrap_or(me.loads.len() - 1)];
                    match ok {
                        true => load.record_success(),
                        false => load.record_failure(round),
                    }
                }
            }),
        );
    }

    /// The first choice among `c` for a slice of `len` bytes: in the
    /// preferred group (or among all if none is preferred), the
    /// least-loaded rail (ties in turn), or with `MC_PATH_ROUNDROBIN` the
    /// next in turn (per thread, as Mooncake). The slice is added to the
    /// chosen rail's load in `c`.
    fn first_choice(&self, c: &mut Candidates, len: u64) -> Option<usize> {
        let n = match c.n_pref {
            0 => c.order.len(),
            n => n,
        };
        if n == 0 {
            return None;
        }
        let turn = TURN.with(|t| {
            let v = t.get();
            t.set(v.wrapping_add(1));
            v
        }) % n;
        let at = if self.round_robin {
            turn
        } else {
            // Ties go round in turn too (rather than to the first rail),
            // so threads spread over rails.
            (turn..n)
                .chain(0..turn)
                .min_by_key(|&k| c.loads[k])
                .expect("n > 0")
        };
        c.loads[at] = c.loads[at].wrapping_add(len);
        Some(c.order[at])
    }

    /// The rail for a retry, among rails the slice has not failed on: the
    /// deterministic walk (then, for carriers that allow it, over the
    /// rails that only had errors). `None` when no rail is left.
    fn retry_choice(
        &self,
        c: Candidates,
        attempt: u32,
        tried: &RailSet,
        dead: &RailSet,
    ) -> Option<usize> {
        let mut left: Vec<usize> = c
            .order
            .iter()
            .copied()
            .filter(|&i| !tried.contains(i))
            .collect();
        if left.is_empty() && self.carrier.retries_failed_rails() {
            // Every rail failed once: those that only had an error (not a
            // failed connect) are tried again, up to `MC_RETRY_CNT`.
            left = c.order.into_iter().filter(|&i| !dead.contains(i)).collect();
        }
        (!left.is_empty()).then(|| left[(attempt as usize - 1) % left.len()])
    }

    /// Moves one request to a remote segment: slices counted on the task
    /// first, then each posted on its rail. Slices are cut where the local
    /// registered buffer that holds the source ends, where the carrier's
    /// own registration piece ends ([`Carrier::local_limit`]), and where
    /// each of the peer's buffers the range spans ends (each slice uses
    /// its own buffer's keys).
    pub fn submit(self: &Arc<Self>, sub: Submission) {
        let Submission {
            batch,
            task,
            seg,
            xfer,
            local: LocalSide { location, end },
            fallback,
            refresh,
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
        let pieces = self.pieces(&seg.desc, local, remote, len, end);
        t.add_slices(pieces.len() as u64);
        let route = self.route_of(&seg);
        let local_slot = slot_of(&route.local_locs, &location);
        let req = Arc::new(Request {
            sched: self.clone(),
            batch: batch.clone(),
            task,
            write,
            local_slot,
            seg,
            route,
            fallback,
            refresh,
            successor: OnceCell::new(),
        });
        let route = &req.route;
        // Candidates are worked out once per request (per target buffer
        // location), not per slice.
        let mut cached: Option<(*const Group, Candidates)> = None;
        for (off, n, buffer) in pieces {
            let group = route.group(local_slot, buffer);
            let c = match &mut cached {
                Some((g, c)) if std::ptr::eq(*g, group) => c,
                _ => &mut cached.insert((group, self.candidates(route, group))).1,
            };
            let Some(rail) = self.first_choice(c, n) else {
                let part = Transfer {
                    local: local + off,
                    remote: remote + off,
                    len: n,
                    write,
                };
                let handed = Submission::fall_back(&req.fallback, part);
                t.finish_slice(0, handed);
                continue;
            };
            self.post(Job {
                req: req.clone(),
                local: local + off,
                remote: remote + off,
                len: n,
                buffer,
                attempt: 0,
                rail,
                tried: RailSet::default(),
                dead: RailSet::default(),
                refreshed: false,
                round: 0,
            });
        }
    }

    /// The slices of a request as (offset, length, peer buffer): Mooncake's
    /// slicing, each slice cut further at the end of the local buffer
    /// (`end`), of the carrier's registration piece, and of the peer's
    /// buffer it starts in.
    fn pieces(
        &self,
        desc: &SegmentDesc,
        local: u64,
        remote: u64,
        len: u64,
        end: Option<u64>,
    ) -> Vec<(u64, u64, Option<usize>)> {
        let mut pieces =
            Vec::with_capacity(
                planner::slice_count(len, self.slice_size, self.fragment_limit) as usize,
            );
        let mut buffer = desc.buffer_at(remote);
        for (off, n) in planner::slices(len, self.slice_size, self.fragment_limit) {
            let stop = off + n;
            let mut at = off;
            while at < stop {
                let mut cut = stop;
                let mut limit = |edge: Option<u64>, base: u64| {
                    if let Some(e) = edge.map(|e| e.saturating_sub(base)) {
                        if e > at && e < cut {
                            cut = e;
                        }
                    }
                };
                limit(end, local);
                limit(self.carrier.local_limit(local + at), local);
                let b = buffer
                    .filter(|&b| desc.buffers[b].contains(remote + at))
                    .or_else(|| desc.buffer_at(remote + at));
                buffer = b;
                limit(b.map(|b| desc.buffers[b].end()), remote);
                pieces.push((at, cut - at, b));
                at = cut;
            }
        }
        pieces
    }

    fn post(self: &Arc<Self>, mut job: Job<C>) {
        let req = job.req.clone();
        let rail = &req.route.rails[job.rail];
        let device = self.load_of(rail);
        device.start(job.len);
        job.round = device.round();
        req.route.cells[job.rail].start(job.len);
        let remote_key = match (job.buffer, rail.peer_device) {
            (Some(b), Some(j)) => req.seg.desc.buffers[b].rkey.get(j).copied().unwrap_or(0),
            _ => 0,
        };
        let slice = Slice {
            local: job.local,
            remote: job.remote,
            len: job.len,
            write: req.write,
            done: Box::new(move |o| Scheduler::finished(job, o)),
        };
        self.carrier.post(rail, slice, remote_key);
    }

    fn finished(mut job: Job<C>, outcome: Outcome) {
        let req = job.req.clone();
        let me = &req.sched;
        let route = &req.route;
        let rail = &route.rails[job.rail];
        let device = me.load_of(rail);
        let moved = if outcome == Outcome::Done { job.len } else { 0 };
        device.finish(job.len, moved);
        route.cells[job.rail].finish(job.len);
        let task = req.batch.slot(req.task);
        let charge = match outcome {
            Outcome::Done => {
                route.cells[job.rail].record_success();
                device.record_success();
                if let Some(t) = task {
                    t.finish_slice(job.len, true);
                }
                return;
            }
            Outcome::Rejected => {
                // The peer may have registered the buffer again (a new
                // key): its descriptor is refetched once, in the
                // background, and the slice retried with it.
                if let Some(next) = req.successor.get().filter(|_| !job.refreshed) {
                    job.refreshed = true;
                    return Scheduler::move_to(job, next.clone());
                }
                if let Some(refresh) = req.refresh.as_ref().filter(|_| !job.refreshed) {
                    job.refreshed = true;
                    return refresh(
                        &req.seg.name,
                        Box::new(move |seg| Scheduler::after_refresh(job, seg)),
                    );
                }
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
            route.cells[job.rail].record_error(hard);
            device.record_failure(job.round);
            req.seg.freshness.mark_stale();
            job.tried.insert(job.rail);
            if hard {
                job.dead.insert(job.rail);
            }
        }
        job.attempt += 1;
        let closed = me.closed.load(Ordering::Acquire);
        let group = route.group(req.local_slot, job.buffer);
        let c = (!closed && job.attempt < me.retry_cnt).then(|| me.candidates(route, group));
        if let (Some(_), Some(next)) = (&c, req.successor.get()) {
            return Scheduler::move_to(job, next.clone());
        }
        let next = match c {
            None => None,
            // Not the rail's fault: the same rail again, unless it is out.
            Some(c)
                if charge.is_none()
                    && c.order.contains(&job.rail)
                    && !job.tried.contains(job.rail) =>
            {
                Some(job.rail)
            }
            Some(c) => me.retry_choice(c, job.attempt, &job.tried, &job.dead),
        };
        let Some(next) = next else {
            let part = Transfer {
                local: job.local,
                remote: job.remote,
                len: job.len,
                write: req.write,
            };
            // The next transport takes the slice over (its slices are
            // counted before this one ends, so the task stays open).
            if !closed && Submission::fall_back(&req.fallback, part) {
                if let Some(t) = task {
                    t.finish_slice(0, true);
                }
                return;
            }
            let why = format!(
                "a slice to segment {:?} failed after {} attempt(s) on {} rail(s){}",
                req.seg.name,
                job.attempt,
                job.tried.len(),
                me.carrier
                    .failure(rail)
                    .map_or_else(String::new, |w| format!(": {w}"))
            );
            if !closed {
                crate::warn_limited!("slice of {} bytes at {:#x}: {why}", job.len, job.remote);
            }
            req.batch.note_failure(req.task, &why);
            if let Some(t) = task {
                t.finish_slice(job.len, false);
            }
            return;
        };
        job.rail = next;
        debug!(
            "retrying a slice on rail {} (attempt {})",
            route.rails[job.rail].key, job.attempt
        );
        me.post(job);
    }

    /// Retries a slice the peer refused with its refetched descriptor
    /// `seg`, if that one publishes the slice's range in one buffer that
    /// differs from the one the slice used (a new key, new bounds); else
    /// the slice fails (a range the peer does not hold fails at once).
    fn after_refresh(job: Job<C>, seg: Option<Arc<RemoteSegment>>) {
        let req = &job.req;
        let me = &req.sched;
        let old = job.buffer.and_then(|b| req.seg.desc.buffers.get(b));
        let changed = seg
            .filter(|_| !me.closed.load(Ordering::Acquire))
            .filter(|seg| {
                seg.desc
                    .find_buffer(job.remote, job.len)
                    .is_some_and(|b| old != Some(&seg.desc.buffers[b]))
            });
        let Some(seg) = changed else {
            return Self::refused(job);
        };
        debug!(
            "retrying a refused slice at {:#x} with the refetched descriptor of {:?}",
            job.remote, seg.name
        );
        let next = req
            .successor
            .get_or_init(|| {
                Arc::new(Request {
                    sched: me.clone(),
                    batch: req.batch.clone(),
                    task: req.task,
                    write: req.write,
                    local_slot: req.local_slot,
                    route: me.route_of(&seg),
                    seg,
                    fallback: req.fallback.clone(),
                    refresh: req.refresh.clone(),
                    successor: OnceCell::new(),
                })
            })
            .clone();
        Self::move_to(job, next)
    }

    /// Posts a slice again as part of `next` (its request on a refetched
    /// descriptor), on a first choice of its rails; fails it if that
    /// descriptor does not hold its range in one buffer or no rail is left.
    fn move_to(job: Job<C>, next: Arc<Request<C>>) {
        let me = next.sched.clone();
        let route = &next.route;
        let buffer = next.seg.desc.find_buffer(job.remote, job.len);
        let rail = buffer.and_then(|b| {
            let group = route.group(next.local_slot, Some(b));
            me.first_choice(&mut me.candidates(route, group), job.len)
        });
        let (Some(buffer), Some(rail)) = (buffer, rail) else {
            return Self::refused(job);
        };
        me.post(Job {
            req: next,
            buffer: Some(buffer),
            rail,
            tried: RailSet::default(),
            dead: RailSet::default(),
            ..job
        });
    }

    /// Fails a slice the peer refused.
    fn refused(job: Job<C>) {
        let req = &job.req;
        let why = format!(
            "segment {:?} refused a slice (not inside a buffer it registered)",
            req.seg.name
        );
        crate::warn_limited!("slice of {} bytes at {:#x}: {why}", job.len, job.remote);
        req.batch.note_failure(req.task, &why);
        if let Some(t) = req.batch.slot(req.task) {
            t.finish_slice(job.len, false);
        }
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

impl<C: Carrier> TransportBase for Scheduler<C> {
    fn kind(&self) -> Kind {
        self.carrier.kind()
    }

    unsafe fn register(&self, region: &Region) -> Result<()> {
        // SAFETY: the caller keeps the region mapped until it is
        // unregistered, as this trait method requires.
        unsafe { self.carrier.register(region) }
    }

    fn unregister(&self, addr: u64) {
        self.carrier.unregister(addr)
    }

    fn handshake(&self) -> Option<Handshake> {
        self.carrier.handshake()
    }

    fn speaks(&self, seg: &RemoteSegment) -> bool {
        self.carrier.speaks(seg)
    }

    fn needs_registered_source(&self) -> bool {
        self.carrier.needs_registered_source()
    }
}

impl<C: Carrier> Transport for Scheduler<C> {
    fn publish(&self, desc: &mut SegmentDesc, memory: &MemoryRegistry) {
        self.carrier.publish(desc, memory, &self.matrix)
    }

    fn reaches(&self, seg: &RemoteSegment, remote: u64, len: u64) -> bool {
        seg.desc
            .covering(remote, len)
            .is_some_and(|mut bs| bs.all(|b| self.carrier.reaches(seg, b)))
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
    use std::sync::Mutex;

    /// Rails numbered 0..n; a slice posted on any rail but `good` fails.
    struct Rails {
        names: Vec<String>,
        n: usize,
        good: usize,
    }

    plain::plain_carrier_base!(Rails, "test");

    impl Carrier for Rails {
        type Target = ();

        plain::plain_carrier_basics!(names);

        fn rails(&self, seg: &RemoteSegment) -> Vec<Rail<()>> {
            (0..self.n)
                .map(|i| Rail {
                    key: format!("rail{i}@{}", seg.name),
                    device: None,
                    peer_device: None,
                    target: (),
                })
                .collect()
        }

        fn post(&self, rail: &Rail<()>, slice: Slice, _remote_key: u32) {
            slice.finish(if rail.key.starts_with(&format!("rail{}@", self.good)) {
                Outcome::Done
            } else {
                Outcome::Failed { hard: false }
            });
        }

        fn probe(&self, _rail: &Rail<()>, done: Box<dyn FnOnce(bool) + Send>) {
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
        let seg = peer(0, &[(0x1000, 4096, 0)]);
        let batch = Arc::new(Batch::new(1, None).unwrap());
        let memory = MemoryRegistry::default();
        let xfer = Transfer {
            local: 0x9000,
            remote: 0x1000,
            len: 4096,
            write: true,
        };
        let local = LocalSide::of(&memory, 0x9000);
        submit_to(&sched, &batch, &seg, xfer, local, None, None);
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
        let seg = peer(0, &[(0x1000, 1 << 20, 0)]);
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
        let xfer = Transfer {
            local: 0x9000,
            remote: 0x1000,
            len,
            write: true,
        };
        let local = LocalSide::of(&MemoryRegistry::default(), 0x9000);
        submit_to(&sched, &batch, &seg, xfer, local, Some(fallback), None);
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

    /// What [`Recorder`] saw of one slice.
    #[derive(Debug, Clone, PartialEq)]
    struct Posted {
        device: usize,
        local: u64,
        remote: u64,
        len: u64,
        key: u32,
    }

    /// Local devices `d0..`, each with a rail to every peer device; records
    /// every slice, fails those on `failing` devices, and completes the
    /// others at once or, when `hold`, when the test says.
    #[derive(Default)]
    struct Recorder {
        names: Vec<String>,
        failing: Vec<usize>,
        limit: Option<u64>,
        /// The peer's key now: slices with another are refused.
        want_key: Option<u32>,
        hold: bool,
        posted: Mutex<Vec<Posted>>,
        held: Mutex<Vec<Slice>>,
    }

    plain::plain_carrier_base!(Arc<Recorder>, "test");

    impl Carrier for Arc<Recorder> {
        type Target = ();

        plain::plain_carrier_basics!(names);

        fn rails(&self, seg: &RemoteSegment) -> Vec<Rail<()>> {
            plain::all_pairs(&self.names, seg)
        }

        fn local_limit(&self, addr: u64) -> Option<u64> {
            self.limit.filter(|&l| addr < l)
        }

        fn post(&self, rail: &Rail<()>, slice: Slice, key: u32) {
            let device = rail.device.unwrap();
            self.posted.lock().unwrap().push(Posted {
                device,
                local: slice.local,
                remote: slice.remote,
                len: slice.len,
                key,
            });
            if self.want_key.is_some_and(|k| k != key) {
                slice.finish(Outcome::Rejected)
            } else if self.failing.contains(&device) {
                slice.finish(Outcome::Failed { hard: false })
            } else if self.hold {
                self.held.lock().unwrap().push(slice)
            } else {
                slice.finish(Outcome::Done)
            }
        }

        fn probe(&self, _rail: &Rail<()>, done: Box<dyn FnOnce(bool) + Send>) {
            done(false)
        }

        fn shutdown(&self) {}
    }

    /// A peer with `peer_devices` devices (any number, for carriers that
    /// ignore them) and `buffers` as (addr, len, rkey).
    fn peer(peer_devices: usize, buffers: &[(u64, u64, u32)]) -> Arc<RemoteSegment> {
        Arc::new(RemoteSegment {
            name: "peer".into(),
            desc: SegmentDesc {
                protocol: "rdma".into(),
                devices: (0..peer_devices)
                    .map(|j| crate::metadata::descriptor::DeviceDesc {
                        name: format!("p{j}"),
                        lid: 0,
                        gid: "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:05".into(),
                    })
                    .collect(),
                buffers: buffers
                    .iter()
                    .map(|&(addr, length, key)| BufferDesc {
                        name: "cpu:0".into(),
                        addr,
                        length,
                        rkey: vec![key; peer_devices],
                        lkey: vec![key; peer_devices],
                    })
                    .collect(),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    /// Submits one request from `location`, with `refresh` if given, and
    /// returns its batch.
    fn send<C: Carrier>(
        sched: &Arc<Scheduler<C>>,
        seg: &Arc<RemoteSegment>,
        location: &str,
        local: u64,
        remote: u64,
        len: u64,
        refresh: Option<Refresh>,
    ) -> Arc<Batch> {
        let batch = Arc::new(Batch::new(1, None).unwrap());
        let xfer = Transfer {
            local,
            remote,
            len,
            write: true,
        };
        let side = LocalSide {
            location: location.into(),
            end: None,
        };
        submit_to(sched, &batch, seg, xfer, side, None, refresh);
        batch
    }

    /// Submits `xfer` as the one task of `batch`.
    fn submit_to<C: Carrier>(
        sched: &Arc<Scheduler<C>>,
        batch: &Arc<Batch>,
        seg: &Arc<RemoteSegment>,
        xfer: Transfer,
        local: LocalSide,
        fallback: Option<Fallback>,
        refresh: Option<Refresh>,
    ) {
        batch
            .append(1, |first, _| {
                sched.submit(Submission {
                    batch: batch.clone(),
                    task: first,
                    seg: seg.clone(),
                    xfer,
                    local,
                    fallback,
                    refresh,
                });
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn slices_are_cut_at_remote_buffer_edges_and_local_limits() {
        let rec = Arc::new(Recorder {
            names: vec!["d0".into()],
            limit: Some(0x90_0000 + 70_000),
            ..Default::default()
        });
        let matrix = PriorityMatrix::parse("{}").unwrap();
        let sched = Scheduler::new(rec.clone(), matrix, &SchedConfig::default());
        let edge = 0x1_0000 + 100_000;
        let seg = peer(1, &[(0x1_0000, 100_000, 11), (edge, 200_000, 22)]);
        let (local, remote, len) = (0x90_0000, 0x1_0000 + 50, 200_000);
        let batch = send(&sched, &seg, "cpu:0", local, remote, len, None);
        assert_eq!(batch.poll(0).unwrap(), (TaskStatus::Completed, len));
        let got: Vec<(u64, u64, u32)> = rec
            .posted
            .lock()
            .unwrap()
            .iter()
            .map(|p| {
                assert_eq!(p.local - local, p.remote - remote);
                (p.remote - remote, p.len, p.key)
            })
            .collect();
        // Slices of 64 KiB (the last absorbing a short tail), cut at the
        // local piece's end (70000) and the first buffer's (99950); each
        // with its own buffer's key.
        assert_eq!(
            got,
            vec![
                (0, 65536, 11),
                (65536, 70_000 - 65536, 11),
                (70_000, 99_950 - 70_000, 11),
                (99_950, 131_072 - 99_950, 22),
                (131_072, 200_000 - 131_072, 22),
            ]
        );
    }

    #[test]
    fn round_robin_takes_turns_where_least_loaded_would_not() {
        // `cpu:1` prefers d0 only; `cpu:0` both devices.
        let matrix = r#"{"cpu:0": [["d0", "d1"], []], "cpu:1": [["d0"], ["d1"]]}"#;
        let run = |round_robin: bool| {
            let rec = Arc::new(Recorder {
                names: vec!["d0".into(), "d1".into()],
                hold: true,
                ..Default::default()
            });
            let cfg = SchedConfig {
                round_robin,
                ..SchedConfig::default()
            };
            let sched = Scheduler::new(rec.clone(), PriorityMatrix::parse(matrix).unwrap(), &cfg);
            let seg = peer(1, &[(0x1_0000, 1 << 30, 7)]);
            // Loads d0 with 8 slices, then sends 4 that may use either.
            let busy = send(&sched, &seg, "cpu:1", 0x90_0000, 0x1_0000, 8 << 16, None);
            let spread = send(&sched, &seg, "cpu:0", 0x90_0000, 0x1_0000, 4 << 16, None);
            let devices: Vec<usize> = rec.posted.lock().unwrap()[8..]
                .iter()
                .map(|p| p.device)
                .collect();
            for s in rec.held.lock().unwrap().drain(..) {
                s.finish(Outcome::Done);
            }
            assert_eq!(busy.poll(0).unwrap(), (TaskStatus::Completed, 8 << 16));
            assert_eq!(spread.poll(0).unwrap(), (TaskStatus::Completed, 4 << 16));
            devices
        };
        assert_eq!(run(false), vec![1; 4], "least loaded: all on d1");
        let rr = run(true);
        assert_eq!(rr.iter().filter(|&&d| d == 0).count(), 2, "{rr:?}");
        assert!(rr.windows(2).all(|w| w[0] != w[1]), "in turn: {rr:?}");
    }

    #[test]
    fn a_device_failing_on_every_rail_leaves_selection() {
        // d0 fails on each of its 10 rails; d1 works.
        let rec = Arc::new(Recorder {
            names: vec!["d0".into(), "d1".into()],
            failing: vec![0],
            ..Default::default()
        });
        let matrix = PriorityMatrix::parse("{}").unwrap();
        let sched = Scheduler::new(rec.clone(), matrix, &SchedConfig::default());
        let seg = peer(10, &[(0x1_0000, 1 << 30, 7)]);
        for i in 0..200u64 {
            let b = send(
                &sched,
                &seg,
                "cpu:0",
                0x90_0000,
                0x1_0000 + i * 4096,
                4096,
                None,
            );
            assert_eq!(b.poll(0).unwrap(), (TaskStatus::Completed, 4096));
        }
        let posted = rec.posted.lock().unwrap();
        let on_d0 = posted.iter().filter(|p| p.device == 0).count();
        // Its rails alone would take 5 errors each (50) before pausing; the
        // device leaves after 32 failures in a row.
        assert_eq!(on_d0, rails::DEVICE_FAILURES_TO_PAUSE as usize);
        assert_eq!(sched.loads[0].state(), RailUse::Closed);
        assert_eq!(sched.loads[1].state(), RailUse::Open);
    }

    /// Waits (boundedly) for a task to leave WAITING.
    fn wait(batch: &Batch) -> (TaskStatus, u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let s = batch.poll(0).unwrap();
            if s.0 != TaskStatus::Waiting || std::time::Instant::now() > deadline {
                return s;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_refused_key_is_retried_once_with_the_refetched_descriptor() {
        let len = 3 * 65536;
        // The peer holds the buffer under key `now`; the cached descriptor
        // says 7; a refetch says `refetched`.
        let run = |now: u32, refetched: u32| {
            let rec = Arc::new(Recorder {
                names: vec!["d0".into()],
                want_key: Some(now),
                ..Default::default()
            });
            let matrix = PriorityMatrix::parse("{}").unwrap();
            let sched = Scheduler::new(rec.clone(), matrix, &SchedConfig::default());
            let seg = peer(2, &[(0x1_0000, 1 << 20, 7)]);
            let fresh = peer(2, &[(0x1_0000, 1 << 20, refetched)]);
            let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let c = calls.clone();
            // As the engine: a refetch on another thread, never inline.
            let refresh: Refresh = Arc::new(move |name: &str, done| {
                assert_eq!(name, "peer");
                c.fetch_add(1, Ordering::Relaxed);
                let fresh = fresh.clone();
                std::thread::spawn(move || done(Some(fresh)));
            });
            let b = send(
                &sched,
                &seg,
                "cpu:0",
                0x90_0000,
                0x1_0000,
                len,
                Some(refresh),
            );
            let status = wait(&b);
            (status, calls, rec)
        };
        // The task may end as soon as one slice fails, before the others
        // are refused and refetch: what they do is read once it shows,
        // within a few seconds (the refetches return at once).
        let settled = |calls: &std::sync::atomic::AtomicUsize,
                       rec: &Recorder,
                       done: &dyn Fn(usize, &[u32]) -> bool| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let keys: Vec<u32> = rec.posted.lock().unwrap().iter().map(|p| p.key).collect();
                let n = calls.load(Ordering::Relaxed);
                if done(n, &keys) || std::time::Instant::now() > deadline {
                    return (n, keys);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        // Re-registered (new key 8): each slice is retried with it.
        let (status, calls, rec) = run(8, 8);
        assert_eq!(status, (TaskStatus::Completed, len));
        let (calls, keys) = settled(&calls, &rec, &|_, _| true);
        // A slice refused after an earlier slice's refetch landed moves to
        // the refetched descriptor without one of its own.
        assert!((1..=3).contains(&calls), "{calls} refetches");
        assert_eq!(keys.iter().filter(|&&k| k == 8).count(), 3, "{keys:?}");
        // The refetched descriptor is unchanged: the slices fail, once.
        let (status, calls, rec) = run(8, 7);
        assert_eq!(status.0, TaskStatus::Failed);
        let (calls, keys) = settled(&calls, &rec, &|n, _| n >= 3);
        assert_eq!((calls, keys), (3, vec![7; 3]));
        // Refused again after the refetch: no second refetch.
        let (status, calls, rec) = run(10, 9);
        assert_eq!(status.0, TaskStatus::Failed);
        let (calls, keys) = settled(&calls, &rec, &|n, keys| {
            n >= 3 && keys.iter().filter(|&&k| k == 9).count() >= 3
        });
        assert_eq!(calls, 3);
        assert_eq!(keys.iter().filter(|&&k| k == 9).count(), 3, "{keys:?}");
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
