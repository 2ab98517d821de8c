//! READs waiting for a thread (or a polling caller) to execute them, in
//! runs of slices to one target: a caller's batch of READs to one peer is
//! queued as one run, under one lock, instead of one queue operation (and
//! one count of the peer's references) per READ. While a thread holds a
//! [`plug`](crate::transport::plug), the READs it posts wait on that thread
//! ([`stage`]) and are queued at the flush ([`take_staged`]): two callers
//! submitting READs to the same peer at once then meet on the peer's lock
//! and on this queue's once per batch, not once per request.

use super::attach::Link;
use super::peer::PeerCore;
use crate::transport::Slice;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// READs to one target, in the order they were posted.
pub(crate) struct ReadJob {
    pub core: Arc<PeerCore>,
    pub link: Arc<Link>,
    pub slices: Vec<Slice>,
    /// The scans of the target's table begun when they were posted
    /// ([`TableReader::scans`](super::table::TableReader::scans)): an
    /// index built by a later one answers their lookups.
    pub asked: u64,
}

impl ReadJob {
    /// READs to the target of `link`, posted now.
    pub fn new(core: Arc<PeerCore>, link: Arc<Link>, slices: Vec<Slice>) -> ReadJob {
        let asked = link.table.scans();
        ReadJob {
            core,
            link,
            slices,
            asked,
        }
    }
}

/// The transport's queue of READs.
#[derive(Default)]
pub(crate) struct ReadQueue {
    jobs: Mutex<VecDeque<ReadJob>>,
    /// Slices queued (read without the lock).
    queued: AtomicUsize,
}

impl ReadQueue {
    /// Queues a run of READs behind those already queued.
    pub fn push(&self, job: ReadJob) {
        let mut jobs = crate::sync::lock(&self.jobs);
        self.queued.fetch_add(job.slices.len(), Ordering::SeqCst);
        jobs.push_back(job);
    }

    /// Whether no READ is queued.
    pub fn is_empty(&self) -> bool {
        self.queued.load(Ordering::SeqCst) == 0
    }

    /// Takes the oldest READs, at most `most` of them, and no more once
    /// `bytes` are reached; a run is split where the limit falls, its rest
    /// staying first in line.
    pub fn take(&self, most: usize, bytes: u64) -> Vec<ReadJob> {
        if self.is_empty() {
            return Vec::new();
        }
        let mut jobs = crate::sync::lock(&self.jobs);
        let (mut out, mut n, mut sum) = (Vec::new(), 0usize, 0u64);
        while n < most && sum < bytes {
            let Some(mut job) = jobs.pop_front() else {
                break;
            };
            let mut k = 0;
            while k < job.slices.len() && n < most && sum < bytes {
                sum = sum.saturating_add(job.slices[k].len);
                n += 1;
                k += 1;
            }
            if k < job.slices.len() {
                let rest = ReadJob {
                    core: job.core.clone(),
                    link: job.link.clone(),
                    slices: job.slices.split_off(k),
                    asked: job.asked,
                };
                jobs.push_front(rest);
            }
            out.push(job);
        }
        self.queued.fetch_sub(n, Ordering::SeqCst);
        out
    }

    /// Takes every READ queued (shutdown).
    pub fn take_all(&self) -> Vec<ReadJob> {
        let mut jobs = crate::sync::lock(&self.jobs);
        self.queued.store(0, Ordering::SeqCst);
        jobs.drain(..).collect()
    }
}

thread_local! {
    /// READs posted on this thread under a plug, by target, in order.
    static STAGED: RefCell<Vec<(Arc<PeerCore>, Vec<Slice>)>> = const { RefCell::new(Vec::new()) };
}

/// Holds a READ to `core` on the calling thread until its plug is
/// flushed ([`take_staged`]).
pub(crate) fn stage(core: &Arc<PeerCore>, slice: Slice) {
    STAGED.with(|s| {
        let mut s = s.borrow_mut();
        match s.last_mut() {
            Some((c, slices)) if Arc::ptr_eq(c, core) => slices.push(slice),
            _ => s.push((core.clone(), vec![slice])),
        }
    })
}

/// The READs staged on the calling thread, by target, for every transport
/// (each goes to its own target's transport).
pub(crate) fn take_staged() -> Vec<(Arc<PeerCore>, Vec<Slice>)> {
    STAGED.with(|s| std::mem::take(&mut *s.borrow_mut()))
}
