//! `enableGracefulShutdown`: on SIGINT or SIGTERM the enabled engines are
//! destroyed (their metadata removed) before the signal's default action.
//!
//! The signal handler only writes the signal number to a pipe; a watcher
//! thread does the work. The watcher runs only while an enabled engine
//! exists, and the previous signal dispositions are restored when it stops,
//! so the library can be unloaded afterwards.

use super::boundary::remove_engine;
use crate::sync;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::thread::JoinHandle;
use tracing::{info, warn};

const SIGNALS: [c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// Write end of the signal pipe, read by the async-signal-safe handler.
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);

struct Watcher {
    engines: Vec<usize>,
    thread: Option<JoinHandle<()>>,
    stop: &'static AtomicBool,
    read_fd: c_int,
    old_actions: Vec<(c_int, libc::sigaction)>,
}

static STATE: Mutex<Option<Watcher>> = Mutex::new(None);
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: c_int) {
    let fd = PIPE_WRITE.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: write(2) is async-signal-safe; `b` is a valid byte.
        unsafe { libc::write(fd, (&b as *const u8).cast::<c_void>(), 1) };
    }
}

fn start() -> Option<Watcher> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        super::boundary::fail(
            "enableGracefulShutdown",
            format_args!("pipe2 failed: {}", std::io::Error::last_os_error()),
        );
        return None;
    }
    PIPE_WRITE.store(fds[1], Ordering::Release);
    let mut old_actions = Vec::new();
    for sig in SIGNALS {
        // SAFETY: zeroed sigaction is a valid starting value; the handler is
        // an `extern "C" fn(c_int)`.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(c_int) as usize;
            libc::sigemptyset(&mut act.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, &act, &mut old) == 0 {
                old_actions.push((sig, old));
            }
        }
    }
    STOP.store(false, Ordering::Release);
    let read_fd = fds[0];
    let thread = std::thread::Builder::new()
        .name("te-graceful".into())
        .spawn(move || watch(read_fd))
        .map_err(|e| {
            super::boundary::fail(
                "enableGracefulShutdown",
                format_args!("cannot start watcher: {e}"),
            )
        })
        .ok();
    Some(Watcher {
        engines: Vec::new(),
        thread,
        stop: &STOP,
        read_fd,
        old_actions,
    })
}

fn watch(read_fd: c_int) {
    let mut pfd = libc::pollfd {
        fd: read_fd,
        events: libc::POLLIN,
        revents: 0,
    };
    while !STOP.load(Ordering::Acquire) {
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 200) };
        if n <= 0 {
            continue;
        }
        let mut b = 0u8;
        // SAFETY: reads one byte into `b`.
        if unsafe { libc::read(read_fd, (&mut b as *mut u8).cast::<c_void>(), 1) } != 1 {
            continue;
        }
        let sig = c_int::from(b);
        info!("signal {sig}: destroying engines with graceful shutdown enabled");
        let (engines, old) = {
            let mut state = sync::lock(&STATE);
            match state.as_mut() {
                Some(w) => (
                    std::mem::take(&mut w.engines),
                    std::mem::take(&mut w.old_actions),
                ),
                None => (Vec::new(), Vec::new()),
            }
        };
        for h in engines {
            if let Some(e) = remove_engine(h as *mut c_void) {
                e.shutdown();
            }
        }
        // SAFETY: restores the dispositions saved at start, then delivers the
        // signal again so its original action (usually exit) runs.
        unsafe {
            for (s, act) in &old {
                libc::sigaction(*s, act, std::ptr::null_mut());
            }
            libc::raise(sig);
        }
        return;
    }
}

/// Adds an engine to those destroyed on SIGINT/SIGTERM.
pub fn enable(engine: *mut c_void) {
    let mut state = sync::lock(&STATE);
    if state.is_none() {
        *state = start();
    }
    if let Some(w) = state.as_mut() {
        if !w.engines.contains(&(engine as usize)) {
            w.engines.push(engine as usize);
        }
    }
}

/// Removes a destroyed engine; the watcher stops with the last one.
pub fn forget(engine: *mut c_void) {
    let mut state = sync::lock(&STATE);
    let Some(w) = state.as_mut() else {
        return;
    };
    w.engines.retain(|&h| h != engine as usize);
    if !w.engines.is_empty() {
        return;
    }
    let Some(mut w) = state.take() else {
        return;
    };
    drop(state);
    w.stop.store(true, Ordering::Release);
    if let Some(t) = w.thread.take() {
        if std::thread::current().id() != t.thread().id() && t.join().is_err() {
            warn!("graceful shutdown watcher panicked");
        }
    }
    // SAFETY: restores the saved dispositions and closes the pipe this
    // module opened.
    unsafe {
        for (s, act) in &w.old_actions {
            libc::sigaction(*s, act, std::ptr::null_mut());
        }
        let wfd = PIPE_WRITE.swap(-1, Ordering::AcqRel);
        libc::close(wfd);
        libc::close(w.read_fd);
    }
}
