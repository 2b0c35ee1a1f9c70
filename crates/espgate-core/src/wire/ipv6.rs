//! IPv6 header view (RFC 8200) and extension-header walking.

use super::{be16, proto, put16};
use crate::error::{DropReason, PResult};
use std::net::Ipv6Addr;

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = 40;

/// Most extension headers we are willing to walk before giving up (bounds work
/// on hostile input).
pub const MAX_EXT_HEADERS: usize = 16;

/// A checked view of an IPv6 packet.
#[derive(Debug, Clone, Copy)]
pub struct Ipv6<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv6<T> {
    /// Validates version and payload length against the buffer.
    pub fn new_checked(buf: T) -> PResult<Self> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(DropReason::BadLength);
        }
        if b[0] >> 4 != 6 {
            return Err(DropReason::BadIpVersion);
        }
        if HEADER_LEN + usize::from(be16(b, 4)) > b.len() {
            return Err(DropReason::BadLength);
        }
        Ok(Ipv6 { buf })
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Traffic class (DSCP << 2 | ECN).
    pub fn traffic_class(&self) -> u8 {
        let b = self.b();
        (b[0] << 4) | (b[1] >> 4)
    }

    /// Flow label.
    pub fn flow_label(&self) -> u32 {
        let b = self.b();
        (u32::from(b[1] & 0x0f) << 16) | u32::from(be16(b, 2))
    }

    /// Payload length field.
    pub fn payload_len(&self) -> usize {
        usize::from(be16(self.b(), 4))
    }

    /// Header plus payload length.
    pub fn packet_len(&self) -> usize {
        HEADER_LEN + self.payload_len()
    }

    /// Next header of the fixed header.
    pub fn next_header(&self) -> u8 {
        self.b()[6]
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.b()[7]
    }

    /// Source address.
    pub fn src(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[8..24]);
        Ipv6Addr::from(a)
    }

    /// Destination address.
    pub fn dst(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[24..40]);
        Ipv6Addr::from(a)
    }
}

/// Writes the traffic class into a 40-byte IPv6 header.
pub fn set_traffic_class(h: &mut [u8], tc: u8) {
    h[0] = 0x60 | (tc >> 4);
    h[1] = (h[1] & 0x0f) | (tc << 4);
}

/// Writes the payload length field.
pub fn set_payload_len(h: &mut [u8], len: u16) {
    put16(h, 4, len);
}

/// Fields for writing a fresh IPv6 header.
#[derive(Debug, Clone, Copy)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Next header.
    pub next_header: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload length.
    pub payload_len: usize,
}

impl Ipv6Repr {
    /// Writes the 40-byte header into `out[..40]`.
    pub fn emit(&self, out: &mut [u8]) -> PResult<()> {
        let len = u16::try_from(self.payload_len).map_err(|_| DropReason::TooBig)?;
        if out.len() < HEADER_LEN {
            return Err(DropReason::BadLength);
        }
        let h = &mut out[..HEADER_LEN];
        let fl = self.flow_label & 0xfffff;
        h[0] = 0x60 | (self.traffic_class >> 4);
        h[1] = (self.traffic_class << 4) | ((fl >> 16) as u8);
        put16(h, 2, fl as u16);
        put16(h, 4, len);
        h[6] = self.next_header;
        h[7] = self.hop_limit;
        h[8..24].copy_from_slice(&self.src.octets());
        h[24..40].copy_from_slice(&self.dst.octets());
        Ok(())
    }
}

/// Result of walking an IPv6 extension-header chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtWalk {
    /// The first header that is not an extension header we skip
    /// (upper-layer protocol, ESP, AH or "no next header").
    pub protocol: u8,
    /// Offset of that header from the start of the IPv6 packet.
    pub offset: usize,
    /// Offset of the byte holding `protocol` (6 for the fixed header).
    pub nh_field: usize,
    /// Where a transport-mode ESP/AH header goes: after hop-by-hop, routing
    /// and fragment headers (RFC 4303 §3.1.1, RFC 4302 §3.1.1).
    pub insert_offset: usize,
    /// Offset of the next-header byte that must point at an inserted header.
    pub insert_nh_field: usize,
    /// A fragment header was seen.
    pub fragment: bool,
    /// The fragment header says this is a non-first fragment.
    pub later_fragment: bool,
    /// A routing header was seen.
    pub routing: bool,
}

/// Walks the extension headers of the IPv6 packet `pkt` (already checked with
/// [`Ipv6::new_checked`]); stops at ESP and AH (they are what we process),
/// at upper-layer protocols, and after [`MAX_EXT_HEADERS`].
pub fn walk_ext(pkt: &[u8]) -> PResult<ExtWalk> {
    let end = Ipv6::new_checked(pkt)?.packet_len();
    let mut nh = pkt[6];
    let mut nh_field = 6;
    let mut off = HEADER_LEN;
    let mut w = ExtWalk {
        protocol: nh,
        offset: off,
        nh_field,
        insert_offset: off,
        insert_nh_field: nh_field,
        fragment: false,
        later_fragment: false,
        routing: false,
    };
    let mut placing = true; // still inside the HBH/routing/fragment prefix
    for _ in 0..MAX_EXT_HEADERS {
        let len = match nh {
            proto::HOPOPT | proto::IPV6_ROUTE | proto::IPV6_OPTS | proto::MOBILITY => {
                if off + 2 > end {
                    return Err(DropReason::BadLength);
                }
                (usize::from(pkt[off + 1]) + 1) * 8
            }
            proto::IPV6_FRAG => {
                if off + 8 > end {
                    return Err(DropReason::BadLength);
                }
                w.fragment = true;
                if be16(pkt, off + 2) & 0xfff8 != 0 {
                    w.later_fragment = true;
                }
                8
            }
            _ => {
                w.protocol = nh;
                w.offset = off;
                w.nh_field = nh_field;
                return Ok(w);
            }
        };
        if off + len > end {
            return Err(DropReason::BadLength);
        }
        if nh == proto::IPV6_ROUTE {
            w.routing = true;
        }
        let is_prefix = matches!(nh, proto::HOPOPT | proto::IPV6_ROUTE | proto::IPV6_FRAG);
        if w.later_fragment {
            // The rest of the chain is not in this fragment.
            w.protocol = pkt[off];
            w.offset = off + len;
            w.nh_field = off;
            return Ok(w);
        }
        if placing && is_prefix {
            w.insert_offset = off + len;
            w.insert_nh_field = off;
        } else {
            placing = false;
        }
        nh_field = off;
        nh = pkt[off];
        off += len;
    }
    Err(DropReason::Unsupported)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(chain: &[(u8, usize)], last: u8, payload: usize) -> Vec<u8> {
        // chain: (header type, total length) in order
        let mut v = vec![0u8; HEADER_LEN];
        let total: usize = chain.iter().map(|c| c.1).sum::<usize>() + payload;
        Ipv6Repr {
            src: Ipv6Addr::LOCALHOST,
            dst: Ipv6Addr::LOCALHOST,
            next_header: chain.first().map(|c| c.0).unwrap_or(last),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 1,
            payload_len: total,
        }
        .emit(&mut v)
        .unwrap();
        for (i, (_, len)) in chain.iter().enumerate() {
            let next = chain.get(i + 1).map(|c| c.0).unwrap_or(last);
            let mut h = vec![0u8; *len];
            h[0] = next;
            h[1] = (*len / 8 - 1) as u8;
            v.extend(h);
        }
        v.extend(vec![0u8; payload]);
        v
    }

    #[test]
    fn walks_to_upper_layer_and_finds_insertion_point() {
        let p = pkt(
            &[
                (proto::HOPOPT, 8),
                (proto::IPV6_ROUTE, 24),
                (proto::IPV6_OPTS, 16),
            ],
            proto::TCP,
            20,
        );
        let w = walk_ext(&p).unwrap();
        assert_eq!(w.protocol, proto::TCP);
        assert_eq!(w.offset, 40 + 8 + 24 + 16);
        assert_eq!(w.nh_field, 40 + 8 + 24);
        assert_eq!(w.insert_offset, 40 + 8 + 24);
        assert_eq!(w.insert_nh_field, 40 + 8);
        assert!(w.routing);
    }

    #[test]
    fn stops_at_esp() {
        let p = pkt(&[(proto::IPV6_OPTS, 8)], proto::ESP, 30);
        let w = walk_ext(&p).unwrap();
        assert_eq!((w.protocol, w.offset), (proto::ESP, 48));
        assert_eq!(w.insert_offset, 40);
    }

    #[test]
    fn truncated_extension_is_bad_length() {
        let mut p = pkt(&[(proto::HOPOPT, 8)], proto::UDP, 0);
        p[41] = 5; // claims 48 bytes
        assert_eq!(walk_ext(&p).unwrap_err(), DropReason::BadLength);
    }

    #[test]
    fn endless_chain_is_bounded() {
        let chain: Vec<(u8, usize)> = (0..40).map(|_| (proto::IPV6_OPTS, 8)).collect();
        let p = pkt(&chain, proto::UDP, 0);
        assert_eq!(walk_ext(&p).unwrap_err(), DropReason::Unsupported);
    }
}
