//! Peer authentication: only engines that hold the cluster key get in.
//!
//! With a key set (`MC_TE_AUTH_KEY_FILE`, or `MC_TE_AUTH_KEY` for tests),
//! every connection to the handshake port and to the TCP data port starts
//! with a mutual challenge–response before anything is served: the
//! connecting side (client) and the listening side (server) each send a
//! fresh random nonce, and each proves that it holds the key with an
//! HMAC-SHA256 over both nonces, the direction (client or server), the
//! port (handshake or data) and the listener's segment name. A proof is
//! thus good for one connection, one direction and one listener only: it
//! cannot be replayed on another connection, reflected back to its
//! sender, or relayed to another engine or port. The server proves itself
//! only after the client has, so a peer without the key learns nothing
//! beyond a nonce; and the client sends its request only after the server
//! has proved itself. Without a key nothing changes on the wire (Mooncake
//! peers keep working).
//!
//! * [`keys`]: where the keys come from ([`AuthConfig`]) and the loaded
//!   keys ([`Keys`]), up to two for rotation (proofs are made with both,
//!   either is accepted);
//! * [`wire`]: the authentication frames, all of fixed size;
//! * [`exchange`]: the two sides of the exchange as state machines over
//!   received bytes ([`ServerAuth`], [`ClientAuth`]), used by the
//!   handshake listener and client and by the TCP sessions and lanes;
//! * [`gate`]: one side of the exchange over a socket ([`Gate`]).

pub mod exchange;
pub mod gate;
pub mod keys;
pub mod wire;

pub use exchange::{AuthError, ClientAuth, Listener, Port, ServerAuth, ServerStep};
pub use gate::{Gate, Standing};
pub use keys::{AuthConfig, Keys};
