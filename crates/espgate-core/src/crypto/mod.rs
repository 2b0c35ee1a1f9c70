//! Cipher suites, named by strongSwan proposal keywords, and the keyed
//! transform that seals and opens an ESP body in place.
//!
//! The transform knows nothing about header layout: callers pass the
//! authenticated header bytes and the AEAD additional data (see
//! [`AuthCtx`]), so ESP and later Q-ESP share it.

mod cipher;
mod gcm;
mod mac;
mod suite;

pub use cipher::{Transform, AES_GCM_PAD_ALIGN};
pub use gcm::{GcmImpl, GcmKey};
pub use mac::Mac;
pub use suite::{parse_enc, parse_integ};
pub use suite::{Enc, Integ, Suite, SuiteError};

/// What the transform authenticates besides the bytes it encrypts.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuthCtx<'a> {
    /// AEAD additional authenticated data (RFC 4106 §5: SPI, [Seq high], Seq low).
    pub aad: &'a [u8],
    /// Bytes authenticated before the packet by non-AEAD integrity (none for ESP).
    pub mac_prefix: &'a [u8],
    /// Bytes authenticated after the packet by non-AEAD integrity
    /// (ESP with ESN: the high 32 bits of the sequence number, RFC 4303 §2.2.1).
    pub mac_suffix: &'a [u8],
}
