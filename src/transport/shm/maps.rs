//! Read-only mappings of one peer's memfd-backed buffers ([`super::alloc`]):
//! taken on first use with `pidfd_getfd`, checked (the memfd's name carries
//! the id the peer's table gives, its size is sealed), and kept while the
//! peer's table names them; at most `MC_SHM_MAX_MAPPINGS` per peer, the
//! least recently used giving way.

use super::alloc::name_of;
use super::sys::{self, Mapping};
use super::table::{Backing, PeerIndex};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

struct Entry {
    /// `None`: the descriptor did not check out; copy another way.
    map: Option<Arc<Mapping>>,
    used: u64,
}

/// The mappings of one peer's memfds, by memfd id.
pub(crate) struct PeerMaps {
    max: usize,
    entries: Mutex<HashMap<u64, Entry>>,
    clock: AtomicU64,
    /// The peer's table epoch when the mappings were last pruned.
    pruned: AtomicU64,
}

impl PeerMaps {
    /// No mappings yet; at most `max`.
    pub fn new(max: usize) -> PeerMaps {
        PeerMaps {
            max: max.max(1),
            entries: Mutex::default(),
            clock: AtomicU64::new(0),
            pruned: AtomicU64::new(u64::MAX),
        }
    }

    /// The mapping of memfd `b.id` of the peer behind `pidfd`, if it can
    /// be had and holds `[b.offset, b.offset + len)`.
    pub fn get(&self, pidfd: &OwnedFd, b: &Backing, len: u64) -> Option<Arc<Mapping>> {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let map = match entries.get_mut(&b.id) {
            Some(e) => {
                e.used = now;
                e.map.clone()
            }
            None => {
                let map = open(pidfd, b).map(Arc::new);
                if entries.len() >= self.max {
                    let oldest = entries.iter().min_by_key(|(_, e)| e.used).map(|(&k, _)| k);
                    if let Some(k) = oldest {
                        entries.remove(&k);
                        crate::log_limit::warn_limited!(
                            "shm: MC_SHM_MAX_MAPPINGS={} buffers of one peer are mapped; \
                             the least recently used mapping gives way",
                            self.max
                        );
                    }
                }
                entries.insert(
                    b.id,
                    Entry {
                        map: map.clone(),
                        used: now,
                    },
                );
                map
            }
        }?;
        let end = b.offset.checked_add(len)?;
        (end <= map.size() as u64).then_some(map)
    }

    /// Drops the mappings of memfds the peer's table no longer names (its
    /// buffers were unregistered, maybe freed), once per change of it; an
    /// index not up to date (or not whole) prunes nothing.
    pub fn prune(&self, index: &PeerIndex<'_>) {
        let epoch = index.epoch();
        if self.pruned.load(Ordering::Acquire) == epoch {
            return;
        }
        let Some(live) = index.memfd_ids() else {
            return;
        };
        self.pruned.store(epoch, Ordering::Release);
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|id, _| live.contains(id));
    }

    /// The table epoch of the last prune.
    pub fn pruned(&self) -> u64 {
        self.pruned.load(Ordering::Acquire)
    }

    /// Mappings held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Takes and maps the peer's memfd, if it is the one named.
fn open(pidfd: &OwnedFd, b: &Backing) -> Option<Mapping> {
    let fd = sys::pidfd_getfd(pidfd, b.fd).ok()?;
    if sys::memfd_name(&fd)? != name_of(b.id) {
        return None;
    }
    sys::check_size_sealed(&fd).ok()?;
    let size = usize::try_from(sys::file_size(&fd).ok()?).ok()?;
    Mapping::new(&fd, size, false).ok()
}
