//! The checked-in C header must equal what cbindgen generates from the code.
//! Run with `UPDATE_HEADER=1` to regenerate it.

use std::path::Path;

#[test]
fn header_is_fresh() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    // Only the C boundary goes into the header, not the crate's other
    // public constants.
    let bindings = cbindgen::Builder::new()
        .with_src(root.join("src/ffi/types.rs"))
        .with_src(root.join("src/ffi/mooncake.rs"))
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = root.join("include/transfer_engine_c.h");
    if std::env::var_os("UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write header");
        return;
    }
    let current = std::fs::read(&path).unwrap_or_default();
    assert!(
        current == generated,
        "include/transfer_engine_c.h is stale; regenerate it with `UPDATE_HEADER=1 cargo test --test header`"
    );
}
