"""Per-stage cost accounting on running gateways (`gateway.cost_accounting`,
`espgate costs on|off|reset`, `espgate status --costs`, the
`espgate_stage_*` metrics).

Two `espgate up` in two network namespaces joined by a veth pair (the
`configs` / `Lab` helpers of test_gateway.py):

    gwA (TUN 10.1.0.1/24) --- veth va 192.0.2.1 | 192.0.2.2 vb --- gwB (TUN 10.2.0.1/24)

- With `cost_accounting = true` in both configurations, 20 pings through
  the tunnel give every stage of both directions on both gateways at least
  20 packets and some time: receive, lookup, replay, encap (outbound) or
  decap (inbound), cipher, send; integrity too for aes128-sha256 (raw ESP),
  and none for aes128gcm16 (ESP-in-UDP), whose one AEAD operation counts as
  cipher. The metrics endpoint exports the same counts, and the data plane
  allocates nothing per packet with accounting on.
- Without the key accounting is off: the status document has no `costs`,
  `status --costs --json` says so; `espgate costs on` starts it, `reset`
  zeroes it, `off` removes it again, and traffic flows throughout.

Only counts and presence are asserted, never how long anything took.
Namespaces are unique per test and deleted by the `lab` fixture, with every
process the test started, even on failure; every wait is bounded.
"""

import json
import os
import shutil

import pytest

from test_daemon_ops import add_gateway_keys, fetch, parse_metrics, value
from test_gateway import PING, assert_ping, configs, lab, run  # noqa: F401

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun"),
        reason="needs root, iproute2 and /dev/net/tun (scripts/setup.sh installs iproute2)"),
    pytest.mark.skipif(PING is None, reason="needs ping (iputils-ping; scripts/setup.sh installs it)"),
]

OUT_STAGES = ["receive", "lookup", "replay", "encap", "cipher", "integrity", "send"]
IN_STAGES = ["receive", "lookup", "replay", "integrity", "cipher", "decap", "send"]


def pings(a, b, count=20):
    """`count` pings from site A to site B, 50 ms apart; all must come back."""
    r = run("ip", "netns", "exec", a.ns, PING, "-c", str(count), "-i", "0.05", "-W", "2", "-I", "10.1.0.1",
            "10.2.0.1", check=False, timeout=60)
    assert r.returncode == 0 and f"{count} received" in r.stdout, \
        f"{r.stdout}{r.stderr}\n{a.log_text()}\n{b.log_text()}"


def costs(d, json_out=True):
    args = [d.lab.espgate, "status", "--costs", "-s", str(d.sock)] + (["--json"] if json_out else [])
    r = run(*args, check=False)
    assert r.returncode == 0, f"{r.stderr}\n{d.log_text()}"
    return json.loads(r.stdout) if json_out else r.stdout


def costs_cmd(d, action):
    return run(d.lab.espgate, "costs", action, "-s", str(d.sock), check=False)


@pytest.mark.parametrize("suite,encap", [("aes128gcm16", "udp"), ("aes128-sha256", "none")])
def test_every_stage_counts_packets_both_ways(lab, suite, encap):
    a, b = configs(lab, protocol="esp", encap=encap, esp=suite, extra_gw="cost_accounting = true")
    add_gateway_keys(a, 'metrics = "127.0.0.1:9184"')
    a.start()
    b.start()
    pings(a, b)
    for d in (a, b):
        doc = costs(d)
        assert doc["cost_accounting"] is True, doc
        c = doc["costs"]
        assert c["clock"] in ("tsc", "monotonic") and c["seconds"] > 0 and c["clock_read_ns"] > 0, c
        for direction, stages in (("outbound", OUT_STAGES), ("inbound", IN_STAGES)):
            dc = c[direction]
            assert sorted(dc["stages"]) == sorted(stages), (d.ns, direction, dc)
            assert dc["packets"] >= 20, (d.ns, direction, dc)
            for stage in stages:
                s = dc["stages"][stage]
                if stage == "integrity" and suite == "aes128gcm16":
                    # AEAD: authentication is part of the cipher stage.
                    assert s["packets"] == 0 and s["total_ns"] == 0, (d.ns, direction, s)
                    continue
                assert s["packets"] >= 20, (d.ns, direction, stage, s)
                assert s["total_ns"] > 0, (d.ns, direction, stage, s)
                assert s["ns_per_packet"] == pytest.approx(s["total_ns"] / s["packets"]), s
        # The full status document carries the same object; the text says
        # accounting is on, and the --costs table lists the stages.
        st = d.status()
        assert st["costs"]["outbound"]["packets"] >= c["outbound"]["packets"], st["costs"]
        text = run(d.lab.espgate, "status", "-s", str(d.sock)).stdout
        assert "cost accounting: on" in text, text
        table = costs(d, json_out=False)
        for line in ("outbound: ", "inbound: ", "  cipher ", "  integrity ", "  total "):
            assert line in table, table

    # The metrics endpoint exports the stages as counters.
    before = costs(a)["costs"]
    got = fetch(a.ns, "http://127.0.0.1:9184/metrics")
    after = costs(a)["costs"]
    assert got["code"] == 200, got
    samples, types, _ = parse_metrics(got["body"])
    assert types["espgate_stage_seconds"] == "counter"
    assert types["espgate_stage_packets"] == "counter"
    for direction, stages in (("outbound", OUT_STAGES), ("inbound", IN_STAGES)):
        for stage in stages:
            n = value(samples, "espgate_stage_packets_total", direction=direction, stage=stage)
            lo = before[direction]["stages"][stage]["packets"]
            hi = after[direction]["stages"][stage]["packets"]
            assert lo <= n <= hi, (direction, stage, lo, n, hi)
            secs = value(samples, "espgate_stage_seconds_total", direction=direction, stage=stage)
            assert (secs > 0) == (n > 0), (direction, stage, secs, n)

    # Accounting on, the forwarding path still allocates nothing per packet.
    allocs = a.status()["counters"]["hot_path_allocs"]
    pings(a, b)
    assert a.status()["counters"]["hot_path_allocs"] == allocs


def test_switched_at_run_time(lab):
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16")
    a.start()
    b.start()
    pings(a, b, count=5)
    # Off by default: no costs anywhere.
    assert "costs" not in a.status()
    assert costs(a) == {"cost_accounting": False}
    assert "cost accounting is off" in costs(a, json_out=False)
    r = costs_cmd(a, "reset")
    assert r.returncode == 1 and "cost accounting is off" in r.stderr, r
    r = run(a.lab.espgate, "costs", "sideways", "-s", str(a.sock), check=False)
    assert r.returncode == 2 and "sideways" in r.stderr, r

    r = costs_cmd(a, "on")
    assert r.returncode == 0 and r.stdout.startswith("cost accounting on"), r
    pings(a, b, count=10)
    c = costs(a)["costs"]
    for direction in ("outbound", "inbound"):
        assert c[direction]["stages"]["cipher"]["packets"] >= 10, c
    # B was never switched on.
    assert costs(b) == {"cost_accounting": False}
    assert "already on" in costs_cmd(a, "on").stdout
    assert costs(a)["costs"]["outbound"]["stages"]["cipher"]["packets"] >= 10, "on keeps the counts"

    assert costs_cmd(a, "reset").returncode == 0
    c = costs(a)["costs"]
    for direction in ("outbound", "inbound"):
        # No tunnel traffic since the reset (the TUN may still emit the odd
        # IPv6 router solicitation, which never reaches the cipher).
        assert c[direction]["stages"]["cipher"]["packets"] == 0, c

    r = costs_cmd(a, "off")
    assert r.returncode == 0 and "off" in r.stdout, r
    assert "costs" not in a.status()
    assert costs(a) == {"cost_accounting": False}
    pings(a, b, count=5)
    assert "cost accounting" in a.log_text()
