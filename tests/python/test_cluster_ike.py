"""Seed 003's cluster with IKE run by the leader, end to end: three espgate
nodes on flooding segments (test_cluster's rig) with a real etcd and
their cluster agents (`espgate up`), against an ordinary espgate peer
and against strongSwan (charon with kernel-libipsec).

Only the leader's IKE answers; the followers leave the IKE datagrams
they see. Each child SA the leader negotiates reaches the followers
through etcd, encrypted under the cluster key; it is processed by the
leader alone until every node has it and is in step, then shared from a
sequence number the leader picks (docs/CLUSTER.md §8). A leader killed
with SIGKILL is replaced: the new leader re-establishes the tunnel."""

import os
import secrets
import shutil
import subprocess
import threading
import time

import pytest

from test_cluster import assert_nothing_lost, etcd_cluster, udp_stream, wait_plan
from test_gateway import lab, run  # noqa: F401 (lab is a fixture)
from test_ike import wait_for
from test_ike_strongswan import CHARON, PLUGINS, Charon

PSK = "cluster interop pre-shared key, test only"


def story(daemons, charon=None):
    """The cluster and IKE lines of each daemon's log (and charon's tail),
    for a failure message."""
    out = []
    for d in daemons:
        lines = [ln for ln in d.log_text().splitlines() if " cluster" in ln or " ike:" in ln]
        out.append(f"--- {d.ns} ---\n" + "\n".join(lines[-60:]))
    if charon:
        out.append("--- charon ---\n" + charon.log_text()[-4000:])
    return "\n".join(out)


EXTRA_NS = []


def diagnosis(daemons, charon):
    """Each node's drops, SAs and cluster rows, charon's SAs, and the logs."""
    out = []
    for d in daemons:
        st = d.status()
        out.append(f"--- {d.ns}: drops {st.get('drops')} counters {st.get('counters')} cluster {st.get('cluster')}")
        k = run("ip", "netns", "exec", d.ns, "nstat", "-asz", check=False).stdout.split("\n")
        out.append("kernel: " + " ".join(ln.split()[0] + "=" + ln.split()[1] for ln in k[1:] if len(ln.split()) > 1
                                         and ln.split()[1] != "0" and ("Err" in ln or "Drop" in ln or "Discard" in ln
                                                                       or "InDatagrams" in ln or "NoPorts" in ln)))
    out.append("--- charon SAs ---\n" + charon.list_sas())
    for ns in EXTRA_NS:
        for cmd in (["ip", "-s", "neigh"], ["ss", "-tuanp"], ["nstat", "-asz"], ["ip", "route"], ["ip", "-s", "link"]):
            r = run("ip", "netns", "exec", ns, *cmd, check=False)
            text = r.stdout
            if cmd[0] == "nstat":
                text = " ".join(f"{ln.split()[0]}={ln.split()[1]}" for ln in text.splitlines()[1:]
                                if len(ln.split()) > 1 and ln.split()[1] != "0")
            out.append(f"--- {ns} {' '.join(cmd)}\n{text}")
    return "\n".join(out) + "\n" + story(daemons, charon)


def wait(what, pred, timeout, daemons, charon=None):
    return wait_for(what, pred, timeout, explain=lambda: story(daemons, charon))


def ike_section(extra=""):
    return f"""[connection.ike]
psk_file = "psk"
local_id = "cluster.example"
remote_id = "peer.example"
esp_proposals = ["aes128gcm16"]
{extra}
"""


def with_ike(d, ike, cluster_key=None, ids=("cluster.example", "peer.example")):
    """Rewrites daemon `d`'s configuration: IKE instead of manual keys."""
    text = d.cfg.read_text()
    text = text[: text.index("[connection.esp]")] + ike
    if ids != ("cluster.example", "peer.example"):
        text = text.replace('local_id = "cluster.example"', f'local_id = "{ids[0]}"')
        text = text.replace('remote_id = "peer.example"', f'remote_id = "{ids[1]}"')
    if cluster_key:
        text = text.replace("\n[cluster]\n", f'\n[cluster]\nkey_file = "{cluster_key}"\n')
    d.cfg.write_text(text)
    psk = d.cfg.parent / "psk"
    psk.write_text(PSK + "\n")
    psk.chmod(0o600)


def ike_cluster(lab, node_ike=""):
    """The etcd cluster of test_cluster with IKE connections on the nodes."""
    c, (e,) = etcd_cluster(lab)
    key = lab.tmp / "cluster.key"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    for d in c.daemons:
        with_ike(d, ike_section(node_ike), cluster_key=key)
    return c, e


def shared_rows(d):
    """The node's shared SAs from its status: {outbound: row}."""
    st = d.status()["cluster"]
    return {s["outbound"]: s for s in st["sas"] if s.get("shared")}


def all_shared(c, daemons=None):
    """Every node has an inbound and an outbound shared SA, the same ones,
    dispatched over the plan (share_from set)."""
    daemons = daemons or c.daemons
    rows = [shared_rows(d) for d in daemons]
    if not all(len(r) == 2 and all(s.get("share_from") for s in r.values()) for r in rows):
        return None
    spis = {(r[True]["spi"], r[False]["spi"]) for r in rows}
    return rows if len(spis) == 1 else None


def both_ways(c, seconds=4, rate="2M"):
    """A UDP stream each way; returns the two `udp_stream` counts."""
    return [udp_stream(c, seconds, rate=rate, length=500, reverse=rev, port=5310 + rev) for rev in (False, True)]


def check_spread(c, rows_before, daemons=None, directions=(True, False)):
    """Every node processed part of each direction (outbound: True) since
    `rows_before`."""
    daemons = daemons or c.daemons
    rows = [shared_rows(d) for d in daemons]
    for direction in directions:
        done = [r[direction]["processed"] - b[direction]["processed"] for r, b in zip(rows, rows_before)]
        assert all(n > 0 for n in done), (direction, done, rows)


def test_the_leaders_ike_sas_reach_every_node_and_all_share_the_work(lab):
    c, e = ike_cluster(lab)
    with_ike(c.b, ike_section('start_action = "start"'), ids=("peer.example", "cluster.example"))
    e.start()
    c.start()
    docs = wait_plan(c, [1, 2, 3], 20)
    leader = docs[0]["leader"]
    logs = c.daemons + [c.b]
    wait("the shared SAs on every node", lambda: all_shared(c), 30, logs)
    # The peer made one IKE SA, with the leader; the followers left its
    # datagrams.
    sas = c.b.status()["ike"]["sas"]
    assert len(sas) == 1 and sas[0]["state"] == "established", sas
    for i, d in enumerate(c.daemons, 1):
        ike = d.status()["ike"]
        if i == leader:
            assert len(ike["sas"]) == 1, ike
        else:
            assert ike["sas"] == [] and ike["counters"].get("not_leader", 0) >= 2, (i, ike)
    # Keys never in clear in etcd.
    r = run("ip", "netns", "exec", c.nodes[0], "etcdctl", "--endpoints", f"http://{e.addr}:2379",
            "get", "--prefix", "/espgate/t/sas/", check=False)
    assert r.returncode == 0 and "sas/0x" in r.stdout, r.stdout + r.stderr
    assert '"ct"' in r.stdout and "enc_key" not in r.stdout, r.stdout
    # An idle cluster writes little: each node's report once a second, and
    # the leader's IKE state, whose remaining times change at every export,
    # every 10 s at most (each write once woke the leader's own watch, which
    # wrote again: ~300 writes a second, found by a CI failure).
    r0, t0 = e.revision(), time.time()
    time.sleep(4)
    writes = e.revision() - r0
    print(f"\nidle cluster: {writes} etcd writes in {time.time() - t0:.1f} s")
    assert writes <= 20, writes
    before = all_shared(c)
    ends = both_ways(c)
    for end in ends:
        assert end["packets"] > 1000 and end["lost_packets"] == 0, (ends, [d.status()["drops"] for d in logs])
    check_spread(c, before)
    assert c.b.status()["drops"] == {}, c.b.status()["drops"]


def test_strongswan_peer_and_a_killed_leader(lab):
    if CHARON is None or not os.path.exists(os.path.join(PLUGINS, "libstrongswan-kernel-libipsec.so")):
        pytest.skip("needs strongSwan with kernel-libipsec (scripts/setup.sh installs it)")
    # The cluster initiates (its leader does); charon answers.
    c, e = ike_cluster(lab, node_ike='start_action = "start"')
    for d in c.daemons:
        text = d.cfg.read_text().replace('remote_ts = ["10.2.0.0/24"]', 'remote_ts = ["10.2.0.1/32"]')
        d.cfg.write_text(text)
    run("ip", "-n", c.peer, "addr", "add", "10.2.0.1/32", "dev", "lo")
    cd = lab.tmp / "charon"
    cd.mkdir()
    charon = Charon(lab, c.peer, cd)
    charon.write(f"""connections {{
  cluster {{
    version = 2
    local_addrs = 192.168.50.2
    remote_addrs = 192.168.50.1
    proposals = aes128gcm16-prfsha256-x25519
    encap = yes
    dpd_delay = 2s
    local {{
      auth = psk
      id = peer.example
    }}
    remote {{
      auth = psk
      id = cluster.example
    }}
    children {{
      net {{
        local_ts = 10.2.0.1/32
        remote_ts = 10.1.0.0/24
        esp_proposals = aes128gcm16
        mode = tunnel
      }}
    }}
  }}
}}
secrets {{
  ike-1 {{
    id-1 = peer.example
    id-2 = cluster.example
    secret = "{PSK}"
  }}
}}
""")
    e.start()
    charon.start()
    for d in c.daemons:  # charon is the peer: the espgate peer stays down
        d.start()
    docs = wait_plan(c, [1, 2, 3], 20)
    leader = docs[0]["leader"]
    wait("the shared SAs on every node", lambda: all_shared(c), 30, c.daemons, charon)
    assert "ESTABLISHED" in charon.list_sas(), charon.list_sas()
    before = all_shared(c)
    ends = both_ways(c)
    for end in ends:
        assert end["packets"] > 1000 and end["lost_packets"] == 0, (ends, charon.log_text()[-3000:])
    check_spread(c, before)

    # kill -9 the leader under a stream: the survivors elect a new leader,
    # which continues the IKE SA from its state in etcd (no new
    # handshake); the SAs in use carry on, now shared by the survivors.
    ike_spis = c.daemons[leader - 1].status()["ike"]["sas"][0]["spis"]
    result = {}

    def stream():
        result["end"] = udp_stream(c, 10, rate="1M", length=500, port=5320)

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(3)
    c.daemons[leader - 1].proc.kill()
    survivors = [i for i in (1, 2, 3) if i != leader]
    alive = [c.daemons[i - 1] for i in survivors]
    docs = wait_plan(c, survivors, 15, alive)
    new_leader = docs[0]["leader"]
    assert new_leader in survivors, docs
    heir = c.daemons[new_leader - 1]

    def continued():
        ike = heir.status()["ike"]
        return ike["counters"].get("ike_sas_continued") == 1 and ike["sas"] and ike["sas"][0]["spis"] == ike_spis

    wait("the new leader to continue the IKE SA", continued, 10, alive, charon)
    t.join()
    end = result["end"]
    lost = end["lost_packets"]
    print(f"\nleader (node {leader}) killed under IKE: {lost} of {end['packets']} datagrams lost; "
          f"node {new_leader} leads and continued IKE SA {ike_spis}")
    assert lost < end["packets"] * 0.25, end
    # The continued IKE SA works: charon rekeys the child over it; the new
    # SAs reach the other survivor and both share them, losing nothing.
    old = {s["spi"] for s in all_shared(c, alive)[0].values()}
    r = charon.swanctl_cmd("--rekey", "--child", "net")
    assert r.returncode == 0, r.stdout + r.stderr

    def rekeyed():
        rows = all_shared(c, alive)
        return rows and not ({s["spi"] for s in rows[0].values()} & old) and rows

    wait("the rekeyed child SA on the survivors", rekeyed, 20, alive, charon)
    before = all_shared(c, alive)
    EXTRA_NS[:] = [c.host, c.nodes[leader - 1]]
    try:
        ends = both_ways(c, seconds=3)
    except (AssertionError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"no stream after the rekey ({e}):\n" + diagnosis(alive, charon))
    for end in ends:
        assert end["lost_packets"] == 0, (ends, story(alive, charon))
    check_spread(c, before, alive)
    sas = charon.list_sas()
    assert sas.count("ESTABLISHED") == 1, sas
    spi_i, spi_r = (x.split("_")[0] for x in ike_spis.split())
    assert spi_i in sas and spi_r in sas, (ike_spis, sas)


def test_the_leader_rekeys_under_traffic_and_nothing_is_lost(lab):
    # The leader rekeys the child SA every 4 s; each new pair of SAs is
    # processed by the leader alone until the followers have it, then
    # shared: a stream each way loses nothing across the rekeys.
    c, e = ike_cluster(lab, node_ike='child_rekey_time = "4s"\nchild_life_time = "20s"')
    with_ike(c.b, ike_section('start_action = "start"'), ids=("peer.example", "cluster.example"))
    e.start()
    c.start()
    wait_plan(c, [1, 2, 3], 20)
    logs = c.daemons + [c.b]
    wait("the shared SAs on every node", lambda: all_shared(c), 30, logs)
    first = {s["spi"] for s in all_shared(c)[0].values()}
    ends = both_ways(c, seconds=9, rate="1M")
    for end in ends:
        assert end["packets"] > 2000 and end["lost_packets"] == 0, (ends, story(logs))
    rekeys = sum(ln.count("rekeyed") for ln in c.b.log_text().splitlines() if "child SA" in ln)
    now = all_shared(c) or all_shared(c)
    assert rekeys >= 3, story(logs)
    assert now is None or not ({s["spi"] for s in now[0].values()} & first), now
    drops = c.b.status()["drops"]
    print(f"\n{rekeys} child rekeys in 18 s of streams: 0 lost; peer drops {drops}")
    assert drops.get("integrity", 0) == 0 and drops.get("replay", 0) == 0, drops


@pytest.mark.skipif(shutil.which("nft") is None or shutil.which("conntrack") is None,
                    reason="needs nft and conntrack (scripts/setup.sh)")
def test_every_node_follows_a_peer_its_nat_maps_anew(lab):
    """The peer sits behind a NAT that gives each flow a random source port
    (nftables `masquerade random` in its own namespace). The NAT forgets
    its mappings (conntrack flushed) and maps the peer anew: the leader's
    IKE sees the new port at the peer's next message and moves its SAs
    (RFC 7296 §2.23); the followers, which run no IKE, follow through etcd
    (the shared SA's ports), with no rekey. Before that, every follower
    kept sending its share of the cluster's ESP to the old port, where
    nothing listens any more."""
    c, e = ike_cluster(lab)
    with_ike(c.b, ike_section('start_action = "start"\ndpd_delay = "2s"'),
             ids=("peer.example", "cluster.example"))
    run("ip", "netns", "exec", c.peer, "nft", "-f", "-", input="""
table ip espgate_test_nat {
    chain post {
        type nat hook postrouting priority srcnat; policy accept;
        oifname "eth0" masquerade random
    }
}
""")
    e.start()
    c.start()
    leader = wait_plan(c, [1, 2, 3], 20)[0]["leader"]
    logs = c.daemons + [c.b]
    wait("the shared SAs on every node", lambda: all_shared(c), 30, logs)
    spis = {s["spi"] for s in all_shared(c)[0].values()}
    # (The NAT may have moved the peer once already while the nodes' first
    # packets to its port 4500 and its own crossed: count the moves.)
    followers = [d for i, d in enumerate(c.daemons, 1) if i != leader]
    moved = "the peer's NAT moved it to 192.168.50.2:"
    told = [d.log_text().count(moved) for d in followers]
    run("ip", "netns", "exec", c.peer, "conntrack", "-F", check=False)
    wait("the followers told of the new port",
         lambda: all(d.log_text().count(moved) > n for d, n in zip(followers, told)), 30, logs)
    assert "outbound SA(s) now send ESP to 192.168.50.2:" in c.daemons[leader - 1].log_text()
    before = all_shared(c)
    kernel_before = c.kernel_counters()
    end = udp_stream(c, 4, rate="2M", length=500, port=5320)
    assert end["packets"] > 1000, end
    assert_nothing_lost(c, end, kernel_before)
    check_spread(c, before, directions=(True,))
    now = all_shared(c)
    assert now and {s["spi"] for s in now[0].values()} == spis, "followed by a rekey, not by the move"
