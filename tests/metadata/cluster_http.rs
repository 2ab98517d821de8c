//! The cluster scenarios through our HTTP metadata server (in this
//! process): two engines, a peer restarting with new buffers (picked up by
//! `sync_all_segments()` and after a failed connection, its old buffers
//! never touched), and notifications.

use crate::cluster_common;

use cluster_common::{Pickup, init_env, notifications, peer_restart, two_engines};
use transfer_engine::metadata::server::MetadataServer;

fn server() -> MetadataServer {
    init_env(&[]);
    MetadataServer::start("127.0.0.1:0", "/metadata", None).expect("metadata server")
}

#[test]
fn two_engines_through_http() {
    let s = server();
    two_engines(&s.url(), ["http-a:1", "http-b:1"]);
    s.shutdown();
}

#[test]
fn peer_restart_picked_up_by_sync_http() {
    let s = server();
    peer_restart(&s.url(), Pickup::Sync);
    s.shutdown();
}

#[test]
fn peer_restart_picked_up_after_a_failed_connection_http() {
    let s = server();
    peer_restart(&s.url(), Pickup::AfterFailure);
    s.shutdown();
}

#[test]
fn notifications_through_http() {
    let s = server();
    notifications(&s.url());
    s.shutdown();
}
