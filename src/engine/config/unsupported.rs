//! The `MC_*` variables Mooncake's transfer engine reads that this engine
//! does not: each declared once below with what it means to Mooncake and
//! why it is not supported. [`Config::from_lookup`](super::Config) lists
//! those that are set; building an engine logs each of them once per
//! process ([`warn_once`]), and `docs/configuration.md` shows the table.

use tracing::warn;

/// A Mooncake variable this engine does not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unsupported {
    /// Its name.
    pub var: &'static str,
    /// What it means to Mooncake.
    pub mooncake: &'static str,
    /// Why this engine does not read it, and what to use instead.
    pub reason: &'static str,
}

/// Why a variable of a GPU or accelerator transport other than RDMA is not
/// read.
const NO_DEVICE_TRANSPORT: &str = "this engine has no transport of that kind: its transports \
                                   are local, shm, tcp and rdma (GPU memory goes over rdma)";

/// Why a variable of the EFA (libfabric) transport is not read.
const NO_EFA: &str = "this engine has no EFA (libfabric) transport";

/// Why a variable of the Ascend transports is not read.
const NO_ASCEND: &str = "this engine has no Ascend transport";

/// Shorthand for a row of [`UNSUPPORTED`].
const fn row(var: &'static str, mooncake: &'static str, reason: &'static str) -> Unsupported {
    Unsupported {
        var,
        mooncake,
        reason,
    }
}

/// Every Mooncake variable this engine does not read, in the order of
/// `docs/configuration.md`.
pub(crate) const UNSUPPORTED: &[Unsupported] = &[
    row(
        "MC_CONN_PAUSE_TTL_MS",
        "milliseconds (0: off) during which no new RDMA endpoint to a peer is set up after one \
         of its endpoints was torn down",
        "a peer whose endpoints stop completing and whose handshake listener does not answer is \
         not connected to for `MC_RDMA_RAIL_PAUSE_SECONDS`; a torn-down endpoint alone pauses \
         nothing",
    ),
    row(
        "MC_ENABLE_HCA_PEER_AFFINITY",
        "pick the peer's RDMA device for each local one from `MC_NIC_PEER_AFFINITY`",
        "not implemented; `MC_ENABLE_DEST_DEVICE_AFFINITY` pairs devices of the same name",
    ),
    row(
        "MC_NIC_PEER_AFFINITY",
        "the map of local to peer RDMA devices that `MC_ENABLE_HCA_PEER_AFFINITY` uses",
        "not implemented; `MC_ENABLE_DEST_DEVICE_AFFINITY` pairs devices of the same name",
    ),
    row(
        "MC_LOG_RDMA_SLICE_AFFINITY",
        "log which local and peer RDMA devices each slice uses",
        "not implemented; `MC_TE_METRIC` logs each device's bandwidth and bytes in flight",
    ),
    row(
        "MC_TRACK_RDMA_POSTED_SLICES",
        "keep a set of the RDMA slices posted and not completed, for debugging",
        "not needed: every posted work request is tracked by its queue pair, and one that does \
         not complete within `MC_RDMA_COMPLETION_TIMEOUT` fails over",
    ),
    row(
        "MC_MIN_REG_SIZE",
        "block size of memory registration in the Barex transport",
        "this engine has no Barex transport",
    ),
    row(
        "MC_MLX5_QP_UDP_SPORTS",
        "UDP source ports set on RoCE queue pairs through mlx5 direct verbs",
        "only plain verbs are used (no mlx5dv); the device picks the source port",
    ),
    row(
        "MC_MLX5_QP_LAG_PORT_BALANCE",
        "spread queue pairs over the ports of a bonded (LAG) mlx5 device through direct verbs",
        "only plain verbs are used (no mlx5dv); the bond places queue pairs",
    ),
    row(
        "MC_EFA_NIC_SELECTION",
        "which EFA devices serve a buffer: all, or those near it",
        NO_EFA,
    ),
    row(
        "MC_EFA_CQ_THREADS",
        "threads polling the EFA completion queues",
        NO_EFA,
    ),
    row(
        "MC_TCP_ENABLE_CONNECTION_POOL",
        "reuse TCP connections in lanes per peer (off by default: a connection per request)",
        "connections are always pooled, `MC_TCP_LANES_PER_PEER` per peer device; a connection \
         per request is not offered",
    ),
    row(
        "MC_TCP_SLICE_SIZE",
        "bytes the TCP server reads from the socket at a time into a WRITE's destination",
        "the data server reads a request's body into its destination as the socket delivers it; \
         there is no read size to set (`MC_SLICE_SIZE` slices requests)",
    ),
    row(
        "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER",
        "requests waiting for a lane of the TCP connection pool, per peer",
        "a slice goes straight to the least-loaded lane of its rail, which never refuses it; \
         there is no admission queue to bound",
    ),
    row(
        "MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER",
        "requests waiting when that queue is full, per peer",
        "there is no admission queue (see `MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER`)",
    ),
    row(
        "MC_TCP_ADMISSION_TIMEOUT_MS",
        "how long such a request waits before it fails",
        "there is no admission queue; `MC_SLICE_TIMEOUT` reports a task that waits too long",
    ),
    row(
        "MC_RPC_PROTOCOL",
        "`rdma`: the RPC communicator's clients use RDMA sockets",
        "handshakes and notifications always go over TCP",
    ),
    row(
        "MC_TE_RPC_CLIENT_IO_THREADS",
        "I/O threads of the transfer engine's RPC clients",
        "handshake requests are blocking calls made by the engine's own threads; there is no \
         client I/O pool (`MC_HANDSHAKE_WORKERS` sizes the server)",
    ),
    row(
        "MC_RPC_CLIENT_IO_THREADS",
        "I/O threads of Mooncake's RPC clients (the store's and the transfer engine's)",
        "handshake requests are blocking calls made by the engine's own threads; there is no \
         client I/O pool (`MC_HANDSHAKE_WORKERS` sizes the server)",
    ),
    row(
        "MC_USE_TENT",
        "build the engine on Mooncake's newer TENT core (in builds with TENT)",
        "this engine has one core",
    ),
    row(
        "MC_USE_TEV1",
        "the same as `MC_USE_TENT`",
        "this engine has one core",
    ),
    row(
        "MC_INTRANODE_NVLINK",
        "install the intra-node NVLink transport for GPU memory",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_INTRA_NVLINK",
        "the same as `MC_INTRANODE_NVLINK`, in Mooncake's common settings",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_FORCE_MNNVL",
        "install the multi-node NVLink transport instead of RDMA",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_USE_NVLINK_IPC",
        "NVLink transports map peers' GPU memory through CUDA IPC handles",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_DISABLE_HIP",
        "do not install the AMD HIP transport",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_USE_HIP_IPC",
        "the HIP transport maps peers' GPU memory through HIP IPC handles",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_HIP_NUM_STREAMS",
        "HIP streams of the HIP transport",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_HIP_NUM_EVENTS",
        "HIP events of the HIP transport",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_FORCE_MUSA",
        "install the Moore Threads MUSA transport",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_DISABLE_MUSA",
        "do not install the MUSA transport",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_MUSA_COPY_API",
        "which MUSA copy call the MUSA transport uses",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_MUSA_IPC_OPEN_DEVICE",
        "the device the MUSA transport opens peers' IPC handles on",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_MUSA_TRANSFER_BATCH_MIN_BYTES",
        "smallest transfer the MUSA transport batches",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_DISABLE_MACA",
        "do not install the MetaX MACA transport",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_MACA_HOST_TRANSPORT",
        "the transport the MACA build uses for host memory",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_MACA_COPY_API",
        "which MACA copy call the MACA transport uses",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_MACA_CALLER_SYNC",
        "the MACA transport waits for its copies in the caller's thread",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_MACA_BATCHFLAG_MIN_BYTES",
        "smallest transfer the MACA transport batches",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_TANGRT_ROOT",
        "where the Sunrise Link transport finds its runtime",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_TANGRT_LIB_DIR",
        "the Sunrise Link runtime's library directory",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_TANGRT_LIB_ARCH",
        "the Sunrise Link runtime's architecture directory",
        NO_DEVICE_TRANSPORT,
    ),
    row(
        "MC_CXL_DEV_PATH",
        "the CXL memory device the CXL transport maps",
        "this engine has no CXL transport",
    ),
    row(
        "MC_CXL_DEV_SIZE",
        "the size of that device",
        "this engine has no CXL transport",
    ),
    row(
        "MC_USE_UBSHMEM_IPC",
        "the Ascend UB shared-memory transport maps peers' memory through IPC",
        NO_ASCEND,
    ),
    row(
        "MC_UBSHMEM_MAX_STREAMS",
        "streams of the Ascend UB shared-memory transport",
        NO_ASCEND,
    ),
    row(
        "MC_UBSHMEM_STREAMS_PER_TRANSFER",
        "streams one transfer of that transport uses",
        NO_ASCEND,
    ),
    row(
        "MC_UBSHMEM_THREAD_POOL_SIZE",
        "threads of that transport",
        NO_ASCEND,
    ),
    row(
        "MC_UBSHMEM_GET_STREAM_TIMEOUT",
        "how long that transport waits for a free stream",
        NO_ASCEND,
    ),
];

/// The names of the unsupported variables `lookup` finds set (to any
/// value, empty too), in the order of [`UNSUPPORTED`].
pub(crate) fn set(lookup: &dyn Fn(&str) -> Option<String>) -> Vec<&'static str> {
    UNSUPPORTED
        .iter()
        .filter(|u| lookup(u.var).is_some())
        .map(|u| u.var)
        .collect()
}

/// The variables already named in the log by this process.
static WARNED: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());

/// Logs one warning for each of `vars` (names from [`set`]) not named
/// before in this process, saying what Mooncake does with it and why this
/// engine does not; returns those it logged.
pub(crate) fn warn_once(vars: &[&'static str]) -> Vec<&'static str> {
    let mut warned = crate::sync::lock(&WARNED);
    let mut logged = Vec::new();
    for u in UNSUPPORTED.iter().filter(|u| vars.contains(&u.var)) {
        if warned.contains(&u.var) {
            continue;
        }
        warned.push(u.var);
        logged.push(u.var);
        warn!(
            "{} is set but not supported by this engine, which ignores it: {} (Mooncake: {})",
            u.var, u.reason, u.mooncake
        );
    }
    logged
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A log sink for a `tracing` subscriber.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn each_variable_is_declared_once_and_is_a_mooncake_one() {
        for (i, u) in UNSUPPORTED.iter().enumerate() {
            assert!(u.var.starts_with("MC_"), "{u:?}");
            assert!(!u.mooncake.is_empty() && !u.reason.is_empty(), "{u:?}");
            assert!(
                UNSUPPORTED[..i].iter().all(|v| v.var != u.var),
                "{} is declared twice",
                u.var
            );
        }
    }

    #[test]
    fn a_set_unsupported_variable_is_logged_once_by_name() {
        // Only this test warns about these two, so no other test has
        // logged them before.
        let vars = ["MC_MLX5_QP_LAG_PORT_BALANCE", "MC_HIP_NUM_EVENTS"];
        let config = crate::engine::config::Config::from_lookup(|k| {
            (vars.contains(&k) || k == "MC_SLICE_SIZE").then(|| "1".to_string())
        })
        .expect("allowed");
        assert_eq!(config.unsupported, vars);
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let (first, second) = tracing::subscriber::with_default(subscriber, || {
            (
                warn_once(&config.unsupported),
                warn_once(&config.unsupported),
            )
        });
        assert_eq!(first, vars);
        assert!(second.is_empty(), "{second:?}");
        let log = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        for var in vars {
            assert_eq!(log.matches(var).count(), 1, "{var} in {log}");
        }
        assert_eq!(log.lines().count(), 2, "{log}");
        assert!(log.contains("WARN"), "{log}");
        assert!(log.contains("not supported"), "{log}");
    }
}
