//! Every `MC_*` environment variable the engine reads, parsed once with
//! Mooncake's defaults and bounds. A value that does not parse or is out of
//! bounds logs a warning that says what was kept, and the default stays.
//!
//! Parsing collects the warnings; [`config`] logs them once. The logging
//! setup reads `MC_LOG_LEVEL` through [`parsed`] first, so the warnings go
//! to the subscriber it installs instead of being lost before it exists.

use once_cell::sync::OnceCell;
use std::cell::RefCell;
use std::str::FromStr;
use std::sync::Once;
use tracing::warn;

/// Endpoint pool eviction policy (`MC_ENDPOINT_STORE_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointStoreType {
    /// Evict the oldest inserted endpoint.
    Fifo,
    /// SIEVE eviction (NSDI'24): the default.
    Sieve,
}

/// Log verbosity (`MC_LOG_LEVEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// `TRACE`
    Trace,
    /// `INFO` (the default)
    Info,
    /// `WARNING`
    Warning,
    /// `ERROR`
    Error,
}

/// The parsed configuration of the process.
#[derive(Debug, Clone)]
pub struct Config {
    /// `MC_SLICE_SIZE`: bytes per slice of a large request (65536).
    pub slice_size: u64,
    /// Derived from `MC_FRAGMENT_RATIO`: a tail up to this size joins the
    /// previous slice (16384, or `slice_size / ratio`).
    pub fragment_limit: u64,
    /// `MC_RETRY_CNT`: attempts per slice before its task fails (9, 1..=127).
    pub retry_cnt: u32,
    /// `MC_HANDSHAKE_PORT`: port assumed for a server name without one (12001).
    pub handshake_port: u16,
    /// `MC_MIN_RPC_PORT` (15000).
    pub min_rpc_port: u16,
    /// `MC_MAX_RPC_PORT` (17000).
    pub max_rpc_port: u16,
    /// `MC_HANDSHAKE_LISTEN_BACKLOG` (128).
    pub handshake_listen_backlog: u32,
    /// `MC_HANDSHAKE_CONNECT_TIMEOUT` in seconds (5, 1..=3599).
    pub handshake_connect_timeout_secs: u64,
    /// `MC_HANDSHAKE_MAX_LENGTH`: largest handshake frame (1 MiB..=128 MiB).
    pub handshake_max_length: u64,
    /// `MC_HANDSHAKE_IO_TIMEOUT` in seconds (5, 1..=3600): the handshake
    /// listener's deadline for a whole request from the accept, for writing
    /// the reply, and for the client's EOF after it.
    pub handshake_io_timeout_secs: u64,
    /// `MC_HANDSHAKE_MAX_CONNECTIONS` (256, 1..=65536): handshake
    /// connections open at once; at the bound the one that has waited
    /// longest for its client (to send a request or take a reply) makes
    /// room for a new one.
    pub handshake_max_connections: usize,
    /// `MC_HANDSHAKE_WORKERS` (4, 1..=64): threads that run the handlers of
    /// handshake requests.
    pub handshake_workers: usize,
    /// `MC_HANDSHAKE_MAX_BUFFERED` (64 MiB, 1 MiB..=64 GiB): bytes of
    /// handshake requests and replies held across all connections, a reply
    /// until the client has taken it (at least one frame of
    /// `MC_HANDSHAKE_MAX_LENGTH`).
    pub handshake_max_buffered: u64,
    /// `MC_NOTIFY_MAX_SIZE` (64 KiB, 1..=128 MiB): largest notification
    /// accepted (name and message bytes).
    pub notify_max_size: usize,
    /// `MC_NOTIFY_QUEUE_MAX_COUNT` (65536, 1..=16777216): notifications kept
    /// until `getNotifsFromEngine`; the oldest are dropped beyond it.
    pub notify_queue_max_count: usize,
    /// `MC_NOTIFY_QUEUE_MAX_BYTES` (64 MiB, 64 KiB..=64 GiB): bytes of
    /// notifications kept; the oldest are dropped beyond it.
    pub notify_queue_max_bytes: usize,
    /// `MC_RDMA_RAIL_PAUSE_SECONDS` (30, 1..=3599).
    pub rail_pause_secs: u64,
    /// `MC_LOG_LEVEL` (INFO).
    pub log_level: LogLevel,
    /// `MC_USE_IPV6`.
    pub use_ipv6: bool,
    /// `MC_DISABLE_METACACHE`: refetch remote descriptors on every use.
    pub metacache: bool,
    /// `MC_TE_METADATA_REFRESH_INTERVAL_SECONDS`; 0 = off.
    pub metadata_refresh_interval_secs: u64,
    /// `MC_METADATA_CLUSTER_ID`: key prefix `mooncake/<id>/`.
    pub metadata_cluster_id: Option<String>,
    /// `MC_LEGACY_RPC_PORT_BINDING`: bind the RPC port named in the server name.
    pub legacy_rpc_port_binding: bool,
    /// `MC_TCP_BIND_ADDRESS`: the address advertised in store mode; a
    /// loopback address also confines the engine to loopback.
    pub tcp_bind_address: Option<String>,
    /// `MC_FORCE_TCP`.
    pub force_tcp: bool,
    /// `MC_CUSTOM_TOPO_JSON`: path of a priority-matrix file.
    pub custom_topo_json: Option<String>,
    /// `MC_TE_FILTERS`: comma list of devices to use.
    pub te_filters: Vec<String>,
    /// `MC_PATH_ROUNDROBIN`: round-robin instead of random first choice.
    pub path_roundrobin: bool,
    /// `MC_MAX_EP_PER_CTX` (65536).
    pub max_ep_per_ctx: usize,
    /// `MC_ENDPOINT_STORE_TYPE` (SIEVE).
    pub endpoint_store_type: EndpointStoreType,
    /// `MC_TCP_LANES_PER_PEER` (alias `MC_TCP_MAX_CONNECTIONS_PER_PEER`): 4, 1..=16.
    pub tcp_lanes_per_peer: usize,
    /// `MC_TCP_PROTO=1` forces the v1 framing towards every peer.
    pub tcp_force_v1: bool,
    /// `MC_TCP_STATUS_TIMEOUT_SEC` (30): a TCP request that moves no byte
    /// for this long fails (both sides).
    pub tcp_status_timeout_secs: u64,
    /// `MC_TCP_IO_THREADS`: threads of the TCP transport, serving every
    /// connection of both sides (min(4, CPUs); 1..=64).
    pub tcp_io_threads: usize,
    /// `MC_TCP_MAX_DATA_CONNECTIONS`: data connections served at once
    /// (4096; also at most half the descriptor limit).
    pub tcp_max_data_connections: usize,
    /// `MC_TCP_IDLE_TIMEOUT_SEC`: an idle data connection is closed after
    /// this long by the server, after half of it by the client (300).
    pub tcp_idle_timeout_secs: u64,
    /// `MC_TCP_MIN_RATE_BYTES_PER_SEC`: a request in progress, on the data
    /// server or a client connection, fails with its connection reset when
    /// its peer takes fewer bytes per second than this,
    /// averaged over each `MC_TCP_MIN_RATE_WINDOW_SEC` (65536; 0 = off,
    /// up to 1 GiB/s).
    pub tcp_min_rate: u64,
    /// `MC_TCP_MIN_RATE_WINDOW_SEC`: the window the minimum rate is
    /// averaged over (10, 1..=3600).
    pub tcp_min_rate_window_secs: u64,
    /// `MC_TE_STRICT_LOCAL`: fail a request whose local `source` range is
    /// not inside one registered buffer, on every transport.
    pub strict_local: bool,
    /// `MC_REDIS_USERNAME`.
    pub redis_username: Option<String>,
    /// `MC_REDIS_PASSWORD`.
    pub redis_password: Option<String>,
    /// `MC_REDIS_DB_INDEX` (0, 0..=255).
    pub redis_db_index: u8,
    /// `MC_SLICE_TIMEOUT` in seconds (1..=65535; 0 = off, the default): a
    /// task still waiting this long after its slices were posted reports
    /// `STATUS_TIMEOUT`.
    pub slice_timeout_secs: u64,
    /// `MC_TRANSFER_TIMEOUT` in seconds (30, 5..=86400): how long the
    /// Python binding's synchronous transfers wait, plus 1 ns per byte.
    pub transfer_timeout_secs: u64,
    /// The warnings parsing produced (bad values and what was kept).
    pub warnings: Vec<String>,
    /// `MC_IB_PORT`: the device port RDMA uses (1, 1..=255).
    pub ib_port: u8,
    /// `MC_GID_INDEX` (else `NCCL_IB_GID_INDEX`): the GID index; `None`
    /// (-1, the default) ranks the GID table.
    pub gid_index: Option<u32>,
    /// `MC_MTU`: largest RDMA path MTU in bytes (4096; 512, 1024, 2048 or
    /// 4096); the port's active MTU when smaller.
    pub mtu: u32,
    /// `MC_NUM_QP_PER_EP`: queue pairs per endpoint (2, 1..=255).
    pub num_qp_per_ep: usize,
    /// `MC_MAX_WR`: work requests per queue pair (256, 1..=65535).
    pub max_wr: u32,
    /// `MC_MAX_SGE`: scatter/gather entries per work request (4, 1..=65535).
    pub max_sge: u32,
    /// `MC_MAX_INLINE`: inline bytes per work request (64, 0..=65535).
    pub max_inline: u32,
    /// `MC_MAX_CQE_PER_CTX`: completion queue entries per device (4096,
    /// 1..=65535).
    pub max_cqe_per_ctx: u32,
    /// `MC_WORKERS_PER_CTX`: worker threads per device (2, 1..=8).
    pub workers_per_ctx: usize,
    /// `MC_PKEY_INDEX` (0, 0..=65535).
    pub pkey_index: u16,
    /// `MC_IB_TC`: GRH traffic class (-1 = the device default, 0..=255).
    pub ib_traffic_class: Option<u8>,
    /// `MC_IB_SL`: service level (-1 = 0, 0..=15).
    pub ib_service_level: Option<u8>,
    /// `MC_IB_PCI_RELAXED_ORDERING`: request relaxed ordering for memory
    /// regions where the device supports it (1; 0 = off, 1 and 2 = on).
    pub ib_relaxed_ordering: bool,
    /// `MC_MAX_MR_SIZE`: largest memory region (1 TiB), further limited by
    /// the device.
    pub max_mr_size: u64,
    /// `MC_IB_TIMEOUT`: the local ACK timeout of RDMA queue pairs as the
    /// verbs exponent, 4.096 us * 2^n (14, about 67 ms, Mooncake's value;
    /// 1..=31). Soft-RoCE on an overloaded host needs more.
    pub ib_timeout: u8,
    /// `MC_RDMA_SIGNAL_INTERVAL`: of the RDMA work requests posted as one
    /// chain, every n-th and the last ask for a completion (1, every one,
    /// as Mooncake; 1..=64). A larger n saves completion work; an
    /// unsignaled request counts as done when a later one of its queue
    /// pair completes, which soft-RoCE (rdma_rxe of Linux 6.1) does not
    /// honour under load.
    pub rdma_signal_interval: usize,
    /// `MC_RDMA_COMPLETION_TIMEOUT`: seconds a queue pair may hold work
    /// requests without completing any before its endpoint is torn down
    /// and its slices fail over (10, 1..=3600).
    pub rdma_completion_timeout_secs: u64,
    /// `MC_PEER_MAX_DEVICES` (64, 1..=4096): most devices (RDMA `devices`,
    /// TCP `tcp_devices`) a peer's descriptor may list.
    pub peer_max_devices: usize,
    /// `MC_PEER_MAX_BUFFERS` (65536, 1..=16777216): most buffers a peer's
    /// descriptor may list.
    pub peer_max_buffers: usize,
    /// `MC_PEER_MAX_DESCRIPTOR_BYTES` (64 MiB, 64 KiB..=1 GiB): largest
    /// descriptor read from a metadata store (in P2P mode the reply frame
    /// is bounded by `MC_HANDSHAKE_MAX_LENGTH`).
    pub peer_max_descriptor_bytes: u64,
    /// `MC_RDMA_MAX_PASSIVE_EP`: endpoints that peers' handshakes may
    /// create on one device (1024, 1..=65536); at the bound the least
    /// recently active one gives way.
    pub rdma_max_passive_ep: usize,
    /// `MC_RDMA_MAX_PASSIVE_EP_PER_PEER`: of those, how many one peer
    /// server may hold (32, 1..=65536); beyond it its handshakes are
    /// refused.
    pub rdma_max_passive_ep_per_peer: usize,
    /// `MC_RDMA_PEER_LOOKUPS_PER_SEC`: lookups of the descriptors of peers
    /// not yet verified, per second and in a burst, that handshakes may
    /// cause (100, 1..=100000).
    pub rdma_peer_lookups_per_sec: u32,
    /// `MC_RDMA_CONNECT_THREADS`: threads that run our handshakes,
    /// different peers at once, one peer's in turn (8, 1..=64).
    pub rdma_connect_threads: usize,
    /// `MC_SHM_THREADS`: threads of the shared-memory transport, serving
    /// both sides (min(4, CPUs); 1..=64).
    pub shm_threads: usize,
    /// `MC_SHM_MAX_PEERS`: request rings (attached initiator processes)
    /// served at once (256, 1..=65536); at the bound the least recently
    /// active one gives way.
    pub shm_max_peers: usize,
    /// `MC_SHM_RING_ENTRIES`: WRITE requests one initiator may have posted
    /// to one target (1024, 16..=65536); 64 bytes each.
    pub shm_ring_entries: usize,
    /// `MC_SHM_TABLE_SLOTS`: registered buffers published to peers' READs
    /// (65536, 1..=16777216); 32 bytes each. READs of buffers beyond go
    /// over another transport.
    pub shm_table_slots: usize,
    /// `MC_SHM_TIMEOUT_SEC`: a target that completes none of our WRITEs
    /// for this long fails them (10, 1..=3600).
    pub shm_timeout_secs: u64,
    /// `MC_SHM_SPIN_US`: how long an idle thread of the shared-memory
    /// transport polls before it sleeps (50, 0..=10000).
    pub shm_spin_us: u64,
    /// `MC_SHM_MAX_MAPPINGS`: memfd-backed buffers of one peer that the
    /// shared-memory transport maps at once (256, 1..=65536); the least
    /// recently used mapping gives way.
    pub shm_max_mappings: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            slice_size: 65536,
            fragment_limit: 16384,
            retry_cnt: 9,
            handshake_port: 12001,
            min_rpc_port: 15000,
            max_rpc_port: 17000,
            handshake_listen_backlog: 128,
            handshake_connect_timeout_secs: 5,
            handshake_max_length: 1 << 20,
            handshake_io_timeout_secs: 5,
            handshake_max_connections: 256,
            handshake_workers: 4,
            handshake_max_buffered: 64 << 20,
            notify_max_size: 64 << 10,
            notify_queue_max_count: 1 << 16,
            notify_queue_max_bytes: 64 << 20,
            rail_pause_secs: 30,
            log_level: LogLevel::Info,
            use_ipv6: false,
            metacache: true,
            metadata_refresh_interval_secs: 0,
            metadata_cluster_id: None,
            legacy_rpc_port_binding: false,
            tcp_bind_address: None,
            force_tcp: false,
            custom_topo_json: None,
            te_filters: Vec::new(),
            path_roundrobin: false,
            max_ep_per_ctx: 65536,
            endpoint_store_type: EndpointStoreType::Sieve,
            tcp_lanes_per_peer: 4,
            tcp_force_v1: false,
            tcp_status_timeout_secs: 30,
            tcp_io_threads: default_io_threads(),
            tcp_max_data_connections: 4096,
            tcp_idle_timeout_secs: 300,
            tcp_min_rate: 64 << 10,
            tcp_min_rate_window_secs: 10,
            strict_local: false,
            redis_username: None,
            redis_password: None,
            redis_db_index: 0,
            slice_timeout_secs: 0,
            transfer_timeout_secs: 30,
            warnings: Vec::new(),
            ib_port: 1,
            gid_index: None,
            mtu: 4096,
            num_qp_per_ep: 2,
            max_wr: 256,
            max_sge: 4,
            max_inline: 64,
            max_cqe_per_ctx: 4096,
            workers_per_ctx: 2,
            pkey_index: 0,
            ib_traffic_class: None,
            ib_service_level: None,
            ib_relaxed_ordering: true,
            max_mr_size: 1 << 40,
            ib_timeout: 14,
            rdma_signal_interval: 1,
            rdma_completion_timeout_secs: 10,
            peer_max_devices: 64,
            peer_max_buffers: 1 << 16,
            peer_max_descriptor_bytes: 64 << 20,
            rdma_max_passive_ep: 1024,
            rdma_max_passive_ep_per_peer: 32,
            rdma_peer_lookups_per_sec: 100,
            rdma_connect_threads: 8,
            shm_threads: default_io_threads(),
            shm_max_peers: 256,
            shm_ring_entries: 1024,
            shm_table_slots: 1 << 16,
            shm_timeout_secs: 10,
            shm_spin_us: 50,
            shm_max_mappings: 256,
        }
    }
}

/// Default I/O threads of the TCP transport: one per CPU, at most 4.
fn default_io_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().min(4))
}

/// Reads variables through a lookup function so tests need no process env.
struct Reader<F: Fn(&str) -> Option<String>> {
    lookup: F,
    warnings: RefCell<Vec<String>>,
}

impl<F: Fn(&str) -> Option<String>> Reader<F> {
    /// Records a warning, logged later by [`config`].
    fn warn(&self, msg: String) {
        self.warnings.borrow_mut().push(msg);
    }

    fn raw(&self, name: &str) -> Option<String> {
        (self.lookup)(name).map(|v| v.trim().to_string())
    }

    fn string(&self, name: &str) -> Option<String> {
        self.raw(name).filter(|v| !v.is_empty())
    }

    /// A variable that is on when set to anything but empty, 0, false or no.
    fn flag(&self, name: &str) -> bool {
        match self.raw(name) {
            None => false,
            Some(v) => !matches!(
                v.to_ascii_lowercase().as_str(),
                "" | "0" | "false" | "no" | "off"
            ),
        }
    }

    /// A number within `lo..=hi`; anything else warns and keeps `default`.
    fn number<T>(&self, name: &str, default: T, lo: T, hi: T) -> T
    where
        T: FromStr + PartialOrd + Copy + std::fmt::Display,
    {
        let Some(v) = self.raw(name) else {
            return default;
        };
        match v.parse::<T>() {
            Ok(n) if n >= lo && n <= hi => n,
            Ok(_) => {
                self.warn(format!(
                    "{name}={v} is outside {lo}..={hi}; using {default}"
                ));
                default
            }
            Err(_) => {
                self.warn(format!("{name}={v} is not a number; using {default}"));
                default
            }
        }
    }
}

/// Mooncake's port-range rule: both in 1024..=65535, min <= max, and
/// neither inside the ephemeral range 32768..=60999.
fn valid_port_range(min: u32, max: u32) -> bool {
    let ok = |p: u32| (1024..=65535).contains(&p) && !(32768..=60999).contains(&p);
    ok(min) && ok(max) && min <= max
}

impl Config {
    /// Parses the configuration from the process environment.
    pub fn from_env() -> Config {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Parses the configuration from any variable lookup.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Config {
        let r = Reader {
            lookup,
            warnings: RefCell::new(Vec::new()),
        };
        let d = Config::default();
        let slice_size = r.number("MC_SLICE_SIZE", d.slice_size, 1, 1 << 40);
        let fragment_limit = match r.raw("MC_FRAGMENT_RATIO") {
            None => d.fragment_limit,
            Some(v) => match v.parse::<u64>() {
                Ok(ratio) if ratio > 0 => slice_size / ratio,
                _ => {
                    r.warn(format!(
                        "MC_FRAGMENT_RATIO={v} is not a positive number; using slice_size/4"
                    ));
                    slice_size / 4
                }
            },
        };
        let (mut min_rpc_port, mut max_rpc_port) = (d.min_rpc_port, d.max_rpc_port);
        let min = r
            .raw("MC_MIN_RPC_PORT")
            .or_else(|| r.raw("MC_MIN_PRC_PORT"));
        let max = r
            .raw("MC_MAX_RPC_PORT")
            .or_else(|| r.raw("MC_MAX_PRC_PORT"));
        if min.is_some() || max.is_some() {
            let lo = min
                .as_deref()
                .map_or(Some(15000), |v| v.parse::<u32>().ok());
            let hi = max
                .as_deref()
                .map_or(Some(17000), |v| v.parse::<u32>().ok());
            match (lo, hi) {
                (Some(lo), Some(hi)) if valid_port_range(lo, hi) => {
                    min_rpc_port = lo as u16;
                    max_rpc_port = hi as u16;
                }
                _ => r.warn(format!(
                    "MC_MIN_RPC_PORT={min:?} MC_MAX_RPC_PORT={max:?} is not a valid range \
                     (1024..=65535, min <= max, outside 32768..=60999); using 15000..=17000"
                )),
            }
        }
        let log_level = match r.raw("MC_LOG_LEVEL").map(|v| v.to_ascii_uppercase()) {
            None => LogLevel::Info,
            Some(v) => match v.as_str() {
                "TRACE" => LogLevel::Trace,
                "INFO" => LogLevel::Info,
                "WARNING" | "WARN" => LogLevel::Warning,
                "ERROR" => LogLevel::Error,
                _ => {
                    r.warn(format!(
                        "MC_LOG_LEVEL={v} is not TRACE, INFO, WARNING or ERROR; using INFO"
                    ));
                    LogLevel::Info
                }
            },
        };
        let endpoint_store_type = match r.raw("MC_ENDPOINT_STORE_TYPE") {
            None => EndpointStoreType::Sieve,
            Some(v) if v.eq_ignore_ascii_case("FIFO") => EndpointStoreType::Fifo,
            Some(v) if v.eq_ignore_ascii_case("SIEVE") => EndpointStoreType::Sieve,
            Some(v) => {
                r.warn(format!(
                    "MC_ENDPOINT_STORE_TYPE={v} is not FIFO or SIEVE; using SIEVE"
                ));
                EndpointStoreType::Sieve
            }
        };
        let lanes_var = if r.raw("MC_TCP_LANES_PER_PEER").is_some() {
            "MC_TCP_LANES_PER_PEER"
        } else {
            "MC_TCP_MAX_CONNECTIONS_PER_PEER"
        };
        let tcp_force_v1 = match r.raw("MC_TCP_PROTO") {
            None => false,
            Some(v) if v == "1" => true,
            Some(v) if v == "2" => false,
            Some(v) => {
                r.warn(format!(
                    "MC_TCP_PROTO={v} is not 1 or 2; using 2 where the peer supports it"
                ));
                false
            }
        };
        let gid_var = if r.raw("MC_GID_INDEX").is_some() {
            "MC_GID_INDEX"
        } else {
            "NCCL_IB_GID_INDEX"
        };
        let gid_index = match r.number::<i32>(gid_var, -1, -1, 255) {
            -1 => None,
            n => Some(n as u32),
        };
        let mtu = match r.raw("MC_MTU") {
            None => d.mtu,
            Some(v) => match v.parse::<u32>() {
                Ok(m @ (512 | 1024 | 2048 | 4096)) => m,
                _ => {
                    r.warn(format!(
                        "MC_MTU={v} is not 512, 1024, 2048 or 4096; using {}",
                        d.mtu
                    ));
                    d.mtu
                }
            },
        };
        let optional_u8 = |name: &str, hi: i32| match r.number::<i32>(name, -1, -1, hi) {
            -1 => None,
            n => Some(n as u8),
        };
        Config {
            slice_size,
            fragment_limit,
            retry_cnt: r.number("MC_RETRY_CNT", d.retry_cnt, 1, 127),
            handshake_port: r.number("MC_HANDSHAKE_PORT", d.handshake_port, 1, 65535),
            min_rpc_port,
            max_rpc_port,
            handshake_listen_backlog: r.number("MC_HANDSHAKE_LISTEN_BACKLOG", 128, 1, 65535),
            handshake_connect_timeout_secs: r.number("MC_HANDSHAKE_CONNECT_TIMEOUT", 5, 1, 3599),
            handshake_max_length: r.number(
                "MC_HANDSHAKE_MAX_LENGTH",
                d.handshake_max_length,
                1 << 20,
                128 << 20,
            ),
            handshake_io_timeout_secs: r.number(
                "MC_HANDSHAKE_IO_TIMEOUT",
                d.handshake_io_timeout_secs,
                1,
                3600,
            ),
            handshake_max_connections: r.number(
                "MC_HANDSHAKE_MAX_CONNECTIONS",
                d.handshake_max_connections,
                1,
                65536,
            ),
            handshake_workers: r.number("MC_HANDSHAKE_WORKERS", d.handshake_workers, 1, 64),
            handshake_max_buffered: r.number(
                "MC_HANDSHAKE_MAX_BUFFERED",
                d.handshake_max_buffered,
                1 << 20,
                64 << 30,
            ),
            notify_max_size: r.number("MC_NOTIFY_MAX_SIZE", d.notify_max_size, 1, 128 << 20),
            notify_queue_max_count: r.number(
                "MC_NOTIFY_QUEUE_MAX_COUNT",
                d.notify_queue_max_count,
                1,
                1 << 24,
            ),
            notify_queue_max_bytes: r.number(
                "MC_NOTIFY_QUEUE_MAX_BYTES",
                d.notify_queue_max_bytes,
                64 << 10,
                64 << 30,
            ),
            rail_pause_secs: r.number("MC_RDMA_RAIL_PAUSE_SECONDS", 30, 1, 3599),
            log_level,
            use_ipv6: r.flag("MC_USE_IPV6"),
            metacache: r.raw("MC_DISABLE_METACACHE").is_none(),
            metadata_refresh_interval_secs: r.number(
                "MC_TE_METADATA_REFRESH_INTERVAL_SECONDS",
                0,
                0,
                86400,
            ),
            metadata_cluster_id: r.string("MC_METADATA_CLUSTER_ID"),
            legacy_rpc_port_binding: r.raw("MC_LEGACY_RPC_PORT_BINDING").is_some(),
            tcp_bind_address: r.string("MC_TCP_BIND_ADDRESS"),
            force_tcp: r.flag("MC_FORCE_TCP"),
            custom_topo_json: r.string("MC_CUSTOM_TOPO_JSON"),
            te_filters: r
                .string("MC_TE_FILTERS")
                .map(|v| {
                    v.split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            path_roundrobin: r.flag("MC_PATH_ROUNDROBIN"),
            max_ep_per_ctx: r.number("MC_MAX_EP_PER_CTX", 65536, 1, 65536),
            endpoint_store_type,
            tcp_lanes_per_peer: r.number(lanes_var, 4, 1, 16),
            tcp_force_v1,
            tcp_status_timeout_secs: r.number("MC_TCP_STATUS_TIMEOUT_SEC", 30, 1, 3600),
            tcp_io_threads: r.number("MC_TCP_IO_THREADS", d.tcp_io_threads, 1, 64),
            tcp_max_data_connections: r.number(
                "MC_TCP_MAX_DATA_CONNECTIONS",
                d.tcp_max_data_connections,
                1,
                1 << 20,
            ),
            tcp_idle_timeout_secs: r.number(
                "MC_TCP_IDLE_TIMEOUT_SEC",
                d.tcp_idle_timeout_secs,
                2,
                86400,
            ),
            tcp_min_rate: r.number("MC_TCP_MIN_RATE_BYTES_PER_SEC", d.tcp_min_rate, 0, 1 << 30),
            tcp_min_rate_window_secs: r.number(
                "MC_TCP_MIN_RATE_WINDOW_SEC",
                d.tcp_min_rate_window_secs,
                1,
                3600,
            ),
            strict_local: r.flag("MC_TE_STRICT_LOCAL"),
            redis_username: r.string("MC_REDIS_USERNAME"),
            redis_password: r.string("MC_REDIS_PASSWORD"),
            redis_db_index: r.number("MC_REDIS_DB_INDEX", 0, 0, 255),
            slice_timeout_secs: r.number("MC_SLICE_TIMEOUT", 0, 1, 65535),
            transfer_timeout_secs: r.number("MC_TRANSFER_TIMEOUT", 30, 5, 86400),
            ib_port: r.number("MC_IB_PORT", d.ib_port, 1, 255),
            gid_index,
            mtu,
            num_qp_per_ep: r.number("MC_NUM_QP_PER_EP", d.num_qp_per_ep, 1, 255),
            max_wr: r.number("MC_MAX_WR", d.max_wr, 1, 65535),
            max_sge: r.number("MC_MAX_SGE", d.max_sge, 1, 65535),
            max_inline: r.number("MC_MAX_INLINE", d.max_inline, 0, 65535),
            max_cqe_per_ctx: r.number("MC_MAX_CQE_PER_CTX", d.max_cqe_per_ctx, 1, 65535),
            workers_per_ctx: r.number("MC_WORKERS_PER_CTX", d.workers_per_ctx, 1, 8),
            pkey_index: r.number("MC_PKEY_INDEX", d.pkey_index, 0, 65535),
            ib_traffic_class: optional_u8("MC_IB_TC", 255),
            ib_service_level: optional_u8("MC_IB_SL", 15),
            ib_relaxed_ordering: r.number("MC_IB_PCI_RELAXED_ORDERING", 1u8, 0, 2) != 0,
            max_mr_size: r.number("MC_MAX_MR_SIZE", d.max_mr_size, 1, u64::MAX),
            ib_timeout: r.number("MC_IB_TIMEOUT", d.ib_timeout, 1, 31),
            rdma_signal_interval: r.number(
                "MC_RDMA_SIGNAL_INTERVAL",
                d.rdma_signal_interval,
                1,
                64,
            ),
            rdma_completion_timeout_secs: r.number(
                "MC_RDMA_COMPLETION_TIMEOUT",
                d.rdma_completion_timeout_secs,
                1,
                3600,
            ),
            peer_max_devices: r.number("MC_PEER_MAX_DEVICES", d.peer_max_devices, 1, 4096),
            peer_max_buffers: r.number("MC_PEER_MAX_BUFFERS", d.peer_max_buffers, 1, 1 << 24),
            peer_max_descriptor_bytes: r.number(
                "MC_PEER_MAX_DESCRIPTOR_BYTES",
                d.peer_max_descriptor_bytes,
                64 << 10,
                1 << 30,
            ),
            rdma_max_passive_ep: r.number(
                "MC_RDMA_MAX_PASSIVE_EP",
                d.rdma_max_passive_ep,
                1,
                65536,
            ),
            rdma_max_passive_ep_per_peer: r.number(
                "MC_RDMA_MAX_PASSIVE_EP_PER_PEER",
                d.rdma_max_passive_ep_per_peer,
                1,
                65536,
            ),
            rdma_peer_lookups_per_sec: r.number(
                "MC_RDMA_PEER_LOOKUPS_PER_SEC",
                d.rdma_peer_lookups_per_sec,
                1,
                100_000,
            ),
            rdma_connect_threads: r.number(
                "MC_RDMA_CONNECT_THREADS",
                d.rdma_connect_threads,
                1,
                64,
            ),
            shm_threads: r.number("MC_SHM_THREADS", d.shm_threads, 1, 64),
            shm_max_peers: r.number("MC_SHM_MAX_PEERS", d.shm_max_peers, 1, 65536),
            shm_ring_entries: r.number("MC_SHM_RING_ENTRIES", d.shm_ring_entries, 16, 65536),
            shm_table_slots: r.number("MC_SHM_TABLE_SLOTS", d.shm_table_slots, 1, 1 << 24),
            shm_timeout_secs: r.number("MC_SHM_TIMEOUT_SEC", d.shm_timeout_secs, 1, 3600),
            shm_spin_us: r.number("MC_SHM_SPIN_US", d.shm_spin_us, 0, 10_000),
            shm_max_mappings: r.number("MC_SHM_MAX_MAPPINGS", d.shm_max_mappings, 1, 65536),
            warnings: r.warnings.into_inner(),
        }
    }
}

static GLOBAL: OnceCell<Config> = OnceCell::new();

/// The process configuration, read from the environment on first use; the
/// first call logs the warnings parsing produced.
pub fn config() -> &'static Config {
    static REPORTED: Once = Once::new();
    let c = parsed();
    REPORTED.call_once(|| c.warnings.iter().for_each(|w| warn!("{w}")));
    c
}

/// The process configuration without logging its warnings: for the
/// logging setup, which needs `MC_LOG_LEVEL` before a subscriber exists
/// and then calls [`config`].
pub fn parsed() -> &'static Config {
    GLOBAL.get_or_init(Config::from_env)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Config {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_match_mooncake() {
        let c = parse(&[]);
        assert_eq!(c.slice_size, 65536);
        assert_eq!(c.fragment_limit, 16384);
        assert_eq!(c.retry_cnt, 9);
        assert_eq!((c.min_rpc_port, c.max_rpc_port), (15000, 17000));
        assert_eq!(c.handshake_connect_timeout_secs, 5);
        assert_eq!(c.handshake_max_length, 1 << 20);
        assert_eq!(c.tcp_lanes_per_peer, 4);
        assert_eq!(c.tcp_status_timeout_secs, 30);
        assert_eq!(c.transfer_timeout_secs, 30);
        assert!(c.metacache);
        assert_eq!(c.endpoint_store_type, EndpointStoreType::Sieve);
        assert_eq!(c.handshake_io_timeout_secs, 5);
        assert_eq!(c.handshake_max_connections, 256);
        assert_eq!(c.handshake_workers, 4);
        assert_eq!(c.handshake_max_buffered, 64 << 20);
        assert_eq!(c.notify_max_size, 64 << 10);
        assert_eq!(c.notify_queue_max_count, 65536);
        assert_eq!(c.notify_queue_max_bytes, 64 << 20);
    }

    #[test]
    fn peer_descriptor_bounds() {
        let d = parse(&[]);
        assert_eq!(
            (
                d.peer_max_devices,
                d.peer_max_buffers,
                d.peer_max_descriptor_bytes
            ),
            (64, 65536, 64 << 20)
        );
        let c = parse(&[
            ("MC_PEER_MAX_DEVICES", "8"),
            ("MC_PEER_MAX_BUFFERS", "1000"),
            ("MC_PEER_MAX_DESCRIPTOR_BYTES", "1048576"),
        ]);
        assert_eq!(
            (
                c.peer_max_devices,
                c.peer_max_buffers,
                c.peer_max_descriptor_bytes
            ),
            (8, 1000, 1 << 20)
        );
        let bad = parse(&[
            ("MC_PEER_MAX_DEVICES", "0"),
            ("MC_PEER_MAX_DESCRIPTOR_BYTES", "10"),
        ]);
        assert_eq!(
            (bad.peer_max_devices, bad.peer_max_descriptor_bytes),
            (64, 64 << 20)
        );
        assert_eq!(bad.warnings.len(), 2);
    }

    #[test]
    fn control_plane_bounds() {
        let c = parse(&[
            ("MC_HANDSHAKE_IO_TIMEOUT", "2"),
            ("MC_HANDSHAKE_MAX_CONNECTIONS", "1000"),
            ("MC_HANDSHAKE_WORKERS", "8"),
            ("MC_HANDSHAKE_MAX_BUFFERED", "268435456"),
            ("MC_NOTIFY_MAX_SIZE", "1024"),
            ("MC_NOTIFY_QUEUE_MAX_COUNT", "10"),
            ("MC_NOTIFY_QUEUE_MAX_BYTES", "1048576"),
        ]);
        assert_eq!(c.handshake_io_timeout_secs, 2);
        assert_eq!(c.handshake_max_connections, 1000);
        assert_eq!(c.handshake_workers, 8);
        assert_eq!(c.handshake_max_buffered, 256 << 20);
        assert_eq!(c.notify_max_size, 1024);
        assert_eq!(c.notify_queue_max_count, 10);
        assert_eq!(c.notify_queue_max_bytes, 1 << 20);
        let bad = parse(&[
            ("MC_HANDSHAKE_IO_TIMEOUT", "0"),
            ("MC_HANDSHAKE_MAX_CONNECTIONS", "-1"),
            ("MC_HANDSHAKE_WORKERS", "65"),
            ("MC_HANDSHAKE_MAX_BUFFERED", "1000"),
            ("MC_NOTIFY_MAX_SIZE", "0"),
            ("MC_NOTIFY_QUEUE_MAX_COUNT", "many"),
            ("MC_NOTIFY_QUEUE_MAX_BYTES", "100"),
        ]);
        let d = Config::default();
        assert_eq!(bad.handshake_io_timeout_secs, d.handshake_io_timeout_secs);
        assert_eq!(bad.handshake_max_connections, d.handshake_max_connections);
        assert_eq!(bad.handshake_workers, d.handshake_workers);
        assert_eq!(bad.handshake_max_buffered, d.handshake_max_buffered);
        assert_eq!(bad.notify_max_size, d.notify_max_size);
        assert_eq!(bad.notify_queue_max_count, d.notify_queue_max_count);
        assert_eq!(bad.notify_queue_max_bytes, d.notify_queue_max_bytes);
        assert_eq!((c.ib_port, c.gid_index, c.mtu), (1, None, 4096));
        assert_eq!(
            (c.num_qp_per_ep, c.max_wr, c.max_sge, c.max_inline),
            (2, 256, 4, 64)
        );
        assert_eq!((c.max_cqe_per_ctx, c.workers_per_ctx), (4096, 2));
        assert_eq!((c.ib_traffic_class, c.ib_service_level), (None, None));
        assert!(c.ib_relaxed_ordering);
        assert_eq!(c.rdma_completion_timeout_secs, 10);
        assert_eq!(c.ib_timeout, 14);
        assert_eq!(c.rdma_signal_interval, 1);
    }

    #[test]
    fn rdma_variables() {
        let c = parse(&[
            ("MC_GID_INDEX", "3"),
            ("MC_MTU", "1024"),
            ("MC_NUM_QP_PER_EP", "4"),
            ("MC_WORKERS_PER_CTX", "1"),
            ("MC_IB_TC", "106"),
            ("MC_IB_SL", "3"),
            ("MC_IB_PCI_RELAXED_ORDERING", "0"),
            ("MC_RDMA_COMPLETION_TIMEOUT", "3"),
            ("MC_IB_TIMEOUT", "18"),
        ]);
        assert_eq!(c.gid_index, Some(3));
        assert_eq!(c.mtu, 1024);
        assert_eq!(c.num_qp_per_ep, 4);
        assert_eq!(c.workers_per_ctx, 1);
        assert_eq!(
            (c.ib_traffic_class, c.ib_service_level),
            (Some(106), Some(3))
        );
        assert!(!c.ib_relaxed_ordering);
        assert_eq!(c.rdma_completion_timeout_secs, 3);
        assert_eq!(c.ib_timeout, 18);
        let d = parse(&[]);
        assert_eq!(
            (
                d.rdma_max_passive_ep,
                d.rdma_max_passive_ep_per_peer,
                d.rdma_peer_lookups_per_sec,
                d.rdma_connect_threads
            ),
            (1024, 32, 100, 8)
        );
        let c = parse(&[
            ("MC_RDMA_MAX_PASSIVE_EP", "16"),
            ("MC_RDMA_MAX_PASSIVE_EP_PER_PEER", "4"),
            ("MC_RDMA_PEER_LOOKUPS_PER_SEC", "10"),
            ("MC_RDMA_CONNECT_THREADS", "2"),
        ]);
        assert_eq!(
            (
                c.rdma_max_passive_ep,
                c.rdma_max_passive_ep_per_peer,
                c.rdma_peer_lookups_per_sec,
                c.rdma_connect_threads
            ),
            (16, 4, 10, 2)
        );
        let bad = parse(&[
            ("MC_RDMA_MAX_PASSIVE_EP", "0"),
            ("MC_RDMA_MAX_PASSIVE_EP_PER_PEER", "x"),
            ("MC_RDMA_PEER_LOOKUPS_PER_SEC", "-1"),
            ("MC_RDMA_CONNECT_THREADS", "65"),
        ]);
        assert_eq!(
            (
                bad.rdma_max_passive_ep,
                bad.rdma_max_passive_ep_per_peer,
                bad.rdma_peer_lookups_per_sec,
                bad.rdma_connect_threads
            ),
            (1024, 32, 100, 8)
        );
        assert_eq!(bad.warnings.len(), 4, "{:?}", bad.warnings);
        assert_eq!(parse(&[("NCCL_IB_GID_INDEX", "1")]).gid_index, Some(1));
        let bad = parse(&[
            ("MC_GID_INDEX", "256"),
            ("MC_MTU", "1500"),
            ("MC_WORKERS_PER_CTX", "9"),
            ("MC_IB_SL", "16"),
            ("MC_IB_PCI_RELAXED_ORDERING", "3"),
        ]);
        assert_eq!(bad.gid_index, None);
        assert_eq!(bad.mtu, 4096);
        assert_eq!(bad.workers_per_ctx, 2);
        assert_eq!(bad.ib_service_level, None);
        assert!(bad.ib_relaxed_ordering);
    }

    #[test]
    fn bad_values_keep_defaults() {
        let c = parse(&[
            ("MC_SLICE_SIZE", "abc"),
            ("MC_RETRY_CNT", "0"),
            ("MC_HANDSHAKE_MAX_LENGTH", "1000"),
            ("MC_TCP_LANES_PER_PEER", "17"),
            ("MC_LOG_LEVEL", "LOUD"),
            ("MC_TRANSFER_TIMEOUT", "2"),
        ]);
        assert_eq!(c.slice_size, 65536);
        assert_eq!(c.retry_cnt, 9);
        assert_eq!(c.handshake_max_length, 1 << 20);
        assert_eq!(c.tcp_lanes_per_peer, 4);
        assert_eq!(c.log_level, LogLevel::Info);
        assert_eq!(c.transfer_timeout_secs, 30);
        assert_eq!(parse(&[("MC_SLICE_SIZE", "-100")]).slice_size, 65536);
    }

    #[test]
    fn each_bad_value_gives_a_warning_naming_what_is_kept() {
        let c = parse(&[
            ("MC_SLICE_SIZE", "-5"),
            ("MC_LOG_LEVEL", "LOUD"),
            ("MC_TCP_LANES_PER_PEER", "99"),
            ("MC_ENDPOINT_STORE_TYPE", "LRU"),
            ("MC_HANDSHAKE_PORT", "abc"),
            ("MC_SLICE_TIMEOUT", "-1"),
        ]);
        let want = [
            "MC_SLICE_SIZE=-5 is not a number; using 65536",
            "MC_LOG_LEVEL=LOUD is not TRACE, INFO, WARNING or ERROR; using INFO",
            "MC_TCP_LANES_PER_PEER=99 is outside 1..=16; using 4",
            "MC_ENDPOINT_STORE_TYPE=LRU is not FIFO or SIEVE; using SIEVE",
            "MC_HANDSHAKE_PORT=abc is not a number; using 12001",
            "MC_SLICE_TIMEOUT=-1 is not a number; using 0",
        ];
        for w in want {
            assert!(
                c.warnings.iter().any(|x| x == w),
                "no warning {w:?} in {:?}",
                c.warnings
            );
        }
        assert_eq!(c.warnings.len(), want.len(), "{:?}", c.warnings);
        assert!(parse(&[("MC_SLICE_SIZE", "131072")]).warnings.is_empty());
    }

    #[test]
    fn slice_timeout_follows_mooncake_bounds() {
        assert_eq!(parse(&[]).slice_timeout_secs, 0);
        assert_eq!(parse(&[("MC_SLICE_TIMEOUT", "30")]).slice_timeout_secs, 30);
        assert_eq!(parse(&[("MC_SLICE_TIMEOUT", "0")]).slice_timeout_secs, 0);
        assert_eq!(
            parse(&[("MC_SLICE_TIMEOUT", "65536")]).slice_timeout_secs,
            0
        );
    }

    #[test]
    fn good_values_are_taken() {
        let c = parse(&[
            ("MC_SLICE_SIZE", "131072"),
            ("MC_FRAGMENT_RATIO", "8"),
            ("MC_LOG_LEVEL", "trace"),
            ("MC_TCP_MAX_CONNECTIONS_PER_PEER", "2"),
            ("MC_DISABLE_METACACHE", "1"),
            ("MC_TE_FILTERS", "mlx5_0, mlx5_1"),
            ("MC_TCP_PROTO", "1"),
            ("MC_TRANSFER_TIMEOUT", "120"),
        ]);
        assert_eq!(c.slice_size, 131072);
        assert_eq!(c.fragment_limit, 16384);
        assert_eq!(c.log_level, LogLevel::Trace);
        assert_eq!(c.tcp_lanes_per_peer, 2);
        assert!(!c.metacache);
        assert_eq!(c.te_filters, vec!["mlx5_0", "mlx5_1"]);
        assert!(c.tcp_force_v1);
        assert_eq!(c.transfer_timeout_secs, 120);
    }

    #[test]
    fn data_port_minimum_rate() {
        let d = parse(&[]);
        assert_eq!((d.tcp_min_rate, d.tcp_min_rate_window_secs), (65536, 10));
        let c = parse(&[
            ("MC_TCP_MIN_RATE_BYTES_PER_SEC", "0"),
            ("MC_TCP_MIN_RATE_WINDOW_SEC", "60"),
        ]);
        assert_eq!((c.tcp_min_rate, c.tcp_min_rate_window_secs), (0, 60));
        let bad = parse(&[
            ("MC_TCP_MIN_RATE_BYTES_PER_SEC", "-1"),
            ("MC_TCP_MIN_RATE_WINDOW_SEC", "0"),
        ]);
        assert_eq!(
            (bad.tcp_min_rate, bad.tcp_min_rate_window_secs),
            (65536, 10)
        );
        assert_eq!(
            bad.warnings,
            [
                "MC_TCP_MIN_RATE_BYTES_PER_SEC=-1 is not a number; using 65536",
                "MC_TCP_MIN_RATE_WINDOW_SEC=0 is outside 1..=3600; using 10",
            ]
        );
    }

    #[test]
    fn port_ranges_follow_mooncake_rule() {
        let range = |lo: &str, hi: &str| {
            let c = parse(&[("MC_MIN_RPC_PORT", lo), ("MC_MAX_RPC_PORT", hi)]);
            (c.min_rpc_port, c.max_rpc_port)
        };
        assert_eq!(range("2000", "3000"), (2000, 3000));
        assert_eq!(range("80", "443"), (15000, 17000));
        assert_eq!(range("32768", "40000"), (15000, 17000));
        assert_eq!(range("3000", "2000"), (15000, 17000));
        assert_eq!(range("61000", "65536"), (15000, 17000));
        assert_eq!(range("61000", "65535"), (61000, 65535));
        assert_eq!(range("1024", "32767"), (1024, 32767));
    }

    #[test]
    fn shared_memory_bounds() {
        let d = parse(&[]);
        assert_eq!(
            (
                d.shm_max_peers,
                d.shm_ring_entries,
                d.shm_table_slots,
                d.shm_timeout_secs,
                d.shm_spin_us
            ),
            (256, 1024, 65536, 10, 50)
        );
        assert!((1..=4).contains(&d.shm_threads));
        assert_eq!(d.shm_max_mappings, 256);
        assert_eq!(parse(&[("MC_SHM_MAX_MAPPINGS", "16")]).shm_max_mappings, 16);
        assert_eq!(parse(&[("MC_SHM_MAX_MAPPINGS", "0")]).shm_max_mappings, 256);
        let c = parse(&[
            ("MC_SHM_THREADS", "2"),
            ("MC_SHM_MAX_PEERS", "8"),
            ("MC_SHM_RING_ENTRIES", "64"),
            ("MC_SHM_TABLE_SLOTS", "100"),
            ("MC_SHM_TIMEOUT_SEC", "1"),
            ("MC_SHM_SPIN_US", "0"),
        ]);
        assert_eq!(
            (
                c.shm_threads,
                c.shm_max_peers,
                c.shm_ring_entries,
                c.shm_table_slots,
                c.shm_timeout_secs,
                c.shm_spin_us
            ),
            (2, 8, 64, 100, 1, 0)
        );
        assert!(c.warnings.is_empty());
        let bad = parse(&[
            ("MC_SHM_THREADS", "0"),
            ("MC_SHM_MAX_PEERS", "x"),
            ("MC_SHM_RING_ENTRIES", "8"),
            ("MC_SHM_TABLE_SLOTS", "0"),
            ("MC_SHM_TIMEOUT_SEC", "0"),
            ("MC_SHM_SPIN_US", "10001"),
        ]);
        assert_eq!(bad.shm_threads, d.shm_threads);
        assert_eq!(
            (
                bad.shm_max_peers,
                bad.shm_ring_entries,
                bad.shm_table_slots,
                bad.shm_timeout_secs,
                bad.shm_spin_us
            ),
            (256, 1024, 65536, 10, 50)
        );
        assert_eq!(bad.warnings.len(), 6);
        assert!(
            bad.warnings
                .contains(&"MC_SHM_RING_ENTRIES=8 is outside 16..=65536; using 1024".to_string())
        );
    }
}
