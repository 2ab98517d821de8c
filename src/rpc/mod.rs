//! Handshake RPC: typed frames over TCP, listener and client.
