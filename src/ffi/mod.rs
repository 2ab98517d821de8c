//! The C boundary: the only place with `extern "C"`. Panics are caught,
//! handles validated, and errors mapped to Mooncake's codes here.
//! `mooncake` holds the 27 functions of Mooncake's header, `ext` our own
//! (`te_*`, in `transfer_engine_ext.h`).

mod boundary;
mod ext;
mod graceful;
mod mooncake;
mod notify;
pub mod types;

pub use boundary::init_logging;
