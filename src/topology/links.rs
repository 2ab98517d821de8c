//! The `showLinks` report: local NICs and why each location prefers the
//! devices it does.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::{PriorityMatrix, Topology, sysfs};

/// One row of the NIC table.
struct NicRow {
    device: String,
    source: &'static str,
    numa: Option<u32>,
    speed_gbps: Option<f64>,
    state: &'static str,
    pci: Option<String>,
    addrs: Vec<String>,
}

fn rows(t: &Topology) -> Vec<NicRow> {
    let rdma = t.rdma_devices.iter().map(|d| NicRow {
        device: d.name.clone(),
        source: "rdma",
        numa: d.numa_node,
        speed_gbps: sysfs::ib_rate_gbps(&d.device, d.port),
        state: if d.ports_active {
            "active"
        } else {
            "no active port"
        },
        pci: d.pci_bus_id.clone(),
        addrs: Vec::new(),
    });
    let net = t.net_interfaces.iter().map(|n| NicRow {
        device: n.name.clone(),
        source: "net",
        numa: n.numa_node,
        speed_gbps: n.speed_mbps.map(|s| f64::from(s) / 1000.0),
        state: match (n.up, n.loopback) {
            (true, true) => "up (loopback)",
            (true, false) => "up",
            (false, _) => "down",
        },
        pci: n.pci_bus_id.clone(),
        addrs: n.addrs.iter().map(ToString::to_string).collect(),
    });
    rdma.chain(net).collect()
}

/// NUMA node of a device named in the matrix, looked up in the topology.
fn device_numa(t: &Topology, name: &str) -> Option<Option<u32>> {
    t.rdma_devices
        .iter()
        .find(|d| d.name == name)
        .map(|d| d.numa_node)
        .or_else(|| {
            t.net_interfaces
                .iter()
                .find(|n| n.name == name)
                .map(|n| n.numa_node)
        })
}

/// NUMA node a location's memory lives on, if the location says.
fn location_numa(t: &Topology, location: &str) -> Option<u32> {
    if let Some(n) = location.strip_prefix("cpu:") {
        return n.parse().ok();
    }
    let index: u32 = location.strip_prefix("cuda:")?.parse().ok()?;
    t.gpus.iter().find(|g| g.index == index)?.numa_node
}

/// Why `device` sits where it does for `location`.
fn reason(t: &Topology, location: &str, device: &str) -> String {
    let Some(dev_numa) = device_numa(t, device) else {
        return "not found on this host (from the configured matrix)".to_owned();
    };
    let Some(dev_numa) = dev_numa else {
        return "device NUMA node unknown".to_owned();
    };
    match location_numa(t, location) {
        Some(n) if n == dev_numa => format!("same NUMA node {n}"),
        Some(_) => format!("other NUMA node ({dev_numa})"),
        None if location == "*" => format!("any memory; device on NUMA node {dev_numa}"),
        None => format!("location NUMA node unknown; device on NUMA node {dev_numa}"),
    }
}

fn speed_json(gbps: Option<f64>) -> Value {
    match gbps {
        // Mooncake reports whole Gb/s and 0 when unknown.
        Some(g) if g.fract() == 0.0 && g < 1e9 => json!(g as u64),
        Some(g) => json!(g),
        None => json!(0),
    }
}

/// One device of one location: role (`preferred`/`available`), name, reason.
struct Pick {
    role: &'static str,
    device: String,
    reason: String,
}

fn selection(t: &Topology, m: &PriorityMatrix) -> Vec<(String, Vec<Pick>)> {
    m.locations()
        .map(|loc| {
            let (pref, avail) = m.entry(loc).unwrap_or_default();
            let picks = pref
                .iter()
                .map(|d| ("preferred", d))
                .chain(avail.iter().map(|d| ("available", d)))
                .map(|(role, d)| Pick {
                    role,
                    device: d.clone(),
                    reason: reason(t, loc, d),
                })
                .collect();
            (loc.to_owned(), picks)
        })
        .collect()
}

/// The NIC/topology report of `showLinks`.
///
/// JSON (`json == true`): `{"local_nics": [{"device", "numa", "speed_gbps",
/// "source": "rdma"|"net", "addrs", "state", "pci_bus_id"}], "topology":
/// <matrix>, "selection": {"<location>": [{"device", "role", "reason"}]}}`,
/// with `numa` -1 and `speed_gbps` 0 when unknown, as Mooncake writes them.
/// Otherwise a readable table.
pub fn show_links(t: &Topology, m: &PriorityMatrix, json: bool) -> String {
    let nics = rows(t);
    let picks = selection(t, m);
    if json {
        let local_nics: Vec<Value> = nics
            .iter()
            .map(|r| {
                json!({
                    "device": r.device,
                    "numa": r.numa.map_or(-1, i64::from),
                    "speed_gbps": speed_json(r.speed_gbps),
                    "source": r.source,
                    "addrs": r.addrs,
                    "state": r.state,
                    "pci_bus_id": r.pci,
                })
            })
            .collect();
        let selection: serde_json::Map<String, Value> = picks
            .into_iter()
            .map(|(loc, list)| {
                let list = list
                    .into_iter()
                    .map(|p| json!({"device": p.device, "role": p.role, "reason": p.reason}))
                    .collect();
                (loc, Value::Array(list))
            })
            .collect();
        let report = json!({
            "local_nics": local_nics,
            "topology": m.to_json(),
            "selection": selection,
        });
        return serde_json::to_string_pretty(&report).unwrap_or_else(|_| report.to_string());
    }

    let mut out = String::new();
    let cell = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
    let table: Vec<[String; 7]> = nics
        .iter()
        .map(|r| {
            [
                r.device.clone(),
                r.source.to_owned(),
                cell(r.numa.map(|n| n.to_string())),
                cell(r.speed_gbps.map(|g| format!("{g} Gb/s"))),
                r.state.to_owned(),
                cell(r.pci.clone()),
                if r.addrs.is_empty() {
                    "-".to_owned()
                } else {
                    r.addrs.join(", ")
                },
            ]
        })
        .collect();
    let header = [
        "DEVICE",
        "SOURCE",
        "NUMA",
        "SPEED",
        "STATE",
        "PCI",
        "ADDRESSES",
    ]
    .map(str::to_owned);
    let mut widths = header.clone().map(|h| h.len());
    for row in &table {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let _ = writeln!(out, "=== Local NICs (NUMA nodes: {:?}) ===", t.numa_nodes);
    for row in std::iter::once(&header).chain(&table) {
        let mut line = String::from(" ");
        for (c, w) in row.iter().zip(widths) {
            let _ = write!(line, " {c:<w$}");
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if t.rdma_devices.is_empty() {
        let _ = writeln!(out, "  (no RDMA devices found)");
    }
    let _ = writeln!(out, "\n=== Priority matrix (device selection) ===");
    if picks.is_empty() {
        let _ = writeln!(out, "  (empty)");
    }
    for (loc, list) in picks {
        let _ = writeln!(out, "  {loc}");
        if list.is_empty() {
            let _ = writeln!(out, "    (no device)");
        }
        for Pick {
            role,
            device,
            reason,
        } in list
        {
            let _ = writeln!(out, "    {role:<9}  {device:<12}  {reason}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{NetInterface, RdmaDevice};

    fn sample() -> (Topology, PriorityMatrix) {
        let t = Topology {
            numa_nodes: vec![0, 1],
            rdma_devices: vec![
                RdmaDevice {
                    name: "mlx5_0".into(),
                    device: "mlx5_0".into(),
                    port: 1,
                    numa_node: Some(0),
                    pci_bus_id: Some("0000:1a:00.0".into()),
                    ports_active: true,
                },
                RdmaDevice {
                    name: "mlx5_1".into(),
                    device: "mlx5_1".into(),
                    port: 1,
                    numa_node: Some(1),
                    pci_bus_id: None,
                    ports_active: true,
                },
            ],
            net_interfaces: vec![NetInterface {
                name: "eth0".into(),
                numa_node: None,
                pci_bus_id: None,
                addrs: vec![crate::topology::IfAddr {
                    ip: "10.0.0.1".parse().expect("ip"),
                    prefix_len: 24,
                }],
                speed_mbps: Some(25_000),
                up: true,
                loopback: false,
            }],
            gpus: Vec::new(),
        };
        let m = PriorityMatrix::from_topology(&t);
        (t, m)
    }

    #[test]
    fn json_report_parses_and_lists_the_matrix() {
        let (t, m) = sample();
        let text = show_links(&t, &m, true);
        let v: Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(v["topology"], m.to_json());
        assert_eq!(v["topology"]["cpu:0"], json!([["mlx5_0"], ["mlx5_1"]]));
        let nics = v["local_nics"].as_array().expect("array");
        assert_eq!(nics.len(), 3);
        assert_eq!(nics[0]["device"], "mlx5_0");
        assert_eq!(nics[0]["source"], "rdma");
        assert_eq!(nics[0]["numa"], 0);
        assert_eq!(nics[2]["device"], "eth0");
        assert_eq!(nics[2]["source"], "net");
        assert_eq!(nics[2]["numa"], -1);
        assert_eq!(nics[2]["speed_gbps"], 25);
        assert_eq!(nics[2]["addrs"], json!(["10.0.0.1/24"]));
        let cpu1 = &v["selection"]["cpu:1"];
        assert_eq!(
            cpu1[0],
            json!({"device": "mlx5_1", "role": "preferred", "reason": "same NUMA node 1"})
        );
        assert_eq!(cpu1[1]["reason"], "other NUMA node (0)");
    }

    #[test]
    fn text_report_is_a_table_with_reasons() {
        let (t, m) = sample();
        let text = show_links(&t, &m, false);
        assert!(text.contains("DEVICE"), "{text}");
        assert!(
            text.contains("mlx5_0") && text.contains("eth0") && text.contains("10.0.0.1"),
            "{text}"
        );
        assert!(text.contains("25 Gb/s"), "{text}");
        assert!(text.contains("cpu:0"), "{text}");
        assert!(
            text.contains("preferred  mlx5_0        same NUMA node 0"),
            "{text}"
        );
        assert!(
            text.contains("available  mlx5_1        other NUMA node (1)"),
            "{text}"
        );
    }

    #[test]
    fn report_of_this_machine_and_of_a_foreign_matrix() {
        let t = Topology::discover(&[], &crate::topology::TopologyConfig::default(), 1);
        let m = PriorityMatrix::from_topology(&t);
        let text = show_links(&t, &m, false);
        assert!(text.contains("no RDMA devices"), "{text}");
        let v: Value = serde_json::from_str(&show_links(&t, &m, true)).expect("valid JSON");
        assert!(v["local_nics"].as_array().is_some_and(|a| !a.is_empty()));

        let custom = PriorityMatrix::parse(r#"{"cpu:0": [["erdma_0"], []]}"#).expect("parses");
        let v: Value = serde_json::from_str(&show_links(&t, &custom, true)).expect("valid JSON");
        assert_eq!(v["topology"], custom.to_json());
        assert!(
            v["selection"]["cpu:0"][0]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("not found"))
        );
    }
}
