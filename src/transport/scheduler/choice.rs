//! Rail choice: a request's candidate rails in selection order (open
//! preferred rails first, rails back from a pause probed in the
//! background), the first choice for a slice (least loaded or in turn), and
//! the rail for a retry.

use super::job::RailSet;
use super::rails::{DeviceLoad, RailUse};
use super::route::{Group, Route};
use super::{Carrier, Rail, Scheduler};

/// Rails in selection order: open rails of the preferred group first, then
/// the other open ones; with the number preferred, and each one's bytes in
/// flight when they were listed plus what this request has put on it
/// since (a request's slices read the shared counters once).
pub(super) struct Candidates {
    pub(super) order: Vec<usize>,
    pub(super) n_pref: usize,
    pub(super) loads: Vec<u64>,
}

thread_local! {
    /// Per-thread counter of first choices: `MC_PATH_ROUNDROBIN`'s turn,
    /// and where the least-loaded scan starts.
    static TURN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl<C: Carrier> Scheduler<C> {
    pub(super) fn load_of(&self, rail: &Rail<C::Target>) -> &DeviceLoad {
        &self.loads[rail.device.unwrap_or(self.loads.len() - 1)]
    }

    /// Whether a rail's local device can carry slices (a device of the
    /// carrier's that is up, or no device).
    fn usable(&self, rail: &Rail<C::Target>) -> bool {
        rail.device.is_none_or(|i| self.carrier.device_usable(i))
    }

    /// Rail indexes of `group` in selection order: open rails (on open
    /// devices) that both matrices prefer first, then the rest (every
    /// usable rail when none is open, for carriers that use paused rails).
    /// Rails and devices back from a pause are probed in the background;
    /// they take slices again once that succeeds.
    pub(super) fn candidates(&self, route: &Route<C::Target>, group: &Group) -> Candidates {
        let mut order = Vec::with_capacity(group.preferred.len() + group.rest.len());
        let mut n_pref = 0;
        for (k, list) in [&group.preferred, &group.rest].into_iter().enumerate() {
            for &i in list.iter() {
                let rail = &route.rails[i];
                if !self.usable(rail) {
                    continue;
                }
                let device = self.load_of(rail);
                let open = match (route.cells[i].state(), device.state()) {
                    (RailUse::Open, RailUse::Open) => true,
                    (RailUse::Probe, _) => {
                        self.probe_rail(route, i);
                        false
                    }
                    (RailUse::Open, RailUse::Probe) => {
                        self.probe_device(route, i);
                        false
                    }
                    _ => false,
                };
                if open {
                    order.push(i);
                    n_pref += usize::from(k == 0);
                }
            }
        }
        if order.is_empty() && self.carrier.uses_paused_rails() {
            let all = || group.preferred.iter().chain(group.rest.iter()).copied();
            order = all().filter(|&i| self.usable(&route.rails[i])).collect();
            if order.is_empty() {
                order = all().collect();
            }
            n_pref = order
                .iter()
                .take_while(|i| group.preferred.contains(i))
                .count();
        }
        let loads = order.iter().map(|&i| route.cells[i].load()).collect();
        Candidates {
            order,
            n_pref,
            loads,
        }
    }

    /// Probes rail `i` back from a pause, unless another slice took its probe.
    fn probe_rail(&self, route: &Route<C::Target>, i: usize) {
        let cell = &route.cells[i];
        if cell.claim_probe() {
            let cell = cell.clone();
            self.carrier.probe(
                &route.rails[i],
                Box::new(move |ok| match ok {
                    true => cell.record_success(),
                    false => cell.record_error(true),
                }),
            );
        }
    }

    /// Probes the device of rail `i`, back from a pause, over that rail.
    fn probe_device(&self, route: &Route<C::Target>, i: usize) {
        if !self.load_of(&route.rails[i]).claim_probe() {
            return;
        }
        let me = self.me.clone();
        let device = route.rails[i].device;
        let round = self.load_of(&route.rails[i]).round();
        self.carrier.probe(
            &route.rails[i],
            Box::new(move |ok| {
                if let Some(me) = me.upgrade() {
                    let load = &me.loads[device.unwrap_or(me.loads.len() - 1)];
                    match ok {
                        true => load.record_success(),
                        false => load.record_failure(round),
                    }
                }
            }),
        );
    }

    /// The first choice among `c` for a slice of `len` bytes: in the
    /// preferred group (or among all if none is preferred), the
    /// least-loaded rail (ties in turn), or with `MC_PATH_ROUNDROBIN` the
    /// next in turn (per thread, as Mooncake). The slice is added to the
    /// chosen rail's load in `c`.
    pub(super) fn first_choice(&self, c: &mut Candidates, len: u64) -> Option<usize> {
        let n = match c.n_pref {
            0 => c.order.len(),
            n => n,
        };
        if n == 0 {
            return None;
        }
        let turn = TURN.with(|t| {
            let v = t.get();
            t.set(v.wrapping_add(1));
            v
        }) % n;
        let at = if self.round_robin {
            turn
        } else {
            // Ties go round in turn too (rather than to the first rail),
            // so threads spread over rails.
            (turn..n)
                .chain(0..turn)
                .min_by_key(|&k| c.loads[k])
                .expect("n > 0")
        };
        c.loads[at] = c.loads[at].wrapping_add(len);
        Some(c.order[at])
    }

    /// The rail for a retry, among rails the slice has not failed on: the
    /// deterministic walk (then, for carriers that allow it, over the
    /// rails that only had errors). `None` when no rail is left.
    pub(super) fn retry_choice(
        &self,
        c: Candidates,
        attempt: u32,
        tried: &RailSet,
        dead: &RailSet,
    ) -> Option<usize> {
        let mut left: Vec<usize> = c
            .order
            .iter()
            .copied()
            .filter(|&i| !tried.contains(i))
            .collect();
        if left.is_empty() && self.carrier.retries_failed_rails() {
            // Every rail failed once: those that only had an error (not a
            // failed connect) are tried again, up to `MC_RETRY_CNT`.
            left = c.order.into_iter().filter(|&i| !dead.contains(i)).collect();
        }
        (!left.is_empty()).then(|| left[(attempt as usize - 1) % left.len()])
    }
}
