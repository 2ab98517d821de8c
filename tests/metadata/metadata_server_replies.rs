//! The `transfer-engine-metadata-server` binary, as a child process, under
//! clients that ask for large values and never read the replies: the
//! server's memory stays bounded (a value goes out from the store's copy,
//! shared by every reply), the clients stalled longest are closed when
//! replies fill `--max-buffered`, and a normal client is served
//! throughout. Also: answered changes survive a SIGKILL.

use crate::common;

use common::proc::status_kb_of;
use common::servers::{Process, TempDir};
use std::ffi::OsString;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

/// Longest a normal client's GET may take while others stall.
const PROMPT: Duration = Duration::from_secs(5);

/// A running server binary.
struct Server {
    process: Process,
    addr: SocketAddr,
}

impl Server {
    /// Starts the binary on a free port with `args`, logging in `dir`.
    fn start(dir: &TempDir, args: &[&str]) -> Server {
        let log = dir.path().join("server.log");
        let args: Vec<OsString> = ["--addr", "127.0.0.1:0"]
            .iter()
            .chain(args)
            .map(OsString::from)
            .collect();
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_transfer-engine-metadata-server"));
        let mut process = Process::new("metadata server", bin, args, log.clone());
        let seen = listening(&log).len();
        process.spawn();
        assert!(process.wait_ready(|| listening(&log).len() > seen));
        let addr = *listening(&log).last().expect("a listening line");
        Server { process, addr }
    }

    /// A `kB` field of the server's `/proc/<pid>/status`.
    fn status_kb(&self, field: &str) -> u64 {
        let pid = self.process.pid().expect("server running");
        status_kb_of(&pid.to_string(), field)
    }
}

/// The addresses of the `listening on http://…/` lines of `log`, in order.
fn listening(log: &PathBuf) -> Vec<SocketAddr> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.strip_prefix("listening on http://"))
        .filter_map(|rest| rest.split('/').next()?.parse().ok())
        .collect()
}

/// Printable bytes that differ with `seed`.
fn text(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| b'!' + ((i / 7 + i * 13 + usize::from(seed) * 31) % 90) as u8)
        .collect()
}

/// The head of a GET of `key`, kept alive.
fn get_request(key: &str) -> Vec<u8> {
    format!("GET /metadata?key={key} HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes()
}

/// Reads one response (head and `Content-Length` body); `None` if the
/// server closes the connection before its end.
fn read_response(s: &mut TcpStream) -> Option<(u16, Vec<u8>)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            Ok(_) => return None,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("reading a response head: {e}"),
        }
    }
    let head = String::from_utf8(head).expect("ASCII head");
    let status = head[9..12].parse().expect("status");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(0, |v| v.trim().parse().expect("length"));
    let mut body = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match s.read(&mut body[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("reading a response body: {e}"),
        }
    }
    Some((status, body))
}

/// One request on its own connection: (status, body).
fn request(addr: SocketAddr, method: &str, key: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!(
        "{method} /metadata?key={key} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    read_response(&mut s).expect("a whole response")
}

/// Clients that each send a GET of `keys[i % keys.len()]` and read nothing.
fn stall(addr: SocketAddr, clients: usize, keys: &[String]) -> Vec<TcpStream> {
    (0..clients)
        .map(|i| {
            let mut s = TcpStream::connect(addr).expect("connect");
            s.write_all(&get_request(&keys[i % keys.len()])).unwrap();
            s
        })
        .collect()
}

/// Waits until the server has begun every stalled client's reply or closed
/// its connection (no hang: panics after a minute).
fn wait_answered(stalled: &[TcpStream]) {
    let end = Instant::now() + Duration::from_secs(60);
    for s in stalled {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        loop {
            match s.peek(&mut b) {
                Ok(_) => break,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    assert!(Instant::now() < end, "a request not answered in a minute");
                    thread::sleep(Duration::from_millis(20));
                }
                Err(_) => break,
            }
        }
        s.set_nonblocking(false).unwrap();
    }
}

/// A normal client's 32 GETs of `key`, each answered with `value` within
/// [`PROMPT`]; returns the slowest.
fn normal_client(addr: SocketAddr, key: &str, value: &[u8]) -> Duration {
    let mut worst = Duration::ZERO;
    for i in 0..32 {
        let t = Instant::now();
        let (status, body) = request(addr, "GET", key, b"");
        let took = t.elapsed();
        assert_eq!(status, 200, "GET {i}");
        assert!(body == value, "GET {i}: the value differs");
        assert!(took < PROMPT, "GET {i} took {took:?}");
        worst = worst.max(took);
        thread::sleep(Duration::from_millis(20));
    }
    worst
}

#[test]
fn unread_replies_of_one_large_value_share_its_copy() {
    const VALUE: usize = 16 << 20;
    const STALLED: usize = 200;
    let dir = TempDir::new("meta-unread");
    let server = Server::start(&dir, &["--timeout", "120"]);
    let big = text(VALUE, 1);
    assert_eq!(request(server.addr, "PUT", "big", &big).0, 200);
    assert_eq!(request(server.addr, "PUT", "small", b"{\"v\":1}").0, 200);
    let rss_before = server.status_kb("VmRSS");
    let peak_before = server.status_kb("VmHWM");

    let mut stalled = stall(server.addr, STALLED, &["big".to_string()]);
    // Every stalled client is accepted and its reply begun first: a burst
    // of 200 connects can fill the listen backlog, and a normal client's
    // SYN dropped there waits for the kernel's retransmission, whatever
    // the server does.
    wait_answered(&stalled);
    let worst = normal_client(server.addr, "small", b"{\"v\":1}");
    let rss = server.status_kb("VmRSS");
    let peak = server.status_kb("VmHWM");
    println!(
        "{STALLED} unread replies of a {} MiB value: server RSS {} MiB before, {} MiB after, \
         peak {} MiB (before them {} MiB); 32 normal GETs, slowest {worst:?}",
        VALUE >> 20,
        rss_before >> 10,
        rss >> 10,
        peak >> 10,
        peak_before >> 10
    );
    // A copy per reply would be 3.2 GB.
    let bound = peak_before.max(rss_before) + 4 * (VALUE as u64 >> 10);
    assert!(
        peak <= bound,
        "peak RSS {peak} KiB over {bound} KiB; log:\n{}",
        server.process.log_tail(2000)
    );
    // A stalled client that reads at last gets every byte.
    stalled[0]
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let (status, body) = read_response(&mut stalled[0]).expect("the whole reply");
    assert_eq!(status, 200);
    assert!(body == big, "the value differs");
}

#[test]
fn clients_that_stop_reading_are_closed_at_the_bound() {
    const VALUE: usize = 12 << 20;
    const VALUES: usize = 6;
    const STALLED: usize = 48;
    const MAX_BUFFERED: usize = 28 << 20;
    let dir = TempDir::new("meta-stalled");
    let server = Server::start(
        &dir,
        &[
            "--timeout",
            "120",
            "--max-body",
            &VALUE.to_string(),
            "--max-buffered",
            &MAX_BUFFERED.to_string(),
        ],
    );
    let keys: Vec<String> = (0..VALUES).map(|i| format!("v{i}")).collect();
    let values: Vec<Vec<u8>> = (0..VALUES).map(|i| text(VALUE, i as u8)).collect();
    for (k, v) in keys.iter().zip(&values) {
        assert_eq!(request(server.addr, "PUT", k, v).0, 200);
    }
    assert_eq!(request(server.addr, "PUT", "small", b"{\"v\":2}").0, 200);
    let rss_before = server.status_kb("VmRSS");
    let peak_before = server.status_kb("VmHWM");

    // Replies of six distinct values to clients that do not read: more
    // than --max-buffered.
    let mut stalled = stall(server.addr, STALLED, &keys);
    // As above: every stalled client is accepted and answered first, so
    // the normal client measures the server, not the listen backlog.
    wait_answered(&stalled);
    let worst = normal_client(server.addr, "small", b"{\"v\":2}");
    let peak = server.status_kb("VmHWM");

    // Now each stalled client reads: a whole reply if it was still being
    // sent, a reply cut short if the server closed it.
    let mut cut = 0;
    for (i, s) in stalled.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        match read_response(s) {
            Some((status, body)) => {
                assert_eq!(status, 200);
                assert!(body == values[i % VALUES], "client {i}: the value differs");
            }
            None => cut += 1,
        }
    }
    println!(
        "{STALLED} unread replies of {VALUES} values of {} MiB, --max-buffered {} MiB: {cut} \
         closed by the server; peak RSS {} MiB (before them {} MiB, RSS {} MiB); 32 normal \
         GETs, slowest {worst:?}",
        VALUE >> 20,
        MAX_BUFFERED >> 20,
        peak >> 10,
        peak_before >> 10,
        rss_before >> 10
    );
    // At most two values fit in the bound: the clients of the others (8
    // per value) were closed.
    let kept = MAX_BUFFERED / VALUE * (STALLED / VALUES);
    assert!(
        cut >= STALLED - kept,
        "only {cut} of {STALLED} stalled clients closed; log:\n{}",
        server.process.log_tail(2000)
    );
    let bound = peak_before.max(rss_before) + (MAX_BUFFERED as u64 >> 10) + (16 << 10);
    assert!(peak <= bound, "peak RSS {peak} KiB over {bound} KiB");
}

#[test]
fn answered_changes_survive_a_kill() {
    let dir = TempDir::new("meta-kill");
    let data = dir.path().join("data.json");
    let data_arg = data.to_string_lossy().into_owned();
    let mut server = Server::start(&dir, &["--data", &data_arg]);
    // Changes of every kind, each answered before the next.
    let mut expect: Vec<Option<Vec<u8>>> = Vec::new();
    for i in 0..300usize {
        let key = format!("k{i}");
        let mut v = Some(text(100 + i * 37 % 5000, i as u8));
        assert_eq!(
            request(server.addr, "PUT", &key, v.as_deref().unwrap()).0,
            200
        );
        if i % 3 == 0 {
            let again = text(50, (i + 1) as u8);
            assert_eq!(request(server.addr, "PUT", &key, &again).0, 200);
            v = Some(again);
        }
        if i % 5 == 0 {
            assert_eq!(request(server.addr, "DELETE", &key, b"").0, 200);
            v = None;
        }
        expect.push(v);
    }
    server.process.kill();
    let server = Server::start(&dir, &["--data", &data_arg]);
    for (i, want) in expect.iter().enumerate() {
        let (status, body) = request(server.addr, "GET", &format!("k{i}"), b"");
        match want {
            Some(v) => {
                assert_eq!(status, 200, "k{i}");
                assert!(body == *v, "k{i}: the value differs");
            }
            None => assert_eq!(status, 404, "k{i}"),
        }
    }
    // The data file is a JSON object of strings, as in every version.
    let snapshot: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&data).unwrap()).unwrap();
    assert_eq!(snapshot.len(), expect.iter().flatten().count());
}
