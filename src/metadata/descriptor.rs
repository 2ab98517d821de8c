//! Segment descriptors in Mooncake's JSON encoding.
//!
//! A segment descriptor tells peers which buffers a process exposes and how
//! to reach them. The JSON written here is what Mooncake's
//! `TransferMetadata::encodeSegmentDesc` writes for the `tcp` and `rdma`
//! protocols (keys sorted, unsigned integers for addresses, lengths, keys and
//! LIDs), and the decoder accepts what Mooncake peers publish and rejects
//! what Mooncake's `decodeSegmentDesc` rejects. Decoding is stricter about
//! JSON types than jsoncpp: a string where a number belongs is
//! [`Error::MalformedJson`] instead of a silent conversion.

use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// Top-level keys this module owns; everything else goes to `extra`.
const COMMON_KEYS: [&str; 7] = [
    "name",
    "protocol",
    "tcp_data_port",
    "tcp_proto_version",
    "timestamp",
    "rdma_server_name",
    "buffers",
];

/// The key listing the devices (NICs) of an RDMA-like descriptor.
pub const DEVICES_KEY: &str = "devices";

/// Keys owned only by the RDMA-like protocols.
const RDMA_KEYS: [&str; 2] = [DEVICES_KEY, "priority_matrix"];

/// How a protocol's descriptor is laid out on the wire. Which protocol has
/// which layout is the transport table's to say
/// (`transport/registry.rs`); the codec here is handed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Buffers carry name, addr and length only (Mooncake's `tcp`).
    Tcp,
    /// Devices, keyed buffers, priority matrix (Mooncake's `rdma` and its
    /// vendor variants).
    RdmaLike {
        /// Whether `rkey[i]` must exist for every device `i` (not for
        /// `barex`).
        keys_per_device: bool,
    },
}

/// The layout of a descriptor by its `protocol`; `None` for a protocol no
/// transport of this build reads.
pub type Layouts = fn(&str) -> Option<Layout>;

/// One NIC of an RDMA-like segment (`devices[i]` in the JSON).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceDesc {
    /// Device name, e.g. `mlx5_0`; never empty.
    pub name: String,
    /// InfiniBand LID, 0 on RoCE.
    pub lid: u16,
    /// GID as 16 two-digit lowercase hex bytes joined by `:`; never empty.
    pub gid: String,
}

/// One registered buffer of a segment (`buffers[i]` in the JSON).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BufferDesc {
    /// `tcp`: the owner's server name; `rdma`: the buffer's location
    /// (`cpu:0`, `cuda:1`, `*`, …). Never empty.
    pub name: String,
    /// Start address in the owner's address space; never 0.
    pub addr: u64,
    /// Length in bytes; never 0.
    pub length: u64,
    /// Local keys, one per device in `devices` order (RDMA-like only).
    pub lkey: Vec<u32>,
    /// Remote keys, one per device, or empty when the buffer is not
    /// remotely accessible (RDMA-like only).
    pub rkey: Vec<u32>,
}

impl BufferDesc {
    /// Whether the buffer holds byte `addr`.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.addr && addr - self.addr < self.length
    }

    /// The address just past the buffer.
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.length)
    }
}

/// A segment descriptor as published under `mooncake/ram/<name>`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SegmentDesc {
    /// The owner's local server name (`host:port`).
    pub name: String,
    /// `tcp` or `rdma` (`barex`, `efa`, `cxi` decode like `rdma`).
    pub protocol: String,
    /// Port of the TCP data listener, 0 when not TCP.
    pub tcp_data_port: u16,
    /// TCP wire version: 2 with status frames, 1 without (the default).
    pub tcp_proto_version: u32,
    /// Local time of publication, `YYYY-MM-DD HH:MM:SS.uuuuuu`;
    /// informational, ignored by [`SegmentDesc::same_content`].
    pub timestamp: String,
    /// Registered buffers.
    pub buffers: Vec<BufferDesc>,
    /// NICs of an RDMA-like segment; not encoded for `tcp`.
    pub devices: Vec<DeviceDesc>,
    /// Mooncake priority matrix (RDMA-like only); kept as opaque JSON here.
    pub priority_matrix: Option<Value>,
    /// Second server name of a dual-NIC host (`MC_RDMA_BIND_ADDRESS`).
    pub rdma_server_name: Option<String>,
    /// Top-level keys not listed above (e.g. `tcp_devices`, `generation`),
    /// kept so that they round-trip. Mooncake peers ignore them.
    pub extra: Map<String, Value>,
}

impl SegmentDesc {
    /// Encodes the descriptor exactly as Mooncake does for its protocol,
    /// whose layout `layouts` gives.
    ///
    /// `timestamp` is written as stored (set it with [`now_timestamp`] before
    /// publishing). For the TCP layout, `devices`, `priority_matrix` and the
    /// buffers' keys are not written, as in Mooncake. `priority_matrix` is
    /// omitted when `None`. Keys of `extra` are written unless a field above
    /// owns the same key. An unknown protocol is encoded with the common keys
    /// and buffers as for TCP; [`SegmentDesc::decode`] will reject it.
    pub fn encode(&self, layouts: Layouts) -> Value {
        let mut obj = self.extra.clone();
        obj.insert("name".into(), Value::from(self.name.as_str()));
        obj.insert("protocol".into(), Value::from(self.protocol.as_str()));
        obj.insert("tcp_data_port".into(), Value::from(self.tcp_data_port));
        obj.insert(
            "tcp_proto_version".into(),
            Value::from(self.tcp_proto_version),
        );
        obj.insert("timestamp".into(), Value::from(self.timestamp.as_str()));
        if let Some(rdma_name) = self.rdma_server_name.as_deref().filter(|s| !s.is_empty()) {
            obj.insert("rdma_server_name".into(), Value::from(rdma_name));
        }
        let rdma_like = matches!(layouts(&self.protocol), Some(Layout::RdmaLike { .. }));
        let buffers = self
            .buffers
            .iter()
            .map(|b| {
                let mut m = Map::new();
                m.insert("addr".into(), Value::from(b.addr));
                m.insert("length".into(), Value::from(b.length));
                if rdma_like {
                    m.insert("lkey".into(), Value::from(b.lkey.clone()));
                }
                m.insert("name".into(), Value::from(b.name.as_str()));
                if rdma_like {
                    m.insert("rkey".into(), Value::from(b.rkey.clone()));
                }
                Value::Object(m)
            })
            .collect::<Vec<_>>();
        obj.insert("buffers".into(), Value::Array(buffers));
        if rdma_like {
            let devices = self
                .devices
                .iter()
                .map(|d| {
                    let mut m = Map::new();
                    m.insert("gid".into(), Value::from(d.gid.as_str()));
                    m.insert("lid".into(), Value::from(d.lid));
                    m.insert("name".into(), Value::from(d.name.as_str()));
                    Value::Object(m)
                })
                .collect::<Vec<_>>();
            obj.insert(DEVICES_KEY.into(), Value::Array(devices));
            if let Some(matrix) = &self.priority_matrix {
                obj.insert("priority_matrix".into(), matrix.clone());
            }
        }
        Value::Object(sorted(obj))
    }

    /// Decodes a descriptor published by us or by a Mooncake peer, laid out
    /// as `layouts` says for its protocol.
    ///
    /// Keys may come in any order; a missing `tcp_proto_version` means 1, a
    /// missing `tcp_data_port` 0. Fails with [`Error::MalformedJson`] on a
    /// wrong JSON type (e.g. `addr` as a string or negative) and with
    /// [`Error::Metadata`] on a descriptor Mooncake would refuse: an unknown
    /// protocol, a device with an empty name or GID, a buffer with an empty
    /// name, address 0 or length 0, or an RDMA buffer whose non-empty `rkey`
    /// does not match `lkey` (and, except for `barex`, `devices`) in length.
    pub fn decode(v: &Value, layouts: Layouts) -> Result<SegmentDesc> {
        let obj = v
            .as_object()
            .ok_or_else(|| malformed("segment descriptor is not a JSON object".into()))?;
        let name = opt_str(obj, "name", "segment")?.unwrap_or_default();
        let ctx = format!("segment descriptor {name:?}");
        let protocol = match obj.get("protocol") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(_)) => {
                return Err(Error::Metadata(format!(
                    "{ctx}: multi-protocol descriptors are not supported"
                )));
            }
            Some(_) => return Err(malformed(format!("{ctx}: \"protocol\" is not a string"))),
        };
        let Some(layout) = layouts(&protocol) else {
            return Err(Error::Metadata(format!(
                "{ctx}: unsupported protocol {protocol:?} (no transport of this build reads it)"
            )));
        };
        let tcp_data_port = match opt_u64(obj, "tcp_data_port", &ctx)? {
            None => 0,
            Some(p) => u16::try_from(p)
                .map_err(|_| malformed(format!("{ctx}: tcp_data_port {p} is not a port")))?,
        };
        let tcp_proto_version = match opt_u64(obj, "tcp_proto_version", &ctx)? {
            None => 1,
            Some(n) => u32::try_from(n)
                .map_err(|_| malformed(format!("{ctx}: tcp_proto_version {n} is too large")))?,
        };
        let timestamp = opt_str(obj, "timestamp", &ctx)?.unwrap_or_default();
        let rdma_server_name = opt_str(obj, "rdma_server_name", &ctx)?.filter(|s| !s.is_empty());

        let mut desc = SegmentDesc {
            name,
            protocol,
            tcp_data_port,
            tcp_proto_version,
            timestamp,
            rdma_server_name,
            ..SegmentDesc::default()
        };

        if let Layout::RdmaLike { .. } = layout {
            for (i, d) in opt_array(obj, DEVICES_KEY, &ctx)?.iter().enumerate() {
                desc.devices
                    .push(decode_device(d, &format!("{ctx} device {i}"))?);
            }
            desc.priority_matrix = obj.get("priority_matrix").filter(|m| !m.is_null()).cloned();
        }
        for (i, b) in opt_array(obj, "buffers", &ctx)?.iter().enumerate() {
            let bctx = format!("{ctx} buffer {i}");
            let buffer = decode_buffer(b, layout, &bctx)?;
            if let Layout::RdmaLike { keys_per_device } = layout {
                let n = buffer.rkey.len();
                if n != 0 && n != buffer.lkey.len() {
                    return Err(Error::Metadata(format!(
                        "{bctx}: {n} rkeys but {} lkeys",
                        buffer.lkey.len()
                    )));
                }
                if n != 0 && keys_per_device && n != desc.devices.len() {
                    return Err(Error::Metadata(format!(
                        "{bctx}: {n} rkeys but {} devices",
                        desc.devices.len()
                    )));
                }
            }
            desc.buffers.push(buffer);
        }

        let owned = |k: &str| {
            COMMON_KEYS.contains(&k)
                || (matches!(layout, Layout::RdmaLike { .. }) && RDMA_KEYS.contains(&k))
        };
        desc.extra = obj
            .iter()
            .filter(|(k, _)| !owned(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(desc)
    }

    /// Index of the first buffer that holds `addr`.
    pub fn buffer_at(&self, addr: u64) -> Option<usize> {
        self.buffers.iter().position(|b| b.contains(addr))
    }

    /// The buffers that hold `[addr, addr + len)` between them, in address
    /// order: one buffer that holds it all, or adjacent buffers with no gap
    /// (how a buffer larger than a NIC's largest memory region is
    /// published: one entry per region). `None` if a byte of the range is
    /// in no buffer.
    pub fn covering(&self, addr: u64, len: u64) -> Option<impl Iterator<Item = usize> + '_> {
        let end = addr.checked_add(len)?;
        let mut at = addr;
        let mut n = 0;
        // Walks once to check, and the iterator walks again: no allocation.
        while at < end || n == 0 {
            let b = self.buffer_at(at)?;
            at = self.buffers[b].end();
            n += 1;
        }
        let mut at = addr;
        Some((0..n).map_while(move |_| {
            let b = self.buffer_at(at)?;
            at = self.buffers[b].end();
            Some(b)
        }))
    }

    /// Index of the first buffer that holds all of `[addr, addr + len)`.
    pub fn find_buffer(&self, addr: u64, len: u64) -> Option<usize> {
        self.buffers.iter().position(|b| {
            addr >= b.addr
                && addr
                    .checked_add(len)
                    .zip(b.addr.checked_add(b.length))
                    .is_some_and(|(end, b_end)| end <= b_end)
        })
    }

    /// The peer's published priority matrix, typed; `None` when it
    /// publishes none or one that does not parse.
    pub fn peer_matrix(&self) -> Option<crate::topology::PriorityMatrix> {
        self.priority_matrix
            .as_ref()
            .and_then(|m| crate::topology::PriorityMatrix::from_value(m).ok())
    }

    /// Whether two descriptors describe the same segment, ignoring
    /// `timestamp`.
    pub fn same_content(&self, other: &SegmentDesc) -> bool {
        let SegmentDesc {
            name,
            protocol,
            tcp_data_port,
            tcp_proto_version,
            timestamp: _,
            buffers,
            devices,
            priority_matrix,
            rdma_server_name,
            extra,
        } = self;
        *name == other.name
            && *protocol == other.protocol
            && *tcp_data_port == other.tcp_data_port
            && *tcp_proto_version == other.tcp_proto_version
            && *buffers == other.buffers
            && *devices == other.devices
            && *priority_matrix == other.priority_matrix
            && *rdma_server_name == other.rdma_server_name
            && *extra == other.extra
    }
}

/// The current local time as Mooncake writes it in descriptors:
/// `YYYY-MM-DD HH:MM:SS.uuuuuu`.
pub fn now_timestamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = libc::time_t::try_from(now.as_secs()).unwrap_or(libc::time_t::MAX);
    // SAFETY: `tm` is plain old data for which all-zero bytes are a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the duration of the call;
    // localtime_r is the thread-safe variant and writes only into `tm`.
    let ok = !unsafe { libc::localtime_r(&secs, &mut tm) }.is_null();
    if !ok {
        tracing::warn!("localtime_r failed; descriptor timestamp left at the epoch");
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
        i64::from(tm.tm_year) + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        now.subsec_micros()
    )
}

/// Rebuilds a map with its keys inserted in sorted order, so the JSON text
/// is sorted like jsoncpp's whatever map type serde_json was built with.
fn sorted(obj: Map<String, Value>) -> Map<String, Value> {
    let mut entries: Vec<(String, Value)> = obj.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.into_iter().collect()
}

fn malformed(msg: String) -> Error {
    Error::MalformedJson(msg)
}

fn decode_device(v: &Value, ctx: &str) -> Result<DeviceDesc> {
    let obj = v
        .as_object()
        .ok_or_else(|| malformed(format!("{ctx} is not a JSON object")))?;
    let name = opt_str(obj, "name", ctx)?.unwrap_or_default();
    let gid = opt_str(obj, "gid", ctx)?.unwrap_or_default();
    let lid = match opt_u64(obj, "lid", ctx)? {
        None => 0,
        Some(l) => {
            u16::try_from(l).map_err(|_| malformed(format!("{ctx}: lid {l} is too large")))?
        }
    };
    if name.is_empty() {
        return Err(Error::Metadata(format!("{ctx}: empty device name")));
    }
    if gid.is_empty() {
        return Err(Error::Metadata(format!("{ctx} ({name}): empty gid")));
    }
    Ok(DeviceDesc { name, lid, gid })
}

fn decode_buffer(v: &Value, layout: Layout, ctx: &str) -> Result<BufferDesc> {
    let obj = v
        .as_object()
        .ok_or_else(|| malformed(format!("{ctx} is not a JSON object")))?;
    let name = opt_str(obj, "name", ctx)?.unwrap_or_default();
    let addr = opt_u64(obj, "addr", ctx)?.unwrap_or(0);
    let length = opt_u64(obj, "length", ctx)?.unwrap_or(0);
    let (lkey, rkey) = match layout {
        Layout::Tcp => (Vec::new(), Vec::new()),
        Layout::RdmaLike { .. } => (keys(obj, "lkey", ctx)?, keys(obj, "rkey", ctx)?),
    };
    if name.is_empty() {
        return Err(Error::Metadata(format!("{ctx}: empty buffer name")));
    }
    if addr == 0 {
        return Err(Error::Metadata(format!("{ctx} ({name}): address 0")));
    }
    if length == 0 {
        return Err(Error::Metadata(format!("{ctx} ({name}): length 0")));
    }
    if addr.checked_add(length).is_none() {
        return Err(Error::Metadata(format!(
            "{ctx} ({name}): {addr:#x}+{length} wraps the address space"
        )));
    }
    Ok(BufferDesc {
        name,
        addr,
        length,
        lkey,
        rkey,
    })
}

fn keys(obj: &Map<String, Value>, key: &str, ctx: &str) -> Result<Vec<u32>> {
    opt_array(obj, key, ctx)?
        .iter()
        .map(|k| {
            k.as_u64()
                .and_then(|k| u32::try_from(k).ok())
                .ok_or_else(|| {
                    malformed(format!("{ctx}: {key} entry {k} is not a 32-bit unsigned"))
                })
        })
        .collect()
}

/// A string member; missing or null is `None`, another type is an error.
fn opt_str(obj: &Map<String, Value>, key: &str, ctx: &str) -> Result<Option<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(malformed(format!(
            "{ctx}: {key:?} is {other}, not a string"
        ))),
    }
}

/// An unsigned integer member; missing or null is `None`, anything else
/// (negative, fractional, string) is an error.
fn opt_u64(obj: &Map<String, Value>, key: &str, ctx: &str) -> Result<Option<u64>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| malformed(format!("{ctx}: {key:?} is {v}, not an unsigned integer"))),
    }
}

/// An array member; missing or null is empty, another type is an error.
fn opt_array<'a>(obj: &'a Map<String, Value>, key: &str, ctx: &str) -> Result<&'a [Value]> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(malformed(format!(
            "{ctx}: {key:?} is {other}, not an array"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TCP_EXAMPLE: &str = r#"{"buffers":[{"addr":140234567680000,"length":1073741824,"name":"10.0.0.5:12345"}],"name":"10.0.0.5:12345","protocol":"tcp","tcp_data_port":15873,"tcp_proto_version":2,"timestamp":"2026-08-22 13:12:18.123456"}"#;

    const RDMA_EXAMPLE: &str = r#"{"buffers":[{"addr":140234567680000,"length":1073741824,"lkey":[2097408,2101760],"name":"cpu:0","rkey":[2097408,2101760]}],"devices":[{"gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:05","lid":0,"name":"mlx5_0"},{"gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:01:05","lid":0,"name":"mlx5_1"}],"name":"10.0.0.5:12345","priority_matrix":{"cpu:0":[["mlx5_0"],["mlx5_1"]],"cpu:1":[["mlx5_1"],["mlx5_0"]]},"protocol":"rdma","tcp_data_port":0,"tcp_proto_version":1,"timestamp":"2026-08-22 13:12:18.123456"}"#;

    #[test]
    fn a_range_is_covered_by_one_buffer_or_adjacent_ones() {
        let buf = |addr, length| BufferDesc {
            name: "cpu:0".into(),
            addr,
            length,
            ..Default::default()
        };
        // [100, 200) [200, 300) adjacent (listed out of order); [400, 500)
        // after a gap.
        let d = SegmentDesc {
            buffers: vec![buf(200, 100), buf(100, 100), buf(400, 100)],
            ..Default::default()
        };
        let cover = |a, l| d.covering(a, l).map(|b| b.collect::<Vec<_>>());
        assert_eq!(cover(120, 50), Some(vec![1]));
        assert_eq!(cover(150, 100), Some(vec![1, 0]));
        assert_eq!(cover(100, 200), Some(vec![1, 0]));
        assert_eq!(cover(250, 200), None, "a gap");
        assert_eq!(cover(450, 51), None, "past the end");
        assert_eq!(cover(50, 60), None, "before the start");
        assert_eq!(cover(u64::MAX - 1, 4), None);
        assert_eq!(d.buffer_at(299), Some(0));
        assert_eq!(d.buffer_at(300), None);
        // The peer's matrix is read from its JSON value.
        let rdma = SegmentDesc::from_json(&serde_json::from_str(RDMA_EXAMPLE).unwrap()).unwrap();
        let m = rdma.peer_matrix().unwrap();
        assert_eq!(m.entry("cpu:1").unwrap().0, ["mlx5_1".to_string()]);
    }

    fn tcp_desc() -> SegmentDesc {
        SegmentDesc {
            name: "10.0.0.5:12345".into(),
            protocol: "tcp".into(),
            tcp_data_port: 15873,
            tcp_proto_version: 2,
            timestamp: "2026-08-22 13:12:18.123456".into(),
            buffers: vec![BufferDesc {
                name: "10.0.0.5:12345".into(),
                addr: 140234567680000,
                length: 1073741824,
                ..BufferDesc::default()
            }],
            ..SegmentDesc::default()
        }
    }

    fn rdma_desc() -> SegmentDesc {
        SegmentDesc {
            name: "10.0.0.5:12345".into(),
            protocol: "rdma".into(),
            tcp_data_port: 0,
            tcp_proto_version: 1,
            timestamp: "2026-08-22 13:12:18.123456".into(),
            buffers: vec![BufferDesc {
                name: "cpu:0".into(),
                addr: 140234567680000,
                length: 1073741824,
                lkey: vec![2097408, 2101760],
                rkey: vec![2097408, 2101760],
            }],
            devices: vec![
                DeviceDesc {
                    name: "mlx5_0".into(),
                    lid: 0,
                    gid: "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:05".into(),
                },
                DeviceDesc {
                    name: "mlx5_1".into(),
                    lid: 0,
                    gid: "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:01:05".into(),
                },
            ],
            priority_matrix: Some(json!({
                "cpu:0": [["mlx5_0"], ["mlx5_1"]],
                "cpu:1": [["mlx5_1"], ["mlx5_0"]]
            })),
            ..SegmentDesc::default()
        }
    }

    fn expect_metadata(v: Value, what: &str) {
        match SegmentDesc::from_json(&v) {
            Err(Error::Metadata(m)) => assert!(m.contains(what), "{m:?} lacks {what:?}"),
            other => panic!("expected Metadata error about {what}, got {other:?}"),
        }
    }

    fn expect_malformed(v: Value) {
        match SegmentDesc::from_json(&v) {
            Err(Error::MalformedJson(_)) => {}
            other => panic!("expected MalformedJson, got {other:?}"),
        }
    }

    #[test]
    fn tcp_encoding_is_mooncakes() {
        let text = serde_json::to_string(&tcp_desc().to_json()).unwrap();
        assert_eq!(text, TCP_EXAMPLE);
    }

    #[test]
    fn rdma_encoding_is_mooncakes() {
        let text = serde_json::to_string(&rdma_desc().to_json()).unwrap();
        assert_eq!(text, RDMA_EXAMPLE);
    }

    #[test]
    fn examples_decode() {
        let tcp = SegmentDesc::from_json(&serde_json::from_str(TCP_EXAMPLE).unwrap()).unwrap();
        assert_eq!(tcp, tcp_desc());
        let rdma = SegmentDesc::from_json(&serde_json::from_str(RDMA_EXAMPLE).unwrap()).unwrap();
        assert_eq!(rdma, rdma_desc());
    }

    #[test]
    fn round_trip_keeps_extra_fields() {
        let mut d = tcp_desc();
        d.extra.insert("generation".into(), json!(7));
        d.extra.insert(
            "tcp_devices".into(),
            json!([{"name": "eth0", "ip": "10.0.0.5"}]),
        );
        d.rdma_server_name = Some("10.1.0.5:12345".into());
        let back = SegmentDesc::from_json(&d.to_json()).unwrap();
        assert_eq!(back, d);
        let mut r = rdma_desc();
        r.extra.insert("generation".into(), json!(3));
        assert_eq!(SegmentDesc::from_json(&r.to_json()).unwrap(), r);
    }

    #[test]
    fn tcp_drops_rdma_only_fields() {
        let mut d = tcp_desc();
        d.devices = rdma_desc().devices;
        d.priority_matrix = Some(json!({}));
        d.buffers[0].lkey = vec![1];
        let v = d.to_json();
        assert!(v.get("devices").is_none());
        assert!(v.get("priority_matrix").is_none());
        assert!(v["buffers"][0].get("lkey").is_none());
    }

    #[test]
    fn defaults_and_any_key_order() {
        let v: Value = serde_json::from_str(
            "{\"timestamp\":\"t\",\"buffers\":[{\"name\":\"n\",\"length\":5,\"addr\":9}],\
             \"protocol\":\"tcp\",\"name\":\"h:1\"}\n",
        )
        .unwrap();
        let d = SegmentDesc::from_json(&v).unwrap();
        assert_eq!(d.tcp_proto_version, 1);
        assert_eq!(d.tcp_data_port, 0);
        assert_eq!(d.buffers[0].addr, 9);
        assert!(d.extra.is_empty());
    }

    #[test]
    fn same_content_ignores_timestamp() {
        let a = rdma_desc();
        let mut b = a.clone();
        b.timestamp = now_timestamp();
        assert!(a.same_content(&b));
        b.buffers[0].rkey.clear();
        assert!(!a.same_content(&b));
        let mut c = a.clone();
        c.extra.insert("generation".into(), json!(1));
        assert!(!a.same_content(&c));
    }

    #[test]
    fn rejects_corrupt_devices() {
        let mut v = rdma_desc().to_json();
        v["devices"][0]["name"] = json!("");
        expect_metadata(v, "empty device name");
        let mut v = rdma_desc().to_json();
        v["devices"][1]["gid"] = json!("");
        expect_metadata(v, "empty gid");
    }

    #[test]
    fn rejects_corrupt_buffers() {
        for proto in [tcp_desc(), rdma_desc()] {
            let mut v = proto.to_json();
            v["buffers"][0]["name"] = json!("");
            expect_metadata(v, "empty buffer name");
            let mut v = proto.to_json();
            v["buffers"][0]["addr"] = json!(0);
            expect_metadata(v, "address 0");
            let mut v = proto.to_json();
            v["buffers"][0]["length"] = json!(0);
            expect_metadata(v, "length 0");
            let mut v = proto.to_json();
            v["buffers"][0].as_object_mut().unwrap().remove("addr");
            expect_metadata(v, "address 0");
        }
    }

    #[test]
    fn rejects_key_count_mismatch() {
        let mut v = rdma_desc().to_json();
        v["buffers"][0]["rkey"] = json!([1]);
        expect_metadata(v, "1 rkeys but 2 lkeys");
        let mut v = rdma_desc().to_json();
        v["buffers"][0]["rkey"] = json!([1, 2, 3]);
        v["buffers"][0]["lkey"] = json!([1, 2, 3]);
        expect_metadata(v, "3 rkeys but 2 devices");
        // barex hands the whole key vector over and is not device-indexed.
        let mut v = rdma_desc().to_json();
        v["protocol"] = json!("barex");
        v["buffers"][0]["rkey"] = json!([1, 2, 3]);
        v["buffers"][0]["lkey"] = json!([1, 2, 3]);
        assert!(SegmentDesc::from_json(&v).is_ok());
        // Empty rkey = not remotely accessible: accepted.
        let mut v = rdma_desc().to_json();
        v["buffers"][0]["rkey"] = json!([]);
        assert!(SegmentDesc::from_json(&v).is_ok());
    }

    #[test]
    fn protocols() {
        let mut v = tcp_desc().to_json();
        v["protocol"] = json!("nvlink");
        expect_metadata(v, "unsupported protocol");
        let mut v = tcp_desc().to_json();
        v.as_object_mut().unwrap().remove("protocol");
        expect_metadata(v, "unsupported protocol");
        let mut v = tcp_desc().to_json();
        v["protocol"] = json!(["tcp", "cxl"]);
        expect_metadata(v, "multi-protocol");
        for p in ["efa", "barex", "cxi"] {
            let mut v = rdma_desc().to_json();
            v["protocol"] = json!(p);
            let d = SegmentDesc::from_json(&v).unwrap();
            assert_eq!(d.devices.len(), 2);
            assert_eq!(d.to_json(), v);
        }
    }

    #[test]
    fn rejects_wrong_types() {
        let mut v = tcp_desc().to_json();
        v["buffers"][0]["addr"] = json!("140234567680000");
        expect_malformed(v);
        let mut v = tcp_desc().to_json();
        v["buffers"][0]["length"] = json!(-1);
        expect_malformed(v);
        let mut v = tcp_desc().to_json();
        v["buffers"][0]["addr"] = json!(1.5);
        expect_malformed(v);
        let mut v = tcp_desc().to_json();
        v["tcp_data_port"] = json!(70000);
        expect_malformed(v);
        let mut v = tcp_desc().to_json();
        v["name"] = json!(5);
        expect_malformed(v);
        let mut v = tcp_desc().to_json();
        v["buffers"] = json!({});
        expect_malformed(v);
        let mut v = rdma_desc().to_json();
        v["buffers"][0]["rkey"] = json!([1, 4294967296u64]);
        expect_malformed(v);
        let mut v = rdma_desc().to_json();
        v["devices"][0]["lid"] = json!(65536);
        expect_malformed(v);
        expect_malformed(json!([1, 2]));
    }

    #[test]
    fn timestamp_format() {
        let t = now_timestamp();
        assert_eq!(t.len(), 26, "{t}");
        let b = t.as_bytes();
        for (i, c) in b.iter().enumerate() {
            match i {
                4 | 7 => assert_eq!(*c, b'-'),
                10 => assert_eq!(*c, b' '),
                13 | 16 => assert_eq!(*c, b':'),
                19 => assert_eq!(*c, b'.'),
                _ => assert!(c.is_ascii_digit(), "{t}"),
            }
        }
    }
}
