//! Tests of the transport between two processes: the test binary runs
//! again as the peer ([`harness`]), with a registry and a transport of its
//! own, driven over its stdin and stdout.

#![allow(dead_code)]

mod bench;
mod buf;
pub(super) mod harness;
mod hostile_table;
mod late;
mod other_user;
mod peer_death;
mod transfers;
mod unregister;
mod wakeups;
