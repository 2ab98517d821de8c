//! Waiting on file descriptors: an eventfd to wake worker threads, and a
//! bounded `poll(2)` over several descriptors.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A non-blocking eventfd: [`EventFd::wake`] makes it readable until a
/// waiter [`EventFd::drain`]s it.
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new eventfd.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall; a valid result is a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd { fd })
    }

    /// Makes the descriptor readable.
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd; a full
        // counter (EAGAIN) still leaves it readable, which is all we need.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Clears the readable state.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our non-blocking
        // eventfd; EAGAIN (already drained) is fine.
        let _ = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut v as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// The descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Waits until one of `fds` is readable or `timeout` passes; returns which
/// are readable.
pub fn wait_readable(fds: &[RawFd], timeout: Duration) -> Vec<bool> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    pfds.iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_and_drain() {
        let e = EventFd::new().unwrap();
        assert_eq!(wait_readable(&[e.fd()], Duration::ZERO), vec![false]);
        e.wake();
        e.wake();
        assert_eq!(wait_readable(&[e.fd()], Duration::from_secs(1)), vec![true]);
        e.drain();
        assert_eq!(wait_readable(&[e.fd()], Duration::ZERO), vec![false]);
    }
}
