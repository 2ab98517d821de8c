//! The RDMA transport as the engine installs it: the scheduler's adapter
//! (a device is an RDMA device, and a rail pairs one of ours with one the
//! peer publishes in its descriptor: any pair, as RoCE and InfiniBand
//! fabrics route between all of them; the peer's key for a slice is its
//! `rkey` for the target buffer on the rail's peer device), its descriptor
//! keys (`devices`, `priority_matrix`, each buffer's location and keys),
//! its handshake (Connection requests), and its installation.

use super::PeerRecord;
use crate::error::{Error, Result};
use crate::memory::{MemoryRegistry, Region};
use crate::metadata::descriptor::{DeviceDesc, SegmentDesc};
use crate::rpc::FrameKind;
use crate::segment::RemoteSegment;
use crate::topology::PriorityMatrix;
use crate::transport::rdma::{RdmaTarget, RdmaTransport, nic_path};
use crate::transport::scheduler::{Carrier, Rail, Scheduler};
use crate::transport::{Handshake, InstallContext, Slice, Transport};
use std::sync::Arc;

/// Largest slice of one RDMA work request (the verbs limit is 2 GiB).
const MAX_SLICE: u64 = 1 << 30;

/// The RDMA transport as the scheduler drives it.
pub struct RdmaCarrier {
    rdma: Arc<RdmaTransport>,
}

impl RdmaCarrier {
    /// The adapter over `rdma`.
    pub fn new(rdma: Arc<RdmaTransport>) -> RdmaCarrier {
        RdmaCarrier { rdma }
    }
}

/// Starts the RDMA transport on the devices of the given matrix (or of
/// the discovered topology), restricted by `MC_TE_FILTERS` and the
/// engine's device filter, and registers every buffer registered so far on
/// them. Devices left out or that cannot be set up leave the published
/// matrix, so peers index our devices as we do.
pub fn install(ctx: &InstallContext<'_>) -> Result<Arc<dyn Transport>> {
    // Discovery (hwloc) is only needed to build a matrix.
    let mut matrix = match &ctx.matrix {
        Some(m) => m.clone(),
        None => {
            let topo = (ctx.topology)();
            if !topo.rdma_devices.iter().any(|d| d.ports_active) {
                return Err(Error::DeviceNotFound(
                    "no RDMA device with an active port on this machine (rdma needs an \
                     InfiniBand, RoCE or iWARP NIC, or soft-RoCE); install \"tcp\" instead"
                        .into(),
                ));
            }
            PriorityMatrix::from_topology(&topo)
        }
    };
    let filters = &ctx.config.topology.filters;
    let allowed = |d: &String| {
        (filters.is_empty() || filters.contains(d))
            && (ctx.device_filter.is_empty() || ctx.device_filter.contains(d))
    };
    let wanted: Vec<String> = matrix
        .devices()
        .iter()
        .filter(|d| allowed(d))
        .cloned()
        .collect();
    if wanted.is_empty() {
        return Err(Error::DeviceNotFound(format!(
            "no RDMA device to use: the priority matrix {} names none{}{}",
            matrix.to_json(),
            if filters.is_empty() {
                String::new()
            } else {
                format!(" that MC_TE_FILTERS={} allows", filters.join(","))
            },
            if ctx.device_filter.is_empty() {
                String::new()
            } else {
                format!(" among the devices {}", ctx.device_filter.join(","))
            }
        )));
    }
    let rdma = Arc::new(RdmaTransport::start(
        &wanted,
        ctx.local_name,
        ctx.config,
        ctx.auth.clone(),
    )?);
    for d in matrix.devices().to_vec() {
        if !rdma.device_names().contains(&d) {
            matrix.disable_device(&d);
        }
    }
    let matrix = PriorityMatrix::parse(&matrix.to_json().to_string())?;
    if matrix.devices() != rdma.device_names() {
        rdma.shutdown();
        return Err(Error::Context(format!(
            "RDMA devices {:?} do not follow the priority matrix order {:?}",
            rdma.device_names(),
            matrix.devices()
        )));
    }
    let regions: Vec<Region> = crate::sync::read(ctx.memory).regions().cloned().collect();
    for r in &regions {
        // SAFETY: registered buffers stay mapped until the caller
        // unregisters them (the C API's contract), which also removes them
        // from this transport.
        if let Err(e) = unsafe { rdma.register(r.addr, r.length, r.remote_accessible) } {
            rdma.shutdown();
            return Err(e);
        }
    }
    let peers = ctx.peers.clone();
    rdma.set_peer_lookup(Box::new(move |server, fresh, opts| {
        let (rpc_host, desc) = peers.peer(server, fresh, opts)?;
        Ok(PeerRecord {
            rpc_host,
            devices: desc.devices.into_iter().map(|d| (d.name, d.gid)).collect(),
        })
    }));
    Ok(Scheduler::new(
        RdmaCarrier::new(rdma),
        matrix,
        ctx.config.sched,
    ))
}

impl Carrier for RdmaCarrier {
    type Target = RdmaTarget;

    fn protocol(&self) -> &'static str {
        "rdma"
    }

    fn rank(&self) -> u8 {
        1
    }

    fn descriptor_rank(&self) -> Option<u8> {
        Some(0)
    }

    unsafe fn register(&self, region: &Region) -> Result<()> {
        // SAFETY: the caller keeps the region mapped until it is
        // unregistered, as this method requires.
        unsafe {
            self.rdma
                .register(region.addr, region.length, region.remote_accessible)
                .map(drop)
        }
    }

    fn unregister(&self, addr: u64) {
        self.rdma.unregister(addr);
    }

    fn publish(&self, desc: &mut SegmentDesc, memory: &MemoryRegistry, matrix: &PriorityMatrix) {
        desc.devices = self
            .rdma
            .devices()
            .into_iter()
            .map(|d| DeviceDesc {
                name: d.name,
                lid: d.lid,
                gid: d.gid,
            })
            .collect();
        desc.priority_matrix = Some(matrix.to_json());
        desc.buffers.retain_mut(|b| {
            let (Some(keys), Some(region)) = (self.rdma.keys(b.addr), memory.find(b.addr, 1))
            else {
                return false;
            };
            b.name = region.location.to_string();
            b.lkey = keys.lkey;
            b.rkey = keys.rkey;
            true
        });
    }

    fn handshake(&self) -> Option<Handshake> {
        let rdma = self.rdma.clone();
        Some(Handshake {
            kind: FrameKind::Connection,
            answer: Box::new(move |request, from| rdma.accept(request, from)),
        })
    }

    fn speaks(&self, seg: &RemoteSegment) -> bool {
        seg.desc.protocol == "rdma" && !seg.desc.devices.is_empty()
    }

    fn reaches(&self, seg: &RemoteSegment, buffer: usize) -> bool {
        self.speaks(seg)
            && seg
                .desc
                .buffers
                .get(buffer)
                .is_some_and(|b| !b.rkey.is_empty())
    }

    fn needs_registered_source(&self) -> bool {
        true
    }

    fn devices(&self) -> &[String] {
        self.rdma.device_names()
    }

    fn rails(&self, seg: &RemoteSegment) -> Vec<Rail<RdmaTarget>> {
        let server = seg
            .desc
            .rdma_server_name
            .as_deref()
            .unwrap_or(&seg.desc.name);
        let mut rails = Vec::new();
        for (i, local) in self.rdma.device_names().iter().enumerate() {
            for (j, peer) in seg.desc.devices.iter().enumerate() {
                rails.push(Rail {
                    key: format!("{local}@{}/{}", seg.name, peer.name),
                    device: Some(i),
                    peer_device: Some(j),
                    target: RdmaTarget {
                        peer_nic_path: nic_path(server, &peer.name),
                        rpc_host: seg.data_host.clone(),
                        rpc_port: seg.rpc_port,
                        peer_gid: peer.gid.clone(),
                        peer_lid: peer.lid,
                    },
                });
            }
        }
        rails
    }

    fn post(&self, rail: &Rail<RdmaTarget>, slice: Slice, remote_key: u32) {
        match rail.device {
            Some(i) => self.rdma.post(i, &rail.target, slice, remote_key),
            None => slice.finish(crate::transport::Outcome::Failed { hard: true }),
        }
    }

    fn probe(&self, rail: &Rail<RdmaTarget>, done: Box<dyn FnOnce(bool) + Send>) {
        match rail.device {
            Some(i) => self.rdma.probe(i, &rail.target, done),
            None => done(false),
        }
    }

    fn device_usable(&self, device: usize) -> bool {
        self.rdma.device_usable(device)
    }

    fn max_slice(&self) -> u64 {
        MAX_SLICE
    }

    fn uses_paused_rails(&self) -> bool {
        // A paused rail failed a handshake or stopped completing: with
        // every rail to the peer paused, slices fail at once instead of
        // waiting for a handshake or a stall each.
        false
    }

    fn retries_failed_rails(&self) -> bool {
        // An error completion ends its endpoint; the next attempt on the
        // rail sets up a fresh one.
        true
    }

    fn shutdown(&self) {
        self.rdma.shutdown();
    }
}
