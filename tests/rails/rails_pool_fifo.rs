//! The same as `rails_pool.rs` with FIFO eviction
//! (`MC_ENDPOINT_STORE_TYPE=FIFO`).

use crate::rails_support as support;

#[test]
fn fifo_pool_of_two_serves_eight_peers() {
    support::pool_of_two_serves_eight_peers(&[
        ("MC_MAX_EP_PER_CTX", "2"),
        ("MC_ENDPOINT_STORE_TYPE", "FIFO"),
    ]);
}
