//! What this test process spends, read from `/proc/self`: threads, resident
//! memory, and a raised limit of open files for tests that hold many sockets.

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

/// Raises the soft limit of open files to the hard limit (at most
/// `want`), so a test holding hundreds of sockets on both ends does not hit
/// the usual 1024.
pub fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit/setrlimit to read and write.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}
