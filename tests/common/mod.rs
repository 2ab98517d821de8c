//! Helpers shared by the integration tests (each test crate compiles its
//! own copy and uses a part of it).
#![allow(dead_code)]

pub mod servers;
