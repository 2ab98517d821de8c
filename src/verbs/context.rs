//! Devices and device contexts: listing, opening, device and port
//! attributes, the GID table, and asynchronous events.

use super::library::{
    ___ibv_query_port, ibv_ack_async_event, ibv_close_device, ibv_free_device_list,
    ibv_get_async_event, ibv_get_device_list, ibv_get_device_name, ibv_open_device,
    ibv_query_device, ibv_query_gid,
};
use super::{Gid, check, set_nonblocking};
use rdma_sys::{ibv_async_event, ibv_context, ibv_device, ibv_device_attr, ibv_gid, ibv_port_attr};
use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;

/// The array `ibv_get_device_list` returns, freed on drop.
struct DeviceList {
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// The device list; empty when verbs reports none (NULL with errno,
    /// e.g. ENOSYS or ENODEV on a kernel without InfiniBand support).
    fn get() -> Option<DeviceList> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer; a non-NULL result is owned by
        // the returned value and freed in `drop`.
        let raw = unsafe { ibv_get_device_list(&mut n) };
        let Some(list) = NonNull::new(raw) else {
            let err = io::Error::last_os_error();
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
        // SAFETY: `list` came from `ibv_get_device_list` and is freed once.
        // Contexts opened from its entries stay valid after the list is
        // freed (libibverbs keeps the devices referenced by open contexts).
        unsafe { ibv_free_device_list(self.list.as_ptr()) };
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

/// The name of a listed device (`mlx5_0`) and its uverbs node (`uverbs0`).
fn names(dev: NonNull<ibv_device>) -> Option<(String, String)> {
    // SAFETY: `dev` is a live entry of a device list; the returned name is
    // NULL or a NUL-terminated string inside the device struct.
    let name_ptr = unsafe { ibv_get_device_name(dev.as_ptr()) };
    if name_ptr.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated, alive while the list is.
    let name = unsafe { CStr::from_ptr(name_ptr) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: `dev` points to a live `ibv_device`; `dev_name` is a
    // fixed-size array inside it.
    let dev_name = c_field(unsafe { &(*dev.as_ptr()).dev_name });
    Some((name, dev_name))
}

/// Every device libibverbs lists: (device name, uverbs node name).
pub fn device_names() -> Vec<(String, String)> {
    let Some(list) = DeviceList::get() else {
        return Vec::new();
    };
    list.devices().filter_map(names).collect()
}

/// Limits of a device (`ibv_query_device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Queue pairs.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Entries per completion queue.
    pub max_cqe: u32,
    /// Outstanding RDMA READs a queue pair may issue.
    pub max_qp_init_rd_atom: u32,
    /// Outstanding RDMA READs a queue pair may serve.
    pub max_qp_rd_atom: u32,
    /// Number of physical ports.
    pub ports: u8,
}

/// The state of one port (`ibv_query_port`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    /// Whether the port is ACTIVE.
    pub active: bool,
    /// Active MTU as an `ibv_mtu` value (1..=5).
    pub active_mtu: u32,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Entries in the GID table.
    pub gid_table_len: u32,
    /// Raw port state, for logs.
    pub state: u32,
}

/// Kinds of asynchronous events the transport reacts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEventKind {
    /// A queue pair hit a fatal error (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR).
    QpError,
    /// A completion queue overran.
    CqError,
    /// The device is unusable.
    DeviceFatal,
    /// A port went down.
    PortError,
    /// A port became active.
    PortActive,
    /// A port's GID table changed.
    GidChange,
    /// LID or P_Key changed, SM changed, client reregister.
    PortChange,
    /// Anything else (SRQ, WQ, path migration, communication established).
    Other,
}

/// One asynchronous event, already acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// The raw `ibv_event_type`.
    pub raw: u32,
    /// The port, for port events.
    pub port: Option<u8>,
    /// The queue pair number, for queue pair events.
    pub qp_num: Option<u32>,
}

/// An open device context, closed on drop.
pub struct Context {
    ptr: NonNull<ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts are thread-safe: every verb on them may be
// called from any thread.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Context({})", self.name)
    }
}

impl Context {
    /// Opens the device named `name`, with its asynchronous event fd made
    /// non-blocking. Fails with `NotFound` if no such device is listed.
    pub fn open(name: &str) -> io::Result<Context> {
        let list = DeviceList::get().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no RDMA devices on this machine")
        })?;
        let dev = list
            .devices()
            .find(|d| names(*d).is_some_and(|(n, _)| n == name))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no RDMA device named {name}"),
                )
            })?;
        // SAFETY: `dev` is an entry of the live list.
        let raw = unsafe { ibv_open_device(dev.as_ptr()) };
        let ptr = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        let ctx = Context {
            ptr,
            name: name.to_string(),
        };
        set_nonblocking(ctx.async_fd())?;
        Ok(ctx)
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn as_ptr(&self) -> *mut ibv_context {
        self.ptr.as_ptr()
    }

    /// The device's limits.
    pub fn limits(&self) -> io::Result<DeviceLimits> {
        // SAFETY: `ibv_device_attr` is plain C data; all-zero is valid.
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `a` is a valid out-pointer.
        check(unsafe { ibv_query_device(self.as_ptr(), &mut a) })?;
        let u = |v: libc::c_int| u32::try_from(v).unwrap_or(0);
        Ok(DeviceLimits {
            max_mr_size: a.max_mr_size,
            max_qp: u(a.max_qp),
            max_qp_wr: u(a.max_qp_wr),
            max_sge: u(a.max_sge),
            max_cqe: u(a.max_cqe),
            max_qp_init_rd_atom: u(a.max_qp_init_rd_atom),
            max_qp_rd_atom: u(a.max_qp_rd_atom),
            ports: a.phys_port_cnt,
        })
    }

    /// The state of port `port` (1-based).
    pub fn port(&self, port: u8) -> io::Result<PortInfo> {
        // SAFETY: `ibv_port_attr` is plain C data; all-zero is valid.
        let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `pa` is a valid out-pointer of the
        // full struct size (the wrapper passes that size to the provider).
        check(unsafe { ___ibv_query_port(self.as_ptr(), port, &mut pa) })?;
        Ok(PortInfo {
            active: pa.state == rdma_sys::ibv_port_state::IBV_PORT_ACTIVE,
            active_mtu: pa.active_mtu,
            lid: pa.lid,
            gid_table_len: u32::try_from(pa.gid_tbl_len).unwrap_or(0),
            state: pa.state,
        })
    }

    /// Entry `index` of port `port`'s GID table.
    pub fn gid(&self, port: u8, index: u32) -> io::Result<Gid> {
        let index =
            libc::c_int::try_from(index).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `ibv_gid` is a union of plain bytes; all-zero is valid.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `gid` is a valid out-pointer.
        check(unsafe { ibv_query_gid(self.as_ptr(), port, index, &mut gid) })?;
        // SAFETY: every bit pattern of the union is a valid byte array.
        Ok(unsafe { gid.raw })
    }

    /// The descriptor that becomes readable when an asynchronous event
    /// is pending.
    pub fn async_fd(&self) -> RawFd {
        // SAFETY: the context is open; `async_fd` is a plain field.
        unsafe { (*self.as_ptr()).async_fd }
    }

    /// Takes and acknowledges one pending asynchronous event; `None` when
    /// there is none (the fd is non-blocking).
    pub fn next_async_event(&self) -> io::Result<Option<AsyncEvent>> {
        // SAFETY: plain C data; all-zero is valid.
        let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `ev` is a valid out-pointer.
        if unsafe { ibv_get_async_event(self.as_ptr(), &mut ev) } != 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: read the event type as the C enum's underlying u32, so a
        // value newer than our bindings is not an invalid Rust enum.
        let raw = unsafe { std::ptr::addr_of!(ev.event_type).cast::<u32>().read() };
        let kind = match raw {
            1..=3 => AsyncEventKind::QpError,
            0 => AsyncEventKind::CqError,
            8 => AsyncEventKind::DeviceFatal,
            10 => AsyncEventKind::PortError,
            9 => AsyncEventKind::PortActive,
            18 => AsyncEventKind::GidChange,
            11..=13 | 17 => AsyncEventKind::PortChange,
            _ => AsyncEventKind::Other,
        };
        let (mut port, mut qp_num) = (None, None);
        match kind {
            AsyncEventKind::QpError => {
                // SAFETY: for QP events the union holds the QP pointer,
                // which stays valid until the event is acknowledged below.
                let qp = unsafe { ev.element.qp };
                if !qp.is_null() {
                    // SAFETY: as above.
                    qp_num = Some(unsafe { (*qp).qp_num });
                }
            }
            AsyncEventKind::PortError
            | AsyncEventKind::PortActive
            | AsyncEventKind::GidChange
            | AsyncEventKind::PortChange => {
                // SAFETY: for port events the union holds the port number.
                port = u8::try_from(unsafe { ev.element.port_num }).ok();
            }
            _ => {}
        }
        // SAFETY: `ev` came from `ibv_get_async_event` and is acknowledged
        // exactly once.
        unsafe { ibv_ack_async_event(&mut ev) };
        Ok(Some(AsyncEvent {
            kind,
            raw,
            port,
            qp_num,
        }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context was opened by `ibv_open_device`, every child
        // (PD, CQ, channel) holds an `Arc` to it and is gone, and it is
        // closed exactly once.
        if unsafe { ibv_close_device(self.as_ptr()) } != 0 {
            tracing::warn!(
                "ibv_close_device({}) failed: {}",
                self.name,
                io::Error::last_os_error()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_devices_is_an_empty_list() {
        // The host has no RDMA (ENOSYS/ENODEV); inside the test VM every
        // listed device has a name.
        for (name, node) in device_names() {
            assert!(
                !name.is_empty() && node.starts_with("uverbs"),
                "{name} {node}"
            );
        }
        assert!(Context::open("no_such_device_0").is_err());
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
