//! Metadata store keys and the RPC location entry, as Mooncake names them.
//!
//! Every key starts with `mooncake/`, followed by `MC_METADATA_CLUSTER_ID/`
//! when that variable is set (pass `Config::store`'s `cluster_id`
//! as `cluster_id`).

use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// `mooncake/` or `mooncake/<cluster_id>/`; a trailing `/` in the id is not
/// doubled and an empty id counts as none.
pub fn key_prefix(cluster_id: Option<&str>) -> String {
    match cluster_id {
        Some(id) if !id.is_empty() => {
            let slash = if id.ends_with('/') { "" } else { "/" };
            format!("mooncake/{id}{slash}")
        }
        _ => "mooncake/".to_owned(),
    }
}

/// Key of a segment descriptor: `<prefix>ram/<name>`, or `<prefix><name>`
/// when the name already contains a `/`.
pub fn segment_key(cluster_id: Option<&str>, name: &str) -> String {
    let prefix = key_prefix(cluster_id);
    if name.contains('/') {
        format!("{prefix}{name}")
    } else {
        format!("{prefix}ram/{name}")
    }
}

/// Key of a server's RPC location: `<prefix>rpc_meta/<name>`.
pub fn rpc_meta_key(cluster_id: Option<&str>, name: &str) -> String {
    format!("{}rpc_meta/{name}", key_prefix(cluster_id))
}

/// Where a server's handshake listener is reachable, stored under
/// [`rpc_meta_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcMeta {
    /// IP address or host name of the listener.
    pub ip_or_host_name: String,
    /// TCP port of the listener.
    pub rpc_port: u16,
}

impl RpcMeta {
    /// `{"ip_or_host_name": "...", "rpc_port": N}`.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert(
            "ip_or_host_name".into(),
            Value::from(self.ip_or_host_name.as_str()),
        );
        m.insert("rpc_port".into(), Value::from(self.rpc_port));
        Value::Object(m)
    }

    /// Parses an entry; a wrong JSON type is [`Error::MalformedJson`], a
    /// missing or empty host or a port of 0 is [`Error::Metadata`].
    pub fn from_json(v: &Value) -> Result<RpcMeta> {
        let obj = v
            .as_object()
            .ok_or_else(|| Error::MalformedJson("rpc_meta entry is not a JSON object".into()))?;
        let host = match obj.get("ip_or_host_name") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(Error::MalformedJson(format!(
                    "rpc_meta ip_or_host_name is {other}, not a string"
                )));
            }
        };
        let port = match obj.get("rpc_port") {
            None | Some(Value::Null) => 0,
            Some(p) => p
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| {
                    Error::MalformedJson(format!("rpc_meta rpc_port {p} is not a port number"))
                })?,
        };
        if host.is_empty() {
            return Err(Error::Metadata(
                "rpc_meta entry has no ip_or_host_name".into(),
            ));
        }
        if port == 0 {
            return Err(Error::Metadata(format!(
                "rpc_meta entry for {host} has no rpc_port"
            )));
        }
        Ok(RpcMeta {
            ip_or_host_name: host,
            rpc_port: port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prefixes() {
        assert_eq!(key_prefix(None), "mooncake/");
        assert_eq!(key_prefix(Some("")), "mooncake/");
        assert_eq!(key_prefix(Some("prod")), "mooncake/prod/");
        assert_eq!(key_prefix(Some("prod/")), "mooncake/prod/");
    }

    #[test]
    fn segment_keys() {
        assert_eq!(
            segment_key(None, "10.0.0.5:12345"),
            "mooncake/ram/10.0.0.5:12345"
        );
        assert_eq!(
            segment_key(Some("c1"), "10.0.0.5:12345"),
            "mooncake/c1/ram/10.0.0.5:12345"
        );
        assert_eq!(segment_key(None, "nvmeof/a"), "mooncake/nvmeof/a");
        assert_eq!(segment_key(Some("c1/"), "x/y"), "mooncake/c1/x/y");
    }

    #[test]
    fn rpc_meta_keys() {
        assert_eq!(rpc_meta_key(None, "h:1"), "mooncake/rpc_meta/h:1");
        assert_eq!(rpc_meta_key(Some("c1"), "h:1"), "mooncake/c1/rpc_meta/h:1");
    }

    #[test]
    fn rpc_meta_round_trip() {
        let m = RpcMeta {
            ip_or_host_name: "10.0.0.5".into(),
            rpc_port: 16001,
        };
        let v = m.to_json();
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"ip_or_host_name":"10.0.0.5","rpc_port":16001}"#
        );
        assert_eq!(RpcMeta::from_json(&v).unwrap(), m);
    }

    #[test]
    fn rpc_meta_rejects() {
        for bad in [
            json!({"ip_or_host_name": 5, "rpc_port": 1}),
            json!({"ip_or_host_name": "h", "rpc_port": "1"}),
            json!({"ip_or_host_name": "h", "rpc_port": 65536}),
            json!({"ip_or_host_name": "h", "rpc_port": -1}),
            json!("h:1"),
        ] {
            assert!(
                matches!(RpcMeta::from_json(&bad), Err(Error::MalformedJson(_))),
                "{bad}"
            );
        }
        for bad in [json!({"rpc_port": 1}), json!({"ip_or_host_name": "h"})] {
            assert!(
                matches!(RpcMeta::from_json(&bad), Err(Error::Metadata(_))),
                "{bad}"
            );
        }
    }
}
