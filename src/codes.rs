//! The return codes and task statuses of Mooncake's C API, with its
//! values: the `STATUS_*` of a task, and the `ERR_*` that functions
//! returning `0` or an error give. (The Status-returning functions give
//! the positive counterparts; see [`crate::error::Error::status_code`].)
//!
//! The `STATUS_*` go into the generated `transfer_engine_c.h`, as in
//! Mooncake's `transfer_engine_c.h`. The `ERR_*` are Mooncake's `error.h`,
//! which its C header does not define: they go into `transfer_engine_ext.h`
//! as `TE_ERR_*` (`cbindgen.toml` excludes them, `cbindgen_ext.toml` renames
//! them), so a C++ file may include Mooncake's `error.h` beside our headers.
//!
//! The codes Mooncake's headers do not define (success, and the positive
//! codes of the Status family that are not the negation of an `ERR_*`)
//! are `pub(crate)`: they stay out of the generated headers.

use std::ffi::c_int;

/// Task status: not finished.
pub const STATUS_WAITING: c_int = 0;
/// Task status: not used by this engine.
pub const STATUS_PENDING: c_int = 1;
/// Task status: not used by this engine.
pub const STATUS_INVALID: c_int = 2;
/// Task status: not used by this engine.
pub const STATUS_CANCELED: c_int = 3;
/// Task status: every byte moved.
pub const STATUS_COMPLETED: c_int = 4;
/// Task status: a slice is older than `MC_SLICE_TIMEOUT`.
pub const STATUS_TIMEOUT: c_int = 5;
/// Task status: the task failed. A FAILED READ may have filled part of its
/// `source` buffer. A FAILED WRITE may have landed in part: the bytes that
/// reached the peer before the failure. Once FAILED is reported, none of
/// its bytes is sent any more: the connections that carried it were reset,
/// discarding what the kernel still held, and this engine's own server
/// drops a request whose bytes stop arriving for
/// `MC_TCP_STATUS_TIMEOUT_SEC` instead of completing it later. A peer that
/// had received bytes but not yet stored them (a stopped process) may still
/// store those.
pub const STATUS_FAILED: c_int = 6;

/// Success of the functions that return `0` or an `ERR_*`.
pub(crate) const OK: c_int = 0;

/// Invalid argument (NULL pointer, zero length, unknown handle).
pub const ERR_INVALID_ARGUMENT: c_int = -1;
/// Too many requests for the batch.
pub const ERR_TOO_MANY_REQUESTS: c_int = -2;
/// Address not registered.
pub const ERR_ADDRESS_NOT_REGISTERED: c_int = -3;
/// Batch has tasks not yet seen terminal.
pub const ERR_BATCH_BUSY: c_int = -4;
/// No device for the location.
pub const ERR_DEVICE_NOT_FOUND: c_int = -6;
/// Registration overlaps an existing one.
pub const ERR_ADDRESS_OVERLAPPED: c_int = -7;
/// Name resolution failed.
pub const ERR_DNS: c_int = -101;
/// Socket error or timeout.
pub const ERR_SOCKET: c_int = -102;
/// Malformed JSON.
pub const ERR_MALFORMED_JSON: c_int = -103;
/// Handshake rejected by the peer.
pub const ERR_REJECT_HANDSHAKE: c_int = -104;
/// Metadata store or descriptor error.
pub const ERR_METADATA: c_int = -200;
/// Endpoint error.
pub const ERR_ENDPOINT: c_int = -201;
/// Device context error.
pub const ERR_CONTEXT: c_int = -202;
/// NUMA error.
pub const ERR_NUMA: c_int = -300;
/// Clock error.
pub const ERR_CLOCK: c_int = -301;
/// Memory error.
pub const ERR_MEMORY: c_int = -302;
/// Not implemented.
pub const ERR_NOT_IMPLEMENTED: c_int = -303;

/// Success of the Status-returning functions (Mooncake's `kOk`).
pub(crate) const STATUS_OK: c_int = 0;
/// Invalid argument, of the Status family (`kInvalidArgument`).
pub(crate) const STATUS_INVALID_ARGUMENT: c_int = 1;
/// The segment's protocol is not installed, of the Status family
/// (`kNotSupportedTransport`; no `ERR_*` counterpart).
pub(crate) const STATUS_NOT_SUPPORTED_TRANSPORT: c_int = 8;
/// Not implemented, of the Status family (`kNotImplemented`; not the
/// negation of `ERR_NOT_IMPLEMENTED`).
pub(crate) const STATUS_NOT_IMPLEMENTED: c_int = 999;
