//! Work in lanes: jobs keyed by the peer they wait on. The jobs of one lane
//! run one at a time, in the order given, so a peer that does not answer
//! holds one thread and delays only its own jobs; other lanes' jobs go on.
//! Threads start on demand, up to a bound, and end after a while without
//! work. Queued jobs are bounded in all and per lane.
//!
//! Stopping refuses new jobs; [`Lanes::drain`] first lets the jobs marked
//! [`Finish::Flush`] run (within a deadline) and refuses the others;
//! [`Lanes::stop`] refuses whatever still waits and joins the threads. A
//! refused job is still called, with [`Run::Refused`], so that it can end
//! what it stood for.

use crate::sync;
use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::warn;

/// How a job is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Run {
    /// Do the work.
    Now,
    /// The lanes are stopping: end what the job stood for without doing it.
    Refused,
}

/// One piece of work.
pub(crate) type Job = Box<dyn FnOnce(Run) + Send>;

/// What becomes of a waiting job when the lanes are drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// It still runs (within the drain's deadline).
    Flush,
    /// It is refused.
    Refuse,
}

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The lanes are stopping.
    Stopped,
    /// Too many jobs wait, in all or in this lane.
    Bound,
}

/// Bounds of a [`Lanes`].
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Threads at most.
    pub threads: usize,
    /// Jobs waiting at most, over all lanes.
    pub queued: usize,
    /// Jobs waiting at most in one lane.
    pub per_lane: usize,
    /// A thread without work for this long ends.
    pub idle_exit: Duration,
    /// Name of the threads.
    pub thread_name: &'static str,
}

/// Jobs in lanes keyed by `K`, run by a bounded set of threads.
pub(crate) struct Lanes<K: Eq + Hash + Clone + Send + 'static> {
    shared: Arc<Shared<K>>,
}

struct Shared<K> {
    limits: Limits,
    state: Mutex<State<K>>,
    /// Signalled when a job is ready or the lanes stop.
    wake: Condvar,
    /// Signalled when a [`Finish::Flush`] job ends.
    flushed: Condvar,
}

struct State<K> {
    /// Waiting jobs by lane.
    lanes: HashMap<K, VecDeque<(Job, Finish)>>,
    /// Lanes with waiting jobs and none running, in turn order.
    ready: VecDeque<K>,
    /// Lanes with a job running.
    running: HashSet<K>,
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

thread_local! {
    /// Set while this thread runs a [`Finish::Flush`] job: a drain it
    /// causes (the job dropped the last reference to the lanes' owner) does
    /// not wait for itself.
    static FLUSHING: Cell<bool> = const { Cell::new(false) };
}

impl<K: Eq + Hash + Clone + Send + 'static> Lanes<K> {
    /// Empty lanes with `limits`.
    pub(crate) fn new(limits: Limits) -> Lanes<K> {
        Lanes {
            shared: Arc::new(Shared {
                limits,
                state: Mutex::new(State {
                    lanes: HashMap::new(),
                    ready: VecDeque::new(),
                    running: HashSet::new(),
                    queued: 0,
                    to_flush: 0,
                    threads: 0,
                    idle: 0,
                    closed: false,
                    stopped: false,
                    handles: Vec::new(),
                }),
                wake: Condvar::new(),
                flushed: Condvar::new(),
            }),
        }
    }

    /// Queues `job` in lane `key`; gives it back when it cannot be queued.
    pub(crate) fn submit(&self, key: K, job: Job, finish: Finish) -> Result<(), (Job, Full)> {
        let mut st = sync::lock(&self.shared.state);
        if st.closed {
            return Err((job, Full::Stopped));
        }
        let waiting = st.lanes.get(&key).map_or(0, VecDeque::len);
        let limits = &self.shared.limits;
        if st.queued >= limits.queued || waiting >= limits.per_lane {
            return Err((job, Full::Bound));
        }
        let idle_lane = waiting == 0 && !st.running.contains(&key);
        st.lanes
            .entry(key.clone())
            .or_default()
            .push_back((job, finish));
        st.queued += 1;
        st.to_flush += usize::from(finish == Finish::Flush);
        if idle_lane {
            st.ready.push_back(key);
        }
        if st.idle > 0 {
            self.shared.wake.notify_one();
        } else if st.threads < limits.threads {
            self.spawn(&mut st);
        }
        Ok(())
    }

    /// Starts one more thread (the state is locked by the caller).
    fn spawn(&self, st: &mut State<K>) {
        st.handles.retain(|h| !h.is_finished());
        let shared = self.shared.clone();
        match std::thread::Builder::new()
            .name(self.shared.limits.thread_name.into())
            .spawn(move || shared.run())
        {
            Ok(h) => {
                st.threads += 1;
                st.handles.push(h);
            }
            // The running threads take the job in turn.
            Err(e) => crate::log_limit::warn_limited!("a background thread could not start: {e}"),
        }
    }

    /// Refuses new jobs and the waiting ones that need not finish, and
    /// waits until the [`Finish::Flush`] ones have run, for at most
    /// `within`.
    pub(crate) fn drain(&self, within: Duration) {
        let mut refused = Vec::new();
        let mut st = sync::lock(&self.shared.state);
        st.closed = true;
        for queue in st.lanes.values_mut() {
            let (keep, refuse): (VecDeque<_>, VecDeque<_>) =
                queue.drain(..).partition(|(_, f)| *f == Finish::Flush);
            refused.extend(refuse);
            *queue = keep;
        }
        st.queued -= refused.len();
        let deadline = Instant::now() + within;
        let mine = usize::from(FLUSHING.with(Cell::get));
        while st.to_flush > mine {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                warn!(
                    "{} job(s) that should finish did not within {within:?}",
                    st.to_flush - mine
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
        for (job, _) in refused {
            job(Run::Refused);
        }
    }

    /// Refuses whatever waits and joins the threads (the one calling, if
    /// it is one of them, ends by itself).
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
                std::mem::take(&mut st.lanes),
                std::mem::take(&mut st.handles),
            )
        };
        for (job, _) in jobs.into_values().flatten() {
            job(Run::Refused);
        }
        let me = std::thread::current().id();
        for h in handles {
            if h.thread().id() != me && h.join().is_err() {
                warn!("a {} thread panicked", self.shared.limits.thread_name);
            }
        }
    }
}

impl<K: Eq + Hash + Clone> Shared<K> {
    /// A worker thread: runs ready jobs until stopped or idle too long.
    fn run(&self) {
        loop {
            let (key, job, finish) = {
                let mut st = sync::lock(&self.state);
                loop {
                    if st.stopped {
                        st.threads -= 1;
                        return;
                    }
                    if let Some(key) = st.ready.pop_front() {
                        let job = st.lanes.get_mut(&key).and_then(VecDeque::pop_front);
                        if let Some((job, finish)) = job {
                            st.queued -= 1;
                            st.running.insert(key.clone());
                            break (key, job, finish);
                        }
                        continue;
                    }
                    st.idle += 1;
                    let (next, timeout) = self
                        .wake
                        .wait_timeout(st, self.limits.idle_exit)
                        .unwrap_or_else(|e| e.into_inner());
                    st = next;
                    st.idle -= 1;
                    if timeout.timed_out() && st.ready.is_empty() {
                        st.threads -= 1;
                        return;
                    }
                }
            };
            let flush = finish == Finish::Flush;
            FLUSHING.with(|f| f.set(flush));
            job(Run::Now);
            FLUSHING.with(|f| f.set(false));
            let mut st = sync::lock(&self.state);
            st.running.remove(&key);
            if flush && !st.stopped {
                st.to_flush -= 1;
                self.flushed.notify_all();
            }
            match st.lanes.get(&key).map(VecDeque::len) {
                Some(0) => {
                    st.lanes.remove(&key);
                }
                Some(_) => {
                    st.ready.push_back(key);
                    self.wake.notify_one();
                }
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn lanes(threads: usize, per_lane: usize) -> Lanes<&'static str> {
        Lanes::new(Limits {
            threads,
            queued: 1 << 16,
            per_lane,
            idle_exit: Duration::from_secs(10),
            thread_name: "te-test-lanes",
        })
    }

    fn job(f: impl FnOnce(Run) + Send + 'static) -> Job {
        Box::new(f)
    }

    #[test]
    fn a_hung_lane_holds_its_own_jobs_only() {
        let work = lanes(4, 16);
        let (release, hung) = mpsc::channel::<()>();
        let (done, seen) = mpsc::channel::<&'static str>();
        let d = done.clone();
        work.submit(
            "a",
            job(move |_| {
                let _ = hung.recv();
                let _ = d.send("a1");
            }),
            Finish::Refuse,
        )
        .map_err(|(_, why)| why)
        .unwrap();
        let d = done.clone();
        let ok = |r: Result<(), (Job, Full)>| r.map_err(|(_, why)| why).unwrap();
        ok(work.submit(
            "a",
            job(move |_| d.send("a2").unwrap_or_default()),
            Finish::Refuse,
        ));
        ok(work.submit(
            "b",
            job(move |_| done.send("b").unwrap_or_default()),
            Finish::Refuse,
        ));
        let wait = Duration::from_secs(10);
        assert_eq!(seen.recv_timeout(wait), Ok("b"), "b waited on a");
        assert!(seen.recv_timeout(Duration::from_millis(200)).is_err());
        release.send(()).unwrap();
        assert_eq!(seen.recv_timeout(wait), Ok("a1"));
        assert_eq!(seen.recv_timeout(wait), Ok("a2"), "a's jobs in order");
        work.stop();
        let refused = work.submit("a", job(|_| {}), Finish::Refuse);
        assert!(matches!(refused, Err((_, Full::Stopped))));
    }

    #[test]
    fn a_lane_queues_a_bounded_number_of_jobs() {
        let work = lanes(2, 8);
        let (release, hung) = mpsc::channel::<()>();
        let (started, running) = mpsc::channel::<()>();
        work.submit(
            "a",
            job(move |_| {
                started.send(()).unwrap_or_default();
                hung.recv().unwrap_or_default()
            }),
            Finish::Refuse,
        )
        .map_err(|(_, why)| why)
        .unwrap();
        // Once the first job runs, it holds the lane and no longer counts.
        running.recv_timeout(Duration::from_secs(10)).unwrap();
        let mut accepted = 0;
        while work.submit("a", job(|_| {}), Finish::Refuse).is_ok() {
            accepted += 1;
            assert!(accepted <= 8);
        }
        assert_eq!(accepted, 8);
        assert!(matches!(
            work.submit("a", job(|_| {}), Finish::Refuse),
            Err((_, Full::Bound))
        ));
        assert!(work.submit("b", job(|_| {}), Finish::Refuse).is_ok());
        drop(release);
        work.stop();
    }

    #[test]
    fn a_drain_runs_the_flushed_jobs_and_refuses_the_others() {
        let work = lanes(1, 16);
        let (release, hung) = mpsc::channel::<()>();
        let (done, seen) = mpsc::channel::<(&'static str, Run)>();
        let _ = work.submit(
            "a",
            job(move |_| hung.recv().unwrap_or_default()),
            Finish::Refuse,
        );
        for (name, finish) in [("flush", Finish::Flush), ("refuse", Finish::Refuse)] {
            let d = done.clone();
            let _ = work.submit(
                "a",
                job(move |run| d.send((name, run)).unwrap_or_default()),
                finish,
            );
        }
        // The first job ends only once the drain has sorted the queue (it
        // is closed then), so the other two cannot run before it.
        std::thread::scope(|scope| {
            let work = &work;
            scope.spawn(move || {
                while !sync::lock(&work.shared.state).closed {
                    std::thread::sleep(Duration::from_millis(1));
                }
                drop(release);
            });
            work.drain(Duration::from_secs(10));
        });
        let mut got: Vec<_> = seen.try_iter().collect();
        got.sort_by_key(|(n, _)| *n);
        assert_eq!(got, [("flush", Run::Now), ("refuse", Run::Refused)]);
        work.stop();
    }
}
