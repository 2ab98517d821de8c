//! Integration tests of several rails (NICs) per engine: the endpoint
//! pool and its eviction, per-NIC loads and the server's descriptors.

#[path = "../common/mod.rs"]
mod common;
mod rails_support;

mod rails_nic_loads;
mod rails_pool;
mod rails_pool_fifo;
mod rails_server_fds;
