//! The reply side of [`super::Server`]'s buffer bound, with a line-based
//! service over real sockets: a shared reply buffer counts once, replies
//! not taken make room for others, and a reply that cannot fit beside the
//! requests with the workers gets the service's refusal.

use super::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Bytes of the shared reply: more than the kernel takes for a client that
/// does not read, so that the server holds the rest.
const SHARED: usize = 12 << 20;
const MAX_BUFFERED: usize = 16 << 20;

/// One request per line: `hold…` blocks in the handler until released
/// (its line as long as the client makes it), `shared` is answered with
/// the shared buffer, `get N` with N bytes of its own.
struct Lines {
    shared: Arc<[u8]>,
    release: AtomicBool,
}

impl Service for Lines {
    type Request = Vec<u8>;
    type Parser = ();
    const NAME: &'static str = "lines";
    const SETTINGS: Settings = Settings {
        connections: "connections",
        buffered: "buffered",
        timeout: "timeout",
    };

    fn parse(&self, _: &mut (), buf: &mut Vec<u8>) -> Parse<Vec<u8>> {
        match buf.iter().position(|b| *b == b'\n') {
            Some(end) => {
                let rest = buf.split_off(end + 1);
                Parse::Done(std::mem::replace(buf, rest))
            }
            None => Parse::More {
                interim: None,
                want: None,
            },
        }
    }

    fn dispatch(&self, request: Vec<u8>) -> Dispatch<Vec<u8>> {
        Dispatch::Work(request)
    }

    fn handle(&self, _peer: SocketAddr, request: Vec<u8>) -> Result<Reply, String> {
        let line = String::from_utf8_lossy(&request).trim().to_string();
        if line.starts_with("hold") {
            let end = Instant::now() + Duration::from_secs(30);
            while !self.release.load(Ordering::SeqCst) && Instant::now() < end {
                thread::sleep(Duration::from_millis(5));
            }
            return Ok(Reply::owned(b"held".to_vec(), Then::Linger));
        }
        if line == "shared" {
            return Ok(Reply {
                bytes: Vec::new(),
                shared: Some(Arc::clone(&self.shared)),
                then: Then::Linger,
            });
        }
        let n: usize = line
            .strip_prefix("get ")
            .and_then(|n| n.parse().ok())
            .ok_or("bad request")?;
        Ok(Reply::owned(vec![b'o'; n], Then::Linger))
    }

    fn refusal(&self) -> Option<Reply> {
        Some(Reply::owned(b"busy".to_vec(), Then::Linger))
    }
}

fn start() -> (Server, Arc<Lines>, SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let service = Arc::new(Lines {
        shared: vec![b's'; SHARED].into(),
        release: AtomicBool::new(false),
    });
    let opts = Options {
        max_connections: 64,
        request_timeout: Duration::from_secs(60),
        write_timeout: Duration::from_secs(60),
        linger_timeout: Duration::from_secs(60),
        max_buffered: MAX_BUFFERED,
        workers: 2,
        thread_name: "te-test",
        tls: None,
    };
    let server = Server::start(listener, Arc::clone(&service), opts).unwrap();
    (server, service, addr)
}

/// Sends `line`; the connection's reader reads nothing yet.
fn ask(addr: SocketAddr, line: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(line).unwrap();
    s
}

/// Everything until the server closes (EOF or reset).
fn all(mut s: TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return out,
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// Waits until the server has begun the reply on `s` (no hang: 30 s).
fn begun(s: &TcpStream) {
    let mut b = [0u8; 1];
    assert!(s.peek(&mut b).is_ok_and(|n| n == 1), "no reply began");
}

#[test]
fn a_shared_reply_counts_once_and_unread_replies_make_room() {
    let (server, _service, addr) = start();
    // Five clients that do not read the same 12 MiB: 60 MiB if counted
    // per reply, 12 MiB counted once, within the 16 MiB bound.
    let first: Vec<TcpStream> = (0..5).map(|_| ask(addr, b"shared\n")).collect();
    first.iter().for_each(begun);
    assert_eq!(all(ask(addr, b"get 1000\n")), vec![b'o'; 1000]);
    for s in first {
        assert!(all(s) == vec![b's'; SHARED], "a whole shared reply");
    }
    // Three more that do not read; then a reply of 6 MiB of its own does
    // not fit beside the shared one, whose readers are closed for it.
    let second: Vec<TcpStream> = (0..3).map(|_| ask(addr, b"shared\n")).collect();
    second.iter().for_each(begun);
    assert_eq!(all(ask(addr, b"get 6291456\n")).len(), 6 << 20);
    for s in second {
        assert!(all(s).len() < SHARED, "a reply cut short");
    }
    server.shutdown();
}

#[test]
fn a_reply_that_cannot_fit_beside_requests_in_handlers_is_refused() {
    let (server, service, addr) = start();
    // A request of 5 MiB held by a handler (its buffer grew to 8 MiB,
    // counted until the handler answers) ...
    let mut line = b"hold".to_vec();
    line.resize(5 << 20, b' ');
    line.push(b'\n');
    let held = ask(addr, &line);
    // ... leaves no room for a reply of 9 MiB: refused, once the request
    // is with the handler.
    let t = Instant::now();
    while all(ask(addr, b"get 9437184\n")) != b"busy" {
        assert!(t.elapsed() < Duration::from_secs(30), "never refused");
        thread::sleep(Duration::from_millis(20));
    }
    service.release.store(true, Ordering::SeqCst);
    assert_eq!(all(held), b"held");
    assert_eq!(all(ask(addr, b"get 9437184\n")).len(), 9 << 20);
    server.shutdown();
}
