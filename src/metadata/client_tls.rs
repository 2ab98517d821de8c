//! TLS of the metadata clients (etcd, the HTTP store, redis): the CA
//! certificates that verify the server and an optional client certificate,
//! read from PEM files once, when the store is opened, with rustls (ring)
//! underneath.
//!
//! Without a CA file the system's CA certificates are used
//! (`rustls-native-certs`: `SSL_CERT_FILE`, `SSL_CERT_DIR`, else the
//! distribution's bundle such as `/etc/ssl/certs/ca-certificates.crt`), as
//! curl and etcd's Go clients do.

use crate::error::{Error, Result};
use crate::settings::{FilePath, Parse, Reader};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The PEM files of a TLS client, named by `<PREFIX>_CACERT`,
/// `<PREFIX>_CERT` and `<PREFIX>_KEY` (as etcdctl's `--cacert`, `--cert`,
/// `--key`). Paths only: the files are read by `TlsFiles::load`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificates that verify the server; `None`: the system's.
    pub cacert: Option<PathBuf>,
    /// The client certificate chain (with [`TlsFiles::key`]).
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (with [`TlsFiles::cert`]).
    pub key: Option<PathBuf>,
}

/// The TLS material of a client, read and checked.
pub(crate) struct ClientTls {
    /// The trusted CA certificates.
    roots: Vec<CertificateDer<'static>>,
    /// Where they came from, for messages.
    roots_from: String,
    /// The variable of the CA file (`MC_ETCD_CACERT`), for messages.
    ca_var: String,
    /// The variables of the client certificate, for messages.
    cert_vars: String,
    /// The client certificate chain (its key is in [`Pem`]).
    client: Option<Vec<CertificateDer<'static>>>,
    /// The PEM text of the CA file and of the client certificate and key,
    /// as the redis client takes them.
    pem: Pem,
}

/// PEM texts as read.
#[derive(Default)]
struct Pem {
    cacert: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

/// The process's rustls crypto provider for our clients and server: ring.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Largest PEM file read (a CA bundle of the whole web is under 1 MiB).
pub(crate) const MAX_PEM_FILE: u64 = 4 << 20;

/// Reads the PEM file at `path`, which `var` names: a regular file of at
/// most [`MAX_PEM_FILE`] bytes, opened without blocking.
pub(crate) fn read_pem(var: &str, path: &Path) -> std::result::Result<Vec<u8>, String> {
    crate::small_file::read(path, MAX_PEM_FILE)
        .map(|f| f.bytes)
        .map_err(|why| format!("{var}={}: cannot read it: {why}", path.display()))
}

/// [`read_pem`] with the engine's error.
fn read(var: &str, path: &Path) -> Result<Vec<u8>> {
    read_pem(var, path).map_err(Error::InvalidArgument)
}

/// The certificates of the PEM text `pem` read from `path` (`var`): at
/// least one.
pub(crate) fn certificates(
    var: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            Error::InvalidArgument(format!(
                "{var}={}: not a PEM certificate file: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{var}={}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(certs)
}

/// The private key of the PEM text `pem` read from `path` (`var`).
pub(crate) fn private_key(var: &str, path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
        Error::InvalidArgument(format!(
            "{var}={}: holds no usable PEM private key (PKCS#8, PKCS#1 or SEC1, unencrypted): \
             {e}",
            path.display()
        ))
    })
}

impl TlsFiles {
    /// Whether a client certificate is configured.
    pub fn has_client_cert(&self) -> bool {
        self.cert.is_some() && self.key.is_some()
    }

    /// Reads and checks the files (variables `<prefix>_CACERT`, `_CERT`,
    /// `_KEY` in messages), or the system's CA certificates when no CA file
    /// is given. A file that cannot be read or parsed, a CA file without a
    /// usable certificate, or a key that does not match its certificate is
    /// [`Error::InvalidArgument`].
    pub(crate) fn load(&self, prefix: &str) -> Result<ClientTls> {
        let ca_var = format!("{prefix}_CACERT");
        let (cert_var, key_var) = (format!("{prefix}_CERT"), format!("{prefix}_KEY"));
        let mut pem = Pem::default();
        let mut store = rustls::RootCertStore::empty();
        let (roots, roots_from) = match &self.cacert {
            Some(path) => {
                let text = read(&ca_var, path)?;
                let certs = certificates(&ca_var, path, &text)?;
                for (i, c) in certs.iter().enumerate() {
                    store.add(c.clone()).map_err(|e| {
                        Error::InvalidArgument(format!(
                            "{ca_var}={}: certificate {} is not a usable CA certificate: {e}",
                            path.display(),
                            i + 1
                        ))
                    })?;
                }
                pem.cacert = Some(text);
                (certs, format!("{ca_var}={}", path.display()))
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for e in &found.errors {
                    tracing::debug!(error = %e, "a system CA certificate could not be loaded");
                }
                let (added, _) = store.add_parsable_certificates(found.certs.iter().cloned());
                if added == 0 {
                    return Err(Error::InvalidArgument(format!(
                        "no system CA certificates found (SSL_CERT_FILE, SSL_CERT_DIR, \
                         /etc/ssl/certs); set {ca_var} to the CA file that signed the server's \
                         certificate"
                    )));
                }
                (found.certs, "the system's CA certificates".to_string())
            }
        };
        let client = match (&self.cert, &self.key) {
            (Some(cert_path), Some(key_path)) => {
                let cert_pem = read(&cert_var, cert_path)?;
                let key_pem = read(&key_var, key_path)?;
                let chain = certificates(&cert_var, cert_path, &cert_pem)?;
                let key = private_key(&key_var, key_path, &key_pem)?;
                // The same check the connection makes, so that a bad pair
                // fails here, naming the files.
                rustls::ClientConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| Error::InvalidArgument(format!("TLS setup: {e}")))?
                    .with_root_certificates(store)
                    .with_client_auth_cert(chain.clone(), key)
                    .map_err(|e| {
                        Error::InvalidArgument(format!(
                            "{cert_var}={} with {key_var}={}: not a usable certificate and \
                             key: {e}",
                            cert_path.display(),
                            key_path.display()
                        ))
                    })?;
                pem.client = Some((cert_pem, key_pem));
                Some(chain)
            }
            _ => None,
        };
        Ok(ClientTls {
            roots,
            roots_from,
            ca_var,
            cert_vars: format!("{cert_var} and {key_var}"),
            client,
            pem,
        })
    }
}

impl ClientTls {
    /// The TLS settings of a ureq agent.
    pub(crate) fn ureq_config(&self) -> ureq::tls::TlsConfig {
        use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsProvider};
        let der = |c: &CertificateDer<'static>| Certificate::from_der(c.as_ref()).to_owned();
        let roots = RootCerts::new_with_certs(&self.roots.iter().map(der).collect::<Vec<_>>());
        // The key was parsed from this text by `load`.
        let client =
            self.client
                .as_ref()
                .zip(self.pem.client.as_ref())
                .and_then(|(chain, (_, key_pem))| {
                    let chain: Vec<_> = chain.iter().map(der).collect();
                    PrivateKey::from_pem(key_pem)
                        .ok()
                        .map(|key| ClientCert::new_with_certs(&chain, key))
                });
        ureq::tls::TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(provider())
            .root_certs(roots)
            .client_cert(client)
            .build()
    }

    /// The TLS settings of a redis client: the CA file's text (`None`: the
    /// system's certificates) and the client certificate and key.
    pub(crate) fn redis_certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .pem
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.pem.cacert.clone(),
        }
    }

    /// Says what the TLS failure of a ureq request means and what to
    /// check, or `None` when `e` is no TLS failure.
    pub(crate) fn explain_ureq(&self, e: &ureq::Error) -> Option<String> {
        match e {
            ureq::Error::Rustls(t) => Some(self.explain(t)),
            ureq::Error::Io(io) => find_rustls_error(io)
                .map(|t| self.explain(t))
                .or_else(|| self.explain_closed(io)),
            _ => None,
        }
    }

    /// What a TLS connection the server closed under the client means: in
    /// TLS 1.3 a server that refuses the client's certificate (or its
    /// absence) does so after the client's handshake is over, and the
    /// client sees the connection end; `None` for other I/O errors.
    fn explain_closed(&self, io: &std::io::Error) -> Option<String> {
        use std::io::ErrorKind as K;
        if !matches!(
            io.kind(),
            K::BrokenPipe | K::ConnectionReset | K::ConnectionAborted | K::UnexpectedEof
        ) {
            return None;
        }
        Some(match &self.client {
            None => format!(
                "TLS connection closed by the server ({io}): it may require a client \
                 certificate: set {}",
                self.cert_vars
            ),
            Some(_) => format!(
                "TLS connection closed by the server ({io}): it may not trust the client \
                 certificate of {}",
                self.cert_vars
            ),
        })
    }

    /// What to check when a TLS connection failed for a reason the
    /// client library does not tell apart.
    pub(crate) fn checklist(&self) -> String {
        let client = match &self.client {
            None => format!(
                "a server that requires client certificates needs {}",
                self.cert_vars
            ),
            Some(_) => format!(
                "the server trusts the client certificate of {}",
                self.cert_vars
            ),
        };
        format!(
            "check that the server's certificate is signed by a CA in {} (set {} to the CA \
             that signed it) and valid for the host name or address, that {client}",
            self.roots_from, self.ca_var
        )
    }

    /// Says what the TLS failure `tls` means and what to check.
    pub(crate) fn explain(&self, tls: &rustls::Error) -> String {
        use rustls::{AlertDescription as A, CertificateError as C, Error as E};
        let hint = match tls {
            E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
                "the server's certificate is not signed by a CA in {}; set {} to the CA \
                 that signed it",
                self.roots_from, self.ca_var
            ),
            E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
                "the server's certificate is not valid for the host name or address in the \
                 connection string (check its subjectAltName)"
                    .to_string()
            }
            E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
                "the server's certificate has expired".to_string()
            }
            E::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
                "the server's certificate is not valid yet (check the clocks)".to_string()
            }
            E::AlertReceived(
                A::CertificateRequired
                | A::HandshakeFailure
                | A::BadCertificate
                | A::UnknownCA
                | A::CertificateUnknown
                | A::AccessDenied,
            ) => match &self.client {
                None => format!(
                    "the server refused the TLS handshake; it may require a client \
                     certificate: set {}",
                    self.cert_vars
                ),
                Some(_) => format!(
                    "the server refused the TLS handshake; it may not trust the client \
                     certificate of {}",
                    self.cert_vars
                ),
            },
            E::InvalidMessage(_) => {
                "the server does not speak TLS here (is this an http:// port?)".to_string()
            }
            _ => "check the server's TLS settings".to_string(),
        };
        format!("TLS failed ({tls}): {hint}")
    }
}

/// The rustls error inside `e` or its sources (an I/O error carrying one),
/// if any.
pub(crate) fn find_rustls_error<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(t);
        }
        let inner = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<rustls::Error>());
        if inner.is_some() {
            return inner;
        }
        cur = err.source();
    }
    None
}

/// The TLS files `<PREFIX>_CACERT`, `<PREFIX>_CERT` and `<PREFIX>_KEY`
/// (the row's three variables, in that order); a certificate without its
/// key (or the reverse) warns and sends none.
pub(crate) struct Tls;

impl Parse<TlsFiles> for Tls {
    fn parse(&self, _raw: &str) -> Option<TlsFiles> {
        None
    }
    fn allowed(&self) -> String {
        "paths (a certificate with its key)".to_string()
    }
    fn show(&self, v: &TlsFiles) -> String {
        let files: Vec<String> = [&v.cacert, &v.cert, &v.key]
            .into_iter()
            .map(|f| FilePath.show(f))
            .collect();
        if files.iter().all(|f| f == "unset") {
            "unset".to_string()
        } else {
            files.join(",")
        }
    }
    fn read(&self, r: &Reader<'_>, vars: &[&'static str], _default: TlsFiles) -> TlsFiles {
        let path = |v: &str| FilePath.parse(&r.raw(v)?).flatten();
        let [cacert_var, cert_var, key_var] = vars else {
            unreachable!("a TLS row names its CACERT, CERT and KEY variables")
        };
        let (cert, key) = match (path(cert_var), path(key_var)) {
            (Some(c), Some(k)) => (Some(c), Some(k)),
            (None, None) => (None, None),
            (Some(_), None) | (None, Some(_)) => {
                r.warn(format!(
                    "only one of {cert_var} and {key_var} is set; sending no client \
                     certificate (set both)"
                ));
                (None, None)
            }
        };
        TlsFiles {
            cacert: path(cacert_var),
            cert,
            key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_files_must_be_small_regular_files() {
        let paths = crate::small_file::tests::Paths::new("pem-paths", b"", 5 << 20);
        for (path, why) in paths.bad() {
            let files = TlsFiles {
                cacert: Some(path.clone()),
                ..TlsFiles::default()
            };
            let e = files.load("MC_ETCD").err().expect("refused").to_string();
            let named = format!("MC_ETCD_CACERT={}: cannot read it", path.display());
            assert!(e.contains(&named), "{e}");
            assert!(e.contains(why), "{e}");
        }
    }
}
