//! The registry of local buffers: an interval map from base address to
//! length, location, remote accessibility and residence (host or GPU
//! memory), with Mooncake's overlap rules.

use crate::error::{Error, Result};
use crate::sync;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};

pub mod device;
pub mod fence;
pub mod numa;
pub mod staging;

pub use device::Residence;
pub use fence::Fence;

/// What a transport serving peers may ask of the engine's registered
/// memory: whether a range is open to peers, and the fence to hold while
/// touching it (see [`fence`]).
pub trait RemoteMemory: Send + Sync {
    /// The fence of the remotely accessible registered buffer that holds
    /// all of `[addr, addr + len)`, or `None` (also for `len == 0`).
    fn admit(&self, addr: u64, len: u64) -> Option<Arc<Fence>>;

    /// [`RemoteMemory::admit`] for a transport that stages GPU memory
    /// through host buffers ([`staging`]): a CUDA GPU buffer is admitted
    /// too where its memory can be copied here, with its GPU.
    fn admit_staged(&self, addr: u64, len: u64) -> Option<(Arc<Fence>, Option<u32>)>;
}

/// Where a buffer's memory lives, as named in Mooncake's location strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Location {
    /// `cpu:N`: host memory on NUMA node N.
    Cpu(u32),
    /// `cuda:N`: memory of GPU N.
    Cuda(u32),
    /// `*`: let the engine decide (any device).
    Any,
}

impl Location {
    /// Parses `cpu:N`, `cuda:N` or `*` (also the empty string, as
    /// Mooncake's newer engine takes it).
    pub fn parse(s: &str) -> Result<Location> {
        let s = s.trim();
        if s == "*" || s.is_empty() {
            return Ok(Location::Any);
        }
        let bad = || {
            Error::InvalidArgument(format!(
                "location {s:?} is not \"cpu:N\", \"cuda:N\" or \"*\""
            ))
        };
        let (kind, n) = s.split_once(':').ok_or_else(bad)?;
        let n: u32 = n.parse().map_err(|_| bad())?;
        match kind {
            "cpu" => Ok(Location::Cpu(n)),
            "cuda" => Ok(Location::Cuda(n)),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Cpu(n) => write!(f, "cpu:{n}"),
            Location::Cuda(n) => write!(f, "cuda:{n}"),
            Location::Any => write!(f, "*"),
        }
    }
}

/// One registered buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// Base address.
    pub addr: u64,
    /// Length in bytes (> 0).
    pub length: u64,
    /// Where the memory lives.
    pub location: Location,
    /// Whether peers may read and write it.
    pub remote_accessible: bool,
}

impl Region {
    /// Regions at each `(addr, length)` of `entries`, all at `location` and
    /// equally accessible: one registration call's list.
    pub fn each(
        entries: &[(u64, u64)],
        location: &Location,
        remote_accessible: bool,
    ) -> Vec<Region> {
        entries
            .iter()
            .map(|&(addr, length)| Region {
                addr,
                length,
                location: location.clone(),
                remote_accessible,
            })
            .collect()
    }

    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.addr + self.length
    }

    /// Whether `[addr, addr + len)` lies inside this region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        match addr.checked_add(len) {
            Some(end) => addr >= self.addr && end <= self.end(),
            None => false,
        }
    }
}

/// One registered buffer as the registry keeps it.
#[derive(Debug)]
struct Entry {
    region: Region,
    /// Held by transports serving peers while they touch the buffer.
    fence: Arc<Fence>,
    /// Host or GPU memory, as the CUDA driver said at registration.
    residence: Residence,
}

/// Registered buffers keyed by base address; no two overlap. Each has the
/// [`Fence`] that transports serving peers hold while they touch it.
#[derive(Debug, Default)]
pub struct MemoryRegistry {
    regions: BTreeMap<u64, Entry>,
}

impl MemoryRegistry {
    #[cfg(test)]
    fn len(&self) -> usize {
        self.regions.len()
    }

    /// Whether `[addr, addr + len)` overlaps a registered region.
    fn overlaps(&self, addr: u64, len: u64) -> bool {
        let end = addr.saturating_add(len);
        if let Some((_, e)) = self.regions.range(..=addr).next_back() {
            if e.region.end() > addr {
                return true;
            }
        }
        self.regions.range(addr..end).next().is_some()
    }

    /// Checks one new region: non-zero length, no address overflow.
    fn check_new(addr: u64, length: u64) -> Result<()> {
        if addr == 0 {
            return Err(Error::InvalidArgument("buffer address is NULL".into()));
        }
        if length == 0 {
            return Err(Error::InvalidArgument(format!(
                "buffer {addr:#x} has length 0"
            )));
        }
        if addr.checked_add(length).is_none() {
            return Err(Error::InvalidArgument(format!(
                "buffer {addr:#x}+{length} wraps the address space"
            )));
        }
        Ok(())
    }

    /// Checks that `regions` could all be added: valid, not overlapping each
    /// other nor anything registered. Nothing is changed.
    pub fn check_insert(&self, regions: &[Region]) -> Result<()> {
        for r in regions {
            Self::check_new(r.addr, r.length)?;
            let residence = device::residence(r.addr, r.length);
            if let Residence::Foreign(..) = residence {
                return Err(Error::InvalidArgument(format!(
                    "buffer {:#x}+{} is {residence}, which no transport of this engine moves yet",
                    r.addr, r.length
                )));
            }
        }
        let mut sorted: Vec<&Region> = regions.iter().collect();
        sorted.sort_by_key(|r| r.addr);
        for pair in sorted.windows(2) {
            if pair[0].end() > pair[1].addr {
                return Err(Error::AddressOverlapped(format!(
                    "buffers {:#x}+{} and {:#x}+{} overlap each other",
                    pair[0].addr, pair[0].length, pair[1].addr, pair[1].length
                )));
            }
        }
        for r in regions {
            if self.overlaps(r.addr, r.length) {
                return Err(Error::AddressOverlapped(format!(
                    "buffer {:#x}+{} overlaps a registered buffer",
                    r.addr, r.length
                )));
            }
        }
        Ok(())
    }

    /// Adds `regions` atomically: all of them or, on error, none. A
    /// buffer in GPU memory is located at its GPU (`cuda:N`), whatever
    /// location the caller gave.
    pub fn insert(&mut self, regions: &[Region]) -> Result<()> {
        self.check_insert(regions)?;
        for r in regions {
            let residence = device::residence(r.addr, r.length);
            let mut region = r.clone();
            if let Residence::Device(n) = residence {
                if region.location != Location::Cuda(n) {
                    tracing::info!(
                        "buffer {:#x}+{} registered at {} is memory of GPU {n}: located at cuda:{n}",
                        r.addr,
                        r.length,
                        r.location
                    );
                }
                region.location = Location::Cuda(n);
            }
            let fence = Arc::new(Fence::new());
            self.regions.insert(
                r.addr,
                Entry {
                    region,
                    fence,
                    residence,
                },
            );
        }
        Ok(())
    }

    /// Removes the region whose base is exactly `addr` and revokes its
    /// fence: when this returns, no transport touches it for a peer.
    pub fn remove(&mut self, addr: u64) -> Result<Region> {
        let entry = self.regions.remove(&addr).ok_or_else(|| {
            Error::AddressNotRegistered(format!("no buffer is registered at {addr:#x}"))
        })?;
        entry.fence.revoke();
        Ok(entry.region)
    }

    /// The entry whose region holds all of `[addr, addr + len)`.
    fn entry(&self, addr: u64, len: u64) -> Option<&Entry> {
        let (_, e) = self.regions.range(..=addr).next_back()?;
        e.region.contains(addr, len).then_some(e)
    }

    /// The fences of every registered region that overlaps `[addr, addr +
    /// len)`: what a copy within the process holds while it touches the
    /// range, so that unregistering any of them waits for it.
    pub fn fences_over(&self, addr: u64, len: u64) -> impl Iterator<Item = &Arc<Fence>> {
        let end = addr.saturating_add(len);
        let before = self
            .regions
            .range(..addr)
            .next_back()
            .filter(|(_, e)| e.region.addr.saturating_add(e.region.length) > addr);
        before
            .into_iter()
            .chain(self.regions.range(addr..end))
            .map(|(_, e)| &e.fence)
    }

    /// The region that holds all of `[addr, addr + len)`, with its fence,
    /// if one does.
    pub fn find_fenced(&self, addr: u64, len: u64) -> Option<(&Region, &Arc<Fence>)> {
        self.entry(addr, len).map(|e| (&e.region, &e.fence))
    }

    /// The region that holds all of `[addr, addr + len)`, if one does.
    pub fn find(&self, addr: u64, len: u64) -> Option<&Region> {
        self.entry(addr, len).map(|e| &e.region)
    }

    /// Where `[addr, addr + len)` lives: as recorded at registration when
    /// a registered buffer holds it, else as the CUDA driver says now.
    pub fn residence(&self, addr: u64, len: u64) -> Residence {
        match self.entry(addr, len) {
            Some(e) => e.residence,
            None => device::residence(addr, len),
        }
    }

    /// The fence of the remotely accessible region that holds all of
    /// `[addr, addr + len)` (`len > 0`), if one does and the CPU may copy
    /// it: a peer's request to a buffer in GPU memory is refused, since the
    /// transports that ask copy with the CPU.
    pub fn admit(&self, addr: u64, len: u64) -> Option<Arc<Fence>> {
        self.admit_where(addr, len, false).map(|(fence, _)| fence)
    }

    /// [`RemoteMemory::admit_staged`].
    pub fn admit_staged(&self, addr: u64, len: u64) -> Option<(Arc<Fence>, Option<u32>)> {
        self.admit_where(addr, len, staging::available())
    }

    /// The fence of the remotely accessible region holding `[addr, addr +
    /// len)`, with its GPU where it is CUDA GPU memory and `staged` (the
    /// transport copies it with the driver); other GPU memory is refused.
    fn admit_where(&self, addr: u64, len: u64, staged: bool) -> Option<(Arc<Fence>, Option<u32>)> {
        let e = self.entry(addr, len)?;
        if !(len > 0 && e.region.remote_accessible) {
            return None;
        }
        let gpu = match e.residence {
            Residence::Host => None,
            Residence::Device(n) if staged => Some(n),
            r => {
                crate::log_limit::warn_limited!(
                    "a peer's request to {addr:#x}+{len} is refused: that buffer is {r}, which \
                     this transport would have to copy with the CPU"
                );
                return None;
            }
        };
        Some((e.fence.clone(), gpu))
    }

    /// Resolves the `*` location of the regions at `addrs` to the NUMA
    /// node of their first page where it has one ([`Location::resolve`]).
    pub fn resolve_locations(&mut self, addrs: impl IntoIterator<Item = u64>) {
        for addr in addrs {
            if let Some(e) = self.regions.get_mut(&addr) {
                e.region.location = e.region.location.resolve(e.region.addr);
            }
        }
    }

    /// Every registered region, by address.
    pub fn regions(&self) -> impl Iterator<Item = &Region> {
        self.regions.values().map(|e| &e.region)
    }
}

impl RemoteMemory for RwLock<MemoryRegistry> {
    fn admit(&self, addr: u64, len: u64) -> Option<Arc<Fence>> {
        sync::read(self).admit(addr, len)
    }

    fn admit_staged(&self, addr: u64, len: u64) -> Option<(Arc<Fence>, Option<u32>)> {
        sync::read(self).admit_staged(addr, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(addr: u64, length: u64) -> Region {
        Region {
            addr,
            length,
            location: Location::Any,
            remote_accessible: true,
        }
    }

    #[test]
    fn locations_parse() {
        assert_eq!(Location::parse("cpu:0").unwrap(), Location::Cpu(0));
        assert_eq!(Location::parse("cuda:3").unwrap(), Location::Cuda(3));
        assert_eq!(Location::parse("*").unwrap(), Location::Any);
        assert_eq!(Location::parse("").unwrap(), Location::Any);
        assert!(Location::parse("gpu:0").is_err());
        assert!(Location::parse("cpu:x").is_err());
        assert_eq!(Location::Cpu(1).to_string(), "cpu:1");
    }

    #[test]
    fn overlap_rules() {
        let mut m = MemoryRegistry::default();
        m.insert(&[region(0x1000, 0x1000)]).unwrap();
        let overlapped = |e: Error| matches!(e, Error::AddressOverlapped(_));
        assert!(overlapped(m.insert(&[region(0x1000, 0x1000)]).unwrap_err()));
        assert!(overlapped(m.insert(&[region(0x1800, 0x100)]).unwrap_err()));
        assert!(overlapped(m.insert(&[region(0x800, 0x900)]).unwrap_err()));
        assert!(overlapped(m.insert(&[region(0x800, 0x2000)]).unwrap_err()));
        m.insert(&[region(0x2000, 0x10)]).unwrap();
        m.insert(&[region(0xff0, 0x10)]).unwrap();
        assert!(matches!(
            m.insert(&[region(0x5000, 0)]).unwrap_err(),
            Error::InvalidArgument(_)
        ));
        assert!(matches!(
            m.insert(&[region(u64::MAX - 1, 4)]).unwrap_err(),
            Error::InvalidArgument(_)
        ));
        // a batch that overlaps itself adds nothing
        assert!(overlapped(
            m.insert(&[region(0x9000, 0x100), region(0x90f0, 0x100)])
                .unwrap_err()
        ));
        assert!(m.find(0x9000, 1).is_none());
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn find_needs_one_region() {
        let mut m = MemoryRegistry::default();
        m.insert(&[region(0x1000, 0x2000), region(0x3000, 0x1000)])
            .unwrap();
        assert!(m.find(0x1000, 0x2000).is_some());
        assert!(m.find(0x2fff, 1).is_some());
        assert!(m.find(0x2fff, 2).is_none(), "spanning two adjacent regions");
        assert!(m.find(0x4000, 1).is_none());
        assert!(m.find(0xfff, 2).is_none());
        assert!(m.find(0x1000, u64::MAX).is_none());
        assert!(matches!(
            m.remove(0x1001),
            Err(Error::AddressNotRegistered(_))
        ));
        m.remove(0x1000).unwrap();
        assert!(m.find(0x1000, 1).is_none());
    }
}
