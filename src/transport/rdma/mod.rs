//! The RDMA transport: one-sided RDMA READ and WRITE over RC queue pairs,
//! wire-compatible with Mooncake's RDMA transport.
//!
//! One [`nic::Nic`] per device of the priority matrix: its context,
//! protection domain, completion queue and channel, the port, GID and MTU
//! it uses, its endpoint pool (SIEVE/FIFO, `MC_MAX_EP_PER_CTX`) and
//! `MC_WORKERS_PER_CTX` worker threads that post chained work requests
//! within each queue pair's depth and the completion queue's room, and
//! complete slices from the completions. Endpoints connect through the
//! handshake RPC (Mooncake's Connection JSON, with the ready ACK); a small
//! pool of connector threads runs our side (handshakes to different peers
//! at once), [`RdmaTransport::accept`] the peer's, which takes a
//! handshake only from the host its sender publishes, with the GID it
//! publishes, and bounds the endpoints handshakes create (per peer and in
//! total). A monitor thread handles asynchronous events (a port that
//! goes down takes its device out of selection until it is back; a GID
//! change, or a port back up, ranks the GID table again, and a device
//! whose chosen GID changed has the engine publish the new one and
//! retires its endpoints, built on the old one), tears
//! down endpoints whose queue pairs stopped completing
//! (`MC_RDMA_COMPLETION_TIMEOUT`) — and every endpoint to that peer when
//! its handshake listener does not answer a Probe either (the process is
//! gone) — and closes retired endpoints once their last request has
//! ended. Every buffer is registered on every
//! device; [`RdmaTransport::unregister`] returns once the work requests
//! using it have ended.
//!
//! The transport knows nothing of the engine: the scheduler hands it one
//! slice at a time with the device, the peer (a [`RdmaTarget`]) and the
//! peer's key, and hears back through the slice's callback.

#[cfg(feature = "rdma")]
mod admission;
#[cfg(feature = "rdma")]
pub mod carrier;
pub mod config;
#[cfg(feature = "rdma")]
mod endpoint;
#[cfg(feature = "rdma")]
mod gid;
#[cfg(feature = "rdma")]
mod handshake;
#[cfg(feature = "rdma")]
mod nic;
#[cfg(feature = "rdma")]
mod pool;
#[cfg(feature = "rdma")]
mod registry;
#[cfg(feature = "rdma")]
mod transport;
#[cfg(feature = "rdma")]
mod wake;
#[cfg(feature = "rdma")]
mod wr_id;

#[cfg(feature = "rdma")]
pub use admission::PeerRecord;
#[cfg(feature = "rdma")]
pub use carrier::install;
pub use config::RdmaConfig;
#[cfg(feature = "rdma")]
pub use handshake::nic_path;
#[cfg(feature = "rdma")]
pub use transport::*;
