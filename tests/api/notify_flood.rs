//! Notify frames from raw sockets, as an attacker sends them: thousands of
//! 1 MiB notifications do not grow the target's memory (each is refused by
//! the size limit, and the frames buffered at once are bounded), real
//! notifications sent meanwhile all arrive, and notifications within the
//! size limit are bounded in bytes by the queue, which keeps those queued
//! and refuses newer ones until they are taken.
//!
//! One test in this file, so the process's peak RSS is this test's.

use crate::common;

use common::handshake::{FrameKind, call};
use common::proc::{rss_kb, status_kb};
use common::*;
use serde_json::{Value, json};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

/// Flood frames, each as large as a frame may be by default (1 MiB).
const FLOOD_FRAMES: usize = 3000;
const FLOOD_THREADS: usize = 6;
/// Bound on the growth of peak RSS during the flood: the frames buffered at
/// once (`MC_HANDSHAKE_MAX_BUFFERED`, 64 MiB) and what the 4 handler
/// threads hold while they parse one frame each (about 3 MiB), with room
/// for the allocator. Without the bounds the flood queues 3 GB.
const RSS_GROWTH_LIMIT_KB: u64 = 128 * 1024;
/// Default bound on queued notification bytes (`MC_NOTIFY_QUEUE_MAX_BYTES`).
const QUEUE_BYTES: usize = 64 << 20;

/// A Notify frame by hand: `[u64 length][2][JSON]`.
fn notify_frame(name: &str, msg: &str) -> Vec<u8> {
    let payload = json!({"name": name, "notify_msg": msg}).to_string();
    let len = payload.len() as u64 + 1;
    let mut f = len.to_le_bytes().to_vec();
    f.push(2);
    f.extend_from_slice(payload.as_bytes());
    f
}

/// Sends one frame on a new connection and returns the reply's JSON, or
/// `None` if the server closed without one.
fn send(port: u16, frame: &[u8]) -> Option<Value> {
    let mut c = connect(port);
    // The server may close before reading everything it was sent.
    c.write_all(frame).ok()?;
    let reply = read_until_closed(&mut c, Duration::from_secs(30));
    (reply.len() > 9).then(|| serde_json::from_slice(&reply[9..]).expect("reply JSON"))
}

#[test]
fn notification_flood_is_bounded_and_real_notifications_arrive() {
    let e = engine();
    let port = handshake_port(&e);
    let base_kb = rss_kb();

    // Phase 1: 1 MiB notifications from several connections at once.
    let overhead = notify_frame("flood", "").len();
    let big = Arc::new(notify_frame("flood", &"x".repeat((1 << 20) + 8 - overhead)));
    assert_eq!(
        big.len(),
        (1 << 20) + 8,
        "a frame of the largest default length"
    );
    let (sent, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let flooders: Vec<_> = (0..FLOOD_THREADS)
        .map(|_| {
            let (big, sent, refused) = (big.clone(), sent.clone(), refused.clone());
            thread::spawn(move || {
                while sent.fetch_add(1, Ordering::Relaxed) < FLOOD_FRAMES {
                    let accepted = send(port, &big).is_some_and(|r| r.get("notify_msg").is_some());
                    if !accepted {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // Real notifications during the flood.
    let mut real = Vec::new();
    for i in 0..50 {
        let msg = format!("real notification {i}");
        let reply = call(
            "127.0.0.1",
            port,
            FrameKind::Notify,
            &json!({"name": "peer", "notify_msg": msg}),
        )
        .expect("a real notification is answered during the flood");
        assert_eq!(reply["notify_msg"], "success", "{reply}");
        real.push(("peer".to_string(), msg));
        thread::sleep(Duration::from_millis(20));
    }
    for f in flooders {
        f.join().expect("flooder");
    }
    let peak_kb = status_kb("VmHWM");
    let refused = refused.load(Ordering::Relaxed);
    println!(
        "{FLOOD_FRAMES} notifications of 1 MiB: {refused} refused; RSS {base_kb} kB before, \
         peak {peak_kb} kB (+{} kB; limit +{RSS_GROWTH_LIMIT_KB} kB), {} kB after",
        peak_kb.saturating_sub(base_kb),
        rss_kb()
    );
    assert_eq!(
        refused, FLOOD_FRAMES,
        "every oversized notification is refused"
    );
    assert!(
        peak_kb.saturating_sub(base_kb) <= RSS_GROWTH_LIMIT_KB,
        "peak RSS grew by {} kB",
        peak_kb - base_kb
    );
    assert_eq!(
        e.take_notifies(),
        real,
        "exactly the real notifications, in order"
    );

    // Phase 2: notifications within the size limit, more bytes in all than
    // the queue keeps: once it is full the newer ones are refused to their
    // sender (which knows, and may send again), the queued ones kept.
    let msg = "y".repeat(60 << 10);
    let count = QUEUE_BYTES / msg.len() + 200;
    let mut accepted = 0;
    for i in 0..count {
        let reply = send(port, &notify_frame(&format!("n{i}"), &msg)).expect("a reply");
        if reply["notify_msg"] == "success" {
            assert_eq!(accepted, i, "accepted after a refusal: {reply}");
            accepted += 1;
        } else {
            assert_eq!(reply["te_retry"], true, "{reply}");
        }
    }
    let kept = e.take_notifies();
    let bytes: usize = kept.iter().map(|(n, m)| n.len() + m.len()).sum();
    println!(
        "{count} notifications of 60 KiB: {} kept ({bytes} bytes), the rest refused",
        kept.len()
    );
    assert!(bytes <= QUEUE_BYTES, "{bytes} bytes queued");
    assert_eq!(kept.len(), accepted);
    assert!(
        kept.len() < count && kept.len() > count / 2,
        "{}",
        kept.len()
    );
    assert_eq!(kept[0].0, "n0", "the oldest is kept");
    // Taken, the queue has room again.
    let reply = send(port, &notify_frame("again", &msg)).expect("a reply");
    assert_eq!(reply["notify_msg"], "success", "{reply}");
    e.shutdown();
}
