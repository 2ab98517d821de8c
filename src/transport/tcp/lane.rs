//! Client lanes: persistent connections over one rail to one peer device,
//! driven by the I/O threads (see [`super::io`]) on non-blocking sockets.
//!
//! A lane takes slices from its inbox, connects when it has work (never in
//! the submitting thread; bound to the rail's local address), pipelines
//! requests, sends WRITE payloads straight from the caller's memory and
//! receives acknowledgements and READ payloads straight into it, in request
//! order. A slice is finished exactly once, by the lane's I/O thread, after
//! the lane is done with its memory.
//!
//! Connection failures: the connection is reset (`SO_LINGER` 0), so the
//! kernel discards what it still held: once a slice is reported failed, no
//! byte of it is sent any more. A request that never reached the wire, or
//! whose connection was closed by the peer before any answer (a peer's idle
//! timeout, a restart) is sent once more on a fresh connection. A failed
//! connect puts the lanes of the endpoint in a one-second cooldown during
//! which their slices fail at once (a successful rail probe ends it): a
//! dead peer costs at most one connect attempt per lane and second, and no
//! thread.
//!
//! Slow peers: while its pipeline holds a request, a connection's peer must
//! take our bytes (acknowledge them) or give the answers at
//! `MC_TCP_MIN_RATE_BYTES_PER_SEC` averaged over each
//! `MC_TCP_MIN_RATE_WINDOW_SEC`, or finish within the window every request
//! in flight at its start (see [`super::progress`]); else the connection
//! is reset and its requests fail as a stalled connection's do. A peer
//! that trickles a READ's reply, or reads a WRITE's payload a KiB now and
//! then, cannot keep a request open past a window or two.
//!
//! Authentication: with a cluster key, a connection proves it holds the
//! key and checks the peer's proof ([`crate::auth`]) before its first
//! request, within the connect timeout; a peer that refuses us, or whose
//! proof is wrong, fails the lane's requests (none reached it) and cools
//! the endpoint down as a failed connect does.

use super::progress::{MinRate, Progress, Requests, Seen, Slow, Traffic};
use super::wire::{
    DIRECT_RECV_MIN, HEADER_LEN, Header, OP_READ, OP_WRITE, Recv, RecvBuf, STATUS_OK, V2_FLAG,
    iovec, send_some, status_valid,
};
use crate::auth::{ClientAuth, Gate, Keys, Port, Standing};
use crate::batch;
use crate::log_limit::{LogLimit, Suppressed};
use crate::sync;
use crate::transport::{Outcome, Slice};
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use socket2::{Domain, SockRef, Socket, TcpKeepalive, Type};
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Most slices and bytes written with one `sendmsg`.
const MAX_BATCH_SLICES: usize = 64;
const MAX_BATCH_BYTES: u64 = 4 << 20;
/// Receive buffer of a connected lane.
const RECV_BUF: usize = 64 * 1024;
/// Times a request may go back to the queue unsent before it fails.
const MAX_REQUEUES: u32 = 8;
/// Why a request whose local buffer's fence refuses it fails.
const UNREGISTERED: &str = "its local buffer was unregistered during the transfer";
/// After a failed connect, the endpoint's lanes fail their slices at once
/// for this long instead of connecting.
const COOLDOWN: Duration = Duration::from_secs(1);
/// TCP keepalive: first probe after this much silence, then every
/// interval, giving up after the count.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_COUNT: u32 = 3;

/// Where a lane connects: the rail's local address (if bound) and the
/// peer device's address and data port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LaneTarget {
    /// Local address to bind before connecting; `None` lets routing choose.
    pub bind: Option<IpAddr>,
    /// Peer host name or address (IPv6 without brackets).
    pub host: String,
    /// Peer data port.
    pub port: u16,
    /// Whether to use the acknowledged framing.
    pub v2: bool,
    /// The name the peer answers to ([`crate::segment::RemoteSegment::identity`]),
    /// which the proofs of authentication are bound to.
    pub name: String,
}

impl LaneTarget {
    /// The target's addresses of the rail's address family. Resolving a
    /// host name may block: it is done once per endpoint, never by an I/O
    /// thread.
    pub fn resolve(&self) -> io::Result<Vec<SocketAddr>> {
        use std::net::ToSocketAddrs;
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port)
            .to_socket_addrs()?
            .filter(|a| self.bind.is_none_or(|b| b.is_ipv4() == a.is_ipv4()))
            .collect();
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} resolved to no address of the rail's family", self.host),
            ));
        }
        Ok(addrs)
    }
}

/// Timeouts and the minimum rate of a lane.
#[derive(Debug, Clone, Copy)]
pub struct LaneTimeouts {
    /// Connect timeout.
    pub connect: Duration,
    /// Longest time a request may make no progress.
    pub stall: Duration,
    /// An idle connection is closed after this long.
    pub idle: Duration,
    /// The least a connection's peer must get done while a request is in
    /// flight.
    pub min_rate: MinRate,
}

/// Connect health shared by the lanes of one endpoint: after a failed
/// connect, none is tried for [`COOLDOWN`]; why it failed is kept until a
/// connection succeeds. After a connection was given up on because its
/// peer took nothing (or too little, `MC_TCP_MIN_RATE_*`) for a window,
/// none is tried for [`COOLDOWN`] either, and that one is not ended by a
/// connection that succeeds: the kernel of a stopped process still
/// accepts connections. So the requests that queued behind the given-up
/// ones (staged GPU pieces waiting for a buffer, retries) fail at once,
/// instead of waiting out a window each on a fresh connection.
#[derive(Default)]
pub struct ConnectHealth {
    state: Mutex<Cooldown>,
}

#[derive(Default)]
struct Cooldown {
    until: Option<Instant>,
    stalled_until: Option<Instant>,
    why: Option<String>,
}

impl ConnectHealth {
    fn cooling(&self, now: Instant) -> bool {
        let c = sync::lock(&self.state);
        [c.until, c.stalled_until]
            .into_iter()
            .flatten()
            .any(|t| now < t)
    }

    fn failed(&self, now: Instant, why: String) {
        let mut c = sync::lock(&self.state);
        c.until = Some(now + COOLDOWN);
        c.why = Some(why);
    }

    /// A connection was given up on because its peer did not keep up.
    fn stalled(&self, now: Instant, why: String) {
        let mut c = sync::lock(&self.state);
        c.stalled_until = Some(now + COOLDOWN);
        c.why = Some(why);
    }

    /// Ends the cooldown after a failed connect: the peer accepts
    /// connections.
    pub fn succeeded(&self) {
        let mut c = sync::lock(&self.state);
        c.until = None;
        if c.stalled_until.is_none_or(|t| Instant::now() >= t) {
            c.why = None;
        }
    }

    /// Why the last connect failed, unless one succeeded since.
    pub fn failure(&self) -> Option<String> {
        sync::lock(&self.state).why.clone()
    }
}

struct Inbox {
    slices: VecDeque<Slice>,
    closed: bool,
}

/// The part of a lane that submitting threads see: its inbox and load.
pub struct LaneShared {
    /// Identifies the lane; also its token in its I/O thread's poll.
    pub token: Token,
    /// Index of the I/O thread that serves the lane.
    pub thread: usize,
    /// Where it connects.
    pub target: LaneTarget,
    addrs: Vec<SocketAddr>,
    timeouts: LaneTimeouts,
    health: Arc<ConnectHealth>,
    /// The cluster keys the lane authenticates with.
    auth: Option<Arc<Keys>>,
    inbox: Mutex<Inbox>,
    /// Set while a kick is on its way to the I/O thread.
    kicked: AtomicBool,
    /// The endpoint left the pool: close once idle.
    retiring: AtomicBool,
    load: AtomicU64,
}

impl LaneShared {
    /// A lane served by I/O thread `thread`.
    pub fn new(
        token: Token,
        thread: usize,
        target: LaneTarget,
        addrs: Vec<SocketAddr>,
        timeouts: LaneTimeouts,
        health: Arc<ConnectHealth>,
        auth: Option<Arc<Keys>>,
    ) -> LaneShared {
        LaneShared {
            token,
            thread,
            target,
            addrs,
            timeouts,
            health,
            auth,
            inbox: Mutex::new(Inbox {
                slices: VecDeque::new(),
                closed: false,
            }),
            kicked: AtomicBool::new(false),
            retiring: AtomicBool::new(false),
            load: AtomicU64::new(0),
        }
    }

    /// Bytes queued or in flight.
    pub fn load(&self) -> u64 {
        self.load.load(Ordering::Relaxed)
    }

    /// Queues a slice; `Err` gives it back when the lane is closed. `Ok(true)`
    /// when the I/O thread must be kicked.
    pub fn push(&self, slice: Slice) -> Result<bool, Slice> {
        let mut inbox = sync::lock(&self.inbox);
        if inbox.closed {
            return Err(slice);
        }
        self.load.fetch_add(slice.len, Ordering::Relaxed);
        inbox.slices.push_back(slice);
        drop(inbox);
        Ok(!self.kicked.swap(true, Ordering::AcqRel))
    }

    /// Marks the lane to close once it has nothing to do.
    pub fn retire(&self) {
        self.retiring.store(true, Ordering::Release);
    }

    /// Closes the inbox and fails what it still holds (shutdown).
    pub fn close(&self) {
        let left: Vec<Slice> = {
            let mut inbox = sync::lock(&self.inbox);
            inbox.closed = true;
            inbox.slices.drain(..).collect()
        };
        for s in left {
            self.finish(s, Outcome::Failed { hard: true });
        }
    }

    fn finish(&self, s: Slice, outcome: Outcome) {
        self.load.fetch_sub(s.len, Ordering::Relaxed);
        s.finish(outcome);
    }

    /// Takes the inbox's slices; `None` (and the inbox closed) when the
    /// lane is retiring and has nothing left.
    fn take(&self, pipeline_empty: bool) -> Option<Vec<Slice>> {
        self.kicked.store(false, Ordering::Release);
        let mut inbox = sync::lock(&self.inbox);
        if inbox.slices.is_empty() && pipeline_empty && self.retiring.load(Ordering::Acquire) {
            inbox.closed = true;
            return None;
        }
        Some(inbox.slices.drain(..).collect())
    }
}

impl Drop for LaneShared {
    /// A lane dropped with slices in its inbox (a submit that pushed to it
    /// as the transport shut down, after its I/O thread stopped) fails
    /// them: a slice never ended would leave its task waiting forever.
    fn drop(&mut self) {
        self.close();
    }
}

/// A slice on its way: the header, how much of header and payload went
/// out, and what came back.
struct Req {
    slice: Slice,
    header: [u8; HEADER_LEN],
    v2: bool,
    sent: u64,
    status_ok: bool,
    got: u64,
    /// Sent again after its connection was closed by the peer.
    resent: bool,
    /// Times it went back to the queue unsent ([`MAX_REQUEUES`]).
    requeued: u32,
    /// When the lane took it.
    taken: Instant,
    /// A READ of a cancelled task whose answer was on its way: the slice
    /// ended ([`Lane::withdraw_canceled`]), and its payload is received
    /// and dropped, never written to the local memory.
    discard: bool,
}

impl Req {
    fn new(slice: Slice, v2: bool) -> Req {
        let op = if slice.write { OP_WRITE } else { OP_READ };
        let header = Header {
            size: slice.len,
            addr: slice.remote,
            opcode: op | if v2 { V2_FLAG } else { 0 },
        }
        .encode();
        Req {
            slice,
            header,
            v2,
            sent: 0,
            status_ok: false,
            got: 0,
            resent: false,
            requeued: 0,
            taken: Instant::now(),
            discard: false,
        }
    }

    /// Puts it back in line to go out again on a fresh connection, unless
    /// it went back [`MAX_REQUEUES`] times or waited `within` since the
    /// lane took it (then it fails: a request cannot loop without end).
    fn requeue(&mut self, within: Duration) -> bool {
        if self.requeued >= MAX_REQUEUES || self.taken.elapsed() >= within {
            return false;
        }
        self.requeued += 1;
        true
    }

    fn wire_len(&self) -> u64 {
        HEADER_LEN as u64 + if self.slice.write { self.slice.len } else { 0 }
    }

    fn sent_all(&self) -> bool {
        self.sent == self.wire_len()
    }

    /// Whether the peer answers this request (v1 WRITEs get no answer).
    fn answered_by_peer(&self) -> bool {
        self.v2 || !self.slice.write
    }

    fn done(&self) -> bool {
        self.sent_all()
            && match (self.v2, self.slice.write) {
                (false, true) => true,
                (true, true) => self.status_ok,
                (v2, false) => (!v2 || self.status_ok) && self.got == self.slice.len,
            }
    }

    fn any_answer(&self) -> bool {
        self.status_ok || self.got > 0
    }
}

enum ConnState {
    /// Connecting to `addrs[at]`, until the deadline.
    Connecting {
        at: usize,
        deadline: Instant,
    },
    /// Connected; proving that we hold the cluster key, until the
    /// deadline.
    Authenticating {
        gate: Box<Gate<ClientAuth>>,
        deadline: Instant,
    },
    Ready,
}

struct Conn {
    stream: TcpStream,
    state: ConnState,
    rbuf: RecvBuf,
    last_progress: Instant,
    /// Bytes moved on the connection.
    traffic: Traffic,
    /// What its peer took over time.
    progress: Progress,
    /// Requests finished on the connection.
    finished: u64,
    /// Whether the pipeline was empty at some moment since the last sweep.
    broke: bool,
}

impl Conn {
    fn new(stream: TcpStream, state: ConnState, now: Instant) -> Conn {
        Conn {
            stream,
            state,
            rbuf: RecvBuf::new(RECV_BUF),
            last_progress: now,
            traffic: Traffic::default(),
            progress: Progress::new(now),
            finished: 0,
            broke: false,
        }
    }

    /// Fills the receive buffer from the socket.
    fn fill(&mut self) -> io::Result<Recv> {
        let got = self.rbuf.fill(self.stream.as_raw_fd());
        if let Ok(Recv::Bytes(n)) = got {
            self.traffic.add_received(n);
        }
        got
    }
}

/// Why a connection ended with requests on it.
enum Failure {
    /// The peer rejected the request at this pipeline index (v2).
    Rejected(usize),
    /// The request at this pipeline index cannot use its local memory:
    /// its buffer was unregistered, or the kernel refused the address
    /// (EFAULT); why.
    Local(usize, String),
    /// The peer closed or reset the connection.
    Closed(String),
    /// Anything else: a timeout, a malformed answer.
    Broken(String),
}

/// A lane as its I/O thread holds it.
pub struct Lane {
    shared: Arc<LaneShared>,
    conn: Option<Conn>,
    pipeline: VecDeque<Req>,
    /// Index in `pipeline` of the first request not fully sent.
    send_at: usize,
    /// Index of the first request whose answer is not complete.
    recv_at: usize,
    last_used: Instant,
    /// [`batch::cancels`] when the lane last looked for cancelled
    /// requests.
    cancels_seen: u64,
}

/// Starts a non-blocking connect to `addr`, bound to `bind`.
pub fn start_connect(bind: Option<IpAddr>, addr: SocketAddr) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_nonblocking(true)?;
    if let Some(ip) = bind {
        socket.bind(&SocketAddr::new(ip, 0).into())?;
    }
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(socket.into()))
}

/// Whether a non-blocking connect finished: `Ok(true)` connected,
/// `Ok(false)` still in progress.
fn connect_finished(stream: &TcpStream) -> io::Result<bool> {
    if let Some(e) = stream.take_error()? {
        return Err(e);
    }
    match stream.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
        Err(e) => Err(e),
    }
}

/// Sets the options of a connected data socket: no Nagle, keepalive.
pub fn tune(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let ka = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_COUNT);
    SockRef::from(stream).set_tcp_keepalive(&ka)
}

/// Closes with a reset: the kernel discards what it still holds to send.
pub fn abort(stream: &TcpStream) {
    let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

impl Lane {
    /// The I/O thread's side of a lane.
    pub fn new(shared: Arc<LaneShared>) -> Lane {
        Lane {
            shared,
            conn: None,
            pipeline: VecDeque::new(),
            send_at: 0,
            recv_at: 0,
            last_used: Instant::now(),
            cancels_seen: batch::cancels(),
        }
    }

    /// Whether the lane has nothing to do and no connection: its I/O
    /// thread may forget it.
    pub fn dormant(&self) -> bool {
        self.conn.is_none() && self.pipeline.is_empty()
    }

    /// Takes new slices from the inbox and serves them. `false` once the
    /// lane is retired and closed.
    pub fn kick(&mut self, registry: &Registry) -> bool {
        let Some(new) = self.shared.take(self.pipeline.is_empty()) else {
            self.disconnect(registry, false);
            return false;
        };
        let v2 = self.shared.target.v2;
        self.pipeline
            .extend(new.into_iter().map(|s| Req::new(s, v2)));
        self.pump(registry);
        true
    }

    /// Serves a readiness event.
    pub fn on_event(&mut self, registry: &Registry) {
        self.pump(registry);
    }

    /// Whether the I/O thread keeps the lane: a retired lane with nothing
    /// left closes, a dormant one is forgotten until its next kick.
    pub fn settle(&mut self, registry: &Registry) -> bool {
        if self.pipeline.is_empty() && self.shared.retiring.load(Ordering::Acquire) {
            return self.kick(registry);
        }
        !self.dormant()
    }

    /// Runs the timers: connect deadline, stalled or slow requests, idle
    /// close; `held_up` if the I/O thread was held up since the last sweep
    /// (the time is not counted against the peer's rate).
    pub fn sweep(&mut self, registry: &Registry, now: Instant, held_up: bool) {
        self.withdraw_canceled();
        let Some(conn) = &self.conn else {
            return;
        };
        match conn.state {
            ConnState::Connecting { deadline, .. } if now >= deadline => {
                self.connect_next(registry, "timed out");
            }
            ConnState::Connecting { .. } => {}
            ConnState::Authenticating { deadline, .. } if now >= deadline => {
                let why = format!(
                    "no answer to the authentication within {:?}",
                    self.shared.timeouts.connect
                );
                self.auth_failed(registry, &why);
            }
            ConnState::Authenticating { .. } => {}
            ConnState::Ready if !self.pipeline.is_empty() => {
                let quiet = now.duration_since(conn.last_progress);
                if quiet >= self.shared.timeouts.stall {
                    let why = format!("no progress for {quiet:?}");
                    self.stalled(registry, now, why);
                } else if let Some(slow) = self.too_slow(now, held_up) {
                    let t = &self.shared.target;
                    crate::log_limit::warn_limited!(
                        "tcp: reset the connection to {}:{} with {} request(s) in flight: {slow}",
                        t.host,
                        t.port,
                        self.pipeline.len()
                    );
                    let why = "its peer was slower than MC_TCP_MIN_RATE_BYTES_PER_SEC";
                    self.stalled(registry, now, why.into());
                }
            }
            ConnState::Ready => {
                if now.duration_since(self.last_used) >= self.shared.timeouts.idle {
                    debug!("tcp: closing an idle lane to {}", self.shared.target.host);
                    self.disconnect(registry, false);
                }
            }
        }
    }

    /// Gives up on the connection, whose peer did not keep up, for `why`:
    /// its requests fail, and the endpoint cools down.
    fn stalled(&mut self, registry: &Registry, now: Instant, why: String) {
        let t = &self.shared.target;
        let cause = format!("tcp: {}:{}: {why}", t.host, t.port);
        self.shared.health.stalled(now, cause);
        self.fail(registry, Failure::Broken(why));
    }

    /// Judges a ready connection with requests in flight against the
    /// minimum rate.
    fn too_slow(&mut self, now: Instant, held_up: bool) -> Option<Slow> {
        let rule = self.shared.timeouts.min_rate;
        let conn = self.conn.as_mut()?;
        if rule.off() {
            return None;
        }
        let seen = Seen {
            taken: conn.traffic.taken(conn.stream.as_raw_fd()),
            requests: Some(Requests {
                finished: conn.finished,
                due: conn.finished + self.pipeline.len() as u64,
            }),
            in_progress: !self.pipeline.is_empty(),
            broke: std::mem::take(&mut conn.broke),
            held_up,
        };
        conn.progress.sweep(now, seen, rule).err()
    }

    /// Fails everything (shutdown).
    pub fn stop(&mut self, registry: &Registry) {
        self.disconnect(registry, true);
        for r in std::mem::take(&mut self.pipeline) {
            self.end(r, Outcome::Failed { hard: true });
        }
        self.send_at = 0;
        self.recv_at = 0;
    }

    /// Ends a request's slice with `outcome`, unless it ended already (a
    /// discarded READ).
    fn end(&self, r: Req, outcome: Outcome) {
        if !r.discard {
            self.shared.finish(r.slice, outcome);
        }
    }

    /// Once a task was cancelled since the last look: its requests not
    /// sent at all leave the pipeline, withdrawn; its READs sent whose
    /// answers are still coming end now, their payload dropped as it
    /// arrives. A WRITE that is partly sent, or sent and not yet
    /// acknowledged, is waited for: the peer stores what it receives.
    fn withdraw_canceled(&mut self) {
        let now = batch::cancels();
        if now == self.cancels_seen {
            return;
        }
        self.cancels_seen = now;
        let unsent =
            self.send_at + usize::from(self.pipeline.get(self.send_at).is_some_and(|r| r.sent > 0));
        let rest = self.pipeline.split_off(unsent.min(self.pipeline.len()));
        for r in rest {
            if r.slice.canceled() {
                self.shared.finish(r.slice, Outcome::Canceled);
            } else {
                self.pipeline.push_back(r);
            }
        }
        for r in self.pipeline.iter_mut().take(self.send_at) {
            if r.discard || r.slice.write || r.done() || !r.slice.canceled() {
                continue;
            }
            r.discard = true;
            r.slice.local_fence = None;
            self.shared.load.fetch_sub(r.slice.len, Ordering::Relaxed);
            let done = std::mem::replace(&mut r.slice.done, Box::new(|_| {}));
            done(Outcome::Canceled);
        }
    }

    fn disconnect(&mut self, registry: &Registry, reset: bool) {
        if let Some(mut c) = self.conn.take() {
            if reset {
                abort(&c.stream);
            }
            let _ = registry.deregister(&mut c.stream);
        }
    }

    /// Connects if needed, then moves bytes until the socket would block.
    fn pump(&mut self, registry: &Registry) {
        self.withdraw_canceled();
        if self.pipeline.is_empty() {
            return;
        }
        match self.conn.as_ref().map(|c| &c.state) {
            None => self.connect(registry),
            Some(ConnState::Connecting { .. }) => self.check_connect(registry),
            Some(ConnState::Authenticating { .. }) => self.authenticate(registry),
            Some(ConnState::Ready) => self.exchange(registry),
        }
    }

    fn connect(&mut self, registry: &Registry) {
        if self.shared.health.cooling(Instant::now()) {
            self.fail_unsent_hard();
            return;
        }
        self.connect_at(registry, 0);
    }

    /// Starts connecting to the `at`-th address, or fails the lane's work
    /// when none is left.
    fn connect_at(&mut self, registry: &Registry, at: usize) {
        let mut last = String::from("no address");
        for (i, &addr) in self.shared.addrs.iter().enumerate().skip(at) {
            match start_connect(self.shared.target.bind, addr) {
                Ok(mut stream) => {
                    if let Err(e) = registry.register(
                        &mut stream,
                        self.shared.token,
                        Interest::READABLE | Interest::WRITABLE,
                    ) {
                        last = e.to_string();
                        continue;
                    }
                    let now = Instant::now();
                    let state = ConnState::Connecting {
                        at: i,
                        deadline: now + self.shared.timeouts.connect,
                    };
                    self.conn = Some(Conn::new(stream, state, now));
                    return;
                }
                Err(e) => last = e.to_string(),
            }
        }
        self.connect_failed(&last);
    }

    fn check_connect(&mut self, registry: &Registry) {
        let Some(conn) = &self.conn else { return };
        match connect_finished(&conn.stream) {
            Ok(false) => {}
            Ok(true) => {
                if let Err(e) = tune(&conn.stream) {
                    debug!("tcp: socket options: {e}");
                }
                debug!(
                    "tcp: lane connected to {}:{}",
                    self.shared.target.host, self.shared.target.port
                );
                let Some(keys) = self.shared.auth.clone() else {
                    return self.ready(registry);
                };
                match ClientAuth::start(keys, Port::Data, &self.shared.target.name) {
                    Ok((side, hello)) => {
                        if let Some(c) = self.conn.as_mut() {
                            c.state = ConnState::Authenticating {
                                gate: Box::new(Gate::new(side, hello)),
                                deadline: Instant::now() + self.shared.timeouts.connect,
                            };
                        }
                        self.authenticate(registry);
                    }
                    Err(e) => self.auth_failed(registry, &e.to_string()),
                }
            }
            Err(e) => self.connect_next(registry, &e.to_string()),
        }
    }

    /// The connection is ready for requests.
    fn ready(&mut self, registry: &Registry) {
        self.shared.health.succeeded();
        if let Some(c) = self.conn.as_mut() {
            c.state = ConnState::Ready;
            c.last_progress = Instant::now();
        }
        self.exchange(registry);
    }

    /// Moves the authentication of the connection on.
    fn authenticate(&mut self, registry: &Registry) {
        let Some(c) = self.conn.as_mut() else { return };
        let ConnState::Authenticating { gate, .. } = &mut c.state else {
            return;
        };
        match gate.drive(&mut c.stream) {
            Ok(Standing::Pending) => {}
            Ok(Standing::Done) => self.ready(registry),
            Ok(Standing::Failed(e)) => self.auth_failed(registry, &e.to_string()),
            Ok(Standing::Refused(_)) => self.auth_failed(registry, "refused"),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => self.auth_failed(
                registry,
                "the peer closed the connection during authentication (a peer without the \
                 cluster key, or one that refused us)",
            ),
            Err(e) => self.auth_failed(registry, &e.to_string()),
        }
    }

    /// The peer did not authenticate: its connection is reset and the
    /// lane's requests fail (none reached the peer); the endpoint cools
    /// down as after a failed connect.
    fn auth_failed(&mut self, registry: &Registry, why: &str) {
        static LOG: LogLimit = LogLimit::new();
        self.disconnect(registry, true);
        let t = &self.shared.target;
        let why = format!(
            "tcp: authentication with {} ({}:{}) failed: {why}",
            t.name, t.host, t.port
        );
        self.endpoint_failed(why, &LOG);
    }

    /// The connect in progress failed: try the next address.
    fn connect_next(&mut self, registry: &Registry, why: &str) {
        let at = match self.conn.as_ref().map(|c| &c.state) {
            Some(ConnState::Connecting { at, .. }) => *at + 1,
            _ => 0,
        };
        self.disconnect(registry, false);
        if at < self.shared.addrs.len() {
            self.connect_at(registry, at);
        } else {
            self.connect_failed(why);
        }
    }

    fn connect_failed(&mut self, why: &str) {
        static LOG: LogLimit = LogLimit::new();
        let t = &self.shared.target;
        let why = format!(
            "tcp: connect to {}:{} (from {:?}) failed: {why}",
            t.host, t.port, t.bind
        );
        self.endpoint_failed(why, &LOG);
    }

    /// The endpoint cannot be reached, for `why` (logged, at most once per
    /// interval of `log`, one per cause): it cools down and the lane's
    /// requests fail.
    fn endpoint_failed(&mut self, why: String, log: &LogLimit) {
        if let Some(suppressed) = log.admit() {
            warn!("{why}; failing its requests{}", Suppressed(suppressed));
        }
        self.shared.health.failed(Instant::now(), why);
        self.fail_unsent_hard();
    }

    /// Fails the requests of a lane that cannot connect: none of them
    /// reached the wire on this connection.
    fn fail_unsent_hard(&mut self) {
        for r in std::mem::take(&mut self.pipeline) {
            self.end(r, Outcome::Failed { hard: true });
        }
        self.send_at = 0;
        self.recv_at = 0;
    }

    /// Sends and receives until the socket would block both ways.
    fn exchange(&mut self, registry: &Registry) {
        let mut progress = false;
        loop {
            let sent = match self.send() {
                Ok(n) => n,
                Err(f) => return self.fail(registry, f),
            };
            let received = match self.receive() {
                Ok(n) => n,
                Err(f) => return self.fail(registry, f),
            };
            self.complete();
            if sent == 0 && received == 0 {
                break;
            }
            progress = true;
        }
        if progress {
            let now = Instant::now();
            self.last_used = now;
            if let Some(c) = self.conn.as_mut() {
                c.last_progress = now;
            }
        }
    }

    /// Sends what the socket takes of the unsent requests; returns bytes.
    /// Each WRITE payload goes out inside its local buffer's fence: one
    /// whose buffer was unregistered fails (as does one whose memory the
    /// kernel refuses, EFAULT, found by sending the first request alone).
    fn send(&mut self) -> Result<usize, Failure> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(0);
        };
        let mut most = MAX_BATCH_SLICES;
        let n = loop {
            let mut iov = Vec::new();
            let mut inside = Vec::new();
            let mut bytes = 0u64;
            let mut requests = 0;
            for (i, r) in self
                .pipeline
                .iter()
                .enumerate()
                .skip(self.send_at)
                .take(most)
            {
                if bytes >= MAX_BATCH_BYTES {
                    break;
                }
                if r.slice.write {
                    match r.slice.local_fence.as_ref().map(|f| f.enter()) {
                        Some(Some(g)) => inside.push(g),
                        Some(None) if i == self.send_at => {
                            return Err(Failure::Local(i, UNREGISTERED.into()));
                        }
                        // Sent once the requests before it are.
                        Some(None) => break,
                        None => {}
                    }
                }
                let h = HEADER_LEN as u64;
                if r.sent < h {
                    iov.push(iovec(
                        r.header[r.sent as usize..].as_ptr(),
                        (h - r.sent) as usize,
                    ));
                }
                if r.slice.write {
                    let off = r.sent.saturating_sub(h);
                    iov.push(iovec(
                        (r.slice.local + off) as usize as *const u8,
                        (r.slice.len - off) as usize,
                    ));
                    bytes += r.slice.len - off;
                }
                requests += 1;
            }
            if iov.is_empty() {
                return Ok(0);
            }
            match send_some(conn.stream.as_raw_fd(), &iov) {
                Ok(n) => break n,
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) && requests > 1 => most = 1,
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                    return Err(Failure::Local(self.send_at, format!("sendmsg: {e}")));
                }
                Err(e) => return Err(Failure::Closed(e.to_string())),
            }
        };
        conn.traffic.add_sent(n);
        let mut left = n as u64;
        while left > 0 {
            let r = &mut self.pipeline[self.send_at];
            let take = (r.wire_len() - r.sent).min(left);
            r.sent += take;
            left -= take;
            if r.sent_all() {
                self.send_at += 1;
            }
        }
        Ok(n)
    }

    /// Receives answers in request order; returns bytes received.
    fn receive(&mut self) -> Result<usize, Failure> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(0);
        };
        let fd = conn.stream.as_raw_fd();
        let mut total = 0;
        loop {
            while self.recv_at < self.send_at
                && (!self.pipeline[self.recv_at].answered_by_peer()
                    || self.pipeline[self.recv_at].done())
            {
                self.recv_at += 1;
            }
            let Some(r) = self.pipeline.get_mut(self.recv_at) else {
                // Nothing expects an answer: any byte now is an error,
                // end of stream an idle close by the peer.
                return match conn.fill() {
                    Ok(Recv::WouldBlock) => Ok(total),
                    Ok(Recv::Eof) => Err(Failure::Closed("peer closed the connection".into())),
                    Ok(Recv::Bytes(_)) => {
                        Err(Failure::Broken("peer sent bytes nobody asked for".into()))
                    }
                    Err(e) => Err(Failure::Closed(e.to_string())),
                };
            };
            if (r.sent as usize) < HEADER_LEN {
                return Ok(total);
            }
            if r.v2 && !r.status_ok {
                if conn.rbuf.len() < 8 {
                    match conn.fill() {
                        Ok(Recv::Bytes(n)) => {
                            total += n;
                            continue;
                        }
                        Ok(Recv::WouldBlock) => return Ok(total),
                        Ok(Recv::Eof) => {
                            return Err(Failure::Closed("peer closed the connection".into()));
                        }
                        Err(e) => return Err(Failure::Closed(e.to_string())),
                    }
                }
                let mut w = [0u8; 8];
                w.copy_from_slice(&conn.rbuf.bytes()[..8]);
                conn.rbuf.consume(8);
                let word = u64::from_le_bytes(w);
                if !status_valid(word) {
                    return Err(Failure::Broken(format!(
                        "malformed status word {word:#018x} (a v1 peer?)"
                    )));
                }
                if word != STATUS_OK {
                    return Err(Failure::Rejected(self.recv_at));
                }
                if !r.sent_all() {
                    // A server stores a WRITE's payload before it answers.
                    return Err(Failure::Broken(
                        "status word for a WRITE whose payload was not all sent".into(),
                    ));
                }
                r.status_ok = true;
                continue;
            }
            if r.slice.write {
                // Only a v1 WRITE still being sent gets here (the others
                // are done, and skipped above): it has no answer, and the
                // answers behind it come after it is sent.
                return Ok(total);
            }
            let want = (r.slice.len - r.got) as usize;
            let dst = (r.slice.local + r.got) as usize as *mut u8;
            // The payload lands inside its local buffer's fence.
            let inside = match r.slice.local_fence.as_ref().map(|f| f.enter()) {
                Some(None) => return Err(Failure::Local(self.recv_at, UNREGISTERED.into())),
                inside => inside.flatten(),
            };
            let n = if r.discard && !conn.rbuf.is_empty() {
                // A cancelled READ's bytes go nowhere.
                let n = want.min(conn.rbuf.len());
                conn.rbuf.consume(n);
                n
            } else if !conn.rbuf.is_empty() {
                // SAFETY: the caller's READ destination is valid for `len`
                // bytes until its task is terminal, which this lane decides.
                unsafe { conn.rbuf.take_into(dst, want) }
            } else if !r.discard && r.slice.len >= DIRECT_RECV_MIN as u64 {
                // What the buffer does not hold of a large payload comes
                // straight into its destination, to its end, and the next
                // answer's status word behind it in the same receive.
                let tail = if r.v2 { 8 } else { 0 };
                // SAFETY: as above.
                match unsafe { conn.rbuf.recv_behind(fd, dst, want, tail) } {
                    Ok((Recv::Bytes(n), to_dst)) => {
                        conn.traffic.add_received(n);
                        to_dst
                    }
                    Ok((Recv::WouldBlock, _)) => return Ok(total),
                    Ok((Recv::Eof, _)) => {
                        return Err(Failure::Closed("peer closed the connection".into()));
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                        return Err(Failure::Local(self.recv_at, format!("recvmsg: {e}")));
                    }
                    Err(e) => return Err(Failure::Closed(e.to_string())),
                }
            } else {
                match conn.fill() {
                    Ok(Recv::Bytes(_)) => 0,
                    Ok(Recv::WouldBlock) => return Ok(total),
                    Ok(Recv::Eof) => {
                        return Err(Failure::Closed("peer closed the connection".into()));
                    }
                    Err(e) => return Err(Failure::Closed(e.to_string())),
                }
            };
            drop(inside);
            r.got += n as u64;
            total += n;
        }
    }

    /// Finishes the requests at the front that are done.
    fn complete(&mut self) {
        while self.pipeline.front().is_some_and(Req::done) {
            if let Some(r) = self.pipeline.pop_front() {
                self.send_at -= 1;
                self.recv_at = self.recv_at.saturating_sub(1);
                if let Some(c) = self.conn.as_mut() {
                    c.finished += 1;
                    c.broke |= self.pipeline.is_empty();
                }
                self.end(r, Outcome::Done);
            }
        }
    }

    /// Ends the connection after a failure: the connection is reset; the
    /// rejected request is reported rejected, the one that cannot use its
    /// local memory fails as such; requests the peer did not get to
    /// (behind a rejection, or cut off by the close before any answer,
    /// once) go out again on a fresh connection, a few times within the
    /// stall timeout at most ([`Req::requeue`]); the others fail, so the
    /// scheduler can move them to another rail at once.
    fn fail(&mut self, registry: &Registry, failure: Failure) {
        self.disconnect(registry, true);
        let t = &self.shared.target;
        let within = self.shared.timeouts.stall;
        let mut again = VecDeque::new();
        for (i, mut r) in std::mem::take(&mut self.pipeline).into_iter().enumerate() {
            if r.discard {
                // Its slice ended when its task was cancelled.
                continue;
            }
            let cut_off = matches!(&failure, Failure::Closed(_) | Failure::Local(..));
            let outcome = match &failure {
                _ if r.done() => Some(Outcome::Done),
                Failure::Rejected(at) if i == *at => Some(Outcome::Rejected),
                Failure::Local(at, _) if i == *at => Some(Outcome::Local),
                Failure::Rejected(at) if i > *at && r.requeue(within) => None,
                _ if cut_off && r.sent == 0 && r.requeue(within) => None,
                _ if cut_off && !r.resent && !r.any_answer() => {
                    r.resent = true;
                    None
                }
                _ => Some(Outcome::Failed { hard: false }),
            };
            match outcome {
                Some(o) => {
                    let why = match (o, &failure) {
                        (Outcome::Local, Failure::Local(_, w))
                        | (Outcome::Failed { .. }, Failure::Closed(w) | Failure::Broken(w)) => {
                            Some(w.as_str())
                        }
                        (Outcome::Failed { .. }, Failure::Rejected(_)) => {
                            Some("an earlier request was rejected")
                        }
                        (Outcome::Failed { .. }, Failure::Local(..)) => {
                            Some("an earlier request's local memory failed")
                        }
                        _ => None,
                    };
                    if let Some(why) = why {
                        crate::log_limit::warn_limited!(
                            "tcp: {} of {} bytes at {:#x} (local {:#x}) to {}:{} failed: {why}",
                            if r.slice.write { "WRITE" } else { "READ" },
                            r.slice.len,
                            r.slice.remote,
                            r.slice.local,
                            t.host,
                            t.port,
                        );
                    }
                    self.shared.finish(r.slice, o);
                }
                None => {
                    r.sent = 0;
                    r.status_ok = false;
                    r.got = 0;
                    again.push_back(r);
                }
            }
        }
        self.pipeline = again;
        self.send_at = 0;
        self.recv_at = 0;
        self.pump(registry);
    }
}
