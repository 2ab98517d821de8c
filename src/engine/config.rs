//! Every `MC_*` environment variable the engine reads, parsed once with
//! Mooncake's defaults and bounds, into one [`Config`] made of the parts
//! of the engine that use them. Each setting is declared once, in the
//! `settings!` table of its part beside the part's user (its field,
//! variables, type, default, allowed values and meaning), and the part's
//! struct, its default, its reader, its check and its rows of
//! `docs/configuration.md` come from there (`src/settings.rs` says how). A
//! value that is not allowed fails: [`Config::from_lookup`] gives a
//! [`ConfigError`] naming each variable, its value and what it takes.
//!
//! Mooncake's variables this engine does not read are declared once too,
//! in `config/unsupported.rs` (each with what it means to Mooncake and why
//! it is not read): [`Config::unsupported`] lists those that are set, and
//! building an engine names each of them in one warning per process
//! (`unsupported::warn_once`).
//!
//! Parsing collects warnings too (half a TLS pair, a key in the
//! environment); [`config`] logs them once. The logging setup reads
//! `MC_LOG_LEVEL` through [`parsed`] first, so the warnings go to the
//! subscriber it installs instead of being lost before it exists.

#[cfg(test)]
mod docs;
pub(crate) mod unsupported;

use once_cell::sync::OnceCell;
use std::sync::Once;
use tracing::warn;

use super::control::NotifyLimits;
use crate::auth::AuthConfig;
use crate::metadata::{PeerLimits, StoreConfig};
use crate::rpc::RpcConfig;
pub use crate::settings::ConfigError;
use crate::settings::{Effective, PartDoc, Reader};
use crate::topology::TopologyConfig;
use crate::transport::TransportConfig;
use crate::transport::endpoint::EndpointConfig;
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

use super::route::TransportNames;
pub use super::route::TransportSet;
use crate::settings::{AtLeast, FilePath, OnWords, Range, SockAddr, Switch, Words};
use std::path::PathBuf;

/// `MC_TE_METRICS`: counting on or off.
const COUNTING: Words<bool> = Words(&[
    ("1", true),
    ("on", true),
    ("true", true),
    ("0", false),
    ("off", false),
    ("false", false),
]);

const LOG_LEVELS: Words<LogLevel> = Words(&[
    ("INFO", LogLevel::Info),
    ("TRACE", LogLevel::Trace),
    ("WARNING", LogLevel::Warning),
    ("WARN", LogLevel::Warning),
    ("ERROR", LogLevel::Error),
]);

crate::settings::settings! {
    /// What the engine itself does with requests. Each setting (variables, Mooncake's
    /// default and bounds, meaning) is declared once in the table below.
    #[derive(Debug, Clone, PartialEq)]
    pub struct EngineConfig("engine") {
        /// `MC_LOG_LEVEL` (INFO).
        log_level: LogLevel = LogLevel::Info, ["MC_LOG_LEVEL"], LOG_LEVELS,
            "log verbosity; `RUST_LOG` wins over it",
            mooncake "upper case only, no `WARN`; TRACE is INFO plus trace lines";
        /// `MC_LOG_DIR`: the directory of the log file the library's own
        /// subscriber writes to instead of stderr.
        log_dir: Option<PathBuf> = None, ["MC_LOG_DIR"], FilePath,
            "directory of the log: the subscriber the library installs (C and Python, when the \
             process has none) appends to `transfer-engine.<pid>.log` there instead of stderr; \
             one that is not a writable directory is named in a warning on stderr",
            mooncake "glog's files, one per severity (errors also on stderr)";
        /// `MC_FORCE_TCP`.
        force_tcp: bool = false, ["MC_FORCE_TCP"], Switch,
            "auto discovery installs TCP even where RDMA devices exist",
            mooncake "set at all, even to `0` or empty, forces TCP";
        /// `MC_TE_STRICT_LOCAL`: fail a request whose local `source` range is
        /// not inside one registered buffer, on every transport.
        strict_local: bool = false, ["MC_TE_STRICT_LOCAL"], Switch,
            "a request whose local `source` is not inside one registered buffer FAILS, on \
             every transport (default: as Mooncake, a TCP request's source is not checked)";
        /// `MC_TE_REQUIRE_TRANSPORT`: the only transports requests to
        /// peers may go by (unset: any), and one of which the engine must
        /// have.
        require_transport: TransportSet = TransportSet::default(), ["MC_TE_REQUIRE_TRANSPORT"],
            TransportNames,
            "the only transports requests to peers may go by: a request none of them reaches \
             FAILS at submit, and a part the last of them cannot move FAILS instead of going \
             to another transport (`local`, the engine's own segment, is always allowed); \
             creating the engine installs the listed ones auto discovery left out (whatever \
             `MC_FORCE_TCP` and `MC_TE_SHM` say) and fails when it can have none of them";
        /// `MC_TE_STALL_REPORT_SEC` (0 = off): a task still waiting this
        /// long after its submission is logged once.
        stall_report_secs: u64 = 10, ["MC_TE_STALL_REPORT_SEC"], Range(0u64, 86400),
            "seconds (0: off): a task still waiting that long after its submission is logged \
             once, with its peer, the transport carrying it, its outstanding slices and what \
             they wait for (rails in flight or paused, a shared-memory target copying, a full \
             ring)";
        /// `MC_SLICE_TIMEOUT` in seconds (0 = off): a
        /// task still waiting this long after its slices were posted reports
        /// `STATUS_TIMEOUT`.
        slice_timeout_secs: u64 = 0, ["MC_SLICE_TIMEOUT"], Range(0u64, 65535),
            "seconds (0: off): a task still waiting that long after it was submitted \
             reports `STATUS_TIMEOUT`, as in Mooncake; it is not cancelled, and a later poll \
             can see it complete or fail";
        /// `MC_TRANSFER_TIMEOUT` in seconds: how long the
        /// Python binding's synchronous transfers wait, plus 1 ns per byte;
        /// below 5 counts as 5, as in Mooncake.
        transfer_timeout_secs: u64 = 30, ["MC_TRANSFER_TIMEOUT"], AtLeast(5, i32::MAX as u64),
            "seconds the Python binding's synchronous transfers wait, plus 1 ns per byte; a \
             value below 5 (0 and negative ones too) counts as 5, as in Mooncake";
        /// `MC_FORCE_HCA`: auto-discovery installs RDMA even when no RDMA
        /// device with an active port was found (or `MC_FORCE_TCP` is set),
        /// and fails the engine if RDMA cannot be set up instead of falling
        /// back to TCP.
        force_hca: bool = false, ["MC_FORCE_HCA"], Switch,
            "auto discovery installs RDMA or the engine fails; wins over `MC_FORCE_TCP`",
            mooncake "set at all, even to `0` or empty, forces RDMA";
        /// `MC_TE_METRIC` (1, true, yes or on): log the engine's throughput
        /// and task latencies every `metric_interval_secs` (off).
        metric: bool = false, ["MC_TE_METRIC"], OnWords,
            "Mooncake's periodic `[Metrics]` throughput and latency line, with each \
             device's bandwidth and bytes in flight";
        /// `MC_TE_METRIC_INTERVAL_SECONDS`.
        metric_interval_secs: u64 = 5, ["MC_TE_METRIC_INTERVAL_SECONDS"], Range(1u64, 86400),
            "seconds between those lines";
        /// `MC_TE_METRICS_ADDR`: where the engine serves its metrics in
        /// the Prometheus text format (`GET /metrics`); off when unset.
        metrics_addr: Option<std::net::SocketAddr> = None, ["MC_TE_METRICS_ADDR"], SockAddr,
            "`ip:port` where the engine serves `GET /metrics` in the Prometheus text format \
             ([metrics.md](metrics.md)); port 0 picks a free one. An address that cannot be \
             listened on fails the engine's creation";
        /// `MC_TE_METRICS` (`0` or `off`): no task is counted for the
        /// metrics (they then report none); on by default.
        metrics: bool = true, ["MC_TE_METRICS"], COUNTING,
            "`0` or `off`: tasks are not counted for the metrics (`GET /metrics`, \
             `te_metrics_text` then report none); counting costs no measurable request rate \
             ([metrics.md](metrics.md))";
        /// `MC_TE_METRICS_PEERS`: per-peer series for at most this many
        /// peers (0: none).
        metrics_peers: usize = 0, ["MC_TE_METRICS_PEERS"], Range(0usize, 256),
            "peers that get series of their own in the metrics (`peer` label), the first \
             ones moved to; the others are summed as `peer=\"other\"`; 0: no per-peer series";
    };
}

/// The configuration of an engine: every `MC_*` variable, by the part of
/// the engine that uses it.
#[derive(Debug, Clone, Default)]
pub struct Config {
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
    /// The warnings parsing produced (settings that are allowed but not
    /// used as set, such as half a TLS pair).
    pub warnings: Vec<String>,
    /// The Mooncake variables this engine does not read that are set (to
    /// any value): building an engine names each in one warning per
    /// process.
    pub unsupported: Vec<&'static str>,
}

/// Where the value of a [`Setting`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingSource {
    /// None of its variables is set: the default.
    Default,
    /// This variable is set (in the process environment, for
    /// [`Config::from_env`]).
    Environment(&'static str),
}

/// One setting of a [`Config`] as an engine built from it uses it (what
/// `transfer-engine-info` prints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The part of the configuration it belongs to (`engine`, `tcp`, ...:
    /// the tables of `docs/configuration.md`; `unsupported` for a Mooncake
    /// variable this engine does not read).
    pub part: &'static str,
    /// Its variable, then the others read when it is unset (or those that
    /// make one setting together).
    pub variables: &'static [&'static str],
    /// Its value as `docs/configuration.md` writes values; a secret as
    /// `<set>`, never itself.
    pub value: String,
    /// Its default, as the docs write it.
    pub default: String,
    /// Where the value comes from.
    pub source: SettingSource,
    /// What it means; for a variable this engine does not read, why not.
    pub meaning: &'static str,
    /// Whether this engine reads it: false for a Mooncake variable it
    /// ignores (listed only when set).
    pub supported: bool,
}

impl Config {
    /// Every part's documentation with its settings as in effect, in the
    /// order of `docs/configuration.md`; `r` tells which variables are set.
    pub(crate) fn parts(&self, r: &Reader<'_>) -> Vec<(PartDoc, Vec<Effective>)> {
        vec![
            (EngineConfig::doc(), self.engine.effective(r)),
            (SchedConfig::doc(), self.sched.effective(r)),
            (RpcConfig::doc(), self.rpc.effective(r)),
            (NotifyLimits::doc(), self.notify.effective(r)),
            (StoreConfig::doc(), self.store.effective(r)),
            (PeerLimits::doc(), self.peers.effective(r)),
            (AuthConfig::doc(), self.auth.effective(r)),
            (TopologyConfig::doc(), self.topology.effective(r)),
            (EndpointConfig::doc(), self.endpoints.effective(r)),
            (TcpConfig::doc(), self.tcp.effective(r)),
            (ShmConfig::doc(), self.shm.effective(r)),
            (RdmaConfig::doc(), self.rdma.effective(r)),
        ]
    }

    /// Every setting of this configuration with its value, its default and
    /// where it comes from, `lookup` being the variables it was read from
    /// (the environment, for [`Config::from_env`]); then each Mooncake
    /// variable this engine does not read that is set.
    pub fn settings(&self, lookup: impl Fn(&str) -> Option<String>) -> Vec<Setting> {
        let r = Reader::new(&lookup);
        let mut out = Vec::new();
        for (doc, values) in self.parts(&r) {
            for (row, value) in doc.rows.into_iter().zip(values) {
                debug_assert_eq!(row.vars, value.vars, "part {}", doc.name);
                out.push(Setting {
                    part: doc.name,
                    variables: row.vars,
                    value: value.value,
                    default: row.default,
                    source: value
                        .set_by
                        .map_or(SettingSource::Default, SettingSource::Environment),
                    meaning: row.doc,
                    supported: true,
                });
            }
        }
        for u in unsupported::UNSUPPORTED {
            if let Some(value) = lookup(u.var) {
                out.push(Setting {
                    part: "unsupported",
                    variables: std::slice::from_ref(&u.var),
                    value,
                    default: "-".to_string(),
                    source: SettingSource::Environment(u.var),
                    meaning: u.reason,
                    supported: false,
                });
            }
        }
        out
    }

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
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Parses the configuration from any variable lookup: every setting of
    /// the parts' `settings!` tables, then the cluster key. A value that is not
    /// allowed (not a number, out of bounds, not one of the words) fails,
    /// each one named with its variable, value and what is allowed.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let r = Reader::new(&lookup);
        let mut config = Config {
            engine: EngineConfig::read(&r),
            rpc: RpcConfig::read(&r),
            notify: NotifyLimits::read(&r),
            store: StoreConfig::read(&r),
            peers: PeerLimits::read(&r),
            sched: SchedConfig::read(&r),
            endpoints: EndpointConfig::read(&r),
            tcp: TcpConfig::read(&r),
            rdma: RdmaConfig::read(&r),
            shm: ShmConfig::read(&r),
            topology: TopologyConfig::read(&r),
            auth: {
                let text = |v: &str| r.raw(v).filter(|v| !v.is_empty());
                let (auth, warnings) =
                    AuthConfig::from_vars(text("MC_TE_AUTH_KEY_FILE"), text("MC_TE_AUTH_KEY"));
                warnings.into_iter().for_each(|w| r.warn(w));
                auth
            },
            warnings: Vec::new(),
            unsupported: unsupported::set(&lookup),
        };
        config.warnings = r.finish()?;
        Ok(config)
    }
}

/// What [`crate::EngineBuilder::config`] takes: a [`Config`], or the
/// result of [`Config::from_lookup`] (whose error fails the build).
#[derive(Debug)]
pub struct ConfigResult(pub(crate) Result<Config, ConfigError>);

impl From<Config> for ConfigResult {
    fn from(c: Config) -> Self {
        ConfigResult(Ok(c))
    }
}

impl From<Result<Config, ConfigError>> for ConfigResult {
    fn from(r: Result<Config, ConfigError>) -> Self {
        ConfigResult(r)
    }
}

static GLOBAL: OnceCell<Result<Config, ConfigError>> = OnceCell::new();

/// The process configuration, read from the environment on first use, or
/// the values it refused (every call gives the same answer); the first call
/// logs the warnings parsing produced.
pub fn config() -> Result<&'static Config, ConfigError> {
    static REPORTED: Once = Once::new();
    let c = parsed()?;
    REPORTED.call_once(|| c.warnings.iter().for_each(|w| warn!("{w}")));
    Ok(c)
}

/// The process configuration without logging its warnings: for the
/// logging setup, which needs `MC_LOG_LEVEL` before a subscriber exists
/// and then calls [`config`].
pub fn parsed() -> Result<&'static Config, ConfigError> {
    GLOBAL
        .get_or_init(Config::from_env)
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests;
