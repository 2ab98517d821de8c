//! Integration tests of the shared-memory transport between processes of
//! one host.

#[path = "../common/mod.rs"]
mod common;

mod shm_engine;
