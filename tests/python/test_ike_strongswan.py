"""IKEv2 interop with strongSwan 5.9 (charon with kernel-libipsec, the
userspace data plane: this kernel has no XFRM ESP) in network namespaces.

espgate runs in namespace A (inner 10.1.0.0/24 on its TUN), charon in
namespace B (inner 10.2.0.1 on a dummy-free `lo` alias; kernel-libipsec
routes 10.1.0.0/24 through its own TUN `ipsec0`). Each charon gets a
private /run (its pid file is fixed at /var/run/charon.pid), its own
strongswan.conf (STRONGSWAN_CONF) and vici socket; swanctl is pointed at it
with `--uri`.

Cases: espgate as initiator and as responder; PSK and ECDSA certificates
(made with strongSwan's own `pki`); aes128gcm16-prfsha256-x25519 and
aes256-sha256-modp2048; traffic both ways; child and IKE rekeys under a
running transfer; DPD after charon is killed, recovery when it returns;
a new child SA on an established IKE SA (CREATE_CHILD_SA without
REKEY_SA), created by charon and by espgate, with and without PFS;
charon moving to a new address with MOBIKE (RFC 4555).

scripts/setup.sh installs strongSwan; without it the tests are skipped.
"""

import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from test_gateway import PING, Daemon, lab, ping, run  # noqa: F401
from test_ike import ctl, established, ike_status, wait_for

CHARON = next((p for p in ("/usr/lib/ipsec/charon", "/usr/libexec/ipsec/charon") if os.path.exists(p)), None)
PLUGINS = os.path.join(os.path.dirname(CHARON), "plugins") if CHARON else None

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists("/dev/net/tun"),
        reason="needs root, iproute2 and /dev/net/tun"),
    pytest.mark.skipif(PING is None, reason="needs ping"),
    pytest.mark.skipif(
        CHARON is None or not shutil.which("swanctl") or not shutil.which("pki")
        or not os.path.exists(os.path.join(PLUGINS, "libstrongswan-kernel-libipsec.so")),
        reason="needs strongSwan with kernel-libipsec, swanctl and pki (scripts/setup.sh installs them)"),
]

PSK = "interop pre-shared key, test only"


class Charon:
    """One charon in namespace `ns` with its own /run, config and vici socket."""

    def __init__(self, lab, ns, d):
        self.lab, self.ns, self.d = lab, ns, d
        self.vici = d / "charon.vici"
        self.log = d / "charon.log"
        self.conf = d / "strongswan.conf"
        self.swanctl = d / "swanctl.conf"
        self.proc = None
        (d / "run").mkdir(exist_ok=True)

    def write(self, swanctl, retransmit=""):
        self.conf.write_text(f"""charon {{
  load = random nonce openssl pem pkcs1 pkcs8 x509 pubkey revocation constraints gcm aes sha1 sha2 hmac kdf \
curve25519 kernel-libipsec kernel-netlink socket-default vici updown
  port = 500
  port_nat_t = 4500
  {retransmit}
  filelog {{
    log {{
      path = {self.log}
      default = 1
      ike = 2
      time_format = %T
      flush_line = yes
    }}
  }}
  plugins {{
    vici {{
      socket = unix://{self.vici}
    }}
  }}
}}
""")
        self.swanctl.write_text(swanctl)
        self.swanctl.chmod(0o600)

    def start(self):
        self.vici.unlink(missing_ok=True)
        out = open(self.d / "stdout", "ab")
        script = f"mount --bind '{self.d / 'run'}' /run && exec '{CHARON}'"
        env = dict(os.environ, STRONGSWAN_CONF=str(self.conf))
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, "unshare", "-m", "sh", "-c", script],
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.lab.procs.append(self.proc)
        wait_for("charon's vici socket", lambda: self.vici.exists() or self.proc.poll() is not None, 15)
        assert self.proc.poll() is None, self.log_text()
        r = self.swanctl_cmd("--load-all", "--file", str(self.swanctl))
        assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{self.log_text()}"
        return self

    def swanctl_cmd(self, *args, timeout=30):
        env = dict(os.environ, STRONGSWAN_CONF=str(self.conf))
        return subprocess.run(["swanctl", *args, "--uri", f"unix://{self.vici}"], capture_output=True, text=True,
                              timeout=timeout, env=env)

    def list_sas(self):
        return self.swanctl_cmd("--list-sas").stdout

    def log_text(self):
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


def setup(lab, *, ike_extra="", charon_conn="", charon_child="", esp_proposals="aes128gcm16",
          proposals="aes128gcm16-prfsha256-x25519", auth="psk", retransmit="", extra_gw="", extra_conn="",
          remote_ts="10.2.0.1/32", charon_children=None, charon_local="{b_addr}"):
    """espgate in A, charon in B; returns (espgate daemon, charon).
    `charon_children`: (name, local_ts) of charon's children, each with
    remote_ts 10.1.0.0/24 (default: one, "net", for 10.2.0.1/32)."""
    a_ns, b_ns, a_addr, b_addr = lab.pair()
    run("ip", "-n", b_ns, "addr", "add", "10.2.0.1/32", "dev", "lo")
    run("ip", "-n", b_ns, "addr", "add", "10.2.0.2/32", "dev", "lo")
    da, db = lab.tmp / "A", lab.tmp / "B"
    da.mkdir()
    db.mkdir()
    if auth == "psk":
        (da / "psk").write_text(PSK)
        (da / "psk").chmod(0o600)
        ike_auth = 'psk_file = "psk"\nlocal_id = "moon.example"\nremote_id = "sun.example"'
        sw_local = "auth = psk\n      id = sun.example"
        sw_remote = "auth = psk\n      id = moon.example"
        secrets = f'secrets {{\n  ike-1 {{\n    id-1 = moon.example\n    id-2 = sun.example\n    secret = "{PSK}"\n  }}\n}}\n'
    else:
        # ECDSA P-256 certificates from one CA, made with strongSwan's pki.
        def pki(*args, out):
            r = subprocess.run(["pki", *args], capture_output=True, timeout=30, check=True)
            out.write_bytes(r.stdout)

        pki("--gen", "--type", "ecdsa", "--size", "256", "--outform", "pem", out=db / "ca.key")
        pki("--self", "--ca", "--in", str(db / "ca.key"), "--type", "ecdsa", "--dn", "C=CH, O=espgate test, CN=test CA",
            "--lifetime", "365", "--outform", "pem", out=db / "ca.crt")
        for name in ("moon", "sun"):
            pki("--gen", "--type", "ecdsa", "--size", "256", "--outform", "pem", out=db / f"{name}.key")
            pki("--pub", "--in", str(db / f"{name}.key"), "--type", "ecdsa", "--outform", "pem", out=db / f"{name}.pub")
            pki("--issue", "--in", str(db / f"{name}.pub"), "--type", "pub", "--cacert", str(db / "ca.crt"),
                "--cakey", str(db / "ca.key"), "--dn", f"C=CH, O=espgate test, CN={name}.example",
                "--san", f"{name}.example", "--lifetime", "30", "--outform", "pem", out=db / f"{name}.crt")
        for f in ("moon.key", "moon.crt", "ca.crt"):
            shutil.copy(db / f, da / f)
            (da / f).chmod(0o600)
        ike_auth = ('auth = "pubkey"\nprivate_key = "moon.key"\ncert = "moon.crt"\nca = "ca.crt"\n'
                    'local_id = "moon.example"\nremote_id = "sun.example"')
        # swanctl loads private keys from the ecdsa/ folder next to its
        # swanctl.conf (strongSwan >= 5.7.2).
        (db / "ecdsa").mkdir()
        shutil.copy(db / "sun.key", db / "ecdsa" / "sun.key")
        sw_local = f"auth = pubkey\n      certs = {db / 'sun.crt'}\n      id = sun.example"
        sw_remote = f"auth = pubkey\n      cacerts = {db / 'ca.crt'}\n      id = moon.example"
        secrets = ""
    cfg = da / "gw.toml"
    cfg.write_text(f"""[gateway]
tun = "tunA"
tun_address = ["10.1.0.1/24"]
listen = "0.0.0.0:4500"
encap = "udp"
control_socket = "ctl.sock"
state_dir = "state"
log = "debug"
{extra_gw}

[[connection]]
name = "sun"
local = "{a_addr}"
remote = "{b_addr}"
mode = "tunnel"
local_ts = ["10.1.0.0/24"]
remote_ts = ["{remote_ts}"]
{extra_conn}

[connection.ike]
proposals = ["{proposals}"]
esp_proposals = ["{esp_proposals}"]
{ike_auth}
{ike_extra}
""")
    cfg.chmod(0o600)
    daemon = Daemon(lab, a_ns, cfg, da / "ctl.sock", da / "log")
    charon = Charon(lab, b_ns, db)
    sw_children = "\n".join(f"""      {name} {{
        local_ts = {lts}
        remote_ts = 10.1.0.0/24
        esp_proposals = {esp_proposals}
        mode = tunnel
        {charon_child}
      }}""" for name, lts in (charon_children or [("net", "10.2.0.1/32")]))
    charon.write(f"""connections {{
  moon {{
    version = 2
    local_addrs = {charon_local.format(b_addr=b_addr)}
    remote_addrs = {a_addr}
    proposals = {proposals}
    encap = yes
    {charon_conn}
    local {{
      {sw_local}
    }}
    remote {{
      {sw_remote}
    }}
    children {{
{sw_children}
    }}
  }}
}}
{secrets}""", retransmit)
    return daemon, charon


def logs(d, c):
    return f"--- espgate ---\n{d.log_text()[-5000:]}\n--- charon ---\n{c.log_text()[-5000:]}"


def assert_traffic(d, c):
    r = ping(d.ns, "10.2.0.1", "10.1.0.1")
    assert r.returncode == 0, f"ping A -> B: {r.stdout}\n{logs(d, c)}"
    r = ping(c.ns, "10.1.0.1", "10.2.0.1")
    assert r.returncode == 0, f"ping B -> A: {r.stdout}\n{logs(d, c)}"


def charon_established(c):
    s = c.list_sas()
    return "ESTABLISHED" in s and "INSTALLED" in s


@pytest.mark.parametrize("proposals,esp,chosen", [
    ("aes128gcm16-prfsha256-x25519", "aes128gcm16", "aes128gcm16-prfsha256-x25519"),
    ("aes256-sha256-modp2048", "aes256-sha256", "aes256-sha256-prfsha256-modp2048")])
def test_espgate_initiates_psk(lab, proposals, esp, chosen):
    d, c = setup(lab, proposals=proposals, esp_proposals=esp, ike_extra='start_action = "start"')
    c.start()
    d.start()
    wait_for("the IKE SA", lambda: established(d) and charon_established(c), 30, (d,))
    assert_traffic(d, c)
    sa = ike_status(d)["sas"][0]
    assert sa["algorithms"] == chosen and sa["nat"], sa
    assert sa["children"][0]["algorithms"] == esp
    listed = c.list_sas()
    assert "moon.example" in listed and "INSTALLED, TUNNEL-in-UDP" in listed, listed
    # The data plane counted the pings on the negotiated SAs.
    assert d.sas("in")[0]["packets"] >= 6 and d.sas("out")[0]["packets"] >= 6
    # espgate deletes; strongSwan follows.
    ctl(d, "terminate", "sun")
    wait_for("strongSwan to drop the SA", lambda: "ESTABLISHED" not in c.list_sas(), 15, (d,))
    assert d.stop() == 0


def test_per_cpu_sas_fall_back_to_one_child_with_strongswan(lab):
    """RFC 9611 against a peer that does not announce it (strongSwan 5.9):
    espgate asks for per-CPU children with SA_RESOURCE_INFO, gets one child
    without the notify, says so, and both workers send on that child."""
    d, c = setup(lab, ike_extra='start_action = "start"', extra_gw="workers = 2", extra_conn="per_cpu_sas = 2")
    c.start()
    d.start()
    wait_for("the IKE SA", lambda: established(d) and charon_established(c), 30, (d,))
    assert_traffic(d, c)
    wait_for("the log line", lambda: "did not announce SA_RESOURCE_INFO" in d.log_text(), 10, (d,))
    assert len(children(d)) == 1, ike_status(d)
    assert len(d.sas("out")) == 1 and len(d.sas("in")) == 1, d.status()["connections"]
    assert c.list_sas().count("INSTALLED") == 1, c.list_sas()
    assert d.sas("in")[0]["packets"] >= 6 and d.sas("out")[0]["packets"] >= 6
    assert d.stop() == 0


def sent(d, spi):
    """Packets espgate sent on its outbound SA `spi`."""
    return next((sa["packets"] for sa in d.sas("out") if sa["spi"] == spi), None)


def charon_opens_one_and_two(d, c):
    """Starts both sides and has charon open its children "one" and "two"
    on one IKE SA; waits until espgate has both."""
    c.start()
    d.start()
    for child in ("one", "two"):
        r = c.swanctl_cmd("--initiate", "--child", child, timeout=60)
        assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{logs(d, c)}"
    wait_for("two children", lambda: len(children(d)) == 2, 15, (d,))


def each_host_on_its_child(d, c, kids, both_ways=False):
    """Pings 10.2.0.1 and 10.2.0.2 from A (and back, with `both_ways`):
    each host's packets leave on the outbound SA of the child whose
    remote_ts is that host."""
    for host in ("10.2.0.1", "10.2.0.2"):
        child = next(ch for ch in kids if ch["remote_ts"] == [host])
        before = sent(d, child["spi_out"])
        r = ping(d.ns, host, "10.1.0.1")
        assert r.returncode == 0, f"ping A -> {host}: {r.stdout}\n{logs(d, c)}"
        assert sent(d, child["spi_out"]) >= before + 3, (host, d.sas("out"))
        if both_ways:
            r = ping(c.ns, "10.1.0.1", host)
            assert r.returncode == 0, f"ping B -> A from {host}: {r.stdout}\n{logs(d, c)}"


def test_strongswan_children_with_narrowed_selectors_each_carry_their_own_traffic(lab):
    """One espgate connection for 10.2.0.0/24; charon keeps two children
    on one IKE SA, for 10.2.0.1 and 10.2.0.2. espgate narrows each child to
    its host and keeps both outbound SAs: pings to each host go out on that
    host's child (charon would drop them on the other), and a third
    address, which no child covers, is dropped here as no_sa."""
    d, c = setup(lab, remote_ts="10.2.0.0/24",
                 charon_children=[("one", "10.2.0.1/32"), ("two", "10.2.0.2/32")])
    charon_opens_one_and_two(d, c)
    kids = children(d)
    assert sorted(ch["remote_ts"] for ch in kids) == [["10.2.0.1"], ["10.2.0.2"]], kids
    assert len(d.sas("out")) == 2, d.status()["connections"]
    each_host_on_its_child(d, c, kids)
    r = ping(c.ns, "10.1.0.1", "10.2.0.2")
    assert r.returncode == 0, f"ping B -> A from 10.2.0.2: {r.stdout}\n{logs(d, c)}"
    before = d.status()["drops"].get("no_sa", 0)
    r = ping(d.ns, "10.2.0.3", "10.1.0.1")
    assert r.returncode != 0
    assert d.status()["drops"].get("no_sa", 0) >= before + 3, d.status()["drops"]
    assert "outside the traffic selectors the peer agreed to" in d.log_text()
    # charon deletes one child: the other still carries its traffic.
    r = c.swanctl_cmd("--terminate", "--child", "one", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for("espgate to drop the child", lambda: len(children(d)) == 1, 15, (d,))
    assert len(d.sas("out")) == 1, d.sas("out")
    r = ping(d.ns, "10.2.0.2", "10.1.0.1")
    assert r.returncode == 0, f"ping A -> 10.2.0.2: {r.stdout}\n{logs(d, c)}"
    assert d.stop() == 0


def test_espgate_asks_for_a_child_per_selector_set(lab):
    """espgate's connection has two selector sets (10.2.0.1 and, in a
    [[connection.ike.child]] table, 10.2.0.2); charon has a child for
    each. espgate opens the first with IKE_AUTH and the second with a
    CREATE_CHILD_SA on the same IKE SA; each host's traffic goes on its own
    child. charon closes the second: `espgate initiate` opens that one
    again, and only that one."""
    d, c = setup(lab, ike_extra='start_action = "start"\n[[connection.ike.child]]\nremote_ts = ["10.2.0.2/32"]',
                 charon_children=[("one", "10.2.0.1/32"), ("two", "10.2.0.2/32")])
    c.start()
    d.start()
    wait_for("two children", lambda: len(children(d)) == 2 and charon_established(c), 30, (d,))
    kids = children(d)
    assert sorted(ch["remote_ts"] for ch in kids) == [["10.2.0.1"], ["10.2.0.2"]], kids
    sw = c.list_sas()
    assert sw.count("INSTALLED") == 2 and "one:" in sw and "two:" in sw, sw
    assert len(ike_status(d)["sas"]) == 1, ike_status(d)
    each_host_on_its_child(d, c, kids, both_ways=True)
    r = c.swanctl_cmd("--terminate", "--child", "two", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for("espgate to drop the second child", lambda: len(children(d)) == 1, 15, (d,))
    assert children(d)[0]["remote_ts"] == ["10.2.0.1"], children(d)
    ctl(d, "initiate", "sun")
    wait_for("the second child again", lambda: len(children(d)) == 2 and "two:" in c.list_sas(), 20, (d,))
    r = ping(d.ns, "10.2.0.2", "10.1.0.1")
    assert r.returncode == 0, f"ping A -> 10.2.0.2: {r.stdout}\n{logs(d, c)}"
    counters = ike_status(d)["counters"]
    assert counters.get("children_established", 0) == 3, counters
    assert counters.get("child_failed", 0) == 0, counters
    assert d.stop() == 0


def test_strongswan_children_land_in_espgates_selector_sets(lab):
    """espgate as responder with two selector sets (10.2.0.1, and 10.2.0.2
    in a [[connection.ike.child]] table); charon opens a child for each on
    one IKE SA, and a third for 10.2.0.3, which no set covers. Each of the
    first two is installed with its set's selectors and carries its host's
    traffic; the third gets TS_UNACCEPTABLE and leaves the others up."""
    d, c = setup(lab, ike_extra='[[connection.ike.child]]\nremote_ts = ["10.2.0.2/32"]',
                 charon_children=[("one", "10.2.0.1/32"), ("two", "10.2.0.2/32"), ("three", "10.2.0.3/32")])
    charon_opens_one_and_two(d, c)
    r = c.swanctl_cmd("--initiate", "--child", "three", "--timeout", "20", timeout=40)
    assert r.returncode != 0, f"{r.stdout}{r.stderr}"
    counters = ike_status(d)["counters"]
    assert counters.get("ts_unacceptable", 0) == 1, counters
    assert "do not meet ours" in d.log_text()
    kids = children(d)
    assert len(ike_status(d)["sas"]) == 1 and len(kids) == 2, ike_status(d)
    assert sorted(ch["remote_ts"] for ch in kids) == [["10.2.0.1"], ["10.2.0.2"]], kids
    each_host_on_its_child(d, c, kids)
    assert d.stop() == 0


def test_espgate_installs_the_selectors_strongswan_narrowed(lab):
    """espgate proposes 10.2.0.0/24, charon narrows to 10.2.0.1: espgate
    sends only what the child covers and drops the rest as no_sa."""
    d, c = setup(lab, remote_ts="10.2.0.0/24", ike_extra='start_action = "start"')
    c.start()
    d.start()
    wait_for("the IKE SA", lambda: established(d) and charon_established(c), 30, (d,))
    assert children(d)[0]["remote_ts"] == ["10.2.0.1"], ike_status(d)
    assert_traffic(d, c)
    out = d.sas("out")[0]["packets"]
    r = ping(d.ns, "10.2.0.2", "10.1.0.1")
    assert r.returncode != 0
    assert d.sas("out")[0]["packets"] == out, "nothing outside the child was sent"
    assert d.status()["drops"].get("no_sa", 0) >= 3, d.status()["drops"]
    assert d.stop() == 0


def test_strongswan_initiates_psk_modp2048(lab):
    d, c = setup(lab, proposals="aes256-sha256-modp2048", esp_proposals="aes256-sha256")
    c.start()
    d.start()
    r = c.swanctl_cmd("--initiate", "--child", "net", timeout=60)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{logs(d, c)}"
    wait_for("the IKE SA", lambda: established(d), 15, (d,))
    assert not ike_status(d)["sas"][0]["initiator"]
    assert_traffic(d, c)
    # strongSwan deletes; espgate follows.
    r = c.swanctl_cmd("--terminate", "--ike", "moon", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for("espgate to drop the SA", lambda: not ike_status(d)["sas"], 15, (d,))
    assert d.sas("in") == [] and d.sas("out") == []
    assert d.stop() == 0


@pytest.mark.parametrize("initiator", ["espgate", "strongswan"])
def test_ecdsa_certificates(lab, initiator):
    d, c = setup(lab, auth="pubkey",
                 ike_extra='start_action = "start"' if initiator == "espgate" else "")
    c.start()
    d.start()
    if initiator == "strongswan":
        r = c.swanctl_cmd("--initiate", "--child", "net", timeout=60)
        assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{logs(d, c)}"
    wait_for("the IKE SA", lambda: established(d) and charon_established(c), 30, (d,))
    assert ike_status(d)["sas"][0]["peer_id"] == "sun.example"
    assert_traffic(d, c)
    costs = {x["op"]: x for x in ike_status(d)["costs"]}
    assert costs["auth_create"]["count"] == 1 and costs["auth_verify"]["count"] == 1, costs
    assert d.stop() == 0


def test_rekeys_under_a_running_transfer(lab):
    """espgate rekeys the child SA every 4 s and the IKE SA every 9 s while a
    ping stream runs; strongSwan rekeys its side too (child every 7 s)."""
    d, c = setup(lab, esp_proposals="aes128gcm16-x25519",
                 ike_extra='start_action = "start"\nchild_rekey_time = "4s"\nchild_life_time = "12s"\n'
                           'rekey_time = "9s"\njitter = "1s"',
                 charon_child="rekey_time = 7s\n        life_time = 20s\n        rand_time = 1s")
    c.start()
    d.start()
    wait_for("the IKE SA", lambda: established(d) and charon_established(c), 30, (d,))
    # 25 s of pings every 50 ms (500 packets) across the rekeys.
    r = run("ip", "netns", "exec", d.ns, PING, "-c", "500", "-i", "0.05", "-W", "2", "-I", "10.1.0.1", "10.2.0.1",
            timeout=90, check=False)
    m = re.search(r"(\d+) packets transmitted, (\d+) received", r.stdout)
    assert m, r.stdout
    sent, got = int(m.group(1)), int(m.group(2))
    counters = ike_status(d)["counters"]
    assert counters.get("child_rekeys", 0) >= 4, (counters, logs(d, c))
    assert counters.get("ike_rekeys", 0) >= 2, counters
    # strongSwan saw rekeys it did not start as well as its own.
    assert c.log_text().count("rekeyed") + c.log_text().count("rekeying") >= 2, c.log_text()[-3000:]
    print(f"\nstrongSwan rekeys: {sent} pings sent, {got} answered, {counters.get('child_rekeys')} child rekeys, "
          f"{counters.get('ike_rekeys')} IKE rekeys by espgate")
    # Make-before-break: at most a packet or two in flight at a switch.
    assert got >= sent - 2, f"{sent} sent, {got} received\n{logs(d, c)}"
    assert_traffic(d, c)
    assert len(ike_status(d)["sas"]) == 1
    assert d.stop() == 0


def ike_spis(c):
    """The (spi_i, spi_r) of each IKE SA charon lists."""
    return re.findall(r"\b([0-9a-f]{16})_i\*? ([0-9a-f]{16})_r", c.list_sas())


def test_simultaneous_ike_rekeys_with_strongswan(lab):
    """RFC 7296 §2.8.2 against strongSwan: both sides rekey the IKE SA at
    once and both see the collision. espgate's request is held back (an
    nftables rule drops A's IKE packets) until charon's rekey has reached
    espgate, so the two requests cross. espgate compares the four nonces;
    charon either does too or, when espgate's Delete of the old SA reaches
    it before espgate's (dropped) answer, abandons its own rekey. Either
    way one new IKE SA stays on both sides, with the child, and traffic
    flows. When espgate's rekey wins, the peer's redundant SA lingers for
    the grace period (charon never made it), so settling takes ~30 s."""
    d, c = setup(lab, ike_extra='start_action = "start"\nrekey_time = "8s"\njitter = "0s"')
    c.start()
    d.start()
    wait_for("the IKE SA", lambda: established(d) and charon_established(c), 30, (d,))
    before = ike_status(d)["sas"][0]["spis"]
    table = "espgate_collide"
    nft = ["ip", "netns", "exec", d.ns, "nft"]
    run(*nft, "-f", "-", input=f"add table ip {table}\n"
        f"add chain ip {table} out {{ type filter hook output priority -300; policy accept; }}\n"
        f"add rule ip {table} out udp dport {{ 500, 4500 }} counter drop\n")
    try:
        # espgate's rekey went out at 8 s and was dropped; its first
        # retransmission (1 s later) is the sign.
        wait_for("espgate's IKE rekey request", lambda: ike_status(d)["counters"].get("retransmits", 0) >= 1,
                 30, (d,))
        r = c.swanctl_cmd("--rekey", "--ike", "moon")
        assert r.returncode == 0, f"{r.stdout}{r.stderr}"
        wait_for("charon's rekey to cross espgate's", lambda: "the peer's crossed ours" in d.log_text(), 15, (d,))
    finally:
        run(*nft, "delete", "table", "ip", table, check=False)

    def settled():
        theirs = ike_spis(c)
        if not established(d) or len(theirs) != 1:
            return False
        sa = ike_status(d)["sas"][0]
        return len(sa["children"]) == 1 and re.findall(r"[0-9a-f]{16}", sa["spis"]) == list(theirs[0])
    wait_for("one IKE SA on both sides", settled, 60, (d,), explain=lambda: logs(d, c))
    counters = ike_status(d)["counters"]
    after = ike_status(d)["sas"][0]["spis"]
    verdict = "lost" if "ours lost" in d.log_text() else "won"
    print(f"\nIKE SA rekey collision with strongSwan: espgate's rekey {verdict}; {before} -> {after}; "
          f"charon: {[l for l in c.log_text().splitlines() if 'collision' in l.lower()]}")
    assert after != before
    assert counters.get("ike_rekey_collisions", 0) == 1, counters
    assert counters.get("peers_dead", 0) == 0 and counters.get("ike_failed", 0) == 0, counters
    # charon saw the collision too (it logs how it resolved it).
    assert "collision" in c.log_text().lower(), logs(d, c)
    assert_traffic(d, c)
    assert d.stop() == 0


def test_dpd_after_charon_dies_and_recovery(lab):
    d, c = setup(lab, ike_extra='start_action = "start"\ndpd_delay = "2s"\ndpd_action = "restart"\n'
                                'retransmit_timeout = "1s"\nretransmit_tries = 2')
    c.start()
    d.start()
    wait_for("the IKE SA", lambda: established(d) and charon_established(c), 30, (d,))
    assert_traffic(d, c)
    c.kill()
    # kernel-libipsec's TUN goes with the process.
    wait_for("the dead peer", lambda: ike_status(d)["counters"].get("peers_dead", 0) >= 1, 30, (d,))
    assert d.sas("in") == [] and d.sas("out") == []
    c.start()
    wait_for("the tunnel again", lambda: established(d) and charon_established(c), 60, (d,))
    assert_traffic(d, c)
    assert d.stop() == 0


def test_fragmented_ike_auth_both_ways(lab):
    """RFC 7383: with certificates and small fragment sizes on both sides
    (espgate: gateway.ike_fragment_size = 300; charon: fragment_size = 400),
    each side sends IKE_AUTH in fragments and reassembles the other's."""
    d, c = setup(lab, auth="pubkey", ike_extra='start_action = "start"', retransmit="fragment_size = 400")
    text = d.cfg.read_text().replace('log = "debug"', 'log = "debug"\nike_fragment_size = 300')
    d.cfg.write_text(text)
    c.start()
    d.start()
    wait_for("the IKE SA", lambda: established(d) and charon_established(c), 30, (d,))
    counters = ike_status(d)["counters"]
    assert counters.get("fragmented_messages_out", 0) >= 1, counters
    assert counters.get("fragmented_messages_in", 0) >= 1, counters
    assert "EF(" in c.log_text() or "fragment" in c.log_text().lower(), c.log_text()[-3000:]
    assert_traffic(d, c)
    assert d.stop() == 0



def children(d):
    sas = ike_status(d)["sas"]
    return [ch for ch in sas[0]["children"] if ch["state"] == "installed"] if sas else []


@pytest.mark.parametrize("esp", ["aes128gcm16-x25519", "aes128gcm16"])
def test_new_child_sa_on_the_established_ike_sa(lab, esp):
    """charon terminates its child and initiates it again on the same IKE
    SA: a CREATE_CHILD_SA without REKEY_SA (with PFS: KEi, and KEr back),
    which espgate must answer with Nr (RFC 7296 §1.3.1). Then the same with
    espgate creating the child (`espgate initiate` on an IKE SA without
    children)."""
    d, c = setup(lab, esp_proposals=esp, ike_extra='start_action = "start"')
    c.start()
    d.start()
    wait_for("the IKE SA", lambda: established(d) and charon_established(c), 30, (d,))
    assert_traffic(d, c)
    spis = ike_status(d)["sas"][0]["spis"]
    for creator in ("charon", "espgate"):
        r = c.swanctl_cmd("--terminate", "--child", "net", timeout=60)
        assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{logs(d, c)}"
        wait_for("espgate to drop the child", lambda: not children(d), 15, (d,))
        assert d.sas("in") == [] and d.sas("out") == [], logs(d, c)
        if creator == "charon":
            # swanctl gives up after 20 s (before the fix, charon found
            # no Nr in the answer: "payload of type NONCE not occurred").
            r = c.swanctl_cmd("--initiate", "--child", "net", "--timeout", "20", timeout=40)
            assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{logs(d, c)}"
        else:
            ctl(d, "initiate", "sun")
        wait_for(f"the child created by {creator}", lambda: len(children(d)) == 1 and charon_established(c), 20,
                 (d,))
        sas = ike_status(d)["sas"]
        assert len(sas) == 1 and sas[0]["spis"] == spis, f"not on the same IKE SA: {sas}"
        assert sas[0]["children"][0]["algorithms"] == esp, sas
        assert_traffic(d, c)
        log = c.log_text()
        assert "processing failed" not in log and "not occurred" not in log, log[-5000:]
    counters = ike_status(d)["counters"]
    assert counters.get("children_established", 0) == 3, counters
    assert counters.get("child_failed", 0) == 0, counters
    assert d.stop() == 0


def test_strongswan_moves_to_a_new_address_with_mobike(lab):
    """charon (MOBIKE's initiator) loses its address and takes another on
    the same link: it moves the IKE SA and the child SA there with
    UPDATE_SA_ADDRESSES. espgate answers (NAT detection on the new
    addresses), and its ESP follows, with the same SAs: no new handshake,
    traffic both ways. Without MOBIKE, espgate would keep sending to the
    address that is gone, and a new IKE SA from the new address would
    match no connection."""
    d, c = setup(lab, charon_conn="mobike = yes", charon_local="%any")
    b_ns = c.ns
    # Deleting the old address must keep the new one of the same prefix
    # (and its route): promote the secondary.
    run("ip", "netns", "exec", b_ns, "sysctl", "-qw", "net.ipv4.conf.vb.promote_secondaries=1")
    c.start()
    d.start()
    r = c.swanctl_cmd("--initiate", "--child", "net", timeout=60)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{logs(d, c)}"
    wait_for("the IKE SA", lambda: established(d), 15, (d,))
    before = ike_status(d)["sas"][0]
    assert before["mobike"] and not before["initiator"], before
    assert before["remote"].startswith("192.0.2.2:"), before
    assert_traffic(d, c)

    run("ip", "-n", b_ns, "addr", "add", "192.0.2.9/24", "dev", "vb")
    run("ip", "-n", b_ns, "addr", "del", "192.0.2.2/24", "dev", "vb")

    def moved():
        sas = ike_status(d)["sas"]
        return len(sas) == 1 and sas[0]["remote"].startswith("192.0.2.9:")
    wait_for("espgate's IKE SA to move to charon's new address", moved, 30, (d,),
             explain=lambda: logs(d, c))
    assert "the peer moved from 192.0.2.2:4500 to 192.0.2.9:4500 (MOBIKE" in d.log_text(), logs(d, c)
    st = ike_status(d)
    # The same IKE SA: moved, not authenticated again.
    assert st["sas"][0]["spis"] == before["spis"], (before, st)
    assert st["counters"].get("mobike_updates", 0) >= 1, st["counters"]
    # charon got espgate's answer with NAT detection on the new addresses
    # and its COOKIE2 back.
    answer = re.compile(r"parsed INFORMATIONAL response \d+ \[ N\(NATD_S_IP\) N\(NATD_D_IP\) N\(COOKIE2\) \]")
    wait_for("charon to take espgate's answer", lambda: answer.search(c.log_text()), 10, (d,),
             explain=lambda: logs(d, c))
    # The ESP follows: espgate's outbound SAs go to the new address. (With
    # kernel-libipsec charon cannot move its own SAs, so it rekeys the
    # child at once; espgate moved the old one, and makes the new one
    # there.)
    wait_for("the child SA on the new path", lambda: charon_established(c), 15, (d,))
    out = d.sas("out")
    assert out and all(sa.get("peer") == "192.0.2.9" for sa in out), out
    text = ctl(d, "status").stdout
    assert "192.0.2.1 -> 192.0.2.2:4500 (now 192.0.2.9:4500)" in text, text
    assert "192.0.2.9:4500 (NAT-T, MOBIKE)" in text, text
    assert_traffic(d, c)
    assert d.stop() == 0
