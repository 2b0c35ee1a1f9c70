//! `espgate bench dos`: what floods of junk do to an espgate gateway, and
//! `espgate bench flood`, the (hidden) flood sender it runs.
//!
//! The topology is bench tunnel's four namespaces (host A — gateway A —
//! gateway B — host B, [`crate::netlab`]). The flood always leaves from
//! gateway A's namespace, the "internet" side, towards gateway B's WAN
//! address, so gateway B is the victim and gateway A only forwards the
//! legitimate traffic.
//!
//! Scenarios:
//!
//! - `esp-unknown`: ESP-in-UDP datagrams to gateway B's port 4500 with
//!   random SPIs (never one of the tunnel's) and random payloads: each
//!   costs a classification and an SAD miss (`unknown_spi`).
//! - `esp-badicv`: ESP-in-UDP with the tunnel's inbound SPI, increasing
//!   sequence numbers ahead of the replay window and random payloads: each
//!   costs a full AES-GCM pass that fails (`icv_failure`).
//! - `esp-closed-port`: the `esp-unknown` packets sent to a UDP port
//!   nobody listens on: the kernel drops them (`Udp NoPorts`). What the
//!   machine does with the same flood when espgate is not involved: the
//!   baseline for the two above (the flooder and the kernel's receive path
//!   take their share of the CPUs in every scenario).
//! - `ike-init`: IKEv2 IKE_SA_INIT requests (a valid SA, KE and Nonce
//!   payload; random initiator SPI and nonce per packet) to gateway B's
//!   UDP 500 from gateway A's own address with random source ports: every
//!   request matches the connection, so gateway B does key exchanges until
//!   its half-open limit makes it demand COOKIEs.
//! - `ike-init-spoofed`: the same requests from random sources in
//!   `--spoof`: no connection has those peers.
//!
//! ESP scenarios share one pair of gateways with a manually keyed
//! ESP-in-UDP tunnel (AES-128-GCM). Each runs one TCP stream (iperf3, host
//! A to host B) without a flood, then the same with the flood running, and
//! reports both rates and their ratio, the flood's rate, the junk gateway
//! B counted (the deltas of its drop counters, by reason, against the
//! packets the flooder sent; the kernel's UDP counters for the closed
//! port), and gateway B's CPU seconds and peak resident memory during the
//! flood (its high-water mark is reset just before).
//!
//! IKE scenarios each get a fresh topology and a PSK IKEv2 connection.
//! With the flood running, gateway A terminates and initiates its
//! connection `--trials` times through its control socket; each trial is
//! the time from `initiate` until gateway A's status shows a new IKE SA
//! established with its child SA, or "never" after `--trial-limit`.
//!
//! The flooder writes IPv4 and UDP headers itself on a raw socket
//! (`IPPROTO_RAW`, i.e. `IP_HDRINCL`) and sends batches with `sendmmsg`.
//! Every packet has a random source port (and, when spoofing, a random
//! source address), so the receiver's UDP GRO cannot merge any two of them:
//! the receiver's worst case. UDP checksums are 0 (allowed for IPv4; RFC
//! 3948 asks ESP-in-UDP senders for it).

use super::tunnel::{self, Settings, Test};
use crate::netlab::{
    self, in_ns, on_path, parse_snmp_udp, random_hex, require_root, write_private, Lab, Topology,
    GW_A, GW_B, HOST_B, NET_A, NET_B,
};
use anyhow::{anyhow, bail, ensure, Context, Result};
use espgate_api::control::{Client, Request};
use espgate_api::status::Status;
use espgate_api::table::{Column, Table};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Every scenario, in the order they run.
pub const SCENARIOS: [&str; 5] = [
    "esp-unknown",
    "esp-badicv",
    "esp-closed-port",
    "ike-init",
    "ike-init-spoofed",
];

/// Gateway B's inbound SPI of the manual tunnel (gateway A's outbound).
const SPI_TO_B: u32 = 0x1002;
/// Gateway A's inbound SPI.
const SPI_TO_A: u32 = 0x1001;
/// Random SPIs of the unknown-SPI flood are at least this (the tunnel's
/// are below).
const RANDOM_SPI_MIN: u32 = 0x1_0000;
/// Where `esp-badicv` starts its sequence numbers: far ahead of the
/// tunnel's, inside what the replay window accepts before the ICV check.
const BADICV_SEQ: u32 = 1 << 30;
/// A UDP port nobody listens on in gateway B's namespace (discard).
const CLOSED_PORT: u16 = 9;
/// The IKE connection's name on both gateways.
const CONN: &str = "dos";
/// The IKE proposals both gateways accept (espgate's documented defaults,
/// written out so that the flood's proposal stays acceptable).
const IKE_PROPOSALS: [&str; 2] = ["aes128gcm16-prfsha256-x25519", "aes256-sha256-modp2048"];
/// The flood's IKE proposal by default: the one of `IKE_PROPOSALS` whose
/// key exchange costs the responder most.
pub const DEFAULT_IKE_PROPOSAL: &str = "aes256-sha256-modp2048";
/// Seconds of flood before the flooded measurement starts.
const ESP_WARMUP: Duration = Duration::from_secs(1);
/// Seconds of flood before the first IKE trial (the half-open limit is
/// reached and COOKIEs are demanded by then).
const IKE_WARMUP: Duration = Duration::from_secs(2);
/// Time for the counters to settle after the flood stopped.
const SETTLE: Duration = Duration::from_millis(500);
/// Trials within this many seconds count as "up in time".
const IN_TIME_SECS: f64 = 10.0;
/// Ports a random source port never takes: NAT-T (gateway A's espgate
/// would take replies to it for its own) and iperf3's.
const AVOID_PORTS: [u16; 2] = [4500, 5201];
/// The largest UDP payload the flooder sends (a 1500-byte IPv4 packet).
const MAX_PAYLOAD: usize = 1472;

const USAGE: &str = "\
Examples:
  espgate bench dos                                   every scenario, 8 s TCP runs, 10 IKE trials
  espgate bench dos --scenario esp-badicv --secs 5 --json dos.json
  espgate bench dos --scenario ike-init --rate 20000 --trials 5

Topology (network namespaces <prefix>-ha, -ga, -gb, -hb):
  host A 10.1.0.10 -- 10.1.0.1 gateway A 192.0.2.1 -- 192.0.2.2 gateway B 10.2.0.1 -- 10.2.0.10 host B
The flood leaves from gateway A's namespace (the WAN side) towards gateway B's WAN address,
sent by `espgate bench flood` (this binary) on a raw socket with sendmmsg: a random source
port on every packet, and with --spoof a random source address in that prefix, so that
gateway B's UDP GRO cannot merge any two. rp_filter in gateway B's namespace is set to 0 when
it would drop the spoofed sources (the output says so).

Scenarios (--scenario, comma-separated; default all):
  esp-unknown       ESP-in-UDP to gwB:4500, random SPIs (>= 0x10000, none of the tunnel's)
  esp-badicv        ESP-in-UDP to gwB:4500 with the tunnel's SPI, sequence numbers counting up
                    from 2^30, random payload: the ICV check fails on every packet
  esp-closed-port   the esp-unknown packets to gwB:9, where nothing listens: what the machine
                    does with the flood without espgate (the baseline for the two above)
  ike-init          IKE_SA_INIT requests (SA, KE, Nonce; random SPI and nonce) to gwB:500 from
                    gwA's own address (random ports): each matches the connection
  ike-init-spoofed  the same from random sources in --spoof (no connection has them)

ESP scenarios: two gateways with a manual ESP-in-UDP tunnel (aes128gcm16); one TCP stream
(iperf3 -t SECS) without a flood, then with the flood running (it starts 1 s before); both
rates and flooded / clean. Junk counted: the increase of gateway B's drop counters (espgate
status, all reasons, and what its SPI filter dropped in the kernel during an unknown-SPI
flood: udp_socket_drops less rcvbuf drops) while the flood ran, against the packets sent; for
esp-closed-port the kernel's Udp NoPorts. rcvbuf: datagrams the kernel dropped because espgate's socket was full
(Udp RcvbufErrors). gwB CPU: CPU seconds of gateway B's espgate process during the flood
(and % of one core); peak RSS: its VmHWM, reset just before the flood.

IKE scenarios: two gateways with a PSK IKEv2 connection, established first. With the flood
running (2 s before the first trial), gateway A's connection is terminated and initiated
through its control socket --trials times; a trial is the time from initiate until gateway
A's status shows a new IKE SA established with its child SA, or never after --trial-limit.
Gateway B's IKE counters (cookies_sent, ike_init_answered, half_open_expired, dropped_*...)
are the increase while the flood ran.

--json FILE writes the rows (one JSON list, rewritten after each scenario): scenario, flood,
target, sources, flood_packets, flood_secs, flood_pps, flood_send_errors, packet_bytes,
baseline_mbps, flooded_mbps, ratio, baseline_cpu_percent, junk_counted, counted_by,
counted_share, drops, kernel_udp, gwb_cpu_secs, gwb_cpu_percent, gwb_rss_before_mib,
gwb_peak_rss_mib, trials_secs, trials_within_10s, trial_limit_secs, ike_counters, notes,
error, version.

Needs root, iproute2, ping and iperf3. Removes everything it made (namespaces, processes,
its work directory), also on error and on Ctrl-C. The figures share two CPUs with the
flooder, iperf3 and both gateways: compare scenarios within one run.";

/// The options of `espgate bench dos`.
#[derive(clap::Args, Debug, Clone)]
#[command(after_long_help = USAGE)]
pub struct Args {
    /// Scenarios, comma-separated: esp-unknown, esp-badicv, esp-closed-port,
    /// ike-init, ike-init-spoofed [default: all].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub scenario: Vec<String>,
    /// Seconds of each TCP run (clean and flooded).
    #[arg(long, default_value_t = 8, value_name = "S")]
    pub secs: u32,
    /// IKE scenarios: terminate/initiate trials under the flood.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub trials: usize,
    /// IKE scenarios: a trial not established after this many seconds
    /// counts as never.
    #[arg(long, default_value_t = 30, value_name = "S")]
    pub trial_limit: u32,
    /// Source prefix of the spoofed floods (ESP scenarios and
    /// ike-init-spoofed), or "none": gateway A's own address.
    #[arg(long, default_value = "198.18.0.0/15", value_name = "CIDR")]
    pub spoof: String,
    /// UDP payload bytes of the ESP floods' packets.
    #[arg(long, default_value_t = 64, value_name = "BYTES")]
    pub size: usize,
    /// Flood packets per second; 0: as fast as the flooder can.
    #[arg(long, default_value_t = 0, value_name = "PPS")]
    pub rate: u64,
    /// The IKE proposal of the flood's IKE_SA_INIT requests (one the
    /// gateways accept: aes128gcm16-prfsha256-x25519 or
    /// aes256-sha256-modp2048).
    #[arg(long, default_value = DEFAULT_IKE_PROPOSAL, value_name = "PROPOSAL")]
    pub ike_proposal: String,
    /// Also write the rows as a JSON list to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Prefix of the namespace names [default: egdos-PID].
    #[arg(long, value_name = "P")]
    pub prefix: Option<String>,
    /// Run the gateways from this espgate binary instead of this one
    /// (the flooder stays this one): a before/after of a change on the
    /// same machine in one session.
    #[arg(long, value_name = "FILE")]
    pub gateway_exe: Option<PathBuf>,
}

/// What is flooded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// ESP-in-UDP with unknown SPIs.
    EspUnknown,
    /// ESP-in-UDP with the tunnel's SPI and a wrong ICV.
    EspBadIcv,
    /// The unknown-SPI packets to a closed port.
    EspClosedPort,
    /// IKE_SA_INIT from the peer's address.
    IkeInit,
    /// IKE_SA_INIT from spoofed sources.
    IkeInitSpoofed,
}

impl Scenario {
    const ALL: [Scenario; 5] = [
        Scenario::EspUnknown,
        Scenario::EspBadIcv,
        Scenario::EspClosedPort,
        Scenario::IkeInit,
        Scenario::IkeInitSpoofed,
    ];

    /// Its name in `--scenario` and the rows.
    pub fn name(self) -> &'static str {
        SCENARIOS[self as usize]
    }

    /// Parses a `--scenario` name.
    pub fn parse(s: &str) -> Result<Scenario> {
        let s = s.trim();
        Scenario::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| anyhow!("--scenario {s}: one of {}", SCENARIOS.join(", ")))
    }

    /// An ESP flood (iperf3 measured), else an IKE one (trials).
    pub fn is_esp(self) -> bool {
        matches!(
            self,
            Scenario::EspUnknown | Scenario::EspBadIcv | Scenario::EspClosedPort
        )
    }

    fn kind(self) -> FloodKind {
        match self {
            Scenario::EspUnknown | Scenario::EspClosedPort => FloodKind::EspUnknown,
            Scenario::EspBadIcv => FloodKind::EspBadIcv,
            Scenario::IkeInit | Scenario::IkeInitSpoofed => FloodKind::IkeInit,
        }
    }

    fn port(self) -> u16 {
        match self {
            Scenario::EspUnknown | Scenario::EspBadIcv => 4500,
            Scenario::EspClosedPort => CLOSED_PORT,
            Scenario::IkeInit | Scenario::IkeInitSpoofed => 500,
        }
    }

    fn spoofed(self) -> bool {
        self != Scenario::IkeInit
    }

    fn describe(self, o: &Options) -> String {
        match self {
            Scenario::EspUnknown => {
                format!("ESP-in-UDP, random SPIs, {} B UDP payloads", o.size)
            }
            Scenario::EspBadIcv => format!(
                "ESP-in-UDP, SPI {SPI_TO_B:#x}, seq from {BADICV_SEQ:#x} up, bad ICV, {} B UDP payloads",
                o.size
            ),
            Scenario::EspClosedPort => format!(
                "the esp-unknown packets to a closed port, {} B UDP payloads",
                o.size
            ),
            Scenario::IkeInit | Scenario::IkeInitSpoofed => {
                format!("IKE_SA_INIT, {}", o.ike_proposal)
            }
        }
    }
}

/// Checked options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Scenarios in the order they run (ESP ones first).
    pub scenarios: Vec<Scenario>,
    /// Seconds per TCP run.
    pub secs: u32,
    /// IKE trials.
    pub trials: usize,
    /// A trial's limit.
    pub trial_limit: Duration,
    /// Spoofed sources (`None`: gateway A's address).
    pub spoof: Option<Cidr>,
    /// UDP payload bytes of the ESP floods.
    pub size: usize,
    /// Packets per second (0: unlimited).
    pub rate: u64,
    /// IKE proposal of the flood.
    pub ike_proposal: String,
    /// Where the JSON rows go.
    pub json: Option<PathBuf>,
    /// Namespace prefix.
    pub prefix: String,
    /// The gateways' binary, when not this one.
    pub gateway_exe: Option<PathBuf>,
}

impl Options {
    /// Checks `args`.
    pub fn new(args: &Args) -> Result<Options> {
        let mut scenarios = Vec::new();
        if args.scenario.is_empty() {
            scenarios.extend(Scenario::ALL);
        }
        for s in &args.scenario {
            let s = Scenario::parse(s)?;
            if !scenarios.contains(&s) {
                scenarios.push(s);
            }
        }
        // ESP scenarios share one pair of gateways: run them first.
        scenarios.sort_by_key(|s| *s as usize);
        ensure!(
            (1..=600).contains(&args.secs),
            "--secs {}: 1 to 600",
            args.secs
        );
        ensure!(
            (1..=1000).contains(&args.trials),
            "--trials {}: 1 to 1000",
            args.trials
        );
        ensure!(
            (1..=600).contains(&args.trial_limit),
            "--trial-limit {}: 1 to 600 seconds",
            args.trial_limit
        );
        let spoof = match args.spoof.trim() {
            "none" => None,
            s => Some(Cidr::parse(s).map_err(|e| anyhow!("--spoof {s}: {e}"))?),
        };
        ensure!(
            (16..=MAX_PAYLOAD).contains(&args.size),
            "--size {}: 16 to {MAX_PAYLOAD} bytes",
            args.size
        );
        ike_template(&args.ike_proposal).map_err(|e| anyhow!("--ike-proposal: {e:#}"))?;
        let prefix = args
            .prefix
            .clone()
            .unwrap_or_else(|| format!("egdos-{}", std::process::id()));
        ensure!(
            !prefix.is_empty()
                && prefix.len() <= 40
                && prefix
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "--prefix {prefix}: 1 to 40 of A-Z a-z 0-9 - _"
        );
        Ok(Options {
            scenarios,
            secs: args.secs,
            trials: args.trials,
            trial_limit: Duration::from_secs(args.trial_limit.into()),
            spoof,
            size: args.size,
            rate: args.rate,
            ike_proposal: args.ike_proposal.clone(),
            json: args.json.clone(),
            gateway_exe: args.gateway_exe.clone(),
            prefix,
        })
    }
}

// ---------------------------------------------------------------------
// The flooder
// ---------------------------------------------------------------------

/// The kinds of packet `bench flood` sends.
pub const FLOOD_KINDS: [&str; 3] = ["esp-unknown", "esp-badicv", "ike-init"];

/// The options of `espgate bench flood` (hidden: `bench dos` runs it).
#[derive(clap::Args, Debug, Clone)]
pub struct FloodArgs {
    /// esp-unknown (random SPIs), esp-badicv (--spi, increasing sequence
    /// numbers, random payload) or ike-init (IKE_SA_INIT requests).
    #[arg(long, value_parser = FLOOD_KINDS)]
    pub kind: String,
    /// Destination address and UDP port.
    #[arg(long, value_name = "ADDR:PORT")]
    pub to: SocketAddrV4,
    /// esp-badicv: the SPI, in hex.
    #[arg(long, value_name = "HEX")]
    pub spi: Option<String>,
    /// esp-badicv: the first sequence number.
    #[arg(long, default_value_t = BADICV_SEQ, value_name = "N")]
    pub seq: u32,
    /// Random source addresses in this prefix [default: the kernel picks
    /// the source address].
    #[arg(long, value_name = "CIDR")]
    pub spoof: Option<String>,
    /// UDP payload bytes (ESP kinds; an IKE_SA_INIT is as long as it is).
    #[arg(long, default_value_t = 64, value_name = "BYTES")]
    pub size: usize,
    /// Packets per second; 0: as fast as possible.
    #[arg(long, default_value_t = 0, value_name = "PPS")]
    pub rate: u64,
    /// Stop after this many seconds (or at SIGINT / SIGTERM).
    #[arg(long, value_name = "S")]
    pub secs: f64,
    /// Packets per sendmmsg call.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub batch: usize,
    /// ike-init: the IKE proposal offered (its first group's KE payload).
    #[arg(long, default_value = DEFAULT_IKE_PROPOSAL, value_name = "PROPOSAL")]
    pub ike_proposal: String,
}

/// What the flooder did: its one line of JSON on standard output.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FloodReport {
    /// The kind of packet.
    pub kind: String,
    /// Destination.
    pub to: String,
    /// Source addresses: a prefix, or `kernel` (the route's source).
    pub sources: String,
    /// Packets the kernel accepted.
    pub packets: u64,
    /// Their bytes, IP headers included.
    pub bytes: u64,
    /// How long it sent.
    pub secs: f64,
    /// packets / secs.
    pub pps: f64,
    /// Packets the kernel refused (a full queue past the send timeout).
    pub send_errors: u64,
    /// IP packet size.
    pub packet_bytes: usize,
}

/// The kinds of flood packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloodKind {
    /// ESP with random SPIs.
    EspUnknown,
    /// ESP with one SPI and a bad ICV.
    EspBadIcv,
    /// IKE_SA_INIT requests.
    IkeInit,
}

impl FloodKind {
    /// Its name in `--kind`.
    pub fn name(self) -> &'static str {
        match self {
            FloodKind::EspUnknown => FLOOD_KINDS[0],
            FloodKind::EspBadIcv => FLOOD_KINDS[1],
            FloodKind::IkeInit => FLOOD_KINDS[2],
        }
    }

    fn parse(s: &str) -> Result<FloodKind> {
        [
            FloodKind::EspUnknown,
            FloodKind::EspBadIcv,
            FloodKind::IkeInit,
        ]
        .into_iter()
        .find(|k| k.name() == s)
        .ok_or_else(|| anyhow!("--kind {s}: one of {}", FLOOD_KINDS.join(", ")))
    }
}

/// An IPv4 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    base: u32,
    len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n` (n from 8 to 32).
    pub fn parse(s: &str) -> Result<Cidr> {
        let (a, l) = s
            .split_once('/')
            .ok_or_else(|| anyhow!("an IPv4 prefix like 198.18.0.0/15"))?;
        let a: Ipv4Addr = a.parse().map_err(|_| anyhow!("{a}: not an IPv4 address"))?;
        let len: u8 = l.parse().map_err(|_| anyhow!("/{l}: not a length"))?;
        ensure!((8..=32).contains(&len), "/{len}: a length of 8 to 32");
        let bits = u32::from(a);
        ensure!(bits & !Cidr::mask(len) == 0, "{a} has bits outside /{len}");
        let first = a.octets()[0];
        ensure!(
            !matches!(first, 0 | 127 | 224..=255),
            "{s}: not a unicast range the kernel routes"
        );
        Ok(Cidr { base: bits, len })
    }

    fn mask(len: u8) -> u32 {
        if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        }
    }

    /// A random address in the prefix, never its first or last one when
    /// it has more than two.
    fn random(&self, rng: &mut FastRng) -> Ipv4Addr {
        let host = !Cidr::mask(self.len);
        for _ in 0..8 {
            let h = (rng.next() as u32) & host;
            if self.len >= 31 || (h != 0 && h != host) {
                return Ipv4Addr::from(self.base | h);
            }
        }
        Ipv4Addr::from(self.base | 1)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.len)
    }
}

/// A fast non-cryptographic generator (wyrand) for packet contents and
/// headers, seeded from the system's: junk only needs to look random.
pub(crate) struct FastRng(u64);

impl FastRng {
    fn seeded() -> Result<FastRng> {
        let mut b = [0u8; 8];
        aws_lc_rs::rand::fill(&mut b).map_err(|_| anyhow!("no random bytes"))?;
        Ok(FastRng(u64::from_ne_bytes(b)))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_ne_bytes());
        }
        let rest = chunks.into_remainder();
        let n = rest.len();
        rest.copy_from_slice(&self.next().to_ne_bytes()[..n]);
    }
}

/// An IKE_SA_INIT request made with espgate-ike's own emitter, whose
/// initiator SPI (bytes 0..8) and nonce are replaced in every packet.
#[derive(Debug, Clone)]
pub(crate) struct IkeTemplate {
    bytes: Vec<u8>,
    nonce: std::ops::Range<usize>,
}

/// The request for `proposal` (a strongSwan IKE proposal string): the SA
/// payload, a KE payload with a real public value of its first group (so
/// the responder's key exchange succeeds), a 32-byte nonce.
pub(crate) fn ike_template(proposal: &str) -> Result<IkeTemplate> {
    use espgate_ike::dh::KeyExchange;
    use espgate_ike::proposal::{ProposalKind, ProposalSpec};
    use espgate_ike::wire::{ExchangeType, Header, Message, Payload};
    let specs = ProposalSpec::parse_list(ProposalKind::Ike, proposal)
        .map_err(|e| anyhow!("{proposal}: {e}"))?;
    let group = specs
        .first()
        .and_then(|s| s.dh.first().copied())
        .ok_or_else(|| anyhow!("{proposal}: no key exchange group"))?;
    let ke = KeyExchange::generate(group, &mut espgate_ike::rng::SystemRng)
        .map_err(|e| anyhow!("{e}"))?;
    let mut nonce = vec![0u8; 32];
    aws_lc_rs::rand::fill(&mut nonce).map_err(|_| anyhow!("no random bytes"))?;
    let msg = Message {
        header: Header {
            spi_i: 1,
            spi_r: 0,
            minor_version: 0,
            exchange_type: ExchangeType::IkeSaInit,
            initiator: true,
            version: false,
            response: false,
            message_id: 0,
        },
        payloads: vec![
            Payload::Sa(
                specs
                    .iter()
                    .enumerate()
                    .map(|(i, s)| s.to_wire(u8::try_from(i + 1).unwrap_or(255), &[], None))
                    .collect(),
            ),
            Payload::Ke {
                group: group.id(),
                data: ke.public_value().to_vec(),
            },
            Payload::Nonce(nonce.clone()),
        ],
    };
    let bytes = msg
        .emit()
        .map_err(|e| anyhow!("emitting IKE_SA_INIT: {e}"))?;
    let at = bytes
        .windows(nonce.len())
        .position(|w| w == nonce.as_slice())
        .ok_or_else(|| anyhow!("the nonce is not in the emitted message"))?;
    ensure!(bytes.len() <= MAX_PAYLOAD, "the IKE_SA_INIT is too long");
    Ok(IkeTemplate {
        nonce: at..at + nonce.len(),
        bytes,
    })
}

/// Writes flood packets (IPv4 header, UDP header, payload) one by one.
pub(crate) struct Generator {
    kind: FloodKind,
    dst: Ipv4Addr,
    dport: u16,
    spoof: Option<Cidr>,
    size: usize,
    spi: u32,
    seq: u32,
    ike: Option<IkeTemplate>,
    rng: FastRng,
}

impl Generator {
    fn new(a: &FloodArgs) -> Result<Generator> {
        let kind = FloodKind::parse(&a.kind)?;
        let spoof = a
            .spoof
            .as_deref()
            .map(|s| Cidr::parse(s).map_err(|e| anyhow!("--spoof {s}: {e}")))
            .transpose()?;
        let spi = match (kind, &a.spi) {
            (FloodKind::EspBadIcv, Some(s)) => {
                let v = u32::from_str_radix(s.trim_start_matches("0x"), 16)
                    .map_err(|_| anyhow!("--spi {s}: hex digits"))?;
                ensure!(v >= 256, "--spi {s}: SPIs below 256 are reserved");
                v
            }
            (FloodKind::EspBadIcv, None) => bail!("--kind esp-badicv needs --spi"),
            _ => 0,
        };
        let ike = match kind {
            FloodKind::IkeInit => Some(ike_template(&a.ike_proposal)?),
            _ => None,
        };
        ensure!(
            kind == FloodKind::IkeInit || (16..=MAX_PAYLOAD).contains(&a.size),
            "--size {}: 16 to {MAX_PAYLOAD} bytes",
            a.size
        );
        Ok(Generator {
            kind,
            dst: *a.to.ip(),
            dport: a.to.port(),
            spoof,
            size: a.size,
            spi,
            seq: a.seq.max(1),
            ike,
            rng: FastRng::seeded()?,
        })
    }

    /// The IP packet length of every packet.
    fn packet_len(&self) -> usize {
        28 + self.ike.as_ref().map_or(self.size, |t| t.bytes.len())
    }

    fn source_port(&mut self) -> u16 {
        loop {
            let p = 1024 + (self.rng.next() % (65536 - 1024)) as u16;
            if !AVOID_PORTS.contains(&p) {
                return p;
            }
        }
    }

    /// Writes the next packet at the start of `out` (at least
    /// [`Generator::packet_len`] bytes); its length.
    fn write(&mut self, out: &mut [u8]) -> usize {
        let total = self.packet_len();
        let udp_len = total - 20;
        let src = self
            .spoof
            .map_or([0; 4], |c| c.random(&mut self.rng).octets());
        let sport = self.source_port();
        let out = &mut out[..total];
        // IPv4: the kernel fills in the checksum, the ID and (when 0) the
        // source address of an IP_HDRINCL packet.
        out[..12].copy_from_slice(&[
            0x45,
            0,
            (total >> 8) as u8,
            total as u8,
            0,
            0,
            0x40, // DF
            0,
            64,
            17,
            0,
            0,
        ]);
        out[12..16].copy_from_slice(&src);
        out[16..20].copy_from_slice(&self.dst.octets());
        out[20..22].copy_from_slice(&sport.to_be_bytes());
        out[22..24].copy_from_slice(&self.dport.to_be_bytes());
        out[24..26].copy_from_slice(&(udp_len as u16).to_be_bytes());
        out[26..28].copy_from_slice(&[0, 0]);
        let p = &mut out[28..];
        match self.kind {
            FloodKind::EspUnknown => {
                let spi = loop {
                    let s = self.rng.next() as u32;
                    if s >= RANDOM_SPI_MIN {
                        break s;
                    }
                };
                p[..4].copy_from_slice(&spi.to_be_bytes());
                self.rng.fill(&mut p[4..]);
            }
            FloodKind::EspBadIcv => {
                p[..4].copy_from_slice(&self.spi.to_be_bytes());
                p[4..8].copy_from_slice(&self.seq.to_be_bytes());
                self.seq = self.seq.checked_add(1).unwrap_or(1);
                self.rng.fill(&mut p[8..]);
            }
            FloodKind::IkeInit => {
                let t = self.ike.as_ref().expect("an IKE flood has its template");
                p.copy_from_slice(&t.bytes);
                let spi = self.rng.next().max(1);
                p[..8].copy_from_slice(&spi.to_be_bytes());
                let nonce = t.nonce.clone();
                self.rng.fill(&mut p[nonce]);
            }
        }
        total
    }
}

/// `espgate bench flood`: sends until `--secs` or a signal, then prints
/// its report as one JSON line.
pub fn flood_main(a: &FloodArgs) -> ExitCode {
    match flood(a) {
        Ok(r) => match serde_json::to_string(&r) {
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("espgate bench flood: {e}");
                ExitCode::from(1)
            }
        },
        Err(e) => {
            eprintln!("espgate bench flood: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn flood(a: &FloodArgs) -> Result<FloodReport> {
    use rustix::net::{self, sockopt, AddressFamily, SocketType};
    ensure!(
        a.secs.is_finite() && a.secs > 0.0 && a.secs <= 86400.0,
        "--secs {}: more than 0, at most 86400",
        a.secs
    );
    ensure!(
        (1..=1024).contains(&a.batch),
        "--batch {}: 1 to 1024",
        a.batch
    );
    // A flood belongs in a lab, so that a mistyped command floods nothing
    // real.
    netlab::refuse_host_namespace("flood", "bench flood", "bench dos")?;
    let mut gen = Generator::new(a)?;
    netlab::install_signal_handlers();
    let fd = net::socket(
        AddressFamily::INET,
        SocketType::RAW,
        Some(net::ipproto::RAW),
    )
    .context("a raw IPv4 socket (root or CAP_NET_RAW needed)")?;
    net::connect(&fd, &SocketAddrV4::new(*a.to.ip(), 0))
        .with_context(|| format!("no route to {}", a.to.ip()))?;
    let _ = sockopt::set_socket_send_buffer_size(&fd, 4 << 20);
    // A send never blocks for long: the deadline and signals are seen.
    sockopt::set_socket_timeout(
        &fd,
        sockopt::Timeout::Send,
        Some(Duration::from_millis(100)),
    )?;
    let len = gen.packet_len();
    let mut bufs = vec![vec![0u8; len]; a.batch];
    let (mut packets, mut errors) = (0u64, 0u64);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(a.secs);
    // With a rate, batches of about 1 ms of packets.
    let per_batch = if a.rate == 0 {
        a.batch
    } else {
        (a.rate / 1000).clamp(1, a.batch as u64) as usize
    };
    loop {
        let now = Instant::now();
        if now >= deadline || netlab::interrupted() {
            break;
        }
        if a.rate > 0 {
            let due = start + Duration::from_secs_f64((packets + errors) as f64 / a.rate as f64);
            if due > now {
                std::thread::sleep((due - now).min(deadline - now));
                continue;
            }
        }
        for b in bufs.iter_mut().take(per_batch) {
            gen.write(b);
        }
        let mut off = 0;
        while off < per_batch {
            let iovs: Vec<[std::io::IoSlice<'_>; 1]> = bufs[off..per_batch]
                .iter()
                .map(|b| [std::io::IoSlice::new(b)])
                .collect();
            let mut ctls: Vec<net::SendAncillaryBuffer<'_, '_, '_>> =
                iovs.iter().map(|_| Default::default()).collect();
            let mut msgs: Vec<net::MMsgHdr<'_>> = iovs
                .iter()
                .zip(ctls.iter_mut())
                .map(|(v, c)| net::MMsgHdr::new(v, c))
                .collect();
            match net::sendmmsg(&fd, &mut msgs, net::SendFlags::empty()) {
                Ok(0) => {
                    errors += (per_batch - off) as u64;
                    break;
                }
                Ok(n) => {
                    packets += n as u64;
                    off += n;
                }
                Err(rustix::io::Errno::INTR) if !netlab::interrupted() => {}
                Err(rustix::io::Errno::INTR) => break,
                Err(e) => {
                    // ENOBUFS, or EAGAIN after the send timeout: the queue
                    // is full; these are lost, try again shortly.
                    errors += (per_batch - off) as u64;
                    if !matches!(e, rustix::io::Errno::NOBUFS | rustix::io::Errno::AGAIN) {
                        bail!("sendmmsg: {e}");
                    }
                    std::thread::sleep(Duration::from_micros(200));
                    break;
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(FloodReport {
        kind: gen.kind.name().to_string(),
        to: a.to.to_string(),
        sources: gen.spoof.map_or_else(|| "kernel".into(), |c| c.to_string()),
        packets,
        bytes: packets * len as u64,
        secs,
        pps: packets as f64 / secs.max(1e-9),
        send_errors: errors,
        packet_bytes: len,
    })
}

// ---------------------------------------------------------------------
// The bench
// ---------------------------------------------------------------------

/// One row per scenario (`--json` writes a list of these).
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Row {
    /// The scenario's name.
    pub scenario: String,
    /// What the flood sends.
    pub flood: String,
    /// Where it goes (gateway B's WAN address and a port).
    pub target: String,
    /// Its source addresses.
    pub sources: String,
    /// Packets the flooder sent.
    pub flood_packets: Option<u64>,
    /// How long it sent.
    pub flood_secs: Option<f64>,
    /// Its rate, packets per second.
    pub flood_pps: Option<f64>,
    /// Packets the flooder's kernel refused.
    pub flood_send_errors: Option<u64>,
    /// IP packet size of the flood.
    pub packet_bytes: Option<usize>,
    /// ESP: one TCP stream without the flood, Mbit/s (receiver).
    pub baseline_mbps: Option<f64>,
    /// ESP: the same with the flood running.
    pub flooded_mbps: Option<f64>,
    /// flooded_mbps / baseline_mbps.
    pub ratio: Option<f64>,
    /// ESP: gateway B's CPU during the clean run, % of one core.
    pub baseline_cpu_percent: Option<f64>,
    /// Junk packets gateway B counted while the flood ran.
    pub junk_counted: Option<u64>,
    /// Which counter that is.
    pub counted_by: Option<String>,
    /// junk_counted / flood_packets.
    pub counted_share: Option<f64>,
    /// The increase of gateway B's drop counters (espgate status), by reason.
    pub drops: BTreeMap<String, u64>,
    /// The increase of the kernel's UDP counters in gateway B's namespace
    /// (/proc/net/snmp: InDatagrams, NoPorts, RcvbufErrors, ...).
    pub kernel_udp: BTreeMap<String, u64>,
    /// Gateway B's CPU seconds while the flood ran.
    pub gwb_cpu_secs: Option<f64>,
    /// The same, % of one core.
    pub gwb_cpu_percent: Option<f64>,
    /// Gateway B's resident memory just before the flood, MiB.
    pub gwb_rss_before_mib: Option<f64>,
    /// Gateway B's peak resident memory during the flood (VmHWM, reset
    /// before it), MiB.
    pub gwb_peak_rss_mib: Option<f64>,
    /// IKE: seconds from initiate to established, per trial (`None`:
    /// not within trial_limit_secs).
    pub trials_secs: Vec<Option<f64>>,
    /// IKE: trials established within 10 s.
    pub trials_within_10s: Option<usize>,
    /// IKE: a trial's limit.
    pub trial_limit_secs: Option<u64>,
    /// IKE: the increase of gateway B's IKE counters, by name.
    pub ike_counters: BTreeMap<String, u64>,
    /// What else the reader should know (rp_filter, failed runs).
    pub notes: Vec<String>,
    /// Why the scenario failed, else `None`.
    pub error: Option<String>,
    /// espgate's version (and commit).
    pub version: String,
}

/// `espgate bench dos`: runs, prints the table; the exit status.
pub fn main(args: &Args) -> ExitCode {
    let opts = match Options::new(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("espgate bench dos: {e:#}");
            return ExitCode::from(2);
        }
    };
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let progress = |s: &str| {
        if tty {
            eprint!("\r\x1b[K{s}");
        }
    };
    let version = crate::version();
    let result = run_bench(&opts, &version, progress);
    if tty {
        eprint!("\r\x1b[K");
    }
    match result {
        Ok(rows) => {
            print!("{}", render(&rows, &opts, &version));
            let failed: Vec<&str> = rows
                .iter()
                .filter(|r| r.error.is_some())
                .map(|r| r.scenario.as_str())
                .collect();
            if failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                eprintln!("espgate bench dos: failed: {}", failed.join(", "));
                ExitCode::from(1)
            }
        }
        Err(e) if e.to_string() == "interrupted" => {
            eprintln!("espgate bench dos: interrupted; everything it made is removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("espgate bench dos: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Builds the lab and runs every scenario; the rows in order.
pub fn run_bench(
    opts: &Options,
    version: &str,
    mut progress: impl FnMut(&str),
) -> Result<Vec<Row>> {
    netlab::install_signal_handlers();
    require_root("bench dos")?;
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("iperf3", "iperf3"),
    ] {
        if !on_path(tool) {
            bail!("bench dos needs {tool}: apt-get install {pkg} (scripts/setup.sh does)");
        }
    }
    let work = std::env::temp_dir().join(format!("{}-work", opts.prefix));
    let mut lab = Lab::new("bench dos", work)?;
    // This very binary, copied: gateways and flooder stay the same program
    // even if the file is rebuilt while the bench runs.
    let exe = lab.work.join("espgate");
    std::fs::copy("/proc/self/exe", &exe).context("copying this espgate binary")?;
    let gw_exe = match &opts.gateway_exe {
        Some(p) => {
            let to = lab.work.join("espgate-gateway");
            std::fs::copy(p, &to).with_context(|| format!("copying {}", p.display()))?;
            to
        }
        None => exe.clone(),
    };
    let mut rows = Vec::new();
    let r = run_all(
        &mut lab,
        [&exe, &gw_exe],
        opts,
        version,
        &mut rows,
        &mut progress,
    );
    let r = if netlab::interrupted() {
        Err(anyhow!("interrupted"))
    } else {
        r
    };
    if r.is_err() || rows.iter().any(|x| x.error.is_some()) {
        lab.keep_work = !netlab::interrupted();
    }
    drop(lab);
    r.map(|()| rows)
}

fn write_json(opts: &Options, rows: &[Row]) -> Result<()> {
    if let Some(f) = &opts.json {
        let text = serde_json::to_string_pretty(rows)?;
        std::fs::write(f, text + "\n").with_context(|| format!("writing {}", f.display()))?;
    }
    Ok(())
}

fn run_all(
    lab: &mut Lab,
    [exe, gw_exe]: [&Path; 2],
    opts: &Options,
    version: &str,
    rows: &mut Vec<Row>,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let total = opts.scenarios.len();
    let esp: Vec<Scenario> = opts
        .scenarios
        .iter()
        .copied()
        .filter(|s| s.is_esp())
        .collect();
    let new_row = |s: Scenario| Row {
        scenario: s.name().into(),
        flood: s.describe(opts),
        target: format!("{GW_B}:{}", s.port()),
        sources: match (s.spoofed(), opts.spoof) {
            (true, Some(c)) => format!("random in {c}"),
            _ => format!("gwA's address {GW_A}"),
        },
        version: version.to_string(),
        ..Row::default()
    };
    if !esp.is_empty() {
        progress(&format!("[0/{total}] setting up the ESP tunnel"));
        let setup = (|| -> Result<(Topology, Gateways, Vec<String>)> {
            let topo = Topology::create(lab, &opts.prefix, None)?;
            let gw = start_esp_gateways(lab, &topo, gw_exe)?;
            tunnel::wait_path(&topo).map_err(|e| tunnel::with_logs(e, &gw.logs))?;
            let notes = allow_spoofed_sources(&topo, opts.spoof.is_some())?;
            Ok((topo, gw, notes))
        })();
        match setup {
            Ok((topo, gw, notes)) => {
                for s in &esp {
                    netlab::check_interrupt()?;
                    let i = rows.len() + 1;
                    let mut row = new_row(*s);
                    row.notes = notes.clone();
                    let mut step =
                        |what: &str| progress(&format!("[{i}/{total}] {}: {what}", s.name()));
                    if let Err(e) =
                        esp_scenario(lab, &topo, &gw, exe, *s, opts, &mut row, &mut step)
                    {
                        netlab::check_interrupt()?;
                        row.error = Some(format!("{e:#}"));
                    }
                    rows.push(row);
                    write_json(opts, rows)?;
                }
            }
            Err(e) => {
                netlab::check_interrupt()?;
                for s in &esp {
                    let mut row = new_row(*s);
                    row.error = Some(format!("the ESP tunnel did not come up: {e:#}"));
                    rows.push(row);
                }
                write_json(opts, rows)?;
            }
        }
        lab.remove_namespaces();
    }
    for s in opts.scenarios.iter().copied().filter(|s| !s.is_esp()) {
        netlab::check_interrupt()?;
        let i = rows.len() + 1;
        let mut row = new_row(s);
        let mut step = |what: &str| progress(&format!("[{i}/{total}] {}: {what}", s.name()));
        step("setting up the IKE connection");
        if let Err(e) = ike_scenario(lab, [exe, gw_exe], s, opts, &mut row, &mut step) {
            netlab::check_interrupt()?;
            row.error = Some(format!("{e:#}"));
        }
        rows.push(row);
        write_json(opts, rows)?;
        lab.remove_namespaces();
    }
    Ok(())
}

/// The two gateways' processes and control sockets.
struct Gateways {
    pid_b: u32,
    sock_a: PathBuf,
    sock_b: PathBuf,
    logs: Vec<PathBuf>,
}

/// Writes each side's files into `work/espgate-SIDE`, starts both
/// gateways and waits for their control sockets.
fn start_gateways(
    lab: &mut Lab,
    exe: &Path,
    sides: [(&str, &str, String); 2],
    psk: Option<&str>,
) -> Result<Gateways> {
    let mut pids = Vec::new();
    let mut socks = Vec::new();
    let mut logs = Vec::new();
    for (side, ns, text) in &sides {
        let dir = lab.work.join(format!("espgate-{side}"));
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("gw.toml");
        write_private(&cfg, text)?;
        if let Some(psk) = psk {
            write_private(&dir.join("psk"), &format!("{psk}\n"))?;
        }
        let log = dir.join("log");
        pids.push(netlab::spawn_gateway(
            lab,
            &format!("espgate {side}"),
            ns,
            exe,
            &cfg,
            &log,
        )?);
        socks.push(dir.join("ctl.sock"));
        logs.push(log);
    }
    for (sock, (side, _, _)) in socks.iter().zip(&sides) {
        let what = format!("espgate {side}");
        tunnel::wait_for(
            lab,
            &[&what],
            Duration::from_secs(10),
            "its control socket",
            || Client::new(sock, Duration::from_secs(2)).status().is_ok(),
        )
        .map_err(|e| tunnel::with_logs(e, &logs))?;
    }
    Ok(Gateways {
        pid_b: pids[1],
        sock_a: socks[0].clone(),
        sock_b: socks[1].clone(),
        logs,
    })
}

/// Both gateways with the manual AES-128-GCM ESP-in-UDP tunnel.
fn start_esp_gateways(lab: &mut Lab, topo: &Topology, exe: &Path) -> Result<Gateways> {
    let settings = Settings {
        mtu: 1500,
        offloads: true,
        workers: None,
        per_cpu_sas: None,
        batch: None,
        socket_buffer: None,
        mss_clamp: true,
        encap: espgate_config::schema::Encapsulation::Udp,
        time_s: 0,
        scrape_hz: 0,
        pin: None,
        iperf_window: None,
        udp_rate_mbps: None,
    };
    let (ab, ba) = (random_hex(20)?, random_hex(20)?);
    let conf = |local, remote, lts, rts, spis, k_in: &str, k_out: &str| {
        tunnel::espgate_config(
            "aes128gcm16",
            local,
            remote,
            lts,
            rts,
            spis,
            (k_in, ""),
            (k_out, ""),
            &settings,
        )
        .replace("bench tunnel", "bench dos")
    };
    start_gateways(
        lab,
        exe,
        [
            (
                "a",
                &topo.ga,
                conf(GW_A, GW_B, NET_A, NET_B, (SPI_TO_A, SPI_TO_B), &ba, &ab),
            ),
            (
                "b",
                &topo.gb,
                conf(GW_B, GW_A, NET_B, NET_A, (SPI_TO_B, SPI_TO_A), &ab, &ba),
            ),
        ],
        None,
    )
}

/// One side's configuration with the IKEv2 PSK connection.
fn ike_config(local: &str, remote: &str, lts: &str, rts: &str, start: bool) -> String {
    use espgate_config::schema::{
        value, ConfigFile, ConnectionTable, GatewayTable, IkeTable, Scalar, StartAction,
    };
    let gateway = GatewayTable {
        tun: Some(value("espgate0".into())),
        control_socket: Some(value("ctl.sock".into())),
        state_dir: Some(value("state".into())),
        // IKE needs one data-plane thread.
        workers: Some(value(1)),
        ..GatewayTable::default()
    };
    let ike = IkeTable {
        psk_file: Some(value("psk".into())),
        proposals: Some(value(
            IKE_PROPOSALS.iter().map(|p| value(p.to_string())).collect(),
        )),
        start_action: Some(if start {
            StartAction::Start
        } else {
            StartAction::None
        }),
        ..IkeTable::default()
    };
    let mut conn = ConnectionTable::new(CONN, local, remote);
    conn.local_ts = Some(value(vec![value(lts.to_string())]));
    conn.remote_ts = Some(value(vec![value(rts.to_string())]));
    conn.mss_clamp = Some(value(Scalar::Str("auto".into())));
    conn.ike = Some(value(ike));
    let file = ConfigFile {
        gateway: Some(value(gateway)),
        connection: vec![value(conn)],
        cluster: None,
    };
    let body = toml::to_string(&file).expect("a configuration of strings and integers");
    format!("# generated by espgate bench dos\n{body}")
}

/// Spoofed sources must reach espgate: rp_filter off in gateway B's
/// namespace when it is on; what was changed, for the notes.
fn allow_spoofed_sources(topo: &Topology, spoofing: bool) -> Result<Vec<String>> {
    if !spoofing {
        return Ok(Vec::new());
    }
    let mut was = Vec::new();
    for key in ["all", "wan"] {
        let k = format!("net.ipv4.conf.{key}.rp_filter");
        let v = netlab::run(&mut in_ns(&topo.gb, &["sysctl", "-n", &k]))?;
        if v.trim() != "0" {
            was.push(format!("{key} {}", v.trim()));
        }
    }
    if was.is_empty() {
        return Ok(vec![
            "rp_filter is 0 in gwB's namespace: spoofed sources reach espgate".into(),
        ]);
    }
    for key in ["all", "wan"] {
        netlab::run(&mut in_ns(
            &topo.gb,
            &["sysctl", "-qw", &format!("net.ipv4.conf.{key}.rp_filter=0")],
        ))?;
    }
    Ok(vec![format!(
        "rp_filter in gwB's namespace was {} and would drop the spoofed sources: set to 0",
        was.join(", ")
    )])
}

/// What is read from gateway B before and after a flood.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    drops: BTreeMap<String, u64>,
    ike: BTreeMap<String, u64>,
    udp: BTreeMap<String, u64>,
    /// espgate's `udp_socket_drops`: the kernel's drops at its sockets.
    socket_drops: u64,
    ticks: Option<u64>,
    at: Option<Instant>,
}

fn status(sock: &Path) -> Result<Status> {
    Client::new(sock, Duration::from_secs(10))
        .status()
        .map_err(|e| anyhow!("espgate status ({}): {e}", sock.display()))
}

/// The row's name for what the SPI filter dropped in the kernel.
const SPI_FILTER_REASON: &str = "spi_filter (in the kernel)";

fn snapshot(sock: &Path, pid: u32) -> Result<Snapshot> {
    let s = status(sock)?;
    Ok(Snapshot {
        socket_drops: s.counters.get("udp_socket_drops").copied().unwrap_or(0),
        drops: s.drops,
        ike: s.ike.map(|i| i.counters).unwrap_or_default(),
        udp: std::fs::read_to_string(format!("/proc/{pid}/net/snmp"))
            .map(|t| parse_snmp_udp(&t))
            .unwrap_or_default(),
        ticks: netlab::cpu_ticks(pid),
        at: Some(Instant::now()),
    })
}

/// The counters that grew from `before` to `after`, by how much.
pub fn increase(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// A /proc/PID/status value in KiB (`VmRSS`, `VmHWM`).
fn proc_kib(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn mib(kib: Option<u64>) -> Option<f64> {
    kib.map(|k| round(k as f64 / 1024.0, 1))
}

fn round(v: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (v * m).round() / m
}

/// Fills the row's gateway B figures from the snapshots around a flood.
fn fill_usage(row: &mut Row, before: &Snapshot, after: &Snapshot, pid: u32) {
    row.drops = increase(&before.drops, &after.drops);
    row.kernel_udp = increase(&before.udp, &after.udp);
    row.ike_counters = increase(&before.ike, &after.ike);
    // What espgate's SPI filter dropped in the kernel: its sockets' drops
    // less those for a full buffer (counted on their own).
    let filtered = after
        .socket_drops
        .saturating_sub(before.socket_drops)
        .saturating_sub(row.kernel_udp.get("RcvbufErrors").copied().unwrap_or(0));
    if filtered > 0 {
        row.drops.insert(SPI_FILTER_REASON.into(), filtered);
    }
    if let (Some(t0), Some(t1), Some(a0), Some(a1)) =
        (before.ticks, after.ticks, before.at, after.at)
    {
        let secs = t1.saturating_sub(t0) as f64 / netlab::clock_ticks();
        let wall = (a1 - a0).as_secs_f64();
        row.gwb_cpu_secs = Some(round(secs, 2));
        row.gwb_cpu_percent = Some(round(secs / wall.max(1e-9) * 100.0, 1));
    }
    row.gwb_peak_rss_mib = mib(proc_kib(pid, "VmHWM"));
}

/// Resets a process's peak resident memory to its current one; its
/// resident memory now, in KiB.
fn reset_peak_rss(pid: u32) -> Option<u64> {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    proc_kib(pid, "VmRSS")
}

/// A running flooder.
struct Flood {
    pid: u32,
    out: std::thread::JoinHandle<Vec<u8>>,
    err: std::thread::JoinHandle<Vec<u8>>,
}

const FLOOD: &str = "flood";

/// Starts `espgate bench flood` for `s` in gateway A's namespace, for at
/// most `limit` (it is stopped earlier with [`stop_flood`]).
fn start_flood(
    lab: &mut Lab,
    topo: &Topology,
    exe: &Path,
    s: Scenario,
    opts: &Options,
    limit: Duration,
) -> Result<Flood> {
    let mut args: Vec<String> = [
        exe.to_string_lossy().as_ref(),
        "bench",
        "flood",
        "--kind",
        s.kind().name(),
        "--to",
        &format!("{GW_B}:{}", s.port()),
        "--size",
        &opts.size.to_string(),
        "--rate",
        &opts.rate.to_string(),
        "--secs",
        &limit.as_secs().to_string(),
        "--ike-proposal",
        &opts.ike_proposal,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if s == Scenario::EspBadIcv {
        args.extend(["--spi".into(), format!("{SPI_TO_B:x}")]);
    }
    if let (true, Some(c)) = (s.spoofed(), opts.spoof) {
        args.extend(["--spoof".into(), c.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = in_ns(&topo.ga, &args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting espgate bench flood")?;
    let [out, err] = netlab::drain_output(&mut child);
    let pid = child.id();
    lab.adopt(FLOOD, child);
    Ok(Flood { pid, out, err })
}

/// Fails with the flooder's error if it has already exited.
fn check_flood(lab: &mut Lab) -> Result<()> {
    if let Some(st) = lab.exited(FLOOD) {
        bail!("the flooder exited early ({st})");
    }
    Ok(())
}

/// Stops the flooder (SIGTERM) and reads its report.
fn stop_flood(lab: &mut Lab, f: Flood) -> Result<FloodReport> {
    if lab.exited(FLOOD).is_none() {
        if let Some(p) = i32::try_from(f.pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            // Our child, not yet reaped (it had not exited just now).
            let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
        }
    }
    lab.reap(FLOOD, Duration::from_secs(5));
    let out = String::from_utf8_lossy(&f.out.join().unwrap_or_default()).into_owned();
    let err = String::from_utf8_lossy(&f.err.join().unwrap_or_default()).into_owned();
    let line = out.lines().rev().find(|l| l.starts_with('{'));
    let Some(line) = line else {
        bail!("the flooder reported nothing: {}", err.trim());
    };
    serde_json::from_str(line).with_context(|| format!("the flooder's report {line}"))
}

fn fill_flood(row: &mut Row, r: &FloodReport) {
    row.flood_packets = Some(r.packets);
    row.flood_secs = Some(round(r.secs, 3));
    row.flood_pps = Some(r.pps.round());
    row.flood_send_errors = Some(r.send_errors);
    row.packet_bytes = Some(r.packet_bytes);
}

/// One TCP stream host A → host B for `secs`: Mbit/s and gateway B's CPU
/// (% of one core).
fn tcp_run(lab: &mut Lab, topo: &Topology, pid_b: u32, secs: u32) -> Result<(f64, Option<f64>)> {
    let t = secs.to_string();
    let r = netlab::iperf3(
        lab,
        &topo.ha,
        &topo.hb,
        HOST_B,
        &["-t", &t, "--connect-timeout", "10000"],
        &[("gwB".to_string(), pid_b)],
        Duration::from_secs(u64::from(secs) + 40),
        None,
    )?;
    let (mbps, _, _) = tunnel::parse_iperf(Test::Tcp, &r.json)?;
    let cpu = r.cpu.first().map(|(_, c)| round(*c, 1));
    Ok((round(mbps, 1), cpu))
}

#[allow(clippy::too_many_arguments)]
fn esp_scenario(
    lab: &mut Lab,
    topo: &Topology,
    gw: &Gateways,
    exe: &Path,
    s: Scenario,
    opts: &Options,
    row: &mut Row,
    step: &mut dyn FnMut(&str),
) -> Result<()> {
    step("TCP without a flood");
    let (base, cpu) = tcp_run(lab, topo, gw.pid_b, opts.secs).context("the clean TCP run")?;
    row.baseline_mbps = Some(base);
    row.baseline_cpu_percent = cpu;
    netlab::check_interrupt()?;
    step("flooding");
    row.gwb_rss_before_mib = mib(reset_peak_rss(gw.pid_b));
    let before = snapshot(&gw.sock_b, gw.pid_b)?;
    let limit = Duration::from_secs(u64::from(opts.secs) + 120);
    let flood = start_flood(lab, topo, exe, s, opts, limit)?;
    std::thread::sleep(ESP_WARMUP);
    let flooded = match check_flood(lab) {
        Ok(()) => {
            step("TCP with the flood running");
            Some(tcp_run(lab, topo, gw.pid_b, opts.secs))
        }
        Err(_) => None,
    };
    let report = stop_flood(lab, flood)?;
    netlab::check_interrupt()?;
    std::thread::sleep(SETTLE);
    let after = snapshot(&gw.sock_b, gw.pid_b)?;
    fill_flood(row, &report);
    fill_usage(row, &before, &after, gw.pid_b);
    match flooded {
        Some(Ok((mbps, _))) => {
            row.flooded_mbps = Some(mbps);
            row.ratio = (base > 0.0).then(|| round(mbps / base, 4));
        }
        Some(Err(e)) => {
            netlab::check_interrupt()?;
            // A stream that could not even start is a result, not a failure.
            row.flooded_mbps = Some(0.0);
            row.ratio = Some(0.0);
            row.notes.push(format!("the flooded TCP run failed: {e:#}"));
        }
        None => bail!("the flooder exited before the flooded run"),
    }
    let (counted, by) = if s == Scenario::EspClosedPort {
        (
            row.kernel_udp.get("NoPorts").copied().unwrap_or(0),
            "kernel Udp NoPorts",
        )
    } else {
        (row.drops.values().sum(), "espgate drops (all reasons)")
    };
    row.junk_counted = Some(counted);
    row.counted_by = Some(by.into());
    row.counted_share =
        (report.packets > 0).then(|| round(counted as f64 / report.packets as f64, 4));
    Ok(())
}

/// The IKE SAs of `s` established with at least one child SA, by SPIs.
fn established(s: &Status) -> Vec<String> {
    s.ike
        .as_ref()
        .map(|i| {
            i.sas
                .iter()
                .filter(|sa| sa.state == "established" && !sa.children.is_empty())
                .map(|sa| sa.spis.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Every IKE SA of `s`, by SPIs.
fn all_sas(s: &Status) -> Vec<String> {
    s.ike
        .as_ref()
        .map(|i| i.sas.iter().map(|sa| sa.spis.clone()).collect())
        .unwrap_or_default()
}

/// Polls `ok` every 25 ms for at most `limit`; the time it took.
fn poll(limit: Duration, mut ok: impl FnMut() -> Result<bool>) -> Result<Option<Duration>> {
    let t0 = Instant::now();
    loop {
        netlab::check_interrupt()?;
        if ok()? {
            return Ok(Some(t0.elapsed()));
        }
        if t0.elapsed() >= limit {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Terminate, then initiate gateway A's connection: the seconds until a
/// new IKE SA is established with its child, `None` after `limit`.
fn trial(sock_a: &Path, limit: Duration) -> Result<Option<f64>> {
    let a = Client::new(sock_a, Duration::from_secs(10));
    // Fails when no IKE SA is left (a trial that never came up); fine.
    let _ = a.change(&Request::Terminate { conn: CONN.into() });
    poll(Duration::from_secs(10), || {
        Ok(established(&status(sock_a)?).is_empty())
    })?
    .ok_or_else(|| anyhow!("gateway A still shows an established IKE SA 10 s after terminate"))?;
    let old = all_sas(&status(sock_a)?);
    let t0 = Instant::now();
    a.change(&Request::Initiate { conn: CONN.into() })
        .map_err(|e| anyhow!("espgate initiate {CONN}: {e}"))?;
    let up = poll(limit.saturating_sub(t0.elapsed()), || {
        Ok(established(&status(sock_a)?)
            .iter()
            .any(|s| !old.contains(s)))
    })?;
    Ok(up.map(|_| round(t0.elapsed().as_secs_f64(), 3)))
}

fn ike_scenario(
    lab: &mut Lab,
    [exe, gw_exe]: [&Path; 2],
    s: Scenario,
    opts: &Options,
    row: &mut Row,
    step: &mut dyn FnMut(&str),
) -> Result<()> {
    let topo = Topology::create(lab, &opts.prefix, None)?;
    let psk = random_hex(24)?;
    let gw = start_gateways(
        lab,
        gw_exe,
        [
            ("a", &topo.ga, ike_config(GW_A, GW_B, NET_A, NET_B, true)),
            ("b", &topo.gb, ike_config(GW_B, GW_A, NET_B, NET_A, false)),
        ],
        Some(&psk),
    )?;
    let up = poll(Duration::from_secs(20), || {
        Ok(!established(&status(&gw.sock_a)?).is_empty())
    })?;
    if up.is_none() {
        return Err(tunnel::with_logs(
            anyhow!("the IKE SA was not established within 20 s (no flood yet)"),
            &gw.logs,
        ));
    }
    tunnel::wait_path(&topo).map_err(|e| tunnel::with_logs(e, &gw.logs))?;
    row.notes = allow_spoofed_sources(&topo, s.spoofed() && opts.spoof.is_some())?;
    netlab::check_interrupt()?;
    step("flooding");
    row.gwb_rss_before_mib = mib(reset_peak_rss(gw.pid_b));
    let before = snapshot(&gw.sock_b, gw.pid_b)?;
    let per_trial = opts.trial_limit + Duration::from_secs(12);
    let limit = IKE_WARMUP + per_trial * opts.trials as u32 + Duration::from_secs(60);
    let flood = start_flood(lab, &topo, exe, s, opts, limit)?;
    std::thread::sleep(IKE_WARMUP);
    let mut result = check_flood(lab);
    if result.is_ok() {
        for t in 1..=opts.trials {
            step(&format!("trial {t}/{}", opts.trials));
            match trial(&gw.sock_a, opts.trial_limit) {
                Ok(v) => row.trials_secs.push(v),
                Err(e) => {
                    result = Err(e.context(format!("trial {t}")));
                    break;
                }
            }
        }
    }
    let report = stop_flood(lab, flood);
    netlab::check_interrupt()?;
    result?;
    let report = report?;
    std::thread::sleep(SETTLE);
    let after = snapshot(&gw.sock_b, gw.pid_b)?;
    fill_flood(row, &report);
    fill_usage(row, &before, &after, gw.pid_b);
    row.trial_limit_secs = Some(opts.trial_limit.as_secs());
    row.trials_within_10s = Some(
        row.trials_secs
            .iter()
            .filter(|t| t.is_some_and(|t| t <= IN_TIME_SECS))
            .count(),
    );
    let counted = row.ike_counters.get("messages_in").copied().unwrap_or(0);
    row.junk_counted = Some(counted);
    row.counted_by = Some("espgate IKE messages_in (the trials' few included)".into());
    row.counted_share =
        (report.packets > 0).then(|| round(counted as f64 / report.packets as f64, 4));
    Ok(())
}

// ---------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

fn cpu_cell(r: &Row) -> String {
    match (r.gwb_cpu_secs, r.gwb_cpu_percent) {
        (Some(s), Some(p)) => format!("{s:.1} s ({p:.0}%)"),
        _ => "-".into(),
    }
}

fn rss_cell(r: &Row) -> String {
    match (r.gwb_rss_before_mib, r.gwb_peak_rss_mib) {
        (Some(b), Some(p)) => format!("{b:.1} -> {p:.1}"),
        (None, Some(p)) => format!("{p:.1}"),
        _ => "-".into(),
    }
}

fn counted_cell(r: &Row) -> String {
    match (r.junk_counted, r.counted_share) {
        (Some(c), Some(s)) => format!("{c} ({:.0}%)", s * 100.0),
        (Some(c), None) => c.to_string(),
        _ => "-".into(),
    }
}

/// The trials as text: seconds, or `never`.
fn trials_cell(r: &Row) -> String {
    r.trials_secs
        .iter()
        .map(|t| t.map_or_else(|| "never".to_string(), |v| format!("{v:.2}")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The median of the trials that came up (`None`: none did).
fn median_up(r: &Row) -> Option<f64> {
    let mut v: Vec<f64> = r.trials_secs.iter().flatten().copied().collect();
    v.sort_by(f64::total_cmp);
    tunnel::stats(&v).map(|s| s.0)
}

/// The rows as text: a header, a table for the ESP floods and one for the
/// IKE floods, then the notes and failures.
pub fn render(rows: &[Row], opts: &Options, version: &str) -> String {
    let mut out = format!(
        "espgate bench dos: espgate {version}; floods from gwA's namespace to gwB ({GW_B}), \
         rate {}\n",
        if opts.rate == 0 {
            "as fast as the flooder can".to_string()
        } else {
            format!("{} packets/s asked", opts.rate)
        }
    );
    let esp: Vec<&Row> = rows
        .iter()
        .filter(|r| Scenario::parse(&r.scenario).is_ok_and(|s| s.is_esp()))
        .collect();
    let ike: Vec<&Row> = rows
        .iter()
        .filter(|r| Scenario::parse(&r.scenario).is_ok_and(|s| !s.is_esp()))
        .collect();
    if !esp.is_empty() {
        out += &format!(
            "\nESP floods (manual ESP-in-UDP tunnel, aes128gcm16): one TCP stream host A -> host B, \
             {} s clean, then {} s flooded\n\n",
            opts.secs, opts.secs
        );
        let mut t = Table::new([
            Column::left("scenario"),
            Column::right("flood pps"),
            Column::right("sent"),
            Column::right("counted by gwB"),
            Column::right("rcvbuf drops"),
            Column::right("TCP clean"),
            Column::right("flooded"),
            Column::right("ratio"),
            Column::right("gwB CPU"),
            Column::right("gwB RSS MiB"),
        ]);
        for r in &esp {
            if let (Some(e), None) = (&r.error, r.flood_packets) {
                t.row_then(
                    [r.scenario.clone()],
                    format!("failed: {}", e.lines().next().unwrap_or_default()),
                );
                continue;
            }
            t.row([
                r.scenario.clone(),
                opt(r.flood_pps, |v| format!("{v:.0}")),
                opt(r.flood_packets, |v| v.to_string()),
                counted_cell(r),
                r.kernel_udp
                    .get("RcvbufErrors")
                    .copied()
                    .unwrap_or(0)
                    .to_string(),
                opt(r.baseline_mbps, |v| format!("{v:.1}")),
                opt(r.flooded_mbps, |v| format!("{v:.1}")),
                opt(r.ratio, |v| format!("{v:.3}")),
                cpu_cell(r),
                rss_cell(r),
            ]);
        }
        out += &t.render();
        out +=
            "TCP in Mbit/s (receiver); ratio = flooded / clean; counted: espgate's drop counters \
                and its SPI filter's kernel drops (kernel Udp NoPorts for esp-closed-port) \
                against the packets sent; rcvbuf drops: \
                datagrams the kernel dropped for a full socket; gwB CPU: seconds during the flood \
                (% of one core); RSS: before -> peak during the flood\n";
        let reasons: Vec<String> = esp
            .iter()
            .filter(|r| !r.drops.is_empty())
            .map(|r| {
                let d: Vec<String> = r.drops.iter().map(|(k, v)| format!("{k} {v}")).collect();
                format!("  {}: {}", r.scenario, d.join(", "))
            })
            .collect();
        if !reasons.is_empty() {
            out += "gwB drops by reason during the flood:\n";
            out += &reasons.join("\n");
            out += "\n";
        }
    }
    if !ike.is_empty() {
        out += &format!(
            "\nIKE_SA_INIT floods (PSK IKEv2): gwA terminates and initiates its connection under \
             the flood; seconds until established, never = not within {} s\n\n",
            opts.trial_limit.as_secs()
        );
        let mut t = Table::new([
            Column::left("scenario"),
            Column::right("flood pps"),
            Column::right("sent"),
            Column::right("up <= 10 s"),
            Column::right("median s"),
            Column::left("trials (s)"),
            Column::right("cookies"),
            Column::right("answered"),
            Column::right("gwB CPU"),
            Column::right("gwB RSS MiB"),
        ]);
        for r in &ike {
            if let (Some(e), None) = (&r.error, r.flood_packets) {
                t.row_then(
                    [r.scenario.clone()],
                    format!("failed: {}", e.lines().next().unwrap_or_default()),
                );
                continue;
            }
            let c = |k: &str| r.ike_counters.get(k).copied().unwrap_or(0).to_string();
            t.row([
                r.scenario.clone(),
                opt(r.flood_pps, |v| format!("{v:.0}")),
                opt(r.flood_packets, |v| v.to_string()),
                opt(r.trials_within_10s, |n| {
                    format!("{n}/{}", r.trials_secs.len())
                }),
                opt(median_up(r), |v| format!("{v:.2}")),
                trials_cell(r),
                c("cookies_sent"),
                c("ike_init_answered"),
                cpu_cell(r),
                rss_cell(r),
            ]);
        }
        out += &t.render();
        out += "cookies / answered: gwB's cookies_sent and ike_init_answered during the flood\n";
        let counters: Vec<String> = ike
            .iter()
            .filter(|r| !r.ike_counters.is_empty() || !r.kernel_udp.is_empty())
            .map(|r| {
                let mut d: Vec<String> = r
                    .ike_counters
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                if let Some(n) = r.kernel_udp.get("RcvbufErrors") {
                    d.push(format!("kernel RcvbufErrors {n}"));
                }
                format!("  {}: {}", r.scenario, d.join(", "))
            })
            .collect();
        if !counters.is_empty() {
            out += "gwB IKE counters during the flood:\n";
            out += &counters.join("\n");
            out += "\n";
        }
    }
    // Each scenario's flood, then each other note once with the scenarios
    // it concerns.
    let mut notes: Vec<String> = rows
        .iter()
        .map(|r| format!("{}: {}, from {}", r.scenario, r.flood, r.sources))
        .collect();
    let mut shared: Vec<(&str, Vec<&str>)> = Vec::new();
    for r in rows {
        for n in &r.notes {
            match shared.iter_mut().find(|(t, _)| *t == n.as_str()) {
                Some((_, who)) => who.push(&r.scenario),
                None => shared.push((n, vec![&r.scenario])),
            }
        }
    }
    notes.extend(
        shared
            .into_iter()
            .map(|(t, who)| format!("{}: {t}", who.join(", "))),
    );
    if !notes.is_empty() {
        out += "\nnotes:\n";
        for n in notes {
            out += &format!("- {n}\n");
        }
    }
    let failures: Vec<String> = rows
        .iter()
        .filter_map(|r| Some(format!("- {}: {}", r.scenario, r.error.as_ref()?)))
        .collect();
    if !failures.is_empty() {
        out += "\nfailures:\n";
        out += &failures.join("\n");
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_ike::wire::{ExchangeType, Message, Payload};

    fn flood_args(kind: &str) -> FloodArgs {
        FloodArgs {
            kind: kind.into(),
            to: "192.0.2.2:4500".parse().unwrap(),
            spi: None,
            seq: BADICV_SEQ,
            spoof: Some("198.18.0.0/15".into()),
            size: 100,
            rate: 0,
            secs: 1.0,
            batch: 64,
            ike_proposal: DEFAULT_IKE_PROPOSAL.into(),
        }
    }

    fn packets(g: &mut Generator, n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|_| {
                let mut b = vec![0u8; 1500];
                let len = g.write(&mut b);
                b.truncate(len);
                b
            })
            .collect()
    }

    fn check_headers(p: &[u8], dport: u16) -> (Ipv4Addr, u16) {
        assert_eq!(p[0], 0x45);
        assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])), p.len());
        assert_eq!(p[9], 17);
        assert_eq!(&p[16..20], &[192, 0, 2, 2]);
        assert_eq!(u16::from_be_bytes([p[22], p[23]]), dport);
        assert_eq!(
            usize::from(u16::from_be_bytes([p[24], p[25]])),
            p.len() - 20
        );
        let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
        let sport = u16::from_be_bytes([p[20], p[21]]);
        assert!(sport >= 1024 && !AVOID_PORTS.contains(&sport), "{sport}");
        (src, sport)
    }

    #[test]
    fn unknown_spi_packets_vary_in_source_port_address_and_spi() {
        let mut g = Generator::new(&flood_args("esp-unknown")).unwrap();
        let ps = packets(&mut g, 200);
        let mut srcs = std::collections::BTreeSet::new();
        let mut spis = std::collections::BTreeSet::new();
        for p in &ps {
            assert_eq!(p.len(), 128);
            let (src, sport) = check_headers(p, 4500);
            let o = src.octets();
            assert!(o[0] == 198 && (o[1] == 18 || o[1] == 19), "{src}");
            srcs.insert((src, sport));
            let spi = u32::from_be_bytes(p[28..32].try_into().unwrap());
            assert!(spi >= RANDOM_SPI_MIN, "{spi:#x}");
            spis.insert(spi);
        }
        assert!(srcs.len() > 190 && spis.len() > 190);
    }

    #[test]
    fn badicv_packets_carry_the_spi_and_count_up() {
        let mut a = flood_args("esp-badicv");
        assert!(Generator::new(&a).is_err(), "esp-badicv needs --spi");
        a.spi = Some("1002".into());
        a.spoof = None;
        let mut g = Generator::new(&a).unwrap();
        let ps = packets(&mut g, 3);
        for (i, p) in ps.iter().enumerate() {
            let (src, _) = check_headers(p, 4500);
            assert_eq!(src, Ipv4Addr::UNSPECIFIED, "the kernel fills it in");
            assert_eq!(&p[28..32], &0x1002u32.to_be_bytes());
            let seq = u32::from_be_bytes(p[32..36].try_into().unwrap());
            assert_eq!(seq, BADICV_SEQ + i as u32);
        }
        assert_ne!(ps[0][36..], ps[1][36..], "random payloads");
    }

    #[test]
    fn ike_init_packets_parse_as_requests_with_fresh_spis_and_nonces() {
        let mut a = flood_args("ike-init");
        a.to = "192.0.2.2:500".parse().unwrap();
        let mut g = Generator::new(&a).unwrap();
        let ps = packets(&mut g, 2);
        let mut seen = Vec::new();
        for p in &ps {
            check_headers(p, 500);
            let m = Message::parse(&p[28..]).unwrap();
            assert_eq!(m.header.exchange_type, ExchangeType::IkeSaInit);
            assert!(m.header.initiator && !m.header.response);
            assert_eq!((m.header.spi_r, m.header.message_id), (0, 0));
            assert_ne!(m.header.spi_i, 0);
            let mut kinds = Vec::new();
            for pl in &m.payloads {
                match pl {
                    Payload::Sa(props) => {
                        assert_eq!(props.len(), 1);
                        kinds.push("sa");
                    }
                    Payload::Ke { group, data } => {
                        assert_eq!(*group, espgate_ike::dh::Group::Modp2048.id());
                        assert_eq!(data.len(), 256);
                        kinds.push("ke");
                    }
                    Payload::Nonce(n) => {
                        assert_eq!(n.len(), 32);
                        seen.push((m.header.spi_i, n.clone()));
                        kinds.push("nonce");
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            assert_eq!(kinds, ["sa", "ke", "nonce"]);
        }
        assert_ne!(seen[0].0, seen[1].0);
        assert_ne!(seen[0].1, seen[1].1);
        // Another proposal: its group's KE.
        let t = ike_template("aes128gcm16-prfsha256-x25519").unwrap();
        let m = Message::parse(&t.bytes).unwrap();
        assert!(m
            .payloads
            .iter()
            .any(|p| matches!(p, Payload::Ke { data, .. } if data.len() == 32)));
        assert!(ike_template("aes128gcm16-prfsha256").is_err());
        assert!(ike_template("nonsense").is_err());
    }

    #[test]
    fn prefixes_are_checked_and_random_addresses_stay_inside() {
        let c = Cidr::parse("198.18.0.0/15").unwrap();
        assert_eq!(c.to_string(), "198.18.0.0/15");
        let mut rng = FastRng::seeded().unwrap();
        for _ in 0..1000 {
            let a = u32::from(c.random(&mut rng));
            assert_eq!(a & Cidr::mask(15), c.base);
            assert!(a != c.base && a != c.base | !Cidr::mask(15));
        }
        let one = Cidr::parse("203.0.113.7/32").unwrap();
        assert_eq!(one.random(&mut rng), Ipv4Addr::new(203, 0, 113, 7));
        for bad in [
            "198.18.0.1/15",
            "198.18.0.0",
            "10.0.0.0/4",
            "127.0.0.0/8",
            "x/16",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fast_rng_fills_odd_lengths() {
        let mut r = FastRng::seeded().unwrap();
        let mut b = [0u8; 13];
        r.fill(&mut b);
        assert!(b.iter().any(|x| *x != 0));
    }

    #[test]
    fn udp_counters_from_snmp() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors\n\
                    Udp: 10 20 3 4 5\n\
                    UdpLite: InDatagrams NoPorts\nUdpLite: 0 0\n";
        let m = parse_snmp_udp(text);
        assert_eq!(m["InDatagrams"], 10);
        assert_eq!(m["NoPorts"], 20);
        assert_eq!(m["RcvbufErrors"], 5);
        assert_eq!(m.len(), 5);
        let after: BTreeMap<String, u64> = [("NoPorts".to_string(), 25), ("InErrors".into(), 3)]
            .into_iter()
            .collect();
        let d = increase(&m, &after);
        assert_eq!(d.len(), 1);
        assert_eq!(d["NoPorts"], 5);
        assert!(parse_snmp_udp("").is_empty());
    }

    fn args() -> Args {
        Args {
            scenario: vec![],
            secs: 8,
            trials: 10,
            trial_limit: 30,
            spoof: "198.18.0.0/15".into(),
            size: 64,
            rate: 0,
            ike_proposal: DEFAULT_IKE_PROPOSAL.into(),
            json: None,
            prefix: Some("egd-1".into()),
            gateway_exe: None,
        }
    }

    #[test]
    fn options_are_checked_with_the_option_named() {
        let o = Options::new(&args()).unwrap();
        assert_eq!(o.scenarios, Scenario::ALL);
        let mut a = args();
        a.scenario = vec!["ike-init".into(), "esp-badicv".into(), "ike-init".into()];
        a.spoof = "none".into();
        let o = Options::new(&a).unwrap();
        assert_eq!(o.scenarios, [Scenario::EspBadIcv, Scenario::IkeInit]);
        assert!(o.spoof.is_none());
        let err = |f: &dyn Fn(&mut Args)| {
            let mut a = args();
            f(&mut a);
            Options::new(&a).unwrap_err().to_string()
        };
        assert!(err(&|a| a.scenario = vec!["syn".into()]).contains("--scenario syn"));
        assert!(err(&|a| a.secs = 0).contains("--secs"));
        assert!(err(&|a| a.trials = 0).contains("--trials"));
        assert!(err(&|a| a.trial_limit = 0).contains("--trial-limit"));
        assert!(err(&|a| a.spoof = "1.2.3.4".into()).contains("--spoof"));
        assert!(err(&|a| a.size = 8).contains("--size"));
        assert!(err(&|a| a.ike_proposal = "aes128".into()).contains("--ike-proposal"));
        assert!(err(&|a| a.prefix = Some("a b".into())).contains("--prefix"));
        for (i, s) in Scenario::ALL.iter().enumerate() {
            assert_eq!(s.name(), SCENARIOS[i]);
            assert_eq!(Scenario::parse(s.name()).unwrap(), *s);
        }
    }

    #[test]
    fn the_ike_config_loads_as_a_psk_connection() {
        let text = ike_config(GW_A, GW_B, NET_A, NET_B, true);
        let v: toml::Value = toml::from_str(&text).unwrap();
        let conn = &v["connection"][0];
        assert_eq!(conn["name"].as_str(), Some(CONN));
        assert_eq!(conn["ike"]["psk_file"].as_str(), Some("psk"));
        assert_eq!(conn["ike"]["start_action"].as_str(), Some("start"));
        assert_eq!(v["gateway"]["workers"].as_integer(), Some(1));
        let props = conn["ike"]["proposals"].as_array().unwrap();
        assert!(props
            .iter()
            .any(|p| p.as_str() == Some(DEFAULT_IKE_PROPOSAL)));
        let b: toml::Value = toml::from_str(&ike_config(GW_B, GW_A, NET_B, NET_A, false)).unwrap();
        assert_eq!(
            b["connection"][0]["ike"]["start_action"].as_str(),
            Some("none")
        );
    }

    fn sample_rows() -> Vec<Row> {
        let mut esp = Row {
            scenario: "esp-unknown".into(),
            flood: "ESP".into(),
            target: "192.0.2.2:4500".into(),
            sources: "random in 198.18.0.0/15".into(),
            flood_packets: Some(1000),
            flood_secs: Some(10.0),
            flood_pps: Some(100.0),
            flood_send_errors: Some(0),
            packet_bytes: Some(92),
            baseline_mbps: Some(4000.0),
            flooded_mbps: Some(1000.0),
            ratio: Some(0.25),
            baseline_cpu_percent: Some(40.0),
            junk_counted: Some(900),
            counted_by: Some("espgate drops (all reasons)".into()),
            counted_share: Some(0.9),
            gwb_cpu_secs: Some(9.5),
            gwb_cpu_percent: Some(95.0),
            gwb_rss_before_mib: Some(8.0),
            gwb_peak_rss_mib: Some(9.0),
            notes: vec!["rp_filter is 0 in gwB's namespace: spoofed sources reach espgate".into()],
            version: "0.1.0 (abc)".into(),
            ..Row::default()
        };
        esp.drops.insert("unknown_spi".into(), 900);
        esp.kernel_udp.insert("RcvbufErrors".into(), 100);
        let mut ike = Row {
            scenario: "ike-init".into(),
            flood: "IKE_SA_INIT".into(),
            sources: "gwA's address 192.0.2.1".into(),
            flood_packets: Some(500),
            flood_pps: Some(50.0),
            trials_secs: vec![Some(0.5), None, Some(12.0)],
            trials_within_10s: Some(1),
            trial_limit_secs: Some(30),
            ..Row::default()
        };
        ike.ike_counters.insert("cookies_sent".into(), 400);
        let failed = Row {
            scenario: "esp-badicv".into(),
            error: Some("boom\nmore".into()),
            ..Row::default()
        };
        vec![esp, failed, ike]
    }

    #[test]
    fn the_text_has_both_tables_notes_and_failures() {
        let o = Options::new(&args()).unwrap();
        let t = render(&sample_rows(), &o, "0.1.0 (abc)");
        assert!(
            t.starts_with("espgate bench dos: espgate 0.1.0 (abc);"),
            "{t}"
        );
        let line = |start: &str| {
            t.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no {start} in\n{t}"))
        };
        let e = line("esp-unknown ");
        for want in [
            "100",
            "1000",
            "900 (90%)",
            "4000.0",
            "0.250",
            "9.5 s (95%)",
            "8.0 -> 9.0",
        ] {
            assert!(e.contains(want), "{want} not in {e}");
        }
        assert!(line("esp-badicv ").contains("failed: boom"));
        let i = line("ike-init ");
        assert!(
            i.contains("1/3") && i.contains("0.50 never 12.00") && i.contains("400"),
            "{i}"
        );
        assert!(t.contains("  esp-unknown: unknown_spi 900"), "{t}");
        assert!(t.contains("- esp-unknown: rp_filter is 0"), "{t}");
        assert!(t.contains("\nfailures:\n- esp-badicv: boom\nmore"), "{t}");
    }

    #[test]
    fn json_rows_have_the_documented_keys() {
        let v = serde_json::to_value(sample_rows()).unwrap();
        let o = v[0].as_object().unwrap();
        for k in o.keys() {
            assert!(USAGE.contains(k.as_str()), "{k} not in USAGE");
        }
        assert_eq!(v[2]["trials_secs"][1], serde_json::Value::Null);
        assert_eq!(v[0]["drops"]["unknown_spi"], 900);
    }

    #[test]
    fn a_flood_report_round_trips() {
        let r = FloodReport {
            kind: "esp-unknown".into(),
            to: "192.0.2.2:4500".into(),
            sources: "198.18.0.0/15".into(),
            packets: 10,
            bytes: 920,
            secs: 1.0,
            pps: 10.0,
            send_errors: 0,
            packet_bytes: 92,
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<FloodReport>(&s).unwrap(), r);
    }
}
