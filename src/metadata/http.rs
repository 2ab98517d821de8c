//! The HTTP metadata store, wire-compatible with Mooncake's
//! `HTTPStoragePlugin`.
//!
//! Every request goes to the whole connection string followed by
//! `?key=<key>`, the key escaped like `curl_easy_escape`. `GET` returns the
//! JSON value (404 = absent), `PUT` stores the compact JSON body, `DELETE`
//! removes the key. As with Mooncake (and curl's options there) a connection
//! attempt gives up after 1.5 s and a whole request after 3 s. Proxies named
//! in `http_proxy`/`ALL_PROXY` are honoured, as curl does; redirects are
//! not followed (as curl without `FOLLOWLOCATION`).
//!
//! With `MC_METADATA_AUTH_TOKEN_FILE` every request carries
//! `Authorization: Bearer <token>` (the token read from the file when the
//! store is opened), as `transfer-engine-metadata-server
//! --auth-token-file` requires. An `https://` URL is reached over TLS
//! (rustls), the server verified with the CA certificates of
//! `MC_METADATA_CACERT` (default: the system's).

use super::client_tls::{ClientTls, TlsFiles};
use super::secret::Secret;
use super::store::MetadataStore;
use crate::error::{Error, Result};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;
use std::time::Duration;
use ureq::http::Response;

/// Bytes `curl_easy_escape` leaves alone besides letters and digits.
const CURL_ESCAPE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Largest value body accepted from the server unless
/// [`HttpStore::limit_values`] says otherwise.
const MAX_BODY: u64 = 256 << 20;

/// Longest excerpt of an error body quoted in messages.
const MAX_ERROR_BODY: u64 = 512;

/// A metadata store reached over HTTP or HTTPS (`http://host:port/path`).
pub struct HttpStore {
    conn: String,
    agent: ureq::Agent,
    max_value: u64,
    /// `Authorization: Bearer <token>` sent with every request.
    bearer: Option<Secret>,
    /// The TLS settings of an `https://` URL.
    tls: Option<ClientTls>,
}

/// Escapes `key` like `curl_easy_escape`: every byte except `A-Z a-z 0-9 - .
/// _ ~` becomes `%XX`.
fn escape_key(key: &str) -> String {
    utf8_percent_encode(key, CURL_ESCAPE).to_string()
}

impl HttpStore {
    /// A store for the connection string `conn`, e.g.
    /// `http://10.0.0.1:8080/metadata`, sending no token; an `https://`
    /// server is verified with the system's CA certificates. Anything that
    /// is not `http://` or `https://` is [`Error::InvalidArgument`].
    pub fn new(conn: &str) -> Result<HttpStore> {
        Self::from_config(conn, &super::StoreConfig::default())
    }

    /// [`HttpStore::new`] with the token of `MC_METADATA_AUTH_TOKEN_FILE`
    /// and the CA certificates of `MC_METADATA_CACERT` from `c`, both read
    /// here; a file that cannot be read or holds no usable token or
    /// certificate is [`Error::InvalidArgument`].
    pub fn from_config(conn: &str, c: &super::StoreConfig) -> Result<HttpStore> {
        let scheme = conn.find("://").map(|i| conn[..i].to_ascii_lowercase());
        let tls = match scheme.as_deref() {
            Some("http") if conn.len() > "http://".len() => false,
            Some("https") if conn.len() > "https://".len() => true,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{conn:?} is not an http://host:port/path or https://host:port/path \
                     metadata URL"
                )));
            }
        };
        let bearer = c
            .http_token_file
            .as_deref()
            .map(|path| super::secret::read_token_file(path, "MC_METADATA_AUTH_TOKEN_FILE"))
            .transpose()
            .map_err(Error::InvalidArgument)?;
        if bearer.is_some() && !tls {
            tracing::warn!(
                "metadata server {conn}: the token of MC_METADATA_AUTH_TOKEN_FILE is sent in \
                 clear text over http://; use an https:// metadata server"
            );
        }
        let tls = if tls {
            let files = TlsFiles {
                cacert: c.http_cacert.clone(),
                ..TlsFiles::default()
            };
            Some(files.load("MC_METADATA")?)
        } else {
            None
        };
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(Duration::from_millis(1500)))
            .timeout_global(Some(Duration::from_secs(3)));
        if let Some(t) = &tls {
            config = config.tls_config(t.ureq_config());
        }
        Ok(HttpStore {
            conn: conn.to_owned(),
            agent: config.build().into(),
            max_value: MAX_BODY,
            bearer,
            tls,
        })
    }

    /// Refuses values larger than `bytes` (a GET of one fails with
    /// [`Error::Metadata`] without reading it all).
    pub fn limit_values(mut self, bytes: u64) -> HttpStore {
        self.max_value = bytes;
        self
    }

    fn url(&self, key: &str) -> String {
        format!("{}?key={}", self.conn, escape_key(key))
    }

    /// `req` with the bearer token, if any.
    fn authorize<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.bearer {
            Some(t) => req.header("Authorization", format!("Bearer {}", t.expose())),
            None => req,
        }
    }

    /// Maps a transport failure of `method url` to an engine error (which
    /// says all of it: the caller logs it, so this logs at debug only).
    fn failed(&self, method: &str, url: &str, e: ureq::Error) -> Error {
        tracing::debug!(%method, %url, error = %e, "metadata request failed");
        if let Some(why) = self.tls.as_ref().and_then(|t| t.explain_ureq(&e)) {
            return Error::Metadata(format!("{method} {url}: {why}"));
        }
        match e {
            ureq::Error::HostNotFound => Error::Dns(format!(
                "{method} {url}: cannot resolve the metadata server's host"
            )),
            ureq::Error::Timeout(t) => Error::Socket(format!(
                "{method} {url}: metadata server did not answer in time ({t})"
            )),
            ureq::Error::Io(_) | ureq::Error::ConnectionFailed => Error::Socket(format!(
                "{method} {url}: cannot reach the metadata server: {e}"
            )),
            other => Error::Metadata(format!("{method} {url}: {other}")),
        }
    }

    /// The error for an unexpected status, quoting the start of the body.
    fn bad_status(&self, method: &str, url: &str, mut resp: Response<ureq::Body>) -> Error {
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_ERROR_BODY)
            .read_to_vec()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        crate::log_limit::warn_limited!(
            "metadata server refused the request: method={method} url={url} status={status} \
             body={body}"
        );
        let hint = match (status, &self.bearer) {
            (401, None) => {
                "; the server wants a token: set MC_METADATA_AUTH_TOKEN_FILE to a file holding \
                 the server's --auth-token-file token"
            }
            (401, Some(_)) => {
                "; the server refused the token of MC_METADATA_AUTH_TOKEN_FILE: it must hold \
                 the server's --auth-token-file token"
            }
            _ => "",
        };
        Error::Metadata(format!(
            "{method} {url}: metadata server answered HTTP {status}: {body}{hint}"
        ))
    }
}

impl MetadataStore for HttpStore {
    fn get(&self, key: &str) -> Result<Option<Value>> {
        let url = self.url(key);
        let mut resp = self
            .authorize(self.agent.get(&url))
            .call()
            .map_err(|e| self.failed("GET", &url, e))?;
        match resp.status().as_u16() {
            200 => {}
            404 => return Ok(None),
            _ => return Err(self.bad_status("GET", &url, resp)),
        }
        let body = resp
            .body_mut()
            .with_config()
            .limit(self.max_value)
            .read_to_vec()
            .map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(_) => Error::Metadata(format!(
                    "GET {url}: the value is larger than {} bytes \
                     (MC_PEER_MAX_DESCRIPTOR_BYTES)",
                    self.max_value
                )),
                e => self.failed("GET", &url, e),
            })?;
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| Error::MalformedJson(format!("GET {url}: body is not JSON: {e}")))
    }

    fn set(&self, key: &str, value: &Value) -> Result<()> {
        let url = self.url(key);
        let body = serde_json::to_vec(value)
            .map_err(|e| Error::MalformedJson(format!("cannot serialize value of {key}: {e}")))?;
        let resp = self
            .authorize(self.agent.put(&url))
            .header("Content-Type", "application/json")
            .send(&body[..])
            .map_err(|e| self.failed("PUT", &url, e))?;
        match resp.status().as_u16() {
            200 => Ok(()),
            _ => Err(self.bad_status("PUT", &url, resp)),
        }
    }

    fn remove(&self, key: &str) -> Result<()> {
        let url = self.url(key);
        let resp = self
            .authorize(self.agent.delete(&url))
            .call()
            .map_err(|e| self.failed("DELETE", &url, e))?;
        match resp.status().as_u16() {
            200 | 404 => Ok(()),
            _ => Err(self.bad_status("DELETE", &url, resp)),
        }
    }

    fn describe(&self) -> String {
        format!("http store at {}", self.conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_curl() {
        assert_eq!(
            escape_key("mooncake/ram/10.0.0.5:12345"),
            "mooncake%2Fram%2F10.0.0.5%3A12345"
        );
        assert_eq!(escape_key("a-b.c_d~e f+g"), "a-b.c_d~e%20f%2Bg");
        assert_eq!(escape_key("é"), "%C3%A9");
    }

    #[test]
    fn url_is_conn_plus_key() {
        let s = HttpStore::new("http://10.0.0.1:8080/metadata").unwrap();
        assert_eq!(
            s.url("mooncake/ram/10.0.0.5:12345"),
            "http://10.0.0.1:8080/metadata?key=mooncake%2Fram%2F10.0.0.5%3A12345"
        );
        assert_eq!(s.describe(), "http store at http://10.0.0.1:8080/metadata");
    }

    #[test]
    fn rejects_other_schemes() {
        for bad in ["etcd://h:2379", "h:8080", "http://", "https://"] {
            assert!(
                matches!(HttpStore::new(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }
}
