//! A carrier that needs no address per rail, for the scheduler's tests and
//! the per-slice benchmark (`bench.rs`, feature `bench-internals`):
//! its [`TransportBase`](crate::transport::TransportBase) and the
//! [`Carrier`](super::Carrier) methods every such carrier shares (it keeps
//! its routes in the segment's `plain` slot), and its rails. Not in the
//! shipped library.

use super::Rail;
use crate::segment::RemoteSegment;

/// The [`TransportBase`](crate::transport::TransportBase) of a carrier
/// `$carrier` for benches and tests: it names itself `$protocol` and
/// every peer speaks it.
macro_rules! plain_carrier_base {
    ($carrier:ty, $protocol:literal) => {
        impl crate::transport::TransportBase for $carrier {
            fn kind(&self) -> crate::transport::Kind {
                crate::transport::Kind {
                    protocol: $protocol,
                    rank: 0,
                    descriptor_rank: None,
                }
            }

            fn speaks(&self, _: &crate::segment::RemoteSegment) -> bool {
                true
            }
        }
    };
}
pub(super) use plain_carrier_base;

/// The methods of a carrier for benches and tests beside its
/// [`plain_carrier_base`]: every peer's buffers are reached over it, it
/// publishes nothing, keeps its routes in the plain slot, and `$devices`
/// is the field holding its device names.
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

        fn routes(seg: &crate::segment::RemoteSegment) -> &crate::segment::RouteSlot {
            &seg.routes.plain
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
