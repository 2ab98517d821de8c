//! Helpers shared by the integration tests (each test crate compiles its
//! own copy and uses a part of it): engines, raw buffers, hand-encoded TCP
//! headers and status words, hand-written Mooncake peers (a handshake
//! responder and a TCP data server over a Vec), and private etcd and redis
//! servers ([`servers`]).
//!
//! Every byte of a request header or a status word is written here by hand
//! from the spec (§4.2, §4.3), not with the library's encoder, so the tests
//! check the encoding itself.

#![allow(dead_code)]

pub mod child;
pub mod fresh;
pub mod gpu_double;
pub mod handshake;
pub mod proc;
pub mod readers;
pub mod servers;
pub mod tls;

use handshake::{Frame, FrameKind, call, encode_json, read_frame};
use serde_json::{Value, json};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use transfer_engine::TaskStatus;
use transfer_engine::{Config, Engine, Opcode, Request};
use transfer_engine::{Location, Region};

/// `OK` status word of the v2 framing, spelled out from the spec.
pub const OK_WORD: u64 = 0x4D43_5456_0000_0000;
/// `ADDR_REJECTED` status word of the v2 framing.
pub const REJECTED_WORD: u64 = 0x4D43_5456_0000_0001;

/// The name libtest knows `test` of module `module` by (`module` as
/// `module_path!()` gives it there, whose first part is the test binary's
/// crate), to run that one test again in a child process with `--exact`.
pub fn test_path(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_string(),
    }
}

/// Marks the calling test as unable to run here: prints `SKIPPED: <why>`
/// and appends `<binary> <test>: <why>` to the file named by `TE_SKIP_LOG`,
/// so the summary of `scripts/test.sh` counts the test as skipped, not
/// passed. With `CI=true` nothing may skip: the test fails instead. The
/// caller returns right after.
pub fn skip(why: &str) {
    // The test binary, without the hash cargo appends (`stores-<16 hex>`).
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let exe = match exe.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name.to_string()
        }
        _ => exe,
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed test)")
        .to_string();
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{test} cannot run here: {why}; with CI=true every prerequisite must be present"
    );
    println!("SKIPPED: {why}");
    if let Some(path) = std::env::var_os("TE_SKIP_LOG") {
        let line = format!("{exe} {test}: {why}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            println!("cannot record the skip in {}: {e}", path.to_string_lossy());
        }
    }
}

/// The configuration of the process environment's `MC_*` variables with
/// `settings` (`(name, value)` pairs) in place of theirs: what a test
/// gives an engine through [`Engine::builder`] instead of setting the
/// environment. A value parsing refuses panics, naming it; the warnings
/// parsing produced are logged, as the builder logs those of the
/// environment, and one that names a variable of `settings` panics, since
/// the test would run without it.
pub fn config_with(settings: &[(&str, &str)]) -> Config {
    let set: Vec<(String, String)> = settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let config = Config::from_lookup(|k| match set.iter().find(|(name, _)| name == k) {
        Some((_, v)) => Some(v.clone()),
        None => std::env::var(k).ok(),
    })
    .unwrap_or_else(|e| panic!("a setting of the test was refused: {e}"));
    for w in &config.warnings {
        assert!(
            !settings.iter().any(|(name, _)| w.contains(name)),
            "a setting of the test was refused: {w}"
        );
        tracing::warn!("{w}");
    }
    config
}

/// A P2P engine on 127.0.0.1 with the TCP transport installed, configured
/// by [`config_with`]`(settings)`.
pub fn engine_with(settings: &[(&str, &str)]) -> std::sync::Arc<Engine> {
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .config(config_with(settings))
        .build()
        .expect("engine");
    e.install_transport("tcp", None).expect("install tcp");
    e
}

/// A P2P engine on 127.0.0.1 with the TCP transport installed, configured
/// by the process environment.
pub fn engine() -> std::sync::Arc<Engine> {
    engine_with(&[])
}

/// An anonymous private mapping, unmapped on drop.
pub struct Mapping {
    /// Its first byte.
    pub addr: *mut u8,
    /// Its length in bytes.
    pub len: usize,
}

impl Mapping {
    /// `len` bytes that nothing has touched yet (no page is resident).
    pub fn new(len: usize) -> Mapping {
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        Mapping {
            addr: p.cast(),
            len,
        }
    }

    /// `len` bytes, each `fill`.
    pub fn filled(len: usize, fill: u8) -> Mapping {
        let m = Mapping::new(len);
        m.fill(fill);
        m
    }

    /// Replaces the pages at the same address with new zero pages, then
    /// fills them: what an allocator reusing the address would do.
    pub fn remap(&self, fill: u8) {
        self.replace();
        self.fill(fill);
    }

    /// Replaces the pages at the same address with new zero pages (in one
    /// system call: a byte written there afterwards is in the new pages).
    pub fn replace(&self) {
        // SAFETY: MAP_FIXED over our own mapping of the same length.
        let p = unsafe {
            libc::mmap(
                self.addr.cast(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(p.cast::<u8>(), self.addr, "mmap MAP_FIXED");
    }

    /// Sets every byte to `b`.
    pub fn fill(&self, b: u8) {
        // SAFETY: within our mapping.
        unsafe { std::ptr::write_bytes(self.addr, b, self.len) };
    }

    /// Whether every byte is `b`.
    pub fn all(&self, b: u8) -> bool {
        // SAFETY: within our mapping.
        let s = unsafe { std::slice::from_raw_parts(self.addr, self.len) };
        s.iter().all(|&x| x == b)
    }

    /// Address of byte 0.
    pub fn addr(&self) -> u64 {
        self.addr as u64
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// Heap memory touched only through raw pointers, so that an engine (or its
/// data server) may write it from other threads while the test holds it.
pub struct Buf {
    ptr: *mut u8,
    len: usize,
    // Owns the allocation; never accessed through the Vec after creation.
    _keep: Vec<u8>,
}

// SAFETY: the buffer is plain bytes accessed through raw pointers; the
// tests synchronize with the writers over sockets or task status.
unsafe impl Send for Buf {}
// SAFETY: as above.
unsafe impl Sync for Buf {}

impl Buf {
    /// `len` bytes filled with `pattern(len, seed)`.
    pub fn new(len: usize, seed: u8) -> Buf {
        let mut v = pattern(len, seed);
        let ptr = v.as_mut_ptr();
        Buf { ptr, len, _keep: v }
    }

    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Buf {
        let mut v = vec![0u8; len];
        let ptr = v.as_mut_ptr();
        Buf { ptr, len, _keep: v }
    }

    /// Address of byte 0.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// A copy of `[off, off + n)`.
    pub fn get(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len);
        let mut out = vec![0u8; n];
        // SAFETY: in bounds (checked above); the allocation lives as long as self.
        unsafe { std::ptr::copy(self.ptr.add(off), out.as_mut_ptr(), n) };
        out
    }

    /// A copy of the whole buffer.
    pub fn snapshot(&self) -> Vec<u8> {
        self.get(0, self.len)
    }

    /// Overwrites `[off, off + data.len())`.
    pub fn set(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds; the allocation lives as long as self.
        unsafe { std::ptr::copy(data.as_ptr(), self.ptr.add(off), data.len()) };
    }
}

/// Registers `[addr, addr + len)` with the engine.
pub fn register_range(e: &Engine, addr: u64, len: u64, remote: bool) {
    e.register(&[Region {
        addr,
        length: len,
        location: Location::Cpu(0),
        remote_accessible: remote,
    }])
    .expect("register");
}

/// Registers the whole buffer.
pub fn register(e: &Engine, b: &Buf, remote: bool) {
    register_range(e, b.addr(), b.len() as u64, remote);
}

/// Deterministic, position-dependent bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| pattern_byte(i, seed)).collect()
}

/// Byte `i` of [`pattern`]`(_, seed)`.
pub fn pattern_byte(i: usize, seed: u8) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8 ^ (i >> 16) as u8
}

/// A small deterministic PRNG (xorshift64*), for garbage bytes.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A 24-byte request header written byte by byte: u64 LE size, u64 LE addr,
/// opcode, 7 padding bytes (filled with garbage: peers must ignore them).
pub fn raw_header(size: u64, addr: u64, opcode: u8) -> [u8; 24] {
    let mut h = [0u8; 24];
    for i in 0..8 {
        h[i] = (size >> (8 * i)) as u8;
        h[8 + i] = (addr >> (8 * i)) as u8;
    }
    h[16] = opcode;
    h[17..24].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0x5a, 0xa5, 0xff]);
    h
}

/// A header decoded by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawHeader {
    pub size: u64,
    pub addr: u64,
    pub opcode: u8,
}

pub fn decode_header(h: &[u8; 24]) -> RawHeader {
    let mut size = 0u64;
    let mut addr = 0u64;
    for i in 0..8 {
        size |= u64::from(h[i]) << (8 * i);
        addr |= u64::from(h[8 + i]) << (8 * i);
    }
    RawHeader {
        size,
        addr,
        opcode: h[16],
    }
}

/// The 8 little-endian bytes of a status word, written by hand.
pub fn status_bytes(word: u64) -> [u8; 8] {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        *x = (word >> (8 * i)) as u8;
    }
    b
}

/// Decodes a status word by hand.
pub fn word_of(b: &[u8; 8]) -> u64 {
    b.iter()
        .enumerate()
        .fold(0u64, |w, (i, x)| w | u64::from(*x) << (8 * i))
}

/// Connects to `127.0.0.1:port` with generous read and write timeouts, so a
/// broken peer fails the test instead of hanging it.
pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads until the peer closes the connection (EOF or reset) and returns
/// what arrived; panics if the peer keeps it open past `within`.
pub fn read_until_closed(s: &mut TcpStream, within: Duration) -> Vec<u8> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "peer did not close the connection within {within:?}"
        );
        s.set_read_timeout(Some(left.min(Duration::from_millis(500))))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // A reset is a close too (the peer closed with our bytes unread).
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                ) =>
            {
                return out;
            }
            Err(e) => panic!("reading until close: {e}"),
        }
    }
}

/// The port of an engine's handshake listener.
pub fn handshake_port(e: &Engine) -> u16 {
    let addr = e.local_ip_and_port();
    let (_, port) = addr.rsplit_once(':').expect("ip:port");
    port.parse().expect("port")
}

/// Fetches an engine's descriptor with a Metadata RPC to its handshake port.
pub fn descriptor(e: &Engine) -> Value {
    let addr = e.local_ip_and_port();
    let (host, port) = addr.rsplit_once(':').expect("ip:port");
    call(
        host,
        port.parse().expect("port"),
        FrameKind::Metadata,
        &json!({}),
    )
    .expect("metadata rpc")
}

/// The TCP data port an engine publishes.
pub fn data_port(e: &Engine) -> u16 {
    let d = descriptor(e);
    let p = d["tcp_data_port"]
        .as_u64()
        .expect("tcp_data_port is an unsigned integer");
    u16::try_from(p).expect("port")
}

/// Polls a task until it is terminal; panics after `within`.
pub fn wait_task(e: &Engine, batch: u64, task: usize, within: Duration) -> TaskStatus {
    let deadline = Instant::now() + within;
    loop {
        let (s, _) = e.status(batch, task).expect("status");
        if s != TaskStatus::Waiting {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "task {task} still WAITING after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Submits `reqs` as one batch, waits for every task (at most `within`
/// each) and frees the batch.
pub fn run_within(e: &Engine, reqs: &[Request], within: Duration) -> Vec<TaskStatus> {
    let b = e.allocate_batch(reqs.len()).expect("batch");
    e.submit(b, reqs).expect("submit");
    let out = (0..reqs.len())
        .map(|i| wait_task(e, b, i, within))
        .collect();
    e.free_batch(b).expect("free batch");
    out
}

/// [`run_within`] with 60 s per task.
pub fn run(e: &Engine, reqs: &[Request]) -> Vec<TaskStatus> {
    run_within(e, reqs, Duration::from_secs(60))
}

pub fn write_req(source: u64, seg: i32, target: u64, len: u64) -> Request {
    Request {
        opcode: Opcode::Write,
        source,
        target_id: seg,
        target_offset: target,
        length: len,
    }
}

pub fn read_req(dest: u64, seg: i32, target: u64, len: u64) -> Request {
    Request {
        opcode: Opcode::Read,
        source: dest,
        target_id: seg,
        target_offset: target,
        length: len,
    }
}

/// Waits until `cond` holds; panics after `within`.
pub fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

// ---------------------------------------------------------------------------
// A hand-written Mooncake peer: handshake responder + TCP data server.
// ---------------------------------------------------------------------------

/// A handshake listener that answers every typed Metadata request with a
/// fixed descriptor, half-closes and waits for the client's EOF.
pub struct HandshakeResponder {
    pub port: u16,
    /// Payloads of the Metadata requests received.
    pub requests: Arc<Mutex<Vec<Value>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HandshakeResponder {
    /// Binds 127.0.0.1:0; `desc` is built once the port is known.
    pub fn start(desc: impl FnOnce(u16) -> Value) -> HandshakeResponder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let desc = desc(port);
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (st, rq) = (stop.clone(), requests.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Acquire) {
                let (mut s, _) = match listener.accept() {
                    Ok(a) => a,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    Err(e) => panic!("handshake accept: {e}"),
                };
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let frame = read_frame(&mut s, 1 << 20).expect("handshake request frame");
                let Frame::Typed(FrameKind::Metadata, payload) = frame else {
                    panic!("expected a typed Metadata frame, got {frame:?}");
                };
                let v: Value = serde_json::from_slice(&payload).expect("request JSON");
                rq.lock().unwrap().push(v);
                s.write_all(&encode_json(Some(FrameKind::Metadata), &desc))
                    .unwrap();
                s.shutdown(Shutdown::Write).unwrap();
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
            }
        });
        HandshakeResponder {
            port,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    /// The segment name to open: `127.0.0.1:<port>`.
    pub fn name(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for HandshakeResponder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A hand-written Mooncake server of `len` bytes at `base` (v2 framing)
/// that serves requests below `hung` and takes those from `hung` on
/// without ever answering them, and its handshake responder.
pub fn hanging_peer(base: u64, len: u64, hung: u64) -> (FakeServer, HandshakeResponder) {
    let server = FakeServer::start(vec![0u8; len as usize], base, false, move |s| {
        if s.header.addr >= hung {
            Action::Hang
        } else {
            Action::Serve
        }
    });
    let port = server.port;
    let hs = HandshakeResponder::start(move |rpc| tcp_descriptor(rpc, port, 2, base, len));
    (server, hs)
}

/// A TCP descriptor as a Mooncake peer publishes it.
pub fn tcp_descriptor(rpc_port: u16, data_port: u16, version: u32, base: u64, len: u64) -> Value {
    json!({
        "name": format!("127.0.0.1:{rpc_port}"),
        "protocol": "tcp",
        "tcp_data_port": data_port,
        "tcp_proto_version": version,
        "timestamp": "",
        "buffers": [{"name": "x", "addr": base, "length": len}],
    })
}

/// What a [`FakeServer`] does with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Serve as Mooncake's server does (validating the range against the
    /// memory actually held; v2 iff the opcode has 0x80).
    Serve,
    /// Answer ADDR_REJECTED (v2) and close.
    Reject,
    /// Serve, but with a status word without the MCTV magic.
    BadStatus,
    /// Consume everything, never answer, keep the connection open.
    Hang,
    /// Close the connection at once.
    Close,
    /// WRITE: consume this many payload bytes, then close. READ: send the
    /// status word (v2) and this many data bytes, then close.
    PartialThenClose(u64),
    /// As `PartialThenClose`, but keep the connection open (silent) until
    /// the server is killed.
    PartialThenHang(u64),
    /// Serve at a pace: READ: the status word (v2) at once, then the data
    /// `chunk` bytes at a time, one chunk every `every` (the first after
    /// `every`). WRITE: read the payload `chunk` bytes at a time, one chunk
    /// every `every` (the first after `every`), then store it and answer
    /// (v2). A `chunk` as large as the request delays it by `every`. An
    /// invalid range is rejected as by `Serve`; a reset ends the session
    /// at once.
    Paced { chunk: usize, every: Duration },
    /// Answer the status word OK (v2) right after the header, read
    /// nothing more, and keep the connection open until the server is
    /// killed: a broken or hostile server that acknowledges a WRITE before
    /// its payload.
    EarlyStatus,
}

/// One request seen by a [`FakeServer`].
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    pub conn: usize,
    pub header: RawHeader,
}

type Policy = Arc<dyn Fn(&Seen) -> Action + Send + Sync>;

struct FakeShared {
    mem: Mutex<Vec<u8>>,
    base: u64,
    legacy: bool,
    policy: Policy,
    seen: Mutex<Vec<Seen>>,
    accepted: AtomicUsize,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
    /// Connections whose session thread has ended.
    ended: AtomicUsize,
}

/// A hand-written Mooncake TCP data server over a `Vec<u8>` that the test
/// maps at a fake base address.
pub struct FakeServer {
    pub port: u16,
    shared: Arc<FakeShared>,
    acceptor: Option<JoinHandle<()>>,
    sessions: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl FakeServer {
    /// `legacy`: a v1-only server (Mooncake before the v2 framing) that
    /// closes the connection on an opcode with 0x80.
    pub fn start(
        mem: Vec<u8>,
        base: u64,
        legacy: bool,
        policy: impl Fn(&Seen) -> Action + Send + Sync + 'static,
    ) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        FakeServer::serve(listener, mem, base, legacy, policy)
    }

    /// As [`FakeServer::start`], with connections that have a receive
    /// buffer of `rcvbuf` bytes (set on the listener before it listens,
    /// so the window they advertise stays small): a peer that reads
    /// slowly holds back the sender.
    pub fn start_with_recv_buffer(
        rcvbuf: usize,
        mem: Vec<u8>,
        base: u64,
        legacy: bool,
        policy: impl Fn(&Seen) -> Action + Send + Sync + 'static,
    ) -> FakeServer {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        socket.set_recv_buffer_size(rcvbuf).expect("SO_RCVBUF");
        let at: std::net::SocketAddr = ([127, 0, 0, 1], 0).into();
        socket.bind(&at.into()).expect("bind");
        socket.listen(128).expect("listen");
        FakeServer::serve(socket.into(), mem, base, legacy, policy)
    }

    fn serve(
        listener: TcpListener,
        mem: Vec<u8>,
        base: u64,
        legacy: bool,
        policy: impl Fn(&Seen) -> Action + Send + Sync + 'static,
    ) -> FakeServer {
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(FakeShared {
            mem: Mutex::new(mem),
            base,
            legacy,
            policy: Arc::new(policy),
            seen: Mutex::new(Vec::new()),
            accepted: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            ended: AtomicUsize::new(0),
        });
        let sessions = Arc::new(Mutex::new(Vec::new()));
        let (sh, ss) = (shared.clone(), sessions.clone());
        let acceptor = std::thread::spawn(move || {
            while !sh.stop.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        s.set_nodelay(true).unwrap();
                        let id = sh.accepted.fetch_add(1, Ordering::AcqRel);
                        sh.conns.lock().unwrap().push(s.try_clone().unwrap());
                        let sh2 = sh.clone();
                        ss.lock().unwrap().push(std::thread::spawn(move || {
                            session(s, id, &sh2);
                            sh2.ended.fetch_add(1, Ordering::AcqRel);
                        }));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => panic!("fake server accept: {e}"),
                }
            }
            // The listener is dropped here: new connects are refused.
        });
        FakeServer {
            port,
            shared,
            acceptor: Some(acceptor),
            sessions,
        }
    }

    /// A copy of `[addr, addr + n)` of the server's memory (absolute
    /// addresses).
    pub fn mem(&self, addr: u64, n: usize) -> Vec<u8> {
        let off = (addr - self.shared.base) as usize;
        self.shared.mem.lock().unwrap()[off..off + n].to_vec()
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::Acquire)
    }

    /// Connections whose session has ended (peer closed, or we closed).
    pub fn ended(&self) -> usize {
        self.shared.ended.load(Ordering::Acquire)
    }

    /// Kills the server: stops accepting (the listener is closed) and
    /// drops every connection; joins every thread.
    pub fn kill(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.acceptor.take() {
            t.join().unwrap();
        }
        for s in self.shared.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        let threads: Vec<_> = self.sessions.lock().unwrap().drain(..).collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn stopped(sh: &FakeShared) -> bool {
    sh.stop.load(Ordering::Acquire)
}

/// Reads exactly `buf.len()` bytes; false on EOF, error or stop.
fn read_full(s: &mut TcpStream, buf: &mut [u8], sh: &FakeShared) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut done = 0;
    while done < buf.len() {
        match s.read(&mut buf[done..]) {
            Ok(0) => return false,
            Ok(n) => done += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if stopped(sh) {
                    return false;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// Consumes and discards input until EOF or stop.
fn drain_until_closed(s: &mut TcpStream, sh: &FakeShared) {
    let mut buf = vec![0u8; 1 << 16];
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if stopped(sh) {
                    return;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn hang_until_stopped(sh: &FakeShared) {
    while !stopped(sh) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sleeps `d`; false if the server was stopped meanwhile, or the
/// connection was reset (its kernel holds the error even while received
/// bytes are still queued to read).
fn pause(s: &TcpStream, d: Duration, sh: &FakeShared) -> bool {
    let until = Instant::now() + d;
    loop {
        if stopped(sh) || !matches!(s.take_error(), Ok(None)) {
            return false;
        }
        let Some(left) = until.checked_duration_since(Instant::now()) else {
            return true;
        };
        std::thread::sleep(left.min(Duration::from_millis(10)));
    }
}

fn send(s: &mut TcpStream, b: &[u8]) -> bool {
    s.write_all(b).is_ok()
}

/// The v1/v2 server side of spec §4.4 over the fake memory.
fn session(mut s: TcpStream, conn: usize, sh: &FakeShared) {
    let mut raw = [0u8; 24];
    loop {
        if !read_full(&mut s, &mut raw, sh) {
            return;
        }
        let header = decode_header(&raw);
        let seen = Seen { conn, header };
        sh.seen.lock().unwrap().push(seen);
        let v2 = header.opcode & 0x80 != 0;
        if sh.legacy && v2 {
            // A v1-only server would misread the request; it must never be
            // sent one.
            let _ = s.shutdown(Shutdown::Both);
            return;
        }
        let write = header.opcode & 0x7f == 1;
        let len = sh.mem.lock().unwrap().len() as u64;
        let valid = header.size > 0
            && header.addr >= sh.base
            && header
                .addr
                .checked_add(header.size)
                .is_some_and(|end| end <= sh.base + len);
        let mut action = (sh.policy)(&seen);
        if matches!(
            action,
            Action::Serve | Action::BadStatus | Action::Paced { .. }
        ) && !valid
        {
            action = Action::Reject;
        }
        let off = header.addr.wrapping_sub(sh.base) as usize;
        let size = header.size as usize;
        match action {
            Action::Serve | Action::BadStatus => {
                let word = if action == Action::Serve {
                    OK_WORD
                } else {
                    0x0000_0000_1234_5678
                };
                if write {
                    let mut body = vec![0u8; size];
                    if !read_full(&mut s, &mut body, sh) {
                        return;
                    }
                    if action == Action::Serve {
                        sh.mem.lock().unwrap()[off..off + size].copy_from_slice(&body);
                    }
                    if v2 && !send(&mut s, &status_bytes(word)) {
                        return;
                    }
                } else {
                    let mut out = Vec::with_capacity(size + 8);
                    if v2 {
                        out.extend_from_slice(&status_bytes(word));
                    }
                    if action == Action::Serve {
                        out.extend_from_slice(&sh.mem.lock().unwrap()[off..off + size]);
                    }
                    if !send(&mut s, &out) {
                        return;
                    }
                }
            }
            Action::Reject => {
                if v2 {
                    let _ = send(&mut s, &status_bytes(REJECTED_WORD));
                }
                let _ = s.shutdown(Shutdown::Both);
                return;
            }
            Action::Hang => {
                drain_until_closed(&mut s, sh);
                return;
            }
            Action::Close => {
                let _ = s.shutdown(Shutdown::Both);
                return;
            }
            Action::Paced { chunk, every } => {
                let chunk = chunk.max(1);
                if write {
                    let mut body = vec![0u8; size];
                    for part in body.chunks_mut(chunk) {
                        if !pause(&s, every, sh) || !read_full(&mut s, part, sh) {
                            return;
                        }
                    }
                    sh.mem.lock().unwrap()[off..off + size].copy_from_slice(&body);
                    if v2 && !send(&mut s, &status_bytes(OK_WORD)) {
                        return;
                    }
                } else {
                    if v2 && !send(&mut s, &status_bytes(OK_WORD)) {
                        return;
                    }
                    let data = sh.mem.lock().unwrap()[off..off + size].to_vec();
                    for part in data.chunks(chunk) {
                        if !pause(&s, every, sh) || !send(&mut s, part) {
                            return;
                        }
                    }
                }
            }
            Action::EarlyStatus => {
                if v2 {
                    let _ = send(&mut s, &status_bytes(OK_WORD));
                }
                hang_until_stopped(sh);
                let _ = s.shutdown(Shutdown::Both);
                return;
            }
            Action::PartialThenClose(n) | Action::PartialThenHang(n) => {
                if write {
                    let mut body = vec![0u8; n.min(header.size) as usize];
                    let _ = read_full(&mut s, &mut body, sh);
                } else {
                    let mut out = Vec::new();
                    if v2 {
                        out.extend_from_slice(&status_bytes(OK_WORD));
                    }
                    let n = (n as usize).min(size);
                    if valid {
                        out.extend_from_slice(&sh.mem.lock().unwrap()[off..off + n]);
                    }
                    let _ = send(&mut s, &out);
                }
                if matches!(action, Action::PartialThenHang(_)) {
                    hang_until_stopped(sh);
                }
                let _ = s.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}
