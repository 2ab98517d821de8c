//! The RDMA transport as the engine installs it: the scheduler's adapter
//! (a device is an RDMA device, and a rail pairs one of ours with one the
//! peer publishes in its descriptor: any pair, as RoCE and InfiniBand
//! fabrics route between all of them (with `MC_ENABLE_DEST_DEVICE_AFFINITY`
//! a device of ours whose namesake the peer publishes pairs with that one
//! only); the peer's key for a slice is its
//! `rkey` for the target buffer on the rail's peer device), its descriptor
//! keys (`devices`, `priority_matrix`, `rdma_server_name` with
//! `MC_RDMA_BIND_ADDRESS`, each buffer's location and keys),
//! its handshake (Connection requests), and its installation.

use super::PeerRecord;
use crate::error::{Error, Result};
use crate::memory::{MemoryRegistry, Region};
use crate::metadata::descriptor::{BufferDesc, DeviceDesc, SegmentDesc};
use crate::segment::RemoteSegment;
use crate::topology::{PriorityMatrix, RailFilter};
use crate::transport::rdma::{HANDSHAKE, PROTOCOL, RdmaTarget, RdmaTransport, nic_path};
use crate::transport::scheduler::{Carrier, Rail, Scheduler};
use crate::transport::{Handshake, InstallContext, Slice, Transport, TransportBase};
use std::sync::Arc;
use tracing::info;

/// Largest slice of one RDMA work request (the verbs limit is 2 GiB).
const MAX_SLICE: u64 = 1 << 30;

/// The RDMA transport as the scheduler drives it.
pub struct RdmaCarrier {
    rdma: Arc<RdmaTransport>,
    /// `MC_ENABLE_DEST_DEVICE_AFFINITY`.
    affinity: bool,
    /// Our NIC paths' server name when it is not the engine's name
    /// (`MC_RDMA_BIND_ADDRESS`), published as `rdma_server_name`.
    rdma_server_name: Option<String>,
}

impl RdmaCarrier {
    /// The adapter over `rdma`; `affinity`: `MC_ENABLE_DEST_DEVICE_AFFINITY`.
    pub fn new(rdma: Arc<RdmaTransport>, affinity: bool) -> RdmaCarrier {
        RdmaCarrier {
            rdma,
            affinity,
            rdma_server_name: None,
        }
    }
}

/// The server name of our NIC paths, as Mooncake's: with
/// `MC_RDMA_BIND_ADDRESS` (`bind`), that address with the port of the
/// engine's name `local_name` (the handshake port when it has none), else
/// the engine's name.
fn rdma_server_name(local_name: &str, bind: Option<&str>, handshake_port: u16) -> String {
    match bind {
        Some(addr) => {
            let (_, port) = crate::rpc::parse_host_port(local_name, handshake_port);
            crate::rpc::server_name(addr, port)
        }
        None => local_name.to_string(),
    }
}

/// The rails from our devices `local` to the peer devices `peer`, as
/// (local index, peer index): every pair, or with `affinity` only the
/// pair to the peer device of the same name for a local device that has
/// one (Mooncake's `MC_ENABLE_DEST_DEVICE_AFFINITY`).
fn rail_pairs(local: &[String], peer: &[&str], affinity: bool) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    for (i, name) in local.iter().enumerate() {
        let same = peer.iter().position(|p| p == name).filter(|_| affinity);
        match same {
            Some(j) => pairs.push((i, j)),
            None => pairs.extend((0..peer.len()).map(|j| (i, j))),
        }
    }
    pairs
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
    let rails = RailFilter::new(filters, ctx.device_filter, ctx.config.rdma.ib_port);
    let allowed = |d: &String| rails.rail(d);
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
    let server = rdma_server_name(
        ctx.local_name,
        ctx.config.rdma.bind_address.as_deref(),
        ctx.config.rpc.handshake_port,
    );
    if server != ctx.local_name {
        info!(
            "RDMA NIC paths use {server} (MC_RDMA_BIND_ADDRESS; the handshake stays on {})",
            ctx.local_name
        );
    }
    let rdma = Arc::new(RdmaTransport::start(
        &wanted,
        &server,
        ctx.config,
        ctx.auth.clone(),
        ctx.republish.clone(),
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
    let carrier = RdmaCarrier {
        rdma_server_name: (server != ctx.local_name).then_some(server),
        ..RdmaCarrier::new(rdma, ctx.config.rdma.dest_device_affinity)
    };
    Ok(Scheduler::new(carrier, matrix, ctx.config.sched, ctx.kind))
}

impl TransportBase for RdmaCarrier {
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

    fn handshake(&self) -> Option<Handshake> {
        Some(Handshake::served_by(
            HANDSHAKE,
            &self.rdma,
            RdmaTransport::accept,
        ))
    }

    fn speaks(&self, seg: &RemoteSegment) -> bool {
        seg.desc.protocol == PROTOCOL && !seg.desc.devices.is_empty()
    }

    fn needs_registered_source(&self) -> bool {
        true
    }

    fn moves_device_memory(&self) -> bool {
        true
    }

    fn shutdown(&self) {
        self.rdma.shutdown();
    }
}

impl Carrier for RdmaCarrier {
    type Target = RdmaTarget;

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
        desc.rdma_server_name = self.rdma_server_name.clone();
        // One entry per registered piece (several for a buffer larger than
        // the largest memory region, as Mooncake publishes it).
        desc.buffers = std::mem::take(&mut desc.buffers)
            .into_iter()
            .flat_map(|b| {
                let (Some(pieces), Some(region)) = (self.rdma.keys(b.addr), memory.find(b.addr, 1))
                else {
                    return Vec::new();
                };
                pieces
                    .into_iter()
                    .map(|p| BufferDesc {
                        name: region.location.to_string(),
                        addr: p.addr,
                        length: p.len,
                        lkey: p.lkey,
                        rkey: p.rkey,
                    })
                    .collect()
            })
            .collect();
    }

    fn reaches(&self, seg: &RemoteSegment, buffer: usize) -> bool {
        self.speaks(seg)
            && seg
                .desc
                .buffers
                .get(buffer)
                .is_some_and(|b| !b.rkey.is_empty())
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
        let local = self.rdma.device_names();
        let peer: Vec<&str> = seg.desc.devices.iter().map(|d| d.name.as_str()).collect();
        rail_pairs(local, &peer, self.affinity)
            .into_iter()
            .map(|(i, j)| {
                let peer = &seg.desc.devices[j];
                Rail {
                    key: format!("{}@{}/{}", local[i], seg.name, peer.name),
                    device: Some(i),
                    peer_device: Some(j),
                    target: RdmaTarget {
                        peer_nic_path: nic_path(server, &peer.name),
                        rpc_host: seg.data_host.clone(),
                        rpc_port: seg.rpc_port,
                        peer_gid: peer.gid.clone(),
                        peer_lid: peer.lid,
                    },
                }
            })
            .collect()
    }

    fn endpoint_pool(&self) -> Option<crate::transport::EndpointPool> {
        Some(self.rdma.endpoint_pool())
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

    fn local_limit(&self, addr: u64) -> Option<u64> {
        self.rdma.piece_end(addr)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn affinity_pairs_devices_of_the_same_name() {
        let local = names(&["mlx5_0", "mlx5_1", "mlx5_9"]);
        let peer = ["mlx5_1", "mlx5_0"];
        assert_eq!(
            rail_pairs(&local, &peer, false),
            vec![(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)],
            "without affinity every pair is a rail"
        );
        assert_eq!(
            rail_pairs(&local, &peer, true),
            vec![(0, 1), (1, 0), (2, 0), (2, 1)],
            "mlx5_0 and mlx5_1 reach their namesakes only; mlx5_9 has none and keeps all"
        );
        assert!(rail_pairs(&local, &[], true).is_empty());
    }

    #[test]
    fn bind_address_names_the_nic_paths() {
        assert_eq!(
            rdma_server_name("10.0.0.1:15001", None, 12001),
            "10.0.0.1:15001"
        );
        assert_eq!(
            rdma_server_name("10.0.0.1:15001", Some("192.168.7.1"), 12001),
            "192.168.7.1:15001"
        );
        assert_eq!(
            rdma_server_name("node-a", Some("192.168.7.1"), 12001),
            "192.168.7.1:12001"
        );
        assert_eq!(
            rdma_server_name("node-a", Some("fd00::1"), 12001),
            "[fd00::1]:12001"
        );
    }
}
