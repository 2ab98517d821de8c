//! Cross-memory attach: copies from another process's memory into this
//! one's with `process_vm_readv`, many ranges per call. The transport only
//! ever reads a peer (each process writes its own memory only), so there is
//! no wrapper of `process_vm_writev`.

use std::io;

/// Most ranges per call (the kernel's `IOV_MAX`).
pub const MAX_IOV: usize = 1024;

/// One contiguous range to copy from the peer into this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Destination address in this process.
    pub local: u64,
    /// Source address in the peer.
    pub remote: u64,
    /// Bytes.
    pub len: u64,
}

/// Why a piece was not copied whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyError {
    /// The kernel refused to let us read the peer (EPERM: another user, a
    /// ptrace policy, a container boundary).
    Denied,
    /// The peer process is gone (ESRCH).
    Gone,
    /// An address was not mapped, or another error (the errno).
    Fault(i32),
}

impl CopyError {
    fn from_errno(e: i32) -> CopyError {
        match e {
            libc::EPERM | libc::EACCES => CopyError::Denied,
            libc::ESRCH => CopyError::Gone,
            e => CopyError::Fault(e),
        }
    }

    /// Whether every later copy from this peer fails the same way.
    pub fn is_final(self) -> bool {
        matches!(self, CopyError::Denied | CopyError::Gone)
    }
}

fn iovec(addr: u64, len: u64) -> libc::iovec {
    libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: len as usize,
    }
}

/// Copies every piece from process `pid` into this process, with as few
/// `process_vm_readv` calls as the kernel allows, and returns how each
/// piece ended (in order). A piece that failed may have been copied in
/// part; the pieces after it are still tried, unless the error is
/// [final](CopyError::is_final).
///
/// # Safety
/// Every `local` range must be memory of this process that nothing else
/// reads or writes during the call (the caller owns it for the copy).
/// The remote ranges need no care: the kernel checks them.
pub unsafe fn read_from(pid: i32, pieces: &[Piece]) -> Vec<Result<(), CopyError>> {
    let mut results = Vec::with_capacity(pieces.len());
    // `done` bytes of piece `results.len()` are copied already.
    let mut done = 0u64;
    let mut local = Vec::with_capacity(pieces.len().min(MAX_IOV));
    let mut remote = Vec::with_capacity(pieces.len().min(MAX_IOV));
    while results.len() < pieces.len() {
        let first = results.len();
        local.clear();
        remote.clear();
        for (k, p) in pieces[first..].iter().take(MAX_IOV).enumerate() {
            let skip = if k == 0 { done } else { 0 };
            local.push(iovec(p.local + skip, p.len - skip));
            remote.push(iovec(p.remote + skip, p.len - skip));
        }
        // SAFETY: the local ranges are ours to write (the caller's
        // contract); the kernel validates the remote ones and reports
        // EFAULT instead of faulting.
        let n = unsafe {
            libc::process_vm_readv(
                pid,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        if n <= 0 {
            let e = if n == 0 {
                CopyError::Fault(libc::EFAULT)
            } else {
                CopyError::from_errno(io::Error::last_os_error().raw_os_error().unwrap_or(0))
            };
            if e.is_final() {
                results.resize(pieces.len(), Err(e));
            } else {
                results.push(Err(e));
            }
            done = 0;
            continue;
        }
        let mut left = n as u64;
        for p in &pieces[first..] {
            let want = p.len - done;
            if left < want {
                done += left;
                break;
            }
            left -= want;
            done = 0;
            results.push(Ok(()));
            if results.len() == first + local.len() {
                break;
            }
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(local: &mut [u8], remote: &[u8]) -> Piece {
        Piece {
            local: local.as_mut_ptr() as u64,
            remote: remote.as_ptr() as u64,
            len: remote.len() as u64,
        }
    }

    #[test]
    fn copies_many_ranges_of_our_own_process() {
        let src: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
        let mut dst = vec![0u8; 3000];
        let (a, b) = dst.split_at_mut(1000);
        let pieces = [piece(b, &src[1000..]), piece(a, &src[..1000])];
        // SAFETY: `dst` is ours and untouched during the call.
        let r = unsafe { read_from(std::process::id() as i32, &pieces) };
        assert_eq!(r, vec![Ok(()), Ok(())]);
        assert_eq!(dst, src);
    }

    #[test]
    fn more_pieces_than_one_call_takes() {
        let n = MAX_IOV * 2 + 3;
        let src: Vec<u8> = (0..n).map(|i| i as u8 ^ 0x5a).collect();
        let mut dst = vec![0u8; n];
        let pieces: Vec<Piece> = (0..n)
            .map(|i| Piece {
                local: dst.as_mut_ptr() as u64 + i as u64,
                remote: src.as_ptr() as u64 + i as u64,
                len: 1,
            })
            .collect();
        // SAFETY: `dst` is ours and untouched during the call.
        let r = unsafe { read_from(std::process::id() as i32, &pieces) };
        assert!(r.iter().all(Result::is_ok));
        assert_eq!(r.len(), n);
        assert_eq!(dst, src);
    }

    #[test]
    fn an_unmapped_source_fails_its_piece_only() {
        let src = [9u8; 64];
        let mut dst = vec![0u8; 192];
        let base = dst.as_mut_ptr() as u64;
        let pieces = [
            Piece {
                local: base,
                remote: src.as_ptr() as u64,
                len: 64,
            },
            Piece {
                local: base + 64,
                remote: 8, // never mapped
                len: 64,
            },
            Piece {
                local: base + 128,
                remote: src.as_ptr() as u64,
                len: 64,
            },
        ];
        // SAFETY: `dst` is ours and untouched during the call.
        let r = unsafe { read_from(std::process::id() as i32, &pieces) };
        assert_eq!(r[0], Ok(()));
        assert_eq!(r[1], Err(CopyError::Fault(libc::EFAULT)));
        assert_eq!(r[2], Ok(()));
        assert!(dst[..64].iter().all(|&b| b == 9));
        assert!(dst[64..128].iter().all(|&b| b == 0));
        assert!(dst[128..].iter().all(|&b| b == 9));
    }

    #[test]
    fn a_process_that_is_gone_fails_every_piece() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        let src = [1u8; 8];
        let mut dst = [0u8; 16];
        let (a, b) = dst.split_at_mut(8);
        let pieces = [piece(a, &src), piece(b, &src)];
        // SAFETY: `dst` is ours and untouched during the call.
        let r = unsafe { read_from(pid, &pieces) };
        assert_eq!(r, vec![Err(CopyError::Gone); 2]);
    }
}
