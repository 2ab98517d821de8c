//! Peer authentication over RDMA (soft-RoCE in the VM of
//! `scripts/rdma-vm/`): engines with the same cluster key set up queue
//! pairs through the authenticated handshake and move verified bytes both
//! ways, over RDMA (the devices' counters move); an engine with another
//! key gets no queue pair and its transfers fail within the deadline, no
//! byte written. Run with `--ignored --test-threads 1` inside the VM.

use crate::common;
use crate::rdma_support as rdma;

use common::{Buf, pattern, read_req, register, run_within, write_req};
use rdma::{A, B};
use std::sync::Arc;
use std::time::Duration;
use transfer_engine::{Engine, TaskStatus};

const MIB: usize = 1 << 20;
const T: Duration = Duration::from_secs(60);

/// A file holding a key of 32 bytes (hex), readable by us only.
fn key_file(name: &str, byte: u8) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("te-rdma-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, format!("{byte:02x}").repeat(32)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// An engine with RDMA on `devs` and the cluster key in `key`.
fn engine(devs: &[&str], key: &std::path::Path) -> Arc<Engine> {
    let config = rdma::config().with_auth_key_file(key.to_str().unwrap());
    let e = Engine::builder("P2PHANDSHAKE", "127.0.0.1")
        .config(config)
        .build()
        .expect("engine");
    e.install_transport("rdma", Some(&rdma::matrix(devs)))
        .expect("rdma");
    e
}

#[test]
#[ignore = "needs RDMA devices: scripts/rdma-vm/test.sh runs it in a soft-RoCE VM"]
fn engines_with_the_cluster_key_move_bytes_over_rdma_and_others_get_no_queue_pair() {
    rdma::setup(&[("MC_RDMA_COMPLETION_TIMEOUT", "3")]);
    let key = key_file("cluster.key", 0x11);
    let other = key_file("other.key", 0x22);
    let a = engine(&[A[0].0], &key);
    let b = engine(&[B[0].0], &key);
    let local = Buf::zeroed(8 * MIB);
    let remote = Buf::zeroed(8 * MIB);
    register(&a, &local, true);
    register(&b, &remote, true);
    let seg = a.open_segment(b.local_name()).expect("open with the key");
    let sent = rdma::sent(A[0].0);
    let data = pattern(8 * MIB, 5);
    local.set(0, &data);
    let w = write_req(local.addr(), seg, remote.addr(), (8 * MIB) as u64);
    assert_eq!(run_within(&a, &[w], T), vec![TaskStatus::Completed]);
    assert_eq!(remote.get(0, 8 * MIB), data, "every byte written");
    local.set(0, &vec![0u8; 8 * MIB]);
    let r = read_req(local.addr(), seg, remote.addr(), (8 * MIB) as u64);
    assert_eq!(run_within(&a, &[r], T), vec![TaskStatus::Completed]);
    assert_eq!(local.get(0, 8 * MIB), data, "every byte read back");
    assert!(
        rdma::sent(A[0].0) > sent,
        "the bytes went over the RDMA device"
    );
    // Another key: refused at the handshake, no queue pair, nothing moves.
    let stranger = engine(&[A[1].0], &other);
    let before = remote.get(0, 8 * MIB);
    assert!(
        stranger.open_segment(b.local_name()).is_err(),
        "another key opens nothing"
    );
    assert_eq!(remote.get(0, 8 * MIB), before);
    for e in [stranger, a, b] {
        e.shutdown();
    }
    let _ = std::fs::remove_dir_all(key.parent().unwrap());
}
