//! What the `*` location of a buffer resolves to: the NUMA node of its
//! first page, as Mooncake's `getMemoryLocation` asks it (`move_pages(2)`
//! with no target nodes, which only reports where each page is). Nothing
//! is touched: a page that is not resident (never written, swapped out)
//! has no node, and the buffer stays `*`, as in Mooncake. The engine asks
//! after the transports registered the buffer, and an RDMA registration
//! pins, and so faults in, every page: then the page is resident.

use super::Location;

/// Why a page has no node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoNode {
    /// The kernel has no NUMA support (`ENOSYS`) or refused the query.
    Unsupported(i32),
    /// The page is mapped but not resident (`ENOENT`).
    NotResident,
    /// Not mapped memory of this process (`EFAULT`), or another status.
    Status(i32),
}

/// The NUMA node of the page holding `addr`.
pub fn page_node(addr: u64) -> Result<u32, NoNode> {
    // SAFETY: sysconf has no memory effects.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    };
    let pages = [(addr & !(page - 1)) as *mut libc::c_void];
    let mut status = [0 as libc::c_int];
    // SAFETY: one page pointer and one status slot, both valid for the
    // call; with `nodes` NULL the kernel only reports each page's node and
    // moves nothing (and reads no byte of the page).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0 as libc::pid_t,
            1 as libc::c_ulong,
            pages.as_ptr(),
            std::ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0 as libc::c_int,
        )
    };
    if rc != 0 {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        return Err(NoNode::Unsupported(errno));
    }
    node_from_status(status[0])
}

/// A `move_pages(2)` status: a node, or a negated errno.
fn node_from_status(status: i32) -> Result<u32, NoNode> {
    match u32::try_from(status) {
        Ok(node) => Ok(node),
        Err(_) if status == -libc::ENOENT => Err(NoNode::NotResident),
        Err(_) => Err(NoNode::Status(-status)),
    }
}

impl Location {
    /// `cpu:N` for `*` when the page at `addr` is resident on node N; any
    /// other location, or `*` whose page has no node, as it is.
    pub fn resolve(&self, addr: u64) -> Location {
        if *self != Location::Any {
            return self.clone();
        }
        match page_node(addr) {
            Ok(node) => Location::Cpu(node),
            Err(why) => {
                tracing::debug!(
                    "buffer {addr:#x}: no NUMA node for its first page ({why:?}); its \
                     location stays \"*\""
                );
                Location::Any
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An anonymous private mapping of `len` bytes, unmapped on drop.
    struct Map(*mut libc::c_void, usize);

    impl Map {
        fn new(len: usize) -> Map {
            // SAFETY: a fresh anonymous mapping; no existing memory is
            // affected.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            Map(p, len)
        }
    }

    impl Drop for Map {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, unmapped once.
            unsafe { libc::munmap(self.0, self.1) };
        }
    }

    #[test]
    fn statuses_name_a_node_or_why_not() {
        assert_eq!(node_from_status(0), Ok(0));
        assert_eq!(node_from_status(3), Ok(3));
        assert_eq!(node_from_status(-libc::ENOENT), Err(NoNode::NotResident));
        assert_eq!(
            node_from_status(-libc::EFAULT),
            Err(NoNode::Status(libc::EFAULT))
        );
    }

    #[test]
    fn a_written_page_has_this_machines_node_and_an_untouched_one_none() {
        let nodes: Vec<u32> = std::fs::read_dir("/sys/devices/system/node")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
                    .collect()
            })
            .unwrap_or_else(|_| vec![0]);
        let map = Map::new(3 * 4096);
        let base = map.0 as u64;
        // Never written: not resident, so `*` stays.
        assert_eq!(page_node(base + 4096), Err(NoNode::NotResident));
        assert_eq!(Location::Any.resolve(base + 4096), Location::Any);
        // SAFETY: inside the mapping, which is writable.
        unsafe { *(map.0 as *mut u8).add(4096 + 17) = 1 };
        let node = page_node(base + 4096 + 100).expect("a written page has a node");
        assert!(nodes.contains(&node), "node {node} not among {nodes:?}");
        assert_eq!(Location::Any.resolve(base + 4096), Location::Cpu(node));
        // Only `*` is resolved.
        assert_eq!(Location::Cuda(1).resolve(base + 4096), Location::Cuda(1));
        assert_eq!(Location::Cpu(7).resolve(base + 4096), Location::Cpu(7));
        // Not mapped (below the lowest address a mapping may take).
        assert_eq!(page_node(4096), Err(NoNode::Status(libc::EFAULT)));
    }
}
