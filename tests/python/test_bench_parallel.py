"""`espgate bench parallel` as a user runs it: one SA's outbound pipeline
over N crypto threads with in-order delivery, against the serial loop.
Speeds are not asserted (benchmarks are not timed tests); only the rows'
schema, that every configuration asked for has its row, and that the
numbers are present, positive and consistent with each other."""

import json
import subprocess


def bench(espgate, *args, check=True):
    r = subprocess.run([espgate, "bench", "parallel", *args], capture_output=True, text=True,
                       timeout=180)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_json_rows_for_every_thread_count(espgate):
    r = bench(espgate, "--json", "--suite", "aes128gcm16,aes128-sha256", "--size", "64,1400",
              "--threads", "1,2,3", "--batch", "1,16", "--seconds", "0.005", "--repeat", "1")
    rows = json.loads(r.stdout)
    want = {"suite", "size", "mode", "threads", "batch", "in_flight", "ns_per_packet", "mpps", "gbps",
            "speedup_vs_serial", "cpu_ns_per_packet", "cpus", "crypto_cpu_ns_per_packet", "spread",
            "max_seq_lag"}
    for x in rows:
        assert set(x) == want, set(x) ^ want
    # One serial row and one row per threads x batch, for each suite and size.
    assert len(rows) == 2 * 2 * (1 + 3 * 2)
    for suite in ("aes128gcm16", "aes128-sha256"):
        for size in (64, 1400):
            mine = [x for x in rows if x["suite"] == suite and x["size"] == size]
            serial = [x for x in mine if x["mode"] == "serial"]
            assert len(serial) == 1 and serial[0]["threads"] == 0
            assert serial[0]["speedup_vs_serial"] == 1.0 and serial[0]["max_seq_lag"] == 0
            got = sorted((x["threads"], x["batch"]) for x in mine if x["mode"] == "threads")
            assert got == [(t, b) for t in (1, 2, 3) for b in (1, 16)], got
            for x in mine:
                assert x["ns_per_packet"] > 0 and x["mpps"] > 0 and x["gbps"] > 0
                assert abs(x["mpps"] * x["ns_per_packet"] - 1000) < 1e-6 * 1000
                assert abs(x["gbps"] - x["mpps"] * size * 8 / 1000) < 1e-6 * x["gbps"]
                want_speedup = serial[0]["ns_per_packet"] / x["ns_per_packet"]
                assert abs(x["speedup_vs_serial"] - want_speedup) < 1e-9 * want_speedup
                assert x["cpu_ns_per_packet"] > 0 and x["cpus"] > 0
                if x["mode"] == "serial":
                    assert x["crypto_cpu_ns_per_packet"] is None
                else:
                    assert x["crypto_cpu_ns_per_packet"] > 0
            for x in mine:
                if x["mode"] == "threads":
                    assert x["in_flight"] >= x["threads"] * x["batch"]
                    # One crypto thread encrypts in dispatch order.
                    if x["threads"] == 1:
                        assert x["max_seq_lag"] == 0, x
                    # The lag is bounded by what the pool holds.
                    assert x["max_seq_lag"] < 2 * x["in_flight"], x


def test_table_and_defaults(espgate):
    r = bench(espgate, "--suite", "chacha20poly1305", "--size", "256", "--threads", "2",
              "--batch", "8", "--seconds", "0.005", "--repeat", "1")
    lines = r.stdout.splitlines()
    assert lines[0].split()[:5] == ["suite", "size", "mode", "threads", "batch"]
    body = [line.split() for line in lines[1:3]]
    assert [(b[0], b[1], b[2], b[3], b[4]) for b in body] == [
        ("chacha20poly1305", "256", "serial", "0", "1"),
        ("chacha20poly1305", "256", "threads", "2", "8"),
    ]
    assert "CPUs" in r.stdout and "in dispatch order" in r.stdout


def test_errors_are_clear(espgate):
    r = bench(espgate, "--threads", "0", check=False)
    assert r.returncode != 0 and "--threads 0" in r.stderr, r.stderr
    r = bench(espgate, "--batch", "0", check=False)
    assert r.returncode != 0 and "--batch 0" in r.stderr, r.stderr
    r = bench(espgate, "--threads", "64", "--batch", "64", check=False)
    assert r.returncode != 0 and "in flight" in r.stderr, r.stderr
    r = bench(espgate, "--suite", "rot13", check=False)
    assert r.returncode != 0 and "--suite rot13" in r.stderr, r.stderr
    r = bench(espgate, "--size", "20", check=False)
    assert r.returncode != 0 and "--size 20" in r.stderr, r.stderr
