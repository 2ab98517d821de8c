//! Handshake frames (spec §3.2, Mooncake `common.h` `writeString`/`readString`).
//!
//! A typed frame is `[u64 length][u8 type][payload]` with
//! `length = 1 + payload.len()`; a legacy frame (Mooncake's "old protocol")
//! is `[u64 length][payload]`. The length is in **host byte order**, as
//! Mooncake writes it. On reading, a first byte `<= 3` is a type byte,
//! anything else means the whole buffer is a legacy payload (JSON starts
//! with `{`, well above 3).

use std::fmt;
use std::io::{self, Read};

/// The request type carried in a typed frame (Mooncake `HandShakeRequestType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// RDMA endpoint handshake (`HandShakeDesc`).
    Connection = 0,
    /// Segment descriptor exchange.
    Metadata = 1,
    /// A notify message for the peer's notify queue.
    Notify = 2,
    /// Liveness probe; the server answers `{"status":"success"}` itself.
    Probe = 3,
    /// The shared-memory transport's attach request (ours; Mooncake has no
    /// such frame, and never sends one).
    ShmAttach = 4,
}

impl FrameKind {
    /// The kind for a type byte, or `None` if the byte is above 4.
    pub fn from_byte(b: u8) -> Option<FrameKind> {
        match b {
            0 => Some(FrameKind::Connection),
            1 => Some(FrameKind::Metadata),
            2 => Some(FrameKind::Notify),
            3 => Some(FrameKind::Probe),
            4 => Some(FrameKind::ShmAttach),
            _ => None,
        }
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A frame with a type byte; the payload follows it.
    Typed(FrameKind, Vec<u8>),
    /// An old-protocol frame without a type byte (treated as Connection).
    Legacy(Vec<u8>),
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The socket failed, timed out or closed before the frame was complete.
    Io(io::Error),
    /// The length field was 0.
    ZeroLength,
    /// The length field exceeds the limit (`MC_HANDSHAKE_MAX_LENGTH`); an
    /// HTTP request or a TLS ClientHello decodes as such an absurd length.
    TooLong {
        /// The decoded length field.
        len: u64,
        /// The limit in force.
        max: u64,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "handshake frame read failed: {e}"),
            FrameError::ZeroLength => write!(f, "handshake frame of length 0"),
            FrameError::TooLong { len, max } => write!(
                f,
                "handshake frame length {len} exceeds the limit {max} \
                 (raise MC_HANDSHAKE_MAX_LENGTH if the peer is a real engine; \
                 otherwise the peer does not speak the handshake protocol)"
            ),
        }
    }
}

impl std::error::Error for FrameError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FrameError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for FrameError {
    fn from(e: io::Error) -> Self {
        FrameError::Io(e)
    }
}

/// Encodes one frame: typed when `kind` is `Some`, legacy (no type byte)
/// when `None`. The length is written in native byte order.
pub fn encode(kind: Option<FrameKind>, payload: &[u8]) -> Vec<u8> {
    let mut out = header(kind, payload.len());
    out.extend_from_slice(payload);
    out
}

/// The bytes of a frame before its payload of `payload_len` bytes: the
/// length word and, when typed, the type byte.
pub fn header(kind: Option<FrameKind>, payload_len: usize) -> Vec<u8> {
    let type_len = usize::from(kind.is_some());
    let len = (payload_len + type_len) as u64;
    let mut out = Vec::with_capacity(8 + type_len + payload_len);
    out.extend_from_slice(&len.to_ne_bytes());
    if let Some(k) = kind {
        out.push(k as u8);
    }
    out
}

/// Serializes `v` as jsoncpp's `FastWriter` does (compact, ending with
/// `"\n"`) and encodes it as one frame.
pub fn encode_json(kind: Option<FrameKind>, v: &serde_json::Value) -> Vec<u8> {
    // Display of a Value is compact JSON and cannot fail.
    let mut text = v.to_string();
    text.push('\n');
    encode(kind, text.as_bytes())
}

/// Checks a decoded length field against `1..=max_len`.
fn check_len(len: u64, max_len: u64) -> Result<(), FrameError> {
    if len == 0 {
        return Err(FrameError::ZeroLength);
    }
    if len > max_len {
        return Err(FrameError::TooLong { len, max: max_len });
    }
    Ok(())
}

/// A frame cut from received bytes, or how far it is.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// The frame is incomplete; once whole it spans this many bytes (when
    /// the length field has arrived).
    Partial(Option<usize>),
    /// A whole frame.
    Whole(Frame),
}

/// Cuts one frame from the front of `buf`, which holds bytes received so
/// far: [`Taken::Partial`] while the frame is incomplete (`buf` unchanged),
/// the frame once it is whole (its bytes removed from `buf`; any bytes
/// after it stay). The length field is checked as soon as its 8 bytes are
/// there.
pub fn take_frame(buf: &mut Vec<u8>, max_len: u64) -> Result<Taken, FrameError> {
    let Some(len_bytes) = buf.first_chunk::<8>() else {
        return Ok(Taken::Partial(None));
    };
    let len = u64::from_ne_bytes(*len_bytes);
    check_len(len, max_len)?;
    // `len <= max_len`, a configured limit far below the address space.
    let end = 8 + len as usize;
    if buf.len() < end {
        return Ok(Taken::Partial(Some(end)));
    }
    let rest = buf.split_off(end);
    let mut frame = std::mem::replace(buf, rest);
    let kind = FrameKind::from_byte(frame[8]);
    frame.drain(..if kind.is_some() { 9 } else { 8 });
    Ok(Taken::Whole(match kind {
        Some(kind) => Frame::Typed(kind, frame),
        None => Frame::Legacy(frame),
    }))
}

/// Reads one frame. The length must be in `1..=max_len`; the body is read
/// as it arrives (no allocation of the announced length up front).
pub fn read_frame(r: &mut impl Read, max_len: u64) -> Result<Frame, FrameError> {
    let mut len_buf = [0u8; 8];
    r.read_exact(&mut len_buf)?;
    let len = u64::from_ne_bytes(len_buf);
    check_len(len, max_len)?;
    // The first byte tells a typed frame from a legacy one; reading it
    // apart keeps the payload where it lands.
    let mut first = [0u8; 1];
    r.read_exact(&mut first)?;
    let kind = FrameKind::from_byte(first[0]);
    let mut buf = Vec::new();
    if kind.is_none() {
        buf.push(first[0]);
    }
    let rest = len - 1;
    // `rest < max_len`, a configured limit far below the address space.
    buf.reserve(rest.min(64 * 1024) as usize);
    r.take(rest).read_to_end(&mut buf)?;
    let got = buf.len() as u64 - u64::from(kind.is_none());
    if got < rest {
        return Err(FrameError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("peer closed after {} of {len} frame bytes", got + 1),
        )));
    }
    Ok(match kind {
        Some(kind) => Frame::Typed(kind, buf),
        None => Frame::Legacy(buf),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Cursor;

    const MAX: u64 = 1 << 20;

    fn decode(bytes: &[u8]) -> Result<Frame, FrameError> {
        read_frame(&mut Cursor::new(bytes), MAX)
    }

    #[test]
    fn round_trip_every_kind() {
        for kind in [
            FrameKind::Connection,
            FrameKind::Metadata,
            FrameKind::Notify,
            FrameKind::Probe,
        ] {
            let payload = br#"{"name":"seg"}"#;
            let bytes = encode(Some(kind), payload);
            assert_eq!(bytes.len(), 8 + 1 + payload.len());
            assert_eq!(bytes[8], kind as u8);
            let frame = decode(&bytes).expect("valid frame");
            assert_eq!(frame, Frame::Typed(kind, payload.to_vec()));
        }
    }

    #[test]
    fn empty_typed_payload_is_length_one() {
        let bytes = encode(Some(FrameKind::Probe), b"");
        assert_eq!(&bytes[..8], &1u64.to_ne_bytes());
        assert_eq!(
            decode(&bytes).expect("valid frame"),
            Frame::Typed(FrameKind::Probe, Vec::new())
        );
    }

    #[test]
    fn typed_789_byte_payload_native_endian_length() {
        // 790 = 0x316: on little-endian hosts the frame starts 0x16 0x03,
        // like a TLS record, and is still a valid frame (Mooncake test
        // ValidTypedFrameWithTlsLikeNativeEndianLength).
        let payload = vec![b'x'; 789];
        let bytes = encode(Some(FrameKind::Metadata), &payload);
        assert_eq!(&bytes[..8], &790u64.to_ne_bytes());
        if cfg!(target_endian = "little") {
            assert_eq!(&bytes[..3], &[0x16, 0x03, 0x00]);
        }
        assert_eq!(
            decode(&bytes).expect("valid frame"),
            Frame::Typed(FrameKind::Metadata, payload)
        );
    }

    #[test]
    fn legacy_frame() {
        let payload = br#"{"name":"segment"}"#;
        let bytes = encode(None, payload);
        assert_eq!(&bytes[..8], &(payload.len() as u64).to_ne_bytes());
        assert_eq!(&bytes[8..], payload);
        assert_eq!(
            decode(&bytes).expect("valid frame"),
            Frame::Legacy(payload.to_vec())
        );
    }

    #[test]
    fn json_is_compact_with_newline() {
        let bytes = encode_json(Some(FrameKind::Notify), &json!({"b": 1, "a": "x"}));
        assert_eq!(&bytes[9..], b"{\"a\":\"x\",\"b\":1}\n");
        assert_eq!(&bytes[..8], &(bytes.len() as u64 - 8).to_ne_bytes());
    }

    #[test]
    fn rejects_zero_and_oversized_lengths() {
        assert!(matches!(
            decode(&0u64.to_ne_bytes()),
            Err(FrameError::ZeroLength)
        ));
        let mut big = (MAX + 1).to_ne_bytes().to_vec();
        big.extend_from_slice(&[0u8; 16]);
        assert!(matches!(
            decode(&big),
            Err(FrameError::TooLong { len, max: MAX }) if len == MAX + 1
        ));
        // Exactly the limit is accepted.
        let mut at_max = MAX.to_ne_bytes().to_vec();
        at_max.push(FrameKind::Metadata as u8);
        at_max.resize(8 + MAX as usize, b' ');
        assert!(matches!(
            decode(&at_max),
            Ok(Frame::Typed(FrameKind::Metadata, p)) if p.len() == MAX as usize - 1
        ));
    }

    #[test]
    fn rejects_http_probe() {
        let req = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
        assert!(matches!(decode(req), Err(FrameError::TooLong { .. })));
    }

    #[test]
    fn rejects_tls_client_hello() {
        let hello = [
            0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, 0x00,
        ];
        assert!(matches!(decode(&hello), Err(FrameError::TooLong { .. })));
    }

    #[test]
    fn take_frame_waits_for_the_whole_frame_and_keeps_what_follows() {
        for (kind, payload) in [
            (Some(FrameKind::Probe), &b"{}\n"[..]),
            (Some(FrameKind::Metadata), &b""[..]),
            (None, &b"{\"qp_num\":[1]}"[..]),
        ] {
            let bytes = encode(kind, payload);
            let mut buf = Vec::new();
            // Byte by byte: nothing until the last byte, and the frame then.
            for (i, b) in bytes.iter().enumerate() {
                buf.push(*b);
                let got = take_frame(&mut buf, MAX).expect("valid so far");
                if i + 1 < 8 {
                    assert_eq!(got, Taken::Partial(None));
                } else if i + 1 < bytes.len() {
                    assert_eq!(got, Taken::Partial(Some(bytes.len())));
                    assert_eq!(buf.len(), i + 1);
                } else {
                    assert_eq!(got, Taken::Whole(decode(&bytes).expect("frame")));
                    assert!(buf.is_empty());
                }
            }
            // What follows the frame stays in the buffer.
            let mut buf = bytes.clone();
            buf.extend_from_slice(b"next");
            assert!(matches!(take_frame(&mut buf, MAX), Ok(Taken::Whole(_))));
            assert_eq!(buf, b"next");
        }
        let mut big = (MAX + 1).to_ne_bytes().to_vec();
        assert!(matches!(
            take_frame(&mut big, MAX),
            Err(FrameError::TooLong { .. })
        ));
        assert!(matches!(
            take_frame(&mut vec![0; 8], MAX),
            Err(FrameError::ZeroLength)
        ));
    }

    #[test]
    fn truncated_frames_are_io_errors() {
        // Short length field.
        assert!(matches!(decode(&[1, 0, 0]), Err(FrameError::Io(_))));
        // Body shorter than announced.
        let mut bytes = encode(Some(FrameKind::Metadata), b"{}\n");
        bytes.truncate(bytes.len() - 1);
        assert!(
            matches!(decode(&bytes), Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof)
        );
    }
}
