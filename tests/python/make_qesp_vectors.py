"""Writes tests/vectors/qesp.toml: Q-ESP known-answer vectors made with the
reference implementation (qesp_reference.py, written from docs/QESP.md).

    .venv/bin/python tests/python/make_qesp_vectors.py

The Rust tests (espgate-core) and test_qesp.py check espgate and the
reference against the file; regenerate it only when the specification
changes.
"""

from pathlib import Path

from scapy.all import ICMP, IP, TCP, UDP, IPv6, Raw

import qesp_reference as ref


def key(n, seed):
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


V4 = dict(src="10.1.0.10", dst="10.2.0.20", ttl=63, id=1, flags="DF")
V6 = dict(src="2001:db8:1::10", dst="2001:db8:2::20", hlim=63)
CASES = [
    # name, suite, enc bytes, integ bytes, mode, outer, packet, seq, esn, iv
    ("aes128gcm16-tunnel-v4-udp", "aes128gcm16", 20, 0, "tunnel", ("192.0.2.1", "192.0.2.2"),
     IP(**V4) / UDP(sport=4000, dport=5004) / Raw(b"Q-ESP voice frame 01"), 1, False, None),
    ("chacha20poly1305-tunnel-v6-tcp", "chacha20poly1305", 36, 0, "tunnel", ("2001:db8:ff::1", "2001:db8:ff::2"),
     IPv6(**V6) / TCP(sport=40000, dport=443, flags="S", seq=1000), 5, False, None),
    ("aes256gcm16-transport-v4-icmp-esn", "aes256gcm16", 36, 0, "transport", None,
     IP(**V4) / ICMP(id=7, seq=1) / Raw(b"ping"), (1 << 32) + 2, True, None),
    ("aes128-sha1-tunnel-v4-udp", "aes128-sha1", 16, 20, "tunnel", ("192.0.2.1", "192.0.2.2"),
     IP(**V4) / UDP(sport=5060, dport=5060) / Raw(b"INVITE"), 7, False, bytes(range(16))),
    ("aes256-sha256-transport-v6-udp", "aes256-sha256", 32, 32, "transport", None,
     IPv6(**V6) / UDP(sport=1234, dport=53) / Raw(b"\x12\x34" * 9), 3, False, bytes(range(16, 32))),
    ("aes128-sha1-tunnel-v6-in-v4-esn", "aes128-sha1", 16, 20, "tunnel", ("192.0.2.1", "192.0.2.2"),
     IPv6(**V6) / UDP(sport=4000, dport=5004) / Raw(b"x" * 40), (3 << 32) + 9, True, bytes(range(32, 48))),
]


def main():
    out = ["# Q-ESP known-answer vectors (docs/QESP.md §11), made by", "# tests/python/make_qesp_vectors.py",
           "# with the reference implementation. `qesp` is the Q-ESP part of the", "# packet: header to ICV.", ""]
    for name, suite, en, il, mode, outer, pkt, seq, esn, iv in CASES:
        pkt = bytes(pkt.__class__(bytes(pkt)))
        ek, ik = key(en, 1), key(il, 2)
        src, dst = outer or ("", "")
        sa = ref.Sa(spi=0x1000_0001, suite=suite, enc_key=ek, integ_key=ik, mode=mode, src=src, dst=dst, esn=esn)
        if iv is None:
            iv = seq.to_bytes(8, "big")
        wire = ref.encrypt(sa, pkt, seq, iv=iv)
        hl = 20 if wire[0] >> 4 == 4 else 40
        assert ref.decrypt(sa, wire, seq_hi=seq >> 32) == pkt
        out += ["[[vector]]", f'name = "{name}"', f'suite = "{suite}"', f"spi = {sa.spi:#x}",
                f'enc_key = "{ek.hex()}"']
        if ik:
            out.append(f'integ_key = "{ik.hex()}"')
        out.append(f'mode = "{mode}"')
        if outer:
            out += [f'outer_src = "{src}"', f'outer_dst = "{dst}"']
        out += [f"seq = {seq:#x}", f"esn = {'true' if esn else 'false'}", f'iv = "{iv.hex()}"',
                f'packet = "{pkt.hex()}"', f'qesp = "{wire[hl:].hex()}"', ""]
    path = Path(__file__).resolve().parents[1] / "vectors" / "qesp.toml"
    path.write_text("\n".join(out))
    print(f"wrote {path} ({len(CASES)} vectors)")


if __name__ == "__main__":
    main()
