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
//! Layout (all little-endian u64 words): a header of 8 words (magic,
//! nonce, slots, high-water mark, epoch, incomplete, two spare), then
//! `slots` slots of 4 words (sequence, address, length, state), where
//! state is `generation << 2 | accessible << 1 | live`.

use super::sys::{self, Mapping};
use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, Mutex};

const MAGIC: u64 = u64::from_le_bytes(*b"TEshmTB1");
const HEADER: usize = 64;
const SLOT: usize = 32;
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
            fence(Ordering::Acquire);
            if map.word(base).load(Ordering::Relaxed) == s1 {
                return Some(SlotView {
                    index: i,
                    addr,
                    len,
                    state,
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

/// Which slot holds which buffer; free slots, lowest first.
#[derive(Default)]
struct Index {
    by_addr: HashMap<u64, usize>,
    free: std::collections::BTreeSet<usize>,
    hwm: usize,
    /// Buffers registered while the table was full.
    missing: std::collections::HashSet<u64>,
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

    fn write_slot(&self, i: usize, addr: u64, len: u64, flags: u64) {
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
        seq.store(s + 2, Ordering::Release);
    }

    fn bump_epoch(&self) {
        self.map.word(H_EPOCH).fetch_add(1, Ordering::SeqCst);
    }

    /// Publishes a buffer. Returns false if the table is full: the buffer
    /// is then missing from it and the header says the table is
    /// incomplete, so peers use another transport for ranges they cannot
    /// find.
    pub fn register(&self, addr: u64, len: u64, accessible: bool) -> bool {
        let mut ix = self.index.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = ix.by_addr.get(&addr) {
            self.write_slot(i, 0, 0, 0);
            ix.by_addr.remove(&addr);
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
        self.write_slot(i, addr, len, flags);
        ix.by_addr.insert(addr, i);
        self.map.word(H_HWM).store(ix.hwm as u64, Ordering::Release);
        self.bump_epoch();
        true
    }

    /// Withdraws the buffer at `addr`: from now on a peer's READ of it
    /// fails, including one whose copy is under way.
    pub fn unregister(&self, addr: u64) {
        let mut ix = self.index.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = ix.by_addr.remove(&addr) {
            self.write_slot(i, 0, 0, 0);
            ix.free.insert(i);
            self.bump_epoch();
        } else if ix.missing.remove(&addr) {
            self.map.word(H_INCOMPLETE).fetch_sub(1, Ordering::SeqCst);
            self.bump_epoch();
        }
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
        assert!(w.register(0x1000, 0x1000, true));
        assert!(w.register(0x4000, 0x100, false));
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
        w.register(0x1000, 0x1000, true);
        let Lookup::Found(v) = r.lookup(0x1000, 8) else {
            panic!()
        };
        assert!(r.unchanged(&v));
        w.unregister(0x1000);
        assert!(!r.unchanged(&v));
        assert_eq!(r.lookup(0x1000, 8), Lookup::Missing);
        // The same range registered again is a new generation.
        w.register(0x1000, 0x1000, true);
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
        assert!(w.register(0x1000, 0x10, true));
        assert!(!w.register(0x2000, 0x10, true));
        assert_eq!(r.lookup(0x2000, 1), Lookup::Unknown);
        assert!(matches!(r.lookup(0x1000, 1), Lookup::Found(_)));
        w.unregister(0x2000);
        assert_eq!(r.lookup(0x2000, 1), Lookup::Missing);
        w.unregister(0x1000);
        assert!(w.register(0x2000, 0x10, true));
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
    fn slots_are_reused_lowest_first() {
        let w = TableWriter::new(4, 1).unwrap();
        let r = reader(&w);
        for k in 0..4 {
            assert!(w.register(0x1000 * (k + 1), 0x10, true));
        }
        w.unregister(0x2000);
        w.unregister(0x1000);
        w.register(0x9000, 0x10, true);
        let Lookup::Found(v) = r.lookup(0x9000, 1) else {
            panic!()
        };
        assert_eq!(v.index, 0);
    }
}
