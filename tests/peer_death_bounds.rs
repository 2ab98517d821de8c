//! A peer killed with SIGKILL while an initiator keeps submitting to it:
//! the initiator's threads stay bounded (no thread per endpoint, no
//! endpoint rebuilt per failed slice), every task ends FAILED promptly, and
//! the log stays readable (repeated warnings are summarised, not written
//! per slice). The target is a child process: this same test binary, run
//! with `TE_DEATH_CHILD=1`.

mod common;

use common::proc::threads;
use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use transfer_engine::TaskStatus;

const CHILD_VAR: &str = "TE_DEATH_CHILD";
const LEN: usize = 1 << 20;
const BLOCK: usize = 64 << 10;

/// Counts WARN lines.
struct CountWarns(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountWarns {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The target, in the child: serves a buffer until it is killed.
fn child() {
    let e = engine();
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
    let warns = Arc::new(AtomicUsize::new(0));
    tracing_subscriber::registry()
        .with(CountWarns(warns.clone()))
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .init();
    let mut target = Command::new(std::env::current_exe().unwrap())
        .args([
            "killed_peer_costs_no_threads_and_few_log_lines",
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
