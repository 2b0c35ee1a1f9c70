"""A second Q-ESP implementation, written from docs/QESP.md (not from the
Rust code), to check espgate against.

Plain bytes in, bytes out; `cryptography` for the primitives. It handles
IPv4 packets without options and IPv6 packets without extension headers
(what the tests send), tunnel and transport mode, ESN, and the suites
aes128gcm16, aes256gcm16, chacha20poly1305, and AES-CBC or 3DES with
HMAC-SHA1-96 / HMAC-SHA2-256-128 / -384-192 / -512-256. It keeps no replay
state: each packet is checked on its own.
"""

import hashlib
import hmac
import ipaddress
import os
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

try:  # cryptography >= 43 keeps 3DES among the "decrepit" algorithms
    from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
except ImportError:  # pragma: no cover
    TripleDES = algorithms.TripleDES

PROTO = 253  # §1: the default IP protocol number
HEADER_LEN = 16  # §2
PORTED = {6, 17, 33, 132, 136}  # §3: TCP, UDP, DCCP, SCTP, UDP-Lite
V6_EXT = {0, 43, 60, 135}  # §3: skipped with (len + 1) * 8 bytes
V6_FRAG = 44

MACS = {  # name: (hash, ICV bytes)   §2
    "sha1": (hashlib.sha1, 12),
    "sha256": (hashlib.sha256, 16),
    "sha384": (hashlib.sha384, 24),
    "sha512": (hashlib.sha512, 32),
}


class QespError(Exception):
    """A packet the receiver must drop; `reason` names the counter (§6)."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Sa:
    spi: int
    suite: str  # e.g. "aes128gcm16", "aes128-sha1"
    enc_key: bytes  # with the 4-byte salt at the end for AEAD suites
    integ_key: bytes = b""
    mode: str = "tunnel"  # or "transport"
    src: str = ""  # tunnel mode: outer source
    dst: str = ""  # tunnel mode: outer destination
    esn: bool = False
    proto: int = PROTO

    @property
    def aead(self):
        return self.suite in ("aes128gcm16", "aes256gcm16", "chacha20poly1305")

    @property
    def enc(self):
        return self.suite.split("-")[0]

    @property
    def integ(self):
        return None if self.aead else self.suite.split("-")[1]

    def iv_len(self):
        if self.aead:
            return 8
        return 8 if self.enc == "3des" else 16

    def align(self):
        """§2, Padding: whole AES blocks for AES-GCM, 4 bytes for
        ChaCha20-Poly1305, the cipher's block for CBC."""
        if self.suite in ("aes128gcm16", "aes256gcm16"):
            return 16
        if self.aead:
            return 4
        return 8 if self.enc == "3des" else 16

    def icv_len(self):
        return 16 if self.aead else MACS[self.integ][1]


# ── IP helpers ─────────────────────────────────────────────────────────────


def ip_checksum(h):
    if len(h) % 2:
        h += b"\0"
    s = sum(struct.unpack(f"!{len(h) // 2}H", h))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ipv4_header(src, dst, proto, payload_len, tos=0, ttl=64, ident=0):
    h = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, tos, 20 + payload_len, ident, 0x4000,
                              ttl, proto, 0, ipaddress.IPv4Address(src).packed,
                              ipaddress.IPv4Address(dst).packed))
    struct.pack_into("!H", h, 10, ip_checksum(bytes(h)))
    return bytes(h)


def ipv6_header(src, dst, nh, payload_len, tclass=0, hop=64):
    first = (6 << 28) | (tclass << 20)
    return struct.pack("!IHBB16s16s", first, payload_len, nh, hop,
                       ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(dst).packed)


def parse_ip(pkt):
    """(version, header length, protocol, src bytes, dst bytes, tos)."""
    v = pkt[0] >> 4
    if v == 4:
        ihl = (pkt[0] & 0xF) * 4
        return 4, ihl, pkt[9], pkt[12:16], pkt[16:20], pkt[1]
    if v == 6:
        tclass = ((pkt[0] & 0xF) << 4) | (pkt[1] >> 4)
        return 6, 40, pkt[6], pkt[8:24], pkt[24:40], tclass
    raise QespError("bad_ip_version")


def clear_fields(pkt):
    """§3: (source port, destination port, TLP) of an IP packet."""
    v = pkt[0] >> 4
    later = False
    if v == 4:
        ihl = (pkt[0] & 0xF) * 4
        total = struct.unpack("!H", pkt[2:4])[0]
        later = (struct.unpack("!H", pkt[6:8])[0] & 0x1FFF) != 0
        tlp, off, end = pkt[9], ihl, total
    else:
        end = 40 + struct.unpack("!H", pkt[4:6])[0]
        tlp, off = pkt[6], 40
        for _ in range(16):
            if tlp in V6_EXT:
                nxt, ln = pkt[off], (pkt[off + 1] + 1) * 8
            elif tlp == V6_FRAG:
                nxt, ln = pkt[off], 8
                if struct.unpack("!H", pkt[off + 2:off + 4])[0] & 0xFFF8:
                    later = True
            else:
                break
            tlp, off = nxt, off + ln
            if later:
                break
    l4 = pkt[off:end]
    if not later and tlp in PORTED and len(l4) >= 4:
        sport, dport = struct.unpack("!HH", l4[:4])
        return sport, dport, tlp
    return 0, 0, tlp


# ── the transform (§4) ─────────────────────────────────────────────────────


def addresses(outer_src, outer_dst):
    """A = outer source | outer destination, as bytes."""
    return bytes(outer_src) + bytes(outer_dst)


def seal(sa, header, plaintext, seq, a, iv=None):
    """IV | ciphertext | ICV for the body `plaintext` (padded already)."""
    hi = struct.pack("!I", seq >> 32) if sa.esn else b""
    if sa.aead:
        iv = struct.pack("!Q", seq) if iv is None else iv
        key, salt = sa.enc_key[:-4], sa.enc_key[-4:]
        aead = ChaCha20Poly1305(key) if sa.suite == "chacha20poly1305" else AESGCM(key)
        return iv + aead.encrypt(salt + iv, plaintext, a + header + hi)
    iv = os.urandom(sa.iv_len()) if iv is None else iv
    algo = TripleDES(sa.enc_key) if sa.enc == "3des" else algorithms.AES(sa.enc_key)
    e = Cipher(algo, modes.CBC(iv)).encryptor()
    ct = e.update(plaintext) + e.finalize()
    h, n = MACS[sa.integ]
    icv = hmac.new(sa.integ_key, a + header + iv + ct + hi, h).digest()[:n]
    return iv + ct + icv


def open_(sa, header, body, seq, a):
    """Checks the ICV of `body` = IV | ciphertext | ICV; the plaintext."""
    hi = struct.pack("!I", seq >> 32) if sa.esn else b""
    ivl, icvl = sa.iv_len(), sa.icv_len()
    if len(body) < ivl + 2 + icvl:
        raise QespError("bad_length")
    iv = body[:ivl]
    if sa.aead:
        key, salt = sa.enc_key[:-4], sa.enc_key[-4:]
        aead = ChaCha20Poly1305(key) if sa.suite == "chacha20poly1305" else AESGCM(key)
        try:
            return aead.decrypt(salt + iv, body[ivl:], a + header + hi)
        except Exception:
            raise QespError("icv_failure") from None
    ct, icv = body[ivl:-icvl], body[-icvl:]
    h, n = MACS[sa.integ]
    want = hmac.new(sa.integ_key, a + header + iv + ct + hi, h).digest()[:n]
    if not hmac.compare_digest(want, icv):
        raise QespError("icv_failure")
    if len(ct) % sa.align():
        raise QespError("bad_ciphertext_length")
    algo = TripleDES(sa.enc_key) if sa.enc == "3des" else algorithms.AES(sa.enc_key)
    d = Cipher(algo, modes.CBC(iv)).decryptor()
    return d.update(ct) + d.finalize()


def pad(payload, next_header, align):
    """§2: payload | 1, 2, 3, … | pad length | next header."""
    n = (-(len(payload) + 2)) % align
    return payload + bytes(range(1, n + 1)) + bytes([n, next_header])


def unpad(plain):
    n, nh = plain[-2], plain[-1]
    if n + 2 > len(plain) or plain[-2 - n:-2] != bytes(range(1, n + 1)):
        raise QespError("bad_padding")
    return plain[:-2 - n], nh


def header(clear, spi, seq):
    sport, dport, tlp = clear
    return struct.pack("!HHB3sII", sport, dport, tlp, b"\0\0\0", spi, seq & 0xFFFFFFFF)


# ── packets (§5, §6) ───────────────────────────────────────────────────────


def qesp_bytes(sa, pkt, seq, a, iv=None, clear=None):
    """The Q-ESP part (header to ICV) protecting the IP packet `pkt`."""
    clear = clear_fields(pkt) if clear is None else clear
    if sa.mode == "tunnel":
        body, nh = pkt, 4 if pkt[0] >> 4 == 4 else 41
    else:
        _, hl, nh, _, _, _ = parse_ip(pkt)
        body = pkt[hl:]
    h = header(clear, sa.spi, seq)
    return h + seal(sa, h, pad(body, nh, sa.align()), seq, a, iv)


def encrypt(sa, pkt, seq, iv=None, clear=None):
    """The outer packet carrying `pkt` (`clear`: lie about the ports)."""
    if sa.mode == "tunnel":
        v6 = ":" in sa.src
        packed = (ipaddress.ip_address(sa.src).packed, ipaddress.ip_address(sa.dst).packed)
        q = qesp_bytes(sa, pkt, seq, addresses(*packed), iv, clear)
        tos = parse_ip(pkt)[5]
        if v6:
            return ipv6_header(sa.src, sa.dst, sa.proto, len(q), tclass=tos) + q
        return ipv4_header(sa.src, sa.dst, sa.proto, len(q), tos=tos) + q
    v, hl, _, s, d, tos = parse_ip(pkt)
    q = qesp_bytes(sa, pkt, seq, addresses(s, d), iv, clear)
    if v == 4:
        h = bytearray(pkt[:hl])
        h[9] = sa.proto
        struct.pack_into("!H", h, 2, hl + len(q))
        struct.pack_into("!H", h, 10, 0)
        struct.pack_into("!H", h, 10, ip_checksum(bytes(h)))
        return bytes(h) + q
    h = bytearray(pkt[:40])
    h[6] = sa.proto
    struct.pack_into("!H", h, 4, len(q))
    return bytes(h) + q


def full_seq(sa, lo, hint_hi=0):
    return (hint_hi << 32) | lo if sa.esn else lo


def decrypt(sa, wire, seq_hi=0):
    """§6 without the replay window: the restored IP packet, or QespError."""
    v, hl, proto, s, d, tos = parse_ip(wire)
    if proto != sa.proto:
        raise QespError("not_ipsec")
    q = wire[hl:]
    if len(q) < HEADER_LEN:
        raise QespError("bad_length")
    h = q[:HEADER_LEN]
    spi, lo = struct.unpack("!II", h[8:16])
    if spi != sa.spi:
        raise QespError("unknown_spi")
    seq = full_seq(sa, lo, seq_hi)
    plain = open_(sa, h, q[HEADER_LEN:], seq, addresses(s, d))
    body, nh = unpad(plain)
    if sa.mode == "tunnel":
        if nh not in (4, 41):
            raise QespError("bad_next_header")
        out = body
    elif v == 4:
        hdr = bytearray(wire[:hl])
        hdr[9] = nh
        struct.pack_into("!H", hdr, 2, hl + len(body))
        struct.pack_into("!H", hdr, 10, 0)
        struct.pack_into("!H", hdr, 10, ip_checksum(bytes(hdr)))
        out = bytes(hdr) + body
    else:
        hdr = bytearray(wire[:40])
        hdr[6] = nh
        struct.pack_into("!H", hdr, 4, len(body))
        out = bytes(hdr) + body
    sport, dport, tlp = struct.unpack("!HHB", h[:5])
    if clear_fields(out) != (sport, dport, tlp):
        raise QespError("qesp_port_mismatch")
    return out
