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
use super::table::TableReader;
use super::{BATCH, BATCH_BYTES, Shared, sys};
use crate::memory::fence::{Fence, Inside};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Bytes copied per system call while inside the fences.
const CALL_BYTES: u64 = 256 << 10;

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
    table: OnceLock<TableReader>,
    pub maps: PeerMaps,
    /// When the ring was created (ms since start): one the initiator does
    /// not activate within `MC_SHM_TIMEOUT_SEC` is dropped.
    created_ms: u64,
    /// The next position to look at (only this process consumes).
    cursor: Mutex<u64>,
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
            cursor: Mutex::new(parts.ring.first_position()),
            ring: parts.ring,
            _memfd: parts.memfd,
            to_target: parts.to_target,
            to_initiator: parts.to_initiator,
            pidfd: who.pidfd,
            table: OnceLock::new(),
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

    /// Drops our mappings of the initiator's buffers its table no longer
    /// names.
    pub fn prune(&self) {
        if let Some(t) = self.table.get() {
            self.maps.prune(t);
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
    if !s.verified() && !verify(shared, s) {
        return false;
    }
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
    match check_proof(s.initiator, &s.pidfd, addr, s.proof, s.table_at) {
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
            crate::warn_limited!("shm: an attached initiator is refused: {e}");
            s.ring.refuse();
            drop_ring(shared, s);
            false
        }
    }
}

/// Copies each request's bytes from the initiator into our buffer and
/// completes it: by memcpy from our mapping of the initiator's memfd if
/// the source lies in a buffer its table backs with one, else with
/// cross-memory attach. Returns whether the initiator is gone.
fn execute(shared: &Shared, s: &Served, batch: &[Request]) -> bool {
    let table = s.table.get().expect("requests are executed once verified");
    s.maps.prune(table);
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
    // Mapped sources are copied now; the others are cut into pieces of at
    // most CALL_BYTES for cross-memory attach.
    let mut chunks: Vec<(usize, Piece)> = Vec::new();
    for (i, r) in batch.iter().enumerate() {
        let Some(fence) = &fences[i] else {
            continue;
        };
        let mapped = r
            .backing
            .filter(|b| table.backs(r.src, r.len, b))
            .and_then(|b| Some((b.offset, s.maps.get(&s.pidfd, &b, r.len)?)));
        if let Some((offset, map)) = mapped {
            copied[i] = copy_mapped(fence, &map, offset, r.dst, r.len);
            if copied[i] < r.len {
                status[i] = if copied[i] == 0 {
                    Status::Rejected
                } else {
                    Status::Failed
                };
            }
            shared
                .counters
                .mapped
                .fetch_add(copied[i], Ordering::Relaxed);
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

/// Copies `len` bytes from byte `offset` of `map` (checked to hold them) to
/// our `dst`, at most CALL_BYTES at a time inside `fence`; returns the
/// bytes copied (fewer if the buffer was unregistered meanwhile).
fn copy_mapped(fence: &Fence, map: &Mapping, offset: u64, dst: u64, len: u64) -> u64 {
    let mut off = 0;
    while off < len {
        let n = (len - off).min(CALL_BYTES);
        let Some(_inside) = fence.enter() else {
            break;
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
        off += n;
    }
    off
}

/// The target's check of an initiator that activated its ring: the two
/// words at `addr` in process `pid` are `proof`. Then its table.
fn check_proof(
    pid: i32,
    pidfd: &OwnedFd,
    addr: u64,
    proof: [u64; 2],
    table: (i32, u64),
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
    TableReader::open(&fd, table.1).map_err(|e| format!("the table of process {pid}: {e}"))
}
