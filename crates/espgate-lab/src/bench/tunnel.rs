//! `espgate bench tunnel`: iperf3 between two sites in network namespaces,
//! through plain routing, through two espgate gateways and, on request,
//! through other VPNs (wireguard-go at a pinned current version and
//! Debian's 2022 build, boringtun, strongSwan with its userspace ESP,
//! OpenVPN), all in one run on the same topology ([`crate::netlab`]).
//!
//! The systems are measured in `--runs` rounds: in each round every system
//! in turn gets a fresh topology (namespaces made anew), is brought up,
//! checked with ping, runs every test once and is taken down. Interleaving
//! the systems this way keeps a drift in the shared host's load from
//! falling on one system only. A row per system and test gives the
//! median, minimum and maximum of the receiver's throughput, for UDP the
//! delivered packet rate and the loss, the ratio to plain routing's median
//! of the same test in the same run, and the CPU of the gateway processes
//! (every process in the two gateway namespaces) during the test. Every
//! row says which version of its system was measured. Below the table,
//! espgate's run is also set against each other system's run of the same
//! round ([`paired_ratios`]), round by round: on a host whose load drifts,
//! those pairs, taken back to back, show how much one run can be trusted.
//!
//! A system that fails to come up is reported as failed, with the reason,
//! and the run goes on with the others.

use crate::netlab::{
    self, find_on_path, in_ns, ip, on_path, random_hex, require_root, run, run_timeout,
    run_timeout_raw, write_private, Lab, Topology, GW_A, GW_B, HOST_B, NET_A, NET_B,
};
use anyhow::{anyhow, bail, ensure, Context, Result};
use espgate_api::table::{Column, Table};
use espgate_config::schema::Encapsulation;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The tests run when `--tests` is not given.
pub const DEFAULT_TESTS: [&str; 4] = ["tcp", "udp64", "udp512", "udp1400"];
/// The VPNs `--peers` knows.
pub const PEERS: [&str; 5] = [
    "wireguard-go",
    "wireguard-go-debian",
    "boringtun",
    "strongswan",
    "openvpn",
];

/// The wireguard-go that peer `wireguard-go` builds: the newest version of
/// the Go module golang.zx2c4.com/wireguard on the Go module proxy
/// (`@latest`, 2026-05-22). The project tags no semantic versions, so the
/// proxy knows it by this pseudo-version.
pub const WIREGUARD_GO_VERSION: &str = "v0.0.0-20260522210424-ecfc5a8d5446";
/// The Go module that is wireguard-go.
const WIREGUARD_GO_MODULE: &str = "golang.zx2c4.com/wireguard";
/// The oldest Go that builds [`WIREGUARD_GO_VERSION`]: its go.mod asks
/// for go 1.23.1, which Go 1.21 and later fetch by themselves.
const WIREGUARD_GO_MIN_GO: (u32, u32) = (1, 21);
/// The boringtun that peer `boringtun` builds: the crate boringtun-cli,
/// the newest release on crates.io.
pub const BORINGTUN_VERSION: &str = "0.7.1";
/// Where peers built from source are kept, in one directory per name and
/// version (`wireguard-go-VERSION`, `boringtun-VERSION`), reused by later
/// runs.
pub const PEER_CACHE: &str = "/var/cache/espgate/peers";

const USAGE: &str = "\
Examples:
  espgate bench tunnel                      plain routing and espgate, all four tests, 3 runs of 10 s
  espgate bench tunnel --peers wireguard-go,boringtun,strongswan,openvpn
  espgate bench tunnel --peers wireguard-go,wireguard-go-debian --tests tcp
  espgate bench tunnel --tests tcp --runs 5 --mtu 9000 --offloads off --json

Topology (network namespaces <prefix>-ha, -ga, -gb, -hb, made anew for each system and round):
  host A 10.1.0.10 -- 10.1.0.1 gateway A 192.0.2.1 -- 192.0.2.2 gateway B 10.2.0.1 -- 10.2.0.10 host B
iperf3 runs from host A to host B. Tests: tcp is one TCP stream (iperf3 -t TIME); udpN sends
N-byte UDP payloads as fast as iperf3 can (-u -l N -b 0) and reports what the RECEIVER got:
its Mbit/s, packets per second and loss %. The runs are rounds: each round brings up every
system in turn and runs each test once on it, so a drift in the host's load during the bench
falls on all systems alike (--json gives each run's start time and round). Each row: median,
min and max over the runs, the ratio of the median to plain routing's median of the same test
in this run, and the CPU of each gateway process (median over the runs, % of one core;
NAME@gwA / NAME@gwB), and the efficiency figure CPU s/Gbit: the gateway processes' CPU
seconds (both sides) per gigabit delivered, fair on a small machine where the systems
saturate the CPUs, not the link. Kernel work done for a gateway outside its process
(softirq receive) is not in it. Below the table, with two rounds or more, espgate's run over
each other system's run of the same round, round by round, and their median: runs taken back
to back, so a drift of the host's load between rounds drops out of each ratio, and the spread
of the ratios shows how far one run can be trusted; a pair where either run had more than 10 %
CPU steal (time the hypervisor gave other guests) is marked with *.

Systems: plain (kernel forwarding, no encryption); espgate (two `espgate up` with generated
manual keys, ESP-in-UDP or with --encap none raw ESP, --suite); with --peers:
  wireguard-go         userspace WireGuard, current: golang.zx2c4.com/wireguard at a pinned
                       version (v0.0.0-20260522210424-ecfc5a8d5446), built with go install
                       (Go 1.21 or later; Debian's golang-go is tried when there is no go)
  wireguard-go-debian  Debian's package wireguard-go 0.0.20220316, the 2022 build without
                       the TUN offloads of 2023 and later: to compare with, not to judge by
  boringtun            Cloudflare's userspace WireGuard in Rust: boringtun-cli 0.7.1 from
                       crates.io, built with cargo install --locked
  strongswan           charon with kernel-libipsec: IKEv2 PSK, userspace ESP-in-UDP, aes128gcm16
  openvpn              2.6 userspace, UDP, p2p TLS with self-signed certificates, AES-128-GCM
The WireGuard peers are configured with wg (wireguard-tools). Missing Debian packages are
installed with apt-get; the built peers are kept in /var/cache/espgate/peers/NAME-VERSION/
and reused (the first build takes minutes). A system that cannot be installed or built, or
fails to come up, is reported as failed with the reason (and its log's last lines) and the
others still run; the exit status is then 1. Each system's version is printed above the
table: the kernel's (uname -r) for plain, the gateway binary's for espgate, the pinned one
for wireguard-go and boringtun, the Debian package's for wireguard-go-debian, charon's for
strongswan and openvpn --version's for openvpn.

Knobs: --mtu sets the MTU of every veth link (espgate's gateway.mtu follows; the WireGuard
peers use MTU-80; openvpn gets --tun-mtu MTU-100 when it is not 1500). --offloads, --workers,
--batch, --sockbuf, --mss-clamp and --encap set espgate's gateway.offloads,
gateway.workers, gateway.batch, gateway.socket_buffer and the connection's mss_clamp
(\"auto\" or \"off\") and encap (\"udp\" or \"none\");
those not given are left at espgate's defaults. --pin binds iperf3's client and server to
CPU 0 (iperf3 -A) and every gateway process of every system to the other CPUs (taskset,
before each run), so each system runs on the same CPUs. --iperf-window BYTES gives iperf3's
sockets of every system buffers of that size (-w, both ends; at most net.core.rmem_max): a
receiver whose default buffer overflows when datagrams arrive in bursts loses them, and a run
with and one without shows how much of a UDP test's loss that is. --udp-rate MBITS sends the
UDP tests at that rate (iperf3 -b MBITSM) instead of as fast as iperf3 can, for every system
alike: an unlimited sender takes a whole CPU, and more than that when it costs it less per
datagram, as it does into a gateway's TUN than into the kernel's forwarding; at plain routing's
own rate every system gets the same offered load. All are in the header and in each JSON row's
\"settings\".

Scaling over cores (gateway.workers 1..N) needs more CPUs than this 2-vCPU machine has, and
more than one flow: a TUN queue, and so a worker, carries a whole flow. On a bigger host run
--tests tcp,tcp16 --pin --workers N --per-cpu-sas N for N = 1, 2, 4, ... (tcp16: 16 TCP
streams at once, iperf3 -P 16; --per-cpu-sas N: one SA pair per worker, so no sequence
counter is shared) and compare median Mbit/s and CPU s/Gbit between the runs
(docs/PERFORMANCE.md, \"The scaling curve on a bigger host\").

--json prints one JSON list of rows: system, version, suite (espgate), test, runs, runs_mbps,
runs_started_s (each run's start, seconds into the bench), runs_round (each run's round,
1..N), runs_retransmits (tcp: the sender's retransmitted segments per run), runs_steal_percent
(each run's CPU steal: time the hypervisor gave other guests, % of all CPU time, from
/proc/stat; summed up per system under the table), runs_host_b_drops_pps and
runs_gateway_b_drops_pps (udp: each run's datagrams/s dropped for a full socket buffer in host
B's namespace, the receiving iperf3, and in gateway B's, from /proc/net/snmp), median_sent_pps
(udp: what iperf3 sent), median_reached_pps and reached_ratio_to_plain (udp: delivered plus
host B's drops, what reached its socket), median_mbps, min_mbps, max_mbps, median_pps and
loss_percent (UDP; null for tcp), ratio_to_plain, paired_ratio_to_plain (the median over the
rounds of the row's run / plain routing's run of the same round), cpu {process: %},
cpu_s_per_gbit, error (null unless it failed), settings, and for espgate with an AES-GCM suite
aes_gcm (the library that ran it, aws-lc or ring, also shown after the suite above the table).

Needs root, iproute2, ping and iperf3. Removes everything it made (namespaces, processes,
its work directory), also on error and on Ctrl-C; a progress line is shown on stderr when
it is a terminal. A full run with all five peers takes about 17 minutes.";

/// The options of `espgate bench tunnel`.
#[derive(clap::Args, Debug, Clone)]
#[command(after_long_help = USAGE)]
pub struct Args {
    /// Tests, comma-separated: tcp, udp64, udp512, udp1400 (udpN: N-byte UDP
    /// payloads; tcpN: N TCP streams at once, 2-64) [default: tcp and the
    /// three UDP sizes].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub tests: Vec<String>,
    /// Rounds: each brings up every system in turn and runs each test once.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub runs: usize,
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 10, value_name = "S")]
    pub time: u32,
    /// espgate's suites (strongSwan keywords), comma-separated: one espgate
    /// system each.
    #[arg(long, value_delimiter = ',', default_value = "aes128gcm16")]
    pub suite: Vec<String>,
    /// Other VPNs to measure, comma-separated: wireguard-go (current, built
    /// from its Go module at a pinned version), wireguard-go-debian
    /// (Debian's 2022 build), boringtun (built with cargo install),
    /// strongswan, openvpn. Debian packages are installed with apt-get when
    /// missing; the built ones are kept in /var/cache/espgate/peers.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub peers: Vec<String>,
    /// One JSON list of rows on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Prefix of the namespace names [default: egbench-PID].
    #[arg(long, value_name = "P")]
    pub prefix: Option<String>,
    /// MTU of every veth link (e.g. 1500 or 9000); espgate's gateway.mtu
    /// follows.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(1280..=65535))]
    pub mtu: u32,
    /// espgate's gateway.offloads.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub offloads: String,
    /// espgate's gateway.workers [default: espgate's].
    #[arg(long, value_name = "N")]
    pub workers: Option<u32>,
    /// espgate's per_cpu_sas on the connection (1-64): this many SA
    /// pairs, one per worker [default: espgate's, 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub per_cpu_sas: Option<u32>,
    /// espgate's gateway.batch [default: espgate's].
    #[arg(long, value_name = "N")]
    pub batch: Option<u32>,
    /// espgate's gateway.socket_buffer, bytes [default: espgate's].
    #[arg(long, value_name = "BYTES")]
    pub sockbuf: Option<u64>,
    /// espgate's MSS clamp: on ("auto") or off.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub mss_clamp: String,
    /// espgate's encapsulation: udp (ESP in UDP, RFC 3948) or none (raw
    /// ESP, IP protocol 50, as between gateways without NAT).
    #[arg(long, default_value = "udp", value_parser = ["udp", "none"])]
    pub encap: String,
    /// Also measure espgate while a monitor asks both gateways for their
    /// status and scrapes their metrics endpoint this many times a second
    /// (runs alternate with and without, on the same gateways); 0: never.
    #[arg(long, default_value_t = 0, value_name = "HZ", value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub scrape: u32,
    /// Pin the processes: iperf3's client and server on CPU 0, every
    /// gateway process (both sides) on the other CPUs, so that each system
    /// gets the same CPUs and the CPU seconds per gigabit compare fairly.
    #[arg(long)]
    pub pin: bool,
    /// iperf3's socket buffers (-w, both ends), bytes, for every system
    /// alike [default: the kernel's]. Up to net.core.rmem_max and
    /// wmem_max; what a receiver's default buffer loses of a bursty
    /// arrival shows as the difference to a run without it.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(4096..=1 << 30))]
    pub iperf_window: Option<u32>,
    /// The UDP tests' sending rate, Mbit/s of payload (iperf3 -b), for
    /// every system alike [default: as fast as iperf3 can send]. An
    /// unlimited sender's CPU is taken from the receiver on a small
    /// machine; a fixed rate gives each system the same offered load.
    #[arg(long, value_name = "MBITS", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub udp_rate: Option<u32>,
    /// The espgate binary the gateways run [default: this one], e.g. an
    /// older build to compare with.
    #[arg(long, value_name = "PATH")]
    pub gateway_binary: Option<PathBuf>,
    /// Also measure a userspace relay, without and with AES-GCM (TCP
    /// tests only): TUN super-segments carried whole over UDP GSO/GRO, the
    /// work the kernel does for any userspace UDP tunnel and nothing else
    /// (`relay`), then that plus one AES-GCM seal per packet's worth in
    /// the gateways' library (`relay-gcm`). Their ratios to plain routing
    /// are the ceilings of such a tunnel here, without and with
    /// encryption. Not VPNs.
    #[arg(long)]
    pub relay: bool,
}

/// One test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// One TCP stream.
    Tcp,
    /// This many TCP streams at once (iperf3 -P, 2 to 64): several flows,
    /// which a multi-queue TUN spreads over the gateway's workers.
    TcpStreams(u32),
    /// UDP with payloads of this many bytes, unlimited rate.
    Udp(u32),
}

impl Test {
    /// `tcp`, `udp512`.
    pub fn name(&self) -> String {
        match self {
            Test::Tcp => "tcp".into(),
            Test::TcpStreams(n) => format!("tcp{n}"),
            Test::Udp(n) => format!("udp{n}"),
        }
    }

    /// Parses `tcp`, `tcpN` or `udpN`.
    pub fn parse(s: &str) -> Result<Test> {
        let s = s.trim();
        if s == "tcp" {
            return Ok(Test::Tcp);
        }
        if let Some(n) = s.strip_prefix("tcp") {
            let n = n
                .parse::<u32>()
                .ok()
                .filter(|n| (2..=64).contains(n))
                .ok_or_else(|| anyhow!("--tests {s}: tcpN runs N TCP streams at once, 2 to 64"))?;
            return Ok(Test::TcpStreams(n));
        }
        let n = s
            .strip_prefix("udp")
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| {
                anyhow!("--tests {s}: tcp, tcpN or udpN (e.g. tcp4, udp64, udp512, udp1400)")
            })?;
        ensure!(
            (16..=65507).contains(&n),
            "--tests {s}: UDP payloads of 16 to 65507 bytes"
        );
        Ok(Test::Udp(n))
    }

    /// iperf3 client arguments for a run of `s.time_s` seconds, with
    /// socket buffers of `s.iperf_window` bytes (-w; the server takes
    /// them from the client) when given, and UDP sent at `s.udp_rate_mbps`
    /// (else unlimited).
    fn client_args(&self, s: &Settings) -> Vec<String> {
        let mut a = vec!["-t".to_string(), s.time_s.to_string()];
        if let Some(w) = s.iperf_window {
            a.extend(["-w".to_string(), w.to_string()]);
        }
        match self {
            Test::Tcp => {}
            Test::TcpStreams(n) => a.extend(["-P".to_string(), n.to_string()]),
            Test::Udp(n) => {
                let rate = s.udp_rate_mbps.map_or("0".to_string(), |r| format!("{r}M"));
                a.extend(["-u", "-l", &n.to_string(), "-b", &rate].map(String::from));
            }
        }
        a.extend(["--connect-timeout", "5000"].map(String::from));
        a
    }
}

/// Another VPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// wireguard-go (userspace WireGuard) at [`WIREGUARD_GO_VERSION`],
    /// built from its Go module.
    WireguardGo,
    /// Debian's package of wireguard-go (0.0.20220316, a 2022 build).
    WireguardGoDebian,
    /// boringtun (Cloudflare's userspace WireGuard) at
    /// [`BORINGTUN_VERSION`], built from crates.io.
    Boringtun,
    /// strongSwan's charon with kernel-libipsec.
    Strongswan,
    /// OpenVPN 2.6.
    Openvpn,
}

/// A daemon's command line (program first) and environment variables.
pub type DaemonCommand = (Vec<String>, Vec<(&'static str, &'static str)>);

/// The tool that builds a peer from source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builder {
    /// `go install MODULE@VERSION`.
    Go,
    /// `cargo install CRATE --version VERSION`.
    Cargo,
}

impl Builder {
    /// Its command's name.
    pub fn name(&self) -> &'static str {
        match self {
            Builder::Go => "go",
            Builder::Cargo => "cargo",
        }
    }
}

/// How a peer is built from source at a pinned version, into its own
/// directory of [`PEER_CACHE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceBuild {
    /// What builds it.
    pub builder: Builder,
    /// The Go module or the crate.
    pub package: &'static str,
    /// The pinned version.
    pub version: &'static str,
    /// Its directory: `CACHE/NAME-VERSION`.
    pub dir: PathBuf,
    /// The binary, relative to `dir`.
    pub binary: &'static str,
}

impl SourceBuild {
    /// The binary once built.
    pub fn binary_path(&self) -> PathBuf {
        self.dir.join(self.binary)
    }

    /// The build command that leaves the binary under `root` (the cache
    /// directory, or a scratch one renamed to it afterwards): its
    /// arguments, the builder's name first, and the variables it needs.
    pub fn command(&self, root: &Path) -> (Vec<String>, Vec<(String, String)>) {
        let root = root.to_string_lossy().into_owned();
        match self.builder {
            Builder::Go => (
                vec![
                    "go".into(),
                    "install".into(),
                    format!("{}@{}", self.package, self.version),
                ],
                vec![("GOBIN".into(), root)],
            ),
            Builder::Cargo => (
                [
                    "cargo",
                    "install",
                    self.package,
                    "--version",
                    self.version,
                    "--locked",
                    "--root",
                    &root,
                ]
                .map(String::from)
                .to_vec(),
                Vec::new(),
            ),
        }
    }
}

impl Peer {
    /// Parses a `--peers` name.
    pub fn parse(s: &str) -> Result<Peer> {
        match s.trim() {
            "wireguard-go" => Ok(Peer::WireguardGo),
            "wireguard-go-debian" => Ok(Peer::WireguardGoDebian),
            "boringtun" => Ok(Peer::Boringtun),
            "strongswan" => Ok(Peer::Strongswan),
            "openvpn" => Ok(Peer::Openvpn),
            o => bail!("--peers {o}: one of {}", PEERS.join(", ")),
        }
    }

    /// Its name in the rows.
    pub fn name(&self) -> &'static str {
        match self {
            Peer::WireguardGo => "wireguard-go",
            Peer::WireguardGoDebian => "wireguard-go-debian",
            Peer::Boringtun => "boringtun",
            Peer::Strongswan => "strongswan",
            Peer::Openvpn => "openvpn",
        }
    }

    /// What it is, beside its version above the table.
    pub fn about(&self) -> &'static str {
        match self {
            Peer::WireguardGo => "golang.zx2c4.com/wireguard, built with go install",
            Peer::WireguardGoDebian => "Debian's 2022 build, without the TUN offloads of 2023+",
            Peer::Boringtun => "boringtun-cli from crates.io, built with cargo install",
            Peer::Strongswan => "charon with kernel-libipsec",
            Peer::Openvpn => "userspace, no DCO",
        }
    }

    /// Debian packages it needs.
    fn packages(&self) -> &'static [&'static str] {
        match self {
            Peer::WireguardGo | Peer::Boringtun => &["wireguard-tools"],
            Peer::WireguardGoDebian => &["wireguard-go", "wireguard-tools"],
            Peer::Strongswan => &[
                "strongswan-charon",
                "strongswan-swanctl",
                "libcharon-extra-plugins",
                "libstrongswan-standard-plugins",
            ],
            Peer::Openvpn => &["openvpn", "openssl"],
        }
    }

    /// How it is built from source, with `cache` for [`PEER_CACHE`]
    /// (`None`: Debian's package is used).
    pub fn source_build(&self, cache: &Path) -> Option<SourceBuild> {
        let (builder, package, version, binary) = match self {
            Peer::WireguardGo => (
                Builder::Go,
                WIREGUARD_GO_MODULE,
                WIREGUARD_GO_VERSION,
                // go install names it after the module path's last element.
                "wireguard",
            ),
            Peer::Boringtun => (
                Builder::Cargo,
                "boringtun-cli",
                BORINGTUN_VERSION,
                "bin/boringtun-cli",
            ),
            _ => return None,
        };
        Some(SourceBuild {
            builder,
            package,
            version,
            dir: cache.join(format!("{}-{version}", self.name())),
            binary,
        })
    }

    /// Whether its Debian packages are installed.
    fn packages_installed(&self) -> bool {
        match self {
            Peer::WireguardGo | Peer::Boringtun => on_path("wg"),
            Peer::WireguardGoDebian => on_path("wireguard-go") && on_path("wg"),
            Peer::Strongswan => {
                charon_path().is_some()
                    && on_path("swanctl")
                    && plugin_dir().is_some_and(|d| {
                        d.join("libstrongswan-kernel-libipsec.so").exists()
                            && d.join("libstrongswan-vici.so").exists()
                    })
            }
            Peer::Openvpn => on_path("openvpn") && on_path("openssl"),
        }
    }

    /// Whether what it needs is installed (and built).
    fn installed(&self) -> bool {
        self.packages_installed()
            && self
                .source_build(Path::new(PEER_CACHE))
                .is_none_or(|b| b.binary_path().is_file())
    }

    /// What getting it ready involves, for the progress line.
    fn preparing(&self) -> &'static str {
        match self {
            Peer::WireguardGo => "building (go install) and setting up",
            Peer::Boringtun => "building (cargo install, minutes) and setting up",
            _ => "installing (apt-get) and setting up",
        }
    }

    /// The userspace WireGuard daemon for interface `iface`, in the
    /// foreground, with the built peers' binaries under `cache`: its
    /// command line and environment (`None`: not a WireGuard peer).
    pub fn wireguard_command(&self, iface: &str, cache: &Path) -> Option<DaemonCommand> {
        let foreground = vec![("WG_PROCESS_FOREGROUND", "1"), ("LOG_LEVEL", "error")];
        let binary = |p: &Peer| -> Option<String> {
            Some(
                p.source_build(cache)?
                    .binary_path()
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        match self {
            Peer::WireguardGo => Some((vec![binary(self)?, iface.into()], foreground)),
            Peer::WireguardGoDebian => {
                Some((vec!["wireguard-go".into(), iface.into()], foreground))
            }
            // As root it would drop to nobody unless told not to; its log
            // goes to stdout in the foreground.
            Peer::Boringtun => Some((
                vec![
                    binary(self)?,
                    "--foreground".into(),
                    "--disable-drop-privileges".into(),
                    iface.into(),
                ],
                vec![("WG_LOG_LEVEL", "error")],
            )),
            Peer::Strongswan | Peer::Openvpn => None,
        }
    }

    /// The version that runs here (`None`: not installed, or it does not
    /// say).
    pub fn version(&self) -> Option<String> {
        let out = |cmd: &mut Command| -> Option<String> {
            // openvpn --version exits with 1 on some releases: the output
            // counts, not the status.
            let (_, out, err) = run_timeout_raw(cmd, Duration::from_secs(10)).ok()?;
            Some(if out.trim().is_empty() { err } else { out })
        };
        match self {
            Peer::WireguardGo => Some(WIREGUARD_GO_VERSION.into()),
            Peer::Boringtun => Some(BORINGTUN_VERSION.into()),
            Peer::WireguardGoDebian => {
                let pkg = out(Command::new("dpkg-query").args([
                    "-W",
                    "-f",
                    "${Version}",
                    "wireguard-go",
                ]))
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty() && !v.contains(' '));
                pkg.or_else(|| {
                    version_after(
                        &out(Command::new("wireguard-go").arg("--version"))?,
                        "wireguard-go",
                    )
                })
            }
            Peer::Strongswan => version_after(
                &out(Command::new(charon_path()?).arg("--version"))?,
                "strongSwan",
            ),
            Peer::Openvpn => {
                version_after(&out(Command::new("openvpn").arg("--version"))?, "OpenVPN")
            }
        }
    }
}

/// The word after the first `name` in a `--version` output (`espgate
/// 0.1.0`, `Linux strongSwan 5.9.8`, `OpenVPN 2.6.14 x86_64-pc-linux-gnu
/// …`).
pub fn version_after(output: &str, name: &str) -> Option<String> {
    output.lines().find_map(|l| {
        let mut w = l.split_whitespace().skip_while(|w| *w != name);
        w.next()?;
        w.next().map(String::from)
    })
}

/// `go version`'s `go1.26.8`: (1, 26).
pub fn parse_go_version(output: &str) -> Option<(u32, u32)> {
    let v = output.split_whitespace().find_map(|w| {
        w.strip_prefix("go")
            .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
    })?;
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// What is measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum System {
    /// Kernel forwarding, no tunnel.
    Plain,
    /// Two espgate gateways with this suite.
    Espgate(String),
    /// Another VPN.
    Peer(Peer),
    /// The no-crypto userspace relay ([`super::relay`]): the ceiling.
    Relay,
    /// The relay sealing what it carries with per-packet AES-GCM: the
    /// ceiling of an encrypting userspace tunnel.
    RelayGcm,
}

impl System {
    /// Its name in the rows.
    pub fn name(&self) -> &str {
        match self {
            System::Plain => "plain",
            System::Espgate(_) => "espgate",
            System::Peer(p) => p.name(),
            System::Relay => "relay",
            System::RelayGcm => "relay-gcm",
        }
    }

    /// Whether it runs `test`: the relays are ceilings for TCP only.
    pub fn runs(&self, test: Test) -> bool {
        !(self.is_relay() && matches!(test, Test::Udp(_)))
    }

    /// One of the relays.
    pub fn is_relay(&self) -> bool {
        matches!(self, System::Relay | System::RelayGcm)
    }

    /// The version measured: the kernel's (`uname -r`) for plain
    /// routing, `exe --version`'s for espgate (the gateway binary), the
    /// peer's ([`Peer::version`]); `None` when it cannot be told.
    pub fn version(&self, exe: &Path) -> Option<String> {
        match self {
            System::Plain => run(Command::new("uname").arg("-r"))
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty()),
            System::Espgate(_) | System::Relay | System::RelayGcm => {
                let out = run_timeout(Command::new(exe).arg("--version"), Duration::from_secs(10));
                version_after(&out.ok()?, "espgate")
            }
            System::Peer(p) => p.version(),
        }
    }
}

/// What a system is, beside its version above the table.
fn about_system(name: &str) -> Option<&'static str> {
    match name {
        "plain" => Some("Linux kernel forwarding"),
        "espgate" => None,
        "relay" => Some(
            "espgate's userspace relay, no cryptography: not a VPN, the ceiling of a userspace \
             UDP tunnel here (TCP only)",
        ),
        "relay-gcm" => Some(
            "the relay sealing each packet's worth with AES-GCM (the gateways' library): still \
             not a VPN, the ceiling of an encrypting userspace UDP tunnel here (TCP only)",
        ),
        other => Peer::parse(other).ok().map(|p| p.about()),
    }
}

/// The knobs, reported with every row.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Settings {
    /// MTU of the veth links (and espgate's gateway.mtu).
    pub mtu: u32,
    /// espgate's gateway.offloads.
    pub offloads: bool,
    /// espgate's gateway.workers (`None`: espgate's default).
    pub workers: Option<u32>,
    /// espgate's per_cpu_sas (`None`: espgate's default, one pair).
    pub per_cpu_sas: Option<u32>,
    /// espgate's gateway.batch (`None`: espgate's default).
    pub batch: Option<u32>,
    /// espgate's gateway.socket_buffer in bytes (`None`: espgate's default).
    pub socket_buffer: Option<u64>,
    /// espgate's mss_clamp: `auto` (true) or `off`.
    pub mss_clamp: bool,
    /// espgate's encapsulation: `udp` (ESP in UDP) or `none` (raw ESP).
    pub encap: Encapsulation,
    /// Seconds per run.
    pub time_s: u32,
    /// Status and metrics scrapes per second during espgate's extra runs
    /// (0: none); the gateways then serve metrics on 127.0.0.1:9184.
    pub scrape_hz: u32,
    /// `--pin`: iperf3's two ends run on CPU 0, every gateway process on
    /// the other CPUs (`None`: the scheduler decides).
    pub pin: Option<Pin>,
    /// iperf3's socket buffers (-w) in bytes, every system alike (`None`:
    /// the kernel's defaults).
    pub iperf_window: Option<u32>,
    /// The UDP tests' sending rate in Mbit/s (iperf3 -b), every system
    /// alike (`None`: unlimited).
    pub udp_rate_mbps: Option<u32>,
}

/// Where `--pin` puts the processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pin {
    /// The CPU of iperf3's client and server.
    pub iperf3_cpu: usize,
    /// The CPUs of the gateway processes (taskset list, e.g. `1` or `1-3`).
    pub gateway_cpus: String,
}

impl Pin {
    /// The layout on a machine with `cpus` CPUs: iperf3 on CPU 0, the
    /// gateways on the rest; at least two CPUs are needed.
    pub fn for_cpus(cpus: usize) -> Result<Pin> {
        ensure!(
            cpus >= 2,
            "--pin needs at least 2 CPUs (iperf3 on one, the gateways on the others); this \
             machine has {cpus}"
        );
        Ok(Pin {
            iperf3_cpu: 0,
            gateway_cpus: if cpus == 2 {
                "1".into()
            } else {
                format!("1-{}", cpus - 1)
            },
        })
    }
}

impl Settings {
    /// One line for the table's header.
    pub fn describe(&self) -> String {
        let onoff = |b: bool| if b { "on" } else { "off" };
        let opt = |v: Option<String>| v.unwrap_or_else(|| "default".into());
        let pin = self.pin.as_ref().map_or(String::new(), |p| {
            format!(
                "; pinned: iperf3 on CPU {}, gateways on CPUs {}",
                p.iperf3_cpu, p.gateway_cpus
            )
        });
        let window = self
            .iperf_window
            .map_or(String::new(), |w| format!("; iperf3 -w {w} (every system)"));
        let rate = self.udp_rate_mbps.map_or(String::new(), |r| {
            format!("; UDP sent at {r} Mbit/s (every system)")
        });
        format!(
            "mtu {}, offloads {}, workers {}{}, batch {}, sockbuf {}, mss-clamp {}, encap {} \
             (all but mtu: espgate only){pin}{window}{rate}",
            self.mtu,
            onoff(self.offloads),
            opt(self.workers.map(|v| v.to_string())),
            self.per_cpu_sas
                .map_or(String::new(), |n| format!(", per-cpu-sas {n}")),
            opt(self.batch.map(|v| v.to_string())),
            opt(self.socket_buffer.map(|v| v.to_string())),
            onoff(self.mss_clamp),
            self.encap.name(),
        )
    }
}

/// Checked options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Tests in order.
    pub tests: Vec<Test>,
    /// Runs per test and system.
    pub runs: usize,
    /// espgate suites (one system each).
    pub suites: Vec<String>,
    /// Other VPNs.
    pub peers: Vec<Peer>,
    /// The no-crypto relay too (`--relay`).
    pub relay: bool,
    /// JSON output.
    pub json: bool,
    /// Namespace prefix.
    pub prefix: String,
    /// The knobs.
    pub settings: Settings,
    /// The espgate binary for the gateways.
    pub exe: PathBuf,
}

impl Options {
    /// Checks `args`.
    pub fn new(args: &Args, exe: PathBuf) -> Result<Options> {
        let names: Vec<&str> = if args.tests.is_empty() {
            DEFAULT_TESTS.to_vec()
        } else {
            args.tests.iter().map(String::as_str).collect()
        };
        let mut tests = Vec::new();
        for n in names {
            let t = Test::parse(n)?;
            if !tests.contains(&t) {
                tests.push(t);
            }
        }
        ensure!(!tests.is_empty(), "--tests: nothing to run");
        ensure!(
            (1..=99).contains(&args.runs),
            "--runs {}: 1 to 99",
            args.runs
        );
        ensure!(
            (1..=3600).contains(&args.time),
            "--time {}: 1 to 3600 seconds",
            args.time
        );
        let mut suites = Vec::new();
        for s in &args.suite {
            let suite = s
                .trim()
                .parse::<espgate_core::crypto::Suite>()
                .map_err(|e| anyhow!("--suite {s}: {e}"))?;
            ensure!(
                suite.enc.is_some(),
                "--suite {s}: an AH (integrity-only) suite; the tunnel carries ESP"
            );
            suite
                .check_policy(false)
                .map_err(|e| anyhow!("--suite {s}: {e}"))?;
            if !suites.contains(&suite.name()) {
                suites.push(suite.name());
            }
        }
        ensure!(!suites.is_empty(), "--suite: at least one");
        let mut peers = Vec::new();
        // Empty entries (`--peers ''`, a trailing comma from a script
        // that builds the list) name no peer.
        for p in args.peers.iter().filter(|p| !p.trim().is_empty()) {
            let p = Peer::parse(p)?;
            if !peers.contains(&p) {
                peers.push(p);
            }
        }
        let prefix = args
            .prefix
            .clone()
            .unwrap_or_else(|| format!("egbench-{}", std::process::id()));
        ensure!(
            !prefix.is_empty()
                && prefix.len() <= 40
                && prefix
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "--prefix {prefix}: 1 to 40 of A-Z a-z 0-9 - _"
        );
        Ok(Options {
            tests,
            runs: args.runs,
            suites,
            peers,
            relay: args.relay,
            json: args.json,
            prefix,
            settings: Settings {
                mtu: args.mtu,
                offloads: args.offloads == "on",
                workers: args.workers,
                per_cpu_sas: args.per_cpu_sas,
                batch: args.batch,
                socket_buffer: args.sockbuf,
                mss_clamp: args.mss_clamp == "on",
                encap: if args.encap == "none" {
                    Encapsulation::None
                } else {
                    Encapsulation::Udp
                },
                time_s: args.time,
                scrape_hz: args.scrape,
                pin: if args.pin {
                    Some(Pin::for_cpus(
                        std::thread::available_parallelism().map_or(1, usize::from),
                    )?)
                } else {
                    None
                },
                iperf_window: args.iperf_window,
                udp_rate_mbps: args.udp_rate,
            },
            exe: match &args.gateway_binary {
                Some(p) => {
                    ensure!(
                        p.is_file(),
                        "--gateway-binary {}: no such file",
                        p.display()
                    );
                    p.clone()
                }
                None => exe,
            },
        })
    }

    /// The systems in the order they are measured.
    pub fn systems(&self) -> Vec<System> {
        let mut v = vec![System::Plain];
        if self.relay {
            v.extend([System::Relay, System::RelayGcm]);
        }
        v.extend(self.suites.iter().cloned().map(System::Espgate));
        v.extend(self.peers.iter().copied().map(System::Peer));
        v
    }
}

/// What one iperf3 run delivered (receiver side).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Received Mbit/s.
    pub mbps: f64,
    /// UDP: packets delivered per second.
    pub pps: Option<f64>,
    /// UDP: lost packets, % of those sent.
    pub loss_percent: Option<f64>,
    /// CPU of each gateway process, % of one core.
    pub cpu: BTreeMap<String, f64>,
    /// Peak resident memory (VmHWM) of each gateway process after the
    /// run, MiB.
    pub rss_mib: BTreeMap<String, f64>,
    /// When the run started, seconds after the bench began.
    pub started_s: f64,
    /// The round it was measured in (1, 2, …; see `measure_all`): runs
    /// of the same round were taken back to back.
    pub round: usize,
    /// TCP: segments the sender retransmitted (iperf3's
    /// `end.sum_sent.retransmits`; `None` for UDP or where iperf3 does
    /// not report it).
    pub retransmits: Option<u64>,
    /// CPU time the hypervisor gave other guests during the run ("steal"
    /// in /proc/stat), % of all CPU time (`None` where it cannot be read).
    /// A run with much steal measured a slower machine than its neighbours.
    pub steal_percent: Option<f64>,
    /// UDP: datagrams per second dropped for a full receive buffer (the
    /// `RcvbufErrors` counter of /proc/net/snmp) in host B's namespace
    /// and in gateway B's, during the run ([`BufferDrops`]; `None` for TCP
    /// or where the counters could not be read).
    pub buffer_drops: Option<BufferDrops>,
}

/// Where a UDP run lost datagrams to a full socket buffer, per second.
/// Host B's is the receiving iperf3's socket: the endpoint, which the
/// datagrams reached but which did not read them in time, not the path.
/// Gateway B's are the tunnel's own sockets there (0 for plain routing,
/// whose gateways forward in the kernel).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BufferDrops {
    /// Datagrams/s host B's socket dropped.
    pub host_b_pps: f64,
    /// Datagrams/s gateway B's UDP sockets dropped.
    pub gateway_b_pps: f64,
}

impl BufferDrops {
    /// The drops per second between two readings of the `Udp:` counters
    /// of host B's and gateway B's namespaces (`before` and `after`, each
    /// `(host B, gateway B)`) over a run of `secs` seconds; `None` when a
    /// reading lacks the counter or went backwards.
    pub fn between(
        before: (&BTreeMap<String, u64>, &BTreeMap<String, u64>),
        after: (&BTreeMap<String, u64>, &BTreeMap<String, u64>),
        secs: f64,
    ) -> Option<BufferDrops> {
        let per_s = |b: &BTreeMap<String, u64>, a: &BTreeMap<String, u64>| -> Option<f64> {
            let d = a
                .get("RcvbufErrors")?
                .checked_sub(*b.get("RcvbufErrors")?)?;
            (secs > 0.0).then(|| d as f64 / secs)
        };
        Some(BufferDrops {
            host_b_pps: per_s(before.0, after.0)?,
            gateway_b_pps: per_s(before.1, after.1)?,
        })
    }
}

/// The `Udp:` counters of host B's and gateway B's namespaces now.
fn udp_counters(topo: &Topology) -> Option<(BTreeMap<String, u64>, BTreeMap<String, u64>)> {
    Some((
        netlab::ns_udp_counters(&topo.hb)?,
        netlab::ns_udp_counters(&topo.gb)?,
    ))
}

/// Steal and total CPU time (clock ticks, all CPUs) from the `cpu` line of
/// /proc/stat: user nice system idle iowait irq softirq steal ... (guest
/// time is already counted in user and nice).
pub fn cpu_steal_total(proc_stat: &str) -> Option<(u64, u64)> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    (v.len() == 8).then(|| (v[7], v.iter().sum()))
}

/// Steal between two /proc/stat readings, % of the CPU time between them.
pub fn steal_percent(before: (u64, u64), after: (u64, u64)) -> Option<f64> {
    let total = after.1.checked_sub(before.1)?;
    let steal = after.0.checked_sub(before.0)?;
    (total > 0).then(|| 100.0 * steal as f64 / total as f64)
}

/// [`cpu_steal_total`] of this machine's /proc/stat now.
pub fn read_cpu_steal_total() -> Option<(u64, u64)> {
    cpu_steal_total(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// TCP retransmissions from iperf3's `-J` document (the sender's count:
/// loss or reordering in the path, the tunnel included).
pub fn tcp_retransmits(v: &serde_json::Value) -> Option<u64> {
    v["end"]["sum_sent"]["retransmits"].as_u64()
}

/// The receiver's numbers from iperf3's `-J` document: Mbit/s and, for
/// UDP, delivered packets per second and loss %.
pub fn parse_iperf(test: Test, v: &serde_json::Value) -> Result<(f64, Option<f64>, Option<f64>)> {
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let end = &v["end"];
    let rx = &end["sum_received"];
    match test {
        // With several streams, sum_received is their sum.
        Test::Tcp | Test::TcpStreams(_) => {
            let bps = rx["bits_per_second"]
                .as_f64()
                .ok_or_else(|| anyhow!("no end.sum_received in iperf3's output"))?;
            Ok((bps / 1e6, None, None))
        }
        Test::Udp(size) => {
            let num = |o: &serde_json::Value, k: &str| o[k].as_f64();
            // iperf3 >= 3.11 reports the receiver in sum_received; older
            // ones only in sum (the sender's bytes and the server's losses).
            let (src, from_sender) = if num(rx, "packets").is_some() {
                (rx, false)
            } else {
                (&end["sum"], true)
            };
            let (Some(packets), Some(lost), Some(secs)) = (
                num(src, "packets"),
                num(src, "lost_packets"),
                num(src, "seconds"),
            ) else {
                bail!("no UDP receiver summary in iperf3's output");
            };
            ensure!(secs > 0.0, "iperf3 reports a run of {secs} s");
            let delivered = (packets - lost).max(0.0);
            let mbps = if from_sender {
                delivered * f64::from(size) * 8.0 / secs / 1e6
            } else {
                num(src, "bits_per_second")
                    .ok_or_else(|| anyhow!("no end.sum_received.bits_per_second"))?
                    / 1e6
            };
            let loss = if packets > 0.0 {
                lost / packets * 100.0
            } else {
                0.0
            };
            Ok((mbps, Some(delivered / secs), Some(loss)))
        }
    }
}

/// Median, minimum and maximum (`None` for no values).
pub fn stats(v: &[f64]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    Some((median, s[0], s[n - 1]))
}

fn median(v: &[f64]) -> Option<f64> {
    stats(v).map(|s| s.0)
}

/// One result row (`--json` prints a list of these).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    /// `plain`, `espgate` or a peer's name (`wireguard-go`,
    /// `wireguard-go-debian`, `boringtun`, `strongswan`, `openvpn`).
    pub system: String,
    /// The system's version ([`System::version`]; `None`: unknown).
    pub version: Option<String>,
    /// espgate's suite (`None` for the others).
    pub suite: Option<String>,
    /// `tcp`, `udp64`, …
    pub test: String,
    /// Successful runs.
    pub runs: usize,
    /// Mbit/s of each successful run.
    pub runs_mbps: Vec<f64>,
    /// When each of those runs started, seconds after the bench began
    /// (the rounds interleave the systems: see `measure_all`).
    pub runs_started_s: Vec<f64>,
    /// The round of each of those runs (1, 2, …): two systems' runs of
    /// the same round were taken back to back ([`paired_ratios`]).
    pub runs_round: Vec<usize>,
    /// TCP: each run's retransmitted segments (empty for UDP).
    pub runs_retransmits: Vec<u64>,
    /// Each run's CPU steal, % of all CPU time ([`Sample::steal_percent`];
    /// runs where /proc/stat could not be read are left out).
    pub runs_steal_percent: Vec<f64>,
    /// UDP: each run's datagrams/s dropped by host B's full socket buffer
    /// (the receiving iperf3: the endpoint, not the path;
    /// [`BufferDrops`]). Empty for TCP and where not read.
    pub runs_host_b_drops_pps: Vec<f64>,
    /// UDP: the same for gateway B's UDP sockets (the tunnel's own; a
    /// raw ESP socket's drops are not in this counter).
    pub runs_gateway_b_drops_pps: Vec<f64>,
    /// UDP: median datagrams/s the sending iperf3 sent (delivered and
    /// lost, as iperf3 counts them from its sequence numbers).
    pub median_sent_pps: Option<f64>,
    /// UDP: median datagrams/s that reached host B's socket: those
    /// delivered plus those its full buffer dropped. What the path
    /// carried, whether or not the receiving application kept up.
    pub median_reached_pps: Option<f64>,
    /// median_reached_pps / plain routing's of the same test.
    pub reached_ratio_to_plain: Option<f64>,
    /// Median Mbit/s.
    pub median_mbps: Option<f64>,
    /// Slowest run.
    pub min_mbps: Option<f64>,
    /// Fastest run.
    pub max_mbps: Option<f64>,
    /// UDP: median packets per second delivered.
    pub median_pps: Option<f64>,
    /// UDP: median loss, %.
    pub loss_percent: Option<f64>,
    /// median_mbps / plain routing's median_mbps of the same test.
    pub ratio_to_plain: Option<f64>,
    /// The median, over the rounds where both have a run, of this row's
    /// run / plain routing's run of the same round and test
    /// ([`paired_ratios`]): the ratio with the drift between rounds left
    /// out. `None` without such a round.
    pub paired_ratio_to_plain: Option<f64>,
    /// Median CPU of each gateway process over the runs, % of one core.
    pub cpu: BTreeMap<String, f64>,
    /// Efficiency: CPU seconds the gateway processes (both sides) spent
    /// per gigabit delivered, from the medians (`None` without CPU figures,
    /// as for plain routing, whose work is the kernel's).
    pub cpu_s_per_gbit: Option<f64>,
    /// Largest peak resident memory (VmHWM) of each gateway process over
    /// the runs, MiB.
    pub peak_rss_mib: BTreeMap<String, f64>,
    /// Why it failed (some or all runs), else `None`.
    pub error: Option<String>,
    /// The knobs.
    pub settings: Settings,
    /// Runs measured while the gateways were scraped this many times a
    /// second (`None`: not scraped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scraped_hz: Option<u32>,
    /// Scrapes done during these runs (status and metrics, per gateway).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scrapes: Option<u64>,
    /// espgate with an AES-GCM suite: the library that ran it, `aws-lc`
    /// or `ring` (`espgate_core::crypto::GcmImpl`: the gateways run on
    /// this CPU with this environment). `None` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aes_gcm: Option<&'static str>,
}

impl Row {
    /// The row of `system` and `test` from its samples (`error`: why runs
    /// failed, or why the system did not come up).
    pub fn new(
        system: &System,
        test: Test,
        samples: &[Sample],
        error: Option<String>,
        settings: &Settings,
    ) -> Row {
        let mbps: Vec<f64> = samples.iter().map(|s| s.mbps).collect();
        let st = stats(&mbps);
        let udp = matches!(test, Test::Udp(_));
        let of =
            |f: fn(&Sample) -> Option<f64>| -> Vec<f64> { samples.iter().filter_map(f).collect() };
        let mut cpu_runs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut peak_rss_mib: BTreeMap<String, f64> = BTreeMap::new();
        for s in samples {
            for (k, v) in &s.cpu {
                cpu_runs.entry(k.clone()).or_default().push(*v);
            }
            for (k, v) in &s.rss_mib {
                let e = peak_rss_mib.entry(k.clone()).or_insert(0.0);
                *e = e.max(round(*v, 1));
            }
        }
        let mut row = Row {
            system: system.name().to_string(),
            version: None,
            suite: match system {
                System::Espgate(s) => Some(s.clone()),
                _ => None,
            },
            test: test.name(),
            runs: samples.len(),
            runs_mbps: mbps.iter().map(|v| round(*v, 3)).collect(),
            runs_started_s: samples.iter().map(|s| round(s.started_s, 1)).collect(),
            runs_round: samples.iter().map(|s| s.round).collect(),
            runs_retransmits: samples.iter().filter_map(|s| s.retransmits).collect(),
            runs_steal_percent: samples
                .iter()
                .filter_map(|s| s.steal_percent.map(|v| round(v, 1)))
                .collect(),
            runs_host_b_drops_pps: samples
                .iter()
                .filter_map(|s| s.buffer_drops.map(|d| d.host_b_pps.round()))
                .collect(),
            runs_gateway_b_drops_pps: samples
                .iter()
                .filter_map(|s| s.buffer_drops.map(|d| d.gateway_b_pps.round()))
                .collect(),
            median_sent_pps: median(&of(|s| {
                let (pps, kept) = (s.pps?, 1.0 - s.loss_percent? / 100.0);
                (kept > 0.0).then(|| pps / kept)
            }))
            .filter(|_| udp)
            .map(|v| v.round()),
            median_reached_pps: median(&of(|s| Some(s.pps? + s.buffer_drops?.host_b_pps)))
                .filter(|_| udp)
                .map(|v| v.round()),
            reached_ratio_to_plain: None,
            median_mbps: st.map(|s| round(s.0, 3)),
            min_mbps: st.map(|s| round(s.1, 3)),
            max_mbps: st.map(|s| round(s.2, 3)),
            median_pps: if udp {
                median(&of(|s| s.pps)).map(|v| v.round())
            } else {
                None
            },
            loss_percent: if udp {
                median(&of(|s| s.loss_percent)).map(|v| round(v, 3))
            } else {
                None
            },
            ratio_to_plain: None,
            paired_ratio_to_plain: None,
            cpu_s_per_gbit: None,
            cpu: cpu_runs
                .into_iter()
                .filter_map(|(k, v)| Some((k, round(median(&v)?, 1))))
                .collect(),
            peak_rss_mib,
            error,
            settings: settings.clone(),
            scraped_hz: None,
            scrapes: None,
            aes_gcm: match system {
                System::Espgate(s) if s.starts_with("aes") && s.ends_with("gcm16") => {
                    Some(espgate_core::crypto::GcmImpl::current().name())
                }
                _ => None,
            },
        };
        row.cpu_s_per_gbit = cpu_s_per_gbit(&row.cpu, row.median_mbps);
        row
    }
}

/// CPU seconds per gigabit: the processes' CPU (% of one core each, so
/// CPU seconds per second) over the delivered rate in Gbit/s.
pub fn cpu_s_per_gbit(cpu: &BTreeMap<String, f64>, mbps: Option<f64>) -> Option<f64> {
    let gbps = mbps? / 1000.0;
    if cpu.is_empty() || gbps <= 0.0 {
        return None;
    }
    Some(round(cpu.values().sum::<f64>() / 100.0 / gbps, 3))
}

fn round(v: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (v * m).round() / m
}

/// Sets each row's ratio_to_plain: its median / the median of the plain
/// row of the same test (none when either is missing or plain's is 0);
/// likewise reached_ratio_to_plain from median_reached_pps.
pub fn fill_ratios(rows: &mut [Row]) {
    let plain = |f: fn(&Row) -> Option<f64>| -> BTreeMap<String, f64> {
        rows.iter()
            .filter(|r| r.system == "plain")
            .filter_map(|r| Some((r.test.clone(), f(r)?)))
            .collect()
    };
    let (mbps, reached) = (plain(|r| r.median_mbps), plain(|r| r.median_reached_pps));
    let ratio = |r: &Row, v: Option<f64>, of: &BTreeMap<String, f64>| match (v, of.get(&r.test)) {
        (Some(m), Some(p)) if *p > 0.0 => Some(if r.system == "plain" {
            1.0
        } else {
            round(m / p, 4)
        }),
        _ => None,
    };
    let paired: Vec<Option<f64>> = rows
        .iter()
        .map(|r| {
            let p = rows
                .iter()
                .find(|p| p.system == "plain" && p.test == r.test)?;
            let v: Vec<f64> = paired_ratios(r, p).iter().map(|x| x.0).collect();
            median(&v).map(|m| round(m, 4))
        })
        .collect();
    for (r, paired) in rows.iter_mut().zip(paired) {
        r.ratio_to_plain = ratio(r, r.median_mbps, &mbps);
        r.reached_ratio_to_plain = ratio(r, r.median_reached_pps, &reached);
        r.paired_ratio_to_plain = paired;
    }
}

/// CPU steal (% of all CPU time) above which a run is marked in the
/// round-by-round ratios: a tenth of the machine given to other guests
/// is more than the spread of a quiet host's runs.
pub const STEAL_NOTED_PERCENT: f64 = 10.0;

/// `a`'s run over `b`'s run of the same round, for each round where both
/// have a successful run with Mbit/s above 0, in round order: (ratio,
/// whether either run had more than [`STEAL_NOTED_PERCENT`] CPU steal).
/// The two runs of a round were taken back to back, so a drift of the
/// host's load from one round to the next, which moves both medians,
/// does not enter these ratios; their spread is what single runs vary.
pub fn paired_ratios(a: &Row, b: &Row) -> Vec<(f64, bool)> {
    // A run's steal, where every run of the row has a reading (the lists
    // then line up; runs without one are left out of runs_steal_percent).
    let steal = |r: &Row, i: usize| {
        (r.runs_steal_percent.len() == r.runs_mbps.len())
            .then(|| r.runs_steal_percent[i])
            .is_some_and(|s| s > STEAL_NOTED_PERCENT)
    };
    let mut out = Vec::new();
    for (i, (ra, ma)) in a.runs_round.iter().zip(&a.runs_mbps).enumerate() {
        let Some(j) = b.runs_round.iter().position(|rb| rb == ra) else {
            continue;
        };
        let mb = b.runs_mbps[j];
        if *ma > 0.0 && mb > 0.0 {
            out.push((ma / mb, steal(a, i) || steal(b, j)));
        }
    }
    out
}

fn fmt_opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// The rows as a text table, with the settings above and the reasons for
/// failures below.
pub fn render_table(rows: &[Row], settings: &Settings, runs: usize) -> String {
    let label = |r: &Row| {
        let name = match &r.suite {
            Some(s)
                if rows
                    .iter()
                    .any(|o| o.suite.as_ref().is_some_and(|x| x != s)) =>
            {
                format!("{} {s}", r.system)
            }
            _ => r.system.clone(),
        };
        match r.scraped_hz {
            Some(hz) => format!("{name} +{hz}Hz scrape"),
            None => name,
        }
    };
    let suites: Vec<&str> = {
        let mut s: Vec<&str> = rows.iter().filter_map(|r| r.suite.as_deref()).collect();
        s.dedup();
        s
    };
    let mut out = format!(
        "espgate bench tunnel: iperf3 host A -> host B, {runs} run(s) of {} s per test; {}\n",
        settings.time_s,
        settings.describe()
    );
    if !suites.is_empty() {
        let mut libs: Vec<&str> = rows.iter().filter_map(|r| r.aes_gcm).collect();
        libs.dedup();
        let libs = if libs.is_empty() {
            String::new()
        } else {
            format!(" (AES-GCM in {})", libs.join(", "))
        };
        let encap = match settings.encap {
            Encapsulation::Udp => "ESP-in-UDP",
            Encapsulation::None => "raw ESP (IP protocol 50)",
        };
        out += &format!(
            "espgate: {encap}, manual keys, {}{libs}\n",
            suites.join(", ")
        );
    }
    // Each system's version, once (the first row that knows it).
    let mut versions: Vec<(&str, Option<&str>)> = Vec::new();
    for r in rows {
        match versions.iter_mut().find(|(s, _)| *s == r.system) {
            Some((_, v)) => {
                if v.is_none() {
                    *v = r.version.as_deref();
                }
            }
            None => versions.push((&r.system, r.version.as_deref())),
        }
    }
    if !versions.is_empty() {
        out += "versions:\n";
        let width = versions.iter().map(|(s, _)| s.len()).max().unwrap_or(0);
        for (system, v) in versions {
            let mut line = format!("  {system:width$}  {}", v.unwrap_or("unknown"));
            if let Some(about) = about_system(system) {
                line += &format!(" ({about})");
            }
            out += &line;
            out += "\n";
        }
    }
    out += "Mbit/s, pps (packets delivered per second) and loss: receiver side; vs plain: median / plain routing's median; CPU s/Gbit: the gateway processes' CPU seconds per gigabit delivered\n\n";
    let mut t = Table::new([
        Column::left("system"),
        Column::left("test").min_width(7),
        Column::right("median").min_width(10),
        Column::right("min").min_width(10),
        Column::right("max").min_width(10),
        Column::right("pps").min_width(9),
        Column::right("loss").min_width(6),
        Column::right("vs plain").min_width(8),
        Column::right("CPU s/Gbit"),
        Column::left("CPU % of one core (median)"),
    ]);
    let mut failures: Vec<(String, Vec<String>)> = Vec::new();
    for r in rows {
        let name = label(r);
        if r.runs == 0 {
            let reason = r.error.as_deref().unwrap_or("no run succeeded");
            t.row_then(
                [name.clone(), r.test.clone()],
                format!("failed: {}", reason.lines().next().unwrap_or_default()),
            );
            // One entry per system and reason (a system that did not come
            // up fails every test the same way).
            let key = format!("{name}: {reason}");
            match failures.iter_mut().find(|(k, _)| *k == key) {
                Some((_, tests)) => tests.push(r.test.clone()),
                None => failures.push((key, vec![r.test.clone()])),
            }
            continue;
        }
        t.row([
            name.clone(),
            r.test.clone(),
            fmt_opt(r.median_mbps, |v| format!("{v:.1}")),
            fmt_opt(r.min_mbps, |v| format!("{v:.1}")),
            fmt_opt(r.max_mbps, |v| format!("{v:.1}")),
            fmt_opt(r.median_pps, |v| format!("{v:.0}")),
            fmt_opt(r.loss_percent, |v| format!("{v:.1}%")),
            fmt_opt(r.ratio_to_plain, |v| format!("{v:.3}")),
            fmt_opt(r.cpu_s_per_gbit, |v| format!("{v:.3}")),
            netlab::cpu_cell(&r.cpu),
        ]);
        if let Some(e) = &r.error {
            failures.push((
                format!(
                    "{name} {}: {} of {runs} runs failed: {e}",
                    r.test,
                    runs.saturating_sub(r.runs)
                ),
                Vec::new(),
            ));
        }
    }
    out += &t.render();
    out += &against_others(rows, label);
    out += &round_by_round(rows, label);
    // Peak memory per system: the largest over its tests.
    let mut mem: Vec<(String, BTreeMap<String, f64>)> = Vec::new();
    for r in rows.iter().filter(|r| !r.peak_rss_mib.is_empty()) {
        let name = label(r);
        let i = match mem.iter().position(|(n, _)| *n == name) {
            Some(i) => i,
            None => {
                mem.push((name, BTreeMap::new()));
                mem.len() - 1
            }
        };
        for (k, v) in &r.peak_rss_mib {
            let e = mem[i].1.entry(k.clone()).or_insert(0.0);
            *e = e.max(*v);
        }
    }
    if !mem.is_empty() {
        out += "\npeak resident memory (VmHWM), MiB:";
        for (name, m) in &mem {
            let list: Vec<String> = m.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
            out += &format!("\n  {name}: {}", list.join(", "));
        }
        out += "\n";
    }
    out += &buffer_drop_lines(rows, label);
    out += &steal_lines(rows, label);
    if !failures.is_empty() {
        out += "\nfailures:\n";
        for (f, tests) in failures {
            if tests.is_empty() {
                out += &format!("- {f}\n");
            } else {
                out += &format!("- ({}) {f}\n", tests.join(", "));
            }
        }
    }
    out
}

/// For each UDP row, where datagrams were lost to full socket buffers
/// (medians per second): at host B's socket, the endpoint, and at
/// gateway B's, and what reached host B's socket against plain routing;
/// empty when no row has the readings.
fn buffer_drop_lines(rows: &[Row], label: impl Fn(&Row) -> String) -> String {
    let mut lines = Vec::new();
    for r in rows.iter().filter(|r| !r.runs_host_b_drops_pps.is_empty()) {
        let mut line = format!("\n  {} {}:", label(r), r.test);
        if let Some(sent) = r.median_sent_pps {
            line += &format!(" sent {sent:.0}/s,");
        }
        if let Some(v) = r.median_reached_pps {
            line += &format!(" {v:.0}/s reached host B's socket");
            let mut of = Vec::new();
            if let Some(sent) = r.median_sent_pps.filter(|s| *s > 0.0) {
                of.push(format!("{:.3} of those sent", v / sent));
            }
            if let Some(q) = r.reached_ratio_to_plain.filter(|_| r.system != "plain") {
                of.push(format!("{q:.3} of plain's"));
            }
            if !of.is_empty() {
                line += &format!(" ({})", of.join(", "));
            }
            line += ",";
        }
        line += &format!(
            " its full buffer dropped {:.0}/s; gateway B's UDP sockets dropped {:.0}/s",
            median(&r.runs_host_b_drops_pps).unwrap_or(0.0),
            median(&r.runs_gateway_b_drops_pps).unwrap_or(0.0),
        );
        lines.push(line);
    }
    if lines.is_empty() {
        return String::new();
    }
    // Rows that lost more than they delivered, most of it at host B's
    // socket: their delivered figure measures the receiving application.
    let endpoint_bound: Vec<String> = rows
        .iter()
        .filter(|r| r.system != "plain")
        .filter_map(|r| {
            let (sent, pps) = (r.median_sent_pps?, r.median_pps?);
            let dropped = median(&r.runs_host_b_drops_pps)?;
            let lost = sent - pps;
            (lost > pps && dropped > lost / 2.0).then(|| format!("{} {}", label(r), r.test))
        })
        .collect();
    let hint = if endpoint_bound.is_empty() {
        String::new()
    } else {
        format!(
            "\n  Most of the loss of {} was at host B's socket: the receiving application, not \
             the path. --udp-rate MBITS (the same offered load for every system) or \
             --iperf-window BYTES shows what the path delivers.",
            endpoint_bound.join(", ")
        )
    };
    format!(
        "\nUDP: where the datagrams went (medians; drops for a full socket buffer are \
         RcvbufErrors in /proc/net/snmp). Host B's socket is the receiving iperf3: what it \
         dropped reached the host and was lost because the application did not read in time, \
         not on the path; gateway B's UDP sockets are the tunnel's own (a raw ESP socket's drops \
         are not counted):{}{hint}\n",
        lines.concat()
    )
}

/// The host's CPU steal during each system's runs (all its tests), median
/// and largest, so that a row measured while the hypervisor ran other
/// guests shows as such; empty when no run could read /proc/stat.
fn steal_lines(rows: &[Row], label: impl Fn(&Row) -> String) -> String {
    let mut by: Vec<(String, Vec<f64>)> = Vec::new();
    for r in rows.iter().filter(|r| !r.runs_steal_percent.is_empty()) {
        let name = label(r);
        match by.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.extend(&r.runs_steal_percent),
            None => by.push((name, r.runs_steal_percent.clone())),
        }
    }
    if by.is_empty() {
        return String::new();
    }
    let mut out =
        "\nCPU steal during the runs (time the hypervisor gave other guests, % of all CPU \
                   time; a system whose runs had much more than the others' ran on a slower \
                   machine):"
            .to_string();
    for (name, v) in &by {
        let max = v.iter().copied().fold(0.0, f64::max);
        out += &format!(
            "\n  {name}: median {:.1}, max {max:.1}",
            median(v).unwrap_or(0.0)
        );
    }
    out + "\n"
}

/// The issue-17 ratios read off one run: for each espgate row (`label`
/// tells them apart), its median over every other system's median of the
/// same test (plain routing is already the table's `vs plain`). Empty when
/// no other system delivered a median beside espgate.
fn against_others(rows: &[Row], label: impl Fn(&Row) -> String) -> String {
    let mut lines = Vec::new();
    for e in rows.iter().filter(|r| r.system == "espgate") {
        let Some(m) = e.median_mbps.filter(|m| *m > 0.0) else {
            continue;
        };
        let others: Vec<String> = rows
            .iter()
            .filter(|o| o.test == e.test && o.system != "plain" && o.system != "espgate")
            .filter_map(|o| {
                let v = o.median_mbps.filter(|v| *v > 0.0)?;
                Some(format!("{} {:.2}", label(o), m / v))
            })
            .collect();
        if !others.is_empty() {
            lines.push(format!("  {} {}: {}", label(e), e.test, others.join(", ")));
        }
    }
    if lines.is_empty() {
        return String::new();
    }
    format!(
        "\nespgate's median / each other system's median, same test, same run:\n{}\n",
        lines.join("\n")
    )
}

/// For each espgate row, its run over each other system's run of the
/// same test and round ([`paired_ratios`]), round by round, with their
/// median; empty when no pair has two rounds (one round's ratio is the
/// medians' ratio, already shown).
fn round_by_round(rows: &[Row], label: impl Fn(&Row) -> String) -> String {
    let mut lines = Vec::new();
    for e in rows.iter().filter(|r| r.system == "espgate") {
        for o in rows
            .iter()
            .filter(|o| o.test == e.test && o.system != "espgate")
        {
            let pairs = paired_ratios(e, o);
            if pairs.len() < 2 {
                continue;
            }
            // The table's precision: 3 digits against plain routing, 2
            // against the others.
            let digits = if o.system == "plain" { 3 } else { 2 };
            let each: Vec<String> = pairs
                .iter()
                .map(|(v, stolen)| format!("{v:.digits$}{}", if *stolen { "*" } else { "" }))
                .collect();
            let mid = median(&pairs.iter().map(|p| p.0).collect::<Vec<_>>()).unwrap_or(0.0);
            lines.push(format!(
                "  {} {} / {}: {} (median {mid:.digits$})",
                label(e),
                e.test,
                label(o),
                each.join(", ")
            ));
        }
    }
    if lines.is_empty() {
        return String::new();
    }
    format!(
        "\nRound by round: espgate's run / the other system's run of the same round (taken back \
         to back, so a drift of the host's load between rounds drops out; their spread is what \
         single runs vary; * a run of the pair had more than {STEAL_NOTED_PERCENT:.0} % CPU \
         steal):\n{}\n",
        lines.join("\n")
    )
}

/// `espgate bench tunnel`: runs, prints the table or JSON; the exit status.
pub fn main(args: &Args) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("espgate bench tunnel: cannot find my own binary: {e}");
            return ExitCode::from(1);
        }
    };
    let opts = match Options::new(args, exe) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("espgate bench tunnel: {e:#}");
            return ExitCode::from(2);
        }
    };
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let progress = |s: &str| {
        if tty {
            eprint!("\r\x1b[K{s}");
        }
    };
    let result = run_bench(&opts, progress);
    if tty {
        eprint!("\r\x1b[K");
    }
    match result {
        Ok(rows) => {
            if opts.json {
                match serde_json::to_string_pretty(&rows) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("espgate bench tunnel: {e}");
                        return ExitCode::from(1);
                    }
                }
            } else {
                print!("{}", render_table(&rows, &opts.settings, opts.runs));
            }
            let failed: Vec<String> = rows
                .iter()
                .filter(|r| r.error.is_some())
                .map(|r| format!("{} {}", r.system, r.test))
                .collect();
            if failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "espgate bench tunnel: failed (some or all runs): {}",
                    failed.join(", ")
                );
                ExitCode::from(1)
            }
        }
        Err(e) if e.to_string() == "interrupted" => {
            eprintln!("espgate bench tunnel: interrupted; everything it made is removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("espgate bench tunnel: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Builds the lab and measures every system; the rows in order (system,
/// then test).
pub fn run_bench(opts: &Options, mut progress: impl FnMut(&str)) -> Result<Vec<Row>> {
    netlab::install_signal_handlers();
    require_root("bench tunnel")?;
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("iperf3", "iperf3"),
    ] {
        if !on_path(tool) {
            bail!("bench tunnel needs {tool}: apt-get install {pkg} (scripts/setup.sh does)");
        }
    }
    let work = std::env::temp_dir().join(format!("{}-work", opts.prefix));
    let mut lab = Lab::new("bench tunnel", work)?;
    let r = measure_all(&mut lab, opts, &mut progress);
    let r = if netlab::interrupted() {
        Err(anyhow!("interrupted"))
    } else {
        r
    };
    if r.is_err()
        || r.as_ref()
            .is_ok_and(|rows| rows.iter().any(|x| x.error.is_some()))
    {
        lab.keep_work = !netlab::interrupted();
    }
    drop(lab);
    r
}

/// What one system has gathered so far, over the rounds.
struct Gathered {
    /// Why it failed to come up (then it is not tried again).
    down: Option<String>,
    version: Option<String>,
    /// Per test: the samples and the first error.
    plain: Vec<(Vec<Sample>, Option<String>)>,
    /// Per test, under a scrape loop: samples, first error, scrapes done.
    scraped: Vec<(Vec<Sample>, Option<String>, u64)>,
}

/// Measures every system `opts.runs` times, interleaved: each round
/// brings every system up in turn on a fresh topology, runs each test
/// once and takes it down again. A slow drift of this shared host's load
/// then falls on every system alike instead of on whichever system ran
/// while it lasted, so the ratios compare runs taken close together. A
/// system that does not come up is reported as failed and left out of
/// later rounds.
fn measure_all(lab: &mut Lab, opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<Vec<Row>> {
    let systems = opts.systems();
    let total = systems.len() * opts.tests.len() * opts.runs;
    let hz = opts.settings.scrape_hz;
    let t0 = Instant::now();
    let mut g: Vec<Gathered> = systems
        .iter()
        .map(|_| Gathered {
            down: None,
            version: None,
            plain: vec![(Vec::new(), None); opts.tests.len()],
            scraped: vec![(Vec::new(), None, 0); opts.tests.len()],
        })
        .collect();
    let mut step = 0;
    for run in 1..=opts.runs {
        for (sys, g) in systems.iter().zip(g.iter_mut()) {
            netlab::check_interrupt()?;
            if g.down.is_some() {
                step += opts.tests.len();
                continue;
            }
            let doing = match sys {
                System::Peer(p) if !p.installed() => p.preparing(),
                _ => "setting up",
            };
            progress(&format!(
                "[{step}/{total}] {doing} {} (round {run}/{})",
                sys.name(),
                opts.runs
            ));
            lab.remove_namespaces();
            let topo = Topology::create(lab, &opts.prefix, Some(opts.settings.mtu))?;
            let up = start(lab, &topo, sys, opts)
                .and_then(|logs| wait_path(&topo).map_err(|e| with_logs(e, &logs)));
            // After start: what start installed can tell its version now.
            if g.version.is_none() {
                g.version = sys.version(&opts.exe);
            }
            if let Err(e) = up {
                netlab::check_interrupt()?;
                g.down = Some(format!("{} did not come up: {e:#}", sys.name()));
                step += opts.tests.len();
                lab.remove_namespaces();
                continue;
            }
            let scrape = matches!(sys, System::Espgate(_)) && hz > 0;
            for (ti, test) in opts.tests.iter().enumerate() {
                netlab::check_interrupt()?;
                step += 1;
                if !sys.runs(*test) {
                    continue;
                }
                let what = format!(
                    "[{step}/{total}] {} {} run {run}/{}",
                    sys.name(),
                    test.name(),
                    opts.runs
                );
                progress(&what);
                let at = t0.elapsed().as_secs_f64();
                match measure(lab, &topo, *test, &opts.settings) {
                    Ok(s) => g.plain[ti].0.push(Sample {
                        started_s: at,
                        round: run,
                        ..s
                    }),
                    Err(e) => {
                        netlab::check_interrupt()?;
                        g.plain[ti].1.get_or_insert_with(|| format!("{e:#}"));
                    }
                }
                if scrape {
                    // The same test again, on the same gateways, under a
                    // status-and-metrics scrape loop.
                    progress(&format!("{what} under a {hz} Hz scrape"));
                    let at = t0.elapsed().as_secs_f64();
                    let scraper = super::scrape::Scraper::start(&scrape_targets(lab, &topo), hz);
                    let r = measure(lab, &topo, *test, &opts.settings);
                    let n = scraper.stop();
                    let sc = &mut g.scraped[ti];
                    match (r, n) {
                        (Ok(s), Ok(n)) => {
                            sc.0.push(Sample {
                                started_s: at,
                                round: run,
                                ..s
                            });
                            sc.2 += n;
                        }
                        (Err(e), _) | (_, Err(e)) => {
                            netlab::check_interrupt()?;
                            sc.1.get_or_insert_with(|| format!("{e:#}"));
                        }
                    }
                }
            }
            lab.remove_namespaces();
            if sys.is_relay() {
                // Stopped now: each side's last line says what it carried.
                for side in ["a", "b"] {
                    let log = lab.work.join(sys.name()).join(format!("{side}.log"));
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let last = text.lines().rfind(|l| l.contains("stopped;"));
                    eprintln!(
                        "{} {side}, round {run}: {}",
                        sys.name(),
                        last.unwrap_or("no counts (it did not stop cleanly)")
                    );
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (sys, g) in systems.iter().zip(g) {
        let row = |t: Test, s: &[Sample], e: Option<String>| Row {
            version: g.version.clone(),
            // Not coming up (in a later round too) outranks a failed run.
            ..Row::new(sys, t, s, g.down.clone().or(e), &opts.settings)
        };
        for (t, (s, e)) in opts.tests.iter().zip(&g.plain) {
            if sys.runs(*t) {
                rows.push(row(*t, s, e.clone()));
            }
        }
        if matches!(sys, System::Espgate(_)) && hz > 0 {
            for (t, (s, e, n)) in opts.tests.iter().zip(&g.scraped) {
                let mut r = row(*t, s, e.clone());
                r.scraped_hz = Some(hz);
                r.scrapes = Some(*n);
                rows.push(r);
            }
        }
    }
    fill_ratios(&mut rows);
    Ok(rows)
}

/// espgate's two gateways as scrape targets (their control sockets are
/// where `start_espgate` put them).
fn scrape_targets(lab: &Lab, topo: &Topology) -> Vec<super::scrape::Target> {
    [("a", &topo.ga), ("b", &topo.gb)]
        .into_iter()
        .map(|(side, ns)| super::scrape::Target {
            ns: ns.clone(),
            socket: lab.work.join(format!("espgate-{side}")).join("ctl.sock"),
        })
        .collect()
}

/// Every process in the gateway namespaces, as (`comm@gwA`, pid).
fn gateway_processes(topo: &Topology) -> Vec<(String, u32)> {
    let mut v = Vec::new();
    for (ns, gw) in [(&topo.ga, "gwA"), (&topo.gb, "gwB")] {
        for (pid, comm) in netlab::processes_in(ns) {
            v.push((format!("{comm}@{gw}"), pid));
        }
    }
    v
}

/// Binds every thread of the gateway processes `procs` to `cpus` (a
/// taskset list). Done before each run, so threads started since are
/// bound too.
fn pin_gateways(procs: &[(String, u32)], cpus: &str) -> Result<()> {
    for (name, pid) in procs {
        run(Command::new("taskset").args(["-a", "-p", "-c", cpus, &pid.to_string()]))
            .with_context(|| format!("--pin: binding {name} (pid {pid}) to CPUs {cpus}"))?;
    }
    Ok(())
}

/// One iperf3 run of `test`.
fn measure(lab: &mut Lab, topo: &Topology, test: Test, settings: &Settings) -> Result<Sample> {
    let (secs, pin) = (settings.time_s, settings.pin.as_ref());
    let procs = gateway_processes(topo);
    if let Some(p) = pin {
        pin_gateways(&procs, &p.gateway_cpus)?;
    }
    let args = test.client_args(settings);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let udp = matches!(test, Test::Udp(_));
    let udp_before = if udp { udp_counters(topo) } else { None };
    let cpu_before = read_cpu_steal_total();
    let r = netlab::iperf3(
        lab,
        &topo.ha,
        &topo.hb,
        HOST_B,
        &args,
        &procs,
        Duration::from_secs(u64::from(secs) + 30),
        pin.map(|p| p.iperf3_cpu),
    )?;
    let steal = cpu_before.zip(read_cpu_steal_total());
    let buffer_drops = udp_before
        .zip(udp_counters(topo))
        .and_then(|(b, a)| BufferDrops::between((&b.0, &b.1), (&a.0, &a.1), f64::from(secs)));
    let (mbps, pps, loss_percent) = parse_iperf(test, &r.json)?;
    let mut cpu = BTreeMap::new();
    for (name, pct) in r.cpu {
        *cpu.entry(name).or_insert(0.0) += pct;
    }
    let mut rss_mib = BTreeMap::new();
    for (name, pid) in &procs {
        if let Some(k) = netlab::peak_rss_kib(*pid) {
            *rss_mib.entry(name.clone()).or_insert(0.0) += k as f64 / 1024.0;
        }
    }
    Ok(Sample {
        mbps,
        pps,
        loss_percent,
        cpu,
        rss_mib,
        // Set by the caller, which knows when the bench began and which
        // round this is.
        started_s: 0.0,
        round: 0,
        retransmits: match test {
            Test::Tcp | Test::TcpStreams(_) => tcp_retransmits(&r.json),
            Test::Udp(_) => None,
        },
        steal_percent: steal.and_then(|(b, a)| steal_percent(b, a)),
        buffer_drops,
    })
}

/// Waits (at most 20 s) until host A reaches host B.
pub(crate) fn wait_path(topo: &Topology) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    for _ in 0..40 {
        netlab::check_interrupt()?;
        match run(&mut in_ns(
            &topo.ha,
            &["ping", "-c", "1", "-W", "1", "-q", HOST_B],
        )) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("host A cannot ping host B through it: {last}")
}

/// The last `n` lines of each file, labelled.
fn log_tail(files: &[PathBuf], n: usize) -> String {
    let mut out = String::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let tail = last_lines(&text, n);
        let shown = if tail.is_empty() {
            0
        } else {
            tail.lines().count()
        };
        out += &format!("\n--- {} (last {shown} lines) ---", f.display());
        if shown > 0 {
            out += "\n";
            out += &tail;
        }
    }
    out
}

/// `err` with the logs' last lines.
pub(crate) fn with_logs(err: anyhow::Error, logs: &[PathBuf]) -> anyhow::Error {
    anyhow!("{err:#}{}", log_tail(logs, 12))
}

/// Brings `sys` up on `topo` (its processes are the lab's children).
/// Brings `sys` up; returns its log files.
fn start(lab: &mut Lab, topo: &Topology, sys: &System, opts: &Options) -> Result<Vec<PathBuf>> {
    match sys {
        System::Plain => topo.plain_routes(true).map(|()| Vec::new()),
        System::Espgate(suite) => start_espgate(lab, topo, suite, opts),
        System::Relay => start_relay(lab, topo, opts, false),
        System::RelayGcm => start_relay(lab, topo, opts, true),
        System::Peer(p) => {
            ensure_installed(*p)?;
            let dir = lab.work.join(p.name());
            std::fs::create_dir_all(&dir)?;
            match p {
                Peer::WireguardGo | Peer::WireguardGoDebian | Peer::Boringtun => {
                    start_wireguard(lab, topo, &dir, opts.settings.mtu, *p)
                }
                Peer::Strongswan => start_strongswan(lab, topo, &dir),
                Peer::Openvpn => start_openvpn(lab, topo, &dir, opts.settings.mtu),
            }
        }
    }
}

/// Installs `peer`'s Debian packages with apt-get when they are missing,
/// and builds it from source when it is built ([`Peer::source_build`]) and
/// not in the cache yet.
fn ensure_installed(peer: Peer) -> Result<()> {
    if !peer.packages_installed() {
        apt_install(peer.name(), peer.packages())?;
        ensure!(
            peer.packages_installed(),
            "apt-get installed {} but {} is still missing",
            peer.packages().join(" "),
            peer.name()
        );
    }
    if let Some(b) = peer.source_build(Path::new(PEER_CACHE)) {
        build(peer, &b)?;
    }
    Ok(())
}

/// `apt-get install -y -qq PACKAGES` (after `apt-get update` when the
/// first attempt fails), for `what`.
fn apt_install(what: &str, packages: &[&str]) -> Result<()> {
    if !on_path("apt-get") {
        bail!(
            "{what} is not installed and there is no apt-get: install {}",
            packages.join(" ")
        );
    }
    let install = || {
        let mut c = Command::new("apt-get");
        c.args(["install", "-y", "-qq"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive");
        // Not cut short by Ctrl-C: a killed dpkg leaves a mess.
        netlab::run_to_end(&mut c, Duration::from_secs(900))
    };
    if let Err(first) = install() {
        netlab::check_interrupt()?;
        // Perhaps the package lists are stale or missing.
        let _ = netlab::run_to_end(
            Command::new("apt-get").args(["update", "-qq"]),
            Duration::from_secs(300),
        );
        netlab::check_interrupt()?;
        install().map_err(|e| {
            anyhow!(
                "installing {what} (apt-get install -y -qq {}) failed: {e:#} (first attempt: {first:#})",
                packages.join(" ")
            )
        })?;
    }
    Ok(())
}

/// The Go toolchain, installed with apt-get (Debian's golang-go) when
/// there is none; fails when it is too old to build wireguard-go.
fn go_tool() -> Result<PathBuf> {
    let find = || {
        find_on_path("go").or_else(|| {
            ["/usr/local/go/bin/go", "/usr/lib/go/bin/go"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
        })
    };
    let go = match find() {
        Some(g) => g,
        None => {
            apt_install("go (to build wireguard-go)", &["golang-go"])?;
            find().ok_or_else(|| anyhow!("apt-get installed golang-go but there is no go"))?
        }
    };
    let out = run_timeout(Command::new(&go).arg("version"), Duration::from_secs(60))?;
    let v = parse_go_version(&out).ok_or_else(|| {
        anyhow!(
            "{} version said {:?}: not a Go version",
            go.display(),
            out.trim()
        )
    })?;
    ensure!(
        v >= WIREGUARD_GO_MIN_GO,
        "{} is go{}.{}: too old to build wireguard-go {WIREGUARD_GO_VERSION}, whose go.mod asks \
         for go 1.23.1 (Go {}.{} and later fetch that toolchain by themselves): install a newer Go \
         (go.dev's release in /usr/local/go, or Debian's golang-1.23-go from bookworm-backports) \
         and run again",
        go.display(),
        v.0,
        v.1,
        WIREGUARD_GO_MIN_GO.0,
        WIREGUARD_GO_MIN_GO.1
    );
    Ok(go)
}

/// Cargo, where rustup or Debian put it, installed with apt-get (Debian's
/// cargo) when there is none.
fn cargo_tool() -> Result<PathBuf> {
    let find = || {
        let homes = [
            std::env::var_os("CARGO_HOME").map(PathBuf::from),
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")),
            Some(PathBuf::from("/root/.cargo")),
        ];
        find_on_path("cargo").or_else(|| {
            homes
                .into_iter()
                .flatten()
                .map(|h| h.join("bin/cargo"))
                .find(|p| p.is_file())
        })
    };
    match find() {
        Some(c) => Ok(c),
        None => {
            apt_install("cargo (to build boringtun)", &["cargo"])?;
            find().ok_or_else(|| anyhow!("apt-get installed cargo but there is no cargo"))
        }
    }
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Builds `peer` as `b` says unless its binary is there already: into a
/// scratch directory beside `b.dir`, renamed to it when the build
/// succeeded (so a cache directory always holds a whole build).
fn build(peer: Peer, b: &SourceBuild) -> Result<()> {
    if b.binary_path().is_file() {
        return Ok(());
    }
    let tool = match b.builder {
        Builder::Go => go_tool()?,
        Builder::Cargo => cargo_tool()?,
    };
    let parent = b
        .dir
        .parent()
        .ok_or_else(|| anyhow!("{}: no parent directory", b.dir.display()))?;
    std::fs::create_dir_all(parent)
        .with_context(|| format!("creating {} for the built peers", parent.display()))?;
    let scratch = parent.join(format!(
        ".{}.partial-{}",
        b.dir.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    let (argv, env) = b.command(&scratch);
    let line = || {
        let vars: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        format!("{}{}", vars.concat(), argv.join(" "))
    };
    let mut cmd = Command::new(&tool);
    cmd.args(&argv[1..]).envs(env.iter().map(|(k, v)| (k, v)));
    let r = run_timeout_raw(&mut cmd, Duration::from_secs(2700));
    let r = match r {
        Ok((st, _, err)) if !st.success() => Err(anyhow!("{st}: {}", last_lines(&err, 15))),
        Ok(_) => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(e) = r {
        let _ = std::fs::remove_dir_all(&scratch);
        netlab::check_interrupt()?;
        bail!(
            "building {} {} failed: `{}` ({} is {}): {e:#}",
            peer.name(),
            b.version,
            line(),
            b.builder.name(),
            tool.display()
        );
    }
    if let Err(e) = std::fs::rename(&scratch, &b.dir) {
        let _ = std::fs::remove_dir_all(&scratch);
        // Another run may have finished the same build first.
        ensure!(
            b.binary_path().is_file(),
            "built {} {} in {} but cannot move it to {}: {e}",
            peer.name(),
            b.version,
            scratch.display(),
            b.dir.display()
        );
    }
    ensure!(
        b.binary_path().is_file(),
        "{} succeeded but left no {}",
        line(),
        b.binary_path().display()
    );
    Ok(())
}

/// The espgate gateway's configuration for one side: the knobs of `s`
/// that are set (and only those) and one tunnel-mode connection.
#[allow(clippy::too_many_arguments)]
pub fn espgate_config(
    suite: &str,
    local: &str,
    remote: &str,
    local_ts: &str,
    remote_ts: &str,
    spis: (u32, u32),
    keys_in: (&str, &str),
    keys_out: (&str, &str),
    s: &Settings,
) -> String {
    use espgate_config::schema::{
        value, ConfigFile, ConnectionTable, GatewayTable, SaTable, Scalar, SecretHex,
    };
    let key = |k: &str| {
        (!k.is_empty()).then(|| value(SecretHex::new(zeroize::Zeroizing::new(k.to_string()))))
    };
    let int = |n: Option<u64>| n.map(|n| value(n as i64));
    let gateway = GatewayTable {
        tun: Some(value("espgate0".into())),
        control_socket: Some(value("ctl.sock".into())),
        state_dir: Some(value("state".into())),
        mtu: Some(value(s.mtu.into())),
        offloads: Some(s.offloads),
        workers: int(s.workers.map(u64::from)),
        batch: int(s.batch.map(u64::from)),
        socket_buffer: int(s.socket_buffer),
        metrics: (s.scrape_hz > 0).then(|| value(super::scrape::METRICS.to_string())),
        ..GatewayTable::default()
    };
    let mut esp = SaTable::new(suite, spis.0, spis.1);
    esp.enc_in = key(keys_in.0);
    esp.enc_out = key(keys_out.0);
    esp.integ_in = key(keys_in.1);
    esp.integ_out = key(keys_out.1);
    let mut conn = ConnectionTable::new("bench", local, remote);
    conn.local_ts = Some(value(vec![value(local_ts.to_string())]));
    conn.remote_ts = Some(value(vec![value(remote_ts.to_string())]));
    let clamp = if s.mss_clamp { "auto" } else { "off" };
    conn.mss_clamp = Some(value(Scalar::Str(clamp.into())));
    conn.per_cpu_sas = int(s.per_cpu_sas.map(u64::from));
    // Only when not the default, so the file says what was asked for.
    conn.encap = (s.encap != Encapsulation::Udp).then(|| value(s.encap));
    conn.esp = Some(value(esp));
    let file = ConfigFile {
        gateway: Some(value(gateway)),
        connection: vec![value(conn)],
        cluster: None,
    };
    let body = toml::to_string(&file).expect("a configuration of strings and integers");
    format!("# generated by espgate bench tunnel\n{body}")
}

fn start_espgate(
    lab: &mut Lab,
    topo: &Topology,
    suite: &str,
    opts: &Options,
) -> Result<Vec<PathBuf>> {
    let s: espgate_core::crypto::Suite = suite.parse().map_err(|e| anyhow!("{suite}: {e}"))?;
    let key = |n: usize| -> Result<String> {
        if n == 0 {
            Ok(String::new())
        } else {
            random_hex(n)
        }
    };
    let ab = (key(s.enc_key_len())?, key(s.integ_key_len())?);
    let ba = (key(s.enc_key_len())?, key(s.integ_key_len())?);
    let mut socks = Vec::new();
    let mut logs = Vec::new();
    // Per-CPU pair k uses spi_in + k and spi_out + k, so with several pairs
    // the two sides' SPIs start far apart (the ranges must not overlap).
    let (to_a, to_b) = if opts.settings.per_cpu_sas.unwrap_or(1) > 1 {
        (0x1000, 0x2000)
    } else {
        (0x1001, 0x1002)
    };
    for (side, ns, local, remote, lts, rts, spis, k_in, k_out) in [
        (
            "a",
            &topo.ga,
            GW_A,
            GW_B,
            NET_A,
            NET_B,
            (to_a, to_b),
            &ba,
            &ab,
        ),
        (
            "b",
            &topo.gb,
            GW_B,
            GW_A,
            NET_B,
            NET_A,
            (to_b, to_a),
            &ab,
            &ba,
        ),
    ] {
        let dir = lab.work.join(format!("espgate-{side}"));
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("gw.toml");
        let text = espgate_config(
            suite,
            local,
            remote,
            lts,
            rts,
            spis,
            (&k_in.0, &k_in.1),
            (&k_out.0, &k_out.1),
            &opts.settings,
        );
        write_private(&cfg, &text)?;
        let log_path = dir.join("log");
        netlab::spawn_gateway(
            lab,
            &format!("espgate {side}"),
            ns,
            &opts.exe,
            &cfg,
            &log_path,
        )?;
        socks.push(dir.join("ctl.sock"));
        logs.push(log_path);
    }
    for (sock, side) in socks.iter().zip(["a", "b"]) {
        let what = format!("espgate {side}");
        wait_for(
            lab,
            &[&what],
            Duration::from_secs(10),
            "its control socket",
            || {
                espgate_api::control::Client::new(sock, Duration::from_secs(2))
                    .status()
                    .is_ok()
            },
        )
        .map_err(|e| with_logs(e, &logs))?;
    }
    Ok(logs)
}

/// Waits (at most `limit`) for `ok`, failing early when child `what` exits.
pub(crate) fn wait_for(
    lab: &mut Lab,
    whats: &[&str],
    limit: Duration,
    what_for: &str,
    mut ok: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        netlab::check_interrupt()?;
        if ok() {
            return Ok(());
        }
        for w in whats {
            if let Some(st) = lab.exited(w) {
                bail!("{w} exited ({st}) before {what_for}");
            }
        }
        if Instant::now() >= deadline {
            bail!("no {what_for} within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `cmd` with `input` on its standard input; its standard output.
fn run_with_input(cmd: &mut Command, input: &str) -> Result<String> {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Brings up a userspace WireGuard peer (`peer`'s daemon on each gateway,
/// configured with `wg set`); its log files.
fn start_wireguard(
    lab: &mut Lab,
    topo: &Topology,
    dir: &Path,
    mtu: u32,
    peer: Peer,
) -> Result<Vec<PathBuf>> {
    // The UAPI sockets (/var/run/wireguard/NAME.sock) are shared by all
    // namespaces: names unique to this run.
    let pid = std::process::id();
    let mut keys = Vec::new();
    for side in ["a", "b"] {
        let private = run(Command::new("wg").arg("genkey"))?.trim().to_string();
        let public = run_with_input(Command::new("wg").arg("pubkey"), &private)?;
        let file = dir.join(format!("{side}.key"));
        write_private(&file, &format!("{private}\n"))?;
        keys.push((file, public));
    }
    let sides = [
        ("a", &topo.ga, &keys[0].0, &keys[1].1, GW_B, NET_B),
        ("b", &topo.gb, &keys[1].0, &keys[0].1, GW_A, NET_A),
    ];
    let mut logs = Vec::new();
    let mut ifaces = Vec::new();
    for (side, ns, ..) in &sides {
        let iface = format!("egw{pid}{side}");
        let log_path = dir.join(format!("{side}.log"));
        let log = std::fs::File::create(&log_path)?;
        let what = format!("{} {side}", peer.name());
        let (argv, env) = peer
            .wireguard_command(&iface, Path::new(PEER_CACHE))
            .ok_or_else(|| anyhow!("{} is not a userspace WireGuard", peer.name()))?;
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        lab.spawn(
            &what,
            in_ns(ns, &argv)
                .envs(env)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
        )?;
        logs.push(log_path);
        let sock = PathBuf::from(format!("/var/run/wireguard/{iface}.sock"));
        wait_for(
            lab,
            &[&what],
            Duration::from_secs(10),
            "its interface",
            || sock.exists() && ip(&["-n", ns, "link", "show", &iface]).is_ok(),
        )
        .map_err(|e| with_logs(e, &logs))?;
        ifaces.push(iface);
    }
    for ((_, ns, key, peer_pub, peer_addr, remote_net), iface) in sides.iter().zip(&ifaces) {
        let endpoint = format!("{peer_addr}:51820");
        run(&mut in_ns(
            ns,
            &[
                "wg",
                "set",
                iface,
                "private-key",
                &key.to_string_lossy(),
                "listen-port",
                "51820",
                "peer",
                peer_pub,
                "endpoint",
                &endpoint,
                "allowed-ips",
                remote_net,
            ],
        ))
        .map_err(|e| with_logs(e, &logs))?;
        ip(&[
            "-n",
            ns,
            "link",
            "set",
            iface,
            "mtu",
            &(mtu - 80).to_string(),
            "up",
        ])?;
        ip(&["-n", ns, "route", "add", remote_net, "dev", iface])?;
    }
    Ok(logs)
}

/// The relay ([`super::relay`]) in both gateway namespaces: `espgate
/// bench relay` of the gateway binary, its TUN device given the MTU and
/// queue length espgate's would have and a route to the other site; with
/// `seal`, both sides seal with one random AES-128 key, written for them
/// to a file only root may read.
fn start_relay(lab: &mut Lab, topo: &Topology, opts: &Options, seal: bool) -> Result<Vec<PathBuf>> {
    let dir = lab.work.join(if seal { "relay-gcm" } else { "relay" });
    std::fs::create_dir_all(&dir)?;
    // The key file's path, for sealing only.
    let key_arg = if seal {
        let key_file = dir.join("key");
        let key = zeroize::Zeroizing::new(netlab::random_hex(16)?);
        netlab::write_private(&key_file, &key)?;
        Some(key_file.to_string_lossy().into_owned())
    } else {
        None
    };
    let mtu = opts.settings.mtu;
    let exe = opts.exe.to_string_lossy().into_owned();
    let sides = [
        ("a", &topo.ga, GW_A, GW_B, NET_B),
        ("b", &topo.gb, GW_B, GW_A, NET_A),
    ];
    let mut logs = Vec::new();
    for (side, ns, local, peer, remote_net) in sides {
        let iface = format!("egrelay{side}");
        let log_path = dir.join(format!("{side}.log"));
        let log = std::fs::File::create(&log_path)?;
        let what = format!("relay {side}");
        let mtu_arg = mtu.to_string();
        let (local, peer) = (format!("{local}:51821"), format!("{peer}:51821"));
        let mut argv = vec![
            exe.as_str(),
            "bench",
            "relay",
            "--tun",
            &iface,
            "--local",
            &local,
            "--peer",
            &peer,
            "--mtu",
            &mtu_arg,
        ];
        if let Some(k) = &key_arg {
            argv.extend(["--seal-key-file", k.as_str()]);
        }
        lab.spawn(
            &what,
            in_ns(ns, &argv)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
        )?;
        logs.push(log_path);
        wait_for(
            lab,
            &[&what],
            Duration::from_secs(10),
            "its interface",
            || ip(&["-n", ns, "link", "show", &iface]).is_ok(),
        )
        .map_err(|e| with_logs(e, &logs))?;
        // espgate's TUN MTU at this path MTU (ESP in UDP, AES-GCM).
        let inner = (mtu - 62).to_string();
        ip(&[
            "-n",
            ns,
            "link",
            "set",
            &iface,
            "mtu",
            &inner,
            "txqueuelen",
            "10000",
            "up",
        ])?;
        ip(&["-n", ns, "route", "add", remote_net, "dev", &iface])?;
    }
    Ok(logs)
}

/// `SHA256 Fingerprint=AB:CD:…` from `openssl x509 -fingerprint`: the hex.
pub fn parse_fingerprint(out: &str) -> Option<String> {
    let f = out.lines().find(|l| l.contains("Fingerprint="))?;
    let hex = f.split('=').nth(1)?.trim().to_string();
    let ok = hex.len() == 95
        && hex
            .split(':')
            .all(|b| b.len() == 2 && b.bytes().all(|c| c.is_ascii_hexdigit()));
    ok.then_some(hex)
}

fn start_openvpn(lab: &mut Lab, topo: &Topology, dir: &Path, mtu: u32) -> Result<Vec<PathBuf>> {
    let mut certs = Vec::new();
    for side in ["a", "b"] {
        let (key, crt) = (
            dir.join(format!("{side}.key")),
            dir.join(format!("{side}.crt")),
        );
        run(Command::new("openssl").args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            &key.to_string_lossy(),
            "-out",
            &crt.to_string_lossy(),
            "-days",
            "2",
            "-nodes",
            "-subj",
            &format!("/CN=gw{side}"),
        ]))
        .context("making a certificate with openssl")?;
        let fp = run(Command::new("openssl").args([
            "x509",
            "-in",
            &crt.to_string_lossy(),
            "-noout",
            "-fingerprint",
            "-sha256",
        ]))?;
        let fp = parse_fingerprint(&fp)
            .ok_or_else(|| anyhow!("no SHA-256 fingerprint in openssl's output: {fp}"))?;
        certs.push((key, crt, fp));
    }
    let mut logs = Vec::new();
    let mut whats = Vec::new();
    for (i, (side, ns, local, remote, ifc_local, ifc_remote, route, role)) in [
        (
            "a",
            &topo.ga,
            GW_A,
            GW_B,
            "10.99.0.1",
            "10.99.0.2",
            "10.2.0.0",
            "--tls-server",
        ),
        (
            "b",
            &topo.gb,
            GW_B,
            GW_A,
            "10.99.0.2",
            "10.99.0.1",
            "10.1.0.0",
            "--tls-client",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let (key, crt, _) = &certs[i];
        let peer_fp = &certs[1 - i].2;
        let log_path = dir.join(format!("{side}.log"));
        let log = std::fs::File::create(&log_path)?;
        let (key, crt) = (key.to_string_lossy(), crt.to_string_lossy());
        let mut args = vec![
            "openvpn",
            "--dev",
            "ovpn0",
            "--dev-type",
            "tun",
            "--proto",
            "udp",
            "--local",
            local,
            "--lport",
            "1194",
            "--remote",
            remote,
            "--rport",
            "1194",
            "--ifconfig",
            ifc_local,
            ifc_remote,
            "--route",
            route,
            "255.255.255.0",
            role,
            "--cert",
            &crt,
            "--key",
            &key,
            "--peer-fingerprint",
            peer_fp,
            "--data-ciphers",
            "AES-128-GCM",
            "--disable-dco",
            "--verb",
            "3",
        ];
        if role == "--tls-server" {
            args.extend(["--dh", "none"]);
        }
        let (tun_mtu, mssfix) = ((mtu - 100).to_string(), (mtu - 8).to_string());
        if mtu != 1500 {
            args.extend(["--tun-mtu", &tun_mtu, "--mssfix", &mssfix]);
        }
        let what = format!("openvpn {side}");
        lab.spawn(
            &what,
            in_ns(ns, &args)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
        )?;
        logs.push(log_path);
        whats.push(what);
    }
    let whats: Vec<&str> = whats.iter().map(String::as_str).collect();
    let done = |p: &PathBuf| {
        std::fs::read_to_string(p).is_ok_and(|t| t.contains("Initialization Sequence Completed"))
    };
    wait_for(
        lab,
        &whats,
        Duration::from_secs(30),
        "\"Initialization Sequence Completed\" from both",
        || logs.iter().all(done),
    )
    .map_err(|e| with_logs(e, &logs))?;
    Ok(logs)
}

/// charon, where Debian and others put it.
fn charon_path() -> Option<PathBuf> {
    [
        "/usr/lib/ipsec/charon",
        "/usr/libexec/ipsec/charon",
        "/usr/lib/strongswan/charon",
        "/usr/libexec/strongswan/charon",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// strongSwan's plugin directory.
fn plugin_dir() -> Option<PathBuf> {
    let charon = charon_path()?;
    let p = charon.parent()?.join("plugins");
    p.is_dir().then_some(p)
}

/// strongswan.conf of one charon: kernel-libipsec (userspace ESP, the
/// kernel has no XFRM here), its own vici socket and log.
pub fn strongswan_conf(vici: &Path, log: &Path) -> String {
    format!(
        "# generated by espgate bench tunnel\n\
         charon {{\n  \
           load = random nonce openssl pem pkcs1 x509 pubkey gcm aes sha1 sha2 hmac kdf \
         kernel-libipsec kernel-netlink socket-default vici\n  \
           port = 500\n  port_nat_t = 4500\n  \
           filelog {{\n    log {{\n      path = {}\n      default = 1\n      time_format = %T\n    }}\n  }}\n  \
           plugins {{\n    vici {{\n      socket = unix://{}\n    }}\n  }}\n\
         }}\n",
        log.display(),
        vici.display()
    )
}

/// swanctl.conf of one side: IKEv2 with a PSK, one tunnel-mode child
/// `net` with ESP aes128gcm16, UDP encapsulation.
#[allow(clippy::too_many_arguments)]
pub fn swanctl_conf(
    local: &str,
    remote: &str,
    local_id: &str,
    remote_id: &str,
    local_ts: &str,
    remote_ts: &str,
    psk: &str,
) -> String {
    format!(
        "connections {{\n  bench {{\n    version = 2\n    local_addrs = {local}\n    remote_addrs = {remote}\n    \
         encap = yes\n    local {{\n      auth = psk\n      id = {local_id}\n    }}\n    \
         remote {{\n      auth = psk\n      id = {remote_id}\n    }}\n    \
         children {{\n      net {{\n        local_ts = {local_ts}\n        remote_ts = {remote_ts}\n        \
         esp_proposals = aes128gcm16\n        mode = tunnel\n      }}\n    }}\n  }}\n}}\n\
         secrets {{\n  ike-bench {{\n    id-a = gwa\n    id-b = gwb\n    secret = 0x{psk}\n  }}\n}}\n"
    )
}

fn start_strongswan(lab: &mut Lab, topo: &Topology, dir: &Path) -> Result<Vec<PathBuf>> {
    let charon = charon_path().ok_or_else(|| anyhow!("charon not found"))?;
    let psk = random_hex(32)?;
    let mut logs = Vec::new();
    let mut vicis = Vec::new();
    let mut whats = Vec::new();
    for (side, ns, local, remote, lid, rid, lts, rts) in [
        ("a", &topo.ga, GW_A, GW_B, "gwa", "gwb", NET_A, NET_B),
        ("b", &topo.gb, GW_B, GW_A, "gwb", "gwa", NET_B, NET_A),
    ] {
        let d = dir.join(side);
        let run_dir = d.join("run");
        std::fs::create_dir_all(&run_dir)?;
        let (vici, log, out) = (
            d.join("charon.vici"),
            d.join("charon.log"),
            d.join("stdout"),
        );
        let conf = d.join("strongswan.conf");
        write_private(&conf, &strongswan_conf(&vici, &log))?;
        write_private(
            &d.join("swanctl.conf"),
            &swanctl_conf(local, remote, lid, rid, lts, rts, &psk),
        )?;
        let rd = run_dir.to_string_lossy();
        ensure!(
            !rd.contains('\'') && !charon.to_string_lossy().contains('\''),
            "{rd}: a path with a quote"
        );
        // charon's pid file is /var/run/charon.pid: a private /run each.
        let script = format!(
            "mount --bind '{rd}' /run && exec '{}'",
            charon.to_string_lossy()
        );
        // The last round's charon leaves its socket behind: gone first, so
        // that only this charon's socket can be waited for below.
        match std::fs::remove_file(&vici) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(anyhow!("removing {}: {e}", vici.display()))
            }
            _ => {}
        }
        let outf = std::fs::File::create(&out)?;
        let what = format!("charon {side}");
        lab.spawn(
            &what,
            in_ns(ns, &["unshare", "-m", "sh", "-c", &script])
                .env("STRONGSWAN_CONF", &conf)
                .stdin(Stdio::null())
                .stdout(outf.try_clone()?)
                .stderr(outf),
        )?;
        logs.extend([out, log]);
        vicis.push((d.join("swanctl.conf"), vici));
        whats.push(what);
    }
    for ((conf, vici), what) in vicis.iter().zip(&whats) {
        wait_for(
            lab,
            &[what],
            Duration::from_secs(15),
            "its vici socket",
            || std::os::unix::net::UnixStream::connect(vici).is_ok(),
        )
        .map_err(|e| with_logs(e, &logs))?;
        let uri = format!("unix://{}", vici.display());
        run_timeout(
            Command::new("swanctl").args([
                "--load-all",
                "--file",
                &conf.to_string_lossy(),
                "--uri",
                &uri,
            ]),
            Duration::from_secs(30),
        )
        .map_err(|e| with_logs(e, &logs))?;
    }
    let uri = format!("unix://{}", vicis[0].1.display());
    run_timeout(
        Command::new("swanctl").args(["--initiate", "--child", "net", "--uri", &uri]),
        Duration::from_secs(30),
    )
    .map_err(|e| with_logs(e.context("swanctl --initiate"), &logs))?;
    Ok(logs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP_JSON: &str = r#"{"start":{},"intervals":[],"end":{
        "streams":[],
        "sum_sent":{"start":0,"end":1.0,"seconds":1.0,"bytes":125000000,"bits_per_second":1000000000.0,"retransmits":3,"sender":true},
        "sum_received":{"start":0,"end":1.0,"seconds":1.0,"bytes":118750000,"bits_per_second":950000000.0,"sender":true},
        "cpu_utilization_percent":{}}}"#;

    // iperf 3.12, -u -l 512 -b 0: the receiver got 164179 of 480164.
    const UDP_JSON: &str = r#"{"start":{},"intervals":[],"end":{
        "streams":[],
        "sum":{"start":0,"end":1.000265,"seconds":1.000265,"bytes":247014400,"bits_per_second":1975694377.0976782,"jitter_ms":0.0001,"lost_packets":315985,"packets":482450,"lost_percent":65.4959063115349,"sender":true},
        "sum_sent":{"start":0,"end":1.000213,"seconds":1.000213,"bytes":247014400,"bits_per_second":1975694377.0976782,"jitter_ms":0,"lost_packets":0,"packets":482450,"lost_percent":0,"sender":true},
        "sum_received":{"start":0,"end":1.000265,"seconds":1.000265,"bytes":84059648,"bits_per_second":672299024.758439,"jitter_ms":0.0001,"lost_packets":315985,"packets":480164,"lost_percent":65.4959063115349,"sender":false},
        "cpu_utilization_percent":{}}}"#;

    fn settings() -> Settings {
        Settings {
            pin: None,
            iperf_window: None,
            udp_rate_mbps: None,
            mtu: 1500,
            offloads: true,
            workers: None,
            per_cpu_sas: None,
            batch: Some(32),
            socket_buffer: None,
            mss_clamp: true,
            encap: Encapsulation::Udp,
            time_s: 10,
            scrape_hz: 0,
        }
    }

    fn sample(mbps: f64, pps: Option<f64>, cpu: &[(&str, f64)]) -> Sample {
        Sample {
            mbps,
            pps,
            loss_percent: pps.map(|_| 1.0),
            cpu: cpu.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            rss_mib: cpu
                .iter()
                .map(|(k, v)| (k.to_string(), *v / 10.0))
                .collect(),
            started_s: mbps / 1000.0,
            round: 1,
            retransmits: pps.is_none().then_some(7),
            steal_percent: None,
            buffer_drops: None,
        }
    }

    /// The drops per second come from the growth of `RcvbufErrors` in
    /// each namespace; a missing counter or one that went backwards (the
    /// namespace was made anew) gives no reading rather than a wrong one.
    #[test]
    fn buffer_drops_are_the_rcvbuf_errors_growth() {
        let m = |v: u64| -> BTreeMap<String, u64> {
            [("RcvbufErrors".to_string(), v), ("InDatagrams".into(), 9)]
                .into_iter()
                .collect()
        };
        let d = BufferDrops::between((&m(100), &m(7)), (&m(2100), &m(7)), 10.0);
        assert_eq!(
            d,
            Some(BufferDrops {
                host_b_pps: 200.0,
                gateway_b_pps: 0.0
            })
        );
        assert_eq!(
            BufferDrops::between((&m(100), &m(7)), (&m(50), &m(7)), 10.0),
            None
        );
        let none = BTreeMap::new();
        assert_eq!(
            BufferDrops::between((&m(1), &none), (&m(2), &m(3)), 10.0),
            None
        );
        assert_eq!(
            BufferDrops::between((&m(1), &m(1)), (&m(2), &m(3)), 0.0),
            None
        );
    }

    /// A UDP row sums up where its datagrams were lost and what reached
    /// host B's socket, against plain routing's; TCP rows and rows without
    /// readings add nothing.
    #[test]
    fn buffer_drops_are_shown_per_udp_row() {
        let s = settings();
        // Each run: delivered datagrams/s, loss %, (host B, gateway B) drops/s.
        type Run = (f64, f64, Option<(f64, f64)>);
        let row = |sys: &System, test: Test, runs: &[Run]| {
            let samples: Vec<Sample> = runs
                .iter()
                .map(|(pps, loss, d)| Sample {
                    loss_percent: Some(*loss),
                    buffer_drops: d.map(|(h, g)| BufferDrops {
                        host_b_pps: h,
                        gateway_b_pps: g,
                    }),
                    ..sample(pps * 0.512, Some(*pps), &[])
                })
                .collect();
            Row::new(sys, test, &samples, None, &s)
        };
        let esp = System::Espgate("aes128gcm16".into());
        let mut r = vec![
            row(
                &System::Plain,
                Test::Udp(64),
                &[(300_000.0, 20.0, Some((60_000.0, 0.0))); 3],
            ),
            row(
                &esp,
                Test::Udp(64),
                &[
                    (100_000.0, 75.0, Some((250_000.0, 10.0))),
                    (140_000.0, 60.0, Some((210_000.0, 0.0))),
                    (120_000.0, 70.0, None),
                ],
            ),
            row(&esp, Test::Tcp, &[(0.0, 0.0, None)]),
        ];
        fill_ratios(&mut r);
        assert_eq!(r[1].runs_host_b_drops_pps, [250_000.0, 210_000.0]);
        assert_eq!(r[1].runs_gateway_b_drops_pps, [10.0, 0.0]);
        // Sent: 400 000, 350 000 and 400 000 a second.
        assert_eq!(r[1].median_sent_pps, Some(400_000.0));
        // Runs 1 and 2 have readings: 350 000 reached host B each time.
        assert_eq!(r[1].median_reached_pps, Some(350_000.0));
        assert_eq!(r[0].median_reached_pps, Some(360_000.0));
        assert_eq!(r[1].reached_ratio_to_plain, Some(round(350.0 / 360.0, 4)));
        assert_eq!(r[0].reached_ratio_to_plain, Some(1.0));
        assert_eq!(r[2].median_reached_pps, None);
        assert_eq!(r[2].median_sent_pps, None);
        let text = render_table(&r, &s, 3);
        assert!(
            text.contains(
                "  plain udp64: sent 375000/s, 360000/s reached host B's socket (0.960 of those \
                 sent), its full buffer dropped 60000/s; gateway B's UDP sockets dropped 0/s\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "  espgate udp64: sent 400000/s, 350000/s reached host B's socket (0.875 of those \
                 sent, 0.972 of plain's), its full buffer dropped 230000/s; gateway B's UDP \
                 sockets dropped 5/s\n"
            ),
            "{text}"
        );
        assert!(!text.contains("espgate tcp:"), "{text}");
        assert!(
            text.contains(
                "\n  Most of the loss of espgate udp64 was at host B's socket: the receiving \
                 application, not the path."
            ),
            "{text}"
        );
        // Where the tunnel loses most of it, no such hint.
        let mut lossy = r.clone();
        lossy[1].runs_host_b_drops_pps = vec![1_000.0];
        assert!(!render_table(&lossy, &s, 3).contains("Most of the loss"));
        let tcp_only = vec![r[2].clone()];
        assert!(!render_table(&tcp_only, &s, 1).contains("where the datagrams went"));
    }

    #[test]
    fn cpu_steal_is_read_from_proc_stat() {
        let stat = "cpu  218247 0 66418 117267 1459 0 20592 8157 0 0\n\
                    cpu0 109000 0 33000 58000 700 0 10000 4000 0 0\n";
        assert_eq!(
            cpu_steal_total(stat),
            Some((8157, 218247 + 66418 + 117267 + 1459 + 20592 + 8157))
        );
        assert_eq!(cpu_steal_total("cpu  1 2 3\n"), None);
        assert_eq!(cpu_steal_total("cpu  1 2 3 4 5 6 x 8\n"), None);
        assert_eq!(cpu_steal_total("intr 5\n"), None);
        assert_eq!(steal_percent((100, 1000), (150, 1200)), Some(25.0));
        assert_eq!(steal_percent((100, 1000), (100, 1000)), None);
        assert_eq!(steal_percent((100, 1000), (90, 1200)), None);
    }

    /// Each system's runs' steal is summed up under the table; a row
    /// without readings adds nothing.
    #[test]
    fn the_runs_steal_is_shown_per_system() {
        let s = settings();
        let row = |sys: &System, test: Test, steal: &[Option<f64>]| {
            let samples: Vec<Sample> = steal
                .iter()
                .map(|st| Sample {
                    steal_percent: *st,
                    ..sample(1000.0, None, &[])
                })
                .collect();
            Row::new(sys, test, &samples, None, &s)
        };
        let esp = System::Espgate("aes128gcm16".into());
        let r = vec![
            row(
                &System::Plain,
                Test::Tcp,
                &[Some(1.0), Some(2.0), Some(3.0)],
            ),
            row(&esp, Test::Tcp, &[Some(40.04), Some(2.0), None]),
            row(&esp, Test::Udp(64), &[Some(1.0)]),
        ];
        assert_eq!(r[1].runs_steal_percent, [40.0, 2.0]);
        let text = render_table(&r, &s, 3);
        assert!(
            text.contains("  plain: median 2.0, max 3.0\n  espgate: median 2.0, max 40.0\n"),
            "{text}"
        );
        let none = vec![row(&System::Plain, Test::Tcp, &[None])];
        assert!(!render_table(&none, &s, 1).contains("CPU steal"));
    }

    #[test]
    fn iperf_tcp_is_the_receiver_rate() {
        let v: serde_json::Value = serde_json::from_str(TCP_JSON).unwrap();
        let (mbps, pps, loss) = parse_iperf(Test::Tcp, &v).unwrap();
        assert_eq!(mbps, 950.0);
        assert_eq!((pps, loss), (None, None));
        assert_eq!(tcp_retransmits(&v), Some(3));
    }

    #[test]
    fn iperf_udp_is_what_the_receiver_got() {
        let v: serde_json::Value = serde_json::from_str(UDP_JSON).unwrap();
        let (mbps, pps, loss) = parse_iperf(Test::Udp(512), &v).unwrap();
        // Not the sender's 1975 Mbit/s.
        assert!((mbps - 672.299024758439).abs() < 1e-9, "{mbps}");
        let delivered = 480164.0 - 315985.0;
        assert_eq!(delivered * 512.0, 84059648.0);
        assert!((pps.unwrap() - delivered / 1.000265).abs() < 1e-6);
        assert!((loss.unwrap() - 315985.0 / 480164.0 * 100.0).abs() < 1e-9);
    }

    #[test]
    fn iperf_udp_without_sum_received_uses_the_server_losses() {
        let mut v: serde_json::Value = serde_json::from_str(UDP_JSON).unwrap();
        v["end"].as_object_mut().unwrap().remove("sum_received");
        let (mbps, pps, _) = parse_iperf(Test::Udp(512), &v).unwrap();
        let delivered = 482450.0 - 315985.0;
        assert!((pps.unwrap() - delivered / 1.000265).abs() < 1e-6);
        assert!((mbps - delivered * 512.0 * 8.0 / 1.000265 / 1e6).abs() < 1e-9);
    }

    #[test]
    fn iperf_errors_are_reported() {
        let v = serde_json::json!({"start": {}, "error": "unable to connect to server: Connection refused"});
        let e = parse_iperf(Test::Tcp, &v).unwrap_err().to_string();
        assert!(e.contains("Connection refused"), "{e}");
        let e = parse_iperf(Test::Udp(64), &serde_json::json!({"end": {}})).unwrap_err();
        assert!(e.to_string().contains("UDP receiver"), "{e}");
    }

    #[test]
    fn median_min_max() {
        assert_eq!(stats(&[3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(stats(&[4.0, 1.0]), Some((2.5, 1.0, 4.0)));
        assert_eq!(stats(&[7.0]), Some((7.0, 7.0, 7.0)));
        assert_eq!(stats(&[]), None);
    }

    fn rows() -> Vec<Row> {
        let s = settings();
        let plain = System::Plain;
        let esp = System::Espgate("aes128gcm16".into());
        let wg = System::Peer(Peer::WireguardGo);
        let mut rows = vec![
            Row::new(
                &plain,
                Test::Tcp,
                &[
                    sample(9000.0, None, &[]),
                    sample(10000.0, None, &[]),
                    sample(11000.0, None, &[]),
                ],
                None,
                &s,
            ),
            Row::new(
                &plain,
                Test::Udp(512),
                &[
                    sample(800.0, Some(195000.0), &[]),
                    sample(1000.0, Some(200000.0), &[]),
                ],
                None,
                &s,
            ),
            Row::new(
                &esp,
                Test::Tcp,
                &[
                    sample(
                        2500.0,
                        None,
                        &[("espgate@gwA", 90.0), ("espgate@gwB", 50.0)],
                    ),
                    sample(
                        2000.0,
                        None,
                        &[("espgate@gwA", 80.0), ("espgate@gwB", 70.0)],
                    ),
                    sample(
                        3000.0,
                        None,
                        &[("espgate@gwA", 99.0), ("espgate@gwB", 60.0)],
                    ),
                ],
                None,
                &s,
            ),
            Row::new(
                &esp,
                Test::Udp(512),
                &[sample(450.0, Some(100000.0), &[("espgate@gwA", 100.0)])],
                Some("iperf3: boom".into()),
                &s,
            ),
            Row::new(
                &wg,
                Test::Tcp,
                &[],
                Some("wireguard-go did not come up: no interface\nlog line".into()),
                &s,
            ),
            Row::new(
                &wg,
                Test::Udp(512),
                &[],
                Some("wireguard-go did not come up: no interface\nlog line".into()),
                &s,
            ),
        ];
        // As measure_all numbers them: each system's i-th run in round i.
        for r in &mut rows {
            r.runs_round = (1..=r.runs).collect();
        }
        fill_ratios(&mut rows);
        for r in &mut rows {
            r.version = Some(match r.system.as_str() {
                "plain" => "6.1.0-test".into(),
                "espgate" => "0.1.0".into(),
                _ => WIREGUARD_GO_VERSION.into(),
            });
        }
        rows
    }

    #[test]
    fn rows_aggregate_runs_and_ratios_use_plain_of_the_same_test() {
        let r = rows();
        assert_eq!(r[0].median_mbps, Some(10000.0));
        assert_eq!(
            (r[0].min_mbps, r[0].max_mbps),
            (Some(9000.0), Some(11000.0))
        );
        assert_eq!(r[0].ratio_to_plain, Some(1.0));
        assert_eq!(r[0].median_pps, None);
        assert_eq!(r[1].median_mbps, Some(900.0));
        assert_eq!(r[1].median_pps, Some(197500.0));
        assert_eq!(r[1].loss_percent, Some(1.0));
        assert_eq!(r[1].ratio_to_plain, Some(1.0));
        assert_eq!(r[2].median_mbps, Some(2500.0));
        assert_eq!(r[2].ratio_to_plain, Some(0.25));
        assert_eq!(r[2].runs, 3);
        assert_eq!(r[2].runs_mbps, vec![2500.0, 2000.0, 3000.0]);
        // Each run's start, in the runs' order (the helper makes it mbps / 1000).
        assert_eq!(r[2].runs_started_s, vec![2.5, 2.0, 3.0]);
        assert_eq!(r[2].runs_retransmits, vec![7, 7, 7]);
        // UDP rows have none.
        assert!(r[1].runs_retransmits.is_empty());
        assert_eq!(r[2].cpu["espgate@gwA"], 90.0);
        assert_eq!(r[2].cpu["espgate@gwB"], 60.0);
        assert_eq!(r[2].suite.as_deref(), Some("aes128gcm16"));
        assert_eq!(r[3].ratio_to_plain, Some(0.5));
        assert_eq!(r[4].runs, 0);
        assert_eq!((r[4].median_mbps, r[4].ratio_to_plain), (None, None));
        // Without plain's row, no ratio.
        let mut only: Vec<Row> = r[2..].to_vec();
        fill_ratios(&mut only);
        assert!(only.iter().all(|x| x.ratio_to_plain.is_none()));
    }

    #[test]
    fn json_rows_have_the_documented_keys() {
        let v = serde_json::to_value(rows()).unwrap();
        for k in [
            "system",
            "version",
            "test",
            "median_mbps",
            "min_mbps",
            "max_mbps",
            "runs",
            "runs_mbps",
            "runs_started_s",
            "runs_retransmits",
            "ratio_to_plain",
            "cpu",
            "median_pps",
            "loss_percent",
            "error",
            "settings",
        ] {
            assert!(v[0].get(k).is_some(), "{k} missing in {}", v[0]);
        }
        assert_eq!(v[3]["settings"]["batch"], 32);
        assert!(v[3]["settings"]["workers"].is_null());
        assert_eq!(v[3]["settings"]["mtu"], 1500);
        assert_eq!(v[2]["cpu"]["espgate@gwA"], 90.0);
        // Peak memory: the largest over the runs (the helper makes it cpu / 10).
        assert!(v[2]["peak_rss_mib"]["espgate@gwA"]
            .as_f64()
            .is_some_and(|m| m > 0.0));
        assert_eq!(v[1]["median_pps"], 197500.0);
        assert!(v[0]["median_pps"].is_null());
    }

    #[test]
    fn table_text_is_pinned() {
        let want = "\
espgate bench tunnel: iperf3 host A -> host B, 3 run(s) of 10 s per test; mtu 1500, offloads on, workers default, batch 32, sockbuf default, mss-clamp on, encap udp (all but mtu: espgate only)
espgate: ESP-in-UDP, manual keys, aes128gcm16 (AES-GCM in aws-lc)
versions:
  plain         6.1.0-test (Linux kernel forwarding)
  espgate       0.1.0
  wireguard-go  v0.0.0-20260522210424-ecfc5a8d5446 (golang.zx2c4.com/wireguard, built with go install)
Mbit/s, pps (packets delivered per second) and loss: receiver side; vs plain: median / plain routing's median; CPU s/Gbit: the gateway processes' CPU seconds per gigabit delivered

system        test         median         min         max        pps    loss  vs plain  CPU s/Gbit  CPU % of one core (median)
plain         tcp         10000.0      9000.0     11000.0          -       -     1.000           -  -
plain         udp512        900.0       800.0      1000.0     197500    1.0%     1.000           -  -
espgate       tcp          2500.0      2000.0      3000.0          -       -     0.250       0.600  espgate@gwA 90%, espgate@gwB 60%
espgate       udp512        450.0       450.0       450.0     100000    1.0%     0.500       2.222  espgate@gwA 100%
wireguard-go  tcp      failed: wireguard-go did not come up: no interface
wireguard-go  udp512   failed: wireguard-go did not come up: no interface

Round by round: espgate's run / the other system's run of the same round (taken back to back, so a drift of the host's load between rounds drops out; their spread is what single runs vary; * a run of the pair had more than 10 % CPU steal):
  espgate tcp / plain: 0.278, 0.200, 0.273 (median 0.273)

peak resident memory (VmHWM), MiB:
  espgate: espgate@gwA 10.0, espgate@gwB 7.0

failures:
- espgate udp512: 2 of 3 runs failed: iperf3: boom
- (tcp, udp512) wireguard-go: wireguard-go did not come up: no interface
log line
";
        // Which library runs AES-GCM depends on the CPU: pinned here.
        let mut r = rows();
        for x in r.iter_mut().filter(|x| x.aes_gcm.is_some()) {
            x.aes_gcm = Some("aws-lc");
        }
        assert!(r.iter().any(|x| x.aes_gcm.is_some()));
        let text = render_table(&r, &settings(), 3);
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn espgate_is_set_against_every_other_system_of_the_same_test() {
        let s = settings();
        let row = |sys: &System, test: Test, mbps: &[f64]| {
            let samples: Vec<Sample> = mbps.iter().map(|m| sample(*m, None, &[])).collect();
            Row::new(sys, test, &samples, None, &s)
        };
        let esp = System::Espgate("aes128gcm16".into());
        let wg = System::Peer(Peer::WireguardGo);
        let mut r = vec![
            row(&System::Plain, Test::Tcp, &[10000.0]),
            row(&System::RelayGcm, Test::Tcp, &[3000.0, 3200.0, 3400.0]),
            row(&esp, Test::Tcp, &[2400.0]),
            row(&wg, Test::Tcp, &[1000.0, 1200.0]),
            row(&esp, Test::Udp(64), &[50.0]),
            // No median: left out, not divided by.
            row(&wg, Test::Udp(64), &[]),
        ];
        fill_ratios(&mut r);
        let text = render_table(&r, &s, 1);
        let want = "\nespgate's median / each other system's median, same test, same run:\n  \
                    espgate tcp: relay-gcm 0.75, wireguard-go 2.18\n";
        assert!(text.contains(want), "{text}");
        assert!(!text.contains("espgate udp64:"), "{text}");
        // Nothing beside espgate: no such lines.
        r.retain(|x| x.system == "espgate" || x.system == "plain");
        assert!(!render_table(&r, &s, 1).contains("each other system"));
    }

    /// Runs are paired by round, not by position: a failed run leaves its
    /// round out of every pair it would be in, and a run with much steal
    /// marks its pairs.
    #[test]
    fn runs_are_set_against_the_other_systems_run_of_the_same_round() {
        let s = settings();
        // Each run: (round, Mbit/s, steal %).
        let row = |sys: &System, runs: &[(usize, f64, f64)]| {
            let samples: Vec<Sample> = runs
                .iter()
                .map(|(round, mbps, steal)| Sample {
                    round: *round,
                    steal_percent: Some(*steal),
                    ..sample(*mbps, None, &[])
                })
                .collect();
            Row::new(sys, Test::Tcp, &samples, None, &s)
        };
        let esp = System::Espgate("aes128gcm16".into());
        let mut r = vec![
            row(
                &System::Plain,
                &[(1, 10000.0, 1.0), (2, 8000.0, 30.0), (3, 12000.0, 2.0)],
            ),
            row(
                &System::RelayGcm,
                &[(1, 6000.0, 1.0), (2, 5000.0, 1.0), (3, 4000.0, 1.0)],
            ),
            // Round 3's run failed.
            row(&esp, &[(1, 3000.0, 1.0), (2, 4000.0, 1.0)]),
            // One round in common with espgate: no round-by-round line.
            row(&System::Peer(Peer::WireguardGo), &[(2, 1000.0, 1.0)]),
        ];
        assert_eq!(r[2].runs_round, [1, 2]);
        let pairs = paired_ratios(&r[2], &r[0]);
        assert_eq!(pairs, [(0.3, false), (0.5, true)]);
        assert_eq!(
            paired_ratios(&r[0], &r[2]),
            [(10.0 / 3.0, false), (2.0, true)]
        );
        fill_ratios(&mut r);
        assert_eq!(r[0].paired_ratio_to_plain, Some(1.0));
        assert_eq!(r[1].paired_ratio_to_plain, Some(0.6));
        assert_eq!(r[2].paired_ratio_to_plain, Some(0.4));
        // The medians' ratio mixes rounds: 3500 / 10000.
        assert_eq!(r[2].ratio_to_plain, Some(0.35));
        let text = render_table(&r, &s, 3);
        let want = "  espgate tcp / plain: 0.300, 0.500* (median 0.400)\n  \
                    espgate tcp / relay-gcm: 0.50, 0.80 (median 0.65)\n";
        assert!(text.contains(want), "{text}");
        assert!(!text.contains("/ wireguard-go:"), "{text}");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v[2]["runs_round"], serde_json::json!([1, 2]));
        assert_eq!(v[2]["paired_ratio_to_plain"], 0.4);
        // A row whose runs do not all have a steal reading marks nothing:
        // its readings cannot be matched to its runs.
        r[0].runs_steal_percent.pop();
        assert_eq!(paired_ratios(&r[2], &r[0]), [(0.3, false), (0.5, false)]);
        // One round: nothing beyond the medians' ratio to show.
        let one = vec![
            row(&System::Plain, &[(1, 10000.0, 1.0)]),
            row(&esp, &[(1, 3000.0, 1.0)]),
        ];
        assert!(!render_table(&one, &s, 1).contains("Round by round"));
    }

    #[test]
    fn json_rows_carry_each_systems_version() {
        let v = serde_json::to_value(rows()).unwrap();
        assert_eq!(v[0]["version"], "6.1.0-test");
        assert_eq!(v[2]["version"], "0.1.0");
        assert_eq!(v[4]["version"], WIREGUARD_GO_VERSION);
        assert_eq!(v[4]["system"], "wireguard-go");
        // Unknown: null, and the key is still there.
        let mut r = rows();
        r[0].version = None;
        let v = serde_json::to_value(&r).unwrap();
        assert!(v[0].get("version").is_some_and(|x| x.is_null()), "{}", v[0]);
    }

    #[test]
    fn table_prints_each_systems_version_once() {
        let mut r = rows();
        // A system's version comes from the first row that knows it.
        r[0].version = None;
        let row = |sys: &System, v: &str| Row {
            version: Some(v.into()),
            ..Row::new(
                sys,
                Test::Tcp,
                &[],
                Some("no interface".into()),
                &settings(),
            )
        };
        r.push(row(
            &System::Peer(Peer::WireguardGoDebian),
            "0.0.20220316-1+b4",
        ));
        r.push(row(&System::Peer(Peer::Boringtun), BORINGTUN_VERSION));
        r.push(Row::new(
            &System::Peer(Peer::Openvpn),
            Test::Tcp,
            &[],
            Some("openvpn is not installed".into()),
            &settings(),
        ));
        let t = render_table(&r, &settings(), 3);
        let block: Vec<&str> = t
            .split("\nversions:\n")
            .nth(1)
            .expect("a versions block")
            .lines()
            .take_while(|l| l.starts_with("  "))
            .collect();
        assert_eq!(
            block,
            [
                "  plain                6.1.0-test (Linux kernel forwarding)",
                "  espgate              0.1.0",
                "  wireguard-go         v0.0.0-20260522210424-ecfc5a8d5446 (golang.zx2c4.com/wireguard, built with go install)",
                "  wireguard-go-debian  0.0.20220316-1+b4 (Debian's 2022 build, without the TUN offloads of 2023+)",
                "  boringtun            0.7.1 (boringtun-cli from crates.io, built with cargo install)",
                "  openvpn              unknown (userspace, no DCO)",
            ],
            "\n{t}"
        );
        // Above the table.
        assert!(t.find("versions:").unwrap() < t.find("\nsystem ").unwrap());
    }

    #[test]
    fn peers_parse_by_name_and_unknown_names_are_refused() {
        for name in PEERS {
            let p = Peer::parse(name).unwrap();
            assert_eq!(p.name(), name);
            assert_eq!(System::Peer(p).name(), name);
        }
        assert_eq!(Peer::parse("wireguard-go").unwrap(), Peer::WireguardGo);
        assert_eq!(
            Peer::parse(" wireguard-go-debian ").unwrap(),
            Peer::WireguardGoDebian
        );
        assert_eq!(Peer::parse("boringtun").unwrap(), Peer::Boringtun);
        let e = Peer::parse("tailscale").unwrap_err().to_string();
        assert_eq!(
            e,
            "--peers tailscale: one of wireguard-go, wireguard-go-debian, boringtun, strongswan, openvpn"
        );
        assert!(Peer::parse("wireguard").is_err());
        assert!(Peer::parse("boringtun-cli").is_err());
    }

    #[test]
    fn built_peers_are_pinned_go_install_and_cargo_install() {
        let cache = Path::new("/c");
        let wg = Peer::WireguardGo.source_build(cache).unwrap();
        assert_eq!(
            wg.dir,
            Path::new("/c/wireguard-go-v0.0.0-20260522210424-ecfc5a8d5446")
        );
        assert_eq!(
            wg.binary_path(),
            Path::new("/c/wireguard-go-v0.0.0-20260522210424-ecfc5a8d5446/wireguard")
        );
        let (argv, env) = wg.command(Path::new("/c/.scratch"));
        assert_eq!(
            argv,
            [
                "go",
                "install",
                "golang.zx2c4.com/wireguard@v0.0.0-20260522210424-ecfc5a8d5446"
            ]
        );
        assert_eq!(env, [("GOBIN".to_string(), "/c/.scratch".to_string())]);
        let bt = Peer::Boringtun.source_build(cache).unwrap();
        assert_eq!(
            bt.binary_path(),
            Path::new("/c/boringtun-0.7.1/bin/boringtun-cli")
        );
        let (argv, env) = bt.command(&bt.dir);
        assert_eq!(
            argv,
            [
                "cargo",
                "install",
                "boringtun-cli",
                "--version",
                "0.7.1",
                "--locked",
                "--root",
                "/c/boringtun-0.7.1"
            ]
        );
        assert!(env.is_empty());
        // The help names the pinned versions.
        assert!(
            USAGE.contains(WIREGUARD_GO_VERSION)
                && USAGE.contains(&format!("boringtun-cli {BORINGTUN_VERSION}"))
        );
        for p in [Peer::WireguardGoDebian, Peer::Strongswan, Peer::Openvpn] {
            assert_eq!(p.source_build(cache), None, "{p:?}");
        }
        // The built ones still need wg from Debian; the Debian one its package.
        assert_eq!(Peer::WireguardGo.packages(), ["wireguard-tools"]);
        assert_eq!(Peer::Boringtun.packages(), ["wireguard-tools"]);
        assert_eq!(
            Peer::WireguardGoDebian.packages(),
            ["wireguard-go", "wireguard-tools"]
        );
    }

    #[test]
    fn wireguard_daemons_run_in_the_foreground() {
        let cache = Path::new("/c");
        let (argv, env) = Peer::WireguardGo.wireguard_command("egw1a", cache).unwrap();
        assert_eq!(
            argv,
            [
                "/c/wireguard-go-v0.0.0-20260522210424-ecfc5a8d5446/wireguard",
                "egw1a"
            ]
        );
        assert!(env.contains(&("WG_PROCESS_FOREGROUND", "1")));
        let (argv, env2) = Peer::WireguardGoDebian
            .wireguard_command("egw1a", cache)
            .unwrap();
        assert_eq!(argv, ["wireguard-go", "egw1a"]);
        assert_eq!(env, env2);
        let (argv, _) = Peer::Boringtun.wireguard_command("egw1b", cache).unwrap();
        assert_eq!(
            argv,
            [
                "/c/boringtun-0.7.1/bin/boringtun-cli",
                "--foreground",
                "--disable-drop-privileges",
                "egw1b"
            ]
        );
        assert_eq!(Peer::Openvpn.wireguard_command("x", cache), None);
    }

    #[test]
    fn versions_are_read_from_version_outputs() {
        assert_eq!(
            version_after("espgate 0.1.0\n", "espgate").as_deref(),
            Some("0.1.0")
        );
        assert_eq!(
            version_after("Linux strongSwan 5.9.8\n", "strongSwan").as_deref(),
            Some("5.9.8")
        );
        let ovpn = "OpenVPN 2.6.14 x86_64-pc-linux-gnu [SSL (OpenSSL)] [LZO]\n\
                    library versions: OpenSSL 3.0.22 25 Aug 2026, LZO 2.10\n";
        assert_eq!(version_after(ovpn, "OpenVPN").as_deref(), Some("2.6.14"));
        assert_eq!(
            version_after(
                "wireguard-go v0.0.20220316\n\nUserspace WireGuard",
                "wireguard-go"
            )
            .as_deref(),
            Some("v0.0.20220316")
        );
        assert_eq!(version_after("espgate", "espgate"), None);
        assert_eq!(version_after("something else 1.0", "espgate"), None);
        assert_eq!(
            parse_go_version("go version go1.26.8 linux/amd64\n"),
            Some((1, 26))
        );
        assert_eq!(
            parse_go_version("go version go1.19.8 linux/amd64"),
            Some((1, 19))
        );
        assert_eq!(
            parse_go_version("go version go1.21 linux/amd64"),
            Some((1, 21))
        );
        assert!(parse_go_version("go version go1.19.8 linux/amd64").unwrap() < WIREGUARD_GO_MIN_GO);
        assert_eq!(parse_go_version("command not found"), None);
        // Plain routing's is the kernel's release; espgate's comes from
        // the gateway binary.
        assert_eq!(about_system("plain"), Some("Linux kernel forwarding"));
        assert_eq!(about_system("espgate"), None);
        assert_eq!(
            System::Espgate("aes128gcm16".into()).version(Path::new("/nonexistent/espgate")),
            None
        );
        // The relay is espgate's own tool, and says it is no VPN.
        assert_eq!(
            System::Relay.version(Path::new("/nonexistent/espgate")),
            None
        );
        assert!(about_system("relay").is_some_and(|a| a.contains("not a VPN")));
        assert!(about_system("relay-gcm").is_some_and(|a| a.contains("not a VPN")));
    }

    #[test]
    fn table_shows_rows_failures_and_settings() {
        let t = render_table(&rows(), &settings(), 3);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("3 run(s) of 10 s"), "{t}");
        assert!(
            lines[0].contains("mtu 1500") && lines[0].contains("batch 32"),
            "{t}"
        );
        assert!(lines[0].contains("workers default"), "{t}");
        let row = |s: &str, test: &str| {
            *lines
                .iter()
                .find(|l| l.split_whitespace().take(2).eq([s, test]))
                .unwrap_or_else(|| panic!("no {s} {test} in\n{t}"))
        };
        let p = row("plain", "tcp");
        assert!(
            p.contains("10000.0") && p.contains("9000.0") && p.contains("1.000"),
            "{p}"
        );
        assert!(p.ends_with("  -"), "{p}");
        let e = row("espgate", "tcp");
        assert!(
            e.contains("0.250") && e.ends_with("espgate@gwA 90%, espgate@gwB 60%"),
            "{e}"
        );
        let u = row("espgate", "udp512");
        assert!(
            u.contains("100000") && u.contains("1.0%") && u.contains("0.500"),
            "{u}"
        );
        let w = row("wireguard-go", "tcp");
        assert!(
            w.contains("failed: wireguard-go did not come up: no interface"),
            "{w}"
        );
        assert!(!w.contains("log line"), "{w}");
        let fails = t.split("\nfailures:\n").nth(1).expect("a failures section");
        assert!(
            fails.contains("log line")
                && fails.contains("espgate udp512: 2 of 3 runs failed: iperf3: boom"),
            "{t}"
        );
        assert!(
            fails.contains("- (tcp, udp512) wireguard-go: wireguard-go did not come up"),
            "{t}"
        );
        assert_eq!(fails.matches("log line").count(), 1, "{t}");
        let mem = t
            .split("\npeak resident memory (VmHWM), MiB:\n")
            .nth(1)
            .expect("a memory section");
        assert!(mem.starts_with("  espgate: espgate@gwA "), "{t}");
        // Columns line up: every measured row is as wide up to the CPU column.
        let header = lines.iter().find(|l| l.starts_with("system")).unwrap();
        let at = header.find("CPU").unwrap();
        assert_eq!(&p[at - 2..at], "  ");
        assert_eq!(&e[at - 2..at], "  ");
    }

    #[test]
    fn options_are_checked_with_the_option_named() {
        let args = |f: &dyn Fn(&mut Args)| {
            let mut a = Args {
                tests: vec![],
                runs: 3,
                time: 10,
                suite: vec!["aes128gcm16".into()],
                peers: vec![],
                json: false,
                prefix: Some("egt-1".into()),
                mtu: 1500,
                offloads: "on".into(),
                workers: None,
                per_cpu_sas: None,
                batch: None,
                sockbuf: None,
                mss_clamp: "on".into(),
                encap: "udp".into(),
                scrape: 0,
                pin: false,
                iperf_window: None,
                udp_rate: None,
                gateway_binary: None,
                relay: false,
            };
            f(&mut a);
            Options::new(&a, PathBuf::from("/x"))
        };
        let o = args(&|_| {}).unwrap();
        assert_eq!(
            o.tests,
            [Test::Tcp, Test::Udp(64), Test::Udp(512), Test::Udp(1400)]
        );
        assert!(!o.systems().iter().any(System::is_relay));
        // --relay: both relays right after plain routing, TCP tests only.
        let r = args(&|a| {
            a.relay = true;
            a.peers = vec!["wireguard-go".into()];
        })
        .unwrap();
        assert_eq!(
            r.systems(),
            [
                System::Plain,
                System::Relay,
                System::RelayGcm,
                System::Espgate("aes128gcm16".into()),
                System::Peer(Peer::WireguardGo)
            ]
        );
        for sys in [System::Relay, System::RelayGcm] {
            for t in ["tcp", "tcp4"] {
                assert!(sys.runs(Test::parse(t).unwrap()), "{t}");
            }
            assert!(!sys.runs(Test::Udp(64)));
        }
        assert!(System::Espgate("aes128gcm16".into()).runs(Test::Udp(64)));
        assert!(System::Plain.runs(Test::Udp(64)));
        assert_eq!(o.settings.encap, Encapsulation::Udp);
        let raw = args(&|a| a.encap = "none".into()).unwrap();
        assert_eq!(raw.settings.encap, Encapsulation::None);
        assert_eq!(
            o.systems(),
            [System::Plain, System::Espgate("aes128gcm16".into())]
        );
        let o = args(&|a| {
            a.peers = vec!["openvpn".into(), "wireguard-go".into(), "openvpn".into()];
            a.tests = vec!["udp512".into(), "tcp".into()];
        })
        .unwrap();
        assert_eq!(o.peers, [Peer::Openvpn, Peer::WireguardGo]);
        assert_eq!(o.tests, [Test::Udp(512), Test::Tcp]);
        let o = args(&|a| a.peers = vec!["".into(), "boringtun".into(), " ".into()]).unwrap();
        assert_eq!(o.peers, [Peer::Boringtun]);
        let o = args(&|a| a.peers = vec!["".into()]).unwrap();
        assert_eq!(o.peers, []);
        let o = args(&|a| {
            a.peers = ["wireguard-go", "boringtun", "wireguard-go-debian"]
                .map(String::from)
                .to_vec()
        })
        .unwrap();
        assert_eq!(
            o.systems()[2..],
            [
                System::Peer(Peer::WireguardGo),
                System::Peer(Peer::Boringtun),
                System::Peer(Peer::WireguardGoDebian)
            ]
        );
        let err = |f: &dyn Fn(&mut Args)| args(f).unwrap_err().to_string();
        assert!(err(&|a| a.tests = vec!["icmp".into()]).contains("--tests icmp"));
        assert!(err(&|a| a.tests = vec!["udp8".into()]).contains("--tests udp8"));
        assert!(err(&|a| a.peers = vec!["ipsec".into()]).contains("--peers ipsec"));
        assert!(
            err(&|a| a.gateway_binary = Some("/nonexistent/espgate".into()))
                .contains("--gateway-binary /nonexistent/espgate: no such file")
        );
        let o = args(&|a| a.gateway_binary = Some("/bin/sh".into())).unwrap();
        assert_eq!(o.exe, PathBuf::from("/bin/sh"));
        assert!(err(&|a| a.suite = vec!["aes999".into()]).contains("--suite aes999"));
        assert!(err(&|a| a.suite = vec!["sha256".into()]).contains("AH"));
        assert!(err(&|a| a.runs = 0).contains("--runs"));
        assert!(err(&|a| a.time = 0).contains("--time"));
        assert!(err(&|a| a.prefix = Some("a b".into())).contains("--prefix"));
        assert!(args(&|a| a.prefix = None)
            .unwrap()
            .prefix
            .starts_with("egbench-"));
    }

    #[test]
    fn udp_tests_ask_iperf3_for_unlimited_rate_and_the_payload_size() {
        let s = |secs: u32, window: Option<u32>, rate: Option<u32>| Settings {
            time_s: secs,
            iperf_window: window,
            udp_rate_mbps: rate,
            ..settings()
        };
        assert_eq!(
            Test::Udp(1400).client_args(&s(5, None, None)),
            [
                "-t",
                "5",
                "-u",
                "-l",
                "1400",
                "-b",
                "0",
                "--connect-timeout",
                "5000"
            ]
        );
        assert_eq!(Test::Tcp.client_args(&s(1, None, None))[..2], ["-t", "1"]);
        assert_eq!(
            Test::Udp(64).client_args(&s(1, Some(4 << 20), None))[..4],
            ["-t", "1", "-w", "4194304"]
        );
        // --udp-rate: UDP at that many Mbit/s; TCP is not limited.
        assert_eq!(
            Test::Udp(64).client_args(&s(1, None, Some(240)))[2..7],
            ["-u", "-l", "64", "-b", "240M"]
        );
        assert!(!Test::Tcp
            .client_args(&s(1, None, Some(240)))
            .contains(&"-b".to_string()));
        assert_eq!(Test::parse("udp64").unwrap().name(), "udp64");
    }

    /// `tcpN`: N streams through one iperf3 (-P), named back as given;
    /// one stream is `tcp`, and counts outside 2-64 are refused.
    #[test]
    fn tcp_n_runs_n_streams() {
        let t = Test::parse("tcp4").unwrap();
        assert_eq!(t, Test::TcpStreams(4));
        assert_eq!(t.name(), "tcp4");
        assert_eq!(
            t.client_args(&Settings {
                time_s: 3,
                ..settings()
            }),
            ["-t", "3", "-P", "4", "--connect-timeout", "5000"]
        );
        assert_eq!(Test::parse("tcp64").unwrap(), Test::TcpStreams(64));
        assert_eq!(
            Test::parse("tcp")
                .unwrap()
                .client_args(&Settings {
                    time_s: 3,
                    ..settings()
                })
                .len(),
            4
        );
        for bad in ["tcp1", "tcp0", "tcp65", "tcpx", "tcp-2"] {
            let e = Test::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!("--tests {bad}")) && e.contains("2 to 64"),
                "{e}"
            );
        }
        // The receiver's sum over the streams is the figure.
        let v: serde_json::Value = serde_json::from_str(
            r#"{"end":{"sum_received":{"bits_per_second":2.5e9},"sum_sent":{"retransmits":7}}}"#,
        )
        .unwrap();
        assert_eq!(parse_iperf(t, &v).unwrap(), (2500.0, None, None));
        assert_eq!(tcp_retransmits(&v), Some(7));
    }

    #[test]
    fn espgate_config_says_what_the_hand_written_file_said() {
        let mut s = settings();
        s.workers = Some(2);
        s.socket_buffer = Some(1 << 20);
        s.mss_clamp = false;
        let (ki, ko, ii, io) = (
            "00".repeat(16),
            "11".repeat(16),
            "22".repeat(32),
            "33".repeat(32),
        );
        let text = espgate_config(
            "aes128-sha256",
            GW_A,
            GW_B,
            NET_A,
            NET_B,
            (0x1001, 0x1002),
            (&ki, &ii),
            (&ko, &io),
            &s,
        );
        // What bench tunnel wrote with format! before it built the schema.
        let before = format!(
            "# generated by espgate bench tunnel\n[gateway]\ntun = \"espgate0\"\n\
             control_socket = \"ctl.sock\"\nstate_dir = \"state\"\nmtu = 1500\noffloads = true\n\
             workers = 2\nbatch = 32\nsocket_buffer = 1048576\n\
             \n[[connection]]\nname = \"bench\"\nlocal = \"{GW_A}\"\nremote = \"{GW_B}\"\n\
             local_ts = [\"{NET_A}\"]\nremote_ts = [\"{NET_B}\"]\nmss_clamp = \"off\"\n\n\
             [connection.esp]\nsuite = \"aes128-sha256\"\nspi_in = 0x1001\nspi_out = 0x1002\n\
             enc_in = \"{ki}\"\nenc_out = \"{ko}\"\ninteg_in = \"{ii}\"\ninteg_out = \"{io}\"\n"
        );
        crate::demo::tests::assert_same_config(&text, &before);
    }

    #[test]
    fn espgate_config_has_the_knobs_given_and_only_those() {
        let mut s = settings();
        let c = espgate_config(
            "aes128-sha256",
            GW_A,
            GW_B,
            NET_A,
            NET_B,
            (0x1001, 0x1002),
            ("aa", "bb"),
            ("cc", "dd"),
            &s,
        );
        let v: toml::Value = toml::from_str(&c).unwrap();
        let g = &v["gateway"];
        assert_eq!(g["mtu"].as_integer(), Some(1500));
        assert_eq!(g["offloads"].as_bool(), Some(true));
        assert_eq!(g["batch"].as_integer(), Some(32));
        assert!(g.get("socket_buffer").is_none() && g.get("workers").is_none());
        let conn = &v["connection"][0];
        assert_eq!(conn["mss_clamp"].as_str(), Some("auto"));
        assert!(conn.get("per_cpu_sas").is_none() && conn.get("encap").is_none());
        let esp = &conn["esp"];
        assert_eq!(esp["suite"].as_str(), Some("aes128-sha256"));
        assert_eq!(esp["spi_in"].as_integer(), Some(0x1001));
        assert_eq!(esp["enc_in"].as_str(), Some("aa"));
        assert_eq!(esp["integ_in"].as_str(), Some("bb"));
        assert_eq!(esp["enc_out"].as_str(), Some("cc"));
        assert_eq!(esp["integ_out"].as_str(), Some("dd"));
        s.batch = None;
        s.socket_buffer = Some(1 << 20);
        s.workers = Some(2);
        s.per_cpu_sas = Some(2);
        s.offloads = false;
        s.mss_clamp = false;
        s.encap = Encapsulation::None;
        assert!(
            s.describe()
                .contains("workers 2, per-cpu-sas 2, batch default"),
            "{}",
            s.describe()
        );
        let c = espgate_config(
            "aes128gcm16",
            GW_A,
            GW_B,
            NET_A,
            NET_B,
            (1, 2),
            ("aa", ""),
            ("cc", ""),
            &s,
        );
        let v: toml::Value = toml::from_str(&c).unwrap();
        let g = &v["gateway"];
        assert!(g.get("batch").is_none());
        assert_eq!(g["socket_buffer"].as_integer(), Some(1 << 20));
        assert_eq!(g["workers"].as_integer(), Some(2));
        assert_eq!(v["connection"][0]["per_cpu_sas"].as_integer(), Some(2));
        assert_eq!(g["offloads"].as_bool(), Some(false));
        assert_eq!(v["connection"][0]["mss_clamp"].as_str(), Some("off"));
        assert_eq!(v["connection"][0]["encap"].as_str(), Some("none"));
        assert!(s.describe().contains("encap none"), "{}", s.describe());
        assert!(v["connection"][0]["esp"].get("integ_in").is_none());
    }

    #[test]
    fn fingerprints_from_openssl() {
        let fp = "FE:62:1B:72:AE:D9:33:E7:79:D9:2B:06:F5:B3:2C:7E:A3:55:83:B0:59:A1:CF:95:C3:56:87:C9:82:E6:6F:4A";
        assert_eq!(
            parse_fingerprint(&format!("sha256 Fingerprint={fp}\n")).as_deref(),
            Some(fp)
        );
        assert_eq!(parse_fingerprint("SHA1 Fingerprint=AB:CD"), None);
        assert_eq!(parse_fingerprint("nothing"), None);
    }

    #[test]
    fn strongswan_configs_name_their_own_socket_and_libipsec() {
        let c = strongswan_conf(Path::new("/w/a/charon.vici"), Path::new("/w/a/charon.log"));
        assert!(c.contains("socket = unix:///w/a/charon.vici"), "{c}");
        assert!(
            c.contains("kernel-libipsec kernel-netlink socket-default vici"),
            "{c}"
        );
        let s = swanctl_conf(GW_A, GW_B, "gwa", "gwb", NET_A, NET_B, "00ff");
        assert!(
            s.contains("esp_proposals = aes128gcm16") && s.contains("secret = 0x00ff"),
            "{s}"
        );
        assert!(
            s.contains("local_ts = 10.1.0.0/24") && s.contains("remote_addrs = 192.0.2.2"),
            "{s}"
        );
        // Balanced braces.
        assert_eq!(s.matches('{').count(), s.matches('}').count());
        assert_eq!(c.matches('{').count(), c.matches('}').count());
    }

    #[test]
    fn log_tails_keep_the_last_lines() {
        let dir = std::env::temp_dir().join(format!("egtail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("log");
        let text: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&f, text).unwrap();
        let t = log_tail(std::slice::from_ref(&f), 3);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            t.contains("(last 3 lines)") && t.ends_with("line 18\nline 19\nline 20"),
            "{t}"
        );
        assert!(!t.contains("line 17"));
    }

    #[test]
    fn cpu_seconds_per_gigabit_sum_both_gateways_over_the_rate() {
        let cpu: BTreeMap<String, f64> = [
            ("espgate@gwA".to_string(), 80.0),
            ("espgate@gwB".to_string(), 100.0),
        ]
        .into_iter()
        .collect();
        // 1.8 CPU seconds a second over 4.5 Gbit/s.
        assert_eq!(cpu_s_per_gbit(&cpu, Some(4500.0)), Some(0.4));
        assert_eq!(cpu_s_per_gbit(&cpu, Some(0.0)), None);
        assert_eq!(cpu_s_per_gbit(&cpu, None), None);
        assert_eq!(cpu_s_per_gbit(&BTreeMap::new(), Some(1000.0)), None);
    }

    #[test]
    fn pin_puts_iperf3_on_cpu_0_and_the_gateways_on_the_rest() {
        assert_eq!(
            Pin::for_cpus(2).unwrap(),
            Pin {
                iperf3_cpu: 0,
                gateway_cpus: "1".into()
            }
        );
        assert_eq!(Pin::for_cpus(8).unwrap().gateway_cpus, "1-7");
        let e = Pin::for_cpus(1).unwrap_err().to_string();
        assert!(
            e.contains("--pin needs at least 2 CPUs") && e.contains("has 1"),
            "{e}"
        );
        let mut s = settings();
        s.pin = Some(Pin::for_cpus(2).unwrap());
        assert!(
            s.describe()
                .ends_with("; pinned: iperf3 on CPU 0, gateways on CPUs 1"),
            "{}",
            s.describe()
        );
    }
}
