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
//! a body over the limit 413. Unlike the Go server, every change is written
//! to the data file (a JSON object of key to stored body; temp file, fsync,
//! rename) before the answer goes out, and the file is loaded at start.
//!
//! The server is event-driven ([`crate::serve`]): one thread reads the
//! requests of every connection, each with a deadline, and a few threads
//! answer complete ones, so slow or silent clients cannot hold up others.
//! Connections are kept alive between requests (HTTP/1.1).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::http1::{self, Limits};
use crate::serve::{self, Dispatch, Parse, Reply, Service, Then};

/// Stored values and the file that persists them.
struct Store {
    data: Mutex<BTreeMap<String, String>>,
    file: Option<PathBuf>,
}

impl Store {
    fn load(file: Option<PathBuf>) -> io::Result<Store> {
        let data = match &file {
            Some(path) => match fs::read(path) {
                Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: not a JSON object of strings ({e}); \
                             fix or move the file away",
                            path.display()
                        ),
                    )
                })?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
                Err(e) => return Err(e),
            },
            None => BTreeMap::new(),
        };
        Ok(Store {
            data: Mutex::new(data),
            file,
        })
    }

    fn get(&self, key: &str) -> Option<String> {
        self.lock().get(key).cloned()
    }

    /// Sets (`Some`) or removes (`None`) `key`; the change is on disk when
    /// this returns `Ok`, and undone in memory when it returns `Err`.
    fn update(&self, key: &str, value: Option<String>) -> io::Result<()> {
        let mut data = self.lock();
        let old = match value {
            Some(v) => data.insert(key.to_owned(), v),
            None => match data.remove(key) {
                Some(old) => Some(old),
                None => return Ok(()),
            },
        };
        let Some(path) = &self.file else {
            return Ok(());
        };
        let result = persist(path, &data);
        if result.is_err() {
            match old {
                Some(old) => data.insert(key.to_owned(), old),
                None => data.remove(key),
            };
        }
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        // A panic while holding the lock leaves the map consistent (every
        // change is a single insert or remove), so poisoning is ignored.
        self.data.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Writes `data` to `path` atomically: temp file in the same directory,
/// fsync, rename, fsync of the directory.
fn persist(path: &Path, data: &BTreeMap<String, String>) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "data file has no name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let bytes = serde_json::to_vec(data).map_err(io::Error::other)?;
    let written = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        // Best effort: the temp file is garbage either way.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // The data is in place; a failed directory sync only weakens crash
    // safety, so it is reported, not returned.
    if let Err(e) = fs::File::open(dir).and_then(|d| d.sync_all()) {
        crate::warn_limited!("cannot fsync the data directory {}: {e}", dir.display());
    }
    Ok(())
}

/// Bounds of a [`MetadataServer`] (the command-line flags of
/// `transfer-engine-metadata-server`).
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Largest `PUT` body; a larger one is answered 413 (`--max-body`,
    /// 64 MiB).
    pub max_body: usize,
    /// Connections open at once (`--max-connections`, 1024). At the bound a
    /// new connection closes the oldest one waiting for its client; when
    /// all have requests being answered, new ones wait in the backlog.
    pub max_connections: usize,
    /// Deadline for a whole request (head and body) from the connection's
    /// start or its previous response, and for sending a response
    /// (`--timeout`, 30 s). An idle kept-alive connection closes after it.
    pub timeout: Duration,
    /// Threads that answer complete requests (`--workers`, 4).
    pub workers: usize,
    /// Bytes of requests and responses held across all connections
    /// (`--max-buffered`, 256 MiB; at least one largest request).
    pub max_buffered: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_body: 64 << 20,
            max_connections: 1024,
            timeout: Duration::from_secs(30),
            workers: 4,
            max_buffered: 256 << 20,
        }
    }
}

/// A running metadata server; stops on [`MetadataServer::shutdown`] or drop.
pub struct MetadataServer {
    server: serve::Server,
    addr: SocketAddr,
    path: String,
}

impl MetadataServer {
    /// Loads `data_file` (if given and present) and serves on `addr` (e.g.
    /// `127.0.0.1:0` for any free port) under `path` (e.g. `/metadata`; a
    /// missing leading `/` is added), with the default [`ServerOptions`].
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
        let store = Store::load(data_file)?;
        // The connection bound, not the usual 1024 descriptors, limits
        // clients.
        crate::engine::raise_descriptor_limit();
        let listener = TcpListener::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        let local = listener.local_addr()?;
        let limits = Limits::new(opts.max_body);
        // One largest request (head, body, and a read beyond) always fits.
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
        };
        let service = Arc::new(Http {
            store,
            path: path.clone(),
            limits,
        });
        let server = serve::Server::start(listener, service, serve_opts)?;
        tracing::info!(addr = %local, %path, ?opts, "metadata server started");
        Ok(MetadataServer {
            server,
            addr: local,
            path,
        })
    }

    /// The address the server listens on (with the real port when started
    /// on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connection string clients use, e.g. `http://127.0.0.1:8080/metadata`.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.addr, self.path)
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
    limits: Limits,
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
        http1::parse(parser, buf, self.limits)
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
        Ok(Reply::owned(
            http1::response(status, body.as_bytes(), req.keep_alive),
            then,
        ))
    }
}

impl Http {
    /// Status and body of the answer to one request.
    fn answer(&self, method: String, target: &str, body: Vec<u8>) -> (u16, String) {
        let (req_path, query) = target.split_once('?').unwrap_or((target, ""));
        if req_path != self.path {
            return (404, "not found".into());
        }
        if !matches!(method.as_str(), "GET" | "PUT" | "DELETE") {
            return (405, "method not allowed".into());
        }
        let Some(key) = query_key(query) else {
            return (400, "missing key".into());
        };
        let change = match method.as_str() {
            "GET" => {
                return match self.store.get(&key) {
                    Some(v) => (200, v),
                    None => (404, "metadata not found".into()),
                };
            }
            "PUT" => match String::from_utf8(body) {
                Ok(value) => Some(value),
                Err(_) => return (400, "value is not UTF-8".into()),
            },
            _ => None,
        };
        let put = change.is_some();
        match self.store.update(&key, change) {
            Ok(()) if put => {
                tracing::debug!(%key, "metadata updated");
                (200, "metadata updated".into())
            }
            Ok(()) => {
                tracing::debug!(%key, "metadata deleted");
                (200, "metadata deleted".into())
            }
            Err(e) => {
                crate::log_limited!(error, "cannot persist metadata {key:?}: {e}");
                (500, "cannot persist metadata".into())
            }
        }
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

    #[test]
    fn store_persists_and_rolls_back() {
        let dir = std::env::temp_dir().join(format!("te-store-unit-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("data.json");
        let _ = fs::remove_file(&file);
        let s = Store::load(Some(file.clone())).unwrap();
        s.update("a", Some("{\"x\":1}".into())).unwrap();
        s.update("b", Some("2".into())).unwrap();
        s.update("b", None).unwrap();
        s.update("missing", None).unwrap();
        let again = Store::load(Some(file.clone())).unwrap();
        assert_eq!(again.get("a").as_deref(), Some("{\"x\":1}"));
        assert_eq!(again.get("b"), None);
        // A file in a directory that is gone cannot be written: the change
        // is refused and undone.
        let gone = Store::load(Some(dir.join("nodir").join("data.json"))).unwrap();
        assert!(gone.update("k", Some("v".into())).is_err());
        assert_eq!(gone.get("k"), None);
        fs::write(&file, b"[1]").unwrap();
        assert_eq!(
            Store::load(Some(file)).err().map(|e| e.kind()),
            Some(io::ErrorKind::InvalidData)
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
