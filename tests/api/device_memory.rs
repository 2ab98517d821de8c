//! GPU memory is detected and never copied with the CPU, tested with a
//! test double of the CUDA driver (tests/support/cuda_driver_double.c):
//! NOT a GPU. The double's "device memory" is mapped PROT_NONE, so a CPU
//! copy of it would kill the test process; the tests check that every
//! request to or from it over TCP or within the process fails before a
//! byte moves, with the reason, and that the engine's host buffers still
//! move bytes beside it. Real GPUs: scripts/gpu-check.sh.

use crate::common;

use common::{Buf, engine, pattern, read_req, register, run, write_req};
use libloading::Library;
use std::path::PathBuf;
use std::process::Command;
use transfer_engine::{
    Engine, LOCAL_SEGMENT_ID, Location, Region, Residence, TaskStatus, Vendor, residence,
};

/// Which GPU library a double stands in for.
#[derive(Clone, Copy)]
enum Kind {
    Cuda,
    Musa,
    Hip,
}

/// A driver double, built and loaded into this process (each test is a
/// process of its own under nextest).
struct DriverDouble {
    library: Library,
    alloc: &'static [u8],
    _dir: PathBuf,
}

impl DriverDouble {
    /// The CUDA driver's double.
    fn load() -> DriverDouble {
        DriverDouble::load_kind(Kind::Cuda)
    }

    fn load_kind(kind: Kind) -> DriverDouble {
        let (soname, source, define, alloc): (_, _, &[&str], &'static [u8]) = match kind {
            Kind::Cuda => (
                "libcuda.so.1",
                "cuda_driver_double.c",
                &[],
                b"te_cuda_double_alloc\0",
            ),
            Kind::Musa => (
                "libmusa.so.1",
                "cuda_driver_double.c",
                &["-DTE_DOUBLE_MUSA"],
                b"te_cuda_double_alloc\0",
            ),
            Kind::Hip => (
                "libamdhip64.so.6",
                "hip_runtime_double.c",
                &[],
                b"te_hip_double_alloc\0",
            ),
        };
        let dir = std::env::temp_dir().join(format!("te-gpu-double-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let so = dir.join(soname);
        let source = format!("{}/tests/support/{source}", env!("CARGO_MANIFEST_DIR"));
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror"])
            .args(define)
            .arg(format!("-Wl,-soname,{soname}"))
            .arg("-o")
            .arg(&so)
            .arg(source)
            .output()
            .expect("run cc");
        assert!(
            out.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // SAFETY: the double's initialisers are the C runtime's only.
        let library = unsafe { Library::new(&so) }.expect("load the driver double");
        eprintln!("GPU library: the test double {} (not a GPU)", so.display());
        DriverDouble {
            library,
            alloc,
            _dir: dir,
        }
    }

    /// `len` bytes of the double's "device memory" on GPU `ordinal`.
    fn alloc(&self, len: usize, ordinal: i32) -> u64 {
        // SAFETY: the double's function has this signature.
        let p = unsafe {
            let f = self
                .library
                .get::<unsafe extern "C" fn(usize, i32) -> *mut u8>(self.alloc)
                .expect("the double's allocation function");
            f(len, ordinal)
        };
        assert!(!p.is_null(), "the double's allocation failed");
        p as u64
    }

    /// How many times the engine asked the CUDA double about a pointer.
    fn queries(&self) -> i64 {
        // SAFETY: the double's function has this signature.
        unsafe {
            let f = self
                .library
                .get::<unsafe extern "C" fn() -> i64>(b"te_cuda_double_queries\0")
                .expect("te_cuda_double_queries");
            f()
        }
    }
}

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
fn tcp_refuses_gpu_memory_on_either_side_before_a_byte_moves() {
    let cuda = DriverDouble::load();
    let dev_remote = cuda.alloc(LEN as usize, 0);
    let dev_local = cuda.alloc(LEN as usize, 1);
    let target = engine();
    let me = engine();
    let remote_host = Buf::zeroed(LEN as usize);
    register_at(&target, dev_remote, "cuda:0");
    register(&target, &remote_host, true);
    let src = Buf::new(LEN as usize, 7);
    register(&me, &src, false);
    register_at(&me, dev_local, "cuda:1");
    let seg = me.open_segment(target.local_name()).expect("open");

    // Into and out of the peer's GPU buffer: its data server refuses.
    failed(&me, write_req(src.addr(), seg, dev_remote, LEN));
    failed(&me, read_req(src.addr(), seg, dev_remote + 4096, 4096));
    // From and into a local GPU buffer (registered or not): refused here.
    let why = failed(&me, write_req(dev_local, seg, remote_host.addr(), LEN));
    assert!(why.contains("GPU 1") && why.contains("tcp"), "{why}");
    let why = failed(&me, read_req(dev_local + 8, seg, remote_host.addr(), 64));
    assert!(why.contains("GPU 1"), "{why}");
    let unregistered = cuda.alloc(4096, 3);
    let why = failed(&me, write_req(unregistered, seg, remote_host.addr(), 4096));
    assert!(why.contains("GPU 3"), "{why}");
    assert!(
        remote_host.snapshot().iter().all(|&b| b == 0),
        "no byte moved"
    );

    // Host buffers beside them still move every byte.
    assert_eq!(
        run(&me, &[write_req(src.addr(), seg, remote_host.addr(), LEN)]),
        vec![TaskStatus::Completed]
    );
    assert_eq!(remote_host.snapshot(), pattern(LEN as usize, 7));
}

#[test]
fn copies_within_the_process_refuse_gpu_memory() {
    let cuda = DriverDouble::load();
    let dev = cuda.alloc(LEN as usize, 2);
    let e = engine();
    let host = Buf::new(LEN as usize, 9);
    register(&e, &host, true);
    register_at(&e, dev, "cuda:2");
    let why = failed(&e, write_req(host.addr(), LOCAL_SEGMENT_ID, dev, LEN));
    assert!(why.contains("target") && why.contains("GPU 2"), "{why}");
    let why = failed(&e, write_req(dev, LOCAL_SEGMENT_ID, host.addr(), 4096));
    assert!(why.contains("source") && why.contains("GPU 2"), "{why}");
    let why = failed(&e, read_req(dev, LOCAL_SEGMENT_ID, host.addr(), 4096));
    assert!(why.contains("GPU 2"), "{why}");
    assert_eq!(host.snapshot(), pattern(LEN as usize, 9), "no byte moved");
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
