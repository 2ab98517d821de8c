//! How this engine presents itself: its handshake listener's address and
//! name, and the descriptor it serves and writes to the store (built from
//! its registered memory and what each installed transport publishes).

use super::Engine;
use crate::engine::config::Config;
use crate::error::{Error, Result};
use crate::metadata::conn::MetadataConn;
use crate::metadata::descriptor::{BufferDesc, SegmentDesc, now_timestamp};
use crate::metadata::keys::{RpcMeta, rpc_meta_key, segment_key};
use crate::peer_jobs::Finish;
use crate::rpc::{parse_host_port, server_name};
use crate::sync;
use crate::transport::scheduler::GENERATION_KEY;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tracing::{debug, info, warn};

/// The background lane of republishing (no peer name: a name has no NUL).
const REPUBLISH_LANE: &str = "\0republish";

/// A random number per engine, so a restarted process publishes a new
/// descriptor generation even with the same buffers.
/// The engine's incarnation as its descriptor's generation starts with it
/// (`<instance>-<revision>`), and as notifications address it
/// ([`super::control::INSTANCE_FIELD`]).
pub(super) fn instance_of(boot_id: u64) -> String {
    format!("{boot_id:016x}")
}

/// The instance of a peer, from the generation of its descriptor (ours
/// publish one; Mooncake's do not).
pub(super) fn instance_in(desc: &crate::metadata::descriptor::SegmentDesc) -> Option<String> {
    let generation = desc.extra.get(GENERATION_KEY)?.as_str()?;
    generation.split_once('-').map(|(i, _)| i.to_string())
}

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
            return Some(if cfg.rpc.use_ipv6 {
                Ipv6Addr::LOCALHOST.into()
            } else {
                Ipv4Addr::LOCALHOST.into()
            });
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<IpAddr>().ok().filter(IpAddr::is_loopback)
    };
    let (host, _) = parse_host_port(local_name, cfg.rpc.handshake_port);
    loopback(&host).or_else(|| cfg.rpc.bind_address.as_deref().and_then(loopback))
}

/// The address advertised in store mode: the loopback address of an engine
/// confined to it, else `MC_TCP_BIND_ADDRESS`, else the first address of an
/// interface that is up and not loopback (IPv6 only with `MC_USE_IPV6`),
/// else loopback.
fn advertised_ip(cfg: &Config, loopback: Option<IpAddr>) -> String {
    if let Some(ip) = loopback {
        return ip.to_string();
    }
    if let Some(a) = &cfg.rpc.bind_address {
        return a.clone();
    }
    let found = crate::topology::net_interfaces()
        .into_iter()
        .filter(|i| i.up && !i.loopback)
        .flat_map(|i| i.addrs.into_iter().map(|a| a.ip))
        .find(|a| match a {
            IpAddr::V4(_) => !cfg.rpc.use_ipv6,
            IpAddr::V6(v6) => cfg.rpc.use_ipv6 && (v6.segments()[0] & 0xffc0) != 0xfe80,
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
    let (host, port) = parse_host_port(local_name, cfg.rpc.handshake_port);
    // An IPv6 name needs a dual-stack listener even without MC_USE_IPV6.
    let ipv6 = cfg.rpc.use_ipv6 || host.parse::<Ipv6Addr>().is_ok();
    let any = if ipv6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let ip = loopback.unwrap_or(any);
    let listener = if cfg.rpc.legacy_port_binding {
        TcpListener::bind(SocketAddr::new(ip, port))
    } else {
        crate::rpc::bind_in_range_on(cfg.rpc.min_port, cfg.rpc.max_port, ip)
    }
    .map_err(|e| Error::Socket(format!("no handshake port could be bound on {ip}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Socket(e.to_string()))?
        .port();
    Ok(match conn {
        MetadataConn::P2p => RpcBinding {
            listener,
            name: server_name(&host, bound),
            ip: host,
        },
        _ => RpcBinding {
            listener,
            name: local_name.to_string(),
            ip: advertised_ip(cfg, loopback),
        },
    })
}

impl Engine {
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
        let transports = self.transports();
        // The protocol Mooncake peers choose their transport by: the most
        // preferred installed one they speak (RDMA, else TCP); what they
        // do not know goes in extra keys they ignore.
        let protocol = transports
            .iter()
            .find(|t| t.kind().names_descriptor)
            .or_else(|| transports.first())
            .map(|t| t.kind().protocol)?;
        let memory = sync::read(&self.memory);
        let mut desc = SegmentDesc {
            name: self.local_name.clone(),
            protocol: protocol.into(),
            tcp_proto_version: 1,
            timestamp: now_timestamp(),
            buffers: memory
                .regions()
                .map(|r| BufferDesc {
                    name: self.local_name.clone(),
                    addr: r.addr,
                    length: r.length,
                    ..Default::default()
                })
                .collect(),
            extra: [(
                GENERATION_KEY.to_string(),
                format!("{}-{revision}", instance_of(self.boot_id)).into(),
            )]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        for t in &transports {
            t.publish(&mut desc, &memory);
        }
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

    /// The callback through which a transport asks for the descriptor to
    /// be published again: it queues one background job (requests made
    /// before that job starts share it), which publishes what the
    /// transports hold then.
    pub(super) fn republisher(&self) -> crate::transport::Republish {
        let me = self.me.get().cloned().unwrap_or_default();
        Arc::new(move || {
            let Some(engine) = me.upgrade() else {
                return;
            };
            if engine.republish_wanted.swap(true, Ordering::AcqRel) {
                return;
            }
            let queued = engine.background(REPUBLISH_LANE, Finish::Refuse, |e| {
                e.republish_wanted.store(false, Ordering::Release);
                e.republish();
            });
            if let Err(why) = queued {
                engine.republish_wanted.store(false, Ordering::Release);
                warn!(
                    "the descriptor could not be published again: {}",
                    super::refused(why)
                );
            }
        })
    }

    /// Publishes the descriptor again once no install, registration or
    /// shutdown is under way (none starts while it publishes); not once
    /// the engine is closed.
    fn republish(&self) {
        let _change = loop {
            match self.changes.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            // Shutdown holds the lock while it drains this job's lane.
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        match self.publish_local_desc() {
            Ok(()) => info!("published the descriptor again (a transport's devices changed)"),
            Err(e) => warn!("publishing the descriptor again failed: {e}; the keeper retries"),
        }
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
        if !self.transports().is_empty() {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(bind: Option<&str>) -> Config {
        let mut c = Config::default();
        c.rpc.bind_address = bind.map(str::to_string);
        c
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
}
