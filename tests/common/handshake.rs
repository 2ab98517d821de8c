//! The handshake protocol (Mooncake's `SocketHandShakePlugin`) as a peer
//! speaks it, written for the tests from the protocol, apart from the
//! engine's implementation: a frame is an 8-byte length in native byte
//! order (the payload plus one type byte), the type byte (Connection 0,
//! Metadata 1, Notify 2, Probe 3) and a JSON payload ending in `\n`; an
//! old-protocol frame has no type byte. A request is answered with one
//! frame of the same type.

use serde_json::Value;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The type byte of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Connection = 0,
    Metadata = 1,
    Notify = 2,
    Probe = 3,
}

/// A frame as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Typed(FrameKind, Vec<u8>),
    Legacy(Vec<u8>),
}

/// One frame of `payload`: typed when `kind` is given.
pub fn encode(kind: Option<FrameKind>, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u64 + u64::from(kind.is_some());
    let mut out = len.to_ne_bytes().to_vec();
    if let Some(k) = kind {
        out.push(k as u8);
    }
    out.extend_from_slice(payload);
    out
}

/// One frame of compact JSON ending in `\n`.
pub fn encode_json(kind: Option<FrameKind>, v: &Value) -> Vec<u8> {
    encode(kind, format!("{v}\n").as_bytes())
}

/// Reads one frame of at most `max` bytes.
pub fn read_frame(r: &mut impl Read, max: u64) -> io::Result<Frame> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    let len = u64::from_ne_bytes(len);
    if len == 0 || len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame length {len}"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    let kind = match body[0] {
        0 => Some(FrameKind::Connection),
        1 => Some(FrameKind::Metadata),
        2 => Some(FrameKind::Notify),
        3 => Some(FrameKind::Probe),
        _ => None,
    };
    Ok(match kind {
        Some(k) => Frame::Typed(k, body.split_off(1)),
        None => Frame::Legacy(body),
    })
}

/// Sends one `kind` request to `host:port` and returns the JSON reply
/// (connect within 5 s, reply within 30 s).
pub fn call(host: &str, port: u16, kind: FrameKind, request: &Value) -> Result<Value, String> {
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}:{port}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}:{port} resolves to nothing"))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    s.write_all(&encode_json(Some(kind), request))
        .map_err(|e| format!("send to {addr}: {e}"))?;
    let frame = read_frame(&mut s, 1 << 30).map_err(|e| format!("reply from {addr}: {e}"))?;
    let _ = s.shutdown(Shutdown::Write);
    match frame {
        Frame::Typed(k, payload) if k == kind => {
            serde_json::from_slice(&payload).map_err(|e| format!("reply from {addr}: {e}"))
        }
        other => Err(format!("reply from {addr}: {other:?}")),
    }
}
