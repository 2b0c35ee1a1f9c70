"""IKEv2 between two espgate daemons in network namespaces.

- PSK: A initiates at start (`start_action = "start"`); ping both ways over
  the negotiated child SA; `status` shows the IKE SA, its child and the
  algorithms; `terminate` removes the SAs on both sides and `initiate`
  brings them back.
- A wrong PSK: no SA, the failure is counted and logged, both daemons run on.
- Rekeying without loss (seed 001's 5 s SA lifetime): a 60 s UDP stream at
  20 Mbit/s crosses at least 10 child rekeys with 0 lost packets.
- DPD: B is killed, A declares it dead and removes the SAs; B comes back,
  A (dpd_action = "restart") re-establishes the tunnel.
- Through a real NAT (nftables masquerading with random ports): B sends its
  ESP and keepalives to the port the NAT gave A, and when the NAT maps A
  anew, ESP follows A's next IKE message without a rekey (RFC 7296 §2.23).
- Q-ESP (docs/QESP.md §7) over raw IP: with `qesp = "prefer"` on both sides
  the child SAs are Q-ESP (status says `qesp`, the wire carries protocol
  253) and rekey every 3 s under a UDP stream without loss; against
  `qesp = "off"` the child is ESP and the log says Q-ESP was declined.

Namespaces and processes belong to the test (the `lab` fixture of
test_gateway.py deletes them, even on failure); every wait is bounded.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from test_gateway import (PING, Daemon, assert_lost_only_in_kernel_buffers, assert_ping, kernel_counters,  # noqa: F401
                          lab, ping, run)

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun"),
        reason="needs root, iproute2 and /dev/net/tun (scripts/setup.sh installs iproute2)"),
    pytest.mark.skipif(PING is None, reason="needs ping (iputils-ping; scripts/setup.sh installs it)"),
]

PSK = "a pre-shared key for the IKE tests only"


def ike_pair(lab, *, a_ike="", b_ike="", psk_b=PSK, encap="udp", extra_gw="", extra_conn="", net=None):
    """Two daemons with one IKE connection each (A: 10.1.0.0/24, B: 10.2.0.0/24),
    in a namespace pair of their own, or in `net` = (A's namespace, B's,
    (A's local, A's remote), (B's local, B's remote))."""
    if net is None:
        a_ns, b_ns, a_addr, b_addr = lab.pair()
        net = (a_ns, b_ns, (a_addr, b_addr), (b_addr, a_addr))
    a_ns, b_ns, (a_local, a_remote), (b_local, b_remote) = net
    daemons = []
    for side, ns, local, remote, me, peer, extra, psk in (
            ("A", a_ns, a_local, a_remote, 1, 2, a_ike, PSK), ("B", b_ns, b_local, b_remote, 2, 1, b_ike, psk_b)):
        d = lab.tmp / side
        d.mkdir()
        secret = d / "psk"
        secret.write_text(psk + "\n")
        secret.chmod(0o600)
        text = f"""[gateway]
tun = "tun{side}"
tun_address = ["10.{me}.0.1/24"]
listen = "0.0.0.0:4500"
encap = "{encap}"
control_socket = "ctl.sock"
state_dir = "state"
log = "debug"
{extra_gw}

[[connection]]
name = "to-{"b" if side == "A" else "a"}"
local = "{local}"
remote = "{remote}"
mode = "tunnel"
local_ts = ["10.{me}.0.0/24"]
remote_ts = ["10.{peer}.0.0/24"]
{extra_conn}

[connection.ike]
psk_file = "psk"
{extra}
"""
        cfg = d / "gw.toml"
        cfg.write_text(text)
        cfg.chmod(0o600)
        daemons.append(Daemon(lab, ns, cfg, d / "ctl.sock", d / "log"))
    return daemons


def ike_status(d):
    return d.status().get("ike") or {"sas": [], "counters": {}, "costs": []}


def wait_for(what, pred, timeout, daemons=(), explain=None):
    """Polls `pred` until it is true; on timeout fails with the daemons' log
    tails, or with `explain()` when given."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    logs = explain() if explain else "\n".join(f"--- {d.ns} ---\n{d.log_text()[-6000:]}" for d in daemons)
    pytest.fail(f"timed out after {timeout} s waiting for {what}\n{logs}")


def established(d):
    sas = ike_status(d)["sas"]
    return len(sas) == 1 and sas[0]["state"] == "established" and len(sas[0]["children"]) >= 1


def ctl(d, *args, check=True):
    r = run(d.lab.espgate, *args, "-s", str(d.sock), check=False)
    if check:
        assert r.returncode == 0, f"{args}: {r.stdout}{r.stderr}\n{d.log_text()[-4000:]}"
    return r


def test_psk_tunnel_up_status_terminate_initiate(lab):
    a, b = ike_pair(lab, a_ike='start_action = "start"')
    b.start()
    a.start()
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    assert_ping(b.ns, "10.1.0.1", "10.2.0.1", daemons=(a, b))
    sa = ike_status(a)["sas"][0]
    assert sa["initiator"] and sa["algorithms"] == "aes128gcm16-prfsha256-x25519", sa
    assert sa["peer_id"] == "192.0.2.2", sa
    child = sa["children"][0]
    assert child["algorithms"] == "aes128gcm16" and child["state"] == "installed", child
    assert child["local_ts"] == ["10.1.0.0-10.1.0.255"], child
    costs = {c["op"]: c for c in ike_status(a)["costs"]}
    assert costs["dh"]["count"] >= 2 and costs["dh"]["micros"] > 0, costs
    # The data plane carries the negotiated SAs.
    ins = a.sas("in")
    outs = a.sas("out")
    assert len(ins) == 1 and len(outs) == 1, a.status()["connections"]
    assert ins[0]["spi"] == child["spi_in"] and outs[0]["spi"] == child["spi_out"]
    assert outs[0]["packets"] >= 3 and ins[0]["packets"] >= 3
    r = ctl(a, "status", "--ike-costs")
    assert "IKE operations since start" in r.stdout and "auth_verify" in r.stdout, r.stdout
    doc = json.loads(ctl(a, "status", "--ike-costs", "--json").stdout)
    assert doc["ike"] and {c["op"] for c in doc["costs"]} >= {"dh", "auth_create", "auth_verify"}, doc
    # Human-readable status names the IKE SA.
    r = ctl(a, "status")
    assert "established" in r.stdout and "aes128gcm16-prfsha256-x25519" in r.stdout, r.stdout
    # terminate: both sides drop everything.
    r = ctl(a, "terminate", "to-b")
    wait_for("the SAs to go", lambda: not ike_status(a)["sas"] and not ike_status(b)["sas"], 10, (a, b))
    assert a.sas("in") == [] and a.sas("out") == [] and b.sas("in") == [] and b.sas("out") == []
    assert ping(a.ns, "10.2.0.1", "10.1.0.1", count=1).returncode != 0
    # Errors are plain.
    r = ctl(a, "terminate", "to-b", check=False)
    assert r.returncode != 0 and "no IKE SA" in (r.stdout + r.stderr), r
    r = ctl(a, "initiate", "nope", check=False)
    assert r.returncode != 0 and "no IKE connection named" in (r.stdout + r.stderr), r
    # initiate: back up, from B this time.
    ctl(b, "initiate", "to-a")
    wait_for("the IKE SA again", lambda: established(a) and established(b), 20, (a, b))
    assert not ike_status(a)["sas"][0]["initiator"]
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    assert a.stop() == 0 and b.stop() == 0


def test_wrong_psk_fails_cleanly(lab):
    a, b = ike_pair(lab, a_ike='start_action = "start"', psk_b="another key of the wrong kind!!")
    b.start()
    a.start()
    wait_for("the authentication failure", lambda: ike_status(b)["counters"].get("auth_failed", 0) >= 1, 20, (a, b))
    time.sleep(0.5)
    assert ike_status(a)["sas"] == [] and ike_status(b)["sas"] == []
    assert a.sas("in") == [] and b.sas("in") == []
    assert "AUTHENTICATION_FAILED" in a.log_text()
    assert "pre-shared key AUTH does not verify" in b.log_text()
    # Both daemons still answer.
    assert a.status() and b.status()
    assert a.stop() == 0 and b.stop() == 0


IPERF3 = shutil.which("iperf3")


@pytest.mark.skipif(IPERF3 is None, reason="needs iperf3 (scripts/setup.sh installs it)")
def test_rekey_every_5s_loses_nothing(lab):
    """Seed 001's experiment: child SAs rekeyed every 5 s under a steady
    20 Mbit/s UDP stream for 60 s; make-before-break loses no packet."""
    a, b = ike_pair(lab, a_ike='start_action = "start"\nchild_rekey_time = "5s"\nchild_life_time = "15s"\n'
                                'jitter = "1s"',
                    b_ike='child_rekey_time = "1h"')
    b.start()
    a.start()
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    server = subprocess.Popen(["ip", "netns", "exec", b.ns, IPERF3, "-s", "-1", "-B", "10.2.0.1", "-p", "5299"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lab.procs.append(server)
    time.sleep(0.5)
    before = ike_status(a)["counters"].get("child_rekeys", 0)
    kernel_before = kernel_counters([a.ns, b.ns])
    r = run("ip", "netns", "exec", a.ns, IPERF3, "-c", "10.2.0.1", "-B", "10.1.0.1", "-p", "5299", "-u",
            "-b", "20M", "-l", "1200", "-t", "60", "-J", timeout=120, check=False)
    assert r.returncode == 0, f"{r.stdout[-2000:]}{r.stderr}"
    doc = json.loads(r.stdout)
    end = doc["end"]["sum"]
    rekeys = ike_status(a)["counters"].get("child_rekeys", 0) - before
    print(f"\nrekey without loss: {end['packets']} datagrams, {end['lost_packets']} lost, {rekeys} child rekeys")
    assert rekeys >= 10, ike_status(a)["counters"]
    assert end["packets"] > 100_000, end
    assert_lost_only_in_kernel_buffers(end, (a, b), kernel_before, f"{rekeys} child rekeys")
    # Old SAs were deleted (an old inbound SA lingers a second after its
    # Delete): one pair left on each side.
    wait_for("the old SAs to go", lambda: all(len(d.sas("in")) == 1 for d in (a, b)), 10, (a, b))
    for d in (a, b):
        assert len(d.sas("out")) == 1, d.status()["connections"]
        assert d.status()["drops"].get("unknown_spi", 0) == 0, d.status()["drops"]
    assert a.stop() == 0 and b.stop() == 0


def test_dpd_detects_dead_peer_and_restart_recovers(lab):
    a, b = ike_pair(lab, a_ike='start_action = "start"\ndpd_delay = "2s"\ndpd_action = "restart"\n'
                                'retransmit_timeout = "1s"\nretransmit_tries = 2')
    b.start()
    a.start()
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(timeout=10)
    b.logf.close()
    # The killed daemon left its TUN behind in its namespace: remove it so
    # that the restart can create it again.
    run("ip", "-n", b.ns, "link", "del", "tunB", check=False)
    wait_for("the dead peer", lambda: ike_status(a)["counters"].get("peers_dead", 0) >= 1, 30, (a,))
    assert a.sas("in") == [] and a.sas("out") == []
    assert "peer dead" in a.log_text()
    (lab.tmp / "B" / "ctl.sock").unlink(missing_ok=True)
    b.start()
    wait_for("the tunnel again", lambda: established(a) and established(b), 40, (a, b))
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    assert a.stop() == 0 and b.stop() == 0


NFT = shutil.which("nft")
CONNTRACK = shutil.which("conntrack")


def behind_nat(lab, a_ike=""):
    """A behind a router R whose NAT gives every flow a random source port
    (nftables `masquerade random`), as a NAT does when port 4500 is taken
    by another client; B outside, knowing A only as R's address. Both
    daemons started with NAT keepalives every 2 s; returns (A, B, R's
    namespace) once the IKE SA is up."""
    a_ns, r_ns, b_ns = lab.netns("A"), lab.netns("R"), lab.netns("B")
    run("ip", "-n", a_ns, "link", "add", "va", "type", "veth", "peer", "name", "ra", "netns", r_ns)
    run("ip", "-n", r_ns, "link", "add", "rb", "type", "veth", "peer", "name", "vb", "netns", b_ns)
    for ns, dev, addr in ((a_ns, "va", "192.168.1.2/24"), (r_ns, "ra", "192.168.1.1/24"),
                          (r_ns, "rb", "192.0.2.1/24"), (b_ns, "vb", "192.0.2.2/24")):
        run("ip", "-n", ns, "addr", "add", addr, "dev", dev)
        run("ip", "-n", ns, "link", "set", dev, "up")
    run("ip", "-n", a_ns, "route", "add", "default", "via", "192.168.1.1")
    run("ip", "netns", "exec", r_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    run("ip", "netns", "exec", r_ns, "nft", "-f", "-", input="""
table ip espgate_test_nat {
    chain post {
        type nat hook postrouting priority srcnat; policy accept;
        oifname "rb" masquerade random
    }
}
""")
    # A names itself by its private address (its default identity).
    a, b = ike_pair(lab, a_ike='start_action = "start"\n' + a_ike, b_ike='remote_id = "192.168.1.2"',
                    extra_conn="nat_keepalive = 2",
                    net=(a_ns, b_ns, ("192.168.1.2", "192.0.2.2"), ("192.0.2.2", "192.0.2.1")))
    b.start()
    a.start()
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    return a, b, r_ns


def a_port(lab, b, a):
    """The port B sees A's ESP come from (R's mapping of A's port 4500)."""
    from test_gateway import capture_one
    from scapy.all import UDP
    esp = capture_one(lab, b.ns, "vb", "udp and src host 192.0.2.1 and greater 100",
                      lambda: ping(a.ns, "10.2.0.1", "10.1.0.1", count=2))
    return esp[UDP].sport


@pytest.mark.skipif(NFT is None or not shutil.which("tcpdump"), reason="needs nft and tcpdump (scripts/setup.sh)")
def test_initiator_behind_a_nat_that_changes_ports(lab):
    """IKE detects the NAT (RFC 7296 §2.23), moves to port 4500 and
    UDP-encapsulates the child SAs (RFC 3948). B must send its ESP to the
    port the NAT chose, not to 4500, where nothing is mapped; A's NAT
    keepalives hold the mapping, and B's go to the NAT's port too."""
    a, b, _ = behind_nat(lab)
    # The NAT really moved A's port 4500: B sees A's ESP from another one.
    mapped = a_port(lab, b, a)
    assert mapped not in (500, 4500), mapped
    # Both ways through the tunnel: B answers to the mapped port.
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    assert_ping(b.ns, "10.1.0.1", "10.2.0.1", daemons=(a, b))
    # B's NAT keepalives, once idle, go where its ESP goes.
    from test_gateway import capture_one
    from scapy.all import UDP
    ka = capture_one(lab, b.ns, "vb", "udp and src host 192.0.2.2 and less 60", lambda: None, timeout=15)
    assert bytes(ka[UDP].payload) == b"\xff" and ka[UDP].dport == mapped, ka.summary()
    for d in (a, b):
        outs = d.sas("out")
        assert len(outs) == 1 and outs[0]["packets"] >= 3, d.status()["connections"]
        assert d.status()["drops"] == {}, d.status()["drops"]
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(NFT is None or CONNTRACK is None or not shutil.which("tcpdump"),
                    reason="needs nft, conntrack and tcpdump (scripts/setup.sh)")
def test_esp_follows_the_peer_when_its_nat_maps_it_anew(lab):
    """The NAT forgets its mappings (conntrack flushed, as after a NAT
    reboot or timeout) and gives A's port 4500 another one. B keeps sending
    to the old port until A's next IKE message (a liveness check, since
    nothing comes back) arrives from the new one; from then on IKE and the
    existing child SA's ESP go there (RFC 7296 §2.23), with no rekey."""
    a, b, r_ns = behind_nat(lab, a_ike='dpd_delay = "2s"')
    first = a_port(lab, b, a)
    assert_ping(b.ns, "10.1.0.1", "10.2.0.1", daemons=(a, b))
    spi = b.sas("out")[0]["spi"]
    run("ip", "netns", "exec", r_ns, "conntrack", "-F", check=False)
    second = a_port(lab, b, a)
    assert second != first, "the NAT kept its port; run again"
    wait_for("B's ESP at the new port", lambda: ping(b.ns, "10.1.0.1", "10.2.0.1", count=1).returncode == 0,
             30, (a, b))
    assert f"outbound SA(s) now send ESP to 192.0.2.1:{second}" in b.log_text(), b.log_text()[-3000:]
    assert b.sas("out")[0]["spi"] == spi, "followed by a rekey, not by the move"
    # `sa list` shows where each SA's ESP goes now, and where it comes from.
    assert b.sas("out")[0]["udp_ports"] == [4500, second], b.sas("out")
    assert b.sas("in")[0]["udp_ports"] == [second, 4500], b.sas("in")
    assert "peer" not in b.sas("out")[0], "the address is still the configured remote"
    assert f"tunnel/udp 4500>{second}" in ctl(b, "sa", "list").stdout
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(NFT is None or CONNTRACK is None or not shutil.which("tcpdump"),
                    reason="needs nft, conntrack and tcpdump (scripts/setup.sh)")
def test_esp_follows_the_peer_when_its_nat_moves_it_to_another_address(lab):
    """The NAT's public address changes (another uplink, a new lease) and
    its mappings go with it: A's next IKE message arrives from R's new
    address and a new port. B moves IKE and the existing child SA's ESP
    there (RFC 7296 §2.23), and its NAT keepalives, with no rekey. Before,
    B's ESP kept going to the configured remote, which maps to nothing any
    more."""
    from test_gateway import capture_one
    from scapy.all import UDP
    a, b, r_ns = behind_nat(lab, a_ike='dpd_delay = "2s"')
    assert_ping(b.ns, "10.1.0.1", "10.2.0.1", daemons=(a, b))
    spi = b.sas("out")[0]["spi"]
    run("ip", "-n", r_ns, "addr", "add", "192.0.2.3/24", "dev", "rb")
    run("ip", "netns", "exec", r_ns, "nft", "-f", "-", input="""
flush table ip espgate_test_nat
table ip espgate_test_nat {
    chain post {
        type nat hook postrouting priority srcnat; policy accept;
        oifname "rb" snat to 192.0.2.3 random
    }
}
""")
    run("ip", "netns", "exec", r_ns, "conntrack", "-F", check=False)
    wait_for("B's ESP at the NAT's new address", lambda: ping(b.ns, "10.1.0.1", "10.2.0.1", count=1).returncode == 0,
             30, (a, b))
    assert "outbound SA(s) now send ESP to 192.0.2.3:" in b.log_text(), b.log_text()[-3000:]
    assert b.sas("out")[0]["spi"] == spi, "followed by a rekey, not by the move"
    assert b.sas("out")[0]["peer"] == b.sas("in")[0]["peer"] == "192.0.2.3", b.sas("out")
    port = b.sas("out")[0]["udp_ports"][1]
    assert f"tunnel/udp 4500>192.0.2.3:{port}" in ctl(b, "sa", "list").stdout
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    ka = capture_one(lab, b.ns, "vb", "udp and dst host 192.0.2.3 and less 60", lambda: None, timeout=15)
    assert bytes(ka[UDP].payload) == b"\xff", ka.summary()
    assert a.stop() == 0 and b.stop() == 0


FLOOD = r"""
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dst = (sys.argv[1], 500)
for i in range(300):
    s.sendto(bytes([(i * 7 + k) % 256 for k in range(i % 90)]), dst)
# Well-formed headers of IKE_SA_INIT requests with a broken body.
for i in range(200):
    hdr = struct.pack("!QQBBBBII", i + 1, 0, 33, 0x20, 34, 0x08, 0, 28 + 8)
    s.sendto(hdr + b"\x00\x00\x00\x08\x01\x02\x03\x04", dst)
"""


def test_garbage_is_counted_rate_limited_and_survived(lab):
    a, b = ike_pair(lab)
    b.start()
    a.start()
    run("ip", "netns", "exec", a.ns, "python3", "-c", FLOOD, "192.0.2.2")
    wait_for("the flood to be counted",
             lambda: ike_status(b)["counters"].get("dropped_malformed", 0) >= 400, 10, (b,))
    c = ike_status(b)["counters"]
    assert c["messages_in"] >= 450, c
    # One log line per kind per second, not one per datagram.
    lines = [line for line in b.log_text().splitlines() if "ike:" in line]
    assert len(lines) < 60, "\n".join(lines[-20:])
    # The daemon still works: the tunnel comes up.
    ctl(a, "initiate", "to-b")
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    assert a.stop() == 0 and b.stop() == 0


def test_two_workers_ike_sas_in_every_worker(lab):
    """gateway.workers = 2: the IKE engine on worker 0 installs each
    negotiated SA into both workers (inbound in the worker its SPI is
    steered to, outbound copies on one counter), also across rekeys."""
    from test_workers import parallel_transfers
    a, b = ike_pair(lab, a_ike='start_action = "start"\nchild_rekey_time = "4s"\nchild_life_time = "12s"\n'
                                'jitter = "1s"', extra_gw="workers = 2")
    b.start()
    a.start()
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    parallel_transfers(lab, a, b, 2 * 1000 * 1000, 5401)
    wait_for("a rekey", lambda: ike_status(a)["counters"].get("child_rekeys", 0) >= 2, 20, (a, b))
    parallel_transfers(lab, a, b, 2 * 1000 * 1000, 5411)
    for d in (a, b):
        st = d.status()
        assert st["workers"] == 2, st
        sas = st["connections"][0]["sas"]
        outs = [s for s in sas if s["direction"] == "out"]
        ins = [s for s in sas if s["direction"] == "in"]
        # Between rekeys: the current pair (an old inbound SA may linger
        # until its Delete completes).
        assert len(outs) == 1 and 1 <= len(ins) <= 2, sas
        children = [c for sa in ike_status(d)["sas"] for c in sa["children"]]
        assert outs[0]["spi"] in {c["spi_out"] for c in children}, (sas, children)
        # Every number used once across both workers.
        assert outs[0]["next_seq"] == outs[0]["packets"] + 1, outs[0]
        assert st["drops"].get("replay", 0) == 0 and st["drops"].get("icv_failure", 0) == 0, st["drops"]
    assert a.stop() == 0 and b.stop() == 0


def installed_children(d):
    return [c for sa in ike_status(d)["sas"] for c in sa["children"] if c["state"] == "installed"]


def test_two_selector_sets_are_two_children_each_carrying_its_own_traffic(lab):
    """A's connection has two selector sets (10.2.0.0/24, and 10.3.0.0/24
    in a [[connection.ike.child]] table); B's has the same two, mirrored.
    A opens one child per set on one IKE SA; each side sends each
    subnet's traffic on that subnet's child, both ways."""
    a, b = ike_pair(lab, a_ike='start_action = "start"\n[[connection.ike.child]]\nremote_ts = ["10.3.0.0/24"]',
                    b_ike='[[connection.ike.child]]\nlocal_ts = ["10.3.0.0/24"]')
    run("ip", "-n", b.ns, "addr", "add", "10.3.0.1/32", "dev", "lo")
    b.start()
    a.start()
    wait_for("two children each side", lambda: len(installed_children(a)) == 2 and len(installed_children(b)) == 2,
             20, (a, b))
    assert len(ike_status(a)["sas"]) == 1, ike_status(a)
    kids = installed_children(a)
    assert sorted(c["remote_ts"] for c in kids) == [["10.2.0.0-10.2.0.255"], ["10.3.0.0-10.3.0.255"]], kids
    # status lists both sets of the connection.
    conn = a.status()["connections"][0]
    assert conn["more_ts"] == [{"local_ts": ["10.1.0.0/24"], "remote_ts": ["10.3.0.0/24"]}], conn
    text = ctl(a, "status").stdout
    assert "10.1.0.0/24 <-> 10.2.0.0/24" in text and "10.1.0.0/24 <-> 10.3.0.0/24" in text, text
    for host in ("10.2.0.1", "10.3.0.1"):
        child = next(c for c in kids if c["remote_ts"][0].startswith(host[:5]))
        b_child = next(c for c in installed_children(b) if c["spi_in"] == child["spi_out"])
        sent = {sa["spi"]: sa["packets"] for sa in a.sas("out")}
        b_sent = {sa["spi"]: sa["packets"] for sa in b.sas("out")}
        assert_ping(a.ns, host, "10.1.0.1", daemons=(a, b))
        after = {sa["spi"]: sa["packets"] for sa in a.sas("out")}
        b_after = {sa["spi"]: sa["packets"] for sa in b.sas("out")}
        assert after[child["spi_out"]] >= sent[child["spi_out"]] + 3, (host, a.sas("out"))
        assert b_after[b_child["spi_out"]] >= b_sent[b_child["spi_out"]] + 3, (host, b.sas("out"))
        others = [s for s in after if s != child["spi_out"]]
        assert all(after[s] == sent[s] for s in others), (host, sent, after)
    assert a.stop() == 0 and b.stop() == 0


# 64 UDP flows (a socket each) of 8 datagrams: the kernel spreads flows over
# the TUN's queues by hash, so both workers of the sender get some (all in
# one queue: a chance of 2^-63).
SPRAY = r"""
import socket, sys
src, dst = sys.argv[1], sys.argv[2]
for i in range(64):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((src, 0))
    for _ in range(8):
        s.sendto(b"x" * 64, (dst, 9))
    s.close()
"""


def udp_spray(ns, src, dst):
    run("ip", "netns", "exec", ns, sys.executable, "-c", SPRAY, src, dst)


def test_per_cpu_child_sas_one_per_worker(lab):
    """RFC 9611: `per_cpu_sas = 2` with two workers on both sides. IKE
    negotiates two children with the same selectors (SA_RESOURCE_INFO),
    each slot's inbound SPI is steered to its own worker, each worker sends
    on its own outbound SA and on no other (per-worker counters), and each
    slot is rekeyed on its own."""
    from test_workers import parallel_transfers
    a, b = ike_pair(lab, a_ike='start_action = "start"\nchild_rekey_time = "10s"\nchild_life_time = "30s"\n'
                                'jitter = "1s"', extra_gw="workers = 2", extra_conn="per_cpu_sas = 2")
    b.start()
    a.start()
    wait_for("two children on each side",
             lambda: all(len(installed_children(d)) == 2 for d in (a, b)), 20, (a, b))
    assert "did not announce SA_RESOURCE_INFO" not in a.log_text()

    def check(d):
        st = d.status()
        kids = installed_children(d)
        assert sorted(c["slot"] for c in kids) == [0, 1], kids
        # Slot k's inbound SPI reaches worker k (the SPI steering is spi % 2).
        for c in kids:
            assert int(c["spi_in"], 16) % 2 == c["slot"], kids
        outs = [s for s in st["connections"][0]["sas"] if s["direction"] == "out"]
        assert sorted(s["spi"] for s in outs) == sorted(c["spi_out"] for c in kids), (outs, kids)
        for s in outs:
            assert s["next_seq"] == s["packets"] + 1, s
        assert st["drops"].get("replay", 0) == 0 and st["drops"].get("icv_failure", 0) == 0, st["drops"]
        pw = st["per_worker"]
        assert len(pw) == 2, pw
        # Worker w sent on slot w's outbound SA, and on no other.
        by_slot = {c["slot"]: c["spi_out"] for c in kids}
        for w in (0, 1):
            sent = {k[len("out_sa_"):] for k, v in pw[w].items() if k.startswith("out_sa_") and v > 0}
            assert sent == {by_slot[w]}, (d.ns, w, pw, kids)
            # Both workers received ESP, each on its own inbound SA.
            assert pw[w]["net_rx"] > 0, (d.ns, pw)

    parallel_transfers(lab, a, b, 2 * 1000 * 1000, 5431)
    udp_spray(a.ns, "10.1.0.1", "10.2.0.1")
    udp_spray(b.ns, "10.2.0.1", "10.1.0.1")
    for d in (a, b):
        check(d)
    # Rekeys replace each slot's child on its own.
    before = {c["slot"]: c["spi_in"] for c in installed_children(a)}
    wait_for("both slots rekeyed",
             lambda: len(installed_children(a)) == 2
             and all(before[c["slot"]] != c["spi_in"] for c in installed_children(a)), 30, (a, b))
    assert ike_status(a)["counters"].get("child_rekeys", 0) >= 2
    parallel_transfers(lab, a, b, 1 * 1000 * 1000, 5441)
    for d in (a, b):
        assert sorted(c["slot"] for c in installed_children(d)) == [0, 1], installed_children(d)
        assert d.status()["drops"].get("icv_failure", 0) == 0
    assert a.stop() == 0 and b.stop() == 0


def test_per_cpu_child_sas_for_each_selector_set(lab):
    """RFC 9611 with two selector sets (10.2.0.0/24, and 10.3.0.0/24 in a
    [[connection.ike.child]] table), `per_cpu_sas = 2` and two workers on
    both sides: each set gets slots 0 and 1, slot k's inbound SPI goes to
    worker k, and worker w sends each set's traffic on that set's slot-w
    SA and on no other."""
    a, b = ike_pair(lab, a_ike='start_action = "start"\n[[connection.ike.child]]\nremote_ts = ["10.3.0.0/24"]',
                    b_ike='[[connection.ike.child]]\nlocal_ts = ["10.3.0.0/24"]',
                    extra_gw="workers = 2", extra_conn="per_cpu_sas = 2")
    run("ip", "-n", b.ns, "addr", "add", "10.3.0.1/32", "dev", "lo")
    b.start()
    a.start()
    wait_for("four children on each side",
             lambda: all(len(installed_children(d)) == 4 for d in (a, b)), 20, (a, b))
    kids = installed_children(a)
    by = {(c["remote_ts"][0], c["slot"]): c for c in kids}
    nets = ("10.2.0.0-10.2.0.255", "10.3.0.0-10.3.0.255")
    assert sorted(by) == [(n, k) for n in nets for k in (0, 1)], kids
    for c in kids:
        assert int(c["spi_in"], 16) % 2 == c["slot"], kids
    udp_spray(a.ns, "10.1.0.1", "10.2.0.1")
    udp_spray(a.ns, "10.1.0.1", "10.3.0.1")
    pw = a.status()["per_worker"]
    for w in (0, 1):
        sent = {k[len("out_sa_"):] for k, v in pw[w].items() if k.startswith("out_sa_") and v > 0}
        assert sent == {by[(n, w)]["spi_out"] for n in nets}, (w, pw, kids)
    st = b.status()
    assert st["drops"].get("replay", 0) == 0 and st["drops"].get("icv_failure", 0) == 0, st["drops"]
    assert a.stop() == 0 and b.stop() == 0


# ---------------------------------------------------------------------
# Q-ESP child SAs negotiated by IKE (docs/QESP.md §7)
# ---------------------------------------------------------------------

def children(d):
    return [c for sa in ike_status(d)["sas"] for c in sa["children"]]


def assert_protocol(d, protocol):
    """Every child SA of `d` and every SA of its data plane is `protocol`,
    and so is the connection's layer."""
    st = d.status()
    conn = st["connections"][0]
    sas = conn["sas"]
    assert sas and {sa["protocol"] for sa in sas} == {protocol}, sas
    assert conn["protocol"] == protocol, conn
    ch = children(d)
    assert ch and {c["protocol"] for c in ch} == {protocol}, ch


def test_qesp_prefer_both_sides_negotiates_qesp(lab):
    a, b = ike_pair(lab, encap="none", a_ike='start_action = "start"\nqesp = "prefer"',
                    b_ike='qesp = "prefer"')
    b.start()
    a.start()
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    assert_ping(b.ns, "10.1.0.1", "10.2.0.1", daemons=(a, b))
    for d in (a, b):
        assert_protocol(d, "qesp")
        assert d.status()["drops"].get("policy_mismatch", 0) == 0, d.status()["drops"]
    child = children(a)[0]
    assert child["algorithms"] == "aes128gcm16" and child["state"] == "installed", child
    outs = a.sas("out")
    assert len(outs) == 1 and outs[0]["spi"] == child["spi_out"] and outs[0]["packets"] >= 3, outs
    assert "Q-ESP aes128gcm16" in a.log_text() and "Q-ESP declined" not in a.log_text()
    r = ctl(a, "status")
    assert "qesp aes128gcm16" in r.stdout, r.stdout
    if shutil.which("tcpdump"):
        # On the wire: IP protocol 253 (gateway.qesp_protocol's default).
        from test_gateway import capture_one
        pkt = capture_one(lab, a.ns, "va", "src host 192.0.2.1 and ip proto 253",
                          lambda: ping(a.ns, "10.2.0.1", "10.1.0.1", count=2))
        assert bytes(pkt)[14 + 9] == 253
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(IPERF3 is None, reason="needs iperf3 (scripts/setup.sh installs it)")
def test_qesp_rekey_every_3s_under_traffic_loses_nothing(lab):
    """Q-ESP child SAs rekeyed every 3 s under a 15 s UDP stream at
    10 Mbit/s: each rekey stays Q-ESP, make-before-break loses nothing."""
    a, b = ike_pair(lab, encap="none",
                    a_ike='start_action = "start"\nqesp = "prefer"\nchild_rekey_time = "3s"\n'
                          'child_life_time = "9s"\njitter = "1s"',
                    b_ike='qesp = "prefer"\nchild_rekey_time = "1h"')
    b.start()
    a.start()
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    assert_protocol(a, "qesp")
    server = subprocess.Popen(["ip", "netns", "exec", b.ns, IPERF3, "-s", "-1", "-B", "10.2.0.1", "-p", "5298"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lab.procs.append(server)
    time.sleep(0.5)
    before = ike_status(a)["counters"].get("child_rekeys", 0)
    kernel_before = kernel_counters([a.ns, b.ns])
    r = run("ip", "netns", "exec", a.ns, IPERF3, "-c", "10.2.0.1", "-B", "10.1.0.1", "-p", "5298", "-u",
            "-b", "10M", "-l", "1200", "-t", "15", "-J", timeout=60, check=False)
    assert r.returncode == 0, f"{r.stdout[-2000:]}{r.stderr}"
    end = json.loads(r.stdout)["end"]["sum"]
    rekeys = ike_status(a)["counters"].get("child_rekeys", 0) - before
    print(f"\nQ-ESP rekey without loss: {end['packets']} datagrams, {end['lost_packets']} lost, "
          f"{rekeys} child rekeys")
    assert rekeys >= 3, ike_status(a)["counters"]
    assert end["packets"] > 10_000, end
    assert_lost_only_in_kernel_buffers(end, (a, b), kernel_before, f"{rekeys} child rekeys")
    # The old SAs were deleted (give the last Delete a moment): one Q-ESP
    # pair left on each side, nothing dropped on the way.
    wait_for("the old SAs to go", lambda: all(len(d.sas("in")) == 1 for d in (a, b)), 10, (a, b))
    for d in (a, b):
        assert len(d.sas("out")) == 1, d.status()["connections"]
        assert_protocol(d, "qesp")
        drops = d.status()["drops"]
        assert drops.get("unknown_spi", 0) == 0 and drops.get("policy_mismatch", 0) == 0, drops
    assert a.stop() == 0 and b.stop() == 0


def test_qesp_prefer_against_off_runs_esp(lab):
    a, b = ike_pair(lab, encap="none", a_ike='start_action = "start"\nqesp = "prefer"')
    b.start()
    a.start()
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    for d in (a, b):
        assert_protocol(d, "esp")
    assert "Q-ESP declined" in a.log_text(), a.log_text()[-4000:]
    assert ike_status(a)["counters"].get("child_failed", 0) == 0, ike_status(a)["counters"]
    assert a.stop() == 0 and b.stop() == 0
