//! Every `MC_*` setting, declared once: one table per part of the
//! configuration, with its field, variables, type, default, allowed values
//! and meaning. The parts' `Default`, their readers and the tables of
//! `docs/configuration.md` come from here (see [`super::settings`]); the
//! parts' structs stay beside their users, and the compiler checks that
//! each table names every field.

use super::settings::*;
use super::{EngineConfig, LogLevel};
use crate::engine::control::NotifyLimits;
use crate::metadata::client_tls::TlsFiles;
use crate::metadata::{PeerLimits, StoreConfig};
use crate::rpc::RpcConfig;
use crate::topology::TopologyConfig;
use crate::transport::endpoint::{EndpointConfig, EndpointStoreType};
use crate::transport::rdma::RdmaConfig;
use crate::transport::scheduler::SchedConfig;
use crate::transport::shm::ShmConfig;
use crate::transport::tcp::{TcpConfig, default_io_threads};

const LOG_LEVELS: Words<LogLevel> = Words(&[
    ("INFO", LogLevel::Info),
    ("TRACE", LogLevel::Trace),
    ("WARNING", LogLevel::Warning),
    ("WARN", LogLevel::Warning),
    ("ERROR", LogLevel::Error),
]);

const STORE_TYPES: Words<EndpointStoreType> = Words(&[
    ("SIEVE", EndpointStoreType::Sieve),
    ("FIFO", EndpointStoreType::Fifo),
]);

/// `MC_TCP_PROTO`: `1` forces v1 framing, `2` (or unset) uses v2 where
/// the peer supports it.
const TCP_PROTO: Words<bool> = Words(&[("2", false), ("1", true)]);

/// The CPUs a default thread count follows: one per CPU, at most 4.
fn up_to_4_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().min(4))
}

/// A port Mooncake allows for the RPC range: 1024..=65535, outside the
/// ephemeral range 32768..=60999.
pub(crate) struct Port;

impl Parse<u16> for Port {
    fn parse(&self, raw: &str) -> Option<u16> {
        Range(1024u16, 65535)
            .parse(raw)
            .filter(|p| !(32768..=60999).contains(p))
    }
    fn allowed(&self) -> String {
        "a number in 1024..=65535 outside 32768..=60999".to_string()
    }
    fn show(&self, v: &u16) -> String {
        v.to_string()
    }
}

/// The range of RPC ports is empty when its minimum is above its maximum.
fn check_ports(rpc: &mut RpcConfig, r: &Reader<'_>) {
    if rpc.min_port > rpc.max_port {
        r.error(format!(
            "MC_MIN_RPC_PORT={} MC_MAX_RPC_PORT={} is not a range: the minimum is above \
             the maximum",
            rpc.min_port, rpc.max_port
        ));
        let d = RpcConfig::default();
        (rpc.min_port, rpc.max_port) = (d.min_port, d.max_port);
    }
}

/// `MC_FRAGMENT_RATIO` is read into `fragment_limit` as a ratio; set, the
/// limit is `slice_size / ratio` (Mooncake's rule); unset, 16384 stays.
fn fragment_limit(sched: &mut SchedConfig, r: &Reader<'_>) {
    let ratio = r
        .raw("MC_FRAGMENT_RATIO")
        .and_then(|v| Range(1u64, u64::MAX).parse(&v));
    if let Some(ratio) = ratio {
        sched.fragment_limit = sched.slice_size / ratio;
    }
}

settings! {
    /// The engine itself.
    engine: EngineConfig {
        log_level: LogLevel = LogLevel::Info, ["MC_LOG_LEVEL"], LOG_LEVELS,
            "log verbosity; `RUST_LOG` wins over it";
        force_tcp: bool = false, ["MC_FORCE_TCP"], Switch,
            "auto discovery installs TCP even where RDMA devices exist";
        strict_local: bool = false, ["MC_TE_STRICT_LOCAL"], Switch,
            "a request whose local `source` is not inside one registered buffer FAILS, on \
             every transport (default: as Mooncake, a TCP request's source is not checked)";
        slice_timeout_secs: u64 = 0, ["MC_SLICE_TIMEOUT"], Range(0u64, 65535),
            "seconds (0: off): a task still waiting that long after it was submitted \
             reports `STATUS_TIMEOUT`, as in Mooncake; it is not cancelled, and a later poll \
             can see it complete or fail";
        transfer_timeout_secs: u64 = 30, ["MC_TRANSFER_TIMEOUT"], Range(5u64, 86400),
            "seconds the Python binding's synchronous transfers wait, plus 1 ns per byte";
        force_hca: bool = false, ["MC_FORCE_HCA"], Switch,
            "auto discovery installs RDMA or the engine fails; wins over `MC_FORCE_TCP`";
        metric: bool = false, ["MC_TE_METRIC"], OnWords,
            "Mooncake's periodic `[Metrics]` throughput and latency line, with each \
             device's bandwidth and bytes in flight";
        metric_interval_secs: u64 = 5, ["MC_TE_METRIC_INTERVAL_SECONDS"], Range(1u64, 86400),
            "seconds between those lines";
    };

    /// The slice scheduler.
    sched: SchedConfig {
        slice_size: u64 = 65536, ["MC_SLICE_SIZE"], Range(1u64, 1 << 40),
            "bytes per slice of a large request";
        fragment_limit: u64 = 16384, ["MC_FRAGMENT_RATIO"], Range(1u64, u64::MAX),
            "a request's tail up to `MC_SLICE_SIZE / ratio` bytes joins the previous slice \
             (unset: 16384 bytes)", shown "unset";
        retry_cnt: u32 = 9, ["MC_RETRY_CNT"], Range(1u32, 127),
            "attempts per slice (on other rails) before its task fails";
        rail_pause_secs: u64 = 30, ["MC_RDMA_RAIL_PAUSE_SECONDS"], Range(1u64, 3599),
            "a rail with repeated errors, or one that cannot connect, is paused this long \
             (TCP and RDMA)";
        round_robin: bool = false, ["MC_PATH_ROUNDROBIN"], Switch,
            "off: the first rail of a slice is the least-loaded preferred one; on: the \
             preferred ones in turn, per thread";
    } then fragment_limit;

    /// The handshake listener and client.
    rpc: RpcConfig {
        handshake_port: u16 = 12001, ["MC_HANDSHAKE_PORT"], Range(1u16, 65535),
            "port assumed for a P2P name without one";
        min_port: u16 = 15000, ["MC_MIN_RPC_PORT", "MC_MIN_PRC_PORT"], Port,
            "the handshake and TCP data ports are random in `MC_MIN_RPC_PORT..=MC_MAX_RPC_PORT` \
             (also read as Mooncake's spelling `MC_MIN_PRC_PORT`)";
        max_port: u16 = 17000, ["MC_MAX_RPC_PORT", "MC_MAX_PRC_PORT"], Port,
            "the top of that range, at least `MC_MIN_RPC_PORT`";
        listen_backlog: u32 = 128, ["MC_HANDSHAKE_LISTEN_BACKLOG"], Range(1u32, 65535),
            "listen backlog of the handshake listener";
        connect_timeout_secs: u64 = 5, ["MC_HANDSHAKE_CONNECT_TIMEOUT"], Range(1u64, 3599),
            "seconds: bound on connecting to a peer's listener, including tries again after \
             a reset";
        max_length: u64 = 1 << 20, ["MC_HANDSHAKE_MAX_LENGTH"], Range(1u64 << 20, 128 << 20),
            "largest handshake frame, bytes";
        io_timeout_secs: u64 = 5, ["MC_HANDSHAKE_IO_TIMEOUT"], Range(1u64, 3600),
            "seconds: the listener's deadline for a whole request from the accept, for the \
             reply, and for the client's EOF after it";
        max_connections: usize = 256, ["MC_HANDSHAKE_MAX_CONNECTIONS"], Range(1usize, 65536),
            "handshake connections open at once";
        workers: usize = 4, ["MC_HANDSHAKE_WORKERS"], Range(1usize, 64),
            "threads answering handshake requests";
        max_buffered: u64 = 64 << 20, ["MC_HANDSHAKE_MAX_BUFFERED"], Range(1u64 << 20, 64 << 30),
            "bytes of requests and replies held across all connections";
        use_ipv6: bool = false, ["MC_USE_IPV6"], Switch,
            "try a peer's IPv6 addresses first";
        legacy_port_binding: bool = false, ["MC_LEGACY_RPC_PORT_BINDING"], Set(true),
            "bind the port named in the server name (Mooncake's old behaviour)";
        bind_address: Option<String> = None, ["MC_TCP_BIND_ADDRESS"], Text,
            "the address advertised with a store; a loopback address confines the engine to \
             loopback";
    } then check_ports;

    /// The notification queue.
    notify: NotifyLimits {
        max_size: usize = 64 << 10, ["MC_NOTIFY_MAX_SIZE"], Range(1usize, 128 << 20),
            "largest notification received (name and message), bytes; larger ones are \
             refused to the sender";
        max_count: usize = 1 << 16, ["MC_NOTIFY_QUEUE_MAX_COUNT"], Range(1usize, 1 << 24),
            "notifications kept until `getNotifsFromEngine`; the oldest dropped beyond";
        max_bytes: usize = 64 << 20, ["MC_NOTIFY_QUEUE_MAX_BYTES"], Range(64usize << 10, 64 << 30),
            "bytes of notifications kept; the oldest dropped beyond";
    };

    /// The metadata store and the descriptor cache.
    store: StoreConfig {
        metacache: bool = true, ["MC_DISABLE_METACACHE"], Set(false),
            "set: refetch a peer's descriptor on every use";
        refresh_interval_secs: u64 = 0, ["MC_TE_METADATA_REFRESH_INTERVAL_SECONDS"],
            Range(0u64, 86400),
            "seconds between background refreshes of peers' descriptors (0: off)";
        cluster_id: Option<String> = None, ["MC_METADATA_CLUSTER_ID"], Text,
            "key prefix `mooncake/<id>/`: keeps clusters apart on one store";
        redis_username: Option<String> = None, ["MC_REDIS_USERNAME"], Text,
            "redis AUTH user";
        redis_password: Option<crate::metadata::secret::Secret> = None, ["MC_REDIS_PASSWORD"],
            Password, "redis AUTH password";
        redis_db_index: u8 = 0, ["MC_REDIS_DB_INDEX"], Range(0u8, 255),
            "redis database";
        redis_tls: TlsFiles = TlsFiles::default(),
            ["MC_REDIS_CACERT", "MC_REDIS_CERT", "MC_REDIS_KEY"], Tls,
            "TLS of `rediss://` servers: CA (default: the system's), client certificate and \
             its key";
        etcd_auth: Option<(String, crate::metadata::secret::Secret)> = None,
            ["MC_ETCD_USERNAME", "MC_ETCD_PASSWORD"], Credentials,
            "etcd authentication";
        etcd_tls: TlsFiles = TlsFiles::default(),
            ["MC_ETCD_CACERT", "MC_ETCD_CERT", "MC_ETCD_KEY"], Tls,
            "TLS of `https://` etcd endpoints: CA (default: the system's), client certificate \
             and its key";
        http_token_file: Option<std::path::PathBuf> = None, ["MC_METADATA_AUTH_TOKEN_FILE"],
            FilePath, "bearer token sent to our HTTP metadata server";
        http_cacert: Option<std::path::PathBuf> = None, ["MC_METADATA_CACERT"], FilePath,
            "CA certificates of an `https://` metadata server (default: the system's)";
    };

    /// Bounds on peers' descriptors.
    peers: PeerLimits {
        max_devices: usize = 64, ["MC_PEER_MAX_DEVICES"], Range(1usize, 4096),
            "most devices (RDMA `devices`, TCP `tcp_devices`) a peer's descriptor may list";
        max_buffers: usize = 1 << 16, ["MC_PEER_MAX_BUFFERS"], Range(1usize, 1 << 24),
            "most buffers a peer's descriptor may list";
        max_descriptor_bytes: u64 = 64 << 20, ["MC_PEER_MAX_DESCRIPTOR_BYTES"],
            Range(64u64 << 10, 1 << 30),
            "largest descriptor read from a store (P2P replies are bounded by \
             `MC_HANDSHAKE_MAX_LENGTH`)";
    };

    /// Devices and the priority matrix.
    topology: TopologyConfig {
        custom_topo_json: Option<String> = None, ["MC_CUSTOM_TOPO_JSON"], Text,
            "path of a NIC priority-matrix file (`{\"cpu:0\": [[preferred], [available]]}`)";
        filters: Vec<String> = Vec::new(), ["MC_TE_FILTERS"], List,
            "devices to use (`mlx5_0`, `mlx5_0:2`, `eth0`)";
        cuda_visible_devices: Option<String> = None, ["CUDA_VISIBLE_DEVICES"], SetText,
            "the GPUs `cuda:N` numbers, as the CUDA runtime does: indexes or UUIDs \
             (`GPU-…`); empty: none ([rdma.md](rdma.md))";
        cuda_device_order: Option<String> = None, ["CUDA_DEVICE_ORDER"], SetText,
            "`PCI_BUS_ID` or `FASTEST_FIRST` (the CUDA runtime's default): the order of that \
             numbering";
    };

    /// The endpoint pools.
    endpoints: EndpointConfig {
        max_per_ctx: usize = 65536, ["MC_MAX_EP_PER_CTX"], Range(1usize, 65536),
            "endpoints per local device";
        store_type: EndpointStoreType = EndpointStoreType::Sieve, ["MC_ENDPOINT_STORE_TYPE"],
            STORE_TYPES, "endpoint pool eviction";
    };

    /// The TCP transport.
    tcp: TcpConfig {
        lanes_per_peer: usize = 4,
            ["MC_TCP_LANES_PER_PEER", "MC_TCP_MAX_CONNECTIONS_PER_PEER"], Range(1usize, 16),
            "connections per endpoint (one rail to one peer); also read as \
             `MC_TCP_MAX_CONNECTIONS_PER_PEER`";
        force_v1: bool = false, ["MC_TCP_PROTO"], TCP_PROTO,
            "`1` forces Mooncake's v1 (unacknowledged) framing towards every peer; `2` uses \
             v2 where the peer supports it";
        status_timeout_secs: u64 = 30, ["MC_TCP_STATUS_TIMEOUT_SEC"], Range(1u64, 3600),
            "seconds: a request that moves no byte this long fails (both sides)";
        io_threads: usize = default_io_threads(), ["MC_TCP_IO_THREADS"], Range(1usize, 64),
            "threads serving every connection of both sides", shown "one per CPU, at most 4";
        max_data_connections: usize = 4096, ["MC_TCP_MAX_DATA_CONNECTIONS"],
            Range(1usize, 1 << 20),
            "data connections served at once (and at most half the descriptor limit)";
        idle_timeout_secs: u64 = 300, ["MC_TCP_IDLE_TIMEOUT_SEC"], Range(2u64, 86400),
            "seconds: idle data connections are closed (clients close theirs after half of it)";
        min_rate: u64 = 64 << 10, ["MC_TCP_MIN_RATE_BYTES_PER_SEC"], Range(0u64, 1 << 30),
            "a request in progress whose peer moves fewer bytes per second, averaged over \
             each window, is dropped and its connection reset; 0: off";
        min_rate_window_secs: u64 = 10, ["MC_TCP_MIN_RATE_WINDOW_SEC"], Range(1u64, 3600),
            "seconds: that window";
    };

    /// The shared-memory transport.
    shm: ShmConfig {
        auto_install: bool = true, ["MC_TE_SHM"], Switch,
            "off: auto discovery leaves the shared-memory transport out";
        threads: usize = up_to_4_threads(), ["MC_SHM_THREADS"], Range(1usize, 64),
            "threads serving both sides", shown "one per CPU, at most 4";
        max_peers: usize = 256, ["MC_SHM_MAX_PEERS"], Range(1usize, 65536),
            "rings (attached initiators) served at once";
        ring_entries: usize = 1024, ["MC_SHM_RING_ENTRIES"], Range(16usize, 65536),
            "requests one initiator may have posted";
        table_slots: usize = 1 << 16, ["MC_SHM_TABLE_SLOTS"], Range(1usize, 1 << 24),
            "buffers published to peers (READs of others go over the network)";
        timeout_secs: u64 = 10, ["MC_SHM_TIMEOUT_SEC"], Range(1u64, 3600),
            "seconds: a target that completes none of our WRITEs this long has them withdrawn";
        spin_us: u64 = 50, ["MC_SHM_SPIN_US"], Range(0u64, 10_000),
            "microseconds an idle thread polls before sleeping, while work keeps coming";
        max_mappings: usize = 256, ["MC_SHM_MAX_MAPPINGS"], Range(1usize, 65536),
            "memfd buffers of one peer mapped at once";
    };

    /// The RDMA transport: Mooncake's variables, with Mooncake's defaults
    /// (all limited by what the device supports), then ours.
    rdma: RdmaConfig {
        ib_port: u8 = 1, ["MC_IB_PORT"], Range(1u8, 255),
            "the device port RDMA uses (its rail keeps the device's plain name)";
        gid_index: Option<u32> = None, ["MC_GID_INDEX", "NCCL_IB_GID_INDEX"],
            OrUnset(0u32, 255),
            "GID index; also read as `NCCL_IB_GID_INDEX`; -1 ranks the GID table (RoCE v2 on \
             a plain interface first)";
        mtu: u32 = 4096, ["MC_MTU"], Choices(&[512u32, 1024, 2048, 4096]),
            "largest path MTU; the port's when smaller";
        num_qp_per_ep: usize = 2, ["MC_NUM_QP_PER_EP"], Range(1usize, 255),
            "queue pairs per endpoint";
        max_wr: u32 = 256, ["MC_MAX_WR"], Range(1u32, 65535),
            "work requests per queue pair";
        max_sge: u32 = 4, ["MC_MAX_SGE"], Range(1u32, 65535),
            "scatter/gather entries per work request";
        max_inline: u32 = 64, ["MC_MAX_INLINE"], Range(0u32, 65535),
            "inline bytes per work request";
        max_cqe_per_ctx: u32 = 4096, ["MC_MAX_CQE_PER_CTX"], Range(1u32, 65535),
            "completion queue entries per device";
        workers_per_ctx: usize = 2, ["MC_WORKERS_PER_CTX"], Range(1usize, 8),
            "worker threads per device";
        pkey_index: u16 = 0, ["MC_PKEY_INDEX"], Range(0u16, 65535),
            "partition key index";
        traffic_class: Option<u8> = None, ["MC_IB_TC"], OrUnset(0u8, 255),
            "GRH traffic class; -1: the device's default";
        service_level: Option<u8> = None, ["MC_IB_SL"], OrUnset(0u8, 15),
            "service level; -1: 0";
        relaxed_ordering: bool = true, ["MC_IB_PCI_RELAXED_ORDERING"], NonZero(2),
            "relaxed ordering for memory regions where the device supports it (0: off)";
        max_mr_size: u64 = 1 << 40, ["MC_MAX_MR_SIZE"], Range(1u64, u64::MAX),
            "largest memory region, bytes; a larger buffer is registered in pieces";
        parallel_reg_mr: Option<bool> = None, ["MC_ENABLE_PARALLEL_REG_MR"], Tristate,
            "-1: register on the devices in parallel for buffers of 4 GiB and more when there \
             are several devices and at least 4 CPUs; 1 always; 0 never";
        max_concurrent_reg_mr: usize = 0, ["MC_MAX_CONCURRENT_REG_MR"], Range(0usize, 1 << 16),
            "registrations at once when in parallel (0: one per device)";
        ib_timeout: u8 = 14, ["MC_IB_TIMEOUT"], Range(1u8, 31),
            "local ACK timeout exponent (4.096 µs × 2^n, about 67 ms; the VM suite uses 20 \
             for soft-RoCE under emulation)";
        signal_interval: usize = 1, ["MC_RDMA_SIGNAL_INTERVAL"], Range(1usize, 64),
            "ours: every work request asks for a completion, as Mooncake's do; n > 1 signals \
             every n-th of a chain and the last, and counts the others done when a later one \
             completes (saves completion work on hardware; not reliable on soft-RoCE)";
        completion_timeout_secs: u64 = 10, ["MC_RDMA_COMPLETION_TIMEOUT"], Range(1u64, 3600),
            "ours: seconds a queue pair may hold work requests without completing any before \
             it is torn down and its slices fail over";
        max_passive_ep: usize = 1024, ["MC_RDMA_MAX_PASSIVE_EP"], Range(1usize, 65536),
            "ours: endpoints peers' handshakes may create on one device; at the bound the \
             least recently active one gives way";
        max_passive_ep_per_peer: usize = 32, ["MC_RDMA_MAX_PASSIVE_EP_PER_PEER"],
            Range(1usize, 65536),
            "ours: of those, per peer; beyond it its handshakes are refused";
        peer_lookups_per_sec: u32 = 100, ["MC_RDMA_PEER_LOOKUPS_PER_SEC"], Range(1u32, 100_000),
            "ours: lookups of the descriptors of peers not verified yet, per second and in a \
             burst";
        connect_threads: usize = 8, ["MC_RDMA_CONNECT_THREADS"], Range(1usize, 64),
            "ours: threads running our handshakes";
        num_cq_per_ctx: usize = 1, ["MC_NUM_CQ_PER_CTX"], Range(1usize, 255),
            "completion queues per device (queue `i` is polled by worker \
             `i % MC_WORKERS_PER_CTX`)";
        num_comp_channels_per_ctx: usize = 1, ["MC_NUM_COMP_CHANNELS_PER_CTX"],
            Range(1usize, 255),
            "completion channels per device";
        busy_poll_us: u64 = 0, ["MC_TE_RDMA_BUSY_POLL_US"], Range(0u64, 10_000_000),
            "ours: microseconds a worker keeps polling after it last found work before it \
             sleeps on the completion channel (Mooncake's workers spin for 100 ms)";
        dest_device_affinity: bool = false, ["MC_ENABLE_DEST_DEVICE_AFFINITY"], Switch,
            "a local device whose name the peer also has uses only the rail to that device";
        auto_gid_max_retries: u32 = 2, ["MC_AUTO_GID_MAX_RETRIES"], Range(0u32, 16),
            "a queue pair refused at RTR with EINVAL re-probes the GID table and tries the \
             next ranked GID (no effect with `MC_GID_INDEX`)";
        bind_address: Option<String> = None, ["MC_RDMA_BIND_ADDRESS"], Text,
            "RDMA connection names become `<address>:<port>@<device>`, published as \
             `rdma_server_name`; handshakes stay on the engine's name";
    };
}

/// The documentation of the peer-authentication settings, read by
/// [`crate::auth::AuthConfig::from_vars`] (two variables that make one
/// setting, with their own warnings).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn auth_doc() -> PartDoc {
    PartDoc {
        name: "auth",
        rows: vec![
            RowDoc {
                vars: &["MC_TE_AUTH_KEY_FILE"],
                doc: "`new[,old]`: hex, base64 or raw key files of at least 32 bytes, at \
                      most two",
                default: "unset (no key)".to_string(),
                allowed: "paths".to_string(),
            },
            RowDoc {
                vars: &["MC_TE_AUTH_KEY"],
                doc: "the key itself, for tests; warns; ignored when `MC_TE_AUTH_KEY_FILE` \
                      is set",
                default: "unset".to_string(),
                allowed: "text".to_string(),
            },
        ],
    }
}
