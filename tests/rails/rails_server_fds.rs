//! A TCP data server releases the descriptors of the sessions its peers
//! closed, without waiting for another peer to connect.

use crate::rails_support as support;

use std::time::Duration;
use support::{Buf, engine, open_sockets, pattern, register, run};
use transfer_engine::TaskStatus;
use transfer_engine::{Opcode, Request};

#[test]
fn closed_sessions_release_their_descriptors() {
    let target = engine();
    let remote = Buf::new(8 << 20, 5);
    register(&target, &remote);
    std::thread::sleep(Duration::from_millis(500));
    let baseline = open_sockets();
    let initiator = engine();
    let local = Buf::new(8 << 20, 6);
    register(&initiator, &local);
    let seg = initiator.open_segment(target.local_name()).expect("open");
    // Enough slices to open every lane of the endpoint.
    let st = run(
        &initiator,
        &[Request {
            opcode: Opcode::Write,
            source: local.addr(),
            target_id: seg,
            target_offset: remote.addr(),
            length: 8 << 20,
        }],
    );
    assert_eq!(st, [TaskStatus::Completed]);
    assert!(remote.get(0, 8 << 20) == pattern(8 << 20, 6));
    let busy = open_sockets();
    initiator.shutdown();
    drop(initiator);
    // The server notices a closed session within its poll interval.
    std::thread::sleep(Duration::from_millis(2500));
    let after = open_sockets();
    // Diagnosis: a new session (one 1-byte WRITE from a second initiator,
    // one lane) makes the server reap the ended ones; one is left over.
    let second = engine();
    let small = Buf::new(4096, 7);
    register(&second, &small);
    let seg2 = second.open_segment(target.local_name()).expect("open");
    let st = run(
        &second,
        &[Request {
            opcode: Opcode::Write,
            source: small.addr(),
            target_id: seg2,
            target_offset: remote.addr(),
            length: 1,
        }],
    );
    assert_eq!(st, [TaskStatus::Completed]);
    second.shutdown();
    drop(second);
    std::thread::sleep(Duration::from_millis(2500));
    let poked = open_sockets();
    eprintln!(
        "sockets: {baseline} with the target alone, {busy} during, {after} after; \
         {poked} once another connection reached the target's data server"
    );
    assert!(
        after <= baseline,
        "{after} sockets open after the initiator closed its connections and shut down \
         ({baseline} before it existed): the target holds its ended sessions"
    );
    target.shutdown();
}
