//! The checked-in C headers must equal what cbindgen generates from the
//! code: `transfer_engine_c.h` (Mooncake's API) and `transfer_engine_ext.h`
//! (our `te_*` functions). Run with `UPDATE_HEADER=1` to regenerate them.

use std::path::Path;

/// Generates `include/<header>` from `sources` with `config`, and compares
/// it with the checked-in file (or writes it with `UPDATE_HEADER`).
fn check(config: &str, sources: &[&str], header: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join(config)).expect("cbindgen config");
    let mut builder = cbindgen::Builder::new().with_config(config);
    for src in sources {
        builder = builder.with_src(root.join(src));
    }
    let bindings = builder.generate().expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = root.join("include").join(header);
    if std::env::var_os("UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write header");
        return;
    }
    let current = std::fs::read(&path).unwrap_or_default();
    assert!(
        current == generated,
        "include/{header} is stale; regenerate it with `UPDATE_HEADER=1 cargo test --test api header`"
    );
}

#[test]
fn header_is_fresh() {
    // Only the C boundary and its codes go into the header, not the
    // crate's other public constants.
    check(
        "cbindgen.toml",
        &["src/ffi/types.rs", "src/codes.rs", "src/ffi/mooncake.rs"],
        "transfer_engine_c.h",
    );
}

#[test]
fn ext_header_is_fresh() {
    check(
        "cbindgen_ext.toml",
        &["src/ffi/ext.rs"],
        "transfer_engine_ext.h",
    );
}
