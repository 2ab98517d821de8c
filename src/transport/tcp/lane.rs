//! Client lanes: persistent connections to one peer, each with a sender
//! thread that connects (never the submitting thread), pipelines requests
//! and streams WRITE payloads straight from the caller's memory, and a
//! receiver thread that reads acknowledgements and READ payloads straight
//! into the caller's memory, in request order.
//!
//! A slice is finished exactly once, by whichever of the two threads is
//! last done with its memory, so a FAILED task never leaves a thread still
//! reading the caller's buffer.

use super::wire::{
    HEADER_LEN, Header, OP_READ, OP_WRITE, Patience, RecvBuf, STATUS_OK, V2_FLAG, iovec, send_iov,
    status_valid,
};
use crate::engine::batch::Batch;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
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

/// One piece of a task, moved over one connection.
pub struct Slice {
    /// The batch that owns the task.
    pub batch: Arc<Batch>,
    /// Task id in the batch.
    pub task: usize,
    /// Local address: read from for WRITE, written for READ.
    pub local: u64,
    /// Address in the peer process.
    pub remote: u64,
    /// Bytes.
    pub len: u64,
    /// WRITE (true) or READ.
    pub write: bool,
}

impl Slice {
    /// Records the slice's outcome on its task.
    pub fn finish(&self, ok: bool) {
        if let Some(t) = self.batch.slot(self.task) {
            t.finish_slice(self.len, ok);
        }
    }
}

/// Where and how to reach a peer's data server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerAddr {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// Data port.
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

struct InFlight {
    slice: Slice,
    v2: bool,
    holds: AtomicU8,
    failed: AtomicBool,
    load: Arc<LaneLoad>,
}

impl InFlight {
    fn release(&self, ok: bool) {
        if !ok {
            self.failed.store(true, Ordering::Release);
        }
        if self.holds.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.load.bytes.fetch_sub(self.slice.len, Ordering::Relaxed);
            self.slice.finish(!self.failed.load(Ordering::Acquire));
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
    pub fn start(peer: PeerAddr, timeouts: LaneTimeouts, name: String) -> std::io::Result<Lane> {
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
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let rejected = match tx.as_ref() {
            Some(tx) => tx.send(slice).err().map(|e| e.into_inner()),
            None => Some(slice),
        };
        if let Some(s) = rejected {
            self.load.bytes.fetch_sub(s.len, Ordering::Relaxed);
            s.finish(false);
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
    peer: PeerAddr,
    timeouts: LaneTimeouts,
    rx: Receiver<Slice>,
    load: Arc<LaneLoad>,
    stop: Arc<AtomicBool>,
    stream: Arc<Mutex<Option<TcpStream>>>,
}

impl Worker {
    fn fail(&self, s: Slice) {
        self.load.bytes.fetch_sub(s.len, Ordering::Relaxed);
        s.finish(false);
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
                self.fail(first);
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
                    self.fail(first);
                    continue;
                }
                match self.connect() {
                    Ok(c) => {
                        cooldown_until = None;
                        conn = Some(c);
                    }
                    Err(e) => {
                        warn!(
                            "tcp: connect to {}:{} failed: {e}; failing queued requests",
                            self.peer.host, self.peer.port
                        );
                        cooldown_until = Some(Instant::now() + RECONNECT_COOLDOWN);
                        self.fail(first);
                        while let Ok(s) = self.rx.try_recv() {
                            self.fail(s);
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
            self.fail(s);
        }
        if let Some(c) = conn.take() {
            c.close();
        }
    }

    fn connect(&self) -> std::io::Result<Conn> {
        let addrs: Vec<SocketAddr> = (self.peer.host.as_str(), self.peer.port)
            .to_socket_addrs()?
            .collect();
        let mut last =
            std::io::Error::new(std::io::ErrorKind::NotFound, "host resolved to no address");
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, self.timeouts.connect) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    stream.set_read_timeout(Some(POLL_INTERVAL))?;
                    stream.set_write_timeout(Some(POLL_INTERVAL))?;
                    debug!("tcp: lane connected to {addr}");
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
                    *self.stream.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(stream.try_clone()?);
                    if self.stop.load(Ordering::Acquire) {
                        let _ = stream.shutdown(Shutdown::Both);
                    }
                    return Ok(Conn {
                        stream,
                        dead,
                        to_receiver: Some(tx),
                        receiver: Some(thread),
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(last)
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
                slice: s,
                v2,
                holds: AtomicU8::new(if answered { 2 } else { 1 }),
                failed: AtomicBool::new(false),
                load: self.load.clone(),
            });
            if answered {
                let queued = c
                    .to_receiver
                    .as_ref()
                    .is_some_and(|tx| tx.send(f.clone()).is_ok());
                if !queued {
                    f.release(false);
                }
            }
            flights.push(f);
        }
        let mut iov = Vec::with_capacity(flights.len() * 2);
        for (h, f) in headers.iter().zip(&flights) {
            iov.push(iovec(h.as_ptr(), HEADER_LEN));
            if f.slice.write {
                iov.push(iovec(
                    f.slice.local as usize as *const u8,
                    f.slice.len as usize,
                ));
            }
        }
        let patience = Patience {
            stall: self.timeouts.stall,
            cancel: &c.dead,
        };
        let ok = match send_iov(c.stream.as_raw_fd(), &mut iov, &patience) {
            Ok(()) => true,
            Err(e) => {
                if !self.stop.load(Ordering::Acquire) {
                    warn!(
                        "tcp: send to {}:{} failed: {e}",
                        self.peer.host, self.peer.port
                    );
                }
                c.dead.store(true, Ordering::Release);
                let _ = c.stream.shutdown(Shutdown::Both);
                false
            }
        };
        for f in flights {
            f.release(ok);
        }
    }
}

struct Receiving {
    stream: TcpStream,
    dead: Arc<AtomicBool>,
    rx: Receiver<Arc<InFlight>>,
    stall: Duration,
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
                f.release(false);
                continue;
            }
            match self.receive(&f, fd, &mut rbuf, &patience) {
                Ok(()) => f.release(true),
                Err(e) => {
                    if !self.dead.swap(true, Ordering::AcqRel) {
                        warn!(
                            "tcp: {} of {} bytes at {:#x} failed: {e}",
                            if f.slice.write { "WRITE" } else { "READ" },
                            f.slice.len,
                            f.slice.remote
                        );
                    }
                    let _ = self.stream.shutdown(Shutdown::Both);
                    f.release(false);
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
    ) -> std::io::Result<()> {
        if f.v2 {
            let word = match rbuf.read_array::<8>(fd, patience, patience)? {
                Some(b) => u64::from_le_bytes(b),
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "peer closed the connection",
                    ));
                }
            };
            if !status_valid(word) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("malformed status word {word:#018x} (a v1 peer?)"),
                ));
            }
            if word != STATUS_OK {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "peer rejected the address range",
                ));
            }
        }
        if !f.slice.write {
            // SAFETY: the caller's READ destination is valid for `len` bytes
            // until its task is terminal, which cannot happen before this
            // thread releases the slice.
            unsafe {
                rbuf.read_into(
                    fd,
                    f.slice.local as usize as *mut u8,
                    f.slice.len as usize,
                    patience,
                )?
            };
        }
        Ok(())
    }
}
