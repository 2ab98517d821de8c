//! Handshake RPC: typed frames over TCP, listener and client.
//!
//! The wire format is Mooncake's `SocketHandShakePlugin` (spec §3): one
//! request frame and one reply frame per TCP connection, JSON payloads.
//! [`frame`] encodes and decodes frames, [`server`] is the listener that
//! answers them, [`client`] sends one request and reads the reply.
//! Server names (`host:port`, `[v6]:port`, …) are parsed here with
//! Mooncake's `parseHostNameWithPort` rules.

pub mod frame;

pub use frame::{Frame, FrameError, FrameKind, encode, encode_json, read_frame};
