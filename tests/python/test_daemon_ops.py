"""Operating the gateway: the Prometheus metrics endpoint (`gateway.metrics`),
`espgate up --daemon` with its pid and log files, systemd's READY=1, and the
systemd unit in dist/systemd.

Each test makes its own namespaces through the `lab` fixture of
test_gateway.py and deletes exactly those; a daemon started with --daemon is
not a child of the test, so every test that starts one stops it itself (by
the pid it reported, after checking that pid runs our configuration), also
on failure. Every wait is bounded.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib

import pytest

from test_gateway import PING, SENDER, assert_ping, configs, ip_json, lab, run, snapshot  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[2]
UNIT = ROOT / "dist" / "systemd" / "espgate@.service"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun"),
    reason="needs root, iproute2 and /dev/net/tun (scripts/setup.sh installs iproute2)")

# One HTTP request from inside a namespace; prints the answer as JSON.
FETCH = r"""
import json, sys, urllib.error, urllib.request
url, method = sys.argv[1], sys.argv[2]
req = urllib.request.Request(url, method=method, data=b"x=1" if method == "POST" else None)
try:
    r = urllib.request.urlopen(req, timeout=10)
    code, headers, body = r.status, r.headers, r.read()
except urllib.error.HTTPError as e:
    code, headers, body = e.code, e.headers, e.read()
# Header names are case-insensitive: one spelling (Content-Type).
headers = {k.title(): v for k, v in headers.items()}
print(json.dumps({"code": code, "headers": headers, "body": body.decode()}))
"""

# Opens N TCP connections that never send anything, says so, and holds
# them until stdin closes (bounded by a timeout).
SILENT = r"""
import socket, sys, select
conns = [socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) for _ in range(int(sys.argv[3]))]
print("open", flush=True)
select.select([sys.stdin], [], [], 30)
"""

LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def fetch(ns, url, method="GET"):
    r = run("ip", "netns", "exec", ns, sys.executable, "-c", FETCH, url, method)
    return json.loads(r.stdout)


def parse_metrics(text):
    """OpenMetrics text: {(sample name, frozenset(labels)): value},
    {family: type}, {family: help}; checks the grammar on the way: HELP,
    TYPE, then the family's samples (a counter's named FAMILY_total), one
    `# EOF` at the end."""
    samples, types, helps = {}, {}, {}
    lines = text.splitlines()
    assert lines and lines[-1] == "# EOF", lines[-3:]
    family = None
    for line in lines[:-1]:
        if line.startswith("# HELP "):
            name, _, h = line[len("# HELP "):].partition(" ")
            assert name not in helps, f"family {name} twice"
            helps[name] = h
        elif line.startswith("# TYPE "):
            name, kind = line[len("# TYPE "):].split(" ")
            assert name in helps and name not in types, line
            types[name] = kind
            family = name
        else:
            series, value = line.rsplit(" ", 1)
            name, _, rest = series.partition("{")
            assert family is not None, f"sample before any TYPE: {line}"
            want = family + "_total" if types[family] == "counter" else family
            assert name == want, f"sample outside its family {family}: {line}"
            labels = frozenset(LABEL.findall(rest))
            key = (name, labels)
            assert key not in samples, f"repeated series {line}"
            samples[key] = float(value)
    return samples, types, helps


def sa_labels(sa, **more):
    return dict(connection=sa["connection"], direction=sa["direction"], spi=sa["spi"], proto=sa["protocol"],
                suite=sa["suite"], **more)


def value(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def add_gateway_keys(d, text):
    """Adds lines to the [gateway] table of daemon `d`'s configuration."""
    cfg = d.cfg.read_text()
    d.cfg.write_text(cfg.replace("[gateway]\n", "[gateway]\n" + text + "\n", 1))


def wait_until(what, cond, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


# Counters of `espgate status` and their metric names.
COUNTERS = {
    "tun_rx": "espgate_tun_rx_packets_total", "tun_tx": "espgate_tun_tx_packets_total",
    "net_rx": "espgate_net_rx_packets_total", "net_tx": "espgate_net_tx_packets_total",
    "keepalives": "espgate_nat_keepalives_total", "ike": "espgate_ike_packets_total",
    "dummies": "espgate_dummy_packets_total", "not_unicast": "espgate_not_unicast_packets_total",
    "mss_clamped": "espgate_mss_clamped_total", "icmp_too_big": "espgate_icmp_too_big_sent_total",
    "keepalives_sent": "espgate_nat_keepalives_sent_total", "gso_sends": "espgate_udp_gso_sends_total",
    "raw_batch_sends": "espgate_raw_batch_sends_total", "udp_batch_sends": "espgate_udp_batch_sends_total",
    "gro_reads": "espgate_udp_gro_reads_total", "tso_reads": "espgate_tun_tso_reads_total",
    "tun_gso_writes": "espgate_tun_gso_writes_total",
    "hold_flushes": "espgate_hold_flushes_total",
    "hot_path_allocs": "espgate_hot_path_allocations_total",
    "udp_socket_drops": "espgate_udp_socket_drops_total",
    "spi_filter_engaged": "espgate_spi_filter_engagements_total",
}


@pytest.mark.skipif(PING is None, reason="needs ping")
def test_metrics_agree_with_status(lab):
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16",
                   extra_conn='lifetime = { hard_time = "1h", soft_bytes = "1G" }')
    add_gateway_keys(a, 'metrics = "127.0.0.1:9184"')
    add_gateway_keys(b, 'metrics = "192.0.2.2:9184"')
    a.start()
    b.start()
    assert "metrics on http://127.0.0.1:9184/metrics" in a.log_text()
    assert "not built" not in a.log_text()
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    # A datagram too short for ESP, from B to A's port 4500: bad_length.
    run("ip", "netns", "exec", b.ns, sys.executable, "-c", SENDER, "192.0.2.1", "4500", b"abc".hex())
    wait_until("the bad_length drop", lambda: a.status()["drops"].get("bad_length") == 1)

    before = a.status()
    got = fetch(a.ns, "http://127.0.0.1:9184/metrics")
    after = a.status()
    assert got["code"] == 200, got
    assert got["headers"]["Content-Type"].startswith("application/openmetrics-text; version=1.0.0"), \
        got["headers"]
    assert got["headers"]["Connection"] == "close", got["headers"]
    samples, types, helps = parse_metrics(got["body"])
    for name, kind in types.items():
        assert name.startswith("espgate_") and helps[name], name
        # Counters' samples carry the _total (parse_metrics checks it).
        assert kind in ("counter", "gauge") and not name.endswith("_total"), (name, kind)

    def between(metric, key_fn, **labels):
        m = value(samples, metric, **labels)
        lo, hi = key_fn(before), key_fn(after)
        assert lo <= m <= hi, (metric, labels, lo, m, hi)
        return m

    # Every counter of the status document.
    for key, metric in COUNTERS.items():
        between(metric, lambda s: s["counters"][key])
    assert set(before["counters"]) == set(COUNTERS), before["counters"]
    # Global drops: every reason, zeros included; bad_length is 1 in both.
    reasons = {dict(l)["reason"] for (n, l) in samples if n == "espgate_drops_total"}
    assert {"bad_length", "unknown_spi", "replay", "icv_failure", "no_policy", "send_error"} <= reasons
    for r in reasons:
        between("espgate_drops_total", lambda s: s["drops"].get(r, 0), reason=r)
    assert value(samples, "espgate_drops_total", reason="bad_length") == 1
    assert value(samples, "espgate_drops_total", reason="replay") == 0
    # Per SA: packets, bytes, drops by reason (bad_length counted on no SA:
    # the datagram has no SPI), lifetime left.
    sas_before = {sa["spi"]: sa for c in before["connections"] for sa in c["sas"]}
    sas_after = {sa["spi"]: sa for c in after["connections"] for sa in c["sas"]}
    assert len(sas_before) == 2
    for spi, sa in sas_before.items():
        lab_ = sa_labels(sa)
        for field in ("packets", "bytes"):
            m = value(samples, f"espgate_sa_{field}_total", **lab_)
            assert sa[field] <= m <= sas_after[spi][field], (spi, field)
        assert value(samples, "espgate_sa_packets_total", **lab_) >= 3
        for r in reasons & {"bad_length", "replay", "icv_failure", "unknown_spi"}:
            assert value(samples, "espgate_sa_drops_total", **lab_, reason=r) == sa["drops"].get(r, 0)
        secs = value(samples, "espgate_sa_lifetime_remaining_seconds", **lab_, limit="hard")
        assert 3500 < secs <= 3600 and secs == pytest.approx(sa["lifetime"]["hard_left"]["secs"], abs=2)
        left = value(samples, "espgate_sa_lifetime_remaining_bytes", **lab_, limit="soft")
        assert sas_after[spi]["lifetime"]["soft_left"]["bytes"] <= left <= sa["lifetime"]["soft_left"]["bytes"]
        assert value(samples, "espgate_sa_lifetime_state", **lab_, state="ok") == 1
    out_sa = next(sa for sa in sas_before.values() if sa["direction"] == "out")
    assert value(samples, "espgate_sa_next_sequence_number", **sa_labels(out_sa)) >= out_sa["next_seq"]
    assert value(samples, "espgate_tun_mtu_bytes", tun="tunA") == before["tun"]["mtu"]

    # B's endpoint on its outer address, HEAD, and the errors.
    got = fetch(b.ns, "http://192.0.2.2:9184/metrics?name[]=x")
    assert got["code"] == 200 and "espgate_sa_packets_total{" in got["body"], got
    got = fetch(a.ns, "http://127.0.0.1:9184/metrics", "HEAD")
    assert got["code"] == 200 and got["body"] == "" and int(got["headers"]["Content-Length"]) > 1000, got
    got = fetch(a.ns, "http://127.0.0.1:9184/", "GET")
    assert got["code"] == 404 and "/metrics" in got["body"], got
    got = fetch(a.ns, "http://127.0.0.1:9184/nope/metrics", "GET")
    assert got["code"] == 404, got
    for method in ("POST", "PUT", "DELETE"):
        got = fetch(a.ns, "http://127.0.0.1:9184/metrics", method)
        assert got["code"] == 405 and got["headers"]["Allow"] == "GET, HEAD", got
    assert a.proc.poll() is None
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(PING is None, reason="needs ping")
def test_silent_metrics_clients_block_nothing(lab):
    """More clients than the endpoint serves at once, all silent: the
    tunnel, the control socket and, once they are gone, the endpoint work."""
    a, b = configs(lab, protocol="esp", encap="udp")
    add_gateway_keys(a, 'metrics = "127.0.0.1:9184"')
    a.start()
    b.start()
    hold = subprocess.Popen(["ip", "netns", "exec", a.ns, sys.executable, "-c", SILENT, "127.0.0.1", "9184", "20"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lab.procs.append(hold)
    assert hold.stdout.readline().strip() == "open"
    t = time.time()
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    assert a.status()["counters"]["tun_rx"] >= 3
    assert time.time() - t < 10
    hold.stdin.close()
    hold.wait(timeout=30)
    # The held connections are closed; the endpoint answers again (the
    # queued ones are served or time out within the client timeout).
    got = wait_until("a scrape", lambda: (lambda g: g if g["code"] == 200 else None)(
        fetch(a.ns, "http://127.0.0.1:9184/metrics")), timeout=30)
    assert "espgate_sa_packets_total" in got["body"]
    assert a.stop() == 0 and b.stop() == 0


def our_daemon(pid, cfg):
    """Whether `pid` is alive (not a zombie) and runs `espgate up` on `cfg`."""
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X") and b"up" in cmdline and str(cfg).encode() in cmdline


def pids_running(cfg):
    """Live processes running `espgate up` on `cfg`."""
    return [int(p.name) for p in pathlib.Path("/proc").iterdir() if p.name.isdigit() and our_daemon(p.name, cfg)]


class Detached:
    """`espgate up --daemon` in a namespace; stops it (bounded) on cleanup."""

    def __init__(self, lab, d, *extra):
        self.lab, self.d, self.extra = lab, d, list(extra)
        self.pid = None

    def up(self):
        return run("ip", "netns", "exec", self.d.ns, self.lab.espgate, "up", "--daemon", "-c", str(self.d.cfg),
                   *self.extra, check=False, timeout=90)

    def stop(self, pid):
        if our_daemon(pid, self.d.cfg):
            os.kill(pid, signal.SIGTERM)
        wait_until(f"pid {pid} to exit", lambda: not our_daemon(pid, self.d.cfg), timeout=15)


@pytest.fixture
def detached(lab):
    made = []

    def make(d, *extra):
        x = Detached(lab, d, *extra)
        made.append(x)
        return x

    try:
        yield make
    finally:
        for x in made:
            for pid in pids_running(x.d.cfg):
                os.kill(pid, signal.SIGTERM)
            deadline = time.time() + 15
            while pids_running(x.d.cfg) and time.time() < deadline:
                time.sleep(0.05)
            for pid in pids_running(x.d.cfg):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(PING is None, reason="needs ping")
def test_daemon_mode_up_status_and_sigterm(lab, detached):
    a, b = configs(lab, protocol="esp", encap="udp", fwmark=0x4500)
    base = snapshot(a.ns)
    log = lab.tmp / "logs" / "gwA.log"  # its directory is created
    a.log = log  # for assert_ping's report
    x = detached(a, "--log-file", str(log))
    r = x.up()
    assert r.returncode == 0, r.stdout + r.stderr
    # Fully up when the parent returns: no waiting.
    st = a.status()
    pid = st["pid"]
    pid_file = a.cfg.parent / "ctl.pid"  # the default: next to the control socket
    assert pid_file.read_text() == f"{pid}\n"
    assert f"pid {pid}" in r.stdout and str(pid_file) in r.stdout and str(log) in r.stdout, r.stdout
    assert our_daemon(pid, a.cfg)
    assert os.getsid(pid) == pid, "the daemon leads its own session"
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    assert os.readlink(f"/proc/{pid}/fd/2") == str(log)
    assert ip_json(a.ns, "link", "show", "dev", "tunA")
    assert any(r.get("table") == str(0x4500) for r in ip_json(a.ns, "rule"))
    b.start()
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    assert a.status()["connections"][0]["sas"][0]["packets"] >= 3

    # A second one is refused while the first runs, and changes nothing.
    r = detached(a, "--log-file", str(log), "--pid-file", str(lab.tmp / "other.pid")).up()
    assert r.returncode == 1 and "another espgate daemon is running" in r.stderr, r.stderr
    assert not (lab.tmp / "other.pid").exists()
    # The same pid file is refused before anything is tried.
    r = detached(a, "--log-file", str(log), "--pid-file", str(pid_file)).up()
    assert r.returncode == 1 and f"belongs to espgate process {pid}" in r.stderr, r.stderr
    assert pid_file.read_text() == f"{pid}\n"

    x.stop(pid)
    assert not pid_file.exists()
    assert not a.sock.exists()
    after = snapshot(a.ns)
    assert after == base, (base, after)
    text = log.read_text()
    assert "up: TUN tunA" in text and "SIGTERM: stopping" in text and "network changes undone" in text, text
    assert b.stop() == 0


def test_daemon_start_failure_reports_and_leaves_nothing(lab, detached):
    a, _ = configs(lab, protocol="esp", encap="udp", fwmark=0x4500)
    # Valid, but no such address in the namespace: the metrics endpoint
    # cannot listen, after the TUN, routes and rules are in place.
    add_gateway_keys(a, 'metrics = "198.51.100.7:9184"')
    base = snapshot(a.ns)
    log, pid_file = lab.tmp / "gwA.log", lab.tmp / "gwA.pid"
    r = detached(a, "--log-file", str(log), "--pid-file", str(pid_file)).up()
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'gateway.metrics = "198.51.100.7:9184": cannot listen' in r.stderr, r.stderr
    assert "Cannot assign requested address" in r.stderr, r.stderr
    assert str(log) in r.stderr
    assert r.stdout == ""
    # Everything undone before the parent returned.
    assert snapshot(a.ns) == base
    assert not pid_file.exists() and not a.sock.exists()
    assert pids_running(a.cfg) == []
    assert "cannot listen" in log.read_text()

    # A configuration that does not validate never forks: exit 2, the
    # error on stderr, no log or pid file.
    add_gateway_keys(a, "mtu = 10")
    log2 = lab.tmp / "never" / "gw.log"
    r = detached(a, "--log-file", str(log2), "--pid-file", str(pid_file)).up()
    assert r.returncode == 2 and "gateway.mtu" in r.stderr, r.stderr
    assert not log2.parent.exists() and not pid_file.exists()
    # --log-file needs --daemon.
    r = run(lab.espgate, "up", "-c", str(a.cfg), "--log-file", str(log2), check=False)
    assert r.returncode == 2 and "--daemon" in r.stderr, r.stderr


def test_foreground_notifies_systemd_when_up(lab):
    """Type=notify: READY=1 arrives on $NOTIFY_SOCKET once everything is up."""
    a, _ = configs(lab, protocol="esp", encap="udp")
    add_gateway_keys(a, 'metrics = "127.0.0.1:9184"')
    path = lab.tmp / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(15)
    try:
        logf = open(a.log, "ab")
        p = subprocess.Popen(["ip", "netns", "exec", a.ns, lab.espgate, "up", "-c", str(a.cfg)],
                             stdout=logf, stderr=subprocess.STDOUT, env=dict(os.environ, NOTIFY_SOCKET=str(path)))
        lab.procs.append(p)
        msg = sock.recv(256).decode()
        fields = dict(line.split("=", 1) for line in msg.splitlines())
        assert fields["READY"] == "1", msg
        # Up means up: the control socket and the metrics answer at once.
        st = a.status()
        assert int(fields["MAINPID"]) == st["pid"]
        assert fetch(a.ns, "http://127.0.0.1:9184/metrics")["code"] == 200
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == 0
        logf.close()
    finally:
        sock.close()


def unit_text():
    return UNIT.read_text()


def unit_settings():
    """The unit as {section: {key: [values]}} (a strict line parser)."""
    out, section = {}, None
    for n, raw in enumerate(unit_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, {})
            continue
        assert section and "=" in line, f"{UNIT}:{n}: {raw!r}"
        key, val = line.split("=", 1)
        assert re.fullmatch(r"[A-Za-z]+", key), f"{UNIT}:{n}: {raw!r}"
        out[section].setdefault(key, []).append(val)
    return out


def test_systemd_unit_settings(espgate, tmp_path):
    s = unit_settings()
    svc = s["Service"]
    assert svc["ExecStart"] == ["/usr/local/bin/espgate up -c /etc/espgate/%i.toml"]
    assert svc["Type"] == ["notify"] and svc["Restart"] == ["on-failure"]
    # The defaults of gateway.state_dir and gateway.control_socket, as
    # espgate itself reports them for a file that sets neither.
    assert svc["StateDirectory"] == ["espgate"] and svc["RuntimeDirectory"] == ["espgate"]
    cfg = tmp_path / "gw.toml"
    cfg.write_text("[gateway]\ntun = \"espgate0\"\n")
    gw = tomllib.loads(run(espgate, "config", "check", "-c", str(cfg)).stdout)["gateway"]
    assert gw["control_socket"] == "/run/espgate/espgate.sock"
    assert gw["state_dir"] == "/var/lib/espgate"
    assert gw["control_socket"].startswith(f"/run/{svc['RuntimeDirectory'][0]}/")
    assert gw["state_dir"] == f"/var/lib/{svc['StateDirectory'][0]}"
    assert set(svc["CapabilityBoundingSet"][0].split()) == {"CAP_NET_ADMIN", "CAP_NET_RAW"}
    assert svc["DeviceAllow"] == ["/dev/net/tun rw"]
    assert "AF_NETLINK" in svc["RestrictAddressFamilies"][0]
    assert s["Install"]["WantedBy"] == ["multi-user.target"]


KEY_IN = "000102030405060708090a0b0c0d0e0f10111213"
KEY_OUT = "101112131415161718191a1b1c1d1e1f20212223"


def test_config_check(espgate, tmp_path):
    """`espgate config check`: the effective configuration with the keys
    redacted, as TOML and JSON, warnings on stderr; errors exit 2."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f"""[[connection]]
name = "b"
local = "192.0.2.1"
remote = "192.0.2.2"
local_ts = ["10.1.0.0/16"]
remote_ts = ["10.2.0.0/16"]
replay_window = 0

[connection.esp]
suite = "aes128gcm16"
spi_in = 0x1001
spi_out = 0x1002
enc_in = "{KEY_IN}"
enc_out = "{KEY_OUT}"
""")
    cfg.chmod(0o600)
    r = run(espgate, "config", "check", "-c", str(cfg))
    assert "replay_window" in r.stderr and "disables anti-replay" in r.stderr, r.stderr
    eff = tomllib.loads(r.stdout)
    b = eff["connection"][0]
    assert (b["remote_port"], b["mode"], b["replay_window"]) == (4500, "tunnel", 0)
    assert b["esp"]["enc_in"] == "<redacted>" and b["esp"]["spi_out"] == 0x1002
    assert eff["gateway"]["listen"] == "0.0.0.0:4500"
    j = json.loads(run(espgate, "config", "check", "--json", "-c", str(cfg)).stdout)
    assert j["connection"][0]["esp"]["enc_out"] == "<redacted>"
    # The same values; what TOML leaves out (no metrics, no fwmark) is null in JSON.
    assert {k: v for k, v in j["gateway"].items() if v is not None} == eff["gateway"]
    assert j["gateway"]["metrics"] is None and j["gateway"]["fwmark"] is None
    for out in (r.stdout, r.stderr, json.dumps(j)):
        assert KEY_IN[:10] not in out and KEY_OUT[:10] not in out
    # Errors: exit status 2, every one with its position, no key.
    cfg.write_text(cfg.read_text().replace("spi_in = 0x1001", "spi_in = 0x10").replace(KEY_OUT, KEY_OUT[:30]))
    r = run(espgate, "config", "check", "-c", str(cfg), check=False)
    assert r.returncode == 2 and r.stdout == "", r
    assert "gw.toml:11:10: connection[0].esp.spi_in (connection \"b\"): SPI 0x10 is reserved" in r.stderr, r.stderr
    assert "connection[0].esp.enc_out" in r.stderr and KEY_OUT[:10] not in r.stderr, r.stderr


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze (package systemd)")
def test_systemd_unit_verifies(espgate, tmp_path):
    """`systemd-analyze verify` (no unknown keys, bad values or missing
    binary: it only warns about most, so its output must be empty) and the
    offline security score, with ExecStart pointing at the built binary."""
    unit = tmp_path / "espgate@gw.service"
    unit.write_text(unit_text().replace("/usr/local/bin/espgate", espgate))
    r = run("systemd-analyze", "verify", "--man=no", str(unit), check=False)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr
    # It does catch mistakes.
    bad = tmp_path / "espgate@bad.service"
    bad.write_text(unit.read_text().replace("NoNewPrivileges=", "NoNewPrivilegez="))
    r = run("systemd-analyze", "verify", "--man=no", str(bad), check=False)
    assert "NoNewPrivilegez" in r.stdout + r.stderr
    # Overall exposure at most 3.0 (--threshold counts tenths).
    r = run("systemd-analyze", "security", "--offline=yes", "--threshold=30", "--no-pager", str(unit), check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    print(r.stdout.strip().splitlines()[-1])


def syscall_set(group, seen=None):
    """Syscall names of a systemd filter group, nested groups expanded."""
    seen = set() if seen is None else seen
    out = set()
    for line in run("systemd-analyze", "syscall-filter", group).stdout.splitlines()[1:]:
        w = line.strip()
        if not w or w.startswith("#"):
            continue
        if w.startswith("@"):
            if w not in seen:
                seen.add(w)
                out |= syscall_set(w, seen)
        else:
            out.add(w)
    return out


@pytest.mark.skipif(PING is None or not shutil.which("systemd-analyze") or not shutil.which("strace")
                    or not shutil.which("setpriv"),
                    reason="needs ping, systemd-analyze, strace (scripts/setup.sh) and setpriv")
def test_unit_sandbox_runs_the_gateway(lab):
    """What the unit's sandbox allows is enough: the gateway runs with only
    the capabilities of CapabilityBoundingSet and no_new_privs, uses only
    syscalls of SystemCallFilter=@system-service and socket families of
    RestrictAddressFamilies, and stops cleanly."""
    svc = unit_settings()["Service"]
    caps = [c.lower().removeprefix("cap_") for c in svc["CapabilityBoundingSet"][0].split()]
    families = set(svc["RestrictAddressFamilies"][0].split())
    # SystemCallFilter= lines: an allow list, then deny lists (~).
    allowed = set()
    for f in svc["SystemCallFilter"]:
        if f.startswith("~"):
            for g in f[1:].split():
                allowed -= syscall_set(g) if g.startswith("@") else {g}
        else:
            for g in f.split():
                allowed |= syscall_set(g) if g.startswith("@") else {g}
    # Raw ESP (CAP_NET_RAW), fwmark rules (netlink) and metrics: every path.
    a, b = configs(lab, protocol="esp", encap="none", fwmark=0x4500)
    add_gateway_keys(a, 'metrics = "127.0.0.1:9184"')
    base = snapshot(a.ns)
    trace = lab.tmp / "strace.out"
    logf = open(a.log, "ab")
    p = subprocess.Popen(["ip", "netns", "exec", a.ns, "setpriv", "--no-new-privs",
                          "--bounding-set=-all," + ",".join("+" + c for c in caps), "--inh-caps=-all",
                          "strace", "-f", "-qq", "-o", str(trace), lab.espgate, "up", "-c", str(a.cfg)],
                         stdout=logf, stderr=subprocess.STDOUT)
    lab.procs.append(p)
    try:
        st = wait_until("the sandboxed gateway", lambda: (lambda r: r.returncode == 0 and json.loads(r.stdout))(
            run(lab.espgate, "status", "--json", "-s", str(a.sock), check=False)), timeout=20)
        pid = st["pid"]
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
        bnd = int(re.search(r"CapBnd:\s+([0-9a-f]+)", status).group(1), 16)
        assert bnd == (1 << 12) | (1 << 13), hex(bnd)  # CAP_NET_ADMIN, CAP_NET_RAW
        assert re.search(r"NoNewPrivs:\s+1", status)
        b.start()
        assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
        assert fetch(a.ns, "http://127.0.0.1:9184/metrics")["code"] == 200
        os.kill(pid, signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    finally:
        logf.close()
    assert snapshot(a.ns) == base
    text = trace.read_text()
    used = set(re.findall(r"^\d+\s+(?:<\.\.\. )?([a-z0-9_]+)(?:\(| resumed>)", text, re.M))
    assert {"socket", "poll", "read", "write"} <= used, used
    # strace's own exec of the gateway is the one call before the filter
    # would apply (systemd installs it before execve).
    outside = sorted(used - allowed - {"execve"})
    assert not outside, f"syscalls outside SystemCallFilter={svc['SystemCallFilter']}: {outside}"
    socket_families = set(re.findall(r"socket\((AF_\w+)", text))
    assert socket_families and socket_families <= families, socket_families
    assert b.stop() == 0


# A control client that pipelines `status` requests as fast as it can and
# never reads an answer (issue 16, item 5): prints how many it wrote.
FLOOD_CONTROL = r"""
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.setblocking(False)
req = b'{"cmd":"status"}\n' * 256
sent, end = 0, time.time() + float(sys.argv[2])
while time.time() < end:
    try:
        sent += s.send(req)
    except BlockingIOError:
        time.sleep(0.01)
    except OSError:
        break
print(sent // 17, flush=True)
"""


def rss_kib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_control_client_that_never_reads_is_bounded(lab):
    """A client pipelines `status` for 8 s and never reads: the daemon's
    resident memory stays within a few MB of where it started (each
    answer is written before the next request is read, so at most one
    answer and the socket buffers are pending per client), another
    client's `status` is answered meanwhile, and the tunnel forwards."""
    a, b = configs(lab, protocol="esp", encap="udp")
    a.start()
    b.start()
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    pid = a.proc.pid
    base = rss_kib(pid)
    flood = subprocess.Popen([sys.executable, "-c", FLOOD_CONTROL, str(a.sock), "8"],
                             stdout=subprocess.PIPE, text=True)
    lab.procs.append(flood)
    peak, answered = base, 0
    deadline = time.time() + 8
    while time.time() < deadline:
        peak = max(peak, rss_kib(pid))
        t = time.time()
        if a.status()["counters"] is not None and time.time() - t < 3:
            answered += 1
        time.sleep(0.3)
    out, _ = flood.communicate(timeout=30)
    peak = max(peak, rss_kib(pid))
    print(f"requests written {int(out.strip())}, RSS {base} -> {peak} KiB, status answered {answered} times")
    assert int(out.strip()) > 0
    assert answered >= 5, "status from another client was not answered during the flood"
    assert peak - base < 32 * 1024, f"resident memory grew from {base} KiB to {peak} KiB"
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    assert a.stop() == 0 and b.stop() == 0
