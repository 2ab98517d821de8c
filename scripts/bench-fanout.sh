#!/usr/bin/env bash
# bench-fanout.sh: one initiator spreading small requests over many target
# processes on this host, over TCP and over shared memory, beside memcpy
# measured in the same run.
#
#   scripts/bench-fanout.sh [--runs N] [--duration S] [--peers "1 4 16 64"]
#                           [--threads "1 2 4"] [--block BYTES] [--batch N]
#                           [--op write|read] [--protocols "tcp tcp,shm"]
#
# Builds release with CMake (build/, or $BUILD_DIR). For each protocol
# (tcp; tcp,shm, where shared memory carries the data) and each peer count
# it starts that many transfer_bench targets on 127.0.0.1 (P2PHANDSHAKE,
# caller memory), and runs the initiator with --targets_file, so that each
# batch is spread over every target, with each of --threads initiator
# threads (each thread its own batches); then, at one peer and one thread,
# batches of one request (latency). Each run is repeated --runs times, interleaved
# with memcpy of the same block size (local_bench, one thread) and with the
# wakeup floor at that peer count (wakeup_bench: one poster, N sleeping
# processes, one eventfd wakeup per request, the most any transport that
# wakes its target can serve). The table
# shows, per protocol, peer count and thread count, the median and the worst run of
# requests/s, the median p50 and p99 request latency, and the initiator's
# memory and descriptors; then the ratios the goals are stated in:
# requests/s at the largest peer count over one peer, shm over TCP, and
# each protocol over the wakeup floor.
#
# Defaults: 3 runs of 3 s, peers 1 4 16 64, one initiator thread, 4 KiB
# WRITEs in batches of 64.
# A benchmark, not a test: its verdict is the table, not the exit code
# (non-zero only when something failed to run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=3
duration=3
peers="1 4 16 64"
threads_list=1
block=4096
batch=64
op=write
protocols="tcp tcp,shm"
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --peers) peers=$2; shift 2 ;;
    --threads) threads_list=$2; shift 2 ;;
    --block) block=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --op) op=$2; shift 2 ;;
    --protocols) protocols=$2; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "bench-fanout.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v python3 >/dev/null || { echo "python3 is required" >&2; exit 1; }

build=${BUILD_DIR:-"$root/build"}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target transfer_bench local_bench wakeup_bench >/dev/null
bench=$build/transfer_bench

tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-bench-fanout.XXXXXX")
pids=()
stop_targets() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  pids=()
}
cleanup() {
  local rc=$?
  set +e
  stop_targets
  [ "$rc" -ne 0 ] && for f in "$tmp"/*.err; do
    [ -s "$f" ] && { echo "----- $(basename "$f")"; tail -n 20 "$f"; }
  done >&2
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Starts N targets speaking PROTOCOL; writes their lines to $tmp/targets.
start_targets() {
  local n=$1 protocol=$2 k i
  : >"$tmp/targets"
  for k in $(seq "$n"); do
    "$bench" --mode target --protocol "$protocol" --metadata_server P2PHANDSHAKE \
      --local_server_name 127.0.0.1 --buffer_size $((4 << 20)) \
      >"$tmp/target-$k.out" 2>"$tmp/target-$k.err" &
    pids+=($!)
  done
  for k in $(seq "$n"); do
    for i in $(seq 600); do
      grep -q '^segment ' "$tmp/target-$k.out" 2>/dev/null && break
      kill -0 "${pids[$((k - 1))]}" 2>/dev/null || { echo "target $k exited" >&2; return 1; }
      sleep 0.1
    done
    grep -m1 '^segment ' "$tmp/target-$k.out" >>"$tmp/targets" ||
      { echo "target $k printed no segment line" >&2; return 1; }
  done
}

# run PROTOCOL BATCH THREADS -> "req/s p50_us p99_us rss_mib fds"
run() {
  local protocol=$1 b=$2 t=$3 out="$tmp/initiator.out"
  if ! timeout -k 5 $((duration + 120)) "$bench" --mode initiator --protocol "$protocol" \
    --metadata_server P2PHANDSHAKE --local_server_name 127.0.0.1 --targets_file "$tmp/targets" \
    --operation "$op" --block_size "$block" --batch_size "$b" --threads "$t" \
    --duration "$duration" --buffer_size $((4 << 20)) >"$out" 2>"$tmp/initiator.err"; then
    echo "initiator ($protocol, batch $b, $t threads) failed:" >&2
    tail -n 20 "$out" "$tmp/initiator.err" >&2
    return 1
  fi
  python3 - "$out" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
r = re.search(r"requests: ([0-9.]+)/s, latency p50 ([0-9.]+) us, p99 ([0-9.]+) us", t)
f = re.search(r"initiator: rss ([0-9.]+) MiB \(peak [0-9.]+ MiB\), fds ([0-9]+)", t)
print(r.group(1), r.group(2), r.group(3), f.group(1), f.group(2))
EOF
}

memcpy() {
  "$build/local_bench" --duration 1 --runs 1 --threads 1 --blocks $((block / 1024)) \
    2>"$tmp/local.err" | python3 -c 'import re,sys; print(re.search(r"memcpy=([0-9.]+) GB/s", sys.stdin.read()).group(1))'
}

# wakeup floor at N processes -> requests/s
floor() {
  "$build/wakeup_bench" --processes "$1" --duration 1 --block "$block" |
    python3 -c 'import re,sys; print(re.search(r"requests=([0-9.]+)/s", sys.stdin.read()).group(1))'
}

results=$tmp/results
: >"$results"
echo "# one host ($(nproc) CPUs), $runs runs x ${duration} s; ${op^^} of $block B, batch $batch, initiator threads: $threads_list"
for protocol in $protocols; do
  for n in $peers; do
    start_targets "$n" "$protocol"
    for r in $(seq "$runs"); do
      echo "$r memcpy $n 1 $(memcpy) 0 0 0 0" >>"$results"
      echo "$r floor $n 1 $(floor "$n") 0 0 0 0" >>"$results"
      for t in $threads_list; do
        v=$(run "$protocol" "$batch" "$t")
        echo "$r $protocol $n $t $v" >>"$results"
        echo "run $r: $protocol, $n peer(s), $t thread(s): $v (req/s p50_us p99_us rss_MiB fds)"
      done
      if [ "$n" = 1 ]; then
        v=$(run "$protocol" 1 1)
        echo "$r $protocol-batch1 $n 1 $v" >>"$results"
        echo "run $r: $protocol, batch 1: $v"
      fi
    done
    stop_targets
  done
done

python3 - "$results" "$block" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    _, who, n, t, *v = line.split()
    rows.setdefault((who, int(n), int(t)), []).append([float(x) for x in v])
# Keyed by (who, peers, threads); the peer-count ratios below are at one thread.
med = lambda k, i: statistics.median(v[i] for v in rows[k])
worst = lambda k: min(v[0] for v in rows[k])
peers = sorted({n for (_, n, _) in rows})
threads = sorted({t for (w, _, t) in rows if w in ("tcp", "tcp,shm")})
print()
print("%-8s %5s %7s %11s %11s %8s %8s %8s %5s" % ("protocol", "peers", "threads", "req/s", "worst run",
      "p50 us", "p99 us", "rss MiB", "fds"))
for who, name in (("tcp", "tcp"), ("tcp,shm", "shm")):
    for n in peers:
        for t in threads:
            k = (who, n, t)
            if k in rows:
                print("%-8s %5d %7d %11.0f %11.0f %8.1f %8.1f %8.1f %5.0f" % (name, n, t, med(k, 0), worst(k),
                      med(k, 1), med(k, 2), med(k, 3), med(k, 4)))
    k = (who + "-batch1", 1, 1)
    if k in rows:
        print("%-8s %5s %7s %11.0f %11.0f %8.1f %8.1f   (batches of 1 request)" % (name, "1", "1", med(k, 0),
              worst(k), med(k, 1), med(k, 2)))
m = statistics.median(v[0] for (w, _, _), vs in rows.items() if w == "memcpy" for v in vs)
print("memcpy of %s B blocks, one thread: %.2f GB/s (%.0f copies/s)" % (sys.argv[2], m, m * 1e9 / int(sys.argv[2])))
for n in peers:
    if ("floor", n, 1) in rows:
        print("wakeup floor, %d process(es): %.0f requests/s (median), each request woken by an eventfd" % (n, med(("floor", n, 1), 0)))
lo, hi = peers[0], peers[-1]
for who, name in (("tcp", "tcp"), ("tcp,shm", "shm")):
    if (who, lo, 1) in rows and (who, hi, 1) in rows:
        print("%s: %d peers / %d peer(s): %.2f (median), %.2f (worst runs)" % (name, hi, lo,
              med((who, hi, 1), 0) / med((who, lo, 1), 0), worst((who, hi, 1)) / worst((who, lo, 1))))
    for n in peers:
        if len(threads) > 1 and (who, n, threads[0]) in rows and (who, n, threads[-1]) in rows:
            print("%s, %d peer(s): %d threads / %d: %.2f (median)" % (name, n, threads[-1], threads[0],
                  med((who, n, threads[-1]), 0) / med((who, n, threads[0]), 0)))
for n in peers:
    if ("tcp", n, 1) in rows and ("tcp,shm", n, 1) in rows:
        print("shm / tcp at %d peer(s): %.2f" % (n, med(("tcp,shm", n, 1), 0) / med(("tcp", n, 1), 0)))
for who, name in (("tcp", "tcp"), ("tcp,shm", "shm")):
    ratios = ["%d: %.2f" % (n, med((who, n, 1), 0) / med(("floor", n, 1), 0)) for n in peers
              if (who, n, 1) in rows and ("floor", n, 1) in rows]
    if ratios:
        print("%s / wakeup floor at each peer count (one thread): %s" % (name, ", ".join(ratios)))
EOF
