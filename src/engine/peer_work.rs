//! Work the engine does for its callers that waits on a peer: sending the
//! notification of a completed batch, refetching a descriptor that does not
//! cover a request. It runs here, so that `getTransferStatus` and
//! `submitTransfer` never wait on a peer.
//!
//! Jobs are keyed by peer (segment name). The jobs of one peer run one at a
//! time, in the order given, so a hung peer holds at most one thread and
//! its own jobs wait behind it; other peers' jobs go on. Threads start on
//! demand, at most [`MAX_THREADS`], and end after [`IDLE_EXIT`] without
//! work. At most [`MAX_QUEUED`] jobs wait in all and [`MAX_QUEUED_PER_PEER`]
//! per peer; a job beyond is refused and its caller fails what it stood for.
//!
//! When the engine is destroyed, jobs marked [`Finish::Flush`] (the
//! notifications of completed batches) still run, for at most the time
//! given to [`PeerWork::drain`]; the others are dropped. The engine then
//! cancels its handshake calls and [`PeerWork::stop`]s, so destroying it
//! does not wait out a hung peer's timeouts.

use super::Engine;
use crate::sync;
use once_cell::sync::OnceCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{debug, warn};

/// Threads at most.
pub(crate) const MAX_THREADS: usize = 8;
/// Jobs waiting at most, over all peers.
pub(crate) const MAX_QUEUED: usize = 65536;
/// Jobs waiting at most for one peer.
pub(crate) const MAX_QUEUED_PER_PEER: usize = 4096;
/// A thread without work for this long ends.
const IDLE_EXIT: Duration = Duration::from_secs(10);

/// One piece of work, run with the engine.
pub(crate) type Job = Box<dyn FnOnce(&Engine) + Send>;

/// What becomes of a waiting job when the engine is destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// It still runs (within the drain's deadline).
    Flush,
    /// It is dropped.
    Drop,
}

/// Why a job was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The engine is shutting down.
    Stopped,
    /// [`MAX_QUEUED`] or [`MAX_QUEUED_PER_PEER`] jobs wait already.
    Full,
}

/// The engine's background work for its callers.
#[derive(Default)]
pub(crate) struct PeerWork {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    engine: OnceCell<Weak<Engine>>,
    state: Mutex<State>,
    /// Signalled when a job is ready or the work stops.
    wake: Condvar,
    /// Signalled when a [`Finish::Flush`] job ends.
    flushed: Condvar,
}

#[derive(Default)]
struct State {
    /// Waiting jobs by peer.
    queues: HashMap<String, VecDeque<(Job, Finish)>>,
    /// Peers with waiting jobs and none running, in turn order.
    ready: VecDeque<String>,
    /// Peers with a job running.
    running: HashSet<String>,
    queued: usize,
    /// [`Finish::Flush`] jobs waiting or running.
    to_flush: usize,
    threads: usize,
    idle: usize,
    /// No job is taken any more (draining or stopped).
    closed: bool,
    stopped: bool,
    handles: Vec<JoinHandle<()>>,
}

impl PeerWork {
    /// Gives the jobs their engine (once it is in its `Arc`).
    pub(crate) fn attach(&self, engine: Weak<Engine>) {
        let _ = self.shared.engine.set(engine);
    }

    /// Queues `job` for `peer`.
    pub(crate) fn submit(&self, peer: &str, job: Job, finish: Finish) -> Result<(), Refused> {
        let mut st = sync::lock(&self.shared.state);
        if st.closed {
            return Err(Refused::Stopped);
        }
        let waiting = st.queues.get(peer).map_or(0, VecDeque::len);
        if st.queued >= MAX_QUEUED || waiting >= MAX_QUEUED_PER_PEER {
            return Err(Refused::Full);
        }
        st.queues
            .entry(peer.to_string())
            .or_default()
            .push_back((job, finish));
        st.queued += 1;
        st.to_flush += usize::from(finish == Finish::Flush);
        if waiting == 0 && !st.running.contains(peer) {
            st.ready.push_back(peer.to_string());
        }
        if st.idle > 0 {
            self.shared.wake.notify_one();
        } else if st.threads < MAX_THREADS {
            self.spawn(&mut st);
        }
        Ok(())
    }

    /// Starts one more thread (the state is locked by the caller).
    fn spawn(&self, st: &mut State) {
        st.handles.retain(|h| !h.is_finished());
        let shared = self.shared.clone();
        match std::thread::Builder::new()
            .name("te-peer-work".into())
            .spawn(move || shared.run())
        {
            Ok(h) => {
                st.threads += 1;
                st.handles.push(h);
            }
            // The running threads take the job in turn.
            Err(e) => crate::warn_limited!("a background thread could not start: {e}"),
        }
    }

    /// Refuses new jobs, drops the waiting ones that need not finish, and
    /// waits until the [`Finish::Flush`] ones have run, for at most
    /// `within`.
    pub(crate) fn drain(&self, within: Duration) {
        let mut dropped = Vec::new();
        let mut st = sync::lock(&self.shared.state);
        st.closed = true;
        let mut removed = 0;
        for queue in st.queues.values_mut() {
            let (keep, drop): (VecDeque<_>, VecDeque<_>) =
                queue.drain(..).partition(|(_, f)| *f == Finish::Flush);
            removed += drop.len();
            dropped.extend(drop);
            *queue = keep;
        }
        st.queued -= removed;
        let deadline = std::time::Instant::now() + within;
        while st.to_flush > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                warn!(
                    "{} notification(s) not sent within {within:?} of the destroy",
                    st.to_flush
                );
                break;
            }
            st = self
                .shared
                .flushed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(st);
        drop(dropped);
    }

    /// Drops the waiting jobs and joins the threads (the one calling, if it
    /// is one of them, ends by itself).
    pub(crate) fn stop(&self) {
        let (jobs, handles) = {
            let mut st = sync::lock(&self.shared.state);
            st.closed = true;
            st.stopped = true;
            st.ready.clear();
            st.queued = 0;
            st.to_flush = 0;
            self.shared.wake.notify_all();
            self.shared.flushed.notify_all();
            (
                std::mem::take(&mut st.queues),
                std::mem::take(&mut st.handles),
            )
        };
        drop(jobs);
        let me = std::thread::current().id();
        for h in handles {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}

impl Shared {
    /// A worker thread: runs ready jobs until stopped or idle too long.
    fn run(&self) {
        loop {
            let (peer, job, finish) = {
                let mut st = sync::lock(&self.state);
                loop {
                    if st.stopped {
                        st.threads -= 1;
                        return;
                    }
                    if let Some(peer) = st.ready.pop_front() {
                        let job = st.queues.get_mut(&peer).and_then(VecDeque::pop_front);
                        if let Some((job, finish)) = job {
                            st.queued -= 1;
                            st.running.insert(peer.clone());
                            break (peer, job, finish);
                        }
                        continue;
                    }
                    st.idle += 1;
                    let (next, timeout) = self
                        .wake
                        .wait_timeout(st, IDLE_EXIT)
                        .unwrap_or_else(|e| e.into_inner());
                    st = next;
                    st.idle -= 1;
                    if timeout.timed_out() && st.ready.is_empty() {
                        st.threads -= 1;
                        return;
                    }
                }
            };
            let engine = self.engine.get().and_then(Weak::upgrade);
            match &engine {
                Some(engine) => job(engine),
                None => debug!("background work for {peer} dropped: the engine is gone"),
            }
            let mut st = sync::lock(&self.state);
            st.running.remove(&peer);
            if finish == Finish::Flush && !st.stopped {
                st.to_flush -= 1;
                self.flushed.notify_all();
            }
            match st.queues.get(&peer).map(VecDeque::len) {
                Some(0) => {
                    st.queues.remove(&peer);
                }
                Some(_) => {
                    st.ready.push_back(peer);
                    self.wake.notify_one();
                }
                None => {}
            }
            drop(st);
            // Last: dropping the engine may destroy it, which drains and
            // stops this work (bookkept above).
            drop(engine);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn engine() -> Arc<Engine> {
        Engine::new("P2PHANDSHAKE", "127.0.0.1:0", false).expect("engine")
    }

    #[test]
    fn a_hung_peer_holds_its_own_jobs_only() {
        let e = engine();
        let work = PeerWork::default();
        work.attach(Arc::downgrade(&e));
        let (release, hung) = mpsc::channel::<()>();
        let (done, seen) = mpsc::channel::<&'static str>();
        let d = done.clone();
        work.submit(
            "a",
            Box::new(move |_| {
                let _ = hung.recv();
                let _ = d.send("a1");
            }),
            Finish::Drop,
        )
        .unwrap();
        let d = done.clone();
        work.submit(
            "a",
            Box::new(move |_| d.send("a2").unwrap_or_default()),
            Finish::Drop,
        )
        .unwrap();
        work.submit(
            "b",
            Box::new(move |_| done.send("b").unwrap_or_default()),
            Finish::Drop,
        )
        .unwrap();
        let wait = Duration::from_secs(10);
        assert_eq!(seen.recv_timeout(wait), Ok("b"), "b waited on a");
        assert!(seen.recv_timeout(Duration::from_millis(200)).is_err());
        release.send(()).unwrap();
        assert_eq!(seen.recv_timeout(wait), Ok("a1"));
        assert_eq!(seen.recv_timeout(wait), Ok("a2"), "a's jobs in order");
        work.stop();
        assert_eq!(
            work.submit("a", Box::new(|_| {}), Finish::Drop)
                .unwrap_err(),
            Refused::Stopped
        );
    }

    #[test]
    fn a_peer_queues_a_bounded_number_of_jobs() {
        let e = engine();
        let work = PeerWork::default();
        work.attach(Arc::downgrade(&e));
        let (release, hung) = mpsc::channel::<()>();
        work.submit(
            "a",
            Box::new(move |_| hung.recv().unwrap_or_default()),
            Finish::Drop,
        )
        .unwrap();
        // The first job may still be waiting to start: it counts once.
        let mut accepted = 1;
        while work.submit("a", Box::new(|_| {}), Finish::Drop).is_ok() {
            accepted += 1;
            assert!(accepted <= MAX_QUEUED_PER_PEER + 1);
        }
        assert!(accepted >= MAX_QUEUED_PER_PEER, "{accepted}");
        assert_eq!(
            work.submit("a", Box::new(|_| {}), Finish::Drop)
                .unwrap_err(),
            Refused::Full
        );
        work.submit("b", Box::new(|_| {}), Finish::Drop)
            .expect("another peer still gets in");
        drop(release);
        work.stop();
    }
}
