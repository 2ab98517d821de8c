//! Integration tests of one engine or two in one host through the C API
//! and the Rust API: the header, calls racing each other, the last-error
//! slot, background work that never blocks a caller, introspection,
//! GPU memory detection (with a driver double), loopback and local
//! transfers, unregister fences, slice timeouts, refused settings,
//! notification floods, a peer's death, and the Prometheus metrics.

#[path = "../common/mod.rs"]
mod common;

mod api_races;
mod auth_last_error;
mod bad_config;
mod caller_never_waits;
mod cancel;
mod device_memory;
mod engine_introspection;
mod fence_unregister;
mod gpu_staging_stall;
mod header;
mod local_copy_fence;
mod loopback;
mod metrics_text;
mod notify_delivery;
mod notify_flood;
mod peer_death_bounds;
mod prometheus_scrape;
mod require_transport;
mod slice_timeout;
mod stall_report;
mod strict_local;
mod wait_batch;
