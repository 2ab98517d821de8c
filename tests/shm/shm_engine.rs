//! Engines with the shared-memory transport beside TCP, two processes on
//! one host, through the public API only: the peer is this test binary run
//! again ([`CHILD`] set), which starts an engine, registers one buffer and
//! obeys one-line JSON commands on its stdin (answers on stdout, marked
//! `@@`).
//!
//! * 1 B to 64 MiB at odd offsets, WRITE and READ at once from 8 threads;
//!   every byte (and the gaps) checked by the side that owns it; the
//!   transport's counters account for every byte and no connection ever
//!   reached the peer's TCP data port: shared memory carried the data.
//! * `kill -9` of the peer mid-batch: every task ends within a bound, and
//!   a new peer is served.
//! * The peer unregisters its buffer during a stream of WRITEs: unregister
//!   returns within its bound and no byte lands afterwards (with a stopped
//!   initiator: the transport's own tests, `transport::shm::proc_tests`).
//! * A peer running as another user (`setpriv` to `nobody`): the kernel
//!   refuses cross-memory attach, and the bytes go over TCP.
//! * Auto discovery installs shared memory beside TCP, `MC_TE_SHM=0` not.
//! * `MC_TE_REQUIRE_TRANSPORT=shm`: a request to a peer that publishes no
//!   shared memory FAILS at submit with the reason, and one to a peer the
//!   kernel refuses to attach to (another user) FAILS where shared memory
//!   hands it on; neither moves a byte. A peer here is served by shared
//!   memory, which `Engine::segment_transport` names; unset, the refused
//!   one is served by TCP, and the segment's transport changes from `shm`
//!   to `tcp` with one log line.
//! * A 64 MiB WRITE to a peer stopped (SIGSTOP) mid-copy: once its task
//!   reports FAILED the caller refills its source, and after the peer
//!   resumes not one byte of the new pattern reaches it (the slices that
//!   fell back to TCP included); a READ's buffer, refilled after FAILED,
//!   stays as refilled.
//! * Opening a peer on this host logs that shared memory carries its data
//!   (TCP if it cannot).
//! * The peer's buffer in GPU memory (of the CUDA driver's test double,
//!   NOT a GPU) is reached over TCP, which stages it, beside shared memory
//!   for its host buffer.
//! * A large buffer in 4 KiB pages is logged once per engine with the way
//!   to huge pages; one in transparent huge pages is not.

use crate::common;

use common::gpu_double::DriverDouble;
use common::{Buf, Mapping, pattern, pattern_byte};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use transfer_engine::{Config, Engine, Location, Opcode, Region, Request, TaskStatus};

/// Set in the peer's environment: the test whose peer it is.
const CHILD: &str = "TE_SHM_ENGINE_CHILD";
/// Bytes of the peer's buffer (`TE_SHM_LEN` in its environment).
const LEN_VAR: &str = "TE_SHM_LEN";
/// The peer's host address (`TE_SHM_HOST`; 127.0.0.1 if unset).
const HOST_VAR: &str = "TE_SHM_HOST";
/// The peer's metadata connection string (`TE_SHM_CONN`; P2P if unset)
/// and, with a store, its name (`TE_SHM_NAME`).
const CONN_VAR: &str = "TE_SHM_CONN";
const NAME_VAR: &str = "TE_SHM_NAME";
/// Set (to anything) in the peer's environment: it installs TCP only, and
/// publishes no shared memory.
const TCP_ONLY_VAR: &str = "TE_SHM_TCP_ONLY";
/// The pattern seed of the peer's buffer; WRITEs bring [`SEED_WRITE`].
const SEED_PEER: u8 = 7;
const SEED_WRITE: u8 = 3;
/// Longest any task may take before the test calls it a hang.
const HANG: Duration = Duration::from_secs(120);

/// A hash of bytes (FNV-1a), to compare a buffer over time.
fn digest(b: &Buf) -> u64 {
    digest_of(&b.snapshot())
}

/// [`digest`] of `bytes`.
fn digest_of(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// The peer: an engine with `tcp,shm`, one registered buffer filled with
/// the peer pattern, and a loop over commands.
fn child_main() {
    let len: usize = std::env::var(LEN_VAR).unwrap().parse().unwrap();
    let host = std::env::var(HOST_VAR).unwrap_or_else(|_| "127.0.0.1".into());
    let conn = std::env::var(CONN_VAR).unwrap_or_else(|_| "P2PHANDSHAKE".into());
    let name = std::env::var(NAME_VAR).unwrap_or_else(|_| format!("{host}:0"));
    let e = Engine::new(&conn, &name, false).expect("engine");
    e.install_transport("tcp", None).expect("tcp");
    if std::env::var_os(TCP_ONLY_VAR).is_none() {
        e.install_transport("shm", None).expect("shm");
    }
    let buf = Buf::new(len, SEED_PEER);
    let region = Region {
        addr: buf.addr(),
        length: len as u64,
        location: Location::Any,
        remote_accessible: true,
    };
    e.register(&[region]).expect("register");
    let say = |v: Value| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "@@{v}").unwrap();
        out.flush().unwrap();
    };
    say(json!({
        "name": e.local_ip_and_port(),
        "segment": e.local_name(),
        "addr": buf.addr(),
        "pid": std::process::id()
    }));
    // Buffers registered by "fresh" and "every", in order; none is freed
    // before the peer exits, so each has an address never registered
    // before. "fresh" (answered one at a time: the initiator is done with
    // the buffer before it asks for the next) keeps the last FRESH_KEPT
    // registered; "every" keeps all of its own, since the initiator may
    // still be writing any of them however late the host lets it run.
    const FRESH_KEPT: usize = 4;
    let mut fresh: Vec<Buf> = Vec::new();
    // The CUDA driver's double and its GPU buffer, once "gpu" asked.
    let mut gpu: Option<(DriverDouble, u64, usize)> = None;
    let add_fresh = |fresh: &mut Vec<Buf>, len: usize, unregister_old: bool| {
        let b = Buf::new(len, SEED_PEER);
        register(&e, &b);
        fresh.push(b);
        match fresh.len().checked_sub(FRESH_KEPT + 1) {
            Some(old) if unregister_old => {
                e.unregister(&[fresh[old].addr()]).expect("unregister");
            }
            _ => {}
        }
        fresh.last().unwrap().addr()
    };
    for line in std::io::stdin().lock().lines() {
        let cmd: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let answer = match cmd["op"].as_str().unwrap() {
            // Ranges [off, len] must hold the written pattern, the rest
            // of the buffer the peer pattern: the count of wrong bytes.
            "check" => {
                let bytes = buf.snapshot();
                let mut written = vec![false; len];
                for r in cmd["ranges"].as_array().unwrap() {
                    let (o, l) = (
                        r[0].as_u64().unwrap() as usize,
                        r[1].as_u64().unwrap() as usize,
                    );
                    written[o..o + l].iter_mut().for_each(|w| *w = true);
                }
                let bad = (0..len)
                    .filter(|&i| {
                        let seed = if written[i] { SEED_WRITE } else { SEED_PEER };
                        bytes[i] != pattern_byte(i, seed)
                    })
                    .count();
                json!({"bad": bad})
            }
            "unregister" => {
                let t = Instant::now();
                e.unregister(&[buf.addr()]).expect("unregister");
                json!({"ms": t.elapsed().as_millis() as u64, "digest": digest(&buf)})
            }
            "digest" => json!({"digest": digest(&buf)}),
            // Bytes that hold pattern `seed` where it differs from the
            // peer pattern and the written one: only a copy of a source
            // refilled with `seed` can have put them there.
            "late" => {
                let seed = cmd["seed"].as_u64().unwrap() as u8;
                let bytes = buf.snapshot();
                let late = (0..len)
                    .filter(|&i| {
                        let want = pattern_byte(i, seed);
                        bytes[i] == want
                            && want != pattern_byte(i, SEED_PEER)
                            && want != pattern_byte(i, SEED_WRITE)
                    })
                    .count();
                json!({"late": late})
            }
            // Registers a new buffer of `len` bytes (the peer pattern).
            "fresh" => {
                let len = cmd["len"].as_u64().unwrap() as usize;
                json!({"addr": add_fresh(&mut fresh, len, true)})
            }
            // Registers `count` new buffers of `len` bytes, one every `ms`,
            // announcing each at once; then answers.
            "every" => {
                let len = cmd["len"].as_u64().unwrap() as usize;
                for _ in 0..cmd["count"].as_u64().unwrap() {
                    say(json!({"fresh": add_fresh(&mut fresh, len, false)}));
                    std::thread::sleep(Duration::from_millis(cmd["ms"].as_u64().unwrap()));
                }
                json!({"done": true})
            }
            // How many of the fresh buffers do not hold `fresh_data` of
            // their index (every one was written).
            "check_fresh" => {
                json!({"bad": fresh
                    .iter()
                    .enumerate()
                    .filter(|(i, b)| b.snapshot() != fresh_data(b.len(), *i))
                    .count()})
            }
            "counters" => json!({"shm": counters(&e)}),
            // Loads the CUDA driver's double and registers `len` bytes of
            // its GPU 0 memory, filled with the peer pattern.
            "gpu" => {
                let len = cmd["len"].as_u64().unwrap() as usize;
                let double = DriverDouble::load();
                let dev = double.alloc(len, 0);
                double.fill(dev, len, SEED_PEER);
                e.register(&[Region {
                    addr: dev,
                    length: len as u64,
                    location: Location::Any,
                    remote_accessible: true,
                }])
                .expect("register the GPU buffer");
                gpu = Some((double, dev, len));
                json!({"addr": dev})
            }
            "gpu_digest" => {
                let (double, dev, len) = gpu.as_ref().expect("a GPU buffer");
                json!({"digest": digest_of(&double.contents(*dev, *len))})
            }
            other => panic!("unknown command {other}"),
        };
        say(answer);
    }
}

/// Bytes of the fresh buffers of a peer.
const FRESH_LEN: usize = 4096 + 13;

/// What the initiator writes to the `i`th fresh buffer of a peer.
fn fresh_data(len: usize, i: usize) -> Vec<u8> {
    common::pattern(len, (i % 251) as u8 + 1)
}

/// The shared-memory counters of an engine, by name.
fn counters(e: &Engine) -> Value {
    e.transport_counters()
        .into_iter()
        .filter(|(p, _, _)| *p == "shm")
        .map(|(_, n, v)| (n.to_string(), json!(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A running peer.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    name: String,
    /// The name its segment opens by.
    segment: String,
    addr: u64,
    pid: i32,
}

impl Peer {
    /// Starts the peer of test `test` with a buffer of `len` bytes,
    /// through `wrap` (e.g. `setpriv ...`) if not empty.
    fn start(test: &str, len: usize, wrap: &[&str]) -> Peer {
        Peer::start_on(test, len, wrap, "127.0.0.1")
    }

    /// As [`Peer::start`], its engine named by `host`.
    fn start_on(test: &str, len: usize, wrap: &[&str], host: &str) -> Peer {
        Peer::start_with(test, len, wrap, &[(HOST_VAR, host)])
    }

    /// As [`Peer::start`], with `env` set in its environment.
    fn start_with(test: &str, len: usize, wrap: &[&str], env: &[(&str, &str)]) -> Peer {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args([
            &common::test_path(module_path!(), test),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, test)
        .env(LEN_VAR, len.to_string())
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn the peer");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut p = Peer {
            child,
            stdin,
            stdout,
            name: String::new(),
            segment: String::new(),
            addr: 0,
            pid: 0,
        };
        let hello = p.read();
        p.name = hello["name"].as_str().unwrap().to_string();
        p.segment = hello["segment"].as_str().unwrap().to_string();
        p.addr = hello["addr"].as_u64().unwrap();
        p.pid = hello["pid"].as_u64().unwrap() as i32;
        p
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the peer exited"
            );
            // libtest may have begun the line ("test NAME ... ").
            if let Some((_, v)) = line.trim_end().split_once("@@") {
                return serde_json::from_str(v).unwrap();
            }
        }
    }

    fn call(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.read()
    }

    /// The TCP data port the peer publishes.
    fn data_port(&self) -> u16 {
        let (host, port) = self.name.rsplit_once(':').unwrap();
        let d = common::handshake::call(
            host,
            port.parse().unwrap(),
            common::handshake::FrameKind::Metadata,
            &json!({}),
        )
        .unwrap();
        d["tcp_data_port"].as_u64().unwrap() as u16
    }

    fn signal(&self, sig: i32) {
        // SAFETY: a plain system call on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.pid, sig) }, 0);
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a TCP connection to or from local `port` is listed by the
/// kernel (any state but LISTEN, including TIME_WAIT).
fn tcp_connections_on(port: u16) -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port_of = |a: &str| u16::from_str_radix(a.rsplit(':').next().unwrap(), 16).unwrap();
            f.len() > 3 && f[3] != "0A" && (port_of(f[1]) == port || port_of(f[2]) == port)
        })
        .count()
}

/// An engine of this process with `tcp` and `shm`.
fn engine() -> Arc<Engine> {
    let e = Engine::new("P2PHANDSHAKE", "127.0.0.1:0", false).expect("engine");
    e.install_transport("tcp", None).expect("tcp");
    e.install_transport("shm", None).expect("shm");
    e
}

fn register(e: &Engine, b: &Buf) {
    e.register(&[Region {
        addr: b.addr(),
        length: b.len() as u64,
        location: Location::Any,
        remote_accessible: true,
    }])
    .expect("register");
}

/// Submits `reqs` as one batch and waits for every task.
fn run(e: &Engine, reqs: &[Request]) -> Vec<TaskStatus> {
    common::run_within(e, reqs, HANG)
}

const SIZES: [u64; 14] = [
    1,
    2,
    3,
    7,
    100,
    4095,
    4096,
    4097,
    65535,
    65537,
    (1 << 20) + 3,
    (3 << 20) + 1,
    (8 << 20) + 5,
    64 << 20,
];
const GAP: u64 = 8;

/// `(offset, len)` of each transfer in a layout with gaps, at odd offsets.
fn layout() -> (Vec<(u64, u64)>, u64) {
    let mut at = 1;
    let v = SIZES
        .iter()
        .map(|&l| {
            let r = (at, l);
            at += l + GAP;
            r
        })
        .collect();
    (v, at + GAP)
}

fn is_child(test: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|t| t == test)
}

#[test]
fn shm_carries_every_byte_both_ways_from_8_threads() {
    const TEST: &str = "shm_carries_every_byte_both_ways_from_8_threads";
    if is_child(TEST) {
        return child_main();
    }
    let (ranges, half) = layout();
    // The peer's first half takes WRITEs, its second half gives READs.
    let mut peer = Peer::start(TEST, 2 * half as usize, &[]);
    let e = engine();
    let src = Buf::new(half as usize, 0);
    // The source holds the written pattern at the peer's indices.
    src.set(
        0,
        &(0..half as usize)
            .map(|i| pattern_byte(i, SEED_WRITE))
            .collect::<Vec<_>>(),
    );
    let dst = Buf::zeroed(half as usize);
    register(&e, &src);
    register(&e, &dst);
    let seg = e.open_segment(&peer.name).expect("open");
    let data_port = peer.data_port();
    let before = tcp_connections_on(data_port);
    let base = peer.addr;
    std::thread::scope(|s| {
        for t in 0..8 {
            let (e, ranges, src, dst) = (&e, &ranges, &src, &dst);
            s.spawn(move || {
                let mine: Vec<Request> = ranges
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| i % 8 == t)
                    .flat_map(|(_, &(o, l))| {
                        [
                            Request {
                                opcode: Opcode::Write,
                                source: src.addr() + o,
                                target_id: seg,
                                target_offset: base + o,
                                length: l,
                            },
                            Request {
                                opcode: Opcode::Read,
                                source: dst.addr() + o,
                                target_id: seg,
                                target_offset: base + half + o,
                                length: l,
                            },
                        ]
                    })
                    .collect();
                if !mine.is_empty() {
                    assert!(run(e, &mine).iter().all(|s| *s == TaskStatus::Completed));
                }
            });
        }
    });
    // Every byte the peer owns: its check.
    let written: Vec<[u64; 2]> = ranges.iter().map(|&(o, l)| [o, l]).collect();
    assert_eq!(
        peer.call(json!({"op": "check", "ranges": written}))["bad"],
        0
    );
    // Every byte we own: READ ranges hold the peer pattern at the peer's
    // indices, gaps are untouched.
    let got = dst.snapshot();
    let mut bad = 0usize;
    let mut k = 0;
    for (i, &b) in got.iter().enumerate() {
        while k < ranges.len() && (ranges[k].0 + ranges[k].1) as usize <= i {
            k += 1;
        }
        let inside = k < ranges.len() && ranges[k].0 as usize <= i;
        let want = if inside {
            pattern_byte(half as usize + i, SEED_PEER)
        } else {
            0
        };
        bad += usize::from(b != want);
    }
    assert_eq!(bad, 0, "bytes wrong in what we read");
    let total: u64 = SIZES.iter().sum();
    let c = counters(&e);
    assert_eq!(
        (c["written"].as_u64(), c["read"].as_u64()),
        (Some(total), Some(total)),
        "{c}"
    );
    assert_eq!(peer.call(json!({"op": "counters"}))["shm"]["served"], total);
    assert_eq!(
        tcp_connections_on(data_port),
        before,
        "a connection reached the peer's data port"
    );
    e.shutdown();
}

#[test]
fn a_peer_killed_mid_batch_ends_every_task_and_another_is_served() {
    const TEST: &str = "a_peer_killed_mid_batch_ends_every_task_and_another_is_served";
    if is_child(TEST) {
        return child_main();
    }
    const LEN: usize = 256 << 20;
    let e = engine();
    let src = Buf::new(LEN, SEED_WRITE);
    register(&e, &src);
    let peer = Peer::start(TEST, LEN, &[]);
    let seg = e.open_segment(&peer.name).expect("open");
    // 64 WRITEs of 4 MiB, and the peer dies while they run.
    let reqs: Vec<Request> = (0..64)
        .map(|i| Request {
            opcode: Opcode::Write,
            source: src.addr() + i * (4 << 20),
            target_id: seg,
            target_offset: peer.addr + i * (4 << 20),
            length: 4 << 20,
        })
        .collect();
    let b = e.allocate_batch(reqs.len()).unwrap();
    e.submit(b, &reqs).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let killed = Instant::now();
    peer.signal(libc::SIGKILL);
    let statuses: Vec<TaskStatus> = (0..reqs.len())
        .map(|i| common::wait_task(&e, b, i, HANG))
        .collect();
    let ended = killed.elapsed();
    e.free_batch(b).unwrap();
    assert!(
        ended < Duration::from_secs(30),
        "every task ended {ended:?} after the kill"
    );
    assert!(
        statuses
            .iter()
            .all(|s| matches!(s, TaskStatus::Completed | TaskStatus::Failed))
    );
    drop(peer);
    // A new peer is served, by shared memory.
    let mut peer = Peer::start(TEST, 1 << 20, &[]);
    let seg = e.open_segment(&peer.name).expect("open");
    let before = counters(&e)["written"].as_u64().unwrap();
    let w = Request {
        opcode: Opcode::Write,
        source: src.addr(),
        target_id: seg,
        target_offset: peer.addr,
        length: 1 << 20,
    };
    assert_eq!(run(&e, &[w]), vec![TaskStatus::Completed]);
    assert_eq!(counters(&e)["written"].as_u64().unwrap() - before, 1 << 20);
    let check = peer.call(json!({"op": "check", "ranges": []}));
    // The peer's buffer now holds our pattern, which is the written seed
    // at the same indices: all of it is "written".
    assert_eq!(check["bad"].as_u64().unwrap(), 1 << 20);
    assert_eq!(
        peer.call(json!({"op": "check", "ranges": [[0, 1 << 20]]}))["bad"],
        0
    );
    e.shutdown();
}

#[test]
fn unregister_during_a_stream_of_writes_returns_at_once_and_nothing_lands_after() {
    const TEST: &str =
        "unregister_during_a_stream_of_writes_returns_at_once_and_nothing_lands_after";
    if is_child(TEST) {
        return child_main();
    }
    const LEN: usize = 64 << 20;
    let e = engine();
    let src = Buf::new(LEN, SEED_WRITE);
    register(&e, &src);
    let mut peer = Peer::start(TEST, LEN, &[]);
    let seg = e.open_segment(&peer.name).expect("open");
    let base = peer.addr;
    let w = |i: u64| Request {
        opcode: Opcode::Write,
        source: src.addr() + i * (1 << 20),
        target_id: seg,
        target_offset: base + i * (1 << 20),
        length: 1 << 20,
    };
    // Attached, by shared memory.
    assert_eq!(run(&e, &[w(0)]), vec![TaskStatus::Completed]);
    // A stream of WRITEs, and the peer unregisters its buffer in the
    // middle of it.
    let b = e.allocate_batch(4096).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (answer, submitted) = std::thread::scope(|s| {
        let streamer = s.spawn(|| {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 4096 {
                if e.submit(b, &[w(i as u64 % 64)]).is_err() {
                    break;
                }
                i += 1;
            }
            i
        });
        std::thread::sleep(Duration::from_millis(50));
        let a = peer.call(json!({"op": "unregister"}));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (a, streamer.join().unwrap())
    });
    assert!(
        answer["ms"].as_u64().unwrap() < 5000,
        "unregister took {answer}"
    );
    let after = answer["digest"].clone();
    // Every task ends; nothing lands in the unregistered buffer later.
    for i in 0..submitted {
        common::wait_task(&e, b, i, HANG);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(peer.call(json!({"op": "digest"}))["digest"], after);
    e.shutdown();
}

#[test]
fn a_peer_of_another_user_is_reached_over_tcp() {
    const TEST: &str = "a_peer_of_another_user_is_reached_over_tcp";
    if is_child(TEST) {
        return child_main();
    }
    // SAFETY: a plain system call.
    if unsafe { libc::geteuid() } != 0 || Command::new("setpriv").arg("--version").output().is_err()
    {
        return common::skip("needs root and setpriv to run the peer as nobody");
    }
    let e = engine();
    let src = Buf::new(4 << 20, SEED_WRITE);
    let dst = Buf::zeroed(4 << 20);
    register(&e, &src);
    register(&e, &dst);
    let mut peer = Peer::start(
        TEST,
        8 << 20,
        &[
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--",
        ],
    );
    let seg = e.open_segment(&peer.name).expect("open");
    let data_port = peer.data_port();
    let reqs = [
        Request {
            opcode: Opcode::Write,
            source: src.addr(),
            target_id: seg,
            target_offset: peer.addr,
            length: 4 << 20,
        },
        Request {
            opcode: Opcode::Read,
            source: dst.addr(),
            target_id: seg,
            target_offset: peer.addr + (4 << 20),
            length: 4 << 20,
        },
    ];
    assert_eq!(run(&e, &reqs), vec![TaskStatus::Completed; 2]);
    assert_eq!(
        peer.call(json!({"op": "check", "ranges": [[0, 4 << 20]]}))["bad"],
        0
    );
    let got = dst.snapshot();
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, &b)| b == pattern_byte((4 << 20) + i, SEED_PEER))
    );
    // The peer cannot read our memory to verify us, so it refuses our
    // ring, and neither direction uses shared memory (although we, as
    // root, could read the peer's memory).
    let c = counters(&e);
    assert_eq!(
        (c["written"].as_u64(), c["read"].as_u64()),
        (Some(0), Some(0)),
        "{c}"
    );
    assert!(
        tcp_connections_on(data_port) > 0,
        "no connection reached the peer's data port"
    );
    e.shutdown();
}

#[test]
fn gpu_memory_goes_over_tcp_beside_shared_memory() {
    const TEST: &str = "gpu_memory_goes_over_tcp_beside_shared_memory";
    const GPU_LEN: usize = (2 << 20) + 3;
    if is_child(TEST) {
        return child_main();
    }
    let e = engine();
    let src = Buf::new(GPU_LEN, SEED_WRITE);
    let dst = Buf::zeroed(GPU_LEN);
    register(&e, &src);
    register(&e, &dst);
    let mut peer = Peer::start(TEST, 1 << 20, &[]);
    let dev = peer.call(json!({"op": "gpu", "len": GPU_LEN}))["addr"]
        .as_u64()
        .unwrap();
    let seg = e.open_segment(&peer.name).expect("open");
    let data_port = peer.data_port();
    let req = |opcode, source, target_offset, length| Request {
        opcode,
        source,
        target_id: seg,
        target_offset,
        length,
    };
    // Out of the peer's GPU buffer, then into it; its host buffer beside.
    let reqs = [
        req(Opcode::Read, dst.addr(), dev, GPU_LEN as u64),
        req(Opcode::Write, src.addr(), peer.addr, 4096),
    ];
    assert_eq!(run(&e, &reqs), vec![TaskStatus::Completed; 2]);
    assert_eq!(dst.snapshot(), pattern(GPU_LEN, SEED_PEER));
    assert_eq!(
        run(&e, &[req(Opcode::Write, src.addr(), dev, GPU_LEN as u64)]),
        vec![TaskStatus::Completed]
    );
    assert_eq!(
        peer.call(json!({"op": "gpu_digest"}))["digest"],
        digest_of(&pattern(GPU_LEN, SEED_WRITE))
    );
    assert_eq!(
        peer.call(json!({"op": "check", "ranges": [[0, 4096]]}))["bad"],
        0
    );
    // The host buffer went by shared memory, the GPU buffer by TCP.
    let c = counters(&e);
    assert_eq!(c["written"].as_u64(), Some(4096), "{c}");
    assert_eq!(c["read"].as_u64(), Some(0), "{c}");
    assert!(
        tcp_connections_on(data_port) > 0,
        "no connection reached the peer's data port"
    );
    e.shutdown();
}

#[test]
fn auto_discovery_installs_shm_beside_tcp_unless_mc_te_shm_is_0() {
    let transports = |shm: &str| {
        let mut config = transfer_engine::Config::default();
        config.engine.force_tcp = true;
        config.shm.auto_install = shm != "0";
        let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
            .auto_discover(true)
            .config(config)
            .build()
            .expect("engine");
        let d = common::descriptor(&e);
        e.shutdown();
        (d["protocol"].clone(), d.get("shm").is_some())
    };
    assert_eq!(transports("1"), (json!("tcp"), true));
    assert_eq!(transports("0"), (json!("tcp"), false));
}

/// A network namespace joined to ours by a veth pair, deleted on drop.
struct Netns {
    name: String,
    veth: String,
}

impl Netns {
    /// `te-shm-<pid>` with 10.78.X.1 here and 10.78.X.2 inside; `None`
    /// (with the reason) where namespaces cannot be made.
    fn new() -> Result<(Netns, String, String), String> {
        // SAFETY: a plain system call.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root for network namespaces".into());
        }
        let pid = std::process::id();
        let x = pid % 200 + 20;
        let ns = Netns {
            name: format!("te-shm-{pid}"),
            veth: format!("tes{pid}"),
        };
        let (here, there) = (format!("10.78.{x}.1"), format!("10.78.{x}.2"));
        let inner = format!("tei{pid}");
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), ns.name.clone()],
            vec![
                "link".into(),
                "add".into(),
                ns.veth.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                inner.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                inner.clone(),
                "netns".into(),
                ns.name.clone(),
            ],
            vec![
                "addr".into(),
                "add".into(),
                format!("{here}/24"),
                "dev".into(),
                ns.veth.clone(),
            ],
            vec!["link".into(), "set".into(), ns.veth.clone(), "up".into()],
            vec![
                "-n".into(),
                ns.name.clone(),
                "addr".into(),
                "add".into(),
                format!("{there}/24"),
                "dev".into(),
                inner.clone(),
            ],
            vec![
                "-n".into(),
                ns.name.clone(),
                "link".into(),
                "set".into(),
                inner,
                "up".into(),
            ],
            vec![
                "-n".into(),
                ns.name.clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
        ];
        for step in steps {
            let out = Command::new("ip")
                .args(&step)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "ip {}: {}",
                    step.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        Ok((ns, here, there))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

#[test]
fn one_batch_reaches_a_peer_here_by_shm_and_one_in_another_namespace_by_tcp() {
    const TEST: &str = "one_batch_reaches_a_peer_here_by_shm_and_one_in_another_namespace_by_tcp";
    if is_child(TEST) {
        return child_main();
    }
    let (ns, here, there) = match Netns::new() {
        Ok(v) => v,
        Err(why) => return common::skip(&why),
    };
    const LEN: usize = 8 << 20;
    // This engine is named by its address on the link, so that its TCP
    // reaches the other namespace.
    let e = Engine::new("P2PHANDSHAKE", &format!("{here}:0"), false).expect("engine");
    e.install_transport("tcp", None).expect("tcp");
    e.install_transport("shm", None).expect("shm");
    let src = Buf::new(LEN, 0);
    src.set(
        0,
        &(0..LEN)
            .map(|i| pattern_byte(i, SEED_WRITE))
            .collect::<Vec<_>>(),
    );
    register(&e, &src);
    let mut near = Peer::start(TEST, LEN, &[]);
    let mut far = Peer::start_on(TEST, LEN, &["ip", "netns", "exec", &ns.name], &there);
    let (a, b) = (
        e.open_segment(&near.name).expect("open near"),
        e.open_segment(&far.name).expect("open far"),
    );
    let far_port = far.data_port();
    let reqs: Vec<Request> = (0..8u64)
        .map(|i| Request {
            opcode: Opcode::Write,
            source: src.addr() + i * (LEN as u64 / 8),
            target_id: if i % 2 == 0 { a } else { b },
            target_offset: if i % 2 == 0 { near.addr } else { far.addr } + i * (LEN as u64 / 8),
            length: LEN as u64 / 8,
        })
        .collect();
    assert_eq!(run(&e, &reqs), vec![TaskStatus::Completed; 8]);
    let ranges = |parity: u64| -> Vec<[u64; 2]> {
        (0..8u64)
            .filter(|i| i % 2 == parity)
            .map(|i| [i * (LEN as u64 / 8), LEN as u64 / 8])
            .collect()
    };
    assert_eq!(
        near.call(json!({"op": "check", "ranges": ranges(0)}))["bad"],
        0
    );
    assert_eq!(
        far.call(json!({"op": "check", "ranges": ranges(1)}))["bad"],
        0
    );
    // The near peer's half went by shared memory, the far one's over its
    // data port.
    assert_eq!(counters(&e)["written"].as_u64(), Some(LEN as u64 / 2));
    assert_eq!(
        near.call(json!({"op": "counters"}))["shm"]["served"],
        LEN as u64 / 2
    );
    assert_eq!(far.call(json!({"op": "counters"}))["shm"]["served"], 0);
    assert!(
        tcp_connections_on(far_port) > 0,
        "no connection of ours reached the far peer's data port"
    );
    e.shutdown();
}

#[test]
fn engines_with_a_cluster_key_attach_by_shm_and_others_are_refused() {
    const TEST: &str = "engines_with_a_cluster_key_attach_by_shm_and_others_are_refused";
    if is_child(TEST) {
        return child_main();
    }
    let dir = std::env::temp_dir().join(format!("te-shm-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ours, theirs) = (dir.join("a.key"), dir.join("b.key"));
    std::fs::write(&ours, "11".repeat(32)).unwrap();
    std::fs::write(&theirs, "22".repeat(32)).unwrap();
    for f in [&ours, &theirs] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let config = transfer_engine::Config::from_env()
        .expect("the MC_* settings")
        .with_auth_key_file(ours.to_str().unwrap());
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .config(config)
        .build()
        .expect("engine");
    e.install_transport("tcp", None).expect("tcp");
    e.install_transport("shm", None).expect("shm");
    let src = Buf::new(1 << 20, 0);
    src.set(
        0,
        &(0..1 << 20)
            .map(|i| pattern_byte(i, SEED_WRITE))
            .collect::<Vec<_>>(),
    );
    register(&e, &src);
    let key_env = |k: &std::path::Path| format!("MC_TE_AUTH_KEY_FILE={}", k.display());
    // The same key: attached by shared memory.
    let same = key_env(&ours);
    let mut peer = Peer::start(TEST, 1 << 20, &["env", &same]);
    let seg = e.open_segment(&peer.name).expect("open");
    let w = Request {
        opcode: Opcode::Write,
        source: src.addr(),
        target_id: seg,
        target_offset: peer.addr,
        length: 1 << 20,
    };
    assert_eq!(run(&e, &[w]), vec![TaskStatus::Completed]);
    assert_eq!(
        peer.call(json!({"op": "check", "ranges": [[0, 1 << 20]]}))["bad"],
        0
    );
    assert_eq!(counters(&e)["written"].as_u64(), Some(1 << 20));
    // Another key: neither its descriptor nor an attach is served.
    let other = key_env(&theirs);
    let stranger = Peer::start(TEST, 1 << 20, &["env", &other]);
    assert!(e.open_segment(&stranger.name).is_err());
    e.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pattern a caller writes into its buffer once its transfer FAILED.
const SEED_REUSED: u8 = 11;

/// Rounds per opcode of each `a_transfer_failed_against_a_stopped_peer_*`
/// test: 2 (`TE_SHM_LATE_ROUNDS` changes it); a WRITE case runs more, up to
/// ten times as many, until one of its WRITEs failed.
fn late_rounds() -> usize {
    std::env::var("TE_SHM_LATE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

// A WRITE or READ of 64 MiB whose peer is stopped mid-copy: slices of
// 64 KiB and of 1 MiB, from caller (heap) and engine (memfd) memory, each
// case its own test (they wait on timeouts, and run side by side).

#[test]
fn a_transfer_failed_against_a_stopped_peer_moves_no_byte_afterwards_64k_caller() {
    late_after_failure_case(
        "a_transfer_failed_against_a_stopped_peer_moves_no_byte_afterwards_64k_caller",
        "65536",
        false,
    );
}

#[test]
fn a_transfer_failed_against_a_stopped_peer_moves_no_byte_afterwards_64k_engine() {
    late_after_failure_case(
        "a_transfer_failed_against_a_stopped_peer_moves_no_byte_afterwards_64k_engine",
        "65536",
        true,
    );
}

#[test]
fn a_transfer_failed_against_a_stopped_peer_moves_no_byte_afterwards_1m_caller() {
    late_after_failure_case(
        "a_transfer_failed_against_a_stopped_peer_moves_no_byte_afterwards_1m_caller",
        "1048576",
        false,
    );
}

#[test]
fn a_transfer_failed_against_a_stopped_peer_moves_no_byte_afterwards_1m_engine() {
    late_after_failure_case(
        "a_transfer_failed_against_a_stopped_peer_moves_no_byte_afterwards_1m_engine",
        "1048576",
        true,
    );
}

/// One case of the tests above: `TEST` names the test (its child is the
/// peer), `slice` is the slice size (`MC_SHM_SLICE_SIZE`, and
/// `MC_SLICE_SIZE` for the network transport a WRITE withdrawn from a
/// stopped peer goes to), and `engine_memory` picks the
/// initiator's buffer: the engine's own (memfd) or the caller's heap.
fn late_after_failure_case(test: &str, slice: &str, engine_memory: bool) {
    if is_child(test) {
        return child_main();
    }
    const LEN: usize = 64 << 20;
    let mut peer = Peer::start(test, LEN, &[]);
    let cfg = Config::from_lookup(|k| match k {
        "MC_SHM_TIMEOUT_SEC" => Some("1".into()),
        "MC_TCP_MIN_RATE_WINDOW_SEC" => Some("1".into()),
        "MC_SHM_SLICE_SIZE" | "MC_SLICE_SIZE" => Some(slice.into()),
        _ => None,
    });
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .auto_discover(true)
        .config(cfg)
        .build()
        .expect("engine");
    let seg = e.open_segment(&peer.name).expect("open");
    let heap = Buf::zeroed(LEN);
    let mine = if engine_memory {
        e.allocate_buffer(LEN)
            .expect("the engine allocates memory")
            .expect("allocate")
    } else {
        heap.addr()
    };
    e.register(&[Region {
        addr: mine,
        length: LEN as u64,
        location: Location::Any,
        remote_accessible: true,
    }])
    .expect("register");
    let fill = |seed: u8| {
        // SAFETY: our registered buffer, which no transfer uses
        // now (between rounds, or after its task ended).
        let b = unsafe { std::slice::from_raw_parts_mut(mine as *mut u8, LEN) };
        b.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = pattern_byte(i, seed));
    };
    let holds = |seed: u8| {
        // SAFETY: as above.
        let b = unsafe { std::slice::from_raw_parts(mine as *const u8, LEN) };
        b.iter()
            .enumerate()
            .filter(|&(i, x)| *x != pattern_byte(i, seed))
            .count()
    };
    for opcode in [Opcode::Write, Opcode::Read] {
        let mut seen: Vec<(TaskStatus, bool)> = Vec::new();
        // A WRITE case goes on past its rounds (up to ten times as many)
        // until a stop came mid-copy, which a loaded host makes rarer.
        for round in 1..=late_rounds() * 10 {
            let failed_once = seen.iter().any(|&(s, _)| s == TaskStatus::Failed);
            if round > late_rounds() && (opcode == Opcode::Read || failed_once) {
                break;
            }
            fill(if opcode == Opcode::Write {
                SEED_WRITE
            } else {
                0
            });
            let written = |e: &Engine| {
                let c = counters(e);
                c["written"].as_u64().unwrap() + c["read"].as_u64().unwrap()
            };
            let before = written(&e);
            let b = e.allocate_batch(1).unwrap();
            e.submit(
                b,
                &[Request {
                    opcode,
                    source: mine,
                    target_id: seg,
                    target_offset: peer.addr,
                    length: LEN as u64,
                }],
            )
            .unwrap();
            let start = Instant::now();
            while written(&e) == before {
                assert!(start.elapsed() < HANG, "nothing moves");
                std::hint::spin_loop();
            }
            peer.signal(libc::SIGSTOP);
            common::proc::wait_stopped(peer.pid);
            // A slice the peer is copying is waited for: the task
            // may end only once it resumes. The others fail after
            // MC_SHM_TIMEOUT_SEC, fall back to TCP and fail there
            // after MC_TCP_MIN_RATE_WINDOW_SEC.
            let mut stopped = true;
            let status = loop {
                let (s, _) = e.status(b, 0).unwrap();
                if matches!(s, TaskStatus::Completed | TaskStatus::Failed) {
                    break s;
                }
                if stopped && start.elapsed() > Duration::from_secs(4) {
                    peer.signal(libc::SIGCONT);
                    stopped = false;
                }
                assert!(start.elapsed() < HANG, "the task never ends");
                std::thread::sleep(Duration::from_millis(1));
            };
            e.free_batch(b).unwrap();
            if status == TaskStatus::Failed {
                fill(SEED_REUSED);
            }
            if stopped {
                peer.signal(libc::SIGCONT);
            }
            // Whatever the peer still had to do, it has done it.
            let mut last = peer.call(json!({"op": "digest"}));
            loop {
                std::thread::sleep(Duration::from_millis(300));
                let now = peer.call(json!({"op": "digest"}));
                if now == last {
                    break;
                }
                last = now;
            }
            seen.push((status, stopped));
            match (opcode, status) {
                (Opcode::Write, TaskStatus::Failed) => assert_eq!(
                    peer.call(json!({"op": "late", "seed": SEED_REUSED}))["late"],
                    0,
                    "bytes written after FAILED reached the peer"
                ),
                (Opcode::Write, _) => assert_eq!(
                    peer.call(json!({"op": "check", "ranges": [[0, LEN]]}))["bad"],
                    0
                ),
                (Opcode::Read, TaskStatus::Failed) => {
                    assert_eq!(holds(SEED_REUSED), 0, "a READ wrote after FAILED")
                }
                (Opcode::Read, _) => assert_eq!(holds(SEED_PEER), 0),
            }
            if opcode == Opcode::Write {
                // The peer's buffer back to its pattern, as the
                // next round expects.
                fill(SEED_PEER);
                let back = Request {
                    opcode: Opcode::Write,
                    source: mine,
                    target_id: seg,
                    target_offset: peer.addr,
                    length: LEN as u64,
                };
                assert_eq!(run(&e, &[back]), vec![TaskStatus::Completed]);
            }
        }
        println!(
            "{opcode:?}, slices of {slice} B, {} memory: (status, the peer was still \
             stopped when it ended) {seen:?}",
            if engine_memory { "engine" } else { "caller" }
        );
        if opcode == Opcode::Write {
            assert!(
                seen.iter().any(|(s, _)| *s == TaskStatus::Failed),
                "no WRITE failed: the stop never came mid-copy"
            );
        }
    }
    e.unregister(&[mine]).expect("unregister");
    if engine_memory {
        e.free_buffer(mine).expect("free");
    }
    e.shutdown();
}

/// An engine of this process with `tcp` and `shm`, on `conn` as `name`.
fn engine_on(conn: &str, name: &str) -> Arc<Engine> {
    let e = Engine::new(conn, name, false).expect("engine");
    e.install_transport("tcp", None).expect("tcp");
    e.install_transport("shm", None).expect("shm");
    e
}

/// A WRITE of a fresh buffer's length from `source` to `addr` of `seg`.
fn write(source: u64, seg: i32, addr: u64) -> Request {
    Request {
        opcode: Opcode::Write,
        source,
        target_id: seg,
        target_offset: addr,
        length: FRESH_LEN as u64,
    }
}

/// Submits one request as a batch of one and returns the batch.
fn submit_one(e: &Engine, r: Request) -> u64 {
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[r]).unwrap();
    b
}

/// The status of the only task of batch `b` once it is terminal (the
/// batch is freed).
fn finish(e: &Engine, b: u64) -> TaskStatus {
    let s = common::wait_task(e, b, 0, HANG);
    e.free_batch(b).unwrap();
    s
}

/// The registration pattern of consumers over shared memory, on P2P and
/// HTTP metadata: the peer registers a new buffer and says so on its
/// control channel, and this process WRITEs to it and READs it back at
/// once, before its cached descriptor lists the buffer; 1,000 rounds, then
/// a peer that registers a buffer every 10 ms while this process writes to
/// each as soon as it hears of it. No task fails, shared memory carries
/// every byte, and both sides check every byte.
#[test]
fn buffers_registered_a_moment_ago_are_reachable_over_shm() {
    const TEST: &str = "buffers_registered_a_moment_ago_are_reachable_over_shm";
    const LEN: usize = FRESH_LEN;
    const ROUNDS: usize = 1000;
    const EVERY: usize = 200;
    if is_child(TEST) {
        return child_main();
    }
    let server =
        transfer_engine::metadata::server::MetadataServer::start("127.0.0.1:0", "/metadata", None)
            .unwrap();
    for (conn, names) in [
        ("P2PHANDSHAKE".to_string(), ["127.0.0.1:0", "127.0.0.1:0"]),
        (server.url(), ["shm-fresh-target", "shm-fresh-initiator"]),
    ] {
        let conn_env = format!("{CONN_VAR}={conn}");
        let name_env = format!("{NAME_VAR}={}", names[0]);
        let mut peer = Peer::start(TEST, 4096, &["env", &conn_env, &name_env]);
        let e = engine_on(&conn, names[1]);
        let src = Buf::zeroed((ROUNDS + EVERY) * LEN);
        let back = Buf::zeroed((ROUNDS + EVERY) * LEN);
        for i in 0..ROUNDS + EVERY {
            src.set(i * LEN, &fresh_data(LEN, i));
        }
        register(&e, &src);
        register(&e, &back);
        let seg = e.open_segment(&peer.segment).expect("open");
        let fetches = e.descriptor_fetches();
        let t0 = Instant::now();
        let mut failed = 0;
        let at = |b: &Buf, i: usize| b.addr() + (i * LEN) as u64;
        for i in 0..ROUNDS {
            let addr = peer.call(json!({"op": "fresh", "len": LEN}))["addr"]
                .as_u64()
                .unwrap();
            let w = write(at(&src, i), seg, addr);
            if finish(&e, submit_one(&e, w)) != TaskStatus::Completed {
                failed += 1;
            }
            let r = Request {
                opcode: Opcode::Read,
                source: at(&back, i),
                ..w
            };
            match finish(&e, submit_one(&e, r)) {
                TaskStatus::Completed => assert!(
                    back.get(i * LEN, LEN) == fresh_data(LEN, i),
                    "round {i}: the READ brought back other bytes than were written"
                ),
                _ => failed += 1,
            }
        }
        let took = t0.elapsed();
        let rounds_fetches = e.descriptor_fetches() - fetches;
        println!(
            "register, announce, WRITE and READ at once over shm ({conn}): {ROUNDS} rounds: \
             {failed} of {} tasks FAILED, {took:.2?}, {rounds_fetches} descriptor fetches",
            2 * ROUNDS
        );
        assert_eq!(failed, 0, "tasks FAILED");
        // A buffer every 10 ms, each written as soon as it is announced
        // (earlier ones may be in flight), then read back.
        let fetches = e.descriptor_fetches();
        let t0 = Instant::now();
        let announced = std::sync::Mutex::new(std::collections::VecDeque::<u64>::new());
        std::thread::scope(|s| {
            let (peer, announced) = (&mut peer, &announced);
            s.spawn(move || {
                let cmd = json!({"op": "every", "len": LEN, "count": EVERY, "ms": 10});
                writeln!(peer.stdin, "{cmd}").unwrap();
                peer.stdin.flush().unwrap();
                while let Some(addr) = peer.read()["fresh"].as_u64() {
                    announced.lock().unwrap().push_back(addr);
                }
            });
            // (index, batch, is the READ) of every task in flight.
            let mut flying: Vec<(usize, u64, bool)> = Vec::new();
            let mut addrs: Vec<u64> = Vec::new();
            let mut done = 0;
            let deadline = Instant::now() + HANG;
            while done < EVERY {
                assert!(Instant::now() < deadline, "the run hangs");
                while let Some(addr) = announced.lock().unwrap().pop_front() {
                    let i = ROUNDS + addrs.len();
                    addrs.push(addr);
                    flying.push((i, submit_one(&e, write(at(&src, i), seg, addr)), false));
                }
                let mut still = Vec::new();
                for (i, b, read) in flying.drain(..) {
                    let (status, _) = e.status(b, 0).unwrap();
                    if status == TaskStatus::Waiting {
                        still.push((i, b, read));
                        continue;
                    }
                    e.free_batch(b).unwrap();
                    if status != TaskStatus::Completed {
                        failed += 1;
                    }
                    if !read {
                        let r = Request {
                            opcode: Opcode::Read,
                            source: at(&back, i),
                            ..write(0, seg, addrs[i - ROUNDS])
                        };
                        still.push((i, submit_one(&e, r), true));
                        continue;
                    }
                    if status == TaskStatus::Completed {
                        assert!(
                            back.get(i * LEN, LEN) == fresh_data(LEN, i),
                            "buffer {i}: the READ brought back other bytes than were written"
                        );
                    }
                    done += 1;
                }
                flying = still;
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        println!(
            "a buffer every 10 ms over shm ({conn}): {EVERY} buffers: {failed} of {} tasks \
             FAILED, {:.2?}, {} descriptor fetches",
            2 * EVERY,
            t0.elapsed(),
            e.descriptor_fetches() - fetches
        );
        assert_eq!(failed, 0, "tasks FAILED");
        // The peer finds what was written in every buffer, and shared
        // memory carried it all.
        assert_eq!(peer.call(json!({"op": "check_fresh"}))["bad"], 0);
        let moved = ((ROUNDS + EVERY) * LEN) as u64;
        assert_eq!(counters(&e)["written"].as_u64(), Some(moved));
        assert_eq!(counters(&e)["read"].as_u64(), Some(moved));
        // One attachment (one ring at the peer) served the 1,200
        // descriptors the peer's registrations made.
        assert_eq!(counters(&e)["attached"].as_u64(), Some(1));
        e.shutdown();
    }
    server.shutdown();
}

/// The bytes a test's log subscriber wrote.
#[derive(Clone, Default)]
struct LogSink(Arc<std::sync::Mutex<Vec<u8>>>);

impl Write for LogSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn opening_a_peer_here_says_shared_memory_carries_its_data() {
    const TEST: &str = "opening_a_peer_here_says_shared_memory_carries_its_data";
    if is_child(TEST) {
        return child_main();
    }
    let peer = Peer::start(TEST, 4096, &[]);
    let e = engine();
    let log = logged(|| {
        e.open_segment(&peer.name).expect("open");
    });
    assert!(
        log.contains("its data goes by shm, else tcp"),
        "the log does not say how the data goes: {log}"
    );
    e.shutdown();
}

/// `len` bytes of anonymous memory, advised into huge pages or kept out
/// of them before they are touched, then touched.
fn advised(len: usize, huge: bool) -> Mapping {
    let m = Mapping::new(len);
    let advice = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: the range is the mapping just made, which nothing uses yet.
    let rc = unsafe { libc::madvise(m.addr.cast(), len, advice) };
    assert_eq!(rc, 0, "madvise");
    m.fill(1);
    m
}

fn region_of(m: &Mapping) -> Region {
    Region {
        addr: m.addr as u64,
        length: m.len as u64,
        location: Location::Any,
        remote_accessible: true,
    }
}

/// What the engine logged on this thread while `f` ran.
fn logged(f: impl FnOnce()) -> String {
    let sink = LogSink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
}

#[test]
fn a_large_buffer_in_small_pages_is_reported_once_and_one_in_huge_pages_not() {
    const SAID: &str = "is in 4 KiB pages";
    let e = engine();
    let small = [advised(64 << 20, false), advised(64 << 20, false)];
    let log = logged(|| {
        for b in &small {
            e.register(&[region_of(b)]).expect("register");
        }
    });
    assert_eq!(log.matches(SAID).count(), 1, "once per engine: {log}");
    assert!(log.contains("MADV_HUGEPAGE"), "the way out is named: {log}");
    for b in &small {
        e.unregister(&[b.addr as u64]).expect("unregister");
    }
    e.shutdown();

    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
    if !thp.is_ok_and(|m| m.contains("[madvise]") || m.contains("[always]")) {
        eprintln!("no transparent huge pages on request here: the huge half is not run");
        return;
    }
    let e = engine();
    let huge = advised(64 << 20, true);
    let log = logged(|| e.register(&[region_of(&huge)]).expect("register"));
    assert!(
        !log.contains(SAID),
        "memory in huge pages is not reported: {log}"
    );
    e.unregister(&[huge.addr as u64]).expect("unregister");
    e.shutdown();
}

// Cancelling transfers to a peer of this host: a 64 MiB WRITE and READ
// cancelled at random points, 20 rounds each (5 with `CI=true`), from
// caller and from engine memory; once the cancel returns DONE the caller refills its buffer at
// once, and no byte of the refill reaches the peer (WRITE) nor does any
// byte land in it (READ). A peer stopped while it copies a WRITE holds
// the cancel PENDING until it runs again, by shared memory and by TCP.

#[test]
fn a_transfer_cancelled_at_random_points_moves_no_byte_afterwards_caller() {
    cancel_case(
        "a_transfer_cancelled_at_random_points_moves_no_byte_afterwards_caller",
        false,
    );
}

#[test]
fn a_transfer_cancelled_at_random_points_moves_no_byte_afterwards_engine() {
    cancel_case(
        "a_transfer_cancelled_at_random_points_moves_no_byte_afterwards_engine",
        true,
    );
}

/// The p-th percentile of `v` (sorted here).
fn percentile(v: &mut [Duration], p: usize) -> Duration {
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)]
}

/// An initiator with shared memory and TCP (auto discovery), and its
/// 64 MiB buffer: the engine's own (memfd) or the caller's heap (`heap`).
fn cancel_initiator(engine_memory: bool, heap: &Buf, extra: &[(&str, &str)]) -> (Arc<Engine>, u64) {
    let set: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cfg = Config::from_lookup(|k| set.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()));
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .auto_discover(true)
        .config(cfg)
        .build()
        .expect("engine");
    let mine = if engine_memory {
        e.allocate_buffer(heap.len())
            .expect("the engine allocates memory")
            .expect("allocate")
    } else {
        heap.addr()
    };
    e.register(&[Region {
        addr: mine,
        length: heap.len() as u64,
        location: Location::Any,
        remote_accessible: true,
    }])
    .expect("register");
    (e, mine)
}

/// Sets `len` bytes at `addr` to pattern `seed`.
fn fill_at(addr: u64, len: usize, seed: u8) {
    // SAFETY: the test's registered buffer, which no transfer uses now
    // (its task ended, or none was submitted).
    let b = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
    b.iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = pattern_byte(i, seed));
}

/// How many of `len` bytes at `addr` differ from pattern `seed`.
fn differing(addr: u64, len: usize, seed: u8) -> usize {
    // SAFETY: as in `fill_at`.
    let b = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
    b.iter()
        .enumerate()
        .filter(|&(i, x)| *x != pattern_byte(i, seed))
        .count()
}

fn cancel_case(test: &str, engine_memory: bool) {
    if is_child(test) {
        return child_main();
    }
    const LEN: usize = 64 << 20;
    // Each round checks 64 MiB on both sides in a debug build: CI runs 5.
    let rounds = if std::env::var("CI").is_ok_and(|v| v == "true") {
        5
    } else {
        20
    };
    let mut peer = Peer::start(test, LEN, &[]);
    let heap = Buf::zeroed(LEN);
    let (e, mine) = cancel_initiator(engine_memory, &heap, &[]);
    let seg = e.open_segment(&peer.name).expect("open");
    let target = peer.addr;
    let req = |opcode| Request {
        opcode,
        source: mine,
        target_id: seg,
        target_offset: target,
        length: LEN as u64,
    };
    let memory = if engine_memory { "engine" } else { "caller" };
    for opcode in [Opcode::Write, Opcode::Read] {
        // A whole transfer once attached sets the range of the delays:
        // within its first half, most cancels come mid-transfer.
        fill_at(mine, LEN, SEED_WRITE);
        let mut whole = Duration::ZERO;
        for _ in 0..2 {
            let start = Instant::now();
            assert_eq!(run(&e, &[req(opcode)]), vec![TaskStatus::Completed]);
            whole = start.elapsed() / 2;
        }
        let mut rng = common::Rng::new(0x5EED ^ opcode as u64);
        let (mut latencies, mut canceled) = (Vec::new(), 0);
        for _ in 0..rounds {
            fill_at(mine, LEN, SEED_WRITE);
            let b = submit_one(&e, req(opcode));
            std::thread::sleep(whole.mul_f64((rng.next() % 1000) as f64 / 1000.0));
            let t = Instant::now();
            let outcome = e.cancel_batch(b, HANG).expect("cancel");
            latencies.push(t.elapsed());
            assert_eq!(outcome, transfer_engine::CancelOutcome::Done);
            fill_at(mine, LEN, SEED_REUSED);
            let (status, _) = e.status(b, 0).unwrap();
            assert!(
                matches!(status, TaskStatus::Canceled | TaskStatus::Completed),
                "{status:?}"
            );
            canceled += usize::from(status == TaskStatus::Canceled);
            e.free_batch(b).expect("a cancelled batch can be freed");
            let before = peer.call(json!({"op": "digest"}));
            std::thread::sleep(Duration::from_millis(100));
            match opcode {
                Opcode::Write => {
                    assert_eq!(
                        peer.call(json!({"op": "digest"})),
                        before,
                        "the peer's buffer changed after the cancel returned"
                    );
                    assert_eq!(
                        peer.call(json!({"op": "late", "seed": SEED_REUSED}))["late"],
                        0,
                        "bytes read after the cancel reached the peer"
                    );
                }
                Opcode::Read => assert_eq!(
                    differing(mine, LEN, SEED_REUSED),
                    0,
                    "a READ wrote the local buffer after the cancel returned"
                ),
            }
        }
        println!(
            "{opcode:?} by shm, {memory} memory: {canceled} of {rounds} cancelled mid-transfer \
             (delays within {whole:?}, half a whole transfer); cancel took p50 {:?}, p99 {:?}",
            percentile(&mut latencies, 50),
            percentile(&mut latencies, 99)
        );
        assert!(canceled > 0, "every transfer ended before its cancel");
    }
    e.unregister(&[mine]).expect("unregister");
    if engine_memory {
        e.free_buffer(mine).expect("free");
    }
    e.shutdown();
}

#[test]
fn a_cancel_waits_for_a_stopped_peer_copying_a_write_by_shm() {
    cancel_pending_case(
        "a_cancel_waits_for_a_stopped_peer_copying_a_write_by_shm",
        true,
    );
}

#[test]
fn a_cancel_waits_for_a_stopped_peer_taking_a_write_by_tcp() {
    cancel_pending_case(
        "a_cancel_waits_for_a_stopped_peer_taking_a_write_by_tcp",
        false,
    );
}

/// A 64 MiB WRITE to a peer that is stopped (SIGSTOP) once bytes move:
/// cancelling it with a short bound returns PENDING while the peer holds
/// a slice (shared memory: an entry it is copying; TCP: a WRITE partly
/// sent), and DONE once the peer runs again; after DONE, no byte of the
/// refilled source reaches the peer.
fn cancel_pending_case(test: &str, shm: bool) {
    if is_child(test) {
        return child_main();
    }
    const LEN: usize = 64 << 20;
    const TRIES: usize = 20;
    let mut peer = Peer::start(test, LEN, &[]);
    let heap = Buf::zeroed(LEN);
    let (e, mine) = if shm {
        cancel_initiator(false, &heap, &[("MC_SHM_SLICE_SIZE", "1048576")])
    } else {
        let e = Engine::new("P2PHANDSHAKE", "127.0.0.1:0", false).expect("engine");
        e.install_transport("tcp", None).expect("tcp");
        register(&e, &heap);
        (e, heap.addr())
    };
    let seg = e.open_segment(&peer.name).expect("open");
    let way = if shm { "shm" } else { "tcp" };
    let write = Request {
        opcode: Opcode::Write,
        source: mine,
        target_id: seg,
        target_offset: peer.addr,
        length: LEN as u64,
    };
    // The peer is stopped at a random moment within a whole transfer.
    fill_at(mine, LEN, SEED_WRITE);
    let start = Instant::now();
    assert_eq!(run(&e, &[write]), vec![TaskStatus::Completed]);
    let whole = start.elapsed();
    let mut rng = common::Rng::new(0x5709 ^ u64::from(shm));
    for attempt in 1..=TRIES {
        fill_at(mine, LEN, SEED_WRITE);
        let b = submit_one(&e, write);
        std::thread::sleep(whole.mul_f64((rng.next() % 900) as f64 / 1000.0));
        peer.signal(libc::SIGSTOP);
        let t = Instant::now();
        let first = e
            .cancel_batch(b, Duration::from_millis(300))
            .expect("cancel");
        let waited = t.elapsed();
        let (status, _) = e.status(b, 0).unwrap();
        peer.signal(libc::SIGCONT);
        if first == transfer_engine::CancelOutcome::Done {
            // The stop came between two slices: nothing was held.
            assert_ne!(status, TaskStatus::Waiting);
            e.free_batch(b).expect("free");
            continue;
        }
        assert!(
            waited >= Duration::from_millis(300),
            "PENDING before the bound"
        );
        assert_eq!(status, TaskStatus::Waiting, "a held task has not ended");
        let t = Instant::now();
        assert_eq!(
            e.cancel_batch(b, HANG).expect("cancel"),
            transfer_engine::CancelOutcome::Done
        );
        let resumed = t.elapsed();
        fill_at(mine, LEN, SEED_REUSED);
        e.free_batch(b).expect("a cancelled batch can be freed");
        let before = peer.call(json!({"op": "digest"}));
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(peer.call(json!({"op": "digest"})), before);
        assert_eq!(
            peer.call(json!({"op": "late", "seed": SEED_REUSED}))["late"],
            0,
            "bytes read after the cancel reached the peer"
        );
        println!(
            "{way}: PENDING after {waited:?} with the peer stopped (attempt {attempt}), DONE \
             {resumed:?} after it resumed"
        );
        e.shutdown();
        return;
    }
    panic!("{way}: the peer never held a slice when it was stopped, in {TRIES} tries");
}

/// An engine of this process with `tcp` and `shm`, and
/// `MC_TE_REQUIRE_TRANSPORT=pins`.
fn pinned_engine(pins: &str) -> Arc<Engine> {
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .config(common::config_with(&[("MC_TE_REQUIRE_TRANSPORT", pins)]))
        .build()
        .expect("engine");
    e.install_transport("tcp", None).expect("tcp");
    e.install_transport("shm", None).expect("shm");
    e
}

/// Runs `r` as a batch of one: its status and why it failed (empty when
/// it did not).
fn run_one(e: &Engine, r: Request) -> (TaskStatus, String) {
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &[r]).unwrap();
    let s = common::wait_task(e, b, 0, HANG);
    let why = e.failure_reason(b, 0).unwrap().unwrap_or_default();
    e.free_batch(b).unwrap();
    (s, why)
}

/// A request of `len` bytes between `local` and `remote` of `seg`.
fn request(opcode: Opcode, local: u64, seg: i32, remote: u64, len: u64) -> Request {
    Request {
        opcode,
        source: local,
        target_id: seg,
        target_offset: remote,
        length: len,
    }
}

#[test]
fn pinned_to_shm_a_peer_without_shm_fails_at_submit_and_one_with_shm_is_served() {
    const TEST: &str =
        "pinned_to_shm_a_peer_without_shm_fails_at_submit_and_one_with_shm_is_served";
    const LEN: u64 = (2 << 20) + 5;
    if is_child(TEST) {
        return child_main();
    }
    let e = pinned_engine("shm");
    let src = Buf::new(LEN as usize, SEED_WRITE);
    let dst = Buf::zeroed(LEN as usize);
    register(&e, &src);
    register(&e, &dst);
    let mut plain = Peer::start_with(TEST, 4 << 20, &[], &[(TCP_ONLY_VAR, "1")]);
    let seg = e.open_segment(&plain.name).expect("open");
    for opcode in [Opcode::Write, Opcode::Read] {
        let local = if opcode == Opcode::Write {
            src.addr()
        } else {
            dst.addr()
        };
        let (status, why) = run_one(&e, request(opcode, local, seg, plain.addr, LEN));
        assert_eq!(status, TaskStatus::Failed, "{opcode:?}");
        assert!(
            why.contains(&format!(
                "MC_TE_REQUIRE_TRANSPORT=shm: segment {:?} is reached only by tcp here",
                plain.name
            )),
            "{why}"
        );
    }
    assert_eq!(plain.call(json!({"op": "check", "ranges": []}))["bad"], 0);
    assert!(dst.snapshot().iter().all(|&b| b == 0), "a byte came back");
    let err = e.segment_transport(seg).unwrap_err();
    assert!(
        err.to_string().contains("MC_TE_REQUIRE_TRANSPORT=shm"),
        "{err}"
    );
    // Unset, the same requests go over TCP.
    let free = engine();
    register(&free, &src);
    let seg_free = free.open_segment(&plain.name).expect("open");
    let write = request(Opcode::Write, src.addr(), seg_free, plain.addr, LEN);
    assert_eq!(run_one(&free, write).0, TaskStatus::Completed);
    assert_eq!(
        plain.call(json!({"op": "check", "ranges": [[0, LEN]]}))["bad"],
        0
    );
    assert_eq!(free.segment_transport(seg_free).unwrap(), "tcp");
    free.shutdown();
    // A peer with shared memory is served by it, both ways.
    let mut here = Peer::start(TEST, 4 << 20, &[]);
    let seg = e.open_segment(&here.name).expect("open");
    assert_eq!(
        e.segment_transport(seg).unwrap(),
        "shm",
        "before any request"
    );
    let write = request(Opcode::Write, src.addr(), seg, here.addr, LEN);
    assert_eq!(run_one(&e, write), (TaskStatus::Completed, String::new()));
    let read = request(Opcode::Read, dst.addr(), seg, here.addr, LEN);
    assert_eq!(run_one(&e, read), (TaskStatus::Completed, String::new()));
    assert_eq!(
        here.call(json!({"op": "check", "ranges": [[0, LEN]]}))["bad"],
        0
    );
    assert_eq!(dst.snapshot(), pattern(LEN as usize, SEED_WRITE));
    let c = counters(&e);
    assert_eq!(
        (c["written"].as_u64(), c["read"].as_u64()),
        (Some(LEN), Some(LEN)),
        "{c}"
    );
    assert_eq!(e.segment_transport(seg).unwrap(), "shm");
    e.shutdown();
}

/// Everything logged in this process, on every thread, from the first
/// call on (the process's global subscriber).
fn global_log() -> Arc<std::sync::Mutex<Vec<u8>>> {
    static LOG: std::sync::OnceLock<Arc<std::sync::Mutex<Vec<u8>>>> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let sink = LogSink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");
        sink.0.clone()
    })
    .clone()
}

#[test]
fn shared_memory_the_kernel_refuses_goes_over_tcp_unless_pinned_and_the_change_is_logged_once() {
    const TEST: &str = "shared_memory_the_kernel_refuses_goes_over_tcp_unless_pinned_and_the_change_is_logged_once";
    const LEN: u64 = 1 << 20;
    const ROUNDS: u64 = 3;
    if is_child(TEST) {
        return child_main();
    }
    // SAFETY: a plain system call.
    if unsafe { libc::geteuid() } != 0 || Command::new("setpriv").arg("--version").output().is_err()
    {
        return common::skip("needs root and setpriv to run the peer as nobody");
    }
    let log = global_log();
    let mut peer = Peer::start(
        TEST,
        8 << 20,
        &[
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--",
        ],
    );
    let data_port = peer.data_port();
    // Pinned to shared memory: the attach is refused, and the parts shared
    // memory hands on fail instead of going over TCP.
    let pinned = pinned_engine("shm");
    let src = Buf::new((ROUNDS * LEN) as usize, SEED_WRITE);
    let dst = Buf::zeroed(LEN as usize);
    register(&pinned, &src);
    register(&pinned, &dst);
    let seg = pinned.open_segment(&peer.name).expect("open");
    let beyond = peer.addr + ROUNDS * LEN;
    for (opcode, local) in [(Opcode::Write, src.addr()), (Opcode::Read, dst.addr())] {
        let (status, why) = run_one(&pinned, request(opcode, local, seg, beyond, LEN));
        assert_eq!(status, TaskStatus::Failed, "{opcode:?}");
        assert!(
            why.contains("MC_TE_REQUIRE_TRANSPORT=shm: shm could not move")
                && why.contains("tcp (which would have carried them) is not allowed"),
            "{why}"
        );
    }
    assert_eq!(pinned.segment_transport(seg).unwrap(), "shm");
    assert_eq!(tcp_connections_on(data_port), 0, "a connection reached TCP");
    assert!(dst.snapshot().iter().all(|&b| b == 0), "a byte came back");
    assert_eq!(peer.call(json!({"op": "check", "ranges": []}))["bad"], 0);
    pinned.shutdown();
    // Unset: TCP carries every request, and the segment's transport says
    // so from the first fallback on, logged once.
    let e = engine();
    register(&e, &src);
    register(&e, &dst);
    let seg = e.open_segment(&peer.name).expect("open");
    assert_eq!(
        e.segment_transport(seg).unwrap(),
        "shm",
        "before any request"
    );
    for k in 0..ROUNDS {
        let write = request(
            Opcode::Write,
            src.addr() + k * LEN,
            seg,
            peer.addr + k * LEN,
            LEN,
        );
        assert_eq!(run_one(&e, write), (TaskStatus::Completed, String::new()));
        assert_eq!(e.segment_transport(seg).unwrap(), "tcp", "round {k}");
    }
    let read = request(Opcode::Read, dst.addr(), seg, peer.addr, LEN);
    assert_eq!(run_one(&e, read), (TaskStatus::Completed, String::new()));
    assert_eq!(dst.snapshot(), src.get(0, LEN as usize));
    assert_eq!(
        peer.call(json!({"op": "check", "ranges": [[0, ROUNDS * LEN]]}))["bad"],
        0
    );
    assert!(tcp_connections_on(data_port) > 0, "TCP carried nothing");
    let text = String::from_utf8(log.lock().unwrap().clone()).unwrap();
    let said = format!(
        "segment {:?}: its data goes by tcp now, not shm: shm could not move part of a request",
        peer.name
    );
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(&said)).collect();
    assert_eq!(lines.len(), 1, "{said:?} not logged once: {text}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    e.shutdown();
}

/// The value of the sample `name{labels}` in a metrics text.
fn metric(text: &str, name: &str, labels: &str) -> u64 {
    let prefix = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {prefix}in:\n{text}")) as u64
}

#[test]
fn the_metrics_count_exactly_what_shared_memory_moved() {
    const TEST: &str = "the_metrics_count_exactly_what_shared_memory_moved";
    if is_child(TEST) {
        return child_main();
    }
    const LEN: usize = 4 << 20;
    let peer = Peer::start(TEST, LEN, &[]);
    let e = engine();
    let local = Buf::new(LEN, SEED_WRITE);
    register(&e, &local);
    let seg = e.open_segment(&peer.name).expect("open");
    let (writes, reads) = ([4096u64, 65536, 1 << 20], [8192u64, 3 << 20]);
    let mut reqs: Vec<Request> = writes
        .iter()
        .map(|&n| Request {
            opcode: Opcode::Write,
            source: local.addr(),
            target_id: seg,
            target_offset: peer.addr,
            length: n,
        })
        .collect();
    reqs.extend(reads.iter().map(|&n| Request {
        opcode: Opcode::Read,
        source: local.addr(),
        target_id: seg,
        target_offset: peer.addr,
        length: n,
    }));
    for r in &reqs {
        assert_eq!(
            run(&e, std::slice::from_ref(r)),
            vec![TaskStatus::Completed]
        );
    }
    // A task's end is counted by the thread finishing its last slice, a
    // moment after the caller saw it.
    let deadline = Instant::now() + HANG;
    let text = loop {
        let t = e.metrics_text();
        if metric(&t, "transfer_engine_inflight_tasks", "") == 0 {
            break t;
        }
        assert!(Instant::now() < deadline, "tasks still in flight:\n{t}");
        std::thread::sleep(Duration::from_millis(1));
    };
    let sum = |v: &[u64]| v.iter().sum::<u64>();
    assert_eq!(
        metric(
            &text,
            "transfer_engine_transferred_bytes_total",
            "transport=\"shm\",op=\"write\""
        ),
        sum(&writes)
    );
    assert_eq!(
        metric(
            &text,
            "transfer_engine_transferred_bytes_total",
            "transport=\"shm\",op=\"read\""
        ),
        sum(&reads)
    );
    assert_eq!(
        metric(
            &text,
            "transfer_engine_transferred_bytes_total",
            "transport=\"tcp\",op=\"write\""
        ),
        0,
        "shared memory carried every byte"
    );
    assert_eq!(
        metric(
            &text,
            "transfer_engine_tasks_total",
            "op=\"write\",result=\"completed\""
        ),
        writes.len() as u64
    );
    assert_eq!(
        metric(
            &text,
            "transfer_engine_tasks_total",
            "op=\"read\",result=\"completed\""
        ),
        reads.len() as u64
    );
    e.shutdown();
}
