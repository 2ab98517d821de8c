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
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, Mutex};

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
/// Reads of a slot a writer holds before giving up (a writer is never
/// inside for long unless its process was stopped or died there).
const READ_TRIES: u32 = 10_000;

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

/// Reads slot `i` under its seqlock; `None` if a writer held it for every
/// try.
fn read_slot(map: &Mapping, i: usize) -> Option<SlotView> {
    let base = HEADER + i * SLOT;
    for _ in 0..READ_TRIES {
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
        std::hint::spin_loop();
    }
    None
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

/// What a peer found for a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The slot of the buffer holding the whole range (maybe not
    /// accessible to peers).
    Found(SlotView),
    /// No registered buffer holds the range.
    Missing,
    /// Not found, but the table is incomplete (it was full), or a slot
    /// could not be read consistently: ask another transport.
    Unknown,
}

/// The peer's side: a read-only mapping and a sorted index of it, rebuilt
/// when the table's epoch changes.
pub struct TableReader {
    map: Mapping,
    slots: usize,
    cache: Mutex<Arc<Sorted>>,
}

/// Live slots sorted by address, as of `epoch`.
#[derive(Default)]
struct Sorted {
    epoch: u64,
    incomplete: bool,
    torn: bool,
    live: Vec<SlotView>,
}

impl TableReader {
    /// Maps a peer's table and checks its header against `nonce` and the
    /// size of the file.
    pub fn open(fd: &OwnedFd, nonce: u64) -> io::Result<TableReader> {
        sys::check_size_sealed(fd)?;
        let size = sys::file_size(fd)? as usize;
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
            cache: Mutex::new(Arc::new(Sorted {
                epoch: u64::MAX,
                ..Sorted::default()
            })),
        })
    }

    fn sorted(&self) -> Arc<Sorted> {
        let epoch = self.map.word(H_EPOCH).load(Ordering::SeqCst);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.epoch != epoch {
            let hwm = (self.map.word(H_HWM).load(Ordering::Acquire) as usize).min(self.slots);
            let mut live = Vec::new();
            let mut torn = false;
            for i in 0..hwm {
                match read_slot(&self.map, i) {
                    Some(v) if v.state & LIVE != 0 => live.push(v),
                    Some(_) => {}
                    None => torn = true,
                }
            }
            live.sort_by_key(|v| v.addr);
            let incomplete = self.map.word(H_INCOMPLETE).load(Ordering::SeqCst) != 0;
            *cache = Arc::new(Sorted {
                epoch,
                incomplete,
                torn,
                live,
            });
        }
        cache.clone()
    }

    /// The slot of the buffer holding `[addr, addr + len)`, read now.
    pub fn lookup(&self, addr: u64, len: u64) -> Lookup {
        let sorted = self.sorted();
        let at = sorted.live.partition_point(|v| v.addr <= addr);
        let candidate = at.checked_sub(1).map(|k| sorted.live[k]);
        if let Some(c) = candidate.filter(|c| c.covers(addr, len)) {
            return match read_slot(&self.map, c.index) {
                Some(v) if v.covers(addr, len) => Lookup::Found(v),
                Some(_) => self.rescan(addr, len),
                None => Lookup::Unknown,
            };
        }
        if sorted.incomplete || sorted.torn {
            Lookup::Unknown
        } else {
            Lookup::Missing
        }
    }

    /// A slot changed since the index was built: look once more, with an
    /// index as of now.
    fn rescan(&self, addr: u64, len: u64) -> Lookup {
        let sorted = self.sorted();
        let found = sorted
            .live
            .iter()
            .find(|v| v.covers(addr, len))
            .and_then(|c| read_slot(&self.map, c.index));
        match found {
            Some(v) if v.covers(addr, len) => Lookup::Found(v),
            _ if sorted.incomplete || sorted.torn => Lookup::Unknown,
            _ => Lookup::Missing,
        }
    }

    /// The table's epoch: it changes whenever a slot does.
    pub fn epoch(&self) -> u64 {
        self.map.word(H_EPOCH).load(Ordering::SeqCst)
    }

    /// The memfd ids the live slots name now.
    pub fn memfd_ids(&self) -> HashSet<u64> {
        self.sorted()
            .live
            .iter()
            .filter_map(|v| v.backing.map(|b| b.id))
            .collect()
    }

    /// Whether `[addr, addr + len)` lies in a live slot backed by memfd
    /// `id` at `offset`: what an initiator claims of a WRITE's source.
    pub fn backs(&self, addr: u64, len: u64, b: &Backing) -> bool {
        match self.lookup(addr, len) {
            Lookup::Found(v) => v.backing.is_some_and(|vb| {
                vb.id == b.id
                    && vb.fd == b.fd
                    && vb.offset.checked_add(addr - v.addr) == Some(b.offset)
            }),
            _ => false,
        }
    }

    /// Whether the slot still holds what `view` saw (same generation): the
    /// buffer was not unregistered since.
    pub fn unchanged(&self, view: &SlotView) -> bool {
        fence(Ordering::SeqCst);
        read_slot(&self.map, view.index).is_some_and(|v| v == *view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(w: &TableWriter) -> TableReader {
        TableReader::open(w.fd(), w.nonce()).unwrap()
    }

    #[test]
    fn a_reader_finds_what_the_writer_registers() {
        let w = TableWriter::new(8, 42).unwrap();
        let r = reader(&w);
        assert_eq!(r.lookup(0x1000, 1), Lookup::Missing);
        assert!(w.register(0x1000, 0x1000, true, None));
        assert!(w.register(0x4000, 0x100, false, None));
        let Lookup::Found(v) = r.lookup(0x1800, 0x800) else {
            panic!("not found")
        };
        assert!(v.accessible());
        assert_eq!((v.addr, v.len), (0x1000, 0x1000));
        assert_eq!(r.lookup(0x1800, 0x801), Lookup::Missing);
        assert_eq!(r.lookup(0xfff, 2), Lookup::Missing);
        assert_eq!(r.lookup(u64::MAX - 1, 8), Lookup::Missing);
        let Lookup::Found(n) = r.lookup(0x4000, 0x100) else {
            panic!("not found")
        };
        assert!(!n.accessible());
    }

    #[test]
    fn unregister_changes_the_generation_a_reader_checks() {
        let w = TableWriter::new(4, 1).unwrap();
        let r = reader(&w);
        w.register(0x1000, 0x1000, true, None);
        let Lookup::Found(v) = r.lookup(0x1000, 8) else {
            panic!()
        };
        assert!(r.unchanged(&v));
        w.unregister(0x1000);
        assert!(!r.unchanged(&v));
        assert_eq!(r.lookup(0x1000, 8), Lookup::Missing);
        // The same range registered again is a new generation.
        w.register(0x1000, 0x1000, true, None);
        let Lookup::Found(again) = r.lookup(0x1000, 8) else {
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
        assert_eq!(r.lookup(0x2000, 1), Lookup::Unknown);
        assert!(matches!(r.lookup(0x1000, 1), Lookup::Found(_)));
        w.unregister(0x2000);
        assert_eq!(r.lookup(0x2000, 1), Lookup::Missing);
        w.unregister(0x1000);
        assert!(w.register(0x2000, 0x10, true, None));
        assert!(matches!(r.lookup(0x2000, 1), Lookup::Found(_)));
    }

    #[test]
    fn peers_cannot_map_the_table_writable_nor_resize_it() {
        let w = TableWriter::new(2, 1).unwrap();
        let len = table_bytes(2);
        assert!(Mapping::new(w.fd(), len, true).is_err());
        let seals = sys::seals(w.fd()).unwrap();
        assert_ne!(seals & libc::F_SEAL_GROW, 0);
        assert_ne!(seals & libc::F_SEAL_SHRINK, 0);
        assert!(TableReader::open(w.fd(), 2).is_err(), "wrong nonce");
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
        let Lookup::Found(v) = r.lookup(0x1800, 8) else {
            panic!()
        };
        assert_eq!(v.backing, Some(b));
        assert_eq!(
            w.backing_of(0x1800, 0x800),
            Some(Backing { offset: 0x900, ..b })
        );
        assert_eq!(w.backing_of(0x1800, 0x801), None);
        assert_eq!(w.backing_of(0x3000, 1), None);
        assert!(r.backs(0x1800, 8, &Backing { offset: 0x900, ..b }));
        assert!(!r.backs(0x1800, 8, &Backing { offset: 0x901, ..b }));
        assert!(!r.backs(
            0x1800,
            8,
            &Backing {
                id: 78,
                offset: 0x900,
                ..b
            }
        ));
        assert_eq!(r.memfd_ids(), [77].into_iter().collect());
        let e = r.epoch();
        assert!(w.unregister(0x1000));
        assert!(!w.unregister(0x3000));
        assert_ne!(r.epoch(), e);
        assert!(r.memfd_ids().is_empty());
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
        let Lookup::Found(v) = r.lookup(0x9000, 1) else {
            panic!()
        };
        assert_eq!(v.index, 0);
    }
}
