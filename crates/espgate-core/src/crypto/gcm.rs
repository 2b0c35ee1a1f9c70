//! Which library runs AES-GCM, and ring's AES-GCM key with its wiping.
//!
//! aws-lc (through aws-lc-rs) is the workspace's cryptography. Its AES-GCM
//! has a VAES + VPCLMULQDQ path only for AVX-512. On a CPU with VAES and
//! VPCLMULQDQ but no AVX-512 (AMD Zen 3, Intel client cores since Alder
//! Lake) it takes its 2013 AES-NI + PCLMULQDQ code, while ring (the same
//! BoringSSL lineage, already a well-kept field crate) has BoringSSL's
//! VAES + AVX2 code (aws-lc's port of it, aws/aws-lc#2934, is not in a
//! release). Measured on a Zen 3 host (EPYC, family 25 model 1), one core,
//! the same keys, nonces and bytes: ring's seal took 0.53-0.59 of aws-lc's
//! time at 1400 B and 0.59-0.73 at 64 B (`docs/PERFORMANCE.md`, "AES-GCM
//! on CPUs without AVX-512"). So AES-GCM SAs use ring on such CPUs and
//! aws-lc everywhere else: with AVX-512 aws-lc has the wider code, and
//! without VAES both libraries run the same AES-NI code.
//!
//! `ESPGATE_AES_GCM=aws-lc` or `=ring` in the environment overrides the
//! choice (read once per process), so that both can be measured on one
//! host. ChaCha20-Poly1305, GMAC, CBC and the MACs always use aws-lc.

use crate::error::{DropReason, PResult};
use std::mem::MaybeUninit;
use std::sync::OnceLock;

/// The library an AES-GCM SA seals and opens with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcmImpl {
    /// aws-lc, through aws-lc-rs.
    AwsLc,
    /// ring's VAES + AVX2 code (or, on other CPUs when forced, its
    /// AES-NI code).
    Ring,
}

impl GcmImpl {
    /// The implementation new AES-GCM SAs use in this process.
    pub fn current() -> GcmImpl {
        static CHOICE: OnceLock<GcmImpl> = OnceLock::new();
        *CHOICE.get_or_init(|| match std::env::var("ESPGATE_AES_GCM").as_deref() {
            Ok("aws-lc") => GcmImpl::AwsLc,
            Ok("ring") => GcmImpl::Ring,
            _ => GcmImpl::for_this_cpu(),
        })
    }

    /// ring where the CPU has VAES, VPCLMULQDQ and AVX2 but not the
    /// AVX-512 that aws-lc's own VAES code needs; aws-lc otherwise.
    pub fn for_this_cpu() -> GcmImpl {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let vaes_avx2 = has!("vaes") && has!("vpclmulqdq") && has!("avx2");
            let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl");
            if vaes_avx2 && !avx512 {
                return GcmImpl::Ring;
            }
        }
        GcmImpl::AwsLc
    }

    /// For messages and bench headers: which library, and why.
    pub fn describe(self) -> &'static str {
        match (self, GcmImpl::for_this_cpu()) {
            (GcmImpl::Ring, GcmImpl::Ring) => {
                "ring (VAES + AVX2; aws-lc has VAES code only for AVX-512)"
            }
            (GcmImpl::Ring, GcmImpl::AwsLc) => "ring (forced by ESPGATE_AES_GCM)",
            (GcmImpl::AwsLc, GcmImpl::Ring) => "aws-lc (forced by ESPGATE_AES_GCM)",
            (GcmImpl::AwsLc, GcmImpl::AwsLc) => "aws-lc",
        }
    }

    /// The short name (`aws-lc`, `ring`), as `ESPGATE_AES_GCM` takes it.
    pub fn name(self) -> &'static str {
        match self {
            GcmImpl::AwsLc => "aws-lc",
            GcmImpl::Ring => "ring",
        }
    }
}

/// A ring AES-GCM key that is wiped when dropped.
///
/// ring does not wipe its keys: the AES round keys (the first of which is
/// the key itself) and the GHASH table would stay in freed memory. The key
/// lives in a box of its own as `MaybeUninit` (so that all-zero bytes are
/// a valid value of the box's type) and is overwritten there on drop;
/// `Transform::new` scrubs the stack its construction used.
pub struct RingGcmKey {
    key: Box<MaybeUninit<ring::aead::LessSafeKey>>,
}

impl RingGcmKey {
    /// AES-128-GCM or AES-256-GCM (by the key's length: 16 or 32 bytes).
    pub(super) fn new(key: &[u8]) -> Option<RingGcmKey> {
        let alg = match key.len() {
            16 => &ring::aead::AES_128_GCM,
            32 => &ring::aead::AES_256_GCM,
            _ => return None,
        };
        let k = ring::aead::UnboundKey::new(alg, key).ok()?;
        let mut boxed = Box::new(MaybeUninit::uninit());
        boxed.write(ring::aead::LessSafeKey::new(k));
        Some(RingGcmKey { key: boxed })
    }

    #[inline]
    #[allow(unsafe_code)]
    fn key(&self) -> &ring::aead::LessSafeKey {
        // SAFETY: written in `new`, and wiped only in `drop`.
        unsafe { self.key.assume_init_ref() }
    }

    /// Seals `body` in place and writes the tag to `tag` (16 bytes).
    #[inline]
    pub(super) fn seal(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        body: &mut [u8],
        tag: &mut [u8],
    ) -> PResult<()> {
        let t = self
            .key()
            .seal_in_place_separate_tag(
                ring::aead::Nonce::assume_unique_for_key(nonce),
                ring::aead::Aad::from(aad),
                body,
            )
            .map_err(|_| DropReason::Crypto)?;
        if tag.len() != t.as_ref().len() {
            return Err(DropReason::BadLength);
        }
        tag.copy_from_slice(t.as_ref());
        Ok(())
    }

    /// Opens `body_and_tag` (ciphertext, then the 16-byte tag) in place;
    /// the tag is checked in constant time by ring.
    #[inline]
    pub(super) fn open(&self, nonce: [u8; 12], aad: &[u8], body_and_tag: &mut [u8]) -> PResult<()> {
        self.key()
            .open_in_place(
                ring::aead::Nonce::assume_unique_for_key(nonce),
                ring::aead::Aad::from(aad),
                body_and_tag,
            )
            .map(|_| ())
            .map_err(|_| DropReason::Integrity)
    }

    /// Opens `body` in place against the separate 16-byte `tag` (checked in
    /// constant time by ring).
    #[inline]
    fn open_separate(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        body: &mut [u8],
        tag: &[u8; 16],
    ) -> PResult<()> {
        self.key()
            .open_in_place_separate_tag(
                ring::aead::Nonce::assume_unique_for_key(nonce),
                ring::aead::Aad::from(aad),
                ring::aead::Tag::from(*tag),
                body,
                0..,
            )
            .map(|_| ())
            .map_err(|_| DropReason::Integrity)
    }
}

/// A bare AES-GCM key (16 or 32 bytes, no salt) in either library
/// ([`GcmImpl`]), sealing and opening in place with the tag kept apart:
/// for `espgate bench relay --seal-key-file`, which measures, in the
/// library the gateways use on its CPU ([`GcmImpl::current`]), what
/// per-packet AES-GCM costs a userspace tunnel with nothing else in it. Not for ESP (its SAs go through [`crate::crypto::Transform`]).
/// The nonce is the caller's to keep unique. ring's key is wiped on drop
/// (the same wiping as its ESP keys); aws-lc wipes its own.
pub enum GcmKey {
    /// ring.
    Ring(RingGcmKey),
    /// aws-lc.
    AwsLc(aws_lc_rs::aead::LessSafeKey),
}

impl GcmKey {
    /// AES-128-GCM or AES-256-GCM by the key's length, in `imp`; `None` for
    /// another length.
    pub fn new(key: &[u8], imp: GcmImpl) -> Option<GcmKey> {
        match imp {
            GcmImpl::Ring => RingGcmKey::new(key).map(GcmKey::Ring),
            GcmImpl::AwsLc => {
                let alg = match key.len() {
                    16 => &aws_lc_rs::aead::AES_128_GCM,
                    32 => &aws_lc_rs::aead::AES_256_GCM,
                    _ => return None,
                };
                let k = aws_lc_rs::aead::UnboundKey::new(alg, key).ok()?;
                Some(GcmKey::AwsLc(aws_lc_rs::aead::LessSafeKey::new(k)))
            }
        }
    }

    /// Seals `body` in place; its tag goes to `tag`.
    pub fn seal(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        body: &mut [u8],
        tag: &mut [u8; 16],
    ) -> PResult<()> {
        match self {
            GcmKey::Ring(k) => k.seal(nonce, aad, body, tag),
            GcmKey::AwsLc(k) => {
                use aws_lc_rs::aead::{Aad, Nonce};
                let t = k
                    .seal_in_place_separate_tag(
                        Nonce::assume_unique_for_key(nonce),
                        Aad::from(aad),
                        body,
                    )
                    .map_err(|_| DropReason::Crypto)?;
                tag.copy_from_slice(t.as_ref());
                Ok(())
            }
        }
    }

    /// Opens `body` in place against `tag` (`Integrity` if it does not
    /// verify; the tag is compared in constant time by either library).
    pub fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        body: &mut [u8],
        tag: &[u8; 16],
    ) -> PResult<()> {
        match self {
            GcmKey::Ring(k) => k.open_separate(nonce, aad, body, tag),
            GcmKey::AwsLc(k) => {
                use aws_lc_rs::aead::{Aad, Nonce};
                k.open_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(aad),
                    tag,
                    body,
                )
                .map(|_| ())
                .map_err(|_| DropReason::Integrity)
            }
        }
    }

    /// The library it runs in.
    pub fn library(&self) -> GcmImpl {
        match self {
            GcmKey::Ring(_) => GcmImpl::Ring,
            GcmKey::AwsLc(_) => GcmImpl::AwsLc,
        }
    }
}

impl std::fmt::Debug for GcmKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        write!(f, "GcmKey({})", self.library().name())
    }
}

impl Drop for RingGcmKey {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: `LessSafeKey` holds only flat data (round keys, the
        // GHASH key table, CPU feature bits) and a reference to a static
        // algorithm; it has no `Drop`. Its bytes are overwritten in place
        // through a raw pointer, and the box's type, `MaybeUninit`, is
        // valid for any bytes; nothing reads the key afterwards.
        unsafe { zeroize::zeroize_flat_type(&mut *self.key as *mut MaybeUninit<_>) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{AuthCtx, Suite, Transform};
    use proptest::prelude::*;

    fn pair(suite: &str, key: &[u8]) -> (Transform, Transform) {
        let s: Suite = suite.parse().unwrap();
        (
            Transform::with_gcm(s, key, &[], GcmImpl::AwsLc).unwrap(),
            Transform::with_gcm(s, key, &[], GcmImpl::Ring).unwrap(),
        )
    }

    #[test]
    fn each_transform_says_which_library_runs_it() {
        let (a, r) = pair("aes128gcm16", &[7; 20]);
        assert_eq!(
            (a.gcm_impl(), r.gcm_impl()),
            (Some(GcmImpl::AwsLc), Some(GcmImpl::Ring))
        );
        assert!(r.is_aead() && r.is_combined() && !r.seals_from());
        // Only AES-GCM goes to ring.
        for (suite, klen) in [("chacha20poly1305", 36), ("aes128gmac", 20)] {
            let s: Suite = suite.parse().unwrap();
            let t = Transform::with_gcm(s, &vec![7; klen], &[], GcmImpl::Ring).unwrap();
            assert_ne!(t.gcm_impl(), Some(GcmImpl::Ring), "{suite}");
        }
        assert!(RingGcmKey::new(&[7; 24]).is_none(), "no AES-192-GCM");
        assert!(!GcmImpl::current().describe().is_empty());
    }

    #[test]
    fn a_bare_key_seals_alike_in_both_libraries_and_each_opens_the_others() {
        for klen in [16, 32] {
            let key: Vec<u8> = (0..klen as u8).collect();
            let r = GcmKey::new(&key, GcmImpl::Ring).unwrap();
            let a = GcmKey::new(&key, GcmImpl::AwsLc).unwrap();
            assert_eq!((r.library(), a.library()), (GcmImpl::Ring, GcmImpl::AwsLc));
            assert!(!format!("{r:?}{a:?}").contains("00, 01"));
            let nonce = [9u8; 12];
            let clear: Vec<u8> = (0..1500u32).map(|i| (i * 31) as u8).collect();
            let (mut br, mut ba) = (clear.clone(), clear.clone());
            let (mut tr, mut ta) = ([0u8; 16], [0u8; 16]);
            r.seal(nonce, b"aad", &mut br, &mut tr).unwrap();
            a.seal(nonce, b"aad", &mut ba, &mut ta).unwrap();
            assert_eq!((&br, tr), (&ba, ta), "same bytes, same tag");
            assert_ne!(br, clear);
            for (opener, body, tag) in [(&r, &ba, &ta), (&a, &br, &tr)] {
                let mut b = body.clone();
                opener.open(nonce, b"aad", &mut b, tag).unwrap();
                assert_eq!(b, clear);
                // A flipped bit in the body, the tag, the AAD or the nonce.
                let mut b = body.clone();
                b[700] ^= 1;
                assert_eq!(
                    opener.open(nonce, b"aad", &mut b, tag),
                    Err(DropReason::Integrity)
                );
                let mut t = *tag;
                t[15] ^= 0x80;
                let mut b = body.clone();
                assert_eq!(
                    opener.open(nonce, b"aad", &mut b, &t),
                    Err(DropReason::Integrity)
                );
                let mut b = body.clone();
                assert_eq!(
                    opener.open(nonce, b"aab", &mut b, tag),
                    Err(DropReason::Integrity)
                );
                let mut b = body.clone();
                assert_eq!(
                    opener.open([8; 12], b"aad", &mut b, tag),
                    Err(DropReason::Integrity)
                );
            }
        }
        assert!(GcmKey::new(&[1; 24], GcmImpl::Ring).is_none());
        assert!(GcmKey::new(&[1; 24], GcmImpl::AwsLc).is_none());
    }

    proptest! {
        /// ring and aws-lc seal the same ESP body to the same bytes, each
        /// opens what the other sealed (in place and out of place), and
        /// neither opens it once a bit is flipped.
        #[test]
        fn ring_and_aws_lc_agree(
            aes256 in any::<bool>(),
            key in proptest::collection::vec(any::<u8>(), 36),
            iv in any::<[u8; 8]>(),
            aad in proptest::collection::vec(any::<u8>(), 8..=12),
            body in proptest::collection::vec(any::<u8>(), 0..1600),
            flip in any::<prop::sample::Index>(),
        ) {
            let (suite, klen) = if aes256 { ("aes256gcm16", 36) } else { ("aes128gcm16", 20) };
            let (mut a, mut r) = pair(suite, &key[..klen]);
            let auth = AuthCtx { aad: &aad, ..AuthCtx::default() };
            let pkt = |t: &mut Transform| {
                let mut p = vec![0x55u8; 8];
                let mut v = vec![0u8; 8];
                t.fill_iv(&mut v, u64::from_be_bytes(iv)).unwrap();
                p.extend_from_slice(&v);
                p.extend_from_slice(&body);
                p.extend_from_slice(&[0; 16]);
                p
            };
            let (mut pa, mut pr) = (pkt(&mut a), pkt(&mut r));
            a.seal(&mut pa, 8, &auth).unwrap();
            r.seal(&mut pr, 8, &auth).unwrap();
            prop_assert_eq!(&pa, &pr);
            for (opener, sealed) in [(&a, &pr), (&r, &pa)] {
                let mut p = sealed.clone();
                opener.open(&mut p, 8, &auth).unwrap();
                prop_assert_eq!(&p[16..16 + body.len()], &body[..]);
                let mut q = sealed.clone();
                q[16..].fill(0);
                opener.open_from(sealed, &mut q, 8, &auth, &mut crate::cost::NoProbe).unwrap();
                prop_assert_eq!(&q[16..16 + body.len()], &body[..]);
                let mut bad = sealed.clone();
                let at = 8 + flip.index(bad.len() - 8);
                bad[at] ^= 0x80;
                prop_assert_eq!(opener.open(&mut bad, 8, &auth), Err(DropReason::Integrity));
            }
        }
    }
}
