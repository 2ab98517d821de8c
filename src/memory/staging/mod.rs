//! Copies to and from CUDA GPU memory with the driver, and the bounded
//! pool of host buffers that transports copying with the CPU stage GPU
//! memory through.
//!
//! The CPU never reads or writes GPU memory: every byte of it crosses
//! with the driver's `cuMemcpy` (unified addressing: either side may be
//! host or GPU memory), run in the GPU's primary context, pushed onto the
//! calling thread for the copy and popped after it, so the caller's own
//! context is left as it was. The driver is the one [`super::device`]
//! found in the process; without it there is no GPU memory to copy.
//!
//! Staging buffers are pinned (`cuMemHostAlloc`, portable to every
//! context) where the driver gives them, else ordinary heap memory; a
//! pool holds at most a fixed number ([`pool`]).

mod pool;

pub use pool::{Lent, StagingPool};

use super::device;
use crate::sync;
use once_cell::sync::OnceCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type PrimaryCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type CtxPush = unsafe extern "C" fn(*mut c_void) -> c_int;
type CtxPop = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type Memcpy = unsafe extern "C" fn(u64, u64, usize) -> c_int;
type MemHostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int;
type MemFreeHost = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context.
const HOST_ALLOC_PORTABLE: c_uint = 1;

/// The driver's entry points for copies.
struct Copier {
    device_get: DeviceGet,
    retain: PrimaryCtxRetain,
    push: CtxPush,
    pop: CtxPop,
    memcpy: Memcpy,
    host_alloc: MemHostAlloc,
    free_host: MemFreeHost,
    /// The primary context of each GPU, retained once for the process.
    contexts: Mutex<HashMap<u32, usize>>,
}

static COPIER: OnceCell<Option<Copier>> = OnceCell::new();

/// The driver's copy calls, once the process has loaded the driver.
fn copier() -> Option<&'static Copier> {
    if let Some(c) = COPIER.get() {
        return c.as_ref();
    }
    let library = device::cuda_library()?;
    COPIER
        .get_or_init(|| {
            // SAFETY: the symbols have the CUDA driver API's documented
            // signatures (cuda.h), which the types above spell out.
            let found = unsafe {
                (|| {
                    Some(Copier {
                        device_get: *library.get::<DeviceGet>(b"cuDeviceGet\0").ok()?,
                        retain: *library
                            .get::<PrimaryCtxRetain>(b"cuDevicePrimaryCtxRetain\0")
                            .ok()?,
                        push: *library.get::<CtxPush>(b"cuCtxPushCurrent_v2\0").ok()?,
                        pop: *library.get::<CtxPop>(b"cuCtxPopCurrent_v2\0").ok()?,
                        memcpy: *library.get::<Memcpy>(b"cuMemcpy\0").ok()?,
                        host_alloc: *library.get::<MemHostAlloc>(b"cuMemHostAlloc\0").ok()?,
                        free_host: *library.get::<MemFreeHost>(b"cuMemFreeHost\0").ok()?,
                        contexts: Mutex::new(HashMap::new()),
                    })
                })()
            };
            if found.is_none() {
                tracing::warn!(
                    "the CUDA driver in this process lacks its copy calls (cuMemcpy, \
                     cuCtxPushCurrent_v2, cuMemHostAlloc, ...): GPU memory is refused by the \
                     transports that copy with the CPU"
                );
            }
            found
        })
        .as_ref()
}

/// Whether GPU memory can be copied here: the process has loaded a CUDA
/// driver with its copy calls.
pub fn available() -> bool {
    copier().is_some()
}

impl Copier {
    /// The primary context of GPU `gpu`, retained on first use.
    fn context(&self, gpu: u32) -> Result<*mut c_void, String> {
        let mut contexts = sync::lock(&self.contexts);
        if let Some(&ctx) = contexts.get(&gpu) {
            return Ok(ctx as *mut c_void);
        }
        let ordinal = c_int::try_from(gpu).map_err(|_| format!("no GPU {gpu}"))?;
        let mut dev: c_int = 0;
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: both outputs are writable and of the types the driver
        // writes.
        let rc = unsafe { (self.device_get)(&mut dev, ordinal) };
        if rc != 0 {
            return Err(format!("cuDeviceGet({gpu}) failed ({rc})"));
        }
        // SAFETY: as above.
        let rc = unsafe { (self.retain)(&mut ctx, dev) };
        if rc != 0 {
            return Err(format!(
                "cuDevicePrimaryCtxRetain of GPU {gpu} failed ({rc})"
            ));
        }
        contexts.insert(gpu, ctx as usize);
        Ok(ctx)
    }

    /// Runs `call` with GPU `gpu`'s primary context current on this
    /// thread, and restores the thread's own afterwards.
    fn within(&self, gpu: u32, call: impl FnOnce() -> c_int) -> Result<(), String> {
        let ctx = self.context(gpu)?;
        // SAFETY: `ctx` is a primary context retained for the process.
        let rc = unsafe { (self.push)(ctx) };
        if rc != 0 {
            return Err(format!("cuCtxPushCurrent of GPU {gpu} failed ({rc})"));
        }
        let rc = call();
        let mut popped: *mut c_void = std::ptr::null_mut();
        // SAFETY: pops the context pushed above; `popped` is writable.
        unsafe { (self.pop)(&mut popped) };
        if rc != 0 {
            return Err(format!("the CUDA driver's call failed ({rc})"));
        }
        Ok(())
    }
}

/// Copies `len` bytes from `src` to `dst` with the CUDA driver, in the
/// primary context of GPU `gpu` (one side's GPU; the other may be host
/// memory or another GPU's). The CPU touches neither side. `Err` says
/// why the driver could not.
///
/// # Safety
/// `[src, src + len)` must be readable and `[dst, dst + len)` writable
/// memory (host or GPU) for the whole call, not overlapping.
pub unsafe fn copy(dst: u64, src: u64, len: usize, gpu: u32) -> Result<(), String> {
    if len == 0 {
        return Ok(());
    }
    let c = copier().ok_or("the CUDA driver's copy calls are not in this process")?;
    // SAFETY: the caller keeps both ranges valid for the copy; the driver
    // tells host from GPU memory by the addresses.
    c.within(gpu, || unsafe { (c.memcpy)(dst, src, len) })
}

/// A host buffer GPU memory is staged through: pinned where the driver
/// gives it, else heap memory.
pub struct HostBuffer {
    ptr: *mut u8,
    len: usize,
    /// The GPU whose context pinned it, where `cuMemFreeHost` frees it
    /// (`None`: a boxed slice).
    pinned: Option<u32>,
}

// SAFETY: the buffer is plain memory owned by this value alone.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    /// `len` bytes, pinned with GPU `gpu`'s context current where the
    /// driver allows it.
    pub fn new(len: usize, gpu: u32) -> HostBuffer {
        if let Some(c) = copier() {
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: `p` is writable; the flags are the driver's.
            let pinned = c.within(gpu, || unsafe {
                (c.host_alloc)(&mut p, len, HOST_ALLOC_PORTABLE)
            });
            match pinned {
                Ok(()) if !p.is_null() => {
                    return HostBuffer {
                        ptr: p.cast(),
                        len,
                        pinned: Some(gpu),
                    };
                }
                Ok(()) => {}
                Err(e) => crate::log_limit::warn_limited!(
                    "no pinned staging buffer of {len} bytes ({e}): heap memory instead"
                ),
            }
        }
        let ptr = Box::into_raw(vec![0u8; len].into_boxed_slice()).cast::<u8>();
        HostBuffer {
            ptr,
            len,
            pinned: None,
        }
    }

    /// Its first byte.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Some(gpu) = self.pinned {
            if let Some(c) = copier() {
                // SAFETY: `ptr` came from cuMemHostAlloc and is freed once,
                // in the context it was pinned in.
                let freed = c.within(gpu, || unsafe { (c.free_host)(self.ptr.cast()) });
                if let Err(e) = freed {
                    crate::log_limit::warn_limited!("a pinned staging buffer was not freed: {e}");
                }
            }
            return;
        }
        // SAFETY: `ptr` and `len` are those of the boxed slice made in
        // `new`, freed once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_buffers_without_a_driver() {
        let b = HostBuffer::new(4096, 0);
        assert_eq!(b.len(), 4096);
        assert_ne!(b.addr(), 0);
        // SAFETY: the CUDA driver is not loaded by unit tests; a copy is
        // refused before it touches the (valid) addresses.
        let err = unsafe { copy(b.addr(), b.addr() + 8, 8, 0) }.unwrap_err();
        assert!(err.contains("not in this process"), "{err}");
    }
}
