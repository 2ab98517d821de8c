//! What a request's slices share ([`Request`]) and what one slice carries
//! to be retried ([`Job`]), with the set of rails it failed on.

use super::route::Route;
use super::{Carrier, Scheduler};
use crate::batch::Batch;
use crate::segment::RemoteSegment;
use crate::transport::{Fallback, LocalSide, Refresh};
use once_cell::sync::OnceCell;
use std::sync::Arc;

/// One request's slices share what does not change between them.
pub(super) struct Request<C: Carrier> {
    pub(super) sched: Arc<Scheduler<C>>,
    pub(super) batch: Arc<Batch>,
    pub(super) task: usize,
    pub(super) write: bool,
    /// The GPU whose memory the local side is.
    pub(super) gpu: Option<u32>,
    /// The registered buffer holding the local side, as the slices fence
    /// it ([`LocalSide::fence_for`]).
    pub(super) local: LocalSide,
    /// Slot of the local buffer's location in the route.
    pub(super) local_slot: usize,
    pub(super) seg: Arc<RemoteSegment>,
    pub(super) route: Arc<Route<C::Target>>,
    /// Where the slice goes when no rail is left.
    pub(super) fallback: Option<Fallback>,
    /// How the peer's descriptor is refetched when it refuses a key.
    pub(super) refresh: Option<Refresh>,
    /// The request on the peer's refetched descriptor, once a refused
    /// slice found it changed: the other slices move to it when they are
    /// retried (rather than carry the stale key again).
    pub(super) successor: OnceCell<Arc<Request<C>>>,
}

/// A slice with what it needs to be retried.
pub(super) struct Job<C: Carrier> {
    pub(super) req: Arc<Request<C>>,
    pub(super) local: u64,
    pub(super) remote: u64,
    pub(super) len: u64,
    /// Index of the target buffer in the peer's descriptor.
    pub(super) buffer: Option<usize>,
    pub(super) attempt: u32,
    pub(super) rail: usize,
    /// Rails this slice failed on.
    pub(super) tried: RailSet,
    /// Rails this slice failed on hard (could not connect).
    pub(super) dead: RailSet,
    /// The peer refused it once and its descriptor was refetched.
    pub(super) refreshed: bool,
    /// The device's failure round when the slice was posted.
    pub(super) round: u64,
}

/// A set of rail indexes, exact for any number of rails; allocates only
/// when a rail is added (a slice that failed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct RailSet(Vec<u64>);

impl RailSet {
    pub(super) fn insert(&mut self, rail: usize) {
        let word = rail / 64;
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << (rail % 64);
    }

    pub(super) fn contains(&self, rail: usize) -> bool {
        self.0
            .get(rail / 64)
            .is_some_and(|w| w & (1 << (rail % 64)) != 0)
    }

    pub(super) fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
}
