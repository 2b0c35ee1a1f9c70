"""The gateway daemon end to end: two `espgate up` processes in two network
namespaces joined by a veth pair, with mirrored configurations and random
keys written by each test.

    gwA (TUN 10.1.0.1/24) --- veth 192.0.2.1 | 192.0.2.2 --- gwB (TUN 10.2.0.1/24)
                              (or 2001:db8::1 | 2001:db8::2)

Every test makes its own uniquely named namespaces (and the veth inside
them) and deletes exactly those, and stops exactly the daemons it started,
even on failure. Nothing is done in the root namespace but reading files.
Every wait is bounded in count and time. The last two tests run `espgate
demo --short` (four namespaces of its own, with a unique prefix) and
interrupt it.
"""

import hashlib
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun"),
    reason="needs root, iproute2 and /dev/net/tun (scripts/setup.sh installs iproute2)")

PING = shutil.which("ping")

# Key lengths in bytes: (encryption, integrity).
KEYS = {
    "aes128gcm16": (20, 0), "aes256gcm16": (36, 0), "chacha20poly1305": (36, 0),
    "aes128-sha256": (16, 32), "aes256-sha256": (32, 32), "aes256-sha1": (32, 20),
    "sha256": (0, 32), "sha1": (0, 20), "3des-sha1": (24, 20),
}

# A small TCP sink and source, run inside the namespaces.
SINK = r"""
import hashlib, socket, sys
s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
s.settimeout(30)
print("listening", flush=True)
c, _ = s.accept()
c.settimeout(30)
h, n = hashlib.sha256(), 0
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    h.update(d)
    n += len(d)
c.sendall(b"k")
print(n, h.hexdigest(), flush=True)
"""

SOURCE = r"""
import hashlib, os, socket, sys, time
data = os.urandom(int(sys.argv[4]))
fam = socket.AF_INET6 if ':' in sys.argv[2] else socket.AF_INET
s = socket.socket(fam)
s.settimeout(30)
if sys.argv[1] != "-":
    s.bind((sys.argv[1], 0))
s.connect((sys.argv[2], int(sys.argv[3])))
t = time.time()
s.sendall(data)
s.shutdown(socket.SHUT_WR)
s.recv(1)
print(len(data), hashlib.sha256(data).hexdigest(), "%.1f MB/s" % (len(data) / (time.time() - t) / 1e6),
      flush=True)
"""

# Sends each hex argument as one UDP datagram to argv[1]:argv[2].
SENDER = r"""
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET, socket.SOCK_DGRAM)
for h in sys.argv[3:]:
    s.sendto(bytes.fromhex(h), (host, port))
"""


def run(*args, timeout=30, check=True, **kw):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=check, **kw)


def ip_json(ns, *args):
    out = run("ip", "-n", ns, "-j", *args).stdout.strip()
    return json.loads(out) if out else []


class Daemon:
    def __init__(self, lab, ns, cfg, sock, log):
        self.lab, self.ns, self.cfg, self.sock, self.log = lab, ns, cfg, sock, log
        self.proc = None

    def start(self):
        self.logf = open(self.log, "ab")
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, self.lab.espgate, "up", "-c", str(self.cfg)],
                                     stdout=self.logf, stderr=subprocess.STDOUT)
        self.lab.procs.append(self.proc)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"espgate in {self.ns} exited with {self.proc.returncode}:\n{self.log_text()}")
            r = run(self.lab.espgate, "status", "--json", "-s", str(self.sock), check=False)
            if r.returncode == 0:
                return self
            time.sleep(0.05)
        pytest.fail(f"espgate in {self.ns} did not answer on {self.sock} within 10 s:\n{self.log_text()}")

    def log_text(self):
        return pathlib.Path(self.log).read_text(errors="replace")

    def status(self):
        r = run(self.lab.espgate, "status", "--json", "-s", str(self.sock), check=False)
        assert r.returncode == 0, f"{r.stderr}\n{self.log_text()}"
        return json.loads(r.stdout)

    def sas(self, direction):
        return [sa for c in self.status()["connections"] for sa in c["sas"] if sa["direction"] == direction]

    def stop(self, sig=signal.SIGTERM):
        """Signals the daemon and waits (bounded) for it; returns its exit code."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=10)
        finally:
            self.logf.close()


class Lab:
    def __init__(self, espgate, tmp):
        self.espgate, self.tmp = espgate, tmp
        self.namespaces, self.procs = [], []

    def netns(self, tag):
        name = f"eg{tag}-{uuid.uuid4().hex[:10]}"
        run("ip", "netns", "add", name)
        self.namespaces.append(name)
        run("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def pair(self, v6=False):
        """Two namespaces joined by a veth pair; returns (nsA, nsB, addrA, addrB)."""
        a, b = self.netns("A"), self.netns("B")
        run("ip", "-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", b)
        if v6:
            addr_a, addr_b, plen = "2001:db8::1", "2001:db8::2", "64"
        else:
            addr_a, addr_b, plen = "192.0.2.1", "192.0.2.2", "24"
        for ns, dev, addr in ((a, "va", addr_a), (b, "vb", addr_b)):
            extra = ["nodad"] if v6 else []
            run("ip", "-n", ns, "addr", "add", f"{addr}/{plen}", "dev", dev, *extra)
            run("ip", "-n", ns, "link", "set", dev, "up")
        return a, b, addr_a, addr_b

    def cleanup(self):
        try:
            for p in self.procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        try:
                            p.wait(timeout=10)
                        except subprocess.TimeoutExpired:
                            pass
        finally:
            # The namespaces go whatever happened to the processes (a pair
            # was once left behind by a CI run).
            for ns in self.namespaces:
                subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)


@pytest.fixture
def lab(espgate, tmp_path):
    lab = Lab(espgate, tmp_path)
    try:
        yield lab
    finally:
        lab.cleanup()


def keyhex(n):
    return secrets.token_hex(n)


def sa_table(proto_key, suite, spi_a_in, spi_a_out, key_files, dirs):
    """The [connection.esp|ah] tables for A and B (mirrored), keys random."""
    enc_len, integ_len = KEYS[suite]
    k = {name: keyhex(n) for name, n in (("enc_ab", enc_len), ("enc_ba", enc_len),
                                         ("integ_ab", integ_len), ("integ_ba", integ_len)) if n}
    out = []
    for side, (spi_in, spi_out) in (("A", (spi_a_in, spi_a_out)), ("B", (spi_a_out, spi_a_in))):
        # A sends with *_ab keys, B with *_ba keys.
        mine, theirs = ("ab", "ba") if side == "A" else ("ba", "ab")
        lines = [f"[connection.{proto_key}]", f'suite = "{suite}"', f"spi_in = {spi_in:#x}",
                 f"spi_out = {spi_out:#x}"]
        for kind in ("enc", "integ"):
            for direction, which in (("in", theirs), ("out", mine)):
                key = k.get(f"{kind}_{which}")
                if key is None:
                    continue
                if key_files:
                    f = dirs[side] / f"{proto_key}.{kind}_{direction}"
                    f.write_text(key + "\n")
                    f.chmod(0o600)
                    lines.append(f'{kind}_{direction}_file = "{f.name}"')
                else:
                    lines.append(f'{kind}_{direction} = "{key}"')
        out.append("\n".join(lines) + "\n")
    return out


def configs(lab, *, protocol="esp", encap="udp", esp="aes128gcm16", ah="sha256", v6_outer=False,
            inner=("v4",), mode="tunnel", fwmark=None, key_files=False, extra_conn="", extra_a="", extra_gw="",
            esp_spis=(0x1001, 0x1002)):
    """Starts nothing; returns the (A, B) daemons for a fresh namespace pair.
    `extra_conn` goes into both connection tables, `extra_a` into A's only,
    `extra_gw` into both [gateway] tables."""
    a_ns, b_ns, a_addr, b_addr = lab.pair(v6=v6_outer)
    dirs = {"A": lab.tmp / "A", "B": lab.tmp / "B"}
    for d in dirs.values():
        d.mkdir()
    tables = {"A": "", "B": ""}
    if "esp" in protocol:
        ta, tb = sa_table("esp", esp, esp_spis[0], esp_spis[1], key_files, dirs)
        tables["A"] += ta
        tables["B"] += tb
    if "ah" in protocol:
        ta, tb = sa_table("ah", ah, 0x2001, 0x2002, key_files, dirs)
        tables["A"] += ta
        tables["B"] += tb
    daemons = []
    for side, ns, local, remote, me, peer in (("A", a_ns, a_addr, b_addr, 1, 2), ("B", b_ns, b_addr, a_addr, 2, 1)):
        tun_addr, lts, rts = [], [], []
        if mode == "tunnel":
            if "v4" in inner:
                tun_addr.append(f'"10.{me}.0.1/24"')
                lts.append(f'"10.{me}.0.0/24"')
                rts.append(f'"10.{peer}.0.0/24"')
            if "v6" in inner:
                tun_addr.append(f'"2001:db8:{me}::1/64"')
                lts.append(f'"2001:db8:{me}::/64"')
                rts.append(f'"2001:db8:{peer}::/64"')
        listen = "[::]:4500" if v6_outer else "0.0.0.0:4500"
        gw = [f'tun = "tun{side}"', f"tun_address = [{', '.join(tun_addr)}]", f'listen = "{listen}"',
              f'encap = "{encap}"', 'control_socket = "ctl.sock"', 'state_dir = "state"', 'log = "debug"']
        if fwmark:
            gw.append(f"fwmark = {fwmark:#x}")
        if extra_gw:
            gw.append(extra_gw)
        conn = [f'name = "to-{"b" if side == "A" else "a"}"', f'local = "{local}"', f'remote = "{remote}"',
                f'mode = "{mode}"', f'protocol = "{protocol}"']
        if mode == "tunnel":
            conn += [f"local_ts = [{', '.join(lts)}]", f"remote_ts = [{', '.join(rts)}]"]
        extra = extra_conn + "\n" + (extra_a if side == "A" else "")
        text = "[gateway]\n" + "\n".join(gw) + "\n\n[[connection]]\n" + "\n".join(conn) + "\n" + extra \
            + "\n" + tables[side]
        cfg = dirs[side] / "gw.toml"
        cfg.write_text(text)
        cfg.chmod(0o600)
        daemons.append(Daemon(lab, ns, cfg, dirs[side] / "ctl.sock", dirs[side] / "log"))
    return daemons


def snmp(ns):
    """Namespace `ns`'s /proc/net/snmp as {"Icmp.OutDestUnreachs": n, …}."""
    lines = run("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").stdout.splitlines()
    out = {}
    for head, vals in zip(lines[::2], lines[1::2]):
        group = head.split(":")[0]
        for k, v in zip(head.split()[1:], vals.split()[1:]):
            out[f"{group}.{k}"] = int(v)
    return out


def kernel_counters(namespaces):
    """{ns: snmp(ns)} for `namespaces`: the `kernel_before` of
    `assert_lost_only_in_kernel_buffers`."""
    return {ns: snmp(ns) for ns in namespaces}


def assert_lost_only_in_kernel_buffers(end, daemons, kernel_before, context=""):
    """Nothing lost by espgate: every datagram the receiver missed (`end`:
    iperf3's JSON summary, or the cluster tests' udp_stream count) was
    dropped by a full kernel receive buffer, the receiver's or a
    gateway's, counted per namespace since
    `kernel_before` ({ns: snmp(ns)}). A loaded machine does that: one
    clean-clone CI run of 2026-11-29 lost 48 of 124 999 in a rekey test
    with no drop counted by either gateway. A failure shows the daemons'
    drop reasons and their interfaces' drop counters."""
    drops = {d.ns: d.status()["drops"] for d in daemons}
    rcvbuf = sum(snmp(ns)["Udp.RcvbufErrors"] - k["Udp.RcvbufErrors"] for ns, k in kernel_before.items())
    print(f"{end['lost_packets']} of {end['packets']} datagrams lost; kernel receive-buffer drops: {rcvbuf}; "
          f"espgate's drops: {drops}; {context}")
    assert end["lost_packets"] <= rcvbuf, (end, context, drops, f"kernel receive-buffer drops: {rcvbuf}",
                                           {d.ns: run("ip", "-n", d.ns, "-s", "link").stdout for d in daemons})


def ping(ns, dst, src=None, count=3):
    args = ["ip", "netns", "exec", ns, PING, "-c", str(count), "-i", "0.2", "-W", "2"]
    if src:
        args += ["-I", src]
    return run(*args, dst, check=False, timeout=30)


def assert_ping(ns, dst, src=None, daemons=()):
    r = ping(ns, dst, src)
    logs = "\n".join(f"--- {d.ns} ---\n{d.log_text()}" for d in daemons)
    assert r.returncode == 0, f"ping {dst} failed:\n{r.stdout}{r.stderr}\n{logs}"


def assert_clean(d, min_packets):
    """The daemon's SAs carried traffic and nothing was dropped."""
    st = d.status()
    for c in st["connections"]:
        for sa in c["sas"]:
            assert sa["packets"] >= min_packets, (d.ns, sa)
            assert sa["drops"] == {}, (d.ns, sa)
    assert st["drops"] == {}, (d.ns, st["drops"])
    return st


def tcp_transfer(lab, server_ns, server_addr, client_ns, client_src, size, port=5201):
    sink = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, "-c", SINK, server_addr, str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lab.procs.append(sink)
    assert sink.stdout.readline().strip() == "listening", sink.stderr.read()
    src = run("ip", "netns", "exec", client_ns, sys.executable, "-c", SOURCE, client_src or "-", server_addr,
              str(port), str(size), timeout=60)
    out, err = sink.communicate(timeout=60)
    sent = src.stdout.split()
    got = out.split()
    assert got[:2] == sent[:2], f"sent {src.stdout} received {out} {err}"
    return src.stdout.strip()


SITE_CASES = {
    "esp-udp-aes128gcm16": dict(protocol="esp", encap="udp", esp="aes128gcm16", key_files=True),
    "esp-raw-aes256-sha256": dict(protocol="esp", encap="none", esp="aes256-sha256"),
    "esp-udp-v6outer-v4inner": dict(protocol="esp", encap="udp", esp="chacha20poly1305", v6_outer=True),
    "esp-udp-v4outer-v6inner": dict(protocol="esp", encap="udp", esp="aes256gcm16", inner=("v4", "v6")),
    "ah-raw-sha256": dict(protocol="ah", encap="none", ah="sha256"),
    "esp+ah-raw": dict(protocol="esp+ah", encap="none", esp="aes256-sha1", ah="sha256"),
    "esp+ah-raw-v6outer": dict(protocol="esp+ah", encap="none", esp="aes128gcm16", ah="sha1", v6_outer=True),
    "qesp-raw-aes128gcm16": dict(protocol="qesp", encap="none", esp="aes128gcm16"),
    "qesp-raw-v6outer-v4v6inner": dict(protocol="qesp", encap="none", esp="aes256-sha256", v6_outer=True,
                                       inner=("v4", "v6")),
}


@pytest.mark.skipif(PING is None, reason="needs ping (iputils-ping; scripts/setup.sh installs it)")
@pytest.mark.parametrize("case", list(SITE_CASES))
def test_site_to_site_ping(lab, case):
    kw = SITE_CASES[case]
    a, b = configs(lab, **kw)
    a.start()
    b.start()
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    if "v6" in kw.get("inner", ()):
        assert_ping(a.ns, "2001:db8:2::1", "2001:db8:1::1", (a, b))
    for d in (a, b):
        st = assert_clean(d, 3)
        assert st["tun"]["name"] in ("tunA", "tunB")
        assert st["counters"]["net_rx"] >= 3 and st["counters"]["tun_tx"] >= 3
    # The TUN MTU leaves room for the outer headers.
    st = a.status()
    assert 1300 < st["tun"]["mtu"] < 1500
    link = ip_json(a.ns, "link", "show", "dev", "tunA")[0]
    assert link["mtu"] == st["tun"]["mtu"]
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(not shutil.which("tcpdump"), reason="needs tcpdump")
def test_tcp_transfer_through_the_tunnel_with_mss_clamping(lab):
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16", extra_a="mss_clamp = 1000")
    a.start()
    b.start()
    from scapy.all import TCP
    # A clamps both ways: its SYN on the way out (1398 from its TUN MTU
    # of 1438, down to 1000) and the SYN-ACK on the way in.
    syn_ack = capture_one(lab, a.ns, "tunA", "tcp[tcpflags] & tcp-syn != 0 and tcp[tcpflags] & tcp-ack != 0",
                          lambda: tcp_transfer(lab, b.ns, "10.2.0.1", a.ns, "10.1.0.1", 1000, port=5203))
    assert dict(syn_ack[TCP].options)["MSS"] == 1000, syn_ack[TCP].options
    rates = []
    syn = capture_one(lab, b.ns, "tunB", "tcp[tcpflags] & tcp-syn != 0 and tcp[tcpflags] & tcp-ack == 0",
                      lambda: rates.append(tcp_transfer(lab, b.ns, "10.2.0.1", a.ns, "10.1.0.1",
                                                        50 * 1000 * 1000)))
    print("50 MB through the tunnel:", rates)
    assert rates
    assert dict(syn[TCP].options)["MSS"] == 1000, syn[TCP].options
    # Two connections: each SYN out and each SYN-ACK in.
    assert a.status()["counters"]["mss_clamped"] == 4
    # The bulk left A in GSO batches and reached B in GRO batches.
    sa_, sb = a.status(), b.status()
    for st in (sa_, sb):
        assert {"udp_gso", "udp_gro", "tun_vnet_hdr", "tun_csum", "tun_tso4", "tun_tso6"} <= \
            set(st["offloads"]), st["offloads"]
    assert sa_["counters"]["gso_sends"] > 0 and sa_["counters"]["net_tx"] > 2 * sa_["counters"]["gso_sends"], \
        sa_["counters"]
    assert sb["counters"]["gro_reads"] > 0, sb["counters"]
    # TCP left A's stack as TSO super-segments, cut by A; B coalesced the
    # decrypted segments into super-segments for its TUN.
    assert sa_["counters"]["tso_reads"] > 0, sa_["counters"]
    assert sa_["counters"]["tun_rx"] > 2 * sa_["counters"]["tso_reads"], sa_["counters"]
    assert sb["counters"]["tun_gso_writes"] > 0, sb["counters"]
    assert sb["counters"]["tun_tx"] > 2 * sb["counters"]["tun_gso_writes"], sb["counters"]
    # (Few ACKs come back: B's stack acknowledges coalesced super-segments.)
    for d in (a, b):
        st = assert_clean(d, 200)
        assert st["counters"]["tun_rx"] >= 200
    # Big segments arrived whole: the inbound SA at B carried >= 50 MB.
    assert b.sas("in")[0]["bytes"] >= 50 * 1000 * 1000
    assert a.stop() == 0 and b.stop() == 0


# Receives UDP datagrams on argv[1]:argv[2] until argv[3] arrived or 3 s
# pass without one; each must be the one SEQ_SENDER made for its index.
SEQ_SINK = r"""
import random, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind((sys.argv[1], int(sys.argv[2])))
s.settimeout(3)
print("listening", flush=True)
want, good, bad, seen = int(sys.argv[3]), 0, 0, set()
while good < want:
    try:
        d = s.recv(65536)
    except socket.timeout:
        break
    i = int.from_bytes(d[:4], "big")
    n = 200 + (i * 37) % 1200 if i % 50 == 49 else 1200
    ok = len(d) == n and d[4:] == random.Random(i).randbytes(n - 4) and i not in seen
    seen.add(i)
    good, bad = good + ok, bad + (not ok)
print(good, bad, flush=True)
"""

# Sends argv[3] datagrams in bursts of 64: 1200 bytes each, every 50th
# shorter, each with its index and bytes only that index makes.
SEQ_SENDER = r"""
import random, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[3])):
    n = 200 + (i * 37) % 1200 if i % 50 == 49 else 1200
    s.sendto(i.to_bytes(4, "big") + random.Random(i).randbytes(n - 4), (sys.argv[1], int(sys.argv[2])))
    if i % 64 == 63:
        time.sleep(0.002)
"""


def test_udp_datagrams_are_coalesced_for_the_tun_and_arrive_intact(lab):
    """With USO on the TUN, B writes the decrypted datagrams of one flow as
    UDP super-packets; the kernel cuts them again and every datagram
    reaches the receiver whole (content, length and UDP checksum, which
    the receiver's stack verifies)."""
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16")
    a.start()
    b.start()
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    assert "tun_uso" in b.status()["offloads"], b.status()["offloads"]
    before = b.status()["counters"]
    n = 3000
    sink = subprocess.Popen(["ip", "netns", "exec", b.ns, sys.executable, "-c", SEQ_SINK, "10.2.0.1", "5331", str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lab.procs.append(sink)
    assert sink.stdout.readline().strip() == "listening", sink.stderr.read()
    run("ip", "netns", "exec", a.ns, sys.executable, "-c", SEQ_SENDER, "10.2.0.1", "5331", str(n), timeout=60)
    out, err = sink.communicate(timeout=30)
    good, bad = map(int, out.split())
    assert bad == 0, (out, err)
    assert good >= n * 0.98, (good, b.status()["counters"], b.status()["drops"])
    after = b.status()["counters"]
    writes = after["tun_gso_writes"] - before.get("tun_gso_writes", 0)
    tx = after["tun_tx"] - before.get("tun_tx", 0)
    assert writes > 0 and tx > 2 * writes, after
    for d in (a, b):
        assert d.status()["drops"] == {}, (d.ns, d.status()["drops"])
    assert a.stop() == 0 and b.stop() == 0


def test_a_slow_cipher_does_not_hold_a_round_back(lab):
    """3DES seals a full-size packet in tens of microseconds, so a round of
    64 takes milliseconds: the worker sends what it has sealed once the
    first packet has waited its hold time, and writes what it has opened
    to the TUN likewise, instead of keeping it to the end of the round
    while the other gateway idles (counter `hold_flushes`, which the
    previous build does not have). The transfer arrives whole, and nothing
    is dropped."""
    a, b = configs(lab, protocol="esp", encap="none", esp="3des-sha1", extra_conn="allow_insecure = true")
    a.start()
    b.start()
    print("20 MB over raw ESP with 3DES:",
          tcp_transfer(lab, b.ns, "10.2.0.1", a.ns, "10.1.0.1", 20 * 1000 * 1000))
    sa_, sb = a.status()["counters"], b.status()["counters"]
    print("A:", sa_, "\nB:", sb)
    # A sealed the bulk (TSO reads of up to 64 KiB, ~45 packets each).
    assert sa_["tso_reads"] > 0 and sa_["hold_flushes"] > 0, sa_
    # B opened it and coalesced it for its TUN.
    assert sb["tun_gso_writes"] > 0 and sb["hold_flushes"] > 0, sb
    # What leaves early still leaves in batches, not a packet per call.
    assert sa_["raw_batch_sends"] > 0, sa_
    for d in (a, b):
        assert_clean(d, 200)
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(not shutil.which("tcpdump"), reason="needs tcpdump")
@pytest.mark.parametrize("mode", ["tunnel", "transport"])
def test_qesp_gateways_carry_tcp_with_the_ports_in_clear(lab, mode):
    """Two gateways on Q-ESP (manual keys): a TCP transfer crosses, and on
    the wire between them the Q-ESP header (protocol 253) shows the
    transfer's ports in clear (docs/QESP.md §3)."""
    a, b = configs(lab, protocol="qesp", encap="none", esp="chacha20poly1305", mode=mode,
                   fwmark=0x4500 if mode == "transport" else None)
    a.start()
    b.start()
    server, client = ("10.2.0.1", "10.1.0.1") if mode == "tunnel" else ("192.0.2.2", None)
    hdr = capture_one(lab, a.ns, "va", "ip proto 253 and ip[22:2] = 5210",
                      lambda: tcp_transfer(lab, b.ns, server, a.ns, client, 3 * 1000 * 1000, port=5210))
    raw = bytes(hdr)[14:]  # Ethernet off
    assert raw[9] == 253
    assert int.from_bytes(raw[22:24], "big") == 5210 and raw[24] == 6, raw[20:36].hex()
    assert raw[25:28] == b"\0\0\0"
    for d in (a, b):
        # Few ACKs come back (B's stack acknowledges the super-segments B
        # coalesces, up to 64 segments each): 10 is the floor both ways.
        st = assert_clean(d, 10)
        sas = st["connections"][0]["sas"]
        assert {sa["protocol"] for sa in sas} == {"qesp"}, sas
        assert all(sa["mode"] == mode for sa in sas)
    # The data direction: 3 MB is over 2000 segments.
    assert a.sas("out")[0]["packets"] >= 1000 and b.sas("in")[0]["packets"] >= 1000, (a.sas("out"), b.sas("in"))
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.parametrize("encap,offloads,v6", [("udp", True, False), ("udp", False, False),
                                               ("none", True, False), ("none", True, True)],
                         ids=["offloads", "no-offloads", "raw", "raw-v6-outer"])
def test_hot_path_allocates_nothing_under_load(lab, encap, offloads, v6):
    """Zero heap allocations per packet in the steady state: the daemon's
    counting allocator (`hot_path_allocs`) does not move while 30 MB cross
    the tunnel both ways after a warm-up transfer. Raw ESP, which has no
    GSO, also leaves in one `sendmmsg` call per run instead of one system
    call per packet (`raw_batch_sends`)."""
    a, b = configs(lab, protocol="esp", encap=encap, esp="aes128gcm16", v6_outer=v6,
                   extra_gw="" if offloads else "offloads = false")
    a.start()
    b.start()
    tcp_transfer(lab, b.ns, "10.2.0.1", a.ns, "10.1.0.1", 2 * 1000 * 1000, port=5204)
    tcp_transfer(lab, a.ns, "10.1.0.1", b.ns, "10.2.0.1", 2 * 1000 * 1000, port=5205)
    before = [d.status()["counters"] for d in (a, b)]
    tcp_transfer(lab, b.ns, "10.2.0.1", a.ns, "10.1.0.1", 30 * 1000 * 1000, port=5206)
    tcp_transfer(lab, a.ns, "10.1.0.1", b.ns, "10.2.0.1", 30 * 1000 * 1000, port=5207)
    after = [d.status()["counters"] for d in (a, b)]
    for d, x, y in zip((a, b), before, after):
        packets = (y["tun_rx"] - x["tun_rx"]) + (y["net_rx"] - x["net_rx"])
        print(f"{d.ns}: {packets} packets, hot-path allocations {x['hot_path_allocs']} -> "
              f"{y['hot_path_allocs']}")
        assert packets > 20_000, (x, y)
        assert y["hot_path_allocs"] == x["hot_path_allocs"], (x, y)
        if encap == "none":
            batches = y["raw_batch_sends"] - x.get("raw_batch_sends", 0)
            sent = y["net_tx"] - x["net_tx"]
            print(f"{d.ns}: {sent} packets sent, {batches} sendmmsg calls of several")
            assert batches > 0 and sent > 2 * batches, (x, y)
        assert_clean(d, 200)
    assert a.stop() == 0 and b.stop() == 0


# Sends bursts of datagrams alternating over (address, TOS) targets, each
# with its target's own sequence number; prints how many went to each.
BURSTS = r"""
import socket, struct, sys, time
src, port, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
targets = [(t.split("/")[0], int(t.split("/")[1], 0)) for t in sys.argv[4:]]
socks = []
for _, tos in targets:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    s.bind((src, 0))
    socks.append(s)
seq = [0] * len(targets)
for _ in range(rounds):
    for i in range(64):
        k = i % len(targets)
        socks[k].sendto(struct.pack("!Q", seq[k]) + bytes(92), (targets[k][0], port))
        seq[k] += 1
    time.sleep(0.002)
print(*seq, flush=True)
"""

# Receives on each address at one port until SIGTERM; prints, per address,
# [received, out of order] as JSON.
BURST_SINK = r"""
import json, select, signal, socket, struct, sys
port = int(sys.argv[1])
socks = []
for a in sys.argv[2:]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind((a, port))
    socks.append(s)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
got = [[0, 0, -1] for _ in socks]
print("listening", flush=True)
while not stop:
    try:
        ready, _, _ = select.select(socks, [], [], 0.05)
    except InterruptedError:
        continue
    for s in ready:
        g = got[socks.index(s)]
        (n,) = struct.unpack_from("!Q", s.recv(2048))
        g[0] += 1
        g[1] += n < g[2]
        g[2] = max(g[2], n)
print(json.dumps([g[:2] for g in got]), flush=True)
"""


def two_peer_configs(lab):
    """A with two connections over ESP in UDP to two addresses of B
    (192.0.2.2 for 10.2.0.0/25, 192.0.2.12 for 10.2.0.128/25), B with the
    mirror of each; nothing started."""
    a_ns, b_ns, a_addr, b_addr = lab.pair()
    b_addr2 = "192.0.2.12"
    run("ip", "-n", b_ns, "addr", "add", f"{b_addr2}/24", "dev", "vb")
    halves = [(b_addr, "10.2.0.0/25", 0x3001), (b_addr2, "10.2.0.128/25", 0x3003)]
    texts = {"A": [], "B": []}
    dirs = {"A": lab.tmp / "A", "B": lab.tmp / "B"}
    for d in dirs.values():
        d.mkdir()
    for k, (far, half, spi) in enumerate(halves):
        ta, tb = sa_table("esp", "aes128gcm16", spi, spi + 1, False, dirs)
        texts["A"].append(f'[[connection]]\nname = "to-b{k}"\nlocal = "{a_addr}"\nremote = "{far}"\n'
                          f'local_ts = ["10.1.0.0/24"]\nremote_ts = ["{half}"]\n' + ta)
        texts["B"].append(f'[[connection]]\nname = "to-a{k}"\nlocal = "{far}"\nremote = "{a_addr}"\n'
                          f'local_ts = ["{half}"]\nremote_ts = ["10.1.0.0/24"]\n' + tb)
    daemons = []
    for side, ns, tun_addr in (("A", a_ns, '"10.1.0.1/24"'), ("B", b_ns, '"10.2.0.1/24", "10.2.0.129/24"')):
        gw = (f'[gateway]\ntun = "tun{side}"\ntun_address = [{tun_addr}]\nlisten = "0.0.0.0:4500"\n'
              'control_socket = "ctl.sock"\nstate_dir = "state"\nlog = "debug"\n\n')
        cfg = dirs[side] / "gw.toml"
        cfg.write_text(gw + "\n".join(texts[side]))
        cfg.chmod(0o600)
        daemons.append(Daemon(lab, ns, cfg, dirs[side] / "ctl.sock", dirs[side] / "log"))
    return daemons


@pytest.mark.parametrize("targets", [["10.2.0.1/0", "10.2.0.129/0"], ["10.2.0.1/0", "10.2.0.1/0xb8"]],
                         ids=["two-peers", "two-tos"])
def test_runs_for_several_peers_leave_in_one_sendmmsg(lab, targets):
    """A batch whose packets alternate between two peers leaves as one GSO
    run per peer (`gso_sends`), both in one `sendmmsg` (`udp_batch_sends`);
    one alternating between two TOS values to one peer stays in its order
    (one SA's sequence numbers), many short runs, still in one `sendmmsg`
    and not one system call each. Every datagram arrives, in order for
    each peer, and the steady state allocates nothing."""
    a, b = two_peer_configs(lab)
    a.start()
    b.start()
    port = 5301
    addrs = sorted({t.split("/")[0] for t in targets})

    def bursts(rounds):
        sink = subprocess.Popen(["ip", "netns", "exec", b.ns, sys.executable, "-c", BURST_SINK, str(port), *addrs],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lab.procs.append(sink)
        assert sink.stdout.readline().strip() == "listening", sink.stderr.read()
        sent = run("ip", "netns", "exec", a.ns, sys.executable, "-c", BURSTS, "10.1.0.1", str(port), str(rounds),
                   *targets, timeout=60).stdout.split()
        time.sleep(1)
        sink.send_signal(signal.SIGTERM)
        out, err = sink.communicate(timeout=10)
        return [int(n) for n in sent], json.loads(out)

    bursts(5)
    before = a.status()["counters"]
    sent, got = bursts(200)
    after = a.status()["counters"]
    # Per destination address: what was sent to it (both TOS values go to
    # one address in the second case) against what arrived, none late.
    want = {addr: sum(n for t, n in zip(targets, sent) if t.startswith(addr + "/")) for addr in addrs}
    assert [g[0] for g in got] == [want[x] for x in addrs], (sent, got)
    if len(addrs) == 2:
        assert all(g[1] == 0 for g in got), got
    calls = after["udp_batch_sends"] - before.get("udp_batch_sends", 0)
    out = after["net_tx"] - after.get("keepalives_sent", 0) - (before["net_tx"] - before.get("keepalives_sent", 0))
    print(f"{out} datagrams, {calls} sendmmsg calls of several runs, "
          f"{after['gso_sends'] - before['gso_sends']} GSO runs")
    gso = after["gso_sends"] - before["gso_sends"]
    assert out >= sum(sent), (before, after)
    assert calls > 0, (before, after)
    if len(addrs) == 2:
        # Gathered per peer: far fewer messages than datagrams.
        assert gso > 0 and out > 4 * gso, (before, after)
    assert after["hot_path_allocs"] == before["hot_path_allocs"], (before, after)
    for d in (a, b):
        assert_clean(d, 0)
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(PING is None, reason="needs ping")
@pytest.mark.parametrize("encap,v6", [("udp", False), ("none", True)], ids=["udp-v4", "raw-v6"])
def test_transport_mode_host_to_host(lab, encap, v6):
    a, b = configs(lab, protocol="esp", encap=encap, esp="aes128-sha256", mode="transport", fwmark=0x4500,
                   v6_outer=v6)
    a.start()
    b.start()
    peer = "2001:db8::2" if v6 else "192.0.2.2"
    fam = "-6" if v6 else "-4"
    # The route to the peer goes through the TUN in table 0x4500, and the
    # rule sends unmarked packets there.
    # Its fail-closed twin, a blackhole at a far higher metric, takes over
    # only if the TUN route vanishes without the daemon undoing it.
    routes = ip_json(a.ns, fam, "route", "show", "table", str(0x4500))
    assert [(r["dst"], r.get("type", "unicast")) for r in routes] == [(peer, "unicast"), (peer, "blackhole")], routes
    rules = ip_json(a.ns, fam, "rule")
    assert any("not" in r and r.get("table") == str(0x4500) for r in rules), rules
    assert_ping(a.ns, peer, None, (a, b))
    tcp_transfer(lab, b.ns, peer, a.ns, None, 2 * 1000 * 1000, port=5202)
    for d in (a, b):
        st = assert_clean(d, 10)
        for sa in st["connections"][0]["sas"]:
            assert sa["mode"] == "transport"
    assert a.stop() == 0 and b.stop() == 0
    for ns in (a.ns, b.ns):
        assert not [r for r in ip_json(ns, fam, "rule") if r.get("table") == str(0x4500)]


def test_strict_rp_filter_is_diagnosed(lab):
    a, _ = configs(lab, protocol="esp", encap="udp", mode="transport", fwmark=0x4500)
    for key in ("all", "va"):
        run("ip", "netns", "exec", a.ns, "sysctl", "-qw", f"net.ipv4.conf.{key}.rp_filter=1")
    a.start()
    assert "strict reverse-path filtering on va" in a.log_text(), a.log_text()
    assert a.stop() == 0


def capture_one(lab, ns, dev, bpf, trigger, timeout=10):
    """tcpdump one packet matching `bpf` on `dev` in `ns` while `trigger()` runs; returns it (Scapy)."""
    from scapy.all import rdpcap
    cap = lab.tmp / f"cap-{uuid.uuid4().hex[:6]}.pcap"
    dump = subprocess.Popen(["ip", "netns", "exec", ns, "tcpdump", "-i", dev, "-U", "-c", "1", "-w", str(cap), bpf],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lab.procs.append(dump)
    deadline = time.time() + timeout
    while time.time() < deadline and not (cap.exists() and cap.stat().st_size >= 24):
        time.sleep(0.05)
    trigger()
    try:
        dump.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        dump.terminate()
        dump.wait(timeout=10)
    pkts = rdpcap(str(cap))
    assert pkts, dump.stderr.read()
    return pkts[0]


# The TUN MTU each case should get at gateway.mtu = 1500, and the length
# of the outer packet that carries an inner packet of that size, worked out
# by hand from RFC 4303/4302 (outer IPv4 20, UDP 8, ESP header 8 or Q-ESP 16,
# IV, ICV; the body is padded to 16 bytes for AES-GCM and AES-CBC; AH
# 12 + ICV, padded to 4 bytes in IPv4): 1500 less the fixed bytes, rounded
# down to the padding, less the 2-byte ESP trailer.
FULL_SIZE_CASES = {
    # 20 + 8 + 8 + 8 + 16 = 60 fixed; 1440 = 90 blocks.
    "esp-udp-aes128gcm16": (dict(protocol="esp", encap="udp", esp="aes128gcm16"), 1438, 1500),
    # 20 + 8 + 16 + 16 = 60 fixed; 1440 = 90 blocks.
    "esp-raw-aes256-sha256": (dict(protocol="esp", encap="none", esp="aes256-sha256"), 1438, 1500),
    # 20 + 16 + 8 + 16 = 60 fixed; 1440 = 90 blocks.
    "qesp-raw-aes128gcm16": (dict(protocol="qesp", encap="none", esp="aes128gcm16"), 1438, 1500),
    # AH 12 + 16 = 28 in IPv4 (no outer header: transport over the ESP
    # packet), ESP 20 + 8 + 16 + 12 = 56: 1416 left, 88 blocks = 1408;
    # the outer packet 28 + 56 + 1408.
    "esp+ah-raw": (dict(protocol="esp+ah", encap="none", esp="aes256-sha1", ah="sha256"), 1406, 1492),
}


@pytest.mark.skipif(PING is None or not shutil.which("tcpdump"), reason="needs ping and tcpdump")
@pytest.mark.parametrize("case", list(FULL_SIZE_CASES))
def test_a_packet_of_the_tun_mtu_leaves_whole_within_the_outer_mtu(lab, case):
    kw, want, outer_len = FULL_SIZE_CASES[case]
    a, b = configs(lab, **kw)
    a.start()
    b.start()
    mtu = a.status()["tun"]["mtu"]
    assert mtu == want and b.status()["tun"]["mtu"] == want
    # A ping of exactly the TUN MTU with DF leaves as one unfragmented outer
    # packet within gateway.mtu; the padding is counted exactly, not at its
    # worst (which would leave up to 15 bytes of the path unused).
    big = lambda: run("ip", "netns", "exec", a.ns, PING, "-c", "2", "-i", "0.2", "-W", "2", "-M", "do",
                      "-s", str(mtu - 28), "-I", "10.1.0.1", "10.2.0.1", timeout=30)
    outer = capture_one(lab, a.ns, "va", "src host 192.0.2.1 and greater 1300", big)
    from scapy.all import IP
    assert (outer[IP].len, outer[IP].flags.MF, outer[IP].frag) == (outer_len, 0, 0), outer.summary()
    # One byte more does not fit the TUN: the sender's kernel refuses it.
    r = run("ip", "netns", "exec", a.ns, PING, "-c", "1", "-W", "2", "-M", "do", "-s", str(mtu - 27),
            "-I", "10.1.0.1", "10.2.0.1", check=False, timeout=30)
    assert r.returncode != 0, r.stdout
    for d in (a, b):
        assert_clean(d, 2)
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(PING is None or not shutil.which("tcpdump"), reason="needs ping and tcpdump")
def test_tfc_padding_to_65535_makes_every_outer_packet_as_long_as_the_path(lab):
    # TFC padding (RFC 4303 §2.4) stops at the longest packet the SA keeps
    # within gateway.mtu, so 65535 means "pad to the path": a small ping and
    # a full-size one both leave as outer packets of exactly 1500 bytes
    # (AES-128-GCM in UDP: the TUN MTU 1438 plus 62), both ways, and the
    # receivers strip the padding (the pings are answered).
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16", extra_conn="tfc_pad_to = 65535")
    a.start()
    b.start()
    mtu = a.status()["tun"]["mtu"]
    assert mtu == 1438
    # The start-up log says where the padding stops.
    for d in (a, b):
        assert "TFC padding stops at 1438 bytes" in d.log_text() and "tfc_pad_to = 65535" in d.log_text()
    from scapy.all import IP
    for size in (56, mtu - 28):
        pinger = lambda: run("ip", "netns", "exec", a.ns, PING, "-c", "2", "-i", "0.2", "-W", "2", "-M", "do",
                             "-s", str(size), "-I", "10.1.0.1", "10.2.0.1", timeout=30)
        # A's packet, and B's answer (keepalives, 29 bytes, are not ESP).
        for ns, dev, src in ((a.ns, "va", "192.0.2.1"), (b.ns, "vb", "192.0.2.2")):
            outer = capture_one(lab, ns, dev, f"src host {src} and udp port 4500 and greater 100", pinger)
            assert (outer[IP].len, outer[IP].flags.MF, outer[IP].frag) == (1500, 0, 0), (size, outer.summary())
    for d in (a, b):
        assert_clean(d, 4)
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(PING is None or not shutil.which("tcpdump"), reason="needs ping and tcpdump")
def test_fragment_inner_false_fragments_the_outer_packets(lab):
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16", extra_conn="fragment_inner = false")
    a.start()
    b.start()
    for d in (a, b):
        assert d.status()["tun"]["mtu"] == 1500
    # A full-size inner packet with DF: it enters the TUN whole and leaves
    # as two outer IPv4 fragments (the first with MF set).
    big = lambda: run("ip", "netns", "exec", a.ns, PING, "-c", "2", "-i", "0.2", "-W", "2", "-M", "do",
                      "-s", "1472", "-I", "10.1.0.1", "10.2.0.1", timeout=30)
    frag = capture_one(lab, a.ns, "va", "src host 192.0.2.1 and ip[6] & 0x20 != 0", big)
    from scapy.all import IP
    assert frag[IP].flags.MF and frag[IP].frag == 0 and frag[IP].len == 1500, frag.summary()
    for d in (a, b):
        st = assert_clean(d, 2)
        assert st["connections"][0]["sas"][0]["packets"] >= 2
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(not shutil.which("tcpdump"), reason="needs tcpdump")
def test_nat_keepalives_are_sent_when_idle_and_ignored(lab):
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16", extra_a="nat_keepalive = 1",
                   extra_conn="")
    b.start()
    ka = capture_one(lab, b.ns, "vb", "src host 192.0.2.1 and udp port 4500", a.start, timeout=15)
    from scapy.all import UDP
    assert bytes(ka[UDP].payload) == b"\xff" and ka[UDP].sport == 4500, ka.summary()
    deadline = time.time() + 10
    while time.time() < deadline and b.status()["counters"]["keepalives"] < 2:
        time.sleep(0.2)
    assert b.status()["counters"]["keepalives"] >= 2
    assert a.status()["counters"]["keepalives_sent"] >= 2
    assert b.status()["drops"] == {} and a.status()["drops"] == {}
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(PING is None or not shutil.which("tcpdump"), reason="needs ping and tcpdump")
@pytest.mark.parametrize("v6", [False, True], ids=["v4-outer", "v6-outer"])
def test_a_multihomed_gateway_sends_from_the_connections_local_address(lab, v6):
    """Gateway A has two addresses and listens on the wildcard address; its
    connection's `local` is the one the kernel would not pick as the source
    towards B. ESP-in-UDP and NAT keepalives must still leave
    from `local`, the tunnel endpoint B (and any firewall or NAT between)
    expects."""
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16", v6_outer=v6,
                   extra_a="nat_keepalive = 1")
    first, second, b_addr, plen = (("2001:db8::1", "2001:db8::11", "2001:db8::2", "64") if v6
                                   else ("192.0.2.1", "192.0.2.11", "192.0.2.2", "24"))
    run("ip", "-n", a.ns, "addr", "add", f"{second}/{plen}", "dev", "va", *(["nodad"] if v6 else []))
    # `local` is the address the route towards B does not prefer (IPv4:
    # the primary one wins; IPv6: the newer one): without a source named
    # per datagram, the test would see the other address below.
    r = run("ip", "-n", a.ns, "route", "get", b_addr)
    preferred = r.stdout.split(" src ")[1].split()[0]
    assert preferred in (first, second), r.stdout
    local = second if preferred == first else first
    for d, key in ((a, "local"), (b, "remote")):
        text = pathlib.Path(d.cfg).read_text()
        assert f'{key} = "{first}"' in text
        pathlib.Path(d.cfg).write_text(text.replace(f'{key} = "{first}"', f'{key} = "{local}"'))
    b.start()
    from scapy.all import UDP
    ka = capture_one(lab, a.ns, "va", "udp and src port 4500", a.start, timeout=15)
    assert bytes(ka[UDP].payload) == b"\xff", ka.summary()
    assert ka.payload.src == local, ka.summary()
    trigger = lambda: assert_ping(a.ns, "10.2.0.1", src="10.1.0.1", daemons=(a, b))
    esp = capture_one(lab, b.ns, "vb", f"udp and src port 4500 and dst host {b_addr} and greater 100", trigger)
    assert esp.payload.src == local and esp[UDP].dport == 4500, esp.summary()
    assert b.status()["counters"]["keepalives"] >= 1
    assert b.status()["drops"] == {} and a.status()["drops"] == {}
    assert a.stop() == 0 and b.stop() == 0


@pytest.mark.skipif(PING is None or not shutil.which("tcpdump"), reason="needs ping and tcpdump")
def test_bad_input_is_counted_and_survived(lab):
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16")
    a.start()
    b.start()
    # A real ESP-in-UDP packet from B to A, captured on B's veth.
    from scapy.all import UDP
    real = capture_one(lab, b.ns, "vb", "src host 192.0.2.2 and udp dst port 4500",
                       lambda: assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b)))
    real = bytes(real[UDP].payload)
    assert real[:4] == (0x1001).to_bytes(4, "big")
    forged = bytearray(real)
    forged[4:8] = (1 << 30).to_bytes(4, "big")  # unused sequence number: the ICV cannot match
    garbage = b"\xff" + secrets.token_bytes(99)
    datagrams = {
        "garbage-short": b"abc",                                      # bad_length
        "garbage-long": garbage,                                      # unknown_spi (random SPI)
        "truncated": (0x1001).to_bytes(4, "big") + (7).to_bytes(4, "big") + b"\x00" * 8,  # bad_length
        "unknown-spi": (0xc0ffee).to_bytes(4, "big") + (1).to_bytes(4, "big") + b"\x00" * 64,
        "replay-1": real,
        "replay-2": real,
        "forged": bytes(forged),                                      # icv_failure
        "keepalive": b"\xff",
        "ike": b"\x00\x00\x00\x00" + b"\x01" * 28,
    }
    run("ip", "netns", "exec", b.ns, sys.executable, "-c", SENDER, "192.0.2.1", "4500",
        *[d.hex() for d in datagrams.values()])
    want = {"bad_length": 2, "unknown_spi": 2, "replay": 2, "icv_failure": 1}
    deadline = time.time() + 10
    while time.time() < deadline:
        st = a.status()
        if all(st["drops"].get(k, 0) >= n for k, n in want.items()):
            break
        time.sleep(0.1)
    assert {k: st["drops"].get(k, 0) for k in want} == want, st["drops"]
    assert st["counters"]["keepalives"] == 1 and st["counters"]["ike"] == 1, st["counters"]
    # Every drop path, the first line of each reason included, allocates
    # nothing on the packet path (the rate limiter's table is made up front).
    assert st["counters"]["hot_path_allocs"] == 0, st["counters"]
    inbound = a.sas("in")[0]
    assert inbound["drops"] == {"bad_length": 1, "replay": 2, "icv_failure": 1}, inbound
    # The log says why, at most once per second per reason.
    log = a.log_text()
    for reason in want:
        assert f"dropped ({reason})" in log, log
    # Still serving.
    assert a.proc.poll() is None
    before = inbound["packets"]
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    assert a.sas("in")[0]["packets"] >= before + 3
    assert a.stop() == 0 and b.stop() == 0


def assert_same_network(ns, before):
    """Links, routes and rules of `ns` are as `before` (a snapshot)."""
    now = snapshot(ns)
    for what, b, n in zip(("links", "routes", "rules"), before, now):
        added, removed = sorted(set(n) - set(b)), sorted(set(b) - set(n))
        assert not added and not removed, f"{ns} {what}: added {added}, removed {removed}"


def snapshot(ns):
    """What espgate may change: links, routes (all tables), rules."""
    links = sorted(l["ifname"] for l in ip_json(ns, "link"))
    # The veth's IPv6 link-local address (and its local route) appears on
    # its own a second or so after the link comes up: not ours to check.
    routes = sorted(json.dumps(r, sort_keys=True) for fam in ("-4", "-6")
                    for r in ip_json(ns, fam, "route", "show", "table", "all")
                    if not (r.get("dev") == "va" or r.get("dev") == "vb") or not r["dst"].startswith("fe80"))
    rules = sorted(json.dumps(r, sort_keys=True) for fam in ("-4", "-6") for r in ip_json(ns, fam, "rule"))
    return links, routes, rules


@pytest.mark.skipif(PING is None, reason="needs ping")
def test_restart_leaves_nothing_behind_and_never_reuses_sequence_numbers(lab):
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16", fwmark=0x4500)
    base = {d.ns: snapshot(d.ns) for d in (a, b)}
    a.start()
    b.start()
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    assert any(r.get("table") == str(0x4500) for r in ip_json(a.ns, "rule"))
    # A second daemon on the same control socket is refused, and changes nothing.
    r = run("ip", "netns", "exec", a.ns, lab.espgate, "up", "-c", str(a.cfg), check=False)
    assert r.returncode == 1 and "another espgate daemon is running" in r.stderr, r.stderr
    sent = a.sas("out")[0]["next_seq"]  # numbers 1 .. sent-1 were used
    assert sent >= 4

    # Clean stop: nothing left, exact continuation.
    assert a.stop() == 0 and b.stop() == 0
    for d in (a, b):
        assert_same_network(d.ns, base[d.ns])
        assert not d.sock.exists()
    a.start()
    b.start()
    assert a.sas("out")[0]["next_seq"] == sent
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    assert b.sas("in")[0]["highest_seq"] >= sent
    assert_clean(b, 3)

    # Crash (SIGKILL, no cleanup) while B keeps running: the restarted A
    # starts above its reservation, so above every number it sent, and B's
    # replay window (not reset) accepts it.
    now_next = a.sas("out")[0]["next_seq"]
    reserved = a.sas("out")[0]["seq_reserved"]
    assert reserved > now_next
    assert a.stop(signal.SIGKILL) == -signal.SIGKILL
    a.start()  # the stale fwmark rule is replaced, the stale socket file removed
    restarted = a.sas("out")[0]["next_seq"]
    assert restarted == reserved > now_next
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", (a, b))
    assert b.sas("in")[0]["highest_seq"] >= restarted
    assert b.status()["drops"] == {}
    assert a.stop() == 0 and b.stop() == 0
    for d in (a, b):
        assert_same_network(d.ns, base[d.ns])


def test_tun_deleted_underneath_stops_the_daemon_cleanly(lab):
    a, _ = configs(lab, protocol="esp", encap="udp", fwmark=0x4500)
    base = snapshot(a.ns)
    a.start()
    run("ip", "-n", a.ns, "link", "del", "tunA")
    try:
        code = a.proc.wait(timeout=10)
    finally:
        a.logf.close()
    assert code == 1, a.log_text()
    assert "reading TUN device tunA" in a.log_text()
    assert not a.sock.exists()
    assert_same_network(a.ns, base)


def test_cli_errors(espgate, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[gateway]\nmtu = 10\n[[connection]]\nname = "x"\nlocal = "192.0.2.1"\n'
                   'remote = "nope"\nlocal_ts = ["10.1.0.0/24"]\nremote_ts = ["10.2.0.0/24"]\n'
                   '[connection.esp]\nsuite = "aes128gcm16"\nspi_in = 0x1001\nspi_out = 0x1002\n'
                   f'enc_in = "{keyhex(20)}"\nenc_out = "{keyhex(20)}"\n')
    bad.chmod(0o600)
    r = run(espgate, "up", "-c", str(bad), check=False)
    assert r.returncode == 2, r
    assert "gateway.mtu" in r.stderr and "connection[0].remote" in r.stderr, r.stderr
    sock = tmp_path / "none.sock"
    for args in (["status"], ["sa", "list"], ["status", "--json"]):
        r = run(espgate, *args, "-s", str(sock), check=False)
        assert r.returncode == 1, r
        assert "no espgate daemon is running" in r.stderr and str(sock) in r.stderr, r.stderr
    # -c FILE: the socket path comes from the configuration.
    good = tmp_path / "good.toml"
    good.write_text(bad.read_text().replace("mtu = 10", 'control_socket = "ctl/gw.sock"')
                    .replace('"nope"', '"192.0.2.2"'))
    good.chmod(0o600)
    r = run(espgate, "sa", "list", "-c", str(good), check=False)
    assert r.returncode == 1 and str(tmp_path / "ctl" / "gw.sock") in r.stderr, r.stderr


@pytest.mark.skipif(PING is None or not shutil.which("iperf3"), reason="needs ping and iperf3 (scripts/setup.sh)")
def test_demo_short(espgate):
    prefix = f"egdt-{uuid.uuid4().hex[:6]}"
    try:
        r = run(espgate, "demo", "--short", "--prefix", prefix, check=False, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        plain = [l for l in lines if l.startswith("plain routing")]
        tunnel = [l for l in lines if l.startswith("espgate tunnel")]
        assert len(plain) == 1 and len(tunnel) == 1, r.stdout
        assert "bit/s" in tunnel[0] and "gwA" in tunnel[0], r.stdout
        print(r.stdout)
    finally:
        left = [n for n in run("ip", "netns", "list").stdout.split() if n.startswith(prefix)]
        for n in left:
            subprocess.run(["ip", "netns", "del", n], check=False, timeout=30)
    assert not left, f"the demo left {left}"


@pytest.mark.skipif(PING is None or not shutil.which("iperf3"), reason="needs ping and iperf3 (scripts/setup.sh)")
def test_demo_interrupted_leaves_nothing(espgate):
    prefix = f"egdi-{uuid.uuid4().hex[:6]}"
    p = subprocess.Popen([espgate, "demo", "--short", "--prefix", prefix], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        # Interrupt once the tunnel part has started (its gateways are running).
        deadline = time.time() + 60
        seen = []
        while time.time() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith("[2/2]"):
                break
        assert seen and seen[-1].startswith("[2/2]"), "".join(seen)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 130, out + err
        assert "interrupted" in err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        left = [n for n in run("ip", "netns", "list").stdout.split() if n.startswith(prefix)]
        for n in left:
            subprocess.run(["ip", "netns", "del", n], check=False, timeout=30)
    assert not left, f"the interrupted demo left {left}"
    gw = subprocess.run(["pgrep", "-f", f"{prefix}-work"], capture_output=True, text=True)
    assert not gw.stdout.strip(), f"gateway processes left: {gw.stdout}"
