//! The transports this build provides, in one table: [`TRANSPORTS`].
//!
//! Each entry says what the rest of the crate needs to know of a transport
//! without naming it: its protocol name, the handle `installTransport`
//! returns for it, its constructor, the handshake frames it serves (and
//! the answer when it is not installed), the descriptor protocols it reads
//! and their layout, the descriptor keys listing a peer's devices for it,
//! and whether auto discovery installs it. The table is in order of
//! preference: a request goes to the first installed transport that
//! reaches its target, and an entry's place is also its slot in a
//! segment's route cache. The engine, the handshake listener's dispatch
//! and the descriptor codec ([`SegmentDesc::from_json`]) read the table;
//! each protocol string is a constant of its transport's module.
//!
//! Adding a transport is adding its folder under `transport/`, one entry
//! here, and its `pub mod` (with its configuration part, if any) in
//! `transport/mod.rs`.

use super::{Discovery, InstallContext, Kind, Transport, Want, rdma, shm, tcp};
use crate::error::{Error, Result};
use crate::metadata::descriptor::{DEVICES_KEY, Layout, SegmentDesc};
use crate::rpc::FrameKind;
use crate::segment::ROUTE_SLOTS;
use serde_json::Value;
use std::sync::Arc;

/// One transport of the build: everything the engine, the handshake
/// listener and the descriptor codec know of it.
pub struct Entry {
    /// The protocol it speaks, as `installTransport` and descriptors name
    /// it.
    pub protocol: &'static str,
    /// The handle `installTransport` returns for it: stable per protocol
    /// (Mooncake's order) and never 0 (NULL).
    pub handle: u64,
    /// Whether its protocol may stand as the descriptor's `protocol`
    /// (Mooncake speaks it).
    pub names_descriptor: bool,
    /// Starts it.
    pub install: fn(&InstallContext<'_>) -> Result<Arc<dyn Transport>>,
    /// The handshake frames it serves.
    pub frames: &'static [Served],
    /// The descriptor protocols it reads (its own first, then the variants
    /// peers may publish), with their layout.
    pub descriptor: &'static [(&'static str, Layout)],
    /// The descriptor keys listing a peer's devices for it, and what
    /// messages call them: a peer's descriptor is refused beyond
    /// `MC_PEER_MAX_DEVICES` of each before it is decoded.
    pub device_lists: &'static [(&'static str, &'static str)],
    /// Whether auto discovery installs it.
    pub auto: Auto,
}

/// A handshake frame kind a transport serves.
pub struct Served {
    /// The frame kind.
    pub kind: FrameKind,
    /// The answer to such a frame when the transport is not installed.
    pub absent: fn() -> Value,
}

/// Whether and how auto discovery installs a transport.
#[derive(Clone, Copy)]
pub enum Auto {
    /// A network transport: the first of these, in table order, that wants
    /// to be installed and can be set up is installed.
    Network(fn(&Discovery<'_>) -> Want),
    /// Installed beside the network transport when it wants to be; an
    /// engine that cannot run it goes on without it.
    Beside(fn(&Discovery<'_>) -> Want),
}

/// The transports of this build, most preferred first.
pub const TRANSPORTS: &[Entry] = &[
    Entry {
        protocol: shm::PROTOCOL,
        handle: 3,
        names_descriptor: false,
        install: shm::install,
        frames: &[Served {
            kind: shm::ATTACH,
            absent: shm::not_installed,
        }],
        // An engine with only the shared-memory transport publishes as
        // TCP does (only engines of this project read it).
        descriptor: &[(shm::PROTOCOL, Layout::Tcp)],
        device_lists: &[],
        auto: Auto::Beside(shm::auto),
    },
    Entry {
        protocol: rdma::PROTOCOL,
        handle: 2,
        names_descriptor: true,
        install: rdma::install,
        frames: &[Served {
            kind: rdma::HANDSHAKE,
            absent: rdma::not_installed,
        }],
        descriptor: &[
            (rdma::PROTOCOL, rdma::LAYOUT),
            (rdma::EFA, rdma::LAYOUT),
            (rdma::CXI, rdma::LAYOUT),
            (rdma::BAREX, rdma::BAREX_LAYOUT),
        ],
        device_lists: &[(DEVICES_KEY, "RDMA devices")],
        auto: Auto::Network(rdma::auto),
    },
    Entry {
        protocol: tcp::PROTOCOL,
        handle: 1,
        names_descriptor: true,
        install: tcp::install,
        frames: &[],
        descriptor: &[(tcp::PROTOCOL, Layout::Tcp)],
        device_lists: &[(tcp::carrier::TCP_DEVICES_KEY, "TCP devices")],
        auto: Auto::Network(tcp::auto),
    },
];

// Every transport has a slot in a segment's route cache, and one is left
// for the scheduler's test carrier.
const _: () = assert!(TRANSPORTS.len() < ROUTE_SLOTS);
// The task statistics count each transport's tasks apart, after the
// local copies'.
const _: () = assert!(TRANSPORTS.len() < crate::task_stats::ROUTES);

impl Entry {
    /// The kind a transport of this entry, at `index` of the table, is
    /// installed with.
    fn kind(&self, index: usize) -> Kind {
        Kind {
            protocol: self.protocol,
            index,
            names_descriptor: self.names_descriptor,
        }
    }
}

/// The entry of the transport named `protocol` and the kind it is
/// installed with; an error saying what this build provides otherwise.
pub fn find(protocol: &str) -> Result<(&'static Entry, Kind)> {
    if let Some((i, e)) = TRANSPORTS
        .iter()
        .enumerate()
        .find(|(_, e)| e.protocol == protocol)
    {
        return Ok((e, e.kind(i)));
    }
    let provided = TRANSPORTS
        .iter()
        .map(|e| format!("{:?}", e.protocol))
        .collect::<Vec<_>>()
        .join(", ");
    match TRANSPORTS
        .iter()
        .find(|e| e.descriptor.iter().any(|(p, _)| *p == protocol))
    {
        Some(e) => Err(Error::DeviceNotFound(format!(
            "transport {protocol:?} (a variant of {:?} that peers may publish) is not \
             available; install one of {provided}",
            e.protocol
        ))),
        None => Err(Error::InvalidArgument(format!(
            "transport {protocol:?} is unknown; this build provides {provided}"
        ))),
    }
}

/// The answer to a handshake frame of `kind` that a transport serves when
/// it is not installed; `None` when no transport serves such frames.
pub fn not_installed(kind: FrameKind) -> Option<Value> {
    TRANSPORTS
        .iter()
        .flat_map(|e| e.frames)
        .find(|s| s.kind == kind)
        .map(|s| (s.absent)())
}

/// The layout of a descriptor whose `protocol` is `protocol`, if a
/// transport of the table reads it.
pub fn layout(protocol: &str) -> Option<Layout> {
    TRANSPORTS
        .iter()
        .flat_map(|e| e.descriptor)
        .find(|(p, _)| *p == protocol)
        .map(|(_, l)| *l)
}

impl SegmentDesc {
    /// Decodes a descriptor ([`SegmentDesc::decode`]) with the layouts of
    /// the transport table: a protocol no transport reads is refused.
    pub fn from_json(v: &Value) -> Result<SegmentDesc> {
        SegmentDesc::decode(v, layout)
    }

    /// Encodes the descriptor ([`SegmentDesc::encode`]) with the layout
    /// the transport table gives its protocol.
    pub fn to_json(&self) -> Value {
        self.encode(layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_handles_frames_and_descriptor_protocols_are_unique() {
        let mut names: Vec<&str> = TRANSPORTS
            .iter()
            .flat_map(|e| e.descriptor.iter().map(|(p, _)| *p))
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            names.len(),
            n,
            "a descriptor protocol read by two transports"
        );
        let mut handles: Vec<u64> = TRANSPORTS.iter().map(|e| e.handle).collect();
        handles.sort_unstable();
        handles.dedup();
        assert_eq!(handles.len(), TRANSPORTS.len());
        assert!(!handles.contains(&0), "0 is NULL");
        let frames: Vec<FrameKind> = TRANSPORTS
            .iter()
            .flat_map(|e| e.frames.iter().map(|s| s.kind))
            .collect();
        for (i, k) in frames.iter().enumerate() {
            assert!(
                !frames[i + 1..].contains(k),
                "{k:?} served by two transports"
            );
            assert!(
                ![FrameKind::Metadata, FrameKind::Notify, FrameKind::Probe].contains(k),
                "{k:?} is the engine's own"
            );
        }
        for e in TRANSPORTS {
            assert_eq!(e.descriptor[0].0, e.protocol, "its own protocol first");
        }
    }

    #[test]
    fn an_unknown_or_variant_protocol_says_what_the_build_provides() {
        for e in TRANSPORTS {
            let (found, kind) = find(e.protocol).unwrap();
            assert_eq!(found.protocol, e.protocol);
            assert_eq!(TRANSPORTS[kind.index].protocol, e.protocol);
            for (variant, _) in &e.descriptor[1..] {
                let err = find(variant).map(|_| ()).unwrap_err();
                assert!(matches!(err, Error::DeviceNotFound(_)), "{err}");
            }
        }
        let err = find("nvlink").map(|_| ()).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains(&format!("{:?}", tcp::PROTOCOL)));
    }
}
