"""Scapy as the live remote peer of the espgate daemon.

One `espgate up` in namespace A; namespace B has no espgate, only a Python
process (`scapy_peer.py`) whose Scapy `SecurityAssociation`s, one per
direction, mirror A's SPIs and keys. They exchange real packets, both ways:

    10.1.0.1 (tunA) espgate 192.0.2.1 --- veth --- 192.0.2.2 Scapy (10.2.0.0/24 behind it)

- Scapy -> espgate: Scapy encrypts an ICMP echo request 10.2.0.5 -> 10.1.0.1
  and sends it to A; espgate decrypts it, A's kernel answers, espgate
  encrypts the reply, Scapy decrypts it and checks every field.
- espgate -> Scapy: `ping -I 10.1.0.1 10.2.0.7` and a UDP datagram in A;
  Scapy decrypts them, checks them, and answers the pings (encrypted by
  Scapy), so the ping in A succeeds.

For AES-GCM (128, 256), ChaCha20-Poly1305, AES-CBC with HMAC-SHA2-256 and
HMAC-SHA1, ESP in UDP and raw ESP, with and without ESN. The ESN cases
cross 2^32 in both directions: espgate's outbound SA starts at 2^32 - 3
(its sequence state file, `gateway.state_dir`, rewritten between a clean
stop and a restart), Scapy's jumps forward to 2^31 and then 2^32 - 3.
Afterwards `espgate status --json` must count exactly the packets and bytes
exchanged with no drop; then a tampered and a replayed packet from Scapy
are counted as `icv_failure` and `replay`, and the next good packet (the
tampered one's sequence number) still gets an answer.

Namespaces are unique per test and deleted by the `lab` fixture, with the
daemon and the Scapy process, even on failure; every wait is bounded.
"""

import json
import os
import pathlib
import re
import secrets
import select
import shutil
import subprocess
import sys
import time

import pytest

from test_gateway import PING, Daemon, lab, run  # noqa: F401  (lab is a fixture)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun") or PING is None,
    reason="needs root, iproute2, ping and /dev/net/tun (scripts/setup.sh installs them)")

PEER = pathlib.Path(__file__).with_name("scapy_peer.py")

# Key lengths in bytes: (encryption incl. the 4-byte AEAD salt, integrity).
KEYS = {"aes128gcm16": (20, 0), "aes256gcm16": (36, 0), "chacha20poly1305": (36, 0),
        "aes128-sha256": (16, 32), "aes256-sha1": (32, 20)}

A_OUT, A_IN = "192.0.2.1", "192.0.2.2"
SPI_A_IN, SPI_A_OUT = 0x5C0A1001, 0x5C0A1002   # Scapy sends on A's spi_in
WRAP = 1 << 32

CASES = {
    # name: (suite, encap, esn)
    "udp-aes128gcm16": ("aes128gcm16", "udp", False),
    "udp-aes256gcm16-esn": ("aes256gcm16", "udp", True),
    "udp-chacha20poly1305-esn": ("chacha20poly1305", "udp", True),
    "udp-aes128-sha256": ("aes128-sha256", "udp", False),
    "udp-aes128-sha256-esn": ("aes128-sha256", "udp", True),
    "udp-aes256-sha1": ("aes256-sha1", "udp", False),
    "raw-aes256gcm16-esn": ("aes256gcm16", "none", True),
    "raw-aes256-sha1": ("aes256-sha1", "none", False),
}


class ScapyPeer:
    """The Scapy process in namespace B, driven over its stdin/stdout."""

    def __init__(self, lab, ns):
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, str(PEER)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        lab.procs.append(self.proc)
        self.buf = b""

    def call(self, **cmd):
        """Sends one command; its answer must come within its own `timeout`
        (the peer's waits) plus 20 s."""
        wait = cmd.get("timeout", 0) + 20
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + wait
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            r, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            if not r:
                pytest.fail(f"scapy peer did not answer {cmd['op']} within {wait} s")
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                self.proc.wait(timeout=10)
                pytest.fail(f"scapy peer exited ({self.proc.returncode}): {self.proc.stderr.read().decode()}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        out = json.loads(line)
        assert out["ok"], f"scapy peer failed on {cmd['op']}: {out['error']}"
        return out

    def quit(self):
        self.call(op="quit")
        assert self.proc.wait(timeout=10) == 0


def a_config(lab, suite, encap, esn):
    """Namespaces A and B and gateway A's configuration; returns (daemon A,
    namespace B, the keys as B sees them)."""
    a_ns, b_ns, _, _ = lab.pair()
    d = lab.tmp / "A"
    d.mkdir()
    enc_len, integ_len = KEYS[suite]
    # "ab": what A sends (Scapy receives), "ba": what Scapy sends.
    k = {f"{kind}_{way}": secrets.token_hex(n) if n else None
         for kind, n in (("enc", enc_len), ("integ", integ_len)) for way in ("ab", "ba")}
    sa = [f'suite = "{suite}"', f"spi_in = {SPI_A_IN:#x}", f"spi_out = {SPI_A_OUT:#x}",
          f'enc_in = "{k["enc_ba"]}"', f'enc_out = "{k["enc_ab"]}"']
    if integ_len:
        sa += [f'integ_in = "{k["integ_ba"]}"', f'integ_out = "{k["integ_ab"]}"']
    text = f"""[gateway]
tun = "tunA"
tun_address = ["10.1.0.1/24"]
listen = "0.0.0.0:4500"
control_socket = "ctl.sock"
state_dir = "state"
log = "debug"

[[connection]]
name = "scapy"
local = "{A_OUT}"
remote = "{A_IN}"
encap = "{encap}"
local_ts = ["10.1.0.0/24"]
remote_ts = ["10.2.0.0/24"]
esn = {"true" if esn else "false"}

[connection.esp]
""" + "\n".join(sa) + "\n"
    cfg = d / "gw.toml"
    cfg.write_text(text)
    cfg.chmod(0o600)
    b_keys = {"enc_out": k["enc_ba"], "integ_out": k["integ_ba"], "enc_in": k["enc_ab"], "integ_in": k["integ_ab"]}
    return Daemon(lab, a_ns, cfg, d / "ctl.sock", d / "log"), b_ns, b_keys


def start_at(a, first_seq):
    """Starts A so that its outbound SA numbers from `first_seq`: a first
    start creates the sequence state file, a clean stop writes the exact next
    number into it, and that number is replaced before the second start."""
    if first_seq != 1:
        a.start()
        assert a.stop() == 0, a.log_text()
        state = a.cfg.parent / "state"
        files = [f for f in state.iterdir() if re.fullmatch(r"seq-[0-9a-f]+", f.name)]
        assert len(files) == 1, sorted(f.name for f in state.iterdir())
        text = files[0].read_text()
        assert re.search(r"^reserved = 1$", text, re.M), text
        files[0].write_text(re.sub(r"^reserved = 1$", f"reserved = {first_seq}", text, flags=re.M))
    a.start()
    out = a.sas("out")
    assert len(out) == 1 and out[0]["next_seq"] == first_seq, out
    return a


def check_reply(rep, *, spi, seq, encap, src, dst, icmp_type, icmp_id, icmp_seq, payload=None):
    """One ESP packet from espgate, as Scapy decrypted it."""
    assert rep is not None, "nothing came back from espgate"
    assert "error" not in rep, rep
    o = rep["outer"]
    assert (o["src"], o["dst"], o["ttl"]) == (A_OUT, A_IN, 64), rep
    if encap == "udp":
        assert (o["proto"], o["sport"], o["dport"]) == (17, 4500, 4500), rep
    else:
        assert o["proto"] == 50, rep
    assert (rep["spi"], rep["seq"]) == (spi, seq), rep
    i = rep["inner"]
    assert (i["src"], i["dst"], i["proto"]) == (src, dst, 1), rep
    c = i["icmp"]
    assert (c["type"], c["code"], c["id"], c["seq"]) == (icmp_type, 0, icmp_id, icmp_seq), rep
    if payload is not None:
        assert c["payload"] == payload, rep


@pytest.mark.parametrize("case", list(CASES))
def test_scapy_is_the_remote_gateway(lab, case):
    suite, encap, esn = CASES[case]
    a, b_ns, keys = a_config(lab, suite, encap, esn)
    a_first = WRAP - 3 if esn else 1
    start_at(a, a_first)
    peer = ScapyPeer(lab, b_ns)
    peer.call(op="init", suite=suite, encap=encap, esn=esn, local=A_IN, remote=A_OUT,
              spi_out=SPI_A_IN, spi_in=SPI_A_OUT, in_top=a_first - 1, **keys)

    a_next = a_first           # espgate's next outbound sequence number
    in_pkts = in_bytes = 0     # what espgate's inbound SA should count
    out_pkts = out_bytes = 0   # and its outbound SA
    sent_by_scapy = 0

    # 1. Scapy -> espgate -> A's kernel -> espgate -> Scapy. With ESN,
    # Scapy's numbers jump (a window accepts any number ahead) to cross 2^32.
    if esn:
        seqs = [1, 2, 3, 1 << 31, WRAP - 3, WRAP - 2, WRAP - 1, WRAP, WRAP + 1, WRAP + 2]
    else:
        seqs = [1, 2, 3, 4, 5, 6]
    last_good = None
    for n, seq in enumerate(seqs, 1):
        payload = secrets.token_hex(24 + 8 * n)
        r = peer.call(op="echo", seq=seq, src="10.2.0.5", dst="10.1.0.1", id=0x4242, icmp_seq=n,
                      payload=payload, timeout=5)
        sent_by_scapy += 1
        check_reply(r["reply"], spi=SPI_A_OUT, seq=a_next, encap=encap, src="10.1.0.1", dst="10.2.0.5",
                    icmp_type=0, icmp_id=0x4242, icmp_seq=n, payload=payload)
        in_pkts += 1
        in_bytes += r["sent"]["inner_len"]
        out_pkts += 1
        out_bytes += r["reply"]["inner"]["len"]
        assert r["reply"]["inner"]["len"] == r["sent"]["inner_len"]
        a_next += 1
        last_good = r["sent"]
    scapy_next = seqs[-1] + 1

    # 2. espgate -> Scapy, from A: three pings Scapy answers, one UDP datagram.
    udp_payload = secrets.token_bytes(100)
    ping = subprocess.Popen(["ip", "netns", "exec", a.ns, PING, "-c", "3", "-i", "0.3", "-W", "3", "-p", "5ca9",
                             "-I", "10.1.0.1", "10.2.0.7"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lab.procs.append(ping)
    try:
        served = peer.call(op="serve", count=3, timeout=15)["seen"]
    finally:
        ping_out, _ = ping.communicate(timeout=20)
    assert ping.returncode == 0, f"{ping_out}\n{served}\n{a.log_text()}"
    run("ip", "netns", "exec", a.ns, sys.executable, "-c",
        "import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('10.1.0.1', 40001)); "
        "s.sendto(bytes.fromhex(sys.argv[1]), ('10.2.0.7', 7777))", udp_payload.hex())
    served += peer.call(op="serve", count=1, timeout=10)["seen"]
    assert len(served) == 4, served
    ids = set()
    for k, got in enumerate(served[:3], 1):
        check_reply(got, spi=SPI_A_OUT, seq=a_next, encap=encap, src="10.1.0.1", dst="10.2.0.7",
                    icmp_type=8, icmp_id=got["inner"]["icmp"]["id"], icmp_seq=k)
        assert bytes.fromhex(got["inner"]["icmp"]["payload"]).endswith(b"\x5c\xa9" * 8), got
        ids.add(got["inner"]["icmp"]["id"])
        assert got["replied"]["seq"] == scapy_next, got
        a_next += 1
        scapy_next += 1
        out_pkts += 1
        out_bytes += got["inner"]["len"]
        in_pkts += 1
        in_bytes += got["replied"]["inner_len"]
        sent_by_scapy += 1
    assert len(ids) == 1
    got = served[3]
    assert "error" not in got, got
    assert got["seq"] == a_next and got["spi"] == SPI_A_OUT, got
    assert (got["inner"]["src"], got["inner"]["dst"], got["inner"]["proto"]) == ("10.1.0.1", "10.2.0.7", 17), got
    assert got["inner"]["udp"] == {"sport": 40001, "dport": 7777, "payload": udp_payload.hex()}, got
    a_next += 1
    out_pkts += 1
    out_bytes += got["inner"]["len"]

    # 3. espgate counted exactly that, and dropped nothing.
    st = a.status()
    sas = {sa["direction"]: sa for c in st["connections"] for sa in c["sas"]}
    assert sas["in"]["spi"] == f"{SPI_A_IN:#010x}" and sas["out"]["spi"] == f"{SPI_A_OUT:#010x}", sas
    for sa in sas.values():
        assert (sa["suite"], sa["encap"], sa["esn"], sa["drops"]) == \
            (suite, "udp" if encap == "udp" else "none", esn, {}), sa
    assert (sas["in"]["packets"], sas["in"]["bytes"]) == (in_pkts, in_bytes), sas["in"]
    assert (sas["out"]["packets"], sas["out"]["bytes"]) == (out_pkts, out_bytes), sas["out"]
    assert sas["in"]["highest_seq"] == scapy_next - 1, sas["in"]
    assert sas["out"]["next_seq"] == a_next, sas["out"]
    assert st["drops"] == {}, st["drops"]
    assert (st["counters"]["net_rx"], st["counters"]["net_tx"], st["counters"]["tun_tx"]) == \
        (sent_by_scapy, out_pkts, in_pkts), st["counters"]

    # 4. A tampered packet (one ciphertext bit) and a replayed one are
    # dropped and counted; the tampered packet's number is still usable.
    r = peer.call(op="echo", seq=scapy_next, src="10.2.0.5", dst="10.1.0.1", id=0x4343, icmp_seq=1,
                  payload="ee" * 40, tamper=True, timeout=1.5)
    assert r["reply"] is None, r
    r = peer.call(op="resend", wire=last_good["wire"], timeout=1.5)
    assert r["reply"] is None, r
    want = {"icv_failure": 1, "replay": 1}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        st = a.status()
        if st["drops"] == want:
            break
        time.sleep(0.1)
    assert st["drops"] == want, st["drops"]
    assert a.sas("in")[0]["drops"] == want
    payload = secrets.token_hex(32)
    r = peer.call(op="echo", seq=scapy_next, src="10.2.0.5", dst="10.1.0.1", id=0x4343, icmp_seq=2,
                  payload=payload, timeout=5)
    check_reply(r["reply"], spi=SPI_A_OUT, seq=a_next, encap=encap, src="10.1.0.1", dst="10.2.0.5",
                icmp_type=0, icmp_id=0x4343, icmp_seq=2, payload=payload)
    st = a.status()
    sas = {sa["direction"]: sa for c in st["connections"] for sa in c["sas"]}
    assert sas["in"]["packets"] == in_pkts + 1 and sas["in"]["highest_seq"] == scapy_next, sas["in"]
    assert sas["out"]["packets"] == out_pkts + 1 and sas["out"]["next_seq"] == a_next + 1, sas["out"]
    assert st["counters"]["net_rx"] == sent_by_scapy + 3, st["counters"]
    log = a.log_text()
    assert "dropped (icv_failure)" in log and "dropped (replay)" in log, log

    peer.quit()
    assert a.stop() == 0, a.log_text()
