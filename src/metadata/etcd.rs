//! The etcd metadata store: etcd's v3 key-value API through its JSON
//! gateway, over HTTP or HTTPS, with etcd's user authentication.
//!
//! Mooncake talks to etcd with the Go `clientv3` over gRPC; the data it
//! stores is the same whichever way it travels, so a Mooncake peer and this
//! engine share an etcd cluster. The gateway (`POST /v3/kv/range`,
//! `/v3/kv/put`, `/v3/kv/deleterange`, keys and values base64-encoded) is
//! served by every etcd 3.4+ on its client port (etcd 3.3 serves it under
//! `/v3beta/`, which is tried when `/v3/` answers 404). It needs no async
//! runtime inside the C library.
//!
//! Values are written as compact JSON with sorted keys followed by `"\n"`,
//! as Mooncake's `Json::FastWriter` does; any JSON text is accepted when
//! reading. Puts and deletes are plain (no lease), as in Mooncake.
//!
//! Timeouts: a connection attempt gives up after 1.5 s, a request to one
//! endpoint after 5 s (Mooncake's per-operation timeout), a whole operation
//! over all endpoints after 10 s. Endpoints are tried in order starting from
//! the last one that answered. Proxy variables (`http_proxy`…) are ignored:
//! etcd is reached directly.
//!
//! TLS: an endpoint written `https://host:port` is reached over TLS
//! (rustls), the server verified with the CA certificates of
//! `MC_ETCD_CACERT` (default: the system's), with the client certificate
//! of `MC_ETCD_CERT` and `MC_ETCD_KEY` when set (etcd's
//! `--client-cert-auth`). The names follow etcdctl's `--cacert`, `--cert`
//! and `--key`.
//!
//! Authentication: with `MC_ETCD_USERNAME` and `MC_ETCD_PASSWORD` the store
//! asks `/v3/auth/authenticate` for a token before its first request and
//! sends it in the `Authorization` header of every request, as etcd's
//! gateway expects. A token etcd no longer accepts (it expired, the user's
//! password or roles changed: "invalid auth token", "revision of auth
//! store is old") is replaced by a new one and the request sent once more,
//! as etcd's Go client does. A server with authentication off is used
//! without a token. Credentials in the connection string
//! (`etcd://user:pass@host`) are refused: connection strings are logged.

use super::client_tls::{ClientTls, TlsFiles};
use super::secret::Secret;
use super::store::MetadataStore;
use crate::error::{Error, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A connection attempt to one endpoint gives up after this long.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
/// A request to one endpoint gives up after this long (Mooncake: 5 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// One operation over all endpoints gives up after this long.
const OPERATION_BUDGET: Duration = Duration::from_secs(10);
/// An attempt is not started with less time than this left.
const MIN_ATTEMPT: Duration = Duration::from_millis(50);
/// Largest response accepted from etcd (values are base64 in JSON) unless
/// [`EtcdStore::limit_values`] says otherwise.
const MAX_BODY: u64 = 512 << 20;
/// Longest excerpt of an error body quoted in messages.
const MAX_ERROR_BODY: u64 = 512;
/// etcd's default client port, used for an endpoint written without one.
const DEFAULT_PORT: u16 = 2379;

/// The outcome of one request to one endpoint that did not succeed.
enum Failure {
    /// The endpoint could not be asked or did not answer properly: try the
    /// next endpoint.
    Unreachable(String),
    /// The endpoint answered and refused the request; another endpoint of
    /// the same cluster would refuse it too.
    Refused(String),
}

/// One etcd client endpoint and the gateway prefix it serves.
struct Endpoint {
    /// `host:port`.
    addr: String,
    /// Reached over TLS (`https://`).
    tls: bool,
    /// Set once the endpoint answered 404 on `/v3/` and served `/v3beta/`.
    beta: AtomicBool,
}

/// A metadata store kept in an etcd cluster (`etcd://h1:p1,h2:p2`).
pub struct EtcdStore {
    endpoints: Vec<Endpoint>,
    /// Index of the endpoint that answered last; tried first.
    preferred: AtomicUsize,
    agent: ureq::Agent,
    /// The TLS settings, when an endpoint is `https://`.
    tls: Option<ClientTls>,
    /// etcd's authentication, when configured.
    auth: Option<Auth>,
    /// Largest response read (a value of `max_value` bytes, in base64 and
    /// JSON).
    max_body: u64,
    /// Largest value accepted, for messages.
    max_value: u64,
}

/// etcd's user authentication: the credentials and the token they gave.
struct Auth {
    user: String,
    password: Secret,
    /// The token in use; the lock also makes one thread at a time ask for
    /// a new one.
    token: Mutex<Option<Arc<str>>>,
    /// Set when etcd answered that its authentication is off.
    off: AtomicBool,
}

/// Normalises one endpoint to `host:port` and whether it is `https://`:
/// strips `http://` or `https://` and a trailing `/`, adds port 2379 when
/// none is given.
fn normalise_endpoint(raw: &str) -> Result<(String, bool)> {
    let trimmed = raw.trim();
    let lower = trimmed.to_ascii_lowercase();
    let (rest, tls) = if lower.starts_with("https://") {
        (&trimmed["https://".len()..], true)
    } else if lower.starts_with("http://") {
        (&trimmed["http://".len()..], false)
    } else {
        (trimmed, false)
    };
    if rest.contains('@') {
        // Not quoted: it holds a password.
        return Err(Error::InvalidArgument(
            "an etcd endpoint carries credentials (user:password@); set MC_ETCD_USERNAME and \
             MC_ETCD_PASSWORD instead: connection strings are logged"
                .into(),
        ));
    }
    let with_port = |addr: String| Ok((addr, tls));
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || rest.chars().any(char::is_whitespace) {
        return Err(Error::InvalidArgument(format!(
            "etcd endpoint {raw:?} is not host:port"
        )));
    }
    // `host`, `[v6]` and bare IPv6 addresses get the default port.
    let has_port = match rest.rfind(':') {
        None => false,
        Some(i) if rest.starts_with('[') => rest[..i].ends_with(']'),
        Some(i) => rest[..i].find(':').is_none(),
    };
    if !has_port {
        if rest.contains(':') && !rest.starts_with('[') {
            return with_port(format!("[{rest}]:{DEFAULT_PORT}"));
        }
        return with_port(format!("{rest}:{DEFAULT_PORT}"));
    }
    let port = &rest[rest.rfind(':').map_or(rest.len(), |i| i + 1)..];
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(Error::InvalidArgument(format!(
            "etcd endpoint {raw:?}: port {port:?} is not a number in 1..=65535"
        )));
    }
    with_port(rest.to_string())
}

/// The text of a gateway error body: its `message` (or `error`) field, or
/// the start of the body.
fn gateway_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        for field in ["message", "error"] {
            if let Some(m) = v.get(field).and_then(Value::as_str) {
                return m.to_string();
            }
        }
    }
    String::from_utf8_lossy(body).trim().to_string()
}

impl EtcdStore {
    /// A store on the etcd cluster reachable at `endpoints` (`host:port`
    /// each, as parsed from `etcd://h1:p1,h2:p2` or `h1:p1;h2:p2`; an
    /// `http://` prefix is accepted, a missing port means 2379), without
    /// authentication; `https://` endpoints are verified with the system's
    /// CA certificates. Nothing is contacted here. No endpoint is
    /// [`Error::InvalidArgument`].
    pub fn new(endpoints: &[String]) -> Result<EtcdStore> {
        Self::from_config(endpoints, &super::StoreConfig::default())
    }

    /// [`EtcdStore::new`] with the credentials (`MC_ETCD_USERNAME`,
    /// `MC_ETCD_PASSWORD`) and TLS files (`MC_ETCD_CACERT`, `MC_ETCD_CERT`,
    /// `MC_ETCD_KEY`) of `c`. The TLS files are read here when an endpoint
    /// is `https://`; one that cannot be read or parsed is
    /// [`Error::InvalidArgument`].
    pub fn from_config(endpoints: &[String], c: &super::StoreConfig) -> Result<EtcdStore> {
        let endpoints = endpoints
            .iter()
            .map(|e| {
                normalise_endpoint(e).map(|(addr, tls)| Endpoint {
                    addr,
                    tls,
                    beta: AtomicBool::new(false),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if endpoints.is_empty() {
            return Err(Error::InvalidArgument(
                "no etcd endpoint given; use etcd://host:port[,host:port...]".into(),
            ));
        }
        let tls = if endpoints.iter().any(|e| e.tls) {
            Some(c.etcd_tls.load("MC_ETCD")?)
        } else {
            if c.etcd_tls != TlsFiles::default() {
                tracing::warn!(
                    "MC_ETCD_CACERT, MC_ETCD_CERT or MC_ETCD_KEY is set but no etcd endpoint is \
                     https://; they are not used"
                );
            }
            None
        };
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(REQUEST_TIMEOUT));
        if let Some(t) = &tls {
            config = config.tls_config(t.ureq_config());
        }
        let auth = c.etcd_auth.as_ref().map(|(user, password)| Auth {
            user: user.clone(),
            password: password.clone(),
            token: Mutex::new(None),
            off: AtomicBool::new(false),
        });
        Ok(EtcdStore {
            endpoints,
            preferred: AtomicUsize::new(0),
            agent: config.build().into(),
            tls,
            auth,
            max_body: MAX_BODY,
            max_value: MAX_BODY / 4 * 3,
        })
    }

    /// Refuses values larger than about `bytes` (a get of one fails with
    /// [`Error::Metadata`] without reading it all).
    pub fn limit_values(mut self, bytes: u64) -> EtcdStore {
        self.max_value = bytes;
        self.max_body = bytes.saturating_add(2).div_ceil(3).saturating_mul(4) + (4 << 10);
        self
    }

    /// The endpoints as `host:port` (`https://host:port` for TLS), in the
    /// order given.
    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints
            .iter()
            .map(|e| match e.tls {
                true => format!("https://{}", e.addr),
                false => e.addr.clone(),
            })
            .collect()
    }

    /// Sends `body` to `/<prefix>/kv/<op>` of every endpoint in turn until
    /// one answers 200; returns its JSON answer. `what` names the operation
    /// in messages (e.g. `get of mooncake/ram/x`).
    fn call(&self, op: &str, body: &Value, what: &str) -> Result<Value> {
        let body = serde_json::to_vec(body).map_err(|e| {
            Error::MalformedJson(format!("etcd {what}: cannot encode request: {e}"))
        })?;
        let start = Instant::now();
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut errors = Vec::with_capacity(n);
        for k in 0..n {
            let idx = (first + k) % n;
            let ep = &self.endpoints[idx];
            let left = OPERATION_BUDGET.saturating_sub(start.elapsed());
            if left < MIN_ATTEMPT {
                errors.push(format!("{}: not tried, out of time", ep.addr));
                continue;
            }
            match self.attempt(ep, op, &body, left.min(REQUEST_TIMEOUT)) {
                Ok(v) => {
                    if idx != first {
                        tracing::info!(endpoint = %ep.addr, "etcd: failed over to this endpoint");
                    }
                    self.preferred.store(idx, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(Failure::Refused(msg)) => {
                    crate::log_limit::warn_limited!(
                        "etcd refused the request: endpoint={} what={what} error={msg}",
                        ep.addr
                    );
                    return Err(Error::Metadata(format!(
                        "etcd {what}: {} refused it: {msg}",
                        ep.addr
                    )));
                }
                Err(Failure::Unreachable(msg)) => {
                    crate::log_limit::warn_limited!(
                        "etcd endpoint failed: endpoint={} what={what} error={msg}",
                        ep.addr
                    );
                    errors.push(format!("{}: {msg}", ep.addr));
                }
            }
        }
        Err(Error::Metadata(format!(
            "etcd {what} failed on every endpoint ({}); check that etcd is running and its \
             client port is reachable from this host",
            errors.join("; ")
        )))
    }

    /// One request to `kv/<op>` of one endpoint, with the authentication
    /// token when credentials are configured; a token etcd no longer
    /// accepts is replaced and the request sent once more.
    fn attempt(
        &self,
        ep: &Endpoint,
        op: &str,
        body: &[u8],
        timeout: Duration,
    ) -> std::result::Result<Value, Failure> {
        let deadline = Instant::now() + timeout;
        let path = format!("kv/{op}");
        for round in 0..2 {
            let token = self.token(ep, deadline)?;
            let msg = match self.post(ep, &path, body, deadline, token.as_deref()) {
                Err(Failure::Refused(msg)) if is_token_refusal(&msg) => msg,
                other => return other.map_err(|f| self.hint(f)),
            };
            let Some(auth) = &self.auth else {
                return Err(Failure::Refused(format!(
                    "{msg}; etcd has authentication on: set MC_ETCD_USERNAME and \
                     MC_ETCD_PASSWORD"
                )));
            };
            if round == 1 {
                return Err(Failure::Refused(format!(
                    "{msg} (with a new token of user {:?})",
                    auth.user
                )));
            }
            tracing::debug!(endpoint = %ep.addr, error = %msg, "etcd refused the token; authenticating again");
            auth.forget(token.as_ref());
        }
        Err(Failure::Unreachable("no attempt made".into()))
    }

    /// A refusal with what to check added.
    fn hint(&self, f: Failure) -> Failure {
        match f {
            Failure::Refused(msg) if msg.contains("permission denied") => {
                let who = self
                    .auth
                    .as_ref()
                    .map_or("the user".to_string(), |a| format!("user {:?}", a.user));
                Failure::Refused(format!(
                    "{msg}; {who} needs a role with readwrite permission on the metadata keys \
                     (the key prefix mooncake/)"
                ))
            }
            f => f,
        }
    }

    /// The token to send to `ep`: the one in use, or a new one from
    /// `/v3/auth/authenticate`; `None` without credentials or when etcd's
    /// authentication is off.
    fn token(
        &self,
        ep: &Endpoint,
        deadline: Instant,
    ) -> std::result::Result<Option<Arc<str>>, Failure> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let mut token = crate::sync::lock(&auth.token);
        if let Some(t) = &*token {
            return Ok(Some(t.clone()));
        }
        if auth.off.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let body = json!({ "name": auth.user, "password": auth.password.expose() });
        let body = serde_json::to_vec(&body)
            .map_err(|e| Failure::Refused(format!("cannot encode the authentication: {e}")))?;
        match self.post(ep, "auth/authenticate", &body, deadline, None) {
            Ok(answer) => match answer.get("token").and_then(Value::as_str) {
                Some(t) if !t.is_empty() => {
                    tracing::debug!(endpoint = %ep.addr, user = %auth.user, "etcd: authenticated");
                    let t: Arc<str> = Arc::from(t);
                    *token = Some(t.clone());
                    Ok(Some(t))
                }
                _ => Err(Failure::Unreachable(format!(
                    "{}: the authentication answer has no token",
                    ep.addr
                ))),
            },
            Err(Failure::Refused(msg)) if msg.contains("authentication is not enabled") => {
                tracing::info!(
                    endpoint = %ep.addr,
                    "etcd has authentication off; MC_ETCD_USERNAME and MC_ETCD_PASSWORD are \
                     not used"
                );
                auth.off.store(true, Ordering::Relaxed);
                Ok(None)
            }
            Err(Failure::Refused(msg)) => Err(Failure::Refused(format!(
                "authentication as user {:?} failed: {msg}; check MC_ETCD_USERNAME and \
                 MC_ETCD_PASSWORD",
                auth.user
            ))),
            Err(f) => Err(f),
        }
    }

    /// POSTs `body` to `/<prefix>/<path>` of one endpoint, on the gateway
    /// prefix it served last (`/v3/` at first), switching to the other
    /// prefix on a 404; sends `token` in the `Authorization` header.
    fn post(
        &self,
        ep: &Endpoint,
        path: &str,
        body: &[u8],
        deadline: Instant,
        token: Option<&str>,
    ) -> std::result::Result<Value, Failure> {
        let first_beta = ep.beta.load(Ordering::Relaxed);
        let scheme = if ep.tls { "https" } else { "http" };
        for beta in [first_beta, !first_beta] {
            let prefix = if beta { "v3beta" } else { "v3" };
            let url = format!("{scheme}://{}/{prefix}/{path}", ep.addr);
            let left = deadline.saturating_duration_since(Instant::now());
            if left < MIN_ATTEMPT {
                return Err(Failure::Unreachable(format!("POST {url}: out of time")));
            }
            let mut req = self
                .agent
                .post(&url)
                .config()
                .timeout_global(Some(left))
                .build()
                .header("Content-Type", "application/json");
            if let Some(t) = token {
                req = req.header("Authorization", t);
            }
            let mut resp = req
                .send(body)
                .map_err(|e| Failure::Unreachable(self.describe_ureq(&url, e)))?;
            let status = resp.status().as_u16();
            if status == 404 {
                tracing::debug!(endpoint = %ep.addr, %url, "etcd gateway path answered 404");
                continue;
            }
            if beta != first_beta {
                ep.beta.store(beta, Ordering::Relaxed);
            }
            if status == 200 {
                let bytes = resp
                    .body_mut()
                    .with_config()
                    .limit(self.max_body)
                    .read_to_vec()
                    .map_err(|e| match e {
                        ureq::Error::BodyExceedsLimit(_) => Failure::Refused(format!(
                            "POST {url}: the value is larger than {} bytes \
                             (MC_PEER_MAX_DESCRIPTOR_BYTES)",
                            self.max_value
                        )),
                        e => Failure::Unreachable(self.describe_ureq(&url, e)),
                    })?;
                return serde_json::from_slice(&bytes).map_err(|e| {
                    Failure::Unreachable(format!(
                        "POST {url}: answer is not JSON ({e}); is this an etcd client port?"
                    ))
                });
            }
            let text = resp
                .body_mut()
                .with_config()
                .limit(MAX_ERROR_BODY)
                .read_to_vec()
                .map(|b| gateway_message(&b))
                .unwrap_or_default();
            let mut msg = format!("POST {url}: HTTP {status}: {text}");
            if text.contains("larger than max") || text.contains("too large") {
                msg.push_str(
                    "; the value exceeds etcd's request limit: raise etcd's --max-request-bytes",
                );
            }
            if text.contains("CommonName of client") {
                msg.push_str(
                    "; with --client-cert-auth etcd's JSON gateway, which this client uses, \
                     refuses client certificates that carry a CommonName: give MC_ETCD_CERT a \
                     certificate without one (subjectAltName only), and name the user with \
                     MC_ETCD_USERNAME and MC_ETCD_PASSWORD",
                );
            }
            // 5xx: this member cannot serve (no leader, stopping…); another
            // member may. 4xx: the request itself is wrong.
            return Err(if status >= 500 {
                Failure::Unreachable(msg)
            } else {
                Failure::Refused(msg)
            });
        }
        Err(Failure::Unreachable(format!(
            "HTTP 404 on both /v3/{path} and /v3beta/{path}; this is not the client port \
             of etcd 3.3 or newer"
        )))
    }

    /// A transport failure of `POST url` in words, with what a TLS failure
    /// means.
    fn describe_ureq(&self, url: &str, e: ureq::Error) -> String {
        match self.tls.as_ref().and_then(|t| t.explain_ureq(&e)) {
            Some(why) => format!("POST {url}: {why}"),
            None => describe_ureq(url, e),
        }
    }
}

impl Auth {
    /// Drops `failed` if it is still the token in use.
    fn forget(&self, failed: Option<&Arc<str>>) {
        let mut token = crate::sync::lock(&self.token);
        match failed {
            Some(f) if token.as_ref() == Some(f) => *token = None,
            Some(_) => {}
            // Sent without a token because authentication was off: it is
            // on now.
            None => self.off.store(false, Ordering::Relaxed),
        }
    }
}

/// Whether an etcd refusal is about the token: expired or unknown, issued
/// before the users or roles changed, or missing where authentication is
/// on.
fn is_token_refusal(msg: &str) -> bool {
    [
        "invalid auth token",
        "revision of auth store is old",
        "user name is empty",
    ]
    .iter()
    .any(|m| msg.contains(m))
        || msg.contains("HTTP 401")
}

/// A transport failure of `POST url` in words.
fn describe_ureq(url: &str, e: ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(ureq::Timeout::Connect) => format!(
            "POST {url}: no connection within {} s",
            CONNECT_TIMEOUT.as_secs_f32()
        ),
        ureq::Error::Timeout(_) => format!(
            "POST {url}: no answer within {} s",
            REQUEST_TIMEOUT.as_secs_f32()
        ),
        ureq::Error::HostNotFound => format!("POST {url}: cannot resolve the host"),
        ureq::Error::ConnectionFailed => format!("POST {url}: connection failed"),
        other => format!("POST {url}: {other}"),
    }
}

impl MetadataStore for EtcdStore {
    fn get(&self, key: &str) -> Result<Option<Value>> {
        let what = format!("get of {key}");
        let answer = self.call("range", &json!({ "key": B64.encode(key) }), &what)?;
        let kv = match answer.get("kvs") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(kvs)) => match kvs.first() {
                None => return Ok(None),
                Some(kv) => kv,
            },
            Some(other) => {
                return Err(Error::MalformedJson(format!(
                    "etcd {what}: \"kvs\" is not an array: {other}"
                )));
            }
        };
        // An empty value is omitted by the gateway.
        let encoded = match kv.get("value") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(Error::MalformedJson(format!(
                    "etcd {what}: \"value\" is not a base64 string: {other}"
                )));
            }
        };
        let bytes = B64.decode(encoded).map_err(|e| {
            Error::MalformedJson(format!("etcd {what}: value is not valid base64: {e}"))
        })?;
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::MalformedJson(format!(
                "etcd {what}: the stored value is not JSON ({e}); it was not written by a \
                 transfer engine — delete or rewrite the key"
            ))
        })
    }

    fn set(&self, key: &str, value: &Value) -> Result<()> {
        let mut text = serde_json::to_string(value)
            .map_err(|e| Error::MalformedJson(format!("cannot serialize value of {key}: {e}")))?;
        text.push('\n');
        let body = json!({ "key": B64.encode(key), "value": B64.encode(text) });
        self.call("put", &body, &format!("put of {key}")).map(drop)
    }

    fn remove(&self, key: &str) -> Result<()> {
        self.call(
            "deleterange",
            &json!({ "key": B64.encode(key) }),
            &format!("delete of {key}"),
        )
        .map(drop)
    }

    fn describe(&self) -> String {
        let scheme = if self.tls.is_some() { "" } else { "etcd://" };
        format!("etcd store at {scheme}{}", self.endpoints().join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_normalised() {
        let ok = |s: &str| normalise_endpoint(s).unwrap().0;
        assert_eq!(ok("10.0.0.1:2379"), "10.0.0.1:2379");
        assert_eq!(ok(" http://h:1234/ "), "h:1234");
        assert_eq!(ok("h"), "h:2379");
        assert_eq!(ok("[::1]:23"), "[::1]:23");
        assert_eq!(ok("[::1]"), "[::1]:2379");
        assert_eq!(ok("::1"), "[::1]:2379");
        assert_eq!(
            normalise_endpoint("HTTPS://h:2380/").unwrap(),
            ("h:2380".to_string(), true)
        );
        assert!(!normalise_endpoint("http://h").unwrap().1);
        let e = normalise_endpoint("https://root:pa55word@h:2379").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if !m.contains("pa55word")),
            "{e:?}"
        );
        for bad in ["", "h:x", "h:0", "h:70000", "h:1/path", "a b:1"] {
            assert!(
                matches!(normalise_endpoint(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn new_needs_an_endpoint() {
        assert!(matches!(
            EtcdStore::new(&[]),
            Err(Error::InvalidArgument(_))
        ));
        let s = EtcdStore::new(&["a:1".into(), "b".into()]).unwrap();
        assert_eq!(s.describe(), "etcd store at etcd://a:1,b:2379");
    }

    #[test]
    fn gateway_errors_are_quoted() {
        assert_eq!(
            gateway_message(br#"{"error":"x","message":"etcdserver: no leader","code":14}"#),
            "etcdserver: no leader"
        );
        assert_eq!(
            gateway_message(b"404 page not found\n"),
            "404 page not found"
        );
    }

    #[test]
    fn dead_endpoints_fail_with_every_name() {
        // Port 1 on localhost refuses at once.
        let s = EtcdStore::new(&["127.0.0.1:1".into(), "127.0.0.1:2".into()]).unwrap();
        let e = s.get("k").unwrap_err();
        let Error::Metadata(msg) = &e else {
            panic!("{e:?}")
        };
        assert!(
            msg.contains("127.0.0.1:1") && msg.contains("127.0.0.1:2"),
            "{msg}"
        );
    }
}
