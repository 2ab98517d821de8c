//! The active side's handshakes, run by a small pool of threads shared by
//! the transport's devices (`MC_RDMA_CONNECT_THREADS`), in lanes: the
//! handshakes to one peer (one handshake listener address) run one at a
//! time, in order; those to different peers run at once. A peer that does
//! not answer holds one thread, for at most one handshake timeout at a
//! time, and delays only its own endpoints.

use super::RdmaTarget;
use super::endpoint::RdmaEndpoint;
use super::nic::Nic;
use crate::error::{Error, Result};
use crate::sync;
use crate::transport::Outcome;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// One handshake to run: connect `ep` of `nic` to `target`.
pub struct ConnectJob {
    /// The device the endpoint belongs to.
    pub nic: Arc<Nic>,
    /// The endpoint, `Connecting`.
    pub ep: Arc<RdmaEndpoint>,
    /// The peer device.
    pub target: RdmaTarget,
}

/// A peer's handshake listener: the handshakes to it form one lane.
type LaneKey = (String, u16);

#[derive(Default)]
struct Lane {
    jobs: VecDeque<ConnectJob>,
    /// In `ready`, or being run by a thread.
    scheduled: bool,
}

#[derive(Default)]
struct State {
    lanes: HashMap<LaneKey, Lane>,
    /// Lanes with jobs that no thread runs, oldest first.
    ready: VecDeque<LaneKey>,
    stopping: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
}

/// The transport's handshake threads.
pub struct Connector {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Connector {
    /// Starts `threads` (≥ 1) handshake threads.
    pub fn start(threads: usize) -> Result<Connector> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
        });
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let s = shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("te-rdma-conn-{i}"))
                .spawn(move || run(&s))
                .map_err(|e| Error::Context(format!("starting an RDMA connector thread: {e}")))?;
            handles.push(t);
        }
        Ok(Connector {
            shared,
            threads: Mutex::new(handles),
        })
    }

    /// Queues `job` behind the handshakes to the same peer; gives it back
    /// when the connector is stopping.
    pub fn submit(&self, job: ConnectJob) -> std::result::Result<(), ConnectJob> {
        let key = (job.target.rpc_host.clone(), job.target.rpc_port);
        let mut st = sync::lock(&self.shared.state);
        if st.stopping {
            return Err(job);
        }
        let lane = st.lanes.entry(key.clone()).or_default();
        lane.jobs.push_back(job);
        if !lane.scheduled {
            lane.scheduled = true;
            st.ready.push_back(key);
            drop(st);
            self.shared.work.notify_one();
        }
        Ok(())
    }

    /// Stops: queued handshakes fail, running ones finish (each within its
    /// timeout), the threads are joined. Idempotent.
    pub fn stop(&self) {
        let queued: Vec<ConnectJob> = {
            let mut st = sync::lock(&self.shared.state);
            st.stopping = true;
            st.ready.clear();
            st.lanes
                .values_mut()
                .flat_map(|l| l.jobs.drain(..))
                .collect()
        };
        self.shared.work.notify_all();
        for job in queued {
            job.nic
                .fail_endpoint(&job.ep, Outcome::Interrupted, "the transport is stopping");
        }
        let threads = std::mem::take(&mut *sync::lock(&self.threads));
        for t in threads {
            if t.join().is_err() {
                tracing::warn!("an RDMA connector thread panicked");
            }
        }
    }
}

/// A handshake thread: runs the next job of the oldest ready lane, then
/// puts the lane back at the end if it has more.
fn run(shared: &Shared) {
    loop {
        let (key, job) = {
            let mut st = sync::lock(&shared.state);
            loop {
                if st.stopping {
                    return;
                }
                if let Some(key) = st.ready.pop_front() {
                    let job = st.lanes.get_mut(&key).and_then(|l| l.jobs.pop_front());
                    match job {
                        Some(job) => break (key, job),
                        None => {
                            st.lanes.remove(&key);
                        }
                    }
                    continue;
                }
                st = shared.work.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        job.nic.connect(&job.ep, &job.target);
        drop(job);
        let mut st = sync::lock(&shared.state);
        let more = st.lanes.get(&key).is_some_and(|l| !l.jobs.is_empty());
        if more {
            st.ready.push_back(key);
            drop(st);
            shared.work.notify_one();
        } else {
            st.lanes.remove(&key);
        }
    }
}
