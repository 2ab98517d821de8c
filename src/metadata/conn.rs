//! The metadata connection string of `createTransferEngine`.

use crate::error::{Error, Result};
use std::fmt;

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
}

impl MetadataConn {
    /// Parses a connection string the way Mooncake does: `P2PHANDSHAKE`
    /// exactly, a `scheme://` prefix, or no scheme meaning etcd.
    pub fn parse(conn: &str) -> Result<MetadataConn> {
        let conn = conn.trim();
        if conn.is_empty() {
            return Err(Error::InvalidArgument(
                "metadata connection string is empty".into(),
            ));
        }
        if conn == "P2PHANDSHAKE" {
            return Ok(MetadataConn::P2p);
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
            Some((scheme, _)) => Err(Error::InvalidArgument(format!(
                "metadata scheme {scheme:?} in {conn:?} is not one of P2PHANDSHAKE, http, https, \
                 etcd, redis"
            ))),
        }
    }

    /// The backend's name, for logs.
    pub fn backend(&self) -> &'static str {
        match self {
            MetadataConn::P2p => "P2PHANDSHAKE",
            MetadataConn::Http(_) => "http",
            MetadataConn::Etcd(_) => "etcd",
            MetadataConn::Redis(_) => "redis",
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
        assert!(MetadataConn::parse("").is_err());
        assert!(MetadataConn::parse("ftp://x").is_err());
        assert!(MetadataConn::parse("etcd://").is_err());
        assert!(
            MetadataConn::parse("p2phandshake").is_ok(),
            "no scheme means etcd"
        );
    }
}
