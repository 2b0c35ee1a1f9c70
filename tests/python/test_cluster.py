"""Seed 003's flat cluster, end to end in namespaces: three espgate nodes
share one outside and one inside address on two segments where every
frame is flooded to every node (Linux bridges with learning off), against
one ordinary espgate peer. Here the test itself plays the cluster agent:
it sends each node the plan over the control socket, so that what is
checked is the data plane (etcd and the agent have their own tests)."""

import json
import pathlib
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from test_gateway import (Daemon, assert_lost_only_in_kernel_buffers, kernel_counters, keyhex,  # noqa: F401
                          lab, run)

UDPFLOW = pathlib.Path(__file__).with_name("udpflow.py")
OUT_MAC, IN_MAC = "02:e5:9a:00:00:01", "02:e5:9a:00:00:02"


def control(sock, req):
    """One request on a daemon's control socket; returns the answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall((json.dumps(req) + "\n").encode())
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


class Cluster:
    """Namespaces: sw (two flooding bridges), peer (ordinary gateway B),
    host (the inside host 10.1.0.5) and nodes n1..nN."""

    def __init__(self, lab, n=3, dispatch="packet-rr"):
        self.lab, self.n = lab, n
        self.sw = lab.netns("sw")
        for br in ("swout", "swin"):
            run("ip", "-n", self.sw, "link", "add", br, "type", "bridge")
            run("ip", "-n", self.sw, "link", "set", br, "type", "bridge", "ageing_time", "0")
            run("ip", "-n", self.sw, "link", "set", br, "up")
        self.peer = lab.netns("pe")
        self.host = lab.netns("ho")
        self._port(self.peer, "eth0", "swout", "192.168.50.2/24")
        self._port(self.host, "eth0", "swin", "10.1.0.5/24")
        run("ip", "-n", self.host, "route", "add", "default", "via", "10.1.0.1")
        self.nodes = [lab.netns(f"n{i}") for i in range(1, n + 1)]
        for ns in self.nodes:
            self._port(ns, "out0", "swout", "192.168.50.1/24", OUT_MAC)
            self._port(ns, "in0", "swin", "10.1.0.1/24", IN_MAC)
            for k in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                      "net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.all.send_redirects=0"):
                run("ip", "netns", "exec", ns, "sysctl", "-qw", k)
        keys = {k: keyhex(16) + keyhex(4) for k in ("ab", "ba")}  # AES-128 key and GCM salt

        def gateway(tun, tun_address, cluster, conn, local, remote, lts, rts, spis, sends):
            """One gateway's configuration: the cluster's side sends with
            the "ab" keys, the peer with "ba"."""
            recv = "ba" if sends == "ab" else "ab"
            return f"""[gateway]
tun = "{tun}"
{tun_address}
listen = "0.0.0.0:4500"
control_socket = "ctl.sock"
state_dir = "state"
log = "debug"
{cluster}
[[connection]]
name = "{conn}"
local = "{local}"
remote = "{remote}"
local_ts = ["{lts}"]
remote_ts = ["{rts}"]

[connection.esp]
suite = "aes128gcm16"
spi_in = {spis[0]:#x}
spi_out = {spis[1]:#x}
enc_in = "{keys[recv]}"
enc_out = "{keys[sends]}"
"""

        def write(name, text):
            d = lab.tmp / name
            d.mkdir()
            (d / "gw.toml").write_text(text)
            (d / "gw.toml").chmod(0o600)
            return d

        self.daemons = []
        for i, ns in enumerate(self.nodes, 1):
            cluster = f"""
[cluster]
name = "t"
node = {i}
etcd = ["http://127.0.0.1:1"]
dispatch = "{dispatch}"
inside = "in0"
outside = "out0"
hold = "5s"
"""
            d = write(f"n{i}", gateway("tunc", "", cluster, "to-b", "192.168.50.1", "192.168.50.2",
                                       "10.1.0.0/24", "10.2.0.0/24", (0x1001, 0x1002), "ab"))
            self.daemons.append(Daemon(lab, ns, d / "gw.toml", d / "ctl.sock", d / "log"))
        d = write("peer", gateway("tunb", 'tun_address = ["10.2.0.1/24"]', "", "to-cluster", "192.168.50.2",
                                  "192.168.50.1", "10.2.0.0/24", "10.1.0.0/24", (0x1002, 0x1001), "ba"))
        self.b = Daemon(lab, self.peer, d / "gw.toml", d / "ctl.sock", d / "log")

    def _port(self, ns, dev, bridge, addr, mac=None):
        """A veth from namespace `ns` (named `dev`) to `bridge` in sw, with
        learning off on the bridge side: every frame is flooded."""
        self.ports = getattr(self, "ports", 0) + 1
        peer = f"p{self.ports}{dev}"[:15]
        run("ip", "-n", ns, "link", "add", dev, "type", "veth", "peer", "name", peer, "netns", self.sw)
        if mac:
            run("ip", "-n", ns, "link", "set", dev, "address", mac)
        run("ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{dev}.disable_ipv6=1")
        run("ip", "-n", ns, "addr", "add", addr, "dev", dev)
        run("ip", "-n", ns, "link", "set", dev, "up")
        run("ip", "-n", self.sw, "link", "set", peer, "master", bridge)
        run("ip", "-n", self.sw, "link", "set", peer, "type", "bridge_slave", "learning", "off")
        # Every frame entering the bridge is handled on CPU 0 (RPS), so the
        # bridge floods one frame to every node before the next: a hub.
        # Without it, two frames sent from two CPUs are flooded by both at
        # once and can reach two nodes' TUNs in opposite orders; the nodes
        # then number them differently (docs/CLUSTER.md, "Same order on
        # every node"). Measured 2026-11-29 under packet-sqf with a ping
        # beside the stream: 16-61 frames out of order per run and 242-775
        # of 2500 datagrams lost without it, none with it (5 runs each).
        run("ip", "netns", "exec", self.sw, "sh", "-c", f"echo 1 > /sys/class/net/{peer}/queues/rx-0/rps_cpus")
        run("ip", "-n", self.sw, "link", "set", peer, "up")

    def start(self):
        self.b.start()
        for d in self.daemons:
            d.start()

    def kernel_counters(self):
        """Every namespace's /proc/net/snmp (see `assert_nothing_lost`)."""
        return kernel_counters([self.host, self.peer, *self.nodes])

    def confirmed_stream(self, seconds, **kw):
        """`udp_stream` while playing the agent (the plan confirmed every
        second); returns its summary and the kernel counters from before
        it, for `assert_nothing_lost`."""
        stop = time.time() + seconds + 2

        def confirm():
            while time.time() < stop:
                self.plan(1, [1, 2, 3])
                time.sleep(1)

        t = threading.Thread(target=confirm)
        kernel_before = self.kernel_counters()
        t.start()
        try:
            return udp_stream(self, seconds, **kw), kernel_before
        finally:
            t.join()

    def plan(self, epoch, members, leader=1, checkpoints=True):
        """Plays the agent: the plan, and each node the others' checkpoints."""
        docs = [d.status()["cluster"] for d in self.daemons]
        for i, d in enumerate(self.daemons, 1):
            cps = []
            if checkpoints:
                for j, doc in enumerate(docs, 1):
                    if j == i or j not in members:
                        continue
                    for sa in doc["sas"]:
                        if sa["outbound"] and sa.get("checkpoint"):
                            cps.append({"node": j, "spi": sa["spi"], "seq": sa["checkpoint"][0],
                                        "digest": sa["checkpoint"][1]})
            r = control(d.sock, {"cmd": "cluster", "plan": {"epoch": epoch, "members": members},
                                 "leader": leader, "checkpoints": cps})
            assert r["ok"], r


def udp_stream(c, seconds, rate="5M", length=1000, reverse=False, port=5301, src="10.1.0.5", dst="10.2.0.1"):
    """A paced UDP stream from the host to the peer's side (`reverse`: the
    other way) through the cluster, counted exactly by udpflow.py (why not
    iperf3 here: see that file). Returns {"packets": sent, "lost_packets",
    "duplicates", "out_of_order", "missing": first lost numbers, …}."""
    bits = float(rate[:-1]) * {"K": 1e3, "M": 1e6}[rate[-1]] if rate[-1] in "KM" else float(rate)
    (src_ns, src), (dst_ns, dst) = (c.host, src), (c.peer, dst)
    if reverse:
        (src_ns, src), (dst_ns, dst) = (dst_ns, dst), (src_ns, src)
    tool = [sys.executable, str(UDPFLOW)]
    receiver = subprocess.Popen(["ip", "netns", "exec", dst_ns, *tool, "recv", dst, str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    c.lab.procs.append(receiver)
    assert receiver.stdout.readline().strip() == "ready", receiver.stderr.read()
    r = run("ip", "netns", "exec", src_ns, *tool, "send", dst, str(port), str(bits), str(length), str(seconds), src,
            timeout=seconds + 30, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    sent = json.loads(r.stdout)
    time.sleep(1)  # the last datagrams through the cluster
    receiver.terminate()
    out, err = receiver.communicate(timeout=10)
    got = json.loads(out)
    tail = list(range(got["highest"] + 1, sent["sent"]))
    return {"packets": sent["sent"], "lost_packets": sent["sent"] - got["unique"], "send_errors": sent["send_errors"],
            "duplicates": got["duplicates"], "out_of_order": got["out_of_order"],
            "missing": (got["missing"] + tail)[:20], "seconds": sent["seconds"]}


def assert_nothing_lost(c, end, kernel_before):
    """Nothing lost or doubled by the cluster (`end`: `udp_stream`'s
    count): every datagram that never arrived was dropped by a full kernel
    receive buffer in one of the namespaces (`kernel_before`:
    `c.kernel_counters()` before the stream), and none arrived twice (two
    nodes processed it). Runs before 2026-11-29 lost one or two datagrams
    with no drop counted anywhere: the bridge had delivered two frames to
    the nodes in different orders (see `Cluster._port`), or, in reverse,
    iperf3 had taken the first data datagram for its handshake's reply
    (see udpflow.py)."""
    assert end["send_errors"] == 0 and end["duplicates"] == 0, end
    order = f"{end['out_of_order']} out of order, missing: {end['missing']}"
    assert_lost_only_in_kernel_buffers(end, c.daemons + [c.b], kernel_before, order)


@pytest.mark.parametrize("dispatch", ["packet-rr", "packet-sqf", "session-rr", "session-sqf"])
def test_three_nodes_carry_a_tunnel_as_one_gateway(lab, dispatch):
    c = Cluster(lab, dispatch=dispatch)
    c.start()
    # No plan yet: nobody forwards, and says why.
    st = c.daemons[0].status()["cluster"]
    assert st["state"] == "waiting for a plan", st
    c.plan(1, [1, 2, 3])
    r = run("ip", "netns", "exec", c.host, "ping", "-c", "5", "-i", "0.2", "-W", "2", "10.2.0.1", check=False)
    assert r.returncode == 0, r.stdout + "\n".join(d.log_text()[-3000:] for d in c.daemons)
    # A steady UDP stream each way, the plan confirmed every second.
    for reverse in (False, True):
        end, kernel_before = c.confirmed_stream(4, reverse=reverse)
        assert end["packets"] > 2000, end
        assert_nothing_lost(c, end, kernel_before)
    docs = [d.status()["cluster"] for d in c.daemons]
    for doc in docs:
        assert doc["state"] == "processing" and doc["in_step"], doc
    # Every node processed a share of each direction and observed the rest.
    for direction in (True, False):
        rows = [next(s for s in doc["sas"] if s["outbound"] == direction) for doc in docs]
        seen = [r["processed"] + r["observed"] for r in rows]
        assert max(seen) - min(seen) <= 2, (direction, rows)
        if dispatch.startswith("packet") or not direction:
            # Packet schemes (and every scheme inbound) spread one stream.
            assert all(r["processed"] > seen[0] / 6 for r in rows), (dispatch, direction, rows)
        else:
            # Session schemes keep each flow (the ping, the stream) on one
            # node: the stream's node did nearly all of it.
            assert max(r["processed"] for r in rows) > seen[0] * 0.9, (dispatch, direction, rows)
    # The peer saw one gateway: no replay or ICV drop, no unknown SPI.
    assert c.b.status()["drops"] == {}, c.b.status()["drops"]
    text = run(c.lab.espgate, "status", "-s", str(c.daemons[0].sock)).stdout
    assert f'cluster "t": node 1 ({dispatch}), processing; plan 1 [1, 2, 3], leader 1' in text, text
    assert "processed" in text and "in-step" in text, text


def test_two_flows_from_two_cpus_keep_one_order_on_every_node(lab):
    """Two flows from the inside host at once (the UDP stream and a fast
    ping, two processes the scheduler puts on either CPU) under
    packet-sqf, the scheme that suffers most when two nodes see packets in
    opposite orders: the hub (`Cluster._port`) keeps one order, so the
    peer sees no replay and nothing is lost. Without the steering, five
    runs of this lost 242 to 775 of 2500 datagrams (2026-11-29, counted
    by iperf3 then)."""
    c = Cluster(lab, dispatch="packet-sqf")
    c.start()
    c.plan(1, [1, 2, 3])
    pinger = subprocess.Popen(["ip", "netns", "exec", c.host, "ping", "-q", "-i", "0.002", "-c", "2000", "-s", "200",
                               "-W", "1", "10.2.0.1"], stdout=subprocess.PIPE, text=True)
    c.lab.procs.append(pinger)
    end, kernel_before = c.confirmed_stream(4)
    out, _ = pinger.communicate(timeout=30)
    assert end["packets"] > 2000, end
    assert_nothing_lost(c, end, kernel_before)
    assert c.b.status()["drops"] == {}, c.b.status()["drops"]
    assert " 0% packet loss" in out, out
    # Every node numbered the same packets: the same next sequence number.
    nexts = [d.sas("out")[0]["next_seq"] for d in c.daemons]
    assert nexts[0] == nexts[1] == nexts[2], nexts


def test_a_node_whose_shared_interface_can_reorder_says_so_at_start(lab):
    """RPS spreading node 1's inside interface over two CPUs could put two
    flows' packets in another order than on the other nodes: node 1 warns
    at start and names the fix; node 2, on one CPU, does not."""
    c = Cluster(lab, n=2)
    run("ip", "netns", "exec", c.nodes[0], "sh", "-c", "echo 3 > /sys/class/net/in0/queues/rx-0/rps_cpus")
    c.start()
    warn = 'cluster.inside = "in0": RPS spreads its receive queue over 2 CPUs'
    log1 = c.daemons[0].log_text()
    assert warn in log1 and "ethtool -L in0 combined 1" in log1, log1[-3000:]
    assert "cluster.inside" not in c.daemons[1].log_text()
    assert "cluster.outside" not in log1


def test_a_node_that_missed_packets_resyncs_and_a_stale_plan_stops_the_node(lab):
    c = Cluster(lab)
    c.start()
    c.plan(1, [1, 2, 3])
    # Node 3 misses traffic: its outside and inside ports are cut for a while.
    n3 = c.nodes[2]
    run("ip", "-n", n3, "link", "set", "in0", "down")
    run("ip", "netns", "exec", c.host, "ping", "-c", "20", "-i", "0.05", "-W", "1", "10.2.0.1", check=False)
    run("ip", "-n", n3, "link", "set", "in0", "up")
    run("ip", "-n", n3, "addr", "replace", "10.1.0.1/24", "dev", "in0")
    # Node 3's next sequence number is behind; it says so nowhere yet.
    nexts = [d.sas("out")[0]["next_seq"] for d in c.daemons]
    assert nexts[2] < nexts[0] == nexts[1], nexts
    # Traffic, then the checkpoints: node 3 is outvoted and moves.
    run("ip", "netns", "exec", c.host, "ping", "-c", "300", "-i", "0.01", "-W", "1", "10.2.0.1", check=False)
    # Status shows each node's checkpoint as of its last update (the agent
    # runs every second): one round to publish them, one to compare.
    c.plan(1, [1, 2, 3])
    c.plan(1, [1, 2, 3])
    docs = [d.status()["cluster"] for d in c.daemons]
    sa3 = next(s for s in docs[2]["sas"] if s["outbound"])
    assert sa3["resyncs"] == 1 and sa3["lockstep"] == "in-step", \
        json.dumps([[s for s in d["sas"] if s["outbound"]] for d in docs])
    assert "behind the other nodes" in c.daemons[2].log_text()
    nexts = [d.sas("out")[0]["next_seq"] for d in c.daemons]
    assert nexts[0] == nexts[1] == nexts[2], nexts
    drops_before = c.b.status()["drops"]
    r = run("ip", "netns", "exec", c.host, "ping", "-c", "30", "-i", "0.05", "-W", "1", "10.2.0.1", check=False)
    assert r.returncode == 0 and " 0% packet loss" in r.stdout, r.stdout
    assert c.b.status()["drops"] == drops_before
    # No confirmation for longer than the 5 s hold: every node stops, says
    # so, and counts what it did not forward.
    time.sleep(5.5)
    st = c.daemons[0].status()
    assert st["cluster"]["state"].startswith("stopped"), st["cluster"]
    r = run("ip", "netns", "exec", c.host, "ping", "-c", "3", "-i", "0.2", "-W", "1", "10.2.0.1", check=False)
    assert r.returncode != 0
    assert c.daemons[0].status()["drops"].get("cluster_no_plan", 0) >= 3
    assert c.daemons[0].status()["cluster"]["plan_age_ms"] >= 5000


# --- With etcd and the cluster agents -------------------------------------

ETCD = "/usr/bin/etcd"


class Etcd:
    """One etcd member in its own namespace on the management segment,
    its data in the test's temp dir; stopped and removed by the test.
    `peers`: every member's (name, address), for a multi-member etcd."""

    def __init__(self, lab, ns, addr, name="t", peers=None):
        self.lab, self.ns, self.addr, self.name = lab, ns, addr, name
        self.peers = peers or [(name, addr)]
        self.data = lab.tmp / f"etcd-{name}"
        self.proc = None

    def start(self, wait=True):
        url = f"http://{self.addr}"
        initial = ",".join(f"{n}=http://{a}:2380" for n, a in self.peers)
        self.log = open(self.lab.tmp / f"etcd-{self.name}.log", "ab")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, ETCD, "--name", self.name, "--data-dir", str(self.data),
             "--listen-client-urls", f"{url}:2379", "--advertise-client-urls", f"{url}:2379",
             "--listen-peer-urls", f"{url}:2380", "--initial-advertise-peer-urls", f"{url}:2380",
             "--initial-cluster", initial, "--heartbeat-interval", "50", "--election-timeout", "500"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.lab.procs.append(self.proc)
        if wait:
            self.wait()

    def wait(self):
        url = f"http://{self.addr}"
        deadline = time.time() + 15
        while time.time() < deadline:
            r = run("ip", "netns", "exec", self.ns, "etcdctl", "--endpoints", f"{url}:2379",
                    "endpoint", "health", check=False)
            if r.returncode == 0:
                return
            time.sleep(0.2)
        pytest.fail("etcd did not come up:\n" + (self.lab.tmp / f"etcd-{self.name}.log").read_text()[-3000:])

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=10)

    def revision(self):
        """The store's revision: it grows by one with every write."""
        r = run("ip", "netns", "exec", self.ns, "etcdctl", "--endpoints", f"http://{self.addr}:2379",
                "endpoint", "status", "-w", "json")
        return json.loads(r.stdout)[0]["Status"]["header"]["revision"]


def etcd_cluster(lab, n=3, members=1):
    """The cluster of `Cluster`, plus a management segment with an etcd of
    `members` members on it; the nodes' agents (run by `espgate up`) use
    every member as an endpoint."""
    if not pathlib.Path(ETCD).exists():
        pytest.fail(f"{ETCD} is missing: scripts/setup.sh installs etcd-server")
    c = Cluster(lab, n=n)
    run("ip", "-n", c.sw, "link", "add", "swmgmt", "type", "bridge")
    run("ip", "-n", c.sw, "link", "set", "swmgmt", "up")
    peers = [(f"e{k}", f"10.99.0.{100 + k}") for k in range(members)]
    etcds = []
    for name, addr in peers:
        ens = lab.netns("et")
        c._port(ens, "eth0", "swmgmt", f"{addr}/24")
        etcds.append(Etcd(lab, ens, addr, name, peers))
    for i, ns in enumerate(c.nodes, 1):
        c._port(ns, "mgmt0", "swmgmt", f"10.99.0.{i}/24")
    endpoints = ", ".join(f'"http://{a}:2379"' for _, a in peers)
    # The nodes' configs point at it, with a 2 s lease and a 6 s hold.
    for d in c.daemons:
        text = d.cfg.read_text().replace('etcd = ["http://127.0.0.1:1"]', f"etcd = [{endpoints}]")
        text = text.replace('hold = "5s"', 'hold = "6s"\nlease_ttl = "2s"')
        d.cfg.write_text(text)
    return c, etcds


def wait_plan(c, members, timeout, daemons=None):
    daemons = daemons or [d for i, d in enumerate(c.daemons, 1) if i in members]
    deadline = time.time() + timeout
    docs = []
    while time.time() < deadline:
        docs = [d.status()["cluster"] for d in daemons]
        if all(doc["plan"] and doc["plan"]["members"] == members and doc["state"] == "processing"
               for doc in docs):
            return docs
        time.sleep(0.1)
    pytest.fail(f"no plan {members} within {timeout} s: {docs}\n"
                + "\n".join(d.log_text()[-2000:] for d in daemons))


def test_etcd_cluster_survives_a_killed_node_the_leader_and_an_etcd_restart(lab):
    c, (e,) = etcd_cluster(lab)
    e.start()
    c.start()
    docs = wait_plan(c, [1, 2, 3], 20)
    leader = docs[0]["leader"]
    assert leader in (1, 2, 3) and all(d["leader"] == leader for d in docs), docs
    # `espgate cluster status` reads the same from etcd.
    r = run("ip", "netns", "exec", c.nodes[0], c.lab.espgate, "cluster", "status", "-c", str(c.daemons[0].cfg),
            "--json", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    view = json.loads(r.stdout)
    assert view["plan"]["members"] == [1, 2, 3] and view["leader"] == leader, view

    # kill -9 the leader under a stream: the survivors take over its share.
    victim = leader - 1
    result = {}

    def stream():
        result["end"] = udp_stream(c, 12, rate="2M", length=500, port=5302)

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(4)
    killed_at = time.time()
    c.daemons[victim].proc.kill()
    survivors = [i for i in (1, 2, 3) if i != leader]
    docs = wait_plan(c, survivors, 15, [c.daemons[i - 1] for i in survivors])
    replan = time.time() - killed_at
    t.join()
    end = result["end"]
    lost = end["lost_packets"]
    print(f"\nleader (node {leader}) killed: {lost} of {end['packets']} datagrams lost, "
          f"new plan {survivors} after {replan:.1f} s")
    assert replan < 2 + 4, replan  # the 2 s lease, and a few seconds for the new leader
    # Lost: at most the dead node's third of the stream until the new plan.
    assert 0 < lost < end["packets"] * 0.25, end
    new_leader = docs[0]["leader"]
    assert new_leader in survivors, docs
    assert c.b.status()["drops"].get("integrity", 0) == 0, c.b.status()["drops"]

    # An etcd restart shorter than the hold: forwarding never stops, and
    # the agents find etcd again.
    e.kill()
    time.sleep(2)
    r = run("ip", "netns", "exec", c.host, "ping", "-c", "10", "-i", "0.1", "-W", "1", "10.2.0.1", check=False)
    assert " 0% packet loss" in r.stdout, r.stdout
    e.start()
    time.sleep(2.5)
    for i in survivors:
        st = c.daemons[i - 1].status()["cluster"]
        assert st["state"] == "processing" and st["plan_age_ms"] < 2000, st
    # The killed node comes back: it is out of step (its sequence numbers
    # restart from its lease), catches up from the others' checkpoints,
    # and rejoins the plan.
    c.daemons[victim].start()
    stop = time.time() + 15
    while time.time() < stop:
        run("ip", "netns", "exec", c.host, "ping", "-c", "50", "-i", "0.01", "-W", "1", "10.2.0.1", check=False)
        st = c.daemons[victim].status()["cluster"]
        if st["plan"] and leader in st["plan"]["members"] and st["state"] == "processing":
            break
    st = c.daemons[victim].status()["cluster"]
    assert st["state"] == "processing", st
    sa = next(s for s in st["sas"] if s["outbound"])
    assert sa["resyncs"] >= 1, st
    drops = c.b.status()["drops"]
    r = run("ip", "netns", "exec", c.host, "ping", "-c", "30", "-i", "0.05", "-W", "1", "10.2.0.1", check=False)
    assert " 0% packet loss" in r.stdout, r.stdout
    assert c.b.status()["drops"].get("replay", 0) == drops.get("replay", 0)
    # A node stopped cleanly leaves the plan before it stops forwarding:
    # a stream through the cluster loses at most the few packets that the
    # nodes place differently while they switch to the new plan (each
    # switches when its own agent hears of it, a few ms apart; the CI run
    # of 2026-11-24 lost 2 of 2500 so, most runs lose none).
    result = {}

    def stream2():
        result["end"] = udp_stream(c, 5, rate="2M", length=500, port=5303)

    t = threading.Thread(target=stream2)
    t.start()
    time.sleep(2)
    leaving = survivors[0]
    assert c.daemons[leaving - 1].stop() == 0
    t.join()
    end = result["end"]
    print(f"node {leaving} stopped cleanly under a stream: {end['lost_packets']} of {end['packets']} lost")
    assert end["lost_packets"] <= end["packets"] * 0.004, end
    assert "the plan no longer names it" in c.daemons[leaving - 1].log_text()


def test_a_three_member_etcd_loses_a_member_and_the_cluster_does_not_notice(lab):
    c, etcds = etcd_cluster(lab, members=3)
    for e in etcds:
        e.start(wait=False)
    for e in etcds:
        e.wait()
    c.start()
    docs = wait_plan(c, [1, 2, 3], 20)
    result = {}

    def stream():
        result["end"] = udp_stream(c, 10, rate="2M", length=500, port=5304)

    t = threading.Thread(target=stream)
    kernel_before = c.kernel_counters()
    t.start()
    time.sleep(3)
    # Kill the member every agent lists first, then wait past the hold:
    # the agents carry on with the other two.
    etcds[0].kill()
    time.sleep(6.5)
    t.join()
    end = result["end"]
    print(f"\netcd member killed: {end['lost_packets']} of {end['packets']} datagrams lost")
    assert_nothing_lost(c, end, kernel_before)
    for d in c.daemons:
        st = d.status()["cluster"]
        assert st["state"] == "processing" and st["plan_age_ms"] < 3000, st
    assert docs[0]["plan"]["members"] == [1, 2, 3]


def test_udp_stream_counts_every_lost_and_doubled_datagram(lab):
    """udpflow.py, which the cluster tests trust for "nothing lost", checked
    against nftables matching its sequence numbers: the datagrams the
    receiver's input drops are lost (the last one too), those the sender
    sends twice are duplicates, and nothing else is either."""
    a, b, addr_a, addr_b = lab.pair()
    lost, doubled = [3, 13, 250, 499], [0, 7, 14]

    def nft(ns, hook, numbers, action):
        """In `ns`, `action` on the datagrams whose first 8 payload bytes
        (udpflow's number) are in `numbers`."""
        t = f"espgate_flow_{uuid.uuid4().hex[:8]}"
        match = "{ " + ", ".join(map(str, numbers)) + " }"
        r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], text=True, capture_output=True, timeout=30,
                           input=f"add table ip {t}\nadd chain ip {t} c {{ type filter hook {hook} priority 0; }}\n"
                                 f"add rule ip {t} c udp dport 5390 @th,64,64 {match} {action}\n")
        assert r.returncode == 0, r.stderr

    nft(b, "input", lost, "drop")
    nft(a, "output", doubled, f'dup to {addr_b} device "va"')
    c = type("Ends", (), {"lab": lab, "host": a, "peer": b})
    end = udp_stream(c, 1, rate="400K", length=100, port=5390, src=addr_a, dst=addr_b)
    assert end["packets"] == 500 and end["send_errors"] == 0, end
    assert end["lost_packets"] == len(lost) and end["missing"] == lost, end
    assert end["duplicates"] == len(doubled), end
