//! Version-independent helpers over an IP packet.

use super::{ipv4::Ipv4, ipv6, ipv6::Ipv6};
use crate::error::{DropReason, PResult};
use std::net::IpAddr;

/// The parts of an IP header that IPsec processing needs, for either version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpInfo {
    /// 4 or 6.
    pub version: u8,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// The protocol of the first header after the IP header(s) we skip.
    pub protocol: u8,
    /// Offset of that header.
    pub payload_offset: usize,
    /// Offset of the byte holding `protocol`.
    pub nh_field: usize,
    /// Length of the packet according to its header (excludes link padding).
    pub packet_len: usize,
    /// DS field: DSCP << 2 | ECN.
    pub tos: u8,
    /// IPv4 DF bit (IPv6 never fragments in the network).
    pub dont_frag: bool,
    /// This is a fragment.
    pub fragment: bool,
    /// A non-first fragment: no transport header present.
    pub later_fragment: bool,
}

/// Parses either IP version.
///
/// Inlined (IPv6 stays out of line): called out of line, the `IpInfo` came
/// back through memory and the caller's wide loads of it, spanning the
/// narrower stores that wrote it, stalled on store forwarding (perf put
/// a quarter of `Sa::encapsulate`'s own time on one such load).
#[inline(always)]
pub fn parse(pkt: &[u8]) -> PResult<IpInfo> {
    match pkt.first().map(|b| b >> 4) {
        Some(4) => {
            let p = Ipv4::new_checked(pkt)?;
            Ok(IpInfo {
                version: 4,
                src: p.src().into(),
                dst: p.dst().into(),
                protocol: p.protocol(),
                payload_offset: p.header_len(),
                nh_field: 9,
                packet_len: p.packet_len(),
                tos: p.tos(),
                dont_frag: p.dont_frag(),
                fragment: p.is_fragment(),
                later_fragment: p.frag_offset() != 0,
            })
        }
        Some(6) => parse_v6(pkt),
        Some(_) => Err(DropReason::BadIpVersion),
        None => Err(DropReason::BadLength),
    }
}

/// [`parse`] of an IPv6 packet.
fn parse_v6(pkt: &[u8]) -> PResult<IpInfo> {
    let p = Ipv6::new_checked(pkt)?;
    let w = ipv6::walk_ext(pkt)?;
    Ok(IpInfo {
        version: 6,
        src: p.src().into(),
        dst: p.dst().into(),
        protocol: w.protocol,
        payload_offset: w.offset,
        nh_field: w.nh_field,
        packet_len: p.packet_len(),
        tos: p.traffic_class(),
        dont_frag: true,
        fragment: w.fragment,
        later_fragment: w.later_fragment,
    })
}
