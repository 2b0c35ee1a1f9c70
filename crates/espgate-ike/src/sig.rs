//! Signature authentication for IKEv2: private and public keys, the RFC 7427
//! "Digital Signature" AUTH method (14), the legacy ECDSA methods of RFC 4754
//! (9 and 10) and the SIGNATURE_HASH_ALGORITHMS notify.
//!
//! An RFC 7427 AUTH payload carries, after the method byte and reserved
//! bytes the caller handles, this *authentication data*:
//!
//! ```text
//! +--------+---------------------------------+-----------------------+
//! | len(1) | ASN.1 AlgorithmIdentifier (DER) | signature             |
//! +--------+---------------------------------+-----------------------+
//! ```
//!
//! [`PrivateKey::sign_auth`] builds it over the caller's *signed octets*
//! (RFC 7296 §2.15: the peer's first message, its nonce and
//! `prf(SK_p, ID')`), and [`PublicKey::verify_auth`] checks it, refusing any
//! algorithm that does not fit the key or is not on the allow-list below.
//! SHA-1 is never accepted.
//!
//! | key       | schemes signed                       | schemes verified                 |
//! |-----------|--------------------------------------|----------------------------------|
//! | Ed25519   | Ed25519 (RFC 8420)                   | Ed25519                          |
//! | P-256     | ecdsa-with-SHA256                    | ecdsa-with-SHA256/384/512        |
//! | P-384     | ecdsa-with-SHA384                    | ecdsa-with-SHA256/384/512        |
//! | RSA ≥2048 | RSASSA-PSS SHA-256/384/512 (default PSS SHA-256), PKCS#1 v1.5 SHA-256/384/512 | same, PSS with any salt length |
//!
//! All cryptography is aws-lc-rs. Nothing here does I/O: keys come in as
//! bytes (PEM or DER) and randomness comes from aws-lc-rs's system RNG.
//! PEM sections are read by rustls-pki-types, the SubjectPublicKeyInfo
//! structure is checked by webpki, and keys are parsed and checked by
//! aws-lc-rs's own PKCS#8, SEC1, PKCS#1 and SPKI parsers. The only DER
//! read here by hand is the AlgorithmIdentifier of a PKCS#8 key or an SPKI
//! (no crate API names a key's algorithm; we need it to pick the parser and
//! to name an algorithm we do not support) and RFC 7427's AUTH data.

use core::fmt;

use aws_lc_rs::encoding::{AsDer, Pkcs8V1Der, PublicKeyX509Der};
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    self as lc, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _, ParsedPublicKey, RsaKeyPair,
    RsaPssSaltLength, RsaPublicKeyComponents, UnparsedPublicKey,
};
use rustls_pki_types::pem::{self as pki_pem, PemObject};
use rustls_pki_types::{alg_id, PrivateKeyDer, SubjectPublicKeyInfoDer};
use zeroize::Zeroizing;

/// Hash algorithm number SHA1 (RFC 7427 §7); never accepted for signatures.
pub const HASH_SHA1: u16 = 1;
/// Hash algorithm number SHA2-256 (RFC 7427 §7).
pub const HASH_SHA2_256: u16 = 2;
/// Hash algorithm number SHA2-384 (RFC 7427 §7).
pub const HASH_SHA2_384: u16 = 3;
/// Hash algorithm number SHA2-512 (RFC 7427 §7).
pub const HASH_SHA2_512: u16 = 4;
/// Hash algorithm number Identity (RFC 8420 §2), used by Ed25519.
pub const HASH_IDENTITY: u16 = 5;

/// AUTH method 1: RSA Digital Signature (PKCS#1 v1.5 with SHA-1; refused).
pub const AUTH_METHOD_RSA_SIG: u8 = 1;
/// AUTH method 9: ECDSA with SHA-256 on the P-256 curve (RFC 4754).
pub const AUTH_METHOD_ECDSA_P256: u8 = 9;
/// AUTH method 10: ECDSA with SHA-384 on the P-384 curve (RFC 4754).
pub const AUTH_METHOD_ECDSA_P384: u8 = 10;
/// AUTH method 14: Digital Signature (RFC 7427).
pub const AUTH_METHOD_DIGITAL_SIGNATURE: u8 = 14;

/// Errors from key handling, signing and signature verification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigError {
    /// The PEM text could not be read.
    #[error("PEM: {0}")]
    Pem(&'static str),
    /// A DER structure (key, AlgorithmIdentifier, AUTH data) is malformed.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// The key's algorithm (given as a dotted OID or a name) is not supported.
    #[error("unsupported key type: {0}")]
    UnsupportedKey(String),
    /// aws-lc-rs rejected the key material.
    #[error("key rejected: {0}")]
    InvalidKey(&'static str),
    /// The signature algorithm (given as a dotted OID or a name) is not on the allow-list.
    #[error("signature algorithm not accepted: {0}")]
    UnsupportedAlgorithm(String),
    /// The signature algorithm does not fit the key.
    #[error("signature scheme {scheme} does not fit a {key} key")]
    AlgorithmMismatch {
        /// The scheme that was asked for or received.
        scheme: SigScheme,
        /// The kind of the key at hand.
        key: KeyKind,
    },
    /// The signature does not verify.
    #[error("signature verification failed")]
    BadSignature,
    /// The AUTH method is not supported by [`PublicKey::verify_legacy`].
    #[error("authentication method {method} not supported: {reason}")]
    UnsupportedMethod {
        /// The AUTH method number.
        method: u8,
        /// Why it is not supported.
        reason: &'static str,
    },
    /// An aws-lc-rs operation (random numbers, signing, encoding) failed.
    #[error("cryptographic operation failed: {0}")]
    Crypto(&'static str),
}

/// The kind of an asymmetric key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// Ed25519 (RFC 8032, RFC 8420).
    Ed25519,
    /// ECDSA on NIST P-256 (secp256r1).
    EcdsaP256,
    /// ECDSA on NIST P-384 (secp384r1).
    EcdsaP384,
    /// RSA, 2048 to 8192 bits.
    Rsa,
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyKind::Ed25519 => "Ed25519",
            KeyKind::EcdsaP256 => "ECDSA P-256",
            KeyKind::EcdsaP384 => "ECDSA P-384",
            KeyKind::Rsa => "RSA",
        })
    }
}

/// A signature scheme usable in RFC 7427 AUTH data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SigScheme {
    /// PureEdDSA with Ed25519 (id-Ed25519, RFC 8420).
    Ed25519,
    /// ecdsa-with-SHA256 (DER ECDSA-Sig-Value).
    EcdsaSha256,
    /// ecdsa-with-SHA384 (DER ECDSA-Sig-Value).
    EcdsaSha384,
    /// ecdsa-with-SHA512 (DER ECDSA-Sig-Value).
    EcdsaSha512,
    /// RSASSA-PSS with SHA-256, MGF1-SHA-256, 32 bytes of salt when signing.
    RsaPssSha256,
    /// RSASSA-PSS with SHA-384, MGF1-SHA-384, 48 bytes of salt when signing.
    RsaPssSha384,
    /// RSASSA-PSS with SHA-512, MGF1-SHA-512, 64 bytes of salt when signing.
    RsaPssSha512,
    /// sha256WithRSAEncryption (PKCS#1 v1.5).
    RsaPkcs1Sha256,
    /// sha384WithRSAEncryption (PKCS#1 v1.5).
    RsaPkcs1Sha384,
    /// sha512WithRSAEncryption (PKCS#1 v1.5).
    RsaPkcs1Sha512,
}

impl fmt::Display for SigScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SigScheme::Ed25519 => "Ed25519",
            SigScheme::EcdsaSha256 => "ecdsa-with-SHA256",
            SigScheme::EcdsaSha384 => "ecdsa-with-SHA384",
            SigScheme::EcdsaSha512 => "ecdsa-with-SHA512",
            SigScheme::RsaPssSha256 => "RSASSA-PSS-SHA256",
            SigScheme::RsaPssSha384 => "RSASSA-PSS-SHA384",
            SigScheme::RsaPssSha512 => "RSASSA-PSS-SHA512",
            SigScheme::RsaPkcs1Sha256 => "sha256WithRSAEncryption",
            SigScheme::RsaPkcs1Sha384 => "sha384WithRSAEncryption",
            SigScheme::RsaPkcs1Sha512 => "sha512WithRSAEncryption",
        })
    }
}

impl SigScheme {
    /// The RFC 7427 hash algorithm number (SIGNATURE_HASH_ALGORITHMS) this
    /// scheme uses: [`HASH_IDENTITY`] for Ed25519, else the SHA-2 number.
    pub fn hash_algorithm(self) -> u16 {
        match self {
            SigScheme::Ed25519 => HASH_IDENTITY,
            SigScheme::EcdsaSha256 | SigScheme::RsaPssSha256 | SigScheme::RsaPkcs1Sha256 => {
                HASH_SHA2_256
            }
            SigScheme::EcdsaSha384 | SigScheme::RsaPssSha384 | SigScheme::RsaPkcs1Sha384 => {
                HASH_SHA2_384
            }
            SigScheme::EcdsaSha512 | SigScheme::RsaPssSha512 | SigScheme::RsaPkcs1Sha512 => {
                HASH_SHA2_512
            }
        }
    }

    /// True if a key of `kind` can make or check signatures of this scheme.
    pub fn fits(self, kind: KeyKind) -> bool {
        match self {
            SigScheme::Ed25519 => kind == KeyKind::Ed25519,
            SigScheme::EcdsaSha256 | SigScheme::EcdsaSha384 | SigScheme::EcdsaSha512 => {
                matches!(kind, KeyKind::EcdsaP256 | KeyKind::EcdsaP384)
            }
            SigScheme::RsaPssSha256
            | SigScheme::RsaPssSha384
            | SigScheme::RsaPssSha512
            | SigScheme::RsaPkcs1Sha256
            | SigScheme::RsaPkcs1Sha384
            | SigScheme::RsaPkcs1Sha512 => kind == KeyKind::Rsa,
        }
    }

    /// The DER AlgorithmIdentifier sent for this scheme (RFC 7427 Appendix A,
    /// RFC 8420 §2). RSASSA-PSS carries its parameters (hash, MGF1 with the
    /// same hash, salt length = hash length, trailer field omitted as its
    /// default), exactly as strongSwan and OpenSSL encode them.
    pub fn algorithm_identifier(self) -> Vec<u8> {
        use der::{oid, write, NULL, OID, SEQUENCE};
        let simple = |o: &[u8], null: bool| {
            let mut body = write(OID, o);
            if null {
                body.extend_from_slice(&write(NULL, &[]));
            }
            write(SEQUENCE, &body)
        };
        let pss = |hash: &[u8], salt: u8| {
            // hashAlgorithm [0], maskGenAlgorithm [1], saltLength [2]
            let hash_alg = simple(hash, true);
            let mut mgf = write(OID, oid::MGF1);
            mgf.extend_from_slice(&hash_alg);
            let mut params = write(der::ctx(0), &hash_alg);
            params.extend_from_slice(&write(der::ctx(1), &write(SEQUENCE, &mgf)));
            params.extend_from_slice(&write(der::ctx(2), &write(der::INTEGER, &[salt])));
            let mut body = write(OID, oid::RSASSA_PSS);
            body.extend_from_slice(&write(SEQUENCE, &params));
            write(SEQUENCE, &body)
        };
        match self {
            SigScheme::Ed25519 => simple(oid::ED25519, false),
            SigScheme::EcdsaSha256 => simple(oid::ECDSA_SHA256, false),
            SigScheme::EcdsaSha384 => simple(oid::ECDSA_SHA384, false),
            SigScheme::EcdsaSha512 => simple(oid::ECDSA_SHA512, false),
            SigScheme::RsaPkcs1Sha256 => simple(oid::SHA256_WITH_RSA, true),
            SigScheme::RsaPkcs1Sha384 => simple(oid::SHA384_WITH_RSA, true),
            SigScheme::RsaPkcs1Sha512 => simple(oid::SHA512_WITH_RSA, true),
            SigScheme::RsaPssSha256 => pss(oid::SHA256, 32),
            SigScheme::RsaPssSha384 => pss(oid::SHA384, 48),
            SigScheme::RsaPssSha512 => pss(oid::SHA512, 64),
        }
    }

    /// Parses a DER AlgorithmIdentifier into a scheme on the allow-list,
    /// with the PSS salt length (always `Some` for PSS, `None` otherwise).
    fn parse_algorithm_identifier(input: &[u8]) -> Result<(SigScheme, Option<u16>), SigError> {
        use der::{oid, Reader, NULL, OID, SEQUENCE};
        const WHAT: &str = "AlgorithmIdentifier";
        let body = der::single(input, SEQUENCE).map_err(|_| SigError::Malformed(WHAT))?;
        let mut r = Reader::new(body);
        let o = r.read(OID).map_err(|_| SigError::Malformed(WHAT))?;
        let params = r.rest();
        if o == oid::RSASSA_PSS {
            let (scheme, salt) = parse_pss_params(params)?;
            return Ok((scheme, Some(salt)));
        }
        // id-Ed25519 has no parameters (RFC 8410); ecdsa-with-SHA* omit them
        // (RFC 5758) and sha*WithRSAEncryption carry NULL (RFC 4055). A NULL
        // where absence is specified (or the reverse) is tolerated, as
        // some peers send it; anything else is malformed.
        const SIMPLE: [(&[u8], SigScheme); 7] = [
            (oid::ED25519, SigScheme::Ed25519),
            (oid::ECDSA_SHA256, SigScheme::EcdsaSha256),
            (oid::ECDSA_SHA384, SigScheme::EcdsaSha384),
            (oid::ECDSA_SHA512, SigScheme::EcdsaSha512),
            (oid::SHA256_WITH_RSA, SigScheme::RsaPkcs1Sha256),
            (oid::SHA384_WITH_RSA, SigScheme::RsaPkcs1Sha384),
            (oid::SHA512_WITH_RSA, SigScheme::RsaPkcs1Sha512),
        ];
        let scheme = match SIMPLE.iter().find(|(known, _)| *known == o) {
            Some(&(_, scheme)) => scheme,
            None => return Err(SigError::UnsupportedAlgorithm(der::oid_to_string(o))),
        };
        let params_ok = if scheme == SigScheme::Ed25519 {
            params.is_empty()
        } else {
            params.is_empty() || params == [NULL, 0]
        };
        if !params_ok {
            return Err(SigError::Malformed("AlgorithmIdentifier parameters"));
        }
        Ok((scheme, None))
    }
}

/// Parses RSASSA-PSS-params (RFC 4055 §3.1). Only SHA-256/384/512 with MGF1
/// over the same hash and trailer field 1 are accepted; the SHA-1 defaults
/// (absent hash or MGF) are refused.
fn parse_pss_params(params: &[u8]) -> Result<(SigScheme, u16), SigError> {
    use der::{oid, Reader, NULL, OID, SEQUENCE};
    const WHAT: &str = "RSASSA-PSS parameters";
    let m = |_| SigError::Malformed(WHAT);
    let body = der::single(params, SEQUENCE).map_err(m)?;
    let mut r = Reader::new(body);
    // A hash AlgorithmIdentifier: OID with absent or NULL parameters.
    let hash_oid = |alg: &[u8]| -> Result<Vec<u8>, SigError> {
        let b = der::single(alg, SEQUENCE).map_err(m)?;
        let mut hr = Reader::new(b);
        let o = hr.read(OID).map_err(m)?;
        if !(hr.rest().is_empty() || hr.rest() == [NULL, 0]) {
            return Err(SigError::Malformed(WHAT));
        }
        Ok(o.to_vec())
    };
    let hash = match r.read_optional(der::ctx(0)).map_err(m)? {
        Some(h) => hash_oid(h)?,
        None => oid::SHA1.to_vec(),
    };
    let mgf_hash = match r.read_optional(der::ctx(1)).map_err(m)? {
        Some(mgf) => {
            let b = der::single(mgf, SEQUENCE).map_err(m)?;
            let mut mr = Reader::new(b);
            if mr.read(OID).map_err(m)? != oid::MGF1 {
                return Err(SigError::UnsupportedAlgorithm(
                    "RSASSA-PSS with a mask generation function other than MGF1".into(),
                ));
            }
            hash_oid(mr.rest())?
        }
        None => oid::SHA1.to_vec(),
    };
    let salt = match r.read_optional(der::ctx(2)).map_err(m)? {
        Some(s) => {
            let v = der::small_uint(der::single(s, der::INTEGER).map_err(m)?).map_err(m)?;
            u16::try_from(v).map_err(|_| SigError::Malformed(WHAT))?
        }
        None => 20,
    };
    if let Some(t) = r.read_optional(der::ctx(3)).map_err(m)? {
        let v = der::small_uint(der::single(t, der::INTEGER).map_err(m)?).map_err(m)?;
        if v != 1 {
            return Err(SigError::Malformed("RSASSA-PSS trailer field"));
        }
    }
    r.finish().map_err(m)?;
    if hash != mgf_hash {
        return Err(SigError::UnsupportedAlgorithm(
            "RSASSA-PSS with an MGF1 hash differing from the message hash".into(),
        ));
    }
    let scheme = match hash.as_slice() {
        h if h == oid::SHA256 => SigScheme::RsaPssSha256,
        h if h == oid::SHA384 => SigScheme::RsaPssSha384,
        h if h == oid::SHA512 => SigScheme::RsaPssSha512,
        h if h == oid::SHA1 => {
            return Err(SigError::UnsupportedAlgorithm(
                "RSASSA-PSS with SHA-1".into(),
            ))
        }
        h => {
            return Err(SigError::UnsupportedAlgorithm(format!(
                "RSASSA-PSS with hash {}",
                der::oid_to_string(h)
            )))
        }
    };
    Ok((scheme, salt))
}

/// Hash algorithm numbers for the SIGNATURE_HASH_ALGORITHMS notify (RFC 7427
/// §4) that this implementation verifies: 2 SHA2-256, 3 SHA2-384,
/// 4 SHA2-512, 5 Identity (RFC 8420, for Ed25519).
pub fn supported_hash_algorithms() -> Vec<u16> {
    vec![HASH_SHA2_256, HASH_SHA2_384, HASH_SHA2_512, HASH_IDENTITY]
}

/// Encodes a SIGNATURE_HASH_ALGORITHMS notify data field: each number as a
/// 16-bit big-endian value.
pub fn encode_hash_algorithms(algs: &[u16]) -> Vec<u8> {
    algs.iter().flat_map(|a| a.to_be_bytes()).collect()
}

/// Decodes a SIGNATURE_HASH_ALGORITHMS notify data field. Unknown numbers
/// are kept (the caller intersects with what it supports); an odd length is
/// an error.
pub fn decode_hash_algorithms(data: &[u8]) -> Result<Vec<u16>, SigError> {
    let pairs = data.chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return Err(SigError::Malformed(
            "SIGNATURE_HASH_ALGORITHMS data (odd length)",
        ));
    }
    Ok(pairs.map(|c| u16::from_be_bytes([c[0], c[1]])).collect())
}

/// A random pre-shared key for `espgate keygen --psk`: 32 bytes from the
/// system RNG, returned base64-encoded (44 characters, padded).
pub fn generate_psk() -> Result<Zeroizing<String>, SigError> {
    use base64ct::{Base64, Encoding};
    let mut raw = Zeroizing::new([0u8; 32]);
    aws_lc_rs::rand::fill(raw.as_mut()).map_err(|_| SigError::Crypto("random number generator"))?;
    let mut buf = Zeroizing::new([0u8; 44]);
    let s = Base64::encode(raw.as_ref(), buf.as_mut())
        .map_err(|_| SigError::Crypto("base64 encoding"))?;
    let mut out = Zeroizing::new(String::with_capacity(s.len()));
    out.push_str(s);
    Ok(out)
}

enum KeyPairInner {
    Ed25519(Ed25519KeyPair),
    Ecdsa(EcdsaKeyPair),
    Rsa(RsaKeyPair),
}

/// A private key for IKE authentication (Ed25519, ECDSA P-256/P-384, RSA).
///
/// The key material lives in aws-lc-rs objects that cleanse themselves on
/// drop; `Debug` shows only the key kind.
pub struct PrivateKey {
    kind: KeyKind,
    inner: KeyPairInner,
    public: PublicKey,
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateKey")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

fn key_rejected(e: aws_lc_rs::error::KeyRejected) -> SigError {
    SigError::InvalidKey(e.description_())
}

impl PrivateKey {
    /// Reads the first private key in PEM text: PKCS#8 `PRIVATE KEY`, SEC1
    /// `EC PRIVATE KEY` or PKCS#1 `RSA PRIVATE KEY`. Other blocks (such as
    /// `EC PARAMETERS`) and text around them are skipped; encrypted keys
    /// are refused.
    pub fn from_pem(pem: &[u8]) -> Result<PrivateKey, SigError> {
        match PrivateKeyDer::from_pem_slice(pem) {
            Ok(key) => PrivateKey::from_key_der(&key),
            Err(e) => Err(SigError::Pem(pem_error(
                pem,
                &e,
                "no PRIVATE KEY block found",
            ))),
        }
    }

    /// Reads a DER private key: PKCS#8 (v1 or v2), SEC1 `ECPrivateKey`
    /// (P-256 or P-384) or PKCS#1 `RSAPrivateKey` (the format is told by
    /// rustls-pki-types from the structure).
    pub fn from_der(input: &[u8]) -> Result<PrivateKey, SigError> {
        let key = PrivateKeyDer::try_from(input).map_err(|_| SigError::Malformed("private key"))?;
        PrivateKey::from_key_der(&key)
    }

    fn from_key_der(key: &PrivateKeyDer<'_>) -> Result<PrivateKey, SigError> {
        let inner = match key {
            PrivateKeyDer::Pkcs8(k) => {
                let der = k.secret_pkcs8_der();
                let alg = pkcs8_algorithm(der)?;
                if alg == alg_id::ED25519.as_ref() {
                    KeyPairInner::Ed25519(Ed25519KeyPair::from_pkcs8(der).map_err(key_rejected)?)
                } else if alg == alg_id::ECDSA_P256.as_ref() {
                    KeyPairInner::Ecdsa(
                        EcdsaKeyPair::from_pkcs8(&lc::ECDSA_P256_SHA256_ASN1_SIGNING, der)
                            .map_err(key_rejected)?,
                    )
                } else if alg == alg_id::ECDSA_P384.as_ref() {
                    KeyPairInner::Ecdsa(
                        EcdsaKeyPair::from_pkcs8(&lc::ECDSA_P384_SHA384_ASN1_SIGNING, der)
                            .map_err(key_rejected)?,
                    )
                } else if is_rsa_encryption(alg) {
                    KeyPairInner::Rsa(RsaKeyPair::from_pkcs8(der).map_err(key_rejected)?)
                } else {
                    return Err(unsupported_algorithm(alg));
                }
            }
            // SEC1 names its curve (or implies it by the scalar's length):
            // aws-lc-rs checks it against the curve we try.
            PrivateKeyDer::Sec1(k) => {
                let der = k.secret_sec1_der();
                let p256 =
                    EcdsaKeyPair::from_private_key_der(&lc::ECDSA_P256_SHA256_ASN1_SIGNING, der);
                let key = match p256 {
                    Ok(key) => key,
                    Err(_) => {
                        EcdsaKeyPair::from_private_key_der(&lc::ECDSA_P384_SHA384_ASN1_SIGNING, der)
                            .map_err(|_| {
                                SigError::UnsupportedKey(
                            "EC private key that is neither P-256 nor P-384 (or is malformed)"
                                .into(),
                        )
                            })?
                    }
                };
                KeyPairInner::Ecdsa(key)
            }
            PrivateKeyDer::Pkcs1(k) => {
                KeyPairInner::Rsa(RsaKeyPair::from_der(k.secret_pkcs1_der()).map_err(key_rejected)?)
            }
            _ => return Err(SigError::UnsupportedKey("private key format".into())),
        };
        PrivateKey::new(inner)
    }

    /// Generates a fresh key. RSA keys are 3072 bits.
    pub fn generate(kind: KeyKind) -> Result<PrivateKey, SigError> {
        let err = |_| SigError::Crypto("key generation");
        let inner = match kind {
            KeyKind::Ed25519 => KeyPairInner::Ed25519(Ed25519KeyPair::generate().map_err(err)?),
            KeyKind::EcdsaP256 => KeyPairInner::Ecdsa(
                EcdsaKeyPair::generate(&lc::ECDSA_P256_SHA256_ASN1_SIGNING).map_err(err)?,
            ),
            KeyKind::EcdsaP384 => KeyPairInner::Ecdsa(
                EcdsaKeyPair::generate(&lc::ECDSA_P384_SHA384_ASN1_SIGNING).map_err(err)?,
            ),
            KeyKind::Rsa => KeyPairInner::Rsa(
                RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa3072).map_err(err)?,
            ),
        };
        PrivateKey::new(inner)
    }

    fn new(inner: KeyPairInner) -> Result<PrivateKey, SigError> {
        let err = |_| SigError::Crypto("public key encoding");
        let spki: PublicKeyX509Der<'static> = match &inner {
            KeyPairInner::Ed25519(k) => k.public_key().as_der().map_err(err)?,
            KeyPairInner::Ecdsa(k) => k.public_key().as_der().map_err(err)?,
            KeyPairInner::Rsa(k) => k.public_key().as_der().map_err(err)?,
        };
        let public = PublicKey::from_spki_der(spki.as_ref())?;
        Ok(PrivateKey {
            kind: public.kind,
            inner,
            public,
        })
    }

    /// The key as unencrypted PKCS#8 v1 (`PRIVATE KEY`) PEM text.
    pub fn to_pkcs8_pem(&self) -> Result<Zeroizing<String>, SigError> {
        let err = |_| SigError::Crypto("PKCS#8 encoding");
        let der: Zeroizing<Vec<u8>> = Zeroizing::new(match &self.inner {
            KeyPairInner::Ed25519(k) => k.to_pkcs8v1().map_err(err)?.as_ref().to_vec(),
            KeyPairInner::Ecdsa(k) => k.to_pkcs8v1().map_err(err)?.as_ref().to_vec(),
            KeyPairInner::Rsa(k) => {
                let d: Pkcs8V1Der<'static> = k.as_der().map_err(err)?;
                d.as_ref().to_vec()
            }
        });
        Ok(pem_encode("PRIVATE KEY", &der))
    }

    /// The kind of this key.
    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    /// The matching public key.
    pub fn public_key(&self) -> PublicKey {
        self.public.clone()
    }

    /// The scheme [`PrivateKey::sign_auth`] uses when given `None`:
    /// Ed25519, ecdsa-with-SHA256 (P-256), ecdsa-with-SHA384 (P-384) or
    /// RSASSA-PSS with SHA-256 (RSA).
    pub fn default_scheme(&self) -> SigScheme {
        match self.kind {
            KeyKind::Ed25519 => SigScheme::Ed25519,
            KeyKind::EcdsaP256 => SigScheme::EcdsaSha256,
            KeyKind::EcdsaP384 => SigScheme::EcdsaSha384,
            KeyKind::Rsa => SigScheme::RsaPssSha256,
        }
    }

    /// Picks the scheme to sign with given the hash algorithms the peer
    /// announced in SIGNATURE_HASH_ALGORITHMS, or `None` if this key cannot
    /// make a signature the peer accepts. RSA prefers PSS with SHA-256, then
    /// SHA-384, then SHA-512.
    pub fn choose_scheme(&self, peer_hash_algorithms: &[u16]) -> Option<SigScheme> {
        let candidates: &[SigScheme] = match self.kind {
            KeyKind::Ed25519 => &[SigScheme::Ed25519],
            KeyKind::EcdsaP256 => &[SigScheme::EcdsaSha256],
            KeyKind::EcdsaP384 => &[SigScheme::EcdsaSha384],
            KeyKind::Rsa => &[
                SigScheme::RsaPssSha256,
                SigScheme::RsaPssSha384,
                SigScheme::RsaPssSha512,
            ],
        };
        candidates
            .iter()
            .copied()
            .find(|s| peer_hash_algorithms.contains(&s.hash_algorithm()))
    }

    /// Builds RFC 7427 §3 AUTH data (method 14): a 1-byte length of the ASN.1
    /// AlgorithmIdentifier, the DER AlgorithmIdentifier, then the signature
    /// over `signed_octets`.
    ///
    /// `scheme` defaults to [`PrivateKey::default_scheme`]. Ed25519 signs
    /// with id-Ed25519 (RFC 8420); P-256 signs only ecdsa-with-SHA256 and
    /// P-384 only ecdsa-with-SHA384 (DER ECDSA-Sig-Value); RSA signs any of
    /// the PSS (salt = hash length) or PKCS#1 v1.5 schemes.
    pub fn sign_auth(
        &self,
        scheme: Option<SigScheme>,
        signed_octets: &[u8],
    ) -> Result<Vec<u8>, SigError> {
        let scheme = scheme.unwrap_or_else(|| self.default_scheme());
        let mismatch = SigError::AlgorithmMismatch {
            scheme,
            key: self.kind,
        };
        let rng = SystemRandom::new();
        let signature: Vec<u8> = match (&self.inner, scheme) {
            (KeyPairInner::Ed25519(k), SigScheme::Ed25519) => k
                .try_sign(signed_octets)
                .map_err(|_| SigError::Crypto("Ed25519 signing"))?
                .as_ref()
                .to_vec(),
            (KeyPairInner::Ecdsa(k), s)
                if (s == SigScheme::EcdsaSha256 && self.kind == KeyKind::EcdsaP256)
                    || (s == SigScheme::EcdsaSha384 && self.kind == KeyKind::EcdsaP384) =>
            {
                k.sign(&rng, signed_octets)
                    .map_err(|_| SigError::Crypto("ECDSA signing"))?
                    .as_ref()
                    .to_vec()
            }
            (KeyPairInner::Rsa(k), s) => {
                let padding: &'static dyn lc::RsaEncoding = match s {
                    SigScheme::RsaPssSha256 => &lc::RSA_PSS_SHA256,
                    SigScheme::RsaPssSha384 => &lc::RSA_PSS_SHA384,
                    SigScheme::RsaPssSha512 => &lc::RSA_PSS_SHA512,
                    SigScheme::RsaPkcs1Sha256 => &lc::RSA_PKCS1_SHA256,
                    SigScheme::RsaPkcs1Sha384 => &lc::RSA_PKCS1_SHA384,
                    SigScheme::RsaPkcs1Sha512 => &lc::RSA_PKCS1_SHA512,
                    _ => return Err(mismatch),
                };
                let mut sig = vec![0u8; k.public_modulus_len()];
                k.sign(padding, &rng, signed_octets, &mut sig)
                    .map_err(|_| SigError::Crypto("RSA signing"))?;
                sig
            }
            _ => return Err(mismatch),
        };
        let alg = scheme.algorithm_identifier();
        let alg_len =
            u8::try_from(alg.len()).map_err(|_| SigError::Crypto("AlgorithmIdentifier length"))?;
        let mut out = Vec::with_capacity(1 + alg.len() + signature.len());
        out.push(alg_len);
        out.extend_from_slice(&alg);
        out.extend_from_slice(&signature);
        Ok(out)
    }
}

/// A public key: its kind and DER SubjectPublicKeyInfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    kind: KeyKind,
    /// The full SubjectPublicKeyInfo DER (what aws-lc-rs verifies with).
    spki: Vec<u8>,
    /// RSA: the modulus and public exponent, big-endian (RSASSA-PSS with a
    /// salt length of the peer's choice needs them apart).
    rsa: Option<(Vec<u8>, Vec<u8>)>,
}

impl PublicKey {
    /// Reads a DER SubjectPublicKeyInfo (Ed25519, EC P-256/P-384, or
    /// rsaEncryption of 2048 to 8192 bits): its structure checked by
    /// webpki, the key parsed and checked by aws-lc-rs.
    pub fn from_spki_der(input: &[u8]) -> Result<PublicKey, SigError> {
        const WHAT: &str = "SubjectPublicKeyInfo";
        let der = SubjectPublicKeyInfoDer::from(input);
        webpki::RawPublicKeyEntity::try_from(&der).map_err(|_| SigError::Malformed(WHAT))?;
        let alg = spki_algorithm(input)?;
        let check = |alg: &'static dyn lc::VerificationAlgorithm| {
            ParsedPublicKey::new(alg, input).map_err(key_rejected)
        };
        let (kind, rsa) = if alg == alg_id::ED25519.as_ref() {
            check(&lc::ED25519)?;
            (KeyKind::Ed25519, None)
        } else if alg == alg_id::ECDSA_P256.as_ref() {
            check(&lc::ECDSA_P256_SHA256_ASN1)?;
            (KeyKind::EcdsaP256, None)
        } else if alg == alg_id::ECDSA_P384.as_ref() {
            check(&lc::ECDSA_P384_SHA384_ASN1)?;
            (KeyKind::EcdsaP384, None)
        } else if is_rsa_encryption(alg) {
            let key = aws_lc_rs::rsa::PublicKey::from_der(input).map_err(key_rejected)?;
            let c = aws_lc_rs::rsa::PublicKeyComponents::<Vec<u8>>::from(&key);
            let bits = match c.n.iter().position(|b| *b != 0) {
                Some(i) => (c.n.len() - i) * 8 - c.n[i].leading_zeros() as usize,
                None => 0,
            };
            if !(2048..=8192).contains(&bits) {
                return Err(SigError::UnsupportedKey(format!(
                    "RSA key of {bits} bits (2048 to 8192 accepted)"
                )));
            }
            (KeyKind::Rsa, Some((c.n, c.e)))
        } else {
            return Err(unsupported_algorithm(alg));
        };
        Ok(PublicKey {
            kind,
            spki: input.to_vec(),
            rsa,
        })
    }

    /// Reads the first `PUBLIC KEY` (SubjectPublicKeyInfo) block of PEM text.
    pub fn from_pem(pem: &[u8]) -> Result<PublicKey, SigError> {
        match SubjectPublicKeyInfoDer::from_pem_slice(pem) {
            Ok(spki) => PublicKey::from_spki_der(spki.as_ref()),
            Err(e) => Err(SigError::Pem(pem_error(
                pem,
                &e,
                "no PUBLIC KEY block found",
            ))),
        }
    }

    /// The DER SubjectPublicKeyInfo.
    pub fn spki_der(&self) -> &[u8] {
        &self.spki
    }

    /// The kind of this key.
    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    /// Verifies RFC 7427 AUTH data (method 14) over `signed_octets` and
    /// returns the scheme used. The AlgorithmIdentifier must be on the
    /// allow-list (see the module documentation; no SHA-1) and fit the key
    /// kind. RSASSA-PSS is accepted with SHA-256/384/512, MGF1 over the same
    /// hash and any salt length the parameters state.
    pub fn verify_auth(
        &self,
        auth_data: &[u8],
        signed_octets: &[u8],
    ) -> Result<SigScheme, SigError> {
        let (&alg_len, rest) = auth_data
            .split_first()
            .ok_or(SigError::Malformed("AUTH data (empty)"))?;
        let alg_len = usize::from(alg_len);
        if rest.len() <= alg_len {
            return Err(SigError::Malformed("AUTH data (truncated)"));
        }
        let (alg, signature) = rest.split_at(alg_len);
        let (scheme, salt) = SigScheme::parse_algorithm_identifier(alg)?;
        if !scheme.fits(self.kind) {
            return Err(SigError::AlgorithmMismatch {
                scheme,
                key: self.kind,
            });
        }
        self.verify_scheme(scheme, salt, signed_octets, signature)?;
        Ok(scheme)
    }

    fn verify_scheme(
        &self,
        scheme: SigScheme,
        pss_salt: Option<u16>,
        msg: &[u8],
        signature: &[u8],
    ) -> Result<(), SigError> {
        let alg: &'static dyn lc::VerificationAlgorithm = match (scheme, self.kind) {
            (SigScheme::Ed25519, KeyKind::Ed25519) => &lc::ED25519,
            (SigScheme::EcdsaSha256, KeyKind::EcdsaP256) => &lc::ECDSA_P256_SHA256_ASN1,
            (SigScheme::EcdsaSha384, KeyKind::EcdsaP256) => &lc::ECDSA_P256_SHA384_ASN1,
            (SigScheme::EcdsaSha512, KeyKind::EcdsaP256) => &lc::ECDSA_P256_SHA512_ASN1,
            (SigScheme::EcdsaSha256, KeyKind::EcdsaP384) => &lc::ECDSA_P384_SHA256_ASN1,
            (SigScheme::EcdsaSha384, KeyKind::EcdsaP384) => &lc::ECDSA_P384_SHA384_ASN1,
            (SigScheme::EcdsaSha512, KeyKind::EcdsaP384) => &lc::ECDSA_P384_SHA512_ASN1,
            (SigScheme::RsaPkcs1Sha256, KeyKind::Rsa) => &lc::RSA_PKCS1_2048_8192_SHA256,
            (SigScheme::RsaPkcs1Sha384, KeyKind::Rsa) => &lc::RSA_PKCS1_2048_8192_SHA384,
            (SigScheme::RsaPkcs1Sha512, KeyKind::Rsa) => &lc::RSA_PKCS1_2048_8192_SHA512,
            (
                SigScheme::RsaPssSha256 | SigScheme::RsaPssSha384 | SigScheme::RsaPssSha512,
                KeyKind::Rsa,
            ) => {
                let base = match scheme {
                    SigScheme::RsaPssSha256 => lc::RSA_PSS_2048_8192_SHA256,
                    SigScheme::RsaPssSha384 => lc::RSA_PSS_2048_8192_SHA384,
                    _ => lc::RSA_PSS_2048_8192_SHA512,
                };
                let salt = pss_salt.unwrap_or(match scheme {
                    SigScheme::RsaPssSha256 => 32,
                    SigScheme::RsaPssSha384 => 48,
                    _ => 64,
                });
                let params = base.with_pss_salt_length(RsaPssSaltLength::Custom(salt));
                let (n, e) = self
                    .rsa
                    .as_ref()
                    .ok_or(SigError::Malformed("RSA public key"))?;
                return RsaPublicKeyComponents { n, e }
                    .verify(&params, msg, signature)
                    .map_err(|_| SigError::BadSignature);
            }
            _ => {
                return Err(SigError::AlgorithmMismatch {
                    scheme,
                    key: self.kind,
                })
            }
        };
        UnparsedPublicKey::new(alg, &self.spki)
            .verify(msg, signature)
            .map_err(|_| SigError::BadSignature)
    }

    /// Verifies a legacy AUTH payload: method 9 (ECDSA P-256 with SHA-256)
    /// or 10 (ECDSA P-384 with SHA-384), whose signature is the fixed-length
    /// `r || s` of RFC 4754. Method 1 (RSA PKCS#1 v1.5 with SHA-1) is refused
    /// as SHA-1 is not accepted; method 14 goes to [`PublicKey::verify_auth`].
    pub fn verify_legacy(
        &self,
        method: u8,
        auth_data: &[u8],
        signed_octets: &[u8],
    ) -> Result<(), SigError> {
        let (kind, len, alg): (KeyKind, usize, &'static dyn lc::VerificationAlgorithm) =
            match method {
                AUTH_METHOD_ECDSA_P256 => (KeyKind::EcdsaP256, 64, &lc::ECDSA_P256_SHA256_FIXED),
                AUTH_METHOD_ECDSA_P384 => (KeyKind::EcdsaP384, 96, &lc::ECDSA_P384_SHA384_FIXED),
                AUTH_METHOD_RSA_SIG => {
                    return Err(SigError::UnsupportedMethod {
                        method,
                        reason: "RSA PKCS#1 v1.5 with SHA-1 is refused; the peer must use RFC 7427 (method 14)",
                    })
                }
                AUTH_METHOD_DIGITAL_SIGNATURE => {
                    return Err(SigError::UnsupportedMethod {
                        method,
                        reason: "method 14 is verified with verify_auth",
                    })
                }
                _ => {
                    return Err(SigError::UnsupportedMethod {
                        method,
                        reason: "not a supported signature method",
                    })
                }
            };
        if self.kind != kind {
            return Err(SigError::UnsupportedMethod {
                method,
                reason: "the method does not fit the peer's key",
            });
        }
        if auth_data.len() != len {
            return Err(SigError::Malformed(
                "RFC 4754 ECDSA signature (wrong length)",
            ));
        }
        UnparsedPublicKey::new(alg, &self.spki)
            .verify(signed_octets, auth_data)
            .map_err(|_| SigError::BadSignature)
    }
}

/// The AlgorithmIdentifier of a PKCS#8 key, without its SEQUENCE header
/// (as rustls-pki-types' `alg_id` constants are). Read by hand: no crate
/// API names a PKCS#8 key's algorithm, and we need it to choose the
/// aws-lc-rs parser and to name an algorithm we do not support.
fn pkcs8_algorithm(input: &[u8]) -> Result<&[u8], SigError> {
    use der::{Reader, INTEGER, SEQUENCE};
    let m = |_| SigError::Malformed("private key");
    let mut r = Reader::new(der::single(input, SEQUENCE).map_err(m)?);
    r.read(INTEGER).map_err(m)?;
    r.read(SEQUENCE).map_err(m)
}

/// The AlgorithmIdentifier of a SubjectPublicKeyInfo (whose structure
/// webpki has checked), without its SEQUENCE header; by hand for the same
/// reason as [`pkcs8_algorithm`].
fn spki_algorithm(input: &[u8]) -> Result<&[u8], SigError> {
    let m = |_| SigError::Malformed("SubjectPublicKeyInfo");
    let mut r = der::Reader::new(der::single(input, der::SEQUENCE).map_err(m)?);
    r.read(der::SEQUENCE).map_err(m)
}

/// rsaEncryption, with its NULL parameters (RFC 8017) or, as some encoders
/// write it, without.
fn is_rsa_encryption(alg: &[u8]) -> bool {
    let with_null = alg_id::RSA_ENCRYPTION.as_ref();
    alg == with_null || with_null.strip_suffix(&[der::NULL, 0]) == Some(alg)
}

/// The error for a key algorithm we do not support, naming it.
fn unsupported_algorithm(alg: &[u8]) -> SigError {
    let mut r = der::Reader::new(alg);
    let Ok(o) = r.read(der::OID) else {
        return SigError::Malformed("key AlgorithmIdentifier");
    };
    if o == der::oid::EC_PUBLIC_KEY {
        if let Ok(curve) = r.read(der::OID) {
            return SigError::UnsupportedKey(format!("EC curve {}", der::oid_to_string(curve)));
        }
    }
    SigError::UnsupportedKey(der::oid_to_string(o))
}

/// A rustls-pki-types PEM error as a message; `none`: what to say when
/// the text has no block of the kind asked for.
pub(crate) fn pem_error(text: &[u8], e: &pki_pem::Error, none: &'static str) -> &'static str {
    let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
    match e {
        pki_pem::Error::NoItemsFound if has(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") => {
            "encrypted private keys are not supported"
        }
        pki_pem::Error::NoItemsFound => none,
        // RFC 1421 headers (Proc-Type, DEK-Info) are not base64.
        pki_pem::Error::Base64Decode(_) if has(b"Proc-Type: 4,ENCRYPTED") => {
            "encrypted PEM blocks are not supported"
        }
        pki_pem::Error::Base64Decode(_) => "invalid base64",
        pki_pem::Error::MissingSectionEnd { .. } => "missing or mismatched END line",
        pki_pem::Error::IllegalSectionStart { .. } => "malformed BEGIN line",
        pki_pem::Error::SectionTooLarge => "block too large",
        _ => "unreadable PEM",
    }
}

/// A small strict DER reader and writer (single-byte tags, definite lengths
/// of up to four bytes). Shared with the certificate code.
pub(crate) mod der {
    /// A DER decoding failure.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) struct DerError;

    pub(crate) const BOOLEAN: u8 = 0x01;
    pub(crate) const INTEGER: u8 = 0x02;
    pub(crate) const BIT_STRING: u8 = 0x03;
    pub(crate) const OCTET_STRING: u8 = 0x04;
    pub(crate) const NULL: u8 = 0x05;
    pub(crate) const OID: u8 = 0x06;
    pub(crate) const UTF8_STRING: u8 = 0x0c;
    pub(crate) const PRINTABLE_STRING: u8 = 0x13;
    pub(crate) const T61_STRING: u8 = 0x14;
    pub(crate) const IA5_STRING: u8 = 0x16;
    pub(crate) const SEQUENCE: u8 = 0x30;
    pub(crate) const SET: u8 = 0x31;

    /// Context-specific constructed tag `[n]` (n < 31).
    pub(crate) const fn ctx(n: u8) -> u8 {
        0xa0 | n
    }

    /// Context-specific primitive tag `[n]` (n < 31).
    pub(crate) const fn ctx_prim(n: u8) -> u8 {
        0x80 | n
    }

    /// Object identifier contents (without tag and length).
    pub(crate) mod oid {
        pub(crate) const ED25519: &[u8] = &[0x2b, 0x65, 0x70];
        pub(crate) const EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
        pub(crate) const MGF1: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x08];
        pub(crate) const RSASSA_PSS: &[u8] =
            &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a];
        pub(crate) const SHA256_WITH_RSA: &[u8] =
            &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];
        pub(crate) const SHA384_WITH_RSA: &[u8] =
            &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c];
        pub(crate) const SHA512_WITH_RSA: &[u8] =
            &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d];
        pub(crate) const ECDSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
        pub(crate) const ECDSA_SHA384: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03];
        pub(crate) const ECDSA_SHA512: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04];
        pub(crate) const SHA1: &[u8] = &[0x2b, 0x0e, 0x03, 0x02, 0x1a];
        pub(crate) const SHA256: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01];
        pub(crate) const SHA384: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02];
        pub(crate) const SHA512: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03];
    }

    /// One decoded element.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Tlv<'a> {
        pub(crate) tag: u8,
        pub(crate) content: &'a [u8],
        /// The whole element: tag, length and content.
        pub(crate) raw: &'a [u8],
    }

    /// Reads consecutive elements from a byte slice.
    #[derive(Clone, Debug)]
    pub(crate) struct Reader<'a> {
        rest: &'a [u8],
    }

    impl<'a> Reader<'a> {
        pub(crate) fn new(data: &'a [u8]) -> Self {
            Reader { rest: data }
        }

        pub(crate) fn is_empty(&self) -> bool {
            self.rest.is_empty()
        }

        /// The bytes not read yet.
        pub(crate) fn rest(&self) -> &'a [u8] {
            self.rest
        }

        pub(crate) fn peek_tag(&self) -> Option<u8> {
            self.rest.first().copied()
        }

        pub(crate) fn read_any(&mut self) -> Result<Tlv<'a>, DerError> {
            let data = self.rest;
            let (&tag, after_tag) = data.split_first().ok_or(DerError)?;
            if tag & 0x1f == 0x1f {
                return Err(DerError); // multi-byte tags are not used here
            }
            let (&first, mut after_len) = after_tag.split_first().ok_or(DerError)?;
            let len = if first < 0x80 {
                usize::from(first)
            } else {
                let n = usize::from(first & 0x7f);
                if n == 0 || n > 4 || after_len.len() < n {
                    return Err(DerError); // indefinite or oversized length
                }
                let (len_bytes, rest) = after_len.split_at(n);
                if len_bytes[0] == 0 {
                    return Err(DerError); // not minimal
                }
                let len = len_bytes
                    .iter()
                    .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
                if len < 0x80 {
                    return Err(DerError); // should have used the short form
                }
                after_len = rest;
                len
            };
            if after_len.len() < len {
                return Err(DerError);
            }
            let (content, rest) = after_len.split_at(len);
            let header = data.len() - after_len.len();
            let raw = &data[..header + len];
            self.rest = rest;
            Ok(Tlv { tag, content, raw })
        }

        /// Reads an element that must carry `tag` and returns its content.
        pub(crate) fn read(&mut self, tag: u8) -> Result<&'a [u8], DerError> {
            let t = self.read_any()?;
            if t.tag != tag {
                return Err(DerError);
            }
            Ok(t.content)
        }

        /// Reads an element carrying `tag` and returns it whole (tag, length, content).
        pub(crate) fn read_raw(&mut self, tag: u8) -> Result<&'a [u8], DerError> {
            let t = self.read_any()?;
            if t.tag != tag {
                return Err(DerError);
            }
            Ok(t.raw)
        }

        /// Reads the next element only if it carries `tag`.
        pub(crate) fn read_optional(&mut self, tag: u8) -> Result<Option<&'a [u8]>, DerError> {
            if self.peek_tag() == Some(tag) {
                self.read(tag).map(Some)
            } else {
                Ok(None)
            }
        }

        /// Fails unless everything was read.
        pub(crate) fn finish(&self) -> Result<(), DerError> {
            if self.rest.is_empty() {
                Ok(())
            } else {
                Err(DerError)
            }
        }
    }

    /// The content of `data`, which must be exactly one element with `tag`.
    pub(crate) fn single(data: &[u8], tag: u8) -> Result<&[u8], DerError> {
        let mut r = Reader::new(data);
        let c = r.read(tag)?;
        r.finish()?;
        Ok(c)
    }

    /// A non-negative INTEGER's magnitude without the sign byte; rejects
    /// negative, empty and non-minimal encodings and zero.
    pub(crate) fn positive_integer(content: &[u8]) -> Result<&[u8], DerError> {
        match content {
            [] => Err(DerError),
            [0] => Err(DerError),
            [0, next, ..] if *next < 0x80 => Err(DerError),
            [0, rest @ ..] => Ok(rest),
            [first, ..] if *first >= 0x80 => Err(DerError),
            _ => Ok(content),
        }
    }

    /// A small non-negative INTEGER (up to 2^56).
    pub(crate) fn small_uint(content: &[u8]) -> Result<u64, DerError> {
        if content == [0] {
            return Ok(0);
        }
        let mag = positive_integer(content)?;
        if mag.len() > 7 {
            return Err(DerError);
        }
        Ok(mag.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// Appends one element to `out`.
    pub(crate) fn write_into(out: &mut Vec<u8>, tag: u8, content: &[u8]) {
        out.push(tag);
        let len = content.len();
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes = (len as u64).to_be_bytes();
            let skip = bytes.iter().take_while(|&&b| b == 0).count();
            out.push(0x80 | (8 - skip) as u8);
            out.extend_from_slice(&bytes[skip..]);
        }
        out.extend_from_slice(content);
    }

    /// One element as a new vector.
    pub(crate) fn write(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(content.len() + 6);
        write_into(&mut out, tag, content);
        out
    }

    /// Dotted-decimal text of OID contents (for messages); "invalid OID" if malformed.
    pub(crate) fn oid_to_string(content: &[u8]) -> String {
        let mut arcs: Vec<u64> = Vec::new();
        let mut acc: u64 = 0;
        let mut in_arc = false;
        for &b in content {
            if !in_arc && b == 0x80 {
                return "invalid OID".into();
            }
            if acc > (u64::MAX >> 7) {
                return "invalid OID".into();
            }
            acc = (acc << 7) | u64::from(b & 0x7f);
            in_arc = b & 0x80 != 0;
            if !in_arc {
                arcs.push(acc);
                acc = 0;
            }
        }
        if in_arc || arcs.is_empty() {
            return "invalid OID".into();
        }
        let first = arcs[0];
        let (a, b) = if first < 40 {
            (0, first)
        } else if first < 80 {
            (1, first - 40)
        } else {
            (2, first - 80)
        };
        let mut s = format!("{a}.{b}");
        for arc in &arcs[1..] {
            s.push('.');
            s.push_str(&arc.to_string());
        }
        s
    }

    /// Encodes a dotted-decimal OID into its contents; `None` if invalid.
    pub(crate) fn oid_from_string(s: &str) -> Option<Vec<u8>> {
        let arcs: Vec<u64> = s
            .split('.')
            .map(|p| p.parse::<u64>().ok())
            .collect::<Option<Vec<_>>>()?;
        if arcs.len() < 2 || arcs[0] > 2 || (arcs[0] < 2 && arcs[1] >= 40) {
            return None;
        }
        let first = arcs[0].checked_mul(40)?.checked_add(arcs[1])?;
        let mut out = Vec::new();
        for arc in core::iter::once(first).chain(arcs[2..].iter().copied()) {
            let mut groups = vec![(arc & 0x7f) as u8];
            let mut v = arc >> 7;
            while v > 0 {
                groups.push(((v & 0x7f) as u8) | 0x80);
                v >>= 7;
            }
            out.extend(groups.iter().rev());
        }
        Some(out)
    }
}

/// Encodes `der` as a PEM block (RFC 7468) with 64-character lines. By
/// hand with base64ct: rustls-pki-types reads PEM but does not write it.
pub(crate) fn pem_encode(label: &str, der: &[u8]) -> Zeroizing<String> {
    use base64ct::{Base64, Encoding};
    let b64_len = Base64::encoded_len(der);
    let mut b64 = Zeroizing::new(vec![0u8; b64_len]);
    // The buffer has exactly the encoded length, so encoding cannot fail.
    let text = Base64::encode(der, b64.as_mut_slice()).unwrap_or("");
    let lines = b64_len.div_ceil(64);
    let mut out = Zeroizing::new(String::with_capacity(
        2 * (label.len() + 16) + b64_len + lines,
    ));
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    let mut rest = text;
    while !rest.is_empty() {
        let (line, tail) = rest.split_at(rest.len().min(64));
        out.push_str(line);
        out.push('\n');
        rest = tail;
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_bytes!(concat!("../tests/vectors/ike/certs/", $name)).as_slice()
        };
    }

    const MSG: &[u8] = fixture!("msg.bin");

    fn key(pem: &[u8]) -> PrivateKey {
        PrivateKey::from_pem(pem).expect("fixture private key")
    }

    fn public(pem: &[u8]) -> PublicKey {
        PublicKey::from_pem(pem).expect("fixture public key")
    }

    /// RFC 7427 AUTH data from an AlgorithmIdentifier and a raw signature.
    fn wrap(alg: &[u8], sig: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::try_from(alg.len()).unwrap()];
        out.extend_from_slice(alg);
        out.extend_from_slice(sig);
        out
    }

    /// The signature part of AUTH data.
    fn sig_part(auth: &[u8]) -> &[u8] {
        &auth[1 + usize::from(auth[0])..]
    }

    /// An RSASSA-PSS AlgorithmIdentifier with the given hash OID and salt.
    fn pss_alg(hash: &[u8], salt: &[u8]) -> Vec<u8> {
        use der::{ctx, oid, write, INTEGER, NULL, OID, SEQUENCE};
        let mut h = write(OID, hash);
        h.extend(write(NULL, &[]));
        let h = write(SEQUENCE, &h);
        let mut mgf = write(OID, oid::MGF1);
        mgf.extend(&h);
        let mut params = write(ctx(0), &h);
        params.extend(write(ctx(1), &write(SEQUENCE, &mgf)));
        params.extend(write(ctx(2), &write(INTEGER, salt)));
        let mut body = write(OID, oid::RSASSA_PSS);
        body.extend(write(SEQUENCE, &params));
        write(SEQUENCE, &body)
    }

    /// The signatureAlgorithm field of a DER certificate (made by openssl).
    fn cert_sig_alg(pem_text: &[u8]) -> Vec<u8> {
        let cert = pem_der(pem_text);
        let body = der::single(&cert, der::SEQUENCE).unwrap();
        let mut r = der::Reader::new(body);
        r.read(der::SEQUENCE).unwrap();
        r.read_raw(der::SEQUENCE).unwrap().to_vec()
    }

    /// The DER of the first PEM block of `text`, whatever its kind.
    fn pem_der(text: &[u8]) -> Vec<u8> {
        <(pki_pem::SectionKind, Vec<u8>)>::from_pem_slice(text)
            .unwrap()
            .1
    }

    fn unhex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        hex::decode(s).unwrap()
    }

    #[test]
    fn algorithm_identifiers_match_rfc7427_appendix_a_and_rfc8420() {
        let cases: [(SigScheme, &str); 8] = [
            // RFC 7427 A.1.2-A.1.4: sha256/384/512WithRSAEncryption
            (SigScheme::RsaPkcs1Sha256, "300d06092a864886f70d01010b0500"),
            (SigScheme::RsaPkcs1Sha384, "300d06092a864886f70d01010c0500"),
            (SigScheme::RsaPkcs1Sha512, "300d06092a864886f70d01010d0500"),
            // RFC 7427 A.3.2-A.3.4: ecdsa-with-SHA256/384/512
            (SigScheme::EcdsaSha256, "300a06082a8648ce3d040302"),
            (SigScheme::EcdsaSha384, "300a06082a8648ce3d040303"),
            (SigScheme::EcdsaSha512, "300a06082a8648ce3d040304"),
            // RFC 7427 A.4.3: RSASSA-PSS with SHA-256, MGF1-SHA-256, salt 32
            (
                SigScheme::RsaPssSha256,
                "3041 0609 2a86 4886 f70d 0101 0a30 34a0
                 0f30 0d06 0960 8648 0165 0304 0201 0500
                 a11c 301a 0609 2a86 4886 f70d 0101 0830
                 0d06 0960 8648 0165 0304 0201 0500 a203
                 0201 20",
            ),
            // RFC 8420 §2: id-Ed25519
            (SigScheme::Ed25519, "3005 0603 2b65 70"),
        ];
        for (scheme, hex_text) in cases {
            assert_eq!(scheme.algorithm_identifier(), unhex(hex_text), "{scheme}");
            assert_eq!(
                SigScheme::parse_algorithm_identifier(&unhex(hex_text)),
                Ok((scheme, scheme_salt(scheme)))
            );
        }
        // Every scheme's identifier parses back to itself.
        for scheme in ALL_SCHEMES {
            assert_eq!(
                SigScheme::parse_algorithm_identifier(&scheme.algorithm_identifier()),
                Ok((scheme, scheme_salt(scheme)))
            );
        }
    }

    fn scheme_salt(s: SigScheme) -> Option<u16> {
        match s {
            SigScheme::RsaPssSha256 => Some(32),
            SigScheme::RsaPssSha384 => Some(48),
            SigScheme::RsaPssSha512 => Some(64),
            _ => None,
        }
    }

    const ALL_SCHEMES: [SigScheme; 10] = [
        SigScheme::Ed25519,
        SigScheme::EcdsaSha256,
        SigScheme::EcdsaSha384,
        SigScheme::EcdsaSha512,
        SigScheme::RsaPssSha256,
        SigScheme::RsaPssSha384,
        SigScheme::RsaPssSha512,
        SigScheme::RsaPkcs1Sha256,
        SigScheme::RsaPkcs1Sha384,
        SigScheme::RsaPkcs1Sha512,
    ];

    #[test]
    fn algorithm_identifiers_match_what_openssl_puts_in_certificates() {
        // openssl x509 -sigopt rsa_padding_mode:pss -sigopt rsa_pss_saltlen:32 (README.md)
        assert_eq!(
            cert_sig_alg(fixture!("sun-rsa.crt")),
            SigScheme::RsaPssSha256.algorithm_identifier()
        );
        assert_eq!(
            cert_sig_alg(fixture!("ca-rsa.crt")),
            SigScheme::RsaPkcs1Sha256.algorithm_identifier()
        );
        assert_eq!(
            cert_sig_alg(fixture!("moon-p256.crt")),
            SigScheme::EcdsaSha256.algorithm_identifier()
        );
        assert_eq!(
            cert_sig_alg(fixture!("carol-ed25519.crt")),
            SigScheme::Ed25519.algorithm_identifier()
        );
    }

    #[test]
    fn sha1_and_unknown_algorithms_are_refused() {
        let sha1_rsa = unhex("300d06092a864886f70d0101050500");
        let ecdsa_sha1 = unhex("300906072a8648ce3d0401");
        let pss_defaults = unhex("300d06092a864886f70d01010a3000"); // SHA-1 defaults
        let pss_sha1_explicit = pss_alg(der::oid::SHA1, &[20]);
        let ed448 = unhex("300506032b6571");
        for alg in [
            &sha1_rsa,
            &ecdsa_sha1,
            &pss_defaults,
            &pss_sha1_explicit,
            &ed448,
        ] {
            let r = SigScheme::parse_algorithm_identifier(alg);
            assert!(
                matches!(r, Err(SigError::UnsupportedAlgorithm(_))),
                "{alg:02x?}: {r:?}"
            );
        }
        // A SHA-1 signature made by the RSA key is refused before verification.
        let k = key(fixture!("rsa2048.key"));
        let good = k.sign_auth(Some(SigScheme::RsaPkcs1Sha256), MSG).unwrap();
        let as_sha1 = wrap(&sha1_rsa, sig_part(&good));
        assert!(matches!(
            k.public_key().verify_auth(&as_sha1, MSG),
            Err(SigError::UnsupportedAlgorithm(_))
        ));
        // PSS whose MGF1 hash differs from the message hash.
        let mut mixed = pss_alg(der::oid::SHA256, &[32]);
        let pos = mixed
            .windows(der::oid::SHA256.len())
            .rposition(|w| w == der::oid::SHA256)
            .unwrap();
        mixed[pos + der::oid::SHA256.len() - 1] = 0x02; // MGF1 over SHA-384
        assert!(matches!(
            SigScheme::parse_algorithm_identifier(&mixed),
            Err(SigError::UnsupportedAlgorithm(_))
        ));
        // Parameters on id-Ed25519, trailing bytes, garbage.
        for bad in [
            "300706032b65700500",
            "300a06082a8648ce3d04030200",
            "3000",
            "05",
        ] {
            assert!(
                SigScheme::parse_algorithm_identifier(&unhex(bad)).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn sign_and_verify_round_trip_for_every_key_kind() {
        for kind in [KeyKind::Ed25519, KeyKind::EcdsaP256, KeyKind::EcdsaP384] {
            let k = PrivateKey::generate(kind).unwrap();
            assert_eq!(k.kind(), kind);
            let auth = k.sign_auth(None, MSG).unwrap();
            assert_eq!(
                k.public_key().verify_auth(&auth, MSG),
                Ok(k.default_scheme())
            );
            assert_eq!(k.public_key().kind(), kind);
        }
        let rsa = key(fixture!("rsa2048.key"));
        for scheme in [
            SigScheme::RsaPssSha256,
            SigScheme::RsaPssSha384,
            SigScheme::RsaPssSha512,
            SigScheme::RsaPkcs1Sha256,
            SigScheme::RsaPkcs1Sha384,
            SigScheme::RsaPkcs1Sha512,
        ] {
            let auth = rsa.sign_auth(Some(scheme), MSG).unwrap();
            assert_eq!(auth[0] as usize, scheme.algorithm_identifier().len());
            assert_eq!(sig_part(&auth).len(), 256);
            assert_eq!(rsa.public_key().verify_auth(&auth, MSG), Ok(scheme));
        }
        // RSA defaults to PSS with SHA-256.
        let auth = rsa.sign_auth(None, MSG).unwrap();
        assert_eq!(
            rsa.public_key().verify_auth(&auth, MSG),
            Ok(SigScheme::RsaPssSha256)
        );
    }

    #[test]
    fn generated_rsa_key_signs_and_exports() {
        let k = PrivateKey::generate(KeyKind::Rsa).unwrap();
        let auth = k.sign_auth(None, MSG).unwrap();
        assert_eq!(sig_part(&auth).len(), 384); // 3072 bits
        assert_eq!(
            k.public_key().verify_auth(&auth, MSG),
            Ok(SigScheme::RsaPssSha256)
        );
        let again = PrivateKey::from_pem(k.to_pkcs8_pem().unwrap().as_bytes()).unwrap();
        assert_eq!(again.public_key(), k.public_key());
    }

    #[test]
    fn tampering_is_detected() {
        let keys = [
            key(fixture!("ed25519.key")),
            key(fixture!("p256.key")),
            key(fixture!("p384.key")),
            key(fixture!("rsa2048.key")),
        ];
        for k in &keys {
            let pk = k.public_key();
            let auth = k.sign_auth(None, MSG).unwrap();
            assert!(pk.verify_auth(&auth, MSG).is_ok());
            // A flipped bit in the signed octets.
            for i in [0, MSG.len() / 2, MSG.len() - 1] {
                let mut msg = MSG.to_vec();
                msg[i] ^= 0x01;
                assert_eq!(pk.verify_auth(&auth, &msg), Err(SigError::BadSignature));
            }
            // A flipped bit in the signature.
            let start = 1 + usize::from(auth[0]);
            for i in [start, start + 5, auth.len() - 1] {
                let mut bad = auth.clone();
                bad[i] ^= 0x80;
                assert!(
                    pk.verify_auth(&bad, MSG).is_err(),
                    "{:?} byte {i}",
                    k.kind()
                );
            }
            // Truncated signature, empty and cut AUTH data.
            assert!(pk.verify_auth(&auth[..auth.len() - 1], MSG).is_err());
            assert!(pk.verify_auth(&[], MSG).is_err());
            assert!(pk.verify_auth(&auth[..start], MSG).is_err());
            assert!(pk.verify_auth(&auth[..3], MSG).is_err());
            // Another key of the same kind does not verify it.
            let other = PrivateKey::generate(match k.kind() {
                KeyKind::Rsa => KeyKind::EcdsaP256,
                kind => kind,
            })
            .unwrap();
            if other.kind() == k.kind() {
                assert_eq!(
                    other.public_key().verify_auth(&auth, MSG),
                    Err(SigError::BadSignature)
                );
            }
        }
    }

    #[test]
    fn algorithm_identifier_must_fit_the_key() {
        let ed = key(fixture!("ed25519.key"));
        let p256 = key(fixture!("p256.key"));
        let rsa = key(fixture!("rsa2048.key"));
        let ecdsa_auth = p256.sign_auth(None, MSG).unwrap();
        let ed_auth = ed.sign_auth(None, MSG).unwrap();
        // The right signature relabelled with another algorithm.
        let relabelled = [
            (
                wrap(
                    &SigScheme::Ed25519.algorithm_identifier(),
                    sig_part(&ecdsa_auth),
                ),
                &p256,
            ),
            (
                wrap(
                    &SigScheme::RsaPkcs1Sha256.algorithm_identifier(),
                    sig_part(&ecdsa_auth),
                ),
                &p256,
            ),
            (
                wrap(
                    &SigScheme::EcdsaSha256.algorithm_identifier(),
                    sig_part(&ed_auth),
                ),
                &ed,
            ),
            (
                wrap(
                    &SigScheme::EcdsaSha256.algorithm_identifier(),
                    sig_part(&ecdsa_auth),
                ),
                &rsa,
            ),
        ];
        for (auth, k) in relabelled {
            assert!(matches!(
                k.public_key().verify_auth(&auth, MSG),
                Err(SigError::AlgorithmMismatch { .. })
            ));
        }
        // The right key with a different hash than was signed.
        let as_384 = wrap(
            &SigScheme::EcdsaSha384.algorithm_identifier(),
            sig_part(&ecdsa_auth),
        );
        assert_eq!(
            p256.public_key().verify_auth(&as_384, MSG),
            Err(SigError::BadSignature)
        );
        // Signing refuses schemes that do not fit.
        for (k, s) in [
            (&ed, SigScheme::EcdsaSha256),
            (&p256, SigScheme::Ed25519),
            (&p256, SigScheme::EcdsaSha384),
            (&p256, SigScheme::RsaPssSha256),
            (&rsa, SigScheme::EcdsaSha256),
        ] {
            assert_eq!(
                k.sign_auth(Some(s), MSG),
                Err(SigError::AlgorithmMismatch {
                    scheme: s,
                    key: k.kind()
                })
            );
        }
    }

    #[test]
    fn openssl_signatures_verify() {
        let cases: [(&[u8], &[u8], SigScheme); 6] = [
            (
                fixture!("ed25519.pub"),
                fixture!("msg.ed25519.sig"),
                SigScheme::Ed25519,
            ),
            (
                fixture!("p256.pub"),
                fixture!("msg.p256-sha256.sig"),
                SigScheme::EcdsaSha256,
            ),
            (
                fixture!("p256.pub"),
                fixture!("msg.p256-sha512.sig"),
                SigScheme::EcdsaSha512,
            ),
            (
                fixture!("p384.pub"),
                fixture!("msg.p384-sha384.sig"),
                SigScheme::EcdsaSha384,
            ),
            (
                fixture!("rsa2048.pub"),
                fixture!("msg.rsa-pkcs1-sha256.sig"),
                SigScheme::RsaPkcs1Sha256,
            ),
            (
                fixture!("rsa2048.pub"),
                fixture!("msg.rsa-pss-sha256.sig"),
                SigScheme::RsaPssSha256,
            ),
        ];
        for (pub_pem, sig, scheme) in cases {
            let pk = public(pub_pem);
            let auth = wrap(&scheme.algorithm_identifier(), sig);
            assert_eq!(pk.verify_auth(&auth, MSG), Ok(scheme), "{scheme}");
            assert_eq!(
                pk.verify_auth(&auth, b"other octets"),
                Err(SigError::BadSignature)
            );
        }
        // openssl's RSASSA-PSS SHA-384 with the maximum salt (2048 - 384/8 - 2 = 206
        // bytes): accepted when the parameters say so, refused with salt 48.
        let pk = public(fixture!("rsa2048.pub"));
        let sig = fixture!("msg.rsa-pss-sha384-maxsalt.sig");
        let max_salt = wrap(&pss_alg(der::oid::SHA384, &[0x00, 0xce]), sig);
        assert_eq!(pk.verify_auth(&max_salt, MSG), Ok(SigScheme::RsaPssSha384));
        let salt48 = wrap(&SigScheme::RsaPssSha384.algorithm_identifier(), sig);
        assert_eq!(pk.verify_auth(&salt48, MSG), Err(SigError::BadSignature));
    }

    #[test]
    fn deterministic_signatures_equal_openssls() {
        // Ed25519 and RSA PKCS#1 v1.5 are deterministic: our signature must be
        // byte for byte what `openssl pkeyutl` / `openssl dgst -sign` made.
        let ed = key(fixture!("ed25519.key"));
        let auth = ed.sign_auth(None, MSG).unwrap();
        assert_eq!(sig_part(&auth), fixture!("msg.ed25519.sig"));
        let rsa = key(fixture!("rsa2048-pkcs1.key"));
        let auth = rsa.sign_auth(Some(SigScheme::RsaPkcs1Sha256), MSG).unwrap();
        assert_eq!(sig_part(&auth), fixture!("msg.rsa-pkcs1-sha256.sig"));
    }

    /// Converts a DER ECDSA-Sig-Value to the fixed `r || s` of RFC 4754.
    fn ecdsa_der_to_fixed(sig: &[u8], n: usize) -> Vec<u8> {
        let body = der::single(sig, der::SEQUENCE).unwrap();
        let mut r = der::Reader::new(body);
        let mut out = Vec::new();
        for _ in 0..2 {
            let int = der::positive_integer(r.read(der::INTEGER).unwrap()).unwrap();
            out.resize(out.len() + n - int.len(), 0);
            out.extend_from_slice(int);
        }
        out
    }

    #[test]
    fn legacy_ecdsa_methods_verify_openssl_signatures() {
        let p256 = public(fixture!("p256.pub"));
        let p384 = public(fixture!("p384.pub"));
        let s256 = ecdsa_der_to_fixed(fixture!("msg.p256-sha256.sig"), 32);
        let s384 = ecdsa_der_to_fixed(fixture!("msg.p384-sha384.sig"), 48);
        assert_eq!(
            p256.verify_legacy(AUTH_METHOD_ECDSA_P256, &s256, MSG),
            Ok(())
        );
        assert_eq!(
            p384.verify_legacy(AUTH_METHOD_ECDSA_P384, &s384, MSG),
            Ok(())
        );
        assert_eq!(
            p256.verify_legacy(AUTH_METHOD_ECDSA_P256, &s256, b"other"),
            Err(SigError::BadSignature)
        );
        let mut flipped = s384.clone();
        flipped[10] ^= 1;
        assert_eq!(
            p384.verify_legacy(AUTH_METHOD_ECDSA_P384, &flipped, MSG),
            Err(SigError::BadSignature)
        );
        // Wrong length (DER instead of r||s), wrong curve for the method.
        assert!(p256
            .verify_legacy(AUTH_METHOD_ECDSA_P256, fixture!("msg.p256-sha256.sig"), MSG)
            .is_err());
        assert!(p384
            .verify_legacy(AUTH_METHOD_ECDSA_P256, &s256, MSG)
            .is_err());
        // RSA with SHA-1 (method 1) is refused, as is anything else.
        let rsa = public(fixture!("rsa2048.pub"));
        for method in [AUTH_METHOD_RSA_SIG, 2, 3, 11, AUTH_METHOD_DIGITAL_SIGNATURE] {
            assert!(matches!(
                rsa.verify_legacy(method, &[0; 256], MSG),
                Err(SigError::UnsupportedMethod { .. })
            ));
        }
    }

    #[test]
    fn keys_load_from_every_format() {
        // SEC1 and PKCS#8 P-256, PKCS#8 and PKCS#1 RSA give the same keys.
        let pairs: [(&[u8], &[u8], KeyKind); 6] = [
            (
                fixture!("p256.key"),
                fixture!("p256.pub"),
                KeyKind::EcdsaP256,
            ),
            (
                fixture!("p256-pkcs8.key"),
                fixture!("p256.pub"),
                KeyKind::EcdsaP256,
            ),
            (
                fixture!("p384.key"),
                fixture!("p384.pub"),
                KeyKind::EcdsaP384,
            ),
            (
                fixture!("rsa2048.key"),
                fixture!("rsa2048.pub"),
                KeyKind::Rsa,
            ),
            (
                fixture!("rsa2048-pkcs1.key"),
                fixture!("rsa2048.pub"),
                KeyKind::Rsa,
            ),
            (
                fixture!("ed25519.key"),
                fixture!("ed25519.pub"),
                KeyKind::Ed25519,
            ),
        ];
        for (key_pem, pub_pem, kind) in pairs {
            let k = key(key_pem);
            assert_eq!(k.kind(), kind);
            let pk = public(pub_pem);
            assert_eq!(k.public_key(), pk);
            assert_eq!(pk.spki_der(), pem_der(pub_pem).as_slice());
            // DER input works too, and PKCS#8 export reads back to the same key.
            let der = pem_der(key_pem);
            assert_eq!(PrivateKey::from_der(&der).unwrap().public_key(), pk);
            let exported = k.to_pkcs8_pem().unwrap();
            assert!(exported.starts_with("-----BEGIN PRIVATE KEY-----\n"));
            assert!(exported.lines().all(|l| l.len() <= 64));
            assert_eq!(
                PrivateKey::from_pem(exported.as_bytes())
                    .unwrap()
                    .public_key(),
                pk
            );
        }
        // The P-256 PKCS#8 export is what openssl made from the SEC1 key.
        let exported = key(fixture!("p256.key")).to_pkcs8_pem().unwrap();
        let openssl_der = pem_der(fixture!("p256-pkcs8.key"));
        let ours = pem_der(exported.as_bytes());
        assert_eq!(
            PrivateKey::from_der(&ours).unwrap().public_key(),
            PrivateKey::from_der(&openssl_der).unwrap().public_key()
        );
    }

    #[test]
    fn bad_key_input_is_an_error() {
        assert!(matches!(
            PrivateKey::from_pem(b"no pem here"),
            Err(SigError::Pem(_))
        ));
        assert!(matches!(
            PrivateKey::from_pem(fixture!("p256.pub")),
            Err(SigError::Pem(_))
        ));
        let encrypted =
            b"-----BEGIN ENCRYPTED PRIVATE KEY-----\nMAA=\n-----END ENCRYPTED PRIVATE KEY-----\n";
        assert!(matches!(
            PrivateKey::from_pem(encrypted),
            Err(SigError::Pem(_))
        ));
        let mismatched = b"-----BEGIN PRIVATE KEY-----\nMAA=\n-----END PUBLIC KEY-----\n";
        assert!(PrivateKey::from_pem(mismatched).is_err());
        let unterminated = b"-----BEGIN PRIVATE KEY-----\nMAA=\n";
        assert!(PrivateKey::from_pem(unterminated).is_err());
        assert!(PrivateKey::from_der(&[]).is_err());
        assert!(PrivateKey::from_der(&[0x30, 0x03, 0x02, 0x01, 0x00]).is_err());
        // A public key is not a private key and vice versa.
        let spki = public(fixture!("p256.pub")).spki_der().to_vec();
        assert!(PrivateKey::from_der(&spki).is_err());
        let pkcs8 = pem_der(fixture!("p256-pkcs8.key"));
        assert!(PublicKey::from_spki_der(&pkcs8).is_err());
        // A point not on the curve is rejected.
        let mut off_curve = spki.clone();
        let last = off_curve.len() - 1;
        off_curve[last] ^= 1;
        assert!(matches!(
            PublicKey::from_spki_der(&off_curve),
            Err(SigError::InvalidKey(_))
        ));
        // Trailing bytes after the SPKI.
        let mut trailing = spki;
        trailing.push(0);
        assert!(PublicKey::from_spki_der(&trailing).is_err());
    }

    #[test]
    fn pem_and_key_errors_say_what_is_wrong() {
        let msg = |r: Result<PrivateKey, SigError>| r.unwrap_err().to_string();
        let encrypted =
            b"-----BEGIN ENCRYPTED PRIVATE KEY-----\nMAA=\n-----END ENCRYPTED PRIVATE KEY-----\n";
        assert_eq!(
            msg(PrivateKey::from_pem(encrypted)),
            "PEM: encrypted private keys are not supported"
        );
        let legacy = b"-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n\
            DEK-Info: AES-128-CBC,00000000000000000000000000000000\n\nMAA=\n\
            -----END EC PRIVATE KEY-----\n";
        assert_eq!(
            msg(PrivateKey::from_pem(legacy)),
            "PEM: encrypted PEM blocks are not supported"
        );
        assert_eq!(
            msg(PrivateKey::from_pem(
                b"-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n"
            )),
            "PEM: invalid base64"
        );
        assert_eq!(
            msg(PrivateKey::from_pem(b"-----BEGIN PRIVATE KEY-----\nMAA=\n")),
            "PEM: missing or mismatched END line"
        );
        assert_eq!(
            PublicKey::from_pem(fixture!("p256.key"))
                .unwrap_err()
                .to_string(),
            "PEM: no PUBLIC KEY block found"
        );
        // An algorithm we do not support is named (Ed448, RFC 8410).
        let mut ed448 = vec![
            0x30, 0x43, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x71, 0x03, 0x3a, 0x00,
        ];
        ed448.extend([7u8; 57]);
        assert_eq!(
            PublicKey::from_spki_der(&ed448),
            Err(SigError::UnsupportedKey("1.3.101.113".into()))
        );
        // rsaEncryption without its NULL parameters is read too.
        let rsa = public(fixture!("rsa2048.pub"));
        let spki = rsa.spki_der();
        let alg = [
            0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05,
            0x00,
        ];
        assert_eq!(&spki[4..4 + alg.len()], &alg[..]);
        let bits = &spki[4 + alg.len()..];
        let mut body = vec![
            0x30, 0x0b, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
        ];
        body.extend_from_slice(bits);
        let no_null = der::write(der::SEQUENCE, &body);
        let k = PublicKey::from_spki_der(&no_null).unwrap();
        assert_eq!(k.kind(), KeyKind::Rsa);
        let sig = fixture!("msg.rsa-pss-sha256.sig");
        let auth = wrap(&SigScheme::RsaPssSha256.algorithm_identifier(), sig);
        assert_eq!(k.verify_auth(&auth, MSG), Ok(SigScheme::RsaPssSha256));
    }

    #[test]
    fn private_key_debug_shows_no_key_material() {
        let k = key(fixture!("p256.key"));
        assert_eq!(format!("{k:?}"), "PrivateKey { kind: EcdsaP256, .. }");
    }

    #[test]
    fn hash_algorithm_notify_data() {
        assert_eq!(supported_hash_algorithms(), vec![2, 3, 4, 5]);
        let data = encode_hash_algorithms(&supported_hash_algorithms());
        assert_eq!(data, [0, 2, 0, 3, 0, 4, 0, 5]);
        assert_eq!(decode_hash_algorithms(&data), Ok(vec![2, 3, 4, 5]));
        assert_eq!(
            decode_hash_algorithms(&[0, 1, 0x12, 0x34]),
            Ok(vec![1, 0x1234])
        );
        assert_eq!(decode_hash_algorithms(&[]), Ok(vec![]));
        assert!(decode_hash_algorithms(&[0, 2, 0]).is_err());
    }

    #[test]
    fn scheme_choice_follows_the_peers_hash_algorithms() {
        let ed = key(fixture!("ed25519.key"));
        let p384 = key(fixture!("p384.key"));
        let rsa = key(fixture!("rsa2048.key"));
        assert_eq!(ed.choose_scheme(&[2, 3, 4]), None);
        assert_eq!(ed.choose_scheme(&[2, 5]), Some(SigScheme::Ed25519));
        assert_eq!(p384.choose_scheme(&[2]), None);
        assert_eq!(p384.choose_scheme(&[3, 4]), Some(SigScheme::EcdsaSha384));
        assert_eq!(rsa.choose_scheme(&[4, 3]), Some(SigScheme::RsaPssSha384));
        assert_eq!(rsa.choose_scheme(&[1]), None);
        for s in ALL_SCHEMES {
            assert!(supported_hash_algorithms().contains(&s.hash_algorithm()));
        }
    }

    #[test]
    fn psk_generation() {
        use base64ct::{Base64, Encoding};
        let a = generate_psk().unwrap();
        let b = generate_psk().unwrap();
        assert_eq!(a.len(), 44);
        assert_ne!(*a, *b);
        let mut raw = [0u8; 32];
        assert_eq!(Base64::decode(a.as_bytes(), &mut raw).unwrap().len(), 32);
    }

    #[test]
    fn pem_skips_other_blocks_and_text() {
        let mut text = b"Bag Attributes\n    friendlyName: x\n".to_vec();
        text.extend_from_slice(
            b"-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n",
        );
        text.extend_from_slice(fixture!("p256.key"));
        let k = PrivateKey::from_pem(&text).unwrap();
        assert_eq!(k.public_key(), public(fixture!("p256.pub")));
        // CRLF line ends.
        let crlf: Vec<u8> = fixture!("ed25519.pub")
            .iter()
            .flat_map(|&b| {
                if b == b'\n' {
                    vec![b'\r', b'\n']
                } else {
                    vec![b]
                }
            })
            .collect();
        assert_eq!(public(&crlf), public(fixture!("ed25519.pub")));
    }

    /// Our signatures and PKCS#8 export checked by the openssl CLI; skipped
    /// when openssl is not installed.
    #[test]
    fn openssl_verifies_our_signatures() {
        use std::process::Command;
        if Command::new("openssl").arg("version").output().is_err() {
            eprintln!("openssl not found; skipping");
            return;
        }
        let dir = std::env::temp_dir().join(format!("espgate-sig-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = |n: &str| dir.join(n).to_str().unwrap().to_owned();
        let msg_file = path("msg");
        std::fs::write(&msg_file, MSG).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("openssl").args(args).output().unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        let cases: [(KeyKind, SigScheme, &[&str]); 5] = [
            (KeyKind::EcdsaP256, SigScheme::EcdsaSha256, &["-sha256"]),
            (KeyKind::EcdsaP384, SigScheme::EcdsaSha384, &["-sha384"]),
            (
                KeyKind::Rsa,
                SigScheme::RsaPssSha256,
                &[
                    "-sha256",
                    "-sigopt",
                    "rsa_padding_mode:pss",
                    "-sigopt",
                    "rsa_pss_saltlen:32",
                ],
            ),
            (
                KeyKind::Rsa,
                SigScheme::RsaPssSha512,
                &[
                    "-sha512",
                    "-sigopt",
                    "rsa_padding_mode:pss",
                    "-sigopt",
                    "rsa_pss_saltlen:64",
                ],
            ),
            (KeyKind::Rsa, SigScheme::RsaPkcs1Sha384, &["-sha384"]),
        ];
        let rsa = key(fixture!("rsa2048.key"));
        for (i, (kind, scheme, opts)) in cases.iter().enumerate() {
            let generated;
            let k = if *kind == KeyKind::Rsa {
                &rsa
            } else {
                generated = PrivateKey::generate(*kind).unwrap();
                &generated
            };
            // openssl reads our PKCS#8 export and derives the same public key.
            let key_file = path(&format!("key{i}.pem"));
            std::fs::write(&key_file, k.to_pkcs8_pem().unwrap().as_bytes()).unwrap();
            let (ok, pub_pem) = run(&["pkey", "-in", &key_file, "-pubout"]);
            assert!(ok);
            assert_eq!(public(pub_pem.as_bytes()), k.public_key());
            let auth = k.sign_auth(Some(*scheme), MSG).unwrap();
            let sig_file = path(&format!("sig{i}"));
            std::fs::write(&sig_file, sig_part(&auth)).unwrap();
            let pub_file = path(&format!("pub{i}.pem"));
            std::fs::write(&pub_file, &pub_pem).unwrap();
            let mut args = vec!["dgst"];
            args.extend_from_slice(opts);
            args.extend_from_slice(&["-verify", &pub_file, "-signature", &sig_file, &msg_file]);
            let (ok, out) = run(&args);
            assert!(ok && out.contains("Verified OK"), "{scheme}: {out}");
        }
        // Ed25519 through pkeyutl.
        let ed = PrivateKey::generate(KeyKind::Ed25519).unwrap();
        let key_file = path("ed.pem");
        std::fs::write(&key_file, ed.to_pkcs8_pem().unwrap().as_bytes()).unwrap();
        let auth = ed.sign_auth(None, MSG).unwrap();
        std::fs::write(path("ed.sig"), sig_part(&auth)).unwrap();
        let (ok, out) = run(&[
            "pkeyutl",
            "-verify",
            "-inkey",
            &key_file,
            "-rawin",
            "-in",
            &msg_file,
            "-sigfile",
            &path("ed.sig"),
        ]);
        assert!(
            ok && out.contains("Signature Verified Successfully"),
            "{out}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = PrivateKey::from_der(&data);
            let _ = PublicKey::from_spki_der(&data);
            let _ = SigScheme::parse_algorithm_identifier(&data);
            let _ = decode_hash_algorithms(&data);
            let _ = PrivateKey::from_pem(&data);
            let _ = PublicKey::from_pem(&data);
            let _ = der::oid_to_string(&data);
            let pk = public(fixture!("p256.pub"));
            let _ = pk.verify_auth(&data, MSG);
            let _ = pk.verify_legacy(9, &data, MSG);
        }

        #[test]
        fn mutated_auth_data_never_verifies(pos in 0usize..400, bit in 0u8..8) {
            let rsa = public(fixture!("rsa2048.pub"));
            let auth = wrap(&SigScheme::RsaPssSha256.algorithm_identifier(), fixture!("msg.rsa-pss-sha256.sig"));
            let mut bad = auth.clone();
            let pos = pos % bad.len();
            bad[pos] ^= 1 << bit;
            proptest::prop_assert!(rsa.verify_auth(&bad, MSG).is_err());
        }
    }
}
