//! What the handshake listener serves: the engine's own segment descriptor
//! (Metadata requests), received notifications (Notify), probes, and the
//! transports' handshakes (RDMA's Connection, shared memory's attach),
//! which go to the installed transport that serves them, and otherwise get
//! the answer the transport table gives for a transport not installed.

use crate::rpc::FrameKind;
use crate::rpc::server::RpcHandler;
use crate::sync;
use crate::transport::Handshake;
use crate::transport::registry;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use tracing::debug;

use crate::settings::Range;

crate::settings::settings! {
    /// Notifications: the bounds of the queue of those received, and how
    /// long one sent is tried again. Each setting (variables, Mooncake's
    /// default and bounds, meaning) is declared once in the table below.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct NotifyLimits("notify") {
        /// `MC_NOTIFY_MAX_SIZE`: largest notification
        /// accepted (name and message bytes).
        max_size: usize = 64 << 10, ["MC_NOTIFY_MAX_SIZE"], Range(1usize, 128 << 20),
            "largest notification received (name and message), bytes; larger ones are \
             refused to the sender";
        /// `MC_NOTIFY_QUEUE_MAX_COUNT`: notifications kept
        /// until `getNotifsFromEngine`; more are refused to their senders.
        max_count: usize = 1 << 16, ["MC_NOTIFY_QUEUE_MAX_COUNT"], Range(1usize, 1 << 24),
            "notifications kept until `getNotifsFromEngine`; beyond, new ones are refused to \
             their senders (whose `te_notify_status` says so after retrying)";
        /// `MC_NOTIFY_QUEUE_MAX_BYTES`: bytes of
        /// notifications kept; more are refused to their senders.
        max_bytes: usize = 64 << 20, ["MC_NOTIFY_QUEUE_MAX_BYTES"], Range(64usize << 10, 64 << 30),
            "bytes of notifications kept; beyond, new ones are refused to their senders";
        /// `MC_TE_NOTIFY_TIMEOUT_SEC`: how long after its batch completed a
        /// notification is sent again while its peer cannot take it.
        retry_secs: u64 = 10, ["MC_TE_NOTIFY_TIMEOUT_SEC"], Range(0u64, 3600),
            "seconds after its batch completed that a notification is sent again while its \
             peer refuses connections (restarting) or its queue is full; then it FAILS \
             (`te_notify_status`). A notification the peer may have received is never sent \
             again";
    };
}

/// Received notifications, oldest first, and their size.
#[derive(Default)]
struct NotifyQueue {
    items: VecDeque<(String, String)>,
    bytes: usize,
    /// Refused because the queue was full, since the engine started.
    full: u64,
    /// Refused for their size since the engine started.
    refused: u64,
}

/// State shared between the engine and its handshake listener.
#[derive(Default)]
pub struct ControlState {
    /// The descriptor served to peers, and its JSON text as a Metadata
    /// reply sends it (shared by the replies under way).
    local_desc: RwLock<Option<(Value, Arc<[u8]>)>>,
    notifies: Mutex<NotifyQueue>,
    limits: NotifyLimits,
    /// This engine's incarnation (its descriptor's generation prefix): a
    /// notification addressed to another one is refused.
    instance: String,
    /// The handshake requests installed transports answer.
    handshakes: RwLock<Vec<Handshake>>,
}

/// A notification request's field naming the incarnation of the engine it
/// is for (the generation prefix of the descriptor its sender moved the
/// batch's data by); Mooncake peers neither send nor read it.
pub const INSTANCE_FIELD: &str = "te_instance";

/// A refusal's field saying that the notification was not queued and may
/// be sent again (the receiver's queue was full).
pub const RETRY_FIELD: &str = "te_retry";

/// Why a full queue refused a notification.
const FULL: &str = "notification refused: the receiver's queue is full \
                    (MC_NOTIFY_QUEUE_MAX_COUNT, MC_NOTIFY_QUEUE_MAX_BYTES); it has not taken \
                    the earlier ones";

/// Why a notification was not queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyRefusal {
    /// Name and message together exceed [`NotifyLimits::max_size`].
    TooLarge {
        /// Bytes of name and message.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The queue holds its bound of notifications or bytes: the receiver
    /// has not taken them (the sender may try again later).
    Full,
    /// It was sent to another incarnation of this engine (the sender
    /// moved its data to a process that has exited since).
    OtherInstance,
}

impl std::fmt::Display for NotifyRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotifyRefusal::TooLarge { size, max } => write!(
                f,
                "notification of {size} bytes refused: the limit is {max} (MC_NOTIFY_MAX_SIZE)"
            ),
            NotifyRefusal::Full => f.write_str(FULL),
            NotifyRefusal::OtherInstance => f.write_str(
                "notification refused: it is addressed to another incarnation of this engine \
                 (the process that received its data has exited)",
            ),
        }
    }
}

impl ControlState {
    /// A control state whose notification queue has `limits`.
    pub fn new(limits: NotifyLimits, instance: String) -> Self {
        ControlState {
            limits,
            instance,
            ..ControlState::default()
        }
    }

    /// Routes `handshake.kind` requests to a transport from now on.
    pub fn set_handshake(&self, handshake: Handshake) {
        let mut all = sync::write(&self.handshakes);
        all.retain(|h| h.kind != handshake.kind);
        all.push(handshake);
    }

    /// Refuses the transports' requests again (they are gone).
    pub fn clear_handshakes(&self) {
        sync::write(&self.handshakes).clear();
    }

    /// Sets the descriptor served to peers.
    pub fn set_local_desc(&self, desc: Value) {
        let text: Arc<[u8]> = format!("{desc}\n").into_bytes().into();
        *sync::write(&self.local_desc) = Some((desc, text));
    }

    /// The descriptor served to peers, once a transport is installed.
    pub fn local_desc(&self) -> Option<Value> {
        sync::read(&self.local_desc)
            .as_ref()
            .map(|(v, _)| v.clone())
    }

    /// Queues a received notification; refuses one larger than
    /// [`NotifyLimits::max_size`], and one beyond the queue's count and
    /// byte bounds (those queued stay until taken).
    pub fn push_notify(&self, name: String, msg: String) -> Result<(), NotifyRefusal> {
        let size = name.len() + msg.len();
        // One notification never exceeds the whole queue.
        let max = self.limits.max_size.min(self.limits.max_bytes);
        let mut q = sync::lock(&self.notifies);
        if size > max {
            q.refused += 1;
            crate::log_limit::warn_limited!(
                "notification of {size} bytes from {name:.64?} refused: the limit is {max} \
                 (MC_NOTIFY_MAX_SIZE); {} refused so far",
                q.refused
            );
            return Err(NotifyRefusal::TooLarge { size, max });
        }
        if q.items.len() >= self.limits.max_count || q.bytes + size > self.limits.max_bytes {
            // A notification the receiver has not taken is never dropped
            // for a newer one: the newer one is refused, and its sender
            // knows (it tries again while the receiver takes them).
            q.full += 1;
            crate::log_limit::warn_limited!(
                "notification queue full ({} notifications, {} bytes; limits \
                 MC_NOTIFY_QUEUE_MAX_COUNT={}, MC_NOTIFY_QUEUE_MAX_BYTES={}): refused one from \
                 {name:.64?}; {} refused so far",
                q.items.len(),
                q.bytes,
                self.limits.max_count,
                self.limits.max_bytes,
                q.full
            );
            return Err(NotifyRefusal::Full);
        }
        q.items.push_back((name, msg));
        q.bytes += size;
        Ok(())
    }

    /// Takes every queued notification, oldest first.
    pub fn take_notifies(&self) -> Vec<(String, String)> {
        let mut q = sync::lock(&self.notifies);
        q.bytes = 0;
        q.items.drain(..).collect()
    }
}

impl RpcHandler for ControlState {
    fn shared_reply(&self, kind: FrameKind) -> Option<Arc<[u8]>> {
        if kind != FrameKind::Metadata {
            return None;
        }
        sync::read(&self.local_desc)
            .as_ref()
            .map(|(_, text)| text.clone())
    }

    fn handle(&self, kind: FrameKind, request: Value, peer: SocketAddr) -> Value {
        match kind {
            FrameKind::Metadata => self.local_desc().unwrap_or(Value::Null),
            FrameKind::Notify => {
                let field = |k: &str| request.get(k).and_then(Value::as_str).map(str::to_string);
                // A reply without `notify_msg` is a failure to the sender
                // (Mooncake's client and ours).
                match (field("name"), field("notify_msg")) {
                    (Some(name), Some(msg)) => {
                        debug!("notification from {name:?}");
                        let to = request.get(INSTANCE_FIELD).and_then(Value::as_str);
                        let pushed = match to {
                            Some(to) if to != self.instance => Err(NotifyRefusal::OtherInstance),
                            _ => self.push_notify(name, msg),
                        };
                        match pushed {
                            Ok(()) => json!({"name": "", "notify_msg": "success"}),
                            // Not queued: the sender may try again.
                            Err(e @ NotifyRefusal::Full) => {
                                json!({"name": "", "error": e.to_string(), RETRY_FIELD: true})
                            }
                            Err(e) => json!({"name": "", "error": e.to_string()}),
                        }
                    }
                    _ => {
                        crate::log_limit::warn_limited!(
                            "malformed notification ({} bytes of JSON) refused",
                            request.to_string().len()
                        );
                        json!({"name": "", "error": "a notification needs string fields name and notify_msg"})
                    }
                }
            }
            FrameKind::Probe => json!({"status": "success"}),
            // A transport's handshake: its answer if it is installed, else
            // the answer the transport table gives for it.
            _ => {
                let handlers = sync::read(&self.handshakes);
                match handlers.iter().find(|h| h.kind == kind) {
                    Some(h) => (h.answer)(&request, peer),
                    None => registry::not_installed(kind).unwrap_or_else(
                        || json!({"error": format!("no transport serves {kind:?} requests")}),
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 40000))
    }

    fn state(max_size: usize, max_count: usize, max_bytes: usize) -> ControlState {
        ControlState::new(
            NotifyLimits {
                max_size,
                max_count,
                max_bytes,
                retry_secs: 0,
            },
            "me".into(),
        )
    }

    fn notify(name: &str, msg: &str) -> Value {
        json!({"name": name, "notify_msg": msg})
    }

    #[test]
    fn notifications_are_queued_in_order() {
        let s = ControlState::new(NotifyLimits::default(), "me".into());
        for i in 0..3 {
            let reply = s.handle(FrameKind::Notify, notify(&format!("n{i}"), "m"), peer());
            assert_eq!(reply["notify_msg"], "success");
        }
        let got = s.take_notifies();
        assert_eq!(
            got.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["n0", "n1", "n2"]
        );
        assert!(s.take_notifies().is_empty());
    }

    #[test]
    fn oversized_notification_is_refused_with_a_failure_reply() {
        let s = state(10, 100, 1000);
        // 10 bytes in all: accepted.
        assert_eq!(
            s.handle(FrameKind::Notify, notify("abcd", "efghij"), peer())["notify_msg"],
            "success"
        );
        // 11 bytes: refused, and the reply has no notify_msg.
        let reply = s.handle(FrameKind::Notify, notify("abcd", "efghijk"), peer());
        assert!(reply.get("notify_msg").is_none(), "{reply}");
        assert!(
            reply["error"]
                .as_str()
                .is_some_and(|e| e.contains("MC_NOTIFY_MAX_SIZE"))
        );
        assert_eq!(s.take_notifies().len(), 1);
    }

    #[test]
    fn malformed_notification_gets_a_failure_reply() {
        let s = ControlState::new(NotifyLimits::default(), "me".into());
        let reply = s.handle(FrameKind::Notify, json!({"name": 1}), peer());
        assert!(reply.get("notify_msg").is_none(), "{reply}");
        assert!(s.take_notifies().is_empty());
    }

    #[test]
    fn at_the_count_bound_new_notifications_are_refused_and_queued_ones_kept() {
        let s = state(100, 3, 1 << 20);
        for i in 0..3 {
            s.push_notify(format!("n{i}"), String::new())
                .expect("queued");
        }
        assert_eq!(
            s.push_notify("n3".into(), String::new()),
            Err(NotifyRefusal::Full)
        );
        let reply = s.handle(FrameKind::Notify, notify("n4", ""), peer());
        assert!(reply.get("notify_msg").is_none(), "{reply}");
        assert_eq!(reply[RETRY_FIELD], true, "a full queue invites a retry");
        let names: Vec<String> = s.take_notifies().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["n0", "n1", "n2"]);
        assert_eq!(s.notifies.lock().unwrap().full, 2);
        // Taken, they make room again.
        s.push_notify("n5".into(), String::new()).expect("queued");
    }

    #[test]
    fn at_the_byte_bound_new_notifications_are_refused_and_the_total_stays_within_it() {
        let s = state(1000, 1000, 2500);
        for i in 0..10 {
            let pushed = s.push_notify(format!("{i}"), "x".repeat(999));
            assert_eq!(pushed.is_ok(), i < 2, "{i}");
            let q = s.notifies.lock().unwrap();
            assert!(q.bytes <= 2500, "{} bytes queued", q.bytes);
            assert_eq!(
                q.bytes,
                q.items
                    .iter()
                    .map(|(n, m)| n.len() + m.len())
                    .sum::<usize>()
            );
        }
        let names: Vec<String> = s.take_notifies().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["0", "1"]);
        assert_eq!(s.notifies.lock().unwrap().bytes, 0);
        // A notification as large as the whole byte bound fits an empty
        // queue.
        let s = state(2500, 1000, 2500);
        s.push_notify("b".into(), "x".repeat(2499)).expect("queued");
        assert_eq!(s.take_notifies().len(), 1);
    }

    #[test]
    fn a_notification_for_another_incarnation_is_refused() {
        let s = state(64, 4, 1024);
        let mut n = notify("a", "for me");
        n[INSTANCE_FIELD] = json!("me");
        let reply = s.handle(FrameKind::Notify, n.clone(), peer());
        assert_eq!(reply["notify_msg"], "success");
        n[INSTANCE_FIELD] = json!("an earlier me");
        let reply = s.handle(FrameKind::Notify, n, peer());
        assert!(reply.get("notify_msg").is_none(), "{reply}");
        assert!(reply.get(RETRY_FIELD).is_none(), "not worth a retry");
        // Without the field (Mooncake's senders), it is queued.
        let reply = s.handle(FrameKind::Notify, notify("b", "plain"), peer());
        assert_eq!(reply["notify_msg"], "success");
        assert_eq!(s.take_notifies().len(), 2);
    }

    #[test]
    fn a_handshake_of_a_transport_not_installed_gets_the_tables_answer() {
        let s = state(64, 4, 1024);
        let reply = s.handle(FrameKind::Connection, json!({}), peer());
        assert_eq!(
            reply["reply_msg"],
            "this engine has no RDMA transport installed"
        );
        assert_eq!(reply["qp_num"], json!([]), "Mooncake's reply shape");
        let reply = s.handle(FrameKind::ShmAttach, json!({}), peer());
        assert_eq!(
            reply["error"],
            "this engine has no shared-memory transport installed"
        );
    }
}
