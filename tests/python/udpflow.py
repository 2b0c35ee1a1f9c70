"""A paced UDP stream with exact loss accounting, for the cluster tests.

Why not iperf3 there: a flat cluster under a packet scheme spreads one
flow over several nodes, so the packets of a flow can leave it out of
order (by design; seed 003 says so). iperf3 3.12's UDP client, in reverse
mode, takes the first datagram it receives as the server's 4-byte
"connect reply": when the stream's first data datagram overtakes the
reply, iperf3 swallows it and reports it lost. Measured 2026-11-29 on
the three-node test: 8 of 50 reverse streams had the first data datagram
ahead of the reply at the host (tcpdump), and exactly those 8 reported
1 lost; the cluster had processed every packet it saw once. iperf3 also
nets a duplicate against a loss, which hides the one error a cluster
must never make (two nodes processing one packet).

Here the receiver listens before the sender starts (no handshake), every
datagram carries a 64-bit sequence number, and the receiver counts each
number once: `lost` is what never arrived, `duplicates` what arrived
more than once, `out_of_order` what arrived after a higher number.

    python3 udpflow.py recv BIND_ADDR PORT          (until SIGTERM; prints JSON)
    python3 udpflow.py send DST_ADDR PORT BITS_PER_S LENGTH SECONDS [SRC_ADDR]
"""

import json
import signal
import socket
import struct
import sys
import time

SEQ = struct.Struct("!Q")


def recv(bind, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind((bind, port))
    s.settimeout(0.05)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print("ready", flush=True)
    seen = bytearray()  # one byte per sequence number: times received (capped)
    received = duplicates = out_of_order = short = 0
    highest = -1
    while not stop:
        try:
            data = s.recv(65536)
        except (socket.timeout, InterruptedError):
            continue
        if len(data) < SEQ.size:
            short += 1
            continue
        (n,) = SEQ.unpack_from(data)
        if n > 10_000_000:
            short += 1
            continue
        received += 1
        if n >= len(seen):
            seen.extend(bytes(n + 1 - len(seen)))
        if seen[n]:
            duplicates += 1
        seen[n] = min(seen[n] + 1, 255)
        if n < highest:
            out_of_order += 1
        highest = max(highest, n)
    print(json.dumps({"received": received, "unique": sum(1 for b in seen if b), "duplicates": duplicates,
                      "out_of_order": out_of_order, "highest": highest, "short": short,
                      "missing": [i for i, b in enumerate(seen) if not b][:20]}), flush=True)


def send(dst, port, bits_per_s, length, seconds, src=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if src:
        s.bind((src, 0))
    pps = bits_per_s / (8 * length)
    count = int(pps * seconds)
    payload = bytearray(length)
    start = time.monotonic()
    errors = 0
    for n in range(count):
        due = start + n / pps
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        SEQ.pack_into(payload, 0, n)
        try:
            s.sendto(payload, (dst, port))
        except OSError:
            errors += 1
    print(json.dumps({"sent": count, "send_errors": errors, "seconds": time.monotonic() - start}),
          flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "recv":
        recv(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) in (7, 8) and sys.argv[1] == "send":
        send(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]),
             *sys.argv[7:])
    else:
        sys.exit(__doc__)
