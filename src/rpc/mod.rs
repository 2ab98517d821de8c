//! Handshake RPC: typed frames over TCP, listener and client.
//!
//! The wire format is Mooncake's `SocketHandShakePlugin` (spec §3): one
//! request frame and one reply frame per TCP connection, JSON payloads.
//! [`frame`] encodes and decodes frames, [`server`] is the listener that
//! answers them, [`client`] sends one request and reads the reply.
//! Server names (`host:port`, `[v6]:port`, …) are parsed here with
//! Mooncake's `parseHostNameWithPort` rules.

pub mod client;
pub mod frame;
pub mod server;

pub use client::{Cancel, ClientOptions, call};
pub use frame::FrameKind;
pub use server::{RpcServer, ServerOptions, bind_in_range, bind_in_range_on};

use std::io::{self, Read};
use std::net::{Ipv6Addr, TcpStream};
use std::time::{Duration, Instant};
use tracing::warn;

/// The handshake listener and client. Parsed from `MC_*` variables by
/// [`crate::engine::config::Config::from_env`]; the defaults and bounds
/// (Mooncake's) are declared in `src/engine/config/table.rs`.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcConfig {
    /// `MC_HANDSHAKE_PORT`: port assumed for a server name without one.
    pub handshake_port: u16,
    /// `MC_MIN_RPC_PORT`.
    pub min_port: u16,
    /// `MC_MAX_RPC_PORT`.
    pub max_port: u16,
    /// `MC_HANDSHAKE_LISTEN_BACKLOG`.
    pub listen_backlog: u32,
    /// `MC_HANDSHAKE_CONNECT_TIMEOUT` in seconds.
    pub connect_timeout_secs: u64,
    /// `MC_HANDSHAKE_MAX_LENGTH`: largest handshake frame.
    pub max_length: u64,
    /// `MC_HANDSHAKE_IO_TIMEOUT` in seconds: the handshake
    /// listener's deadline for a whole request from the accept, for writing
    /// the reply, and for the client's EOF after it.
    pub io_timeout_secs: u64,
    /// `MC_HANDSHAKE_MAX_CONNECTIONS`: handshake
    /// connections open at once; at the bound the one that has waited
    /// longest for its client (to send a request or take a reply) makes
    /// room for a new one.
    pub max_connections: usize,
    /// `MC_HANDSHAKE_WORKERS`: threads that run the handlers of
    /// handshake requests.
    pub workers: usize,
    /// `MC_HANDSHAKE_MAX_BUFFERED`: bytes of
    /// handshake requests and replies held across all connections, a reply
    /// until the client has taken it (at least one frame of
    /// `MC_HANDSHAKE_MAX_LENGTH`).
    pub max_buffered: u64,
    /// `MC_USE_IPV6`.
    pub use_ipv6: bool,
    /// `MC_LEGACY_RPC_PORT_BINDING`: bind the RPC port named in the server name.
    pub legacy_port_binding: bool,
    /// `MC_TCP_BIND_ADDRESS`: the address advertised in store mode; a
    /// loopback address also confines the engine to loopback.
    pub bind_address: Option<String>,
}

/// Reads from a socket with one overall deadline: before each read the
/// socket's receive timeout is set to the time left, so a peer trickling
/// bytes cannot stretch a frame read past the deadline.
struct DeadlineReader<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl<'a> DeadlineReader<'a> {
    /// A reader whose reads must all finish within `timeout` from now.
    fn new(stream: &'a TcpStream, timeout: Duration) -> Self {
        DeadlineReader {
            stream,
            deadline: Instant::now() + timeout,
        }
    }
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "handshake read timed out");
        if left.is_zero() {
            return Err(timed_out());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        match stream.read(buf) {
            // SO_RCVTIMEO expiry surfaces as EAGAIN.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(timed_out()),
            r => r,
        }
    }
}

/// True when `s` is an IPv6 literal, optionally with a `%scope` suffix
/// (`fe80::1%eth0`). A `:` after the scope means a port follows, which is
/// not a pure address (Mooncake's `isValidIpV6`).
fn is_ipv6_literal(s: &str) -> bool {
    match s.find('%') {
        None => s.parse::<Ipv6Addr>().is_ok(),
        Some(scope) => !s[scope..].contains(':') && s[..scope].parse::<Ipv6Addr>().is_ok(),
    }
}

/// Parses a port like C++ `std::from_chars` into `uint16_t`: decimal digits
/// only (no sign, no spaces), in range; anything else gives `default_port`.
fn port_or_default(s: &str, default_port: u16, name: &str) -> u16 {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match s.parse::<u16>() {
        Ok(p) if digits => p,
        _ => {
            warn!(
                "illegal port number {s:?} in server name {name:?}; using default port {default_port}"
            );
            default_port
        }
    }
}

/// Splits an IPv6 server name into host and port text, or `None` if the
/// name is not in one of the IPv6 forms (Mooncake's `extractIPv6HostAndPort`).
fn split_ipv6(name: &str) -> Option<(&str, &str)> {
    if let Some(rest) = name.strip_prefix('[') {
        // `[v6]` or `[v6]:port`; an invalid bracketed host falls back to the
        // plain `host:port` rules.
        let close = rest.find(']')?;
        let host = &rest[..close];
        if !is_ipv6_literal(host) {
            return None;
        }
        let after = &rest[close..];
        let port = after.find(':').map_or("", |c| &after[c + 1..]);
        return Some((host, port));
    }
    if is_ipv6_literal(name) {
        return Some((name, ""));
    }
    // `fe80::1%eth0:12345`: a scope id followed by a port.
    let scope = name.find('%')?;
    let colon = scope + name[scope..].find(':')?;
    let host = &name[..colon];
    is_ipv6_literal(host).then(|| (host, &name[colon + 1..]))
}

/// Splits a server name into host and port like Mooncake's
/// `parseHostNameWithPort`.
///
/// Accepted forms: `host`, `host:port`, `[v6]`, `[v6]:port`, a bare IPv6
/// literal (`::1`, `fe80::1`, `fe80::1%eth0`, taken whole as the host), and
/// `fe80::1%eth0:port`. Otherwise the last `:` splits host and port. A
/// missing or invalid port (not decimal, out of range) gives `default_port`
/// (normally `MC_HANDSHAKE_PORT`). The returned host has no brackets.
pub fn parse_host_port(name: &str, default_port: u16) -> (String, u16) {
    if let Some((host, port)) = split_ipv6(name) {
        let port = if port.is_empty() {
            default_port
        } else {
            port_or_default(port, default_port, name)
        };
        return (host.to_string(), port);
    }
    match name.rfind(':') {
        None => (name.to_string(), default_port),
        Some(c) => (
            name[..c].to_string(),
            port_or_default(&name[c + 1..], default_port, name),
        ),
    }
}

/// The server name `host:port` (an IPv6 literal in brackets): the name a
/// P2P engine takes from its handshake listener's host and port.
pub fn server_name(host: &str, port: u16) -> String {
    format!("{}:{port}", wrap_ipv6(host))
}

/// A P2P server name in the one form its engine takes: `host:port`, the
/// port `default_port` (`MC_HANDSHAKE_PORT`) when the name has none, as
/// the handshake connection goes there (`127.0.0.1` and `127.0.0.1:12001`
/// name the same engine).
pub fn canonical_name(name: &str, default_port: u16) -> String {
    let (host, port) = parse_host_port(name, default_port);
    server_name(&host, port)
}

/// Wraps a bare IPv6 literal in brackets (`::1` → `[::1]`) so that a port
/// can be appended; any other host (IPv4, a name, an already bracketed
/// literal) is returned unchanged (Mooncake's `maybeWrapIpV6`).
pub fn wrap_ipv6(host: &str) -> String {
    if is_ipv6_literal(host) {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str) -> (String, u16) {
        parse_host_port(name, 12001)
    }

    #[test]
    fn host_and_host_port() {
        assert_eq!(p("node1"), ("node1".into(), 12001));
        assert_eq!(p("node1:15000"), ("node1".into(), 15000));
        assert_eq!(p("10.0.0.1:80"), ("10.0.0.1".into(), 80));
        assert_eq!(p(""), ("".into(), 12001));
    }

    #[test]
    fn invalid_port_gives_default() {
        assert_eq!(p("node1:"), ("node1".into(), 12001));
        assert_eq!(p("node1:abc"), ("node1".into(), 12001));
        assert_eq!(p("node1:70000"), ("node1".into(), 12001));
        assert_eq!(p("node1:+80"), ("node1".into(), 12001));
        assert_eq!(p("node1:-1"), ("node1".into(), 12001));
        assert_eq!(p("node1: 80"), ("node1".into(), 12001));
        // Only the last colon splits.
        assert_eq!(p("a:b:99"), ("a:b".into(), 99));
    }

    #[test]
    fn bracketed_ipv6() {
        assert_eq!(p("[::1]"), ("::1".into(), 12001));
        assert_eq!(p("[::1]:17000"), ("::1".into(), 17000));
        assert_eq!(p("[fe80::1%eth0]:80"), ("fe80::1%eth0".into(), 80));
        assert_eq!(p("[::1]:"), ("::1".into(), 12001));
        assert_eq!(p("[::1]:x"), ("::1".into(), 12001));
        // Not an IPv6 literal inside the brackets: plain host:port rules.
        assert_eq!(p("[node]:80"), ("[node]".into(), 80));
    }

    #[test]
    fn bare_ipv6() {
        assert_eq!(p("::1"), ("::1".into(), 12001));
        assert_eq!(p("fe80::1"), ("fe80::1".into(), 12001));
        assert_eq!(p("fe80::1%eth0"), ("fe80::1%eth0".into(), 12001));
        assert_eq!(p("fe80::1%eth0:15001"), ("fe80::1%eth0".into(), 15001));
        // A bare literal is taken whole, even if it ends like a port.
        assert_eq!(p("2001:db8::8080"), ("2001:db8::8080".into(), 12001));
    }

    #[test]
    fn wrap() {
        assert_eq!(wrap_ipv6("::1"), "[::1]");
        assert_eq!(wrap_ipv6("fe80::1%eth0"), "[fe80::1%eth0]");
        assert_eq!(wrap_ipv6("10.0.0.1"), "10.0.0.1");
        assert_eq!(wrap_ipv6("node1"), "node1");
        assert_eq!(wrap_ipv6("[::1]"), "[::1]");
        let (h, port) = p(&format!("{}:{}", wrap_ipv6("fe80::2"), 15123));
        assert_eq!((h.as_str(), port), ("fe80::2", 15123));
    }

    #[test]
    fn canonical_names_carry_the_port() {
        let c = |n| canonical_name(n, 12001);
        assert_eq!(c("127.0.0.1"), "127.0.0.1:12001");
        assert_eq!(c("127.0.0.1:12001"), "127.0.0.1:12001");
        assert_eq!(c("127.0.0.1:15000"), "127.0.0.1:15000");
        assert_eq!(c("node1"), "node1:12001");
        assert_eq!(c("::1"), "[::1]:12001");
        assert_eq!(c("[::1]"), "[::1]:12001");
        assert_eq!(c("[::1]:15000"), "[::1]:15000");
        assert_eq!(c("node1:bad"), "node1:12001");
        assert_eq!(server_name("fe80::1%eth0", 80), "[fe80::1%eth0]:80");
    }
}
