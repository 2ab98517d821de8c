//! Both sides of a device's handshakes: ours (run in the transport's
//! connector lanes) and the peer's (a Connection request our listener
//! received, once admitted), each ending with a connected endpoint or a
//! failed one.

use super::{GidChoice, Nic};
use crate::peer_jobs::{Finish, Run};
use crate::rpc::ClientOptions;
use crate::sync;
use crate::transport::Outcome;
use crate::transport::rdma::HANDSHAKE;
use crate::transport::rdma::RdmaTarget;
use crate::transport::rdma::endpoint::{Phase, RdmaEndpoint};
use crate::transport::rdma::handshake::{HandshakeDesc, split_nic_path};
use crate::verbs::{ConnectParams, Gid, gid_to_string, parse_gid};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tracing::{debug, info};

impl Nic {
    /// The RTR/RTS parameters from our GID `g` towards `gid`/`lid`, peer
    /// queue pair `qpn`.
    fn params(&self, g: GidChoice, remote_gid: Gid, remote_lid: u16, qpn: u32) -> ConnectParams {
        ConnectParams {
            port: self.port,
            pkey_index: self.opts.cfg.pkey_index,
            path_mtu: self.path_mtu,
            sgid_index: g.index as u8,
            remote_gid,
            remote_lid,
            remote_qpn: qpn,
            traffic_class: self.opts.cfg.traffic_class,
            service_level: self.opts.cfg.service_level.unwrap_or(0),
            max_dest_rd_atomic: self.rd_atomic,
            max_rd_atomic: self.rd_atomic,
            timeout: self.opts.cfg.ib_timeout,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            hop_limit: 16,
        }
    }

    /// Our side of a handshake for `ep`, with our GID `g`.
    fn local_desc(&self, ep: &RdmaEndpoint, g: GidChoice) -> HandshakeDesc {
        ep.local_desc(&self.path, self.lid, &gid_to_string(&g.gid))
    }

    /// After a setup of `ep` with our GID `used` failed: whether to try
    /// again with another GID. Yes when its queue pair refused RTR with
    /// EINVAL, fewer than `MC_AUTO_GID_MAX_RETRIES` GIDs were tried so far
    /// (`tried`, which `used` joins), and the device uses a GID not tried
    /// yet (the next ranked one, after a re-probe). A series that gives up
    /// starts afresh.
    fn retry_gid(&self, ep: &RdmaEndpoint, used: GidChoice, tried: &mut Vec<GidChoice>) -> bool {
        if !ep.rtr_einval() {
            return false;
        }
        tried.push(used);
        let retry = tried.len() <= self.opts.cfg.auto_gid_max_retries as usize
            && (!tried.contains(&self.gid()) || self.reprobe_gid(tried).is_some());
        if !retry {
            tried.clear();
        }
        retry
    }

    /// The endpoint a peer's handshake sets up: the pooled one to
    /// `peer_nic_path`, or a new one within the bounds on endpoints that
    /// handshakes create (at the total bound the least recently active
    /// one gives way); a refusal says why.
    fn passive_endpoint(
        &self,
        peer_nic_path: &str,
    ) -> std::result::Result<Arc<RdmaEndpoint>, String> {
        let mut pool = sync::lock(&self.pool);
        if let Some(ep) = pool.get(peer_nic_path) {
            if ep.phase() != Phase::Failed {
                pool.touch_passive(&ep);
                return Ok(ep);
            }
            pool.remove(&ep);
        }
        let made_room = pool
            .make_room_for_passive(peer_nic_path, self.passive)
            .inspect_err(|why| {
                crate::log_limit::warn_limited!(
                    "RDMA device {}: refused a handshake: {why}",
                    self.name
                );
            })?;
        if !made_room.is_empty() {
            crate::log_limit::warn_limited!(
                "RDMA device {}: the endpoints that peers' handshakes created are at the bound \
                 (MC_RDMA_MAX_PASSIVE_EP={}); the least recently active ({}) gave way to {}",
                self.name,
                self.passive.total,
                made_room
                    .iter()
                    .map(|e| e.peer_nic_path.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                peer_nic_path
            );
        }
        let ep = self
            .new_endpoint(peer_nic_path)
            .map_err(|e| e.to_string())?;
        let evicted = pool.insert(ep.clone(), true);
        drop(pool);
        self.evicted(&made_room);
        self.evicted(&evicted);
        Ok(ep)
    }

    pub(super) fn request_connect(self: &Arc<Self>, ep: Arc<RdmaEndpoint>, target: RdmaTarget) {
        let server = split_nic_path(&target.peer_nic_path).map_or("", |(s, _)| s);
        if self.gone.is_gone(server) {
            return self.fail_endpoint(
                &ep,
                Outcome::Failed { hard: true },
                "the peer is gone (it answered no Probe); not connecting for now",
            );
        }
        let lane = (target.rpc_host.clone(), target.rpc_port);
        let nic = self.clone();
        let job = move |run: Run| match run {
            Run::Now => nic.connect(&ep, &target),
            Run::Refused => {
                nic.fail_endpoint(&ep, Outcome::Interrupted, "the transport is stopping")
            }
        };
        if let Err((job, _)) = self.connector.submit(lane, Box::new(job), Finish::Refuse) {
            job(Run::Refused);
        }
    }

    /// Runs our handshake for `ep` (on a connector thread) and schedules
    /// the endpoint, or fails it. A queue pair that refuses RTR with
    /// EINVAL makes the device re-probe its GIDs and the endpoint fail
    /// over (`MC_AUTO_GID_MAX_RETRIES` times in a row per device): the
    /// retry handshakes from fresh queue pairs with the next ranked GID, so
    /// the peer connects its own to that one.
    pub fn connect(&self, ep: &Arc<RdmaEndpoint>, target: &RdmaTarget) {
        if self.stopping.load(Ordering::Acquire) {
            return self.fail_endpoint(ep, Outcome::Interrupted, "the transport is stopping");
        }
        let gid = self.gid();
        match self.connect_active(ep, target, gid) {
            Ok(()) if self.gid() != gid => self.fail_endpoint(
                ep,
                Outcome::Interrupted,
                "the device's GID changed during the handshake",
            ),
            Ok(()) => {
                debug!("RDMA {} -> {} connected", self.path, ep.peer_nic_path);
                sync::lock(&self.gids_tried).clear();
                if ep.want_schedule() {
                    self.schedule(ep.clone());
                }
            }
            Err(e) => {
                let retry = self.retry_gid(ep, gid, &mut sync::lock(&self.gids_tried));
                let outcome = if retry {
                    Outcome::Interrupted
                } else {
                    Outcome::Failed { hard: true }
                };
                self.fail_endpoint(ep, outcome, &e)
            }
        }
    }

    /// Our handshake to the peer of `ep`, the queue pair setup, and the
    /// ready ACK when the peer wants one.
    fn connect_active(
        &self,
        ep: &RdmaEndpoint,
        target: &RdmaTarget,
        gid: GidChoice,
    ) -> std::result::Result<(), String> {
        let local = self.local_desc(ep, gid);
        let server = target
            .peer_nic_path
            .split_once('@')
            .map_or(target.peer_nic_path.as_str(), |(s, _)| s);
        let opts = ClientOptions {
            io_timeout: self.opts.handshake_timeout,
            auth: self.opts.auth.clone().map(|k| (k, server.to_string())),
            ..self.opts.rpc.clone()
        };
        let reply = crate::rpc::call(
            &target.rpc_host,
            target.rpc_port,
            HANDSHAKE,
            &local.to_json(),
            &opts,
        )
        .map_err(|e| {
            format!(
                "handshake with {}:{} failed: {e}",
                target.rpc_host, target.rpc_port
            )
        })?;
        let reply = HandshakeDesc::from_json(&reply)?;
        let gid_text = if reply.local_gid.is_empty() {
            target.peer_gid.clone()
        } else {
            reply.local_gid.clone()
        };
        let lid = if reply.local_gid.is_empty() {
            target.peer_lid
        } else {
            reply.local_lid
        };
        let remote_gid = parse_gid(&gid_text)
            .ok_or_else(|| format!("peer {} sent an invalid GID {gid_text:?}", ep.peer_nic_path))?;
        let need_ack = ep.finish_active(&local, &reply, &|qpn| {
            self.params(gid, remote_gid, lid, qpn)
        })?;
        if need_ack {
            let ack = HandshakeDesc {
                ready_ack: Some(true),
                ..local
            };
            let r = crate::rpc::call(
                &target.rpc_host,
                target.rpc_port,
                HANDSHAKE,
                &ack.to_json(),
                &opts,
            )
            .map_err(|e| format!("sending the ready ACK to {} failed: {e}", ep.peer_nic_path))?;
            let r = HandshakeDesc::from_json(&r)?;
            if !r.reply_msg.is_empty() {
                return Err(format!(
                    "{} refused our ready ACK: {}",
                    ep.peer_nic_path, r.reply_msg
                ));
            }
            if !ep.ack_sent() {
                return Err(format!(
                    "endpoint to {} failed during setup",
                    ep.peer_nic_path
                ));
            }
        }
        Ok(())
    }

    /// The passive side of a handshake addressed to this device, from a
    /// peer the transport verified.
    pub fn accept(&self, req: &HandshakeDesc) -> HandshakeDesc {
        if !self.is_active() {
            return HandshakeDesc::rejection(format!("RDMA device {} is down", self.name));
        }
        if req.ready_ack == Some(true) {
            let ep = {
                let pool = sync::lock(&self.pool);
                pool.get(&req.local_nic_path)
            };
            let result = match &ep {
                Some(ep) => ep.ready_ack(&req.qp_num),
                None => Err("received RDMA ready ACK for unconnected endpoint".into()),
            };
            return match result {
                Ok(()) => {
                    if let Some(ep) = ep {
                        if ep.want_schedule() {
                            self.schedule(ep);
                        }
                    }
                    HandshakeDesc::default()
                }
                Err(why) => HandshakeDesc::rejection(why),
            };
        }
        let Some(remote_gid) = parse_gid(&req.local_gid) else {
            return HandshakeDesc::rejection(format!("Invalid peer GID: {:?}", req.local_gid));
        };
        let mut tried = Vec::new();
        let mut replaced = false;
        loop {
            let ep = match self.passive_endpoint(&req.local_nic_path) {
                Ok(ep) => ep,
                Err(why) => return HandshakeDesc::rejection(why),
            };
            let gid = self.gid();
            let params = |qpn| self.params(gid, remote_gid, req.local_lid, qpn);
            match ep.accept(req, &params) {
                Ok(()) if self.gid() != gid => {
                    let why = "the device's GID changed during the handshake; retry";
                    self.fail_endpoint(&ep, Outcome::Interrupted, why);
                    return HandshakeDesc::rejection(why);
                }
                Ok(()) => {
                    if ep.want_schedule() {
                        self.schedule(ep.clone());
                    }
                    return self.local_desc(&ep, gid);
                }
                Err((true, _)) if !replaced => {
                    replaced = true;
                    info!(
                        "RDMA device {}: {} connects with new queue pairs (restarted?); \
                         replacing its endpoint",
                        self.name, req.local_nic_path
                    );
                    self.fail_endpoint(
                        &ep,
                        Outcome::Failed { hard: false },
                        "the peer reconnected",
                    );
                }
                Err((true, _)) => break,
                // The queue pairs connect again from RESET: retry on the
                // same endpoint with the next ranked GID.
                Err((false, _)) if self.retry_gid(&ep, gid, &mut tried) => {}
                Err((false, why)) => {
                    self.fail_endpoint(&ep, Outcome::Failed { hard: true }, &why);
                    return HandshakeDesc::rejection(why);
                }
            }
        }
        HandshakeDesc::rejection("endpoint setup raced with another; retry")
    }
}
