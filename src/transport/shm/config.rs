//! The shared-memory transport's configuration.

use crate::settings::{Range, Switch};

/// The CPUs a default thread count follows: one per CPU, at most 4.
fn up_to_4_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().min(4))
}

crate::settings::settings! {
    /// The shared-memory transport. Parsed from `MC_TE_SHM` and `MC_SHM_*` by
    /// `Config::from_env`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct ShmConfig("shm") {
        /// `MC_TE_SHM`: whether auto discovery installs the transport beside
        /// the network one (0 turns it off).
        auto_install: bool = true, ["MC_TE_SHM"], Switch,
            "off: auto discovery leaves the shared-memory transport out";
        /// `MC_SHM_THREADS`: threads serving both sides.
        threads: usize = up_to_4_threads(), ["MC_SHM_THREADS"], Range(1usize, 64),
            "threads serving both sides", shown "one per CPU, at most 4";
        /// `MC_SHM_MAX_PEERS`: request rings (attached initiator processes)
        /// served at once; at the bound a ring not activated
        /// yet gives way, else the least recently active one.
        max_peers: usize = 256, ["MC_SHM_MAX_PEERS"], Range(1usize, 65536),
            "rings (attached initiators) served at once";
        /// `MC_SHM_RING_ENTRIES`: WRITE requests one initiator may have posted
        /// to one target; 64 bytes each.
        ring_entries: usize = 1024, ["MC_SHM_RING_ENTRIES"], Range(16usize, 65536),
            "requests one initiator may have posted";
        /// `MC_SHM_TABLE_SLOTS`: registered buffers published to peers' READs;
        /// 32 bytes each. READs of buffers beyond go
        /// over another transport.
        table_slots: usize = 1 << 16, ["MC_SHM_TABLE_SLOTS"], Range(1usize, 1 << 24),
            "buffers published to peers (READs of others go over the network)";
        /// `MC_SHM_PEER_TABLE_SLOTS`: the largest registration table a peer
        /// may publish (at least `MC_SHM_TABLE_SLOTS`): a peer whose table is
        /// larger is refused at attach and reached over the network, so no
        /// peer makes us read or hold more than 64 bytes times this.
        peer_table_slots: usize = 1 << 16, ["MC_SHM_PEER_TABLE_SLOTS"], Range(1usize, 1 << 24),
            "slots of the largest table a peer may publish (at least MC_SHM_TABLE_SLOTS)";
        /// `MC_SHM_TIMEOUT_SEC`: a target that completes none of our WRITEs for
        /// this long fails them, and a ring its initiator does not activate
        /// this long is dropped.
        timeout_secs: u64 = 10, ["MC_SHM_TIMEOUT_SEC"], Range(1u64, 3600),
            "seconds: a target that completes none of our WRITEs this long has them withdrawn";
        /// `MC_SHM_SPIN_US`: how long an idle thread polls at most before it
        /// sleeps (only while work keeps coming within that long).
        spin_us: u64 = 50, ["MC_SHM_SPIN_US"], Range(0u64, 10_000),
            "microseconds an idle thread polls before sleeping, while work keeps coming";
        /// `MC_SHM_SLICE_SIZE`: bytes per slice of a large request over shared
        /// memory. Larger than the network's `MC_SLICE_SIZE`: slices here only
        /// share a request among threads, and each costs a round of checks,
        /// hand-over and completion.
        slice_size: u64 = 1 << 20, ["MC_SHM_SLICE_SIZE"], Range(1u64, 1 << 40),
            "bytes per slice of a large request over shared memory";
        /// `MC_SHM_MAX_MAPPINGS`: memfd-backed buffers of one peer mapped at
        /// once; the least recently used mapping gives way.
        max_mappings: usize = 256, ["MC_SHM_MAX_MAPPINGS"], Range(1usize, 65536),
            "memfd buffers of one peer mapped at once";
    };
}
