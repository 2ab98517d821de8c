//! The unregister guarantee across processes. The child streams WRITEs
//! (or READs) against a buffer of ours while we unregister it: the call
//! returns at once, even with the child stopped (SIGSTOP) while its
//! requests sit in our ring; we then fill the range with a pattern, and
//! no peer byte lands in it afterwards, including after the child resumes
//! and keeps posting. A READ that ends Done never holds a byte written
//! after the unregister. With heap buffers (cross-memory attach) and with
//! buffers of the transport's memfd allocator (memcpy from mappings; our
//! buffer is freed after each round while the child may still map it).

use super::buf::Buf;
use super::harness::*;
use crate::transport::Outcome;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LEN: u64 = 1 << 20;
const SLICE: u64 = 65536;
const DEPTH: u64 = 64;
const ROUNDS: usize = 20;
/// Generous: unregister waits for one copy of at most 256 KiB.
const UNREGISTER_BOUND: Duration = Duration::from_secs(1);
const FILL: u8 = 0xee;

/// A child connected to us (attached, by one WRITE of one byte), and its
/// source buffer (in a memfd if `shared`).
fn connected_child(test: &str, local: &Local, shared: bool) -> (Arc<Child>, u64) {
    let child = Child::spawn(test, &[], &[]);
    let ok = child.call(
        json!({"cmd": "connect", "shm": local.shm.descriptor()}),
        None,
    );
    assert_eq!(ok["ok"], json!(true));
    let src = child.alloc_in(DEPTH * SLICE, Some(5), true, shared);
    let probe = Buf::zeroed(64);
    local.register(probe.addr(), 64, true);
    let r = child.call(
        json!({"cmd": "run", "slices": [[src, probe.addr(), 1, true]]}),
        Some(local),
    );
    assert_eq!(r["outcomes"], json!(["Done"]));
    local.unregister(probe.addr());
    (child, src)
}

fn wait_served(local: &Local, more_than: u64) {
    let start = Instant::now();
    while local.shm.stats().served <= more_than {
        assert!(start.elapsed() < HANG, "the stream does not run");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn count(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

/// Our buffer for a round: from the memfd allocator if `shared`.
fn target(local: &Local, shared: bool, keep: &mut Vec<Buf>) -> u64 {
    local.buffer(LEN, shared, keep)
}

fn writes_while_unregistering(test: &str, stop_child: bool, shared: bool) {
    let local = Local::start();
    let (child, src) = connected_child(test, &local, shared);
    let mut keep = Vec::new();
    let mut slowest = Duration::ZERO;
    let mut rejected = 0;
    for round in 0..ROUNDS {
        let t = target(&local, shared, &mut keep);
        local.register(t, LEN, true);
        let at = t + (round as u64 * 4099) % (LEN - SLICE);
        let before = local.shm.stats().served;
        child.call(
            json!({"cmd": "stream", "local": src, "remote": at, "len": SLICE,
                   "write": true, "depth": DEPTH}),
            None,
        );
        wait_served(&local, before + 4 * LEN);
        if stop_child {
            child.stop();
        }
        let took = local.unregister(t);
        // SAFETY: our buffer, no longer registered: no peer may write it.
        unsafe { std::ptr::write_bytes(t as *mut u8, FILL, LEN as usize) };
        slowest = slowest.max(took);
        assert!(took < UNREGISTER_BOUND, "unregister took {took:?}");
        std::thread::sleep(Duration::from_millis(50));
        if stop_child {
            // SAFETY: as above; reads only.
            let landed = unsafe { not_equal(t, LEN, FILL) };
            assert_eq!(landed, 0, "round {round}: a byte landed");
            child.signal(libc::SIGCONT);
        }
        std::thread::sleep(Duration::from_millis(50));
        let counts = child.call(json!({"cmd": "stop_stream"}), None);
        // SAFETY: as above.
        let landed = unsafe { not_equal(t, LEN, FILL) };
        assert_eq!(
            landed, 0,
            "round {round}: {landed} bytes landed after unregister; {counts}"
        );
        assert!(count(&counts, "Done") > 0, "{counts}");
        rejected += count(&counts, "Rejected");
        if shared {
            local.shm.free(t).unwrap();
        }
    }
    let mapped = local.shm.stats().mapped;
    println!(
        "{ROUNDS} rounds (child stopped: {stop_child}, memfd buffers: {shared}): unregister \
         took at most {slowest:?}; {rejected} WRITEs rejected after it; {mapped} bytes mapped"
    );
    assert_eq!(
        mapped > 0,
        shared,
        "memfd buffers are copied through mappings"
    );
    assert!(rejected > 0, "WRITEs after the unregister are rejected");
    child.exit();
    local.shm.shutdown();
}

// The arguments: whether the initiator is stopped (SIGSTOP) while we
// unregister, whether the buffers are the transports' memfd ones.
two_process_tests!(writes_while_unregistering {
    unregister_during_writes_of_a_stopped_initiator(true, false),
    unregister_during_writes_of_a_running_initiator(false, false),
    unregister_during_writes_from_memfd_buffers_of_a_stopped_initiator(true, true),
    unregister_during_writes_from_memfd_buffers_of_a_running_initiator(false, true),
});

// The argument: whether our buffer is a memfd one.
two_process_tests!(reads_while_unregistering {
    a_read_done_never_holds_bytes_written_after_unregister(false),
    a_read_from_a_memfd_buffer_done_never_holds_bytes_written_after_unregister(true),
});

fn reads_while_unregistering(test: &str, shared: bool) {
    let local = Local::start();
    let (child, _) = connected_child(test, &local, shared);
    let dst = child.alloc(DEPTH * SLICE, None, true);
    let mut keep = Vec::new();
    let (mut done, mut failed) = (0, 0);
    for round in 0..ROUNDS {
        let t = target(&local, shared, &mut keep);
        // SAFETY: a fresh buffer of ours.
        unsafe { fill(t, LEN, 33, 0) };
        local.register(t, LEN, true);
        let off = (round as u64 * 4099) % (LEN - SLICE);
        child.call(
            json!({"cmd": "stream", "local": dst, "remote": t + off, "len": SLICE,
                   "write": false, "depth": DEPTH, "expect_seed": 33, "expect_from": off}),
            None,
        );
        let start = Instant::now();
        while count(&child.call(json!({"cmd": "stream_counts"}), None), "Done") < 200 {
            assert!(start.elapsed() < HANG, "the stream does not run");
            std::thread::sleep(Duration::from_millis(1));
        }
        let took = local.unregister(t);
        // The memory is reused at once, again and again: a READ whose copy
        // runs now sees these bytes.
        let reuse = Instant::now();
        while reuse.elapsed() < Duration::from_millis(20) {
            // SAFETY: our buffer, no longer registered.
            unsafe { std::ptr::write_bytes((t + off) as *mut u8, FILL, SLICE as usize) };
        }
        assert!(took < UNREGISTER_BOUND, "unregister took {took:?}");
        std::thread::sleep(Duration::from_millis(30));
        let counts = child.call(json!({"cmd": "stop_stream"}), None);
        assert_eq!(count(&counts, "corrupt"), 0, "round {round}: {counts}");
        assert!(count(&counts, "Rejected") > 0, "round {round}: {counts}");
        done += count(&counts, "Done");
        failed += count(&counts, "Failed { hard: false }");
        if shared {
            local.shm.free(t).unwrap();
        }
    }
    let mapped = child.call(json!({"cmd": "stats"}), None)["mapped"]
        .as_u64()
        .unwrap();
    println!(
        "{ROUNDS} rounds (memfd buffers: {shared}): {done} READs Done with the bytes from \
         before the unregister, {failed} failed because the buffer was unregistered during \
         their copy; {mapped} bytes mapped"
    );
    assert_eq!(
        mapped > 0,
        shared,
        "memfd buffers are copied through mappings"
    );
    child.exit();
    local.shm.shutdown();
}

/// Our READs copied by memcpy from a child's memfd buffer stop at the
/// unregister of their destination: after it returns we unmap the
/// destination (before the fence, a copy still running there killed the
/// process), and every READ ends, Done or failed for its local memory.
#[test]
fn mapped_reads_stop_at_the_unregister_of_their_destination() {
    let test = two_process_test!("mapped_reads_stop_at_the_unregister_of_their_destination");
    let local = Local::start();
    let child = Child::spawn(test, &[], &[]);
    let size = 64u64 << 20;
    let c_src = child.alloc_in(size, Some(7), true, true);
    let peer = child.peer_of(&local);
    let mut failed = 0;
    for _ in 0..ROUNDS {
        // SAFETY: a fresh anonymous mapping of ours.
        let dst = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(dst, libc::MAP_FAILED);
        let dst = dst as u64;
        local.register(dst, size, true);
        let mapped = local.shm.stats().mapped;
        let (tx, rx) = std::sync::mpsc::channel();
        for (i, s) in slices(dst, c_src, size, 1 << 20, false)
            .into_iter()
            .enumerate()
        {
            let tx = tx.clone();
            local.post(&peer, s, move |o| {
                let _ = tx.send((i, o));
            });
        }
        let start = Instant::now();
        while local.shm.stats().mapped == mapped {
            assert!(start.elapsed() < HANG, "nothing is read");
            std::hint::spin_loop();
        }
        local.unregister(dst);
        // SAFETY: our mapping, unregistered: no copy of ours is inside it.
        let unmapped = unsafe { libc::munmap(dst as *mut libc::c_void, size as usize) };
        assert_eq!(unmapped, 0);
        let outcomes: Vec<_> = (0..64)
            .map(|_| rx.recv_timeout(HANG).expect("a READ ended").1)
            .collect();
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, Outcome::Done | Outcome::Local)),
            "{outcomes:?}"
        );
        failed += outcomes.iter().filter(|o| **o != Outcome::Done).count();
        if failed > 0 {
            break;
        }
    }
    assert!(
        failed > 0,
        "every READ ended before the unregister in every round"
    );
    child.exit();
    local.shm.shutdown();
}
