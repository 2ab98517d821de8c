//! `transfer-engine-metadata-server --auth-token-file [--auth-read]
//! [--tls-cert --tls-key]`, as a child process logging at `trace`, driven
//! by raw sockets and by the engine's HTTP store:
//!
//! - without the token (none, a wrong one, another scheme) PUT and DELETE
//!   get 401 as soon as their head is read, the body unread and nothing
//!   stored; GET stays open unless `--auth-read`; with the token they work;
//! - over HTTPS the store works with `MC_METADATA_AUTH_TOKEN_FILE` and
//!   `MC_METADATA_CACERT`, and fails with a message naming the variable
//!   without the token or with another CA; plain HTTP gets no answer;
//! - the token is in no log line of the server, at any level;
//! - two engines meet through an HTTPS server with a token (the engines'
//!   configuration: `MC_METADATA_AUTH_TOKEN_FILE`, `MC_METADATA_CACERT`) and
//!   move byte-verified data.

use crate::cluster_common;
use crate::common;

use common::servers::TempDir;
use common::tls::Pki;
use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use transfer_engine::metadata::StoreConfig;
use transfer_engine::metadata::http::HttpStore;
use transfer_engine::metadata::server::{MetadataServer, ServerOptions};
use transfer_engine::metadata::store::MetadataStore;

/// The token of these tests.
const TOKEN: &str = "3f9c2b7e51d04a8e9b6c0d2f4a1e7c95";
/// A token of the same length that is not it.
const WRONG: &str = "3f9c2b7e51d04a8e9b6c0d2f4a1e7c96";

/// Writes `token` to `dir/name`, mode 600.
fn token_file(dir: &Path, name: &str, token: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// The server binary, logging everything (`RUST_LOG=trace`) to a file.
struct Server {
    child: Child,
    addr: SocketAddr,
    url: String,
    log: PathBuf,
}

impl Server {
    fn start(dir: &TempDir, args: &[&str]) -> Server {
        let log = dir.path().join("server.log");
        let out = std::fs::File::create(&log).unwrap();
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_transfer-engine-metadata-server"));
        let child = Command::new(bin)
            .args(["--addr", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "trace")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start the metadata server");
        let start = Instant::now();
        let url = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(url) = text.lines().find_map(|l| l.strip_prefix("listening on ")) {
                break url.to_string();
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the server did not start: {text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let addr = url
            .split("://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .and_then(|a| a.parse().ok())
            .expect("an address in the url");
        Server {
            child,
            addr,
            url,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `head` (plus `\r\n` ending it) and `body` on a new connection and
/// reads until the server closes: the whole answer.
fn exchange(addr: SocketAddr, head: &str, body: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("{head}\r\n").as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A request with `auth` as its `Authorization` header (if any); the
/// status of the answer and the answer.
fn call(
    addr: SocketAddr,
    method: &str,
    key: &str,
    auth: Option<&str>,
    body: &str,
) -> (u16, String) {
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    let head = format!(
        "{method} /metadata?key={key} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    let answer = exchange(addr, &head, body.as_bytes());
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"));
    (status, answer)
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

#[test]
fn writes_need_the_token() {
    let dir = TempDir::new("meta-auth");
    let file = token_file(dir.path(), "token", TOKEN);
    let server = Server::start(&dir, &["--auth-token-file", file.to_str().unwrap()]);
    let a = server.addr;
    let (ok, wrong) = (bearer(TOKEN), bearer(WRONG));

    for auth in [
        None,
        Some(wrong.as_str()),
        Some("Basic dGU6c2VjcmV0"),
        Some("Bearer"),
    ] {
        let (status, answer) = call(a, "PUT", "k1", auth, "{\"v\":1}");
        assert_eq!(status, 401, "PUT with {auth:?}: {answer}");
        assert!(answer.contains("WWW-Authenticate: Bearer"), "{answer}");
        let (status, answer) = call(a, "DELETE", "k1", auth, "");
        assert_eq!(status, 401, "DELETE with {auth:?}: {answer}");
    }
    // Nothing was stored, and GET needs no token.
    assert_eq!(call(a, "GET", "k1", None, "").0, 404);
    // A refused PUT is answered from its head: its 40 MB body is never
    // sent, and the answer comes anyway.
    let answer = exchange(
        a,
        "PUT /metadata?key=big HTTP/1.1\r\nHost: x\r\nContent-Length: 40000000\r\n",
        b"",
    );
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    // Two Authorization headers, one of them right: refused.
    let head = format!(
        "PUT /metadata?key=k1 HTTP/1.1\r\nHost: x\r\nAuthorization: {ok}\r\nAuthorization: \
         {wrong}\r\nContent-Length: 2\r\n"
    );
    assert!(exchange(a, &head, b"{}").starts_with("HTTP/1.1 400"));

    // With the token: stored, readable without it, deleted with it.
    assert_eq!(call(a, "PUT", "k1", Some(&ok), "{\"v\":42}").0, 200);
    let (status, answer) = call(a, "GET", "k1", None, "");
    assert_eq!(status, 200);
    assert!(answer.ends_with("{\"v\":42}"), "{answer}");
    assert_eq!(call(a, "DELETE", "k1", None, "").0, 401);
    assert_eq!(
        call(a, "GET", "k1", None, "").0,
        200,
        "a refused DELETE deleted"
    );
    assert_eq!(call(a, "DELETE", "k1", Some(&ok), "").0, 200);
    assert_eq!(call(a, "GET", "k1", None, "").0, 404);

    let log = server.log();
    // One line per interval (rate-limited): the first refusal's.
    assert!(
        log.contains("connection from 127.0.0.1:")
            && log.contains("closed: PUT without a token (no Authorization header): 401"),
        "no refusal line naming the client and the reason: {log}"
    );
    assert!(!log.contains(TOKEN), "the token is in the log:\n{log}");
    assert!(
        log.contains("without --tls-cert"),
        "no warning that the token travels in clear: {log}"
    );
}

#[test]
fn two_tokens_while_one_is_replaced() {
    const NEW: &str = "9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d";
    let dir = TempDir::new("meta-auth-two");
    let new = token_file(dir.path(), "new", NEW);
    let old = token_file(dir.path(), "old", TOKEN);
    let both = format!("{},{}", new.display(), old.display());
    let server = Server::start(&dir, &["--auth-token-file", &both, "--auth-read"]);
    let a = server.addr;
    assert_eq!(call(a, "PUT", "r", Some(&bearer(NEW)), "[1]").0, 200);
    assert_eq!(call(a, "PUT", "r", Some(&bearer(TOKEN)), "[2]").0, 200);
    assert_eq!(call(a, "PUT", "r", Some(&bearer(WRONG)), "[3]").0, 401);
    let (status, answer) = call(a, "GET", "r", Some(&bearer(NEW)), "");
    assert_eq!(status, 200);
    assert!(answer.ends_with("[2]"), "{answer}");
    let log = server.log();
    assert!(
        !log.contains(NEW) && !log.contains(TOKEN),
        "a token is in the log"
    );
}

#[test]
fn auth_read_guards_gets_too() {
    let dir = TempDir::new("meta-auth-read");
    let file = token_file(dir.path(), "token", TOKEN);
    // Readable by others: accepted, with a warning.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let server = Server::start(
        &dir,
        &["--auth-token-file", file.to_str().unwrap(), "--auth-read"],
    );
    let ok = bearer(TOKEN);
    assert_eq!(call(server.addr, "PUT", "r", Some(&ok), "[1]").0, 200);
    assert_eq!(call(server.addr, "GET", "r", None, "").0, 401);
    assert_eq!(
        call(server.addr, "GET", "r", Some(&bearer(WRONG)), "").0,
        401
    );
    let (status, answer) = call(server.addr, "GET", "r", Some(&ok), "");
    assert_eq!(status, 200);
    assert!(answer.ends_with("[1]"), "{answer}");
    let log = server.log();
    assert!(
        log.contains("mode is 644") && log.contains("chmod 600"),
        "{log}"
    );
    assert!(!log.contains(TOKEN), "the token is in the log");
}

/// A store on `url` with `token` and `ca` as its files.
fn store(url: &str, token: Option<&Path>, ca: &Path) -> HttpStore {
    let c = StoreConfig {
        http_token_file: token.map(Path::to_path_buf),
        http_cacert: Some(ca.to_path_buf()),
        ..StoreConfig::default()
    };
    HttpStore::from_config(url, &c).expect("open the store")
}

#[test]
fn https_with_a_token() {
    let pki = Pki::new();
    let dir = TempDir::new("meta-https");
    let token = token_file(dir.path(), "token", TOKEN);
    let wrong = token_file(dir.path(), "wrong", WRONG);
    let server = Server::start(
        &dir,
        &[
            "--auth-token-file",
            token.to_str().unwrap(),
            "--auth-read",
            "--tls-cert",
            pki.cert.to_str().unwrap(),
            "--tls-key",
            pki.key.to_str().unwrap(),
        ],
    );
    assert!(server.url.starts_with("https://"), "{}", server.url);

    let good = store(&server.url, Some(&token), &pki.ca);
    let value = json!({"name": "seg", "bytes": (0..200).collect::<Vec<u32>>()});
    good.set("mooncake/ram/seg", &value)
        .expect("PUT over HTTPS");
    assert_eq!(good.get("mooncake/ram/seg").unwrap(), Some(value.clone()));

    let e = store(&server.url, None, &pki.ca)
        .get("mooncake/ram/seg")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("401") && e.contains("set MC_METADATA_AUTH_TOKEN_FILE"),
        "{e}"
    );
    let e = store(&server.url, Some(&wrong), &pki.ca)
        .set("mooncake/ram/seg", &json!({}))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("401") && e.contains("refused the token of MC_METADATA_AUTH_TOKEN_FILE"),
        "{e}"
    );
    assert!(!e.contains(WRONG), "the message quotes the token: {e}");
    let e = store(&server.url, Some(&token), &pki.other_ca)
        .get("mooncake/ram/seg")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not signed by a CA in MC_METADATA_CACERT="),
        "{e}"
    );
    // The refused writes changed nothing.
    assert_eq!(good.get("mooncake/ram/seg").unwrap(), Some(value));

    // A value of 12 MB, larger than the socket buffers and rustls' own,
    // goes both ways intact.
    let big: String = (0..12_000_000u32)
        .map(|i| char::from(b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26))
        .collect();
    let big = json!({ "blob": big });
    good.set("mooncake/ram/big", &big).expect("PUT of 12 MB");
    assert!(
        good.get("mooncake/ram/big").unwrap() == Some(big),
        "the 12 MB value came back changed"
    );

    // Plain HTTP on the TLS port gets no HTTP answer.
    let answer = exchange(
        server.addr,
        &format!(
            "GET /metadata?key=mooncake%2Fram%2Fseg HTTP/1.1\r\nHost: x\r\nAuthorization: \
             Bearer {TOKEN}\r\nConnection: close\r\n"
        ),
        b"",
    );
    assert!(!answer.contains("HTTP/1.1"), "{answer:?}");

    good.remove("mooncake/ram/seg").unwrap();
    assert_eq!(good.get("mooncake/ram/seg").unwrap(), None);
    let log = server.log();
    assert!(!log.contains(TOKEN), "the token is in the log:\n{log}");
    assert!(!log.contains(WRONG), "a presented token is in the log");
}

#[test]
fn engines_meet_through_an_https_server_with_a_token() {
    let pki = Pki::new();
    let dir = TempDir::new("meta-https-engines");
    let token = token_file(dir.path(), "token", TOKEN);
    cluster_common::init_env(&[
        ("MC_METADATA_AUTH_TOKEN_FILE", token.to_str().unwrap()),
        ("MC_METADATA_CACERT", pki.ca.to_str().unwrap()),
    ]);
    let opts = ServerOptions {
        auth_tokens: vec![transfer_engine::metadata::secret::Secret::new(TOKEN)],
        auth_read: true,
        tls_cert: Some(pki.cert.clone()),
        tls_key: Some(pki.key.clone()),
        ..ServerOptions::default()
    };
    let server = MetadataServer::start_with("127.0.0.1:0", "/metadata", None, opts).unwrap();
    assert!(server.url().starts_with("https://"));
    cluster_common::two_engines(&server.url(), ["https-a:1", "https-b:1"]);
}

/// Reads from `s` until the server closes it (or 30 s pass): whether it
/// closed, and when, counted from `start`.
fn closed_within(s: &mut TcpStream, start: Instant) -> (bool, Duration) {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while start.elapsed() < Duration::from_secs(30) {
        match s.read(&mut buf) {
            Ok(0) => return (true, start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (true, start.elapsed()),
        }
    }
    (false, start.elapsed())
}

#[test]
fn silent_and_half_handshakes_are_closed_at_the_deadline() {
    let pki = Pki::new();
    let dir = TempDir::new("meta-tls-slow");
    let server = Server::start(
        &dir,
        &[
            "--timeout",
            "2",
            "--tls-cert",
            pki.cert.to_str().unwrap(),
            "--tls-key",
            pki.key.to_str().unwrap(),
        ],
    );
    let start = Instant::now();
    let mut silent = TcpStream::connect(server.addr).unwrap();
    // The first bytes of a TLS record header of a ClientHello, then nothing.
    let mut half = TcpStream::connect(server.addr).unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .unwrap();
    // A real client is served meanwhile.
    let store = store(&server.url, None, &pki.ca);
    store.set("mooncake/ram/live", &json!({"up": 1})).unwrap();
    for (what, s) in [("silent", &mut silent), ("half handshake", &mut half)] {
        let (closed, after) = closed_within(s, start);
        assert!(closed, "{what} connection still open after {after:?}");
        assert!(
            after >= Duration::from_secs(1),
            "{what} closed after {after:?}, well before the 2 s deadline"
        );
    }
    assert_eq!(
        store.get("mooncake/ram/live").unwrap(),
        Some(json!({"up": 1}))
    );
}

#[test]
fn incomplete_or_bad_settings_are_refused_at_start() {
    let pki = Pki::new();
    let dir = TempDir::new("meta-bad-flags");
    let short = token_file(dir.path(), "short", "tooshort");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_transfer-engine-metadata-server"));
    let cert = pki.cert.to_str().unwrap();
    for (args, says) in [
        (vec!["--auth-read"], "--auth-read needs --auth-token-file"),
        (
            vec!["--tls-cert", cert],
            "--tls-cert and --tls-key go together",
        ),
        (
            vec!["--tls-cert", cert, "--tls-key", cert],
            "holds no usable PEM private key",
        ),
        (
            vec!["--auth-token-file", short.to_str().unwrap()],
            "the token has 8 characters",
        ),
        (
            vec!["--auth-token-file", "a,b,c"],
            "takes one file, or two (new,old)",
        ),
    ] {
        let out = Command::new(&bin)
            .args(["--addr", "127.0.0.1:0"])
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run the server");
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{args:?} started: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
        assert!(!text.contains("tooshort"), "the token is quoted: {text}");
    }
}
