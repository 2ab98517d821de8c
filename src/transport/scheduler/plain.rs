//! A carrier that needs no address per rail, for the scheduler's tests and
//! the per-slice benchmark (`bench.rs`, feature `bench-internals`):
//! its [`TransportBase`](crate::transport::TransportBase), the
//! [`Carrier`](super::Carrier) methods every such carrier shares, the
//! [`Kind`] its scheduler is made with (its routes go in the segment's
//! route-cache slot after the transport table's), and its rails. Not in
//! the shipped library.

use super::Rail;
use crate::segment::{ROUTE_SLOTS, RemoteSegment};
use crate::transport::Kind;

/// The kind of a scheduler over a carrier for benches and tests, named
/// `protocol`: the last slot of a segment's route cache, which no
/// transport of the table takes.
pub(super) fn kind(protocol: &'static str) -> Kind {
    Kind {
        protocol,
        index: ROUTE_SLOTS - 1,
        names_descriptor: false,
    }
}

/// The [`TransportBase`](crate::transport::TransportBase) of a carrier
/// `$carrier` for benches and tests: every peer speaks it, and it has
/// nothing to stop.
macro_rules! plain_carrier_base {
    ($carrier:ty) => {
        impl crate::transport::TransportBase for $carrier {
            fn speaks(&self, _: &crate::segment::RemoteSegment) -> bool {
                true
            }

            fn shutdown(&self) {}
        }
    };
}
pub(super) use plain_carrier_base;

/// The methods of a carrier for benches and tests beside its
/// [`plain_carrier_base`]: every peer's buffers are reached over it, it
/// publishes nothing, and `$devices` is the field holding its device
/// names.
macro_rules! plain_carrier_basics {
    ($devices:ident) => {
        fn publish(
            &self,
            _: &mut crate::metadata::descriptor::SegmentDesc,
            _: &crate::memory::MemoryRegistry,
            _: &crate::topology::PriorityMatrix,
        ) {
        }

        fn reaches(&self, _: &crate::segment::RemoteSegment, _: usize) -> bool {
            true
        }

        fn devices(&self) -> &[String] {
            &self.$devices
        }
    };
}
pub(super) use plain_carrier_basics;

/// Every device of `devices` to every device `seg` publishes, as RDMA
/// builds its rails.
pub(super) fn all_pairs(devices: &[String], seg: &RemoteSegment) -> Vec<Rail<()>> {
    let mut rails = Vec::new();
    for (i, local) in devices.iter().enumerate() {
        for (j, peer) in seg.desc.devices.iter().enumerate() {
            rails.push(Rail {
                key: format!("{local}@{}/{}", seg.name, peer.name),
                device: Some(i),
                peer_device: Some(j),
                target: (),
            });
        }
    }
    rails
}
