//! Run-time SA changes: `espgate sa add` / `sa del`, SAs negotiated by
//! IKE, and the keys handed out for Wireshark. Not the packet path: these
//! allocate, and their errors are messages for the operator (never with
//! keys).

use super::{slot, ConnSpec, Engine, Layers, SaMeta};
use crate::crypto::Suite;
use crate::sa::{Encap, Mode, Protocol, Sa, SaConfig};
use crate::sad::SaId;
use crate::selector::TrafficSelector;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// What `sa add` / `sa del` / an install changed: the answer for the
/// operator (and the info log line). Never holds key material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaChange {
    /// One line saying what changed.
    pub message: String,
    /// What the operator should know: a connection left without an SA, a
    /// bundle larger than the TUN MTU allows for.
    pub warnings: Vec<String>,
    /// The SA installed (by an add or an install), if any.
    pub installed: Option<(Protocol, u32)>,
}

/// A child SA negotiated by IKE, to install on its connection: protocol,
/// keys, SPI, suite, ESN and UDP ports come from the negotiation; mode,
/// addresses, replay window, lifetimes, selectors and Q-ESP's IP protocol
/// number from the connection.
pub struct NegotiatedSa<'a> {
    /// The connection's name.
    pub conn: &'a str,
    /// We send on it (else we receive on it).
    pub outbound: bool,
    /// ESP, or Q-ESP (`docs/QESP.md` §7); never AH.
    pub protocol: Protocol,
    /// Its SPI (chosen by the receiving side).
    pub spi: u32,
    /// Its suite.
    pub suite: Suite,
    /// Encryption key (with the salt for AEAD suites).
    pub enc_key: &'a [u8],
    /// Integrity key.
    pub integ_key: &'a [u8],
    /// 64-bit sequence numbers.
    pub esn: bool,
    /// UDP encapsulation ports (ours, the peer's) when NAT-T is in use.
    pub encap: Option<(u16, u16)>,
    /// The peer's address where IKE talks to it (behind a NAT, a new
    /// mapping may have moved it away from the connection's `remote`, RFC
    /// 7296 §2.23): tunnel mode sends there. Ignored when of the other
    /// family. `None`: `remote`.
    pub peer: Option<IpAddr>,
    /// Its per-CPU slot (RFC 9611) on a connection with `per_cpu_sas` above
    /// 1: an outbound SA replaces the one of its slot only, and worker `w`
    /// sends on the `w % n`-th of the slots present. 0 otherwise.
    pub slot: u32,
    /// The selectors negotiated for it, our side as `local` (the peer may
    /// have narrowed the configured ones); empty: the connection's. An
    /// inbound SA accepts only packets inside them; an outbound SA carries
    /// their traffic, replacing only an SA with the same selectors (a
    /// peer may keep several children with different selectors).
    pub selectors: &'a [TrafficSelector],
}

/// An installed SA's keys and addressing, for `espgate wireshark-keys`
/// (the one place key material leaves the engine).
pub struct SaKeyView {
    /// Connection name.
    pub connection: String,
    /// We send on it.
    pub outbound: bool,
    /// The SA's configuration, keys included.
    pub config: SaConfig,
    /// Outer source address of its packets.
    pub src: IpAddr,
    /// Outer destination address of its packets.
    pub dst: IpAddr,
}

/// The keys of an SA spec with their raw values, in order (the spec parsed
/// already, so every item is `key=value`).
fn spec_keys(spec: &str) -> Vec<(&str, &str)> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter_map(|item| item.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect()
}

fn parse_port(key: &str, v: &str) -> Result<u16, String> {
    let n = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u16::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    };
    n.ok_or_else(|| format!("{key}: '{v}' is not a port"))
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Tunnel => "tunnel",
        Mode::Transport => "transport",
    }
}

/// Refuses spec keys of an added SA that contradict its connection: mode,
/// encapsulation, addresses and ports come from the connection (a key
/// equal to the connection's value is accepted), and an outbound SA's
/// first sequence number comes from its lease.
fn check_spec_against(
    c: &ConnSpec,
    outbound: bool,
    protocol: Protocol,
    given: &[(&str, &str)],
    parsed: &SaConfig,
) -> Result<(), String> {
    let dir = if outbound { "outbound" } else { "inbound" };
    let (src, dst) = if outbound {
        (c.local, c.remote)
    } else {
        (c.remote, c.local)
    };
    let (sport, dport) = if outbound {
        (c.local_port, c.remote_port)
    } else {
        (c.remote_port, c.local_port)
    };
    let from_conn = "the mode, encapsulation, addresses and ports of an added SA come from its \
                     connection: leave the key out";
    let name = &c.name;
    for (k, v) in given {
        let conflict = match *k {
            "mode" => (parsed.mode != c.mode)
                .then(|| format!("connection \"{name}\" is in {} mode", mode_name(c.mode))),
            "encap" => (matches!(parsed.encap, Encap::Udp { .. }) != c.udp).then(|| {
                format!(
                    "connection \"{name}\" uses encap {}",
                    if c.udp { "udp" } else { "none" }
                )
            }),
            "src" | "dst" => {
                let want = if *k == "src" { src } else { dst };
                let got = if *k == "src" {
                    parsed.tunnel_src
                } else {
                    parsed.tunnel_dst
                };
                (got != Some(want)).then(|| {
                    format!("the {dir} SAs of connection \"{name}\" go from {src} to {dst}")
                })
            }
            "sport" | "dport" => {
                if !c.udp {
                    Some(format!(
                        "connection \"{name}\" sends raw {}, without UDP ports",
                        protocol.name().to_uppercase()
                    ))
                } else {
                    let want = if *k == "sport" { sport } else { dport };
                    (parse_port(k, v)? != want).then(|| {
                        format!(
                            "the {dir} SAs of connection \"{name}\" use UDP ports {sport} -> \
                             {dport}"
                        )
                    })
                }
            }
            "seq" if outbound => {
                return Err(format!(
                    "seq={v}: an outbound SA starts at the sequence number reserved on disk for \
                     its key (gateway.state_dir), so that no nonce is ever reused: leave seq out"
                ))
            }
            "ipproto" => (parsed.ip_protocol != c.qesp_protocol).then(|| {
                format!(
                    "Q-ESP travels as IP protocol {} on this gateway (gateway.qesp_protocol)",
                    c.qesp_protocol
                )
            }),
            "tfc" if protocol == Protocol::Ah => {
                return Err(format!("tfc={v}: TFC padding is for ESP, not AH"))
            }
            _ => None,
        };
        if let Some(why) = conflict {
            return Err(format!("{k}={v}: {why}; {from_conn}"));
        }
    }
    Ok(())
}

/// A digest of an SA's keys: two outbound SAs with the same digest would
/// use one key, and so reuse nonces.
fn key_digest(c: &SaConfig) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    for k in [&c.enc_key[..], &c.integ_key[..]] {
        ctx.update(&(k.len() as u32).to_be_bytes());
        ctx.update(k);
    }
    let mut out = [0; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

impl Engine {
    /// `espgate sa add --conn NAME --dir in|out SPEC`: installs an SA on a
    /// connection at run time (lost on restart). `spec` is the one-line SA
    /// spec for the keying parts (`spi`, `suite`, `enc`, `integ`, `proto`,
    /// `esn`, `window`, `tfc`, `allow_insecure`, inbound `seq`); mode,
    /// encapsulation, addresses, ports, lifetimes and selectors come from
    /// the connection, and spec keys that contradict it are refused.
    ///
    /// An inbound SA is added next to the connection's others (all are
    /// accepted: make-before-break). An outbound SA replaces the
    /// connection's outbound SA of its protocol for the next packet; it
    /// starts at the sequence number its lease gives, like a configured
    /// SA.
    pub fn add_sa(
        &mut self,
        conn: &str,
        outbound: bool,
        spec: &str,
        now: Duration,
    ) -> Result<SaChange, String> {
        let ci = self.conn_index(conn)?;
        let parsed = crate::sa::spec::parse(spec).map_err(|e| format!("bad SA spec: {e}"))?;
        let given = spec_keys(spec);
        let has = |k: &str| given.iter().any(|(g, _)| *g == k);
        let c = &self.conns[ci].spec;
        let layers = c.layers.protocols();
        let protocol = if has("proto") {
            parsed.protocol
        } else if let [only] = layers {
            *only
        } else {
            return Err(format!(
                "connection \"{}\" is esp+ah: say proto=esp or proto=ah in the spec",
                c.name
            ));
        };
        if !layers.contains(&protocol) {
            return Err(format!(
                "proto={}: connection \"{}\" uses {}, not {}",
                protocol.name(),
                c.name,
                c.layers.name(),
                protocol.name()
            ));
        }
        check_spec_against(c, outbound, protocol, &given, &parsed)?;
        let mut sc = SaConfig::new(
            parsed.spi,
            protocol,
            parsed.suite,
            &parsed.enc_key,
            &parsed.integ_key,
        );
        let ports = (c.local_port, c.remote_port);
        c.shape_sa(&mut sc, c.mode_of(protocol), outbound, ports);
        if has("esn") {
            sc.esn = parsed.esn;
        }
        if has("window") {
            sc.replay_window = parsed.replay_window;
        }
        if has("tfc") {
            sc.tfc_pad_to = parsed.tfc_pad_to;
        }
        if has("allow_insecure") {
            sc.allow_insecure = parsed.allow_insecure;
        }
        if has("seq") {
            sc.initial_seq = parsed.initial_seq;
        }
        self.install_sa(ci, (outbound, 0), sc, true, now)
    }

    /// Installs a child SA negotiated by IKE (`outbound`: it replaces the
    /// connection's outbound SA for the next packet; inbound: accepted next
    /// to the others until removed). Fresh keys per SA: no lease is taken
    /// (its numbers start at 1 and cannot repeat a nonce of another key).
    ///
    /// ESP and Q-ESP fill the one layer of an IKE connection alike: an
    /// outbound SA of the other protocol replaces the current one and
    /// switches the connection's layers ([`Layers::Esp`] or
    /// [`Layers::Qesp`]); inbound SAs of either are accepted.
    pub fn install_negotiated(
        &mut self,
        s: &NegotiatedSa<'_>,
        now: Duration,
    ) -> Result<SaChange, String> {
        let ci = self.conn_index(s.conn)?;
        let c = &self.conns[ci].spec;
        let layers = match s.protocol {
            Protocol::Esp => Layers::Esp,
            Protocol::Qesp => Layers::Qesp,
            Protocol::Ah => {
                return Err(format!(
                    "connection \"{}\": IKE negotiates ESP or Q-ESP SAs, not AH",
                    c.name
                ))
            }
        };
        // Only an IKE connection (sized for negotiated SAs) switches
        // between ESP and Q-ESP.
        let switches = !c.negotiated.is_empty() && matches!(c.layers, Layers::Esp | Layers::Qesp);
        if !switches && c.layers != layers {
            return Err(format!(
                "connection \"{}\" applies {}: a negotiated {} SA does not fit it",
                c.name,
                c.layers.name(),
                s.protocol.name().to_uppercase()
            ));
        }
        let mut sc = SaConfig::new(s.spi, s.protocol, s.suite, s.enc_key, s.integ_key);
        let ports = s.encap.unwrap_or((c.local_port, c.remote_port));
        c.shape_sa(&mut sc, c.mode, s.outbound, ports);
        if let Some(peer) = s.peer {
            // Where IKE talks to the peer now, not the configured remote.
            sc.set_peer(SocketAddr::new(peer.to_canonical(), ports.1), s.outbound);
        }
        if !s.selectors.is_empty() {
            sc.selectors = s.selectors.to_vec();
        }
        // Negotiated, not configured.
        sc.esn = s.esn;
        sc.allow_insecure = false;
        // A cluster node may install the same negotiated keys again after
        // a restart (from etcd): its per-node IV counter must then go on
        // from where it was, so it takes a lease as manual keys do.
        let lease = self.cluster.is_some();
        let change = self.install_sa(ci, (s.outbound, s.slot), sc, lease, now)?;
        if s.outbound && self.conns[ci].spec.layers != layers {
            // The new outbound SA replaced the other protocol's: the
            // connection now sends this one.
            self.conns[ci].spec.layers = layers;
        }
        Ok(change)
    }

    /// The common end of `sa add` and IKE installs: checks the SPI and
    /// keys, takes a lease (`lease`, manual keys only), inserts the SA and
    /// points the connection's policies at it. An outbound SA replaces the
    /// connection's outbound SA of its layer, and with per-CPU SAs of its
    /// slot `pair` only.
    fn install_sa(
        &mut self,
        ci: usize,
        (outbound, pair): (bool, u32),
        mut sc: SaConfig,
        lease: bool,
        now: Duration,
    ) -> Result<SaChange, String> {
        let protocol = sc.protocol;
        let name = self.conns[ci].spec.name.clone();
        let dir = if outbound { "outbound" } else { "inbound" };
        let what = format!(
            "{dir} {} SA {:#010x}",
            protocol.name().to_uppercase(),
            sc.spi
        );
        if let Some(other) = self.sad.lookup(protocol, sc.spi) {
            let owner = self
                .meta_of(other)
                .map(|m| {
                    format!(
                        "connection \"{}\"'s {} SA",
                        self.conns[m.conn].spec.name,
                        if m.outbound { "outbound" } else { "inbound" }
                    )
                })
                .unwrap_or_else(|| "another SA".into());
            return Err(format!(
                "{} SPI {:#010x} is already in use ({owner}); SPIs are unique per protocol on a \
                 gateway: pick another one",
                protocol.name().to_uppercase(),
                sc.spi
            ));
        }
        // The suite, key lengths and options, checked before anything is
        // reserved or replaced.
        Sa::new(sc.clone(), now).map_err(|e| format!("{what}: {e}"))?;
        let per_cpu = self.conns[ci].spec.per_cpu_sas > 1;
        let pair = if per_cpu { pair } else { 0 };
        // An outbound SA joins the selector group of its selectors (`None`:
        // a new one) and replaces the SA of its layer, group and slot.
        let group = if outbound {
            self.find_group(ci, &sc.selectors)
        } else {
            Some(0)
        };
        let old = match group {
            Some(g) if outbound => self.conns[ci].out_ids.iter().copied().find(|id| {
                self.meta_of(*id).is_some_and(|m| {
                    self.same_layer(ci, m.protocol, protocol) && m.slot == pair && m.group == g
                })
            }),
            _ => None,
        };
        let mut taken = None;
        if let (true, Some(node)) = (outbound, self.cluster_node()) {
            sc.iv_source = crate::sa::IvSource::PerNode { node };
        }
        if outbound {
            let digest = key_digest(&sc);
            if let Some((id, _)) = self.sad.iter().find(|(id, sa)| {
                self.meta_of(*id).is_some_and(|m| m.outbound) && key_digest(sa.config()) == digest
            }) {
                return Err(format!(
                    "{what}: its keys are those of the {} already in use{}; one key on two SAs \
                     would reuse nonces: generate new keys",
                    self.sa_name(id),
                    if Some(id) == old {
                        ", which it would replace"
                    } else {
                        ""
                    }
                ));
            }
            if let Some(src) = self.leases.as_ref().filter(|_| lease) {
                let (start, l) = src.lease(&sc, &name)?;
                sc.start_at_lease(start);
                taken = Some(l);
            }
        }
        let mut sa = Sa::new(sc, now).map_err(|e| format!("{what}: {e}"))?;
        sa.split_volume_limits(self.volume_split);
        if let Some(l) = taken {
            sa.set_lease(l);
        }
        let suite = sa.config().suite.name();
        let new_group = group.is_none();
        let selectors = new_group.then(|| sa.config().selectors.clone());
        let id = self.sad.insert(sa).map_err(|e| format!("{what}: {e}"))?;
        let group = group.unwrap_or_else(|| {
            self.conns[ci].groups.extend(selectors);
            self.conns[ci].groups.len() as u32
        });
        *slot(&mut self.meta, id) = Some(SaMeta {
            conn: ci,
            outbound,
            protocol,
            added: true,
            slot: if outbound { pair } else { 0 },
            group,
        });
        let mut warnings = Vec::new();
        let message = if outbound {
            let replaced = old.map(|o| self.sa_name(o));
            if let Some(o) = old {
                self.remove_sa(o);
            }
            let layers = self.conns[ci].spec.layers.protocols();
            let c = &self.conns[ci];
            let at = if per_cpu {
                // Per-CPU pairs stay in slot order.
                c.out_ids
                    .iter()
                    .position(|o| self.meta_of(*o).is_some_and(|m| m.slot > pair))
                    .unwrap_or(c.out_ids.len())
            } else {
                layers
                    .iter()
                    .position(|p| self.same_layer(ci, *p, protocol))
                    .unwrap_or(0)
                    .min(c.out_ids.len())
            };
            self.conns[ci].out_ids.insert(at, id);
            self.fit_tfc(ci);
            if new_group {
                self.rebuild_spd();
            } else {
                self.refresh_policies(ci);
            }
            let next = self.sad.get(id).map_or(1, Sa::next_seq);
            if self.group_can_send(ci, group) {
                let outer = self.outer_mtu;
                let fit = self.group_fit(&self.conns[ci], group, usize::from(outer));
                let fit = u32::try_from(fit).unwrap_or(u32::MAX);
                if fit < self.sized_mtu {
                    warnings.push(format!(
                        "connection \"{name}\"'s bundle now keeps only packets of up to {fit} \
                         bytes within gateway.mtu {outer}, {} fewer than the TUN MTU ({}) sized \
                         at start: packets near the TUN MTU exceed gateway.mtu outside and are \
                         fragmented or dropped; put the keys in the configuration and restart to \
                         resize the TUN",
                        self.sized_mtu - fit,
                        self.sized_mtu
                    ));
                }
            } else {
                warnings.push(self.no_outbound_warning(ci));
            }
            let tfc = self
                .sad
                .get(id)
                .and_then(Sa::tfc_cap)
                .map(|(asked, to)| {
                    format!(
                        "; its TFC padding stops at {to} bytes, the longest packet its bundle \
                         keeps within the path (tfc_pad_to = {asked})"
                    )
                })
                .unwrap_or_default();
            match replaced {
                Some(r) => format!(
                    "connection \"{name}\": {what} ({suite}) replaces {r} for new packets, \
                     starting at sequence number {next}{tfc}"
                ),
                None => format!(
                    "connection \"{name}\": added {what} ({suite}), starting at sequence number \
                     {next}{tfc}"
                ),
            }
        } else {
            self.conns[ci].in_ids.push(id);
            let all: Vec<String> = self
                .layer_spis(ci, false, protocol)
                .iter()
                .map(|s| format!("{s:#010x}"))
                .collect();
            format!(
                "connection \"{name}\": added {what} ({suite}); {} inbound SAs accepted now: {}",
                protocol.name().to_uppercase(),
                all.join(", ")
            )
        };
        self.publish();
        Ok(SaChange {
            message,
            warnings,
            installed: Some((protocol, self.sad.get(id).map_or(0, |sa| sa.config().spi))),
        })
    }

    /// SPIs of connection `ci`'s SAs of one direction and layer (ESP and
    /// Q-ESP are one layer on an IKE connection).
    fn layer_spis(&self, ci: usize, outbound: bool, protocol: Protocol) -> Vec<u32> {
        let c = &self.conns[ci];
        if outbound { &c.out_ids } else { &c.in_ids }
            .iter()
            .filter(|id| {
                self.meta_of(**id)
                    .is_some_and(|m| self.same_layer(ci, protocol, m.protocol))
            })
            .filter_map(|id| self.sad.get(*id))
            .map(|sa| sa.config().spi)
            .collect()
    }

    fn no_outbound_warning(&self, ci: usize) -> String {
        let name = &self.conns[ci].spec.name;
        format!(
            "connection \"{name}\" has no complete outbound bundle now: its outbound packets are \
             dropped and counted as no_sa until `espgate sa add --conn {name} --dir out` \
             installs the missing SA"
        )
    }

    /// `espgate sa del --spi SPI [--proto esp|ah] [--dir in|out] [--conn
    /// NAME]`, and IKE's removals: removes an SA (configured or added) at
    /// run time. Without `protocol`, the SPI must name one SA. An outbound
    /// SA's exact next sequence number goes to its lease.
    pub fn del_sa(
        &mut self,
        spi: u32,
        protocol: Option<Protocol>,
        outbound: Option<bool>,
        conn: Option<&str>,
    ) -> Result<SaChange, String> {
        if let Some(c) = conn {
            self.conn_index(c)?;
        }
        let found: Vec<SaId> = [Protocol::Esp, Protocol::Ah, Protocol::Qesp]
            .into_iter()
            .filter(|p| protocol.is_none_or(|q| q == *p))
            .filter_map(|p| self.sad.lookup(p, spi))
            .collect();
        let id = match found.as_slice() {
            [] => {
                return Err(format!(
                    "no {}SA with SPI {spi:#010x} is installed (`espgate sa list` shows them)",
                    protocol
                        .map(|p| format!("{} ", p.name().to_uppercase()))
                        .unwrap_or_default()
                ))
            }
            [id] => *id,
            _ => {
                return Err(format!(
                    "both an ESP and an AH SA have SPI {spi:#010x}: say --proto esp or --proto ah"
                ))
            }
        };
        let m = self
            .meta_of(id)
            .ok_or_else(|| format!("SPI {spi:#010x}: internal error, SA without a connection"))?;
        let cname = self.conns[m.conn].spec.name.clone();
        let dir = |o: bool| if o { "outbound" } else { "inbound" };
        let what = format!("{} {}", dir(m.outbound), self.sa_name(id));
        if let Some(o) = outbound.filter(|o| *o != m.outbound) {
            return Err(format!(
                "{what} of connection \"{cname}\" is not an {} SA; nothing removed",
                dir(o)
            ));
        }
        if let Some(c) = conn.filter(|c| *c != cname) {
            return Err(format!(
                "{what} belongs to connection \"{cname}\", not \"{c}\"; nothing removed"
            ));
        }
        let (packets, bytes) = self.sad.get(id).map_or((0, 0), |sa| {
            (sa.counters().packets.get(), sa.counters().bytes.get())
        });
        self.remove_sa(id);
        let mut warnings = Vec::new();
        if m.outbound {
            if !self.can_send(m.conn) {
                warnings.push(self.no_outbound_warning(m.conn));
            }
        } else if self.layer_spis(m.conn, false, m.protocol).is_empty() {
            warnings.push(format!(
                "connection \"{cname}\" has no inbound {} SA left: its peer's packets are \
                 dropped (unknown_spi) until `espgate sa add --conn {cname} --dir in` installs \
                 one",
                m.protocol.name().to_uppercase()
            ));
        }
        self.publish();
        let message = format!(
            "connection \"{cname}\": removed {what} after {packets} packets, {bytes} bytes"
        );
        Ok(SaChange {
            message,
            warnings,
            installed: None,
        })
    }

    /// Appends the SPI and the peer's address of every inbound SA that
    /// arrives in UDP (ESP-in-UDP connections), for the shell's
    /// kernel-side filter.
    pub fn udp_inbound_sas(&self, out: &mut Vec<(u32, IpAddr)>) {
        for c in self.conns.iter().filter(|c| c.spec.udp) {
            out.extend(
                c.in_ids
                    .iter()
                    .filter_map(|id| self.sad.get(*id))
                    .map(|sa| {
                        let cfg = sa.config();
                        (cfg.spi, cfg.tunnel_src.unwrap_or(c.spec.remote))
                    }),
            );
        }
    }

    /// The keys of every installed SA, for `espgate wireshark-keys`.
    pub fn sa_keys(&self) -> Vec<SaKeyView> {
        let mut out = Vec::new();
        for c in &self.conns {
            for id in c.in_ids.iter().chain(&c.out_ids) {
                let (Some(sa), Some(m)) = (self.sad.get(*id), self.meta_of(*id)) else {
                    continue;
                };
                let k = &c.spec;
                let cfg = sa.config();
                // The tunnel's addresses (the peer's may have moved).
                let (src, dst) = if m.outbound {
                    (k.local, cfg.tunnel_dst.unwrap_or(k.remote))
                } else {
                    (cfg.tunnel_src.unwrap_or(k.remote), k.local)
                };
                out.push(SaKeyView {
                    connection: k.name.clone(),
                    outbound: m.outbound,
                    config: cfg.clone(),
                    src,
                    dst,
                });
            }
        }
        out
    }
}

/// Keeps the key-holding views out of debug output.
impl std::fmt::Debug for SaKeyView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaKeyView")
            .field("connection", &self.connection)
            .field("outbound", &self.outbound)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
