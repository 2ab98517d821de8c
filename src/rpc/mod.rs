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

use crate::settings::{Parse, Range, Reader, Set, Switch, Text};

/// A port Mooncake allows for the RPC range: 1024..=65535, outside the
/// ephemeral range 32768..=60999.
pub(crate) struct Port;

impl Parse<u16> for Port {
    fn parse(&self, raw: &str) -> Option<u16> {
        Range(1024u16, 65535)
            .parse(raw)
            .filter(|p| !(32768..=60999).contains(p))
    }
    fn allowed(&self) -> String {
        "a number in 1024..=65535 outside 32768..=60999".to_string()
    }
    fn show(&self, v: &u16) -> String {
        v.to_string()
    }
}

/// The range of RPC ports is empty when its minimum is above its maximum.
fn check_ports(rpc: &mut RpcConfig, r: &Reader<'_>) {
    if rpc.min_port > rpc.max_port {
        r.error(format!(
            "MC_MIN_RPC_PORT={} MC_MAX_RPC_PORT={} is not a range: the minimum is above \
             the maximum",
            rpc.min_port, rpc.max_port
        ));
        let d = RpcConfig::default();
        (rpc.min_port, rpc.max_port) = (d.min_port, d.max_port);
    }
}

crate::settings::settings! {
    /// The handshake listener and client. Each setting (variables, Mooncake's
    /// default and bounds, meaning) is declared once in the table below.
    #[derive(Debug, Clone, PartialEq)]
    pub struct RpcConfig("rpc") {
        /// `MC_HANDSHAKE_PORT`: port assumed for a server name without one.
        handshake_port: u16 = 12001, ["MC_HANDSHAKE_PORT"], Range(1u16, 65535),
            "port assumed for a P2P name without one";
        /// `MC_MIN_RPC_PORT`.
        min_port: u16 = 15000, ["MC_MIN_RPC_PORT", "MC_MIN_PRC_PORT"], Port,
            "the handshake and TCP data ports are random in `MC_MIN_RPC_PORT..=MC_MAX_RPC_PORT` \
             (also read as Mooncake's spelling `MC_MIN_PRC_PORT`)";
        /// `MC_MAX_RPC_PORT`.
        max_port: u16 = 17000, ["MC_MAX_RPC_PORT", "MC_MAX_PRC_PORT"], Port,
            "the top of that range, at least `MC_MIN_RPC_PORT`";
        /// `MC_HANDSHAKE_LISTEN_BACKLOG`.
        listen_backlog: u32 = 128, ["MC_HANDSHAKE_LISTEN_BACKLOG"], Range(1u32, 65535),
            "listen backlog of the handshake listener";
        /// `MC_HANDSHAKE_CONNECT_TIMEOUT` in seconds.
        connect_timeout_secs: u64 = 5, ["MC_HANDSHAKE_CONNECT_TIMEOUT"], Range(1u64, 3599),
            "seconds: bound on connecting to a peer's listener, including tries again after \
             a reset";
        /// `MC_HANDSHAKE_MAX_LENGTH`: largest handshake frame.
        max_length: u64 = 1 << 20, ["MC_HANDSHAKE_MAX_LENGTH"], Range(1u64 << 20, 128 << 20),
            "largest handshake frame, bytes";
        /// `MC_HANDSHAKE_IO_TIMEOUT` in seconds: the handshake
        /// listener's deadline for a whole request from the accept, for writing
        /// the reply, and for the client's EOF after it.
        io_timeout_secs: u64 = 5, ["MC_HANDSHAKE_IO_TIMEOUT"], Range(1u64, 3600),
            "seconds: the listener's deadline for a whole request from the accept, for the \
             reply, and for the client's EOF after it";
        /// `MC_HANDSHAKE_MAX_CONNECTIONS`: handshake
        /// connections open at once; at the bound the one that has waited
        /// longest for its client (to send a request or take a reply) makes
        /// room for a new one.
        max_connections: usize = 256, ["MC_HANDSHAKE_MAX_CONNECTIONS"], Range(1usize, 65536),
            "handshake connections open at once";
        /// `MC_HANDSHAKE_WORKERS`: threads that run the handlers of
        /// handshake requests.
        workers: usize = 4, ["MC_HANDSHAKE_WORKERS"], Range(1usize, 64),
            "threads answering handshake requests";
        /// `MC_HANDSHAKE_MAX_BUFFERED`: bytes of
        /// handshake requests and replies held across all connections, a reply
        /// until the client has taken it (at least one frame of
        /// `MC_HANDSHAKE_MAX_LENGTH`).
        max_buffered: u64 = 64 << 20, ["MC_HANDSHAKE_MAX_BUFFERED"], Range(1u64 << 20, 64 << 30),
            "bytes of requests and replies held across all connections";
        /// `MC_USE_IPV6`.
        use_ipv6: bool = false, ["MC_USE_IPV6"], Switch,
            "try a peer's IPv6 addresses first",
            mooncake "set at all, even to `0` or empty, turns it on";
        /// `MC_LEGACY_RPC_PORT_BINDING`: bind the RPC port named in the server name.
        legacy_port_binding: bool = false, ["MC_LEGACY_RPC_PORT_BINDING"], Set(true),
            "bind the port named in the server name (Mooncake's old behaviour)";
        /// `MC_TCP_BIND_ADDRESS`: the address advertised in store mode; a
        /// loopback address also confines the engine to loopback.
        bind_address: Option<String> = None, ["MC_TCP_BIND_ADDRESS"], Text,
            "the address advertised with a store; a loopback address confines the engine to \
             loopback";
    } then check_ports;
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
