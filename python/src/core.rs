//! What one initialized `TransferEngine` holds, and the operations behind
//! its methods, free of Python types so they run with the GIL released.
//!
//! Every operation returns a [`Failure`] carrying the code Mooncake's
//! Python binding returns for it and the engine's error text: the
//! integer-returning methods log the text and return the code, the
//! exception-raising ones raise it.

use crate::local::Local;
use crate::managed::Managed;
use crate::wait::{self, Backoff, BatchState, Outcome};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use transfer_engine::config::config;
use transfer_engine::engine::{Engine, Opcode, Request};
use transfer_engine::error::Error;

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
#[derive(Debug, Clone, Copy)]
struct Pending {
    start: Instant,
    bytes: u64,
    tasks: usize,
}

/// An initialized engine with the binding's own state.
pub struct Core {
    /// The engine.
    pub engine: Arc<Engine>,
    /// `allocate_managed_buffer` memory; unmapped after the engine stops.
    pub managed: Mutex<Managed>,
    /// Asynchronous batches by id.
    pending: Mutex<HashMap<u64, Pending>>,
    /// Batches given up on (timed out, or failed with tasks running):
    /// freed once every task has ended.
    abandoned: Mutex<Vec<(u64, usize)>>,
    /// Objects registered by `register`, by address: kept (with their
    /// buffer export) until unregistered, released after the engine stops.
    pub pinned: Mutex<HashMap<u64, Local>>,
    /// `MC_TRANSFER_TIMEOUT`.
    timeout: Duration,
}

/// Locks `m`, also after a panic elsewhere poisoned it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Core {
    /// Wraps a created engine.
    pub fn new(engine: Arc<Engine>) -> Core {
        Core {
            engine,
            managed: Mutex::default(),
            pending: Mutex::default(),
            abandoned: Mutex::default(),
            pinned: Mutex::default(),
            timeout: Duration::from_secs(config().transfer_timeout_secs),
        }
    }

    /// Frees the abandoned batches whose tasks have all ended.
    fn reap(&self) {
        let Ok(mut list) = self.abandoned.try_lock() else {
            return;
        };
        list.retain(
            |&(batch, tasks)| match wait::batch_state(&self.engine, batch, tasks) {
                Ok(BatchState::Waiting | BatchState::TimedOut) => true,
                Ok(_) => self.engine.free_batch(batch).is_err(),
                Err(_) => false,
            },
        );
    }

    fn abandon(&self, batch: u64, tasks: usize) {
        lock(&self.abandoned).push((batch, tasks));
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

    /// Allocates a batch and submits `pieces` to `target`; on error the
    /// batch is freed again.
    fn submit(
        &self,
        target: &str,
        opcode: Opcode,
        pieces: &[Piece],
        notify: Option<(String, String)>,
        code: i32,
    ) -> OpResult<u64> {
        self.reap();
        let seg = self.segment(target, code)?;
        let reqs = Self::requests(seg, opcode, pieces);
        let batch = self
            .engine
            .allocate_batch(reqs.len())
            .map_err(|e| Failure::with_code(code, "allocating a batch", &e))?;
        let submitted = match notify {
            None => self.engine.submit(batch, &reqs),
            Some((name, msg)) => self.engine.submit_with_notify(batch, &reqs, name, msg),
        };
        if let Err(e) = submitted {
            let _ = self.engine.free_batch(batch);
            return Err(Failure::with_code(
                code,
                &format!("submitting {} request(s) to {target:?}", reqs.len()),
                &e,
            ));
        }
        Ok(batch)
    }

    /// Moves `pieces` and waits until they have all ended (Mooncake's
    /// `transferSync` / `batchTransferSync`). Failure code: -1.
    pub fn transfer_sync(
        &self,
        target: &str,
        opcode: Opcode,
        pieces: &[Piece],
        notify: Option<(String, String)>,
    ) -> OpResult<()> {
        let start = Instant::now();
        let batch = self.submit(target, opcode, pieces, notify, -1)?;
        let bytes: u64 = pieces.iter().map(|p| p.len).sum();
        let deadline = wait::deadline(start, self.timeout, bytes);
        let outcome = wait::wait_batch(&self.engine, batch, pieces.len(), deadline)
            .map_err(|e| Failure::with_code(-1, "polling the batch", &e))?;
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
            Outcome::Completed => {
                let _ = self.engine.free_batch(batch);
                Ok(())
            }
            Outcome::Failed => {
                let _ = self.engine.free_batch(batch);
                Err(Failure::new(
                    -1,
                    format!("{} failed (the engine's log says why)", what()),
                ))
            }
            Outcome::TimedOut => {
                self.abandon(batch, pieces.len());
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
    pub fn transfer_async(&self, target: &str, opcode: Opcode, pieces: &[Piece]) -> OpResult<u64> {
        let start = Instant::now();
        let batch = self.submit(target, opcode, pieces, None, 0)?;
        lock(&self.pending).insert(
            batch,
            Pending {
                start,
                bytes: pieces.iter().map(|p| p.len).sum(),
                tasks: pieces.len(),
            },
        );
        Ok(batch)
    }

    /// Waits for asynchronous batches (Mooncake's `getBatchTransferStatus`):
    /// completed batches are freed; the first failure or expired deadline
    /// ends the wait with -1, and the batches still listed are given up.
    pub fn wait_batches(&self, ids: &[u64]) -> OpResult<()> {
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
            waiting.retain(|&(id, p)| {
                if failure.is_some() {
                    return true;
                }
                match wait::batch_state(&self.engine, id, p.tasks) {
                    Ok(BatchState::Completed) => {
                        let _ = self.engine.free_batch(id);
                        progressed = true;
                        false
                    }
                    Ok(BatchState::Failed) => {
                        failure = Some(format!("batch {id:#x} failed (the engine's log says why)"));
                        true
                    }
                    Err(e) => {
                        failure = Some(format!("batch {id:#x}: {e}"));
                        true
                    }
                    // Like Mooncake, a task past MC_SLICE_TIMEOUT is waited
                    // for until the batch's own deadline.
                    Ok(BatchState::Waiting | BatchState::TimedOut) => {
                        if Instant::now() >= wait::deadline(p.start, self.timeout, p.bytes) {
                            failure = Some(format!(
                                "batch {id:#x} did not finish in time (MC_TRANSFER_TIMEOUT \
                                 plus 1 ns per byte)"
                            ));
                        }
                        true
                    }
                }
            });
            if failure.is_none() && !waiting.is_empty() && !progressed {
                backoff.pause();
            }
        }
        for (id, p) in waiting {
            self.abandon(id, p.tasks);
        }
        failure.map_or(Ok(()), |m| Err(Failure::new(-1, m)))
    }

    /// Mooncake's `transferCheckStatus`: 1 completed, -1 failed (the batch
    /// is freed in both cases), 0 still running, -2 still running past
    /// `MC_SLICE_TIMEOUT` or its deadline. An id that is not a pending
    /// asynchronous batch gives -1.
    pub fn check_status(&self, id: u64) -> OpResult<i32> {
        let Some(p) = lock(&self.pending).get(&id).copied() else {
            return Err(Failure::new(
                -1,
                format!("batch id {id:#x} is not an asynchronous batch of this engine"),
            ));
        };
        let state = wait::batch_state(&self.engine, id, p.tasks)
            .map_err(|e| Failure::with_code(-1, "polling the batch", &e))?;
        let done = |code| {
            lock(&self.pending).remove(&id);
            let _ = self.engine.free_batch(id);
            Ok(code)
        };
        match state {
            BatchState::Completed => done(1),
            BatchState::Failed => done(-1),
            BatchState::Waiting
                if Instant::now() >= wait::deadline(p.start, self.timeout, p.bytes) =>
            {
                Ok(-2)
            }
            BatchState::TimedOut => Ok(-2),
            BatchState::Waiting => Ok(0),
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // No transfer may touch managed memory or a pinned object once it
        // is released (the fields are dropped after this).
        self.engine.shutdown();
    }
}
