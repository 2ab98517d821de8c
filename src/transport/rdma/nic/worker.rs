//! A device's worker threads: they complete slices from the completions
//! (in queue order) and post the work requests of endpoints made runnable
//! by a completion or a connection; a request submitted to a connected
//! endpoint is posted by the submitting thread itself. Every post stays
//! within each queue pair's depth and the completion queue's room.
//!
//! Correctness rules:
//! - **In-order matching.** A request without a completion of its own
//!   (unsignaled) counts as done only when a later completion of its queue
//!   pair is seen, so the completions of one queue pair must be matched in
//!   the order the queue returns them: each completion queue is polled by
//!   one worker alone (queue `i` by worker `i % MC_WORKERS_PER_CTX`).
//! - **Completion queue room.** A request is posted only after room for
//!   its completion was reserved in its queue ([`CqRoom`]); the room comes
//!   back when the request ends. An endpoint that found no room waits on
//!   its queue's list until a completion of that queue frees some.
//! - **No lookup table.** A completion finds its endpoint and queue pair
//!   from its `wr_id` ([`WrId`]) in the device's slab; a completion left
//!   in a queue by an endpoint already closed names a freed index or an
//!   old generation and is dropped.
//!
//! Completion modes: a worker that found work keeps polling for
//! `MC_TE_RDMA_BUSY_POLL_US` (busy polling, no system call per
//! completion); then, or at once when the spell is 0, it arms its
//! completion queues and sleeps on their channels and the device's wake
//! descriptor, so an idle engine burns no CPU.
//!
//! [`CqRoom`]: crate::transport::rdma::endpoint::CqRoom

use super::Nic;
use crate::transport::Outcome;
use crate::transport::rdma::RdmaTarget;
use crate::transport::rdma::endpoint::{Ended, Phase, PostJob, Posting, RdmaEndpoint, report};
use crate::transport::rdma::wake::wait_readable;
use crate::transport::rdma::wr_id::WrId;
use crate::verbs::WorkCompletion;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How long an idle worker sleeps between looks at its queues.
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// Completions taken per poll.
const POLL_BATCH: usize = 64;

/// What one batch of completions ended.
struct Consumed {
    ended: Ended,
    touched: Vec<Arc<RdmaEndpoint>>,
    failed: Vec<(Arc<RdmaEndpoint>, String)>,
}

impl Nic {
    /// Queues a job on the endpoint to `target` and gets it connected or
    /// posted.
    pub fn post(self: &Arc<Self>, target: &RdmaTarget, job: PostJob) {
        if !self.is_active() {
            return report(vec![(job.slice, Outcome::Failed { hard: true })]);
        }
        let ep = match self.endpoint(&target.peer_nic_path) {
            Ok(ep) => ep,
            Err(e) => {
                crate::log_limit::warn_limited!("{e}");
                return report(vec![(job.slice, Outcome::Failed { hard: true })]);
            }
        };
        ep.set_peer_rpc(&target.rpc_host, target.rpc_port);
        match ep.enqueue(job) {
            Err(job) => report(vec![(job.slice, Outcome::Interrupted)]),
            Ok((Phase::New, _)) => {
                if ep.start_connecting() {
                    self.request_connect(ep, target.clone());
                }
            }
            // Posted from the caller's thread: the request reaches the
            // wire without waiting for a worker to wake.
            Ok((_, true)) => self.post_endpoint(ep),
            Ok(_) => {}
        }
    }

    /// Puts `ep` on the runnable list; wakes the workers if one sleeps.
    pub(super) fn schedule(&self, ep: Arc<RdmaEndpoint>) {
        // The receiver lives as long as the device.
        let _ = self.runnable.0.send(ep);
        // Pairs with the sleeper's count-then-look (a fence on each side):
        // either it sees the endpoint, or we see it counted.
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.wake.wake();
        }
    }

    /// Worker thread `me`: completes and posts work requests until
    /// stopped.
    pub(super) fn work(self: Arc<Self>, me: usize) {
        let workers = self.opts.cfg.workers_per_ctx.max(1);
        let mine: Vec<usize> = (0..self.cqs.len()).filter(|c| c % workers == me).collect();
        let mut channels: Vec<usize> = mine.iter().map(|&c| self.cqs[c].channel).collect();
        channels.dedup();
        let mut fds = vec![self.wake.fd()];
        fds.extend(channels.iter().map(|&c| self.channels[c].fd()));
        let spell = Duration::from_micros(self.opts.cfg.busy_poll_us);
        let mut wcs: Vec<WorkCompletion> = Vec::with_capacity(POLL_BATCH);
        let mut last_work = Instant::now();
        loop {
            if self.halted.load(Ordering::Acquire)
                || (self.stopping.load(Ordering::Acquire) && self.idle())
            {
                break;
            }
            let completed = self.complete_all(&mine, &mut wcs, false);
            if completed | self.post_runnable() {
                last_work = Instant::now();
                continue;
            }
            if !spell.is_zero() && last_work.elapsed() < spell {
                std::hint::spin_loop();
                continue;
            }
            // Arm, then look once more: a completion between the last
            // poll and the arming would otherwise wait for the next event.
            if self.complete_all(&mine, &mut wcs, true) {
                last_work = Instant::now();
                continue;
            }
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let ready = if self.runnable.1.is_empty() {
                wait_readable(&fds, IDLE_WAIT)
            } else {
                vec![false; fds.len()]
            };
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            if ready[0] {
                self.wake.drain();
            }
            for (k, &c) in channels.iter().enumerate() {
                if ready[k + 1] {
                    self.take_events(c, &mine);
                }
            }
        }
    }

    /// Takes the pending events of channel `c`; an event for a queue
    /// another worker polls wakes the workers.
    fn take_events(&self, c: usize, mine: &[usize]) {
        loop {
            match self.channels[c].take_event() {
                Ok(Some(id)) => {
                    if !mine.iter().any(|&q| self.cqs[q].cq.id() == id) {
                        self.wake.wake();
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    warn!(
                        "RDMA device {}: reading a completion channel: {e}",
                        self.name
                    );
                    return;
                }
            }
        }
    }

    /// Whether nothing is outstanding or queued (for the workers' exit).
    pub(super) fn idle(&self) -> bool {
        self.cqs.iter().all(|q| q.room.outstanding() == 0) && self.runnable.1.is_empty()
    }

    /// Polls the completion queues `mine` dry (arming each first when
    /// `arm`), matches the completions to their requests and reports the
    /// slices. Returns whether there was any.
    fn complete_all(&self, mine: &[usize], wcs: &mut Vec<WorkCompletion>, arm: bool) -> bool {
        let mut any = false;
        for &q in mine {
            let cq = &self.cqs[q];
            if arm {
                if let Err(e) = cq.cq.arm() {
                    warn!("RDMA device {}: arming a completion queue: {e}", self.name);
                }
            }
            loop {
                wcs.clear();
                match cq.cq.poll(wcs, POLL_BATCH) {
                    Ok(0) => break,
                    Ok(n) => {
                        any = true;
                        let consumed = self.consume(wcs);
                        self.settle(consumed, q);
                        if n < POLL_BATCH {
                            break;
                        }
                    }
                    Err(e) => {
                        warn!("RDMA device {}: {e}", self.name);
                        break;
                    }
                }
            }
        }
        any
    }

    /// Matches completions to their requests.
    fn consume(&self, wcs: &[WorkCompletion]) -> Consumed {
        let mut c = Consumed {
            ended: Vec::with_capacity(wcs.len()),
            touched: Vec::new(),
            failed: Vec::new(),
        };
        // Completions of one endpoint come in runs: look it up once a run.
        let mut last: Option<Arc<RdmaEndpoint>> = None;
        for wc in wcs {
            let id = WrId::decode(wc.wr_id);
            let ep = match last.take() {
                Some(ep) if ep.tag() == id.tag => ep,
                _ => match self.slab.get(id) {
                    Some(ep) => ep,
                    // Left over from an endpoint already closed.
                    None => continue,
                },
            };
            last = Some(ep.clone());
            let outcome = if wc.ok() {
                Outcome::Done
            } else if wc.flushed() {
                Outcome::Interrupted
            } else if wc.remote_access_error() {
                Outcome::Rejected
            } else {
                let hard = matches!(
                    wc.status,
                    rdma_sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR
                        | rdma_sys::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR
                );
                Outcome::Failed { hard }
            };
            let n = ep.complete(wc.qp_num, id, outcome, &mut c.ended);
            if !wc.ok() {
                debug!(
                    "RDMA device {}: QP {} request {:#x} ended with {} ({n} request(s) matched)",
                    self.name,
                    wc.qp_num,
                    wc.wr_id,
                    wc.status_name()
                );
            }
            if n == 0 {
                // Its requests ended already (the endpoint was destroyed).
                continue;
            }
            // Any error, a flush included, means the queue pair is in the
            // error state: the endpoint is replaced.
            if !wc.ok() && !c.failed.iter().any(|(e, _)| Arc::ptr_eq(e, &ep)) {
                c.failed.push((
                    ep.clone(),
                    format!(
                        "work request completed with {} (vendor error {:#x})",
                        wc.status_name(),
                        wc.vendor_err
                    ),
                ));
            }
            if !c.touched.iter().any(|t| Arc::ptr_eq(t, &ep)) {
                c.touched.push(ep);
            }
        }
        c
    }

    /// Reports what completions of queue `q` ended, fails the endpoints
    /// that had errors, and reschedules endpoints that now have room.
    fn settle(&self, c: Consumed, q: usize) {
        for (ep, why) in c.failed {
            self.fail_endpoint(&ep, Outcome::Interrupted, &why);
        }
        report(c.ended);
        for ep in c.touched {
            if ep.want_schedule() {
                self.schedule(ep);
            }
        }
        self.reschedule_waiting(q);
    }

    /// Reschedules the endpoints waiting for room in queue `q` (only those
    /// waiting now: posting may add more meanwhile).
    fn reschedule_waiting(&self, q: usize) {
        let waiting = &self.cqs[q].waiting.1;
        for _ in 0..waiting.len() {
            let Ok(ep) = waiting.try_recv() else {
                break;
            };
            if ep.want_schedule() {
                self.schedule(ep);
            }
        }
    }

    /// Posts from the runnable endpoints until none is left; returns
    /// whether there was any.
    fn post_runnable(&self) -> bool {
        let mut any = false;
        while let Ok(ep) = self.runnable.1.try_recv() {
            any = true;
            self.post_endpoint(ep);
        }
        any
    }

    /// Posts the queued jobs of the scheduled endpoint `ep` (any thread);
    /// when its completion queue has no room, it waits on that queue's
    /// list for a completion to free some.
    fn post_endpoint(&self, ep: Arc<RdmaEndpoint>) {
        let (left, ended) =
            ep.post_queued(self.caps.max_wr as usize, self.opts.cfg.signal_interval);
        report(ended);
        if left == Posting::CqFull {
            let q = ep.cq_index();
            let _ = self.cqs[q].waiting.0.send(ep);
            // Room freed between our reservation and the wait would
            // otherwise go unnoticed.
            if self.cqs[q].room.has_room() {
                self.reschedule_waiting(q);
            }
        }
    }
}

/// The CPUs the workers of RDMA device `name` run on: those of its NUMA
/// node that this process may use, `None` (no pinning) when the node, its
/// CPUs or the process's mask is unknown.
pub(super) fn node_cpus_for(name: &str) -> Option<Vec<usize>> {
    let node = crate::topology::rdma_numa_node(name)?;
    let list =
        std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/cpulist")).ok()?;
    placement(&parse_cpu_list(&list)?, &allowed_cpus()?)
}

/// Of the NUMA node's CPUs, those allowed; `None` when that leaves none
/// (pinning would then take the workers off every CPU they may use).
fn placement(node: &[usize], allowed: &[usize]) -> Option<Vec<usize>> {
    let cpus: Vec<usize> = node
        .iter()
        .copied()
        .filter(|c| allowed.contains(c))
        .collect();
    (!cpus.is_empty()).then_some(cpus)
}

/// Parses a kernel CPU list (`0-3,8,10-11`); `None` if malformed.
fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: `cpu_set_t` is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set is valid for writes of its own size.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return None;
    }
    // SAFETY: `set` was filled by the kernel; CPU_ISSET reads within it.
    Some(
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect(),
    )
}

/// Set once the first pinning failure was logged.
static PIN_FAILED: AtomicBool = AtomicBool::new(false);

/// Pins the calling worker thread of device `device` to `cpus`; logs the
/// first failure of the process and goes on unpinned.
pub(super) fn pin(device: &str, cpus: &[usize]) {
    // SAFETY: `cpu_set_t` is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE, inside the set.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: the set is valid for reads of its own size; 0 = this thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        if !PIN_FAILED.swap(true, Ordering::Relaxed) {
            warn!(
                "RDMA device {device}: pinning a worker to CPUs {cpus:?} failed: {}; workers \
                 run unpinned",
                std::io::Error::last_os_error()
            );
        }
    } else {
        debug!("RDMA device {device}: worker pinned to CPUs {cpus:?}");
    }
}

/// Logs once where the workers of a device run.
pub(super) fn log_placement(device: &str, cpus: &Option<Vec<usize>>) {
    match cpus {
        Some(c) => info!("RDMA device {device}: workers on its NUMA node's CPUs {c:?}"),
        None => debug!("RDMA device {device}: NUMA node unknown; workers unpinned"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        assert_eq!(parse_cpu_list("\n"), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a-b"), None);
        assert_eq!(parse_cpu_list("1,,2"), Some(vec![1, 2]));
    }

    #[test]
    fn placement_keeps_the_allowed_cpus_of_the_node() {
        assert_eq!(placement(&[0, 1, 2, 3], &[2, 3, 4, 5]), Some(vec![2, 3]));
        assert_eq!(placement(&[0, 1], &[4, 5]), None);
        assert_eq!(placement(&[], &[0]), None);
        // This process may run somewhere.
        assert!(!allowed_cpus().unwrap().is_empty());
    }
}
