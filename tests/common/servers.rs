//! Real etcd and redis servers for tests: each instance runs on 127.0.0.1
//! on free ports with its own temporary directory, is stopped (killed and
//! reaped) and its directory removed on drop, and can be restarted on the
//! same port and data directory.
//!
//! The binaries are taken from `TE_ETCD_BIN` / `TE_REDIS_SERVER_BIN`, else
//! from `PATH` (Debian's `etcd-server` and `redis-server` packages). When a
//! binary is missing, `start` reports the test skipped
//! ([`super::skip`]: `SKIPPED: etcd not installed`) and returns `None`; with
//! `TE_REQUIRE_SERVERS=1` or `CI=true` it panics instead, so a missing
//! package cannot turn the tests green silently.
//!
//! ```ignore
//! let Some(etcd) = Etcd::start() else { return };
//! let store = EtcdStore::new(&[etcd.endpoint()])?;
//! ```

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a server may take to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `te-<tag>-<pid>-<n>-<nanos>` under the temp dir.
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "te-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// A port of 127.0.0.1 free now, for a listener that must get the same
/// port again after its process dies (a peer restarted on the same name):
/// taken from 20000..32000, below the kernel's ephemeral range (no
/// outgoing connection takes it meanwhile) and above the engines' random
/// RPC and data ports (15000..=17000); each call tries another one.
pub fn fixed_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919);
    for _ in 0..1000 {
        let n = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed).wrapping_mul(13));
        let port = 20000 + (n % 12000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000..32000");
}

/// `127.0.0.1:<port>` with nothing listening: connections are refused.
pub fn dead_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// A listener that never accepts nor answers: connections complete (the
/// kernel queues them) and then hear nothing, like a hung server. Requests
/// to it end only by the client's timeouts.
pub struct Blackhole {
    listener: TcpListener,
}

impl Blackhole {
    /// Binds a silent listener on a free port of 127.0.0.1.
    pub fn new() -> Blackhole {
        Blackhole {
            listener: TcpListener::bind("127.0.0.1:0").expect("bind blackhole"),
        }
    }

    /// Its address as `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| a.to_string())
            .expect("blackhole address")
    }
}

impl Default for Blackhole {
    fn default() -> Self {
        Blackhole::new()
    }
}

/// The server binary named by `env_var`, else `name` found on `PATH`, else
/// `None` after reporting the test skipped (or a panic when
/// `TE_REQUIRE_SERVERS=1` or `CI=true`).
pub fn find_binary(env_var: &str, name: &str, what: &str) -> Option<PathBuf> {
    let found = match std::env::var_os(env_var) {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)).filter(|p| p.is_file()),
        _ => std::env::var_os("PATH")
            .map(|paths| {
                std::env::split_paths(&paths)
                    .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
            .unwrap_or(None),
    };
    if found.is_none() {
        let why = match std::env::var_os(env_var) {
            Some(p) if !p.is_empty() => format!("{env_var}={} is not a file", p.to_string_lossy()),
            _ => format!("no {name} on PATH; set {env_var} to use another binary"),
        };
        let required = std::env::var("TE_REQUIRE_SERVERS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{what} not installed ({why}) and TE_REQUIRE_SERVERS=1; install the Debian package"
        );
        super::skip(&format!("{what} not installed ({why})"));
    }
    found
}

/// A server child process whose output goes to a log file; started again
/// with the same arguments by [`Process::restart`].
pub struct Process {
    what: &'static str,
    program: PathBuf,
    args: Vec<OsString>,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    /// Describes (does not start) `program args…` logging to `log`.
    pub fn new(what: &'static str, program: PathBuf, args: Vec<OsString>, log: PathBuf) -> Self {
        Process {
            what,
            program,
            args,
            log,
            child: None,
        }
    }

    /// Spawns the child (appending to the log).
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.what);
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open server log");
        let err = out.try_clone().expect("clone log handle");
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.program.display()));
        self.child = Some(child);
    }

    /// The child's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the child is running (not yet exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The last `max` bytes of the log, for failure messages.
    pub fn log_tail(&self, max: usize) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let cut = text.len().saturating_sub(max);
        let cut = (cut..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[cut..].to_string()
    }

    /// Polls `ready` every 50 ms until it holds; panics with the log tail
    /// if the child exits or [`READY_TIMEOUT`] passes. Returns false
    /// (child reaped) when the child exited because its port was taken, so
    /// the caller can retry on other ports.
    pub fn wait_ready(&mut self, mut ready: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        loop {
            if ready() {
                return true;
            }
            if !self.is_running() {
                self.kill();
                let log = self.log_tail(4000);
                if log.to_ascii_lowercase().contains("address already in use") {
                    return false;
                }
                panic!("{} exited during startup; log:\n{log}", self.what);
            }
            if start.elapsed() > READY_TIMEOUT {
                self.kill();
                panic!(
                    "{} not ready within {:?}; log:\n{}",
                    self.what,
                    READY_TIMEOUT,
                    self.log_tail(4000)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, up to 5 s for a clean exit, then SIGKILL; reaps the child.
    pub fn stop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill(2) on the pid of our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if !matches!(child.try_wait(), Ok(None)) {
                self.child = None;
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }

    /// SIGKILL and reap (a crash, as far as the server can tell).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One etcd member on 127.0.0.1 with its own data directory.
pub struct Etcd {
    // Field order matters: the process dies before its directory goes.
    proc: Process,
    client_port: u16,
    /// `http` or `https`.
    scheme: &'static str,
    /// The client of [`Etcd::gateway`] and of the health check.
    agent: ureq::Agent,
    /// The authentication token of [`Etcd::gateway`] once auth is on.
    token: Option<String>,
    dir: TempDir,
}

impl Etcd {
    /// Starts a single-member etcd and waits until `/health` says true;
    /// `None` (after printing why) when etcd is not installed.
    pub fn start() -> Option<Etcd> {
        Etcd::start_with(None)
    }

    /// [`Etcd::start`] serving clients over TLS with the certificate of
    /// `pki`, and requiring client certificates signed by its CA when
    /// `client_cert_auth` (etcd's `--client-cert-auth`).
    pub fn start_tls(pki: &super::tls::Pki, client_cert_auth: bool) -> Option<Etcd> {
        Etcd::start_with(Some((pki, client_cert_auth)))
    }

    fn start_with(tls: Option<(&super::tls::Pki, bool)>) -> Option<Etcd> {
        let bin = find_binary("TE_ETCD_BIN", "etcd", "etcd")?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        for _ in 0..3 {
            let dir = TempDir::new("etcd");
            let (client_port, peer_port) = (free_port(), free_port());
            let client = format!("{scheme}://127.0.0.1:{client_port}");
            let peer = format!("http://127.0.0.1:{peer_port}");
            let mut args: Vec<OsString> = [
                "--name",
                "default",
                "--data-dir",
                &dir.path().join("data").to_string_lossy(),
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &format!("default={peer}"),
                "--log-level",
                "warn",
            ]
            .iter()
            .map(OsString::from)
            .collect();
            let mut agent: ureq::Agent = ureq::Agent::config_builder()
                .proxy(None)
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(5)))
                .build()
                .into();
            if let Some((pki, client_cert_auth)) = tls {
                args.extend(
                    [
                        OsString::from("--cert-file"),
                        pki.cert.clone().into(),
                        "--key-file".into(),
                        pki.key.clone().into(),
                    ]
                    .into_iter()
                    .chain(
                        client_cert_auth
                            .then(|| {
                                [
                                    OsString::from("--client-cert-auth"),
                                    "--trusted-ca-file".into(),
                                    pki.ca.clone().into(),
                                ]
                            })
                            .into_iter()
                            .flatten(),
                    ),
                );
                agent = pki.agent(client_cert_auth);
            }
            let log = dir.path().join("etcd.log");
            let mut etcd = Etcd {
                proc: Process::new("etcd", bin.clone(), args, log),
                client_port,
                scheme,
                agent,
                token: None,
                dir,
            };
            etcd.proc.spawn();
            if etcd.wait_ready() {
                return Some(etcd);
            }
        }
        panic!("etcd: no free ports after 3 attempts");
    }

    fn wait_ready(&mut self) -> bool {
        let url = format!("{}://127.0.0.1:{}/health", self.scheme, self.client_port);
        let agent = self.agent.clone();
        self.proc.wait_ready(|| {
            agent
                .get(&url)
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .is_some_and(|b| b.contains("true"))
        })
    }

    /// Turns etcd's authentication on with the user `root` (password
    /// `root_password`, used by [`Etcd::gateway`] from then on) and a user
    /// `user` (`password`) allowed to read and write the keys under
    /// `mooncake/` only.
    pub fn enable_auth(&mut self, root_password: &str, user: &str, password: &str) {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let steps = [
            (
                "auth/user/add",
                serde_json::json!({"name": "root", "password": root_password}),
            ),
            ("auth/role/add", serde_json::json!({"name": "root"})),
            (
                "auth/user/grant",
                serde_json::json!({"user": "root", "role": "root"}),
            ),
            ("auth/role/add", serde_json::json!({"name": "te-rw"})),
            (
                "auth/role/grant",
                serde_json::json!({"name": "te-rw", "perm": {
                    "permType": "READWRITE",
                    "key": b64.encode("mooncake/"),
                    "range_end": b64.encode("mooncake0"),
                }}),
            ),
            (
                "auth/user/add",
                serde_json::json!({"name": user, "password": password}),
            ),
            (
                "auth/user/grant",
                serde_json::json!({"user": user, "role": "te-rw"}),
            ),
            ("auth/enable", serde_json::json!({})),
        ];
        for (path, body) in steps {
            let answer = self.call(path, &body);
            // The root role may exist already.
            let exists = answer["error"]
                .as_str()
                .is_some_and(|e| e.contains("already exists"));
            assert!(
                answer.get("error").is_none() || exists,
                "etcd {path}: {answer}"
            );
        }
        let answer = self.call(
            "auth/authenticate",
            &serde_json::json!({"name": "root", "password": root_password}),
        );
        let token = answer["token"].as_str().expect("a root token").to_string();
        self.token = Some(token);
    }

    /// The client endpoint as `127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The metadata connection string, `etcd://127.0.0.1:<port>`.
    pub fn conn_string(&self) -> String {
        format!("etcd://{}", self.endpoint())
    }

    /// The temporary directory (data in `data/`, output in `etcd.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops etcd (SIGTERM, then SIGKILL); the data directory stays.
    pub fn stop(&mut self) {
        self.proc.stop();
    }

    /// Kills etcd with SIGKILL; the data directory stays.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Starts etcd again on the same ports and data directory (stopping it
    /// first if running) and waits until it is healthy.
    pub fn restart(&mut self) {
        self.proc.stop();
        self.proc.spawn();
        assert!(self.wait_ready(), "etcd: client port taken on restart");
    }

    /// Writes raw bytes under `key` through the v3 JSON gateway, as another
    /// client would.
    pub fn put_raw(&self, key: &str, value: &[u8]) {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let body = serde_json::json!({"key": b64.encode(key), "value": b64.encode(value)});
        self.gateway("put", &body);
    }

    /// Reads the raw bytes under `key` through the v3 JSON gateway.
    pub fn get_raw(&self, key: &str) -> Option<Vec<u8>> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let answer = self.gateway("range", &serde_json::json!({"key": b64.encode(key)}));
        let kv = answer.get("kvs")?.get(0)?;
        let value = kv.get("value").and_then(|v| v.as_str()).unwrap_or("");
        Some(b64.decode(value).expect("gateway value is base64"))
    }

    fn gateway(&self, op: &str, body: &serde_json::Value) -> serde_json::Value {
        let answer = self.call(&format!("kv/{op}"), body);
        assert!(answer.get("error").is_none(), "etcd kv/{op}: {answer}");
        answer
    }

    /// POSTs `body` to `/v3/<path>` (as root once auth is on): the answer.
    fn call(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let url = format!("{}://{}/v3/{path}", self.scheme, self.endpoint());
        let mut req = self.agent.post(&url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", t);
        }
        let text = req
            .send(body.to_string().as_bytes())
            .and_then(|mut r| r.body_mut().read_to_string())
            .unwrap_or_else(|e| panic!("POST {url}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {url}: {e}: {text:?}"))
    }
}

/// How to start a [`Redis`].
#[derive(Clone, Debug, Default)]
pub struct RedisOptions {
    /// `--requirepass`: the default user's password.
    pub password: Option<String>,
    /// An ACL user `(name, password)` with every permission.
    pub user: Option<(String, String)>,
    /// TLS only (`--tls-port`, no plain port) with these PEM files: the CA
    /// that client certificates must be signed by (`--tls-auth-clients
    /// yes`), and the server's certificate and key.
    pub tls: Option<RedisTls>,
}

/// The PEM files of a TLS redis.
#[derive(Clone, Debug)]
pub struct RedisTls {
    /// CA of the client certificates (and of the server's).
    pub ca: PathBuf,
    /// The server's certificate, also the test client's.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

/// One redis-server on 127.0.0.1 without persistence.
pub struct Redis {
    proc: Process,
    port: u16,
    options: RedisOptions,
    dir: TempDir,
}

impl Redis {
    /// Starts a redis-server without password; `None` (after printing why)
    /// when redis is not installed.
    pub fn start() -> Option<Redis> {
        Redis::start_with(RedisOptions::default())
    }

    /// Starts a redis-server with `options` and waits until it answers
    /// `PING`; `None` (after printing why) when redis is not installed.
    pub fn start_with(options: RedisOptions) -> Option<Redis> {
        let bin = find_binary("TE_REDIS_SERVER_BIN", "redis-server", "redis")?;
        for _ in 0..3 {
            let dir = TempDir::new("redis");
            let port = free_port();
            let mut args: Vec<OsString> = match &options.tls {
                None => vec!["--port".into(), port.to_string().into()],
                Some(t) => vec![
                    "--port".into(),
                    "0".into(),
                    "--tls-port".into(),
                    port.to_string().into(),
                    "--tls-cert-file".into(),
                    t.cert.clone().into(),
                    "--tls-key-file".into(),
                    t.key.clone().into(),
                    "--tls-ca-cert-file".into(),
                    t.ca.clone().into(),
                    "--tls-auth-clients".into(),
                    "yes".into(),
                ],
            };
            args.extend::<[OsString; 12]>([
                "--bind".into(),
                "127.0.0.1".into(),
                "--save".into(),
                "".into(),
                "--appendonly".into(),
                "no".into(),
                "--dir".into(),
                dir.path().into(),
                "--daemonize".into(),
                "no".into(),
                "--loglevel".into(),
                "warning".into(),
            ]);
            if let Some(p) = &options.password {
                args.extend(["--requirepass".into(), p.into()]);
            }
            if let Some((user, pass)) = &options.user {
                // One directive, its words as separate arguments.
                args.push("--user".into());
                args.extend(
                    [
                        user.as_str(),
                        "on",
                        &format!(">{pass}"),
                        "~*",
                        "&*",
                        "+@all",
                    ]
                    .map(OsString::from),
                );
            }
            let log = dir.path().join("redis.log");
            let mut redis = Redis {
                proc: Process::new("redis-server", bin.clone(), args, log),
                port,
                options: options.clone(),
                dir,
            };
            redis.proc.spawn();
            if redis.wait_ready() {
                return Some(redis);
            }
        }
        panic!("redis: no free port after 3 attempts");
    }

    fn wait_ready(&mut self) -> bool {
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        if self.options.tls.is_some() {
            // Its port is open once it serves.
            return self.proc.wait_ready(|| {
                TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            });
        }
        self.proc.wait_ready(|| {
            let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
                return false;
            };
            let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
            let mut reply = [0u8; 64];
            s.write_all(b"PING\r\n").is_ok()
                && s.read(&mut reply).is_ok_and(|n| {
                    reply[..n].starts_with(b"+PONG") || reply[..n].starts_with(b"-NOAUTH")
                })
        })
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address as `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The metadata connection string, `redis://127.0.0.1:<port>`
    /// (`rediss://` with TLS).
    pub fn conn_string(&self) -> String {
        let scheme = if self.options.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://{}", self.addr())
    }

    /// The temporary directory (output in `redis.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// An independent client connection on database `db`, authenticated as
    /// the default user when the server has a password — "another client"
    /// for raw reads and writes.
    pub fn client(&self, db: u8) -> redis::Connection {
        let auth = self
            .options
            .password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        let client = match &self.options.tls {
            None => redis::Client::open(format!("redis://{auth}127.0.0.1:{}/{db}", self.port)),
            Some(t) => {
                let read = |p: &PathBuf| std::fs::read(p).expect("read a PEM file");
                redis::Client::build_with_tls(
                    format!("rediss://{auth}127.0.0.1:{}/{db}", self.port),
                    redis::TlsCertificates {
                        client_tls: Some(redis::ClientTlsConfig {
                            client_cert: read(&t.cert),
                            client_key: read(&t.key),
                        }),
                        root_cert: Some(read(&t.ca)),
                    },
                )
            }
        };
        client
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("test client connects to redis")
    }

    /// Stops redis (SIGTERM, then SIGKILL). Nothing is persisted.
    pub fn stop(&mut self) {
        self.proc.stop();
    }

    /// Kills redis with SIGKILL.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Starts redis again on the same port (stopping it first if running)
    /// and waits until it answers; the data is gone.
    pub fn restart(&mut self) {
        self.proc.stop();
        self.proc.spawn();
        assert!(self.wait_ready(), "redis: port taken on restart");
    }
}
