//! A peer's [`Route`]: its rails, their health cells and the preferences
//! of both priority matrices for every pair of locations, worked out once
//! per peer descriptor and kept in the segment's route cache (in the slot
//! of the scheduler's [`Kind`](crate::transport::Kind)).

use super::rails::RailCell;
use super::{Carrier, Rail, Scheduler};
use crate::segment::RemoteSegment;
use std::sync::Arc;
use tracing::debug;

/// The rails of a route that both matrices prefer for one pair of
/// locations, and the others, each in rail order.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) preferred: Box<[usize]>,
    pub(super) rest: Box<[usize]>,
}

/// Index of `loc` among `locs`, else of `*`, else `locs.len()` (no entry).
pub(super) fn slot_of(locs: &[String], loc: &str) -> usize {
    locs.iter()
        .position(|l| l == loc)
        .or_else(|| locs.iter().position(|l| l == "*"))
        .unwrap_or(locs.len())
}

/// The rails to one peer segment, with their health cells and the
/// preferences of both matrices worked out once for every pair of
/// locations (ours, the peer's).
pub struct Route<T> {
    pub(super) rails: Vec<Rail<T>>,
    /// One per rail.
    pub(super) cells: Vec<Arc<RailCell>>,
    /// Locations of our matrix; slot `len()` is a location without entry.
    pub(super) local_locs: Vec<String>,
    /// Locations of the peer's matrix, likewise.
    pub(super) peer_locs: Vec<String>,
    /// The peer location slot of each buffer of the descriptor.
    pub(super) buffer_slots: Vec<usize>,
    /// By `local slot * (peer_locs.len() + 1) + peer slot`.
    pub(super) groups: Vec<Group>,
}

impl<T> std::fmt::Debug for Route<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field(
                "rails",
                &self.rails.iter().map(|r| &r.key).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl<T> Route<T> {
    pub(super) fn group(&self, local_slot: usize, buffer: Option<usize>) -> &Group {
        let peer = buffer.map_or_else(|| slot_of(&self.peer_locs, "*"), |b| self.buffer_slots[b]);
        &self.groups[local_slot * (self.peer_locs.len() + 1) + peer]
    }
}

impl<C: Carrier> Scheduler<C> {
    fn route(&self, seg: &RemoteSegment) -> Route<C::Target> {
        let rails = self.carrier.rails(seg);
        debug!(
            "route to {}: {:?}",
            seg.name,
            rails.iter().map(|r| &r.key).collect::<Vec<_>>()
        );
        let cells = rails.iter().map(|r| self.health.cell(&r.key)).collect();
        let peer_matrix = seg.desc.peer_matrix();
        let local_locs: Vec<String> = self.matrix.locations().map(str::to_owned).collect();
        let peer_locs: Vec<String> = peer_matrix
            .as_ref()
            .map(|m| m.locations().map(str::to_owned).collect())
            .unwrap_or_default();
        let devices = self.carrier.devices();
        let peer_devices = &seg.desc.devices;
        let mut groups = Vec::new();
        for l in 0..=local_locs.len() {
            let pref: &[String] = local_locs
                .get(l)
                .and_then(|loc| self.matrix.entry(loc))
                .map_or(&[], |(p, _)| p);
            for p in 0..=peer_locs.len() {
                let peer_pref: Option<&[String]> = peer_locs
                    .get(p)
                    .zip(peer_matrix.as_ref())
                    .and_then(|(loc, m)| m.entry(loc))
                    .map(|(p, _)| p)
                    .filter(|p| !p.is_empty());
                let preferred = |r: &Rail<C::Target>| {
                    let local = match r.device {
                        None => true,
                        Some(i) => pref.is_empty() || pref.contains(&devices[i]),
                    };
                    let peer = match (peer_pref, r.peer_device) {
                        (Some(p), Some(j)) => {
                            peer_devices.get(j).is_some_and(|d| p.contains(&d.name))
                        }
                        _ => true,
                    };
                    local && peer
                };
                let (preferred, rest): (Vec<usize>, Vec<usize>) =
                    (0..rails.len()).partition(|&i| preferred(&rails[i]));
                groups.push(Group {
                    preferred: preferred.into(),
                    rest: rest.into(),
                });
            }
        }
        let buffer_slots = seg
            .desc
            .buffers
            .iter()
            .map(|b| slot_of(&peer_locs, &b.name))
            .collect();
        Route {
            rails,
            cells,
            local_locs,
            peer_locs,
            buffer_slots,
            groups,
        }
    }

    /// The cached rails to `seg`, worked out on first use (uncached if
    /// the scheduler's slot holds another type: never, each transport of
    /// the table has its own).
    pub(super) fn route_of(&self, seg: &RemoteSegment) -> Arc<Route<C::Target>> {
        seg.routes
            .slot(self.kind.index)
            .get_or_init_arc(|| self.route(seg))
            .unwrap_or_else(|| Arc::new(self.route(seg)))
    }
}
