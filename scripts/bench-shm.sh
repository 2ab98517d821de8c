#!/usr/bin/env bash
# bench-shm.sh: same-host transfers between two processes over the
# shared-memory transport, beside memcpy, our TCP loopback and Mooncake's
# TCP loopback, in the same run.
#
#   scripts/bench-shm.sh [--quick] [--runs N] [--duration S] [--threads N]
#
# Builds release with CMake (build/, or $BUILD_DIR), starts five
# transfer_bench-style targets on 127.0.0.1 (P2PHANDSHAKE): ours with
# --protocol shm on mmap'd buffers (copied with cross-memory attach), the
# same with --hugepages on both sides (the buffers in transparent huge
# pages where the kernel's mode allows), ours with --protocol shm on
# --engine_buffers (te_allocate_buffer: memfds,
# copied with memcpy), ours with --protocol tcp, and Mooncake's
# transfer_engine_bench with --protocol tcp (from $MOONCAKE_BENCH, else
# build/pyvenv/bin/transfer_engine_bench as scripts/test-python.sh leaves
# it, else a virtualenv build/mooncake-venv made here with pip; Mooncake's
# column is left out if none can be had). Then, for each run, interleaved:
# memcpy of the same block sizes by the same number of threads
# (local_bench's baseline), the kernel's ways to copy another process's
# memory in 4 KiB pages by themselves (cma_bench: process_vm_readv, which
# the transport uses for caller memory, vmsplice into a pipe, and pread of
# a memfd), and WRITE and READ of 1 MiB blocks (batch 16) and 4 KiB blocks
# (batch 64) through each target. The table shows medians, for the three
# kinds of buffers: GB/s, requests/s, and the ratios of shm to memcpy, to
# our TCP and to Mooncake's TCP. GB = 1e9 bytes.
#
# Defaults: 3 runs of 3 s, 2 threads (about 5 minutes). --quick: 3 runs of
# 1 s. A benchmark, not a test: its verdict is the table, not the exit code
# (non-zero only when something failed to run).
#
# --sweep: shared memory only, the three kinds of buffers, READ and WRITE of
# 4 KiB, 64 KiB, 1 MiB, 16 MiB and 64 MiB blocks (batches of 64, 64, 16,
# 4 and 1), with 1, 2 and all-cores initiator threads; beside each, in the
# same run and with the same thread count: memcpy of the same blocks
# (local_bench's baseline) and cross-memory attach by itself (cma_bench:
# that many threads of one process reading another process's memory with
# process_vm_readv, block by block as transfer_bench's threads take them:
# the kernel's copy that caller memory goes through). About 4 minutes per
# run of 1 s (--duration) on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=3
duration=3
threads=2
sweep=0
while [ $# -gt 0 ]; do
  case $1 in
    --quick) duration=1; shift ;;
    --sweep) sweep=1; shift ;;
    --runs) runs=$2; shift 2 ;;
    --runs=*) runs=${1#*=}; shift ;;
    --duration) duration=$2; shift 2 ;;
    --duration=*) duration=${1#*=}; shift ;;
    --threads) threads=$2; shift 2 ;;
    --threads=*) threads=${1#*=}; shift ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "bench-shm.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v python3 >/dev/null || { echo "python3 is required" >&2; exit 1; }

build=${BUILD_DIR:-"$root/build"}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target transfer_bench local_bench cma_bench >/dev/null
bench=$build/transfer_bench

mooncake=${MOONCAKE_BENCH:-}
[ "$sweep" = 1 ] && mooncake=none
if [ -z "$mooncake" ] && [ -x "$build/pyvenv/bin/transfer_engine_bench" ]; then
  mooncake=$build/pyvenv/bin/transfer_engine_bench
fi
if [ -z "$mooncake" ]; then
  venv=$build/mooncake-venv
  if [ ! -x "$venv/bin/transfer_engine_bench" ]; then
    python3 -m venv "$venv" >/dev/null 2>&1 &&
      "$venv/bin/python" -m pip install --quiet "mooncake-transfer-engine-non-cuda==0.3.13.post1" >/dev/null 2>&1 ||
      echo "bench-shm.sh: Mooncake's wheel cannot be installed; its column is left out" >&2
  fi
  [ -x "$venv/bin/transfer_engine_bench" ] && mooncake=$venv/bin/transfer_engine_bench
fi
[ "$mooncake" = none ] && mooncake=

tmp=$(mktemp -d "${TMPDIR:-/tmp}/te-bench-shm.XXXXXX")
pids=()
cleanup() {
  local rc=$?
  set +e
  # Mooncake's transfer_engine_bench is a Python wrapper around a child
  # process: its children go too.
  for p in "${pids[@]}"; do pkill -TERM -P "$p" 2>/dev/null; kill -TERM "$p" 2>/dev/null; done
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
    grep -m1 -oE "$2" "$1" 2>/dev/null && return 0
    kill -0 "$4" 2>/dev/null || { echo "process $4 exited early" >&2; return 1; }
    sleep 0.1
  done
  echo "no line matching '$2' in $1 after $3 s" >&2
  return 1
}

target_size=$((256 << 20))
# The kernel's transparent huge page mode (the bracketed word), which
# decides whether --hugepages takes effect.
thp=$(grep -o '\[[a-z]*\]' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null | tr -d '[]' || true)
thp=${thp:-unknown}
declare -A seg base
# who -> transfer_bench flags
declare -A flags=([shm]="--protocol shm" [shmhuge]="--protocol shm --hugepages" [shmbuf]="--protocol shm --engine_buffers" [tcp]="--protocol tcp")
kinds=(shm shmhuge shmbuf tcp)
[ "$sweep" = 1 ] && kinds=(shm shmhuge shmbuf)
for who in "${kinds[@]}"; do
  # shellcheck disable=SC2086
  "$bench" --mode target ${flags[$who]} --metadata_server P2PHANDSHAKE --local_server_name 127.0.0.1 \
    --buffer_size "$target_size" >"$tmp/target-$who.out" 2>"$tmp/target-$who.err" &
  pids+=($!)
  line=$(wait_line "$tmp/target-$who.out" '^segment .*' 60 "$!")
  read -r _ seg[$who] _ base[$who] _ _ <<<"$line"
done
if [ -n "$mooncake" ]; then
  "$mooncake" --mode target --protocol tcp --metadata_server P2PHANDSHAKE --local_server_name 127.0.0.1 \
    --buffer_size "$target_size" >"$tmp/target-mooncake.out" 2>&1 &
  pids+=($!)
  seg[mooncake]=$(wait_line "$tmp/target-mooncake.out" 'listening on [0-9.:]+' 60 "$!" | awk '{print $3}')
fi

# memcpy BLOCK_KIB -> GB/s of local_bench's memcpy baseline, $threads threads.
memcpy() {
  "$build/local_bench" --duration "$duration" --runs 1 --threads "$threads" --blocks "$1" \
    2>"$tmp/local.err" | python3 -c 'import re,sys; print(re.search(r"memcpy=([0-9.]+) GB/s", sys.stdin.read()).group(1))'
}

# run WHO OP BLOCK BATCH -> "GB/s req/s"
run() {
  local who=$1 op=$2 block=$3 batch=$4 out="$tmp/initiator.out"
  local cmd
  case $who in
    # shellcheck disable=SC2206
    shm|shmhuge|shmbuf|tcp) cmd=("$bench" ${flags[$who]} --target_base "${base[$who]}" --target_size "$target_size") ;;
    mooncake) cmd=("$mooncake" --protocol tcp) ;;
  esac
  if ! timeout -k 5 $((duration + 60)) "${cmd[@]}" --mode initiator --metadata_server P2PHANDSHAKE \
    --local_server_name 127.0.0.1 --segment_id "${seg[$who]}" --operation "$op" --block_size "$block" \
    --batch_size "$batch" --threads "$threads" --duration "$duration" --buffer_size "$target_size" \
    --report_unit GB --report_precision 4 >"$out" 2>&1; then
    echo "$who initiator $op block $block failed:" >&2
    tail -n 20 "$out" >&2
    return 1
  fi
  python3 - "$out" "$batch" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"Test completed: duration ([0-9.]+), batch count ([0-9]+), throughput ([0-9.]+) GB/s", text)
d, n, r = float(m.group(1)), int(m.group(2)), float(m.group(3))
print("%.4f %.0f" % (r, n * int(sys.argv[2]) / d))
EOF
}

# cma BLOCK [METHOD] -> GB/s of cma_bench's $threads threads reading another
# process (process_vm_readv, or METHOD: vmsplice, pread).
cma() {
  "$build/cma_bench" --block "$1" --duration "$duration" --threads "$threads" --method "${2:-readv}" \
    2>"$tmp/cma.err" | python3 -c 'import re,sys; print(re.search(r"=([0-9.]+) GB/s memcpy", sys.stdin.read()).group(1))'
}

if [ "$sweep" = 1 ]; then
  counts=$(printf '%s\n' 1 2 "$(nproc)" | sort -nu | tr '\n' ' ')
  blocks=("4096 64" "65536 64" "1048576 16" "16777216 4" "67108864 1")
  results=$tmp/results
  : >"$results"
  echo "# one host, $runs runs x ${duration} s, initiator threads: $counts; transparent huge pages: $thp; targets: shm ${seg[shm]}, shm in huge pages ${seg[shmhuge]}, shm with engine buffers ${seg[shmbuf]}"
  for r in $(seq "$runs"); do
    for threads in $counts; do
      for b in "${blocks[@]}"; do
        read -r block batch <<<"$b"
        line="$r $threads $block memcpy $(memcpy $((block >> 10))) 0 cma $(cma "$block") 0"
        for who in shm shmhuge shmbuf; do
          for op in write read; do
            line+=" $who-$op $(run "$who" "$op" "$block" "$batch")"
          done
        done
        echo "$line" >>"$results"
        echo "run $r: $line"
      done
    done
  done
  python3 - "$results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    cols = {f[i]: (float(f[i + 1]), float(f[i + 2])) for i in range(3, len(f), 3)}
    rows.setdefault((int(f[1]), int(f[2])), []).append(cols)
size = lambda b: "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)
print()
print("%-7s %-6s %6s %6s | %-33s | %-22s | %-22s" % ("threads", "block", "memcpy", "cma",
      "caller memory (cross-memory attach)", "in huge pages", "engine buffers (memfd)"))
print("%-7s %-6s %6s %6s | %-33s | %-22s | %-22s" % ("", "", "GB/s", "GB/s", "WRITE  READ   /memcpy     /cma",
      "WRITE  READ   /memcpy", "WRITE  READ   /memcpy"))
for (threads, block), runs in sorted(rows.items()):
    med = lambda col, i=0: statistics.median(r[col][i] for r in runs)
    m, c = med("memcpy"), med("cma")
    w, rd = med("shm-write"), med("shm-read")
    pair = lambda who: "%5.2f %5.2f  %4.2f %4.2f" % (med(who + "-write"), med(who + "-read"),
                                                    med(who + "-write") / m, med(who + "-read") / m)
    print("%-7d %-6s %6.2f %6.2f | %5.2f %5.2f  %4.2f %4.2f  %4.2f %4.2f | %s | %s" % (
        threads, size(block), m, c, w, rd, w / m, rd / m, w / c, rd / c, pair("shmhuge"), pair("shmbuf")))
    if block == 4096:
        print("%-7s %-6s %6s %6s |   requests/s: WRITE %.0f, READ %.0f" % ("", "", "", "", med("shm-write", 1), med("shm-read", 1)))
print("medians of %d runs; /memcpy: over memcpy of the same blocks by as many threads; /cma: over as" % len(next(iter(rows.values()))))
print("many threads of one process reading another process's memory with process_vm_readv alone")
EOF
  exit 0
fi

whos=(shm shmhuge shmbuf tcp)
[ -n "$mooncake" ] && whos+=(mooncake)
cases=("write 1048576 16 1MiB" "read 1048576 16 1MiB" "write 4096 64 4KiB" "read 4096 64 4KiB")
results=$tmp/results
: >"$results"
echo "# one host, $runs runs x ${duration} s, $threads threads; transparent huge pages: $thp; targets: shm ${seg[shm]}, shm in huge pages ${seg[shmhuge]}, shm with engine buffers ${seg[shmbuf]}, tcp ${seg[tcp]}${seg[mooncake]:+, mooncake ${seg[mooncake]}}"
for r in $(seq "$runs"); do
  for kib in 1024 4; do
    v=$(memcpy "$kib")
    echo "$r memcpy $kib $v 0" >>"$results"
    echo "run $r: memcpy ${kib} KiB x $threads threads: $v GB/s"
  done
  for method in readv vmsplice pread; do
    v=$(cma 1048576 "$method")
    echo "$r cma-$method 1024 $v 0" >>"$results"
    echo "run $r: $method alone, 1 MiB x $threads threads: $v GB/s"
  done
  for c in "${cases[@]}"; do
    read -r op block batch label <<<"$c"
    for who in "${whos[@]}"; do
      v=$(run "$who" "$op" "$block" "$batch")
      echo "$r $who ${op^^}-$label $v" >>"$results"
      echo "run $r: $who ${op^^} $label: $v (GB/s req/s)"
    done
  done
done

python3 - "$results" "$threads" "$thp" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    _, who, case, gbs, rps = line.split()
    rows.setdefault((who, case), []).append((float(gbs), float(rps)))
med = lambda key, i: statistics.median(v[i] for v in rows[key]) if key in rows else None
print()
print("%-18s %8s %11s %8s %6s %11s %8s %6s %9s %7s" % ("case", "shm GB/s", "requests/s", "memcpy", "ratio",
      "runs", "our tcp", "ratio", "mooncake", "ratio"))
for who, label in (("shm", "mmap"), ("shmhuge", "huge"), ("shmbuf", "engine")):
    for case in ["WRITE-1MiB", "READ-1MiB", "WRITE-4KiB", "READ-4KiB"]:
        g, r = med((who, case), 0), med((who, case), 1)
        base = ("memcpy", "1024" if case.endswith("1MiB") else "4")
        m = med(base, 0)
        t, mc = med(("tcp", case), 0), med(("mooncake", case), 0)
        fmt = lambda x: "%8.2f" % x if x is not None else "%8s" % "-"
        ratio = lambda x: "%6.2f" % (g / x) if x else "%6s" % "-"
        # The worst and best run's ratio to the memcpy of the same run.
        each = [v[0] / c[0] for v, c in zip(rows[(who, case)], rows[base])]
        spread = "%.2f-%.2f" % (min(each), max(each))
        print("%-18s %8.2f %11.0f %s %s %11s %s %s %9s %7s" % (case + " " + label, g, r, fmt(m), ratio(m), spread,
              fmt(t), ratio(t), ("%.3f" % mc) if mc is not None else "-", ("%.1f" % (g / mc)) if mc else "-"))
print("mmap: buffers from mmap (cross-memory attach); huge: the same with madvise(MADV_HUGEPAGE) on")
print("both sides (transparent huge pages: %s); engine: from te_allocate_buffer (memfds, memcpy)" % sys.argv[3])
print("medians of %d runs (runs: the worst and best run's ratio to memcpy in that run), %s threads;" %
      (len(rows[("memcpy", "1024")]), sys.argv[2]))
print("memcpy: the same block sizes copied by local_bench's baseline")
c, m = med(("cma-readv", "1024"), 0), med(("memcpy", "1024"), 0)
print("process_vm_readv alone (cma_bench, as many threads of one process reading another's memory in")
print("4 KiB pages, 1 MiB blocks): %.2f GB/s, %.2fx memcpy; mmap 1 MiB reaches WRITE %.2fx, READ %.2fx of it" %
      (c, c / m, med(("shm", "WRITE-1MiB"), 0) / c, med(("shm", "READ-1MiB"), 0) / c))
v, p = med(("cma-vmsplice", "1024"), 0), med(("cma-pread", "1024"), 0)
print("the kernel's other ways to copy another process's 4 KiB pages, alone, the same way: vmsplice into")
print("a pipe and read %.2f GB/s (%.2fx memcpy), pread of a memfd it wrote %.2f GB/s (%.2fx memcpy)" %
      (v, v / m, p, p / m))
EOF
