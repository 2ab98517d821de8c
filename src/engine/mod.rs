//! The engine: registered memory, batches and tasks, segments, and the
//! dispatch of requests to transports. Safe Rust only; the C boundary lives
//! in `crate::ffi`.

pub mod control;
mod keeper;
mod peer_work;
mod remote;

use crate::batch::{Batch, PendingNotify, TaskStatus};
use crate::config::{Config, config};
use crate::error::{Error, Result};
use crate::handle::HandleTable;
use crate::memory::{MemoryRegistry, Region};
use crate::metadata::conn::MetadataConn;
use crate::metadata::store::MetadataStore;
use crate::rpc::{Cancel, RpcServer};
use crate::segment::{RemoteSegment, SegmentCache};
use crate::sync;
use crate::topology::{PriorityMatrix, Topology};
use crate::transport::NicLoad;
use crate::transport::local::{CopyJob, LocalCopier, copy_bytes};
#[cfg(feature = "rdma")]
use crate::transport::rdma::carrier::RdmaCarrier;
use crate::transport::scheduler::planner;
use crate::transport::scheduler::{Scheduler, Transfer};
use crate::transport::tcp::TcpTransport;
use crate::transport::tcp::carrier::TcpCarrier;
use control::ControlState;
use once_cell::sync::OnceCell;
use peer_work::{Finish, Job, PeerWork, Refused};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tracing::{info, warn};

/// Segment id of the engine's own memory (`LOCAL_SEGMENT`).
pub const LOCAL_SEGMENT_ID: i32 = 0;

/// Direction of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// Copy from the target segment into `source`.
    Read,
    /// Copy from `source` into the target segment.
    Write,
}

impl Opcode {
    /// Mooncake's `OPCODE_READ` (0) and `OPCODE_WRITE` (1).
    pub fn from_raw(v: i32) -> Result<Opcode> {
        match v {
            0 => Ok(Opcode::Read),
            1 => Ok(Opcode::Write),
            _ => Err(Error::InvalidArgument(format!(
                "opcode {v} is neither READ (0) nor WRITE (1)"
            ))),
        }
    }
}

/// One request of a batch.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// Direction.
    pub opcode: Opcode,
    /// Local address (read into, or written from).
    pub source: u64,
    /// Segment id from `openSegment`.
    pub target_id: i32,
    /// Absolute address in the target segment's process.
    pub target_offset: u64,
    /// Bytes to move.
    pub length: u64,
}

/// A transfer engine instance.
pub struct Engine {
    local_name: String,
    given_name: String,
    conn: MetadataConn,
    config: &'static Config,
    store: Option<Box<dyn MetadataStore>>,
    rpc: RpcServer,
    rpc_ip: String,
    control: Arc<ControlState>,
    memory: Arc<RwLock<MemoryRegistry>>,
    segments: SegmentCache,
    batches: HandleTable<Batch>,
    local: LocalCopier,
    sched: OnceCell<Installed>,
    topology: Mutex<Option<(Topology, PriorityMatrix)>>,
    keeper: OnceCell<keeper::Keeper>,
    /// A store write of our entries failed; the keeper retries it.
    publish_pending: AtomicBool,
    /// Random per process: with `revision`, the descriptor's generation.
    boot_id: u64,
    revision: std::sync::atomic::AtomicU64,
    /// The loopback address this engine is confined to, if any.
    loopback: Option<IpAddr>,
    /// RDMA devices this engine may use (Mooncake's `TransferEngine`
    /// device filter; empty: all), beside `MC_TE_FILTERS`.
    device_filter: Vec<String>,
    /// Orders what changes the registered memory, the installed transport
    /// and the published descriptor: installs, registrations and shutdown
    /// run one at a time, and none starts once the engine is closed.
    changes: Mutex<()>,
    /// Notifications and descriptor refetches, run off the caller's thread.
    work: PeerWork,
    /// Requests waiting for their segment's descriptor to be refetched,
    /// by segment id; the refetch job submits them.
    deferred: Mutex<HashMap<i32, Vec<Deferred>>>,
    /// Cancels this engine's handshake calls when it is destroyed.
    cancel: Arc<Cancel>,
    /// The engine itself, for what its transports call back (the RDMA
    /// transport's peer lookups).
    me: OnceCell<std::sync::Weak<Engine>>,
    closed: AtomicBool,
}

/// A request whose task waits for its segment's descriptor.
struct Deferred {
    batch: Arc<Batch>,
    task: usize,
    request: Request,
}

/// Where `submit` sends one request.
enum Target {
    /// The engine's own segment.
    Local,
    /// A remote segment, with its cached descriptor.
    Remote(Arc<RemoteSegment>),
    /// A remote segment whose descriptor is refetched first (in the
    /// background).
    AfterRefetch(Arc<RemoteSegment>),
}

/// Shortest interval between refetches of a peer's descriptor for requests
/// it does not cover (memory the peer may have registered since).
const UNCOVERED_REFETCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Why background work was refused, for messages.
fn refused(why: Refused) -> &'static str {
    match why {
        Refused::Stopped => "the engine is being destroyed",
        Refused::Full => "too much background work is waiting (a peer does not answer)",
    }
}

/// Handle returned for the installed TCP transport.
const TCP_TRANSPORT_HANDLE: u64 = 1;
/// Handle returned for the installed RDMA transport.
#[cfg(feature = "rdma")]
const RDMA_TRANSPORT_HANDLE: u64 = 2;

/// The transport an engine moves remote data with, and its scheduler.
enum Installed {
    Tcp(Arc<Scheduler<TcpCarrier>>),
    #[cfg(feature = "rdma")]
    Rdma(Arc<Scheduler<RdmaCarrier>>),
}

impl Installed {
    /// The protocol name, as in descriptors.
    fn protocol(&self) -> &'static str {
        match self {
            Installed::Tcp(_) => "tcp",
            #[cfg(feature = "rdma")]
            Installed::Rdma(_) => "rdma",
        }
    }

    /// The handle `installTransport` returns.
    fn handle(&self) -> u64 {
        match self {
            Installed::Tcp(_) => TCP_TRANSPORT_HANDLE,
            #[cfg(feature = "rdma")]
            Installed::Rdma(_) => RDMA_TRANSPORT_HANDLE,
        }
    }

    fn submit(
        &self,
        batch: &Arc<Batch>,
        task: usize,
        seg: &Arc<RemoteSegment>,
        memory: &MemoryRegistry,
        xfer: Transfer,
    ) {
        match self {
            Installed::Tcp(s) => s.submit(batch, task, seg, memory, xfer),
            #[cfg(feature = "rdma")]
            Installed::Rdma(s) => s.submit(batch, task, seg, memory, xfer),
        }
    }

    fn nic_loads(&self) -> Vec<NicLoad> {
        match self {
            Installed::Tcp(s) => s.nic_loads(),
            #[cfg(feature = "rdma")]
            Installed::Rdma(s) => s.nic_loads(),
        }
    }

    fn shutdown(&self) {
        match self {
            Installed::Tcp(s) => s.shutdown(),
            #[cfg(feature = "rdma")]
            Installed::Rdma(s) => s.shutdown(),
        }
    }
}

impl Engine {
    /// Creates an engine named `local_name` with the metadata backend of
    /// `conn`: starts its handshake listener, publishes its RPC address
    /// (store mode) and, with `auto_discover`, installs a transport.
    pub fn new(conn: &str, local_name: &str, auto_discover: bool) -> Result<Arc<Engine>> {
        Self::new_filtered(conn, local_name, auto_discover, &[])
    }

    /// [`Engine::new`] restricted to the RDMA devices named in
    /// `device_filter` (empty: every device), as Mooncake's
    /// `TransferEngine(auto_discover, filter)`; `MC_TE_FILTERS` applies too.
    pub fn new_filtered(
        conn: &str,
        local_name: &str,
        auto_discover: bool,
        device_filter: &[String],
    ) -> Result<Arc<Engine>> {
        let config = config();
        crate::fd_limit::raise();
        let conn = MetadataConn::parse(conn)?;
        let local_name = local_name.trim().trim_start_matches('/').to_string();
        if local_name.is_empty() {
            return Err(Error::InvalidArgument("local server name is empty".into()));
        }
        let store = remote::open_store(&conn, config)?;
        let loopback = remote::loopback_ip(&local_name, config);
        let binding = remote::bind_rpc(&conn, &local_name, loopback, config)?;
        let control = Arc::new(ControlState::new(control::NotifyLimits::from_config(
            config,
        )));
        let rpc = RpcServer::start(
            binding.listener,
            control.clone(),
            crate::rpc::ServerOptions::from_config(config),
        )
        .map_err(|e| Error::Socket(format!("handshake listener could not start: {e}")))?;
        let engine = Engine {
            given_name: local_name.clone(),
            local_name: binding.name,
            conn,
            config,
            store,
            rpc,
            rpc_ip: binding.ip,
            control,
            memory: Arc::new(RwLock::new(MemoryRegistry::default())),
            segments: SegmentCache::default(),
            batches: HandleTable::new(),
            local: LocalCopier::default(),
            sched: OnceCell::new(),
            topology: Mutex::new(None),
            keeper: OnceCell::new(),
            publish_pending: AtomicBool::new(false),
            boot_id: remote::boot_id(),
            revision: Default::default(),
            loopback,
            device_filter: device_filter.to_vec(),
            changes: Mutex::new(()),
            work: PeerWork::default(),
            deferred: Mutex::default(),
            cancel: Arc::default(),
            me: OnceCell::new(),
            closed: AtomicBool::new(false),
        };
        if let Err(e) = engine.publish_rpc_meta() {
            engine.discard(false);
            return Err(e);
        }
        let engine = Arc::new(engine);
        engine.work.attach(Arc::downgrade(&engine));
        let _ = engine.me.set(Arc::downgrade(&engine));
        let refresh = match config.metadata_refresh_interval_secs {
            0 => None,
            s => Some(std::time::Duration::from_secs(s)),
        };
        if let Some(k) =
            keeper::Keeper::start(Arc::downgrade(&engine), engine.store.is_some(), refresh)
        {
            let _ = engine.keeper.set(k);
        }
        if auto_discover || config.force_tcp {
            if let Err(e) = engine.auto_install() {
                engine.discard(true);
                return Err(e);
            }
        }
        info!(
            name = %engine.local_name,
            metadata = %engine.conn,
            rpc = %engine.local_ip_and_port(),
            "transfer engine created"
        );
        Ok(engine)
    }

    /// The name peers open this engine's segment by (in P2P mode
    /// `host:port` of the handshake listener).
    pub fn local_name(&self) -> &str {
        &self.local_name
    }

    /// Whether `name` is this engine: its published name, or the name it
    /// was created with (P2P mode rewrites the port; the original name
    /// still opens the local segment).
    pub fn is_own_name(&self, name: &str) -> bool {
        name == self.local_name || name == self.given_name
    }

    /// `ip:port` of the handshake listener (no brackets, as Mooncake).
    pub fn local_ip_and_port(&self) -> String {
        format!("{}:{}", self.rpc_ip, self.rpc.port())
    }

    /// Port of the handshake listener (Mooncake's `getRpcPort`).
    pub fn rpc_port(&self) -> u16 {
        self.rpc.port()
    }

    /// Installs the transport for an auto-discovered machine, as Mooncake
    /// does: RDMA when RDMA devices with an active port exist (and
    /// `MC_FORCE_TCP` is not set), TCP otherwise. If no RDMA device can be
    /// set up after all, TCP serves (with a warning).
    fn auto_install(&self) -> Result<()> {
        let topo = self.discover_topology();
        let usable = topo.rdma_devices.iter().filter(|d| d.ports_active).count();
        if usable > 0 && !self.config.force_tcp {
            if cfg!(feature = "rdma") {
                match self.install_transport("rdma", None) {
                    Ok(_) => return Ok(()),
                    Err(e) => {
                        warn!("auto discovery: rdma could not be installed ({e}); installing tcp")
                    }
                }
            } else {
                warn!(
                    "{usable} RDMA device(s) found, but this build has no RDMA transport \
                     (feature \"rdma\"); installing tcp"
                );
            }
        }
        self.install_transport("tcp", None).map(|_| ())
    }

    /// Scans the machine's topology and keeps it with its priority matrix
    /// (unless a matrix was given explicitly); returns the topology.
    pub fn discover_topology(&self) -> Topology {
        let topo = Topology::discover(&self.device_filter);
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
        let mut slot = sync::lock(&self.topology);
        let (topo, matrix) = slot.get_or_insert_with(|| {
            let topo = Topology::discover(&self.device_filter);
            let m = PriorityMatrix::from_topology(&topo);
            (topo, m)
        });
        crate::topology::show_links(topo, matrix, json)
    }

    /// The priority matrix of `MC_CUSTOM_TOPO_JSON`, if set.
    fn custom_matrix(&self) -> Result<Option<PriorityMatrix>> {
        let Some(path) = &self.config.custom_topo_json else {
            return Ok(None);
        };
        let json = std::fs::read_to_string(path).map_err(|e| {
            Error::InvalidArgument(format!("MC_CUSTOM_TOPO_JSON={path} cannot be read: {e}"))
        })?;
        PriorityMatrix::parse(&json).map(Some)
    }

    /// Installs a transport by protocol name and returns its handle.
    /// `matrix` is a NIC priority matrix JSON (`{"cpu:0": [[preferred],
    /// [available]], ...}`), else `MC_CUSTOM_TOPO_JSON`'s, else the
    /// discovered one. For TCP its devices are network interfaces (without
    /// a matrix every interface that is up serves); for RDMA they are RDMA
    /// devices. One transport per engine: installing the installed one
    /// again returns its handle; another one is refused.
    pub fn install_transport(&self, proto: &str, matrix: Option<&str>) -> Result<u64> {
        let _change = self.begin_change("installTransport")?;
        let given = match matrix {
            Some(json) => Some(PriorityMatrix::parse(json)?),
            None => self.custom_matrix()?,
        };
        if let Some(installed) = self.sched.get() {
            if installed.protocol() == proto {
                warn!("transport {proto} is already installed");
                return Ok(installed.handle());
            }
            return Err(Error::InvalidArgument(format!(
                "transport {} is installed; an engine runs one transport, so {proto:?} is not \
                 installed",
                installed.protocol()
            )));
        }
        let installed = match proto {
            "tcp" => self.start_tcp(given)?,
            #[cfg(feature = "rdma")]
            "rdma" => self.start_rdma(given)?,
            #[cfg(not(feature = "rdma"))]
            "rdma" => {
                return Err(Error::DeviceNotFound(
                    "transport \"rdma\" is not available in this build (install \"tcp\", or \
                     build with the \"rdma\" feature)"
                        .into(),
                ));
            }
            "efa" | "barex" => {
                return Err(Error::DeviceNotFound(format!(
                    "transport {proto:?} (a vendor variant of RDMA) is not available; install \
                     \"rdma\" or \"tcp\""
                )));
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "transport {other:?} is unknown; this build provides \"tcp\"{}",
                    if cfg!(feature = "rdma") {
                        " and \"rdma\""
                    } else {
                        ""
                    }
                )));
            }
        };
        let handle = installed.handle();
        if let Err(lost) = self.sched.set(installed) {
            lost.shutdown();
            return self.sched.get().map_or(Ok(handle), |i| Ok(i.handle()));
        }
        #[cfg(feature = "rdma")]
        if let Some(Installed::Rdma(s)) = self.sched.get() {
            let rdma = s.carrier().transport().clone();
            let me = self.me.get().cloned().unwrap_or_default();
            rdma.set_peer_lookup(Box::new(move |server, fresh, opts| {
                let engine = me.upgrade().ok_or("the engine is being destroyed")?;
                engine
                    .rdma_peer(server, fresh, opts)
                    .map_err(|e| e.to_string())
            }));
            self.control
                .set_connection_handler(Box::new(move |req, from| rdma.accept(req, from)));
        }
        self.publish_local_desc()?;
        Ok(handle)
    }

    /// Starts the TCP transport over the interfaces of `given` (or every
    /// interface that is up).
    fn start_tcp(&self, given: Option<PriorityMatrix>) -> Result<Installed> {
        let topo = self.discover_topology();
        let named = given.is_some();
        let tcp_matrix = given.unwrap_or_else(|| PriorityMatrix::from_topology_tcp(&topo));
        let devices = match self.loopback {
            None => crate::transport::tcp::carrier::tcp_devices(
                &tcp_matrix,
                &topo.net_interfaces,
                &self.config.te_filters,
            ),
            Some(ip) => {
                if named {
                    warn!(
                        "this engine is confined to loopback ({ip}); the priority \
                         matrix's devices are not used"
                    );
                }
                remote::loopback_devices(&topo.net_interfaces, ip)
            }
        };
        info!(
            "tcp devices: {:?}",
            devices
                .iter()
                .map(|d| format!("{} {}", d.name, d.addr))
                .collect::<Vec<_>>()
        );
        let (min, max) = (self.config.min_rpc_port, self.config.max_rpc_port);
        let listener = match self.loopback {
            Some(ip) => crate::rpc::bind_in_range_on(min, max, ip),
            None => crate::rpc::bind_in_range(min, max, true)
                .or_else(|_| crate::rpc::bind_in_range(min, max, false)),
        }
        .map_err(|e| Error::Socket(format!("no free tcp data port: {e}")))?;
        let tcp = TcpTransport::start(listener, self.memory.clone(), self.config)?;
        let carrier = TcpCarrier::new(Arc::new(tcp), devices, self.config.tcp_force_v1);
        Ok(Installed::Tcp(Arc::new(Scheduler::new(
            carrier,
            tcp_matrix,
            self.config,
        ))))
    }

    /// Starts the RDMA transport on the devices of `given` (or of the
    /// discovered topology), restricted by `MC_TE_FILTERS`, and registers
    /// every buffer registered so far on them.
    #[cfg(feature = "rdma")]
    fn start_rdma(&self, given: Option<PriorityMatrix>) -> Result<Installed> {
        // Discovery (hwloc) is only needed to build a matrix.
        let mut matrix = match given {
            Some(m) => m,
            None => {
                let topo = self.discover_topology();
                if !topo.rdma_devices.iter().any(|d| d.ports_active) {
                    return Err(Error::DeviceNotFound(
                        "no RDMA device with an active port on this machine (rdma needs an \
                         InfiniBand, RoCE or iWARP NIC, or soft-RoCE); install \"tcp\" instead"
                            .into(),
                    ));
                }
                PriorityMatrix::from_topology(&topo)
            }
        };
        let filters = &self.config.te_filters;
        let allowed = |d: &String| {
            (filters.is_empty() || filters.contains(d))
                && (self.device_filter.is_empty() || self.device_filter.contains(d))
        };
        let wanted: Vec<String> = matrix
            .devices()
            .iter()
            .filter(|d| allowed(d))
            .cloned()
            .collect();
        if wanted.is_empty() {
            return Err(Error::DeviceNotFound(format!(
                "no RDMA device to use: the priority matrix {} names none{}{}",
                matrix.to_json(),
                if filters.is_empty() {
                    String::new()
                } else {
                    format!(" that MC_TE_FILTERS={} allows", filters.join(","))
                },
                if self.device_filter.is_empty() {
                    String::new()
                } else {
                    format!(" among the devices {}", self.device_filter.join(","))
                }
            )));
        }
        let rdma = Arc::new(crate::transport::rdma::RdmaTransport::start(
            &wanted,
            &self.local_name,
            self.config,
        )?);
        // Devices that are filtered out or could not be set up leave the
        // published matrix, so peers index our devices as we do.
        for d in matrix.devices().to_vec() {
            if !rdma.device_names().contains(&d) {
                matrix.disable_device(&d);
            }
        }
        let matrix = PriorityMatrix::parse(&matrix.to_json().to_string())?;
        if matrix.devices() != rdma.device_names() {
            rdma.shutdown();
            return Err(Error::Context(format!(
                "RDMA devices {:?} do not follow the priority matrix order {:?}",
                rdma.device_names(),
                matrix.devices()
            )));
        }
        let regions: Vec<Region> = sync::read(&self.memory).regions().cloned().collect();
        for r in &regions {
            // SAFETY: registered buffers stay mapped until the caller
            // unregisters them (the C API's contract), which also removes
            // them from this transport.
            if let Err(e) = unsafe { rdma.register(r.addr, r.length, r.remote_accessible) } {
                rdma.shutdown();
                return Err(e);
            }
        }
        let carrier = RdmaCarrier::new(rdma);
        Ok(Installed::Rdma(Arc::new(Scheduler::new(
            carrier,
            matrix,
            self.config,
        ))))
    }

    /// Registers buffers: all of them, or none on error. Installed
    /// transports publish them at once.
    pub fn register(&self, regions: &[Region]) -> Result<()> {
        let _change = self.begin_change("registerLocalMemory")?;
        sync::write(&self.memory).insert(regions)?;
        if let Err(e) = self.register_on_transport(regions) {
            let mut memory = sync::write(&self.memory);
            for r in regions {
                let _ = memory.remove(r.addr);
            }
            return Err(e);
        }
        if let Err(e) = self.publish_local_desc() {
            self.unregister_on_transport(regions.iter().map(|r| r.addr));
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

    /// Registers `regions` with the installed transport, if it needs that
    /// (RDMA: a memory region on every device); all or none.
    fn register_on_transport(&self, regions: &[Region]) -> Result<()> {
        #[cfg(feature = "rdma")]
        if let Some(Installed::Rdma(s)) = self.sched.get() {
            let rdma = s.carrier().transport();
            for (i, r) in regions.iter().enumerate() {
                // SAFETY: the C API requires a registered buffer to stay
                // mapped until it is unregistered, which also removes it
                // from the transport.
                if let Err(e) = unsafe { rdma.register(r.addr, r.length, r.remote_accessible) } {
                    for done in &regions[..i] {
                        rdma.unregister(done.addr);
                    }
                    return Err(e);
                }
            }
        }
        #[cfg(not(feature = "rdma"))]
        let _ = regions;
        Ok(())
    }

    /// Removes buffers from the installed transport; returns once nothing
    /// it runs touches them.
    fn unregister_on_transport(&self, addrs: impl Iterator<Item = u64>) {
        #[cfg(feature = "rdma")]
        if let Some(Installed::Rdma(s)) = self.sched.get() {
            for addr in addrs {
                s.carrier().transport().unregister(addr);
            }
        }
        #[cfg(not(feature = "rdma"))]
        let _ = addrs.count();
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
                        warn!("unregister: {e}");
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        self.unregister_on_transport(removed.into_iter());
        if let Err(e) = self.publish_local_desc() {
            warn!("unregister: the descriptor could not be republished: {e}");
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Creates a batch with room for `capacity` tasks and returns its id.
    pub fn allocate_batch(&self, capacity: usize) -> Result<u64> {
        let timeout = match self.config.slice_timeout_secs {
            0 => None,
            s => Some(std::time::Duration::from_secs(s)),
        };
        Ok(self
            .batches
            .insert(Arc::new(Batch::new(capacity, timeout)?)))
    }

    fn batch(&self, id: u64) -> Result<Arc<Batch>> {
        self.batches
            .get(id)
            .ok_or_else(|| Error::InvalidArgument(format!("batch id {id:#x} is unknown or freed")))
    }

    /// Submits requests to a batch. Every check runs before any task is
    /// created, so an error leaves the batch unchanged. Nothing here waits
    /// on a peer: a request whose segment's descriptor must be refetched
    /// first (it does not cover the request, the peer may have restarted,
    /// or `MC_DISABLE_METACACHE`) waits in its task, which the refetch
    /// submits or fails in the background.
    pub fn submit(&self, batch_id: u64, requests: &[Request]) -> Result<()> {
        let batch = self.batch(batch_id)?;
        let mut targets: Vec<Target> = Vec::with_capacity(requests.len());
        let mut refetching: Vec<i32> = Vec::new();
        for r in requests {
            if r.target_id == LOCAL_SEGMENT_ID {
                targets.push(Target::Local);
                continue;
            }
            let seg = self.segments.get(r.target_id).ok_or_else(|| {
                Error::InvalidArgument(format!("segment id {} is not open", r.target_id))
            })?;
            if !refetching.contains(&r.target_id) && self.needs_refetch(&seg, r) {
                refetching.push(r.target_id);
            }
            self.check_protocol(&seg)?;
            if seg.desc.protocol == "rdma" && r.length > 0 {
                // RDMA moves bytes from and to registered memory only.
                let memory = sync::read(&self.memory);
                if memory.find(r.source, r.length).is_none() {
                    return Err(Error::AddressNotRegistered(format!(
                        "the source {:#x}+{} is not inside one registered buffer (RDMA \
                         needs registered local memory)",
                        r.source, r.length
                    )));
                }
            }
            targets.push(match refetching.contains(&r.target_id) {
                true => Target::AfterRefetch(seg),
                false => Target::Remote(seg),
            });
        }
        batch.append(requests.len(), |first, _| {
            let memory = sync::read(&self.memory);
            for (i, (r, target)) in requests.iter().zip(&targets).enumerate() {
                match target {
                    Target::Local => self.submit_local(&batch, first + i, r, &memory),
                    Target::Remote(seg) => self.submit_remote(&batch, first + i, r, seg, &memory),
                    Target::AfterRefetch(seg) => self.defer(&batch, first + i, r, seg),
                }
            }
            Ok(())
        })
    }

    /// Whether `r` must wait for its segment's descriptor to be refetched:
    /// without the metadata cache always; when a transfer to a peer that
    /// may restart under the same name (store mode, or fixed P2P ports)
    /// failed since the last fetch; when the descriptor does not cover
    /// `r` (memory the peer registered since, reachable as with Mooncake,
    /// whose initiator does not check) and no refetch for that happened in
    /// the last second, or one is under way.
    fn needs_refetch(&self, seg: &RemoteSegment, r: &Request) -> bool {
        if !self.config.metacache {
            return true;
        }
        let same_name_restarts = self.store.is_some() || self.config.legacy_rpc_port_binding;
        if same_name_restarts && seg.freshness.take_refetch() {
            return true;
        }
        r.length > 0
            && !seg.covers(r.target_offset, r.length)
            && (sync::lock(&self.deferred).contains_key(&r.target_id)
                || self
                    .segments
                    .may_refetch_uncovered(r.target_id, UNCOVERED_REFETCH_INTERVAL))
    }

    /// Whether the installed transport speaks the protocol of `seg`.
    fn check_protocol(&self, seg: &RemoteSegment) -> Result<()> {
        let installed = self.sched.get().map(Installed::protocol);
        if installed == Some(seg.desc.protocol.as_str()) {
            return Ok(());
        }
        Err(Error::NotSupportedTransport(format!(
            "segment {:?} speaks {:?}, which is not installed here ({})",
            seg.name,
            seg.desc.protocol,
            installed.map_or("no transport".to_string(), |p| format!("{p} is"))
        )))
    }

    /// Leaves task `task` waiting until the descriptor of `seg` has been
    /// refetched in the background (one refetch serves every request
    /// waiting for it), then submits it.
    fn defer(&self, batch: &Arc<Batch>, task: usize, r: &Request, seg: &RemoteSegment) {
        let mut deferred = sync::lock(&self.deferred);
        let waiting = Deferred {
            batch: batch.clone(),
            task,
            request: *r,
        };
        if let Some(list) = deferred.get_mut(&r.target_id) {
            list.push(waiting);
            return;
        }
        let (id, name) = (r.target_id, seg.name.clone());
        let job: Job = Box::new(move |e: &Engine| e.refetch_then_submit(id, &name));
        match self.work.submit(&seg.name, job, Finish::Drop) {
            Ok(()) => {
                deferred.insert(id, vec![waiting]);
            }
            Err(why) => Self::fail_task(
                batch,
                task,
                format_args!(
                    "the descriptor of segment {:?} cannot be refetched: {}",
                    seg.name,
                    refused(why)
                ),
            ),
        }
    }

    /// The background half of [`Engine::defer`]: refetches the descriptor
    /// of segment `id` and submits the requests that waited for it.
    fn refetch_then_submit(&self, id: i32, name: &str) {
        self.sync_segment(name);
        let waiting = sync::lock(&self.deferred).remove(&id).unwrap_or_default();
        let seg = self.segments.get(id);
        let memory = sync::read(&self.memory);
        for Deferred {
            batch,
            task,
            request,
        } in waiting
        {
            let problem = match &seg {
                None => Some(format!("segment id {id} was closed")),
                Some(seg) => self.check_protocol(seg).err().map(|e| e.to_string()),
            };
            match (problem, &seg) {
                (None, Some(seg)) => self.submit_remote(&batch, task, &request, seg, &memory),
                (problem, _) => Self::fail_task(
                    &batch,
                    task,
                    format_args!("{}", problem.unwrap_or_default()),
                ),
            }
        }
    }

    /// Fails a task that never reached a transport.
    fn fail_task(batch: &Batch, id: usize, why: std::fmt::Arguments<'_>) {
        crate::warn_limited!("task {id}: {why}");
        if let Some(task) = batch.slot(id) {
            task.add_slices(1);
            task.finish_slice(0, false);
        }
    }

    /// Why a request's local `source` range cannot be used: NULL, wrapping
    /// the address space, or (with `MC_TE_STRICT_LOCAL`) not inside one
    /// registered buffer.
    fn source_problem(&self, r: &Request, memory: &MemoryRegistry) -> Option<&'static str> {
        if r.source == 0 || r.source.checked_add(r.length).is_none() {
            return Some("the source pointer is NULL or wraps");
        }
        (self.config.strict_local && memory.find(r.source, r.length).is_none())
            .then_some("the source range is not inside one registered buffer (MC_TE_STRICT_LOCAL)")
    }

    /// Runs one request against this process's own registered memory.
    fn submit_local(&self, batch: &Arc<Batch>, id: usize, r: &Request, memory: &MemoryRegistry) {
        let Some(task) = batch.slot(id) else {
            return;
        };
        if r.length == 0 {
            task.add_slices(1);
            task.finish_slice(0, true);
            return;
        }
        if memory.find(r.target_offset, r.length).is_none() {
            return Self::fail_task(
                batch,
                id,
                format_args!(
                    "{} bytes at {:#x} are not inside one registered buffer",
                    r.length, r.target_offset
                ),
            );
        }
        if let Some(why) = self.source_problem(r, memory) {
            return Self::fail_task(batch, id, format_args!("{why}"));
        }
        let (src, dst) = match r.opcode {
            Opcode::Write => (r.source, r.target_offset),
            Opcode::Read => (r.target_offset, r.source),
        };
        let cfg = self.config;
        let n = planner::slice_count(r.length, cfg.slice_size, cfg.fragment_limit);
        task.add_slices(n);
        if n == 1 {
            // SAFETY: the target range was checked against the registry
            // above; the source is the caller's memory, which the C API
            // requires to be valid for `length` bytes.
            unsafe { copy_bytes(src, dst, r.length) };
            task.finish_slice(r.length, true);
            return;
        }
        for (off, len) in planner::slices(r.length, cfg.slice_size, cfg.fragment_limit) {
            let batch = batch.clone();
            self.local.dispatch(CopyJob {
                dst: (dst + off) as usize,
                src: (src + off) as usize,
                len: len as usize,
                done: Box::new(move || {
                    if let Some(task) = batch.slot(id) {
                        task.finish_slice(len, true);
                    }
                }),
            });
        }
    }

    /// Sends one request to a remote segment over the installed transport.
    fn submit_remote(
        &self,
        batch: &Arc<Batch>,
        id: usize,
        r: &Request,
        seg: &Arc<RemoteSegment>,
        memory: &MemoryRegistry,
    ) {
        if r.length == 0 {
            if let Some(task) = batch.slot(id) {
                task.add_slices(1);
                task.finish_slice(0, true);
            }
            return;
        }
        let buffer = seg.desc.find_buffer(r.target_offset, r.length);
        let Some(buffer) = buffer.map(|i| &seg.desc.buffers[i]) else {
            return Self::fail_task(
                batch,
                id,
                format_args!(
                    "{} bytes at {:#x} are not inside one buffer of segment {:?}",
                    r.length, r.target_offset, seg.name
                ),
            );
        };
        if seg.desc.protocol == "rdma" && buffer.rkey.is_empty() {
            return Self::fail_task(
                batch,
                id,
                format_args!(
                    "buffer {:#x} of segment {:?} is not remotely accessible (no rkey)",
                    buffer.addr, seg.name
                ),
            );
        }
        if let Some(why) = self.source_problem(r, memory) {
            return Self::fail_task(batch, id, format_args!("{why}"));
        }
        let Some(sched) = self.sched.get() else {
            return Self::fail_task(batch, id, format_args!("no transport installed"));
        };
        let xfer = Transfer {
            local: r.source,
            remote: r.target_offset,
            len: r.length,
            write: r.opcode == Opcode::Write,
        };
        sched.submit(batch, id, seg, memory, xfer);
    }

    /// Submits requests and remembers a notification sent to the owner of
    /// the first request's segment once the whole batch has completed.
    pub fn submit_with_notify(
        &self,
        batch_id: u64,
        requests: &[Request],
        name: String,
        msg: String,
    ) -> Result<()> {
        let first = requests.first().ok_or_else(|| {
            Error::InvalidArgument("no request to attach a notification to".into())
        })?;
        self.submit(batch_id, requests)?;
        self.batch(batch_id)?.set_notify(PendingNotify {
            target_id: first.target_id,
            name,
            msg,
        });
        Ok(())
    }

    /// Status of one task. A caller polling a task that is still running
    /// first lends its thread to one queued local copy. When the batch has
    /// completed and carries a notification, it is handed to the
    /// background to send (this call does not wait on the peer).
    pub fn status(&self, batch_id: u64, task_id: usize) -> Result<(TaskStatus, u64)> {
        let batch = self.batch(batch_id)?;
        let mut result = batch.poll(task_id)?;
        if result.0 == TaskStatus::Waiting && self.local.help_one() {
            result = batch.poll(task_id)?;
        }
        if result.0 == TaskStatus::Completed {
            if let Some(n) = batch.take_notify_if_complete() {
                self.notify_later(batch_id, n);
            }
        }
        Ok(result)
    }

    /// Frees a batch once every task was seen terminal.
    pub fn free_batch(&self, batch_id: u64) -> Result<()> {
        match self.batches.remove_if(batch_id, Batch::all_observed) {
            Ok(_) => Ok(()),
            Err(Some(_)) => Err(Error::BatchBusy),
            Err(None) => Err(Error::InvalidArgument(format!(
                "batch id {batch_id:#x} is unknown or freed"
            ))),
        }
    }

    /// Takes every notification received so far, oldest first.
    pub fn take_notifies(&self) -> Vec<(String, String)> {
        self.control.take_notifies()
    }

    /// Per-device load of the installed transports.
    pub fn nic_loads(&self) -> Vec<NicLoad> {
        self.sched.get().map(|s| s.nic_loads()).unwrap_or_default()
    }

    /// Fails in-flight work, removes this engine's metadata, and stops every
    /// thread it started; idempotent.
    pub fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // An install or registration under way finishes first; none starts
        // after this.
        let _change = sync::lock(&self.changes);
        self.stop_threads();
        self.unpublish(false);
        self.batches.drain();
        info!(name = %self.local_name, "transfer engine destroyed");
    }

    /// Tears down an engine whose creation failed, without the logs of a
    /// destroyed engine (the caller never had it; the failure is reported
    /// once, by the caller): its threads stop, and what it `published` to
    /// the store is removed.
    fn discard(&self, published: bool) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stop_threads();
        if published {
            self.unpublish(true);
        }
    }

    /// Takes the lock that orders installs, registrations and shutdown;
    /// refuses once the engine is closed (`destroyTransferEngine` has begun).
    fn begin_change(&self, call: &str) -> Result<std::sync::MutexGuard<'_, ()>> {
        let guard = sync::lock(&self.changes);
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(format!(
                "{call}: the engine is being destroyed"
            )));
        }
        Ok(guard)
    }

    fn stop_threads(&self) {
        // Notifications of completed batches still go out, waiting on their
        // peers at most the handshake connect timeout; then every handshake
        // call under way is cancelled.
        self.work.drain(std::time::Duration::from_secs(
            self.config.handshake_connect_timeout_secs,
        ));
        self.cancel.cancel();
        self.work.stop();
        if let Some(k) = self.keeper.get() {
            k.stop();
        }
        self.control.clear_connection_handler();
        if let Some(s) = self.sched.get() {
            s.shutdown();
        }
        self.rpc.shutdown();
        self.local.shutdown();
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}
