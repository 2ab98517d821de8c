//! The request ring one target shares with one initiator: a memfd the
//! target creates and both map, holding the WRITE requests the initiator
//! posts and the target executes.
//!
//! Each entry has one control word, `position << 3 | state`, the request
//! (source in the initiator, destination in the target, length, and where
//! the source lies if in a memfd of the initiator) and the result. The
//! initiator posts request number `p` (positions start at the ring size
//! and grow by one) into entry `p % entries`, once that entry is free, and
//! publishes it by storing `p | POSTED`. The target walks the positions in
//! order with a cursor of its own. At its cursor `c`, it sees in entry
//! `c % entries`: position `c` posted: claim it; position `c` in any other
//! state, or a later position: request `c` was withdrawn, skip it; an
//! earlier position: nothing posted yet, stop.
//!
//! An entry's states, who sets each, and from which (a state that both
//! sides may change is left only by compare-and-swap):
//!
//! ```text
//! state      set by     from
//! FREE       initiator  DONE (it took the result), POSTED (it withdrew)
//! POSTED     initiator  FREE (it posted)
//! CLAIMED    target     POSTED (it claimed), COPYING (between two pieces)
//! COPYING    target     CLAIMED (it begins a piece)
//! WITHDRAWN  initiator  CLAIMED (it withdrew)
//! DONE       target     CLAIMED, COPYING, WITHDRAWN (it completed)
//! ```
//!
//! The target copies a request's bytes only while the entry is COPYING,
//! one piece at a time (at most 256 KiB, see [`super::serve`]), and it
//! enters COPYING only from CLAIMED. The initiator can withdraw a POSTED
//! or CLAIMED request but never a COPYING one. So once a withdrawal has
//! succeeded, the target reads no byte of that request any more: its next
//! attempt to begin a copy fails, and it completes the entry as
//! [`Status::Withdrawn`] without copying. A request being copied is waited
//! for: the wait lasts one piece's copy on a running target, and as long
//! as the target's copying thread is stopped or descheduled otherwise.
//!
//! Wakeups: each side that goes to sleep sets its flag in the header and
//! looks once more for work; the other side, after publishing, clears the
//! flag and rings the sleeper's eventfd if it was set (all with sequential
//! consistency, so one of the two always sees the other).
//!
//! Everything in the ring is written by both processes, so each side reads
//! a request once into its own variables and checks it there.

use super::sys::{self, Mapping};
use super::table::Backing;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: u64 = u64::from_le_bytes(*b"TEshmRG1");
/// Header bytes: one cache line for the constants, one per flag.
const HEADER: usize = 256;
const ENTRY: usize = 64;
const H_MAGIC: usize = 0;
const H_NONCE: usize = 8;
const H_ENTRIES: usize = 16;
/// Two words the target chose: the initiator copies them into its own
/// memory and says where, which proves its pid (see [`super::attach`]).
const H_PROOF: usize = 24;
const H_PROOF_ADDR: usize = 40;
const H_ACTIVE: usize = 48;
/// The target's verdict on the initiator's proof: 0 none yet, 1 refused,
/// 2 accepted.
const H_VERDICT: usize = 56;
const H_TARGET_SLEEPS: usize = 64;
const H_INITIATOR_SLEEPS: usize = 128;
const H_CLOSED: usize = 192;
const H_DETACHED: usize = 200;
/// Requests the target completed so far: the initiator looks for results
/// only when it changed.
const H_COMPLETIONS: usize = 208;

/// States of an entry (the low 3 bits of its control word).
const FREE: u64 = 0;
const POSTED: u64 = 1;
const CLAIMED: u64 = 2;
const DONE: u64 = 3;
const COPYING: u64 = 4;
const WITHDRAWN: u64 = 5;

/// Bytes of a ring of `entries` entries.
pub fn ring_bytes(entries: usize) -> usize {
    HEADER + entries * ENTRY
}

/// How the target ended a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Every byte was copied.
    Done = 0,
    /// The destination is not a registered, remotely accessible range.
    Rejected = 1,
    /// The copy failed (the source was not mapped, for one).
    Failed = 2,
    /// The kernel does not let the target read the initiator.
    Denied = 3,
    /// The initiator withdrew the request before its copy began (or
    /// between two of its pieces).
    Withdrawn = 4,
}

impl Status {
    fn from_word(w: u64) -> Status {
        match w {
            0 => Status::Done,
            1 => Status::Rejected,
            3 => Status::Denied,
            4 => Status::Withdrawn,
            _ => Status::Failed,
        }
    }
}

/// A request as the target claimed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Its position.
    pub pos: u64,
    /// Source address in the initiator.
    pub src: u64,
    /// Destination address in the target.
    pub dst: u64,
    /// Bytes.
    pub len: u64,
    /// Where the source lies in a memfd of the initiator, as it says.
    pub backing: Option<Backing>,
}

/// What the target found at its cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Claimed: the request is the target's to execute and complete.
    Claimed(Request),
    /// The request at the cursor was withdrawn: move on.
    Skip,
    /// Nothing posted at the cursor yet.
    Empty,
}

/// A mapping of a ring; either side.
pub struct Ring {
    map: Mapping,
    entries: u64,
}

impl Ring {
    /// Creates a ring of `entries` entries with `nonce` and `proof` in its
    /// header: the target's side. Returns its memfd too, for the initiator
    /// to take.
    pub fn create(entries: usize, nonce: u64, proof: [u64; 2]) -> io::Result<(Ring, OwnedFd)> {
        let len = ring_bytes(entries);
        let fd = sys::memfd(c"te-shm-ring", len)?;
        sys::seal_seals(&fd)?;
        let map = Mapping::new(&fd, len, true)?;
        map.word(H_MAGIC).store(MAGIC, Ordering::Relaxed);
        map.word(H_NONCE).store(nonce, Ordering::Relaxed);
        map.word(H_PROOF).store(proof[0], Ordering::Relaxed);
        map.word(H_PROOF + 8).store(proof[1], Ordering::Relaxed);
        map.word(H_ENTRIES).store(entries as u64, Ordering::Release);
        Ok((
            Ring {
                map,
                entries: entries as u64,
            },
            fd,
        ))
    }

    /// Maps a ring the target created and checks its header against
    /// `nonce` and the size of the file: the initiator's side.
    pub fn open(fd: &OwnedFd, nonce: u64) -> io::Result<Ring> {
        sys::check_size_sealed(fd)?;
        let size = sys::file_size(fd)? as usize;
        if size < HEADER {
            return Err(io::Error::other("the request ring is too small"));
        }
        let map = Mapping::new(fd, size, true)?;
        let bad = |what: &str| io::Error::other(format!("the request ring's {what} is wrong"));
        if map.word(H_MAGIC).load(Ordering::Relaxed) != MAGIC {
            return Err(bad("magic"));
        }
        if map.word(H_NONCE).load(Ordering::Relaxed) != nonce {
            return Err(bad("nonce"));
        }
        let entries = map.word(H_ENTRIES).load(Ordering::Acquire);
        if entries == 0 || usize::try_from(entries).ok().map(ring_bytes) != Some(size) {
            return Err(bad("size"));
        }
        Ok(Ring { map, entries })
    }

    /// The two words the target chose for the initiator's proof.
    pub fn proof(&self) -> [u64; 2] {
        [
            self.map.word(H_PROOF).load(Ordering::Relaxed),
            self.map.word(H_PROOF + 8).load(Ordering::Relaxed),
        ]
    }

    /// The initiator says where in its memory it copied [`Ring::proof`].
    pub fn activate(&self, proof_addr: u64) {
        self.map
            .word(H_PROOF_ADDR)
            .store(proof_addr, Ordering::Relaxed);
        self.map.word(H_ACTIVE).store(1, Ordering::SeqCst);
    }

    /// Where the initiator says it copied the proof, once it did.
    pub fn activation(&self) -> Option<u64> {
        (self.map.word(H_ACTIVE).load(Ordering::SeqCst) != 0)
            .then(|| self.map.word(H_PROOF_ADDR).load(Ordering::Relaxed))
    }

    /// The target could not verify the initiator: it closes the ring.
    pub fn refuse(&self) {
        self.map.word(H_VERDICT).store(1, Ordering::SeqCst);
        self.close();
    }

    /// The target verified the initiator.
    pub fn accept(&self) {
        self.map.word(H_VERDICT).store(2, Ordering::SeqCst);
    }

    /// The target's verdict on the initiator, once it gave one: whether it
    /// accepted.
    pub fn verdict(&self) -> Option<bool> {
        match self.map.word(H_VERDICT).load(Ordering::SeqCst) {
            0 => None,
            v => Some(v == 2),
        }
    }

    /// Entries in the ring.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// The first position the initiator posts at.
    pub fn first_position(&self) -> u64 {
        self.entries
    }

    fn entry(&self, pos: u64) -> usize {
        HEADER + (pos % self.entries) as usize * ENTRY
    }

    fn control(&self, pos: u64) -> &AtomicU64 {
        self.map.word(self.entry(pos))
    }

    // The initiator's side.

    /// Posts request `pos` if its entry is free; false if the entry still
    /// holds an older request.
    pub fn post(&self, pos: u64, src: u64, dst: u64, len: u64, backing: Option<Backing>) -> bool {
        let e = self.entry(pos);
        if self.map.word(e).load(Ordering::Acquire) & 7 != FREE {
            return false;
        }
        self.map.word(e + 8).store(src, Ordering::Relaxed);
        self.map.word(e + 16).store(dst, Ordering::Relaxed);
        self.map.word(e + 24).store(len, Ordering::Relaxed);
        let (id, fd, offset) = backing.map_or((0, 0, 0), |b| (b.id, b.fd as u64, b.offset));
        self.map.word(e + 40).store(id, Ordering::Relaxed);
        self.map.word(e + 48).store(fd, Ordering::Relaxed);
        self.map.word(e + 56).store(offset, Ordering::Relaxed);
        self.map.word(e).store(pos << 3 | POSTED, Ordering::SeqCst);
        true
    }

    /// Withdraws request `pos` unless the target is copying it or has
    /// completed it. Once this returns [`Withdrawal::Free`] or
    /// [`Withdrawal::Held`], the target reads no byte of the request.
    pub fn withdraw(&self, pos: u64) -> Withdrawal {
        let c = self.control(pos);
        loop {
            let w = c.load(Ordering::SeqCst);
            let (to, then) = match (w >> 3 == pos, w & 7) {
                (true, POSTED) => (FREE, Withdrawal::Free),
                (true, CLAIMED) => (WITHDRAWN, Withdrawal::Held),
                (true, COPYING) => return Withdrawal::Copying,
                (true, DONE) => return Withdrawal::Done,
                // Withdrawn already, or not ours (the entry moved on).
                _ => return Withdrawal::Held,
            };
            if c.compare_exchange(w, pos << 3 | to, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return then;
            }
        }
    }

    /// The result of request `pos` if the target completed it; the entry
    /// is free again then.
    pub fn take(&self, pos: u64) -> Option<Status> {
        let c = self.control(pos);
        if c.load(Ordering::Acquire) != pos << 3 | DONE {
            return None;
        }
        let status = Status::from_word(self.map.word(self.entry(pos) + 32).load(Ordering::Relaxed));
        c.store(pos << 3 | FREE, Ordering::Release);
        Some(status)
    }

    // The target's side.

    /// Looks at position `cursor` and claims the request there if posted.
    pub fn claim(&self, cursor: u64) -> Next {
        let c = self.control(cursor);
        let w = c.load(Ordering::SeqCst);
        let (pos, state) = (w >> 3, w & 7);
        if pos < cursor {
            return Next::Empty;
        }
        if pos > cursor || state != POSTED {
            return Next::Skip;
        }
        if c.compare_exchange(w, cursor << 3 | CLAIMED, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Next::Skip;
        }
        let e = self.entry(cursor);
        let word = |off: usize| self.map.word(e + off).load(Ordering::Relaxed);
        let backing = match (word(40), i32::try_from(word(48))) {
            (0, _) | (_, Err(_)) => None,
            (id, Ok(fd)) => Some(Backing {
                id,
                fd,
                offset: word(56),
            }),
        };
        Next::Claimed(Request {
            pos: cursor,
            src: word(8),
            dst: word(16),
            len: word(24),
            backing,
        })
    }

    /// Begins a copy of (a piece of) claimed request `pos`: false if the
    /// initiator withdrew it, which then must not be copied.
    pub fn begin_copy(&self, pos: u64) -> bool {
        self.control(pos)
            .compare_exchange(
                pos << 3 | CLAIMED,
                pos << 3 | COPYING,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
    }

    /// Ends a copy that [`Ring::begin_copy`] began, with more pieces to
    /// come: the initiator may withdraw the request again.
    pub fn end_copy(&self, pos: u64) {
        self.control(pos)
            .store(pos << 3 | CLAIMED, Ordering::SeqCst);
    }

    /// Completes a claimed request (claimed, being copied, or withdrawn).
    pub fn complete(&self, pos: u64, status: Status) {
        let e = self.entry(pos);
        self.map
            .word(e + 32)
            .store(status as u64, Ordering::Relaxed);
        self.map.word(e).store(pos << 3 | DONE, Ordering::SeqCst);
        self.map.word(H_COMPLETIONS).fetch_add(1, Ordering::SeqCst);
    }

    /// How many requests the target has completed: read before looking
    /// for results, a later value says there may be new ones.
    pub fn completions(&self) -> u64 {
        self.map.word(H_COMPLETIONS).load(Ordering::SeqCst)
    }

    // Sleeping and waking, either side.

    fn flag(&self, side: Side) -> &AtomicU64 {
        self.map.word(match side {
            Side::Target => H_TARGET_SLEEPS,
            Side::Initiator => H_INITIATOR_SLEEPS,
        })
    }

    /// `side` is about to sleep: after this, look for work once more.
    pub fn sleep(&self, side: Side) {
        self.flag(side).store(1, Ordering::SeqCst);
    }

    /// Whether `side` said it sleeps; clears the flag. The caller rings its
    /// eventfd if so.
    pub fn wake(&self, side: Side) -> bool {
        let f = self.flag(side);
        f.load(Ordering::SeqCst) != 0 && f.swap(0, Ordering::SeqCst) != 0
    }

    /// Marks the ring closed by the target (it no longer serves it).
    pub fn close(&self) {
        self.map.word(H_CLOSED).store(1, Ordering::SeqCst);
    }

    /// Whether the target closed the ring.
    pub fn closed(&self) -> bool {
        self.map.word(H_CLOSED).load(Ordering::SeqCst) != 0
    }

    /// Marks the ring given up by the initiator (it posts no more).
    pub fn detach(&self) {
        self.map.word(H_DETACHED).store(1, Ordering::SeqCst);
    }

    /// Whether the initiator gave the ring up.
    pub fn detached(&self) -> bool {
        self.map.word(H_DETACHED).load(Ordering::SeqCst) != 0
    }

    /// Whether a request is posted at `cursor` (the target's peek).
    pub fn posted(&self, cursor: u64) -> bool {
        self.control(cursor).load(Ordering::Relaxed) == cursor << 3 | POSTED
    }
}

/// What [`Ring::withdraw`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// Withdrawn before the target claimed it: the entry is free.
    Free,
    /// Withdrawn after the target claimed it (or earlier): the entry stays
    /// busy until the target completes it as [`Status::Withdrawn`].
    Held,
    /// The target is copying it: not withdrawn; wait.
    Copying,
    /// Completed: take its result.
    Done,
}

/// Which side of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The process that executes the requests.
    Target,
    /// The process that posts them.
    Initiator,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(entries: usize) -> (Ring, Ring) {
        let (t, fd) = Ring::create(entries, 9, [1, 2]).unwrap();
        let i = Ring::open(&fd, 9).unwrap();
        (t, i)
    }

    #[test]
    fn a_request_goes_round() {
        let (t, i) = pair(4);
        let p = i.first_position();
        assert_eq!(t.claim(p), Next::Empty);
        assert!(i.post(p, 1, 2, 3, None));
        assert_eq!(i.take(p), None);
        let Next::Claimed(r) = t.claim(p) else {
            panic!()
        };
        assert_eq!(
            r,
            Request {
                pos: p,
                src: 1,
                dst: 2,
                len: 3,
                backing: None
            }
        );
        assert!(!i.post(p + 4, 0, 0, 0, None), "the entry is busy");
        assert!(t.begin_copy(p));
        t.complete(p, Status::Rejected);
        assert_eq!(i.withdraw(p), Withdrawal::Done);
        assert_eq!(i.take(p), Some(Status::Rejected));
        let b = Backing {
            id: 5,
            fd: 6,
            offset: 7,
        };
        assert!(i.post(p + 4, 0, 0, 0, Some(b)));
        assert!(matches!(t.claim(p + 4), Next::Claimed(r) if r.backing == Some(b)));
    }

    #[test]
    fn withdrawn_requests_are_skipped_even_once_reused() {
        let (t, i) = pair(2);
        let p = i.first_position();
        assert!(i.post(p, 1, 1, 1, None));
        assert!(i.post(p + 1, 2, 2, 2, None));
        assert_eq!(i.withdraw(p), Withdrawal::Free);
        // The freed entry takes the request two positions on.
        assert!(i.post(p + 2, 3, 3, 3, None));
        assert_eq!(t.claim(p), Next::Skip);
        assert!(matches!(t.claim(p + 1), Next::Claimed(r) if r.src == 2));
        assert!(matches!(t.claim(p + 2), Next::Claimed(r) if r.src == 3));
        assert_eq!(t.claim(p + 3), Next::Empty);
    }

    #[test]
    fn a_claimed_request_is_withdrawn_between_pieces_never_during_one() {
        let (t, i) = pair(4);
        let p = i.first_position();
        assert!(i.post(p, 1, 2, 3, None));
        assert!(matches!(t.claim(p), Next::Claimed(_)));
        // The target copies a piece: the initiator must wait.
        assert!(t.begin_copy(p));
        assert_eq!(i.withdraw(p), Withdrawal::Copying);
        assert!(!t.begin_copy(p), "one copy at a time");
        // Between two pieces the initiator wins, and the target copies
        // nothing more.
        t.end_copy(p);
        assert_eq!(i.withdraw(p), Withdrawal::Held);
        assert_eq!(i.withdraw(p), Withdrawal::Held, "withdrawn already");
        assert!(!t.begin_copy(p));
        assert!(!i.post(p + 4, 0, 0, 0, None), "busy until completed");
        assert_eq!(i.take(p), None);
        t.complete(p, Status::Withdrawn);
        assert_eq!(i.take(p), Some(Status::Withdrawn));
        assert!(i.post(p + 4, 0, 0, 0, None));
        // Withdrawn before any piece: never copied at all.
        assert!(matches!(t.claim(p + 1), Next::Empty));
        assert!(i.post(p + 1, 1, 2, 3, None));
        assert!(matches!(t.claim(p + 1), Next::Claimed(_)));
        assert_eq!(i.withdraw(p + 1), Withdrawal::Held);
        assert!(!t.begin_copy(p + 1));
    }

    #[test]
    fn sleep_flags_are_taken_once() {
        let (t, i) = pair(2);
        assert!(!i.wake(Side::Target));
        t.sleep(Side::Target);
        assert!(i.wake(Side::Target));
        assert!(!i.wake(Side::Target));
        assert!(!t.closed());
        t.close();
        assert!(i.closed());
        assert!(!t.detached());
        i.detach();
        assert!(t.detached());
        assert_eq!(i.proof(), [1, 2]);
        assert_eq!(t.activation(), None);
        i.activate(0x1234);
        assert_eq!(t.activation(), Some(0x1234));
        assert_eq!(i.verdict(), None);
        t.accept();
        assert_eq!(i.verdict(), Some(true));
        t.refuse();
        assert!(i.verdict() == Some(false) && i.closed());
    }

    #[test]
    fn a_ring_with_another_nonce_or_size_is_refused() {
        let (_t, fd) = Ring::create(4, 9, [0, 0]).unwrap();
        assert!(Ring::open(&fd, 8).is_err());
        let other = sys::memfd(c"x", 4096).unwrap();
        assert!(Ring::open(&other, 0).is_err());
        // A ring whose size is not sealed could be truncated under us.
        let unsealed: OwnedFd = {
            // SAFETY: a plain system call; the descriptor is new and ours.
            let fd = unsafe { libc::memfd_create(c"y".as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0);
            // SAFETY: as above.
            unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }
        };
        let raw = std::os::fd::AsRawFd::as_raw_fd(&unsealed);
        // SAFETY: a plain system call on our descriptor.
        let truncated = unsafe { libc::ftruncate(raw, ring_bytes(4) as i64) };
        assert_eq!(truncated, 0);
        let err = Ring::open(&unsealed, 9).err().unwrap();
        assert!(err.to_string().contains("sealed"), "{err}");
    }
}
