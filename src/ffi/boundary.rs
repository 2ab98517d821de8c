//! What every export shares: the panic guard, the table of live engines,
//! C string conversion, and logging setup.

use crate::config::{LogLevel, config};
use crate::engine::Engine;
use crate::handle::HandleTable;
use std::ffi::{CStr, c_char, c_void};
use std::sync::{Arc, Once};

/// Runs an export's body, turning a panic into the function's error value
/// and a log line, so no panic crosses into C.
macro_rules! guard {
    ($name:literal, $err:expr, $body:block) => {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| $body)) {
            Ok(v) => v,
            Err(_) => {
                tracing::error!(concat!(
                    $name,
                    ": internal error (panic caught at the C boundary)"
                ));
                $err
            }
        }
    };
}
pub(crate) use guard;

/// Engines handed out to C, addressed by generational handles.
static ENGINES: HandleTable<Engine> = HandleTable::new();

/// Stores an engine and returns the opaque pointer-sized handle C keeps.
pub fn insert_engine(engine: Arc<Engine>) -> *mut c_void {
    ENGINES.insert(engine) as usize as *mut c_void
}

/// The engine behind a handle, or `None` (logged) for NULL, forged or
/// destroyed handles.
pub fn engine(handle: *mut c_void, func: &str) -> Option<Arc<Engine>> {
    let found = if handle.is_null() {
        None
    } else {
        ENGINES.get(handle as usize as u64)
    };
    if found.is_none() {
        tracing::error!("{func}: engine handle {handle:p} is NULL, unknown or destroyed");
    }
    found
}

/// Removes an engine from the table; the caller shuts it down.
pub fn remove_engine(handle: *mut c_void) -> Option<Arc<Engine>> {
    if handle.is_null() {
        return None;
    }
    ENGINES.remove(handle as usize as u64)
}

/// Copies a C string argument, or `None` (logged) when it is NULL.
pub fn string_arg(p: *const c_char, func: &str, what: &str) -> Option<String> {
    if p.is_null() {
        tracing::error!("{func}: {what} is NULL");
        return None;
    }
    // SAFETY: C passes a NUL-terminated string that stays valid during the call.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Writes `s` into `buf` like `snprintf(buf, len, "%s", s)`: truncated and
/// always NUL-terminated.
pub fn write_c_string(s: &str, buf: *mut c_char, len: usize) {
    if buf.is_null() || len == 0 {
        return;
    }
    let n = s.len().min(len - 1);
    // SAFETY: the caller passed `buf` valid for `len` bytes and n < len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
}

/// Installs a `tracing` subscriber for the library's logs unless the
/// process already has one. `RUST_LOG` wins over `MC_LOG_LEVEL`.
pub fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let level = match config().log_level {
            LogLevel::Trace => "trace",
            LogLevel::Info => "info",
            LogLevel::Warning => "warn",
            LogLevel::Error => "error",
        };
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    });
}
