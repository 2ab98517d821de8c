//! libibverbs, loaded at run time (`dlopen("libibverbs.so.1")` at the first
//! verbs call) instead of linked: the library, and the Python wheel that
//! bundles it, load and move bytes over TCP and shared memory on hosts
//! without rdma-core; RDMA is there wherever the host has libibverbs and
//! its providers. Where it cannot be loaded, the device list is empty (as
//! on a host without RDMA devices) and the reason is logged once.
//!
//! Each function below has the signature and name of the libibverbs
//! function it calls (types from `rdma-sys`), so the verbs objects call
//! them as they would the linked ones. Only the device list can be asked
//! for before the library is loaded; every other function takes an object
//! that exists only once it is, and fails as the call would (NULL, or
//! `ENOSYS`) if it is not.

use libloading::os::unix::Library;
use once_cell::sync::OnceCell;
use rdma_sys::{
    _compat_ibv_port_attr, ibv_async_event, ibv_comp_channel, ibv_context, ibv_cq, ibv_device,
    ibv_device_attr, ibv_gid, ibv_mr, ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr,
    ibv_wc_status,
};
use std::ffi::{c_char, c_int, c_uint, c_void};

/// Declares the loaded functions: the table's fields, its loader, and for
/// each function a forwarder of the same name that returns `$failed`
/// (with `errno` = `ENOSYS`) when the library is not loaded.
macro_rules! verbs_functions {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $failed:expr;)*) => {
        /// The libibverbs functions the verbs layer calls.
        struct Functions {
            $($name: unsafe extern "C" fn($($ty),*) $(-> $ret)?,)*
        }

        impl Functions {
            /// Resolves every function in `library`.
            fn resolve(library: &Library) -> Result<Functions, libloading::Error> {
                // SAFETY: each symbol is the libibverbs function of that
                // name, whose C signature the field's type spells out (the
                // declarations of rdma-sys's bindings).
                unsafe {
                    Ok(Functions {
                        $($name: *library.get(concat!(stringify!($name), "\0").as_bytes())?,)*
                    })
                }
            }
        }

        $(
            #[doc = concat!("`", stringify!($name), "` of the loaded libibverbs.")]
            ///
            /// # Safety
            ///
            /// As for the libibverbs function.
            pub(super) unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                match loaded() {
                    // SAFETY: the caller upholds the function's contract.
                    Some(f) => unsafe { (f.$name)($($arg),*) },
                    None => {
                        not_loaded();
                        $failed
                    }
                }
            }
        )*
    };
}

verbs_functions! {
    fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device = std::ptr::null_mut();
    fn ibv_free_device_list(list: *mut *mut ibv_device) = ();
    fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char = std::ptr::null();
    fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context = std::ptr::null_mut();
    fn ibv_close_device(context: *mut ibv_context) -> c_int = libc::ENOSYS;
    fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int = libc::ENOSYS;
    fn ibv_query_port(context: *mut ibv_context, port: u8, attr: *mut _compat_ibv_port_attr) -> c_int = libc::ENOSYS;
    fn ibv_query_gid(context: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int = libc::ENOSYS;
    fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int = -1;
    fn ibv_ack_async_event(event: *mut ibv_async_event) = ();
    fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd = std::ptr::null_mut();
    fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int = libc::ENOSYS;
    fn ibv_reg_mr_iova2(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_uint) -> *mut ibv_mr = std::ptr::null_mut();
    fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int = libc::ENOSYS;
    fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel = std::ptr::null_mut();
    fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int = libc::ENOSYS;
    fn ibv_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int = -1;
    fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) = ();
    fn ibv_create_cq(context: *mut ibv_context, cqe: c_int, cq_context: *mut c_void, channel: *mut ibv_comp_channel, comp_vector: c_int) -> *mut ibv_cq = std::ptr::null_mut();
    fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int = libc::ENOSYS;
    fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp = std::ptr::null_mut();
    fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int = libc::ENOSYS;
    fn ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int, init_attr: *mut ibv_qp_init_attr) -> c_int = libc::ENOSYS;
    fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int = libc::ENOSYS;
    fn ibv_wc_status_str(status: ibv_wc_status::Type) -> *const c_char = std::ptr::null();
}

/// `ibv_reg_dmabuf_mr`, which libibverbs has since rdma-core 34.
type RegDmabufMr = unsafe extern "C" fn(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr;

/// The loaded library and its functions.
struct Loaded {
    /// Keeps the library (and so its functions) loaded.
    _library: Library,
    functions: Functions,
    /// The optional ones, where this libibverbs has them.
    reg_dmabuf_mr: Option<RegDmabufMr>,
}

/// The library once the first call tried to load it (`None`: it could not
/// be, and why was logged).
static LIBRARY: OnceCell<Option<Loaded>> = OnceCell::new();

/// The soname loaded: the ABI of rdma-core's libibverbs since 2016.
const SONAME: &str = "libibverbs.so.1";

/// The functions, loading the library at the first call.
fn loaded() -> Option<&'static Functions> {
    library().map(|l| &l.functions)
}

/// Whether the loaded libibverbs registers dma-buf memory
/// (`ibv_reg_dmabuf_mr`).
pub(crate) fn has_reg_dmabuf_mr() -> bool {
    library().is_some_and(|l| l.reg_dmabuf_mr.is_some())
}

/// `ibv_reg_dmabuf_mr` of the loaded libibverbs: NULL with `errno` =
/// `EOPNOTSUPP` where it has none.
///
/// # Safety
///
/// As for the libibverbs function.
pub(super) unsafe fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    match library().and_then(|l| l.reg_dmabuf_mr) {
        // SAFETY: the caller upholds the function's contract.
        Some(f) => unsafe { f(pd, offset, length, iova, fd, access) },
        None => {
            // SAFETY: __errno_location returns this thread's errno slot.
            unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
            std::ptr::null_mut()
        }
    }
}

/// The library, loading it at the first call.
fn library() -> Option<&'static Loaded> {
    LIBRARY
        .get_or_init(|| {
            // SAFETY: loading libibverbs runs its initialisers, which only
            // set up its own state (provider lists, fork support).
            let library = match unsafe { Library::open(Some(SONAME), libc::RTLD_NOW) } {
                Ok(library) => library,
                Err(e) => {
                    tracing::info!(
                        "RDMA is unavailable: {SONAME} could not be loaded ({e}); install \
                         rdma-core's libibverbs (Debian/Ubuntu: libibverbs1, RHEL: \
                         libibverbs) to use RDMA"
                    );
                    return None;
                }
            };
            // SAFETY: the symbol, where present, is libibverbs'
            // `ibv_reg_dmabuf_mr`, whose C signature `RegDmabufMr` spells
            // out.
            let reg_dmabuf_mr = unsafe { library.get::<RegDmabufMr>(b"ibv_reg_dmabuf_mr\0") }
                .ok()
                .map(|f| *f);
            match Functions::resolve(&library) {
                Ok(functions) => Some(Loaded {
                    _library: library,
                    functions,
                    reg_dmabuf_mr,
                }),
                Err(e) => {
                    tracing::warn!("RDMA is unavailable: {SONAME} lacks a function ({e})");
                    None
                }
            }
        })
        .as_ref()
}

/// Sets `errno` as a failed call would, for callers that read it.
fn not_loaded() {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
}

/// `ibv_query_port` as verbs.h's inline wrapper calls it: the exported
/// function fills the fields that every libibverbs has (state, MTUs, LID,
/// link layer, GID table length...).
///
/// # Safety
///
/// As for `ibv_query_port`: a live context and a writable `attr`.
pub(super) unsafe fn ___ibv_query_port(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: `attr` is writable (the caller's contract); zeroed first as
    // the inline wrapper does, since `_compat_ibv_port_attr`, which the
    // exported function fills, is only its leading part.
    unsafe {
        std::ptr::write_bytes(attr, 0, 1);
        ibv_query_port(context, port, attr.cast())
    }
}
