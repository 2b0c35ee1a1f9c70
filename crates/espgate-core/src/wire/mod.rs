//! Zero-copy views over packet bytes, in the style of `smoltcp::wire`.
//!
//! Each view is created with `new_checked`, which validates every length the
//! accessors rely on; accessors then never index out of bounds. Views never
//! allocate. Header layout lives here; the cryptographic transform lives in
//! [`crate::crypto`], so a new IPsec header (Q-ESP) is a new module here.

pub mod ah;
pub mod checksum;
pub mod esp;
pub mod flow;
pub mod icmp;
pub mod ip;
pub mod ipv4;
pub mod ipv6;
pub mod qesp;
pub mod tcp;
pub mod udp;

/// IANA protocol numbers used by the core.
pub mod proto {
    /// IPv6 hop-by-hop options.
    pub const HOPOPT: u8 = 0;
    /// ICMP for IPv4.
    pub const ICMP: u8 = 1;
    /// IPv4 encapsulation (IP-in-IP; the ESP next header for an IPv4 inner packet).
    pub const IPV4: u8 = 4;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// IPv6 encapsulation.
    pub const IPV6: u8 = 41;
    /// IPv6 routing header.
    pub const IPV6_ROUTE: u8 = 43;
    /// IPv6 fragment header.
    pub const IPV6_FRAG: u8 = 44;
    /// Encapsulating Security Payload.
    pub const ESP: u8 = 50;
    /// Authentication Header.
    pub const AH: u8 = 51;
    /// ICMP for IPv6.
    pub const ICMPV6: u8 = 58;
    /// IPv6 "no next header"; in ESP it marks a dummy (TFC) packet.
    pub const NO_NEXT: u8 = 59;
    /// IPv6 destination options.
    pub const IPV6_OPTS: u8 = 60;
    /// Mobility header (treated as an extension header when skipping).
    pub const MOBILITY: u8 = 135;
    /// SCTP.
    pub const SCTP: u8 = 132;
    /// UDP-Lite.
    pub const UDPLITE: u8 = 136;
}

/// The big-endian `u16` at `at`; the caller has checked that `b` holds it
/// (it panics otherwise, like slice indexing).
#[inline]
pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The big-endian `u32` at `at`; the caller has checked that `b` holds it
/// (it panics otherwise, like slice indexing).
#[inline]
pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
