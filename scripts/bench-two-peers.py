#!/usr/bin/env python3
"""A/B benchmark of one gateway sending to two peers at once (or to one
peer under two TOS values), the case where a round's packets alternate
between destinations and cut into short runs.

Gateway A (namespace egA-…, TUN 10.1.0.1) has two ESP-in-UDP connections:
to 192.0.2.2 for 10.2.0.0/25 and to 192.0.2.12 for 10.2.0.128/25, both
addresses of gateway B (namespace egB-…), which mirrors them. Two iperf3
UDP clients in A's namespace send at full rate at once: to 10.2.0.1 and
10.2.0.129 (`--mode peers`), or both to 10.2.0.1, one with TOS 0xb8
(`--mode tos`). `--load alternate` replaces the two iperf3 clients by one
sender that strictly alternates between the two targets, datagram by
datagram, as fast as it can (the fine interleaving of a hub forwarding
many small flows to many peers), received by a counting sink at B.
Measured on gateway A, for each binary in turn (the
binaries alternate, `--rounds` times, so a shared machine's drift falls
on all of them alike):

- datagrams delivered per second at B (iperf3's server-side counts),
- A's CPU seconds per million datagrams sent (/proc/PID/stat),
- A's sendmsg and sendmmsg system calls per datagram sent (perf stat on
  the syscall tracepoints; "-" when perf cannot count them).

    scripts/bench-two-peers.py [--mode peers|tos] [--load iperf3|alternate]
                               [--time 10] [--len 64] [--rounds 3]
                               BINARY [BINARY ...]

Needs root, iperf3 and (for the system-call counts) perf. Creates two
network namespaces per run and deletes them afterwards.
"""

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

A_ADDR, B_ADDRS = "192.0.2.1", ("192.0.2.2", "192.0.2.12")
HALVES = ("10.2.0.0/25", "10.2.0.128/25")


def sh(*args, check=True, timeout=60):
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=timeout)


# Alternates datagrams of LEN bytes over the targets (address/TOS) for
# SECS seconds, unpaced; prints how many it sent.
ALTERNATE = r"""
import socket, sys, time
src, port, secs, length = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
socks = []
for t in sys.argv[5:]:
    addr, tos = t.split("/")
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, int(tos, 0))
    s.bind((src, 0))
    s.connect((addr, port))
    socks.append(s)
data = bytes(length)
sent, end = 0, time.monotonic() + secs
pair = socks * 32
while time.monotonic() < end:
    for s in pair:
        try:
            s.send(data)
            sent += 1
        except OSError:
            pass
print(sent, flush=True)
"""

# Counts datagrams at each address on one port until SIGTERM; prints the total.
SINK = r"""
import select, signal, socket, sys
port = int(sys.argv[1])
socks = []
for a in sys.argv[2:]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.setblocking(False)
    s.bind((a, port))
    socks.append(s)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
n = 0
print("listening", flush=True)
while not stop:
    try:
        ready, _, _ = select.select(socks, [], [], 0.05)
    except InterruptedError:
        continue
    for s in ready:
        while True:
            try:
                s.recv(2048)
                n += 1
            except BlockingIOError:
                break
print(n, flush=True)
"""


def configs(tmp):
    """gw.toml for A and B: two connections each, random AES-128-GCM keys."""
    out = {"A": [], "B": []}
    for k, (far, half) in enumerate(zip(B_ADDRS, HALVES)):
        ab, ba = secrets.token_hex(20), secrets.token_hex(20)
        spi = 0x3001 + 2 * k
        for side, local, remote, lts, rts, spi_in, spi_out, kin, kout in (
                ("A", A_ADDR, far, "10.1.0.0/24", half, spi, spi + 1, ba, ab),
                ("B", far, A_ADDR, half, "10.1.0.0/24", spi + 1, spi, ab, ba)):
            out[side].append(
                f'[[connection]]\nname = "c{k}"\nlocal = "{local}"\nremote = "{remote}"\n'
                f'local_ts = ["{lts}"]\nremote_ts = ["{rts}"]\n[connection.esp]\nsuite = "aes128gcm16"\n'
                f'spi_in = {spi_in:#x}\nspi_out = {spi_out:#x}\nenc_in = "{kin}"\nenc_out = "{kout}"\n')
    paths = {}
    for side, tun in (("A", '"10.1.0.1/24"'), ("B", '"10.2.0.1/24", "10.2.0.129/24"')):
        d = os.path.join(tmp, side)
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "gw.toml")
        with open(p, "w") as f:
            f.write(f'[gateway]\ntun = "tun{side}"\ntun_address = [{tun}]\nlisten = "0.0.0.0:4500"\n'
                    'control_socket = "ctl.sock"\nstate_dir = "state"\nlog = "info"\n\n' + "\n".join(out[side]))
        os.chmod(p, 0o600)
        paths[side] = p
    return paths


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status(binary, sock):
    return json.loads(sh(binary, "status", "--json", "-s", sock).stdout)


def one_run(binary, mode, load, secs, length):
    tag = uuid.uuid4().hex[:8]
    a, b = f"egA-{tag}", f"egB-{tag}"
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for ns in (a, b):
                sh("ip", "netns", "add", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", b)
            sh("ip", "-n", a, "addr", "add", f"{A_ADDR}/24", "dev", "va")
            for addr in B_ADDRS:
                sh("ip", "-n", b, "addr", "add", f"{addr}/24", "dev", "vb")
            for ns, dev in ((a, "va"), (b, "vb")):
                sh("ip", "-n", ns, "link", "set", dev, "up")
            paths = configs(tmp)
            gw = {}
            for side, ns in (("A", a), ("B", b)):
                log = open(os.path.join(tmp, side, "log"), "w")
                p = subprocess.Popen(["ip", "netns", "exec", ns, binary, "up", "-c", paths[side]],
                                     stdout=log, stderr=subprocess.STDOUT)
                procs.append(p)
                gw[side] = (p, os.path.join(tmp, side, "ctl.sock"))
            for side, (p, sock) in gw.items():
                for _ in range(100):
                    if os.path.exists(sock) and sh(binary, "status", "-s", sock, check=False).returncode == 0:
                        break
                    if p.poll() is not None:
                        sys.exit(f"{binary}: gateway {side} exited: "
                                 + open(os.path.join(tmp, side, "log")).read()[-2000:])
                    time.sleep(0.1)
            dsts = ["10.2.0.1", "10.2.0.129"] if mode == "peers" else ["10.2.0.1", "10.2.0.1"]
            tos = ["0", "0"] if mode == "peers" else ["0", "0xb8"]
            sink = None
            if load == "iperf3":
                for k, d in enumerate(dsts):
                    procs.append(subprocess.Popen(["ip", "netns", "exec", b, "iperf3", "-s", "-B", d,
                                                   "-p", str(5201 + k)], stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.DEVNULL))
                time.sleep(0.5)
            else:
                sink = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", SINK, "5201",
                                         *sorted(set(dsts))], stdout=subprocess.PIPE, text=True)
                procs.append(sink)
                assert sink.stdout.readline().strip() == "listening"
            pid = gw["A"][0].pid
            before = status(binary, gw["A"][1])["counters"]
            cpu0 = cpu_seconds(pid)
            perf = subprocess.Popen(["perf", "stat", "-x", ",", "-e",
                                     "syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendmmsg", "-p", str(pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if load == "iperf3":
                clients = [subprocess.Popen(["ip", "netns", "exec", a, "iperf3", "-c", d, "-p", str(5201 + k),
                                             "-u", "-l", str(length), "-b", "0", "-t", str(secs), "-S", tos[k],
                                             "-J", "--connect-timeout", "5000"],
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                           for k, d in enumerate(dsts)]
                results = [json.loads(c.communicate(timeout=secs + 30)[0]) for c in clients]
            else:
                targets = [f"{d}/{t}" for d, t in zip(dsts, tos)]
                sh("ip", "netns", "exec", a, sys.executable, "-c", ALTERNATE, "10.1.0.1", "5201", str(secs),
                   str(length), *targets, timeout=secs + 30)
                time.sleep(0.5)
                sink.terminate()
                results = [{"sink": int(sink.communicate(timeout=10)[0]), "seconds": secs}]
            perf.send_signal(2)
            perr = perf.communicate(timeout=10)[1]
            cpu = cpu_seconds(pid) - cpu0
            after = status(binary, gw["A"][1])["counters"]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        p.kill()
            for ns in (a, b):
                sh("ip", "netns", "del", ns, check=False)
    delivered = 0.0
    for r in results:
        if "sink" in r:
            delivered += r["sink"] / r["seconds"]
            continue
        if "error" in r:
            sys.exit(f"iperf3: {r['error']}")
        s = r["end"]["sum"]
        delivered += (s["packets"] - s["lost_packets"]) / s["seconds"]
    sent = after["net_tx"] - before["net_tx"]
    calls = 0
    for line in perr.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2].startswith("syscalls:") and parts[0].strip().isdigit():
            calls += int(parts[0])
    return {
        "delivered_pps": delivered,
        "cpu_s_per_mpkt": cpu / sent * 1e6 if sent else None,
        "calls_per_pkt": calls / sent if sent and calls else None,
        "sent": sent,
        "udp_batch_sends": after.get("udp_batch_sends", 0) - before.get("udp_batch_sends", 0),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["peers", "tos"], default="peers")
    ap.add_argument("--load", choices=["iperf3", "alternate"], default="iperf3")
    ap.add_argument("--time", type=int, default=10)
    ap.add_argument("--len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("binaries", nargs="+")
    args = ap.parse_args()
    rows = {b: [] for b in args.binaries}
    print(f"mode {args.mode}, load {args.load}, UDP {args.len} B, {args.time} s per run, {args.rounds} rounds", flush=True)
    for rnd in range(args.rounds):
        for b in args.binaries:
            r = one_run(b, args.mode, args.load, args.time, args.len)
            rows[b].append(r)
            calls = f"{r['calls_per_pkt']:.3f}" if r["calls_per_pkt"] is not None else "-"
            print(f"round {rnd + 1} {b}: delivered {r['delivered_pps']:.0f} pps, "
                  f"A {r['cpu_s_per_mpkt']:.2f} CPU s per M sent, {calls} send calls per packet, "
                  f"{r['udp_batch_sends']} sendmmsg of several", flush=True)
    print("median over rounds:")
    for b, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs if r[k] is not None) if any(r[k] is not None for r in rs)
               else None for k in ("delivered_pps", "cpu_s_per_mpkt", "calls_per_pkt")}
        calls = f"{med['calls_per_pkt']:.3f}" if med["calls_per_pkt"] is not None else "-"
        print(f"  {b}: {med['delivered_pps']:.0f} pps delivered, {med['cpu_s_per_mpkt']:.2f} CPU s per M, "
              f"{calls} send calls per packet")


if __name__ == "__main__":
    main()
