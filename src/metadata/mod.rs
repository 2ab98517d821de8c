//! Segment descriptors, metadata keys and the stores that hold them.
//!
//! * [`conn`] — the metadata connection string of `createTransferEngine`;
//! * [`secret`] — passwords and bearer tokens, kept out of logs;
//! * [`client_tls`] — the clients' TLS files (CA, client certificate);
//! * [`descriptor`] — segment descriptors in Mooncake's JSON encoding;
//! * [`keys`] — store keys (`mooncake/[cluster/]ram/<name>`, `rpc_meta/`)
//!   and the RPC location entry;
//! * [`store`] — the [`store::MetadataStore`] trait;
//! * [`http`] — the HTTP store client ([`http::HttpStore`]);
//! * [`etcd`] — the etcd store client ([`etcd::EtcdStore`]);
//! * [`redis`] — the redis store client ([`redis::RedisStore`]);
//! * [`server`] — our persistent HTTP metadata server (HTTP/1.1 in
//!   `http1`).

pub mod client_tls;
pub mod conn;
pub mod descriptor;
pub mod etcd;
pub mod http;
mod http1;
pub mod keys;
pub mod redis;
pub mod secret;
pub mod server;
pub mod store;

use client_tls::TlsFiles;
use secret::Secret;
use std::path::PathBuf;

/// The metadata store and the descriptor cache. Parsed from `MC_*` variables by
/// [`crate::engine::config::Config::from_env`]; the defaults and bounds
/// (Mooncake's) are declared in `src/engine/config/table.rs`.
/// Files named here are read when an engine opens its store. `Debug` does
/// not show the passwords.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// `MC_DISABLE_METACACHE`: refetch remote descriptors on every use.
    pub metacache: bool,
    /// `MC_TE_METADATA_REFRESH_INTERVAL_SECONDS`; 0 = off.
    pub refresh_interval_secs: u64,
    /// `MC_METADATA_CLUSTER_ID`: key prefix `mooncake/<id>/`.
    pub cluster_id: Option<String>,
    /// `MC_REDIS_USERNAME`.
    pub redis_username: Option<String>,
    /// `MC_REDIS_PASSWORD`.
    pub redis_password: Option<Secret>,
    /// `MC_REDIS_DB_INDEX`.
    pub redis_db_index: u8,
    /// `MC_REDIS_CACERT`, `MC_REDIS_CERT`, `MC_REDIS_KEY`: TLS of
    /// `rediss://` servers.
    pub redis_tls: TlsFiles,
    /// `MC_ETCD_USERNAME` and `MC_ETCD_PASSWORD`: etcd's authentication
    /// (both or neither).
    pub etcd_auth: Option<(String, Secret)>,
    /// `MC_ETCD_CACERT`, `MC_ETCD_CERT`, `MC_ETCD_KEY`: TLS of `https://`
    /// etcd endpoints.
    pub etcd_tls: TlsFiles,
    /// `MC_METADATA_AUTH_TOKEN_FILE`: the bearer token sent to the HTTP
    /// metadata server.
    pub http_token_file: Option<PathBuf>,
    /// `MC_METADATA_CACERT`: CA certificates of an `https://` metadata
    /// server (default: the system's).
    pub http_cacert: Option<PathBuf>,
}

/// Bounds on what a peer's descriptor may hold. Parsed from `MC_*` variables by
/// [`crate::engine::config::Config::from_env`]; the defaults and bounds
/// (Mooncake's) are declared in `src/engine/config/table.rs`.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerLimits {
    /// `MC_PEER_MAX_DEVICES`: most devices (RDMA `devices`,
    /// TCP `tcp_devices`) a peer's descriptor may list.
    pub max_devices: usize,
    /// `MC_PEER_MAX_BUFFERS`: most buffers a peer's
    /// descriptor may list.
    pub max_buffers: usize,
    /// `MC_PEER_MAX_DESCRIPTOR_BYTES`: largest
    /// descriptor read from a metadata store (in P2P mode the reply frame
    /// is bounded by `MC_HANDSHAKE_MAX_LENGTH`).
    pub max_descriptor_bytes: u64,
}
