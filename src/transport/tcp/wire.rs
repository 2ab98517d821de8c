//! Mooncake's TCP data protocol (spec §4) and the non-blocking socket I/O
//! that moves registered memory without staging copies.
//!
//! A request is a 24-byte header `{u64 size, u64 addr, u8 opcode, 7 pad}`,
//! little-endian; opcode 1 is WRITE (payload follows), anything else READ.
//! With the v2 flag (0x80) the server acknowledges: an 8-byte status word
//! before READ data, and after the last WRITE byte is stored.

use std::io;
use std::os::fd::RawFd;

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

/// What a non-blocking receive got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recv {
    /// This many bytes (at least one).
    Bytes(usize),
    /// The peer closed its side.
    Eof,
    /// Nothing to read now.
    WouldBlock,
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// Receives what is available, up to `len` bytes, into `dst`, without
/// blocking.
///
/// # Safety
/// `dst` must be valid for writing `len` bytes.
pub unsafe fn recv_some(fd: RawFd, dst: *mut u8, len: usize) -> io::Result<Recv> {
    loop {
        // SAFETY: `dst` is valid for `len` bytes (the caller's contract).
        let n = unsafe { libc::recv(fd, dst.cast(), len, libc::MSG_DONTWAIT) };
        match n {
            0 => return Ok(Recv::Eof),
            n if n > 0 => return Ok(Recv::Bytes(n as usize)),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return if would_block(&e) {
                    Ok(Recv::WouldBlock)
                } else {
                    Err(e)
                };
            }
        }
    }
}

/// Sends what the socket takes now of the bytes `iov` describes (at most
/// 1024 entries); returns how many, `Ok(0)` when it takes nothing now.
/// `MSG_NOSIGNAL`: a closed peer is `EPIPE`, never `SIGPIPE`.
pub fn send_some(fd: RawFd, iov: &[libc::iovec]) -> io::Result<usize> {
    let msg = libc::msghdr {
        msg_name: std::ptr::null_mut(),
        msg_namelen: 0,
        msg_iov: iov.as_ptr() as *mut libc::iovec,
        msg_iovlen: iov.len().min(1024),
        msg_control: std::ptr::null_mut(),
        msg_controllen: 0,
        msg_flags: 0,
    };
    loop {
        // SAFETY: every iovec points into memory the caller guarantees valid
        // for its length (registered or caller-owned buffers, our headers).
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return if would_block(&e) { Ok(0) } else { Err(e) };
    }
}

/// Bytes written to a TCP socket that its peer has not acknowledged yet
/// (`SIOCOUTQ`: sent but unacknowledged, and not sent yet).
pub fn unacknowledged(fd: RawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ on Linux) writes one int we own.
    if unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Payload tails at least this long are received straight into their
/// destination rather than through a [`RecvBuf`].
pub const DIRECT_RECV_MIN: usize = 16 * 1024;

/// A receive buffer in front of a non-blocking socket: small items
/// (headers, status words, small payloads) come from it; large payloads go
/// straight into their destination.
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

    /// Bytes buffered.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The buffered bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Drops `n` buffered bytes from the front.
    pub fn consume(&mut self, n: usize) {
        self.start += n.min(self.len());
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Receives what is available into the free tail of the buffer (moving
    /// what it holds to the front first when the tail is short).
    pub fn fill(&mut self, fd: RawFd) -> io::Result<Recv> {
        if self.buf.len() - self.end < self.buf.len() / 4 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let room = self.buf.len() - self.end;
        // SAFETY: receives into the free tail of our own buffer.
        let r = unsafe { recv_some(fd, self.buf.as_mut_ptr().add(self.end), room)? };
        if let Recv::Bytes(n) = r {
            self.end += n;
        }
        Ok(r)
    }

    /// Receives what is available into `dst` (up to `len` bytes) and, in
    /// the same call, up to `tail` more bytes into this buffer, which must
    /// be empty: the end of a payload straight into its destination, and
    /// the small item behind it (the next header, or status word) here,
    /// without a second receive or a copy through the buffer. Returns what
    /// the receive said and how many bytes went to `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writing `len` bytes.
    pub unsafe fn recv_behind(
        &mut self,
        fd: RawFd,
        dst: *mut u8,
        len: usize,
        tail: usize,
    ) -> io::Result<(Recv, usize)> {
        debug_assert!(self.is_empty());
        self.start = 0;
        self.end = 0;
        let mut iov = [
            iovec(dst, len),
            iovec(self.buf.as_mut_ptr(), tail.min(self.buf.len())),
        ];
        let mut msg = libc::msghdr {
            msg_name: std::ptr::null_mut(),
            msg_namelen: 0,
            msg_iov: iov.as_mut_ptr(),
            msg_iovlen: iov.len(),
            msg_control: std::ptr::null_mut(),
            msg_controllen: 0,
            msg_flags: 0,
        };
        loop {
            // SAFETY: the first iovec is `dst`, valid for `len` bytes (the
            // caller's contract), the second the head of our own buffer.
            let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
            match n {
                0 => return Ok((Recv::Eof, 0)),
                n if n > 0 => {
                    let n = n as usize;
                    self.end = n.saturating_sub(len);
                    return Ok((Recv::Bytes(n), n.min(len)));
                }
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return if would_block(&e) {
                        Ok((Recv::WouldBlock, 0))
                    } else {
                        Err(e)
                    };
                }
            }
        }
    }

    /// Copies up to `len` buffered bytes to `dst`; returns how many.
    ///
    /// # Safety
    /// `dst` must be valid for writing `len` bytes.
    pub unsafe fn take_into(&mut self, dst: *mut u8, len: usize) -> usize {
        let n = self.len().min(len);
        // SAFETY: `dst` holds `len >= n` bytes; the source is our buffer.
        unsafe { std::ptr::copy_nonoverlapping(self.buf.as_ptr().add(self.start), dst, n) };
        self.consume(n);
        n
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

    #[test]
    fn a_payload_end_goes_to_its_destination_and_the_next_header_to_the_buffer() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        rx.set_nonblocking(true).unwrap();
        let payload: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
        let next = Header {
            size: 5,
            addr: 0x1000,
            opcode: OP_WRITE,
        }
        .encode();
        tx.write_all(&payload).unwrap();
        tx.write_all(&next).unwrap();
        tx.write_all(b"after").unwrap();
        let mut rbuf = RecvBuf::new(1024);
        let mut dst = vec![0u8; payload.len()];
        let mut got = 0;
        while got < dst.len() {
            // SAFETY: `dst` holds the `len` bytes from `got` on.
            let (r, n) = unsafe {
                rbuf.recv_behind(
                    rx.as_raw_fd(),
                    dst.as_mut_ptr().add(got),
                    dst.len() - got,
                    HEADER_LEN,
                )
            }
            .unwrap();
            assert!(matches!(r, Recv::Bytes(_)), "the bytes were sent");
            got += n;
        }
        assert!(dst == payload, "every payload byte in its destination");
        assert_eq!(rbuf.bytes(), &next[..], "the header, and nothing behind it");
        // What follows the header stays in the socket.
        rbuf.consume(HEADER_LEN);
        assert!(matches!(rbuf.fill(rx.as_raw_fd()).unwrap(), Recv::Bytes(5)));
        assert_eq!(rbuf.bytes(), b"after");
        // Nothing more: the receive says so instead of waiting.
        rbuf.consume(5);
        let mut one = [0u8; 1];
        // SAFETY: `one` holds one byte.
        let (r, n) =
            unsafe { rbuf.recv_behind(rx.as_raw_fd(), one.as_mut_ptr(), 1, HEADER_LEN) }.unwrap();
        assert!(matches!(r, Recv::WouldBlock) && n == 0);
    }
}
