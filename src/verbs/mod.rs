//! The verbs layer: safe owners of libibverbs objects. No verbs call
//! happens outside this module, and libibverbs is loaded at run time
//! ([`library`]), not linked.
//!
//! Each object is one owning struct (`NonNull` + `Drop`) holding `Arc`s to
//! its parents, so a parent is never freed while a child lives:
//! [`Context`] <- [`ProtectionDomain`] <- [`MemoryRegion`];
//! [`Context`] <- [`CompletionChannel`] <- [`CompletionQueue`];
//! [`ProtectionDomain`] + [`CompletionQueue`] <- [`QueuePair`].

mod context;
mod cq;
mod library;
mod pd;
mod qp;

pub use context::{AsyncEventKind, Context, device_names};
pub use cq::{CompletionChannel, CompletionQueue, WorkCompletion};
pub(crate) use library::has_reg_dmabuf_mr;
pub use pd::{MemoryRegion, ProtectionDomain};
pub use qp::{ConnectParams, QueuePair, QueuePairCaps, WorkRequest};

use std::io;

/// A GID: 16 bytes, as in `ibv_gid.raw`.
pub type Gid = [u8; 16];

/// Path MTU in bytes for a verbs `ibv_mtu` value (1..=5), and back.
pub fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        5 => 4096,
        _ => 0,
    }
}

/// The verbs `ibv_mtu` value for an MTU in bytes (256..=4096, a power of two).
pub fn mtu_enum(bytes: u32) -> Option<u32> {
    (1..=5).find(|&m| mtu_bytes(m) == bytes)
}

/// Maps a verbs return code (0, or an errno value, or -1 with `errno`).
fn check(rc: libc::c_int) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        n if n > 0 => Err(io::Error::from_raw_os_error(n)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Makes a file descriptor non-blocking.
fn set_nonblocking(fd: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we were handed by libibverbs; F_GETFL
    // and F_SETFL only read and set its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Formats a GID as Mooncake publishes it: 16 lowercase two-digit hex bytes
/// joined by `:`.
pub fn gid_to_string(gid: &Gid) -> String {
    let parts: Vec<String> = gid.iter().map(|b| format!("{b:02x}")).collect();
    parts.join(":")
}

/// Parses a GID in Mooncake's form (16 hex bytes joined by `:`, each one
/// or two digits).
pub fn parse_gid(s: &str) -> Option<Gid> {
    let mut gid = [0u8; 16];
    let mut parts = s.split(':');
    for b in gid.iter_mut() {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_round_trip_in_mooncake_form() {
        let gid: Gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1];
        let s = gid_to_string(&gid);
        assert_eq!(s, "00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:01");
        assert_eq!(parse_gid(&s), Some(gid));
        assert_eq!(parse_gid("0:0:0:0:0:0:0:0:0:0:ff:ff:c6:12:0:1"), Some(gid));
        assert_eq!(parse_gid(""), None);
        assert_eq!(parse_gid(&format!("{s}:00")), None);
        assert_eq!(parse_gid(&s[3..]), None);
        assert_eq!(
            parse_gid("00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:100"),
            None
        );
        assert_eq!(
            parse_gid("zz:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:01"),
            None
        );
    }

    #[test]
    fn mtus() {
        assert_eq!(mtu_bytes(5), 4096);
        assert_eq!(mtu_enum(1024), Some(3));
        assert_eq!(mtu_enum(1000), None);
        assert_eq!(mtu_bytes(0), 0);
    }
}
