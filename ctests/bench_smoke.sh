#!/usr/bin/env bash
# bench_smoke.sh BUILD_DIR
#
# transfer_bench (c-examples/transfer_bench.c) as a test, not a benchmark:
# a target with --verify and an initiator doing READ then WRITE for 1 s
# each with --verify (every byte of the last batch checked), flags given in
# both "--flag value" and "--flag=value" forms; the result line must have
# Mooncake's format; an unsupported protocol (and rdma on a machine
# without RDMA devices) must be refused clearly. Then
# a READ for 2.5 s without --target_base and --target_size (the bench finds
# the target's first buffer with te_segment_buffers), waiting for each
# batch with te_wait_batch (--wait_batch), that must read what the WRITE put there (its blocks are
# among the WRITE's) and print progress lines once a second. Last, both sides over shared memory with
# --hugepages (their buffers in transparent huge pages where the kernel
# allows, as its smaps shows): a READ and a WRITE, every byte of the
# last batch checked. And cma_bench with two threads runs (each method), and sock_bench
# with and without MSG_ZEROCOPY.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=net_lib.sh
. "$here/net_lib.sh"
net_init

bench=$build/transfer_bench
[ -x "$bench" ] || net_fail "$bench not built"

rc=0
"$bench" --mode=initiator --protocol efa --segment_id x --target_base 1 \
  >"$NET_TMP/proto.out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || net_fail "--protocol efa was accepted"
grep -q 'protocol efa is not supported' "$NET_TMP/proto.out" || net_fail "unclear error: $(cat "$NET_TMP/proto.out")"
# rdma without RDMA devices (this machine): refused at install, saying why.
if ! ls /sys/class/infiniband/* >/dev/null 2>&1; then
  rc=0
  "$bench" --mode=target --protocol rdma >"$NET_TMP/rdma.out" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || net_fail "--protocol rdma without RDMA devices was accepted"
  grep -q 'no RDMA device' "$NET_TMP/rdma.out" || net_fail "unclear error: $(cat "$NET_TMP/rdma.out")"
fi

net_start target "$bench" --mode target --metadata_server=P2PHANDSHAKE \
  --local_server_name 127.0.0.1 --buffer_size=$((64 << 20)) --verify
line=$(net_wait_line target '^segment ' 60)
read -r _ seg _ base _ size <<<"$line"
echo "target: $line"

re='^Test completed: duration [0-9]+\.[0-9]{2}, batch count [1-9][0-9]*, throughput [0-9]+\.[0-9]{3} MiB/s$'
for op in read write; do
  rc=0
  timeout -k 5 120 "$bench" --mode initiator --operation="$op" --protocol=tcp \
    --metadata_server P2PHANDSHAKE --segment_id="$seg" --target_base "$base" \
    --target_size "$size" --block_size $((256 << 10)) --batch_size=16 --threads 3 \
    --duration 1 --report_unit=MiB --report_precision 3 --verify \
    >"$NET_TMP/$op.out" 2>"$NET_TMP/$op.err" || rc=$?
  cat "$NET_TMP/$op.out"
  [ "$rc" -eq 0 ] || net_fail "initiator $op exited with $rc"
  grep -Eq "$re" "$NET_TMP/$op.out" || net_fail "no Mooncake result line in the $op output"
  grep -q '^verify: OK' "$NET_TMP/$op.out" || net_fail "$op: no verify line"
done

rc=0
timeout -k 5 120 "$bench" --mode initiator --operation read --segment_id "$seg" \
  --block_size $((256 << 10)) --batch_size 16 --threads 2 --duration 2.5 --report_unit MiB \
  --verify --verify_seed 0x77 --wait_batch >"$NET_TMP/nobase.out" 2>"$NET_TMP/nobase.err" || rc=$?
cat "$NET_TMP/nobase.out"
[ "$rc" -eq 0 ] || net_fail "initiator without --target_base exited with $rc"
grep -q '^verify: OK' "$NET_TMP/nobase.out" || net_fail "no verify line without --target_base"
progress='^progress: [0-9]+\.[0-9] s, batch count [0-9]+, throughput [0-9]+\.[0-9]{2} MiB/s$'
n=$(grep -Ec "$progress" "$NET_TMP/nobase.out" || true)
[ "$n" -ge 2 ] || net_fail "$n progress lines in 2.5 s, want 2"

net_stop target 10
[ "$NET_RC" -eq 0 ] || net_fail "target exited with $NET_RC after SIGTERM"

net_start huge "$bench" --mode target --protocol shm --hugepages --metadata_server P2PHANDSHAKE \
  --local_server_name 127.0.0.1 --buffer_size $((64 << 20)) --verify
read -r _ seg _ base _ size <<<"$(net_wait_line huge '^segment ' 60)"
# Where the kernel gives transparent huge pages on request, the target's
# buffer is in them.
if grep -Eq '\[(madvise|always)\]' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null; then
  # shellcheck disable=SC2154 # set by net_start
  kib=$(awk '/^AnonHugePages:/ {print $2}' "/proc/$NET_PID_huge/smaps_rollup")
  [ "${kib:-0}" -ge $((32 << 10)) ] || net_fail "--hugepages: $kib KiB of the target in huge pages, want 32 MiB of 64"
  echo "target with --hugepages: $kib KiB in transparent huge pages"
fi
for op in read write; do
  rc=0
  timeout -k 5 120 "$bench" --mode initiator --operation "$op" --protocol shm --hugepages \
    --metadata_server P2PHANDSHAKE --segment_id "$seg" --target_base "$base" --target_size "$size" \
    --block_size $((1 << 20)) --batch_size 16 --threads 2 --duration 1 --verify \
    >"$NET_TMP/huge-$op.out" 2>"$NET_TMP/huge-$op.err" || rc=$?
  cat "$NET_TMP/huge-$op.out"
  [ "$rc" -eq 0 ] || net_fail "shm --hugepages $op exited with $rc: $(tail -5 "$NET_TMP/huge-$op.err")"
  grep -q '^verify: OK' "$NET_TMP/huge-$op.out" || net_fail "shm --hugepages $op: no verify line"
done
net_stop huge 10
[ "$NET_RC" -eq 0 ] || net_fail "huge-page target exited with $NET_RC after SIGTERM"

# cma_bench, scripts/bench-shm.sh's anchor for caller memory: two threads
# copy from its child with process_vm_readv (blocks interleaved, then
# apart), vmsplice and pread, check every byte they left and print both
# figures; a bad count, layout or method is refused.
cma=$build/cma_bench
for run in "readv interleaved process_vm_readv" "readv apart process_vm_readv" \
  "vmsplice interleaved vmsplice" "pread interleaved pread"; do
  read -r method layout call <<<"$run"
  out=$(timeout -k 5 60 "$cma" --threads 2 --duration 0.2 --layout "$layout" --method "$method") ||
    net_fail "cma_bench --threads 2 --layout $layout --method $method failed: $out"
  echo "$out"
  grep -Eq "^cma: block=1048576 threads=2 layout=$layout $call=[0-9.]+ GB/s memcpy=[0-9.]+ GB/s ratio=[0-9.]+\$" <<<"$out" ||
    net_fail "cma_bench --layout $layout --method $method: unexpected line"
done
for bad in "--threads 0" "--layout sideways" "--method sideways" "--method vmsplice --threads 257"; do
  rc=0
  # shellcheck disable=SC2086 # options and their values, several words
  "$cma" $bad >/dev/null 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || net_fail "cma_bench $bad exited with $rc, want 2"
done

# sock_bench, scripts/bench-tcp.sh's anchor for TCP: plain loopback
# sockets, then with MSG_ZEROCOPY, whose every send must have come back
# as a completion before it ends; bad sizes are refused.
sock=$build/sock_bench
out=$(timeout -k 5 60 "$sock" --streams 2 --block 65536 --working_set 1048576 --duration 1) ||
  net_fail "sock_bench failed: $out"
echo "$out"
grep -Eq '^sock: streams=2 block=65536 working_set=1048576 zerocopy=0 [0-9.]+ GB/s$' <<<"$out" ||
  net_fail "sock_bench: unexpected line"
out=$(timeout -k 5 60 "$sock" --streams 2 --block 65536 --working_set 1048576 --duration 1 --zerocopy) ||
  net_fail "sock_bench --zerocopy failed: $out"
echo "$out"
[[ "$out" =~ zerocopy=1\ [0-9.]+\ GB/s\ sends=([0-9]+)\ completions=([0-9]+)\ copied=([0-9]+)$ ]] ||
  net_fail "sock_bench --zerocopy: unexpected line"
[ "${BASH_REMATCH[1]}" -gt 0 ] && [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] ||
  net_fail "sock_bench --zerocopy: sends and completions differ"
for bad in "--block 0" "--block 3 --working_set 4" "--streams 65" "--sideways 1"; do
  rc=0
  # shellcheck disable=SC2086 # options and their values
  "$sock" $bad >/dev/null 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || net_fail "sock_bench $bad exited with $rc, want 2"
done
echo "transfer_bench_verify: OK"
