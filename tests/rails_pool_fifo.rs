//! The same as `rails_pool.rs` with FIFO eviction
//! (`MC_ENDPOINT_STORE_TYPE=FIFO`). One test per file: the configuration
//! is read once per process.

mod common;
#[path = "rails_support/mod.rs"]
mod support;

#[test]
fn fifo_pool_of_two_serves_eight_peers() {
    // SAFETY: set before any engine (and any engine thread) exists; this
    // is the only test in this process.
    unsafe {
        std::env::set_var("MC_MAX_EP_PER_CTX", "2");
        std::env::set_var("MC_ENDPOINT_STORE_TYPE", "FIFO");
    }
    support::pool_of_two_serves_eight_peers();
}
