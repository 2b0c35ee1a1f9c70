"""`espgate sa add` / `sa del` on running daemons, and `espgate
wireshark-keys` proven with the real tshark.

Two `espgate up` in two network namespaces joined by a veth pair (the
`configs` / `Lab` helpers of test_gateway.py):

    gwA (TUN 10.1.0.1/24) --- veth va 192.0.2.1 | 192.0.2.2 vb --- gwB (TUN 10.2.0.1/24)

- A manual rekey, setkey style: new inbound SAs on both gateways first,
  then new outbound SAs (traffic keeps flowing through the mixed state),
  then `sa del` of the old SAs; `sa list` shows exactly the new ones.
- Errors (unknown connection, duplicate SPI, bad spec, a key that
  contradicts the connection, an unknown SPI) exit with status 1 and a
  clear message, and the daemon keeps serving; a connection whose outbound
  SA was deleted drops its traffic as `no_sa`.
- tshark, given `espgate wireshark-keys` (both the --tshark arguments and
  the esp_sa file in a Wireshark profile), decrypts a tcpdump capture of the
  outer traffic of a ping and a TCP transfer through the tunnel and shows
  the inner ICMP echo request/reply and TCP segments between the 10.x
  addresses, both directions, with correct ICVs: ESP-in-UDP with
  aes128gcm16, raw ESP with aes128-sha256, and raw ESP+AH (aes256-sha1 under
  sha256). Skipped only when tshark is not installed.

Namespaces are unique per test and deleted by the `lab` fixture, with every
process the test started, even on failure; every wait is bounded.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid

import pytest

from test_gateway import PING, assert_ping, configs, keyhex, lab, ping, run, tcp_transfer  # noqa: F401

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun") or PING is None,
    reason="needs root, iproute2, ping and /dev/net/tun (scripts/setup.sh installs them)")

TSHARK = shutil.which("tshark")


def espgate(lab, d, *args, stdin=None):
    """Runs `espgate ARGS -s SOCKET` against daemon `d` (not raising)."""
    return run(lab.espgate, *args, "-s", str(d.sock), check=False, input=stdin)


def sa_list(lab, d):
    r = espgate(lab, d, "sa", "list", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["sas"]


def spis(lab, d, direction):
    return sorted(sa["spi"] for sa in sa_list(lab, d) if sa["direction"] == direction)


def by_spi(lab, d, spi):
    return next(sa for sa in sa_list(lab, d) if sa["spi"] == spi)


def sa_add(lab, d, conn, direction, spec, stdin=False):
    if stdin:
        r = espgate(lab, d, "sa", "add", "--conn", conn, "--dir", direction, "-", stdin=spec + "\n")
    else:
        r = espgate(lab, d, "sa", "add", "--conn", conn, "--dir", direction, spec)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{d.log_text()}"
    return r


def test_manual_rekey_with_sa_add_and_del(lab):
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16")
    config_before = a.cfg.read_bytes()
    a.start()
    b.start()
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    k_ab, k_ba = keyhex(20), keyhex(20)  # A sends with k_ab on 0x3002, B with k_ba on 0x3001

    # 1. Inbound first, on both sides: both old and new SAs are accepted.
    r = sa_add(lab, a, "to-b", "in", f"spi=0x3001,suite=aes128gcm16,enc={k_ba}")
    assert "added inbound ESP SA 0x00003001 (aes128gcm16)" in r.stdout, r.stdout
    assert "0x00001001, 0x00003001" in r.stdout, r.stdout
    sa_add(lab, b, "to-a", "in", f"spi=0x3002,suite=aes128gcm16,enc={k_ab}")
    assert spis(lab, a, "in") == ["0x00001001", "0x00003001"]
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))

    # 2. A switches its outbound SA; B still sends on the old one, and the
    # traffic flows through the mixed state.
    r = sa_add(lab, a, "to-b", "out", f"spi=0x3002,suite=aes128gcm16,enc={k_ab}", stdin=True)
    assert "outbound ESP SA 0x00003002 (aes128gcm16) replaces ESP SA 0x00001002" in r.stdout, r.stdout
    assert spis(lab, a, "out") == ["0x00003002"]
    out = by_spi(lab, a, "0x00003002")
    assert out["added"] and out["next_seq"] == 1 and out["seq_reserved"] > 1, out
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    assert by_spi(lab, b, "0x00003002")["packets"] >= 3
    sa_add(lab, b, "to-a", "out", f"spi=0x3001,suite=aes128gcm16,enc={k_ba}")

    # Now only the new SAs carry traffic.
    old_in_a = by_spi(lab, a, "0x00001001")["packets"]
    old_in_b = by_spi(lab, b, "0x00001002")["packets"]
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    tcp_transfer(lab, b.ns, "10.2.0.1", a.ns, "10.1.0.1", 200 * 1000, port=5211)
    assert by_spi(lab, a, "0x00001001")["packets"] == old_in_a
    assert by_spi(lab, b, "0x00001002")["packets"] == old_in_b
    # (The ACKs back to A are few: B's stack acknowledges the coalesced
    # super-segments its TUN receives.)
    for d, spi in ((a, "0x00003001"), (b, "0x00003002")):
        assert by_spi(lab, d, spi)["packets"] >= 3 + 8

    # 3. Break: the old inbound SAs go.
    r = espgate(lab, a, "sa", "del", "--spi", "0x1001", "--dir", "in")
    assert r.returncode == 0 and "removed inbound ESP SA 0x00001001" in r.stdout, r.stdout + r.stderr
    assert not r.stderr, r.stderr
    r = espgate(lab, b, "sa", "del", "--spi", "4098", "--proto", "esp", "--conn", "to-a")
    assert r.returncode == 0 and "removed inbound ESP SA 0x00001002" in r.stdout, r.stdout + r.stderr
    for d, inb, outb in ((a, "0x00003001", "0x00003002"), (b, "0x00003002", "0x00003001")):
        assert spis(lab, d, "in") == [inb] and spis(lab, d, "out") == [outb]
        text = espgate(lab, d, "sa", "list").stdout
        assert f"{inb}+" in text and "espgate sa add" in text, text
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    for d in (a, b):
        st = d.status()
        assert st["drops"] == {}, st["drops"]
        # Logged at info, without keys.
        log = d.log_text()
        assert "sa add: connection" in log and "sa del: connection" in log, log
        assert k_ab not in log and k_ba not in log

    # Run-time only: the configuration file is untouched, and a restart
    # brings back the configured SAs.
    assert a.cfg.read_bytes() == config_before
    assert a.stop() == 0
    a.start()
    assert spis(lab, a, "in") == ["0x00001001"] and spis(lab, a, "out") == ["0x00001002"]
    assert a.stop() == 0 and b.stop() == 0


def test_sa_errors_are_clear_and_the_daemon_keeps_serving(lab):
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16")
    a.start()
    b.start()
    before = sa_list(lab, a)
    good = f"spi=0x3001,suite=aes128gcm16,enc={keyhex(20)}"
    cases = [
        (["sa", "add", "--conn", "nope", "--dir", "in", good], 'no connection named "nope"'),
        (["sa", "add", "--conn", "to-b", "--dir", "in", good.replace("0x3001", "0x1001")],
         "SPI 0x00001001 is already in use"),
        (["sa", "add", "--conn", "to-b", "--dir", "out", good.replace("0x3001", "0x1001")],
         "SPI 0x00001001 is already in use"),
        (["sa", "add", "--conn", "to-b", "--dir", "in", "spi=0x3001,suite=aes128gcm16,enc=zz"],
         "bad SA spec: enc:"),
        (["sa", "add", "--conn", "to-b", "--dir", "in", "spi=0x3001,suite=rot13,enc=00"],
         "bad SA spec: suite:"),
        (["sa", "add", "--conn", "to-b", "--dir", "in", good + ",mode=transport"],
         'mode=transport: connection "to-b" is in tunnel mode'),
        (["sa", "add", "--conn", "to-b", "--dir", "out", good + ",seq=7"], "reserved on disk"),
        (["sa", "del", "--spi", "0xdead"], "no SA with SPI 0x0000dead"),
        (["sa", "del", "--spi", "0x1001", "--dir", "out"], "is not an outbound SA"),
    ]
    for args, want in cases:
        r = espgate(lab, a, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("espgate: the daemon refused: ") and want in r.stderr, (args, r.stderr)
        assert a.proc.poll() is None
    assert [(s["direction"], s["spi"]) for s in sa_list(lab, a)] == [(s["direction"], s["spi"]) for s in before]
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))

    # A connection left without its outbound SA sends nothing, counted.
    r = espgate(lab, a, "sa", "del", "--spi", "0x1002")
    assert r.returncode == 0, r.stderr
    assert "espgate: warning:" in r.stderr and "no_sa" in r.stderr, r.stderr
    assert ping(a.ns, "10.2.0.1", "10.1.0.1", count=2).returncode != 0
    assert a.status()["drops"].get("no_sa", 0) >= 2
    assert "dropped (no_sa)" in a.log_text()
    # Back with a new outbound SA (B accepts it first).
    key = keyhex(20)
    sa_add(lab, b, "to-a", "in", f"spi=0x3002,suite=aes128gcm16,enc={key}")
    sa_add(lab, a, "to-b", "out", f"spi=0x3002,suite=aes128gcm16,enc={key}")
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    assert a.stop() == 0 and b.stop() == 0


# --- tshark ---------------------------------------------------------------

TSHARK_CASES = {
    "esp-udp-aes128gcm16": dict(protocol="esp", encap="udp", esp="aes128gcm16"),
    "esp-raw-aes128-sha256": dict(protocol="esp", encap="none", esp="aes128-sha256"),
    "esp+ah-raw-aes256-sha1": dict(protocol="esp+ah", encap="none", esp="aes256-sha1", ah="sha256"),
}

FIELDS = ["ip.src", "ip.dst", "icmp.type", "tcp.len", "esp.spi", "esp.icv_good", "esp.icv_bad"]


def tshark_rows(cap, args, env=None):
    r = run(TSHARK, "-n", "-r", str(cap), *args, "-T", "fields", "-E", "separator=/t",
            *[x for f in FIELDS for x in ("-e", f)], timeout=60, check=False, env=env)
    assert r.returncode == 0, r.stderr
    rows = []
    for line in r.stdout.splitlines():
        cols = dict(zip(FIELDS, line.split("\t")))
        src, dst = cols["ip.src"].split(","), cols["ip.dst"].split(",")
        rows.append(dict(cols, outer=(src[0], dst[0]), inner=(src[-1], dst[-1])))
    return rows


def assert_decrypted(rows, what):
    """Inner ICMP echo both ways and TCP segments both ways (data A -> B)
    between 10.1.0.1 and 10.2.0.1, on both SPIs, every ICV correct."""
    ab, ba = ("10.1.0.1", "10.2.0.1"), ("10.2.0.1", "10.1.0.1")
    icmp = {(r["inner"], r["icmp.type"]) for r in rows if r["icmp.type"]}
    assert (ab, "8") in icmp and (ba, "0") in icmp, (what, icmp)
    tcp = [r for r in rows if r["tcp.len"]]
    assert any(r["inner"] == ab and int(r["tcp.len"]) > 0 for r in tcp), (what, tcp[:5])
    assert any(r["inner"] == ba for r in tcp), (what, tcp[:5])
    assert {r["esp.spi"] for r in rows if r["esp.spi"]} >= {"0x00001001", "0x00001002"}, what
    esp = [r for r in rows if r["esp.spi"]]
    # Booleans print as 1 / 0 in tshark 4.0's fields output.
    assert esp and all(r["esp.icv_good"] == "1" and r["esp.icv_bad"] == "0" for r in esp), \
        (what, [r for r in esp if r["esp.icv_good"] != "1"][:3])


@pytest.mark.skipif(TSHARK is None, reason="needs tshark (scripts/setup.sh installs it)")
@pytest.mark.skipif(not shutil.which("tcpdump"), reason="needs tcpdump")
@pytest.mark.parametrize("case", list(TSHARK_CASES))
def test_tshark_decrypts_with_wireshark_keys(lab, case):
    # One ESP packet per captured frame: with UDP GSO a capture on the
    # veth would see each batch unsegmented.
    a, b = configs(lab, extra_gw="offloads = false", **TSHARK_CASES[case])
    a.start()
    b.start()
    cap = lab.tmp / "outer.pcap"
    dump = subprocess.Popen(["ip", "netns", "exec", a.ns, "tcpdump", "-n", "-i", "va", "-U", "--immediate-mode",
                             "-w", str(cap),
                             "esp or ah or udp port 4500"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lab.procs.append(dump)
    deadline = time.time() + 10
    while time.time() < deadline and not (cap.exists() and cap.stat().st_size >= 24):
        time.sleep(0.05)
    assert cap.exists(), "tcpdump did not start"
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    tcp_transfer(lab, b.ns, "10.2.0.1", a.ns, "10.1.0.1", 20000, port=5212)
    time.sleep(0.3)
    dump.send_signal(signal.SIGINT)
    dump.wait(timeout=10)

    # Without keys: no inner ICMP (the proof is the keys' doing).
    rows = tshark_rows(cap, [])
    assert rows and not [r for r in rows if r["icmp.type"]], rows[:3]

    # --tshark: shell-quoted arguments.
    r = espgate(lab, a, "wireshark-keys", "--tshark")
    assert r.returncode == 0, r.stderr
    args = shlex.split(r.stdout)
    assert sum(1 for x in args if x.startswith("uat:esp_sa:")) == 2, args  # ESP in and out
    if "ah" in case:
        assert r.stderr.count("left out") == 2 and "AH does not encrypt" in r.stderr, r.stderr
    assert_decrypted(tshark_rows(cap, args), f"{case} --tshark")

    # The esp_sa file, in a Wireshark profile.
    r = espgate(lab, a, "wireshark-keys")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    rows = [l for l in lines if not l.startswith("#")]
    assert len(rows) == 2 and all(l.startswith('"IPv4","192.0.2.') for l in rows), r.stdout
    profile = lab.tmp / "wshome" / "wireshark" / "profiles" / "espgate"
    profile.mkdir(parents=True)
    (profile / "esp_sa").write_text(r.stdout)
    (profile / "preferences").write_text("esp.enable_encryption_decode: TRUE\n"
                                         "esp.enable_authentication_check: TRUE\n")
    env = dict(os.environ, XDG_CONFIG_HOME=str(lab.tmp / "wshome"))
    assert_decrypted(tshark_rows(cap, ["-C", "espgate"], env=env), f"{case} esp_sa file")

    # The key command is its own: status and sa list show no keys.
    keys = json.loads(espgate(lab, a, "wireshark-keys", "--json").stdout)["sas"]
    secret = {k[f] for k in keys for f in ("enc_key", "integ_key") if k[f]}
    assert len(secret) >= 2, keys
    for args in (["status", "--json"], ["sa", "list", "--json"]):
        out = espgate(lab, a, *args).stdout
        assert not any(s in out for s in secret), args
    assert a.stop() == 0 and b.stop() == 0


def test_a_wrong_key_peer_is_counted_and_the_gateway_keeps_serving(lab):
    """B sends on an inbound SPI of A with a key A does not have (a peer
    keyed wrongly): every packet passes A's replay check (a fresh SA) and
    fails its ICV check, is counted as icv_failure and logged, and once B
    has the right key traffic flows (a failed ICV never moves the window)."""
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16")
    a.start()
    b.start()
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    right, wrong = keyhex(20), keyhex(20)
    sa_add(lab, a, "to-b", "in", f"spi=0x1003,suite=aes128gcm16,enc={right}")
    r = espgate(lab, b, "sa", "del", "--spi", "0x1001", "--dir", "out")
    assert r.returncode == 0, r.stderr
    sa_add(lab, b, "to-a", "out", f"spi=0x1003,suite=aes128gcm16,enc={wrong}")
    r = ping(b.ns, "10.1.0.1", "10.2.0.1")
    assert r.returncode != 0, r.stdout
    drops = a.status()["drops"]
    assert drops.get("icv_failure", 0) >= 3 and set(drops) == {"icv_failure"}, drops
    assert "dropped (icv_failure)" in a.log_text()
    assert a.proc.poll() is None
    r = espgate(lab, b, "sa", "del", "--spi", "0x1003", "--dir", "out")
    assert r.returncode == 0, r.stderr
    sa_add(lab, b, "to-a", "out", f"spi=0x1003,suite=aes128gcm16,enc={right}")
    before = a.status()["drops"]["icv_failure"]
    assert_ping(b.ns, "10.1.0.1", "10.2.0.1", (a, b))
    assert a.status()["drops"]["icv_failure"] == before
    assert by_spi(lab, a, "0x00001003")["packets"] >= 3
    assert a.stop() == 0 and b.stop() == 0
