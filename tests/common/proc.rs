//! What this test process spends, read from `/proc/self`: threads and
//! resident memory.

/// A `kB` field of `/proc/self/status` (`VmRSS`, `VmHWM`, ...), in KiB.
pub fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Resident set size now, in KiB.
pub fn rss_kb() -> u64 {
    status_kb("VmRSS")
}

/// Threads of this process now.
pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .count()
}
