//! `allocate_managed_buffer` / `free_managed_buffer`: Mooncake's Python
//! allocator of registered memory. Requests up to 256 MiB are served from
//! 2 GiB chunks, each registered once, split into power-of-two blocks of
//! 8 KiB to 256 MiB (a block of one class is split into two of the class
//! below on demand; freed blocks return to their class's free list and are
//! never merged). Larger requests get a registration of their own.
//!
//! The memory comes from the engine when it has memory it moves faster
//! (with the shared-memory transport: memfds that peers on this host copy
//! with memcpy, [`Engine::allocate_buffer`]), else it is anonymous `mmap`;
//! both are lazily backed, so an idle 2 GiB chunk costs address space, not
//! RAM. Unlike
//! Mooncake, the allocator remembers what it handed out: freeing an address
//! it did not hand out (or twice) is refused instead of corrupting it.

use std::collections::HashMap;
use std::ptr::NonNull;
use transfer_engine::Engine;
use transfer_engine::{Error, Result};
use transfer_engine::{Location, Region};

/// Bytes of each chunk the small classes are carved from (2 GiB).
const CHUNK_BYTES: usize = 2 << 30;
/// Block size of each class, in KiB: 8 KiB .. 256 MiB.
const CLASS_KIB: [usize; 16] = [
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2 << 10,
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
];
const TOP_CLASS: usize = CLASS_KIB.len() - 1;

fn class_bytes(class: usize) -> usize {
    CLASS_KIB[class] << 10
}

/// The smallest class whose blocks hold `len` bytes, or `None` above
/// 256 MiB (Mooncake's `findClassId`).
fn class_of(len: usize) -> Option<usize> {
    (0..CLASS_KIB.len()).find(|&c| len <= class_bytes(c))
}

/// Memory mapped for the allocator: the engine's (freed with the engine,
/// or by [`Managed::free`]), or anonymous (unmapped on drop).
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    anonymous: bool,
}

// SAFETY: the mapping is plain memory owned by this value; it is only
// handed out as addresses.
unsafe impl Send for Mapping {}

impl Mapping {
    /// `len` bytes from the engine if it has memory it moves faster, else
    /// anonymous memory.
    fn new(engine: &Engine, len: usize) -> Result<Mapping> {
        match engine.allocate_buffer(len) {
            Some(Ok(addr)) => {
                let ptr = NonNull::new(addr as usize as *mut u8)
                    .ok_or_else(|| Error::Memory("the engine returned NULL".into()))?;
                return Ok(Mapping {
                    ptr,
                    len,
                    anonymous: false,
                });
            }
            Some(Err(e)) => tracing::warn!("managed buffer: {e}; using anonymous memory"),
            None => {}
        }
        Mapping::anonymous(len)
    }

    fn anonymous(len: usize) -> Result<Mapping> {
        // SAFETY: an anonymous private mapping with no address hint; the
        // result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Memory(format!(
                "mmap of {len} bytes failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| Error::Memory("mmap returned NULL".into()))?;
        Ok(Mapping {
            ptr,
            len,
            anonymous: true,
        })
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.anonymous {
            // SAFETY: `ptr`/`len` are exactly what mmap returned, unmapped
            // once.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

/// The allocator's state: chunks, free lists, and what is handed out.
#[derive(Default)]
pub struct Managed {
    chunks: Vec<Mapping>,
    free: [Vec<u64>; CLASS_KIB.len()],
    /// Blocks handed out, by address, with their class.
    blocks: HashMap<u64, usize>,
    /// Allocations above 256 MiB, by address.
    large: HashMap<u64, Mapping>,
}

/// Registers a whole mapping with the engine (location `*`, reachable by
/// peers), as Mooncake's allocator does.
fn register(engine: &Engine, m: &Mapping) -> Result<()> {
    engine.register(&[Region {
        addr: m.addr(),
        length: m.len as u64,
        location: Location::Any,
        remote_accessible: true,
    }])
}

impl Managed {
    /// Registered memory of at least `len` bytes.
    pub fn allocate(&mut self, engine: &Engine, len: usize) -> Result<u64> {
        let Some(class) = class_of(len) else {
            let m = Mapping::new(engine, len)?;
            register(engine, &m)?;
            let addr = m.addr();
            self.large.insert(addr, m);
            return Ok(addr);
        };
        if self.free[class].is_empty() {
            self.refill(engine, class)?;
        }
        let addr = self.free[class]
            .pop()
            .ok_or_else(|| Error::Memory("managed free list empty after refill".into()))?;
        self.blocks.insert(addr, class);
        Ok(addr)
    }

    /// Puts at least one block on the free list of `class`: splits one of
    /// the class above, or maps and registers a new chunk for the top class.
    fn refill(&mut self, engine: &Engine, class: usize) -> Result<()> {
        if class == TOP_CLASS {
            let m = Mapping::new(engine, CHUNK_BYTES)?;
            register(engine, &m)?;
            let base = m.addr();
            self.chunks.push(m);
            let step = class_bytes(TOP_CLASS);
            self.free[TOP_CLASS].extend((0..CHUNK_BYTES / step).map(|i| base + (i * step) as u64));
            return Ok(());
        }
        if self.free[class + 1].is_empty() {
            self.refill(engine, class + 1)?;
        }
        let Some(block) = self.free[class + 1].pop() else {
            return Err(Error::Memory("managed free list empty after refill".into()));
        };
        self.free[class].push(block);
        self.free[class].push(block + class_bytes(class) as u64);
        Ok(())
    }

    /// Returns a block (or a large allocation) handed out by `allocate`.
    /// `len` is what the caller says it asked for; the allocator's own
    /// record decides the block's class.
    pub fn free(&mut self, engine: &Engine, addr: u64, len: usize) -> Result<()> {
        if let Some(m) = self.large.remove(&addr) {
            if let Err(e) = engine.unregister(&[addr]) {
                tracing::warn!("free_managed_buffer: unregistering {addr:#x}: {e}");
            }
            if !m.anonymous {
                if let Err(e) = engine.free_buffer(addr) {
                    tracing::warn!("free_managed_buffer: {e}");
                }
            }
            drop(m);
            return Ok(());
        }
        let class = self.blocks.remove(&addr).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{addr:#x} is not a managed buffer in use (never allocated, or already freed)"
            ))
        })?;
        if class_of(len) != Some(class) {
            tracing::warn!(
                "free_managed_buffer({addr:#x}, {len}): the buffer was allocated as a {} KiB block",
                CLASS_KIB[class]
            );
        }
        self.free[class].push(addr);
        Ok(())
    }
}
