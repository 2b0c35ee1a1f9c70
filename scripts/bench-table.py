#!/usr/bin/env python3
"""Prints the ESP benchmark table from criterion's saved estimates
(target/criterion), after `cargo bench -p espgate-core --bench esp`.

Per suite and size: outbound and inbound ns/packet, Mpps and Gb/s, and the
ratio of the pipeline's throughput to the raw aws-lc-rs seal of the same
byte count measured in the same run."""

import json
import pathlib
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")


def ns(group, bench, size):
    f = ROOT / group / bench / str(size) / "new" / "estimates.json"
    if not f.exists():
        return None
    return json.loads(f.read_text())["median"]["point_estimate"]


def fmt(t, size):
    if t is None:
        return "–", "–", "–"
    return f"{t:.0f}", f"{1e3 / t:.2f}", f"{size * 8 / t:.2f}"


# criterion turns "esp/aes128gcm16" into the folder "esp_aes128gcm16".
suites = sorted(p.name[4:] for p in ROOT.glob("esp_*") if p.is_dir())
print("| suite | size B | out ns/pkt | out Mpps | out Gb/s | in ns/pkt | in Mpps | in Gb/s | raw seal ns | out / raw |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in suites:
    for size in (64, 512, 1400, 8192):
        o, i, r = ns(f"esp_{s}", "outbound", size), ns(f"esp_{s}", "inbound", size), ns(f"esp_{s}", "raw_seal", size)
        if o is None:
            continue
        ratio = f"{r / o:.0%}" if r else "–"
        print(f"| {s} | {size} | {' | '.join(fmt(o, size))} | {' | '.join(fmt(i, size))} | "
              f"{f'{r:.0f}' if r else '–'} | {ratio} |")
for name in ("indexed", "linear_scan"):
    f = ROOT / "spd_10000" / name / "new" / "estimates.json"
    if f.exists():
        print(f"\nSPD lookup, 10 000 policies, {name}: "
              f"{json.loads(f.read_text())['median']['point_estimate']:.0f} ns")
f = ROOT / "replay_in_order_4096" / "new" / "estimates.json"
if f.exists():
    print(f"Replay window (4096, ESN) infer+check+update: {json.loads(f.read_text())['median']['point_estimate']:.1f} ns")
