"""Key material does not outlive its SA in a running daemon, and never
shows in its log, its status document or its metrics.

Two `espgate up` with one IKE (PSK) connection each, in two network
namespaces (`ike_pair` of test_ike.py, the `lab` fixture of
test_gateway.py); A initiates, so a child SA pair is negotiated. On A,
`espgate sa add` installs a manual SA pair with fresh random keys
(aes256-sha256 inbound, aes256gcm16 outbound: encryption, integrity and
AEAD keys with salt). `espgate wireshark-keys --json` gives the
negotiated child keys (the one command that hands keys out); the manual
ones are the test's own.

While the SAs are installed, every key is found in A's memory: this is the
control that shows the scan sees what it looks for. Then `sa del` removes
the manual pair, `terminate` the IKE SA with its children on both sides,
and after a short pause both daemons' memory is scanned again: every
readable private mapping (heap, anonymous mappings, thread stacks) through
/proc/PID/maps and /proc/PID/mem, for each key in binary and as hex text
(either case), whole and in 16-byte / 32-digit pieces so that partial
copies (a buffer that held half a request, an AES key schedule whose
first round key is the key itself) count too. Freed memory that was wiped
is fine; a key of a deleted SA found anywhere is a leftover, reported with
its mapping, offset and the bytes around it.

Keys (the PSK included) must also never appear in the daemon's log (at
debug level), `espgate status --json` or the metrics text.
"""

import json
import os
import secrets
import shutil
import sys
import time

import pytest

from test_gateway import lab, run  # noqa: F401
from test_ike import PSK, ctl, established, ike_pair, ike_status, wait_for

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun"),
        reason="needs root, iproute2 and /dev/net/tun (scripts/setup.sh installs iproute2)"),
]

METRICS = "127.0.0.1:9184"

# One HTTP GET from inside a namespace; the body on stdout.
FETCH = r"""
import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
"""


def region_kind(path):
    """Which readable mappings hold process data: the heap, thread stacks and
    anonymous mappings (malloc arenas, big allocations, tokio's stacks).
    File-backed mappings (the binary, libraries) and the kernel's
    [vvar]/[vdso]/[vsyscall] pages are left out."""
    if path in ("", "[heap]", "[stack]") or path.startswith("[anon"):
        return path or "anon"
    return None


def memory_regions(pid):
    """(start, end, perms, name) of the readable private data mappings."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            perms = parts[1]
            path = parts[5].strip() if len(parts) > 5 else ""
            kind = region_kind(path)
            if kind is None or perms[0] != "r":
                continue
            out.append((lo, hi, perms, kind))
    return out


def read_memory(pid):
    """[(start, perms, name, bytes)] of every readable data mapping."""
    got = []
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for lo, hi, perms, kind in memory_regions(pid):
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except OSError:
                continue  # unmapped meanwhile, or a guard page
            got.append((lo, perms, kind, data))
    return got


def needles(name, key):
    """The forms a copy of `key` can take: its bytes and its hex text (lower
    and upper case), whole, and cut in pieces of 16 bytes / 32 hex digits
    (the first piece of an AES-GCM key is the AES key without its salt,
    which is also the first round key of its key schedule)."""
    out = []
    forms = [("bin", key), ("hex", key.hex().encode()), ("HEX", key.hex().upper().encode())]
    for form, b in forms:
        out.append((f"{name} {form}", b))
        step = 16 if form == "bin" else 32
        if len(b) > step:
            for i in range(0, len(b) - step + 1, step):
                out.append((f"{name} {form}[{i}:{i + step}]", b[i:i + step]))
    return out


def scan(pid, keys):
    """Every place in the memory of `pid` where a form of one of `keys`
    ({name: bytes}) occurs: [(needle name, where, context)]."""
    found = []
    for lo, perms, kind, data in read_memory(pid):
        for name, key in keys.items():
            for what, b in needles(name, key):
                at = data.find(b)
                while at >= 0:
                    ctx = data[max(0, at - 32):at + len(b) + 32]
                    found.append((what, f"{kind} {perms} {lo + at:#x} (+{at:#x} in mapping {lo:#x})",
                                  ctx.hex()))
                    at = data.find(b, at + 1)
    return found


def describe(found, limit=40):
    lines = [f"{what} at {where}\n    {ctx}" for what, where, ctx in found[:limit]]
    if len(found) > limit:
        lines.append(f"... and {len(found) - limit} more")
    return "\n".join(lines)


def assert_found(d, keys):
    """The control: every key of an installed SA is in the daemon's memory."""
    live = {what.split(" bin")[0] for what, _, _ in scan(d.proc.pid, keys) if " bin" in what}
    assert live >= set(keys), f"keys of installed SAs not found by the scan: {set(keys) - live}"


def wireshark_keys(d):
    r = ctl(d, "wireshark-keys", "--json")
    return json.loads(r.stdout)["sas"]


def metrics_text(d):
    return run("ip", "netns", "exec", d.ns, sys.executable, "-c", FETCH, f"http://{METRICS}/metrics").stdout


def no_key_text(text, keys, where):
    """None of `keys` in `text` as hex text (either case, whole or a 32-digit
    piece), nor as text of its own (the PSK is printable)."""
    low = text.lower()
    for name, key in keys.items():
        for what, b in needles(name, key):
            if " bin" not in what:
                assert b.decode().lower() not in low, f"{what} appears in {where}"
        if key.isascii() and key.decode().isprintable():
            assert key.decode() not in text, f"{name} appears in {where}"


# AES-GCM runs in aws-lc or in ring, whichever suits the CPU
# (espgate_core::crypto::GcmImpl); ring does not wipe its keys itself, so
# both are checked on every host (ESPGATE_AES_GCM forces the choice).
@pytest.mark.parametrize("aes_gcm", ["aws-lc", "ring"])
def test_deleted_keys_leave_no_trace_in_memory_log_status_or_metrics(lab, monkeypatch, aes_gcm):
    monkeypatch.setenv("ESPGATE_AES_GCM", aes_gcm)
    t0 = time.time()
    a, b = ike_pair(lab, a_ike='start_action = "start"', extra_gw=f'metrics = "{METRICS}"')
    b.start()
    a.start()
    wait_for("the IKE SA", lambda: established(a) and established(b), 20, (a, b))

    # The negotiated child keys, from the one command that hands keys out
    # (before `sa add`: a manual outbound SA replaces the negotiated one).
    child = {}
    for k in wireshark_keys(a):
        name = f"child-{k['direction']} {k['spi']:#010x}"
        child[f"{name} enc"] = bytes.fromhex(k["enc_key"])
        if k["integ_key"]:
            child[f"{name} integ"] = bytes.fromhex(k["integ_key"])
    assert len(child) == 2, child.keys()  # aes128gcm16 in and out
    # Control: while installed, every key is in A's memory (the SA's own
    # Zeroizing copy), so the scan below sees what it looks for.
    assert_found(a, child)

    # A manual SA pair on A's connection, with keys only this test knows.
    manual = {
        "manual-in enc": secrets.token_bytes(32),
        "manual-in integ": secrets.token_bytes(32),
        "manual-out enc": secrets.token_bytes(36),  # aes256gcm16: key + 4-byte salt
    }
    ctl(a, "sa", "add", "--conn", "to-b", "--dir", "in",
        f"spi=0x5001,suite=aes256-sha256,enc={manual['manual-in enc'].hex()},"
        f"integ={manual['manual-in integ'].hex()}")
    # Through standard input, as an operator should pass keys.
    r = run(a.lab.espgate, "sa", "add", "--conn", "to-b", "--dir", "out", "-", "-s", str(a.sock),
            input=f"spi=0x5002,suite=aes256gcm16,enc={manual['manual-out enc'].hex()}\n", check=False)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{a.log_text()[-4000:]}"
    added = {k["spi"]: k for k in wireshark_keys(a) if k["spi"] in (0x5001, 0x5002)}
    assert bytes.fromhex(added[0x5001]["enc_key"]) == manual["manual-in enc"], added.keys()
    assert bytes.fromhex(added[0x5001]["integ_key"]) == manual["manual-in integ"]
    assert bytes.fromhex(added[0x5002]["enc_key"]) == manual["manual-out enc"]
    assert_found(a, manual)
    keys = {**manual, **child}

    # Status and metrics never show keys (nor the PSK), SAs installed.
    psk = {"psk": PSK.encode()}
    status = ctl(a, "status", "--json").stdout + ctl(a, "sa", "list", "--json").stdout
    no_key_text(status, {**keys, **psk}, "espgate status --json / sa list --json")
    no_key_text(metrics_text(a), {**keys, **psk}, "the metrics text")

    # Delete everything: the manual pair, then the IKE SA and its children.
    ctl(a, "sa", "del", "--spi", "0x5001", "--dir", "in")
    ctl(a, "sa", "del", "--spi", "0x5002", "--dir", "out")
    ctl(a, "terminate", "to-b")
    wait_for("the SAs to go", lambda: not ike_status(a)["sas"] and not ike_status(b)["sas"]
             and not a.sas("in") and not a.sas("out") and not b.sas("in") and not b.sas("out"), 10, (a, b))
    time.sleep(1)

    # Not in memory, in A (all keys) nor in B (the children it negotiated).
    found_a = scan(a.proc.pid, keys)
    found_b = scan(b.proc.pid, child)
    assert not found_a and not found_b, (
        f"keys of deleted SAs still in memory\n--- A (pid {a.proc.pid}) ---\n{describe(found_a)}"
        f"\n--- B (pid {b.proc.pid}) ---\n{describe(found_b)}")

    # Nor in the logs (debug level), status or metrics after the deletion.
    everything = {**keys, **psk}
    no_key_text(ctl(a, "status", "--json").stdout, everything, "espgate status --json")
    no_key_text(metrics_text(a), everything, "the metrics text")
    assert a.stop() == 0 and b.stop() == 0
    for d in (a, b):
        log = d.log_text()
        no_key_text(log, everything, f"the log of {d.ns}")
        assert f"AES-GCM SAs are run by {aes_gcm}" in log, log[-2000:]
    assert time.time() - t0 < 60
