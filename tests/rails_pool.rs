//! A pool of 2 endpoints per device (SIEVE eviction, the default) serving
//! one initiator and 8 targets in one process: every byte verified, no
//! hang, no descriptor leak (see `rails_support::pool_of_two_serves_eight_peers`).
//! One test per file: the configuration is read once per process.

mod common;
#[path = "rails_support/mod.rs"]
mod support;

#[test]
fn sieve_pool_of_two_serves_eight_peers() {
    // SAFETY: set before any engine (and any engine thread) exists; this
    // is the only test in this process.
    unsafe {
        std::env::set_var("MC_MAX_EP_PER_CTX", "2");
        std::env::remove_var("MC_ENDPOINT_STORE_TYPE");
    }
    support::pool_of_two_serves_eight_peers();
}
