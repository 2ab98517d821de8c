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
//!
//! Here: the [`Scheduler`] and the [`Transport`] it makes of a carrier.
//! Beside it: [`Carrier`] and [`Rail`] (`carrier.rs`); a peer's route,
//! worked out once and cached with the segment (`route.rs`); what a
//! request's slices share and what one slice carries (`job.rs`); rail
//! choice (`choice.rs`); the submission path (`submit.rs`); what becomes
//! of a slice when it ends: retry, refetch, fallback (`retry.rs`);
//! [`planner`] (slice sizes) and [`rails`] (health and loads).

#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod bench;
mod carrier;
mod choice;
mod job;
#[cfg(any(test, feature = "bench-internals"))]
mod plain;
pub mod planner;
pub mod rails;
mod retry;
mod route;
mod submit;
#[cfg(test)]
mod tests;

pub use carrier::{Carrier, Rail};

use crate::error::Result;
use crate::memory::{MemoryRegistry, Region};
use crate::metadata::descriptor::SegmentDesc;
use crate::segment::RemoteSegment;
use crate::topology::PriorityMatrix;
use crate::transport::{Handshake, Kind, NicLoad, Submission, Transport, TransportBase};
use rails::{DeviceLoad, RailHealth};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Descriptor field that changes when its owner restarts or changes its
/// buffers (ignored by Mooncake).
pub const GENERATION_KEY: &str = "generation";

use crate::settings::{Parse, Range, Reader, Switch};

/// `MC_FRAGMENT_RATIO` is read into `fragment_limit` as a ratio; set, the
/// limit is `slice_size / ratio` (Mooncake's rule); unset, 16384 stays. A
/// ratio not below the slice size gives `slice_size / 4` with a warning,
/// as Mooncake falls back to 4.
fn fragment_limit(sched: &mut SchedConfig, r: &Reader<'_>) {
    let ratio = r
        .raw("MC_FRAGMENT_RATIO")
        .and_then(|v| Range(1u64, u64::MAX).parse(&v));
    if let Some(ratio) = ratio {
        sched.fragment_limit = if ratio < sched.slice_size {
            sched.slice_size / ratio
        } else {
            r.warn(format!(
                "MC_FRAGMENT_RATIO={ratio} is not below MC_SLICE_SIZE ({}); using 4, as \
                 Mooncake does",
                sched.slice_size
            ));
            sched.slice_size / 4
        };
    }
}

crate::settings::settings! {
    /// How the scheduler slices requests and retries slices. Parsed from `MC_*`
    /// variables by `Config::from_env`; the defaults are
    /// Mooncake's.
    #[derive(Debug, Clone, PartialEq)]
    pub struct SchedConfig("sched") {
        /// `MC_SLICE_SIZE`: bytes per slice of a large request.
        slice_size: u64 = 65536, ["MC_SLICE_SIZE"], Range(1u64, 1 << 40),
            "bytes per slice of a large request, on every transport but shm (`MC_SHM_SLICE_SIZE`)",
            mooncake "slices RDMA requests only; TCP sends each request whole";
        /// Derived from `MC_FRAGMENT_RATIO`: a tail up to this size joins the
        /// previous slice (`slice_size / ratio` when the ratio is set).
        fragment_limit: u64 = 16384, ["MC_FRAGMENT_RATIO"], Range(1u64, u64::MAX),
            "a request's tail up to `MC_SLICE_SIZE / ratio` bytes joins the previous slice \
             (unset: 16384 bytes; a ratio not below `MC_SLICE_SIZE` warns and counts as 4)",
            shown "unset";
        /// `MC_RETRY_CNT`: attempts per slice before its task fails.
        retry_cnt: u32 = 9, ["MC_RETRY_CNT"], Range(1u32, 127),
            "attempts per slice (on other rails) before its task fails, on TCP and RDMA",
            mooncake "RDMA slices only";
        /// `MC_RDMA_RAIL_PAUSE_SECONDS`.
        rail_pause_secs: u64 = 30, ["MC_RDMA_RAIL_PAUSE_SECONDS"], Range(1u64, 3599),
            "a rail with repeated errors, or one that cannot connect, is paused this long \
             (TCP and RDMA)", mooncake "RDMA rails only";
        /// `MC_PATH_ROUNDROBIN`: the first choice among the preferred open
        /// rails goes round in turn (per thread) instead of to the least
        /// loaded (false).
        round_robin: bool = false, ["MC_PATH_ROUNDROBIN"], Switch,
            "off: the first rail of a slice is the least-loaded preferred one; on: the \
             preferred ones in turn, per thread",
            mooncake "on only for `1` or `true` (any case)";
    } then fragment_limit;
}

/// Name of the device load of a rail bound to no local device.
const DEFAULT_DEVICE: &str = "default";

/// Picks rails for slices and retries failed ones on other rails.
pub struct Scheduler<C: Carrier> {
    carrier: C,
    /// Its entry of the transport table (its route-cache slot).
    kind: Kind,
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
    /// `matrix`, installed as `kind`.
    pub fn new(
        carrier: C,
        matrix: PriorityMatrix,
        cfg: &SchedConfig,
        kind: Kind,
    ) -> Arc<Scheduler<C>> {
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
            kind,
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

    /// Per-device in-flight bytes and bandwidth.
    pub fn nic_loads(&self) -> Vec<NicLoad> {
        let n = self.loads.len() - usize::from(!self.carrier.unbound_rails());
        self.loads[..n]
            .iter()
            .map(|d| NicLoad {
                device: d.name.clone(),
                inflight_bytes: d.inflight(),
                ewma_bandwidth_bps: d.ewma_bps(),
                moved_bytes: d.moved(),
                pauses: d.pauses(),
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

    fn moves_device_memory(&self) -> bool {
        self.carrier.moves_device_memory()
    }

    fn shutdown(&self) {
        Scheduler::shutdown(self)
    }
}

impl<C: Carrier> Transport for Scheduler<C> {
    fn kind(&self) -> Kind {
        self.kind
    }

    fn endpoint_pool(&self) -> Option<crate::transport::EndpointPool> {
        self.carrier.endpoint_pool()
    }

    fn describe_waits(&self, seg: &RemoteSegment) -> Option<String> {
        let route = seg
            .routes
            .slot(self.kind.index)
            .get_arc::<route::Route<C::Target>>()?;
        let parts: Vec<String> = route
            .rails
            .iter()
            .zip(&route.cells)
            .filter_map(|(rail, cell)| {
                let (load, state) = (cell.load(), cell.state());
                if load == 0 && state == rails::RailUse::Open {
                    return None;
                }
                let state = match state {
                    rails::RailUse::Open => "",
                    rails::RailUse::Probe => ", back from a pause and untested",
                    rails::RailUse::Closed => ", paused after errors",
                };
                let failure = self
                    .carrier
                    .failure(rail)
                    .map_or_else(String::new, |f| format!(" (last failure: {f})"));
                Some(format!(
                    "rail {} has {load} B in flight{state}{failure}",
                    rail.key
                ))
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }

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
}
