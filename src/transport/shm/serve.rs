//! The target's side: the rings of attached initiators, and executing the
//! WRITEs posted into them. Each request's destination is checked with the
//! engine's registry before a byte moves, and every copy runs inside the
//! buffer's fence, at most [`CALL_BYTES`] per system call, so
//! unregistering waits for one short copy at most, whatever the initiator
//! does.

use super::cma::{self, CopyError, MAX_IOV, Piece};
use super::ring::{Next, Request, Ring, Side, Status};
use super::{BATCH, BATCH_BYTES, Shared, sys};
use crate::transport::fence::{Fence, Inside};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes copied per system call while inside the fences.
const CALL_BYTES: u64 = 256 << 10;

/// The ring of one attached initiator.
pub(crate) struct Served {
    /// Identifies its descriptors in the poll sets.
    pub id: u64,
    /// The initiator's pid (checked at attach) and the token it proved it
    /// with: one ring per initiator process.
    pub initiator: i32,
    pub token: [u64; 2],
    pub ring: Ring,
    /// The ring's memfd, held open (never read) for the initiator to take.
    _memfd: OwnedFd,
    /// Rung by the initiator when it posts and we sleep.
    pub to_target: OwnedFd,
    /// Rung by us when we complete and the initiator sleeps.
    pub to_initiator: OwnedFd,
    /// Readable once the initiator exited.
    pub pidfd: OwnedFd,
    /// The next position to look at (only this process consumes).
    cursor: Mutex<u64>,
    /// When a request was last claimed (ms since start).
    last_active: AtomicU64,
    gone: AtomicBool,
}

impl Served {
    /// A ring served for `initiator`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        initiator: i32,
        token: [u64; 2],
        ring: Ring,
        memfd: OwnedFd,
        to_target: OwnedFd,
        to_initiator: OwnedFd,
        pidfd: OwnedFd,
        now_ms: u64,
    ) -> Served {
        let cursor = Mutex::new(ring.first_position());
        Served {
            id,
            initiator,
            token,
            ring,
            _memfd: memfd,
            to_target,
            to_initiator,
            pidfd,
            cursor,
            last_active: AtomicU64::new(now_ms),
            gone: AtomicBool::new(false),
        }
    }
}

/// Adds a ring: replaces an older ring of the same initiator, and at
/// `MC_SHM_MAX_PEERS` the least recently active ring gives way. The
/// caller serializes calls.
pub(crate) fn add_ring(shared: &Shared, new: Arc<Served>) -> std::io::Result<()> {
    let rings = shared.served();
    if let Some(old) = rings
        .iter()
        .find(|r| r.initiator == new.initiator && r.token == new.token)
    {
        drop_ring(shared, old);
    } else if rings.len() >= shared.opts.max_peers {
        if let Some(old) = rings
            .iter()
            .min_by_key(|r| r.last_active.load(Ordering::Relaxed))
        {
            crate::warn_limited!(
                "shm: MC_SHM_MAX_PEERS={} rings are served; the least recently \
                 active one (process {}) gives way",
                shared.opts.max_peers,
                old.initiator
            );
            drop_ring(shared, old);
        }
    }
    shared.set_served(|v| v.push(new.clone()));
    let watched = shared
        .watch(&new.to_target, super::poll::Token::Bell(new.id))
        .and_then(|()| {
            shared
                .watch(&new.pidfd, super::poll::Token::Death(new.id))
                .inspect_err(|_| shared.unwatch(&new.to_target))
        });
    if let Err(e) = watched {
        new.gone.store(true, Ordering::Release);
        shared.set_served(|v| v.retain(|r| !Arc::ptr_eq(r, &new)));
        return Err(e);
    }
    shared.kick();
    Ok(())
}

/// Stops serving a ring (its initiator exited or detached, it gave way,
/// or shutdown): the initiator sees it closed.
pub(crate) fn drop_ring(shared: &Shared, s: &Arc<Served>) {
    if s.gone.swap(true, Ordering::AcqRel) {
        return;
    }
    shared.unwatch(&s.to_target);
    shared.unwatch(&s.pidfd);
    shared.set_served(|v| v.retain(|r| !Arc::ptr_eq(r, s)));
    s.ring.close();
    sys::signal(&s.to_initiator);
}

/// Claims the next requests of a ring (if no other thread is at it) and
/// executes them. Returns whether there was anything to do.
pub(crate) fn serve_one(shared: &Shared, s: &Arc<Served>) -> bool {
    if s.gone.load(Ordering::Acquire) {
        return false;
    }
    let Ok(mut cursor) = s.cursor.try_lock() else {
        return false;
    };
    if s.ring.detached() {
        drop(cursor);
        drop_ring(shared, s);
        return true;
    }
    let mut batch = Vec::new();
    let mut bytes = 0u64;
    for _ in 0..s.ring.entries() {
        if batch.len() >= BATCH || bytes >= BATCH_BYTES {
            break;
        }
        match s.ring.claim(*cursor) {
            Next::Claimed(r) => {
                bytes = bytes.saturating_add(r.len);
                batch.push(r);
            }
            Next::Skip => {}
            Next::Empty => break,
        }
        *cursor += 1;
    }
    let more = s.ring.posted(*cursor);
    drop(cursor);
    if batch.is_empty() {
        return false;
    }
    if more {
        shared.kick();
    }
    s.last_active.store(shared.now_ms(), Ordering::Relaxed);
    let gone = execute(shared, s, &batch);
    if s.ring.wake(Side::Initiator) {
        sys::signal(&s.to_initiator);
    }
    if gone {
        drop_ring(shared, s);
    }
    true
}

/// Copies each request's bytes from the initiator into our buffer and
/// completes it. Returns whether the initiator is gone.
fn execute(shared: &Shared, s: &Served, batch: &[Request]) -> bool {
    let fences: Vec<Option<Arc<Fence>>> = batch
        .iter()
        .map(|r| shared.memory.admit(r.dst, r.len))
        .collect();
    let mut status: Vec<Status> = fences
        .iter()
        .map(|f| match f {
            Some(_) => Status::Done,
            None => Status::Rejected,
        })
        .collect();
    let mut copied = vec![0u64; batch.len()];
    // Cut admitted requests into pieces of at most CALL_BYTES.
    let mut chunks: Vec<(usize, Piece)> = Vec::new();
    for (i, r) in batch
        .iter()
        .enumerate()
        .filter(|(i, _)| fences[*i].is_some())
    {
        let mut off = 0;
        while off < r.len {
            let len = (r.len - off).min(CALL_BYTES);
            chunks.push((
                i,
                Piece {
                    local: r.dst + off,
                    remote: r.src + off,
                    len,
                },
            ));
            off += len;
        }
    }
    let mut gone = false;
    let mut start = 0;
    while start < chunks.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < chunks.len()
            && end - start < MAX_IOV
            && (end == start || bytes + chunks[end].1.len <= CALL_BYTES)
        {
            bytes += chunks[end].1.len;
            end += 1;
        }
        let mut inside: Vec<Inside<'_>> = Vec::with_capacity(end - start);
        let mut pieces = Vec::with_capacity(end - start);
        let mut owners = Vec::with_capacity(end - start);
        for &(i, p) in &chunks[start..end] {
            if status[i] != Status::Done {
                continue;
            }
            let fence = fences[i].as_ref().expect("admitted");
            match fence.enter() {
                Some(g) => {
                    inside.push(g);
                    pieces.push(p);
                    owners.push(i);
                }
                // Unregistered meanwhile: the range is no longer ours to
                // give; a request that had copied part of it failed.
                None if copied[i] == 0 => status[i] = Status::Rejected,
                None => status[i] = Status::Failed,
            }
        }
        // SAFETY: each local range lies in a registered, remotely
        // accessible buffer of this process (admitted above) whose fence we
        // are inside, so it is not unregistered during the copy; peers may
        // write it by the engine's contract, as over TCP.
        let results = unsafe { cma::read_from(s.initiator, &pieces) };
        drop(inside);
        for ((i, p), r) in owners.into_iter().zip(&pieces).zip(results) {
            match r {
                Ok(()) => copied[i] += p.len,
                Err(e) => {
                    gone |= e == CopyError::Gone;
                    if status[i] == Status::Done {
                        status[i] = match e {
                            CopyError::Denied => Status::Denied,
                            _ => Status::Failed,
                        };
                    }
                }
            }
        }
        start = end;
    }
    let served: u64 = copied.iter().sum();
    shared.counters.served.fetch_add(served, Ordering::Relaxed);
    for (r, st) in batch.iter().zip(status) {
        s.ring.complete(r.pos, st);
    }
    gone
}
