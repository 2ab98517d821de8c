//! The target's side: the rings of attached initiators, and executing the
//! WRITEs posted into them. Each request's destination is checked with the
//! engine's registry before a byte moves, and every copy runs inside the
//! buffer's fence, at most [`CALL_BYTES`] per system call, so
//! unregistering waits for one short copy at most, whatever the initiator
//! does.

use super::cma::{self, CopyError, MAX_IOV, Piece};
use super::maps::PeerMaps;
use super::ring::{Next, Request, Ring, Side, Status};
use super::sys::Mapping;
use super::table::{Scan, TableReader};
use super::{BATCH, BATCH_BYTES, Shared, sys};
use crate::memory::fence::{Fence, Inside};
use once_cell::sync::OnceCell;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

/// Bytes copied per system call while inside the fences.
const CALL_BYTES: u64 = 256 << 10;
/// A batch of at least this many bytes keeps its thread busy long enough
/// that another should serve the ring's next posts meanwhile.
const LONG_COPY: u64 = 64 << 10;

/// A ring's cursor (the next position to look at) and who holds it: one
/// thread at a time scans a ring; a thread that finds it held asks the
/// holder to scan again before it lets go, so that work it was woken for
/// is never left behind (see [`serve_one`]).
struct Cursor {
    holder: AtomicU8,
    pos: AtomicU64,
}

/// [`Cursor::holder`]: nobody holds it.
const IDLE: u8 = 0;
/// A thread holds it.
const HELD: u8 = 1;
/// A thread holds it, and another asked it to scan once more.
const RESCAN: u8 = 2;

impl Cursor {
    fn new(pos: u64) -> Cursor {
        Cursor {
            holder: AtomicU8::new(IDLE),
            pos: AtomicU64::new(pos),
        }
    }

    /// Takes the cursor and returns its position; `None` if another
    /// thread holds it, which then scans once more before letting go.
    fn take(&self) -> Option<u64> {
        loop {
            match self
                .holder
                .compare_exchange(IDLE, HELD, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Some(self.pos.load(Ordering::Relaxed)),
                Err(HELD) => {
                    if self
                        .holder
                        .compare_exchange(HELD, RESCAN, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        return None;
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Lets the cursor go at `pos`; whether another thread asked for one
    /// more scan meanwhile.
    fn release(&self, pos: u64) -> bool {
        self.pos.store(pos, Ordering::Relaxed);
        self.holder.swap(IDLE, Ordering::SeqCst) == RESCAN
    }
}

/// The ring of one attached initiator.
pub(crate) struct Served {
    /// Identifies its descriptors in the poll sets.
    pub id: u64,
    /// The pid the initiator named; trusted once it is [`Served::verified`].
    pub initiator: i32,
    /// The words the initiator must show in its memory (see
    /// [`super::attach`]), and where its registration table is to be taken.
    proof: [u64; 2],
    table_at: (i32, u64),
    pub ring: Ring,
    /// The ring's memfd, held open (never read) for the initiator to take.
    _memfd: OwnedFd,
    /// Rung by the initiator when it posts and we sleep.
    pub to_target: OwnedFd,
    /// Rung by us when we complete and the initiator sleeps.
    pub to_initiator: OwnedFd,
    /// Readable once the initiator exited.
    pub pidfd: OwnedFd,
    /// The initiator's registration table, taken once the initiator proved
    /// its pid (no request is executed before), and our mappings of its
    /// memfd-backed buffers.
    table: OnceCell<TableReader>,
    pub maps: PeerMaps,
    /// When the ring was created (ms since start): one the initiator does
    /// not activate within `MC_SHM_TIMEOUT_SEC` is dropped.
    created_ms: u64,
    /// The next position to look at, and which thread holds it.
    cursor: Cursor,
    /// When a request was last claimed (ms since start).
    last_active: AtomicU64,
    gone: AtomicBool,
}

/// An initiator, as its attach request names it (unverified).
pub(crate) struct Initiator {
    pub pid: i32,
    pub pidfd: OwnedFd,
    /// The words it must copy into its memory.
    pub proof: [u64; 2],
    /// Its table's descriptor number and nonce.
    pub table: (i32, u64),
}

/// A new ring and its eventfds.
pub(crate) struct RingParts {
    pub ring: Ring,
    pub memfd: OwnedFd,
    pub to_target: OwnedFd,
    pub to_initiator: OwnedFd,
}

impl Served {
    /// A ring served for an initiator; at most `max_mappings` of its
    /// buffers will be mapped.
    pub fn new(
        id: u64,
        who: Initiator,
        parts: RingParts,
        max_mappings: usize,
        now_ms: u64,
    ) -> Served {
        Served {
            id,
            initiator: who.pid,
            proof: who.proof,
            table_at: who.table,
            cursor: Cursor::new(parts.ring.first_position()),
            ring: parts.ring,
            _memfd: parts.memfd,
            to_target: parts.to_target,
            to_initiator: parts.to_initiator,
            pidfd: who.pidfd,
            table: OnceCell::new(),
            maps: PeerMaps::new(max_mappings),
            created_ms: now_ms,
            last_active: AtomicU64::new(now_ms),
            gone: AtomicBool::new(false),
        }
    }

    /// Whether the initiator proved its pid.
    pub fn verified(&self) -> bool {
        self.table.get().is_some()
    }

    /// Brings our index of the initiator's table up to date if it changed
    /// (as `scan` allows), and drops our mappings of the buffers it no
    /// longer names.
    pub fn refresh(&self, scan: Scan<'_>) {
        if let Some(t) = self.table.get()
            && t.epoch() != self.maps.pruned()
        {
            self.maps.prune(&t.index(scan));
        }
    }
}

/// Adds a ring: at `MC_SHM_MAX_PEERS` a ring not activated yet gives way
/// (the oldest), else the least recently active one. The caller
/// serializes calls.
pub(crate) fn add_ring(shared: &Shared, new: Arc<Served>) -> std::io::Result<()> {
    let rings = shared.served();
    if rings.len() >= shared.opts.max_peers {
        let victim = rings
            .iter()
            .filter(|r| !r.verified())
            .min_by_key(|r| r.created_ms)
            .or_else(|| {
                rings
                    .iter()
                    .min_by_key(|r| r.last_active.load(Ordering::Relaxed))
            });
        if let Some(old) = victim {
            crate::log_limit::warn_limited!(
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

/// Claims the next requests of a ring and executes them. Returns whether
/// there was anything to do.
///
/// Why no posted request is left behind with every thread asleep (the
/// sleep protocol is in [`super::worker`]): a request is posted, then the
/// initiator rings the doorbell if a target thread said it sleeps, and
/// every target thread that says so scans every ring once more before it
/// sleeps. So after each post some thread calls this function after the
/// post (woken by the doorbell, or in its last scan before sleeping, or
/// simply in its next pass). Say thread B does, and the cursor is held by
/// thread A:
///
/// 1. B's [`Cursor::take`] fails and leaves the cursor marked RESCAN
///    (compare-and-swap from HELD, or RESCAN already); B returns.
/// 2. A's scan may have passed the new entry's position before the post.
///    A lets go with [`Cursor::release`], which reads RESCAN, since only
///    a release clears the mark and A had not released yet when B set it.
/// 3. So A takes the cursor again and scans once more, after B's mark and
///    so after the post, and sees the request; or its take fails because
///    a third thread C took the cursor after A let go, and C's scan, which
///    begins after that, sees it.
///
/// Before the cursor had this mark, B returned as if the ring were idle
/// and A finished its scan without the new request: both slept, and the
/// request waited for the initiator's stall timeout.
pub(crate) fn serve_one(shared: &Shared, s: &Arc<Served>, scan: Scan<'_>) -> bool {
    if s.gone.load(Ordering::Acquire) {
        return false;
    }
    let Some(mut cursor) = s.cursor.take() else {
        #[cfg(test)]
        super::test_hooks::preempt();
        return false;
    };
    let mut any = false;
    loop {
        if !s.verified() && !verify(shared, s) {
            if !s.cursor.release(cursor) || s.gone.load(Ordering::Acquire) {
                return any;
            }
        } else if s.ring.detached() {
            s.cursor.release(cursor);
            drop_ring(shared, s);
            return true;
        } else {
            let (batch, bytes) = claim_batch(s, &mut cursor);
            if bytes >= LONG_COPY && shared.sleepers.load(Ordering::SeqCst) > 0 {
                // We will be busy a while: the next post wakes another
                // thread (the peer cleared the flag when it rang us).
                s.ring.sleep(Side::Target);
            }
            let more = s.ring.posted(cursor);
            #[cfg(test)]
            super::test_hooks::preempt();
            let rescan = s.cursor.release(cursor);
            if !batch.is_empty() {
                any = true;
                if more {
                    shared.kick();
                }
                s.last_active.store(shared.now_ms(), Ordering::Relaxed);
                let gone = execute(shared, s, &batch, scan);
                if s.ring.wake(Side::Initiator) {
                    sys::signal(&s.to_initiator);
                }
                if gone {
                    drop_ring(shared, s);
                    return true;
                }
            }
            if !rescan {
                return any;
            }
        }
        cursor = match s.cursor.take() {
            Some(c) => c,
            None => return any,
        };
    }
}

/// Claims the requests posted from `cursor` on, at most [`BATCH`] or
/// [`BATCH_BYTES`], and moves the cursor past them; returns them and their
/// bytes.
fn claim_batch(s: &Served, cursor: &mut u64) -> (Vec<Request>, u64) {
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
    (batch, bytes)
}

/// Drops the rings whose initiators did not activate them within
/// `MC_SHM_TIMEOUT_SEC` of the attach (with their descriptors and
/// memory).
pub(crate) fn drop_unactivated(shared: &Shared) {
    let limit = shared.opts.timeout.as_millis() as u64;
    let now = shared.now_ms();
    for s in shared.served().iter() {
        if !s.verified()
            && s.ring.activation().is_none()
            && now.saturating_sub(s.created_ms) > limit
        {
            tracing::debug!(
                "shm: the ring of process {} was not activated in time; dropped",
                s.initiator
            );
            drop_ring(shared, s);
        }
    }
}

/// Checks the proof of a ring's initiator once it activated the ring
/// (then takes its table, and drops an older ring of the same process);
/// refuses the ring if the proof fails, drops it if it was not activated
/// within `MC_SHM_TIMEOUT_SEC`. Returns whether the ring is verified.
fn verify(shared: &Shared, s: &Arc<Served>) -> bool {
    let Some(addr) = s.ring.activation() else {
        if shared.now_ms().saturating_sub(s.created_ms) > shared.opts.timeout.as_millis() as u64 {
            tracing::debug!(
                "shm: the ring of process {} was not activated in time; dropped",
                s.initiator
            );
            drop_ring(shared, s);
        }
        return false;
    };
    let most = shared.opts.peer_table_slots;
    match check_proof(s.initiator, &s.pidfd, addr, s.proof, s.table_at, most) {
        Ok(table) => {
            let _ = s.table.set(table);
            s.ring.accept();
            for old in shared.served().iter() {
                if !Arc::ptr_eq(old, s) && old.initiator == s.initiator && old.verified() {
                    drop_ring(shared, old);
                }
            }
            true
        }
        Err(e) => {
            crate::log_limit::warn_limited!("shm: an attached initiator is refused: {e}");
            s.ring.refuse();
            drop_ring(shared, s);
            false
        }
    }
}

/// One claimed request while it is executed.
struct Job {
    r: Request,
    status: Status,
    copied: u64,
    /// Index in the piece list of its last piece (cross-memory attach).
    last_piece: usize,
    /// Completed in the ring.
    completed: bool,
}

impl Job {
    /// Completes the request in the ring, once.
    fn complete(&mut self, ring: &Ring) {
        if !self.completed {
            self.completed = true;
            ring.complete(self.r.pos, self.status);
        }
    }

    /// The status of a request whose copy stopped after some bytes.
    fn cut_short(&mut self, why: Status) {
        if self.status == Status::Done {
            self.status = match why {
                Status::Rejected if self.copied > 0 => Status::Failed,
                other => other,
            };
        }
    }
}

/// Copies each request's bytes from the initiator into our buffer and
/// completes it: by memcpy from our mapping of the initiator's memfd if
/// the source lies in a buffer its table backs with one, else with
/// cross-memory attach. Each piece is copied inside the destination's
/// fence and while the ring entry says COPYING ([`Ring::begin_copy`]), so
/// a request the initiator withdrew is not copied any further. A request
/// is completed as soon as its last piece is copied. `scan`: whether this
/// thread may bring our index of the initiator's table up to date (a
/// caller's thread does not: with an index older than the table, a source
/// it does not show is copied with cross-memory attach, and a thread is
/// woken to scan). Returns whether the initiator is gone.
fn execute(shared: &Shared, s: &Served, batch: &[Request], scan: Scan<'_>) -> bool {
    let table = s
        .table
        .get()
        .expect("requests are executed once verified")
        .index(scan);
    if !table.fresh() {
        shared.kick();
    }
    s.maps.prune(&table);
    // The destinations' fences, where they are ours to write.
    let fences: Vec<Option<Arc<Fence>>> = batch
        .iter()
        .map(|r| shared.memory.admit(r.dst, r.len))
        .collect();
    let mut jobs: Vec<Job> = batch
        .iter()
        .zip(&fences)
        .map(|(&r, fence)| Job {
            r,
            status: if fence.is_some() {
                Status::Done
            } else {
                Status::Rejected
            },
            copied: 0,
            last_piece: 0,
            completed: false,
        })
        .collect();
    // Mapped sources are copied now; the others are cut into pieces of at
    // most CALL_BYTES for cross-memory attach.
    let mut chunks: Vec<(usize, Piece)> = Vec::new();
    for (i, job) in jobs.iter_mut().enumerate() {
        let Some(fence) = &fences[i] else {
            job.complete(&s.ring);
            continue;
        };
        let r = job.r;
        let mapped = r
            .backing
            .filter(|b| table.backs(r.src, r.len, b))
            .and_then(|b| Some((b.offset, s.maps.get(&s.pidfd, &b, r.len)?)));
        if let Some((offset, map)) = mapped {
            copy_mapped(&s.ring, job, fence, &map, offset);
            let counters = &shared.counters;
            counters.mapped.fetch_add(job.copied, Ordering::Relaxed);
            counters.served.fetch_add(job.copied, Ordering::Relaxed);
            job.complete(&s.ring);
            continue;
        }
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
        job.last_piece = chunks.len().saturating_sub(1);
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
        #[cfg(test)]
        super::test_hooks::hold_before_copy();
        let mut copying: Vec<usize> = Vec::new();
        let mut inside: Vec<Inside<'_>> = Vec::with_capacity(end - start);
        let mut pieces = Vec::with_capacity(end - start);
        let mut owners = Vec::with_capacity(end - start);
        for &(i, p) in &chunks[start..end] {
            let job = &mut jobs[i];
            if job.status != Status::Done {
                continue;
            }
            if copying.last() != Some(&i) {
                if !s.ring.begin_copy(job.r.pos) {
                    job.cut_short(Status::Withdrawn);
                    continue;
                }
                copying.push(i);
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
                None => job.cut_short(Status::Rejected),
            }
        }
        // SAFETY: each local range lies in a registered, remotely
        // accessible buffer of this process (admitted above) whose fence we
        // are inside, so it is not unregistered during the copy; peers may
        // write it by the engine's contract, as over TCP.
        let results = unsafe { cma::read_from(s.initiator, &pieces) };
        drop(inside);
        let mut copied = 0;
        for ((i, p), r) in owners.into_iter().zip(&pieces).zip(results) {
            match r {
                Ok(()) => {
                    jobs[i].copied += p.len;
                    copied += p.len;
                }
                Err(e) => {
                    gone |= e == CopyError::Gone;
                    jobs[i].cut_short(match e {
                        CopyError::Denied => Status::Denied,
                        _ => Status::Failed,
                    });
                }
            }
        }
        // Counted before anything completes, so an initiator that sees its
        // request done sees its bytes counted here.
        shared.counters.served.fetch_add(copied, Ordering::Relaxed);
        // Complete what ended in this group; the others may be withdrawn
        // until their next piece begins.
        let mut seen: Option<usize> = None;
        for &(i, _) in &chunks[start..end] {
            if seen == Some(i) {
                continue;
            }
            seen = Some(i);
            let job = &mut jobs[i];
            if job.status != Status::Done || job.last_piece < end {
                job.complete(&s.ring);
            } else if copying.contains(&i) {
                s.ring.end_copy(job.r.pos);
            }
        }
        start = end;
    }
    for job in &mut jobs {
        job.complete(&s.ring);
    }
    gone
}

/// Copies a request from byte `offset` of `map` (checked to hold it) to
/// our destination, at most CALL_BYTES at a time, each inside `fence` and
/// while the ring entry says COPYING; stops early if the buffer was
/// unregistered or the initiator withdrew the request meanwhile.
fn copy_mapped(ring: &Ring, job: &mut Job, fence: &Fence, map: &Mapping, offset: u64) {
    let (dst, len) = (job.r.dst, job.r.len);
    while job.copied < len {
        let off = job.copied;
        let n = (len - off).min(CALL_BYTES);
        #[cfg(test)]
        super::test_hooks::hold_before_copy();
        if !ring.begin_copy(job.r.pos) {
            return job.cut_short(Status::Withdrawn);
        }
        let Some(inside) = fence.enter() else {
            return job.cut_short(Status::Rejected);
        };
        // SAFETY: the source lies inside the mapping (`PeerMaps::get`
        // checked `offset + len` against its size, and the memfd's size is
        // sealed); the destination lies in a registered, remotely
        // accessible buffer of ours whose fence we are inside. The
        // initiator may write its source meanwhile, as it could while the
        // kernel copies it over TCP.
        unsafe {
            std::ptr::copy_nonoverlapping(
                map.ptr().add((offset + off) as usize),
                (dst + off) as usize as *mut u8,
                n as usize,
            )
        };
        drop(inside);
        job.copied += n;
        if job.copied < len {
            ring.end_copy(job.r.pos);
        }
    }
}

/// The target's check of an initiator that activated its ring: the two
/// words at `addr` in process `pid` are `proof`. Then its table, of at
/// most `max_slots` slots.
fn check_proof(
    pid: i32,
    pidfd: &OwnedFd,
    addr: u64,
    proof: [u64; 2],
    table: (i32, u64),
    max_slots: usize,
) -> Result<TableReader, String> {
    let mut seen = [0u64; 2];
    let piece = Piece {
        local: seen.as_mut_ptr() as u64,
        remote: addr,
        len: 16,
    };
    // SAFETY: `seen` is ours, 16 bytes, and untouched during the call.
    let read = unsafe { cma::read_from(pid, &[piece]) };
    match read[0] {
        Err(e) => return Err(format!("cannot read process {pid}: {e:?}")),
        Ok(()) if seen != proof => {
            return Err(format!(
                "process {pid} here is not the one that attached (another pid namespace?)"
            ));
        }
        Ok(()) => {}
    }
    let fd =
        sys::pidfd_getfd(pidfd, table.0).map_err(|e| format!("the table of process {pid}: {e}"))?;
    TableReader::open(&fd, table.1, pid, max_slots)
        .map_err(|e| format!("the table of process {pid}: {e}"))
}
