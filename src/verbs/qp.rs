//! Reliable-connected queue pairs: creation, the RESET -> INIT -> RTR ->
//! RTS walk, the error state, and posting RDMA READ/WRITE work requests.

use super::library::{ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, ibv_query_qp};
use super::{CompletionQueue, Gid, ProtectionDomain, check};
use rdma_sys::{
    ibv_access_flags, ibv_gid, ibv_post_send, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask,
    ibv_qp_init_attr, ibv_qp_state, ibv_qp_type, ibv_send_flags, ibv_send_wr, ibv_sge,
    ibv_wr_opcode,
};
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

/// Sizes of a queue pair's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePairCaps {
    /// Work requests per send (and receive) queue.
    pub max_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Inline data bytes.
    pub max_inline: u32,
}

/// What the RTR and RTS transitions need: the local port and GID index,
/// the peer's address and queue pair number, and the path parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams {
    /// Local port number (1-based).
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Path MTU as an `ibv_mtu` value.
    pub path_mtu: u32,
    /// Index of the local GID the packets come from.
    pub sgid_index: u8,
    /// Peer GID.
    pub remote_gid: Gid,
    /// Peer LID (0 on RoCE).
    pub remote_lid: u16,
    /// Peer queue pair number.
    pub remote_qpn: u32,
    /// GRH traffic class, if set.
    pub traffic_class: Option<u8>,
    /// Service level.
    pub service_level: u8,
    /// Outstanding RDMA READs served for the peer.
    pub max_dest_rd_atomic: u8,
    /// Outstanding RDMA READs issued.
    pub max_rd_atomic: u8,
    /// Local ACK timeout exponent (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
    /// Minimal RNR NAK timer.
    pub min_rnr_timer: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
}

/// One RDMA READ or WRITE of a contiguous range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkRequest {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Local address (source of a WRITE, destination of a READ).
    pub local_addr: u64,
    /// Bytes; 0 posts a request without a scatter/gather entry.
    pub len: u32,
    /// Local key of the region holding the local range.
    pub lkey: u32,
    /// Address in the peer.
    pub remote_addr: u64,
    /// Peer's remote key for that address.
    pub rkey: u32,
    /// WRITE (true) or READ.
    pub write: bool,
    /// Whether it produces a completion on success.
    pub signaled: bool,
}

/// The result of a post: the requests from `posted` on were not queued.
#[derive(Debug)]
pub struct PostError {
    /// Requests queued before the failure.
    pub posted: usize,
    /// Why the rest were not.
    pub error: io::Error,
}

impl WorkRequest {}

/// A reliable-connected queue pair, destroyed on drop.
pub struct QueuePair {
    ptr: NonNull<ibv_qp>,
    qp_num: u32,
    _pd: Arc<ProtectionDomain>,
    _cq: Arc<CompletionQueue>,
}

// SAFETY: verbs objects may be used from any thread; libibverbs serializes
// posts on one QP internally.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// Creates an RC queue pair on `pd` whose sends and receives complete
    /// on `cq`; only signaled requests produce successful completions.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QueuePairCaps,
    ) -> io::Result<QueuePair> {
        // SAFETY: plain C data; all-zero is valid.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.as_ptr();
        attr.recv_cq = cq.as_ptr();
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = caps.max_wr;
        attr.cap.max_recv_wr = caps.max_wr;
        attr.cap.max_send_sge = caps.max_sge;
        attr.cap.max_recv_sge = caps.max_sge;
        attr.cap.max_inline_data = caps.max_inline;
        // SAFETY: PD and CQ are alive (Arcs) and belong to one context.
        let raw = unsafe { ibv_create_qp(pd.as_ptr(), &mut attr) };
        let ptr = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: the QP was just created; `qp_num` is a plain field.
        let qp_num = unsafe { (*ptr.as_ptr()).qp_num };
        Ok(QueuePair {
            ptr,
            qp_num,
            _pd: pd.clone(),
            _cq: cq.clone(),
        })
    }

    /// The queue pair number the peer addresses.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: ibv_qp_attr_mask) -> io::Result<()> {
        // SAFETY: the QP is alive and `attr` is a valid attribute struct
        // with the fields named by `mask` set.
        check(unsafe { ibv_modify_qp(self.ptr.as_ptr(), attr, mask.0 as libc::c_int) })
    }

    /// Moves the queue pair to RESET (any state may).
    pub fn reset(&self) -> io::Result<()> {
        // SAFETY: plain C data; all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_RESET;
        self.modify(&mut attr, ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// Moves the queue pair to the error state: outstanding requests are
    /// flushed with error completions.
    pub fn to_error(&self) -> io::Result<()> {
        // SAFETY: plain C data; all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut attr, ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// RESET -> INIT -> RTR -> RTS towards the peer in `p`, with remote
    /// read and write (and atomics) allowed, as Mooncake sets them.
    pub fn connect(&self, p: &ConnectParams) -> Result<(), (&'static str, io::Error)> {
        self.reset().map_err(|e| ("RESET", e))?;
        // SAFETY: plain C data; all-zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.port_num = p.port;
        a.pkey_index = p.pkey_index;
        a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
            .0;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                | ibv_qp_attr_mask::IBV_QP_PORT
                | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS,
        )
        .map_err(|e| ("INIT", e))?;

        // SAFETY: plain C data; all-zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = p.path_mtu;
        a.ah_attr.grh.dgid = ibv_gid { raw: p.remote_gid };
        a.ah_attr.grh.sgid_index = p.sgid_index;
        a.ah_attr.grh.hop_limit = p.hop_limit;
        if let Some(tc) = p.traffic_class {
            a.ah_attr.grh.traffic_class = tc;
        }
        a.ah_attr.dlid = p.remote_lid;
        a.ah_attr.sl = p.service_level;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = p.port;
        a.dest_qp_num = p.remote_qpn;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = p.max_dest_rd_atomic;
        a.min_rnr_timer = p.min_rnr_timer;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_PATH_MTU
                | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER
                | ibv_qp_attr_mask::IBV_QP_AV
                | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
                | ibv_qp_attr_mask::IBV_QP_DEST_QPN
                | ibv_qp_attr_mask::IBV_QP_RQ_PSN,
        )
        .map_err(|e| ("RTR", e))?;

        // SAFETY: plain C data; all-zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.timeout = p.timeout;
        a.retry_cnt = p.retry_cnt;
        a.rnr_retry = p.rnr_retry;
        a.sq_psn = 0;
        a.max_rd_atomic = p.max_rd_atomic;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_TIMEOUT
                | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
                | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
                | ibv_qp_attr_mask::IBV_QP_SQ_PSN
                | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC,
        )
        .map_err(|e| ("RTS", e))
    }

    /// The packet sequence number the queue pair expects next from its
    /// peer: it advances with every request the peer sends (an RDMA WRITE
    /// or READ it issues against our memory), which no completion on our
    /// side reports.
    pub fn rq_psn(&self) -> io::Result<u32> {
        // SAFETY: plain C data; all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is alive; both out-structs are valid for writes.
        check(unsafe {
            ibv_query_qp(
                self.ptr.as_ptr(),
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_RQ_PSN.0 as libc::c_int,
                &mut init,
            )
        })?;
        Ok(attr.rq_psn)
    }

    /// Posts `wrs` as one chain of RDMA READs and WRITEs.
    ///
    /// # Safety
    /// Every local range must lie in a registered region whose `lkey` is
    /// given and which stays registered until the request completes (or
    /// the queue pair is destroyed); the same holds for the peer's range
    /// on the peer's side, which the peer's keys enforce.
    pub unsafe fn post(&self, wrs: &[WorkRequest]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<ibv_sge> = wrs
            .iter()
            .map(|w| ibv_sge {
                addr: w.local_addr,
                length: w.len,
                lkey: w.lkey,
            })
            .collect();
        // SAFETY: plain C data; all-zero is valid (NULL next, no flags).
        let mut chain: Vec<ibv_send_wr> = (0..wrs.len())
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        let base = chain.as_mut_ptr();
        for (i, w) in wrs.iter().enumerate() {
            let wr = &mut chain[i];
            wr.wr_id = w.wr_id;
            if w.len > 0 {
                wr.sg_list = &mut sges[i];
                wr.num_sge = 1;
            }
            wr.opcode = if w.write {
                ibv_wr_opcode::IBV_WR_RDMA_WRITE
            } else {
                ibv_wr_opcode::IBV_WR_RDMA_READ
            };
            wr.send_flags = if w.signaled {
                ibv_send_flags::IBV_SEND_SIGNALED.0
            } else {
                0
            };
            wr.wr.rdma = rdma_sys::rdma_t {
                remote_addr: w.remote_addr,
                rkey: w.rkey,
            };
            if i + 1 < wrs.len() {
                // SAFETY: `i + 1` is inside `chain`, which is not resized.
                wr.next = unsafe { base.add(i + 1) };
            }
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is alive; the chain and its SGEs live until the
        // call returns (the provider copies them); the caller guarantees
        // the ranges' registrations.
        let rc = unsafe { ibv_post_send(self.ptr.as_ptr(), base, &mut bad) };
        if rc == 0 {
            return Ok(());
        }
        let posted = if bad.is_null() {
            0
        } else {
            // SAFETY: `bad` points into `chain`.
            usize::try_from(unsafe { bad.offset_from(base) }).unwrap_or(0)
        };
        Err(PostError {
            posted,
            error: if rc > 0 {
                io::Error::from_raw_os_error(rc)
            } else {
                io::Error::last_os_error()
            },
        })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_qp` and destroyed once; afterwards
        // the device no longer touches any memory for its requests.
        if let Err(e) = check(unsafe { ibv_destroy_qp(self.ptr.as_ptr()) }) {
            tracing::warn!("ibv_destroy_qp({}) failed: {e}", self.qp_num);
        }
    }
}
