#!/usr/bin/env bash
# ctest.sh: builds with CMake (release, in build/ or $BUILD_DIR) and runs
# ctest; the counts come from ctest's JUnit report (tests that exit 77 are
# skipped) into $TE_RESULTS_DIR/$TE_SUITE.counts, and the skipped tests are
# listed with their reasons. A build that fails counts as one failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
name=${TE_SUITE:-ctest}
counts=${TE_RESULTS_DIR:?}/$name.counts
build=${BUILD_DIR:-build}
junit=$TE_RESULTS_DIR/$name.xml
if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release || ! cmake --build "$build" -j"$(nproc)"; then
  echo "the CMake build failed: counted as one failure"
  echo "0 1 0" >"$counts"
  exit 1
fi
# Several tests at once (CTEST_PARALLEL_LEVEL overrides): most of them wait
# on their peers, on rate-limited veths and on timeouts, not on the CPU.
jobs=${CTEST_PARALLEL_LEVEL:-$((2 * $(nproc)))}
rc=0
(cd "$build" && ctest -j"$jobs" --output-on-failure --timeout 600 --output-junit "$junit") || rc=$?
# The <testsuite> attributes (one per line in ctest's report).
attr() { grep -oE "(^|[[:space:]])$1=\"[0-9]+\"" "$junit" | head -1 | grep -oE '[0-9]+'; }
if [ ! -s "$junit" ]; then
  echo "ctest wrote no JUnit report: counted as one failure"
  echo "0 1 0" >"$counts"
  exit 1
fi
tests=$(attr tests) failures=$(attr failures) skipped=$(attr skipped) disabled=$(attr disabled)
skipped=$((${skipped:-0} + ${disabled:-0}))
if [ "$skipped" -gt 0 ]; then
  echo "ctest tests that could not run here (counted as skipped):"
  # Each skipped test's name, with the SKIPPED line it printed.
  awk '/<testcase / { n = $0; sub(/.*name="/, "", n); sub(/".*/, "", n); skip = /status="notrun"/ }
       skip && /<skipped/ { printf "  %s", n }
       skip && match($0, /SKIPPED: .*/) { printf ": %s", substr($0, RSTART + 9) }
       skip && /<\/testcase>/ { print ""; skip = 0 }' "$junit"
fi
echo "$((tests - failures - skipped)) $failures $skipped" >"$counts"
exit "$rc"
