//! Transports move slices between memory. `local` serves the engine's own
//! segment with memory copies, whatever else is installed; `tcp` moves
//! slices to peers over one rail each, as the engine's scheduler decides.

pub mod endpoint;
pub mod local;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod scheduler;
pub mod tcp;

/// Load of one local device, for `getNicLoadStats`.
#[derive(Debug, Clone, PartialEq)]
pub struct NicLoad {
    /// Device name.
    pub device: String,
    /// Bytes posted and not yet completed.
    pub inflight_bytes: u64,
    /// Exponentially weighted bandwidth, bytes per second.
    pub ewma_bandwidth_bps: f64,
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
