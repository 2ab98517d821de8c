//! Transports move slices between memory. `local` serves the engine's own
//! segment with memory copies, whatever else is installed.

pub mod local;
pub mod tcp;
