//! Protection domains and the memory regions registered in them (a region
//! holds an `Arc` of its domain).

use super::Context;
use super::check;
use super::library::{
    ibv_alloc_pd, ibv_dealloc_pd, ibv_dereg_mr, ibv_reg_dmabuf_mr, ibv_reg_mr_iova2,
};
use rdma_sys::{ibv_access_flags, ibv_mr, ibv_pd};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;

/// A protection domain, deallocated on drop.
pub struct ProtectionDomain {
    ptr: NonNull<ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> io::Result<ProtectionDomain> {
        // SAFETY: the context is open (the Arc keeps it so).
        let raw = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        let ptr = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        Ok(ProtectionDomain {
            ptr,
            ctx: ctx.clone(),
        })
    }

    /// The context this domain belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(super) fn as_ptr(&self) -> *mut ibv_pd {
        self.ptr.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this domain holds an Arc to it, so none
        // is left; the domain is deallocated once.
        if let Err(e) = check(unsafe { ibv_dealloc_pd(self.as_ptr()) }) {
            tracing::warn!("ibv_dealloc_pd on {} failed: {e}", self.ctx.name());
        }
    }
}

/// A registered memory region, deregistered on drop.
pub struct MemoryRegion {
    ptr: NonNull<ibv_mr>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: verbs objects may be used from any thread; the region's fields
// are only read after registration.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `[addr, addr + len)` with local write access, plus remote
    /// read and write if `remote`, plus relaxed ordering if `relaxed` (an
    /// optional flag: devices without it ignore it).
    ///
    /// # Safety
    /// The range must be mapped memory of this process that stays mapped
    /// until the region is dropped.
    pub unsafe fn register(
        pd: &Arc<ProtectionDomain>,
        addr: u64,
        len: u64,
        remote: bool,
        relaxed: bool,
    ) -> io::Result<MemoryRegion> {
        let access = access_flags(remote, relaxed);
        let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the PD is alive (Arc); the caller guarantees the range is
        // mapped for the region's lifetime. `ibv_reg_mr_iova2` drops
        // optional access flags the device does not support.
        let raw = unsafe {
            ibv_reg_mr_iova2(
                pd.as_ptr(),
                addr as usize as *mut libc::c_void,
                len,
                addr,
                access.0,
            )
        };
        MemoryRegion::made(pd, raw)
    }

    /// Registers `len` bytes from byte `offset` of the dma-buf `fd` (GPU
    /// memory the driver exported), addressed by peers from `iova` (the
    /// memory's virtual address here), with the access of
    /// [`MemoryRegion::register`]. The region keeps the dma-buf; `fd` may
    /// be closed afterwards.
    pub fn register_dmabuf(
        pd: &Arc<ProtectionDomain>,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: u64,
        iova: u64,
        remote: bool,
        relaxed: bool,
    ) -> io::Result<MemoryRegion> {
        let access = access_flags(remote, relaxed);
        let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let access =
            i32::try_from(access.0).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the PD is alive (Arc) and `fd` is an open descriptor;
        // the kernel checks the dma-buf's range, and the region holds the
        // dma-buf (not our descriptor) for its lifetime.
        let raw =
            unsafe { ibv_reg_dmabuf_mr(pd.as_ptr(), offset, len, iova, fd.as_raw_fd(), access) };
        MemoryRegion::made(pd, raw)
    }

    /// The region a registration call returned in `pd` (NULL: its error).
    fn made(pd: &Arc<ProtectionDomain>, raw: *mut ibv_mr) -> io::Result<MemoryRegion> {
        let ptr = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        Ok(MemoryRegion {
            ptr,
            pd: pd.clone(),
        })
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the region is registered; `lkey` is a plain field.
        unsafe { (*self.ptr.as_ptr()).lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.ptr.as_ptr()).rkey }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by `ibv_reg_mr_iova2`, deregistered once; the
        // owner drops it only when no work request uses it.
        if let Err(e) = check(unsafe { ibv_dereg_mr(self.ptr.as_ptr()) }) {
            tracing::warn!("ibv_dereg_mr on {} failed: {e}", self.pd.context().name());
        }
    }
}

/// Local write access, plus remote read and write if `remote`, plus
/// relaxed ordering if `relaxed` (optional: devices without it ignore it).
fn access_flags(remote: bool, relaxed: bool) -> ibv_access_flags {
    let mut access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
    if remote {
        access = access
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
    }
    if relaxed {
        access |= ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING;
    }
    access
}
