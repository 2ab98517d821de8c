//! A device's worker threads: they post the work requests of runnable
//! endpoints within each queue pair's depth and the completion queue's
//! room, and complete slices from the completions (in queue order).

use super::Nic;
use crate::sync;
use crate::transport::Outcome;
use crate::transport::rdma::RdmaTarget;
use crate::transport::rdma::endpoint::{Ended, Phase, PostJob, Posting, RdmaEndpoint, report};
use crate::transport::rdma::wake::wait_readable;
use crate::verbs::WorkCompletion;
use std::sync::atomic::Ordering;
use std::sync::{Arc, TryLockError};
use std::time::Duration;
use tracing::{debug, warn};

/// How long an idle worker sleeps between looks at its queues.
const IDLE_WAIT: Duration = Duration::from_millis(200);

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
                crate::warn_limited!("{e}");
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
            Ok((_, true)) => self.schedule(ep),
            Ok(_) => {}
        }
    }

    pub(super) fn schedule(&self, ep: Arc<RdmaEndpoint>) {
        // The receiver lives as long as the device.
        let _ = self.runnable.0.send(ep);
        self.wake.wake();
    }

    /// Worker thread: completes and posts work requests until stopped.
    pub(super) fn work(self: Arc<Self>) {
        let fds = [self.wake.fd(), self.cq.event_fd()];
        let mut wcs: Vec<WorkCompletion> = Vec::with_capacity(64);
        loop {
            if self.halted.load(Ordering::Acquire)
                || (self.stopping.load(Ordering::Acquire) && self.idle())
            {
                break;
            }
            let ready = wait_readable(&fds, IDLE_WAIT);
            if ready[0] {
                self.wake.drain();
            }
            if let Err(e) = self.cq.take_event() {
                warn!(
                    "RDMA device {}: reading the completion channel: {e}",
                    self.name
                );
            }
            self.complete_all(&mut wcs);
            self.post_runnable();
        }
    }

    /// Whether nothing is outstanding or queued (for the workers' exit).
    pub(super) fn idle(&self) -> bool {
        self.cq_outstanding.load(Ordering::Acquire) == 0 && self.runnable.1.is_empty()
    }

    /// Polls the completion queue dry, re-arms it, and polls once more
    /// (a completion between the last poll and the arming would otherwise
    /// wait for the next event). Completions are taken and matched to
    /// their requests in queue order, one batch at a time under
    /// `poll_lock`: a request without a completion of its own counts as
    /// done only when a later completion of its queue pair is seen, so
    /// completions must not overtake each other between workers. A worker
    /// never waits for that lock: it leaves a wish (`poll_again`) and goes
    /// on posting, and the holder looks again before it returns. Slices
    /// are reported outside the lock.
    fn complete_all(&self, wcs: &mut Vec<WorkCompletion>) {
        let mut armed = false;
        loop {
            self.poll_again.store(true, Ordering::SeqCst);
            let in_order = match self.poll_lock.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            self.poll_again.store(false, Ordering::SeqCst);
            wcs.clear();
            match self.cq.poll(wcs, 64) {
                Ok(0) if !armed => {
                    if let Err(e) = self.cq.arm() {
                        warn!(
                            "RDMA device {}: arming the completion queue: {e}",
                            self.name
                        );
                    }
                    armed = true;
                }
                Ok(0) => {
                    drop(in_order);
                    if !self.poll_again.load(Ordering::SeqCst) {
                        return;
                    }
                    armed = false;
                }
                Ok(_) => {
                    let consumed = self.consume(wcs);
                    drop(in_order);
                    self.settle(consumed);
                }
                Err(e) => {
                    warn!("RDMA device {}: {e}", self.name);
                    return;
                }
            }
        }
    }

    /// Matches completions to their requests.
    fn consume(&self, wcs: &[WorkCompletion]) -> Consumed {
        let mut c = Consumed {
            ended: Vec::with_capacity(wcs.len()),
            touched: Vec::new(),
            failed: Vec::new(),
        };
        for wc in wcs {
            let Some(ep) = self.qps.get(wc.qp_num) else {
                continue;
            };
            let Some(slot) = ep.slot_of(wc.qp_num) else {
                continue;
            };
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
            let n = ep.complete(slot, wc.wr_id, outcome, &mut c.ended);
            if !wc.ok() {
                debug!(
                    "RDMA device {}: QP {} request {} ended with {} ({n} request(s) matched)",
                    self.name,
                    wc.qp_num,
                    wc.wr_id,
                    wc.status_name()
                );
            }
            if n == 0 {
                // Left over from a destroyed queue pair.
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

    /// Reports what completions ended, fails the endpoints that had
    /// errors, and reschedules endpoints that now have room.
    fn settle(&self, c: Consumed) {
        for (ep, why) in c.failed {
            self.fail_endpoint(&ep, Outcome::Interrupted, &why);
        }
        report(c.ended);
        for ep in c.touched {
            if ep.want_schedule() {
                self.schedule(ep);
            }
        }
        // Only those waiting now: posting may add more meanwhile.
        for _ in 0..self.cq_waiting.1.len() {
            let Ok(ep) = self.cq_waiting.1.try_recv() else {
                break;
            };
            if ep.want_schedule() {
                self.schedule(ep);
            }
        }
    }

    fn post_runnable(&self) {
        let max_wr = self.caps.max_wr as usize;
        let cq_cap = self.cq.capacity() as usize;
        let _posting = sync::lock(&self.post_lock);
        loop {
            let Ok(ep) = self.runnable.1.try_recv() else {
                return;
            };
            // Reserve the completion queue room before posting.
            let outstanding = self.cq_outstanding.load(Ordering::Acquire);
            let mut room = cq_cap.saturating_sub(outstanding);
            let (left, ended) = ep.post_queued(max_wr, self.opts.cfg.signal_interval, &mut room);
            report(ended);
            match left {
                Posting::CqFull => {
                    let _ = self.cq_waiting.0.send(ep);
                }
                Posting::Drained | Posting::QueueFull | Posting::NotReady => {}
            }
        }
    }
}
