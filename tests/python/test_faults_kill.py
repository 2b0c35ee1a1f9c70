"""Process faults (issue 16, "Fault injection"): gateways killed and
restarted, and a state directory that refuses writes.

- An IKE peer SIGKILLed in the middle of a UDP stream: the survivor's DPD
  declares it dead within the bound its configuration gives (dpd_delay,
  then the retransmissions), and with `dpd_action = "restart"` the tunnel
  comes back after the peer does; the times are measured from the stream
  itself. A peer killed and restarted before DPD notices: its IKE_AUTH
  carries INITIAL_CONTACT and the survivor drops the stale IKE SA and its
  child SAs, keeping only the new ones.
- espgate SIGKILLed under load in both directions, three times (A, B, A),
  with manual keys (ESP-in-UDP and raw ESP) and with IKE: every ESP packet
  between the gateways is captured and no (SPI, sequence number) and no
  (SPI, AES-GCM IV) appears twice; with manual keys, the numbers each
  restarted SA sends are above all it sent before.
- The state directory (the sequence reservations, `gateway.state_dir`) on
  a small tmpfs: read-only or full at start, the daemon refuses to start
  and names the file; filled while running, the outbound SA stops exactly
  at its reservation (`seq_reserve_failed`, `seq_not_reserved`) instead of
  sending numbers not on disk, and carries on above it once space is back.
  (`leases.rs` tests the same logic in memory; this runs the daemon on a
  real file system.)

The tmpfs is mounted inside a mount namespace of the test's own (an
`unshare -m` process that only sleeps; the daemons are started in it with
`nsenter`): nothing is mounted where the rest of the machine can see it,
and the mount goes away with the namespace's last process. Namespaces and
processes belong to the test and are removed even on failure (the `lab`
fixture of test_gateway.py); every wait is bounded. The figures measured
are printed (`pytest -s`).
"""

import json
import os
import pathlib
import re
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

import wirecheck
from test_gateway import PING, Daemon, configs, lab, ping, run  # noqa: F401
from test_ike import ctl, established, ike_pair, ike_status, wait_for

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun"),
        reason="needs root, iproute2 and /dev/net/tun (scripts/setup.sh installs iproute2)"),
    pytest.mark.skipif(PING is None, reason="needs ping (iputils-ping; scripts/setup.sh installs it)"),
]

# ---------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------

# A steady UDP stream: argv dst port pps seconds; each datagram carries
# its number and the time it left.
STREAM_TX = r"""
import socket, struct, sys, time
dst, port, pps, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
t0 = time.time()
n = 0
while True:
    now = time.time()
    if now - t0 > secs:
        break
    try:
        s.sendto(struct.pack("!Id", n, now) + b"s" * 100, (dst, port))
    except OSError:
        pass
    n += 1
    time.sleep(max(0.0, t0 + n / pps - time.time()))
"""

# The other end: argv port file seconds; one line per datagram: its
# number and when it arrived. Bound to the wildcard address, so it keeps
# receiving when the gateway's TUN (and its address) is gone and back.
STREAM_RX = r"""
import socket, struct, sys, time
port, path, secs = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", port))
s.settimeout(0.5)
end = time.time() + secs
with open(path, "w") as f:
    print("ready", flush=True)
    while time.time() < end:
        try:
            d = s.recv(2048)
        except socket.timeout:
            continue
        n, sent = struct.unpack_from("!Id", d)
        f.write(f"{n} {sent:.6f} {time.time():.6f}\n")
        f.flush()
"""

# Load: UDP segmentation offload bursts of `burst` datagrams of `size`
# bytes into the TUN, paced to `pps`, for at most `secs`, or (pps = 0)
# `count` datagrams as fast as they go. argv dst port pps secs burst size
# count. Errors (no route while the gateway is down) are waited out.
FLOOD = r"""
import socket, sys, time
dst, port, pps, secs, burst, size, count = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), \
    float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
s.setsockopt(17, 103, size)  # UDP_SEGMENT
buf = b"f" * (size * burst)
t0 = time.time()
sent = errors = 0
while time.time() - t0 < secs and (count == 0 or sent < count):
    try:
        s.sendto(buf, (dst, port))
        sent += burst
    except OSError:
        errors += 1
        time.sleep(0.01)
        continue
    if pps:
        time.sleep(max(0.0, t0 + sent / pps - time.time()))
print(sent, errors, round(time.time() - t0, 3), flush=True)
"""


def py(lab, ns, script, *args, stdout=subprocess.PIPE):
    p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", script, *map(str, args)],
                         stdout=stdout, stderr=subprocess.PIPE, text=True)
    lab.procs.append(p)
    return p


def wait_line(p, what, timeout=10, stream=None):
    """The first line of `p`'s stdout (or of `stream`), within `timeout` s."""
    stream = stream or p.stdout
    r, _, _ = select.select([stream], [], [], timeout)
    assert r, f"{what} did not start{': ' + p.stderr.read() if p.poll() is not None else ''}"
    return stream.readline().strip()


def finish(p, timeout=15):
    """Stops a helper process of ours (SIGTERM, bounded) and returns its stdout."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate(timeout=10)
    return out or ""


class Stream:
    """A UDP stream from `src_ns` to `dst` (in `dst_ns`) at `pps`; `arrivals()`
    reads the receiver's log: [(number, sent, received)]."""

    def __init__(self, lab, src_ns, dst_ns, dst, port, pps=50, secs=90):
        self.path = lab.tmp / f"stream-{port}.log"
        self.rx = py(lab, dst_ns, STREAM_RX, port, self.path, secs + 5)
        assert wait_line(self.rx, "the stream receiver") == "ready"
        self.tx = py(lab, src_ns, STREAM_TX, dst, port, pps, secs)
        self.pps = pps

    def arrivals(self):
        out = []
        for line in self.path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                out.append((int(parts[0]), float(parts[1]), float(parts[2])))
        return out

    def first_after(self, t):
        """When the first datagram sent after `t` arrived, or None."""
        got = [r for n, s, r in self.arrivals() if s >= t]
        return min(got) if got else None

    def stop(self):
        for p in (self.tx, self.rx):
            finish(p)


def kill9(d):
    """SIGKILL, bounded wait; returns the time the process was gone."""
    d.proc.send_signal(signal.SIGKILL)
    assert d.proc.wait(timeout=10) == -signal.SIGKILL
    d.logf.close()
    return time.time()


def restart(d):
    """Starts `d` again after a SIGKILL (the stale control socket and
    lock files are the daemon's to deal with); returns the seconds it took
    to answer on its control socket."""
    t = time.monotonic()
    d.start()
    return time.monotonic() - t


# Retransmission schedule of a request (docs/CONFIG.md): the first wait
# is retransmit_timeout, each next one 1.8 times longer, never longer than
# retransmit_limit (8 s by default); the peer is dead when the wait after
# the last retransmission ends.
def dead_after(timeout, tries, limit=8.0):
    return sum(min(limit, timeout * 1.8 ** k) for k in range(tries + 1))


RESTART_DELAY = 5.0  # espgate-ike's engine: a dead peer's connection restarts after 5 s


def sa_spis(d, direction):
    return {sa["spi"] for sa in d.sas(direction)}


def only_sa(d):
    sas = ike_status(d)["sas"]
    assert len(sas) == 1, sas
    return sas[0]


# ---------------------------------------------------------------------
# 1. IKE peer killed: DPD, recovery, INITIAL_CONTACT
# ---------------------------------------------------------------------

DPD_DELAY, RT_TIMEOUT, RT_TRIES = 3, 1, 2


def test_ike_peer_killed_dpd_declares_it_dead_within_bound_and_tunnel_recovers(lab):
    """B is SIGKILLed in the middle of a 50 datagram/s stream from A. A's
    DPD (dpd_delay 3 s, retransmissions after 1, 1.8 and 3.24 s) must say
    so between 6.04 s (the retransmissions cannot be skipped: no earlier
    verdict from anything unauthenticated, such as the ICMP port
    unreachables B's namespace now sends) and 3 + 6.04 s (+2 s slack)
    after the kill, and remove the SAs. B is
    started again at once; A's restart (5 s after the death) brings the
    tunnel back: the stream arrives again within 5 s + 3 s of the
    detection, over a new IKE SA and new child SAs, the only ones left."""
    a, b = ike_pair(lab, a_ike=f'start_action = "start"\ndpd_delay = "{DPD_DELAY}s"\ndpd_action = "restart"\n'
                               f'retransmit_timeout = "{RT_TIMEOUT}s"\nretransmit_tries = {RT_TRIES}')
    b.start()
    a.start()
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    stream = Stream(lab, a.ns, b.ns, "10.2.0.1", 5601)
    wait_for("the stream", lambda: len(stream.arrivals()) >= 20, 10, (a, b))
    old = only_sa(a)
    old_children = (sa_spis(a, "in"), sa_spis(a, "out"))
    dead0 = ike_status(a)["counters"].get("peers_dead", 0)

    t_kill = kill9(b)
    wait_for("the dead peer", lambda: ike_status(a)["counters"].get("peers_dead", 0) > dead0, 30, (a,))
    t_dead = time.time()
    detection = t_dead - t_kill
    lower = dead_after(RT_TIMEOUT, RT_TRIES)
    bound = DPD_DELAY + lower
    # The SAs went with the peer (A's restart waits 5 s before it tries again).
    assert ike_status(a)["sas"] == [] or ike_status(a)["sas"][0]["spis"] != old["spis"]
    assert not (sa_spis(a, "in") | sa_spis(a, "out")) & (old_children[0] | old_children[1]), a.status()
    assert "peer dead" in a.log_text()

    startup = restart(b)
    wait_for("the tunnel again", lambda: established(a) and established(b), 30, (a, b))
    wait_for("the stream again", lambda: stream.first_after(t_dead) is not None, 15, (a, b))
    t_back = stream.first_after(t_dead)
    recovery = t_back - t_dead
    # And it keeps flowing: 2 s after it came back, >= 80 % of 2 s of datagrams.
    time.sleep(2.5)
    after = [r for n, s, r in stream.arrivals() if t_back <= r < t_back + 2]
    stream.stop()
    print(f"\nDPD: peer dead {detection:.2f} s after SIGKILL (bound {lower:.2f}..{bound:.2f} s + 2); "
          f"B restarted in {startup:.2f} s; stream back {recovery:.2f} s after the detection "
          f"({t_back - t_kill:.2f} s after the kill); {len(after)} datagrams in the next 2 s")
    assert lower - 0.3 <= detection <= bound + 2.0, (detection, lower, bound)
    assert recovery <= RESTART_DELAY + 3.0, recovery
    assert len(after) >= 0.8 * 2 * stream.pps, after[-5:]

    # Only the new IKE SA and its child are left, on both sides.
    new = only_sa(a)
    assert new["spis"] != old["spis"] and new["state"] == "established", (old, new)
    assert len(new["children"]) == 1, new
    child = new["children"][0]
    assert sa_spis(a, "in") == {child["spi_in"]} and sa_spis(a, "out") == {child["spi_out"]}, a.status()
    assert not ({child["spi_in"]} & old_children[0]) and not ({child["spi_out"]} & old_children[1])
    assert len(ike_status(b)["sas"]) == 1
    assert a.stop() == 0 and b.stop() == 0


def test_restarted_peer_initial_contact_clears_the_stale_sas(lab):
    """B (the initiator) is SIGKILLed under a stream from A and started
    again before A's DPD (30 s) could notice. B's new IKE_AUTH carries
    INITIAL_CONTACT: A must drop the stale IKE SA and its children at once
    (counter initial_contact_cleared, no DPD death), keep exactly the new
    IKE SA and child, and the stream must flow again over them."""
    a, b = ike_pair(lab, b_ike='start_action = "start"')
    a.start()
    b.start()
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    stream = Stream(lab, a.ns, b.ns, "10.2.0.1", 5602)
    wait_for("the stream", lambda: len(stream.arrivals()) >= 20, 10, (a, b))
    old = only_sa(a)
    old_in, old_out = sa_spis(a, "in"), sa_spis(a, "out")
    assert len(old_in) == 1 and len(old_out) == 1

    kill9(b)
    startup = restart(b)
    t_up = time.time()

    def replaced():
        sas = ike_status(a)["sas"]
        return len(sas) == 1 and sas[0]["spis"] != old["spis"] and sas[0]["state"] == "established" \
            and sas[0]["children"]
    wait_for("the new IKE SA alone at A", replaced, 20, (a, b))
    t_new = time.time()
    # The stale inbound and outbound SAs leave the data plane too.
    wait_for("the stale child SAs to go", lambda: not (sa_spis(a, "in") & old_in) and
             not (sa_spis(a, "out") & old_out), 5, (a, b))
    wait_for("the stream again", lambda: stream.first_after(t_up) is not None, 10, (a, b))
    recovery = stream.first_after(t_up) - t_up
    stream.stop()
    print(f"\nINITIAL_CONTACT: B restarted {startup:.2f} s after SIGKILL, A had only the new IKE SA "
          f"{t_new - t_up:.2f} s later (polled), stream back {recovery:.2f} s after B was up")

    c = ike_status(a)["counters"]
    assert c.get("initial_contact_cleared", 0) == 1, c
    assert c.get("peers_dead", 0) == 0, c
    new = only_sa(a)
    assert len(new["children"]) == 1, new
    child = new["children"][0]
    assert sa_spis(a, "in") == {child["spi_in"]} and sa_spis(a, "out") == {child["spi_out"]}, a.status()
    assert child["spi_in"] not in old_in and child["spi_out"] not in old_out
    assert "started over (INITIAL_CONTACT)" in a.log_text()
    assert len(ike_status(b)["sas"]) == 1
    assert recovery <= 5.0, recovery
    assert a.stop() == 0 and b.stop() == 0


# ---------------------------------------------------------------------
# 2. SIGKILL under load: no sequence number, no nonce twice on the wire
# ---------------------------------------------------------------------

class Tcpdump:
    """Every ESP packet (raw or in UDP 4500) on `dev` in `ns`, headers only."""

    def __init__(self, lab, ns, dev):
        self.path = lab.tmp / f"esp-{ns}.pcap"
        self.p = subprocess.Popen(["ip", "netns", "exec", ns, "tcpdump", "-i", dev, "-n", "-s", "96", "-B", "16384",
                                   "-w", str(self.path), "esp or udp port 4500"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lab.procs.append(self.p)
        line = wait_line(self.p, "tcpdump", stream=self.p.stderr)
        assert "listening on" in line, line

    def stop(self):
        """Stops the capture; returns tcpdump's (captured, dropped by kernel)."""
        self.p.send_signal(signal.SIGINT)
        try:
            _, err = self.p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            _, err = self.p.communicate(timeout=10)
        num = lambda what: int(m.group(1)) if (m := re.search(r"(\d+) packets? " + what, err)) else -1
        return num("captured"), num("dropped by kernel")


def in_packets(d):
    return {sa["spi"]: sa["packets"] for sa in d.sas("in")}


KILL_CASES = {
    "manual-udp-aes128gcm16": dict(ike=False, encap="udp", esp="aes128gcm16"),
    "manual-raw-aes256gcm16": dict(ike=False, encap="none", esp="aes256gcm16"),
    # Two workers: one outbound counter and one reservation shared by both copies of the SA.
    "manual-udp-chacha20poly1305-2workers": dict(ike=False, encap="udp", esp="chacha20poly1305",
                                                 extra_gw="workers = 2"),
    "ike-udp-aes128gcm16": dict(ike=True, encap="udp", esp="aes128gcm16"),
}
LOAD_PPS = 8000        # datagrams per second each way, in USO bursts of 16
LOAD_SECONDS = 2.5     # of load before each kill and after the last restart


@pytest.mark.skipif(not shutil.which("tcpdump"), reason="needs tcpdump (scripts/setup.sh installs it)")
@pytest.mark.parametrize("case", list(KILL_CASES))
def test_sigkill_under_load_never_repeats_a_sequence_number_or_iv(lab, case):
    """Load both ways (8000 datagrams/s each way), A, B and A SIGKILLed in
    turn and restarted, every ESP packet between them captured on A's
    veth: no (destination, SPI, sequence number) and no (destination, SPI,
    IV) twice, no GSO batch hiding packets from the capture. Manual keys:
    each SA continues, after its sender's restart, above every number it
    sent before. IKE: each restart of A makes new SAs (A initiates at
    start), B's restart is followed by `espgate initiate` on B; both times
    INITIAL_CONTACT retires the survivor's stale SAs."""
    kw = KILL_CASES[case]
    if kw["ike"]:
        a, b = ike_pair(lab, a_ike='start_action = "start"', encap=kw["encap"])
    else:
        a, b = configs(lab, protocol="esp", encap=kw["encap"], esp=kw["esp"], extra_gw=kw.get("extra_gw", ""))
    # The kernel cuts the gateways' GSO batches before its packet taps.
    for d, dev in ((a, "va"), (b, "vb")):
        run("ip", "-n", d.ns, "link", "set", dev, "gso_max_segs", "1")
    addr = {a: "192.0.2.1", b: "192.0.2.2"}
    cap = Tcpdump(lab, a.ns, "va")
    b.start()
    a.start()
    if kw["ike"]:
        wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    loads = [py(lab, a.ns, FLOOD, "10.2.0.9", 9, LOAD_PPS, 120, 16, 200, 0),
             py(lab, b.ns, FLOOD, "10.1.0.9", 9, LOAD_PPS, 120, 16, 200, 0)]
    wait_for("traffic both ways", lambda: all(sum(in_packets(d).values()) > 1000 for d in (a, b)), 15, (a, b))

    cuts = {addr[a]: [], addr[b]: []}
    figures = []
    for victim in (a, b, a):
        peer = b if victim is a else a
        time.sleep(LOAD_SECONDS)
        t_kill = kill9(victim)
        # Fail closed: the TUN and its routes went with the process, the
        # blackhole twins stay, so the flood is dropped, not sent in clear.
        bh = run("ip", "-n", victim.ns, "route", "show", "table", "all", "type", "blackhole").stdout
        assert "metric 4000000000" in bh, f"no fail-closed route in {victim.ns} after SIGKILL: {bh!r}"
        base = in_packets(peer)
        cuts[addr[victim]].append(time.time())
        startup = restart(victim)
        if kw["ike"] and victim is b:
            ctl(b, "initiate", "to-a")

        def flowing():
            now = in_packets(peer)
            return any(n > base.get(spi, 0) for spi, n in now.items()) and sum(in_packets(victim).values()) > 0
        wait_for(f"traffic through the restarted {victim.ns}", flowing, 20, (a, b))
        figures.append((victim.ns[:3], startup, time.time() - t_kill))
    time.sleep(LOAD_SECONDS)
    for p in loads:
        finish(p)
    time.sleep(0.3)
    captured, dropped = cap.stop()
    final = {d: d.status() for d in (a, b)}
    assert a.stop() == 0 and b.stop() == 0

    c = wirecheck.esp_packets(cap.path)
    pk = c.packets
    per_sa = wirecheck.by_sa(pk)
    sent_by = {x: sum(1 for p in pk if p.src == x) for x in cuts}
    print(f"\n{case}: {len(pk)} ESP packets checked ({sent_by}), {len(per_sa)} SAs, tcpdump captured "
          f"{captured}, dropped by kernel {dropped}; IKE {c.ike}, keepalives {c.keepalives}")
    for who, startup, flow in figures:
        print(f"  SIGKILL {who}: answering again after {startup:.2f} s, traffic both ways {flow:.2f} s after the kill")
    assert c.oversize == 0 and c.truncated == 0, (c.oversize, c.truncated)
    assert all(n >= 5000 for n in sent_by.values()), sent_by
    dup = wirecheck.seq_duplicates(pk)
    assert not dup, f"{len(dup)} (destination, SPI, sequence number) sent more than once: {list(dup.items())[:10]}"
    dup = wirecheck.iv_duplicates(pk)
    assert not dup, f"{len(dup)} (destination, SPI, IV) sent more than once: {list(dup.items())[:10]}"
    if kw["ike"]:
        # New SAs after each restart: A used at least 3 outbound SPIs
        # (start, after its two restarts), B at least 2 (start, its restart),
        # and no SA was sent on both before and after its sender's restart.
        spis = lambda x: {spi for (src, _, spi) in per_sa if src == x}
        assert len(spis(addr[a])) >= 3 and len(spis(addr[b])) >= 2, per_sa.keys()
        for (src, dst, spi), packets in per_sa.items():
            for t in cuts[src]:
                assert not (packets[0].ts < t <= packets[-1].ts), f"SA {spi:#x} from {src} outlived a restart"
    else:
        assert len(per_sa) == 2, per_sa.keys()
        for (src, dst, spi), packets in per_sa.items():
            bad = wirecheck.epochs_go_up(packets, cuts[src])
            assert not bad, f"SA {spi:#x} from {src} went back after a restart: {bad}"
            for t in cuts[src]:
                before = max(p.seq for p in packets if p.ts < t)
                after = min(p.seq for p in packets if p.ts >= t)
                print(f"  SA {spi:#x} from {src}: highest {before} before the kill, lowest {after} after "
                      f"the restart (skipped {after - before - 1})")
    for d, st in final.items():
        assert st["drops"].get("replay", 0) == 0 and st["drops"].get("icv_failure", 0) == 0, (d.ns, st["drops"])


def test_wirecheck_finds_repeated_sequence_numbers_and_ivs(tmp_path):
    """The capture check itself: in a hand-made pcap, a repeated sequence
    number and a repeated IV are found, keepalives, IKE and other UDP are
    skipped, raw and UDP-encapsulated ESP both read, an unsegmented GSO
    batch is flagged."""
    import struct

    def frame(proto, payload, src=b"\xc0\x00\x02\x01", dst=b"\xc0\x00\x02\x02", total=None):
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total or 20 + len(payload), 0, 0x4000, 64, proto, 0, src, dst)
        return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + payload

    def udp(payload, port=4500):
        return struct.pack("!HHHH", port, port, 8 + len(payload), 0) + payload

    def esp(spi, seq, iv):
        return struct.pack("!IIQ", spi, seq, iv) + b"\xee" * 32

    frames = [
        frame(17, udp(esp(0x1002, 1, 1))),
        frame(17, udp(esp(0x1002, 2, 2))),
        frame(17, udp(esp(0x1002, 2, 3))),              # sequence number again
        frame(17, udp(esp(0x1002, 4, 1))),              # IV again
        frame(17, udp(b"\xff")),                        # keepalive
        frame(17, udp(b"\0\0\0\0" + b"\x11" * 40)),     # IKE behind the non-ESP marker
        frame(17, udp(esp(0x1002, 9, 9), port=53)),     # not ours
        frame(50, esp(0x2001, 7, 7)),                   # raw ESP
        frame(50, esp(0x2001, 7, 8), dst=b"\xc0\x00\x02\x03"),  # same SPI, other destination
        frame(17, udp(esp(0x1002, 5, 5)), total=9000),  # a GSO batch
    ]
    path = tmp_path / "x.pcap"
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 96, 1))
        for i, fr in enumerate(frames):
            f.write(struct.pack("<IIII", 1000 + i, 0, min(len(fr), 96), len(fr)) + fr[:96])
    c = wirecheck.esp_packets(path)
    assert (len(c.packets), c.keepalives, c.ike, c.oversize, c.frames) == (7, 1, 1, 1, 10)
    assert wirecheck.seq_duplicates(c.packets) == {("192.0.2.2", 0x1002, 2): 2}
    assert wirecheck.iv_duplicates(c.packets) == {("192.0.2.2", 0x1002, (1).to_bytes(8, "big")): 2}
    sa = wirecheck.by_sa(c.packets)[("192.0.2.1", "192.0.2.2", 0x1002)]
    assert wirecheck.epochs_go_up(sa, [1000.5, 1001.5, 1002.5]) == [(1001.5, 2, 2)]


# ---------------------------------------------------------------------
# 3. The state directory read-only or full
# ---------------------------------------------------------------------

class MountNs:
    """A mount namespace of the test's own, held by a sleeping process;
    `nsenter()` is the prefix that runs a command inside it. Mounts made
    in it are seen by nothing else and go with its last process."""

    def __init__(self, lab):
        self.p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "600"])
        lab.procs.append(self.p)
        me = os.readlink("/proc/self/ns/mnt")
        deadline = time.time() + 5
        while time.time() < deadline and os.readlink(f"/proc/{self.p.pid}/ns/mnt") == me:
            time.sleep(0.01)
        assert os.readlink(f"/proc/{self.p.pid}/ns/mnt") != me, "unshare -m did not take"

    def nsenter(self):
        return ["nsenter", "-t", str(self.p.pid), "-m", "--"]

    def run(self, *args, check=True):
        return run(*self.nsenter(), *args, check=check)

    def path(self, p):
        """`p` as this namespace sees it, for the test's own file access."""
        return pathlib.Path(f"/proc/{self.p.pid}/root") / str(p).lstrip("/")

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=10)


class NsDaemon(Daemon):
    """A Daemon started inside a MountNs (nsenter, then ip netns exec:
    still one process, the daemon's pid)."""

    def __init__(self, d, mnt):
        super().__init__(d.lab, d.ns, d.cfg, d.sock, d.log)
        self.mnt = mnt

    def start(self):
        self.logf = open(self.log, "ab")
        self.proc = subprocess.Popen([*self.mnt.nsenter(), "ip", "netns", "exec", self.ns, self.lab.espgate, "up",
                                      "-c", str(self.cfg)], stdout=self.logf, stderr=subprocess.STDOUT)
        self.lab.procs.append(self.proc)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"espgate in {self.ns} exited with {self.proc.returncode}:\n{self.log_text()}")
            if run(self.lab.espgate, "status", "--json", "-s", str(self.sock), check=False).returncode == 0:
                return self
            time.sleep(0.05)
        pytest.fail(f"espgate in {self.ns} did not answer within 10 s:\n{self.log_text()}")

    def up_once(self):
        """`espgate up` expected to fail: (exit status, stderr)."""
        r = run(*self.mnt.nsenter(), "ip", "netns", "exec", self.ns, self.lab.espgate, "up", "-c", str(self.cfg),
                check=False, timeout=30)
        return r.returncode, r.stderr


NEEDS_NSENTER = pytest.mark.skipif(not (shutil.which("unshare") and shutil.which("nsenter")),
                                   reason="needs unshare and nsenter (util-linux)")


@pytest.fixture
def mnt(lab):
    m = None

    def make():
        nonlocal m
        m = MountNs(lab)
        return m
    try:
        yield make
    finally:
        if m:
            m.close()


def state_gateways(lab, mnt, size="256k", ro=False):
    """Manual-key gateways A and B (ESP-in-UDP, AES-GCM); A's state
    directory is a tmpfs of `size` in a mount namespace of the test's own,
    where A runs. Returns (A, B, the state directory, the MountNs)."""
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16")
    m = mnt()  # after the network namespaces: it must see /run/netns/*
    state = a.cfg.parent / "state"
    state.mkdir()
    m.run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0700" + (",ro" if ro else ""), "egstate", str(state))
    return NsDaemon(a, m), b, state, m


def fill(m, state):
    """Fills the tmpfs; returns the file that holds it."""
    f = m.path(state) / "fill"
    with open(f, "ab", buffering=0) as out:
        try:
            for _ in range(100_000):
                out.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == 28, e
        else:
            pytest.fail("the tmpfs never filled")
    return f


def state_files(m, state):
    return sorted(p for p in m.path(state).iterdir() if re.fullmatch(r"seq-[0-9a-f]+", p.name))


def reserved_on_disk(m, state):
    files = state_files(m, state)
    assert len(files) == 1, files
    return int(re.search(r"^reserved = (\d+)$", files[0].read_text(), re.M).group(1))


def no_leftovers(d):
    links = [l["ifname"] for l in json.loads(run("ip", "-n", d.ns, "-j", "link").stdout)]
    assert "tunA" not in links, links
    assert not d.sock.exists()


@NEEDS_NSENTER
def test_state_dir_read_only_or_full_at_start_is_refused_naming_the_file(lab, mnt):
    """A read-only state directory, then a full one: `espgate up` exits 1
    with the path and the system's reason, and leaves no TUN or socket
    behind. With space it starts; after a clean stop the directory turns
    read-only again: refused again, the state file untouched."""
    a, b, state, m = state_gateways(lab, mnt, ro=True)
    code, err = a.up_once()
    print(f"\nread-only: exit {code}: {err.strip()}")
    assert code == 1, err
    assert str(state) in err and "Read-only file system" in err, err
    no_leftovers(a)

    m.run("mount", "-o", "remount,rw", str(state))
    filler = fill(m, state)
    code, err = a.up_once()
    print(f"full: exit {code}: {err.strip()}")
    assert code == 1, err
    assert re.search(re.escape(str(state)) + r"/seq-[0-9a-f]+", err) and "No space left on device" in err, err
    no_leftovers(a)

    filler.unlink()
    a.start()
    b.start()
    r = ping(a.ns, "10.2.0.1", "10.1.0.1")
    assert r.returncode == 0, r.stdout + a.log_text()
    sent = a.sas("out")[0]["next_seq"]
    assert a.stop() == 0
    assert reserved_on_disk(m, state) == sent  # a clean stop writes the exact next number
    before = state_files(m, state)[0].read_text()

    m.run("mount", "-o", "remount,ro", str(state))
    code, err = a.up_once()
    assert code == 1 and str(state) in err and "Read-only file system" in err, err
    no_leftovers(a)
    assert state_files(m, state)[0].read_text() == before
    assert b.stop() == 0


STEP = 1 << 20  # numbers reserved per write (leases.rs)


@NEEDS_NSENTER
def test_state_dir_full_while_running_holds_the_sa_then_recovers(lab, mnt):
    """A's state directory fills while it runs. A's outbound SA may use
    the 2^20 numbers reserved at start; the extension wanted at half-way
    fails (seq_reserve_failed), so after 1.1 million datagrams it must
    stand exactly at its reservation: next_seq == seq_reserved == the
    number on disk, the rest dropped as seq_not_reserved, nothing beyond it
    on the wire (B never saw a higher number). When space returns, the
    retry (every second) extends the reservation and traffic flows again,
    above the old limit, with no replay at B."""
    a, b, state, m = state_gateways(lab, mnt)
    a.start()
    b.start()
    assert ping(a.ns, "10.2.0.1", "10.1.0.1").returncode == 0
    out = a.sas("out")[0]
    limit = out["seq_reserved"]
    assert limit == 1 + STEP and reserved_on_disk(m, state) == limit, out
    filler = fill(m, state)

    # As fast as it goes: datagrams of 64 bytes in USO bursts of 64, until
    # 60 000 more than the reservation have reached the SA (the TUN queue
    # drops some of a burst this fast).
    floods = []
    for _ in range(6):
        out = a.sas("out")[0]
        if out["drops"].get("seq_not_reserved", 0) >= 60_000:
            break
        count = max(limit - out["next_seq"], 0) + 60_000 - out["drops"].get("seq_not_reserved", 0)
        flood = py(lab, a.ns, FLOOD, "10.2.0.9", 9, 0, 60, 64, 64, count)
        floods.append(flood.communicate(timeout=90)[0].strip())
        time.sleep(0.5)
    print(f"\nfloods (sent, errors, seconds): {floods}")
    time.sleep(1.5)  # at least one more retry of the write
    out = a.sas("out")[0]
    print(f"held: {out}")
    assert out["next_seq"] == limit == out["seq_reserved"], out
    assert out["packets"] == limit - 1, out
    assert out["seq_reserve_failed"] >= 2, out
    assert out["drops"]["seq_not_reserved"] >= 10_000, out
    assert reserved_on_disk(m, state) == limit
    assert a.proc.poll() is None
    assert "No space left on device" in a.log_text(), a.log_text()[-3000:]
    inb = b.sas("in")[0]
    assert inb["highest_seq"] < limit and inb["drops"] == {}, inb
    # Still held: a ping does not get through, the SA does not move.
    assert ping(a.ns, "10.2.0.1", "10.1.0.1", count=2).returncode != 0
    assert a.sas("out")[0]["next_seq"] == limit

    filler.unlink()
    t = time.monotonic()
    wait_for("the reservation to grow", lambda: a.sas("out")[0]["seq_reserved"] > limit, 10, (a,))
    grown = time.monotonic() - t
    r = ping(a.ns, "10.2.0.1", "10.1.0.1")
    assert r.returncode == 0, r.stdout + a.log_text()[-3000:]
    out = a.sas("out")[0]
    inb = b.sas("in")[0]
    print(f"space back: reservation extended after {grown:.2f} s, to {out['seq_reserved']}; B's highest "
          f"{inb['highest_seq']}")
    assert grown <= 3.0, grown
    assert out["next_seq"] > limit and reserved_on_disk(m, state) == out["seq_reserved"], out
    assert inb["highest_seq"] >= limit and inb["drops"] == {}, inb
    assert b.status()["drops"] == {}, b.status()["drops"]
    assert a.stop() == 0 and b.stop() == 0
    # A clean stop writes back the exact next number (nothing was sent since the ping).
    assert out["next_seq"] <= reserved_on_disk(m, state) <= out["seq_reserved"]
