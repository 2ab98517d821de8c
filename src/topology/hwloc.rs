//! Topology facts from hwloc (feature `hwloc`): NUMA nodes, and the NUMA
//! locality and PCI address of network, OpenFabrics and GPU OS devices.

use std::collections::HashMap;

use hwlocality::Topology as HwTopology;
use hwlocality::object::TopologyObject;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::{OSDeviceType, ObjectType};
use hwlocality::topology::builder::TypeFilter;

use super::{Gpu, Locality};

/// What hwloc reported.
pub(super) struct HwlocFacts {
    /// OS indexes of the NUMA nodes, ascending.
    pub(super) numa_nodes: Vec<u32>,
    /// Network OS devices (netdev names) on PCI.
    pub(super) network: HashMap<String, Locality>,
    /// OpenFabrics OS devices (verbs device names).
    pub(super) openfabrics: HashMap<String, Locality>,
    /// CUDA devices (`cudaN`, else `nvmlN`).
    pub(super) gpus: Vec<Gpu>,
}

/// hwloc discovery components left out. Discovery reads the machine
/// (sysfs, `/proc`, cpuid) and nothing else: a library inside an inference
/// server must not connect anywhere it was not asked to.
///
/// - `gl` opens X displays `:0` to `:9` to find GPUs driving them (a
///   connect to `/tmp/.X11-unix/X*` and to 127.0.0.1:6000-6009 each);
/// - `opencl`, `rsmi` and `levelzero` start OpenCL, ROCm SMI and oneAPI
///   Level Zero drivers (which may reach their daemons) for devices that
///   are not used here;
/// - `pci` (the libpciaccess plugin) leaks the PCI vendor and device name
///   strings libpciaccess allocates (about 0.6 MB per discovery), and its
///   only extra over the `linux` component, which reads the same PCI
///   devices, addresses and localities from sysfs, is those names.
///
/// The `linux` component keeps the PCI tree and the network, OpenFabrics
/// and NVML/CUDA OS devices the topology needs.
const LEFT_OUT: &[&str] = &["gl", "opencl", "rsmi", "levelzero", "pci"];

/// Builds an hwloc topology with I/O objects kept and without the
/// components of [`LEFT_OUT`], and reads it.
pub(super) fn discover() -> Result<HwlocFacts, String> {
    let mut builder = HwTopology::builder();
    for &name in LEFT_OUT {
        // hwloc refuses to leave out a component it does not have (its
        // plugins are not installed, or it was built without it), and a
        // refused builder is lost: each name is tried on a throwaway
        // builder first (cheap: `builder` keeps the components loaded).
        if let Err(e) = HwTopology::builder().without_component(name) {
            tracing::debug!("hwloc has no {name} component to leave out ({e})");
            continue;
        }
        builder = builder
            .without_component(name)
            .map_err(|e| format!("cannot leave out the {name} component: {e}"))?;
    }
    let topo = builder
        .with_io_type_filter(TypeFilter::KeepAll)
        .map_err(|e| format!("cannot keep I/O objects: {e}"))?
        .build()
        .map_err(|e| format!("cannot build the topology: {e}"))?;

    let mut numa_nodes: Vec<u32> = topo
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(|n| u32::try_from(n.os_index()?).ok())
        .collect();
    numa_nodes.sort_unstable();
    numa_nodes.dedup();

    let mut facts = HwlocFacts {
        numa_nodes,
        network: HashMap::new(),
        openfabrics: HashMap::new(),
        gpus: Vec::new(),
    };
    let mut cuda = Vec::new();
    let mut nvml = Vec::new();
    for dev in topo.os_devices() {
        let Some(ObjectAttributes::OSDevice(attr)) = dev.attributes() else {
            continue;
        };
        let Some(name) = dev.name().and_then(|n| n.to_str().ok()) else {
            continue;
        };
        let loc = locality(dev);
        match attr.device_type() {
            OSDeviceType::Network => {
                facts.network.insert(name.to_owned(), loc);
            }
            OSDeviceType::OpenFabrics => {
                facts.openfabrics.insert(name.to_owned(), loc);
            }
            OSDeviceType::CoProcessor | OSDeviceType::GPU => {
                let gpu = |index| Gpu {
                    index,
                    name: name.to_owned(),
                    numa_node: loc.numa_node,
                    pci_bus_id: loc.pci_bus_id.clone(),
                };
                if let Some(i) = name.strip_prefix("cuda").and_then(|i| i.parse().ok()) {
                    cuda.push(gpu(i));
                } else if let Some(i) = name.strip_prefix("nvml").and_then(|i| i.parse().ok()) {
                    nvml.push(gpu(i));
                }
            }
            _ => {}
        }
    }
    facts.gpus = if cuda.is_empty() { nvml } else { cuda };
    facts.gpus.sort_by_key(|g| g.index);
    tracing::debug!(
        numa = ?facts.numa_nodes,
        network = facts.network.len(),
        openfabrics = facts.openfabrics.len(),
        gpus = facts.gpus.len(),
        "hwloc topology read"
    );
    Ok(facts)
}

/// NUMA node (when the device's first non-I/O ancestor covers exactly one)
/// and PCI address (of the nearest PCI device ancestor) of an I/O object.
fn locality(dev: &TopologyObject) -> Locality {
    let numa_node = dev
        .first_non_io_ancestor()
        .and_then(|a| a.nodeset())
        .filter(|set| set.weight() == Some(1))
        .and_then(|set| set.first_set())
        .and_then(|i| u32::try_from(usize::from(i)).ok());
    let pci_bus_id = dev.ancestors().find_map(|a| match a.attributes() {
        Some(ObjectAttributes::PCIDevice(pci)) => Some(format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            pci.domain(),
            pci.bus_id(),
            pci.bus_device(),
            pci.function()
        )),
        _ => None,
    });
    Locality {
        numa_node,
        pci_bus_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hwloc_reads_this_machine() {
        let facts = discover().unwrap_or_else(|e| panic!("hwloc failed here: {e}"));
        assert!(!facts.numa_nodes.is_empty());
        assert!(
            facts.openfabrics.is_empty(),
            "no RDMA hardware on the test machines"
        );
    }

    #[test]
    fn pci_network_devices_are_found_without_the_pci_component() {
        // The linux component reads the PCI tree from sysfs: every netdev
        // that sysfs places on a PCI function is on the same one in hwloc.
        let facts = discover().unwrap_or_else(|e| panic!("hwloc failed here: {e}"));
        for nic in super::super::sysfs::net_interfaces() {
            let Some(pci) = nic.pci_bus_id else { continue };
            let hw = facts.network.get(&nic.name);
            assert_eq!(
                hw.and_then(|l| l.pci_bus_id.as_deref()),
                Some(pci.as_str()),
                "{} in hwloc: {hw:?}",
                nic.name
            );
        }
    }
}
