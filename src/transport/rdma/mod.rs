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

use crate::metadata::descriptor::Layout;
use crate::rpc::FrameKind;
use crate::transport::{Discovery, Want};
use serde_json::{Value, json};

/// The protocol name of this transport, as `installTransport` and
/// descriptors (Mooncake's `rdma`) write it.
pub const PROTOCOL: &str = "rdma";

/// Descriptor protocol of Mooncake's EFA transport, laid out as RDMA's.
pub const EFA: &str = "efa";

/// Descriptor protocol of Mooncake's CXI transport, laid out as RDMA's.
pub const CXI: &str = "cxi";

/// Descriptor protocol of Mooncake's Barex transport: RDMA's layout, with
/// the whole key vector per buffer, not one key per device.
pub const BAREX: &str = "barex";

/// The layout of an RDMA descriptor.
pub const LAYOUT: Layout = Layout::RdmaLike {
    keys_per_device: true,
};

/// The layout of a Barex descriptor.
pub const BAREX_LAYOUT: Layout = Layout::RdmaLike {
    keys_per_device: false,
};

/// The handshake frame that connects queue pairs (Mooncake's Connection
/// request, `HandShakeDesc`).
pub const HANDSHAKE: FrameKind = FrameKind::Connection;

/// The answer to a [`HANDSHAKE`] frame when this transport is not
/// installed: Mooncake's reply shape, with the reason.
pub fn not_installed() -> Value {
    json!({
        "local_nic_path": "",
        "local_lid": 0,
        "local_gid": "",
        "peer_nic_path": "",
        "qp_num": [],
        "reply_msg": "this engine has no RDMA transport installed",
    })
}

/// Whether auto discovery installs RDMA, as Mooncake: when RDMA devices
/// with an active port exist and `MC_FORCE_TCP` is not set; with
/// `MC_FORCE_HCA` whatever was found and whatever `MC_FORCE_TCP` says, and
/// then an RDMA that cannot be set up fails the engine.
pub fn auto(found: &Discovery<'_>) -> Want {
    if found.force_hca {
        if found.force_tcp {
            tracing::info!("MC_FORCE_HCA overrides MC_FORCE_TCP: installing rdma");
        }
        return Want::Must("MC_FORCE_HCA is set");
    }
    let usable = found
        .topology
        .rdma_devices
        .iter()
        .filter(|d| d.ports_active)
        .count();
    if found.force_tcp {
        Want::No("MC_FORCE_TCP is set")
    } else if usable == 0 {
        Want::No("no RDMA device with an active port")
    } else if cfg!(feature = "rdma") {
        Want::Try
    } else {
        tracing::warn!(
            "{usable} RDMA device(s) found, but this build has no RDMA transport \
             (feature \"rdma\"); using another transport"
        );
        Want::No("this build has no RDMA transport (feature \"rdma\")")
    }
}

/// Without the `rdma` feature: RDMA cannot be installed, and the error
/// says so.
#[cfg(not(feature = "rdma"))]
pub fn install(
    _: &crate::transport::InstallContext<'_>,
) -> crate::error::Result<std::sync::Arc<dyn crate::transport::Transport>> {
    Err(crate::error::Error::DeviceNotFound(
        "transport \"rdma\" is not available in this build (install \"tcp\", or \
         build with the \"rdma\" feature)"
            .into(),
    ))
}
