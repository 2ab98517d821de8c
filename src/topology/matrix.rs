//! Mooncake's NIC priority matrix: for each memory location (`cpu:N`,
//! `cuda:N`, `*`) the devices to prefer and the devices that also work, plus
//! the device index space the RDMA transport keys contexts, lkeys and rkeys
//! by.
//!
//! JSON form: `{"cpu:0": [["mlx5_0"], ["mlx5_1"]], ...}`.
//!
//! Device indexes are the order of first appearance walking the entries in
//! ascending location order (then preferred before available), so every
//! process of ours derives the same indexes from the same JSON. Mooncake
//! walks a `std::unordered_map` instead (spec §9 item 10): a C++ peer agrees
//! with us only when the first device of every entry's walk is the same,
//! which a multi-NUMA matrix from [`PriorityMatrix::from_topology`]
//! (`cpu:0` lists node 0's devices first, `cpu:1` node 1's) does not give.

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

use serde_json::Value;

use super::{Gpu, Topology, sysfs};
use crate::error::{Error, Result};

/// The wildcard location: any memory.
const WILDCARD: &str = "*";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Entry {
    preferred: Vec<String>,
    available: Vec<String>,
}

/// An entry in device indexes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Resolved {
    preferred: Vec<usize>,
    available: Vec<usize>,
}

/// Location -> (preferred devices, available devices), with a stable device
/// index space and Mooncake's selection rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityMatrix {
    entries: BTreeMap<String, Entry>,
    devices: Vec<String>,
    resolved: BTreeMap<String, Resolved>,
    round_robin: bool,
}

thread_local! {
    static ROUND_ROBIN: Cell<usize> = const { Cell::new(0) };
    static RNG: Cell<u64> = Cell::new(RandomState::new().hash_one(std::thread::current().id()) | 1);
}

/// Next value of the per-thread round-robin counter or random generator.
fn first_choice(round_robin: bool) -> usize {
    if round_robin {
        ROUND_ROBIN.with(|c| {
            let v = c.get();
            c.set(v.wrapping_add(1));
            v
        })
    } else {
        RNG.with(|s| {
            // xorshift64: plenty for spreading load over a few NICs.
            let mut x = s.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.set(x);
            (x >> 16) as usize
        })
    }
}

/// A candidate device for an entry: its name and locality.
struct Nic<'a> {
    name: &'a str,
    numa: Option<u32>,
    pci: Option<&'a str>,
}

/// The RDMA devices with an active port, as matrix candidates.
fn rdma_nics(t: &Topology) -> Vec<Nic<'_>> {
    t.rdma_devices
        .iter()
        .filter(|d| d.ports_active)
        .map(|d| Nic {
            name: &d.name,
            numa: d.numa_node,
            pci: d.pci_bus_id.as_deref(),
        })
        .collect()
}

impl PriorityMatrix {
    fn from_entries(entries: BTreeMap<String, Entry>) -> PriorityMatrix {
        let mut devices: Vec<String> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut resolved = BTreeMap::new();
        for (location, entry) in &entries {
            let mut ids = |names: &[String]| -> Vec<usize> {
                names
                    .iter()
                    .map(|n| {
                        *index.entry(n.clone()).or_insert_with(|| {
                            devices.push(n.clone());
                            devices.len() - 1
                        })
                    })
                    .collect()
            };
            let preferred = ids(&entry.preferred);
            let available = ids(&entry.available);
            resolved.insert(
                location.clone(),
                Resolved {
                    preferred,
                    available,
                },
            );
        }
        resolved
            .entry(WILDCARD.to_owned())
            .or_insert_with(|| Resolved {
                preferred: (0..devices.len()).collect(),
                available: Vec::new(),
            });
        PriorityMatrix {
            entries,
            devices,
            resolved,
            round_robin: false,
        }
    }

    /// Parses Mooncake's matrix JSON: an object whose every value is a
    /// 2-element array `[[preferred...], [available...]]` of device names.
    ///
    /// # Errors
    /// [`Error::MalformedJson`] naming what is wrong.
    pub fn parse(json: &str) -> Result<PriorityMatrix> {
        let root: Value = serde_json::from_str(json)
            .map_err(|e| Error::MalformedJson(format!("priority matrix: not valid JSON ({e})")))?;
        Self::from_value(&root)
    }

    /// A matrix from its JSON value (a peer descriptor's
    /// `priority_matrix`, without writing it out again); as
    /// [`parse`](Self::parse).
    ///
    /// # Errors
    /// [`Error::MalformedJson`] naming what is wrong.
    pub fn from_value(root: &Value) -> Result<PriorityMatrix> {
        let bad = |what: String| Error::MalformedJson(format!("priority matrix: {what}"));
        let Value::Object(map) = root else {
            return Err(bad(format!(
                "expected an object of location -> [[preferred], [available]], found {}",
                kind(root)
            )));
        };
        let mut entries = BTreeMap::new();
        for (location, value) in map {
            let lists = match &value {
                Value::Array(a) if a.len() == 2 => a,
                _ => {
                    return Err(bad(format!(
                        "entry \"{location}\" must be a 2-element array [[preferred], [available]], found {}",
                        describe(value)
                    )));
                }
            };
            let mut names = [Vec::new(), Vec::new()];
            for (slot, (list, role)) in names
                .iter_mut()
                .zip(lists.iter().zip(["preferred", "available"]))
            {
                let Value::Array(items) = list else {
                    return Err(bad(format!(
                        "entry \"{location}\": the {role} list must be an array of device names, found {}",
                        kind(list)
                    )));
                };
                for item in items {
                    match item {
                        Value::String(s) if !s.is_empty() => slot.push(s.clone()),
                        _ => {
                            return Err(bad(format!(
                                "entry \"{location}\": {role} devices must be non-empty strings, found {item}"
                            )));
                        }
                    }
                }
            }
            let [preferred, available] = names;
            entries.insert(
                location.clone(),
                Entry {
                    preferred,
                    available,
                },
            );
        }
        Ok(Self::from_entries(entries))
    }

    /// The matrix as Mooncake's JSON (disabled devices left out, the
    /// synthesized `"*"` entry not included).
    pub fn to_json(&self) -> Value {
        Value::Object(
            self.entries
                .iter()
                .map(|(loc, e)| {
                    let list = |v: &[String]| Value::from(v.to_vec());
                    (
                        loc.clone(),
                        Value::Array(vec![list(&e.preferred), list(&e.available)]),
                    )
                })
                .collect(),
        )
    }

    /// The RDMA matrix of Mooncake's `discover` (spec §5.1), over the RDMA
    /// devices with an active port: `cpu:N` prefers the devices on NUMA node
    /// N; `cuda:N` prefers the devices nearest the GPU on PCI among those on
    /// its NUMA node (or, without PCI paths, all of its node's devices).
    pub fn from_topology(t: &Topology) -> PriorityMatrix {
        Self::build(t, &rdma_nics(t), &sysfs::pci_distance)
    }

    /// The same shape over the network interfaces that are up and not
    /// loopback: the rails of TCP multi-rail.
    pub fn from_topology_tcp(t: &Topology) -> PriorityMatrix {
        let nics: Vec<Nic<'_>> = t
            .net_interfaces
            .iter()
            .filter(|n| n.up && !n.loopback)
            .map(|n| Nic {
                name: &n.name,
                numa: n.numa_node,
                pci: n.pci_bus_id.as_deref(),
            })
            .collect();
        Self::build(t, &nics, &sysfs::pci_distance)
    }

    fn build(
        t: &Topology,
        nics: &[Nic<'_>],
        distance: &dyn Fn(&str, &str) -> Option<usize>,
    ) -> PriorityMatrix {
        let split = |prefer: &dyn Fn(&Nic<'_>) -> bool| {
            let (p, a): (Vec<&Nic<'_>>, Vec<&Nic<'_>>) = nics.iter().partition(|n| prefer(n));
            let names = |v: Vec<&Nic<'_>>| v.into_iter().map(|n| n.name.to_owned()).collect();
            Entry {
                preferred: names(p),
                available: names(a),
            }
        };
        let mut entries = BTreeMap::new();
        for &node in &t.numa_nodes {
            entries.insert(
                format!("cpu:{node}"),
                split(&|n: &Nic<'_>| n.numa == Some(node)),
            );
        }
        for gpu in &t.gpus {
            let nearest = nearest_to_gpu(gpu, nics, distance);
            entries.insert(
                format!("cuda:{}", gpu.index),
                split(&|n: &Nic<'_>| nearest.contains(&n.name)),
            );
        }
        Self::from_entries(entries)
    }

    /// Device names in index order (the index space of
    /// [`select_device`](Self::select_device)); disabled devices keep their
    /// place.
    pub fn devices(&self) -> &[String] {
        &self.devices
    }

    /// The `(preferred, available)` devices of `location` as written in the
    /// matrix (the synthesized `"*"` is not an entry).
    pub fn entry(&self, location: &str) -> Option<(&[String], &[String])> {
        self.entries
            .get(location)
            .map(|e| (e.preferred.as_slice(), e.available.as_slice()))
    }

    /// The locations of the matrix, ascending.
    pub fn locations(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Whether no location has any device to select (Mooncake's `empty()`).
    pub fn is_empty(&self) -> bool {
        self.resolved
            .values()
            .all(|r| r.preferred.is_empty() && r.available.is_empty())
    }

    /// Makes the first choice (`retry == 0`) round-robin per thread instead
    /// of random; the default is `MC_PATH_ROUNDROBIN`.
    pub fn set_round_robin(&mut self, on: bool) {
        self.round_robin = on;
    }

    /// Picks a device index for memory at `location` on attempt `retry`.
    ///
    /// An unknown location uses `"*"`. Attempt 0 picks at random (or
    /// round-robin) among the preferred devices, or the available ones if
    /// none is preferred; attempt k > 0 walks preferred then available
    /// deterministically: element `(k - 1) % (|preferred| + |available|)`.
    ///
    /// # Errors
    /// [`Error::DeviceNotFound`] if the location has no device left.
    pub fn select_device(&self, location: &str, retry: u32) -> Result<usize> {
        let entry = self
            .resolved
            .get(location)
            .or_else(|| self.resolved.get(WILDCARD))
            .ok_or_else(|| {
                Error::DeviceNotFound(format!(
                    "no priority-matrix entry for location \"{location}\" and no \"*\" entry"
                ))
            })?;
        let (p, a) = (&entry.preferred, &entry.available);
        if p.is_empty() && a.is_empty() {
            return Err(Error::DeviceNotFound(format!(
                "no usable device for location \"{location}\" (entry empty or all its devices disabled)"
            )));
        }
        if retry == 0 {
            let list = if p.is_empty() { a } else { p };
            return Ok(list[first_choice(self.round_robin) % list.len()]);
        }
        let k = (retry as usize - 1) % (p.len() + a.len());
        Ok(if k < p.len() { p[k] } else { a[k - p.len()] })
    }

    /// Takes device `name` out of every entry; indexes of the other devices
    /// do not move. Returns whether the matrix knew the device.
    pub fn disable_device(&mut self, name: &str) -> bool {
        for e in self.entries.values_mut() {
            e.preferred.retain(|n| n != name);
            e.available.retain(|n| n != name);
        }
        let Some(id) = self.devices.iter().position(|n| n == name) else {
            return false;
        };
        for r in self.resolved.values_mut() {
            r.preferred.retain(|&i| i != id);
            r.available.retain(|&i| i != id);
        }
        tracing::info!("device {name} (index {id}) disabled for selection");
        true
    }
}

/// Names of the devices nearest `gpu`: among the devices on the GPU's NUMA
/// node (all devices if none is), those at minimal PCI distance; without
/// PCI distances, the devices on the GPU's NUMA node.
fn nearest_to_gpu<'a>(
    gpu: &Gpu,
    nics: &[Nic<'a>],
    distance: &dyn Fn(&str, &str) -> Option<usize>,
) -> Vec<&'a str> {
    let same_node: Vec<&Nic<'a>> = nics
        .iter()
        .filter(|n| n.numa.is_some() && n.numa == gpu.numa_node)
        .collect();
    let candidates: Vec<&Nic<'a>> = if same_node.is_empty() {
        nics.iter().collect()
    } else {
        same_node.clone()
    };
    let measured: Vec<(&'a str, usize)> = candidates
        .iter()
        .filter_map(|n| Some((n.name, distance(gpu.pci_bus_id.as_deref()?, n.pci?)?)))
        .collect();
    match measured.iter().map(|m| m.1).min() {
        Some(min) => measured
            .into_iter()
            .filter(|m| m.1 == min)
            .map(|m| m.0)
            .collect(),
        None => same_node.into_iter().map(|n| n.name).collect(),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("an array of {} elements", a.len()),
        _ => kind(v).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{NetInterface, RdmaDevice};
    use std::collections::BTreeSet;

    fn m(json: &str) -> PriorityMatrix {
        PriorityMatrix::parse(json).unwrap_or_else(|e| panic!("{e}: {json}"))
    }

    fn idx(m: &PriorityMatrix, name: &str) -> usize {
        m.devices()
            .iter()
            .position(|d| d == name)
            .expect("device listed")
    }

    #[test]
    fn parse_to_json_parse_round_trips() {
        let text = r#"{"cpu:0": [["mlx5_0", "mlx5_2"], ["mlx5_1"]],
                       "cpu:1": [["mlx5_1"], ["mlx5_0", "mlx5_2"]],
                       "cuda:0": [[], ["mlx5_0"]]}"#;
        let a = m(text);
        let json = a.to_json();
        let b = m(&json.to_string());
        assert_eq!(a, b);
        assert_eq!(b.to_json(), json);
        assert_eq!(
            json["cpu:0"],
            serde_json::json!([["mlx5_0", "mlx5_2"], ["mlx5_1"]])
        );
        assert_eq!(a.devices(), ["mlx5_0", "mlx5_2", "mlx5_1"]);
        // Pretty output parses the same.
        let pretty = serde_json::to_string_pretty(&json).expect("serializes");
        assert_eq!(m(&pretty), a);
    }

    #[test]
    fn malformed_inputs_are_rejected() {
        for bad in [
            "",
            "{",
            "not json",
            "[]",
            "\"cpu:0\"",
            "null",
            r#"{"cpu:0": "mlx5_0"}"#,
            r#"{"cpu:0": [["mlx5_0"]]}"#,
            r#"{"cpu:0": [["a"], ["b"], ["c"]]}"#,
            r#"{"cpu:0": [["mlx5_0"], "mlx5_1"]}"#,
            r#"{"cpu:0": [["mlx5_0"], [1]]}"#,
            r#"{"cpu:0": [[null], []]}"#,
            r#"{"cpu:0": [[""], []]}"#,
            r#"{"cpu:0": [["a"], []], "cpu:1": {}}"#,
        ] {
            match PriorityMatrix::parse(bad) {
                Err(Error::MalformedJson(msg)) => assert!(msg.contains("priority matrix"), "{msg}"),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        let Err(Error::MalformedJson(msg)) = PriorityMatrix::parse(r#"{"cpu:0": [["a"]]}"#) else {
            panic!("accepted");
        };
        assert!(msg.contains("cpu:0") && msg.contains("2-element"), "{msg}");
    }

    #[test]
    fn devices_are_deduplicated_across_entries() {
        let one =
            m(r#"{"cpu:0": [["erdma_0"], ["erdma_0"]], "cpu:1": [["erdma_0"], ["erdma_0"]]}"#);
        assert_eq!(one.devices(), ["erdma_0"]);
        let four =
            m(r#"{"cpu:0": [["erdma_0"], ["erdma_1"]], "cpu:1": [["erdma_2"], ["erdma_3"]]}"#);
        assert_eq!(four.devices().len(), 4);
        let two =
            m(r#"{"cpu:0": [["erdma_0"], ["erdma_1"]], "cpu:1": [["erdma_1"], ["erdma_0"]]}"#);
        let set: BTreeSet<&str> = two.devices().iter().map(String::as_str).collect();
        assert_eq!(set, BTreeSet::from(["erdma_0", "erdma_1"]));
        assert_eq!(two.devices().len(), 2);
        assert!(!two.is_empty());
    }

    #[test]
    fn matrix_has_its_key() {
        let a = m(r#"{"cpu:0": [["erdma_0"], ["erdma_1"]]}"#);
        assert_eq!(a.locations().collect::<Vec<_>>(), ["cpu:0"]);
        let (p, v) = a.entry("cpu:0").expect("entry");
        assert_eq!(
            (p, v),
            (&["erdma_0".to_string()][..], &["erdma_1".to_string()][..])
        );
        assert!(
            a.entry("*").is_none(),
            "the synthesized wildcard is not an entry"
        );
    }

    #[test]
    fn retries_cover_both_devices() {
        let a = m(r#"{"cpu:0": [["erdma_0"], ["erdma_1"]]}"#);
        for loc in ["cpu:0", "*", "cuda:7"] {
            let got: BTreeSet<usize> = [2, 1]
                .iter()
                .map(|&r| a.select_device(loc, r).expect("device"))
                .collect();
            assert_eq!(got, BTreeSet::from([0, 1]), "{loc}");
        }
    }

    #[test]
    fn retry_walk_is_deterministic() {
        let a = m(r#"{"cpu:0": [["a", "b"], ["c"]]}"#);
        let order: Vec<&str> = (1..=7)
            .map(|r| a.devices()[a.select_device("cpu:0", r).expect("device")].as_str())
            .collect();
        assert_eq!(order, ["a", "b", "c", "a", "b", "c", "a"]);
    }

    #[test]
    fn first_choice_prefers_preferred_then_available() {
        let a = m(r#"{"cpu:0": [["a"], ["b", "c"]], "cpu:1": [[], ["b", "c"]]}"#);
        for _ in 0..50 {
            assert_eq!(a.select_device("cpu:0", 0).expect("device"), idx(&a, "a"));
            let d = a.select_device("cpu:1", 0).expect("device");
            assert!(d == idx(&a, "b") || d == idx(&a, "c"));
        }
    }

    #[test]
    fn round_robin_alternates_per_thread() {
        let mut a = m(r#"{"cpu:0": [["a", "b"], []]}"#);
        a.set_round_robin(true);
        std::thread::spawn(move || {
            let got: Vec<usize> = (0..4)
                .map(|_| a.select_device("cpu:0", 0).expect("device"))
                .collect();
            assert_eq!(got, [0, 1, 0, 1]);
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn empty_entry_has_no_device() {
        let a = m(r#"{"gpu:0": [[], []]}"#);
        assert!(a.is_empty());
        for retry in [0, 1, 5] {
            assert!(matches!(
                a.select_device("gpu:0", retry),
                Err(Error::DeviceNotFound(_))
            ));
            assert!(matches!(
                a.select_device("*", retry),
                Err(Error::DeviceNotFound(_))
            ));
        }
    }

    #[test]
    fn disabling_the_only_preferred_device_leaves_nothing() {
        let mut a = m(r#"{"gpu:0": [["mlx5_2"], []]}"#);
        assert_eq!(a.select_device("gpu:0", 0), Ok(0));
        assert!(a.disable_device("mlx5_2"));
        assert!(!a.disable_device("mlx5_9"));
        for retry in [0, 1] {
            assert!(matches!(
                a.select_device("gpu:0", retry),
                Err(Error::DeviceNotFound(_))
            ));
        }
        assert_eq!(a.devices(), ["mlx5_2"], "indexes stay stable");
        assert_eq!(a.to_json(), serde_json::json!({"gpu:0": [[], []]}));
    }

    #[test]
    fn disabled_device_is_never_returned() {
        let mut a = m(r#"{"cpu:0": [["mlx5_1"], ["mlx5_2"]], "cpu:1": [["mlx5_2"], ["mlx5_1"]]}"#);
        let before = a.devices().to_vec();
        let gone = idx(&a, "mlx5_2");
        a.disable_device("mlx5_2");
        assert_eq!(a.devices(), before);
        for loc in ["cpu:0", "cpu:1", "*", "elsewhere"] {
            for retry in 0..20 {
                let d = a.select_device(loc, retry).expect("mlx5_1 remains");
                assert_ne!(d, gone, "{loc} retry {retry}");
                assert_eq!(d, idx(&a, "mlx5_1"));
            }
        }
    }

    #[test]
    fn explicit_wildcard_is_kept_as_written() {
        let a = m(r#"{"*": [["b"], []], "cpu:0": [["a"], ["b"]]}"#);
        for retry in 0..4 {
            assert_eq!(a.select_device("*", retry), Ok(idx(&a, "b")));
        }
    }

    fn rdma(name: &str, numa: Option<u32>, pci: &str, active: bool) -> RdmaDevice {
        RdmaDevice {
            name: name.into(),
            device: name.into(),
            port: 1,
            numa_node: numa,
            pci_bus_id: Some(pci.into()),
            ports_active: active,
        }
    }

    fn two_node_topology() -> Topology {
        Topology {
            numa_nodes: vec![0, 1],
            rdma_devices: vec![
                rdma("mlx5_0", Some(0), "0000:1a:00.0", true),
                rdma("mlx5_1", Some(1), "0000:8a:00.0", true),
                rdma("mlx5_2", Some(1), "0000:8b:00.0", true),
                rdma("mlx5_3", Some(0), "0000:1b:00.0", false),
            ],
            net_interfaces: Vec::new(),
            gpus: vec![
                Gpu {
                    index: 0,
                    name: "cuda0".into(),
                    numa_node: Some(1),
                    pci_bus_id: Some("0000:8c:00.0".into()),
                },
                Gpu {
                    index: 1,
                    name: "cuda1".into(),
                    numa_node: None,
                    pci_bus_id: None,
                },
            ],
        }
    }

    #[test]
    fn both_ports_of_a_dual_port_hca_are_rails_of_its_node() {
        let mut t = two_node_topology();
        let mut port2 = rdma("mlx5_0:2", Some(0), "0000:1a:00.0", true);
        port2.device = "mlx5_0".into();
        port2.port = 2;
        t.rdma_devices.insert(1, port2);
        let a = PriorityMatrix::build(&t, &rdma_nics(&t), &|_: &str, _: &str| Some(4));
        let (preferred, _) = a.entry("cpu:0").expect("entry");
        assert_eq!(preferred, ["mlx5_0", "mlx5_0:2"]);
        assert_eq!(a.devices(), ["mlx5_0", "mlx5_0:2", "mlx5_1", "mlx5_2"]);
    }

    #[test]
    fn from_topology_follows_numa_and_pci() {
        let t = two_node_topology();
        // Fake PCI distances: mlx5_2 sits next to GPU 0.
        let dist = |a: &str, b: &str| -> Option<usize> {
            Some(if (a, b) == ("0000:8c:00.0", "0000:8b:00.0") {
                2
            } else {
                4
            })
        };
        let a = PriorityMatrix::build(&t, &rdma_nics(&t), &dist);
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let e = |loc: &str| {
            let (p, v) = a.entry(loc).expect("entry");
            (p.to_vec(), v.to_vec())
        };
        assert_eq!(e("cpu:0"), (s(&["mlx5_0"]), s(&["mlx5_1", "mlx5_2"])));
        assert_eq!(e("cpu:1"), (s(&["mlx5_1", "mlx5_2"]), s(&["mlx5_0"])));
        assert_eq!(e("cuda:0"), (s(&["mlx5_2"]), s(&["mlx5_0", "mlx5_1"])));
        // Unknown GPU locality: nothing preferred, everything available.
        assert_eq!(e("cuda:1"), (s(&[]), s(&["mlx5_0", "mlx5_1", "mlx5_2"])));
        assert!(
            !a.devices().contains(&"mlx5_3".to_string()),
            "inactive ports are left out"
        );

        // Without PCI distances the GPU's NUMA node decides.
        let b = PriorityMatrix::build(&t, &rdma_nics(&t), &|_, _| None);
        let (p, _) = b.entry("cuda:0").expect("entry");
        assert_eq!(p, s(&["mlx5_1", "mlx5_2"]));

        // The public constructor gives the same CPU entries.
        let c = PriorityMatrix::from_topology(&t);
        assert_eq!(c.entry("cpu:1"), a.entry("cpu:1"));
        assert_eq!(m(&c.to_json().to_string()), c);
    }

    #[test]
    fn tcp_matrix_uses_up_non_loopback_interfaces() {
        let nic = |name: &str, numa, up, loopback| NetInterface {
            name: name.into(),
            numa_node: numa,
            pci_bus_id: None,
            addrs: Vec::new(),
            speed_mbps: None,
            up,
            loopback,
        };
        let t = Topology {
            numa_nodes: vec![0, 1],
            rdma_devices: Vec::new(),
            net_interfaces: vec![
                nic("lo", None, true, true),
                nic("eth0", Some(0), true, false),
                nic("eth1", Some(1), true, false),
                nic("eth2", Some(1), false, false),
            ],
            gpus: Vec::new(),
        };
        let a = PriorityMatrix::from_topology_tcp(&t);
        assert_eq!(a.devices(), ["eth0", "eth1"]);
        assert_eq!(
            a.to_json(),
            serde_json::json!({"cpu:0": [["eth0"], ["eth1"]], "cpu:1": [["eth1"], ["eth0"]]})
        );
        assert!(PriorityMatrix::from_topology(&t).is_empty());
    }
}
