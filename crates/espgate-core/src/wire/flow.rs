//! The selector fields of a packet (RFC 4301 §4.4.1.1): addresses, protocol
//! and ports (for ICMP: type and code).

use super::{be16, ip, proto};
use crate::error::PResult;
use std::net::IpAddr;

/// What the SPD and SA selectors match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Upper-layer protocol.
    pub proto: u8,
    /// Source port, or ICMP type. `None` when OPAQUE (non-first fragment,
    /// truncated header, or a protocol without ports).
    pub sport: Option<u16>,
    /// Destination port, or ICMP code.
    pub dport: Option<u16>,
}

/// Extracts the flow of an IP packet.
pub fn of_packet(pkt: &[u8]) -> PResult<Flow> {
    Ok(of_parsed(pkt, &ip::parse(pkt)?))
}

/// [`of_packet`] of a packet whose IP header `info` the caller has
/// already parsed (with [`ip::parse`]), so it is not parsed twice.
pub fn of_parsed(pkt: &[u8], info: &ip::IpInfo) -> Flow {
    let l4 = pkt.get(info.payload_offset..info.packet_len).unwrap_or(&[]);
    let (sport, dport) = if info.later_fragment {
        (None, None)
    } else {
        match info.protocol {
            proto::TCP | proto::UDP | proto::SCTP | proto::UDPLITE if l4.len() >= 4 => {
                (Some(be16(l4, 0)), Some(be16(l4, 2)))
            }
            proto::ICMP | proto::ICMPV6 if l4.len() >= 2 => {
                (Some(u16::from(l4[0])), Some(u16::from(l4[1])))
            }
            _ => (None, None),
        }
    };
    Flow {
        src: info.src,
        dst: info.dst,
        proto: info.protocol,
        sport,
        dport,
    }
}
