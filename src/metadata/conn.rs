//! The metadata connection string of `createTransferEngine`.

use crate::error::{Error, Result};
use std::fmt;

/// The connection string of the peer-to-peer handshake (no store).
const P2P: &str = "P2PHANDSHAKE";

/// Edits (Levenshtein) within which a bare word counts as a misspelled
/// `P2PHANDSHAKE` rather than an etcd host name.
const P2P_TYPO_DISTANCE: usize = 3;

/// Where segment descriptors and RPC addresses are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataConn {
    /// `P2PHANDSHAKE`: no store; peers are asked directly.
    P2p,
    /// `http://host:port/path` (the whole string is the URL base).
    Http(String),
    /// `etcd://h1:p1,h2:p2` or a plain `host:port[,host:port]` list.
    Etcd(Vec<String>),
    /// `redis://host[:port]`.
    Redis(String),
    /// `rediss://host[:port]`: redis over TLS.
    Rediss(String),
}

impl MetadataConn {
    /// Parses a connection string the way Mooncake does: `P2PHANDSHAKE`, a
    /// `scheme://` prefix, or no scheme meaning etcd. Unlike Mooncake,
    /// `P2PHANDSHAKE` is taken in any case, and a near miss of it (a word
    /// without port within three edits) is refused with a
    /// suggestion instead of being taken as an etcd host.
    pub fn parse(conn: &str) -> Result<MetadataConn> {
        let conn = conn.trim();
        if conn.is_empty() {
            return Err(Error::InvalidArgument(
                "metadata connection string is empty".into(),
            ));
        }
        if conn.eq_ignore_ascii_case(P2P) {
            return Ok(MetadataConn::P2p);
        }
        if !conn.contains([':', '.', ',', ';', '/'])
            && strsim::levenshtein(&conn.to_ascii_uppercase(), P2P) <= P2P_TYPO_DISTANCE
        {
            return Err(Error::InvalidArgument(format!(
                "metadata connection string {conn:?} is not a backend; did you mean {P2P}?"
            )));
        }
        let endpoints = |rest: &str| -> Result<Vec<String>> {
            let list: Vec<String> = rest
                .split([',', ';'])
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            if list.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "{conn:?} names no etcd endpoint"
                )));
            }
            Ok(list)
        };
        match conn.split_once("://") {
            None => Ok(MetadataConn::Etcd(endpoints(conn)?)),
            Some(("http" | "https", _)) => Ok(MetadataConn::Http(conn.to_string())),
            Some(("etcd", rest)) => Ok(MetadataConn::Etcd(endpoints(rest)?)),
            Some(("redis", rest)) if !rest.is_empty() => Ok(MetadataConn::Redis(rest.to_string())),
            Some(("rediss", rest)) if !rest.is_empty() => {
                Ok(MetadataConn::Rediss(rest.to_string()))
            }
            Some((scheme, _)) => Err(Error::InvalidArgument(format!(
                "metadata scheme {scheme:?} in {conn:?} is not one of P2PHANDSHAKE, http, https, \
                 etcd, redis, rediss"
            ))),
        }
    }

    /// The backend's name, for logs.
    pub fn backend(&self) -> &'static str {
        match self {
            MetadataConn::P2p => "P2PHANDSHAKE",
            MetadataConn::Http(_) => "http",
            MetadataConn::Etcd(_) => "etcd",
            MetadataConn::Redis(_) | MetadataConn::Rediss(_) => "redis",
        }
    }
}

impl fmt::Display for MetadataConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataConn::P2p => write!(f, "P2PHANDSHAKE"),
            MetadataConn::Http(url) => write!(f, "{url}"),
            MetadataConn::Etcd(list) => write!(f, "etcd://{}", list.join(",")),
            MetadataConn::Redis(addr) => write!(f, "redis://{addr}"),
            MetadataConn::Rediss(addr) => write!(f, "rediss://{addr}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_forms() {
        assert_eq!(
            MetadataConn::parse("P2PHANDSHAKE").unwrap(),
            MetadataConn::P2p
        );
        assert_eq!(
            MetadataConn::parse("http://127.0.0.1:8080/metadata").unwrap(),
            MetadataConn::Http("http://127.0.0.1:8080/metadata".into())
        );
        assert_eq!(
            MetadataConn::parse("etcd://a:2379,b:2379").unwrap(),
            MetadataConn::Etcd(vec!["a:2379".into(), "b:2379".into()])
        );
        assert_eq!(
            MetadataConn::parse("10.0.0.1:2379;10.0.0.2:2379").unwrap(),
            MetadataConn::Etcd(vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()])
        );
        assert_eq!(
            MetadataConn::parse("redis://127.0.0.1:6379").unwrap(),
            MetadataConn::Redis("127.0.0.1:6379".into())
        );
        assert_eq!(
            MetadataConn::parse("rediss://h:6380").unwrap(),
            MetadataConn::Rediss("h:6380".into())
        );
        assert!(MetadataConn::parse("").is_err());
        assert!(MetadataConn::parse("ftp://x").is_err());
        assert!(MetadataConn::parse("etcd://").is_err());
        assert_eq!(
            MetadataConn::parse("etcd-host").unwrap(),
            MetadataConn::Etcd(vec!["etcd-host".into()]),
            "no scheme means etcd"
        );
    }

    #[test]
    fn p2p_in_any_case_and_near_misses_suggest_it() {
        for ok in ["p2phandshake", "P2pHandShake", " P2PHANDSHAKE "] {
            assert_eq!(MetadataConn::parse(ok).unwrap(), MetadataConn::P2p, "{ok}");
        }
        for typo in [
            "P2PHANDSHAK",
            "p2phandshak",
            "P2P_HANDSHAKE",
            "P2PHANDSHAKES",
            "PPHANDSHAKE",
        ] {
            let err = MetadataConn::parse(typo).expect_err(typo).to_string();
            assert!(err.contains("did you mean P2PHANDSHAKE"), "{typo}: {err}");
        }
        // Real etcd hosts stay etcd.
        for host in ["p2phandshak:2379", "etcd", "node-1"] {
            assert!(
                matches!(MetadataConn::parse(host), Ok(MetadataConn::Etcd(_))),
                "{host}"
            );
        }
    }
}
