//! The endpoints of one device: the pool by peer NIC path (SIEVE or FIFO,
//! `MC_MAX_EP_PER_CTX`), which of them peers' handshakes created (bounded
//! per peer and in total), those retiring, and the slab in which a
//! completion finds its endpoint from its work request id.
//!
//! Every pool operation takes O(1) or O(log n) time. At the total bound of
//! endpoints that peers' handshakes created, the one whose peer made the
//! least progress gives way: least recently active first, where activity is
//! a request the peer sent on it (its queue pairs' receive PSNs) or one of
//! ours that completed.

use super::endpoint::RdmaEndpoint;
use super::handshake::split_nic_path;
use super::wr_id::WrId;
use crate::sync;
use crate::transport::endpoint::EndpointStoreType;
use crate::transport::endpoint::{EndpointStore, Retiring};
use once_cell::sync::OnceCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

/// Endpoints the peers' handshakes may create on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassiveLimits {
    /// In total (`MC_RDMA_MAX_PASSIVE_EP`).
    pub total: usize,
    /// Per peer server (`MC_RDMA_MAX_PASSIVE_EP_PER_PEER`).
    pub per_peer: usize,
}

/// How many endpoints found active one pass that makes room moves to the
/// back of the order before it evicts the least recently active one
/// regardless (bounds the pass when every endpoint is in use).
const ACTIVITY_CHECKS: usize = 16;

/// The server part of a NIC path (the whole path if it has none).
fn server_of(path: &str) -> &str {
    split_nic_path(path).map_or(path, |(s, _)| s)
}

/// The endpoints peers' handshakes created: least recently active first,
/// and how many each peer holds.
#[derive(Default)]
struct Passive {
    /// Path -> its key in `by_activity` and the activity seen then.
    paths: HashMap<String, (u64, u64)>,
    by_activity: BTreeMap<u64, String>,
    per_peer: HashMap<String, usize>,
    next: u64,
}

impl Passive {
    fn len(&self) -> usize {
        self.paths.len()
    }

    fn contains(&self, path: &str) -> bool {
        self.paths.contains_key(path)
    }

    fn count(&self, server: &str) -> usize {
        self.per_peer.get(server).copied().unwrap_or(0)
    }

    /// Adds `path`, or moves it to the back as just active.
    fn touch(&mut self, path: &str, activity: u64) {
        let key = self.next;
        self.next += 1;
        match self.paths.get_mut(path) {
            Some(at) => {
                self.by_activity.remove(&at.0);
                *at = (key, activity);
            }
            None => {
                self.paths.insert(path.to_string(), (key, activity));
                *self
                    .per_peer
                    .entry(server_of(path).to_string())
                    .or_default() += 1;
            }
        }
        self.by_activity.insert(key, path.to_string());
    }

    fn remove(&mut self, path: &str) {
        let Some((key, _)) = self.paths.remove(path) else {
            return;
        };
        self.by_activity.remove(&key);
        let server = server_of(path);
        if let Some(n) = self.per_peer.get_mut(server) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(server);
            }
        }
    }

    /// The least recently active path and the activity seen then.
    fn oldest(&self) -> Option<(String, u64)> {
        let (_, path) = self.by_activity.first_key_value()?;
        Some((path.clone(), self.paths[path].1))
    }
}

/// The pool of one device and the endpoints retiring from it.
pub struct Pool {
    store: EndpointStore<String, RdmaEndpoint>,
    retiring: Retiring<RdmaEndpoint>,
    passive: Passive,
    /// Passive endpoints that left to make room for a peer's handshake.
    passive_evictions: u64,
}

impl Pool {
    /// An empty pool of at most `capacity` endpoints.
    pub fn new(capacity: usize, policy: EndpointStoreType) -> Pool {
        Pool {
            store: EndpointStore::new(capacity, policy),
            retiring: Retiring::default(),
            passive: Passive::default(),
            passive_evictions: 0,
        }
    }

    /// Endpoints held, and those evicted to make room so far.
    pub fn stats(&self) -> crate::transport::EndpointPool {
        crate::transport::EndpointPool {
            size: self.store.len() as u64,
            evictions: self.store.evictions() + self.passive_evictions,
        }
    }

    /// The endpoint to `path`, marked as used.
    pub fn get(&self, path: &str) -> Option<Arc<RdmaEndpoint>> {
        self.store.get(&path.to_string())
    }

    /// Adds `ep` under its peer NIC path (`passive`: a peer's handshake
    /// created it). Returns the endpoints that left the pool to make room
    /// or were replaced; they are retiring.
    pub fn insert(&mut self, ep: Arc<RdmaEndpoint>, passive: bool) -> Vec<Arc<RdmaEndpoint>> {
        let path = ep.peer_nic_path.clone();
        let evicted = self.store.insert(path.clone(), ep);
        for old in &evicted {
            self.passive.remove(&old.peer_nic_path);
        }
        if passive {
            // A fresh endpoint: no completion yet, PSNs at 0.
            self.passive.touch(&path, 0);
        }
        self.retiring.retire(evicted.iter().cloned());
        evicted
    }

    /// Takes `ep` out of the pool if it is the current endpoint to its
    /// path; it is then retiring. Returns whether it was.
    pub fn remove(&mut self, ep: &Arc<RdmaEndpoint>) -> bool {
        let path = &ep.peer_nic_path;
        if !self
            .store
            .peek(path)
            .is_some_and(|cur| Arc::ptr_eq(&cur, ep))
        {
            return false;
        }
        self.store.remove(path);
        self.passive.remove(path);
        self.retiring.retire([ep.clone()]);
        true
    }

    /// The peer of the passive endpoint `ep` handshook again: it is in use.
    pub fn touch_passive(&mut self, ep: &RdmaEndpoint) {
        if self.passive.contains(&ep.peer_nic_path) {
            self.passive.touch(&ep.peer_nic_path, ep.activity());
        }
    }

    /// Makes room for the endpoint a peer's handshake is about to create
    /// (or replace) to `path`: refuses when the peer holds `per_peer`
    /// others already; at the total bound, the least recently active
    /// passive endpoint leaves the pool. Returns those that left (retiring).
    pub fn make_room_for_passive(
        &mut self,
        path: &str,
        limits: PassiveLimits,
    ) -> Result<Vec<Arc<RdmaEndpoint>>, String> {
        let server = server_of(path);
        let mine = usize::from(self.passive.contains(path));
        let held = self.passive.count(server) - mine;
        if held >= limits.per_peer {
            return Err(format!(
                "{server} holds {held} endpoints its handshakes created on this device, the \
                 bound (MC_RDMA_MAX_PASSIVE_EP_PER_PEER={})",
                limits.per_peer
            ));
        }
        let mut evicted = Vec::new();
        let mut checks = 0;
        while self.passive.len() - mine >= limits.total.max(1) {
            let Some((victim, seen)) = self.passive.oldest() else {
                break;
            };
            if victim == path {
                // Being replaced: it does not count; look past it.
                self.passive.touch(path, seen);
                continue;
            }
            let Some(ep) = self.store.peek(&victim) else {
                self.passive.remove(&victim);
                continue;
            };
            let now = ep.activity();
            if now != seen && checks < ACTIVITY_CHECKS {
                checks += 1;
                self.passive.touch(&victim, now);
                continue;
            }
            self.store.remove(&victim);
            self.passive.remove(&victim);
            self.retiring.retire([ep.clone()]);
            self.passive_evictions += 1;
            evicted.push(ep);
        }
        Ok(evicted)
    }

    /// Takes every endpoint out of the pool (all retiring); returns them.
    pub fn drain(&mut self) -> Vec<Arc<RdmaEndpoint>> {
        let all = self.store.drain();
        self.passive = Passive::default();
        self.retiring.retire(all.iter().cloned());
        all
    }

    /// Every endpoint, in the pool or retiring.
    pub fn all(&self) -> Vec<Arc<RdmaEndpoint>> {
        self.store
            .values()
            .chain(self.retiring.iter())
            .cloned()
            .collect()
    }

    /// The retiring endpoints, taken out to be reclaimed without the lock.
    pub fn take_retiring(&mut self) -> Retiring<RdmaEndpoint> {
        std::mem::take(&mut self.retiring)
    }

    /// Puts back what [`Pool::take_retiring`] took and did not close.
    pub fn put_back_retiring(&mut self, rest: &mut Retiring<RdmaEndpoint>) {
        self.retiring.retire_from(rest);
    }
}

/// Entries per chunk of the slab (chunks are allocated on first use and
/// never move, so a lookup takes no device-wide lock).
const CHUNK: usize = 1024;
/// Chunks: `CHUNK * CHUNKS` = 2^20 endpoints, the index bits of a [`WrId`].
const CHUNKS: usize = 1024;

#[derive(Default)]
struct SlabEntry {
    /// The generation of the index and the endpoint holding it.
    cur: RwLock<(u32, Option<Arc<RdmaEndpoint>>)>,
}

#[derive(Default)]
struct SlabFree {
    free: Vec<u32>,
    next: u32,
}

/// Every endpoint of a device whose queue pairs may still produce
/// completions, by index: a completion finds its endpoint from its
/// `wr_id` ([`WrId`]) with one uncontended read lock of the endpoint's own
/// entry. An index is freed only after its endpoint closed (its queue
/// pairs destroyed), and its generation then advances: a completion still
/// in a completion queue from a closed endpoint names an old generation
/// and finds nothing.
pub struct EndpointSlab {
    chunks: Box<[OnceCell<Box<[SlabEntry]>>]>,
    free: Mutex<SlabFree>,
}

impl Default for EndpointSlab {
    fn default() -> Self {
        EndpointSlab {
            chunks: (0..CHUNKS).map(|_| OnceCell::new()).collect(),
            free: Mutex::default(),
        }
    }
}

impl EndpointSlab {
    fn entry(&self, index: usize) -> Option<&SlabEntry> {
        self.chunks.get(index / CHUNK)?.get()?.get(index % CHUNK)
    }

    /// Adds the endpoint `make` builds from its tag; `None` when 2^20
    /// endpoints hold an index.
    pub fn insert(&self, make: impl FnOnce(u64) -> Arc<RdmaEndpoint>) -> Option<Arc<RdmaEndpoint>> {
        let index = {
            let mut f = sync::lock(&self.free);
            match f.free.pop() {
                Some(i) => i,
                None if (f.next as usize) < CHUNK * CHUNKS => {
                    f.next += 1;
                    f.next - 1
                }
                None => return None,
            }
        };
        let i = index as usize;
        let entry = &self.chunks[i / CHUNK]
            .get_or_init(|| (0..CHUNK).map(|_| SlabEntry::default()).collect())[i % CHUNK];
        let mut cur = sync::write(&entry.cur);
        let ep = make(WrId::tag(index, cur.0));
        cur.1 = Some(ep.clone());
        Some(ep)
    }

    /// The endpoint a completion's `wr_id` names, if it still holds its
    /// index.
    pub fn get(&self, id: WrId) -> Option<Arc<RdmaEndpoint>> {
        let cur = sync::read(&self.entry(id.index())?.cur);
        match &cur.1 {
            Some(ep) if ep.tag() == id.tag => Some(ep.clone()),
            _ => None,
        }
    }

    /// Frees the index of `ep` (closed), advancing its generation.
    pub fn remove(&self, ep: &Arc<RdmaEndpoint>) {
        let id = WrId::decode(ep.tag());
        let Some(entry) = self.entry(id.index()) else {
            return;
        };
        {
            let mut cur = sync::write(&entry.cur);
            if !cur.1.as_ref().is_some_and(|e| Arc::ptr_eq(e, ep)) {
                return;
            }
            cur.0 = cur.0.wrapping_add(1) & WrId::GEN_MASK;
            cur.1 = None;
        }
        sync::lock(&self.free).free.push(id.index() as u32);
    }

    /// Every endpoint holding an index (a scan, for rare events).
    pub fn all(&self) -> Vec<Arc<RdmaEndpoint>> {
        let next = sync::lock(&self.free).next as usize;
        (0..next)
            .filter_map(|i| sync::read(&self.entry(i)?.cur).1.clone())
            .collect()
    }

    /// Frees every index.
    pub fn clear(&self) {
        for ep in self.all() {
            self.remove(&ep);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::rdma::endpoint::CqRoom;
    use std::time::Duration;

    fn endpoint(tag: u64) -> Arc<RdmaEndpoint> {
        let room = Arc::new(CqRoom::new(16));
        Arc::new(RdmaEndpoint::new(
            "peer:1@d0".into(),
            tag,
            Vec::new(),
            Duration::from_secs(1),
            (0, room),
        ))
    }

    #[test]
    fn a_freed_index_finds_nothing_from_its_old_generation() {
        let slab = EndpointSlab::default();
        let a = slab.insert(endpoint).unwrap();
        let b = slab.insert(endpoint).unwrap();
        let id_a = WrId::decode(WrId::encode(a.tag(), 0, 1));
        assert!(Arc::ptr_eq(&slab.get(id_a).unwrap(), &a));
        assert!(Arc::ptr_eq(&slab.get(WrId::decode(b.tag())).unwrap(), &b));
        slab.remove(&a);
        assert!(slab.get(id_a).is_none());
        // The index comes back in a new generation: the old id still
        // finds nothing, the new one finds the new endpoint.
        let c = slab.insert(endpoint).unwrap();
        assert_eq!(WrId::decode(c.tag()).index(), id_a.index());
        assert_ne!(c.tag(), a.tag());
        assert!(slab.get(id_a).is_none());
        assert!(Arc::ptr_eq(&slab.get(WrId::decode(c.tag())).unwrap(), &c));
        // Removing an endpoint twice (or a stale one) frees nothing.
        slab.remove(&a);
        assert!(slab.get(WrId::decode(c.tag())).is_some());
        assert_eq!(slab.all().len(), 2);
        slab.clear();
        assert!(slab.all().is_empty());
        assert!(slab.get(WrId::decode(b.tag())).is_none());
        // An index never handed out finds nothing.
        assert!(slab.get(WrId::decode(WrId::tag(5000, 0))).is_none());
    }

    #[test]
    fn passive_order_and_per_peer_counts() {
        let mut p = Passive::default();
        p.touch("a:1@d0", 0);
        p.touch("a:1@d1", 0);
        p.touch("b:2@d0", 0);
        assert_eq!((p.len(), p.count("a:1"), p.count("b:2")), (3, 2, 1));
        assert_eq!(p.oldest(), Some(("a:1@d0".to_string(), 0)));
        // Activity moves a path to the back, without counting it twice.
        p.touch("a:1@d0", 7);
        assert_eq!(p.oldest(), Some(("a:1@d1".to_string(), 0)));
        assert_eq!((p.len(), p.count("a:1")), (3, 2));
        p.remove("a:1@d1");
        p.remove("a:1@d1");
        assert_eq!((p.len(), p.count("a:1")), (2, 1));
        assert_eq!(p.oldest(), Some(("b:2@d0".to_string(), 0)));
        p.remove("a:1@d0");
        p.remove("b:2@d0");
        assert!(p.per_peer.is_empty() && p.by_activity.is_empty() && p.oldest().is_none());
    }
}
