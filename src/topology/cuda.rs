//! CUDA's device numbering: `cuda:N` is the N-th device the CUDA runtime
//! shows this process, which Mooncake asks the runtime for
//! (`cudaPointerGetAttributes`). Without linking CUDA we derive it the way
//! the runtime does from the GPUs on PCI:
//!
//! - `CUDA_DEVICE_ORDER=PCI_BUS_ID` enumerates them in PCI bus order;
//!   `FASTEST_FIRST` (CUDA's default) fastest first, ties in PCI bus order.
//!   Speed needs the driver: when every GPU is the same model (the PCI
//!   device id in sysfs), fastest-first is PCI bus order; otherwise we warn
//!   once and use PCI bus order (set `CUDA_DEVICE_ORDER=PCI_BUS_ID` to make
//!   the numbering exact).
//! - `CUDA_VISIBLE_DEVICES` unset shows every device; empty shows none; a
//!   comma list of indexes into that order, or of GPU UUIDs (`GPU-…`, a
//!   unique prefix is enough; mapped through the NVIDIA driver's
//!   `/proc/driver/nvidia/gpus/<pci>/information`), shows those, in the
//!   list's order, up to the first entry that names no device or one
//!   already listed (the runtime ignores the rest). A UUID or MIG entry we
//!   cannot map (no driver information) is warned about once, and every
//!   GPU is numbered in PCI bus order instead.

use super::{Gpu, TopologyConfig};
use std::path::Path;
use std::sync::Once;

/// The process's CUDA device variables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct CudaEnv {
    /// `CUDA_VISIBLE_DEVICES`, if set.
    pub(super) visible: Option<String>,
    /// `CUDA_DEVICE_ORDER`, if set.
    pub(super) order: Option<String>,
}

impl CudaEnv {
    /// The variables as the configuration read them.
    pub(super) fn of(config: &TopologyConfig) -> CudaEnv {
        CudaEnv {
            visible: config.cuda_visible_devices.clone(),
            order: config.cuda_device_order.clone(),
        }
    }
}

/// What is known of a GPU on PCI besides its locality.
pub(super) trait GpuFacts {
    /// Its UUID (`GPU-…`), from the driver.
    fn uuid(&self, pci: &str) -> Option<String>;
    /// Its model: the PCI device id.
    fn model(&self, pci: &str) -> Option<String>;
}

/// The facts of this machine: sysfs and the NVIDIA driver's procfs.
pub(super) struct SystemFacts;

impl GpuFacts for SystemFacts {
    fn uuid(&self, pci: &str) -> Option<String> {
        uuid_in(Path::new("/proc/driver/nvidia/gpus"), pci)
    }

    fn model(&self, pci: &str) -> Option<String> {
        let p = Path::new("/sys/bus/pci/devices").join(pci).join("device");
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    }
}

/// The `GPU UUID:` line of `<dir>/<pci>/information`.
fn uuid_in(dir: &Path, pci: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(pci).join("information")).ok()?;
    text.lines().find_map(|l| {
        let v = l.strip_prefix("GPU UUID:")?.trim();
        (!v.is_empty()).then(|| v.to_string())
    })
}

fn warn_once(once: &'static Once, msg: String) {
    once.call_once(|| tracing::warn!("{msg}"));
}

/// Numbers `gpus` (those on PCI, in any order) as the CUDA runtime would
/// under `env`: the visible ones, each with its CUDA index.
pub(super) fn cuda_numbering(mut gpus: Vec<Gpu>, env: &CudaEnv, facts: &dyn GpuFacts) -> Vec<Gpu> {
    static MIXED: Once = Once::new();
    static UNMAPPED: Once = Once::new();
    // PCI bus order (addresses compare as they sort: fixed-width hex).
    gpus.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    let pci_order = env
        .order
        .as_deref()
        .is_some_and(|o| o.trim().eq_ignore_ascii_case("PCI_BUS_ID"));
    if !pci_order && gpus.len() > 1 {
        let models: Vec<Option<String>> = gpus
            .iter()
            .map(|g| g.pci_bus_id.as_deref().and_then(|p| facts.model(p)))
            .collect();
        if models.iter().any(|m| m.is_none() || *m != models[0]) {
            warn_once(
                &MIXED,
                "CUDA_DEVICE_ORDER is FASTEST_FIRST (CUDA's default) and the GPUs are not all \
                 the same model: without the driver their speed is unknown, so cuda:N follows \
                 PCI bus order; set CUDA_DEVICE_ORDER=PCI_BUS_ID to make it exact"
                    .into(),
            );
        }
    }
    let numbered = |gpus: Vec<Gpu>| -> Vec<Gpu> {
        gpus.into_iter()
            .zip(0u32..)
            .map(|(g, index)| Gpu { index, ..g })
            .collect()
    };
    let Some(visible) = env.visible.as_deref() else {
        return numbered(gpus);
    };
    let mut chosen: Vec<usize> = Vec::new();
    for entry in visible.split(',').map(str::trim) {
        let found = if let Ok(i) = entry.parse::<usize>() {
            (i < gpus.len()).then_some(i)
        } else if entry.starts_with("GPU-") || entry.starts_with("MIG-") {
            let uuids: Vec<Option<String>> = gpus
                .iter()
                .map(|g| g.pci_bus_id.as_deref().and_then(|p| facts.uuid(p)))
                .collect();
            if entry.starts_with("MIG-") || uuids.iter().any(Option::is_none) {
                warn_once(
                    &UNMAPPED,
                    format!(
                        "CUDA_VISIBLE_DEVICES={visible} names {entry}, which cannot be mapped to \
                         a PCI device without the NVIDIA driver's GPU information; cuda:N \
                         follows PCI bus order over every GPU instead"
                    ),
                );
                return numbered(gpus);
            }
            let mut hits = uuids
                .iter()
                .enumerate()
                .filter(|(_, u)| u.as_deref().is_some_and(|u| u.starts_with(entry)));
            match (hits.next(), hits.next()) {
                (Some((i, _)), None) => Some(i),
                _ => None,
            }
        } else {
            None
        };
        match found {
            Some(i) if !chosen.contains(&i) => chosen.push(i),
            // The runtime stops at the first entry it cannot use.
            _ => break,
        }
    }
    let mut slots: Vec<Option<Gpu>> = gpus.into_iter().map(Some).collect();
    numbered(chosen.into_iter().filter_map(|i| slots[i].take()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Fake {
        uuids: HashMap<&'static str, &'static str>,
        models: HashMap<&'static str, &'static str>,
    }

    impl GpuFacts for Fake {
        fn uuid(&self, pci: &str) -> Option<String> {
            self.uuids.get(pci).map(|s| s.to_string())
        }

        fn model(&self, pci: &str) -> Option<String> {
            self.models.get(pci).map(|s| s.to_string())
        }
    }

    const PCI: [&str; 4] = [
        "0000:1b:00.0",
        "0000:3d:00.0",
        "0000:9c:00.0",
        "0000:bb:00.0",
    ];

    /// Four GPUs, listed out of bus order, all the same model, with UUIDs.
    fn machine() -> (Vec<Gpu>, Fake) {
        let gpus = [2usize, 0, 3, 1]
            .iter()
            .map(|&i| Gpu {
                index: 99,
                name: PCI[i].into(),
                numa_node: Some(u32::from(i >= 2)),
                pci_bus_id: Some(PCI[i].into()),
            })
            .collect();
        let fake = Fake {
            uuids: PCI
                .iter()
                .zip(["GPU-aaaa-1", "GPU-bbbb-2", "GPU-cccc-3", "GPU-ab-4"])
                .map(|(p, u)| (*p, u))
                .collect(),
            models: PCI.iter().map(|p| (*p, "0x20b2")).collect(),
        };
        (gpus, fake)
    }

    /// The PCI addresses of the numbered GPUs, checking the indexes.
    fn order(visible: Option<&str>, order: Option<&str>, facts: &Fake) -> Vec<&'static str> {
        let env = CudaEnv {
            visible: visible.map(String::from),
            order: order.map(String::from),
        };
        let out = cuda_numbering(machine().0, &env, facts);
        for (i, g) in out.iter().enumerate() {
            assert_eq!(g.index as usize, i, "{out:?}");
        }
        out.iter()
            .map(|g| {
                *PCI.iter()
                    .find(|p| Some(**p) == g.pci_bus_id.as_deref())
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn visible_devices_pick_and_order_the_gpus() {
        let (_, f) = machine();
        // Unset: every GPU, in PCI bus order (one model: also fastest first).
        assert_eq!(order(None, None, &f), PCI);
        assert_eq!(order(None, Some("PCI_BUS_ID"), &f), PCI);
        // Empty: none.
        assert!(order(Some(""), None, &f).is_empty());
        assert!(order(Some("  "), None, &f).is_empty());
        // Indexes, in the list's order: cuda:0 is the GPU on 0000:9c.
        assert_eq!(order(Some("2,0"), None, &f), [PCI[2], PCI[0]]);
        assert_eq!(order(Some(" 3 , 1"), None, &f), [PCI[3], PCI[1]]);
        // The runtime stops at an entry it cannot use.
        assert_eq!(order(Some("1,7,0"), None, &f), [PCI[1]]);
        assert_eq!(order(Some("1,x,0"), None, &f), [PCI[1]]);
        assert_eq!(order(Some("1,1,0"), None, &f), [PCI[1]]);
        assert!(order(Some("-1"), None, &f).is_empty());
        // UUIDs and unique prefixes of them; an ambiguous prefix stops.
        assert_eq!(
            order(Some("GPU-cccc-3,GPU-bbbb"), None, &f),
            [PCI[2], PCI[1]]
        );
        assert_eq!(order(Some("GPU-ab-4,0"), None, &f), [PCI[3], PCI[0]]);
        assert_eq!(order(Some("2,GPU-a"), None, &f), [PCI[2]]);
        assert_eq!(order(Some("GPU-ffff"), None, &f), Vec::<&str>::new());
    }

    #[test]
    fn without_the_driver_uuids_fall_back_to_bus_order() {
        let (_, mut f) = machine();
        f.uuids.clear();
        assert_eq!(order(Some("GPU-cccc-3"), None, &f), PCI);
        assert_eq!(order(Some("MIG-1234"), None, &f), PCI);
        // Indexes need no driver.
        assert_eq!(order(Some("3"), None, &f), [PCI[3]]);
    }

    #[test]
    fn mixed_models_keep_bus_order_for_fastest_first() {
        let (_, mut f) = machine();
        f.models.insert(PCI[1], "0x2330");
        assert_eq!(order(None, None, &f), PCI);
        assert_eq!(
            order(Some("1,0"), Some("FASTEST_FIRST"), &f),
            [PCI[1], PCI[0]]
        );
    }

    #[test]
    fn the_driver_information_gives_the_uuid() {
        let dir = std::env::temp_dir().join(format!("te-cuda-{}", std::process::id()));
        let gpu = dir.join("0000:1b:00.0");
        std::fs::create_dir_all(&gpu).unwrap();
        std::fs::write(
            gpu.join("information"),
            "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\n\
             GPU UUID: \t GPU-5f1c2a3b-0000-1111-2222-333344445555\nVideo BIOS: \t ??\n",
        )
        .unwrap();
        assert_eq!(
            uuid_in(&dir, "0000:1b:00.0").as_deref(),
            Some("GPU-5f1c2a3b-0000-1111-2222-333344445555")
        );
        assert_eq!(uuid_in(&dir, "0000:3d:00.0"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
