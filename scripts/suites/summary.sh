#!/usr/bin/env bash
# summary.sh DIR: one line per DIR/*.counts file ("passed failed skipped"),
# then the one summary line over all of them. Exits 1 when a test failed or
# a counts file is malformed.
set -uo pipefail
dir=$1
total_p=0 total_f=0 total_s=0 parts=() bad=0
for f in "$dir"/*.counts; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .counts)
  if ! read -r p fl s rest <"$f" || [ -n "${rest:-}" ] ||
    ! [[ "$p" =~ ^[0-9]+$ && "$fl" =~ ^[0-9]+$ && "$s" =~ ^[0-9]+$ ]]; then
    echo "  $name: malformed counts file ($(head -c 80 "$f")): counted as one failure"
    p=0 fl=1 s=0 bad=1
  fi
  printf '  %-28s %6d passed %4d failed %4d skipped\n' "$name:" "$p" "$fl" "$s"
  total_p=$((total_p + p)) total_f=$((total_f + fl)) total_s=$((total_s + s))
  parts+=("$name $p/$fl/$s")
done
((${#parts[@]})) || { echo "summary: no suite reported counts in $dir"; exit 1; }
list=$(IFS=,; echo "${parts[*]}" | sed 's/,/, /g')
echo "summary: $total_p passed, $total_f failed, $total_s skipped ($list; passed/failed/skipped)"
[ "$total_f" -eq 0 ] && [ "$bad" -eq 0 ]
