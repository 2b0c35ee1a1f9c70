//! IPv4 header view (RFC 791).

use super::{be16, checksum, put16};
use crate::error::{DropReason, PResult};
use std::net::Ipv4Addr;

/// Length of an IPv4 header without options.
pub const MIN_HEADER_LEN: usize = 20;

/// Don't Fragment flag in the flags/fragment-offset word.
pub const FLAG_DF: u16 = 0x4000;
/// More Fragments flag.
pub const FLAG_MF: u16 = 0x2000;

/// A checked view of an IPv4 packet. The buffer may be longer than the
/// packet (link-layer padding); [`Ipv4::packet_len`] is authoritative.
#[derive(Debug, Clone, Copy)]
pub struct Ipv4<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv4<T> {
    /// Validates version, IHL and total length against the buffer.
    pub fn new_checked(buf: T) -> PResult<Self> {
        let b = buf.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return Err(DropReason::BadLength);
        }
        if b[0] >> 4 != 4 {
            return Err(DropReason::BadIpVersion);
        }
        let ihl = usize::from(b[0] & 0x0f) * 4;
        let total = usize::from(be16(b, 2));
        if ihl < MIN_HEADER_LEN || total < ihl {
            return Err(DropReason::BadIpHeader);
        }
        if ihl > b.len() || total > b.len() {
            return Err(DropReason::BadLength);
        }
        Ok(Ipv4 { buf })
    }

    /// Checks only the version and header length, not the total length field
    /// (for rewriting a header whose length is about to change).
    pub fn new_header_checked(buf: T) -> PResult<Self> {
        let b = buf.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return Err(DropReason::BadLength);
        }
        if b[0] >> 4 != 4 {
            return Err(DropReason::BadIpVersion);
        }
        let ihl = usize::from(b[0] & 0x0f) * 4;
        if ihl < MIN_HEADER_LEN || ihl > b.len() {
            return Err(DropReason::BadIpHeader);
        }
        Ok(Ipv4 { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Header length in bytes (IHL * 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[0] & 0x0f) * 4
    }

    /// Total length field: header plus payload.
    pub fn packet_len(&self) -> usize {
        usize::from(be16(self.b(), 2))
    }

    /// Type of service / DS field byte (DSCP << 2 | ECN).
    pub fn tos(&self) -> u8 {
        self.b()[1]
    }

    /// Identification field.
    pub fn ident(&self) -> u16 {
        be16(self.b(), 4)
    }

    /// Flags and fragment offset word.
    pub fn flags_frag(&self) -> u16 {
        be16(self.b(), 6)
    }

    /// Don't Fragment is set.
    pub fn dont_frag(&self) -> bool {
        self.flags_frag() & FLAG_DF != 0
    }

    /// This packet is a fragment (MF set or non-zero offset).
    pub fn is_fragment(&self) -> bool {
        self.flags_frag() & (FLAG_MF | 0x1fff) != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> usize {
        usize::from(self.flags_frag() & 0x1fff) * 8
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.b()[8]
    }

    /// Protocol (next header).
    pub fn protocol(&self) -> u8 {
        self.b()[9]
    }

    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        let b = self.b();
        Ipv4Addr::new(b[12], b[13], b[14], b[15])
    }

    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        let b = self.b();
        Ipv4Addr::new(b[16], b[17], b[18], b[19])
    }

    /// True if the header checksum is correct.
    pub fn checksum_ok(&self) -> bool {
        checksum::checksum(&self.b()[..self.header_len()]) == 0
    }

    /// Header bytes including options.
    pub fn header(&self) -> &[u8] {
        &self.b()[..self.header_len()]
    }

    /// The payload up to the total length (excludes link padding).
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..self.packet_len()]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }

    /// Sets the TOS/DS byte.
    pub fn set_tos(&mut self, v: u8) {
        self.bm()[1] = v;
    }

    /// Sets the total length field.
    pub fn set_packet_len(&mut self, v: u16) {
        put16(self.bm(), 2, v);
    }

    /// Recomputes the header checksum.
    pub fn fill_checksum(&mut self) {
        let hl = self.header_len();
        put16(self.bm(), 10, 0);
        let c = checksum::checksum(&self.b()[..hl]);
        put16(self.bm(), 10, c);
    }
}

/// Fields for writing a fresh option-less IPv4 header.
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Protocol of the payload.
    pub protocol: u8,
    /// DS field (DSCP and ECN).
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Set Don't Fragment.
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// Payload length in bytes.
    pub payload_len: usize,
}

impl Ipv4Repr {
    /// Writes the 20-byte header, checksum included, into `out[..20]`.
    pub fn emit(&self, out: &mut [u8]) -> PResult<()> {
        let total = self.payload_len + MIN_HEADER_LEN;
        let total = u16::try_from(total).map_err(|_| DropReason::TooBig)?;
        if out.len() < MIN_HEADER_LEN {
            return Err(DropReason::BadLength);
        }
        let h = &mut out[..MIN_HEADER_LEN];
        h[0] = 0x45;
        h[1] = self.tos;
        put16(h, 2, total);
        put16(h, 4, self.ident);
        put16(h, 6, if self.dont_frag { FLAG_DF } else { 0 });
        h[8] = self.ttl;
        h[9] = self.protocol;
        put16(h, 10, 0);
        h[12..16].copy_from_slice(&self.src.octets());
        h[16..20].copy_from_slice(&self.dst.octets());
        let c = checksum::checksum(h);
        put16(h, 10, c);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_then_parse() {
        let mut buf = [0u8; 28];
        let r = Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            protocol: 50,
            tos: 0xb8,
            ident: 7,
            dont_frag: true,
            ttl: 64,
            payload_len: 8,
        };
        r.emit(&mut buf).unwrap();
        let p = Ipv4::new_checked(&buf[..]).unwrap();
        assert!(p.checksum_ok());
        assert_eq!(p.src(), r.src);
        assert_eq!(p.dst(), r.dst);
        assert_eq!(p.protocol(), 50);
        assert_eq!(p.tos(), 0xb8);
        assert!(p.dont_frag());
        assert!(!p.is_fragment());
        assert_eq!(p.payload().len(), 8);
    }

    #[test]
    fn rejects_bad_lengths() {
        assert_eq!(
            Ipv4::new_checked(&[0x45u8; 10][..]).unwrap_err(),
            DropReason::BadLength
        );
        let mut b = [0u8; 20];
        b[0] = 0x45;
        b[3] = 40; // total length beyond the buffer
        assert_eq!(
            Ipv4::new_checked(&b[..]).unwrap_err(),
            DropReason::BadLength
        );
        b[0] = 0x44; // IHL below 5
        assert_eq!(
            Ipv4::new_checked(&b[..]).unwrap_err(),
            DropReason::BadIpHeader
        );
        b[0] = 0x65;
        assert_eq!(
            Ipv4::new_checked(&b[..]).unwrap_err(),
            DropReason::BadIpVersion
        );
    }
}
