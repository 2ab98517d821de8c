//! Integration tests of the metadata backends: etcd, redis (plain, with
//! a password, over TLS) and the HTTP metadata server, the cache of peer
//! descriptors, and the bounds on what a store may hand an engine.

mod cluster_common;
#[path = "../common/mod.rs"]
mod common;

mod cluster_etcd;
mod cluster_http;
mod cluster_id;
mod cluster_nocache;
mod cluster_redis;
mod cluster_redis_auth;
mod cluster_rediss;
mod cluster_refresh;
mod cluster_staleness;
mod cluster_store_down;
mod etcd_tls_auth;
mod metadata_server;
mod metadata_server_auth;
mod metadata_server_replies;
mod peer_descriptor_bounds;
mod stores;
