//! The TCP transport as the engine installs it: the scheduler's adapter
//! (a device is a network interface, and a rail pairs a local interface
//! with a peer interface on the same subnet; a peer that publishes no
//! devices, a Mooncake peer, is reached over one unbound rail to its data
//! host), its descriptor keys (`tcp_data_port`, `tcp_proto_version`,
//! `tcp_devices`), and its installation. Slices of GPU memory are staged
//! through host buffers ([`super::staged`]).

use crate::error::{Error, Result};
use crate::memory::MemoryRegistry;
use crate::memory::staging::{self, StagingPool};
use crate::metadata::descriptor::SegmentDesc;
use crate::segment::RemoteSegment;
use crate::topology::{IfAddr, NetInterface, PriorityMatrix};
use crate::transport::scheduler::{Carrier, Rail, Scheduler};
use crate::transport::tcp::staged::{self, STAGING_BUFFERS, STAGING_CHUNK};
use crate::transport::tcp::{LaneTarget, PROTOCOL, TcpTransport};
use crate::transport::{InstallContext, Slice, Transport, TransportBase};
use serde_json::{Value, json};
use std::net::IpAddr;
use std::sync::Arc;
use tracing::{info, warn};

/// Descriptor field listing a host's TCP devices (ignored by Mooncake).
pub const TCP_DEVICES_KEY: &str = "tcp_devices";

/// Device name of the unbound rail.
const DEFAULT_DEVICE: &str = "default";

/// A local network interface used as a TCP device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpDevice {
    /// Interface name.
    pub name: String,
    /// The address lanes bind to.
    pub addr: IfAddr,
}

impl TcpDevice {
    /// The device entry published in our descriptor.
    pub fn to_json(&self) -> Value {
        json!({"name": self.name, "addr": self.addr.ip.to_string(), "prefix_len": self.addr.prefix_len})
    }

    /// Parses one published device; `None` if malformed.
    pub fn from_json(v: &Value) -> Option<TcpDevice> {
        let name = v.get("name")?.as_str()?.to_string();
        let ip: IpAddr = v.get("addr")?.as_str()?.parse().ok()?;
        let prefix_len = u8::try_from(v.get("prefix_len")?.as_u64()?).ok()?;
        (!name.is_empty()).then_some(TcpDevice {
            name,
            addr: IfAddr { ip, prefix_len },
        })
    }
}

/// The usable address of an interface: its first IPv4, else its first
/// IPv6 that is not link-local.
fn device_addr(nic: &NetInterface) -> Option<IfAddr> {
    let v4 = nic.addrs.iter().find(|a| a.ip.is_ipv4());
    let v6 = nic.addrs.iter().find(|a| match a.ip {
        IpAddr::V6(v6) => !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80,
        IpAddr::V4(_) => false,
    });
    v4.or(v6).copied()
}

/// The TCP devices named by `matrix`, with their addresses, in matrix
/// order; names missing here or without an address are skipped (logged).
pub fn tcp_devices(
    matrix: &PriorityMatrix,
    nics: &[NetInterface],
    filters: &[String],
) -> Vec<TcpDevice> {
    let mut out = Vec::new();
    for name in matrix.devices() {
        if !filters.is_empty() && !filters.contains(name) {
            continue;
        }
        match nics.iter().find(|n| &n.name == name).and_then(device_addr) {
            Some(addr) => out.push(TcpDevice {
                name: name.clone(),
                addr,
            }),
            None => warn!("tcp device {name} has no usable address here; not used"),
        }
    }
    out
}

/// The TCP devices of an engine confined to loopback address `ip`: the
/// loopback interface holding it, with `ip` as the address lanes bind to.
pub fn loopback_devices(nics: &[NetInterface], ip: IpAddr) -> Vec<TcpDevice> {
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

/// Starts the TCP transport over the interfaces of the given matrix (or
/// every interface that is up); an engine confined to loopback uses the
/// loopback interface only and binds its data port there.
pub fn install(ctx: &InstallContext<'_>) -> Result<Arc<dyn Transport>> {
    let topo = (ctx.topology)();
    let named = ctx.matrix.is_some();
    let matrix = ctx
        .matrix
        .clone()
        .unwrap_or_else(|| PriorityMatrix::from_topology_tcp(&topo));
    let devices = match ctx.loopback {
        None => tcp_devices(&matrix, &topo.net_interfaces, &ctx.config.topology.filters),
        Some(ip) => {
            if named {
                warn!(
                    "this engine is confined to loopback ({ip}); the priority matrix's devices \
                     are not used"
                );
            }
            loopback_devices(&topo.net_interfaces, ip)
        }
    };
    info!(
        "tcp devices: {:?}",
        devices
            .iter()
            .map(|d| format!("{} {}", d.name, d.addr))
            .collect::<Vec<_>>()
    );
    let (min, max) = (ctx.config.rpc.min_port, ctx.config.rpc.max_port);
    let listener = match ctx.loopback {
        Some(ip) => crate::rpc::bind_in_range_on(min, max, ip),
        None => crate::rpc::bind_in_range(min, max, true)
            .or_else(|_| crate::rpc::bind_in_range(min, max, false)),
    }
    .map_err(|e| Error::Socket(format!("no free tcp data port: {e}")))?;
    let names = [ctx.local_name];
    let tcp = TcpTransport::start(
        listener,
        ctx.memory.clone(),
        ctx.config,
        ctx.auth.as_ref(),
        &names,
    )?;
    let carrier = TcpCarrier::new(Arc::new(tcp), devices, ctx.config.tcp.force_v1);
    Ok(Scheduler::new(carrier, matrix, ctx.config.sched, ctx.kind))
}

/// The TCP transport with its devices.
pub struct TcpCarrier {
    tcp: Arc<TcpTransport>,
    devices: Vec<TcpDevice>,
    names: Vec<String>,
    force_v1: bool,
    /// The host buffers GPU memory is staged through.
    staging: StagingPool,
}

impl TcpCarrier {
    /// The adapter over `tcp` with local `devices`; `force_v1` speaks the
    /// v1 framing to every peer (`MC_TCP_PROTO=1`).
    pub fn new(tcp: Arc<TcpTransport>, devices: Vec<TcpDevice>, force_v1: bool) -> TcpCarrier {
        let names = devices.iter().map(|d| d.name.clone()).collect();
        TcpCarrier {
            tcp,
            devices,
            names,
            force_v1,
            staging: StagingPool::new(STAGING_CHUNK, STAGING_BUFFERS),
        }
    }

    /// The data port peers connect to.
    pub fn data_port(&self) -> u16 {
        self.tcp.data_port()
    }
}

impl TransportBase for TcpCarrier {
    fn speaks(&self, seg: &RemoteSegment) -> bool {
        seg.desc.tcp_data_port != 0
    }

    fn moves_device_memory(&self) -> bool {
        staging::available()
    }

    fn shutdown(&self) {
        self.staging.close();
        self.tcp.shutdown();
    }
}

impl Carrier for TcpCarrier {
    type Target = LaneTarget;

    fn publish(&self, desc: &mut SegmentDesc, memory: &MemoryRegistry, _: &PriorityMatrix) {
        desc.tcp_data_port = self.data_port();
        desc.tcp_proto_version = 2;
        if desc.protocol == PROTOCOL {
            // Mooncake's TCP descriptor lists only the buffers peers may
            // reach.
            desc.buffers.retain(|b| {
                memory
                    .find(b.addr, b.length)
                    .is_some_and(|r| r.remote_accessible)
            });
        }
        desc.extra.insert(
            TCP_DEVICES_KEY.to_string(),
            self.devices.iter().map(TcpDevice::to_json).collect(),
        );
    }

    fn reaches(&self, seg: &RemoteSegment, _buffer: usize) -> bool {
        self.speaks(seg)
    }

    fn devices(&self) -> &[String] {
        &self.names
    }

    fn rails(&self, seg: &RemoteSegment) -> Vec<Rail<LaneTarget>> {
        let port = seg.desc.tcp_data_port;
        let v2 = seg.desc.tcp_proto_version >= 2 && !self.force_v1;
        // One rail per peer address, however often the peer lists it.
        let mut seen = std::collections::HashSet::new();
        let peer: Vec<TcpDevice> = seg
            .desc
            .extra
            .get(TCP_DEVICES_KEY)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(TcpDevice::from_json)
                    .filter(|d| seen.insert(d.addr.ip))
                    .collect()
            })
            .unwrap_or_default();
        let mut rails = Vec::new();
        for (i, local) in self.devices.iter().enumerate() {
            for remote in peer.iter().filter(|r| local.addr.same_subnet(r.addr.ip)) {
                rails.push(Rail {
                    key: format!("{}@{}/{}", local.name, seg.name, remote.name),
                    device: Some(i),
                    peer_device: None,
                    target: LaneTarget {
                        bind: Some(local.addr.ip),
                        host: remote.addr.ip.to_string(),
                        port,
                        v2,
                        name: seg.identity.clone(),
                    },
                });
            }
        }
        if rails.is_empty() {
            rails.push(Rail {
                key: format!("{DEFAULT_DEVICE}@{}", seg.name),
                device: None,
                peer_device: None,
                target: LaneTarget {
                    bind: None,
                    host: seg.data_host.clone(),
                    port,
                    v2,
                    name: seg.identity.clone(),
                },
            });
        }
        rails
    }

    fn endpoint_pool(&self) -> Option<crate::transport::EndpointPool> {
        Some(self.tcp.endpoint_pool())
    }

    fn post(&self, rail: &Rail<LaneTarget>, slice: Slice, _remote_key: u32) {
        let device = rail.device.map(|i| self.names[i].as_str());
        match slice.local_gpu {
            None => self.tcp.post(device, &rail.target, slice),
            Some(gpu) => staged::post(&self.tcp, &self.staging, device, &rail.target, slice, gpu),
        }
    }

    fn probe(&self, rail: &Rail<LaneTarget>, done: Box<dyn FnOnce(bool) + Send>) {
        self.tcp.probe(&rail.target, done);
    }

    fn failure(&self, rail: &Rail<LaneTarget>) -> Option<String> {
        let device = rail.device.map(|i| self.names[i].as_str());
        self.tcp.connect_failure(device, &rail.target)
    }

    fn unbound_rails(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::NetInterface;

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
