//! What the Python binding asks an engine besides transfers: its RPC port
//! and a probe of a peer's listener.

mod common;

use common::engine;

#[test]
fn rpc_port_is_the_port_of_the_p2p_name() {
    let e = engine();
    let port = e.rpc_port();
    assert!(port > 0);
    assert_eq!(e.local_name(), format!("127.0.0.1:{port}"));
    assert!(e.local_ip_and_port().ends_with(&format!(":{port}")));
}

#[test]
fn probe_reaches_a_live_listener_and_reports_a_dead_one() {
    let a = engine();
    let b = engine();
    a.send_probe(b.local_name()).expect("probe a live peer");
    a.send_probe(a.local_name()).expect("probe itself");
    let dead = common::servers::dead_addr();
    assert_eq!(a.send_probe(&dead).unwrap_err().err_code(), -102);
    assert_eq!(
        a.send_probe("no-such-host.invalid:1234")
            .unwrap_err()
            .err_code(),
        -101
    );
    assert_eq!(a.send_probe("").unwrap_err().err_code(), -1);
}
