//! The Internet checksum (RFC 1071).

use std::net::IpAddr;

/// Ones-complement sum of `data`, folded to 32 bits (not yet complemented).
pub fn sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    // Fold early so that long inputs never overflow.
    (acc & 0xffff) + (acc >> 16)
}

/// Folds and complements an accumulated sum.
pub fn finish(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// Checksum of one buffer.
pub fn checksum(data: &[u8]) -> u16 {
    finish(sum(0, data))
}

/// Incremental update (RFC 1624, eqn. 3) of the checksum field `check` when a
/// 16-bit word of the data it covers changes from `old` to `new`:
/// `HC' = ~(~HC + ~m + m')`. A word at an odd offset from the start of the
/// checksummed data is passed byte-swapped (`old.swap_bytes()`), since its
/// bytes fall into two words of the sum.
pub fn update(check: u16, old: u16, new: u16) -> u16 {
    let s = u32::from(!check) + u32::from(!old) + u32::from(new);
    finish(s)
}

/// Sum of the TCP/UDP pseudo-header for either IP version.
pub fn pseudo_header(src: IpAddr, dst: IpAddr, proto: u8, len: u32) -> u32 {
    let mut acc = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => sum(sum(0, &s.octets()), &d.octets()),
        (IpAddr::V6(s), IpAddr::V6(d)) => sum(sum(0, &s.octets()), &d.octets()),
        // Mixed families never share a pseudo-header; callers never ask.
        _ => 0,
    };
    acc += u32::from(proto);
    acc += len >> 16;
    acc += len & 0xffff;
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3 example bytes: sum is 0xddf2, checksum its complement.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn incremental_update_matches_recomputation() {
        // Every aligned and unaligned 16-bit rewrite of a buffer gives the
        // checksum a full recomputation gives.
        let base: Vec<u8> = (0..23u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        for at in 0..base.len() - 1 {
            for new in [0u16, 1, 0x00ff, 0xff00, 0xfffe, 0xffff, 0x1234] {
                let mut b = base.clone();
                let old = u16::from_be_bytes([b[at], b[at + 1]]);
                b[at..at + 2].copy_from_slice(&new.to_be_bytes());
                let (o, n) = if at % 2 == 0 {
                    (old, new)
                } else {
                    (old.swap_bytes(), new.swap_bytes())
                };
                // The stored field verifies the whole buffer: compare sums
                // rather than the two representations of zero.
                let want = checksum(&b);
                let got = update(checksum(&base), o, n);
                assert!(
                    got == want || (got == 0xffff && want == 0) || (got == 0 && want == 0xffff),
                    "at {at} new {new:#x}: {got:#x} != {want:#x}"
                );
            }
        }
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(
            checksum(&[0x12, 0x34, 0x56]),
            checksum(&[0x12, 0x34, 0x56, 0x00])
        );
    }
}
