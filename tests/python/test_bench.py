"""`espgate bench crypto|esp` as a user runs it: the command line, the JSON
rows it documents, and clear errors. Speeds are not asserted (benchmarks
are not timed tests); only that the numbers are present, positive and
consistent with each other."""

import json
import os
import subprocess

import pytest


def bench(espgate, *args, check=True, env=None):
    r = subprocess.run([espgate, "bench", *args], capture_output=True, text=True, timeout=120,
                       env=None if env is None else {**os.environ, **env})
    if check:
        assert r.returncode == 0, r.stderr
    return r


# AES-GCM runs in aws-lc or ring (the CPU decides; ESPGATE_AES_GCM forces it).
@pytest.mark.parametrize("library", ["aws-lc", "ring"])
def test_bench_esp_json_rows(espgate, library):
    r = bench(espgate, "esp", "--json", "--suite", "aes128gcm16,chacha20poly1305", "--size", "64",
              "--size", "1400", "--seconds", "0.01", "--repeat", "1", env={"ESPGATE_AES_GCM": library})
    rows = json.loads(r.stdout)
    keys = {(x["suite"], x["size"], x["direction"]) for x in rows}
    for suite in ("aes128gcm16", "chacha20poly1305", "null"):
        for size in (64, 1400):
            for d in ("outbound", "inbound"):
                assert (suite, size, d) in keys, (suite, size, d, keys)
    for x in rows:
        assert x["mpps"] > 0 and x["gbps"] > 0
        assert abs(x["gbps"] - x["mpps"] * x["size"] * 8 / 1000) < 1e-6 * x["gbps"]
        if x["suite"] == "null":
            assert x["ratio_to_raw"] is None
        else:
            assert 0 < x["ratio_to_raw"] < 10
            assert 0 <= x["crypto_share"] <= 1
        # AES-GCM rows name the library that ran them; other suites, none.
        assert x.get("library") == (library if x["suite"] == "aes128gcm16" else None), x
        if x["suite"] != "null" and x["direction"] == "outbound":
            assert 0 < x["ceiling"] < 10
            # aws-lc's AES-GCM is sealed from the packet where it lies;
            # ring's (no out-of-place seal) and ChaCha20-Poly1305 (measured
            # slower that way) are not, so they have no such row.
            if x["suite"] == "aes128gcm16" and library == "aws-lc":
                assert 0 < x["no_copy"] < 10
            else:
                assert x["no_copy"] is None
        else:
            assert x["ceiling"] is None
            assert x["no_copy"] is None


def test_bench_esp_table_and_one_direction(espgate):
    r = bench(espgate, "esp", "--suite", "aes256gcm16", "--size", "512", "--seconds", "0.01", "--repeat", "1",
              "--direction", "out")
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["suite", "size", "direction"]
    # The notes: what the columns mean, and which library ran AES-GCM.
    assert any(line.startswith("AES-GCM: aws-lc") or line.startswith("AES-GCM: ring") for line in lines), lines
    # And the hypervisor's share of the CPU while it ran (/proc/stat).
    steal = [line for line in lines if line.startswith("CPU steal during the bench: ")]
    assert len(steal) == 1, lines
    assert 0 <= float(steal[0].split()[5]) <= 100, steal
    body = [line.split() for line in lines[1:]
            if line and not line.startswith(("vs raw", "AES-GCM:", "CPU steal"))]
    assert [(b[0], b[1], b[2]) for b in body] == [("aes256gcm16", "512", "outbound"), ("null", "512", "outbound")]


def test_bench_crypto_every_suite_kind(espgate):
    r = bench(espgate, "crypto", "--json", "--suite", "aes128gcm16,aes128gmac,aes256-sha512,null-aesxcbc",
              "--size", "100", "--seconds", "0.01", "--repeat", "1")
    rows = json.loads(r.stdout)
    assert [(x["suite"], x["direction"]) for x in rows] == [
        (s, d) for s in ("aes128gcm16", "aes128gmac", "aes256-sha512", "null-aesxcbc") for d in ("seal", "open")]


def test_bench_errors_are_clear(espgate):
    r = bench(espgate, "esp", "--suite", "rot13", check=False)
    assert r.returncode != 0 and "--suite rot13" in r.stderr
    r = bench(espgate, "esp", "--size", "20", check=False)
    assert r.returncode != 0 and "--size 20" in r.stderr
    r = bench(espgate, "tunnel", "--tests", "bogus", check=False)
    assert r.returncode != 0 and "--tests bogus" in r.stderr, r.stderr
    r = bench(espgate, "tunnel", "--peers", "nope", check=False)
    assert r.returncode != 0 and "--peers nope" in r.stderr, r.stderr
