//! The submission path: a request cut into slices (at the edges of the
//! local buffer, the carrier's registration pieces and the peer's
//! buffers), each counted on its task, given its first rail and posted.

use super::choice::Candidates;
use super::job::{Job, RailSet, Request};
use super::route::{Group, slot_of};
use super::{Carrier, Scheduler, planner};
use crate::batch::TaskRef;
use crate::metadata::descriptor::SegmentDesc;
use crate::transport::{Outcome, Slice, Submission, Transfer};
use once_cell::sync::OnceCell;
use std::sync::Arc;

impl<C: Carrier> Scheduler<C> {
    /// Moves one request to a remote segment: slices counted on the task
    /// first, then each posted on its rail. Slices are cut where the local
    /// registered buffer that holds the source ends, where the carrier's
    /// own registration piece ends ([`Carrier::local_limit`]), and where
    /// each of the peer's buffers the range spans ends (each slice uses
    /// its own buffer's keys).
    pub fn submit(self: &Arc<Self>, sub: Submission) {
        let Submission {
            batch,
            task,
            seg,
            xfer,
            local: side,
            fallback,
            refresh,
        } = sub;
        let (end, gpu) = (side.end, side.gpu);
        let Transfer {
            local,
            remote,
            len,
            write,
        } = xfer;
        let Some(t) = batch.slot(task) else {
            return;
        };
        let pieces = self.pieces(&seg.desc, local, remote, len, end);
        t.add_slices(pieces.len() as u64);
        let route = self.route_of(&seg);
        let local_slot = slot_of(&route.local_locs, &side.location);
        let req = Arc::new(Request {
            sched: self.clone(),
            batch: batch.clone(),
            task,
            write,
            gpu,
            local: side,
            local_slot,
            seg,
            route,
            fallback,
            refresh,
            successor: OnceCell::new(),
        });
        let route = &req.route;
        // Candidates are worked out once per request (per target buffer
        // location), not per slice.
        let mut cached: Option<(*const Group, Candidates)> = None;
        for (off, n, buffer) in pieces {
            let group = route.group(local_slot, buffer);
            let c = match &mut cached {
                Some((g, c)) if std::ptr::eq(*g, group) => c,
                _ => &mut cached.insert((group, self.candidates(route, group))).1,
            };
            let Some(rail) = self.first_choice(c, n) else {
                let part = Transfer {
                    local: local + off,
                    remote: remote + off,
                    len: n,
                    write,
                };
                let handed = Submission::fall_back(&req.fallback, part);
                t.finish_slice(0, handed);
                continue;
            };
            self.post(Job {
                req: req.clone(),
                local: local + off,
                remote: remote + off,
                len: n,
                buffer,
                attempt: 0,
                rail,
                tried: RailSet::default(),
                dead: RailSet::default(),
                refreshed: false,
                round: 0,
            });
        }
    }

    /// The slices of a request as (offset, length, peer buffer): Mooncake's
    /// slicing, each slice cut further at the end of the local buffer
    /// (`end`), of the carrier's registration piece, and of the peer's
    /// buffer it starts in.
    fn pieces(
        &self,
        desc: &SegmentDesc,
        local: u64,
        remote: u64,
        len: u64,
        end: Option<u64>,
    ) -> Vec<(u64, u64, Option<usize>)> {
        let mut pieces =
            Vec::with_capacity(
                planner::slice_count(len, self.slice_size, self.fragment_limit) as usize,
            );
        let mut buffer = desc.buffer_at(remote);
        for (off, n) in planner::slices(len, self.slice_size, self.fragment_limit) {
            let stop = off + n;
            let mut at = off;
            while at < stop {
                let mut cut = stop;
                let mut limit = |edge: Option<u64>, base: u64| {
                    if let Some(e) = edge.map(|e| e.saturating_sub(base)) {
                        if e > at && e < cut {
                            cut = e;
                        }
                    }
                };
                limit(end, local);
                limit(self.carrier.local_limit(local + at), local);
                let b = buffer
                    .filter(|&b| desc.buffers[b].contains(remote + at))
                    .or_else(|| desc.buffer_at(remote + at));
                buffer = b;
                limit(b.map(|b| desc.buffers[b].end()), remote);
                pieces.push((at, cut - at, b));
                at = cut;
            }
        }
        pieces
    }

    pub(super) fn post(self: &Arc<Self>, mut job: Job<C>) {
        let req = job.req.clone();
        let rail = &req.route.rails[job.rail];
        let device = self.load_of(rail);
        device.start(job.len);
        job.round = device.round();
        req.route.cells[job.rail].start(job.len);
        let remote_key = match (job.buffer, rail.peer_device) {
            (Some(b), Some(j)) => req.seg.desc.buffers[b].rkey.get(j).copied().unwrap_or(0),
            _ => 0,
        };
        let slice = Slice {
            local: job.local,
            remote: job.remote,
            len: job.len,
            write: req.write,
            local_gpu: req.gpu,
            local_fence: req.local.fence_for(job.local, job.len),
            task: Some(TaskRef::new(req.batch.clone(), req.task)),
            done: Box::new(move |o| Scheduler::finished(job, o)),
        };
        if slice.canceled() {
            return slice.finish(Outcome::Canceled);
        }
        self.carrier.post(rail, slice, remote_key);
    }
}
