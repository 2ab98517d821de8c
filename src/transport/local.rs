//! The local path: copies between buffers of this process. Small requests
//! are copied by the submitting thread; larger ones are cut into slices that
//! a pool of copy threads (one per core) and the threads polling for status
//! share, so a large request runs on more than one core. Where either
//! side is GPU memory the CUDA driver copies instead of the CPU
//! ([`crate::memory::staging::copy`]).
//!
//! A slice on the copy threads holds the fences of the registered buffers
//! its two ranges overlap ([`crate::memory::fence`]) while it touches
//! them, in pieces of at most [`FENCED_PIECE`]: unregistering one of those
//! buffers waits for the piece being copied at most, and the copy's later
//! pieces fail, so no byte of a local copy lands in (or is read from) a
//! range once its unregistration has returned. (A request of one slice is
//! copied by the submitting thread under the registry's read lock, which
//! unregistering waits for.)

use crate::batch::TaskRef;
use crate::memory::fence::Fence;
use crate::memory::staging;
use crate::sync;
use crossbeam_channel::{Receiver, Sender};
use once_cell::sync::OnceCell;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tracing::warn;

/// One slice to copy, and what to do once it is copied.
pub struct CopyJob {
    /// Destination address.
    pub dst: usize,
    /// Source address.
    pub src: usize,
    /// Bytes to copy.
    pub len: usize,
    /// The GPU in whose context the driver copies, when either side is
    /// GPU memory (`None`: both are host memory, copied by the CPU).
    pub gpu: Option<u32>,
    /// The fences of the registered buffers either side overlaps.
    pub fences: Arc<[Arc<Fence>]>,
    /// Its task: the slice of a cancelled one is not copied.
    pub task: Option<TaskRef>,
    /// Called once, after the copy, with why it failed if it did.
    pub done: Box<dyn FnOnce(Result<(), String>) + Send>,
}

/// Copies `len` bytes from `src` to `dst` (the ranges may overlap).
///
/// # Safety
/// Both ranges must be valid, mapped memory of this process for `len` bytes
/// and no other thread may write them during the copy.
pub unsafe fn copy_bytes(src: u64, dst: u64, len: u64) {
    // SAFETY: guaranteed by the caller; `copy` tolerates overlap.
    unsafe {
        std::ptr::copy(
            src as usize as *const u8,
            dst as usize as *mut u8,
            len as usize,
        )
    };
}

/// Copies `len` bytes from `src` to `dst`: by the CPU when `gpu` is
/// `None`, else by the CUDA driver in GPU `gpu`'s context (either side
/// may be GPU memory then; the ranges must not overlap).
///
/// # Safety
/// As [`copy_bytes`], for host or GPU memory.
pub unsafe fn copy_any(src: u64, dst: u64, len: u64, gpu: Option<u32>) -> Result<(), String> {
    match gpu {
        // SAFETY: guaranteed by the caller.
        None => unsafe { copy_bytes(src, dst, len) },
        // SAFETY: guaranteed by the caller; the driver tells host from GPU
        // memory by the addresses.
        Some(gpu) => unsafe { staging::copy(dst, src, len as usize, gpu) }?,
    }
    Ok(())
}

/// Bytes a fenced copy moves at a time inside its fences.
pub const FENCED_PIECE: u64 = 256 << 10;

/// [`copy_any`] inside `fences`, in pieces of at most [`FENCED_PIECE`]
/// (from the end when the ranges overlap with `dst` above `src`); fails
/// once one of them is revoked (its buffer was unregistered), the pieces
/// copied before staying copied.
///
/// # Safety
/// As [`copy_any`], for the part of each range that no revoked fence
/// guards: a range that lies in a buffer with one of `fences` needs to be
/// valid only while that fence admits.
pub unsafe fn copy_fenced(
    src: u64,
    dst: u64,
    len: u64,
    gpu: Option<u32>,
    fences: &[Arc<Fence>],
) -> Result<(), String> {
    if fences.is_empty() {
        // SAFETY: guaranteed by the caller.
        return unsafe { copy_any(src, dst, len, gpu) };
    }
    let upwards = dst > src && dst < src.saturating_add(len);
    let pieces = len.div_ceil(FENCED_PIECE);
    let mut inside = Vec::with_capacity(fences.len());
    for k in 0..pieces {
        let off = if upwards { pieces - 1 - k } else { k } * FENCED_PIECE;
        let n = (len - off).min(FENCED_PIECE);
        inside.clear();
        for f in fences {
            match f.enter() {
                Some(g) => inside.push(g),
                None => {
                    return Err(format!(
                        "a buffer the copy of {len} bytes from {src:#x} to {dst:#x} reads or \
                         writes was unregistered during it"
                    ));
                }
            }
        }
        // SAFETY: guaranteed by the caller; every fence of a registered
        // buffer the piece touches admitted us, so none is unregistered
        // until we leave.
        unsafe { copy_any(src + off, dst + off, n, gpu) }?;
    }
    Ok(())
}

impl CopyJob {
    /// Copies the bytes inside their fences and reports the slice done
    /// (a slice of a cancelled task is not copied, and fails).
    pub fn run(self) {
        if self.task.as_ref().is_some_and(TaskRef::canceled) {
            return (self.done)(Err(
                "the task was cancelled before this slice was copied".into()
            ));
        }
        // SAFETY: the engine built this job from a destination or source
        // range it checked against the registry, and from the caller's
        // source pointer, which the C API requires to stay valid until the
        // task is terminal; the fences are those of every registered buffer
        // either range overlaps.
        let copied = unsafe {
            copy_fenced(
                self.src as u64,
                self.dst as u64,
                self.len as u64,
                self.gpu,
                &self.fences,
            )
        };
        (self.done)(copied);
    }
}

struct Pool {
    tx: Mutex<Option<Sender<CopyJob>>>,
    rx: Receiver<CopyJob>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// The copy-thread pool of one engine, started on first use.
#[derive(Default)]
pub struct LocalCopier {
    pool: OnceCell<Pool>,
}

fn start_pool() -> Pool {
    let (tx, rx) = crossbeam_channel::unbounded::<CopyJob>();
    let n = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    let mut threads = Vec::with_capacity(n);
    for i in 0..n {
        let rx = rx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("te-copy-{i}"))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job.run();
                }
            });
        match spawned {
            Ok(h) => threads.push(h),
            Err(e) => warn!("could not start copy thread {i}: {e}; copies use fewer threads"),
        }
    }
    Pool {
        tx: Mutex::new(Some(tx)),
        rx,
        threads: Mutex::new(threads),
    }
}

impl LocalCopier {
    /// Queues `job` for the copy threads; runs it here if the pool is closed.
    pub fn dispatch(&self, job: CopyJob) {
        let pool = self.pool.get_or_init(start_pool);
        let tx = sync::lock(&pool.tx);
        match tx.as_ref() {
            Some(tx) => {
                if let Err(e) = tx.send(job) {
                    e.into_inner().run();
                }
            }
            None => {
                drop(tx);
                job.run();
            }
        }
    }

    /// Runs one queued slice on the calling thread, if any is waiting.
    /// Returns whether it did.
    pub fn help_one(&self) -> bool {
        match self.pool.get().map(|p| p.rx.try_recv()) {
            Some(Ok(job)) => {
                job.run();
                true
            }
            _ => false,
        }
    }

    /// Closes the queue, lets the threads finish what was queued, and joins
    /// them. Later dispatches copy on the caller's thread.
    pub fn shutdown(&self) {
        let Some(pool) = self.pool.get() else {
            return;
        };
        sync::lock(&pool.tx).take();
        let threads = std::mem::take(&mut *sync::lock(&pool.threads));
        for t in threads {
            if t.join().is_err() {
                warn!("a copy thread panicked");
            }
        }
        while self.help_one() {}
    }
}
