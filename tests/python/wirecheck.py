"""wirecheck: the ESP packets of a capture, and the checks that no
sequence number or AEAD IV was sent twice under one SPI (issue 16, "Fault
injection": nonce uniqueness across crashes).

`esp_packets(path)` reads a classic pcap file (as `tcpdump -w` writes it;
Ethernet, Linux cooked v1/v2 or raw IP link types, any snap length of at
least the headers plus 16 bytes) without Scapy, which would take seconds
per hundred thousand packets. It returns one `Esp` per ESP packet on the
wire, raw (IP protocol 50) or UDP-encapsulated (RFC 3948: UDP port 4500,
and whatever ports the caller names); within UDP it skips NAT-T
keepalives (the single byte 0xff) and IKE (the four zero bytes of the
non-ESP marker). IPv4 and IPv6 (without extension headers) outside; IPv4
fragments other than the first carry no header and are skipped.

`Esp.iv` is the 8 bytes that follow the ESP header: the explicit IV of
AES-GCM, ChaCha20-Poly1305 and GMAC (RFC 4106, 7634, 4543). It means
nothing for other suites.

`Capture.oversize` counts IP packets longer than `mtu`: a GSO batch seen
before segmentation would hide the ESP headers inside it, so a check that
wants every packet asserts it is 0 (set `gso_max_segs 1` on the capturing
link: the kernel then cuts batches before its packet taps see them).
"""

import collections
import struct

ETHERNET, RAW, LINUX_SLL, LINUX_SLL2 = 1, 101, 113, 276
ESP_PROTO, UDP_PROTO = 50, 17

Esp = collections.namedtuple("Esp", "ts src dst spi seq iv length")


class Capture:
    def __init__(self):
        self.packets = []       # Esp, in capture order
        self.frames = 0         # every frame in the file
        self.ike = 0            # UDP datagrams with the non-ESP marker
        self.keepalives = 0     # NAT-T keepalives
        self.oversize = 0       # IP packets longer than the MTU given
        self.truncated = 0      # ESP packets cut before the end of the IV


def _ip(data, off):
    """(src, dst, protocol, payload offset, total length, first fragment)
    of the IP packet at `off`, or None."""
    if len(data) < off + 20:
        return None
    v = data[off] >> 4
    if v == 4:
        ihl = (data[off] & 0x0F) * 4
        total = struct.unpack_from("!H", data, off + 2)[0]
        frag = struct.unpack_from("!H", data, off + 6)[0]
        src = ".".join(str(b) for b in data[off + 12:off + 16])
        dst = ".".join(str(b) for b in data[off + 16:off + 20])
        return src, dst, data[off + 9], off + ihl, total, (frag & 0x1FFF) == 0
    if v == 6 and len(data) >= off + 40:
        total = 40 + struct.unpack_from("!H", data, off + 4)[0]
        src = data[off + 8:off + 24].hex()
        dst = data[off + 24:off + 40].hex()
        return src, dst, data[off + 6], off + 40, total, True
    return None


def esp_packets(path, udp_ports=(4500,), mtu=1500):
    """Every ESP packet in the pcap file `path` (see the module's text)."""
    cap = Capture()
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 24:
        return cap
    magic = buf[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        end = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        end = ">"
    else:
        raise ValueError(f"{path}: not a classic pcap file (pcapng is not read here)")
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    linktype = struct.unpack_from(end + "I", buf, 20)[0] & 0x0FFFFFFF
    rec = struct.Struct(end + "IIII")
    div = 1e9 if nano else 1e6
    off = 24
    while off + 16 <= len(buf):
        sec, frac, incl, _orig = rec.unpack_from(buf, off)
        off += 16
        data = buf[off:off + incl]
        off += incl
        cap.frames += 1
        ts = sec + frac / div
        if linktype == ETHERNET:
            if len(data) < 14:
                continue
            l3, ethertype = 14, struct.unpack_from("!H", data, 12)[0]
            while ethertype in (0x8100, 0x88A8) and len(data) >= l3 + 4:
                ethertype = struct.unpack_from("!H", data, l3 + 2)[0]
                l3 += 4
            if ethertype not in (0x0800, 0x86DD):
                continue
        elif linktype == LINUX_SLL:
            l3 = 16
        elif linktype == LINUX_SLL2:
            l3 = 20
        elif linktype == RAW:
            l3 = 0
        else:
            raise ValueError(f"{path}: link type {linktype} is not read here")
        ip = _ip(data, l3)
        if ip is None:
            continue
        src, dst, proto, l4, total, first = ip
        if total > mtu:
            cap.oversize += 1
        if not first:
            continue
        if proto == ESP_PROTO:
            esp = l4
        elif proto == UDP_PROTO and len(data) >= l4 + 8:
            sport, dport, ulen = struct.unpack_from("!HHH", data, l4)
            if sport not in udp_ports and dport not in udp_ports:
                continue
            esp = l4 + 8
            if ulen == 9 and len(data) > esp and data[esp] == 0xFF:
                cap.keepalives += 1
                continue
            if data[esp:esp + 4] == b"\0\0\0\0":
                cap.ike += 1
                continue
        else:
            continue
        if len(data) < esp + 16:
            cap.truncated += 1
            continue
        spi, seq = struct.unpack_from("!II", data, esp)
        cap.packets.append(Esp(ts, src, dst, spi, seq, bytes(data[esp + 8:esp + 16]), total))
    return cap


def duplicates(packets, key):
    """{key value: count} for every value of `key(packet)` seen more than once."""
    seen = collections.Counter(key(p) for p in packets)
    return {k: n for k, n in seen.items() if n > 1}


def seq_duplicates(packets):
    """(destination, SPI, sequence number) sent more than once."""
    return duplicates(packets, lambda p: (p.dst, p.spi, p.seq))


def iv_duplicates(packets):
    """(destination, SPI, IV) sent more than once: a nonce reused under one
    key, for an AEAD suite."""
    return duplicates(packets, lambda p: (p.dst, p.spi, p.iv))


def by_sa(packets):
    """{(src, dst, SPI): [Esp, …]} in capture order."""
    out = collections.defaultdict(list)
    for p in packets:
        out[(p.src, p.dst, p.spi)].append(p)
    return dict(out)


def epochs_go_up(packets, cuts):
    """For one SA's packets and the times `cuts` (sorted) at which its
    sender was down: a list of (cut, highest before, lowest after) for
    every cut where the numbers sent after it are not all above every
    number sent before it. Empty when each restart continued above."""
    bad = []
    for t in cuts:
        before = [p.seq for p in packets if p.ts < t]
        after = [p.seq for p in packets if p.ts >= t]
        if before and after and min(after) <= max(before):
            bad.append((t, max(before), min(after)))
    return bad
