#!/bin/bash
# A/B of two espgate builds in the tunnel benchmark, alternated so that the
# host's drift falls on both alike. Each binary runs its own
# `bench tunnel` (its own plain-routing baseline), ROUNDS times, order
# swapped every round.
#
#   scripts/ab-tunnel.sh OUT BINARY_A BINARY_B [extra bench tunnel args]
#   ROUNDS=4 scripts/ab-tunnel.sh /tmp/ab.txt /tmp/espgate-old target/release/espgate
#
# Defaults: --tests tcp,udp64 --runs 1 --time 10 (override TESTS, TIME).
# Copy the binaries somewhere first if you rebuild meanwhile.
set -euo pipefail
out=$1 a=$2 b=$3
shift 3
: > "$out"
for r in $(seq 1 "${ROUNDS:-3}"); do
    if [ $((r % 2)) = 1 ]; then order="$a $b"; else order="$b $a"; fi
    for bin in $order; do
        echo "== round $r $bin" >> "$out"
        timeout 900 "$bin" bench tunnel --tests "${TESTS:-tcp,udp64}" --runs 1 \
            --time "${TIME:-10}" --prefix egx "$@" 2>/dev/null \
            | grep -E "^(plain|espgate) " >> "$out" || echo "(failed)" >> "$out"
    done
done
echo done >> "$out"
