//! Two-process harness of the shared-memory transport tests (the modules
//! beside this one), on the buffers of [`super::buf`]; its [`Local`] also
//! serves the one-process tests (`shm/tests.rs`).
//!
//! The peer is this same test binary, run again with [`CHILD_VAR`] set: it
//! starts a registry and a shared-memory transport of its own and obeys
//! JSON commands, one per line on its stdin, answering one JSON line on
//! its stdout (marked with `@@`, as libtest writes there too). Attach
//! requests travel the same way: the parent's [`Child::peer_of`] asks the
//! child to serve one; a child that initiates writes `{"attach": ...}`,
//! which [`Child::call`] serves with the parent's transport while it waits
//! for its answer.

use super::buf::{Buf, pattern_byte};
use crate::engine::config::Config;
use crate::error::Error;
use crate::memory::{Location, MemoryRegistry, Region};
use crate::transport::shm::{AttachFn, ShmOptions, ShmPeer, ShmTransport};
use crate::transport::{Outcome, Slice};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Set in the child's environment.
pub const CHILD_VAR: &str = "TE_SHM_CHILD";
/// Marks the lines of the protocol on the child's stdout.
const MARK: &str = "@@";
/// Longest a command or a batch of slices may take before the test calls
/// it a hang.
pub const HANG: Duration = Duration::from_secs(120);

/// Whether this process is the child.
pub fn is_child() -> bool {
    std::env::var_os(CHILD_VAR).is_some()
}

/// The start of the two-process test named `$name`: in the child (this
/// test binary run again for the test by [`Child::spawn`]) it serves the
/// parent ([`child_main`]) and returns from the test; in the parent it
/// gives the name, for [`Child::spawn`].
macro_rules! two_process_test {
    ($name:expr) => {{
        if $crate::transport::shm::proc_tests::harness::is_child() {
            return $crate::transport::shm::proc_tests::harness::child_main();
        }
        $name
    }};
}
pub(super) use two_process_test;

/// Two-process tests that each run `$run(test, args...)` in the parent
/// (see [`two_process_test!`]): one `name(args...)` per test.
macro_rules! two_process_tests {
    ($run:ident { $($name:ident($($arg:expr),*)),+ $(,)? }) => {$(
        #[test]
        fn $name() {
            let test = $crate::transport::shm::proc_tests::harness::two_process_test!(
                stringify!($name)
            );
            $run(test, $($arg),*);
        }
    )+};
}
pub(super) use two_process_tests;

/// A registry and a shared-memory transport, as an engine holds them.
pub struct Local {
    pub registry: Arc<RwLock<MemoryRegistry>>,
    pub shm: Arc<ShmTransport>,
}

impl Local {
    /// Settings from the environment's `MC_SHM_*`.
    pub fn start() -> Local {
        Local::with(ShmOptions::from_config(
            &Config::from_env().expect("the MC_* settings").shm,
        ))
    }

    /// Settings `opts`.
    pub fn with(opts: ShmOptions) -> Local {
        let registry = Arc::new(RwLock::new(MemoryRegistry::default()));
        let shm = ShmTransport::start(registry.clone(), opts).expect("start the transport");
        Local { registry, shm }
    }

    /// A zeroed buffer of `len` bytes, from the transport's memfd
    /// allocator if `shared` (freed with the transport), else from the
    /// heap (kept in `keep`).
    pub fn buffer(&self, len: u64, shared: bool, keep: &mut Vec<Buf>) -> u64 {
        if shared {
            return self.shm.allocate(len as usize).expect("allocate");
        }
        let b = Buf::zeroed(len as usize);
        let addr = b.addr();
        keep.push(b);
        addr
    }

    /// Registers `[addr, addr + len)` with the registry and the transport.
    pub fn register(&self, addr: u64, len: u64, accessible: bool) {
        let r = Region {
            addr,
            length: len,
            location: Location::Any,
            remote_accessible: accessible,
        };
        self.registry
            .write()
            .unwrap()
            .insert(std::slice::from_ref(&r))
            .expect("register");
        self.shm.register(&r);
    }

    /// Unregisters as the engine does (the registry's fence, then the
    /// table); returns how long it took.
    pub fn unregister(&self, addr: u64) -> Duration {
        let t = Instant::now();
        self.registry
            .write()
            .unwrap()
            .remove(addr)
            .expect("unregister");
        self.shm.unregister(addr);
        t.elapsed()
    }

    /// Posts one slice; `done` gets its outcome.
    pub fn post(
        &self,
        peer: &ShmPeer,
        s: (u64, u64, u64, bool),
        done: impl FnOnce(Outcome) + Send + 'static,
    ) {
        let (local, remote, len, write) = s;
        // As the engine does: the fence of our registered buffer holding
        // the local range, if one does.
        let local_fence = self
            .registry
            .read()
            .unwrap()
            .find_fenced(local, len)
            .map(|(_, f)| f.clone());
        self.shm.post(
            peer,
            Slice {
                local,
                remote,
                len,
                write,
                local_gpu: None,
                local_fence,
                task: None,
                done: Box::new(done),
            },
        );
    }

    /// Posts every `(local, remote, len, write)` and waits for all.
    pub fn run(&self, peer: &ShmPeer, slices: &[(u64, u64, u64, bool)]) -> Vec<Outcome> {
        let (tx, rx) = channel();
        for (i, &s) in slices.iter().enumerate() {
            let tx = tx.clone();
            self.post(peer, s, move |o| {
                let _ = tx.send((i, o));
            });
        }
        let mut out = vec![None; slices.len()];
        for _ in slices {
            let (i, o) = rx.recv_timeout(HANG).expect("a slice never ended");
            assert!(out[i].replace(o).is_none(), "slice {i} ended twice");
        }
        out.into_iter().map(Option::unwrap).collect()
    }
}

/// `(local, remote, len, write)` slices of `size` bytes (the last one
/// shorter) that cut `[0, len)` of both sides.
pub fn slices(
    local: u64,
    remote: u64,
    len: u64,
    size: u64,
    write: bool,
) -> Vec<(u64, u64, u64, bool)> {
    (0..len.div_ceil(size))
        .map(|k| {
            let off = k * size;
            (local + off, remote + off, size.min(len - off), write)
        })
        .collect()
}

/// Byte `i` of the pattern `seed`, with the high bits of `i` mixed in so
/// that large buffers do not repeat.
pub fn byte(i: u64, seed: u8) -> u8 {
    pattern_byte(i as usize, seed) ^ (i >> 24) as u8
}

/// Fills `[addr, addr + len)` with pattern `seed` from pattern offset
/// `from`.
///
/// # Safety
/// The range must be memory of this process that nobody else uses now.
pub unsafe fn fill(addr: u64, len: u64, seed: u8, from: u64) {
    // SAFETY: the caller's contract.
    let s = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) };
    for (k, b) in s.iter_mut().enumerate() {
        *b = byte(from + k as u64, seed);
    }
}

/// How many bytes of `[addr, addr + len)` differ from pattern `seed` (from
/// pattern offset `from`), and the first that does.
///
/// # Safety
/// The range must be readable memory of this process.
pub unsafe fn mismatches(addr: u64, len: u64, seed: u8, from: u64) -> (u64, Option<u64>) {
    // SAFETY: the caller's contract.
    let s = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
    let mut bad = 0;
    let mut first = None;
    for (k, &b) in s.iter().enumerate() {
        if b != byte(from + k as u64, seed) {
            bad += 1;
            first.get_or_insert(k as u64);
        }
    }
    (bad, first)
}

/// How many bytes of `[addr, addr + len)` are not `value`.
///
/// # Safety
/// The range must be readable memory of this process.
pub unsafe fn not_equal(addr: u64, len: u64, value: u8) -> u64 {
    // SAFETY: the caller's contract.
    let s = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
    s.iter().filter(|&&b| b != value).count() as u64
}

/// How many bytes of `[addr, addr + len)` hold pattern `new` where it
/// differs from pattern `old` and from zero: bytes that only a copy of a
/// source refilled with `new` can have put there.
///
/// # Safety
/// The range must be readable memory of this process.
pub unsafe fn count_late(addr: u64, len: u64, old: u8, new: u8) -> u64 {
    // SAFETY: the caller's contract.
    let s = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
    s.iter()
        .enumerate()
        .filter(|&(k, &b)| {
            let want = byte(k as u64, new);
            b == want && want != byte(k as u64, old) && want != 0
        })
        .count() as u64
}

/// The parent's handle on a child.
pub struct Child {
    proc: Mutex<std::process::Child>,
    pid: i32,
    io: Mutex<Io>,
    next_id: AtomicU64,
}

struct Io {
    stdin: ChildStdin,
    lines: Receiver<Value>,
}

impl Child {
    /// Runs test `test` of this binary as the child, with `env` added and,
    /// if given, through `wrap` (a command that runs the rest, like
    /// `setpriv`).
    pub fn spawn(test: &str, env: &[(&str, &str)], wrap: &[&str]) -> Arc<Child> {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args([test, "--nocapture", "--include-ignored", "--test-threads=1"])
            .env(CHILD_VAR, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut proc = cmd.spawn().expect("spawn the child");
        let stdin = proc.stdin.take().unwrap();
        let stdout = proc.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                match line.find(MARK) {
                    Some(at) => {
                        let v: Value = serde_json::from_str(&line[at + MARK.len()..])
                            .expect("a JSON line from the child");
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                    None => eprintln!("child: {line}"),
                }
            }
        });
        let child = Arc::new(Child {
            pid: proc.id() as i32,
            proc: Mutex::new(proc),
            io: Mutex::new(Io { stdin, lines: rx }),
            next_id: AtomicU64::new(1),
        });
        child.call(json!({"cmd": "hello"}), None);
        child
    }

    /// The child's pid (through `wrap`, the wrapper's, which execs).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Sends a command and returns its answer; attach requests the child
    /// makes meanwhile are served by `serve`.
    pub fn call(&self, mut cmd: Value, serve: Option<&Local>) -> Value {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        cmd["id"] = json!(id);
        let mut io = self.io.lock().unwrap();
        writeln!(io.stdin, "{cmd}").expect("write to the child");
        io.stdin.flush().unwrap();
        let deadline = Instant::now() + HANG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = io
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no answer from the child to {cmd}: {e}"));
            if let Some(req) = v.get("attach") {
                let local = serve.expect("the child asks to attach");
                let reply = local.shm.serve_attach(req, "127.0.0.1:1".parse().unwrap());
                writeln!(io.stdin, "{}", json!({ "attached": reply })).unwrap();
                io.stdin.flush().unwrap();
                continue;
            }
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    /// Has the child run `slices` (`[local, remote, len, write]` each),
    /// serving its attach requests with `local`, and asserts that every
    /// one ended `want` (`"Done"`, `"Unreachable"`, ...).
    pub fn run_expecting(&self, slices: Value, local: &Local, want: &str) {
        let r = self.call(json!({"cmd": "run", "slices": slices}), Some(local));
        let outcomes = r["outcomes"].as_array().expect("the outcomes");
        assert!(outcomes.iter().all(|o| o == want), "{r}");
    }

    /// The child's check of `[addr, addr + len)` of its memory against
    /// pattern `seed` from pattern offset `from`: `"bad"` counts the bytes
    /// that differ.
    pub fn check(&self, addr: u64, len: u64, seed: u8, from: u64) -> Value {
        self.call(
            json!({"cmd": "check", "addr": addr, "len": len, "seed": seed, "from": from}),
            None,
        )
    }

    /// Tells the child to exit.
    pub fn exit(&self) {
        self.call(json!({"cmd": "exit"}), None);
    }

    /// The child's transport descriptor.
    pub fn descriptor(&self) -> Value {
        self.call(json!({"cmd": "hello"}), None)["shm"].clone()
    }

    /// A peer handle on the child for `local`, attaching through the
    /// child's stdin.
    pub fn peer_of(self: &Arc<Self>, local: &Local) -> ShmPeer {
        let me = Arc::downgrade(self);
        let attach: AttachFn = Arc::new(move |req: &Value| {
            let child = me
                .upgrade()
                .ok_or_else(|| Error::Socket("child gone".into()))?;
            Ok(child.call(json!({"cmd": "attach", "request": req}), None)["reply"].clone())
        });
        local
            .shm
            .peer(&self.descriptor(), attach)
            .expect("the child is reachable by shared memory")
    }

    /// Allocates and registers a child buffer of `len` bytes, filled with
    /// pattern `seed` (or zeros); returns its address.
    pub fn alloc(&self, len: u64, seed: Option<u8>, accessible: bool) -> u64 {
        self.alloc_in(len, seed, accessible, false)
    }

    /// [`Child::alloc`], from the child transport's memfd allocator if
    /// `shared`.
    pub fn alloc_in(&self, len: u64, seed: Option<u8>, accessible: bool, shared: bool) -> u64 {
        let v = self.call(
            json!({"cmd": "alloc", "len": len, "seed": seed, "accessible": accessible,
                   "shared": shared}),
            None,
        );
        v["addr"].as_u64().unwrap()
    }

    /// Sends a signal to the child.
    pub fn signal(&self, sig: i32) {
        // SAFETY: signals our own child process.
        assert_eq!(unsafe { libc::kill(self.pid, sig) }, 0);
    }

    /// SIGSTOP, and waits until every thread of the child is stopped.
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
        let start = Instant::now();
        let stopped = |task: std::fs::DirEntry| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised command name.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
        };
        loop {
            let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid)).unwrap();
            if tasks.map_while(Result::ok).all(stopped) {
                return;
            }
            assert!(start.elapsed() < HANG, "the child does not stop");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// `kill -9`, and reaps it.
    pub fn kill(&self) {
        let mut p = self.proc.lock().unwrap();
        let _ = p.kill();
        let _ = p.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How many of `outcomes` are each kind.
pub fn tally(outcomes: &[Outcome]) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for o in outcomes {
        *m.entry(format!("{o:?}")).or_insert(0) += 1;
    }
    m
}

/// What the child keeps between commands.
struct ChildState {
    local: Local,
    bufs: HashMap<u64, Buf>,
    peer: Option<Arc<ShmPeer>>,
    stream: Option<Stream>,
}

/// WRITEs or READs the child posts in a loop until told to stop.
struct Stream {
    stop: Arc<AtomicUsize>,
    counts: Arc<Mutex<HashMap<String, usize>>>,
    thread: std::thread::JoinHandle<()>,
}

fn answer(out: &Mutex<std::io::Stdout>, v: Value) {
    let mut o = out.lock().unwrap();
    writeln!(o, "{MARK}{v}").unwrap();
    o.flush().unwrap();
}

/// The child's side: obeys commands until stdin closes.
pub fn child_main() {
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let (cmd_tx, cmd_rx) = channel::<Value>();
    let (att_tx, att_rx) = channel::<Value>();
    std::thread::spawn(move || route_stdin(cmd_tx, att_tx));
    let att_rx = Arc::new(Mutex::new(att_rx));
    let mut st = ChildState {
        local: Local::start(),
        bufs: HashMap::new(),
        peer: None,
        stream: None,
    };
    for cmd in cmd_rx {
        let mut reply = obey(&mut st, &cmd, &out, &att_rx);
        reply["id"] = cmd["id"].clone();
        answer(&out, reply);
        if cmd["cmd"] == "exit" {
            break;
        }
    }
}

fn route_stdin(cmd_tx: Sender<Value>, att_tx: Sender<Value>) {
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        let v: Value = serde_json::from_str(&line).expect("a JSON command");
        let sent = match v.get("attached") {
            Some(reply) => att_tx.send(reply.clone()).is_ok(),
            None => cmd_tx.send(v).is_ok(),
        };
        if !sent {
            return;
        }
    }
}

fn outcome_name(o: Outcome) -> String {
    format!("{o:?}")
}

fn obey(
    st: &mut ChildState,
    cmd: &Value,
    out: &Arc<Mutex<std::io::Stdout>>,
    att_rx: &Arc<Mutex<Receiver<Value>>>,
) -> Value {
    let n = |k: &str| cmd[k].as_u64().unwrap_or_else(|| panic!("{k} in {cmd}"));
    match cmd["cmd"].as_str().unwrap() {
        "hello" => json!({"pid": std::process::id(), "shm": st.local.shm.descriptor()}),
        "alloc" => {
            let len = n("len");
            let addr = if cmd["shared"].as_bool().unwrap_or(false) {
                st.local.shm.allocate(len as usize).expect("allocate")
            } else {
                let buf = Buf::zeroed(len as usize);
                let addr = buf.addr();
                st.bufs.insert(addr, buf);
                addr
            };
            if let Some(seed) = cmd["seed"].as_u64() {
                // SAFETY: a fresh buffer of ours.
                unsafe { fill(addr, len, seed as u8, 0) };
            }
            st.local
                .register(addr, len, cmd["accessible"].as_bool().unwrap_or(true));
            json!({ "addr": addr })
        }
        "check" => {
            // SAFETY: the parent names ranges of our buffers.
            let (bad, first) =
                unsafe { mismatches(n("addr"), n("len"), n("seed") as u8, n("from")) };
            json!({"bad": bad, "first": first})
        }
        "not_equal" => {
            // SAFETY: as above.
            json!({"bad": unsafe { not_equal(n("addr"), n("len"), n("value") as u8) }})
        }
        "fill" => {
            let (addr, len, v) = (n("addr"), n("len"), n("value") as u8);
            // SAFETY: as above; nobody may write the range now (the test
            // unregistered it or owns it).
            unsafe { std::ptr::write_bytes(addr as *mut u8, v, len as usize) };
            json!({})
        }
        "fill_pattern" => {
            // SAFETY: as above.
            unsafe { fill(n("addr"), n("len"), n("seed") as u8, 0) };
            json!({})
        }
        "unregister" => {
            let t = st.local.unregister(n("addr"));
            json!({"us": t.as_micros() as u64})
        }
        "attach" => {
            json!({"reply": st.local.shm.serve_attach(&cmd["request"], "127.0.0.1:1".parse().unwrap())})
        }
        "connect" => {
            let out = out.clone();
            let att_rx = att_rx.clone();
            let attach: AttachFn = Arc::new(move |req: &Value| {
                answer(&out, json!({ "attach": req }));
                att_rx
                    .lock()
                    .unwrap()
                    .recv_timeout(HANG)
                    .map_err(|e| Error::Socket(format!("no attach answer: {e}")))
            });
            st.peer = st.local.shm.peer(&cmd["shm"], attach).map(Arc::new);
            json!({"ok": st.peer.is_some()})
        }
        "run" => {
            let slices: Vec<(u64, u64, u64, bool)> =
                serde_json::from_value(cmd["slices"].clone()).unwrap();
            let peer = st.peer.as_ref().expect("connected");
            let outcomes: Vec<String> = st
                .local
                .run(peer, &slices)
                .into_iter()
                .map(outcome_name)
                .collect();
            json!({ "outcomes": outcomes })
        }
        "stream" => {
            let peer = st.peer.clone().expect("connected");
            let spec = StreamSpec {
                local: n("local"),
                remote: n("remote"),
                len: n("len"),
                write: cmd["write"].as_bool().unwrap(),
                depth: n("depth"),
                expect: cmd["expect_seed"]
                    .as_u64()
                    .map(|s| (s as u8, n("expect_from"))),
            };
            let shm = st.local.shm.clone();
            let stop = Arc::new(AtomicUsize::new(0));
            let counts = Arc::new(Mutex::new(HashMap::new()));
            let (s2, c2) = (stop.clone(), counts.clone());
            let thread = std::thread::spawn(move || stream(&shm, &peer, &spec, &s2, &c2));
            st.stream = Some(Stream {
                stop,
                counts,
                thread,
            });
            json!({})
        }
        "stream_counts" => {
            let s = st.stream.as_ref().expect("streaming");
            json!(s.counts.lock().unwrap().clone())
        }
        "stop_stream" => {
            let s = st.stream.take().expect("streaming");
            s.stop.store(1, Ordering::SeqCst);
            s.thread.join().unwrap();
            json!(s.counts.lock().unwrap().clone())
        }
        "memfd" => {
            // A memfd-backed buffer filled with a pattern, kept for the
            // process's life (the benchmark maps it from the parent).
            let len = n("len") as usize;
            // SAFETY: plain system calls; the mapping is new and ours.
            let (fd, addr) = unsafe {
                let fd = libc::memfd_create(c"bench".as_ptr(), libc::MFD_CLOEXEC);
                assert!(fd >= 0 && libc::ftruncate(fd, len as libc::off_t) == 0);
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED);
                (fd, p as u64)
            };
            // SAFETY: the fresh mapping.
            unsafe { fill(addr, len as u64, n("seed") as u8, 0) };
            json!({"fd": fd, "addr": addr})
        }
        "hold" => {
            // The next `n` copies of WRITEs wait (see `test_hooks`).
            use crate::transport::shm::test_hooks::{HOLDING, HOLDS};
            HOLDING.store(true, Ordering::SeqCst);
            HOLDS.store(n("n") as usize, Ordering::SeqCst);
            json!({})
        }
        "release" => {
            use crate::transport::shm::test_hooks::{HOLDING, HOLDS};
            HOLDS.store(0, Ordering::SeqCst);
            HOLDING.store(false, Ordering::SeqCst);
            json!({})
        }
        "held" => {
            json!({"held": crate::transport::shm::test_hooks::HELD.load(Ordering::SeqCst)})
        }
        "preempt" => {
            let on = cmd["on"].as_bool().unwrap();
            crate::transport::shm::test_hooks::PREEMPT.store(on, Ordering::SeqCst);
            json!({})
        }
        "tear_table" => {
            // A hostile process: slots [from, to) of our own table left
            // mid-update forever, and the high-water mark at `hwm`.
            let table = &st.local.shm.shared.table;
            table.tear(n("from") as usize..n("to") as usize);
            table.claim_high_water_mark(n("hwm") as usize);
            json!({})
        }
        "churn_table" => {
            // With `on`, a thread says our table changed every 50 µs (as a
            // hostile process would, to make its peers scan it again and
            // again), until told `on: false`.
            static CHURN: AtomicUsize = AtomicUsize::new(0);
            if cmd["on"].as_bool().unwrap() {
                if CHURN.swap(1, Ordering::SeqCst) == 0 {
                    let shm = st.local.shm.clone();
                    std::thread::spawn(move || {
                        while CHURN.load(Ordering::SeqCst) == 1 {
                            shm.shared.table.touch();
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    });
                }
            } else {
                CHURN.store(0, Ordering::SeqCst);
            }
            json!({})
        }
        "count_late" => {
            // SAFETY: the parent names ranges of our buffers.
            json!({"late": unsafe { count_late(n("addr"), n("len"), n("old") as u8, n("new") as u8) }})
        }
        "stats" => {
            let s = st.local.shm.stats();
            json!({"written": s.written, "read": s.read, "served": s.served,
                   "mapped": s.mapped, "served_peers": st.local.shm.served_peers()})
        }
        "exit" => {
            st.peer = None;
            st.local.shm.shutdown();
            json!({})
        }
        other => panic!("unknown command {other}"),
    }
}

/// What a stream posts: `depth` slices in flight, slice `j` from
/// `local + j * len` to `remote` (WRITE) or from `remote` to
/// `local + j * len` (READ), each posted again when it ends. With
/// `expect`, a READ that ends Done must hold pattern `(seed, from)`.
struct StreamSpec {
    local: u64,
    remote: u64,
    len: u64,
    write: bool,
    depth: u64,
    expect: Option<(u8, u64)>,
}

/// Runs a stream until `stop` is set; counts outcomes (and `"corrupt"`:
/// READs Done with bytes other than expected).
fn stream(
    shm: &Arc<ShmTransport>,
    peer: &ShmPeer,
    spec: &StreamSpec,
    stop: &AtomicUsize,
    counts: &Mutex<HashMap<String, usize>>,
) {
    let (tx, rx) = channel::<(u64, Outcome)>();
    let post = |j: u64| {
        let tx = tx.clone();
        shm.post(
            peer,
            Slice {
                local: spec.local + j * spec.len,
                remote: spec.remote,
                len: spec.len,
                write: spec.write,
                local_gpu: None,
                local_fence: None,
                task: None,
                done: Box::new(move |o| {
                    let _ = tx.send((j, o));
                }),
            },
        );
    };
    (0..spec.depth).for_each(post);
    let mut in_flight = spec.depth;
    let expected: Option<Vec<u8>> = spec
        .expect
        .map(|(seed, from)| (0..spec.len).map(|k| byte(from + k, seed)).collect());
    while in_flight > 0 {
        let (j, o) = rx.recv_timeout(HANG).expect("a streamed slice never ended");
        in_flight -= 1;
        let mut c = counts.lock().unwrap();
        *c.entry(outcome_name(o)).or_insert(0) += 1;
        if let (Outcome::Done, Some(want)) = (o, &expected) {
            let at = (spec.local + j * spec.len) as *const u8;
            // SAFETY: slot `j` is ours and its READ has ended.
            let got = unsafe { std::slice::from_raw_parts(at, spec.len as usize) };
            if got != want.as_slice() {
                *c.entry("corrupt".into()).or_insert(0) += 1;
            }
        }
        drop(c);
        if stop.load(Ordering::SeqCst) == 0 {
            post(j);
            in_flight += 1;
        }
    }
}
