//! Integration tests of `transfer-engine-info`, the built binary: its
//! report as text and as JSON, a probe of a live engine of this process
//! over the P2P handshake, and probes of peers that cannot be reached.

mod probe;
mod report;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs the tool with `args` and the variables `env` (the test's own
/// environment otherwise): its output and how long it ran.
fn run(args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_transfer-engine-info"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let out = cmd.output().expect("run transfer-engine-info");
    (out, start.elapsed())
}

/// Its stdout and stderr as text.
fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
