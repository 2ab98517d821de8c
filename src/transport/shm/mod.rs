//! The shared-memory transport: copies between the registered buffers of
//! two processes on the same host with cross-memory attach
//! (`process_vm_readv`), at memory speed, with the guarantees of the
//! network transports.
//!
//! Each process only ever writes its own memory ("pull both ways"):
//!
//! * A WRITE is executed by the target. The initiator posts the request
//!   (source, destination, length) into a ring it shares with the target
//!   ([`ring`]); a target thread claims it, checks the destination with the
//!   engine's registry ([`RemoteMemory::admit`]), and inside the buffer's
//!   [`Fence`](crate::memory::fence::Fence) copies from the initiator
//!   into its own buffer. Unregistering a buffer is then exactly as on
//!   TCP: the fence is local, so once it returns no peer's WRITE touches
//!   the range, however stopped or slow the peer.
//! * A READ is executed by the initiator, from the target into its own
//!   buffer. The target publishes a registration table ([`table`]) that
//!   peers map read-only; the initiator checks the range there before the
//!   copy (nothing moves if it is not a registered, accessible range) and
//!   again after (a buffer unregistered meanwhile fails the READ).
//!   Unregistering only bumps the slot's generation: it never waits.
//!
//! Peers attach once, through a handshake the engine routes to
//! [`ShmTransport::serve_attach`]: the target answers with its pid and the
//! descriptor numbers of a ring, its table and two eventfds, which the
//! initiator takes with `pidfd_getfd` and checks by a nonce (so a pid of
//! another pid namespace never passes); the initiator then proves its own
//! pid by copying words the target chose into its memory, which the target
//! reads back before it executes any request ([`attach`]). Any refusal (another
//! user, a ptrace policy, a container boundary) makes the peer
//! [`Outcome::Unreachable`]: the engine uses another transport.
//!
//! Each side keeps a pidfd of the other and learns at once that it exited:
//! an initiator fails what it has in flight to a dead target; a target
//! drops the ring of a dead initiator. A target that completes nothing for
//! `MC_SHM_TIMEOUT_SEC` fails the WRITEs in flight to it. `MC_SHM_THREADS`
//! threads do all the work of both sides; they sleep on eventfds (after
//! `MC_SHM_SPIN_US` of polling) when idle. A target serves at most
//! `MC_SHM_MAX_PEERS` rings of `MC_SHM_RING_ENTRIES` entries and publishes
//! at most `MC_SHM_TABLE_SLOTS` buffers.
//!
//! Trust: a process of the same user may ptrace us anyway; the checks here
//! protect against mistakes and races, not against a hostile process of
//! the same user. Still, everything read from shared memory is checked
//! before use, and no peer can make this process fault or wait forever.

mod alloc;
mod attach;
mod carrier;
pub mod cma;
mod config;
mod maps;
mod pages;
mod peer;
mod poll;
mod reads;
pub mod ring;
mod serve;
pub mod sys;
pub mod table;
mod worker;

use crate::error::{Error, Result};
use crate::memory::{Region, RemoteMemory};
use crate::transport::{Outcome, Slice};
use alloc::Allocs;
pub use carrier::{ATTACH, PROTOCOL, auto, install, not_installed};
pub use config::ShmConfig;
use peer::{LinkEntry, PeerCore};
use poll::Poller;
use serde_json::{Value, json};
use serve::Served;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use table::TableWriter;

/// Version of the attach handshake and of the shared layouts (2: ring
/// entries are copied only while COPYING, see [`ring`]).
const VERSION: u64 = 2;
/// Most requests one thread takes at once (one READ batch, one ring claim).
const BATCH: usize = 64;
/// Most bytes one thread takes at once, so that a large transfer's slices
/// spread over the threads.
const BATCH_BYTES: u64 = 256 << 10;

/// The settings of the transport (see [`ShmConfig`]).
#[derive(Debug, Clone)]
pub struct ShmOptions {
    /// `MC_SHM_THREADS`: threads serving both sides.
    pub threads: usize,
    /// `MC_SHM_MAX_PEERS`: rings (attached initiators) served at once.
    pub max_peers: usize,
    /// `MC_SHM_RING_ENTRIES`: requests one initiator may have posted.
    pub ring_entries: usize,
    /// `MC_SHM_TABLE_SLOTS`: buffers published to peers.
    pub table_slots: usize,
    /// The most slots a peer's table may have: `MC_SHM_PEER_TABLE_SLOTS`,
    /// and at least `table_slots`.
    pub peer_table_slots: usize,
    /// `MC_SHM_TIMEOUT_SEC`: a target that completes nothing this long
    /// fails the WRITEs in flight to it.
    pub timeout: Duration,
    /// `MC_SHM_SPIN_US`: how long an idle thread polls before sleeping.
    pub spin: Duration,
    /// `MC_SHM_MAX_MAPPINGS`: memfd-backed buffers of one peer mapped at
    /// once.
    pub max_mappings: usize,
}

impl ShmOptions {
    /// The settings `c` holds.
    pub fn from_config(c: &ShmConfig) -> ShmOptions {
        ShmOptions {
            threads: c.threads,
            max_peers: c.max_peers,
            ring_entries: c.ring_entries,
            table_slots: c.table_slots,
            peer_table_slots: c.peer_table_slots.max(c.table_slots),
            timeout: Duration::from_secs(c.timeout_secs),
            spin: Duration::from_micros(c.spin_us),
            max_mappings: c.max_mappings,
        }
    }
}

/// Sends one attach request to a peer's engine and returns its answer
/// (the engine routes it to the peer's [`ShmTransport::serve_attach`]).
pub type AttachFn = Arc<dyn Fn(&Value) -> Result<Value> + Send + Sync>;

/// Bytes moved, as counted by the transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShmStats {
    /// Bytes of our WRITEs that targets copied.
    pub written: u64,
    /// Bytes of our READs copied from targets.
    pub read: u64,
    /// Bytes we copied for initiators' WRITEs.
    pub served: u64,
    /// Of those bytes (ours read, theirs served), how many we copied from
    /// a mapping of the peer's memfd rather than with cross-memory attach.
    pub mapped: u64,
    /// Attachments this engine made to targets (a ring each).
    pub attached: u64,
}

#[derive(Default)]
struct Counters {
    written: AtomicU64,
    read: AtomicU64,
    served: AtomicU64,
    mapped: AtomicU64,
    attached: AtomicU64,
}

/// What the worker threads, the handshake and the callers share.
pub(crate) struct Shared {
    memory: Arc<dyn RemoteMemory>,
    opts: ShmOptions,
    boot_id: String,
    pid: i32,
    table: TableWriter,
    /// Buffers allocated in memfds.
    allocs: Allocs,
    /// Rung for local work (READs queued, shutdown).
    kick: OwnedFd,
    polls: Vec<Poller>,
    /// Rings we serve as target.
    served: RwLock<Arc<Vec<Arc<Served>>>>,
    /// Targets we are attached to, as initiator, with their links.
    links: RwLock<Arc<Vec<LinkEntry>>>,
    /// READs for the threads (or a polling caller) to execute.
    reads: reads::ReadQueue,
    /// Threads asleep or about to be.
    sleepers: AtomicUsize,
    /// The kick eventfd was signalled and not yet drained.
    kicked: AtomicBool,
    /// A submitting thread deferred a kick (see [`Shared::kick`]).
    kick_owed: AtomicBool,
    /// A thread is polling for work.
    spinning: AtomicBool,
    /// When a caller last did a round of the threads' work (µs since
    /// start; 0: never, or the last one stopped, [`ShmTransport::stop_helping`]).
    helped_at_us: AtomicU64,
    /// Our WRITEs posted or queued and not yet finished.
    writes_in_flight: AtomicUsize,
    /// Threads asleep with no deadline: the first WRITE in flight wakes
    /// them, so that one notices if its target stalls.
    untimed_sleepers: AtomicUsize,
    closing: AtomicBool,
    next_id: AtomicU64,
    started: Instant,
    counters: Counters,
    /// Attaches under way, each on its own short-lived thread.
    attaches: Mutex<Vec<JoinHandle<()>>>,
    /// When a thread looks for stalled targets next (ms since start).
    next_stall_check: AtomicU64,
    /// Serializes the attaches we serve (ring bound and replacement).
    serving: Mutex<()>,
    /// Ended links whose targets are still copying some of our WRITEs.
    draining: Mutex<Vec<peer::Draining>>,
    /// Large caller buffers whose pages were looked at (at most
    /// [`pages::CHECKS`]; all of them once one in 4 KiB pages was logged).
    page_checks: AtomicUsize,
    /// How many there are (read without the lock).
    draining_links: AtomicUsize,
}

impl Shared {
    fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Milliseconds since start (activity stamps).
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Whether a caller polling for its tasks did a round of the threads'
    /// work in the last millisecond ([`ShmTransport::help`]): the threads
    /// need not poll then.
    fn caller_helps(&self) -> bool {
        let now = self.started.elapsed().as_micros() as u64;
        let at = self.helped_at_us.load(Ordering::SeqCst);
        at != 0 && now.saturating_sub(at) < 1000
    }

    fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Wakes the sleeping threads for local work (one signal until a
    /// thread takes it); while the calling thread submits a batch
    /// ([`plug`](crate::transport::plug)), once for the batch, when
    /// [`ShmTransport::flush`] runs.
    fn kick(&self) {
        if crate::transport::plug::plugged() {
            self.kick_owed.store(true, Ordering::SeqCst);
            return;
        }
        self.kick_now();
    }

    /// Wakes the sleeping threads now, plugged or not.
    fn kick_now(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 && !self.kicked.swap(true, Ordering::SeqCst) {
            sys::signal(&self.kick);
        }
    }

    fn served(&self) -> Arc<Vec<Arc<Served>>> {
        self.served
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn links(&self) -> Arc<Vec<LinkEntry>> {
        self.links.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_served(&self, f: impl FnOnce(&mut Vec<Arc<Served>>)) {
        let mut g = self.served.write().unwrap_or_else(|e| e.into_inner());
        let mut v = g.as_ref().clone();
        f(&mut v);
        *g = Arc::new(v);
    }

    fn set_links(&self, f: impl FnOnce(&mut Vec<LinkEntry>)) {
        let mut g = self.links.write().unwrap_or_else(|e| e.into_inner());
        let mut v = g.as_ref().clone();
        f(&mut v);
        *g = Arc::new(v);
    }

    /// Watches `fd` in every thread's poll set.
    fn watch(&self, fd: &OwnedFd, token: poll::Token) -> std::io::Result<()> {
        for (i, p) in self.polls.iter().enumerate() {
            if let Err(e) = p.add(fd, token) {
                self.polls[..i].iter().for_each(|p| p.remove(fd));
                return Err(e);
            }
        }
        Ok(())
    }

    /// Stops watching `fd` anywhere.
    fn unwatch(&self, fd: &OwnedFd) {
        self.polls.iter().for_each(|p| p.remove(fd));
    }
}

/// A target reached by shared memory, as seen from the initiator: made by
/// [`ShmTransport::shared_peer`], used by
/// [`ShmTransport::post`]. Clones share one attachment; dropping the last
/// one fails what is still queued for the target and detaches from it.
#[derive(Clone)]
pub struct ShmPeer {
    owner: Arc<PeerOwner>,
}

/// What the clones of one [`ShmPeer`] share.
struct PeerOwner {
    core: Arc<PeerCore>,
}

impl Drop for PeerOwner {
    fn drop(&mut self) {
        self.core.detach();
    }
}

impl ShmPeer {
    /// A handle that owns `core`.
    fn new(core: Arc<PeerCore>) -> ShmPeer {
        ShmPeer {
            owner: Arc::new(PeerOwner { core }),
        }
    }

    /// The target's state.
    fn core(&self) -> &Arc<PeerCore> {
        &self.owner.core
    }
}

/// The shared-memory transport of one engine: both sides, the target
/// (serving rings and the registration table) and the initiator (posting
/// WRITEs, executing READs).
pub struct ShmTransport {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// The peers of [`ShmTransport::shared_peer`], by target pid and
    /// endpoint: one per process of this host that this engine sent data
    /// to, kept while that process lives (entries of processes that exited
    /// are dropped as new ones come) or until [`ShmTransport::shutdown`].
    peers: Mutex<HashMap<(i32, String), ShmPeer>>,
}

impl ShmTransport {
    /// Creates the registration table and starts the threads. Fails if
    /// this kernel lacks what the transport needs (memfd, eventfd, epoll)
    /// or the boot id cannot be read.
    pub fn start(memory: Arc<dyn RemoteMemory>, opts: ShmOptions) -> Result<Arc<ShmTransport>> {
        let err =
            |what: &str, e: std::io::Error| Error::NotImplemented(format!("shm: {what}: {e}"));
        let boot_id = sys::boot_id().map_err(|e| err("boot id", e))?;
        let table = TableWriter::new(opts.table_slots, sys::random_u64())
            .map_err(|e| err("registration table", e))?;
        let kick = sys::eventfd().map_err(|e| err("eventfd", e))?;
        let threads = opts.threads.max(1);
        let mut polls = Vec::with_capacity(threads);
        for _ in 0..threads {
            let p = Poller::new().map_err(|e| err("epoll", e))?;
            p.add(&kick, poll::Token::Kick)
                .map_err(|e| err("epoll", e))?;
            polls.push(p);
        }
        let shared = Arc::new(Shared {
            memory,
            opts,
            boot_id,
            pid: sys::own_pid(),
            table,
            allocs: Allocs::default(),
            kick,
            polls,
            served: RwLock::default(),
            links: RwLock::default(),
            reads: reads::ReadQueue::default(),
            sleepers: AtomicUsize::new(0),
            kicked: AtomicBool::new(false),
            kick_owed: AtomicBool::new(false),
            spinning: AtomicBool::new(false),
            helped_at_us: AtomicU64::new(0),
            writes_in_flight: AtomicUsize::new(0),
            untimed_sleepers: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            started: Instant::now(),
            counters: Counters::default(),
            attaches: Mutex::new(Vec::new()),
            next_stall_check: AtomicU64::new(0),
            serving: Mutex::new(()),
            draining: Mutex::new(Vec::new()),
            draining_links: AtomicUsize::new(0),
            page_checks: AtomicUsize::new(0),
        });
        let me = Arc::new(ShmTransport {
            shared: shared.clone(),
            workers: Mutex::new(Vec::new()),
            peers: Mutex::new(HashMap::new()),
        });
        for i in 0..threads {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("te-shm-{i}"))
                .spawn(move || worker::run(&s, i))
                .map_err(|e| {
                    me.shutdown();
                    Error::Context(format!("shm: cannot start a thread: {e}"))
                })?;
            me.workers.lock().unwrap_or_else(|e| e.into_inner()).push(h);
        }
        Ok(me)
    }

    /// What this engine adds to its descriptor, under the key `"shm"`:
    /// the boot id (peers on another kernel skip it) and the pid.
    pub fn descriptor(&self) -> Value {
        json!({
            "version": VERSION,
            "boot_id": self.shared.boot_id,
            "pid": self.shared.pid,
        })
    }

    /// A peer of its own (shared with no other caller) for the process
    /// whose descriptor has `shm_key`: the tests' way to hold several
    /// attachments to one target.
    #[cfg(test)]
    pub fn peer(&self, shm_key: &Value, attach: AttachFn) -> Option<ShmPeer> {
        let pid = self.peer_pid(shm_key)?;
        Some(ShmPeer::new(PeerCore::new(&self.shared, pid, attach)))
    }

    /// The peer whose descriptor has `shm_key` (its `"shm"` value), if it
    /// runs on this host in another process; `attach` sends it our attach
    /// request, and nothing is sent before the first slice. Shared by every
    /// caller that names the same target process and `endpoint` (where its
    /// attach requests go, and as whom): descriptors of one process
    /// refetched as it registers memory keep one attachment and one ring,
    /// instead of attaching again for each, however long no segment holds
    /// the peer between two of them. A peer whose target exited, or that
    /// was detached, is replaced.
    pub fn shared_peer(
        &self,
        shm_key: &Value,
        endpoint: String,
        attach: AttachFn,
    ) -> Option<ShmPeer> {
        let pid = self.peer_pid(shm_key)?;
        let mut peers = crate::sync::lock(&self.peers);
        let key = (pid, endpoint);
        if let Some(peer) = peers.get(&key)
            && !peer.core().gone()
        {
            return Some(peer.clone());
        }
        peers.retain(|_, p| !p.core().gone());
        let peer = ShmPeer::new(PeerCore::new(&self.shared, pid, attach));
        peers.insert(key, peer.clone());
        Some(peer)
    }

    fn peer_pid(&self, shm_key: &Value) -> Option<i32> {
        let boot = shm_key.get("boot_id")?.as_str()?;
        let pid = i32::try_from(shm_key.get("pid")?.as_u64()?).ok()?;
        let version = shm_key.get("version")?.as_u64()?;
        (version == VERSION && boot == self.shared.boot_id && pid != self.shared.pid && pid > 0)
            .then_some(pid)
    }

    /// Answers a peer's attach request (`source`: where it came from, for
    /// the log): creates the ring for it, or says why not.
    pub fn serve_attach(&self, request: &Value, source: SocketAddr) -> Value {
        attach::serve(&self.shared, request, source)
    }

    /// Publishes a registered buffer to peers: its range for their READs
    /// and, if it lies in a buffer of [`ShmTransport::allocate`], its
    /// memfd, which they map to copy with memcpy. A buffer that does not
    /// fit in the table (`MC_SHM_TABLE_SLOTS`) is read over another
    /// transport (logged once per interval). The first large caller
    /// buffer found mostly in 4 KiB pages is logged once, with the way to
    /// huge pages, which peers copy about twice as fast.
    pub fn register(&self, region: &Region) {
        let backing = self.shared.allocs.backing_of(region.addr, region.length);
        if backing.is_none() && region.remote_accessible {
            self.say_if_small_pages(region);
        }
        if !self.shared.table.register(
            region.addr,
            region.length,
            region.remote_accessible,
            backing,
        ) {
            crate::log_limit::warn_limited!(
                "shm: MC_SHM_TABLE_SLOTS={} buffers are published already; \
                 peers read buffer {:#x} over another transport",
                self.shared.table.slots(),
                region.addr
            );
        }
    }

    /// Logs, once per engine, a large host buffer peers reach with
    /// cross-memory attach whose resident memory is mostly in 4 KiB pages.
    /// Only the first [`pages::CHECKS`] large buffers are looked at: each
    /// look reads the process's whole memory map.
    fn say_if_small_pages(&self, region: &Region) {
        let checks = &self.shared.page_checks;
        if region.length < pages::LARGE
            || matches!(region.location, crate::memory::Location::Cuda(_))
            || checks.fetch_add(1, Ordering::Relaxed) >= pages::CHECKS
        {
            return;
        }
        let Some(p) = pages::of_range(region.addr, region.length) else {
            return;
        };
        if p.mostly_small() && checks.swap(pages::CHECKS, Ordering::Relaxed) < pages::CHECKS {
            tracing::info!(
                "shm: buffer {:#x} ({} MiB) is in 4 KiB pages ({} of {} MiB resident in huge \
                 pages): peers on this host copy it about half as fast as memory in huge \
                 pages; put it in huge pages (madvise MADV_HUGEPAGE before it is first \
                 touched, or hugetlbfs) or take buffers from te_allocate_buffer \
                 (docs/shm.md, \"Huge pages\")",
                region.addr,
                region.length >> 20,
                p.huge_kib >> 10,
                p.resident_kib >> 10
            );
        }
    }

    /// Withdraws the buffer at `addr` from peers' READs: a READ whose copy
    /// is under way fails. Never waits. (Peers' WRITEs are fenced by the
    /// engine's registry, whose fence the engine revokes.) A buffer in a
    /// memfd: peers are woken to drop their mappings of it.
    pub fn unregister(&self, addr: u64) {
        if self.shared.table.unregister(addr) {
            for s in self.shared.served().iter() {
                sys::signal(&s.to_initiator);
            }
            for l in self.shared.links().iter() {
                sys::signal(&l.link.to_target);
            }
        }
    }

    /// A new zeroed buffer of `len` bytes in a memfd of its own, for the
    /// engine to hand to a caller that asks it for memory. Registered, it
    /// is copied by peers on this host with memcpy from their mapping of
    /// it, several times faster than cross-memory attach.
    pub fn allocate(&self, len: usize) -> Result<u64> {
        self.shared
            .allocs
            .allocate(len)
            .map_err(|e| Error::Memory(format!("shm: a buffer of {len} bytes: {e}")))
    }

    /// Frees a buffer of [`ShmTransport::allocate`] (unregistered first).
    /// Peers that map it keep its pages until they notice it is no longer
    /// registered.
    pub fn free(&self, addr: u64) -> Result<()> {
        if self.shared.allocs.free(addr) {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "shm: no buffer was allocated at {addr:#x}"
            )))
        }
    }

    /// Moves one slice to or from `peer`: a WRITE goes into the target's
    /// ring, a READ to this process's threads. Never waits on the peer;
    /// the first slice to a peer starts its attach in the background.
    pub fn post(&self, peer: &ShmPeer, slice: Slice) {
        if self.shared.closing() {
            return slice.finish(Outcome::Failed { hard: true });
        }
        peer.core().post(slice);
    }

    /// Withdraws the WRITEs of cancelled tasks from every target's queue
    /// ([`PeerCore::withdraw_canceled`]).
    pub fn withdraw_canceled(&self) {
        let cores: Vec<Arc<PeerCore>> = crate::sync::lock(&self.peers)
            .values()
            .map(|p| p.core().clone())
            .collect();
        for core in cores {
            core.withdraw_canceled(&self.shared);
        }
    }

    /// One round of the threads' work on the calling thread (READs queued,
    /// rings to serve, results to take): a caller that polls for its
    /// tasks moves them on instead of waiting for a thread. Returns whether
    /// there was any.
    pub fn help(&self) -> bool {
        let s = &self.shared;
        // Stamped at most every 100 µs: callers polling on several cores
        // would otherwise write this shared word on every poll.
        let now = s.started.elapsed().as_micros() as u64;
        if now.saturating_sub(s.helped_at_us.load(Ordering::Relaxed)) >= 100 {
            s.helped_at_us.store(now.max(1), Ordering::Relaxed);
        }
        !s.closing() && worker::pass(s, true, table::Scan::Never)
    }

    /// The calling thread stops lending a hand (it is about to park until
    /// its tasks end): the threads take the results of our WRITEs again,
    /// and our targets ring us for them, at once rather than once the last
    /// help is a millisecond old. A thread asleep meanwhile, which left
    /// those results to the caller, is kicked to look again.
    pub fn stop_helping(&self) {
        self.shared.helped_at_us.store(0, Ordering::SeqCst);
        self.shared.kick_now();
    }

    /// Gives the wake-up the calling thread deferred while it submitted a
    /// batch for the READs it queued: a caller that polls for its tasks
    /// (it did in the last millisecond) does the first round of them
    /// itself at once, as its next poll would (at most [`BATCH`] READs or
    /// [`BATCH_BYTES`]; the round kicks our threads for the rest), instead
    /// of waking a thread and then waiting for it; otherwise one kick
    /// wakes a thread. (Posts to a target's ring ring it at once: its
    /// threads copy while the caller still posts.)
    pub fn flush(&self) {
        let mut owed = false;
        for (core, slices) in reads::take_staged() {
            match core.post_staged(slices) {
                Some(s) if Arc::ptr_eq(&s, &self.shared) => owed = true,
                // Another engine's READs, staged on this thread: its own
                // threads take them.
                Some(s) => s.kick_now(),
                None => {}
            }
        }
        if self.shared.kick_owed.swap(false, Ordering::SeqCst) || owed {
            if self.shared.caller_helps() {
                self.help();
            } else {
                self.shared.kick_now();
            }
        }
    }

    /// Bytes moved so far.
    pub fn stats(&self) -> ShmStats {
        let c = &self.shared.counters;
        ShmStats {
            written: c.written.load(Ordering::Relaxed),
            read: c.read.load(Ordering::Relaxed),
            served: c.served.load(Ordering::Relaxed),
            mapped: c.mapped.load(Ordering::Relaxed),
            attached: c.attached.load(Ordering::Relaxed),
        }
    }

    /// Rings served now (attached initiators).
    #[cfg(test)]
    pub fn served_peers(&self) -> usize {
        self.shared.served().len()
    }

    /// Stops every thread (each finishes the copy it is in), fails what is
    /// queued or in flight, and closes every ring: afterwards no copy for
    /// a peer runs in this process. Also waits for attaches under way.
    pub fn shutdown(&self) {
        if self.shared.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        sys::signal(&self.shared.kick);
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        for w in workers {
            if w.join().is_err() {
                tracing::warn!("shm: a thread panicked");
            }
        }
        for s in self.shared.served().iter() {
            serve::drop_ring(&self.shared, s);
        }
        for l in self.shared.links().iter() {
            l.core.fail_all(Outcome::Interrupted);
        }
        // Dropped, the kept peers detach (failing what they still hold).
        drop(std::mem::take(&mut *crate::sync::lock(&self.peers)));
        for job in self.shared.reads.take_all() {
            job.slices
                .into_iter()
                .for_each(|s| s.finish(Outcome::Interrupted));
        }
        peer::drain(&self.shared, Some(self.shared.opts.timeout));
        peer::join_attaches(&self.shared);
    }
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How a link's error ends a slice and what it says about the peer.
fn outcome_of(e: cma::CopyError) -> Outcome {
    match e {
        cma::CopyError::Denied => Outcome::Unreachable,
        cma::CopyError::Gone => Outcome::Failed { hard: true },
        cma::CopyError::Fault(_) => Outcome::Failed { hard: false },
    }
}

/// Points where tests widen race windows or hold a thread (compiled in
/// test builds only).
#[cfg(test)]
pub(crate) mod test_hooks {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::time::Duration;

    /// While set, [`preempt`] yields or sleeps a few microseconds.
    pub static PREEMPT: AtomicBool = AtomicBool::new(false);
    /// How many more threads [`hold_before_copy`] holds.
    pub static HOLDS: AtomicUsize = AtomicUsize::new(0);
    /// While set, the threads held stay held.
    pub static HOLDING: AtomicBool = AtomicBool::new(false);
    /// Threads held now.
    pub static HELD: AtomicUsize = AtomicUsize::new(0);
    static NEXT: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);

    /// At a point where another thread's interleaving matters: sometimes
    /// lets other threads run first.
    pub fn preempt() {
        if !PREEMPT.load(Ordering::Relaxed) {
            return;
        }
        let x = NEXT.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        let x = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        match x >> 61 {
            0..=3 => {}
            4 | 5 => std::thread::yield_now(),
            _ => std::thread::sleep(Duration::from_micros(x % 200)),
        }
    }

    /// Between the claim of a WRITE and its copy: the first [`HOLDS`]
    /// threads to come here wait while [`HOLDING`].
    pub fn hold_before_copy() {
        let take = |n: usize| n.checked_sub(1);
        if HOLDS
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, take)
            .is_err()
        {
            return;
        }
        HELD.fetch_add(1, Ordering::SeqCst);
        while HOLDING.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        HELD.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod proc_tests;
#[cfg(test)]
mod tests;
