//! The RDMA transport's configuration, parsed in every build.

/// The RDMA transport. Parsed from `MC_*` variables by
/// [`crate::engine::config::Config::from_env`]; the defaults and bounds
/// (Mooncake's) are declared in `src/engine/config/table.rs`.
#[derive(Debug, Clone, PartialEq)]
pub struct RdmaConfig {
    /// `MC_IB_PORT`: the device port RDMA uses.
    pub ib_port: u8,
    /// `MC_GID_INDEX` (else `NCCL_IB_GID_INDEX`): the GID index; `None`
    /// (-1) ranks the GID table.
    pub gid_index: Option<u32>,
    /// `MC_MTU`: largest RDMA path MTU in bytes; the port's active MTU when
    /// smaller.
    pub mtu: u32,
    /// `MC_NUM_QP_PER_EP`: queue pairs per endpoint.
    pub num_qp_per_ep: usize,
    /// `MC_MAX_WR`: work requests per queue pair.
    pub max_wr: u32,
    /// `MC_MAX_SGE`: scatter/gather entries per work request.
    pub max_sge: u32,
    /// `MC_MAX_INLINE`: inline bytes per work request.
    pub max_inline: u32,
    /// `MC_MAX_CQE_PER_CTX`: completion queue entries per device.
    pub max_cqe_per_ctx: u32,
    /// `MC_WORKERS_PER_CTX`: worker threads per device.
    pub workers_per_ctx: usize,
    /// `MC_PKEY_INDEX`.
    pub pkey_index: u16,
    /// `MC_IB_TC`: GRH traffic class.
    pub traffic_class: Option<u8>,
    /// `MC_IB_SL`: service level.
    pub service_level: Option<u8>,
    /// `MC_IB_PCI_RELAXED_ORDERING`: request relaxed ordering for memory
    /// regions where the device supports it (0 = off, 1 and 2 = on).
    pub relaxed_ordering: bool,
    /// `MC_MAX_MR_SIZE`: largest memory region (1 TiB), further limited by
    /// the device. A larger buffer is registered as several regions of at
    /// most this size and published as one buffer entry each (Mooncake's
    /// split).
    pub max_mr_size: u64,
    /// `MC_ENABLE_PARALLEL_REG_MR`: register a buffer on the devices in
    /// parallel: `None` (-1) when there are several devices,
    /// the buffer is at least 4 GiB and the machine has at least 4 CPUs
    /// (Mooncake's rule); `Some(true)` (1) always; `Some(false)` (0) never.
    pub parallel_reg_mr: Option<bool>,
    /// `MC_MAX_CONCURRENT_REG_MR`: at most this many registrations run at
    /// once when registering in parallel (0: one thread per
    /// device).
    pub max_concurrent_reg_mr: usize,
    /// `MC_IB_TIMEOUT`: the local ACK timeout of RDMA queue pairs as the
    /// verbs exponent, 4.096 us * 2^n (14 is about 67 ms). Soft-RoCE on an overloaded host needs more.
    pub ib_timeout: u8,
    /// `MC_RDMA_SIGNAL_INTERVAL`: of the RDMA work requests posted as one
    /// chain, every n-th and the last ask for a completion (1: every one, as
    /// Mooncake). A larger n saves completion work; an
    /// unsignaled request counts as done when a later one of its queue
    /// pair completes, which soft-RoCE (rdma_rxe of Linux 6.1) does not
    /// honour under load.
    pub signal_interval: usize,
    /// `MC_RDMA_COMPLETION_TIMEOUT`: seconds a queue pair may hold work
    /// requests without completing any before its endpoint is torn down
    /// and its slices fail over.
    pub completion_timeout_secs: u64,
    /// `MC_RDMA_MAX_PASSIVE_EP`: endpoints that peers' handshakes may
    /// create on one device; at the bound the least
    /// recently active one gives way.
    pub max_passive_ep: usize,
    /// `MC_RDMA_MAX_PASSIVE_EP_PER_PEER`: of those, how many one peer
    /// server may hold; beyond it its handshakes are
    /// refused.
    pub max_passive_ep_per_peer: usize,
    /// `MC_RDMA_PEER_LOOKUPS_PER_SEC`: lookups of the descriptors of peers
    /// not yet verified, per second and in a burst, that handshakes may
    /// cause.
    pub peer_lookups_per_sec: u32,
    /// `MC_RDMA_CONNECT_THREADS`: threads that run our handshakes,
    /// different peers at once, one peer's in turn.
    pub connect_threads: usize,
    /// `MC_NUM_CQ_PER_CTX`: completion queues per device.
    /// Endpoints take them in turn; queue `i` is polled by worker
    /// `i % MC_WORKERS_PER_CTX` alone.
    pub num_cq_per_ctx: usize,
    /// `MC_NUM_COMP_CHANNELS_PER_CTX`: completion channels per device (at
    /// most one per completion queue); queue `i` reports to
    /// channel `i % n`.
    pub num_comp_channels_per_ctx: usize,
    /// `MC_TE_RDMA_BUSY_POLL_US`: how long a worker keeps polling its
    /// completion queues and runnable endpoints without sleeping after it
    /// last found work, in microseconds (0 = sleep at once, waiting for a
    /// completion event or a wake). Mooncake has no knob:
    /// its workers spin for 100 ms. The default is 0: in the soft-RoCE VM
    /// (scripts/bench-rdma.sh) a 200 us spell moved no more bytes at 4 KiB
    /// to 1 MiB than waiting for events, and an idle engine then burns no
    /// CPU at all.
    pub busy_poll_us: u64,
    /// `MC_ENABLE_DEST_DEVICE_AFFINITY`: a local device whose name a peer
    /// device also has uses only the rail to that device (Mooncake's
    /// destination device affinity: fewer queue pairs on rail-optimized
    /// fabrics); other local devices keep every rail (off).
    pub dest_device_affinity: bool,
    /// `MC_AUTO_GID_MAX_RETRIES`: with ranked GIDs (`MC_GID_INDEX` unset),
    /// how many times a handshake whose queue pair refuses RTR with EINVAL
    /// re-probes the GID table and tries the next ranked GID.
    pub auto_gid_max_retries: u32,
    /// `MC_RDMA_BIND_ADDRESS`: the address of a second, RDMA-reachable
    /// name (`<address>:<port of the engine's name>`), published as
    /// `rdma_server_name` and used in our NIC paths (unset: the engine's
    /// name).
    pub bind_address: Option<String>,
}
