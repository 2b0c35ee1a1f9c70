//! Q-ESP (seed paper 002; espgate's specification in `docs/QESP.md`): an
//! ESP whose 16-byte header carries the protected flow's ports and
//! transport protocol in clear, so DiffServ classifiers can see them, and
//! whose ICV also covers the outer addresses.
//!
//! ```text
//! | Src port (2) | Dst port (2) | TLP (1) | Reserved (3) | SPI (4) | Seq (4) | IV | ... as ESP
//! ```
//!
//! [`Qesp`] is the [`EspLayout`] the ESP path (`sa/esp.rs`) runs with; the
//! padding, trailer, transform, replay and lifetimes are ESP's.

use super::esp::{EspAuth, EspLayout, OuterAddrs};
use super::{be16, be32, ip, proto, put16, put32};
use crate::crypto::AuthCtx;
use crate::error::{DropReason, PResult};
use std::net::IpAddr;

/// Ports, TLP, reserved, SPI, sequence number.
pub const HEADER_LEN: usize = 16;

/// The default IP protocol number: RFC 3692's first experimental value.
pub const DEFAULT_IP_PROTOCOL: u8 = 253;

/// Longest authenticated prefix: two IPv6 addresses and the header.
const MAX_AAD: usize = 16 + 16 + HEADER_LEN + 4;

/// IP protocol numbers a gateway may not give Q-ESP: reserved values and
/// those espgate already carries or processes itself.
pub const RESERVED_PROTOCOLS: [u8; 10] = [
    0,
    proto::ICMP,
    proto::IPV4,
    proto::TCP,
    proto::UDP,
    proto::IPV6,
    proto::ESP,
    proto::AH,
    proto::ICMPV6,
    255,
];

/// Why `number` cannot be Q-ESP's IP protocol number, if it cannot.
pub fn check_ip_protocol(number: u8) -> Result<(), String> {
    if RESERVED_PROTOCOLS.contains(&number) {
        Err(format!(
            "IP protocol {number} cannot carry Q-ESP: it is reserved or already used by espgate \
             (253 and 254 are RFC 3692's experimental numbers)"
        ))
    } else {
        Ok(())
    }
}

/// The fields a Q-ESP header shows in clear: the protected packet's ports
/// (0 when it has none) and its transport protocol (`docs/QESP.md` §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClearFields {
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Transport-layer protocol number.
    pub tlp: u8,
}

/// Protocols whose first four header bytes are the source and destination
/// ports.
fn has_ports(p: u8) -> bool {
    matches!(
        p,
        proto::TCP | proto::UDP | 33 | proto::SCTP | proto::UDPLITE
    )
}

impl ClearFields {
    /// The clear fields of the IP packet `pkt` (the inner packet in tunnel
    /// mode, the packet itself before protection in transport mode).
    pub fn of_packet(pkt: &[u8]) -> PResult<ClearFields> {
        let info = ip::parse(pkt)?;
        let l4 = pkt.get(info.payload_offset..info.packet_len).unwrap_or(&[]);
        Ok(Self::of_segment(info.protocol, info.later_fragment, l4))
    }

    /// The clear fields of a transport segment `l4` of protocol `tlp`
    /// (`later_fragment`: it does not start with the transport header).
    pub fn of_segment(tlp: u8, later_fragment: bool, l4: &[u8]) -> ClearFields {
        if !later_fragment && has_ports(tlp) && l4.len() >= 4 {
            ClearFields {
                sport: be16(l4, 0),
                dport: be16(l4, 2),
                tlp,
            }
        } else {
            ClearFields {
                sport: 0,
                dport: 0,
                tlp,
            }
        }
    }
}

/// A checked view of the fixed Q-ESP header.
#[derive(Debug, Clone, Copy)]
pub struct QespHeader<'a> {
    b: &'a [u8],
}

impl<'a> QespHeader<'a> {
    /// Requires at least the 16-byte header.
    pub fn new_checked(b: &'a [u8]) -> PResult<Self> {
        if b.len() < HEADER_LEN {
            return Err(DropReason::BadLength);
        }
        Ok(QespHeader { b })
    }
    /// Clear source port.
    pub fn sport(&self) -> u16 {
        be16(self.b, 0)
    }
    /// Clear destination port.
    pub fn dport(&self) -> u16 {
        be16(self.b, 2)
    }
    /// Transport-layer protocol of the protected packet.
    pub fn tlp(&self) -> u8 {
        self.b[4]
    }
    /// The 24 reserved bits.
    pub fn reserved(&self) -> u32 {
        u32::from_be_bytes([0, self.b[5], self.b[6], self.b[7]])
    }
    /// Security Parameters Index.
    pub fn spi(&self) -> u32 {
        be32(self.b, 8)
    }
    /// Low 32 bits of the sequence number.
    pub fn seq(&self) -> u32 {
        be32(self.b, 12)
    }
    /// Ports and TLP.
    pub fn clear(&self) -> ClearFields {
        ClearFields {
            sport: self.sport(),
            dport: self.dport(),
            tlp: self.tlp(),
        }
    }
}

/// Writes a Q-ESP header (`out` is at least 16 bytes; reserved bits zero).
pub fn emit_header(out: &mut [u8], clear: &ClearFields, spi: u32, seq: u64) {
    put16(out, 0, clear.sport);
    put16(out, 2, clear.dport);
    out[4] = clear.tlp;
    out[5..8].fill(0);
    put32(out, 8, spi);
    put32(out, 12, seq as u32);
}

/// Q-ESP as [`EspLayout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qesp;

/// [`Qesp`]'s authenticated data: `outer src | outer dst | header [| seq
/// high]`, as AEAD associated data or split around the packet for a
/// separate MAC (`docs/QESP.md` §4). Built on the stack.
#[derive(Debug, Clone, Copy)]
pub struct QespAuth {
    buf: [u8; MAX_AAD],
    /// Length of the addresses.
    addr_len: usize,
    /// Length of addresses + header + seq high.
    len: usize,
}

impl EspAuth for QespAuth {
    #[inline]
    fn auth_ctx(&self) -> AuthCtx<'_> {
        AuthCtx {
            aad: &self.buf[..self.len],
            mac_prefix: &self.buf[..self.addr_len],
            // The MAC covers the header as part of the packet; what follows
            // it here is the high sequence half, if any.
            mac_suffix: &self.buf[self.addr_len + HEADER_LEN..self.len],
        }
    }
}

fn put_addr(out: &mut [u8], a: IpAddr) -> usize {
    match a {
        IpAddr::V4(v) => {
            out[..4].copy_from_slice(&v.octets());
            4
        }
        IpAddr::V6(v) => {
            out[..16].copy_from_slice(&v.octets());
            16
        }
    }
}

impl EspLayout for Qesp {
    const IP_PROTOCOL: u8 = DEFAULT_IP_PROTOCOL;
    const HEADER_LEN: usize = HEADER_LEN;
    type Auth = QespAuth;
    type Clear = ClearFields;

    #[inline]
    fn clear_of(pkt: &[u8]) -> PResult<ClearFields> {
        ClearFields::of_packet(pkt)
    }

    #[inline]
    fn emit_header(hdr: &mut [u8], spi: u32, seq: u64, clear: &ClearFields) -> PResult<()> {
        emit_header(hdr, clear, spi, seq);
        Ok(())
    }

    #[inline]
    fn parse_header(pkt: &[u8]) -> PResult<(u32, u32)> {
        let h = QespHeader::new_checked(pkt)?;
        Ok((h.spi(), h.seq()))
    }

    #[inline]
    fn header_clear(pkt: &[u8]) -> PResult<ClearFields> {
        Ok(QespHeader::new_checked(pkt)?.clear())
    }

    #[inline]
    fn auth(pkt: &[u8], seq: u64, esn: bool, outer: &OuterAddrs) -> QespAuth {
        let mut buf = [0u8; MAX_AAD];
        let mut n = put_addr(&mut buf, outer.src);
        n += put_addr(&mut buf[n..], outer.dst);
        let addr_len = n;
        buf[n..n + HEADER_LEN].copy_from_slice(&pkt[..HEADER_LEN]);
        n += HEADER_LEN;
        if esn {
            buf[n..n + 4].copy_from_slice(&((seq >> 32) as u32).to_be_bytes());
            n += 4;
        }
        QespAuth {
            buf,
            addr_len,
            len: n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4_udp(sport: u16, dport: u16) -> Vec<u8> {
        let mut p = vec![0u8; 28];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&28u16.to_be_bytes());
        p[8] = 64;
        p[9] = proto::UDP;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[20..22].copy_from_slice(&sport.to_be_bytes());
        p[22..24].copy_from_slice(&dport.to_be_bytes());
        p[24..26].copy_from_slice(&8u16.to_be_bytes());
        p
    }

    #[test]
    fn header_round_trip_and_offsets() {
        let c = ClearFields {
            sport: 0x1234,
            dport: 5004,
            tlp: proto::UDP,
        };
        let mut h = [0xffu8; HEADER_LEN];
        emit_header(&mut h, &c, 0xdead_beef, 0x1_0000_0007);
        assert_eq!(
            h,
            [0x12, 0x34, 0x13, 0x8c, 17, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 7]
        );
        let v = QespHeader::new_checked(&h).unwrap();
        assert_eq!(v.clear(), c);
        assert_eq!((v.spi(), v.seq(), v.reserved()), (0xdead_beef, 7, 0));
        assert_eq!(Qesp::parse_header(&h).unwrap(), (0xdead_beef, 7));
        assert_eq!(
            QespHeader::new_checked(&h[..15]).unwrap_err(),
            DropReason::BadLength
        );
    }

    #[test]
    fn clear_fields_follow_the_spec() {
        let p = v4_udp(4000, 5004);
        assert_eq!(
            ClearFields::of_packet(&p).unwrap(),
            ClearFields {
                sport: 4000,
                dport: 5004,
                tlp: 17
            }
        );
        // ICMP: TLP only.
        let mut icmp = p.clone();
        icmp[9] = proto::ICMP;
        assert_eq!(
            ClearFields::of_packet(&icmp).unwrap(),
            ClearFields {
                sport: 0,
                dport: 0,
                tlp: 1
            }
        );
        // A later fragment: no ports.
        let mut frag = p.clone();
        frag[6..8].copy_from_slice(&1u16.to_be_bytes());
        assert_eq!(ClearFields::of_packet(&frag).unwrap().sport, 0);
        // Truncated transport header: no ports.
        let mut short = p[..22].to_vec();
        short[2..4].copy_from_slice(&22u16.to_be_bytes());
        assert_eq!(ClearFields::of_packet(&short).unwrap().dport, 0);
        // Through the layout, as the ESP path asks.
        assert_eq!(Qesp::clear_of(&p).unwrap().dport, 5004);
        assert!(Qesp::clear_of(&p[..10]).is_err());
    }

    #[test]
    fn auth_covers_addresses_header_and_esn() {
        let mut h = [0u8; HEADER_LEN];
        emit_header(&mut h, &ClearFields::default(), 1, 0x2_0000_0001);
        let v4 = OuterAddrs {
            src: Ipv4Addr::new(192, 0, 2, 1).into(),
            dst: Ipv4Addr::new(192, 0, 2, 2).into(),
        };
        let a = Qesp::auth(&h, 0x2_0000_0001, false, &v4);
        let c = a.auth_ctx();
        assert_eq!(c.aad.len(), 8 + 16);
        assert_eq!(&c.aad[..8], &[192, 0, 2, 1, 192, 0, 2, 2]);
        assert_eq!(&c.aad[8..], &h);
        assert_eq!(c.mac_prefix, &c.aad[..8]);
        assert!(c.mac_suffix.is_empty());
        let a = Qesp::auth(&h, 0x2_0000_0001, true, &v4);
        let c = a.auth_ctx();
        assert_eq!(&c.aad[24..], &[0, 0, 0, 2]);
        assert_eq!(c.mac_suffix, &[0, 0, 0, 2]);
        let v6 = OuterAddrs {
            src: Ipv6Addr::LOCALHOST.into(),
            dst: Ipv6Addr::UNSPECIFIED.into(),
        };
        let a = Qesp::auth(&h, 1, true, &v6);
        assert_eq!(a.auth_ctx().aad.len(), 32 + 16 + 4);
        assert_eq!(a.auth_ctx().mac_prefix.len(), 32);
    }

    #[test]
    fn protocol_numbers() {
        assert!(check_ip_protocol(253).is_ok());
        assert!(check_ip_protocol(254).is_ok());
        for n in RESERVED_PROTOCOLS {
            assert!(check_ip_protocol(n).is_err(), "{n}");
        }
    }
}
