//! ESP header and trailer layout (RFC 4303 §2).
//!
//! ```text
//! | SPI (4) | Sequence Number (4) | IV (suite) | Payload | Padding | Pad Len | Next Hdr | ICV |
//! ```

use super::{be32, put32};
use crate::error::{DropReason, PResult};

/// SPI plus 32-bit sequence number.
pub const HEADER_LEN: usize = 8;
/// Pad length and next header bytes.
pub const TRAILER_LEN: usize = 2;

/// A checked view of the fixed ESP header.
#[derive(Debug, Clone, Copy)]
pub struct Esp<'a> {
    b: &'a [u8],
}

impl<'a> Esp<'a> {
    /// Requires at least the fixed header.
    pub fn new_checked(b: &'a [u8]) -> PResult<Self> {
        if b.len() < HEADER_LEN {
            return Err(DropReason::BadLength);
        }
        Ok(Esp { b })
    }
    /// Security Parameters Index.
    pub fn spi(&self) -> u32 {
        be32(self.b, 0)
    }
    /// Low 32 bits of the sequence number.
    pub fn seq(&self) -> u32 {
        be32(self.b, 4)
    }
}

/// Writes SPI and the low 32 bits of the sequence number.
pub fn emit_header(out: &mut [u8], spi: u32, seq: u64) {
    put32(out, 0, spi);
    put32(out, 4, seq as u32);
}

/// Number of padding bytes so that payload + padding + trailer is a multiple
/// of `align` (the cipher block size, at least 4; RFC 4303 §2.4).
pub fn pad_len(payload_len: usize, align: usize) -> usize {
    let align = align.max(4);
    let rem = (payload_len + TRAILER_LEN) % align;
    if rem == 0 {
        0
    } else {
        align - rem
    }
}

/// Writes the default monotonic padding 1, 2, 3, … (RFC 4303 §2.4) followed by
/// the pad length and next header. `out` is exactly `pad + 2` bytes.
pub fn emit_trailer(out: &mut [u8], next_header: u8) {
    let pad = out.len() - TRAILER_LEN;
    for (i, b) in out[..pad].iter_mut().enumerate() {
        *b = (i + 1) as u8;
    }
    out[pad] = pad as u8;
    out[pad + 1] = next_header;
}

/// Parses a decrypted trailer at the end of `plain` (payload + padding +
/// trailer) and returns `(payload_len, next_header)`. The padding must be the
/// monotonic default; anything else is [`DropReason::BadPadding`].
pub fn parse_trailer(plain: &[u8]) -> PResult<(usize, u8)> {
    if plain.len() < TRAILER_LEN {
        return Err(DropReason::BadLength);
    }
    let nh = plain[plain.len() - 1];
    let pad = usize::from(plain[plain.len() - 2]);
    let payload_len = plain
        .len()
        .checked_sub(TRAILER_LEN + pad)
        .ok_or(DropReason::BadPadding)?;
    let padding = &plain[payload_len..payload_len + pad];
    if padding
        .iter()
        .enumerate()
        .any(|(i, b)| usize::from(*b) != i + 1)
    {
        return Err(DropReason::BadPadding);
    }
    Ok((payload_len, nh))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_alignment() {
        assert_eq!(pad_len(0, 16), 14);
        assert_eq!(pad_len(14, 16), 0);
        assert_eq!(pad_len(100, 1), 2);
        assert_eq!(pad_len(2, 4), 0);
        for n in 0..100 {
            for a in [4, 8, 16] {
                assert_eq!((n + pad_len(n, a) + 2) % a, 0);
            }
        }
    }

    #[test]
    fn trailer_roundtrip_and_bad_padding() {
        let mut b = vec![0xaa; 5 + 7 + 2];
        emit_trailer(&mut b[5..], 4);
        assert_eq!(parse_trailer(&b).unwrap(), (5, 4));
        b[7] = 9;
        assert_eq!(parse_trailer(&b).unwrap_err(), DropReason::BadPadding);
        // Pad length larger than the plaintext.
        assert_eq!(
            parse_trailer(&[1, 200, 4]).unwrap_err(),
            DropReason::BadPadding
        );
        assert_eq!(parse_trailer(&[4]).unwrap_err(), DropReason::BadLength);
    }
}
