//! Registered memory of the RDMA transport: one memory region per buffer
//! and device, the keys published for them, and a count of the work
//! requests in flight on each buffer, so that a buffer is deregistered
//! only once the slices using it have ended.

use crate::error::{Error, Result};
use crate::sync;
use crate::verbs::{MemoryRegion, ProtectionDomain};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};
use tracing::warn;

/// One registered buffer: its region on each device (index order; `None`
/// where the device could not take it) and its in-flight count.
pub struct Registration {
    addr: u64,
    len: u64,
    remote: bool,
    /// Per device: (lkey, rkey) of its region.
    keys: Vec<Option<(u32, u32)>>,
    /// Deregistered when the buffer is unregistered, whoever still holds it.
    regions: Mutex<Vec<MemoryRegion>>,
    inflight: AtomicUsize,
    closing: AtomicBool,
    idle: Arc<(Mutex<()>, Condvar)>,
}

impl Registration {
    /// Local keys in device order (0 where the device has no region).
    pub fn lkeys(&self) -> Vec<u32> {
        self.keys.iter().map(|k| k.map_or(0, |k| k.0)).collect()
    }

    /// Remote keys in device order, or none when the buffer is not
    /// remotely accessible.
    pub fn rkeys(&self) -> Vec<u32> {
        if !self.remote {
            return Vec::new();
        }
        self.keys.iter().map(|k| k.map_or(0, |k| k.1)).collect()
    }
}

/// A work request's hold on a registration; released when dropped.
pub struct MrGuard {
    reg: Arc<Registration>,
}

impl Drop for MrGuard {
    fn drop(&mut self) {
        if self.reg.inflight.fetch_sub(1, Ordering::AcqRel) == 1
            && self.reg.closing.load(Ordering::Acquire)
        {
            let (lock, cv) = &*self.reg.idle;
            let _g = sync::lock(lock);
            cv.notify_all();
        }
    }
}

/// What registering a buffer needs of each device.
pub struct DeviceDomain<'a> {
    /// Device name, for errors.
    pub name: &'a str,
    /// Its protection domain; `None` for a device that is down.
    pub pd: Option<&'a Arc<ProtectionDomain>>,
}

/// Every registered buffer, by base address.
#[derive(Default)]
pub struct Registry {
    map: RwLock<BTreeMap<u64, Arc<Registration>>>,
    idle: Arc<(Mutex<()>, Condvar)>,
}

/// The process's locked-memory limit in bytes, for error messages.
fn memlock_limit() -> Option<u64> {
    // SAFETY: plain C data; all-zero is valid.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid resource id and out-pointer.
    (unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0).then_some(r.rlim_cur)
}

/// The error for a failed registration, naming `ulimit -l` when pinning
/// memory is what failed.
fn registration_error(device: &str, addr: u64, len: u64, e: std::io::Error) -> Error {
    let pinning = matches!(
        e.raw_os_error(),
        Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EAGAIN)
    );
    if pinning {
        let limit = match memlock_limit() {
            Some(l) if l == libc::RLIM_INFINITY => "unlimited".to_string(),
            Some(l) => format!("{} KiB", l / 1024),
            None => "unknown".to_string(),
        };
        Error::Memory(format!(
            "registering {len} bytes at {addr:#x} on {device} failed: {e}; the locked-memory \
             limit (ulimit -l) is {limit}: raise it (ulimit -l unlimited, LimitMEMLOCK=infinity \
             for a systemd service, --ulimit memlock=-1 for a container) or grant CAP_IPC_LOCK"
        ))
    } else {
        Error::Context(format!(
            "registering {len} bytes at {addr:#x} on {device} failed: {e}"
        ))
    }
}

impl Registry {
    /// Registers `[addr, addr + len)` on every device that is up.
    /// All-or-nothing: a failure on one device deregisters the others.
    ///
    /// # Safety
    /// The range must be mapped memory of this process that stays mapped
    /// until [`Registry::unregister`] returns for it.
    pub unsafe fn register(
        &self,
        devices: &[DeviceDomain<'_>],
        addr: u64,
        len: u64,
        remote: bool,
        relaxed: bool,
        max_mr_size: u64,
    ) -> Result<Arc<Registration>> {
        if len > max_mr_size {
            return Err(Error::InvalidArgument(format!(
                "buffer {addr:#x} of {len} bytes exceeds the largest memory region of \
                 {max_mr_size} bytes (device limit or MC_MAX_MR_SIZE)"
            )));
        }
        let mut regions = Vec::with_capacity(devices.len());
        let mut keys = Vec::with_capacity(devices.len());
        for d in devices {
            match d.pd {
                None => keys.push(None),
                // SAFETY: guaranteed by the caller.
                Some(pd) => match unsafe { MemoryRegion::register(pd, addr, len, remote, relaxed) }
                {
                    Ok(mr) => {
                        keys.push(Some((mr.lkey(), mr.rkey())));
                        regions.push(mr);
                    }
                    Err(e) => return Err(registration_error(d.name, addr, len, e)),
                },
            }
        }
        let reg = Arc::new(Registration {
            addr,
            len,
            remote,
            keys,
            regions: Mutex::new(regions),
            inflight: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            idle: self.idle.clone(),
        });
        sync::write(&self.map).insert(addr, reg.clone());
        Ok(reg)
    }

    /// The registration at exactly `addr`.
    pub fn get(&self, addr: u64) -> Option<Arc<Registration>> {
        sync::read(&self.map).get(&addr).cloned()
    }

    /// The local key on device `dev` for `[addr, addr + len)` and a hold
    /// on its registration; `None` if no live registration covers it.
    pub fn hold(&self, addr: u64, len: u64, dev: usize) -> Option<(u32, MrGuard)> {
        let map = sync::read(&self.map);
        let (_, reg) = map.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        if addr < reg.addr || end > reg.addr + reg.len {
            return None;
        }
        let lkey = reg.keys.get(dev).copied().flatten()?.0;
        reg.inflight.fetch_add(1, Ordering::AcqRel);
        Some((lkey, MrGuard { reg: reg.clone() }))
    }

    /// Removes the buffer at `addr`: no new work request takes it; waits
    /// (up to `wait`) until those in flight end, then deregisters it on
    /// every device. Returns whether a buffer was registered there.
    pub fn unregister(&self, addr: u64, wait: Duration) -> bool {
        let Some(reg) = sync::write(&self.map).remove(&addr) else {
            return false;
        };
        reg.closing.store(true, Ordering::Release);
        let deadline = Instant::now() + wait;
        let (lock, cv) = &*self.idle;
        let mut g = sync::lock(lock);
        while reg.inflight.load(Ordering::Acquire) > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                warn!(
                    "buffer {addr:#x}: {} work request(s) still in flight after {wait:?}; \
                     deregistering it now (they fail)",
                    reg.inflight.load(Ordering::Acquire)
                );
                break;
            }
            g = cv
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        // Deregistered now even if a work request still holds the buffer:
        // from here on the devices cannot touch it (such a request fails).
        std::mem::take(&mut *sync::lock(&reg.regions));
        true
    }

    /// Deregisters every buffer (shutdown, after every queue pair is gone).
    pub fn clear(&self) {
        let all = std::mem::take(&mut *sync::write(&self.map));
        for reg in all.values() {
            std::mem::take(&mut *sync::lock(&reg.regions));
        }
    }
}
