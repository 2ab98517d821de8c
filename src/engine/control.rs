//! What the handshake listener serves: the engine's own segment descriptor
//! (Metadata requests), received notifications (Notify), and the refusal of
//! RDMA connection requests, which this engine's transports do not take.

use crate::rpc::FrameKind;
use crate::rpc::server::RpcHandler;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Mutex, RwLock};
use tracing::{debug, warn};

/// Most notifications kept before the oldest are dropped.
const MAX_QUEUED_NOTIFIES: usize = 1 << 16;

/// State shared between the engine and its handshake listener.
#[derive(Default)]
pub struct ControlState {
    local_desc: RwLock<Option<Value>>,
    notifies: Mutex<VecDeque<(String, String)>>,
}

impl ControlState {
    /// Sets the descriptor served to peers.
    pub fn set_local_desc(&self, desc: Value) {
        *self.local_desc.write().unwrap_or_else(|e| e.into_inner()) = Some(desc);
    }

    /// The descriptor served to peers, once a transport is installed.
    pub fn local_desc(&self) -> Option<Value> {
        self.local_desc
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Queues a received notification.
    pub fn push_notify(&self, name: String, msg: String) {
        let mut q = self.notifies.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= MAX_QUEUED_NOTIFIES {
            warn!("notification queue full ({MAX_QUEUED_NOTIFIES}); dropping the oldest");
            q.pop_front();
        }
        q.push_back((name, msg));
    }

    /// Takes every queued notification, oldest first.
    pub fn take_notifies(&self) -> Vec<(String, String)> {
        self.notifies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect()
    }
}

impl RpcHandler for ControlState {
    fn handle(&self, kind: FrameKind, request: Value) -> Value {
        match kind {
            FrameKind::Metadata => self.local_desc().unwrap_or(Value::Null),
            FrameKind::Notify => {
                let field = |k: &str| request.get(k).and_then(Value::as_str).map(str::to_string);
                match (field("name"), field("notify_msg")) {
                    (Some(name), Some(msg)) => {
                        debug!("notification from {name:?}");
                        self.push_notify(name, msg);
                        json!({"name": "", "notify_msg": "success"})
                    }
                    _ => {
                        warn!("malformed notification: {request}");
                        json!({"name": "", "notify_msg": ""})
                    }
                }
            }
            FrameKind::Connection => json!({
                "local_nic_path": "",
                "local_lid": 0,
                "local_gid": "",
                "peer_nic_path": "",
                "qp_num": [],
                "reply_msg": "this engine has no RDMA transport installed",
            }),
            FrameKind::Probe => json!({"status": "success"}),
        }
    }
}
