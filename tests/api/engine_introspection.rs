//! What the Python binding asks an engine besides transfers: its RPC port
//! and a probe of a peer's listener; and what creating an engine touches:
//! it connects only to the metadata store it was given (traced with
//! `strace -f -e trace=connect` in a child process).

use crate::common;

use common::{Buf, engine, register, run_within, wait_for, write_req};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use transfer_engine::{Config, Engine, TaskStatus};

#[test]
fn rpc_port_is_the_port_of_the_p2p_name() {
    let e = engine();
    let port = e.rpc_port();
    assert!(port > 0);
    assert_eq!(e.local_name(), format!("127.0.0.1:{port}"));
    assert!(e.local_ip_and_port().ends_with(&format!(":{port}")));
}

#[test]
fn probe_reaches_a_live_listener_and_reports_a_dead_one() {
    let a = engine();
    let b = engine();
    a.send_probe(b.local_name()).expect("probe a live peer");
    a.send_probe(a.local_name()).expect("probe itself");
    let dead = common::servers::dead_addr();
    assert_eq!(a.send_probe(&dead).unwrap_err().err_code(), -102);
    assert_eq!(
        a.send_probe("no-such-host.invalid:1234")
            .unwrap_err()
            .err_code(),
        -101
    );
    assert_eq!(a.send_probe("").unwrap_err().err_code(), -1);
}

#[test]
fn a_wildcard_location_becomes_the_numa_node_of_the_first_page() {
    use transfer_engine::{LOCAL_SEGMENT_ID, Location, Region};
    let e = engine();
    let written = common::Buf::new(8192, 5);
    let untouched = common::Mapping::new(8192);
    let region = |addr: u64, location: &str| Region {
        addr,
        length: 8192,
        location: Location::parse(location).expect("location"),
        remote_accessible: true,
    };
    e.register(&[region(written.addr(), "*"), region(untouched.addr(), "")])
        .expect("register");
    let locations: Vec<(u64, String)> = e
        .segment_buffers(LOCAL_SEGMENT_ID)
        .expect("local buffers")
        .into_iter()
        .map(|b| (b.addr, b.location))
        .collect();
    // The test machines have one NUMA node, 0 (elsewhere: some node). A
    // page never written (TCP pins nothing) has no node: it stays "*", as
    // in Mooncake.
    let one_node = std::fs::read_dir("/sys/devices/system/node").map_or(true, |d| {
        d.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("node"))
            .count()
            == 1
    });
    let (_, written_at) = locations
        .iter()
        .find(|(a, _)| *a == written.addr())
        .expect("the written buffer");
    if one_node {
        assert_eq!(written_at, "cpu:0", "{locations:?}");
    } else {
        assert!(written_at.starts_with("cpu:"), "{locations:?}");
    }
    assert!(
        locations.contains(&(untouched.addr(), "*".to_string())),
        "{locations:?}"
    );
    e.unregister(&[written.addr(), untouched.addr()])
        .expect("unregister");
}

/// Keeps the metrics lines (`MC_TE_METRIC`) that the engines log, with the
/// engine each names.
struct MetricLines(Arc<Mutex<Vec<(String, String)>>>);

#[derive(Default)]
struct Fields {
    message: String,
    engine: String,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "engine" => self.engine = format!("{value:?}"),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for MetricLines {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        if f.message.starts_with("[Metrics]") {
            self.0.lock().unwrap().push((f.engine, f.message));
        }
    }
}

/// `MC_TE_METRIC` with a 1 s interval: after a transfer over TCP the
/// initiator logs a line with the throughput of its completed tasks and
/// their latencies; an engine without the variable logs none, and the
/// thread stops with the engine.
#[test]
fn metrics_lines_report_completed_transfers() {
    use tracing_subscriber::layer::SubscriberExt;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(MetricLines(lines.clone()));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let mut config = Config::default();
    config.engine.metric = true;
    config.engine.metric_interval_secs = 1;
    let a = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .config(config)
        .build()
        .expect("engine");
    a.install_transport("tcp", None).expect("install tcp");
    let b = engine();
    let len = 4 << 20;
    let src = Buf::new(len, 7);
    let dst = Buf::zeroed(len);
    register(&a, &src, false);
    register(&b, &dst, true);
    let seg = a.open_segment(b.local_name()).expect("open");
    let st = run_within(
        &a,
        &[write_req(src.addr(), seg, dst.addr(), len as u64)],
        Duration::from_secs(30),
    );
    assert_eq!(st, vec![TaskStatus::Completed]);
    assert_eq!(dst.snapshot(), src.snapshot(), "every byte moved");
    let name = a.local_name().to_string();
    let mine = || {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(e, _)| *e == name)
            .map(|(_, l)| l.clone())
            .collect::<Vec<_>>()
    };
    wait_for("a metrics line", Duration::from_secs(10), || {
        !mine().is_empty()
    });
    let line = mine().remove(0);
    // 4 MiB in one task over a 1 s interval: 4.00 MB/s.
    assert!(
        line.starts_with("[Metrics] Transfer Engine Stats (over last 1s): Throughput: 4.00 MB/s")
            && line.contains("Latency Distribution (count=1)")
            && line.contains("NICs:"),
        "{line}"
    );
    assert!(
        lines.lock().unwrap().iter().all(|(e, _)| *e == name),
        "only the engine with MC_TE_METRIC reports"
    );
    // Idle intervals log nothing; the thread ends with the engine.
    a.shutdown();
    let n = mine().len();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(mine().len(), n, "no line after destroy");
    b.shutdown();
}

/// The variable that makes this test binary the traced child: the metadata
/// connection string its engine uses.
const TRACED_CONN: &str = "TE_TEST_TRACED_CONN";

/// The traced child: an engine with auto discovery (hwloc topology, a
/// transport installed from it), a topology discovery, a TCP transport,
/// then destroyed.
fn traced_child(conn: &str) {
    let name = if conn == "P2PHANDSHAKE" {
        "127.0.0.1:0"
    } else {
        "traced-node"
    };
    let e = Engine::builder(conn, name)
        .auto_discover(true)
        .config(Config::from_lookup(|k| match k {
            "MC_TCP_BIND_ADDRESS" => Some("127.0.0.1".into()),
            _ => None,
        }))
        .build()
        .expect("engine");
    e.discover_topology();
    e.install_transport("tcp", None).expect("install tcp");
    e.shutdown();
}

/// The `connect` calls `strace -f` saw while this binary ran
/// [`traced_child`] with `conn`.
fn connects_of_a_child_engine(test: &str, conn: &str) -> Option<Vec<String>> {
    let trace = std::env::temp_dir().join(format!(
        "te-connect-trace-{}-{}",
        std::process::id(),
        conn.len()
    ));
    let run = std::process::Command::new("strace")
        .args(["-f", "-e", "trace=connect", "-o"])
        .arg(&trace)
        .arg(std::env::current_exe().unwrap())
        .args([
            &common::test_path(module_path!(), test),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(TRACED_CONN, conn)
        .env_remove("RUST_LOG")
        .output();
    let out = match run {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            common::skip("strace is not installed (scripts/setup.sh installs it)");
            return None;
        }
        Err(e) => panic!("running strace: {e}"),
    };
    let text = std::fs::read_to_string(&trace).unwrap_or_default();
    let _ = std::fs::remove_file(&trace);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("PTRACE_TRACEME") || stderr.contains("ptrace(PTRACE_SEIZE") {
        common::skip(&format!("strace cannot trace here: {}", stderr.trim()));
        return None;
    }
    assert!(
        out.status.success(),
        "the traced child failed: {}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    Some(
        text.lines()
            .filter(|l| l.contains("connect(") && !l.contains("resumed>"))
            .map(str::to_string)
            .collect(),
    )
}

/// Creating an engine (with auto discovery, hwloc's included, and a
/// topology discovery) connects nowhere it was not asked to: in P2P mode
/// nowhere, with a metadata server only to that server. hwloc's GL
/// component used to connect to X displays :0 to :9
/// (`/tmp/.X11-unix/X*` and 127.0.0.1:6000-6009) from every discovery.
#[test]
fn engine_creation_connects_only_to_its_metadata_store() {
    const TEST: &str = "engine_creation_connects_only_to_its_metadata_store";
    if let Ok(conn) = std::env::var(TRACED_CONN) {
        return traced_child(&conn);
    }
    let Some(p2p) = connects_of_a_child_engine(TEST, "P2PHANDSHAKE") else {
        return;
    };
    assert!(p2p.is_empty(), "connects in P2P mode:\n{}", p2p.join("\n"));

    let server =
        transfer_engine::metadata::server::MetadataServer::start("127.0.0.1:0", "/metadata", None)
            .expect("metadata server");
    let Some(http) = connects_of_a_child_engine(TEST, &server.url()) else {
        return;
    };
    let port = server
        .url()
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let store = format!("sin_port=htons({port}), sin_addr=inet_addr(\"127.0.0.1\")");
    assert!(!http.is_empty(), "the engine published through the store");
    let elsewhere: Vec<_> = http.iter().filter(|l| !l.contains(&store)).collect();
    assert!(
        elsewhere.is_empty(),
        "connects to other than the store ({store}):\n{}",
        elsewhere
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
