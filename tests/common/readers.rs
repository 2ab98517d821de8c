//! Raw-socket READers of the data port that take their reply at a pace of
//! their choosing: an attacker's slow drainer (a small receive buffer, a
//! little now and then) or a slow but steady legitimate reader. Every byte
//! taken is checked against the bytes the READ targets.

use super::{OK_WORD, pattern_byte, raw_header, status_bytes};
use socket2::{Domain, Socket, Type};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};

/// What a [`Reader::take`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Took {
    /// This many reply bytes (status word and data), possibly none now.
    Bytes(usize),
    /// The server closed the connection (EOF or reset).
    Closed,
}

/// A connection that sent one v2 READ and takes its reply in pieces.
pub struct Reader {
    s: TcpStream,
    /// The READ's length, and where its bytes start in the target's
    /// `pattern(_, seed)`.
    len: usize,
    off: usize,
    seed: u8,
    /// Reply bytes taken so far (the status word, then data).
    got: usize,
}

impl Reader {
    /// Connects to the data port at `port` with a receive buffer of
    /// `rcvbuf` bytes (set before the connect, so the advertised window
    /// stays small), and asks for the `len` bytes at `addr`, which hold
    /// bytes `off..off + len` of `pattern(_, seed)`.
    pub fn open(port: u16, rcvbuf: usize, addr: u64, len: usize, seed: u8, off: usize) -> Reader {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        s.set_recv_buffer_size(rcvbuf).expect("SO_RCVBUF");
        let to: SocketAddr = ([127, 0, 0, 1], port).into();
        s.connect(&to.into()).expect("connect to the data port");
        let mut s: TcpStream = s.into();
        // The request fits the send buffer: the kernel takes it even while
        // the connection waits in the server's listen backlog.
        s.write_all(&raw_header(len as u64, addr, 0x80))
            .expect("send the READ header");
        s.set_nonblocking(true).expect("non-blocking");
        Reader {
            s,
            len,
            off,
            seed,
            got: 0,
        }
    }

    /// Byte `i` of the expected reply: the OK status word, then data.
    fn expected(&self, i: usize) -> u8 {
        match i.checked_sub(8) {
            None => status_bytes(OK_WORD)[i],
            Some(d) => pattern_byte(self.off + d, self.seed),
        }
    }

    /// Takes what has arrived, at most `max` bytes, without waiting; checks
    /// every byte. A reset by the server is seen at once, before the bytes
    /// the receive buffer still holds.
    pub fn take(&mut self, max: usize) -> Took {
        if !matches!(self.s.take_error(), Ok(None)) {
            return Took::Closed;
        }
        let mut buf = vec![0u8; max.min(8 + self.len - self.got).max(1)];
        match self.s.read(&mut buf) {
            Ok(0) => Took::Closed,
            Ok(n) => {
                let bad = (0..n).find(|&i| buf[i] != self.expected(self.got + i));
                assert!(
                    bad.is_none(),
                    "reply byte {} differs from the READ's target",
                    self.got + bad.unwrap_or(0)
                );
                self.got += n;
                Took::Bytes(n)
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                Took::Bytes(0)
            }
            Err(_) => Took::Closed,
        }
    }

    /// Reply bytes taken so far.
    pub fn got(&self) -> usize {
        self.got
    }

    /// Whether the whole reply has been taken.
    pub fn done(&self) -> bool {
        self.got == 8 + self.len
    }
}
