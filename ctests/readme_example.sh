#!/bin/sh
# readme_example.sh SOURCE_DIR EXAMPLE [PROGRAM]
#
# The README's examples are real programs: the fenced block that follows
# the line "<!-- example: EXAMPLE -->" in SOURCE_DIR/README.md must be the
# file SOURCE_DIR/EXAMPLE, byte for byte (a diff is printed when they
# differ); then PROGRAM, the example as CMake built it, must run and exit 0.
# Edit the README and the file together.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 SOURCE_DIR EXAMPLE [PROGRAM]" >&2; exit 2; }
readme=$1/README.md
example=$2
file=$1/$example
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

# The lines between the opening fence right after the marker and the
# closing fence.
if ! awk -v marker="<!-- example: $example -->" '
  state == 0 && $0 == marker { state = 1; next }
  state == 1 { if ($0 ~ /^```/) { state = 2; next } else { exit 3 } }
  state == 2 && /^```$/ { state = 3; exit }
  state == 2 { print }
  END { if (state != 3) exit 3 }
' "$readme" >"$tmp"; then
  echo "FAIL: README.md has no fenced block right after the line \"<!-- example: $example -->\"" >&2
  exit 1
fi
if ! diff -u "$file" "$tmp"; then
  echo "FAIL: the example in README.md differs from $example (diff above: - the file, + the README)" >&2
  exit 1
fi
echo "the example in README.md is $example"
if [ $# -ge 3 ]; then
  echo "running $3"
  "$3"
fi
