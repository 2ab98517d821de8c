//! `transfer_engine._native`: the Python extension module of
//! transfer-engine. It links the engine itself (no separate shared
//! library), exposes `TransferEngine` with the methods of Mooncake's
//! `mooncake.engine.TransferEngine`, and releases the GIL whenever a call
//! can block. The `transfer_engine` package re-exports it.

mod core;
mod engine;
mod errors;
mod local;
mod managed;
mod notify;
mod wait;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    transfer_engine::init_logging();
    core::count_forks();
    m.add_class::<engine::TransferEngine>()?;
    m.add_class::<notify::TransferNotify>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Mooncake's build flags: this engine has none of these transports.
    for flag in [
        "SUPPORT_CUDA",
        "SUPPORT_EFA",
        "SUPPORT_HIP",
        "SUPPORT_MNNVL",
        "SUPPORT_MUSA",
        "SUPPORT_INTRA_NVLINK",
    ] {
        m.add(flag, false)?;
    }
    Ok(())
}
