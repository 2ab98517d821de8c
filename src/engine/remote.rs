//! How an engine meets its peers: its handshake address, the descriptor it
//! publishes, and the descriptors and RPC addresses of the segments it
//! opens, through the P2P handshake or a metadata store.

use super::peer_work::{Finish, Job};
use super::{Engine, Installed, LOCAL_SEGMENT_ID, refused};
use crate::batch::PendingNotify;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::metadata::conn::MetadataConn;
use crate::metadata::descriptor::{BufferDesc, SegmentDesc, now_timestamp};
use crate::metadata::etcd::EtcdStore;
use crate::metadata::http::HttpStore;
use crate::metadata::keys::{RpcMeta, rpc_meta_key, segment_key};
use crate::metadata::redis::RedisStore;
use crate::metadata::store::MetadataStore;
use crate::rpc::{ClientOptions, FrameKind, parse_host_port, wrap_ipv6};
use crate::segment::{RemoteSegment, SegmentBuffer};
use crate::sync;
use crate::topology::{IfAddr, NetInterface};
use crate::transport::scheduler::GENERATION_KEY;
use crate::transport::tcp::carrier::{TCP_DEVICES_KEY, TcpDevice};
use serde_json::json;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use tracing::{debug, info, warn};

/// The store behind a connection string (`None` in P2P mode); values
/// larger than `MC_PEER_MAX_DESCRIPTOR_BYTES` are refused.
pub(super) fn open_store(
    conn: &MetadataConn,
    cfg: &Config,
) -> Result<Option<Box<dyn MetadataStore>>> {
    let max = cfg.peer_max_descriptor_bytes;
    Ok(match conn {
        MetadataConn::P2p => None,
        MetadataConn::Http(url) => Some(Box::new(HttpStore::new(url)?.limit_values(max))),
        MetadataConn::Etcd(endpoints) => {
            Some(Box::new(EtcdStore::new(endpoints)?.limit_values(max)))
        }
        MetadataConn::Redis(addr) => {
            Some(Box::new(RedisStore::from_config(addr)?.limit_values(max)))
        }
    })
}

/// Checks that a peer's descriptor stays within `MC_PEER_MAX_DEVICES` and
/// `MC_PEER_MAX_BUFFERS` before it is decoded, so a hostile or broken peer
/// cannot make this engine hold, or connect to, what it lists beyond them.
fn check_peer_bounds(name: &str, json: &serde_json::Value, cfg: &Config) -> Result<()> {
    let count = |key: &str| {
        json.get(key)
            .and_then(serde_json::Value::as_array)
            .map_or(0, Vec::len)
    };
    let bounds = [
        (
            "devices",
            "RDMA devices",
            cfg.peer_max_devices,
            "MC_PEER_MAX_DEVICES",
        ),
        (
            TCP_DEVICES_KEY,
            "TCP devices",
            cfg.peer_max_devices,
            "MC_PEER_MAX_DEVICES",
        ),
        (
            "buffers",
            "buffers",
            cfg.peer_max_buffers,
            "MC_PEER_MAX_BUFFERS",
        ),
    ];
    for (key, what, max, var) in bounds {
        let n = count(key);
        if n > max {
            return Err(Error::Metadata(format!(
                "segment {name:?} publishes {n} {what}; at most {max} are accepted ({var})"
            )));
        }
    }
    Ok(())
}

/// A random number per engine, so a restarted process publishes a new
/// descriptor generation even with the same buffers.
pub(super) fn boot_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

/// The bound handshake listener and the identity it gives the engine.
pub(super) struct RpcBinding {
    pub listener: TcpListener,
    /// The engine's name: `host:port` in P2P mode, as given otherwise.
    pub name: String,
    /// The address peers reach the listener at.
    pub ip: String,
}

/// The loopback address an engine is confined to: its name's host when
/// that is a loopback address (`127.0.0.1`, `::1`, `localhost`), else
/// `MC_TCP_BIND_ADDRESS` when that is one. Such an engine binds its
/// handshake and data listeners to this address only and publishes no
/// other, so its registered memory is not reachable from the network.
pub(super) fn loopback_ip(local_name: &str, cfg: &Config) -> Option<IpAddr> {
    let loopback = |host: &str| -> Option<IpAddr> {
        if host.eq_ignore_ascii_case("localhost") {
            return Some(if cfg.use_ipv6 {
                Ipv6Addr::LOCALHOST.into()
            } else {
                Ipv4Addr::LOCALHOST.into()
            });
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<IpAddr>().ok().filter(IpAddr::is_loopback)
    };
    let (host, _) = parse_host_port(local_name, cfg.handshake_port);
    loopback(&host).or_else(|| cfg.tcp_bind_address.as_deref().and_then(loopback))
}

/// The address advertised in store mode: the loopback address of an engine
/// confined to it, else `MC_TCP_BIND_ADDRESS`, else the first address of an
/// interface that is up and not loopback (IPv6 only with `MC_USE_IPV6`),
/// else loopback.
fn advertised_ip(cfg: &Config, loopback: Option<IpAddr>) -> String {
    if let Some(ip) = loopback {
        return ip.to_string();
    }
    if let Some(a) = &cfg.tcp_bind_address {
        return a.clone();
    }
    let found = crate::topology::net_interfaces()
        .into_iter()
        .filter(|i| i.up && !i.loopback)
        .flat_map(|i| i.addrs.into_iter().map(|a| a.ip))
        .find(|a| match a {
            IpAddr::V4(_) => !cfg.use_ipv6,
            IpAddr::V6(v6) => cfg.use_ipv6 && (v6.segments()[0] & 0xffc0) != 0xfe80,
        });
    match found {
        Some(a) => a.to_string(),
        None => {
            warn!("no interface other than loopback is up; advertising 127.0.0.1");
            "127.0.0.1".into()
        }
    }
}

/// Binds the handshake listener as Mooncake does: a random free port in
/// `MC_MIN_RPC_PORT..=MC_MAX_RPC_PORT` (or the name's port with
/// `MC_LEGACY_RPC_PORT_BINDING`), on every interface, or on `loopback`
/// only when the engine is confined to it.
pub(super) fn bind_rpc(
    conn: &MetadataConn,
    local_name: &str,
    loopback: Option<IpAddr>,
    cfg: &Config,
) -> Result<RpcBinding> {
    let (host, port) = parse_host_port(local_name, cfg.handshake_port);
    // An IPv6 name needs a dual-stack listener even without MC_USE_IPV6.
    let ipv6 = cfg.use_ipv6 || host.parse::<Ipv6Addr>().is_ok();
    let any = if ipv6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let ip = loopback.unwrap_or(any);
    let listener = if cfg.legacy_rpc_port_binding {
        TcpListener::bind(SocketAddr::new(ip, port))
    } else {
        crate::rpc::bind_in_range_on(cfg.min_rpc_port, cfg.max_rpc_port, ip)
    }
    .map_err(|e| Error::Socket(format!("no handshake port could be bound on {ip}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Socket(e.to_string()))?
        .port();
    Ok(match conn {
        MetadataConn::P2p => RpcBinding {
            listener,
            name: format!("{}:{bound}", wrap_ipv6(&host)),
            ip: host,
        },
        _ => RpcBinding {
            listener,
            name: local_name.to_string(),
            ip: advertised_ip(cfg, loopback),
        },
    })
}

/// The TCP devices of an engine confined to loopback address `ip`: the
/// loopback interface holding it, with `ip` as the address lanes bind to.
pub(super) fn loopback_devices(nics: &[NetInterface], ip: IpAddr) -> Vec<TcpDevice> {
    nics.iter()
        .filter(|n| n.loopback)
        .find_map(|n| {
            let a = n
                .addrs
                .iter()
                .find(|a| a.ip.is_ipv4() == ip.is_ipv4() && a.same_subnet(ip))?;
            Some(TcpDevice {
                name: n.name.clone(),
                addr: IfAddr {
                    ip,
                    prefix_len: a.prefix_len,
                },
            })
        })
        .into_iter()
        .collect()
}

impl Engine {
    fn cluster(&self) -> Option<&str> {
        self.config.metadata_cluster_id.as_deref()
    }

    /// Options of this engine's handshake calls: cancelled when it is
    /// destroyed.
    fn rpc_options(&self) -> ClientOptions {
        ClientOptions {
            cancel: Some(self.cancel.clone()),
            ..ClientOptions::from_config(self.config)
        }
    }

    /// Options of a call whose reply the peer sends at once (a
    /// notification, a probe): the reply is waited for at most
    /// `MC_HANDSHAKE_IO_TIMEOUT`, the peer's own bound on answering.
    fn short_call_options(&self) -> ClientOptions {
        ClientOptions {
            io_timeout: std::time::Duration::from_secs(self.config.handshake_io_timeout_secs),
            ..self.rpc_options()
        }
    }

    /// Publishes `rpc_meta/<name>` (store mode).
    pub(super) fn publish_rpc_meta(&self) -> Result<()> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let meta = RpcMeta {
            ip_or_host_name: self.rpc_ip.clone(),
            rpc_port: self.rpc.port(),
        };
        store
            .set(
                &rpc_meta_key(self.cluster(), &self.local_name),
                &meta.to_json(),
            )
            .map_err(|e| {
                Error::Metadata(format!(
                    "publishing the RPC address to {}: {e}",
                    store.describe()
                ))
            })
    }

    /// This engine's descriptor, once a transport is installed, as
    /// Mooncake writes it for the protocol (spec §2.2). `generation` (a
    /// field Mooncake peers ignore) changes whenever this process restarts
    /// or its buffers change.
    fn local_desc(&self, revision: u64) -> Option<SegmentDesc> {
        let installed = self.sched.get()?;
        let memory = sync::read(&self.memory);
        let mut extra: serde_json::Map<String, serde_json::Value> = [(
            GENERATION_KEY.to_string(),
            format!("{:016x}-{revision}", self.boot_id).into(),
        )]
        .into_iter()
        .collect();
        let mut desc = SegmentDesc {
            name: self.local_name.clone(),
            protocol: installed.protocol().into(),
            timestamp: now_timestamp(),
            ..Default::default()
        };
        match installed {
            Installed::Tcp(sched) => {
                let tcp = sched.carrier();
                desc.tcp_data_port = tcp.data_port();
                desc.tcp_proto_version = 2;
                desc.buffers = memory
                    .regions()
                    .filter(|r| r.remote_accessible)
                    .map(|r| BufferDesc {
                        name: self.local_name.clone(),
                        addr: r.addr,
                        length: r.length,
                        ..Default::default()
                    })
                    .collect();
                extra.insert(
                    TCP_DEVICES_KEY.to_string(),
                    tcp.tcp_devices().iter().map(TcpDevice::to_json).collect(),
                );
            }
            #[cfg(feature = "rdma")]
            Installed::Rdma(sched) => {
                let rdma = sched.carrier().transport();
                desc.tcp_data_port = 0;
                desc.tcp_proto_version = 1;
                desc.devices = rdma
                    .devices()
                    .into_iter()
                    .map(|d| crate::metadata::descriptor::DeviceDesc {
                        name: d.name,
                        lid: d.lid,
                        gid: d.gid,
                    })
                    .collect();
                desc.priority_matrix = Some(sched.matrix().to_json());
                desc.buffers = memory
                    .regions()
                    .filter_map(|r| {
                        let keys = rdma.keys(r.addr)?;
                        Some(BufferDesc {
                            name: r.location.to_string(),
                            addr: r.addr,
                            length: r.length,
                            lkey: keys.lkey,
                            rkey: keys.rkey,
                        })
                    })
                    .collect();
            }
        }
        desc.extra = extra;
        Some(desc)
    }

    /// Serves the current descriptor to peers and writes it to the store.
    pub(super) fn publish_local_desc(&self) -> Result<()> {
        let revision = self.revision.fetch_add(1, Ordering::AcqRel) + 1;
        let Some(desc) = self.local_desc(revision) else {
            return Ok(());
        };
        let json = desc.to_json();
        self.control.set_local_desc(json.clone());
        self.store_local_desc(&json)
    }

    /// Writes our descriptor to the store; a failure is remembered so the
    /// keeper writes the current one once the store answers again.
    fn store_local_desc(&self, json: &serde_json::Value) -> Result<()> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        self.publish_pending.store(true, Ordering::Release);
        store
            .set(&segment_key(self.cluster(), &self.local_name), json)
            .map_err(|e| {
                Error::Metadata(format!(
                    "publishing the segment to {}: {e}",
                    store.describe()
                ))
            })?;
        self.publish_pending.store(false, Ordering::Release);
        Ok(())
    }

    /// Republishes this engine's entries if a write to the store failed or
    /// the store lost them (a restart without persistence), so peers see
    /// the current descriptor and new peers can find this engine.
    pub(super) fn ensure_published(&self) {
        let Some(store) = &self.store else {
            return;
        };
        // Not while a registration publishes (it would be overwritten with
        // what is served now, which may be older); the next check comes
        // soon.
        let _change = match self.changes.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let desc = self.control.local_desc();
        let mut lost = self.publish_pending.load(Ordering::Acquire);
        if lost {
            info!("retrying the publication that {} missed", store.describe());
        } else {
            let mut keys = vec![rpc_meta_key(self.cluster(), &self.local_name)];
            if desc.is_some() {
                keys.push(segment_key(self.cluster(), &self.local_name));
            }
            for key in &keys {
                match store.get(key) {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        warn!("{} lost {key}; republishing this engine", store.describe());
                        lost = true;
                        break;
                    }
                    Err(e) => {
                        debug!("checking {key} in {}: {e}", store.describe());
                        return;
                    }
                }
            }
        }
        if !lost {
            return;
        }
        let republished = self
            .publish_rpc_meta()
            .and_then(|()| desc.as_ref().map_or(Ok(()), |d| self.store_local_desc(d)));
        if let Err(e) = republished {
            debug!("republishing to {}: {e}", store.describe());
        }
    }

    /// Removes this engine's entries from the store; `quiet` logs failures
    /// only at debug level (an engine whose creation failed).
    pub(super) fn unpublish(&self, quiet: bool) {
        let Some(store) = &self.store else {
            return;
        };
        let mut keys = vec![rpc_meta_key(self.cluster(), &self.local_name)];
        if self.sched.get().is_some() {
            keys.push(segment_key(self.cluster(), &self.local_name));
        }
        for key in keys {
            match store.remove(&key) {
                Err(e) if quiet => debug!("removing {key} from {}: {e}", store.describe()),
                Err(e) => warn!("removing {key} from {}: {e}", store.describe()),
                Ok(()) => {}
            }
        }
    }

    /// Where the handshake listener of segment `name` is.
    fn rpc_address(&self, name: &str) -> Result<(String, u16)> {
        if name == self.local_name {
            return Ok((self.rpc_ip.clone(), self.rpc.port()));
        }
        match &self.store {
            None => Ok(parse_host_port(name, self.config.handshake_port)),
            Some(store) => {
                let key = rpc_meta_key(self.cluster(), name);
                let v = store.get(&key)?.ok_or_else(|| {
                    Error::Metadata(format!("{} has no entry {key}", store.describe()))
                })?;
                let meta = RpcMeta::from_json(&v)?;
                Ok((meta.ip_or_host_name, meta.rpc_port))
            }
        }
    }

    /// Fetches and validates the descriptor of segment `name`.
    fn fetch_segment(&self, name: &str) -> Result<RemoteSegment> {
        self.fetch_segment_with(name, &self.rpc_options())
    }

    /// [`Engine::fetch_segment`] with the handshake RPC options `rpc`.
    fn fetch_segment_with(&self, name: &str, rpc: &ClientOptions) -> Result<RemoteSegment> {
        let (json, (data_host, rpc_port)) = match &self.store {
            None => {
                let (host, port) = parse_host_port(name, self.config.handshake_port);
                let mine = self.control.local_desc().unwrap_or(serde_json::Value::Null);
                let reply = crate::rpc::call(&host, port, FrameKind::Metadata, &mine, rpc)?;
                (reply, (host, port))
            }
            Some(store) => {
                let key = segment_key(self.cluster(), name);
                let v = store.get(&key)?.ok_or_else(|| {
                    Error::Metadata(format!("{} has no segment {key}", store.describe()))
                })?;
                (v, self.rpc_address(name)?)
            }
        };
        if json.is_null() {
            return Err(Error::Metadata(format!(
                "segment {name:?} has no descriptor yet (no transport installed there)"
            )));
        }
        check_peer_bounds(name, &json, self.config)?;
        let desc = SegmentDesc::from_json(&json)?;
        Ok(RemoteSegment {
            name: name.to_string(),
            desc,
            data_host,
            rpc_port,
            ..Default::default()
        })
    }

    /// What the RDMA peer whose NIC paths name `server` publishes: the
    /// host of its handshake listener and its devices. From the cached
    /// descriptor of a segment this engine opened under that name (or
    /// whose `rdma_server_name` it is) unless `fresh`, else fetched with
    /// `rpc` (P2P) or from the store. The own name is answered locally.
    #[cfg(feature = "rdma")]
    pub(super) fn rdma_peer(
        &self,
        server: &str,
        fresh: bool,
        rpc: &ClientOptions,
    ) -> Result<crate::transport::rdma::PeerRecord> {
        let record = |host: &str, desc: &SegmentDesc| crate::transport::rdma::PeerRecord {
            rpc_host: host.to_string(),
            devices: desc
                .devices
                .iter()
                .map(|d| (d.name.clone(), d.gid.clone()))
                .collect(),
        };
        if self.is_own_name(server) {
            let desc = self
                .control
                .local_desc()
                .ok_or_else(|| Error::Metadata("no descriptor published yet".into()))?;
            return Ok(record(&self.rpc_ip, &SegmentDesc::from_json(&desc)?));
        }
        if !fresh {
            let segment = |name: &str| {
                self.segments
                    .id_of(name)
                    .and_then(|id| self.segments.get(id))
            };
            let cached = segment(server).or_else(|| {
                self.segments
                    .names()
                    .iter()
                    .filter_map(|n| segment(n))
                    .find(|s| s.desc.rdma_server_name.as_deref() == Some(server))
            });
            if let Some(seg) = cached {
                return Ok(record(&seg.data_host, &seg.desc));
            }
        }
        let seg = self.fetch_segment_with(server, rpc)?;
        Ok(record(&seg.data_host, &seg.desc))
    }

    /// Resolves a segment name to its id: the own name is `LOCAL_SEGMENT`;
    /// other names are fetched once and cached.
    pub fn open_segment(&self, name: &str) -> Result<i32> {
        let name = name.trim_start_matches('/');
        if name.is_empty() {
            return Err(Error::InvalidArgument("segment name is empty".into()));
        }
        if self.is_own_name(name) {
            return Ok(LOCAL_SEGMENT_ID);
        }
        if let Some(id) = self.segments.id_of(name) {
            return Ok(id);
        }
        let seg = self.fetch_segment(name)?;
        info!(
            "opened segment {name:?} ({}, {} buffers, {})",
            seg.desc.protocol,
            seg.desc.buffers.len(),
            match seg.desc.protocol.as_str() {
                "tcp" => format!("data port {}", seg.desc.tcp_data_port),
                _ => format!(
                    "devices {:?}",
                    seg.desc.devices.iter().map(|d| &d.name).collect::<Vec<_>>()
                ),
            }
        );
        Ok(self.segments.insert(seg))
    }

    /// The buffers of an open segment: this engine's registered buffers for
    /// `LOCAL_SEGMENT`, else those of the segment's descriptor.
    pub fn segment_buffers(&self, id: i32) -> Result<Vec<SegmentBuffer>> {
        if id == LOCAL_SEGMENT_ID {
            let memory = sync::read(&self.memory);
            return Ok(memory
                .regions()
                .map(|r| SegmentBuffer {
                    addr: r.addr,
                    length: r.length,
                    location: r.location.to_string(),
                })
                .collect());
        }
        self.segments
            .get(id)
            .map(|seg| seg.buffers())
            .ok_or_else(|| Error::InvalidArgument(format!("segment id {id} is not open")))
    }

    /// Refetches the descriptor of `name` if it is cached.
    /// A descriptor that changed (new buffers, a restarted owner: a new
    /// generation) replaces the cached one, so stale buffers are never used;
    /// an unchanged one keeps its rails.
    pub fn sync_segment(&self, name: &str) {
        let name = name.trim_start_matches('/');
        let Some(id) = self.segments.id_of(name) else {
            return;
        };
        match self.fetch_segment(name) {
            Ok(seg) => match self.segments.get(id) {
                Some(old)
                    if old.desc.same_content(&seg.desc)
                        && old.data_host == seg.data_host
                        && old.rpc_port == seg.rpc_port =>
                {
                    old.freshness.refreshed();
                }
                _ => {
                    info!("segment {name:?} changed; using its new descriptor");
                    self.segments.insert(seg);
                }
            },
            Err(e) => crate::warn_limited!("refreshing segment {name:?}: {e}"),
        }
    }

    /// Refetches every cached remote descriptor.
    pub fn sync_all_segments(&self) {
        for name in self.segments.names() {
            self.sync_segment(&name);
        }
    }

    /// Drops `name` from the descriptor cache.
    pub fn remove_segment(&self, name: &str) -> Result<()> {
        let name = name.trim_start_matches('/');
        if name.is_empty() {
            return Err(Error::InvalidArgument("segment name is empty".into()));
        }
        self.segments.remove(name);
        Ok(())
    }

    /// Asks the handshake listener of segment `name` whether it is alive
    /// (Mooncake's `sendProbe`): its address comes from the name in P2P
    /// mode, from its `rpc_meta` entry with a store.
    pub fn send_probe(&self, name: &str) -> Result<()> {
        let name = name.trim_start_matches('/');
        if name.is_empty() {
            return Err(Error::InvalidArgument("segment name is empty".into()));
        }
        let (host, port) = self.rpc_address(name)?;
        crate::rpc::call(
            &host,
            port,
            FrameKind::Probe,
            &json!({}),
            &self.short_call_options(),
        )
        .map(|_| ())
    }

    /// The name of segment `target_id` (this engine's for
    /// `LOCAL_SEGMENT`).
    fn segment_name(&self, target_id: u64) -> Result<String> {
        match i32::try_from(target_id) {
            Ok(LOCAL_SEGMENT_ID) => Some(self.local_name.clone()),
            Ok(id) => self.segments.get(id).map(|s| s.name.clone()),
            Err(_) => None,
        }
        .ok_or_else(|| Error::Metadata(format!("segment id {target_id} is not open")))
    }

    /// Sends a notification now to the owner of segment `target_id` and
    /// waits for its answer (at most `MC_HANDSHAKE_CONNECT_TIMEOUT` plus
    /// `MC_HANDSHAKE_IO_TIMEOUT`).
    pub fn send_notify(&self, target_id: u64, name: &str, msg: &str) -> Result<()> {
        self.notify_segment(&self.segment_name(target_id)?, name, msg)
    }

    /// Hands the notification of completed batch `batch_id` to the
    /// background, which sends it to the owner of its segment; a failure is
    /// logged.
    pub(super) fn notify_later(&self, batch_id: u64, n: PendingNotify) {
        let segment = match self.segment_name(n.target_id as u64) {
            Ok(s) => s,
            Err(e) => {
                return crate::warn_limited!(
                    "notification after batch {batch_id:#x} could not be sent: {e}"
                );
            }
        };
        let to = segment.clone();
        let job: Job = Box::new(move |e: &Engine| {
            if let Err(err) = e.notify_segment(&to, &n.name, &n.msg) {
                crate::warn_limited!(
                    "notification after batch {batch_id:#x} to {to:?} could not be sent: {err}"
                );
            }
        });
        if let Err(why) = self.work.submit(&segment, job, Finish::Flush) {
            crate::warn_limited!(
                "notification after batch {batch_id:#x} to {segment:?} dropped: {}",
                refused(why)
            );
        }
    }

    /// Sends a notification to the owner of segment `segment`.
    fn notify_segment(&self, segment: &str, name: &str, msg: &str) -> Result<()> {
        let (host, port) = self.rpc_address(segment)?;
        let reply = crate::rpc::call(
            &host,
            port,
            FrameKind::Notify,
            &json!({"name": name, "notify_msg": msg}),
            &self.short_call_options(),
        )?;
        if reply.get("notify_msg").is_none() {
            return Err(Error::Metadata(format!(
                "{segment:?} answered the notification with {reply}"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(bind: Option<&str>) -> Config {
        Config {
            tcp_bind_address: bind.map(str::to_string),
            ..Config::default()
        }
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn loopback_names_and_bind_addresses_confine_the_engine() {
        let none = cfg(None);
        assert_eq!(loopback_ip("127.0.0.1", &none), ip("127.0.0.1"));
        assert_eq!(loopback_ip("127.0.0.5:12345", &none), ip("127.0.0.5"));
        assert_eq!(loopback_ip("[::1]:15000", &none), ip("::1"));
        assert_eq!(loopback_ip("::1", &none), ip("::1"));
        assert_eq!(loopback_ip("LocalHost:80", &none), ip("127.0.0.1"));
        assert_eq!(loopback_ip("10.0.0.1", &none), None);
        assert_eq!(loopback_ip("node-a", &none), None);
        assert_eq!(
            loopback_ip("node-a", &cfg(Some("127.0.0.1"))),
            ip("127.0.0.1")
        );
        assert_eq!(loopback_ip("node-a", &cfg(Some("10.0.0.1"))), None);
        assert_eq!(advertised_ip(&none, ip("127.0.0.1")), "127.0.0.1");
    }

    #[test]
    fn loopback_devices_are_the_loopback_interface() {
        let nic = |name: &str, loopback: bool, addrs: &[(&str, u8)]| NetInterface {
            name: name.into(),
            numa_node: None,
            pci_bus_id: None,
            addrs: addrs
                .iter()
                .map(|(a, p)| IfAddr {
                    ip: a.parse().unwrap(),
                    prefix_len: *p,
                })
                .collect(),
            speed_mbps: None,
            up: true,
            loopback,
        };
        let nics = [
            nic("eth0", false, &[("10.0.0.1", 24)]),
            nic("lo", true, &[("127.0.0.1", 8), ("::1", 128)]),
        ];
        let devs = loopback_devices(&nics, "127.0.0.7".parse().unwrap());
        assert_eq!(devs.len(), 1);
        assert_eq!(devs[0].name, "lo");
        assert_eq!(
            devs[0].addr,
            IfAddr {
                ip: "127.0.0.7".parse().unwrap(),
                prefix_len: 8
            }
        );
        let v6 = loopback_devices(&nics, "::1".parse().unwrap());
        assert_eq!((v6[0].name.as_str(), v6[0].addr.prefix_len), ("lo", 128));
        assert!(loopback_devices(&nics[..1], "127.0.0.1".parse().unwrap()).is_empty());
    }
}
