#!/usr/bin/env bash
# bench-tcp.sh: TCP transfers between two processes on loopback, beside
# iperf3 on the same path in the same run.
#
#   scripts/bench-tcp.sh [--quick] [--runs N] [--duration S] [--streams N] [--auth]
#                        [--wait_batch] [--working_set BYTES]
#
# Builds release with CMake (build/, or $BUILD_DIR), starts <streams>
# iperf3 servers and a transfer_bench target (P2PHANDSHAKE, 127.0.0.1),
# then for each run: iperf3 -P <streams> and -P 1 (-J, received bits/s);
# <streams> iperf3 clients at once, one stream each, to their own
# servers, summed ("iperf3 xN": iperf3 before 3.16, Debian 12's 3.12
# among them, runs all the streams of one -P in one thread per side, so
# -P N is held to one core each side, and N processes are not);
# sock_bench with <streams> streams of 1 MiB and of 64 KiB blocks, each
# side of each stream cycling through its share of the engine's working
# set ("sockets xN": plain loopback sockets in two processes, iperf3's
# path with the engine's memory traffic and nothing of ours in it); and
# transfer_bench initiators with --threads <streams> (the engine opens 4
# lanes = connections per peer by default, MC_TCP_LANES_PER_PEER) for
# READ and WRITE of 1 MiB, 64 KiB and 4 KiB blocks, batch 128. Runs are
# interleaved so every case sees the same machine state; the table shows
# medians: ours GB/s, iperf3 GB/s with the same stream count, the ratio,
# requests/s, the ratio of every run to its iperf3 -P N; then iperf3 xN
# and the ratios to it; then sockets xN at the same block size and
# working set and the ratios to it. GB = 1e9 bytes.
#
# --wait_batch: the initiators wait for each batch with te_wait_batch
# (transfer_bench --wait_batch: it polls for the first millisecond, then
# parks until a task ends, as the Python package's calls wait) instead of
# polling each task and yielding, which leaves the cores to the engine's
# threads.
#
# --working_set BYTES: the initiators' request offsets wrap within BYTES
# on both sides (transfer_bench --target_size; at least 1 MiB) instead of
# the target's 1 GiB buffer: 4194304 gives each of 4 threads one 1 MiB
# block, a working set that stays in the caches as iperf3's own 128 KiB
# buffer does, where the default (batch x block x threads: 512 MiB at
# 1 MiB) is copied from and to memory, as KV caches are.
#
# --auth: a second target with a cluster key (MC_TE_AUTH_KEY_FILE, a
# fresh random key in the temporary directory), and every case runs
# against both targets in the same run, initiators with the same key for
# the keyed one: the table adds "auth GB/s", "auth requests/s" and their
# ratios to the figures without a key; then the handshake latency
# (transfer_bench --handshakes: descriptor fetches, one connection each)
# without and with the key.
#
# Defaults: 3 runs of 4 s (about 3-4 minutes). --quick: 3 runs of 2 s (about 2 minutes).
# A benchmark, not a test: its verdict is the table, not the exit code
# (which is non-zero only when something failed to run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=3
duration=4
streams=4
auth=0
wait_flags=()
working_set=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) duration=2; shift ;;
    --runs) runs=$2; shift 2 ;;
    --runs=*) runs=${1#*=}; shift ;;
    --duration) duration=$2; shift 2 ;;
    --duration=*) duration=${1#*=}; shift ;;
    --streams) streams=$2; shift 2 ;;
    --streams=*) streams=${1#*=}; shift ;;
    --auth) auth=1; shift ;;
    --wait_batch) wait_flags=(--wait_batch); shift ;;
    --working_set) working_set=$2; shift 2 ;;
    --working_set=*) working_set=${1#*=}; shift ;;
    -h|--help) sed -n '2,51p' "$0"; exit 0 ;;
    *) echo "bench-tcp.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -n "$working_set" ] && ! [[ "$working_set" =~ ^[0-9]+$ && "$working_set" -ge 1048576 ]]; then
  echo "bench-tcp.sh: --working_set needs a number of bytes of at least 1048576, not '$working_set'" >&2
  exit 2
fi
command -v iperf3 >/dev/null || { echo "iperf3 is required (scripts/setup.sh installs it)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 is required" >&2; exit 1; }

build=${BUILD_DIR:-"$root/build"}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target transfer_bench sock_bench >/dev/null
bench=$build/transfer_bench

tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-bench-tcp.XXXXXX")
pids=()
cleanup() {
  local rc=$?
  set +e
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  if [ "$rc" -ne 0 ]; then
    for f in "$tmp"/*.err; do [ -s "$f" ] && { echo "----- $(basename "$f")"; tail -n 20 "$f"; }; done >&2
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Waits up to $3 s for a line matching $2 in file $1 while pid $4 lives.
wait_line() {
  local i
  for i in $(seq $(($3 * 10))); do
    grep -m1 -E "$2" "$1" 2>/dev/null && return 0
    kill -0 "$4" 2>/dev/null || { echo "process $4 exited early" >&2; return 1; }
    sleep 0.1
  done
  echo "no line matching '$2' in $1 after $3 s" >&2
  return 1
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# iperf3 server on a free port (retried: the port could be taken between
# the probe and the bind).
start_iperf() { # start_iperf INDEX: one more iperf3 server, its port in iperf_ports
  local port ipid
  for _ in 1 2 3 4 5; do
    port=$(free_port)
    iperf3 -s -B 127.0.0.1 -p "$port" --forceflush >"$tmp/iperf3-server$1.out" 2>"$tmp/iperf3-server$1.err" &
    ipid=$!
    if wait_line "$tmp/iperf3-server$1.out" 'Server listening' 10 "$ipid" >/dev/null 2>&1; then
      pids+=("$ipid")
      iperf_ports+=("$port")
      return 0
    fi
    kill "$ipid" 2>/dev/null || true
    wait "$ipid" 2>/dev/null || true
  done
  echo "could not start iperf3 -s" >&2
  return 1
}
iperf_ports=()
for i in $(seq "$streams"); do start_iperf "$i"; done
iperf_port=${iperf_ports[0]}

# Targets: 0 without a key, 1 (--auth) with one; their segment, base and size.
seg_of=() base_of=() size_of=()
start_target() { # start_target INDEX [VAR=VALUE...]
  local i=$1
  shift
  env "$@" "$bench" --mode target --protocol tcp --metadata_server P2PHANDSHAKE --local_server_name 127.0.0.1 \
    --buffer_size $((1 << 30)) >"$tmp/target$i.out" 2>"$tmp/target$i.err" &
  local tpid=$!
  pids+=("$tpid")
  local line
  line=$(wait_line "$tmp/target$i.out" '^segment ' 60 "$tpid") || return 1
  read -r _ "seg_of[$i]" _ "base_of[$i]" _ "size_of[$i]" <<<"$line"
}
# The engines without a key ignore whatever the caller set.
unset MC_TE_AUTH_KEY_FILE MC_TE_AUTH_KEY
start_target 0
seg=${seg_of[0]}
key=""
if [ "$auth" = 1 ]; then
  key=$tmp/cluster.key
  (umask 077; python3 -c 'import os; print(os.urandom(32).hex())' >"$key")
  start_target 1 MC_TE_AUTH_KEY_FILE="$key"
fi

iperf() { # iperf() STREAMS -> GB/s received
  local out="$tmp/iperf3-client.json"
  timeout -k 5 $((duration + 30)) iperf3 -c 127.0.0.1 -p "$iperf_port" -P "$1" -t "$duration" -J >"$out" 2>"$tmp/iperf3-client.err"
  python3 -c 'import json,sys; print("%.4f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 8e9))' "$out"
}

iperf_apart() { # iperf_apart -> GB/s received by one single-stream client per server, at once
  local i cpids=()
  for i in "${!iperf_ports[@]}"; do
    timeout -k 5 $((duration + 30)) iperf3 -c 127.0.0.1 -p "${iperf_ports[$i]}" -P 1 -t "$duration" -J \
      >"$tmp/iperf3-apart$i.json" 2>"$tmp/iperf3-apart$i.err" &
    cpids+=($!)
  done
  for i in "${cpids[@]}"; do wait "$i"; done
  python3 -c 'import json,sys; print("%.4f" % (sum(json.load(open(f))["end"]["sum_received"]["bits_per_second"] for f in sys.argv[1:]) / 8e9))' \
    "$tmp"/iperf3-apart*.json
}

sockets() { # sockets BLOCK -> GB/s of sock_bench at the engine's working set for BLOCK
  # transfer_bench's requests wrap within min(block x batch x threads, the
  # target's size); each stream gets its share, whole blocks.
  local region=$(($1 * 128 * streams)) target=${working_set:-${size_of[0]}} per
  [ "$target" -lt "$region" ] && region=$target
  per=$((region / streams / $1 * $1))
  [ "$per" -lt "$1" ] && per=$1
  timeout -k 5 $((duration + 60)) "$build/sock_bench" --streams "$streams" --block "$1" \
    --working_set "$per" --duration "$duration" 2>"$tmp/sock_bench.err" |
    awk '{for (i = 1; i < NF; i++) if ($(i + 1) == "GB/s") print $i}'
}

ours() { # ours OP BLOCK [TARGET] -> "GB/s req/s" (TARGET 1: the keyed one)
  local out="$tmp/initiator.out" t=${3:-0} env=()
  if [ "$t" = 1 ]; then env=(MC_TE_AUTH_KEY_FILE="$key"); fi
  if ! env "${env[@]}" timeout -k 5 $((duration + 60)) "$bench" --mode initiator --protocol tcp --metadata_server P2PHANDSHAKE \
    --local_server_name 127.0.0.1 --segment_id "${seg_of[$t]}" --target_base "${base_of[$t]}" --target_size "${working_set:-${size_of[$t]}}" \
    --operation "$1" --block_size "$2" --batch_size 128 --threads "$streams" --duration "$duration" \
    --buffer_size $((2 << 20)) --report_unit GB --report_precision 4 "${wait_flags[@]}" >"$out" 2>"$tmp/initiator.err"; then
    echo "transfer_bench initiator $1 block $2 failed:" >&2
    cat "$out" >&2
    return 1
  fi
  # Test completed: duration D, batch count N, throughput R GB/s
  python3 - "$out" "$2" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"Test completed: duration ([0-9.]+), batch count ([0-9]+), throughput ([0-9.]+) GB/s", text)
d, n, r = float(m.group(1)), int(m.group(2)), float(m.group(3))
print("%.4f %.0f" % (r, n * 128 / d))
EOF
}

cases=("write 1048576 1MiB" "read 1048576 1MiB" "write 65536 64KiB" "read 65536 64KiB" "write 4096 4KiB" "read 4096 4KiB")
results=$tmp/results
: >"$results"
echo "# loopback, $runs runs x ${duration} s, $streams streams/threads, batch 128${wait_flags:+, ${wait_flags[*]}}${working_set:+, working set $working_set bytes}; target $seg"
for r in $(seq "$runs"); do
  v=$(iperf "$streams")
  echo "$r iperf3 P$streams $v 0" >>"$results"
  echo "run $r: iperf3 -P $streams: $v GB/s"
  if [ "$streams" -ne 1 ]; then
    v=$(iperf 1)
    echo "$r iperf3 P1 $v 0" >>"$results"
    echo "run $r: iperf3 -P 1: $v GB/s"
    v=$(iperf_apart)
    echo "$r iperf3 X$streams $v 0" >>"$results"
    echo "run $r: iperf3 x$streams: $v GB/s"
  fi
  for b in "1048576 1MiB" "65536 64KiB"; do
    read -r block label <<<"$b"
    v=$(sockets "$block")
    [ -n "$v" ] || { echo "sock_bench failed:" >&2; cat "$tmp/sock_bench.err" >&2; exit 1; }
    echo "$r sockets $label $v 0" >>"$results"
    echo "run $r: sockets x$streams $label: $v GB/s"
  done
  for c in "${cases[@]}"; do
    read -r op block label <<<"$c"
    v=$(ours "$op" "$block")
    echo "$r ${op^^} $label $v" >>"$results"
    echo "run $r: ${op^^} $label: $v (GB/s req/s)"
    if [ "$auth" = 1 ]; then
      v=$(ours "$op" "$block" 1)
      echo "$r AUTH-${op^^} $label $v" >>"$results"
      echo "run $r: ${op^^} $label with a key: $v (GB/s req/s)"
    fi
  done
done

handshakes() { # handshakes TARGET -> "median_us p90_us"
  local t=$1 env=()
  if [ "$t" = 1 ]; then env=(MC_TE_AUTH_KEY_FILE="$key"); fi
  env "${env[@]}" timeout -k 5 120 "$bench" --mode initiator --protocol tcp --metadata_server P2PHANDSHAKE \
    --local_server_name 127.0.0.1 --segment_id "${seg_of[$t]}" --buffer_size $((1 << 20)) \
    --handshakes 500 2>"$tmp/handshakes.err" | awk '/^handshakes/ {print $4, $6}'
}
if [ "$auth" = 1 ]; then
  for r in $(seq "$runs"); do
    read -r m p < <(handshakes 0)
    read -r am ap < <(handshakes 1)
    echo "run $r: handshake latency without a key: median $m us, p90 $p us; with: median $am us, p90 $ap us"
    echo "$r $m $p $am $ap" >>"$tmp/handshakes"
  done
fi

python3 - "$results" "$streams" "$auth" "$tmp/handshakes" <<'EOF'
import statistics, sys
rows, per_run = {}, {}
for line in open(sys.argv[1]):
    run, a, b, gbs, rps = line.split()
    rows.setdefault((a, b), []).append((float(gbs), float(rps)))
    per_run.setdefault(run, {})[(a, b)] = float(gbs)
streams = sys.argv[2]
med = lambda v: statistics.median(v)
ip = med([g for g, _ in rows[("iperf3", "P" + streams)]])
ip1 = med([g for g, _ in rows.get(("iperf3", "P1"), rows[("iperf3", "P" + streams)])])
print()
print("%-12s %10s %12s %7s %12s %16s" % ("case", "ours GB/s", "iperf3 GB/s", "ratio", "requests/s", "per-run ratios"))
for key in [("WRITE", "1MiB"), ("READ", "1MiB"), ("WRITE", "64KiB"), ("READ", "64KiB"), ("WRITE", "4KiB"), ("READ", "4KiB")]:
    v = rows[key]
    g = med([x for x, _ in v]); r = med([y for _, y in v])
    ratios = [d[key] / d[("iperf3", "P" + streams)] for d in per_run.values()]
    print("%-12s %10.2f %12.2f %7.2f %12.0f %16s" % (" ".join(key), g, ip, g / ip, r,
          " ".join("%.2f" % x for x in ratios)))
print("iperf3 -P %s: %.2f GB/s, -P 1: %.2f GB/s (medians of %d runs)" % (streams, ip, ip1, len(rows[("iperf3", "P" + streams)])))
print("ratio = median ours / median iperf3 -P %s; per-run ratios divide by the same run's iperf3" % streams)
if ("iperf3", "X" + streams) in rows:
    ipx = med([g for g, _ in rows[("iperf3", "X" + streams)]])
    print()
    print("%-12s %10s %12s %7s %16s" % ("case", "ours GB/s", "iperf3 x" + streams, "ratio", "per-run ratios"))
    for key in [("WRITE", "1MiB"), ("READ", "1MiB"), ("WRITE", "64KiB"), ("READ", "64KiB")]:
        g = med([x for x, _ in rows[key]])
        ratios = [d[key] / d[("iperf3", "X" + streams)] for d in per_run.values()]
        print("%-12s %10.2f %12.2f %7.2f %16s" % (" ".join(key), g, ipx, g / ipx, " ".join("%.2f" % x for x in ratios)))
    print("iperf3 x%s: %s clients at once, one stream each, to their own servers, summed: %.2f GB/s (median)"
          % (streams, streams, ipx))
print()
print("%-12s %10s %12s %7s %16s" % ("case", "ours GB/s", "sockets x" + streams, "ratio", "per-run ratios"))
for key in [("WRITE", "1MiB"), ("READ", "1MiB"), ("WRITE", "64KiB"), ("READ", "64KiB")]:
    g = med([x for x, _ in rows[key]])
    sk = med([x for x, _ in rows[("sockets", key[1])]])
    ratios = [d[key] / d[("sockets", key[1])] for d in per_run.values()]
    print("%-12s %10.2f %12.2f %7.2f %16s" % (" ".join(key), g, sk, g / sk, " ".join("%.2f" % x for x in ratios)))
print("sockets x%s: sock_bench, %s streams of plain loopback sockets, each side of each cycling through its"
      " share of the engine's working set at that block size (medians)" % (streams, streams))
if sys.argv[3] == "1":
    print()
    print("%-12s %10s %10s %7s %12s %12s %7s" % ("case", "GB/s", "auth GB/s", "ratio", "requests/s", "auth req/s", "ratio"))
    for op, label in [("WRITE", "1MiB"), ("READ", "1MiB"), ("WRITE", "64KiB"), ("READ", "64KiB"), ("WRITE", "4KiB"), ("READ", "4KiB")]:
        plain, keyed = rows[(op, label)], rows[("AUTH-" + op, label)]
        g, ag = med([x for x, _ in plain]), med([x for x, _ in keyed])
        r, ar = med([y for _, y in plain]), med([y for _, y in keyed])
        print("%-12s %10.2f %10.2f %7.3f %12.0f %12.0f %7.3f" % (op + " " + label, g, ag, ag / g, r, ar, ar / r))
    hs = [list(map(float, l.split()[1:])) for l in open(sys.argv[4])]
    print("handshake latency (median of %d runs of 500): without a key median %.0f us p90 %.0f us; "
          "with a key median %.0f us p90 %.0f us" % (len(hs), med([h[0] for h in hs]), med([h[1] for h in hs]),
                                                     med([h[2] for h in hs]), med([h[3] for h in hs])))
EOF
