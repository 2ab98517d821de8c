//! The scheduler's adapter for the TCP transport: a device is a network
//! interface, and a rail pairs a local interface with a peer interface on
//! the same subnet. A peer that publishes no devices (a Mooncake peer) is
//! reached over one unbound rail to its data host.

use crate::segment::RemoteSegment;
use crate::topology::{IfAddr, NetInterface, PriorityMatrix};
use crate::transport::Slice;
use crate::transport::scheduler::{Carrier, Rail};
use crate::transport::tcp::{LaneTarget, TcpTransport};
use serde_json::{Value, json};
use std::net::IpAddr;
use std::sync::Arc;
use tracing::warn;

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

/// The TCP transport with its devices.
pub struct TcpCarrier {
    tcp: Arc<TcpTransport>,
    devices: Vec<TcpDevice>,
    names: Vec<String>,
    force_v1: bool,
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
        }
    }

    /// The local devices, for the published descriptor.
    pub fn tcp_devices(&self) -> &[TcpDevice] {
        &self.devices
    }

    /// The data port peers connect to.
    pub fn data_port(&self) -> u16 {
        self.tcp.data_port()
    }
}

impl Carrier for TcpCarrier {
    type Target = LaneTarget;

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
                },
            });
        }
        rails
    }

    fn post(&self, rail: &Rail<LaneTarget>, slice: Slice, _remote_key: u32) {
        let device = rail.device.map(|i| self.names[i].as_str());
        self.tcp.post(device, &rail.target, slice);
    }

    fn probe(&self, rail: &Rail<LaneTarget>, done: Box<dyn FnOnce(bool) + Send>) {
        self.tcp.probe(&rail.target, done);
    }

    fn unbound_rails(&self) -> bool {
        true
    }

    fn shutdown(&self) {
        self.tcp.shutdown();
    }
}
