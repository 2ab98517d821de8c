//! Segment descriptors, metadata keys and the stores that hold them.
//!
//! * [`conn`] — the metadata connection string of `createTransferEngine`;
//! * [`descriptor`] — segment descriptors in Mooncake's JSON encoding;
//! * [`keys`] — store keys (`mooncake/[cluster/]ram/<name>`, `rpc_meta/`)
//!   and the RPC location entry;
//! * [`store`] — the [`store::MetadataStore`] trait;
//! * [`http`] — the HTTP store client ([`http::HttpStore`]);
//! * [`etcd`] — the etcd store client ([`etcd::EtcdStore`]);
//! * [`redis`] — the redis store client ([`redis::RedisStore`]);
//! * [`server`] — our persistent HTTP metadata server (HTTP/1.1 in
//!   `http1`).

pub mod conn;
pub mod descriptor;
pub mod etcd;
pub mod http;
mod http1;
pub mod keys;
pub mod redis;
pub mod server;
pub mod store;
