//! An event-driven request/reply server over TCP, for the control plane:
//! the handshake listener ([`crate::rpc::server`]) and the HTTP metadata
//! server ([`crate::metadata::server`]) are [`Service`]s run by it.
//!
//! One poll thread (mio) accepts connections and reads the requests of all
//! of them without a thread each; a small pool of worker threads runs the
//! handlers of complete requests; the poll thread writes the replies.
//! What a slow, silent or hostile client can spend is bounded:
//!
//! * time: a request must be complete within [`Options::request_timeout`]
//!   of the accept (or of the previous reply on a kept-alive connection),
//!   whatever the client sends meanwhile; a reply must be written within
//!   [`Options::write_timeout`]; after the reply the server waits at most
//!   [`Options::linger_timeout`] for the client to close;
//! * connections: at most [`Options::max_connections`] are open. At the
//!   bound, a new connection replaces one that is waiting for its client
//!   (lingering after a reply, the oldest first, then the one that has
//!   moved no byte of its request or reply for the longest); when every open
//!   connection has a request in a handler, new ones wait in the kernel's
//!   listen backlog;
//! * memory: a request is buffered as its bytes arrive (a declared length
//!   allocates nothing), the service bounds each request, and the bytes of
//!   requests and replies held across all connections stay within
//!   [`Options::max_buffered`]. A reply counts until its last byte is
//!   taken by the client; a buffer shared by several replies
//!   ([`Reply::shared`]) counts once. A connection that needs more closes
//!   others waiting for their client (lingering after a reply first, then
//!   those stalled longest, in a request or a reply); when that is not
//!   enough, a request is closed, a reply is replaced by the service's
//!   [`Service::refusal`] (or the connection closed). Beyond the bound are
//!   only the replies the workers are building;
//! * threads: one poll thread and [`Options::workers`] workers, whatever
//!   the number of clients.
//!
//! Hitting a bound is logged at most once per interval per kind, with a
//! count ([`crate::log_limit::warn_limited!`]).

mod event_loop;
mod stream;
#[cfg(test)]
mod tests;

use crate::sync;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::Duration;
use tracing::warn;

/// A protocol served by [`Server`]: how requests are cut out of the bytes
/// a connection receives, and how they are answered.
pub(crate) trait Service: Send + Sync + 'static {
    /// One parsed request.
    type Request: Send + 'static;
    /// Per-connection parsing state, reset after each request.
    type Parser: Default + Send + 'static;
    /// The service's name in log lines.
    const NAME: &'static str;
    /// The settings that raise [`Options::max_connections`],
    /// [`Options::max_buffered`] and the timeouts, named in the log lines
    /// of bounds being hit.
    const SETTINGS: Settings;

    /// Looks at the bytes received so far. On [`Parse::Done`] the request's
    /// bytes have been removed from the front of `buf` (anything after them
    /// stays, for the next request of a kept-alive connection).
    fn parse(&self, parser: &mut Self::Parser, buf: &mut Vec<u8>) -> Parse<Self::Request>;

    /// Decides on the poll thread what a complete request needs: an answer
    /// at once (cheap requests), a worker, or closing the connection.
    fn dispatch(&self, request: Self::Request) -> Dispatch<Self::Request>;

    /// Answers a request on a worker thread; `Err` closes the connection
    /// without a reply and says why. A panic does the same.
    fn handle(&self, peer: SocketAddr, request: Self::Request) -> Result<Reply, String>;

    /// A small reply sent instead of one that does not fit in
    /// [`Options::max_buffered`] (e.g. HTTP's 503), after which the
    /// connection closes; `None` closes it at once.
    fn refusal(&self) -> Option<Reply> {
        None
    }
}

/// The names of the settings behind a service's bounds.
pub(crate) struct Settings {
    /// Of [`Options::max_connections`].
    pub connections: &'static str,
    /// Of [`Options::max_buffered`].
    pub buffered: &'static str,
    /// Of [`Options::request_timeout`] and [`Options::write_timeout`].
    pub timeout: &'static str,
}

/// What [`Service::parse`] found.
pub(crate) enum Parse<R> {
    /// The request is incomplete. `interim` is sent to the client at once
    /// (e.g. HTTP's `100 Continue`, the frames of the handshake port's
    /// authentication): a few bytes, with one write, which the socket's
    /// send buffer takes whole as nothing else is being sent then.
    More {
        /// Bytes to send now, if any.
        interim: Option<Vec<u8>>,
        /// How many bytes the buffer will hold once the request is complete,
        /// when known (a validated length): the buffer grows as bytes arrive,
        /// never beyond it.
        want: Option<usize>,
    },
    /// A complete request.
    Done(R),
    /// Not a valid request: `reply`, if any, is sent, then the connection
    /// closes.
    Invalid {
        /// Why, for the log.
        reason: String,
        /// An error reply (e.g. an HTTP 400), or none.
        reply: Option<Vec<u8>>,
    },
}

/// What to do with a complete request.
pub(crate) enum Dispatch<R> {
    /// Send this reply now.
    Reply(Reply),
    /// Run [`Service::handle`] on a worker.
    Work(R),
    /// Close the connection without a reply, for this reason.
    Close(String),
}

/// A reply and what follows it.
pub(crate) struct Reply {
    /// The bytes to send first, made for this reply.
    pub bytes: Vec<u8>,
    /// Bytes sent after `bytes` that other replies (or the service) may
    /// hold too: counted once against [`Options::max_buffered`] while any
    /// connection sends them.
    pub shared: Option<Arc<[u8]>>,
    /// What happens once they are sent.
    pub then: Then,
}

impl Reply {
    /// A reply of its own `bytes` only.
    pub(crate) fn owned(bytes: Vec<u8>, then: Then) -> Reply {
        Reply {
            bytes,
            shared: None,
            then,
        }
    }
}

/// What happens on a connection after its reply is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    /// Half-close (`shutdown(SHUT_WR)`) and wait for the client to close.
    Linger,
    /// Wait for the next request on the same connection.
    KeepAlive,
}

/// Bounds of a [`Server`].
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Connections open at once.
    pub max_connections: usize,
    /// From the accept (or the previous reply) to a complete request.
    pub request_timeout: Duration,
    /// To write one reply.
    pub write_timeout: Duration,
    /// After the reply, for the client's EOF.
    pub linger_timeout: Duration,
    /// Bytes of requests and replies held across all connections (a
    /// shared reply buffer counted once).
    pub max_buffered: usize,
    /// Threads that run [`Service::handle`].
    pub workers: usize,
    /// Prefix of the thread names (`<prefix>-poll`, `<prefix>-worker`).
    pub thread_name: &'static str,
    /// Serve TLS with these settings (the handshake is part of the
    /// request and its [`Options::request_timeout`]); `None`: plain TCP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// State shared by the server's threads and [`Server::shutdown`].
struct Shared {
    stop: AtomicBool,
    waker: mio::Waker,
    /// The poll thread and the workers.
    threads: Mutex<Vec<JoinHandle<()>>>,
    thread_ids: Mutex<Vec<ThreadId>>,
}

/// A running server: one poll thread and a pool of workers.
/// [`Server::shutdown`] (also run on drop) stops and joins them.
pub(crate) struct Server {
    shared: Arc<Shared>,
}

impl Server {
    /// Serves `service` on `listener` (already listening) until
    /// [`Server::shutdown`].
    pub(crate) fn start<S: Service>(
        listener: std::net::TcpListener,
        service: Arc<S>,
        opts: Options,
    ) -> io::Result<Server> {
        listener.set_nonblocking(true)?;
        let poll = mio::Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), event_loop::WAKER)?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            waker,
            threads: Mutex::new(Vec::new()),
            thread_ids: Mutex::new(Vec::new()),
        });
        // Declared before the channels, so that on an early return the
        // channels close first and the shutdown in its drop can join the
        // workers already started.
        let server = Server {
            shared: Arc::clone(&shared),
        };
        let (job_tx, job_rx) = crossbeam_channel::unbounded::<event_loop::Job<S::Request>>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        for _ in 0..opts.workers.max(1) {
            let (service, jobs, done, shared) = (
                Arc::clone(&service),
                job_rx.clone(),
                done_tx.clone(),
                Arc::clone(&shared),
            );
            let t = thread::Builder::new()
                .name(format!("{}-worker", opts.thread_name))
                .spawn(move || event_loop::worker(&*service, &jobs, &done, &shared))?;
            server.adopt(t);
        }
        drop((job_rx, done_tx));
        let looper =
            event_loop::EventLoop::new(poll, listener, service, opts.clone(), job_tx, done_rx)?;
        let loop_shared = Arc::clone(&shared);
        let t = thread::Builder::new()
            .name(format!("{}-poll", opts.thread_name))
            .spawn(move || looper.run(&loop_shared))?;
        server.adopt(t);
        Ok(server)
    }

    fn adopt(&self, t: JoinHandle<()>) {
        sync::lock(&self.shared.thread_ids).push(t.thread().id());
        sync::lock(&self.shared.threads).push(t);
    }

    /// Stops accepting, closes every connection (a request already in a
    /// handler gets its reply, sent without waiting), and joins the server's
    /// threads: returns as soon as running handlers return. Idempotent.
    ///
    /// Called from a handler (directly, or by dropping the last owner of the
    /// server), it does not wait: that handler's reply is still sent, and
    /// the threads end by themselves right after.
    pub(crate) fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Err(e) = self.shared.waker.wake() {
            warn!("cannot wake the server's poll thread: {e}");
        }
        let threads = std::mem::take(&mut *sync::lock(&self.shared.threads));
        let me = thread::current().id();
        if sync::lock(&self.shared.thread_ids).contains(&me) {
            // One of our own threads: joining would wait for itself.
            return;
        }
        for t in threads {
            if t.join().is_err() {
                warn!("a server thread panicked");
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}
