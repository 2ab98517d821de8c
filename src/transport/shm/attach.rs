//! The attach handshake, both sides.
//!
//! Request (initiator to target, over the engine's handshake): our boot
//! id, pid, and our registration table's descriptor number and nonce. The
//! target accepts it only from an address of this host, creates a ring and
//! two eventfds for it, and answers with its pid, a nonce written into the
//! ring's header, the table's nonce and the descriptor numbers. Nothing in
//! the request makes the target touch another process yet.
//!
//! The initiator takes the descriptors with `pidfd_getfd` (which needs the
//! permission cross-memory attach needs) and checks both nonces: equal,
//! the pid is the target's process in the initiator's pid namespace. It
//! then copies two words the target chose (in the ring's header, which
//! only a process that took the ring can read) into its own memory and
//! writes their address into the header. Before executing a request the
//! target reads them back from the pid the request named: equal, that pid
//! is the initiator in the target's namespace and the kernel lets the
//! target read it (as every WRITE needs); only then does it take the
//! initiator's table. Else it closes the ring as refused. The target only
//! ever compares memory with words it chose at random, so a request cannot
//! use it to probe another process's memory.

use super::maps::PeerMaps;
use super::ring::Ring;
use super::serve::{self, Initiator, RingParts, Served};
use super::table::{Scan, TableReader};
use super::{Shared, ShmOptions, VERSION, sys};
use serde_json::{Value, json};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Our attach request.
pub(crate) fn request(shared: &Shared) -> Value {
    json!({
        "version": VERSION,
        "boot_id": shared.boot_id,
        "pid": shared.pid,
        "table_fd": shared.table.fd().as_raw_fd(),
        "table_nonce": shared.table.nonce(),
    })
}

fn field<'a>(v: &'a Value, name: &str) -> Result<&'a Value, String> {
    v.get(name).ok_or_else(|| format!("no {name:?}"))
}

fn number(v: &Value, name: &str) -> Result<u64, String> {
    field(v, name)?
        .as_u64()
        .ok_or_else(|| format!("{name:?} is not a number"))
}

fn pid_of(v: &Value) -> Result<i32, String> {
    i32::try_from(number(v, "pid")?)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| "\"pid\" is out of range".to_string())
}

/// The target's answer to an attach request: a ring for the initiator,
/// or `{"error": why}` (logged once per interval).
pub(crate) fn serve(shared: &Shared, request: &Value, source: SocketAddr) -> Value {
    match try_serve(shared, request, source) {
        Ok(v) => v,
        Err(e) => {
            crate::log_limit::warn_limited!("shm: attach request from {source} refused: {e}");
            json!({ "error": e })
        }
    }
}

/// Whether `ip` is an address of this host (a socket can be bound to it).
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || (!ip.is_unspecified() && UdpSocket::bind((ip, 0)).is_ok())
}

fn try_serve(shared: &Shared, req: &Value, source: SocketAddr) -> Result<Value, String> {
    if shared.closing() {
        return Err("the engine is shutting down".into());
    }
    if !is_local(source.ip()) {
        return Err("it does not come from this host".into());
    }
    if number(req, "version")? != VERSION {
        return Err("another version of the shared-memory transport".into());
    }
    if field(req, "boot_id")?.as_str() != Some(shared.boot_id.as_str()) {
        return Err("the initiator runs on another host or kernel".into());
    }
    let pid = pid_of(req)?;
    let table_fd =
        i32::try_from(number(req, "table_fd")?).map_err(|_| "\"table_fd\" is out of range")?;
    let table_nonce = number(req, "table_nonce")?;
    let pidfd = sys::pidfd_open(pid).map_err(|e| format!("pidfd_open({pid}): {e}"))?;
    let _serial = shared.serving.lock().unwrap_or_else(|e| e.into_inner());
    let nonce = sys::random_u64();
    let proof = [sys::random_u64(), sys::random_u64()];
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let (ring, memfd) =
        Ring::create(shared.opts.ring_entries, nonce, proof).map_err(|e| io("request ring", e))?;
    let to_target = sys::eventfd().map_err(|e| io("eventfd", e))?;
    let to_initiator = sys::eventfd().map_err(|e| io("eventfd", e))?;
    let reply = json!({
        "version": VERSION,
        "pid": shared.pid,
        "nonce": nonce,
        "table_nonce": shared.table.nonce(),
        "ring_fd": memfd.as_raw_fd(),
        "table_fd": shared.table.fd().as_raw_fd(),
        "to_target_fd": to_target.as_raw_fd(),
        "to_initiator_fd": to_initiator.as_raw_fd(),
    });
    let served = Arc::new(Served::new(
        shared.new_id(),
        Initiator {
            pid,
            pidfd,
            proof,
            table: (table_fd, table_nonce),
        },
        RingParts {
            ring,
            memfd,
            to_target,
            to_initiator,
        },
        shared.opts.max_mappings,
        shared.now_ms(),
    ));
    serve::add_ring(shared, served).map_err(|e| io("epoll", e))?;
    Ok(reply)
}

/// The initiator's side: takes the target's descriptors named in `reply`
/// and checks them. `pid` is the target's pid from its descriptor; `opts`
/// bound its table (`peer_table_slots`) and our mappings of its buffers
/// (`max_mappings`), and how long it may take to verify us (`timeout`).
pub(crate) fn connect(reply: &Value, pid: i32, opts: &ShmOptions) -> Result<Link, String> {
    let verify_within = opts.timeout;
    if let Some(e) = reply.get("error") {
        return Err(format!("it refused: {e}"));
    }
    if number(reply, "version")? != VERSION {
        return Err("another version of the shared-memory transport".into());
    }
    if pid_of(reply)? != pid {
        return Err("its answer names another process".into());
    }
    let pidfd = sys::pidfd_open(pid).map_err(|e| format!("pidfd_open({pid}): {e}"))?;
    let take = |name: &str| -> Result<OwnedFd, String> {
        let n =
            i32::try_from(number(reply, name)?).map_err(|_| format!("{name:?} is out of range"))?;
        sys::pidfd_getfd(&pidfd, n).map_err(|e| format!("pidfd_getfd({pid}, {n}): {e}"))
    };
    let ring = Ring::open(&take("ring_fd")?, number(reply, "nonce")?)
        .map_err(|e| format!("{e} (another pid namespace?)"))?;
    let table = TableReader::open(
        &take("table_fd")?,
        number(reply, "table_nonce")?,
        pid,
        opts.peer_table_slots,
    )
    .map_err(|e| format!("{e} (another pid namespace?)"))?;
    let to_target = take("to_target_fd")?;
    let to_initiator = take("to_initiator_fd")?;
    if sys::exited(&pidfd) {
        return Err(format!("process {pid} exited"));
    }
    // Our proof for the target: its words, in our memory, for the link's
    // life.
    let proof = Box::new(ring.proof());
    ring.activate(proof.as_ptr() as u64);
    sys::signal(&to_target);
    // Nothing goes over the link, READs included, before the target has
    // verified us: a peer that cannot be reached both ways is reached by
    // another transport both ways.
    let deadline = Instant::now() + verify_within;
    let mut pause = Duration::from_micros(20);
    loop {
        match ring.verdict() {
            Some(true) => break,
            Some(false) => {
                return Err(
                    "it could not read our memory to verify us (another user or pid namespace?)"
                        .into(),
                );
            }
            None if sys::exited(&pidfd) => return Err(format!("process {pid} exited")),
            None if Instant::now() >= deadline => {
                ring.detach();
                return Err(format!("it did not verify us within {verify_within:?}"));
            }
            None => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
        }
    }
    Ok(Link {
        ring,
        table,
        maps: PeerMaps::new(opts.max_mappings),
        pid,
        pidfd,
        to_target,
        to_initiator,
        _proof: proof,
    })
}

/// What the initiator holds of an attached target.
pub(crate) struct Link {
    pub ring: Ring,
    pub table: TableReader,
    /// Our mappings of the target's memfd-backed buffers.
    pub maps: PeerMaps,
    /// The target's pid, checked by the attach.
    pub pid: i32,
    pub pidfd: OwnedFd,
    /// Rung to wake the target's threads.
    pub to_target: OwnedFd,
    /// Rung by the target when it completes a request we wait for.
    pub to_initiator: OwnedFd,
    /// The target's proof words, which it reads from our memory here
    /// (held, never read by us).
    pub _proof: Box<[u64; 2]>,
}

impl Link {
    /// Brings our index of the target's table up to date if it changed
    /// (as `scan` allows), and drops our mappings of the buffers it no
    /// longer names.
    pub fn refresh(&self, scan: Scan<'_>) {
        if self.table.epoch() != self.maps.pruned() {
            self.maps.prune(&self.table.index(scan));
        }
    }

    /// Tells the target we post no more, so that it drops the ring.
    pub fn give_up(&self) {
        self.ring.detach();
        sys::signal(&self.to_target);
    }
}
