//! The redis metadata store, compatible with Mooncake's
//! `RedisStoragePlugin`: `GET`/`SET`/`DEL` of the keys of the metadata
//! namespace, one string value per key.
//!
//! Values are written as compact JSON with sorted keys followed by `"\n"`
//! (Mooncake's `Json::FastWriter`); any JSON text is accepted when reading.
//! `AUTH [username] password` is sent when a password is configured
//! (`MC_REDIS_USERNAME`, `MC_REDIS_PASSWORD`) and `SELECT db` when the
//! database index (`MC_REDIS_DB_INDEX`) is not 0.
//!
//! `rediss://host[:port]` speaks TLS (rustls): the server is verified with
//! the CA certificates of `MC_REDIS_CACERT` (default: the system's), and a
//! client certificate is sent when `MC_REDIS_CERT` and `MC_REDIS_KEY` are
//! set. The files are read when the store is opened.
//!
//! An address without a port means port 6379, redis' own default
//! (Mooncake's parser defaults to 12001 there; write the port to be
//! unambiguous).
//!
//! One connection is kept and shared (calls are serialised). Connecting,
//! authenticating and selecting the database give up after 3 s, a
//! command after 5 s of silence. After an I/O error the connection is
//! dropped; a command that failed on a connection that had worked before
//! (the server restarted or closed it) is sent once more on a fresh one in
//! the same call, so a redis restart costs no failed call once the server
//! is back.

use super::client_tls::ClientTls;
use super::store::MetadataStore;
use crate::error::{Error, Result};
use redis::{ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisConnectionInfo, RedisError};
use serde_json::Value;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Connecting (TCP, `AUTH`, `SELECT`) gives up after this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A command gives up after this long without progress.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// The port of an address written without one (redis' default).
pub const DEFAULT_PORT: u16 = 6379;

/// A metadata store kept in one redis server (`redis://host:port`).
pub struct RedisStore {
    /// `host:port` as shown in messages.
    addr: String,
    db: u8,
    authenticated: bool,
    /// The TLS settings, for `rediss://`.
    tls: Option<ClientTls>,
    client: redis::Client,
    conn: Mutex<Option<redis::Connection>>,
    /// Largest value read; `None`: any.
    max_value: Option<u64>,
}

/// Splits `host[:port]` (IPv6 in brackets, or bare without a port) into the
/// host without brackets and the port, defaulting to [`DEFAULT_PORT`].
fn split_addr(raw: &str) -> Result<(String, u16)> {
    let s = raw.trim();
    let s = s
        .strip_prefix("redis://")
        .or_else(|| s.strip_prefix("REDIS://"))
        .unwrap_or(s)
        .trim_end_matches('/');
    let bad = || {
        Error::InvalidArgument(format!(
            "redis address {raw:?} is not host[:port] (e.g. redis://10.0.0.1:6379)"
        ))
    };
    if s.is_empty() || s.contains('/') || s.chars().any(char::is_whitespace) {
        return Err(bad());
    }
    let port = |p: &str| match p.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(Error::InvalidArgument(format!(
            "redis address {raw:?}: port {p:?} is not a number in 1..=65535"
        ))),
    };
    if let Some(rest) = s.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or_else(bad)?;
        if host.is_empty() {
            return Err(bad());
        }
        return match tail {
            "" => Ok((host.to_string(), DEFAULT_PORT)),
            t => Ok((
                host.to_string(),
                port(t.strip_prefix(':').ok_or_else(bad)?)?,
            )),
        };
    }
    match s.matches(':').count() {
        0 => Ok((s.to_string(), DEFAULT_PORT)),
        1 => {
            let (host, p) = s.split_once(':').ok_or_else(bad)?;
            if host.is_empty() {
                return Err(bad());
            }
            Ok((host.to_string(), port(p)?))
        }
        // A bare IPv6 address.
        _ => Ok((s.to_string(), DEFAULT_PORT)),
    }
}

/// Whether `e` leaves the connection unusable (anything but an error reply
/// of the server or a reply of an unexpected type).
fn breaks_connection(e: &RedisError) -> bool {
    !matches!(
        e.kind(),
        ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::UnexpectedReturnType
    )
}

impl RedisStore {
    /// A store on the redis server at `addr` (`host:port`, `host`, or
    /// either behind `redis://`; no port means 6379). A non-empty
    /// `password` makes every connection send `AUTH [username] password`;
    /// `db` other than 0 makes it send `SELECT db`. Nothing is contacted
    /// here; a bad address is [`Error::InvalidArgument`].
    pub fn new(
        addr: &str,
        username: Option<&str>,
        password: Option<&str>,
        db: u8,
    ) -> Result<RedisStore> {
        Self::build(addr, username, password, db, None)
    }

    /// [`RedisStore::new`], over TLS when `tls` is given (`rediss://`).
    fn build(
        addr: &str,
        username: Option<&str>,
        password: Option<&str>,
        db: u8,
        tls: Option<ClientTls>,
    ) -> Result<RedisStore> {
        let (host, port) = split_addr(addr)?;
        let shown = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let username = username.filter(|u| !u.is_empty());
        let password = password.filter(|p| !p.is_empty());
        let mut settings = RedisConnectionInfo::default()
            .set_db(i64::from(db))
            .set_skip_set_lib_name();
        match (username, password) {
            (user, Some(pass)) => {
                settings = settings.set_password(pass);
                if let Some(user) = user {
                    settings = settings.set_username(user);
                }
            }
            (Some(user), None) => {
                tracing::warn!(
                    %user,
                    "MC_REDIS_USERNAME is set without MC_REDIS_PASSWORD; not authenticating \
                     (set MC_REDIS_PASSWORD too)"
                );
            }
            (None, None) => {}
        }
        let bad = |e: RedisError| Error::InvalidArgument(format!("redis address {addr:?}: {e}"));
        let info = match &tls {
            None => ConnectionAddr::Tcp(host, port),
            Some(_) => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            },
        }
        .into_connection_info()
        .map_err(bad)?
        .set_redis_settings(settings);
        let client = match &tls {
            None => redis::Client::open(info).map_err(bad)?,
            Some(t) => redis::Client::build_with_tls(info, t.redis_certificates()).map_err(bad)?,
        };
        Ok(RedisStore {
            addr: shown,
            db,
            authenticated: password.is_some(),
            tls,
            client,
            conn: Mutex::new(None),
            max_value: None,
        })
    }

    /// Refuses values larger than `bytes`: a get reads at most one byte
    /// more (`GETRANGE`) and fails with [`Error::Metadata`].
    pub fn limit_values(mut self, bytes: u64) -> RedisStore {
        self.max_value = Some(bytes);
        self
    }

    /// A store at `addr` with the credentials and database of `c`
    /// (`MC_REDIS_USERNAME`, `MC_REDIS_PASSWORD`, `MC_REDIS_DB_INDEX`),
    /// over TLS with the files of `c.redis_tls` when `tls` (`rediss://`);
    /// those files are read here.
    pub fn from_config(addr: &str, tls: bool, c: &super::StoreConfig) -> Result<RedisStore> {
        let tls = tls.then(|| c.redis_tls.load("MC_REDIS")).transpose()?;
        RedisStore::build(
            addr,
            c.redis_username.as_deref(),
            c.redis_password.as_ref().map(super::secret::Secret::expose),
            c.redis_db_index,
            tls,
        )
    }

    /// The server address as `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// A fresh connection with the I/O timeouts set.
    fn connect(&self) -> std::result::Result<redis::Connection, RedisError> {
        let conn = self.client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
        conn.set_read_timeout(Some(IO_TIMEOUT))?;
        conn.set_write_timeout(Some(IO_TIMEOUT))?;
        tracing::debug!(addr = %self.addr, db = self.db, "redis: connected");
        Ok(conn)
    }

    /// Runs `cmd` on the shared connection, connecting first if there is
    /// none, and once more on a fresh connection if the kept one turned out
    /// to be dead. `what` names the operation in messages.
    fn run<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd, what: &str) -> Result<T> {
        let mut guard = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let reused = guard.is_some();
            let conn = match guard.as_mut() {
                Some(c) => c,
                None => {
                    let c = self
                        .connect()
                        .map_err(|e| self.error(what, "connect", &e))?;
                    guard.insert(c)
                }
            };
            match cmd.query::<T>(conn) {
                Ok(v) => return Ok(v),
                Err(e) => {
                    if breaks_connection(&e) {
                        *guard = None;
                        if reused && !e.is_timeout() {
                            tracing::info!(
                                addr = %self.addr, %what, error = %e,
                                "redis connection lost; reconnecting and retrying once"
                            );
                            // The next round connects afresh; `reused` will
                            // be false there, so this retries only once.
                            continue;
                        }
                    }
                    return Err(self.error(what, "command", &e));
                }
            }
        }
    }

    /// Maps a redis failure during `stage` of `what` to an engine error
    /// with a hint about what to check.
    fn error(&self, what: &str, stage: &str, e: &RedisError) -> Error {
        let addr = &self.addr;
        crate::log_limit::warn_limited!(
            "redis request failed: addr={addr} what={what} stage={stage} error={e}"
        );
        // The crate keeps the TLS error of a failed connection as text
        // only: say what to check.
        if let Some(t) = &self.tls
            && e.is_io_error()
            && !e.is_connection_refusal()
            && !e.is_timeout()
        {
            return Error::Socket(format!(
                "redis at rediss://{addr}: {what}: the connection failed ({e}); {}, and that \
                 redis-server is running",
                t.checklist()
            ));
        }
        let code = e.code().unwrap_or_default();
        // The crate wraps errors of the connection setup (AUTH, SELECT) and
        // drops their code; their text still says what happened.
        let text = e.to_string().to_ascii_lowercase();
        if e.kind() == ErrorKind::AuthenticationFailed
            || matches!(code, "NOAUTH" | "WRONGPASS")
            || ["noauth", "wrongpass", "authentication", "auth "]
                .iter()
                .any(|w| text.contains(w))
        {
            let hint = if self.authenticated {
                "check MC_REDIS_USERNAME and MC_REDIS_PASSWORD"
            } else {
                "the server wants a password: set MC_REDIS_PASSWORD (and MC_REDIS_USERNAME for \
                 an ACL user)"
            };
            return Error::Metadata(format!(
                "redis at {addr}: {what}: authentication failed ({e}); {hint}"
            ));
        }
        if e.is_timeout() {
            return Error::Socket(format!(
                "redis at {addr}: {what}: no answer within {} s ({e}); check that redis-server \
                 is running and reachable",
                if stage == "connect" {
                    CONNECT_TIMEOUT.as_secs_f32()
                } else {
                    IO_TIMEOUT.as_secs_f32()
                }
            ));
        }
        if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            return Error::Socket(format!(
                "redis at {addr}: {what}: cannot reach the server ({e}); check that \
                 redis-server is running and reachable"
            ));
        }
        if stage == "connect" && self.db != 0 {
            return Error::Metadata(format!(
                "redis at {addr}: {what}: cannot set up the connection ({e}); check \
                 MC_REDIS_DB_INDEX={} against the server's `databases` setting",
                self.db
            ));
        }
        Error::Metadata(format!("redis at {addr}: {what}: {e}"))
    }
}

impl MetadataStore for RedisStore {
    fn get(&self, key: &str) -> Result<Option<Value>> {
        let what = format!("GET {key}");
        let raw: Option<Vec<u8>> = match self.max_value {
            None => self.run(redis::cmd("GET").arg(key), &what)?,
            // GETRANGE answers "" for an absent key; a stored value is
            // never empty (it is JSON).
            Some(max) => {
                let cmd = redis::cmd("GETRANGE").arg(key).arg(0).arg(max).clone();
                let raw: Vec<u8> = self.run(&cmd, &what)?;
                if raw.len() as u64 > max {
                    return Err(Error::Metadata(format!(
                        "redis at {}: {what}: the value is larger than {max} bytes \
                         (MC_PEER_MAX_DESCRIPTOR_BYTES)",
                        self.addr
                    )));
                }
                (!raw.is_empty()).then_some(raw)
            }
        };
        let Some(raw) = raw else { return Ok(None) };
        serde_json::from_slice(&raw).map(Some).map_err(|e| {
            Error::MalformedJson(format!(
                "redis at {}: {what}: the stored value is not JSON ({e}); it was not written \
                 by a transfer engine — delete or rewrite the key",
                self.addr
            ))
        })
    }

    fn set(&self, key: &str, value: &Value) -> Result<()> {
        let mut text = serde_json::to_string(value)
            .map_err(|e| Error::MalformedJson(format!("cannot serialize value of {key}: {e}")))?;
        text.push('\n');
        self.run::<()>(redis::cmd("SET").arg(key).arg(text), &format!("SET {key}"))
    }

    fn remove(&self, key: &str) -> Result<()> {
        self.run::<i64>(redis::cmd("DEL").arg(key), &format!("DEL {key}"))
            .map(drop)
    }

    fn describe(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        if self.db == 0 {
            format!("redis store at {scheme}://{}", self.addr)
        } else {
            format!("redis store at {scheme}://{} (db {})", self.addr, self.db)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let ok = |s: &str| split_addr(s).unwrap();
        assert_eq!(ok("10.0.0.1:7000"), ("10.0.0.1".into(), 7000));
        assert_eq!(ok("redis://h:1/"), ("h".into(), 1));
        assert_eq!(ok("h"), ("h".into(), DEFAULT_PORT));
        assert_eq!(ok("[::1]:7"), ("::1".into(), 7));
        assert_eq!(ok("[::1]"), ("::1".into(), DEFAULT_PORT));
        assert_eq!(ok("::1"), ("::1".into(), DEFAULT_PORT));
        for bad in [
            "", ":1", "h:", "h:x", "h:0", "h:65536", "h:1/2", "[]:1", "[::1",
        ] {
            assert!(
                matches!(split_addr(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn describe_names_address_and_db() {
        let s = RedisStore::new("h", None, Some(""), 0).unwrap();
        assert_eq!(s.describe(), "redis store at redis://h:6379");
        assert!(!s.authenticated, "an empty password is no password");
        let s = RedisStore::new("[::1]:7", Some("u"), Some("p"), 3).unwrap();
        assert_eq!(s.describe(), "redis store at redis://[::1]:7 (db 3)");
    }

    #[test]
    fn down_server_fails_naming_it() {
        let s = RedisStore::new("127.0.0.1:1", None, None, 0).unwrap();
        let e = s.get("k").unwrap_err();
        assert!(matches!(e, Error::Socket(_)), "{e:?}");
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    }
}
