//! Helpers shared by the espgate-core fuzz targets and the seed generator
//! (`cargo run --example gen_seeds`): packet builders, the SA fixtures of the
//! `esp_inbound` target, and small normalisation helpers for oracles.
//!
//! Nothing here is part of the core; it only uses its public API.

use espgate_core::crypto::Suite;
use espgate_core::sa::{Encap, Mode, Protocol, SaConfig};
use espgate_core::selector::{Prefix, TrafficSelector};
use espgate_core::wire::{checksum, ip, ipv4, ipv6, proto, udp};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

/// Deterministic key material.
pub fn key(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A byte cursor that yields zeros once the input is exhausted, so every
/// input decodes to *some* test case and seeds can be laid out by hand.
pub struct Cursor<'a> {
    data: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// Reads from the front of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data }
    }
    /// One byte (0 when exhausted).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }
    /// Big-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    /// Big-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    /// Big-endian u64.
    pub fn u64(&mut self) -> u64 {
        (u64::from(self.u32()) << 32) | u64::from(self.u32())
    }
    /// Everything not read yet.
    pub fn rest(self) -> &'a [u8] {
        self.data
    }
}

/// A host address in one of a few small networks, so that selectors and
/// SPD prefixes get hit: `10.NET.0.HOST` or `2001:db8:NET::HOST`.
pub fn addr(v6: bool, net: u8, host: u8) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            u16::from(net),
            0,
            0,
            0,
            0,
            u16::from(host),
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, net, 0, host))
    }
}

/// An IP header (IPv4 without options, IPv6 without extension headers)
/// followed by `payload`. `payload` is truncated so the lengths fit.
pub fn ip_packet(src: IpAddr, dst: IpAddr, protocol: u8, tos: u8, payload: &[u8]) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let payload = &payload[..payload.len().min(65535 - 20)];
            let mut out = vec![0u8; 20];
            ipv4::Ipv4Repr {
                src: s,
                dst: d,
                protocol,
                tos,
                ident: 0x1234,
                dont_frag: tos & 0x10 != 0,
                ttl: 64,
                payload_len: payload.len(),
            }
            .emit(&mut out)
            .expect("ipv4 emit");
            out.extend_from_slice(payload);
            out
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let payload = &payload[..payload.len().min(65535)];
            let mut out = vec![0u8; 40];
            ipv6::Ipv6Repr {
                src: s,
                dst: d,
                next_header: protocol,
                traffic_class: tos,
                flow_label: 0x12345,
                hop_limit: 64,
                payload_len: payload.len(),
            }
            .emit(&mut out)
            .expect("ipv6 emit");
            out.extend_from_slice(payload);
            out
        }
        _ => panic!("mixed address families"),
    }
}

/// A UDP datagram with correct checksum inside an IP packet.
pub fn udp_packet(
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    tos: u8,
    payload: &[u8],
) -> Vec<u8> {
    let max = if src.is_ipv4() { 65535 - 28 } else { 65535 - 8 };
    let payload = &payload[..payload.len().min(max)];
    let mut l4 = vec![0u8; udp::HEADER_LEN];
    udp::emit(&mut l4, sport, dport, payload.len()).expect("udp emit");
    l4.extend_from_slice(payload);
    let mut c = checksum::finish(checksum::sum(
        checksum::pseudo_header(src, dst, proto::UDP, l4.len() as u32),
        &l4,
    ));
    if c == 0 {
        c = 0xffff;
    }
    l4[6..8].copy_from_slice(&c.to_be_bytes());
    ip_packet(src, dst, proto::UDP, tos, &l4)
}

/// `bytes` itself (cut to its IP length) when it parses as an IP packet,
/// otherwise a synthetic UDP packet carrying `bytes`. The bool is true
/// for the synthetic case (a well-formed packet every SA must accept).
pub fn inner_packet(bytes: &[u8], v6: bool, tos: u8, nets: u8) -> (Vec<u8>, bool) {
    if let Ok(info) = ip::parse(bytes) {
        return (bytes[..info.packet_len].to_vec(), false);
    }
    // nets: low nibble picks the source network, high nibble the destination.
    let src = addr(v6, 1 + (nets & 1), 10 + (nets >> 2 & 3));
    let dst = addr(v6, 2 + (nets >> 4 & 1), 20 + (nets >> 6));
    (udp_packet(src, dst, 1234, 5678, tos, bytes), true)
}

/// Recomputes the IPv4 header checksum (no-op for anything else).
pub fn fix_v4_checksum(pkt: &mut [u8]) {
    if pkt.first().map(|b| b >> 4) == Some(4) {
        if let Ok(mut h) = ipv4::Ipv4::new_header_checked(&mut pkt[..]) {
            h.fill_checksum();
        }
    }
}

/// Clears the ECN bits of an IP header (RFC 6040 may legitimately change
/// them on decapsulation) and fixes the IPv4 checksum.
pub fn clear_ecn(pkt: &mut [u8]) {
    match pkt.first().map(|b| b >> 4) {
        Some(4) if pkt.len() >= 20 => {
            pkt[1] &= !0x03;
            fix_v4_checksum(pkt);
        }
        Some(6) if pkt.len() >= 40 => pkt[1] &= !0x30,
        _ => {}
    }
}

/// Where a transport-mode ESP/AH header goes (IPv4: after the header with
/// options; IPv6: after hop-by-hop/routing/fragment headers).
pub fn transport_keep(pkt: &[u8]) -> Option<usize> {
    match pkt.first().map(|b| b >> 4) {
        Some(4) => ipv4::Ipv4::new_header_checked(pkt)
            .ok()
            .map(|h| h.header_len()),
        Some(6) => ipv6::walk_ext(pkt).ok().map(|w| w.insert_offset),
        _ => None,
    }
}

/// The protocol a transport-mode ESP/AH header would carry as its next
/// header (the byte at the insertion point's next-header field).
pub fn transport_nh(pkt: &[u8]) -> Option<u8> {
    match pkt.first().map(|b| b >> 4) {
        Some(4) => pkt.get(9).copied(),
        Some(6) => ipv6::walk_ext(pkt)
            .ok()
            .and_then(|w| pkt.get(w.insert_nh_field).copied()),
        _ => None,
    }
}

/// The AH integrity suites (AH SAs are not in `Suite::all()`).
pub const AH_SUITES: [&str; 6] = ["sha1", "sha256", "sha384", "sha512", "aesxcbc", "md5"];

/// Index of an SA in [`inbound_configs`].
pub mod sa_ix {
    /// aes128gcm16, tunnel, raw ESP, IPv4 outer.
    pub const E_GCM: usize = 0;
    /// aes256-sha256, transport, ESP-in-UDP.
    pub const E_CBC_SHA256: usize = 1;
    /// chacha20poly1305, tunnel, ESP-in-UDP, IPv6 outer, ESN near 2^32.
    pub const E_CHACHA_ESN: usize = 2;
    /// null-sha1, transport, raw ESP.
    pub const E_NULL_SHA1: usize = 3;
    /// aes128gmac, tunnel, raw ESP, IPv6 outer.
    pub const E_GMAC: usize = 4;
    /// 3des-md5 (allow_insecure), tunnel, ESP-in-UDP, IPv4 outer, selectors.
    pub const E_3DES_MD5: usize = 5;
    /// aes128-aesxcbc, transport, raw ESP, replay window 0.
    pub const E_XCBC: usize = 6;
    /// Number of ESP SAs (they come first).
    pub const N_ESP: usize = 7;
    /// AH sha256, transport.
    pub const A_SHA256: usize = 7;
    /// AH sha1, tunnel, IPv4 outer.
    pub const A_SHA1: usize = 8;
    /// Number of ESP and AH SAs: the `crafted` mode's choices, and the
    /// single-SA stacks that come first in [`super::stacks`].
    pub const N_CLASSIC: usize = 9;
    /// Q-ESP aes128gcm16, tunnel, raw IP protocol 253, IPv4 outer (added
    /// after the others so that older corpus entries keep their SAs).
    pub const Q_GCM: usize = 9;
    /// Number of SAs.
    pub const N: usize = 10;
}

/// First sequence number the inbound ESN SA expects (its window straddles
/// the 2^32 boundary soon, exercising high-half inference).
pub const ESN_BASE: u64 = (1 << 32) - 4;

fn cfg(
    spi: u32,
    protocol: Protocol,
    suite: &str,
    seed: u8,
    mode: Mode,
    encap: Encap,
    outer_v6: bool,
) -> SaConfig {
    let suite: Suite = suite.parse().expect("suite");
    let mut c = SaConfig::new(
        spi,
        protocol,
        suite,
        &key(suite.enc_key_len(), seed),
        &key(suite.integ_key_len(), seed.wrapping_add(0x40)),
    );
    c.mode = mode;
    c.encap = encap;
    if outer_v6 {
        c.tunnel_src = Some("2001:db8:ff::1".parse().unwrap());
        c.tunnel_dst = Some("2001:db8:ff::2".parse().unwrap());
    } else {
        c.tunnel_src = Some("192.0.2.1".parse().unwrap());
        c.tunnel_dst = Some("192.0.2.2".parse().unwrap());
    }
    c
}

/// The inbound SAs of the `esp_inbound` target (see [`sa_ix`]); the same
/// configs keyed as outbound SAs produce packets they accept.
pub fn inbound_configs() -> &'static [SaConfig] {
    static CFGS: OnceLock<Vec<SaConfig>> = OnceLock::new();
    CFGS.get_or_init(|| {
        use Mode::{Transport, Tunnel};
        let nat = Encap::NAT_T;
        let raw = Encap::None;
        let esp = Protocol::Esp;
        let mut v = vec![
            cfg(0x1001, esp, "aes128gcm16", 1, Tunnel, raw, false),
            cfg(0x1002, esp, "aes256-sha256", 2, Transport, nat, false),
            cfg(0x1003, esp, "chacha20poly1305", 3, Tunnel, nat, true),
            cfg(0x1004, esp, "null-sha1", 4, Transport, raw, false),
            cfg(0x1005, esp, "aes128gmac", 5, Tunnel, raw, true),
            cfg(0x1006, esp, "3des-md5", 6, Tunnel, nat, false),
            cfg(0x1007, esp, "aes128-aesxcbc", 7, Transport, raw, false),
            cfg(0x2001, Protocol::Ah, "sha256", 8, Transport, raw, false),
            cfg(0x2002, Protocol::Ah, "sha1", 9, Tunnel, raw, false),
            cfg(
                0x3001,
                Protocol::Qesp,
                "aes128gcm16",
                10,
                Tunnel,
                raw,
                false,
            ),
        ];
        v[sa_ix::E_CHACHA_ESN].esn = true;
        v[sa_ix::E_CHACHA_ESN].initial_seq = ESN_BASE;
        v[sa_ix::E_3DES_MD5].allow_insecure = true;
        // Inbound, local is the destination side (10.2/16), remote the source (10.1/16).
        v[sa_ix::E_3DES_MD5].selectors = vec![
            TrafficSelector::between(
                "10.2.0.0/16".parse::<Prefix>().unwrap(),
                "10.1.0.0/16".parse::<Prefix>().unwrap(),
            ),
            TrafficSelector::between(
                "2001:db8:2::/48".parse::<Prefix>().unwrap(),
                "2001:db8:1::/48".parse::<Prefix>().unwrap(),
            ),
        ];
        v[sa_ix::E_XCBC].replay_window = 0;
        assert_eq!(v.len(), sa_ix::N);
        v
    })
}

/// SA stacks for the `esp_inbound` target, innermost first (outbound order).
pub fn stacks() -> &'static [Vec<usize>] {
    static STACKS: OnceLock<Vec<Vec<usize>>> = OnceLock::new();
    STACKS.get_or_init(|| {
        let mut v: Vec<Vec<usize>> = (0..sa_ix::N_CLASSIC).map(|i| vec![i]).collect();
        for e in 0..sa_ix::N_ESP {
            v.push(vec![e, sa_ix::A_SHA256]);
        }
        for e in 0..sa_ix::N_ESP {
            v.push(vec![e, sa_ix::A_SHA1]);
        }
        // Q-ESP alone and under AH (appended: older corpus entries keep
        // their stacks).
        v.push(vec![sa_ix::Q_GCM]);
        v.push(vec![sa_ix::Q_GCM, sa_ix::A_SHA256]);
        v.push(vec![sa_ix::Q_GCM, sa_ix::A_SHA1]);
        v
    })
}

/// Outbound sequence number for SA `i` chosen from a fuzz value: always
/// acceptable to a fresh inbound SA with the same config.
pub fn outbound_seq(c: &SaConfig, v: u32) -> u64 {
    if c.esn {
        // Stay below 2^33 - window so the high half is inferred correctly.
        c.initial_seq + u64::from(v % (1 << 31))
    } else {
        c.initial_seq + u64::from(v) % (u64::from(u32::MAX) + 1 - c.initial_seq)
    }
}
