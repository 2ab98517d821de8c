//! What every export shares: the panic guard, the checks of its arguments
//! that log a failure and give the code to return, the record of this
//! thread's last error, the table of live engines, C string conversion,
//! and logging setup.

use crate::engine::Engine;
use crate::engine::config::{LogLevel, config};
use crate::error::Error;
use crate::handle::HandleTable;
use crate::log_limit::{LogLimits, Suppressed};
use std::cell::RefCell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::fmt::Display;
use std::sync::{Arc, Once};

/// Runs the body of export `func`, turning a panic into `err`, the
/// function's error value, and a logged, recorded failure, so no panic
/// crosses into C. The body gets the [`Call`] its failures go through and
/// returns `Ok` with its result or `Err` with its error code. The record of
/// the thread's last error is cleared first: it describes this call only.
pub fn guard<R: Copy>(func: &'static str, err: R, body: impl FnOnce(Call<R>) -> Result<R, R>) -> R {
    clear_last_error();
    guard_keeping_last_error(func, err, body)
}

/// [`guard`], leaving the record of the thread's last error as it is (for
/// `te_version` and `te_last_error`).
pub fn guard_keeping_last_error<R: Copy>(
    func: &'static str,
    err: R,
    body: impl FnOnce(Call<R>) -> Result<R, R>,
) -> R {
    let call = Call { func, err };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(call))) {
        Ok(Ok(v) | Err(v)) => v,
        Err(_) => call.fail("internal error (panic caught at the C boundary)"),
    }
}

/// One call of an export: the name its failures are logged and recorded
/// under, and the value it returns for an invalid argument (a NULL, forged
/// or destroyed engine handle, a NULL string). Each check logs the failure
/// and gives the code the export returns, ready for `?`.
#[derive(Clone, Copy)]
pub struct Call<R> {
    func: &'static str,
    err: R,
}

impl<R: Copy> Call<R> {
    /// Logs `msg` as this call's failure (see [`fail`]) and gives the
    /// call's error value.
    pub fn fail(self, msg: impl Display) -> R {
        fail(self.func, msg);
        self.err
    }

    /// Records `msg` as this call's failure without logging it (see
    /// [`record`]).
    pub fn record(self, msg: impl Display) {
        record(self.func, msg);
    }

    /// The engine behind `handle`, or the error value (logged) for NULL,
    /// forged or destroyed handles.
    pub fn engine(self, handle: *mut c_void) -> Result<Arc<Engine>, R> {
        let found = if handle.is_null() {
            None
        } else {
            ENGINES.get(handle as usize as u64)
        };
        found.ok_or_else(|| self.unknown_engine(handle))
    }

    /// Removes the engine behind `handle` from the table (the caller shuts
    /// it down), or gives the error value (logged) as [`Call::engine`] does.
    pub fn remove_engine(self, handle: *mut c_void) -> Result<Arc<Engine>, R> {
        remove_engine(handle).ok_or_else(|| self.unknown_engine(handle))
    }

    fn unknown_engine(self, handle: *mut c_void) -> R {
        self.fail(format_args!(
            "engine handle {handle:p} is NULL, unknown or destroyed"
        ))
    }

    /// Copies the C string argument `what`, or gives the error value
    /// (logged) when it is NULL.
    pub fn string(self, p: *const c_char, what: &str) -> Result<String, R> {
        if p.is_null() {
            return Err(self.fail(format_args!("{what} is NULL")));
        }
        // SAFETY: C passes a NUL-terminated string that stays valid during the call.
        Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// `result`'s value, or the error value with the error logged.
    pub fn check<T>(self, result: Result<T, Error>) -> Result<T, R> {
        result.map_err(|e| self.fail(e))
    }

    /// `result`'s value, or `code` of its error, which is logged.
    fn code<T>(self, result: Result<T, Error>, code: fn(&Error) -> R) -> Result<T, R> {
        result.map_err(|e| {
            fail(self.func, &e);
            code(&e)
        })
    }
}

impl Call<c_int> {
    /// `result`'s value, or its error's `ERR_*` code (logged), for the
    /// functions that return `0` or an `ERR_*`.
    pub fn err_code<T>(self, result: Result<T, Error>) -> Result<T, c_int> {
        self.code(result, Error::err_code)
    }

    /// `result`'s value, or its error's Status code (logged), for the
    /// Status-returning functions.
    pub fn status_code<T>(self, result: Result<T, Error>) -> Result<T, c_int> {
        self.code(result, Error::status_code)
    }
}

thread_local! {
    /// The failure of the last call made on this thread, `""` after a call
    /// that succeeded.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Lines each export's failures write per [`crate::log_limit::LOG_INTERVAL`]
/// before the rest are counted and suppressed.
const FAILURES_LOGGED: u32 = 5;

/// The log lines of failing exports, limited per export.
static FAILURES: LogLimits = LogLimits::with_burst(FAILURES_LOGGED);

/// Logs a failure of export `func` and records it as this thread's last
/// error (`te_last_error`). Every failing export goes through here. The
/// record is exact for every call; the log has the first few failures of
/// each export per interval, then one line with the count of those
/// suppressed, so a caller that fails in a loop cannot flood it.
pub fn fail(func: &'static str, msg: impl Display) {
    let text = format!("{func}: {msg}");
    if let Some(suppressed) = FAILURES.admit(func) {
        tracing::error!("{text}{}", Suppressed(suppressed));
    }
    set_last_error(text);
}

/// Records a failure without logging it, for an outcome callers meet in
/// normal use (a batch freed before its tasks were seen terminal).
fn record(func: &str, msg: impl Display) {
    set_last_error(format!("{func}: {msg}"));
}

fn set_last_error(text: String) {
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// Forgets the last error (each export starts with this).
fn clear_last_error() {
    LAST_ERROR.with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            e.clear();
        }
    });
}

/// Runs `f` on this thread's last error text (`""` if none).
pub fn with_last_error<R>(f: impl FnOnce(&str) -> R) -> R {
    LAST_ERROR.with(|e| f(&e.borrow()))
}

/// Engines handed out to C, addressed by generational handles.
static ENGINES: HandleTable<Engine> = HandleTable::new();

/// Stores an engine and returns the opaque pointer-sized handle C keeps.
pub fn insert_engine(engine: Arc<Engine>) -> *mut c_void {
    ENGINES.insert(engine) as usize as *mut c_void
}

/// Removes an engine from the table; the caller shuts it down.
pub fn remove_engine(handle: *mut c_void) -> Option<Arc<Engine>> {
    if handle.is_null() {
        return None;
    }
    ENGINES.remove(handle as usize as u64)
}

/// The `len` elements C passed at `p` (`what` names them in the error):
/// empty for a `len` of 0, an error for a NULL `p` or for a `len` whose
/// size in bytes exceeds `isize::MAX` (no array is that large; the size
/// would wrap).
///
/// # Safety
/// A non-NULL `p` must be valid for `len` elements during `'a`.
pub unsafe fn c_array<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::InvalidArgument(format!("{what} is NULL")));
    }
    let size = std::mem::size_of::<T>().max(1);
    if len > isize::MAX as usize / size {
        return Err(Error::InvalidArgument(format!(
            "{what} cannot hold {len} elements of {size} bytes (more than the address space)"
        )));
    }
    // SAFETY: `p` is non-NULL, `len * size` does not exceed isize::MAX, and
    // the caller passes `len` valid elements.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
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
/// process already has one, then logs the configuration's warnings through
/// it. `RUST_LOG` wins over `MC_LOG_LEVEL`. The subscriber writes to
/// stderr, or with `MC_LOG_DIR` to a file in that directory
/// (`transfer-engine.<pid>.log`, appended to); a directory it cannot
/// write to is named in a warning on stderr.
pub fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // A configuration that fails is reported by the call that needs it
        // (`createTransferEngine`); its logs still go out at INFO.
        let parsed = crate::engine::config::parsed().ok();
        let level = match parsed.map_or(LogLevel::Info, |c| c.engine.log_level) {
            LogLevel::Trace => "trace",
            LogLevel::Info => "info",
            LogLevel::Warning => "warn",
            LogLevel::Error => "error",
        };
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
        let fmt = tracing_subscriber::fmt().with_env_filter(filter);
        let mut refused = None;
        let file = parsed
            .and_then(|c| c.engine.log_dir.as_deref())
            .and_then(|dir| open_log_file(dir).map_err(|e| refused = Some(e)).ok());
        let _ = match file {
            Some(file) => fmt
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .try_init(),
            None => fmt.with_writer(std::io::stderr).try_init(),
        };
        if let Some(why) = refused {
            tracing::warn!("{why}; logging to stderr");
        }
    });
    let _ = config();
}

/// The log file of this process in `dir` (`MC_LOG_DIR`):
/// `transfer-engine.<pid>.log`, appended to; or why not (`dir` is not a
/// directory, or the file cannot be opened for writing).
pub(crate) fn open_log_file(dir: &std::path::Path) -> Result<std::fs::File, String> {
    if !dir.is_dir() {
        return Err(format!("MC_LOG_DIR={} is not a directory", dir.display()));
    }
    let path = dir.join(format!("transfer-engine.{}.log", std::process::id()));
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("MC_LOG_DIR: cannot write {} ({e})", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_file_is_per_process_in_mc_log_dir_and_a_bad_dir_is_named() {
        let dir = std::env::temp_dir().join(format!("te-log-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut f = open_log_file(&dir).expect("a writable directory");
        std::io::Write::write_all(&mut f, b"one\n").unwrap();
        // Appended to, not truncated, when opened again.
        let mut f = open_log_file(&dir).unwrap();
        std::io::Write::write_all(&mut f, b"two\n").unwrap();
        let path = dir.join(format!("transfer-engine.{}.log", std::process::id()));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
        std::fs::remove_dir_all(&dir).unwrap();
        let e = open_log_file(&dir).unwrap_err();
        assert_eq!(
            e,
            format!("MC_LOG_DIR={} is not a directory", dir.display())
        );
    }

    #[test]
    fn c_arrays_whose_size_wraps_are_refused_unread() {
        // SAFETY: a NULL pointer with length 0 is never read.
        assert!(unsafe { c_array::<u64>(std::ptr::null(), 0, "x") }.is_ok_and(|a| a.is_empty()));
        // SAFETY: a NULL pointer is refused before it is read.
        let null = unsafe { c_array::<u64>(std::ptr::null(), 1, "x") };
        assert_eq!(null.unwrap_err().to_string(), "invalid argument: x is NULL");
        // One real element; every length below is refused before a read.
        let one = [7u64; 1];
        for len in [1usize << 60, 1 << 61, 1 << 62, usize::MAX] {
            // SAFETY: the length is refused before `one` is read past.
            let e = unsafe { c_array(one.as_ptr(), len, "list") }.unwrap_err();
            assert!(e.to_string().contains("more than the address space"), "{e}");
        }
        // SAFETY: `one` holds one element.
        assert_eq!(unsafe { c_array(one.as_ptr(), 1, "list") }.unwrap(), &[7]);
    }
}
