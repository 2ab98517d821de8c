//! Machine topology: NUMA nodes, NICs, RDMA devices, GPUs, and the priority matrix.
//!
//! [`Topology::discover`] reads the machine through hwloc (feature `hwloc`)
//! and sysfs, and lists RDMA devices through libibverbs (feature `rdma`).
//! [`PriorityMatrix`] is Mooncake's NIC priority matrix: the JSON the RDMA
//! transport publishes and selects devices with. [`show_links`] renders both
//! as the `showLinks` report.
//!
//! Discovery never fails: a source that is missing or broken (no hwloc, no
//! InfiniBand support in the kernel, an unreadable sysfs file) leaves its
//! facts unknown and says so in the log.

mod cuda;
#[cfg(feature = "hwloc")]
mod hwloc;
mod links;
mod matrix;
mod rails;
#[cfg(feature = "rdma")]
mod rdma;
mod sysfs;

pub use links::show_links;
pub use matrix::PriorityMatrix;
pub use rails::{RailFilter, parse_rail, rail_name};

use std::net::IpAddr;

use crate::settings::{List, SetText, Text};

crate::settings::settings! {
    /// Which devices are used, and the priority matrix. Parsed from `MC_*`
    /// variables by `Config::from_env`; the defaults are
    /// Mooncake's.
    #[derive(Debug, Clone, PartialEq)]
    pub struct TopologyConfig("topology") {
        /// `MC_CUSTOM_TOPO_JSON`: path of a priority-matrix file.
        custom_topo_json: Option<String> = None, ["MC_CUSTOM_TOPO_JSON"], Text,
            "path of a NIC priority-matrix file (`{\"cpu:0\": [[preferred], [available]]}`)";
        /// `MC_TE_FILTERS`: comma list of devices to use.
        filters: Vec<String> = Vec::new(), ["MC_TE_FILTERS"], List,
            "devices to use (`mlx5_0`, `mlx5_0:2`, `eth0`)";
        /// `CUDA_VISIBLE_DEVICES`, if set (empty: no GPU is visible): the GPUs
        /// `cuda:N` numbers, as the CUDA runtime does.
        cuda_visible_devices: Option<String> = None, ["CUDA_VISIBLE_DEVICES"], SetText,
            "the GPUs `cuda:N` numbers, as the CUDA runtime does: indexes or UUIDs \
             (`GPU-…`); empty: none ([rdma.md](rdma.md))";
        /// `CUDA_DEVICE_ORDER`, if set: the order of that numbering.
        cuda_device_order: Option<String> = None, ["CUDA_DEVICE_ORDER"], SetText,
            "`PCI_BUS_ID` or `FASTEST_FIRST` (the CUDA runtime's default): the order of that \
             numbering";
    };
}

/// What this process can see of the machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// NUMA node ids, ascending (at least one: a machine without NUMA
    /// information is reported as node 0).
    pub numa_nodes: Vec<u32>,
    /// RDMA rails (one per active port of an HCA) that passed the filters.
    pub rdma_devices: Vec<RdmaDevice>,
    /// Network interfaces of the process's network namespace, by ifindex.
    pub net_interfaces: Vec<NetInterface>,
    /// The GPUs CUDA shows this process, with their CUDA index.
    pub gpus: Vec<Gpu>,
}

/// One RDMA rail: a port of an RDMA device (an HCA as libibverbs names
/// it, e.g. `mlx5_0`); see [`rail_name`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaDevice {
    /// The rail's name: the verbs device name for port `MC_IB_PORT`,
    /// `<device>:<port>` for another port of a multi-port HCA.
    pub name: String,
    /// The verbs device name.
    pub device: String,
    /// The port.
    pub port: u8,
    /// NUMA node of its PCI function, if known.
    pub numa_node: Option<u32>,
    /// PCI address `dddd:bb:dd.f`, if the device sits on PCI.
    pub pci_bus_id: Option<String>,
    /// Whether the port is ACTIVE with a GID table (a device without an
    /// active port is listed once, with this false, for reports).
    pub ports_active: bool,
}

/// One network interface (kernel netdev).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetInterface {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// NUMA node of its PCI function, if known.
    pub numa_node: Option<u32>,
    /// PCI address `dddd:bb:dd.f`, if the interface sits on PCI.
    pub pci_bus_id: Option<String>,
    /// IPv4 and IPv6 addresses assigned to it, with their prefix lengths.
    pub addrs: Vec<IfAddr>,
    /// Link speed in Mb/s as the driver reports it, if it does.
    pub speed_mbps: Option<u32>,
    /// Operationally up (carrier and administratively up).
    pub up: bool,
    /// The loopback interface.
    pub loopback: bool,
}

/// An interface address and the length of its network prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfAddr {
    /// The address.
    pub ip: IpAddr,
    /// Prefix length of its subnet (e.g. 24 for a /24).
    pub prefix_len: u8,
}

impl IfAddr {
    /// Whether `other` lies in this address's subnet.
    pub fn same_subnet(&self, other: IpAddr) -> bool {
        fn prefix_match(a: &[u8], b: &[u8], bits: u8) -> bool {
            let bits = usize::from(bits).min(a.len() * 8);
            let (full, rest) = (bits / 8, bits % 8);
            a[..full] == b[..full]
                && (rest == 0 || (a[full] ^ b[full]) & (0xffu8 << (8 - rest)) == 0)
        }
        match (self.ip, other) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                prefix_match(&a.octets(), &b.octets(), self.prefix_len)
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                prefix_match(&a.octets(), &b.octets(), self.prefix_len)
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for IfAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ip, self.prefix_len)
    }
}

/// One GPU, indexed as CUDA indexes it (`cuda:<index>`, following
/// `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// CUDA device index.
    pub index: u32,
    /// Name as discovered (`cuda0`, `nvml0`, or the PCI address).
    pub name: String,
    /// NUMA node of its PCI function, if known.
    pub numa_node: Option<u32>,
    /// PCI address `dddd:bb:dd.f`.
    pub pci_bus_id: Option<String>,
}

/// Facts a platform source (hwloc or sysfs) reports about one I/O device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Locality {
    numa_node: Option<u32>,
    pci_bus_id: Option<String>,
}

impl Topology {
    /// Discovers the machine. `filters` (an engine's device filter) and
    /// `config.filters` (`MC_TE_FILTERS`), when non-empty, each restrict the
    /// RDMA rails to those they name ([`RailFilter`]); `ib_port` is
    /// `MC_IB_PORT`, the port whose rail has the plain device name; GPUs
    /// are numbered as `config`'s CUDA variables say.
    ///
    /// Never fails: with no RDMA support the device list is empty, and if
    /// hwloc fails the facts come from sysfs (with a warning).
    pub fn discover(filters: &[String], config: &TopologyConfig, ib_port: u8) -> Topology {
        let te_filters = &config.filters;
        #[cfg(feature = "hwloc")]
        let hw = match hwloc::discover() {
            Ok(facts) => Some(facts),
            Err(e) => {
                tracing::warn!("hwloc topology discovery failed ({e}); using sysfs only");
                None
            }
        };

        let mut numa_nodes = Vec::new();
        #[cfg(feature = "hwloc")]
        if let Some(hw) = &hw {
            numa_nodes.clone_from(&hw.numa_nodes);
        }
        if numa_nodes.is_empty() {
            numa_nodes = sysfs::numa_nodes();
        }
        if numa_nodes.is_empty() {
            tracing::debug!("no NUMA information; assuming a single node 0");
            numa_nodes.push(0);
        }

        let wanted = RailFilter::new(filters, te_filters, ib_port);

        #[cfg(feature = "rdma")]
        let mut rdma_devices = rdma::list_devices(&wanted);
        #[cfg(not(feature = "rdma"))]
        let mut rdma_devices = sysfs::rdma_devices(&wanted);

        let mut net_interfaces = sysfs::net_interfaces();
        let mut gpus: Vec<Gpu> = Vec::new();

        for dev in &mut rdma_devices {
            let loc = sysfs::rdma_locality(&dev.device);
            merge_known(&mut dev.numa_node, &mut dev.pci_bus_id, &loc);
        }
        // hwloc's view wins where it has one; sysfs fills the rest.
        #[cfg(feature = "hwloc")]
        if let Some(hw) = &hw {
            for dev in &mut rdma_devices {
                if let Some(loc) = hw.openfabrics.get(&dev.device) {
                    merge_known(&mut dev.numa_node, &mut dev.pci_bus_id, loc);
                }
            }
            for nic in &mut net_interfaces {
                if let Some(loc) = hw.network.get(&nic.name) {
                    merge_known(&mut nic.numa_node, &mut nic.pci_bus_id, loc);
                }
            }
            gpus.clone_from(&hw.gpus);
        }
        // hwloc's CUDA devices are the runtime's own numbering; NVML's and
        // sysfs's GPUs are in PCI bus order: number them as CUDA would.
        let from_cuda_runtime = gpus.first().is_some_and(|g| g.name.starts_with("cuda"));
        if gpus.is_empty() {
            gpus = sysfs::nvidia_gpus();
        }
        if !from_cuda_runtime {
            gpus = cuda::cuda_numbering(gpus, &cuda::CudaEnv::of(config), &cuda::SystemFacts);
        }

        // On a single-node machine every device is local to that node, even
        // when the firmware leaves the PCI NUMA affinity at -1.
        if let [only] = numa_nodes[..] {
            for n in rdma_devices.iter_mut().map(|d| &mut d.numa_node) {
                n.get_or_insert(only);
            }
            for n in net_interfaces.iter_mut().map(|d| &mut d.numa_node) {
                n.get_or_insert(only);
            }
            for n in gpus.iter_mut().map(|d| &mut d.numa_node) {
                n.get_or_insert(only);
            }
        }

        let topology = Topology {
            numa_nodes,
            rdma_devices,
            net_interfaces,
            gpus,
        };
        tracing::debug!(?topology, "topology discovered");
        topology
    }
}

/// The network interfaces with their addresses, state and speed, read from
/// sysfs and `getifaddrs` only (cheaper than a full [`Topology::discover`];
/// NUMA placement may be unknown).
pub fn net_interfaces() -> Vec<NetInterface> {
    sysfs::net_interfaces()
}

/// Takes the facts `loc` knows, keeping the current ones where it does not.
/// The NUMA node of RDMA device `name` as sysfs tells it (its PCI
/// function's), if known.
pub fn rdma_numa_node(name: &str) -> Option<u32> {
    sysfs::rdma_locality(name).numa_node
}

fn merge_known(numa: &mut Option<u32>, pci: &mut Option<String>, loc: &Locality) {
    if loc.numa_node.is_some() {
        *numa = loc.numa_node;
    }
    if loc.pci_bus_id.is_some() {
        pci.clone_from(&loc.pci_bus_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets() {
        let a = IfAddr {
            ip: "10.1.2.3".parse().unwrap(),
            prefix_len: 24,
        };
        assert!(a.same_subnet("10.1.2.200".parse().unwrap()));
        assert!(!a.same_subnet("10.1.3.1".parse().unwrap()));
        assert!(!a.same_subnet("::1".parse().unwrap()));
        let b = IfAddr {
            ip: "10.1.2.3".parse().unwrap(),
            prefix_len: 20,
        };
        assert!(b.same_subnet("10.1.15.9".parse().unwrap()));
        assert!(!b.same_subnet("10.1.16.9".parse().unwrap()));
        let v6 = IfAddr {
            ip: "fd00:1::1".parse().unwrap(),
            prefix_len: 64,
        };
        assert!(v6.same_subnet("fd00:1::abcd".parse().unwrap()));
        assert!(!v6.same_subnet("fd00:2::1".parse().unwrap()));
        assert_eq!(a.to_string(), "10.1.2.3/24");
    }

    #[test]
    fn discover_on_this_machine() {
        let t = Topology::discover(&[], &TopologyConfig::default(), 1);
        assert!(!t.numa_nodes.is_empty(), "{t:?}");
        assert!(t.numa_nodes.windows(2).all(|w| w[0] < w[1]), "{t:?}");
        // The test machines have no RDMA hardware.
        assert!(t.rdma_devices.is_empty(), "{t:?}");
        let lo = t.net_interfaces.iter().find(|n| n.loopback);
        let lo = lo.unwrap_or_else(|| panic!("no loopback interface in {t:?}"));
        assert!(lo.addrs.iter().any(|a| a.ip.is_loopback()), "{lo:?}");
        assert!(lo.up, "{lo:?}");
    }

    #[test]
    fn discover_with_te_filters_still_succeeds() {
        let t = Topology::discover(
            &[],
            &TopologyConfig {
                filters: vec!["erdma_0".to_string()],
                ..TopologyConfig::default()
            },
            1,
        );
        assert!(t.rdma_devices.iter().all(|d| d.name == "erdma_0"));
        let t = Topology::discover(&["mlx5_9".to_string()], &TopologyConfig::default(), 1);
        assert!(t.rdma_devices.iter().all(|d| d.name == "mlx5_9"));
    }

    #[test]
    fn discovered_topology_round_trips_as_matrix() {
        let t = Topology::discover(&[], &TopologyConfig::default(), 1);
        let m = PriorityMatrix::from_topology(&t);
        for node in &t.numa_nodes {
            assert!(m.entry(&format!("cpu:{node}")).is_some(), "{m:?}");
        }
        let text = m.to_json().to_string();
        let again = PriorityMatrix::parse(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(again.to_json().to_string(), text);
        assert_eq!(again.devices(), m.devices());
    }
}
