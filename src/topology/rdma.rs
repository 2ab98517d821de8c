//! RDMA device listing through libibverbs (feature `rdma`), as Mooncake's
//! `listInfiniBandDevices`: every device the filters allow whose
//! `/dev/infiniband/<uverbs>` node is a read-write character device and that
//! opens. Devices without an ACTIVE port (with a GID table) are kept with
//! `ports_active == false` so reports can show them; the priority matrix
//! leaves them out.

use std::ffi::CStr;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::ptr::NonNull;

use rdma_sys::{
    ___ibv_query_port, ibv_close_device, ibv_context, ibv_device, ibv_device_attr,
    ibv_free_device_list, ibv_get_device_list, ibv_get_device_name, ibv_open_device, ibv_port_attr,
    ibv_port_state, ibv_query_device,
};

use super::RdmaDevice;

/// The array `ibv_get_device_list` returns, freed on drop.
struct DeviceList {
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// The device list, or `None` when verbs reports no devices (NULL with
    /// errno, e.g. ENOSYS on a kernel without InfiniBand).
    fn get() -> Option<DeviceList> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer; a non-NULL result is owned by
        // the returned value and freed in `drop`.
        let raw = unsafe { ibv_get_device_list(&mut n) };
        let Some(list) = NonNull::new(raw) else {
            let err = std::io::Error::last_os_error();
            tracing::debug!("ibv_get_device_list returned NULL ({err}); no RDMA devices");
            return None;
        };
        Some(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    fn devices(&self) -> impl Iterator<Item = NonNull<ibv_device>> + '_ {
        (0..self.len).filter_map(|i| {
            // SAFETY: the list holds `len` valid entries (then a NULL
            // terminator) until it is freed in `drop`.
            NonNull::new(unsafe { *self.list.as_ptr().add(i) })
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `list` came from `ibv_get_device_list` and is freed once;
        // every context opened from it was closed before (contexts do not
        // outlive `probe`).
        unsafe { ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// An open device context, closed on drop.
struct Context(NonNull<ibv_context>);

impl Context {
    fn open(dev: NonNull<ibv_device>) -> Option<Context> {
        // SAFETY: `dev` is an entry of a live device list.
        NonNull::new(unsafe { ibv_open_device(dev.as_ptr()) }).map(Context)
    }

    /// Whether some port is ACTIVE and has a GID table.
    fn has_active_port(&self, name: &str) -> bool {
        // SAFETY: `ibv_device_attr` is plain C data; all-zero is valid.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `attr` is a valid out-pointer.
        if unsafe { ibv_query_device(self.0.as_ptr(), &mut attr) } != 0 {
            let err = std::io::Error::last_os_error();
            tracing::warn!("RDMA device {name}: ibv_query_device failed ({err}); skipping it");
            return false;
        }
        let mut active = false;
        for port in 1..=attr.phys_port_cnt {
            // SAFETY: `ibv_port_attr` is plain C data; all-zero is valid.
            let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
            // SAFETY: the context is open, `port` is within its port count
            // and `pa` is a valid out-pointer of the full struct size.
            if unsafe { ___ibv_query_port(self.0.as_ptr(), port, &mut pa) } != 0 {
                let err = std::io::Error::last_os_error();
                tracing::warn!("RDMA device {name}: querying port {port} failed ({err})");
            } else if pa.gid_tbl_len == 0 {
                tracing::warn!("RDMA device {name}: port {port} has no GID table entries");
            } else if pa.state != ibv_port_state::IBV_PORT_ACTIVE {
                tracing::info!(
                    "RDMA device {name}: port {port} is not active (state {})",
                    pa.state
                );
            } else {
                tracing::info!("RDMA device {name}: port {port} is active");
                active = true;
            }
        }
        active
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context was opened by `ibv_open_device`, nothing else
        // holds it, and it is closed exactly once.
        if unsafe { ibv_close_device(self.0.as_ptr()) } != 0 {
            tracing::warn!(
                "ibv_close_device failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
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

/// Reads a fixed-size C name field up to its NUL.
fn c_field(field: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = field
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Lists the RDMA devices `wanted` accepts; locality is filled by the caller.
pub(super) fn list_devices(wanted: &dyn Fn(&str) -> bool) -> Vec<RdmaDevice> {
    let Some(list) = DeviceList::get() else {
        return Vec::new();
    };
    if list.len == 0 {
        tracing::debug!("libibverbs lists no RDMA devices");
    }
    let mut out = Vec::new();
    for dev in list.devices() {
        // SAFETY: `dev` is a live entry; the returned name is NULL or a
        // NUL-terminated string inside the device struct.
        let name_ptr = unsafe { ibv_get_device_name(dev.as_ptr()) };
        if name_ptr.is_null() {
            continue;
        }
        // SAFETY: non-NULL, NUL-terminated, alive while the list is.
        let name = unsafe { CStr::from_ptr(name_ptr) }
            .to_string_lossy()
            .into_owned();
        if !wanted(&name) {
            tracing::info!("RDMA device {name}: skipped by the device filters");
            continue;
        }
        // SAFETY: `dev` points to a live `ibv_device`; `dev_name` is a
        // fixed-size array inside it.
        let dev_name = c_field(unsafe { &(*dev.as_ptr()).dev_name });
        if !char_dev_accessible(&name, &dev_name) {
            continue;
        }
        let Some(ctx) = Context::open(dev) else {
            let err = std::io::Error::last_os_error();
            tracing::warn!("RDMA device {name}: cannot open it ({err}); skipping it");
            continue;
        };
        let ports_active = ctx.has_active_port(&name);
        drop(ctx);
        if !ports_active {
            tracing::warn!("RDMA device {name}: no active port; it will not be selected");
        }
        out.push(RdmaDevice {
            name,
            numa_node: None,
            pci_bus_id: None,
            ports_active,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_devices_here_is_not_an_error() {
        // The test machines have no RDMA: NULL/ENOSYS or an empty list.
        assert!(list_devices(&|_| true).is_empty());
    }

    #[test]
    fn c_fields_stop_at_nul() {
        let mut f = [0 as libc::c_char; 8];
        for (d, s) in f.iter_mut().zip(b"uverbs0") {
            *d = *s as libc::c_char;
        }
        assert_eq!(c_field(&f), "uverbs0");
        assert_eq!(c_field(&[0; 4]), "");
    }
}
