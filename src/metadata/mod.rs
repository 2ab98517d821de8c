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
pub(crate) mod http1;
pub mod keys;
pub mod redis;
pub mod secret;
pub mod server;
pub mod store;

use client_tls::{Tls, TlsFiles};
use secret::{Credentials, Password, Secret};
use std::path::PathBuf;

use crate::settings::{FilePath, Range, Set, Text};

crate::settings::settings! {
    /// The metadata store and the descriptor cache. Each setting (variables, Mooncake's
    /// default and bounds, meaning) is declared once in the table below.
    /// Files named here are read when an engine opens its store. `Debug` does
    /// not show the passwords.
    #[derive(Debug, Clone, PartialEq)]
    pub struct StoreConfig("store") {
        /// `MC_DISABLE_METACACHE`: refetch remote descriptors on every use.
        metacache: bool = true, ["MC_DISABLE_METACACHE"], Set(false),
            "set: refetch a peer's descriptor on every use";
        /// `MC_TE_METADATA_REFRESH_INTERVAL_SECONDS`; 0 = off.
        refresh_interval_secs: u64 = 0, ["MC_TE_METADATA_REFRESH_INTERVAL_SECONDS"],
            Range(0u64, 86400),
            "seconds between background refreshes of peers' descriptors (0: off)";
        /// `MC_METADATA_CLUSTER_ID`: key prefix `mooncake/<id>/`.
        cluster_id: Option<String> = None, ["MC_METADATA_CLUSTER_ID"], Text,
            "key prefix `mooncake/<id>/`: keeps clusters apart on one store";
        /// `MC_REDIS_USERNAME`.
        redis_username: Option<String> = None, ["MC_REDIS_USERNAME"], Text,
            "redis AUTH user";
        /// `MC_REDIS_PASSWORD`.
        redis_password: Option<Secret> = None, ["MC_REDIS_PASSWORD"],
            Password, "redis AUTH password";
        /// `MC_REDIS_DB_INDEX`.
        redis_db_index: u8 = 0, ["MC_REDIS_DB_INDEX"], Range(0u8, 255),
            "redis database";
        /// `MC_REDIS_CACERT`, `MC_REDIS_CERT`, `MC_REDIS_KEY`: TLS of
        /// `rediss://` servers.
        redis_tls: TlsFiles = TlsFiles::default(),
            ["MC_REDIS_CACERT", "MC_REDIS_CERT", "MC_REDIS_KEY"], Tls,
            "TLS of `rediss://` servers: CA (default: the system's), client certificate and \
             its key";
        /// `MC_ETCD_USERNAME` and `MC_ETCD_PASSWORD`: etcd's authentication
        /// (both or neither).
        etcd_auth: Option<(String, Secret)> = None,
            ["MC_ETCD_USERNAME", "MC_ETCD_PASSWORD"], Credentials,
            "etcd authentication";
        /// `MC_ETCD_CACERT`, `MC_ETCD_CERT`, `MC_ETCD_KEY`: TLS of `https://`
        /// etcd endpoints.
        etcd_tls: TlsFiles = TlsFiles::default(),
            ["MC_ETCD_CACERT", "MC_ETCD_CERT", "MC_ETCD_KEY"], Tls,
            "TLS of `https://` etcd endpoints: CA (default: the system's), client certificate \
             and its key";
        /// `MC_METADATA_AUTH_TOKEN_FILE`: the bearer token sent to the HTTP
        /// metadata server.
        http_token_file: Option<PathBuf> = None, ["MC_METADATA_AUTH_TOKEN_FILE"],
            FilePath, "bearer token sent to our HTTP metadata server";
        /// `MC_METADATA_CACERT`: CA certificates of an `https://` metadata
        /// server (default: the system's).
        http_cacert: Option<PathBuf> = None, ["MC_METADATA_CACERT"], FilePath,
            "CA certificates of an `https://` metadata server (default: the system's)";
    };
}

crate::settings::settings! {
    /// Bounds on what a peer's descriptor may hold. Each setting (variables, Mooncake's
    /// default and bounds, meaning) is declared once in the table below.
    #[derive(Debug, Clone, PartialEq)]
    pub struct PeerLimits("peers") {
        /// `MC_PEER_MAX_DEVICES`: most devices (RDMA `devices`,
        /// TCP `tcp_devices`) a peer's descriptor may list.
        max_devices: usize = 64, ["MC_PEER_MAX_DEVICES"], Range(1usize, 4096),
            "most devices (RDMA `devices`, TCP `tcp_devices`) a peer's descriptor may list";
        /// `MC_PEER_MAX_BUFFERS`: most buffers a peer's
        /// descriptor may list.
        max_buffers: usize = 1 << 16, ["MC_PEER_MAX_BUFFERS"], Range(1usize, 1 << 24),
            "most buffers a peer's descriptor may list";
        /// `MC_PEER_MAX_DESCRIPTOR_BYTES`: largest
        /// descriptor read from a metadata store (in P2P mode the reply frame
        /// is bounded by `MC_HANDSHAKE_MAX_LENGTH`).
        max_descriptor_bytes: u64 = 64 << 20, ["MC_PEER_MAX_DESCRIPTOR_BYTES"],
            Range(64u64 << 10, 1 << 30),
            "largest descriptor read from a store (P2P replies are bounded by \
             `MC_HANDSHAKE_MAX_LENGTH`)";
    };
}
