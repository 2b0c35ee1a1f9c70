//! ESP header and trailer layout (RFC 4303 §2), and [`EspLayout`]: what
//! differs between ESP header formats ([`Rfc4303`] here, and
//! [`super::qesp::Qesp`]).
//!
//! ```text
//! | SPI (4) | Sequence Number (4) | IV (suite) | Payload | Padding | Pad Len | Next Hdr | ICV |
//! ```

use super::{be32, proto, put32};
use crate::crypto::AuthCtx;
use crate::error::{DropReason, PResult};
use std::net::IpAddr;

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

/// The addresses of the outer IP header of a protected packet (the tunnel
/// endpoints, or in transport mode the packet's own): what a layout may
/// authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OuterAddrs {
    /// Outer source address.
    pub src: IpAddr,
    /// Outer destination address.
    pub dst: IpAddr,
}

/// The data one packet authenticates besides its `[header | IV | body]`
/// bytes, built on the stack by [`EspLayout::auth`].
pub trait EspAuth {
    /// The transform's view of it.
    fn auth_ctx(&self) -> AuthCtx<'_>;
}

/// What differs between ESP header formats, so that the ESP packet path
/// (padding, trailer, transform, replay, lifetimes: `sa/esp.rs`) serves
/// each of them. A layout is a type without data; the path is generic over
/// it and monomorphised, so a layout costs nothing at run time.
///
/// A packet is `[header (HEADER_LEN) | IV | E(payload | padding | trailer) | ICV]`.
pub trait EspLayout {
    /// IP protocol number of the header when it travels directly over IP.
    const IP_PROTOCOL: u8;
    /// Length of the header before the IV.
    const HEADER_LEN: usize;
    /// The per-packet authenticated data.
    type Auth: EspAuth;
    /// What the header shows in clear about the protected packet (`()`
    /// for ESP; Q-ESP's ports and transport protocol).
    type Clear: Copy + PartialEq + core::fmt::Debug;

    /// The clear fields of the IP packet `pkt` that the header protects
    /// (tunnel mode: the inner packet; transport mode: the packet before
    /// protection). Outbound they go into the header; inbound, computed
    /// on the restored packet, they must equal the header's.
    fn clear_of(pkt: &[u8]) -> PResult<Self::Clear>;

    /// Writes the header into `hdr` (exactly [`Self::HEADER_LEN`] bytes)
    /// for the packet with `spi` and full sequence number `seq`.
    fn emit_header(hdr: &mut [u8], spi: u32, seq: u64, clear: &Self::Clear) -> PResult<()>;

    /// SPI and low 32 bits of the sequence number of the header at the
    /// start of `pkt` (`BadLength` if `pkt` is shorter than the header).
    fn parse_header(pkt: &[u8]) -> PResult<(u32, u32)>;

    /// The clear fields of the header at the start of `pkt`.
    fn header_clear(pkt: &[u8]) -> PResult<Self::Clear>;

    /// What the packet whose header starts `pkt` (at least
    /// [`Self::HEADER_LEN`] bytes), with full sequence number `seq`, sent
    /// between `outer`, authenticates besides its bytes: the AEAD
    /// associated data, and the bytes a separate MAC covers before and
    /// after the packet.
    fn auth(pkt: &[u8], seq: u64, esn: bool, outer: &OuterAddrs) -> Self::Auth;
}

/// ESP as RFC 4303 defines it: `SPI (4) | Sequence Number (4)`, IP
/// protocol 50; AEAD associated data `SPI || [Seq high] || Seq low`
/// (RFC 4106 §5), and with ESN the high 32 sequence bits authenticated
/// after the packet by a separate MAC (RFC 4303 §2.2.1). The outer
/// addresses are not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rfc4303;

/// [`Rfc4303`]'s authenticated data.
#[derive(Debug, Clone, Copy)]
pub struct Rfc4303Auth {
    aad: [u8; 12],
    aad_len: usize,
    hi: Option<[u8; 4]>,
}

impl EspAuth for Rfc4303Auth {
    #[inline]
    fn auth_ctx(&self) -> AuthCtx<'_> {
        AuthCtx {
            aad: &self.aad[..self.aad_len],
            mac_prefix: &[],
            mac_suffix: self.hi.as_ref().map_or(&[][..], |h| &h[..]),
        }
    }
}

impl EspLayout for Rfc4303 {
    const IP_PROTOCOL: u8 = proto::ESP;
    const HEADER_LEN: usize = HEADER_LEN;
    type Auth = Rfc4303Auth;
    type Clear = ();

    #[inline]
    fn clear_of(_pkt: &[u8]) -> PResult<()> {
        Ok(())
    }

    #[inline]
    fn emit_header(hdr: &mut [u8], spi: u32, seq: u64, _clear: &()) -> PResult<()> {
        emit_header(hdr, spi, seq);
        Ok(())
    }

    #[inline]
    fn header_clear(_pkt: &[u8]) -> PResult<()> {
        Ok(())
    }

    #[inline]
    fn parse_header(pkt: &[u8]) -> PResult<(u32, u32)> {
        let h = Esp::new_checked(pkt)?;
        Ok((h.spi(), h.seq()))
    }

    #[inline]
    fn auth(pkt: &[u8], seq: u64, esn: bool, _outer: &OuterAddrs) -> Rfc4303Auth {
        let mut aad = [0u8; 12];
        aad[..4].copy_from_slice(&pkt[..4]);
        let hi = ((seq >> 32) as u32).to_be_bytes();
        let aad_len = if esn {
            aad[4..8].copy_from_slice(&hi);
            aad[8..12].copy_from_slice(&(seq as u32).to_be_bytes());
            12
        } else {
            aad[4..8].copy_from_slice(&(seq as u32).to_be_bytes());
            8
        };
        Rfc4303Auth {
            aad,
            aad_len,
            hi: esn.then_some(hi),
        }
    }
}

/// Number of padding bytes so that payload + padding + trailer is a multiple
/// of `align` (the cipher block size, at least 4; RFC 4303 §2.4).
#[inline]
pub fn pad_len(payload_len: usize, align: usize) -> usize {
    let align = align.max(4);
    let used = payload_len + TRAILER_LEN;
    // Every suite's alignment is a power of two: a mask, not a division
    // (perf found the `div` among the outbound path's costliest lines).
    let rem = if align.is_power_of_two() {
        used & (align - 1)
    } else {
        used % align
    };
    if rem == 0 {
        0
    } else {
        align - rem
    }
}

/// Writes the default monotonic padding 1, 2, 3, … (RFC 4303 §2.4) followed by
/// the pad length and next header. `out` is exactly `pad + 2` bytes.
#[inline]
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
    fn rfc4303_layout() {
        assert_eq!((Rfc4303::IP_PROTOCOL, Rfc4303::HEADER_LEN), (50, 8));
        let mut h = [0u8; 8];
        Rfc4303::emit_header(&mut h, 0x1234_5678, 0x1_0000_0002, &()).unwrap();
        assert_eq!(h, [0x12, 0x34, 0x56, 0x78, 0, 0, 0, 2]);
        assert_eq!(Rfc4303::parse_header(&h).unwrap(), (0x1234_5678, 2));
        assert_eq!(
            Rfc4303::parse_header(&h[..7]).unwrap_err(),
            DropReason::BadLength
        );
        let outer = OuterAddrs {
            src: [192, 0, 2, 1].into(),
            dst: [192, 0, 2, 2].into(),
        };
        // Without ESN: the header itself; nothing for a separate MAC.
        let a = Rfc4303::auth(&h, 0x1_0000_0002, false, &outer);
        let c = a.auth_ctx();
        assert_eq!(c.aad, &h[..]);
        assert!(c.mac_prefix.is_empty() && c.mac_suffix.is_empty());
        // With ESN: SPI, high, low (RFC 4106 §5); the high bits after the
        // packet for a MAC (RFC 4303 §2.2.1).
        let a = Rfc4303::auth(&h, 0x1_0000_0002, true, &outer);
        let c = a.auth_ctx();
        assert_eq!(c.aad, &[0x12, 0x34, 0x56, 0x78, 0, 0, 0, 1, 0, 0, 0, 2][..]);
        assert!(c.mac_prefix.is_empty());
        assert_eq!(c.mac_suffix, &[0, 0, 0, 1][..]);
    }

    #[test]
    fn padding_alignment() {
        assert_eq!(pad_len(0, 16), 14);
        assert_eq!(pad_len(14, 16), 0);
        assert_eq!(pad_len(100, 1), 2);
        assert_eq!(pad_len(2, 4), 0);
        for n in 0..100 {
            for a in [4, 8, 16, 12] {
                let p = pad_len(n, a);
                assert_eq!((n + p + 2) % a, 0);
                assert!(p < a, "{n} {a}");
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
