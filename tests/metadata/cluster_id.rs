//! `MC_METADATA_CLUSTER_ID` keeps two clusters apart on one store. This
//! process is cluster `c1`; a child process (this same test binary, run
//! with `MC_METADATA_CLUSTER_ID=c2`) is cluster `c2`, and both clusters
//! have an engine named `node-b:1`:
//!
//! - keys land under `mooncake/c1/...` and `mooncake/c2/...` (read with a
//!   raw client), never under the bare `mooncake/...`;
//! - `c1` cannot open `only-c2:1`, which exists only in `c2`, and `c2`
//!   cannot open `c1`'s `node-a:1`;
//! - `node-b:1` opened in `c1` is `c1`'s: a WRITE lands in its buffer and
//!   the child's same-named engine's buffer is unchanged;
//! - shutting down one cluster's engines leaves the other's keys alone.

use crate::cluster_common;
use crate::common;

use cluster_common::{Store, buffers, engine, init_env, write_read};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

const CHILD_VAR: &str = "TE_CLUSTER_CHILD_CONN";
const CHILD_LEN: usize = 1 << 20;
const CHILD_FILL: u8 = 0x5A;

/// The `c2` side, run in the child: two engines with 0x5A buffers; waits
/// for stdin to close, then reports whether its buffers are untouched.
fn child(conn: &str) {
    let b = engine(conn, "node-b:1");
    let only = engine(conn, "only-c2:1");
    let xb = common::Buf::new(CHILD_LEN, 0);
    xb.set(0, &[CHILD_FILL; CHILD_LEN]);
    let xo = common::Buf::new(CHILD_LEN, 0);
    xo.set(0, &[CHILD_FILL; CHILD_LEN]);
    common::register(&b, &xb, true);
    common::register(&only, &xo, true);
    match b.open_segment("node-a:1") {
        Ok(id) => println!("CHILD OPENED node-a:1 as {id}"),
        Err(e) => println!("CHILD CANNOT OPEN node-a:1: {e}"),
    }
    println!("CHILD READY {} {}", xb.addr(), xo.addr());
    let mut rest = String::new();
    let _ = std::io::stdin().read_line(&mut rest);
    let fill = vec![CHILD_FILL; CHILD_LEN];
    let unchanged = xb.snapshot() == fill && xo.snapshot() == fill;
    println!("CHILD {}", if unchanged { "UNCHANGED" } else { "CHANGED" });
    b.shutdown();
    only.shutdown();
    println!("CHILD DONE");
}

/// The child process, killed on drop.
struct ChildProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl ChildProc {
    fn spawn(test: &str, conn: &str) -> ChildProc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                &common::test_path(module_path!(), test),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_VAR, conn)
            .env("MC_METADATA_CLUSTER_ID", "c2")
            .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the c2 child");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            // libtest may print "test NAME ... " before the first line.
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(at) = line.find("CHILD ") {
                    if tx.send(line[at..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        let stdin = child.stdin.take();
        ChildProc {
            child,
            stdin,
            lines,
        }
    }

    fn line(&self, prefix: &str) -> String {
        loop {
            let l = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("the child printed no {prefix:?} line: {e}"));
            if l.starts_with(prefix) {
                return l;
            }
            println!("child: {l}");
        }
    }

    fn finish(&mut self) {
        if let Some(mut s) = self.stdin.take() {
            let _ = s.write_all(b"go\n");
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn two_clusters(test: &str, store: Option<Store>) {
    let Some(store) = store else { return };
    let conn = store.conn();
    let a = engine(&conn, "node-a:1");
    let b = engine(&conn, "node-b:1");
    let (src, dst, back) = buffers(&a, &b, 1 << 20);

    let mut kid = ChildProc::spawn(test, &conn);
    let open_line = kid.line("CHILD ");
    println!("{open_line}");
    assert!(
        open_line.starts_with("CHILD CANNOT OPEN node-a:1"),
        "c2 opened c1's node-a:1: {open_line}"
    );
    let ready = kid.line("CHILD READY");
    println!("{ready}");

    for name in ["node-a:1", "node-b:1"] {
        for kind in ["rpc_meta", "ram"] {
            let key = format!("mooncake/c1/{kind}/{name}");
            assert!(store.has(&key), "{key} is not in the store");
            let bare = format!("mooncake/{kind}/{name}");
            assert!(
                !store.has(&bare),
                "{bare} is in the store: the cluster id was ignored"
            );
        }
    }
    assert!(store.has("mooncake/c2/ram/only-c2:1"));
    assert!(store.has("mooncake/c2/rpc_meta/only-c2:1"));
    assert!(!store.has("mooncake/c1/ram/only-c2:1"));
    let c1_b = store.get("mooncake/c1/ram/node-b:1").unwrap();
    let c2_b = store.get("mooncake/c2/ram/node-b:1").unwrap();
    assert_ne!(
        c1_b["buffers"], c2_b["buffers"],
        "the clusters share node-b:1"
    );

    assert!(
        a.open_segment("only-c2:1").is_err(),
        "c1 opened a segment that exists only in c2"
    );
    let seg = a
        .open_segment("node-b:1")
        .expect("c1 opens its own node-b:1");
    write_read(&a, seg, (&src, &dst, &back), 11, 500_000, 9);

    // c1 leaves: its keys go, c2's stay.
    a.shutdown();
    b.shutdown();
    assert!(!store.has("mooncake/c1/ram/node-b:1"));
    assert!(!store.has("mooncake/c1/rpc_meta/node-a:1"));
    assert!(
        store.has("mooncake/c2/ram/node-b:1"),
        "c1's shutdown removed c2's key"
    );
    kid.finish();
    let verdict = kid.line("CHILD ");
    assert_eq!(
        verdict, "CHILD UNCHANGED",
        "c1's WRITE touched c2's node-b:1"
    );
    kid.line("CHILD DONE");
    let status = kid.child.wait().unwrap();
    assert!(status.success(), "the c2 child exited with {status}");
    assert!(!store.has("mooncake/c2/ram/node-b:1"));
    assert!(!store.has("mooncake/c2/rpc_meta/only-c2:1"));
}

#[test]
fn two_clusters_share_one_etcd() {
    if let Ok(conn) = std::env::var(CHILD_VAR) {
        return child(&conn);
    }
    init_env(&[("MC_METADATA_CLUSTER_ID", "c1")]);
    two_clusters("two_clusters_share_one_etcd", Store::etcd());
}

#[test]
fn two_clusters_share_one_redis() {
    if let Ok(conn) = std::env::var(CHILD_VAR) {
        return child(&conn);
    }
    init_env(&[("MC_METADATA_CLUSTER_ID", "c1")]);
    two_clusters("two_clusters_share_one_redis", Store::redis());
}
