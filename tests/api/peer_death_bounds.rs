//! A peer killed with SIGKILL while an initiator keeps submitting to it:
//! the initiator's threads stay bounded (no thread per endpoint, no
//! endpoint rebuilt per failed slice), every task ends FAILED promptly, and
//! the log stays readable (repeated warnings are summarised, not written
//! per slice). The target is a child process: this same test binary, run
//! with `TE_DEATH_CHILD=1`.

use crate::common;

use common::proc::threads;
use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use transfer_engine::{Config, Engine, TaskStatus};

const CHILD_VAR: &str = "TE_DEATH_CHILD";
const LEN: usize = 1 << 20;
const BLOCK: usize = 64 << 10;
/// "At once" for a dead peer: far below any timeout a wait for it would
/// take (connects and handshakes wait seconds), and loose enough for a
/// debug build sharing two cores with other tests.
const AT_ONCE: Duration = Duration::from_secs(1);

/// Counts WARN lines.
struct CountWarns(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountWarns {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The target, in the child: serves a buffer until it is killed. Named
/// `TE_DEATH_NAME` (default `127.0.0.1:0`), configured by its environment.
fn child() {
    let name = std::env::var("TE_DEATH_NAME").unwrap_or_else(|_| "127.0.0.1:0".into());
    let e = Engine::new("P2PHANDSHAKE", &name, false).expect("engine");
    e.install_transport("tcp", None).expect("install tcp");
    let mem = Buf::new(LEN, 3);
    register(&e, &mem, true);
    println!("CHILD READY {} {}", e.local_name(), mem.addr());
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn killed_peer_costs_no_threads_and_few_log_lines() {
    if std::env::var_os(CHILD_VAR).is_some() {
        return child();
    }
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let warns = Arc::new(AtomicUsize::new(0));
    tracing_subscriber::registry()
        .with(CountWarns(warns.clone()))
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .init();
    let mut target = Command::new(std::env::current_exe().unwrap())
        .args([
            &common::test_path(
                module_path!(),
                "killed_peer_costs_no_threads_and_few_log_lines",
            ),
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_VAR, "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the target");
    let out = BufReader::new(target.stdout.take().unwrap());
    let ready = out
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.find("CHILD READY ").map(|at| l[at + 12..].to_string()))
        .expect("the target's READY line");
    let (name, base) = ready.split_once(' ').unwrap();
    let base: u64 = base.parse().unwrap();

    let e = engine();
    let src = Buf::new(8 * BLOCK, 5);
    let seg = e.open_segment(name).expect("open the target");
    let batch = |e: &transfer_engine::Engine| {
        let reqs: Vec<_> = (0..8)
            .map(|i| {
                write_req(
                    src.addr() + (i * BLOCK) as u64,
                    seg,
                    base + (i * BLOCK) as u64,
                    BLOCK as u64,
                )
            })
            .collect();
        run_within(e, &reqs, Duration::from_secs(30))
    };
    assert!(batch(&e).iter().all(|s| *s == TaskStatus::Completed));
    let threads_before = threads();
    let warns_before = warns.load(Ordering::Relaxed);

    target.kill().expect("kill -9 the target");
    target.wait().unwrap();
    let start = Instant::now();
    let (mut batches, mut failed, mut max_threads) = (0, 0, 0);
    while start.elapsed() < Duration::from_secs(12) {
        let t = Instant::now();
        let st = batch(&e);
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "a batch to the dead peer took {:?}",
            t.elapsed()
        );
        batches += 1;
        failed += st.iter().filter(|s| **s == TaskStatus::Failed).count();
        max_threads = max_threads.max(threads());
    }
    let warned = warns.load(Ordering::Relaxed) - warns_before;
    println!(
        "{batches} batches of 8 x 64 KiB to a dead peer in 12 s: {failed} tasks FAILED; threads {threads_before} -> max {max_threads}; {warned} WARN lines"
    );
    assert!(batches > 10, "only {batches} batches in 12 s");
    assert_eq!(failed, batches * 8, "every task to the dead peer fails");
    assert!(
        max_threads <= threads_before + 2,
        "threads grew from {threads_before} to {max_threads}"
    );
    assert!(
        warned <= 40,
        "{warned} WARN lines for {failed} failed tasks: the log floods"
    );
    e.shutdown();
}

/// The tests of this binary run one at a time: the first counts the
/// process's threads and WARN lines.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The cluster key of the keyed test (hex, `MC_TE_AUTH_KEY`).
const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// Settings in Mooncake's style (`MC_LEGACY_RPC_PORT_BINDING=1`, a name
/// without a port means `port`), with the cluster key or not.
fn legacy_settings(port: u16, keyed: bool) -> Vec<(&'static str, String)> {
    let mut v = vec![
        ("MC_LEGACY_RPC_PORT_BINDING", "1".to_string()),
        ("MC_HANDSHAKE_PORT", port.to_string()),
    ];
    if keyed {
        v.push(("MC_TE_AUTH_KEY", KEY.to_string()));
    }
    v
}

/// The target process, killed (SIGKILL) and reaped on drop.
struct Target {
    child: std::process::Child,
    /// Its buffer's address.
    base: u64,
}

impl Target {
    /// This test binary's `test` as the target, named `name`, with the
    /// settings `env`; its output is drained in the background.
    fn start(test: &str, name: &str, env: &[(&str, String)]) -> Target {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                &common::test_path(module_path!(), test),
                "--exact",
                "--nocapture",
            ])
            .env(CHILD_VAR, "1")
            .env("TE_DEATH_NAME", name)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the target");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.find("CHILD READY ").map(|at| l[at + 12..].to_string()))
            .expect("the target's READY line");
        std::thread::spawn(move || lines.for_each(drop));
        let (_, base) = ready.split_once(' ').unwrap();
        Target {
            child,
            base: base.parse().unwrap(),
        }
    }

    /// Kills it with SIGKILL and reaps it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A WRITE of `src` to `base` of `seg`, then a READ of it back into
/// `back`, as two batches: their statuses, the time both took, and why
/// the failed ones failed (`te_last_error` after `getTransferStatus`).
fn round_trip(
    e: &Engine,
    seg: i32,
    (src, back): (&Buf, &Buf),
    base: u64,
) -> (Vec<TaskStatus>, Duration, Vec<String>) {
    let t = Instant::now();
    let len = src.len() as u64;
    let (mut st, mut why) = (Vec::new(), Vec::new());
    for r in [
        write_req(src.addr(), seg, base, len),
        read_req(back.addr(), seg, base, len),
    ] {
        let b = e.allocate_batch(1).expect("batch");
        e.submit(b, &[r]).expect("submit");
        let s = wait_task(e, b, 0, Duration::from_secs(30));
        if let Some(w) = e.failure_reason(b, 0).expect("failure reason") {
            why.push(w);
        }
        e.free_batch(b).expect("free batch");
        st.push(s);
    }
    (st, t.elapsed(), why)
}

/// A peer killed with SIGKILL (Mooncake's style: legacy port binding, the
/// peer opened by its bare name) fails `openSegment` and batches at once,
/// with the reason, not after the handshake client's retries; restarted
/// on the same name, it is reached by the next batch, bytes verified.
fn killed_peer_fails_at_once(test: &str, keyed: bool) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let port = common::servers::fixed_port();
    let env = legacy_settings(port, keyed);
    let initiator = || {
        let env = env.clone();
        let cfg =
            Config::from_lookup(move |k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()));
        let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
            .config(cfg)
            .build()
            .expect("engine");
        e.install_transport("tcp", None).expect("install tcp");
        e
    };
    let mut target = Target::start(test, "127.0.0.1", &env);
    let a = initiator();
    let src = Buf::new(LEN, 5);
    let back = Buf::zeroed(LEN);
    register(&a, &src, true);
    register(&a, &back, true);
    let seg = a
        .open_segment("127.0.0.1")
        .expect("open the target by its bare name");
    let (st, _, _) = round_trip(&a, seg, (&src, &back), target.base);
    assert_eq!(st, [TaskStatus::Completed; 2]);
    assert!(back.snapshot() == pattern(LEN, 5), "bytes read back");

    target.kill();
    let c = initiator();
    let t = Instant::now();
    let err = c.open_segment("127.0.0.1").expect_err("open a dead peer");
    let took = t.elapsed();
    println!("openSegment of the dead peer failed in {took:?}: {err}");
    assert!(took < AT_ONCE, "openSegment took {took:?}");
    assert!(err.to_string().contains("refused"), "{err}");
    for i in 0..3 {
        let (st, took, why) = round_trip(&a, seg, (&src, &back), target.base);
        println!("batch {i} to the dead peer: {st:?} in {took:?}: {why:?}");
        assert_eq!(st, [TaskStatus::Failed; 2]);
        assert!(took < AT_ONCE, "batch {i} took {took:?}");
        assert_eq!(why.len(), 2, "every failed task has a reason");
        assert!(why.iter().all(|w| w.contains("refused")), "{why:?}");
    }

    let target = Target::start(test, "127.0.0.1", &env);
    let src = Buf::new(LEN, 6);
    register(&a, &src, true);
    let (st, took, why) = round_trip(&a, seg, (&src, &back), target.base);
    println!("first batch to the restarted peer: {st:?} in {took:?} {why:?}");
    assert_eq!(st, [TaskStatus::Completed; 2]);
    assert!(back.snapshot() == pattern(LEN, 6), "bytes read back");
    let seg_c = c
        .open_segment("127.0.0.1")
        .expect("open the restarted peer");
    let src = Buf::new(LEN, 7);
    register(&c, &src, true);
    register(&c, &back, true);
    let (st, _, _) = round_trip(&c, seg_c, (&src, &back), target.base);
    assert_eq!(st, [TaskStatus::Completed; 2]);
    assert!(back.snapshot() == pattern(LEN, 7), "bytes read back");
}

#[test]
fn killed_peer_fails_at_once_and_is_reached_after_its_restart() {
    if std::env::var_os(CHILD_VAR).is_some() {
        return child();
    }
    killed_peer_fails_at_once(
        "killed_peer_fails_at_once_and_is_reached_after_its_restart",
        false,
    );
}

#[test]
fn killed_keyed_peer_fails_at_once_and_is_reached_after_its_restart() {
    if std::env::var_os(CHILD_VAR).is_some() {
        return child();
    }
    killed_peer_fails_at_once(
        "killed_keyed_peer_fails_at_once_and_is_reached_after_its_restart",
        true,
    );
}
