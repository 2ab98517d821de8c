#!/bin/sh
# check_symbols.sh LIB HEADER
#
# Proves the shared library exports exactly the C API: the functions it
# defines (nm -D --defined-only, type T) are the functions declared in the
# header, which are Mooncake's 27 functions of transfer_engine_c.h, no more
# and no fewer.
set -eu
lib=$1
header=$2
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

# Declarations start in column 0: "<type> [*]name(" (comments start with
# "/" or " *", preprocessor lines with "#").
sed -n 's/^[A-Za-z_][A-Za-z0-9_]*[ *]*[ *]\**\([A-Za-z_][A-Za-z0-9_]*\)(.*/\1/p' "$header" \
  | sort -u > "$tmp/header"
nm -D --defined-only "$lib" | awk '$2 == "T" { print $3 }' | sed 's/@.*//' | sort -u > "$tmp/lib"

status=0
for f in mooncake header lib; do
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
if ! diff -u "$tmp/header" "$tmp/lib" >&2; then
  echo "FAIL: exported functions differ from the header (- header, + exported)" >&2
  status=1
fi
[ "$status" -eq 0 ] && echo "exported_symbols: the 27 functions, exactly"
exit "$status"
