//! `transfer-engine-metadata-server`: an HTTP metadata server compatible
//! with Mooncake's Go `http-metadata-server`, whose data survives restarts
//! when `--data FILE` is given.
//!
//! ```text
//! transfer-engine-metadata-server [--addr 127.0.0.1:8080] [--path /metadata] [--data FILE]
//! ```
//!
//! Prints `listening on <url>` on stdout once ready; stops on SIGINT or
//! SIGTERM. Log level via `RUST_LOG` (default `info`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use transfer_engine::metadata::server::MetadataServer;

/// Set by the signal handler.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

const USAGE: &str =
    "usage: transfer-engine-metadata-server [--addr HOST:PORT] [--path /metadata] [--data FILE]
  --addr  address to listen on (default 127.0.0.1:8080; 0.0.0.0:8080 for all interfaces)
  --path  URL path of the metadata routes (default /metadata)
  --data  JSON file that keeps the data across restarts (default: memory only)";

struct Args {
    addr: String,
    path: String,
    data: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        addr: "127.0.0.1:8080".into(),
        path: "/metadata".into(),
        data: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
            None => (arg.clone(), None),
        };
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        if !matches!(flag.as_str(), "--addr" | "--path" | "--data") {
            return Err(format!("unknown option {flag}"));
        }
        let value = match inline.or_else(|| it.next()) {
            Some(v) => v,
            None => return Err(format!("{flag} needs a value")),
        };
        match flag.as_str() {
            "--addr" => args.addr = value,
            "--path" => args.path = value,
            _ => args.data = Some(PathBuf::from(value)),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) if msg.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("{msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();

    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: `on_signal` only stores to an atomic, which is
        // async-signal-safe, and it lives for the whole program.
        if unsafe { libc::signal(sig, handler) } == libc::SIG_ERR {
            tracing::warn!(sig, "cannot install signal handler");
        }
    }

    let server = match MetadataServer::start(&args.addr, &args.path, args.data.clone()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the metadata server");
            return ExitCode::FAILURE;
        }
    };
    match &args.data {
        Some(f) => tracing::info!(file = %f.display(), "data kept in file"),
        None => tracing::warn!("no --data file: data is lost when the server stops"),
    }
    let mut out = std::io::stdout();
    // A closed stdout does not stop the server.
    let _ = writeln!(out, "listening on {}", server.url()).and_then(|()| out.flush());

    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::info!("signal received, stopping");
    server.shutdown();
    ExitCode::SUCCESS
}
