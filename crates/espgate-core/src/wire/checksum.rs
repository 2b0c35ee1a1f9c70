//! The Internet checksum (RFC 1071).

use std::net::IpAddr;

/// Ones-complement sum of `data` added to `acc`, folded to at most 17 bits
/// (not yet complemented).
///
/// Written for speed: the TCP offloads run it over every inner packet
/// (segmentation fills each segment's checksum, coalescing verifies each
/// one). RFC 1071 §2 lets the sum be taken in any byte order and over
/// wider words, folded at the end: 32-bit words in native order go into a
/// 64-bit accumulator with no per-word byte swap, which the compiler turns
/// into a few vector instructions per 16 bytes; the folded 16-bit sum is
/// put into network order once. `cargo bench -p espgate-core --bench esp
/// -- checksum`: 1400 bytes in 76 ns with 16-bit big-endian words, 35 ns
/// this way, 15 ns with the same loop compiled for AVX2 where the CPU has
/// it (`wide_sum`; docs/PERFORMANCE.md).
pub fn sum(acc: u32, data: &[u8]) -> u32 {
    let whole = data.len() & !3;
    fold(acc, wide_sum(&data[..whole]), &data[whole..])
}

/// Copies `src` into `dst` (of the same length) and returns [`sum`]`(acc,
/// src)`, in one pass: the coalescer appends each verified segment to its
/// super-segment, and summing the bytes while they are in registers for
/// the copy makes the copy cheap: 1400 bytes in about 26 ns against
/// 23 ns for the sum alone and 35-45 ns for a copy then a sum (`cargo
/// bench -p espgate-core --bench esp -- checksum`; docs/PERFORMANCE.md).
/// The standard library's copy and the checksum code we found elsewhere
/// each make their own pass; the fused loop is written here.
///
/// # Panics
///
/// If the lengths differ (a caller's bug).
pub fn copy_sum(acc: u32, dst: &mut [u8], src: &[u8]) -> u32 {
    assert_eq!(dst.len(), src.len(), "copy_sum: lengths differ");
    let whole = src.len() & !3;
    let wide = wide_copy_sum(&mut dst[..whole], &src[..whole]);
    dst[whole..].copy_from_slice(&src[whole..]);
    fold(acc, wide, &src[whole..])
}

/// Folds a native-order 64-bit word sum to 16 bits, adds it in network
/// order to `acc` with the 0-3 `tail` bytes that did not fill a word, and
/// folds to at most 17 bits.
#[inline(always)]
fn fold(acc: u32, wide: u64, tail: &[u8]) -> u32 {
    // Fold 64 -> 16 bits: each step at least halves what is above 16 bits.
    let mut f = (wide & 0xffff_ffff) + (wide >> 32);
    f = (f & 0xffff) + (f >> 16);
    f = (f & 0xffff) + (f >> 16);
    f = (f & 0xffff) + (f >> 16);
    // A native-order sum is the network-order sum with its bytes in native
    // order (swapped on little-endian machines).
    let mut t = u64::from(acc) + u64::from(u16::from_be(f as u16));
    let mut rest = tail.chunks_exact(2);
    for c in &mut rest {
        t += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = rest.remainder() {
        t += u64::from(*last) << 8;
    }
    // At most 2^32 + 3 * 2^16 here: two folds bring it under 2^17.
    t = (t & 0xffff) + (t >> 16);
    ((t & 0xffff) + (t >> 16)) as u32
}

/// The sum of `data`'s 32-bit native-order words (`data.len()` a
/// multiple of 4), in 64 bits: the one loop of [`sum`].
#[inline(always)]
fn words(data: &[u8]) -> u64 {
    let mut wide = 0u64;
    for w in data.chunks_exact(4) {
        wide += u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
    }
    wide
}

/// Below this many bytes the feature check is not worth it (headers).
const WIDE_MIN: usize = 128;

/// [`words`], compiled a second time for AVX2 and chosen at run time
/// where the CPU has it: the same code, so the same result, with twice the
/// vector width (the whole sum of 1400 bytes twice as fast here). The
/// binary stays portable: CPUs without AVX2 run the baseline loop. (The
/// standard library's feature check is a cached load; no crate needed.)
fn wide_sum(data: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= WIDE_MIN && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: `words_avx2` only needs AVX2, which was detected just
        // above on this CPU.
        #[allow(unsafe_code)]
        return unsafe { words_avx2(data) };
    }
    words(data)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn words_avx2(data: &[u8]) -> u64 {
    words(data)
}

/// [`words`] while copying each word from `src` to `dst` (same length, a
/// multiple of 4): the one loop of [`copy_sum`].
#[inline(always)]
fn copy_words(dst: &mut [u8], src: &[u8]) -> u64 {
    let mut wide = 0u64;
    for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
        let w = [s[0], s[1], s[2], s[3]];
        d.copy_from_slice(&w);
        wide += u64::from(u32::from_ne_bytes(w));
    }
    wide
}

/// [`copy_words`], with the AVX2 copy where the CPU has it, as
/// [`wide_sum`].
fn wide_copy_sum(dst: &mut [u8], src: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= WIDE_MIN && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: `copy_words_avx2` only needs AVX2, which was detected
        // just above on this CPU.
        #[allow(unsafe_code)]
        return unsafe { copy_words_avx2(dst, src) };
    }
    copy_words(dst, src)
}

/// [`copy_words`] for AVX2 in explicit 32-byte loads and stores, 64
/// bytes per round into four 64-bit lane accumulators. The compiler's own
/// vectorisation of [`copy_words`] moved 16 bytes per load and store (1400
/// bytes: 31.8 ns; this loop 25.5 ns, against 22.6 ns for the sum alone
/// and 40 ns for a copy then a sum; docs/PERFORMANCE.md). For the sum
/// alone the compiler's loop is as fast as this one, so [`words_avx2`]
/// stays portable code. Each 32-bit word is zero-extended into a 64-bit
/// lane: no lane can overflow for any slice that fits in memory. The last
/// bytes (under 64) go through [`copy_words`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn copy_words_avx2(dst: &mut [u8], src: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len()) / 64 * 64;
    let zero = _mm256_setzero_si256();
    let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
    let mut i = 0;
    while i < n {
        // SAFETY: i + 64 <= n <= the lengths of `src` and `dst`: the
        // 32-byte loads and stores are in bounds, and their unaligned forms
        // need no alignment.
        #[allow(unsafe_code)]
        unsafe {
            let v0 = _mm256_loadu_si256(src.as_ptr().add(i).cast());
            let v1 = _mm256_loadu_si256(src.as_ptr().add(i + 32).cast());
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), v0);
            _mm256_storeu_si256(dst.as_mut_ptr().add(i + 32).cast(), v1);
            a0 = _mm256_add_epi64(a0, _mm256_unpacklo_epi32(v0, zero));
            a1 = _mm256_add_epi64(a1, _mm256_unpackhi_epi32(v0, zero));
            a2 = _mm256_add_epi64(a2, _mm256_unpacklo_epi32(v1, zero));
            a3 = _mm256_add_epi64(a3, _mm256_unpackhi_epi32(v1, zero));
        }
        i += 64;
    }
    let a = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    let mut lanes = [0u64; 4];
    // SAFETY: `lanes` is 32 bytes long.
    #[allow(unsafe_code)]
    unsafe {
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), a)
    };
    lanes.iter().sum::<u64>() + copy_words(&mut dst[n..], &src[n..])
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

/// Sum of the TCP/UDP pseudo-header for either IP version (not folded:
/// under 2^21, which [`sum`] and [`finish`] take as any other sum).
///
/// The addresses' 16-bit words are added as integers rather than through
/// [`sum`]: this runs for every segment cut and every segment coalesced,
/// and two calls of the general loop over 4 or 16 bytes cost more than
/// the arithmetic.
pub fn pseudo_header(src: IpAddr, dst: IpAddr, proto: u8, len: u32) -> u32 {
    let words = |a: IpAddr| -> u32 {
        match a {
            IpAddr::V4(a) => {
                let x = u32::from(a);
                (x >> 16) + (x & 0xffff)
            }
            IpAddr::V6(a) => {
                let x = u128::from(a);
                (0..8).map(|i| ((x >> (16 * i)) & 0xffff) as u32).sum()
            }
        }
    };
    let acc = if src.is_ipv4() == dst.is_ipv4() {
        words(src) + words(dst)
    } else {
        // Mixed families never share a pseudo-header; callers never ask.
        0
    };
    acc + u32::from(proto) + (len >> 16) + (len & 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The straightforward RFC 1071 sum: 16-bit big-endian words.
    fn reference(mut acc: u64, data: &[u8]) -> u16 {
        let mut c = data.chunks_exact(2);
        for w in &mut c {
            acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
        }
        if let [last] = c.remainder() {
            acc += u64::from(*last) << 8;
        }
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    }

    /// `n` pseudo-random bytes from a linear congruential generator.
    fn lcg_bytes(mut x: u32, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn the_fast_sum_equals_the_reference_at_every_length_and_offset() {
        // Pseudo-random bytes, and runs of 0xff that carry most.
        let mut data = lcg_bytes(0x1234_5678, 3000);
        data[1000..2000].fill(0xff);
        for start in 0..4 {
            for len in (0..140).chain([1399, 1400, 1401, 1999, 2995]) {
                let d = &data[start..start + len];
                for acc in [0u32, 1, 0xffff, 0x1_fffe, u32::MAX - 0x3_0000] {
                    let got = finish(sum(acc, d));
                    let want = !reference(u64::from(acc), d);
                    assert_eq!(got, want, "start {start} len {len} acc {acc:#x}");
                    assert!(sum(acc, d) < 0x2_0000);
                }
            }
        }
        // A long all-ones input (the largest sums).
        let ones = vec![0xffu8; 65535];
        assert_eq!(finish(sum(0, &ones)), !reference(0, &ones));
    }

    #[test]
    fn the_avx2_loop_and_the_baseline_loop_agree() {
        // `sum` takes the AVX2 loop from WIDE_MIN bytes on CPUs that have
        // it, so the test above checks that path there; this one compares
        // the two loops word for word, whichever CPU runs it.
        let mut data = lcg_bytes(0x9e37_79b9, 4100);
        data[2048..].fill(0xff);
        for start in [0, 1, 2, 3, 17, 2040] {
            for len in (0..2048).step_by(4) {
                let d = &data[start..start + len];
                assert_eq!(wide_sum(d), words(d), "start {start} len {len}");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            #[allow(unsafe_code)]
            // SAFETY: AVX2 was detected just above.
            let avx2 = unsafe { words_avx2(&data) };
            assert_eq!(avx2, words(&data));
        }
    }

    #[test]
    fn copy_sum_copies_and_sums_as_sum_does() {
        let mut data = lcg_bytes(0x0bad_cafe, 4500);
        data[3000..].fill(0xff);
        for start in [0, 1, 2, 3, 61, 2999] {
            for len in (0..260).chain([1399, 1400, 1401, 1448, 1199]) {
                let src = &data[start..start + len];
                for acc in [0u32, 0x1_fffe] {
                    // A destination at another alignment, pre-filled so a
                    // byte not copied shows.
                    let mut out = vec![0xa5u8; len + 3];
                    let got = copy_sum(acc, &mut out[3..], src);
                    assert_eq!(got, sum(acc, src), "start {start} len {len}");
                    assert_eq!(&out[3..], src, "start {start} len {len}");
                    assert_eq!(out[..3], [0xa5; 3]);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let src = &data[5..5 + 4100];
            let (mut a, mut b) = (vec![0u8; 4100], vec![0u8; 4100]);
            #[allow(unsafe_code)]
            // SAFETY: AVX2 was detected just above.
            let avx2 = unsafe { copy_words_avx2(&mut a, src) };
            assert_eq!(avx2, copy_words(&mut b, src));
            assert_eq!(avx2, words(src));
            assert_eq!((a.as_slice(), b.as_slice()), (src, src));
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn copy_sum_refuses_a_destination_of_another_length() {
        copy_sum(0, &mut [0u8; 3], &[1, 2]);
    }

    #[test]
    fn the_pseudo_header_sum_is_the_sum_of_its_bytes() {
        let v4 = |a: [u8; 4]| IpAddr::from(a);
        let v6 = |a: [u8; 16]| IpAddr::from(a);
        let cases = [
            (v4([10, 1, 0, 1]), v4([192, 168, 255, 254])),
            (v4([255; 4]), v4([255; 4])),
            (v6([0xfe; 16]), v6([0xff; 16])),
            (
                v6([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
                v6([
                    0x20, 0x01, 0x0d, 0xb8, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34, 2,
                ]),
            ),
        ];
        for (s, d) in cases {
            for (proto, len) in [(6u8, 20u32), (17, 65_535), (6, 0x1_0004), (58, u32::MAX)] {
                // RFC 793 §3.1 / RFC 8200 §8.1: addresses, then length and
                // protocol as words; the bytes' sum is the same either way.
                let mut b = Vec::new();
                for a in [s, d] {
                    match a {
                        IpAddr::V4(a) => b.extend(a.octets()),
                        IpAddr::V6(a) => b.extend(a.octets()),
                    }
                }
                b.extend(len.to_be_bytes());
                b.extend([0, 0, 0, proto]);
                assert_eq!(
                    finish(pseudo_header(s, d, proto, len)),
                    !reference(0, &b),
                    "{s} {d} {proto} {len}"
                );
            }
        }
        assert_eq!(pseudo_header(v4([1, 2, 3, 4]), v6([1; 16]), 6, 0), 6);
    }

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
