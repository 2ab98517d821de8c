//! Installing transports, and registering memory with the engine and its
//! transports.

use super::Engine;
use super::peers::Peers;
use crate::error::{Error, Result};
use crate::memory::Region;
use crate::sync;
use crate::topology::{PriorityMatrix, Topology};
use crate::transport::registry::{self, Auto, TRANSPORTS};
use crate::transport::{Discovery, InstallContext, Want};
use std::path::Path;
use std::sync::Arc;
use tracing::warn;

/// Largest `MC_CUSTOM_TOPO_JSON` file read (a matrix is a few KiB).
const MAX_TOPO_FILE: u64 = 1 << 20;

/// What auto discovery did with one transport ([`Engine::auto_discovery`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoChoice {
    /// The transport's protocol name (`shm`, `rdma`, `tcp`).
    pub protocol: &'static str,
    /// Whether it was installed.
    pub installed: bool,
    /// Why it was left out (`no RDMA device with an active port`, `tcp is
    /// installed (one network transport)`, `could not be set up: ...`), or
    /// why it had to be installed (`MC_FORCE_HCA is set`); empty for one
    /// installed because it wanted to be.
    pub why: String,
}

impl AutoChoice {
    fn installed(protocol: &'static str, why: &str) -> AutoChoice {
        AutoChoice {
            protocol,
            installed: true,
            why: why.to_string(),
        }
    }

    fn left_out(protocol: &'static str, why: String) -> AutoChoice {
        AutoChoice {
            protocol,
            installed: false,
            why,
        }
    }
}

impl Engine {
    /// Installs the transports for an auto-discovered machine, as the
    /// transport table says: the first network transport, in the table's
    /// order, that wants to be installed on this machine and can be set up
    /// (as Mooncake: RDMA when RDMA devices with an active port exist and
    /// `MC_FORCE_TCP` is not set, else TCP); then those installed beside it
    /// (shared memory for peers on this host, unless `MC_TE_SHM=0`), each
    /// left out with a warning if it cannot run.
    ///
    /// A transport that must be installed (RDMA with `MC_FORCE_HCA`) and
    /// cannot be set up fails the engine.
    pub(super) fn auto_install(&self) -> Result<()> {
        let topology = self.discover_topology();
        let found = Discovery {
            config: self.config.transports(),
            topology: &topology,
            force_hca: self.config.engine.force_hca,
            force_tcp: self.config.engine.force_tcp,
        };
        let mut choices = Vec::new();
        let mut network: Option<&'static str> = None;
        let mut failed = None;
        for entry in TRANSPORTS {
            let Auto::Network(want) = entry.auto else {
                continue;
            };
            let protocol = entry.protocol;
            if let Some(first) = network {
                choices.push(AutoChoice::left_out(
                    protocol,
                    format!("{first} is installed (one network transport)"),
                ));
                continue;
            }
            match want(&found) {
                Want::No(why) => choices.push(AutoChoice::left_out(protocol, why.to_string())),
                Want::Must(why) => {
                    self.install_transport(protocol, None).map_err(|e| {
                        Error::DeviceNotFound(format!("{why} and {protocol} cannot be used: {e}"))
                    })?;
                    choices.push(AutoChoice::installed(protocol, why));
                    network = Some(protocol);
                }
                Want::Try => match self.install_transport(protocol, None) {
                    Ok(_) => {
                        choices.push(AutoChoice::installed(protocol, ""));
                        network = Some(protocol);
                        failed = None;
                    }
                    Err(e) => {
                        warn!("auto discovery: {protocol} could not be installed ({e})");
                        choices.push(AutoChoice::left_out(
                            protocol,
                            format!("could not be set up: {e}"),
                        ));
                        failed = Some(e);
                    }
                },
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        for entry in TRANSPORTS {
            let Auto::Beside(want) = entry.auto else {
                continue;
            };
            let protocol = entry.protocol;
            if let Want::No(why) = want(&found) {
                choices.push(AutoChoice::left_out(protocol, why.to_string()));
                continue;
            }
            match self.install_transport(protocol, None) {
                Ok(_) => choices.push(AutoChoice::installed(protocol, "")),
                Err(e) => {
                    warn!(
                        "auto discovery: {protocol} could not be installed ({e}); the engine \
                         goes on without it"
                    );
                    choices.push(AutoChoice::left_out(
                        protocol,
                        format!("could not be set up: {e}"),
                    ));
                }
            }
        }
        choices.sort_by_key(|c| TRANSPORTS.iter().position(|e| e.protocol == c.protocol));
        *sync::lock(&self.auto_choices) = choices;
        Ok(())
    }

    /// What auto discovery did with each transport of this build, most
    /// preferred first: installed or left out, and why; empty for an
    /// engine built without auto discovery.
    pub fn auto_discovery(&self) -> Vec<AutoChoice> {
        sync::lock(&self.auto_choices).clone()
    }

    /// Scans the machine's topology and keeps it with its priority matrix
    /// (unless a matrix was given explicitly); returns the topology.
    pub fn discover_topology(&self) -> Topology {
        let topo = Topology::discover(
            &self.device_filter,
            &self.config.topology,
            self.config.rdma.ib_port,
        );
        let mut slot = sync::lock(&self.topology);
        let matrix = match slot.take() {
            Some((_, m)) => m,
            None => PriorityMatrix::from_topology(&topo),
        };
        *slot = Some((topo.clone(), matrix));
        topo
    }

    /// The NIC report of `showLinks`.
    pub fn show_links(&self, json: bool) -> String {
        let (topo, matrix) = self.known_topology();
        crate::topology::show_links(&topo, &matrix, json)
    }

    /// The topology as last discovered (discovering it now if it never
    /// was) and the priority matrix kept with it.
    fn known_topology(&self) -> (Topology, PriorityMatrix) {
        let mut slot = sync::lock(&self.topology);
        slot.get_or_insert_with(|| {
            let topo = Topology::discover(
                &self.device_filter,
                &self.config.topology,
                self.config.rdma.ib_port,
            );
            let m = PriorityMatrix::from_topology(&topo);
            (topo, m)
        })
        .clone()
    }

    /// The machine's topology as this engine sees it (its device filter and
    /// `MC_TE_FILTERS` applied) and the NIC priority matrix its transports
    /// start from and RDMA publishes: `MC_CUSTOM_TOPO_JSON`'s when set, else
    /// the discovered one. Errors: that file cannot be read or parsed.
    pub fn topology_and_matrix(&self) -> Result<(Topology, PriorityMatrix)> {
        let (topo, discovered) = self.known_topology();
        Ok((topo, self.custom_matrix()?.unwrap_or(discovered)))
    }

    /// The priority matrix of `MC_CUSTOM_TOPO_JSON`, if set.
    fn custom_matrix(&self) -> Result<Option<PriorityMatrix>> {
        let Some(path) = &self.config.topology.custom_topo_json else {
            return Ok(None);
        };
        let file = crate::small_file::read(Path::new(path), MAX_TOPO_FILE).map_err(|why| {
            Error::InvalidArgument(format!("MC_CUSTOM_TOPO_JSON={path} cannot be read: {why}"))
        })?;
        let json = String::from_utf8(file.bytes).map_err(|_| {
            Error::InvalidArgument(format!("MC_CUSTOM_TOPO_JSON={path} is not UTF-8"))
        })?;
        PriorityMatrix::parse(&json).map(Some)
    }

    /// Installs a transport by protocol name (`tcp`, `rdma`, `shm`: the
    /// transport table's) and returns its handle. `matrix` is a NIC priority matrix JSON (`{"cpu:0":
    /// [[preferred], [available]], ...}`), else `MC_CUSTOM_TOPO_JSON`'s,
    /// else the discovered one. For TCP its devices are network interfaces
    /// (without a matrix every interface that is up serves); for RDMA they
    /// are RDMA devices. An engine runs several transports, as Mooncake's
    /// `MultiTransport`: each request goes to the most preferred one that
    /// reaches its target. Installing an installed one again returns its
    /// handle. Every buffer registered so far is registered with the new
    /// transport, and the descriptor is published again.
    pub fn install_transport(&self, proto: &str, matrix: Option<&str>) -> Result<u64> {
        let _change = self.begin_change("installTransport")?;
        let (entry, kind) = registry::find(proto)?;
        if self.transports().iter().any(|t| t.kind() == kind) {
            crate::log_limit::warn_limited!("transport {proto} is already installed");
            return Ok(entry.handle);
        }
        let given = match matrix {
            Some(json) => Some(PriorityMatrix::parse(json)?),
            None => self.custom_matrix()?,
        };
        let topology = || self.discover_topology();
        let ctx = InstallContext {
            kind,
            config: self.config.transports(),
            memory: &self.memory,
            local_name: &self.local_name,
            loopback: self.loopback,
            matrix: given,
            topology: &topology,
            device_filter: &self.device_filter,
            peers: Arc::new(Peers(self.me.get().cloned().unwrap_or_default())),
            auth: self.auth.clone(),
            republish: self.republisher(),
        };
        let transport = (entry.install)(&ctx)?;
        if let Some(h) = transport.handshake() {
            self.control.set_handshake(h);
        }
        {
            let mut all = sync::write(&self.transports);
            all.push(transport);
            all.sort_by_key(|t| t.kind().index);
        }
        {
            // Buffers still "*" may be resident now: an RDMA install pins
            // every registered buffer.
            let mut memory = sync::write(&self.memory);
            let addrs: Vec<u64> = memory.regions().map(|r| r.addr).collect();
            memory.resolve_locations(addrs);
        }
        self.publish_local_desc()?;
        Ok(entry.handle)
    }

    /// Zeroed memory of `len` bytes from the installed transport that
    /// moves its own memory fastest (shared memory: a memfd that peers on
    /// this host copy with memcpy instead of cross-memory attach), to be
    /// registered like any buffer; `None` if no installed transport has
    /// such memory. Freed with [`Engine::free_buffer`] (after
    /// unregistering), or when the engine is dropped.
    pub fn allocate_buffer(&self, len: usize) -> Option<Result<u64>> {
        if len == 0 {
            return Some(Err(Error::InvalidArgument(
                "a buffer of 0 bytes cannot be allocated".into(),
            )));
        }
        sync::read(&self.transports)
            .iter()
            .find_map(|t| t.allocate(len))
    }

    /// Frees memory from [`Engine::allocate_buffer`]; unregister it first.
    pub fn free_buffer(&self, addr: u64) -> Result<()> {
        if sync::read(&self.memory).find(addr, 1).is_some() {
            return Err(Error::InvalidArgument(format!(
                "the buffer at {addr:#x} is still registered; unregister it first"
            )));
        }
        if sync::read(&self.transports).iter().any(|t| t.free(addr)) {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{addr:#x} is not a buffer the engine allocated (or it was freed)"
            )))
        }
    }

    /// Registers buffers: all of them, or none on error. Installed
    /// transports publish them at once.
    pub fn register(&self, regions: &[Region]) -> Result<()> {
        let _change = self.begin_change("registerLocalMemory")?;
        sync::write(&self.memory).insert(regions)?;
        if let Err(e) = self.register_on_transports(regions) {
            let mut memory = sync::write(&self.memory);
            for r in regions {
                let _ = memory.remove(r.addr);
            }
            return Err(e);
        }
        // `*` becomes the node of the first page, resident by now where a
        // transport pinned it (RDMA).
        sync::write(&self.memory).resolve_locations(regions.iter().map(|r| r.addr));
        if let Err(e) = self.publish_local_desc() {
            self.unregister_on_transports(&regions.iter().map(|r| r.addr).collect::<Vec<_>>());
            {
                let mut memory = sync::write(&self.memory);
                for r in regions {
                    let _ = memory.remove(r.addr);
                }
            }
            // Serve (and, when the store is back, publish) the descriptor
            // without the buffers that were not registered.
            let _ = self.publish_local_desc();
            return Err(e);
        }
        Ok(())
    }

    /// Registers `regions` with the installed transports (RDMA: a memory
    /// region on every device); all or none.
    fn register_on_transports(&self, regions: &[Region]) -> Result<()> {
        let transports = self.transports();
        for (i, t) in transports.iter().enumerate() {
            for (j, r) in regions.iter().enumerate() {
                // SAFETY: the C API requires a registered buffer to stay
                // mapped until it is unregistered, which also removes it
                // from every transport.
                if let Err(e) = unsafe { t.register(r) } {
                    for done in &regions[..j] {
                        t.unregister(done.addr);
                    }
                    for earlier in &transports[..i] {
                        for r in regions {
                            earlier.unregister(r.addr);
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Removes buffers from the installed transports; returns once nothing
    /// they run touches them.
    fn unregister_on_transports(&self, addrs: &[u64]) {
        for t in self.transports() {
            for &addr in addrs {
                t.unregister(addr);
            }
        }
    }

    /// Unregisters buffers by base address; every known one is removed and
    /// the first error is returned. When this returns, no transfer touches
    /// them any more.
    pub fn unregister(&self, addrs: &[u64]) -> Result<()> {
        let _change = sync::lock(&self.changes);
        let mut first_err = None;
        let mut removed = Vec::with_capacity(addrs.len());
        {
            let mut memory = sync::write(&self.memory);
            for &addr in addrs {
                match memory.remove(addr) {
                    Ok(_) => removed.push(addr),
                    Err(e) => {
                        crate::log_limit::warn_limited!("unregister: {e}");
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        self.unregister_on_transports(&removed);
        if let Err(e) = self.publish_local_desc() {
            crate::log_limit::warn_limited!(
                "unregister: the descriptor could not be republished: {e}"
            );
        }
        first_err.map_or(Ok(()), Err)
    }
}
