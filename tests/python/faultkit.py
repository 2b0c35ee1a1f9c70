"""faultkit: network faults between two gateways in namespaces, for the
end-to-end tests (issue 16, "Fault injection in namespaces").

The path. Two gateway namespaces A and B joined through one or two router
namespaces, and optionally a host namespace behind each gateway:

    hA ── A ── R1 ── B ── hB            (routers=1)
    hA ── A ── R1 ── R2 ── B ── hB      (routers=2)

    hA 10.1.1.2/24, A 10.1.1.1 (la) and 192.0.2.1/24 (va),
    R1 192.0.2.254 (ra) [and 203.0.113.1/30 (rx) — R2 203.0.113.2/30 (ry)],
    the last router 198.51.100.254/24 (rb), B 198.51.100.2/24 (vb) and
    10.2.1.1 (lb), hB 10.2.1.2/24.

`Path.links` names each link ("a", "r12", "b", "ha", "hb"). The gateway
ends of "a" and "b" get `gso_max_segs 1`, so the kernel segments the
gateways' UDP GSO batches before they reach a router: every fault below
then applies to single outer packets, as on a real wire, not to 64 of
them at once.

The faults, all made inside namespaces the test created (nothing is
changed in the root namespace):

- `Nft`: loss and duplication with nftables, in a uniquely named table
  (`espgate_fault_<uuid8>`, family `ip`) on a router's forward hook:
  `numgen random mod 100 < N drop` for IKE only (UDP 500, and UDP 4500
  behind the non-ESP marker), for UDP 500/4500, or for everything entering
  from one interface; `dup to <next hop> device <out>` for duplication (the
  copy is routed straight out, so it also arrives out of order). Each rule
  counts what it matched. `delete()` removes the table.
- `Shaper`: delay, reordering and seeded loss in userspace, as this
  kernel has no netem. In a router R, a TUN device is read and written by a
  small Python process (run in R with `ip netns exec`). A policy rule per
  chosen direction (`iif ra` / `iif rb` → a table whose only route is the
  TUN) sends the packets entering R from a gateway link into the TUN; the
  process holds each one for its delay and writes it back into the same
  TUN; packets coming out of the TUN (iif tun) match no such rule, take the
  main table and are forwarded on. Delay = fixed + uniform random jitter,
  and every k-th packet per direction held longer: both reorder. Its loss
  is drawn from a seeded generator per direction, so one seed always drops
  the same IKE messages (a test that must not depend on luck uses it). The
  process ends by itself after `max_seconds`; when it is gone the TUN goes
  too and the rule finds an empty table, so traffic flows straight through.
  Statistics (per direction: in, dropped, delayed, reordered; the indexes
  of the IKE packets dropped) are in a JSON file, rewritten four times a
  second.
- `Path.link_down` / `link_up` (both ends of a link; the routes the kernel
  removes with the link are put back) and `Path.set_mtu` (both ends).

`Kit` holds all of these; `close()` undoes them (bounded waits), and the
`lab` fixture of test_gateway.py then deletes the namespaces whatever
happened. IPv4 only.
"""

import json
import pathlib
import select
import signal
import subprocess
import sys
import time
import uuid

from test_gateway import run

# ---------------------------------------------------------------------
# The path
# ---------------------------------------------------------------------

A_OUT, B_OUT = "192.0.2.1", "198.51.100.2"
R_A, R_B = "192.0.2.254", "198.51.100.254"
R12_1, R12_2 = "203.0.113.1", "203.0.113.2"


def readline(proc, timeout=10.0):
    """The next line `proc` prints, or "" if none comes within `timeout`
    seconds (or it exits)."""
    if not select.select([proc.stdout], [], [], timeout)[0]:
        return ""
    return proc.stdout.readline()


def sysctl(ns, key, value):
    """Writes a sysctl inside namespace `ns` (its /proc/sys/net is the
    namespace's own)."""
    path = "/proc/sys/" + key.replace(".", "/")
    run("ip", "netns", "exec", ns, "sh", "-c", f"echo {value} > {path}")


class Link:
    def __init__(self, ns1, dev1, ns2, dev2):
        self.ns1, self.dev1, self.ns2, self.dev2 = ns1, dev1, ns2, dev2

    def ends(self):
        return ((self.ns1, self.dev1), (self.ns2, self.dev2))


class Path:
    def __init__(self, lab, routers=1, hosts=False):
        assert routers in (1, 2)
        self.lab = lab
        self.a = lab.netns("A")
        self.routers = [lab.netns(f"R{i + 1}") for i in range(routers)]
        self.b = lab.netns("B")
        self.a_addr, self.b_addr = A_OUT, B_OUT
        self.links = {}
        # Routes each namespace needs beyond its connected ones, kept to be
        # put back after a link comes up again.
        self.routes = {ns: [] for ns in [self.a, self.b, *self.routers]}
        r1, rn = self.routers[0], self.routers[-1]
        self._veth("a", self.a, "va", f"{A_OUT}/24", r1, "ra", f"{R_A}/24")
        self._veth("b", rn, "rb", f"{R_B}/24", self.b, "vb", f"{B_OUT}/24")
        if routers == 2:
            self._veth("r12", r1, "rx", f"{R12_1}/30", self.routers[1], "ry", f"{R12_2}/30")
            self.routes[r1].append(("198.51.100.0/24", R12_2))
            self.routes[self.routers[1]].append(("192.0.2.0/24", R12_1))
        self.routes[self.a].append(("198.51.100.0/24", R_A))
        self.routes[self.b].append(("192.0.2.0/24", R_B))
        for r in self.routers:
            sysctl(r, "net.ipv4.ip_forward", 1)
            for conf in ("all", "default"):
                sysctl(r, f"net.ipv4.conf.{conf}.rp_filter", 0)
                sysctl(r, f"net.ipv4.conf.{conf}.send_redirects", 0)
        # Segment the gateways' GSO batches on their own link.
        run("ip", "-n", self.a, "link", "set", "va", "gso_max_segs", "1")
        run("ip", "-n", self.b, "link", "set", "vb", "gso_max_segs", "1")
        self.ha = self.hb = None
        if hosts:
            self.ha = lab.netns("hA")
            self.hb = lab.netns("hB")
            self._veth("ha", self.ha, "ha", "10.1.1.2/24", self.a, "la", "10.1.1.1/24")
            self._veth("hb", self.hb, "hb", "10.2.1.2/24", self.b, "lb", "10.2.1.1/24")
            run("ip", "-n", self.ha, "route", "add", "default", "via", "10.1.1.1")
            run("ip", "-n", self.hb, "route", "add", "default", "via", "10.2.1.1")
            for ns in (self.a, self.b):
                sysctl(ns, "net.ipv4.ip_forward", 1)
        self.put_routes_back()

    def _veth(self, name, ns1, dev1, addr1, ns2, dev2, addr2):
        run("ip", "-n", ns1, "link", "add", dev1, "type", "veth", "peer", "name", dev2, "netns", ns2)
        for ns, dev, addr in ((ns1, dev1, addr1), (ns2, dev2, addr2)):
            run("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            run("ip", "-n", ns, "link", "set", dev, "up")
        self.links[name] = Link(ns1, dev1, ns2, dev2)

    def put_routes_back(self):
        for ns, routes in self.routes.items():
            for prefix, via in routes:
                run("ip", "-n", ns, "route", "replace", prefix, "via", via)

    def router_for(self, link):
        """The router end (namespace, device) of the link to gateway A
        ("a") or B ("b")."""
        ln = self.links[link]
        return (ln.ns2, ln.dev2) if link == "a" else (ln.ns1, ln.dev1)

    def link_down(self, name):
        for ns, dev in self.links[name].ends():
            run("ip", "-n", ns, "link", "set", dev, "down")

    def link_up(self, name):
        for ns, dev in self.links[name].ends():
            run("ip", "-n", ns, "link", "set", dev, "up")
        # Routes through a link that went down were deleted with it.
        self.put_routes_back()

    def set_mtu(self, name, mtu):
        for ns, dev in self.links[name].ends():
            run("ip", "-n", ns, "link", "set", dev, "mtu", str(mtu))


# ---------------------------------------------------------------------
# nftables: loss and duplication
# ---------------------------------------------------------------------

IKE_MATCH = {
    # UDP 500, and UDP 4500 with the 4 zero bytes of the non-ESP marker
    # (ESP-in-UDP and NAT keepalives do not match).
    "ike": ["udp dport 500", "udp dport 4500 @th,64,32 0x0"],
    "ike-ports": ["udp dport { 500, 4500 }"],
    "all": [""],
}


class Nft:
    """One uniquely named `ip` table in namespace `ns`, with a forward
    chain that runs before anything else."""

    def __init__(self, ns):
        self.ns = ns
        self.table = f"espgate_fault_{uuid.uuid4().hex[:8]}"
        self.rules = 0
        self.final = None
        self._nft(f"add table ip {self.table}\n"
                  f"add chain ip {self.table} faults {{ type filter hook forward priority -300; policy accept; }}\n")

    def _nft(self, script):
        r = subprocess.run(["ip", "netns", "exec", self.ns, "nft", "-f", "-"], input=script, text=True,
                           capture_output=True, timeout=30)
        assert r.returncode == 0, f"nft in {self.ns} refused:\n{script}\n{r.stderr}"

    def _add(self, iif, what, action):
        for match in IKE_MATCH[what]:
            self.rules += 1
            self._nft(f'add rule ip {self.table} faults iifname "{iif}" {match} '
                      f'numgen random mod 100 < {action[0]} counter {action[1]} comment "r{self.rules}"\n')

    def loss(self, percent, iif, what="all"):
        """Drops `percent` % of the packets entering on `iif` (random per
        packet, the kernel's generator): `what` = "ike", "ike-ports" or
        "all"."""
        assert 0 < percent <= 100
        self._add(iif, what, (percent, "drop"))

    def dup(self, percent, iif, next_hop, oif, what="all"):
        """Sends a copy of `percent` % of the packets entering on `iif`
        straight to `next_hop` through `oif`."""
        self._add(iif, what, (percent, f"dup to {next_hop} device \"{oif}\""))

    def counters(self):
        """{rule comment: packets matched (i.e. dropped or duplicated)};
        after `delete()`, the last figures."""
        if self.final is not None:
            return self.final
        r = run("ip", "netns", "exec", self.ns, "nft", "-j", "list", "table", "ip", self.table)
        out = {}
        for item in json.loads(r.stdout)["nftables"]:
            rule = item.get("rule")
            if not rule:
                continue
            packets = sum(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)
            out[rule.get("comment", str(rule["handle"]))] = packets
        return out

    def total(self):
        return sum(self.counters().values())

    def delete(self):
        if self.final is not None:
            return
        try:
            self.final = self.counters()
        except (subprocess.SubprocessError, ValueError, KeyError):
            self.final = {}
        subprocess.run(["ip", "netns", "exec", self.ns, "nft", "delete", "table", "ip", self.table],
                       capture_output=True, timeout=30, check=False)


def nft_dup_works(lab):
    """Whether `dup to` duplicates on this kernel: two namespaces, one
    ping, every echo request duplicated; the pinger sees DUP! replies."""
    a, b = lab.netns("dA"), lab.netns("dB")
    run("ip", "-n", a, "link", "add", "x", "type", "veth", "peer", "name", "y", "netns", b)
    for ns, dev, addr in ((a, "x", "10.99.0.1/24"), (b, "y", "10.99.0.2/24")):
        run("ip", "-n", ns, "addr", "add", addr, "dev", dev)
        run("ip", "-n", ns, "link", "set", dev, "up")
    t = f"espgate_fault_{uuid.uuid4().hex[:8]}"
    r = subprocess.run(["ip", "netns", "exec", a, "nft", "-f", "-"], text=True, capture_output=True, timeout=30,
                       input=f"add table ip {t}\n"
                             f"add chain ip {t} out {{ type filter hook output priority 0; }}\n"
                             f'add rule ip {t} out icmp type echo-request dup to 10.99.0.2 device "x"\n')
    if r.returncode != 0:
        return False, r.stderr.strip()
    p = run("ip", "netns", "exec", a, "ping", "-c", "2", "-i", "0.2", "-W", "2", "10.99.0.2", check=False)
    for ns in (a, b):
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)
        lab.namespaces.remove(ns)
    return "DUP!" in p.stdout, p.stdout


# ---------------------------------------------------------------------
# The userspace shaper: delay, reordering, seeded loss
# ---------------------------------------------------------------------

FORWARDER = r"""
import fcntl, heapq, json, os, random, select, signal, struct, sys, time
cfg = json.loads(sys.argv[1])
fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
# TUNSETIFF, IFF_TUN | IFF_NO_PI
fcntl.ioctl(fd, 0x400454ca, struct.pack("16sH", cfg["tun"].encode(), 0x0001 | 0x1000))
a_src = bytes(int(x) for x in cfg["a_addr"].split("."))
seed = cfg["seed"]
jitter_rng = random.Random(f"{seed}-jitter")
loss_rng = {d: random.Random(f"{seed}-loss-{d}") for d in ("ab", "ba")}
stats = {d: {"in": 0, "ike_in": 0, "dropped": 0, "dropped_ike_index": [], "delayed": 0, "reordered": 0,
             "written": 0, "write_errors": 0, "overflow": 0} for d in ("ab", "ba")}
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))


def is_ike(p):
    if len(p) < 28 or p[0] >> 4 != 4 or p[9] != 17:
        return False
    if (p[6] & 0x1f) or p[7]:
        return False
    h = (p[0] & 15) * 4
    sport, dport = struct.unpack_from("!HH", p, h)
    if 500 in (sport, dport):
        return True
    return 4500 in (sport, dport) and p[h + 8:h + 12] == b"\0\0\0\0" and len(p) > h + 12


def dump():
    tmp = cfg["stats"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(stats, f)
    os.replace(tmp, cfg["stats"])


heap, seq = [], 0
arrivals = {"ab": 0, "ba": 0}
released = {"ab": -1, "ba": -1}
deadline = time.monotonic() + cfg["max_seconds"]
last = 0.0
print("ready", flush=True)
while not stop and time.monotonic() < deadline:
    now = time.monotonic()
    wait = 0.05 if not heap else min(0.05, max(0.0, heap[0][0] - now))
    try:
        ready = select.select([fd], [], [], wait)[0]
    except InterruptedError:
        ready = []
    now = time.monotonic()
    for _ in range(512 if ready else 0):
        try:
            p = os.read(fd, 65536)
        except BlockingIOError:
            break
        d = "ab" if p[12:16] == a_src else "ba"
        s = stats[d]
        s["in"] += 1
        n = arrivals[d]
        arrivals[d] += 1
        ike = is_ike(p)
        if ike:
            s["ike_in"] += 1
        p_loss = cfg["loss"][d]
        if p_loss and (ike or not cfg["loss_ike_only"]):
            if loss_rng[d].random() < p_loss:
                s["dropped"] += 1
                if ike:
                    s["dropped_ike_index"].append(s["ike_in"] - 1)
                continue
        delay = cfg["delay_ms"]
        if cfg["jitter_ms"]:
            delay += jitter_rng.uniform(0, cfg["jitter_ms"])
        k = cfg["hold_every"]
        if k and n % k == k - 1:
            delay += cfg["hold_ms"]
        if delay > 0:
            s["delayed"] += 1
        if len(heap) >= cfg["max_queue"]:
            s["overflow"] += 1
            continue
        heapq.heappush(heap, (now + delay / 1000.0, seq, d, n, p))
        seq += 1
    while heap and heap[0][0] <= now:
        _, _, d, n, p = heapq.heappop(heap)
        s = stats[d]
        if n < released[d]:
            s["reordered"] += 1
        released[d] = max(released[d], n)
        try:
            os.write(fd, p)
            s["written"] += 1
        except OSError:
            s["write_errors"] += 1
    if now - last > 0.25:
        dump()
        last = now
dump()
"""


class Shaper:
    """The TUN forwarder in router `ns`, for the directions whose entry
    links are named in `entries` ({"ab": "ra", "ba": "rb"}: A to B enters R
    on ra)."""

    def __init__(self, kit, ns, entries, a_addr=A_OUT, *, delay_ms=0.0, jitter_ms=0.0, hold_every=0,
                 hold_ms=0.0, loss=None, loss_ike_only=True, seed=1, max_seconds=120, max_queue=4096):
        self.kit, self.ns = kit, ns
        tag = uuid.uuid4().hex[:8]
        self.tun = f"fq{tag}"
        self.table = 1000 + int(tag[:4], 16) % 50000
        self.stats_path = kit.lab.tmp / f"shaper-{tag}.json"
        cfg = dict(tun=self.tun, a_addr=a_addr, seed=seed, delay_ms=delay_ms, jitter_ms=jitter_ms,
                   hold_every=hold_every, hold_ms=hold_ms, loss={"ab": 0.0, "ba": 0.0, **(loss or {})},
                   loss_ike_only=loss_ike_only, max_seconds=max_seconds, max_queue=max_queue,
                   stats=str(self.stats_path))
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", FORWARDER, json.dumps(cfg)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        kit.lab.procs.append(self.proc)
        kit.shapers.append(self)
        line = readline(self.proc).strip()
        assert line == "ready", \
            f"shaper did not start: {line!r} {self.proc.stderr.read() if self.proc.poll() is not None else ''}"
        run("ip", "-n", ns, "link", "set", self.tun, "up")
        sysctl(ns, f"net.ipv4.conf.{self.tun}.rp_filter", 0)
        run("ip", "-n", ns, "route", "add", "default", "dev", self.tun, "table", str(self.table))
        self.rules = []
        for d, dev in entries.items():
            pref = str(self.table % 30000 + 100 + len(self.rules))
            run("ip", "-n", ns, "rule", "add", "iif", dev, "lookup", str(self.table), "pref", pref)
            self.rules.append(pref)

    def stats(self, settle=0.3):
        """The forwarder's statistics, after waiting `settle` s for its
        next write of them (it writes every 0.25 s)."""
        time.sleep(settle)
        try:
            return json.loads(pathlib.Path(self.stats_path).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        for pref in self.rules:
            subprocess.run(["ip", "-n", self.ns, "rule", "del", "pref", pref], capture_output=True, timeout=30,
                           check=False)
        self.rules = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return self.stats()


class Kit:
    """Every fault a test made, undone by `close()`."""

    def __init__(self, lab):
        self.lab = lab
        self.tables, self.shapers = [], []

    def path(self, **kw):
        return Path(self.lab, **kw)

    def nft(self, ns):
        t = Nft(ns)
        self.tables.append(t)
        return t

    def shaper(self, ns, entries, **kw):
        return Shaper(self, ns, entries, **kw)

    def close(self):
        for s in self.shapers:
            try:
                s.stop()
            except Exception as e:  # keep undoing the rest
                print(f"faultkit: stopping a shaper: {e}")
        for t in self.tables:
            t.delete()


def wait_until(pred, timeout, step=0.05):
    """Polls `pred` for at most `timeout` seconds; returns its last value."""
    deadline = time.time() + timeout
    v = pred()
    while not v and time.time() < deadline:
        time.sleep(step)
        v = pred()
    return v
