//! Diffie-Hellman key exchange for IKEv2 (RFC 7296 §1.2, §3.4).
//!
//! A [`KeyExchange`] holds one ephemeral private key of a [`Group`]; its
//! [`KeyExchange::public_value`] is the Key Exchange Data of the KE payload
//! and [`KeyExchange::agree`] turns the peer's KE data into the shared
//! secret g^ir that feeds SKEYSEED (RFC 7296 §2.14). Wire formats:
//!
//! * Curve25519 (RFC 8031 §2): the 32-byte little-endian u-coordinate both
//!   ways; an all-zero shared secret (peer sent a low-order point) is an
//!   error.
//! * ECP-256/384 (RFC 5903 §7): KE data is x || y, each coordinate padded
//!   to the field size, without the SEC1 0x04 prefix; the shared secret is
//!   the x coordinate only. The peer point is checked to be on the curve.
//! * MODP 2048/3072 (RFC 3526 groups 14 and 15, generator 2): public value
//!   and shared secret are big-endian, left-padded to the prime's length.
//!   A peer value outside 1 < y < p-1 is rejected (NIST SP 800-56A
//!   §5.6.2.3.1). The exponentiations are aws-lc's constant-time
//!   Montgomery code, reached through aws-lc-sys.
//!
//! Private keys never leave the crypto library objects, which cleanse their
//! memory when freed; shared secrets are returned in [`Zeroizing`] buffers.
//! Nothing here does I/O; private keys are drawn from the caller's
//! [`Rng`] (fail closed: no key without random bytes) and imported into
//! aws-lc.

use std::fmt;

use aws_lc_rs::agreement::{self, PrivateKey, UnparsedPublicKey};
use zeroize::Zeroizing;

use super::rng::{Rng, RngError};
use super::wire::dh as ids;

/// A Diffie-Hellman group (IKEv2 transform type 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    /// Curve25519 / X25519 (RFC 8031), transform ID 31.
    Curve25519,
    /// 256-bit random ECP group, NIST P-256 (RFC 5903), transform ID 19.
    Ecp256,
    /// 384-bit random ECP group, NIST P-384 (RFC 5903), transform ID 20.
    Ecp384,
    /// 2048-bit MODP group (RFC 3526 §3), transform ID 14.
    Modp2048,
    /// 3072-bit MODP group (RFC 3526 §4), transform ID 15.
    Modp3072,
}

/// Every supported group, in default preference order (strongest-per-cost
/// first).
const ALL_GROUPS: [Group; 5] = [
    Group::Curve25519,
    Group::Ecp256,
    Group::Ecp384,
    Group::Modp2048,
    Group::Modp3072,
];

impl Group {
    /// IANA transform ID (IKEv2 transform type 4).
    pub fn id(self) -> u16 {
        match self {
            Group::Curve25519 => ids::CURVE25519,
            Group::Ecp256 => ids::ECP_256,
            Group::Ecp384 => ids::ECP_384,
            Group::Modp2048 => ids::MODP_2048,
            Group::Modp3072 => ids::MODP_3072,
        }
    }

    /// The supported group with IANA transform ID `id`, if any.
    pub fn from_id(id: u16) -> Option<Group> {
        ALL_GROUPS.into_iter().find(|g| g.id() == id)
    }

    /// strongSwan proposal keyword (`x25519`, `ecp256`, `modp2048`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Group::Curve25519 => "x25519",
            Group::Ecp256 => "ecp256",
            Group::Ecp384 => "ecp384",
            Group::Modp2048 => "modp2048",
            Group::Modp3072 => "modp3072",
        }
    }

    /// Parses a strongSwan keyword, case-insensitively; `curve25519` is
    /// accepted as an alias of `x25519`.
    pub fn from_name(s: &str) -> Option<Group> {
        if s.eq_ignore_ascii_case("curve25519") {
            return Some(Group::Curve25519);
        }
        ALL_GROUPS
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(s))
    }

    /// Length in bytes of the Key Exchange Data (our public value and the
    /// peer's).
    pub fn public_len(self) -> usize {
        match self {
            Group::Curve25519 => 32,
            Group::Ecp256 => 64,
            Group::Ecp384 => 96,
            Group::Modp2048 => 256,
            Group::Modp3072 => 384,
        }
    }

    /// Length in bytes of the shared secret g^ir returned by
    /// [`KeyExchange::agree`].
    pub fn secret_len(self) -> usize {
        match self {
            Group::Curve25519 => 32,
            Group::Ecp256 => 32,
            Group::Ecp384 => 48,
            Group::Modp2048 => 256,
            Group::Modp3072 => 384,
        }
    }

    /// Bytes of random private key material [`KeyExchange::generate`]
    /// draws: the scalar size for X25519 and ECP, the exponent length
    /// rounded up to whole bytes for MODP.
    fn private_len(self) -> usize {
        match self {
            Group::Curve25519 | Group::Ecp256 => 32,
            Group::Ecp384 => 48,
            Group::Modp2048 | Group::Modp3072 => (modp::exponent_bits(self) as usize).div_ceil(8),
        }
    }

    /// Every supported group, in default preference order.
    pub fn all() -> &'static [Group] {
        &ALL_GROUPS
    }

    /// The aws-lc-rs agreement algorithm of an elliptic-curve group.
    fn ec_algorithm(self) -> Option<&'static agreement::Algorithm> {
        match self {
            Group::Curve25519 => Some(&agreement::X25519),
            Group::Ecp256 => Some(&agreement::ECDH_P256),
            Group::Ecp384 => Some(&agreement::ECDH_P384),
            Group::Modp2048 | Group::Modp3072 => None,
        }
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a key exchange step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    /// The peer's Key Exchange Data has the wrong length for the group.
    #[error("{group} key exchange data is {got} bytes, expected {}", .group.public_len())]
    BadPublicLength {
        /// The group the data was meant for.
        group: Group,
        /// The length received.
        got: usize,
    },
    /// The peer's public value is not an acceptable group element (ECP
    /// point not on the curve, MODP value outside 1 < y < p-1, X25519
    /// low-order point giving an all-zero secret).
    #[error("{0} peer public value rejected")]
    InvalidPublic(Group),
    /// The crypto library failed (allocation, internal error).
    #[error("{0} key exchange failed in the crypto library")]
    Crypto(Group),
    /// The random number generator failed: no private key was made.
    #[error("{0} key exchange: {1}")]
    Random(Group, RngError),
}

/// The private half of one group's key exchange.
enum Secret {
    /// X25519, P-256, P-384: an aws-lc-rs key (an `EVP_PKEY`, cleansed on
    /// free), usable for any number of agreements by reference.
    Ec(PrivateKey),
    /// MODP: an aws-lc `DH` object holding p, g, x and g^x.
    Modp(modp::DhKey),
}

/// One side of a Diffie-Hellman exchange: a freshly generated private key
/// and its public value in IKE KE payload format.
///
/// The private key is freed (and its memory cleansed by aws-lc) on drop.
/// `Debug` prints only the group.
pub struct KeyExchange {
    group: Group,
    public: Vec<u8>,
    secret: Secret,
}

impl fmt::Debug for KeyExchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyExchange")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl KeyExchange {
    /// Generates a fresh private key for `group` from `rng` and computes
    /// its public value: 32 random bytes for X25519 (clamped by the
    /// library, RFC 7748), a random scalar in [1, n-1] for the ECP groups
    /// (rejection sampling), a random exponent of exactly 320 (modp2048)
    /// or 420 (modp3072) bits for MODP (see `modp::exponent_bits`).
    ///
    /// # Errors
    /// [`DhError::Random`] if `rng` fails (never a key from zeros),
    /// [`DhError::Crypto`] if the crypto library fails.
    pub fn generate(group: Group, rng: &mut dyn Rng) -> Result<KeyExchange, DhError> {
        let mut private = Zeroizing::new(vec![0u8; group.private_len()]);
        match group.ec_algorithm() {
            Some(alg) => {
                // A P-256/P-384 scalar from uniform bytes is out of range
                // with probability below 2^-32; X25519 takes any 32 bytes.
                for _ in 0..8 {
                    rng.fill(&mut private)
                        .map_err(|e| DhError::Random(group, e))?;
                    if let Ok(key) = PrivateKey::from_private_key(alg, &private) {
                        return KeyExchange::from_ec_key(group, key);
                    }
                }
                Err(DhError::Crypto(group))
            }
            None => {
                rng.fill(&mut private)
                    .map_err(|e| DhError::Random(group, e))?;
                // Exactly exponent_bits bits: clear the excess high bits of
                // the first byte and set the top one.
                let bits = modp::exponent_bits(group);
                let excess = private.len() * 8 - bits as usize;
                private[0] &= 0xff >> excess;
                private[0] |= 0x80 >> excess;
                KeyExchange::from_dh_key(group, modp::DhKey::from_private(group, &private)?)
            }
        }
    }

    /// Builds a key exchange from a raw private key: the 32-byte X25519
    /// scalar (RFC 7748), the big-endian ECP scalar padded to the field
    /// size, or the big-endian MODP exponent. Only for known-answer tests.
    #[cfg(test)]
    pub(crate) fn from_private(group: Group, private: &[u8]) -> Result<KeyExchange, DhError> {
        match group.ec_algorithm() {
            Some(alg) => {
                let key = PrivateKey::from_private_key(alg, private)
                    .map_err(|_| DhError::Crypto(group))?;
                KeyExchange::from_ec_key(group, key)
            }
            None => KeyExchange::from_dh_key(group, modp::DhKey::from_private(group, private)?),
        }
    }

    fn from_ec_key(group: Group, key: PrivateKey) -> Result<KeyExchange, DhError> {
        let public = key
            .compute_public_key()
            .map_err(|_| DhError::Crypto(group))?;
        let bytes = public.as_ref();
        let public = match group {
            Group::Curve25519 => bytes.to_vec(),
            // SEC1 uncompressed encoding 0x04 || x || y; IKE drops the 0x04.
            _ => match bytes.split_first() {
                Some((0x04, xy)) => xy.to_vec(),
                _ => return Err(DhError::Crypto(group)),
            },
        };
        if public.len() != group.public_len() {
            return Err(DhError::Crypto(group));
        }
        Ok(KeyExchange {
            group,
            public,
            secret: Secret::Ec(key),
        })
    }

    fn from_dh_key(group: Group, key: modp::DhKey) -> Result<KeyExchange, DhError> {
        let public = key.public_value(group)?;
        Ok(KeyExchange {
            group,
            public,
            secret: Secret::Modp(key),
        })
    }

    /// The group of this exchange.
    pub fn group(&self) -> Group {
        self.group
    }

    /// Our public value, exactly as it goes into the KE payload's Key
    /// Exchange Data ([`Group::public_len`] bytes).
    pub fn public_value(&self) -> &[u8] {
        &self.public
    }

    /// Computes the shared secret g^ir from the peer's Key Exchange Data
    /// ([`Group::secret_len`] bytes). The private key is kept, so this may
    /// be called again (e.g. for a retransmitted message).
    ///
    /// # Errors
    /// [`DhError::BadPublicLength`] if `peer_public` is not
    /// [`Group::public_len`] bytes, [`DhError::InvalidPublic`] if it is not
    /// an acceptable group element, [`DhError::Crypto`] if the crypto
    /// library fails.
    pub fn agree(&self, peer_public: &[u8]) -> Result<Zeroizing<Vec<u8>>, DhError> {
        let group = self.group;
        if peer_public.len() != group.public_len() {
            return Err(DhError::BadPublicLength {
                group,
                got: peer_public.len(),
            });
        }
        let secret = match &self.secret {
            Secret::Ec(key) => {
                let sec1;
                let encoded: &[u8] = if group == Group::Curve25519 {
                    peer_public
                } else {
                    // Restore the SEC1 uncompressed-point prefix; aws-lc
                    // then checks the point is on the curve.
                    sec1 = [&[0x04][..], peer_public].concat();
                    &sec1
                };
                let peer = UnparsedPublicKey::new(key.algorithm(), encoded);
                let secret = agreement::agree(key, peer, DhError::InvalidPublic(group), |s| {
                    Ok(Zeroizing::new(s.to_vec()))
                })?;
                // RFC 8031 §2: MUST check the result is not all zeros
                // (aws-lc already refuses; this keeps the rule local).
                if group == Group::Curve25519
                    && aws_lc_rs::constant_time::verify_slices_are_equal(&secret, &[0u8; 32])
                        .is_ok()
                {
                    return Err(DhError::InvalidPublic(group));
                }
                secret
            }
            Secret::Modp(key) => key.agree(group, peer_public)?,
        };
        if secret.len() != group.secret_len() {
            return Err(DhError::Crypto(group));
        }
        Ok(secret)
    }
}

/// The MODP groups through aws-lc's `DH` API (aws-lc-rs has no finite-field
/// Diffie-Hellman). Every object is owned by a small RAII wrapper.
#[allow(unsafe_code)]
mod modp {
    use std::os::raw::c_int;
    use std::ptr::{self, NonNull};

    use aws_lc_sys as ffi;
    use zeroize::Zeroizing;

    use super::{DhError, Group};

    /// An owned `BIGNUM`, freed on drop (aws-lc's `OPENSSL_free` cleanses
    /// the limbs).
    struct Bn(NonNull<ffi::BIGNUM>);

    impl Bn {
        /// The big-endian integer `bytes`.
        fn from_be_bytes(bytes: &[u8]) -> Option<Bn> {
            // SAFETY: `bytes` is a valid slice of `bytes.len()` readable
            // bytes; a null `ret` asks aws-lc to allocate a new BIGNUM,
            // which we own (or null on failure).
            let p = unsafe { ffi::BN_bin2bn(bytes.as_ptr(), bytes.len(), ptr::null_mut()) };
            NonNull::new(p).map(Bn)
        }

        /// The small integer `w`.
        fn from_word(w: u8) -> Option<Bn> {
            // SAFETY: BN_new takes no arguments; it returns a new owned
            // BIGNUM or null.
            let bn = Bn(NonNull::new(unsafe { ffi::BN_new() })?);
            // SAFETY: `bn` is a valid BIGNUM we own exclusively.
            if unsafe { ffi::BN_set_word(bn.as_ptr(), w.into()) } != 1 {
                return None;
            }
            Some(bn)
        }

        /// The RFC 3526 prime of a MODP group.
        fn prime(group: Group) -> Option<Bn> {
            // SAFETY: a null `ret` makes aws-lc allocate a new BIGNUM holding
            // the constant prime; we own it (or get null on failure).
            let p = unsafe {
                match group {
                    Group::Modp2048 => ffi::BN_get_rfc3526_prime_2048(ptr::null_mut()),
                    Group::Modp3072 => ffi::BN_get_rfc3526_prime_3072(ptr::null_mut()),
                    _ => ptr::null_mut(),
                }
            };
            NonNull::new(p).map(Bn)
        }

        fn as_ptr(&self) -> *mut ffi::BIGNUM {
            self.0.as_ptr()
        }

        /// Gives up ownership (after aws-lc took it over).
        fn into_raw(self) -> *mut ffi::BIGNUM {
            let p = self.0.as_ptr();
            std::mem::forget(self);
            p
        }
    }

    impl Drop for Bn {
        fn drop(&mut self) {
            // SAFETY: we own this BIGNUM (ownership transfers go through
            // `into_raw`, which skips this drop), so it is freed once.
            unsafe { ffi::BN_free(self.0.as_ptr()) }
        }
    }

    /// An owned aws-lc `DH` with the group parameters and a key pair set.
    pub(super) struct DhKey(NonNull<ffi::DH>);

    // SAFETY: the DH object is reachable only through this wrapper, so
    // moving the wrapper moves exclusive ownership; aws-lc objects are not
    // tied to the creating thread.
    unsafe impl Send for DhKey {}
    // SAFETY: through `&DhKey` we only call DH_get0_pub_key and
    // DH_check_pub_key (const), and DH_compute_key_padded, which aws-lc
    // documents as "does not mutate |dh| for thread-safety purposes and may
    // be used concurrently" (its lazily built Montgomery context is
    // protected by a lock inside the DH).
    unsafe impl Sync for DhKey {}

    impl Drop for DhKey {
        fn drop(&mut self) {
            // SAFETY: we own the only reference to this DH; DH_free releases
            // p, g, the key pair (BN_clear_free) and the Montgomery context.
            unsafe { ffi::DH_free(self.0.as_ptr()) }
        }
    }

    /// Bits of the private exponents we generate: the upper bound of RFC
    /// 3526's estimates of what the group's strength calls for (320 bits
    /// for modp2048, 420 for modp3072; NIST SP 800-56A asks for at least
    /// twice the strength, 224 and 256 bits), not the prime's full length:
    /// a full-length exponent buys no security and costs several times the
    /// time.
    pub(super) fn exponent_bits(group: Group) -> u32 {
        if group == Group::Modp2048 {
            320
        } else {
            420
        }
    }

    impl DhKey {
        /// A DH object with p and g = 2 set, no key pair yet.
        fn with_group(group: Group) -> Result<DhKey, DhError> {
            let err = || DhError::Crypto(group);
            aws_lc_rs::init();
            let p = Bn::prime(group).ok_or_else(err)?;
            let g = Bn::from_word(2).ok_or_else(err)?;
            // SAFETY: DH_new takes no arguments; it returns a new owned DH
            // or null.
            let dh = DhKey(NonNull::new(unsafe { ffi::DH_new() }).ok_or_else(err)?);
            // SAFETY: `dh`, `p` and `g` are valid objects we own; q may be
            // null. On success DH_set0_pqg takes ownership of p and g (so we
            // release them with `into_raw` below); on failure it takes
            // nothing and our wrappers free them.
            if unsafe { ffi::DH_set0_pqg(dh.0.as_ptr(), p.as_ptr(), ptr::null_mut(), g.as_ptr()) }
                != 1
            {
                return Err(err());
            }
            let _ = p.into_raw();
            let _ = g.into_raw();
            // SAFETY: `dh` is a valid DH with p set.
            let size = unsafe { ffi::DH_size(dh.0.as_ptr()) };
            // DH_compute_key_padded writes DH_size bytes: it must match the
            // buffers we allocate.
            if usize::try_from(size) != Ok(group.public_len()) {
                return Err(err());
            }
            Ok(dh)
        }

        /// Uses the big-endian private exponent `x` and computes g^x.
        pub(super) fn from_private(group: Group, x: &[u8]) -> Result<DhKey, DhError> {
            let dh = DhKey::with_group(group)?;
            let x = Bn::from_be_bytes(x).ok_or(DhError::Crypto(group))?;
            // SAFETY: `dh` and `x` are valid objects we own; a null public
            // key leaves that field unset. On success DH_set0_key owns `x`
            // (released below); on failure our wrapper frees it.
            if unsafe { ffi::DH_set0_key(dh.0.as_ptr(), ptr::null_mut(), x.as_ptr()) } != 1 {
                return Err(DhError::Crypto(group));
            }
            let _ = x.into_raw();
            // SAFETY: `dh` is a valid DH with p, g and a private key set;
            // DH_generate_key keeps the private key and computes g^x.
            if unsafe { ffi::DH_generate_key(dh.0.as_ptr()) } != 1 {
                return Err(DhError::Crypto(group));
            }
            Ok(dh)
        }

        /// g^x, big-endian, padded to the prime's length.
        /// Bits of the private exponent (tests).
        #[cfg(test)]
        pub(super) fn private_bits(&self) -> u32 {
            // SAFETY: `self.0` is a valid DH; the returned pointer is
            // borrowed from it (null without a key).
            let x = unsafe { ffi::DH_get0_priv_key(self.0.as_ptr()) };
            if x.is_null() {
                return 0;
            }
            // SAFETY: `x` is a valid BIGNUM owned by `self.0`.
            unsafe { ffi::BN_num_bits(x) }
        }

        pub(super) fn public_value(&self, group: Group) -> Result<Vec<u8>, DhError> {
            // SAFETY: `self.0` is a valid DH; the returned pointer is
            // borrowed from it (or null if no key was generated).
            let y = unsafe { ffi::DH_get0_pub_key(self.0.as_ptr()) };
            if y.is_null() {
                return Err(DhError::Crypto(group));
            }
            let mut out = vec![0u8; group.public_len()];
            // SAFETY: `out` has `out.len()` writable bytes and `y` is a
            // valid BIGNUM owned by the live DH. It returns 0 if y does
            // not fit.
            if unsafe { ffi::BN_bn2bin_padded(out.as_mut_ptr(), out.len(), y) } != 1 {
                return Err(DhError::Crypto(group));
            }
            Ok(out)
        }

        /// y^x mod p for the peer's value y (already of the right length),
        /// big-endian, padded to the prime's length.
        pub(super) fn agree(
            &self,
            group: Group,
            peer: &[u8],
        ) -> Result<Zeroizing<Vec<u8>>, DhError> {
            let y = Bn::from_be_bytes(peer).ok_or(DhError::Crypto(group))?;
            let mut flags: c_int = 0;
            // SAFETY: `self.0` and `y` are valid; `flags` is a valid
            // c_int to write to. The call does not mutate the DH.
            if unsafe { ffi::DH_check_pub_key(self.0.as_ptr(), y.as_ptr(), &mut flags) } != 1 {
                return Err(DhError::Crypto(group));
            }
            // TOO_SMALL: y <= 1; TOO_LARGE: y >= p-1 (RFC 7296 §5,
            // SP 800-56A §5.6.2.3.1). No q is set, so no subgroup check
            // applies (p is a safe prime).
            if flags != 0 {
                return Err(DhError::InvalidPublic(group));
            }
            let mut out = Zeroizing::new(vec![0u8; group.public_len()]);
            // SAFETY: `out` has DH_size bytes (checked in `with_group`), `y`
            // and `self.0` are valid and the DH has a private key.
            // DH_compute_key_padded uses BN_mod_exp_mont_consttime and may
            // be called concurrently on one DH (see `Sync` above).
            let n = unsafe {
                ffi::DH_compute_key_padded(out.as_mut_ptr(), y.as_ptr(), self.0.as_ptr())
            };
            if usize::try_from(n) != Ok(out.len()) {
                return Err(DhError::Crypto(group));
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::tests::{SeededRng, SwitchRng};
    use crate::rng::SystemRng;

    #[test]
    fn generation_draws_from_the_callers_rng_and_fails_closed() {
        for &group in Group::all() {
            // Same seed, same key; another seed, another key.
            let a = KeyExchange::generate(group, &mut SeededRng::new(7)).unwrap();
            let b = KeyExchange::generate(group, &mut SeededRng::new(7)).unwrap();
            let c = KeyExchange::generate(group, &mut SeededRng::new(8)).unwrap();
            assert_eq!(a.public_value(), b.public_value(), "{group}");
            assert_ne!(a.public_value(), c.public_value(), "{group}");
            assert_eq!(
                a.agree(c.public_value()).unwrap(),
                c.agree(a.public_value()).unwrap(),
                "{group}"
            );
            // A failing generator gives no key at all.
            let (mut r, fail) = SwitchRng::new(1);
            fail.store(true, std::sync::atomic::Ordering::SeqCst);
            let e = KeyExchange::generate(group, &mut r).unwrap_err();
            assert_eq!(e, DhError::Random(group, RngError), "{group}");
            assert!(e.to_string().contains("random number generator"), "{e}");
        }
    }

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).expect("test vector hex")
    }

    fn both_ways(group: Group, i: &[u8], gi: &[u8], r: &[u8], gr: &[u8], gir: &[u8]) {
        let ki = KeyExchange::from_private(group, i).unwrap();
        let kr = KeyExchange::from_private(group, r).unwrap();
        assert_eq!(ki.group(), group);
        assert_eq!(ki.public_value(), gi, "{group} g^i");
        assert_eq!(kr.public_value(), gr, "{group} g^r");
        assert_eq!(&ki.agree(gr).unwrap()[..], gir, "{group} initiator g^ir");
        assert_eq!(&kr.agree(gi).unwrap()[..], gir, "{group} responder g^ir");
        // The private key survives an agreement: same answer again.
        assert_eq!(&ki.agree(gr).unwrap()[..], gir, "{group} second agree");
    }

    #[test]
    fn modp_private_exponents_are_short_but_not_too_short() {
        for (g, max) in [(Group::Modp2048, 320), (Group::Modp3072, 420)] {
            let mut bits = Vec::new();
            for _ in 0..8 {
                let k = KeyExchange::generate(g, &mut SystemRng).unwrap();
                let Secret::Modp(d) = &k.secret else {
                    panic!("not MODP")
                };
                bits.push(d.private_bits());
            }
            // At most the chosen length, and (all 8 below 224 bits has
            // probability 2^-800) at least NIST's 2 x strength.
            assert!(bits.iter().all(|b| *b <= max), "{g:?}: {bits:?}");
            assert!(bits.iter().any(|b| *b > max - 8), "{g:?}: {bits:?}");
        }
    }

    #[test]
    fn group_ids_names_and_lengths() {
        let table = [
            (Group::Curve25519, 31, "x25519", 32, 32),
            (Group::Ecp256, 19, "ecp256", 64, 32),
            (Group::Ecp384, 20, "ecp384", 96, 48),
            (Group::Modp2048, 14, "modp2048", 256, 256),
            (Group::Modp3072, 15, "modp3072", 384, 384),
        ];
        assert_eq!(Group::all().len(), table.len());
        for (g, id, name, public_len, secret_len) in table {
            assert!(Group::all().contains(&g));
            assert_eq!(g.id(), id);
            assert_eq!(Group::from_id(id), Some(g));
            assert_eq!(g.name(), name);
            assert_eq!(g.to_string(), name);
            assert_eq!(Group::from_name(name), Some(g));
            assert_eq!(Group::from_name(&name.to_ascii_uppercase()), Some(g));
            assert_eq!(g.public_len(), public_len);
            assert_eq!(g.secret_len(), secret_len);
        }
        assert_eq!(Group::from_name("curve25519"), Some(Group::Curve25519));
        assert_eq!(Group::from_name("Curve25519"), Some(Group::Curve25519));
        for unknown in ["", "modp1024", "ecp521", "x448", "x25519 ", "ecp"] {
            assert_eq!(Group::from_name(unknown), None, "{unknown:?}");
        }
        for unknown in [0u16, 1, 2, 5, 16, 21, 32, 0xffff] {
            assert_eq!(Group::from_id(unknown), None, "{unknown}");
        }
    }

    #[test]
    fn every_group_agrees_with_itself() {
        for &group in Group::all() {
            let a = KeyExchange::generate(group, &mut SystemRng).unwrap();
            let b = KeyExchange::generate(group, &mut SystemRng).unwrap();
            assert_eq!(a.group(), group);
            assert_eq!(a.public_value().len(), group.public_len(), "{group}");
            assert_eq!(b.public_value().len(), group.public_len(), "{group}");
            assert_ne!(a.public_value(), b.public_value(), "{group} fresh keys");
            let sa = a.agree(b.public_value()).unwrap();
            let sb = b.agree(a.public_value()).unwrap();
            assert_eq!(sa.len(), group.secret_len(), "{group}");
            assert_eq!(sa, sb, "{group}");
            assert!(sa.iter().any(|&x| x != 0), "{group}");
            // Against a third party the secret differs.
            let c = KeyExchange::generate(group, &mut SystemRng).unwrap();
            assert_ne!(a.agree(c.public_value()).unwrap(), sa, "{group}");
        }
    }

    #[test]
    fn debug_shows_only_the_group() {
        let k = KeyExchange::from_private(Group::Curve25519, &h(X25519_A)).unwrap();
        assert_eq!(format!("{k:?}"), "KeyExchange { group: Curve25519, .. }");
        let k = KeyExchange::generate(Group::Modp2048, &mut SystemRng).unwrap();
        assert_eq!(format!("{k:?}"), "KeyExchange { group: Modp2048, .. }");
    }

    #[test]
    fn key_exchange_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<KeyExchange>();
        check::<DhError>();
    }

    // RFC 7748 §6.1.
    const X25519_A: &str = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a";
    const X25519_GA: &str = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a";
    const X25519_B: &str = "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb";
    const X25519_GB: &str = "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f";
    const X25519_K: &str = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742";

    #[test]
    fn x25519_rfc7748_vectors() {
        both_ways(
            Group::Curve25519,
            &h(X25519_A),
            &h(X25519_GA),
            &h(X25519_B),
            &h(X25519_GB),
            &h(X25519_K),
        );
    }

    // RFC 5903 §8.1 (256-bit random ECP group). KE data is gx || gy.
    const ECP256_I: &str = "C88F01F510D9AC3F70A292DAA2316DE544E9AAB8AFE84049C62A9C57862D1433";
    const ECP256_GI: &str = concat!(
        "DAD0B65394221CF9B051E1FECA5787D098DFE637FC90B9EF945D0C3772581180",
        "5271A0461CDB8252D61F1C456FA3E59AB1F45B33ACCF5F58389E0577B8990BB3",
    );
    const ECP256_R: &str = "C6EF9C5D78AE012A011164ACB397CE2088685D8F06BF9BE0B283AB46476BEE53";
    const ECP256_GR: &str = concat!(
        "D12DFB5289C8D4F81208B70270398C342296970A0BCCB74C736FC7554494BF63",
        "56FBF3CA366CC23E8157854C13C58D6AAC23F046ADA30F8353E74F33039872AB",
    );
    const ECP256_GIR: &str = "D6840F6B42F6EDAFD13116E0E12565202FEF8E9ECE7DCE03812464D04B9442DE";

    #[test]
    fn ecp256_rfc5903_vectors() {
        both_ways(
            Group::Ecp256,
            &h(ECP256_I),
            &h(ECP256_GI),
            &h(ECP256_R),
            &h(ECP256_GR),
            &h(ECP256_GIR),
        );
    }

    // RFC 5903 §8.2 (384-bit random ECP group).
    const ECP384_I: &str = concat!(
        "099F3C7034D4A2C699884D73A375A67F7624EF7C6B3C0F16",
        "0647B67414DCE655E35B538041E649EE3FAEF896783AB194",
    );
    const ECP384_GI: &str = concat!(
        "667842D7D180AC2CDE6F74F37551F55755C7645C20EF73E3",
        "1634FE72B4C55EE6DE3AC808ACB4BDB4C88732AEE95F41AA",
        "9482ED1FC0EEB9CAFC4984625CCFC23F65032149E0E144AD",
        "A024181535A0F38EEB9FCFF3C2C947DAE69B4C634573A81C",
    );
    const ECP384_R: &str = concat!(
        "41CB0779B4BDB85D47846725FBEC3C9430FAB46CC8DC5060",
        "855CC9BDA0AA2942E0308312916B8ED2960E4BD55A7448FC",
    );
    const ECP384_GR: &str = concat!(
        "E558DBEF53EECDE3D3FCCFC1AEA08A89A987475D12FD950D",
        "83CFA41732BC509D0D1AC43A0336DEF96FDA41D0774A3571",
        "DCFBEC7AACF3196472169E838430367F66EEBE3C6E70C416",
        "DD5F0C68759DD1FFF83FA40142209DFF5EAAD96DB9E6386C",
    );
    const ECP384_GIR: &str = concat!(
        "11187331C279962D93D604243FD592CB9D0A926F422E4718",
        "7521287E7156C5C4D603135569B9E9D09CF5D4A270F59746",
    );

    #[test]
    fn ecp384_rfc5903_vectors() {
        both_ways(
            Group::Ecp384,
            &h(ECP384_I),
            &h(ECP384_GI),
            &h(ECP384_R),
            &h(ECP384_GR),
            &h(ECP384_GIR),
        );
    }

    // MODP known answers. P2048/P3072 are the RFC 3526 §3/§4 primes; they
    // were recomputed from the RFCs' formulas (2^2048 - 2^1984 - 1 +
    // 2^64 * (floor(2^1918 pi) + 124476), and 2^3072 - 2^3008 - 1 +
    // 2^64 * (floor(2^2942 pi) + 1690314), pi by Machin's formula in
    // Python integers; both pass Fermat tests as safe primes) and match
    // the hex printed in the RFC. The exponents are SHA-512 outputs and the
    // rest Python's built-in pow, for N in 2048 and 3072:
    //   python3 -c 'import hashlib; p=int(PN,16); x=lambda t:
    //     int.from_bytes(hashlib.sha512(t).digest(),"big");
    //     i=x(b"espgate modpN i"); r=x(b"espgate modpN r");
    //     print(pow(2,i,p), pow(2,r,p), pow(pow(2,r,p),i,p))'
    // (each printed as big-endian hex padded to the prime's length).
    const P2048: &str = concat!(
        "ffffffffffffffffc90fdaa22168c234c4c6628b80dc1cd129024e088a67cc74",
        "020bbea63b139b22514a08798e3404ddef9519b3cd3a431b302b0a6df25f1437",
        "4fe1356d6d51c245e485b576625e7ec6f44c42e9a637ed6b0bff5cb6f406b7ed",
        "ee386bfb5a899fa5ae9f24117c4b1fe649286651ece45b3dc2007cb8a163bf05",
        "98da48361c55d39a69163fa8fd24cf5f83655d23dca3ad961c62f356208552bb",
        "9ed529077096966d670c354e4abc9804f1746c08ca18217c32905e462e36ce3b",
        "e39e772c180e86039b2783a2ec07a28fb5c55df06f4c52c9de2bcbf695581718",
        "3995497cea956ae515d2261898fa051015728e5a8aacaa68ffffffffffffffff",
    );
    const M2048_I: &str = concat!(
        "e984870216467abe4b94a3caa9664e887a9ebb96c4451252537d4a82514a0520",
        "0b1841f52d98eb6aa6e2437a9f64966d17c20c1f9316d1eab1fb5940a848a8fd",
    );
    const M2048_GI: &str = concat!(
        "b08f62c09c9b3774c072d9480e5c459150ae22f0fd78d61a8857defa4b27504b",
        "f56f786ad96fa83ae4873a87ab052cedb8b7f2152461066867e5116d87cb9b2e",
        "88eb6b738d0990264648966087dee8a5f2c7925c618b533f6ba343dfee23a666",
        "9e0de5bf5e4912ec9fefc813eca717e01afca570025a6b648bc883ac947c9295",
        "26e03d23cace5c8249c17a5dbab94120b417a6495baa48d222ee26b04e0320a5",
        "ff01f45d0e2699a0723c02e769a59f3a3699438ad032544891fd3671ac03e8b6",
        "2f5987787ed5ebca23177e560305bcf10e7a38f54a6517402f9b150b99fe1fe8",
        "a510b31947dc469dc65443f8164cc01c73f37d5675fdcb64c376ecbd4e855311",
    );
    const M2048_R: &str = concat!(
        "b0dfc82aefc792d0b626479e4a2d7c02bccf19b74306bbd40c2d3cd96d201a01",
        "b226a18c737370acb1e2473615fd77cef6b4460c783806a85ee3f45164f20a40",
    );
    const M2048_GR: &str = concat!(
        "94e3d60f99ee93779fe9e3f842c0d66a675eb6fe16ccd4d48f270442acb08236",
        "bca35f725315c9b34d589d8f918807212a41a03e4f9d19aec62f9a4844a920da",
        "46a2f208204c38886b92783bc27a3cbfc7cf7025d9b9a9539d5433208280ca68",
        "2a419c48bc4a4aea004088f54e044c30398e071ddcc9e30bd93aa82a6a451a00",
        "61cd09aee54075d0127dc6fcd5b7816439eb40c2584ce28346c5e7391b7f0c9f",
        "60668c1dd674c61e86dce36efdafff76f16d9a417c7bec9cf44b963d919dd44a",
        "f450fdd731a4cf333155d5249c58304a7bc3b692e1a05fe6534967f6419caf65",
        "ac295a0061851fc2ee93fd4e0be473add5ff0cb965d08b6940e917a0a6a13ee7",
    );
    const M2048_GIR: &str = concat!(
        "90d0ffb96bd5770a81e9f695e56cbd29ae23aa066ccb43bb19a1bf1ef64502da",
        "aaf92d9f47420b688582e8e474ead9925a24e985d3c0b2bb1d911caa5a376de1",
        "3ab4272ef1e79927e16fd1209bdc336f2b9f0ce23b3b862bca6c5843c81260aa",
        "72b88c6c030124a5a729a4662c5a91389b6221dc579650b8b85cf21c45ee4636",
        "b16d89f301bda49c7f4118c4f929b96500667d143202b27b10f1bbd1dc18c626",
        "c10fa25f1b751f7a5e6e942ca9203aa62e9b0135aae74fbfa2840c5055edc198",
        "1caf92493c50ed2351a56497558a1727fecd1f63dfd32c903a2679171c67aefa",
        "de9f7d3ce3bb99259b2e8e0deb2a20477bcef67f6518c82a654ae77f92ee3733",
    );
    const P3072: &str = concat!(
        "ffffffffffffffffc90fdaa22168c234c4c6628b80dc1cd129024e088a67cc74",
        "020bbea63b139b22514a08798e3404ddef9519b3cd3a431b302b0a6df25f1437",
        "4fe1356d6d51c245e485b576625e7ec6f44c42e9a637ed6b0bff5cb6f406b7ed",
        "ee386bfb5a899fa5ae9f24117c4b1fe649286651ece45b3dc2007cb8a163bf05",
        "98da48361c55d39a69163fa8fd24cf5f83655d23dca3ad961c62f356208552bb",
        "9ed529077096966d670c354e4abc9804f1746c08ca18217c32905e462e36ce3b",
        "e39e772c180e86039b2783a2ec07a28fb5c55df06f4c52c9de2bcbf695581718",
        "3995497cea956ae515d2261898fa051015728e5a8aaac42dad33170d04507a33",
        "a85521abdf1cba64ecfb850458dbef0a8aea71575d060c7db3970f85a6e1e4c7",
        "abf5ae8cdb0933d71e8c94e04a25619dcee3d2261ad2ee6bf12ffa06d98a0864",
        "d87602733ec86a64521f2b18177b200cbbe117577a615d6c770988c0bad946e2",
        "08e24fa074e5ab3143db5bfce0fd108e4b82d120a93ad2caffffffffffffffff",
    );
    const M3072_I: &str = concat!(
        "8e90e843b2542e2bc0915755599f112071b4033c33d6e34da4aad2560fe60d08",
        "083db37c5dbb651b659ee580e1d88a0b0fa8109857a46e97dcbbc0bbb4f08c85",
    );
    const M3072_GI: &str = concat!(
        "5d2840bea6250bcc36bb76b7a993c6c0383bfe92da1ccc487b87f62d39950491",
        "775ae937043418fc92c5670be455e47960886dbf17cc20423a5e2a5344c6a70c",
        "b185b4aa73230bec15d25f2ea11418f4f0a7e46b376e3d1a29e647c84ab82b45",
        "caff7769595ae880966c5e2c851aef86b0862e62d7e7c19525aec1c64eb988e4",
        "bdbcf0a2bf5ad7ecf05bf80fc1788842f3f9c298d5c711e478576d85fb061896",
        "315ff9e0ddc4d26be5c289eb79c433c197eb871049f6248c7b811b77fbcea2fb",
        "b72fdfdd5ab51921aee07853dae0f8eeccf5fe7971f53281eaaf74f05e0a4480",
        "563cd3c56ab3cc4c2457806784092e8e04e70e2d2ab9aa1e58b984ec1777ec8b",
        "f4a5bbde1f3a5242238d2f93f4922c08ab44ee94d295bcd1596205654d14b455",
        "428499e0563be20d2b60b393851b6f9f0872dce10ee9877543047245098d5797",
        "5e6d17af974f21e4c367cad188165132f0f4459c2a67a0bee40ac426079b2410",
        "5f93c3193dc978b15970cf2da39f11f6dcf199eeefa855ac559d690d6da78ba2",
    );
    const M3072_R: &str = concat!(
        "c5288c6f718709e33cb3859f841a870d06a04798b875bf509dec4504c76a58ed",
        "0ab8155bb71b12b57e264f8a121881b61a4acc73f8ae1da12cc80fcc8f59f3f4",
    );
    const M3072_GR: &str = concat!(
        "3134eb9dd225e0d953f3dbff14900bffcb540365106a195aaa1b3240caefbfe5",
        "ee9d5d2c748611a16029c498697aad990cef76b8a5ab69bbf3b465cbdb47367e",
        "4ae5c35593309a95e3fa8fe862800df3f4edbba099a4e45d7b57fab412084def",
        "7c56f437e1f0b109adcfef46de248ad1bc2f727fc99ff3ba093204c8478acbdb",
        "9dffd2426180e130bace65a0b4b73b7f2ec81e4ef455d7eb4e37ee99cabd3c34",
        "e1d7389c3156baf09070f359c495f8e3b6b2afe24cc752af10bf67ff24cbe71d",
        "dd5c1fa91fc960bccf51c733b28ad716934f74d3143182607776a49305faaffa",
        "6c3be96d48d05222e3f608ada04a21a986cb0c4eceb9fd32eb969bd95b413c7a",
        "9a7d6f49c6fdbc3f938ac62ad4603e200948b980802bdd48ddca4b8ea1f907c2",
        "d4d14dd19bedd9bccc74b192b8ee8b88a8eff7ebea75bc1c3df351664ccf4fcd",
        "cd1717a6b6e90f01a2afe71e125e2780bb7077411bb101aa1d06439943752bd4",
        "26aec660ddeb69c1e32363fcba9aac3bb21e2a05c9534d7859b8a66e7696244b",
    );
    const M3072_GIR: &str = concat!(
        "f8ca84ab7c179b4d53e4a27e0dabe84abb2280775050184525a00357bbeead4b",
        "e9f422fa9c4328573c1f43661e5d46812fb1e6f41e21731f8997bf9bb3ba5be0",
        "d9ea6d69f9f029f2ed857a373f1ca97a39f568d775baa4f642fefca3310b977a",
        "605b29c3d5565c71299086830e8e231a50b8cfa334c3e2c911baadf1263e8794",
        "491b0d1788128f9ca0bd8d3c4cf2c47144462f01f784a4653b386c11d68fbabf",
        "34b53e1fd5713d3da6b1475289f14fa74a76e2ca34a001e65dc14d37417da0f7",
        "43b029ba17735c956d11eb28a045fa29c303c1f802f6cae49a529544086ed025",
        "d24870c908a08b94224650e1ae9dd2f96eb46461609876582d703719126579a5",
        "985c1b1d4682041aea36ce38e3ec73f341e4f8d21e69ca473ab25de3b66e4e2a",
        "503d53885e5e146c2c2fcdff13b4d23fbf58befb7c67b207fe8f5ca14c2440cb",
        "ab6a92fbccca758354601fa758f3e36cd2b46910c33e312fa635ca7a35b337d9",
        "8e4a66171fa789f7b42da4c81dd3ef89d4dda6ec658f5604b6b5686f61f5199b",
    );

    #[test]
    fn modp2048_python_pow_vectors() {
        both_ways(
            Group::Modp2048,
            &h(M2048_I),
            &h(M2048_GI),
            &h(M2048_R),
            &h(M2048_GR),
            &h(M2048_GIR),
        );
    }

    #[test]
    fn modp3072_python_pow_vectors() {
        both_ways(
            Group::Modp3072,
            &h(M3072_I),
            &h(M3072_GI),
            &h(M3072_R),
            &h(M3072_GR),
            &h(M3072_GIR),
        );
    }

    #[test]
    fn wrong_length_is_rejected() {
        for &group in Group::all() {
            let k = KeyExchange::generate(group, &mut SystemRng).unwrap();
            let good = KeyExchange::generate(group, &mut SystemRng)
                .unwrap()
                .public_value()
                .to_vec();
            let n = group.public_len();
            let mut long = good.clone();
            long.push(0);
            // ECP with the SEC1 0x04 prefix still on is one byte too long.
            let sec1 = [&[0x04][..], &good].concat();
            for bad in [
                &[][..],
                &good[..n - 1],
                &long[..],
                &sec1[..],
                &good[..n / 2],
            ] {
                assert_eq!(
                    k.agree(bad),
                    Err(DhError::BadPublicLength {
                        group,
                        got: bad.len()
                    }),
                    "{group} {}",
                    bad.len()
                );
            }
        }
        let err = DhError::BadPublicLength {
            group: Group::Ecp256,
            got: 65,
        };
        assert_eq!(
            err.to_string(),
            "ecp256 key exchange data is 65 bytes, expected 64"
        );
    }

    /// `n` as a big-endian integer of `len` bytes.
    fn small(n: u8, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        v[len - 1] = n;
        v
    }

    /// The big-endian hex number `p` plus `delta` (|delta| small), padded.
    fn offset(p: &[u8], delta: i16) -> Vec<u8> {
        let mut v = p.to_vec();
        let mut carry = i32::from(delta);
        for b in v.iter_mut().rev() {
            let x = i32::from(*b) + carry;
            *b = x.rem_euclid(256) as u8;
            carry = x.div_euclid(256);
        }
        v
    }

    #[test]
    fn modp_out_of_range_values_are_rejected() {
        for (group, p) in [(Group::Modp2048, h(P2048)), (Group::Modp3072, h(P3072))] {
            let n = group.public_len();
            assert_eq!(p.len(), n);
            let k = KeyExchange::generate(group, &mut SystemRng).unwrap();
            let too_big = vec![0xffu8; n];
            let bad = [
                ("0", small(0, n)),
                ("1", small(1, n)),
                ("p-1", offset(&p, -1)),
                ("p", p.clone()),
                ("p+1", offset(&p, 1)),
                ("2^bits-1", too_big),
            ];
            for (what, y) in bad {
                assert_eq!(
                    k.agree(&y),
                    Err(DhError::InvalidPublic(group)),
                    "{group} y = {what}"
                );
            }
            // The edges just inside the range are accepted: 2 and p-2.
            let x = KeyExchange::from_private(group, &[3]).unwrap();
            assert_eq!(x.public_value(), &small(8, n)[..]);
            assert_eq!(&x.agree(&small(2, n)).unwrap()[..], &small(8, n)[..]);
            // (p-2)^3 = (-2)^3 = p-8 mod p.
            assert_eq!(&x.agree(&offset(&p, -2)).unwrap()[..], &offset(&p, -8)[..]);
        }
    }

    #[test]
    fn ecp_point_not_on_curve_is_rejected() {
        for (group, gr) in [(Group::Ecp256, h(ECP256_GR)), (Group::Ecp384, h(ECP384_GR))] {
            let k = KeyExchange::generate(group, &mut SystemRng).unwrap();
            assert!(k.agree(&gr).is_ok());
            let n = group.public_len();
            let mut flipped_y = gr.clone();
            flipped_y[n - 1] ^= 1;
            let mut flipped_x = gr.clone();
            flipped_x[0] ^= 0x80;
            // (0, 0) is not on either curve (b != 0); all-ones coordinates
            // are not even field elements (>= p).
            for (what, point) in [
                ("y+-1", flipped_y),
                ("x changed", flipped_x),
                ("(0,0)", vec![0u8; n]),
                ("(2^k-1,2^k-1)", vec![0xffu8; n]),
            ] {
                assert_eq!(
                    k.agree(&point),
                    Err(DhError::InvalidPublic(group)),
                    "{group} {what}"
                );
            }
        }
    }

    #[test]
    fn x25519_low_order_points_are_rejected() {
        let k = KeyExchange::from_private(Group::Curve25519, &h(X25519_A)).unwrap();
        // u = 0 and u = 1 are points of order 2 and 4; u = p and u = p+1
        // are their non-canonical encodings (RFC 7748 §5 reduces mod p).
        // Every clamped scalar is a multiple of 8, so the result is 0.
        let mut p = [0xffu8; 32];
        p[0] = 0xed;
        p[31] = 0x7f;
        let mut p_plus_1 = p;
        p_plus_1[0] = 0xee;
        let mut one = [0u8; 32];
        one[0] = 1;
        for u in [[0u8; 32], one, p, p_plus_1] {
            assert_eq!(
                k.agree(&u),
                Err(DhError::InvalidPublic(Group::Curve25519)),
                "u = {}",
                hex::encode(u)
            );
        }
        // A good point still works afterwards.
        assert_eq!(&k.agree(&h(X25519_GB)).unwrap()[..], &h(X25519_K)[..]);
    }
}
