//! The key-value store interface behind descriptor publication.

use crate::error::Result;
use serde_json::Value;

/// A store of JSON values by key (Mooncake's `MetadataStoragePlugin`).
///
/// Implementations are shared between threads and must not block longer
/// than their own timeouts.
pub trait MetadataStore: Send + Sync {
    /// The value under `key`; `Ok(None)` when the key is absent, `Err` when
    /// the store is unreachable or answers something unexpected.
    fn get(&self, key: &str) -> Result<Option<Value>>;
    /// Stores `value` under `key`, replacing any previous value.
    fn set(&self, key: &str, value: &Value) -> Result<()>;
    /// Removes `key`; removing an absent key succeeds.
    fn remove(&self, key: &str) -> Result<()>;
    /// A one-line description for logs, e.g. `http store at http://…`.
    fn describe(&self) -> String;
}
