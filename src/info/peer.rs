//! `transfer-engine-info --peer`: opens one peer's segment as a client
//! would, says which transport carries data to each of its buffers, and
//! times a 4 KiB and a 1 MiB transfer to the first buffer large enough
//! (after a first READ that sets up the transport's connections).
//!
//! By default only READs: the peer's memory is not changed, so the probe
//! is safe against a peer in production. With `write`, each size is also
//! written: the peer's bytes are read, a pattern is written and read back
//! and compared, and the bytes read first are written back (the peer's
//! own writes to that range meanwhile are lost).
//!
//! Every wait is bounded by [`ProbeOptions::timeout`]: opening the
//! segment (the handshake or the store's reads) runs on a thread of its
//! own, given up at the deadline, and each transfer is waited for with
//! it.

use crate::{Engine, Location, Opcode, Region, Request, WaitOutcome};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sizes of the timed transfers.
pub const SIZES: [u64; 2] = [4 << 10, 1 << 20];

/// What the probe does.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Also WRITE (see the module's docs); READs only otherwise.
    pub write: bool,
    /// Bound of each wait: opening the segment, each transfer.
    pub timeout: Duration,
}

/// What the probe of one peer found.
#[derive(Debug, Clone, Serialize)]
pub struct PeerReport {
    /// The segment name probed.
    pub name: String,
    /// Milliseconds to open the segment (handshake or store reads, and
    /// decoding its descriptor).
    pub open_ms: f64,
    /// Milliseconds of the first READ (4 KiB from the first buffer large
    /// enough), which includes the transport's connection setup (TCP's
    /// lanes, shared memory's attach); the timed transfers come after it.
    pub first_read_ms: Option<f64>,
    /// Whether the timed transfers wrote (`--write`).
    pub write: bool,
    /// The peer's buffers, each with the transport that carries data to
    /// it.
    pub buffers: Vec<PeerBuffer>,
    /// One timed round per size of [`SIZES`].
    pub round_trips: Vec<RoundTrip>,
}

/// One buffer of the peer.
#[derive(Debug, Clone, Serialize)]
pub struct PeerBuffer {
    /// Its address in the peer.
    pub addr: u64,
    /// Its length.
    pub length: u64,
    /// `cpu:N`, `cuda:N`, `*`, or empty where the peer does not say.
    pub location: String,
    /// The installed transport a request to it goes to first; `None`:
    /// none reaches it.
    pub transport: Option<&'static str>,
}

/// The timed transfers of one size.
#[derive(Debug, Clone, Serialize)]
pub struct RoundTrip {
    /// Bytes moved each way.
    pub bytes: u64,
    /// The peer buffer used (the first at least `bytes` long); `None`:
    /// the peer has none, and nothing was moved.
    pub buffer: Option<u64>,
    /// The transport that carried it.
    pub transport: Option<&'static str>,
    /// Milliseconds of the READ.
    pub read_ms: Option<f64>,
    /// Milliseconds of the WRITE (`--write`).
    pub write_ms: Option<f64>,
    /// Whether the bytes written were read back unchanged (`--write`).
    pub verified: Option<bool>,
}

/// Milliseconds of `d`.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Opens segment `name` on a thread of its own and waits for it at most
/// `timeout`: the id and how long it took.
fn open(engine: &Arc<Engine>, name: &str, timeout: Duration) -> Result<(i32, Duration), String> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let (e, n) = (engine.clone(), name.to_string());
    let start = Instant::now();
    std::thread::Builder::new()
        .name("te-info-open".into())
        .spawn(move || {
            let _ = tx.send(e.open_segment(&n));
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(id)) => Ok((id, start.elapsed())),
        Ok(Err(e)) => Err(format!("cannot open segment {name:?}: {e}")),
        Err(_) => Err(format!(
            "cannot open segment {name:?}: no answer within {} ms",
            timeout.as_millis()
        )),
    }
}

/// Moves `len` bytes between `local` and `remote` of segment `seg` and
/// waits for it: how long it took.
fn transfer(
    engine: &Engine,
    opcode: Opcode,
    (local, seg, remote, len): (u64, i32, u64, u64),
    timeout: Duration,
) -> Result<Duration, String> {
    let what = match opcode {
        Opcode::Read => "READ",
        Opcode::Write => "WRITE",
    };
    let batch = engine
        .allocate_batch(1)
        .map_err(|e| format!("{what}: {e}"))?;
    let start = Instant::now();
    engine
        .submit(
            batch,
            &[Request {
                opcode,
                source: local,
                target_id: seg,
                target_offset: remote,
                length: len,
            }],
        )
        .map_err(|e| format!("{what} of {len} bytes at {remote:#x}: {e}"))?;
    let outcome = engine
        .wait_tasks(batch, 1, start + timeout)
        .map_err(|e| format!("{what}: {e}"))?;
    let took = start.elapsed();
    match outcome {
        WaitOutcome::Completed => {
            let _ = engine.free_batch(batch);
            Ok(took)
        }
        WaitOutcome::Failed => {
            let why = engine.failure_reason(batch, 0).ok().flatten();
            let _ = engine.free_batch(batch);
            Err(format!(
                "{what} of {len} bytes at {remote:#x} failed: {}",
                why.unwrap_or_else(|| "no reason given".into())
            ))
        }
        // The batch stays allocated: its transfer may still run, into
        // memory that lives as long as the process.
        WaitOutcome::TimedOut => Err(format!(
            "{what} of {len} bytes at {remote:#x}: not done within {} ms",
            timeout.as_millis()
        )),
    }
}

/// The probe's local memory: what is read, and (with `write`) the pattern
/// written. The engine may still be moving bytes into it after a transfer
/// timed out, so it is never freed (it lives as long as the process); it
/// is read and written here only between transfers, each waited for.
struct ProbeMemory {
    base: *mut u8,
    len: usize,
}

impl ProbeMemory {
    /// `len` zeroed bytes.
    fn new(len: usize) -> ProbeMemory {
        let base = Box::leak(vec![0u8; len].into_boxed_slice()).as_mut_ptr();
        ProbeMemory { base, len }
    }

    /// Its address, as requests name it.
    fn addr(&self) -> u64 {
        self.base as u64
    }

    /// A copy of `n` bytes at `off`.
    fn get(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len, "{off}+{n} beyond {}", self.len);
        // SAFETY: the range is inside the leaked allocation (checked
        // above), which is never freed, and no transfer into it is in
        // flight (each one was waited for before this call).
        unsafe { std::slice::from_raw_parts(self.base.add(off), n) }.to_vec()
    }

    /// Writes `bytes` at `off`.
    fn set(&self, off: usize, bytes: &[u8]) {
        assert!(
            off + bytes.len() <= self.len,
            "{off}+{} beyond {}",
            bytes.len(),
            self.len
        );
        // SAFETY: as in `get`; nothing else reads or writes the range
        // while no transfer is in flight.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(off), bytes.len()) }
    }
}

/// Probes segment `name` with `engine`. Errors: the segment cannot be
/// opened (refused, unknown name, a key the peer does not accept, no
/// answer in time), or a transfer failed; each says why.
pub fn probe(engine: &Arc<Engine>, name: &str, opts: &ProbeOptions) -> Result<PeerReport, String> {
    let (id, took) = open(engine, name, opts.timeout)?;
    let buffers: Vec<PeerBuffer> = engine
        .segment_carriers(id)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|(b, transport)| PeerBuffer {
            addr: b.addr,
            length: b.length,
            location: b.location,
            transport,
        })
        .collect();
    let largest = SIZES.iter().copied().max().unwrap_or(0);
    let local = ProbeMemory::new(2 * largest as usize);
    let base = local.addr();
    engine
        .register(&[Region {
            addr: base,
            length: 2 * largest,
            location: Location::Any,
            remote_accessible: false,
        }])
        .map_err(|e| format!("cannot register the probe's buffer: {e}"))?;
    let (read_at, write_at) = (base, base + largest);
    let first_read_ms = match buffers.iter().find(|b| b.length >= SIZES[0]) {
        Some(b) => {
            let first = (read_at, id, b.addr, SIZES[0]);
            Some(ms(transfer(engine, Opcode::Read, first, opts.timeout)?))
        }
        None => None,
    };
    let mut round_trips = Vec::new();
    for bytes in SIZES {
        let Some(target) = buffers.iter().find(|b| b.length >= bytes) else {
            round_trips.push(RoundTrip {
                bytes,
                buffer: None,
                transport: None,
                read_ms: None,
                write_ms: None,
                verified: None,
            });
            continue;
        };
        let at = |local| (local, id, target.addr, bytes);
        let read = transfer(engine, Opcode::Read, at(read_at), opts.timeout)?;
        let (mut write_ms, mut verified) = (None, None);
        if opts.write {
            let n = bytes as usize;
            let original = local.get(0, n);
            let pattern: Vec<u8> = original
                .iter()
                .enumerate()
                .map(|(i, b)| (i as u8) ^ 0x5a ^ b)
                .collect();
            local.set(largest as usize, &pattern);
            let wrote = transfer(engine, Opcode::Write, at(write_at), opts.timeout)?;
            transfer(engine, Opcode::Read, at(read_at), opts.timeout)?;
            verified = Some(local.get(0, n) == pattern);
            // The peer's bytes back as they were.
            local.set(largest as usize, &original);
            transfer(engine, Opcode::Write, at(write_at), opts.timeout)?;
            write_ms = Some(ms(wrote));
        }
        round_trips.push(RoundTrip {
            bytes,
            buffer: Some(target.addr),
            transport: target.transport,
            read_ms: Some(ms(read)),
            write_ms,
            verified,
        });
    }
    engine
        .unregister(&[base])
        .map_err(|e| format!("cannot unregister the probe's buffer: {e}"))?;
    Ok(PeerReport {
        name: name.to_string(),
        open_ms: ms(took),
        first_read_ms,
        write: opts.write,
        buffers,
        round_trips,
    })
}
