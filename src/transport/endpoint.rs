//! The endpoint pool of one local device, shared by transports: endpoints
//! (the connections between one local device and one peer device) are
//! created on first use and kept up to a capacity (`MC_MAX_EP_PER_CTX`),
//! evicted by SIEVE (NSDI'24) or FIFO (`MC_ENDPOINT_STORE_TYPE`).
//!
//! An evicted or failed endpoint is retired in two phases: it leaves the
//! pool at once, so no new slice reaches it, and waits on a list until no
//! slice is in flight on it; a background pass then closes it.

use crate::config::EndpointStoreType;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What the pool needs of an endpoint.
pub trait Endpoint: Send + Sync {
    /// Whether no slice is queued or in flight.
    fn quiescent(&self) -> bool;
    /// Closes the connections (called once, when quiescent or at shutdown).
    fn close(&self);
}

struct Entry<V> {
    value: Arc<V>,
    visited: AtomicBool,
}

/// Endpoints keyed by peer device, with SIEVE or FIFO eviction.
pub struct EndpointStore<K, V> {
    capacity: usize,
    policy: EndpointStoreType,
    entries: HashMap<K, Entry<V>>,
    /// Insertion order: front = oldest (tail), back = newest (head).
    order: VecDeque<K>,
    /// SIEVE's hand: an index into `order`.
    hand: usize,
}

impl<K: Clone + Eq + Hash, V> EndpointStore<K, V> {
    /// An empty store holding at most `capacity` (≥ 1) endpoints.
    pub fn new(capacity: usize, policy: EndpointStoreType) -> Self {
        EndpointStore {
            capacity: capacity.max(1),
            policy,
            entries: HashMap::new(),
            order: VecDeque::new(),
            hand: 0,
        }
    }

    /// The endpoint for `key`, marked as visited.
    pub fn get(&self, key: &K) -> Option<Arc<V>> {
        let e = self.entries.get(key)?;
        e.visited.store(true, Ordering::Relaxed);
        Some(e.value.clone())
    }

    /// Adds an endpoint; returns those evicted to make room.
    pub fn insert(&mut self, key: K, value: Arc<V>) -> Vec<Arc<V>> {
        let mut evicted = Vec::new();
        if let Some(old) = self.remove(&key) {
            evicted.push(old);
        }
        while self.entries.len() >= self.capacity {
            match self.evict_one() {
                Some(v) => evicted.push(v),
                None => break,
            }
        }
        self.entries.insert(
            key.clone(),
            Entry {
                value,
                visited: AtomicBool::new(true),
            },
        );
        self.order.push_back(key);
        evicted
    }

    /// Removes the endpoint for `key`.
    pub fn remove(&mut self, key: &K) -> Option<Arc<V>> {
        let e = self.entries.remove(key)?;
        if let Some(i) = self.order.iter().position(|k| k == key) {
            self.order.remove(i);
            if i < self.hand {
                self.hand -= 1;
            }
        }
        Some(e.value)
    }

    fn evict_one(&mut self) -> Option<Arc<V>> {
        if self.order.is_empty() {
            return None;
        }
        let victim = match self.policy {
            EndpointStoreType::Fifo => 0,
            EndpointStoreType::Sieve => {
                // Walk from the hand towards the head, clearing visited bits;
                // the first unvisited entry goes. Wraps to the tail.
                let n = self.order.len();
                let mut i = self.hand.min(n - 1);
                loop {
                    let e = &self.entries[&self.order[i]];
                    if e.visited.swap(false, Ordering::Relaxed) {
                        i = (i + 1) % n;
                    } else {
                        break i;
                    }
                }
            }
        };
        let key = self.order.remove(victim)?;
        // The hand stays at the same index: now the next newer entry.
        self.hand = if self.order.is_empty() {
            0
        } else {
            victim % self.order.len()
        };
        self.entries.remove(&key).map(|e| e.value)
    }

    /// Removes and returns every endpoint.
    pub fn drain(&mut self) -> Vec<Arc<V>> {
        self.order.clear();
        self.hand = 0;
        self.entries.drain().map(|(_, e)| e.value).collect()
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Endpoints that left the pool and wait for their last slice.
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

impl<V: Endpoint> Retiring<V> {
    /// Adds endpoints to the waiting list.
    pub fn retire(&mut self, eps: impl IntoIterator<Item = Arc<V>>) {
        self.waiting.extend(eps);
    }

    /// Moves every endpoint waiting in `other` to this list.
    pub fn retire_from(&mut self, other: &mut Retiring<V>) {
        self.waiting.append(&mut other.waiting);
    }

    /// Closes every waiting endpoint that is quiescent; returns how many
    /// still wait.
    pub fn reclaim(&mut self) -> usize {
        self.waiting.retain(|ep| {
            if ep.quiescent() {
                ep.close();
                false
            } else {
                true
            }
        });
        self.waiting.len()
    }

    /// Closes every waiting endpoint, quiescent or not (shutdown).
    pub fn close_all(&mut self) {
        for ep in self.waiting.drain(..) {
            ep.close();
        }
    }

    /// Number of endpoints waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
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

    #[test]
    fn fifo_evicts_oldest() {
        let mut s = EndpointStore::new(2, EndpointStoreType::Fifo);
        let eps: Vec<(u32, Arc<Ep>)> = (0..4).map(|k| (k, Arc::new(Ep::default()))).collect();
        s.insert(0, eps[0].1.clone());
        s.insert(1, eps[1].1.clone());
        s.get(&0);
        assert_eq!(keys(&s.insert(2, eps[2].1.clone()), &eps), vec![0]);
        assert_eq!(keys(&s.insert(3, eps[3].1.clone()), &eps), vec![1]);
        assert!(s.get(&2).is_some() && s.get(&3).is_some());
    }

    #[test]
    fn sieve_keeps_visited_entries() {
        let mut s = EndpointStore::new(3, EndpointStoreType::Sieve);
        let eps: Vec<(u32, Arc<Ep>)> = (0..6).map(|k| (k, Arc::new(Ep::default()))).collect();
        for k in 0..3 {
            s.insert(k, eps[k as usize].1.clone());
        }
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
        assert_eq!(r.reclaim(), 1);
        assert!(idle.closed.load(Ordering::Relaxed));
        assert!(!busy.closed.load(Ordering::Relaxed));
        busy.inflight.store(0, Ordering::Relaxed);
        assert_eq!(r.reclaim(), 0);
        assert!(busy.closed.load(Ordering::Relaxed));
        assert_eq!(r.reclaim(), 0, "reclaim is idempotent when empty");
    }

    #[test]
    fn many_waiting_entries_drain_in_one_pass() {
        let mut r = Retiring::default();
        r.retire((0..1118).map(|_| Arc::new(Ep::default())));
        assert_eq!(r.reclaim(), 0);
        assert!(r.is_empty());
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
