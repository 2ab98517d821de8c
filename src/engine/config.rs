//! Every `MC_*` environment variable the engine reads, parsed once with
//! Mooncake's defaults and bounds, into one [`Config`] made of the parts
//! of the engine that use them; each part is defined, with its defaults,
//! beside its user. A value that does not parse or is out of
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

use super::control::NotifyLimits;
use crate::auth::AuthConfig;
use crate::metadata::client_tls::TlsFiles;
use crate::metadata::secret::Secret;
use crate::metadata::{PeerLimits, StoreConfig};
use crate::rpc::RpcConfig;
use crate::topology::TopologyConfig;
use crate::transport::TransportConfig;
use crate::transport::endpoint::{EndpointConfig, EndpointStoreType};
use crate::transport::rdma::RdmaConfig;
use crate::transport::scheduler::SchedConfig;
use crate::transport::shm::ShmConfig;
use crate::transport::tcp::TcpConfig;

/// Log verbosity (`MC_LOG_LEVEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogLevel {
    /// `TRACE`
    Trace,
    /// `INFO` (the default)
    #[default]
    Info,
    /// `WARNING`
    Warning,
    /// `ERROR`
    Error,
}

/// What the engine itself does with requests. Parsed from `MC_*` variables by
/// [`crate::engine::config::Config::from_env`]; the defaults are Mooncake's.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// `MC_FORCE_TCP`.
    pub force_tcp: bool,
    /// `MC_TE_STRICT_LOCAL`: fail a request whose local `source` range is
    /// not inside one registered buffer, on every transport.
    pub strict_local: bool,
    /// `MC_SLICE_TIMEOUT` in seconds (1..=65535; 0 = off, the default): a
    /// task still waiting this long after its slices were posted reports
    /// `STATUS_TIMEOUT`.
    pub slice_timeout_secs: u64,
    /// `MC_TRANSFER_TIMEOUT` in seconds (30, 5..=86400): how long the
    /// Python binding's synchronous transfers wait, plus 1 ns per byte.
    pub transfer_timeout_secs: u64,
    /// `MC_FORCE_HCA`: auto-discovery installs RDMA even when no RDMA
    /// device with an active port was found (or `MC_FORCE_TCP` is set),
    /// and fails the engine if RDMA cannot be set up instead of falling
    /// back to TCP.
    pub force_hca: bool,
    /// `MC_TE_METRIC` (1, true, yes or on): log the engine's throughput
    /// and task latencies every `metric_interval_secs` (off).
    pub metric: bool,
    /// `MC_TE_METRIC_INTERVAL_SECONDS` (5, 1..=86400).
    pub metric_interval_secs: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            force_tcp: false,
            strict_local: false,
            slice_timeout_secs: 0,
            transfer_timeout_secs: 30,
            force_hca: false,
            metric: false,
            metric_interval_secs: 5,
        }
    }
}

/// The configuration of an engine: every `MC_*` variable, by the part of
/// the engine that uses it.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// `MC_LOG_LEVEL` (INFO).
    pub log_level: LogLevel,
    /// The engine itself.
    pub engine: EngineConfig,
    /// The handshake listener and client.
    pub rpc: RpcConfig,
    /// The notification queue.
    pub notify: NotifyLimits,
    /// The metadata store and the descriptor cache.
    pub store: StoreConfig,
    /// Bounds on peers' descriptors.
    pub peers: PeerLimits,
    /// The slice scheduler.
    pub sched: SchedConfig,
    /// The endpoint pools.
    pub endpoints: EndpointConfig,
    /// The TCP transport.
    pub tcp: TcpConfig,
    /// The RDMA transport.
    pub rdma: RdmaConfig,
    /// The shared-memory transport.
    pub shm: ShmConfig,
    /// Devices and the priority matrix.
    pub topology: TopologyConfig,
    /// The cluster key of peer authentication.
    pub auth: AuthConfig,
    /// The warnings parsing produced (bad values and what was kept).
    pub warnings: Vec<String>,
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

    /// A file path.
    fn path(&self, name: &str) -> Option<std::path::PathBuf> {
        self.string(name).map(std::path::PathBuf::from)
    }

    /// The TLS files `<prefix>_CACERT`, `<prefix>_CERT` and `<prefix>_KEY`;
    /// a certificate without its key (or the reverse) warns and sends none.
    fn tls_files(&self, prefix: &str) -> TlsFiles {
        let (cert_var, key_var) = (format!("{prefix}_CERT"), format!("{prefix}_KEY"));
        let (cert, key) = match (self.path(&cert_var), self.path(&key_var)) {
            (Some(c), Some(k)) => (Some(c), Some(k)),
            (None, None) => (None, None),
            (Some(_), None) | (None, Some(_)) => {
                self.warn(format!(
                    "only one of {cert_var} and {key_var} is set; sending no client \
                     certificate (set both)"
                ));
                (None, None)
            }
        };
        TlsFiles {
            cacert: self.path(&format!("{prefix}_CACERT")),
            cert,
            key,
        }
    }

    /// A user name and password, `<prefix>_USERNAME` and `<prefix>_PASSWORD`:
    /// one without the other warns and authenticates not.
    fn credentials(&self, prefix: &str) -> Option<(String, Secret)> {
        let (user_var, pass_var) = (format!("{prefix}_USERNAME"), format!("{prefix}_PASSWORD"));
        match (self.string(&user_var), self.string(&pass_var)) {
            (Some(user), Some(pass)) => Some((user, Secret::new(pass))),
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                self.warn(format!(
                    "only one of {user_var} and {pass_var} is set; not authenticating \
                     (set both)"
                ));
                None
            }
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
    /// The parts the transports read.
    pub fn transports(&self) -> TransportConfig<'_> {
        TransportConfig {
            rpc: &self.rpc,
            sched: &self.sched,
            endpoints: &self.endpoints,
            tcp: &self.tcp,
            rdma: &self.rdma,
            shm: &self.shm,
            topology: &self.topology,
        }
    }

    /// This configuration with the cluster keys read from `files`
    /// (`new[,old]`, as `MC_TE_AUTH_KEY_FILE`) instead of those the
    /// environment names.
    pub fn with_auth_key_file(mut self, files: &str) -> Config {
        self.auth = AuthConfig::from_files(files);
        self
    }

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
        let slice_size = r.number("MC_SLICE_SIZE", d.sched.slice_size, 1, 1 << 40);
        let fragment_limit = match r.raw("MC_FRAGMENT_RATIO") {
            None => d.sched.fragment_limit,
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
        let (mut min_rpc_port, mut max_rpc_port) = (d.rpc.min_port, d.rpc.max_port);
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
            None => d.rdma.mtu,
            Some(v) => match v.parse::<u32>() {
                Ok(m @ (512 | 1024 | 2048 | 4096)) => m,
                _ => {
                    r.warn(format!(
                        "MC_MTU={v} is not 512, 1024, 2048 or 4096; using {}",
                        d.rdma.mtu
                    ));
                    d.rdma.mtu
                }
            },
        };
        // Device events, peer devices and metrics (issue 18), together.
        let force_hca = r.flag("MC_FORCE_HCA");
        let metric = r.raw("MC_TE_METRIC").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
        });
        let metric_interval_secs = r.number(
            "MC_TE_METRIC_INTERVAL_SECONDS",
            d.engine.metric_interval_secs,
            1,
            86400,
        );
        let dest_device_affinity = r.flag("MC_ENABLE_DEST_DEVICE_AFFINITY");
        let auto_gid_max_retries = r.number(
            "MC_AUTO_GID_MAX_RETRIES",
            d.rdma.auto_gid_max_retries,
            0,
            16,
        );
        let rdma_bind_address = r.string("MC_RDMA_BIND_ADDRESS");
        let optional_u8 = |name: &str, hi: i32| match r.number::<i32>(name, -1, -1, hi) {
            -1 => None,
            n => Some(n as u8),
        };
        Config {
            log_level,
            engine: EngineConfig {
                force_tcp: r.flag("MC_FORCE_TCP"),
                strict_local: r.flag("MC_TE_STRICT_LOCAL"),
                slice_timeout_secs: r.number("MC_SLICE_TIMEOUT", 0, 1, 65535),
                transfer_timeout_secs: r.number("MC_TRANSFER_TIMEOUT", 30, 5, 86400),
                force_hca,
                metric,
                metric_interval_secs,
            },
            rpc: RpcConfig {
                handshake_port: r.number("MC_HANDSHAKE_PORT", d.rpc.handshake_port, 1, 65535),
                min_port: min_rpc_port,
                max_port: max_rpc_port,
                listen_backlog: r.number("MC_HANDSHAKE_LISTEN_BACKLOG", 128, 1, 65535),
                connect_timeout_secs: r.number("MC_HANDSHAKE_CONNECT_TIMEOUT", 5, 1, 3599),
                max_length: r.number(
                    "MC_HANDSHAKE_MAX_LENGTH",
                    d.rpc.max_length,
                    1 << 20,
                    128 << 20,
                ),
                io_timeout_secs: r.number(
                    "MC_HANDSHAKE_IO_TIMEOUT",
                    d.rpc.io_timeout_secs,
                    1,
                    3600,
                ),
                max_connections: r.number(
                    "MC_HANDSHAKE_MAX_CONNECTIONS",
                    d.rpc.max_connections,
                    1,
                    65536,
                ),
                workers: r.number("MC_HANDSHAKE_WORKERS", d.rpc.workers, 1, 64),
                max_buffered: r.number(
                    "MC_HANDSHAKE_MAX_BUFFERED",
                    d.rpc.max_buffered,
                    1 << 20,
                    64 << 30,
                ),
                use_ipv6: r.flag("MC_USE_IPV6"),
                legacy_port_binding: r.raw("MC_LEGACY_RPC_PORT_BINDING").is_some(),
                bind_address: r.string("MC_TCP_BIND_ADDRESS"),
            },
            notify: NotifyLimits {
                max_size: r.number("MC_NOTIFY_MAX_SIZE", d.notify.max_size, 1, 128 << 20),
                max_count: r.number("MC_NOTIFY_QUEUE_MAX_COUNT", d.notify.max_count, 1, 1 << 24),
                max_bytes: r.number(
                    "MC_NOTIFY_QUEUE_MAX_BYTES",
                    d.notify.max_bytes,
                    64 << 10,
                    64 << 30,
                ),
            },
            store: StoreConfig {
                metacache: r.raw("MC_DISABLE_METACACHE").is_none(),
                refresh_interval_secs: r.number(
                    "MC_TE_METADATA_REFRESH_INTERVAL_SECONDS",
                    0,
                    0,
                    86400,
                ),
                cluster_id: r.string("MC_METADATA_CLUSTER_ID"),
                redis_username: r.string("MC_REDIS_USERNAME"),
                redis_password: r.string("MC_REDIS_PASSWORD").map(Secret::new),
                redis_db_index: r.number("MC_REDIS_DB_INDEX", 0, 0, 255),
                redis_tls: r.tls_files("MC_REDIS"),
                etcd_auth: r.credentials("MC_ETCD"),
                etcd_tls: r.tls_files("MC_ETCD"),
                http_token_file: r.path("MC_METADATA_AUTH_TOKEN_FILE"),
                http_cacert: r.path("MC_METADATA_CACERT"),
            },
            peers: PeerLimits {
                max_devices: r.number("MC_PEER_MAX_DEVICES", d.peers.max_devices, 1, 4096),
                max_buffers: r.number("MC_PEER_MAX_BUFFERS", d.peers.max_buffers, 1, 1 << 24),
                max_descriptor_bytes: r.number(
                    "MC_PEER_MAX_DESCRIPTOR_BYTES",
                    d.peers.max_descriptor_bytes,
                    64 << 10,
                    1 << 30,
                ),
            },
            sched: SchedConfig {
                slice_size,
                fragment_limit,
                retry_cnt: r.number("MC_RETRY_CNT", d.sched.retry_cnt, 1, 127),
                rail_pause_secs: r.number("MC_RDMA_RAIL_PAUSE_SECONDS", 30, 1, 3599),
                round_robin: r.flag("MC_PATH_ROUNDROBIN"),
            },
            endpoints: EndpointConfig {
                max_per_ctx: r.number("MC_MAX_EP_PER_CTX", 65536, 1, 65536),
                store_type: endpoint_store_type,
            },
            tcp: TcpConfig {
                lanes_per_peer: r.number(lanes_var, 4, 1, 16),
                force_v1: tcp_force_v1,
                status_timeout_secs: r.number("MC_TCP_STATUS_TIMEOUT_SEC", 30, 1, 3600),
                io_threads: r.number("MC_TCP_IO_THREADS", d.tcp.io_threads, 1, 64),
                max_data_connections: r.number(
                    "MC_TCP_MAX_DATA_CONNECTIONS",
                    d.tcp.max_data_connections,
                    1,
                    1 << 20,
                ),
                idle_timeout_secs: r.number(
                    "MC_TCP_IDLE_TIMEOUT_SEC",
                    d.tcp.idle_timeout_secs,
                    2,
                    86400,
                ),
                min_rate: r.number("MC_TCP_MIN_RATE_BYTES_PER_SEC", d.tcp.min_rate, 0, 1 << 30),
                min_rate_window_secs: r.number(
                    "MC_TCP_MIN_RATE_WINDOW_SEC",
                    d.tcp.min_rate_window_secs,
                    1,
                    3600,
                ),
            },
            rdma: RdmaConfig {
                ib_port: r.number("MC_IB_PORT", d.rdma.ib_port, 1, 255),
                gid_index,
                mtu,
                num_qp_per_ep: r.number("MC_NUM_QP_PER_EP", d.rdma.num_qp_per_ep, 1, 255),
                max_wr: r.number("MC_MAX_WR", d.rdma.max_wr, 1, 65535),
                max_sge: r.number("MC_MAX_SGE", d.rdma.max_sge, 1, 65535),
                max_inline: r.number("MC_MAX_INLINE", d.rdma.max_inline, 0, 65535),
                max_cqe_per_ctx: r.number("MC_MAX_CQE_PER_CTX", d.rdma.max_cqe_per_ctx, 1, 65535),
                workers_per_ctx: r.number("MC_WORKERS_PER_CTX", d.rdma.workers_per_ctx, 1, 8),
                pkey_index: r.number("MC_PKEY_INDEX", d.rdma.pkey_index, 0, 65535),
                traffic_class: optional_u8("MC_IB_TC", 255),
                service_level: optional_u8("MC_IB_SL", 15),
                relaxed_ordering: r.number("MC_IB_PCI_RELAXED_ORDERING", 1u8, 0, 2) != 0,
                max_mr_size: r.number("MC_MAX_MR_SIZE", d.rdma.max_mr_size, 1, u64::MAX),
                parallel_reg_mr: match r.number("MC_ENABLE_PARALLEL_REG_MR", -1i8, -1, 1) {
                    -1 => None,
                    v => Some(v == 1),
                },
                max_concurrent_reg_mr: r.number(
                    "MC_MAX_CONCURRENT_REG_MR",
                    d.rdma.max_concurrent_reg_mr,
                    0,
                    1 << 16,
                ),
                ib_timeout: r.number("MC_IB_TIMEOUT", d.rdma.ib_timeout, 1, 31),
                signal_interval: r.number("MC_RDMA_SIGNAL_INTERVAL", d.rdma.signal_interval, 1, 64),
                completion_timeout_secs: r.number(
                    "MC_RDMA_COMPLETION_TIMEOUT",
                    d.rdma.completion_timeout_secs,
                    1,
                    3600,
                ),
                max_passive_ep: r.number("MC_RDMA_MAX_PASSIVE_EP", d.rdma.max_passive_ep, 1, 65536),
                max_passive_ep_per_peer: r.number(
                    "MC_RDMA_MAX_PASSIVE_EP_PER_PEER",
                    d.rdma.max_passive_ep_per_peer,
                    1,
                    65536,
                ),
                peer_lookups_per_sec: r.number(
                    "MC_RDMA_PEER_LOOKUPS_PER_SEC",
                    d.rdma.peer_lookups_per_sec,
                    1,
                    100_000,
                ),
                connect_threads: r.number("MC_RDMA_CONNECT_THREADS", d.rdma.connect_threads, 1, 64),
                // The completion path (issue 18).
                num_cq_per_ctx: r.number("MC_NUM_CQ_PER_CTX", d.rdma.num_cq_per_ctx, 1, 255),
                num_comp_channels_per_ctx: r.number(
                    "MC_NUM_COMP_CHANNELS_PER_CTX",
                    d.rdma.num_comp_channels_per_ctx,
                    1,
                    255,
                ),
                busy_poll_us: r.number(
                    "MC_TE_RDMA_BUSY_POLL_US",
                    d.rdma.busy_poll_us,
                    0,
                    10_000_000,
                ),
                dest_device_affinity,
                auto_gid_max_retries,
                bind_address: rdma_bind_address,
            },
            shm: ShmConfig {
                auto_install: r.raw("MC_TE_SHM").is_none() || r.flag("MC_TE_SHM"),
                threads: r.number("MC_SHM_THREADS", d.shm.threads, 1, 64),
                max_peers: r.number("MC_SHM_MAX_PEERS", d.shm.max_peers, 1, 65536),
                ring_entries: r.number("MC_SHM_RING_ENTRIES", d.shm.ring_entries, 16, 65536),
                table_slots: r.number("MC_SHM_TABLE_SLOTS", d.shm.table_slots, 1, 1 << 24),
                timeout_secs: r.number("MC_SHM_TIMEOUT_SEC", d.shm.timeout_secs, 1, 3600),
                spin_us: r.number("MC_SHM_SPIN_US", d.shm.spin_us, 0, 10_000),
                max_mappings: r.number("MC_SHM_MAX_MAPPINGS", d.shm.max_mappings, 1, 65536),
            },
            topology: TopologyConfig {
                custom_topo_json: r.string("MC_CUSTOM_TOPO_JSON"),
                filters: r
                    .string("MC_TE_FILTERS")
                    .map(|v| {
                        v.split(',')
                            .map(|s| s.trim().to_string())
                            .filter(|s| !s.is_empty())
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            auth: {
                let (auth, warnings) = AuthConfig::from_vars(
                    r.string("MC_TE_AUTH_KEY_FILE"),
                    r.string("MC_TE_AUTH_KEY"),
                );
                warnings.into_iter().for_each(|w| r.warn(w));
                auth
            },
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
        assert_eq!(c.sched.slice_size, 65536);
        assert_eq!(c.sched.fragment_limit, 16384);
        assert_eq!(c.sched.retry_cnt, 9);
        assert_eq!((c.rpc.min_port, c.rpc.max_port), (15000, 17000));
        assert_eq!(c.rpc.connect_timeout_secs, 5);
        assert_eq!(c.rpc.max_length, 1 << 20);
        assert_eq!(c.tcp.lanes_per_peer, 4);
        assert_eq!(c.tcp.status_timeout_secs, 30);
        assert_eq!(c.engine.transfer_timeout_secs, 30);
        assert!(c.store.metacache);
        assert_eq!(c.endpoints.store_type, EndpointStoreType::Sieve);
        assert_eq!(c.rpc.io_timeout_secs, 5);
        assert_eq!(c.rpc.max_connections, 256);
        assert_eq!(c.rpc.workers, 4);
        assert_eq!(c.rpc.max_buffered, 64 << 20);
        assert_eq!(c.notify.max_size, 64 << 10);
        assert_eq!(c.notify.max_count, 65536);
        assert_eq!(c.notify.max_bytes, 64 << 20);
    }

    #[test]
    fn peer_descriptor_bounds() {
        let d = parse(&[]);
        assert_eq!(
            (
                d.peers.max_devices,
                d.peers.max_buffers,
                d.peers.max_descriptor_bytes
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
                c.peers.max_devices,
                c.peers.max_buffers,
                c.peers.max_descriptor_bytes
            ),
            (8, 1000, 1 << 20)
        );
        let bad = parse(&[
            ("MC_PEER_MAX_DEVICES", "0"),
            ("MC_PEER_MAX_DESCRIPTOR_BYTES", "10"),
        ]);
        assert_eq!(
            (bad.peers.max_devices, bad.peers.max_descriptor_bytes),
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
        assert_eq!(c.rpc.io_timeout_secs, 2);
        assert_eq!(c.rpc.max_connections, 1000);
        assert_eq!(c.rpc.workers, 8);
        assert_eq!(c.rpc.max_buffered, 256 << 20);
        assert_eq!(c.notify.max_size, 1024);
        assert_eq!(c.notify.max_count, 10);
        assert_eq!(c.notify.max_bytes, 1 << 20);
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
        assert_eq!(bad.rpc.io_timeout_secs, d.rpc.io_timeout_secs);
        assert_eq!(bad.rpc.max_connections, d.rpc.max_connections);
        assert_eq!(bad.rpc.workers, d.rpc.workers);
        assert_eq!(bad.rpc.max_buffered, d.rpc.max_buffered);
        assert_eq!(bad.notify.max_size, d.notify.max_size);
        assert_eq!(bad.notify.max_count, d.notify.max_count);
        assert_eq!(bad.notify.max_bytes, d.notify.max_bytes);
        assert_eq!(
            (c.rdma.ib_port, c.rdma.gid_index, c.rdma.mtu),
            (1, None, 4096)
        );
        assert_eq!(
            (
                c.rdma.num_qp_per_ep,
                c.rdma.max_wr,
                c.rdma.max_sge,
                c.rdma.max_inline
            ),
            (2, 256, 4, 64)
        );
        assert_eq!((c.rdma.max_cqe_per_ctx, c.rdma.workers_per_ctx), (4096, 2));
        assert_eq!((c.rdma.traffic_class, c.rdma.service_level), (None, None));
        assert!(c.rdma.relaxed_ordering);
        assert_eq!(c.rdma.completion_timeout_secs, 10);
        assert_eq!(c.rdma.ib_timeout, 14);
        assert_eq!(c.rdma.signal_interval, 1);
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
        assert_eq!(c.rdma.gid_index, Some(3));
        assert_eq!(c.rdma.mtu, 1024);
        assert_eq!(c.rdma.num_qp_per_ep, 4);
        assert_eq!(c.rdma.workers_per_ctx, 1);
        assert_eq!(
            (c.rdma.traffic_class, c.rdma.service_level),
            (Some(106), Some(3))
        );
        assert!(!c.rdma.relaxed_ordering);
        assert_eq!(c.rdma.completion_timeout_secs, 3);
        assert_eq!(c.rdma.ib_timeout, 18);
        let d = parse(&[]);
        assert_eq!(
            (
                d.rdma.max_passive_ep,
                d.rdma.max_passive_ep_per_peer,
                d.rdma.peer_lookups_per_sec,
                d.rdma.connect_threads
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
                c.rdma.max_passive_ep,
                c.rdma.max_passive_ep_per_peer,
                c.rdma.peer_lookups_per_sec,
                c.rdma.connect_threads
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
                bad.rdma.max_passive_ep,
                bad.rdma.max_passive_ep_per_peer,
                bad.rdma.peer_lookups_per_sec,
                bad.rdma.connect_threads
            ),
            (1024, 32, 100, 8)
        );
        assert_eq!(bad.warnings.len(), 4, "{:?}", bad.warnings);
        assert_eq!(parse(&[("NCCL_IB_GID_INDEX", "1")]).rdma.gid_index, Some(1));
        let bad = parse(&[
            ("MC_GID_INDEX", "256"),
            ("MC_MTU", "1500"),
            ("MC_WORKERS_PER_CTX", "9"),
            ("MC_IB_SL", "16"),
            ("MC_IB_PCI_RELAXED_ORDERING", "3"),
        ]);
        assert_eq!(bad.rdma.gid_index, None);
        assert_eq!(bad.rdma.mtu, 4096);
        assert_eq!(bad.rdma.workers_per_ctx, 2);
        assert_eq!(bad.rdma.service_level, None);
        assert!(bad.rdma.relaxed_ordering);
    }

    #[test]
    fn rdma_completion_path_variables() {
        let d = parse(&[]);
        assert_eq!(
            (
                d.rdma.num_cq_per_ctx,
                d.rdma.num_comp_channels_per_ctx,
                d.rdma.busy_poll_us
            ),
            (1, 1, RdmaConfig::default().busy_poll_us)
        );
        let c = parse(&[
            ("MC_NUM_CQ_PER_CTX", "4"),
            ("MC_NUM_COMP_CHANNELS_PER_CTX", "2"),
            ("MC_TE_RDMA_BUSY_POLL_US", "0"),
        ]);
        assert_eq!(
            (
                c.rdma.num_cq_per_ctx,
                c.rdma.num_comp_channels_per_ctx,
                c.rdma.busy_poll_us
            ),
            (4, 2, 0)
        );
        let bad = parse(&[
            ("MC_NUM_CQ_PER_CTX", "0"),
            ("MC_NUM_COMP_CHANNELS_PER_CTX", "256"),
            ("MC_TE_RDMA_BUSY_POLL_US", "-5"),
        ]);
        assert_eq!(
            (
                bad.rdma.num_cq_per_ctx,
                bad.rdma.num_comp_channels_per_ctx,
                bad.rdma.busy_poll_us
            ),
            (d.rdma.num_cq_per_ctx, 1, d.rdma.busy_poll_us)
        );
        assert_eq!(bad.warnings.len(), 3, "{:?}", bad.warnings);
    }

    #[test]
    fn memory_region_variables() {
        let d = parse(&[]);
        assert_eq!(
            (
                d.rdma.max_mr_size,
                d.rdma.parallel_reg_mr,
                d.rdma.max_concurrent_reg_mr
            ),
            (1 << 40, None, 0)
        );
        let c = parse(&[
            ("MC_MAX_MR_SIZE", "1048576"),
            ("MC_ENABLE_PARALLEL_REG_MR", "1"),
            ("MC_MAX_CONCURRENT_REG_MR", "4"),
        ]);
        assert_eq!(
            (
                c.rdma.max_mr_size,
                c.rdma.parallel_reg_mr,
                c.rdma.max_concurrent_reg_mr
            ),
            (1 << 20, Some(true), 4)
        );
        assert_eq!(
            parse(&[("MC_ENABLE_PARALLEL_REG_MR", "0")])
                .rdma
                .parallel_reg_mr,
            Some(false)
        );
        let bad = parse(&[
            ("MC_MAX_MR_SIZE", "0"),
            ("MC_ENABLE_PARALLEL_REG_MR", "2"),
            ("MC_MAX_CONCURRENT_REG_MR", "-1"),
        ]);
        assert_eq!(
            (
                bad.rdma.max_mr_size,
                bad.rdma.parallel_reg_mr,
                bad.rdma.max_concurrent_reg_mr
            ),
            (1 << 40, None, 0)
        );
        assert_eq!(bad.warnings.len(), 3, "{:?}", bad.warnings);
    }

    #[test]
    fn device_event_peer_device_and_metric_variables() {
        let d = parse(&[]);
        assert!(!d.engine.force_hca && !d.engine.metric);
        assert_eq!(d.engine.metric_interval_secs, 5);
        assert!(!d.rdma.dest_device_affinity);
        assert_eq!(d.rdma.auto_gid_max_retries, 2);
        assert_eq!(d.rdma.bind_address, None);
        let c = parse(&[
            ("MC_FORCE_HCA", "1"),
            ("MC_TE_METRIC", "Yes"),
            ("MC_TE_METRIC_INTERVAL_SECONDS", "2"),
            ("MC_ENABLE_DEST_DEVICE_AFFINITY", "1"),
            ("MC_AUTO_GID_MAX_RETRIES", "0"),
            ("MC_RDMA_BIND_ADDRESS", "10.1.0.5"),
        ]);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert!(c.engine.force_hca && c.engine.metric);
        assert_eq!(c.engine.metric_interval_secs, 2);
        assert!(c.rdma.dest_device_affinity);
        assert_eq!(c.rdma.auto_gid_max_retries, 0);
        assert_eq!(c.rdma.bind_address.as_deref(), Some("10.1.0.5"));
        // Mooncake takes only 1, true, yes and on for MC_TE_METRIC.
        assert!(!parse(&[("MC_TE_METRIC", "2")]).engine.metric);
        assert!(parse(&[("MC_TE_METRIC", "ON")]).engine.metric);
        let bad = parse(&[
            ("MC_TE_METRIC_INTERVAL_SECONDS", "0"),
            ("MC_AUTO_GID_MAX_RETRIES", "17"),
        ]);
        assert_eq!(bad.engine.metric_interval_secs, 5);
        assert_eq!(bad.rdma.auto_gid_max_retries, 2);
        assert_eq!(
            bad.warnings,
            [
                "MC_TE_METRIC_INTERVAL_SECONDS=0 is outside 1..=86400; using 5",
                "MC_AUTO_GID_MAX_RETRIES=17 is outside 0..=16; using 2",
            ]
        );
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
        assert_eq!(c.sched.slice_size, 65536);
        assert_eq!(c.sched.retry_cnt, 9);
        assert_eq!(c.rpc.max_length, 1 << 20);
        assert_eq!(c.tcp.lanes_per_peer, 4);
        assert_eq!(c.log_level, LogLevel::Info);
        assert_eq!(c.engine.transfer_timeout_secs, 30);
        assert_eq!(parse(&[("MC_SLICE_SIZE", "-100")]).sched.slice_size, 65536);
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
    fn store_security_variables() {
        let c = parse(&[
            ("MC_ETCD_USERNAME", "te"),
            ("MC_ETCD_PASSWORD", "pa55-w0rd-secret"),
            ("MC_ETCD_CACERT", "/etc/te/ca.pem"),
            ("MC_ETCD_CERT", "/etc/te/client.pem"),
            ("MC_ETCD_KEY", "/etc/te/client.key"),
            ("MC_METADATA_AUTH_TOKEN_FILE", "/etc/te/token"),
            ("MC_METADATA_CACERT", "/etc/te/meta-ca.pem"),
            ("MC_REDIS_PASSWORD", "redis-secret-word"),
            ("MC_REDIS_CACERT", "/etc/te/redis-ca.pem"),
        ]);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let s = &c.store;
        let (user, pass) = s.etcd_auth.as_ref().expect("etcd credentials");
        assert_eq!(user, "te");
        assert!(pass.matches(b"pa55-w0rd-secret"));
        assert_eq!(
            s.etcd_tls.cacert.as_deref(),
            Some("/etc/te/ca.pem".as_ref())
        );
        assert!(s.etcd_tls.has_client_cert());
        assert_eq!(s.http_token_file.as_deref(), Some("/etc/te/token".as_ref()));
        assert_eq!(
            s.http_cacert.as_deref(),
            Some("/etc/te/meta-ca.pem".as_ref())
        );
        assert_eq!(
            s.redis_tls.cacert.as_deref(),
            Some("/etc/te/redis-ca.pem".as_ref())
        );
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("pa55-w0rd-secret") && !shown.contains("redis-secret-word"),
            "a password in the Debug output: {shown}"
        );
        // Halves warn and are dropped.
        let c = parse(&[
            ("MC_ETCD_USERNAME", "te"),
            ("MC_ETCD_CERT", "/c.pem"),
            ("MC_REDIS_KEY", "/k.pem"),
        ]);
        assert!(c.store.etcd_auth.is_none() && !c.store.etcd_tls.has_client_cert());
        assert_eq!(c.store.etcd_tls.cert, None);
        assert_eq!(c.store.redis_tls.key, None);
        for w in [
            "only one of MC_ETCD_USERNAME and MC_ETCD_PASSWORD is set; not authenticating \
             (set both)",
            "only one of MC_ETCD_CERT and MC_ETCD_KEY is set; sending no client certificate \
             (set both)",
            "only one of MC_REDIS_CERT and MC_REDIS_KEY is set; sending no client certificate \
             (set both)",
        ] {
            assert!(
                c.warnings.iter().any(|x| x == w),
                "{w:?} not in {:?}",
                c.warnings
            );
        }
        assert_eq!(c.warnings.len(), 3, "{:?}", c.warnings);
    }

    #[test]
    fn slice_timeout_follows_mooncake_bounds() {
        assert_eq!(parse(&[]).engine.slice_timeout_secs, 0);
        assert_eq!(
            parse(&[("MC_SLICE_TIMEOUT", "30")])
                .engine
                .slice_timeout_secs,
            30
        );
        assert_eq!(
            parse(&[("MC_SLICE_TIMEOUT", "0")])
                .engine
                .slice_timeout_secs,
            0
        );
        assert_eq!(
            parse(&[("MC_SLICE_TIMEOUT", "65536")])
                .engine
                .slice_timeout_secs,
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
        assert_eq!(c.sched.slice_size, 131072);
        assert_eq!(c.sched.fragment_limit, 16384);
        assert_eq!(c.log_level, LogLevel::Trace);
        assert_eq!(c.tcp.lanes_per_peer, 2);
        assert!(!c.store.metacache);
        assert_eq!(c.topology.filters, vec!["mlx5_0", "mlx5_1"]);
        assert!(c.tcp.force_v1);
        assert_eq!(c.engine.transfer_timeout_secs, 120);
    }

    #[test]
    fn data_port_minimum_rate() {
        let d = parse(&[]);
        assert_eq!((d.tcp.min_rate, d.tcp.min_rate_window_secs), (65536, 10));
        let c = parse(&[
            ("MC_TCP_MIN_RATE_BYTES_PER_SEC", "0"),
            ("MC_TCP_MIN_RATE_WINDOW_SEC", "60"),
        ]);
        assert_eq!((c.tcp.min_rate, c.tcp.min_rate_window_secs), (0, 60));
        let bad = parse(&[
            ("MC_TCP_MIN_RATE_BYTES_PER_SEC", "-1"),
            ("MC_TCP_MIN_RATE_WINDOW_SEC", "0"),
        ]);
        assert_eq!(
            (bad.tcp.min_rate, bad.tcp.min_rate_window_secs),
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
            (c.rpc.min_port, c.rpc.max_port)
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
    fn shared_memory_variables() {
        let d = parse(&[]);
        assert!(d.shm.auto_install);
        assert_eq!(
            (
                d.shm.max_peers,
                d.shm.ring_entries,
                d.shm.table_slots,
                d.shm.timeout_secs,
                d.shm.spin_us,
                d.shm.max_mappings
            ),
            (256, 1024, 65536, 10, 50, 256)
        );
        assert!((1..=4).contains(&d.shm.threads));
        assert!(!parse(&[("MC_TE_SHM", "0")]).shm.auto_install);
        assert!(parse(&[("MC_TE_SHM", "1")]).shm.auto_install);
        let c = parse(&[
            ("MC_SHM_THREADS", "2"),
            ("MC_SHM_MAX_PEERS", "8"),
            ("MC_SHM_RING_ENTRIES", "64"),
            ("MC_SHM_TABLE_SLOTS", "100"),
            ("MC_SHM_TIMEOUT_SEC", "1"),
            ("MC_SHM_SPIN_US", "0"),
            ("MC_SHM_MAX_MAPPINGS", "16"),
        ]);
        assert_eq!(
            (
                c.shm.threads,
                c.shm.max_peers,
                c.shm.ring_entries,
                c.shm.table_slots,
                c.shm.timeout_secs,
                c.shm.spin_us,
                c.shm.max_mappings
            ),
            (2, 8, 64, 100, 1, 0, 16)
        );
        assert!(c.warnings.is_empty());
        let bad = parse(&[
            ("MC_SHM_THREADS", "0"),
            ("MC_SHM_MAX_PEERS", "x"),
            ("MC_SHM_RING_ENTRIES", "8"),
            ("MC_SHM_TABLE_SLOTS", "0"),
            ("MC_SHM_TIMEOUT_SEC", "0"),
            ("MC_SHM_SPIN_US", "10001"),
            ("MC_SHM_MAX_MAPPINGS", "0"),
        ]);
        assert_eq!(bad.shm, ShmConfig::default());
        assert_eq!(bad.warnings.len(), 7);
        assert!(
            bad.warnings
                .contains(&"MC_SHM_RING_ENTRIES=8 is outside 16..=65536; using 1024".to_string())
        );
    }
}
