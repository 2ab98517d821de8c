//! The process's limit on open descriptors.

/// Raises the soft limit on open descriptors to the hard limit, as
/// Mooncake does: connections to many peers need descriptors.
pub(crate) fn raise() {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write one rlimit we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                tracing::debug!("could not raise the descriptor limit to {}", rl.rlim_max);
            }
        }
    }
}
