//! What a process spends, read from `/proc`: threads, descriptors and
//! resident memory of this process, resident memory of a child; and this
//! process's descriptor limit.

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`, ...), in KiB;
/// `pid` is a process id or `self`.
pub fn status_kb_of(pid: &str, field: &str) -> u64 {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {path}"))
}

/// A `kB` field of `/proc/self/status`, in KiB.
pub fn status_kb(field: &str) -> u64 {
    status_kb_of("self", field)
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

/// Waits (at most 10 s) until process `pid` is stopped: `kill(SIGSTOP)`
/// returns before the process stops, and a test that acts on a stopped
/// peer must not race its last moments of running.
pub fn wait_stopped(pid: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next());
        if matches!(state, Some("T") | Some("t")) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("process {pid} did not stop within 10 s");
}
