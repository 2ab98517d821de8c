//! `transfer-engine-metadata-server`: an HTTP metadata server compatible
//! with Mooncake's Go `http-metadata-server`, whose data survives restarts
//! when `--data FILE` is given.
//!
//! ```text
//! transfer-engine-metadata-server [--addr 127.0.0.1:8080] [--path /metadata] [--data FILE]
//!     [--max-body BYTES] [--max-connections N] [--timeout SECS] [--workers N]
//!     [--max-buffered BYTES] [--max-keys N] [--max-total-bytes BYTES]
//!     [--auth-token-file FILE[,FILE] [--auth-read]] [--tls-cert FILE --tls-key FILE]
//! ```
//!
//! Prints `listening on <url>` on stdout once ready; stops on SIGINT or
//! SIGTERM. Log level via `RUST_LOG` (default `info`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use transfer_engine::metadata::secret::read_token_file;
use transfer_engine::metadata::server::{MetadataServer, ServerOptions};

/// Set by the signal handler.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

const USAGE: &str = "\
usage: transfer-engine-metadata-server [--addr HOST:PORT] [--path /metadata] [--data FILE]
           [--max-body BYTES] [--max-connections N] [--timeout SECS] [--workers N]
           [--max-buffered BYTES] [--max-keys N] [--max-total-bytes BYTES]
           [--auth-token-file FILE[,FILE] [--auth-read]] [--tls-cert FILE --tls-key FILE]
  --addr             address to listen on (default 127.0.0.1:8080; 0.0.0.0:8080 for all
                     interfaces)
  --path             URL path of the metadata routes (default /metadata)
  --data             JSON file that keeps the data across restarts, with a log of the
                     latest changes in FILE.log (default: memory only)
  --max-body         largest PUT body in bytes; larger ones get 413, as do requests of
                     more than 1/8 + 80 KiB beyond it as sent (head, chunk framing)
                     (default 67108864)
  --max-connections  connections open at once; at the bound a new one closes the one
                     stalled longest (idle, incomplete, or not taking its reply) (default 1024)
  --timeout          seconds to receive a whole request (headers and body) and to send a
                     response; idle connections close after it (default 30)
  --workers          threads that answer complete requests (default 4)
  --max-buffered     bytes of requests and responses held across all connections, a value
                     sent to several clients counted once; at the bound the client stalled
                     longest is closed (default 268435456; at least one largest request)
  --max-keys         keys stored at once; a PUT of a new key beyond gets 507 (default 100000)
  --max-total-bytes  bytes of keys and values stored at once; a PUT growing the store
                     beyond gets 507 (default 1073741824)
  --auth-token-file  file holding a token of 16 to 4096 visible ASCII characters (e.g.
                     `openssl rand -hex 32`); PUT and DELETE then need the header
                     `Authorization: Bearer <token>`, else 401 (default: no token).
                     NEW,OLD: two files, either token accepted, while clients move
                     from OLD to NEW
  --auth-read        GET needs the token too (with --auth-token-file)
  --tls-cert         PEM certificate chain: serve HTTPS (with --tls-key; default: HTTP)
  --tls-key          PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1)";

struct Args {
    addr: String,
    path: String,
    data: Option<PathBuf>,
    /// `FILE[,FILE]`, read once logging is set up (it may warn).
    token_files: Option<String>,
    opts: ServerOptions,
}

/// A positive integer flag value.
fn number(flag: &str, value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag} needs a positive integer, not {value:?}")),
    }
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        addr: "127.0.0.1:8080".into(),
        path: "/metadata".into(),
        data: None,
        token_files: None,
        opts: ServerOptions::default(),
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
        if flag == "--auth-read" && inline.is_none() {
            args.opts.auth_read = true;
            continue;
        }
        const FLAGS: [&str; 13] = [
            "--addr",
            "--path",
            "--data",
            "--max-body",
            "--max-connections",
            "--timeout",
            "--workers",
            "--max-buffered",
            "--max-keys",
            "--max-total-bytes",
            "--auth-token-file",
            "--tls-cert",
            "--tls-key",
        ];
        if !FLAGS.contains(&flag.as_str()) {
            return Err(format!("unknown option {flag}"));
        }
        let value = match inline.or_else(|| it.next()) {
            Some(v) => v,
            None => return Err(format!("{flag} needs a value")),
        };
        match flag.as_str() {
            "--addr" => args.addr = value,
            "--path" => args.path = value,
            "--data" => args.data = Some(PathBuf::from(value)),
            "--max-body" => args.opts.max_body = number(&flag, &value)?,
            "--max-connections" => args.opts.max_connections = number(&flag, &value)?,
            "--timeout" => {
                args.opts.timeout = Duration::from_secs(number(&flag, &value)? as u64);
            }
            "--workers" => args.opts.workers = number(&flag, &value)?,
            "--max-buffered" => args.opts.max_buffered = number(&flag, &value)?,
            "--max-keys" => args.opts.max_keys = number(&flag, &value)?,
            "--auth-token-file" => {
                if value.split(',').count() > 2 {
                    return Err(format!(
                        "{flag} takes one file, or two (new,old) while replacing a token"
                    ));
                }
                args.token_files = Some(value);
            }
            "--tls-cert" => args.opts.tls_cert = Some(PathBuf::from(value)),
            "--tls-key" => args.opts.tls_key = Some(PathBuf::from(value)),
            _ => args.opts.max_total_bytes = number(&flag, &value)?,
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let mut args = match parse_args() {
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

    if let Some(files) = &args.token_files {
        for file in files.split(',') {
            match read_token_file(Path::new(file), "--auth-token-file") {
                Ok(token) => args.opts.auth_tokens.push(token),
                Err(msg) => {
                    tracing::error!("{msg}");
                    return ExitCode::from(2);
                }
            }
        }
    }

    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: `on_signal` only stores to an atomic, which is
        // async-signal-safe, and it lives for the whole program.
        if unsafe { libc::signal(sig, handler) } == libc::SIG_ERR {
            tracing::warn!(sig, "cannot install signal handler");
        }
    }

    let token_in_clear = !args.opts.auth_tokens.is_empty() && args.opts.tls_cert.is_none();
    let server =
        match MetadataServer::start_with(&args.addr, &args.path, args.data.clone(), args.opts) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the metadata server");
                return ExitCode::FAILURE;
            }
        };
    if token_in_clear {
        tracing::warn!(
            "--auth-token-file without --tls-cert: clients send the token in clear text; \
             serve HTTPS with --tls-cert and --tls-key"
        );
    }
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
