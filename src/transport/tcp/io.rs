//! The I/O threads of the TCP transport: a fixed number of threads
//! (`MC_TCP_IO_THREADS`), each with its own `mio` poll, serving the data
//! port's sessions and the client lanes on non-blocking sockets. No thread
//! is created per peer or per connection, so a process holds the same
//! number of threads whatever its peers do.
//!
//! Every thread accepts on the data port (edge-triggered; one of them wins
//! each connection). Sessions and lanes are turns-based: one moves at most
//! [`server::TURN_BYTES`] before the others get their turn, so a fast peer
//! cannot starve a slow one. Timers (connect deadlines, stalled or slow
//! requests, idle connections) are checked every [`SWEEP`]. At the session
//! bound a new connection replaces the session that gives way first among
//! all threads (see [`super::bound`]).

use super::bound::{self, NONE};
use super::lane::{Lane, LaneShared, LaneTarget, abort, start_connect, tune};
use super::server::{ServerShared, Session, Turn};
use crate::auth::ServerAuth;
use crate::sync;
use crossbeam_channel::{Receiver, Sender};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// How often timers are checked.
pub const SWEEP: Duration = Duration::from_millis(100);
/// A thread that sweeps this much later than due was held up (by its own
/// work, or the process was stopped): the time is not charged to the
/// minimum rate of its sessions and lanes.
const HELD_UP: Duration = Duration::from_secs(1);
/// Connections accepted by one thread per wake-up before others run.
const ACCEPTS_PER_TURN: usize = 64;

const WAKER: Token = Token(0);
const LISTENER: Token = Token(1);
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(2);

/// A token no other connection of this process uses.
pub fn next_token() -> Token {
    Token(NEXT_TOKEN.fetch_add(1, Ordering::Relaxed))
}

/// A rail probe: does the target accept a connection within the deadline?
pub struct Probe {
    /// Where to connect.
    pub target: LaneTarget,
    /// Its resolved addresses (the first is tried).
    pub addr: SocketAddr,
    /// When to give up.
    pub deadline: Instant,
    /// Told the answer, once.
    pub done: Box<dyn FnOnce(bool) + Send>,
}

/// Work for an I/O thread.
pub enum Cmd {
    /// The lane has new slices in its inbox (or was retired).
    Kick(Arc<LaneShared>),
    /// Test a rail.
    Probe(Probe),
    /// The session bound is reached and this thread holds the session
    /// that gives way first: close it.
    MakeRoom,
    /// Fail everything, close every connection, end the thread.
    Stop,
}

struct Handle {
    tx: Sender<Cmd>,
    waker: Waker,
}

/// How work is handed to each I/O thread.
struct Inboxes(Vec<Handle>);

impl Inboxes {
    /// Hands work to thread `i`.
    fn send(&self, i: usize, cmd: Cmd) {
        let h = &self.0[i % self.0.len()];
        if let Err(e) = h.tx.send(cmd) {
            // The thread is gone (shutdown): the transport fails what its
            // lanes still hold once the threads are joined.
            if let Cmd::Probe(p) = e.into_inner() {
                (p.done)(false);
            }
            return;
        }
        if let Err(e) = h.waker.wake() {
            warn!("tcp: waking an I/O thread failed: {e}");
        }
    }
}

/// The running I/O threads.
pub struct IoThreads {
    inboxes: Arc<Inboxes>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl IoThreads {
    /// Starts `n` threads serving `listener` and the lanes kicked to them.
    pub fn start(
        n: usize,
        listener: std::net::TcpListener,
        server: Arc<ServerShared>,
    ) -> io::Result<IoThreads> {
        listener.set_nonblocking(true)?;
        let n = n.max(1);
        let mut handles = Vec::with_capacity(n);
        let mut parts = Vec::with_capacity(n);
        for _ in 0..n {
            let poll = Poll::new()?;
            let waker = Waker::new(poll.registry(), WAKER)?;
            let mut listener = TcpListener::from_std(listener.try_clone()?);
            poll.registry()
                .register(&mut listener, LISTENER, Interest::READABLE)?;
            let (tx, rx) = crossbeam_channel::unbounded();
            handles.push(Handle { tx, waker });
            parts.push((poll, rx, listener));
        }
        let started = IoThreads {
            inboxes: Arc::new(Inboxes(handles)),
            threads: Mutex::new(Vec::with_capacity(n)),
        };
        for (index, (poll, rx, listener)) in parts.into_iter().enumerate() {
            let io = Io {
                index,
                poll,
                rx,
                listener,
                server: server.clone(),
                inboxes: started.inboxes.clone(),
                conns: HashMap::new(),
                resume: VecDeque::new(),
                accept_pending: false,
                accept_blocked: false,
            };
            let t = std::thread::Builder::new()
                .name(format!("te-tcp-io-{index}"))
                .spawn(move || io.run());
            match t {
                Ok(t) => started.lock_threads().push(t),
                Err(e) => {
                    started.stop();
                    return Err(e);
                }
            }
        }
        Ok(started)
    }

    /// The join handles of the threads started.
    fn lock_threads(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        sync::lock(&self.threads)
    }

    /// Number of threads.
    pub fn count(&self) -> usize {
        self.inboxes.0.len()
    }

    /// Hands work to thread `i`.
    pub fn send(&self, i: usize, cmd: Cmd) {
        self.inboxes.send(i, cmd);
    }

    /// Stops every thread and waits for them: afterwards no thread of the
    /// transport touches any memory.
    pub fn stop(&self) {
        for i in 0..self.count() {
            self.send(i, Cmd::Stop);
        }
        let threads = std::mem::take(&mut *self.lock_threads());
        for t in threads {
            if t.join().is_err() {
                warn!("tcp: an I/O thread panicked");
            }
        }
    }
}

enum Conn {
    Session(Box<Session>),
    Lane(Box<Lane>),
    Probe(TcpStream, Probe),
}

struct Io {
    /// This thread's place among the I/O threads.
    index: usize,
    poll: Poll,
    rx: Receiver<Cmd>,
    listener: TcpListener,
    server: Arc<ServerShared>,
    inboxes: Arc<Inboxes>,
    conns: HashMap<Token, Conn>,
    /// Connections whose turn ended with work left.
    resume: VecDeque<Token>,
    accept_pending: bool,
    /// At the session bound with none to close: connections wait in the
    /// listen backlog until a session ends or the next sweep.
    accept_blocked: bool,
}

impl Io {
    fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut last_sweep = Instant::now();
        loop {
            let accepting = self.accept_pending && !self.accept_blocked;
            let timeout = if self.resume.is_empty() && !accepting {
                SWEEP
            } else {
                Duration::ZERO
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    warn!("tcp: poll failed: {e}");
                    std::thread::sleep(SWEEP);
                }
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKER => {}
                    LISTENER => self.accept_pending = true,
                    t => self.drive(t),
                }
            }
            if self.accept_pending && !self.accept_blocked {
                self.accept();
            }
            while let Ok(cmd) = self.rx.try_recv() {
                match cmd {
                    Cmd::Kick(lane) => self.kick(lane),
                    Cmd::Probe(p) => self.probe(p),
                    Cmd::MakeRoom => self.room_asked(),
                    Cmd::Stop => return self.stop(),
                }
            }
            for t in std::mem::take(&mut self.resume) {
                self.drive(t);
            }
            let now = Instant::now();
            let since = now.duration_since(last_sweep);
            if since >= SWEEP {
                last_sweep = now;
                self.accept_blocked = false;
                self.sweep(now, since >= HELD_UP);
            }
        }
    }

    fn registry(&self) -> &Registry {
        self.poll.registry()
    }

    /// Accepts waiting connections within the session bound: at the bound
    /// each replaces the session that gives way first, which its own
    /// thread closes; meanwhile the connections wait in the listen backlog,
    /// in order, instead of being refused.
    fn accept(&mut self) {
        for _ in 0..ACCEPTS_PER_TURN {
            let shared = &self.server;
            if shared.open.load(Ordering::Acquire) >= shared.max_sessions && !self.make_room() {
                self.accept_blocked = true;
                return;
            }
            let (stream, peer) = match self.listener.accept() {
                Ok(a) => a,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.accept_pending = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // E.g. EMFILE: the connection waits in the backlog.
                    crate::log_limit::warn_limited!("tcp: accept failed: {e}");
                    self.accept_blocked = true;
                    return;
                }
            };
            self.admit(stream, peer);
        }
    }

    /// Takes an accepted connection.
    fn admit(&mut self, mut stream: TcpStream, peer: SocketAddr) {
        let auth = match &self.server.auth {
            None => None,
            Some(a) => match ServerAuth::new(a.listener.clone()) {
                Ok(side) => Some(side),
                Err(e) => {
                    crate::log_limit::warn_limited!("tcp: connection from {peer} closed: {e}");
                    return;
                }
            },
        };
        if let Err(e) = tune(&stream) {
            debug!("tcp: socket options for {peer}: {e}");
        }
        let token = next_token();
        if let Err(e) =
            self.registry()
                .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
        {
            crate::log_limit::warn_limited!("tcp: could not watch the connection from {peer}: {e}");
            return;
        }
        self.server.open.fetch_add(1, Ordering::AcqRel);
        debug!("tcp data connection from {peer}");
        self.conns.insert(
            token,
            Conn::Session(Box::new(Session::new(stream, peer, auth))),
        );
        self.drive(token);
    }

    /// Makes room for a connection at the session bound: true if this
    /// thread holds the session that gives way first and closed it; else
    /// asks the thread that holds it (which accepts once it has made room).
    /// The standings of other threads are those of their last sweep.
    fn make_room(&mut self) -> bool {
        let now = Instant::now();
        let mine = self.lowest(now);
        let theirs = self.server.board.lowest_other(self.index);
        match (mine, theirs) {
            (Some((t, s)), theirs) if theirs.is_none_or(|(_, o)| s <= o) => {
                self.give_way(t, s, now);
                true
            }
            (_, Some((i, _))) => {
                self.inboxes.send(i, Cmd::MakeRoom);
                false
            }
            // No session has reached its thread yet.
            _ => false,
        }
    }

    /// Another thread found this one holding the session that gives way
    /// first: closes it if the bound is still reached and it still stands
    /// lowest, else publishes this thread's standing as it is now.
    fn room_asked(&mut self) {
        let shared = &self.server;
        if shared.open.load(Ordering::Acquire) < shared.max_sessions {
            return;
        }
        let now = Instant::now();
        match self.lowest(now) {
            Some((t, s))
                if shared
                    .board
                    .lowest_other(self.index)
                    .is_none_or(|(_, o)| s <= o) =>
            {
                self.give_way(t, s, now)
            }
            _ => self.publish(now),
        }
    }

    /// This thread's session that gives way first, and its standing.
    fn lowest(&self, now: Instant) -> Option<(Token, u64)> {
        self.conns
            .iter()
            .filter_map(|(t, c)| match c {
                Conn::Session(s) => Some((*t, s.standing(now))),
                _ => None,
            })
            .min_by_key(|(_, s)| *s)
    }

    /// Tells the other threads this thread's lowest standing.
    fn publish(&self, now: Instant) {
        let lowest = self.lowest(now).map_or(NONE, |(_, s)| s);
        self.server.board.publish(self.index, lowest);
    }

    /// Closes session `t` (standing `s`) for a new connection: gracefully
    /// if it is idle, with a reset if a request is in progress.
    fn give_way(&mut self, t: Token, s: u64, now: Instant) {
        let Some(Conn::Session(session)) = self.conns.get(&t) else {
            return;
        };
        let how = if session.idle() {
            Turn::Close
        } else {
            Turn::Abort
        };
        crate::log_limit::warn_limited!(
            "tcp: {} data connections are open (MC_TCP_MAX_DATA_CONNECTIONS): closed the one whose peer took the fewest bytes lately ({} B/s, {}) for a new connection",
            self.server.max_sessions,
            bound::rate_of(s),
            if how == Turn::Close {
                "idle"
            } else {
                "mid-request"
            }
        );
        self.close(t, how);
        self.publish(now);
    }

    /// Serves a connection's turn.
    fn drive(&mut self, t: Token) {
        let Some(conn) = self.conns.get_mut(&t) else {
            return;
        };
        match conn {
            Conn::Session(s) => match s.drive(&self.server) {
                Turn::Wait => {}
                Turn::More => self.resume.push_back(t),
                end => self.close(t, end),
            },
            Conn::Lane(lane) => {
                lane.on_event(self.poll.registry());
                if !lane.settle(self.poll.registry()) {
                    self.conns.remove(&t);
                }
            }
            Conn::Probe(stream, _) => {
                let ok = match stream.take_error() {
                    Ok(Some(_)) | Err(_) => Some(false),
                    Ok(None) => match stream.peer_addr() {
                        Ok(_) => Some(true),
                        Err(e) if e.kind() == io::ErrorKind::NotConnected => None,
                        Err(_) => Some(false),
                    },
                };
                if let Some(ok) = ok {
                    self.end_probe(t, ok);
                }
            }
        }
    }

    fn close(&mut self, t: Token, how: Turn) {
        if let Some(Conn::Session(mut s)) = self.conns.remove(&t) {
            self.accept_blocked = false;
            if how == Turn::Abort {
                abort(s.stream());
            } else {
                let _ = s.stream().shutdown(std::net::Shutdown::Both);
            }
            let _ = self.poll.registry().deregister(s.stream());
            self.server.open.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn kick(&mut self, shared: Arc<LaneShared>) {
        let t = shared.token;
        let conn = self
            .conns
            .entry(t)
            .or_insert_with(|| Conn::Lane(Box::new(Lane::new(shared))));
        if let Conn::Lane(lane) = conn {
            let registry = self.poll.registry();
            if !lane.kick(registry) || !lane.settle(registry) {
                self.conns.remove(&t);
            }
        }
    }

    fn probe(&mut self, p: Probe) {
        let stream = start_connect(p.target.bind, p.addr);
        let mut stream = match stream {
            Ok(s) => s,
            Err(_) => return (p.done)(false),
        };
        let t = next_token();
        if self
            .poll
            .registry()
            .register(&mut stream, t, Interest::WRITABLE)
            .is_err()
        {
            return (p.done)(false);
        }
        self.conns.insert(t, Conn::Probe(stream, p));
    }

    fn end_probe(&mut self, t: Token, ok: bool) {
        if let Some(Conn::Probe(mut stream, p)) = self.conns.remove(&t) {
            let _ = self.poll.registry().deregister(&mut stream);
            (p.done)(ok);
        }
    }

    /// Runs every connection's timers; `held_up` if this thread swept
    /// much later than due.
    fn sweep(&mut self, now: Instant, held_up: bool) {
        let tokens: Vec<Token> = self.conns.keys().copied().collect();
        for t in tokens {
            let Some(conn) = self.conns.get_mut(&t) else {
                continue;
            };
            match conn {
                Conn::Session(s) => {
                    if let Some(end) = s.sweep(now, &self.server, held_up) {
                        self.close(t, end);
                    }
                }
                Conn::Lane(lane) => {
                    let registry = self.poll.registry();
                    lane.sweep(registry, now, held_up);
                    if !lane.settle(registry) {
                        self.conns.remove(&t);
                    }
                }
                Conn::Probe(_, p) => {
                    if now >= p.deadline {
                        self.end_probe(t, false);
                    }
                }
            }
        }
        self.publish(now);
    }

    fn stop(mut self) {
        for (_, conn) in self.conns.drain() {
            match conn {
                Conn::Session(mut s) => {
                    let _ = self.poll.registry().deregister(s.stream());
                    self.server.open.fetch_sub(1, Ordering::AcqRel);
                }
                Conn::Lane(mut lane) => {
                    lane.stop(self.poll.registry());
                }
                Conn::Probe(_, p) => (p.done)(false),
            }
        }
        // Commands that raced with the stop: probes answer "no"; lanes
        // are failed by the transport once every thread has ended.
        while let Ok(cmd) = self.rx.try_recv() {
            if let Cmd::Probe(p) = cmd {
                (p.done)(false);
            }
        }
    }
}
