//! Gives the shared library its SONAME so programs record
//! `libtransfer_engine.so` as their dependency.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtransfer_engine.so");
    println!("cargo:rerun-if-changed=build.rs");
}
