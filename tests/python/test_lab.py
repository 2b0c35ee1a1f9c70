"""`espgate lab` end to end: every experiment with --quick in network
namespaces, then the report: a section per experiment with a plot, the
paper's data and findings; results.json as documented; nothing left
behind (namespaces, processes, cgroups). Also Ctrl-C in the middle of a
run and `lab report` on the results of a run. Numbers are not judged here
(benchmarks are not timed tests): the lab's own unit tests check the
statistics and the renderer.
"""

import glob
import html
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun")
    or not shutil.which("iperf3") or not shutil.which("ping"),
    reason="the lab creates network namespaces: needs root, iproute2, /dev/net/tun, iperf3 and ping")

KEYS = {"experiment", "series", "x", "mean", "ci95", "min", "max", "runs", "unit", "samples"}


def leftovers(pid):
    prefix = f"lab{pid % 100000}"
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    found = [l.split()[0] for l in ns.splitlines() if l.split() and l.split()[0].startswith(prefix + "-")]
    procs = subprocess.run(["pgrep", "-f", f"{prefix}-work"], capture_output=True, text=True).stdout.split()
    cgroups = glob.glob(f"/sys/fs/cgroup/cpu/{prefix}-*") + glob.glob(f"/sys/fs/cgroup/{prefix}-*")
    for n in found:  # clean up what the run should have removed, then fail
        subprocess.run(["ip", "netns", "del", n], timeout=30)
    return found, procs, cgroups


def sections(report):
    """{id: html of its section}"""
    out = {}
    for m in re.finditer(r'<section class="experiment" id="([^"]+)">(.*?)</section>', report, re.S):
        out[m.group(1)] = m.group(2)
    return out


def test_every_experiment_runs_quick_and_the_report_has_a_plot_and_seed_data_each(espgate, tmp_path):
    listing = subprocess.run([espgate, "lab", "list"], capture_output=True, text=True, timeout=30)
    assert listing.returncode == 0, listing.stderr
    rows = [l for l in listing.stdout.splitlines()[1:] if re.match(r"^00[0-4]-", l)]
    assert len(rows) == 36, listing.stdout
    # every experiment has its rig now (seed 003's failover was the last)
    waiting = [l.split()[0] for l in rows if l.rstrip().endswith("no rig")]
    assert waiting == [], listing.stdout
    ids = [l.split()[0] for l in rows]
    assert "001-parallel-crypto" in ids and "003-capacity-model" in ids
    assert "003-fixed-size-scaling" in ids and "003-real-traffic-dispatch" in ids
    assert "003-failover" in ids

    out = tmp_path / "lab"
    p = subprocess.Popen([espgate, "lab", "run", "all", "--quick", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)
        raise
    print(err)
    found, procs, cgroups = leftovers(p.pid)
    assert not found and not procs and not cgroups, (found, procs, cgroups)
    assert p.returncode == 0, err

    res = json.loads((out / "results.json").read_text())
    assert res["schema"] == "espgate-lab-results/1"
    env = res["env"]
    for k in ("kernel", "cpu_model", "cores", "espgate_version", "knobs", "tools"):
        assert env[k], k
    assert env["quick"] is True
    assert [e["id"] for e in res["experiments"]] == ids
    for e in res["experiments"]:
        assert e["status"] == {"state": "done"}, e
        assert e["expected_s"] > 0 and e["elapsed_s"] > 0
    by = {}
    for pt in res["points"]:
        assert KEYS <= set(pt), pt
        assert pt["runs"] == len(pt["samples"]) >= 1
        assert pt["min"] <= pt["mean"] <= pt["max"], pt
        by.setdefault(pt["experiment"], []).append(pt)
    assert set(by) == set(ids), set(ids) - set(by)

    report = (out / "report.html").read_text()
    # self-contained: nothing fetched (the SVG namespace URI is a name, not a fetch)
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', report) and "<script" not in report
    assert "<link" not in report and "@import" not in report
    secs = sections(report)
    assert list(secs) == ids
    for i, s in secs.items():
        assert "<svg" in s, f"{i}: no plot"
        data = s.split("The paper&#39;s data", 1)[-1] if "The paper&#39;s data" in s else s.split("The paper's data", 1)[-1]
        assert "<h4" in data, f"{i}: no seed table"
        assert "missing" not in data.split("Findings", 1)[0], f"{i}: a seed table is missing"
        assert "Findings" in s and "verdict" in s, f"{i}: no findings"
    md = (out / "report.md").read_text()
    for i in ids:
        assert f"## {i}" in md, i
    # Table I of seed 002 and the numbers of its Figure 9
    assert "1638.127" in secs["002-throughput-esp-vs-qesp"]
    assert "391.560" in secs["002-priority-congestion"]
    # a figure of the papers is printed beside ours: Table 3 of seed 004
    assert "345.69" in secs["004-esp-noop"] and "182.37" in secs["004-esp-noop"]
    # Table 4-1 of seed 003 beside the capacity model's prediction
    assert "480.1" in secs["003-capacity-model"] and "predicted" in secs["003-capacity-model"]
    # seed 003's cluster rig: Table 4-1 beside our nodes (and no duplicate
    # ESP sequence number left unreported), Table 4-2 beside our synthetic trace
    fixed = html.unescape(secs["003-fixed-size-scaling"])
    assert "480.1" in fixed and "measured" in fixed and "predicted" in fixed
    assert "frame − 42" in fixed and "30 s" in fixed, "payload and trial length are stated"
    trace = html.unescape(secs["003-real-traffic-dispatch"])
    assert "431.8" in trace and "SYNTHETIC" in trace and "busiest node" in trace
    for e in ("003-fixed-size-scaling", "003-real-traffic-dispatch"):
        got = [pt for pt in by[e] if pt["series"].endswith("measured")]
        assert got and all(pt["mean"] > 0 for pt in got), got
        assert all("node1.share_pct" in pt["extra"] for pt in got), got
    # seed 003's failover (etcd started by the rig; removed with it, as the
    # leftovers check above shows): Table 1-1's fault-tolerance row beside
    # our three events, said to be our own experiment
    fo = html.unescape(secs["003-failover"])
    assert "Fault-tolerance" in fo and "Good" in fo and "OUR OWN EXPERIMENT" in fo
    assert "lease_ttl 2s" in fo and "hold 6s" in fo, "the settings are stated"
    got = {(pt["series"], pt["x_label"]) for pt in by["003-failover"]}
    events = ("the leader node", "another node", "an etcd member (of 3)")
    for ev in events:
        for series in ("packets lost", "longest gap", "loss window"):
            assert (series, ev) in got, (series, ev, got)
    for pt in by["003-failover"]:
        assert pt["runs"] == 1 and pt["extra"]["sent"] > 0, pt
    assert "plan changed" in fo, "the etcd member's event says whether the plan changed"
    # and the transform seed 001 used that espgate lacks is said so
    assert "not available" in html.unescape(secs["001-cipher-sweep-tcp"])

    # `lab report` renders the same from results.json alone
    (out / "report.html").unlink()
    r = subprocess.run([espgate, "lab", "report", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert list(sections((out / "report.html").read_text())) == ids


def test_ctrl_c_stops_cleanly_and_keeps_the_points(espgate, tmp_path):
    out = tmp_path / "lab"
    p = subprocess.Popen([espgate, "lab", "run", "000-link10-ip-vs-ipsec", "004-esp-noop", "--quick",
                          "--time", "3", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    # wait for the first point, then interrupt
    while time.time() < deadline:
        f = out / "results.json"
        if f.exists() and json.loads(f.read_text() or "{}").get("points"):
            break
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    found, procs, cgroups = leftovers(p.pid)
    assert not found and not procs and not cgroups, (found, procs, cgroups)
    res = json.loads((out / "results.json").read_text())
    assert res["points"], err
    states = [e["status"]["state"] for e in res["experiments"]]
    assert states and states[-1] in ("interrupted", "done"), (states, err)
    # the second experiment never started
    assert "004-esp-noop" not in [e["id"] for e in res["experiments"]] or states[-1] == "done", err
    assert (out / "report.html").exists()


def test_bad_arguments_are_refused_plainly(espgate, tmp_path):
    r = subprocess.run([espgate, "lab", "run", "no-such-experiment", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "no experiment" in r.stderr, r.stderr
    r = subprocess.run([espgate, "lab", "report", str(tmp_path / "nothing")], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0 and "results.json" in r.stderr, r.stderr


def test_a_before_and_after_pair_is_recorded_and_compared(espgate, tmp_path):
    """`--gateway-binary` with another build records that build, and `lab
    compare` lists the points both runs measured."""
    other = tmp_path / "espgate-other"
    shutil.copy(espgate, other)
    runs = {}
    for side, extra in (("before", ["--gateway-binary", str(other)]), ("after", [])):
        runs[side] = tmp_path / side
        r = subprocess.run([espgate, "lab", "run", "000-link10-ip-vs-ipsec", "--quick", "--out", str(runs[side])]
                           + extra, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    before = json.loads((runs["before"] / "results.json").read_text())
    after = json.loads((runs["after"] / "results.json").read_text())
    assert before["env"]["tools"]["espgate (gateways)"].endswith(f"({other})"), before["env"]["tools"]
    assert "espgate (gateways)" not in after["env"]["tools"], "this build's gateways are not another build"

    r = subprocess.run([espgate, "lab", "compare", str(runs["before"]), str(runs["after"] / "results.json")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("before: espgate") and f"gateways espgate" in lines[0], lines[0]
    assert lines[1].startswith("after: espgate") and "gateways" not in lines[1].split(":")[1], lines[1]
    assert "## 000-link10-ip-vs-ipsec" in lines, r.stdout
    n = len(after["points"])
    assert n > 0 and lines[-1] == f"{n} point(s) in both runs; 0 only before, 0 only after", r.stdout
    # one row per point, each with a ratio (or a dash for a zero before)
    header = lines.index("## 000-link10-ip-vs-ipsec") + 1
    assert lines[header].split()[:3] == ["series", "x", "unit"], lines[header]
    assert len([l for l in lines[header + 1:] if l.strip()]) == n + 1, r.stdout  # rows, then the count

    r = subprocess.run([espgate, "lab", "compare", str(runs["before"]), str(tmp_path / "nothing")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "results.json" in r.stderr and "nothing" in r.stderr, r.stderr
