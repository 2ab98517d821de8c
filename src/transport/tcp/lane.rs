//! Client lanes: persistent connections over one rail to one peer device,
//! each with a sender thread that connects (never the submitting thread,
//! bound to the rail's local address), pipelines requests and streams WRITE
//! payloads straight from the caller's memory, and a receiver thread that
//! reads acknowledgements and READ payloads straight into the caller's
//! memory, in request order.
//!
//! A slice is finished exactly once, by whichever of the two threads is
//! last done with its memory, so a failed slice never leaves a thread still
//! reading the caller's buffer.

use super::wire::{
    HEADER_LEN, Header, OP_READ, OP_WRITE, Patience, RecvBuf, STATUS_OK, V2_FLAG, iovec, send_iov,
    status_valid,
};
use crate::transport::{Outcome, Slice};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use socket2::{Domain, Socket, Type};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// How long blocked calls sleep before re-checking for shutdown.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// After a failed connect, slices fail at once for this long.
const RECONNECT_COOLDOWN: Duration = Duration::from_secs(1);
/// Most slices and bytes written with one `sendmsg`.
const MAX_BATCH_SLICES: usize = 64;
const MAX_BATCH_BYTES: u64 = 4 << 20;

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
}

/// Timeouts of a lane.
#[derive(Debug, Clone, Copy)]
pub struct LaneTimeouts {
    /// Connect timeout.
    pub connect: Duration,
    /// Longest time a request may make no progress.
    pub stall: Duration,
}

/// Load of a lane: bytes queued or in flight.
#[derive(Default)]
pub struct LaneLoad {
    bytes: AtomicU64,
}

impl LaneLoad {
    /// Bytes queued or in flight.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// A slice on the wire, held by the sender and (when answered) the
/// receiver; the last to let go reports the worst outcome either saw.
struct InFlight {
    slice: Mutex<Option<Slice>>,
    len: u64,
    write: bool,
    local: u64,
    remote: u64,
    v2: bool,
    holds: AtomicU8,
    worst: AtomicU8,
    load: Arc<LaneLoad>,
}

const DONE: u8 = 0;
const FAILED: u8 = 1;
const REJECTED: u8 = 2;

impl InFlight {
    fn release(&self, outcome: u8) {
        self.worst.fetch_max(outcome, Ordering::AcqRel);
        if self.holds.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.load.bytes.fetch_sub(self.len, Ordering::Relaxed);
            let taken = self.slice.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(s) = taken {
                s.finish(match self.worst.load(Ordering::Acquire) {
                    DONE => Outcome::Done,
                    REJECTED => Outcome::Rejected,
                    _ => Outcome::Failed { hard: false },
                });
            }
        }
    }
}

/// One connection and its receiver thread.
struct Conn {
    stream: TcpStream,
    dead: Arc<AtomicBool>,
    to_receiver: Option<Sender<Arc<InFlight>>>,
    receiver: Option<JoinHandle<()>>,
}

impl Conn {
    fn close(mut self) {
        self.dead.store(true, Ordering::Release);
        let _ = self.stream.shutdown(Shutdown::Both);
        self.to_receiver.take();
        if let Some(t) = self.receiver.take() {
            let _ = t.join();
        }
    }
}

/// A lane: a queue of slices and the thread that serves it.
pub struct Lane {
    tx: Mutex<Option<Sender<Slice>>>,
    load: Arc<LaneLoad>,
    stop: Arc<AtomicBool>,
    stream: Arc<Mutex<Option<TcpStream>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Lane {
    /// Starts a lane to `peer`; it connects when its first slice arrives.
    /// A failed connect sets `failed`.
    pub fn start(
        peer: LaneTarget,
        timeouts: LaneTimeouts,
        name: String,
        failed: Arc<AtomicBool>,
    ) -> std::io::Result<Lane> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let load = Arc::new(LaneLoad::default());
        let stop = Arc::new(AtomicBool::new(false));
        let stream = Arc::new(Mutex::new(None));
        let worker = Worker {
            peer,
            timeouts,
            rx,
            load: load.clone(),
            stop: stop.clone(),
            stream: stream.clone(),
            failed,
        };
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || worker.run())?;
        Ok(Lane {
            tx: Mutex::new(Some(tx)),
            load,
            stop,
            stream,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Bytes queued or in flight on this lane.
    pub fn load(&self) -> u64 {
        self.load.bytes()
    }

    /// Queues a slice; fails it at once if the lane has stopped.
    pub fn send(&self, slice: Slice) {
        self.load.bytes.fetch_add(slice.len, Ordering::Relaxed);
        let refused = {
            let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            match tx.as_ref() {
                Some(tx) => tx.send(slice).err().map(|e| e.into_inner()),
                None => Some(slice),
            }
        };
        // Reported outside the lock: the outcome may send the slice again.
        if let Some(s) = refused {
            self.load.bytes.fetch_sub(s.len, Ordering::Relaxed);
            s.finish(Outcome::Failed { hard: true });
        }
    }

    /// Fails queued work, closes the connection and joins the threads.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(s) = self
            .stream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

struct Worker {
    peer: LaneTarget,
    timeouts: LaneTimeouts,
    rx: Receiver<Slice>,
    load: Arc<LaneLoad>,
    stop: Arc<AtomicBool>,
    stream: Arc<Mutex<Option<TcpStream>>>,
    failed: Arc<AtomicBool>,
}

impl Worker {
    fn fail(&self, s: Slice, hard: bool) {
        self.load.bytes.fetch_sub(s.len, Ordering::Relaxed);
        s.finish(Outcome::Failed { hard });
    }

    fn run(self) {
        let mut conn: Option<Conn> = None;
        let mut cooldown_until: Option<Instant> = None;
        loop {
            let first = match self.rx.recv_timeout(POLL_INTERVAL) {
                Ok(s) => s,
                Err(RecvTimeoutError::Timeout) => {
                    if self.stop.load(Ordering::Acquire) {
                        break;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            if self.stop.load(Ordering::Acquire) {
                self.fail(first, true);
                break;
            }
            if conn
                .as_ref()
                .is_some_and(|c| c.dead.load(Ordering::Acquire))
            {
                if let Some(c) = conn.take() {
                    c.close();
                }
            }
            if conn.is_none() {
                if cooldown_until.is_some_and(|t| Instant::now() < t) {
                    self.fail(first, true);
                    continue;
                }
                match self.connect() {
                    Ok(c) => {
                        cooldown_until = None;
                        conn = Some(c);
                    }
                    Err(e) => {
                        warn!(
                            "tcp: connect to {}:{} (from {:?}) failed: {e}; failing queued requests",
                            self.peer.host, self.peer.port, self.peer.bind
                        );
                        self.failed.store(true, Ordering::Release);
                        cooldown_until = Some(Instant::now() + RECONNECT_COOLDOWN);
                        self.fail(first, true);
                        while let Ok(s) = self.rx.try_recv() {
                            self.fail(s, true);
                        }
                        continue;
                    }
                }
            }
            let Some(c) = conn.as_ref() else { continue };
            let mut batch = vec![first];
            let mut bytes = batch[0].len;
            while batch.len() < MAX_BATCH_SLICES && bytes < MAX_BATCH_BYTES {
                match self.rx.try_recv() {
                    Ok(s) => {
                        bytes += s.len;
                        batch.push(s);
                    }
                    Err(_) => break,
                }
            }
            self.send_batch(c, batch);
        }
        // Shutdown: fail what is still queued, then close.
        while let Ok(s) = self.rx.try_recv() {
            self.fail(s, true);
        }
        if let Some(c) = conn.take() {
            c.close();
        }
    }

    fn connect(&self) -> std::io::Result<Conn> {
        let stream = connect_target(&self.peer, self.timeouts.connect)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(POLL_INTERVAL))?;
        stream.set_write_timeout(Some(POLL_INTERVAL))?;
        debug!(
            "tcp: lane connected to {}:{}",
            self.peer.host, self.peer.port
        );
        let dead = Arc::new(AtomicBool::new(false));
        let (tx, rx) = crossbeam_channel::unbounded();
        let receiver = Receiving {
            stream: stream.try_clone()?,
            dead: dead.clone(),
            rx,
            stall: self.timeouts.stall,
        };
        let thread = std::thread::Builder::new()
            .name("te-tcp-recv".into())
            .spawn(move || receiver.run())?;
        *self.stream.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream.try_clone()?);
        if self.stop.load(Ordering::Acquire) {
            let _ = stream.shutdown(Shutdown::Both);
        }
        Ok(Conn {
            stream,
            dead,
            to_receiver: Some(tx),
            receiver: Some(thread),
        })
    }

    fn send_batch(&self, c: &Conn, batch: Vec<Slice>) {
        let v2 = self.peer.v2;
        let mut headers: Vec<[u8; HEADER_LEN]> = Vec::with_capacity(batch.len());
        let mut flights: Vec<Arc<InFlight>> = Vec::with_capacity(batch.len());
        for s in batch {
            let op = if s.write { OP_WRITE } else { OP_READ };
            headers.push(
                Header {
                    size: s.len,
                    addr: s.remote,
                    opcode: op | if v2 { V2_FLAG } else { 0 },
                }
                .encode(),
            );
            // v1 WRITEs get no answer: only the sender holds them.
            let answered = v2 || !s.write;
            let f = Arc::new(InFlight {
                len: s.len,
                write: s.write,
                local: s.local,
                remote: s.remote,
                slice: Mutex::new(Some(s)),
                v2,
                holds: AtomicU8::new(if answered { 2 } else { 1 }),
                worst: AtomicU8::new(DONE),
                load: self.load.clone(),
            });
            if answered {
                let queued = c
                    .to_receiver
                    .as_ref()
                    .is_some_and(|tx| tx.send(f.clone()).is_ok());
                if !queued {
                    f.release(FAILED);
                }
            }
            flights.push(f);
        }
        let mut iov = Vec::with_capacity(flights.len() * 2);
        for (h, f) in headers.iter().zip(&flights) {
            iov.push(iovec(h.as_ptr(), HEADER_LEN));
            if f.write {
                iov.push(iovec(f.local as usize as *const u8, f.len as usize));
            }
        }
        let patience = Patience {
            stall: self.timeouts.stall,
            cancel: &c.dead,
        };
        let outcome = match send_iov(c.stream.as_raw_fd(), &mut iov, &patience) {
            Ok(()) => DONE,
            Err(e) => {
                if !self.stop.load(Ordering::Acquire) {
                    warn!(
                        "tcp: send to {}:{} failed: {e}",
                        self.peer.host, self.peer.port
                    );
                }
                c.dead.store(true, Ordering::Release);
                let _ = c.stream.shutdown(Shutdown::Both);
                FAILED
            }
        };
        for f in flights {
            f.release(outcome);
        }
    }
}

/// Connects to a rail's target: bound to its local address (if any),
/// trying each resolved address of the same family, within `timeout` each.
pub fn connect_target(target: &LaneTarget, timeout: Duration) -> std::io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = (target.host.as_str(), target.port)
        .to_socket_addrs()?
        .filter(|a| target.bind.is_none_or(|b| b.is_ipv4() == a.is_ipv4()))
        .collect();
    let mut last = std::io::Error::new(
        std::io::ErrorKind::NotFound,
        "host resolved to no address of the rail's family",
    );
    for addr in addrs {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        if let Some(ip) = target.bind {
            socket.bind(&SocketAddr::new(ip, 0).into())?;
        }
        match socket.connect_timeout(&addr.into(), timeout) {
            Ok(()) => return Ok(socket.into()),
            Err(e) => last = e,
        }
    }
    Err(last)
}

struct Receiving {
    stream: TcpStream,
    dead: Arc<AtomicBool>,
    rx: Receiver<Arc<InFlight>>,
    stall: Duration,
}

/// A failed exchange: whether the peer rejected the address range.
struct ExchangeError {
    rejected: bool,
    error: std::io::Error,
}

impl From<std::io::Error> for ExchangeError {
    fn from(error: std::io::Error) -> Self {
        ExchangeError {
            rejected: false,
            error,
        }
    }
}

impl Receiving {
    fn run(self) {
        let fd = self.stream.as_raw_fd();
        let mut rbuf = RecvBuf::new(64 * 1024);
        let patience = Patience {
            stall: self.stall,
            cancel: &self.dead,
        };
        loop {
            let f = match self.rx.recv_timeout(POLL_INTERVAL) {
                Ok(f) => f,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            if self.dead.load(Ordering::Acquire) {
                f.release(FAILED);
                continue;
            }
            match self.receive(&f, fd, &mut rbuf, &patience) {
                Ok(()) => f.release(DONE),
                Err(e) => {
                    if !self.dead.swap(true, Ordering::AcqRel) {
                        warn!(
                            "tcp: {} of {} bytes at {:#x} failed: {}",
                            if f.write { "WRITE" } else { "READ" },
                            f.len,
                            f.remote,
                            e.error
                        );
                    }
                    let _ = self.stream.shutdown(Shutdown::Both);
                    f.release(if e.rejected { REJECTED } else { FAILED });
                }
            }
        }
    }

    fn receive(
        &self,
        f: &InFlight,
        fd: i32,
        rbuf: &mut RecvBuf,
        patience: &Patience<'_>,
    ) -> Result<(), ExchangeError> {
        if f.v2 {
            let word = match rbuf.read_array::<8>(fd, patience, patience)? {
                Some(b) => u64::from_le_bytes(b),
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "peer closed the connection",
                    )
                    .into());
                }
            };
            if !status_valid(word) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("malformed status word {word:#018x} (a v1 peer?)"),
                )
                .into());
            }
            if word != STATUS_OK {
                return Err(ExchangeError {
                    rejected: true,
                    error: std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        "peer rejected the address range",
                    ),
                });
            }
        }
        if !f.write {
            // SAFETY: the caller's READ destination is valid for `len` bytes
            // until its task is terminal, which cannot happen before this
            // thread releases the slice.
            unsafe { rbuf.read_into(fd, f.local as usize as *mut u8, f.len as usize, patience)? };
        }
        Ok(())
    }
}
