"""Network faults between two espgate gateways running IKEv2 (issue 16,
"Fault injection in namespaces"), made with `faultkit` (its docstring
describes the path and the tools):

    [A] 192.0.2.1 ── [R] (nftables loss/dup, the TUN shaper) ── 198.51.100.2 [B]

- IKE_SA_INIT + IKE_AUTH: six handshakes under 10 % random loss (the
  kernel's generator, both directions); one under 30 % loss both ways
  drawn from a seeded generator, so that the outcome does not depend on
  luck: the test replays the seed's drops against the retransmission
  schedule and expects exactly the retransmissions, the responses resent
  from B's cache and (within slack) the time that follow; one under
  reordering plus duplication, with IKE_AUTH cut into RFC 7383 fragments;
- child SA rekeys and IKE SA rekeys under 10 % loss;
- a TCP transfer through the tunnel under 1 % loss plus reordering,
  across child rekeys and IKE rekeys: the data arrive intact;
- the link between R and B down for 3 s under a UDP stream and a ping
  stream: both carry again within a bound after the link comes back, and
  the IKE SA (DPD running through the outage) survives;
- the path MTU between the gateways shrinks in the middle of a TCP
  transfer between hosts behind them (two routers, so that neither
  gateway sees the narrow link itself): ESP-in-UDP with and without
  offloads, and raw ESP, which is a black hole (xfail, an espgate bug).

The connections retransmit IKE requests after 1 s (the smallest
`retransmit_timeout`; 2 s in the seeded test), each wait 1.8 times the
last, 8 times. The default schedule (4 s, 5 tries) is too slow for 30 %
loss: about one handshake in twelve never completes and one in seven
takes over 30 s (`docs/RELIABILITY.md`, "Network faults").
`ESPGATE_FAULT_SOAK=N` runs N handshakes under the kernel's random 30 %
loss and prints the distribution (skipped otherwise).

Namespaces, processes, nftables tables and policy rules belong to the test
and are removed even on failure (the `lab` and `kit` fixtures); every wait
is bounded. Each test prints what it measured (`pytest -s`).
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

import faultkit
from test_gateway import PING, Daemon, lab, run, snmp  # noqa: F401
from test_ike import PSK, ctl, established, ike_status, wait_for

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun"),
        reason="needs root, iproute2 and /dev/net/tun (scripts/setup.sh installs iproute2)"),
    pytest.mark.skipif(PING is None or not shutil.which("nft"),
                       reason="needs ping and nft (iputils-ping, nftables)"),
]

# The connections' retransmission schedule: first wait 1 s (the smallest
# allowed), then 1.8 times longer each time (espgate's fixed factor), 8
# retransmissions.
RETRANSMIT_TIMEOUT = 1.0
RETRANSMIT_TRIES = 8
BACKOFF = 1.8


def schedule(k, first=1.0):
    """When the k-th retransmission of a request leaves, counted from the
    first transmission."""
    return first * (BACKOFF ** k - 1) / (BACKOFF - 1)


@pytest.fixture
def kit(lab):
    k = faultkit.Kit(lab)
    try:
        yield k
    finally:
        k.close()


def gateways(lab, path, *, a_ike="", b_ike="", encap="udp", extra_gw="", extra_ts=(),
             retransmit=RETRANSMIT_TIMEOUT):
    """Two daemons (not started) with one IKE connection each over `path`:
    A's networks 10.1.0.0/16, B's 10.2.0.0/16 (plus `extra_ts` pairs of
    prefixes, to make IKE_AUTH larger); IKE requests retransmitted after
    `retransmit` s, then 1.8 times longer each time."""
    daemons = []
    for side, ns, local, remote, me, peer, extra in (
            ("A", path.a, path.a_addr, path.b_addr, 1, 2, a_ike),
            ("B", path.b, path.b_addr, path.a_addr, 2, 1, b_ike)):
        d = lab.tmp / side
        d.mkdir()
        secret = d / "psk"
        secret.write_text(PSK + "\n")
        secret.chmod(0o600)
        lts = [f"10.{me}.0.0/16"] + [p[me - 1] for p in extra_ts]
        rts = [f"10.{peer}.0.0/16"] + [p[peer - 1] for p in extra_ts]
        q = lambda xs: ", ".join(f'"{x}"' for x in xs)
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
local_ts = [{q(lts)}]
remote_ts = [{q(rts)}]

[connection.ike]
psk_file = "psk"
retransmit_timeout = "{retransmit:g}s"
retransmit_tries = {RETRANSMIT_TRIES}
{extra}
"""
        cfg = d / "gw.toml"
        cfg.write_text(text)
        cfg.chmod(0o600)
        daemons.append(Daemon(lab, ns, cfg, d / "ctl.sock", d / "log"))
    return daemons


def counters(d):
    return ike_status(d)["counters"]


def handshake(a, b, bound):
    """A initiates; returns the seconds until both sides show the IKE SA
    and its child SA (polled every 0.1 s)."""
    t0 = time.monotonic()
    ctl(a, "initiate", "to-b")
    wait_for("the IKE SA", lambda: established(a) and established(b), bound, (a, b))
    return time.monotonic() - t0


def both_ways(path):
    """The router's entry device per direction, for Shaper(entries=…)."""
    return {"ab": path.router_for("a")[1], "ba": path.router_for("b")[1]}


def drop_both_ways(kit, path, percent, what="all"):
    r = path.routers[0]
    t = kit.nft(r)
    for link in ("a", "b"):
        t.loss(percent, path.router_for(link)[1], what)
    return t


# ---------------------------------------------------------------------
# IKE under loss and reordering
# ---------------------------------------------------------------------

def handshake_rounds(kit, path, a, b, percent, rounds, bound, keep_going=False):
    """`rounds` handshakes, each with `percent` % of all packets dropped
    each way by the kernel's generator while it runs (the loss is lifted
    for the terminate between rounds). Returns [(seconds or None,
    retransmissions by A, packets dropped)]; stops at the first handshake
    not done within `bound` s unless `keep_going`."""
    out = []
    for _ in range(rounds):
        nft = drop_both_ways(kit, path, percent)
        before = counters(a).get("retransmits", 0)
        t0 = time.monotonic()
        ctl(a, "initiate", "to-b")
        ok = faultkit.wait_until(lambda: established(a) and established(b), bound, 0.1)
        took = time.monotonic() - t0 if ok else None
        nft.delete()
        out.append((took, counters(a).get("retransmits", 0) - before, nft.total()))
        if took is None and not keep_going:
            break
        ctl(a, "terminate", "to-b", check=took is not None)
        if took is None:
            ctl(b, "terminate", "to-a", check=False)
        wait_for("the SAs to go", lambda: not ike_status(a)["sas"] and not ike_status(b)["sas"], 10, (a, b))
    return out


def test_ike_handshake_under_10pct_random_loss(lab, kit):
    """Six handshakes, each with 10 % of all packets dropped each way by
    the kernel's generator: each completes within 30 s (the schedule needs
    6 lost round trips in one exchange to pass 20 s, about 1 in 20 000 at
    10 %), and no slower than the retransmissions it made allow; the tunnel
    then carries under the same loss."""
    path = kit.path()
    a, b = gateways(lab, path)
    b.start()
    a.start()
    rounds = handshake_rounds(kit, path, a, b, 10, 6, 30)
    print(f"\n10 % loss, 6 handshakes: seconds {[None if t is None else round(t, 2) for t, _, _ in rounds]}, "
          f"retransmissions by A {[r for _, r, _ in rounds]}, packets dropped {[d for _, _, d in rounds]}; "
          f"B resent {counters(b).get('retransmitted_responses', 0)} responses in all")
    for took, rt, _ in rounds:
        assert took is not None, f"not established within 30 s: {rounds}\n{a.log_text()[-4000:]}"
        # Each lost round trip costs one retransmission; the time is the
        # schedule's for that many (at most), plus slack for a loaded
        # machine.
        assert took <= schedule(rt, RETRANSMIT_TIMEOUT) + 3.0, rounds
    for c in (counters(a), counters(b)):
        assert c.get("ike_failed", 0) == 0 and c.get("half_open_expired", 0) == 0, c
    ctl(a, "initiate", "to-b")
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))
    drop_both_ways(kit, path, 10)
    r = run("ip", "netns", "exec", a.ns, PING, "-c", "10", "-i", "0.1", "-W", "2", "-I", "10.1.0.1", "10.2.0.1",
            check=False)
    assert " 0 received" not in r.stdout, r.stdout
    assert a.stop() == 0 and b.stop() == 0


# Picked among the first 30 seeds for a mix: with 30 % loss, seed 22 drops
# the first IKE_SA_INIT response, the first retransmitted IKE_SA_INIT, the
# first IKE_AUTH response and the first retransmitted IKE_AUTH (see
# `replay_handshake`): 4 retransmissions, 11.2 s of waiting from a first
# wait of 2 s.
SEED_30 = 22


def replay_handshake(seed, p, first):
    """What the shaper's seeded loss does to a two-exchange handshake: for
    each exchange, request k is dropped or not by the A→B generator, and
    only a request that arrives draws a response from B→A's. Returns
    (retransmissions, seconds of waiting, the dropped packets)."""
    ab = random.Random(f"{seed}-loss-ab")
    ba = random.Random(f"{seed}-loss-ba")
    retrans, wait, dropped = 0, 0.0, []
    for exchange in ("IKE_SA_INIT", "IKE_AUTH"):
        k = 0
        while True:
            if ab.random() >= p:
                if ba.random() >= p:
                    break
                dropped.append(f"{exchange} response {k}")
            else:
                dropped.append(f"{exchange} request {k}")
            k += 1
            assert k <= 8, "this seed loses a whole exchange"
        retrans += k
        wait += schedule(k, first)
    return retrans, wait, dropped


def test_ike_handshake_under_30pct_seeded_loss(lab, kit):
    """30 % of the IKE packets dropped each way (seeded): A retransmits
    exactly as often as the drops require, B answers retransmitted
    requests from its cache, and the handshake takes the schedule's time
    for those retransmissions (within slack)."""
    p = 0.30
    # A first wait of 2 s, so that a machine slow enough to take a second
    # over a round trip still makes no retransmission the drops did not
    # call for (which would shift the seed's drops onto other messages).
    first = 2.0
    retrans, wait, dropped = replay_handshake(SEED_30, p, first)
    assert retrans >= 2, "pick a seed that drops something"
    path = kit.path()
    a, b = gateways(lab, path, retransmit=first)
    b.start()
    a.start()
    shaper = kit.shaper(path.routers[0], both_ways(path), loss={"ab": p, "ba": p}, loss_ike_only=True,
                        seed=SEED_30)
    took = handshake(a, b, wait + 15)
    st = shaper.stats()
    rt = counters(a).get("retransmits", 0)
    print(f"\n30 % loss (seed {SEED_30}): established in {took:.2f} s; {rt} retransmissions by A "
          f"(expected {retrans}, {wait:.1f} s of waiting); dropped: {', '.join(dropped)}; "
          f"B resent {counters(b).get('retransmitted_responses', 0)} responses; shaper {st}")
    assert rt == retrans, (rt, retrans, dropped, st)
    # Every dropped response was answered again from B's cache.
    lost_responses = sum("response" in x for x in dropped)
    assert counters(b).get("retransmitted_responses", 0) == lost_responses, counters(b)
    assert st["ab"]["dropped"] + st["ba"]["dropped"] == len(dropped), st
    # The status is polled through the command line: on a loaded machine
    # that alone takes a second or two.
    assert wait - 0.5 <= took <= wait + 6.0, (took, wait)
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(not os.environ.get("ESPGATE_FAULT_SOAK"),
                    reason="a measurement, not a test: ESPGATE_FAULT_SOAK=N runs N handshakes under 30 % "
                           "random loss")
def test_soak_ike_handshakes_under_30pct_random_loss(lab, kit):
    """N handshakes under the kernel's random 30 % loss each way; prints
    the distribution of the time to establish and of the retransmissions
    (a handshake not established within 90 s counts as failed)."""
    n = int(os.environ["ESPGATE_FAULT_SOAK"])
    path = kit.path()
    a, b = gateways(lab, path)
    b.start()
    a.start()
    rounds = handshake_rounds(kit, path, a, b, 30, n, 90, keep_going=True)
    times = sorted(t for t, _, _ in rounds if t is not None)
    rts = [r for t, r, _ in rounds if t is not None]
    failed = sum(t is None for t, _, _ in rounds)
    print(f"\nsoak: {n} handshakes, {failed} not established within 90 s; seconds: "
          f"{[round(t, 1) for t in times]}; retransmissions: {sorted(rts)}")
    assert a.stop() == 0 and b.stop() == 0


def test_ike_handshake_under_reordering_and_duplication(lab, kit):
    """Every 2nd packet held 300 ms, the rest jittered by up to 40 ms, and
    50 % of the IKE packets duplicated (the copy overtakes the original):
    IKE_AUTH, cut into RFC 7383 fragments of at most 300 bytes, arrives
    out of order and twice, and is reassembled; the handshake completes
    and the tunnel carries pings (reordered too)."""
    path = kit.path()
    # More selector pairs make IKE_AUTH several fragments long.
    extra = [(f"172.16.{i}.0/24", f"172.17.{i}.0/24") for i in range(24)]
    a, b = gateways(lab, path, extra_gw="ike_fragment_size = 300", extra_ts=extra)
    b.start()
    a.start()
    router = path.routers[0]
    shaper = kit.shaper(router, both_ways(path), jitter_ms=40, hold_every=2, hold_ms=300, seed=5)
    nft = kit.nft(router)
    dup_ok, dup_how = faultkit.nft_dup_works(lab)
    if dup_ok:
        nft.dup(50, "ra", path.b_addr, "rb", what="ike")
        nft.dup(50, "rb", path.a_addr, "ra", what="ike")
    else:
        print(f"\nnftables dup does not duplicate on this kernel, reordering only: {dup_how}")
    took = handshake(a, b, 20)
    # Let the last held packets out.
    time.sleep(0.5)
    ca, cb = counters(a), counters(b)
    st = shaper.stats()
    print(f"\nreordering: established in {took:.2f} s; A sent {ca.get('fragmented_messages_out', 0)} fragmented "
          f"messages, B got {cb.get('fragments_in', 0)} fragments, reassembled "
          f"{cb.get('fragmented_messages_in', 0)}; duplicated {nft.counters()}; retransmissions A "
          f"{ca.get('retransmits', 0)}; B resent {cb.get('retransmitted_responses', 0)}; shaper reordered "
          f"{st['ab']['reordered']} A→B, {st['ba']['reordered']} B→A; drops A {ca}")
    assert ca.get("fragmented_messages_out", 0) >= 1 and cb.get("fragmented_messages_in", 0) >= 1, (ca, cb)
    assert cb.get("fragments_in", 0) >= 3, cb
    assert st["ab"]["reordered"] >= 1, st
    assert took < 10, took
    r = run("ip", "netns", "exec", a.ns, PING, "-c", "20", "-i", "0.05", "-W", "2", "-I", "10.1.0.1", "10.2.0.1",
            check=False)
    assert r.returncode == 0 and " 20 received" in r.stdout, r.stdout
    # ICMP is no IKE: not duplicated; reordered ESP is no replay.
    for d in (a, b):
        drops = d.status()["drops"]
        assert drops.get("replay", 0) == 0, drops
    assert a.stop() == 0 and b.stop() == 0


def test_rekeys_under_10pct_loss(lab, kit):
    """Child SAs rekeyed every ~3 s and the IKE SA every ~7 s by A, with
    10 % of every packet lost each way: at least five child rekeys and two
    IKE rekeys complete within 45 s, no child reaches its hard lifetime,
    nothing fails, both sides agree on the IKE SA, and the tunnel still
    carries."""
    path = kit.path()
    a, b = gateways(lab, path, a_ike='child_rekey_time = "3s"\nchild_life_time = "30s"\nrekey_time = "7s"\n'
                                     'jitter = "1s"',
                    b_ike='child_rekey_time = "1h"\nrekey_time = "1h"')
    b.start()
    a.start()
    handshake(a, b, 20)
    nft = drop_both_ways(kit, path, 10)
    t0 = time.monotonic()
    # Light traffic all along, so that the SAs carry something.
    pinger = subprocess.Popen(["ip", "netns", "exec", a.ns, PING, "-q", "-i", "0.2", "-w", "50", "-I", "10.1.0.1",
                               "10.2.0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lab.procs.append(pinger)
    wait_for("5 child rekeys and 2 IKE rekeys",
             lambda: counters(a).get("child_rekeys", 0) >= 5 and counters(a).get("ike_rekeys", 0) >= 2, 45, (a, b))
    took = time.monotonic() - t0
    pinger.send_signal(signal.SIGINT)
    out = pinger.communicate(timeout=10)[0]
    nft.delete()
    ca, cb = counters(a), counters(b)
    print(f"\nrekeys under 10 % loss: {ca.get('child_rekeys')} child and {ca.get('ike_rekeys')} IKE rekeys in "
          f"{took:.1f} s, {ca.get('retransmits', 0)} retransmissions by A, {cb.get('retransmits', 0)} by B, "
          f"{nft.total()} packets dropped; ping: {out.strip().splitlines()[-2:]}")
    for c in (ca, cb):
        for k in ("child_failed", "children_expired", "ike_failed", "peers_dead"):
            assert c.get(k, 0) == 0, (k, c)
    # Both sides agree on the one established IKE SA. (The SA it replaced
    # may still be "deleting" on A: when the response to its Delete is
    # lost, B has already removed it and never answers the retransmissions,
    # so A keeps it for the 30 s grace of a replaced SA.)
    live = lambda d: [x["spis"] for x in ike_status(d)["sas"] if x["state"] == "established"]
    wait_for("one established IKE SA, the same on both sides",
             lambda: len(live(a)) == 1 and live(a) == live(b), 10, (a, b))
    leftovers = [x["state"] for d in (a, b) for x in ike_status(d)["sas"] if x["state"] != "established"]
    assert set(leftovers) <= {"deleting"}, leftovers
    r = run("ip", "netns", "exec", a.ns, PING, "-c", "5", "-i", "0.1", "-W", "2", "-I", "10.1.0.1", "10.2.0.1",
            check=False)
    assert r.returncode == 0, r.stdout
    assert a.stop() == 0 and b.stop() == 0


# ---------------------------------------------------------------------
# TCP through the tunnel
# ---------------------------------------------------------------------

# A TCP sink with its own stall timeout: prints "listening", then the
# byte count, the SHA-256 and the seconds the transfer took.
SINK = r"""
import hashlib, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
s.settimeout(float(sys.argv[3]))
print("listening", flush=True)
c, _ = s.accept()
c.settimeout(float(sys.argv[3]))
h, n, t = hashlib.sha256(), 0, time.time()
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    h.update(d)
    n += len(d)
c.sendall(b"k")
print(n, h.hexdigest(), "%.2f" % (time.time() - t), flush=True)
"""

# A TCP source paced at argv[5] bytes/s (so that a transfer lasts long
# enough to cross rekeys), giving up after argv[6] s without progress.
SOURCE = r"""
import hashlib, os, socket, sys, time
src, dst, port, size, rate, stall = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    float(sys.argv[5]), float(sys.argv[6])
data = os.urandom(size)
s = socket.socket()
s.settimeout(stall)
if src != "-":
    s.bind((src, 0))
s.connect((dst, port))
t, sent = time.time(), 0
while sent < size:
    sent += s.send(data[sent:sent + 16384])
    ahead = sent / rate - (time.time() - t)
    if ahead > 0:
        time.sleep(ahead)
s.shutdown(socket.SHUT_WR)
s.recv(1)
print(size, hashlib.sha256(data).hexdigest(), "%.2f" % (time.time() - t), flush=True)
"""


class Transfer:
    """A paced TCP transfer from `client_ns` to `server_ns`, in the
    background; `result()` checks the data arrived intact."""

    def __init__(self, lab, server_ns, server_addr, client_ns, client_src, size, rate, port, stall=20):
        self.sink = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, "-c", SINK, server_addr,
                                      str(port), str(stall)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        lab.procs.append(self.sink)
        assert faultkit.readline(self.sink).strip() == "listening", "the sink did not start"
        self.src = subprocess.Popen(["ip", "netns", "exec", client_ns, sys.executable, "-c", SOURCE,
                                     client_src or "-", server_addr, str(port), str(size), str(rate), str(stall)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lab.procs.append(self.src)
        self.t0 = time.monotonic()

    def result(self, timeout):
        """(bytes, seconds) once both ends finished with the same SHA-256."""
        left = lambda: max(1.0, timeout - (time.monotonic() - self.t0))
        try:
            sent, serr = self.src.communicate(timeout=left())
            got, gerr = self.sink.communicate(timeout=left())
        except subprocess.TimeoutExpired:
            self.src.kill()
            self.sink.kill()
            pytest.fail(f"the transfer did not finish within {timeout} s")
        s, g = sent.split(), got.split()
        assert len(s) == 3 and len(g) == 3 and s[:2] == g[:2], \
            f"sent {sent!r} {serr[-2000:]}\nreceived {got!r} {gerr[-2000:]}"
        return int(g[0]), float(g[2])


def test_tcp_under_loss_and_reordering_across_rekeys(lab, kit):
    """12 MB paced at 1 MB/s from A's side to B's through the tunnel, with
    1 % of every packet lost each way (the kernel's random), jitter up to
    3 ms and every 50th packet held 20 ms, while A rekeys the child SAs
    every ~3 s and the IKE SA every ~6 s: the SHA-256 matches, at least
    two child rekeys and one IKE rekey happened during the transfer."""
    path = kit.path()
    a, b = gateways(lab, path, a_ike='child_rekey_time = "3s"\nchild_life_time = "30s"\nrekey_time = "6s"\n'
                                     'jitter = "1s"',
                    b_ike='child_rekey_time = "1h"\nrekey_time = "1h"')
    b.start()
    a.start()
    handshake(a, b, 20)
    router = path.routers[0]
    shaper = kit.shaper(router, both_ways(path), jitter_ms=3, hold_every=50, hold_ms=20, seed=7)
    nft = drop_both_ways(kit, path, 1)
    before = counters(a)
    size = 12 * 1000 * 1000
    t = Transfer(lab, b.ns, "10.2.0.1", a.ns, "10.1.0.1", size, 1_000_000, 5301)
    n, secs = t.result(45)
    after = counters(a)
    child = after.get("child_rekeys", 0) - before.get("child_rekeys", 0)
    ike = after.get("ike_rekeys", 0) - before.get("ike_rekeys", 0)
    st = shaper.stats()
    drops = {d.ns[:4]: d.status()["drops"] for d in (a, b)}
    print(f"\nTCP under 1 % loss + reordering: {n} bytes intact in {secs:.1f} s ({n / secs / 1e6:.2f} MB/s), "
          f"{child} child rekeys, {ike} IKE rekeys, {nft.total()} packets dropped by nftables, shaper reordered "
          f"{st['ab']['reordered']} A→B / {st['ba']['reordered']} B→A of {st['ab']['in']} / {st['ba']['in']}; "
          f"espgate drops {drops}")
    assert n == size
    assert child >= 2 and ike >= 1, (before, after)
    assert nft.total() > 0 and st["ab"]["reordered"] > 0, (nft.counters(), st)
    for c in (counters(a), counters(b)):
        for k in ("child_failed", "children_expired", "ike_failed", "peers_dead"):
            assert c.get(k, 0) == 0, (k, c)
    assert a.stop() == 0 and b.stop() == 0


# ---------------------------------------------------------------------
# Link down and up
# ---------------------------------------------------------------------

# Sends a numbered datagram every argv[4] s for argv[5] s from argv[1] to
# argv[2]:argv[3], each carrying its send time; prints the send times.
PROBE_TX = r"""
import json, socket, struct, sys, time
src, dst, port, gap, dur = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
t0, sent = time.time(), []
while time.time() - t0 < dur:
    t = time.time()
    try:
        s.sendto(struct.pack("!Id", len(sent), t), (dst, port))
    except OSError:
        pass
    sent.append(t)
    time.sleep(max(0.0, t0 + len(sent) * gap - time.time()))
print(json.dumps(sent), flush=True)
"""

# Receives them for argv[3] s; prints [seq, sent, received] per datagram.
PROBE_RX = r"""
import json, socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
end = time.time() + float(sys.argv[3])
print("ready", flush=True)
got = []
while time.time() < end:
    s.settimeout(max(0.01, end - time.time()))
    try:
        d = s.recv(64)
    except socket.timeout:
        break
    i, t = struct.unpack("!Id", d[:12])
    got.append([i, t, time.time()])
print(json.dumps(got), flush=True)
"""


def test_link_down_3s_then_up_traffic_recovers(lab, kit):
    """The R–B link goes down (both ends) for 3 s under a 50 datagram/s
    UDP stream A→B and a 10/s ping stream B→A, with DPD every second: after
    the link is up again both streams arrive again within 2 s, everything
    sent well before and after the outage arrives, and the IKE SA is the
    same one (no peer declared dead, no new handshake)."""
    path = kit.path()
    a, b = gateways(lab, path, a_ike='dpd_delay = "1s"\ndpd_action = "restart"')
    b.start()
    a.start()
    handshake(a, b, 20)
    spis = ike_status(a)["sas"][0]["spis"]
    est_before = counters(a).get("ike_established", 0)
    dur = 12.0
    rx = subprocess.Popen(["ip", "netns", "exec", b.ns, sys.executable, "-c", PROBE_RX, "10.2.0.1", "5400",
                           str(dur + 3)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lab.procs.append(rx)
    assert faultkit.readline(rx).strip() == "ready", "the UDP receiver did not start"
    tx = subprocess.Popen(["ip", "netns", "exec", a.ns, sys.executable, "-c", PROBE_TX, "10.1.0.1", "10.2.0.1",
                           "5400", "0.02", str(dur)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lab.procs.append(tx)
    pinger = subprocess.Popen(["ip", "netns", "exec", b.ns, PING, "-D", "-i", "0.1", "-W", "1", "-w", str(int(dur)),
                               "-I", "10.2.0.1", "10.1.0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    lab.procs.append(pinger)
    time.sleep(3.0)
    t_down = time.time()
    path.link_down("b")
    time.sleep(3.0)
    path.link_up("b")
    t_up = time.time()
    sent = json.loads(tx.communicate(timeout=dur + 10)[0])
    got = json.loads(rx.communicate(timeout=dur + 10)[0].strip().splitlines()[-1])
    pings, ping_err = pinger.communicate(timeout=dur + 10)
    replies = [float(line[1:line.index("]")]) for line in pings.splitlines()
               if line.startswith("[") and "bytes from" in line]
    # Recovery: the first datagram received that was sent after the link
    # came up; the first ping reply after it.
    after = [g for g in got if g[1] >= t_up]
    assert after, f"nothing arrived after the link came back ({len(got)} of {len(sent)} before)"
    udp_recovery = min(g[2] for g in after) - t_up
    ping_after = [r for r in replies if r >= t_up]
    assert ping_after, pings[-2000:] + ping_err
    ping_recovery = min(ping_after) - t_up
    seqs = {g[0] for g in got}
    lost = sorted(set(range(len(sent))) - seqs)
    # Datagrams sent more than 0.5 s before the outage or 2 s after it all
    # arrived.
    outside = [(i, round(sent[i] - t_down, 3)) for i in lost if sent[i] < t_down - 0.5 or sent[i] > t_up + 2.0]
    ca = counters(a)
    print(f"\nlink down 3 s: UDP back {udp_recovery * 1000:.0f} ms after link-up, ping {ping_recovery * 1000:.0f} ms; "
          f"{len(lost)} of {len(sent)} datagrams lost ({len(outside)} outside the outage); DPD sent {ca.get('dpd_sent', 0)}, "
          f"retransmits {ca.get('retransmits', 0)}, peers dead {ca.get('peers_dead', 0)}; "
          f"A drops {a.status()['drops']}")
    assert udp_recovery < 2.0 and ping_recovery < 2.0, (udp_recovery, ping_recovery)
    assert not outside, outside
    assert ca.get("peers_dead", 0) == 0 and ca.get("ike_established", 0) == est_before, ca
    sa_after = [x["spis"] for d in (a, b) for x in ike_status(d)["sas"]]
    assert sa_after == [spis, spis], (spis, sa_after)
    assert a.stop() == 0 and b.stop() == 0


# ---------------------------------------------------------------------
# Path MTU
# ---------------------------------------------------------------------

def route_mtu(ns, dst):
    """The path MTU the kernel of `ns` has learnt for `dst` (None: none)."""
    out = run("ip", "-n", ns, "route", "get", dst).stdout
    words = out.split()
    return int(words[words.index("mtu") + 1]) if "mtu" in words else None


MTU_CASES = [
    # ESP-in-UDP as configured by default: the outer datagrams leave in UDP
    # GSO batches, which the kernel sends without DF, so R1 fragments them.
    pytest.param(dict(encap="udp"), id="udp"),
    # One datagram per send: DF set, R1 refuses and answers with ICMP,
    # gateway A's kernel learns the path MTU and fragments from then on.
    pytest.param(dict(encap="udp", extra_gw="offloads = false"), id="udp-no-offloads"),
    # Raw ESP carries the inner packet's DF: R1 refuses and answers with
    # ICMP, gateway A's kernel learns the path MTU and refuses espgate's
    # larger sends, espgate learns it from the kernel and answers hA's
    # oversized segments with ICMP "fragmentation needed" (RFC 4301 §8.2.1).
    pytest.param(dict(encap="none"), id="raw-esp"),
]


@pytest.mark.parametrize("case", MTU_CASES)
def test_path_mtu_shrinks_mid_transfer(lab, kit, case):
    """Host hA sends 10 MB to host hB at 1 MB/s through the tunnel; 3 s in,
    the link between the two routers (neither gateway's own link) drops to
    MTU 1300, below the full outer packets (about 1470 bytes). The outer
    packets exceed it (R1 fragments or refuses them) and the transfer must
    still complete intact. Recorded: R1's ICMP, the path MTU gateway A's
    kernel learnt, and what the inner sender hA learnt: with raw ESP,
    espgate's own ICMP "fragmentation needed" announcing the path MTU less
    the SA's overhead (RFC 4301 §8.2.1); with ESP-in-UDP nothing (the
    outer datagrams are fragmented instead)."""
    path = kit.path(routers=2, hosts=True)
    a, b = gateways(lab, path, **case)
    b.start()
    a.start()
    handshake(a, b, 20)
    tun_mtu = a.status()["tun"]["mtu"]
    r1_before = snmp(path.routers[0])
    t = Transfer(lab, path.hb, "10.2.1.2", path.ha, "10.1.1.2", 10 * 1000 * 1000, 1_000_000, 5501, stall=10)
    time.sleep(3.0)
    path.set_mtu("r12", 1300)
    try:
        n, secs = t.result(40)
        outcome = f"{n} bytes intact in {secs:.1f} s"
    except (AssertionError, pytest.fail.Exception) as e:
        outcome, failure = "FAILED", e
    r1 = {k: v - r1_before.get(k, 0) for k, v in snmp(path.routers[0]).items()}
    gw_pmtu = route_mtu(a.ns, path.b_addr)
    host_pmtu = route_mtu(path.ha, "10.2.1.2")
    ha = snmp(path.ha)
    st = a.status()
    print(f"\npath MTU 1300 ({case}): TUN MTU {tun_mtu}; R1 forwarded {r1['Ip.ForwDatagrams']}, fragmented "
          f"{r1['Ip.FragOKs']} into {r1['Ip.FragCreates']}, refused {r1['Ip.FragFails']}, sent "
          f"{r1['Icmp.OutDestUnreachs']} ICMP unreachables; gateway A's path MTU to B: {gw_pmtu}; host A's "
          f"to host B: {host_pmtu} (ICMP unreachables received by hA: {ha['Icmp.InDestUnreachs']}, TCP "
          f"segments retransmitted by hA: {ha['Tcp.RetransSegs']}); transfer: {outcome}; gateway A: drops "
          f"{st['drops']}, net_tx {st['counters'].get('net_tx')}, gso_sends {st['counters'].get('gso_sends')}")
    assert r1["Ip.FragOKs"] + r1["Ip.FragFails"] >= 1, "the outer packets never exceeded the narrow link"
    if outcome == "FAILED":
        raise failure
    if case.get("encap") == "none":
        # espgate told hA, and hA's kernel took the MTU it announced.
        told = st["counters"].get("icmp_too_big", 0)
        assert told >= 1 and ha["Icmp.InDestUnreachs"] >= 1, (told, ha)
        assert host_pmtu is not None and host_pmtu < 1300 - 40, host_pmtu
        assert st["drops"].get("path_mtu_exceeded", 0) >= told, st["drops"]
    assert a.stop() == 0 and b.stop() == 0
