#!/usr/bin/env bash
# Runs every saved input of every fuzz target once through that target and
# its oracles: the corpus (fuzz/corpus/<target>) and the reproducers of
# fixed bugs (fuzz/regressions/<target>). libFuzzer's `-runs=0` executes the
# given inputs and nothing more, so the outcome does not vary from run to
# run. `make test` runs this: it keeps the harnesses compiling (and clippy
# clean) against the crates they drive, and every input that once passed
# (or once found a bug) checked against today's code.
#
#   fuzz/replay.sh [TARGET...]
#
# Stable toolchain, no cargo-fuzz: the targets are built as `cargo fuzz
# build` builds them (`--cfg fuzzing`, debug assertions, overflow checks)
# but without coverage instrumentation or AddressSanitizer, which replaying
# does not need, into target/fuzz-replay of the main workspace. Fuzzing
# (finding new inputs) is fuzz/run-all.sh.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd .. && pwd)
export CARGO_TARGET_DIR="$root/target/fuzz-replay"
export RUSTFLAGS="--cfg fuzzing -C debug-assertions -C overflow-checks"

# The [[bin]] targets of fuzz/Cargo.toml.
mapfile -t all < <(awk '/^\[\[bin\]\]/ { bin = 1; next }
    bin && /^name *=/ { gsub(/^name *= *"|".*$/, ""); print; bin = 0 }' Cargo.toml)
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=("${all[@]}")
fi
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz/replay.sh: no [[bin]] target found in fuzz/Cargo.toml" >&2
    exit 1
fi

count() { find "$@" -maxdepth 1 -type f 2>/dev/null | wc -l; }

# A target without saved inputs would pass while checking nothing.
for t in "${targets[@]}"; do
    if ! printf '%s\n' "${all[@]}" | grep -qx "$t"; then
        echo "fuzz/replay.sh: no fuzz target named $t (targets: ${all[*]})" >&2
        exit 1
    fi
    if [ "$(count "corpus/$t")" -eq 0 ]; then
        echo "fuzz/replay.sh: fuzz/corpus/$t is missing or empty" >&2
        exit 1
    fi
done

echo "fuzz replay: building ${#targets[@]} targets (stable, --cfg fuzzing) in $CARGO_TARGET_DIR"
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
cargo build --release --quiet "${bins[@]}"
# The fuzz crate is a workspace of its own, which `make lint` does not
# reach: clippy runs here, with the flags and target directory of the
# build above, whose build-script outputs it reuses (seconds, not minutes).
# LINT=0 skips it.
if [ "${LINT:-1}" = 1 ]; then
    echo "fuzz replay: clippy -D warnings on the fuzz crate"
    cargo clippy --release --quiet --all-targets -- -D warnings
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=()
printf '%-18s %8s %8s  %s\n' target inputs runs result
for t in "${targets[@]}"; do
    dirs=("corpus/$t")
    [ -d "regressions/$t" ] && dirs+=("regressions/$t")
    n=$(count "${dirs[@]}")
    mkdir -p "$logs/$t"
    set +e
    "$CARGO_TARGET_DIR/release/$t" -runs=0 -artifact_prefix="$logs/$t/" "${dirs[@]}" \
        >"$logs/$t.log" 2>&1
    rc=$?
    set -e
    runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$logs/$t.log" | tail -1)
    if [ "$rc" -eq 0 ] && [ -n "$runs" ] && [ "$runs" -ge "$n" ]; then
        printf '%-18s %8d %8d  ok\n' "$t" "$n" "$runs"
    else
        printf '%-18s %8d %8s  FAILED (exit %d)\n' "$t" "$n" "${runs:--}" "$rc"
        failed+=("$t")
        echo "--- last lines of $t's output:"
        tail -30 "$logs/$t.log"
        # The input that failed, as libFuzzer saved it.
        for a in "$logs/$t"/*; do
            [ -e "$a" ] || continue
            echo "--- failing input ($(wc -c <"$a") bytes), base64:"
            base64 -w 76 "$a" | head -20
        done
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz replay: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz replay: every saved input of ${#targets[@]} targets passed"
