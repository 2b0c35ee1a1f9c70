#!/usr/bin/env python3
"""IKEv2 test vectors built with Scapy's `scapy.contrib.ikev2` (not ours).

Each vector is written as `<name>.json` with the message as hex and a flat
description of the fields Scapy was told to set, keyed the way the Rust test
`crates/espgate-ike/tests/ike_vectors.rs` flattens a parsed `Message`:

    header.spi_i, header.exchange_type, header.initiator, header.message_id…
    payload.N.type, payload.N.critical
    payload.N.proposal.P.{number,protocol,spi,transform_count}
    payload.N.proposal.P.transform.T.{type,id,key_length}
    payload.N.{group,data,id_type,method,encoding,notify_type,spi,protocol}
    payload.N.ts.K.{type,ip_protocol,start_port,end_port,start,end}
    payload.N.spi.K (Delete), payload.N.{first_payload,number,total} (SK/SKF)

Values are integers, lowercase hex for bytes, or address strings. The output
is deterministic (no randomness), so `test_ike_vectors.py` can regenerate it
and compare with the committed files.

Usage: ike_vectors.py [OUTDIR]   (default: crates/espgate-ike/tests/vectors/ike)
"""

import json
import pathlib
import sys

from scapy.contrib.ikev2 import (IKEv2, IKEv2_SA, IKEv2_Proposal, IKEv2_Transform, IKEv2_KE, IKEv2_Nonce,
                                 IKEv2_Notify, IKEv2_IDi, IKEv2_AUTH, IKEv2_CERT, IKEv2_CERTREQ, IKEv2_Delete,
                                 IKEv2_VendorID, IKEv2_TSi, IKEv2_TSr, IKEv2_Encrypted, IKEv2_Encrypted_Fragment,
                                 IKEv2_Payload, IPv4TrafficSelector, IPv6TrafficSelector)

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "crates" / "espgate-ike" / "tests" / "vectors" / "ike"

# IKE header flags as Scapy spells them.
FLAG_I, FLAG_R = "Initiator", "Response"

SPI_I = bytes.fromhex("a1b2c3d4e5f60718")
SPI_R = bytes.fromhex("1122334455667788")


def pattern(seed, n):
    """Deterministic filler bytes."""
    return bytes((seed * 7 + i * 13) & 0xff for i in range(n))


class Desc:
    """Collects the flat field description of one message."""

    def __init__(self):
        self.fields = {}
        self.n = 0

    def header(self, spi_i, spi_r, exch, initiator, response, msg_id):
        f = self.fields
        f["header.spi_i"] = spi_i.hex()
        f["header.spi_r"] = spi_r.hex()
        f["header.exchange_type"] = exch
        f["header.initiator"] = int(initiator)
        f["header.response"] = int(response)
        f["header.message_id"] = msg_id

    def payload(self, ptype, **kv):
        i = self.n
        self.n += 1
        self.fields[f"payload.{i}.type"] = ptype
        for k, v in kv.items():
            self.fields[f"payload.{i}.{k}"] = v.hex() if isinstance(v, bytes) else v
        return i


def transforms(specs):
    """Scapy transform chain from [(type, id, key_length or None)]."""
    chain = None
    for t, tid, kl in specs:
        tr = IKEv2_Transform(transform_type=t, transform_id=tid)
        if kl is not None:
            tr = IKEv2_Transform(transform_type=t, transform_id=tid, length=12, key_length=kl)
        chain = tr if chain is None else chain / tr
    return chain


def sa_payload(d, proposals):
    """proposals: [(number, proto, spi, [(type, id, keylen)])] -> IKEv2_SA, described."""
    chain = None
    i = d.payload(33, critical=0)
    for p, (num, proto, spi, specs) in enumerate(proposals):
        prop = IKEv2_Proposal(proposal=num, proto=proto, SPIsize=len(spi), SPI=spi,
                              trans_nb=len(specs), trans=transforms(specs))
        chain = prop if chain is None else chain / prop
        base = f"payload.{i}.proposal.{p}"
        d.fields[f"{base}.number"] = num
        d.fields[f"{base}.protocol"] = proto
        d.fields[f"{base}.spi"] = spi.hex()
        d.fields[f"{base}.transform_count"] = len(specs)
        for t, (tt, tid, kl) in enumerate(specs):
            d.fields[f"{base}.transform.{t}.type"] = tt
            d.fields[f"{base}.transform.{t}.id"] = tid
            if kl is not None:
                d.fields[f"{base}.transform.{t}.key_length"] = kl
    d.fields[f"payload.{i}.proposal_count"] = len(proposals)
    return IKEv2_SA(prop=chain)


def notify(d, ntype, data=b"", proto=0, spi=b""):
    d.payload(41, notify_type=ntype, protocol=proto, spi=spi, data=data)
    return IKEv2_Notify(type=ntype, proto=proto, SPIsize=len(spi), SPI=spi, notify=data)


def ike_sa_init_request():
    d = Desc()
    d.header(SPI_I, bytes(8), 34, True, False, 0)
    sa = sa_payload(d, [
        (1, 1, b"", [(1, 20, 128), (2, 5, None), (4, 31, None)]),       # aes128gcm16-prfsha256-x25519
        (2, 1, b"", [(1, 12, 256), (3, 12, None), (2, 5, None), (4, 14, None)]),  # aes256-sha256-modp2048
    ])
    ke_data = pattern(1, 32)
    d.payload(34, group=31, data=ke_data)
    nonce = pattern(2, 32)
    d.payload(40, data=nonce)
    pkt = (IKEv2(init_SPI=SPI_I, resp_SPI=bytes(8), exch_type=34, flags=FLAG_I, id=0)
           / sa
           / IKEv2_KE(group=31, ke=ke_data)
           / IKEv2_Nonce(nonce=nonce)
           / notify(d, 16388, pattern(3, 20))
           / notify(d, 16389, pattern(4, 20))
           / notify(d, 16430)
           / notify(d, 16431, bytes.fromhex("0002000300040005")))
    return "ike_sa_init_request", pkt, d


def ike_sa_init_response():
    d = Desc()
    d.header(SPI_I, SPI_R, 34, False, True, 0)
    sa = sa_payload(d, [(1, 1, b"", [(1, 20, 128), (2, 5, None), (4, 31, None)])])
    ke_data = pattern(5, 32)
    d.payload(34, group=31, data=ke_data)
    nonce = pattern(6, 32)
    d.payload(40, data=nonce)
    pkt = (IKEv2(init_SPI=SPI_I, resp_SPI=SPI_R, exch_type=34, flags=FLAG_R, id=0)
           / sa
           / IKEv2_KE(group=31, ke=ke_data)
           / IKEv2_Nonce(nonce=nonce)
           / notify(d, 16388, pattern(7, 20))
           / notify(d, 16389, pattern(8, 20)))
    ca = pattern(9, 20)
    d.payload(38, encoding=4, data=ca)
    vid = b"espgate-vector"
    pkt = pkt / IKEv2_CERTREQ(cert_encoding=4, cert_authority=ca)
    d.payload(43, data=vid)
    pkt = pkt / IKEv2_VendorID(vendorID=vid)
    return "ike_sa_init_response", pkt, d


def ike_auth_encrypted():
    d = Desc()
    d.header(SPI_I, SPI_R, 35, True, False, 1)
    body = pattern(10, 8 + 96 + 16)  # IV, ciphertext, ICV: opaque to the codec
    d.payload(46, first_payload=35, data=body)
    pkt = (IKEv2(init_SPI=SPI_I, resp_SPI=SPI_R, exch_type=35, flags=FLAG_I, id=1)
           / IKEv2_Encrypted(next_payload=35, load=body))
    return "ike_auth_encrypted", pkt, d


def ike_auth_fragment():
    d = Desc()
    d.header(SPI_I, SPI_R, 35, True, False, 1)
    body = pattern(11, 8 + 64 + 16)
    d.payload(53, first_payload=35, number=1, total=3, data=body)
    pkt = (IKEv2(init_SPI=SPI_I, resp_SPI=SPI_R, exch_type=35, flags=FLAG_I, id=1)
           / IKEv2_Encrypted_Fragment(next_payload=35, frag_number=1, frag_total=3, load=body))
    return "ike_auth_fragment", pkt, d


def ts_desc(d, i, sels):
    d.fields[f"payload.{i}.ts_count"] = len(sels)
    for k, (tt, proto, sp, ep, a, z) in enumerate(sels):
        base = f"payload.{i}.ts.{k}"
        d.fields[f"{base}.type"] = tt
        d.fields[f"{base}.ip_protocol"] = proto
        d.fields[f"{base}.start_port"] = sp
        d.fields[f"{base}.end_port"] = ep
        d.fields[f"{base}.start"] = a
        d.fields[f"{base}.end"] = z


def ts_list(sels):
    out = []
    for tt, proto, sp, ep, a, z in sels:
        if tt == 7:
            out.append(IPv4TrafficSelector(IP_protocol_ID=proto, start_port=sp, end_port=ep,
                                           starting_address_v4=a, ending_address_v4=z))
        else:
            # Scapy's default length for an IPv6 selector is 20, but RFC 7296
            # §3.13.1 makes it 40 (8 + two 16-byte addresses): set it.
            out.append(IPv6TrafficSelector(IP_protocol_ID=proto, start_port=sp, end_port=ep, length=40,
                                           starting_address_v6=a, ending_address_v6=z))
    return out


def ike_auth_plaintext_ts():
    """The decrypted content of an IKE_AUTH request, as a whole message:
    IDi, CERT, AUTH (RFC 7427), a child SA proposal and TSi/TSr with v4 and v6 ranges."""
    d = Desc()
    d.header(SPI_I, SPI_R, 35, True, False, 1)
    idi = b"sun.example.org"
    d.payload(35, id_type=2, data=idi)
    cert = pattern(12, 91)
    d.payload(37, encoding=15, data=cert)
    auth = pattern(13, 72)
    d.payload(39, method=14, data=auth)
    pkt = (IKEv2(init_SPI=SPI_I, resp_SPI=SPI_R, exch_type=35, flags=FLAG_I, id=1)
           / IKEv2_IDi(IDtype=2, ID=idi)
           / IKEv2_CERT(cert_encoding=15, cert_data=cert)
           / IKEv2_AUTH(auth_type=14, load=auth)
           / notify(d, 16391))
    sa = sa_payload(d, [(1, 3, bytes.fromhex("c0ffee01"), [(1, 20, 256), (5, 0, None), (5, 1, None)])])
    tsi = [(7, 0, 0, 65535, "10.1.0.0", "10.1.255.255"),
           (8, 17, 500, 4500, "2001:db8:1::", "2001:db8:1::ffff")]
    tsr = [(7, 6, 80, 443, "192.0.2.0", "192.0.2.255"),
           (8, 0, 0, 65535, "2001:db8:2::", "2001:db8:2:0:ffff:ffff:ffff:ffff")]
    i = d.payload(44)
    ts_desc(d, i, tsi)
    j = d.payload(45)
    ts_desc(d, j, tsr)
    pkt = (pkt / sa
           / IKEv2_TSi(number_of_TSs=len(tsi), traffic_selector=ts_list(tsi))
           / IKEv2_TSr(number_of_TSs=len(tsr), traffic_selector=ts_list(tsr)))
    return "ike_auth_plaintext_ts", pkt, d


def informational_delete():
    d = Desc()
    d.header(SPI_I, SPI_R, 37, False, False, 5)
    spis = [bytes.fromhex("c0ffee01"), bytes.fromhex("c0ffee02")]
    i = d.payload(42, protocol=3)
    for k, s in enumerate(spis):
        d.fields[f"payload.{i}.spi.{k}"] = s.hex()
    j = d.payload(42, protocol=1)
    d.fields[f"payload.{j}.spi_count"] = 0
    d.fields[f"payload.{i}.spi_count"] = len(spis)
    pkt = (IKEv2(init_SPI=SPI_I, resp_SPI=SPI_R, exch_type=37, flags=0, id=5)
           / IKEv2_Delete(proto=3, SPIsize=4, SPInum=len(spis), SPI=spis)
           / IKEv2_Delete(proto=1, SPIsize=0, SPInum=0, SPI=[]))
    return "informational_delete", pkt, d


def unknown_critical():
    """A nonce followed by an unknown payload type 200 with the critical bit."""
    d = Desc()
    d.header(SPI_I, SPI_R, 37, True, False, 6)
    nonce = pattern(14, 16)
    d.payload(40, data=nonce)
    body = pattern(15, 6)
    i = d.payload(200, critical=1, body=body)
    d.fields["unsupported_critical"] = 200
    _ = i
    pkt = (IKEv2(init_SPI=SPI_I, resp_SPI=SPI_R, exch_type=37, flags=FLAG_I, id=6)
           / IKEv2_Nonce(next_payload=200, nonce=nonce)
           / IKEv2_Payload(next_payload=0, flags="critical", load=body))
    return "unknown_critical", pkt, d


BUILDERS = [ike_sa_init_request, ike_sa_init_response, ike_auth_encrypted, ike_auth_fragment,
            ike_auth_plaintext_ts, informational_delete, unknown_critical]


def main(argv):
    out = pathlib.Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    for build in BUILDERS:
        name, pkt, d = build()
        raw = bytes(pkt)
        d.fields["payload_count"] = d.n
        d.fields["length"] = len(raw)
        doc = {"name": name, "generator": "scapy.contrib.ikev2", "hex": raw.hex(),
               "fields": dict(sorted(d.fields.items()))}
        (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
