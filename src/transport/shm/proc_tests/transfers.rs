//! Two processes on one host: 1 B to 64 MiB at odd offsets, WRITE and READ
//! at once from 8 threads, over the shared-memory transport; every byte of
//! both buffers is checked by the side that owns it (the copies, and the
//! gaps between them untouched), and the transport's counters account for
//! every byte. Then the other way round: the child initiates. Once with
//! heap buffers (cross-memory attach), once with buffers of the
//! transport's memfd allocator (memcpy from mappings).

use super::harness::*;
use crate::transport::Outcome;
use serde_json::json;
use std::sync::Arc;

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
/// The planner's default slice size.
const SLICE: u64 = 65536;
const GAP: u64 = 8;

/// Where transfer `i` starts in the layout (before its odd offset).
fn starts() -> Vec<u64> {
    let mut at = 0;
    SIZES
        .iter()
        .map(|&len| {
            let s = at;
            at += len + GAP;
            s
        })
        .collect()
}

fn total() -> u64 {
    SIZES.iter().map(|l| l + GAP).sum::<u64>() + GAP
}

/// Slices of one transfer, as the planner cuts them.
fn planned(local: u64, remote: u64, len: u64, write: bool) -> Vec<(u64, u64, u64, bool)> {
    slices(local, remote, len, SLICE, write)
}

// The argument: whether the buffers are the transports' memfd ones.
two_process_tests!(every_size {
    every_size_at_odd_offsets_both_ways_from_8_threads(false),
    every_size_between_memfd_buffers(true),
});

/// A buffer of ours, by address.
struct Mine(u64);

impl Mine {
    fn addr(&self) -> u64 {
        self.0
    }
}

fn every_size(test: &str, shared: bool) {
    let local = Arc::new(Local::start());
    let child = Child::spawn(test, &[], &[]);
    let size = total();
    let mut keep = Vec::new();
    // WRITE: our pattern 11 into the child's zeros; READ: the child's
    // pattern 22 into our zeros.
    let src = Mine(local.buffer(size, shared, &mut keep));
    // SAFETY: a fresh buffer of ours.
    unsafe { fill(src.addr(), size, 11, 0) };
    let dst = Mine(local.buffer(size, shared, &mut keep));
    local.register(src.addr(), size, true);
    local.register(dst.addr(), size, true);
    let c_dst = child.alloc_in(size, None, true, shared);
    let c_src = child.alloc_in(size, Some(22), true, shared);
    let peer = Arc::new(child.peer_of(&local));
    let st = starts();

    std::thread::scope(|s| {
        for t in 0..8 {
            let (local, peer, st) = (&local, &peer, &st);
            let (src, dst) = (src.addr(), dst.addr());
            s.spawn(move || {
                let mut all = Vec::new();
                for i in (t..SIZES.len()).step_by(8) {
                    let (r, len) = (st[i], SIZES[i]);
                    all.extend(planned(src + r + 1, c_dst + r + 3, len, true));
                    all.extend(planned(dst + r + 1, c_src + r + 3, len, false));
                }
                let out = local.run(peer, &all);
                assert!(
                    out.iter().all(|o| *o == Outcome::Done),
                    "thread {t}: {:?}",
                    tally(&out)
                );
            });
        }
    });

    // The child checks its buffer: each copy holds our bytes, the gaps
    // are still zero.
    let mut gap_from = 0;
    for (i, &r) in st.iter().enumerate() {
        let len = SIZES[i];
        let c = child.check(c_dst + r + 3, len, 11, r + 1);
        assert_eq!(c["bad"], json!(0), "WRITE of {len} B: {c}");
        let g = child.call(
            json!({"cmd": "not_equal", "addr": c_dst + gap_from, "len": r + 3 - gap_from, "value": 0}),
            None,
        );
        assert_eq!(g["bad"], json!(0), "bytes before the WRITE of {len} B");
        gap_from = r + 3 + len;
    }
    let g = child.call(
        json!({"cmd": "not_equal", "addr": c_dst + gap_from, "len": size - gap_from, "value": 0}),
        None,
    );
    assert_eq!(g["bad"], json!(0), "bytes after the last WRITE");
    // We check ours the same way.
    let mut gap_from = 0;
    for (i, &r) in st.iter().enumerate() {
        let len = SIZES[i];
        // SAFETY: our buffer; every READ into it has ended.
        let (bad, first) = unsafe { mismatches(dst.addr() + r + 1, len, 22, r + 3) };
        assert_eq!(bad, 0, "READ of {len} B: first bad byte {first:?}");
        // SAFETY: as above.
        let gap = unsafe { not_equal(dst.addr() + gap_from, r + 1 - gap_from, 0) };
        assert_eq!(gap, 0, "bytes before the READ of {len} B");
        gap_from = r + 1 + len;
    }
    // SAFETY: as above.
    let tail = unsafe { not_equal(dst.addr() + gap_from, size - gap_from, 0) };
    assert_eq!(tail, 0);

    // The transport's own counters saw every byte.
    let moved: u64 = SIZES.iter().sum();
    let ours = local.shm.stats();
    assert_eq!((ours.written, ours.read), (moved, moved));
    let theirs = child.call(json!({"cmd": "stats"}), None);
    assert_eq!(theirs["served"], json!(moved));
    assert_eq!(theirs["served_peers"], json!(1));
    // Memfd buffers were copied through mappings, the others by
    // cross-memory attach.
    let mapped = if shared { moved } else { 0 };
    assert_eq!(
        (ours.mapped, theirs["mapped"].as_u64().unwrap()),
        (mapped, mapped)
    );

    // The other way round: the child initiates, we are the target.
    let ok = child.call(
        json!({"cmd": "connect", "shm": local.shm.descriptor()}),
        None,
    );
    assert_eq!(ok["ok"], json!(true));
    let target = Mine(local.buffer(4 << 20, shared, &mut keep));
    local.register(target.addr(), 4 << 20, true);
    let mut batch = planned(c_src + 5, target.addr() + 1, (4 << 20) - 9, true);
    batch.extend(planned(c_dst + 7, src.addr() + 3, (4 << 20) - 13, false));
    child.run_expecting(json!(batch), &local, "Done");
    // SAFETY: our buffer; the WRITEs into it have ended.
    let (bad, first) = unsafe { mismatches(target.addr() + 1, (4 << 20) - 9, 22, 5) };
    assert_eq!(bad, 0, "first bad byte {first:?}");
    // SAFETY: as above.
    unsafe {
        assert_eq!(not_equal(target.addr(), 1, 0), 0);
        assert_eq!(not_equal(target.addr() + (4 << 20) - 8, 8, 0), 0);
    }
    let c = child.check(c_dst + 7, (4 << 20) - 13, 11, 3);
    assert_eq!(c["bad"], json!(0), "the child's READ: {c}");
    assert_eq!(local.shm.stats().served, (4 << 20) - 9);
    let mapped_served = if shared { (4 << 20) - 9 } else { 0 };
    assert_eq!(local.shm.stats().mapped, mapped + mapped_served);
    child.exit();
    drop(peer);
    local.shm.shutdown();
}
