//! `MC_DISABLE_METACACHE=1` (the engines' configuration): every submit
//! refetches the peer's descriptor, so a peer restarted with new buffers is
//! used at once, without a sync or a failed connection, and its old buffers
//! are never touched.

use crate::cluster_common;

use cluster_common::{Pickup, Store, init_env, peer_restart};

#[test]
fn no_metacache_through_redis() {
    init_env(&[("MC_DISABLE_METACACHE", "1")]);
    let Some(store) = Store::redis() else { return };
    peer_restart(&store.conn(), Pickup::NoCache);
}
