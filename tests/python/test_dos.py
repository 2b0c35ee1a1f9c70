"""`espgate bench dos` as a user runs it, briefly: every scenario once with
short TCP runs and two IKE trials. Only the structure and plain sanity are
asserted (a row per scenario, the flood sent packets, gateway B counted
junk, the legitimate IKE SA came up under the flood at least once): how
much the flood costs is a benchmark's question, not a timed test's.

The run uses its own namespace prefix; afterwards no namespace with that
prefix may remain. The flood rate is capped so that the check of the IKE
trials does not depend on how fast this machine is.
"""

import json
import os
import shutil
import subprocess
import tempfile
import uuid

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun")
    or not shutil.which("iperf3") or not shutil.which("ping"),
    reason="bench dos creates network namespaces: needs root, iproute2, /dev/net/tun, "
           "iperf3 and ping")

SCENARIOS = ["esp-unknown", "esp-badicv", "esp-closed-port", "ike-init", "ike-init-spoofed"]
KEYS = {"scenario", "flood", "target", "sources", "flood_packets", "flood_secs", "flood_pps",
        "flood_send_errors", "packet_bytes", "baseline_mbps", "flooded_mbps", "ratio",
        "junk_counted", "counted_by", "counted_share", "drops", "kernel_udp", "gwb_cpu_secs",
        "gwb_cpu_percent", "gwb_rss_before_mib", "gwb_peak_rss_mib", "trials_secs",
        "trials_within_10s", "trial_limit_secs", "ike_counters", "notes", "error", "version"}


def namespaces(prefix):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [l.split()[0] for l in out.splitlines() if l.split() and l.split()[0].startswith(prefix)]


def test_every_scenario_floods_and_is_counted(espgate, tmp_path):
    prefix = f"egdt-{uuid.uuid4().hex[:6]}"
    out = tmp_path / "dos.json"
    try:
        r = subprocess.run(
            [espgate, "bench", "dos", "--prefix", prefix, "--secs", "2", "--trials", "2",
             "--trial-limit", "15", "--rate", "20000", "--json", str(out)],
            capture_output=True, text=True, timeout=150)
    finally:
        left = namespaces(prefix)
        for n in left:
            subprocess.run(["ip", "netns", "del", n], check=False, timeout=30)
        shutil.rmtree(os.path.join(tempfile.gettempdir(), f"{prefix}-work"), ignore_errors=True)
    assert not left, f"bench dos left {left}"
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())
    assert [x["scenario"] for x in rows] == SCENARIOS
    for x in rows:
        assert KEYS <= set(x), (KEYS - set(x), x)
        assert x["error"] is None, x
        assert x["version"], x
        assert x["flood_packets"] > 0 and x["flood_pps"] > 0, x
        assert x["gwb_cpu_secs"] is not None and x["gwb_cpu_secs"] >= 0, x
        assert x["gwb_peak_rss_mib"] > 0, x
        assert x["target"].startswith("192.0.2.2:"), x
    by = {x["scenario"]: x for x in rows}
    for name in ("esp-unknown", "esp-badicv", "esp-closed-port"):
        x = by[name]
        assert x["baseline_mbps"] > 0, x
        assert x["flooded_mbps"] is not None and x["ratio"] is not None, x
        assert 0 < x["junk_counted"] <= x["flood_packets"], x
        assert x["sources"].startswith("random in "), x
    assert by["esp-unknown"]["drops"].get("unknown_spi", 0) > 0, by["esp-unknown"]
    assert by["esp-badicv"]["drops"].get("icv_failure", 0) > 0, by["esp-badicv"]
    # At 20000/s the flood engages the kernel-side filter within a second
    # or two: the rest of the junk is dropped (and counted) in the kernel.
    for name in ("esp-unknown", "esp-badicv"):
        assert by[name]["drops"].get("spi_filter (in the kernel)", 0) > 0, by[name]
    # Nothing listens there: the kernel counts them, espgate sees none.
    assert by["esp-closed-port"]["kernel_udp"].get("NoPorts", 0) > 0, by["esp-closed-port"]
    assert "unknown_spi" not in by["esp-closed-port"]["drops"], by["esp-closed-port"]
    for name in ("ike-init", "ike-init-spoofed"):
        x = by[name]
        assert len(x["trials_secs"]) == 2, x
        up = [t for t in x["trials_secs"] if t is not None]
        assert up, f"the legitimate IKE SA never came up under {name}: {x}"
        assert all(0 < t <= 15 for t in up), x
        assert x["ike_counters"].get("messages_in", 0) > 0, x
        assert x["junk_counted"] > 0, x
    # From the peer's own address every request matches the connection;
    # from elsewhere none does.
    assert by["ike-init"]["ike_counters"].get("dropped_no_connection", 0) == 0, by["ike-init"]
    assert by["ike-init-spoofed"]["ike_counters"].get("dropped_no_connection", 0) > 0, \
        by["ike-init-spoofed"]
    # The table names every scenario and the version.
    for name in SCENARIOS:
        assert name in r.stdout
    assert "espgate bench dos: espgate " in r.stdout


def test_bad_options_exit_2(espgate):
    r = subprocess.run([espgate, "bench", "dos", "--scenario", "syn-flood"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--scenario syn-flood" in r.stderr, r.stderr
