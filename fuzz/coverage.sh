#!/usr/bin/env bash
# Source-based line coverage of each fuzz target's corpus, measured over
# the source files that target is meant to exercise.
#
#   fuzz/coverage.sh [TARGET...]        (default: every target)
#
# For each target: `cargo +nightly fuzz coverage <target> corpus/<target>`
# (an instrumented build under target/<triple>/coverage/, run once over
# every corpus file, profile in fuzz/coverage/<target>/coverage.profdata;
# cargo-fuzz builds one target at a time, but the instrumented crates are
# shared, so after the first target each one only links its own binary),
# then rustup's llvm-cov (`report` and `show`) over the target's files
# (see SOURCES below). Lines are counted once each, as `llvm-cov show`
# marks them (a line with code, executed or not); the TOTAL of `llvm-cov
# report` (kept in report.txt, with regions and functions) is a few per
# cent higher because it counts a closure's lines both in the closure and
# in the function around it. Lines listed in coverage-exclude.txt (code a
# target cannot reach by design, each with its reason) are left out of
# the "adjusted" figure; the raw figure counts every line.
#
# Prints one summary line per target and writes
#   fuzz/logs/coverage.md                  the table (plus per-file lines)
#   fuzz/coverage/<target>/report.txt      llvm-cov report of its files
#   fuzz/coverage/<target>/missed.txt      every line never executed
#
# Environment:
#   COV_BUILD_ARGS=…  extra `cargo fuzz coverage` options (default "-s none":
#                     no sanitizer, coverage does not need one and it builds
#                     and runs faster)
#   COV_NO_RUN=1      reuse the existing coverage.profdata and binary (only
#                     re-read the numbers, e.g. after editing the exclusions)
#   LLVM_BIN=dir      where llvm-cov and llvm-profdata are (default: the
#                     nightly toolchain's llvm-tools; a system llvm-cov of
#                     another LLVM version cannot read the profile)
#
# Run it at idle priority on a shared machine:
#   chrt --idle 0 nice -n 19 fuzz/coverage.sh
set -u -o pipefail

cd "$(dirname "$0")"
fuzz_dir=$(pwd)
root=$(cd .. && pwd)

# The files each target is meant to exercise (paths under the repository
# root; a directory stands for every .rs file below it; a path that does
# not exist is skipped). Test-only modules are not compiled into the fuzz
# binaries, so they never count.
declare -A SOURCES=(
    [wire_parse]="crates/espgate-core/src/wire crates/espgate-core/src/sa/classifier.rs crates/espgate-core/src/sa/spec.rs"
    # sa/ without spec.rs (the SA spec text parser: wire_parse's) and
    # per_cpu.rs (per-CPU key derivation, done when a configuration loads).
    [esp_inbound]="crates/espgate-core/src/sa/mod.rs crates/espgate-core/src/sa/esp.rs crates/espgate-core/src/sa/ah.rs crates/espgate-core/src/sa/replay.rs crates/espgate-core/src/sa/classifier.rs crates/espgate-core/src/sa/lifetime.rs crates/espgate-core/src/sad.rs crates/espgate-core/src/crypto"
    [sa_roundtrip]="crates/espgate-core/src/sa/mod.rs crates/espgate-core/src/sa/esp.rs crates/espgate-core/src/sa/ah.rs crates/espgate-core/src/sa/replay.rs crates/espgate-core/src/crypto"
    [spd_lookup]="crates/espgate-core/src/spd.rs crates/espgate-core/src/selector.rs"
    [pcap_read]="crates/espgate-lab/src/capture.rs"
    [offload_segment]="crates/espgate-core/src/offload/segment.rs crates/espgate-core/src/offload/mod.rs"
    [offload_coalesce]="crates/espgate-core/src/offload/coalesce.rs"
    [ike_parse]="crates/espgate-ike/src/wire.rs crates/espgate-ike/src/wire"
    [ike_engine]="crates/espgate-ike/src/engine.rs crates/espgate-ike/src/engine"
    [control_request]="crates/espgate-api/src/control.rs"
    # keygen.rs writes new key files (espgate keygen): nothing a
    # configuration reaches.
    [config_parse]="$(cd "$root" && ls crates/espgate-config/src/*.rs | grep -v /keygen.rs | tr '\n' ' ')"
)

triple=x86_64-unknown-linux-gnu
bin_dir="target/$triple/coverage/$triple/release"
llvm_bin="${LLVM_BIN:-$(rustc +nightly --print sysroot)/lib/rustlib/$triple/bin}"
if [ ! -x "$llvm_bin/llvm-cov" ]; then
    echo "no llvm-cov in $llvm_bin (rustup +nightly component add llvm-tools)" >&2
    exit 1
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
for t in "${targets[@]}"; do
    if [ -z "${SOURCES[$t]:-}" ]; then
        echo "no source list for target '$t' in coverage.sh" >&2
        exit 1
    fi
done

mkdir -p logs coverage
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
failed=0
for t in "${targets[@]}"; do
    out="coverage/$t"
    mkdir -p "$out"
    if [ "${COV_NO_RUN:-0}" != 1 ]; then
        echo "== $t: coverage build and run (log: fuzz/logs/$t.coverage.log)"
        rm -rf "$out/raw"
        # shellcheck disable=SC2086
        if ! cargo +nightly fuzz coverage ${COV_BUILD_ARGS:--s none} "$t" "corpus/$t" \
            >"logs/$t.coverage.log" 2>&1; then
            echo "   FAILED; see fuzz/logs/$t.coverage.log" >&2
            tail -5 "logs/$t.coverage.log" >&2
            failed=1
            continue
        fi
    fi
    bin="$bin_dir/$t"
    prof="$out/coverage.profdata"
    if [ ! -f "$prof" ] || [ ! -x "$bin" ]; then
        echo "== $t: no $prof or $bin; run without COV_NO_RUN" >&2
        failed=1
        continue
    fi
    srcs=()
    for s in ${SOURCES[$t]}; do
        [ -e "$root/$s" ] && srcs+=("$root/$s")
    done
    "$llvm_bin/llvm-cov" report "$bin" -instr-profile="$prof" "${srcs[@]}" \
        >"$out/report.txt" 2>"$out/report.err"
    "$llvm_bin/llvm-cov" show -format=text -show-instantiations=false \
        "$bin" -instr-profile="$prof" "${srcs[@]}" >"$out/show.txt" 2>>"$out/report.err"
    # The TOTAL row of `llvm-cov report`: ... Lines, Missed Lines, Cover ...
    read -r r_lines r_missed < <(awk '$1 == "TOTAL" { print $8, $9 }' "$out/report.txt")
    files=$(find "corpus/$t" -type f | wc -l)
    runs=$(grep -hE '^Done [0-9]+ runs in [0-9]+ second' "logs/$t.log" 2>/dev/null | tail -1 |
        sed -E 's/^Done ([0-9]+) runs in ([0-9]+) second.*/\1 \2/')
    python3 - "$t" "$root" "$out/show.txt" "$fuzz_dir/coverage-exclude.txt" \
        "$out/missed.txt" "${r_lines:-0}" "${r_missed:-0}" "$files" "${runs:-}" "${srcs[@]}" \
        >>"$rows" <<'EOF'
import os, re, sys

target, root, show, excl_path, missed_path, r_lines, r_missed, files, runs = sys.argv[1:10]
sources = sys.argv[10:]

# Exclusions: "target | file | regex | reason". The regex matches the first
# line of a block (a fn, an impl); the block runs to the line holding the
# same indentation followed by "}" (or is that one line if it closes there).
excl = []
for raw in open(excl_path, encoding="utf-8") if os.path.exists(excl_path) else []:
    line = raw.rstrip("\n")
    if not line.strip() or line.lstrip().startswith("#"):
        continue
    parts = [p.strip() for p in line.split(" | ", 3)]
    if len(parts) < 4:
        sys.exit(f"coverage-exclude.txt: bad line: {line}")
    if parts[0] in (target, "*"):
        excl.append((root + "/" + parts[1], re.compile(parts[2]), parts[2]))

# llvm-cov show text: "/path/file.rs:" then "  LINE|  COUNT|source"; an empty
# COUNT is a line without code.
files_lines = {}
cur = None
for raw in open(show, encoding="utf-8", errors="replace"):
    raw = raw.rstrip("\n")
    if raw.startswith("/") and raw.endswith(":"):
        cur = raw[:-1]
        files_lines[cur] = []
        continue
    m = re.match(r"^\s*(\d+)\|\s*([^|]*?)\|(.*)$", raw)
    if m and cur is None:
        # With one source file, llvm-cov show prints no file header.
        cur = sources[0]
        files_lines[cur] = []
    if m:
        files_lines[cur].append((int(m.group(1)), m.group(2).strip(), m.group(3)))

def excluded_lines(path, lines):
    out = set()
    used = set()
    for f, rx, src in excl:
        if f != path:
            continue
        i = 0
        while i < len(lines):
            n, _, text = lines[i]
            if rx.search(text):
                used.add(src)
                indent = text[: len(text) - len(text.lstrip())]
                j = i
                if not text.rstrip().endswith("}"):
                    j = i + 1
                    while j < len(lines) and lines[j][2].rstrip() != indent + "}":
                        j += 1
                    j = min(j, len(lines) - 1)
                for k in range(i, j + 1):
                    out.add(lines[k][0])
                i = j + 1
            else:
                i += 1
    return out, used

tot = mis = etot = emis = 0
per_file = []
used_all = set()
with open(missed_path, "w", encoding="utf-8") as mf:
    for path in sorted(files_lines):
        lines = files_lines[path]
        ex, used = excluded_lines(path, lines)
        used_all |= used
        ft = fm = fet = fem = 0
        for n, c, text in lines:
            if c == "":
                continue
            zero = c == "0"
            if n in ex:
                fet += 1
                fem += zero
            else:
                ft += 1
                fm += zero
                if zero:
                    mf.write(f"{path[len(root) + 1:]}:{n}:{text}\n")
        tot += ft + fet
        mis += fm + fem
        etot += fet
        emis += fem
        per_file.append((path[len(root) + 1 :], ft + fet, fm + fem, ft, fm))
for f, rx, src in excl:
    if src not in used_all:
        print(f"warning: {target}: exclusion /{src}/ matches nothing in {f}", file=sys.stderr)

def pct(t, m):
    return 100.0 * (t - m) / t if t else 0.0

adj_t, adj_m = tot - etot, mis - emis
if runs:
    n, s = runs.split()
    run = f"{int(n):,} runs / {s} s ({int(n) // max(int(s), 1):,}/s)".replace(",", " ")
else:
    run = "-"
print("ROW\t" + "\t".join(map(str, [
    target, run, files,
    f"{tot - mis}/{tot}", f"{pct(tot, mis):.1f}",
    f"{adj_t - adj_m}/{adj_t}", f"{pct(adj_t, adj_m):.1f}", etot,
    f"{int(r_lines) - int(r_missed)}/{r_lines}",
])))
for f, t, m, at, am in per_file:
    print("FILE\t" + "\t".join(map(str, [
        target, f, f"{t - m}/{t}", f"{pct(t, m):.1f}",
        f"{at - am}/{at}", f"{pct(at, am):.1f}",
    ])))
EOF
    awk -F'\t' -v t="$t" '$1 == "ROW" && $2 == t {
        printf "%-16s corpus %5s files  lines %-10s %5s%%  (adjusted %s %s%%, %s excluded; llvm-cov report TOTAL %s)\n",
            $2, $4, $5, $6, $7, $8, $9, $10 }' "$rows"
done

{
    echo "# Fuzz coverage"
    echo
    echo "Written by \`fuzz/coverage.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC')."
    echo "Line coverage of each target's corpus over the files it is meant to"
    echo "exercise; *adjusted* leaves out the lines listed in"
    echo "\`fuzz/coverage-exclude.txt\`. *Last run* is from \`fuzz/logs/<target>.log\`."
    echo
    echo "| target | last run | corpus files | lines covered | % | adjusted | % | excluded lines | llvm-cov report TOTAL |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    awk -F'\t' '$1 == "ROW" { printf "| `%s` | %s | %s | %s | %s | %s | %s | %s | %s |\n", $2, $3, $4, $5, $6, $7, $8, $9, $10 }' "$rows"
    echo
    echo "## Per file"
    echo
    echo "| target | file | lines covered | % | adjusted | % |"
    echo "| --- | --- | ---: | ---: | ---: | ---: |"
    awk -F'\t' '$1 == "FILE" { printf "| `%s` | `%s` | %s | %s | %s | %s |\n", $2, $3, $4, $5, $6, $7 }' "$rows"
} >logs/coverage.md
echo "table: fuzz/logs/coverage.md; uncovered lines: fuzz/coverage/<target>/missed.txt"
exit "$failed"
