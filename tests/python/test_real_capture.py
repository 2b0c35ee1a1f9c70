"""A capture taken the way users take them: `tcpdump -i any` (Linux cooked
SLL2 link type) inside a network namespace this test creates and deletes.
Scapy sends ESP-in-UDP on the namespace's loopback; espgate must decrypt
what tcpdump wrote."""

import os
import shutil
import subprocess
import time
import uuid

import pytest
from scapy.all import IP, UDP, Raw, rdpcap
from scapy.layers.ipsec import ESP, SecurityAssociation

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tcpdump") or not shutil.which("ip"),
                                reason="needs root, iproute2 and tcpdump (scripts/setup.sh installs them)")

KEY = bytes(range(20))
SPEC = f"spi=0x4242,suite=aes128gcm16,enc={KEY.hex()},encap=udp,src=127.0.0.1,dst=127.0.0.1"


@pytest.fixture
def netns():
    name = f"espgate-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_tcpdump_any_capture_decrypts(espgate, tmp_path, netns):
    cap, out = tmp_path / "any.pcap", tmp_path / "clear.pcap"
    sa = SecurityAssociation(ESP, spi=0x4242, crypt_algo="AES-GCM", crypt_key=KEY,
                             tunnel_header=IP(src="127.0.0.1", dst="127.0.0.1"),
                             nat_t_header=UDP(sport=4500, dport=4500))
    inner = [IP(src="10.1.0.1", dst="10.2.0.2") / UDP(sport=7, dport=9) / Raw(b"%03d" % i * 20) for i in range(5)]
    inner = [IP(bytes(p)) for p in inner]
    wire = [bytes(sa.encrypt(p)) for p in inner]
    dump = subprocess.Popen(["ip", "netns", "exec", netns, "tcpdump", "-i", "any", "-U", "-w", str(cap),
                             "udp port 4500"], stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 10
        while time.time() < deadline and not (cap.exists() and cap.stat().st_size >= 24):
            time.sleep(0.1)
        time.sleep(0.5)
        sender = ("import socket,sys\n"
                  "s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_RAW)\n"
                  "for h in sys.argv[1:]: s.sendto(bytes.fromhex(h),('127.0.0.1',0))\n")
        subprocess.run(["ip", "netns", "exec", netns, "python3", "-c", sender, *[w.hex() for w in wire]],
                       check=True, timeout=20)
        deadline = time.time() + 10
        while time.time() < deadline and len(rdpcap(str(cap))) < len(wire):
            time.sleep(0.2)
    finally:
        dump.terminate()
        dump.wait(timeout=10)
    # tcpdump -i any sees each packet once on lo (outgoing) and may see it again
    # incoming; it writes the cooked link type either way.
    with open(cap, "rb") as f:
        f.seek(20)
        linktype = int.from_bytes(f.read(4), "little")
    assert linktype in (113, 276), f"tcpdump -i any wrote link type {linktype}"
    r = subprocess.run([espgate, "pcap", "decrypt", "--sa", SPEC, str(cap), str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = [bytes(p) for p in rdpcap(str(out))]
    expect = [bytes(p) for p in inner]
    # Each packet at least once, in order; a duplicate from the incoming copy is a replay.
    assert [g for i, g in enumerate(got) if g not in got[:i]] == expect, r.stderr
    assert "decrypted" in r.stderr
