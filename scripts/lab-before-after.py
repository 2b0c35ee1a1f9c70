#!/usr/bin/env python3
"""The lab's experiments run with an older build's gateways and with this
build's, alternated experiment by experiment (so a shared machine's drift
falls on both alike), then one results.json per side and the comparison.

For each experiment id, in order: `espgate lab run ID --gateway-binary
OLD --out OUT/before-ID`, then the same with this build into
OUT/after-ID. Then the runs of each side are merged into
OUT/before/results.json and OUT/after/results.json (experiments and
points concatenated in run order, the commands joined with " ; ", the
elapsed times summed), `espgate lab report` draws both reports, and
`espgate lab compare` writes OUT/compare.txt.

    scripts/lab-before-after.py --old PATH [--new PATH] --out DIR ID [ID ...]
    scripts/lab-before-after.py --merge-only --out DIR

--old is the older espgate binary (e.g. built from an earlier commit with
`git worktree add` and `cargo build --release`); --new the lab and
gateways of this build (default target/release/espgate). The lab itself
is always --new's: only the gateways differ. --merge-only redoes the
merge, reports and comparison from the runs already in DIR. Needs root,
like `espgate lab run`.
"""

import argparse
import glob
import json
import os
import subprocess
import sys


def merge(out, side):
    """Merges OUT/<side>-*/results.json into OUT/<side>/results.json."""
    runs = []
    for path in glob.glob(os.path.join(out, f"{side}-*", "results.json")):
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    if not runs:
        sys.exit(f"lab-before-after: no {side}-*/results.json in {out}")
    runs.sort(key=lambda r: r["env"]["started_unix"])
    merged = runs[0]
    merged["env"]["command"] = " ; ".join(r["env"]["command"] for r in runs)
    merged["env"]["elapsed_s"] = sum(r["env"]["elapsed_s"] for r in runs)
    for r in runs[1:]:
        merged["experiments"] += r["experiments"]
        merged["points"] += r["points"]
    os.makedirs(os.path.join(out, side), exist_ok=True)
    with open(os.path.join(out, side, "results.json"), "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=1, ensure_ascii=False)
    return len(runs), len(merged["points"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="the older espgate binary the 'before' gateways run")
    ap.add_argument("--new", default="target/release/espgate", help="this build")
    ap.add_argument("--out", required=True)
    ap.add_argument("--merge-only", action="store_true")
    ap.add_argument("ids", nargs="*")
    a = ap.parse_args()
    new = os.path.abspath(a.new)
    if not a.merge_only:
        if not a.old or not a.ids:
            ap.error("--old and at least one experiment id are needed (or --merge-only)")
        old = os.path.abspath(a.old)
        for exe in (old, new):
            if not os.access(exe, os.X_OK):
                sys.exit(f"lab-before-after: {exe} is not an executable")
        for i, exp in enumerate(a.ids, 1):
            for side, gw in (("before", old), ("after", new)):
                print(f"[{i}/{len(a.ids)}] {exp}: {side} ({gw})", flush=True)
                cmd = [new, "lab", "run", exp, "--gateway-binary", gw,
                       "--out", os.path.join(a.out, f"{side}-{exp}")]
                r = subprocess.run(cmd, check=False)
                if r.returncode not in (0, 1):
                    # 1: some points were not done (the report says which);
                    # anything else (refused arguments, Ctrl-C) stops here.
                    sys.exit(f"lab-before-after: {' '.join(cmd)} exited {r.returncode}")
    for side in ("before", "after"):
        n, points = merge(a.out, side)
        print(f"{side}: {n} run(s), {points} point(s)")
        subprocess.run([new, "lab", "report", os.path.join(a.out, side)], check=True)
    with open(os.path.join(a.out, "compare.txt"), "w", encoding="utf-8") as f:
        subprocess.run([new, "lab", "compare", os.path.join(a.out, "before"),
                        os.path.join(a.out, "after")], stdout=f, check=True)
    print(f"comparison: {os.path.join(a.out, 'compare.txt')}")


if __name__ == "__main__":
    main()
