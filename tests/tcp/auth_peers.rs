//! Peer authentication (`MC_TE_AUTH_KEY_FILE`) driven as peers and
//! attackers drive it: engines with the same key, different keys and
//! rotated keys; raw sockets that send no proof, a wrong proof, a replayed
//! proof, or reflect a proof back to its sender. The frames and the proofs
//! are built here by hand (`[u64 LE length][u8 type][body]`, HMAC-SHA256
//! over "mooncake-te-auth-v1" ‖ port ‖ direction ‖ len(name) ‖ name ‖
//! client nonce ‖ server nonce), not with the library's code.

use crate::common;

use common::*;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use transfer_engine::metadata::server::MetadataServer;
use transfer_engine::{Config, Engine, TaskStatus};

const HELLO: u8 = 0xA1;
const CHALLENGE: u8 = 0xA2;
const PROOF: u8 = 0xA3;
const ACCEPT: u8 = 0xA4;
const REFUSED: u8 = 0xAF;
const DOMAIN: &[u8] = b"mooncake-te-auth-v1";
/// The refusal reasons on the wire.
const NO_AUTHENTICATION: u8 = 1;
const WRONG_KEY: u8 = 2;
const WRONG_NAME: u8 = 3;

/// A key file in the temporary directory (hex, as `openssl rand -hex 32`).
struct KeyFile(PathBuf);

impl KeyFile {
    fn new(seed: u8) -> KeyFile {
        let p = std::env::temp_dir().join(format!("te-auth-test-{}-{seed}", std::process::id()));
        let hex: String = key(seed).iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(&p, format!("{hex}\n")).expect("write key file");
        KeyFile(p)
    }

    fn path(&self) -> String {
        self.0.to_str().expect("utf-8").to_string()
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The secret of key `seed`.
fn key(seed: u8) -> Vec<u8> {
    (0..32u8).map(|i| i.wrapping_mul(31) ^ seed).collect()
}

/// A P2P engine on 127.0.0.1 with TCP, whose `MC_TE_AUTH_KEY_FILE` is
/// `files` (none: no key).
fn keyed(files: Option<&str>) -> Arc<Engine> {
    keyed_in("P2PHANDSHAKE", "127.0.0.1:0", files)
}

/// [`keyed`] named `name` whose peers are found through `conn` (a store
/// advertises the loopback address).
fn keyed_in(conn: &str, name: &str, files: Option<&str>) -> Arc<Engine> {
    build(conn, name, files, None)
}

/// [`keyed_in`] in Mooncake's style: `MC_LEGACY_RPC_PORT_BINDING=1` (the
/// handshake listener binds the port of the engine's name) and
/// `MC_HANDSHAKE_PORT=port` (the port of a name without one).
fn legacy_in(conn: &str, name: &str, files: Option<&str>, port: u16) -> Arc<Engine> {
    build(conn, name, files, Some(port))
}

fn build(conn: &str, name: &str, files: Option<&str>, legacy_port: Option<u16>) -> Arc<Engine> {
    let e = Engine::builder(conn, name)
        .config(key_config(files, legacy_port))
        .build()
        .expect("engine");
    e.install_transport("tcp", None).expect("install tcp");
    e
}

/// The configuration of [`build`]: `MC_TE_AUTH_KEY_FILE` is `files`, and
/// with `legacy_port` Mooncake's port binding.
fn key_config(files: Option<&str>, legacy_port: Option<u16>) -> Config {
    let files = files.map(str::to_string);
    Config::from_lookup(move |k| match k {
        "MC_TE_AUTH_KEY_FILE" => files.clone(),
        "MC_HANDSHAKE_CONNECT_TIMEOUT" => Some("2".into()),
        "MC_TCP_BIND_ADDRESS" => Some("127.0.0.1".into()),
        "MC_LEGACY_RPC_PORT_BINDING" => legacy_port.map(|_| "1".into()),
        "MC_HANDSHAKE_PORT" => legacy_port.map(|p| p.to_string()),
        _ => std::env::var(k).ok(),
    })
    .expect("the test's settings")
}

/// `a` writes a pattern into a buffer of `b` and reads it back; every
/// byte is checked on both sides.
fn moves_verified_bytes(a: &Engine, b: &Engine, seed: u8) {
    moves_verified_bytes_to(a, b, b.local_name(), seed);
}

/// [`moves_verified_bytes`], `a` opening `b` as `name`.
fn moves_verified_bytes_to(a: &Engine, b: &Engine, name: &str, seed: u8) {
    const LEN: usize = 1 << 20;
    let remote = Buf::zeroed(LEN);
    register(b, &remote, true);
    let src = Buf::new(LEN, seed);
    let back = Buf::zeroed(LEN);
    register(a, &src, false);
    register(a, &back, false);
    let seg = a
        .open_segment(name)
        .unwrap_or_else(|e| panic!("open {name:?}: {e}"));
    let w = run(a, &[write_req(src.addr(), seg, remote.addr(), LEN as u64)]);
    assert_eq!(w, vec![TaskStatus::Completed]);
    assert_eq!(remote.snapshot(), pattern(LEN, seed), "bytes written");
    let r = run(a, &[read_req(back.addr(), seg, remote.addr(), LEN as u64)]);
    assert_eq!(r, vec![TaskStatus::Completed]);
    assert_eq!(back.snapshot(), pattern(LEN, seed), "bytes read back");
    a.unregister(&[src.addr(), back.addr()])
        .expect("unregister");
    b.unregister(&[remote.addr()]).expect("unregister");
}

fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u64 + 1).to_le_bytes().to_vec();
    f.push(kind);
    f.extend_from_slice(body);
    f
}

fn hello(nonce: &[u8; 32]) -> Vec<u8> {
    let mut body = vec![1u8];
    body.extend_from_slice(nonce);
    frame(HELLO, &body)
}

/// Reads one frame of `kind` with a body of `len` bytes; its body.
fn expect(s: &mut TcpStream, kind: u8, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; 9 + len];
    s.read_exact(&mut f).expect("frame");
    assert_eq!(f[..9], frame(kind, &vec![0; len])[..9], "frame {f:02x?}");
    f.split_off(9)
}

fn tag(name: &str) -> Vec<u8> {
    Sha256::new()
        .chain_update(DOMAIN)
        .chain_update(b" name\0")
        .chain_update(name.as_bytes())
        .finalize()[..8]
        .to_vec()
}

/// The proof of direction `dir` (`b'C'`/`b'S'`) on port `port`
/// (`b'H'`/`b'D'`).
fn mac(k: &[u8], port: u8, dir: u8, name: &str, nc: &[u8], ns: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(k).expect("key");
    m.update(DOMAIN);
    m.update(&[port, dir]);
    m.update(&(name.len() as u64).to_le_bytes());
    m.update(name.as_bytes());
    m.update(nc);
    m.update(ns);
    m.finalize().into_bytes().to_vec()
}

fn proof(name: &str, m1: &[u8], m2: &[u8]) -> Vec<u8> {
    frame(PROOF, &[tag(name), m1.to_vec(), m2.to_vec()].concat())
}

/// Reads what the server sends until it closes; asserts it is exactly
/// one refusal of `reason`.
fn refused(s: &mut TcpStream, reason: u8) {
    let got = read_until_closed(s, Duration::from_secs(20));
    assert_eq!(got, frame(REFUSED, &[reason]), "expected a refusal");
}

/// The data port of engine `b`, from its descriptor fetched over a
/// handshake authenticated by hand with key `seed`.
fn keyed_data_port(b: &Engine, seed: u8) -> u16 {
    let nc = [1u8; 32];
    let name = b.local_name().to_string();
    let mut s = connect(handshake_port(b));
    s.write_all(&hello(&nc)).unwrap();
    let ch = expect(&mut s, CHALLENGE, 33);
    let good = mac(&key(seed), b'H', b'C', &name, &nc, &ch[1..]);
    s.write_all(&proof(&name, &good, &good)).unwrap();
    expect(&mut s, ACCEPT, 32);
    s.write_all(&frame(1, b"{}\n")).unwrap();
    let reply = read_until_closed(&mut s, Duration::from_secs(20));
    let v: serde_json::Value = serde_json::from_slice(&reply[9..]).expect("descriptor");
    v["tcp_data_port"].as_u64().expect("data port") as u16
}

/// A Probe frame of Mooncake's handshake protocol.
fn probe() -> Vec<u8> {
    frame(3, b"{}\n")
}

#[test]
fn two_engines_with_the_same_key_move_verified_bytes() {
    let k = KeyFile::new(1);
    let a = keyed(Some(&k.path()));
    let b = keyed(Some(&k.path()));
    moves_verified_bytes(&a, &b, 7);
    moves_verified_bytes(&b, &a, 9);
}

/// A key file that is not a small regular file fails engine creation at
/// once, naming the file and why: a FIFO with no writer (creation used to
/// wait for one forever), a directory, a file over 4 KiB, a missing file,
/// and `/dev/zero` (read until memory ran out); a good file still builds
/// an engine that moves bytes.
#[test]
fn key_files_that_are_not_small_regular_files_fail_engine_creation_at_once() {
    let dir = std::env::temp_dir().join(format!("te-auth-paths-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub")).expect("temporary directory");
    std::fs::write(dir.join("big"), "ab".repeat(32 * 1024)).expect("big file");
    let fifo = std::ffi::CString::new(dir.join("fifo").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    let cases = [
        (dir.join("fifo"), "a FIFO, not a regular file"),
        (dir.join("sub"), "a directory, not a regular file"),
        (
            dir.join("big"),
            "it holds 65536 bytes; at most 4096 are accepted",
        ),
        (dir.join("missing"), "No such file or directory"),
        (
            PathBuf::from("/dev/zero"),
            "a character device, not a regular file",
        ),
    ];
    for (path, why) in cases {
        let shown = path.to_str().unwrap().to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        let files = shown.clone();
        let t0 = Instant::now();
        // On a thread: the old code never returned for the FIFO.
        std::thread::spawn(move || {
            let built = Engine::builder("P2PHANDSHAKE", "127.0.0.1:0")
                .config(key_config(Some(&files), None))
                .build();
            let _ = tx.send(built.map(|e| e.shutdown()).map_err(|e| e.to_string()));
        });
        let built = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("creating an engine with key file {shown} did not return"));
        let took = t0.elapsed();
        let e = built.expect_err(&shown);
        println!("{shown}: refused in {took:?}: {e}");
        assert!(
            e.contains(&format!("key file {shown} cannot be read")),
            "{e}"
        );
        assert!(e.contains(why), "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let good = KeyFile::new(5);
    let a = keyed(Some(&good.path()));
    let b = keyed(Some(&good.path()));
    moves_verified_bytes(&a, &b, 11);
}

#[test]
fn engines_with_different_keys_fail_cleanly_within_the_deadline() {
    let (ka, kb) = (KeyFile::new(1), KeyFile::new(2));
    let a = keyed(Some(&ka.path()));
    let b = keyed(Some(&kb.path()));
    let t0 = Instant::now();
    let e = a.open_segment(b.local_name()).expect_err("different keys");
    assert!(e.to_string().contains("wrong key"), "{e}");
    let e = b.open_segment(a.local_name()).expect_err("different keys");
    assert!(e.to_string().contains("wrong key"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    // An engine without a key is refused by one with a key, and the other
    // way round.
    let none = keyed(None);
    let e = none.open_segment(a.local_name()).expect_err("no key");
    assert!(e.to_string().contains("requires authentication"), "{e}");
    let e = a
        .open_segment(none.local_name())
        .expect_err("peer without key");
    assert!(e.to_string().contains("authentication"), "{e}");
}

#[test]
fn rotation_new_old_then_new() {
    let (new, old) = (KeyFile::new(3), KeyFile::new(4));
    let both = format!("{},{}", new.path(), old.path());
    let x = keyed(Some(&both));
    let y = keyed(Some(&old.path()));
    moves_verified_bytes(&x, &y, 1);
    moves_verified_bytes(&y, &x, 2);
    let z = keyed(Some(&new.path()));
    moves_verified_bytes(&z, &x, 3);
    moves_verified_bytes(&x, &z, 4);
    let e = y.open_segment(z.local_name()).expect_err("old alone");
    assert!(e.to_string().contains("wrong key"), "{e}");
    let e = z.open_segment(y.local_name()).expect_err("new alone");
    assert!(e.to_string().contains("wrong key"), "{e}");
}

#[test]
fn the_handshake_port_refuses_no_proof_wrong_proof_and_replayed_proof() {
    let k = KeyFile::new(5);
    let b = keyed(Some(&k.path()));
    let name = b.local_name().to_string();
    let port = handshake_port(&b);
    // No proof: a Mooncake Probe.
    let mut s = connect(port);
    s.write_all(&probe()).unwrap();
    refused(&mut s, NO_AUTHENTICATION);
    // A wrong proof: made with another key.
    let mut s = connect(port);
    let nc = [7u8; 32];
    s.write_all(&hello(&nc)).unwrap();
    let ch = expect(&mut s, CHALLENGE, 33);
    let wrong = mac(&key(6), b'H', b'C', &name, &nc, &ch[1..]);
    s.write_all(&proof(&name, &wrong, &wrong)).unwrap();
    refused(&mut s, WRONG_KEY);
    // A good proof, then the request is served.
    let mut s = connect(port);
    s.write_all(&hello(&nc)).unwrap();
    let ch = expect(&mut s, CHALLENGE, 33);
    let good = mac(&key(5), b'H', b'C', &name, &nc, &ch[1..]);
    s.write_all(&proof(&name, &good, &good)).unwrap();
    let accept = expect(&mut s, ACCEPT, 32);
    assert_eq!(accept, mac(&key(5), b'H', b'S', &name, &nc, &ch[1..]));
    s.write_all(&probe()).unwrap();
    let reply = read_until_closed(&mut s, Duration::from_secs(20));
    assert_eq!(reply[8], 3, "probe answered: {reply:02x?}");
    // The captured proof replayed on a new connection with the same
    // hello: the server's nonce is new, the proof is refused.
    let mut s = connect(port);
    s.write_all(&hello(&nc)).unwrap();
    let ch2 = expect(&mut s, CHALLENGE, 33);
    assert_ne!(ch, ch2, "a fresh server nonce");
    s.write_all(&proof(&name, &good, &good)).unwrap();
    refused(&mut s, WRONG_KEY);
    // A proof made for the data port, or for another engine's name.
    let mut s = connect(port);
    s.write_all(&hello(&nc)).unwrap();
    let ch = expect(&mut s, CHALLENGE, 33);
    let data = mac(&key(5), b'D', b'C', &name, &nc, &ch[1..]);
    s.write_all(&proof(&name, &data, &data)).unwrap();
    refused(&mut s, WRONG_KEY);
    let mut s = connect(port);
    s.write_all(&hello(&nc)).unwrap();
    let ch = expect(&mut s, CHALLENGE, 33);
    let other = "127.0.0.1:1";
    let m = mac(&key(5), b'H', b'C', other, &nc, &ch[1..]);
    s.write_all(&proof(other, &m, &m)).unwrap();
    refused(&mut s, WRONG_NAME);
    // Meanwhile a real peer is served.
    let a = keyed(Some(&k.path()));
    moves_verified_bytes(&a, &b, 11);
}

#[test]
fn the_data_port_reads_and_writes_no_byte_for_a_peer_without_the_key() {
    let k = KeyFile::new(8);
    let b = keyed(Some(&k.path()));
    let a = keyed(Some(&k.path()));
    let target = Buf::new(4096, 42);
    register(&b, &target, true);
    // Learn the data port through an authenticated engine.
    let seg = a.open_segment(b.local_name()).expect("open");
    assert!(seg >= 0);
    let port = keyed_data_port(&b, 8);
    // A WRITE without authentication: refused, no byte written.
    let mut s = connect(port);
    let mut w = raw_header(4096, target.addr(), 0x81).to_vec();
    w.extend_from_slice(&[0u8; 4096]);
    let _ = s.write_all(&w);
    refused(&mut s, NO_AUTHENTICATION);
    assert_eq!(target.snapshot(), pattern(4096, 42), "memory unchanged");
    // A READ without authentication: nothing but the refusal comes back.
    let mut s = connect(port);
    s.write_all(&raw_header(4096, target.addr(), 0x80)).unwrap();
    refused(&mut s, NO_AUTHENTICATION);
    // A wrong proof, then a WRITE right behind it.
    let mut s = connect(port);
    let nc = [3u8; 32];
    let name = b.local_name().to_string();
    s.write_all(&hello(&nc)).unwrap();
    let ch = expect(&mut s, CHALLENGE, 33);
    let wrong = mac(&key(9), b'D', b'C', &name, &nc, &ch[1..]);
    let mut p = proof(&name, &wrong, &wrong);
    p.extend_from_slice(&w);
    let _ = s.write_all(&p);
    let got = read_until_closed(&mut s, Duration::from_secs(20));
    assert!(got.starts_with(&frame(REFUSED, &[WRONG_KEY])), "{got:02x?}");
    // Silence: closed within the handshake deadline.
    let mut s = connect(port);
    let t0 = Instant::now();
    let got = read_until_closed(&mut s, Duration::from_secs(30));
    assert!(got.is_empty(), "{got:02x?}");
    assert!(t0.elapsed() < Duration::from_secs(25), "{:?}", t0.elapsed());
    assert_eq!(target.snapshot(), pattern(4096, 42), "memory unchanged");
    // The real peer is still served.
    moves_verified_bytes(&a, &b, 13);
}

#[test]
fn a_proof_reflected_back_to_our_engine_is_caught() {
    let k = KeyFile::new(10);
    let a = keyed(Some(&k.path()));
    // A fake peer that reflects our engine's own proof as its answer.
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let h = expect(&mut s, HELLO, 33);
        assert_eq!(h[0], 1);
        s.write_all(&frame(CHALLENGE, &[&[1u8][..], &[9u8; 32]].concat()))
            .unwrap();
        let p = expect(&mut s, PROOF, 8 + 64);
        s.write_all(&frame(ACCEPT, &p[8..40])).unwrap();
        read_until_closed(&mut s, Duration::from_secs(20))
    });
    let t0 = Instant::now();
    let e = a
        .open_segment(&format!("127.0.0.1:{port}"))
        .expect_err("reflected proof");
    assert!(e.to_string().contains("does not hold our key"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(20));
    let after = fake.join().expect("fake");
    assert!(
        after.is_empty(),
        "our engine sent its request: {after:02x?}"
    );
}

#[test]
fn with_a_store_the_data_port_refuses_another_key_and_the_tasks_fail() {
    // The descriptor comes from the store: the first connection to the
    // peer is a data connection.
    let store = MetadataServer::start("127.0.0.1:0", "/metadata", None).expect("metadata server");
    let (ka, kb) = (KeyFile::new(12), KeyFile::new(13));
    let a = keyed_in(&store.url(), "auth-a", Some(&ka.path()));
    let b = keyed_in(&store.url(), "auth-b", Some(&kb.path()));
    let target = Buf::new(1 << 16, 21);
    register(&b, &target, true);
    let src = Buf::new(1 << 16, 22);
    let back = Buf::zeroed(1 << 16);
    register(&a, &src, false);
    register(&a, &back, false);
    let seg = a.open_segment("auth-b").expect("open through the store");
    let t0 = Instant::now();
    let w = run_within(
        &a,
        &[write_req(src.addr(), seg, target.addr(), 1 << 16)],
        Duration::from_secs(60),
    );
    assert_eq!(w, vec![TaskStatus::Failed]);
    let r = run_within(
        &a,
        &[read_req(back.addr(), seg, target.addr(), 1 << 16)],
        Duration::from_secs(60),
    );
    assert_eq!(r, vec![TaskStatus::Failed]);
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert_eq!(target.snapshot(), pattern(1 << 16, 21), "no byte written");
    assert_eq!(back.snapshot(), vec![0u8; 1 << 16], "no byte read");
    // An engine with b's key moves bytes through the same store.
    let c = keyed_in(&store.url(), "auth-c", Some(&kb.path()));
    moves_verified_bytes(&c, &b, 23);
    store.shutdown();
}

/// Mooncake's style (`MC_LEGACY_RPC_PORT_BINDING=1`), keyed and keyless: a
/// peer named bare (`127.0.0.1`, its handshake on `MC_HANDSHAKE_PORT`) or
/// as `127.0.0.1:<port>` is opened by either form of its name, and both
/// ports take the proofs made for it: bytes move both ways, verified.
fn legacy_names_in_p2p(files: Option<&str>) {
    let port = common::servers::fixed_port();
    let full = format!("127.0.0.1:{port}");
    for (i, named) in ["127.0.0.1", full.as_str()].into_iter().enumerate() {
        let b = legacy_in("P2PHANDSHAKE", named, files, port);
        assert_eq!(b.local_name(), full);
        let a = legacy_in("P2PHANDSHAKE", "127.0.0.1:0", files, port);
        for (j, opened) in ["127.0.0.1", full.as_str()].into_iter().enumerate() {
            moves_verified_bytes_to(&a, &b, opened, (10 * i + j) as u8);
        }
        a.shutdown();
        b.shutdown();
    }
}

#[test]
fn legacy_port_binding_peer_opened_bare_or_with_its_port_keyed() {
    let k = KeyFile::new(14);
    legacy_names_in_p2p(Some(&k.path()));
    // One identity on both ports: `127.0.0.1:<port>`; a proof made for
    // the bare name (the name the engine was created with) is refused.
    let port = common::servers::fixed_port();
    let b = legacy_in("P2PHANDSHAKE", "127.0.0.1", Some(&k.path()), port);
    let a = legacy_in("P2PHANDSHAKE", "127.0.0.1:0", Some(&k.path()), port);
    moves_verified_bytes_to(&a, &b, "127.0.0.1", 40);
    let full = format!("127.0.0.1:{port}");
    for (listener, p) in [(port, b'H'), (keyed_data_port(&b, 14), b'D')] {
        let prove = |name: &str| {
            let mut s = connect(listener);
            let nc = [4u8; 32];
            s.write_all(&hello(&nc)).unwrap();
            let ch = expect(&mut s, CHALLENGE, 33);
            let m = mac(&key(14), p, b'C', name, &nc, &ch[1..]);
            s.write_all(&proof(name, &m, &m)).unwrap();
            s
        };
        refused(&mut prove("127.0.0.1"), WRONG_NAME);
        expect(&mut prove(&full), ACCEPT, 32);
    }
}

#[test]
fn legacy_port_binding_peer_opened_bare_or_with_its_port_keyless() {
    legacy_names_in_p2p(None);
}

/// [`legacy_names_in_p2p`] through a store (`conn`): a peer named bare or
/// as `host:port`, binding that port (or `MC_HANDSHAKE_PORT`), opened by
/// its name, keyed and keyless (with key `seed`).
fn legacy_names_in_store(conn: &str, seed: u8) {
    let k = KeyFile::new(seed);
    let key = k.path();
    let port = common::servers::fixed_port();
    let full = format!("127.0.0.1:{port}");
    for files in [None, Some(key.as_str())] {
        for named in ["127.0.0.1", full.as_str()] {
            let b = legacy_in(conn, named, files, port);
            assert_eq!(handshake_port(&b), port, "{named}");
            let a = legacy_in(conn, "127.0.0.1:0", files, port);
            moves_verified_bytes_to(&a, &b, named, 31);
            a.shutdown();
            b.shutdown();
        }
    }
}

#[test]
fn legacy_port_binding_peer_through_the_http_metadata_server() {
    let store = MetadataServer::start("127.0.0.1:0", "/metadata", None).expect("metadata server");
    legacy_names_in_store(&store.url(), 15);
    store.shutdown();
}

#[test]
fn legacy_port_binding_peer_through_etcd() {
    let Some(etcd) = common::servers::Etcd::start() else {
        return;
    };
    legacy_names_in_store(&etcd.conn_string(), 16);
}

#[test]
fn legacy_port_binding_peer_through_redis() {
    let Some(redis) = common::servers::Redis::start() else {
        return;
    };
    legacy_names_in_store(&redis.conn_string(), 17);
}
