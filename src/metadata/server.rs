//! An HTTP metadata server speaking the protocol of Mooncake's Go server
//! (`example/http-metadata-server/main.go`), with data that survives a
//! restart.
//!
//! Routes, on one configurable path (default `/metadata`):
//! * `GET <path>?key=K` — 200 with the stored body, 404 `metadata not found`;
//! * `PUT <path>?key=K` — stores the request body as is (overwriting), 200;
//! * `DELETE <path>?key=K` — 200, also for an absent key.
//!
//! A missing `key` parameter is 400, another method 405, another path 404.
//! Unlike the Go server, every change is written to the data file (a JSON
//! object of key to stored body; temp file, fsync, rename) before the answer
//! goes out, and the file is loaded at start.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use tiny_http::{Header, Method, Request, Response};

/// Number of request-handling threads.
const WORKERS: usize = 4;

/// Largest value accepted by `PUT`.
const MAX_VALUE: u64 = 256 << 20;

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
        tracing::warn!(dir = %dir.display(), error = %e, "cannot fsync the data directory");
    }
    Ok(())
}

/// A running metadata server; stops on [`MetadataServer::shutdown`] or drop.
pub struct MetadataServer {
    server: Arc<tiny_http::Server>,
    workers: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    addr: SocketAddr,
    path: String,
}

impl MetadataServer {
    /// Loads `data_file` (if given and present) and serves on `addr` (e.g.
    /// `127.0.0.1:0` for any free port) under `path` (e.g. `/metadata`; a
    /// missing leading `/` is added). Fails if the address cannot be bound or
    /// the data file cannot be read or parsed.
    pub fn start(addr: &str, path: &str, data_file: Option<PathBuf>) -> io::Result<MetadataServer> {
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        let store = Arc::new(Store::load(data_file)?);
        let server = Arc::new(tiny_http::Server::http(addr).map_err(|e| {
            io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("cannot listen on {addr}: {e}"),
            )
        })?);
        let local = server.server_addr().to_ip().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{addr} is not an IP address"),
            )
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::with_capacity(WORKERS);
        for i in 0..WORKERS {
            let (srv, store, flag, path) =
                (server.clone(), store.clone(), stop.clone(), path.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("metadata-http-{i}"))
                .spawn(move || serve(&srv, &store, &flag, &path));
            match spawned {
                Ok(h) => workers.push(h),
                Err(e) => {
                    stop_workers(&server, &stop, workers);
                    return Err(e);
                }
            }
        }
        tracing::info!(addr = %local, %path, "metadata server started");
        Ok(MetadataServer {
            server,
            workers,
            stop,
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
        stop_workers(&self.server, &self.stop, std::mem::take(&mut self.workers));
        tracing::info!(addr = %self.addr, "metadata server stopped");
    }
}

fn stop_workers(server: &tiny_http::Server, stop: &AtomicBool, workers: Vec<JoinHandle<()>>) {
    stop.store(true, Ordering::SeqCst);
    // Each unblock wakes exactly one blocked `recv`.
    for _ in &workers {
        server.unblock();
    }
    for w in workers {
        if w.join().is_err() {
            tracing::error!("a metadata server worker panicked");
        }
    }
}

fn serve(server: &tiny_http::Server, store: &Store, stop: &AtomicBool, path: &str) {
    while !stop.load(Ordering::SeqCst) {
        match server.recv() {
            Ok(req) => handle(req, store, path),
            Err(e) if !stop.load(Ordering::SeqCst) => {
                tracing::warn!(error = %e, "metadata server accept failed");
            }
            Err(_) => {}
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

fn reply(req: Request, status: u16, body: impl Into<Vec<u8>>) {
    let mut resp = Response::from_data(body.into()).with_status_code(status);
    if let Ok(h) = Header::from_bytes("Content-Type", "application/json; charset=utf-8") {
        resp.add_header(h);
    }
    if status == 405 {
        if let Ok(h) = Header::from_bytes("Allow", "GET, PUT, DELETE") {
            resp.add_header(h);
        }
    }
    if let Err(e) = req.respond(resp) {
        tracing::debug!(error = %e, "metadata client went away before the answer");
    }
}

fn handle(mut req: Request, store: &Store, path: &str) {
    let url = req.url().to_owned();
    let (req_path, query) = url.split_once('?').unwrap_or((&url, ""));
    if req_path != path {
        return reply(req, 404, "not found");
    }
    let method = req.method().clone();
    if !matches!(method, Method::Get | Method::Put | Method::Delete) {
        return reply(req, 405, "method not allowed");
    }
    let Some(key) = query_key(query) else {
        return reply(req, 400, "missing key");
    };
    match method {
        Method::Get => match store.get(&key) {
            Some(v) => reply(req, 200, v),
            None => reply(req, 404, "metadata not found"),
        },
        Method::Put => {
            let mut body = Vec::new();
            let read = req.as_reader().take(MAX_VALUE + 1).read_to_end(&mut body);
            if let Err(e) = read {
                tracing::warn!(%key, error = %e, "cannot read PUT body");
                return reply(req, 400, "invalid request");
            }
            if body.len() as u64 > MAX_VALUE {
                return reply(req, 413, "value too large");
            }
            let Ok(value) = String::from_utf8(body) else {
                return reply(req, 400, "value is not UTF-8");
            };
            match store.update(&key, Some(value)) {
                Ok(()) => {
                    tracing::debug!(%key, "metadata updated");
                    reply(req, 200, "metadata updated")
                }
                Err(e) => {
                    tracing::error!(%key, error = %e, "cannot persist metadata");
                    reply(req, 500, "cannot persist metadata")
                }
            }
        }
        _ => match store.update(&key, None) {
            Ok(()) => {
                tracing::debug!(%key, "metadata deleted");
                reply(req, 200, "metadata deleted")
            }
            Err(e) => {
                tracing::error!(%key, error = %e, "cannot persist metadata");
                reply(req, 500, "cannot persist metadata")
            }
        },
    }
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
