//! The poll thread and the workers of [`super::Server`].

use super::stream::Stream;
use super::{Dispatch, Options, Parse, Reply, Service, Shared, Then};
use crossbeam_channel::{Receiver, Sender};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use std::collections::{BTreeSet, HashMap};
use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tracing::debug;

/// The listener's token.
const LISTENER: Token = Token(0);
/// The waker's token (shutdown, finished handlers).
pub(super) const WAKER: Token = Token(1);
/// The first connection token; tokens are never reused.
const FIRST_CONN: usize = 2;
/// Bytes read from a socket at a time.
const READ_CHUNK: usize = 64 * 1024;
/// Connections accepted per turn of the loop, so that reading the ones
/// already open is not starved by a flood of new ones.
const ACCEPT_BATCH: usize = 256;
/// Pause before accepting again after `accept` failed (e.g. EMFILE).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Bytes a lingering connection may still send before it is closed.
const LINGER_DRAIN: usize = 64 * 1024;
/// Smallest allocation of a receive buffer.
const MIN_BUFFER: usize = 256;

/// A complete request on its way to a worker.
pub(super) struct Job<R> {
    token: Token,
    peer: SocketAddr,
    request: R,
}

/// A worker's answer: the reply, or why the connection closes without one.
pub(super) type Done = (Token, Result<Reply, String>);

/// Runs handlers until the poll thread goes away.
pub(super) fn worker<S: Service>(
    service: &S,
    jobs: &Receiver<Job<S::Request>>,
    done: &Sender<Done>,
    shared: &Shared,
) {
    for job in jobs.iter() {
        let result = if shared.stop.load(Ordering::Acquire) {
            Err("the server is shutting down".to_string())
        } else {
            panic::catch_unwind(AssertUnwindSafe(|| service.handle(job.peer, job.request)))
                .unwrap_or_else(|p| Err(format!("the handler panicked: {}", panic_message(&*p))))
        };
        if done.send((job.token, result)).is_err() {
            return;
        }
        if let Err(e) = shared.waker.wake() {
            debug!("cannot wake the poll thread: {e}");
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

/// Where a connection is in its exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Receiving a request.
    Reading,
    /// Its request is with a worker.
    Busy,
    /// Sending the reply.
    Writing,
    /// Reply sent and write side shut: waiting for the client to close.
    Lingering,
}

struct Conn<P> {
    stream: Stream,
    peer: SocketAddr,
    state: State,
    /// Received bytes not yet part of a parsed request.
    buf: Vec<u8>,
    /// What the buffer holds once the request is complete, if known.
    want: Option<usize>,
    parser: P,
    /// The reply being written: its own bytes, then a shared buffer, and
    /// how much of both is out.
    out: Vec<u8>,
    out_shared: Option<Arc<[u8]>>,
    out_pos: usize,
    then: Then,
    /// When the connection last moved a byte of a request or a reply (or
    /// entered its state): its place in the eviction order.
    progress: Instant,
    deadline: Option<Instant>,
    /// Bytes of the request a worker holds.
    job_bytes: usize,
    /// Bytes counted against [`Options::max_buffered`] for this connection.
    accounted: usize,
    drained: usize,
}

impl<P> Conn<P> {
    /// Bytes held for this connection alone (a shared buffer is counted
    /// apart, once).
    fn held(&self) -> usize {
        self.buf.capacity() + self.out.capacity() + self.job_bytes
    }

    /// Whether closing it frees bytes: its own, or its share of a buffer.
    fn holds_bytes(&self) -> bool {
        self.accounted > 0 || self.out_shared.is_some()
    }

    /// Bytes of the reply: its own, then the shared ones.
    fn out_len(&self) -> usize {
        self.out.len() + self.out_shared.as_ref().map_or(0, |s| s.len())
    }
}

/// The key of a shared buffer in [`EventLoop::shared`]: its address.
fn shared_key(buf: &Arc<[u8]>) -> usize {
    Arc::as_ptr(buf).cast::<u8>() as usize
}

/// The poll thread's state.
pub(super) struct EventLoop<S: Service> {
    poll: Poll,
    listener: Option<TcpListener>,
    service: Arc<S>,
    opts: Options,
    jobs: Option<Sender<Job<S::Request>>>,
    done: Receiver<Done>,
    conns: HashMap<Token, Conn<S::Parser>>,
    next_token: usize,
    deadlines: BTreeSet<(Instant, Token)>,
    /// The connections that may be closed to make room, in the order they
    /// are: those lingering after their reply (oldest first), then those
    /// waiting for their client to send a request or take a reply, by their
    /// last progress (the one stalled longest first).
    lingering: BTreeSet<Token>,
    waiting: BTreeSet<(Instant, Token)>,
    /// Bytes held across connections, counted against
    /// [`Options::max_buffered`].
    buffered: usize,
    /// The shared reply buffers being sent, by [`shared_key`]: how many
    /// connections send each, and its length (counted once in `buffered`).
    shared: HashMap<usize, (usize, usize)>,
    busy: usize,
    /// The listener may have connections waiting that were left there.
    accept_pending: bool,
    accept_retry: Option<Instant>,
    scratch: Vec<u8>,
}

/// Whether a connection waits in `listener`'s backlog (a poll that does
/// not wait), so that accepting it will not find none.
fn backlog_has_one(listener: &TcpListener) -> bool {
    let mut fd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, of a descriptor the listener owns, and a
    // timeout of 0.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    ready > 0 && fd.revents & libc::POLLIN != 0
}

impl<S: Service> EventLoop<S> {
    pub(super) fn new(
        poll: Poll,
        listener: std::net::TcpListener,
        service: Arc<S>,
        opts: Options,
        jobs: Sender<Job<S::Request>>,
        done: Receiver<Done>,
    ) -> io::Result<Self> {
        let mut listener = TcpListener::from_std(listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        Ok(EventLoop {
            poll,
            listener: Some(listener),
            service,
            opts,
            jobs: Some(jobs),
            done,
            conns: HashMap::new(),
            next_token: FIRST_CONN,
            deadlines: BTreeSet::new(),
            lingering: BTreeSet::new(),
            waiting: BTreeSet::new(),
            buffered: 0,
            shared: HashMap::new(),
            busy: 0,
            accept_pending: true,
            accept_retry: None,
            scratch: vec![0; READ_CHUNK],
        })
    }

    /// Serves until the stop flag is set and the handlers still running
    /// have returned.
    pub(super) fn run(mut self, shared: &Shared) {
        let mut events = Events::with_capacity(1024);
        let mut stopping = false;
        loop {
            if !stopping && shared.stop.load(Ordering::Acquire) {
                stopping = true;
                self.stop();
            }
            if stopping && self.busy == 0 {
                break;
            }
            let timeout = self.poll_timeout();
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    crate::log_limit::warn_limited!("{} poll failed: {e}", S::NAME);
                    std::thread::sleep(ACCEPT_BACKOFF);
                }
                continue;
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_pending = true,
                    WAKER => {}
                    t => self.on_event(t),
                }
            }
            self.collect_done(stopping);
            self.expire(Instant::now());
            if !stopping {
                self.accept();
            }
        }
        // Dropping the job sender ends the workers.
        self.jobs = None;
        debug!("{} server stopped", S::NAME);
    }

    /// Closes the listener and every connection whose request is not with
    /// a worker.
    fn stop(&mut self) {
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        let idle: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state != State::Busy)
            .map(|(t, _)| *t)
            .collect();
        for t in idle {
            self.close(t);
        }
    }

    fn poll_timeout(&self) -> Option<Duration> {
        let now = Instant::now();
        let mut at = self.deadlines.first().map(|(d, _)| *d);
        if self.accept_pending && self.listener.is_some() && self.can_admit() {
            let retry = self.accept_retry.unwrap_or(now);
            at = Some(at.map_or(retry, |d| d.min(retry)));
        }
        at.map(|d| d.saturating_duration_since(now))
    }

    fn can_admit(&self) -> bool {
        self.conns.len() < self.opts.max_connections
            || !self.lingering.is_empty()
            || !self.waiting.is_empty()
    }

    /// Accepts up to [`ACCEPT_BATCH`] waiting connections, making room at
    /// the bound, for each one waiting in the backlog, by closing the one
    /// that has waited longest for its client.
    fn accept(&mut self) {
        if !self.accept_pending || self.accept_retry.is_some_and(|t| Instant::now() < t) {
            return;
        }
        self.accept_retry = None;
        for _ in 0..ACCEPT_BATCH {
            if self.conns.len() >= self.opts.max_connections
                && !self.listener.as_ref().is_some_and(backlog_has_one)
            {
                // At the bound, room is made only for a connection that
                // is there: none is closed for one that never comes.
                self.accept_pending = false;
                return;
            }
            if self.conns.len() >= self.opts.max_connections && !self.evict_one() {
                // Every connection has a request in a handler: new ones
                // wait in the listen backlog until one finishes.
                crate::log_limit::warn_limited!(
                    "{}: {} connections open, each with a request in progress (the limit, \
                     {}); new connections wait in the listen backlog",
                    S::NAME,
                    self.conns.len(),
                    S::SETTINGS.connections
                );
                return;
            }
            let Some(listener) = &self.listener else {
                return;
            };
            match listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.accept_pending = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // E.g. EMFILE: the connection stays in the backlog.
                    crate::log_limit::warn_limited!("{} listener accept failed: {e}", S::NAME);
                    self.accept_retry = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    /// The connections that may be closed to make room, first to go first.
    fn victims(&self) -> impl Iterator<Item = Token> + '_ {
        self.lingering
            .iter()
            .copied()
            .chain(self.waiting.iter().map(|(_, t)| *t))
    }

    /// Closes the connection that has waited longest for its client; false
    /// if every connection has its request with a worker.
    fn evict_one(&mut self) -> bool {
        let Some(t) = self.victims().next() else {
            return false;
        };
        if let Some(c) = self.conns.get(&t) {
            crate::log_limit::warn_limited!(
                "{}: {} connections open (the limit, {}); closed the one stalled longest \
                 waiting for its client, from {} ({:?})",
                S::NAME,
                self.conns.len(),
                S::SETTINGS.connections,
                c.peer,
                c.state
            );
        }
        self.close(t);
        true
    }

    fn admit(&mut self, tcp: TcpStream, peer: SocketAddr) {
        let token = Token(self.next_token);
        self.next_token += 1;
        let _ = tcp.set_nodelay(true);
        let mut stream = match &self.opts.tls {
            None => Stream::plain(tcp),
            Some(config) => match Stream::tls(tcp, config) {
                Ok(s) => s,
                Err(e) => {
                    crate::log_limit::warn_limited!(
                        "{} connection from {peer} dropped: TLS: {e}",
                        S::NAME
                    );
                    return;
                }
            },
        };
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            token,
            Interest::READABLE | Interest::WRITABLE,
        ) {
            crate::log_limit::warn_limited!("{} connection from {peer} dropped: {e}", S::NAME);
            return;
        }
        self.conns.insert(
            token,
            Conn {
                stream,
                peer,
                state: State::Reading,
                buf: Vec::new(),
                want: None,
                parser: S::Parser::default(),
                out: Vec::new(),
                out_shared: None,
                out_pos: 0,
                then: Then::Linger,
                progress: Instant::now(),
                deadline: None,
                job_bytes: 0,
                accounted: 0,
                drained: 0,
            },
        );
        self.enter(token, State::Reading, self.opts.request_timeout);
        self.read_request(token);
    }

    /// Removes a connection from the eviction order.
    fn unfile(&mut self, token: Token) {
        if let Some(c) = self.conns.get(&token) {
            match c.state {
                State::Lingering => self.lingering.remove(&token),
                State::Reading | State::Writing => self.waiting.remove(&(c.progress, token)),
                State::Busy => false,
            };
        }
    }

    /// Files a connection in the eviction order by its state and progress.
    fn file(&mut self, token: Token) {
        if let Some(c) = self.conns.get(&token) {
            match c.state {
                State::Lingering => self.lingering.insert(token),
                State::Reading | State::Writing => self.waiting.insert((c.progress, token)),
                State::Busy => false,
            };
        }
    }

    /// Notes that a connection moved bytes now.
    fn progressed(&mut self, token: Token) {
        self.unfile(token);
        if let Some(c) = self.conns.get_mut(&token) {
            c.progress = Instant::now();
        }
        self.file(token);
    }

    /// Moves a connection to `state`, with a deadline `timeout` from now
    /// (none while Busy), and files it where eviction finds it.
    fn enter(&mut self, token: Token, state: State, timeout: Duration) {
        self.unfile(token);
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if let Some(d) = c.deadline.take() {
            self.deadlines.remove(&(d, token));
        }
        if c.state == State::Busy && state != State::Busy {
            self.busy -= 1;
        } else if c.state != State::Busy && state == State::Busy {
            self.busy += 1;
        }
        let now = Instant::now();
        c.state = state;
        c.progress = now;
        if state != State::Busy {
            let d = now + timeout;
            c.deadline = Some(d);
            self.deadlines.insert((d, token));
        }
        self.file(token);
    }

    fn close(&mut self, token: Token) {
        self.unfile(token);
        self.drop_reply(token);
        let Some(mut c) = self.conns.remove(&token) else {
            return;
        };
        if let Some(d) = c.deadline {
            self.deadlines.remove(&(d, token));
        }
        if c.state == State::Busy {
            self.busy -= 1;
        }
        self.buffered -= c.accounted;
        let _ = self.poll.registry().deregister(&mut c.stream);
        // Dropping the stream closes the socket.
    }

    /// Counts a connection's new shared buffer, once across connections.
    fn hold_shared(&mut self, token: Token) {
        let Some(buf) = self.conns.get(&token).and_then(|c| c.out_shared.as_ref()) else {
            return;
        };
        let (count, len) = self.shared.entry(shared_key(buf)).or_insert((0, buf.len()));
        if *count == 0 {
            self.buffered += *len;
        }
        *count += 1;
    }

    /// Forgets a connection's reply (sent or abandoned), and stops counting
    /// its shared buffer when no other connection sends it.
    fn drop_reply(&mut self, token: Token) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        c.out = Vec::new();
        c.out_pos = 0;
        if let Some(buf) = c.out_shared.take() {
            let key = shared_key(&buf);
            if let Some((count, len)) = self.shared.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    self.buffered -= *len;
                    self.shared.remove(&key);
                }
            }
        }
        self.account(token);
    }

    /// Re-counts a connection's buffers against the global bound.
    fn account(&mut self, token: Token) {
        if let Some(c) = self.conns.get_mut(&token) {
            let held = c.held();
            self.buffered = self.buffered - c.accounted + held;
            c.accounted = held;
        }
    }

    fn on_event(&mut self, token: Token) {
        let Some(c) = self.conns.get(&token) else {
            return;
        };
        match c.state {
            State::Reading => self.read_request(token),
            State::Writing => self.write_reply(token),
            State::Lingering => self.linger(token),
            // The request is with a worker: nothing to read or write yet.
            State::Busy => {}
        }
    }

    /// Makes room for `more` bytes held by `token`: closes other
    /// connections that hold bytes and wait for their client (to send the
    /// rest of a request or take a reply), the one stalled longest first.
    /// False if there is not enough to free.
    fn make_room(&mut self, token: Token, more: usize) -> bool {
        while self.buffered + more > self.opts.max_buffered {
            let victim = self
                .victims()
                .find(|t| *t != token && self.conns.get(t).is_some_and(Conn::holds_bytes));
            let Some(v) = victim else {
                return false;
            };
            if let Some(c) = self.conns.get(&v) {
                let what = match c.state {
                    State::Writing => "a reply not taken",
                    State::Lingering => "a connection after its reply",
                    State::Reading | State::Busy => "an incomplete request",
                };
                crate::log_limit::warn_limited!(
                    "{}: {} bytes buffered across connections (the limit, {}); closed {what} \
                     (stalled {:?}), from {}",
                    S::NAME,
                    self.buffered,
                    S::SETTINGS.buffered,
                    c.progress.elapsed(),
                    c.peer
                );
            }
            self.close(v);
        }
        true
    }

    /// Parses what has arrived and reads more, until the request is
    /// complete, the socket has nothing more, or the connection closes.
    fn read_request(&mut self, token: Token) {
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            // On Done the request takes the buffer as it was, and the
            // connection keeps a new one with what follows the request.
            let request_bytes = c.buf.capacity();
            match self.service.parse(&mut c.parser, &mut c.buf) {
                Parse::More { interim, want } => {
                    if let Some(bytes) = interim {
                        // Small and sent once, when nothing else is queued
                        // on the socket. Were it not taken whole, an HTTP
                        // client proceeds without it, and the handshake's
                        // authentication runs into its deadline.
                        let _ = c.stream.write(&bytes);
                    }
                    c.want = want;
                }
                Parse::Done(request) => {
                    c.parser = S::Parser::default();
                    c.want = None;
                    return self.dispatch(token, request, request_bytes);
                }
                Parse::Invalid { reason, reply } => {
                    let peer = c.peer;
                    self.account(token);
                    crate::log_limit::warn_limited!(
                        "{} connection from {peer} closed: {reason}",
                        S::NAME
                    );
                    match reply {
                        Some(bytes) => self.send(token, Reply::owned(bytes, Then::Linger)),
                        None => self.close(token),
                    }
                    return;
                }
            }
            let n = match c.stream.read(&mut self.scratch) {
                Ok(0) => {
                    debug!(
                        "{} connection from {} closed by the client before a complete request",
                        S::NAME,
                        c.peer
                    );
                    return self.close(token);
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    debug!("{} connection from {}: {e}", S::NAME, c.peer);
                    return self.close(token);
                }
            };
            // The buffer grows geometrically as bytes arrive, but never
            // beyond the size of the request when that is known.
            let len = c.buf.len() + n;
            let cap = c.buf.capacity();
            let target = if len <= cap {
                cap
            } else {
                let doubled = (cap * 2).max(len).max(MIN_BUFFER);
                match c.want {
                    Some(w) if w >= len => doubled.min(w),
                    _ => doubled,
                }
            };
            if target > cap && !self.make_room(token, target - cap) {
                let peer = self.conns.get(&token).map(|c| c.peer);
                crate::log_limit::warn_limited!(
                    "{}: {} bytes buffered across connections (the limit, {}); connection \
                     from {peer:?} closed",
                    S::NAME,
                    self.buffered,
                    S::SETTINGS.buffered
                );
                return self.close(token);
            }
            if let Some(c) = self.conns.get_mut(&token) {
                c.buf.reserve_exact(target - c.buf.len());
                c.buf.extend_from_slice(&self.scratch[..n]);
            }
            self.account(token);
            self.progressed(token);
        }
    }

    /// Answers, hands over or refuses a complete request of `bytes`.
    fn dispatch(&mut self, token: Token, request: S::Request, bytes: usize) {
        self.account(token);
        match self.service.dispatch(request) {
            Dispatch::Reply(reply) => self.send(token, reply),
            Dispatch::Close(reason) => {
                if let Some(c) = self.conns.get(&token) {
                    crate::log_limit::warn_limited!(
                        "{} connection from {} closed: {reason}",
                        S::NAME,
                        c.peer
                    );
                }
                self.close(token);
            }
            Dispatch::Work(request) => {
                let (Some(jobs), Some(c)) = (&self.jobs, self.conns.get_mut(&token)) else {
                    return;
                };
                let job = Job {
                    token,
                    peer: c.peer,
                    request,
                };
                if jobs.send(job).is_err() {
                    return self.close(token);
                }
                // The request's memory is the worker's until it answers.
                c.job_bytes = bytes;
                self.account(token);
                self.enter(token, State::Busy, Duration::ZERO);
            }
        }
    }

    /// Takes the workers' answers.
    fn collect_done(&mut self, stopping: bool) {
        while let Ok((token, result)) = self.done.try_recv() {
            let Some(c) = self.conns.get_mut(&token) else {
                continue;
            };
            c.job_bytes = 0;
            match result {
                Ok(reply) if stopping => {
                    // Shutting down: one attempt, no waiting.
                    let shared = reply.shared.as_deref().unwrap_or_default();
                    let _ = c
                        .stream
                        .write_vectored(&[IoSlice::new(&reply.bytes), IoSlice::new(shared)]);
                    let _ = c.stream.flush();
                    let _ = c.stream.shutdown_write();
                    self.close(token);
                }
                Ok(reply) => {
                    self.enter(token, State::Writing, self.opts.write_timeout);
                    self.send(token, reply);
                }
                Err(reason) => {
                    crate::log_limit::warn_limited!(
                        "{} connection from {} closed: {reason}",
                        S::NAME,
                        c.peer
                    );
                    self.close(token);
                }
            }
        }
    }

    /// Starts writing a reply, once its bytes fit in
    /// [`Options::max_buffered`]: others waiting for their client make room,
    /// or the service's refusal goes out instead (or the connection closes).
    fn send(&mut self, token: Token, reply: Reply) {
        let len = reply.bytes.len() + reply.shared.as_ref().map_or(0, |s| s.len());
        if !self.take_reply(token, reply) {
            let Some(c) = self.conns.get(&token) else {
                return;
            };
            crate::log_limit::warn_limited!(
                "{}: {} bytes buffered across connections (the limit, {}); the reply of \
                 {len} bytes to {} does not fit beside the requests with the workers: refused",
                S::NAME,
                self.buffered,
                S::SETTINGS.buffered,
                c.peer
            );
            let refusal = self.service.refusal().map(|r| Reply {
                then: Then::Linger,
                ..r
            });
            if !refusal.is_some_and(|r| self.take_reply(token, r)) {
                return self.close(token);
            }
        }
        self.write_reply(token);
    }

    /// Makes `reply` the connection's reply if it fits, counting its bytes.
    fn take_reply(&mut self, token: Token, reply: Reply) -> bool {
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        c.out = reply.bytes;
        c.out_shared = reply.shared;
        c.out_pos = 0;
        c.then = reply.then;
        if c.state != State::Writing {
            self.enter(token, State::Writing, self.opts.write_timeout);
        }
        // Counted before room is made, so that closing others who send the
        // same shared buffer cannot stop counting it.
        self.hold_shared(token);
        self.account(token);
        if self.make_room(token, 0) {
            return true;
        }
        self.drop_reply(token);
        false
    }

    fn write_reply(&mut self, token: Token) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let mut moved = false;
        let mut blocked = false;
        while c.out_pos < c.out_len() {
            let own = c.out.get(c.out_pos..).unwrap_or_default();
            let shared = c.out_shared.as_deref().unwrap_or_default();
            let shared = shared
                .get(c.out_pos.saturating_sub(c.out.len())..)
                .unwrap_or_default();
            match c
                .stream
                .write_vectored(&[IoSlice::new(own), IoSlice::new(shared)])
            {
                Ok(0) => return self.close(token),
                Ok(n) => {
                    c.out_pos += n;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    blocked = true;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!("{} reply to {} failed: {e}", S::NAME, c.peer);
                    return self.close(token);
                }
            }
        }
        if !blocked {
            // TLS: the reply's last records still held count as unsent.
            match c.stream.flush() {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => blocked = true,
                Err(e) => {
                    debug!("{} reply to {} failed: {e}", S::NAME, c.peer);
                    return self.close(token);
                }
            }
        }
        if moved {
            self.progressed(token);
        }
        if blocked {
            return;
        }
        self.drop_reply(token);
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        match c.then {
            Then::Linger => {
                if c.stream.shutdown_write().is_err() {
                    return self.close(token);
                }
                c.drained = 0;
                self.enter(token, State::Lingering, self.opts.linger_timeout);
                self.linger(token);
            }
            Then::KeepAlive => {
                self.enter(token, State::Reading, self.opts.request_timeout);
                self.read_request(token);
            }
        }
    }

    /// Reads and discards until the client closes.
    fn linger(&mut self, token: Token) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        loop {
            match c.stream.read(&mut self.scratch) {
                Ok(0) => return self.close(token),
                Ok(n) => {
                    c.drained += n;
                    if c.drained > LINGER_DRAIN {
                        return self.close(token);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(token),
            }
        }
    }

    /// Closes the connections whose deadline passed.
    fn expire(&mut self, now: Instant) {
        while let Some(&(d, token)) = self.deadlines.first() {
            if d > now {
                return;
            }
            self.deadlines.remove(&(d, token));
            let Some(c) = self.conns.get_mut(&token) else {
                continue;
            };
            c.deadline = None;
            match c.state {
                State::Reading => crate::log_limit::warn_limited!(
                    "{} connection from {} closed: no complete request within {:?} ({}; \
                     {} bytes received)",
                    S::NAME,
                    c.peer,
                    self.opts.request_timeout,
                    S::SETTINGS.timeout,
                    c.buf.len()
                ),
                State::Writing => crate::log_limit::warn_limited!(
                    "{} connection from {} closed: the reply was not taken within {:?} ({})",
                    S::NAME,
                    c.peer,
                    self.opts.write_timeout,
                    S::SETTINGS.timeout
                ),
                State::Lingering | State::Busy => debug!(
                    "{} connection from {} closed: the client did not close after the reply",
                    S::NAME,
                    c.peer
                ),
            }
            self.close(token);
        }
    }
}
