"""`espgate bench tunnel` as a user runs it: short runs (one run of one
second per test) through plain routing, espgate and the other VPNs, the
JSON rows it documents, a system that fails to come up, bad options and
Ctrl-C. Speeds are not compared (benchmarks are not timed tests): only
that every system delivered something and that the numbers agree with
each other.

Every run uses its own namespace prefix; afterwards no namespace with that
prefix may remain (the test removes any it finds, then fails). Every wait
is bounded.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun"),
    reason="bench tunnel creates network namespaces: needs root, iproute2 and /dev/net/tun")

needs_tools = pytest.mark.skipif(
    not shutil.which("iperf3") or not shutil.which("ping"),
    reason="needs iperf3 and ping (scripts/setup.sh installs them)")

KEYS = {"system", "suite", "test", "runs", "runs_mbps", "runs_started_s", "runs_retransmits", "runs_steal_percent",
        "median_mbps", "min_mbps", "max_mbps", "median_pps", "loss_percent", "ratio_to_plain", "cpu",
        "cpu_s_per_gbit", "version", "error", "settings", "runs_host_b_drops_pps",
        "runs_gateway_b_drops_pps", "median_sent_pps", "median_reached_pps", "reached_ratio_to_plain", "runs_round",
        "paired_ratio_to_plain"}
SETTINGS = {"mtu", "offloads", "workers", "batch", "socket_buffer", "mss_clamp", "time_s", "iperf_window",
            "udp_rate_mbps"}


def namespaces(prefix):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [l.split()[0] for l in out.splitlines() if l.split() and l.split()[0].startswith(prefix)]


def leftovers(prefix):
    """Namespaces with `prefix` (deleted here, so a failure does not leak them)."""
    left = namespaces(prefix)
    for n in left:
        subprocess.run(["ip", "netns", "del", n], check=False, timeout=30)
    return left


def bench(espgate, *args, timeout=300, prefix=None):
    prefix = prefix or f"egtt-{uuid.uuid4().hex[:6]}"
    try:
        r = subprocess.run([espgate, "bench", "tunnel", "--prefix", prefix, *args],
                           capture_output=True, text=True, timeout=timeout)
    finally:
        left = leftovers(prefix)
        # A failed system's logs are kept there; they are in the output too.
        shutil.rmtree(os.path.join(tempfile.gettempdir(), f"{prefix}-work"), ignore_errors=True)
    assert not left, f"bench tunnel left {left}"
    return r


def check_rows(rows, systems, tests, espgate_bin):
    assert isinstance(rows, list)
    got = [(r["system"], r["test"]) for r in rows]
    assert got == [(s, t) for s in systems for t in tests], got
    plain = {r["test"]: r["median_mbps"] for r in rows if r["system"] == "plain"}
    for r in rows:
        assert KEYS <= set(r), (KEYS - set(r), r)
        assert set(r["settings"]) >= SETTINGS, r["settings"]
        assert r["settings"]["mtu"] == 1500 and r["settings"]["time_s"] == 1
        assert r["error"] is None, r
        assert r["runs"] == 1 and len(r["runs_mbps"]) == 1, r
        assert r["median_mbps"] > 0, r
        assert r["min_mbps"] <= r["median_mbps"] <= r["max_mbps"], r
        assert r["runs_mbps"][0] == r["median_mbps"]
        assert len(r["runs_started_s"]) == 1 and r["runs_started_s"][0] >= 0, r
        # One round: the ratio to plain routing's run of that round is the
        # ratio of the medians.
        assert r["runs_round"] == [1], r
        assert r["paired_ratio_to_plain"] == pytest.approx(r["ratio_to_plain"], abs=1e-4), r
        # TCP: the sender's retransmissions, one count per run; none for UDP.
        want = 1 if r["test"].startswith("tcp") else 0
        assert len(r["runs_retransmits"]) == want, r
        assert all(isinstance(n, int) and n >= 0 for n in r["runs_retransmits"]), r
        # The hypervisor's share of the CPU during each run (/proc/stat).
        assert len(r["runs_steal_percent"]) == 1 and 0 <= r["runs_steal_percent"][0] <= 100, r
        if r["system"] == "plain":
            assert r["ratio_to_plain"] == 1.0, r
            assert r["cpu"] == {}, r
        else:
            assert r["ratio_to_plain"] == pytest.approx(r["median_mbps"] / plain[r["test"]], rel=1e-3, abs=1e-4)
            # The gateway processes of this system, both sides.
            names = {k.split("@")[0] for k in r["cpu"]}
            sides = {k.split("@")[1] for k in r["cpu"]}
            assert sides == {"gwA", "gwB"}, r["cpu"]
            assert all(v >= 0 for v in r["cpu"].values()), r["cpu"]
            # espgate runs as the binary under test (its file name, cut to
            # the kernel's 15-character comm).
            # The current wireguard-go is built by go install, which names
            # its binary after the module path's last element.
            want = {"espgate": os.path.basename(espgate_bin)[:15],
                    "relay": os.path.basename(espgate_bin)[:15],
                    "relay-gcm": os.path.basename(espgate_bin)[:15], "wireguard-go": "wireguard",
                    "wireguard-go-debian": "wireguard-go", "boringtun": "boringtun-cli",
                    "strongswan": "charon", "openvpn": "openvpn"}[r["system"]]
            assert want in names, r["cpu"]
            # Efficiency: both gateways' CPU seconds per gigabit delivered.
            assert r["cpu_s_per_gbit"] == pytest.approx(
                sum(r["cpu"].values()) / 100 / (r["median_mbps"] / 1000), rel=0.01), r
        if r["system"] == "espgate":
            assert r["suite"] == "aes128gcm16"
        if r["test"].startswith("udp"):
            assert r["median_pps"] > 0, r
            assert 0 <= r["loss_percent"] <= 100, r
            # Delivered rate and packet rate agree (iperf3 counts payload bytes).
            size = int(r["test"][3:])
            assert r["median_mbps"] * 1e6 / 8 / r["median_pps"] == pytest.approx(size, rel=0.05)
            # Full socket buffers in host B's and gateway B's namespaces,
            # one reading per run; what reached host B's socket is what was
            # delivered plus what it dropped.
            for k in ("runs_host_b_drops_pps", "runs_gateway_b_drops_pps"):
                assert len(r[k]) == 1 and r[k][0] >= 0, r
            assert r["median_reached_pps"] == pytest.approx(
                r["median_pps"] + r["runs_host_b_drops_pps"][0], abs=1), r
            # What iperf3 sent: delivered and lost.
            assert r["median_sent_pps"] == pytest.approx(
                r["median_pps"] / (1 - r["loss_percent"] / 100), rel=0.01, abs=1), r
            if r["system"] == "plain":
                assert r["reached_ratio_to_plain"] == 1.0, r
        else:
            assert r["median_pps"] is None and r["loss_percent"] is None
            assert r["runs_host_b_drops_pps"] == r["runs_gateway_b_drops_pps"] == [], r
            assert r["median_reached_pps"] is None and r["reached_ratio_to_plain"] is None, r
            assert r["median_sent_pps"] is None, r


@needs_tools
def test_plain_and_espgate_json(espgate):
    r = bench(espgate, "--time", "1", "--runs", "1", "--tests", "tcp,udp512", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    # Nothing but the JSON document on stdout.
    rows = json.loads(r.stdout)
    check_rows(rows, ["plain", "espgate"], ["tcp", "udp512"], espgate)
    print(json.dumps(rows, indent=1))


@needs_tools
def test_several_streams_over_per_cpu_sas(espgate):
    """tcp4 (four TCP streams at once) through gateways with two workers
    and two per-CPU SA pairs, as the scaling curve on a bigger host runs:
    the config with per_cpu_sas comes up, the streams' sum is reported
    under the test's name, and the settings say what ran."""
    r = bench(espgate, "--time", "1", "--runs", "1", "--tests", "tcp4", "--json",
              "--workers", "2", "--per-cpu-sas", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(r.stdout)
    check_rows(rows, ["plain", "espgate"], ["tcp4"], espgate)
    assert all(x["settings"]["per_cpu_sas"] == 2 and x["settings"]["workers"] == 2
               for x in rows), rows
    bad = bench(espgate, "--tests", "tcp1")
    assert bad.returncode != 0 and "--tests tcp1" in bad.stderr, bad.stderr


@needs_tools
def test_iperf_window_is_given_to_every_system(espgate):
    """--iperf-window: iperf3's socket buffers for every system alike, in
    each row's settings and the table's header; without it, null; a size
    outside 4 KiB-1 GiB is refused before anything is set up."""
    r = bench(espgate, "--time", "1", "--runs", "1", "--tests", "udp64", "--json", "--iperf-window", "1048576")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(r.stdout)
    check_rows(rows, ["plain", "espgate"], ["udp64"], espgate)
    assert all(x["settings"]["iperf_window"] == 1048576 for x in rows), rows
    t = bench(espgate, "--time", "1", "--runs", "1", "--tests", "udp64", "--iperf-window", "1048576")
    assert t.returncode == 0, t.stdout + t.stderr
    assert "iperf3 -w 1048576 (every system)" in t.stdout, t.stdout
    assert "CPU steal during the runs" in t.stdout, t.stdout
    bad = bench(espgate, "--iperf-window", "100")
    assert bad.returncode != 0 and "--iperf-window" in bad.stderr, bad.stderr


@needs_tools
def test_udp_loss_at_the_receivers_socket_is_counted(espgate):
    """With iperf3's socket buffers at 4 KiB the receiving iperf3 cannot
    keep up with a 64-byte flood: host B's namespace counts the datagrams
    its socket dropped (RcvbufErrors). They are part of what iperf3 itself
    reports lost (sent minus received), never more; the table names them."""
    r = bench(espgate, "--time", "1", "--runs", "1", "--tests", "udp64", "--json", "--iperf-window", "4096")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(r.stdout)
    check_rows(rows, ["plain", "espgate"], ["udp64"], espgate)
    for x in rows:
        drops = x["runs_host_b_drops_pps"][0]
        assert drops > 0, x
        loss = x["loss_percent"] / 100
        assert loss < 1, x
        lost_pps = x["median_pps"] / (1 - loss) - x["median_pps"]
        assert drops <= 1.1 * lost_pps + 100, (drops, lost_pps, x)
        assert x["median_pps"] < x["median_reached_pps"] <= 1.1 * x["median_sent_pps"] + 100, x
    t = bench(espgate, "--time", "1", "--runs", "1", "--tests", "udp64", "--iperf-window", "4096")
    assert t.returncode == 0, t.stdout + t.stderr
    assert "UDP: where the datagrams went" in t.stdout, t.stdout
    assert re.search(r"espgate udp64: sent \d+/s, \d+/s reached host B's socket \(\d\.\d{3} of those sent, "
                     r"\d\.\d{3} of plain's\), its full buffer dropped [1-9]\d*/s; gateway B's UDP sockets "
                     r"dropped \d+/s", t.stdout), t.stdout


@needs_tools
def test_udp_rate_is_given_to_every_system(espgate):
    """--udp-rate: the UDP tests are sent at that rate (iperf3 -b) by every
    system alike: what iperf3 sent matches it; the header and the settings
    show it; 0 is refused before anything is set up."""
    r = bench(espgate, "--time", "1", "--runs", "1", "--tests", "udp64", "--json", "--udp-rate", "20")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(r.stdout)
    check_rows(rows, ["plain", "espgate"], ["udp64"], espgate)
    for x in rows:
        assert x["settings"]["udp_rate_mbps"] == 20, x
        # 20 Mbit/s of 64-byte payloads: 39 062 datagrams a second.
        assert x["median_sent_pps"] == pytest.approx(20e6 / 8 / 64, rel=0.25), x
    t = bench(espgate, "--time", "1", "--runs", "1", "--tests", "udp64", "--udp-rate", "20")
    assert t.returncode == 0, t.stdout + t.stderr
    assert "UDP sent at 20 Mbit/s (every system)" in t.stdout, t.stdout
    bad = bench(espgate, "--udp-rate", "0")
    assert bad.returncode != 0 and "--udp-rate" in bad.stderr, bad.stderr


@needs_tools
def test_runs_are_rounds_that_interleave_the_systems(espgate):
    """--runs 2: each round runs every system in turn, so plain routing's
    second run starts after espgate's first and espgate's second after
    that; the median is over both runs."""
    r = bench(espgate, "--time", "1", "--runs", "2", "--tests", "tcp", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {x["system"]: x for x in json.loads(r.stdout)}
    assert set(rows) == {"plain", "espgate"}, rows
    p, e = rows["plain"]["runs_started_s"], rows["espgate"]["runs_started_s"]
    assert len(p) == len(e) == 2, rows
    assert p[0] < e[0] < p[1] < e[1], (p, e)
    # One-second runs a round apart, not back to back.
    assert e[0] - p[0] >= 1 and p[1] - e[0] >= 1, (p, e)
    for x in rows.values():
        assert x["runs"] == 2 and len(x["runs_mbps"]) == 2, x
        assert x["min_mbps"] <= x["median_mbps"] <= x["max_mbps"], x
        assert x["median_mbps"] == pytest.approx(sum(x["runs_mbps"]) / 2, rel=1e-3), x
        assert x["runs_round"] == [1, 2], x
    # espgate's run over plain routing's of the same round, then the median
    # of the two rounds' ratios (not the ratio of the medians).
    pe, ee = rows["plain"]["runs_mbps"], rows["espgate"]["runs_mbps"]
    paired = (ee[0] / pe[0] + ee[1] / pe[1]) / 2
    assert rows["espgate"]["paired_ratio_to_plain"] == pytest.approx(paired, abs=1e-4), rows
    assert rows["plain"]["paired_ratio_to_plain"] == 1.0, rows


@needs_tools
@pytest.mark.skipif(not shutil.which("taskset") or (os.cpu_count() or 1) < 2,
                    reason="--pin needs taskset and 2 CPUs")
def test_pin_binds_iperf3_and_the_gateways(espgate):
    """--pin: the rows' settings and the table's header say where iperf3 and
    the gateways ran; a binding that fails (taskset) fails the runs, so a
    run that succeeds had its gateways bound."""
    r = bench(espgate, "--time", "1", "--runs", "1", "--tests", "tcp", "--json", "--pin")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(r.stdout)
    check_rows(rows, ["plain", "espgate"], ["tcp"], espgate)
    last = os.cpu_count() - 1
    want = {"iperf3_cpu": 0, "gateway_cpus": "1" if last == 1 else f"1-{last}"}
    assert all(x["settings"]["pin"] == want for x in rows), rows
    t = bench(espgate, "--time", "1", "--runs", "1", "--tests", "tcp", "--pin")
    assert t.returncode == 0, t.stdout + t.stderr
    assert f"pinned: iperf3 on CPU 0, gateways on CPUs {want['gateway_cpus']}" in t.stdout, t.stdout


@needs_tools
def test_scrape_runs_alternate_with_plain_ones(espgate):
    """--scrape 10: espgate measured again under a 10 Hz status-and-metrics
    scrape of both gateways, on the same gateways, with the scrapes done
    reported (the comparison itself is a benchmark, not a test)."""
    r = bench(espgate, "--time", "1", "--runs", "1", "--tests", "tcp", "--json", "--scrape", "10")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(r.stdout)
    esp = [x for x in rows if x["system"] == "espgate"]
    assert len(esp) == 2, rows
    plain_run, scraped = esp
    assert "scraped_hz" not in plain_run and scraped["scraped_hz"] == 10, esp
    # Two gateways, ~10 scrapes a second each, for about a second.
    assert scraped["scrapes"] >= 8, scraped
    assert scraped["error"] is None and scraped["median_mbps"] > 0, scraped
    assert scraped["settings"]["scrape_hz"] == 10


@needs_tools
def test_the_relays_are_measured_on_tcp_only(espgate):
    """--relay: the relay without cryptography (the ceiling of a userspace
    UDP tunnel) and the relay sealing with AES-GCM (that of an encrypting
    one) run between plain routing and espgate, on the TCP tests only, as
    the gateway binary, and carry TCP's super-segments: a transfer through
    each delivers, with each row's numbers consistent as for every system,
    and every sealed message opens on the other side."""
    r = bench(espgate, "--time", "1", "--runs", "1", "--tests", "tcp,udp512", "--json", "--relay")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(r.stdout)
    assert [(x["system"], x["test"]) for x in rows] == [
        ("plain", "tcp"), ("plain", "udp512"), ("relay", "tcp"), ("relay-gcm", "tcp"),
        ("espgate", "tcp"), ("espgate", "udp512")], rows
    relays = ["relay", "relay-gcm"]
    check_rows([x for x in rows if x["system"] not in relays], ["plain", "espgate"],
               ["tcp", "udp512"], espgate)
    check_rows([x for x in rows if x["test"] == "tcp"], ["plain"] + relays + ["espgate"], ["tcp"],
               espgate)
    for relay in rows[2:4]:
        assert relay["suite"] is None and relay["version"] == rows[4]["version"], relay
    # Each side said, when it stopped, what it carried: every message
    # whole, and every sealed one authentic.
    for name in relays:
        counts = [l for l in r.stderr.splitlines()
                  if l.startswith(name + " ") and "stopped;" in l]
        assert len(counts) == 2, r.stderr
        assert all(" torn 0 " in l and " forged 0 " in l for l in counts), r.stderr
        delivered = [int(l.split(" delivered ")[1].split()[0]) for l in counts]
        assert all(d > 0 for d in delivered), counts
    # The table says what the relays are, so that nobody reads them as VPNs.
    t = bench(espgate, "--time", "1", "--runs", "1", "--tests", "tcp", "--relay")
    assert t.returncode == 0, t.stdout + t.stderr
    about = [l for l in t.stdout.splitlines() if l.strip().startswith("relay")]
    assert len(about) >= 2 and all("not a VPN" in l and "ceiling" in l for l in about[:2]), t.stdout
    assert "AES-GCM" in about[1], about
    assert [l.split()[0] for l in t.stdout.splitlines()
            if l.split()[1:2] == ["tcp"]] == ["plain"] + relays + ["espgate"], t.stdout
    # espgate against each relay, read off the same run: its median over
    # theirs, as the table's medians give it.
    median = {l.split()[0]: float(l.split()[2]) for l in t.stdout.splitlines()
              if l.split()[1:2] == ["tcp"]}
    vs = [l for l in t.stdout.splitlines() if l.startswith("  espgate tcp: ")]
    assert len(vs) == 1, t.stdout
    got = dict(x.rsplit(" ", 1) for x in vs[0].split(": ", 1)[1].split(", "))
    assert sorted(got) == relays, vs
    for name in relays:
        assert abs(float(got[name]) - median["espgate"] / median[name]) < 0.006, (vs, median)


PEER_PACKAGES = {"wireguard-go": ["go", "wg"], "wireguard-go-debian": ["wireguard-go", "wg"],
                 "boringtun": ["cargo", "wg"], "openvpn": ["openvpn"], "strongswan": ["swanctl"]}


@needs_tools
@pytest.mark.parametrize("peer", ["wireguard-go", "boringtun", "openvpn", "strongswan"])
def test_peer_json(espgate, peer):
    """Each peer as a user runs it; the current wireguard-go and boringtun
    are built from their Go module and crate at pinned versions (minutes,
    the first time), and every row names the version measured."""
    installed = all(shutil.which(t) for t in PEER_PACKAGES[peer])
    if not installed and not shutil.which("apt-get"):
        pytest.skip(f"{peer} is not installed and there is no apt-get")
    r = bench(espgate, "--time", "1", "--runs", "1", "--tests", "tcp,udp512", "--json",
              "--peers", peer, timeout=900)
    rows = json.loads(r.stdout)
    errors = [x["error"] for x in rows if x["error"]]
    if errors and not installed and ("installing" in errors[0] or "too old" in errors[0]):
        pytest.skip(f"could not install {peer}: {errors[0][:300]}")
    assert r.returncode == 0, r.stdout + r.stderr
    check_rows(rows, ["plain", "espgate", peer], ["tcp", "udp512"], espgate)
    mine = [x for x in rows if x["system"] == peer]
    assert all(x["version"] for x in mine), mine
    # The table says which version it measured, too. Two rounds: the peer
    # comes up again after the last round's instance stopped (strongSwan
    # once waited for the socket its last charon had left behind, and its
    # second round failed).
    t = bench(espgate, "--time", "1", "--runs", "2", "--tests", "tcp", "--peers", peer, timeout=900)
    assert t.returncode == 0, t.stdout + t.stderr
    assert "failures:" not in t.stdout, t.stdout
    assert mine[0]["version"] in t.stdout, t.stdout
    # Round by round, espgate against each system: two ratios, their median.
    for other in ("plain", peer):
        m = re.search(rf"^  espgate tcp / {re.escape(other)}: ([0-9.]+)\*?, ([0-9.]+)\*? "
                      rf"\(median ([0-9.]+)\)$", t.stdout, re.M)
        assert m, t.stdout
        a, b, mid = (float(x) for x in m.groups())
        assert a > 0 and b > 0 and abs(mid - (a + b) / 2) <= 0.011, m.group(0)
    print(json.dumps(mine, indent=1))


@needs_tools
def test_a_system_that_does_not_come_up_is_reported_and_the_rest_runs(espgate):
    # gateway.workers is 0-1024: both espgate gateways refuse to start.
    r = bench(espgate, "--time", "1", "--runs", "1", "--tests", "tcp", "--workers", "5000")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "workers 5000" in lines[0], r.stdout
    plain = [l for l in lines if l.split()[:2] == ["plain", "tcp"]]
    assert len(plain) == 1 and "1.000" in plain[0], r.stdout
    failed = [l for l in lines if l.split()[:2] == ["espgate", "tcp"]]
    assert len(failed) == 1 and "failed: espgate did not come up" in failed[0], r.stdout
    # The reason, with the gateway's own log.
    tail = r.stdout.split("\nfailures:\n", 1)[1]
    assert "workers" in tail and "log (last" in tail, r.stdout
    assert "espgate tcp" in r.stderr


def test_bad_options_are_refused_before_anything_is_made(espgate):
    for args, want in [(["--tests", "icmp"], "--tests icmp"), (["--peers", "ipsec"], "--peers ipsec"),
                       (["--suite", "aes999"], "--suite aes999"), (["--runs", "0"], "--runs 0"),
                       (["--time", "0"], "--time 0")]:
        r = bench(espgate, *args, timeout=30)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert want in r.stderr, (args, r.stderr)
        assert r.stdout == ""
    r = bench(espgate, timeout=30, prefix="eg/x")
    assert r.returncode == 2 and "--prefix eg/x" in r.stderr, r.stderr


@needs_tools
def test_interrupted_run_leaves_nothing(espgate):
    prefix = f"egti-{uuid.uuid4().hex[:6]}"
    p = subprocess.Popen([espgate, "bench", "tunnel", "--prefix", prefix, "--time", "3", "--runs", "3",
                          "--tests", "tcp"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Interrupt once the espgate gateways of the second system run.
        deadline = time.time() + 60
        seen = False
        while time.time() < deadline and p.poll() is None:
            gw = subprocess.run(["ip", "netns", "pids", f"{prefix}-ga"], capture_output=True, text=True,
                                timeout=10).stdout.split()
            if gw:
                seen = True
                break
            time.sleep(0.2)
        assert seen, "the espgate gateways never ran"
        gw_pids = [int(x) for x in gw]
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 130, out + err
        assert "interrupted" in err
        assert out == ""
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        left = leftovers(prefix)
    assert not left, f"the interrupted bench left {left}"
    alive = [x for x in gw_pids if os.path.exists(f"/proc/{x}")]
    assert not alive, f"gateway processes left: {alive}"
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), f"{prefix}-work"))
