//! Which transport carries a request to a peer, and which one carries a
//! segment's data now.
//!
//! A request to a remote segment goes to a chain of transports: those
//! installed that reach its target, most preferred first; what one cannot
//! move goes to the next ([`Fallback`]). `MC_TE_REQUIRE_TRANSPORT`
//! ([`TransportSet`]) takes the transports it does not list out of the
//! chain: a request none of the listed ones reaches fails at submit, and a
//! part the last listed one hands over fails instead of going to another.
//! [`dispatch`], the one place a part of a request is handed to a
//! transport, records in the segment's [`Carrier`] which one carries its
//! data now, and logs each change once with its reason;
//! [`Engine::segment_transport`] reads it.

use super::{Engine, LOCAL_SEGMENT_ID};
use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::log_limit::Suppressed;
use crate::segment::RemoteSegment;
use crate::settings::Parse;
use crate::transport::registry::TRANSPORTS;
use crate::transport::{Fallback, Kind, LocalSide, Refresh, Submission, Transfer, Transport};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::{debug, info, warn};

/// The name of the copies within the process (the engine's own segment),
/// as `MC_TE_REQUIRE_TRANSPORT` and [`Engine::segment_transport`] write it.
pub const LOCAL: &str = "local";

/// The bit of `local` in a [`TransportSet`]; the transports of the table
/// take the bits of their index.
const LOCAL_BIT: u32 = 1 << 31;

// Every transport of the table has a bit below `local`'s.
const _: () = assert!(TRANSPORTS.len() < 31);

/// `MC_TE_REQUIRE_TRANSPORT`: the transports requests to peers may go by;
/// empty (unset), any. `local` may be listed and changes nothing: copies
/// within the process are always allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransportSet(u32);

impl TransportSet {
    /// Whether the variable was set (to at least one name).
    pub fn is_set(self) -> bool {
        self.0 != 0
    }

    /// Whether requests may go by the transport at `index` of the
    /// transport table.
    pub fn allows(self, index: usize) -> bool {
        !self.is_set() || self.0 & (1 << index) != 0
    }

    /// Whether it lists the transport at `index`.
    fn lists(self, index: usize) -> bool {
        self.0 & (1 << index) != 0
    }
}

impl fmt::Display for TransportSet {
    /// The names it lists, `local` first, then in the transport table's
    /// order, comma-separated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let local = (self.0 & LOCAL_BIT != 0).then_some(LOCAL);
        let names: Vec<&str> = local
            .into_iter()
            .chain(
                TRANSPORTS
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| self.lists(*i))
                    .map(|(_, e)| e.protocol),
            )
            .collect();
        write!(f, "{}", names.join(","))
    }
}

/// Reads `MC_TE_REQUIRE_TRANSPORT`: a comma list of `local` and the
/// transport table's names (any case); empty is unset, an unknown name
/// refused.
pub(crate) struct TransportNames;

impl Parse<TransportSet> for TransportNames {
    fn parse(&self, raw: &str) -> Option<TransportSet> {
        let mut set = 0;
        for name in raw.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            set |= if name.eq_ignore_ascii_case(LOCAL) {
                LOCAL_BIT
            } else {
                1 << TRANSPORTS
                    .iter()
                    .position(|e| e.protocol.eq_ignore_ascii_case(name))?
            };
        }
        Some(TransportSet(set))
    }
    fn allowed(&self) -> String {
        let names: Vec<String> = std::iter::once(LOCAL)
            .chain(TRANSPORTS.iter().map(|e| e.protocol))
            .map(|n| format!("`{n}`"))
            .collect();
        format!("a comma list of {}", names.join(", "))
    }
    fn show(&self, v: &TransportSet) -> String {
        if v.is_set() {
            v.to_string()
        } else {
            "unset".to_string()
        }
    }
}

/// The transports one request goes to.
#[derive(Clone)]
pub(super) struct Chain {
    /// Those that reach its target and may carry it, most preferred first.
    transports: Arc<[Arc<dyn Transport>]>,
    /// Whether the first of them is the segment's most preferred transport
    /// (not one chosen because the others cannot move this request's
    /// memory): only then does the first carrying a whole request say
    /// which transport carries the segment's data.
    primary: bool,
    /// The transports that reach the target after the last of
    /// `transports` but `MC_TE_REQUIRE_TRANSPORT` leaves out (bits by
    /// index): a part the last one hands over fails, naming them.
    left_out: u32,
    /// `MC_TE_REQUIRE_TRANSPORT`.
    pins: TransportSet,
}

/// Why a segment's carrier is recorded.
#[derive(Clone, Copy)]
enum Why {
    /// The first transport of a request's chain took all of it.
    Carried,
    /// `from` could not move a part of a request and handed it on.
    HandedOn { from: Kind },
}

/// Records that `to` carries `seg`'s data now, and logs a change once (at
/// most one line per interval per segment, with how many changes it did
/// not log).
fn note(seg: &RemoteSegment, to: Kind, why: Why) {
    let Some(before) = seg.carrier.set(to.index) else {
        return;
    };
    let name = |i: usize| TRANSPORTS.get(i).map_or("?", |e| e.protocol);
    if let (Why::Carried, None) = (why, before) {
        return debug!("segment {:?}: its data goes by {}", seg.name, to.protocol);
    }
    let Some(suppressed) = seg.carrier.admit_log() else {
        return;
    };
    let more = Suppressed(suppressed);
    match (why, before) {
        (Why::HandedOn { from }, _) => warn!(
            "segment {:?}: its data goes by {} now, not {}: {} could not move part of a \
             request (the peer cannot be reached by it, or its link or rails failed; its own \
             log line says which){more}",
            seg.name, to.protocol, from.protocol, from.protocol
        ),
        (Why::Carried, b) => info!(
            "segment {:?}: its data goes by {} again, not {}: {} moved a whole request{more}",
            seg.name,
            to.protocol,
            b.map_or("?", name),
            to.protocol
        ),
    }
}

/// Marks a part of a request handed to a transport that may hand it on:
/// dropped (the transport is done with the request) without having handed
/// anything on, it records that the transport carried the whole request.
struct Handover {
    seg: Arc<RemoteSegment>,
    from: Kind,
    /// Whether to record a whole request carried ([`Chain::primary`]).
    record: bool,
    handed: AtomicBool,
}

impl Drop for Handover {
    fn drop(&mut self) {
        if self.record && !*self.handed.get_mut() {
            note(&self.seg, self.from, Why::Carried);
        }
    }
}

/// Hands `xfer` to the `i`th transport of `chain`, with the rest of the
/// chain as its fallback (after the last one: a failure naming what
/// `MC_TE_REQUIRE_TRANSPORT` left out, if it left out any that reach the
/// target, else none), and records which transport carries the segment.
#[allow(clippy::too_many_arguments)]
pub(super) fn dispatch(
    chain: Chain,
    i: usize,
    batch: Arc<Batch>,
    task: usize,
    seg: Arc<RemoteSegment>,
    local: LocalSide,
    xfer: Transfer,
    refresh: Option<Refresh>,
) {
    let here = chain.transports[i].clone();
    let from = here.kind();
    if let Some(t) = batch.slot(task) {
        t.set_route(from.route());
    }
    let last = i + 1 == chain.transports.len();
    if last && i == 0 && chain.primary {
        note(&seg, from, Why::Carried);
    }
    let fallback: Option<Fallback> = if !last {
        let guard = Handover {
            seg: seg.clone(),
            from,
            record: i == 0 && chain.primary,
            handed: AtomicBool::new(false),
        };
        let (batch, local, refresh) = (batch.clone(), local.clone(), refresh.clone());
        Some(Arc::new(move |part: Transfer| {
            guard.handed.store(true, Ordering::Relaxed);
            let next = &chain.transports[i + 1];
            note(&guard.seg, next.kind(), Why::HandedOn { from });
            dispatch(
                chain.clone(),
                i + 1,
                batch.clone(),
                task,
                guard.seg.clone(),
                local.clone(),
                part,
                refresh.clone(),
            )
        }) as Fallback)
    } else if chain.left_out != 0 {
        let (batch, seg, pins, left_out) = (batch.clone(), seg.clone(), chain.pins, chain.left_out);
        Some(Arc::new(move |part: Transfer| {
            let others: Vec<&str> = TRANSPORTS
                .iter()
                .enumerate()
                .filter(|(k, _)| left_out & (1 << k) != 0)
                .map(|(_, e)| e.protocol)
                .collect();
            Engine::fail_task(
                &batch,
                task,
                format_args!(
                    "MC_TE_REQUIRE_TRANSPORT={pins}: {} could not move {} bytes at {:#x} of \
                     segment {:?}, and {} (which would have carried them) is not allowed",
                    from.protocol,
                    part.len,
                    part.remote,
                    seg.name,
                    others.join(", ")
                ),
            )
        }) as Fallback)
    } else {
        None
    };
    here.submit(Submission {
        batch,
        task,
        seg,
        xfer,
        local,
        fallback,
        refresh,
    });
}

impl Engine {
    /// The chain of a request to `seg` from the installed transports
    /// that reach its target and can move its memory (`reaching`, most
    /// preferred first, not empty), without those
    /// `MC_TE_REQUIRE_TRANSPORT` does not list; why the request fails
    /// when it lists none of them.
    pub(super) fn chain(
        &self,
        installed: &[Arc<dyn Transport>],
        seg: &RemoteSegment,
        reaching: Vec<Arc<dyn Transport>>,
    ) -> std::result::Result<Chain, String> {
        let pins = self.config.engine.require_transport;
        let allowed = |t: &Arc<dyn Transport>| pins.allows(t.kind().index);
        let preferred = installed
            .iter()
            .find(|t| allowed(t) && t.speaks(seg))
            .map(|t| t.kind().index);
        let Some(last) = reaching.iter().rposition(allowed) else {
            let names: Vec<&str> = reaching.iter().map(|t| t.kind().protocol).collect();
            return Err(format!(
                "MC_TE_REQUIRE_TRANSPORT={pins}: segment {:?} is reached only by {} here, \
                 which it does not list",
                seg.name,
                names.join(", ")
            ));
        };
        let left_out = reaching[last + 1..]
            .iter()
            .fold(0, |m, t| m | 1 << t.kind().index);
        let transports: Arc<[Arc<dyn Transport>]> = if pins.is_set() {
            reaching.into_iter().filter(allowed).collect()
        } else {
            reaching.into()
        };
        Ok(Chain {
            primary: Some(transports[0].kind().index) == preferred,
            transports,
            left_out,
            pins,
        })
    }

    /// The transport that carries data to segment `id` now: `local` for
    /// the engine's own segment; for a peer, the one its requests went to
    /// as last seen (a part of a request handed on to the next transport
    /// changes it, a whole request carried by the most preferred one
    /// changes it back; requests that the most preferred transport cannot
    /// take by the memory they move, such as GPU memory over shared
    /// memory, do not count), and before its first request the most
    /// preferred installed transport that speaks it. With
    /// `MC_TE_REQUIRE_TRANSPORT`, only the listed ones count, also while
    /// the listed one fails what it cannot move.
    pub fn segment_transport(&self, id: i32) -> Result<&'static str> {
        if id == LOCAL_SEGMENT_ID {
            return Ok(LOCAL);
        }
        let seg = self
            .segments
            .get(id)
            .ok_or_else(|| Error::InvalidArgument(format!("segment id {id} is not open")))?;
        if let Some(e) = seg.carrier.get().and_then(|i| TRANSPORTS.get(i)) {
            return Ok(e.protocol);
        }
        let pins = self.config.engine.require_transport;
        self.transports()
            .iter()
            .find(|t| pins.allows(t.kind().index) && t.speaks(&seg))
            .map(|t| t.kind().protocol)
            .ok_or_else(|| {
                Error::NotSupportedTransport(format!(
                    "no installed transport{} speaks segment {:?}",
                    if pins.is_set() {
                        format!(" that MC_TE_REQUIRE_TRANSPORT={pins} allows")
                    } else {
                        String::new()
                    },
                    seg.name
                ))
            })
    }

    /// With `MC_TE_REQUIRE_TRANSPORT`, makes sure the engine has one of
    /// the listed transports: each listed one not installed yet (by auto
    /// discovery or not at all) is installed, whatever `MC_FORCE_TCP` and
    /// `MC_TE_SHM` say; an error naming each listed transport and why it
    /// cannot be used when none is installed (`local` alone is always
    /// provided). A listed one that cannot be used beside one that is
    /// gets a warning.
    pub(super) fn require_transports(&self) -> Result<()> {
        let pins = self.config.engine.require_transport;
        if !pins.is_set() {
            return Ok(());
        }
        let mut have = pins.0 & LOCAL_BIT != 0;
        let mut problems = Vec::new();
        let installed = self.transports();
        for (i, entry) in TRANSPORTS.iter().enumerate() {
            if !pins.lists(i) {
                continue;
            }
            if installed.iter().any(|t| t.kind().index == i) {
                have = true;
                continue;
            }
            match self.install_transport(entry.protocol, None) {
                Ok(_) => have = true,
                Err(e) => problems.push(format!("{} cannot be used ({e})", entry.protocol)),
            }
        }
        if !have {
            return Err(Error::DeviceNotFound(format!(
                "MC_TE_REQUIRE_TRANSPORT={pins}: {}",
                problems.join("; ")
            )));
        }
        for p in &problems {
            tracing::warn!(
                "MC_TE_REQUIRE_TRANSPORT={pins}: {p}; requests go by the others it lists"
            );
        }
        info!("MC_TE_REQUIRE_TRANSPORT={pins}: requests to peers go by no other transport");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{rdma, shm, tcp};

    fn index(protocol: &str) -> usize {
        TRANSPORTS
            .iter()
            .position(|e| e.protocol == protocol)
            .unwrap()
    }

    #[test]
    fn a_list_of_names_allows_those_and_an_unknown_name_is_refused() {
        let set = TransportNames.parse(" RDMA, shm ,,").unwrap();
        assert!(set.is_set());
        assert!(set.allows(index(rdma::PROTOCOL)) && set.allows(index(shm::PROTOCOL)));
        assert!(!set.allows(index(tcp::PROTOCOL)));
        assert_eq!(set.to_string(), "shm,rdma", "table order");
        let local = TransportNames.parse("local").unwrap();
        assert!(local.is_set() && !local.allows(index(tcp::PROTOCOL)));
        assert_eq!(local.to_string(), "local");
        let unset = TransportNames.parse(" , ").unwrap();
        assert!(!unset.is_set() && unset.allows(index(tcp::PROTOCOL)));
        assert_eq!(TransportNames.parse("tcp,nvlink"), None);
        assert!(TransportNames.allowed().contains("`local`, `shm`"));
    }
}
