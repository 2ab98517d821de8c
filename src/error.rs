//! The one error type of the engine core and its two C code families.
//!
//! Mooncake's C API has two return-code families: functions returning a
//! `Status` give positive codes (`submitTransfer`, `getTransferStatus`,
//! `freeBatchID`, `submitTransferWithNotify`), the others give `0` or a
//! negative `ERR_*`. [`Error::status_code`] and [`Error::err_code`] map one
//! error to each family.

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

/// `ERR_*` values of Mooncake's `error.h`.
pub mod err {
    /// `ERR_INVALID_ARGUMENT`
    pub const INVALID_ARGUMENT: i32 = -1;
    /// `ERR_TOO_MANY_REQUESTS`
    pub const TOO_MANY_REQUESTS: i32 = -2;
    /// `ERR_ADDRESS_NOT_REGISTERED`
    pub const ADDRESS_NOT_REGISTERED: i32 = -3;
    /// `ERR_BATCH_BUSY`
    pub const BATCH_BUSY: i32 = -4;
    /// `ERR_DEVICE_NOT_FOUND`
    pub const DEVICE_NOT_FOUND: i32 = -6;
    /// `ERR_ADDRESS_OVERLAPPED`
    pub const ADDRESS_OVERLAPPED: i32 = -7;
    /// `ERR_DNS`
    pub const DNS: i32 = -101;
    /// `ERR_SOCKET`
    pub const SOCKET: i32 = -102;
    /// `ERR_MALFORMED_JSON`
    pub const MALFORMED_JSON: i32 = -103;
    /// `ERR_REJECT_HANDSHAKE`
    pub const REJECT_HANDSHAKE: i32 = -104;
    /// `ERR_METADATA`
    pub const METADATA: i32 = -200;
    /// `ERR_ENDPOINT`
    pub const ENDPOINT: i32 = -201;
    /// `ERR_CONTEXT`
    pub const CONTEXT: i32 = -202;
    /// `ERR_NUMA`
    pub const NUMA: i32 = -300;
    /// `ERR_CLOCK`
    pub const CLOCK: i32 = -301;
    /// `ERR_MEMORY`
    pub const MEMORY: i32 = -302;
    /// `ERR_NOT_IMPLEMENTED`
    pub const NOT_IMPLEMENTED: i32 = -303;
}

/// Positive `Status` codes of Mooncake's `status.h`.
pub mod status {
    /// `kOk`
    pub const OK: i32 = 0;
    /// `kInvalidArgument`
    pub const INVALID_ARGUMENT: i32 = 1;
    /// `kTooManyRequests`
    pub const TOO_MANY_REQUESTS: i32 = 2;
    /// `kAddressNotRegistered`
    pub const ADDRESS_NOT_REGISTERED: i32 = 3;
    /// `kBatchBusy`
    pub const BATCH_BUSY: i32 = 4;
    /// `kDeviceNotFound`
    pub const DEVICE_NOT_FOUND: i32 = 6;
    /// `kAddressOverlapped`
    pub const ADDRESS_OVERLAPPED: i32 = 7;
    /// `kNotSupportedTransport`
    pub const NOT_SUPPORTED_TRANSPORT: i32 = 8;
    /// `kDns`
    pub const DNS: i32 = 101;
    /// `kSocket`
    pub const SOCKET: i32 = 102;
    /// `kMalformedJson`
    pub const MALFORMED_JSON: i32 = 103;
    /// `kRejectHandshake`
    pub const REJECT_HANDSHAKE: i32 = 104;
    /// `kMetadata`
    pub const METADATA: i32 = 200;
    /// `kEndpoint`
    pub const ENDPOINT: i32 = 201;
    /// `kContext`
    pub const CONTEXT: i32 = 202;
    /// `kMemory`
    pub const MEMORY: i32 = 302;
    /// `kNotImplemented`
    pub const NOT_IMPLEMENTED: i32 = 999;
}

impl Error {
    /// The negative `ERR_*` code for functions that return `0` or `ERR_*`.
    pub fn err_code(&self) -> i32 {
        match self {
            Error::InvalidArgument(_) => err::INVALID_ARGUMENT,
            Error::TooManyRequests(_) => err::TOO_MANY_REQUESTS,
            Error::AddressNotRegistered(_) => err::ADDRESS_NOT_REGISTERED,
            Error::BatchBusy => err::BATCH_BUSY,
            Error::DeviceNotFound(_) => err::DEVICE_NOT_FOUND,
            Error::AddressOverlapped(_) => err::ADDRESS_OVERLAPPED,
            Error::NotSupportedTransport(_) => err::INVALID_ARGUMENT,
            Error::Dns(_) => err::DNS,
            Error::Socket(_) => err::SOCKET,
            Error::MalformedJson(_) => err::MALFORMED_JSON,
            Error::RejectHandshake(_) => err::REJECT_HANDSHAKE,
            Error::Metadata(_) => err::METADATA,
            Error::Endpoint(_) => err::ENDPOINT,
            Error::Context(_) => err::CONTEXT,
            Error::Memory(_) => err::MEMORY,
            Error::NotImplemented(_) => err::NOT_IMPLEMENTED,
        }
    }

    /// The positive `Status` code for the Status-returning functions.
    pub fn status_code(&self) -> i32 {
        match self {
            Error::InvalidArgument(_) => status::INVALID_ARGUMENT,
            Error::TooManyRequests(_) => status::TOO_MANY_REQUESTS,
            Error::AddressNotRegistered(_) => status::ADDRESS_NOT_REGISTERED,
            Error::BatchBusy => status::BATCH_BUSY,
            Error::DeviceNotFound(_) => status::DEVICE_NOT_FOUND,
            Error::AddressOverlapped(_) => status::ADDRESS_OVERLAPPED,
            Error::NotSupportedTransport(_) => status::NOT_SUPPORTED_TRANSPORT,
            Error::Dns(_) => status::DNS,
            Error::Socket(_) => status::SOCKET,
            Error::MalformedJson(_) => status::MALFORMED_JSON,
            Error::RejectHandshake(_) => status::REJECT_HANDSHAKE,
            Error::Metadata(_) => status::METADATA,
            Error::Endpoint(_) => status::ENDPOINT,
            Error::Context(_) => status::CONTEXT,
            Error::Memory(_) => status::MEMORY,
            Error::NotImplemented(_) => status::NOT_IMPLEMENTED,
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
