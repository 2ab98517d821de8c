//! The RDMA transport's configuration, parsed in every build.

use crate::settings::{Choices, NonZero, OrUnset, Range, Switch, Text, Tristate};

crate::settings::settings! {
    /// The RDMA transport. Each setting (variables, Mooncake's
    /// default and bounds, meaning) is declared once in the table below.
    #[derive(Debug, Clone, PartialEq)]
    pub struct RdmaConfig("rdma") {
        /// `MC_IB_PORT`: the device port RDMA uses.
        ib_port: u8 = 1, ["MC_IB_PORT"], Range(1u8, 255),
            "the device port RDMA uses (its rail keeps the device's plain name)";
        /// `MC_GID_INDEX` (else `NCCL_IB_GID_INDEX`): the GID index; `None`
        /// (-1) ranks the GID table.
        gid_index: Option<u32> = None, ["MC_GID_INDEX", "NCCL_IB_GID_INDEX"],
            OrUnset(0u32, 255),
            "GID index; also read as `NCCL_IB_GID_INDEX`; -1 ranks the GID table (RoCE v2 on \
             a plain interface first)";
        /// `MC_MTU`: largest RDMA path MTU in bytes; the port's active MTU when
        /// smaller.
        mtu: u32 = 4096, ["MC_MTU"], Choices(&[512u32, 1024, 2048, 4096]),
            "largest path MTU; the port's when smaller";
        /// `MC_NUM_QP_PER_EP`: queue pairs per endpoint.
        num_qp_per_ep: usize = 2, ["MC_NUM_QP_PER_EP"], Range(1usize, 255),
            "queue pairs per endpoint";
        /// `MC_MAX_WR`: work requests per queue pair.
        max_wr: u32 = 256, ["MC_MAX_WR"], Range(1u32, 65535),
            "work requests per queue pair";
        /// `MC_MAX_SGE`: scatter/gather entries per work request.
        max_sge: u32 = 4, ["MC_MAX_SGE"], Range(1u32, 65535),
            "scatter/gather entries per work request";
        /// `MC_MAX_INLINE`: inline bytes per work request.
        max_inline: u32 = 64, ["MC_MAX_INLINE"], Range(0u32, 65535),
            "inline bytes per work request";
        /// `MC_MAX_CQE_PER_CTX`: completion queue entries per device.
        max_cqe_per_ctx: u32 = 4096, ["MC_MAX_CQE_PER_CTX"], Range(1u32, 65535),
            "completion queue entries per device";
        /// `MC_WORKERS_PER_CTX`: worker threads per device.
        workers_per_ctx: usize = 2, ["MC_WORKERS_PER_CTX"], Range(1usize, 8),
            "worker threads per device";
        /// `MC_PKEY_INDEX`.
        pkey_index: u16 = 0, ["MC_PKEY_INDEX"], Range(0u16, 65535),
            "partition key index";
        /// `MC_IB_TC`: GRH traffic class.
        traffic_class: Option<u8> = None, ["MC_IB_TC"], OrUnset(0u8, 255),
            "GRH traffic class; -1: the device's default";
        /// `MC_IB_SL`: service level.
        service_level: Option<u8> = None, ["MC_IB_SL"], OrUnset(0u8, 15),
            "service level; -1: 0";
        /// `MC_IB_PCI_RELAXED_ORDERING`: request relaxed ordering for memory
        /// regions where the device supports it (0 = off, 1 and 2 = on).
        relaxed_ordering: bool = true, ["MC_IB_PCI_RELAXED_ORDERING"], NonZero(2),
            "relaxed ordering for memory regions where the device supports it (0: off)";
        /// `MC_MAX_MR_SIZE`: largest memory region (1 TiB), further limited by
        /// the device. A larger buffer is registered as several regions of at
        /// most this size and published as one buffer entry each (Mooncake's
        /// split).
        max_mr_size: u64 = 1 << 40, ["MC_MAX_MR_SIZE"], Range(1u64, u64::MAX),
            "largest memory region, bytes; a larger buffer is registered in pieces";
        /// `MC_ENABLE_PARALLEL_REG_MR`: register a buffer on the devices in
        /// parallel: `None` (-1) when there are several devices,
        /// the buffer is at least 4 GiB and the machine has at least 4 CPUs
        /// (Mooncake's rule); `Some(true)` (1) always; `Some(false)` (0) never.
        parallel_reg_mr: Option<bool> = None, ["MC_ENABLE_PARALLEL_REG_MR"], Tristate,
            "-1: register on the devices in parallel for buffers of 4 GiB and more when there \
             are several devices and at least 4 CPUs; 1 always; 0 never";
        /// `MC_MAX_CONCURRENT_REG_MR`: at most this many registrations run at
        /// once when registering in parallel (0: one thread per
        /// device).
        max_concurrent_reg_mr: usize = 0, ["MC_MAX_CONCURRENT_REG_MR"], Range(0usize, 1 << 16),
            "registrations at once when in parallel (0: one per device)";
        /// `MC_IB_TIMEOUT`: the local ACK timeout of RDMA queue pairs as the
        /// verbs exponent, 4.096 us * 2^n (14 is about 67 ms). Soft-RoCE on an overloaded host needs more.
        ib_timeout: u8 = 14, ["MC_IB_TIMEOUT"], Range(1u8, 31),
            "local ACK timeout exponent (4.096 µs × 2^n, about 67 ms; the VM suite uses 20 \
             for soft-RoCE under emulation)";
        /// `MC_RDMA_SIGNAL_INTERVAL`: of the RDMA work requests posted as one
        /// chain, every n-th and the last ask for a completion (1: every one, as
        /// Mooncake). A larger n saves completion work; an
        /// unsignaled request counts as done when a later one of its queue
        /// pair completes, which soft-RoCE (rdma_rxe of Linux 6.1) does not
        /// honour under load.
        signal_interval: usize = 1, ["MC_RDMA_SIGNAL_INTERVAL"], Range(1usize, 64),
            "ours: every work request asks for a completion, as Mooncake's do; n > 1 signals \
             every n-th of a chain and the last, and counts the others done when a later one \
             completes (saves completion work on hardware; not reliable on soft-RoCE)";
        /// `MC_RDMA_COMPLETION_TIMEOUT`: seconds a queue pair may hold work
        /// requests without completing any before its endpoint is torn down
        /// and its slices fail over.
        completion_timeout_secs: u64 = 10, ["MC_RDMA_COMPLETION_TIMEOUT"], Range(1u64, 3600),
            "ours: seconds a queue pair may hold work requests without completing any before \
             it is torn down and its slices fail over";
        /// `MC_RDMA_MAX_PASSIVE_EP`: endpoints that peers' handshakes may
        /// create on one device; at the bound the least
        /// recently active one gives way.
        max_passive_ep: usize = 1024, ["MC_RDMA_MAX_PASSIVE_EP"], Range(1usize, 65536),
            "ours: endpoints peers' handshakes may create on one device; at the bound the \
             least recently active one gives way";
        /// `MC_RDMA_MAX_PASSIVE_EP_PER_PEER`: of those, how many one peer
        /// server may hold; beyond it its handshakes are
        /// refused.
        max_passive_ep_per_peer: usize = 32, ["MC_RDMA_MAX_PASSIVE_EP_PER_PEER"],
            Range(1usize, 65536),
            "ours: of those, per peer; beyond it its handshakes are refused";
        /// `MC_RDMA_PEER_LOOKUPS_PER_SEC`: lookups of the descriptors of peers
        /// not yet verified, per second and in a burst, that handshakes may
        /// cause.
        peer_lookups_per_sec: u32 = 100, ["MC_RDMA_PEER_LOOKUPS_PER_SEC"], Range(1u32, 100_000),
            "ours: lookups of the descriptors of peers not verified yet, per second and in a \
             burst";
        /// `MC_RDMA_CONNECT_THREADS`: threads that run our handshakes,
        /// different peers at once, one peer's in turn.
        connect_threads: usize = 8, ["MC_RDMA_CONNECT_THREADS"], Range(1usize, 64),
            "ours: threads running our handshakes";
        /// `MC_NUM_CQ_PER_CTX`: completion queues per device.
        /// Endpoints take them in turn; queue `i` is polled by worker
        /// `i % MC_WORKERS_PER_CTX` alone.
        num_cq_per_ctx: usize = 1, ["MC_NUM_CQ_PER_CTX"], Range(1usize, 255),
            "completion queues per device (queue `i` is polled by worker \
             `i % MC_WORKERS_PER_CTX`)";
        /// `MC_NUM_COMP_CHANNELS_PER_CTX`: completion channels per device (at
        /// most one per completion queue); queue `i` reports to
        /// channel `i % n`.
        num_comp_channels_per_ctx: usize = 1, ["MC_NUM_COMP_CHANNELS_PER_CTX"],
            Range(1usize, 255),
            "completion channels per device";
        /// `MC_TE_RDMA_BUSY_POLL_US`: how long a worker keeps polling its
        /// completion queues and runnable endpoints without sleeping after it
        /// last found work, in microseconds (0 = sleep at once, waiting for a
        /// completion event or a wake). Mooncake has no knob:
        /// its workers spin for 100 ms. The default is 0: in the soft-RoCE VM
        /// (scripts/bench-rdma.sh) a 200 us spell moved no more bytes at 4 KiB
        /// to 1 MiB than waiting for events, and an idle engine then burns no
        /// CPU at all.
        busy_poll_us: u64 = 0, ["MC_TE_RDMA_BUSY_POLL_US"], Range(0u64, 10_000_000),
            "ours: microseconds a worker keeps polling after it last found work before it \
             sleeps on the completion channel (Mooncake's workers spin for 100 ms)";
        /// `MC_ENABLE_DEST_DEVICE_AFFINITY`: a local device whose name a peer
        /// device also has uses only the rail to that device (Mooncake's
        /// destination device affinity: fewer queue pairs on rail-optimized
        /// fabrics); other local devices keep every rail (off).
        dest_device_affinity: bool = false, ["MC_ENABLE_DEST_DEVICE_AFFINITY"], Switch,
            "a local device whose name the peer also has uses only the rail to that device",
            mooncake "set at all, even to `0` or empty, turns it on";
        /// `MC_AUTO_GID_MAX_RETRIES`: with ranked GIDs (`MC_GID_INDEX` unset),
        /// how many times a handshake whose queue pair refuses RTR with EINVAL
        /// re-probes the GID table and tries the next ranked GID.
        auto_gid_max_retries: u32 = 2, ["MC_AUTO_GID_MAX_RETRIES"], Range(0u32, 16),
            "a queue pair refused at RTR with EINVAL re-probes the GID table and tries the \
             next ranked GID (no effect with `MC_GID_INDEX`)";
        /// `MC_RDMA_BIND_ADDRESS`: the address of a second, RDMA-reachable
        /// name (`<address>:<port of the engine's name>`), published as
        /// `rdma_server_name` and used in our NIC paths (unset: the engine's
        /// name).
        bind_address: Option<String> = None, ["MC_RDMA_BIND_ADDRESS"], Text,
            "RDMA connection names become `<address>:<port>@<device>`, published as \
             `rdma_server_name`; handshakes stay on the engine's name";
    };
}
