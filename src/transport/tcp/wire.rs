//! Mooncake's TCP data protocol (spec §4) and the socket I/O that moves
//! registered memory without staging copies.
//!
//! A request is a 24-byte header `{u64 size, u64 addr, u8 opcode, 7 pad}`,
//! little-endian; opcode 1 is WRITE (payload follows), anything else READ.
//! With the v2 flag (0x80) the server acknowledges: an 8-byte status word
//! before READ data, and after the last WRITE byte is stored.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Size of a request header on the wire.
pub const HEADER_LEN: usize = 24;
/// Opcode of a WRITE.
pub const OP_WRITE: u8 = 1;
/// Opcode of a READ (the server treats any non-WRITE opcode as READ).
pub const OP_READ: u8 = 0;
/// Opcode flag of the acknowledged (v2) framing.
pub const V2_FLAG: u8 = 0x80;
/// Status word: request applied.
pub const STATUS_OK: u64 = 0x4D43_5456_0000_0000;
/// Status word: address range rejected.
pub const STATUS_ADDR_REJECTED: u64 = 0x4D43_5456_0000_0001;

/// Whether a status word carries the `MCTV` magic.
pub fn status_valid(word: u64) -> bool {
    word >> 32 == 0x4D43_5456
}

/// A decoded request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Payload size.
    pub size: u64,
    /// Absolute address in the server process.
    pub addr: u64,
    /// Raw opcode byte (with the v2 flag).
    pub opcode: u8,
}

impl Header {
    /// Encodes the header; padding bytes are zero.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16] = self.opcode;
        b
    }

    /// Decodes a header; padding is ignored.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Header {
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[r]);
            u64::from_le_bytes(w)
        };
        Header {
            size: word(0..8),
            addr: word(8..16),
            opcode: b[16],
        }
    }

    /// Whether the v2 flag is set.
    pub fn v2(&self) -> bool {
        self.opcode & V2_FLAG != 0
    }

    /// Whether this is a WRITE.
    pub fn is_write(&self) -> bool {
        self.opcode & !V2_FLAG == OP_WRITE
    }
}

/// When a blocked socket call gives up: no progress for `stall`, or
/// `cancel` set (engine shutdown or the lane's connection declared dead).
pub struct Patience<'a> {
    /// Longest time without a byte of progress.
    pub stall: Duration,
    /// Set to abandon the call.
    pub cancel: &'a AtomicBool,
}

impl Patience<'_> {
    fn check(&self, since: Instant) -> io::Result<()> {
        if self.cancel.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "connection closed",
            ));
        }
        if since.elapsed() >= self.stall {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no progress within the timeout",
            ));
        }
        Ok(())
    }
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    ) && e.raw_os_error().is_some()
}

/// Sends every byte described by `iov`, advancing it in place. The socket
/// must have a send timeout so a stalled peer is noticed.
pub fn send_iov(fd: RawFd, iov: &mut [libc::iovec], patience: &Patience<'_>) -> io::Result<()> {
    let mut first = 0;
    let mut progress = Instant::now();
    while first < iov.len() {
        if iov[first].iov_len == 0 {
            first += 1;
            continue;
        }
        let rest = &iov[first..];
        let msg = libc::msghdr {
            msg_name: std::ptr::null_mut(),
            msg_namelen: 0,
            msg_iov: rest.as_ptr() as *mut libc::iovec,
            msg_iovlen: rest.len().min(1024),
            msg_control: std::ptr::null_mut(),
            msg_controllen: 0,
            msg_flags: 0,
        };
        // SAFETY: every iovec points into memory the caller guarantees valid
        // for its length (registered or caller-owned buffers, headers on the
        // stack); MSG_NOSIGNAL turns a closed peer into EPIPE, not SIGPIPE.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if would_block(&e) {
                patience.check(progress)?;
                continue;
            }
            return Err(e);
        }
        progress = Instant::now();
        let mut n = n as usize;
        while n > 0 && first < iov.len() {
            let v = &mut iov[first];
            if n >= v.iov_len {
                n -= v.iov_len;
                v.iov_len = 0;
                first += 1;
            } else {
                // SAFETY: advancing within the same buffer.
                v.iov_base = unsafe { v.iov_base.cast::<u8>().add(n) }.cast();
                v.iov_len -= n;
                n = 0;
            }
        }
        patience.check(Instant::now())?;
    }
    Ok(())
}

/// Receives exactly `len` bytes into `dst`.
fn recv_raw(fd: RawFd, dst: *mut u8, len: usize, patience: &Patience<'_>) -> io::Result<()> {
    let mut done = 0;
    let mut progress = Instant::now();
    while done < len {
        // SAFETY: `dst` is valid for `len` bytes (caller's contract).
        let n = unsafe { libc::recv(fd, dst.add(done).cast(), len - done, 0) };
        match n {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection",
                ));
            }
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if would_block(&e) {
                    patience.check(progress)?;
                    continue;
                }
                return Err(e);
            }
            n => {
                done += n as usize;
                progress = Instant::now();
            }
        }
    }
    Ok(())
}

/// Payload tails at least this long are received straight into their
/// destination rather than through the buffer.
const DIRECT_RECV_MIN: usize = 16 * 1024;

/// A receive buffer in front of a socket: small items (headers, status
/// words, small payloads) come from it; large payloads go straight into
/// their destination.
pub struct RecvBuf {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl RecvBuf {
    /// A buffer of `cap` bytes.
    pub fn new(cap: usize) -> RecvBuf {
        RecvBuf {
            buf: vec![0u8; cap].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Receives what is available (at least one byte) into the buffer.
    /// Returns `Ok(false)` on a clean end of stream.
    fn fill(&mut self, fd: RawFd, patience: &Patience<'_>) -> io::Result<bool> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let progress = Instant::now();
        loop {
            let room = self.buf.len() - self.end;
            // SAFETY: receives into the free tail of our own buffer.
            let n = unsafe { libc::recv(fd, self.buf.as_mut_ptr().add(self.end).cast(), room, 0) };
            match n {
                0 => return Ok(false),
                n if n < 0 => {
                    let e = io::Error::last_os_error();
                    if would_block(&e) {
                        patience.check(progress)?;
                        continue;
                    }
                    return Err(e);
                }
                n => {
                    self.end += n as usize;
                    return Ok(true);
                }
            }
        }
    }

    /// Receives exactly `len` bytes into `dst`, buffered bytes first.
    ///
    /// # Safety
    /// `dst` must be valid for writing `len` bytes.
    pub unsafe fn read_into(
        &mut self,
        fd: RawFd,
        dst: *mut u8,
        len: usize,
        patience: &Patience<'_>,
    ) -> io::Result<()> {
        let mut done = 0;
        while done < len {
            if self.start < self.end {
                let n = (self.end - self.start).min(len - done);
                // SAFETY: `dst` holds `len` bytes; the source is our buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.buf.as_ptr().add(self.start),
                        dst.add(done),
                        n,
                    )
                };
                self.start += n;
                done += n;
            } else if len - done >= DIRECT_RECV_MIN {
                // SAFETY: as above.
                return recv_raw(fd, unsafe { dst.add(done) }, len - done, patience);
            } else if !self.fill(fd, patience)? {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection",
                ));
            }
        }
        Ok(())
    }

    /// Receives a fixed-size item: waiting for its first byte with `first`,
    /// for the rest with `rest`. `Ok(None)` is a clean end of stream before
    /// its first byte.
    pub fn read_array<const N: usize>(
        &mut self,
        fd: RawFd,
        first: &Patience<'_>,
        rest: &Patience<'_>,
    ) -> io::Result<Option<[u8; N]>> {
        if self.is_empty() && !self.fill(fd, first)? {
            return Ok(None);
        }
        let mut out = [0u8; N];
        // SAFETY: `out` is N bytes.
        unsafe { self.read_into(fd, out.as_mut_ptr(), N, rest)? };
        Ok(Some(out))
    }
}

/// An `iovec` over `len` bytes at `addr`.
pub fn iovec(addr: *const u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout() {
        let h = Header {
            size: 0x0102,
            addr: 0x7f00_0000_1000,
            opcode: OP_WRITE | V2_FLAG,
        };
        let b = h.encode();
        assert_eq!(&b[0..8], &0x0102u64.to_le_bytes());
        assert_eq!(&b[8..16], &0x7f00_0000_1000u64.to_le_bytes());
        assert_eq!(b[16], 0x81);
        assert_eq!(&b[17..], &[0u8; 7]);
        let mut garbage = b;
        garbage[20] = 0xee;
        let d = Header::decode(&garbage);
        assert_eq!(d, h);
        assert!(d.v2() && d.is_write());
        assert!(
            !Header { opcode: 7, ..h }.is_write(),
            "non-WRITE opcodes are READs"
        );
    }

    #[test]
    fn status_words() {
        assert!(status_valid(STATUS_OK));
        assert!(status_valid(STATUS_ADDR_REJECTED));
        assert!(!status_valid(0x1234));
        assert_eq!(STATUS_OK.to_le_bytes()[4..], *b"VTCM");
    }
}
