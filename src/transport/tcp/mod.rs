//! The TCP transport: Mooncake's wire protocol (v1 and acknowledged v2) with
//! persistent pipelined lanes per peer, slices spread over the lanes by
//! load, and a server that validates every request before touching memory.

mod lane;
mod server;
pub mod wire;

pub use lane::{LaneTimeouts, PeerAddr, Slice};
pub use server::request_allowed;

use crate::config::Config;
use crate::engine::memory::MemoryRegistry;
use crate::engine::planner;
use crate::error::{Error, Result};
use lane::Lane;
use server::TcpServer;
use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tracing::info;

/// A running TCP transport.
pub struct TcpTransport {
    server: TcpServer,
    peers: Mutex<HashMap<PeerAddr, Arc<[Lane]>>>,
    lanes_per_peer: usize,
    timeouts: LaneTimeouts,
    slice_size: u64,
    fragment_limit: u64,
    closed: AtomicBool,
}

impl TcpTransport {
    /// Starts the data server on `listener` over the buffers of `memory`.
    pub fn start(
        listener: TcpListener,
        memory: Arc<RwLock<MemoryRegistry>>,
        cfg: &Config,
    ) -> Result<TcpTransport> {
        let stall = Duration::from_secs(cfg.tcp_status_timeout_secs);
        let server = TcpServer::start(listener, memory, stall)
            .map_err(|e| Error::Socket(format!("tcp data server could not start: {e}")))?;
        info!(port = server.port(), "tcp transport listening");
        Ok(TcpTransport {
            server,
            peers: Mutex::new(HashMap::new()),
            lanes_per_peer: cfg.tcp_lanes_per_peer,
            timeouts: LaneTimeouts {
                connect: Duration::from_secs(cfg.handshake_connect_timeout_secs),
                stall,
            },
            slice_size: cfg.slice_size,
            fragment_limit: cfg.fragment_limit,
            closed: AtomicBool::new(false),
        })
    }

    /// The data port peers connect to.
    pub fn data_port(&self) -> u16 {
        self.server.port()
    }

    fn lanes(&self, peer: &PeerAddr) -> Option<Arc<[Lane]>> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        if let Some(l) = peers.get(peer) {
            return Some(l.clone());
        }
        let mut lanes = Vec::with_capacity(self.lanes_per_peer);
        for i in 0..self.lanes_per_peer {
            match Lane::start(peer.clone(), self.timeouts, format!("te-tcp-lane-{i}")) {
                Ok(l) => lanes.push(l),
                Err(e) => tracing::warn!(
                    "tcp: could not start lane {i} to {}:{}: {e}",
                    peer.host,
                    peer.port
                ),
            }
        }
        if lanes.is_empty() {
            return None;
        }
        let lanes: Arc<[Lane]> = lanes.into();
        peers.insert(peer.clone(), lanes.clone());
        Some(lanes)
    }

    /// Moves the bytes of `whole` (one request) as slices spread over the
    /// peer's lanes by load. The task's slices are counted before the first
    /// one is queued.
    pub fn submit(&self, peer: &PeerAddr, whole: Slice) {
        let Some(t) = whole.batch.slot(whole.task) else {
            return;
        };
        let n = planner::slice_count(whole.len, self.slice_size, self.fragment_limit);
        t.add_slices(n);
        let Some(lanes) = self.lanes(peer) else {
            for _ in 0..n {
                t.finish_slice(0, false);
            }
            return;
        };
        for (off, len) in planner::slices(whole.len, self.slice_size, self.fragment_limit) {
            let lane = lanes.iter().min_by_key(|l| l.load()).unwrap_or(&lanes[0]);
            lane.send(Slice {
                batch: whole.batch.clone(),
                task: whole.task,
                local: whole.local + off,
                remote: whole.remote + off,
                len,
                write: whole.write,
            });
        }
    }

    /// Fails queued work, closes every connection and joins every thread.
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        let peers = std::mem::take(&mut *self.peers.lock().unwrap_or_else(|e| e.into_inner()));
        for lanes in peers.values() {
            for lane in lanes.iter() {
                lane.shutdown();
            }
        }
        self.server.shutdown();
    }
}
