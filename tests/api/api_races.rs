//! Calls that race at the API are ordered: `installTransport` racing
//! `destroyTransferEngine` either finishes before the destroy (which then
//! stops it) or is refused, so no transport runs and nothing is published
//! after the destroy; `registerLocalMemory` racing `unregisterLocalMemory`
//! leaves the served and stored descriptor exactly what is registered.

use crate::common;

use common::{Buf, descriptor};
use serde_json::Value;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use transfer_engine::Engine;
use transfer_engine::metadata::keys::segment_key;
use transfer_engine::metadata::server::MetadataServer;
use transfer_engine::{Location, Region};

/// The tests of this file run one at a time: one counts the threads of
/// every engine in the process.
static SERIAL: Mutex<()> = Mutex::new(());

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// The value under `key` in the metadata server, if any.
fn stored(server: &MetadataServer, key: &str) -> Option<String> {
    let url = format!("{}?key={key}", server.url());
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = agent.get(&url).call().expect("GET");
    match resp.status().as_u16() {
        200 => Some(resp.body_mut().read_to_string().expect("body")),
        404 => None,
        s => panic!("GET {url}: HTTP {s}"),
    }
}

#[test]
fn install_racing_destroy_never_outlives_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).expect("server");
    let mut installed = 0;
    for round in 0..150 {
        let name = format!("race-{round}:1");
        let e = Engine::new(&server.url(), &name, false).expect("engine");
        let start = Arc::new(Barrier::new(2));
        let (e1, s1) = (e.clone(), start.clone());
        let install = thread::spawn(move || {
            s1.wait();
            e1.install_transport("tcp", None)
        });
        start.wait();
        e.shutdown();
        let result = install.join().expect("install thread");
        installed += usize::from(result.is_ok());
        // Both calls have returned; the engine object still exists.
        assert_eq!(
            threads_named("te-tcp-io"),
            0,
            "round {round}: the TCP transport runs after destroy (install gave {result:?})"
        );
        assert_eq!(
            stored(&server, &segment_key(None, &name)),
            None,
            "round {round}: the descriptor was published after destroy"
        );
        drop(e);
    }
    println!("{installed} of 150 installs finished before the destroy; the rest were refused");
    server.shutdown();
}

fn region(b: &Buf) -> Region {
    Region {
        addr: b.addr(),
        length: b.len() as u64,
        location: Location::Any,
        remote_accessible: true,
    }
}

fn lists(desc: &Value, addr: u64) -> bool {
    desc["buffers"]
        .as_array()
        .expect("buffers")
        .iter()
        .any(|b| b["addr"].as_u64() == Some(addr))
}

#[test]
fn register_racing_unregister_keeps_the_descriptor_true() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let server = MetadataServer::start("127.0.0.1:0", "/metadata", None).expect("server");
    let e = Engine::new(&server.url(), "race-reg:1", false).expect("engine");
    e.install_transport("tcp", None).expect("install tcp");
    let key = segment_key(None, "race-reg:1");
    // Buffers that stay registered make every descriptor longer to build.
    let ballast: Vec<Buf> = (0..200).map(|_| Buf::zeroed(64)).collect();
    let regions: Vec<Region> = ballast.iter().map(region).collect();
    e.register(&regions).expect("register ballast");
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (e, server, key) = (e.clone(), server.url(), key.clone());
            thread::spawn(move || {
                let mine = Buf::zeroed(4096);
                let get = |k: &str| -> Value {
                    let mut r = ureq::get(&format!("{server}?key={k}")).call().expect("GET");
                    serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
                };
                for i in 0..100 {
                    e.register(&[region(&mine)]).expect("register");
                    assert!(
                        lists(&descriptor(&e), mine.addr()) && lists(&get(&key), mine.addr()),
                        "iteration {i}: a buffer registered is missing from the descriptor"
                    );
                    e.unregister(&[mine.addr()]).expect("unregister");
                    assert!(
                        !lists(&descriptor(&e), mine.addr()) && !lists(&get(&key), mine.addr()),
                        "iteration {i}: a buffer unregistered is still in the descriptor"
                    );
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let served = descriptor(&e);
    assert_eq!(served["buffers"].as_array().unwrap().len(), ballast.len());
    assert_eq!(
        stored(&server, &key)
            .map(|s| serde_json::from_str::<Value>(&s).unwrap()["buffers"].clone()),
        Some(served["buffers"].clone())
    );
    e.shutdown();
    server.shutdown();
}
