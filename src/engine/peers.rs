//! How this engine meets its peers: the metadata store, the descriptors
//! and handshake addresses of the segments it opens (fetched, bounded,
//! cached and refreshed), probes and notifications.

use super::control::{INSTANCE_FIELD, RETRY_FIELD};
use super::{Engine, LOCAL_SEGMENT_ID, publish, refused};
use crate::batch::{Batch, PendingNotify};
use crate::engine::config::Config;
use crate::error::{Error, Result};
use crate::metadata::conn::MetadataConn;
use crate::metadata::descriptor::{Layout, SegmentDesc};
use crate::metadata::etcd::EtcdStore;
use crate::metadata::http::HttpStore;
use crate::metadata::keys::{RpcMeta, rpc_meta_key, segment_key};
use crate::metadata::redis::RedisStore;
use crate::metadata::store::MetadataStore;
use crate::peer_jobs::Finish;
use crate::rpc::{ClientOptions, FrameKind, canonical_name, parse_host_port};
use crate::segment::{RemoteSegment, SegmentBuffer};
use crate::sync;
use crate::transport::PeerDirectory;
use crate::transport::registry;
use serde_json::{Value, json};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tracing::info;

/// The first pause between two tries of a notification its peer did not
/// take; each pause doubles, up to [`NOTIFY_LONGEST_PAUSE`].
const NOTIFY_FIRST_PAUSE: Duration = Duration::from_millis(20);
const NOTIFY_LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// Why one try of a notification failed.
enum Undelivered {
    /// The peer surely did not get it (refused at connect, or its queue
    /// was full): it may be sent again.
    Not(String),
    /// The peer may have got it (sent, then no answer), or refused it for
    /// good: it is not sent again.
    Maybe(String),
}

/// A batch whose notification a background job sends: the job dropped
/// without running (the engine stopping, or too many jobs waiting)
/// fails it.
struct Sending {
    batch: Arc<Batch>,
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.batch.notify_ended(Err(
            "the job that sends it did not run (the engine is stopping, or too many \
             background jobs wait)"
                .into(),
        ));
    }
}

/// Whether `desc` names each buffer by its location (and lists devices),
/// as the transport table lays out its protocol, rather than by its owner.
fn located(desc: &SegmentDesc) -> bool {
    matches!(
        registry::layout(&desc.protocol),
        Some(Layout::RdmaLike { .. })
    )
}

/// The store behind a connection string (`None` in P2P mode); values
/// larger than `MC_PEER_MAX_DESCRIPTOR_BYTES` are refused.
pub(super) fn open_store(
    conn: &MetadataConn,
    cfg: &Config,
) -> Result<Option<Box<dyn MetadataStore>>> {
    let max = cfg.peers.max_descriptor_bytes;
    Ok(match conn {
        MetadataConn::P2p => None,
        MetadataConn::Http(url) => Some(Box::new(
            HttpStore::from_config(url, &cfg.store)?.limit_values(max),
        )),
        MetadataConn::Etcd(endpoints) => Some(Box::new(
            EtcdStore::from_config(endpoints, &cfg.store)?.limit_values(max),
        )),
        MetadataConn::Redis(addr) => Some(Box::new(
            RedisStore::from_config(addr, false, &cfg.store)?.limit_values(max),
        )),
        MetadataConn::Rediss(addr) => Some(Box::new(
            RedisStore::from_config(addr, true, &cfg.store)?.limit_values(max),
        )),
    })
}

/// Checks that a peer's descriptor stays within `MC_PEER_MAX_DEVICES` and
/// `MC_PEER_MAX_BUFFERS` before it is decoded, so a hostile or broken peer
/// cannot make this engine hold, or connect to, what it lists beyond them.
fn check_peer_bounds(name: &str, json: &serde_json::Value, cfg: &Config) -> Result<()> {
    let count = |key: &str| {
        json.get(key)
            .and_then(serde_json::Value::as_array)
            .map_or(0, Vec::len)
    };
    let devices = registry::TRANSPORTS
        .iter()
        .flat_map(|e| e.device_lists)
        .map(|&(key, what)| (key, what, cfg.peers.max_devices, "MC_PEER_MAX_DEVICES"));
    let buffers = (
        "buffers",
        "buffers",
        cfg.peers.max_buffers,
        "MC_PEER_MAX_BUFFERS",
    );
    for (key, what, max, var) in devices.chain([buffers]) {
        let n = count(key);
        if n > max {
            return Err(Error::Metadata(format!(
                "segment {name:?} publishes {n} {what}; at most {max} are accepted ({var})"
            )));
        }
    }
    Ok(())
}

/// The engine's peers, as its transports may ask about them.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(super) struct Peers(pub(super) Weak<Engine>);

impl PeerDirectory for Peers {
    fn peer(
        &self,
        server: &str,
        fresh: bool,
        rpc: &ClientOptions,
    ) -> std::result::Result<(String, SegmentDesc), String> {
        let engine = self.0.upgrade().ok_or("the engine is being destroyed")?;
        engine
            .peer_record(server, fresh, rpc)
            .map_err(|e| e.to_string())
    }
}

impl Engine {
    pub(super) fn cluster(&self) -> Option<&str> {
        self.config.store.cluster_id.as_deref()
    }

    /// Options of this engine's handshake calls: cancelled when it is
    /// destroyed.
    fn rpc_options(&self) -> ClientOptions {
        ClientOptions {
            cancel: Some(self.cancel.clone()),
            ..ClientOptions::from_config(&self.config.rpc)
        }
    }

    /// Options of a call whose reply the peer sends at once (a
    /// notification, a probe): the reply is waited for at most
    /// `MC_HANDSHAKE_IO_TIMEOUT`, the peer's own bound on answering.
    fn short_call_options(&self) -> ClientOptions {
        ClientOptions {
            io_timeout: std::time::Duration::from_secs(self.config.rpc.io_timeout_secs),
            ..self.rpc_options()
        }
    }

    /// The name the owner of segment `name` answers to (see
    /// [`RemoteSegment::identity`]): in P2P mode `name` as `host:port`,
    /// with a store `name` itself.
    fn identity(&self, name: &str) -> String {
        match &self.store {
            None => canonical_name(name, self.config.rpc.handshake_port),
            Some(_) => name.to_string(),
        }
    }

    /// `rpc` for a call to the handshake listener of segment `name`: with
    /// a cluster key, the call authenticates to its owner's identity.
    fn to_peer(&self, rpc: &ClientOptions, name: &str) -> ClientOptions {
        ClientOptions {
            auth: self.auth.clone().map(|k| (k, self.identity(name))),
            ..rpc.clone()
        }
    }

    /// Where the handshake listener of segment `name` is.
    fn rpc_address(&self, name: &str) -> Result<(String, u16)> {
        if name == self.local_name {
            return Ok((self.rpc_ip.clone(), self.rpc.port()));
        }
        match &self.store {
            None => Ok(parse_host_port(name, self.config.rpc.handshake_port)),
            Some(store) => {
                let key = rpc_meta_key(self.cluster(), name);
                let v = store.get(&key)?.ok_or_else(|| {
                    Error::Metadata(format!("{} has no entry {key}", store.describe()))
                })?;
                let meta = RpcMeta::from_json(&v)?;
                Ok((meta.ip_or_host_name, meta.rpc_port))
            }
        }
    }

    /// Fetches and validates the descriptor of segment `name`.
    fn fetch_segment(&self, name: &str) -> Result<RemoteSegment> {
        self.fetch_segment_with(name, &self.rpc_options())
    }

    /// [`Engine::fetch_segment`] with the handshake RPC options `rpc`.
    fn fetch_segment_with(&self, name: &str, rpc: &ClientOptions) -> Result<RemoteSegment> {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        let (json, (data_host, rpc_port)) = match &self.store {
            None => {
                let (host, port) = parse_host_port(name, self.config.rpc.handshake_port);
                let mine = self.control.local_desc().unwrap_or(serde_json::Value::Null);
                let rpc = self.to_peer(rpc, name);
                let reply = crate::rpc::call(&host, port, FrameKind::Metadata, &mine, &rpc)?;
                (reply, (host, port))
            }
            Some(store) => {
                let key = segment_key(self.cluster(), name);
                let v = store.get(&key)?.ok_or_else(|| {
                    Error::Metadata(format!("{} has no segment {key}", store.describe()))
                })?;
                (v, self.rpc_address(name)?)
            }
        };
        if json.is_null() {
            return Err(Error::Metadata(format!(
                "segment {name:?} has no descriptor yet (no transport installed there)"
            )));
        }
        check_peer_bounds(name, &json, &self.config)?;
        let desc = SegmentDesc::from_json(&json)?;
        Ok(RemoteSegment {
            name: name.to_string(),
            identity: self.identity(name),
            desc,
            data_host,
            rpc_port,
            ..Default::default()
        })
    }

    /// What the peer whose server name is `server` publishes, and the
    /// host of its handshake listener: from the cached descriptor of a
    /// segment this engine opened under that name (or whose
    /// `rdma_server_name` it is) unless `fresh`, else fetched with `rpc`
    /// (P2P) or from the store. The own name is answered locally.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    fn peer_record(
        &self,
        server: &str,
        fresh: bool,
        rpc: &ClientOptions,
    ) -> Result<(String, SegmentDesc)> {
        if self.is_own_name(server) {
            let desc = self
                .control
                .local_desc()
                .ok_or_else(|| Error::Metadata("no descriptor published yet".into()))?;
            return Ok((self.rpc_ip.clone(), SegmentDesc::from_json(&desc)?));
        }
        let segment = |name: &str| {
            self.segments
                .id_of(name)
                .and_then(|id| self.segments.get(id))
        };
        let cached = segment(server).or_else(|| {
            self.segments
                .names()
                .iter()
                .filter_map(|n| segment(n))
                .find(|s| s.desc.rdma_server_name.as_deref() == Some(server))
        });
        let name = match cached {
            Some(seg) if !fresh => return Ok((seg.data_host.clone(), seg.desc.clone())),
            // A second (RDMA) name is fetched by the segment's name, as
            // Mooncake maps it (`MC_RDMA_BIND_ADDRESS`).
            Some(seg) => seg.name.clone(),
            None => server.to_string(),
        };
        let seg = self.fetch_segment_with(&name, rpc)?;
        Ok((seg.data_host, seg.desc))
    }

    /// How many times this engine has fetched a peer's descriptor (opening
    /// a segment, refetching or syncing one, an RDMA handshake's check of
    /// its peer): each one handshake call in P2P mode, or two reads of the
    /// store (the segment's descriptor and its RPC address).
    pub fn descriptor_fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    /// Resolves a segment name to its id: the own name is `LOCAL_SEGMENT`;
    /// other names are fetched once and cached.
    pub fn open_segment(&self, name: &str) -> Result<i32> {
        let name = name.trim_start_matches('/');
        if name.is_empty() {
            return Err(Error::InvalidArgument("segment name is empty".into()));
        }
        if self.is_own_name(name) {
            return Ok(LOCAL_SEGMENT_ID);
        }
        if let Some(id) = self.segments.id_of(name) {
            return Ok(id);
        }
        let seg = self.fetch_segment(name)?;
        let carriers: Vec<&str> = self
            .transports()
            .iter()
            .filter(|t| t.speaks(&seg))
            .map(|t| t.kind().protocol)
            .collect();
        info!(
            "opened segment {name:?}: its data goes by {} ({} buffers, {})",
            if carriers.is_empty() {
                "no installed transport".to_string()
            } else {
                carriers.join(", else ")
            },
            seg.desc.buffers.len(),
            if located(&seg.desc) {
                format!(
                    "devices {:?}",
                    seg.desc.devices.iter().map(|d| &d.name).collect::<Vec<_>>()
                )
            } else {
                format!("data port {}", seg.desc.tcp_data_port)
            }
        );
        Ok(self.segments.insert(seg))
    }

    /// The buffers of an open segment: this engine's registered buffers for
    /// `LOCAL_SEGMENT`, else those of the segment's descriptor.
    pub fn segment_buffers(&self, id: i32) -> Result<Vec<SegmentBuffer>> {
        if id == LOCAL_SEGMENT_ID {
            let memory = sync::read(&self.memory);
            return Ok(memory
                .regions()
                .map(|r| SegmentBuffer {
                    addr: r.addr,
                    length: r.length,
                    location: r.location.to_string(),
                })
                .collect());
        }
        self.segments
            .get(id)
            .map(|seg| seg.buffers(located(&seg.desc)))
            .ok_or_else(|| Error::InvalidArgument(format!("segment id {id} is not open")))
    }

    /// The buffers of open segment `id` ([`Engine::segment_buffers`]),
    /// each with the installed transport that a request to the whole buffer
    /// from registered host memory goes to first: the most preferred one
    /// that speaks the segment's descriptor and reaches the buffer (`None`:
    /// none does); `local` for the engine's own segment.
    pub fn segment_carriers(&self, id: i32) -> Result<Vec<(SegmentBuffer, Option<&'static str>)>> {
        if id == LOCAL_SEGMENT_ID {
            let local = Some("local");
            return Ok(self
                .segment_buffers(id)?
                .into_iter()
                .map(|b| (b, local))
                .collect());
        }
        let seg = self
            .segments
            .get(id)
            .ok_or_else(|| Error::InvalidArgument(format!("segment id {id} is not open")))?;
        let transports = self.transports();
        Ok(seg
            .buffers(located(&seg.desc))
            .into_iter()
            .map(|b| {
                let carrier = transports
                    .iter()
                    .find(|t| t.speaks(&seg) && t.reaches(&seg, b.addr, b.length))
                    .map(|t| t.kind().protocol);
                (b, carrier)
            })
            .collect())
    }

    /// Refetches the descriptor of `name` if it is cached.
    /// A descriptor that changed (new buffers, a restarted owner: a new
    /// generation) replaces the cached one, so stale buffers are never used;
    /// an unchanged one keeps its rails.
    pub fn sync_segment(&self, name: &str) {
        self.refetch_segment(name.trim_start_matches('/'));
    }

    /// [`Engine::sync_segment`]; whether a changed descriptor replaced the
    /// cached one (not when the fetch failed or the name is not cached).
    pub(super) fn refetch_segment(&self, name: &str) -> bool {
        let Some(id) = self.segments.id_of(name) else {
            return false;
        };
        match self.fetch_segment(name) {
            Ok(seg) => match self.segments.get(id) {
                Some(old)
                    if old.desc.same_content(&seg.desc)
                        && old.data_host == seg.data_host
                        && old.rpc_port == seg.rpc_port =>
                {
                    old.freshness.refreshed();
                    false
                }
                _ => {
                    info!("segment {name:?} changed; using its new descriptor");
                    self.segments.insert(seg);
                    true
                }
            },
            Err(e) => {
                if let (Error::Unreachable(_), Some(seg)) = (&e, self.segments.get(id)) {
                    seg.freshness.peer_down();
                }
                crate::log_limit::warn_limited!("refreshing segment {name:?}: {e}");
                false
            }
        }
    }

    /// Refetches every cached remote descriptor.
    pub fn sync_all_segments(&self) {
        for name in self.segments.names() {
            self.sync_segment(&name);
        }
    }

    /// Drops `name` from the descriptor cache.
    pub fn remove_segment(&self, name: &str) -> Result<()> {
        let name = name.trim_start_matches('/');
        if name.is_empty() {
            return Err(Error::InvalidArgument("segment name is empty".into()));
        }
        self.segments.remove(name);
        Ok(())
    }

    /// Asks the handshake listener of segment `name` whether it is alive
    /// (Mooncake's `sendProbe`): its address comes from the name in P2P
    /// mode, from its `rpc_meta` entry with a store.
    pub fn send_probe(&self, name: &str) -> Result<()> {
        let name = name.trim_start_matches('/');
        if name.is_empty() {
            return Err(Error::InvalidArgument("segment name is empty".into()));
        }
        let (host, port) = self.rpc_address(name)?;
        crate::rpc::call(
            &host,
            port,
            FrameKind::Probe,
            &json!({}),
            &self.to_peer(&self.short_call_options(), name),
        )
        .map(|_| ())
    }

    /// The name of segment `target_id` (this engine's for
    /// `LOCAL_SEGMENT`).
    fn segment_name(&self, target_id: u64) -> Result<String> {
        match i32::try_from(target_id) {
            Ok(LOCAL_SEGMENT_ID) => Some(self.local_name.clone()),
            Ok(id) => self.segments.get(id).map(|s| s.name.clone()),
            Err(_) => None,
        }
        .ok_or_else(|| Error::Metadata(format!("segment id {target_id} is not open")))
    }

    /// Sends a notification now to the owner of segment `target_id` and
    /// waits for its answer (at most `MC_HANDSHAKE_CONNECT_TIMEOUT` plus
    /// `MC_HANDSHAKE_IO_TIMEOUT`).
    pub fn send_notify(&self, target_id: u64, name: &str, msg: &str) -> Result<()> {
        self.notify_segment(&self.segment_name(target_id)?, name, msg)
    }

    /// Hands the notification of completed batch `batch_id` to the
    /// background, which sends it to the owner of its segment and records
    /// on the batch whether the peer took it ([`Batch::notify_ended`]). It
    /// is addressed to the incarnation of the peer the batch's data went
    /// to (a peer of ours refuses it once restarted), and sent again, for
    /// up to `MC_TE_NOTIFY_TIMEOUT_SEC`, only while the peer surely did
    /// not get it: its handshake port refuses connections, or its queue is
    /// full. A notification the peer may have received (sent, then no
    /// answer) is never sent again: it fails.
    pub(super) fn notify_later(&self, batch_id: u64, batch: Arc<Batch>, n: PendingNotify) {
        let segment = match self.segment_name(n.target_id as u64) {
            Ok(s) => s,
            Err(e) => {
                let why = format!("notification after batch {batch_id:#x} could not be sent: {e}");
                crate::log_limit::warn_limited!("{why}");
                return batch.notify_ended(Err(why));
            }
        };
        let instance = self
            .segments
            .get(n.target_id)
            .and_then(|seg| publish::instance_in(&seg.desc));
        let deadline = Instant::now() + Duration::from_secs(self.config.notify.retry_secs);
        let sending = Sending {
            batch: batch.clone(),
        };
        let to = segment.clone();
        let queued = self.background(&segment, Finish::Flush, move |e| {
            let outcome = e.deliver(&to, instance.as_deref(), &n, deadline);
            if let Err(why) = &outcome {
                crate::log_limit::warn_limited!(
                    "notification after batch {batch_id:#x} to {to:?} not delivered: {why}"
                );
            }
            sending.batch.notify_ended(outcome);
        });
        if let Err(why) = queued {
            let why = format!(
                "notification after batch {batch_id:#x} to {segment:?} dropped: {}",
                refused(why)
            );
            // The job, dropped unrun, failed the notification.
            crate::log_limit::warn_limited!("{why}");
        }
    }

    /// Sends notification `n` to `segment` (addressed to its `instance`
    /// when known) until its peer takes it, refuses it for good, may have
    /// got it, or `deadline` passes.
    fn deliver(
        &self,
        segment: &str,
        instance: Option<&str>,
        n: &PendingNotify,
        deadline: Instant,
    ) -> std::result::Result<(), String> {
        let mut request = json!({"name": n.name, "notify_msg": n.msg});
        if let Some(i) = instance {
            request[INSTANCE_FIELD] = json!(i);
        }
        let mut pause = NOTIFY_FIRST_PAUSE;
        loop {
            let why = match self.call_notify(segment, &request, deadline) {
                Ok(()) => return Ok(()),
                Err(Undelivered::Not(why)) => why,
                Err(Undelivered::Maybe(why)) => {
                    return Err(format!(
                        "{why} (it may have arrived, so it is not sent again)"
                    ));
                }
            };
            if Instant::now() + pause >= deadline {
                return Err(format!(
                    "the peer did not take it within MC_TE_NOTIFY_TIMEOUT_SEC ({}s): {why}",
                    self.config.notify.retry_secs
                ));
            }
            // A destroyed engine sends what it had queued once, and stops
            // trying again.
            if self.closed.load(Ordering::Acquire) {
                return Err(format!(
                    "the engine was destroyed before the peer took it: {why}"
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(NOTIFY_LONGEST_PAUSE);
        }
    }

    /// One try of a notification to `segment`, its waits ending by
    /// `deadline` (a tenth of a second at least).
    fn call_notify(
        &self,
        segment: &str,
        request: &Value,
        deadline: Instant,
    ) -> std::result::Result<(), Undelivered> {
        let (host, port) = self
            .rpc_address(segment)
            .map_err(|e| Undelivered::Not(e.to_string()))?;
        let base = self.to_peer(&self.short_call_options(), segment);
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        let opts = ClientOptions {
            once: true,
            connect_timeout: base.connect_timeout.min(left),
            io_timeout: base.io_timeout.min(left),
            ..base
        };
        let reply = match crate::rpc::call(&host, port, FrameKind::Notify, request, &opts) {
            Ok(reply) => reply,
            // Refused at connect: the request never left.
            Err(e @ Error::Unreachable(_)) => return Err(Undelivered::Not(e.to_string())),
            Err(e) => return Err(Undelivered::Maybe(e.to_string())),
        };
        if reply.get("notify_msg").is_some() {
            return Ok(());
        }
        let why = format!(
            "{segment:?} refused it: {}",
            reply.get("error").unwrap_or(&reply)
        );
        Err(match reply.get(RETRY_FIELD).and_then(Value::as_bool) {
            Some(true) => Undelivered::Not(why),
            _ => Undelivered::Maybe(why),
        })
    }

    /// Sends a notification to the owner of segment `segment`.
    fn notify_segment(&self, segment: &str, name: &str, msg: &str) -> Result<()> {
        let (host, port) = self.rpc_address(segment)?;
        let reply = crate::rpc::call(
            &host,
            port,
            FrameKind::Notify,
            &json!({"name": name, "notify_msg": msg}),
            &self.to_peer(&self.short_call_options(), segment),
        )?;
        if reply.get("notify_msg").is_none() {
            return Err(Error::Metadata(format!(
                "{segment:?} answered the notification with {reply}"
            )));
        }
        Ok(())
    }
}
