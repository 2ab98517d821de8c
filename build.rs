//! Gives the shared library its versioned SONAME,
//! `libtransfer_engine.so.<major>`, so programs record that as their
//! dependency; the CMake build ships it as `libtransfer_engine.so.<version>`
//! with the `.so.<major>` and bare `.so` links.

fn main() {
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtransfer_engine.so.{major}");
    println!("cargo:rerun-if-changed=build.rs");
}
