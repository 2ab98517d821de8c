//! A pool of 2 endpoints per device (`MC_MAX_EP_PER_CTX=2`) serving one
//! initiator and 4 targets over RDMA in one process: the initiator's two
//! devices see 8 peer devices, so endpoints are evicted while slices are in
//! flight on them; an evicted endpoint finishes its slices before it
//! closes. Every byte is verified. One test per file: the configuration is
//! read once per process. Run inside the soft-RoCE VM (scripts/rdma-vm/).

use crate::common;
use crate::rdma_support as rdma;

use common::{Buf, pattern, read_req, register, run_within, write_req};
use rdma::{A, B};
use std::time::Duration;
use transfer_engine::Request;
use transfer_engine::TaskStatus;

const MIB: usize = 1 << 20;

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn pool_of_two_serves_four_peers_with_eviction_in_flight() {
    rdma::setup(&[
        ("MC_MAX_EP_PER_CTX", "2"),
        ("MC_RDMA_COMPLETION_TIMEOUT", "5"),
    ]);
    let a = rdma::engine(&[A[0].0, A[1].0]);
    let local = Buf::zeroed(32 * MIB);
    register(&a, &local, true);
    let targets: Vec<_> = (0..4)
        .map(|_| {
            let e = rdma::engine(&[B[0].0, B[1].0]);
            let buf = Buf::zeroed(4 * MIB);
            register(&e, &buf, true);
            (e, buf)
        })
        .collect();
    let segs: Vec<i32> = targets
        .iter()
        .map(|(e, _)| a.open_segment(e.local_name()).expect("open"))
        .collect();
    std::thread::scope(|s| {
        for (t, ((_, remote), seg)) in targets.iter().zip(&segs).enumerate() {
            let (a, local) = (&a, &local);
            s.spawn(move || {
                for round in 0..4u8 {
                    let len = 2 * MIB + 1;
                    let off = 1 + t * 8 * MIB;
                    let data = pattern(len, round * 8 + t as u8);
                    local.set(off, &data);
                    // Slices of one request spread over the rails: several
                    // endpoints of this target at once, evicting others.
                    let w = write_req(
                        local.addr() + off as u64,
                        *seg,
                        remote.addr() + 3,
                        len as u64,
                    );
                    let st = run_within(a, &[w], Duration::from_secs(120));
                    assert_eq!(st, vec![TaskStatus::Completed], "target {t} round {round}");
                    assert_eq!(remote.get(3, len), data, "target {t} round {round}");
                    let back = off + 4 * MIB;
                    let reqs: Vec<Request> = (0..2)
                        .map(|k| {
                            let h = (len / 2) as u64;
                            read_req(
                                local.addr() + (back as u64) + k * h,
                                *seg,
                                remote.addr() + 3 + k * h,
                                h + k,
                            )
                        })
                        .collect();
                    let st = run_within(a, &reqs, Duration::from_secs(120));
                    assert!(st.iter().all(|s| *s == TaskStatus::Completed), "{st:?}");
                    assert_eq!(
                        local.get(back, len),
                        data,
                        "read back, target {t} round {round}"
                    );
                }
            });
        }
    });
    a.shutdown();
    for (e, _) in targets {
        e.shutdown();
    }
}
