//! A real Prometheus server (Debian's `prometheus`, or `TE_PROMETHEUS_BIN`)
//! scrapes an engine's `MC_TE_METRICS_ADDR` every second: after a known
//! number of bytes moved (some before the server starts, some after),
//! its query API reports `transfer_engine_transferred_bytes_total`
//! summing to exactly those bytes, with the local WRITE and READ series
//! apart. Skipped (failing with `CI=true` or `TE_REQUIRE_SERVERS=1`)
//! without the binary.

use crate::common;

use common::servers::{Process, TempDir, find_binary, free_port};
use common::{Buf, read_req, register, run, write_req};
use std::time::{Duration, Instant};
use transfer_engine::{LOCAL_SEGMENT_ID, TaskStatus};

/// How long the server has to report the bytes (scrapes are 1 s apart).
const REPORT_WITHIN: Duration = Duration::from_secs(30);

/// The series of `query` as the server's query API answers it now:
/// each one's labels and value; `None` while it cannot answer.
fn query(agent: &ureq::Agent, port: u16, query: &str) -> Option<Vec<(serde_json::Value, f64)>> {
    let url = format!("http://127.0.0.1:{port}/api/v1/query");
    let text = agent
        .get(&url)
        .query("query", query)
        .call()
        .ok()?
        .body_mut()
        .read_to_string()
        .ok()?;
    let body: serde_json::Value = serde_json::from_str(&text).ok()?;
    assert_eq!(body["status"], "success", "{body}");
    let series = body["data"]["result"].as_array()?;
    Some(
        series
            .iter()
            .map(|s| {
                let v = s["value"][1].as_str().and_then(|v| v.parse().ok());
                (s["metric"].clone(), v.unwrap_or_else(|| panic!("{s}")))
            })
            .collect(),
    )
}

#[test]
fn prometheus_reports_the_bytes_moved() {
    let Some(bin) = find_binary("TE_PROMETHEUS_BIN", "prometheus", "prometheus") else {
        return;
    };
    let e = common::engine_with(&[("MC_TE_METRICS_ADDR", "127.0.0.1:0")]);
    let target = e.metrics_addr().expect("serving");
    let b = Buf::new(1 << 20, 1);
    register(&e, &b, true);
    let half = 512 << 10;
    let writes: Vec<_> = (0..8u64)
        .map(|i| {
            write_req(
                b.addr() + i * 4096,
                LOCAL_SEGMENT_ID,
                b.addr() + half + i * 4096,
                4096,
            )
        })
        .collect();
    assert!(run(&e, &writes).iter().all(|s| *s == TaskStatus::Completed));

    let dir = TempDir::new("prometheus");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - \
             job_name: transfer-engine\n    scrape_interval: 1s\n    static_configs:\n      - \
             targets: [\"{target}\"]\n"
        ),
    )
    .unwrap();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut server = None;
    for _ in 0..3 {
        let port = free_port();
        let mut p = Process::new(
            "prometheus",
            bin.clone(),
            vec![
                format!("--config.file={}", config.display()).into(),
                format!("--web.listen-address=127.0.0.1:{port}").into(),
                format!("--storage.tsdb.path={}", dir.path().join("data").display()).into(),
            ],
            dir.path().join("prometheus.log"),
        );
        p.spawn();
        let ready = p.wait_ready(|| {
            agent
                .get(&format!("http://127.0.0.1:{port}/-/ready"))
                .call()
                .is_ok_and(|r| r.status() == 200)
        });
        if ready {
            server = Some((p, port));
            break;
        }
    }
    let (mut server, port) = server.expect("prometheus could not listen on a free port");

    let reads: Vec<_> = (0..3u64)
        .map(|i| read_req(b.addr() + i * 1000, LOCAL_SEGMENT_ID, b.addr() + half, 1000))
        .collect();
    assert!(run(&e, &reads).iter().all(|s| *s == TaskStatus::Completed));
    let moved = 8 * 4096 + 3 * 1000;

    let deadline = Instant::now() + REPORT_WITHIN;
    let series = loop {
        let now = query(&agent, port, "transfer_engine_transferred_bytes_total");
        if let Some(series) = now.filter(|s| s.iter().map(|(_, v)| v).sum::<f64>() == moved as f64)
        {
            break series;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus did not report {moved} bytes within {REPORT_WITHIN:?}; log:\n{}",
            server.log_tail(4000)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let local = |op: &str| {
        series
            .iter()
            .find(|(m, _)| m["transport"] == "local" && m["op"] == op)
            .map(|(m, v)| {
                assert_eq!(m["job"], "transfer-engine", "{m}");
                *v
            })
    };
    assert_eq!(local("write"), Some((8 * 4096) as f64));
    assert_eq!(local("read"), Some(3000.0));
    assert!(series.len() >= 8, "every transport and op, zeros included");
    server.stop();
}
