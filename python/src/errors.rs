//! `TransferError`, raised by the methods beyond Mooncake's API. The class
//! is defined in Python (`transfer_engine._errors`) so that it carries the
//! integer `code` Mooncake's methods would have returned.

pyo3::import_exception!(transfer_engine._errors, TransferError);
