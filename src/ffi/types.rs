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
/// Returned by `openSegment` on failure: Mooncake's -1, which its header
/// does not name (`pub(crate)` keeps it out of ours).
pub(crate) const INVALID_SEGMENT: segment_id_t = -1;
/// Copy from the target segment into `source`.
pub const OPCODE_READ: c_int = 0;
/// Copy from `source` into the target segment.
pub const OPCODE_WRITE: c_int = 1;

pub use crate::codes::*;

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
