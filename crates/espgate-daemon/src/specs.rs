//! The configuration's connections as the engine runs them
//! ([`espgate_core::gateway::ConnSpec`]).

use espgate_config::{Connection, Dscp, Encapsulation, Protocols};
use espgate_core::crypto::{Integ, Suite};
use espgate_core::gateway::{ConnSpec, Layers, MssClamp, SaSettings};
use espgate_core::sa::Mode;
use std::net::IpAddr;

/// The engine's view of `c`, with its manually keyed SAs (none for IKE).
pub fn conn_spec(c: &Connection) -> ConnSpec {
    let sas = c.sa_configs();
    ConnSpec {
        name: c.name.clone(),
        local: c.local,
        remote: c.remote,
        local_port: c.local_port,
        remote_port: c.remote_port,
        mode: c.mode,
        layers: match c.protocol {
            Protocols::Esp => Layers::Esp,
            Protocols::Ah => Layers::Ah,
            Protocols::EspAh => Layers::EspAh,
        },
        udp: c.encap == Encapsulation::Udp,
        local_ts: c.local_ts.clone(),
        remote_ts: c.remote_ts.clone(),
        selectors: c.selectors(),
        mss_clamp: match c.mss_clamp {
            espgate_config::MssClamp::Off => MssClamp::Off,
            espgate_config::MssClamp::Fixed(n) => MssClamp::Fixed(n),
            espgate_config::MssClamp::Auto => MssClamp::Auto,
        },
        per_cpu_sas: c.per_cpu_sas,
        sa: SaSettings {
            esn: c.esn,
            replay_window: c.replay_window,
            lifetime: c.lifetime,
            allow_insecure: c.allow_insecure,
            tfc_pad_to: c.tfc_pad_to,
            copy_dscp: c.dscp == Dscp::Copy,
        },
        inbound: sas.inbound,
        outbound: sas.outbound,
        negotiated_overhead: ike_overhead(c),
    }
}

/// The most an IKE-negotiated ESP SA of connection `c` can add to a packet:
/// the worst of its ESP proposals (the TUN MTU is sized at start, before
/// any SA exists). Zero for a manually keyed connection.
fn ike_overhead(c: &Connection) -> usize {
    let Some(ike) = &c.ike else { return 0 };
    let outer = match (c.mode, c.remote) {
        (Mode::Transport, _) => 0,
        (Mode::Tunnel, IpAddr::V6(_)) => 40,
        (Mode::Tunnel, IpAddr::V4(_)) => 20,
    };
    let udp = if c.encap == Encapsulation::Udp { 8 } else { 0 };
    let mut worst = 0;
    for p in &ike.esp_proposals {
        for e in &p.encr {
            let integs: Vec<Option<Integ>> = if p.integ.is_empty() {
                vec![None]
            } else {
                p.integ.iter().copied().map(Some).collect()
            };
            for i in integs {
                let suite = Suite {
                    enc: Some(*e),
                    integ: i,
                };
                // ESP header 8, IV, padding, pad length + next header 2, ICV.
                let esp = 8 + suite.iv_len() + (suite.block_len().max(4) - 1) + 2 + suite.icv_len();
                worst = worst.max(outer + udp + esp);
            }
        }
    }
    worst
}
