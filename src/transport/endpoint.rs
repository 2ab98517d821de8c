//! The endpoint pool of one local device, shared by transports: endpoints
//! (the connections between one local device and one peer device) are
//! created on first use and kept up to a capacity (`MC_MAX_EP_PER_CTX`),
//! evicted by SIEVE (NSDI'24) or FIFO (`MC_ENDPOINT_STORE_TYPE`).
//!
//! An evicted or failed endpoint is retired in two phases: it leaves the
//! pool at once, so no new slice reaches it, and waits on a list until no
//! slice is in flight on it; a background pass then closes it.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Endpoint pool eviction policy (`MC_ENDPOINT_STORE_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointStoreType {
    /// Evict the oldest inserted endpoint.
    Fifo,
    /// SIEVE eviction (NSDI'24): the default.
    Sieve,
}

use crate::settings::{Range, Words};

const STORE_TYPES: Words<EndpointStoreType> = Words(&[
    ("SIEVE", EndpointStoreType::Sieve),
    ("FIFO", EndpointStoreType::Fifo),
]);

crate::settings::settings! {
    /// The per-device endpoint pools. Each setting (variables, Mooncake's
    /// default and bounds, meaning) is declared once in the table below.
    #[derive(Debug, Clone, PartialEq)]
    pub struct EndpointConfig("endpoints") {
        /// `MC_MAX_EP_PER_CTX`.
        max_per_ctx: usize = 65536, ["MC_MAX_EP_PER_CTX"], Range(1usize, 65536),
            "endpoints per local device";
        /// `MC_ENDPOINT_STORE_TYPE` (SIEVE).
        store_type: EndpointStoreType = EndpointStoreType::Sieve, ["MC_ENDPOINT_STORE_TYPE"],
            STORE_TYPES, "endpoint pool eviction";
    };
}

/// What the pool needs of an endpoint (RDMA's, which retire).
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub trait Endpoint: Send + Sync {
    /// Whether no slice is queued or in flight.
    fn quiescent(&self) -> bool;
    /// Closes the connections (called once, when quiescent or at shutdown).
    fn close(&self);
}

/// "No node": the end of the list, or a hand that starts at the tail.
const NIL: usize = usize::MAX;

/// One entry of the store, linked between its older and newer neighbours.
struct Node<K, V> {
    key: K,
    value: Arc<V>,
    visited: AtomicBool,
    /// The next newer entry (towards the head), or [`NIL`].
    newer: usize,
    /// The next older entry (towards the tail), or [`NIL`].
    older: usize,
}

/// Endpoints keyed by peer device, with SIEVE or FIFO eviction. Every
/// operation takes O(1) time (eviction amortized: SIEVE's hand clears at
/// most one visited mark per step): a hash map finds an entry's node in a
/// slab, and the nodes form a list in insertion order.
pub struct EndpointStore<K, V> {
    capacity: usize,
    policy: EndpointStoreType,
    index: HashMap<K, usize>,
    /// The nodes; `None` slots are listed in `free`.
    slots: Vec<Option<Node<K, V>>>,
    free: Vec<usize>,
    /// The newest entry.
    head: usize,
    /// The oldest entry.
    tail: usize,
    /// SIEVE's hand: the next entry it looks at ([`NIL`]: the tail).
    hand: usize,
    /// Endpoints evicted to make room since the store was made.
    evictions: u64,
}

impl<K: Clone + Eq + Hash, V> EndpointStore<K, V> {
    /// How many endpoints it holds.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// How many it evicted to make room so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// An empty store holding at most `capacity` (≥ 1) endpoints.
    pub fn new(capacity: usize, policy: EndpointStoreType) -> Self {
        EndpointStore {
            capacity: capacity.max(1),
            policy,
            index: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            hand: NIL,
            evictions: 0,
        }
    }

    fn node(&self, i: usize) -> &Node<K, V> {
        self.slots[i].as_ref().expect("a linked slot holds a node")
    }

    fn node_mut(&mut self, i: usize) -> &mut Node<K, V> {
        self.slots[i].as_mut().expect("a linked slot holds a node")
    }

    /// The endpoint for `key`, marked as visited.
    pub fn get(&self, key: &K) -> Option<Arc<V>> {
        let n = self.node(*self.index.get(key)?);
        n.visited.store(true, Ordering::Relaxed);
        Some(n.value.clone())
    }

    /// The endpoint for `key`, without marking it visited.
    pub fn peek(&self, key: &K) -> Option<Arc<V>> {
        Some(self.node(*self.index.get(key)?).value.clone())
    }

    /// Adds an endpoint; returns those evicted to make room (and the one
    /// it replaces under the same key).
    pub fn insert(&mut self, key: K, value: Arc<V>) -> Vec<Arc<V>> {
        let mut evicted = Vec::new();
        if let Some(old) = self.remove(&key) {
            evicted.push(old);
        }
        while self.index.len() >= self.capacity {
            match self.evict_one() {
                Some(v) => evicted.push(v),
                None => break,
            }
        }
        let node = Node {
            key: key.clone(),
            value,
            visited: AtomicBool::new(true),
            newer: NIL,
            older: self.head,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(node);
                i
            }
            None => {
                self.slots.push(Some(node));
                self.slots.len() - 1
            }
        };
        match self.head {
            NIL => self.tail = i,
            h => self.node_mut(h).newer = i,
        }
        self.head = i;
        self.index.insert(key, i);
        evicted
    }

    /// Removes the endpoint for `key`.
    pub fn remove(&mut self, key: &K) -> Option<Arc<V>> {
        let i = self.index.remove(key)?;
        Some(self.unlink(i))
    }

    /// Takes node `i` out of the list and the slab; the hand, if on it,
    /// moves to the next newer entry.
    fn unlink(&mut self, i: usize) -> Arc<V> {
        let node = self.slots[i].take().expect("a linked slot holds a node");
        self.free.push(i);
        match node.older {
            NIL => self.tail = node.newer,
            o => self.node_mut(o).newer = node.newer,
        }
        match node.newer {
            NIL => self.head = node.older,
            n => self.node_mut(n).older = node.older,
        }
        if self.hand == i {
            self.hand = node.newer;
        }
        node.value
    }

    fn evict_one(&mut self) -> Option<Arc<V>> {
        if self.tail == NIL {
            return None;
        }
        let victim = match self.policy {
            EndpointStoreType::Fifo => self.tail,
            EndpointStoreType::Sieve => {
                // Walk from the hand towards the head, clearing visited
                // marks; the first unvisited entry goes. Wraps to the tail.
                let mut i = if self.hand == NIL {
                    self.tail
                } else {
                    self.hand
                };
                loop {
                    let n = self.node(i);
                    if !n.visited.swap(false, Ordering::Relaxed) {
                        break i;
                    }
                    i = if n.newer == NIL { self.tail } else { n.newer };
                }
            }
        };
        // The hand moves on to the victim's newer neighbour.
        self.hand = victim;
        self.evictions += 1;
        let key = self.node(victim).key.clone();
        self.index.remove(&key);
        Some(self.unlink(victim))
    }

    /// The endpoints, in no particular order.
    #[cfg(any(feature = "rdma", test))]
    pub fn values(&self) -> impl Iterator<Item = &Arc<V>> {
        self.slots.iter().flatten().map(|n| &n.value)
    }

    /// Removes and returns every endpoint.
    pub fn drain(&mut self) -> Vec<Arc<V>> {
        self.index.clear();
        self.free.clear();
        self.head = NIL;
        self.tail = NIL;
        self.hand = NIL;
        self.slots.drain(..).flatten().map(|n| n.value).collect()
    }
}

/// Endpoints that left the pool and wait for their last slice (RDMA's).
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub struct Retiring<V: Endpoint> {
    waiting: Vec<Arc<V>>,
}

impl<V: Endpoint> Default for Retiring<V> {
    fn default() -> Self {
        Retiring {
            waiting: Vec::new(),
        }
    }
}

#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
impl<V: Endpoint> Retiring<V> {
    /// Adds endpoints to the waiting list.
    pub fn retire(&mut self, eps: impl IntoIterator<Item = Arc<V>>) {
        self.waiting.extend(eps);
    }

    /// Moves every endpoint waiting in `other` to this list.
    pub fn retire_from(&mut self, other: &mut Retiring<V>) {
        self.waiting.append(&mut other.waiting);
    }

    /// Closes every waiting endpoint that is quiescent; returns those it
    /// closed.
    pub fn reclaim(&mut self) -> Vec<Arc<V>> {
        let mut closed = Vec::new();
        self.waiting.retain(|ep| {
            if ep.quiescent() {
                ep.close();
                closed.push(ep.clone());
                false
            } else {
                true
            }
        });
        closed
    }

    /// The waiting endpoints.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<V>> {
        self.waiting.iter()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Ep {
        inflight: AtomicUsize,
        closed: AtomicBool,
    }

    impl Endpoint for Ep {
        fn quiescent(&self) -> bool {
            self.inflight.load(Ordering::Relaxed) == 0
        }
        fn close(&self) {
            assert!(!self.closed.swap(true, Ordering::Relaxed), "closed twice");
        }
    }

    fn keys<V>(evicted: &[Arc<V>], all: &[(u32, Arc<V>)]) -> Vec<u32> {
        evicted
            .iter()
            .map(|e| {
                all.iter()
                    .find(|(_, v)| Arc::ptr_eq(v, e))
                    .map(|(k, _)| *k)
                    .unwrap()
            })
            .collect()
    }

    /// Endpoints with their keys.
    type Keyed = Vec<(u32, Arc<Ep>)>;

    /// Endpoints keyed `0..n`, and a store of `capacity` under `policy`
    /// holding the first `capacity` of them, inserted in order.
    fn filled(
        capacity: usize,
        policy: EndpointStoreType,
        n: u32,
    ) -> (EndpointStore<u32, Ep>, Keyed) {
        let mut s = EndpointStore::new(capacity, policy);
        let eps: Keyed = (0..n).map(|k| (k, Arc::new(Ep::default()))).collect();
        for (k, v) in &eps[..capacity] {
            s.insert(*k, v.clone());
        }
        (s, eps)
    }

    #[test]
    fn fifo_evicts_oldest() {
        let (mut s, eps) = filled(2, EndpointStoreType::Fifo, 4);
        s.get(&0);
        assert_eq!(keys(&s.insert(2, eps[2].1.clone()), &eps), vec![0]);
        assert_eq!(keys(&s.insert(3, eps[3].1.clone()), &eps), vec![1]);
        assert!(s.get(&2).is_some() && s.get(&3).is_some());
    }

    #[test]
    fn sieve_keeps_visited_entries() {
        let (mut s, eps) = filled(3, EndpointStoreType::Sieve, 6);
        // All inserted visited: the first pass clears 0,1,2 and evicts 0.
        assert_eq!(keys(&s.insert(3, eps[3].1.clone()), &eps), vec![0]);
        // 1 is touched again: SIEVE skips it and evicts 2.
        s.get(&1);
        assert_eq!(keys(&s.insert(4, eps[4].1.clone()), &eps), vec![2]);
        // Hand moved on past 2; 3 (visited at insert) is cleared, 1 was
        // cleared in this pass... the next unvisited is evicted.
        let v = keys(&s.insert(5, eps[5].1.clone()), &eps);
        assert_eq!(v.len(), 1);
        assert_eq!(s.len(), 3);
        assert!(s.get(&5).is_some());
    }

    /// Counts how often a hot endpoint (used before every insert) is
    /// evicted while 100 cold ones pass through a pool of 4.
    fn hot_evictions(policy: EndpointStoreType) -> usize {
        let mut s = EndpointStore::new(4, policy);
        let hot = Arc::new(Ep::default());
        s.insert(0u32, hot.clone());
        let mut evicted = 0;
        for k in 1..=100u32 {
            if s.get(&0).is_none() {
                s.insert(0, hot.clone());
            }
            for v in s.insert(k, Arc::new(Ep::default())) {
                if Arc::ptr_eq(&v, &hot) {
                    evicted += 1;
                }
            }
        }
        evicted
    }

    #[test]
    fn sieve_keeps_a_hot_endpoint_that_fifo_drops() {
        let fifo = hot_evictions(EndpointStoreType::Fifo);
        let sieve = hot_evictions(EndpointStoreType::Sieve);
        assert!(
            fifo >= 20,
            "FIFO evicts the hot endpoint every few inserts ({fifo})"
        );
        assert!(
            sieve * 4 <= fifo,
            "SIEVE evicted the hot endpoint {sieve} times, FIFO {fifo}"
        );
    }

    #[test]
    fn retirement_waits_for_inflight_slices() {
        let mut r = Retiring::default();
        let busy = Arc::new(Ep::default());
        busy.inflight.store(2, Ordering::Relaxed);
        let idle = Arc::new(Ep::default());
        r.retire([busy.clone(), idle.clone()]);
        let closed = r.reclaim();
        assert_eq!(closed.len(), 1);
        assert!(Arc::ptr_eq(&closed[0], &idle));
        assert_eq!(r.iter().count(), 1);
        assert!(idle.closed.load(Ordering::Relaxed));
        assert!(!busy.closed.load(Ordering::Relaxed));
        busy.inflight.store(0, Ordering::Relaxed);
        assert_eq!(r.reclaim().len(), 1);
        assert!(busy.closed.load(Ordering::Relaxed));
        assert!(r.reclaim().is_empty(), "reclaim is idempotent when empty");
    }

    #[test]
    fn many_waiting_entries_drain_in_one_pass() {
        let mut r = Retiring::default();
        r.retire((0..1118).map(|_| Arc::new(Ep::default())));
        assert_eq!(r.reclaim().len(), 1118);
        assert!(r.is_empty());
    }

    #[test]
    fn removing_the_entry_under_the_hand_moves_it_to_the_next_newer() {
        let (mut s, eps) = filled(4, EndpointStoreType::Sieve, 7);
        // The first eviction clears every mark and takes 0; the hand is on 1.
        assert_eq!(keys(&s.insert(4, eps[4].1.clone()), &eps), vec![0]);
        // 1 leaves: the hand moves to 2, which is unvisited and goes next.
        s.remove(&1);
        s.insert(5, eps[5].1.clone());
        assert_eq!(keys(&s.insert(6, eps[6].1.clone()), &eps), vec![2]);
        let mut left: Vec<u32> = eps
            .iter()
            .filter(|(_, v)| s.values().any(|x| Arc::ptr_eq(x, v)))
            .map(|(k, _)| *k)
            .collect();
        left.sort_unstable();
        assert_eq!(left, vec![3, 4, 5, 6]);
    }

    #[test]
    fn slots_are_reused_and_the_order_survives_churn() {
        // FIFO over many inserts and removals from the middle: what is
        // evicted is always the oldest entry still present, and the slab
        // does not grow past the capacity.
        let mut s = EndpointStore::new(8, EndpointStoreType::Fifo);
        let mut present: std::collections::VecDeque<(u32, Arc<Ep>)> = Default::default();
        for k in 0..10_000u32 {
            if k % 3 == 0 && !present.is_empty() {
                let (mid, v) = present.remove(present.len() / 2).unwrap();
                assert!(Arc::ptr_eq(&s.remove(&mid).unwrap(), &v));
            }
            let v = Arc::new(Ep::default());
            let evicted = s.insert(k, v.clone());
            if let Some(ev) = evicted.first() {
                let (oldest, ov) = present.pop_front().unwrap();
                assert!(Arc::ptr_eq(ev, &ov), "{oldest} is the one evicted");
                assert!(s.get(&oldest).is_none());
            }
            present.push_back((k, v));
            assert_eq!(s.len(), present.len());
        }
        assert!(s.slots.len() <= 8, "{} slots", s.slots.len());
    }

    #[test]
    fn remove_and_reinsert() {
        let mut s = EndpointStore::new(2, EndpointStoreType::Sieve);
        let a = Arc::new(Ep::default());
        s.insert(1u32, a.clone());
        assert!(Arc::ptr_eq(&s.remove(&1).unwrap(), &a));
        assert!(s.get(&1).is_none());
        let b = Arc::new(Ep::default());
        let replaced = s.insert(1, b.clone());
        assert!(replaced.is_empty());
        let c = Arc::new(Ep::default());
        let replaced = s.insert(1, c);
        assert_eq!(replaced.len(), 1);
        assert!(Arc::ptr_eq(&replaced[0], &b));
        assert_eq!(s.drain().len(), 1);
    }
}
