//! transfer-engine moves bytes between the registered memory of processes —
//! KV-cache transfer between prefill and decode nodes, weight loading,
//! checkpointing — over shared memory, RDMA and TCP, and ships as a C ABI
//! library whose header is a drop-in for Mooncake's `transfer_engine_c.h`
//! ([`ffi`]). The Python package and the C API are both built on the Rust
//! API below; Rust programs use it directly.
//!
//! An [`Engine`] has a name its peers open it by, a metadata backend
//! through which they find it (peer-to-peer handshake by default, or
//! etcd, redis, or the HTTP metadata server in [`metadata::server`]), and
//! installed transports. Memory is registered with it; requests go into
//! batches; each request is a READ or WRITE between local memory and a
//! peer's registered memory, moved asynchronously and polled for its
//! [`TaskStatus`].
//!
//! ```
//! use transfer_engine::{Engine, Location, Opcode, Region, Request, TaskStatus};
//!
//! # fn main() -> transfer_engine::Result<()> {
//! // Two engines on loopback, found through the peer-to-peer handshake.
//! let target = Engine::builder("P2PHANDSHAKE", "127.0.0.1").build()?;
//! target.install_transport("tcp", None)?;
//! let mut remote = vec![0u8; 4096];
//! target.register(&[Region {
//!     addr: remote.as_mut_ptr() as u64,
//!     length: remote.len() as u64,
//!     location: Location::Any,
//!     remote_accessible: true,
//! }])?;
//!
//! let initiator = Engine::builder("P2PHANDSHAKE", "127.0.0.1").build()?;
//! initiator.install_transport("tcp", None)?;
//! let segment = initiator.open_segment(target.local_name())?;
//! let local = vec![7u8; 4096];
//! let batch = initiator.allocate_batch(1)?;
//! initiator.submit(
//!     batch,
//!     &[Request {
//!         opcode: Opcode::Write,
//!         source: local.as_ptr() as u64,
//!         target_id: segment,
//!         target_offset: remote.as_ptr() as u64,
//!         length: 4096,
//!     }],
//! )?;
//! while initiator.status(batch, 0)?.0 == TaskStatus::Waiting {
//!     std::thread::sleep(std::time::Duration::from_millis(1));
//! }
//! assert_eq!(initiator.status(batch, 0)?, (TaskStatus::Completed, 4096));
//! initiator.free_batch(batch)?;
//! assert!(remote.iter().all(|&b| b == 7));
//! # Ok(())
//! # }
//! ```

pub(crate) mod auth;
pub(crate) mod batch;
pub(crate) mod clock;
pub mod codes;
pub(crate) mod engine;
pub(crate) mod error;
pub(crate) mod fd_limit;
pub mod ffi;
pub(crate) mod handle;
pub mod info;
pub(crate) mod log_limit;
pub(crate) mod memory;
pub mod metadata;
pub(crate) mod peer_jobs;
pub(crate) mod rpc;
pub(crate) mod segment;
pub(crate) mod serve;
pub(crate) mod settings;
pub(crate) mod small_file;
pub(crate) mod stripe;
pub(crate) mod sync;
pub(crate) mod task_stats;
pub(crate) mod thread_counters;
pub mod topology;
pub(crate) mod transport;
#[cfg(feature = "rdma")]
pub(crate) mod verbs;

pub use batch::{NotifyStatus, TaskStatus};
pub use engine::cancel::CancelOutcome;
pub use engine::config::{
    Config, ConfigError, ConfigResult, LogLevel, Setting, SettingSource, config,
};
pub use engine::wait::{Backoff, BatchState, WaitOutcome};
pub use engine::{AutoChoice, Engine, EngineBuilder, LOCAL_SEGMENT_ID, Opcode, Request};
pub use error::{Error, Result};
pub use ffi::init_logging;
pub use memory::device::{Vendor, residence};
pub use memory::{Location, Region, Residence};
pub use segment::SegmentBuffer;
pub use transport::NicLoad;

/// The engine's own per-slice cost, for `benches/slice_path.rs`; not an API
/// (only with feature `bench-internals`, which the shipped library lacks).
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod __bench {
    pub use crate::transport::scheduler::bench::{SlicePathRun, slice_path};
}
