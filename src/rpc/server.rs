//! The handshake listener (spec §3.1).
//!
//! Per connection, as Mooncake's `SocketHandShakePlugin` does: read one
//! frame, parse its JSON, dispatch by type, write the reply with the same
//! type (a legacy frame is answered without a type byte), `shutdown(SHUT_WR)`,
//! wait for the client's EOF, close. Unlike Mooncake's single serial thread,
//! connections are served concurrently (up to
//! [`ServerOptions::max_connections`]), every read is bounded by a deadline,
//! and a bad frame, bad JSON or a panicking handler closes only that
//! connection.

use super::DeadlineReader;
use super::frame::{Frame, FrameKind, encode_json, read_frame};
use crate::config::Config;
use serde_json::{Value, json};
use socket2::{Domain, Socket, Type};
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;
use tracing::{debug, warn};

/// How often the accept loop looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);
/// Attempts of [`bind_in_range`] before it gives up (Mooncake's value).
const BIND_ATTEMPTS: u32 = 500;
/// Backlog [`bind_in_range`] listens with; [`RpcServer::start`] then
/// applies [`ServerOptions::listen_backlog`].
const DEFAULT_BACKLOG: libc::c_int = 128;

/// Answers the Connection, Metadata and Notify requests of the handshake
/// listener. Probe requests are answered by the server itself.
pub trait RpcHandler: Send + Sync + 'static {
    /// Returns the reply to one request. Legacy (untyped) frames arrive as
    /// [`FrameKind::Connection`]. A panic closes that connection without a
    /// reply; the server keeps serving.
    fn handle(&self, kind: FrameKind, request: Value) -> Value;
}

/// Limits of the handshake listener.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Largest accepted frame length (`MC_HANDSHAKE_MAX_LENGTH`).
    pub max_frame_len: u64,
    /// Deadline for reading one request, for writing the reply, and for
    /// the client's EOF after the reply (5 s, as Mooncake's `SO_RCVTIMEO`).
    pub io_timeout: Duration,
    /// Connections served at once; more are closed on arrival (64).
    pub max_connections: usize,
    /// Listen backlog applied to the listener (`MC_HANDSHAKE_LISTEN_BACKLOG`).
    pub listen_backlog: u32,
}

impl ServerOptions {
    /// The options for a parsed configuration.
    pub fn from_config(c: &Config) -> Self {
        ServerOptions {
            max_frame_len: c.handshake_max_length,
            io_timeout: Duration::from_secs(5),
            max_connections: 64,
            listen_backlog: c.handshake_listen_backlog,
        }
    }
}

impl Default for ServerOptions {
    /// The options for the default configuration.
    fn default() -> Self {
        ServerOptions::from_config(&Config::default())
    }
}

/// A running handshake listener: one accept thread plus one thread per
/// connection in progress. [`RpcServer::shutdown`] (also run on drop)
/// stops and joins all of them.
pub struct RpcServer {
    port: u16,
    shared: Arc<Shared>,
    accept_thread: Mutex<Option<JoinHandle<()>>>,
}

/// State shared by the accept thread and [`RpcServer::shutdown`].
struct Shared {
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, Conn>>,
}

/// One connection in progress: a handle on its socket (to cut it off at
/// shutdown) and its thread.
struct Conn {
    stream: TcpStream,
    thread: JoinHandle<()>,
}

/// Locks a mutex whose data stays consistent even if a holder panicked.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
        listener.set_nonblocking(true)?;
        let backlog = libc::c_int::try_from(opts.listen_backlog).unwrap_or(libc::c_int::MAX);
        // SAFETY: the fd is a live socket owned by `listener`; listen() on a
        // listening socket only updates its backlog (Linux).
        if unsafe { libc::listen(listener.as_raw_fd(), backlog) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
        });
        let loop_shared = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name("te-rpc-accept".into())
            .spawn(move || accept_loop(listener, handler, opts, loop_shared))?;
        debug!("handshake listener serving port {port}");
        Ok(RpcServer {
            port,
            shared,
            accept_thread: Mutex::new(Some(accept_thread)),
        })
    }

    /// The port the listener is bound to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops accepting, cuts off the connections in progress and joins
    /// every thread the server started. Returns within about 100 ms plus
    /// the time handlers already running take to return. Idempotent.
    ///
    /// Called from a handler (directly, or by dropping the last owner of
    /// the server), it leaves that handler's connection to send its reply
    /// and does not join the calling thread, which ends right after.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
        let me = thread::current().id();
        if let Some(t) = lock(&self.accept_thread).take() {
            if t.thread().id() != me && t.join().is_err() {
                warn!("handshake accept thread panicked");
            }
        }
        // The accept thread is gone: nobody adds connections any more. A
        // handler may shut the server down from its own connection thread
        // (e.g. by dropping the last owner): that connection is left to
        // finish its reply, and its thread to end by itself.
        let conns: Vec<Conn> = lock(&self.shared.conns)
            .drain()
            .map(|(_, c)| c)
            .filter(|c| c.thread.thread().id() != me)
            .collect();
        for c in &conns {
            // Wakes a thread blocked reading from a slow or silent client.
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        for c in conns {
            if c.thread.join().is_err() {
                warn!("handshake connection thread panicked");
            }
        }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Waits up to `timeout` for `fd` to become readable.
fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfd` is a valid pollfd array of length 1 for the whole call.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    match n {
        n if n > 0 => Ok(true),
        0 => Ok(false),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// Accepts connections until the stop flag is set, one thread each.
fn accept_loop(
    listener: TcpListener,
    handler: Arc<dyn RpcHandler>,
    opts: ServerOptions,
    shared: Arc<Shared>,
) {
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<u64>();
    let mut next_id: u64 = 0;
    while !shared.stop.load(Ordering::Acquire) {
        // Join the threads of finished connections.
        for id in done_rx.try_iter() {
            let finished = lock(&shared.conns).remove(&id);
            if let Some(c) = finished {
                if c.thread.join().is_err() {
                    warn!("handshake connection thread panicked");
                }
            }
        }
        match wait_readable(listener.as_raw_fd(), ACCEPT_POLL) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                warn!("handshake listener poll failed: {e}");
                thread::sleep(ACCEPT_POLL);
                continue;
            }
        }
        let (stream, peer) = match listener.accept() {
            Ok(a) => a,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => {
                // E.g. EMFILE: back off instead of spinning on the pending
                // connection.
                warn!("handshake listener accept failed: {e}");
                thread::sleep(ACCEPT_POLL);
                continue;
            }
        };
        let mut conns = lock(&shared.conns);
        if conns.len() >= opts.max_connections {
            warn!(
                "handshake connection from {peer} closed: {} connections already in progress",
                conns.len()
            );
            continue;
        }
        let handle = match stream.try_clone() {
            Ok(h) => h,
            Err(e) => {
                warn!("handshake connection from {peer} closed: {e}");
                continue;
            }
        };
        let id = next_id;
        next_id += 1;
        let (handler, opts, tx, shared) = (
            Arc::clone(&handler),
            opts.clone(),
            done_tx.clone(),
            Arc::clone(&shared),
        );
        let spawned = thread::Builder::new()
            .name("te-rpc-conn".into())
            .spawn(move || {
                if let Err(e) = serve_connection(&stream, &*handler, &opts) {
                    if shared.stop.load(Ordering::Acquire) {
                        debug!("handshake connection from {peer} cut off at shutdown: {e}");
                    } else {
                        warn!("handshake connection from {peer} closed: {e}");
                    }
                }
                // Send FIN now: the accept loop closes the fd when it reaps
                // this thread, up to 100 ms later.
                let _ = stream.shutdown(Shutdown::Both);
                drop(stream);
                // The receiver lives as long as the accept loop; after it
                // ends, shutdown joins this thread directly.
                let _ = tx.send(id);
            });
        match spawned {
            Ok(thread) => {
                conns.insert(
                    id,
                    Conn {
                        stream: handle,
                        thread,
                    },
                );
            }
            Err(e) => warn!("handshake connection from {peer} closed: no thread: {e}"),
        }
    }
}

/// The text of a panic payload.
fn panic_message(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}

/// Serves the one request of a connection. An error means the connection
/// is closed without (or after a failed) reply.
fn serve_connection(
    stream: &TcpStream,
    handler: &dyn RpcHandler,
    opts: &ServerOptions,
) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(opts.io_timeout))
        .map_err(|e| e.to_string())?;
    let frame = read_frame(
        &mut DeadlineReader::new(stream, opts.io_timeout),
        opts.max_frame_len,
    )
    .map_err(|e| e.to_string())?;
    let (kind, reply_kind, payload) = match frame {
        Frame::Typed(k, p) => (k, Some(k), p),
        Frame::Legacy(p) => (FrameKind::Connection, None, p),
    };
    let request: Value = serde_json::from_slice(&payload).map_err(|e| {
        format!(
            "malformed JSON in {kind:?} request ({} bytes): {e}",
            payload.len()
        )
    })?;
    let reply = if kind == FrameKind::Probe {
        json!({"status": "success"})
    } else {
        panic::catch_unwind(AssertUnwindSafe(|| handler.handle(kind, request)))
            .map_err(|p| format!("{kind:?} handler panicked: {}", panic_message(&*p)))?
    };
    // std sends with MSG_NOSIGNAL: a vanished peer is an error, not SIGPIPE.
    let mut writer = stream;
    writer
        .write_all(&encode_json(reply_kind, &reply))
        .map_err(|e| format!("writing the {kind:?} reply failed: {e}"))?;
    stream
        .shutdown(Shutdown::Write)
        .map_err(|e| format!("shutdown after the reply failed: {e}"))?;
    // Let the client close first (its side then holds TIME_WAIT).
    let mut byte = [0u8; 1];
    match DeadlineReader::new(stream, opts.io_timeout).read(&mut byte) {
        Ok(0) => {}
        Ok(_) => debug!("handshake client sent data after the reply"),
        Err(e) => debug!("handshake client did not close after the reply: {e}"),
    }
    Ok(())
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
    use crate::rpc::frame::encode;
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

    /// Echoes the request with the kind it arrived as; panics on request.
    struct Echo {
        calls: AtomicUsize,
    }

    impl RpcHandler for Echo {
        fn handle(&self, kind: FrameKind, request: Value) -> Value {
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

    #[test]
    fn connections_beyond_the_limit_are_closed() {
        let opts = ServerOptions {
            max_connections: 1,
            ..ServerOptions::default()
        };
        let (server, _echo) = start(opts);
        let first = raw(server.port());
        let second = raw(server.port());
        // The first (silent) connection holds the only slot.
        assert!(closed_by_server(second));
        drop(first);
    }

    #[test]
    fn handler_panic_keeps_the_server_alive() {
        let (server, echo) = start(ServerOptions::default());
        let err = call(
            "127.0.0.1",
            server.port(),
            FrameKind::Connection,
            &json!({"panic": true}),
            &client(),
        )
        .expect_err("no reply after a panic");
        assert!(matches!(err, Error::Socket(_)), "{err:?}");
        let reply = call(
            "127.0.0.1",
            server.port(),
            FrameKind::Notify,
            &json!({"name": "a", "notify_msg": "b"}),
            &client(),
        )
        .expect("served after the panic");
        assert_eq!(reply["kind"], json!(2));
        assert_eq!(echo.calls.load(Ordering::SeqCst), 2);
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
        assert!(matches!(err, Error::Socket(_)), "{err:?}");
        drop(server);
    }

    /// Owns the server it serves, and drops it when asked.
    struct SelfStopping {
        server: Mutex<Option<RpcServer>>,
    }

    impl RpcHandler for SelfStopping {
        fn handle(&self, _kind: FrameKind, _request: Value) -> Value {
            let server = lock(&self.server).take();
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
        *lock(&handler.server) = Some(server);
        let reply = call("127.0.0.1", port, FrameKind::Notify, &json!({}), &client())
            .expect("reply from the handler that stopped the server");
        assert_eq!(reply, json!({"stopped": true}));
        assert!(lock(&handler.server).is_none());
        let err = call("127.0.0.1", port, FrameKind::Probe, &json!({}), &client())
            .expect_err("listener closed");
        assert!(matches!(err, Error::Socket(_)), "{err:?}");
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
