use super::*;
use crate::engine::config::LogLevel;
use crate::transport::endpoint::EndpointStoreType;
use std::collections::HashMap;

fn lookup(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let m: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| m.get(k).cloned())
}

/// The configuration of `vars`, which must all be allowed.
fn parse(vars: &[(&str, &str)]) -> Config {
    lookup(vars).unwrap_or_else(|e| panic!("refused: {e}"))
}

/// What the configuration of `vars` refuses, one message per value.
fn refused(vars: &[(&str, &str)]) -> Vec<String> {
    match lookup(vars) {
        Ok(c) => panic!("{vars:?} was accepted: {c:?}"),
        Err(e) => e.problems().to_vec(),
    }
}

#[test]
fn defaults_match_mooncake() {
    let c = parse(&[]);
    assert_eq!(c.sched.slice_size, 65536);
    assert_eq!(c.sched.fragment_limit, 16384);
    assert_eq!(c.sched.retry_cnt, 9);
    assert_eq!((c.rpc.min_port, c.rpc.max_port), (15000, 17000));
    assert_eq!(c.rpc.connect_timeout_secs, 5);
    assert_eq!(c.rpc.max_length, 1 << 20);
    assert_eq!(c.tcp.lanes_per_peer, 4);
    assert_eq!(c.tcp.status_timeout_secs, 30);
    assert_eq!(c.engine.transfer_timeout_secs, 30);
    assert_eq!(c.engine.log_level, LogLevel::Info);
    assert!(c.store.metacache);
    assert_eq!(c.endpoints.store_type, EndpointStoreType::Sieve);
    assert_eq!(c.rpc.io_timeout_secs, 5);
    assert_eq!(c.rpc.max_connections, 256);
    assert_eq!(c.rpc.workers, 4);
    assert_eq!(c.rpc.max_buffered, 64 << 20);
    assert_eq!(c.notify.max_size, 64 << 10);
    assert_eq!(c.notify.max_count, 65536);
    assert_eq!(c.notify.max_bytes, 64 << 20);
    assert!(c.warnings.is_empty());
}

#[test]
fn peer_descriptor_bounds() {
    let d = parse(&[]);
    assert_eq!(
        (
            d.peers.max_devices,
            d.peers.max_buffers,
            d.peers.max_descriptor_bytes
        ),
        (64, 65536, 64 << 20)
    );
    let c = parse(&[
        ("MC_PEER_MAX_DEVICES", "8"),
        ("MC_PEER_MAX_BUFFERS", "1000"),
        ("MC_PEER_MAX_DESCRIPTOR_BYTES", "1048576"),
    ]);
    assert_eq!(
        (
            c.peers.max_devices,
            c.peers.max_buffers,
            c.peers.max_descriptor_bytes
        ),
        (8, 1000, 1 << 20)
    );
    assert_eq!(
        refused(&[
            ("MC_PEER_MAX_DEVICES", "0"),
            ("MC_PEER_MAX_DESCRIPTOR_BYTES", "10"),
        ]),
        [
            "MC_PEER_MAX_DEVICES=0 is not a number in 1..=4096",
            "MC_PEER_MAX_DESCRIPTOR_BYTES=10 is not a number in 65536..=1073741824",
        ]
    );
}

#[test]
fn control_plane_bounds() {
    let c = parse(&[
        ("MC_HANDSHAKE_IO_TIMEOUT", "2"),
        ("MC_HANDSHAKE_MAX_CONNECTIONS", "1000"),
        ("MC_HANDSHAKE_WORKERS", "8"),
        ("MC_HANDSHAKE_MAX_BUFFERED", "268435456"),
        ("MC_NOTIFY_MAX_SIZE", "1024"),
        ("MC_NOTIFY_QUEUE_MAX_COUNT", "10"),
        ("MC_NOTIFY_QUEUE_MAX_BYTES", "1048576"),
    ]);
    assert_eq!(c.rpc.io_timeout_secs, 2);
    assert_eq!(c.rpc.max_connections, 1000);
    assert_eq!(c.rpc.workers, 8);
    assert_eq!(c.rpc.max_buffered, 256 << 20);
    assert_eq!(c.notify.max_size, 1024);
    assert_eq!(c.notify.max_count, 10);
    assert_eq!(c.notify.max_bytes, 1 << 20);
    let bad = [
        ("MC_HANDSHAKE_IO_TIMEOUT", "0"),
        ("MC_HANDSHAKE_MAX_CONNECTIONS", "-1"),
        ("MC_HANDSHAKE_WORKERS", "65"),
        ("MC_HANDSHAKE_MAX_BUFFERED", "1000"),
        ("MC_NOTIFY_MAX_SIZE", "0"),
        ("MC_NOTIFY_QUEUE_MAX_COUNT", "many"),
        ("MC_NOTIFY_QUEUE_MAX_BYTES", "100"),
    ];
    let problems = refused(&bad);
    assert_eq!(problems.len(), bad.len(), "{problems:?}");
    for (var, value) in bad {
        let named = format!("{var}={value} is not a number in ");
        assert!(
            problems.iter().any(|p| p.starts_with(&named)),
            "{named:?} not in {problems:?}"
        );
    }
    assert_eq!(
        (
            c.rdma.ib_port,
            c.rdma.gid_index,
            c.rdma.mtu,
            c.rdma.num_qp_per_ep,
            c.rdma.max_wr,
            c.rdma.max_sge,
            c.rdma.max_inline
        ),
        (1, None, 4096, 2, 256, 4, 64)
    );
    assert_eq!((c.rdma.max_cqe_per_ctx, c.rdma.workers_per_ctx), (4096, 2));
    assert_eq!((c.rdma.traffic_class, c.rdma.service_level), (None, None));
    assert!(c.rdma.relaxed_ordering);
    assert_eq!(c.rdma.completion_timeout_secs, 10);
    assert_eq!(c.rdma.ib_timeout, 14);
    assert_eq!(c.rdma.signal_interval, 1);
}

#[test]
fn rdma_variables() {
    let c = parse(&[
        ("MC_GID_INDEX", "3"),
        ("MC_MTU", "1024"),
        ("MC_NUM_QP_PER_EP", "4"),
        ("MC_WORKERS_PER_CTX", "1"),
        ("MC_IB_TC", "106"),
        ("MC_IB_SL", "3"),
        ("MC_IB_PCI_RELAXED_ORDERING", "0"),
        ("MC_RDMA_COMPLETION_TIMEOUT", "3"),
        ("MC_IB_TIMEOUT", "18"),
    ]);
    assert_eq!(c.rdma.gid_index, Some(3));
    assert_eq!(c.rdma.mtu, 1024);
    assert_eq!(c.rdma.num_qp_per_ep, 4);
    assert_eq!(c.rdma.workers_per_ctx, 1);
    assert_eq!(
        (c.rdma.traffic_class, c.rdma.service_level),
        (Some(106), Some(3))
    );
    assert!(!c.rdma.relaxed_ordering);
    assert_eq!(c.rdma.completion_timeout_secs, 3);
    assert_eq!(c.rdma.ib_timeout, 18);
    let d = parse(&[]);
    assert_eq!(
        (
            d.rdma.max_passive_ep,
            d.rdma.max_passive_ep_per_peer,
            d.rdma.peer_lookups_per_sec,
            d.rdma.connect_threads
        ),
        (1024, 32, 100, 8)
    );
    let c = parse(&[
        ("MC_RDMA_MAX_PASSIVE_EP", "16"),
        ("MC_RDMA_MAX_PASSIVE_EP_PER_PEER", "4"),
        ("MC_RDMA_PEER_LOOKUPS_PER_SEC", "10"),
        ("MC_RDMA_CONNECT_THREADS", "2"),
    ]);
    assert_eq!(
        (
            c.rdma.max_passive_ep,
            c.rdma.max_passive_ep_per_peer,
            c.rdma.peer_lookups_per_sec,
            c.rdma.connect_threads
        ),
        (16, 4, 10, 2)
    );
    assert_eq!(
        refused(&[
            ("MC_RDMA_MAX_PASSIVE_EP", "0"),
            ("MC_RDMA_MAX_PASSIVE_EP_PER_PEER", "x"),
            ("MC_RDMA_PEER_LOOKUPS_PER_SEC", "-1"),
            ("MC_RDMA_CONNECT_THREADS", "65"),
        ])
        .len(),
        4
    );
    assert_eq!(parse(&[("NCCL_IB_GID_INDEX", "1")]).rdma.gid_index, Some(1));
    assert_eq!(
        parse(&[("MC_GID_INDEX", "2"), ("NCCL_IB_GID_INDEX", "1")])
            .rdma
            .gid_index,
        Some(2)
    );
    assert_eq!(parse(&[("MC_GID_INDEX", "-1")]).rdma.gid_index, None);
    assert_eq!(
        refused(&[
            ("MC_GID_INDEX", "256"),
            ("MC_MTU", "1500"),
            ("MC_WORKERS_PER_CTX", "9"),
            ("MC_IB_SL", "16"),
            ("MC_IB_PCI_RELAXED_ORDERING", "3"),
        ]),
        [
            "MC_GID_INDEX=256 is not -1 or a number in 0..=255",
            "MC_MTU=1500 is not one of 512, 1024, 2048 or 4096",
            "MC_WORKERS_PER_CTX=9 is not a number in 1..=8",
            "MC_IB_SL=16 is not -1 or a number in 0..=15",
            "MC_IB_PCI_RELAXED_ORDERING=3 is not a number in 0..=2",
        ]
    );
}

#[test]
fn rdma_completion_path_variables() {
    let d = parse(&[]);
    assert_eq!(
        (
            d.rdma.num_cq_per_ctx,
            d.rdma.num_comp_channels_per_ctx,
            d.rdma.busy_poll_us
        ),
        (1, 1, RdmaConfig::default().busy_poll_us)
    );
    let c = parse(&[
        ("MC_NUM_CQ_PER_CTX", "4"),
        ("MC_NUM_COMP_CHANNELS_PER_CTX", "2"),
        ("MC_TE_RDMA_BUSY_POLL_US", "0"),
    ]);
    assert_eq!(
        (
            c.rdma.num_cq_per_ctx,
            c.rdma.num_comp_channels_per_ctx,
            c.rdma.busy_poll_us
        ),
        (4, 2, 0)
    );
    assert_eq!(
        refused(&[
            ("MC_NUM_CQ_PER_CTX", "0"),
            ("MC_NUM_COMP_CHANNELS_PER_CTX", "256"),
            ("MC_TE_RDMA_BUSY_POLL_US", "-5"),
        ])
        .len(),
        3
    );
}

#[test]
fn memory_region_variables() {
    let d = parse(&[]);
    assert_eq!(
        (
            d.rdma.max_mr_size,
            d.rdma.parallel_reg_mr,
            d.rdma.max_concurrent_reg_mr
        ),
        (1 << 40, None, 0)
    );
    let c = parse(&[
        ("MC_MAX_MR_SIZE", "1048576"),
        ("MC_ENABLE_PARALLEL_REG_MR", "1"),
        ("MC_MAX_CONCURRENT_REG_MR", "4"),
    ]);
    assert_eq!(
        (
            c.rdma.max_mr_size,
            c.rdma.parallel_reg_mr,
            c.rdma.max_concurrent_reg_mr
        ),
        (1 << 20, Some(true), 4)
    );
    assert_eq!(
        parse(&[("MC_ENABLE_PARALLEL_REG_MR", "0")])
            .rdma
            .parallel_reg_mr,
        Some(false)
    );
    assert_eq!(
        parse(&[("MC_ENABLE_PARALLEL_REG_MR", "-1")])
            .rdma
            .parallel_reg_mr,
        None
    );
    assert_eq!(
        refused(&[
            ("MC_MAX_MR_SIZE", "0"),
            ("MC_ENABLE_PARALLEL_REG_MR", "2"),
            ("MC_MAX_CONCURRENT_REG_MR", "-1"),
        ]),
        [
            "MC_MAX_MR_SIZE=0 is not a number in 1..=18446744073709551615",
            "MC_ENABLE_PARALLEL_REG_MR=2 is not -1, 0 or 1",
            "MC_MAX_CONCURRENT_REG_MR=-1 is not a number in 0..=65536",
        ]
    );
}

#[test]
fn device_event_peer_device_and_metric_variables() {
    let d = parse(&[]);
    assert!(!d.engine.force_hca && !d.engine.metric);
    assert_eq!(d.engine.metric_interval_secs, 5);
    assert!(!d.rdma.dest_device_affinity);
    assert_eq!(d.rdma.auto_gid_max_retries, 2);
    assert_eq!(d.rdma.bind_address, None);
    let c = parse(&[
        ("MC_FORCE_HCA", "1"),
        ("MC_TE_METRIC", "Yes"),
        ("MC_TE_METRIC_INTERVAL_SECONDS", "2"),
        ("MC_ENABLE_DEST_DEVICE_AFFINITY", "1"),
        ("MC_AUTO_GID_MAX_RETRIES", "0"),
        ("MC_RDMA_BIND_ADDRESS", "10.1.0.5"),
    ]);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert!(c.engine.force_hca && c.engine.metric);
    assert_eq!(c.engine.metric_interval_secs, 2);
    assert!(c.rdma.dest_device_affinity);
    assert_eq!(c.rdma.auto_gid_max_retries, 0);
    assert_eq!(c.rdma.bind_address.as_deref(), Some("10.1.0.5"));
    // Mooncake takes only 1, true, yes and on for MC_TE_METRIC, and
    // anything else is off, not refused.
    assert!(!parse(&[("MC_TE_METRIC", "2")]).engine.metric);
    assert!(parse(&[("MC_TE_METRIC", "ON")]).engine.metric);
    assert_eq!(
        refused(&[
            ("MC_TE_METRIC_INTERVAL_SECONDS", "0"),
            ("MC_AUTO_GID_MAX_RETRIES", "17"),
        ]),
        [
            "MC_TE_METRIC_INTERVAL_SECONDS=0 is not a number in 1..=86400",
            "MC_AUTO_GID_MAX_RETRIES=17 is not a number in 0..=16",
        ]
    );
}

#[test]
fn each_bad_value_is_refused_naming_variable_value_and_range() {
    let problems = refused(&[
        ("MC_SLICE_SIZE", "-5"),
        ("MC_LOG_LEVEL", "LOUD"),
        ("MC_TCP_LANES_PER_PEER", "99"),
        ("MC_ENDPOINT_STORE_TYPE", "LRU"),
        ("MC_HANDSHAKE_PORT", "abc"),
        ("MC_SLICE_TIMEOUT", "-1"),
        ("MC_RETRY_CNT", "0"),
        ("MC_HANDSHAKE_MAX_LENGTH", "1000"),
        ("MC_TRANSFER_TIMEOUT", "abc"),
        ("MC_TCP_PROTO", "3"),
        ("MC_FRAGMENT_RATIO", "0"),
    ]);
    let want = [
        "MC_SLICE_SIZE=-5 is not a number in 1..=1099511627776",
        "MC_LOG_LEVEL=LOUD is not one of INFO, TRACE, WARNING, WARN or ERROR",
        "MC_TCP_LANES_PER_PEER=99 is not a number in 1..=16",
        "MC_ENDPOINT_STORE_TYPE=LRU is not one of SIEVE or FIFO",
        "MC_HANDSHAKE_PORT=abc is not a number in 1..=65535",
        "MC_SLICE_TIMEOUT=-1 is not a number in 0..=65535",
        "MC_RETRY_CNT=0 is not a number in 1..=127",
        "MC_HANDSHAKE_MAX_LENGTH=1000 is not a number in 1048576..=134217728",
        "MC_TRANSFER_TIMEOUT=abc is not a number up to 2147483647 (below 5: 5)",
        "MC_TCP_PROTO=3 is not one of 2 or 1",
        "MC_FRAGMENT_RATIO=0 is not a number in 1..=18446744073709551615",
    ];
    for w in want {
        assert!(problems.iter().any(|x| x == w), "no {w:?} in {problems:?}");
    }
    assert_eq!(problems.len(), want.len(), "{problems:?}");
    let e = lookup(&[("MC_SLICE_SIZE", "abc")]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "MC_SLICE_SIZE=abc is not a number in 1..=1099511627776"
    );
    assert_eq!(
        crate::error::Error::from(e).to_string(),
        "invalid argument: bad configuration: MC_SLICE_SIZE=abc is not a number in \
         1..=1099511627776"
    );
    // Surrounding blanks are trimmed, as before.
    assert_eq!(
        parse(&[("MC_SLICE_SIZE", " 131072 ")]).sched.slice_size,
        131072
    );
}

#[test]
fn store_security_variables() {
    let c = parse(&[
        ("MC_ETCD_USERNAME", "te"),
        ("MC_ETCD_PASSWORD", "pa55-w0rd-secret"),
        ("MC_ETCD_CACERT", "/etc/te/ca.pem"),
        ("MC_ETCD_CERT", "/etc/te/client.pem"),
        ("MC_ETCD_KEY", "/etc/te/client.key"),
        ("MC_METADATA_AUTH_TOKEN_FILE", "/etc/te/token"),
        ("MC_METADATA_CACERT", "/etc/te/meta-ca.pem"),
        ("MC_REDIS_PASSWORD", "redis-secret-word"),
        ("MC_REDIS_CACERT", "/etc/te/redis-ca.pem"),
    ]);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let s = &c.store;
    let (user, pass) = s.etcd_auth.as_ref().expect("etcd credentials");
    assert_eq!(user, "te");
    assert!(pass.matches(b"pa55-w0rd-secret"));
    assert_eq!(
        s.etcd_tls.cacert.as_deref(),
        Some("/etc/te/ca.pem".as_ref())
    );
    assert!(s.etcd_tls.has_client_cert());
    assert_eq!(s.http_token_file.as_deref(), Some("/etc/te/token".as_ref()));
    assert_eq!(
        s.http_cacert.as_deref(),
        Some("/etc/te/meta-ca.pem".as_ref())
    );
    assert_eq!(
        s.redis_tls.cacert.as_deref(),
        Some("/etc/te/redis-ca.pem".as_ref())
    );
    let shown = format!("{c:?}");
    assert!(
        !shown.contains("pa55-w0rd-secret") && !shown.contains("redis-secret-word"),
        "a password in the Debug output: {shown}"
    );
    // Halves warn and are dropped.
    let c = parse(&[
        ("MC_ETCD_USERNAME", "te"),
        ("MC_ETCD_CERT", "/c.pem"),
        ("MC_REDIS_KEY", "/k.pem"),
    ]);
    assert!(c.store.etcd_auth.is_none() && !c.store.etcd_tls.has_client_cert());
    assert_eq!(c.store.etcd_tls.cert, None);
    assert_eq!(c.store.redis_tls.key, None);
    for w in [
        "only one of MC_ETCD_USERNAME and MC_ETCD_PASSWORD is set; not authenticating \
         (set both)",
        "only one of MC_ETCD_CERT and MC_ETCD_KEY is set; sending no client certificate \
         (set both)",
        "only one of MC_REDIS_CERT and MC_REDIS_KEY is set; sending no client certificate \
         (set both)",
    ] {
        assert!(
            c.warnings.iter().any(|x| x == w),
            "{w:?} not in {:?}",
            c.warnings
        );
    }
    assert_eq!(c.warnings.len(), 3, "{:?}", c.warnings);
}

#[test]
fn slice_timeout_follows_mooncake_bounds() {
    let timeout = |v: &str| parse(&[("MC_SLICE_TIMEOUT", v)]).engine.slice_timeout_secs;
    assert_eq!(parse(&[]).engine.slice_timeout_secs, 0);
    assert_eq!(timeout("30"), 30);
    // 0 is off, as unset.
    assert_eq!(timeout("0"), 0);
    assert_eq!(
        refused(&[("MC_SLICE_TIMEOUT", "65536")]),
        ["MC_SLICE_TIMEOUT=65536 is not a number in 0..=65535"]
    );
}

#[test]
fn a_transfer_timeout_below_5_counts_as_5_as_in_mooncake() {
    let timeout = |v: &str| {
        parse(&[("MC_TRANSFER_TIMEOUT", v)])
            .engine
            .transfer_timeout_secs
    };
    for below in ["4", "2", "0", "-3"] {
        assert_eq!(timeout(below), 5, "{below}");
    }
    assert_eq!(timeout("5"), 5);
    assert_eq!(timeout("100000"), 100000);
    assert_eq!(timeout("2147483647"), 2147483647);
    // Not a number, or beyond Mooncake's `int`, fails as any bad value does.
    assert_eq!(
        refused(&[("MC_TRANSFER_TIMEOUT", "2147483648")]),
        ["MC_TRANSFER_TIMEOUT=2147483648 is not a number up to 2147483647 (below 5: 5)"]
    );
    assert_eq!(refused(&[("MC_TRANSFER_TIMEOUT", "5s")]).len(), 1);
}

#[test]
fn mc_force_tcp_0_does_not_force_tcp() {
    // Mooncake's engine forces TCP when the variable is set at all; here
    // `0` (and the other off words) means not forced, and the docs say so.
    assert!(!parse(&[("MC_FORCE_TCP", "0")]).engine.force_tcp);
    assert!(!parse(&[("MC_FORCE_HCA", "0")]).engine.force_hca);
    assert!(parse(&[("MC_FORCE_TCP", "1")]).engine.force_tcp);
    assert!(!parse(&[]).engine.force_tcp);
}

#[test]
fn a_fragment_ratio_not_below_the_slice_size_counts_as_4() {
    let c = parse(&[("MC_SLICE_SIZE", "1024"), ("MC_FRAGMENT_RATIO", "1024")]);
    assert_eq!(c.sched.fragment_limit, 256);
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(
        c.warnings[0].contains("MC_FRAGMENT_RATIO=1024"),
        "{:?}",
        c.warnings
    );
    let c = parse(&[("MC_SLICE_SIZE", "1024"), ("MC_FRAGMENT_RATIO", "1023")]);
    assert_eq!(c.sched.fragment_limit, 1);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn set_unsupported_variables_are_listed_not_refused() {
    let c = parse(&[
        ("MC_CONN_PAUSE_TTL_MS", "1000"),
        ("MC_TCP_ENABLE_CONNECTION_POOL", "1"),
        ("MC_USE_TENT", ""),
        ("MC_SLICE_SIZE", "4096"),
    ]);
    assert_eq!(
        c.unsupported,
        [
            "MC_CONN_PAUSE_TTL_MS",
            "MC_TCP_ENABLE_CONNECTION_POOL",
            "MC_USE_TENT"
        ]
    );
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert!(parse(&[]).unsupported.is_empty());
    // MC_LOG_DIR is read (the logging setup uses it), empty as unset.
    let c = parse(&[("MC_LOG_DIR", "/var/log/te")]);
    assert_eq!(c.engine.log_dir.as_deref(), Some("/var/log/te".as_ref()));
    assert!(c.unsupported.is_empty());
    assert_eq!(parse(&[("MC_LOG_DIR", "")]).engine.log_dir, None);
}

#[test]
fn good_values_are_taken() {
    let c = parse(&[
        ("MC_SLICE_SIZE", "131072"),
        ("MC_FRAGMENT_RATIO", "8"),
        ("MC_LOG_LEVEL", "trace"),
        ("MC_TCP_MAX_CONNECTIONS_PER_PEER", "2"),
        ("MC_DISABLE_METACACHE", "1"),
        ("MC_TE_FILTERS", "mlx5_0, mlx5_1"),
        ("MC_TCP_PROTO", "1"),
        ("MC_TRANSFER_TIMEOUT", "120"),
    ]);
    assert_eq!(c.sched.slice_size, 131072);
    assert_eq!(c.sched.fragment_limit, 16384);
    assert_eq!(c.engine.log_level, LogLevel::Trace);
    assert_eq!(c.tcp.lanes_per_peer, 2);
    assert!(!c.store.metacache);
    assert_eq!(c.topology.filters, vec!["mlx5_0", "mlx5_1"]);
    assert!(c.tcp.force_v1);
    assert_eq!(c.engine.transfer_timeout_secs, 120);
    // Without a ratio the limit stays 16384 whatever the slice size.
    assert_eq!(
        parse(&[("MC_SLICE_SIZE", "131072")]).sched.fragment_limit,
        16384
    );
    assert_eq!(
        parse(&[("MC_LOG_LEVEL", "warn")]).engine.log_level,
        LogLevel::Warning
    );
    assert!(!parse(&[("MC_TCP_PROTO", "2")]).tcp.force_v1);
    // "Set at all": an empty value or 0 still disables the cache, and
    // binds the legacy port.
    assert!(!parse(&[("MC_DISABLE_METACACHE", "0")]).store.metacache);
    assert!(
        parse(&[("MC_LEGACY_RPC_PORT_BINDING", "")])
            .rpc
            .legacy_port_binding
    );
    // A switch is off for 0, false, no, off and empty.
    for off in ["0", "false", "No", "OFF", ""] {
        assert!(!parse(&[("MC_FORCE_TCP", off)]).engine.force_tcp, "{off}");
    }
    assert!(parse(&[("MC_FORCE_TCP", "yes please")]).engine.force_tcp);
    // An empty text is unset.
    assert_eq!(parse(&[("MC_TCP_BIND_ADDRESS", "")]).rpc.bind_address, None);
}

#[test]
fn data_port_minimum_rate() {
    let d = parse(&[]);
    assert_eq!((d.tcp.min_rate, d.tcp.min_rate_window_secs), (65536, 10));
    let c = parse(&[
        ("MC_TCP_MIN_RATE_BYTES_PER_SEC", "0"),
        ("MC_TCP_MIN_RATE_WINDOW_SEC", "60"),
    ]);
    assert_eq!((c.tcp.min_rate, c.tcp.min_rate_window_secs), (0, 60));
    assert_eq!(
        refused(&[
            ("MC_TCP_MIN_RATE_BYTES_PER_SEC", "-1"),
            ("MC_TCP_MIN_RATE_WINDOW_SEC", "0"),
        ]),
        [
            "MC_TCP_MIN_RATE_BYTES_PER_SEC=-1 is not a number in 0..=1073741824",
            "MC_TCP_MIN_RATE_WINDOW_SEC=0 is not a number in 1..=3600",
        ]
    );
}

#[test]
fn port_ranges_follow_mooncake_rule() {
    let range = |lo: &str, hi: &str| {
        lookup(&[("MC_MIN_RPC_PORT", lo), ("MC_MAX_RPC_PORT", hi)])
            .map(|c| (c.rpc.min_port, c.rpc.max_port))
            .map_err(|e| e.to_string())
    };
    assert_eq!(range("2000", "3000"), Ok((2000, 3000)));
    assert_eq!(range("61000", "65535"), Ok((61000, 65535)));
    assert_eq!(range("1024", "32767"), Ok((1024, 32767)));
    assert_eq!(
        range("80", "443").unwrap_err(),
        "MC_MIN_RPC_PORT=80 is not a number in 1024..=65535 outside 32768..=60999; \
         MC_MAX_RPC_PORT=443 is not a number in 1024..=65535 outside 32768..=60999"
    );
    assert!(range("32768", "40000").is_err());
    assert_eq!(
        range("3000", "2000").unwrap_err(),
        "MC_MIN_RPC_PORT=3000 MC_MAX_RPC_PORT=2000 is not a range: the minimum is above the \
         maximum"
    );
    assert!(range("61000", "65536").is_err());
    // One alone keeps the other's default; Mooncake's spelling is read too.
    let c = parse(&[("MC_MIN_PRC_PORT", "2000")]);
    assert_eq!((c.rpc.min_port, c.rpc.max_port), (2000, 17000));
    assert!(lookup(&[("MC_MIN_RPC_PORT", "18000")]).is_err());
}

#[test]
fn shared_memory_variables() {
    let d = parse(&[]);
    assert!(d.shm.auto_install);
    assert_eq!(
        (
            d.shm.max_peers,
            d.shm.ring_entries,
            d.shm.table_slots,
            d.shm.timeout_secs,
            d.shm.spin_us,
            d.shm.max_mappings,
            d.shm.slice_size
        ),
        (256, 1024, 65536, 10, 50, 256, 1 << 20)
    );
    assert!((1..=4).contains(&d.shm.threads));
    assert!(!parse(&[("MC_TE_SHM", "0")]).shm.auto_install);
    assert!(parse(&[("MC_TE_SHM", "1")]).shm.auto_install);
    let c = parse(&[
        ("MC_SHM_THREADS", "2"),
        ("MC_SHM_MAX_PEERS", "8"),
        ("MC_SHM_RING_ENTRIES", "64"),
        ("MC_SHM_TABLE_SLOTS", "100"),
        ("MC_SHM_TIMEOUT_SEC", "1"),
        ("MC_SHM_SPIN_US", "0"),
        ("MC_SHM_MAX_MAPPINGS", "16"),
        ("MC_SHM_SLICE_SIZE", "65536"),
    ]);
    assert_eq!(
        (
            c.shm.threads,
            c.shm.max_peers,
            c.shm.ring_entries,
            c.shm.table_slots,
            c.shm.timeout_secs,
            c.shm.spin_us,
            c.shm.max_mappings,
            c.shm.slice_size
        ),
        (2, 8, 64, 100, 1, 0, 16, 65536)
    );
    assert!(c.warnings.is_empty());
    let bad = refused(&[
        ("MC_SHM_THREADS", "0"),
        ("MC_SHM_MAX_PEERS", "x"),
        ("MC_SHM_RING_ENTRIES", "8"),
        ("MC_SHM_TABLE_SLOTS", "0"),
        ("MC_SHM_TIMEOUT_SEC", "0"),
        ("MC_SHM_SPIN_US", "10001"),
        ("MC_SHM_MAX_MAPPINGS", "0"),
        ("MC_SHM_SLICE_SIZE", "0"),
    ]);
    assert_eq!(bad.len(), 8);
    assert!(bad.contains(&"MC_SHM_RING_ENTRIES=8 is not a number in 16..=65536".to_string()));
}

#[test]
fn cuda_variables_are_read_as_set() {
    let d = parse(&[]);
    assert_eq!(
        (
            d.topology.cuda_visible_devices,
            d.topology.cuda_device_order
        ),
        (None, None)
    );
    // Empty is kept: CUDA shows no GPU then, unlike unset.
    let c = parse(&[
        ("CUDA_VISIBLE_DEVICES", ""),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
    ]);
    assert_eq!(c.topology.cuda_visible_devices.as_deref(), Some(""));
    assert_eq!(c.topology.cuda_device_order.as_deref(), Some("PCI_BUS_ID"));
    assert_eq!(
        parse(&[("CUDA_VISIBLE_DEVICES", "1,0")])
            .topology
            .cuda_visible_devices
            .as_deref(),
        Some("1,0")
    );
}

#[test]
fn settings_give_each_row_once_with_its_source_and_no_secret() {
    let vars = [
        ("MC_SLICE_SIZE", "131072"),
        ("MC_MIN_PRC_PORT", "15100"),
        ("MC_REDIS_PASSWORD", "hunter2"),
        ("MC_ETCD_USERNAME", "root"),
        ("MC_ETCD_PASSWORD", "hunter3"),
        (
            "MC_TE_AUTH_KEY",
            "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        ),
        ("MC_USE_TENT", "1"),
    ];
    let lookup = |k: &str| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    let config = Config::from_lookup(lookup).unwrap();
    let settings = config.settings(lookup);
    let rows: usize = config
        .parts(&Reader::new(&|_| None))
        .iter()
        .map(|(doc, _)| doc.rows.len())
        .sum();
    assert_eq!(settings.iter().filter(|s| s.supported).count(), rows);
    let of = |var: &str| {
        settings
            .iter()
            .find(|s| s.variables.contains(&var))
            .unwrap_or_else(|| panic!("no {var}"))
    };
    assert_eq!(
        of("MC_SLICE_SIZE").source,
        SettingSource::Environment("MC_SLICE_SIZE")
    );
    assert_eq!(of("MC_SLICE_SIZE").value, "131072 (128 KiB)");
    // An alias names itself as the source.
    assert_eq!(
        of("MC_MIN_RPC_PORT").source,
        SettingSource::Environment("MC_MIN_PRC_PORT")
    );
    assert_eq!(of("MC_MIN_RPC_PORT").value, "15100");
    assert_eq!(of("MC_RETRY_CNT").source, SettingSource::Default);
    assert_eq!(of("MC_REDIS_PASSWORD").value, "<set>");
    assert_eq!(of("MC_ETCD_PASSWORD").value, "root:<set>");
    assert_eq!(of("MC_TE_AUTH_KEY").value, "<set>");
    let tent = of("MC_USE_TENT");
    assert!(!tent.supported);
    assert_eq!(tent.source, SettingSource::Environment("MC_USE_TENT"));
    let all = format!("{settings:?}");
    assert!(
        !all.contains("hunter") && !all.contains("00112233"),
        "{all}"
    );
}
