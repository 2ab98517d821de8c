//! The shared-memory transport behind the engine's [`Transport`] seam:
//! what it adds to the descriptor (key `"shm"`), the attach handshake it
//! serves ([`ATTACH`]), which peers it reaches (another
//! process on this host), and requests cut into slices that go to the
//! peer's ring or this process's threads. A slice this transport cannot
//! move (the kernel refuses cross-memory attach, the peer detached, it
//! stalled) goes to the next transport; one the target rejects fails.
//! GPU memory is not shared memory: the descriptor lists the buffers in
//! GPU memory (`gpu_buffers`), and requests to them, like requests from
//! this process's GPU memory, go to the next transport (TCP stages them).

use super::{AttachFn, ShmOptions, ShmPeer, ShmTransport};
use crate::batch::TaskRef;
use crate::error::Result;
use crate::memory::{MemoryRegistry, Region, RemoteMemory, Residence};
use crate::metadata::descriptor::SegmentDesc;
use crate::rpc::{ClientOptions, FrameKind};
use crate::segment::RemoteSegment;
use crate::transport::scheduler::planner;
use crate::transport::{
    Discovery, Handshake, InstallContext, Kind, Outcome, Slice, Submission, Transfer, Transport,
    TransportBase, Want,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The protocol name of this transport, as `installTransport` names it
/// (and the descriptor's `protocol` of an engine with no other transport).
pub const PROTOCOL: &str = "shm";

/// The descriptor key under which this transport publishes its
/// [`ShmTransport::descriptor`]; Mooncake peers ignore it.
pub const SHM_KEY: &str = "shm";

/// The key, in the `"shm"` entry, of the buffers in GPU memory (`[[addr,
/// len], ...]`), which shared memory does not reach.
const GPU_BUFFERS_KEY: &str = "gpu_buffers";

/// The buffers a peer's `"shm"` entry lists in GPU memory, as `(addr,
/// len)`; malformed items list nothing.
fn gpu_buffers(shm: Option<&Value>) -> Vec<(u64, u64)> {
    let Some(list) = shm
        .and_then(|v| v.get(GPU_BUFFERS_KEY))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|b| {
            let at = |i: usize| b.get(i).and_then(Value::as_u64);
            Some((at(0)?, at(1)?))
        })
        .collect()
}

/// What this transport works out about a segment on first use, kept with
/// it (a refetched descriptor is a new segment).
struct Route {
    /// The peer behind it, if it is another process of this host.
    peer: Option<ShmPeer>,
    /// The buffers it lists in GPU memory.
    gpu: Vec<(u64, u64)>,
}

impl Route {
    /// Whether `[remote, remote + len)` overlaps a buffer in GPU memory.
    fn in_gpu_memory(&self, remote: u64, len: u64) -> bool {
        let end = remote.saturating_add(len.max(1));
        self.gpu
            .iter()
            .any(|&(addr, n)| addr < end && remote < addr.saturating_add(n))
    }
}

/// The handshake frame a peer attaches with (ours; Mooncake has no such
/// frame, and never sends one).
pub const ATTACH: FrameKind = FrameKind::ShmAttach;

/// The answer to an [`ATTACH`] frame when this transport is not installed.
pub fn not_installed() -> Value {
    json!({"error": "this engine has no shared-memory transport installed"})
}

/// Auto discovery installs shared memory beside the network transport
/// unless `MC_TE_SHM=0`.
pub fn auto(found: &Discovery<'_>) -> Want {
    if found.config.shm.auto_install {
        Want::Try
    } else {
        Want::No("MC_TE_SHM is off")
    }
}

/// Installs the shared-memory transport of an engine.
pub fn install(ctx: &InstallContext<'_>) -> Result<Arc<dyn Transport>> {
    let memory: Arc<dyn RemoteMemory> = ctx.memory.clone();
    let core = ShmTransport::start(memory, ShmOptions::from_config(ctx.config.shm))?;
    let mut rpc = ClientOptions::from_config(ctx.config.rpc);
    rpc.io_timeout = Duration::from_secs(ctx.config.rpc.io_timeout_secs);
    Ok(Arc::new(Shm {
        kind: ctx.kind,
        core,
        rpc,
        auth: ctx.auth.clone(),
        slice_size: ctx.config.shm.slice_size,
        fragment_limit: ctx.config.sched.fragment_limit,
    }))
}

/// The transport of one engine.
struct Shm {
    /// Its entry of the transport table.
    kind: Kind,
    core: Arc<ShmTransport>,
    /// How attach requests are sent, and the cluster keys they
    /// authenticate with.
    rpc: ClientOptions,
    auth: Option<Arc<crate::auth::Keys>>,
    /// `MC_SHM_SLICE_SIZE`: requests are cut into slices of this size.
    slice_size: u64,
    /// A tail up to this size joins the previous slice (`MC_FRAGMENT_RATIO`).
    fragment_limit: u64,
}

impl Shm {
    /// What is known of `seg`, cached with the segment: the peer behind
    /// it, if it is another process of this host (a refetched descriptor
    /// of the same process gets the same peer, its attachment and ring; a
    /// new process a new one), and its buffers in GPU memory.
    fn route<'a>(&self, seg: &'a RemoteSegment) -> Option<&'a Route> {
        seg.routes.slot(self.kind.index).get_or_init(|| {
            let key = seg.desc.extra.get(SHM_KEY);
            let peer = key.and_then(|key| {
                let (host, port) = (seg.data_host.clone(), seg.rpc_port);
                let endpoint = format!("{host}:{port} {}", seg.identity);
                let rpc = ClientOptions {
                    // The proof is bound to the name the segment was opened by.
                    auth: self.auth.clone().map(|k| (k, seg.identity.clone())),
                    ..self.rpc.clone()
                };
                let attach: AttachFn = Arc::new(move |request: &Value| {
                    crate::rpc::call(&host, port, ATTACH, request, &rpc)
                });
                self.core.shared_peer(key, endpoint, attach)
            });
            Route {
                peer,
                gpu: gpu_buffers(key),
            }
        })
    }

    /// The peer behind `seg`, if it is another process of this host.
    fn peer<'a>(&self, seg: &'a RemoteSegment) -> Option<&'a ShmPeer> {
        self.route(seg)?.peer.as_ref()
    }
}

impl TransportBase for Shm {
    unsafe fn register(&self, region: &Region) -> Result<()> {
        self.core.register(region);
        Ok(())
    }

    fn unregister(&self, addr: u64) {
        self.core.unregister(addr);
    }

    fn handshake(&self) -> Option<Handshake> {
        Some(Handshake::served_by(
            ATTACH,
            &self.core,
            ShmTransport::serve_attach,
        ))
    }

    fn speaks(&self, seg: &RemoteSegment) -> bool {
        self.peer(seg).is_some()
    }

    fn shutdown(&self) {
        self.core.shutdown();
    }
}

impl Transport for Shm {
    fn kind(&self) -> Kind {
        self.kind
    }

    fn publish(&self, desc: &mut SegmentDesc, memory: &MemoryRegistry) {
        let mut entry = self.core.descriptor();
        let gpu: Vec<Value> = memory
            .regions()
            .filter(|r| memory.residence(r.addr, r.length) != Residence::Host)
            .map(|r| json!([r.addr, r.length]))
            .collect();
        if !gpu.is_empty() {
            entry[GPU_BUFFERS_KEY] = Value::Array(gpu);
        }
        desc.extra.insert(SHM_KEY.to_string(), entry);
    }

    fn reaches(&self, seg: &RemoteSegment, remote: u64, len: u64) -> bool {
        self.route(seg)
            .is_some_and(|r| r.peer.is_some() && !r.in_gpu_memory(remote, len))
    }

    fn submit(&self, sub: Submission) {
        let Submission {
            batch,
            task,
            seg,
            xfer,
            local: mut side,
            fallback,
            ..
        } = sub;
        let Some(t) = batch.slot(task) else {
            return;
        };
        let Some(peer) = self.peer(&seg) else {
            // Not a peer of this host after all: the next transport.
            t.add_slices(1);
            let handed = Submission::fall_back(&fallback, xfer);
            return t.finish_slice(0, handed);
        };
        let pieces: Vec<(u64, u64)> =
            planner::slices(xfer.len, self.slice_size, self.fragment_limit).collect();
        t.add_slices(pieces.len() as u64);
        let last = pieces.len().saturating_sub(1);
        for (k, (off, len)) in pieces.into_iter().enumerate() {
            let part = Transfer {
                local: xfer.local + off,
                remote: xfer.remote + off,
                len,
                write: xfer.write,
            };
            let of_task = TaskRef::new(batch.clone(), task);
            let (batch, fallback) = (batch.clone(), fallback.clone());
            let done = Box::new(move |outcome: Outcome| {
                let Some(t) = batch.slot(task) else {
                    return;
                };
                match outcome {
                    Outcome::Done => t.finish_slice(len, true),
                    // The target checked the range and refused it: no
                    // other transport would be let in either.
                    Outcome::Rejected => t.finish_slice(0, false),
                    // Our own memory: no other transport can use it either.
                    Outcome::Local => {
                        batch.note_failure(
                            task,
                            "the local memory of a slice could not be used: its buffer was \
                             unregistered during the transfer, or it is not mapped",
                        );
                        t.finish_slice(0, false)
                    }
                    // Withdrawn, or not moved and its task cancelled: the
                    // slice ends, handed to no other transport.
                    Outcome::Canceled => t.finish_slice(0, false),
                    _ if t.is_canceled() => t.finish_slice(0, false),
                    // Unreachable by shared memory, or the link failed:
                    // the next transport moves the slice, if there is one.
                    Outcome::Unreachable | Outcome::Failed { .. } | Outcome::Interrupted => {
                        let handed = Submission::fall_back(&fallback, part);
                        t.finish_slice(0, handed)
                    }
                }
            });
            self.core.post(
                peer,
                Slice {
                    local: part.local,
                    remote: part.remote,
                    len,
                    write: part.write,
                    local_gpu: None,
                    local_fence: if k == last {
                        side.take_fence_for(part.local, len)
                    } else {
                        side.fence_for(part.local, len)
                    },
                    task: Some(of_task),
                    done,
                },
            );
        }
    }

    fn allocate(&self, len: usize) -> Option<Result<u64>> {
        Some(self.core.allocate(len))
    }

    fn free(&self, addr: u64) -> bool {
        self.core.free(addr).is_ok()
    }

    fn help(&self) -> bool {
        self.core.help()
    }

    fn stop_helping(&self) {
        self.core.stop_helping()
    }

    fn withdraw_canceled(&self) {
        self.core.withdraw_canceled()
    }

    fn flush(&self) {
        self.core.flush()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.core.stats();
        vec![
            ("written", s.written),
            ("read", s.read),
            ("served", s.served),
            ("mapped", s.mapped),
            ("attached", s.attached),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_overlapping_a_listed_gpu_buffer_are_not_reached() {
        let entry = json!({"pid": 1, GPU_BUFFERS_KEY: [[0x1000, 0x1000], "bad", [0x8000]]});
        let route = Route {
            peer: None,
            gpu: gpu_buffers(Some(&entry)),
        };
        assert_eq!(
            route.gpu,
            vec![(0x1000, 0x1000)],
            "malformed items list nothing"
        );
        assert!(route.in_gpu_memory(0x1000, 1));
        assert!(route.in_gpu_memory(0xff0, 0x20), "a range running into it");
        assert!(route.in_gpu_memory(0x1fff, 8), "a range running out of it");
        assert!(!route.in_gpu_memory(0x2000, 64), "right after it");
        assert!(!route.in_gpu_memory(0x800, 0x800), "right before it");
        assert!(!route.in_gpu_memory(0x8000, 8));
        assert!(gpu_buffers(Some(&json!({"pid": 1}))).is_empty());
        assert!(gpu_buffers(None).is_empty());
    }
}
