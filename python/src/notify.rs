//! `TransferNotify`: a notification's name and message, as Mooncake's
//! binding exposes it (`TransferNotify()`, `TransferNotify(name, msg)`,
//! readable and writable `name` and `msg`).

use pyo3::prelude::*;

/// A notification: sent with `transfer_sync(..., notify=...)` to the owner
/// of the target segment once the transfer completes, and returned by
/// `get_notifies()` on the receiving side.
#[pyclass(module = "transfer_engine._native", get_all, set_all, eq)]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TransferNotify {
    /// The notification's name.
    pub name: String,
    /// Its message.
    pub msg: String,
}

impl TransferNotify {
    /// A notification with these fields.
    pub fn from_pair(name: String, msg: String) -> TransferNotify {
        TransferNotify { name, msg }
    }

    /// `(name, msg)`.
    pub fn pair(&self) -> (String, String) {
        (self.name.clone(), self.msg.clone())
    }
}

#[pymethods]
impl TransferNotify {
    #[new]
    #[pyo3(signature = (name = String::new(), msg = String::new()))]
    fn new(name: String, msg: String) -> Self {
        TransferNotify { name, msg }
    }

    fn __repr__(&self) -> String {
        format!("TransferNotify(name={:?}, msg={:?})", self.name, self.msg)
    }
}
