#!/usr/bin/env bash
# Runs every fuzz target for $1 seconds (default 600), one after another,
# with -max_len=4096. Each target's libFuzzer output goes to
# fuzz/logs/<target>.log; a summary (libFuzzer's "Done N runs in S
# second(s)" line, final coverage, crashes) is printed at the end.
#
#   fuzz/run-all.sh [SECONDS] [TARGET...]
#
# Environment:
#   CMIN=0       do not minimise the corpora afterwards (default: minimise,
#                keeping the hand-made seed-* files)
#   FUZZ_ARGS=…  extra libFuzzer arguments (e.g. "-rss_limit_mb=4096")
#
# Needs cargo-fuzz and a nightly toolchain (cargo +nightly fuzz ...).
set -u -o pipefail

cd "$(dirname "$0")"
secs="${1:-600}"
shift || true
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

mkdir -p logs
echo "building ${targets[*]} ..."
if ! cargo +nightly fuzz build >logs/build.log 2>&1; then
    echo "build failed; see fuzz/logs/build.log" >&2
    tail -20 logs/build.log >&2
    exit 1
fi

declare -A status
for t in "${targets[@]}"; do
    echo "== $t: ${secs}s (log: fuzz/logs/$t.log)"
    mkdir -p "corpus/$t"
    dict=()
    [ -f "dicts/$t.dict" ] && dict=("-dict=dicts/$t.dict")
    # shellcheck disable=SC2086
    cargo +nightly fuzz run "$t" "corpus/$t" -- \
        -max_total_time="$secs" -max_len=4096 -print_final_stats=1 \
        "${dict[@]}" ${FUZZ_ARGS:-} >"logs/$t.log" 2>&1
    status[$t]=$?
    if [ "${CMIN:-1}" != 0 ] && [ "${status[$t]}" = 0 ]; then
        keep=$(mktemp -d)
        cp corpus/"$t"/seed-* "$keep"/ 2>/dev/null || true
        cargo +nightly fuzz cmin "$t" "corpus/$t" -- -max_len=4096 >"logs/$t.cmin.log" 2>&1 ||
            echo "   cmin failed; see fuzz/logs/$t.cmin.log"
        cp "$keep"/* "corpus/$t"/ 2>/dev/null || true
        rm -rf "$keep"
    fi
done

echo
echo "== summary (${secs}s per target)"
for t in "${targets[@]}"; do
    log="logs/$t.log"
    done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1)
    final=$(grep -E '#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 |
        grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [^ ]+|exec/s: [0-9]+' | paste -sd' ')
    files=$(find "corpus/$t" -type f | wc -l)
    bytes=$(find "corpus/$t" -type f -exec cat {} + | wc -c)
    printf '%-13s %s\n' "$t" "${done_line:-NO 'Done' LINE (exit ${status[$t]})}"
    printf '%-13s %s; corpus %s files, %s bytes\n' "" "${final:-?}" "$files" "$bytes"
    if [ "${status[$t]}" != 0 ]; then
        printf '%-13s FAILED (exit %s): %s\n' "" "${status[$t]}" \
            "$(grep -m1 -E 'panicked at|ERROR: (libFuzzer|AddressSanitizer)' "$log")"
        ls -1 "artifacts/$t"/* 2>/dev/null | sed "s/^/              artifact: fuzz\//"
    fi
done
