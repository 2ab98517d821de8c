//! An engine named by a loopback address is reachable on loopback only: its
//! handshake and data listeners refuse connections to the machine's other
//! addresses, and its descriptor publishes only loopback devices; it still
//! moves bytes with a peer on loopback. An engine named by another address
//! keeps listening on every interface and publishes that interface.

use crate::common;

use common::{Buf, data_port, descriptor, engine, pattern, register, run, write_req};
use serde_json::Value;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;
use transfer_engine::Engine;
use transfer_engine::TaskStatus;

/// A non-loopback IPv4 address of an interface that is up, if any.
fn external_ipv4() -> Option<IpAddr> {
    transfer_engine::topology::net_interfaces()
        .into_iter()
        .filter(|i| i.up && !i.loopback)
        .flat_map(|i| i.addrs.into_iter().map(|a| a.ip))
        .find(IpAddr::is_ipv4)
}

/// Whether a TCP connect to `ip:port` is accepted.
fn reachable(ip: IpAddr, port: u16) -> bool {
    match TcpStream::connect_timeout(&SocketAddr::new(ip, port), Duration::from_secs(5)) {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => false,
        Err(e) => panic!("connect to {ip}:{port}: {e} (expected accepted or refused)"),
    }
}

fn rpc_port(e: &Engine) -> u16 {
    let addr = e.local_ip_and_port();
    addr.rsplit_once(':')
        .expect("ip:port")
        .1
        .parse()
        .expect("port")
}

/// The addresses of the published TCP devices.
fn device_addrs(desc: &Value) -> Vec<IpAddr> {
    desc["tcp_devices"]
        .as_array()
        .expect("tcp_devices is published")
        .iter()
        .map(|d| d["addr"].as_str().expect("addr").parse().expect("an IP"))
        .collect()
}

#[test]
fn loopback_engine_listens_and_publishes_loopback_only() {
    let Some(ext) = external_ipv4() else {
        common::skip("no interface with a non-loopback IPv4 address is up");
        return;
    };
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    let target = engine();
    let (rpc, data) = (rpc_port(&target), data_port(&target));
    assert!(reachable(loopback, rpc) && reachable(loopback, data));
    assert!(
        !reachable(ext, rpc),
        "the handshake port {rpc} answers on {ext}"
    );
    assert!(
        !reachable(ext, data),
        "the data port {data} answers on {ext}"
    );
    let devices = device_addrs(&descriptor(&target));
    assert!(
        !devices.is_empty() && devices.iter().all(IpAddr::is_loopback),
        "published devices: {devices:?}"
    );

    // A loopback peer still moves bytes to it.
    let initiator = engine();
    let remote = Buf::zeroed(1 << 20);
    let local = Buf::new(1 << 20, 5);
    register(&target, &remote, true);
    register(&initiator, &local, true);
    let seg = initiator.open_segment(target.local_name()).expect("open");
    let w = write_req(local.addr(), seg, remote.addr(), 1 << 20);
    assert_eq!(run(&initiator, &[w]), [TaskStatus::Completed]);
    assert!(remote.snapshot() == pattern(1 << 20, 5), "wrong bytes");
    let loads = initiator.nic_loads();
    assert!(
        loads
            .iter()
            .all(|l| l.device == "lo" || l.device == "default"),
        "devices other than loopback: {loads:?}"
    );
    initiator.shutdown();
    target.shutdown();
}

#[test]
fn engine_named_by_another_address_listens_on_every_interface() {
    let Some(ext) = external_ipv4() else {
        common::skip("no interface with a non-loopback IPv4 address is up");
        return;
    };
    let e = Engine::new("P2PHANDSHAKE", &ext.to_string(), false).expect("engine");
    e.install_transport("tcp", None).expect("tcp");
    let (rpc, data) = (rpc_port(&e), data_port(&e));
    assert!(reachable(ext, rpc) && reachable(ext, data));
    let devices = device_addrs(&descriptor(&e));
    assert!(
        devices.contains(&ext),
        "{ext} is not among the published devices {devices:?}"
    );
    e.shutdown();
}
