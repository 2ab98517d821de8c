//! The registration table a target publishes to its peers: a memfd that
//! the target maps writable and peers map read-only (sealed so), one slot
//! per registered buffer with its range, whether peers may access it, and
//! a generation that changes whenever the slot does. Each slot is written
//! under a seqlock.
//!
//! A peer that READs checks the slot of the target range before its copy
//! and again after: if the buffer was unregistered (or replaced) in
//! between, the generation differs and the READ fails. Unregistering only
//! bumps the generation, so it never waits for a peer.
//!
//! A peer's table is a file the peer made: it may be torn, churning or
//! huge. A reader refuses one above a bound, and only the transport's
//! threads scan one ([`Scan`]), one at a time, within a budget; whatever a
//! scan cannot vouch for is [`Lookup::Unknown`] (another transport).
//!
//! A buffer the engine allocated in a memfd ([`super::alloc`]) names it in
//! its slot (the memfd's id and descriptor number, and the buffer's offset
//! in it): peers map the memfd and copy with memcpy instead of
//! cross-memory attach, and keep the mapping only while a slot names it.
//!
//! Layout (all little-endian u64 words): a header of 8 words (magic,
//! nonce, slots, high-water mark, epoch, incomplete, two spare), then
//! `slots` slots of 8 words (sequence, address, length, state, memfd id,
//! memfd descriptor, offset in the memfd, spare), where state is
//! `generation << 2 | accessible << 1 | live` and a memfd id of 0 means
//! none.

use super::sys::{self, Mapping};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAGIC: u64 = u64::from_le_bytes(*b"TEshmTB1");
const HEADER: usize = 64;
const SLOT: usize = 64;
const H_MAGIC: usize = 0;
const H_NONCE: usize = 8;
const H_SLOTS: usize = 16;
const H_HWM: usize = 24;
const H_EPOCH: usize = 32;
const H_INCOMPLETE: usize = 40;
const LIVE: u64 = 1;
const ACCESSIBLE: u64 = 2;

/// Reads of a slot a writer holds before the slot counts as unreadable
/// (a writer is inside for nanoseconds unless its process was stopped or
/// died there, or is hostile).
const SLOT_TRIES: u32 = 64;
/// Re-reads of held slots in one scan, all slots together: past it, each
/// slot gets one read.
const SCAN_RETRIES: u32 = 4096;
/// Longest one scan of a table may run (65,536 slots take about a
/// millisecond); what it did not reach counts as unreadable.
const SCAN_TIME: Duration = Duration::from_millis(20);
/// Slots between two looks at the clock and the stop flag in a scan.
const SCAN_CHUNK: usize = 1024;

/// Bytes of a table with `slots` slots.
pub fn table_bytes(slots: usize) -> usize {
    HEADER + slots * SLOT
}

/// Where a buffer lives in a memfd of its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backing {
    /// The memfd's id (random, never 0; also in its name).
    pub id: u64,
    /// Its descriptor number in the owner.
    pub fd: i32,
    /// Offset of the buffer's first byte in the memfd.
    pub offset: u64,
}

/// One consistent read of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotView {
    /// Slot index.
    pub index: usize,
    /// First byte of the buffer.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// Generation, accessibility and liveness.
    pub state: u64,
    /// The memfd holding the buffer, if any.
    pub backing: Option<Backing>,
}

impl SlotView {
    /// Whether the slot holds a live buffer covering `[addr, addr + len)`.
    fn covers(&self, addr: u64, len: u64) -> bool {
        self.state & LIVE != 0
            && addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr.saturating_add(self.len))
    }

    /// Whether peers may read and write the buffer.
    pub fn accessible(&self) -> bool {
        self.state & ACCESSIBLE != 0
    }
}

/// Reads slot `i` under its seqlock: once, and again while a writer holds
/// it, up to [`SLOT_TRIES`] reads in all, each read after the first taken
/// from `retries` (a scan's budget, shared by its slots). `None` if the
/// writer held it throughout.
fn read_slot(map: &Mapping, i: usize, retries: &mut u32) -> Option<SlotView> {
    let base = HEADER + i * SLOT;
    for _ in 0..SLOT_TRIES {
        let s1 = map.word(base).load(Ordering::Acquire);
        if s1 & 1 == 0 {
            let addr = map.word(base + 8).load(Ordering::Relaxed);
            let len = map.word(base + 16).load(Ordering::Relaxed);
            let state = map.word(base + 24).load(Ordering::Relaxed);
            let id = map.word(base + 32).load(Ordering::Relaxed);
            let fd = map.word(base + 40).load(Ordering::Relaxed);
            let offset = map.word(base + 48).load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if map.word(base).load(Ordering::Relaxed) == s1 {
                let backing = match (id, i32::try_from(fd)) {
                    (0, _) | (_, Err(_)) => None,
                    (id, Ok(fd)) => Some(Backing { id, fd, offset }),
                };
                return Some(SlotView {
                    index: i,
                    addr,
                    len,
                    state,
                    backing,
                });
            }
        }
        if *retries == 0 {
            return None;
        }
        *retries -= 1;
        std::hint::spin_loop();
    }
    None
}

/// [`read_slot`] of one slot on its own, with all of its tries.
fn read_one(map: &Mapping, i: usize) -> Option<SlotView> {
    let mut tries = SLOT_TRIES;
    read_slot(map, i, &mut tries)
}

/// The target's side: owns the memfd and writes the slots.
pub struct TableWriter {
    map: Mapping,
    fd: OwnedFd,
    nonce: u64,
    slots: usize,
    index: Mutex<Index>,
}

/// Which slot holds which buffer (with its length and backing); free
/// slots, lowest first.
#[derive(Default)]
struct Index {
    by_addr: BTreeMap<u64, (usize, u64, Option<Backing>)>,
    free: BTreeSet<usize>,
    hwm: usize,
    /// Buffers registered while the table was full.
    missing: HashSet<u64>,
}

impl TableWriter {
    /// A new table of `slots` slots, sealed so that peers can only map it
    /// read-only.
    pub fn new(slots: usize, nonce: u64) -> io::Result<TableWriter> {
        let len = table_bytes(slots);
        let fd = sys::memfd(c"te-shm-table", len)?;
        let map = Mapping::new(&fd, len, true)?;
        sys::seal_future_writes(&fd)?;
        map.word(H_MAGIC).store(MAGIC, Ordering::Relaxed);
        map.word(H_NONCE).store(nonce, Ordering::Relaxed);
        map.word(H_SLOTS).store(slots as u64, Ordering::Release);
        Ok(TableWriter {
            map,
            fd,
            nonce,
            slots,
            index: Mutex::default(),
        })
    }

    /// The memfd peers take.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The nonce in the header.
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// Slots in the table.
    pub fn slots(&self) -> usize {
        self.slots
    }

    fn write_slot(&self, i: usize, addr: u64, len: u64, flags: u64, backing: Option<Backing>) {
        let base = HEADER + i * SLOT;
        let seq = self.map.word(base);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let state = self.map.word(base + 24);
        let generation = (state.load(Ordering::Relaxed) >> 2) + 1;
        self.map.word(base + 8).store(addr, Ordering::Relaxed);
        self.map.word(base + 16).store(len, Ordering::Relaxed);
        state.store(generation << 2 | flags, Ordering::Relaxed);
        let (id, fd, offset) = backing.map_or((0, 0, 0), |b| (b.id, b.fd as u64, b.offset));
        self.map.word(base + 32).store(id, Ordering::Relaxed);
        self.map.word(base + 40).store(fd, Ordering::Relaxed);
        self.map.word(base + 48).store(offset, Ordering::Relaxed);
        seq.store(s + 2, Ordering::Release);
    }

    fn bump_epoch(&self) {
        self.map.word(H_EPOCH).fetch_add(1, Ordering::SeqCst);
    }

    /// Publishes a buffer (in a memfd if `backing`). Returns false if the
    /// table is full: the buffer is then missing from it and the header
    /// says the table is incomplete, so peers use another transport for
    /// ranges they cannot find.
    pub fn register(
        &self,
        addr: u64,
        len: u64,
        accessible: bool,
        backing: Option<Backing>,
    ) -> bool {
        let mut ix = self.index.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((i, _, _)) = ix.by_addr.remove(&addr) {
            self.write_slot(i, 0, 0, 0, None);
            ix.free.insert(i);
        }
        let slot = ix.free.pop_first().or_else(|| {
            (ix.hwm < self.slots).then(|| {
                ix.hwm += 1;
                ix.hwm - 1
            })
        });
        let Some(i) = slot else {
            if ix.missing.insert(addr) {
                self.map.word(H_INCOMPLETE).fetch_add(1, Ordering::SeqCst);
                self.bump_epoch();
            }
            return false;
        };
        let flags = LIVE | if accessible { ACCESSIBLE } else { 0 };
        self.write_slot(i, addr, len, flags, backing);
        ix.by_addr.insert(addr, (i, len, backing));
        self.map.word(H_HWM).store(ix.hwm as u64, Ordering::Release);
        self.bump_epoch();
        true
    }

    /// Withdraws the buffer at `addr`: from now on a peer's READ of it
    /// fails, including one whose copy is under way. Returns whether the
    /// buffer was in a memfd (peers may hold a mapping of it to drop).
    pub fn unregister(&self, addr: u64) -> bool {
        let mut ix = self.index.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((i, _, backing)) = ix.by_addr.remove(&addr) {
            self.write_slot(i, 0, 0, 0, None);
            ix.free.insert(i);
            self.bump_epoch();
            backing.is_some()
        } else {
            if ix.missing.remove(&addr) {
                self.map.word(H_INCOMPLETE).fetch_sub(1, Ordering::SeqCst);
                self.bump_epoch();
            }
            false
        }
    }

    /// Where `[addr, addr + len)` lies in a memfd, if it is inside a
    /// published buffer that is in one.
    pub fn backing_of(&self, addr: u64, len: u64) -> Option<Backing> {
        let ix = self.index.lock().unwrap_or_else(|e| e.into_inner());
        let (&base, &(_, blen, backing)) = ix.by_addr.range(..=addr).next_back()?;
        let b = backing?;
        let end = addr.checked_add(len)?;
        (end <= base + blen).then_some(Backing {
            offset: b.offset + (addr - base),
            ..b
        })
    }
}

/// What a hostile process of the same user can do to its own table, for
/// the tests of the peers that read it.
#[cfg(test)]
impl TableWriter {
    /// Leaves slots `range` as if a writer were inside each forever.
    pub fn tear(&self, range: std::ops::Range<usize>) {
        for i in range {
            let seq = self.map.word(HEADER + i * SLOT);
            seq.store(seq.load(Ordering::Relaxed) | 1, Ordering::Release);
        }
        self.bump_epoch();
    }

    /// Claims that slots up to `hwm` were used (writes nothing there).
    pub fn claim_high_water_mark(&self, hwm: usize) {
        self.map.word(H_HWM).store(hwm as u64, Ordering::Release);
        self.bump_epoch();
    }

    /// Says the table changed, without changing it.
    pub fn touch(&self) {
        self.bump_epoch();
    }
}

/// What a peer found for a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The slot of the buffer holding the whole range (maybe not
    /// accessible to peers).
    Found(SlotView),
    /// No registered buffer holds the range.
    Missing,
    /// Not found, but the table is incomplete (it was full), or it could
    /// not be read whole within its budget: ask another transport.
    Unknown,
    /// Not found in an index older than the question, which the asking
    /// thread may not rebuild (a caller's thread never scans): ask again
    /// once a thread of the transport has scanned the table.
    Stale,
}

/// How a thread may bring a peer's index up to date.
#[derive(Clone, Copy)]
pub enum Scan<'a> {
    /// Never: a caller's thread (`getTransferStatus`, `submitTransfer`)
    /// only uses the index as it is.
    Never,
    /// A thread of the transport: scans the table if it changed and no
    /// other thread is scanning it now, and stops early once `stop` is set
    /// (shutdown).
    Try(&'a AtomicBool),
}

/// The peer's side: a read-only mapping and a sorted index of it, rebuilt
/// by the transport's threads when the table's epoch changes, one scan at
/// a time, within a budget.
pub struct TableReader {
    map: Mapping,
    slots: usize,
    /// The process that publishes it (for log lines).
    owner: i32,
    /// The latest index; held only to swap or clone it.
    cache: Mutex<Arc<Sorted>>,
    /// Held by the thread scanning the table (others never wait for it).
    scanning: Mutex<()>,
    /// Scans begun so far (see [`TableReader::scans`]).
    scans: AtomicU64,
}

/// Live slots sorted by address, as of `epoch`.
#[derive(Default)]
struct Sorted {
    epoch: u64,
    /// Which scan built it (0: none yet).
    scan: u64,
    incomplete: bool,
    /// Some slot could not be read, or the scan ran out of its budget.
    partial: bool,
    live: Vec<SlotView>,
}

/// An index of a peer's table, as [`TableReader::index`] gave it.
pub struct PeerIndex<'a> {
    reader: &'a TableReader,
    sorted: Arc<Sorted>,
    /// The table's epoch is still the index's.
    fresh: bool,
}

impl TableReader {
    /// Maps the table of process `owner` and checks its header against
    /// `nonce` and the size of the file; refuses a table of more than
    /// `max_slots` slots (what a peer could make us read and hold).
    pub fn open(fd: &OwnedFd, nonce: u64, owner: i32, max_slots: usize) -> io::Result<TableReader> {
        sys::check_size_sealed(fd)?;
        let size = sys::file_size(fd)?;
        let most = table_bytes(max_slots) as u64;
        if size > most {
            return Err(io::Error::other(format!(
                "the registration table is {size} bytes, more than the \
                 {max_slots} slots (MC_SHM_PEER_TABLE_SLOTS) of {most} bytes a peer may publish"
            )));
        }
        let size = size as usize;
        if size < HEADER {
            return Err(io::Error::other("the registration table is too small"));
        }
        let map = Mapping::new(fd, size, false)?;
        let bad =
            |what: &str| io::Error::other(format!("the registration table's {what} is wrong"));
        if map.word(H_MAGIC).load(Ordering::Relaxed) != MAGIC {
            return Err(bad("magic"));
        }
        if map.word(H_NONCE).load(Ordering::Relaxed) != nonce {
            return Err(bad("nonce"));
        }
        let slots = map.word(H_SLOTS).load(Ordering::Acquire) as usize;
        if slots.checked_mul(SLOT).and_then(|b| b.checked_add(HEADER)) != Some(size) {
            return Err(bad("size"));
        }
        Ok(TableReader {
            map,
            slots,
            owner,
            cache: Mutex::new(Arc::new(Sorted {
                epoch: u64::MAX,
                partial: true,
                ..Sorted::default()
            })),
            scanning: Mutex::new(()),
            scans: AtomicU64::new(0),
        })
    }

    /// Scans begun so far: an index built by a later scan than the value
    /// read before a question was asked answers it, whatever the epoch
    /// says since (the peer registers a buffer before it tells us of it).
    pub fn scans(&self) -> u64 {
        self.scans.load(Ordering::SeqCst)
    }

    /// The index, brought up to date first if `scan` allows it.
    pub fn index(&self, scan: Scan<'_>) -> PeerIndex<'_> {
        let epoch = self.epoch();
        let mut sorted = crate::sync::lock(&self.cache).clone();
        if sorted.epoch != epoch
            && let Scan::Try(stop) = scan
            && let Ok(_scanning) = self.scanning.try_lock()
        {
            sorted = crate::sync::lock(&self.cache).clone();
            if sorted.epoch != self.epoch() {
                sorted = Arc::new(self.rebuild(stop));
                *crate::sync::lock(&self.cache) = sorted.clone();
            }
        }
        PeerIndex {
            fresh: sorted.epoch == self.epoch(),
            reader: self,
            sorted,
        }
    }

    /// Reads every slot up to the high-water mark, within the budgets.
    fn rebuild(&self, stop: &AtomicBool) -> Sorted {
        let scan = self.scans.fetch_add(1, Ordering::SeqCst) + 1;
        let epoch = self.epoch();
        let hwm = (self.map.word(H_HWM).load(Ordering::Acquire) as usize).min(self.slots);
        let start = Instant::now();
        let mut retries = SCAN_RETRIES;
        let mut live = Vec::new();
        let mut partial = false;
        for i in 0..hwm {
            if i % SCAN_CHUNK == 0
                && i > 0
                && (start.elapsed() >= SCAN_TIME || stop.load(Ordering::Relaxed))
            {
                partial = true;
                break;
            }
            match read_slot(&self.map, i, &mut retries) {
                Some(v) if v.state & LIVE != 0 => live.push(v),
                Some(_) => {}
                None => partial = true,
            }
        }
        if partial && !stop.load(Ordering::Relaxed) {
            crate::log_limit::warn_limited!(
                "shm: the registration table of process {} could not be read whole within \
                 its budget ({hwm} slots; a slot stayed mid-update, or {SCAN_TIME:?} passed); \
                 ranges not found in it go over another transport",
                self.owner
            );
        }
        live.sort_by_key(|v| v.addr);
        Sorted {
            epoch,
            scan,
            incomplete: self.map.word(H_INCOMPLETE).load(Ordering::SeqCst) != 0,
            partial,
            live,
        }
    }

    /// The table's epoch: it changes whenever a slot does.
    pub fn epoch(&self) -> u64 {
        self.map.word(H_EPOCH).load(Ordering::SeqCst)
    }

    /// Whether the slot still holds what `view` saw (same generation): the
    /// buffer was not unregistered since.
    pub fn unchanged(&self, view: &SlotView) -> bool {
        fence(Ordering::SeqCst);
        read_one(&self.map, view.index).is_some_and(|v| v == *view)
    }
}

impl PeerIndex<'_> {
    /// The slot of the buffer holding `[addr, addr + len)`, read now, for
    /// a question asked when the table's reader counted `asked` scans
    /// ([`TableReader::scans`]).
    pub fn lookup(&self, addr: u64, len: u64, asked: u64) -> Lookup {
        let live = &self.sorted.live;
        let at = live.partition_point(|v| v.addr <= addr);
        if let Some(c) = at
            .checked_sub(1)
            .map(|k| live[k])
            .filter(|c| c.covers(addr, len))
        {
            match read_one(&self.reader.map, c.index) {
                Some(v) if v.covers(addr, len) => return Lookup::Found(v),
                // Changed since the index was built: the index is stale.
                Some(_) => {}
                None => return Lookup::Unknown,
            }
        } else if self.fresh || self.sorted.scan > asked {
            return if self.sorted.incomplete || self.sorted.partial {
                Lookup::Unknown
            } else {
                Lookup::Missing
            };
        }
        Lookup::Stale
    }

    /// The memfd ids the live slots name, if the index is up to date.
    pub fn memfd_ids(&self) -> Option<HashSet<u64>> {
        (self.fresh && !self.sorted.partial).then(|| {
            self.sorted
                .live
                .iter()
                .filter_map(|v| v.backing.map(|b| b.id))
                .collect()
        })
    }

    /// The epoch the index was built at.
    pub fn epoch(&self) -> u64 {
        self.sorted.epoch
    }

    /// Whether the table has not changed since the index was built.
    pub fn fresh(&self) -> bool {
        self.fresh
    }

    /// Whether `[addr, addr + len)` lies in a live slot backed by memfd
    /// `b.id` at `b.offset`: what an initiator claims of a WRITE's source.
    /// An index that does not show it yet says no (the request is then
    /// copied with cross-memory attach).
    pub fn backs(&self, addr: u64, len: u64, b: &Backing) -> bool {
        match self.lookup(addr, len, u64::MAX) {
            Lookup::Found(v) => v.backing.is_some_and(|vb| {
                vb.id == b.id
                    && vb.fd == b.fd
                    && vb.offset.checked_add(addr - v.addr) == Some(b.offset)
            }),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(w: &TableWriter) -> TableReader {
        TableReader::open(w.fd(), w.nonce(), 0, w.slots()).unwrap()
    }

    static GO: AtomicBool = AtomicBool::new(false);

    /// A thread of the transport's index, brought up to date.
    fn now(r: &TableReader) -> PeerIndex<'_> {
        r.index(Scan::Try(&GO))
    }

    /// A lookup asked now, by a thread of the transport.
    fn look(r: &TableReader, addr: u64, len: u64) -> Lookup {
        let asked = r.scans();
        now(r).lookup(addr, len, asked)
    }

    #[test]
    fn a_reader_finds_what_the_writer_registers() {
        let w = TableWriter::new(8, 42).unwrap();
        let r = reader(&w);
        assert_eq!(look(&r, 0x1000, 1), Lookup::Missing);
        assert!(w.register(0x1000, 0x1000, true, None));
        assert!(w.register(0x4000, 0x100, false, None));
        let Lookup::Found(v) = look(&r, 0x1800, 0x800) else {
            panic!("not found")
        };
        assert!(v.accessible());
        assert_eq!((v.addr, v.len), (0x1000, 0x1000));
        assert_eq!(look(&r, 0x1800, 0x801), Lookup::Missing);
        assert_eq!(look(&r, 0xfff, 2), Lookup::Missing);
        assert_eq!(look(&r, u64::MAX - 1, 8), Lookup::Missing);
        let Lookup::Found(n) = look(&r, 0x4000, 0x100) else {
            panic!("not found")
        };
        assert!(!n.accessible());
    }

    #[test]
    fn unregister_changes_the_generation_a_reader_checks() {
        let w = TableWriter::new(4, 1).unwrap();
        let r = reader(&w);
        w.register(0x1000, 0x1000, true, None);
        let Lookup::Found(v) = look(&r, 0x1000, 8) else {
            panic!()
        };
        assert!(r.unchanged(&v));
        w.unregister(0x1000);
        assert!(!r.unchanged(&v));
        assert_eq!(look(&r, 0x1000, 8), Lookup::Missing);
        // The same range registered again is a new generation.
        w.register(0x1000, 0x1000, true, None);
        let Lookup::Found(again) = look(&r, 0x1000, 8) else {
            panic!()
        };
        assert_eq!(again.index, v.index);
        assert_ne!(again.state, v.state);
        assert!(!r.unchanged(&v));
    }

    #[test]
    fn a_full_table_says_it_is_incomplete() {
        let w = TableWriter::new(1, 1).unwrap();
        let r = reader(&w);
        assert!(w.register(0x1000, 0x10, true, None));
        assert!(!w.register(0x2000, 0x10, true, None));
        assert_eq!(look(&r, 0x2000, 1), Lookup::Unknown);
        assert!(matches!(look(&r, 0x1000, 1), Lookup::Found(_)));
        w.unregister(0x2000);
        assert_eq!(look(&r, 0x2000, 1), Lookup::Missing);
        w.unregister(0x1000);
        assert!(w.register(0x2000, 0x10, true, None));
        assert!(matches!(look(&r, 0x2000, 1), Lookup::Found(_)));
    }

    #[test]
    fn peers_cannot_map_the_table_writable_nor_resize_it() {
        let w = TableWriter::new(2, 1).unwrap();
        let len = table_bytes(2);
        assert!(Mapping::new(w.fd(), len, true).is_err());
        let seals = sys::seals(w.fd()).unwrap();
        assert_ne!(seals & libc::F_SEAL_GROW, 0);
        assert_ne!(seals & libc::F_SEAL_SHRINK, 0);
        assert!(TableReader::open(w.fd(), 2, 0, 2).is_err(), "wrong nonce");
    }

    #[test]
    fn backings_are_published_and_found() {
        let w = TableWriter::new(4, 1).unwrap();
        let r = reader(&w);
        let b = Backing {
            id: 77,
            fd: 5,
            offset: 0x100,
        };
        assert!(w.register(0x1000, 0x1000, true, Some(b)));
        assert!(w.register(0x3000, 0x10, true, None));
        let Lookup::Found(v) = look(&r, 0x1800, 8) else {
            panic!()
        };
        assert_eq!(v.backing, Some(b));
        assert_eq!(
            w.backing_of(0x1800, 0x800),
            Some(Backing { offset: 0x900, ..b })
        );
        assert_eq!(w.backing_of(0x1800, 0x801), None);
        assert_eq!(w.backing_of(0x3000, 1), None);
        assert!(now(&r).backs(0x1800, 8, &Backing { offset: 0x900, ..b }));
        assert!(!now(&r).backs(0x1800, 8, &Backing { offset: 0x901, ..b }));
        assert!(!now(&r).backs(
            0x1800,
            8,
            &Backing {
                id: 78,
                offset: 0x900,
                ..b
            }
        ));
        assert_eq!(now(&r).memfd_ids().unwrap(), [77].into_iter().collect());
        let e = r.epoch();
        assert!(w.unregister(0x1000));
        assert!(!w.unregister(0x3000));
        assert_ne!(r.epoch(), e);
        assert!(now(&r).memfd_ids().unwrap().is_empty());
    }

    #[test]
    fn slots_are_reused_lowest_first() {
        let w = TableWriter::new(4, 1).unwrap();
        let r = reader(&w);
        for k in 0..4 {
            assert!(w.register(0x1000 * (k + 1), 0x10, true, None));
        }
        w.unregister(0x2000);
        w.unregister(0x1000);
        w.register(0x9000, 0x10, true, None);
        let Lookup::Found(v) = look(&r, 0x9000, 1) else {
            panic!()
        };
        assert_eq!(v.index, 0);
    }

    #[test]
    fn a_table_larger_than_the_bound_is_refused() {
        let w = TableWriter::new(64, 9).unwrap();
        let e = TableReader::open(w.fd(), 9, 0, 63).err().expect("refused");
        assert!(e.to_string().contains("MC_SHM_PEER_TABLE_SLOTS"), "{e}");
        assert!(TableReader::open(w.fd(), 9, 0, 64).is_ok());
    }

    #[test]
    fn torn_slots_cost_a_bounded_scan_and_answer_unknown() {
        // Every slot of a full-size table held by a "writer" forever: the
        // scan reads each once or a few times (its retry budget is shared
        // by all), never 10,000 times each.
        let slots = 1 << 16;
        let w = TableWriter::new(slots, 3).unwrap();
        assert!(w.register(0x1000, 0x1000, true, None));
        let r = reader(&w);
        assert!(matches!(look(&r, 0x1000, 8), Lookup::Found(_)));
        w.tear(0..slots);
        w.claim_high_water_mark(slots);
        let t = Instant::now();
        assert_eq!(look(&r, 0x9000, 8), Lookup::Unknown);
        assert_eq!(
            look(&r, 0x1000, 8),
            Lookup::Unknown,
            "its own slot is torn too"
        );
        let took = t.elapsed();
        assert!(took < SCAN_TIME * 3, "two lookups took {took:?}");
        // The same torn table is not scanned again until it changes.
        let scans = r.scans();
        assert_eq!(look(&r, 0x9000, 8), Lookup::Unknown);
        assert_eq!(r.scans(), scans);
        assert!(
            now(&r).memfd_ids().is_none(),
            "no prune from a partial index"
        );
    }

    #[test]
    fn a_scan_stops_at_its_time_budget_and_at_shutdown() {
        let slots = 1 << 20;
        let w = TableWriter::new(slots, 3).unwrap();
        w.tear(0..slots);
        w.claim_high_water_mark(slots);
        let r = reader(&w);
        let t = Instant::now();
        assert_eq!(look(&r, 0x9000, 8), Lookup::Unknown);
        assert!(t.elapsed() < SCAN_TIME * 4, "{:?}", t.elapsed());
        // A set stop flag ends a scan at its first look at it.
        w.touch();
        let stop = AtomicBool::new(true);
        let t = Instant::now();
        let asked = r.scans();
        assert_eq!(
            r.index(Scan::Try(&stop)).lookup(0x9000, 8, asked),
            Lookup::Unknown
        );
        assert!(t.elapsed() < SCAN_TIME, "{:?}", t.elapsed());
    }

    #[test]
    fn a_caller_never_scans_and_a_newer_scan_answers_what_it_asked() {
        let w = TableWriter::new(8, 4).unwrap();
        let r = reader(&w);
        assert_eq!(look(&r, 0x1000, 8), Lookup::Missing);
        assert!(w.register(0x1000, 0x1000, true, None));
        // Asked before any newer scan: the caller's stale index cannot
        // say Missing, and does not scan.
        let asked = r.scans();
        let scans = r.scans();
        let stale = r.index(Scan::Never);
        assert!(!stale.fresh());
        assert_eq!(stale.lookup(0x1000, 8, asked), Lookup::Stale);
        assert_eq!(stale.lookup(0x8000, 8, asked), Lookup::Stale);
        assert!(!stale.backs(
            0x1000,
            8,
            &Backing {
                id: 1,
                fd: 1,
                offset: 0
            }
        ));
        assert_eq!(r.scans(), scans);
        // A thread's scan: now the caller's index answers both.
        assert!(matches!(now(&r).lookup(0x1000, 8, asked), Lookup::Found(_)));
        let later = r.index(Scan::Never);
        assert!(matches!(later.lookup(0x1000, 8, asked), Lookup::Found(_)));
        assert_eq!(later.lookup(0x8000, 8, asked), Lookup::Missing);
        // Changed after the scan, but asked before it: still answered,
        // a buffer the index shows is checked in its slot.
        w.unregister(0x1000);
        let old = r.index(Scan::Never);
        assert!(!old.fresh());
        assert_eq!(old.lookup(0x1000, 8, asked), Lookup::Stale);
        assert_eq!(old.lookup(0x8000, 8, asked), Lookup::Missing);
    }

    #[test]
    fn a_thread_does_not_wait_for_another_one_scanning() {
        let w = TableWriter::new(8, 4).unwrap();
        let r = reader(&w);
        assert!(w.register(0x1000, 0x1000, true, None));
        let asked = r.scans();
        let held = r.scanning.lock().unwrap();
        assert_eq!(now(&r).lookup(0x1000, 8, asked), Lookup::Stale);
        drop(held);
        assert!(matches!(now(&r).lookup(0x1000, 8, asked), Lookup::Found(_)));
    }
}
