//! `GET /metrics` over HTTP/1.1 on `MC_TE_METRICS_ADDR`: a [`Service`] of
//! the control plane's event loop ([`crate::serve`]), bounded by the
//! handshake listener's settings (connections, buffered bytes, the
//! deadline of a request and of its reply). A request is a head only (16
//! KiB at most, no body); every other path or method is answered 404.
//! The server holds the engine weakly and stops when it is destroyed.

use super::super::Engine;
use crate::error::{Error, Result};
use crate::metadata::http1;
use crate::rpc::RpcConfig;
use crate::serve::{self, Dispatch, Parse, Reply, Service, Then};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The content type of the Prometheus text format.
const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// The metrics endpoint of one engine, served until dropped.
pub(crate) struct MetricsServer {
    server: serve::Server,
    addr: SocketAddr,
}

impl MetricsServer {
    /// Listens on `addr` and serves `engine`'s metrics, bounded by `rpc`'s
    /// settings; an address that cannot be listened on is an error naming
    /// it.
    pub(crate) fn start(
        addr: SocketAddr,
        engine: Weak<Engine>,
        rpc: &RpcConfig,
    ) -> Result<MetricsServer> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            Error::Socket(format!(
                "MC_TE_METRICS_ADDR={addr}: cannot listen there: {e}"
            ))
        })?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::Socket(format!("MC_TE_METRICS_ADDR={addr}: {e}")))?;
        let timeout = Duration::from_secs(rpc.io_timeout_secs);
        let opts = serve::Options {
            max_connections: rpc.max_connections,
            request_timeout: timeout,
            write_timeout: timeout,
            linger_timeout: timeout,
            max_buffered: usize::try_from(rpc.max_buffered).unwrap_or(usize::MAX),
            workers: 1,
            thread_name: "te-metrics-http",
            tls: None,
        };
        let service = Arc::new(Exposition { engine });
        let server = serve::Server::start(listener, service, opts).map_err(|e| {
            Error::Socket(format!(
                "MC_TE_METRICS_ADDR={addr}: the metrics endpoint could not start: {e}"
            ))
        })?;
        tracing::info!(addr = %local, "metrics endpoint started (GET /metrics)");
        Ok(MetricsServer {
            server,
            addr: local,
        })
    }

    /// The address it listens on (the real port when asked for port 0).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops it and joins its threads.
    pub(crate) fn shutdown(&self) {
        self.server.shutdown();
    }
}

/// `GET /metrics` as a [`Service`].
struct Exposition {
    engine: Weak<Engine>,
}

/// Requests carry no body.
const LIMITS: http1::Limits = http1::Limits::new(0);

impl Service for Exposition {
    type Request = http1::Request;
    type Parser = http1::Parser;
    const NAME: &'static str = "metrics endpoint";
    const SETTINGS: serve::Settings = serve::Settings {
        connections: "MC_HANDSHAKE_MAX_CONNECTIONS",
        buffered: "MC_HANDSHAKE_MAX_BUFFERED",
        timeout: "MC_HANDSHAKE_IO_TIMEOUT",
    };

    fn parse(&self, parser: &mut http1::Parser, buf: &mut Vec<u8>) -> Parse<http1::Request> {
        http1::parse(parser, buf, LIMITS, &|_, _| Ok(()))
    }

    fn dispatch(&self, request: http1::Request) -> Dispatch<http1::Request> {
        let path = request.target.split('?').next().unwrap_or_default();
        if request.method == "GET" && path == "/metrics" {
            return Dispatch::Work(request);
        }
        const NOT_FOUND: &[u8] = b"not found: the metrics are at GET /metrics\n";
        let mut bytes = http1::typed_head(404, "text/plain", NOT_FOUND.len(), request.keep_alive);
        bytes.extend_from_slice(NOT_FOUND);
        Dispatch::Reply(Reply::owned(bytes, then(request.keep_alive)))
    }

    fn handle(&self, _peer: SocketAddr, req: http1::Request) -> std::result::Result<Reply, String> {
        let engine = self
            .engine
            .upgrade()
            .ok_or_else(|| "the engine is being destroyed".to_string())?;
        let body = engine.metrics_text().into_bytes();
        let mut bytes = http1::typed_head(200, CONTENT_TYPE, body.len(), req.keep_alive);
        bytes.extend_from_slice(&body);
        Ok(Reply::owned(bytes, then(req.keep_alive)))
    }

    fn refusal(&self) -> Option<Reply> {
        Some(Reply::owned(
            http1::response(503, b"server busy", false),
            Then::Linger,
        ))
    }
}

/// What follows a reply on a connection that asked to be kept alive or not.
fn then(keep_alive: bool) -> Then {
    if keep_alive {
        Then::KeepAlive
    } else {
        Then::Linger
    }
}
