#!/usr/bin/env python3
"""RFC 7296 key derivation vectors from a second implementation.

Computes SKEYSEED, the seven IKE SA keys, an IKE SA rekey and child SA
KEYMAT with Python's own hmac/hashlib (not espgate's code), for the
Rust test crates/espgate-ike/tests/ike_keys.rs. Run with --write to
regenerate crates/espgate-ike/tests/vectors/ike-keys/keys.json; test_ike_keys.py
checks the committed file still matches.
"""
import hashlib
import hmac
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "crates/espgate-ike/tests/vectors/ike-keys/keys.json"
HASH = {"prfsha256": hashlib.sha256, "prfsha384": hashlib.sha384, "prfsha512": hashlib.sha512}


def prf(name, key, data):
    return hmac.new(key, data, HASH[name]).digest()


def prf_plus(name, key, seed, n):
    out, t, i = b"", b"", 1
    while len(out) < n:
        t = prf(name, key, t + seed + bytes([i]))
        out += t
        i += 1
    return out[:n]


def pattern(tag, n):
    """Deterministic test bytes (not random: the file must be reproducible)."""
    return hashlib.shake_256(tag.encode()).digest(n)


def ike_case(name, prf_name, enc, integ, nonce_len, gir_len):
    ni, nr = pattern(name + "ni", nonce_len), pattern(name + "nr", nonce_len)
    g_ir = pattern(name + "gir", gir_len)
    spi_i, spi_r = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    p = len(prf(prf_name, b"k", b""))
    skeyseed = prf(prf_name, ni + nr, g_ir)
    sizes = [p, integ, integ, enc, enc, p, p]
    km = prf_plus(prf_name, skeyseed, ni + nr + spi_i.to_bytes(8, "big") + spi_r.to_bytes(8, "big"), sum(sizes))
    keys, at = [], 0
    for s in sizes:
        keys.append(km[at:at + s].hex())
        at += s
    # Child SA KEYMAT without and with PFS (RFC 7296 §2.17), ESP aes128gcm16 (20-byte keys).
    sk_d = bytes.fromhex(keys[0])
    child = prf_plus(prf_name, sk_d, ni + nr, 2 * 20).hex()
    g_new = pattern(name + "gnew", gir_len)
    child_pfs = prf_plus(prf_name, sk_d, g_new + ni + nr, 2 * (16 + 32)).hex()
    # IKE SA rekey (§2.18): SKEYSEED = prf(SK_d old, g^ir new | Ni | Nr).
    ni2, nr2 = pattern(name + "ni2", nonce_len), pattern(name + "nr2", nonce_len)
    spi_i2, spi_r2 = 0x1111111111111111, 0x2222222222222222
    sks2 = prf(prf_name, sk_d, g_new + ni2 + nr2)
    km2 = prf_plus(prf_name, sks2, ni2 + nr2 + spi_i2.to_bytes(8, "big") + spi_r2.to_bytes(8, "big"), sum(sizes))
    # PSK AUTH (§2.15).
    psk = b"a shared secret of the test"
    signed = pattern(name + "signed", 300)
    auth = prf(prf_name, prf(prf_name, psk, b"Key Pad for IKEv2"), signed)
    return {
        "name": name, "prf": prf_name, "enc_len": enc, "integ_len": integ,
        "ni": ni.hex(), "nr": nr.hex(), "g_ir": g_ir.hex(),
        "spi_i": f"{spi_i:016x}", "spi_r": f"{spi_r:016x}",
        "skeyseed": skeyseed.hex(), "keys": keys,
        "child_keymat": child, "g_new": g_new.hex(), "child_keymat_pfs": child_pfs,
        "rekey_ni": ni2.hex(), "rekey_nr": nr2.hex(),
        "rekey_spi_i": f"{spi_i2:016x}", "rekey_spi_r": f"{spi_r2:016x}",
        "rekey_keymat": km2.hex(),
        "psk": psk.hex(), "signed": signed.hex(), "psk_auth": auth.hex(),
    }


def vectors():
    return [
        ike_case("gcm128-sha256-x25519", "prfsha256", 20, 0, 32, 32),
        ike_case("aes256-sha256-modp2048", "prfsha256", 32, 32, 32, 256),
        ike_case("aes256gcm-sha384-ecp384", "prfsha384", 36, 0, 48, 48),
        ike_case("chacha-sha512-ecp256", "prfsha512", 36, 0, 16, 32),
    ]


if __name__ == "__main__":
    text = json.dumps(vectors(), indent=1) + "\n"
    if "--write" in sys.argv:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text)
    else:
        sys.stdout.write(text)
