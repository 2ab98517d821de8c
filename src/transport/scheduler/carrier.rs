//! What a rail-based transport gives the scheduler: the [`Carrier`] trait
//! (its rails to a peer, how it moves one slice over one rail, what else
//! makes it a transport) and the [`Rail`] it moves slices over.

use crate::memory::MemoryRegistry;
use crate::metadata::descriptor::SegmentDesc;
use crate::segment::RemoteSegment;
use crate::topology::PriorityMatrix;
use crate::transport::{Slice, TransportBase};

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
/// and what the transport adds to make it a
/// [`Transport`](crate::transport::Transport).
pub trait Carrier: TransportBase + 'static {
    /// The transport's address of a peer device.
    type Target: Clone + Send + Sync + std::fmt::Debug + 'static;

    /// See [`Transport::publish`](crate::transport::Transport::publish);
    /// `matrix` is the local priority matrix.
    fn publish(&self, desc: &mut SegmentDesc, memory: &MemoryRegistry, matrix: &PriorityMatrix);

    /// Whether the peer publishes what this transport needs to reach its
    /// buffer `buffer` (an index into `seg.desc.buffers`).
    fn reaches(&self, seg: &RemoteSegment, buffer: usize) -> bool;

    /// Local device names; rails index into them.
    fn devices(&self) -> &[String];

    /// The rails to a segment (at least one if it can be reached at all).
    fn rails(&self, seg: &RemoteSegment) -> Vec<Rail<Self::Target>>;

    /// The end of the carrier's own registration piece holding local
    /// address `addr`, when it registers smaller pieces than the caller's
    /// buffer (slices are not cut across it); `None` when its piece is the
    /// whole buffer.
    fn local_limit(&self, _addr: u64) -> Option<u64> {
        None
    }

    /// Its endpoint pools, if it keeps endpoints
    /// ([`Transport::endpoint_pool`](crate::transport::Transport::endpoint_pool)).
    fn endpoint_pool(&self) -> Option<crate::transport::EndpointPool> {
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
}
