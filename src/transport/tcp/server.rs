//! The TCP data server's sessions: one state machine per peer connection,
//! driven by the I/O threads (see [`super::io`]) on non-blocking sockets.
//!
//! Every request is checked against the engine's registered memory
//! ([`RemoteMemory::admit`]) before a byte moves, and every system call that
//! touches a buffer's memory runs inside the buffer's [`Fence`], so a
//! buffer that is unregistered is never touched afterwards: the request in
//! progress fails and its connection is reset. A rejected request ends its
//! own connection only. Sessions idle longer than `MC_TCP_IDLE_TIMEOUT_SEC`
//! are closed, requests that make no progress for
//! `MC_TCP_STATUS_TIMEOUT_SEC` are dropped, and so are requests whose peer
//! takes fewer than `MC_TCP_MIN_RATE_BYTES_PER_SEC` (see
//! [`super::progress`]).
//!
//! A CUDA GPU buffer is staged: a WRITE's payload is received into the
//! session's host buffer and copied to the GPU with the driver, a READ's
//! data copied from the GPU into it before each send
//! ([`crate::memory::staging`]); the CPU never touches GPU memory.
//!
//! With a cluster key, a session first runs the server's side of the
//! authentication ([`crate::auth`]) and reads no request header before the
//! peer has proved it holds the key; a peer that has not within
//! `MC_HANDSHAKE_IO_TIMEOUT` of its accept is closed.

use super::bound::{self, Board};
use super::progress::{MinRate, Progress, Seen, Traffic};
use super::wire::{
    DIRECT_RECV_MIN, HEADER_LEN, Header, Recv, RecvBuf, STATUS_ADDR_REJECTED, STATUS_OK, iovec,
    send_some,
};
use crate::auth::{Gate, Listener, ServerAuth, Standing};
use crate::memory::RemoteMemory;
use crate::memory::fence::{Fence, Inside};
use crate::memory::staging::{self, HostBuffer};
use mio::net::TcpStream;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};
use tracing::debug;

/// Receive buffer of a session while it has a request in progress.
const RECV_BUF: usize = 64 * 1024;
/// Most replies or reply bytes queued before they are sent.
const MAX_REPLIES: usize = 128;
const MAX_REPLY_BYTES: usize = 4 << 20;
/// A request header must arrive whole within this long of its first byte.
const HEADER_DEADLINE: Duration = Duration::from_secs(10);
/// An idle session releases its receive buffer after this long.
const TRIM_AFTER: Duration = Duration::from_secs(1);
/// The host buffer a session stages GPU memory through, while it moves
/// some.
const STAGE_LEN: usize = 256 * 1024;
/// Bytes one session may move per turn before others get theirs.
pub const TURN_BYTES: usize = 4 << 20;

/// What the sessions of every I/O thread share.
pub struct ServerShared {
    /// The engine's registered memory.
    pub memory: Arc<dyn RemoteMemory>,
    /// Open sessions, over all I/O threads.
    pub open: AtomicUsize,
    /// Most sessions open at once.
    pub max_sessions: usize,
    /// An idle session is closed after this long.
    pub idle_timeout: Duration,
    /// A request in progress that moves no byte for this long is dropped.
    pub stall: Duration,
    /// A request in progress whose peer takes less than this is dropped.
    pub min_rate: MinRate,
    /// The session of each I/O thread that gives way first at the bound.
    pub board: Board,
    /// With a cluster key: every connection authenticates first.
    pub auth: Option<DataAuth>,
}

/// Authentication on the data port.
pub struct DataAuth {
    /// The engine's side of the exchange.
    pub listener: Arc<Listener>,
    /// A connection not authenticated this long after its accept is
    /// closed (`MC_HANDSHAKE_IO_TIMEOUT`).
    pub deadline: Duration,
}

/// How a turn of a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Waiting for the socket.
    Wait,
    /// Its share of this turn is used; more to do.
    More,
    /// Done: close gracefully.
    Close,
    /// Close with a reset (a request was cut off).
    Abort,
}

/// A WRITE whose payload is arriving.
struct Incoming {
    fence: Arc<Fence>,
    addr: u64,
    left: u64,
    /// A payload of at least [`DIRECT_RECV_MIN`]: what the buffer does not
    /// hold of it is received straight into its destination, to its end.
    large: bool,
    v2: bool,
    /// The GPU whose memory it goes to (staged).
    gpu: Option<u32>,
}

enum Reply {
    Word([u8; 8]),
    /// READ data straight from registered memory.
    Data(Arc<Fence>, u64, usize),
    /// READ data from the memory of a GPU, staged piece by piece.
    Device(Arc<Fence>, u32, u64, usize),
}

/// Replies queued on one connection, sent together.
#[derive(Default)]
struct Replies {
    items: std::collections::VecDeque<Reply>,
    /// Bytes of the first item already sent.
    sent: usize,
    bytes: usize,
}

impl Replies {
    fn word(&mut self, w: u64) {
        self.items.push_back(Reply::Word(w.to_le_bytes()));
        self.bytes += 8;
    }

    fn data(&mut self, fence: Arc<Fence>, gpu: Option<u32>, addr: u64, len: usize) {
        self.items.push_back(match gpu {
            None => Reply::Data(fence, addr, len),
            Some(gpu) => Reply::Device(fence, gpu, addr, len),
        });
        self.bytes += len;
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    fn has_data(&self) -> bool {
        self.items
            .iter()
            .any(|r| matches!(r, Reply::Data(..) | Reply::Device(..)))
    }

    fn full(&self) -> bool {
        self.items.len() >= MAX_REPLIES || self.bytes >= MAX_REPLY_BYTES
    }

    /// Sends what the socket takes; `Ok(None)` if a buffer to read from was
    /// unregistered, else the bytes sent. GPU data goes through `stage`,
    /// one piece per call.
    fn send(&mut self, fd: i32, stage: &mut Option<HostBuffer>) -> std::io::Result<Option<usize>> {
        let mut iov = Vec::with_capacity(self.items.len().min(1024));
        let mut inside: Vec<Inside<'_>> = Vec::new();
        for (i, r) in self.items.iter().enumerate().take(1024) {
            let skip = if i == 0 { self.sent } else { 0 };
            match r {
                Reply::Word(w) => iov.push(iovec(w[skip..].as_ptr(), 8 - skip)),
                Reply::Data(fence, addr, len) => {
                    let Some(guard) = fence.enter() else {
                        return Ok(None);
                    };
                    inside.push(guard);
                    iov.push(iovec((*addr as usize + skip) as *const u8, len - skip));
                }
                Reply::Device(fence, gpu, addr, len) => {
                    let Some(_inside) = fence.enter() else {
                        return Ok(None);
                    };
                    let st = stage.get_or_insert_with(|| HostBuffer::new(STAGE_LEN, *gpu));
                    let piece = (len - skip).min(st.len());
                    // SAFETY: inside the fence of the registered GPU buffer
                    // that holds [addr, addr + len), checked when the
                    // request was admitted; the stage is ours.
                    unsafe { staging::copy(st.addr(), addr + skip as u64, piece, *gpu) }
                        .map_err(|e| std::io::Error::other(format!("staging a READ: {e}")))?;
                    iov.push(iovec(st.addr() as *const u8, piece));
                    // The stage holds one piece: what follows waits for
                    // the next call.
                    break;
                }
            }
        }
        // Inside every fence: the READ data is copied to the kernel now.
        let n = send_some(fd, &iov)?;
        drop(inside);
        let mut left = n;
        while let Some(front) = self.items.front() {
            let full = match front {
                Reply::Word(_) => 8,
                Reply::Data(_, _, len) | Reply::Device(_, _, _, len) => *len,
            };
            if left < full - self.sent {
                self.sent += left;
                break;
            }
            left -= full - self.sent;
            self.sent = 0;
            self.bytes -= full;
            self.items.pop_front();
        }
        Ok(Some(n))
    }
}

/// One peer connection to the data port.
pub struct Session {
    stream: TcpStream,
    peer: SocketAddr,
    /// The authentication under way; no request is read before it is
    /// over.
    gate: Option<Box<Gate<ServerAuth>>>,
    rbuf: Option<RecvBuf>,
    /// GPU memory is staged through it (made on first need, released
    /// with the receive buffer).
    stage: Option<HostBuffer>,
    incoming: Option<Incoming>,
    replies: Replies,
    /// A request was rejected: close once the replies are out.
    closing: bool,
    /// The peer half-closed: close once the replies are out.
    eof: bool,
    /// The last time a byte moved.
    last_active: Instant,
    /// Whether a byte moved in this turn.
    moved: bool,
    /// Whether a request was completed in this turn.
    completed: bool,
    /// Since when the request in progress (a partial header or a WRITE
    /// payload) has been incomplete at the end of a turn.
    started: Option<Instant>,
    /// When the connection was accepted.
    admitted: Instant,
    /// Bytes received from the peer, and sent to it, in all.
    traffic: Traffic,
    /// Whether a turn since the last sweep ended with no request in
    /// progress.
    broke: bool,
    progress: Progress,
}

impl Session {
    /// A session on an accepted connection, that authenticates first
    /// with `auth`.
    pub fn new(stream: TcpStream, peer: SocketAddr, auth: Option<ServerAuth>) -> Session {
        let now = Instant::now();
        Session {
            stream,
            peer,
            gate: auth.map(|a| Box::new(Gate::new(a, Vec::new()))),
            rbuf: None,
            stage: None,
            incoming: None,
            replies: Replies::default(),
            closing: false,
            eof: false,
            last_active: now,
            moved: false,
            completed: false,
            started: None,
            admitted: now,
            traffic: Traffic::default(),
            broke: false,
            progress: Progress::new(now),
        }
    }

    /// The socket, for (de)registration.
    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// Whether nothing is in progress: no partial request, no reply.
    pub fn idle(&self) -> bool {
        self.gate.is_none()
            && self.incoming.is_none()
            && self.replies.is_empty()
            && self.rbuf.as_ref().is_none_or(RecvBuf::is_empty)
    }

    /// The session's standing at the connection bound, lowest gives way
    /// first (see [`super::bound`]).
    pub fn standing(&self, now: Instant) -> u64 {
        let mut rate = self.progress.rate(now);
        if now.saturating_duration_since(self.admitted) < bound::YOUNG {
            rate = rate.max(bound::YOUNG_RATE);
        }
        bound::standing(rate, now.saturating_duration_since(self.last_active))
    }

    /// Whether a request is half received: a partial header, or a WRITE
    /// whose payload is still arriving.
    fn mid_request(&self) -> bool {
        self.incoming.is_some() || self.rbuf.as_ref().is_some_and(|b| !b.is_empty())
    }

    /// Runs the session's timers at a sweep of its I/O thread; `held_up`
    /// if the thread was held up since the previous sweep. `Some` if the
    /// session must be closed now: idle too long, or a request in progress
    /// stalled or slower than the minimum rate.
    pub fn sweep(&mut self, now: Instant, shared: &ServerShared, held_up: bool) -> Option<Turn> {
        self.trim(now);
        if let Some(end) = self.expired(now, shared) {
            return Some(end);
        }
        let seen = Seen {
            taken: self.traffic.taken(self.stream.as_raw_fd()),
            requests: None,
            in_progress: !self.idle(),
            broke: std::mem::take(&mut self.broke),
            held_up,
        };
        let Err(slow) = self.progress.sweep(now, seen, shared.min_rate) else {
            return None;
        };
        crate::log_limit::warn_limited!("tcp: dropped a request from {}: {slow}", self.peer);
        Some(Turn::Abort)
    }

    /// Whether the session must be closed now: not authenticated within
    /// the deadline (with a cluster key), idle too long, or a request in
    /// progress stalled.
    fn expired(&self, now: Instant, shared: &ServerShared) -> Option<Turn> {
        if let (Some(_), Some(auth)) = (&self.gate, &shared.auth) {
            let age = now.saturating_duration_since(self.admitted);
            if age < auth.deadline {
                return None;
            }
            crate::log_limit::warn_limited!(
                "tcp: refused the data connection from {}: no authentication within {:?} \
                 (MC_HANDSHAKE_IO_TIMEOUT)",
                self.peer,
                auth.deadline
            );
            return Some(Turn::Abort);
        }
        let quiet = now.duration_since(self.last_active);
        if self.idle() {
            return (quiet >= shared.idle_timeout).then_some(Turn::Close);
        }
        // A header must arrive whole within a deadline, however it trickles.
        let header_late = self.incoming.is_none()
            && self
                .started
                .is_some_and(|t| now.duration_since(t) >= HEADER_DEADLINE);
        (quiet >= shared.stall || header_late).then(|| {
            debug!(
                "tcp: request from {} stalled (no byte for {quiet:?}{})",
                self.peer,
                if header_late {
                    ", header incomplete"
                } else {
                    ""
                }
            );
            Turn::Abort
        })
    }

    /// Serves the connection until the socket would block, the turn's
    /// byte budget is used, or the session ends.
    pub fn drive(&mut self, shared: &ServerShared) -> Turn {
        self.moved = false;
        self.completed = false;
        let turn = match self.turn(shared) {
            Ok(t) => t,
            Err(e) => {
                debug!("tcp session with {} ended: {e}", self.peer);
                Turn::Abort
            }
        };
        if self.moved {
            let now = Instant::now();
            self.last_active = now;
            if self.completed || self.started.is_none() {
                self.started = self.mid_request().then_some(now);
            }
            // A young session's standing must show what it moves before
            // the next sweep.
            if now.saturating_duration_since(self.admitted) < bound::YOUNG {
                let taken = self.traffic.taken(self.stream.as_raw_fd());
                self.progress.took(taken);
            }
        } else if !self.mid_request() {
            self.started = None;
        }
        if self.idle() {
            self.broke = true;
        }
        turn
    }

    /// Releases the receive buffer of a session idle for a while: idle
    /// sessions hold no buffer.
    fn trim(&mut self, now: Instant) {
        if self.idle() && now.duration_since(self.last_active) >= TRIM_AFTER {
            self.rbuf = None;
            self.stage = None;
        }
    }

    /// Moves the authentication on; `Some` ends the turn.
    fn authenticate(&mut self) -> std::io::Result<Option<Turn>> {
        let Some(gate) = self.gate.as_mut() else {
            return Ok(None);
        };
        match gate.drive(&mut self.stream)? {
            Standing::Pending => Ok(Some(Turn::Wait)),
            Standing::Done => {
                self.gate = None;
                self.moved = true;
                debug!("tcp: data connection from {} authenticated", self.peer);
                Ok(None)
            }
            Standing::Refused(reason) => {
                crate::log_limit::warn_limited!(
                    "tcp: refused the data connection from {}: {reason}",
                    self.peer
                );
                Ok(Some(Turn::Close))
            }
            Standing::Failed(e) => {
                crate::log_limit::warn_limited!(
                    "tcp: refused the data connection from {}: {e}",
                    self.peer
                );
                Ok(Some(Turn::Abort))
            }
        }
    }

    fn turn(&mut self, shared: &ServerShared) -> std::io::Result<Turn> {
        if let Some(t) = self.authenticate()? {
            return Ok(t);
        }
        let fd = self.stream.as_raw_fd();
        let mut budget = TURN_BYTES;
        loop {
            if budget == 0 {
                return Ok(Turn::More);
            }
            if self.incoming.is_some() {
                match self.receive_payload(fd, &mut budget)? {
                    Some(t) => return Ok(t),
                    None => continue,
                }
            }
            let rbuf = self.rbuf.get_or_insert_with(|| RecvBuf::new(RECV_BUF));
            let drained = rbuf.len() < HEADER_LEN;
            // Replies go out when the input is drained (pipelined requests
            // answered together), when many are queued, or at the end.
            let ending = self.closing || self.eof;
            if !self.replies.is_empty() && (drained || self.replies.full() || ending) {
                match self.flush(fd, &mut budget)? {
                    Some(t) => return Ok(t),
                    None => continue,
                }
            }
            if ending {
                return Ok(Turn::Close);
            }
            let rbuf = self.rbuf.get_or_insert_with(|| RecvBuf::new(RECV_BUF));
            if rbuf.len() < HEADER_LEN {
                match rbuf.fill(fd)? {
                    Recv::Bytes(n) => {
                        self.moved = true;
                        self.traffic.add_received(n);
                    }
                    Recv::WouldBlock => return Ok(Turn::Wait),
                    Recv::Eof if rbuf.is_empty() => self.eof = true,
                    Recv::Eof => return Ok(Turn::Abort),
                }
                continue;
            }
            let mut raw = [0u8; HEADER_LEN];
            raw.copy_from_slice(&rbuf.bytes()[..HEADER_LEN]);
            let h = Header::decode(&raw);
            let Some((fence, gpu)) = shared.memory.admit_staged(h.addr, h.size) else {
                crate::log_limit::warn_limited!(
                    "tcp: rejected {} of {} bytes at {:#x} from {}: not inside one remotely accessible registered buffer",
                    if h.is_write() { "WRITE" } else { "READ" },
                    h.size,
                    h.addr,
                    self.peer
                );
                rbuf.consume(HEADER_LEN);
                if h.v2() {
                    self.replies.word(STATUS_ADDR_REJECTED);
                }
                self.closing = true;
                continue;
            };
            if h.is_write() && self.replies.has_data() {
                // Queued READ replies point into memory: they go out before
                // this WRITE may change it.
                match self.flush(fd, &mut budget)? {
                    Some(t) => return Ok(t),
                    None => continue,
                }
            }
            rbuf.consume(HEADER_LEN);
            if h.is_write() {
                self.incoming = Some(Incoming {
                    fence,
                    addr: h.addr,
                    left: h.size,
                    large: h.size >= DIRECT_RECV_MIN as u64,
                    v2: h.v2(),
                    gpu,
                });
            } else {
                if h.v2() {
                    self.replies.word(STATUS_OK);
                }
                self.replies.data(fence, gpu, h.addr, h.size as usize);
                self.completed = true;
            }
        }
    }

    /// Moves WRITE payload bytes into memory. `Some` ends the turn.
    fn receive_payload(&mut self, fd: i32, budget: &mut usize) -> std::io::Result<Option<Turn>> {
        let Some(inc) = self.incoming.as_mut() else {
            return Ok(None);
        };
        let rbuf = self.rbuf.get_or_insert_with(|| RecvBuf::new(RECV_BUF));
        let mut want = (inc.left as usize).min(*budget);
        // GPU memory is received into the stage, then copied over.
        let dst = match inc.gpu {
            None => (inc.addr as usize) as *mut u8,
            Some(gpu) => {
                let st = self
                    .stage
                    .get_or_insert_with(|| HostBuffer::new(STAGE_LEN, gpu));
                want = want.min(st.len());
                st.addr() as *mut u8
            }
        };
        let moved = if !rbuf.is_empty() {
            let Some(_inside) = inc.fence.enter() else {
                return Ok(Some(self.cut_off()));
            };
            // SAFETY: inside the fence of the registered buffer that holds
            // [addr, addr + left), checked when the request was admitted.
            unsafe { rbuf.take_into(dst, want) }
        } else if inc.large {
            let Some(_inside) = inc.fence.enter() else {
                return Ok(Some(self.cut_off()));
            };
            // At the end of the payload, the next header comes in the same
            // receive, behind it: large pipelined WRITEs then take one
            // receive each, and their payloads never pass the buffer.
            let tail = if want as u64 == inc.left {
                HEADER_LEN
            } else {
                0
            };
            // SAFETY: as above; the receive does not block.
            match unsafe { rbuf.recv_behind(fd, dst, want, tail)? } {
                (Recv::Bytes(n), to_dst) => {
                    self.traffic.add_received(n);
                    to_dst
                }
                (Recv::Eof, _) => return Ok(Some(Turn::Abort)),
                (Recv::WouldBlock, _) => return Ok(Some(Turn::Wait)),
            }
        } else {
            match rbuf.fill(fd)? {
                Recv::Bytes(n) => {
                    self.traffic.add_received(n);
                    0
                }
                Recv::Eof => return Ok(Some(Turn::Abort)),
                Recv::WouldBlock => return Ok(Some(Turn::Wait)),
            }
        };
        if let (Some(gpu), Some(st), true) = (inc.gpu, &self.stage, moved > 0) {
            let Some(_inside) = inc.fence.enter() else {
                return Ok(Some(self.cut_off()));
            };
            // SAFETY: inside the fence of the registered GPU buffer that
            // holds [addr, addr + left), checked when the request was
            // admitted; the stage holds the `moved` bytes just received.
            if let Err(e) = unsafe { staging::copy(inc.addr, st.addr(), moved, gpu) } {
                crate::log_limit::warn_limited!(
                    "tcp: a WRITE from {} to GPU {gpu} failed: {e}",
                    self.peer
                );
                return Ok(Some(Turn::Abort));
            }
        }
        self.moved = true;
        *budget = budget.saturating_sub(moved.max(1));
        inc.left -= moved as u64;
        inc.addr += moved as u64;
        if inc.left == 0 {
            let v2 = inc.v2;
            self.incoming = None;
            self.completed = true;
            if v2 {
                self.replies.word(STATUS_OK);
            }
        }
        Ok(None)
    }

    /// Sends queued replies. `Some` ends the turn.
    fn flush(&mut self, fd: i32, budget: &mut usize) -> std::io::Result<Option<Turn>> {
        match self.replies.send(fd, &mut self.stage)? {
            None => Ok(Some(self.cut_off())),
            Some(0) => Ok(Some(Turn::Wait)),
            Some(n) => {
                self.moved = true;
                self.traffic.add_sent(n);
                *budget = budget.saturating_sub(n);
                Ok(None)
            }
        }
    }

    /// A buffer of the request in progress was unregistered.
    fn cut_off(&self) -> Turn {
        crate::log_limit::warn_limited!(
            "tcp: a request from {} was cut off: its buffer was unregistered",
            self.peer
        );
        Turn::Abort
    }
}
