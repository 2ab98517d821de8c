//! `MC_TE_STRICT_LOCAL=1` (the engines' configuration): a request whose
//! local `source` range is not inside one registered buffer FAILS on every
//! transport, and nothing is read or written; registered sources work.

use crate::common;

use common::*;
use transfer_engine::LOCAL_SEGMENT_ID;
use transfer_engine::TaskStatus;

#[test]
fn unregistered_sources_fail_and_touch_nothing() {
    let strict = [("MC_TE_STRICT_LOCAL", "1")];
    let target = engine_with(&strict);
    let initiator = engine_with(&strict);
    let mem = Buf::new(1 << 20, 1);
    register(&target, &mem, true);
    let seg = initiator
        .open_segment(target.local_name())
        .expect("open the target");
    let local = Buf::new(1 << 20, 2);
    register(&initiator, &local, true);
    let stray = Buf::new(1 << 20, 3);
    let before = mem.snapshot();

    // Remote segment: a stray source (never registered), and one that
    // runs past the end of a registered buffer.
    for (src, what) in [
        (stray.addr(), "unregistered"),
        (local.addr() + 4096, "past the end"),
    ] {
        let st = run(&initiator, &[write_req(src, seg, mem.addr(), 1 << 20)]);
        assert_eq!(
            st,
            [TaskStatus::Failed],
            "remote WRITE from an {what} source"
        );
        let st = run(&initiator, &[read_req(src, seg, mem.addr(), 1 << 20)]);
        assert_eq!(
            st,
            [TaskStatus::Failed],
            "remote READ into an {what} source"
        );
    }
    assert!(mem.snapshot() == before, "the target changed");
    assert!(
        stray.snapshot() == pattern(1 << 20, 3),
        "the stray buffer changed"
    );

    // The engine's own segment too.
    let st = run(
        &target,
        &[write_req(stray.addr(), LOCAL_SEGMENT_ID, mem.addr(), 4096)],
    );
    assert_eq!(st, [TaskStatus::Failed], "local WRITE from a stray source");
    assert!(mem.snapshot() == before, "the local WRITE landed");

    // Registered sources work.
    let st = run(
        &initiator,
        &[write_req(local.addr(), seg, mem.addr(), 1 << 20)],
    );
    assert_eq!(st, [TaskStatus::Completed]);
    assert!(mem.snapshot() == local.snapshot());
    initiator.shutdown();
    target.shutdown();
}
