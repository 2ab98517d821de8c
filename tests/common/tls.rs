//! Certificates made by the tests (rcgen): a CA, a certificate for
//! `127.0.0.1` and `localhost` signed by it (good for a server and for a
//! client), and a second, unrelated CA; written as PEM files in a
//! temporary directory. And an HTTPS client that trusts the CA.

use super::servers::TempDir;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// PEM files of a test PKI.
pub struct Pki {
    /// The CA's certificate.
    pub ca: PathBuf,
    /// A certificate for `127.0.0.1` and `localhost` signed by the CA,
    /// usable by servers and clients, without a CommonName (etcd's JSON
    /// gateway refuses client certificates with one).
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
    /// The same with the CommonName `te-user`, and its key.
    pub cn_cert: PathBuf,
    /// The key of [`Pki::cn_cert`].
    pub cn_key: PathBuf,
    /// Another CA's certificate, which signed nothing here.
    pub other_ca: PathBuf,
    /// Where the files are (removed on drop).
    pub dir: TempDir,
}

/// A CA certificate and its issuer.
fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("self-signed CA");
    (cert.pem(), Issuer::new(params, key))
}

impl Pki {
    /// Makes the files.
    pub fn new() -> Pki {
        let dir = TempDir::new("pki");
        let (ca_pem, issuer) = ca("te test CA");
        let (other_pem, _) = ca("te other CA");
        let leaf = |cn: Option<&str>| {
            let mut params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
                .expect("leaf params");
            params.distinguished_name = DistinguishedName::new();
            params
                .distinguished_name
                .push(DnType::OrganizationName, "te tests");
            if let Some(cn) = cn {
                params.distinguished_name.push(DnType::CommonName, cn);
            }
            params.use_authority_key_identifier_extension = true;
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let key = KeyPair::generate().expect("leaf key");
            let cert = params.signed_by(&key, &issuer).expect("signed leaf");
            (cert.pem(), key.serialize_pem())
        };
        let (cert, key) = leaf(None);
        let (cn_cert, cn_key) = leaf(Some("te-user"));
        let file = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).expect("write PEM");
            p
        };
        Pki {
            ca: file("ca.pem", &ca_pem),
            cert: file("cert.pem", &cert),
            key: file("key.pem", &key),
            cn_cert: file("cn-cert.pem", &cn_cert),
            cn_key: file("cn-key.pem", &cn_key),
            other_ca: file("other-ca.pem", &other_pem),
            dir,
        }
    }

    /// An HTTPS client trusting the CA, sending the certificate as its
    /// client certificate when `client_cert`; HTTP statuses are answers,
    /// not errors.
    pub fn agent(&self, client_cert: bool) -> ureq::Agent {
        use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
        let ca = std::fs::read(&self.ca).expect("read CA");
        let roots =
            RootCerts::new_with_certs(&[Certificate::from_pem(&ca).expect("CA PEM").to_owned()]);
        let mut tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .root_certs(roots);
        if client_cert {
            let cert = std::fs::read(&self.cert).expect("read cert");
            let key = std::fs::read(&self.key).expect("read key");
            tls = tls.client_cert(Some(ClientCert::new_with_certs(
                &[Certificate::from_pem(&cert).expect("cert PEM").to_owned()],
                PrivateKey::from_pem(&key).expect("key PEM").to_owned(),
            )));
        }
        ureq::Agent::config_builder()
            .proxy(None)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(5)))
            .tls_config(tls.build())
            .build()
            .into()
    }
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}
