//! UDP header and UDP encapsulation of ESP (RFC 3948).

use super::{be16, put16};
use crate::error::{DropReason, PResult};

/// UDP header length.
pub const HEADER_LEN: usize = 8;
/// The IANA port for IKE and ESP-in-UDP with NAT traversal.
pub const NAT_T_PORT: u16 = 4500;

/// A checked UDP header view.
#[derive(Debug, Clone, Copy)]
pub struct Udp<'a> {
    b: &'a [u8],
}

impl<'a> Udp<'a> {
    /// Checks the header and the length field against the buffer.
    pub fn new_checked(b: &'a [u8]) -> PResult<Self> {
        if b.len() < HEADER_LEN {
            return Err(DropReason::BadLength);
        }
        let len = usize::from(be16(b, 4));
        if len < HEADER_LEN || len > b.len() {
            return Err(DropReason::BadLength);
        }
        Ok(Udp { b })
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.b, 0)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.b, 2)
    }
    /// Length field (header + payload).
    pub fn len(&self) -> usize {
        usize::from(be16(self.b, 4))
    }
    /// Always false for a checked header (the length covers at least the header).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.b, 6)
    }
    /// Payload bounded by the length field.
    pub fn payload(&self) -> &'a [u8] {
        &self.b[HEADER_LEN..self.len()]
    }
}

/// Writes a UDP header (checksum zero; the caller may fill it in).
pub fn emit(out: &mut [u8], src_port: u16, dst_port: u16, payload_len: usize) -> PResult<()> {
    let len = u16::try_from(payload_len + HEADER_LEN).map_err(|_| DropReason::TooBig)?;
    put16(out, 0, src_port);
    put16(out, 2, dst_port);
    put16(out, 4, len);
    put16(out, 6, 0);
    Ok(())
}

/// A whole IPv4/UDP packet of `total` bytes (28 to 65535) from `src:1000`
/// to `dst:2000`, DF set, UDP checksum zero, the payload a counting
/// pattern: the clear packet of benchmarks and examples.
pub fn ipv4_packet(
    src: std::net::Ipv4Addr,
    dst: std::net::Ipv4Addr,
    total: usize,
) -> PResult<Vec<u8>> {
    let payload = total.checked_sub(28).ok_or(DropReason::BadLength)?;
    let mut p = vec![0u8; total];
    super::ipv4::Ipv4Repr {
        src,
        dst,
        protocol: super::proto::UDP,
        tos: 0,
        ident: 1,
        dont_frag: true,
        ttl: 64,
        payload_len: payload + HEADER_LEN,
    }
    .emit(&mut p)?;
    emit(&mut p[20..], 1000, 2000, payload)?;
    for (i, b) in p[28..].iter_mut().enumerate() {
        *b = i as u8;
    }
    Ok(p)
}

/// What a datagram on the NAT-T port carries (RFC 3948 §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncapKind {
    /// ESP: the payload starts with a non-zero SPI.
    Esp,
    /// IKE: the payload starts with the four-byte non-ESP marker.
    Ike,
    /// A NAT-keepalive: the single byte 0xFF.
    Keepalive,
}

/// Classifies a UDP payload received on the NAT-T port.
pub fn classify(payload: &[u8]) -> PResult<EncapKind> {
    match payload {
        [0xff] => Ok(EncapKind::Keepalive),
        [0, 0, 0, 0, ..] => Ok(EncapKind::Ike),
        // An ESP header is at least SPI + sequence number.
        p if p.len() >= 8 => Ok(EncapKind::Esp),
        _ => Err(DropReason::BadLength),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_rfc3948() {
        assert_eq!(classify(&[0xff]).unwrap(), EncapKind::Keepalive);
        assert_eq!(classify(&[0, 0, 0, 0, 1, 2, 3]).unwrap(), EncapKind::Ike);
        assert_eq!(classify(&[0, 0, 1, 0, 0, 0, 0, 1]).unwrap(), EncapKind::Esp);
        assert_eq!(classify(&[1, 2, 3]).unwrap_err(), DropReason::BadLength);
        assert_eq!(classify(&[]).unwrap_err(), DropReason::BadLength);
    }

    #[test]
    fn header_roundtrip() {
        let mut b = [0u8; 12];
        emit(&mut b, 4500, 4501, 4).unwrap();
        let u = Udp::new_checked(&b).unwrap();
        assert_eq!((u.src_port(), u.dst_port(), u.len()), (4500, 4501, 12));
        assert_eq!(u.payload().len(), 4);
        b[5] = 200;
        assert!(Udp::new_checked(&b).is_err());
    }
}
