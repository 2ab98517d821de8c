//! RDMA device listing through libibverbs (feature `rdma`), as Mooncake's
//! `listInfiniBandDevices`: every device the filters allow whose
//! `/dev/infiniband/<uverbs>` node is a read-write character device and that
//! opens. Each ACTIVE port with a GID table is a rail of its own (see
//! [`super::rails`]); a device without one is kept once with
//! `ports_active == false` so reports can show it; the priority matrix
//! leaves it out.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use super::RdmaDevice;
use super::rails::{RailFilter, rails_of};
use crate::verbs::{Context, device_names};

/// Each port of `ctx` and whether it is ACTIVE with a GID table.
fn port_states(ctx: &Context) -> Vec<(u8, bool)> {
    let name = ctx.name();
    let limits = match ctx.limits() {
        Ok(l) => l,
        Err(err) => {
            tracing::warn!("RDMA device {name}: ibv_query_device failed ({err}); skipping it");
            return Vec::new();
        }
    };
    let mut states = Vec::new();
    for port in 1..=limits.ports {
        let mut active = false;
        match ctx.port(port) {
            Err(err) => tracing::warn!("RDMA device {name}: querying port {port} failed ({err})"),
            Ok(p) if p.gid_table_len == 0 => {
                tracing::warn!("RDMA device {name}: port {port} has no GID table entries")
            }
            Ok(p) if !p.active => tracing::info!(
                "RDMA device {name}: port {port} is not active (state {})",
                p.state
            ),
            Ok(_) => {
                tracing::info!("RDMA device {name}: port {port} is active");
                active = true;
            }
        }
        states.push((port, active));
    }
    states
}

/// Whether `/dev/infiniband/<dev_name>` is a character device this process
/// may read and write.
fn char_dev_accessible(name: &str, dev_name: &str) -> bool {
    let path = Path::new("/dev/infiniband").join(dev_name);
    match std::fs::metadata(&path) {
        Err(e) => {
            tracing::warn!("RDMA device {name}: {} is missing ({e})", path.display());
            false
        }
        Ok(m) if !m.file_type().is_char_device() => {
            tracing::warn!(
                "RDMA device {name}: {} is not a character device",
                path.display()
            );
            false
        }
        Ok(_) => {
            let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
                return false;
            };
            // SAFETY: `c` is a valid NUL-terminated path for the call.
            let ok = unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) } == 0;
            if !ok {
                tracing::warn!(
                    "RDMA device {name}: {} is not readable and writable",
                    path.display()
                );
            }
            ok
        }
    }
}

/// Lists the RDMA rails `wanted` keeps; locality is filled by the caller.
pub(super) fn list_devices(wanted: &RailFilter<'_>) -> Vec<RdmaDevice> {
    let listed = device_names();
    if listed.is_empty() {
        tracing::debug!("libibverbs lists no RDMA devices");
    }
    let mut out = Vec::new();
    for (name, dev_name) in listed {
        if !wanted.device(&name) {
            tracing::info!("RDMA device {name}: skipped by the device filters");
            continue;
        }
        if !char_dev_accessible(&name, &dev_name) {
            continue;
        }
        let ctx = match Context::open(&name) {
            Ok(c) => c,
            Err(err) => {
                tracing::warn!("RDMA device {name}: cannot open it ({err}); skipping it");
                continue;
            }
        };
        let ports = port_states(&ctx);
        drop(ctx);
        let rails = rails_of(&name, &ports, wanted.ib_port());
        if !rails.iter().any(|r| r.2) {
            tracing::warn!("RDMA device {name}: no active port; it will not be selected");
        }
        out.extend(
            rails
                .into_iter()
                .filter(|(rail, _, _)| wanted.rail(rail))
                .map(|(rail, port, active)| RdmaDevice {
                    name: rail,
                    device: name.clone(),
                    port,
                    numa_node: None,
                    pci_bus_id: None,
                    ports_active: active,
                }),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_devices_here_is_not_an_error() {
        // The test machines have no RDMA: NULL/ENOSYS or an empty list.
        assert!(list_devices(&RailFilter::new(&[], &[], 1)).is_empty());
    }
}
