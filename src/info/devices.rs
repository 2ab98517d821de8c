//! The devices section of the report: what [`Topology::discover`] found,
//! in a shape that serializes.

use crate::topology::Topology;
use serde::Serialize;

/// NUMA nodes, NICs and GPUs of this machine as the engine sees them.
#[derive(Debug, Clone, Serialize)]
pub struct Devices {
    /// NUMA node ids (at least node 0).
    pub numa_nodes: Vec<u32>,
    /// RDMA rails: one per active port of an HCA, or a device without an
    /// active port listed once (`active` false).
    pub rdma: Vec<RdmaNic>,
    /// Network interfaces of this network namespace.
    pub net: Vec<NetNic>,
    /// GPUs, numbered as CUDA numbers them.
    pub gpus: Vec<GpuDevice>,
}

/// One RDMA rail.
#[derive(Debug, Clone, Serialize)]
pub struct RdmaNic {
    /// The rail's name (`mlx5_0`, `mlx5_0:2`).
    pub name: String,
    /// The verbs device.
    pub device: String,
    /// The port.
    pub port: u8,
    /// Whether the port is ACTIVE with a GID table.
    pub active: bool,
    /// NUMA node, if known.
    pub numa_node: Option<u32>,
    /// PCI address, if on PCI.
    pub pci_bus_id: Option<String>,
}

/// One network interface.
#[derive(Debug, Clone, Serialize)]
pub struct NetNic {
    /// Its name (`eth0`).
    pub name: String,
    /// Operationally up.
    pub up: bool,
    /// Link speed in Mb/s, if the driver reports one.
    pub speed_mbps: Option<u32>,
    /// The loopback interface.
    pub loopback: bool,
    /// Addresses with prefix lengths (`10.0.0.2/24`).
    pub addrs: Vec<String>,
    /// NUMA node, if known.
    pub numa_node: Option<u32>,
    /// PCI address, if on PCI.
    pub pci_bus_id: Option<String>,
}

/// One GPU.
#[derive(Debug, Clone, Serialize)]
pub struct GpuDevice {
    /// CUDA index (`cuda:<index>`).
    pub index: u32,
    /// Name as discovered (`cuda0`, `nvml0`, or the PCI address).
    pub name: String,
    /// NUMA node, if known.
    pub numa_node: Option<u32>,
    /// PCI address.
    pub pci_bus_id: Option<String>,
}

impl Devices {
    /// The devices of `t`.
    pub fn of(t: &Topology) -> Devices {
        Devices {
            numa_nodes: t.numa_nodes.clone(),
            rdma: t
                .rdma_devices
                .iter()
                .map(|d| RdmaNic {
                    name: d.name.clone(),
                    device: d.device.clone(),
                    port: d.port,
                    active: d.ports_active,
                    numa_node: d.numa_node,
                    pci_bus_id: d.pci_bus_id.clone(),
                })
                .collect(),
            net: t
                .net_interfaces
                .iter()
                .map(|n| NetNic {
                    name: n.name.clone(),
                    up: n.up,
                    speed_mbps: n.speed_mbps,
                    loopback: n.loopback,
                    addrs: n.addrs.iter().map(ToString::to_string).collect(),
                    numa_node: n.numa_node,
                    pci_bus_id: n.pci_bus_id.clone(),
                })
                .collect(),
            gpus: t
                .gpus
                .iter()
                .map(|g| GpuDevice {
                    index: g.index,
                    name: g.name.clone(),
                    numa_node: g.numa_node,
                    pci_bus_id: g.pci_bus_id.clone(),
                })
                .collect(),
        }
    }
}
