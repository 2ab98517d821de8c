//! `MC_TE_METADATA_REFRESH_INTERVAL_SECONDS=1` (this binary's own
//! environment): an engine picks up a peer that restarted with new buffers
//! by itself, without `sync_all_segments()` and without a failed
//! connection, within a few seconds, through etcd and through redis; the
//! old buffers are never touched.

mod cluster_common;
mod common;

use cluster_common::{Pickup, Store, init_env, peer_restart};

const ENV: &[(&str, &str)] = &[("MC_TE_METADATA_REFRESH_INTERVAL_SECONDS", "1")];

#[test]
fn background_refresh_through_etcd() {
    init_env(ENV);
    let Some(store) = Store::etcd() else { return };
    peer_restart(&store.conn(), Pickup::Refresh);
}

#[test]
fn background_refresh_through_redis() {
    init_env(ENV);
    let Some(store) = Store::redis() else { return };
    peer_restart(&store.conn(), Pickup::Refresh);
}
