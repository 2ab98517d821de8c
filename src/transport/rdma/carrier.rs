//! The scheduler's adapter for the RDMA transport: a device is an RDMA
//! device, and a rail pairs one of ours with one the peer publishes in
//! its descriptor (any pair: RoCE and InfiniBand fabrics route between
//! all of them). The peer's key for a slice is its `rkey` for the target
//! buffer on the rail's peer device.

use crate::segment::RemoteSegment;
use crate::transport::Slice;
use crate::transport::rdma::{RdmaTarget, RdmaTransport, nic_path};
use crate::transport::scheduler::{Carrier, Rail};
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

    /// The transport.
    pub fn transport(&self) -> &Arc<RdmaTransport> {
        &self.rdma
    }
}

impl Carrier for RdmaCarrier {
    type Target = RdmaTarget;

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
