//! The endpoints of one device: the pool by peer NIC path (SIEVE or FIFO,
//! `MC_MAX_EP_PER_CTX`), which of them peers' handshakes created (bounded
//! per peer and in total), those retiring, and the table in which a
//! completion finds its endpoint by queue pair number.
//!
//! Every pool operation takes O(1) or O(log n) time. At the total bound of
//! endpoints that peers' handshakes created, the one whose peer made the
//! least progress gives way: least recently active first, where activity is
//! a request the peer sent on it (its queue pairs' receive PSNs) or one of
//! ours that completed.

use super::endpoint::RdmaEndpoint;
use super::handshake::split_nic_path;
use crate::sync;
use crate::transport::endpoint::EndpointStoreType;
use crate::transport::endpoint::{EndpointStore, Retiring};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

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
}

impl Pool {
    /// An empty pool of at most `capacity` endpoints.
    pub fn new(capacity: usize, policy: EndpointStoreType) -> Pool {
        Pool {
            store: EndpointStore::new(capacity, policy),
            retiring: Retiring::default(),
            passive: Passive::default(),
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

/// Stripes of the queue pair table.
const QP_STRIPES: usize = 64;

/// Every endpoint whose queue pairs exist, by queue pair number. Striped:
/// a completion takes the lock of one stripe, which no pool operation,
/// handshake or monitor pass holds for longer than one lookup.
pub struct QpTable {
    stripes: Vec<Mutex<HashMap<u32, Arc<RdmaEndpoint>>>>,
}

impl Default for QpTable {
    fn default() -> Self {
        QpTable {
            stripes: (0..QP_STRIPES).map(|_| Mutex::default()).collect(),
        }
    }
}

impl QpTable {
    fn stripe(&self, qp_num: u32) -> MutexGuard<'_, HashMap<u32, Arc<RdmaEndpoint>>> {
        sync::lock(&self.stripes[qp_num as usize % QP_STRIPES])
    }

    /// Adds the queue pairs of `ep`.
    pub fn add(&self, ep: &Arc<RdmaEndpoint>) {
        for q in ep.qpns() {
            self.stripe(q).insert(q, ep.clone());
        }
    }

    /// The endpoint of queue pair `qp_num`.
    pub fn get(&self, qp_num: u32) -> Option<Arc<RdmaEndpoint>> {
        self.stripe(qp_num).get(&qp_num).cloned()
    }

    /// Forgets the queue pairs of `ep` (closed): each number only while it
    /// still names `ep` (the device may have reused it since).
    pub fn forget(&self, ep: &Arc<RdmaEndpoint>) {
        for q in ep.qpns() {
            let mut s = self.stripe(q);
            if s.get(&q).is_some_and(|cur| Arc::ptr_eq(cur, ep)) {
                s.remove(&q);
            }
        }
    }

    /// Forgets every queue pair.
    pub fn clear(&self) {
        for s in &self.stripes {
            sync::lock(s).clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
