"""Several data-plane workers (`gateway.workers`): one TUN queue, one
SO_REUSEPORT UDP socket (steered by SPI) and one engine per worker, outbound
SA copies sharing one sequence counter.

Two `espgate up` in two network namespaces (the `configs` / `Lab` helpers of
test_gateway.py), both with `workers = 2`:

- Several TCP transfers both ways at once (so that the kernel spreads the
  flows over both TUN queues) arrive complete, nothing is dropped, the
  status says 2 workers, each inbound SA is listed once, the outbound SA's
  packets are the sum over workers and its next sequence number is one more
  than the packets it sent: no number was used twice or skipped.
- `sa add` / `sa del` reach every worker: a new inbound/outbound SA pair
  carries traffic after the old outbound SA is deleted.
- After a restart the outbound SA continues above every number sent before.

Namespaces are unique per test and deleted by the `lab` fixture, with every
process the test started, even on failure; every wait is bounded.
"""

import os
import shutil
import subprocess
import sys
import threading

import pytest

from test_gateway import PING, assert_ping, configs, lab, run, tcp_transfer  # noqa: F401

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun"),
        reason="needs root, iproute2 and /dev/net/tun (scripts/setup.sh installs iproute2)"),
    pytest.mark.skipif(PING is None, reason="needs ping (iputils-ping; scripts/setup.sh installs it)"),
]


def parallel_transfers(lab, a, b, size, base_port):
    """Four TCP transfers at once, two each way; each checks its data."""
    errors = []

    def one(args):
        try:
            tcp_transfer(lab, *args)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    jobs = [
        (b.ns, "10.2.0.1", a.ns, "10.1.0.1", size, base_port),
        (b.ns, "10.2.0.1", a.ns, "10.1.0.1", size, base_port + 1),
        (a.ns, "10.1.0.1", b.ns, "10.2.0.1", size, base_port + 2),
        (a.ns, "10.1.0.1", b.ns, "10.2.0.1", size, base_port + 3),
    ]
    threads = [threading.Thread(target=one, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a transfer did not finish in 120 s"
    assert not errors, errors


def test_two_workers_carry_parallel_flows_without_reusing_numbers(lab):
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16", extra_gw="workers = 2")
    a.start()
    b.start()
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    parallel_transfers(lab, a, b, 5 * 1000 * 1000, 5301)
    for d in (a, b):
        st = d.status()
        assert st["workers"] == 2, st
        assert st["drops"] == {}, (d.ns, st["drops"])
        assert "udp_gro" not in st["offloads"], st["offloads"]
        sas = st["connections"][0]["sas"]
        ins = [s for s in sas if s["direction"] == "in"]
        outs = [s for s in sas if s["direction"] == "out"]
        assert len(ins) == 1 and len(outs) == 1, sas
        for s in sas:
            assert s["drops"] == {}, s
            assert s["packets"] > 1000, s
        out = outs[0]
        # Sequence numbers start at 1 on a fresh state directory: every
        # number was used exactly once across both workers.
        assert out["next_seq"] == out["packets"] + 1, out
        assert st["counters"]["hot_path_allocs"] == 0, st["counters"]
        # ESP-in-UDP is steered by SPI: A's inbound SA 0x1001 to worker 1,
        # B's 0x1002 to worker 0; the other worker receives nothing.
        owner = 1 if d is a else 0
        pw = st["per_worker"]
        assert len(pw) == 2, pw
        assert pw[owner]["net_rx"] > 1000 and pw[1 - owner]["net_rx"] == 0, (d.ns, pw)
        assert pw[0]["tun_rx"] + pw[1]["tun_rx"] == st["counters"]["tun_rx"], pw
    # The receiver saw every number the sender used (no replay drops above).
    seq_a = [s for s in a.status()["connections"][0]["sas"] if s["direction"] == "out"][0]
    seq_b_in = [s for s in b.status()["connections"][0]["sas"] if s["direction"] == "in"][0]
    assert seq_b_in["highest_seq"] <= seq_a["next_seq"] - 1
    assert a.stop() == 0 and b.stop() == 0
    # A restart continues above every number sent.
    a.start()
    st = a.status()
    out = [s for s in st["connections"][0]["sas"] if s["direction"] == "out"][0]
    assert out["next_seq"] >= seq_a["next_seq"], (out, seq_a)
    assert a.stop() == 0


def test_sa_changes_reach_every_worker(lab):
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16", extra_gw="workers = 2")
    a.start()
    b.start()
    k_ab, k_ba = "11" * 20, "22" * 20  # A sends with k_ab on 0x3002, B with k_ba on 0x3001

    def sa(d, *args):
        r = run(d.lab.espgate, "sa", *args, "-s", str(d.sock), check=False)
        assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{d.log_text()}"

    # Inbound first, then the outbound SAs that replace the old ones. Odd
    # and even SPIs are steered to different workers.
    sa(a, "add", "--conn", "to-b", "--dir", "in", f"spi=0x3001,suite=aes128gcm16,enc={k_ba}")
    sa(b, "add", "--conn", "to-a", "--dir", "in", f"spi=0x3002,suite=aes128gcm16,enc={k_ab}")
    sa(a, "add", "--conn", "to-b", "--dir", "out", f"spi=0x3002,suite=aes128gcm16,enc={k_ab}")
    sa(b, "add", "--conn", "to-a", "--dir", "out", f"spi=0x3001,suite=aes128gcm16,enc={k_ba}")
    # The old inbound SAs go: 0x1001 lives in A's worker 1, 0x1002 in B's worker 0.
    sa(a, "del", "--spi", "0x1001", "--dir", "in")
    sa(b, "del", "--spi", "0x1002", "--dir", "in")
    parallel_transfers(lab, a, b, 2 * 1000 * 1000, 5311)
    for d, new_out, new_in in ((a, "0x00003002", "0x00003001"), (b, "0x00003001", "0x00003002")):
        st = d.status()
        assert st["drops"] == {}, (d.ns, st["drops"])
        sas = {(s["direction"], s["spi"]): s for s in st["connections"][0]["sas"]}
        assert sorted(sas) == sorted([("out", new_out), ("in", new_in)]), sas
        out = sas[("out", new_out)]
        assert out["packets"] > 500 and sas[("in", new_in)]["packets"] > 500, sas
        # Added SAs start at 1: one number per packet across the workers.
        assert out["next_seq"] == out["packets"] + 1, out
    assert a.stop() == 0 and b.stop() == 0


def test_per_cpu_sas_one_pair_per_worker(lab):
    """`per_cpu_sas = 2` with two workers on both sides: two SA pairs with
    derived keys, each worker sending on its own pair, each inbound SA
    steered to one worker."""
    a, b = configs(lab, protocol="esp", encap="udp", esp="aes128gcm16", extra_gw="workers = 2",
                   extra_conn="per_cpu_sas = 2", esp_spis=(0x1000, 0x2000))
    a.start()
    b.start()
    assert_ping(a.ns, "10.2.0.1", "10.1.0.1", daemons=(a, b))
    parallel_transfers(lab, a, b, 3 * 1000 * 1000, 5321)
    for d, ins, outs in ((a, ["0x00001000", "0x00001001"], ["0x00002000", "0x00002001"]),
                         (b, ["0x00002000", "0x00002001"], ["0x00001000", "0x00001001"])):
        st = d.status()
        assert st["drops"] == {}, (d.ns, st["drops"])
        sas = st["connections"][0]["sas"]
        assert sorted(s["spi"] for s in sas if s["direction"] == "in") == ins, sas
        assert sorted(s["spi"] for s in sas if s["direction"] == "out") == outs, sas
        used = [s for s in sas if s["direction"] == "out" and s["packets"] > 0]
        assert used, sas
        for s in sas:
            assert s["drops"] == {}, s
            if s["direction"] == "out":
                assert s["next_seq"] == s["packets"] + 1, s
        # Each worker receives only the SPIs steered to it: SPI % 2.
        pw = st["per_worker"]
        for s in sas:
            if s["direction"] == "in" and s["packets"] > 0:
                assert pw[int(s["spi"], 16) % 2]["net_rx"] >= s["packets"], (s, pw)
    assert a.stop() == 0 and b.stop() == 0
