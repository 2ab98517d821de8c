//! What becomes of a slice when it ends: done; retried on another rail
//! (or the same one, when the rail was not at fault) up to
//! `MC_RETRY_CNT`; refused by the peer, retried once on its refetched
//! descriptor; handed to the request's fallback; or failed.

use super::job::{Job, RailSet, Request};
use super::{Carrier, Scheduler};
use crate::batch::Task;
use crate::segment::RemoteSegment;
use crate::transport::{Outcome, Submission, Transfer};
use once_cell::sync::OnceCell;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tracing::debug;

impl<C: Carrier> Scheduler<C> {
    pub(super) fn finished(mut job: Job<C>, outcome: Outcome) {
        let req = job.req.clone();
        let me = &req.sched;
        let route = &req.route;
        let rail = &route.rails[job.rail];
        let device = me.load_of(rail);
        let moved = if outcome == Outcome::Done { job.len } else { 0 };
        device.finish(job.len, moved);
        route.cells[job.rail].finish(job.len);
        let task = req.batch.slot(req.task);
        // A cancelled task's slice that did not move is neither retried
        // nor handed on: it ends, and with it, once the rest end, the task.
        let withdrawn = outcome == Outcome::Canceled
            || (outcome != Outcome::Done && task.is_some_and(Task::is_canceled));
        if withdrawn {
            if let Some(t) = task {
                t.finish_slice(job.len, false);
            }
            return;
        }
        let charge = match outcome {
            Outcome::Done => {
                route.cells[job.rail].record_success();
                device.record_success();
                if let Some(t) = task {
                    t.finish_slice(job.len, true);
                }
                return;
            }
            Outcome::Rejected => {
                // The peer may have registered the buffer again (a new
                // key): its descriptor is refetched once, in the
                // background, and the slice retried with it.
                if let Some(next) = req.successor.get().filter(|_| !job.refreshed) {
                    job.refreshed = true;
                    return Scheduler::move_to(job, next.clone());
                }
                if let Some(refresh) = req.refresh.as_ref().filter(|_| !job.refreshed) {
                    job.refreshed = true;
                    return refresh(
                        &req.seg.name,
                        Box::new(move |seg| Scheduler::after_refresh(job, seg)),
                    );
                }
                if let Some(t) = task {
                    t.finish_slice(job.len, false);
                }
                return;
            }
            Outcome::Local => {
                let why = format!(
                    "the local memory of {} bytes at {:#x} could not be used: its buffer was \
                     unregistered during the transfer, or it is not mapped",
                    job.len, job.local
                );
                crate::log_limit::warn_limited!("a slice to segment {:?}: {why}", req.seg.name);
                req.batch.note_failure(req.task, &why);
                if let Some(t) = task {
                    t.finish_slice(job.len, false);
                }
                return;
            }
            Outcome::Failed { hard } => Some(hard),
            // The rail's transport cannot reach the peer: as a rail that
            // cannot connect.
            Outcome::Unreachable => Some(true),
            Outcome::Interrupted | Outcome::Canceled => None,
        };
        if let Some(hard) = charge {
            route.cells[job.rail].record_error(hard);
            device.record_failure(job.round);
            req.seg.freshness.mark_stale();
            job.tried.insert(job.rail);
            if hard {
                job.dead.insert(job.rail);
            }
        }
        job.attempt += 1;
        let closed = me.closed.load(Ordering::Acquire);
        let group = route.group(req.local_slot, job.buffer);
        let c = (!closed && job.attempt < me.retry_cnt).then(|| me.candidates(route, group));
        if let (Some(_), Some(next)) = (&c, req.successor.get()) {
            return Scheduler::move_to(job, next.clone());
        }
        let next = match c {
            None => None,
            // Not the rail's fault: the same rail again, unless it is out.
            Some(c)
                if charge.is_none()
                    && c.order.contains(&job.rail)
                    && !job.tried.contains(job.rail) =>
            {
                Some(job.rail)
            }
            Some(c) => me.retry_choice(c, job.attempt, &job.tried, &job.dead),
        };
        let Some(next) = next else {
            let part = Transfer {
                local: job.local,
                remote: job.remote,
                len: job.len,
                write: req.write,
            };
            // The next transport takes the slice over (its slices are
            // counted before this one ends, so the task stays open).
            if !closed && Submission::fall_back(&req.fallback, part) {
                if let Some(t) = task {
                    t.finish_slice(0, true);
                }
                return;
            }
            let why = format!(
                "a slice to segment {:?} failed after {} attempt(s) on {} rail(s){}",
                req.seg.name,
                job.attempt,
                job.tried.len(),
                me.carrier
                    .failure(rail)
                    .map_or_else(String::new, |w| format!(": {w}"))
            );
            if !closed {
                crate::log_limit::warn_limited!(
                    "slice of {} bytes at {:#x}: {why}",
                    job.len,
                    job.remote
                );
            }
            req.batch.note_failure(req.task, &why);
            if let Some(t) = task {
                t.finish_slice(job.len, false);
            }
            return;
        };
        job.rail = next;
        me.count_retry(&req);
        debug!(
            "retrying a slice on rail {} (attempt {})",
            route.rails[job.rail].key, job.attempt
        );
        me.post(job);
    }

    /// Retries a slice the peer refused with its refetched descriptor
    /// `seg`, if that one publishes the slice's range in one buffer that
    /// differs from the one the slice used (a new key, new bounds); else
    /// the slice fails (a range the peer does not hold fails at once).
    fn after_refresh(job: Job<C>, seg: Option<Arc<RemoteSegment>>) {
        let req = &job.req;
        let me = &req.sched;
        let old = job.buffer.and_then(|b| req.seg.desc.buffers.get(b));
        let changed = seg
            .filter(|_| !me.closed.load(Ordering::Acquire))
            .filter(|seg| {
                seg.desc
                    .find_buffer(job.remote, job.len)
                    .is_some_and(|b| old != Some(&seg.desc.buffers[b]))
            });
        let Some(seg) = changed else {
            return Self::refused(job);
        };
        debug!(
            "retrying a refused slice at {:#x} with the refetched descriptor of {:?}",
            job.remote, seg.name
        );
        let next = req
            .successor
            .get_or_init(|| {
                Arc::new(Request {
                    sched: me.clone(),
                    batch: req.batch.clone(),
                    task: req.task,
                    write: req.write,
                    gpu: req.gpu,
                    local: req.local.clone(),
                    local_slot: req.local_slot,
                    route: me.route_of(&seg),
                    seg,
                    fallback: req.fallback.clone(),
                    refresh: req.refresh.clone(),
                    successor: OnceCell::new(),
                })
            })
            .clone();
        Self::move_to(job, next)
    }

    /// Posts a slice again as part of `next` (its request on a refetched
    /// descriptor), on a first choice of its rails; fails it if that
    /// descriptor does not hold its range in one buffer or no rail is left.
    pub(super) fn move_to(job: Job<C>, next: Arc<Request<C>>) {
        let me = next.sched.clone();
        me.count_retry(&next);
        let route = &next.route;
        let buffer = next.seg.desc.find_buffer(job.remote, job.len);
        let rail = buffer.and_then(|b| {
            let group = route.group(next.local_slot, Some(b));
            me.first_choice(&mut me.candidates(route, group), job.len)
        });
        let (Some(buffer), Some(rail)) = (buffer, rail) else {
            return Self::refused(job);
        };
        me.post(Job {
            req: next,
            buffer: Some(buffer),
            rail,
            tried: RailSet::default(),
            dead: RailSet::default(),
            ..job
        });
    }

    /// Counts a slice of `req` posted again in its batch's statistics.
    fn count_retry(&self, req: &Request<C>) {
        if let Some(stats) = req.batch.stats() {
            stats.retried(self.kind.route());
        }
    }

    /// Fails a slice the peer refused.
    fn refused(job: Job<C>) {
        let req = &job.req;
        let why = format!(
            "segment {:?} refused a slice (not inside a buffer it registered)",
            req.seg.name
        );
        crate::log_limit::warn_limited!("slice of {} bytes at {:#x}: {why}", job.len, job.remote);
        req.batch.note_failure(req.task, &why);
        if let Some(t) = req.batch.slot(req.task) {
            t.finish_slice(job.len, false);
        }
    }
}
