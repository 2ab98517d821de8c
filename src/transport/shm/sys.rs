//! Thin wrappers of the Linux calls the shared-memory transport uses:
//! memfds with seals, shared mappings, eventfds, pidfds (open, poll, take
//! another process's descriptor) and random numbers.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

/// The result of a call that returns -1 and sets `errno` on failure.
fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Takes ownership of a descriptor a successful call returned.
fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: `fd` was just returned by the kernel as a new descriptor of
    // this process that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

/// A new memfd of `size` bytes whose size can never change again (so no
/// process mapping it can be made to fault by a truncation). To let other
/// processes only read it, map it writable first ([`Mapping::new`]), then
/// call [`seal_future_writes`].
pub fn memfd(name: &CStr, size: usize) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string.
    let fd = check(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    } as libc::c_long)?;
    let fd = owned(fd);
    // SAFETY: a plain system call on a descriptor we own.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } as libc::c_long)?;
    add_seals(&fd, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)?;
    Ok(fd)
}

/// Adds `seals` (`F_SEAL_*`) to a memfd.
fn add_seals(fd: &OwnedFd, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: a plain system call on a descriptor we own.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    check(r as libc::c_long)?;
    Ok(())
}

/// Seals a memfd against new writable mappings and writes; mappings that
/// exist keep writing, and further seals are refused.
pub fn seal_future_writes(fd: &OwnedFd) -> io::Result<()> {
    add_seals(fd, libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL)
}

/// Seals a memfd against further seals (its size is sealed already).
pub fn seal_seals(fd: &OwnedFd) -> io::Result<()> {
    add_seals(fd, libc::F_SEAL_SEAL)
}

/// The name a memfd was created with (from its `/proc/self/fd` link,
/// `/memfd:NAME (deleted)`); `None` for anything else.
pub fn memfd_name(fd: &OwnedFd) -> Option<String> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let link = link.to_str()?;
    let name = link.strip_prefix("/memfd:")?;
    Some(name.strip_suffix(" (deleted)").unwrap_or(name).to_string())
}

/// Checks that a peer's memfd can neither shrink nor grow: a mapping of it
/// can then never fault.
pub fn check_size_sealed(fd: &OwnedFd) -> io::Result<()> {
    let want = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    if seals(fd)? & want != want {
        return Err(io::Error::other("its size is not sealed"));
    }
    Ok(())
}

/// The size of the file behind `fd`.
pub fn file_size(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: `stat` is plain data; an all-zero value is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable `stat`.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } as libc::c_long)?;
    Ok(st.st_size as u64)
}

/// The seals of a memfd.
pub fn seals(fd: &OwnedFd) -> io::Result<i32> {
    // SAFETY: a plain system call on a descriptor we own.
    Ok(check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) } as libc::c_long)? as i32)
}

/// A shared mapping of a whole file, unmapped when dropped. Its memory is
/// shared with another process, so it is only ever accessed through
/// atomics ([`Mapping::word`]).
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory, accessed only through
// atomics; the pointer stays valid until `Drop`.
unsafe impl Send for Mapping {}
// SAFETY: as above: every access is atomic.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared, writable or read-only.
    pub fn new(fd: &OwnedFd, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a new mapping chosen by the kernel; it replaces nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        Ok(Mapping { ptr, len })
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes mapped.
    pub fn size(&self) -> usize {
        self.len
    }

    /// The 8-byte word at byte `offset` (8-aligned, inside the mapping).
    ///
    /// # Panics
    /// If `offset` is misaligned or out of range: offsets are computed from
    /// sizes this process checked, so that is a bug here.
    pub fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset % 8 == 0 && offset + 8 <= self.len,
            "word {offset} of a {}-byte mapping",
            self.len
        );
        // SAFETY: the word is inside the mapping (checked), 8-aligned (the
        // mapping is page-aligned), lives as long as `self`, and is only
        // accessed atomically by every process that maps it.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast::<u64>()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no reference into it
        // outlives `self` (`word` borrows `self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A non-blocking eventfd.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: a plain system call.
    let fd =
        check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) } as libc::c_long)?;
    Ok(owned(fd))
}

/// Adds one to an eventfd, waking whoever polls it.
pub fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64. A full counter (EAGAIN)
    // is readable already, which is all a signal needs.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Empties an eventfd (non-blocking).
pub fn drain(fd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: reads at most 8 bytes into a valid u64; EAGAIN when empty.
    unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

/// A pidfd of process `pid`: readable once the process has exited.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: a plain system call.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    Ok(owned(fd))
}

/// A copy of descriptor `fd` of the process behind `pidfd` (needs the
/// same permission as reading its memory).
pub fn pidfd_getfd(pidfd: &OwnedFd, fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: a plain system call.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) })?;
    Ok(owned(fd))
}

/// Whether the process behind `pidfd` has exited.
pub fn exited(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polls one valid pollfd without waiting.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents != 0
}

/// Random bytes from the kernel.
pub fn random_u64() -> u64 {
    let mut v: u64 = 0;
    loop {
        // SAFETY: writes at most 8 bytes into a valid u64.
        let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, 0) };
        if n == 8 {
            return v;
        }
    }
}

/// This machine's boot id: equal for processes on the same running kernel.
pub fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_string())
}

/// This process's id.
pub fn own_pid() -> i32 {
    std::process::id() as i32
}
