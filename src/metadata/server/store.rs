//! The metadata server's store: values by key, bounded in keys and bytes,
//! kept on disk by a [`Journal`] when a data file is given.
//!
//! Readers take a read lock for a lookup only: a value is shared
//! (`Arc<str>`), never copied out, and a change takes the write lock only
//! to insert or remove, after its record is on disk. Changes are serialized
//! by a second lock, which they hold while their record is written and
//! fsynced, and while the snapshot is rewritten (outside the map's lock).

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use super::journal::{self, Journal, Map};
use crate::sync;

/// Bounds of the store.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Keys stored at once.
    pub max_keys: usize,
    /// Bytes of keys and values stored at once.
    pub max_bytes: usize,
}

/// Why a change was not made.
#[derive(Debug)]
pub(super) enum Refused {
    /// A new key beyond [`Limits::max_keys`].
    Keys,
    /// Growth beyond [`Limits::max_bytes`].
    Bytes,
    /// The change could not be written to disk (and was not made).
    Io(io::Error),
}

/// What the writer of changes holds.
struct Writer {
    journal: Option<Journal>,
    /// Keys stored.
    keys: usize,
    /// Bytes of keys and values stored.
    bytes: usize,
}

/// Stored values, their bounds and their journal.
pub(super) struct Store {
    map: RwLock<Map>,
    writer: Mutex<Writer>,
    limits: Limits,
}

/// The bytes `key` and `value` take in the store.
fn size(key: &str, value: &str) -> usize {
    key.len() + value.len()
}

impl Store {
    /// Loads `file` and its log, if given and present (the bounds do not
    /// apply to what is loaded, only to what grows it after).
    pub(super) fn load(file: Option<PathBuf>, limits: Limits) -> io::Result<Store> {
        let (journal, map) = match file {
            Some(f) => {
                let (j, m) = Journal::open(f)?;
                (Some(j), m)
            }
            None => (None, Map::new()),
        };
        let keys = map.len();
        let bytes = map.iter().map(|(k, v)| size(k, v)).sum();
        if keys > limits.max_keys || bytes > limits.max_bytes {
            tracing::warn!(
                keys,
                bytes,
                ?limits,
                "the data loaded is over the store's bounds: changes that grow it are refused"
            );
        }
        Ok(Store {
            map: RwLock::new(map),
            writer: Mutex::new(Writer {
                journal,
                keys,
                bytes,
            }),
            limits,
        })
    }

    /// The value of `key`, shared.
    pub(super) fn get(&self, key: &str) -> Option<Arc<str>> {
        self.read().get(key).cloned()
    }

    /// Keys and bytes stored now.
    pub(super) fn usage(&self) -> (usize, usize) {
        let w = self.lock_writer();
        (w.keys, w.bytes)
    }

    /// Sets (`Some`) or removes (`None`) `key`. The change is on disk
    /// (with a data file) before it is visible and before this returns.
    /// A change that would grow the store beyond its bounds is refused.
    pub(super) fn update(&self, key: &str, value: Option<Arc<str>>) -> Result<(), Refused> {
        let mut w = self.lock_writer();
        let old = self.read().get(key).map(|v| size(key, v));
        let (keys, bytes) = match &value {
            Some(v) => (
                w.keys + usize::from(old.is_none()),
                w.bytes - old.unwrap_or(0) + size(key, v),
            ),
            None if old.is_none() => return Ok(()),
            None => (w.keys - 1, w.bytes - old.unwrap_or(0)),
        };
        if keys > self.limits.max_keys && keys > w.keys {
            return Err(Refused::Keys);
        }
        if bytes > self.limits.max_bytes && bytes > w.bytes {
            return Err(Refused::Bytes);
        }
        if let Some(j) = &mut w.journal {
            if j.wants_compaction() {
                self.compact(j).map_err(Refused::Io)?;
            }
            j.append(key, value.as_deref()).map_err(Refused::Io)?;
        }
        {
            let mut map = sync::write(&self.map);
            match value {
                Some(v) => map.insert(key.to_owned(), v),
                None => map.remove(key),
            };
        }
        w.keys = keys;
        w.bytes = bytes;
        if let Some(j) = &mut w.journal {
            if j.wants_compaction() {
                // The change is on disk in the log; the log stays until a
                // later change compacts it.
                if let Err(e) = self.compact(j) {
                    crate::log_limit::warn_limited!("cannot compact the metadata log: {e}");
                }
            }
        }
        Ok(())
    }

    /// Writes the snapshot of the map: encoded under the read lock (readers
    /// go on), written and fsynced without it.
    fn compact(&self, journal: &mut Journal) -> io::Result<()> {
        let snapshot = journal::encode(&self.read())?;
        journal.compact(&snapshot)
    }

    fn read(&self) -> RwLockReadGuard<'_, Map> {
        // A panic while holding the lock leaves the map consistent (every
        // change is a single insert or remove), so poisoning is ignored.
        sync::read(&self.map)
    }

    fn lock_writer(&self) -> MutexGuard<'_, Writer> {
        sync::lock(&self.writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOMY: Limits = Limits {
        max_keys: 1000,
        max_bytes: 1 << 20,
    };

    fn put(s: &Store, k: &str, v: &str) -> Result<(), Refused> {
        s.update(k, Some(Arc::from(v)))
    }

    #[test]
    fn store_persists_through_its_journal() {
        let dir = std::env::temp_dir().join(format!("te-store-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("data.json");
        let s = Store::load(Some(file.clone()), ROOMY).unwrap();
        put(&s, "a", "{\"x\":1}").unwrap();
        put(&s, "b", "2").unwrap();
        s.update("b", None).unwrap();
        s.update("missing", None).unwrap();
        drop(s);
        let again = Store::load(Some(file.clone()), ROOMY).unwrap();
        assert_eq!(again.get("a").as_deref(), Some("{\"x\":1}"));
        assert_eq!(again.get("b"), None);
        assert_eq!(again.usage(), (1, 1 + 7));
        // A data file in a directory that is gone cannot be opened.
        assert!(Store::load(Some(dir.join("nodir").join("data.json")), ROOMY).is_err());
        std::fs::write(&file, b"[1]").unwrap();
        assert_eq!(
            Store::load(Some(file), ROOMY).err().map(|e| e.kind()),
            Some(io::ErrorKind::InvalidData)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keys_and_bytes_are_bounded() {
        let s = Store::load(
            None,
            Limits {
                max_keys: 2,
                max_bytes: 20,
            },
        )
        .unwrap();
        put(&s, "a", "12345").unwrap();
        put(&s, "b", "12345").unwrap();
        // A third key is refused; replacing one is not.
        assert!(matches!(put(&s, "c", "1"), Err(Refused::Keys)));
        put(&s, "a", "123456789").unwrap();
        assert_eq!(s.usage(), (2, 16));
        // Growth beyond 20 bytes is refused; shrinking is not.
        assert!(matches!(put(&s, "b", "1234567890"), Err(Refused::Bytes)));
        assert_eq!(s.get("b").as_deref(), Some("12345"));
        put(&s, "a", "1").unwrap();
        s.update("b", None).unwrap();
        put(&s, "c", "12345678901234567").unwrap();
        assert_eq!(s.usage(), (2, 20));
        assert!(matches!(
            put(&s, "c", "123456789012345678"),
            Err(Refused::Bytes)
        ));
    }
}
