//! The gateway configuration file (`espgate up -c FILE`): TOML parsed and
//! validated into typed structs, and each connection turned into the
//! manually keyed [`SaConfig`]s the daemon installs.
//!
//! The only I/O here is reading the configuration file and the key files it
//! names. Every error names the file, the TOML key path
//! (`connection[1].esp.enc_in`, indices from 0, plus the connection's name),
//! the line and column, and the reason. Keys are kept in [`Zeroizing`]
//! buffers and never appear in `Debug` output or error messages.
//!
//! The schema is documented key by key in `docs/CONFIG.md`.

pub mod ike;
pub mod keygen;

use crate::ike::{AuthMethod, IkeSettings, StartAction};
use espgate_core::crypto::{Suite, SuiteError};
use espgate_core::sa::replay::MAX_WINDOW;
use espgate_core::sa::{Encap, Lifetime, Mode, Protocol, Sa, SaConfig};
use espgate_core::selector::{PortRange, Prefix, TrafficSelector};
use espgate_core::wire::proto;
use espgate_ike::cert::{Certificate, Identity};
use espgate_ike::config::{DpdAction, LocalAuth, RemoteAuth, Retransmit};
use espgate_ike::proposal::{ProposalKind, ProposalSpec};
use espgate_ike::sig::{PrivateKey, PublicKey};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use toml::de::{DeTable, DeValue};
use toml::Spanned;
use zeroize::Zeroizing;

// ---------------------------------------------------------------------------
// Public, validated configuration
// ---------------------------------------------------------------------------

/// A configuration file, parsed and validated.
#[derive(Debug)]
pub struct LoadedConfig {
    /// The file name used in messages (the path given to [`load`]).
    pub source: String,
    /// The `[gateway]` table.
    pub gateway: Gateway,
    /// The `[[connection]]` tables, in file order.
    pub connections: Vec<Connection>,
    /// Problems that do not stop the gateway (for example a key file
    /// readable by other users); the daemon should log them.
    pub warnings: Vec<String>,
}

impl LoadedConfig {
    /// The connection called `name`.
    pub fn connection(&self, name: &str) -> Option<&Connection> {
        self.connections.iter().find(|c| c.name == name)
    }
}

/// The `[gateway]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    /// TUN device name.
    pub tun: String,
    /// Addresses to put on the TUN device.
    pub tun_address: Vec<IfAddr>,
    /// UDP address ESP-in-UDP is received on (and sent from).
    pub listen: SocketAddr,
    /// Default encapsulation of connections.
    pub encap: Encapsulation,
    /// Data-plane threads; 0 means one per CPU (see [`Gateway::worker_threads`]).
    pub workers: u32,
    /// Path MTU of the outer network.
    pub mtu: u16,
    /// Control socket path (made absolute against the config file's directory).
    pub control_socket: PathBuf,
    /// Prometheus text endpoint, if enabled.
    pub metrics: Option<SocketAddr>,
    /// Log level.
    pub log: LogLevel,
    /// Firewall mark put on outer packets; also the routing table the
    /// daemon's routes go into when set.
    pub fwmark: Option<u32>,
    /// Directory for state kept across restarts (the reserved outbound
    /// sequence numbers), made absolute against the config file's directory.
    pub state_dir: PathBuf,
    /// Use the kernel's batching offloads (UDP GSO on send, GRO on receive).
    pub offloads: bool,
    /// Per-stage cost accounting from the start (`espgate status --costs`;
    /// `espgate costs on|off|reset` switches it at run time).
    pub cost_accounting: bool,
    /// Packets handled per ready descriptor before polling again (and the
    /// most datagrams in one GSO send), 1 to 64.
    pub batch: usize,
    /// IKE messages larger than this are sent as RFC 7383 fragments of at
    /// most this many bytes (when the peer supports fragmentation).
    pub ike_fragment_size: usize,
    /// Send and receive buffer size of the outer sockets, bytes.
    pub socket_buffer: usize,
}

impl Gateway {
    /// Number of data-plane threads to start: `workers`, or the number of
    /// CPUs when it is 0.
    pub fn worker_threads(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n as usize,
        }
    }
}

/// An address with its prefix length, as put on an interface
/// (`10.1.0.1/24`: host bits are kept, unlike a [`Prefix`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IfAddr {
    /// The address.
    pub addr: IpAddr,
    /// Prefix length of the on-link network.
    pub prefix_len: u8,
}

impl IfAddr {
    /// The on-link network.
    pub fn network(&self) -> Prefix {
        Prefix::new(self.addr, self.prefix_len).unwrap_or_else(|| Prefix::host(self.addr))
    }
}

impl fmt::Display for IfAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// How a connection's IPsec packets travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encapsulation {
    /// ESP in UDP (RFC 3948) from `gateway.listen` to `remote_port`.
    Udp,
    /// Raw ESP/AH (IP protocol 50/51) on a raw IP socket.
    None,
}

impl Encapsulation {
    /// The keyword in the file.
    pub fn name(self) -> &'static str {
        match self {
            Encapsulation::Udp => "udp",
            Encapsulation::None => "none",
        }
    }
}

/// The IPsec protocols a connection applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Protocols {
    /// ESP only.
    #[serde(rename = "esp")]
    Esp,
    /// AH only.
    #[serde(rename = "ah")]
    Ah,
    /// ESP inside AH (AH in transport mode over the ESP packet).
    #[serde(rename = "esp+ah")]
    EspAh,
}

impl Protocols {
    /// True when ESP is applied.
    pub fn has_esp(self) -> bool {
        matches!(self, Protocols::Esp | Protocols::EspAh)
    }
    /// True when AH is applied.
    pub fn has_ah(self) -> bool {
        matches!(self, Protocols::Ah | Protocols::EspAh)
    }
    /// The keyword in the file.
    pub fn name(self) -> &'static str {
        match self {
            Protocols::Esp => "esp",
            Protocols::Ah => "ah",
            Protocols::EspAh => "esp+ah",
        }
    }
}

/// IP protocol restriction of a connection's traffic selectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpProto {
    /// Any protocol.
    Any,
    /// ICMP for IPv4 selectors, ICMPv6 for IPv6 selectors.
    Icmp,
    /// One protocol number.
    Number(u8),
}

impl IpProto {
    /// The protocol number for selectors of one family (`None`: any).
    pub fn for_family(self, v6: bool) -> Option<u8> {
        match self {
            IpProto::Any => None,
            IpProto::Icmp if v6 => Some(proto::ICMPV6),
            IpProto::Icmp => Some(proto::ICMP),
            IpProto::Number(n) => Some(n),
        }
    }
}

/// TCP MSS clamping on SYNs entering the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MssClamp {
    /// Derived from the tunnel MTU (outer MTU minus the SA overhead).
    Auto,
    /// No clamping.
    Off,
    /// This MSS.
    Fixed(u16),
}

/// DSCP handling on encapsulation (RFC 4301 §5.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dscp {
    /// Copy the inner DSCP to the outer header.
    Copy,
    /// Outer DSCP 0.
    Clear,
}

/// ECN handling (RFC 6040).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ecn {
    /// RFC 6040 normal mode, the only one implemented.
    Normal,
}

/// Log verbosity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// The default.
    Info,
    /// Verbose.
    Debug,
    /// Very verbose.
    Trace,
}

impl LogLevel {
    /// The level's name, as `tracing_subscriber` filters take it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// One manually keyed SA pair (`[connection.esp]` or `[connection.ah]`).
#[derive(Clone)]
pub struct ManualSa {
    /// Algorithms.
    pub suite: Suite,
    /// SPI of the SA we receive on.
    pub spi_in: u32,
    /// SPI of the SA we send on.
    pub spi_out: u32,
    /// Inbound encryption key (with the salt for combined modes).
    pub enc_in: Zeroizing<Vec<u8>>,
    /// Outbound encryption key.
    pub enc_out: Zeroizing<Vec<u8>>,
    /// Inbound integrity key.
    pub integ_in: Zeroizing<Vec<u8>>,
    /// Outbound integrity key.
    pub integ_out: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for ManualSa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualSa")
            .field("suite", &self.suite.name())
            .field("spi_in", &format_args!("{:#010x}", self.spi_in))
            .field("spi_out", &format_args!("{:#010x}", self.spi_out))
            .field("keys", &"<redacted>")
            .finish()
    }
}

/// One `[[connection]]`: a peer and the SAs to it.
#[derive(Debug, Clone)]
pub struct Connection {
    /// Unique name.
    pub name: String,
    /// Our outer address.
    pub local: IpAddr,
    /// The peer's outer address.
    pub remote: IpAddr,
    /// UDP source port of outbound ESP-in-UDP: the port of `gateway.listen`.
    pub local_port: u16,
    /// UDP destination port of outbound ESP-in-UDP.
    pub remote_port: u16,
    /// Tunnel or transport.
    pub mode: Mode,
    /// ESP, AH or ESP inside AH.
    pub protocol: Protocols,
    /// UDP or raw.
    pub encap: Encapsulation,
    /// Our side's selectors (defaults to `local/32` in transport mode).
    pub local_ts: Vec<Prefix>,
    /// The peer side's selectors (defaults to `remote/32` in transport mode).
    pub remote_ts: Vec<Prefix>,
    /// IP protocol restriction.
    pub proto: IpProto,
    /// Install routes for `remote_ts` through the TUN.
    pub routes: bool,
    /// TCP MSS clamping.
    pub mss_clamp: MssClamp,
    /// Fragment inner packets without DF before encryption.
    pub fragment_inner: bool,
    /// DSCP copy or clear.
    pub dscp: Dscp,
    /// ECN mode.
    pub ecn: Ecn,
    /// 64-bit extended sequence numbers.
    pub esn: bool,
    /// Replay window in packets; 0 disables the check.
    pub replay_window: u32,
    /// RFC 3948 NAT keepalive: send 0xFF after this long without sending
    /// to the peer (UDP encapsulation only); zero: never.
    pub nat_keepalive: std::time::Duration,
    /// Legacy suites allowed.
    pub allow_insecure: bool,
    /// TFC padding target (tunnel-mode ESP).
    pub tfc_pad_to: Option<u16>,
    /// Per-CPU SAs (the RFC 9611 idea, manually keyed): this many ESP SA
    /// pairs with identical selectors; pair `k` has the SPIs `spi_in + k`,
    /// `spi_out + k` and keys derived from the configured ones
    /// ([`per_cpu_key`]). Worker `w` sends on pair `w % per_cpu_sas`; the
    /// receiver's sockets steer each SPI to one worker. 1: plain.
    pub per_cpu_sas: u32,
    /// SA lifetime limits.
    pub lifetime: Lifetime,
    /// The ESP SA pair, when `protocol` includes ESP.
    pub esp: Option<ManualSa>,
    /// The AH SA pair, when `protocol` includes AH.
    pub ah: Option<ManualSa>,
    /// IKEv2 settings (`[connection.ike]`): the SAs are negotiated, not
    /// configured, so `esp` and `ah` are `None` and [`Connection::sa_configs`]
    /// is empty until IKE installs SAs. See [`crate::ike`].
    pub ike: Option<IkeSettings>,
}

/// The key of per-CPU SA `k` made from a configured key: `k = 0` is the
/// key itself; otherwise HMAC-SHA256(key, "espgate per-CPU SA" || k as
/// 4 bytes || block counter as 1 byte) blocks, cut to the key's length.
/// Both espgate peers derive the same keys; every pair has its own, so no
/// two SAs share a key (and so never a nonce).
pub fn per_cpu_key(key: &[u8], k: u32) -> Zeroizing<Vec<u8>> {
    if k == 0 || key.is_empty() {
        return Zeroizing::new(key.to_vec());
    }
    let hk = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
    let mut out = Zeroizing::new(Vec::with_capacity(key.len() + 32));
    let mut block = 1u8;
    while out.len() < key.len() {
        let mut ctx = aws_lc_rs::hmac::Context::with_key(&hk);
        ctx.update(b"espgate per-CPU SA");
        ctx.update(&k.to_be_bytes());
        ctx.update(&[block]);
        out.extend_from_slice(ctx.sign().as_ref());
        block = block.wrapping_add(1);
    }
    out.truncate(key.len());
    out
}

/// A connection's SAs, ready for [`Sa::new`].
#[derive(Debug, Clone)]
pub struct ConnectionSas {
    /// SAs we receive on (ESP first, then AH; the SAD finds them by SPI).
    pub inbound: Vec<SaConfig>,
    /// SAs we send on, in bundle order: ESP first, then AH (outermost).
    pub outbound: Vec<SaConfig>,
}

impl Connection {
    /// Selectors: every same-family pair of `local_ts` × `remote_ts`, with
    /// `proto` (ICMP resolved per family) and any ports.
    pub fn selectors(&self) -> Vec<TrafficSelector> {
        let mut out = Vec::new();
        for l in &self.local_ts {
            for r in &self.remote_ts {
                let v6 = l.addr().is_ipv6();
                if v6 != r.addr().is_ipv6() {
                    continue;
                }
                out.push(TrafficSelector {
                    local: *l,
                    remote: *r,
                    proto: self.proto.for_family(v6),
                    local_ports: PortRange::ANY,
                    remote_ports: PortRange::ANY,
                });
            }
        }
        out
    }

    /// The connection's SAs. For `esp+ah` the ESP SA has the connection's
    /// mode and the AH SA is in transport mode over the ESP packet.
    pub fn sa_configs(&self) -> ConnectionSas {
        let mut inbound = Vec::new();
        let mut outbound = Vec::new();
        let pairs = [
            (Protocol::Esp, self.esp.as_ref()),
            (Protocol::Ah, self.ah.as_ref()),
        ];
        for (protocol, sa) in pairs {
            let Some(sa) = sa else { continue };
            // The inner layer of a bundle carries the mode; AH over ESP is
            // transport mode on the ESP packet.
            let mode = if protocol == Protocol::Ah && self.protocol == Protocols::EspAh {
                Mode::Transport
            } else {
                self.mode
            };
            let copies = if protocol == Protocol::Esp {
                self.per_cpu_sas.max(1)
            } else {
                1
            };
            for (k, outbound_dir) in (0..copies).flat_map(|k| [(k, false), (k, true)]) {
                let (spi, enc, integ) = if outbound_dir {
                    (sa.spi_out, &sa.enc_out, &sa.integ_out)
                } else {
                    (sa.spi_in, &sa.enc_in, &sa.integ_in)
                };
                let spi = spi.wrapping_add(k);
                let (enc, integ) = (per_cpu_key(enc, k), per_cpu_key(integ, k));
                let mut c = SaConfig::new(spi, protocol, sa.suite, &enc, &integ);
                self.shape_sa(
                    &mut c,
                    mode,
                    outbound_dir,
                    (self.local_port, self.remote_port),
                );
                if outbound_dir {
                    outbound.push(c);
                } else {
                    inbound.push(c);
                }
            }
        }
        ConnectionSas { inbound, outbound }
    }

    /// Gives an SA of this connection its connection-wide settings: `mode`,
    /// UDP encapsulation with `(our port, the peer's port)` (or raw),
    /// tunnel addresses, ESN, replay window, lifetime, selectors, legacy
    /// suites, TFC padding (ESP) and DSCP copying. `outbound`: the SA we
    /// send on; inbound SAs see the peer's port and address as the source.
    pub fn shape_sa(
        &self,
        c: &mut SaConfig,
        mode: Mode,
        outbound: bool,
        (ours, theirs): (u16, u16),
    ) {
        c.mode = mode;
        c.encap = match self.encap {
            Encapsulation::None => Encap::None,
            Encapsulation::Udp if outbound => Encap::Udp {
                src_port: ours,
                dst_port: theirs,
            },
            Encapsulation::Udp => Encap::Udp {
                src_port: theirs,
                dst_port: ours,
            },
        };
        if mode == Mode::Tunnel {
            let (s, d) = if outbound {
                (self.local, self.remote)
            } else {
                (self.remote, self.local)
            };
            c.tunnel_src = Some(s);
            c.tunnel_dst = Some(d);
        }
        c.esn = self.esn;
        c.replay_window = self.replay_window;
        c.lifetime = self.lifetime;
        c.selectors = self.selectors();
        c.allow_insecure = self.allow_insecure;
        c.tfc_pad_to = if c.protocol == Protocol::Esp {
            self.tfc_pad_to
        } else {
            None
        };
        c.copy_dscp = self.dscp == Dscp::Copy;
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// TOML key path such as `connection[1].esp.enc_in` (empty for the
    /// whole file).
    pub path: String,
    /// Name of the connection the path is in, when known.
    pub connection: Option<String>,
    /// 1-based line and column, when the position is known.
    pub position: Option<(usize, usize)>,
    /// What is wrong.
    pub message: String,
}

impl Diagnostic {
    fn render(&self, file: &str) -> String {
        let mut s = file.to_string();
        if let Some((l, c)) = self.position {
            s.push_str(&format!(":{l}:{c}"));
        }
        s.push_str(": ");
        if !self.path.is_empty() {
            s.push_str(&self.path);
            if let Some(n) = &self.connection {
                s.push_str(&format!(" (connection \"{n}\")"));
            }
            s.push_str(": ");
        }
        s.push_str(&self.message);
        s
    }
}

/// Why a configuration was refused: every problem found (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file name used in messages.
    pub file: String,
    /// The problems, in file order where known.
    pub diagnostics: Vec<Diagnostic>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.diagnostics.len();
        if n > 1 {
            writeln!(f, "{n} errors in {}:", self.file)?;
        }
        for (i, d) in self.diagnostics.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            f.write_str(&d.render(&self.file))?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    fn whole_file(file: &str, message: String) -> ConfigError {
        ConfigError {
            file: file.to_string(),
            diagnostics: vec![Diagnostic {
                path: String::new(),
                connection: None,
                position: None,
                message,
            }],
        }
    }
}

// ---------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------

/// Reads and validates a configuration file. Key files are resolved
/// against the file's directory.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let name = path.display().to_string();
    let text = read_secret_text(path, MAX_CONFIG_BYTES)
        .map_err(|e| ConfigError::whole_file(&name, format!("cannot read the file: {e}")))?;
    let base = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let (mut cfg, inline_keys) = parse_inner(&text, base, &name)?;
    if inline_keys {
        if let Some(mode) = group_other_readable(path) {
            cfg.warnings.push(format!(
                "{name}: the file holds inline keys and is readable by group/others \
                 (mode {mode:04o}); chmod 600 it, or move the keys to key files"
            ));
        }
    }
    Ok(cfg)
}

/// Parses and validates configuration text. `base_dir` resolves relative
/// key-file and socket paths; `name` is the file name shown in messages.
pub fn parse(text: &str, base_dir: &Path, name: &str) -> Result<LoadedConfig, ConfigError> {
    parse_inner(text, base_dir, name).map(|(c, _)| c)
}

fn parse_inner(
    text: &str,
    base_dir: &Path,
    name: &str,
) -> Result<(LoadedConfig, bool), ConfigError> {
    let doc = DeTable::parse(text).map_err(|e| ConfigError {
        file: name.to_string(),
        diagnostics: vec![Diagnostic {
            path: String::new(),
            connection: None,
            position: e.span().map(|s| line_col(text, s.start)),
            message: format!("TOML syntax: {}", e.message().trim_end()),
        }],
    })?;
    let locator = Locator { text, doc: &doc };
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        let path = e
            .span()
            .map(|s| locator.path_at(s.start))
            .unwrap_or_default();
        let connection = locator.connection_name(&path);
        ConfigError {
            file: name.to_string(),
            diagnostics: vec![Diagnostic {
                path: fmt_path(&path),
                connection,
                position: e.span().map(|s| line_col(text, s.start)),
                message: friendly_serde_message(e.message()),
            }],
        }
    })?;
    let mut v = Validator {
        base_dir,
        issues: Vec::new(),
        warnings: Vec::new(),
        inline_keys: false,
    };
    let result = v.file(raw);
    let render = |issues: Vec<Issue>| -> Vec<Diagnostic> {
        let mut d: Vec<(usize, Diagnostic)> = issues
            .into_iter()
            .enumerate()
            .map(|(i, is)| {
                let connection = locator.connection_name(&is.path);
                let span = locator.span_of(&is.path);
                (
                    i,
                    Diagnostic {
                        path: fmt_path(&is.path),
                        connection,
                        position: span.map(|s| line_col(text, s.start)),
                        message: is.message,
                    },
                )
            })
            .collect();
        // File order where known, then discovery order.
        d.sort_by_key(|(i, d)| (d.position.unwrap_or((usize::MAX, 0)), *i));
        d.into_iter().map(|(_, d)| d).collect()
    };
    let warnings: Vec<String> = render(std::mem::take(&mut v.warnings))
        .into_iter()
        .map(|d| d.render(name))
        .collect();
    if !v.issues.is_empty() {
        return Err(ConfigError {
            file: name.to_string(),
            diagnostics: render(v.issues),
        });
    }
    let (gateway, connections) = result.expect("no issues means a result");
    Ok((
        LoadedConfig {
            source: name.to_string(),
            gateway,
            connections,
            warnings,
        },
        v.inline_keys,
    ))
}

// ---------------------------------------------------------------------------
// Key paths and positions
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

type KeyPath = Vec<Seg>;

fn fmt_path(p: &[Seg]) -> String {
    let mut s = String::new();
    for seg in p {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                let bare = !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if bare {
                    s.push_str(k);
                } else {
                    s.push_str(&format!("{k:?}"));
                }
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let mut pos = pos.min(text.len());
    while !text.is_char_boundary(pos) {
        pos -= 1;
    }
    let before = &text[..pos];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, text[line_start..pos].chars().count() + 1)
}

/// Maps key paths to positions and back, over the spanned parse of the text.
struct Locator<'a, 'i> {
    text: &'a str,
    doc: &'a Spanned<DeTable<'i>>,
}

impl Locator<'_, '_> {
    /// The span of the value at `path`, or of its deepest existing ancestor.
    fn span_of(&self, path: &[Seg]) -> Option<Range<usize>> {
        let mut table = Some(self.doc.get_ref());
        let mut array: Option<&[Spanned<DeValue>]> = None;
        let mut best = None;
        for seg in path {
            let v: &Spanned<DeValue> = match (seg, table, array) {
                (Seg::Key(k), Some(t), _) => {
                    match t
                        .iter()
                        .find(|(key, _)| key.get_ref().as_ref() == k.as_str())
                    {
                        Some((_, v)) => v,
                        None => break,
                    }
                }
                (Seg::Index(i), _, Some(a)) => match a.get(*i) {
                    Some(v) => v,
                    None => break,
                },
                _ => break,
            };
            best = Some(self.useful_span(v));
            table = v.get_ref().as_table();
            array = v.get_ref().as_array().map(|a| &a[..]);
        }
        best
    }

    /// A table's span can be empty (tables made by headers); fall back to
    /// its first key.
    fn useful_span(&self, v: &Spanned<DeValue>) -> Range<usize> {
        let s = v.span();
        if s.start < s.end && s.end <= self.text.len() {
            return s;
        }
        if let Some(t) = v.get_ref().as_table() {
            if let Some(min) = t.iter().map(|(k, _)| k.span().start).min() {
                return min..min;
            }
        }
        s
    }

    /// The path of the smallest key or value around byte `pos`.
    fn path_at(&self, pos: usize) -> KeyPath {
        let mut best: Option<(usize, KeyPath)> = None;
        let mut path = Vec::new();
        walk_table(self.doc.get_ref(), pos, &mut path, &mut best);
        best.map(|(_, p)| p).unwrap_or_default()
    }

    /// The `name` of the connection a path is in.
    fn connection_name(&self, path: &[Seg]) -> Option<String> {
        match path {
            [Seg::Key(c), Seg::Index(i), ..] if c == "connection" => {
                let v = self.doc.get_ref().get("connection")?;
                let t = v.get_ref().as_array()?.get(*i)?.get_ref().as_table()?;
                Some(t.get("name")?.get_ref().as_str()?.to_string())
            }
            _ => None,
        }
    }
}

fn consider(best: &mut Option<(usize, KeyPath)>, span: Range<usize>, pos: usize, path: &[Seg]) {
    let inside = span.start <= pos && (pos < span.end || span.start == pos);
    if inside {
        let len = span.end - span.start;
        if best.as_ref().is_none_or(|(l, _)| len <= *l) {
            *best = Some((len, path.to_vec()));
        }
    }
}

fn walk_table(t: &DeTable, pos: usize, path: &mut KeyPath, best: &mut Option<(usize, KeyPath)>) {
    for (k, v) in t.iter() {
        path.push(Seg::Key(k.get_ref().to_string()));
        consider(best, k.span(), pos, path);
        walk_value(v, pos, path, best);
        path.pop();
    }
}

fn walk_value(
    v: &Spanned<DeValue>,
    pos: usize,
    path: &mut KeyPath,
    best: &mut Option<(usize, KeyPath)>,
) {
    let s = v.span();
    if s.start < s.end {
        consider(best, s, pos, path);
    }
    match v.get_ref() {
        DeValue::Table(t) => walk_table(t, pos, path, best),
        DeValue::Array(a) => {
            for (i, item) in a.iter().enumerate() {
                path.push(Seg::Index(i));
                walk_value(item, pos, path, best);
                path.pop();
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------
// Raw (serde) structures
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    gateway: Option<RawGateway>,
    #[serde(default)]
    connection: Vec<RawConnection>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGateway {
    tun: Option<String>,
    tun_address: Option<Vec<String>>,
    listen: Option<String>,
    encap: Option<Encapsulation>,
    workers: Option<i64>,
    mtu: Option<i64>,
    control_socket: Option<String>,
    metrics: Option<String>,
    log: Option<LogLevel>,
    fwmark: Option<i64>,
    state_dir: Option<String>,
    offloads: Option<bool>,
    cost_accounting: Option<bool>,
    batch: Option<i64>,
    ike_fragment_size: Option<i64>,
    socket_buffer: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConnection {
    name: String,
    local: String,
    remote: String,
    remote_port: Option<i64>,
    mode: Option<ModeName>,
    protocol: Option<Protocols>,
    encap: Option<Encapsulation>,
    local_ts: Option<Vec<String>>,
    remote_ts: Option<Vec<String>>,
    proto: Option<Scalar>,
    routes: Option<bool>,
    mss_clamp: Option<Scalar>,
    fragment_inner: Option<bool>,
    dscp: Option<Dscp>,
    ecn: Option<String>,
    esn: Option<bool>,
    replay_window: Option<i64>,
    nat_keepalive: Option<i64>,
    allow_insecure: Option<bool>,
    tfc_pad_to: Option<i64>,
    per_cpu_sas: Option<i64>,
    lifetime: Option<RawLifetime>,
    esp: Option<RawSa>,
    ah: Option<RawSa>,
    ike: Option<RawIke>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIke {
    proposals: Option<Vec<String>>,
    esp_proposals: Option<Vec<String>>,
    local_id: Option<String>,
    remote_id: Option<String>,
    auth: Option<AuthMethod>,
    remote_auth: Option<AuthMethod>,
    psk_file: Option<String>,
    private_key: Option<String>,
    cert: Option<String>,
    ca: Option<String>,
    remote_public_key: Option<String>,
    start_action: Option<StartAction>,
    rekey_time: Option<Scalar>,
    child_rekey_time: Option<Scalar>,
    child_life_time: Option<Scalar>,
    jitter: Option<Scalar>,
    dpd_delay: Option<Scalar>,
    dpd_action: Option<DpdActionName>,
    retransmit_timeout: Option<Scalar>,
    retransmit_tries: Option<i64>,
    force_encap: Option<bool>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum DpdActionName {
    Clear,
    Restart,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum ModeName {
    Tunnel,
    Transport,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLifetime {
    soft_bytes: Option<Scalar>,
    hard_bytes: Option<Scalar>,
    soft_packets: Option<Scalar>,
    hard_packets: Option<Scalar>,
    soft_time: Option<Scalar>,
    hard_time: Option<Scalar>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSa {
    suite: String,
    spi_in: Scalar,
    spi_out: Scalar,
    enc_in: Option<SecretHex>,
    enc_out: Option<SecretHex>,
    integ_in: Option<SecretHex>,
    integ_out: Option<SecretHex>,
    enc_in_file: Option<String>,
    enc_out_file: Option<String>,
    integ_in_file: Option<String>,
    integ_out_file: Option<String>,
}

/// An integer or a string (sizes, durations, protocols, SPIs).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scalar {
    Int(i64),
    Str(String),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(n) => write!(f, "{n}"),
            Scalar::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer or a string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                i64::try_from(v)
                    .map(Scalar::Int)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A key as hex text, wiped on drop. Its deserializer never echoes the value.
struct SecretHex(Zeroizing<String>);

impl<'de> Deserialize<'de> for SecretHex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const WANT: &str = "a key must be a string of hex digits in quotes";
        impl Visitor<'_> for V {
            type Value = SecretHex;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string of hex digits")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SecretHex, E> {
                let mut s = Zeroizing::new(String::with_capacity(v.len()));
                s.push_str(v);
                Ok(SecretHex(s))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<SecretHex, E> {
                Ok(SecretHex(Zeroizing::new(v)))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<SecretHex, E> {
                Err(E::custom(WANT))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<SecretHex, E> {
                Err(E::custom(WANT))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<SecretHex, E> {
                Err(E::custom(WANT))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<SecretHex, E> {
                Err(E::custom(WANT))
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------
// Value parsers (each returns a message without the key path)
// ---------------------------------------------------------------------------

/// Parses a size: an integer, or a string with an optional K, M, G or T
/// suffix (1024-based, optionally followed by `B` or `iB`). 0 is `None`
/// (unlimited).
fn parse_size(v: &Scalar) -> Result<Option<u64>, String> {
    const HELP: &str = "expected a count such as 1000000, or a string with a K, M, G or T \
                        suffix (1024-based) such as \"512M\" or \"1G\"";
    let n = match v {
        Scalar::Int(n) => u64::try_from(*n).map_err(|_| format!("{n} is negative"))?,
        Scalar::Str(s) => {
            let t = s.trim();
            let digits = t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let (num, unit) = t.split_at(digits);
            if num.is_empty() {
                return Err(format!("{v} is not a size: {HELP}"));
            }
            let unit = unit.trim_start();
            let unit = unit
                .strip_suffix("iB")
                .or_else(|| unit.strip_suffix('B'))
                .unwrap_or(unit);
            let mult: u64 = match unit {
                "" => 1,
                "k" | "K" => 1 << 10,
                "m" | "M" => 1 << 20,
                "g" | "G" => 1 << 30,
                "t" | "T" => 1 << 40,
                _ => return Err(format!("{v} is not a size: {HELP}")),
            };
            num.parse::<u64>()
                .ok()
                .and_then(|n| n.checked_mul(mult))
                .ok_or_else(|| format!("{v} is too large"))?
        }
    };
    Ok((n > 0).then_some(n))
}

/// Parses a duration: an integer number of seconds, or a string of
/// number+unit parts (`s`, `m`, `h`, `d`) such as `"90s"` or `"1h30m"`.
/// 0 is `None` (unlimited).
fn parse_duration(v: &Scalar) -> Result<Option<Duration>, String> {
    const HELP: &str = "expected seconds, or a string such as \"90s\", \"50m\", \"1h\", \"1d\" \
                        or \"1h30m\"";
    let secs = match v {
        Scalar::Int(n) => u64::try_from(*n).map_err(|_| format!("{n} is negative"))?,
        Scalar::Str(s) => {
            let mut rest = s.trim();
            if rest.is_empty() {
                return Err(format!("{v} is not a duration: {HELP}"));
            }
            let mut total: u64 = 0;
            while !rest.is_empty() {
                let digits =
                    rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                if digits == 0 {
                    return Err(format!("{v} is not a duration: {HELP}"));
                }
                let n: u64 = rest[..digits]
                    .parse()
                    .map_err(|_| format!("{v} is too large"))?;
                rest = &rest[digits..];
                let unit = rest.chars().next();
                let mult = match unit {
                    Some('s') => 1,
                    Some('m') => 60,
                    Some('h') => 3600,
                    Some('d') => 86400,
                    // A bare number is seconds, only as the whole string.
                    None if total == 0 => 1,
                    _ => return Err(format!("{v} is not a duration: {HELP}")),
                };
                rest = unit.map_or(rest, |u| &rest[u.len_utf8()..]).trim_start();
                total = n
                    .checked_mul(mult)
                    .and_then(|x| total.checked_add(x))
                    .ok_or_else(|| format!("{v} is too large"))?;
            }
            total
        }
    };
    Ok((secs > 0).then(|| Duration::from_secs(secs)))
}

/// Parses an integer given as a TOML integer or a decimal / `0x` hex string.
fn parse_int(v: &Scalar) -> Result<i64, String> {
    match v {
        Scalar::Int(n) => Ok(*n),
        Scalar::Str(s) => {
            let t = s.trim();
            let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(h) => i64::from_str_radix(h, 16),
                None => t.parse(),
            };
            r.map_err(|_| format!("{v} is not a number"))
        }
    }
}

fn parse_spi(v: &Scalar) -> Result<u32, String> {
    let n = parse_int(v)?;
    let spi = u32::try_from(n).map_err(|_| format!("{v} does not fit in 32 bits"))?;
    if spi < 256 {
        return Err(format!(
            "SPI {spi:#x} is reserved: SPIs 1-255 are reserved and 0 is invalid \
             (RFC 4301 §4.1); use 256 (0x100) or above"
        ));
    }
    Ok(spi)
}

fn parse_proto(v: &Scalar) -> Result<IpProto, String> {
    const HELP: &str = "expected \"any\", \"tcp\", \"udp\", \"icmp\", \"icmpv6\", \"sctp\" \
                        or a protocol number 1-255";
    let n = match v {
        Scalar::Str(s) => match s.trim().to_ascii_lowercase().as_str() {
            "any" => return Ok(IpProto::Any),
            "icmp" => return Ok(IpProto::Icmp),
            "tcp" => proto::TCP,
            "udp" => proto::UDP,
            "icmpv6" | "ipv6-icmp" => proto::ICMPV6,
            "sctp" => proto::SCTP,
            other => match other.parse::<u8>() {
                Ok(n) => n,
                Err(_) => return Err(format!("{v}: {HELP}")),
            },
        },
        Scalar::Int(n) => u8::try_from(*n).map_err(|_| format!("{n}: {HELP}"))?,
    };
    if n == 0 {
        return Err(format!("0: {HELP} (write \"any\" for any protocol)"));
    }
    Ok(IpProto::Number(n))
}

fn parse_mss(v: &Scalar) -> Result<MssClamp, String> {
    const HELP: &str = "expected \"auto\", \"off\" or an MSS in bytes (for example 1360)";
    let n = match v {
        Scalar::Str(s) => match s.trim() {
            "auto" => return Ok(MssClamp::Auto),
            "off" => return Ok(MssClamp::Off),
            t => t.parse::<i64>().map_err(|_| format!("{v}: {HELP}"))?,
        },
        Scalar::Int(n) => *n,
    };
    match u16::try_from(n) {
        Ok(m) if (88..=65495).contains(&m) => Ok(MssClamp::Fixed(m)),
        _ => Err(format!("{n} is not a usable MSS (88-65495): {HELP}")),
    }
}

fn parse_ifaddr(s: &str) -> Result<IfAddr, String> {
    let (a, l) = match s.trim().split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s.trim(), None),
    };
    let addr: IpAddr = a.parse().map_err(|_| {
        format!("\"{s}\" is not an address with a prefix length like \"10.1.0.1/24\"")
    })?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix_len = match l {
        None => max,
        Some(l) => match l.parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => return Err(format!("\"{s}\": prefix length must be 0-{max}")),
        },
    };
    Ok(IfAddr { addr, prefix_len })
}

fn parse_socket_addr(s: &str, example: &str) -> Result<SocketAddr, String> {
    s.trim().parse().map_err(|_| {
        format!(
            "\"{s}\" is not an address:port like \"{example}\" (IPv6 in brackets: \"[::]:4500\")"
        )
    })
}

/// Decodes hex, skipping whitespace; an optional `0x` prefix is allowed.
/// Messages never quote the input.
fn decode_hex(s: &str) -> Result<Zeroizing<Vec<u8>>, String> {
    let t = s.trim_start();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    let digits = t.chars().filter(|c| !c.is_whitespace()).count();
    let mut out = Zeroizing::new(Vec::with_capacity(digits / 2));
    let mut hi: Option<u8> = None;
    for (i, c) in t.chars().filter(|c| !c.is_whitespace()).enumerate() {
        let Some(d) = c.to_digit(16) else {
            return Err(format!(
                "not hex: character {} is not a hex digit (0-9, a-f)",
                i + 1
            ));
        };
        match hi.take() {
            None => hi = Some(d as u8),
            Some(h) => out.push(h << 4 | d as u8),
        }
    }
    if hi.is_some() {
        return Err(format!("not hex: odd number of hex digits ({digits})"));
    }
    Ok(out)
}

/// Largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// Largest key file read.
const MAX_KEY_FILE_BYTES: u64 = 64 << 10;

/// Reads at most `max` bytes of a file into a buffer that is wiped on drop,
/// without reallocating it.
fn read_secret_text(path: &Path, max: u64) -> std::io::Result<Zeroizing<String>> {
    let f = std::fs::File::open(path)?;
    let len = f.metadata().map_or(0, |m| m.len()).min(max) as usize;
    let mut s = Zeroizing::new(String::with_capacity(len + 1));
    f.take(max + 1).read_to_string(&mut s)?;
    if s.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "larger than {max} bytes; is this the right file?"
        )));
    }
    Ok(s)
}

/// Default `[connection.ike]` `proposals`.
pub const DEFAULT_IKE_PROPOSALS: &[&str] =
    &["aes128gcm16-prfsha256-x25519", "aes256-sha256-modp2048"];
/// Default `[connection.ike]` `esp_proposals`.
pub const DEFAULT_ESP_PROPOSALS: &[&str] = &["aes128gcm16", "aes256-sha256"];
/// A pre-shared key shorter than this draws a warning.
const MIN_GOOD_PSK: usize = 20;
/// Largest certificate file read.
const MAX_CERT_FILE_BYTES: u64 = 1 << 20;

/// `%any` (any case): accept whatever identity the peer authenticates.
fn is_any_id(s: &str) -> bool {
    s.trim().eq_ignore_ascii_case("%any")
}

fn parse_identity(s: &str) -> Result<Identity, String> {
    Identity::parse(s).map_err(|e| {
        format!(
            "{s:?}: {e} (expected an address, an FQDN such as \"moon.example\", an email \
             address, a DN such as \"C=CH, O=Example, CN=moon\" or \"@#\" and a hex key id)"
        )
    })
}

fn address_identity(a: IpAddr) -> Identity {
    match a {
        IpAddr::V4(a) => Identity::Ipv4(a),
        IpAddr::V6(a) => Identity::Ipv6(a),
    }
}

/// A whole number of seconds the way durations are written (`"1h30m"`).
fn fmt_secs(mut s: u64) -> String {
    if s == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, n) in [("d", 86400), ("h", 3600), ("m", 60), ("s", 1)] {
        if s >= n {
            out.push_str(&format!("{}{unit}", s / n));
            s %= n;
        }
    }
    out
}

/// A PSK file's contents: `0x` and hex digits (whitespace ignored), or
/// else the bytes themselves, without one final newline (`\n` or `\r\n`).
/// Messages never quote the input.
fn parse_psk(raw: &[u8]) -> Result<Zeroizing<Vec<u8>>, String> {
    let mut t = raw;
    if let Some(rest) = t.strip_suffix(b"\n") {
        t = rest.strip_suffix(b"\r").unwrap_or(rest);
    }
    let psk = if t.starts_with(b"0x") || t.starts_with(b"0X") {
        let s = std::str::from_utf8(t).map_err(|_| {
            "starts with 0x but is not hex (a text key may not start with 0x)".to_string()
        })?;
        decode_hex(s).map_err(|e| format!("starts with 0x but is {e}"))?
    } else {
        Zeroizing::new(t.to_vec())
    };
    if psk.is_empty() {
        return Err("the pre-shared key is empty".into());
    }
    Ok(psk)
}

/// Reads at most `max` bytes of a file into a buffer that is wiped on drop
/// (sized from the file's length, so it is not reallocated), with the
/// permission bits of the file opened.
fn read_secret_bytes(path: &Path, max: u64) -> std::io::Result<(Zeroizing<Vec<u8>>, u32)> {
    let f = std::fs::File::open(path)?;
    let meta = f.metadata()?;
    if meta.is_dir() {
        return Err(std::io::Error::other("is a directory"));
    }
    #[cfg(unix)]
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
    #[cfg(not(unix))]
    let mode = 0;
    let len = meta.len().min(max) as usize;
    let mut buf = Zeroizing::new(Vec::with_capacity(len + 1));
    f.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "larger than {max} bytes; is this the right file?"
        )));
    }
    Ok((buf, mode))
}

/// The file's mode when group or others may read it.
#[cfg(unix)]
fn group_other_readable(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o7777;
    (mode & 0o044 != 0).then_some(mode)
}

#[cfg(not(unix))]
fn group_other_readable(_: &Path) -> Option<u32> {
    None
}

fn family(a: IpAddr) -> &'static str {
    if a.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

fn suite_kind_hint() -> &'static str {
    "for example aes128gcm16, aes256gcm16, chacha20poly1305, aes128-sha256, or null-sha256 \
     for integrity only"
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

struct Issue {
    path: KeyPath,
    message: String,
}

struct Validator<'a> {
    base_dir: &'a Path,
    issues: Vec<Issue>,
    warnings: Vec<Issue>,
    inline_keys: bool,
}

fn key(k: &str) -> Seg {
    Seg::Key(k.to_string())
}

fn at(base: &[Seg], rest: &[&str]) -> KeyPath {
    let mut p = base.to_vec();
    p.extend(rest.iter().map(|k| key(k)));
    p
}

fn conn_path(i: usize) -> KeyPath {
    vec![key("connection"), Seg::Index(i)]
}

impl Validator<'_> {
    fn err(&mut self, path: KeyPath, message: impl Into<String>) {
        self.issues.push(Issue {
            path,
            message: message.into(),
        });
    }

    fn warn(&mut self, path: KeyPath, message: impl Into<String>) {
        self.warnings.push(Issue {
            path,
            message: message.into(),
        });
    }

    /// Runs `r`, recording its error at `path`.
    fn check<T>(&mut self, path: KeyPath, r: Result<T, String>) -> Option<T> {
        r.map_err(|e| self.err(path, e)).ok()
    }

    fn file(&mut self, raw: RawFile) -> Option<(Gateway, Vec<Connection>)> {
        let gateway = self.gateway(raw.gateway.unwrap_or_default());
        let mut names: HashMap<String, usize> = HashMap::new();
        for (i, c) in raw.connection.iter().enumerate() {
            if let Some(first) = names.get(&c.name) {
                self.err(
                    at(&conn_path(i), &["name"]),
                    format!(
                        "duplicate connection name \"{}\" (also connection[{first}])",
                        c.name
                    ),
                );
            } else {
                names.insert(c.name.clone(), i);
            }
        }
        let mut conns = Vec::new();
        let mut all_ok = true;
        for (i, rc) in raw.connection.into_iter().enumerate() {
            match self.connection(i, rc, gateway.as_ref()) {
                Some(c) => conns.push((i, c)),
                None => all_ok = false,
            }
        }
        if conns.is_empty() && all_ok {
            self.warn(
                vec![],
                "no [[connection]]: the gateway will carry no traffic",
            );
        }
        if let Some(g) = &gateway {
            self.gateway_vs_connections(g, &conns);
        }
        self.across_connections(&conns);
        let gateway = gateway?;
        if !all_ok {
            return None;
        }
        Some((gateway, conns.into_iter().map(|(_, c)| c).collect()))
    }

    fn gateway(&mut self, g: RawGateway) -> Option<Gateway> {
        let before = self.issues.len();
        let base = vec![key("gateway")];
        let tun = g.tun.unwrap_or_else(|| "espgate0".to_string());
        if let Err(e) = check_ifname(&tun) {
            self.err(at(&base, &["tun"]), e);
        }
        let mut tun_address = Vec::new();
        for (i, a) in g.tun_address.unwrap_or_default().iter().enumerate() {
            let mut p = at(&base, &["tun_address"]);
            p.push(Seg::Index(i));
            if let Some(a) = self.check(p, parse_ifaddr(a)) {
                tun_address.push(a);
            }
        }
        let listen = match g.listen {
            None => Some(SocketAddr::from(([0, 0, 0, 0], 4500))),
            Some(s) => self.check(
                at(&base, &["listen"]),
                parse_socket_addr(&s, "0.0.0.0:4500"),
            ),
        };
        let workers = g.workers.unwrap_or(1);
        if !(0..=1024).contains(&workers) {
            self.err(
                at(&base, &["workers"]),
                format!("{workers} workers: expected 0 (one per CPU) to 1024"),
            );
        }
        let ike_fragment_size = g.ike_fragment_size.unwrap_or(1200);
        if !(300..=65000).contains(&ike_fragment_size) {
            self.err(
                at(&base, &["ike_fragment_size"]),
                format!("ike_fragment_size = {ike_fragment_size}: expected 300 to 65000 bytes"),
            );
        }
        let batch = g.batch.unwrap_or(64);
        if !(1..=64).contains(&batch) {
            self.err(
                at(&base, &["batch"]),
                format!("batch = {batch}: expected 1 to 64 packets"),
            );
        }
        let socket_buffer = g.socket_buffer.unwrap_or(4 << 20);
        if !(4096..=(1 << 30)).contains(&socket_buffer) {
            self.err(
                at(&base, &["socket_buffer"]),
                format!("socket_buffer = {socket_buffer}: expected 4096 to 1073741824 bytes"),
            );
        }
        let mtu = g.mtu.unwrap_or(1500);
        if !(576..=65535).contains(&mtu) {
            self.err(
                at(&base, &["mtu"]),
                format!("MTU {mtu} is out of range: expected 576-65535 (1280 or more with IPv6)"),
            );
        }
        let control_socket = g
            .control_socket
            .unwrap_or_else(|| "/run/espgate/espgate.sock".to_string());
        let control_socket = self.base_dir.join(&control_socket);
        if control_socket.as_os_str().len() > 107 {
            self.err(
                at(&base, &["control_socket"]),
                format!(
                    "{} is {} bytes long; a Unix socket path has at most 107",
                    control_socket.display(),
                    control_socket.as_os_str().len()
                ),
            );
        }
        let metrics = match g.metrics {
            None => Some(None),
            Some(s) => self
                .check(
                    at(&base, &["metrics"]),
                    parse_socket_addr(&s, "127.0.0.1:9184"),
                )
                .map(Some),
        };
        let fwmark = match g.fwmark {
            None => Some(None),
            Some(0) => {
                self.err(
                    at(&base, &["fwmark"]),
                    "0 means no mark: omit fwmark instead",
                );
                None
            }
            Some(n) => match u32::try_from(n) {
                Ok(m @ 252..=255) => {
                    self.err(
                        at(&base, &["fwmark"]),
                        format!(
                            "{m} is also the routing table for the daemon's routes, and tables \
                             252-255 are reserved (compat, default, main, local); pick another mark"
                        ),
                    );
                    None
                }
                Ok(m) => Some(Some(m)),
                Err(_) => {
                    self.err(
                        at(&base, &["fwmark"]),
                        format!("{n} does not fit in 32 bits"),
                    );
                    None
                }
            },
        };
        let state_dir = match g.state_dir.as_deref().map(str::trim) {
            None => Some(PathBuf::from("/var/lib/espgate")),
            Some("") => {
                self.err(
                    at(&base, &["state_dir"]),
                    "an empty path: omit state_dir for the default /var/lib/espgate",
                );
                None
            }
            Some(d) => {
                let dir = self.base_dir.join(d);
                match std::fs::metadata(&dir) {
                    Ok(m) if !m.is_dir() => {
                        self.err(
                            at(&base, &["state_dir"]),
                            format!("{} exists and is not a directory", dir.display()),
                        );
                        None
                    }
                    _ => Some(dir),
                }
            }
        };
        if self.issues.len() != before {
            return None;
        }
        Some(Gateway {
            tun,
            tun_address,
            listen: listen?,
            encap: g.encap.unwrap_or(Encapsulation::Udp),
            workers: workers as u32,
            mtu: mtu as u16,
            control_socket,
            metrics: metrics?,
            log: g.log.unwrap_or(LogLevel::Info),
            fwmark: fwmark?,
            state_dir: state_dir?,
            offloads: g.offloads.unwrap_or(true),
            cost_accounting: g.cost_accounting.unwrap_or(false),
            batch: batch.clamp(1, 64) as usize,
            ike_fragment_size: ike_fragment_size.clamp(300, 65000) as usize,
            socket_buffer: socket_buffer.clamp(4096, 1 << 30) as usize,
        })
    }

    fn connection(
        &mut self,
        i: usize,
        c: RawConnection,
        g: Option<&Gateway>,
    ) -> Option<Connection> {
        let before = self.issues.len();
        let base = conn_path(i);
        let p = |k: &str| at(&base, &[k]);

        if c.name.is_empty()
            || c.name.len() > 64
            || !c
                .name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
        {
            self.err(
                p("name"),
                format!(
                    "{:?} is not a valid name: use 1-64 of A-Z a-z 0-9 _ -",
                    c.name
                ),
            );
        }
        let local = self.check(p("local"), parse_outer_addr(&c.local));
        let remote = self.check(p("remote"), parse_outer_addr(&c.remote));
        if let (Some(l), Some(r)) = (local, remote) {
            if l.is_ipv4() != r.is_ipv4() {
                self.err(
                    p("remote"),
                    format!(
                        "remote {r} is {} but local {l} is {}: the outer addresses must be \
                         of one family (inner traffic may be of either)",
                        family(r),
                        family(l)
                    ),
                );
            } else if l == r {
                self.err(
                    p("remote"),
                    format!("remote is the same address as local ({l})"),
                );
            }
        }
        let remote_port = match c.remote_port {
            None => 4500,
            Some(n) => match u16::try_from(n) {
                Ok(port) if port != 0 => port,
                _ => {
                    self.err(p("remote_port"), format!("{n} is not a port (1-65535)"));
                    0
                }
            },
        };
        let mode = match c.mode.unwrap_or(ModeName::Tunnel) {
            ModeName::Tunnel => Mode::Tunnel,
            ModeName::Transport => Mode::Transport,
        };
        let protocol = c.protocol.unwrap_or(Protocols::Esp);
        let encap = match (c.encap, g) {
            (Some(e), _) => e,
            (None, Some(g)) => g.encap,
            (None, None) => Encapsulation::Udp,
        };
        if protocol.has_ah() && encap == Encapsulation::Udp {
            let how = if c.encap.is_some() {
                "encap = \"udp\""
            } else {
                "encap defaults to gateway.encap = \"udp\""
            };
            self.err(
                p("encap"),
                format!(
                    "protocol \"{}\" cannot be UDP-encapsulated (RFC 3948 covers ESP only) but \
                     {how}; set encap = \"none\" on this connection",
                    protocol.name()
                ),
            );
        }
        if c.fragment_inner == Some(false) && encap == Encapsulation::None {
            self.err(
                p("fragment_inner"),
                "fragment_inner = false lets the kernel fragment the outer packets, which it \
                 does for ESP-in-UDP only (raw ESP/AH is sent with IP_HDRINCL, never \
                 fragmented); set encap = \"udp\" or remove this key",
            );
        }
        if encap == Encapsulation::None && c.remote_port.is_some() {
            self.warn(
                p("remote_port"),
                "remote_port is ignored with encap = \"none\" (raw ESP/AH has no ports)",
            );
        }

        // Traffic selectors.
        let ts = |this: &mut Self, k: &str, list: &Option<Vec<String>>| -> Option<Vec<Prefix>> {
            let mut out = Vec::new();
            let mut ok = true;
            for (j, s) in list.iter().flatten().enumerate() {
                let mut path = p(k);
                path.push(Seg::Index(j));
                match s.trim().parse::<Prefix>() {
                    Ok(pf) => {
                        let given = s.trim().split_once('/').map(|(a, _)| a);
                        if given
                            .and_then(|a| a.parse::<IpAddr>().ok())
                            .is_some_and(|a| a != pf.addr())
                        {
                            this.warn(path, format!("\"{s}\" has host bits set; it means {pf}"));
                        }
                        out.push(pf);
                    }
                    Err(e) => {
                        this.err(
                            path,
                            format!("\"{s}\": {e}; expected a prefix like \"10.1.0.0/16\""),
                        );
                        ok = false;
                    }
                }
            }
            ok.then_some(out)
        };
        let local_ts = ts(self, "local_ts", &c.local_ts);
        let remote_ts = ts(self, "remote_ts", &c.remote_ts);
        let (local_ts, remote_ts) = match (local_ts, remote_ts) {
            (Some(l), Some(r)) => self.selectors(i, mode, local, remote, l, r, &c),
            _ => (Vec::new(), Vec::new()),
        };

        let proto = c.proto.as_ref().map_or(Some(IpProto::Any), |v| {
            self.check(p("proto"), parse_proto(v))
        });
        let mss_clamp = c.mss_clamp.as_ref().map_or(Some(MssClamp::Auto), |v| {
            self.check(p("mss_clamp"), parse_mss(v))
        });
        let ecn = match c.ecn.as_deref() {
            None | Some("normal") => Ecn::Normal,
            Some(other) => {
                self.err(
                    p("ecn"),
                    format!(
                        "{other:?}: only \"normal\" (RFC 6040 normal mode) is implemented; \
                         compatibility mode is not"
                    ),
                );
                Ecn::Normal
            }
        };
        let replay_window = c.replay_window.unwrap_or(1024);
        if !(0..=i64::from(MAX_WINDOW)).contains(&replay_window) {
            self.err(
                p("replay_window"),
                format!("{replay_window}: expected 0 (no replay check) to {MAX_WINDOW} packets"),
            );
        } else if replay_window == 0 {
            self.warn(
                p("replay_window"),
                "0 disables anti-replay protection: captured packets can be replayed",
            );
        }
        let nat_keepalive = c.nat_keepalive.unwrap_or(20);
        if !(0..=3600).contains(&nat_keepalive) {
            self.err(
                p("nat_keepalive"),
                format!("{nat_keepalive}: expected 0 (off) to 3600 seconds"),
            );
        } else if nat_keepalive != 0 && encap == Encapsulation::None && c.nat_keepalive.is_some() {
            self.warn(
                p("nat_keepalive"),
                "ignored with encap = \"none\": NAT keepalives are UDP (RFC 3948)",
            );
        }
        let tfc_pad_to = match c.tfc_pad_to {
            None | Some(0) => None,
            Some(n) => match u16::try_from(n) {
                Ok(t) if mode == Mode::Tunnel && protocol.has_esp() => Some(t),
                Ok(_) => {
                    self.err(
                        p("tfc_pad_to"),
                        "TFC padding needs ESP in tunnel mode (RFC 4303 §2.4)",
                    );
                    None
                }
                Err(_) => {
                    self.err(p("tfc_pad_to"), format!("{n}: expected 0-65535 bytes"));
                    None
                }
            },
        };
        let per_cpu_sas = match c.per_cpu_sas.unwrap_or(1) {
            n @ 1..=64 => {
                if n > 1 && (protocol != Protocols::Esp || encap != Encapsulation::Udp) {
                    self.err(
                        p("per_cpu_sas"),
                        "per-CPU SAs need protocol = \"esp\" and encap = \"udp\" (the receiver \
                         steers ESP-in-UDP to its workers by SPI)",
                    );
                }
                n as u32
            }
            n => {
                self.err(p("per_cpu_sas"), format!("{n}: expected 1 to 64 SA pairs"));
                1
            }
        };
        let lifetime = self.lifetime(&p("lifetime"), c.lifetime.unwrap_or_default());
        let allow_insecure = c.allow_insecure.unwrap_or(false);

        // IKE instead of manual SAs.
        let has_ike = c.ike.is_some();
        if has_ike {
            if protocol != Protocols::Esp {
                self.err(
                    p("protocol"),
                    format!(
                        "protocol = \"{}\" but [connection.ike] negotiates ESP SAs only; set \
                         protocol = \"esp\" (or remove it)",
                        protocol.name()
                    ),
                );
            }
            if c.esp.is_some() {
                self.err(
                    p("esp"),
                    "[connection.esp] (manual SAs) and [connection.ike] are both given: with \
                     IKE the ESP SAs are negotiated; keep one of the two tables",
                );
            }
            if per_cpu_sas > 1 {
                self.err(
                    p("per_cpu_sas"),
                    "per-CPU SAs are manually keyed only: with [connection.ike] set \
                     per_cpu_sas = 1 (or remove it)",
                );
            }
            if c.esn.is_some() {
                self.warn(
                    p("esn"),
                    "ignored with [connection.ike]: ESN is negotiated; offer it in \
                     esp_proposals (for example \"aes128gcm16-esn\")",
                );
            }
        }
        let ike = match c.ike {
            Some(r) => self.ike(&p("ike"), r, local, remote, encap),
            None => None,
        };

        // The manual SAs.
        let esp = match (protocol.has_esp(), c.esp) {
            // Both tables, or IKE: reported above; no manual SA.
            (_, Some(_)) | (true, None) if has_ike => None,
            (true, Some(r)) => self.manual_sa(&p("esp"), Protocol::Esp, r, allow_insecure),
            (true, None) => {
                self.err(
                    base.clone(),
                    format!(
                        "protocol = \"{}\" needs a [connection.esp] table with the manual SA \
                         (suite, spi_in, spi_out and keys)",
                        protocol.name()
                    ),
                );
                None
            }
            (false, Some(_)) => {
                self.err(
                    p("esp"),
                    format!(
                        "an ESP SA is given but protocol = \"{}\"; set protocol = \"esp\" or \
                         \"esp+ah\", or remove [connection.esp]",
                        protocol.name()
                    ),
                );
                None
            }
            (false, None) => None,
        };
        let ah = match (protocol.has_ah(), c.ah) {
            (true, Some(r)) => self.manual_sa(&p("ah"), Protocol::Ah, r, allow_insecure),
            // The protocol is refused above.
            (true, None) if has_ike => None,
            (true, None) => {
                self.err(
                    base.clone(),
                    format!(
                        "protocol = \"{}\" needs a [connection.ah] table with the manual SA \
                         (suite, spi_in, spi_out and integrity keys)",
                        protocol.name()
                    ),
                );
                None
            }
            (false, Some(_)) => {
                self.err(
                    p("ah"),
                    format!(
                        "an AH SA is given but protocol = \"{}\"; set protocol = \"ah\" or \
                         \"esp+ah\", or remove [connection.ah]",
                        protocol.name()
                    ),
                );
                None
            }
            (false, None) => None,
        };

        if self.issues.len() != before {
            return None;
        }
        if let Some(e) = esp.as_ref().filter(|_| per_cpu_sas > 1) {
            let (n, lo, hi) = (
                per_cpu_sas,
                e.spi_in.min(e.spi_out),
                e.spi_in.max(e.spi_out),
            );
            if hi - lo < n {
                self.err(
                    p("per_cpu_sas"),
                    format!(
                        "{n} per-CPU SA pairs use the SPIs spi_in .. spi_in+{m} and spi_out .. \
                         spi_out+{m}: these overlap; set spi_in and spi_out at least {n} apart",
                        m = n - 1
                    ),
                );
            }
        }
        let conn = Connection {
            name: c.name,
            local: local?,
            remote: remote?,
            local_port: g.map_or(4500, |g| g.listen.port()),
            remote_port,
            mode,
            protocol,
            encap,
            local_ts,
            remote_ts,
            proto: proto?,
            routes: c.routes.unwrap_or(true),
            mss_clamp: mss_clamp?,
            fragment_inner: c.fragment_inner.unwrap_or(true),
            dscp: c.dscp.unwrap_or(Dscp::Copy),
            ecn,
            esn: c.esn.unwrap_or(false),
            replay_window: replay_window as u32,
            nat_keepalive: std::time::Duration::from_secs(nat_keepalive.clamp(0, 3600) as u64),
            allow_insecure,
            tfc_pad_to,
            per_cpu_sas,
            lifetime: lifetime?,
            esp,
            ah,
            ike,
        };
        // Last line of defence: everything the core checks when installing.
        let sas = conn.sa_configs();
        for cfg in sas.outbound.iter().chain(&sas.inbound) {
            let which = p(cfg.protocol.name());
            let r = cfg
                .validate_outbound()
                .and_then(|_| Sa::new(cfg.clone(), Duration::ZERO).map(|_| ()));
            if let Err(e) = r {
                self.err(which, e.to_string());
                return None;
            }
        }
        Some(conn)
    }

    #[allow(clippy::too_many_arguments)]
    fn selectors(
        &mut self,
        i: usize,
        mode: Mode,
        local: Option<IpAddr>,
        remote: Option<IpAddr>,
        mut l: Vec<Prefix>,
        mut r: Vec<Prefix>,
        c: &RawConnection,
    ) -> (Vec<Prefix>, Vec<Prefix>) {
        let base = conn_path(i);
        let p = |k: &str| at(&base, &[k]);
        match mode {
            Mode::Tunnel => {
                for (k, list, side) in [
                    ("local_ts", &l, "the networks behind this gateway"),
                    ("remote_ts", &r, "the networks behind the peer"),
                ] {
                    if list.is_empty() {
                        self.err(
                            p(k),
                            format!(
                                "tunnel mode needs traffic selectors: set {k} to {side}, \
                                 for example {k} = [\"10.{}.0.0/16\"]",
                                if k == "local_ts" { 1 } else { 2 }
                            ),
                        );
                    }
                }
            }
            Mode::Transport => {
                // Transport mode protects the two hosts' own traffic.
                if c.local_ts.is_none() {
                    l.extend(local.map(Prefix::host));
                }
                if c.remote_ts.is_none() {
                    r.extend(remote.map(Prefix::host));
                }
                for (k, list, addr) in [("local_ts", &l, local), ("remote_ts", &r, remote)] {
                    let Some(a) = addr else { continue };
                    if list.is_empty() {
                        self.err(
                            p(k),
                            "an empty list selects no traffic; omit it for the default",
                        );
                        continue;
                    }
                    for (j, pf) in list.iter().enumerate() {
                        let mut path = p(k);
                        path.push(Seg::Index(j));
                        if pf.addr().is_ipv4() != a.is_ipv4() {
                            self.err(
                                path,
                                format!(
                                    "{pf} is {} but transport mode carries the hosts' own {} \
                                     packets (the addresses are not replaced)",
                                    family(pf.addr()),
                                    family(a)
                                ),
                            );
                        } else if !pf.contains(a) {
                            self.warn(
                                path,
                                format!(
                                    "{pf} does not contain {} {a}: transport mode only carries \
                                     that host's own packets",
                                    if k == "local_ts" { "local" } else { "remote" }
                                ),
                            );
                        }
                    }
                }
            }
        }
        // Every family on one side needs a partner on the other.
        for (k, mine, other, other_k) in [
            ("local_ts", &l, &r, "remote_ts"),
            ("remote_ts", &r, &l, "local_ts"),
        ] {
            if other.is_empty() {
                continue;
            }
            for (j, pf) in mine.iter().enumerate() {
                if !other
                    .iter()
                    .any(|o| o.addr().is_ipv4() == pf.addr().is_ipv4())
                {
                    let mut path = p(k);
                    path.push(Seg::Index(j));
                    self.err(
                        path,
                        format!(
                            "{pf} is {} but {other_k} has no {} prefix to pair it with",
                            family(pf.addr()),
                            family(pf.addr())
                        ),
                    );
                }
            }
        }
        (l, r)
    }

    fn lifetime(&mut self, base: &[Seg], raw: RawLifetime) -> Option<Lifetime> {
        let before = self.issues.len();
        let size = |this: &mut Self, k: &str, v: &Option<Scalar>| -> Option<u64> {
            v.as_ref()
                .and_then(|v| this.check(at(base, &[k]), parse_size(v)).flatten())
        };
        let soft_bytes = size(self, "soft_bytes", &raw.soft_bytes);
        let hard_bytes = size(self, "hard_bytes", &raw.hard_bytes);
        let soft_packets = size(self, "soft_packets", &raw.soft_packets);
        let hard_packets = size(self, "hard_packets", &raw.hard_packets);
        let time = |this: &mut Self, k: &str, v: &Option<Scalar>| -> Option<Duration> {
            v.as_ref()
                .and_then(|v| this.check(at(base, &[k]), parse_duration(v)).flatten())
        };
        let soft_time = time(self, "soft_time", &raw.soft_time);
        let hard_time = time(self, "hard_time", &raw.hard_time);
        let pairs = [
            (
                "soft_bytes",
                soft_bytes.map(u128::from),
                "hard_bytes",
                hard_bytes.map(u128::from),
            ),
            (
                "soft_packets",
                soft_packets.map(u128::from),
                "hard_packets",
                hard_packets.map(u128::from),
            ),
            (
                "soft_time",
                soft_time.map(|d| u128::from(d.as_secs())),
                "hard_time",
                hard_time.map(|d| u128::from(d.as_secs())),
            ),
        ];
        for (sk, s, hk, h) in pairs {
            if let (Some(s), Some(h)) = (s, h) {
                if s >= h {
                    self.err(
                        at(base, &[sk]),
                        format!(
                            "the soft limit ({s}) must be below the hard limit {hk} ({h}): \
                             it warns before the SA expires"
                        ),
                    );
                }
            }
        }
        (self.issues.len() == before).then_some(Lifetime {
            soft_bytes,
            hard_bytes,
            soft_packets,
            hard_packets,
            soft_time,
            hard_time,
        })
    }

    fn manual_sa(
        &mut self,
        base: &[Seg],
        protocol: Protocol,
        r: RawSa,
        allow_insecure: bool,
    ) -> Option<ManualSa> {
        let before = self.issues.len();
        let p = |k: &str| at(base, &[k]);
        let suite = match r.suite.parse::<Suite>() {
            Ok(s) => Some(s),
            Err(e) => {
                self.err(p("suite"), e.to_string());
                None
            }
        };
        if let Some(s) = suite {
            match protocol {
                Protocol::Esp if s.enc.is_none() => self.err(
                    p("suite"),
                    format!(
                        "\"{}\" is an integrity-only (AH) suite; ESP needs encryption, {}",
                        r.suite,
                        suite_kind_hint()
                    ),
                ),
                Protocol::Ah if s.enc.is_some() => self.err(
                    p("suite"),
                    format!(
                        "AH takes an integrity algorithm only (sha1, sha256, sha384, sha512, \
                         aesxcbc, md5), not \"{}\"",
                        r.suite
                    ),
                ),
                _ => {
                    if let Err(e) = s.check_policy(allow_insecure) {
                        let mut m = e.to_string();
                        if matches!(e, SuiteError::Insecure(_)) {
                            m.push_str(" (allow_insecure = true on this connection)");
                        }
                        self.err(p("suite"), m);
                    }
                }
            }
        }
        let spi_in = self.check(p("spi_in"), parse_spi(&r.spi_in));
        let spi_out = self.check(p("spi_out"), parse_spi(&r.spi_out));

        let (enc_len, integ_len) = suite.map_or((None, None), |s| {
            (Some(s.enc_key_len()), Some(s.integ_key_len()))
        });
        let salt = suite.and_then(|s| s.enc).is_some_and(|e| e.is_combined());
        let suite_name = suite.map(|s| s.name()).unwrap_or_default();
        let mut keys: Vec<Option<Zeroizing<Vec<u8>>>> = Vec::new();
        for (k, inline, file, need, what) in [
            ("enc_in", r.enc_in, r.enc_in_file, enc_len, "encryption"),
            ("enc_out", r.enc_out, r.enc_out_file, enc_len, "encryption"),
            (
                "integ_in",
                r.integ_in,
                r.integ_in_file,
                integ_len,
                "integrity",
            ),
            (
                "integ_out",
                r.integ_out,
                r.integ_out_file,
                integ_len,
                "integrity",
            ),
        ] {
            let file_k = format!("{k}_file");
            let given = inline.is_some() || file.is_some();
            // Messages point at whichever form was used.
            let path = if file.is_some() { p(&file_k) } else { p(k) };
            let key = match (inline, file) {
                (Some(_), Some(_)) => {
                    self.err(
                        p(&file_k),
                        format!("{k} and {file_k} are both given; keep one"),
                    );
                    None
                }
                (Some(h), None) => {
                    self.inline_keys = true;
                    self.check(p(k), decode_hex(&h.0))
                }
                (None, Some(f)) => self.key_file(p(&file_k), &f),
                (None, None) => Some(Zeroizing::new(Vec::new())),
            };
            let (Some(key), Some(need)) = (key, need) else {
                keys.push(None);
                continue;
            };
            if need == 0 && given {
                let why = if protocol == Protocol::Ah {
                    "AH has no encryption key".to_string()
                } else if salt {
                    format!("{suite_name} authenticates by itself and takes no integrity key")
                } else {
                    format!("{suite_name} takes no {what} key")
                };
                self.err(path, format!("{why}; remove {k}"));
                keys.push(None);
            } else if need > 0 && !given {
                self.err(
                    path,
                    format!(
                        "{k} is required: {suite_name} needs a {need}-byte {what} key{} \
                         ({} hex digits), as {k} = \"HEX\" or {file_k} = \"PATH\"",
                        if salt && what == "encryption" {
                            " including the 4-byte salt"
                        } else {
                            ""
                        },
                        need * 2
                    ),
                );
                keys.push(None);
            } else if key.len() != need {
                self.err(
                    path,
                    format!(
                        "{suite_name} needs a {need}-byte {what} key{} ({} hex digits), \
                         got {} ({} hex digits)",
                        if salt && what == "encryption" {
                            " including the 4-byte salt"
                        } else {
                            ""
                        },
                        need * 2,
                        plural(key.len(), "byte"),
                        key.len() * 2
                    ),
                );
                keys.push(None);
            } else {
                keys.push(Some(key));
            }
        }
        let mut keys = keys.into_iter();
        let (enc_in, enc_out, integ_in, integ_out) =
            (keys.next()??, keys.next()??, keys.next()??, keys.next()??);
        // Same key both ways.
        if self.issues.len() == before {
            for (a, b, what) in [(&enc_in, &enc_out, "enc"), (&integ_in, &integ_out, "integ")] {
                if !a.is_empty() && a[..] == b[..] {
                    if salt && what == "enc" {
                        self.err(
                            p(&format!("{what}_out")),
                            "the same key in both directions: both sides start at sequence \
                             number 1, so AES-GCM/ChaCha20 nonces repeat (catastrophic); use \
                             a different key per direction",
                        );
                    } else {
                        self.warn(
                            p(&format!("{what}_out")),
                            "the same key in both directions lets an attacker reflect our own \
                             packets back to us; use a different key per direction",
                        );
                    }
                }
            }
        }
        if self.issues.len() != before {
            return None;
        }
        Some(ManualSa {
            suite: suite?,
            spi_in: spi_in?,
            spi_out: spi_out?,
            enc_in,
            enc_out,
            integ_in,
            integ_out,
        })
    }

    fn key_file(&mut self, path: KeyPath, f: &str) -> Option<Zeroizing<Vec<u8>>> {
        let file = self.base_dir.join(f);
        let text = match read_secret_text(&file, MAX_KEY_FILE_BYTES) {
            Ok(t) => t,
            Err(e) => {
                self.err(
                    path,
                    format!("cannot read key file {}: {e}", file.display()),
                );
                return None;
            }
        };
        if let Some(mode) = group_other_readable(&file) {
            self.warn(
                path.clone(),
                format!(
                    "key file {} is readable by group/others (mode {mode:04o}); chmod 600 it",
                    file.display()
                ),
            );
        }
        match decode_hex(&text) {
            Ok(k) => Some(k),
            Err(e) => {
                self.err(path, format!("key file {}: {e}", file.display()));
                None
            }
        }
    }

    /// Validates `[connection.ike]` and loads the files it names.
    fn ike(
        &mut self,
        base: &[Seg],
        r: RawIke,
        local: Option<IpAddr>,
        remote: Option<IpAddr>,
        encap: Encapsulation,
    ) -> Option<IkeSettings> {
        let before = self.issues.len();
        let p = |k: &str| at(base, &[k]);

        let proposals = self.proposals(
            base,
            "proposals",
            ProposalKind::Ike,
            r.proposals,
            DEFAULT_IKE_PROPOSALS,
        );
        let esp_proposals = self.proposals(
            base,
            "esp_proposals",
            ProposalKind::Esp,
            r.esp_proposals,
            DEFAULT_ESP_PROPOSALS,
        );

        // Identities.
        let local_id = match r.local_id.as_deref() {
            Some(s) if is_any_id(s) => {
                self.err(
                    p("local_id"),
                    "\"%any\" is for remote_id only: we must tell the peer who we are",
                );
                None
            }
            Some(s) => self.check(p("local_id"), parse_identity(s)),
            None => local.map(address_identity),
        };
        let remote_id = match r.remote_id.as_deref() {
            Some(s) if is_any_id(s) => Some(None),
            Some(s) => self.check(p("remote_id"), parse_identity(s)).map(Some),
            None => remote.map(|a| Some(address_identity(a))),
        };

        // Authentication material.
        let auth = r.auth.unwrap_or(AuthMethod::Psk);
        let remote_auth = r.remote_auth.unwrap_or(auth);
        let auth_words = if r.auth.is_some() {
            format!("auth = \"{}\"", auth.name())
        } else {
            format!("auth = \"{}\" (the default)", auth.name())
        };
        let remote_auth_words = if r.remote_auth.is_some() {
            format!("remote_auth = \"{}\"", remote_auth.name())
        } else {
            format!(
                "remote_auth = \"{}\" (the default: as auth)",
                remote_auth.name()
            )
        };
        let uses_psk = auth == AuthMethod::Psk || remote_auth == AuthMethod::Psk;
        let psk = match (&r.psk_file, uses_psk) {
            (Some(f), true) => self.psk_file(p("psk_file"), f),
            (None, true) => {
                let who = if auth == AuthMethod::Psk {
                    &auth_words
                } else {
                    &remote_auth_words
                };
                self.err(
                    base.to_vec(),
                    format!(
                        "{who} needs psk_file = \"PATH\": a file with mode 0600 holding the \
                         pre-shared key (make one with `espgate keygen --type psk --out PATH`)"
                    ),
                );
                None
            }
            (Some(_), false) => {
                self.err(
                    p("psk_file"),
                    "psk_file is not used: neither auth nor remote_auth is \"psk\"; remove it",
                );
                None
            }
            (None, false) => None,
        };

        let local_auth = match auth {
            AuthMethod::Psk => {
                for k in ["private_key", "cert"] {
                    let given = if k == "cert" {
                        r.cert.is_some()
                    } else {
                        r.private_key.is_some()
                    };
                    if given {
                        self.err(
                            p(k),
                            format!(
                                "{k} is only used with auth = \"pubkey\", but {auth_words}; \
                                 set auth = \"pubkey\" or remove {k}"
                            ),
                        );
                    }
                }
                psk.clone().map(LocalAuth::Psk)
            }
            AuthMethod::Pubkey => {
                let key = match &r.private_key {
                    Some(f) => self.private_key_file(p("private_key"), f),
                    None => {
                        self.err(
                            base.to_vec(),
                            "auth = \"pubkey\" needs private_key = \"PATH\", a PEM private key \
                             (make one with `espgate keygen --type ed25519 --out PATH`)",
                        );
                        None
                    }
                };
                let certs = match &r.cert {
                    Some(f) => self.cert_file(p("cert"), f),
                    None => Some(Vec::new()),
                };
                if let (Some(key), Some(first)) = (&key, certs.as_ref().and_then(|c| c.first())) {
                    self.cert_vs_key(base, first, key, local_id.as_ref(), r.local_id.is_some());
                }
                match (key, certs) {
                    (Some(key), Some(certs)) => Some(LocalAuth::Signature {
                        key: Arc::new(key),
                        certs,
                    }),
                    _ => None,
                }
            }
        };

        let remote_auth = match remote_auth {
            AuthMethod::Psk => {
                for (k, given) in [
                    ("ca", r.ca.is_some()),
                    ("remote_public_key", r.remote_public_key.is_some()),
                ] {
                    if given {
                        self.err(
                            p(k),
                            format!(
                                "{k} is only used with remote_auth = \"pubkey\", but \
                                 {remote_auth_words}; set remote_auth = \"pubkey\" or remove {k}"
                            ),
                        );
                    }
                }
                psk.map(RemoteAuth::Psk)
            }
            AuthMethod::Pubkey => match (&r.ca, &r.remote_public_key) {
                (Some(_), Some(_)) => {
                    self.err(
                        p("remote_public_key"),
                        "ca and remote_public_key are both given: the peer proves who it is \
                         with a certificate issued by a CA in ca, or with the raw public key \
                         remote_public_key; keep one",
                    );
                    None
                }
                (None, None) => {
                    self.err(
                        base.to_vec(),
                        format!(
                            "{remote_auth_words} needs ca = \"PATH\" (CA certificates, PEM: the \
                             peer's certificate must chain to one) or remote_public_key = \
                             \"PATH\" (the peer's public key, PEM)"
                        ),
                    );
                    None
                }
                (Some(f), None) => self.cert_file(p("ca"), f).map(RemoteAuth::Ca),
                (None, Some(f)) => self
                    .public_key_file(p("remote_public_key"), f)
                    .map(RemoteAuth::PublicKey),
            },
        };

        // Timers.
        let dur = |this: &mut Self, k: &str, v: &Option<Scalar>, default: Duration, max: u64| {
            let d = match v {
                None => return Some(default),
                Some(v) => this
                    .check(p(k), parse_duration(v))?
                    .unwrap_or(Duration::ZERO),
            };
            if d.as_secs() > max {
                this.err(
                    p(k),
                    format!(
                        "{} is too long: at most {}",
                        v.as_ref().map_or(String::new(), |v| v.to_string()),
                        fmt_secs(max)
                    ),
                );
                return None;
            }
            Some(d)
        };
        const YEAR: u64 = 365 * 86400;
        let rekey_time = dur(
            self,
            "rekey_time",
            &r.rekey_time,
            Duration::from_secs(4 * 3600),
            YEAR,
        );
        let child_rekey_time = dur(
            self,
            "child_rekey_time",
            &r.child_rekey_time,
            Duration::from_secs(3600),
            YEAR,
        );
        let child_life_time = match child_rekey_time {
            Some(rk) => dur(
                self,
                "child_life_time",
                &r.child_life_time,
                rk + rk / 10,
                YEAR,
            ),
            None => None,
        };
        if let (Some(rk), Some(life)) = (child_rekey_time, child_life_time) {
            if !rk.is_zero() && !life.is_zero() && life <= rk {
                self.err(
                    p("child_life_time"),
                    format!(
                        "{} is not above child_rekey_time ({}): the child SA would expire \
                         before it is rekeyed",
                        fmt_secs(life.as_secs()),
                        fmt_secs(rk.as_secs())
                    ),
                );
            } else if rk.is_zero() && !life.is_zero() {
                self.warn(
                    p("child_rekey_time"),
                    format!(
                        "0: the child SA is never rekeyed, so it is deleted after \
                         child_life_time ({}) and traffic stops until a new one is negotiated",
                        fmt_secs(life.as_secs())
                    ),
                );
            }
        }
        let jitter = match (rekey_time, child_rekey_time) {
            (Some(ike_rk), Some(child_rk)) => {
                let smallest = [ike_rk, child_rk]
                    .into_iter()
                    .filter(|d| !d.is_zero())
                    .min();
                let default = smallest.map_or(Duration::ZERO, |d| d / 10);
                let j = dur(self, "jitter", &r.jitter, default, YEAR);
                if let (Some(j), Some(s)) = (j, smallest) {
                    if j >= s / 2 && !j.is_zero() {
                        let which = if s == child_rk {
                            "child_rekey_time"
                        } else {
                            "rekey_time"
                        };
                        self.err(
                            p("jitter"),
                            format!(
                                "{} is not below half of {which} ({}): rekeying could come \
                                 at any moment; use at most 10-20% of it",
                                fmt_secs(j.as_secs()),
                                fmt_secs(s.as_secs())
                            ),
                        );
                    }
                }
                j
            }
            _ => None,
        };
        let dpd_delay = dur(
            self,
            "dpd_delay",
            &r.dpd_delay,
            Duration::from_secs(30),
            YEAR,
        );
        let retransmit_timeout = dur(
            self,
            "retransmit_timeout",
            &r.retransmit_timeout,
            Retransmit::default().timeout,
            3600,
        );
        if retransmit_timeout.is_some_and(|d| d.is_zero()) {
            self.err(
                p("retransmit_timeout"),
                "0: a request needs at least 1 second to be answered (default \"4s\")",
            );
        }
        let retransmit_tries = r.retransmit_tries.unwrap_or(5);
        if !(0..=20).contains(&retransmit_tries) {
            self.err(
                p("retransmit_tries"),
                format!("{retransmit_tries}: expected 0 to 20 retransmissions"),
            );
        }
        let dpd_action = match r.dpd_action.unwrap_or(DpdActionName::Clear) {
            DpdActionName::Clear => DpdAction::Clear,
            DpdActionName::Restart => DpdAction::Restart,
        };
        let force_encap = match (r.force_encap, encap) {
            (Some(true), Encapsulation::None) => {
                self.err(
                    p("force_encap"),
                    "force_encap = true makes the SAs UDP-encapsulated, but this connection \
                     has encap = \"none\" (raw ESP); set encap = \"udp\" or remove force_encap",
                );
                false
            }
            (Some(b), _) => b,
            (None, e) => e == Encapsulation::Udp,
        };

        if self.issues.len() != before {
            return None;
        }
        Some(IkeSettings {
            proposals: proposals?,
            esp_proposals: esp_proposals?,
            local_id: local_id?,
            remote_id: remote_id?,
            local_auth: local_auth?,
            remote_auth: remote_auth?,
            start_action: r.start_action.unwrap_or(StartAction::None),
            rekey_time: rekey_time?,
            child_rekey_time: child_rekey_time?,
            child_life_time: child_life_time?,
            jitter: jitter?,
            dpd_delay: dpd_delay?,
            dpd_action,
            retransmit: Retransmit {
                timeout: retransmit_timeout?,
                tries: retransmit_tries as u32,
                ..Retransmit::default()
            },
            force_encap,
        })
    }

    /// A list of proposal strings (each may hold several, comma-separated).
    fn proposals(
        &mut self,
        base: &[Seg],
        k: &str,
        kind: ProposalKind,
        list: Option<Vec<String>>,
        default: &[&str],
    ) -> Option<Vec<ProposalSpec>> {
        let given = list.is_some();
        let list = list.unwrap_or_else(|| default.iter().map(|s| s.to_string()).collect());
        if list.is_empty() {
            self.err(
                at(base, &[k]),
                format!(
                    "an empty list offers nothing; omit {k} for the default {:?}",
                    default
                ),
            );
            return None;
        }
        let mut out = Vec::new();
        let mut ok = true;
        for (j, s) in list.iter().enumerate() {
            let mut path = at(base, &[k]);
            if given {
                path.push(Seg::Index(j));
            }
            match ProposalSpec::parse_list(kind, s) {
                Ok(v) if v.is_empty() => {
                    self.err(path, "an empty proposal");
                    ok = false;
                }
                Ok(v) => out.extend(v),
                Err(e) => {
                    self.err(path, format!("{s:?}: {e}"));
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    /// Reads a file named in `[connection.ike]` (at most `max` bytes) into
    /// a buffer wiped on drop, with the file's permission bits.
    fn ike_file(
        &mut self,
        path: &KeyPath,
        f: &str,
        what: &str,
        max: u64,
    ) -> Option<(PathBuf, Zeroizing<Vec<u8>>, u32)> {
        let file = self.base_dir.join(f);
        match read_secret_bytes(&file, max) {
            Ok((data, mode)) => Some((file, data, mode)),
            Err(e) => {
                self.err(
                    path.clone(),
                    format!("cannot read {what} {}: {e}", file.display()),
                );
                None
            }
        }
    }

    /// `psk_file`: text (one final newline dropped) or `0x` and hex; the
    /// file must not be accessible to group or others.
    fn psk_file(&mut self, path: KeyPath, f: &str) -> Option<Zeroizing<Vec<u8>>> {
        let (file, data, mode) = self.ike_file(&path, f, "psk_file", MAX_KEY_FILE_BYTES)?;
        if mode & 0o077 != 0 {
            self.err(
                path,
                format!(
                    "psk_file {} is readable or writable by group/others (mode {mode:04o}); \
                     a pre-shared key must be private: chmod 600 it",
                    file.display()
                ),
            );
            return None;
        }
        let psk = match parse_psk(&data) {
            Ok(k) => k,
            Err(e) => {
                self.err(path, format!("psk_file {}: {e}", file.display()));
                return None;
            }
        };
        if psk.len() < MIN_GOOD_PSK {
            self.warn(
                path,
                format!(
                    "psk_file {}: a {}-byte pre-shared key can be guessed offline from one \
                     captured exchange; use at least {MIN_GOOD_PSK} random bytes (`espgate \
                     keygen --type psk` makes a 32-byte one)",
                    file.display(),
                    psk.len()
                ),
            );
        }
        Some(psk)
    }

    fn private_key_file(&mut self, path: KeyPath, f: &str) -> Option<PrivateKey> {
        let (file, data, mode) = self.ike_file(&path, f, "private key file", MAX_KEY_FILE_BYTES)?;
        if mode & 0o077 != 0 {
            self.warn(
                path.clone(),
                format!(
                    "private key file {} is readable or writable by group/others (mode \
                     {mode:04o}); chmod 600 it",
                    file.display()
                ),
            );
        }
        self.check(
            path,
            PrivateKey::from_pem(&data)
                .map_err(|e| format!("private key file {}: {e}", file.display())),
        )
    }

    fn cert_file(&mut self, path: KeyPath, f: &str) -> Option<Vec<Certificate>> {
        let (file, data, _) = self.ike_file(&path, f, "certificate file", MAX_CERT_FILE_BYTES)?;
        self.check(
            path,
            Certificate::from_pem(&data)
                .map_err(|e| format!("certificate file {}: {e}", file.display())),
        )
    }

    fn public_key_file(&mut self, path: KeyPath, f: &str) -> Option<PublicKey> {
        let (file, data, _) = self.ike_file(&path, f, "public key file", MAX_KEY_FILE_BYTES)?;
        self.check(
            path,
            PublicKey::from_pem(&data).map_err(|e| {
                format!(
                    "public key file {}: {e} (expected a \"PUBLIC KEY\" PEM block, as \
                     `espgate keygen --pub` or `openssl pkey -pubout` write)",
                    file.display()
                )
            }),
        )
    }

    /// Our certificate must carry our private key's public key, and should
    /// bind our identity.
    fn cert_vs_key(
        &mut self,
        base: &[Seg],
        cert: &Certificate,
        key: &PrivateKey,
        local_id: Option<&Identity>,
        local_id_given: bool,
    ) {
        let p = |k: &str| at(base, &[k]);
        let cert_key = match cert.public_key() {
            Ok(k) => k,
            Err(e) => {
                self.err(p("cert"), format!("the first certificate's key: {e}"));
                return;
            }
        };
        if cert_key.spki_der() != key.public_key().spki_der() {
            self.err(
                p("cert"),
                format!(
                    "the first certificate (the end entity, subject \"{}\") is not for the \
                     {} key in private_key: the peer could not verify our signature",
                    cert.subject_identity(),
                    key.kind()
                ),
            );
            return;
        }
        if let Some(id) = local_id.filter(|id| !cert.matches_identity(id)) {
            let (k, how) = if local_id_given {
                ("local_id", "")
            } else {
                ("cert", " (local_id defaults to the local address)")
            };
            self.warn(
                p(k),
                format!(
                    "the certificate does not bind local_id {id}{how}: a peer that checks \
                     it will refuse us; set local_id to a name the certificate holds, for \
                     example its subject: local_id = \"{}\"",
                    cert.subject_identity()
                ),
            );
        }
    }

    fn gateway_vs_connections(&mut self, g: &Gateway, conns: &[(usize, Connection)]) {
        if g.listen.port() == 0 && conns.iter().any(|(_, c)| c.encap == Encapsulation::Udp) {
            self.err(
                vec![key("gateway"), key("listen")],
                "port 0: UDP-encapsulated connections need a fixed port (4500)",
            );
        }
        let v6 = conns.iter().any(|(_, c)| c.local.is_ipv6());
        if v6 && g.mtu < 1280 {
            self.err(
                vec![key("gateway"), key("mtu")],
                format!(
                    "MTU {} is below 1280, the IPv6 minimum, and a connection uses IPv6",
                    g.mtu
                ),
            );
        }
        for (i, c) in conns {
            // A route to the peer's own address through the TUN would send
            // the ESP packets back into the tunnel.
            if c.routes && g.fwmark.is_none() {
                if let Some((j, pf)) = c
                    .remote_ts
                    .iter()
                    .enumerate()
                    .find(|(_, pf)| pf.contains(c.remote))
                {
                    let mut path = at(&conn_path(*i), &["remote_ts"]);
                    path.push(Seg::Index(j));
                    self.warn(
                        path,
                        format!(
                            "{pf} contains the peer's outer address {}: with routes = true \
                             and no gateway.fwmark, the packets to the peer would be routed \
                             into the TUN; set gateway.fwmark and policy routing (like \
                             wg-quick), or routes = false",
                            c.remote
                        ),
                    );
                }
            }
            if c.encap != Encapsulation::Udp {
                continue;
            }
            let l = g.listen.ip();
            let ok = if l.is_unspecified() {
                // "::" also receives IPv4 (the daemon clears IPV6_V6ONLY).
                l.is_ipv6() || c.local.is_ipv4()
            } else {
                l == c.local
            };
            if !ok {
                self.err(
                    at(&conn_path(*i), &["local"]),
                    format!(
                        "ESP-in-UDP for this connection leaves from {}, but gateway.listen is \
                         {}; listen on \"[::]:{}\" or on this address",
                        c.local,
                        g.listen,
                        g.listen.port()
                    ),
                );
            }
        }
    }

    fn across_connections(&mut self, conns: &[(usize, Connection)]) {
        // One TUN device, one MTU: either it is the outer MTU minus the SA
        // overhead (inner fragmentation) or the outer MTU itself.
        if let Some((first, fc)) = conns.first() {
            for (i, c) in conns {
                if c.fragment_inner != fc.fragment_inner {
                    self.err(
                        at(&conn_path(*i), &["fragment_inner"]),
                        format!(
                            "fragment_inner = {} here but {} on connection \"{}\" \
                             (connection[{first}]): the TUN device has one MTU, so every \
                             connection must agree",
                            c.fragment_inner, fc.fragment_inner, fc.name
                        ),
                    );
                    break;
                }
            }
        }
        // (protocol, direction, spi) -> first connection index; outbound
        // also keyed by the peer (SPIs are chosen by each receiver).
        type SpiKey = (Protocol, bool, u32, Option<IpAddr>);
        let mut spis: HashMap<SpiKey, (usize, &str)> = HashMap::new();
        for (i, c) in conns {
            for (proto, sa) in [(Protocol::Esp, &c.esp), (Protocol::Ah, &c.ah)] {
                let Some(sa) = sa else { continue };
                for (outbound, spi) in [(false, sa.spi_in), (true, sa.spi_out)] {
                    let peer = outbound.then_some(c.remote);
                    let k = (proto, outbound, spi, peer);
                    match spis.get(&k) {
                        Some(&(first, first_name)) => {
                            let which = if outbound { "spi_out" } else { "spi_in" };
                            let why = if outbound {
                                format!("both send to {} with it", c.remote)
                            } else {
                                "inbound SAs are found by SPI alone".to_string()
                            };
                            self.err(
                                at(&conn_path(*i), &[proto.name(), which]),
                                format!(
                                    "{} {which} {spi:#x} is already used by connection \
                                     \"{first_name}\" (connection[{first}]); {why}",
                                    proto.name().to_uppercase()
                                ),
                            );
                        }
                        None => {
                            spis.insert(k, (*i, &c.name));
                        }
                    }
                }
            }
        }
        // Overlapping selectors: the first connection in file order wins.
        for (a, (i, ci)) in conns.iter().enumerate() {
            for (j, cj) in conns.iter().skip(a + 1) {
                let proto_overlap =
                    ci.proto == IpProto::Any || cj.proto == IpProto::Any || ci.proto == cj.proto;
                let overlap = |x: &[Prefix], y: &[Prefix]| {
                    x.iter().any(|p| {
                        y.iter()
                            .any(|q| p.contains(q.addr()) || q.contains(p.addr()))
                    })
                };
                if proto_overlap
                    && overlap(&ci.local_ts, &cj.local_ts)
                    && overlap(&ci.remote_ts, &cj.remote_ts)
                {
                    self.warn(
                        at(&conn_path(*j), &["remote_ts"]),
                        format!(
                            "selectors overlap those of connection \"{}\" (connection[{i}]); \
                             traffic in both goes to the first in file order",
                            ci.name
                        ),
                    );
                }
            }
        }
    }
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Serde's messages with TOML's words for Rust types.
fn friendly_serde_message(m: &str) -> String {
    let mut m = m.trim_end().to_string();
    for (from, to) in [
        ("expected i64", "expected an integer"),
        ("expected u32", "expected an integer"),
        ("expected a sequence", "expected an array"),
        ("expected struct ", "expected a table "),
        ("invalid type: sequence", "invalid type: array"),
        ("invalid type: map", "invalid type: table"),
    ] {
        m = m.replace(from, to);
    }
    m
}

fn check_ifname(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 15 {
        return Err(format!(
            "{s:?} is {} bytes; a device name has 1-15",
            s.len()
        ));
    }
    if s == "." || s == ".." {
        return Err(format!("{s:?} is not a valid device name"));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "{s:?} contains {c:?}; a device name uses A-Z a-z 0-9 _ . -"
        ));
    }
    Ok(())
}

fn parse_outer_addr(s: &str) -> Result<IpAddr, String> {
    let a: IpAddr = s
        .trim()
        .parse()
        .map_err(|_| format!("\"{s}\" is not an IP address (no prefix length, no port)"))?;
    if a.is_unspecified() || a.is_multicast() || a == IpAddr::from([255, 255, 255, 255]) {
        return Err(format!("{a} is not a unicast address"));
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_core::sa::Classifier;
    use espgate_core::sad::{InboundResult, Sad};
    use espgate_core::wire::{ipv4, udp};
    use espgate_core::PacketBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const K20A: &str = "000102030405060708090a0b0c0d0e0f10111213";
    const K20B: &str = "101112131415161718191a1b1c1d1e1f20212223";

    fn examples_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
    }

    /// A fresh empty directory under the system temp dir.
    fn temp_dir() -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "espgate-config-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn parse_str(text: &str) -> Result<LoadedConfig, ConfigError> {
        parse(text, Path::new("/nonexistent"), "test.toml")
    }

    fn err(text: &str) -> String {
        match parse_str(text) {
            Ok(c) => panic!("expected an error, got {c:#?}"),
            Err(e) => e.to_string(),
        }
    }

    fn assert_has(msg: &str, parts: &[&str]) {
        for p in parts {
            assert!(msg.contains(p), "{p:?} not in:\n{msg}");
        }
    }

    /// One tunnel-mode ESP connection; `extra` goes into the connection
    /// table, `esp` into its ESP table.
    fn conn(name: &str, extra: &str, esp: &str) -> String {
        format!(
            r#"
[[connection]]
name = "{name}"
local = "192.0.2.1"
remote = "192.0.2.2"
local_ts = ["10.1.0.0/16"]
remote_ts = ["10.2.0.0/16"]
{extra}

[connection.esp]
suite = "aes128gcm16"
{esp}
"#
        )
    }

    fn good_esp(spi_in: u32, spi_out: u32) -> String {
        format!(
            "spi_in = {spi_in:#x}\nspi_out = {spi_out:#x}\nenc_in = \"{K20A}\"\nenc_out = \"{K20B}\""
        )
    }

    fn minimal() -> String {
        conn("b", "", &good_esp(0x1001, 0x1002))
    }

    #[test]
    fn minimal_config_defaults() {
        let c = parse_str(&minimal()).unwrap();
        let g = &c.gateway;
        assert_eq!(g.tun, "espgate0");
        assert_eq!(g.listen, "0.0.0.0:4500".parse().unwrap());
        assert_eq!(g.encap, Encapsulation::Udp);
        assert_eq!((g.workers, g.mtu, g.log), (1, 1500, LogLevel::Info));
        assert_eq!(g.control_socket, Path::new("/run/espgate/espgate.sock"));
        assert_eq!(g.state_dir, Path::new("/var/lib/espgate"));
        assert_eq!((g.metrics, g.fwmark), (None, None));
        assert!(g.offloads && !g.cost_accounting);
        assert_eq!((g.batch, g.socket_buffer), (64, 4 << 20));
        assert_eq!(g.ike_fragment_size, 1200);
        let b = c.connection("b").unwrap();
        assert_eq!(b.remote_port, 4500);
        assert_eq!(b.local_port, 4500);
        assert_eq!(b.mode, Mode::Tunnel);
        assert_eq!(b.protocol, Protocols::Esp);
        assert_eq!(b.encap, Encapsulation::Udp);
        assert_eq!(b.proto, IpProto::Any);
        assert!(b.routes && b.fragment_inner && !b.esn && !b.allow_insecure);
        assert_eq!(b.mss_clamp, MssClamp::Auto);
        assert_eq!((b.dscp, b.ecn), (Dscp::Copy, Ecn::Normal));
        assert_eq!(b.replay_window, 1024);
        assert_eq!(b.tfc_pad_to, None);
        assert_eq!(b.lifetime, Lifetime::default());
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn examples_load_and_convert() {
        let dir = examples_dir();
        let mut seen = 0;
        for name in [
            "site-to-site.toml",
            "host-to-host.toml",
            "esp-ah-bundle.toml",
        ] {
            let c = load(&dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
            assert!(!c.connections.is_empty(), "{name}");
            for w in &c.warnings {
                // Only permission warnings (git checks files out as 0644).
                assert!(w.contains("chmod 600"), "{name}: unexpected warning {w}");
            }
            for conn in &c.connections {
                let sas = conn.sa_configs();
                let n = usize::from(conn.protocol.has_esp()) + usize::from(conn.protocol.has_ah());
                assert_eq!((sas.inbound.len(), sas.outbound.len()), (n, n), "{name}");
                for cfg in sas.inbound.iter().chain(&sas.outbound) {
                    Sa::new(cfg.clone(), Duration::ZERO).unwrap();
                    cfg.validate_outbound().unwrap();
                }
            }
            seen += 1;
        }
        assert_eq!(seen, 3);

        let s = load(&dir.join("site-to-site.toml")).unwrap();
        let b = s.connection("site-b").unwrap();
        assert_eq!(b.esp.as_ref().unwrap().enc_in.len(), 36);
        assert_eq!(s.gateway.workers, 0);
        assert!(s.gateway.worker_threads() >= 1);
        assert_eq!(s.gateway.metrics, Some("127.0.0.1:9184".parse().unwrap()));
        // IPv4 and IPv6 inner traffic: two selectors, not four.
        assert_eq!(b.selectors().len(), 2);
        assert_eq!(b.lifetime.soft_bytes, Some(4 << 40));
        assert_eq!(b.lifetime.soft_time, Some(Duration::from_secs(30 * 86400)));

        let h = load(&dir.join("host-to-host.toml")).unwrap();
        let d = &h.connections[0];
        assert_eq!(d.mode, Mode::Transport);
        assert_eq!(h.gateway.fwmark, Some(0x4500));
        assert_eq!(
            d.local_ts,
            vec![Prefix::host("2001:db8::1".parse().unwrap())]
        );
        assert_eq!(
            d.remote_ts,
            vec![Prefix::host("2001:db8::2".parse().unwrap())]
        );
        let sas = d.sa_configs();
        assert_eq!(sas.outbound[0].encap, Encap::None);
        assert_eq!(sas.outbound[0].tunnel_src, None);

        let bundle = load(&dir.join("esp-ah-bundle.toml")).unwrap();
        let lab = bundle.connection("lab-b").unwrap();
        let sas = lab.sa_configs();
        let protos: Vec<_> = sas.outbound.iter().map(|c| (c.protocol, c.mode)).collect();
        assert_eq!(
            protos,
            [
                (Protocol::Esp, Mode::Tunnel),
                (Protocol::Ah, Mode::Transport)
            ]
        );
        let mgmt = bundle.connection("mgmt").unwrap();
        assert_eq!(mgmt.ah.as_ref().unwrap().integ_in.len(), 64); // split over two lines
        assert_eq!(mgmt.selectors()[0].proto, Some(proto::TCP));
        assert!(!mgmt.sa_configs().outbound[0].copy_dscp);
    }

    /// An IPv4 UDP packet from 10.1.0.10 to 10.2.0.20 (checksum 0).
    fn inner_packet() -> Vec<u8> {
        let payload = b"hello through the tunnel";
        let mut out = vec![0u8; 28 + payload.len()];
        ipv4::Ipv4Repr {
            src: "10.1.0.10".parse().unwrap(),
            dst: "10.2.0.20".parse().unwrap(),
            protocol: proto::UDP,
            tos: 0,
            ident: 1,
            dont_frag: true,
            ttl: 64,
            payload_len: 8 + payload.len(),
        }
        .emit(&mut out)
        .unwrap();
        udp::emit(&mut out[20..], 1234, 5678, payload.len()).unwrap();
        out[28..].copy_from_slice(payload);
        out
    }

    /// Site A's config and the mirror image for site B.
    fn mirrored(protocol: &str, encap: &str, ah: bool) -> (LoadedConfig, LoadedConfig) {
        let side = |local: &str, remote: &str, lts: &str, rts: &str, swap: bool| {
            let (i, o) = if swap {
                (0x1002, 0x1001)
            } else {
                (0x1001, 0x1002)
            };
            let (ki, ko) = if swap { (K20B, K20A) } else { (K20A, K20B) };
            let mut s = format!(
                r#"
[gateway]
encap = "{encap}"
listen = "0.0.0.0:4501"
fwmark = 1
[[connection]]
name = "peer"
local = "{local}"
remote = "{remote}"
remote_port = 4501
protocol = "{protocol}"
local_ts = ["{lts}"]
remote_ts = ["{rts}"]
[connection.esp]
suite = "aes128-sha256"
spi_in = {i}
spi_out = {o}
enc_in = "{}"
enc_out = "{}"
integ_in = "{ki}{}"
integ_out = "{ko}{}"
"#,
                &ki[..32],
                &ko[..32],
                &ki[..24],
                &ko[..24]
            );
            if ah {
                s.push_str(&format!(
                    "[connection.ah]\nsuite = \"sha1\"\nspi_in = {}\nspi_out = {}\n\
                     integ_in = \"{ki}\"\ninteg_out = \"{ko}\"\n",
                    i + 0x100,
                    o + 0x100
                ));
            }
            parse_str(&s).unwrap_or_else(|e| panic!("{e}"))
        };
        (
            side(
                "192.0.2.1",
                "192.0.2.2",
                "10.1.0.0/16",
                "10.2.0.0/16",
                false,
            ),
            side("192.0.2.2", "192.0.2.1", "10.2.0.0/16", "10.1.0.0/16", true),
        )
    }

    fn round_trip(a: &LoadedConfig, b: &LoadedConfig) {
        let a_sas = a.connections[0].sa_configs();
        let b_sas = b.connections[0].sa_configs();
        let mut tx = Sad::new();
        let ids: Vec<_> = a_sas
            .outbound
            .into_iter()
            .map(|c| tx.insert(Sa::new(c, Duration::ZERO).unwrap()).unwrap())
            .collect();
        let mut rx = Sad::new();
        for c in b_sas.inbound {
            rx.insert(Sa::new(c, Duration::ZERO).unwrap()).unwrap();
        }
        let pkt = inner_packet();
        let mut buf = PacketBuf::from_packet(&pkt);
        tx.encapsulate(&ids, &mut buf, Duration::ZERO).unwrap();
        let outer = buf.as_slice().to_vec();
        assert_eq!(&outer[12..16], &[192, 0, 2, 1], "outer source is A");
        assert_eq!(&outer[16..20], &[192, 0, 2, 2], "outer destination is B");
        let r = rx
            .decapsulate(&mut buf, &Classifier::new().udp_port(4501), Duration::ZERO)
            .unwrap();
        assert!(matches!(r, InboundResult::Packet(ref v) if v.len() == ids.len()));
        assert_eq!(buf.as_slice(), &pkt[..]);
    }

    #[test]
    fn mirrored_configs_interoperate() {
        let (a, b) = mirrored("esp", "udp", false);
        let out = &a.connections[0].sa_configs().outbound[0];
        assert_eq!(
            out.encap,
            Encap::Udp {
                src_port: 4501,
                dst_port: 4501
            }
        );
        assert_eq!(out.tunnel_src, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(out.tunnel_dst, Some("192.0.2.2".parse().unwrap()));
        let inb = &a.connections[0].sa_configs().inbound[0];
        assert_eq!(inb.tunnel_src, Some("192.0.2.2".parse().unwrap()));
        assert_eq!(inb.tunnel_dst, Some("192.0.2.1".parse().unwrap()));
        assert_eq!((inb.spi, out.spi), (0x1001, 0x1002));
        round_trip(&a, &b);
        let (a, b) = mirrored("esp", "none", false);
        round_trip(&a, &b);
        let (a, b) = mirrored("esp+ah", "none", true);
        let out = a.connections[0].sa_configs().outbound;
        assert_eq!(out[1].protocol, Protocol::Ah);
        assert_eq!(out[1].tunnel_src, None);
        round_trip(&a, &b);
        // Selectors are enforced: B refuses A's traffic when it does not match.
        let (a, _) = mirrored("esp", "none", false);
        let mut b_sas = mirrored("esp", "none", false).1.connections[0].sa_configs();
        b_sas.inbound[0].selectors[0].remote = "10.9.0.0/16".parse().unwrap();
        let mut tx = Sa::new(
            a.connections[0].sa_configs().outbound.remove(0),
            Duration::ZERO,
        )
        .unwrap();
        let mut rx = Sad::new();
        rx.insert(Sa::new(b_sas.inbound.remove(0), Duration::ZERO).unwrap())
            .unwrap();
        let mut buf = PacketBuf::from_packet(&inner_packet());
        tx.encapsulate(&mut buf, Duration::ZERO).unwrap();
        assert!(rx
            .decapsulate(&mut buf, &Classifier::new().udp_port(4501), Duration::ZERO)
            .is_err());
    }

    #[test]
    fn sa_configs_copy_the_connection_settings() {
        let text = conn(
            "b",
            r#"esn = true
replay_window = 64
allow_insecure = true
tfc_pad_to = 1200
dscp = "clear"
proto = "icmp"
local_ts = ["10.1.0.0/16", "2001:db8:1::/48"]
remote_ts = ["10.2.0.0/16", "2001:db8:2::/48", "10.3.0.0/16"]
lifetime = { soft_bytes = "1G", hard_bytes = "2G", soft_time = "50m", hard_time = "1h" }"#,
            &good_esp(0x1001, 0x1002),
        )
        .replace(
            "local_ts = [\"10.1.0.0/16\"]\nremote_ts = [\"10.2.0.0/16\"]\n",
            "",
        );
        let c = parse_str(&text).unwrap_or_else(|e| panic!("{e}"));
        let sas = c.connections[0].sa_configs();
        for s in sas.inbound.iter().chain(&sas.outbound) {
            assert!(s.esn && s.allow_insecure && !s.copy_dscp);
            assert_eq!(s.replay_window, 64);
            assert_eq!(s.tfc_pad_to, Some(1200));
            assert_eq!(s.lifetime.soft_bytes, Some(1 << 30));
            assert_eq!(s.lifetime.hard_bytes, Some(2 << 30));
            assert_eq!(s.lifetime.soft_time, Some(Duration::from_secs(3000)));
            assert_eq!(s.lifetime.hard_time, Some(Duration::from_secs(3600)));
            assert_eq!(
                (s.lifetime.soft_packets, s.lifetime.hard_packets),
                (None, None)
            );
            // 1 IPv4 local x 2 IPv4 remote + 1 IPv6 x 1 IPv6.
            assert_eq!(s.selectors.len(), 3);
            for ts in &s.selectors {
                let want = if ts.local.addr().is_ipv4() {
                    proto::ICMP
                } else {
                    proto::ICMPV6
                };
                assert_eq!(ts.proto, Some(want));
            }
        }
    }

    #[test]
    fn unknown_keys_are_refused_with_their_path() {
        let e = err(&format!("[gateway]\ncolour = \"red\"\n{}", minimal()));
        assert_has(
            &e,
            &["test.toml:2:1", "gateway.colour", "unknown field `colour`"],
        );
        let e = err(&minimal().replace("name = \"b\"", "name = \"b\"\nremote_prot = 1"));
        assert_has(
            &e,
            &[
                "connection[0].remote_prot",
                "(connection \"b\")",
                "unknown field",
            ],
        );
        let e = err(&minimal().replace("suite =", "enc = \"00\"\nsuite ="));
        assert_has(&e, &["connection[0].esp.enc", "unknown field `enc`"]);
        let e = err(&format!("{}\n[connection.lifetime]\nsoft = 1\n", minimal()));
        assert_has(&e, &["connection[0].lifetime.soft", "unknown field `soft`"]);
        let e = err(&format!("{}\n[extra]\n", minimal()));
        assert_has(&e, &["extra", "unknown field `extra`"]);
    }

    #[test]
    fn wrong_types_name_the_key() {
        let e = err(&format!("[gateway]\nmtu = \"big\"\n{}", minimal()));
        assert_has(&e, &["test.toml:2:7", "gateway.mtu", "invalid type"]);
        let e = err(&minimal().replace("name = \"b\"", "name = \"b\"\nesn = \"yes\""));
        assert_has(
            &e,
            &["connection[0].esn", "invalid type", "expected a boolean"],
        );
        let e = err(&minimal().replace("name = \"b\"", "name = \"b\"\nmode = \"tunel\""));
        assert_has(
            &e,
            &["connection[0].mode", "unknown variant `tunel`", "`tunnel`"],
        );
        let e = err(&minimal().replace("name = \"b\"", "name = \"b\"\nencap = \"tcp\""));
        assert_has(&e, &["connection[0].encap", "unknown variant `tcp`"]);
        let e = err(&format!("[gateway]\nlog = \"loud\"\n{}", minimal()));
        assert_has(&e, &["gateway.log", "unknown variant `loud`"]);
        let e = err(&minimal().replace("name = \"b\"\n", ""));
        assert_has(&e, &["connection[0]", "missing field `name`"]);
        let e = err(&minimal().replace("spi_in = 0x1001\n", ""));
        assert_has(&e, &["connection[0].esp", "missing field `spi_in`"]);
        let e = err("[gateway\n");
        assert_has(&e, &["test.toml:1:", "TOML syntax"]);
    }

    #[test]
    fn fragment_inner_false_needs_udp_and_agreement() {
        let c = parse_str(&conn(
            "b",
            "fragment_inner = false",
            &good_esp(0x1001, 0x1002),
        ));
        assert!(!c.unwrap().connection("b").unwrap().fragment_inner);
        let e = err(&conn(
            "b",
            "fragment_inner = false\nencap = \"none\"",
            &good_esp(0x1001, 0x1002),
        ));
        assert_has(
            &e,
            &[
                "connection[0].fragment_inner",
                "ESP-in-UDP only",
                "encap = \"udp\"",
            ],
        );
        let two = format!(
            "{}{}",
            conn("b", "", &good_esp(0x1001, 0x1002)),
            conn("c", "fragment_inner = false", &good_esp(0x2001, 0x2002))
                .replace("192.0.2.2", "192.0.2.3")
        );
        assert_has(
            &err(&two),
            &[
                "connection[1].fragment_inner",
                "true on connection \"b\"",
                "one MTU",
            ],
        );
    }

    #[test]
    fn duplicate_names_and_spis() {
        let two = format!(
            "{}{}",
            conn("b", "", &good_esp(0x1001, 0x1002)),
            conn("b", "", &good_esp(0x2001, 0x2002))
        );
        assert_has(
            &err(&two),
            &[
                "connection[1].name",
                "duplicate connection name \"b\" (also connection[0])",
            ],
        );
        let dup_in = format!(
            "{}{}",
            conn("b", "", &good_esp(0x1001, 0x1002)),
            conn("c", "", &good_esp(0x1001, 0x2002)).replace("192.0.2.2", "192.0.2.3")
        );
        assert_has(
            &err(&dup_in),
            &[
                "connection[1].esp.spi_in",
                "(connection \"c\")",
                "ESP spi_in 0x1001 is already used by connection \"b\" (connection[0])",
            ],
        );
        // Outbound SPIs are chosen by each peer: the same one to two peers is fine...
        let out_other_peer = format!(
            "{}{}",
            conn("b", "", &good_esp(0x1001, 0x1002)),
            conn(
                "c",
                "remote_ts = [\"10.3.0.0/16\"]",
                &good_esp(0x2001, 0x1002)
            )
            .replace("remote_ts = [\"10.2.0.0/16\"]\n", "")
            .replace("192.0.2.2", "192.0.2.3")
        );
        parse_str(&out_other_peer).unwrap_or_else(|e| panic!("{e}"));
        // ...but not to the same peer.
        let out_same_peer = format!(
            "{}{}",
            conn("b", "", &good_esp(0x1001, 0x1002)),
            conn("c", "", &good_esp(0x2001, 0x1002))
        );
        assert_has(
            &err(&out_same_peer),
            &[
                "connection[1].esp.spi_out",
                "already used",
                "both send to 192.0.2.2",
            ],
        );
        // ESP and AH SPIs live in separate spaces.
        let (a, _) = mirrored("esp+ah", "none", true);
        assert_eq!(a.connections.len(), 1);
    }

    #[test]
    fn reserved_and_oversized_spis() {
        let e = err(&conn("b", "", &good_esp(0xff, 0x1002)));
        assert_has(
            &e,
            &[
                "connection[0].esp.spi_in",
                "SPI 0xff is reserved",
                "RFC 4301",
            ],
        );
        let e = err(&minimal().replace("spi_out = 0x1002", "spi_out = 0x100000000"));
        assert_has(
            &e,
            &["connection[0].esp.spi_out", "does not fit in 32 bits"],
        );
        // SPIs may also be strings, as setkey prints them.
        let c =
            parse_str(&minimal().replace("spi_out = 0x1002", "spi_out = \"0xc0ffee02\"")).unwrap();
        assert_eq!(c.connections[0].esp.as_ref().unwrap().spi_out, 0xc0ffee02);
    }

    #[test]
    fn key_lengths_say_how_many_hex_digits() {
        let e = err(&minimal().replace(K20A, &K20A[..32]));
        assert_has(
            &e,
            &[
                "connection[0].esp.enc_in",
                "aes128gcm16 needs a 20-byte encryption key including the 4-byte salt \
                 (40 hex digits), got 16 bytes (32 hex digits)",
            ],
        );
        let e = err(&minimal()
            .replace("aes128gcm16", "aes128-sha256")
            .replace(K20A, &K20A[..32]));
        assert_has(
            &e,
            &[
                "connection[0].esp.integ_in (connection \"b\"): integ_in is required",
                "32-byte integrity key (64 hex digits)",
            ],
        );
        let e = err(&minimal().replace(
            &format!("enc_out = \"{K20B}\""),
            &format!("enc_out = \"{K20B}\"\ninteg_out = \"{K20A}\""),
        ));
        assert_has(
            &e,
            &[
                "connection[0].esp.integ_out",
                "authenticates by itself",
                "remove integ_out",
            ],
        );
        let e = err(&minimal().replace(&format!("enc_out = \"{K20B}\""), ""));
        assert_has(
            &e,
            &[
                "connection[0].esp.enc_out",
                "enc_out is required",
                "40 hex digits",
            ],
        );
    }

    #[test]
    fn insecure_suites_need_allow_insecure() {
        let des = minimal()
            .replace("aes128gcm16", "3des-sha1")
            .replace(K20A, &format!("{K20A}{}", &K20B[..8]))
            .replace(
                &format!("enc_out = \"{K20B}\""),
                &format!(
                    "enc_out = \"{K20B}{}\"\ninteg_in = \"{K20A}\"\ninteg_out = \"{K20B}\"",
                    &K20A[..8]
                ),
            );
        let e = err(&des);
        assert_has(
            &e,
            &[
                "connection[0].esp.suite",
                "3des encryption is insecure",
                "(allow_insecure = true on this connection)",
            ],
        );
        let ok = des.replace("name = \"b\"", "name = \"b\"\nallow_insecure = true");
        let c = parse_str(&ok).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.connections[0].sa_configs().outbound[0].allow_insecure);
        let e = err(&minimal()
            .replace("aes128gcm16", "aes128")
            .replace(K20A, &K20A[..32])
            .replace(K20B, &K20B[..32]));
        assert_has(
            &e,
            &[
                "esp.suite",
                "aes128 without an integrity algorithm is insecure",
            ],
        );
        let e = err(&minimal().replace("aes128gcm16", "rot13"));
        assert_has(
            &e,
            &["connection[0].esp.suite", "unknown suite keyword 'rot13'"],
        );
        let e = err(&minimal().replace("aes128gcm16", "sha256"));
        assert_has(
            &e,
            &["connection[0].esp.suite", "integrity-only (AH) suite"],
        );
    }

    fn ah_conn(extra: &str) -> String {
        format!(
            r#"
[[connection]]
name = "a"
local = "192.0.2.1"
remote = "192.0.2.2"
mode = "transport"
protocol = "ah"
{extra}
[connection.ah]
suite = "sha1"
spi_in = 0x3001
spi_out = 0x3002
integ_in = "{K20A}"
integ_out = "{K20B}"
"#
        )
    }

    #[test]
    fn ah_cannot_use_udp() {
        let e = err(&ah_conn("encap = \"udp\""));
        assert_has(
            &e,
            &[
                "connection[0].encap",
                "protocol \"ah\" cannot be UDP-encapsulated",
                "encap = \"udp\"",
            ],
        );
        // Inherited from the gateway default: said so.
        let e = err(&ah_conn(""));
        assert_has(
            &e,
            &[
                "connection[0].encap",
                "encap defaults to gateway.encap = \"udp\"",
            ],
        );
        let ok = parse_str(&ah_conn("encap = \"none\"\nrouting = 1").replace("routing = 1", ""))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            ok.connections[0].sa_configs().outbound[0].encap,
            Encap::None
        );
        let e = err(&format!(
            "[gateway]\nencap = \"none\"\n{}",
            ah_conn("").replace("\"sha1\"", "\"aes128gcm16\"")
        ));
        assert_has(
            &e,
            &[
                "connection[0].ah.suite",
                "AH takes an integrity algorithm only",
            ],
        );
        let e = err(&format!(
            "[gateway]\nencap = \"none\"\n{}",
            ah_conn("").replace("integ_in =", "enc_in = \"00\"\ninteg_in =")
        ));
        assert_has(&e, &["connection[0].ah.enc_in", "AH has no encryption key"]);
    }

    #[test]
    fn outer_families_must_match() {
        let e = err(&minimal().replace("remote = \"192.0.2.2\"", "remote = \"2001:db8::2\""));
        assert_has(
            &e,
            &[
                "connection[0].remote",
                "remote 2001:db8::2 is IPv6 but local 192.0.2.1 is IPv4",
            ],
        );
        let e = err(&minimal().replace("192.0.2.2", "192.0.2.1"));
        assert_has(&e, &["connection[0].remote", "same address as local"]);
        let e = err(&minimal().replace("192.0.2.1", "10.0.0.0/8"));
        assert_has(&e, &["connection[0].local", "not an IP address"]);
    }

    #[test]
    fn tunnel_mode_needs_selectors() {
        let e = err(&minimal().replace("local_ts = [\"10.1.0.0/16\"]\n", ""));
        assert_has(
            &e,
            &[
                "connection[0].local_ts",
                "tunnel mode needs traffic selectors",
            ],
        );
        let e = err(&minimal().replace("[\"10.2.0.0/16\"]", "[]"));
        assert_has(
            &e,
            &[
                "connection[0].remote_ts",
                "tunnel mode needs traffic selectors",
            ],
        );
        let e = err(&minimal().replace("[\"10.2.0.0/16\"]", "[\"2001:db8::/32\"]"));
        assert_has(
            &e,
            &[
                "connection[0].local_ts[0]",
                "10.1.0.0/16 is IPv4 but remote_ts has no IPv4 prefix",
            ],
        );
        let e = err(&minimal().replace("10.2.0.0/16", "10.2.0.0/40"));
        assert_has(
            &e,
            &["connection[0].remote_ts[0]", "prefix length 40 too long"],
        );
        // Host bits are a warning.
        let c = parse_str(&minimal().replace("10.2.0.0/16", "10.2.3.4/16")).unwrap();
        assert_has(
            &c.warnings.join("\n"),
            &["remote_ts[0]", "host bits set; it means 10.2.0.0/16"],
        );
        // Transport mode defaults to the two hosts.
        let t = minimal().replace(
            "local_ts = [\"10.1.0.0/16\"]\nremote_ts = [\"10.2.0.0/16\"]\n",
            "mode = \"transport\"\n",
        );
        let c = parse_str(&t).unwrap_or_else(|e| panic!("{e}"));
        let s = c.connections[0].selectors();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].local, "192.0.2.1/32".parse().unwrap());
        assert_eq!(s[0].remote, "192.0.2.2/32".parse().unwrap());
        // ...and, without a fwmark, routing the peer into the TUN is flagged.
        assert_has(
            &c.warnings.join("\n"),
            &["contains the peer's outer address 192.0.2.2"],
        );
    }

    #[test]
    fn keys_inline_xor_file_and_files_must_exist() {
        let e = err(&minimal().replace(
            &format!("enc_in = \"{K20A}\""),
            &format!("enc_in = \"{K20A}\"\nenc_in_file = \"k\""),
        ));
        assert_has(
            &e,
            &[
                "connection[0].esp.enc_in_file",
                "enc_in and enc_in_file are both given; keep one",
            ],
        );
        let e = err(&minimal().replace(
            &format!("enc_in = \"{K20A}\""),
            "enc_in_file = \"keys/missing\"",
        ));
        assert_has(
            &e,
            &[
                "connection[0].esp.enc_in_file",
                "cannot read key file /nonexistent/keys/missing",
                "No such file",
            ],
        );
        if Path::new("/dev/zero").exists() {
            let e = err(&minimal().replace(
                &format!("enc_in = \"{K20A}\""),
                "enc_in_file = \"/dev/zero\"",
            ));
            assert_has(
                &e,
                &["esp.enc_in_file", "/dev/zero: larger than 65536 bytes"],
            );
        }
    }

    #[test]
    fn invalid_hex_is_reported_without_the_key() {
        let bad = "00010203040506070809zz0b0c0d0e0f10111213";
        let e = err(&minimal().replace(K20A, bad));
        assert_has(
            &e,
            &[
                "connection[0].esp.enc_in",
                "not hex: character 21 is not a hex digit",
            ],
        );
        assert!(!e.contains(bad) && !e.contains("zz"), "{e}");
        let e = err(&minimal().replace(K20A, &K20A[..39]));
        assert_has(&e, &["esp.enc_in", "odd number of hex digits (39)"]);
        let e = err(&minimal().replace(&format!("\"{K20A}\""), "12345"));
        assert_has(
            &e,
            &[
                "esp.enc_in",
                "a key must be a string of hex digits in quotes",
            ],
        );
        assert!(!e.contains("12345"), "{e}");
        // Whitespace and a 0x prefix are fine.
        let spaced = format!("0x{} {}\\t", &K20A[..20], &K20A[20..]);
        let c = parse_str(&minimal().replace(K20A, &spaced)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.connections[0].esp.as_ref().unwrap().enc_in[19], 0x13);
        assert_eq!(&decode_hex("0a 0B\n\t0c").unwrap()[..], &[10, 11, 12]);
    }

    #[cfg(unix)]
    #[test]
    fn key_files_readable_by_others_warn() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir();
        std::fs::create_dir(dir.join("keys")).unwrap();
        let src = examples_dir();
        for f in [
            "esp-ah-bundle.toml",
            "keys/mgmt.integ_in",
            "keys/mgmt.integ_out",
        ] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        let set = |f: &str, mode: u32| {
            std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(mode)).unwrap()
        };
        set("esp-ah-bundle.toml", 0o600);
        set("keys/mgmt.integ_in", 0o600);
        set("keys/mgmt.integ_out", 0o600);
        let c = load(&dir.join("esp-ah-bundle.toml")).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);

        set("keys/mgmt.integ_out", 0o644);
        let c = load(&dir.join("esp-ah-bundle.toml")).unwrap();
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert_has(
            &c.warnings[0],
            &[
                "connection[1].ah.integ_out_file (connection \"mgmt\")",
                "key file ",
                "keys/mgmt.integ_out is readable by group/others (mode 0644); chmod 600 it",
            ],
        );
        // Inline keys make the config file itself a secret.
        set("keys/mgmt.integ_out", 0o600);
        set("esp-ah-bundle.toml", 0o640);
        let c = load(&dir.join("esp-ah-bundle.toml")).unwrap();
        assert_has(
            &c.warnings.join("\n"),
            &["holds inline keys and is readable by group/others (mode 0640)"],
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sizes_and_durations() {
        let s = |v: &str| parse_size(&Scalar::Str(v.into()));
        assert_eq!(s("1G"), Ok(Some(1 << 30)));
        assert_eq!(s("512M"), Ok(Some(512 << 20)));
        assert_eq!(s("4k"), Ok(Some(4096)));
        assert_eq!(s("2TiB"), Ok(Some(2 << 40)));
        assert_eq!(s("10KB"), Ok(Some(10 << 10)));
        assert_eq!(s("1000"), Ok(Some(1000)));
        assert_eq!(s("0"), Ok(None));
        assert_eq!(parse_size(&Scalar::Int(5)), Ok(Some(5)));
        assert_eq!(parse_size(&Scalar::Int(0)), Ok(None));
        for bad in ["", "G", "1X", "1.5G", "-1", "1 G B", "99999999999T"] {
            assert!(s(bad).is_err(), "{bad:?}");
        }
        assert!(parse_size(&Scalar::Int(-1))
            .unwrap_err()
            .contains("negative"));

        let d = |v: &str| parse_duration(&Scalar::Str(v.into()));
        let secs = |n| Ok(Some(Duration::from_secs(n)));
        assert_eq!(d("90s"), secs(90));
        assert_eq!(d("50m"), secs(3000));
        assert_eq!(d("1h"), secs(3600));
        assert_eq!(d("1d"), secs(86400));
        assert_eq!(d("1h30m"), secs(5400));
        assert_eq!(d("2h 15s"), secs(7215));
        assert_eq!(d("120"), secs(120));
        assert_eq!(d("0s"), Ok(None));
        assert_eq!(parse_duration(&Scalar::Int(60)), secs(60));
        for bad in [
            "",
            "1w",
            "h",
            "1.5h",
            "10 minutes",
            "1h30",
            "-5s",
            "99999999999999999999s",
        ] {
            assert!(d(bad).is_err(), "{bad:?}");
        }

        // In a file: errors name the key.
        let life = |l: &str| {
            minimal().replace(
                "name = \"b\"",
                &format!("name = \"b\"\nlifetime = {{ {l} }}"),
            )
        };
        let e = err(&life("soft_bytes = \"1Q\""));
        assert_has(
            &e,
            &["connection[0].lifetime.soft_bytes", "\"1Q\" is not a size"],
        );
        let e = err(&life("hard_time = \"1 fortnight\""));
        assert_has(
            &e,
            &["connection[0].lifetime.hard_time", "is not a duration"],
        );
        let e = err(&life("soft_time = \"2h\", hard_time = \"1h\""));
        assert_has(
            &e,
            &[
                "connection[0].lifetime.soft_time",
                "soft limit (7200) must be below the hard limit hard_time (3600)",
            ],
        );
        let e = err(&life("soft_packets = true"));
        assert_has(
            &e,
            &[
                "connection[0].lifetime.soft_packets",
                "an integer or a string",
            ],
        );
        let c = parse_str(&life("hard_packets = 1000000, soft_time = 60")).unwrap();
        let l = c.connections[0].lifetime;
        assert_eq!(
            (l.hard_packets, l.soft_time),
            (Some(1_000_000), Some(Duration::from_secs(60)))
        );
    }

    #[test]
    fn secrets_never_in_debug_or_errors() {
        let c = parse_str(&minimal()).unwrap();
        let dbg = format!("{c:?} {c:#?} {:?}", c.connections[0].sa_configs());
        for k in [K20A, K20B, &K20A[..8], &K20B[..8]] {
            assert!(!dbg.contains(k), "key material in Debug output");
        }
        let key = decode_hex(K20A).unwrap();
        assert!(
            !dbg.contains(&format!("{:?}", &key[..4])),
            "key bytes in Debug output"
        );
        assert!(dbg.contains("<redacted>"));
        let e = err(&minimal().replace(K20A, &K20A[..30]));
        assert!(!e.contains(&K20A[..30]), "{e}");
        let e = parse_str(&minimal().replace(K20A, &K20A[..30])).unwrap_err();
        assert!(!format!("{e:?}").contains(&K20A[..30]));
    }

    #[test]
    fn gateway_values_are_checked() {
        let g = |t: &str| format!("[gateway]\n{t}\n{}", minimal());
        assert_has(
            &err(&g("tun = \"a-very-long-tun-name\"")),
            &["gateway.tun", "1-15"],
        );
        assert_has(
            &err(&g("tun = \"tun/0\"")),
            &["gateway.tun", "contains '/'"],
        );
        assert_has(
            &err(&g("tun_address = [\"10.1.0.1/24\", \"10.1.0.1/33\"]")),
            &["gateway.tun_address[1]", "prefix length must be 0-32"],
        );
        assert_has(
            &err(&g("listen = \"0.0.0.0:0\"")),
            &["gateway.listen", "port 0"],
        );
        assert_has(
            &err(&g("listen = \"0.0.0.0\"")),
            &["gateway.listen", "not an address:port"],
        );
        assert_has(
            &err(&g("mtu = 100")),
            &["test.toml:2:7", "gateway.mtu", "MTU 100 is out of range"],
        );
        assert_has(
            &err(&g("workers = -1")),
            &["gateway.workers", "expected 0 (one per CPU) to 1024"],
        );
        assert_has(
            &err(&g("batch = 0")),
            &["gateway.batch", "expected 1 to 64 packets"],
        );
        assert_has(
            &err(&g("ike_fragment_size = 100")),
            &["gateway.ike_fragment_size", "expected 300 to 65000 bytes"],
        );
        assert_has(
            &err(&g("socket_buffer = 100")),
            &["gateway.socket_buffer", "expected 4096"],
        );
        assert_has(&err(&g("fwmark = 0")), &["gateway.fwmark", "omit fwmark"]);
        assert_has(
            &err(&g("fwmark = 254")),
            &["gateway.fwmark", "tables 252-255 are reserved"],
        );
        assert_has(
            &err(&g("state_dir = \"\"")),
            &["gateway.state_dir", "empty path"],
        );
        let not_dir = temp_dir().join("file");
        std::fs::write(&not_dir, "x").unwrap();
        assert_has(
            &err(&g(&format!("state_dir = \"{}\"", not_dir.display()))),
            &["gateway.state_dir", "is not a directory"],
        );
        assert_has(
            &err(&g("metrics = \"localhost\"")),
            &["gateway.metrics", "not an address:port"],
        );
        assert_has(
            &err(&g("listen = \"192.0.2.9:4500\"")),
            &["connection[0].local", "gateway.listen is 192.0.2.9:4500"],
        );
        let c = parse_str(&g(
            "tun = \"wg.0_a-b\"\ntun_address = [\"10.1.0.1/24\", \"2001:db8::1\"]\nlisten = \"[::]:4600\"\n\
             workers = 4\nmtu = 9000\ncontrol_socket = \"run/x.sock\"\nmetrics = \"[::1]:9184\"\n\
             log = \"debug\"\nfwmark = 0x4500\nstate_dir = \"state\"\ncost_accounting = true\n\
             batch = 8\nsocket_buffer = 65536",
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let gw = &c.gateway;
        assert_eq!(gw.tun_address[0].to_string(), "10.1.0.1/24");
        assert_eq!(gw.tun_address[0].network().to_string(), "10.1.0.0/24");
        assert_eq!(gw.tun_address[1].prefix_len, 128);
        assert_eq!(gw.control_socket, Path::new("/nonexistent/run/x.sock"));
        assert_eq!(gw.state_dir, Path::new("/nonexistent/state"));
        assert_eq!(
            (gw.workers, gw.mtu, gw.log, gw.fwmark),
            (4, 9000, LogLevel::Debug, Some(0x4500))
        );
        assert!(gw.cost_accounting);
        assert_eq!((gw.batch, gw.socket_buffer), (8, 65536));
        assert_eq!(c.connections[0].local_port, 4600);
        let v6 = minimal()
            .replace("192.0.2.1", "2001:db8::1")
            .replace("192.0.2.2", "2001:db8::2");
        assert_has(
            &err(&format!(
                "[gateway]\nmtu = 1000\nlisten = \"[::]:4500\"\n{v6}"
            )),
            &["gateway.mtu", "below 1280"],
        );
        assert_has(
            &err(&v6),
            &[
                "connection[0].local",
                "gateway.listen is 0.0.0.0:4500",
                "[::]:4500",
            ],
        );
    }

    #[test]
    fn connection_values_are_checked() {
        let c = |t: &str| minimal().replace("name = \"b\"", &format!("name = \"b\"\n{t}"));
        assert_has(
            &err(&minimal().replace("name = \"b\"", "name = \"b c\"")),
            &["connection[0].name", "not a valid name"],
        );
        assert_has(
            &err(&c("remote_port = 0")),
            &["connection[0].remote_port", "not a port"],
        );
        assert_has(
            &err(&c("proto = \"tpc\"")),
            &["connection[0].proto", "expected \"any\""],
        );
        assert_has(&err(&c("proto = 300")), &["connection[0].proto"]);
        assert_has(
            &err(&c("mss_clamp = 10")),
            &["connection[0].mss_clamp", "not a usable MSS"],
        );
        assert_has(
            &err(&c("ecn = \"compat\"")),
            &["connection[0].ecn", "only \"normal\""],
        );
        assert_has(
            &err(&c("replay_window = 100000")),
            &["connection[0].replay_window", "65536"],
        );
        assert_has(
            &err(&c("tfc_pad_to = 70000")),
            &["connection[0].tfc_pad_to", "0-65535"],
        );
        assert_has(
            &err(&c("mode = \"transport\"\ntfc_pad_to = 1000")),
            &["connection[0].tfc_pad_to", "needs ESP in tunnel mode"],
        );
        let ok = parse_str(&c(
            "proto = 6\nmss_clamp = 1360\nreplay_window = 0\nesn = true",
        ))
        .unwrap();
        let b = &ok.connections[0];
        assert_eq!(
            (b.proto, b.mss_clamp),
            (IpProto::Number(6), MssClamp::Fixed(1360))
        );
        assert_has(
            &ok.warnings.join("\n"),
            &["replay_window", "disables anti-replay"],
        );
        assert_eq!(
            parse_str(&c("mss_clamp = \"off\"")).unwrap().connections[0].mss_clamp,
            MssClamp::Off
        );
        assert_eq!(
            parse_str(&c("proto = \"udp\"")).unwrap().connections[0].proto,
            IpProto::Number(17)
        );
    }

    #[test]
    fn sections_must_match_the_protocol() {
        let e = err(&minimal().replace(
            "name = \"b\"",
            "name = \"b\"\nprotocol = \"esp+ah\"\nencap = \"none\"",
        ));
        assert_has(&e, &["connection[0]", "needs a [connection.ah] table"]);
        let e = err(&format!(
            "{}[connection.ah]\nsuite = \"sha1\"\nspi_in = 0x3001\nspi_out = 0x3002\n",
            minimal()
        ));
        assert_has(
            &e,
            &[
                "connection[0].ah",
                "an AH SA is given but protocol = \"esp\"",
            ],
        );
        let only = "[[connection]]\nname = \"x\"\nlocal = \"192.0.2.1\"\nremote = \"192.0.2.2\"\n\
                    local_ts = [\"10.1.0.0/16\"]\nremote_ts = [\"10.2.0.0/16\"]\n";
        assert_has(
            &err(only),
            &[
                "test.toml:1:",
                "connection[0]",
                "needs a [connection.esp] table",
            ],
        );
    }

    #[test]
    fn same_key_both_ways() {
        let e = err(&minimal().replace(K20B, K20A));
        assert_has(&e, &["connection[0].esp.enc_out", "nonces repeat"]);
        let c = parse_str(&ah_conn("encap = \"none\"").replace(K20B, K20A)).unwrap();
        assert_has(&c.warnings.join("\n"), &["ah.integ_out", "reflect"]);
    }

    #[test]
    fn several_errors_at_once_in_file_order_with_positions() {
        let text = format!(
            "{}{}",
            conn("b", "", &good_esp(0x10, 0x1002)),
            conn("c", "", &good_esp(0x2001, 0x20)).replace("192.0.2.2", "192.0.2.3")
        );
        let e = parse_str(&text).unwrap_err();
        assert_eq!(e.diagnostics.len(), 2, "{e}");
        let s = e.to_string();
        assert!(s.starts_with("2 errors in test.toml:\n"), "{s}");
        assert_eq!(e.diagnostics[0].path, "connection[0].esp.spi_in");
        assert_eq!(e.diagnostics[0].connection.as_deref(), Some("b"));
        let line = text
            .lines()
            .position(|l| l.starts_with("spi_in = 0x10"))
            .unwrap()
            + 1;
        assert_eq!(e.diagnostics[0].position, Some((line, 10)));
        assert_has(&s, &[&format!("test.toml:{line}:10: connection[0].esp.spi_in (connection \"b\"): SPI 0x10 is reserved")]);
        assert_eq!(e.diagnostics[1].path, "connection[1].esp.spi_out");
    }

    #[test]
    fn empty_file_warns_and_load_errors_name_the_file() {
        let c = parse_str("").unwrap();
        assert!(c.connections.is_empty());
        assert_has(&c.warnings.join("\n"), &["no [[connection]]"]);
        let e = load(Path::new("/nonexistent/espgate.toml")).unwrap_err();
        assert_has(
            &e.to_string(),
            &["/nonexistent/espgate.toml: cannot read the file"],
        );
    }

    #[test]
    fn overlapping_selectors_warn() {
        let text = format!(
            "{}{}",
            conn("b", "", &good_esp(0x1001, 0x1002)),
            conn("c", "", &good_esp(0x2001, 0x2002))
                .replace("10.2.0.0/16", "10.2.1.0/24")
                .replace("192.0.2.2", "192.0.2.3")
        );
        let c = parse_str(&text).unwrap();
        assert_has(
            &c.warnings.join("\n"),
            &["connection[1].remote_ts", "overlap", "\"b\""],
        );
    }

    #[test]
    fn per_cpu_keys_are_derived_distinct_and_checked() {
        let k = [0x42u8; 20];
        assert_eq!(per_cpu_key(&k, 0).to_vec(), k.to_vec());
        let k1 = per_cpu_key(&k, 1);
        let k2 = per_cpu_key(&k, 2);
        assert_eq!((k1.len(), k2.len()), (20, 20));
        assert_ne!(k1.to_vec(), k.to_vec());
        assert_ne!(k1.to_vec(), k2.to_vec());
        assert_eq!(per_cpu_key(&k, 1).to_vec(), k1.to_vec(), "deterministic");
        // Longer keys than one HMAC block.
        assert_eq!(per_cpu_key(&[1u8; 68], 3).len(), 68);
        let c = parse_str(&conn("b", "per_cpu_sas = 3", &good_esp(0x1001, 0x2001)))
            .unwrap_or_else(|e| panic!("{e}"));
        let sas = c.connections[0].sa_configs();
        let spis: Vec<u32> = sas.outbound.iter().map(|s| s.spi).collect();
        let base = spis[0];
        assert_eq!(spis, [base, base + 1, base + 2]);
        assert_eq!(sas.inbound.len(), 3);
        assert_has(
            &err(&conn("b", "per_cpu_sas = 0", &good_esp(0x1001, 0x2001))),
            &["per_cpu_sas", "expected 1 to 64"],
        );
        let many = conn("b", "per_cpu_sas = 2000000", &good_esp(0x1001, 0x2001));
        assert_has(&err(&many), &["per_cpu_sas", "expected 1 to 64"]);
        assert_has(
            &err(&conn("b", "per_cpu_sas = 2", &good_esp(0x1001, 0x1002))),
            &["per_cpu_sas", "overlap"],
        );
        assert_has(
            &err(&conn(
                "b",
                "per_cpu_sas = 2\nencap = \"none\"",
                &good_esp(0x1001, 0x2001),
            )),
            &["per_cpu_sas", "encap = \"udp\""],
        );
    }

    // -----------------------------------------------------------------
    // [connection.ike]
    // -----------------------------------------------------------------

    use crate::ike::{ike_config, start_on_boot};
    use espgate_ike::wire::TrafficSelector as Ts;

    const PSK_HEX: &str = "0x00112233445566778899aabbccddeeff0011223344556677";

    fn write_mode(dir: &Path, name: &str, data: &[u8], mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A temp dir with `psk` (mode 0600) holding PSK_HEX.
    fn ike_dir() -> PathBuf {
        let d = temp_dir();
        write_mode(&d, "psk", format!("{PSK_HEX}\n").as_bytes(), 0o600);
        d
    }

    /// One IKE connection: `extra` in the connection table, `ike` in its
    /// IKE table.
    fn ike_conn(extra: &str, ike: &str) -> String {
        format!(
            r#"
[[connection]]
name = "ik"
local = "192.0.2.1"
remote = "198.51.100.2"
local_ts = ["10.1.0.0/16"]
remote_ts = ["10.2.0.0/16"]
{extra}

[connection.ike]
{ike}
"#
        )
    }

    fn ike_parse(dir: &Path, text: &str) -> Result<LoadedConfig, ConfigError> {
        parse(text, dir, "ike.toml")
    }

    fn ike_ok(dir: &Path, text: &str) -> LoadedConfig {
        ike_parse(dir, text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn ike_err(dir: &Path, text: &str) -> String {
        match ike_parse(dir, text) {
            Ok(c) => panic!("expected an error, got {c:#?}"),
            Err(e) => e.to_string(),
        }
    }

    fn specs(kind: ProposalKind, list: &[&str]) -> Vec<ProposalSpec> {
        list.iter()
            .map(|s| ProposalSpec::parse(kind, s).unwrap())
            .collect()
    }

    #[test]
    fn ike_psk_defaults_and_engine_config() {
        let d = ike_dir();
        let c = ike_ok(&d, &ike_conn("", "psk_file = \"psk\""));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let k = &c.connections[0];
        assert!(k.esp.is_none() && k.ah.is_none());
        let sas = k.sa_configs();
        assert!(sas.inbound.is_empty() && sas.outbound.is_empty());
        let s = k.ike.as_ref().unwrap();
        assert_eq!(
            s.proposals,
            specs(
                ProposalKind::Ike,
                &["aes128gcm16-prfsha256-x25519", "aes256-sha256-modp2048"]
            )
        );
        assert_eq!(
            s.esp_proposals,
            specs(ProposalKind::Esp, &["aes128gcm16", "aes256-sha256"])
        );
        assert_eq!(s.local_id, Identity::Ipv4("192.0.2.1".parse().unwrap()));
        assert_eq!(
            s.remote_id,
            Some(Identity::Ipv4("198.51.100.2".parse().unwrap()))
        );
        assert_eq!(
            (s.auth(), s.remote_auth_method()),
            (AuthMethod::Psk, AuthMethod::Psk)
        );
        let want_psk = decode_hex(PSK_HEX).unwrap();
        match (&s.local_auth, &s.remote_auth) {
            (LocalAuth::Psk(a), RemoteAuth::Psk(b)) => {
                assert_eq!((&a[..], &b[..]), (&want_psk[..], &want_psk[..]));
                assert_eq!(a.len(), 24);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.start_action, StartAction::None);
        assert_eq!(s.rekey_time, Duration::from_secs(4 * 3600));
        assert_eq!(s.child_rekey_time, Duration::from_secs(3600));
        assert_eq!(s.child_life_time, Duration::from_secs(3960));
        assert_eq!(s.jitter, Duration::from_secs(360));
        assert_eq!(s.dpd_delay, Duration::from_secs(30));
        assert_eq!(s.dpd_action, DpdAction::Clear);
        assert_eq!(
            s.retransmit,
            Retransmit {
                timeout: Duration::from_secs(4),
                base: 1.8,
                tries: 5
            }
        );
        assert!(s.force_encap, "encap defaults to udp");
        assert!(!start_on_boot(k));

        let e = ike_config(k).unwrap();
        assert_eq!(e.name, "ik");
        assert_eq!(e.local, "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(e.remote, "198.51.100.2".parse::<IpAddr>().unwrap());
        assert_eq!(e.local_id, s.local_id);
        assert_eq!(e.remote_id, s.remote_id);
        assert_eq!(e.proposals, s.proposals);
        assert_eq!(e.child.proposals, s.esp_proposals);
        assert_eq!(e.child.mode, Mode::Tunnel);
        assert_eq!(
            e.child.local_ts,
            vec![Ts::Ipv4 {
                ip_protocol: 0,
                start_port: 0,
                end_port: 65535,
                start: "10.1.0.0".parse().unwrap(),
                end: "10.1.255.255".parse().unwrap(),
            }]
        );
        assert_eq!(
            e.child.remote_ts,
            vec![Ts::Ipv4 {
                ip_protocol: 0,
                start_port: 0,
                end_port: 65535,
                start: "10.2.0.0".parse().unwrap(),
                end: "10.2.255.255".parse().unwrap(),
            }]
        );
        assert_eq!(
            (e.child.rekey_time, e.child.life_time, e.child.jitter),
            (s.child_rekey_time, s.child_life_time, s.jitter)
        );
        assert_eq!((e.rekey_time, e.jitter), (s.rekey_time, s.jitter));
        assert_eq!((e.dpd_delay, e.dpd_action), (s.dpd_delay, s.dpd_action));
        assert_eq!((e.retransmit, e.force_encap), (s.retransmit, true));
        assert!(matches!(e.local_auth, LocalAuth::Psk(_)));
        assert!(matches!(e.remote_auth, RemoteAuth::Psk(_)));

        // A connection without IKE has no engine configuration.
        let m = parse_str(&minimal()).unwrap();
        assert!(m.connections[0].ike.is_none());
        assert!(ike_config(&m.connections[0]).is_none());
        assert!(!start_on_boot(&m.connections[0]));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ike_values_are_used() {
        let d = ike_dir();
        let c = ike_ok(
            &d,
            &ike_conn(
                "proto = \"icmp\"\nlocal_ts = [\"10.1.0.0/16\", \"2001:db8:1::/48\"]\n\
                 remote_ts = [\"10.2.0.7/32\", \"2001:db8:2::/48\"]\nencap = \"none\"",
                r#"psk_file = "psk"
proposals = ["aes256gcm16-prfsha384-ecp384,chacha20poly1305-prfsha256-x25519"]
esp_proposals = ["aes256gcm16-esn-x25519"]
local_id = "moon.example"
remote_id = "%any"
start_action = "start"
rekey_time = "1d"
child_rekey_time = "10m"
child_life_time = "15m"
jitter = "1m"
dpd_delay = 0
dpd_action = "restart"
retransmit_timeout = "2s"
retransmit_tries = 3"#,
            )
            // Two local_ts/remote_ts keys would be a TOML error: drop the defaults.
            .replacen(
                "local_ts = [\"10.1.0.0/16\"]\nremote_ts = [\"10.2.0.0/16\"]\n",
                "",
                1,
            ),
        );
        let k = &c.connections[0];
        let s = k.ike.as_ref().unwrap();
        assert_eq!(
            s.proposals,
            specs(
                ProposalKind::Ike,
                &[
                    "aes256gcm16-prfsha384-ecp384",
                    "chacha20poly1305-prfsha256-x25519"
                ]
            )
        );
        assert_eq!(s.esp_proposals[0].esn, vec![true]);
        assert_eq!(s.local_id, Identity::Fqdn("moon.example".into()));
        assert_eq!(s.remote_id, None);
        assert!(start_on_boot(k));
        assert_eq!(
            (
                s.rekey_time,
                s.child_rekey_time,
                s.child_life_time,
                s.jitter
            ),
            (
                Duration::from_secs(86400),
                Duration::from_secs(600),
                Duration::from_secs(900),
                Duration::from_secs(60)
            )
        );
        assert_eq!(
            (s.dpd_delay, s.dpd_action),
            (Duration::ZERO, DpdAction::Restart)
        );
        assert_eq!(
            (s.retransmit.timeout, s.retransmit.tries),
            (Duration::from_secs(2), 3)
        );
        assert!(!s.force_encap, "encap none: no forced encapsulation");
        let e = ike_config(k).unwrap();
        let protos = |v: &[Ts]| {
            v.iter()
                .map(|t| match t {
                    Ts::Ipv4 { ip_protocol, .. } => (4, *ip_protocol),
                    Ts::Ipv6 { ip_protocol, .. } => (6, *ip_protocol),
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        // ICMP per family: 1 for IPv4, 58 for IPv6.
        assert_eq!(protos(&e.child.local_ts), [(4, 1), (6, 58)]);
        assert_eq!(protos(&e.child.remote_ts), [(4, 1), (6, 58)]);
        assert!(matches!(
            e.child.remote_ts[0],
            Ts::Ipv4 { start, end, .. } if start == end && start == "10.2.0.7".parse::<std::net::Ipv4Addr>().unwrap()
        ));

        // Transport mode: the selectors are the two hosts.
        let c = ike_ok(
            &d,
            &ike_conn("mode = \"transport\"", "psk_file = \"psk\"").replacen(
                "local_ts = [\"10.1.0.0/16\"]\nremote_ts = [\"10.2.0.0/16\"]\n",
                "",
                1,
            ),
        );
        let e = ike_config(&c.connections[0]).unwrap();
        assert_eq!(e.child.mode, Mode::Transport);
        assert!(matches!(
            e.child.local_ts[..],
            [Ts::Ipv4 { start, end, ip_protocol: 0, .. }] if start == end && start.octets() == [192, 0, 2, 1]
        ));

        // The jitter default follows the smaller rekey time.
        let c = ike_ok(
            &d,
            &ike_conn("", "psk_file = \"psk\"\nrekey_time = \"10m\""),
        );
        assert_eq!(
            c.connections[0].ike.as_ref().unwrap().jitter,
            Duration::from_secs(60)
        );
        // No rekeying at all: no jitter, no lifetime.
        let c = ike_ok(
            &d,
            &ike_conn(
                "",
                "psk_file = \"psk\"\nrekey_time = 0\nchild_rekey_time = 0",
            ),
        );
        let s = c.connections[0].ike.as_ref().unwrap();
        assert_eq!(
            (s.jitter, s.child_life_time),
            (Duration::ZERO, Duration::ZERO)
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn psk_files_text_hex_and_permissions() {
        let d = temp_dir();
        let load_psk = |data: &[u8], mode: u32| {
            write_mode(&d, "p", data, mode);
            ike_parse(&d, &ike_conn("", "psk_file = \"p\""))
        };
        let psk_of = |c: &LoadedConfig| match &c.connections[0].ike.as_ref().unwrap().local_auth {
            LocalAuth::Psk(k) => k.to_vec(),
            other => panic!("{other:?}"),
        };
        let text = b"correct horse battery staple";
        for (data, want) in [
            (&b"correct horse battery staple\n"[..], &text[..]),
            (b"correct horse battery staple\r\n", text),
            (b"correct horse battery staple", text),
            // Only one final newline goes.
            (
                b"correct horse battery staple\n\n",
                b"correct horse battery staple\n",
            ),
            (
                b"0X0001020304050607 08090a0b0c0d0e0f\n10111213\n",
                &[
                    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                ],
            ),
        ] {
            let c = load_psk(data, 0o600).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(psk_of(&c), want, "{:?}", String::from_utf8_lossy(data));
            assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        }
        // Group or other access of any kind is refused.
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o660] {
            let e = load_psk(b"correct horse battery staple", mode)
                .unwrap_err()
                .to_string();
            assert_has(
                &e,
                &[
                    "connection[0].ike.psk_file (connection \"ik\")",
                    "is readable or writable by group/others",
                    &format!("(mode {mode:04o})"),
                    "chmod 600",
                ],
            );
            assert!(!e.contains("horse"), "{e}");
        }
        assert!(load_psk(b"correct horse battery staple", 0o400).is_ok());
        // Empty, bad hex, short.
        for data in [&b""[..], b"\n", b"0x"] {
            let e = load_psk(data, 0o600).unwrap_err().to_string();
            assert_has(&e, &["ike.psk_file", "empty"]);
        }
        let e = load_psk(b"0xsecretsecretsecret", 0o600)
            .unwrap_err()
            .to_string();
        assert_has(&e, &["ike.psk_file", "starts with 0x but is not hex"]);
        assert!(!e.contains("secret"), "{e}");
        let c = load_psk(b"tensecrets", 0o600).unwrap();
        assert_has(
            &c.warnings.join("\n"),
            &["ike.psk_file", "a 10-byte pre-shared key", "at least 20"],
        );
        assert!(!c.warnings.join("\n").contains("tensecrets"));
        // Missing file.
        let e = ike_err(&d, &ike_conn("", "psk_file = \"nope\""));
        assert_has(&e, &["ike.psk_file", "cannot read psk_file", "nope"]);
        // Debug output never shows the key.
        let c = load_psk(b"correct horse battery staple", 0o600).unwrap();
        let dbg = format!("{c:?}");
        assert!(
            !dbg.contains("horse") && !dbg.contains("99, 111, 114"),
            "{dbg}"
        );
        let c = load_psk(PSK_HEX.as_bytes(), 0o600).unwrap();
        let dbg = format!("{c:#?}");
        assert!(
            !dbg.contains("0011223344") && !dbg.contains("136, 153"),
            "{dbg}"
        );
        assert!(dbg.contains("local_auth: psk"), "{dbg}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ike_connection_level_errors() {
        let d = ike_dir();
        // Both [connection.esp] and [connection.ike].
        let text = format!(
            "{}\n[connection.esp]\nsuite = \"aes128gcm16\"\n{}",
            ike_conn("", "psk_file = \"psk\""),
            good_esp(0x1001, 0x1002)
        );
        assert_has(
            &ike_err(&d, &text),
            &["connection[0].esp (connection \"ik\")", "are both given"],
        );
        // Only ESP.
        let e = ike_err(
            &d,
            &ike_conn(
                "protocol = \"esp+ah\"\nencap = \"none\"",
                "psk_file = \"psk\"",
            ),
        );
        assert_has(&e, &["connection[0].protocol", "negotiates ESP SAs only"]);
        assert!(!e.contains("needs a [connection"), "{e}");
        // Per-CPU SAs are manual.
        assert_has(
            &ike_err(&d, &ike_conn("per_cpu_sas = 2", "psk_file = \"psk\"")),
            &["connection[0].per_cpu_sas", "manually keyed only"],
        );
        // Several workers are fine with IKE (the IKE engine runs on worker
        // 0 and installs each SA into every worker).
        let text = format!(
            "[gateway]\nworkers = 2\n{}",
            ike_conn("", "psk_file = \"psk\"")
        );
        ike_ok(&d, &text);
        assert!(parse_str(&format!("[gateway]\nworkers = 2\n{}", minimal())).is_ok());
        // esn is negotiated.
        let c = ike_ok(&d, &ike_conn("esn = true", "psk_file = \"psk\""));
        assert_has(
            &c.warnings.join("\n"),
            &["connection[0].esn", "esp_proposals"],
        );
        // Unknown keys and wrong values are refused with their path.
        assert_has(
            &ike_err(&d, &ike_conn("", "psk_file = \"psk\"\nsecret = \"x\"")),
            &["connection[0].ike.secret", "unknown field `secret`"],
        );
        assert_has(
            &ike_err(&d, &ike_conn("", "psk_file = \"psk\"\nauth = \"cert\"")),
            &[
                "connection[0].ike.auth",
                "unknown variant `cert`",
                "`psk`",
                "`pubkey`",
            ],
        );
        assert_has(
            &ike_err(
                &d,
                &ike_conn("", "psk_file = \"psk\"\nstart_action = \"trap\""),
            ),
            &["connection[0].ike.start_action", "`none`", "`start`"],
        );
        assert_has(
            &ike_err(
                &d,
                &ike_conn("", "psk_file = \"psk\"\ndpd_action = \"hold\""),
            ),
            &["connection[0].ike.dpd_action", "`clear`", "`restart`"],
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ike_value_errors_name_their_key() {
        let d = ike_dir();
        let cases: &[(&str, &[&str])] = &[
            ("", &["connection[0].ike (connection \"ik\")", "auth = \"psk\" (the default) needs psk_file"]),
            (
                "psk_file = \"psk\"\nproposals = [\"aes128gcm16-prfsha256-x25519\", \"aes999-sha256-modp2048\"]",
                &["connection[0].ike.proposals[1]", "unknown algorithm 'aes999'"],
            ),
            (
                "psk_file = \"psk\"\nproposals = [\"aes128gcm16-prfsha256\"]",
                &["ike.proposals[0]", "needs a key exchange group"],
            ),
            ("psk_file = \"psk\"\nproposals = []", &["ike.proposals", "an empty list"]),
            (
                "psk_file = \"psk\"\nesp_proposals = [\"aes128gcm16-prfsha256\"]",
                &["ike.esp_proposals[0]", "is a PRF"],
            ),
            ("psk_file = \"psk\"\nlocal_id = \"%any\"", &["ike.local_id", "for remote_id only"]),
            ("psk_file = \"psk\"\nremote_id = \"@\"", &["ike.remote_id", "\"@\""]),
            (
                "psk_file = \"psk\"\njitter = \"30m\"",
                &["ike.jitter", "30m is not below half of child_rekey_time (1h)"],
            ),
            (
                "psk_file = \"psk\"\nrekey_time = \"20m\"\njitter = \"10m\"",
                &["ike.jitter", "half of rekey_time (20m)"],
            ),
            (
                "psk_file = \"psk\"\nchild_life_time = \"1h\"",
                &["ike.child_life_time", "1h is not above child_rekey_time (1h)"],
            ),
            (
                "psk_file = \"psk\"\nchild_rekey_time = \"2h\"",
                &["ike.child_life_time", "2h12m is not above child_rekey_time (2h)"],
            )
                // The default life is 1.1 × rekey: always above. (Checked below.)
                ,
            ("psk_file = \"psk\"\nrekey_time = \"1x\"", &["ike.rekey_time", "is not a duration"]),
            ("psk_file = \"psk\"\ndpd_delay = \"400d\"", &["ike.dpd_delay", "too long: at most 365d"]),
            ("psk_file = \"psk\"\nretransmit_timeout = 0", &["ike.retransmit_timeout", "at least 1 second"]),
            ("psk_file = \"psk\"\nretransmit_tries = 21", &["ike.retransmit_tries", "0 to 20"]),
            (
                "psk_file = \"psk\"\nca = \"x\"",
                &["ike.ca", "only used with remote_auth = \"pubkey\"", "(the default: as auth)"],
            ),
            (
                "psk_file = \"psk\"\nprivate_key = \"x\"",
                &["ike.private_key", "only used with auth = \"pubkey\""],
            ),
            (
                "psk_file = \"psk\"\ncert = \"x\"",
                &["ike.cert", "only used with auth = \"pubkey\""],
            ),
            (
                "auth = \"pubkey\"\nremote_auth = \"psk\"\npsk_file = \"psk\"",
                &["connection[0].ike (connection \"ik\")", "auth = \"pubkey\" needs private_key"],
            ),
        ];
        for (ike, want) in cases {
            let text = ike_conn("", ike);
            if ike.contains("child_rekey_time = \"2h\"") {
                // Not an error: the default lifetime is 2h12m.
                let c = ike_ok(&d, &text);
                assert_eq!(
                    c.connections[0].ike.as_ref().unwrap().child_life_time,
                    Duration::from_secs(7920)
                );
                continue;
            }
            assert_has(&ike_err(&d, &text), want);
        }
        // force_encap needs UDP.
        assert_has(
            &ike_err(
                &d,
                &ike_conn("encap = \"none\"", "psk_file = \"psk\"\nforce_encap = true"),
            ),
            &["ike.force_encap", "encap = \"none\""],
        );
        let c = ike_ok(&d, &ike_conn("", "psk_file = \"psk\"\nforce_encap = false"));
        assert!(!c.connections[0].ike.as_ref().unwrap().force_encap);
        // child_rekey_time = 0 with a lifetime warns.
        let c = ike_ok(
            &d,
            &ike_conn(
                "",
                "psk_file = \"psk\"\nchild_rekey_time = 0\nchild_life_time = \"1h\"",
            ),
        );
        assert_has(
            &c.warnings.join("\n"),
            &["ike.child_rekey_time", "never rekeyed"],
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A temp dir with the example key files, secrets at mode 0600.
    fn example_keys_dir() -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let d = temp_dir();
        std::fs::create_dir(d.join("keys")).unwrap();
        let src = examples_dir();
        for f in [
            "ike-psk.toml",
            "ike-cert.toml",
            "keys/ike-psk.secret",
            "keys/ca.crt",
            "keys/moon.key",
            "keys/moon.crt",
            "keys/sun.key",
            "keys/sun.crt",
            "keys/moon-ed25519.key",
            "keys/moon-ed25519.pub",
            "keys/venus-ed25519.key",
            "keys/venus-ed25519.pub",
        ] {
            std::fs::copy(src.join(f), d.join(f)).unwrap();
            let mode = if f.ends_with(".key") || f.ends_with(".secret") {
                0o600
            } else {
                0o644
            };
            std::fs::set_permissions(d.join(f), std::fs::Permissions::from_mode(mode)).unwrap();
        }
        d
    }

    #[test]
    fn ike_examples_load() {
        let d = example_keys_dir();
        let c = load(&d.join("ike-psk.toml")).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let b = c.connection("site-b").unwrap();
        let s = b.ike.as_ref().unwrap();
        assert!(start_on_boot(b));
        assert_eq!(s.dpd_action, DpdAction::Restart);
        match &s.local_auth {
            LocalAuth::Psk(k) => assert_eq!(k.len(), 44),
            other => panic!("{other:?}"),
        }

        let c = load(&d.join("ike-cert.toml")).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let sun = c.connection("sun").unwrap();
        let s = sun.ike.as_ref().unwrap();
        assert!(start_on_boot(sun));
        assert_eq!(s.local_id, Identity::Fqdn("moon.example".into()));
        assert_eq!(s.remote_id, Some(Identity::Fqdn("sun.example".into())));
        let moon_crt =
            Certificate::from_pem(&std::fs::read(d.join("keys/moon.crt")).unwrap()).unwrap();
        match &s.local_auth {
            LocalAuth::Signature { key, certs } => {
                assert_eq!(certs, &moon_crt);
                assert_eq!(
                    key.public_key().spki_der(),
                    moon_crt[0].public_key().unwrap().spki_der()
                );
            }
            other => panic!("{other:?}"),
        }
        match &s.remote_auth {
            RemoteAuth::Ca(cas) => {
                assert_eq!(cas.len(), 1);
                let sun_crt =
                    Certificate::from_pem(&std::fs::read(d.join("keys/sun.crt")).unwrap()).unwrap();
                // The example chain verifies (openssl verify agrees, see the example).
                espgate_ike::cert::verify_chain(&sun_crt[0], &[], cas, 1_900_000_000).unwrap();
                assert!(sun_crt[0].matches_identity(s.remote_id.as_ref().unwrap()));
            }
            other => panic!("{other:?}"),
        }
        let venus = c.connection("venus").unwrap();
        let v = venus.ike.as_ref().unwrap();
        assert!(!start_on_boot(venus));
        let venus_pub =
            PublicKey::from_pem(&std::fs::read(d.join("keys/venus-ed25519.pub")).unwrap()).unwrap();
        match (&v.local_auth, &v.remote_auth) {
            (LocalAuth::Signature { key, certs }, RemoteAuth::PublicKey(p)) => {
                assert!(certs.is_empty());
                assert_eq!(p, &venus_pub);
                let moon_pub =
                    PublicKey::from_pem(&std::fs::read(d.join("keys/moon-ed25519.pub")).unwrap())
                        .unwrap();
                assert_eq!(key.public_key(), moon_pub);
            }
            other => panic!("{other:?}"),
        }
        let e = ike_config(venus).unwrap();
        assert!(matches!(e.remote_auth, RemoteAuth::PublicKey(_)));
        // Nothing secret in Debug.
        let dbg = format!("{c:?}");
        let key_pem = std::fs::read_to_string(d.join("keys/moon.key")).unwrap();
        let body = key_pem.lines().nth(1).unwrap();
        assert!(!dbg.contains(body), "{dbg}");

        // As git checks them out (0644), the PSK example is refused and the
        // key files warn.
        use std::os::unix::fs::PermissionsExt;
        for f in [
            "keys/ike-psk.secret",
            "keys/moon.key",
            "keys/moon-ed25519.key",
        ] {
            std::fs::set_permissions(d.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let e = load(&d.join("ike-psk.toml")).unwrap_err().to_string();
        assert_has(
            &e,
            &["ike-psk.toml:", "connection[0].ike.psk_file", "chmod 600"],
        );
        let c = load(&d.join("ike-cert.toml")).unwrap();
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        for w in &c.warnings {
            assert_has(w, &["ike.private_key", "chmod 600"]);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ike_signature_auth_errors() {
        let d = example_keys_dir();
        let pk = |ike: &str| format!("auth = \"pubkey\"\n{ike}");
        let cases: &[(&str, &[&str])] = &[
            (
                "private_key = \"keys/moon.key\"",
                &[
                    "connection[0].ike (connection \"ik\")",
                    "remote_auth = \"pubkey\" (the default: as auth) needs ca",
                ],
            ),
            (
                "private_key = \"keys/moon.key\"\nca = \"keys/ca.crt\"\nremote_public_key = \"keys/venus-ed25519.pub\"",
                &["ike.remote_public_key", "both given"],
            ),
            (
                "private_key = \"keys/moon.key\"\nca = \"keys/ca.crt\"\npsk_file = \"keys/ike-psk.secret\"",
                &["ike.psk_file", "not used"],
            ),
            (
                "private_key = \"keys/sun.key\"\ncert = \"keys/moon.crt\"\nca = \"keys/ca.crt\"",
                &["ike.cert", "is not for the ECDSA P-256 key in private_key"],
            ),
            (
                "private_key = \"keys/moon.crt\"\nca = \"keys/ca.crt\"",
                &["ike.private_key", "private key file", "no PRIVATE KEY block"],
            ),
            (
                "private_key = \"keys/moon.key\"\nca = \"keys/moon.key\"",
                &["ike.ca", "certificate file", "no CERTIFICATE block"],
            ),
            (
                "private_key = \"keys/moon.key\"\nremote_public_key = \"keys/moon.crt\"",
                &["ike.remote_public_key", "public key file", "PUBLIC KEY"],
            ),
            (
                "private_key = \"keys/moon.key\"\nremote_public_key = \"keys/none.pub\"",
                &["ike.remote_public_key", "cannot read public key file", "none.pub"],
            ),
        ];
        for (ike, want) in cases {
            assert_has(&ike_err(&d, &ike_conn("", &pk(ike))), want);
        }
        // Mixed: we sign, the peer uses the PSK.
        let c = ike_ok(
            &d,
            &ike_conn(
                "",
                "auth = \"pubkey\"\nremote_auth = \"psk\"\nprivate_key = \"keys/moon.key\"\n\
                 psk_file = \"keys/ike-psk.secret\"",
            ),
        );
        let s = c.connections[0].ike.as_ref().unwrap();
        assert_eq!(
            (s.auth(), s.remote_auth_method()),
            (AuthMethod::Pubkey, AuthMethod::Psk)
        );

        // The certificate binds the default identity (our address is in its
        // subjectAltName)...
        let good =
            "private_key = \"keys/moon.key\"\ncert = \"keys/moon.crt\"\nca = \"keys/ca.crt\"";
        let c = ike_ok(&d, &ike_conn("", &pk(good)));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        // ...but not another address, nor another name.
        let c = ike_ok(
            &d,
            &ike_conn("", &pk(good)).replace("local = \"192.0.2.1\"", "local = \"192.0.2.9\""),
        );
        assert_has(
            &c.warnings.join("\n"),
            &[
                "connection[0].ike.cert",
                "does not bind local_id 192.0.2.9 (local_id defaults to the local address)",
                "local_id = \"C=CH, O=espgate example, CN=moon.example\"",
            ],
        );
        let c = ike_ok(
            &d,
            &ike_conn("", &pk(&format!("{good}\nlocal_id = \"sun.example\""))),
        );
        assert_has(
            &c.warnings.join("\n"),
            &[
                "connection[0].ike.local_id",
                "does not bind local_id sun.example",
            ],
        );
        // The subject DN binds.
        let c = ike_ok(
            &d,
            &ike_conn(
                "",
                &pk(&format!(
                    "{good}\nlocal_id = \"C=CH, O=espgate example, CN=moon.example\""
                )),
            ),
        );
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
