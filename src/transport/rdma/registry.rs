//! Registered memory of the RDMA transport: the memory regions of each
//! buffer on each device, the keys published for them, and a count of the
//! work requests in flight on each buffer, so that a buffer is
//! deregistered only once the slices using it have ended.
//!
//! A buffer larger than the devices' largest memory region is registered
//! as consecutive pieces of at most that size (Mooncake's split): each
//! piece has its own region and keys on every device and is published as
//! a buffer entry of its own, and a work request stays inside one piece.

use crate::error::{Error, Result};
use crate::sync;
use crate::verbs::{MemoryRegion, ProtectionDomain};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How a buffer of GPU memory is registered with the RDMA devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GpuPath {
    /// `ibv_reg_mr` on its address, which the NIC driver resolves through
    /// the nvidia-peermem kernel module.
    PeerMem,
    /// `ibv_reg_mr` on a dma-buf the CUDA driver exports
    /// (`cuMemGetHandleForAddressRange`, `ibv_reg_dmabuf_mr`): no kernel
    /// module needed.
    DmaBuf,
}

impl std::fmt::Display for GpuPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GpuPath::PeerMem => "nvidia-peermem (ibv_reg_mr)",
            GpuPath::DmaBuf => "dma-buf (cuMemGetHandleForAddressRange, ibv_reg_dmabuf_mr)",
        })
    }
}

impl GpuPath {
    /// nvidia-peermem where it is loaded (the path every NIC driver
    /// knows), else dma-buf where libibverbs registers one, else
    /// nvidia-peermem still (whose failure then names both).
    fn choose(peermem_loaded: bool, dmabuf_verbs: bool) -> GpuPath {
        if !peermem_loaded && dmabuf_verbs {
            GpuPath::DmaBuf
        } else {
            GpuPath::PeerMem
        }
    }

    /// The path for this host.
    fn here() -> GpuPath {
        GpuPath::choose(
            std::path::Path::new("/sys/module/nvidia_peermem").exists(),
            crate::verbs::has_reg_dmabuf_mr(),
        )
    }
}

/// Buffers at least this large are registered on the devices in parallel
/// when `MC_ENABLE_PARALLEL_REG_MR` is left automatic (Mooncake's rule).
const PARALLEL_REG_MIN: u64 = 4 << 30;

/// One memory region's worth of a buffer: its range and, per device (in
/// device order; `None` where the device has no region), its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Per device: (lkey, rkey) of its region.
    keys: Vec<Option<(u32, u32)>>,
}

/// One registered buffer: its pieces (one unless it is larger than the
/// devices' largest memory region) and its in-flight count.
pub struct Registration {
    addr: u64,
    len: u64,
    remote: bool,
    pieces: Vec<Piece>,
    /// Deregistered when the buffer is unregistered, whoever still holds it.
    regions: Mutex<Vec<MemoryRegion>>,
    inflight: AtomicUsize,
    closing: AtomicBool,
    idle: Arc<(Mutex<()>, Condvar)>,
}

impl Registration {
    /// The pieces, by address; together they cover the buffer.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// Whether peers may read and write it.
    pub fn remote(&self) -> bool {
        self.remote
    }

    /// The piece holding `addr` (inside the buffer).
    fn piece(&self, addr: u64) -> Option<&Piece> {
        let i = self.pieces.partition_point(|p| p.end() <= addr);
        self.pieces.get(i).filter(|p| p.addr <= addr)
    }
}

impl Piece {
    /// One past the last byte.
    fn end(&self) -> u64 {
        self.addr + self.len
    }

    /// Local keys in device order (0 where the device has no region).
    pub fn lkeys(&self) -> Vec<u32> {
        self.keys.iter().map(|k| k.map_or(0, |k| k.0)).collect()
    }

    /// Remote keys in device order, or none when the buffer is not
    /// remotely accessible.
    pub fn rkeys(&self, remote: bool) -> Vec<u32> {
        if !remote {
            return Vec::new();
        }
        self.keys.iter().map(|k| k.map_or(0, |k| k.1)).collect()
    }
}

/// `[addr, addr + len)` cut into consecutive pieces of at most `max` bytes.
fn split(addr: u64, len: u64, max: u64) -> Vec<(u64, u64)> {
    let max = max.max(1);
    let mut out = Vec::with_capacity(len.div_ceil(max) as usize);
    let mut off = 0;
    while off < len {
        let n = max.min(len - off);
        out.push((addr + off, n));
        off += n;
    }
    out
}

/// How a buffer is registered on the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterOptions {
    /// Remote read and write.
    pub remote: bool,
    /// Relaxed ordering where the device supports it.
    pub relaxed: bool,
    /// Largest memory region of the devices (`MC_MAX_MR_SIZE` and theirs).
    pub max_mr_size: u64,
    /// `MC_ENABLE_PARALLEL_REG_MR`.
    pub parallel: Option<bool>,
    /// `MC_MAX_CONCURRENT_REG_MR` (0: one thread per device).
    pub max_concurrent: usize,
}

impl RegisterOptions {
    /// How many registrations run at once for a buffer of `len` bytes on
    /// `devices` devices of a machine with `cpus` CPUs (1: one after
    /// another): in parallel one thread per device, or
    /// `MC_MAX_CONCURRENT_REG_MR` threads.
    fn threads(&self, len: u64, devices: usize, cpus: usize) -> usize {
        let parallel = match self.parallel {
            Some(p) => p,
            None => devices > 1 && len >= PARALLEL_REG_MIN && cpus >= 4,
        };
        match (parallel, self.max_concurrent) {
            (false, _) => 1,
            (true, 0) => devices.max(1),
            (true, cap) => cap,
        }
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
    /// Registers `[addr, addr + len)` on every device that is up, in
    /// pieces of at most `opts.max_mr_size` bytes, on the devices one after
    /// another or in parallel (see [`RegisterOptions`]). All-or-nothing: a
    /// failure deregisters every region registered for it.
    ///
    /// # Safety
    /// The range must be mapped memory of this process that stays mapped
    /// until [`Registry::unregister`] returns for it.
    pub unsafe fn register(
        &self,
        devices: &[DeviceDomain<'_>],
        addr: u64,
        len: u64,
        opts: RegisterOptions,
    ) -> Result<Arc<Registration>> {
        let ranges = split(addr, len, opts.max_mr_size);
        if ranges.len() > 1 {
            info!(
                "buffer {addr:#x} of {len} bytes is larger than the largest memory region \
                 ({} bytes, MC_MAX_MR_SIZE or the device's limit): registered as {} pieces, \
                 each published as a buffer entry",
                opts.max_mr_size,
                ranges.len()
            );
        }
        // One job per piece and device that is up.
        let jobs: Vec<(usize, usize, &Arc<ProtectionDomain>)> = ranges
            .iter()
            .enumerate()
            .flat_map(|(p, _)| {
                devices
                    .iter()
                    .enumerate()
                    .filter_map(move |(d, dev)| dev.pd.map(|pd| (p, d, pd)))
            })
            .collect();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = opts
            .threads(len, devices.len(), cpus)
            .min(jobs.len())
            .max(1);
        let gpu = match crate::memory::device::residence(addr, len) {
            crate::memory::Residence::Device(n) => Some((n, GpuPath::here())),
            _ => None,
        };
        let register_one = |&(p, d, pd): &(usize, usize, &Arc<ProtectionDomain>)| {
            let (a, n) = ranges[p];
            let name = devices[d].name;
            if let Some((_, GpuPath::DmaBuf)) = gpu {
                let buf = crate::memory::device::dmabuf(a, n).map_err(|why| {
                    Error::Context(format!(
                        "registering GPU memory {a:#x}+{n} on {name} failed: no dma-buf of it \
                         ({why}), and nvidia-peermem is not loaded"
                    ))
                })?;
                return MemoryRegion::register_dmabuf(
                    pd,
                    std::os::fd::AsFd::as_fd(&buf.fd),
                    buf.offset,
                    n,
                    a,
                    opts.remote,
                    opts.relaxed,
                )
                .map_err(|e| registration_error(name, a, n, e));
            }
            // SAFETY: inside the caller's range, which the caller keeps
            // mapped as this method requires.
            unsafe { MemoryRegion::register(pd, a, n, opts.remote, opts.relaxed) }.map_err(|e| {
                match gpu {
                    Some(_) => Error::Context(format!(
                        "registering GPU memory {a:#x}+{n} on {name} failed: {e}; load \
                         nvidia-peermem, or use a CUDA driver and libibverbs with dma-buf \
                         support (CUDA 11.7, rdma-core 34)"
                    )),
                    None => registration_error(name, a, n, e),
                }
            })
        };
        let results: Vec<Result<MemoryRegion>> = if threads <= 1 {
            let mut out = Vec::with_capacity(jobs.len());
            for job in &jobs {
                let r = register_one(job);
                let failed = r.is_err();
                out.push(r);
                if failed {
                    break;
                }
            }
            out
        } else {
            let next = AtomicUsize::new(0);
            let failed = AtomicBool::new(false);
            let slots: Vec<Mutex<Option<Result<MemoryRegion>>>> =
                jobs.iter().map(|_| Mutex::new(None)).collect();
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= jobs.len() || failed.load(Ordering::Relaxed) {
                                return;
                            }
                            let r = register_one(&jobs[i]);
                            if r.is_err() {
                                failed.store(true, Ordering::Relaxed);
                            }
                            *sync::lock(&slots[i]) = Some(r);
                        }
                    });
                }
            });
            slots
                .into_iter()
                .filter_map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
                .collect()
        };
        let mut pieces: Vec<Piece> = ranges
            .iter()
            .map(|&(addr, len)| Piece {
                addr,
                len,
                keys: vec![None; devices.len()],
            })
            .collect();
        let mut regions = Vec::with_capacity(jobs.len());
        let mut first_err = None;
        for (job, r) in jobs.iter().zip(results) {
            match r {
                Ok(mr) => {
                    pieces[job.0].keys[job.1] = Some((mr.lkey(), mr.rkey()));
                    regions.push(mr);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            // Dropping the regions registered so far deregisters them.
            return Err(e);
        }
        let reg = Arc::new(Registration {
            addr,
            len,
            remote: opts.remote,
            pieces,
            regions: Mutex::new(regions),
            inflight: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            idle: self.idle.clone(),
        });
        sync::write(&self.map).insert(addr, reg.clone());
        if let Some((n, path)) = gpu {
            info!("GPU buffer {addr:#x}+{len} (GPU {n}) registered for RDMA through {path}");
        }
        Ok(reg)
    }

    /// The registration at exactly `addr`.
    pub fn get(&self, addr: u64) -> Option<Arc<Registration>> {
        sync::read(&self.map).get(&addr).cloned()
    }

    /// The registration holding `addr`, if one does.
    fn holding(map: &BTreeMap<u64, Arc<Registration>>, addr: u64) -> Option<&Arc<Registration>> {
        let (_, reg) = map.range(..=addr).next_back()?;
        (addr < reg.addr + reg.len).then_some(reg)
    }

    /// The local key on device `dev` for `[addr, addr + len)` and a hold
    /// on its registration; `None` if no live registration covers it in
    /// one piece.
    pub fn hold(&self, addr: u64, len: u64, dev: usize) -> Option<(u32, MrGuard)> {
        let map = sync::read(&self.map);
        let reg = Self::holding(&map, addr)?;
        let piece = reg.piece(addr)?;
        if addr.checked_add(len)? > piece.end() {
            return None;
        }
        let lkey = piece.keys.get(dev).copied().flatten()?.0;
        reg.inflight.fetch_add(1, Ordering::AcqRel);
        Some((lkey, MrGuard { reg: reg.clone() }))
    }

    /// The end of the piece holding `addr` when its buffer was registered
    /// in several pieces (`None` for a buffer in one piece, or none).
    pub fn piece_end(&self, addr: u64) -> Option<u64> {
        let map = sync::read(&self.map);
        let reg = Self::holding(&map, addr)?;
        if reg.pieces.len() < 2 {
            return None;
        }
        reg.piece(addr).map(Piece::end)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_memory_goes_through_peermem_where_loaded_else_dmabuf() {
        assert_eq!(GpuPath::choose(true, true), GpuPath::PeerMem);
        assert_eq!(GpuPath::choose(true, false), GpuPath::PeerMem);
        assert_eq!(GpuPath::choose(false, true), GpuPath::DmaBuf);
        // Neither: ibv_reg_mr is tried, and its failure names both ways.
        assert_eq!(GpuPath::choose(false, false), GpuPath::PeerMem);
    }

    fn opts(parallel: Option<bool>, max_concurrent: usize) -> RegisterOptions {
        RegisterOptions {
            remote: true,
            relaxed: false,
            max_mr_size: 1 << 20,
            parallel,
            max_concurrent,
        }
    }

    #[test]
    fn buffers_split_into_pieces_of_the_largest_region() {
        assert_eq!(split(0x1000, 100, 1 << 20), vec![(0x1000, 100)]);
        assert_eq!(split(0x1000, 1 << 20, 1 << 20), vec![(0x1000, 1 << 20)]);
        let mib = 1u64 << 20;
        let pieces = split(0x10_0000, 5 * mib + 77, mib);
        assert_eq!(pieces.len(), 6);
        assert!(pieces[..5].iter().all(|p| p.1 == mib));
        assert_eq!(pieces[5], (0x10_0000 + 5 * mib, 77));
        assert!(pieces.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
    }

    #[test]
    fn parallel_registration_follows_mooncakes_rule() {
        let big = 4u64 << 30;
        // Automatic: several devices, >= 4 GiB and >= 4 CPUs.
        assert_eq!(opts(None, 0).threads(big, 8, 4), 8);
        assert_eq!(opts(None, 0).threads(big - 1, 8, 4), 1);
        assert_eq!(opts(None, 0).threads(big, 1, 4), 1);
        assert_eq!(opts(None, 0).threads(big, 8, 2), 1);
        // Forced on or off; the cap bounds the threads.
        assert_eq!(opts(Some(true), 0).threads(4096, 2, 1), 2);
        assert_eq!(opts(Some(true), 3).threads(4096, 8, 1), 3);
        assert_eq!(opts(Some(false), 0).threads(big, 8, 64), 1);
    }

    fn registration(pieces: &[(u64, u64)]) -> Arc<Registration> {
        let addr = pieces[0].0;
        let len = pieces.iter().map(|p| p.1).sum();
        Arc::new(Registration {
            addr,
            len,
            remote: true,
            pieces: pieces
                .iter()
                .zip(1u32..)
                .map(|(&(addr, len), k)| Piece {
                    addr,
                    len,
                    keys: vec![Some((k, 100 + k)), None],
                })
                .collect(),
            regions: Mutex::new(Vec::new()),
            inflight: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            idle: Arc::default(),
        })
    }

    #[test]
    fn work_requests_stay_inside_one_piece() {
        let reg = Registry::default();
        let split_one = registration(&split(0x10000, 0x3100, 0x1000));
        let whole = registration(&[(0x20000, 0x3000)]);
        sync::write(&reg.map).insert(0x10000, split_one.clone());
        sync::write(&reg.map).insert(0x20000, whole);
        // The piece's own key, on the device that has it.
        assert_eq!(reg.hold(0x10000, 0x1000, 0).map(|h| h.0), Some(1));
        assert_eq!(reg.hold(0x11800, 0x800, 0).map(|h| h.0), Some(2));
        assert_eq!(reg.hold(0x13000, 0x100, 0).map(|h| h.0), Some(4));
        assert!(reg.hold(0x10000, 0x1000, 1).is_none(), "no region there");
        // Across a piece's edge, past the buffer, or outside any buffer.
        assert!(reg.hold(0x10800, 0x1000, 0).is_none());
        assert!(reg.hold(0x13000, 0x101, 0).is_none());
        assert!(reg.hold(0x18000, 1, 0).is_none());
        assert_eq!(
            split_one.inflight.load(Ordering::Acquire),
            0,
            "holds dropped"
        );
        assert_eq!(reg.piece_end(0x10000), Some(0x11000));
        assert_eq!(reg.piece_end(0x11fff), Some(0x12000));
        assert_eq!(reg.piece_end(0x130ff), Some(0x13100));
        assert_eq!(reg.piece_end(0x13100), None);
        assert_eq!(reg.piece_end(0x20000), None, "a buffer in one piece");
        let keys: Vec<(Vec<u32>, Vec<u32>)> = split_one
            .pieces()
            .iter()
            .map(|p| (p.lkeys(), p.rkeys(true)))
            .collect();
        assert_eq!(keys[1], (vec![2, 0], vec![102, 0]));
        assert!(split_one.pieces()[0].rkeys(false).is_empty());
        assert!(reg.unregister(0x10000, Duration::ZERO));
        assert!(reg.hold(0x10000, 1, 0).is_none());
    }
}
