//! TUN offloads, sans IO: splitting the kernel's TCP/UDP super-segments and
//! building super-segments of decrypted TCP packets.
//!
//! With `IFF_VNET_HDR` and `TUNSETOFFLOAD` (CSUM, TSO4, TSO6, USO4, USO6)
//! every TUN read and write carries a `virtio_net_hdr`. A read may then yield
//! a packet whose L4 checksum is only partial (`NEEDS_CSUM`), or a TCP/UDP
//! super-segment of up to 64 KiB that the kernel did not split. Before ESP
//! sees it, [`Segmenter`] turns it into ordinary packets, each with full
//! headers and a full checksum (what the kernel's `tcp_gso_segment` and
//! `__udp_gso_segment` would have produced); [`complete_checksum`] fills in a
//! partial checksum. In the other direction [`Coalescer`] merges decrypted
//! inner TCP packets of one flow that arrive back to back into one
//! super-segment, written with one `write(2)` and a header that lets the
//! kernel segment it again (or hand it to its local stack whole, like GRO).
//!
//! The point is the one seed 000 made about interrupt coalescing: per-packet
//! events, not the cipher, dominate a gateway's cost at high rates, so paying
//! them once per batch (one system call per up to 64 KiB instead of one per
//! 1400 B packet) is what raises throughput.
//!
//! The shell parses and writes the 10-byte `virtio_net_hdr`; this module
//! works on the plain [`GsoInfo`]. Nothing here allocates per packet: the
//! segmenter writes into the caller's [`PacketBuf`](crate::PacketBuf), the
//! coalescer owns one 64 KiB buffer made at construction.

mod coalesce;
mod segment;
#[cfg(test)]
mod tests;

pub use coalesce::{Coalescer, Push, MAX_COALESCE_SEGMENTS, MAX_SUPER_LEN};
pub use segment::{Segmenter, MAX_SEGMENTS};

use crate::error::{DropReason, PResult};
use crate::wire::{checksum, put16, tcp};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Length of the legacy `struct virtio_net_hdr` that prefixes every TUN
/// read and write with `IFF_VNET_HDR`.
pub const VIRTIO_NET_HDR_LEN: usize = 10;
/// `virtio_net_hdr.flags`: the L4 checksum is partial (`csum_start`,
/// `csum_offset` locate it).
pub const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
/// `virtio_net_hdr.gso_type`: not a super-segment.
pub const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;
/// `virtio_net_hdr.gso_type`: IPv4 TCP super-segment.
pub const VIRTIO_NET_HDR_GSO_TCPV4: u8 = 1;
/// `virtio_net_hdr.gso_type`: IPv6 TCP super-segment.
pub const VIRTIO_NET_HDR_GSO_TCPV6: u8 = 4;
/// `virtio_net_hdr.gso_type`: UDP super-segment split into datagrams (USO).
pub const VIRTIO_NET_HDR_GSO_UDP_L4: u8 = 5;
/// `virtio_net_hdr.gso_type` flag: the TCP super-segment carries CWR (only
/// the first segment may keep it).
pub const VIRTIO_NET_HDR_GSO_ECN: u8 = 0x80;

/// Offset of the checksum field in a TCP header.
pub const TCP_CSUM_OFFSET: u16 = tcp::field::CHECKSUM.start as u16;
/// Offset of the checksum field in a UDP header.
pub const UDP_CSUM_OFFSET: u16 = 6;

/// What kind of super-segment a packet is (`virtio_net_hdr.gso_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GsoKind {
    /// An ordinary packet.
    None,
    /// IPv4 TCP, split at `gso_size` payload bytes (TSO4).
    TcpV4,
    /// IPv6 TCP (TSO6).
    TcpV6,
    /// UDP of either IP version, split into datagrams (USO).
    UdpL4,
}

impl GsoKind {
    /// Maps a `virtio_net_hdr.gso_type` byte. The ECN flag is accepted and
    /// ignored ([`Segmenter`] keeps CWR on the first segment only, which is
    /// what the flag asks for); UFO (3) and unknown types are `BadOffload`.
    pub fn from_virtio(gso_type: u8) -> PResult<GsoKind> {
        match gso_type & !VIRTIO_NET_HDR_GSO_ECN {
            VIRTIO_NET_HDR_GSO_NONE if gso_type & VIRTIO_NET_HDR_GSO_ECN == 0 => Ok(GsoKind::None),
            VIRTIO_NET_HDR_GSO_TCPV4 => Ok(GsoKind::TcpV4),
            VIRTIO_NET_HDR_GSO_TCPV6 => Ok(GsoKind::TcpV6),
            VIRTIO_NET_HDR_GSO_UDP_L4 if gso_type & VIRTIO_NET_HDR_GSO_ECN == 0 => {
                Ok(GsoKind::UdpL4)
            }
            _ => Err(DropReason::BadOffload),
        }
    }

    /// The `virtio_net_hdr.gso_type` byte for this kind (never with the ECN
    /// flag: [`Coalescer`] does not merge CWR packets).
    pub fn to_virtio(self) -> u8 {
        match self {
            GsoKind::None => VIRTIO_NET_HDR_GSO_NONE,
            GsoKind::TcpV4 => VIRTIO_NET_HDR_GSO_TCPV4,
            GsoKind::TcpV6 => VIRTIO_NET_HDR_GSO_TCPV6,
            GsoKind::UdpL4 => VIRTIO_NET_HDR_GSO_UDP_L4,
        }
    }
}

/// The offload metadata of one TUN packet: the fields of a `virtio_net_hdr`,
/// in host order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GsoInfo {
    /// Super-segment type.
    pub kind: GsoKind,
    /// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the L4 checksum field holds only the
    /// pseudo-header sum; the checksum is to be computed from `csum_start`.
    pub needs_csum: bool,
    /// Bytes of IP + L4 headers. Only a hint on reads (the kernel may report
    /// more, e.g. its linear head length); [`Segmenter`] computes the real
    /// length from the packet.
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    /// Where checksumming starts (the L4 header), from the start of the packet.
    pub csum_start: u16,
    /// Offset of the checksum field from `csum_start` (16 TCP, 6 UDP).
    pub csum_offset: u16,
}

impl GsoInfo {
    /// An ordinary packet with a complete checksum: an all-zero header.
    pub const NONE: GsoInfo = GsoInfo {
        kind: GsoKind::None,
        needs_csum: false,
        hdr_len: 0,
        gso_size: 0,
        csum_start: 0,
        csum_offset: 0,
    };
}

impl Default for GsoInfo {
    fn default() -> Self {
        GsoInfo::NONE
    }
}

/// True if a partial checksum at (`start`, `offset`) lies inside a packet of
/// `len` bytes: checksumming starts inside it and the field fits.
pub(crate) fn csum_range_ok(len: usize, start: usize, offset: usize) -> bool {
    start < len && start.saturating_add(offset).saturating_add(2) <= len
}

/// Fills in a partial checksum (`NEEDS_CSUM`, no GSO) in place, like the
/// kernel's `skb_checksum_help`: the ones-complement sum of
/// `pkt[csum_start..]` (the field included, as it holds the pseudo-header
/// sum) is complemented into the 16-bit field at `csum_start + csum_offset`;
/// a result of 0 is written as 0xFFFF (which UDP requires and TCP accepts).
pub fn complete_checksum(pkt: &mut [u8], csum_start: usize, csum_offset: usize) -> PResult<()> {
    if !csum_range_ok(pkt.len(), csum_start, csum_offset) {
        return Err(DropReason::BadOffload);
    }
    let c = match checksum::checksum(&pkt[csum_start..]) {
        0 => 0xffff,
        c => c,
    };
    put16(pkt, csum_start + csum_offset, c);
    Ok(())
}

/// Folds a pseudo-header sum to 16 bits without complementing it: the value a
/// `CHECKSUM_PARTIAL` packet carries in its L4 checksum field.
pub(crate) fn fold(acc: u32) -> u16 {
    !checksum::finish(acc)
}

/// Source and destination address of an IP header whose version nibble and
/// fixed-part length the caller has checked.
pub(crate) fn addrs(h: &[u8], v6: bool) -> (IpAddr, IpAddr) {
    if v6 {
        let mut s = [0u8; 16];
        let mut d = [0u8; 16];
        s.copy_from_slice(&h[8..24]);
        d.copy_from_slice(&h[24..40]);
        (Ipv6Addr::from(s).into(), Ipv6Addr::from(d).into())
    } else {
        (
            Ipv4Addr::new(h[12], h[13], h[14], h[15]).into(),
            Ipv4Addr::new(h[16], h[17], h[18], h[19]).into(),
        )
    }
}
