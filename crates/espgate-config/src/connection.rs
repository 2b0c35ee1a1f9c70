//! One `[[connection]]`: the validated [`Connection`] with its [`Keying`]
//! (manual SAs or IKE, never both), the SAs it makes, its checks, and the
//! checks across connections and against the gateway.

use crate::diag::{span, At, Validator};
use crate::gateway::{self, Gateway};
use crate::ike::{self, IkeSettings, StartAction};
pub use crate::sa::ChildSelectors;
use crate::sa::{self, family, sets_overlap, KeyText, ManualSa};
use crate::schema::{
    value, ChildTable, ConnectionTable, Dscp, Encapsulation, GatewayTable, ModeName, Protocols,
    Scalar,
};
use espgate_core::crypto::{Integ, Suite};
use espgate_core::gateway::{ConnSpec, Layers, MssClamp as CoreMssClamp, SaSettings};
use espgate_core::sa::replay::MAX_WINDOW;
use espgate_core::sa::{per_cpu_key, Growth, Lifetime, Mode, Protocol, Sa, SaConfig};
use espgate_core::selector::{PortRange, Prefix, TrafficSelector};
use espgate_core::wire::proto;
use espgate_core::wire::qesp::DEFAULT_IP_PROTOCOL as DEFAULT_QESP_PROTOCOL;
use espgate_ike::config::{ChildConfig, IkeConfig, QespMode, SelectorSet};
use espgate_ike::ts;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;
use toml::Spanned;

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
    /// Derived from the TUN MTU (the longest packet the SAs keep within the
    /// outer MTU).
    Auto,
    /// No clamping.
    Off,
    /// This MSS.
    Fixed(u16),
}

/// ECN handling (RFC 6040).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ecn {
    /// RFC 6040 normal mode, the only one implemented.
    Normal,
}

/// How a connection's SAs are keyed.
// A handful per gateway, made once at start: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Keying {
    /// Configured SA pairs (`[connection.esp]`, `[connection.ah]`).
    Manual(ManualKeys),
    /// Negotiated by IKEv2 (`[connection.ike]`): ESP SAs, or Q-ESP ones
    /// with its `qesp` setting; there are none until IKE installs them.
    Ike(IkeSettings),
}

/// The manually keyed SA pairs of a connection, one per protocol it
/// applies (`protocol`).
#[derive(Debug, Clone)]
pub enum ManualKeys {
    /// `protocol = "esp"`.
    Esp(ManualSa),
    /// `protocol = "ah"`.
    Ah(ManualSa),
    /// `protocol = "esp+ah"`: ESP inside AH.
    EspAh {
        /// The ESP pair.
        esp: ManualSa,
        /// The AH pair.
        ah: ManualSa,
    },
    /// `protocol = "qesp"` (its pair in `[connection.esp]`).
    Qesp(ManualSa),
}

impl ManualKeys {
    /// The ESP pair, if ESP is applied.
    pub fn esp(&self) -> Option<&ManualSa> {
        match self {
            ManualKeys::Esp(s) | ManualKeys::EspAh { esp: s, .. } | ManualKeys::Qesp(s) => Some(s),
            ManualKeys::Ah(_) => None,
        }
    }

    /// The AH pair, if AH is applied.
    pub fn ah(&self) -> Option<&ManualSa> {
        match self {
            ManualKeys::Ah(s) | ManualKeys::EspAh { ah: s, .. } => Some(s),
            ManualKeys::Esp(_) | ManualKeys::Qesp(_) => None,
        }
    }

    /// The protocols applied.
    pub fn protocol(&self) -> Protocols {
        match self {
            ManualKeys::Esp(_) => Protocols::Esp,
            ManualKeys::Ah(_) => Protocols::Ah,
            ManualKeys::EspAh { .. } => Protocols::EspAh,
            ManualKeys::Qesp(_) => Protocols::Qesp,
        }
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
    /// UDP or raw.
    pub encap: Encapsulation,
    /// Our side's selectors (defaults to `local/32` in transport mode).
    pub local_ts: Vec<Prefix>,
    /// The peer side's selectors (defaults to `remote/32` in transport mode).
    pub remote_ts: Vec<Prefix>,
    /// Selector sets beyond `local_ts`/`remote_ts` (the first), each a
    /// child SA of its own (`[[connection.ike.child]]`, tunnel mode only).
    /// Empty with manual keys and for IKE connections without child tables.
    pub children: Vec<ChildSelectors>,
    /// IP protocol restriction.
    pub proto: IpProto,
    /// Install routes for the `remote_ts` of every selector set through
    /// the TUN.
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
    pub nat_keepalive: Duration,
    /// Legacy suites allowed.
    pub allow_insecure: bool,
    /// TFC padding target (tunnel-mode ESP).
    pub tfc_pad_to: Option<u16>,
    /// Per-CPU SAs: this many ESP SA pairs with identical selectors.
    /// Manually keyed, pair `k` has the SPIs `spi_in + k`, `spi_out + k`
    /// and keys derived from the configured ones ([`per_cpu_key`]); with
    /// IKE they are RFC 9611 child SAs, one per slot. Worker `w` sends on
    /// pair `w % per_cpu_sas`; the receiver's sockets steer each SPI to
    /// one worker. 1 (plain) unless ESP over UDP.
    pub per_cpu_sas: u32,
    /// SA lifetime limits.
    pub lifetime: Lifetime,
    /// Manual SAs or IKE.
    pub keying: Keying,
    /// The IP protocol number of Q-ESP on this gateway
    /// (`gateway.qesp_protocol`).
    pub qesp_protocol: u8,
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
    /// The IPsec protocols applied: those of the manual SAs, ESP with IKE.
    pub fn protocol(&self) -> Protocols {
        match &self.keying {
            Keying::Manual(m) => m.protocol(),
            Keying::Ike(_) => Protocols::Esp,
        }
    }

    /// The manual ESP SA pair, if there is one.
    pub fn esp(&self) -> Option<&ManualSa> {
        match &self.keying {
            Keying::Manual(m) => m.esp(),
            Keying::Ike(_) => None,
        }
    }

    /// The manual ESP SA pair, to change (tools and tests that adjust a
    /// loaded configuration).
    pub fn esp_mut(&mut self) -> Option<&mut ManualSa> {
        match &mut self.keying {
            Keying::Manual(ManualKeys::Esp(s) | ManualKeys::EspAh { esp: s, .. }) => Some(s),
            _ => None,
        }
    }

    /// The manual AH SA pair, if there is one.
    pub fn ah(&self) -> Option<&ManualSa> {
        match &self.keying {
            Keying::Manual(m) => m.ah(),
            Keying::Ike(_) => None,
        }
    }

    /// The IKE settings, if the SAs are negotiated.
    pub fn ike(&self) -> Option<&IkeSettings> {
        match &self.keying {
            Keying::Ike(s) => Some(s),
            Keying::Manual(_) => None,
        }
    }

    /// The selector sets (local prefixes, remote prefixes): the
    /// connection's own `local_ts`/`remote_ts` first, then each of
    /// [`Connection::children`].
    pub fn selector_sets(&self) -> impl Iterator<Item = (&[Prefix], &[Prefix])> {
        std::iter::once((&self.local_ts[..], &self.remote_ts[..])).chain(
            self.children
                .iter()
                .map(|c| (&c.local_ts[..], &c.remote_ts[..])),
        )
    }

    /// Selectors: every same-family pair of local × remote prefixes of
    /// each selector set ([`Connection::selector_sets`], in that order,
    /// each pair once), with `proto` (ICMP resolved per family) and any
    /// ports.
    pub fn selectors(&self) -> Vec<TrafficSelector> {
        let mut out = Vec::new();
        for (local, remote) in self.selector_sets() {
            for l in local {
                for r in remote {
                    let v6 = l.addr().is_ipv6();
                    if v6 != r.addr().is_ipv6() {
                        continue;
                    }
                    let ts = TrafficSelector {
                        local: *l,
                        remote: *r,
                        proto: self.proto.for_family(v6),
                        local_ports: PortRange::ANY,
                        remote_ports: PortRange::ANY,
                    };
                    if !out.contains(&ts) {
                        out.push(ts);
                    }
                }
            }
        }
        out
    }

    /// The connection as the data-plane engine runs it: addresses, layers,
    /// selectors, SA settings and the manually keyed SAs (none with IKE).
    /// For `esp+ah` the ESP SA has the connection's mode and the AH SA is
    /// in transport mode over the ESP packet; per-CPU pairs get their
    /// derived keys ([`per_cpu_key`]).
    pub fn spec(&self) -> ConnSpec {
        let mut spec = ConnSpec {
            name: self.name.clone(),
            local: self.local,
            remote: self.remote,
            local_port: self.local_port,
            remote_port: self.remote_port,
            mode: self.mode,
            layers: match self.protocol() {
                Protocols::Esp => Layers::Esp,
                Protocols::Ah => Layers::Ah,
                Protocols::EspAh => Layers::EspAh,
                Protocols::Qesp => Layers::Qesp,
            },
            qesp_protocol: self.qesp_protocol,
            udp: self.encap == Encapsulation::Udp,
            local_ts: self.local_ts.clone(),
            remote_ts: self.remote_ts.clone(),
            more_ts: self
                .children
                .iter()
                .map(|c| (c.local_ts.clone(), c.remote_ts.clone()))
                .collect(),
            selectors: self.selectors(),
            mss_clamp: match self.mss_clamp {
                MssClamp::Off => CoreMssClamp::Off,
                MssClamp::Fixed(n) => CoreMssClamp::Fixed(n),
                MssClamp::Auto => CoreMssClamp::Auto,
            },
            per_cpu_sas: self.per_cpu_sas,
            sa: SaSettings {
                esn: self.esn,
                replay_window: self.replay_window,
                lifetime: self.lifetime,
                allow_insecure: self.allow_insecure,
                tfc_pad_to: self.tfc_pad_to,
                copy_dscp: self.dscp == Dscp::Copy,
            },
            inbound: Vec::new(),
            outbound: Vec::new(),
            negotiated: self
                .ike()
                .map_or_else(Vec::new, |i| self.negotiated_growth(i)),
        };
        let Keying::Manual(keys) = &self.keying else {
            return spec;
        };
        let esp_like = if self.protocol() == Protocols::Qesp {
            Protocol::Qesp
        } else {
            Protocol::Esp
        };
        let pairs = [(esp_like, keys.esp()), (Protocol::Ah, keys.ah())];
        for (protocol, sa) in pairs {
            let Some(sa) = sa else { continue };
            let mode = spec.mode_of(protocol);
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
                spec.shape_sa(
                    &mut c,
                    mode,
                    outbound_dir,
                    (self.local_port, self.remote_port),
                );
                if outbound_dir {
                    spec.outbound.push(c);
                } else {
                    spec.inbound.push(c);
                }
            }
        }
        spec
    }

    /// The connection's manually keyed SAs (none with IKE), as
    /// [`Connection::spec`] makes them.
    pub fn sa_configs(&self) -> ConnectionSas {
        let s = self.spec();
        ConnectionSas {
            inbound: s.inbound,
            outbound: s.outbound,
        }
    }

    /// How each ESP SA IKE may negotiate grows a packet: one entry per
    /// suite of the ESP proposals (the TUN MTU is sized at start, before
    /// any SA exists), each also as Q-ESP, whose header is longer, when it
    /// may be negotiated.
    fn negotiated_growth(&self, ike: &IkeSettings) -> Vec<Growth> {
        let (v6, udp) = (self.remote.is_ipv6(), self.encap == Encapsulation::Udp);
        let protocol = if ike.qesp == QespMode::Off {
            Protocol::Esp
        } else {
            Protocol::Qesp
        };
        let mut all = Vec::new();
        for p in &ike.esp_proposals {
            let integs: Vec<Option<Integ>> = if p.integ.is_empty() {
                vec![None]
            } else {
                p.integ.iter().copied().map(Some).collect()
            };
            for e in &p.encr {
                for i in &integs {
                    let suite = Suite {
                        enc: Some(*e),
                        integ: *i,
                    };
                    all.push(Growth::esp(self.mode, v6, udp, protocol, &suite));
                }
            }
        }
        all
    }

    /// The IKE engine's configuration of a connection with a
    /// `[connection.ike]` table (`None` without one): name, addresses,
    /// identities, loaded authentication material, proposals, timers, and
    /// the child SA's traffic selectors — every `local_ts` and `remote_ts`
    /// prefix as a range selector with the connection's `proto` (ICMP
    /// resolved per family, 0 for any) and all ports, and likewise each of
    /// [`Connection::children`] as a further set (`more_ts`) — and mode.
    pub fn ike_config(&self) -> Option<IkeConfig> {
        let s = self.ike()?;
        let selectors = |list: &[Prefix]| {
            list.iter()
                .map(|p| {
                    ts::from_prefix(*p, self.proto.for_family(p.addr().is_ipv6()).unwrap_or(0))
                })
                .collect::<Vec<_>>()
        };
        Some(IkeConfig {
            name: self.name.clone(),
            local: self.local,
            remote: self.remote,
            local_id: s.local_id.clone(),
            remote_id: s.remote_id.clone(),
            local_auth: s.local_auth.clone(),
            remote_auth: s.remote_auth.clone(),
            proposals: s.proposals.clone(),
            child: ChildConfig {
                local_ts: selectors(&self.local_ts),
                remote_ts: selectors(&self.remote_ts),
                mode: self.mode,
                proposals: s.esp_proposals.clone(),
                qesp: s.qesp,
                rekey_time: s.child_rekey_time,
                life_time: s.child_life_time,
                jitter: s.jitter,
                per_cpu_sas: self.per_cpu_sas.max(1),
                more_ts: self
                    .children
                    .iter()
                    .map(|c| SelectorSet {
                        local_ts: selectors(&c.local_ts),
                        remote_ts: selectors(&c.remote_ts),
                    })
                    .collect(),
            },
            rekey_time: s.rekey_time,
            jitter: s.jitter,
            dpd_delay: s.dpd_delay,
            dpd_action: s.dpd_action,
            retransmit: s.retransmit,
            force_encap: s.force_encap,
            mobike: s.mobike,
        })
    }

    /// True when the daemon should initiate the connection as it starts
    /// (`start_action = "start"`); false for `"none"` and for connections
    /// without IKE.
    pub fn start_on_boot(&self) -> bool {
        self.ike()
            .is_some_and(|s| s.start_action == StartAction::Start)
    }

    /// The table that says exactly this connection, every key that applies
    /// given (`remote_port` and `nat_keepalive` only with UDP, `esn` only
    /// with manual keys), keys inline as `keys` says.
    pub fn to_table(&self, keys: KeyText) -> ConnectionTable {
        let mut t = ConnectionTable::new(
            &self.name,
            &self.local.to_string(),
            &self.remote.to_string(),
        );
        let int = |n: i64| Some(value(n));
        let list = |l: &[Prefix]| Some(value(l.iter().map(|p| value(p.to_string())).collect()));
        let udp = self.encap == Encapsulation::Udp;
        t.remote_port = udp.then(|| value(self.remote_port.into()));
        t.mode = Some(match self.mode {
            Mode::Tunnel => ModeName::Tunnel,
            Mode::Transport => ModeName::Transport,
        });
        t.protocol = Some(value(self.protocol()));
        t.encap = Some(value(self.encap));
        t.local_ts = list(&self.local_ts);
        t.remote_ts = list(&self.remote_ts);
        t.proto = Some(value(match self.proto {
            IpProto::Any => Scalar::Str("any".into()),
            IpProto::Icmp => Scalar::Str("icmp".into()),
            IpProto::Number(n) => Scalar::Int(n.into()),
        }));
        t.routes = Some(self.routes);
        t.mss_clamp = Some(value(match self.mss_clamp {
            MssClamp::Auto => Scalar::Str("auto".into()),
            MssClamp::Off => Scalar::Str("off".into()),
            MssClamp::Fixed(n) => Scalar::Int(n.into()),
        }));
        t.fragment_inner = Some(value(self.fragment_inner));
        t.dscp = Some(self.dscp);
        t.ecn = Some(value("normal".to_string()));
        t.replay_window = int(self.replay_window.into());
        t.nat_keepalive = udp.then(|| value(self.nat_keepalive.as_secs() as i64));
        t.allow_insecure = Some(self.allow_insecure);
        t.tfc_pad_to = int(self.tfc_pad_to.map_or(0, i64::from));
        t.per_cpu_sas = int(self.per_cpu_sas.into());
        t.lifetime = Some(value(sa::lifetime_table(&self.lifetime)));
        match &self.keying {
            Keying::Manual(m) => {
                t.esn = Some(value(self.esn));
                t.esp = m.esp().map(|s| value(s.to_table(keys)));
                t.ah = m.ah().map(|s| value(s.to_table(keys)));
            }
            Keying::Ike(s) => {
                let mut ike = s.to_table();
                ike.child = self
                    .children
                    .iter()
                    .map(|c| {
                        value(ChildTable {
                            local_ts: list(&c.local_ts),
                            remote_ts: list(&c.remote_ts),
                        })
                    })
                    .collect();
                t.ike = Some(value(ike));
            }
        }
        t
    }
}

/// Where connection `i` is.
pub(crate) fn at(i: usize, t: &Spanned<ConnectionTable>) -> At {
    At::root()
        .key("connection", None)
        .index(i, Some(t.span()))
        .in_connection(t.get_ref().name.get_ref())
}

/// The `remote_ts` list of selector set `k` of connection `i` (0: the
/// connection's own, `k` > 0: `ike.child[k - 1]`'s, absent when that
/// child uses the connection's) and where it is.
fn remote_ts_of_set(
    i: usize,
    t: &Spanned<ConnectionTable>,
    k: usize,
) -> (At, Option<&Spanned<Vec<Spanned<String>>>>) {
    let c = t.get_ref();
    let child = k
        .checked_sub(1)
        .and_then(|k| Some((k, c.ike.as_ref()?, c.ike.as_ref()?.get_ref().child.get(k)?)));
    match child {
        None => (
            at(i, t).key("remote_ts", span(&c.remote_ts)),
            c.remote_ts.as_ref(),
        ),
        Some((k, ike, ct)) => {
            let list = ct.get_ref().remote_ts.as_ref();
            let here = at(i, t)
                .key("ike", Some(ike.span()))
                .key("child", None)
                .index(k, Some(ct.span()))
                .key("remote_ts", list.map(Spanned::span));
            (here, list)
        }
    }
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

/// Checks connection `i` (`g`: the gateway, when it is valid).
pub(crate) fn validate(
    v: &mut Validator,
    i: usize,
    t: &Spanned<ConnectionTable>,
    g: Option<&Gateway>,
) -> Option<Connection> {
    let before = v.error_count();
    let base = at(i, t);
    let c = t.get_ref();
    let key = |k: &str, s: Option<std::ops::Range<usize>>| base.key(k, s);

    let name = c.name.get_ref();
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
    {
        v.err(
            key("name", Some(c.name.span())),
            format!("{name:?} is not a valid name: use 1-64 of A-Z a-z 0-9 _ -"),
        );
    }
    let local = v.check(
        key("local", Some(c.local.span())),
        parse_outer_addr(c.local.get_ref()),
    );
    let remote_at = key("remote", Some(c.remote.span()));
    let remote = v.check(remote_at.clone(), parse_outer_addr(c.remote.get_ref()));
    if let (Some(l), Some(r)) = (local, remote) {
        if l.is_ipv4() != r.is_ipv4() {
            v.err(
                remote_at,
                format!(
                    "remote {r} is {} but local {l} is {}: the outer addresses must be \
                     of one family (inner traffic may be of either)",
                    family(r),
                    family(l)
                ),
            );
        } else if l == r {
            v.err(
                remote_at,
                format!("remote is the same address as local ({l})"),
            );
        }
    }
    let remote_port_at = key("remote_port", span(&c.remote_port));
    let remote_port = match c.remote_port.as_ref().map(|n| *n.get_ref()) {
        None => 4500,
        Some(n) => match u16::try_from(n) {
            Ok(port) if port != 0 => port,
            _ => {
                v.err(
                    remote_port_at.clone(),
                    format!("{n} is not a port (1-65535)"),
                );
                0
            }
        },
    };
    let mode = match c.mode.unwrap_or(ModeName::Tunnel) {
        ModeName::Tunnel => Mode::Tunnel,
        ModeName::Transport => Mode::Transport,
    };
    let protocol = c.protocol.as_ref().map_or(Protocols::Esp, |p| *p.get_ref());
    let given_encap = c.encap.as_ref().map(|e| *e.get_ref());
    let encap = match (given_encap, g) {
        (Some(e), _) => e,
        (None, Some(g)) => g.encap,
        (None, None) => Encapsulation::Udp,
    };
    let encap_at = key("encap", span(&c.encap));
    if (protocol.has_ah() || protocol == Protocols::Qesp) && encap == Encapsulation::Udp {
        let how = if given_encap.is_some() {
            "encap = \"udp\""
        } else {
            "encap defaults to gateway.encap = \"udp\""
        };
        let why = if protocol == Protocols::Qesp {
            "its ICV covers the outer addresses, which NAT rewrites"
        } else {
            "RFC 3948 covers ESP only"
        };
        v.err(
            encap_at,
            format!(
                "protocol \"{}\" cannot be UDP-encapsulated ({why}) but \
                 {how}; set encap = \"none\" on this connection",
                protocol.name()
            ),
        );
    }
    let fragment_inner = c.fragment_inner.as_ref().map(|b| *b.get_ref());
    if fragment_inner == Some(false) && encap == Encapsulation::None {
        v.err(
            key("fragment_inner", span(&c.fragment_inner)),
            "fragment_inner = false lets the kernel fragment the outer packets, which it \
             does for ESP-in-UDP only (raw ESP/AH is sent with IP_HDRINCL, never \
             fragmented); set encap = \"udp\" or remove this key",
        );
    }
    if encap == Encapsulation::None && c.remote_port.is_some() {
        v.warn(
            remote_port_at,
            "remote_port is ignored with encap = \"none\" (raw ESP/AH has no ports)",
        );
    }

    let (local_ts, remote_ts) =
        sa::selectors(v, &base, mode, (local, remote), &c.local_ts, &c.remote_ts);

    let proto = match &c.proto {
        None => Some(IpProto::Any),
        Some(p) => v.check(key("proto", Some(p.span())), parse_proto(p.get_ref())),
    };
    let mss_clamp = match &c.mss_clamp {
        None => Some(MssClamp::Auto),
        Some(m) => v.check(key("mss_clamp", Some(m.span())), parse_mss(m.get_ref())),
    };
    let ecn = match c.ecn.as_ref().map(|e| e.get_ref().as_str()) {
        None | Some("normal") => Ecn::Normal,
        Some(other) => {
            v.err(
                key("ecn", span(&c.ecn)),
                format!(
                    "{other:?}: only \"normal\" (RFC 6040 normal mode) is implemented; \
                     compatibility mode is not"
                ),
            );
            Ecn::Normal
        }
    };
    let int = |k: &Option<Spanned<i64>>, default: i64| k.as_ref().map_or(default, |n| *n.get_ref());
    let replay_window = int(&c.replay_window, 1024);
    let replay_at = key("replay_window", span(&c.replay_window));
    if !(0..=i64::from(MAX_WINDOW)).contains(&replay_window) {
        v.err(
            replay_at,
            format!("{replay_window}: expected 0 (no replay check) to {MAX_WINDOW} packets"),
        );
    } else if replay_window == 0 && protocol == Protocols::Qesp {
        v.err(
            replay_at,
            "Q-ESP requires anti-replay (docs/QESP.md §4); remove replay_window = 0",
        );
    } else if replay_window == 0 {
        v.warn(
            replay_at,
            "0 disables anti-replay protection: captured packets can be replayed",
        );
    }
    let nat_keepalive = int(&c.nat_keepalive, 20);
    let keepalive_at = key("nat_keepalive", span(&c.nat_keepalive));
    if !(0..=3600).contains(&nat_keepalive) {
        v.err(
            keepalive_at,
            format!("{nat_keepalive}: expected 0 (off) to 3600 seconds"),
        );
    } else if nat_keepalive != 0 && encap == Encapsulation::None && c.nat_keepalive.is_some() {
        v.warn(
            keepalive_at,
            "ignored with encap = \"none\": NAT keepalives are UDP (RFC 3948)",
        );
    }
    let tfc_at = key("tfc_pad_to", span(&c.tfc_pad_to));
    let tfc_pad_to = match int(&c.tfc_pad_to, 0) {
        0 => None,
        n => match u16::try_from(n) {
            Ok(t) if mode == Mode::Tunnel && protocol.has_esp() => Some(t),
            Ok(_) => {
                v.err(
                    tfc_at,
                    "TFC padding needs ESP in tunnel mode (RFC 4303 §2.4)",
                );
                None
            }
            Err(_) => {
                v.err(tfc_at, format!("{n}: expected 0-65535 bytes"));
                None
            }
        },
    };
    let per_cpu_at = key("per_cpu_sas", span(&c.per_cpu_sas));
    let per_cpu_sas = match int(&c.per_cpu_sas, 1) {
        n @ 1..=64 => {
            if n > 1 && (protocol != Protocols::Esp || encap != Encapsulation::Udp) {
                v.err(
                    per_cpu_at.clone(),
                    "per-CPU SAs need protocol = \"esp\" and encap = \"udp\" (the receiver \
                     steers ESP-in-UDP to its workers by SPI)",
                );
            }
            n as u32
        }
        n => {
            v.err(
                per_cpu_at.clone(),
                format!("{n}: expected 1 to 64 SA pairs"),
            );
            1
        }
    };
    let lifetime = sa::lifetime(
        v,
        &key("lifetime", span(&c.lifetime)),
        c.lifetime.as_ref().map(Spanned::get_ref),
    );
    let allow_insecure = c.allow_insecure.unwrap_or(false);
    let esp_at = key("esp", span(&c.esp));
    let ah_at = key("ah", span(&c.ah));

    // IKE instead of manual SAs.
    let has_ike = c.ike.is_some();
    if has_ike {
        if protocol == Protocols::Qesp {
            v.err(
                key("protocol", span(&c.protocol)),
                "protocol = \"qesp\" keys Q-ESP manually; with [connection.ike] Q-ESP is \
                 negotiated: set qesp = \"require\" (or \"prefer\") in [connection.ike] and \
                 remove protocol",
            );
        } else if protocol != Protocols::Esp {
            v.err(
                key("protocol", span(&c.protocol)),
                format!(
                    "protocol = \"{}\" but [connection.ike] negotiates ESP SAs only; set \
                     protocol = \"esp\" (or remove it)",
                    protocol.name()
                ),
            );
        }
        if c.esp.is_some() {
            v.err(
                esp_at.clone(),
                "[connection.esp] (manual SAs) and [connection.ike] are both given: with \
                 IKE the ESP SAs are negotiated; keep one of the two tables",
            );
        }
        if c.esn.is_some() {
            v.warn(
                key("esn", span(&c.esn)),
                "ignored with [connection.ike]: ESN is negotiated; offer it in \
                 esp_proposals (for example \"aes128gcm16-esn\")",
            );
        }
    }
    let (ike, children) = match &c.ike {
        Some(r) => {
            let ike_at = key("ike", Some(r.span()));
            let settings = ike::settings(
                v,
                &ike_at,
                r.get_ref(),
                (local, remote),
                encap,
                replay_window,
            );
            let children = ike::children(v, &ike_at, r.get_ref(), mode, (&local_ts, &remote_ts));
            (settings, children)
        }
        None => (None, Vec::new()),
    };

    // The manual SAs.
    let esp = match (protocol.has_esp(), &c.esp) {
        // Both tables, or IKE: reported above; no manual SA.
        (_, Some(_)) | (true, None) if has_ike => None,
        (true, Some(r)) => {
            let p = if protocol == Protocols::Qesp {
                Protocol::Qesp
            } else {
                Protocol::Esp
            };
            sa::manual_sa(v, &esp_at, p, r.get_ref(), allow_insecure)
        }
        (true, None) => {
            v.err(
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
            v.err(
                esp_at.clone(),
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
    let ah = match (protocol.has_ah(), &c.ah) {
        (true, Some(r)) => sa::manual_sa(v, &ah_at, Protocol::Ah, r.get_ref(), allow_insecure),
        // The protocol is refused above.
        (true, None) if has_ike => None,
        (true, None) => {
            v.err(
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
            v.err(
                ah_at.clone(),
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

    if v.error_count() != before {
        return None;
    }
    if let Some(e) = esp.as_ref().filter(|_| per_cpu_sas > 1) {
        let (n, lo, hi) = (
            per_cpu_sas,
            e.spi_in.min(e.spi_out),
            e.spi_in.max(e.spi_out),
        );
        if hi - lo < n {
            v.err(
                per_cpu_at,
                format!(
                    "{n} per-CPU SA pairs use the SPIs spi_in .. spi_in+{m} and spi_out .. \
                     spi_out+{m}: these overlap; set spi_in and spi_out at least {n} apart",
                    m = n - 1
                ),
            );
        }
    }
    let keying = if has_ike {
        Keying::Ike(ike?)
    } else {
        Keying::Manual(match protocol {
            Protocols::Esp => ManualKeys::Esp(esp?),
            Protocols::Ah => ManualKeys::Ah(ah?),
            Protocols::EspAh => ManualKeys::EspAh { esp: esp?, ah: ah? },
            Protocols::Qesp => ManualKeys::Qesp(esp?),
        })
    };
    let conn = Connection {
        name: name.clone(),
        local: local?,
        remote: remote?,
        local_port: g.map_or(4500, |g| g.listen.port()),
        remote_port,
        mode,
        encap,
        local_ts,
        remote_ts,
        children,
        proto: proto?,
        routes: c.routes.unwrap_or(true),
        mss_clamp: mss_clamp?,
        fragment_inner: fragment_inner.unwrap_or(true),
        dscp: c.dscp.unwrap_or(Dscp::Copy),
        ecn,
        esn: c.esn.as_ref().is_some_and(|b| *b.get_ref()),
        replay_window: replay_window as u32,
        nat_keepalive: Duration::from_secs(nat_keepalive.clamp(0, 3600) as u64),
        allow_insecure,
        tfc_pad_to,
        per_cpu_sas,
        lifetime: lifetime?,
        keying,
        qesp_protocol: g.map_or(DEFAULT_QESP_PROTOCOL, |g| g.qesp_protocol),
    };
    // Last line of defence: everything the core checks when installing.
    let sas = conn.sa_configs();
    for cfg in sas.outbound.iter().chain(&sas.inbound) {
        let which = if cfg.protocol.is_esp_like() {
            &esp_at
        } else {
            &ah_at
        };
        let r = cfg
            .validate_outbound()
            .and_then(|_| Sa::new(cfg.clone(), Duration::ZERO).map(|_| ()));
        if let Err(e) = r {
            v.err(which.clone(), e.to_string());
            return None;
        }
    }
    Some(conn)
}

/// Refuses a connection name used twice.
pub(crate) fn duplicate_names(v: &mut Validator, tables: &[Spanned<ConnectionTable>]) {
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, t) in tables.iter().enumerate() {
        let name = t.get_ref().name.get_ref();
        if let Some(first) = names.get(name.as_str()) {
            v.err(
                at(i, t).key("name", Some(t.get_ref().name.span())),
                format!("duplicate connection name \"{name}\" (also connection[{first}])"),
            );
        } else {
            names.insert(name, i);
        }
    }
}

/// Checks the valid connections (`conns`: index in the file and
/// connection) against the valid gateway.
pub(crate) fn gateway_vs_connections(
    v: &mut Validator,
    g: &Gateway,
    gt: Option<&Spanned<GatewayTable>>,
    conns: &[(usize, Connection)],
    tables: &[Spanned<ConnectionTable>],
) {
    let gw_key = |k: &str| {
        let s = gt.and_then(|t| match k {
            "listen" => span(&t.get_ref().listen),
            _ => span(&t.get_ref().mtu),
        });
        gateway::at(gt).key(k, s)
    };
    if g.listen.port() == 0 && conns.iter().any(|(_, c)| c.encap == Encapsulation::Udp) {
        v.err(
            gw_key("listen"),
            "port 0: UDP-encapsulated connections need a fixed port (4500)",
        );
    }
    if conns.iter().any(|(_, c)| c.local.is_ipv6()) && g.mtu < 1280 {
        v.err(
            gw_key("mtu"),
            format!(
                "MTU {} is below 1280, the IPv6 minimum, and a connection uses IPv6",
                g.mtu
            ),
        );
    }
    for (i, c) in conns {
        let t = &tables[*i];
        // A route to the peer's own address through the TUN would send
        // the ESP packets back into the tunnel.
        if c.routes && g.fwmark.is_none() {
            if let Some((k, j, pf)) = c.selector_sets().enumerate().find_map(|(k, (_, r))| {
                r.iter()
                    .enumerate()
                    .find(|(_, pf)| pf.contains(c.remote))
                    .map(|(j, pf)| (k, j, pf))
            }) {
                let (list_at, list) = remote_ts_of_set(*i, t, k);
                let item = list.and_then(|l| l.get_ref().get(j)).map(Spanned::span);
                v.warn(
                    list_at.index(j, item),
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
            v.err(
                at(*i, t).key("local", Some(t.get_ref().local.span())),
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

/// Checks the valid connections against each other: one TUN MTU, SPIs
/// used once, overlapping selectors.
pub(crate) fn across_connections(
    v: &mut Validator,
    conns: &[(usize, Connection)],
    tables: &[Spanned<ConnectionTable>],
) {
    // One TUN device, one MTU: either it is the outer MTU minus the SA
    // overhead (inner fragmentation) or the outer MTU itself.
    if let Some((first, fc)) = conns.first() {
        for (i, c) in conns {
            if c.fragment_inner != fc.fragment_inner {
                let t = &tables[*i];
                v.err(
                    at(*i, t).key("fragment_inner", span(&t.get_ref().fragment_inner)),
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
        let t = tables[*i].get_ref();
        for (proto, sa, table) in [
            (Protocol::Esp, c.esp(), &t.esp),
            (Protocol::Ah, c.ah(), &t.ah),
        ] {
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
                        let spi_span = table.as_ref().map(|s| {
                            let s = s.get_ref();
                            if outbound {
                                s.spi_out.span()
                            } else {
                                s.spi_in.span()
                            }
                        });
                        v.err(
                            at(*i, &tables[*i])
                                .key(proto.name(), span(table))
                                .key(which, spi_span),
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
    // Overlapping selectors (any set of one with any set of the other):
    // the first connection in file order wins.
    for (a, (i, ci)) in conns.iter().enumerate() {
        for (j, cj) in conns.iter().skip(a + 1) {
            let proto_overlap =
                ci.proto == IpProto::Any || cj.proto == IpProto::Any || ci.proto == cj.proto;
            if !proto_overlap {
                continue;
            }
            let found = cj.selector_sets().enumerate().find_map(|(kj, sj)| {
                ci.selector_sets()
                    .position(|si| sets_overlap(si, sj).is_some())
                    .map(|ki| (ki, kj))
            });
            if let Some((ki, kj)) = found {
                let t = &tables[*j];
                let theirs = match ki {
                    0 => format!("connection[{i}]"),
                    k => format!("connection[{i}].ike.child[{}]", k - 1),
                };
                v.warn(
                    remote_ts_of_set(*j, t, kj).0,
                    format!(
                        "selectors overlap those of connection \"{}\" ({theirs}); \
                         traffic in both goes to the first in file order",
                        ci.name
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::*;
    use crate::LoadedConfig;
    use espgate_core::sa::Encap;
    use espgate_core::sad::{InboundResult, Sad};
    use espgate_core::wire::{ipv4, udp};
    use espgate_core::PacketBuf;

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
            .decapsulate(
                &mut buf,
                &espgate_core::sa::Classifier::new()
                    .udp_port(4501)
                    .qesp(a.gateway.qesp_protocol),
                Duration::ZERO,
            )
            .unwrap();
        assert!(matches!(r, InboundResult::Packet(ref v) if v.len() == ids.len()));
        assert_eq!(buf.as_slice(), &pkt[..]);
    }

    #[test]
    fn keying_says_the_protocol() {
        let (a, _) = mirrored("esp+ah", "none", true);
        let c = &a.connections[0];
        assert!(matches!(
            c.keying,
            Keying::Manual(ManualKeys::EspAh { ref esp, ref ah })
                if esp.spi_in == 0x1001 && ah.spi_in == 0x1101
        ));
        assert_eq!(c.protocol(), Protocols::EspAh);
        assert_eq!(
            (c.esp().unwrap().spi_out, c.ah().unwrap().spi_out),
            (0x1002, 0x1102)
        );
        assert!(c.ike().is_none() && c.ike_config().is_none());
        let (a, _) = mirrored("esp", "udp", false);
        let mut c = a.connections[0].clone();
        assert!(matches!(c.keying, Keying::Manual(ManualKeys::Esp(_))));
        assert_eq!(c.protocol(), Protocols::Esp);
        assert!(c.ah().is_none());
        c.esp_mut().unwrap().spi_out = 0x2000;
        assert_eq!(c.sa_configs().outbound[0].spi, 0x2000);
        let c = parse_str(&ah_conn("encap = \"none\"")).unwrap();
        let c = &c.connections[0];
        assert!(matches!(c.keying, Keying::Manual(ManualKeys::Ah(_))));
        assert_eq!(c.protocol(), Protocols::Ah);
        assert!(c.esp().is_none());
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
            .decapsulate(
                &mut buf,
                &espgate_core::sa::Classifier::new().udp_port(4501),
                Duration::ZERO
            )
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
    fn qesp_connections() {
        let (a, b) = mirrored("qesp", "none", false);
        let c = &a.connections[0];
        assert_eq!(c.protocol(), Protocols::Qesp);
        assert!(matches!(c.keying, Keying::Manual(ManualKeys::Qesp(_))));
        let out = c.sa_configs().outbound;
        assert_eq!((out[0].protocol, out[0].ip_protocol), (Protocol::Qesp, 253));
        assert_eq!(c.spec().layers, Layers::Qesp);
        round_trip(&a, &b);
        let raw = |extra: &str| {
            conn(
                "q",
                &format!("protocol = \"qesp\"\n{extra}"),
                &good_esp(0x1001, 0x1002),
            )
        };
        // UDP (the default encapsulation) is refused, with the reason.
        assert_has(
            &err(&raw("")),
            &[
                "connection[0].encap",
                "cannot be UDP-encapsulated",
                "outer addresses",
            ],
        );
        assert_has(
            &err(&raw("encap = \"none\"\nreplay_window = 0")),
            &["replay_window", "Q-ESP requires anti-replay"],
        );
        // Another experimental number from the gateway.
        let text = format!(
            "[gateway]\nqesp_protocol = 254\n{}",
            raw("encap = \"none\"")
        );
        let c = parse_str(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.connections[0].sa_configs().inbound[0].ip_protocol, 254);
        for bad in ["50", "0", "300"] {
            let text = format!(
                "[gateway]\nqesp_protocol = {bad}\n{}",
                raw("encap = \"none\"")
            );
            assert_has(&err(&text), &["gateway.qesp_protocol"]);
        }
        // A suite Q-ESP cannot run: the core's reason, at the ESP table.
        let text = raw("encap = \"none\"").replace("aes128gcm16", "aes128gmac");
        assert_has(
            &err(&text),
            &["connection[0].esp", "Q-ESP requires encryption"],
        );
    }

    #[test]
    fn per_cpu_keys_are_derived_distinct_and_checked() {
        // The derivation itself is tested in espgate_core::sa::per_cpu.
        let c = parse_str(&conn("b", "per_cpu_sas = 3", &good_esp(0x1001, 0x2001)))
            .unwrap_or_else(|e| panic!("{e}"));
        let sas = c.connections[0].sa_configs();
        let spis: Vec<u32> = sas.outbound.iter().map(|s| s.spi).collect();
        let base = spis[0];
        assert_eq!(spis, [base, base + 1, base + 2]);
        assert_eq!(sas.inbound.len(), 3);
        // Pair k's keys are the derived ones, distinct per pair.
        let esp = c.connections[0].esp().unwrap();
        for (k, s) in sas.outbound.iter().enumerate() {
            let want = per_cpu_key(&esp.enc_out, k as u32);
            assert_eq!(&s.enc_key[..], &want[..], "pair {k}");
        }
        assert_ne!(sas.outbound[0].enc_key, sas.outbound[1].enc_key);
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
}
