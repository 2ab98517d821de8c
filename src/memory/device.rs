//! Where an address lives: host memory the CPU may copy, or GPU memory it
//! must never touch.
//!
//! GPU memory can exist in a process only once the CUDA driver
//! (`libcuda.so.1`) is loaded into it, by the CUDA runtime or a framework.
//! So the engine never loads the driver itself and has no link-time CUDA
//! dependency: it looks for a driver already in the process
//! (`dlopen(RTLD_NOLOAD)`), and once one is there asks it about each
//! buffer with `cuPointerGetAttribute`. Without a driver in the process
//! every address is host memory. Ordinals are the driver's, so they follow
//! `CUDA_VISIBLE_DEVICES` as the application sees its devices.
//!
//! Tests load a test double of the driver (`tests/support/cuda_driver_double.c`)
//! in place of the real one; it is no GPU coverage.

use libloading::os::unix::Library;
use once_cell::sync::OnceCell;
use std::ffi::{c_int, c_uint, c_void};

/// Where a range of memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residence {
    /// Host memory (also CUDA's pinned and managed memory): the CPU may
    /// copy it.
    Host,
    /// Memory of the GPU with this driver ordinal (`cuda:N`).
    Device(u32),
}

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`: a `CUmemorytype` (`unsigned int`).
const ATTRIBUTE_MEMORY_TYPE: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_IS_MANAGED`: non-zero for managed memory, which
/// the CPU may touch.
const ATTRIBUTE_IS_MANAGED: c_int = 8;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`: an `int`.
const ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORY_TYPE_DEVICE: c_uint = 2;
/// `CUDA_SUCCESS`.
const SUCCESS: c_int = 0;

type PointerGetAttribute = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;
type Init = unsafe extern "C" fn(c_uint) -> c_int;

/// The driver's entry points this module calls.
struct Driver {
    /// Keeps the driver's handle (and so its functions) alive.
    _library: Library,
    pointer_get_attribute: PointerGetAttribute,
}

/// The driver once found in the process (`None`: found, but unusable).
static DRIVER: OnceCell<Option<Driver>> = OnceCell::new();

/// The CUDA driver, if the process has loaded it.
fn driver() -> Option<&'static Driver> {
    if let Some(found) = DRIVER.get() {
        return found.as_ref();
    }
    // SAFETY: RTLD_NOLOAD only returns a handle to a library already
    // loaded into the process, so no initialiser runs here.
    let library = unsafe {
        Library::open(
            Some("libcuda.so.1"),
            libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_LOCAL,
        )
    }
    .ok()?;
    DRIVER.get_or_init(|| open(library)).as_ref()
}

/// Resolves the driver's entry points and initialises it (`cuInit` is
/// idempotent; the runtime that loaded the driver has called it already).
fn open(library: Library) -> Option<Driver> {
    // SAFETY: the symbols have the CUDA driver API's documented
    // signatures (cuda.h), which the types above spell out.
    let (init, pointer_get_attribute) = unsafe {
        let init = library.get::<Init>(b"cuInit\0").map(|s| *s);
        let attr = library
            .get::<PointerGetAttribute>(b"cuPointerGetAttribute\0")
            .map(|s| *s);
        (init, attr)
    };
    let (Ok(init), Ok(pointer_get_attribute)) = (init, pointer_get_attribute) else {
        tracing::warn!(
            "libcuda.so.1 is loaded but lacks cuInit or cuPointerGetAttribute: GPU memory \
             cannot be told from host memory"
        );
        return None;
    };
    // SAFETY: cuInit takes flags, which must be 0.
    let rc = unsafe { init(0) };
    if rc != SUCCESS {
        tracing::info!("CUDA driver loaded but cuInit failed ({rc}): no GPU memory to detect");
        return None;
    }
    tracing::info!("CUDA driver found in the process: GPU buffers are detected");
    Some(Driver {
        _library: library,
        pointer_get_attribute,
    })
}

impl Driver {
    /// One attribute of the allocation holding `addr`, or `None` where
    /// the driver does not know the address (host memory it never saw).
    fn attribute<T: Default>(&self, attribute: c_int, addr: u64) -> Option<T> {
        let mut value = T::default();
        // SAFETY: `value` is writable and of the type the driver writes
        // for `attribute` (unsigned int or int, as the callers choose);
        // the driver only reads its own tables for `addr`, never the
        // memory at it.
        let rc = unsafe {
            (self.pointer_get_attribute)(std::ptr::from_mut(&mut value).cast(), attribute, addr)
        };
        (rc == SUCCESS).then_some(value)
    }

    /// Where the allocation holding `addr` lives.
    fn residence(&self, addr: u64) -> Residence {
        if self.attribute::<c_uint>(ATTRIBUTE_MEMORY_TYPE, addr) != Some(MEMORY_TYPE_DEVICE) {
            return Residence::Host;
        }
        if self
            .attribute::<c_uint>(ATTRIBUTE_IS_MANAGED, addr)
            .is_some_and(|m| m != 0)
        {
            return Residence::Host;
        }
        let ordinal = self.attribute::<c_int>(ATTRIBUTE_DEVICE_ORDINAL, addr);
        Residence::Device(ordinal.and_then(|o| u32::try_from(o).ok()).unwrap_or(0))
    }
}

/// Where `[addr, addr + len)` lives: GPU memory if its first or last byte
/// is (a range is one allocation or a caller's mistake; either way the
/// CPU must not copy it).
pub fn residence(addr: u64, len: u64) -> Residence {
    let Some(driver) = driver() else {
        return Residence::Host;
    };
    match driver.residence(addr) {
        Residence::Host if len > 1 => driver.residence(addr.saturating_add(len - 1)),
        r => r,
    }
}
