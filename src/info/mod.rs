//! What `transfer-engine-info` reports: what the engine would do on this
//! machine and why, without a running application. [`Report::gather`]
//! collects the build (version, features), the devices and the priority
//! matrix ([`devices`]), what auto discovery installs and why the others
//! are left out, and every setting with its source; [`peer::probe`]
//! opens one peer's segment and times transfers to it. Both print as text
//! ([`text`]) or as one JSON object (the schema is in `docs/tools.md`).
//!
//! Everything here reads the engine's own discovery, settings and route
//! choice ([`Engine::auto_discovery`], [`Engine::topology_and_matrix`],
//! [`Config::settings`], [`Engine::segment_carriers`]); nothing decides
//! anew.

pub mod devices;
pub mod peer;
pub mod text;

use crate::{AutoChoice, Config, Engine, Setting, SettingSource};
use serde::Serialize;
use serde_json::Value;

/// The whole report of `transfer-engine-info`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The crate's version.
    pub version: &'static str,
    /// The cargo features this build was made with.
    pub features: Features,
    /// NUMA nodes, NICs (RDMA rails and network interfaces) and GPUs.
    pub devices: devices::Devices,
    /// The NIC priority matrix (Mooncake's JSON: `{"cpu:0": [[preferred],
    /// [available]], ...}`) the engine starts its transports from and RDMA
    /// publishes.
    pub priority_matrix: Value,
    /// Each transport of the build: installed by auto discovery, or why
    /// not.
    pub transports: Vec<TransportChoice>,
    /// Every setting, its value and where it comes from.
    pub settings: Vec<SettingReport>,
    /// The probe of one peer (`--peer`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<peer::PeerReport>,
}

/// The optional parts of the build.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Features {
    /// The RDMA transport (feature `rdma`; libibverbs is loaded at run
    /// time).
    pub rdma: bool,
    /// Topology from hwloc (feature `hwloc`; sysfs otherwise).
    pub hwloc: bool,
}

impl Features {
    /// The features of this build.
    pub fn of_build() -> Features {
        Features {
            rdma: cfg!(feature = "rdma"),
            hwloc: cfg!(feature = "hwloc"),
        }
    }
}

/// What auto discovery did with one transport.
#[derive(Debug, Clone, Serialize)]
pub struct TransportChoice {
    /// Its protocol name.
    pub protocol: &'static str,
    /// Whether it is installed.
    pub installed: bool,
    /// Why it is left out, or why it must be installed; empty otherwise.
    pub why: String,
}

impl From<AutoChoice> for TransportChoice {
    fn from(c: AutoChoice) -> Self {
        TransportChoice {
            protocol: c.protocol,
            installed: c.installed,
            why: c.why,
        }
    }
}

/// One setting, as [`Setting`] with its source spelled for JSON.
#[derive(Debug, Clone, Serialize)]
pub struct SettingReport {
    /// Its part of the configuration (`engine`, `tcp`, ..., `unsupported`).
    pub part: &'static str,
    /// Its variables: the one set, or the first, then its aliases.
    pub variables: &'static [&'static str],
    /// Its value in effect (secrets as `<set>`).
    pub value: String,
    /// Its default.
    pub default: String,
    /// `environment` or `default`.
    pub source: &'static str,
    /// The variable that set it, for source `environment`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_by: Option<&'static str>,
    /// Whether the engine reads it (false: a Mooncake variable it ignores).
    pub supported: bool,
    /// What it means (for an unsupported one, why it is not read).
    pub meaning: &'static str,
}

impl From<Setting> for SettingReport {
    fn from(s: Setting) -> Self {
        let (source, set_by) = match s.source {
            SettingSource::Default => ("default", None),
            SettingSource::Environment(var) => ("environment", Some(var)),
        };
        SettingReport {
            part: s.part,
            variables: s.variables,
            value: s.value,
            default: s.default,
            source,
            set_by,
            supported: s.supported,
            meaning: s.meaning,
        }
    }
}

impl Report {
    /// The report of `engine`, built with auto discovery from `config`,
    /// which was read from `lookup` (the environment).
    pub fn gather(
        engine: &Engine,
        config: &Config,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> crate::Result<Report> {
        let (topology, matrix) = engine.topology_and_matrix()?;
        Ok(Report {
            version: env!("CARGO_PKG_VERSION"),
            features: Features::of_build(),
            devices: devices::Devices::of(&topology),
            priority_matrix: matrix.to_json(),
            transports: engine
                .auto_discovery()
                .into_iter()
                .map(TransportChoice::from)
                .collect(),
            settings: config
                .settings(lookup)
                .into_iter()
                .map(SettingReport::from)
                .collect(),
            peer: None,
        })
    }
}
