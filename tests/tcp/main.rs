//! Integration tests of the TCP transport: transfers between engines,
//! the data port's and the handshake port's bounds against slow and hostile
//! peers, Mooncake's wire format from both ends, and peer authentication.

#[path = "../common/mod.rs"]
mod common;

mod auth_peers;
mod cancel;
mod data_port_bounds;
mod data_port_min_rate;
mod data_port_slow_readers;
mod data_port_slowloris;
mod handshake_raw;
mod handshake_replies;
mod handshake_slowloris;
mod local_memory;
mod tcp_engines;
mod wire_client;
mod wire_client_force_v1;
mod wire_client_min_rate;
mod wire_client_timeout;
mod wire_server;
