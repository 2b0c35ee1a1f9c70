//! The one ICMP message the gateway originates: "too big" for a clear
//! packet that would not fit the tunnel's path once protected — ICMP
//! "fragmentation needed" (RFC 792, RFC 1191 §4) and ICMPv6 "packet too
//! big" (RFC 4443 §3.2). RFC 4301 §8.2.1 asks an IPsec gateway to tell the
//! inner sender so; [`too_big_in_place`] turns the refused packet's buffer
//! into that message, quoting the packet's start, without allocating.

use super::{ip, ipv4, ipv6, proto};
use crate::buf::PacketBuf;
use crate::error::{DropReason, PResult};
use crate::wire::checksum;
use std::net::IpAddr;

/// ICMP destination unreachable.
pub const V4_UNREACHABLE: u8 = 3;
/// Its code "fragmentation needed and DF set".
pub const V4_FRAG_NEEDED: u8 = 4;
/// ICMPv6 packet too big.
pub const V6_TOO_BIG: u8 = 2;
/// The ICMP header before the quoted packet: type, code, checksum and four
/// bytes (unused and the next-hop MTU; the MTU for ICMPv6).
pub const HEADER_LEN: usize = 8;
/// An ICMPv4 error is at most this long (RFC 1812 §4.3.2.3: quote as much
/// as fits in 576 bytes).
const V4_ERROR_MAX: usize = 576;
/// An ICMPv6 error is at most the IPv6 minimum MTU (RFC 4443 §2.4 (c)).
const V6_ERROR_MAX: usize = 1280;
/// The smallest MTU a "too big" may announce: RFC 791's 68 bytes for
/// IPv4, RFC 8200's 1280 for IPv6.
pub const V4_MIN_MTU: u32 = 68;
/// See [`V4_MIN_MTU`].
pub const V6_MIN_MTU: u32 = 1280;

/// True when `pkt` (parsed as `info`) is itself an ICMP error, which no
/// ICMP error may answer (RFC 1122 §3.2.2, RFC 4443 §2.4 (e)).
fn is_icmp_error(pkt: &[u8], info: &ip::IpInfo) -> bool {
    let Some(&ty) = pkt.get(info.payload_offset) else {
        return false;
    };
    match (info.version, info.protocol) {
        (4, proto::ICMP) => matches!(ty, 3 | 4 | 5 | 11 | 12),
        (6, proto::ICMPV6) => ty < 128,
        _ => false,
    }
}

/// Replaces the clear packet in `buf` with the "too big" message for its
/// sender announcing `mtu`, sent as if by the packet's destination (the
/// message enters the gateway through its TUN, as from the far side of the
/// tunnel, so that reverse-path filters let it pass). `Err`: no message is
/// due — the packet is a later fragment, an ICMP error, or does not parse —
/// and `buf` is unchanged.
pub fn too_big_in_place(buf: &mut PacketBuf, mtu: u32) -> PResult<()> {
    let info = ip::parse(buf.as_slice())?;
    if info.later_fragment || is_icmp_error(buf.as_slice(), &info) {
        return Err(DropReason::Unsupported);
    }
    let (src, dst) = (info.dst, info.src);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let quote = info
                .packet_len
                .min(V4_ERROR_MAX - ipv4::MIN_HEADER_LEN - HEADER_LEN);
            buf.truncate(quote);
            let mtu = mtu.clamp(V4_MIN_MTU, u32::from(u16::MAX)) as u16;
            let m = buf.push_front(HEADER_LEN);
            m[..HEADER_LEN].copy_from_slice(&[V4_UNREACHABLE, V4_FRAG_NEEDED, 0, 0, 0, 0, 0, 0]);
            m[6..8].copy_from_slice(&mtu.to_be_bytes());
            let c = checksum::checksum(m);
            m[2..4].copy_from_slice(&c.to_be_bytes());
            let payload_len = buf.len();
            ipv4::Ipv4Repr {
                src: s,
                dst: d,
                protocol: proto::ICMP,
                // Internetwork control, as routers send their ICMP.
                tos: 0xc0,
                ident: 0,
                dont_frag: false,
                ttl: 64,
                payload_len,
            }
            .emit(buf.push_front(ipv4::MIN_HEADER_LEN))
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let quote = info
                .packet_len
                .min(V6_ERROR_MAX - ipv6::HEADER_LEN - HEADER_LEN);
            buf.truncate(quote);
            let mtu = mtu.max(V6_MIN_MTU);
            let m = buf.push_front(HEADER_LEN);
            m[..4].copy_from_slice(&[V6_TOO_BIG, 0, 0, 0]);
            m[4..8].copy_from_slice(&mtu.to_be_bytes());
            let len = m.len() as u32;
            let acc = checksum::pseudo_header(src, dst, proto::ICMPV6, len);
            let c = checksum::finish(checksum::sum(acc, m));
            m[2..4].copy_from_slice(&c.to_be_bytes());
            let payload_len = buf.len();
            ipv6::Ipv6Repr {
                src: s,
                dst: d,
                next_header: proto::ICMPV6,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
                payload_len,
            }
            .emit(buf.push_front(ipv6::HEADER_LEN))
        }
        _ => Err(DropReason::Internal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipv4::Ipv4;
    use crate::wire::ipv6::Ipv6;

    fn tcp_v4(len: usize, df: bool) -> Vec<u8> {
        let mut p = vec![0u8; len];
        ipv4::Ipv4Repr {
            src: "10.1.1.2".parse().unwrap(),
            dst: "10.2.1.2".parse().unwrap(),
            protocol: proto::TCP,
            tos: 0,
            ident: 7,
            dont_frag: df,
            ttl: 63,
            payload_len: len - 20,
        }
        .emit(&mut p)
        .unwrap();
        for (i, b) in p[20..].iter_mut().enumerate() {
            *b = i as u8;
        }
        p
    }

    #[test]
    fn v4_frag_needed_quotes_the_packet_and_checks() {
        let orig = tcp_v4(1400, true);
        let mut b = PacketBuf::from_packet(&orig);
        too_big_in_place(&mut b, 1242).unwrap();
        let p = Ipv4::new_checked(b.as_slice()).unwrap();
        assert!(p.checksum_ok());
        assert_eq!(p.protocol(), proto::ICMP);
        assert_eq!(p.src().to_string(), "10.2.1.2");
        assert_eq!(p.dst().to_string(), "10.1.1.2");
        assert_eq!(p.packet_len(), 576);
        let m = p.payload();
        assert_eq!(&m[..2], &[3, 4]);
        assert_eq!(u16::from_be_bytes([m[6], m[7]]), 1242);
        assert_eq!(checksum::checksum(m), 0, "ICMP checksum");
        assert_eq!(&m[8..], &orig[..548]);
    }

    #[test]
    fn v6_too_big_is_at_most_1280_bytes_and_checks() {
        let mut orig = vec![0u8; 1400];
        ipv6::Ipv6Repr {
            src: "fd00:1::2".parse().unwrap(),
            dst: "fd00:2::2".parse().unwrap(),
            next_header: proto::UDP,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 63,
            payload_len: 1360,
        }
        .emit(&mut orig)
        .unwrap();
        for (i, b) in orig[40..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let mut b = PacketBuf::from_packet(&orig);
        too_big_in_place(&mut b, 1300).unwrap();
        let p = Ipv6::new_checked(b.as_slice()).unwrap();
        assert_eq!(p.packet_len(), 1280);
        assert_eq!(p.next_header(), proto::ICMPV6);
        let (src, dst) = (IpAddr::V6(p.src()), IpAddr::V6(p.dst()));
        assert_eq!(src, IpAddr::V6(Ipv6::new_checked(&orig[..]).unwrap().dst()));
        let m = &b.as_slice()[40..];
        assert_eq!(m[0], V6_TOO_BIG);
        assert_eq!(u32::from_be_bytes([m[4], m[5], m[6], m[7]]), 1300);
        let acc = checksum::pseudo_header(src, dst, proto::ICMPV6, m.len() as u32);
        assert_eq!(
            checksum::finish(checksum::sum(acc, m)),
            0,
            "ICMPv6 checksum"
        );
        assert_eq!(&m[8..], &orig[..1280 - 48]);
    }

    #[test]
    fn small_mtus_are_raised_to_the_minimum() {
        let mut b = PacketBuf::from_packet(&tcp_v4(100, true));
        too_big_in_place(&mut b, 10).unwrap();
        let m = &b.as_slice()[20..];
        assert_eq!(u16::from_be_bytes([m[6], m[7]]) as u32, V4_MIN_MTU);
        assert_eq!(b.len(), 20 + 8 + 100, "a short packet is quoted whole");
    }

    #[test]
    fn icmp_errors_and_later_fragments_get_no_answer() {
        let mut err = tcp_v4(100, true);
        err[9] = proto::ICMP;
        err[20] = 3;
        ipv4::Ipv4::new_checked(&mut err[..])
            .unwrap()
            .fill_checksum();
        let mut b = PacketBuf::from_packet(&err);
        assert!(too_big_in_place(&mut b, 1000).is_err());
        assert_eq!(b.as_slice(), &err[..], "buffer unchanged");
        // An echo request is answered.
        err[20] = 8;
        let mut b = PacketBuf::from_packet(&err);
        assert!(too_big_in_place(&mut b, 1000).is_ok());
        let mut frag = tcp_v4(100, false);
        frag[6..8].copy_from_slice(&100u16.to_be_bytes());
        ipv4::Ipv4::new_checked(&mut frag[..])
            .unwrap()
            .fill_checksum();
        let mut b = PacketBuf::from_packet(&frag);
        assert!(too_big_in_place(&mut b, 1000).is_err());
    }
}
