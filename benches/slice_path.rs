//! The engine's own cost per slice: the real slice scheduler over a
//! carrier that completes each slice inline as it is posted (no I/O, no
//! completion thread), so what is timed is route lookup, rail choice, load
//! accounting, the task's slice counters and the completion path.
//!
//! `cargo bench --features bench-internals --bench slice_path` runs the
//! full measurement (see `scripts/bench-slices.sh`); `cargo test
//! --features bench-internals` (no `--bench` argument) or `--smoke` runs a
//! short check that every task completes, without a verdict on speed. The
//! feature builds the harness into the library; the shipped library lacks
//! it.
//!
//! Options: `--runs N` (5), `--seconds S` per run (1.0), `--nics N` (8:
//! N local and N peer devices, N² rails), `--batch N` (32 requests),
//! `--slices N` per request (16).

use std::time::Duration;
use transfer_engine::__bench::{SlicePathRun, slice_path};

struct Opts {
    smoke: bool,
    runs: usize,
    seconds: f64,
    nics: usize,
    batch: usize,
    slices: u64,
}

fn parse() -> Opts {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`; `cargo test` passes nothing.
    let bench = args.iter().any(|a| a == "--bench");
    let mut o = Opts {
        smoke: !bench || args.iter().any(|a| a == "--smoke"),
        runs: 5,
        seconds: 1.0,
        nics: 8,
        batch: 32,
        slices: 16,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .unwrap_or_else(|| panic!("{a} needs a value"))
                .clone()
        };
        match a.as_str() {
            "--runs" => o.runs = val().parse().expect("--runs N"),
            "--seconds" => o.seconds = val().parse().expect("--seconds S"),
            "--nics" => o.nics = val().parse().expect("--nics N"),
            "--batch" => o.batch = val().parse().expect("--batch N"),
            "--slices" => o.slices = val().parse().expect("--slices N"),
            _ => {}
        }
    }
    if o.smoke {
        o.runs = 1;
        o.seconds = 0.3;
    }
    o
}

fn rate(r: &SlicePathRun) -> f64 {
    r.slices as f64 / r.elapsed.as_secs_f64()
}

/// CPU nanoseconds per slice (over all threads).
fn cpu_ns(r: &SlicePathRun) -> f64 {
    r.cpu.as_nanos() as f64 / r.slices as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Medians of several runs: wall-clock slices/s, CPU ns per slice, and
/// the wall-clock rates of every run.
struct Figures {
    rate: f64,
    cpu_ns: f64,
    runs: Vec<f64>,
}

fn main() {
    let o = parse();
    let run = |threads| {
        let runs: Vec<SlicePathRun> = (0..o.runs)
            .map(|_| {
                let r = slice_path(
                    threads,
                    o.nics,
                    o.batch,
                    o.slices,
                    Duration::from_secs_f64(o.seconds),
                );
                assert!(r.slices > 0, "no slice completed");
                r
            })
            .collect();
        Figures {
            rate: median(runs.iter().map(rate).collect()),
            cpu_ns: median(runs.iter().map(cpu_ns).collect()),
            runs: runs.iter().map(rate).collect(),
        }
    };
    let one = run(1);
    let two = run(2);
    if o.smoke {
        println!(
            "slice_path smoke: {:.0} slices/s on 1 thread, {:.0} on 2 (not a measurement)",
            one.rate, two.rate
        );
        println!("test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
        return;
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "slice path: null carrier completing inline; {} local x {} peer NICs ({} rails), \
         batch {} x {} slices of 64 KiB; {} runs of {:.1} s; {} cores; loadavg {}",
        o.nics,
        o.nics,
        o.nics * o.nics,
        o.batch,
        o.slices,
        o.runs,
        o.seconds,
        cores,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{:.2}", x / 1e6))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "runs, M slices/s: 1 thread [{}]  2 threads [{}]",
        fmt(&one.runs),
        fmt(&two.runs)
    );
    println!();
    println!(
        "| threads | M slices/s (wall, median) | CPU ns/slice | M slices/s per busy thread (1e9 / CPU ns) | Gb/s one thread drives at 64 KiB | at 4 KiB |"
    );
    println!("|---|---|---|---|---|---|");
    for (t, f) in [(1usize, &one), (2, &two)] {
        let per_thread = 1e9 / f.cpu_ns;
        println!(
            "| {t} | {:.2} | {:.0} | {:.2} | {:.0} | {:.0} |",
            f.rate / 1e6,
            f.cpu_ns,
            per_thread / 1e6,
            per_thread * 65536.0 * 8.0 / 1e9,
            per_thread * 4096.0 * 8.0 / 1e9
        );
    }
    println!();
    println!(
        "2 threads / 1 thread: {:.2}x wall clock, {:.2}x from CPU time (2 x 1-thread CPU ns / 2-thread CPU ns; goal >= 1.8x)",
        two.rate / one.rate,
        2.0 * one.cpu_ns / two.cpu_ns
    );
    println!(
        "1 thread: {:.2} M slices/s wall clock (goal >= 2)",
        one.rate / 1e6
    );
    // 8 x 400 Gb/s = 3.2 Tb/s = 400 GB/s; in 64 KiB slices:
    let need = 8.0 * 400e9 / 8.0 / 65536.0;
    println!(
        "8x400G per host = {:.1} M slices/s of 64 KiB: {:.2} busy thread(s) at the 2-thread CPU cost per slice",
        need / 1e6,
        need * two.cpu_ns / 1e9
    );
}
