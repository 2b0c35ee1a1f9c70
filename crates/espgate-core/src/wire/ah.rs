//! Authentication Header layout (RFC 4302 §2).
//!
//! ```text
//! | Next Hdr | Payload Len | Reserved (2) | SPI (4) | Sequence Number (4) | ICV (+pad) |
//! ```
//! Payload Len is the AH length in 32-bit words minus 2.

use super::{be32, put16, put32};
use crate::error::{DropReason, PResult};

/// The fixed part before the ICV.
pub const FIXED_LEN: usize = 12;

/// A checked view of an AH header.
#[derive(Debug, Clone, Copy)]
pub struct Ah<'a> {
    b: &'a [u8],
}

impl<'a> Ah<'a> {
    /// Checks the fixed part and that the declared length fits in `b`.
    pub fn new_checked(b: &'a [u8]) -> PResult<Self> {
        if b.len() < FIXED_LEN {
            return Err(DropReason::BadLength);
        }
        let len = (usize::from(b[1]) + 2) * 4;
        if len < FIXED_LEN || len > b.len() {
            return Err(DropReason::BadLength);
        }
        Ok(Ah { b })
    }
    /// Protocol of what follows AH.
    pub fn next_header(&self) -> u8 {
        self.b[0]
    }
    /// Total AH length in bytes, ICV and padding included.
    pub fn len(&self) -> usize {
        (usize::from(self.b[1]) + 2) * 4
    }
    /// Always false: a checked AH has at least its fixed part.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// SPI.
    pub fn spi(&self) -> u32 {
        be32(self.b, 4)
    }
    /// Low 32 bits of the sequence number.
    pub fn seq(&self) -> u32 {
        be32(self.b, 8)
    }
    /// ICV field, padding included.
    pub fn icv_field(&self) -> &'a [u8] {
        &self.b[FIXED_LEN..self.len()]
    }
}

/// Length of an AH header carrying an ICV of `icv_len` bytes, padded to 4
/// bytes for IPv4 and 8 bytes for IPv6 (RFC 4302 §2.6).
pub fn header_len(icv_len: usize, ipv6: bool) -> usize {
    let align = if ipv6 { 8 } else { 4 };
    (FIXED_LEN + icv_len).div_ceil(align) * align
}

/// Writes an AH header with a zeroed ICV field; `out.len()` is the AH length.
pub fn emit(out: &mut [u8], next_header: u8, spi: u32, seq: u64) -> PResult<()> {
    let words = out.len() / 4;
    if !out.len().is_multiple_of(4) || words < 3 || words - 2 > 255 {
        return Err(DropReason::BadLength);
    }
    out[0] = next_header;
    out[1] = (words - 2) as u8;
    put16(out, 2, 0);
    put32(out, 4, spi);
    put32(out, 8, seq as u32);
    out[FIXED_LEN..].fill(0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_follow_rfc4302() {
        assert_eq!(header_len(12, false), 24); // HMAC-SHA1-96: payload len 4
        assert_eq!(header_len(16, false), 28);
        assert_eq!(header_len(16, true), 32);
        assert_eq!(header_len(24, true), 40);
        let mut b = [0u8; 24];
        emit(&mut b, 6, 0x1234, 5).unwrap();
        assert_eq!(b[1], 4);
        let a = Ah::new_checked(&b).unwrap();
        assert_eq!(
            (a.next_header(), a.spi(), a.seq(), a.len()),
            (6, 0x1234, 5, 24)
        );
        assert!(Ah::new_checked(&b[..20]).is_err());
    }
}
