//! The C types and constants of Mooncake's `transfer_engine_c.h`, with the
//! same names, field order, sizes and alignment.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

/// Segment id returned by `openSegment` (a `#define` of `int32_t` in the header).
pub type segment_id_t = i32;
/// Same type as `segment_id_t` (a `#define` of `int32_t` in the header).
pub type segment_handle_t = i32;
/// Batch id returned by `allocateBatchID` (a `#define` of `uint64_t` in the header).
pub type batch_id_t = u64;
/// Opaque engine handle.
pub type transfer_engine_t = *mut c_void;
/// Opaque transport handle.
pub type transport_t = *mut c_void;

/// Segment id of the engine's own memory.
pub const LOCAL_SEGMENT: segment_id_t = 0;
/// Returned by `allocateBatchID` on failure.
pub const INVALID_BATCH: batch_id_t = u64::MAX;
/// Copy from the target segment into `source`.
pub const OPCODE_READ: c_int = 0;
/// Copy from `source` into the target segment.
pub const OPCODE_WRITE: c_int = 1;

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

/// One READ or WRITE request.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct transfer_request {
    /// `OPCODE_READ` or `OPCODE_WRITE`.
    pub opcode: c_int,
    /// Local memory: written by READ, read by WRITE.
    pub source: *mut c_void,
    /// Segment id from `openSegment`.
    pub target_id: segment_id_t,
    /// Absolute address in the target process.
    pub target_offset: u64,
    /// Bytes to move.
    pub length: u64,
}
/// Typedef of `struct transfer_request`.
pub type transfer_request_t = transfer_request;

/// A notification: sender-chosen name and message.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct notify_msg {
    /// Name (NUL-terminated).
    pub name: *mut c_char,
    /// Message (NUL-terminated).
    pub msg: *mut c_char,
}
/// Typedef of `struct notify_msg`.
pub type notify_msg_t = notify_msg;

/// Status of one task.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct transfer_status {
    /// One of the `STATUS_*` values.
    pub status: c_int,
    /// Bytes moved so far.
    pub transferred_bytes: u64,
}
/// Typedef of `struct transfer_status`.
pub type transfer_status_t = transfer_status;

/// The `rdma` member of `segment_desc`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct segment_desc_rdma {
    /// Base address.
    pub addr: *mut c_void,
    /// Size in bytes.
    pub size: u64,
    /// Location string.
    pub location: *const c_char,
}

/// The `nvmeof` member of `segment_desc`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct segment_desc_nvmeof {
    /// File path.
    pub file_path: *const c_char,
    /// Subsystem name.
    pub subsystem_name: *const c_char,
    /// Protocol.
    pub proto: *const c_char,
    /// Address.
    pub ip: *const c_char,
    /// Port.
    pub port: u64,
}

/// The union of `segment_desc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union segment_desc_union {
    /// RDMA memory.
    pub rdma: segment_desc_rdma,
    /// NVMe-oF target.
    pub nvmeof: segment_desc_nvmeof,
}

/// Segment description kept for source compatibility; no function uses it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct segment_desc {
    /// RDMA / NVMeoF.
    pub r#type: c_int,
    /// The description.
    pub desc_: segment_desc_union,
}
/// Typedef of `struct segment_desc`.
pub type segment_desc_t = segment_desc;

/// One buffer of `registerLocalMemoryBatch`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct buffer_entry {
    /// Base address.
    pub addr: *mut c_void,
    /// Length in bytes.
    pub length: usize,
}
/// Typedef of `struct buffer_entry`.
pub type buffer_entry_t = buffer_entry;

/// Load of one NIC, from `getNicLoadStats`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nic_load_stat {
    /// Device name (NUL-terminated, truncated to 63 bytes).
    pub device_name: [c_char; 64],
    /// Bytes posted and not yet completed.
    pub inflight_bytes: u64,
    /// Exponentially weighted bandwidth, bytes per second.
    pub ewma_bandwidth_bps: f64,
}
/// Typedef of `struct nic_load_stat`.
pub type nic_load_stat_t = nic_load_stat;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_mooncake() {
        assert_eq!(size_of::<transfer_request>(), 40);
        assert_eq!(offset_of!(transfer_request, source), 8);
        assert_eq!(offset_of!(transfer_request, target_id), 16);
        assert_eq!(offset_of!(transfer_request, target_offset), 24);
        assert_eq!(offset_of!(transfer_request, length), 32);
        assert_eq!(size_of::<transfer_status>(), 16);
        assert_eq!(size_of::<notify_msg>(), 16);
        assert_eq!(size_of::<buffer_entry>(), 16);
        assert_eq!(size_of::<nic_load_stat>(), 80);
        assert_eq!(offset_of!(nic_load_stat, inflight_bytes), 64);
        assert_eq!(offset_of!(nic_load_stat, ewma_bandwidth_bps), 72);
        assert_eq!(size_of::<segment_desc>(), 48);
    }
}
