//! `Engine::nic_loads()` (the data of `getNicLoadStats`): a large transfer
//! in flight shows in-flight bytes on a device, none remain once it is
//! done, and the device's bandwidth average is positive after the traffic.

use crate::rails_support as support;

use std::time::{Duration, Instant};
use support::{Buf, HANG, engine, pattern, register};
use transfer_engine::TaskStatus;
use transfer_engine::{Opcode, Request};

#[test]
fn nic_loads_track_inflight_bytes_and_bandwidth() {
    const SIZE: usize = 64 << 20;
    let target = engine();
    let initiator = engine();
    let remote = Buf::new(SIZE, 3);
    let local = Buf::new(SIZE, 4);
    register(&target, &remote);
    register(&initiator, &local);
    let seg = initiator.open_segment(target.local_name()).expect("open");
    let before = initiator.nic_loads();
    assert!(!before.is_empty(), "no device reported");
    assert!(
        before.iter().all(|d| d.inflight_bytes == 0),
        "bytes in flight before any transfer: {before:?}"
    );

    let b = initiator.allocate_batch(1).unwrap();
    let req = Request {
        opcode: Opcode::Write,
        source: local.addr(),
        target_id: seg,
        target_offset: remote.addr(),
        length: SIZE as u64,
    };
    initiator.submit(b, &[req]).unwrap();
    let deadline = Instant::now() + HANG;
    let mut max_inflight = 0u64;
    let mut samples = 0u32;
    loop {
        let loads = initiator.nic_loads();
        let inflight: u64 = loads.iter().map(|d| d.inflight_bytes).sum();
        assert!(
            inflight <= SIZE as u64,
            "more in flight than submitted: {loads:?}"
        );
        max_inflight = max_inflight.max(inflight);
        samples += 1;
        let (s, _) = initiator.status(b, 0).unwrap();
        if s != TaskStatus::Waiting {
            assert_eq!(s, TaskStatus::Completed);
            break;
        }
        assert!(Instant::now() < deadline, "the transfer hangs");
    }
    initiator.free_batch(b).unwrap();
    assert!(
        max_inflight > 0,
        "no in-flight bytes seen in {samples} samples during a {SIZE}-byte transfer"
    );
    assert!(
        remote.get(0, SIZE) == pattern(SIZE, 4),
        "wrong bytes at the target"
    );

    let after = initiator.nic_loads();
    assert!(
        after.iter().all(|d| d.inflight_bytes == 0),
        "bytes still in flight after the task completed: {after:?}"
    );
    // The average folds intervals of at least 100 ms.
    std::thread::sleep(Duration::from_millis(150));
    let loads = initiator.nic_loads();
    assert!(
        loads.iter().any(|d| d.ewma_bandwidth_bps > 0.0),
        "no bandwidth average after {SIZE} bytes: {loads:?}"
    );
    eprintln!("max in flight {max_inflight} bytes over {samples} samples; after: {loads:?}");
    initiator.shutdown();
    target.shutdown();
}
