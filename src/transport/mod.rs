//! Transports move bytes between this engine's memory and its peers'.
//!
//! A transport is one module behind one trait, [`Transport`] (on top of
//! [`TransportBase`], which the scheduler's carriers share): the protocol
//! it speaks, what it registers and fences, what it adds to this engine's
//! descriptor and reads from a peer's, the handshake messages it serves,
//! whether it reaches a peer's buffer, how it moves a request, its NIC
//! loads, its shutdown. The transports this build provides are listed in
//! one table, [`registry::TRANSPORTS`]: the engine installs them by
//! protocol name through it, holds the set, and sends each request to the
//! best one that reaches the target; a part of a request one cannot move
//! goes to the next one ([`Fallback`]). `local` serves the engine's own
//! segment with memory copies, whatever else is installed; `scheduler` is
//! the slice and rail scheduler that the rail-based transports (TCP, RDMA)
//! share; `shm` copies between processes of one host.

pub mod endpoint;
pub mod local;
pub mod plug;
pub mod rdma;
pub mod registry;
pub mod scheduler;
pub mod shm;
pub mod tcp;

use crate::batch::{Batch, TaskRef};
use crate::error::Result;
use crate::memory::{Fence, MemoryRegistry, Region};
use crate::metadata::descriptor::SegmentDesc;
use crate::rpc::{ClientOptions, FrameKind, RpcConfig};
use crate::segment::RemoteSegment;
use crate::topology::{PriorityMatrix, Topology, TopologyConfig};
use endpoint::EndpointConfig;
use rdma::RdmaConfig;
use scheduler::SchedConfig;
use serde_json::Value;
use shm::ShmConfig;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use tcp::TcpConfig;

/// How the engine names a transport and orders it among the others: its
/// entry of [`registry::TRANSPORTS`], as the registry hands it to the
/// transport it installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// The protocol it speaks, as descriptors and `installTransport` name
    /// it.
    pub protocol: &'static str,
    /// Its place in the table: its preference among the transports that
    /// reach a peer (the lowest first), and its slot in a segment's route
    /// cache.
    pub index: usize,
    /// Whether its protocol may stand as the `protocol` field of this
    /// engine's descriptor, which Mooncake peers read to choose their
    /// transport (the most preferred such installed one is written).
    pub names_descriptor: bool,
}

impl Kind {
    /// Its route in the engine's task statistics: after the local copies'
    /// ([`crate::task_stats::LOCAL_ROUTE`]), in table order.
    pub(crate) fn route(&self) -> usize {
        1 + self.index
    }
}

/// What every transport has, whether the engine drives it directly
/// ([`Transport`]) or through the slice scheduler
/// ([`scheduler::Carrier`]): its registration hooks, the handshake it
/// answers, which peers speak it, and its shutdown.
pub trait TransportBase: Send + Sync {
    /// Makes `region` reachable through this transport (RDMA: a memory
    /// region on every device).
    ///
    /// # Safety
    /// `region` must stay mapped until [`TransportBase::unregister`] of
    /// its address returns (the C API's contract for registered memory).
    unsafe fn register(&self, _region: &Region) -> Result<()> {
        Ok(())
    }

    /// Removes the region at `addr`; returns once nothing this transport
    /// runs touches it.
    fn unregister(&self, _addr: u64) {}

    /// The handshake requests it answers, if any.
    fn handshake(&self) -> Option<Handshake> {
        None
    }

    /// Whether the peer publishes this transport at all (its descriptor
    /// has what this transport needs to reach it).
    fn speaks(&self, seg: &RemoteSegment) -> bool;

    /// Whether it moves bytes only from and to registered local memory.
    fn needs_registered_source(&self) -> bool {
        false
    }

    /// Whether it may move GPU memory (the NIC reads and writes it;
    /// transports that copy with the CPU must not be given it).
    fn moves_device_memory(&self) -> bool {
        false
    }

    /// Fails what is in flight and stops every thread it runs.
    fn shutdown(&self);
}

/// A transport as the engine drives it.
pub trait Transport: TransportBase {
    /// Its protocol and place in the transport table (the [`Kind`] it was
    /// installed with).
    fn kind(&self) -> Kind;

    /// Adds what this transport publishes to this engine's descriptor:
    /// its keys, and what it attaches to each buffer (`desc.buffers` lists
    /// every registered region, in address order, as `memory` holds them).
    fn publish(&self, desc: &mut SegmentDesc, memory: &MemoryRegistry);

    /// Whether it can move a request to `[remote, remote + len)` of `seg`,
    /// from what the peer publishes.
    fn reaches(&self, seg: &RemoteSegment, remote: u64, len: u64) -> bool;

    /// Moves one request (or the part of one that another transport could
    /// not move): counts its slices on the task, then finishes each, or
    /// hands the parts it cannot move to `fallback`.
    fn submit(&self, submission: Submission);

    /// Per-device load, for `getNicLoadStats`.
    fn nic_loads(&self) -> Vec<NicLoad> {
        Vec::new()
    }

    /// Zeroed memory of `len` bytes that this transport moves faster than
    /// memory the caller allocates, if it has such (shared memory: a memfd
    /// that peers on this host map), for the caller to register.
    fn allocate(&self, _len: usize) -> Option<Result<u64>> {
        None
    }

    /// Frees memory from [`Transport::allocate`]; whether it was this
    /// transport's.
    fn free(&self, _addr: u64) -> bool {
        false
    }

    /// Lends the calling thread to the transport for one round of its
    /// work (a caller polling a task that is still running); returns
    /// whether there was any.
    fn help(&self) -> bool {
        false
    }

    /// Its endpoint pools, if it keeps endpoints (TCP, RDMA).
    fn endpoint_pool(&self) -> Option<EndpointPool> {
        None
    }

    /// What this transport's slices to `seg` wait for now, for the stall
    /// report (bytes in flight on which rails, paused rails, a target
    /// copying, a full queue); `None` when it holds none.
    fn describe_waits(&self, _seg: &RemoteSegment) -> Option<String> {
        None
    }

    /// Withdraws the slices of cancelled tasks that it holds and has not
    /// begun to move, ending them as [`Outcome::Canceled`]: called by the
    /// thread that cancels, again while it waits for the slices under
    /// way. (A transport that finds them itself when it next looks at its
    /// queue, as TCP does, needs nothing here.)
    fn withdraw_canceled(&self) {}

    /// The calling thread, which lent a hand, stops doing so (it parks
    /// until its tasks end): work the transport left to such callers goes
    /// back to its own threads.
    fn stop_helping(&self) {}

    /// Gives the wake-ups this transport deferred on the calling thread
    /// while it held a [`plug::Plug`] (the caller's batch is submitted).
    fn flush(&self) {}

    /// The transport's own counters (name, value), for tests and tools.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

/// Answers one handshake request from the given address.
pub type HandshakeAnswer = Box<dyn Fn(&Value, SocketAddr) -> Value + Send + Sync>;

/// A handshake frame kind a transport answers, and how.
pub struct Handshake {
    /// The frame kind.
    pub kind: FrameKind,
    /// The answer to each request.
    pub answer: HandshakeAnswer,
}

impl Handshake {
    /// Frames of `kind`, each answered by `answer` of `server`.
    pub fn served_by<S: Send + Sync + 'static>(
        kind: FrameKind,
        server: &Arc<S>,
        answer: fn(&S, &Value, SocketAddr) -> Value,
    ) -> Handshake {
        let server = server.clone();
        Handshake {
            kind,
            answer: Box::new(move |request, from| answer(&server, request, from)),
        }
    }
}

/// One request to a remote segment, as a transport moves it.
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

/// What the engine's registry says of a request's local memory.
#[derive(Debug, Clone)]
pub struct LocalSide {
    /// Location of the registered buffer holding the local address
    /// (`cpu:N`, `cuda:N`, `*`), `*` when it is not registered.
    pub location: String,
    /// End of that buffer: slices are not cut across it.
    pub end: Option<u64>,
    /// The CUDA GPU whose memory it is (`None`: host memory).
    pub gpu: Option<u32>,
    /// That buffer's fence.
    pub fence: Option<Arc<Fence>>,
}

impl LocalSide {
    /// The local side of a request from `local`, as `memory` holds it, in
    /// the memory of GPU `gpu` (or host memory).
    pub fn of(memory: &MemoryRegistry, local: u64, gpu: Option<u32>) -> LocalSide {
        let found = memory.find_fenced(local, 1);
        LocalSide {
            location: found.map_or_else(|| "*".to_string(), |(r, _)| r.location.to_string()),
            end: found.map(|(r, _)| r.end()),
            gpu,
            fence: found.map(|(_, f)| f.clone()),
        }
    }

    /// The fence a slice of `len` bytes from `local` (at or after the
    /// request's local address) holds: the buffer's, if it holds all of
    /// the slice ([`Slice::local_fence`]).
    pub fn fence_for(&self, local: u64, len: u64) -> Option<Arc<Fence>> {
        self.holds(local, len).then(|| self.fence.clone()).flatten()
    }

    /// [`LocalSide::fence_for`] for the request's last slice: the fence
    /// moves to it (the request's slices need no more clones of it).
    pub fn take_fence_for(&mut self, local: u64, len: u64) -> Option<Arc<Fence>> {
        self.holds(local, len).then(|| self.fence.take()).flatten()
    }

    /// Whether the registered buffer holds all of `[local, local + len)`
    /// (`local` at or after the request's local address).
    fn holds(&self, local: u64, len: u64) -> bool {
        self.end
            .is_some_and(|end| local.checked_add(len).is_some_and(|e| e <= end))
    }
}

/// Hands a part of a request that a transport could not move to the next
/// transport that reaches the peer; it counts the part's slices on the
/// task before it returns. Without one, the part fails.
pub type Fallback = Arc<dyn Fn(Transfer) + Send + Sync>;

/// Called once with the segment as cached after a refetch of its
/// descriptor (`None` if it could not be refetched or was closed).
pub type Refreshed = Box<dyn FnOnce(Option<Arc<RemoteSegment>>) + Send>;

/// Refetches the descriptor of the segment named by the first argument in
/// the background (never on the calling thread; concurrent calls for one
/// segment share one refetch), then calls the second.
pub type Refresh = Arc<dyn Fn(&str, Refreshed) + Send + Sync>;

/// What a transport moves for one task.
pub struct Submission {
    /// The task's batch.
    pub batch: Arc<Batch>,
    /// The task.
    pub task: usize,
    /// The target segment.
    pub seg: Arc<RemoteSegment>,
    /// The bytes to move.
    pub xfer: Transfer,
    /// The local memory's registration.
    pub local: LocalSide,
    /// Where the parts this transport cannot move go.
    pub fallback: Option<Fallback>,
    /// How the target's descriptor is refetched when the peer refuses a
    /// slice's key (it may have registered the buffer again).
    pub refresh: Option<Refresh>,
}

impl Submission {
    /// Hands `part` to the fallback (it counts its slices on the task)
    /// and reports whether there was one.
    pub fn fall_back(fallback: &Option<Fallback>, part: Transfer) -> bool {
        match fallback {
            Some(next) => {
                next(part);
                true
            }
            None => false,
        }
    }
}

/// What a transport may ask the engine about its peers (RDMA's handshake
/// check asks who a peer is).
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub trait PeerDirectory: Send + Sync {
    /// The descriptor of the peer whose server (segment) name is `server`
    /// and the host of its handshake listener: from the engine's cache
    /// unless `fresh`, else fetched with `rpc` (P2P) or from the store.
    fn peer(
        &self,
        server: &str,
        fresh: bool,
        rpc: &ClientOptions,
    ) -> std::result::Result<(String, SegmentDesc), String>;
}

/// The parts of the engine's configuration that transports read.
#[derive(Debug, Clone, Copy)]
pub struct TransportConfig<'a> {
    /// The handshake listener and client.
    pub rpc: &'a RpcConfig,
    /// The slice scheduler.
    pub sched: &'a SchedConfig,
    /// The endpoint pools.
    pub endpoints: &'a EndpointConfig,
    /// The TCP transport.
    pub tcp: &'a TcpConfig,
    /// The RDMA transport.
    pub rdma: &'a RdmaConfig,
    /// The shared-memory transport.
    pub shm: &'a ShmConfig,
    /// Devices and the priority matrix.
    pub topology: &'a TopologyConfig,
}

/// What a transport is installed with.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub struct InstallContext<'a> {
    /// Its entry of the transport table, which it reports as its
    /// [`Transport::kind`].
    pub kind: Kind,
    /// The engine's configuration.
    pub config: TransportConfig<'a>,
    /// The engine's registered memory.
    pub memory: &'a Arc<RwLock<MemoryRegistry>>,
    /// The engine's name (its segment name).
    pub local_name: &'a str,
    /// The loopback address the engine is confined to, if any.
    pub loopback: Option<IpAddr>,
    /// A NIC priority matrix given to `installTransport` or by
    /// `MC_CUSTOM_TOPO_JSON`.
    pub matrix: Option<PriorityMatrix>,
    /// The machine's topology (discovered on first call).
    pub topology: &'a dyn Fn() -> Topology,
    /// RDMA devices the engine may use (empty: all), beside
    /// `MC_TE_FILTERS`.
    pub device_filter: &'a [String],
    /// The engine's peers.
    pub peers: Arc<dyn PeerDirectory>,
    /// The cluster keys: connections to and from peers authenticate.
    pub auth: Option<Arc<crate::auth::Keys>>,
    /// Asks the engine to publish its descriptor again (what the
    /// transport publishes changed, e.g. a device's GID); returns at once,
    /// the engine publishes in the background.
    pub republish: Republish,
}

/// How a transport asks the engine to publish its descriptor again.
pub type Republish = Arc<dyn Fn() + Send + Sync>;

/// What auto discovery found, for each transport of the table to say
/// whether it wants to be installed ([`registry::Auto`]).
pub struct Discovery<'a> {
    /// The engine's configuration for transports.
    pub config: TransportConfig<'a>,
    /// The machine's topology.
    pub topology: &'a Topology,
    /// `MC_FORCE_HCA`: install RDMA whatever was found, and fail the
    /// engine if it cannot be set up.
    pub force_hca: bool,
    /// `MC_FORCE_TCP`: leave RDMA out.
    pub force_tcp: bool,
}

/// Whether auto discovery installs a transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// Not on this machine, or not with this configuration, for the
    /// reason given (`MC_FORCE_TCP is set`).
    No(&'static str),
    /// Yes; if it cannot be set up, the engine goes on without it.
    Try,
    /// Yes, and the engine fails if it cannot be set up, for the reason
    /// given (`MC_FORCE_HCA is set`).
    Must(&'static str),
}

/// Load of one local device, for `getNicLoadStats`.
#[derive(Debug, Clone, PartialEq)]
pub struct NicLoad {
    /// Device name.
    pub device: String,
    /// Bytes posted and not yet completed.
    pub inflight_bytes: u64,
    /// Exponentially weighted bandwidth, bytes per second.
    pub ewma_bandwidth_bps: f64,
    /// Bytes it moved successfully since the transport was installed.
    pub moved_bytes: u64,
    /// Times it left selection since then (paused after failing slices,
    /// or a failed probe).
    pub pauses: u64,
}

/// The endpoint pools of a transport, all devices together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointPool {
    /// Endpoints held now.
    pub size: u64,
    /// Endpoints evicted to make room since the transport was installed.
    pub evictions: u64,
}

/// How a slice ended, as its transport saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every byte moved (and, where the protocol says so, was applied).
    Done,
    /// The peer refused the address range: retrying elsewhere cannot help.
    Rejected,
    /// The rail failed; `hard` when it could not even connect.
    Failed {
        /// The rail is unusable (connect failed), not just one exchange.
        hard: bool,
    },
    /// The slice did not run because its connection was torn down for
    /// another reason (another slice's error, an eviction, a shutdown):
    /// retry it elsewhere without blaming the rail (RDMA's).
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    Interrupted,
    /// This transport cannot reach the peer (shared memory that the
    /// kernel refuses between these processes): use another transport.
    Unreachable,
    /// The slice's own local memory cannot be used: its registered buffer
    /// was unregistered while the slice ran ([`Slice::local_fence`]), or
    /// the kernel refused the address (EFAULT). No rail or peer is to
    /// blame, and nothing elsewhere can help: the slice fails.
    Local,
    /// Its task was cancelled ([`crate::batch::Batch::cancel`]) before
    /// the slice began to move: it was withdrawn, and no byte of it moves.
    Canceled,
}

/// One slice handed to a transport: a contiguous range to move, and what
/// to do when it ends. The transport calls `done` exactly once.
pub struct Slice {
    /// Local address: read from for WRITE, written for READ.
    pub local: u64,
    /// Address in the peer process.
    pub remote: u64,
    /// Bytes.
    pub len: u64,
    /// WRITE (true) or READ.
    pub write: bool,
    /// The CUDA GPU whose memory `local` is (`None`: host memory); a
    /// transport copying with the CPU stages it.
    pub local_gpu: Option<u32>,
    /// The fence of the registered buffer holding the whole local range,
    /// when one does: a transport holds it while it copies into or out of
    /// that range (a system call or the CPU's), so that unregistering the
    /// buffer waits for the copy, and the slice fails once it is revoked.
    pub local_fence: Option<Arc<Fence>>,
    /// Its task, when it has one: a transport that holds the slice before
    /// moving it withdraws it once the task is cancelled.
    pub task: Option<TaskRef>,
    /// Called once with the outcome.
    pub done: Box<dyn FnOnce(Outcome) + Send>,
}

impl Slice {
    /// Whether its task was cancelled: a slice not begun is then finished
    /// with [`Outcome::Canceled`] instead of moved.
    pub fn canceled(&self) -> bool {
        self.task.as_ref().is_some_and(TaskRef::canceled)
    }

    /// Reports the slice's outcome.
    pub fn finish(self, outcome: Outcome) {
        (self.done)(outcome)
    }
}
