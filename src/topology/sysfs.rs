//! Topology facts from sysfs and `getifaddrs`: always compiled, the only
//! source without the `hwloc` feature, and the gap filler with it.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::ptr::NonNull;

#[cfg(any(test, not(feature = "rdma")))]
use super::rails::{RailFilter, rails_of};
use super::{Gpu, IfAddr, Locality, NetInterface};

const SYS: &str = "/sys";

/// NUMA node ids from `/sys/devices/system/node/node*`, ascending.
pub(super) fn numa_nodes() -> Vec<u32> {
    numa_nodes_in(Path::new(SYS))
}

fn numa_nodes_in(sys: &Path) -> Vec<u32> {
    let dir = sys.join("devices/system/node");
    let Ok(entries) = fs::read_dir(&dir) else {
        tracing::debug!("{} is not readable; no NUMA information", dir.display());
        return Vec::new();
    };
    let mut nodes: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
        .collect();
    nodes.sort_unstable();
    nodes
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Whether `s` is a PCI address `dddd:bb:dd.f`.
fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b':',
            10 => *c == b'.',
            _ => c.is_ascii_hexdigit(),
        })
}

/// PCI address and NUMA node of the PCI function `device_link` (a sysfs
/// `device` symlink) sits on; virtual devices have neither.
fn pci_locality(device_link: &Path) -> Locality {
    let Ok(real) = fs::canonicalize(device_link) else {
        return Locality::default();
    };
    let Some(pci_dir) = real.ancestors().find(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(is_pci_address)
    }) else {
        return Locality::default();
    };
    Locality {
        numa_node: read_trimmed(&pci_dir.join("numa_node"))
            .and_then(|s| s.parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok()),
        pci_bus_id: pci_dir
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned),
    }
}

/// Locality of RDMA device `name` from `/sys/class/infiniband/<name>/device`.
pub(super) fn rdma_locality(name: &str) -> Locality {
    pci_locality(
        &Path::new(SYS)
            .join("class/infiniband")
            .join(name)
            .join("device"),
    )
}

#[cfg(any(test, not(feature = "rdma")))]
fn ib_ports(sys: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let dir = sys.join("class/infiniband").join(name).join("ports");
    fs::read_dir(dir)
        .map(|it| it.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Each port of RDMA device `name` and whether it is ACTIVE, from
/// `/sys/class/infiniband/<name>/ports/<n>/state` ("4: ACTIVE").
#[cfg(any(test, not(feature = "rdma")))]
fn port_states_in(sys: &Path, name: &str) -> Vec<(u8, bool)> {
    let mut states: Vec<(u8, bool)> = ib_ports(sys, name)
        .iter()
        .filter_map(|p| {
            let port = p.file_name()?.to_str()?.parse().ok()?;
            let active = read_trimmed(&p.join("state")).is_some_and(|s| s.ends_with("ACTIVE"));
            Some((port, active))
        })
        .collect();
    states.sort_unstable();
    states
}

/// RDMA rails listed in `/sys/class/infiniband` (used when the `rdma`
/// feature, and with it libibverbs, is not built in).
#[cfg(not(feature = "rdma"))]
pub(super) fn rdma_devices(wanted: &RailFilter<'_>) -> Vec<super::RdmaDevice> {
    rdma_devices_in(Path::new(SYS), wanted)
}

/// The rails of the devices under `sys/class/infiniband` that `wanted`
/// keeps, by device name then port.
#[cfg(any(test, not(feature = "rdma")))]
fn rdma_devices_in(sys: &Path, wanted: &RailFilter<'_>) -> Vec<super::RdmaDevice> {
    let Ok(entries) = fs::read_dir(sys.join("class/infiniband")) else {
        tracing::debug!("no /sys/class/infiniband: no RDMA devices");
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| wanted.device(n))
        .collect();
    names.sort();
    let mut out = Vec::new();
    for device in names {
        let ports = port_states_in(sys, &device);
        for (name, port, active) in rails_of(&device, &ports, wanted.ib_port()) {
            if wanted.rail(&name) {
                out.push(super::RdmaDevice {
                    name,
                    device: device.clone(),
                    port,
                    numa_node: None,
                    pci_bus_id: None,
                    ports_active: active,
                });
            }
        }
    }
    out
}

/// Rate of `port` of RDMA device `name` in Gb/s, from
/// `/sys/class/infiniband/<name>/ports/<port>/rate` ("100 Gb/sec (4X EDR)").
pub(super) fn ib_rate_gbps(name: &str, port: u8) -> Option<f64> {
    let p = Path::new(SYS)
        .join("class/infiniband")
        .join(name)
        .join("ports")
        .join(port.to_string());
    read_trimmed(&p.join("rate"))?
        .split_whitespace()
        .next()?
        .parse::<f64>()
        .ok()
}

/// Distance between two PCI functions: the number of sysfs path components
/// that are not shared (0 for the same function, 2 for siblings under one
/// bridge). `None` if either is unknown to sysfs.
pub(super) fn pci_distance(a: &str, b: &str) -> Option<usize> {
    let devices = Path::new(SYS).join("bus/pci/devices");
    let pa = fs::canonicalize(devices.join(a)).ok()?;
    let pb = fs::canonicalize(devices.join(b)).ok()?;
    let common = pa
        .components()
        .zip(pb.components())
        .take_while(|(x, y)| x == y)
        .count();
    Some(pa.components().count() + pb.components().count() - 2 * common)
}

/// NVIDIA GPUs on PCI, in bus order (numbered so; CUDA's numbering is
/// applied by the caller). Used when hwloc reported no CUDA/NVML device.
pub(super) fn nvidia_gpus() -> Vec<Gpu> {
    let dir = Path::new(SYS).join("bus/pci/devices");
    let Ok(entries) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|id| {
            let dev = dir.join(id);
            read_trimmed(&dev.join("vendor")).as_deref() == Some("0x10de")
                && read_trimmed(&dev.join("class"))
                    .is_some_and(|c| c.starts_with("0x0300") || c.starts_with("0x0302"))
        })
        .collect();
    ids.sort();
    ids.into_iter()
        .zip(0u32..)
        .map(|(id, index)| {
            let loc = pci_locality(&dir.join(&id));
            Gpu {
                index,
                name: id,
                numa_node: loc.numa_node,
                pci_bus_id: loc.pci_bus_id,
            }
        })
        .collect()
}

/// The `getifaddrs` list, freed on drop.
struct IfAddrs(Option<NonNull<libc::ifaddrs>>);

impl IfAddrs {
    fn new() -> std::io::Result<IfAddrs> {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: `head` is a valid out-pointer; on success the list it
        // receives is owned by the returned value and freed in `drop`.
        if unsafe { libc::getifaddrs(&mut head) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(IfAddrs(NonNull::new(head)))
    }

    fn iter(&self) -> impl Iterator<Item = &libc::ifaddrs> {
        let mut cur = self.0.map_or(std::ptr::null(), |p| p.as_ptr().cast_const());
        std::iter::from_fn(move || {
            // SAFETY: `cur` is NULL or a node of the list `self` owns, which
            // lives until `self` is dropped; the borrow is tied to `&self`.
            let node = unsafe { cur.as_ref() }?;
            cur = node.ifa_next;
            Some(node)
        })
    }
}

impl Drop for IfAddrs {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            // SAFETY: `p` came from `getifaddrs` and is freed exactly once.
            unsafe { libc::freeifaddrs(p.as_ptr()) };
        }
    }
}

/// The IP address in `ifa`, if it carries one.
fn ip_of(ifa: &libc::ifaddrs) -> Option<IfAddr> {
    let ip = sockaddr_ip(ifa.ifa_addr)?;
    let prefix_len = sockaddr_ip(ifa.ifa_netmask).map_or(0, |mask| match mask {
        IpAddr::V4(m) => u32::from(m).leading_ones() as u8,
        IpAddr::V6(m) => u128::from(m).leading_ones() as u8,
    });
    Some(IfAddr { ip, prefix_len })
}

/// The address in a sockaddr of family AF_INET or AF_INET6.
fn sockaddr_ip(addr: *const libc::sockaddr) -> Option<IpAddr> {
    // SAFETY: `addr` is NULL or points to a sockaddr whose real type is
    // given by `sa_family`; we read only the matching struct.
    unsafe {
        let sa = addr.as_ref()?;
        match i32::from(sa.sa_family) {
            libc::AF_INET => {
                let sin = &*addr.cast::<libc::sockaddr_in>();
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))))
            }
            libc::AF_INET6 => {
                let sin6 = &*addr.cast::<libc::sockaddr_in6>();
                Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    }
}

#[derive(Default)]
struct LinkInfo {
    flags: Option<u32>,
    addrs: Vec<IfAddr>,
}

fn ifindex(name: &str) -> u32 {
    let Ok(c) = CString::new(name) else {
        return 0;
    };
    // SAFETY: `c` is a valid NUL-terminated string for the call's duration.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

/// Network interfaces of this process's namespace, ordered by ifindex.
///
/// Names, flags and addresses come from `getifaddrs` (which follows the
/// network namespace); speed, operstate and PCI locality from
/// `/sys/class/net/<if>`. If `getifaddrs` fails, sysfs lists the names.
pub(super) fn net_interfaces() -> Vec<NetInterface> {
    let mut links: BTreeMap<String, LinkInfo> = BTreeMap::new();
    match IfAddrs::new() {
        Ok(list) => {
            for ifa in list.iter() {
                if ifa.ifa_name.is_null() {
                    continue;
                }
                // SAFETY: a non-NULL `ifa_name` is a NUL-terminated string
                // owned by the list, alive for this iteration.
                let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
                let link = links.entry(name.into_owned()).or_default();
                link.flags.get_or_insert(ifa.ifa_flags);
                if let Some(ip) = ip_of(ifa) {
                    if !link.addrs.contains(&ip) {
                        link.addrs.push(ip);
                    }
                }
            }
        }
        Err(e) => {
            tracing::warn!(
                "getifaddrs failed ({e}); listing interfaces from sysfs without addresses"
            );
            if let Ok(entries) = fs::read_dir(Path::new(SYS).join("class/net")) {
                for name in entries
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                {
                    links.entry(name).or_default();
                }
            }
        }
    }

    let mut out: Vec<(u32, NetInterface)> = links
        .into_iter()
        .map(|(name, link)| {
            let dir = Path::new(SYS).join("class/net").join(&name);
            (ifindex(&name), describe_link(&dir, name, link))
        })
        .collect();
    out.sort_by(|a, b| (a.0, &a.1.name).cmp(&(b.0, &b.1.name)));
    out.into_iter().map(|(_, nic)| nic).collect()
}

/// Completes one interface from its sysfs directory `dir`.
fn describe_link(dir: &Path, name: String, link: LinkInfo) -> NetInterface {
    let flags = link.flags.or_else(|| {
        read_trimmed(&dir.join("flags"))
            .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    });
    let flags = flags.unwrap_or(0);
    let has = |f: libc::c_int| flags & (f as u32) != 0;
    let up = match read_trimmed(&dir.join("operstate")).as_deref() {
        Some("up") => true,
        // "unknown" (loopback, tun) or no sysfs view: trust the flags.
        Some("unknown") | None => has(libc::IFF_UP) && has(libc::IFF_RUNNING),
        Some(_) => false,
    };
    let speed_mbps = read_trimmed(&dir.join("speed"))
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|s| *s > 0)
        .and_then(|s| u32::try_from(s).ok());
    let loc = pci_locality(&dir.join("device"));
    NetInterface {
        name,
        numa_node: loc.numa_node,
        pci_bus_id: loc.pci_bus_id,
        addrs: link.addrs,
        speed_mbps,
        up,
        loopback: has(libc::IFF_LOOPBACK),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("te-topo-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn numa_nodes_are_read_and_sorted() {
        let sys = scratch("numa");
        for n in ["node1", "node0", "node10", "possible", "has_cpu"] {
            fs::create_dir_all(sys.join("devices/system/node").join(n)).unwrap();
        }
        assert_eq!(numa_nodes_in(&sys), vec![0, 1, 10]);
        assert!(numa_nodes_in(&sys.join("missing")).is_empty());
        fs::remove_dir_all(&sys).unwrap();
        assert!(!numa_nodes().is_empty());
    }

    #[test]
    fn pci_addresses_are_recognised() {
        assert!(is_pci_address("0000:3b:00.0"));
        assert!(is_pci_address("0001:af:1f.7"));
        assert!(!is_pci_address("virtio2"));
        assert!(!is_pci_address("pci0000:00"));
        assert!(!is_pci_address("0000:3b:00:0"));
    }

    #[test]
    fn pci_locality_walks_up_to_the_pci_function() {
        let sys = scratch("pci");
        let func = sys.join("devices/pci0000:00/0000:00:03.0");
        fs::create_dir_all(func.join("virtio2")).unwrap();
        fs::write(func.join("numa_node"), "1\n").unwrap();
        let link = sys.join("link");
        std::os::unix::fs::symlink(func.join("virtio2"), &link).unwrap();
        let loc = pci_locality(&link);
        assert_eq!(loc.pci_bus_id.as_deref(), Some("0000:00:03.0"));
        assert_eq!(loc.numa_node, Some(1));
        fs::write(func.join("numa_node"), "-1\n").unwrap();
        assert_eq!(pci_locality(&link).numa_node, None);
        assert_eq!(pci_locality(&sys.join("nothing")), Locality::default());
        fs::remove_dir_all(&sys).unwrap();
    }

    #[test]
    fn sysfs_rdma_listing_makes_a_rail_of_each_active_port() {
        let sys = scratch("ib");
        // A dual-port HCA with both ports up, one with port 1 down, a
        // single-port device, and one with no port up.
        for (dev, port, state) in [
            ("mlx5_0", 1, "4: ACTIVE"),
            ("mlx5_0", 2, "4: ACTIVE"),
            ("mlx5_1", 1, "1: DOWN"),
            ("mlx5_1", 2, "4: ACTIVE"),
            ("mlx5_2", 1, "4: ACTIVE"),
            ("mlx5_3", 1, "1: DOWN"),
        ] {
            let dir = sys
                .join("class/infiniband")
                .join(dev)
                .join("ports")
                .join(port.to_string());
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("state"), state).unwrap();
        }
        let none: Vec<String> = Vec::new();
        let got = |f: &RailFilter<'_>| -> Vec<(String, String, u8, bool)> {
            rdma_devices_in(&sys, f)
                .into_iter()
                .map(|d| (d.name, d.device, d.port, d.ports_active))
                .collect()
        };
        let row = |n: &str, d: &str, p: u8, a: bool| (n.to_string(), d.to_string(), p, a);
        assert_eq!(
            got(&RailFilter::new(&none, &none, 1)),
            vec![
                row("mlx5_0", "mlx5_0", 1, true),
                row("mlx5_0:2", "mlx5_0", 2, true),
                row("mlx5_1:2", "mlx5_1", 2, true),
                row("mlx5_2", "mlx5_2", 1, true),
                row("mlx5_3", "mlx5_3", 1, false),
            ]
        );
        // MC_IB_PORT=2: port 2 has the plain name.
        assert_eq!(
            got(&RailFilter::new(&none, &none, 2))[..3],
            [
                row("mlx5_0:1", "mlx5_0", 1, true),
                row("mlx5_0", "mlx5_0", 2, true),
                row("mlx5_1", "mlx5_1", 2, true),
            ]
        );
        // Filters: a device keeps its ports, a port only itself.
        let f = vec!["mlx5_0:2".to_string(), "mlx5_2".to_string()];
        assert_eq!(
            got(&RailFilter::new(&f, &none, 1)),
            vec![
                row("mlx5_0:2", "mlx5_0", 2, true),
                row("mlx5_2", "mlx5_2", 1, true),
            ]
        );
        fs::remove_dir_all(&sys).unwrap();
    }

    #[test]
    fn loopback_is_found_with_its_address() {
        let nics = net_interfaces();
        let lo = nics.iter().find(|n| n.name == "lo").expect("lo exists");
        assert!(lo.loopback && lo.up, "{lo:?}");
        assert!(
            lo.addrs
                .iter()
                .any(|a| a.ip == IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{lo:?}"
        );
        assert_eq!(lo.pci_bus_id, None);
    }
}
