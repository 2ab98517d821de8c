//! RDMA rails of multi-port HCAs: one rail per active (device, port).
//!
//! Mooncake opens one context per device, on port `MC_IB_PORT`, and names
//! it by the device (`mlx5_0`); it has no name for a second port. We keep
//! that name for port `MC_IB_PORT` (so a single-port device, a matrix
//! written for Mooncake and a Mooncake peer see the same names) and name
//! every other active port `<device>:<port>` (`mlx5_0:2`), the form
//! Mooncake's logs give a port. A device name with a `:<port>` suffix in a
//! priority matrix or a filter names that port.
//!
//! No soft-RoCE device has two ports, so the enumeration and naming are
//! tested here over faked port lists (and sysfs fixture directories).

/// The rail name of `port` of `device`.
pub fn rail_name(device: &str, port: u8, ib_port: u8) -> String {
    if port == ib_port {
        device.to_string()
    } else {
        format!("{device}:{port}")
    }
}

/// The device and port a rail name stands for: `<device>:<port>`, or a
/// plain device name for port `ib_port`.
pub fn parse_rail(name: &str, ib_port: u8) -> (&str, u8) {
    match name.rsplit_once(':') {
        Some((device, port)) if !device.is_empty() => match port.parse::<u8>() {
            Ok(p) if p > 0 => (device, p),
            _ => (name, ib_port),
        },
        _ => (name, ib_port),
    }
}

/// The rails of `device` from its ports' states (`(port, active)`, an
/// active port having a GID table): `(name, port, active)` for each active
/// port, in port order; a device without one is listed once, inactive,
/// under its own name (for reports; no rail uses it).
pub(super) fn rails_of(device: &str, ports: &[(u8, bool)], ib_port: u8) -> Vec<(String, u8, bool)> {
    let mut active: Vec<u8> = ports.iter().filter(|p| p.1).map(|p| p.0).collect();
    active.sort_unstable();
    active.dedup();
    if active.is_empty() {
        return vec![(device.to_string(), ib_port, false)];
    }
    active
        .into_iter()
        .map(|p| (rail_name(device, p, ib_port), p, true))
        .collect()
}

/// Device filters (an engine's device list, `MC_TE_FILTERS`): each
/// non-empty list keeps the rails it names, by rail name (`mlx5_0:2`), by
/// device (`mlx5_0`: all its ports) or by `<device>:<port>` for the port
/// that has the plain name.
#[derive(Debug, Clone, Copy)]
pub struct RailFilter<'a> {
    lists: [&'a [String]; 2],
    ib_port: u8,
}

impl<'a> RailFilter<'a> {
    /// The filter of two lists (either may be empty: no restriction).
    pub fn new(a: &'a [String], b: &'a [String], ib_port: u8) -> RailFilter<'a> {
        RailFilter {
            lists: [a, b],
            ib_port,
        }
    }

    /// `MC_IB_PORT`, the port whose rail has the plain device name.
    pub fn ib_port(&self) -> u8 {
        self.ib_port
    }

    /// Whether every list keeps some rail of `device`.
    pub fn device(&self, device: &str) -> bool {
        self.lists
            .iter()
            .all(|l| l.is_empty() || l.iter().any(|f| parse_rail(f, self.ib_port).0 == device))
    }

    /// Whether every list keeps the rail named `rail`.
    pub fn rail(&self, rail: &str) -> bool {
        let (device, port) = parse_rail(rail, self.ib_port);
        self.lists.iter().all(|l| {
            l.is_empty()
                || l.iter()
                    .any(|f| f == device || parse_rail(f, self.ib_port) == (device, port))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_mooncake_for_the_configured_port() {
        assert_eq!(rail_name("mlx5_0", 1, 1), "mlx5_0");
        assert_eq!(rail_name("mlx5_0", 2, 1), "mlx5_0:2");
        assert_eq!(rail_name("mlx5_0", 2, 2), "mlx5_0");
        assert_eq!(rail_name("mlx5_0", 1, 2), "mlx5_0:1");
        assert_eq!(parse_rail("mlx5_0", 1), ("mlx5_0", 1));
        assert_eq!(parse_rail("mlx5_0", 2), ("mlx5_0", 2));
        assert_eq!(parse_rail("mlx5_0:2", 1), ("mlx5_0", 2));
        assert_eq!(parse_rail("mlx5_0:x", 1), ("mlx5_0:x", 1));
        assert_eq!(parse_rail("mlx5_0:0", 1), ("mlx5_0:0", 1));
        assert_eq!(parse_rail(":2", 1), (":2", 1));
        for (dev, port, ib) in [("mlx5_3", 1, 1), ("mlx5_3", 2, 1), ("rxe_a0", 1, 2)] {
            assert_eq!(parse_rail(&rail_name(dev, port, ib), ib), (dev, port));
        }
    }

    #[test]
    fn every_active_port_is_a_rail() {
        // A dual-port HCA with both ports up.
        assert_eq!(
            rails_of("mlx5_0", &[(2, true), (1, true)], 1),
            vec![("mlx5_0".into(), 1, true), ("mlx5_0:2".into(), 2, true)]
        );
        // Port 2 only: it keeps its suffix (port 1 would be the plain name).
        assert_eq!(
            rails_of("mlx5_0", &[(1, false), (2, true)], 1),
            vec![("mlx5_0:2".into(), 2, true)]
        );
        // MC_IB_PORT=2: port 2 has the plain name, port 1 a suffix.
        assert_eq!(
            rails_of("mlx5_0", &[(1, true), (2, true)], 2),
            vec![("mlx5_0:1".into(), 1, true), ("mlx5_0".into(), 2, true)]
        );
        // Four ports, two up.
        assert_eq!(
            rails_of("hfi1_0", &[(1, false), (2, true), (3, false), (4, true)], 1),
            vec![("hfi1_0:2".into(), 2, true), ("hfi1_0:4".into(), 4, true)]
        );
        // Single-port devices as before; none up: listed once, inactive.
        assert_eq!(
            rails_of("rxe_a0", &[(1, true)], 1),
            vec![("rxe_a0".into(), 1, true)]
        );
        assert_eq!(
            rails_of("mlx5_1", &[(1, false), (2, false)], 1),
            vec![("mlx5_1".into(), 1, false)]
        );
        assert_eq!(
            rails_of("mlx5_1", &[], 1),
            vec![("mlx5_1".into(), 1, false)]
        );
    }

    #[test]
    fn filters_name_devices_or_single_ports() {
        let none: Vec<String> = Vec::new();
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let open = RailFilter::new(&none, &none, 1);
        assert!(open.device("mlx5_0") && open.rail("mlx5_0:2"));
        // A device name keeps all its ports.
        let dev = list(&["mlx5_0"]);
        let f = RailFilter::new(&dev, &none, 1);
        assert!(f.device("mlx5_0") && !f.device("mlx5_1"));
        assert!(f.rail("mlx5_0") && f.rail("mlx5_0:2") && !f.rail("mlx5_1"));
        // A port keeps that port only; `mlx5_0:1` is the plain rail.
        let port2 = list(&["mlx5_0:2"]);
        let f = RailFilter::new(&none, &port2, 1);
        assert!(f.device("mlx5_0"));
        assert!(f.rail("mlx5_0:2") && !f.rail("mlx5_0"));
        let port1 = list(&["mlx5_0:1"]);
        let f = RailFilter::new(&port1, &none, 1);
        assert!(f.rail("mlx5_0") && !f.rail("mlx5_0:2"));
        // Both lists must keep a rail.
        let f = RailFilter::new(&dev, &port2, 1);
        assert!(f.rail("mlx5_0:2") && !f.rail("mlx5_0"));
    }
}
