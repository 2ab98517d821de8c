//! The challenge–response, both sides, as state machines over the bytes a
//! connection has received (no I/O here: the handshake listener and
//! client, the TCP sessions and lanes each move the bytes their way).
//!
//! ```text
//! client                                   server
//!   hello(version, Nc)            ──▶
//!                                 ◀──      challenge(version, Ns)
//!   proof(tag(name), P_C(k1), P_C(k2)) ──▶  checks the tag and a proof
//!                                 ◀──      accept(P_S(k))  | refused(reason)
//!   checks P_S, then sends its requests
//! ```
//!
//! `P_D(k) = HMAC-SHA256(k, "mooncake-te-auth-v1" ‖ port ‖ D ‖ len(name) ‖
//! name ‖ Nc ‖ Ns)`, with `D` the direction (`C` client, `S` server),
//! `port` `H` (handshake) or `D` (data), and `name` the listener's segment
//! name as the client means it (the server accepts only its own). The
//! client proves itself with each of its keys (one key: the same proof
//! twice); the server answers with the key that matched, which the client
//! checks against its own keys. Nonces are 32 random bytes
//! (`getrandom`); proofs are compared in constant time.

use super::keys::{HmacSha256, Keys};
use super::wire::{
    ACCEPT, ACCEPT_BODY, CHALLENGE, Cut, HEAD_LEN, HELLO, MAC_LEN, NONCE_BODY, NONCE_LEN, PROOF,
    PROOF_BODY, Reason, TAG_LEN, VERSION, cut, frame, refused,
};
use hmac::Mac;
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::Arc;

/// What every proof starts with.
const DOMAIN: &[u8] = b"mooncake-te-auth-v1";
/// Direction byte of the client's proof.
const FROM_CLIENT: u8 = b'C';
/// Direction byte of the server's proof.
const FROM_SERVER: u8 = b'S';

type Nonce = [u8; NONCE_LEN];

/// The port a connection authenticates on: a proof made for one is no
/// good on the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The handshake listener.
    Handshake,
    /// The TCP data port.
    Data,
}

impl Port {
    fn byte(self) -> u8 {
        match self {
            Port::Handshake => b'H',
            Port::Data => b'D',
        }
    }
}

/// The tag of a listener name in a proof frame (public: it only lets the
/// server tell a proof for another name from one with another key).
fn tag(name: &str) -> [u8; TAG_LEN] {
    let digest = Sha256::new()
        .chain_update(DOMAIN)
        .chain_update(b" name\0")
        .chain_update(name.as_bytes())
        .finalize();
    let mut t = [0u8; TAG_LEN];
    t.copy_from_slice(&digest[..TAG_LEN]);
    t
}

/// The proof of `dir` under `key`, ready to finalize or verify.
fn proof(key: &HmacSha256, port: Port, dir: u8, name: &str, nc: &Nonce, ns: &Nonce) -> HmacSha256 {
    let mut m = key.clone();
    m.update(DOMAIN);
    m.update(&[port.byte(), dir]);
    m.update(&(name.len() as u64).to_le_bytes());
    m.update(name.as_bytes());
    m.update(nc);
    m.update(ns);
    m
}

/// A fresh random nonce.
fn nonce() -> Result<Nonce, AuthError> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(n)
}

/// The nonce of a hello or challenge body, if its version is ours.
fn nonce_of(body: &[u8]) -> Option<Nonce> {
    let (&version, n) = body.split_first()?;
    (version == VERSION).then(|| n.try_into().ok()).flatten()
}

/// Why our side of an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// The peer refused us, and said why.
    Refused(Reason),
    /// The peer's proof is wrong: it does not hold our key.
    Impostor,
    /// The peer sent bytes that are not the exchange.
    Unexpected,
    /// No random nonce could be drawn.
    Random(String),
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::Refused(r) => write!(f, "authentication refused by the peer: {r}"),
            AuthError::Impostor => f.write_str(
                "the peer's proof of the cluster key is wrong: it does not hold our key",
            ),
            AuthError::Unexpected => f.write_str(
                "the peer answered the authentication with something else (it does not \
                 authenticate: a Mooncake peer, or an engine without MC_TE_AUTH_KEY_FILE)",
            ),
            AuthError::Random(e) => write!(f, "no random nonce for the authentication: {e}"),
        }
    }
}

/// A listener's side of authentication: the keys, the port, and the
/// names it answers to (its segment name).
#[derive(Debug)]
pub struct Listener {
    keys: Arc<Keys>,
    port: Port,
    names: Vec<(String, [u8; TAG_LEN])>,
}

impl Listener {
    /// The listener of `port` of the engine named `names`, holding `keys`.
    pub fn new(keys: Arc<Keys>, port: Port, names: &[&str]) -> Listener {
        Listener {
            keys,
            port,
            names: names.iter().map(|n| (n.to_string(), tag(n))).collect(),
        }
    }
}

/// What the server does next.
#[derive(Debug, PartialEq, Eq)]
pub enum ServerStep {
    /// Wait for more bytes: the frame expected is this long.
    Wait(usize),
    /// Send these bytes (the challenge), then go on.
    Send(Vec<u8>),
    /// The client proved itself: send these bytes (our proof); the
    /// connection is authenticated.
    Accepted(Vec<u8>),
    /// Send [`super::wire::refusal`] of this reason, and close.
    Refused(Reason),
}

enum ServerState {
    Hello,
    Proof { nc: Nonce },
    Done,
}

/// The server's side of one connection's authentication.
pub struct ServerAuth {
    listener: Arc<Listener>,
    ns: Nonce,
    state: ServerState,
}

impl ServerAuth {
    /// A connection just accepted by `listener`.
    pub fn new(listener: Arc<Listener>) -> Result<ServerAuth, AuthError> {
        Ok(ServerAuth {
            listener,
            ns: nonce()?,
            state: ServerState::Hello,
        })
    }

    /// Looks at the bytes received so far (`buf`, from the first byte not
    /// taken yet): how many it takes, and what to do.
    pub fn advance(&mut self, buf: &[u8]) -> (usize, ServerStep) {
        match self.state {
            ServerState::Hello => match cut(buf, HELLO, NONCE_BODY) {
                Cut::Short => (0, ServerStep::Wait(HEAD_LEN + NONCE_BODY)),
                Cut::Other => (0, ServerStep::Refused(Reason::NoAuthentication)),
                Cut::Whole(body) => match nonce_of(body) {
                    None => (0, ServerStep::Refused(Reason::Malformed)),
                    Some(nc) => {
                        self.state = ServerState::Proof { nc };
                        let challenge = frame(CHALLENGE, &[&[VERSION], &self.ns]);
                        (HEAD_LEN + NONCE_BODY, ServerStep::Send(challenge))
                    }
                },
            },
            ServerState::Proof { nc } => match cut(buf, PROOF, PROOF_BODY) {
                Cut::Short => (0, ServerStep::Wait(HEAD_LEN + PROOF_BODY)),
                Cut::Other => (0, ServerStep::Refused(Reason::Malformed)),
                Cut::Whole(body) => match self.check(&nc, body) {
                    Ok(accept) => {
                        self.state = ServerState::Done;
                        (HEAD_LEN + PROOF_BODY, ServerStep::Accepted(accept))
                    }
                    Err(reason) => (0, ServerStep::Refused(reason)),
                },
            },
            ServerState::Done => (0, ServerStep::Wait(0)),
        }
    }

    /// Checks a proof frame's body; our accept frame if it holds.
    fn check(&self, nc: &Nonce, body: &[u8]) -> Result<Vec<u8>, Reason> {
        let l = &*self.listener;
        let (t, macs) = body.split_at(TAG_LEN);
        let name = l
            .names
            .iter()
            .find(|(_, own)| own[..] == *t)
            .map(|(n, _)| n.as_str())
            .ok_or(Reason::WrongName)?;
        for m in macs.chunks_exact(MAC_LEN) {
            for key in l.keys.all() {
                let client = proof(key, l.port, FROM_CLIENT, name, nc, &self.ns);
                if client.verify_slice(m).is_ok() {
                    let ours = proof(key, l.port, FROM_SERVER, name, nc, &self.ns);
                    return Ok(frame(ACCEPT, &[&ours.finalize().into_bytes()]));
                }
            }
        }
        Err(Reason::WrongKey)
    }
}

/// What the client does next.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientStep {
    /// Wait for more bytes: the frame expected is at most this long.
    Wait(usize),
    /// Send these bytes (our proof), then go on.
    Send(Vec<u8>),
    /// The server proved itself: the connection is authenticated.
    Accepted,
}

enum ClientState {
    Challenge,
    Accept { ns: Nonce },
    Done,
}

/// The client's side of one connection's authentication.
pub struct ClientAuth {
    keys: Arc<Keys>,
    port: Port,
    name: String,
    nc: Nonce,
    state: ClientState,
}

impl ClientAuth {
    /// Starts authenticating to the listener of segment `name` on `port`:
    /// the client's side and the hello it sends first.
    pub fn start(
        keys: Arc<Keys>,
        port: Port,
        name: &str,
    ) -> Result<(ClientAuth, Vec<u8>), AuthError> {
        let nc = nonce()?;
        let hello = frame(HELLO, &[&[VERSION], &nc]);
        let me = ClientAuth {
            keys,
            port,
            name: name.to_string(),
            nc,
            state: ClientState::Challenge,
        };
        Ok((me, hello))
    }

    /// Looks at the bytes received so far (`buf`, from the first byte not
    /// taken yet): how many it takes, and what to do.
    pub fn advance(&mut self, buf: &[u8]) -> Result<(usize, ClientStep), AuthError> {
        // A refusal differs from the other frames at its first byte.
        match refused(buf) {
            Some(Some(reason)) => return Err(AuthError::Refused(reason)),
            Some(None) => return Ok((0, ClientStep::Wait(HEAD_LEN + NONCE_BODY))),
            None => {}
        }
        match self.state {
            ClientState::Challenge => match cut(buf, CHALLENGE, NONCE_BODY) {
                Cut::Short => Ok((0, ClientStep::Wait(HEAD_LEN + NONCE_BODY))),
                Cut::Other => Err(AuthError::Unexpected),
                Cut::Whole(body) => {
                    let ns = nonce_of(body).ok_or(AuthError::Unexpected)?;
                    self.state = ClientState::Accept { ns };
                    Ok((HEAD_LEN + NONCE_BODY, ClientStep::Send(self.proof(&ns))))
                }
            },
            ClientState::Accept { ns } => match cut(buf, ACCEPT, ACCEPT_BODY) {
                Cut::Short => Ok((0, ClientStep::Wait(HEAD_LEN + ACCEPT_BODY))),
                Cut::Other => Err(AuthError::Unexpected),
                Cut::Whole(body) => {
                    let holds = self.keys.all().iter().any(|k| {
                        proof(k, self.port, FROM_SERVER, &self.name, &self.nc, &ns)
                            .verify_slice(body)
                            .is_ok()
                    });
                    if !holds {
                        return Err(AuthError::Impostor);
                    }
                    self.state = ClientState::Done;
                    Ok((HEAD_LEN + ACCEPT_BODY, ClientStep::Accepted))
                }
            },
            ClientState::Done => Ok((0, ClientStep::Accepted)),
        }
    }

    /// Our proof frame for the server's nonce `ns`: one proof per key (the
    /// first again when there is one key).
    fn proof(&self, ns: &Nonce) -> Vec<u8> {
        let keys = self.keys.all();
        let mac = |k: &HmacSha256| {
            proof(k, self.port, FROM_CLIENT, &self.name, &self.nc, ns)
                .finalize()
                .into_bytes()
        };
        let first = mac(&keys[0]);
        let second = keys.get(1).map_or(first, mac);
        frame(PROOF, &[&tag(&self.name), &first, &second])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::wire::refusal;

    fn keys(k: &[&[u8]]) -> Arc<Keys> {
        Arc::new(Keys::new(&k.iter().map(|k| k.to_vec()).collect::<Vec<_>>()))
    }

    const A: &[u8] = &[1u8; 32];
    const B: &[u8] = &[2u8; 32];

    /// Runs a whole exchange between a client holding `client` keys that
    /// means `name` and a listener `server`; the client's error, or the
    /// server's refusal, or success.
    fn run(client: &[&[u8]], server: &[&[u8]], name: &str, port: Port) -> Result<(), String> {
        let l = Arc::new(Listener::new(keys(server), port, &["seg-a:15000"]));
        let mut s = ServerAuth::new(l).expect("server");
        let (mut c, hello) = ClientAuth::start(keys(client), port, name).expect("client");
        let (n, step) = s.advance(&hello);
        assert_eq!(n, hello.len());
        let ServerStep::Send(challenge) = step else {
            panic!("{step:?}")
        };
        let (n, step) = c.advance(&challenge).map_err(|e| e.to_string())?;
        assert_eq!(n, challenge.len());
        let ClientStep::Send(proof) = step else {
            panic!("{step:?}")
        };
        match s.advance(&proof) {
            (n, ServerStep::Accepted(accept)) => {
                assert_eq!(n, proof.len());
                let (_, step) = c.advance(&accept).map_err(|e| e.to_string())?;
                assert_eq!(step, ClientStep::Accepted);
                Ok(())
            }
            (_, ServerStep::Refused(r)) => {
                let e = c.advance(&refusal(r)).expect_err("refused");
                assert_eq!(e, AuthError::Refused(r));
                Err(r.to_string())
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn same_key_authenticates_both_ways() {
        assert_eq!(run(&[A], &[A], "seg-a:15000", Port::Data), Ok(()));
        assert_eq!(run(&[A], &[A], "seg-a:15000", Port::Handshake), Ok(()));
    }

    #[test]
    fn rotation_either_key_of_either_side() {
        // new,old with old; new,old with new; old,new with new,old.
        assert_eq!(run(&[B, A], &[A], "seg-a:15000", Port::Data), Ok(()));
        assert_eq!(run(&[A], &[B, A], "seg-a:15000", Port::Data), Ok(()));
        assert_eq!(run(&[B], &[B, A], "seg-a:15000", Port::Data), Ok(()));
        assert_eq!(run(&[B, A], &[B], "seg-a:15000", Port::Data), Ok(()));
        assert_eq!(run(&[A, B], &[B, A], "seg-a:15000", Port::Data), Ok(()));
        let e = run(&[A], &[B], "seg-a:15000", Port::Data).expect_err("old vs new");
        assert_eq!(e, Reason::WrongKey.to_string());
    }

    #[test]
    fn a_proof_for_another_name_is_refused() {
        let e = run(&[A], &[A], "seg-b:15000", Port::Data).expect_err("other name");
        assert_eq!(e, Reason::WrongName.to_string());
    }

    #[test]
    fn a_proof_is_bound_to_its_connection_port_and_direction() {
        let l = Arc::new(Listener::new(keys(&[A]), Port::Data, &["n"]));
        // A client's proof on one connection is refused on another.
        let mut s1 = ServerAuth::new(l.clone()).expect("s1");
        let (mut c1, hello) = ClientAuth::start(keys(&[A]), Port::Data, "n").expect("c1");
        let ServerStep::Send(ch) = s1.advance(&hello).1 else {
            panic!()
        };
        let ClientStep::Send(p1) = c1.advance(&ch).expect("c1").1 else {
            panic!()
        };
        let mut s2 = ServerAuth::new(l.clone()).expect("s2");
        assert!(matches!(s2.advance(&hello).1, ServerStep::Send(_)));
        assert_eq!(s2.advance(&p1).1, ServerStep::Refused(Reason::WrongKey));
        // A proof made for the handshake port is refused on the data port.
        let mut s3 = ServerAuth::new(l.clone()).expect("s3");
        let (mut c3, hello) = ClientAuth::start(keys(&[A]), Port::Handshake, "n").expect("c3");
        let ServerStep::Send(ch) = s3.advance(&hello).1 else {
            panic!()
        };
        let ClientStep::Send(p3) = c3.advance(&ch).expect("c3").1 else {
            panic!()
        };
        assert_eq!(s3.advance(&p3).1, ServerStep::Refused(Reason::WrongKey));
        // The server's proof reflected as a client's is refused.
        let mut s4 = ServerAuth::new(l).expect("s4");
        let (mut c4, hello) = ClientAuth::start(keys(&[A]), Port::Data, "n").expect("c4");
        let ServerStep::Send(ch) = s4.advance(&hello).1 else {
            panic!()
        };
        let ClientStep::Send(p4) = c4.advance(&ch).expect("c4").1 else {
            panic!()
        };
        let ServerStep::Accepted(accept) = s4.advance(&p4).1 else {
            panic!()
        };
        let mut reflected = p4.clone();
        reflected[HEAD_LEN + TAG_LEN..HEAD_LEN + TAG_LEN + MAC_LEN]
            .copy_from_slice(&accept[HEAD_LEN..]);
        reflected[HEAD_LEN + TAG_LEN + MAC_LEN..].copy_from_slice(&accept[HEAD_LEN..]);
        let l = Arc::new(Listener::new(keys(&[A]), Port::Data, &["n"]));
        let mut s5 = ServerAuth::new(l).expect("s5");
        s5.ns = s4.ns;
        assert!(matches!(s5.advance(&hello).1, ServerStep::Send(_)));
        assert_eq!(
            s5.advance(&reflected).1,
            ServerStep::Refused(Reason::WrongKey)
        );
    }

    #[test]
    fn an_impostor_server_is_caught_by_the_client() {
        let (mut c, _hello) = ClientAuth::start(keys(&[A]), Port::Data, "n").expect("c");
        let ch = frame(CHALLENGE, &[&[VERSION], &[5u8; NONCE_LEN]]);
        assert!(matches!(c.advance(&ch), Ok((_, ClientStep::Send(_)))));
        let fake = frame(ACCEPT, &[&[0u8; MAC_LEN]]);
        assert_eq!(c.advance(&fake), Err(AuthError::Impostor));
    }

    #[test]
    fn strangers_are_told_apart() {
        let l = Arc::new(Listener::new(keys(&[A]), Port::Handshake, &["n"]));
        let mut s = ServerAuth::new(l).expect("s");
        // A Mooncake Probe frame: refused at its first byte.
        let mut probe = 3u64.to_ne_bytes().to_vec();
        probe.extend_from_slice(&[3, b'{', b'}']);
        assert_eq!(
            s.advance(&probe[..1]).1,
            ServerStep::Refused(Reason::NoAuthentication)
        );
        // A client meeting a Mooncake server's reply.
        let (mut c, _) = ClientAuth::start(keys(&[A]), Port::Handshake, "n").expect("c");
        assert_eq!(c.advance(&probe), Err(AuthError::Unexpected));
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use crate::auth::wire::MAX_FRAME;
    use proptest::prelude::*;

    fn keys() -> Arc<Keys> {
        Arc::new(Keys::new(&[vec![7u8; 32]]))
    }

    /// Feeds `bytes` to a server in `chunks`, as a connection would
    /// receive them; checks every step and returns whether it accepted.
    fn feed_server(bytes: &[u8], chunks: &[usize]) -> bool {
        let l = Arc::new(Listener::new(keys(), Port::Data, &["n"]));
        let mut s = ServerAuth::new(l).expect("nonce");
        let mut buf: Vec<u8> = Vec::new();
        let mut at = 0;
        for &c in chunks.iter().chain(std::iter::once(&usize::MAX)) {
            let end = at + c.min(bytes.len() - at);
            buf.extend_from_slice(&bytes[at..end]);
            at = end;
            loop {
                let (taken, step) = s.advance(&buf);
                assert!(taken <= buf.len());
                buf.drain(..taken);
                match step {
                    ServerStep::Wait(n) => {
                        assert!(n <= MAX_FRAME);
                        break;
                    }
                    ServerStep::Send(out) => assert!(out.len() <= MAX_FRAME),
                    ServerStep::Accepted(_) => return true,
                    ServerStep::Refused(_) => return false,
                }
            }
            // Nothing a peer sends makes the server hold more than a frame.
            assert!(buf.len() <= MAX_FRAME, "{} bytes held", buf.len());
        }
        false
    }

    proptest! {
        #[test]
        fn random_bytes_never_pass_or_panic_the_server(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
            chunks in proptest::collection::vec(1usize..64, 0..16),
        ) {
            prop_assert!(!feed_server(&bytes, &chunks));
        }

        #[test]
        fn a_hello_then_random_proofs_never_pass(
            nonce in proptest::array::uniform32(any::<u8>()),
            proof in proptest::collection::vec(any::<u8>(), 0..200),
            chunks in proptest::collection::vec(1usize..64, 0..16),
        ) {
            let mut bytes = frame(HELLO, &[&[VERSION], &nonce]);
            bytes.extend_from_slice(&proof);
            prop_assert!(!feed_server(&bytes, &chunks));
        }

        #[test]
        fn random_answers_never_pass_or_panic_the_client(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
            valid_challenge in any::<bool>(),
        ) {
            let (mut c, _) = ClientAuth::start(keys(), Port::Data, "n").expect("nonce");
            let mut buf = if valid_challenge {
                frame(CHALLENGE, &[&[VERSION], &[1u8; NONCE_LEN]])
            } else {
                Vec::new()
            };
            buf.extend_from_slice(&bytes);
            loop {
                match c.advance(&buf) {
                    Ok((taken, ClientStep::Wait(n))) => {
                        prop_assert!(taken <= buf.len() && n <= MAX_FRAME);
                        break;
                    }
                    Ok((taken, ClientStep::Send(out))) => {
                        prop_assert!(out.len() <= MAX_FRAME);
                        buf.drain(..taken);
                    }
                    Ok((_, ClientStep::Accepted)) => prop_assert!(false, "accepted random bytes"),
                    Err(_) => break,
                }
            }
        }
    }
}
