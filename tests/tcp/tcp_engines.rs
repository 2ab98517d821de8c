//! Two engines in one process move bytes over TCP: P2P handshake and the
//! HTTP metadata server, WRITE and READ, verified byte for byte.

use crate::common;

use std::sync::Arc;
use transfer_engine::TaskStatus;
use transfer_engine::metadata::server::MetadataServer;
use transfer_engine::{Engine, Opcode, Request};
use transfer_engine::{Location, Region};

fn engine(conn: &str, name: &str) -> Arc<Engine> {
    let e = Engine::new(conn, name, false).expect("engine");
    e.install_transport("tcp", None).expect("tcp");
    e
}

fn register(e: &Engine, buf: &mut [u8], remote: bool) {
    e.register(&[Region {
        addr: buf.as_mut_ptr() as u64,
        length: buf.len() as u64,
        location: Location::Cpu(0),
        remote_accessible: remote,
    }])
    .expect("register");
}

fn run(e: &Engine, reqs: &[Request]) -> Vec<TaskStatus> {
    let b = e.allocate_batch(reqs.len()).unwrap();
    e.submit(b, reqs).unwrap();
    let mut out = Vec::new();
    for i in 0..reqs.len() {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let (s, _) = e.status(b, i).unwrap();
            if s != TaskStatus::Waiting {
                out.push(s);
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "task {i} did not finish"
            );
            std::thread::yield_now();
        }
    }
    e.free_batch(b).unwrap();
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// P2P names become `host:port` of each engine's listener; with a store
/// they are kept verbatim, so they must differ.
fn round_trip(conn: &str, names: [&str; 2]) {
    let target = engine(conn, names[0]);
    let initiator = engine(conn, names[1]);
    let mut remote = vec![0u8; 8 << 20];
    register(&target, &mut remote, true);
    let mut local = pattern(8 << 20, 7);
    let mut back = vec![0u8; 8 << 20];
    register(&initiator, &mut local, true);
    let seg = initiator
        .open_segment(target.local_name())
        .expect("open segment");
    assert!(seg > 0);
    let base = remote.as_ptr() as u64;
    let sizes = [1usize, 4095, 65536, 65537, 1 << 20, (3 << 20) + 13];
    let mut off = 3usize;
    let mut reqs = Vec::new();
    for &len in &sizes {
        reqs.push(Request {
            opcode: Opcode::Write,
            source: local.as_ptr() as u64 + off as u64,
            target_id: seg,
            target_offset: base + off as u64,
            length: len as u64,
        });
        off += len + 5;
    }
    assert!(
        run(&initiator, &reqs)
            .iter()
            .all(|s| *s == TaskStatus::Completed)
    );
    for r in &reqs {
        let o = (r.target_offset - base) as usize;
        assert_eq!(
            &remote[o..o + r.length as usize],
            &local[o..o + r.length as usize]
        );
    }
    let reads: Vec<Request> = reqs
        .iter()
        .map(|r| Request {
            opcode: Opcode::Read,
            source: back.as_mut_ptr() as u64 + (r.target_offset - base),
            ..*r
        })
        .collect();
    assert!(
        run(&initiator, &reads)
            .iter()
            .all(|s| *s == TaskStatus::Completed)
    );
    for r in &reads {
        let o = (r.target_offset - base) as usize;
        assert_eq!(
            &back[o..o + r.length as usize],
            &remote[o..o + r.length as usize]
        );
    }
    // Out of the peer's buffers: FAILED, nothing written.
    let bad = Request {
        opcode: Opcode::Write,
        source: local.as_ptr() as u64,
        target_id: seg,
        target_offset: base + remote.len() as u64 - 10,
        length: 20,
    };
    assert_eq!(run(&initiator, &[bad]), vec![TaskStatus::Failed]);
    initiator.shutdown();
    target.shutdown();
}

#[test]
fn p2p_write_and_read() {
    round_trip("P2PHANDSHAKE", ["127.0.0.1", "127.0.0.1"]);
}

#[test]
fn http_metadata_write_and_read() {
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).unwrap();
    round_trip(&server.url(), ["target.example:1", "initiator.example:2"]);
    server.shutdown();
}

#[test]
fn many_threads_share_an_initiator() {
    let target = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let initiator = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let mut remote = vec![0u8; 8 << 20];
    register(&target, &mut remote, true);
    let seg = initiator.open_segment(target.local_name()).unwrap();
    let base = remote.as_ptr() as u64;
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            let e = initiator.clone();
            std::thread::spawn(move || {
                let chunk = 1 << 20;
                let data = pattern(chunk, t);
                let mut back = vec![0u8; chunk];
                let at = base + u64::from(t) * chunk as u64;
                let w = Request {
                    opcode: Opcode::Write,
                    source: data.as_ptr() as u64,
                    target_id: seg,
                    target_offset: at,
                    length: chunk as u64,
                };
                assert_eq!(run(&e, &[w]), vec![TaskStatus::Completed]);
                let r = Request {
                    opcode: Opcode::Read,
                    source: back.as_mut_ptr() as u64,
                    ..w
                };
                assert_eq!(run(&e, &[r]), vec![TaskStatus::Completed]);
                assert!(back == data, "thread {t} read back other bytes");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    initiator.shutdown();
    target.shutdown();
}

/// A buffer the target registers after the initiator cached its
/// descriptor is reachable (the descriptor is fetched again), as with
/// Mooncake; memory the target never registered still fails.
#[test]
fn buffers_registered_after_open_are_reachable() {
    let target = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let initiator = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let mut first = vec![0u8; 4096];
    register(&target, &mut first, true);
    let seg = initiator.open_segment(target.local_name()).unwrap();
    let mut late = vec![0u8; 1 << 20];
    register(&target, &mut late, true);
    let data = pattern(late.len(), 9);
    let w = Request {
        opcode: Opcode::Write,
        source: data.as_ptr() as u64,
        target_id: seg,
        target_offset: late.as_ptr() as u64,
        length: data.len() as u64,
    };
    assert_eq!(run(&initiator, &[w]), vec![TaskStatus::Completed]);
    assert!(late == data, "the late buffer holds other bytes");
    let unregistered = vec![0u8; 4096];
    let bad = Request {
        target_offset: unregistered.as_ptr() as u64,
        length: 16,
        ..w
    };
    assert_eq!(run(&initiator, &[bad]), vec![TaskStatus::Failed]);
    initiator.shutdown();
    target.shutdown();
}

/// A request over buffers the target registered separately but adjacent
/// (one descriptor entry each, no gap: how a buffer larger than a NIC's
/// largest memory region is published) is cut at their edges and moves;
/// one across a gap between buffers fails and writes nothing.
#[test]
fn a_request_spans_adjacent_remote_buffers() {
    let target = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let initiator = engine("P2PHANDSHAKE", "127.0.0.1:0");
    let len = 4 << 20;
    let mut remote = vec![0u8; len];
    // [0, a) and [a, b) adjacent; [b + gap, len) after a gap.
    let (a, b, gap) = ((1 << 20) + 12345, (3 << 20) + 7, 4096);
    let base = remote.as_mut_ptr() as u64;
    for (from, to) in [(0, a), (a, b), (b + gap, len)] {
        target
            .register(&[Region {
                addr: base + from as u64,
                length: (to - from) as u64,
                location: Location::Cpu(0),
                remote_accessible: true,
            }])
            .expect("register");
    }
    let mut local = pattern(len, 3);
    register(&initiator, &mut local, true);
    let mut back = vec![0u8; len];
    register(&initiator, &mut back, true);
    let seg = initiator.open_segment(target.local_name()).unwrap();
    let (from, to) = (100, b - 100);
    let w = Request {
        opcode: Opcode::Write,
        source: local.as_ptr() as u64 + from as u64,
        target_id: seg,
        target_offset: base + from as u64,
        length: (to - from) as u64,
    };
    assert_eq!(run(&initiator, &[w]), vec![TaskStatus::Completed]);
    let across_gap = Request {
        source: local.as_ptr() as u64 + (b - 100) as u64,
        target_offset: base + (b - 100) as u64,
        length: (gap + 200) as u64,
        ..w
    };
    assert_eq!(run(&initiator, &[across_gap]), vec![TaskStatus::Failed]);
    let r = Request {
        opcode: Opcode::Read,
        source: back.as_mut_ptr() as u64 + from as u64,
        ..w
    };
    assert_eq!(run(&initiator, &[r]), vec![TaskStatus::Completed]);
    initiator.shutdown();
    target.shutdown();
    // Every byte: the written range holds the pattern, the rest (the gap
    // included) is untouched; the read brought the range back.
    let mut expected = vec![0u8; len];
    expected[from..to].copy_from_slice(&local[from..to]);
    assert!(remote == expected, "the target's buffers hold other bytes");
    assert!(back == expected, "the read brought back other bytes");
}

/// `auto_discover` with no RDMA device installs TCP, as Mooncake does.
#[test]
fn auto_discover_installs_tcp() {
    let target = Engine::new("P2PHANDSHAKE", "127.0.0.1", true).expect("engine");
    let initiator = Engine::new("P2PHANDSHAKE", "127.0.0.1", true).expect("engine");
    let mut remote = vec![0u8; 1 << 20];
    register(&target, &mut remote, true);
    let data = pattern(1 << 20, 3);
    let seg = initiator
        .open_segment(target.local_name())
        .expect("open segment");
    let w = Request {
        opcode: Opcode::Write,
        source: data.as_ptr() as u64,
        target_id: seg,
        target_offset: remote.as_ptr() as u64,
        length: data.len() as u64,
    };
    assert_eq!(run(&initiator, &[w]), vec![TaskStatus::Completed]);
    assert!(remote == data);
    initiator.shutdown();
    target.shutdown();
}

/// `MC_FORCE_HCA` makes auto-discovery install RDMA or fail, as Mooncake:
/// on a machine without an active RDMA device the engine is not created
/// (without the variable it falls back to TCP, above).
#[test]
fn force_hca_refuses_to_fall_back_to_tcp() {
    let active = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.flatten().any(|dev| {
                std::fs::read_to_string(dev.path().join("ports/1/state"))
                    .is_ok_and(|s| s.contains("ACTIVE"))
            })
        })
        .unwrap_or(false);
    if active {
        return common::skip("this machine has an active RDMA device");
    }
    let mut config = transfer_engine::Config::default();
    config.engine.force_hca = true;
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1")
        .auto_discover(true)
        .config(config.clone())
        .build();
    let err = e.err().expect("no engine without an RDMA device");
    assert!(err.to_string().contains("MC_FORCE_HCA"), "{err}");
    // MC_FORCE_TCP does not override it.
    config.engine.force_tcp = true;
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1")
        .auto_discover(true)
        .config(config)
        .build();
    assert!(e.is_err(), "MC_FORCE_HCA wins over MC_FORCE_TCP");
}

/// Bracketed IPv6 names: the engine is renamed `[::1]:port` and peers open
/// it by that name.
#[test]
fn ipv6_names_work() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        common::skip("no IPv6 loopback on this machine");
        return;
    }
    let target = engine("P2PHANDSHAKE", "[::1]");
    let initiator = engine("P2PHANDSHAKE", "::1");
    assert!(
        target.local_name().starts_with("[::1]:"),
        "{}",
        target.local_name()
    );
    let mut remote = vec![0u8; 256 << 10];
    register(&target, &mut remote, true);
    let data = pattern(256 << 10, 9);
    let mut back = vec![0u8; 256 << 10];
    let seg = initiator
        .open_segment(target.local_name())
        .expect("open segment");
    let w = Request {
        opcode: Opcode::Write,
        source: data.as_ptr() as u64,
        target_id: seg,
        target_offset: remote.as_ptr() as u64,
        length: data.len() as u64,
    };
    let r = Request {
        opcode: Opcode::Read,
        source: back.as_mut_ptr() as u64,
        ..w
    };
    assert_eq!(run(&initiator, &[w]), vec![TaskStatus::Completed]);
    assert_eq!(run(&initiator, &[r]), vec![TaskStatus::Completed]);
    assert!(remote == data && back == data);
    initiator.shutdown();
    target.shutdown();
}

/// A malformed priority matrix is rejected as malformed JSON and installs
/// nothing; a good one naming no usable interface still installs TCP.
#[test]
fn install_checks_the_priority_matrix() {
    use transfer_engine::Error;
    let e = Engine::new("P2PHANDSHAKE", "127.0.0.1", false).expect("engine");
    for bad in [
        "{",
        "[]",
        r#"{"cpu:0": [["eth0"]]}"#,
        r#"{"cpu:0": "eth0"}"#,
    ] {
        assert!(
            matches!(
                e.install_transport("tcp", Some(bad)),
                Err(Error::MalformedJson(_))
            ),
            "{bad} must be rejected"
        );
    }
    assert!(
        e.install_transport("tcp", Some(r#"{"cpu:0": [["no-such-nic"], []]}"#))
            .is_ok()
    );
    assert!(
        e.install_transport("tcp", None).is_ok(),
        "installing twice returns the same transport"
    );
    e.shutdown();
}

/// The registration pattern of consumers, 1,000 times: the target
/// registers a buffer, notifies, and the initiator WRITEs and READs it at
/// once (its cached descriptor does not list it yet). No task fails.
fn fresh_buffers(conn: &str, names: [&str; 2]) {
    let target = engine(conn, names[0]);
    let initiator = engine(conn, names[1]);
    let run = common::fresh::register_notify_transfer(&target, &initiator, 1000, 4096 + 13);
    println!("register, notify, WRITE and READ at once over {conn}: {run}");
    assert_eq!(run.failed, 0, "{run}");
    initiator.shutdown();
    target.shutdown();
}

#[test]
fn buffers_registered_a_moment_ago_are_reachable_p2p() {
    fresh_buffers("P2PHANDSHAKE", ["127.0.0.1", "127.0.0.1"]);
}

#[test]
fn buffers_registered_a_moment_ago_are_reachable_http() {
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).unwrap();
    fresh_buffers(&server.url(), ["fresh-target:1", "fresh-initiator:2"]);
    server.shutdown();
}

/// A target registers a buffer every 10 ms; the initiator writes to each
/// as soon as it hears of it, while earlier ones may be in flight.
#[test]
fn a_buffer_every_10_ms_is_written_as_soon_as_it_is_announced() {
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).unwrap();
    for (conn, names) in [
        ("P2PHANDSHAKE".to_string(), ["127.0.0.1", "127.0.0.1"]),
        (server.url(), ["every-target:1", "every-initiator:2"]),
    ] {
        let target = engine(&conn, names[0]);
        let initiator = engine(&conn, names[1]);
        let run = common::fresh::registrations_every(
            &target,
            &initiator,
            std::time::Duration::from_millis(10),
            300,
            65536 + 7,
        );
        println!("a buffer every 10 ms over {conn}: {run}");
        assert_eq!(run.failed, 0, "{run}");
        initiator.shutdown();
        target.shutdown();
    }
    server.shutdown();
}

/// A proxy in front of an engine's handshake listener that can hold the
/// replies: each request goes upstream at once and its whole reply is read
/// (the listener half-closes after it), but while holding, the reply is
/// kept until [`HoldingProxy::release`].
struct HoldingProxy {
    port: u16,
    state: Arc<(std::sync::Mutex<Hold>, std::sync::Condvar)>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct Hold {
    holding: bool,
    /// Replies held so far.
    held: usize,
}

impl HoldingProxy {
    fn start(upstream: u16) -> HoldingProxy {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let state: Arc<(std::sync::Mutex<Hold>, std::sync::Condvar)> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !sp.load(Ordering::Acquire) {
                let mut client = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        continue;
                    }
                    Err(e) => panic!("proxy accept: {e}"),
                };
                client.set_nonblocking(false).unwrap();
                let st = st.clone();
                std::thread::spawn(move || {
                    let mut up = std::net::TcpStream::connect(("127.0.0.1", upstream)).unwrap();
                    let (mut c2, mut u2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
                    let forward = std::thread::spawn(move || {
                        let _ = std::io::copy(&mut c2, &mut u2);
                        let _ = u2.shutdown(std::net::Shutdown::Write);
                    });
                    let mut reply = Vec::new();
                    let _ = up.read_to_end(&mut reply);
                    {
                        let (m, cv) = &*st;
                        let mut h = m.lock().unwrap();
                        if h.holding {
                            h.held += 1;
                            cv.notify_all();
                            while h.holding {
                                h = cv.wait(h).unwrap();
                            }
                        }
                    }
                    let _ = client.write_all(&reply);
                    let _ = client.shutdown(std::net::Shutdown::Write);
                    let _ = forward.join();
                });
            }
        });
        HoldingProxy {
            port,
            state,
            stop,
            thread: Some(thread),
        }
    }

    /// The segment name that reaches the upstream engine through the proxy.
    fn name(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Holds the replies from now on.
    fn hold(&self) {
        self.state.0.lock().unwrap().holding = true;
    }

    /// Waits until `n` replies are held.
    fn wait_held(&self, n: usize) {
        let (m, cv) = &*self.state;
        let (h, timeout) = cv
            .wait_timeout_while(m.lock().unwrap(), std::time::Duration::from_secs(30), |h| {
                h.held < n
            })
            .unwrap();
        assert!(!timeout.timed_out(), "{} replies held, want {n}", h.held);
    }

    /// Sends the held replies, and the next ones at once.
    fn release(&self) {
        let (m, cv) = &*self.state;
        m.lock().unwrap().holding = false;
        cv.notify_all();
    }
}

impl Drop for HoldingProxy {
    fn drop(&mut self) {
        self.release();
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A refetch that began before the target registered a buffer, and ends
/// after a request to that buffer was submitted, does not decide that
/// request: it waits for a newer fetch, and completes.
#[test]
fn a_refetch_begun_before_a_registration_does_not_decide_a_later_request() {
    use common::{Buf, write_req};
    let target = engine("P2PHANDSHAKE", "127.0.0.1");
    let initiator = engine("P2PHANDSHAKE", "127.0.0.1");
    let src = Buf::new(65536, 5);
    common::register(&initiator, &src, true);
    let proxy = HoldingProxy::start(target.rpc_port());
    let seg = initiator.open_segment(&proxy.name()).expect("open");
    let fetches = initiator.descriptor_fetches();
    proxy.hold();
    // A request to memory the target never registered refetches its
    // descriptor; the reply (without the buffer below) is held.
    let never = Buf::zeroed(4096);
    let b1 = initiator.allocate_batch(1).unwrap();
    initiator
        .submit(b1, &[write_req(src.addr(), seg, never.addr(), 4096)])
        .unwrap();
    proxy.wait_held(1);
    let fresh = Buf::zeroed(65536);
    common::register(&target, &fresh, true);
    let b2 = initiator.allocate_batch(1).unwrap();
    initiator
        .submit(b2, &[write_req(src.addr(), seg, fresh.addr(), 65536)])
        .unwrap();
    proxy.release();
    let t = std::time::Duration::from_secs(30);
    assert_eq!(
        common::wait_task(&initiator, b1, 0, t),
        TaskStatus::Failed,
        "memory the target never registered"
    );
    assert_eq!(
        common::wait_task(&initiator, b2, 0, t),
        TaskStatus::Completed,
        "a buffer registered before the request was submitted"
    );
    assert!(
        fresh.snapshot() == src.snapshot(),
        "the fresh buffer's bytes"
    );
    assert!(never.snapshot().iter().all(|&b| b == 0));
    // One fetch for each request: the held one, and one begun after the
    // second request was submitted.
    assert_eq!(initiator.descriptor_fetches() - fetches, 2);
    initiator.free_batch(b1).unwrap();
    initiator.free_batch(b2).unwrap();
    initiator.shutdown();
    target.shutdown();
}

/// Requests to memory the target never registered, from 4 threads for a
/// second, each fail within a bound, and the lookups they cause stay
/// within the documented bound (one per 50 ms per peer, beyond one per
/// change of its descriptor); buffers the target registers meanwhile are
/// reached at once.
#[test]
fn unregistered_ranges_fail_quickly_without_hammering_the_peer() {
    use common::{Buf, run_within, write_req};
    use std::time::{Duration, Instant};
    let target = engine("P2PHANDSHAKE", "127.0.0.1");
    let initiator = engine("P2PHANDSHAKE", "127.0.0.1");
    let src = Buf::new(4096, 5);
    common::register(&initiator, &src, true);
    let seg = initiator.open_segment(target.local_name()).expect("open");
    let never = Buf::zeroed(4096);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let fetches = initiator.descriptor_fetches();
    let t0 = Instant::now();
    let (bad, slowest, fresh) = std::thread::scope(|s| {
        let hammers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let (mut n, mut slowest) = (0u64, Duration::ZERO);
                    while !stop.load(std::sync::atomic::Ordering::Acquire) {
                        let t = Instant::now();
                        let w = write_req(src.addr(), seg, never.addr(), 4096);
                        let s = run_within(&initiator, &[w], Duration::from_secs(30));
                        assert_eq!(s, vec![TaskStatus::Failed], "unregistered memory");
                        slowest = slowest.max(t.elapsed());
                        n += 1;
                    }
                    (n, slowest)
                })
            })
            .collect();
        // The hammers stop when this scope ends, even by a panic.
        struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Release);
            }
        }
        let stopper = StopOnDrop(&stop);
        let mut fresh = Vec::new();
        for i in 0..10u8 {
            std::thread::sleep(Duration::from_millis(100));
            let b = Buf::zeroed(4096);
            common::register(&target, &b, true);
            let w = write_req(src.addr(), seg, b.addr(), 4096);
            let s = run_within(&initiator, &[w], Duration::from_secs(30));
            assert_eq!(s, vec![TaskStatus::Completed], "fresh buffer {i}");
            assert!(b.snapshot() == src.snapshot(), "fresh buffer {i}'s bytes");
            fresh.push(b);
        }
        drop(stopper);
        let (mut bad, mut slowest) = (0, Duration::ZERO);
        for h in hammers {
            let (n, s) = h.join().unwrap();
            bad += n;
            slowest = slowest.max(s);
        }
        (bad, slowest, fresh.len() as u64)
    });
    let took = t0.elapsed();
    let fetches = initiator.descriptor_fetches() - fetches;
    println!(
        "{bad} requests to unregistered memory and {fresh} to fresh buffers in {took:.2?}: \
         {fetches} descriptor fetches; the slowest failure took {slowest:.2?}"
    );
    assert!(never.snapshot().iter().all(|&b| b == 0));
    let bound = took.as_millis() as u64 / 50 + 2 * fresh + 2;
    assert!(fetches <= bound, "{fetches} fetches, bound {bound}");
    assert!(
        slowest < Duration::from_secs(1),
        "a request to unregistered memory took {slowest:?} to fail"
    );
    initiator.shutdown();
    target.shutdown();
}
