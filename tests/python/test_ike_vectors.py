"""The committed IKEv2 vectors are exactly what the Scapy generator writes.

`tests/python/ike_vectors.py` builds IKEv2 messages with Scapy's
`scapy.contrib.ikev2`; `crates/espgate-ike/tests/ike_vectors.rs` parses the
committed copies. Regenerating into a temporary directory and comparing
catches drift between the generator, Scapy and the committed files.
"""

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("scapy.contrib.ikev2", reason="Scapy's IKEv2 layer (scapy.contrib.ikev2) is not installed")

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "python" / "ike_vectors.py"
COMMITTED = ROOT / "crates" / "espgate-ike" / "tests" / "vectors" / "ike"
EXPECTED = {"ike_sa_init_request", "ike_sa_init_response", "ike_auth_encrypted", "ike_auth_fragment",
            "ike_auth_plaintext_ts", "informational_delete", "unknown_critical"}


def test_regenerated_vectors_equal_committed(tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], check=True, timeout=120)
    fresh = {p.name: p.read_bytes() for p in tmp_path.glob("*.json")}
    committed = {p.name: p.read_bytes() for p in COMMITTED.glob("*.json")}
    assert {n[:-5] for n in fresh} == EXPECTED
    assert sorted(fresh) == sorted(committed)
    for name, data in fresh.items():
        assert data == committed[name], f"{name} drifted from the generator"


def test_vectors_are_valid_ikev2_for_scapy():
    """Each committed message re-dissects in Scapy to the same bytes and length."""
    from scapy.contrib.ikev2 import IKEv2
    for path in sorted(COMMITTED.glob("*.json")):
        doc = json.loads(path.read_text())
        raw = bytes.fromhex(doc["hex"])
        pkt = IKEv2(raw)
        assert pkt.length == len(raw) == doc["fields"]["length"], path.name
        assert pkt.exch_type == doc["fields"]["header.exchange_type"], path.name
        assert bytes(pkt) == raw, path.name
