#!/usr/bin/env bash
# Runs every fuzz target for $1 seconds (default 600), one after another,
# with -max_len=4096. Each target's libFuzzer output goes to
# fuzz/logs/<target>.log; a summary (per target the runs executed and the
# seconds, from libFuzzer's "Done N runs in S second(s)" line, runs per
# second, final coverage and corpus size, and any crash) is printed at
# the end. fuzz/coverage.sh reads the same logs for its table.
#
#   fuzz/run-all.sh [SECONDS] [TARGET...]
#
# Environment:
#   CMIN=0       do not minimise the corpora afterwards (default: minimise
#                with libFuzzer's -set_cover_merge=1, keeping the seed-* files)
#   FUZZ_ARGS=…  extra libFuzzer arguments (e.g. "-rss_limit_mb=4096")
#
# With cargo-fuzz and a nightly toolchain (cargo +nightly fuzz ...) the
# targets are built as cargo fuzz builds them, with AddressSanitizer.
# Without them (or with STABLE=1) they are built with the stable toolchain:
# the same coverage instrumentation (`-C passes=sancov-module` and the
# SanitizerCoverage options cargo-fuzz passes, all stable codegen flags),
# `--cfg fuzzing`, debug assertions and overflow checks, but no
# AddressSanitizer (a nightly `-Z` flag): safe Rust's bounds checks still
# panic, out-of-bounds accesses inside C code (aws-lc) go unseen.
set -u -o pipefail

cd "$(dirname "$0")"
secs="${1:-600}"
shift || true
triple=x86_64-unknown-linux-gnu
if [ "${STABLE:-0}" != 1 ] && cargo +nightly fuzz --version >/dev/null 2>&1; then
    stable=0
else
    stable=1
fi
if [ "$#" -gt 0 ]; then
    targets=("$@")
elif [ "$stable" = 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
else
    # The [[bin]] targets of Cargo.toml.
    mapfile -t targets < <(awk '/^\[\[bin\]\]/ { bin = 1; next }
        bin && /^name *=/ { gsub(/^name *= *"|".*$/, ""); print; bin = 0 }' Cargo.toml)
fi

mkdir -p logs
if [ "$stable" = 0 ]; then
    echo "building ${targets[*]} (cargo +nightly fuzz build) ..."
    build() { cargo +nightly fuzz build; }
else
    echo "building ${targets[*]} (stable toolchain, coverage instrumentation, no ASan) ..."
    # `--target` keeps these flags off build scripts and proc macros, which
    # would not link against libFuzzer's coverage hooks.
    build() {
        RUSTFLAGS="--cfg fuzzing -C debug-assertions -C overflow-checks \
-C passes=sancov-module -C llvm-args=-sanitizer-coverage-level=4 \
-C llvm-args=-sanitizer-coverage-inline-8bit-counters \
-C llvm-args=-sanitizer-coverage-pc-table \
-C llvm-args=-sanitizer-coverage-trace-compares" \
            CARGO_TARGET_DIR=target cargo build --release --target "$triple" --bins
    }
fi
if ! build >logs/build.log 2>&1; then
    echo "build failed; see fuzz/logs/build.log" >&2
    tail -20 logs/build.log >&2
    exit 1
fi
# Both builds put the targets here.
bin_dir="target/$triple/release"

declare -A status
for t in "${targets[@]}"; do
    echo "== $t: ${secs}s (log: fuzz/logs/$t.log)"
    mkdir -p "corpus/$t"
    dict=()
    [ -f "dicts/$t.dict" ] && dict=("-dict=dicts/$t.dict")
    # What `cargo fuzz run` runs; crashes go to artifacts/<target>/ as with it.
    mkdir -p "artifacts/$t"
    # shellcheck disable=SC2086
    "$bin_dir/$t" -artifact_prefix="artifacts/$t/" "corpus/$t" \
        -max_total_time="$secs" -max_len=4096 -print_final_stats=1 \
        "${dict[@]}" ${FUZZ_ARGS:-} >"logs/$t.log" 2>&1
    status[$t]=$?
    if [ "${CMIN:-1}" != 0 ] && [ "${status[$t]}" = 0 ]; then
        # libFuzzer's set-cover merge: every feature of the corpus in the
        # fewest files (smaller than cargo fuzz cmin's greedy merge); the
        # seed-* files stay whatever it picks.
        keep=$(mktemp -d)
        if "$bin_dir/$t" -set_cover_merge=1 -max_len=4096 \
            "$keep" "corpus/$t" >"logs/$t.cmin.log" 2>&1 &&
            [ -n "$(ls -A "$keep")" ]; then
            for f in "corpus/$t"/*; do
                b=$(basename "$f")
                case "$b" in
                seed-*) ;;
                *) [ -e "$keep/$b" ] || rm -f "$f" ;;
                esac
            done
            for f in "$keep"/*; do
                [ -e "corpus/$t/$(basename "$f")" ] || cp "$f" "corpus/$t"/
            done
        else
            echo "   corpus minimisation failed; see fuzz/logs/$t.cmin.log"
        fi
        rm -rf "$keep"
    fi
done

echo
echo "== summary (${secs}s per target)"
printf '%-16s %12s %6s %9s  %s\n' target runs secs 'exec/s' 'final coverage; corpus'
for t in "${targets[@]}"; do
    log="logs/$t.log"
    # libFuzzer's own count: "Done N runs in S second(s)".
    read -r runs took < <(grep -hE '^Done [0-9]+ runs in [0-9]+ second' "$log" 2>/dev/null | tail -1 |
        sed -E 's/^Done ([0-9]+) runs in ([0-9]+) second.*/\1 \2/')
    final=$(grep -E '#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 |
        grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [^ ]+' | paste -sd' ')
    files=$(find "corpus/$t" -type f | wc -l)
    bytes=$(find "corpus/$t" -type f -exec cat {} + | wc -c)
    if [ -n "${runs:-}" ]; then
        printf '%-16s %12s %6s %9s  %s; corpus %s files, %s bytes\n' "$t" "$runs" "$took" \
            "$((runs / (took > 0 ? took : 1)))" "${final:-?}" "$files" "$bytes"
    else
        printf '%-16s NO "Done" LINE (exit %s); corpus %s files, %s bytes\n' "$t" \
            "${status[$t]}" "$files" "$bytes"
    fi
    runs='' took=''
    if [ "${status[$t]}" != 0 ]; then
        printf '%-13s FAILED (exit %s): %s\n' "" "${status[$t]}" \
            "$(grep -m1 -E 'panicked at|ERROR: (libFuzzer|AddressSanitizer)' "$log")"
        ls -1 "artifacts/$t"/* 2>/dev/null | sed "s/^/              artifact: fuzz\//"
    fi
done
