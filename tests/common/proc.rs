//! What this test process spends, read from `/proc/self`: threads,
//! descriptors and resident memory; and its descriptor limit.

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

/// Descriptors this process has open now.
pub fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// Raises the soft descriptor limit to the hard one; panics if that is
/// not above `need`.
pub fn raise_fd_limit(need: usize) {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads and writes one rlimit we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
        rl.rlim_cur = rl.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
    }
    assert!(
        rl.rlim_cur as usize > need,
        "the descriptor limit ({}) is too low for this test (needs {need})",
        rl.rlim_cur
    );
}
