//! Buffers the engine allocates for its callers (Mooncake's
//! `allocate_managed_buffer`, the Python allocator), each in a memfd of
//! its own, so that peers on this host can map it and copy with memcpy,
//! several times faster than cross-memory attach. The memfd's size is
//! sealed (a peer's mapping can never fault) and so are new writable
//! mappings: a peer maps it read-only. Its name carries a random id that
//! peers check after taking the descriptor.

use super::sys::{self, Mapping};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::RwLock;

const NAME_PREFIX: &str = "te-shm-buf-";

/// The memfd name of buffer `id`.
pub fn name_of(id: u64) -> String {
    format!("{NAME_PREFIX}{id:016x}")
}

struct Alloc {
    id: u64,
    fd: OwnedFd,
    map: Mapping,
}

/// The memfd-backed buffers of this process, by base address.
#[derive(Default)]
pub(crate) struct Allocs {
    by_base: RwLock<BTreeMap<u64, Alloc>>,
}

impl Allocs {
    /// A new zeroed buffer of `len` bytes; returns its address.
    pub fn allocate(&self, len: usize) -> io::Result<u64> {
        if len == 0 {
            return Err(io::Error::other("a buffer of 0 bytes"));
        }
        let id = loop {
            let v = sys::random_u64();
            if v != 0 {
                break v;
            }
        };
        let name = CString::new(name_of(id)).map_err(io::Error::other)?;
        let fd = sys::memfd(&name, len)?;
        let map = Mapping::new(&fd, len, true)?;
        sys::seal_future_writes(&fd)?;
        let base = map.ptr() as u64;
        self.by_base
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(base, Alloc { id, fd, map });
        Ok(base)
    }

    /// Frees the buffer at `addr`; false if none starts there. Peers that
    /// still map it keep its pages until they drop their mapping (when no
    /// registered buffer names it any more).
    pub fn free(&self, addr: u64) -> bool {
        self.by_base
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&addr)
            .is_some()
    }

    /// Where `[addr, addr + len)` lies, if inside one buffer.
    pub fn backing_of(&self, addr: u64, len: u64) -> Option<super::table::Backing> {
        let all = self.by_base.read().unwrap_or_else(|e| e.into_inner());
        let (&base, a) = all.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        (end <= base + a.map.size() as u64).then(|| super::table::Backing {
            id: a.id,
            fd: a.fd.as_raw_fd(),
            offset: addr - base,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_memfds_peers_can_only_read() {
        let a = Allocs::default();
        let base = a.allocate(3 << 20).unwrap();
        // SAFETY: our new buffer of 3 MiB.
        unsafe { std::ptr::write_bytes(base as *mut u8, 7, 3 << 20) };
        let b = a.backing_of(base + 100, 1000).unwrap();
        assert_eq!(b.offset, 100);
        assert!(a.backing_of(base + 100, 3 << 20).is_none());
        assert!(a.backing_of(base - 1, 2).is_none());
        // What a peer does with the descriptor.
        let path = format!("/proc/self/fd/{}", b.fd);
        let fd: OwnedFd = std::fs::File::open(&path).unwrap().into();
        assert_eq!(sys::memfd_name(&fd), Some(name_of(b.id)));
        assert!(Mapping::new(&fd, 3 << 20, true).is_err(), "writable");
        let m = Mapping::new(&fd, 3 << 20, false).unwrap();
        // SAFETY: inside the read-only mapping.
        assert_eq!(unsafe { *m.ptr().add(12345) }, 7);
        assert!(a.free(base));
        assert!(!a.free(base));
        // SAFETY: the pages live on while mapped.
        assert_eq!(unsafe { *m.ptr().add(12345) }, 7);
        assert!(a.allocate(0).is_err());
    }
}
