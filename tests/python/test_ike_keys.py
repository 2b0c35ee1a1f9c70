"""The committed RFC 7296 key-derivation vectors are what the stdlib-hmac
generator (`ike_key_vectors.py`, a second implementation of §2.13-§2.18)
produces; `crates/espgate-ike/tests/ike_keys.rs` checks espgate against them."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "python" / "ike_key_vectors.py"
COMMITTED = ROOT / "crates" / "espgate-ike" / "tests" / "vectors" / "ike-keys" / "keys.json"


def test_regenerated_key_vectors_equal_committed():
    out = subprocess.run([sys.executable, str(SCRIPT)], check=True, timeout=60, capture_output=True)
    assert json.loads(out.stdout) == json.loads(COMMITTED.read_text())


def test_vectors_cover_every_prf():
    cases = json.loads(COMMITTED.read_text())
    assert {c["prf"] for c in cases} == {"prfsha256", "prfsha384", "prfsha512"}
    for c in cases:
        assert len(c["keys"]) == 7
        assert len(bytes.fromhex(c["keys"][3])) == c["enc_len"]
