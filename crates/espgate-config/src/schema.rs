//! The file as written: serde structs for every table and key, read once
//! with [`toml::Spanned`] on the values whose problems are reported (so
//! each diagnostic has its line and column), and written back with
//! `toml::to_string` by tools that make configuration files (the lab, the
//! demo) and by `espgate config check` (the effective configuration).
//!
//! Nothing here is validated: [`crate::parse`] checks these tables and
//! turns them into the types of [`crate::gateway`], [`crate::connection`],
//! [`crate::sa`] and [`crate::ike`]. Each key is documented in
//! `docs/CONFIG.md`.

use crate::diag::{line_col, ConfigError, Diagnostic};
use serde::de::{self, Deserializer, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;
use toml::Spanned;
use zeroize::Zeroizing;

/// A value made in code, for a table written with `toml::to_string`: it
/// has no position in a file.
pub fn value<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}

/// A whole configuration file.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// `[gateway]`.
    #[serde(default)]
    pub gateway: Option<Spanned<GatewayTable>>,
    /// `[[connection]]`, in file order.
    #[serde(default)]
    pub connection: Vec<Spanned<ConnectionTable>>,
    /// `[cluster]`: this gateway is a node of a flat cluster (seed 003).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Spanned<ClusterTable>>,
}

/// `[cluster]`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTable {
    /// The cluster's name (its etcd key prefix).
    pub name: Option<Spanned<String>>,
    /// This node's id, 1 to 65535.
    pub node: Option<Spanned<i64>>,
    /// etcd endpoints.
    pub etcd: Option<Vec<Spanned<String>>>,
    /// CA of the etcd servers (TLS).
    pub etcd_ca: Option<Spanned<String>>,
    /// Client certificate for etcd (TLS).
    pub etcd_cert: Option<Spanned<String>>,
    /// Its key.
    pub etcd_key: Option<Spanned<String>>,
    /// etcd user.
    pub etcd_user: Option<Spanned<String>>,
    /// File with the etcd user's password.
    pub etcd_password_file: Option<Spanned<String>>,
    /// File with the cluster key (64 hex characters, mode 0600): the
    /// SAs the leader's IKE negotiates are kept in etcd encrypted under it.
    pub key_file: Option<Spanned<String>>,
    /// `packet-rr`, `packet-sqf`, `session-rr` or `session-sqf`.
    pub dispatch: Option<Spanned<String>>,
    /// Interface on the inside shared segment.
    pub inside: Option<Spanned<String>>,
    /// Interface on the outside shared segment.
    pub outside: Option<Spanned<String>>,
    /// Lease TTL.
    pub lease_ttl: Option<Spanned<Scalar>>,
    /// Forward on the last plan this long without etcd.
    pub hold: Option<Spanned<Scalar>>,
}

/// `[gateway]`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayTable {
    /// TUN device name.
    pub tun: Option<Spanned<String>>,
    /// Addresses put on the TUN device (`"10.1.0.1/24"`).
    pub tun_address: Option<Vec<Spanned<String>>>,
    /// UDP address:port for ESP-in-UDP and IKE.
    pub listen: Option<Spanned<String>>,
    /// Default encapsulation of the connections.
    pub encap: Option<Encapsulation>,
    /// Data-plane threads (0: one per CPU).
    pub workers: Option<Spanned<i64>>,
    /// Path MTU of the outer network.
    pub mtu: Option<Spanned<i64>>,
    /// Control socket path.
    pub control_socket: Option<Spanned<String>>,
    /// Prometheus endpoint address:port.
    pub metrics: Option<Spanned<String>>,
    /// Log level.
    pub log: Option<LogLevel>,
    /// Firewall mark of outer packets and routing table of the routes.
    pub fwmark: Option<Spanned<i64>>,
    /// Directory of the state kept across restarts.
    pub state_dir: Option<Spanned<String>>,
    /// UDP GSO/GRO offloads.
    pub offloads: Option<bool>,
    /// Per-stage cost accounting from the start.
    pub cost_accounting: Option<bool>,
    /// Packets per ready descriptor.
    pub batch: Option<Spanned<i64>>,
    /// Largest IKE fragment.
    pub ike_fragment_size: Option<Spanned<i64>>,
    /// Half-open IKE SAs before cookies are demanded.
    pub ike_cookie_threshold: Option<Spanned<i64>>,
    /// Most half-open IKE SAs.
    pub ike_half_open_limit: Option<Spanned<i64>>,
    /// Outer socket buffer size.
    pub socket_buffer: Option<Spanned<i64>>,
    /// IP protocol number of Q-ESP.
    pub qesp_protocol: Option<Spanned<i64>>,
}

/// One `[[connection]]`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionTable {
    /// Unique name.
    pub name: Spanned<String>,
    /// Our outer address.
    pub local: Spanned<String>,
    /// The peer's outer address.
    pub remote: Spanned<String>,
    /// The peer's UDP port.
    pub remote_port: Option<Spanned<i64>>,
    /// `tunnel` or `transport`.
    pub mode: Option<ModeName>,
    /// `esp`, `ah` or `esp+ah`.
    pub protocol: Option<Spanned<Protocols>>,
    /// `udp` or `none`.
    pub encap: Option<Spanned<Encapsulation>>,
    /// Our side's traffic selectors.
    pub local_ts: Option<Spanned<Vec<Spanned<String>>>>,
    /// The peer side's traffic selectors.
    pub remote_ts: Option<Spanned<Vec<Spanned<String>>>>,
    /// IP protocol of the selectors (name or number).
    pub proto: Option<Spanned<Scalar>>,
    /// Install routes for `remote_ts`.
    pub routes: Option<bool>,
    /// `auto`, `off` or an MSS.
    pub mss_clamp: Option<Spanned<Scalar>>,
    /// Fragment inner packets before encryption.
    pub fragment_inner: Option<Spanned<bool>>,
    /// `copy` or `clear`.
    pub dscp: Option<Dscp>,
    /// `normal`.
    pub ecn: Option<Spanned<String>>,
    /// Extended sequence numbers.
    pub esn: Option<Spanned<bool>>,
    /// Replay window in packets.
    pub replay_window: Option<Spanned<i64>>,
    /// NAT keepalive interval, seconds.
    pub nat_keepalive: Option<Spanned<i64>>,
    /// Allow legacy suites.
    pub allow_insecure: Option<bool>,
    /// TFC padding target.
    pub tfc_pad_to: Option<Spanned<i64>>,
    /// Per-CPU SA pairs.
    pub per_cpu_sas: Option<Spanned<i64>>,
    /// `[connection.lifetime]`.
    pub lifetime: Option<Spanned<LifetimeTable>>,
    /// `[connection.esp]`: the manual ESP SA pair.
    pub esp: Option<Spanned<SaTable>>,
    /// `[connection.ah]`: the manual AH SA pair.
    pub ah: Option<Spanned<SaTable>>,
    /// `[connection.ike]`: IKEv2 settings.
    pub ike: Option<Spanned<IkeTable>>,
}

impl ConnectionTable {
    /// A connection with its three required keys and nothing else.
    pub fn new(name: &str, local: &str, remote: &str) -> Self {
        ConnectionTable {
            name: value(name.to_string()),
            local: value(local.to_string()),
            remote: value(remote.to_string()),
            remote_port: None,
            mode: None,
            protocol: None,
            encap: None,
            local_ts: None,
            remote_ts: None,
            proto: None,
            routes: None,
            mss_clamp: None,
            fragment_inner: None,
            dscp: None,
            ecn: None,
            esn: None,
            replay_window: None,
            nat_keepalive: None,
            allow_insecure: None,
            tfc_pad_to: None,
            per_cpu_sas: None,
            lifetime: None,
            esp: None,
            ah: None,
            ike: None,
        }
    }
}

/// `[connection.lifetime]`: sizes and durations, 0 for no limit.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifetimeTable {
    /// Bytes before the soft expiry.
    pub soft_bytes: Option<Spanned<Scalar>>,
    /// Bytes before the SA is removed.
    pub hard_bytes: Option<Spanned<Scalar>>,
    /// Packets before the soft expiry.
    pub soft_packets: Option<Spanned<Scalar>>,
    /// Packets before the SA is removed.
    pub hard_packets: Option<Spanned<Scalar>>,
    /// Time before the soft expiry.
    pub soft_time: Option<Spanned<Scalar>>,
    /// Time before the SA is removed.
    pub hard_time: Option<Spanned<Scalar>>,
}

/// `[connection.esp]` or `[connection.ah]`: one manually keyed SA pair.
/// Each key is given inline (hex) or as a file holding the hex.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaTable {
    /// Algorithms (strongSwan keyword).
    pub suite: Spanned<String>,
    /// SPI of the SA we receive on.
    pub spi_in: Spanned<Scalar>,
    /// SPI of the SA we send on.
    pub spi_out: Spanned<Scalar>,
    /// Inbound encryption key.
    pub enc_in: Option<Spanned<SecretHex>>,
    /// Outbound encryption key.
    pub enc_out: Option<Spanned<SecretHex>>,
    /// Inbound integrity key.
    pub integ_in: Option<Spanned<SecretHex>>,
    /// Outbound integrity key.
    pub integ_out: Option<Spanned<SecretHex>>,
    /// File holding `enc_in`.
    pub enc_in_file: Option<Spanned<String>>,
    /// File holding `enc_out`.
    pub enc_out_file: Option<Spanned<String>>,
    /// File holding `integ_in`.
    pub integ_in_file: Option<Spanned<String>>,
    /// File holding `integ_out`.
    pub integ_out_file: Option<Spanned<String>>,
}

impl SaTable {
    /// An SA pair with its suite and SPIs, and no keys yet.
    pub fn new(suite: &str, spi_in: u32, spi_out: u32) -> Self {
        SaTable {
            suite: value(suite.to_string()),
            spi_in: value(Scalar::Int(spi_in.into())),
            spi_out: value(Scalar::Int(spi_out.into())),
            enc_in: None,
            enc_out: None,
            integ_in: None,
            integ_out: None,
            enc_in_file: None,
            enc_out_file: None,
            integ_in_file: None,
            integ_out_file: None,
        }
    }
}

/// `[connection.ike]`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IkeTable {
    /// IKE proposals.
    pub proposals: Option<Spanned<Vec<Spanned<String>>>>,
    /// ESP proposals of the child SA.
    pub esp_proposals: Option<Spanned<Vec<Spanned<String>>>>,
    /// Our identity.
    pub local_id: Option<Spanned<String>>,
    /// The peer's identity (`%any`: any).
    pub remote_id: Option<Spanned<String>>,
    /// How we authenticate.
    pub auth: Option<AuthMethod>,
    /// How the peer authenticates.
    pub remote_auth: Option<AuthMethod>,
    /// Pre-shared key file.
    pub psk_file: Option<Spanned<String>>,
    /// Our private key (PEM).
    pub private_key: Option<Spanned<String>>,
    /// Our certificate chain (PEM).
    pub cert: Option<Spanned<String>>,
    /// CA certificates the peer's must chain to (PEM).
    pub ca: Option<Spanned<String>>,
    /// The peer's public key (PEM).
    pub remote_public_key: Option<Spanned<String>>,
    /// `none` or `start`.
    pub start_action: Option<StartAction>,
    /// IKE SA rekey time.
    pub rekey_time: Option<Spanned<Scalar>>,
    /// Child SA rekey time.
    pub child_rekey_time: Option<Spanned<Scalar>>,
    /// Child SA hard lifetime.
    pub child_life_time: Option<Spanned<Scalar>>,
    /// Largest random reduction of the rekey times.
    pub jitter: Option<Spanned<Scalar>>,
    /// Dead peer detection delay.
    pub dpd_delay: Option<Spanned<Scalar>>,
    /// `clear` or `restart`.
    pub dpd_action: Option<DpdActionName>,
    /// First retransmission timeout.
    pub retransmit_timeout: Option<Spanned<Scalar>>,
    /// Retransmissions before giving up.
    pub retransmit_tries: Option<Spanned<i64>>,
    /// Longest wait between two retransmissions.
    pub retransmit_limit: Option<Spanned<Scalar>>,
    /// Pretend a NAT so that ESP is UDP-encapsulated.
    pub force_encap: Option<Spanned<bool>>,
    /// Answer a peer's MOBIKE (RFC 4555), so that it can move.
    pub mobike: Option<Spanned<bool>>,
    /// Negotiate Q-ESP child SAs: `off`, `prefer` or `require`.
    pub qesp: Option<Spanned<QespName>>,
    /// `[[connection.ike.child]]`: selector sets beyond the connection's
    /// own `local_ts`/`remote_ts`, each a child SA of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub child: Vec<Spanned<ChildTable>>,
}

/// One `[[connection.ike.child]]`: a further selector set of an IKE
/// connection. An omitted side is the connection's own.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildTable {
    /// Our side's traffic selectors (default: the connection's `local_ts`).
    pub local_ts: Option<Spanned<Vec<Spanned<String>>>>,
    /// The peer side's traffic selectors (default: the connection's
    /// `remote_ts`).
    pub remote_ts: Option<Spanned<Vec<Spanned<String>>>>,
}

/// How a connection's IPsec packets travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// The IPsec protocols a connection applies (`protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Q-ESP (`docs/QESP.md`): ESP's keys and suites in `[connection.esp]`,
    /// the flow's ports in a clear header; raw IP only.
    #[serde(rename = "qesp")]
    Qesp,
}

impl Protocols {
    /// True when ESP or Q-ESP is applied (keyed by `[connection.esp]`).
    pub fn has_esp(self) -> bool {
        matches!(self, Protocols::Esp | Protocols::EspAh | Protocols::Qesp)
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
            Protocols::Qesp => "qesp",
        }
    }
}

/// `mode`: tunnel or transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeName {
    /// Tunnel mode.
    Tunnel,
    /// Transport mode.
    Transport,
}

/// DSCP handling on encapsulation (RFC 4301 §5.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dscp {
    /// Copy the inner DSCP to the outer header.
    Copy,
    /// Outer DSCP 0.
    Clear,
}

/// Log verbosity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
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

/// An authentication method as the file names it (`auth`, `remote_auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMethod {
    /// Pre-shared key (`psk_file`).
    Psk,
    /// Signatures: our `private_key` (with `cert`, or as a raw public key);
    /// for the peer, a certificate from `ca` or the `remote_public_key`.
    Pubkey,
}

impl AuthMethod {
    /// The keyword in the file.
    pub fn name(self) -> &'static str {
        match self {
            AuthMethod::Psk => "psk",
            AuthMethod::Pubkey => "pubkey",
        }
    }
}

/// What the daemon does with an IKE connection when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartAction {
    /// Nothing: wait for the peer, or `espgate initiate NAME`.
    None,
    /// Initiate the IKE SA and its child SA at start-up.
    Start,
}

/// `dpd_action`: what to do with a dead peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DpdActionName {
    /// Delete its SAs.
    Clear,
    /// Delete them and initiate again.
    Restart,
}

/// `qesp`: whether IKE negotiates Q-ESP child SAs (`docs/QESP.md` §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QespName {
    /// ESP only (the default).
    Off,
    /// Q-ESP proposed first, ESP second; either accepted.
    Prefer,
    /// Q-ESP only.
    Require,
}

/// An integer or a string (sizes, durations, protocols, SPIs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scalar {
    /// A TOML integer.
    Int(i64),
    /// A TOML string.
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

impl Serialize for Scalar {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Scalar::Int(n) => s.serialize_i64(*n),
            Scalar::Str(v) => s.serialize_str(v),
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

impl Scalar {
    /// An integer given as a TOML integer or a decimal / `0x` hex string.
    pub fn int(&self) -> Result<i64, String> {
        match self {
            Scalar::Int(n) => Ok(*n),
            Scalar::Str(s) => {
                let t = s.trim();
                let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                    Some(h) => i64::from_str_radix(h, 16),
                    None => t.parse(),
                };
                r.map_err(|_| format!("{self} is not a number"))
            }
        }
    }

    /// A size: an integer, or a string with an optional K, M, G or T
    /// suffix (1024-based, optionally followed by `B` or `iB`). 0 is
    /// `None` (unlimited).
    pub fn size(&self) -> Result<Option<u64>, String> {
        const HELP: &str = "expected a count such as 1000000, or a string with a K, M, G or T \
                            suffix (1024-based) such as \"512M\" or \"1G\"";
        let n = match self {
            Scalar::Int(n) => u64::try_from(*n).map_err(|_| format!("{n} is negative"))?,
            Scalar::Str(s) => {
                let t = s.trim();
                let digits = t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let (num, unit) = t.split_at(digits);
                if num.is_empty() {
                    return Err(format!("{self} is not a size: {HELP}"));
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
                    _ => return Err(format!("{self} is not a size: {HELP}")),
                };
                num.parse::<u64>()
                    .ok()
                    .and_then(|n| n.checked_mul(mult))
                    .ok_or_else(|| format!("{self} is too large"))?
            }
        };
        Ok((n > 0).then_some(n))
    }

    /// A duration: an integer number of seconds, or a string of
    /// number+unit parts (`s`, `m`, `h`, `d`) such as `"90s"` or
    /// `"1h30m"`. 0 is `None` (unlimited).
    pub fn duration(&self) -> Result<Option<Duration>, String> {
        const HELP: &str = "expected seconds, or a string such as \"90s\", \"50m\", \"1h\", \
                            \"1d\" or \"1h30m\"";
        let secs = match self {
            Scalar::Int(n) => u64::try_from(*n).map_err(|_| format!("{n} is negative"))?,
            Scalar::Str(s) => {
                let mut rest = s.trim();
                if rest.is_empty() {
                    return Err(format!("{self} is not a duration: {HELP}"));
                }
                let mut total: u64 = 0;
                while !rest.is_empty() {
                    let digits =
                        rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                    if digits == 0 {
                        return Err(format!("{self} is not a duration: {HELP}"));
                    }
                    let n: u64 = rest[..digits]
                        .parse()
                        .map_err(|_| format!("{self} is too large"))?;
                    rest = &rest[digits..];
                    let unit = rest.chars().next();
                    let mult = match unit {
                        Some('s') => 1,
                        Some('m') => 60,
                        Some('h') => 3600,
                        Some('d') => 86400,
                        // A bare number is seconds, only as the whole string.
                        None if total == 0 => 1,
                        _ => return Err(format!("{self} is not a duration: {HELP}")),
                    };
                    rest = unit.map_or(rest, |u| &rest[u.len_utf8()..]).trim_start();
                    total = n
                        .checked_mul(mult)
                        .and_then(|x| total.checked_add(x))
                        .ok_or_else(|| format!("{self} is too large"))?;
                }
                total
            }
        };
        Ok((secs > 0).then(|| Duration::from_secs(secs)))
    }
}

/// A whole number of seconds the way durations are written (`"1h30m"`,
/// `"0s"`).
pub fn format_duration(d: Duration) -> String {
    let mut s = d.as_secs();
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

/// A key as hex text, wiped on drop. `Debug` never shows it and its
/// deserializer never echoes it; serializing writes it, since a
/// configuration file written by a tool needs its keys (a configuration
/// shown to an operator holds [`SecretHex::redacted`] instead).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretHex(Zeroizing<String>);

impl SecretHex {
    /// The text shown instead of a key.
    pub const REDACTED: &'static str = "<redacted>";

    /// A key from its hex text.
    pub fn new(hex: Zeroizing<String>) -> Self {
        SecretHex(hex)
    }

    /// The stand-in for a key in a configuration shown to an operator.
    pub fn redacted() -> Self {
        SecretHex(Zeroizing::new(Self::REDACTED.to_string()))
    }

    /// The hex text.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::REDACTED)
    }
}

impl Serialize for SecretHex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

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

/// The key serde's path holds for the inside of a [`Spanned`] value; it
/// is not a key of the file.
const SPANNED_VALUE_KEY: &str = "$__serde_spanned_private_value";

/// Reads the text into the schema: the one parse of the file. A syntax
/// error, an unknown key, a wrong type or a missing key is one
/// diagnostic with the key path serde followed and the position toml
/// gives.
pub(crate) fn read(text: &str, file: &str) -> Result<ConfigFile, ConfigError> {
    let de = toml::de::Deserializer::parse(text).map_err(|e| {
        let mut message = format!("TOML syntax: {}", e.message().trim_end());
        let place = e.span().map(|s| syntax_error_place(text, s.start));
        let path = match place {
            Some(Some((path, header))) => {
                // toml says "duplicate key" without the key.
                if message == "TOML syntax: duplicate key" {
                    message = if header {
                        "TOML syntax: duplicate key: this table is already defined above".into()
                    } else {
                        "TOML syntax: duplicate key: this key is already set in this table".into()
                    };
                }
                path
            }
            _ => String::new(),
        };
        ConfigError {
            file: file.to_string(),
            diagnostics: vec![Diagnostic {
                path,
                connection: None,
                position: e.span().map(|s| line_col(text, s.start)),
                message,
            }],
        }
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let mut path = String::new();
        let mut connection = None;
        for seg in e.path().iter() {
            match seg {
                serde_path_to_error::Segment::Map { key } if key == SPANNED_VALUE_KEY => {}
                serde_path_to_error::Segment::Map { key } => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(key);
                }
                serde_path_to_error::Segment::Seq { index } => {
                    if path == "connection" {
                        connection = connection_name(text, *index);
                    }
                    path.push_str(&format!("[{index}]"));
                }
                serde_path_to_error::Segment::Enum { variant } => path.push_str(variant),
                serde_path_to_error::Segment::Unknown => path.push('?'),
            }
        }
        let inner = e.into_inner();
        ConfigError {
            file: file.to_string(),
            diagnostics: vec![Diagnostic {
                path,
                connection,
                position: inner.span().map(|s| line_col(text, s.start)),
                message: friendly_serde_message(inner.message()),
            }],
        }
    })
}

/// The key path of the line a TOML syntax error at byte `pos` is on, in
/// the words of the other diagnostics (`connection[1].esp.spi_in`), and
/// whether that line is a table header (then the path is the table's):
/// so that a syntax error names its key too. The text is not TOML, so
/// this is a plain scan of the headers above the line (skipping
/// multi-line strings). `None` when the line holds neither a `key =` nor
/// a header.
fn syntax_error_place(text: &str, pos: usize) -> Option<(String, bool)> {
    let mut pos = pos.min(text.len());
    while !text.is_char_boundary(pos) {
        pos -= 1;
    }
    let line_start = text[..pos].rfind('\n').map_or(0, |i| i + 1);
    // `[[name]]` tables seen so far, by name: the index of the last one.
    let mut arrays: Vec<(String, usize)> = Vec::new();
    let mut table = String::new();
    let mut in_string: Option<&str> = None;
    for line in text[..line_start].lines() {
        for quotes in ["\"\"\"", "'''"] {
            if in_string.is_none_or(|q| q == quotes) && line.matches(quotes).count() % 2 == 1 {
                in_string = match in_string {
                    Some(_) => None,
                    None => Some(quotes),
                };
            }
        }
        if in_string.is_some() {
            continue;
        }
        if let Some((name, array)) = header_name(line) {
            table = header_path(name, array, &mut arrays);
        }
    }
    let line = text[line_start..].lines().next().unwrap_or("");
    if let Some((name, array)) = header_name(line) {
        return Some((header_path(name, array, &mut arrays), true));
    }
    let key = line.split_once('=')?.0.trim();
    let bare = |k: &str| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    if !key.split('.').all(|k| bare(k.trim())) {
        return None;
    }
    let key: Vec<&str> = key.split('.').map(str::trim).collect();
    let key = key.join(".");
    Some((
        if table.is_empty() {
            key
        } else {
            format!("{table}.{key}")
        },
        false,
    ))
}

/// The name in a table header line (`[gateway]`, `[[connection]]`) and
/// whether it is an array of tables.
fn header_name(line: &str) -> Option<(&str, bool)> {
    let t = line.trim();
    if let Some(rest) = t.strip_prefix("[[") {
        return Some((rest.split_once("]]")?.0.trim(), true));
    }
    let rest = t.strip_prefix('[')?;
    Some((rest.split_once(']')?.0.trim(), false))
}

/// A header's table as diagnostics say it, each array of tables with the
/// index of its last element (`connection[1].esp`); an array header adds
/// one element.
fn header_path(name: &str, array: bool, arrays: &mut Vec<(String, usize)>) -> String {
    if array {
        match arrays.iter_mut().find(|(n, _)| n == name) {
            Some((_, i)) => *i += 1,
            None => arrays.push((name.to_string(), 0)),
        }
        // A new element starts the arrays nested in it afresh
        // (`[[connection.ike.child]]` of the next `[[connection]]`).
        let inner = format!("{name}.");
        arrays.retain(|(n, _)| !n.starts_with(&inner));
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for part in name.split('.').map(str::trim) {
        if !prefix.is_empty() {
            prefix.push('.');
            path.push('.');
        }
        prefix.push_str(part);
        path.push_str(part);
        if let Some((_, i)) = arrays.iter().find(|(n, _)| *n == prefix) {
            path.push_str(&format!("[{i}]"));
        }
    }
    path
}

/// The `name` of connection `i` of a file the schema refused, for its
/// one diagnostic: a lenient read of the names only.
fn connection_name(text: &str, i: usize) -> Option<String> {
    #[derive(Deserialize)]
    struct Names {
        #[serde(default)]
        connection: Vec<NameOnly>,
    }
    #[derive(Deserialize)]
    struct NameOnly {
        name: Option<toml::Value>,
    }
    let names: Names = toml::from_str(text).ok()?;
    let name = names.connection.into_iter().nth(i)?.name?;
    name.as_str().map(str::to_string)
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
    // The Rust name of the table's struct means nothing in the file.
    if let Some(i) = m.find("expected a table ") {
        m.truncate(i + "expected a table".len());
    }
    // toml's words for a keyword key (`mode`, `log`, ...) given a number,
    // a boolean, a date or an array.
    if m == "wanted string or table" {
        return "invalid type: expected a string (one of the words docs/CONFIG.md lists \
                for this key)"
            .into();
    }
    // An array where a table is expected: serde counts its items.
    if m.starts_with("invalid length ") && m.ends_with(", expected a table") {
        return "invalid type: array, expected a table".into();
    }
    // An integer beyond 64 bits is read as an i128, which serde calls a
    // type mismatch.
    if let Some(n) = m
        .strip_prefix("invalid type: integer `")
        .and_then(|r| r.split_once("` as i128"))
        .map(|(n, _)| n.to_string())
    {
        return format!("integer `{n}` is out of range: it does not fit in 64 bits");
    }
    m
}
