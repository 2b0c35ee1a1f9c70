#!/bin/bash
# Where the two espgate gateways spend their CPU in a tunnel run:
# `perf record` (software clock, call graphs) on gateway A (sending) and
# gateway B (receiving) for 6 s in the middle of a 20 s
# `bench tunnel --tests $TEST` run (default tcp; e.g. TEST=udp64), then a
# flat report of each.
#
#   [TEST=udp64] scripts/profile-gateways.sh [espgate binary] [output directory]
#
# The espgate binary should carry symbols (the release profile keeps
# debuginfo). Needs `perf` (Debian: linux-perf).
set -euo pipefail
bin=${1:-target/release/espgate}
dir=${2:-/tmp/espgate-profile}
test=${TEST:-tcp}
mkdir -p "$dir"
record() {
    local gw=$1 pid=""
    for _ in $(seq 1 200); do
        pid=$(pgrep -f "espgate-$gw/gw.toml" | head -1 || true)
        [ -n "$pid" ] && break
        sleep 0.2
    done
    [ -n "$pid" ] || { echo "gateway $gw did not start" >&2; return 1; }
    sleep 4
    perf record -q -e cpu-clock -F 2000 -g -p "$pid" -o "$dir/perf-$gw.data" -- sleep 6 \
        > /dev/null 2>&1
}
record a & pa=$!
record b & pb=$!
"$bin" bench tunnel --tests "$test" --runs 1 --time 20 --prefix egp 2>&1 | tail -8
wait $pa $pb
for gw in a b; do
    echo "== gateway $gw ($([ $gw = a ] && echo sending || echo receiving))"
    perf report -i "$dir/perf-$gw.data" --no-children --sort dso,sym -g none \
        > "$dir/report-$gw.txt" 2>/dev/null
    grep -v '^#' "$dir/report-$gw.txt" | grep -v '^$' | head -40 || true
done
