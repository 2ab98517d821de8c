//! Test doubles of the GPU libraries (tests/support/cuda_driver_double.c,
//! also built as MUSA's, and tests/support/hip_runtime_double.c), built
//! with `cc` and loaded into the test process in place of the real ones:
//! NOT a GPU, and no GPU coverage. Their "device memory" is mapped
//! PROT_NONE (a CPU touch kills the process); its bytes live where only
//! the doubles' copy calls and [`DriverDouble::fill`] /
//! [`DriverDouble::contents`] reach them.

use super::pattern;
use libloading::Library;
use std::path::PathBuf;
use std::process::Command;

/// Which GPU library a double stands in for.
#[derive(Clone, Copy)]
pub enum Kind {
    /// CUDA's driver, `libcuda.so.1`.
    Cuda,
    /// MUSA's driver, `libmusa.so.1`.
    Musa,
    /// HIP's runtime, `libamdhip64.so.6`.
    Hip,
}

/// A driver double, built and loaded into this process (each test is a
/// process of its own under nextest).
pub struct DriverDouble {
    library: Library,
    alloc: &'static [u8],
    _dir: PathBuf,
}

impl DriverDouble {
    /// The CUDA driver's double.
    pub fn load() -> DriverDouble {
        DriverDouble::load_kind(Kind::Cuda)
    }

    /// The double of `kind`, built with `cc` into a temporary directory.
    pub fn load_kind(kind: Kind) -> DriverDouble {
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
    pub fn alloc(&self, len: usize, ordinal: i32) -> u64 {
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

    /// A counter of the CUDA double (`te_cuda_double_queries`: pointer
    /// queries, `te_cuda_double_copies`: copies).
    pub fn count(&self, name: &[u8]) -> i64 {
        // SAFETY: the double's counters have this signature.
        unsafe {
            let f = self
                .library
                .get::<unsafe extern "C" fn() -> i64>(name)
                .expect("the double's counter");
            f()
        }
    }

    /// How many times the engine asked the CUDA double about a pointer.
    pub fn queries(&self) -> i64 {
        self.count(b"te_cuda_double_queries\0")
    }

    /// How many copies the CUDA double made.
    pub fn copies(&self) -> i64 {
        self.count(b"te_cuda_double_copies\0")
    }

    /// Writes [`pattern`]`(len, seed)` into the double's GPU memory at
    /// `dev` (without a copy call).
    pub fn fill(&self, dev: u64, len: usize, seed: u8) {
        let bytes = pattern(len, seed);
        // SAFETY: the double's function has this signature; it reads
        // `len` bytes of `bytes`.
        let rc = unsafe {
            let f = self
                .library
                .get::<unsafe extern "C" fn(u64, *const u8, usize) -> i32>(
                    b"te_cuda_double_write\0",
                )
                .expect("te_cuda_double_write");
            f(dev, bytes.as_ptr(), len)
        };
        assert_eq!(rc, 0, "the double holds {dev:#x}+{len}");
    }

    /// The bytes of the double's GPU memory at `dev` (without a copy call).
    pub fn contents(&self, dev: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: the double's function has this signature; it writes
        // `len` bytes of `out`.
        let rc = unsafe {
            let f = self
                .library
                .get::<unsafe extern "C" fn(*mut u8, u64, usize) -> i32>(b"te_cuda_double_read\0")
                .expect("te_cuda_double_read");
            f(out.as_mut_ptr(), dev, len)
        };
        assert_eq!(rc, 0, "the double holds {dev:#x}+{len}");
        out
    }
}
