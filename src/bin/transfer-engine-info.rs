//! `transfer-engine-info`: what the engine would do on this machine, and
//! why (as `ucx_info` and `ibv_devinfo` do for theirs): the build, the
//! devices and the priority matrix, the transports auto discovery
//! installs (and why the others are left out), every setting with its
//! source; with `--peer`, a probe of one peer. `docs/tools.md` has the
//! usage, sample output and the JSON schema.
//!
//! Exit status: 0; 1 when the engine cannot be created or the peer cannot
//! be probed (the reason on stderr); 2 for bad arguments or settings.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use transfer_engine::info::peer::{self, ProbeOptions};
use transfer_engine::info::{Report, text};
use transfer_engine::{Config, Engine};

/// What the transfer engine would do on this machine, and why.
#[derive(Parser, Debug)]
#[command(name = "transfer-engine-info", version)]
struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Probe this peer: open its segment (a P2P `host:port`, or a name in
    /// the store), say which transport reaches each of its buffers, time a
    /// 4 KiB and a 1 MiB READ.
    #[arg(long, value_name = "NAME")]
    peer: Option<String>,
    /// How the peer is found, as createTransferEngine's metadata_conn:
    /// `P2PHANDSHAKE`, `http://host:port/path`, `etcd://host:port`,
    /// `redis://host:port`.
    #[arg(
        long,
        value_name = "CONN",
        default_value = "P2PHANDSHAKE",
        requires = "peer"
    )]
    metadata: String,
    /// Also WRITE to the peer: its bytes are read, a pattern is written,
    /// read back and compared, and the bytes read first written back. It
    /// changes the peer's memory meanwhile: never against a peer in use.
    #[arg(long, requires = "peer")]
    write: bool,
    /// Seconds each network wait of the probe may take (the handshake's
    /// connect and reply, opening the segment, each transfer).
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    timeout: f64,
    /// The name of the engine this tool creates (default: the host name;
    /// with a store, `<host>-transfer-engine-info-<pid>`, so that no
    /// engine's entry is overwritten).
    #[arg(long, value_name = "NAME")]
    local_name: Option<String>,
}

/// This host's name, or `localhost`.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length; gethostname writes at most
    // that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..len]) {
        Ok(name) if rc == 0 && !name.is_empty() => name.to_string(),
        _ => "localhost".to_string(),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let timeout = match Duration::try_from_secs_f64(args.timeout) {
        Ok(t) if !t.is_zero() => t,
        _ => {
            eprintln!("transfer-engine-info: --timeout needs a positive number of seconds");
            return ExitCode::from(2);
        }
    };
    let lookup = |k: &str| std::env::var(k).ok();
    let config = match Config::from_lookup(lookup) {
        Ok(c) => c,
        Err(e) => {
            for p in e.problems() {
                eprintln!("transfer-engine-info: {p}");
            }
            return ExitCode::from(2);
        }
    };
    // The probe's engine waits for a peer's handshake at most the timeout
    // (the settings take whole seconds, at least 1).
    let mut engine_config = config.clone();
    if args.peer.is_some() {
        let secs = timeout.as_secs_f64().ceil().max(1.0) as u64;
        engine_config.rpc.connect_timeout_secs = secs;
        engine_config.rpc.io_timeout_secs = secs;
        engine_config.shm.timeout_secs = secs;
    }
    // Without a peer, nothing is looked up or published: P2P mode.
    let conn = match &args.peer {
        Some(_) => args.metadata.as_str(),
        None => "P2PHANDSHAKE",
    };
    let local_name = args.local_name.clone().unwrap_or_else(|| {
        if conn == "P2PHANDSHAKE" {
            host_name()
        } else {
            format!(
                "{}-transfer-engine-info-{}",
                host_name(),
                std::process::id()
            )
        }
    });
    let engine = match Engine::builder(conn, &local_name)
        .auto_discover(true)
        .config(engine_config)
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!(
                "transfer-engine-info: cannot create an engine ({conn}, {local_name:?}): {e}"
            );
            return ExitCode::FAILURE;
        }
    };
    let mut report = match Report::gather(&engine, &config, lookup) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("transfer-engine-info: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(name) = &args.peer {
        let opts = ProbeOptions {
            write: args.write,
            timeout,
        };
        match peer::probe(&engine, name, &opts) {
            Ok(p) => report.peer = Some(p),
            Err(why) => {
                eprintln!("transfer-engine-info: peer {name}: {why}");
                // Its entries leave the store; a handshake given up at the
                // deadline is cancelled (its thread ends with the process).
                engine.shutdown();
                return ExitCode::FAILURE;
            }
        }
    }
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("transfer-engine-info: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", text::render(&report));
    }
    ExitCode::SUCCESS
}
