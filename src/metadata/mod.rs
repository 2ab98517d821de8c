//! Segment descriptors, metadata keys and the stores that hold them.

pub mod conn;
