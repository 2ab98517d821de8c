//! The report as text for people: one section per part, each headed
//! `== name`.

use super::Report;
use super::peer::PeerReport;
use std::fmt::Write;

/// `v`, or `-` when unknown.
fn or_dash<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or("-".to_string(), ToString::to_string)
}

/// `n` bytes as `4 KiB`, `1 MiB`, or bytes.
fn size(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// The whole report.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let features: Vec<&str> = [("rdma", r.features.rdma), ("hwloc", r.features.hwloc)]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| name)
        .collect();
    let _ = writeln!(
        out,
        "transfer-engine {} (features: {})",
        r.version,
        if features.is_empty() {
            "none".to_string()
        } else {
            features.join(", ")
        }
    );
    devices(&mut out, r);
    let _ = writeln!(out, "\n== priority matrix\n{}", r.priority_matrix);
    let _ = writeln!(out, "\n== transports (auto discovery)");
    for t in &r.transports {
        let state = if t.installed {
            "installed"
        } else {
            "not installed"
        };
        match t.why.as_str() {
            "" => {
                let _ = writeln!(out, "  {:<6} {state}", t.protocol);
            }
            why => {
                let _ = writeln!(out, "  {:<6} {state}: {why}", t.protocol);
            }
        }
    }
    let _ = writeln!(out, "\n== settings");
    for s in &r.settings {
        let vars = match s.set_by {
            Some(var) => var.to_string(),
            None => s.variables.join(" / "),
        };
        let source = match (s.source, s.supported) {
            (_, false) => "environment, not read by this engine".to_string(),
            ("default", _) => "default".to_string(),
            (source, _) => format!("{source}; default {}", s.default),
        };
        let _ = writeln!(out, "  {vars} = {} ({source})", s.value);
    }
    if let Some(p) = &r.peer {
        peer(&mut out, p);
    }
    out
}

fn devices(out: &mut String, r: &Report) {
    let d = &r.devices;
    let nodes: Vec<String> = d.numa_nodes.iter().map(ToString::to_string).collect();
    let _ = writeln!(out, "\n== devices\nNUMA nodes: {}", nodes.join(" "));
    let _ = writeln!(
        out,
        "RDMA NICs:{}",
        if d.rdma.is_empty() { " none" } else { "" }
    );
    for n in &d.rdma {
        let _ = writeln!(
            out,
            "  {:<12} {} port {} {} numa {} pci {}",
            n.name,
            n.device,
            n.port,
            if n.active { "ACTIVE" } else { "not active" },
            or_dash(&n.numa_node),
            or_dash(&n.pci_bus_id)
        );
    }
    let _ = writeln!(
        out,
        "network interfaces:{}",
        if d.net.is_empty() { " none" } else { "" }
    );
    for n in &d.net {
        let speed = n
            .speed_mbps
            .map_or("speed -".to_string(), |s| format!("{s} Mb/s"));
        let _ = writeln!(
            out,
            "  {:<12} {:<5} {speed:<12} numa {} pci {}{} {}",
            n.name,
            if n.up { "up" } else { "down" },
            or_dash(&n.numa_node),
            or_dash(&n.pci_bus_id),
            if n.loopback { " loopback" } else { "" },
            n.addrs.join(" ")
        );
    }
    let _ = writeln!(out, "GPUs:{}", if d.gpus.is_empty() { " none" } else { "" });
    for g in &d.gpus {
        let _ = writeln!(
            out,
            "  cuda:{:<3} {} numa {} pci {}",
            g.index,
            g.name,
            or_dash(&g.numa_node),
            or_dash(&g.pci_bus_id)
        );
    }
}

fn peer(out: &mut String, p: &PeerReport) {
    let _ = writeln!(
        out,
        "\n== peer {}\nopened in {:.2} ms; buffers:{}",
        p.name,
        p.open_ms,
        if p.buffers.is_empty() { " none" } else { "" }
    );
    for b in &p.buffers {
        let location = if b.location.is_empty() {
            "-"
        } else {
            &b.location
        };
        let _ = writeln!(
            out,
            "  {:#x} {:>10} {location:<7} -> {}",
            b.addr,
            size(b.length),
            b.transport.unwrap_or("no installed transport reaches it")
        );
    }
    if let Some(first) = p.first_read_ms {
        let _ = writeln!(
            out,
            "first READ of 4 KiB (with the transport's connection setup): {first:.3} ms"
        );
    }
    let _ = writeln!(
        out,
        "round trips ({}):",
        if p.write {
            "WRITE, READ back and compare, then the peer's bytes written back"
        } else {
            "READ only; --write to write too"
        }
    );
    for t in &p.round_trips {
        let Some(addr) = t.buffer else {
            let _ = writeln!(
                out,
                "  {:>7}: skipped, the peer has no buffer that large",
                size(t.bytes)
            );
            continue;
        };
        let mut line = format!(
            "  {:>7} at {addr:#x} by {}: READ {:.3} ms",
            size(t.bytes),
            t.transport.unwrap_or("-"),
            t.read_ms.unwrap_or_default()
        );
        if let Some(w) = t.write_ms {
            let _ = write!(line, ", WRITE {w:.3} ms");
        }
        match t.verified {
            Some(true) => line.push_str(", read back unchanged"),
            Some(false) => line.push_str(", READ BACK DIFFERS"),
            None => {}
        }
        let _ = writeln!(out, "{line}");
    }
}
