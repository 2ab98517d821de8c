#!/bin/sh
# check_symbols.sh LIB HEADER EXT_HEADER
#
# Proves the shared library exports exactly the C API: the functions it
# defines (nm -D --defined-only, type T) are those declared in the two
# headers; the main header declares Mooncake's 27 functions of
# transfer_engine_c.h, no more and no fewer; the extension header declares
# only te_* functions, at least the documented ones. The main header's
# macros are Mooncake's transfer_engine_c.h's (no ERR_*: those are in
# Mooncake's error.h, and ours are TE_ERR_* in the extension header, whose
# macros all start with TE_). libibverbs is loaded at run time, not
# linked: the library loads on hosts without rdma-core.
set -eu
lib=$1
header=$2
ext=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Mooncake's classic transfer_engine_c.h, in its declaration order.
cat > "$tmp/mooncake" <<'NAMES'
createTransferEngine
discoverTopology
getLocalIpAndPort
installTransport
uninstallTransport
openSegment
openSegmentNoCache
closeSegment
warmupEfaSegment
removeLocalSegment
destroyTransferEngine
registerLocalMemory
unregisterLocalMemory
registerLocalMemoryBatch
unregisterLocalMemoryBatch
allocateBatchID
submitTransfer
submitTransferWithNotify
getNotifsFromEngine
freeNotifsMsgBuf
genNotifyInEngine
getTransferStatus
freeBatchID
syncSegmentCache
getNicLoadStats
enableGracefulShutdown
showLinks
NAMES
sort -o "$tmp/mooncake" "$tmp/mooncake"

# The macros of Mooncake's transfer_engine_c.h (with its include guard).
printf '%s\n' TRANSFER_ENGINE_C segment_handle_t segment_id_t batch_id_t LOCAL_SEGMENT \
  INVALID_BATCH OPCODE_READ OPCODE_WRITE STATUS_WAITING STATUS_PENDING STATUS_INVALID \
  STATUS_CANCELED STATUS_COMPLETED STATUS_TIMEOUT STATUS_FAILED | sort > "$tmp/mooncake_macros"

# The te_* functions other code is written against.
printf '%s\n' te_allocate_buffer te_cancel_batch te_free_buffer te_last_error te_metrics_text te_notify_status te_segment_buffers te_segment_transport te_version te_wait_batch > "$tmp/ext_documented"

# Declarations start in column 0: "<type> [*]name(" (comments start with
# "/" or " *", preprocessor lines with "#").
declared() {
  sed -n 's/^[A-Za-z_][A-Za-z0-9_ ]*[ *]\**\([A-Za-z_][A-Za-z0-9_]*\)(.*/\1/p' "$1" | sort -u
}
declared "$header" > "$tmp/header"
declared "$ext" > "$tmp/ext"
sort -u "$tmp/header" "$tmp/ext" > "$tmp/both"
nm -D --defined-only "$lib" | awk '$2 == "T" { print $3 }' | sed 's/@.*//' | sort -u > "$tmp/lib"

status=0
for f in mooncake header; do
  n=$(wc -l < "$tmp/$f")
  echo "$f: $n functions"
  if [ "$n" -ne 27 ]; then
    echo "FAIL: $f lists $n functions, want 27" >&2
    status=1
  fi
done
if ! diff -u "$tmp/mooncake" "$tmp/header" >&2; then
  echo "FAIL: header functions differ from Mooncake's (- Mooncake, + header)" >&2
  status=1
fi
echo "extension header: $(wc -l < "$tmp/ext") functions: $(tr '\n' ' ' < "$tmp/ext")"
if grep -v '^te_' "$tmp/ext" >&2; then
  echo "FAIL: the extension header declares functions without the te_ prefix (above)" >&2
  status=1
fi
if [ -n "$(comm -23 "$tmp/ext_documented" "$tmp/ext")" ]; then
  echo "FAIL: the extension header lacks $(comm -23 "$tmp/ext_documented" "$tmp/ext" | tr '\n' ' ')" >&2
  status=1
fi
macros() { sed -n 's/^#define \([A-Za-z_][A-Za-z0-9_]*\).*/\1/p' "$1" | sort -u; }
macros "$header" > "$tmp/header_macros"
macros "$ext" > "$tmp/ext_macros"
if ! diff -u "$tmp/mooncake_macros" "$tmp/header_macros" >&2; then
  echo "FAIL: header macros differ from Mooncake's transfer_engine_c.h (- Mooncake, + header)" >&2
  status=1
fi
if grep -n 'ERR_' "$header" >&2; then
  echo "FAIL: the header names ERR_* (above), which Mooncake's transfer_engine_c.h does not" >&2
  status=1
fi
if grep -v -e '^TE_' -e '^TRANSFER_ENGINE_EXT$' "$tmp/ext_macros" >&2; then
  echo "FAIL: the extension header defines macros without the TE_ prefix (above)" >&2
  status=1
fi
if ! diff -u "$tmp/both" "$tmp/lib" >&2; then
  echo "FAIL: exported functions differ from the headers' (- headers, + exported)" >&2
  status=1
fi
if readelf -d "$lib" | grep -E 'NEEDED.*libibverbs' >&2 || nm -D --undefined-only "$lib" | grep -w -E 'ibv_[a-z_0-9]+' >&2; then
  echo "FAIL: the library links libibverbs (above); it must load it at run time" >&2
  status=1
fi
[ "$status" -eq 0 ] && echo "exported_symbols: Mooncake's 27 functions and $(wc -l < "$tmp/ext") te_* functions, exactly; Mooncake's $(wc -l < "$tmp/mooncake_macros") macros"
exit "$status"
