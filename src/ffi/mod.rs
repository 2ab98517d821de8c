//! The C boundary: the only place with `extern "C"`. Panics are caught,
//! handles validated, and errors mapped to Mooncake's codes here.

mod boundary;
mod graceful;
mod mooncake;
mod notify;
pub mod types;
