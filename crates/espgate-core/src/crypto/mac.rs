//! Integrity algorithms over scattered input: HMAC (aws-lc-rs; MD5 via
//! RustCrypto, which aws-lc-rs does not offer) and AES-XCBC-MAC-96.

use super::suite::{Integ, SuiteError};
use ::hmac::{KeyInit, Mac as _};
use aws_lc_rs::cipher::{EncryptingKey, EncryptionContext, UnboundCipherKey, AES_128};
use aws_lc_rs::{constant_time, hmac};
use zeroize::Zeroizing;

type HmacMd5 = ::hmac::Hmac<md5::Md5>;

/// A keyed integrity algorithm producing a truncated ICV.
pub struct Mac {
    kind: MacKind,
    icv_len: usize,
}

enum MacKind {
    Hmac(Box<hmac::Key>),
    Md5(Box<HmacMd5>),
    Xcbc(Box<Xcbc>),
}

/// RFC 3566 state: K1 as an AES key, K2 and K3 as XOR masks.
struct Xcbc {
    k1: EncryptingKey,
    k2: Zeroizing<[u8; 16]>,
    k3: Zeroizing<[u8; 16]>,
}

/// Longest untruncated tag we produce (SHA-512).
pub const MAX_TAG: usize = 64;

impl Mac {
    /// Keys the algorithm. The key length must match.
    pub fn new(integ: Integ, key: &[u8]) -> Result<Mac, SuiteError> {
        if key.len() != integ.key_len() {
            return Err(SuiteError::KeyLength {
                which: "integrity",
                expected: integ.key_len(),
                got: key.len(),
            });
        }
        let kind = match integ {
            Integ::Sha1 => MacKind::Hmac(Box::new(hmac::Key::new(
                hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
                key,
            ))),
            Integ::Sha256 => MacKind::Hmac(Box::new(hmac::Key::new(hmac::HMAC_SHA256, key))),
            Integ::Sha384 => MacKind::Hmac(Box::new(hmac::Key::new(hmac::HMAC_SHA384, key))),
            Integ::Sha512 => MacKind::Hmac(Box::new(hmac::Key::new(hmac::HMAC_SHA512, key))),
            Integ::Md5 => MacKind::Md5(Box::new(
                HmacMd5::new_from_slice(key).map_err(|_| SuiteError::BadKey("HMAC-MD5"))?,
            )),
            Integ::AesXcbc => MacKind::Xcbc(Box::new(Xcbc::new(key)?)),
        };
        Ok(Mac {
            kind,
            icv_len: integ.icv_len(),
        })
    }

    /// Truncated ICV length.
    pub fn icv_len(&self) -> usize {
        self.icv_len
    }

    /// Computes the MAC over the concatenation of `parts` into `out`
    /// (`out.len()` must be the ICV length).
    pub fn compute(&self, parts: &[&[u8]], out: &mut [u8]) {
        let mut tag = [0u8; MAX_TAG];
        self.full_tag(parts, &mut tag);
        let n = out.len().min(self.icv_len);
        out[..n].copy_from_slice(&tag[..n]);
    }

    /// Verifies `icv` in constant time.
    pub fn verify(&self, parts: &[&[u8]], icv: &[u8]) -> bool {
        let mut tag = [0u8; MAX_TAG];
        self.full_tag(parts, &mut tag);
        icv.len() == self.icv_len
            && constant_time::verify_slices_are_equal(&tag[..self.icv_len], icv).is_ok()
    }

    fn full_tag(&self, parts: &[&[u8]], out: &mut [u8; MAX_TAG]) {
        match &self.kind {
            MacKind::Hmac(key) => {
                let mut ctx = hmac::Context::with_key(key);
                for p in parts {
                    ctx.update(p);
                }
                let t = ctx.sign();
                out[..t.as_ref().len()].copy_from_slice(t.as_ref());
            }
            MacKind::Md5(keyed) => {
                let mut m = (**keyed).clone();
                for p in parts {
                    m.update(p);
                }
                let t = m.finalize().into_bytes();
                out[..t.len()].copy_from_slice(&t);
            }
            MacKind::Xcbc(x) => {
                let t = x.mac(parts);
                out[..16].copy_from_slice(&t);
            }
        }
    }
}

impl Xcbc {
    fn new(key: &[u8]) -> Result<Xcbc, SuiteError> {
        let bad = |_| SuiteError::BadKey("AES-XCBC");
        let k =
            EncryptingKey::ecb(UnboundCipherKey::new(&AES_128, key).map_err(bad)?).map_err(bad)?;
        let derive = |byte: u8| -> Result<Zeroizing<[u8; 16]>, SuiteError> {
            let mut b = Zeroizing::new([byte; 16]);
            k.less_safe_encrypt(&mut b[..], EncryptionContext::None)
                .map_err(bad)?;
            Ok(b)
        };
        let k1 = derive(1)?;
        let k1 = EncryptingKey::ecb(UnboundCipherKey::new(&AES_128, &k1[..]).map_err(bad)?)
            .map_err(bad)?;
        Ok(Xcbc {
            k1,
            k2: derive(2)?,
            k3: derive(3)?,
        })
    }

    fn block(&self, b: &mut [u8; 16]) {
        // ECB on exactly one block cannot fail.
        let _ = self
            .k1
            .less_safe_encrypt(&mut b[..], EncryptionContext::None);
    }

    /// RFC 3566 §4: CBC-MAC with K1, the last block masked with K2 (full) or
    /// padded with 0x80 0.. and masked with K3.
    fn mac(&self, parts: &[&[u8]]) -> [u8; 16] {
        let mut e = [0u8; 16];
        let mut buf = [0u8; 16];
        let mut fill = 0usize;
        for part in parts {
            for &byte in *part {
                if fill == 16 {
                    // More data follows: this full block is not the last one.
                    for i in 0..16 {
                        e[i] ^= buf[i];
                    }
                    self.block(&mut e);
                    fill = 0;
                }
                buf[fill] = byte;
                fill += 1;
            }
        }
        let mask: &[u8; 16] = if fill == 16 {
            &self.k2
        } else {
            buf[fill] = 0x80;
            buf[fill + 1..].fill(0);
            &self.k3
        };
        for i in 0..16 {
            e[i] ^= buf[i] ^ mask[i];
        }
        self.block(&mut e);
        e
    }
}
