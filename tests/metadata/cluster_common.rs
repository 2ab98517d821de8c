//! Helpers of the `cluster_*` tests: engines on a real etcd or redis (the
//! servers of `common::servers`), raw reads of the store, byte-verified
//! transfers, and the scenarios several files run (a peer that restarts
//! with new buffers, the store restarted between transfers).
//!
//! Each `cluster_*` file is one test binary: [`init_env`] names the `MC_*`
//! settings of the engines its tests make ([`engine`], [`config`]), given
//! to them in their `Config`.

#![allow(dead_code)]

use crate::common::servers::{Etcd, Redis};
use crate::common::{Buf, config_with, read_req, register, run, wait_for, write_req};
use once_cell::sync::OnceCell;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transfer_engine::TaskStatus;
use transfer_engine::{Config, Engine};

/// The settings [`init_env`] recorded.
static SETTINGS: OnceCell<Vec<(String, String)>> = OnceCell::new();

/// Sets the configuration of the engines this process makes with
/// [`engine`] and [`config`]: `MC_TCP_BIND_ADDRESS=127.0.0.1` (store mode
/// advertises loopback, nothing uses other interfaces' addresses for the
/// handshake) and `extra`, over the process environment. Every test of a
/// binary must pass the same `extra`.
pub fn init_env(extra: &[(&str, &str)]) {
    let want: Vec<(String, String)> = [("MC_TCP_BIND_ADDRESS", "127.0.0.1")]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let set = SETTINGS.get_or_init(|| want.clone());
    assert_eq!(
        *set, want,
        "the tests of one binary pass init_env different settings"
    );
}

/// The configuration of this process's engines: the settings of
/// [`init_env`] over the process environment; the environment alone
/// before `init_env` (a child process given its settings in its
/// environment).
pub fn config() -> Config {
    let set = SETTINGS.get().map(Vec::as_slice).unwrap_or_default();
    let settings: Vec<(&str, &str)> = set.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    config_with(&settings)
}

/// An engine named `name` (kept verbatim in store mode) with TCP
/// installed, configured by [`config`].
pub fn engine(conn: &str, name: &str) -> Arc<Engine> {
    let e = Engine::builder(conn, name)
        .config(config())
        .build()
        .unwrap_or_else(|err| panic!("the engine {name:?} through {conn:?}: {err}"));
    e.install_transport("tcp", None).expect("install tcp");
    e
}

/// A private store server, and raw access to it as another client.
pub enum Store {
    Etcd(Etcd),
    Redis(Redis),
}

impl Store {
    /// An etcd, or `None` (skip) when not installed.
    pub fn etcd() -> Option<Store> {
        Etcd::start().map(Store::Etcd)
    }

    /// A redis without password, or `None` (skip) when not installed.
    pub fn redis() -> Option<Store> {
        Redis::start().map(Store::Redis)
    }

    /// The engine connection string.
    pub fn conn(&self) -> String {
        match self {
            Store::Etcd(e) => e.conn_string(),
            Store::Redis(r) => r.conn_string(),
        }
    }

    /// The raw value under `key`, parsed as JSON.
    pub fn get(&self, key: &str) -> Option<Value> {
        let raw: Option<Vec<u8>> = match self {
            Store::Etcd(e) => e.get_raw(key),
            Store::Redis(r) => redis::cmd("GET")
                .arg(key)
                .query(&mut r.client(0))
                .expect("redis GET"),
        };
        raw.map(|b| serde_json::from_slice(&b).expect("the stored value is JSON"))
    }

    /// Whether `key` is in the store.
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Restarts the server: etcd on the same data directory (data kept),
    /// redis without persistence (data lost).
    pub fn restart(&mut self) {
        match self {
            Store::Etcd(e) => e.restart(),
            Store::Redis(r) => r.restart(),
        }
    }

    /// Stops the server (it can be restarted).
    pub fn stop(&mut self) {
        match self {
            Store::Etcd(e) => e.stop(),
            Store::Redis(r) => r.stop(),
        }
    }

    /// The server's port, as it appears in error messages.
    pub fn port(&self) -> u16 {
        match self {
            Store::Etcd(e) => e
                .endpoint()
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse().ok())
                .expect("etcd port"),
            Store::Redis(r) => r.port(),
        }
    }
}

/// Status of one request run alone (60 s bound).
pub fn one(e: &Engine, r: transfer_engine::Request) -> TaskStatus {
    run(e, &[r])[0]
}

/// WRITEs `len` bytes of pattern `seed` from `src` (registered with
/// `initiator`, at least `off + len` long) to `dst` (registered with the
/// peer behind segment `seg`) at `off`, checks the bytes in `dst`, READs
/// them back into `back` at `off` and checks them: byte-verified both ways.
pub fn write_read(
    initiator: &Engine,
    seg: i32,
    (src, dst, back): (&Buf, &Buf, &Buf),
    off: usize,
    len: usize,
    seed: u8,
) {
    let data = crate::common::pattern(len, seed);
    src.set(off, &data);
    back.set(off, &vec![0u8; len]);
    let w = write_req(
        src.addr() + off as u64,
        seg,
        dst.addr() + off as u64,
        len as u64,
    );
    assert_eq!(
        one(initiator, w),
        TaskStatus::Completed,
        "WRITE {len} B at +{off}"
    );
    assert!(
        dst.get(off, len) == data,
        "WRITE {len} B at +{off}: wrong bytes in the peer"
    );
    let r = read_req(
        back.addr() + off as u64,
        seg,
        dst.addr() + off as u64,
        len as u64,
    );
    assert_eq!(
        one(initiator, r),
        TaskStatus::Completed,
        "READ {len} B at +{off}"
    );
    assert!(
        back.get(off, len) == data,
        "READ {len} B at +{off}: wrong bytes read back"
    );
}

/// Several sizes (1 B to 1 MiB + 13, odd offsets) each way.
pub fn write_read_sizes(initiator: &Engine, seg: i32, src: &Buf, dst: &Buf, back: &Buf, seed: u8) {
    let mut off = 3usize;
    for (i, len) in [1usize, 4095, 65536, 65537, (1 << 20) + 13]
        .into_iter()
        .enumerate()
    {
        assert!(off + len <= dst.len() && off + len <= src.len() && off + len <= back.len());
        let bufs = (src, dst, back);
        write_read(initiator, seg, bufs, off, len, seed.wrapping_add(i as u8));
        off += len + 5;
    }
}

/// Three buffers of `len` bytes: an initiator's source and read-back
/// buffers (registered with it) and a target buffer registered with
/// `target` (remote-accessible).
pub fn buffers(initiator: &Engine, target: &Engine, len: usize) -> (Buf, Buf, Buf) {
    let src = Buf::zeroed(len);
    let back = Buf::zeroed(len);
    let dst = Buf::zeroed(len);
    register(initiator, &src, true);
    register(initiator, &back, true);
    register(target, &dst, true);
    (src, dst, back)
}

/// Polls `cond` every 100 ms until it holds or `within` passes; returns
/// whether it held and how long it took.
pub fn poll(within: Duration, mut cond: impl FnMut() -> bool) -> (bool, Duration) {
    let start = Instant::now();
    loop {
        if cond() {
            return (true, start.elapsed());
        }
        if start.elapsed() > within {
            return (false, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Two engines through `conn` move byte-verified data both ways, and a
/// request outside the peer's buffers fails.
pub fn two_engines(conn: &str, names: [&str; 2]) {
    let a = engine(conn, names[0]);
    let b = engine(conn, names[1]);
    let (src, dst, back) = buffers(&a, &b, 4 << 20);
    let seg = a.open_segment(names[1]).expect("open the peer by name");
    assert!(seg > 0);
    write_read_sizes(&a, seg, &src, &dst, &back, 11);
    // And the other way round, by name too.
    let (src2, dst2, back2) = buffers(&b, &a, 1 << 20);
    let seg_a = b
        .open_segment(names[0])
        .expect("open the first engine by name");
    write_read(&b, seg_a, (&src2, &dst2, &back2), 7, 300_001, 99);
    let before = dst.snapshot();
    let bad = write_req(src.addr(), seg, dst.addr() + dst.len() as u64 - 10, 20);
    assert_eq!(
        one(&a, bad),
        TaskStatus::Failed,
        "a WRITE past the peer's buffer"
    );
    assert!(
        dst.snapshot() == before,
        "a failed WRITE changed the peer's buffer"
    );
    a.shutdown();
    b.shutdown();
}

/// How engine A learns about B' (B restarted with the same name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pickup {
    /// A calls `sync_all_segments()`.
    Sync,
    /// A's next submit after a failed connection to the dead B.
    AfterFailure,
    /// The keeper's refresh (`MC_TE_METADATA_REFRESH_INTERVAL_SECONDS`).
    Refresh,
    /// Nothing: with `MC_DISABLE_METACACHE` every submit refetches.
    NoCache,
    /// Like `AfterFailure`, but the transfer that fails (to the dead B's
    /// cached address) runs after B' is up.
    FailureAfterRestart,
}

/// B (`node-b:1`) registers X; A opens it and transfers. B shuts down; B'
/// with the same name registers Y while X stays allocated, filled with a
/// sentinel. A picks up B' (`how`), then a WRITE to Y lands in Y and
/// WRITEs and READs aimed at X fail, with X never touched.
pub fn peer_restart(conn: &str, how: Pickup) {
    const LEN: usize = 1 << 20;
    const SENTINEL: u8 = 0xEE;
    let a = engine(conn, "node-a:1");
    let src = Buf::zeroed(LEN);
    let back = Buf::zeroed(LEN);
    register(&a, &src, true);
    register(&a, &back, true);

    let b = engine(conn, "node-b:1");
    let x = Buf::zeroed(LEN);
    register(&b, &x, true);
    let seg = a.open_segment("node-b:1").expect("open node-b:1");
    write_read(&a, seg, (&src, &x, &back), 17, 70_001, 1);

    b.shutdown();
    drop(b);
    x.set(0, &[SENTINEL; LEN]);
    let sentinel = vec![SENTINEL; LEN];

    if how == Pickup::AfterFailure {
        // B is dead: A's transfer with its cached descriptor fails.
        let w = write_req(src.addr(), seg, x.addr() + 17, 4096);
        assert_eq!(
            one(&a, w),
            TaskStatus::Failed,
            "a WRITE to the dead B completed"
        );
        assert!(x.snapshot() == sentinel, "X was touched after B died");
    }

    let b2 = engine(conn, "node-b:1");
    let y = Buf::zeroed(LEN);
    register(&b2, &y, true);
    assert_ne!(x.addr(), y.addr());

    if how == Pickup::FailureAfterRestart {
        let w = write_req(src.addr(), seg, x.addr() + 17, 4096);
        assert_eq!(
            one(&a, w),
            TaskStatus::Failed,
            "a WRITE with the dead B's descriptor completed"
        );
        assert!(x.snapshot() == sentinel, "X was touched after B died");
    }

    let data = crate::common::pattern(8192 + 3, 42);
    src.set(0, &data);
    let to_y = write_req(src.addr(), seg, y.addr() + 5, data.len() as u64);
    match how {
        Pickup::Sync => {
            a.sync_all_segments();
            assert_eq!(
                one(&a, to_y),
                TaskStatus::Completed,
                "WRITE to B''s buffer after sync_all_segments"
            );
        }
        Pickup::AfterFailure | Pickup::FailureAfterRestart | Pickup::NoCache => {
            assert_eq!(
                one(&a, to_y),
                TaskStatus::Completed,
                "the first submit after the failed connection did not use B''s descriptor"
            );
        }
        Pickup::Refresh => {
            // No sync, no failed connection: a WRITE to Y fails before any
            // connection until the background refresh brings B''s
            // descriptor.
            let (ok, took) = poll(Duration::from_secs(10), || {
                one(&a, to_y) == TaskStatus::Completed
            });
            assert!(ok, "the refresh did not pick up B' within {took:?}");
            println!("the background refresh picked up B' after {took:?}");
        }
    }
    assert!(y.get(5, data.len()) == data, "the WRITE did not land in Y");
    assert!(x.snapshot() == sentinel, "X was touched");
    assert_eq!(
        a.open_segment("node-b:1").expect("reopen"),
        seg,
        "a name keeps its segment id"
    );
    // Round trips to Y keep working; X's old addresses are refused.
    write_read(&a, seg, (&src, &y, &back), 100_003, 200_000, 5);
    let to_x = write_req(src.addr(), seg, x.addr() + 17, 4096);
    assert_eq!(
        one(&a, to_x),
        TaskStatus::Failed,
        "a WRITE to X's old addresses"
    );
    let from_x = read_req(back.addr(), seg, x.addr() + 17, 4096);
    assert_eq!(
        one(&a, from_x),
        TaskStatus::Failed,
        "a READ of X's old addresses"
    );
    assert!(x.snapshot() == sentinel, "X was touched");
    a.shutdown();
    b2.shutdown();
}

/// Waits until `key` is in `store` (at most `within`); panics otherwise.
pub fn wait_key(store: &Store, key: &str, within: Duration) -> Duration {
    let (ok, took) = poll(within, || store.has(key));
    assert!(ok, "{key} not in the store within {within:?}");
    took
}

/// Waits until a generic condition holds (re-export for the tests).
pub fn wait(what: &str, within: Duration, cond: impl FnMut() -> bool) {
    wait_for(what, within, cond)
}

/// `send_notify` both ways and `submit_with_notify`, names resolved
/// through the store.
pub fn notifications(conn: &str) {
    let a = engine(conn, "nt-a:1");
    let b = engine(conn, "nt-b:1");
    let (src, dst, _back) = buffers(&a, &b, 65536);
    let seg = a.open_segment("nt-b:1").unwrap();
    a.send_notify(seg as u64, "from-a", "hello b").unwrap();
    let mut got = Vec::new();
    crate::common::wait_for(
        "b receives the notification",
        Duration::from_secs(10),
        || {
            got.extend(b.take_notifies());
            !got.is_empty()
        },
    );
    assert_eq!(got, vec![("from-a".to_string(), "hello b".to_string())]);

    let seg_a = b.open_segment("nt-a:1").unwrap();
    b.send_notify(seg_a as u64, "from-b", "hello a").unwrap();
    let mut got = Vec::new();
    crate::common::wait_for(
        "a receives the notification",
        Duration::from_secs(10),
        || {
            got.extend(a.take_notifies());
            !got.is_empty()
        },
    );
    assert_eq!(got, vec![("from-b".to_string(), "hello a".to_string())]);

    src.set(0, &crate::common::pattern(1000, 3));
    let batch = a.allocate_batch(1).unwrap();
    a.submit_with_notify(
        batch,
        &[crate::common::write_req(src.addr(), seg, dst.addr(), 1000)],
        "done".into(),
        "batch complete".into(),
    )
    .unwrap();
    assert_eq!(
        crate::common::wait_task(&a, batch, 0, Duration::from_secs(30)),
        TaskStatus::Completed
    );
    a.free_batch(batch).unwrap();
    let mut got = Vec::new();
    crate::common::wait_for("the batch notification", Duration::from_secs(10), || {
        got.extend(b.take_notifies());
        !got.is_empty()
    });
    assert_eq!(
        got,
        vec![("done".to_string(), "batch complete".to_string())]
    );
    assert!(dst.get(0, 1000) == crate::common::pattern(1000, 3));
    // A notification to a segment that is not open is an error.
    assert!(a.send_notify(9999, "x", "y").is_err());
    a.shutdown();
    b.shutdown();
}
