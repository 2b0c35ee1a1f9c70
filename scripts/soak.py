#!/usr/bin/env python3
"""Soak: two espgate gateways with IKEv2 in network namespaces, under mixed
traffic for a long time (30 minutes by default), with child SAs rekeyed
every 10 s and the IKE SA every 60 s; once a second the script reads each
daemon's status (counters, drops, SAs) and, from /proc, its resident
memory, open descriptors and threads.

At the end it prints, per gateway, the first and last readings after a
warm-up minute (what must stay flat), the rekeys done, and how the loss
iperf3 measured on the UDP stream compares with the drops the gateways
counted by reason (every lost datagram should have a counted reason,
unless the kernel dropped it before espgate read it).

    scripts/soak.py [--minutes 30] [--json FILE]

Needs root, iproute2, iperf3 and a built espgate (ESPGATE or
target/release/espgate). Everything runs in namespaces the script makes,
and they are deleted at the end, also on Ctrl-C. The traffic is bounded
(UDP 20 Mbit/s and a TCP stream capped at 50 Mbit/s) so that the figures
describe long-running behaviour, not a saturated machine.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from test_gateway import Lab, run  # noqa: E402
from test_ike import established, ike_pair, ike_status  # noqa: E402


def proc_reading(pid):
    """Resident memory (KiB), open descriptors and threads of `pid`."""
    rss = threads = 0
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss_kib": rss, "fds": fds, "threads": threads}


def kernel_drops(ns, tun):
    """What the kernel of namespace `ns` dropped on the way to or from
    espgate: UDP datagrams that found a full receive buffer (`Udp:
    RcvbufErrors`, the gateway's and iperf3's sockets alike), and packets
    the TUN device `tun` could not queue for espgate (`tx_dropped`) or
    could not deliver (`rx_dropped`)."""
    snmp = run("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").stdout.splitlines()
    udp = [line.split()[1:] for line in snmp if line.startswith("Udp:")]
    fields = dict(zip(udp[0], map(int, udp[1]))) if len(udp) == 2 else {}
    link = json.loads(run("ip", "-n", ns, "-s", "-j", "link", "show", tun).stdout or "[]")
    stats = link[0].get("stats64", {}) if link else {}
    return {
        "udp_rcvbuf_errors": fields.get("RcvbufErrors", 0),
        "udp_in_errors": fields.get("InErrors", 0),
        "tun_tx_dropped": stats.get("tx", {}).get("dropped", 0),
        "tun_rx_dropped": stats.get("rx", {}).get("dropped", 0),
    }


def reading(d):
    st = d.status()
    ike = ike_status(d)
    sas = sum(len(c.get("sas", [])) for c in st.get("connections", []))
    per_sa_drops = {}
    for c in st.get("connections", []):
        for sa in c.get("sas", []):
            for k, v in sa.get("drops", {}).items():
                per_sa_drops[k] = per_sa_drops.get(k, 0) + v
    return {
        **proc_reading(d.proc.pid),
        "sas": sas,
        "ike_sas": len(ike["sas"]),
        "children": sum(len(s["children"]) for s in ike["sas"]),
        "child_rekeys": ike["counters"].get("child_rekeys", 0),
        "ike_rekeys": ike["counters"].get("ike_rekeys", 0),
        "drops": st.get("drops", {}),
        "sa_drops": per_sa_drops,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--json", help="write every reading and the summary here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("soak: needs root (network namespaces)")
    iperf3 = shutil.which("iperf3")
    if not iperf3:
        sys.exit("soak: needs iperf3 (scripts/setup.sh installs it)")
    espgate = os.environ.get("ESPGATE", str(ROOT / "target" / "release" / "espgate"))
    if not os.access(espgate, os.X_OK):
        sys.exit(f"soak: no espgate at {espgate}; build it (cargo build --release -p espgate) or set ESPGATE")
    secs = int(args.minutes * 60)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="espgate-soak-"))
    lab = Lab(espgate, tmp)
    samples = []
    try:
        a, b = ike_pair(lab, a_ike='start_action = "start"\nchild_rekey_time = "10s"\nchild_life_time = "30s"\n'
                                   'rekey_time = "60s"\njitter = "2s"',
                        b_ike='child_rekey_time = "1h"\nrekey_time = "1h"')
        b.start()
        a.start()
        deadline = time.time() + 30
        while not (established(a) and established(b)):
            if time.time() > deadline:
                sys.exit("soak: the IKE SA did not come up within 30 s")
            time.sleep(0.2)
        servers = [subprocess.Popen(["ip", "netns", "exec", b.ns, iperf3, "-s", "-1", "-B", "10.2.0.1", "-p", str(p)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in (5301, 5302)]
        lab.procs.extend(servers)
        time.sleep(0.5)
        base = ["ip", "netns", "exec", a.ns, iperf3, "-c", "10.2.0.1", "-B", "10.1.0.1", "-t", str(secs), "-J"]
        udp = subprocess.Popen(base + ["-p", "5301", "-u", "-b", "20M", "-l", "1200"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        tcp = subprocess.Popen(base + ["-p", "5302", "-b", "50M"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lab.procs.extend([udp, tcp])
        start = time.time()
        next_print = start
        while time.time() - start < secs + 5 and (udp.poll() is None or tcp.poll() is None):
            t = time.time() - start
            samples.append({"t": round(t, 1), "a": reading(a), "b": reading(b)})
            if time.time() >= next_print:
                r = samples[-1]
                print(f"{t:7.0f} s  A rss {r['a']['rss_kib']} KiB fds {r['a']['fds']} sas {r['a']['sas']} "
                      f"child_rekeys {r['a']['child_rekeys']} ike_rekeys {r['a']['ike_rekeys']} | "
                      f"B rss {r['b']['rss_kib']} KiB fds {r['b']['fds']}", flush=True)
                next_print += 60
            time.sleep(max(0.0, 1.0 - (time.time() - start - t)))
        u_out, _ = udp.communicate(timeout=60)
        t_out, _ = tcp.communicate(timeout=60)
        u = json.loads(u_out)["end"]["sum"]
        tc = json.loads(t_out)["end"]["sum_received"]
        kernel = {"a": kernel_drops(a.ns, "tunA"), "b": kernel_drops(b.ns, "tunB")}
        warm = next((s for s in samples if s["t"] >= 60), samples[0])
        last = samples[-1]
        summary = {"minutes": args.minutes, "samples": len(samples),
                   "udp": {"packets": u["packets"], "lost": u["lost_packets"]},
                   "tcp_bytes": tc["bytes"], "gateways": {}}
        for side in ("a", "b"):
            w, e = warm[side], last[side]
            summary["gateways"][side] = {
                k: {"after_1_min": w[k], "end": e[k]} for k in ("rss_kib", "fds", "threads", "sas", "children")}
            summary["gateways"][side]["child_rekeys"] = e["child_rekeys"]
            summary["gateways"][side]["ike_rekeys"] = e["ike_rekeys"]
            summary["gateways"][side]["drops"] = e["drops"]
            summary["gateways"][side]["sa_drops"] = e["sa_drops"]
        counted = sum(sum(last[s]["drops"].values()) for s in ("a", "b"))
        summary["udp"]["counted_drops_both_gateways"] = counted
        # Where a lost datagram can go without espgate seeing it: the
        # kernel's UDP receive buffers (the gateways' sockets and iperf3's)
        # and the TUN queues. These count TCP packets too, so they bound the
        # UDP stream's unexplained loss from above.
        summary["kernel_drops"] = kernel
        summary["udp"]["kernel_drops_both_namespaces"] = sum(
            sum(v.values()) for v in kernel.values())
        print(json.dumps(summary, indent=2))
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps({"summary": summary, "samples": samples}) + "\n")
        a.stop()
        b.stop()
    finally:
        lab.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
