//! The handshake listener (spec §3.1).
//!
//! Per connection, as Mooncake's `SocketHandShakePlugin` does: read one
//! frame, parse its JSON, dispatch by type, write the reply with the same
//! type (a legacy frame is answered without a type byte), `shutdown(SHUT_WR)`,
//! wait for the client's EOF, close. Unlike Mooncake's single serial thread,
//! the listener is event-driven ([`crate::serve`]): one thread reads the
//! frames of many connections, each with a deadline from its accept, and a
//! small pool of threads runs the handlers of complete requests (Probe is
//! answered at once). A slow, silent or malformed client, or a panicking
//! handler, closes only its own connection; at the connection bound, and
//! when requests and replies fill the buffer bound, the connection that has
//! waited longest for its client (to send its request or take its reply)
//! makes room.

use super::RpcConfig;
use super::frame::{Frame, FrameKind, Taken, encode_json, header, take_frame};
use crate::auth::wire::refusal;
use crate::auth::{Listener, ServerAuth, ServerStep};
use crate::serve::{self, Dispatch, Parse, Reply, Service, Then};
use serde_json::{Value, json};
use socket2::{Domain, Socket, Type};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;
use tracing::debug;

/// Attempts of [`bind_in_range`] before it gives up (Mooncake's value).
const BIND_ATTEMPTS: u32 = 500;
/// Backlog [`bind_in_range`] listens with; [`RpcServer::start`] then
/// applies [`ServerOptions::listen_backlog`].
const DEFAULT_BACKLOG: libc::c_int = 128;

/// Answers the Connection, Metadata and Notify requests of the handshake
/// listener. Probe requests are answered by the server itself.
pub trait RpcHandler: Send + Sync + 'static {
    /// Returns the reply to one request that came from `peer` (the
    /// connection's source address). Legacy (untyped) frames arrive as
    /// [`FrameKind::Connection`]. A panic closes that connection without a
    /// reply; the server keeps serving. Handlers run on a small pool of
    /// threads ([`ServerOptions::workers`]): one that blocks holds a thread.
    fn handle(&self, kind: FrameKind, request: Value, peer: SocketAddr) -> Value;

    /// The reply to a `kind` request when it is the same for every client
    /// (the descriptor): compact JSON ending in `\n`, built once and shared
    /// by the replies that send it instead of copied into each. `None`:
    /// [`RpcHandler::handle`] answers.
    fn shared_reply(&self, _kind: FrameKind) -> Option<Arc<[u8]>> {
        None
    }
}

/// Limits of the handshake listener.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Largest accepted frame length (`MC_HANDSHAKE_MAX_LENGTH`).
    pub max_frame_len: u64,
    /// Deadline for the whole request from the accept, for writing the
    /// reply, and for the client's EOF after the reply
    /// (`MC_HANDSHAKE_IO_TIMEOUT`, 5 s, as Mooncake's `SO_RCVTIMEO`).
    pub io_timeout: Duration,
    /// Connections open at once (`MC_HANDSHAKE_MAX_CONNECTIONS`, 256). At
    /// the bound a new connection closes the one that has waited longest
    /// for its client (to send its request or take its reply); when all
    /// have requests in handlers, new ones wait in the listen backlog.
    pub max_connections: usize,
    /// Threads that run handlers (`MC_HANDSHAKE_WORKERS`, 4).
    pub workers: usize,
    /// Bytes of requests and replies buffered across all connections, a
    /// reply until the client has taken it (`MC_HANDSHAKE_MAX_BUFFERED`,
    /// 64 MiB; at least one frame of [`ServerOptions::max_frame_len`]). At
    /// the bound the connection that has waited longest for its client is
    /// closed.
    pub max_buffered: u64,
    /// Listen backlog applied to the listener (`MC_HANDSHAKE_LISTEN_BACKLOG`).
    pub listen_backlog: u32,
    /// With a cluster key: every connection proves it holds the key
    /// before any frame is served (see [`crate::auth`]).
    pub auth: Option<Arc<Listener>>,
}

impl ServerOptions {
    /// The options for a parsed configuration.
    pub fn from_config(c: &RpcConfig) -> Self {
        ServerOptions {
            max_frame_len: c.max_length,
            io_timeout: Duration::from_secs(c.io_timeout_secs),
            max_connections: c.max_connections,
            workers: c.workers,
            max_buffered: c.max_buffered,
            listen_backlog: c.listen_backlog,
            auth: None,
        }
    }
}

impl Default for ServerOptions {
    /// The options for the default configuration.
    fn default() -> Self {
        ServerOptions::from_config(&RpcConfig::default())
    }
}

/// A running handshake listener: one poll thread and
/// [`ServerOptions::workers`] handler threads. [`RpcServer::shutdown`]
/// (also run on drop) stops and joins all of them.
pub struct RpcServer {
    port: u16,
    server: serve::Server,
}

/// The handshake protocol as a [`Service`].
struct Handshake {
    handler: Arc<dyn RpcHandler>,
    max_frame_len: u64,
    auth: Option<Arc<Listener>>,
}

/// Where a connection stands with authentication.
#[derive(Default)]
enum Admission {
    /// Nothing received yet.
    #[default]
    New,
    /// The exchange is under way.
    Proving(Box<ServerAuth>),
    /// Authenticated, or no key: frames are served.
    Admitted,
}

/// A complete request: its kind, the kind of the reply (`None` for a
/// legacy frame), and its JSON text.
type HandshakeRequest = (FrameKind, Option<FrameKind>, Vec<u8>);

impl Handshake {
    fn json(kind: FrameKind, payload: &[u8]) -> Result<Value, String> {
        serde_json::from_slice(payload).map_err(|e| {
            format!(
                "malformed JSON in {kind:?} request ({} bytes): {e}",
                payload.len()
            )
        })
    }

    fn reply(reply_kind: Option<FrameKind>, v: &Value) -> Reply {
        Reply::owned(encode_json(reply_kind, v), Then::Linger)
    }

    /// Moves a connection's authentication on with the bytes received:
    /// the frames to send (the challenge, our proof), or the refusal
    /// that closes the connection. Without a key every connection is
    /// admitted at once.
    fn admit(
        &self,
        admission: &mut Admission,
        buf: &mut Vec<u8>,
    ) -> Result<Option<Vec<u8>>, Parse<HandshakeRequest>> {
        let Some(listener) = &self.auth else {
            *admission = Admission::Admitted;
            return Ok(None);
        };
        if matches!(admission, Admission::New) {
            let side = ServerAuth::new(listener.clone()).map_err(|e| Parse::Invalid {
                reason: e.to_string(),
                reply: None,
            })?;
            *admission = Admission::Proving(Box::new(side));
        }
        let mut out = Vec::new();
        while let Admission::Proving(side) = admission {
            let (taken, step) = side.advance(buf);
            buf.drain(..taken);
            match step {
                ServerStep::Wait(_) => break,
                ServerStep::Send(bytes) => out.extend_from_slice(&bytes),
                ServerStep::Accepted(bytes) => {
                    out.extend_from_slice(&bytes);
                    *admission = Admission::Admitted;
                }
                ServerStep::Refused(reason) => {
                    return Err(Parse::Invalid {
                        reason: format!("refused: {reason}"),
                        reply: Some(refusal(reason)),
                    });
                }
            }
        }
        Ok((!out.is_empty()).then_some(out))
    }
}

impl Service for Handshake {
    type Request = HandshakeRequest;
    type Parser = Admission;
    const NAME: &'static str = "handshake";
    const SETTINGS: serve::Settings = serve::Settings {
        connections: "MC_HANDSHAKE_MAX_CONNECTIONS",
        buffered: "MC_HANDSHAKE_MAX_BUFFERED",
        timeout: "MC_HANDSHAKE_IO_TIMEOUT",
    };

    fn parse(&self, admission: &mut Admission, buf: &mut Vec<u8>) -> Parse<HandshakeRequest> {
        let interim = match self.admit(admission, buf) {
            Ok(None) => None,
            Ok(Some(reply)) if matches!(admission, Admission::Admitted) => Some(reply),
            Ok(Some(reply)) => {
                return Parse::More {
                    interim: Some(reply),
                    want: None,
                };
            }
            Err(invalid) => return invalid,
        };
        if !matches!(admission, Admission::Admitted) {
            return Parse::More {
                interim: None,
                want: None,
            };
        }
        match take_frame(buf, self.max_frame_len) {
            Ok(Taken::Partial(want)) => Parse::More { interim, want },
            Ok(Taken::Whole(Frame::Typed(k, p))) => Parse::Done((k, Some(k), p)),
            Ok(Taken::Whole(Frame::Legacy(p))) => Parse::Done((FrameKind::Connection, None, p)),
            Err(e) => Parse::Invalid {
                reason: e.to_string(),
                reply: None,
            },
        }
    }

    fn dispatch(&self, request: HandshakeRequest) -> Dispatch<HandshakeRequest> {
        let (kind, reply_kind, payload) = request;
        if kind != FrameKind::Probe {
            return Dispatch::Work((kind, reply_kind, payload));
        }
        match Self::json(kind, &payload) {
            Ok(_) => Dispatch::Reply(Self::reply(reply_kind, &json!({"status": "success"}))),
            Err(e) => Dispatch::Close(e),
        }
    }

    fn handle(&self, peer: SocketAddr, request: HandshakeRequest) -> Result<Reply, String> {
        let (kind, reply_kind, payload) = request;
        let request = Self::json(kind, &payload)?;
        drop(payload);
        if let Some(text) = self.handler.shared_reply(kind) {
            return Ok(Reply {
                bytes: header(reply_kind, text.len()),
                shared: Some(text),
                then: Then::Linger,
            });
        }
        let reply = self.handler.handle(kind, request, peer);
        Ok(Self::reply(reply_kind, &reply))
    }
}

impl RpcServer {
    /// Serves handshake requests arriving on `listener` (which must already
    /// listen, e.g. from [`bind_in_range`]) with `handler`, until
    /// [`RpcServer::shutdown`].
    pub fn start(
        listener: TcpListener,
        handler: Arc<dyn RpcHandler>,
        opts: ServerOptions,
    ) -> io::Result<RpcServer> {
        let port = listener.local_addr()?.port();
        let backlog = libc::c_int::try_from(opts.listen_backlog).unwrap_or(libc::c_int::MAX);
        // SAFETY: the fd is a live socket owned by `listener`; listen() on a
        // listening socket only updates its backlog (Linux).
        if unsafe { libc::listen(listener.as_raw_fd(), backlog) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // One frame of the largest length, and one read beyond it, always fit.
        let min_buffered = opts.max_frame_len.saturating_add(128 << 10);
        let serve_opts = serve::Options {
            max_connections: opts.max_connections.max(1),
            request_timeout: opts.io_timeout,
            write_timeout: opts.io_timeout,
            linger_timeout: opts.io_timeout,
            max_buffered: usize::try_from(opts.max_buffered.max(min_buffered))
                .unwrap_or(usize::MAX),
            workers: opts.workers.max(1),
            thread_name: "te-rpc",
            tls: None,
        };
        let service = Arc::new(Handshake {
            handler,
            max_frame_len: opts.max_frame_len,
            auth: opts.auth,
        });
        let server = serve::Server::start(listener, service, serve_opts)?;
        debug!("handshake listener serving port {port}");
        Ok(RpcServer { port, server })
    }

    /// The port the listener is bound to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops accepting, closes the connections in progress and joins every
    /// thread the server started: returns at once unless handlers are
    /// running, then as soon as they return (their replies are still sent).
    /// Idempotent.
    ///
    /// Called from a handler (directly, or by dropping the last owner of
    /// the server), it does not wait: that handler's reply is still sent,
    /// and the server's threads end by themselves right after.
    pub fn shutdown(&self) {
        self.server.shutdown();
    }
}

/// A pseudo-random number (std's randomly keyed SipHash of `seed`).
fn random(seed: u64) -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(seed);
    h.finish()
}

/// Binds and listens on `port` of `ip` (a wildcard `[::]` is dual-stack),
/// without `SO_REUSEADDR` as Mooncake does.
fn bind_port(port: u16, ip: IpAddr) -> io::Result<TcpListener> {
    let domain = if ip.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let socket = Socket::new(domain, Type::STREAM, None)?;
    if ip == IpAddr::V6(Ipv6Addr::UNSPECIFIED) {
        socket.set_only_v6(false)?;
    }
    socket.bind(&SocketAddr::new(ip, port).into())?;
    socket.listen(DEFAULT_BACKLOG)?;
    Ok(socket.into())
}

/// Listens on a random free port in `[min, max]` of the wildcard address
/// (`0.0.0.0`, or dual-stack `[::]` when `ipv6`), as Mooncake's
/// `findAvailableTcpPort`: up to 500 random tries, then the last error.
/// The listener's backlog is 128 until [`RpcServer::start`] applies
/// [`ServerOptions::listen_backlog`].
pub fn bind_in_range(min: u16, max: u16, ipv6: bool) -> io::Result<TcpListener> {
    let any = if ipv6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    bind_in_range_on(min, max, any)
}

/// [`bind_in_range`] on one address `ip` (e.g. loopback only).
pub fn bind_in_range_on(min: u16, max: u16, ip: IpAddr) -> io::Result<TcpListener> {
    if min > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "RPC port range {min}..={max} is empty (check MC_MIN_RPC_PORT/MC_MAX_RPC_PORT)"
            ),
        ));
    }
    let span = u64::from(max - min) + 1;
    let mut last = None;
    for attempt in 0..BIND_ATTEMPTS {
        // `random(..) % span < span <= 65536`, so the sum fits in u16.
        let port = min + (random(u64::from(attempt)) % span) as u16;
        match bind_port(port, ip) {
            Ok(l) => return Ok(l),
            Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    let e = last.map_or_else(|| "no attempt".to_string(), |e| e.to_string());
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("no free RPC port in {min}..={max} after {BIND_ATTEMPTS} tries: {e}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::rpc::client::{ClientOptions, call};
    use crate::rpc::frame::{encode, read_frame};
    use crate::sync;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::thread;
    use std::time::Instant;

    /// Echoes the request with the kind it arrived as; panics on request.
    struct Echo {
        calls: AtomicUsize,
    }

    impl RpcHandler for Echo {
        fn handle(&self, kind: FrameKind, request: Value, _peer: SocketAddr) -> Value {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if request.get("panic").is_some() {
                panic!("handler asked to panic");
            }
            json!({"kind": kind as u8, "echo": request})
        }
    }

    fn start(opts: ServerOptions) -> (RpcServer, Arc<Echo>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let echo = Arc::new(Echo {
            calls: AtomicUsize::new(0),
        });
        let server = RpcServer::start(listener, echo.clone(), opts).expect("start");
        (server, echo)
    }

    fn client() -> ClientOptions {
        ClientOptions {
            io_timeout: Duration::from_secs(10),
            ..ClientOptions::default()
        }
    }

    fn raw(port: u16) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s
    }

    /// Reads until the server closes; true if it closed (EOF or reset).
    fn closed_by_server(mut s: TcpStream) -> bool {
        let mut buf = Vec::new();
        match s.read_to_end(&mut buf) {
            Ok(_) => true,
            Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
        }
    }

    #[test]
    fn typed_requests_go_to_the_handler_with_their_type() {
        let (server, echo) = start(ServerOptions::default());
        for kind in [
            FrameKind::Connection,
            FrameKind::Metadata,
            FrameKind::Notify,
        ] {
            let req = json!({"name": "seg", "n": 7});
            let reply = call("127.0.0.1", server.port(), kind, &req, &client()).expect("call");
            assert_eq!(reply, json!({"kind": kind as u8, "echo": req}));
        }
        assert_eq!(echo.calls.load(Ordering::SeqCst), 3);
    }

    /// Answers with the address the request came from.
    struct Who;

    impl RpcHandler for Who {
        fn handle(&self, _kind: FrameKind, _request: Value, peer: SocketAddr) -> Value {
            json!({"peer": peer.to_string()})
        }
    }

    #[test]
    fn the_handler_learns_the_source_address() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let server =
            RpcServer::start(listener, Arc::new(Who), ServerOptions::default()).expect("start");
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        sock.bind(&SocketAddr::from(([127, 0, 0, 2], 0)).into())
            .expect("bind 127.0.0.2");
        sock.connect(&SocketAddr::from(([127, 0, 0, 1], server.port())).into())
            .expect("connect");
        let mut s: TcpStream = sock.into();
        let from = s.local_addr().expect("local address");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s.write_all(&encode(Some(FrameKind::Connection), b"{}\n"))
            .expect("write");
        let Frame::Typed(_, payload) = read_frame(&mut s, 1 << 20).expect("reply") else {
            panic!("expected a typed reply");
        };
        let reply: Value = serde_json::from_slice(&payload).expect("json");
        assert_eq!(reply, json!({"peer": from.to_string()}));
        assert!(from.to_string().starts_with("127.0.0.2:"));
        server.shutdown();
    }

    #[test]
    fn probe_is_answered_by_the_server() {
        let (server, echo) = start(ServerOptions::default());
        let reply = call(
            "127.0.0.1",
            server.port(),
            FrameKind::Probe,
            &json!({}),
            &client(),
        )
        .expect("probe");
        assert_eq!(reply, json!({"status": "success"}));
        assert_eq!(echo.calls.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn legacy_frame_is_a_connection_answered_without_type_byte() {
        let (server, _echo) = start(ServerOptions::default());
        let mut s = raw(server.port());
        s.write_all(&encode(None, b"{\"qp_num\":[1,2]}\n"))
            .expect("write");
        let frame = read_frame(&mut s, 1 << 20).expect("reply");
        let Frame::Legacy(payload) = frame else {
            panic!("expected an untyped reply, got {frame:?}");
        };
        let reply: Value = serde_json::from_slice(&payload).expect("json");
        assert_eq!(reply, json!({"kind": 0, "echo": {"qp_num": [1, 2]}}));
        assert!(payload.ends_with(b"\n"));
        // The server half-closed after the reply.
        assert!(closed_by_server(s));
    }

    #[test]
    fn bad_connections_do_not_stop_other_clients() {
        let (server, _echo) = start(ServerOptions::default());
        let port = server.port();
        let idle = raw(port);
        let mut http = raw(port);
        http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        let mut tls = raw(port);
        tls.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc])
            .expect("write");
        let mut oversized = raw(port);
        oversized
            .write_all(&((1u64 << 20) + 1).to_ne_bytes())
            .expect("write");
        let mut zero = raw(port);
        zero.write_all(&0u64.to_ne_bytes()).expect("write");
        let mut bad_json = raw(port);
        bad_json
            .write_all(&encode(Some(FrameKind::Metadata), b"{not json"))
            .expect("write");
        let mut partial = raw(port);
        partial.write_all(&100u64.to_ne_bytes()).expect("write");

        // While the idle and partial sockets are held open, a real client
        // is served promptly.
        let t = Instant::now();
        let reply = call(
            "127.0.0.1",
            port,
            FrameKind::Metadata,
            &json!({"x": 1}),
            &client(),
        )
        .expect("call beside bad connections");
        assert_eq!(reply["echo"], json!({"x": 1}));
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "took {:?}",
            t.elapsed()
        );

        // Each bad connection was closed by the server.
        for s in [http, tls, oversized, zero, bad_json] {
            assert!(closed_by_server(s));
        }
        drop((idle, partial));
    }

    #[test]
    fn idle_connection_is_closed_after_the_read_deadline() {
        let opts = ServerOptions {
            io_timeout: Duration::from_millis(300),
            ..ServerOptions::default()
        };
        let (server, _echo) = start(opts);
        let idle = raw(server.port());
        assert!(closed_by_server(idle));
        call(
            "127.0.0.1",
            server.port(),
            FrameKind::Probe,
            &json!({}),
            &client(),
        )
        .expect("still serving");
    }

    /// A server that holds 2 connections, whose clients' frames may take
    /// as long as a slow host needs: these tests are about the bound, not
    /// the request deadline.
    fn start_bounded_at_two() -> (RpcServer, Arc<Echo>) {
        start(ServerOptions {
            max_connections: 2,
            io_timeout: Duration::from_secs(60),
            ..ServerOptions::default()
        })
    }

    #[test]
    fn at_the_bound_the_oldest_waiting_connection_makes_room() {
        let (server, _echo) = start_bounded_at_two();
        let port = server.port();
        let oldest = raw(port);
        let mut younger = raw(port);
        younger.write_all(&50u64.to_ne_bytes()).expect("write");
        // Both silent connections hold the two slots; a real client takes
        // the oldest one's.
        call("127.0.0.1", port, FrameKind::Probe, &json!({}), &client())
            .expect("served at the bound");
        assert!(closed_by_server(oldest));
        // The younger one is still open: it gets the reply to its frame.
        younger.write_all(&[3]).expect("write");
        younger
            .write_all(&[b' '; 47])
            .and_then(|()| younger.write_all(b"{}"))
            .expect("write");
        let frame = read_frame(&mut younger, 1 << 20).expect("reply to the younger");
        let Frame::Typed(FrameKind::Probe, payload) = frame else {
            panic!("expected a Probe reply, got {frame:?}");
        };
        let reply: Value = serde_json::from_slice(&payload).expect("json");
        assert_eq!(reply, json!({"status": "success"}));
    }

    #[test]
    fn at_the_bound_no_connection_is_closed_until_another_comes() {
        let (server, _echo) = start_bounded_at_two();
        let port = server.port();
        let mut both = [raw(port), raw(port)];
        // Time for the server to take both, and to close one for a third
        // connection if it (wrongly) made room before one came.
        thread::sleep(Duration::from_millis(300));
        for s in &mut both {
            s.write_all(&50u64.to_ne_bytes())
                .and_then(|()| s.write_all(&[3]))
                .and_then(|()| s.write_all(&[b' '; 47]))
                .and_then(|()| s.write_all(b"{}"))
                .expect("write");
            let frame = read_frame(s, 1 << 20).expect("a reply on each connection");
            assert!(
                matches!(frame, Frame::Typed(FrameKind::Probe, _)),
                "{frame:?}"
            );
        }
    }

    /// Blocks in its handler until released.
    struct Gate {
        open: AtomicBool,
        entered: AtomicUsize,
    }

    impl RpcHandler for Gate {
        fn handle(&self, _kind: FrameKind, request: Value, _peer: SocketAddr) -> Value {
            self.entered.fetch_add(1, Ordering::SeqCst);
            let end = Instant::now() + Duration::from_secs(20);
            while !self.open.load(Ordering::SeqCst) && Instant::now() < end {
                thread::sleep(Duration::from_millis(5));
            }
            request
        }
    }

    #[test]
    fn when_every_connection_is_in_a_handler_new_ones_wait_in_the_backlog() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let gate = Arc::new(Gate {
            open: AtomicBool::new(false),
            entered: AtomicUsize::new(0),
        });
        let opts = ServerOptions {
            max_connections: 1,
            workers: 1,
            ..ServerOptions::default()
        };
        let server = RpcServer::start(listener, gate.clone(), opts).expect("start");
        let port = server.port();
        let first = thread::spawn(move || {
            call(
                "127.0.0.1",
                port,
                FrameKind::Metadata,
                &json!({"n": 1}),
                &client(),
            )
        });
        while gate.entered.load(Ordering::SeqCst) == 0 {
            thread::sleep(Duration::from_millis(5));
        }
        // The only slot is busy: the second connection is not accepted
        // (nor refused) until the first is answered.
        let second = thread::spawn(move || {
            call(
                "127.0.0.1",
                port,
                FrameKind::Metadata,
                &json!({"n": 2}),
                &client(),
            )
        });
        thread::sleep(Duration::from_millis(300));
        assert_eq!(gate.entered.load(Ordering::SeqCst), 1);
        gate.open.store(true, Ordering::SeqCst);
        assert_eq!(first.join().expect("first").expect("call"), json!({"n": 1}));
        assert_eq!(
            second.join().expect("second").expect("call"),
            json!({"n": 2})
        );
    }

    #[test]
    fn trickling_client_is_closed_at_the_deadline_from_accept() {
        let opts = ServerOptions {
            io_timeout: Duration::from_millis(500),
            ..ServerOptions::default()
        };
        let (server, _echo) = start(opts);
        let mut s = raw(server.port());
        let t = Instant::now();
        let frame = encode(Some(FrameKind::Metadata), &[b' '; 100]);
        // One byte every 50 ms keeps the connection busy, but the frame is
        // not complete within the deadline.
        let mut closed = false;
        for b in &frame {
            if s.write_all(&[*b]).is_err() {
                closed = true;
                break;
            }
            thread::sleep(Duration::from_millis(50));
            if t.elapsed() > Duration::from_secs(3) {
                break;
            }
        }
        assert!(closed || closed_by_server(s));
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }

    #[test]
    fn buffered_bytes_are_bounded_across_connections() {
        // The bound is raised to one largest frame and a read beyond it.
        let opts = ServerOptions {
            max_buffered: 0,
            ..ServerOptions::default()
        };
        let (server, _echo) = start(opts);
        let port = server.port();
        let part = |s: &mut TcpStream| {
            let frame = encode(Some(FrameKind::Metadata), &vec![b' '; (1 << 20) - 1]);
            s.write_all(&frame[..700 << 10]).expect("write");
        };
        let mut first = raw(port);
        part(&mut first);
        // The server holds the first one's 700 KiB before the second comes.
        call("127.0.0.1", port, FrameKind::Probe, &json!({}), &client()).expect("probe");
        let mut second = raw(port);
        part(&mut second);
        // Two incomplete frames do not fit: the oldest is closed.
        assert!(closed_by_server(first));
        call("127.0.0.1", port, FrameKind::Probe, &json!({}), &client())
            .expect("small requests are still served");
        drop(second);
    }

    #[test]
    fn handler_panic_closes_only_its_connection() {
        let (server, echo) = start(ServerOptions::default());
        // Closed before the reply, the request is tried again until the
        // client's connect deadline.
        let opts = ClientOptions {
            connect_timeout: Duration::from_millis(300),
            ..client()
        };
        let err = call(
            "127.0.0.1",
            server.port(),
            FrameKind::Connection,
            &json!({"panic": true}),
            &opts,
        )
        .expect_err("no reply after a panic");
        assert!(matches!(err, Error::Socket(_)), "{err:?}");
        let panics = echo.calls.load(Ordering::SeqCst);
        assert!(panics >= 1, "{panics}");
        let reply = call(
            "127.0.0.1",
            server.port(),
            FrameKind::Notify,
            &json!({"name": "a", "notify_msg": "b"}),
            &client(),
        )
        .expect("served after the panic");
        assert_eq!(reply["kind"], json!(2));
        assert_eq!(echo.calls.load(Ordering::SeqCst), panics + 1);
    }

    #[test]
    fn shutdown_is_prompt_with_idle_clients_and_idempotent() {
        let (server, _echo) = start(ServerOptions::default());
        let port = server.port();
        let idle = raw(port);
        let mut partial = raw(port);
        partial.write_all(&50u64.to_ne_bytes()).expect("write");
        // Make sure both are being served before shutting down.
        call("127.0.0.1", port, FrameKind::Probe, &json!({}), &client()).expect("probe");
        let t = Instant::now();
        server.shutdown();
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "took {:?}",
            t.elapsed()
        );
        server.shutdown();
        assert!(closed_by_server(idle));
        assert!(closed_by_server(partial));
        let err = call("127.0.0.1", port, FrameKind::Probe, &json!({}), &client())
            .expect_err("listener closed");
        assert!(matches!(err, Error::Unreachable(_)), "{err:?}");
        drop(server);
    }

    /// Owns the server it serves, and drops it when asked.
    struct SelfStopping {
        server: Mutex<Option<RpcServer>>,
    }

    impl RpcHandler for SelfStopping {
        fn handle(&self, _kind: FrameKind, _request: Value, _peer: SocketAddr) -> Value {
            let server = sync::lock(&self.server).take();
            drop(server);
            json!({"stopped": true})
        }
    }

    #[test]
    fn handler_may_drop_the_server_it_runs_in() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let handler = Arc::new(SelfStopping {
            server: Mutex::new(None),
        });
        let server =
            RpcServer::start(listener, handler.clone(), ServerOptions::default()).expect("start");
        let port = server.port();
        *sync::lock(&handler.server) = Some(server);
        let reply = call("127.0.0.1", port, FrameKind::Notify, &json!({}), &client())
            .expect("reply from the handler that stopped the server");
        assert_eq!(reply, json!({"stopped": true}));
        assert!(sync::lock(&handler.server).is_none());
        let err = call("127.0.0.1", port, FrameKind::Probe, &json!({}), &client())
            .expect_err("listener closed");
        assert!(matches!(err, Error::Unreachable(_)), "{err:?}");
    }

    #[test]
    fn bind_in_range_picks_a_port_in_range() {
        let l = bind_in_range(20000, 20999, false).expect("bind");
        let port = l.local_addr().expect("addr").port();
        assert!((20000..=20999).contains(&port));
        // Only that port, already taken: every try fails.
        let err = bind_in_range(port, port, false).expect_err("port taken");
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert_eq!(
            bind_in_range(5, 4, false).expect_err("empty").kind(),
            io::ErrorKind::InvalidInput
        );
        // The listener serves requests.
        let server = RpcServer::start(
            l,
            Arc::new(Echo {
                calls: AtomicUsize::new(0),
            }),
            ServerOptions::default(),
        )
        .expect("start");
        assert_eq!(server.port(), port);
        call("127.0.0.1", port, FrameKind::Probe, &json!({}), &client()).expect("probe");
    }

    #[test]
    fn bind_in_range_ipv6_is_dual_stack() {
        let l = match bind_in_range(21000, 21999, true) {
            Ok(l) => l,
            // No IPv6 in this environment: nothing to check.
            Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => return,
            Err(e) => panic!("bind: {e}"),
        };
        let addr = l.local_addr().expect("addr");
        assert!(addr.is_ipv6());
        let server = RpcServer::start(
            l,
            Arc::new(Echo {
                calls: AtomicUsize::new(0),
            }),
            ServerOptions::default(),
        )
        .expect("start");
        // An IPv4 client reaches the [::] listener.
        call(
            "127.0.0.1",
            server.port(),
            FrameKind::Probe,
            &json!({}),
            &client(),
        )
        .expect("probe over IPv4");
    }

    #[test]
    fn concurrent_clients_are_all_served() {
        let (server, echo) = start(ServerOptions::default());
        let port = server.port();
        let threads: Vec<_> = (0..16)
            .map(|i| {
                thread::spawn(move || {
                    call(
                        "127.0.0.1",
                        port,
                        FrameKind::Metadata,
                        &json!({"i": i}),
                        &client(),
                    )
                })
            })
            .collect();
        for (i, t) in threads.into_iter().enumerate() {
            let reply = t.join().expect("thread").expect("call");
            assert_eq!(reply["echo"]["i"], json!(i));
        }
        assert_eq!(echo.calls.load(Ordering::SeqCst), 16);
    }
}
