//! An HTTP metadata server speaking the protocol of Mooncake's Go server
//! (`example/http-metadata-server/main.go`), with data that survives a
//! restart.
//!
//! Routes, on one configurable path (default `/metadata`):
//! * `GET <path>?key=K` — 200 with the stored body, 404 `metadata not found`;
//! * `PUT <path>?key=K` — stores the request body as is (overwriting), 200;
//! * `DELETE <path>?key=K` — 200, also for an absent key.
//!
//! A missing `key` parameter is 400, another method 405, another path 404,
//! a body over the limit 413, a PUT that would take the store beyond its
//! bounds of keys or bytes 507. Unlike the Go server, every change is on
//! disk (`journal`: a snapshot in the data file, a JSON object of key to
//! stored body, and a log of changes beside it) before the answer goes
//! out, and the data is loaded at start.
//!
//! Access: with tokens ([`ServerOptions::auth_tokens`], `--auth-token-file
//! FILE[,FILE]`: two while a token is being replaced) PUT and DELETE need
//! `Authorization: Bearer <one of them>`, and GET too with
//! [`ServerOptions::auth_read`] (`--auth-read`); anything else is answered
//! 401 as soon as its head is read, its body unread, and the connection
//! closed, with one rate-limited log line naming the client and the reason
//! (never the token). Tokens are compared in constant time. With a
//! certificate and key ([`ServerOptions::tls_cert`], `--tls-cert`,
//! `--tls-key`) the server speaks HTTPS only (TLS 1.2 and 1.3, rustls).
//!
//! The server is event-driven (`crate::serve`): one thread reads the
//! requests of every connection, each with a deadline, and a few threads
//! answer complete ones, so slow or silent clients cannot hold up others.
//! Connections are kept alive between requests (HTTP/1.1). A value is sent
//! from the store's copy, shared by every client reading it; when the
//! replies waiting for their clients fill `--max-buffered`, the client
//! stalled longest is closed, and a reply that still does not fit is a 503.

mod journal;
mod store;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::http1;
use super::secret::Secret;
use crate::serve::{self, Dispatch, Parse, Reply, Service, Then};
use store::{Refused, Store};

/// Bounds of a [`MetadataServer`] (the command-line flags of
/// `transfer-engine-metadata-server`).
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Largest `PUT` body; a larger one is answered 413 (`--max-body`,
    /// 64 MiB), as is a request larger as sent (head, body and chunk
    /// framing) than this, an eighth of it, and 80 KiB.
    pub max_body: usize,
    /// Connections open at once (`--max-connections`, 1024). At the bound a
    /// new connection closes the one that has waited longest for its
    /// client (idle, sending a request, or not taking its reply); when all
    /// have requests being answered, new ones wait in the backlog.
    pub max_connections: usize,
    /// Deadline for a whole request (head and body) from the connection's
    /// start or its previous response, and for sending a response
    /// (`--timeout`, 30 s). An idle kept-alive connection closes after it.
    pub timeout: Duration,
    /// Threads that answer complete requests (`--workers`, 4).
    pub workers: usize,
    /// Bytes of requests and responses held across all connections
    /// (`--max-buffered`, 256 MiB; at least one largest request). A value
    /// sent to several clients at once counts once. At the bound the client
    /// stalled longest is closed.
    pub max_buffered: usize,
    /// Keys stored at once (`--max-keys`, 100000); a PUT of a new key
    /// beyond is answered 507.
    pub max_keys: usize,
    /// Bytes of keys and values stored at once (`--max-total-bytes`,
    /// 1 GiB); a PUT that would grow the store beyond is answered 507.
    pub max_total_bytes: usize,
    /// The bearer tokens PUT and DELETE accept, any of them
    /// (`--auth-token-file FILE[,FILE]`; none: anyone may write). `Debug`
    /// does not show them.
    pub auth_tokens: Vec<Secret>,
    /// GET needs a token too (`--auth-read`; needs
    /// [`ServerOptions::auth_tokens`]).
    pub auth_read: bool,
    /// PEM certificate chain served over TLS (`--tls-cert`, with
    /// [`ServerOptions::tls_key`]; none: plain HTTP).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of [`ServerOptions::tls_cert`] (`--tls-key`).
    pub tls_key: Option<PathBuf>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_body: 64 << 20,
            max_connections: 1024,
            timeout: Duration::from_secs(30),
            workers: 4,
            max_buffered: 256 << 20,
            max_keys: 100_000,
            max_total_bytes: 1 << 30,
            auth_tokens: Vec::new(),
            auth_read: false,
            tls_cert: None,
            tls_key: None,
        }
    }
}

/// A running metadata server; stops on [`MetadataServer::shutdown`] or drop.
pub struct MetadataServer {
    server: serve::Server,
    addr: SocketAddr,
    path: String,
    /// Serving HTTPS.
    tls: bool,
}

/// The TLS settings of `--tls-cert` and `--tls-key`: both or neither; a
/// file that cannot be read, holds no certificate or no key, or a key that
/// does not match the certificate is `InvalidInput`.
fn server_tls(opts: &ServerOptions) -> io::Result<Option<Arc<rustls::ServerConfig>>> {
    use super::client_tls::{certificates, private_key, provider, read_pem};
    let bad = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    let (cert, key) = match (&opts.tls_cert, &opts.tls_key) {
        (None, None) => return Ok(None),
        (Some(c), Some(k)) => (c, k),
        _ => return Err(bad("--tls-cert and --tls-key go together".into())),
    };
    let read = |flag: &str, path: &PathBuf| read_pem(flag, path).map_err(bad);
    let chain = certificates("--tls-cert", cert, &read("--tls-cert", cert)?)
        .map_err(|e| bad(e.to_string()))?;
    let key =
        private_key("--tls-key", key, &read("--tls-key", key)?).map_err(|e| bad(e.to_string()))?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS setup: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| {
            bad(format!(
                "--tls-cert={} with --tls-key={}: not a usable certificate and key: {e}",
                cert.display(),
                opts.tls_key.as_deref().unwrap_or(cert).display()
            ))
        })?;
    Ok(Some(Arc::new(config)))
}

impl MetadataServer {
    /// Loads `data_file` and its log (if given and present) and serves on
    /// `addr` (e.g. `127.0.0.1:0` for any free port) under `path` (e.g.
    /// `/metadata`; a missing leading `/` is added), with the default
    /// [`ServerOptions`].
    /// Fails if the address cannot be bound or the data file cannot be read
    /// or parsed.
    pub fn start(addr: &str, path: &str, data_file: Option<PathBuf>) -> io::Result<MetadataServer> {
        Self::start_with(addr, path, data_file, ServerOptions::default())
    }

    /// [`MetadataServer::start`] with explicit bounds.
    pub fn start_with(
        addr: &str,
        path: &str,
        data_file: Option<PathBuf>,
        opts: ServerOptions,
    ) -> io::Result<MetadataServer> {
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        if opts.auth_read && opts.auth_tokens.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--auth-read needs --auth-token-file",
            ));
        }
        let tls = server_tls(&opts)?;
        let store = Store::load(
            data_file,
            store::Limits {
                max_keys: opts.max_keys,
                max_bytes: opts.max_total_bytes,
            },
        )?;
        // The connection bound, not the usual 1024 descriptors, limits
        // clients.
        crate::fd_limit::raise();
        let listener = TcpListener::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        let local = listener.local_addr()?;
        let limits = http1::Limits::new(opts.max_body);
        // One largest request (its body, and a head or a chunk in progress
        // with a read beyond), or reply, always fits.
        let min_buffered = opts
            .max_body
            .saturating_add(http1::MAX_HEAD)
            .saturating_add(128 << 10);
        let serve_opts = serve::Options {
            max_connections: opts.max_connections.max(1),
            request_timeout: opts.timeout,
            write_timeout: opts.timeout,
            linger_timeout: opts.timeout.min(Duration::from_secs(5)),
            max_buffered: opts.max_buffered.max(min_buffered),
            workers: opts.workers.max(1),
            thread_name: "te-meta",
            tls: tls.clone(),
        };
        let service = Arc::new(Http {
            store,
            path: path.clone(),
            limits,
            opts: opts.clone(),
        });
        let server = serve::Server::start(listener, service, serve_opts)?;
        tracing::info!(addr = %local, %path, ?opts, "metadata server started");
        Ok(MetadataServer {
            server,
            addr: local,
            path,
            tls: tls.is_some(),
        })
    }

    /// The address the server listens on (with the real port when started
    /// on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connection string clients use, e.g. `http://127.0.0.1:8080/metadata`
    /// (`https://` when serving TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{}", self.addr, self.path)
    }

    /// Stops accepting requests, lets the workers finish the request they
    /// are answering, and joins them.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for MetadataServer {
    fn drop(&mut self) {
        self.server.shutdown();
        tracing::info!(addr = %self.addr, "metadata server stopped");
    }
}

/// The metadata protocol as a [`Service`].
struct Http {
    store: Store,
    path: String,
    limits: http1::Limits,
    opts: ServerOptions,
}

/// The body of an answer.
enum Body {
    /// A fixed message.
    Text(&'static str),
    /// A stored value, shared with the store.
    Value(Arc<str>),
}

impl Service for Http {
    type Request = http1::Request;
    type Parser = http1::Parser;
    const NAME: &'static str = "metadata server";
    const SETTINGS: serve::Settings = serve::Settings {
        connections: "--max-connections",
        buffered: "--max-buffered",
        timeout: "--timeout",
    };

    fn parse(&self, parser: &mut http1::Parser, buf: &mut Vec<u8>) -> Parse<http1::Request> {
        http1::parse(parser, buf, self.limits, &|method, authorization| {
            self.admit(method, authorization)
        })
    }

    fn dispatch(&self, request: http1::Request) -> Dispatch<http1::Request> {
        Dispatch::Work(request)
    }

    fn handle(&self, _peer: SocketAddr, req: http1::Request) -> Result<Reply, String> {
        let (status, body) = self.answer(req.method, &req.target, req.body);
        let then = if req.keep_alive {
            Then::KeepAlive
        } else {
            Then::Linger
        };
        Ok(match body {
            Body::Text(text) => Reply::owned(
                http1::response(status, text.as_bytes(), req.keep_alive),
                then,
            ),
            Body::Value(value) => Reply {
                bytes: http1::response_head(status, value.len(), req.keep_alive),
                shared: Some(Arc::from(value)),
                then,
            },
        })
    }

    fn refusal(&self) -> Option<Reply> {
        Some(Reply::owned(
            http1::response(503, b"server busy", false),
            Then::Linger,
        ))
    }
}

impl Http {
    /// Whether a request of `method` with the `Authorization` value
    /// `authorization` may go on: `Err` says why not, without quoting it.
    fn admit(&self, method: &str, authorization: Option<&[u8]>) -> Result<(), String> {
        let tokens = &self.opts.auth_tokens;
        if tokens.is_empty() || (method == "GET" && !self.opts.auth_read) {
            return Ok(());
        }
        let Some(value) = authorization else {
            return Err(format!(
                "{method} without a token (no Authorization header): 401"
            ));
        };
        let presented = value
            .split_at_checked(7)
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(b"bearer "))
            .map(|(_, rest)| rest.trim_ascii());
        match presented {
            None => Err(format!(
                "{method} with an Authorization header that is not \"Bearer <token>\": 401"
            )),
            // Every token is compared, so the time says not which matched.
            Some(t) if tokens.iter().fold(false, |any, k| k.matches(t) | any) => Ok(()),
            Some(_) => Err(format!("{method} with a wrong bearer token: 401")),
        }
    }

    /// Status and body of the answer to one request.
    fn answer(&self, method: String, target: &str, body: Vec<u8>) -> (u16, Body) {
        let (req_path, query) = target.split_once('?').unwrap_or((target, ""));
        if req_path != self.path {
            return (404, Body::Text("not found"));
        }
        if !matches!(method.as_str(), "GET" | "PUT" | "DELETE") {
            return (405, Body::Text("method not allowed"));
        }
        let Some(key) = query_key(query) else {
            return (400, Body::Text("missing key"));
        };
        let change = match method.as_str() {
            "GET" => {
                return match self.store.get(&key) {
                    Some(v) => (200, Body::Value(v)),
                    None => (404, Body::Text("metadata not found")),
                };
            }
            "PUT" => match String::from_utf8(body) {
                Ok(value) => Some(Arc::from(value)),
                Err(_) => return (400, Body::Text("value is not UTF-8")),
            },
            _ => None,
        };
        let put = change.is_some();
        match self.store.update(&key, change) {
            Ok(()) if put => {
                tracing::debug!(%key, "metadata updated");
                (200, Body::Text("metadata updated"))
            }
            Ok(()) => {
                tracing::debug!(%key, "metadata deleted");
                (200, Body::Text("metadata deleted"))
            }
            Err(Refused::Io(e)) => {
                crate::log_limit::log_limited!(error, "cannot persist metadata {key:?}: {e}");
                (500, Body::Text("cannot persist metadata"))
            }
            Err(Refused::Keys) => self.full(&key, "a new key"),
            Err(Refused::Bytes) => self.full(&key, "more bytes"),
        }
    }

    /// The answer to a PUT refused at the store's bounds.
    fn full(&self, key: &str, what: &str) -> (u16, Body) {
        let (keys, bytes) = self.store.usage();
        crate::log_limit::warn_limited!(
            "metadata store full ({keys} keys, the limit --max-keys is {}; {bytes} bytes, the \
             limit --max-total-bytes is {}): PUT of {key:.128?} needing {what} refused (507)",
            self.opts.max_keys,
            self.opts.max_total_bytes
        );
        (507, Body::Text("metadata store full"))
    }
}

/// The `key` query parameter, decoded as Go's `url.Query().Get` does
/// (`+` is a space); `None` when absent or not UTF-8.
fn query_key(query: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "key" {
            return None;
        }
        let value = value.replace('+', " ");
        percent_encoding::percent_decode_str(&value)
            .decode_utf8()
            .ok()
            .map(|s| s.into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_keys() {
        assert_eq!(
            query_key("key=mooncake%2Fram%2F10.0.0.5%3A12345").as_deref(),
            Some("mooncake/ram/10.0.0.5:12345")
        );
        assert_eq!(query_key("a=1&key=x+y").as_deref(), Some("x y"));
        assert_eq!(query_key("key=").as_deref(), Some(""));
        assert_eq!(query_key("keys=1"), None);
        assert_eq!(query_key(""), None);
        assert_eq!(query_key("key=%FF"), None);
    }
}
