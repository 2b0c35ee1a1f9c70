//! Suite names and parameters.

use core::fmt;
use std::str::FromStr;

/// Encryption (or combined-mode) algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Enc {
    /// RFC 2410 NULL encryption: integrity only, for measurements.
    Null,
    /// AES-CBC (RFC 3602) with a 128, 192 or 256-bit key.
    AesCbc(u16),
    /// AES-GCM with a 16-byte ICV (RFC 4106), 128 or 256-bit key.
    AesGcm16(u16),
    /// ChaCha20-Poly1305 (RFC 7634).
    ChaCha20Poly1305,
    /// AES-GMAC, authentication only (RFC 4543), 128 or 256-bit key.
    AesGmac(u16),
    /// Triple DES in CBC mode (RFC 2451). Legacy.
    TripleDes,
    /// Single DES in CBC mode (RFC 2405). Legacy and broken.
    Des,
}

/// Integrity algorithm (not used with combined-mode `Enc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Integ {
    /// HMAC-MD5-96 (RFC 2403). Legacy.
    Md5,
    /// HMAC-SHA1-96 (RFC 2404).
    Sha1,
    /// HMAC-SHA2-256-128 (RFC 4868).
    Sha256,
    /// HMAC-SHA2-384-192 (RFC 4868).
    Sha384,
    /// HMAC-SHA2-512-256 (RFC 4868).
    Sha512,
    /// AES-XCBC-MAC-96 (RFC 3566).
    AesXcbc,
}

/// A parsed suite: encryption and/or integrity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Suite {
    /// Encryption; `None` for an AH suite.
    pub enc: Option<Enc>,
    /// Integrity; `None` for combined-mode (AEAD and GMAC) suites.
    pub integ: Option<Integ>,
}

/// Why a suite name or key was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuiteError {
    /// The keyword is not one we know.
    Unknown(String),
    /// The combination makes no sense or is unsafe without integrity.
    Invalid(String),
    /// A legacy algorithm was named without `allow_insecure`.
    Insecure(String),
    /// Wrong key length.
    KeyLength {
        /// "encryption" or "integrity".
        which: &'static str,
        /// Bytes expected.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// The cipher library refused the key (for example a weak DES key).
    BadKey(&'static str),
}

impl fmt::Display for SuiteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SuiteError::Unknown(s) => write!(
                f,
                "unknown suite keyword '{s}' (known: aes128gcm16, aes256gcm16, chacha20poly1305, \
                 aes128gmac, aes256gmac, aes128|aes192|aes256|null|3des|des with \
                 -sha1|-sha256|-sha384|-sha512|-aesxcbc|-md5)"
            ),
            SuiteError::Invalid(s) => f.write_str(s),
            SuiteError::Insecure(s) => write!(
                f,
                "{s} is insecure and kept only to reproduce old measurements; \
                 set allow_insecure to use it"
            ),
            SuiteError::KeyLength {
                which,
                expected,
                got,
            } => write!(
                f,
                "{which} key must be {expected} bytes ({} hex digits), got {got} bytes",
                expected * 2
            ),
            SuiteError::BadKey(s) => write!(f, "key refused by the cipher: {s}"),
        }
    }
}

impl std::error::Error for SuiteError {}

/// An encryption algorithm by its strongSwan keyword (`aes128gcm16`,
/// `aes256`, `chacha20poly1305`, …); `None` for an unknown word.
pub fn parse_enc(s: &str) -> Option<Enc> {
    Some(match s {
        "null" => Enc::Null,
        "aes128" | "aes128cbc" => Enc::AesCbc(128),
        "aes192" | "aes192cbc" => Enc::AesCbc(192),
        "aes256" | "aes256cbc" | "aes" => Enc::AesCbc(256),
        "aes128gcm16" | "aes128gcm128" => Enc::AesGcm16(128),
        "aes256gcm16" | "aes256gcm128" => Enc::AesGcm16(256),
        "chacha20poly1305" => Enc::ChaCha20Poly1305,
        "aes128gmac" => Enc::AesGmac(128),
        "aes256gmac" => Enc::AesGmac(256),
        "3des" => Enc::TripleDes,
        "des" => Enc::Des,
        _ => return None,
    })
}

/// An integrity algorithm by its strongSwan keyword (`sha256`, `sha1`,
/// `aesxcbc`, …); `None` for an unknown word.
pub fn parse_integ(s: &str) -> Option<Integ> {
    Some(match s {
        "md5" | "md5_96" => Integ::Md5,
        "sha1" | "sha" | "sha1_96" => Integ::Sha1,
        "sha256" | "sha2_256" => Integ::Sha256,
        "sha384" | "sha2_384" => Integ::Sha384,
        "sha512" | "sha2_512" => Integ::Sha512,
        "aesxcbc" => Integ::AesXcbc,
        _ => return None,
    })
}

impl FromStr for Suite {
    type Err = SuiteError;

    /// Parses `ENC`, `ENC-INTEG` (ESP) or `INTEG` (AH), e.g. `aes128gcm16`,
    /// `aes256-sha256`, `null-sha1`, `sha256`.
    fn from_str(s: &str) -> Result<Self, SuiteError> {
        let lower = s.trim().to_ascii_lowercase();
        let parts: Vec<&str> = lower.split('-').collect();
        let suite = match parts.as_slice() {
            [one] => match (parse_enc(one), parse_integ(one)) {
                (Some(enc), _) => Suite {
                    enc: Some(enc),
                    integ: None,
                },
                (None, Some(integ)) => Suite {
                    enc: None,
                    integ: Some(integ),
                },
                _ => return Err(SuiteError::Unknown(one.to_string())),
            },
            [e, i] => {
                let enc = parse_enc(e).ok_or_else(|| SuiteError::Unknown(e.to_string()))?;
                let integ = parse_integ(i).ok_or_else(|| SuiteError::Unknown(i.to_string()))?;
                Suite {
                    enc: Some(enc),
                    integ: Some(integ),
                }
            }
            _ => return Err(SuiteError::Unknown(s.to_string())),
        };
        if let Some(enc) = suite.enc {
            if enc.is_combined() && suite.integ.is_some() {
                return Err(SuiteError::Invalid(format!(
                    "{} already authenticates; do not add an integrity algorithm",
                    enc.name()
                )));
            }
            if enc == Enc::Null && suite.integ.is_none() {
                return Err(SuiteError::Invalid(
                    "null encryption needs an integrity algorithm (e.g. null-sha256)".into(),
                ));
            }
        }
        Ok(suite)
    }
}

impl Enc {
    /// strongSwan keyword.
    pub fn name(self) -> &'static str {
        match self {
            Enc::Null => "null",
            Enc::AesCbc(128) => "aes128",
            Enc::AesCbc(192) => "aes192",
            Enc::AesCbc(_) => "aes256",
            Enc::AesGcm16(128) => "aes128gcm16",
            Enc::AesGcm16(_) => "aes256gcm16",
            Enc::ChaCha20Poly1305 => "chacha20poly1305",
            Enc::AesGmac(128) => "aes128gmac",
            Enc::AesGmac(_) => "aes256gmac",
            Enc::TripleDes => "3des",
            Enc::Des => "des",
        }
    }

    /// AEAD or GMAC: authenticates by itself.
    pub fn is_combined(self) -> bool {
        matches!(
            self,
            Enc::AesGcm16(_) | Enc::ChaCha20Poly1305 | Enc::AesGmac(_)
        )
    }

    /// Key bytes including the 4-byte salt of combined modes.
    pub fn key_len(self) -> usize {
        match self {
            Enc::Null => 0,
            Enc::AesCbc(bits) => usize::from(bits) / 8,
            Enc::AesGcm16(bits) | Enc::AesGmac(bits) => usize::from(bits) / 8 + 4,
            Enc::ChaCha20Poly1305 => 36,
            Enc::TripleDes => 24,
            Enc::Des => 8,
        }
    }

    /// Explicit IV carried in each packet.
    pub fn iv_len(self) -> usize {
        match self {
            Enc::Null => 0,
            Enc::AesCbc(_) => 16,
            Enc::TripleDes | Enc::Des => 8,
            Enc::AesGcm16(_) | Enc::ChaCha20Poly1305 | Enc::AesGmac(_) => 8,
        }
    }

    /// Alignment of payload + padding + trailer (at least 4).
    pub fn block_len(self) -> usize {
        match self {
            Enc::AesCbc(_) => 16,
            Enc::TripleDes | Enc::Des => 8,
            _ => 4,
        }
    }

    /// Legacy algorithm needing `allow_insecure`.
    pub fn is_insecure(self) -> bool {
        matches!(self, Enc::TripleDes | Enc::Des)
    }
}

impl Integ {
    /// strongSwan keyword.
    pub fn name(self) -> &'static str {
        match self {
            Integ::Md5 => "md5",
            Integ::Sha1 => "sha1",
            Integ::Sha256 => "sha256",
            Integ::Sha384 => "sha384",
            Integ::Sha512 => "sha512",
            Integ::AesXcbc => "aesxcbc",
        }
    }

    /// Key length in bytes.
    pub fn key_len(self) -> usize {
        match self {
            Integ::Md5 => 16,
            Integ::Sha1 => 20,
            Integ::Sha256 => 32,
            Integ::Sha384 => 48,
            Integ::Sha512 => 64,
            Integ::AesXcbc => 16,
        }
    }

    /// Truncated ICV length in bytes.
    pub fn icv_len(self) -> usize {
        match self {
            Integ::Md5 | Integ::Sha1 | Integ::AesXcbc => 12,
            Integ::Sha256 => 16,
            Integ::Sha384 => 24,
            Integ::Sha512 => 32,
        }
    }

    /// Legacy algorithm needing `allow_insecure`.
    pub fn is_insecure(self) -> bool {
        matches!(self, Integ::Md5)
    }
}

impl Suite {
    /// Canonical name (`aes128-sha256`, `aes128gcm16`, `sha1`).
    pub fn name(&self) -> String {
        match (self.enc, self.integ) {
            (Some(e), Some(i)) => format!("{}-{}", e.name(), i.name()),
            (Some(e), None) => e.name().to_string(),
            (None, Some(i)) => i.name().to_string(),
            (None, None) => "none".to_string(),
        }
    }

    /// Length of the ICV appended to each packet.
    pub fn icv_len(&self) -> usize {
        match (self.enc, self.integ) {
            (Some(e), _) if e.is_combined() => 16,
            (_, Some(i)) => i.icv_len(),
            _ => 0,
        }
    }

    /// Explicit IV length.
    pub fn iv_len(&self) -> usize {
        self.enc.map_or(0, Enc::iv_len)
    }

    /// Padding alignment.
    pub fn block_len(&self) -> usize {
        self.enc.map_or(4, Enc::block_len)
    }

    /// The alignment espgate pads its encrypted ESP and Q-ESP bodies
    /// (payload, padding, trailer) to on output: the cipher's block, and
    /// whole AES blocks for AES-GCM ([`super::AES_GCM_PAD_ALIGN`]).
    pub fn pad_align(&self) -> usize {
        match self.enc {
            Some(Enc::AesGcm16(_)) => super::AES_GCM_PAD_ALIGN,
            _ => self.block_len(),
        }
    }

    /// Encryption key length (salt included).
    pub fn enc_key_len(&self) -> usize {
        self.enc.map_or(0, Enc::key_len)
    }

    /// Integrity key length.
    pub fn integ_key_len(&self) -> usize {
        self.integ.map_or(0, Integ::key_len)
    }

    /// True when the suite provides no integrity (CBC without a MAC).
    pub fn lacks_integrity(&self) -> bool {
        self.integ.is_none() && !self.enc.is_some_and(Enc::is_combined)
    }

    /// Refuses legacy or unauthenticated suites unless `allow_insecure`.
    pub fn check_policy(&self, allow_insecure: bool) -> Result<(), SuiteError> {
        if allow_insecure {
            return Ok(());
        }
        if let Some(e) = self.enc.filter(|e| e.is_insecure()) {
            return Err(SuiteError::Insecure(format!("{} encryption", e.name())));
        }
        if let Some(i) = self.integ.filter(|i| i.is_insecure()) {
            return Err(SuiteError::Insecure(format!(
                "HMAC-{}",
                i.name().to_uppercase()
            )));
        }
        if self.lacks_integrity() {
            return Err(SuiteError::Insecure(format!(
                "{} without an integrity algorithm",
                self.name()
            )));
        }
        Ok(())
    }

    /// Every suite the core implements, for tests, benchmarks and `--help`.
    pub fn all() -> Vec<Suite> {
        let mut v: Vec<Suite> = [
            "aes128gcm16",
            "aes256gcm16",
            "chacha20poly1305",
            "aes128gmac",
            "aes256gmac",
        ]
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
        for e in ["aes128", "aes192", "aes256", "null", "3des", "des"] {
            for i in ["sha1", "sha256", "sha384", "sha512", "aesxcbc", "md5"] {
                if let Ok(s) = format!("{e}-{i}").parse() {
                    v.push(s);
                }
            }
        }
        v
    }
}

impl fmt::Display for Suite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_strongswan_keywords() {
        let s: Suite = "aes128gcm16".parse().unwrap();
        assert_eq!(s.enc, Some(Enc::AesGcm16(128)));
        assert_eq!((s.enc_key_len(), s.iv_len(), s.icv_len()), (20, 8, 16));
        let s: Suite = "AES256-SHA256".parse().unwrap();
        assert_eq!(
            (
                s.enc_key_len(),
                s.integ_key_len(),
                s.icv_len(),
                s.block_len()
            ),
            (32, 32, 16, 16)
        );
        let s: Suite = "sha1".parse().unwrap();
        assert_eq!((s.enc, s.integ), (None, Some(Integ::Sha1)));
        assert!("aes128gcm16-sha1".parse::<Suite>().is_err());
        assert!("null".parse::<Suite>().is_err());
        assert!("rot13".parse::<Suite>().is_err());
        assert_eq!(Suite::all().len(), 5 + 6 * 6);
        for s in Suite::all() {
            assert_eq!(s.name().parse::<Suite>().unwrap(), s);
        }
    }

    #[test]
    fn legacy_needs_allow_insecure() {
        for name in ["3des-sha1", "des-sha1", "aes128-md5", "aes128"] {
            let s: Suite = name.parse().unwrap();
            let err = s.check_policy(false).unwrap_err();
            assert!(matches!(err, SuiteError::Insecure(_)), "{name}");
            assert!(err.to_string().contains("allow_insecure"));
            assert!(s.check_policy(true).is_ok());
        }
        assert!("aes128-sha1"
            .parse::<Suite>()
            .unwrap()
            .check_policy(false)
            .is_ok());
    }
}
