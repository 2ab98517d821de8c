//! The authentication frames. Each has the shape of a handshake frame
//! (`[u64 length][u8 type][body]`, `length = 1 + body length`, here always
//! little-endian) with a type byte Mooncake does not use (Mooncake's are
//! 0–3; a Mooncake peer reads ours as an old-protocol frame that is not
//! JSON, and gives up), and a fixed size:
//!
//! | frame | from | type | body | bytes |
//! |---|---|---|---|---|
//! | hello | client | `0xA1` | version 1, client nonce (32) | 42 |
//! | challenge | server | `0xA2` | version 1, server nonce (32) | 42 |
//! | proof | client | `0xA3` | name tag (8), proof under each key (2 × 32) | 81 |
//! | accept | server | `0xA4` | the server's proof (32) | 41 |
//! | refused | server | `0xAF` | reason (1) | 10 |
//!
//! A reader decides from the first bytes: as soon as one differs from the
//! frame it expects, the bytes are not that frame ([`Cut::Other`]); the
//! body of a frame is never longer than its fixed size, so nothing a peer
//! sends during authentication makes us hold more than one frame.

use std::fmt;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a proof (HMAC-SHA256).
pub const MAC_LEN: usize = 32;
/// Bytes of the tag of the listener's name a proof is made for.
pub const TAG_LEN: usize = 8;
/// Version of the exchange.
pub const VERSION: u8 = 1;

/// Type byte of the client's hello.
pub const HELLO: u8 = 0xA1;
/// Type byte of the server's challenge.
pub const CHALLENGE: u8 = 0xA2;
/// Type byte of the client's proof.
pub const PROOF: u8 = 0xA3;
/// Type byte of the server's proof (the connection is authenticated).
pub const ACCEPT: u8 = 0xA4;
/// Type byte of a refusal.
pub const REFUSED: u8 = 0xAF;

/// Bytes before a frame's body: the length word and the type byte.
pub const HEAD_LEN: usize = 9;
/// Body of a hello or a challenge: version and nonce.
pub const NONCE_BODY: usize = 1 + NONCE_LEN;
/// Body of a proof: name tag and one proof per key slot.
pub const PROOF_BODY: usize = TAG_LEN + 2 * MAC_LEN;
/// Body of an accept.
pub const ACCEPT_BODY: usize = MAC_LEN;
/// Body of a refusal.
pub const REFUSED_BODY: usize = 1;
/// The longest frame.
pub const MAX_FRAME: usize = HEAD_LEN + PROOF_BODY;

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reason {
    /// The connection did not start with a hello: a peer without a key
    /// (a Mooncake peer, or an engine without `MC_TE_AUTH_KEY_FILE`).
    NoAuthentication = 1,
    /// The proof is not made with any of our keys.
    WrongKey = 2,
    /// The proof is made for another listener name.
    WrongName = 3,
    /// The peer has no key: it cannot authenticate.
    NotEnabled = 4,
    /// A frame of the exchange was not what the exchange expects.
    Malformed = 5,
}

impl Reason {
    /// The reason of a refusal's body byte (unknown values are malformed).
    pub fn from_byte(b: u8) -> Reason {
        match b {
            1 => Reason::NoAuthentication,
            2 => Reason::WrongKey,
            3 => Reason::WrongName,
            4 => Reason::NotEnabled,
            _ => Reason::Malformed,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::NoAuthentication => {
                "no authentication (a peer without the cluster key: a Mooncake peer, or an \
                 engine without MC_TE_AUTH_KEY_FILE)"
            }
            Reason::WrongKey => "wrong key",
            Reason::WrongName => {
                "a proof made for another segment name (the peer was opened by a name that is \
                 not this engine's own)"
            }
            Reason::NotEnabled => {
                "the peer has no key (MC_TE_AUTH_KEY_FILE is not set there) and cannot \
                 authenticate"
            }
            Reason::Malformed => "malformed authentication",
        })
    }
}

/// The length word and type byte of a frame of `kind` with a body of
/// `body` bytes.
fn head(kind: u8, body: usize) -> [u8; HEAD_LEN] {
    let mut h = [0u8; HEAD_LEN];
    h[..8].copy_from_slice(&(1 + body as u64).to_le_bytes());
    h[8] = kind;
    h
}

/// A frame of `kind` with `body`.
pub fn frame(kind: u8, body: &[&[u8]]) -> Vec<u8> {
    let len: usize = body.iter().map(|b| b.len()).sum();
    let mut out = Vec::with_capacity(HEAD_LEN + len);
    out.extend_from_slice(&head(kind, len));
    for part in body {
        out.extend_from_slice(part);
    }
    out
}

/// A refusal frame.
pub fn refusal(reason: Reason) -> Vec<u8> {
    frame(REFUSED, &[&[reason as u8]])
}

/// What the front of received bytes holds, for one expected frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Cut<'a> {
    /// So far the bytes match the frame; it is not complete.
    Short,
    /// The whole frame: its body (the frame's bytes are the first
    /// [`HEAD_LEN`] plus the body's).
    Whole(&'a [u8]),
    /// The bytes are not this frame.
    Other,
}

/// Looks for a frame of `kind` with a body of `body` bytes at the front of
/// `buf`.
pub fn cut(buf: &[u8], kind: u8, body: usize) -> Cut<'_> {
    let h = head(kind, body);
    let n = buf.len().min(HEAD_LEN);
    if buf[..n] != h[..n] {
        return Cut::Other;
    }
    match buf.get(HEAD_LEN..HEAD_LEN + body) {
        Some(b) => Cut::Whole(b),
        None => Cut::Short,
    }
}

/// The reason of a refusal at the front of `buf`: `Some(None)` while it
/// may still be one, `None` if it is not one.
pub fn refused(buf: &[u8]) -> Option<Option<Reason>> {
    match cut(buf, REFUSED, REFUSED_BODY) {
        Cut::Short => Some(None),
        Cut::Whole(b) => Some(Some(Reason::from_byte(b[0]))),
        Cut::Other => None,
    }
}

/// The reason of a refusal read as an old-protocol handshake frame's
/// payload (its type byte included), as a client without a key reads it.
pub fn refusal_payload(payload: &[u8]) -> Option<Reason> {
    match payload {
        [REFUSED, reason] => Some(Reason::from_byte(*reason)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_have_their_fixed_sizes_and_unused_type_bytes() {
        let nonce = [9u8; NONCE_LEN];
        let hello = frame(HELLO, &[&[VERSION], &nonce]);
        assert_eq!(hello.len(), 42);
        assert_eq!(&hello[..8], &34u64.to_le_bytes());
        assert_eq!(
            refusal(Reason::WrongKey),
            [2, 0, 0, 0, 0, 0, 0, 0, REFUSED, 2]
        );
        assert_eq!(MAX_FRAME, 81);
        for t in [HELLO, CHALLENGE, PROOF, ACCEPT, REFUSED] {
            assert!(t > 3, "Mooncake uses type bytes 0-3");
        }
    }

    #[test]
    fn cut_decides_at_the_first_differing_byte() {
        let nonce = [1u8; NONCE_LEN];
        let hello = frame(HELLO, &[&[VERSION], &nonce]);
        for i in 0..hello.len() {
            assert_eq!(cut(&hello[..i], HELLO, NONCE_BODY), Cut::Short);
        }
        assert_eq!(cut(&hello, HELLO, NONCE_BODY), Cut::Whole(&hello[9..]));
        // A Mooncake data request header (size 65536) differs at once.
        assert_eq!(cut(&65536u64.to_le_bytes(), HELLO, NONCE_BODY), Cut::Other);
        // A Mooncake handshake frame differs at its type byte.
        let mut frame = 34u64.to_le_bytes().to_vec();
        frame.push(1);
        assert_eq!(cut(&frame, HELLO, NONCE_BODY), Cut::Other);
        assert_eq!(refused(&[2, 0]), Some(None));
        assert_eq!(
            refused(&refusal(Reason::NotEnabled)),
            Some(Some(Reason::NotEnabled))
        );
        assert_eq!(refused(&hello), None);
        let r = refusal(Reason::NoAuthentication);
        assert_eq!(refusal_payload(&r[8..]), Some(Reason::NoAuthentication));
        assert_eq!(refusal_payload(b"{}"), None);
    }
}
