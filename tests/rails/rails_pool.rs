//! A pool of 2 endpoints per device (SIEVE eviction, the default) serving
//! one initiator and 8 targets in one process: every byte verified, no
//! hang, no descriptor leak (see `rails_support::pool_of_two_serves_eight_peers`).

use crate::rails_support as support;

#[test]
fn sieve_pool_of_two_serves_eight_peers() {
    // SIEVE whatever the environment says.
    support::pool_of_two_serves_eight_peers(&[
        ("MC_MAX_EP_PER_CTX", "2"),
        ("MC_ENDPOINT_STORE_TYPE", "SIEVE"),
    ]);
}
