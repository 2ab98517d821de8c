//! Transports move slices between memory. `local` serves the engine's own
//! segment with memory copies, whatever else is installed; `tcp` moves
//! slices to peers over one rail each, as the engine's scheduler decides;
//! `shm` copies between processes of one host.

pub mod endpoint;
pub mod fence;
pub mod local;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod shm;
pub mod tcp;

use fence::Fence;
use std::sync::Arc;

/// What a transport serving peers may ask of the engine's registered
/// memory: whether a range is open to peers, and the fence to hold while
/// touching it (see [`fence`]).
pub trait RemoteMemory: Send + Sync {
    /// The fence of the remotely accessible registered buffer that holds
    /// all of `[addr, addr + len)`, or `None` (also for `len == 0`).
    fn admit(&self, addr: u64, len: u64) -> Option<Arc<Fence>>;
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
    /// retry it elsewhere without blaming the rail.
    Interrupted,
    /// This transport cannot reach the peer (shared memory that the
    /// kernel refuses between these processes): use another transport.
    Unreachable,
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
    /// Called once with the outcome.
    pub done: Box<dyn FnOnce(Outcome) + Send>,
}

impl Slice {
    /// Reports the slice's outcome.
    pub fn finish(self, outcome: Outcome) {
        (self.done)(outcome)
    }
}
