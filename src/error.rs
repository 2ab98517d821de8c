//! The one error type of the engine core and its two C code families.
//!
//! Mooncake's C API has two return-code families: functions returning a
//! `Status` give positive codes (`submitTransfer`, `getTransferStatus`,
//! `freeBatchID`, `submitTransferWithNotify`), the others give `0` or a
//! negative `ERR_*`. [`Error::status_code`] and [`Error::err_code`] map one
//! error to each family; their values are those of Mooncake's `status.h`
//! and `error.h`.

use crate::codes::*;
use std::fmt;

/// Every failure the engine reports to a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A NULL pointer, a zero length, an unknown handle or a value out of range.
    InvalidArgument(String),
    /// More requests than the batch was allocated for.
    TooManyRequests(String),
    /// An address or range that no registered buffer covers.
    AddressNotRegistered(String),
    /// A batch with tasks not yet observed terminal.
    BatchBusy,
    /// No device serves the requested location.
    DeviceNotFound(String),
    /// A registration that overlaps an existing one.
    AddressOverlapped(String),
    /// The segment's protocol is not installed locally.
    NotSupportedTransport(String),
    /// A host name that does not resolve.
    Dns(String),
    /// A connect, read or write that failed or timed out.
    Socket(String),
    /// A peer whose connection was refused, reset on connect, or that has
    /// no route: a definite failure, reported at once rather than retried
    /// (its process exited, or its host is down).
    Unreachable(String),
    /// JSON that does not parse or does not have the expected shape.
    MalformedJson(String),
    /// A handshake the peer refused.
    RejectHandshake(String),
    /// A metadata store or descriptor failure.
    Metadata(String),
    /// An endpoint (connection) that could not be set up.
    Endpoint(String),
    /// A device context that could not be set up.
    Context(String),
    /// Memory that could not be allocated or pinned.
    Memory(String),
    /// A capability this build or this engine does not provide.
    NotImplemented(String),
}

impl Error {
    /// The negative `ERR_*` code for functions that return `0` or `ERR_*`.
    pub fn err_code(&self) -> i32 {
        match self {
            Error::InvalidArgument(_) => ERR_INVALID_ARGUMENT,
            Error::TooManyRequests(_) => ERR_TOO_MANY_REQUESTS,
            Error::AddressNotRegistered(_) => ERR_ADDRESS_NOT_REGISTERED,
            Error::BatchBusy => ERR_BATCH_BUSY,
            Error::DeviceNotFound(_) => ERR_DEVICE_NOT_FOUND,
            Error::AddressOverlapped(_) => ERR_ADDRESS_OVERLAPPED,
            Error::NotSupportedTransport(_) => ERR_INVALID_ARGUMENT,
            Error::Dns(_) => ERR_DNS,
            Error::Socket(_) | Error::Unreachable(_) => ERR_SOCKET,
            Error::MalformedJson(_) => ERR_MALFORMED_JSON,
            Error::RejectHandshake(_) => ERR_REJECT_HANDSHAKE,
            Error::Metadata(_) => ERR_METADATA,
            Error::Endpoint(_) => ERR_ENDPOINT,
            Error::Context(_) => ERR_CONTEXT,
            Error::Memory(_) => ERR_MEMORY,
            Error::NotImplemented(_) => ERR_NOT_IMPLEMENTED,
        }
    }

    /// The positive `Status` code for the Status-returning functions.
    pub fn status_code(&self) -> i32 {
        match self {
            // Mooncake's kNotSupportedTransport and kNotImplemented have no
            // ERR_* counterpart of the same magnitude.
            Error::NotSupportedTransport(_) => STATUS_NOT_SUPPORTED_TRANSPORT,
            Error::NotImplemented(_) => STATUS_NOT_IMPLEMENTED,
            e => -e.err_code(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::TooManyRequests(m) => write!(f, "too many requests: {m}"),
            Error::AddressNotRegistered(m) => write!(f, "address not registered: {m}"),
            Error::BatchBusy => write!(f, "batch has tasks not yet observed terminal"),
            Error::DeviceNotFound(m) => write!(f, "device not found: {m}"),
            Error::AddressOverlapped(m) => write!(f, "address overlapped: {m}"),
            Error::NotSupportedTransport(m) => write!(f, "transport not installed: {m}"),
            Error::Dns(m) => write!(f, "name resolution failed: {m}"),
            Error::Socket(m) => write!(f, "socket error: {m}"),
            Error::Unreachable(m) => write!(f, "peer unreachable: {m}"),
            Error::MalformedJson(m) => write!(f, "malformed JSON: {m}"),
            Error::RejectHandshake(m) => write!(f, "handshake rejected: {m}"),
            Error::Metadata(m) => write!(f, "metadata error: {m}"),
            Error::Endpoint(m) => write!(f, "endpoint error: {m}"),
            Error::Context(m) => write!(f, "context error: {m}"),
            Error::Memory(m) => write!(f, "memory error: {m}"),
            Error::NotImplemented(m) => write!(f, "not implemented: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// Result alias of the engine core.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_keep_mooncake_values() {
        let e = Error::AddressOverlapped("x".into());
        assert_eq!(e.err_code(), -7);
        assert_eq!(e.status_code(), 7);
        assert_eq!(Error::BatchBusy.status_code(), 4);
        assert_eq!(Error::NotImplemented(String::new()).status_code(), 999);
        assert_eq!(Error::NotImplemented(String::new()).err_code(), -303);
        assert_eq!(Error::NotSupportedTransport(String::new()).status_code(), 8);
    }
}
