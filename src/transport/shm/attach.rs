//! The attach handshake, both sides.
//!
//! Request (initiator to target): our boot id, pid, and where in our memory
//! a random 16-byte token lies, with its value; and our registration
//! table's descriptor number and nonce. The target reads the token from
//! that pid with `process_vm_readv`: equal, the pid is the asking process
//! in the target's pid namespace, and the kernel lets the target read it
//! (which every WRITE needs). It takes and checks our table (to know which
//! of our memfd-backed buffers a WRITE may be copied from, and when to
//! drop its mappings of them). The target creates a ring and two
//! eventfds for it and answers with its pid, a random nonce written into
//! the ring's header, the table's nonce, and the descriptor numbers. The
//! initiator takes the descriptors with `pidfd_getfd` (which needs the
//! permission every READ needs) and checks both nonces: equal, the pid is
//! the target's process in the initiator's namespace.

use super::cma::{self, Piece};
use super::maps::PeerMaps;
use super::peer::Link;
use super::ring::Ring;
use super::serve::{self, Initiator, RingParts, Served};
use super::table::TableReader;
use super::{Shared, VERSION, sys};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

/// Our attach request.
pub(crate) fn request(shared: &Shared) -> Value {
    json!({
        "version": VERSION,
        "boot_id": shared.boot_id,
        "pid": shared.pid,
        "token_addr": shared.token.as_ptr() as u64,
        "token": [shared.token[0], shared.token[1]],
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
    match try_serve(shared, request) {
        Ok(v) => v,
        Err(e) => {
            crate::warn_limited!("shm: attach request from {source} refused: {e}");
            json!({ "error": e })
        }
    }
}

fn try_serve(shared: &Shared, req: &Value) -> Result<Value, String> {
    if shared.closing() {
        return Err("the engine is shutting down".into());
    }
    if number(req, "version")? != VERSION {
        return Err("another version of the shared-memory transport".into());
    }
    if field(req, "boot_id")?.as_str() != Some(shared.boot_id.as_str()) {
        return Err("the initiator runs on another host or kernel".into());
    }
    let pid = pid_of(req)?;
    let token_addr = number(req, "token_addr")?;
    let token = field(req, "token")?
        .as_array()
        .filter(|a| a.len() == 2)
        .and_then(|a| Some([a[0].as_u64()?, a[1].as_u64()?]))
        .ok_or("\"token\" is not two numbers")?;
    let pidfd = sys::pidfd_open(pid).map_err(|e| format!("pidfd_open({pid}): {e}"))?;
    let mut seen = [0u64; 2];
    let piece = Piece {
        local: seen.as_mut_ptr() as u64,
        remote: token_addr,
        len: 16,
    };
    // SAFETY: `seen` is ours, 16 bytes, and untouched during the call.
    let read = unsafe { cma::read_from(pid, &[piece]) };
    match read[0] {
        Err(e) => return Err(format!("cannot read the memory of process {pid}: {e:?}")),
        Ok(()) if seen != token => {
            return Err(format!(
                "process {pid} here is not the one that asked (another pid namespace?)"
            ));
        }
        Ok(()) => {}
    }
    let table_fd =
        i32::try_from(number(req, "table_fd")?).map_err(|_| "\"table_fd\" is out of range")?;
    let table = sys::pidfd_getfd(&pidfd, table_fd)
        .map_err(|e| e.to_string())
        .and_then(|fd| {
            TableReader::open(&fd, number(req, "table_nonce")?).map_err(|e| e.to_string())
        })
        .map_err(|e| format!("the table of process {pid}: {e}"))?;
    if sys::exited(&pidfd) {
        return Err(format!("process {pid} exited"));
    }
    let _serial = shared.serving.lock().unwrap_or_else(|e| e.into_inner());
    let nonce = sys::random_u64();
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let (ring, memfd) =
        Ring::create(shared.opts.ring_entries, nonce).map_err(|e| io("request ring", e))?;
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
            token,
            pidfd,
            table,
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
/// and checks them. `pid` is the target's pid from its descriptor; at most
/// `max_mappings` of its buffers will be mapped.
pub(crate) fn connect(reply: &Value, pid: i32, max_mappings: usize) -> Result<Link, String> {
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
    let table = TableReader::open(&take("table_fd")?, number(reply, "table_nonce")?)
        .map_err(|e| format!("{e} (another pid namespace?)"))?;
    let to_target = take("to_target_fd")?;
    let to_initiator = take("to_initiator_fd")?;
    if sys::exited(&pidfd) {
        return Err(format!("process {pid} exited"));
    }
    Ok(Link {
        ring,
        table,
        maps: PeerMaps::new(max_mappings),
        pid,
        pidfd,
        to_target,
        to_initiator,
    })
}
