//! Helpers of the RDMA tests, which need real verbs devices: the soft-RoCE
//! VM of `scripts/rdma-vm/` has two "nodes", A (`rxe_a0` on `va0`,
//! `rxe_a1` on `va1`) and B (`rxe_b0`, `rxe_b1`), joined by one switch.
//! Outside that VM the tests are ignored (reported as skipped); inside it
//! they run with `--ignored` and fail, not skip, when a device is missing.

#![allow(dead_code)]

use once_cell::sync::OnceCell;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use transfer_engine::{Config, Engine};

/// Node A's devices and their network interfaces.
pub const A: [(&str, &str); 2] = [("rxe_a0", "va0"), ("rxe_a1", "va1")];
/// Node B's devices and their network interfaces.
pub const B: [(&str, &str); 2] = [("rxe_b0", "vb0"), ("rxe_b1", "vb1")];

/// The settings every engine of this test binary takes, beside the
/// environment's (see [`setup`]).
static SETTINGS: OnceCell<Vec<(String, String)>> = OnceCell::new();

/// Records the test-wide settings `vars` (a variable the environment sets
/// keeps the environment's value), sends the library's log to stderr
/// (`RUST_LOG`; the VM suite keeps it with the test's output) and checks
/// that the VM's devices exist. The settings reach engines through
/// [`config`], never the process environment.
pub fn setup(vars: &[(&str, &str)]) {
    SETTINGS.get_or_init(|| {
        transfer_engine::init_logging();
        vars.iter()
            .filter(|(k, _)| std::env::var_os(k).is_none())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    for (dev, _) in A.iter().chain(&B) {
        assert!(
            std::path::Path::new(&format!("/sys/class/infiniband/{dev}")).exists(),
            "RDMA device {dev} is missing: run this test inside the soft-RoCE VM \
             (scripts/rdma-vm/test.sh)"
        );
    }
}

/// The configuration of this test binary's engines: the environment's
/// `MC_*` variables with the settings given to [`setup`].
pub fn config() -> Config {
    let vars = SETTINGS.get().expect("rdma::setup runs first");
    let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    crate::common::config_with(&pairs)
}

/// A P2P engine on 127.0.0.1 configured by [`config`], with no transport
/// installed unless `auto_discover`.
pub fn bare_engine(auto_discover: bool) -> Arc<Engine> {
    Engine::builder("P2PHANDSHAKE", "127.0.0.1")
        .auto_discover(auto_discover)
        .config(config())
        .build()
        .expect("engine")
}

/// The priority matrix `{"cpu:0": [[devs...], []]}`.
pub fn matrix(devs: &[&str]) -> String {
    let list: Vec<String> = devs.iter().map(|d| format!("\"{d}\"")).collect();
    format!("{{\"cpu:0\": [[{}], []]}}", list.join(","))
}

/// A P2P engine on 127.0.0.1 with RDMA on `devs`.
pub fn engine(devs: &[&str]) -> Arc<Engine> {
    engine_named("P2PHANDSHAKE", "127.0.0.1", devs)
}

/// An engine with metadata `conn` and name `name`, RDMA on `devs`.
pub fn engine_named(conn: &str, name: &str, devs: &[&str]) -> Arc<Engine> {
    let e = Engine::builder(conn, name)
        .config(config())
        .build()
        .expect("engine");
    e.install_transport("rdma", Some(&matrix(devs)))
        .expect("install rdma");
    e
}

/// A hardware counter of a device's port 1.
pub fn counter(dev: &str, name: &str) -> u64 {
    let p = format!("/sys/class/infiniband/{dev}/ports/1/hw_counters/{name}");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// Packets a device has sent.
pub fn sent(dev: &str) -> u64 {
    counter(dev, "sent_pkts")
}

/// `rdma resource show` counts of a device: (pd, cq, qp, mr).
pub fn resources(dev: &str) -> (u64, u64, u64, u64) {
    let out = Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .expect("rdma resource show");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(&format!("{dev}:")))
        .unwrap_or_else(|| panic!("no {dev} in `rdma resource show`: {text}"));
    let field = |k: &str| -> u64 {
        let words: Vec<&str> = line.split_whitespace().collect();
        let i = words
            .iter()
            .position(|w| *w == k)
            .unwrap_or_else(|| panic!("no {k} in {line}"));
        words[i + 1].parse().expect("count")
    };
    (field("pd"), field("cq"), field("qp"), field("mr"))
}

/// Sets a network interface up or down (`ip link set`).
pub fn set_link(iface: &str, up: bool) {
    let st = Command::new("ip")
        .args(["link", "set", iface, if up { "up" } else { "down" }])
        .status()
        .expect("ip link set");
    assert!(st.success(), "ip link set {iface} failed");
}

/// Brings an interface back up when dropped (also when a test fails).
pub struct LinkGuard(pub &'static str);

impl Drop for LinkGuard {
    fn drop(&mut self) {
        set_link(self.0, true);
    }
}

/// Waits until the device's port is ACTIVE.
pub fn wait_port_active(dev: &str, within: Duration) {
    let p = format!("/sys/class/infiniband/{dev}/ports/1/state");
    let deadline = std::time::Instant::now() + within;
    loop {
        let s = std::fs::read_to_string(&p).unwrap_or_default();
        if s.contains("ACTIVE") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{dev} not ACTIVE after {within:?}: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A device's RoCE v2 IPv4 GID (index 1 in the VM) in Mooncake's text
/// form: 16 bytes as two hex digits each, joined by `:`.
pub fn gid(dev: &str) -> String {
    let p = format!("/sys/class/infiniband/{dev}/ports/1/gids/1");
    let raw = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
    let hex: Vec<char> = raw.trim().chars().filter(|c| *c != ':').collect();
    assert_eq!(hex.len(), 32, "{p}: {raw}");
    hex.chunks(2)
        .map(|c| c.iter().collect::<String>())
        .collect::<Vec<_>>()
        .join(":")
}

/// Numbers of the RC queue pairs that exist on a device (`rdma resource
/// show qp`), sorted.
pub fn rc_qpns(dev: &str) -> Vec<u32> {
    let out = Command::new("rdma")
        .args(["resource", "show", "qp", "link", &format!("{dev}/1")])
        .output()
        .expect("rdma resource show qp");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut qpns: Vec<u32> = text
        .lines()
        .filter(|l| l.contains(" type RC "))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let i = words.iter().position(|w| *w == "lqpn")?;
            words.get(i + 1)?.parse().ok()
        })
        .collect();
    qpns.sort_unstable();
    qpns
}

/// A Connection frame (type 0) as Mooncake's `HandShakeDesc` encodes it,
/// built by hand: `[u64 LE length][0][JSON]`, length = 1 + JSON bytes.
pub fn connection_frame(req: &serde_json::Value) -> Vec<u8> {
    let mut payload = req.to_string().into_bytes();
    payload.push(b'\n');
    let len = payload.len() as u64 + 1;
    let mut f: Vec<u8> = len.to_le_bytes().to_vec();
    f.push(0);
    f.extend_from_slice(&payload);
    f
}

/// Sends one Connection frame to `127.0.0.1:port` from a socket bound to
/// `from` and returns the reply's JSON (`None` if the listener closed
/// without a reply). Every wait is bounded.
pub fn send_connection(
    from: std::net::IpAddr,
    port: u16,
    req: &serde_json::Value,
) -> Option<serde_json::Value> {
    use std::io::{Read, Write};
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    sock.bind(&std::net::SocketAddr::new(from, 0).into())
        .unwrap_or_else(|e| panic!("bind {from}: {e}"));
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    sock.connect_timeout(&to.into(), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connect {to} from {from}: {e}"));
    let mut s: std::net::TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(&connection_frame(req)).expect("send the frame");
    let mut reply = Vec::new();
    match s.read_to_end(&mut reply) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("reading the reply: {e}"),
    }
    if reply.len() < 9 {
        return None;
    }
    let len = u64::from_le_bytes(reply[..8].try_into().unwrap()) as usize;
    assert_eq!(len, reply.len() - 8, "length = 1 + payload length");
    assert_eq!(reply[8], 0, "a Connection reply");
    Some(serde_json::from_slice(&reply[9..]).expect("reply JSON"))
}

/// Whether a Connection reply refuses (a non-empty `reply_msg`).
pub fn refused(reply: &Option<serde_json::Value>) -> bool {
    reply
        .as_ref()
        .is_none_or(|r| r["reply_msg"].as_str().is_some_and(|m| !m.is_empty()))
}

/// Latency percentiles of `samples` (sorted in place): (p50, p99, max).
pub fn percentiles(samples: &mut [Duration]) -> (Duration, Duration, Duration) {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), samples[samples.len() - 1])
}

/// Runs `ip` with `args`; panics when it fails.
pub fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("ip");
    assert!(st.success(), "ip {args:?} failed");
}

/// Moves node A's rail-0 interface (`va0`) from its address to `new` (in
/// its /23, so its routing table still serves it), with the policy rules
/// that route between `new` and node B's addresses as `rdma-net.sh` does
/// for the old one; dropping it puts the old address back (also when a
/// test fails). The GID table of `rxe_a0` changes with it.
pub struct Readdressed {
    new: &'static str,
}

/// The policy rules between node A's rail-0 address `addr` and node B
/// (tables 101: va0, 103: vb0, 104: vb1, as `rdma-net.sh` numbers them).
fn rules(addr: &str) -> Vec<Vec<String>> {
    let mut r = Vec::new();
    for to in ["198.18.0.2", "198.18.1.2"] {
        r.push(vec!["from", addr, "to", to, "iif", "lo", "lookup", "101"]);
    }
    r.push(vec![
        "from",
        "198.18.0.2",
        "to",
        addr,
        "iif",
        "lo",
        "lookup",
        "103",
    ]);
    r.push(vec![
        "from",
        "198.18.1.2",
        "to",
        addr,
        "iif",
        "lo",
        "lookup",
        "104",
    ]);
    r.into_iter()
        .map(|v| v.into_iter().map(str::to_string).collect())
        .collect()
}

/// The route of `va0`'s table (101) from `src`, as `rdma-net.sh` sets it.
fn route_from(src: &str) {
    let _ = Command::new("ip")
        .args([
            "route",
            "replace",
            "198.18.0.0/23",
            "dev",
            "va0",
            "src",
            src,
            "table",
            "101",
        ])
        .status();
}

impl Readdressed {
    /// Takes `va0` from 198.18.0.1 to `new`.
    pub fn va0(new: &'static str) -> Readdressed {
        for r in rules(new) {
            let mut args = vec!["rule", "add", "pref", "150"];
            args.extend(r.iter().map(String::as_str));
            ip(&args);
        }
        ip(&["addr", "del", "198.18.0.1/23", "dev", "va0"]);
        ip(&[
            "addr",
            "add",
            &format!("{new}/23"),
            "dev",
            "va0",
            "noprefixroute",
        ]);
        // Deleting the old address took va0's route (its source) with it.
        route_from(new);
        Readdressed { new }
    }
}

impl Drop for Readdressed {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["addr", "del", &format!("{}/23", self.new), "dev", "va0"])
            .status();
        let _ = Command::new("ip")
            .args([
                "addr",
                "add",
                "198.18.0.1/23",
                "dev",
                "va0",
                "noprefixroute",
            ])
            .status();
        route_from("198.18.0.1");
        for r in rules(self.new) {
            let mut args = vec!["rule", "del", "pref", "150"];
            args.extend(r.iter().map(String::as_str));
            let _ = Command::new("ip").args(&args).status();
        }
    }
}

/// The RoCE v2 GID of an IPv4 address in Mooncake's text form.
pub fn v4_gid(addr: &str) -> String {
    let ip: std::net::Ipv4Addr = addr.parse().expect("IPv4 address");
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip.octets());
    g.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
