//! What one initialized `TransferEngine` holds, and the operations behind
//! its methods, free of Python types so they run with the GIL released.
//!
//! Every operation returns a [`Failure`] carrying the code Mooncake's
//! Python binding returns for it and the engine's error text: the
//! integer-returning methods log the text and return the code, the
//! exception-raising ones raise it.

use crate::local::{self, Local};
use crate::managed::Managed;
use crate::wait;
use std::collections::HashMap;
use std::mem;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use transfer_engine::Error;
use transfer_engine::{Backoff, BatchState, CancelOutcome, WaitOutcome};
use transfer_engine::{Engine, Opcode, Request};

/// A failed operation: Mooncake's return code and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The value the integer-returning method returns.
    pub code: i32,
    /// The engine's explanation.
    pub message: String,
}

impl Failure {
    /// A failure with code `code` and `message`.
    pub fn new(code: i32, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// An engine error in the `0 / ERR_*` family (register, probe, ...).
    pub fn from_engine(e: &Error) -> Failure {
        Failure::new(e.err_code(), e.to_string())
    }

    /// An engine error where Mooncake's binding returns `code` for any
    /// failure (transfers return -1), with `context` before the error text.
    pub fn with_code(code: i32, context: &str, e: &Error) -> Failure {
        Failure::new(code, format!("{context}: {e}"))
    }
}

/// Result of a core operation.
pub type OpResult<T> = std::result::Result<T, Failure>;

/// One request of a transfer as the binding receives it.
#[derive(Debug, Clone, Copy)]
pub struct Piece {
    /// Local address.
    pub local: u64,
    /// Absolute address in the peer's segment.
    pub remote: u64,
    /// Bytes.
    pub len: u64,
}

/// A batch submitted by an asynchronous call, awaiting
/// `get_batch_transfer_status` or `transfer_check_status`.
struct Pending {
    start: Instant,
    bytes: u64,
    tasks: usize,
    /// The objects its requests read or write.
    objects: Vec<Local>,
}

/// A batch given up on (timed out, or left behind by a failed wait) whose
/// tasks may still run, with the objects they read or write.
struct Abandoned {
    batch: u64,
    tasks: usize,
    objects: Vec<Local>,
}

/// An initialized engine with the binding's own state.
pub struct Core {
    /// The engine.
    pub engine: Arc<Engine>,
    /// `allocate_managed_buffer` memory; unmapped after the engine stops.
    pub managed: Mutex<Managed>,
    /// Asynchronous batches by id, each holding its objects.
    pending: Mutex<HashMap<u64, Pending>>,
    /// Batches given up on, each holding its objects: freed once every
    /// task has ended.
    abandoned: Mutex<Vec<Abandoned>>,
    /// Objects of batches that have ended, waiting for a thread that holds
    /// the GIL to release them ([`Core::take_ended`]).
    ended: Mutex<Vec<Local>>,
    /// Objects registered by `register`, by address: kept (with their
    /// buffer export) until unregistered, released after the engine stops.
    pub pinned: Mutex<HashMap<u64, Local>>,
    /// `MC_TRANSFER_TIMEOUT`.
    timeout: Duration,
    /// The [`forks`] count when the engine was created: in a child
    /// `fork()`ed since, the engine has no threads, and its rings, sockets
    /// and metadata are the parent's, so the child never uses or stops it.
    forks: u64,
}

/// Forks this process's lineage has been through: each child adds one
/// (`pthread_atfork`, installed by [`count_forks`]).
static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn forked_child() {
    FORKS.fetch_add(1, Ordering::SeqCst);
}

/// Counts the forks from now on (once per process; the module's init).
pub fn count_forks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only adds to an atomic, which is
        // async-signal-safe, as a child's atfork handler must be.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
        if rc != 0 {
            tracing::warn!("pthread_atfork failed ({rc}): a forked child may misuse an engine");
        }
    });
}

/// The forks so far.
fn forks() -> u64 {
    FORKS.load(Ordering::SeqCst)
}

/// Locks `m`, also after a panic elsewhere poisoned it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Core {
    /// Wraps a created engine whose synchronous transfers wait
    /// `transfer_timeout_secs` (`MC_TRANSFER_TIMEOUT`), plus 1 ns per byte.
    pub fn new(engine: Arc<Engine>, transfer_timeout_secs: u64) -> Core {
        Core {
            engine,
            managed: Mutex::default(),
            pending: Mutex::default(),
            abandoned: Mutex::default(),
            ended: Mutex::default(),
            pinned: Mutex::default(),
            timeout: Duration::from_secs(transfer_timeout_secs),
            forks: forks(),
        }
    }

    /// Whether this process is a child `fork()`ed after the engine was
    /// created (the engine is its parent's).
    pub fn forked(&self) -> bool {
        self.forks != forks()
    }

    /// Frees the abandoned batches whose tasks have all ended; their
    /// objects go to [`Core::ended`].
    fn reap(&self) {
        let Ok(mut list) = self.abandoned.try_lock() else {
            return;
        };
        let mut i = 0;
        while i < list.len() {
            let a = &list[i];
            let over = match self.engine.batch_state(a.batch, a.tasks) {
                Ok(BatchState::Waiting | BatchState::TimedOut) => false,
                Ok(_) => self.engine.free_batch(a.batch).is_ok(),
                // The engine no longer knows the batch: it was shut down,
                // after which no transfer runs.
                Err(_) => true,
            };
            if over {
                let a = list.swap_remove(i);
                self.retire(a.objects);
            } else {
                i += 1;
            }
        }
    }

    /// Gives up on `batch`: it keeps `objects` until its tasks have ended.
    fn abandon(&self, batch: u64, tasks: usize, objects: Vec<Local>) {
        lock(&self.abandoned).push(Abandoned {
            batch,
            tasks,
            objects,
        });
    }

    /// Hands the objects of an ended batch over for release. Dropping them
    /// needs the GIL, which this thread may not hold and must not wait for
    /// while it holds a lock of the core.
    fn retire(&self, objects: Vec<Local>) {
        if !objects.is_empty() {
            lock(&self.ended).extend(objects);
        }
    }

    /// The objects of the batches that have ended, for the caller to drop
    /// while it holds the GIL.
    pub fn take_ended(&self) -> Vec<Local> {
        mem::take(&mut *lock(&self.ended))
    }

    /// The segment id of `target`, opened (and cached by the engine) on
    /// first use.
    fn segment(&self, target: &str, code: i32) -> OpResult<i32> {
        self.engine
            .open_segment(target)
            .map_err(|e| Failure::with_code(code, &format!("opening segment {target:?}"), &e))
    }

    fn requests(seg: i32, opcode: Opcode, pieces: &[Piece]) -> Vec<Request> {
        pieces
            .iter()
            .map(|p| Request {
                opcode,
                source: p.local,
                target_id: seg,
                target_offset: p.remote,
                length: p.len,
            })
            .collect()
    }

    /// Allocates a batch and submits `pieces`, whose memory `objects` hold,
    /// to `target`; returns the batch and the objects. On error the batch
    /// is freed again and the objects retired, unless a task of it runs
    /// (the engine checks every request before it starts one, so only a
    /// failure after the submission can leave one): then it is abandoned
    /// with them.
    fn submit(
        &self,
        target: &str,
        opcode: Opcode,
        pieces: &[Piece],
        notify: Option<(String, String)>,
        code: i32,
        objects: Vec<Local>,
    ) -> OpResult<(u64, Vec<Local>)> {
        self.reap();
        let reqs = match self.segment(target, code) {
            Ok(seg) => Self::requests(seg, opcode, pieces),
            Err(f) => {
                self.retire(objects);
                return Err(f);
            }
        };
        let batch = match self.engine.allocate_batch(reqs.len()) {
            Ok(batch) => batch,
            Err(e) => {
                self.retire(objects);
                return Err(Failure::with_code(code, "allocating a batch", &e));
            }
        };
        let submitted = match notify {
            None => self.engine.submit(batch, &reqs),
            Some((name, msg)) => self.engine.submit_with_notify(batch, &reqs, name, msg),
        };
        if let Err(e) = submitted {
            match self.engine.free_batch(batch) {
                Err(Error::BatchBusy) => self.abandon(batch, reqs.len(), objects),
                _ => self.retire(objects),
            }
            return Err(Failure::with_code(
                code,
                &format!("submitting {} request(s) to {target:?}", reqs.len()),
                &e,
            ));
        }
        Ok((batch, objects))
    }

    /// Moves `pieces` and waits until they have all ended (Mooncake's
    /// `transferSync` / `batchTransferSync`). Failure code: -1.
    ///
    /// `objects` hold the memory of `pieces`. When the wait gives up while
    /// a task may still run, the abandoned batch keeps them until the
    /// engine has ended it; otherwise they are retired at once.
    pub fn transfer_sync(
        &self,
        target: &str,
        opcode: Opcode,
        pieces: &[Piece],
        notify: Option<(String, String)>,
        objects: Vec<Local>,
    ) -> OpResult<()> {
        let start = Instant::now();
        let (batch, objects) = self.submit(target, opcode, pieces, notify, -1, objects)?;
        let bytes: u64 = pieces.iter().map(|p| p.len).sum();
        let deadline = wait::deadline(start, self.timeout, bytes);
        let outcome = match self.engine.wait_tasks(batch, pieces.len(), deadline) {
            Ok(outcome) => outcome,
            Err(e) => {
                self.abandon(batch, pieces.len(), objects);
                return Err(Failure::with_code(-1, "polling the batch", &e));
            }
        };
        let what = || {
            format!(
                "{} of {} request(s), {bytes} bytes, with {target:?}",
                if opcode == Opcode::Write {
                    "WRITE"
                } else {
                    "READ"
                },
                pieces.len()
            )
        };
        match outcome {
            WaitOutcome::Completed => {
                let _ = self.engine.free_batch(batch);
                self.retire(objects);
                Ok(())
            }
            WaitOutcome::Failed => {
                let _ = self.engine.free_batch(batch);
                self.retire(objects);
                Err(Failure::new(
                    -1,
                    format!("{} failed (the engine's log says why)", what()),
                ))
            }
            WaitOutcome::TimedOut => {
                self.abandon(batch, pieces.len(), objects);
                Err(Failure::new(
                    -1,
                    format!(
                        "{} did not finish within {:?} (MC_TRANSFER_TIMEOUT plus 1 ns per \
                         byte, or MC_SLICE_TIMEOUT)",
                        what(),
                        start.elapsed()
                    ),
                ))
            }
        }
    }

    /// Submits `pieces` and returns the batch id without waiting
    /// (Mooncake's `batchTransferAsync`, `transferSubmitWrite`). Failure
    /// code: 0, the id Mooncake returns on failure.
    ///
    /// The batch keeps `objects`, which hold the memory of `pieces`, until
    /// it is seen ended, given up on and ended, or the engine stops.
    pub fn transfer_async(
        &self,
        target: &str,
        opcode: Opcode,
        pieces: &[Piece],
        objects: Vec<Local>,
    ) -> OpResult<u64> {
        let start = Instant::now();
        let (batch, objects) = self.submit(target, opcode, pieces, None, 0, objects)?;
        lock(&self.pending).insert(
            batch,
            Pending {
                start,
                bytes: pieces.iter().map(|p| p.len).sum(),
                tasks: pieces.len(),
                objects,
            },
        );
        Ok(batch)
    }

    /// Waits for asynchronous batches (Mooncake's `getBatchTransferStatus`):
    /// completed batches are freed; the first failure or expired deadline
    /// ends the wait with -1, and the batches still listed are given up
    /// with their objects.
    pub fn wait_batches(&self, ids: &[u64]) -> OpResult<()> {
        self.reap();
        let mut waiting: Vec<(u64, Pending)> = Vec::with_capacity(ids.len());
        {
            let mut pending = lock(&self.pending);
            if let Some(unknown) = ids.iter().find(|id| !pending.contains_key(id)) {
                return Err(Failure::new(
                    -1,
                    format!(
                        "batch id {unknown:#x} is not an asynchronous batch of this engine \
                         (never submitted, failed to submit, or already finished)"
                    ),
                ));
            }
            for id in ids {
                if let Some(p) = pending.remove(id) {
                    waiting.push((*id, p));
                }
            }
        }
        let backoff = Backoff::new();
        let mut failure = None;
        while !waiting.is_empty() && failure.is_none() {
            let mut progressed = false;
            // A batch still running, none of its tasks past the slice
            // timeout: the pause parks on it.
            let mut running = None;
            let mut i = 0;
            while i < waiting.len() && failure.is_none() {
                let (id, p) = &waiting[i];
                let id = *id;
                match self.engine.batch_state(id, p.tasks) {
                    Ok(BatchState::Completed) => {
                        let _ = self.engine.free_batch(id);
                        let (_, p) = waiting.swap_remove(i);
                        self.retire(p.objects);
                        progressed = true;
                        continue;
                    }
                    Ok(BatchState::Failed) => {
                        failure = Some(format!("batch {id:#x} failed (the engine's log says why)"));
                    }
                    Err(e) => {
                        failure = Some(format!("batch {id:#x}: {e}"));
                    }
                    // Like Mooncake, a task past MC_SLICE_TIMEOUT is waited
                    // for until the batch's own deadline.
                    Ok(state @ (BatchState::Waiting | BatchState::TimedOut)) => {
                        if state == BatchState::Waiting {
                            running.get_or_insert((id, p.tasks));
                        }
                        if Instant::now() >= wait::deadline(p.start, self.timeout, p.bytes) {
                            failure = Some(format!(
                                "batch {id:#x} did not finish in time (MC_TRANSFER_TIMEOUT \
                                 plus 1 ns per byte)"
                            ));
                        }
                    }
                }
                i += 1;
            }
            if failure.is_none() && !waiting.is_empty() && !progressed {
                backoff.pause(&self.engine, running);
            }
        }
        // A failed batch is freed by the reaper like the others.
        for (id, p) in waiting {
            self.abandon(id, p.tasks, p.objects);
        }
        failure.map_or(Ok(()), |m| Err(Failure::new(-1, m)))
    }

    /// Mooncake's `transferCheckStatus`: 1 completed, -1 failed (the batch
    /// is freed in both cases), 0 still running, -2 still running past
    /// `MC_SLICE_TIMEOUT` or its deadline. An id that is not a pending
    /// asynchronous batch gives -1.
    pub fn check_status(&self, id: u64) -> OpResult<i32> {
        self.reap();
        let Some((start, bytes, tasks)) = lock(&self.pending)
            .get(&id)
            .map(|p| (p.start, p.bytes, p.tasks))
        else {
            return Err(Failure::new(
                -1,
                format!("batch id {id:#x} is not an asynchronous batch of this engine"),
            ));
        };
        let state = self
            .engine
            .batch_state(id, tasks)
            .map_err(|e| Failure::with_code(-1, "polling the batch", &e))?;
        let done = |code| {
            let ended = lock(&self.pending).remove(&id);
            let _ = self.engine.free_batch(id);
            if let Some(p) = ended {
                self.retire(p.objects);
            }
            Ok(code)
        };
        match state {
            BatchState::Completed => done(1),
            BatchState::Failed => done(-1),
            BatchState::Waiting if Instant::now() >= wait::deadline(start, self.timeout, bytes) => {
                Ok(-2)
            }
            BatchState::TimedOut => Ok(-2),
            BatchState::Waiting => Ok(0),
        }
    }
}

impl Core {
    /// Cancels asynchronous batch `id` ([`Engine::cancel_batch`], the C
    /// ABI's `te_cancel_batch`): 0 once every task has ended and none
    /// touches memory any more (the batch is freed and its objects
    /// released), 1 when a slice was still held at `timeout` (the batch
    /// stays pending with its objects; cancel or wait again). An id that
    /// is not a pending asynchronous batch gives -1.
    pub fn cancel_batch(&self, id: u64, timeout: std::time::Duration) -> OpResult<i32> {
        self.reap();
        if !lock(&self.pending).contains_key(&id) {
            return Err(Failure::new(
                -1,
                format!("batch id {id:#x} is not an asynchronous batch of this engine"),
            ));
        }
        match self.engine.cancel_batch(id, timeout) {
            Ok(CancelOutcome::Done) => {
                let ended = lock(&self.pending).remove(&id);
                let _ = self.engine.free_batch(id);
                if let Some(p) = ended {
                    self.retire(p.objects);
                }
                Ok(0)
            }
            Ok(CancelOutcome::Pending) => Ok(1),
            Err(e) => Err(Failure::with_code(-1, "cancelling the batch", &e)),
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        if self.forked() {
            // The parent's engine: its threads are not in this process and
            // its metadata, rings and peers are the parent's. Left alone
            // (this process's copy of it is never freed); the objects below
            // are this process's own copies, released as usual.
            std::mem::forget(self.engine.clone());
        } else {
            // No transfer may touch managed memory or an object once it is
            // released (the fields are dropped after this).
            self.engine.shutdown();
        }
        let mut objects = mem::take(self.ended.get_mut().unwrap_or_else(|e| e.into_inner()));
        let pending = mem::take(self.pending.get_mut().unwrap_or_else(|e| e.into_inner()));
        objects.extend(pending.into_values().flat_map(|p| p.objects));
        let abandoned = mem::take(self.abandoned.get_mut().unwrap_or_else(|e| e.into_inner()));
        objects.extend(abandoned.into_iter().flat_map(|a| a.objects));
        let pinned = mem::take(self.pinned.get_mut().unwrap_or_else(|e| e.into_inner()));
        objects.extend(pinned.into_values());
        local::release(objects);
    }
}
