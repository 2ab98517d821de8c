//! The cache of remote segments: name <-> id <-> descriptor. Ids start at 1
//! and are never reused; 0 is the engine's own segment.

use crate::log_limit::LogLimit;
use crate::metadata::descriptor::SegmentDesc;
use crate::sync;
use once_cell::sync::OnceCell;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// A remote segment as this engine knows it.
#[derive(Debug, Default)]
pub struct RemoteSegment {
    /// The name it was opened by.
    pub name: String,
    /// The name its owner answers to, which proofs of authentication are
    /// bound to on every port: in P2P mode the opened name as `host:port`
    /// (the handshake port filled in, as the connection goes there), with
    /// a store the name itself.
    pub identity: String,
    /// Its descriptor.
    pub desc: SegmentDesc,
    /// Host of its data server and handshake listener (the name's host in
    /// P2P mode, the peer's published RPC address with a store).
    pub data_host: String,
    /// Port of its handshake listener.
    pub rpc_port: u16,
    /// What transports worked out about reaching it (their rails).
    pub routes: RouteCache,
    /// Whether its descriptor should be refetched before the next use.
    pub freshness: Freshness,
    /// Its peer's slot in the engine's per-peer task statistics, once
    /// looked up (`TaskStats::peer_slot`).
    pub stats_peer: OnceCell<u32>,
    /// The transport that carries its data now, shared by every
    /// descriptor of the name (a refetch keeps it).
    pub carrier: Arc<Carrier>,
}

/// Which transport carries a segment's data now: its index in the
/// transport table, as the engine last saw a request go (none before the
/// first). The engine sets it where it hands a request to a transport,
/// and logs its changes at most once per interval per segment.
#[derive(Default)]
pub struct Carrier(AtomicUsize, LogLimit);

impl std::fmt::Debug for Carrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Carrier").field(&self.get()).finish()
    }
}

impl Carrier {
    /// The transport's index, if a request went to the segment yet.
    pub fn get(&self) -> Option<usize> {
        self.0.load(Ordering::Acquire).checked_sub(1)
    }

    /// Whether to log a change now ([`LogLimit::admit`]: with how many
    /// were not logged since the last that was).
    pub fn admit_log(&self) -> Option<u64> {
        self.1.admit()
    }

    /// Records the transport at `index`; returns what it replaced, or
    /// `None` when the segment was carried by it already (one caller sees
    /// each change).
    pub fn set(&self, index: usize) -> Option<Option<usize>> {
        let new = index + 1;
        let old = self.0.load(Ordering::Acquire);
        if old == new {
            return None;
        }
        self.0
            .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|old| old.checked_sub(1))
    }
}

/// Slots of a [`RouteCache`]: one per transport of the transport table
/// (which checks that it fits), and the last for the scheduler's test
/// carrier.
pub const ROUTE_SLOTS: usize = 8;

/// What transports work out about a segment on first use (a
/// scheduler's rails to it, the shared-memory peer), one slot per
/// transport, by its index in the transport table; a refetched descriptor
/// is a new segment with an empty cache. The slots are opaque here: each
/// transport fills its own and reads it back as its own type.
#[derive(Default)]
pub struct RouteCache {
    slots: [RouteSlot; ROUTE_SLOTS],
}

impl RouteCache {
    /// The slot of the transport at `index` of the transport table.
    ///
    /// # Panics
    /// If `index` is not below [`ROUTE_SLOTS`] (the table has a
    /// compile-time check against that).
    pub fn slot(&self, index: usize) -> &RouteSlot {
        &self.slots[index]
    }
}

impl std::fmt::Debug for RouteCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteCache").finish_non_exhaustive()
    }
}

/// One transport's slot in a [`RouteCache`]: a value of the transport's
/// own type, made on first use and kept for the segment's life.
#[derive(Default)]
pub struct RouteSlot(OnceCell<Arc<dyn Any + Send + Sync>>);

impl RouteSlot {
    /// The slot's value, made by `init` on first use (one caller makes it,
    /// callers at the same time wait for it); `None` when the slot holds a
    /// value of another type than `T` (two transports filling one slot: a
    /// bug).
    pub fn get_or_init<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Option<&T> {
        self.cell(init).downcast_ref()
    }

    /// As [`RouteSlot::get_or_init`], sharing the value.
    pub fn get_or_init_arc<T: Any + Send + Sync>(
        &self,
        init: impl FnOnce() -> T,
    ) -> Option<Arc<T>> {
        Arc::downcast(self.cell(init).clone()).ok()
    }

    /// The slot's value if it was made, without making it.
    pub fn get_arc<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        Arc::downcast(self.0.get()?.clone()).ok()
    }

    /// Whether its transport filled it.
    pub fn is_set(&self) -> bool {
        self.0.get().is_some()
    }

    fn cell<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> &Arc<dyn Any + Send + Sync> {
        self.0.get_or_init(|| Arc::new(init()))
    }
}

/// Shortest interval between refetches of a failing peer's descriptor.
const REFETCH_INTERVAL: Duration = Duration::from_secs(5);

/// Tracks whether a peer's descriptor may be stale: a transfer to it
/// failed since it was fetched; and when a fetch of it last found nothing
/// new.
#[derive(Debug, Default)]
pub struct Freshness {
    stale: AtomicBool,
    refetched: Mutex<Option<Instant>>,
    /// When the last fetch that found this descriptor unchanged (or
    /// failed) began.
    nothing_new: Mutex<Option<Instant>>,
}

impl Freshness {
    /// A transfer to the peer failed: it may have restarted.
    pub fn mark_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// Whether to refetch the peer's descriptor now: a transfer failed
    /// since it was fetched, and no refetch for that happened in the last
    /// few seconds (so a peer that stays unreachable, its connects timing
    /// out, does not make every submit wait on it); one that found the
    /// peer down does not count ([`Freshness::peer_down`]).
    pub fn take_refetch(&self) -> bool {
        if !self.stale.swap(false, Ordering::AcqRel) {
            return false;
        }
        let mut last = sync::lock(&self.refetched);
        if last.is_some_and(|t| t.elapsed() < REFETCH_INTERVAL) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// The refetch found the peer down (its handshake listener refused
    /// the connection): that cost no wait, so the next failure may
    /// refetch at once, and a peer back on its name is found by the next
    /// transfer.
    pub fn peer_down(&self) {
        *sync::lock(&self.refetched) = None;
    }

    /// The descriptor was refetched unchanged.
    pub fn refreshed(&self) {
        self.stale.store(false, Ordering::Release);
    }

    /// A fetch begun at `at` found the descriptor unchanged, or failed.
    pub fn found_nothing_new(&self, at: Instant) {
        *sync::lock(&self.nothing_new) = Some(at);
    }

    /// How long a fetch that only looks for ranges this descriptor does
    /// not list must still wait: until `gap` after the beginning of the
    /// last fetch that found nothing new.
    pub fn lookup_delay(&self, gap: Duration) -> Duration {
        sync::lock(&self.nothing_new).map_or(Duration::ZERO, |at| gap.saturating_sub(at.elapsed()))
    }
}

/// One buffer of a segment, as `te_segment_buffers` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentBuffer {
    /// Start address in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// `cpu:N`, `cuda:N` or `*`; empty when the owner does not publish it
    /// (a TCP descriptor names the owner, not the location, per buffer).
    pub location: String,
}

impl RemoteSegment {
    /// The buffers its descriptor publishes, in descriptor order;
    /// `located`: whether its layout names each buffer by its location
    /// (RDMA's) rather than by its owner (TCP's).
    pub fn buffers(&self, located: bool) -> Vec<SegmentBuffer> {
        self.desc
            .buffers
            .iter()
            .map(|b| SegmentBuffer {
                addr: b.addr,
                length: b.length,
                location: if located {
                    b.name.clone()
                } else {
                    String::new()
                },
            })
            .collect()
    }

    /// Whether the descriptor's buffers hold all of `[addr, addr + len)`:
    /// one buffer, or adjacent ones with no gap between them.
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        self.desc.covering(addr, len).is_some()
    }
}

#[derive(Default)]
struct Table {
    by_name: HashMap<String, i32>,
    by_id: HashMap<i32, Arc<RemoteSegment>>,
    next_id: i32,
}

/// Name <-> id <-> descriptor of opened remote segments.
#[derive(Default)]
pub struct SegmentCache {
    table: RwLock<Table>,
}

impl SegmentCache {
    /// The id of a cached name.
    pub fn id_of(&self, name: &str) -> Option<i32> {
        sync::read(&self.table).by_name.get(name).copied()
    }

    /// The segment behind an id.
    pub fn get(&self, id: i32) -> Option<Arc<RemoteSegment>> {
        sync::read(&self.table).by_id.get(&id).cloned()
    }

    /// Stores a segment: a cached name keeps its id and its carrier, and
    /// gets the new descriptor; a new name gets the next id.
    pub fn insert(&self, mut seg: RemoteSegment) -> i32 {
        let mut t = sync::write(&self.table);
        let id = match t.by_name.get(&seg.name) {
            Some(&id) => {
                if let Some(old) = t.by_id.get(&id) {
                    seg.carrier = old.carrier.clone();
                }
                id
            }
            None => {
                t.next_id += 1;
                let id = t.next_id;
                t.by_name.insert(seg.name.clone(), id);
                id
            }
        };
        t.by_id.insert(id, Arc::new(seg));
        id
    }

    /// Forgets a name and its id.
    pub fn remove(&self, name: &str) {
        let mut t = sync::write(&self.table);
        if let Some(id) = t.by_name.remove(name) {
            t.by_id.remove(&id);
        }
    }

    /// Every cached name.
    pub fn names(&self) -> Vec<String> {
        sync::read(&self.table).by_name.keys().cloned().collect()
    }

    /// How many cached segments have slot `index` of their route cache
    /// filled: the peers whose route the transport at `index` has set up.
    pub fn routed_by(&self, index: usize) -> usize {
        sync::read(&self.table)
            .by_id
            .values()
            .filter(|s| s.routes.slot(index).is_set())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(name: &str, port: u16) -> RemoteSegment {
        RemoteSegment {
            name: name.into(),
            desc: SegmentDesc {
                name: name.into(),
                tcp_data_port: port,
                ..Default::default()
            },
            data_host: "127.0.0.1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_lookup_that_found_nothing_new_spaces_the_next() {
        let f = Freshness::default();
        let hour = Duration::from_secs(3600);
        assert_eq!(f.lookup_delay(hour), Duration::ZERO, "no lookup yet");
        f.found_nothing_new(Instant::now());
        let d = f.lookup_delay(hour);
        assert!(d > hour - Duration::from_secs(60) && d <= hour, "{d:?}");
        assert_eq!(f.lookup_delay(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn a_route_slot_is_made_once_and_read_back_as_its_type() {
        let slot = RouteSlot::default();
        assert_eq!(slot.get_or_init(|| 7u32), Some(&7));
        assert_eq!(slot.get_or_init(|| 8u32), Some(&7), "made once");
        assert_eq!(slot.get_or_init_arc(|| 9u32).as_deref(), Some(&7));
        assert!(slot.get_or_init(|| "other").is_none(), "another type");
    }

    #[test]
    fn a_carrier_reports_each_change_once() {
        let c = Carrier::default();
        assert_eq!(c.get(), None);
        assert_eq!(c.set(1), Some(None), "the first");
        assert_eq!(c.set(1), None, "no change");
        assert_eq!(c.set(0), Some(Some(1)));
        assert_eq!(c.get(), Some(0));
    }

    #[test]
    fn ids_are_stable_and_never_reused() {
        let c = SegmentCache::default();
        let a = c.insert(seg("a", 1));
        let b = c.insert(seg("b", 2));
        assert_eq!((a, b), (1, 2));
        c.get(1).unwrap().carrier.set(2);
        assert_eq!(c.insert(seg("a", 3)), 1, "refresh keeps the id");
        assert_eq!(c.get(1).unwrap().desc.tcp_data_port, 3);
        assert_eq!(c.get(1).unwrap().carrier.get(), Some(2), "and the carrier");
        c.remove("a");
        assert!(c.get(1).is_none());
        assert_eq!(c.id_of("a"), None);
        assert_eq!(
            c.insert(seg("a", 4)),
            3,
            "a removed name comes back with a new id"
        );
        assert_eq!(c.get(3).unwrap().carrier.get(), None, "and no carrier");
    }

    #[test]
    fn a_refetch_that_found_the_peer_down_does_not_hold_back_the_next() {
        let f = Freshness::default();
        assert!(!f.take_refetch(), "nothing failed");
        f.mark_stale();
        assert!(f.take_refetch());
        f.mark_stale();
        assert!(!f.take_refetch(), "a refetch ran just now");
        f.mark_stale();
        f.peer_down();
        assert!(f.take_refetch(), "that one found the peer down");
    }
}
