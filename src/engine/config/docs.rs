//! The tables of `docs/configuration.md`, generated from the declarations
//! of the parts (`settings!` beside each part's user): each sits between `<!-- generated: PART -->` and
//! `<!-- end -->`, the prose around them is written by hand. The test
//! fails when the file and the code disagree;
//! `UPDATE_DOCS=1 cargo test --lib config::docs` rewrites the tables.

use super::*;
use crate::settings::{PartDoc, RowDoc};
use unsupported::UNSUPPORTED;

/// Every `MC_*` variable Mooncake's classic transfer engine reads (its
/// `config.cpp`, the rest of its sources, its common settings and its
/// Python binding's `MC_TRANSFER_TIMEOUT`; not its tests' own): each is in
/// exactly one row of the tables, supported or not.
const MOONCAKE: &[&str] = &[
    "MC_AUTO_GID_MAX_RETRIES",
    "MC_CONN_PAUSE_TTL_MS",
    "MC_CUSTOM_TOPO_JSON",
    "MC_CXL_DEV_PATH",
    "MC_CXL_DEV_SIZE",
    "MC_DISABLE_HIP",
    "MC_DISABLE_MACA",
    "MC_DISABLE_METACACHE",
    "MC_DISABLE_MUSA",
    "MC_EFA_CQ_THREADS",
    "MC_EFA_NIC_SELECTION",
    "MC_ENABLE_DEST_DEVICE_AFFINITY",
    "MC_ENABLE_HCA_PEER_AFFINITY",
    "MC_ENABLE_PARALLEL_REG_MR",
    "MC_ENDPOINT_STORE_TYPE",
    "MC_FORCE_HCA",
    "MC_FORCE_MNNVL",
    "MC_FORCE_MUSA",
    "MC_FORCE_TCP",
    "MC_FRAGMENT_RATIO",
    "MC_GID_INDEX",
    "MC_HANDSHAKE_CONNECT_TIMEOUT",
    "MC_HANDSHAKE_LISTEN_BACKLOG",
    "MC_HANDSHAKE_MAX_LENGTH",
    "MC_HANDSHAKE_PORT",
    "MC_HIP_NUM_EVENTS",
    "MC_HIP_NUM_STREAMS",
    "MC_IB_PCI_RELAXED_ORDERING",
    "MC_IB_PORT",
    "MC_IB_SL",
    "MC_IB_TC",
    "MC_INTRANODE_NVLINK",
    "MC_INTRA_NVLINK",
    "MC_LEGACY_RPC_PORT_BINDING",
    "MC_LOG_DIR",
    "MC_LOG_LEVEL",
    "MC_LOG_RDMA_SLICE_AFFINITY",
    "MC_MACA_BATCHFLAG_MIN_BYTES",
    "MC_MACA_CALLER_SYNC",
    "MC_MACA_COPY_API",
    "MC_MACA_HOST_TRANSPORT",
    "MC_MAX_CONCURRENT_REG_MR",
    "MC_MAX_CQE_PER_CTX",
    "MC_MAX_EP_PER_CTX",
    "MC_MAX_INLINE",
    "MC_MAX_MR_SIZE",
    "MC_MAX_PRC_PORT",
    "MC_MAX_RPC_PORT",
    "MC_MAX_SGE",
    "MC_MAX_WR",
    "MC_METADATA_CLUSTER_ID",
    "MC_MIN_PRC_PORT",
    "MC_MIN_REG_SIZE",
    "MC_MIN_RPC_PORT",
    "MC_MLX5_QP_LAG_PORT_BALANCE",
    "MC_MLX5_QP_UDP_SPORTS",
    "MC_MTU",
    "MC_MUSA_COPY_API",
    "MC_MUSA_IPC_OPEN_DEVICE",
    "MC_MUSA_TRANSFER_BATCH_MIN_BYTES",
    "MC_NIC_PEER_AFFINITY",
    "MC_NUM_COMP_CHANNELS_PER_CTX",
    "MC_NUM_CQ_PER_CTX",
    "MC_NUM_QP_PER_EP",
    "MC_PATH_ROUNDROBIN",
    "MC_PKEY_INDEX",
    "MC_RDMA_BIND_ADDRESS",
    "MC_RDMA_RAIL_PAUSE_SECONDS",
    "MC_REDIS_DB_INDEX",
    "MC_REDIS_PASSWORD",
    "MC_REDIS_USERNAME",
    "MC_RETRY_CNT",
    "MC_RPC_CLIENT_IO_THREADS",
    "MC_RPC_PROTOCOL",
    "MC_SLICE_SIZE",
    "MC_SLICE_TIMEOUT",
    "MC_TANGRT_LIB_ARCH",
    "MC_TANGRT_LIB_DIR",
    "MC_TANGRT_ROOT",
    "MC_TCP_ADMISSION_TIMEOUT_MS",
    "MC_TCP_BIND_ADDRESS",
    "MC_TCP_ENABLE_CONNECTION_POOL",
    "MC_TCP_LANES_PER_PEER",
    "MC_TCP_MAX_CONNECTIONS_PER_PEER",
    "MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER",
    "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER",
    "MC_TCP_PROTO",
    "MC_TCP_SLICE_SIZE",
    "MC_TCP_STATUS_TIMEOUT_SEC",
    "MC_TE_FILTERS",
    "MC_TE_METADATA_REFRESH_INTERVAL_SECONDS",
    "MC_TE_METRIC",
    "MC_TE_METRIC_INTERVAL_SECONDS",
    "MC_TE_RPC_CLIENT_IO_THREADS",
    "MC_TRACK_RDMA_POSTED_SLICES",
    "MC_TRANSFER_TIMEOUT",
    "MC_UBSHMEM_GET_STREAM_TIMEOUT",
    "MC_UBSHMEM_MAX_STREAMS",
    "MC_UBSHMEM_STREAMS_PER_TRANSFER",
    "MC_UBSHMEM_THREAD_POOL_SIZE",
    "MC_USE_HIP_IPC",
    "MC_USE_IPV6",
    "MC_USE_NVLINK_IPC",
    "MC_USE_TENT",
    "MC_USE_TEV1",
    "MC_USE_UBSHMEM_IPC",
    "MC_WORKERS_PER_CTX",
];

/// The table of the variables of [`UNSUPPORTED`].
fn unsupported_part() -> PartDoc {
    PartDoc {
        name: "unsupported",
        rows: UNSUPPORTED
            .iter()
            .map(|u| RowDoc {
                vars: std::slice::from_ref(&u.var),
                doc: "not read; when set, building an engine says so in one warning",
                default: "-".to_string(),
                allowed: "-".to_string(),
                mooncake: u.mooncake,
                unsupported: Some(u.reason),
            })
            .collect(),
    }
}

/// Every part's documentation, in the order of `docs/configuration.md`.
fn all_parts() -> Vec<PartDoc> {
    let r = Reader::new(&|_| None);
    let mut parts: Vec<PartDoc> = Config::default()
        .parts(&r)
        .into_iter()
        .map(|(doc, _)| doc)
        .collect();
    parts.push(unsupported_part());
    parts
}

/// Whether `row` is supported: "yes" for a variable of Mooncake's (or one
/// not of ours, such as `CUDA_VISIBLE_DEVICES`), "ours" for one Mooncake
/// does not read, "no" with the reason for one of [`UNSUPPORTED`].
fn supported(row: &RowDoc) -> String {
    match row.unsupported {
        Some(why) => format!("no: {why}"),
        None if row.vars[0].starts_with("MC_") && !MOONCAKE.contains(&row.vars[0]) => {
            "ours".to_string()
        }
        None => "yes".to_string(),
    }
}

/// A cell's text with its `|` escaped.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The Markdown table of `part`.
fn table(part: &PartDoc) -> String {
    let mut out = String::from(
        "| variable | meaning | default | allowed values | Mooncake's meaning, where it differs \
         | supported |\n|---|---|---|---|---|---|\n",
    );
    for row in &part.rows {
        let vars: Vec<String> = row.vars.iter().map(|v| format!("`{v}`")).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            vars.join(" "),
            cell(row.doc),
            cell(&row.default),
            cell(&row.allowed),
            cell(row.mooncake),
            cell(&supported(row)),
        ));
    }
    out
}

/// `text` with the table of every part between its markers; an error
/// names a part whose markers are missing.
fn render(text: &str) -> Result<String, String> {
    let mut out = text.to_string();
    for part in all_parts() {
        let open = format!("<!-- generated: {} -->\n", part.name);
        let Some(start) = out.find(&open).map(|i| i + open.len()) else {
            return Err(format!("no `{}` in docs/configuration.md", open.trim()));
        };
        let Some(len) = out[start..].find("<!-- end -->") else {
            return Err(format!("no `<!-- end -->` after `{}`", open.trim()));
        };
        out.replace_range(start..start + len, &table(&part));
    }
    Ok(out)
}

const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");

#[test]
fn tables_match_the_declarations() {
    let text = std::fs::read_to_string(PATH).expect("docs/configuration.md");
    let want = render(&text).unwrap();
    if want == text {
        return;
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(PATH, &want).expect("write docs/configuration.md");
        return;
    }
    panic!(
        "docs/configuration.md is stale: its tables differ from the settings! declarations; \
         rewrite them with `UPDATE_DOCS=1 cargo test --lib config::docs`"
    );
}

#[test]
fn every_declared_variable_is_documented() {
    let text = std::fs::read_to_string(PATH).expect("docs/configuration.md");
    let parts = all_parts();
    assert!(parts.iter().map(|p| p.rows.len()).sum::<usize>() > 90);
    for part in &parts {
        for row in &part.rows {
            for var in row.vars {
                assert!(
                    text.contains(&format!("`{var}`")),
                    "{var} (part {}) is not in docs/configuration.md",
                    part.name
                );
            }
        }
    }
}

#[test]
fn every_mooncake_variable_is_in_exactly_one_row() {
    let rows: Vec<RowDoc> = all_parts().into_iter().flat_map(|p| p.rows).collect();
    for var in MOONCAKE {
        let n = rows.iter().filter(|r| r.vars.contains(var)).count();
        assert_eq!(
            n, 1,
            "{var} is in {n} rows of docs/configuration.md, not one"
        );
    }
    for row in &rows {
        assert!(
            row.unsupported.is_none() || MOONCAKE.contains(&row.vars[0]),
            "{} is declared unsupported but Mooncake does not read it",
            row.vars[0]
        );
        assert!(
            row.mooncake.is_empty() || MOONCAKE.contains(&row.vars[0]),
            "{} says what Mooncake means by it, but Mooncake does not read it",
            row.vars[0]
        );
    }
    assert!(
        MOONCAKE.windows(2).all(|w| w[0] < w[1]),
        "MOONCAKE is sorted"
    );
}

#[test]
fn every_row_says_what_it_takes() {
    for part in all_parts() {
        for row in &part.rows {
            assert!(!row.doc.is_empty() && !row.allowed.is_empty(), "{row:?}");
            assert!(!row.default.is_empty(), "{row:?}");
        }
    }
}
