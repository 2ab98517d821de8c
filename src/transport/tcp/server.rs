//! The TCP data server: one thread per connection, each request checked
//! against the registered buffers before a byte moves. A rejected request
//! ends its own connection only.

use super::wire::{
    HEADER_LEN, Header, Patience, RecvBuf, STATUS_ADDR_REJECTED, STATUS_OK, iovec, send_iov,
};
use crate::engine::memory::MemoryRegistry;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{debug, warn};

/// Accept queue of the data listener.
const DATA_BACKLOG: libc::c_int = 4096;

/// How long a blocked socket call sleeps before re-checking for shutdown.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

struct Sessions {
    next_id: u64,
    /// Session id, a handle to shut its socket down (dropped when the
    /// session ends), and its thread (joined when reaped).
    open: Vec<(u64, Option<TcpStream>, JoinHandle<()>)>,
}

struct Shared {
    memory: Arc<RwLock<MemoryRegistry>>,
    stop: AtomicBool,
    stall: Duration,
    sessions: Mutex<Sessions>,
}

/// A running data server.
pub struct TcpServer {
    shared: Arc<Shared>,
    port: u16,
    acceptor: Mutex<Option<JoinHandle<()>>>,
}

/// Whether `[addr, addr + size)` lies in one remotely accessible buffer.
pub fn request_allowed(memory: &MemoryRegistry, addr: u64, size: u64) -> bool {
    size > 0 && memory.find(addr, size).is_some_and(|r| r.remote_accessible)
}

impl TcpServer {
    /// Serves `listener`, reading and writing the buffers in `memory`.
    /// `stall` bounds how long a request may make no progress.
    pub fn start(
        listener: TcpListener,
        memory: Arc<RwLock<MemoryRegistry>>,
        stall: Duration,
    ) -> std::io::Result<TcpServer> {
        let port = listener.local_addr()?.port();
        // Mooncake initiators open a connection per request: a deep accept
        // queue (as asio's SOMAXCONN) keeps their SYNs from being dropped.
        // SAFETY: listen(2) on our listening socket only resizes its queue.
        if unsafe { libc::listen(listener.as_raw_fd(), DATA_BACKLOG) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            memory,
            stop: AtomicBool::new(false),
            stall,
            sessions: Mutex::new(Sessions {
                next_id: 0,
                open: Vec::new(),
            }),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("te-tcp-accept".into())
            .spawn(move || accept_loop(listener, s))?;
        Ok(TcpServer {
            shared,
            port,
            acceptor: Mutex::new(Some(acceptor)),
        })
    }

    /// The listening port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops accepting, closes every connection and joins every thread.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self
            .acceptor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = t.join();
        }
        let open = std::mem::take(
            &mut self
                .shared
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .open,
        );
        for (_, stream, _) in &open {
            if let Some(stream) = stream {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        for (_, _, thread) in open {
            let _ = thread.join();
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut pfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    while !shared.stop.load(Ordering::Acquire) {
        // SAFETY: one valid pollfd for the listener's descriptor.
        let ready = unsafe { libc::poll(&mut pfd, 1, POLL_INTERVAL.as_millis() as i32) };
        if ready <= 0 {
            continue;
        }
        let stream = match listener.accept() {
            Ok((s, peer)) => {
                debug!("tcp data connection from {peer}");
                s
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                warn!("tcp accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if let Err(e) = start_session(stream, &shared) {
            warn!("tcp session could not start: {e}");
        }
    }
}

fn start_session(stream: TcpStream, shared: &Arc<Shared>) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(POLL_INTERVAL))?;
    stream.set_write_timeout(Some(POLL_INTERVAL))?;
    let handle = stream.try_clone()?;
    let mut sessions = shared.sessions.lock().unwrap_or_else(|e| e.into_inner());
    // Reap sessions that ended.
    let (done, open): (Vec<_>, Vec<_>) = std::mem::take(&mut sessions.open)
        .into_iter()
        .partition(|(_, _, t)| t.is_finished());
    sessions.open = open;
    for (_, _, t) in done {
        let _ = t.join();
    }
    let id = sessions.next_id;
    sessions.next_id += 1;
    let s = shared.clone();
    let thread = std::thread::Builder::new()
        .name("te-tcp-session".into())
        .spawn(move || {
            if let Err(e) = serve(&stream, &s) {
                debug!("tcp session ended: {e}");
            }
            // Close the handle kept for shutdown too, so the connection
            // does not stay open until the session is reaped.
            let _ = stream.shutdown(Shutdown::Both);
            let mut sessions = s.sessions.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = sessions.open.iter_mut().find(|e| e.0 == id) {
                entry.1 = None;
            }
        })?;
    sessions.open.push((id, Some(handle), thread));
    Ok(())
}

/// Serves one connection until the peer closes it, a request is rejected,
/// or the server stops.
fn serve(stream: &TcpStream, shared: &Shared) -> std::io::Result<()> {
    let fd = stream.as_raw_fd();
    let idle = Patience {
        stall: Duration::MAX,
        cancel: &shared.stop,
    };
    let busy = Patience {
        stall: shared.stall,
        cancel: &shared.stop,
    };
    let mut rbuf = RecvBuf::new(256 * 1024);
    let mut replies = Replies::default();
    loop {
        // Pipelined requests already received are answered together; the
        // replies go out before the connection waits for more.
        if (rbuf.is_empty() && !replies.is_empty()) || replies.full() {
            replies.flush(fd, &busy)?;
        }
        let Some(raw) = rbuf.read_array::<HEADER_LEN>(fd, &idle, &busy)? else {
            return Ok(());
        };
        let h = Header::decode(&raw);
        let allowed = {
            let memory = shared.memory.read().unwrap_or_else(|e| e.into_inner());
            request_allowed(&memory, h.addr, h.size)
        };
        if !allowed {
            warn!(
                "tcp: rejected {} of {} bytes at {:#x}: not inside one remotely accessible registered buffer",
                if h.is_write() { "WRITE" } else { "READ" },
                h.size,
                h.addr
            );
            if h.v2() {
                replies.word(STATUS_ADDR_REJECTED);
            }
            replies.flush(fd, &busy)?;
            let _ = stream.shutdown(Shutdown::Both);
            return Ok(());
        }
        if h.is_write() {
            // Queued READ replies point into memory: send them before this
            // WRITE may change it.
            if replies.has_data() {
                replies.flush(fd, &busy)?;
            }
            // SAFETY: the range was checked to lie inside a registered buffer
            // whose owner keeps it valid while registered.
            unsafe { rbuf.read_into(fd, h.addr as usize as *mut u8, h.size as usize, &busy)? };
            if h.v2() {
                replies.word(STATUS_OK);
            }
        } else {
            if h.v2() {
                replies.word(STATUS_OK);
            }
            replies.data(h.addr, h.size as usize);
        }
    }
}

/// Replies queued on one connection, sent with one `sendmsg`.
#[derive(Default)]
struct Replies {
    /// Status words, referenced by index from `items`.
    words: Vec<[u8; 8]>,
    items: Vec<Reply>,
    bytes: usize,
}

enum Reply {
    Word(usize),
    /// READ data straight from registered memory (checked when queued).
    Data(u64, usize),
}

/// Most replies or bytes queued before they are sent.
const MAX_REPLIES: usize = 128;
const MAX_REPLY_BYTES: usize = 4 << 20;

impl Replies {
    fn word(&mut self, w: u64) {
        self.items.push(Reply::Word(self.words.len()));
        self.words.push(w.to_le_bytes());
        self.bytes += 8;
    }

    fn data(&mut self, addr: u64, len: usize) {
        self.items.push(Reply::Data(addr, len));
        self.bytes += len;
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    fn has_data(&self) -> bool {
        self.items.iter().any(|r| matches!(r, Reply::Data(..)))
    }

    fn full(&self) -> bool {
        self.items.len() >= MAX_REPLIES || self.bytes >= MAX_REPLY_BYTES
    }

    fn flush(&mut self, fd: i32, patience: &Patience<'_>) -> std::io::Result<()> {
        let mut iov: Vec<libc::iovec> = self
            .items
            .iter()
            .map(|r| match *r {
                Reply::Word(i) => iovec(self.words[i].as_ptr(), 8),
                Reply::Data(addr, len) => iovec(addr as usize as *const u8, len),
            })
            .collect();
        let sent = send_iov(fd, &mut iov, patience);
        self.items.clear();
        self.words.clear();
        self.bytes = 0;
        sent
    }
}
