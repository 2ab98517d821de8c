//! Two transports in one process, one the target of the other (the
//! kernel lets a process read its own memory with `process_vm_readv`).
//! Two-process behaviour (kills, stops, another user) is tested in
//! `proc_tests`, whose [`Local`] these tests use too.

use super::proc_tests::harness::{Local, slices};
use super::*;

fn options() -> ShmOptions {
    ShmOptions {
        threads: 2,
        max_peers: 4,
        ring_entries: 64,
        table_slots: 16,
        peer_table_slots: 16,
        timeout: Duration::from_secs(2),
        spin: Duration::from_micros(20),
        max_mappings: 8,
    }
}

/// Registers all of `buf` with `e`.
fn register(e: &Local, buf: &[u8], accessible: bool) {
    e.register(addr(buf), buf.len() as u64, accessible);
}

/// A peer handle of `a` to `target`, attaching through a direct call.
fn peer_of(a: &Local, target: &Local) -> ShmPeer {
    let t = Arc::downgrade(&target.shm);
    let attach: AttachFn = Arc::new(move |req: &Value| {
        let t = t
            .upgrade()
            .ok_or_else(|| Error::Socket("target gone".into()))?;
        Ok(t.serve_attach(req, "127.0.0.1:1".parse().unwrap()))
    });
    ShmPeer::new(PeerCore::new(&a.shm.shared, sys::own_pid(), attach))
}

/// Two engines with [`options`], `b` the target of `a` through the peer
/// handle, and a zeroed buffer of `len` bytes that `b` registered.
fn pair(len: usize) -> (Local, Local, Vec<u8>, ShmPeer) {
    let (a, b) = (Local::with(options()), Local::with(options()));
    let remote = vec![0u8; len];
    register(&b, &remote, true);
    let peer = peer_of(&a, &b);
    (a, b, remote, peer)
}

/// Shuts the transports of `engines` down.
fn shut_down(engines: &[&Local]) {
    for e in engines {
        e.shm.shutdown();
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn addr(b: &[u8]) -> u64 {
    b.as_ptr() as u64
}

#[test]
fn writes_and_reads_move_every_byte() {
    let (a, b, remote, peer) = pair(1 << 20);
    let src = pattern(1 << 20, 7);
    // 16 slices of 64 KiB, then an odd one over one of them: after them,
    // since WRITEs in flight together to the same bytes land in no
    // promised order (the target's threads serve them side by side).
    let writes = slices(addr(&src), addr(&remote), 1 << 20, 65536, true);
    let out = a.run(&peer, &writes);
    assert!(out.iter().all(|o| *o == Outcome::Done), "{out:?}");
    let out = a.run(&peer, &[(addr(&src) + 3, addr(&remote) + 5, 1, true)]);
    assert_eq!(out, vec![Outcome::Done]);
    let mut expect = src.clone();
    expect[5] = src[3];
    assert!(remote == expect, "the target's buffer holds the source");
    let back = vec![0u8; 1 << 20];
    let reads = slices(addr(&back), addr(&remote), 1 << 20, 131072, false);
    let out = a.run(&peer, &reads);
    assert!(out.iter().all(|o| *o == Outcome::Done), "{out:?}");
    assert!(back == expect);
    let st = a.shm.stats();
    assert_eq!(st.written, (1 << 20) + 1);
    assert_eq!(st.read, 1 << 20);
    assert_eq!(b.shm.stats().served, (1 << 20) + 1);
    assert_eq!(b.shm.served_peers(), 1);
    shut_down(&[&a, &b]);
}

#[test]
fn out_of_range_requests_fail_before_any_byte_moves() {
    let (a, b) = (Local::with(options()), Local::with(options()));
    let remote = vec![1u8; 4096];
    let private = vec![2u8; 4096];
    register(&b, &remote, true);
    register(&b, &private, false);
    let peer = peer_of(&a, &b);
    let src = vec![9u8; 8192];
    let mut local = vec![3u8; 8192];
    let r = addr(&remote);
    let cases = [
        (addr(&src), r + 1, 4096, true),           // runs past the end
        (addr(&src), r - 1, 2, true),              // starts before
        (addr(&src), addr(&private), 16, true),    // not accessible
        (addr(&src), 8, 16, true),                 // nothing there
        (addr(&src), r, u64::MAX - 10, true),      // wraps
        (addr(&local), r + 4000, 200, false),      // READ past the end
        (addr(&local), addr(&private), 16, false), // READ not accessible
        (addr(&local), 8, 16, false),              // READ of nothing
    ];
    let out = a.run(&peer, &cases);
    assert!(out.iter().all(|o| *o == Outcome::Rejected), "{out:?}");
    assert!(remote.iter().all(|&x| x == 1));
    assert!(private.iter().all(|&x| x == 2));
    assert!(local.iter().all(|&x| x == 3));
    // The link still works.
    let out = a.run(&peer, &[(addr(&local), r, 4096, false)]);
    assert_eq!(out, vec![Outcome::Done]);
    assert!(local[..4096].iter().all(|&x| x == 1));
    local[0] = 0;
    shut_down(&[&a, &b]);
}

#[test]
fn an_unregistered_buffer_takes_no_more_writes_nor_gives_reads() {
    let (a, b, remote, peer) = pair(65536);
    let src = vec![5u8; 65536];
    let mut back = vec![0u8; 65536];
    assert_eq!(
        a.run(&peer, &[(addr(&src), addr(&remote), 65536, true)]),
        vec![Outcome::Done]
    );
    b.unregister(addr(&remote));
    let after = a.run(
        &peer,
        &[
            (addr(&src), addr(&remote), 65536, true),
            (addr(&back), addr(&remote), 65536, false),
        ],
    );
    assert_eq!(after, vec![Outcome::Rejected; 2]);
    assert!(back.iter().all(|&x| x == 0));
    back[0] = 1;
    shut_down(&[&a, &b]);
}

#[test]
fn a_full_table_sends_reads_elsewhere() {
    let (a, b) = (
        Local::with(options()),
        Local::with(ShmOptions {
            table_slots: 1,
            ..options()
        }),
    );
    let one = vec![1u8; 64];
    let two = vec![2u8; 64];
    register(&b, &one, true);
    register(&b, &two, true);
    let peer = peer_of(&a, &b);
    let mut back = vec![0u8; 128];
    let base = addr(&back);
    let out = a.run(
        &peer,
        &[
            (base, addr(&one), 64, false),
            (base + 64, addr(&two), 64, false),
        ],
    );
    assert_eq!(out, vec![Outcome::Done, Outcome::Unreachable]);
    assert!(back[..64].iter().all(|&x| x == 1));
    assert!(back[64..].iter().all(|&x| x == 0));
    back[0] = 0;
    shut_down(&[&a, &b]);
}

#[test]
fn a_refused_attach_makes_the_peer_unreachable_until_retry() {
    let a = Local::with(options());
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let attach: AttachFn = Arc::new(move |_req: &Value| {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(json!({"error": "no"}))
    });
    let peer = ShmPeer::new(PeerCore::new(&a.shm.shared, sys::own_pid(), attach));
    let src = [0u8; 8];
    let s = (addr(&src), 0x1000, 8, true);
    assert_eq!(a.run(&peer, &[s, s]), vec![Outcome::Unreachable; 2]);
    assert_eq!(a.run(&peer, &[s]), vec![Outcome::Unreachable]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one attach, then no retry for a while"
    );
    a.shm.shutdown();
}

#[test]
fn an_attach_from_a_pid_that_is_not_the_asker_is_refused() {
    let b = Local::with(options());
    let a = Local::with(options());
    let here: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
    // Naming another process (pid 1) gets a ring, but the proof is read
    // from pid 1, where it is not: the ring is refused before any request
    // runs, and the target never compared pid 1's memory with anything but
    // words it chose.
    let mut req = attach::request(&a.shm.shared);
    req["pid"] = json!(1);
    let reply = b.shm.serve_attach(&req, here);
    assert!(reply.get("error").is_none(), "{reply}");
    let refused = attach::connect(&reply, b.shm.shared.pid, &options());
    assert!(refused.err().unwrap().contains("could not read our memory"));
    assert_eq!(b.shm.served_peers(), 0);
    let mut req = attach::request(&a.shm.shared);
    req["boot_id"] = json!("another");
    let reply = b.shm.serve_attach(&req, here);
    assert!(reply.get("error").is_some(), "{reply}");
    // A request from another host is refused whatever it says.
    let reply = b.shm.serve_attach(
        &attach::request(&a.shm.shared),
        "192.0.2.1:1".parse().unwrap(),
    );
    assert!(reply.get("error").is_some(), "{reply}");
    assert_eq!(b.shm.served_peers(), 0);
    let good = b.shm.serve_attach(&attach::request(&a.shm.shared), here);
    assert!(good.get("error").is_none(), "{good}");
    assert_eq!(b.shm.served_peers(), 1);
    // A reply naming another pid is refused by the initiator.
    assert!(attach::connect(&good, 1, &options()).is_err());
    shut_down(&[&a, &b]);
}

#[test]
fn rings_are_bounded_and_the_least_active_gives_way() {
    let b = Local::with(ShmOptions {
        max_peers: 1,
        ..options()
    });
    let remote = vec![0u8; 64];
    register(&b, &remote, true);
    let (a1, a2) = (Local::with(options()), Local::with(options()));
    let (p1, p2) = (peer_of(&a1, &b), peer_of(&a2, &b));
    let src = vec![4u8; 64];
    let w = (addr(&src), addr(&remote), 64, true);
    assert_eq!(a1.run(&p1, &[w]), vec![Outcome::Done]);
    assert_eq!(a2.run(&p2, &[w]), vec![Outcome::Done]);
    assert_eq!(b.shm.served_peers(), 1);
    // The first initiator's ring was closed; it attaches again.
    let mut ok = false;
    for _ in 0..3 {
        ok |= a1.run(&p1, &[w]) == vec![Outcome::Done];
    }
    assert!(ok, "the evicted initiator attaches again");
    assert_eq!(b.shm.served_peers(), 1);
    shut_down(&[&a1, &a2, &b]);
}

#[test]
fn dropping_the_peer_handle_detaches_from_the_target() {
    let (a, b, remote, peer) = pair(64);
    let src = vec![4u8; 64];
    assert_eq!(
        a.run(&peer, &[(addr(&src), addr(&remote), 64, true)]),
        vec![Outcome::Done]
    );
    assert_eq!(b.shm.served_peers(), 1);
    drop(peer);
    let start = Instant::now();
    while b.shm.served_peers() != 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "the ring stays");
        std::thread::sleep(Duration::from_millis(5));
    }
    shut_down(&[&a, &b]);
}

#[test]
fn shutdown_stops_serving_and_fails_later_slices() {
    let (a, b, remote, peer) = pair(64);
    let src = vec![4u8; 64];
    let w = (addr(&src), addr(&remote), 64, true);
    assert_eq!(a.run(&peer, &[w]), vec![Outcome::Done]);
    b.shm.shutdown();
    assert_eq!(b.shm.served_peers(), 0);
    // The initiator sees the ring closed; the next attach is refused.
    let out = a.run(&peer, &[w]);
    assert!(
        matches!(out[0], Outcome::Interrupted | Outcome::Unreachable),
        "{out:?}"
    );
    a.shm.shutdown();
    assert_eq!(a.run(&peer, &[w]), vec![Outcome::Failed { hard: true }]);
}

#[test]
fn the_descriptor_names_this_host_and_process() {
    let a = Local::with(options());
    let d = a.shm.descriptor();
    assert_eq!(d["pid"], json!(sys::own_pid()));
    assert_eq!(d["boot_id"], json!(sys::boot_id().unwrap()));
    let attach: AttachFn = Arc::new(|_: &Value| Ok(json!({})));
    assert!(a.shm.peer(&d, attach.clone()).is_none(), "ourselves");
    let mut other = d.clone();
    other["pid"] = json!(1);
    assert!(a.shm.peer(&other, attach.clone()).is_some());
    other["boot_id"] = json!("another host");
    assert!(a.shm.peer(&other, attach.clone()).is_none());
    assert!(a.shm.peer(&json!({}), attach).is_none());
    a.shm.shutdown();
}

/// A buffer of `len` bytes from `e`'s allocator, filled with `pattern`.
fn shared_buffer(e: &Local, len: usize, seed: u8) -> &'static mut [u8] {
    let addr = e.shm.allocate(len).unwrap();
    // SAFETY: a new buffer of ours, used by this test only.
    let b = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
    b.copy_from_slice(&pattern(len, seed));
    b
}

#[test]
fn allocated_buffers_are_copied_through_mappings() {
    let (a, b) = (Local::with(options()), Local::with(options()));
    let src = shared_buffer(&a, 1 << 20, 3);
    register(&a, src, true);
    let dst = shared_buffer(&b, 1 << 20, 0);
    dst.fill(0);
    register(&b, dst, true);
    let plain = vec![0u8; 1 << 20];
    register(&a, &plain, true);
    let peer = peer_of(&a, &b);
    let writes: Vec<_> = (0..16u64)
        .map(|k| {
            (
                addr(src) + k * 65536 + 1,
                addr(dst) + k * 65536,
                65535,
                true,
            )
        })
        .collect();
    assert!(a.run(&peer, &writes).iter().all(|o| *o == Outcome::Done));
    for k in 0..16 {
        let at = k * 65536;
        assert!(dst[at..at + 65535] == src[at + 1..at + 65536], "block {k}");
    }
    assert_eq!(
        b.shm.stats().mapped,
        16 * 65535,
        "the target memcpy'd from its mapping"
    );
    let reads: Vec<_> = (0..16u64)
        .map(|k| {
            (
                addr(&plain) + k * 65536,
                addr(dst) + k * 65536,
                65536,
                false,
            )
        })
        .collect();
    assert!(a.run(&peer, &reads).iter().all(|o| *o == Outcome::Done));
    assert!(plain[..] == dst[..]);
    assert_eq!(
        a.shm.stats().mapped,
        1 << 20,
        "the initiator memcpy'd from its mapping"
    );
    // A WRITE from a plain buffer still goes by cross-memory attach.
    let out = a.run(&peer, &[(addr(&plain), addr(dst), 4096, true)]);
    assert_eq!(out, vec![Outcome::Done]);
    assert_eq!(b.shm.stats().mapped, 16 * 65535);
    // Out of range, mapped or not: rejected.
    let out = a.run(
        &peer,
        &[(addr(&plain), addr(dst) + (1 << 20) - 1, 2, false)],
    );
    assert_eq!(out, vec![Outcome::Rejected]);
    shut_down(&[&a, &b]);
}

#[test]
fn a_peer_drops_its_mapping_of_an_unregistered_buffer() {
    let (a, b) = (Local::with(options()), Local::with(options()));
    let one = shared_buffer(&b, 1 << 20, 1);
    register(&b, one, true);
    let peer = peer_of(&a, &b);
    let back = vec![0u8; 4096];
    let out = a.run(&peer, &[(addr(&back), addr(one), 4096, false)]);
    assert_eq!(out, vec![Outcome::Done]);
    assert!(back[..] == one[..4096]);
    let link = peer.core().link().unwrap();
    assert_eq!(link.maps.len(), 1);
    let (one_addr, one_fd) = (
        addr(one),
        b.shm.shared.allocs.backing_of(addr(one), 1).unwrap().fd,
    );
    b.unregister(addr(one));
    b.shm.free(one_addr).unwrap();
    let start = Instant::now();
    while link.maps.len() != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the mapping stays"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    // A new buffer, likely in the same descriptor number: its own bytes.
    let two = shared_buffer(&b, 1 << 20, 2);
    register(&b, two, true);
    let two_fd = b.shm.shared.allocs.backing_of(addr(two), 1).unwrap().fd;
    let out = a.run(&peer, &[(addr(&back), addr(two), 4096, false)]);
    assert_eq!(out, vec![Outcome::Done]);
    assert!(back[..] == two[..4096], "not the bytes of the freed buffer");
    println!("descriptor {one_fd} then {two_fd}");
    shut_down(&[&a, &b]);
}

#[test]
fn a_mapping_is_refused_unless_the_descriptor_is_the_named_memfd() {
    let a = Local::with(options());
    let addr = a.shm.allocate(8192).unwrap();
    let b = a.shm.shared.allocs.backing_of(addr, 8192).unwrap();
    let me = sys::pidfd_open(sys::own_pid()).unwrap();
    let maps = maps::PeerMaps::new(2);
    assert!(maps.get(&me, &b, 8192).is_some());
    assert!(maps.get(&me, &b, 8193).is_none(), "past its end");
    let wrong_id = table::Backing { id: b.id ^ 1, ..b };
    assert!(maps.get(&me, &wrong_id, 1).is_none());
    let wrong_fd = table::Backing {
        fd: std::os::fd::AsRawFd::as_raw_fd(&a.shm.shared.kick),
        id: b.id ^ 2,
        ..b
    };
    assert!(maps.get(&me, &wrong_fd, 1).is_none());
    assert!(maps.len() <= 2, "bounded");
    a.shm.free(addr).unwrap();
    assert!(a.shm.free(addr).is_err());
    a.shm.shutdown();
}

/// Waits until every thread of `e` sleeps with no deadline.
fn threads_asleep(e: &Local) {
    let s = &e.shm.shared;
    let start = Instant::now();
    while s.untimed_sleepers.load(Ordering::SeqCst) < s.opts.threads {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "threads never slept"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// 64 READs of 4 KiB from a buffer of `b` (pattern `seed`) into `local`,
/// posted by a caller of `a` under a plug while every thread of `a` slept,
/// and not flushed yet; `done` says how each ends.
struct PluggedReads {
    a: Local,
    b: Local,
    remote: Vec<u8>,
    local: Vec<u8>,
    /// Kept attached while the READs run.
    _peer: ShmPeer,
    done: std::sync::mpsc::Receiver<Outcome>,
}

fn plugged_reads(seed: u8) -> PluggedReads {
    let (a, b, mut remote, peer) = pair(64 * 4096);
    remote.copy_from_slice(&pattern(64 * 4096, seed));
    // The first post attaches; afterwards every thread sleeps.
    assert_eq!(
        a.run(&peer, &[(addr(&remote), addr(&remote), 1, false)]),
        [Outcome::Done]
    );
    let local = vec![0u8; remote.len()];
    threads_asleep(&a);
    let (tx, done) = std::sync::mpsc::channel();
    {
        let _plug = crate::transport::plug::Plug::begin(&[]);
        for s in slices(
            addr(&local),
            addr(&remote),
            remote.len() as u64,
            4096,
            false,
        ) {
            let tx = tx.clone();
            a.post(&peer, s, move |o| {
                let _ = tx.send(o);
            });
        }
    }
    PluggedReads {
        a,
        b,
        remote,
        local,
        _peer: peer,
        done,
    }
}

#[test]
fn reads_submitted_under_a_plug_wake_one_thread_at_the_flush() {
    let r = plugged_reads(3);
    // Owed, not given: no thread woke for the 64 READs.
    std::thread::sleep(Duration::from_millis(100));
    assert!(r.done.try_recv().is_err(), "a READ ran before the flush");
    assert!(
        r.a.shm.shared.reads.is_empty(),
        "the READs wait on the caller's thread until the flush"
    );
    r.a.shm.flush();
    for _ in 0..64 {
        let o = r
            .done
            .recv_timeout(Duration::from_secs(10))
            .expect("a READ never ended");
        assert_eq!(o, Outcome::Done);
    }
    assert!(r.local == r.remote, "every byte read");
    shut_down(&[&r.a, &r.b]);
}

#[test]
fn a_polling_caller_does_its_reads_in_the_flush() {
    let r = plugged_reads(5);
    // A caller that polled just now: its flush copies.
    let s = &r.a.shm.shared;
    s.helped_at_us.store(
        s.started.elapsed().as_micros().max(1) as u64,
        Ordering::Relaxed,
    );
    r.a.shm.flush();
    let ended: Vec<Outcome> = r.done.try_iter().collect();
    assert_eq!(
        ended,
        vec![Outcome::Done; 64],
        "every READ ended in the flush"
    );
    assert!(r.local == r.remote, "every byte read");
    shut_down(&[&r.a, &r.b]);
}

#[test]
fn two_callers_flushing_at_once_leave_no_read_behind() {
    let (a, b, mut remote, peer) = pair(128 * 4096);
    remote.copy_from_slice(&pattern(128 * 4096, 9));
    assert_eq!(
        a.run(&peer, &[(addr(&remote), addr(&remote), 1, false)]),
        [Outcome::Done]
    );
    let mut local = vec![0u8; remote.len()];
    for round in 0..50 {
        local.fill(0);
        threads_asleep(&a);
        let (tx, done) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            for half in [0usize, 1] {
                let (a, peer, tx) = (&a, &peer, tx.clone());
                let at = half * 64 * 4096;
                let (l, r) = (addr(&local) + at as u64, addr(&remote) + at as u64);
                s.spawn(move || {
                    {
                        let _plug = crate::transport::plug::Plug::begin(&[]);
                        for sl in slices(l, r, 64 * 4096, 4096, false) {
                            let tx = tx.clone();
                            a.post(peer, sl, move |o| {
                                let _ = tx.send(o);
                            });
                        }
                    }
                    // Each caller's flush may find the kick the other owed
                    // taken already: one kick serves both.
                    a.shm.flush();
                });
            }
        });
        for _ in 0..128 {
            let o = done
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("round {round}: a READ never ended"));
            assert_eq!(o, Outcome::Done);
        }
        assert!(local == remote, "round {round}: every byte read");
    }
    shut_down(&[&a, &b]);
}

#[test]
fn reads_to_two_targets_staged_under_one_plug_all_end_at_the_flush() {
    let (a, b, mut remote_b, peer_b) = pair(200 * 4096);
    let c = Local::with(options());
    let remote_c = pattern(200 * 4096, 4);
    register(&c, &remote_c, true);
    let peer_c = peer_of(&a, &c);
    remote_b.copy_from_slice(&pattern(200 * 4096, 8));
    let (local_b, local_c) = (vec![0u8; remote_b.len()], vec![0u8; remote_c.len()]);
    let reads = |local: &[u8], remote: u64, len: usize| {
        slices(addr(local), remote, len as u64, 4096, false)
    };
    let (tx, done) = std::sync::mpsc::channel();
    let post = |peer: &ShmPeer, s: (u64, u64, u64, bool)| {
        let tx = tx.clone();
        a.post(peer, s, move |o| {
            let _ = tx.send(o);
        });
    };
    {
        let _plug = crate::transport::plug::Plug::begin(&[]);
        // More READs than one round takes (64, or 256 KiB), alternating
        // between the targets, and one outside every buffer of c.
        let to_b = reads(&local_b, addr(&remote_b), remote_b.len());
        let to_c = reads(&local_c, addr(&remote_c), remote_c.len());
        for (sb, sc) in to_b.into_iter().zip(to_c) {
            post(&peer_b, sb);
            post(&peer_c, sc);
        }
        let end_of_c = addr(&remote_c) + remote_c.len() as u64;
        for s in reads(&local_c, end_of_c, 4096) {
            post(&peer_c, s);
        }
    }
    assert!(done.try_recv().is_err(), "a READ ran before the flush");
    a.shm.flush();
    let mut ended = Vec::new();
    for _ in 0..401 {
        ended.push(
            done.recv_timeout(Duration::from_secs(10))
                .expect("a READ never ended"),
        );
    }
    assert_eq!(ended.iter().filter(|o| **o == Outcome::Done).count(), 400);
    assert_eq!(ended.iter().filter(|o| **o == Outcome::Rejected).count(), 1);
    assert!(local_b == remote_b, "every byte read from b");
    // The refused READ wrote nothing: c's range is read once, intact.
    assert!(local_c == remote_c, "every byte read from c");
    shut_down(&[&a, &b, &c]);
}

#[test]
fn a_caller_that_stops_helping_hands_its_results_back_to_the_threads() {
    // Threads that sleep with WRITEs in flight look again every second
    // (a quarter of this timeout, at most 1 s).
    let opts = ShmOptions {
        timeout: Duration::from_secs(8),
        ..options()
    };
    let (a, b) = (Local::with(opts.clone()), Local::with(opts));
    let remote = vec![0u8; 4096];
    register(&b, &remote, true);
    let peer = peer_of(&a, &b);
    let src = pattern(4096, 9);
    assert_eq!(
        a.run(&peer, &[(addr(&src), addr(&remote), 1, true)]),
        [Outcome::Done],
        "the first post attaches"
    );
    for round in 0..3 {
        threads_asleep(&a);
        // A caller polling for its tasks: the threads leave the result of
        // its WRITE to it, and the target does not ring us for it.
        a.shm.help();
        let (tx, done) = std::sync::mpsc::channel();
        a.post(&peer, (addr(&src), addr(&remote), 4096, true), move |o| {
            let _ = tx.send(o);
        });
        // It stops (to park until its task ends): the threads take the
        // result at once, not at their next look a second later.
        a.shm.stop_helping();
        let start = Instant::now();
        let o = done
            .recv_timeout(Duration::from_secs(10))
            .expect("the WRITE never ended");
        assert_eq!(o, Outcome::Done);
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "round {round}: the result waited {:?} for a thread's look",
            start.elapsed()
        );
    }
    assert!(remote == src, "every byte written");
    shut_down(&[&a, &b]);
}
