//! GPU memory is detected and never copied with the CPU, tested with a
//! test double of the CUDA driver (tests/support/cuda_driver_double.c):
//! NOT a GPU. The double's "device memory" is mapped PROT_NONE, so a CPU
//! copy of it would kill the test process; its bytes live where only the
//! double's copy calls reach them. The tests check that requests to and
//! from it over TCP and within the process move every byte through the
//! driver's copies, and that other vendors' GPU memory is refused before
//! a byte moves, with the reason. Real GPUs: scripts/gpu-check.sh.

use crate::common;

use common::gpu_double::{DriverDouble, Kind};
use common::{Buf, engine, engine_with, pattern, read_req, register, run, write_req};
use transfer_engine::{
    Engine, LOCAL_SEGMENT_ID, Location, Region, Residence, TaskStatus, Vendor, residence,
};

const LEN: u64 = 1 << 20;

fn register_at(e: &Engine, addr: u64, location: &str) {
    e.register(&[Region {
        addr,
        length: LEN,
        location: Location::parse(location).expect("location"),
        remote_accessible: true,
    }])
    .expect("register");
}

fn location_of(e: &Engine, seg: i32, addr: u64) -> String {
    e.segment_buffers(seg)
        .expect("buffers")
        .into_iter()
        .find(|b| b.addr == addr)
        .expect("the buffer is listed")
        .location
}

/// Runs one request; asserts it FAILED and returns its reason.
fn failed(e: &Engine, req: transfer_engine::Request) -> String {
    let b = e.allocate_batch(1).expect("batch");
    e.submit(b, &[req]).expect("submit");
    let status = common::wait_task(e, b, 0, std::time::Duration::from_secs(30));
    assert_eq!(status, TaskStatus::Failed);
    let why = e.failure_reason(b, 0).expect("reason").expect("a reason");
    e.free_batch(b).expect("free");
    why
}

#[test]
fn without_a_driver_in_the_process_every_address_is_host_memory() {
    let b = Buf::new(4096, 1);
    assert_eq!(residence(b.addr(), 4096), Residence::Host);
    // An address no allocation holds, too: nothing is asked of memory.
    assert_eq!(residence(0x10, 1), Residence::Host);
}

#[test]
fn gpu_buffers_are_located_at_their_gpu() {
    let cuda = DriverDouble::load();
    let dev = cuda.alloc(LEN as usize, 1);
    assert_eq!(residence(dev, LEN), Residence::Device(1));
    let host = Buf::new(LEN as usize, 2);
    assert_eq!(residence(host.addr(), LEN), Residence::Host);

    let e = engine();
    // Whatever the caller says, the buffer is located at its GPU (RDMA
    // publishes the location; Mooncake's TCP descriptor carries none).
    register_at(&e, dev, "cpu:0");
    register_at(&e, host.addr(), "cuda:1");
    assert_eq!(location_of(&e, LOCAL_SEGMENT_ID, dev), "cuda:1");
    // A host buffer keeps the location its caller gave.
    assert_eq!(location_of(&e, LOCAL_SEGMENT_ID, host.addr()), "cuda:1");
    assert!(cuda.queries() > 0, "the engine asked the driver double");
}

#[test]
fn tcp_stages_gpu_memory_on_either_side() {
    let cuda = DriverDouble::load();
    let dev_remote = cuda.alloc(LEN as usize, 0);
    let dev_local = cuda.alloc(LEN as usize, 1);
    let target = engine();
    let me = engine();
    let remote_host = Buf::zeroed(LEN as usize);
    register_at(&target, dev_remote, "cuda:0");
    register(&target, &remote_host, true);
    let src = Buf::new(LEN as usize, 7);
    let dst = Buf::zeroed(LEN as usize);
    register(&me, &src, false);
    register(&me, &dst, false);
    register_at(&me, dev_local, "cuda:1");
    cuda.fill(dev_local, LEN as usize, 11);
    let seg = me.open_segment(target.local_name()).expect("open");
    let done = |reqs: &[transfer_engine::Request]| {
        assert!(
            run(&me, reqs).iter().all(|s| *s == TaskStatus::Completed),
            "every request completed"
        );
    };

    // Host memory into the peer's GPU buffer, and back out of it.
    done(&[write_req(src.addr(), seg, dev_remote, LEN)]);
    assert_eq!(
        cuda.contents(dev_remote, LEN as usize),
        pattern(LEN as usize, 7)
    );
    done(&[read_req(dst.addr() + 3, seg, dev_remote + 4096, 4093)]);
    assert_eq!(
        dst.snapshot()[3..4096],
        pattern(LEN as usize, 7)[4096..4096 + 4093]
    );
    // From this process's GPU buffer to the peer's host memory, and a READ
    // into it at an unaligned offset.
    done(&[write_req(dev_local, seg, remote_host.addr(), LEN)]);
    assert_eq!(remote_host.snapshot(), pattern(LEN as usize, 11));
    done(&[read_req(dev_local + 8, seg, remote_host.addr() + 100, 64)]);
    let mut want = pattern(LEN as usize, 11);
    want.copy_within(100..164, 8);
    assert_eq!(cuda.contents(dev_local, LEN as usize), want);
    // GPU to GPU, and a GPU source nobody registered.
    done(&[write_req(dev_local, seg, dev_remote, LEN)]);
    assert_eq!(cuda.contents(dev_remote, LEN as usize), want);
    let unregistered = cuda.alloc(4096, 3);
    cuda.fill(unregistered, 4096, 5);
    done(&[write_req(unregistered, seg, remote_host.addr(), 4096)]);
    assert_eq!(remote_host.snapshot()[..4096], pattern(4096, 5));
    assert!(cuda.copies() > 0, "the driver double copied");

    // A range past the end of the peer's GPU buffer is still refused.
    failed(&me, write_req(src.addr(), seg, dev_remote + 8, LEN));
}

#[test]
fn slices_longer_than_a_staging_buffer_are_staged_in_pieces() {
    const BIG: u64 = 3 * (1 << 20) + 5;
    let cuda = DriverDouble::load();
    let dev_remote = cuda.alloc(BIG as usize, 0);
    let dev_local = cuda.alloc(BIG as usize, 1);
    // One slice per request: 3 MiB + 5 cut into four staging pieces.
    let slices = [("MC_SLICE_SIZE", "8388608")];
    let target = engine_with(&slices);
    let me = engine_with(&slices);
    for (e, dev, loc) in [(&target, dev_remote, "cuda:0"), (&me, dev_local, "cuda:1")] {
        e.register(&[Region {
            addr: dev,
            length: BIG,
            location: Location::parse(loc).expect("location"),
            remote_accessible: true,
        }])
        .expect("register");
    }
    cuda.fill(dev_local, BIG as usize, 21);
    let seg = me.open_segment(target.local_name()).expect("open");
    assert_eq!(
        run(&me, &[write_req(dev_local, seg, dev_remote, BIG)]),
        vec![TaskStatus::Completed]
    );
    assert_eq!(
        cuda.contents(dev_remote, BIG as usize),
        pattern(BIG as usize, 21)
    );
    cuda.fill(dev_remote, BIG as usize, 22);
    assert_eq!(
        run(&me, &[read_req(dev_local, seg, dev_remote, BIG)]),
        vec![TaskStatus::Completed]
    );
    assert_eq!(
        cuda.contents(dev_local, BIG as usize),
        pattern(BIG as usize, 22)
    );
}

#[test]
fn copies_within_the_process_move_gpu_memory_with_the_driver() {
    let cuda = DriverDouble::load();
    let dev = cuda.alloc(LEN as usize, 2);
    let other = cuda.alloc(LEN as usize, 3);
    let e = engine();
    let host = Buf::new(LEN as usize, 9);
    register(&e, &host, true);
    register_at(&e, dev, "cuda:2");
    register_at(&e, other, "cuda:3");
    let ok = |req| assert_eq!(run(&e, &[req]), vec![TaskStatus::Completed]);
    let copies = cuda.copies();
    // Host to GPU (sliced over the copy threads), GPU to GPU, GPU to host.
    ok(write_req(host.addr(), LOCAL_SEGMENT_ID, dev, LEN));
    assert_eq!(cuda.contents(dev, LEN as usize), pattern(LEN as usize, 9));
    ok(write_req(dev, LOCAL_SEGMENT_ID, other, LEN));
    assert_eq!(cuda.contents(other, LEN as usize), pattern(LEN as usize, 9));
    cuda.fill(other, LEN as usize, 4);
    ok(read_req(host.addr() + 1, LOCAL_SEGMENT_ID, other + 1, 4095));
    let mut want = pattern(LEN as usize, 9);
    want[1..4096].copy_from_slice(&pattern(LEN as usize, 4)[1..4096]);
    assert_eq!(host.snapshot(), want);
    assert!(cuda.copies() > copies, "the driver double copied");
}

/// Another vendor's GPU memory: located, refused at registration and in
/// every request (as source over TCP, in a copy within the process),
/// before a byte moves; host buffers beside it still move.
fn other_vendors_memory_is_refused(kind: Kind, vendor: Vendor) {
    // Looked for before the library is loaded, and found once it is.
    let early = Buf::new(4096, 1);
    assert_eq!(residence(early.addr(), 4096), Residence::Host);
    let double = DriverDouble::load_kind(kind);
    let dev = double.alloc(LEN as usize, 1);
    assert_eq!(residence(dev, LEN), Residence::Foreign(vendor, 1));
    let host = Buf::new(LEN as usize, 3);
    assert_eq!(residence(host.addr(), LEN), Residence::Host);
    let name = format!("{vendor} GPU 1");

    let target = engine();
    let me = engine();
    let err = me
        .register(&[Region {
            addr: dev,
            length: LEN,
            location: Location::parse("cpu:0").expect("location"),
            remote_accessible: true,
        }])
        .expect_err("registering another vendor's GPU memory is refused");
    assert!(err.to_string().contains(&name), "{err}");
    let remote = Buf::zeroed(LEN as usize);
    register(&target, &remote, true);
    register(&me, &host, true);
    let seg = me.open_segment(target.local_name()).expect("open");
    let why = failed(&me, write_req(dev, seg, remote.addr(), LEN));
    assert!(why.contains(&name), "{why}");
    let why = failed(&me, read_req(dev + 8, seg, remote.addr(), 64));
    assert!(why.contains(&name), "{why}");
    let why = failed(&me, write_req(dev, LOCAL_SEGMENT_ID, host.addr(), 4096));
    assert!(why.contains(&name), "{why}");
    assert!(remote.snapshot().iter().all(|&b| b == 0), "no byte moved");
    assert_eq!(
        run(&me, &[write_req(host.addr(), seg, remote.addr(), LEN)]),
        vec![TaskStatus::Completed]
    );
    assert_eq!(remote.snapshot(), pattern(LEN as usize, 3));
}

#[test]
fn musa_memory_is_refused_before_a_byte_moves() {
    other_vendors_memory_is_refused(Kind::Musa, Vendor::Musa);
}

#[test]
fn hip_memory_is_refused_before_a_byte_moves() {
    other_vendors_memory_is_refused(Kind::Hip, Vendor::Hip);
}
