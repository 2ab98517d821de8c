//! A peer running as another user (`setpriv` to `nobody`): the kernel
//! refuses cross-memory attach between us, so the peer is unreachable by
//! shared memory, each way: every slice ends `Unreachable` (the engine
//! then uses its network transport), with one log line, and no byte moves.
//! Needs root (to start the child as `nobody`); skipped otherwise.

use super::buf::Buf;
use super::harness::*;
use crate::transport::Outcome;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

const AS_NOBODY: [&str; 4] = [
    "setpriv",
    "--reuid=nobody",
    "--regid=nogroup",
    "--clear-groups",
];
const SLICE: u64 = 65536;

/// Counts WARN lines and keeps them.
struct Warns(Arc<AtomicUsize>, Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warns {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::Relaxed);
            let mut text = String::new();
            event.record(&mut |f: &tracing::field::Field, v: &dyn std::fmt::Debug| {
                if f.name() == "message" {
                    text = format!("{v:?}");
                }
            });
            self.1.lock().unwrap().push(text);
        }
    }
}

fn root() -> bool {
    // SAFETY: a plain system call.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_peer_of_another_user_is_unreachable_both_ways_with_one_log_line() {
    let test =
        two_process_test!("a_peer_of_another_user_is_unreachable_both_ways_with_one_log_line");
    if !root() {
        println!("skipped: starting a child as nobody needs root");
        return;
    }
    let warns = Arc::new(AtomicUsize::new(0));
    let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
    tracing_subscriber::registry()
        .with(Warns(warns.clone(), lines.clone()))
        .init();
    let local = Local::start();
    let child = Child::spawn(test, &[], &AS_NOBODY);
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.pid())).unwrap();
    assert!(status.contains("Uid:\t65534"), "the child runs as nobody");

    // We initiate: the child cannot read our memory, so it refuses.
    let c_dst = child.alloc(64 * SLICE, None, true);
    let c_src = child.alloc(64 * SLICE, Some(1), true);
    let src = Buf::zeroed((64 * SLICE) as usize);
    // SAFETY: a fresh buffer of ours.
    unsafe { fill(src.addr(), 64 * SLICE, 2, 0) };
    let back = Buf::zeroed((64 * SLICE) as usize);
    let peer = child.peer_of(&local);
    for _ in 0..3 {
        let mut batch = slices(src.addr(), c_dst, 64 * SLICE, SLICE, true);
        batch.extend(slices(back.addr(), c_src, 64 * SLICE, SLICE, false));
        let out = local.run(&peer, &batch);
        assert!(
            out.iter().all(|o| *o == Outcome::Unreachable),
            "{:?}",
            tally(&out)
        );
    }
    let ours: Vec<String> = lines.lock().unwrap().clone();
    println!("our log: {ours:?}");
    assert_eq!(warns.load(Ordering::Relaxed), 1, "one line: {ours:?}");
    assert!(
        ours[0].contains("cannot be reached by shared memory"),
        "{ours:?}"
    );
    let c = child.call(
        json!({"cmd": "not_equal", "addr": c_dst, "len": 64 * SLICE, "value": 0}),
        None,
    );
    assert_eq!(c["bad"], json!(0), "no byte moved to the child");
    // SAFETY: our buffer; the READs have ended.
    let moved = unsafe { not_equal(back.addr(), 64 * SLICE, 0) };
    assert_eq!(moved, 0, "no byte moved to us");
    assert_eq!(
        child.call(json!({"cmd": "stats"}), None)["served_peers"],
        json!(0)
    );

    // The child initiates: we may read it (root), it may not take our
    // descriptors, so it finds us unreachable.
    let t = Buf::zeroed((64 * SLICE) as usize);
    local.register(t.addr(), 64 * SLICE, true);
    let ok = child.call(
        json!({"cmd": "connect", "shm": local.shm.descriptor()}),
        None,
    );
    assert_eq!(ok["ok"], json!(true));
    let mut batch = slices(c_src, t.addr(), 64 * SLICE, SLICE, true);
    batch.extend(slices(c_dst, t.addr(), 64 * SLICE, SLICE, false));
    child.run_expecting(json!(batch), &local, "Unreachable");
    // SAFETY: our buffer; nothing was copied into it.
    assert_eq!(unsafe { not_equal(t.addr(), 64 * SLICE, 0) }, 0);
    assert_eq!(local.shm.stats().served, 0);
    child.exit();
    local.shm.shutdown();
}
