//! TCP MSS clamping (`mss_clamp`): the MSS option of TCP SYN and SYN-ACK
//! segments crossing the tunnel, in both directions, is lowered to what
//! fits the tunnel, so that hosts behind the gateways never send segments
//! that need fragmentation or path MTU discovery (whose ICMP messages
//! firewalls often drop). The TCP checksum is updated incrementally
//! (RFC 1624), so the packet's other bytes are untouched.

use crate::wire::tcp::{self, Tcp};
use crate::wire::{ip, proto};

/// The largest MSS allowed per inner address family; `None`: no clamping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MssLimit {
    /// For IPv4 packets.
    pub v4: Option<u16>,
    /// For IPv6 packets.
    pub v6: Option<u16>,
}

impl MssLimit {
    /// A fixed MSS for both families.
    pub fn fixed(mss: u16) -> MssLimit {
        MssLimit {
            v4: Some(mss),
            v6: Some(mss),
        }
    }

    /// What fits a tunnel of `mtu` bytes: MTU minus the IP header (20 or
    /// 40) and the TCP header (20).
    pub fn for_mtu(mtu: u32) -> MssLimit {
        let f = |hdr: u32| {
            mtu.checked_sub(hdr + tcp::HEADER_LEN as u32)
                .and_then(|m| u16::try_from(m).ok())
        };
        MssLimit {
            v4: f(20),
            v6: f(40),
        }
    }
}

/// Lowers the MSS option of a TCP SYN in `pkt` to `limit`; returns true
/// if it changed the packet. Anything that is not a well-formed first
/// TCP segment with SYN is left alone, as is a SYN whose options are
/// malformed before the MSS option.
pub fn clamp(pkt: &mut [u8], limit: MssLimit) -> bool {
    let Ok(info) = ip::parse(pkt) else {
        return false;
    };
    let max = match info.version {
        4 => limit.v4,
        _ => limit.v6,
    };
    let Some(max) = max else { return false };
    if info.protocol != proto::TCP || info.later_fragment {
        return false;
    }
    let Some(seg) = pkt.get_mut(info.payload_offset..info.packet_len) else {
        return false;
    };
    let Ok(mut tcp) = Tcp::new_checked(seg) else {
        return false;
    };
    if !tcp.syn() {
        return false;
    }
    match tcp.mss() {
        Some(old) if old > max => tcp.set_mss(max).is_some(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::checksum;
    use crate::wire::tcp::flags::SYN;
    use crate::wire::tcp::HEADER_LEN as TCP_HEADER;
    use crate::wire::{ipv4, ipv6};
    use std::net::IpAddr;

    /// A TCP segment with `options` (padded to 4 bytes) and a valid checksum.
    fn segment(v6: bool, flags: u8, options: &[u8]) -> Vec<u8> {
        let mut opts = options.to_vec();
        while opts.len() & 3 != 0 {
            opts.push(0);
        }
        let mut tcp = vec![0u8; TCP_HEADER];
        tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
        tcp[12] = (((TCP_HEADER + opts.len()) / 4) as u8) << 4;
        tcp[13] = flags;
        tcp[14] = 0xff;
        tcp.extend_from_slice(&opts);
        let (src, dst): (IpAddr, IpAddr) = if v6 {
            (
                "2001:db8:1::5".parse().unwrap(),
                "2001:db8:2::9".parse().unwrap(),
            )
        } else {
            ("10.1.0.5".parse().unwrap(), "10.2.0.9".parse().unwrap())
        };
        let ph = checksum::pseudo_header(src, dst, proto::TCP, tcp.len() as u32);
        let c = checksum::finish(checksum::sum(ph, &tcp));
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        let mut out = vec![0u8; if v6 { 40 } else { 20 }];
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => ipv4::Ipv4Repr {
                src: s,
                dst: d,
                protocol: proto::TCP,
                tos: 0,
                ident: 1,
                dont_frag: true,
                ttl: 64,
                payload_len: tcp.len(),
            }
            .emit(&mut out)
            .unwrap(),
            (IpAddr::V6(s), IpAddr::V6(d)) => ipv6::Ipv6Repr {
                src: s,
                dst: d,
                next_header: proto::TCP,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
                payload_len: tcp.len(),
            }
            .emit(&mut out)
            .unwrap(),
            _ => unreachable!(),
        }
        out.extend_from_slice(&tcp);
        out
    }

    fn checksum_ok(pkt: &[u8]) -> bool {
        let info = ip::parse(pkt).unwrap();
        let tcp = &pkt[info.payload_offset..info.packet_len];
        let ph = checksum::pseudo_header(info.src, info.dst, proto::TCP, tcp.len() as u32);
        checksum::finish(checksum::sum(ph, tcp)) == 0
    }

    fn mss_of(pkt: &[u8], at: usize) -> u16 {
        let off = ip::parse(pkt).unwrap().payload_offset + TCP_HEADER + at;
        u16::from_be_bytes([pkt[off + 2], pkt[off + 3]])
    }

    #[test]
    fn syn_and_syn_ack_are_clamped_with_a_valid_checksum() {
        // MSS 1460, SACK permitted, timestamps: as Linux sends them.
        let opts = [
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 1, 2, 3, 4, 0, 0, 0, 0, 1, 3, 3, 7,
        ];
        for v6 in [false, true] {
            for flags in [SYN, SYN | 0x10] {
                let mut p = segment(v6, flags, &opts);
                assert!(checksum_ok(&p));
                let lim = MssLimit::for_mtu(1400);
                assert!(clamp(&mut p, lim));
                assert_eq!(mss_of(&p, 0), if v6 { 1340 } else { 1360 });
                assert!(checksum_ok(&p), "v6={v6} flags={flags:#x}");
                // Already small enough: untouched.
                let before = p.clone();
                assert!(!clamp(&mut p, lim));
                assert_eq!(p, before);
            }
        }
    }

    #[test]
    fn an_odd_offset_option_keeps_the_checksum_valid() {
        // NOP, then MSS at an odd offset.
        let mut p = segment(false, SYN, &[1, 2, 4, 0x23, 0x28, 1, 1, 1]);
        assert!(checksum_ok(&p));
        assert!(clamp(&mut p, MssLimit::fixed(1000)));
        assert_eq!(mss_of(&p, 1), 1000);
        assert!(checksum_ok(&p));
    }

    #[test]
    fn other_segments_are_left_alone() {
        let lim = MssLimit::fixed(536);
        let opts = [2, 4, 0x05, 0xb4];
        // Not a SYN.
        let mut p = segment(false, 0x10, &opts);
        assert!(!clamp(&mut p, lim));
        // A SYN without the option.
        let mut p = segment(false, SYN, &[1, 1, 1, 1]);
        assert!(!clamp(&mut p, lim));
        // No limit for the family.
        let mut p = segment(true, SYN, &opts);
        assert!(!clamp(
            &mut p,
            MssLimit {
                v4: Some(536),
                v6: None
            }
        ));
        // Malformed options and truncated packets never panic.
        for bad in [&[2u8, 0][..], &[2, 9, 0, 0], &[5, 1, 0, 0], &[3]] {
            let mut p = segment(false, SYN, bad);
            assert!(!clamp(&mut p, lim));
        }
        let mut p = segment(false, SYN, &opts);
        for n in 0..p.len() {
            let mut cut = p[..n].to_vec();
            let _ = clamp(&mut cut, lim);
        }
        assert!(clamp(&mut p, lim));
        assert_eq!(
            MssLimit::for_mtu(50),
            MssLimit {
                v4: Some(10),
                v6: None
            }
        );
    }
}
