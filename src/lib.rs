//! transfer-engine: moves bytes between the registered memory of processes
//! and ships as a C ABI library whose header is a drop-in for Mooncake's
//! `transfer_engine_c.h`.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod batch;
pub mod codes;
pub mod config;
pub mod engine;
pub mod error;
pub(crate) mod fd_limit;
pub mod ffi;
pub mod handle;
pub mod log_limit;
pub mod memory;
pub mod metadata;
pub mod rpc;
pub mod segment;
pub(crate) mod serve;
pub(crate) mod sync;
pub mod topology;
pub mod transport;
#[cfg(feature = "rdma")]
pub mod verbs;
