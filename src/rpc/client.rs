//! The handshake client (spec §3.3): one connection per request.
//!
//! A connect that is refused, reset or has no route to the peer is
//! definite: nothing listens there (the peer's process has exited, or its
//! host is down), and the call fails at once with [`Error::Unreachable`],
//! so a caller holding a lock around it does not wait. A handshake that
//! the peer accepted and then reset or closed before the reply (a peer
//! shedding connections at its bound, see [`super::server`]) is tried
//! again after a short backoff, until the connect deadline; so is one
//! that timed out connecting, within that deadline.

use super::DeadlineReader;
use super::RpcConfig;
use super::frame::{Frame, FrameError, FrameKind, encode_json, read_frame};
use crate::auth::wire::refusal_payload;
use crate::auth::{AuthError, ClientAuth, Gate, Keys, Port, Standing};
use crate::error::{Error, Result};
use crate::sync;
use serde_json::Value;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::debug;

/// First pause before trying a handshake reset or closed by the peer
/// again; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// Longest pause between two tries.
const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// Timeouts and limits of [`call`].
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Bound on connecting, including the tries again after a handshake
    /// reset or closed by the peer (`MC_HANDSHAKE_CONNECT_TIMEOUT`, 5 s).
    pub connect_timeout: Duration,
    /// Bound on sending the request and on reading the reply (60 s, as
    /// Mooncake's `SO_RCVTIMEO`).
    pub io_timeout: Duration,
    /// Largest accepted reply frame (`MC_HANDSHAKE_MAX_LENGTH`).
    pub max_frame_len: u64,
    /// Try IPv6 addresses of the peer first (`MC_USE_IPV6`); otherwise IPv4
    /// first. Addresses of the other family are still tried after them.
    pub ipv6: bool,
    /// Aborts the call when cancelled (see [`Cancel`]).
    pub cancel: Option<Arc<Cancel>>,
    /// With a cluster key: the keys, and the segment name of the peer
    /// called (its proofs are bound to it). The call proves it holds a key
    /// and checks the peer's proof before it sends its request.
    pub auth: Option<(Arc<Keys>, String)>,
    /// The request is sent at most once: a connection that drops after it
    /// was sent is not tried again (a notification must not arrive twice).
    pub once: bool,
}

/// Aborts the handshake calls made with it: [`Cancel::cancel`] shuts down
/// the sockets of the calls under way, which then fail at once instead of
/// waiting out their timeouts, and every later call fails before it
/// connects. An engine cancels its calls when it is destroyed. A connect
/// in progress is not interrupted (it ends within the connect timeout).
#[derive(Debug, Default)]
pub struct Cancel {
    state: Mutex<CancelState>,
}

#[derive(Debug, Default)]
struct CancelState {
    cancelled: bool,
    next: u64,
    /// Sockets of the exchanges under way, by entry number.
    open: Vec<(u64, std::os::fd::RawFd)>,
}

impl Cancel {
    /// Cancels every call under way and to come.
    pub fn cancel(&self) {
        let mut s = sync::lock(&self.state);
        s.cancelled = true;
        for &(_, fd) in &s.open {
            // SAFETY: `fd` belongs to a stream of an exchange still under
            // way: the exchange removes it (under this lock) before the
            // stream is closed. shutdown(2) only ends its connection.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
    }

    fn is_cancelled(&self) -> bool {
        sync::lock(&self.state).cancelled
    }

    /// Records `stream` as under way; `None` once cancelled.
    fn enter<'a>(&'a self, stream: &TcpStream) -> Option<Entered<'a>> {
        let mut s = sync::lock(&self.state);
        if s.cancelled {
            return None;
        }
        s.next += 1;
        let id = s.next;
        s.open.push((id, stream.as_raw_fd()));
        Some(Entered { cancel: self, id })
    }
}

/// A socket recorded in a [`Cancel`]; removed on drop, before its stream
/// is closed.
struct Entered<'a> {
    cancel: &'a Cancel,
    id: u64,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        sync::lock(&self.cancel.state)
            .open
            .retain(|&(id, _)| id != self.id);
    }
}

fn cancelled(host: &str, port: u16) -> Error {
    Error::Socket(format!(
        "handshake with {host}:{port}: cancelled (the engine is being destroyed)"
    ))
}

impl ClientOptions {
    /// The options for a parsed configuration.
    pub fn from_config(c: &RpcConfig) -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(c.connect_timeout_secs),
            io_timeout: Duration::from_secs(60),
            max_frame_len: c.max_length,
            ipv6: c.use_ipv6,
            cancel: None,
            auth: None,
            once: false,
        }
    }
}

impl Default for ClientOptions {
    /// The options for the default configuration.
    fn default() -> Self {
        ClientOptions::from_config(&RpcConfig::default())
    }
}

/// Resolves `host` (brackets around an IPv6 literal are accepted), with the
/// preferred family first.
fn resolve(host: &str, port: u16, ipv6_first: bool) -> Result<Vec<SocketAddr>> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let mut addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|e| {
            Error::Dns(format!(
                "cannot resolve handshake peer {host}:{port}: {e}; check DNS and /etc/hosts, or use an IP address"
            ))
        })?
        .collect();
    if addrs.is_empty() {
        return Err(Error::Dns(format!(
            "handshake peer {host}:{port} resolves to no address"
        )));
    }
    addrs.sort_by_key(|a| a.is_ipv6() != ipv6_first);
    Ok(addrs)
}

/// Whether an I/O error on an accepted connection means the peer dropped
/// it (worth another try: a peer shedding connections at its bound)
/// rather than a timeout or a local failure.
fn dropped(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

/// Whether a failed connect says the peer is down: refused (nothing
/// listens on the port), reset while connecting, or no route to its host
/// or network. Trying again would only delay the failure.
fn peer_down(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED | libc::ECONNRESET | libc::EHOSTUNREACH | libc::ENETUNREACH)
    )
}

/// A failed exchange, and whether another try may succeed.
struct Failure {
    error: Error,
    retry: bool,
}

/// One request/reply exchange with one address; the connect must finish
/// by `connect_by`.
fn exchange(
    addr: SocketAddr,
    kind: FrameKind,
    request: &Value,
    opts: &ClientOptions,
    connect_by: Instant,
) -> std::result::Result<Value, Failure> {
    let fail = |what: &str, e: &dyn std::fmt::Display, retry: bool| Failure {
        error: Error::Socket(format!("handshake {kind:?} with {addr}: {what}: {e}")),
        retry,
    };
    let io_fail = |what: &str, e: &io::Error| fail(what, e, dropped(e));
    let left = connect_by.saturating_duration_since(Instant::now());
    let stream =
        TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1))).map_err(|e| {
            match peer_down(&e) {
                true => Failure {
                    error: Error::Unreachable(format!(
                        "handshake {kind:?} with {addr}: connect: {e} (the peer's process has \
                     exited or its host is down)"
                    )),
                    retry: false,
                },
                false => fail("connect", &e, false),
            }
        })?;
    // Declared after the stream, so dropped (unrecorded) before it closes.
    let _entered = match &opts.cancel {
        None => None,
        Some(c) => Some(c.enter(&stream).ok_or_else(|| Failure {
            error: cancelled(&addr.ip().to_string(), addr.port()),
            retry: false,
        })?),
    };
    stream
        .set_write_timeout(Some(opts.io_timeout))
        .map_err(|e| io_fail("setsockopt", &e))?;
    if let Some((keys, name)) = &opts.auth {
        authenticate(&stream, keys, name, opts.io_timeout).map_err(|e| {
            let retry = matches!(&e, AuthFailure::Io(io) if dropped(io));
            fail("authentication", &e, retry)
        })?;
    }
    let mut writer = &stream;
    // Once (part of) the request is written, the peer may have it.
    let sent_fail = |what: &str, e: &io::Error| fail(what, e, dropped(e) && !opts.once);
    writer
        .write_all(&encode_json(Some(kind), request))
        .map_err(|e| sent_fail("send", &e))?;
    let frame = read_frame(
        &mut DeadlineReader::new(&stream, opts.io_timeout),
        opts.max_frame_len,
    )
    .map_err(|e| match &e {
        FrameError::Io(io) => sent_fail("reply", io),
        _ => fail("reply", &e, false),
    })?;
    let payload = match frame {
        Frame::Typed(k, p) if k == kind => p,
        Frame::Typed(k, _) => {
            return Err(fail(
                "reply",
                &format_args!("type {k:?} instead of {kind:?}"),
                false,
            ));
        }
        Frame::Legacy(p) => {
            let why = match refusal_payload(&p) {
                Some(reason) => format!(
                    "refused by the peer, which requires authentication ({reason}); set \
                     MC_TE_AUTH_KEY_FILE to the cluster's key"
                ),
                None => "untyped (legacy) frame".to_string(),
            };
            return Err(fail("reply", &why, false));
        }
    };
    serde_json::from_slice(&payload).map_err(|e| Failure {
        error: Error::MalformedJson(format!(
            "handshake {kind:?} reply from {addr} ({} bytes): {e}",
            payload.len()
        )),
        retry: false,
    })
}

/// Why authenticating a handshake connection failed.
enum AuthFailure {
    /// The exchange failed: refused, or a peer without the key.
    Auth(AuthError),
    /// The connection failed.
    Io(io::Error),
}

impl std::fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthFailure::Auth(e) => e.fmt(f),
            AuthFailure::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => f.write_str(
                "the peer closed the connection during authentication (a peer without the \
                 cluster key, or one that refused us)",
            ),
            AuthFailure::Io(e) => e.fmt(f),
        }
    }
}

/// Proves to the listener of segment `name` on `stream` that we hold one
/// of `keys`, and checks its proof, all within `timeout`.
fn authenticate(
    stream: &TcpStream,
    keys: &Arc<Keys>,
    name: &str,
    timeout: Duration,
) -> std::result::Result<(), AuthFailure> {
    let (side, hello) =
        ClientAuth::start(keys.clone(), Port::Handshake, name).map_err(AuthFailure::Auth)?;
    let mut gate = Gate::new(side, hello);
    let mut io = ReadWrite {
        reader: DeadlineReader::new(stream, timeout),
        writer: stream,
    };
    match gate.drive(&mut io) {
        Ok(Standing::Done) => Ok(()),
        Ok(Standing::Failed(e)) => Err(AuthFailure::Auth(e)),
        Ok(Standing::Pending | Standing::Refused(_)) => {
            Err(AuthFailure::Io(io::ErrorKind::TimedOut.into()))
        }
        Err(e) => Err(AuthFailure::Io(e)),
    }
}

/// A socket read with a deadline and written as it is.
struct ReadWrite<'a> {
    reader: DeadlineReader<'a>,
    writer: &'a TcpStream,
}

impl io::Read for ReadWrite<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reader.read(buf)
    }
}

impl Write for ReadWrite<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writer.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

/// Sends one `kind` request to the handshake listener at `host:port` and
/// returns its JSON reply.
///
/// Every resolved address is tried in turn (preferred family first, see
/// [`ClientOptions::ipv6`]) until one answers. When an address accepted
/// the connection and then reset or closed it before a complete reply,
/// all are tried again after a short backoff (10 ms, doubling up to
/// 250 ms) until [`ClientOptions::connect_timeout`] from the call has
/// passed. A request may therefore reach the peer's handler more than
/// once.
///
/// Errors: the name does not resolve → [`Error::Dns`]; every address
/// refused the connect, reset it or has no route → [`Error::Unreachable`]
/// at once; another connect, send or receive failure, a reply frame that
/// is invalid or of another type → [`Error::Socket`] (from the last
/// address tried); a reply that is not JSON → [`Error::MalformedJson`] at
/// once, without trying further.
pub fn call(
    host: &str,
    port: u16,
    kind: FrameKind,
    request: &Value,
    opts: &ClientOptions,
) -> Result<Value> {
    let addrs = resolve(host, port, opts.ipv6)?;
    call_addrs(&addrs, (host, port), kind, request, opts)
}

/// [`call`] to the addresses `addrs` of `peer`.
fn call_addrs(
    addrs: &[SocketAddr],
    (host, port): (&str, u16),
    kind: FrameKind,
    request: &Value,
    opts: &ClientOptions,
) -> Result<Value> {
    let deadline = Instant::now() + opts.connect_timeout;
    let mut backoff = FIRST_BACKOFF;
    let is_cancelled = || opts.cancel.as_ref().is_some_and(|c| c.is_cancelled());
    loop {
        if is_cancelled() {
            return Err(cancelled(host, port));
        }
        let mut last: Option<Error> = None;
        let mut retry = false;
        for addr in addrs {
            match exchange(*addr, kind, request, opts, deadline) {
                Ok(v) => return Ok(v),
                Err(Failure {
                    error: e @ Error::MalformedJson(_),
                    ..
                }) => return Err(e),
                Err(f) => {
                    debug!("{}", f.error);
                    // One address that dropped an accepted connection is
                    // reason to try again.
                    retry |= f.retry;
                    // A reason other than "down" (of another address)
                    // tells more.
                    let down = |e: &Error| matches!(e, Error::Unreachable(_));
                    if !down(&f.error) || last.as_ref().is_none_or(down) {
                        last = Some(f.error);
                    }
                }
            }
        }
        let last =
            last.unwrap_or_else(|| Error::Socket(format!("no address to try for {host}:{port}")));
        if !retry || Instant::now() + backoff >= deadline {
            return Err(last);
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::frame::encode;
    use serde_json::json;
    use std::io::Read;
    use std::net::TcpListener;
    use std::thread;

    /// A one-shot fake listener: reads one frame, answers with `reply`
    /// bytes, waits for the client to close.
    fn fake_server(reply: Vec<u8>) -> (u16, thread::JoinHandle<Option<Frame>>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let t = thread::spawn(move || {
            let (mut s, _) = l.accept().ok()?;
            s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
            let frame = read_frame(&mut s, 1 << 20).ok()?;
            s.write_all(&reply).ok()?;
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            Some(frame)
        });
        (port, t)
    }

    fn opts() -> ClientOptions {
        ClientOptions {
            io_timeout: Duration::from_secs(10),
            ..ClientOptions::default()
        }
    }

    #[test]
    fn sends_a_typed_json_frame_and_parses_the_reply() {
        let (port, t) = fake_server(encode(Some(FrameKind::Metadata), b"{\"ok\":true}\n"));
        let reply = call(
            "127.0.0.1",
            port,
            FrameKind::Metadata,
            &json!({"a": 1}),
            &opts(),
        )
        .expect("call");
        assert_eq!(reply, json!({"ok": true}));
        let sent = t.join().expect("server thread");
        assert_eq!(
            sent,
            Some(Frame::Typed(FrameKind::Metadata, b"{\"a\":1}\n".to_vec()))
        );
    }

    #[test]
    fn resolve_strips_brackets_and_puts_the_preferred_family_first() {
        let addrs = resolve("[::1]", 80, false).expect("resolve");
        assert_eq!(addrs, vec!["[::1]:80".parse::<SocketAddr>().expect("addr")]);
        for ipv6_first in [false, true] {
            let addrs = resolve("localhost", 80, ipv6_first).expect("resolve localhost");
            let preferred = addrs
                .iter()
                .take_while(|a| a.is_ipv6() == ipv6_first)
                .count();
            assert!(addrs[preferred..].iter().all(|a| a.is_ipv6() != ipv6_first));
        }
    }

    #[test]
    fn reply_of_another_type_is_a_socket_error() {
        let (port, t) = fake_server(encode(Some(FrameKind::Notify), b"{}\n"));
        let err = call("127.0.0.1", port, FrameKind::Metadata, &json!({}), &opts())
            .expect_err("type mismatch");
        assert!(matches!(err, Error::Socket(_)), "{err:?}");
        let _ = t.join();
    }

    #[test]
    fn legacy_reply_is_a_socket_error() {
        let (port, t) = fake_server(encode(None, b"{}\n"));
        let err = call(
            "127.0.0.1",
            port,
            FrameKind::Connection,
            &json!({}),
            &opts(),
        )
        .expect_err("untyped reply");
        assert!(matches!(err, Error::Socket(_)), "{err:?}");
        let _ = t.join();
    }

    #[test]
    fn non_json_reply_is_malformed_json() {
        let (port, t) = fake_server(encode(Some(FrameKind::Notify), b"{oops"));
        let err =
            call("127.0.0.1", port, FrameKind::Notify, &json!({}), &opts()).expect_err("bad json");
        assert!(matches!(err, Error::MalformedJson(_)), "{err:?}");
        let _ = t.join();
    }

    #[test]
    fn oversized_reply_is_a_socket_error() {
        let (port, t) = fake_server(((1u64 << 20) + 1).to_ne_bytes().to_vec());
        let err = call("127.0.0.1", port, FrameKind::Metadata, &json!({}), &opts())
            .expect_err("oversized");
        assert!(matches!(err, Error::Socket(_)), "{err:?}");
        let _ = t.join();
    }

    fn unused_port() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    }

    #[test]
    fn closed_port_fails_at_once_and_a_peer_back_on_it_is_reached_next() {
        let port = unused_port();
        // The default connect deadline (5 s): a refused connect is not
        // tried again within it.
        let t = std::time::Instant::now();
        let err = call("127.0.0.1", port, FrameKind::Probe, &json!({}), &opts())
            .expect_err("nothing listens");
        let took = t.elapsed();
        assert!(matches!(err, Error::Unreachable(_)), "{err:?}");
        assert!(err.to_string().contains("refused"), "{err}");
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert_eq!(err.err_code(), crate::codes::ERR_SOCKET);
        // Back on the same port: the next call reaches it.
        let l = TcpListener::bind(("127.0.0.1", port)).expect("bind the same port");
        let back = thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            read_frame(&mut s, 1 << 20).expect("request");
            s.write_all(&encode(Some(FrameKind::Probe), b"{\"back\":1}\n"))
                .expect("reply");
        });
        let reply = call("127.0.0.1", port, FrameKind::Probe, &json!({}), &opts())
            .expect("served once the listener is back");
        assert_eq!(reply, json!({"back": 1}));
        back.join().expect("listener");
    }

    #[test]
    fn a_refused_address_does_not_stop_the_tries_of_one_that_drops_connections() {
        // 127.0.0.1 accepts and closes the first connection (a peer
        // shedding at its bound), then answers; 127.0.0.2 refuses.
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let t = thread::spawn(move || {
            for (i, conn) in l.incoming().take(2).enumerate() {
                let mut s = conn.expect("accept");
                if i == 1 {
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    read_frame(&mut s, 1 << 20).expect("request");
                    s.write_all(&encode(Some(FrameKind::Probe), b"{}\n"))
                        .expect("reply");
                }
            }
        });
        let addrs: Vec<SocketAddr> = vec![
            format!("127.0.0.2:{port}").parse().unwrap(),
            format!("127.0.0.1:{port}").parse().unwrap(),
        ];
        let reply = call_addrs(
            &addrs,
            ("peer", port),
            FrameKind::Probe,
            &json!({}),
            &opts(),
        )
        .expect("served at the second try");
        assert_eq!(reply, json!({}));
        // Refused everywhere: at once, as down.
        drop(t.join());
        let t = std::time::Instant::now();
        let err = call_addrs(
            &addrs,
            ("peer", port),
            FrameKind::Probe,
            &json!({}),
            &opts(),
        )
        .expect_err("refused");
        assert!(matches!(err, Error::Unreachable(_)), "{err:?}");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }

    #[test]
    fn connection_closed_before_the_reply_is_retried() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let t = thread::spawn(move || {
            let mut seen = 0;
            for (i, conn) in l.incoming().take(3).enumerate() {
                let mut s = conn.expect("accept");
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                read_frame(&mut s, 1 << 20).expect("request");
                seen += 1;
                // The first is closed without a reply, the second reset.
                match i {
                    0 => drop(s),
                    1 => {
                        socket2::SockRef::from(&s)
                            .set_linger(Some(Duration::ZERO))
                            .unwrap();
                        drop(s);
                    }
                    _ => {
                        s.write_all(&encode(Some(FrameKind::Notify), b"{\"n\":3}\n"))
                            .expect("reply");
                        let _ = s.read_to_end(&mut Vec::new());
                        return seen;
                    }
                }
            }
            seen
        });
        let reply = call("127.0.0.1", port, FrameKind::Notify, &json!({}), &opts())
            .expect("served at the third try");
        assert_eq!(reply, json!({"n": 3}));
        assert_eq!(t.join().expect("server"), 3);
    }

    #[test]
    fn silent_peer_is_not_retried() {
        // Accepted by the kernel, never answered: the read deadline ends
        // the call, once.
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let o = ClientOptions {
            io_timeout: Duration::from_millis(300),
            ..opts()
        };
        let t = std::time::Instant::now();
        let err = call("127.0.0.1", port, FrameKind::Probe, &json!({}), &o).expect_err("no reply");
        assert!(matches!(err, Error::Socket(_)), "{err:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        drop(l);
    }

    #[test]
    fn cancel_ends_a_call_waiting_on_a_silent_peer_and_every_later_one() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let cancel = Arc::new(Cancel::default());
        let o = ClientOptions {
            io_timeout: Duration::from_secs(60),
            cancel: Some(cancel.clone()),
            ..opts()
        };
        let o2 = o.clone();
        let t = std::time::Instant::now();
        let waiting =
            thread::spawn(move || call("127.0.0.1", port, FrameKind::Probe, &json!({}), &o2));
        // The call is under way once the listener holds its connection.
        let (_held, _) = l.accept().expect("accept");
        thread::sleep(Duration::from_millis(100));
        cancel.cancel();
        let err = waiting.join().unwrap().expect_err("cancelled");
        assert!(err.to_string().contains("cancelled"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let err = call("127.0.0.1", port, FrameKind::Probe, &json!({}), &o).expect_err("later");
        assert!(err.to_string().contains("cancelled"), "{err}");
    }

    #[test]
    fn unresolvable_name_is_a_dns_error() {
        let err = call(
            "no-such-host.invalid",
            12001,
            FrameKind::Probe,
            &json!({}),
            &opts(),
        )
        .expect_err("does not resolve");
        assert!(matches!(err, Error::Dns(_)), "{err:?}");
    }

    #[test]
    fn options_follow_the_config() {
        let c = RpcConfig {
            connect_timeout_secs: 7,
            max_length: 2 << 20,
            use_ipv6: true,
            ..RpcConfig::default()
        };
        let o = ClientOptions::from_config(&c);
        assert_eq!(o.connect_timeout, Duration::from_secs(7));
        assert_eq!(o.io_timeout, Duration::from_secs(60));
        assert_eq!(o.max_frame_len, 2 << 20);
        assert!(o.ipv6);
    }
}
