//! A connection's byte stream: plain TCP, or TLS (rustls) over it, both
//! non-blocking.
//!
//! The TLS side keeps the contract of a non-blocking socket: `read` and
//! `write` answer `WouldBlock` when nothing can move now, and any event on
//! the socket (readable or writable) lets the records rustls holds go out,
//! since each call first pushes them. `flush` says whether every record of
//! the reply has reached the socket: the reply is complete only then.
//! rustls bounds what it holds per connection (a received record, and its
//! default limit of 64 KiB of records to send).

use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::sync::Arc;

use mio::net::TcpStream;

/// A plain or TLS connection.
pub(crate) struct Stream {
    tcp: TcpStream,
    tls: Option<Box<rustls::ServerConnection>>,
}

impl Stream {
    /// Plain TCP.
    pub(crate) fn plain(tcp: TcpStream) -> Stream {
        Stream { tcp, tls: None }
    }

    /// TLS over `tcp`, as the server of `config`; the handshake runs as
    /// the stream is read.
    pub(crate) fn tls(
        tcp: TcpStream,
        config: &Arc<rustls::ServerConfig>,
    ) -> Result<Stream, rustls::Error> {
        let conn = rustls::ServerConnection::new(Arc::clone(config))?;
        Ok(Stream {
            tcp,
            tls: Some(Box::new(conn)),
        })
    }

    /// Ends the sending side: TLS's `close_notify` (sent if the socket
    /// takes it now), then the socket's shutdown.
    pub(crate) fn shutdown_write(&mut self) -> io::Result<()> {
        if let Some(tls) = &mut self.tls {
            tls.send_close_notify();
            let _ = push(tls, &mut self.tcp);
        }
        self.tcp.shutdown(Shutdown::Write)
    }
}

/// Writes the TLS records `tls` holds to `tcp`: `WouldBlock` when some
/// remain.
fn push(tls: &mut rustls::ServerConnection, tcp: &mut TcpStream) -> io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(tcp) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether `e` is `WouldBlock`.
fn blocked(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Read for Stream {
    /// Plaintext received; `Ok(0)` once the client closed (with or without
    /// `close_notify`); a TLS failure (a failed handshake, a bad record) is
    /// `InvalidData`, after its alert was sent when the socket takes it.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(tls) = &mut self.tls else {
            return self.tcp.read(buf);
        };
        loop {
            // The handshake's answers, alerts and the rest of a reply.
            match push(tls, &mut self.tcp) {
                Err(e) if !blocked(&e) => return Err(e),
                _ => {}
            }
            match tls.reader().read(buf) {
                Err(e) if blocked(&e) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                other => return other,
            }
            let eof = match tls.read_tls(&mut self.tcp) {
                Ok(n) => n == 0,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if let Err(e) = tls.process_new_packets() {
                let _ = push(tls, &mut self.tcp);
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
            if eof {
                return match tls.reader().read(buf) {
                    Ok(n) => Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof || blocked(&e) => Ok(0),
                    Err(e) => Err(e),
                };
            }
        }
    }
}

impl Write for Stream {
    /// Plaintext taken. Over TLS it is taken only once the records of the
    /// previous write are out (`WouldBlock` until then), and goes out as
    /// far as the socket takes it; [`Write::flush`] sends the rest.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Some(tls) = &mut self.tls else {
            return self.tcp.write(buf);
        };
        push(tls, &mut self.tcp)?;
        let n = tls.writer().write(buf)?;
        if n == 0 && !buf.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        match push(tls, &mut self.tcp) {
            Err(e) if !blocked(&e) => Err(e),
            _ => Ok(n),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match &self.tls {
            None => self.tcp.write_vectored(bufs),
            Some(_) => {
                let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
                self.write(first)
            }
        }
    }

    /// Over TLS, sends the records held: `WouldBlock` while some remain.
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.tls {
            None => Ok(()),
            Some(tls) => push(tls, &mut self.tcp),
        }
    }
}

impl mio::event::Source for Stream {
    fn register(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.tcp.register(registry, token, interests)
    }

    fn reregister(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.tcp.reregister(registry, token, interests)
    }

    fn deregister(&mut self, registry: &mio::Registry) -> io::Result<()> {
        self.tcp.deregister(registry)
    }
}
