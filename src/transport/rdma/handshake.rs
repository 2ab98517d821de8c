//! The Connection message of the handshake RPC (spec §3.4, §3.5): the JSON
//! two engines exchange to connect their queue pairs, as Mooncake's
//! `TransferHandshakeUtil` encodes and decodes it.
//!
//! A NIC path is `<server name>@<device>`. The `ready_ack` key is present
//! only when its sender implements the second, confirming Connection
//! message (`ready_ack: true`) after moving its queue pairs to RTS.

use serde_json::{Value, json};

/// One side's view of an endpoint, as sent in a Connection frame.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HandshakeDesc {
    /// The sender's NIC path.
    pub local_nic_path: String,
    /// The sender's LID (0 on RoCE).
    pub local_lid: u16,
    /// The sender's GID, in Mooncake's text form.
    pub local_gid: String,
    /// The NIC path the sender wants to reach.
    pub peer_nic_path: String,
    /// The sender's queue pair numbers.
    pub qp_num: Vec<u32>,
    /// `None`: the sender does not do ready ACKs; `Some(true)`: this is the
    /// ready ACK; `Some(false)`: a setup message from a sender that will
    /// send one.
    pub ready_ack: Option<bool>,
    /// Non-empty in a reply: the receiver refused, and why.
    pub reply_msg: String,
}

impl HandshakeDesc {
    /// A refusal carrying `why`.
    pub fn rejection(why: impl Into<String>) -> HandshakeDesc {
        HandshakeDesc {
            reply_msg: why.into(),
            ..HandshakeDesc::default()
        }
    }

    /// The JSON Mooncake's encoder writes.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "payload": "",
            "local_nic_path": self.local_nic_path,
            "local_lid": self.local_lid,
            "local_gid": self.local_gid,
            "peer_nic_path": self.peer_nic_path,
            "qp_num": self.qp_num,
            "reply_msg": self.reply_msg,
        });
        if let Some(ack) = self.ready_ack {
            v["ready_ack"] = Value::Bool(ack);
        }
        v
    }

    /// Decodes a Connection message as Mooncake does: missing strings are
    /// empty, a missing or non-numeric LID is 0, `ready_ack` present but
    /// not a boolean means `Some(false)`. Queue pair numbers that are not
    /// unsigned 32-bit integers are an error.
    pub fn from_json(v: &Value) -> Result<HandshakeDesc, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| format!("connection message is not a JSON object: {v}"))?;
        let text = |k: &str| {
            obj.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let qp_num = match obj.get("qp_num") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|q| {
                    q.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| format!("qp_num entry {q} is not a queue pair number"))
                })
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(format!("qp_num is not an array: {other}")),
        };
        Ok(HandshakeDesc {
            local_nic_path: text("local_nic_path"),
            local_lid: obj
                .get("local_lid")
                .and_then(Value::as_u64)
                .and_then(|n| u16::try_from(n).ok())
                .unwrap_or(0),
            local_gid: text("local_gid"),
            peer_nic_path: text("peer_nic_path"),
            qp_num,
            ready_ack: obj.get("ready_ack").map(|a| a.as_bool().unwrap_or(false)),
            reply_msg: text("reply_msg"),
        })
    }
}

/// `<server>@<device>`.
pub fn nic_path(server: &str, device: &str) -> String {
    format!("{server}@{device}")
}

/// Splits a NIC path at its last `@` into server name and device; `None`
/// if either part is empty.
pub fn split_nic_path(path: &str) -> Option<(&str, &str)> {
    let (server, device) = path.rsplit_once('@')?;
    (!server.is_empty() && !device.is_empty()).then_some((server, device))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_mooncake_keys() {
        let d = HandshakeDesc {
            local_nic_path: "10.0.0.1:15000@mlx5_0".into(),
            local_lid: 0,
            local_gid: "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01".into(),
            peer_nic_path: "10.0.0.2:15001@mlx5_1".into(),
            qp_num: vec![17, 18],
            ready_ack: Some(false),
            reply_msg: String::new(),
        };
        let v = d.to_json();
        for k in [
            "payload",
            "local_nic_path",
            "local_lid",
            "local_gid",
            "peer_nic_path",
            "qp_num",
            "ready_ack",
            "reply_msg",
        ] {
            assert!(v.get(k).is_some(), "{k} missing in {v}");
        }
        assert_eq!(HandshakeDesc::from_json(&v).unwrap(), d);
        let mut no_ack = d.clone();
        no_ack.ready_ack = None;
        assert!(no_ack.to_json().get("ready_ack").is_none());
        assert_eq!(HandshakeDesc::from_json(&no_ack.to_json()).unwrap(), no_ack);
    }

    #[test]
    fn decoding_is_as_lenient_as_jsoncpp_where_it_is() {
        let d = HandshakeDesc::from_json(&json!({"local_lid": "x", "ready_ack": 1})).unwrap();
        assert_eq!(d.local_lid, 0);
        assert_eq!(d.ready_ack, Some(false));
        assert!(d.qp_num.is_empty() && d.local_nic_path.is_empty());
        assert!(HandshakeDesc::from_json(&json!({"qp_num": [-1]})).is_err());
        assert!(HandshakeDesc::from_json(&json!({"qp_num": "1"})).is_err());
        assert!(HandshakeDesc::from_json(&json!([1])).is_err());
    }

    #[test]
    fn nic_paths() {
        assert_eq!(nic_path("h:1", "mlx5_0"), "h:1@mlx5_0");
        assert_eq!(split_nic_path("h:1@mlx5_0"), Some(("h:1", "mlx5_0")));
        assert_eq!(split_nic_path("a@b@rxe_a0"), Some(("a@b", "rxe_a0")));
        assert_eq!(split_nic_path("nodevice@"), None);
        assert_eq!(split_nic_path("rxe_a0"), None);
    }
}
