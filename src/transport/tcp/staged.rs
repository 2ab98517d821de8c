//! Slices whose local side is GPU memory, moved over TCP through host
//! buffers: each slice is cut into pieces of one staging buffer, and each
//! piece borrows a buffer from the transport's pool
//! ([`StagingPool`]). A WRITE piece is copied from the GPU into its buffer
//! before it is posted from there; a READ piece is posted into its buffer
//! and copied to the GPU once its bytes have arrived. The CPU never
//! touches GPU memory, and at most the pool's buffers are in use however
//! many slices wait, at most half of them by one peer (the peer's name:
//! all its rails together), so a peer that stops taking our bytes leaves
//! the other half to the others until it is given up on.

use super::{LaneTarget, TcpTransport};
use crate::batch::TaskRef;
use crate::memory::Fence;
use crate::memory::staging::{self, Lent, StagingPool};
use crate::sync;
use crate::transport::{Outcome, Slice};
use std::sync::{Arc, Mutex};

/// Bytes in one staging buffer (and so in one piece).
pub const STAGING_CHUNK: usize = 1 << 20;
/// Staging buffers of one engine's TCP transport.
pub const STAGING_BUFFERS: usize = 32;

/// Where a staged slice's pieces go.
#[derive(Clone)]
struct Route {
    tcp: Arc<TcpTransport>,
    device: Option<String>,
    target: LaneTarget,
}

/// What a slice's pieces have come to so far.
struct Joined {
    /// Pieces not ended yet.
    left: usize,
    /// The first failure, or `Done`.
    outcome: Outcome,
    /// The slice's own completion, called when the last piece ends.
    done: Option<Box<dyn FnOnce(Outcome) + Send>>,
}

/// The outcome of a slice cut into pieces: the first failure wins, and
/// the slice ends when its last piece does.
struct Join(Mutex<Joined>);

impl Join {
    fn new(pieces: usize, done: Box<dyn FnOnce(Outcome) + Send>) -> Arc<Join> {
        Arc::new(Join(Mutex::new(Joined {
            left: pieces,
            outcome: Outcome::Done,
            done: Some(done),
        })))
    }

    /// One piece ended with `outcome`.
    fn piece(&self, outcome: Outcome) {
        let done = {
            let mut j = sync::lock(&self.0);
            if j.outcome == Outcome::Done {
                j.outcome = outcome;
            }
            j.left -= 1;
            if j.left > 0 {
                return;
            }
            let outcome = j.outcome;
            j.done.take().map(|d| (d, outcome))
        };
        if let Some((done, outcome)) = done {
            done(outcome);
        }
    }
}

/// Posts `slice`, whose local side is memory of GPU `gpu`, to `target`
/// through buffers of `pool`.
pub fn post(
    tcp: &Arc<TcpTransport>,
    pool: &StagingPool,
    device: Option<&str>,
    target: &LaneTarget,
    slice: Slice,
    gpu: u32,
) {
    let chunk = pool.chunk() as u64;
    let Slice {
        local,
        remote,
        len,
        write,
        local_fence,
        task,
        done,
        ..
    } = slice;
    let pieces = len.div_ceil(chunk).max(1);
    let join = Join::new(pieces as usize, done);
    let route = Route {
        tcp: tcp.clone(),
        device: device.map(str::to_string),
        target: target.clone(),
    };
    for i in 0..pieces {
        let off = i * chunk;
        let piece = Piece {
            local: local + off,
            remote: remote + off,
            len: (len - off).min(chunk),
            write,
            gpu,
            fence: local_fence.clone(),
            task: task.clone(),
        };
        let (route, join) = (route.clone(), join.clone());
        pool.lend(
            &target.name,
            gpu,
            Box::new(move |lent| match lent {
                Some(lent) => piece.run(&route, lent, join),
                None => join.piece(Outcome::Failed { hard: false }),
            }),
        );
    }
}

/// One buffer's worth of a staged slice.
struct Piece {
    local: u64,
    remote: u64,
    len: u64,
    write: bool,
    gpu: u32,
    /// The fence of the registered GPU buffer it moves, held across each
    /// driver copy of it.
    fence: Option<Arc<Fence>>,
    /// The slice's task: a piece of a cancelled one is not begun, and a
    /// READ piece's bytes are not copied to the GPU then.
    task: Option<TaskRef>,
}

/// Copies `len` bytes from `src` to `dst` with the driver, inside `fence`
/// (the GPU side's buffer); `Err(None)` once the fence refuses, `Err(why)`
/// when the driver fails.
///
/// # Safety
/// As [`staging::copy`], for GPU memory that `fence` (if any) guards.
unsafe fn fenced_copy(
    dst: u64,
    src: u64,
    len: u64,
    gpu: u32,
    fence: Option<&Fence>,
) -> Result<(), Option<String>> {
    let inside = match fence.map(Fence::enter) {
        Some(None) => return Err(None),
        inside => inside.flatten(),
    };
    // SAFETY: guaranteed by the caller; the GPU buffer, where registered,
    // stays registered until we leave its fence.
    let copied = unsafe { staging::copy(dst, src, len as usize, gpu) };
    drop(inside);
    copied.map_err(Some)
}

impl Piece {
    /// Moves the piece through `lent`, then reports to `join`.
    fn run(self, route: &Route, lent: Lent, join: Arc<Join>) {
        let staged = lent.buffer().addr();
        let Piece {
            local,
            remote,
            len,
            write,
            gpu,
            fence,
            task,
        } = self;
        let canceled = |t: &Option<TaskRef>| t.as_ref().is_some_and(TaskRef::canceled);
        if canceled(&task) {
            return join.piece(Outcome::Canceled);
        }
        if write {
            // SAFETY: the caller's GPU source stays valid until its task
            // ends, as the C API requires (and registered, inside its
            // fence); the buffer is lent to us alone.
            match unsafe { fenced_copy(staged, local, len, gpu, fence.as_deref()) } {
                Ok(()) => {}
                Err(None) => return join.piece(Outcome::Local),
                Err(Some(e)) => {
                    crate::log_limit::warn_limited!("tcp: staging a WRITE from GPU {gpu}: {e}");
                    return join.piece(Outcome::Failed { hard: false });
                }
            }
        }
        let inner = task.clone();
        let done = Box::new(move |outcome: Outcome| {
            let outcome = match (outcome, write) {
                (Outcome::Done, false) if canceled(&task) => Outcome::Canceled,
                (Outcome::Done, false) => {
                    // SAFETY: the READ's bytes are in the lent buffer; the
                    // GPU destination stays valid until its task ends (and
                    // registered, inside its fence).
                    match unsafe { fenced_copy(local, staged, len, gpu, fence.as_deref()) } {
                        Ok(()) => Outcome::Done,
                        Err(None) => Outcome::Local,
                        Err(Some(e)) => {
                            crate::log_limit::warn_limited!(
                                "tcp: staging a READ into GPU {gpu}: {e}"
                            );
                            Outcome::Failed { hard: false }
                        }
                    }
                }
                (o, _) => o,
            };
            drop(lent);
            join.piece(outcome);
        });
        route.tcp.post(
            route.device.as_deref(),
            &route.target,
            Slice {
                local: staged,
                remote,
                len,
                write,
                local_gpu: None,
                // The staging buffer is the transport's own.
                local_fence: None,
                task: inner,
                done,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_joined_slice_ends_with_its_last_piece_and_its_first_failure() {
        let (tx, rx) = mpsc::channel();
        let join = Join::new(3, Box::new(move |o| tx.send(o).expect("send")));
        join.piece(Outcome::Done);
        join.piece(Outcome::Rejected);
        assert!(rx.try_recv().is_err(), "ended before its last piece");
        join.piece(Outcome::Failed { hard: true });
        assert_eq!(rx.recv().expect("ended"), Outcome::Rejected);
    }
}
