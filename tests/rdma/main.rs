//! Integration tests of the RDMA transport on real verbs devices: run
//! inside the soft-RoCE VM of `scripts/rdma-vm/` (elsewhere ignored).

#[path = "../common/mod.rs"]
mod common;
mod rdma_support;

mod rdma_api_races;
mod rdma_auth;
mod rdma_cancel;
mod rdma_connector;
mod rdma_fallback;
mod rdma_handshake;
mod rdma_pool;
mod rdma_transfers;
