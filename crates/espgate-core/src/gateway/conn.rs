//! What the engine needs to know of a connection: its addresses, layers,
//! selectors and SA settings, and its manually keyed SAs.

use crate::mss::MssLimit;
use crate::sa::{Encap, Growth, Lifetime, Mode, Protocol, SaConfig};
use crate::selector::{Prefix, TrafficSelector};
use std::net::IpAddr;

/// A connection's IPsec layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layers {
    /// ESP alone.
    Esp,
    /// AH alone.
    Ah,
    /// ESP inside AH.
    EspAh,
    /// Q-ESP alone (`docs/QESP.md`).
    Qesp,
}

impl Layers {
    /// The layers in bundle order: ESP first, AH outermost.
    pub const fn protocols(self) -> &'static [Protocol] {
        match self {
            Layers::Esp => &[Protocol::Esp],
            Layers::Ah => &[Protocol::Ah],
            Layers::EspAh => &[Protocol::Esp, Protocol::Ah],
            Layers::Qesp => &[Protocol::Qesp],
        }
    }

    /// `esp`, `ah` or `esp+ah`.
    pub const fn name(self) -> &'static str {
        match self {
            Layers::Esp => "esp",
            Layers::Ah => "ah",
            Layers::EspAh => "esp+ah",
            Layers::Qesp => "qesp",
        }
    }

    /// True when AH is one of the layers (it is then the outermost).
    pub const fn has_ah(self) -> bool {
        matches!(self, Layers::Ah | Layers::EspAh)
    }
}

/// TCP MSS clamping of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MssClamp {
    /// No clamping.
    Off,
    /// Clamp to this MSS.
    Fixed(u16),
    /// Clamp to what fits the TUN MTU.
    Auto,
}

/// The settings every SA of a connection gets ([`ConnSpec::shape_sa`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaSettings {
    /// 64-bit extended sequence numbers.
    pub esn: bool,
    /// Replay window in packets (0 disables the check).
    pub replay_window: u32,
    /// Lifetime limits.
    pub lifetime: Lifetime,
    /// Legacy suites allowed.
    pub allow_insecure: bool,
    /// Tunnel-mode TFC padding target (ESP only).
    pub tfc_pad_to: Option<u16>,
    /// Copy the DSCP of inner packets to the outer header.
    pub copy_dscp: bool,
}

/// One connection as the engine runs it.
#[derive(Debug, Clone)]
pub struct ConnSpec {
    /// Unique name.
    pub name: String,
    /// Our outer address.
    pub local: IpAddr,
    /// The peer's outer address.
    pub remote: IpAddr,
    /// UDP source port of outbound ESP-in-UDP.
    pub local_port: u16,
    /// UDP destination port of outbound ESP-in-UDP.
    pub remote_port: u16,
    /// Tunnel or transport.
    pub mode: Mode,
    /// ESP, AH, both, or Q-ESP.
    pub layers: Layers,
    /// The IP protocol number Q-ESP travels as on this gateway.
    pub qesp_protocol: u8,
    /// ESP travels in UDP (RFC 3948); otherwise raw ESP/AH.
    pub udp: bool,
    /// Our side's prefixes (for status).
    pub local_ts: Vec<Prefix>,
    /// The peer's prefixes (for status).
    pub remote_ts: Vec<Prefix>,
    /// Further selector sets, (ours, the peer's), beyond `local_ts` and
    /// `remote_ts`: an IKE connection's `[[connection.ike.child]]` tables
    /// (for status; `selectors` holds their pairs too).
    pub more_ts: Vec<(Vec<Prefix>, Vec<Prefix>)>,
    /// The policies' selectors: what this connection carries.
    pub selectors: Vec<TrafficSelector>,
    /// TCP MSS clamping both ways.
    pub mss_clamp: MssClamp,
    /// Per-CPU ESP SA pairs (1: plain): worker `w` sends on pair
    /// `w % per_cpu_sas`.
    pub per_cpu_sas: u32,
    /// Settings of every SA.
    pub sa: SaSettings,
    /// The manually keyed SAs we receive on (ESP first, then AH).
    pub inbound: Vec<SaConfig>,
    /// The manually keyed SAs we send on, in bundle order.
    pub outbound: Vec<SaConfig>,
    /// How each SA IKE may negotiate (one per ESP proposal's suite) grows a
    /// packet, for sizing the TUN MTU before any SA exists. Empty for
    /// manually keyed connections.
    pub negotiated: Vec<Growth>,
}

impl ConnSpec {
    /// Gives an SA of this connection the connection-wide settings: `mode`,
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
        c.encap = match (self.udp, outbound) {
            (false, _) => Encap::None,
            (true, true) => Encap::Udp {
                src_port: ours,
                dst_port: theirs,
            },
            (true, false) => Encap::Udp {
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
        c.esn = self.sa.esn;
        c.replay_window = self.sa.replay_window;
        c.lifetime = self.sa.lifetime;
        c.selectors = self.selectors.clone();
        c.allow_insecure = self.sa.allow_insecure;
        if c.protocol == Protocol::Qesp {
            c.ip_protocol = self.qesp_protocol;
        }
        c.tfc_pad_to = if c.protocol.is_esp_like() {
            self.sa.tfc_pad_to
        } else {
            None
        };
        c.copy_dscp = self.sa.copy_dscp;
    }

    /// The mode of this connection's SA of `protocol`: AH over ESP is
    /// transport mode on the ESP packet; otherwise the connection's.
    pub fn mode_of(&self, protocol: Protocol) -> Mode {
        if protocol == Protocol::Ah && self.layers == Layers::EspAh {
            Mode::Transport
        } else {
            self.mode
        }
    }

    /// The MSS limit for a TUN of `tun_mtu` bytes, if clamping is on.
    pub fn mss_limit(&self, tun_mtu: u32) -> Option<MssLimit> {
        match self.mss_clamp {
            MssClamp::Off => None,
            MssClamp::Fixed(n) => Some(MssLimit::fixed(n)),
            MssClamp::Auto => Some(MssLimit::for_mtu(tun_mtu)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_and_modes() {
        assert_eq!(Layers::EspAh.protocols(), &[Protocol::Esp, Protocol::Ah]);
        assert!(Layers::EspAh.has_ah() && !Layers::Esp.has_ah());
        assert_eq!(Layers::EspAh.name(), "esp+ah");
    }
}
