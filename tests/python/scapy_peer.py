"""Gateway B played by Scapy, for test_scapy_peer.py.

Run inside the far namespace (`ip netns exec B python scapy_peer.py`). It
holds one Scapy `SecurityAssociation` per direction, mirrored from espgate's
configuration, and exchanges ESP (in UDP, or raw) with the daemon over real
sockets:

- sending: the whole outer packet Scapy built (IP / [UDP /] ESP) goes out on
  an IPPROTO_RAW socket, byte for byte;
- receiving: a raw socket of the outer protocol (UDP or ESP) gets each
  packet with its IPv4 header; a UDP socket bound to port 4500 makes port
  4500 open, like a real gateway's (its copies are discarded).

It is driven by the test with one JSON object per line on stdin and answers
one JSON object per line on stdout. Commands (`op`):

- `init`: the SA parameters (suite, SPIs, keys, ESN, encap, outer
  addresses, `in_top`: the highest inbound sequence number considered seen,
  as a start for ESN inference);
- `echo`: encrypt an ICMP echo request with the given 64-bit sequence
  number (optionally with one ciphertext byte flipped), send it, wait for
  an ESP packet back and describe it decrypted;
- `resend`: send given wire bytes again (a replay) and report what comes
  back within the time limit;
- `serve`: receive `count` ESP packets from espgate, describe each
  decrypted, answer echo requests with encrypted echo replies;
- `quit`.

Every wait is bounded by the command's `timeout`. Failures to decrypt are
reported (`error`), not raised, so the test can show them.
"""

import json
import os
import select
import socket
import sys
import time

from scapy.all import ICMP, IP, UDP, Raw
from scapy.layers.ipsec import ESP, IPSecIntegrityError, SecurityAssociation

# strongSwan keyword -> (Scapy encryption, Scapy integrity)
SUITES = {
    "aes128gcm16": ("AES-GCM", None),
    "aes256gcm16": ("AES-GCM", None),
    "chacha20poly1305": ("CHACHA20-POLY1305", None),
    "aes128-sha256": ("AES-CBC", "SHA2-256-128"),
    "aes256-sha256": ("AES-CBC", "SHA2-256-128"),
    "aes128-sha1": ("AES-CBC", "HMAC-SHA1-96"),
    "aes256-sha1": ("AES-CBC", "HMAC-SHA1-96"),
}

# Our own ESN inference window (RFC 4303 Appendix A2.2) for what espgate sends.
WINDOW = 64


def infer_seq(top, lo, esn):
    """The 64-bit sequence number for the 32 bits on the wire, given the
    highest one seen so far."""
    if not esn:
        return lo
    th, tl = top >> 32, top & 0xFFFFFFFF
    bottom = (tl - (WINDOW - 1)) & 0xFFFFFFFF
    if tl >= WINDOW - 1:
        hi = th if lo >= bottom else th + 1
    else:
        hi = th - 1 if lo >= bottom else th
    return (hi << 32) | lo


class Peer:
    def __init__(self, p):
        self.p = p
        self.udp = p["encap"] == "udp"
        self.local, self.remote = p["local"], p["remote"]
        crypt, auth = SUITES[p["suite"]]

        def sa(spi, enc, integ, src, dst):
            return SecurityAssociation(
                ESP, spi=spi, crypt_algo=crypt, crypt_key=bytes.fromhex(enc),
                auth_algo=auth, auth_key=bytes.fromhex(integ) if integ else None,
                tunnel_header=IP(src=src, dst=dst),
                nat_t_header=UDP(sport=4500, dport=4500) if self.udp else None,
                esn_en=p["esn"])

        self.out_sa = sa(p["spi_out"], p["enc_out"], p.get("integ_out"), self.local, self.remote)
        self.in_sa = sa(p["spi_in"], p["enc_in"], p.get("integ_in"), self.remote, self.local)
        self.esn = p["esn"]
        self.in_top = p["in_top"]
        self.next_out = 1
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        proto = socket.IPPROTO_UDP if self.udp else socket.IPPROTO_ESP
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_RAW, proto)
        self.port = None
        if self.udp:
            self.port = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.port.bind((self.local, 4500))
            self.port.setblocking(False)
        self.drain()

    def drain(self):
        """Discards whatever is queued (copies on the UDP socket, stale packets)."""
        for s in (self.rx, self.port):
            while s is not None:
                try:
                    s.recv(65535, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break

    # -- sending --------------------------------------------------------

    def encrypt(self, inner, seq):
        """Scapy encrypts `inner` with the 64-bit sequence number `seq`."""
        sa = self.out_sa
        # Set on the SA rather than passed: Scapy treats 0 as "not given".
        sa.seq_num = seq & 0xFFFFFFFF
        sa.esn = seq >> 32
        pkt = sa.encrypt(inner)
        self.next_out = max(self.next_out, seq + 1)
        return bytes(pkt)

    def esp_offset(self, wire):
        return (wire[0] & 0x0F) * 4 + (8 if self.udp else 0)

    def send(self, wire):
        self.tx.sendto(wire, (self.remote, 0))
        if self.port is not None:
            self.drain_port()

    def drain_port(self):
        while True:
            try:
                self.port.recv(65535, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return

    # -- receiving ------------------------------------------------------

    def recv(self, deadline):
        """The next ESP packet from the remote gateway (raw bytes with the
        outer IPv4 header), or None at the deadline."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.rx], [], [], left)
            if not r:
                return None
            data = self.rx.recv(65535)
            if self.port is not None:
                self.drain_port()
            if len(data) < 20 or socket.inet_ntoa(data[12:16]) != self.remote:
                continue
            if self.udp:
                ihl = (data[0] & 0x0F) * 4
                if int.from_bytes(data[ihl + 2:ihl + 4], "big") != 4500:
                    continue
            return data

    def describe(self, data):
        """Decrypts one received packet with the inbound SA and describes
        outer and inner headers."""
        outer = IP(data)
        d = {"outer": {"src": outer.src, "dst": outer.dst, "ttl": outer.ttl, "proto": outer.proto,
                       "tos": outer.tos, "len": len(data)}}
        if self.udp:
            u = outer[UDP]
            d["outer"].update(sport=u.sport, dport=u.dport, udp_chksum=u.chksum)
        if not outer.haslayer(ESP):
            d["error"] = "not ESP: " + outer.summary()
            return d
        esp = outer[ESP]
        seq = infer_seq(self.in_top, esp.seq, self.esn)
        d.update(spi=esp.spi, seq=seq, seq_lo=esp.seq)
        if seq <= 0:
            d["error"] = f"sequence number {esp.seq:#x} is below the window (top {self.in_top:#x})"
            return d
        self.in_sa.esn = seq >> 32
        try:
            inner = self.in_sa.decrypt(outer)
        except IPSecIntegrityError as e:
            d["error"] = f"integrity check failed: {e}"
            return d
        except Exception as e:  # a wrong SPI, bad padding, … : report it
            d["error"] = f"{type(e).__name__}: {e}"
            return d
        self.in_top = max(self.in_top, seq)
        d["inner"] = describe_inner(inner)
        d["inner_obj"] = inner
        return d


def describe_inner(inner):
    i = {"src": inner.src, "dst": inner.dst, "proto": inner.proto, "len": len(bytes(inner)),
         "summary": inner.summary()}
    if inner.haslayer(ICMP):
        c = inner[ICMP]
        i["icmp"] = {"type": c.type, "code": c.code, "id": c.id, "seq": c.seq,
                     "payload": bytes(c.payload).hex()}
    elif inner.haslayer(UDP):
        u = inner[UDP]
        i["udp"] = {"sport": u.sport, "dport": u.dport, "payload": bytes(u.payload).hex()}
    return i


def public(d):
    return {k: v for k, v in d.items() if k != "inner_obj"}


def handle(peer, cmd):
    op = cmd["op"]
    if op == "echo":
        inner = IP(src=cmd["src"], dst=cmd["dst"], ttl=64) / \
            ICMP(type=8, id=cmd["id"], seq=cmd["icmp_seq"]) / Raw(bytes.fromhex(cmd["payload"]))
        inner = IP(bytes(inner))
        wire = bytearray(peer.encrypt(inner, cmd["seq"]))
        if cmd.get("tamper"):
            # One bit of the ciphertext, after the SPI, sequence number and IV.
            at = peer.esp_offset(wire) + 8 + peer.out_sa.crypt_algo.iv_size + 4
            wire[at] ^= 0x01
        peer.send(bytes(wire))
        sent = {"seq": cmd["seq"], "inner_len": len(bytes(inner)), "wire": bytes(wire).hex()}
        got = peer.recv(time.monotonic() + cmd["timeout"])
        return {"sent": sent, "reply": None if got is None else public(peer.describe(got))}
    if op == "resend":
        peer.send(bytes.fromhex(cmd["wire"]))
        got = peer.recv(time.monotonic() + cmd["timeout"])
        return {"reply": None if got is None else public(peer.describe(got))}
    if op == "serve":
        deadline = time.monotonic() + cmd["timeout"]
        seen = []
        while len(seen) < cmd["count"]:
            got = peer.recv(deadline)
            if got is None:
                break
            d = peer.describe(got)
            inner = d.get("inner_obj")
            if inner is not None and inner.haslayer(ICMP) and inner[ICMP].type == 8:
                req = inner[ICMP]
                reply = IP(src=inner.dst, dst=inner.src, ttl=64) / \
                    ICMP(type=0, id=req.id, seq=req.seq) / Raw(bytes(req.payload))
                reply = IP(bytes(reply))
                seq = peer.next_out
                peer.send(peer.encrypt(reply, seq))
                d["replied"] = {"seq": seq, "inner_len": len(bytes(reply))}
            seen.append(public(d))
        return {"seen": seen}
    raise ValueError(f"unknown op {op!r}")


def main():
    peer = None
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "quit":
                out = {"ok": True}
            elif cmd["op"] == "init":
                peer = Peer(cmd)
                out = {"ok": True, "pid": os.getpid()}
            else:
                out = {"ok": True, **handle(peer, cmd)}
        except Exception as e:  # reported to the test, which fails with it
            out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
        if cmd["op"] == "quit":
            return


if __name__ == "__main__":
    main()
