//! `MC_TE_REQUIRE_TRANSPORT` between two engines of this process, and the
//! transport `Engine::segment_transport` reports. Shared memory reaches
//! other processes only, so a peer in this process is reached by TCP
//! alone: pinned to `shm`, a request to it FAILS at submit with the
//! reason, and not one byte moves either way; pinned to `tcp` (`local`
//! listed beside it changes nothing), or unset,
//! it goes over TCP, which carries its segment's data (`local` its own).

use crate::common;

use common::{Buf, config_with, pattern, read_req, register, write_req};
use std::sync::Arc;
use std::time::Duration;
use transfer_engine::{Engine, TaskStatus};

const LEN: usize = (1 << 20) + 7;
const SEED_PEER: u8 = 7;
const SEED_OURS: u8 = 3;
const HANG: Duration = Duration::from_secs(60);

/// An engine with TCP and shared memory, `MC_TE_REQUIRE_TRANSPORT` set to
/// `pins` (unset when empty).
fn engine(pins: &str) -> Arc<Engine> {
    let settings: &[(&str, &str)] = if pins.is_empty() {
        &[]
    } else {
        &[("MC_TE_REQUIRE_TRANSPORT", pins)]
    };
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
        .config(config_with(settings))
        .build()
        .expect("engine");
    e.install_transport("tcp", None).expect("tcp");
    e.install_transport("shm", None).expect("shm");
    e
}

/// A WRITE of our pattern to the peer's buffer and a READ of it into a
/// zeroed buffer, from an engine with `pins`: their statuses and reasons;
/// the peer's buffer and ours afterwards; the segment's transport.
fn transfer(pins: &str) -> (Vec<TaskStatus>, Vec<String>, Vec<u8>, Vec<u8>, String) {
    let peer = engine("");
    let theirs = Buf::new(LEN, SEED_PEER);
    register(&peer, &theirs, true);
    let e = engine(pins);
    let src = Buf::new(LEN, SEED_OURS);
    let dst = Buf::zeroed(LEN);
    register(&e, &src, true);
    register(&e, &dst, true);
    let seg = e.open_segment(peer.local_name()).expect("open");
    // The WRITE ends before the READ of the same range begins.
    let (statuses, reasons): (Vec<TaskStatus>, Vec<String>) = [
        write_req(src.addr(), seg, theirs.addr(), LEN as u64),
        read_req(dst.addr(), seg, theirs.addr(), LEN as u64),
    ]
    .iter()
    .map(|r| {
        let batch = e.allocate_batch(1).unwrap();
        e.submit(batch, &[*r]).expect("submit");
        let status = common::wait_task(&e, batch, 0, HANG);
        let why = e.failure_reason(batch, 0).unwrap().unwrap_or_default();
        e.free_batch(batch).unwrap();
        (status, why)
    })
    .unzip();
    let carrier = match e.segment_transport(seg) {
        Ok(name) => name.to_string(),
        Err(err) => format!("error {}: {err}", err.err_code()),
    };
    assert_eq!(e.segment_transport(0).unwrap(), "local");
    let out = (
        statuses,
        reasons,
        theirs.snapshot(),
        dst.snapshot(),
        carrier,
    );
    e.shutdown();
    peer.shutdown();
    out
}

#[test]
fn pinned_to_shm_a_peer_only_tcp_reaches_fails_at_submit_and_no_byte_moves() {
    let (statuses, reasons, theirs, ours, carrier) = transfer("shm");
    assert_eq!(statuses, vec![TaskStatus::Failed; 2]);
    for why in &reasons {
        assert!(
            why.contains("MC_TE_REQUIRE_TRANSPORT=shm: segment")
                && why.contains("is reached only by tcp here, which it does not list"),
            "{why}"
        );
    }
    assert_eq!(theirs, pattern(LEN, SEED_PEER), "a byte reached the peer");
    assert!(ours.iter().all(|&b| b == 0), "a byte came back");
    assert!(
        carrier.starts_with("error -1:") && carrier.contains("MC_TE_REQUIRE_TRANSPORT=shm"),
        "{carrier}"
    );
}

#[test]
fn unset_or_pinned_to_tcp_the_bytes_go_over_tcp() {
    for pins in ["", "tcp", "local,TCP"] {
        let (statuses, reasons, theirs, ours, carrier) = transfer(pins);
        assert_eq!(
            statuses,
            vec![TaskStatus::Completed; 2],
            "{pins}: {reasons:?}"
        );
        assert_eq!(theirs, pattern(LEN, SEED_OURS), "{pins}");
        assert_eq!(ours, pattern(LEN, SEED_OURS), "{pins}");
        assert_eq!(carrier, "tcp", "{pins}");
    }
}

#[test]
fn a_segment_not_open_has_no_transport() {
    let e = engine("");
    let err = e.segment_transport(4242).unwrap_err();
    assert_eq!(err.err_code(), -1);
    assert!(
        err.to_string().contains("segment id 4242 is not open"),
        "{err}"
    );
    e.shutdown();
}
