#!/usr/bin/env bash
# install_consumer.sh BUILD_DIR SOURCE_DIR
#
# Installs the build into a temporary prefix and checks what a user gets:
#   - the layout: lib/libtransfer_engine.so.<version> (SONAME
#     libtransfer_engine.so.<major>), the .so.<major> and bare .so links, the
#     .a, both headers, the CMake package, the .pc file, the metadata server;
#   - the shipped .so and .a carry no debug info; `--component debug`
#     installs lib/.debug/<so>.debug, which has it, and the .so's
#     .gnu_debuglink names it;
#   - a program that loads the bare name libtransfer_engine.so (as programs
#     built against Mooncake's library do) works: dlopen_cycle;
# then builds ctests/consumer, a small project, against it with
# find_package, with pkg-config (shared, and static through Libs.private),
# and as add_subdirectory of the source tree (whose tests must not leak into
# the parent's ctest), and runs every program it built.
# Skipped (exit 77) without pkg-config or readelf, unless CI=true.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR SOURCE_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=net_lib.sh
. "$here/net_lib.sh"
net_init
for tool in pkg-config readelf; do
  command -v "$tool" >/dev/null || net_skip "$tool is not installed"
done

cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
version=$(cache CMAKE_PROJECT_VERSION)
major=${version%%.*}
libdir=$(cache CMAKE_INSTALL_LIBDIR)
prefix=$NET_TMP/prefix
echo "== install $version into $prefix (libdir $libdir)"
cmake --install "$build" --prefix "$prefix" >"$NET_TMP/install.log" || net_fail "cmake --install failed"
cmake --install "$build" --prefix "$prefix" --component debug >>"$NET_TMP/install.log" ||
  net_fail "cmake --install --component debug failed"
(cd "$prefix" && find . \( -type f -o -type l \) | sort | sed 's|^\./||') | tee "$NET_TMP/layout"

L=$prefix/$libdir
real=libtransfer_engine.so.$version
split=$(cache TE_SPLIT_DEBUG)
want=(
  "$libdir/$real" "$libdir/libtransfer_engine.so.$major" "$libdir/libtransfer_engine.so"
  "$libdir/libtransfer_engine.a" include/transfer_engine_c.h include/transfer_engine_ext.h
  "$libdir/cmake/transfer_engine/transfer_engineConfig.cmake"
  "$libdir/cmake/transfer_engine/transfer_engineConfigVersion.cmake"
  "$libdir/pkgconfig/transfer_engine.pc" bin/transfer-engine-metadata-server
  bin/transfer-engine-info
)
[ "$split" = ON ] && want+=("$libdir/.debug/$real.debug")
for f in "${want[@]}"; do grep -qxF "$f" "$NET_TMP/layout" || net_fail "$f is not installed"; done
[ "$(wc -l <"$NET_TMP/layout")" -eq "${#want[@]}" ] || net_fail "unexpected files installed (see the list)"
[ "$(readlink "$L/libtransfer_engine.so.$major")" = "$real" ] || net_fail ".so.$major does not link to $real"
[ "$(readlink "$L/libtransfer_engine.so")" = "libtransfer_engine.so.$major" ] ||
  net_fail ".so does not link to .so.$major"
soname=$(readelf -d "$L/$real" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libtransfer_engine.so.$major" ] || net_fail "SONAME is '$soname'"
has_debug() { readelf -S "$1" 2>/dev/null | grep -q '\.debug_info'; }
if [ "$split" = ON ]; then
  has_debug "$L/$real" && net_fail "the shipped .so carries debug info"
  has_debug "$L/libtransfer_engine.a" && net_fail "the shipped .a carries debug info"
  has_debug "$L/.debug/$real.debug" || net_fail "the .debug file has no debug info"
  link=$(readelf --string-dump=.gnu_debuglink "$L/$real" | sed -n 's/.*\] *\(.*\.debug\)$/\1/p')
  [ "$link" = "$real.debug" ] || net_fail "the .gnu_debuglink names '$link'"
fi
echo "sizes (bytes):"
du -b "$L/$real" "$L/libtransfer_engine.a" "$prefix/bin/transfer-engine-metadata-server" \
  "$prefix/bin/transfer-engine-info" \
  $([ "$split" = ON ] && echo "$L/.debug/$real.debug") | sed "s|$prefix/||"

echo "== the installed transfer-engine-info"
"$prefix/bin/transfer-engine-info" --json >"$NET_TMP/info.json" 2>"$NET_TMP/info.err" ||
  net_fail "transfer-engine-info failed: $(tail -5 "$NET_TMP/info.err")"
grep -q '"transports"' "$NET_TMP/info.json" || net_fail "transfer-engine-info printed no transports"

echo "== a program that loads the bare name libtransfer_engine.so"
LD_LIBRARY_PATH=$L "$build/dlopen_cycle" libtransfer_engine.so >"$NET_TMP/dlopen.out" 2>&1 ||
  net_fail "dlopen_cycle libtransfer_engine.so failed: $(tail -5 "$NET_TMP/dlopen.out")"
tail -1 "$NET_TMP/dlopen.out"

# consumer MODE [cmake args...]: configure, build, run both programs.
consumer() {
  local mode=$1 dir=$NET_TMP/consumer-$1
  shift
  echo "== consumer: $mode"
  cmake -S "$here/consumer" -B "$dir" -DTE_CONSUME="$mode" "$@" >"$NET_TMP/$mode.configure.log" 2>&1 ||
    net_fail "consumer ($mode): configure failed: $(tail -20 "$NET_TMP/$mode.configure.log")"
  cmake --build "$dir" -j2 >"$NET_TMP/$mode.build.log" 2>&1 ||
    net_fail "consumer ($mode): build failed: $(tail -30 "$NET_TMP/$mode.build.log")"
  local p
  for p in consumer_shared consumer_static; do
    "$dir/$p" || net_fail "consumer ($mode): $p failed"
  done
  [ "$(readelf -d "$dir/consumer_shared" | sed -n 's/.*(NEEDED).*\[\(libtransfer_engine[^]]*\)\]/\1/p')" = \
    "libtransfer_engine.so.$major" ] || net_fail "consumer ($mode) does not need libtransfer_engine.so.$major"
  readelf -d "$dir/consumer_static" | grep -q 'NEEDED.*libtransfer_engine' &&
    net_fail "consumer ($mode): consumer_static needs the shared library"
  # Only the consumer's own test: the library's tests stay out of a parent.
  local n
  n=$(cd "$dir" && ctest -N | sed -n 's/^Total Tests: //p')
  [ "$n" = 1 ] || net_fail "consumer ($mode): ctest lists $n tests, want the consumer's 1"
}
consumer find_package -DCMAKE_PREFIX_PATH="$prefix"
PKG_CONFIG_PATH=$L/pkgconfig consumer pkg-config
# The same cargo target directory: cargo finds the library up to date.
consumer subdirectory -DTE_SOURCE_DIR="$src" -DTE_CARGO_TARGET_DIR="$(cache TE_CARGO_TARGET_DIR)" \
  -DTE_CARGO_FEATURES="$(cache TE_CARGO_FEATURES)"

echo "== pkg-config by hand: cc \$(pkg-config --cflags --libs), and a static link"
pc() { PKG_CONFIG_PATH=$L/pkgconfig pkg-config "$@" transfer_engine; }
[ "$(pc --modversion)" = "$version" ] || net_fail "pkg-config --modversion: $(pc --modversion)"
# shellcheck disable=SC2046
cc -o "$NET_TMP/cc_shared" "$here/consumer/consumer.c" $(pc --cflags --libs) || net_fail "cc (shared) failed"
LD_LIBRARY_PATH=$L "$NET_TMP/cc_shared" || net_fail "cc_shared failed"
# shellcheck disable=SC2046
cc -o "$NET_TMP/cc_static" "$here/consumer/consumer.c" $(pc --cflags) \
  $(pc --static --libs | sed 's/-ltransfer_engine\b/-l:libtransfer_engine.a/') || net_fail "cc (static) failed"
"$NET_TMP/cc_static" || net_fail "cc_static failed"
echo "install_consumer: OK"
