//! The checked-in C headers must equal what cbindgen generates from the
//! code: `transfer_engine_c.h` (Mooncake's API) and `transfer_engine_ext.h`
//! (our `te_*` functions and the `TE_ERR_*` codes). Run with
//! `UPDATE_HEADER=1` to regenerate them.
//!
//! Each numeric macro is written parenthesised, `#define OPCODE_READ (0)`,
//! as Mooncake writes its own: a file that includes Mooncake's headers and
//! ours then sees identical redefinitions, which C and C++ accept.

use std::path::Path;

/// Generates `include/<header>` from `sources` with `config`, and compares
/// it with the checked-in file (or writes it with `UPDATE_HEADER`).
/// Returns the generated text.
fn check(config: &str, sources: &[&str], header: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join(config)).expect("cbindgen config");
    let mut builder = cbindgen::Builder::new().with_config(config);
    for src in sources {
        builder = builder.with_src(root.join(src));
    }
    let bindings = builder.generate().expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = parenthesize_numbers(&String::from_utf8(generated).expect("UTF-8 header"));
    let path = root.join("include").join(header);
    if std::env::var_os("UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write header");
        return generated;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == generated,
        "include/{header} is stale; regenerate it with `UPDATE_HEADER=1 cargo test --test api header`"
    );
    generated
}

/// `#define NAME 0` and `#define NAME -1` become `#define NAME (0)` and
/// `#define NAME (-1)`, Mooncake's spelling; other lines are kept as they
/// are (`#define INVALID_BATCH UINT64_MAX`, the include guard).
fn parenthesize_numbers(header: &str) -> String {
    let mut out = String::with_capacity(header.len() + 64);
    for line in header.split_inclusive('\n') {
        let body = line.trim_end_matches('\n');
        let number = body.strip_prefix("#define ").and_then(|rest| {
            let (name, value) = rest.split_once(' ')?;
            let digits = value.strip_prefix('-').unwrap_or(value);
            let numeric = digits.starts_with(|c: char| c.is_ascii_digit())
                && digits.chars().all(|c| c.is_ascii_alphanumeric());
            numeric.then_some((name, value))
        });
        match number {
            Some((name, value)) => {
                out.push_str(&format!("#define {name} ({value})"));
                out.push_str(&line[body.len()..]);
            }
            None => out.push_str(line),
        }
    }
    out
}

/// The names `header` `#define`s, in order.
fn macros(header: &str) -> Vec<&str> {
    header
        .lines()
        .filter_map(|l| l.strip_prefix("#define "))
        .map(|rest| rest.split_whitespace().next().unwrap_or(rest))
        .collect()
}

/// The `#define` lines of `header` whose value is a number, not in parentheses.
fn bare_numbers(header: &str) -> Vec<&str> {
    header
        .lines()
        .filter(|l| {
            l.strip_prefix("#define ")
                .and_then(|rest| rest.split_whitespace().nth(1))
                .is_some_and(|v| {
                    v.trim_start_matches('-')
                        .starts_with(|c: char| c.is_ascii_digit())
                })
        })
        .collect()
}

#[test]
fn header_is_fresh() {
    // Only the C boundary and the task statuses go into the header, not
    // the crate's other public constants (the ERR_* codes go to the
    // extension header; cbindgen.toml excludes them here).
    let header = check(
        "cbindgen.toml",
        &["src/ffi/types.rs", "src/codes.rs", "src/ffi/mooncake.rs"],
        "transfer_engine_c.h",
    );
    // Mooncake's transfer_engine_c.h defines these macros and no others
    // (its ERR_* are in its error.h); each numeric one is written as
    // Mooncake writes it, in parentheses.
    let mooncake = [
        "TRANSFER_ENGINE_C",
        "segment_handle_t",
        "segment_id_t",
        "batch_id_t",
        "LOCAL_SEGMENT",
        "INVALID_BATCH",
        "OPCODE_READ",
        "OPCODE_WRITE",
        "STATUS_WAITING",
        "STATUS_PENDING",
        "STATUS_INVALID",
        "STATUS_CANCELED",
        "STATUS_COMPLETED",
        "STATUS_TIMEOUT",
        "STATUS_FAILED",
    ];
    let defined = macros(&header);
    let extra: Vec<_> = defined.iter().filter(|m| !mooncake.contains(m)).collect();
    assert!(
        extra.is_empty(),
        "transfer_engine_c.h defines names Mooncake's does not: {extra:?}"
    );
    let missing: Vec<_> = mooncake.iter().filter(|m| !defined.contains(m)).collect();
    assert!(
        missing.is_empty(),
        "transfer_engine_c.h lacks Mooncake's {missing:?}"
    );
    assert!(
        !header.contains("ERR_"),
        "transfer_engine_c.h names an ERR_* code"
    );
    assert_eq!(
        bare_numbers(&header),
        Vec::<&str>::new(),
        "unparenthesised numbers"
    );
    for (name, value) in [
        ("LOCAL_SEGMENT", "(0)"),
        ("OPCODE_WRITE", "(1)"),
        ("STATUS_FAILED", "(6)"),
    ] {
        assert!(
            header.contains(&format!("\n#define {name} {value}\n")),
            "{name} {value}"
        );
    }
    assert!(header.contains("\n#define INVALID_BATCH UINT64_MAX\n"));
}

#[test]
fn ext_header_is_fresh() {
    let header = check(
        "cbindgen_ext.toml",
        &["src/ffi/ext.rs", "src/codes.rs"],
        "transfer_engine_ext.h",
    );
    // Every macro but the include guard is ours, prefixed TE_: a code added
    // to src/codes.rs without a rename in cbindgen_ext.toml fails here.
    let defined = macros(&header);
    let unprefixed: Vec<_> = defined
        .iter()
        .filter(|m| **m != "TRANSFER_ENGINE_EXT" && !m.starts_with("TE_"))
        .collect();
    assert!(
        unprefixed.is_empty(),
        "transfer_engine_ext.h defines {unprefixed:?}"
    );
    assert_eq!(
        bare_numbers(&header),
        Vec::<&str>::new(),
        "unparenthesised numbers"
    );
    // Every ERR_* of src/codes.rs, with Mooncake's value.
    let codes = [
        ("INVALID_ARGUMENT", -1),
        ("TOO_MANY_REQUESTS", -2),
        ("ADDRESS_NOT_REGISTERED", -3),
        ("BATCH_BUSY", -4),
        ("DEVICE_NOT_FOUND", -6),
        ("ADDRESS_OVERLAPPED", -7),
        ("DNS", -101),
        ("SOCKET", -102),
        ("MALFORMED_JSON", -103),
        ("REJECT_HANDSHAKE", -104),
        ("METADATA", -200),
        ("ENDPOINT", -201),
        ("CONTEXT", -202),
        ("NUMA", -300),
        ("CLOCK", -301),
        ("MEMORY", -302),
        ("NOT_IMPLEMENTED", -303),
    ];
    for (name, value) in codes {
        let line = format!("\n#define TE_ERR_{name} ({value})\n");
        assert!(
            header.contains(&line),
            "transfer_engine_ext.h lacks {line:?}"
        );
    }
    let count = defined.iter().filter(|m| m.starts_with("TE_ERR_")).count();
    assert_eq!(count, codes.len(), "TE_ERR_* codes");
}

#[test]
fn parenthesize_numbers_rewrites_only_numbers() {
    let text = "#ifndef G\n#define G\n#define A 0\n#define B -303\n#define C UINT64_MAX\n\
                #define D (1)\n#define E 0x10u\n * #define F 1\n";
    assert_eq!(
        parenthesize_numbers(text),
        "#ifndef G\n#define G\n#define A (0)\n#define B (-303)\n#define C UINT64_MAX\n\
         #define D (1)\n#define E (0x10u)\n * #define F 1\n"
    );
}
