//! Raw-socket clients that ask an engine's handshake listener for its
//! descriptor (a large one: 90,000 registered buffers, about 5.6 MB) and
//! never read the reply. The replies held for them stay within
//! `MC_HANDSHAKE_MAX_BUFFERED`: the clients stalled longest are closed.
//! Real peers are served meanwhile, and a client that reads gets every byte.

use crate::common;

use common::handshake::{FrameKind, call};
use common::proc::rss_kb;
use common::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};
use transfer_engine::{Location, Region};

const BUFFERS: usize = 90_000;
const STALLED: usize = 24;
const MAX_BUFFERED: usize = 16 << 20;
/// Longest a real peer's Probe may take meanwhile.
const PROMPT: Duration = Duration::from_secs(5);

/// A Metadata request frame, by hand (`[u64 LE length][type 1][JSON]`).
fn metadata_frame() -> Vec<u8> {
    let payload = b"{}\n";
    let mut f = (payload.len() as u64 + 1).to_le_bytes().to_vec();
    f.push(1);
    f.extend_from_slice(payload);
    f
}

/// Whether the server has begun a reply on `s`, or closed it.
fn answered(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let done = !matches!(s.peek(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    done
}

#[test]
fn unread_descriptor_replies_stay_within_the_buffer_bound() {
    let max_buffered = MAX_BUFFERED.to_string();
    let e = engine_with(&[
        ("MC_HANDSHAKE_MAX_BUFFERED", max_buffered.as_str()),
        ("MC_HANDSHAKE_IO_TIMEOUT", "120"),
        ("MC_HANDSHAKE_WORKERS", "2"),
    ]);
    let mem = Buf::zeroed(BUFFERS * 64);
    let regions: Vec<Region> = (0..BUFFERS as u64)
        .map(|i| Region {
            addr: mem.addr() + i * 64,
            length: 64,
            location: Location::Cpu(0),
            remote_accessible: true,
        })
        .collect();
    e.register(&regions).expect("register");
    let port = handshake_port(&e);

    // A client that reads gets the whole descriptor.
    let mut c = connect(port);
    c.write_all(&metadata_frame()).unwrap();
    let reference = read_until_closed(&mut c, Duration::from_secs(60));
    drop(c);
    assert_eq!(reference[8], 1, "a Metadata reply");
    let desc: Value = serde_json::from_slice(&reference[9..]).expect("descriptor JSON");
    let addrs: BTreeSet<u64> = desc["buffers"]
        .as_array()
        .expect("buffers")
        .iter()
        .filter_map(|b| b["addr"].as_u64())
        .collect();
    assert!(regions.iter().all(|r| addrs.contains(&r.addr)));
    let rss_before = rss_kb();

    let mut stalled: Vec<TcpStream> = (0..STALLED)
        .map(|_| {
            let mut s = connect(port);
            s.write_all(&metadata_frame()).unwrap();
            s
        })
        .collect();
    // Real peers' probes while the replies are built and held.
    let end = Instant::now() + Duration::from_secs(120);
    let (mut probes, mut worst) = (0, Duration::ZERO);
    let mut rss_peak = rss_before;
    while !stalled.iter().all(answered) {
        assert!(Instant::now() < end, "requests not answered in two minutes");
        let t = Instant::now();
        let reply = call("127.0.0.1", port, FrameKind::Probe, &json!({})).expect("probe");
        assert_eq!(reply, json!({"status": "success"}));
        let took = t.elapsed();
        assert!(took < PROMPT, "probe took {took:?}");
        worst = worst.max(took);
        probes += 1;
        rss_peak = rss_peak.max(rss_kb());
        thread::sleep(Duration::from_millis(50));
    }
    let reply = call(
        "127.0.0.1",
        port,
        FrameKind::Notify,
        &json!({"name": "peer", "notify_msg": "hello"}),
    )
    .expect("notify");
    assert_eq!(reply["notify_msg"], "success");

    // Each stalled client reads now: the whole descriptor if its reply was
    // still held, a reply cut short if the server closed it to make room.
    let mut cut = 0;
    for s in &mut stalled {
        let got = read_until_closed(s, Duration::from_secs(60));
        if got.len() < reference.len() {
            assert!(reference.starts_with(&got), "a cut reply is a prefix");
            cut += 1;
        } else {
            assert!(got == reference, "a whole reply is the descriptor");
        }
    }
    println!(
        "{STALLED} unread replies of {} bytes, MC_HANDSHAKE_MAX_BUFFERED {} MiB: {cut} closed \
         by the listener; RSS {} MiB before, peak {} MiB; {probes} probes, slowest {worst:?}",
        reference.len(),
        MAX_BUFFERED >> 20,
        rss_before >> 10,
        rss_peak >> 10
    );
    // The replies held at once fit in the bound; the others were closed.
    let kept = MAX_BUFFERED / reference.len();
    assert!(cut >= STALLED - kept, "only {cut} of {STALLED} closed");
    e.shutdown();
}
