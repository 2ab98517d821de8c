//! GID selection, as Mooncake's `rdma_gid_probe.h`: `MC_GID_INDEX` when
//! set, else every entry of the port's GID table is ranked and the best
//! one wins. Only RoCE v2 and InfiniBand GIDs qualify; the tiers, best
//! first: with a network device and routable; without a network device and
//! routable; with a network device and a private IPv4 (10/8, 172.16/12,
//! 100.64/10); with a network device and degraded (an overlay interface
//! such as docker0 or flannel.1, or an IPv6 link-local address); without a
//! network device and private; without one and degraded; then the first
//! non-null entry of any type. Ties go to the lowest index. On RoCE the
//! IPv4-mapped GID of a plain interface therefore wins over the link-local
//! IPv6 one.
//!
//! GID types and network devices come from sysfs
//! (`/sys/class/infiniband/<dev>/ports/<port>/gid_attrs/{types,ndevs}/<i>`).

use crate::verbs::{Context, Gid};
use std::path::PathBuf;

/// How libibverbs types a GID entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (not routable; never chosen by the ranking).
    RoceV1,
    /// RoCE v2 (UDP/IP).
    RoceV2,
}

/// One GID table entry and what the ranking needs to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Index in the table.
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// Its type.
    pub gid_type: GidType,
    /// The network interface it belongs to, if any.
    pub netdev: Option<String>,
}

/// Ranking tiers, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// With a network device, routable.
    NetworkRoutable,
    /// Without a network device, routable.
    NoNetworkRoutable,
    /// With a network device, private IPv4.
    NetworkPrivateV4,
    /// With a network device, overlay interface or link-local IPv6.
    NetworkDegraded,
    /// Without a network device, private IPv4.
    NoNetworkPrivateV4,
    /// Without a network device, link-local IPv6.
    NoNetworkDegraded,
    /// The first non-null entry, whatever its type.
    Fallback,
}

fn is_null(gid: &Gid) -> bool {
    gid.iter().all(|b| *b == 0)
}

fn ipv4_mapped(gid: &Gid) -> Option<[u8; 4]> {
    (gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff)
        .then(|| [gid[12], gid[13], gid[14], gid[15]])
}

fn link_local_v6(gid: &Gid) -> bool {
    gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80
}

fn private_v4(v4: [u8; 4]) -> bool {
    v4[0] == 10
        || (v4[0] == 172 && (16..=31).contains(&v4[1]))
        || (v4[0] == 100 && (64..=127).contains(&v4[1]))
}

fn overlay_iface(name: &str) -> bool {
    ["flannel", "cni", "calico", "vxlan", "docker"]
        .iter()
        .any(|p| name.starts_with(p))
        || name == "tunl0"
}

/// The tier of a candidate, or `None` if the ranking skips it (null GID,
/// RoCE v1).
pub fn classify(c: &Candidate) -> Option<Tier> {
    if is_null(&c.gid) || c.gid_type == GidType::RoceV1 {
        return None;
    }
    let v2 = c.gid_type == GidType::RoceV2;
    let overlay = v2 && c.netdev.as_deref().is_some_and(overlay_iface);
    let private = v2 && !overlay && ipv4_mapped(&c.gid).is_some_and(private_v4);
    let link_local = v2 && ipv4_mapped(&c.gid).is_none() && link_local_v6(&c.gid);
    let degraded = overlay || link_local;
    Some(match (c.netdev.is_some(), degraded, private) {
        (true, true, _) => Tier::NetworkDegraded,
        (true, false, true) => Tier::NetworkPrivateV4,
        (true, false, false) => Tier::NetworkRoutable,
        (false, true, _) => Tier::NoNetworkDegraded,
        (false, false, true) => Tier::NoNetworkPrivateV4,
        (false, false, false) => Tier::NoNetworkRoutable,
    })
}

/// The candidates in ranking order, with their tiers: ranked ones by tier
/// then index, then the first non-null unranked one as a fallback.
pub fn rank(candidates: &[Candidate]) -> Vec<(u32, Tier)> {
    let mut ranked: Vec<(u32, Tier)> = candidates
        .iter()
        .filter_map(|c| classify(c).map(|t| (c.index, t)))
        .collect();
    ranked.sort_by_key(|&(i, t)| (t, i));
    if let Some(c) = candidates
        .iter()
        .find(|c| !is_null(&c.gid) && classify(c).is_none())
    {
        ranked.push((c.index, Tier::Fallback));
    }
    ranked
}

/// The best ranked candidate that is none of `tried` (index and GID): the
/// GID a handshake tries next after its queue pair refused RTR with the
/// others (`MC_AUTO_GID_MAX_RETRIES`).
pub fn next_untried<'a>(
    candidates: &'a [Candidate],
    tried: &[(u32, Gid)],
) -> Option<&'a Candidate> {
    rank(candidates).into_iter().find_map(|(i, _)| {
        candidates
            .iter()
            .find(|c| c.index == i && !tried.contains(&(c.index, c.gid)))
    })
}

fn port_dir(device: &str, port: u8) -> PathBuf {
    PathBuf::from(format!("/sys/class/infiniband/{device}/ports/{port}"))
}

fn read_trimmed(path: PathBuf) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Reads every entry of the port's GID table that can be queried.
pub fn probe(ctx: &Context, port: u8, table_len: u32) -> Vec<Candidate> {
    let dir = port_dir(ctx.name(), port);
    let infiniband = read_trimmed(dir.join("link_layer")).as_deref() == Some("InfiniBand");
    let mut out = Vec::new();
    for index in 0..table_len {
        let Ok(gid) = ctx.gid(port, index) else {
            continue;
        };
        if is_null(&gid) {
            continue;
        }
        let ty = read_trimmed(dir.join(format!("gid_attrs/types/{index}")));
        let gid_type = match ty.as_deref() {
            Some(t) if t.contains("v2") => GidType::RoceV2,
            _ if infiniband => GidType::Ib,
            _ => GidType::RoceV1,
        };
        out.push(Candidate {
            index,
            gid,
            gid_type,
            netdev: read_trimmed(dir.join(format!("gid_attrs/ndevs/{index}"))),
        });
    }
    out
}

/// Describes a candidate for logs: address, type and interface.
pub fn describe(c: &Candidate) -> String {
    let addr = match ipv4_mapped(&c.gid) {
        Some(v4) => std::net::Ipv4Addr::from(v4).to_string(),
        None => std::net::Ipv6Addr::from(c.gid).to_string(),
    };
    let ty = match c.gid_type {
        GidType::Ib => "IB",
        GidType::RoceV1 => "RoCE v1",
        GidType::RoceV2 => "RoCE v2",
    };
    match &c.netdev {
        Some(n) => format!("{addr}, {ty}, {n}"),
        None => format!("{addr}, {ty}, no netdev"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(index: u32, a: [u8; 4], netdev: Option<&str>) -> Candidate {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&a);
        Candidate {
            index,
            gid,
            gid_type: GidType::RoceV2,
            netdev: netdev.map(str::to_string),
        }
    }

    fn link_local(index: u32, netdev: Option<&str>) -> Candidate {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[15] = 1;
        Candidate {
            index,
            gid,
            gid_type: GidType::RoceV2,
            netdev: netdev.map(str::to_string),
        }
    }

    #[test]
    fn soft_roce_picks_the_ipv4_gid() {
        // rdma_rxe: index 0 link-local IPv6, index 1 the interface's IPv4.
        let c = [
            link_local(0, Some("va0")),
            v4(1, [198, 18, 0, 1], Some("va0")),
        ];
        assert_eq!(rank(&c)[0], (1, Tier::NetworkRoutable));
        assert_eq!(rank(&c)[1], (0, Tier::NetworkDegraded));
    }

    #[test]
    fn tiers_follow_mooncake() {
        let mut v1 = v4(0, [192, 168, 1, 5], Some("eth0"));
        v1.gid_type = GidType::RoceV1;
        let c = [
            v1,
            link_local(1, Some("eth0")),
            v4(2, [10, 0, 0, 5], Some("eth0")),
            v4(3, [172, 17, 0, 1], Some("docker0")),
            v4(4, [10, 1, 0, 5], None),
            v4(5, [192, 168, 1, 5], None),
            v4(6, [100, 64, 3, 1], Some("eth1")),
        ];
        let order: Vec<u32> = rank(&c).iter().map(|r| r.0).collect();
        assert_eq!(order, vec![5, 2, 6, 1, 3, 4, 0]);
        assert_eq!(rank(&c).last().unwrap().1, Tier::Fallback);
        assert_eq!(classify(&c[3]), Some(Tier::NetworkDegraded));
    }

    #[test]
    fn null_gids_are_never_chosen() {
        let null = Candidate {
            index: 0,
            gid: [0; 16],
            gid_type: GidType::RoceV2,
            netdev: Some("eth0".into()),
        };
        assert!(rank(&[null]).is_empty());
        let mut ib = v4(1, [1, 2, 3, 4], None);
        ib.gid_type = GidType::Ib;
        assert_eq!(rank(&[ib]), vec![(1, Tier::NoNetworkRoutable)]);
    }

    #[test]
    fn a_reprobe_takes_the_next_ranked_gid_not_tried() {
        let c = [
            link_local(0, Some("va0")),
            v4(1, [198, 18, 0, 1], Some("va0")),
            v4(2, [10, 0, 0, 1], Some("va0")),
        ];
        let tried = |v: &[usize]| {
            v.iter()
                .map(|&i| (c[i].index, c[i].gid))
                .collect::<Vec<_>>()
        };
        assert_eq!(next_untried(&c, &[]).map(|c| c.index), Some(1));
        assert_eq!(next_untried(&c, &tried(&[1])).map(|c| c.index), Some(2));
        assert_eq!(next_untried(&c, &tried(&[1, 2])).map(|c| c.index), Some(0));
        assert_eq!(next_untried(&c, &tried(&[0, 1, 2])), None);
        // An entry whose GID changed since it was tried is new.
        let mut moved = c[1].clone();
        moved.gid[15] = 7;
        assert_eq!(
            next_untried(&[moved], &tried(&[1])).map(|c| c.index),
            Some(1)
        );
    }

    #[test]
    fn descriptions() {
        assert_eq!(
            describe(&v4(1, [198, 18, 0, 1], Some("va0"))),
            "198.18.0.1, RoCE v2, va0"
        );
        assert_eq!(
            describe(&link_local(0, None)),
            "fe80::1, RoCE v2, no netdev"
        );
    }
}
