//! One side of the exchange over a socket: [`Gate`] reads exactly the
//! bytes of the frame it waits for (never a byte of what follows the
//! exchange), writes its frames, and tells when the connection is
//! authenticated or refused. It works on blocking sockets (the handshake
//! client) and on non-blocking ones (the TCP data sessions and lanes,
//! which come back on their next readiness event).

use super::exchange::{AuthError, ClientAuth, ClientStep, ServerAuth, ServerStep};
use super::wire::{MAX_FRAME, Reason, refusal};
use std::io::{self, Read, Write};

/// What one side does next, whichever side it is.
pub enum Act {
    /// Read until the buffer holds this many bytes.
    Wait(usize),
    /// Send these bytes, then go on.
    Send(Vec<u8>),
    /// Send these bytes (if any): the connection is authenticated.
    Finish(Vec<u8>),
    /// Send a refusal of this reason and stop (server).
    Refuse(Reason),
    /// Stop: our side failed (client).
    Fail(AuthError),
}

/// A side of the exchange as a [`Gate`] drives it.
pub trait Side {
    /// Looks at the bytes received and not taken yet: how many it takes,
    /// and what to do.
    fn act(&mut self, buf: &[u8]) -> (usize, Act);
}

impl Side for ServerAuth {
    fn act(&mut self, buf: &[u8]) -> (usize, Act) {
        match self.advance(buf) {
            (n, ServerStep::Wait(w)) => (n, Act::Wait(w)),
            (n, ServerStep::Send(b)) => (n, Act::Send(b)),
            (n, ServerStep::Accepted(b)) => (n, Act::Finish(b)),
            (n, ServerStep::Refused(r)) => (n, Act::Refuse(r)),
        }
    }
}

impl Side for ClientAuth {
    fn act(&mut self, buf: &[u8]) -> (usize, Act) {
        match self.advance(buf) {
            Ok((n, ClientStep::Wait(w))) => (n, Act::Wait(w)),
            Ok((n, ClientStep::Send(b))) => (n, Act::Send(b)),
            Ok((n, ClientStep::Accepted)) => (n, Act::Finish(Vec::new())),
            Err(e) => (0, Act::Fail(e)),
        }
    }
}

/// How a connection's authentication stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Standing {
    /// Waiting for the socket (non-blocking sockets only).
    Pending,
    /// Authenticated: the connection may carry its requests.
    Done,
    /// We refused the peer (the refusal is sent): close.
    Refused(Reason),
    /// Our side failed (refused by the peer, or the peer's proof or
    /// frames are wrong): close.
    Failed(AuthError),
}

/// One side of the exchange on one connection.
pub struct Gate<S> {
    side: S,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    sent: usize,
    then: Option<Standing>,
}

impl<S: Side> Gate<S> {
    /// A gate for `side` that sends `first` (the client's hello; nothing
    /// for the server) before anything else.
    pub fn new(side: S, first: Vec<u8>) -> Gate<S> {
        Gate {
            side,
            inbuf: Vec::with_capacity(MAX_FRAME),
            out: first,
            sent: 0,
            then: None,
        }
    }

    /// Moves the exchange on `stream` as far as the socket lets it. On a
    /// non-blocking socket `WouldBlock` gives [`Standing::Pending`]; other
    /// I/O errors (end of stream before the exchange is over included) are
    /// returned.
    pub fn drive<T: Read + Write>(&mut self, stream: &mut T) -> io::Result<Standing> {
        loop {
            while self.sent < self.out.len() {
                match stream.write(&self.out[self.sent..]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => self.sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Ok(Standing::Pending);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if let Some(end) = self.then.take() {
                return Ok(end);
            }
            let (taken, act) = self.side.act(&self.inbuf);
            self.inbuf.drain(..taken);
            match act {
                Act::Wait(want) => {
                    let mut chunk = [0u8; MAX_FRAME];
                    let room = want.saturating_sub(self.inbuf.len()).clamp(1, MAX_FRAME);
                    match stream.read(&mut chunk[..room]) {
                        Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                        Ok(n) => self.inbuf.extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Ok(Standing::Pending);
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Act::Send(bytes) => self.queue(bytes, None),
                Act::Finish(bytes) => self.queue(bytes, Some(Standing::Done)),
                Act::Refuse(r) => self.queue(refusal(r), Some(Standing::Refused(r))),
                Act::Fail(e) => return Ok(Standing::Failed(e)),
            }
        }
    }

    fn queue(&mut self, bytes: Vec<u8>, then: Option<Standing>) {
        self.out = bytes;
        self.sent = 0;
        self.then = then;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Keys, Listener, Port};
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;

    #[test]
    fn two_gates_authenticate_over_a_socket_and_leave_what_follows() {
        let keys = Arc::new(Keys::new(&[vec![3u8; 32]]));
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let server_keys = keys.clone();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            let listener = Arc::new(Listener::new(server_keys, Port::Data, &["me"]));
            let mut g = Gate::new(ServerAuth::new(listener).expect("nonce"), Vec::new());
            let r = g.drive(&mut s).expect("drive");
            let mut rest = [0u8; 5];
            s.read_exact(&mut rest).expect("after");
            (r, rest)
        });
        let mut c = TcpStream::connect(addr).expect("connect");
        let (side, hello) = ClientAuth::start(keys, Port::Data, "me").expect("start");
        let mut g = Gate::new(side, hello);
        assert_eq!(g.drive(&mut c).expect("drive"), Standing::Done);
        c.write_all(b"hello").expect("write");
        let (r, rest) = t.join().expect("join");
        assert_eq!(r, Standing::Done);
        assert_eq!(&rest, b"hello");
    }
}
