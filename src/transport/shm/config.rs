//! The shared-memory transport's configuration.

/// The shared-memory transport. Parsed from `MC_TE_SHM` and `MC_SHM_*` by
/// [`crate::engine::config::Config::from_env`].
#[derive(Debug, Clone, PartialEq)]
pub struct ShmConfig {
    /// `MC_TE_SHM`: whether auto discovery installs the transport beside
    /// the network one (0 turns it off).
    pub auto_install: bool,
    /// `MC_SHM_THREADS`: threads serving both sides.
    pub threads: usize,
    /// `MC_SHM_MAX_PEERS`: request rings (attached initiator processes)
    /// served at once; at the bound a ring not activated
    /// yet gives way, else the least recently active one.
    pub max_peers: usize,
    /// `MC_SHM_RING_ENTRIES`: WRITE requests one initiator may have posted
    /// to one target; 64 bytes each.
    pub ring_entries: usize,
    /// `MC_SHM_TABLE_SLOTS`: registered buffers published to peers' READs;
    /// 32 bytes each. READs of buffers beyond go
    /// over another transport.
    pub table_slots: usize,
    /// `MC_SHM_TIMEOUT_SEC`: a target that completes none of our WRITEs for
    /// this long fails them, and a ring its initiator does not activate
    /// this long is dropped.
    pub timeout_secs: u64,
    /// `MC_SHM_SPIN_US`: how long an idle thread polls at most before it
    /// sleeps (only while work keeps coming within that long).
    pub spin_us: u64,
    /// `MC_SHM_MAX_MAPPINGS`: memfd-backed buffers of one peer mapped at
    /// once; the least recently used mapping gives way.
    pub max_mappings: usize,
}
