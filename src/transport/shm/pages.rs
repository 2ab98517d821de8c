//! Which pages back a caller's buffer. Peers copy caller memory with
//! cross-memory attach, which looks up and pins every page on its way:
//! memory in 4 KiB pages is copied about half as fast as memory in huge
//! pages (docs/shm.md, "Huge pages"). The engine never changes the pages
//! of memory it is handed; it says so once, when a large buffer is in
//! small pages, so that the operator knows what to change.

use std::io::{BufRead, BufReader};

/// Buffers smaller than this are not looked at: the page walk costs
/// little there, and the caller's whole address space is read to tell.
pub(crate) const LARGE: u64 = 64 << 20;

/// How many large buffers an engine looks at: a caller registering many
/// (a KV cache per layer) pays for a few reads of its memory map, not one
/// per buffer.
pub(crate) const CHECKS: usize = 4;

/// Resident kibibytes of the mappings that overlap a range, and how many
/// of them are in pages larger than 4 KiB.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pages {
    pub resident_kib: u64,
    pub huge_kib: u64,
}

impl Pages {
    /// Whether most of the resident memory is in 4 KiB pages.
    pub(crate) fn mostly_small(&self) -> bool {
        self.resident_kib > 0 && self.huge_kib * 2 < self.resident_kib
    }
}

/// The pages of the mappings of this process that overlap
/// `[addr, addr + len)`, from `/proc/self/smaps` (whole mappings: a
/// mapping that only partly overlaps counts whole). `None` where the file
/// cannot be read.
pub(crate) fn of_range(addr: u64, len: u64) -> Option<Pages> {
    let file = std::fs::File::open("/proc/self/smaps").ok()?;
    Some(scan(BufReader::new(file), addr, addr.saturating_add(len)))
}

/// [`of_range`] over the text of an smaps file.
fn scan(text: impl BufRead, start: u64, end: u64) -> Pages {
    let mut pages = Pages::default();
    let mut inside = false;
    // A mapping's resident size and its page size come in separate lines;
    // hugetlbfs pages count as huge whole.
    let (mut rss, mut page_kib) = (0, 4);
    fn flush(pages: &mut Pages, inside: bool, rss: u64, page_kib: u64) {
        if inside {
            pages.resident_kib += rss;
            if page_kib > 4 {
                pages.huge_kib += rss;
            }
        }
    }
    for line in text.lines() {
        let Ok(line) = line else { break };
        if let Some((from, to)) = mapping_range(&line) {
            flush(&mut pages, inside, rss, page_kib);
            inside = from < end && start < to;
            (rss, page_kib) = (0, 4);
            continue;
        }
        if !inside {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(key), Some(kib)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(kib) = kib.parse::<u64>() else {
            continue;
        };
        match key {
            "Rss:" => rss = kib,
            "KernelPageSize:" => page_kib = kib,
            "AnonHugePages:" | "ShmemPmdMapped:" | "FilePmdMapped:" if page_kib == 4 => {
                pages.huge_kib += kib
            }
            _ => {}
        }
    }
    flush(&mut pages, inside, rss, page_kib);
    pages
}

/// The address range of an smaps mapping line (`start-end perms ...`).
fn mapping_range(line: &str) -> Option<(u64, u64)> {
    let range = line.split_whitespace().next()?;
    let (from, to) = range.split_once('-')?;
    Some((
        u64::from_str_radix(from, 16).ok()?,
        u64::from_str_radix(to, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f0000000000-7f0004000000 rw-p 00000000 00:00 0 
Size:              65536 kB
KernelPageSize:        4 kB
Rss:               65536 kB
AnonHugePages:     63488 kB
7f0004000000-7f0008000000 rw-p 00000000 00:00 0 
Size:              65536 kB
KernelPageSize:        4 kB
Rss:               65536 kB
AnonHugePages:         0 kB
7f0008000000-7f0008400000 rw-s 00000000 00:10 5          /dev/hugepages/kv
Size:               4096 kB
KernelPageSize:     2048 kB
Rss:                4096 kB
AnonHugePages:         0 kB
";

    fn of(start: u64, end: u64) -> Pages {
        scan(SMAPS.as_bytes(), start, end)
    }

    fn kib(resident_kib: u64, huge_kib: u64) -> Pages {
        Pages {
            resident_kib,
            huge_kib,
        }
    }

    #[test]
    fn a_range_counts_the_mappings_it_overlaps() {
        let huge = of(0x7f0000001000, 0x7f0000002000);
        assert_eq!(huge, kib(65536, 63488));
        assert!(!huge.mostly_small());
        let small = of(0x7f0004000000, 0x7f0004100000);
        assert_eq!(small, kib(65536, 0));
        assert!(small.mostly_small());
        let both = of(0x7f0003000000, 0x7f0005000000);
        assert_eq!(both, kib(131072, 63488));
        assert!(both.mostly_small());
    }

    #[test]
    fn hugetlbfs_pages_are_huge_and_unmapped_ranges_are_empty() {
        let tlb = of(0x7f0008000000, 0x7f0008400000);
        assert_eq!(tlb, kib(4096, 4096));
        assert!(!tlb.mostly_small());
        let none = of(0x1000, 0x2000);
        assert_eq!(none, Pages::default());
        assert!(!none.mostly_small());
    }

    #[test]
    fn this_process_memory_is_found() {
        let v = vec![1u8; 8 << 20];
        let p = of_range(v.as_ptr() as u64, v.len() as u64).expect("smaps");
        assert!(p.resident_kib >= 8 << 10, "{p:?}");
    }
}
