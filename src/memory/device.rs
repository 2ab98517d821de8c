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
//! Other vendors' GPU memory is detected the same way, through the driver
//! or runtime their framework loaded: MUSA (`libmusa.so`, whose driver API
//! mirrors CUDA's) and HIP (`libamdhip64.so`, `hipPointerGetAttributes`).
//! No transport moves it yet: it is refused at registration and in every
//! request, before a byte moves ([`Residence::Foreign`]).
//!
//! Tests load test doubles of these libraries
//! (`tests/support/cuda_driver_double.c`, built as CUDA's and as MUSA's,
//! and `tests/support/hip_runtime_double.c`) in place of the real ones;
//! they are no GPU coverage.

use libloading::os::unix::Library;
use once_cell::sync::OnceCell;
use std::ffi::{c_int, c_uint, c_void};
#[cfg(feature = "rdma")]
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a range of memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residence {
    /// Host memory (also CUDA's pinned and managed memory): the CPU may
    /// copy it.
    Host,
    /// Memory of the CUDA GPU with this driver ordinal (`cuda:N`).
    Device(u32),
    /// Memory of another vendor's GPU, with its ordinal: no transport
    /// moves it yet, so it is refused wherever it appears.
    Foreign(Vendor, u32),
}

/// A GPU vendor whose memory is detected but not moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    /// Moore Threads (MUSA).
    Musa,
    /// AMD (HIP).
    Hip,
}

impl std::fmt::Display for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Vendor::Musa => "musa",
            Vendor::Hip => "hip",
        })
    }
}

impl std::fmt::Display for Residence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Residence::Host => f.write_str("host memory"),
            Residence::Device(n) => write!(f, "memory of GPU {n}"),
            Residence::Foreign(v, n) => write!(f, "memory of {v} GPU {n}"),
        }
    }
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

/// A driver API shaped as CUDA's (`xxInit`, `xxPointerGetAttribute` with
/// CUDA's attribute numbers): CUDA's own, and MUSA's, which mirrors it.
struct DriverApi {
    /// Who it is (`None`: CUDA, whose memory RDMA moves).
    vendor: Option<Vendor>,
    /// Its file names, the first found loaded wins.
    libraries: &'static [&'static str],
    init: &'static [u8],
    pointer_get_attribute: &'static [u8],
}

const CUDA: DriverApi = DriverApi {
    vendor: None,
    libraries: &["libcuda.so.1"],
    init: b"cuInit\0",
    pointer_get_attribute: b"cuPointerGetAttribute\0",
};

const MUSA: DriverApi = DriverApi {
    vendor: Some(Vendor::Musa),
    libraries: &["libmusa.so.1", "libmusa.so"],
    init: b"muInit\0",
    pointer_get_attribute: b"muPointerGetAttribute\0",
};

#[cfg(feature = "rdma")]
type GetAddressRange = unsafe extern "C" fn(*mut u64, *mut usize, u64) -> c_int;
#[cfg(feature = "rdma")]
type GetHandleForAddressRange = unsafe extern "C" fn(*mut c_void, u64, usize, c_int, u64) -> c_int;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
#[cfg(feature = "rdma")]
const HANDLE_TYPE_DMA_BUF_FD: c_int = 1;

/// A driver's entry points this module calls.
struct Driver {
    /// The driver's handle (it keeps its functions alive).
    library: Library,
    vendor: Option<Vendor>,
    pointer_get_attribute: PointerGetAttribute,
    /// The dma-buf export of GPU memory (CUDA 11.7 and later), for RDMA
    /// without nvidia-peermem: `cuMemGetAddressRange_v2` and
    /// `cuMemGetHandleForAddressRange`.
    #[cfg(feature = "rdma")]
    dmabuf: Option<(GetAddressRange, GetHandleForAddressRange)>,
}

/// The drivers once found in the process (`None`: found, but unusable).
static CUDA_DRIVER: OnceCell<Option<Driver>> = OnceCell::new();
static MUSA_DRIVER: OnceCell<Option<Driver>> = OnceCell::new();
static HIP_RUNTIME: OnceCell<Option<HipRuntime>> = OnceCell::new();

/// How many libraries the process has loaded so far (glibc's
/// `dlpi_adds`, which only grows): a library found absent at one count is
/// still absent while the count stays, so a search costs one call of
/// `dl_iterate_phdr` until the process loads something.
fn libraries_loaded() -> u64 {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        out: *mut c_void,
    ) -> c_int {
        // SAFETY: `info` is the loader's entry for this call, and `out`
        // the `u64` passed below.
        unsafe { *out.cast::<u64>() = (*info).dlpi_adds };
        1
    }
    let mut adds = 0u64;
    // SAFETY: `first` only reads the entry it is given and writes `adds`,
    // which outlives the call; returning 1 stops after the first entry.
    unsafe { libc::dl_iterate_phdr(Some(first), std::ptr::from_mut(&mut adds).cast()) };
    adds
}

/// The count of loaded libraries at which a library was last found
/// absent (`u64::MAX`: never looked for).
struct Absent(AtomicU64);

impl Absent {
    const fn new() -> Absent {
        Absent(AtomicU64::new(u64::MAX))
    }

    /// Whether the library was absent at this count already.
    fn still(&self, adds: u64) -> bool {
        self.0.load(Ordering::Relaxed) == adds
    }

    fn at(&self, adds: u64) {
        self.0.store(adds, Ordering::Relaxed);
    }
}

static CUDA_ABSENT: Absent = Absent::new();
static MUSA_ABSENT: Absent = Absent::new();
static HIP_ABSENT: Absent = Absent::new();

/// The first of `names` the process has loaded, without loading any;
/// `absent` remembers a miss at the count `adds`.
fn loaded(names: &[&str], absent: &Absent, adds: u64) -> Option<Library> {
    if absent.still(adds) {
        return None;
    }
    let found = loaded_now(names);
    if found.is_none() {
        absent.at(adds);
    }
    found
}

/// The first of `names` the process has loaded, without loading any.
fn loaded_now(names: &[&str]) -> Option<Library> {
    names.iter().find_map(|name| {
        // SAFETY: RTLD_NOLOAD only returns a handle to a library already
        // loaded into the process, so no initialiser runs here.
        unsafe {
            Library::open(
                Some(*name),
                libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_LOCAL,
            )
        }
        .ok()
    })
}

/// The driver of `api` kept in `cell`, if the process has loaded it
/// (`adds`: [`libraries_loaded`]).
fn driver(
    cell: &'static OnceCell<Option<Driver>>,
    api: &DriverApi,
    absent: &Absent,
    adds: u64,
) -> Option<&'static Driver> {
    if let Some(found) = cell.get() {
        return found.as_ref();
    }
    let library = loaded(api.libraries, absent, adds)?;
    cell.get_or_init(|| open(library, api)).as_ref()
}

/// Resolves the driver's entry points and initialises it (`xxInit` is
/// idempotent; the runtime that loaded the driver has called it already).
fn open(library: Library, api: &DriverApi) -> Option<Driver> {
    let name = api.libraries[0];
    // SAFETY: the symbols have the CUDA driver API's documented
    // signatures (cuda.h; MUSA's mirror them), which the types above
    // spell out.
    let (init, pointer_get_attribute) = unsafe {
        let init = library.get::<Init>(api.init).map(|s| *s);
        let attr = library
            .get::<PointerGetAttribute>(api.pointer_get_attribute)
            .map(|s| *s);
        (init, attr)
    };
    let (Ok(init), Ok(pointer_get_attribute)) = (init, pointer_get_attribute) else {
        tracing::warn!(
            "{name} is loaded but lacks its Init or PointerGetAttribute: GPU memory \
             cannot be told from host memory"
        );
        return None;
    };
    // SAFETY: xxInit takes flags, which must be 0.
    let rc = unsafe { init(0) };
    if rc != SUCCESS {
        tracing::info!("{name} loaded but its Init failed ({rc}): no GPU memory to detect");
        return None;
    }
    // SAFETY: the symbols, where present, have the CUDA driver API's
    // documented signatures, which the types above spell out.
    #[cfg(feature = "rdma")]
    let dmabuf = unsafe {
        match (
            library.get::<GetAddressRange>(b"cuMemGetAddressRange_v2\0"),
            library.get::<GetHandleForAddressRange>(b"cuMemGetHandleForAddressRange\0"),
        ) {
            (Ok(range), Ok(handle)) if api.vendor.is_none() => Some((*range, *handle)),
            _ => None,
        }
    };
    tracing::info!("{name} found in the process: its GPU buffers are detected");
    Some(Driver {
        library,
        vendor: api.vendor,
        pointer_get_attribute,
        #[cfg(feature = "rdma")]
        dmabuf,
    })
}

/// The CUDA driver, if the process has loaded it and it answers (its
/// copy calls are resolved by [`super::staging`]).
pub(super) fn cuda_library() -> Option<&'static Library> {
    driver(&CUDA_DRIVER, &CUDA, &CUDA_ABSENT, libraries_loaded()).map(|d| &d.library)
}

/// A dma-buf of CUDA GPU memory and where a range starts in it.
#[cfg(feature = "rdma")]
pub struct DmaBuf {
    /// The dma-buf's descriptor (of the whole allocation).
    pub fd: OwnedFd,
    /// Byte offset of the range in the dma-buf.
    pub offset: u64,
}

/// Exports the CUDA allocation holding `[addr, addr + len)` as a dma-buf
/// (`cuMemGetHandleForAddressRange`), for registering it with RDMA
/// devices without nvidia-peermem. `Err` says why it cannot be: no driver
/// in the process, one without dma-buf export, a range that is not one
/// allocation, or the driver's refusal.
#[cfg(feature = "rdma")]
pub fn dmabuf(addr: u64, len: u64) -> Result<DmaBuf, String> {
    let adds = libraries_loaded();
    let driver = driver(&CUDA_DRIVER, &CUDA, &CUDA_ABSENT, adds)
        .ok_or("the CUDA driver is not loaded in this process")?;
    let (range, handle) = driver.dmabuf.ok_or(
        "this CUDA driver has no dma-buf export (cuMemGetHandleForAddressRange, CUDA 11.7)",
    )?;
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: both outputs are writable; the driver reads only its own
    // tables for `addr`.
    let rc = unsafe { range(&mut base, &mut size, addr) };
    if rc != SUCCESS {
        return Err(format!("cuMemGetAddressRange failed ({rc})"));
    }
    if addr.saturating_add(len) > base.saturating_add(size as u64) {
        return Err(format!(
            "{addr:#x}+{len} runs past its GPU allocation {base:#x}+{size}"
        ));
    }
    let mut fd: c_int = -1;
    // SAFETY: `fd` is writable and receives an int for this handle type;
    // the range is one whole allocation, as the driver requires.
    let rc = unsafe {
        handle(
            std::ptr::from_mut(&mut fd).cast(),
            base,
            size,
            HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    if rc != SUCCESS || fd < 0 {
        return Err(format!("cuMemGetHandleForAddressRange failed ({rc})"));
    }
    // SAFETY: the driver handed us this new descriptor; we own it now.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    Ok(DmaBuf {
        fd,
        offset: addr - base,
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
        let ordinal = ordinal.and_then(|o| u32::try_from(o).ok()).unwrap_or(0);
        match self.vendor {
            None => Residence::Device(ordinal),
            Some(v) => Residence::Foreign(v, ordinal),
        }
    }
}

/// `hipPointerAttribute_t` (ROCm 5 and 6 share its layout; ROCm 5 names
/// the first field `memoryType`).
#[repr(C)]
struct HipPointerAttribute {
    memory_type: c_int,
    device: c_int,
    device_pointer: *mut c_void,
    host_pointer: *mut c_void,
    is_managed: c_int,
    allocation_flags: c_uint,
}

type HipPointerGetAttributes = unsafe extern "C" fn(*mut HipPointerAttribute, u64) -> c_int;
type HipRuntimeGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;

/// The HIP runtime's entry point this module calls, and the value its
/// `hipMemoryType` gives device memory (`hipMemoryTypeDevice`: 1 before
/// ROCm 6, 2 since).
struct HipRuntime {
    _library: Library,
    pointer_get_attributes: HipPointerGetAttributes,
    device_type: c_int,
}

/// The HIP runtime, if the process has loaded it (`adds`:
/// [`libraries_loaded`]).
fn hip_runtime(adds: u64) -> Option<&'static HipRuntime> {
    if let Some(found) = HIP_RUNTIME.get() {
        return found.as_ref();
    }
    let names = ["libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"];
    let library = loaded(&names, &HIP_ABSENT, adds)?;
    HIP_RUNTIME.get_or_init(|| open_hip(library)).as_ref()
}

/// Resolves the HIP runtime's entry points and reads its version.
fn open_hip(library: Library) -> Option<HipRuntime> {
    // SAFETY: the symbols have HIP's documented signatures
    // (hip_runtime_api.h), which the types above spell out.
    let (version, attributes) = unsafe {
        (
            library
                .get::<HipRuntimeGetVersion>(b"hipRuntimeGetVersion\0")
                .map(|s| *s),
            library
                .get::<HipPointerGetAttributes>(b"hipPointerGetAttributes\0")
                .map(|s| *s),
        )
    };
    let (Ok(version), Ok(pointer_get_attributes)) = (version, attributes) else {
        tracing::warn!(
            "libamdhip64 is loaded but lacks hipRuntimeGetVersion or hipPointerGetAttributes: \
             its GPU memory cannot be told from host memory"
        );
        return None;
    };
    let mut v: c_int = 0;
    // SAFETY: `v` is writable.
    if unsafe { version(&mut v) } != SUCCESS {
        tracing::warn!("libamdhip64 is loaded but hipRuntimeGetVersion failed");
        return None;
    }
    tracing::info!("HIP runtime {v} found in the process: its GPU buffers are detected");
    Some(HipRuntime {
        _library: library,
        pointer_get_attributes,
        device_type: if v >= 60_000_000 { 2 } else { 1 },
    })
}

impl HipRuntime {
    /// Where the allocation holding `addr` lives.
    fn residence(&self, addr: u64) -> Residence {
        let mut a = HipPointerAttribute {
            memory_type: 0,
            device: 0,
            device_pointer: std::ptr::null_mut(),
            host_pointer: std::ptr::null_mut(),
            is_managed: 0,
            allocation_flags: 0,
        };
        // SAFETY: `a` is writable and has the runtime's layout; the
        // runtime only reads its own tables for `addr`.
        let rc = unsafe { (self.pointer_get_attributes)(&mut a, addr) };
        if rc != SUCCESS || a.memory_type != self.device_type || a.is_managed != 0 {
            return Residence::Host;
        }
        Residence::Foreign(Vendor::Hip, u32::try_from(a.device).unwrap_or(0))
    }
}

/// Where the byte at `addr` lives, as the GPU libraries in the process
/// say.
fn residence_of(addr: u64) -> Residence {
    let adds = libraries_loaded();
    let drivers = [
        driver(&CUDA_DRIVER, &CUDA, &CUDA_ABSENT, adds),
        driver(&MUSA_DRIVER, &MUSA, &MUSA_ABSENT, adds),
    ];
    for d in drivers.into_iter().flatten() {
        let r = d.residence(addr);
        if r != Residence::Host {
            return r;
        }
    }
    hip_runtime(adds).map_or(Residence::Host, |h| h.residence(addr))
}

/// Where `[addr, addr + len)` lives: GPU memory if its first or last byte
/// is (a range is one allocation or a caller's mistake; either way the
/// CPU must not copy it).
pub fn residence(addr: u64, len: u64) -> Residence {
    match residence_of(addr) {
        Residence::Host if len > 1 => residence_of(addr.saturating_add(len - 1)),
        r => r,
    }
}
