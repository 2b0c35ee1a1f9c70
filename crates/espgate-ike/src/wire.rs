//! IKEv2 message codec (RFC 7296 §3, RFC 7383 §2.5).
//!
//! ```text
//! IKE header (28 bytes):
//! | IKE SA Initiator's SPI (8) | IKE SA Responder's SPI (8) |
//! | Next Payload (1) | MjVer|MnVer (1) | Exchange Type (1) | Flags (1) |
//! | Message ID (4) | Length (4) |
//! Generic payload header (4 bytes), then the payload body:
//! | Next Payload (1) | C|RESERVED (1) | Payload Length (2) |
//! ```
//!
//! [`Message::parse`] checks, before anything is trusted: the header length
//! equals the datagram length; the major version is 2; every payload length is
//! at least 4 and within the message; the chain ends exactly at the end of the
//! message; at most [`MAX_PAYLOADS`] payloads; an SK/SKF payload is the last
//! one; proposal and transform "last substructure" markers, counts and lengths
//! agree; attributes, traffic selectors, notify SPIs and delete SPI lists fill
//! their payloads exactly. Reserved fields and reserved flag bits are ignored
//! on receipt and written as zero (RFC 7296 §3.1). Nesting is bounded: the
//! only nested structure is SA → proposal → transform → attribute, and an
//! SK payload's inner chain (parsed after decryption with
//! [`parse_payload_chain`]) may not contain another SK/SKF.
//!
//! Unknown payload types are kept as [`Payload::Unknown`] with their critical
//! bit; [`Message::unsupported_critical`] gives the type to report in an
//! `UNSUPPORTED_CRITICAL_PAYLOAD` notify (RFC 7296 §2.5). The Configuration
//! (CP) and EAP payloads are not decoded yet and are carried the same way.

use core::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use espgate_core::wire::{be16, be32};

/// Length of the fixed IKE header.
pub const HEADER_LEN: usize = 28;
/// Length of the generic payload header.
pub const PAYLOAD_HEADER_LEN: usize = 4;
/// Most payloads accepted in one chain (a message or a decrypted SK body).
pub const MAX_PAYLOADS: usize = 64;
/// The critical bit in the generic payload header's second byte.
pub const CRITICAL: u8 = 0x80;

/// Why an IKE message could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IkeError {
    /// Fewer bytes than the structure being read needs.
    Truncated,
    /// The header's Length field differs from the datagram length.
    LengthMismatch {
        /// Value of the Length field.
        header: u32,
        /// Bytes actually received.
        datagram: usize,
    },
    /// Major version other than 2 (answer with INVALID_MAJOR_VERSION).
    UnsupportedMajorVersion(u8),
    /// A payload length is below its minimum or runs past the enclosing data.
    BadPayloadLength(u8),
    /// The payload chain ended before the end of the data.
    TrailingBytes,
    /// More than [`MAX_PAYLOADS`] payloads.
    TooManyPayloads,
    /// An SK/SKF payload is not the last payload, or is nested in another.
    MisplacedEncrypted,
    /// An SA payload with no proposal, or an inconsistent proposal.
    BadProposal,
    /// A transform's length, last marker or count is inconsistent.
    BadTransform,
    /// A transform attribute runs past its transform.
    BadAttribute,
    /// A traffic selector's length or count is inconsistent.
    BadTrafficSelector,
    /// A Notify SPI runs past its payload.
    BadNotify,
    /// A Delete payload's protocol, SPI size and SPI count disagree.
    BadDelete,
    /// An SKF fragment number is 0 or above the total.
    BadFragment,
    /// On emit: a field does not fit its length field (payload over 64 KiB,
    /// SPI over 255 bytes, more than 255 transforms or selectors…).
    TooBig,
    /// On emit: a value that cannot be encoded (an unknown payload using a
    /// known or zero type, an attribute type with the AF bit, a selector body
    /// of the wrong length…).
    Unencodable,
}

impl fmt::Display for IkeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for IkeError {}

/// Result of IKE parsing and emitting.
pub type IkeResult<T> = Result<T, IkeError>;

/// A registry of IANA codepoints as an enum: one variant per value this
/// codec knows, `Unknown` for any other, converted both ways without loss.
/// Equality and hashing are by value, so `Unknown(n)` of a known `n`
/// equals its variant.
macro_rules! codepoint {
    (
        $(#[$meta:meta])*
        $name:ident: $ty:ty {
            $( $(#[doc = $doc:literal])* $variant:ident = $value:literal => $text:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy)]
        pub enum $name {
            $( $(#[doc = $doc])* $variant, )*
            /// A value without a variant here.
            Unknown($ty),
        }

        impl From<$ty> for $name {
            fn from(v: $ty) -> Self {
                match v {
                    $( $value => $name::$variant, )*
                    other => $name::Unknown(other),
                }
            }
        }

        impl From<$name> for $ty {
            fn from(v: $name) -> $ty {
                match v {
                    $( $name::$variant => $value, )*
                    $name::Unknown(other) => other,
                }
            }
        }

        impl $name {
            /// The registry's name, for a known value.
            pub fn as_str(self) -> Option<&'static str> {
                match <$ty>::from(self) {
                    $( $value => Some($text), )*
                    _ => None,
                }
            }
        }

        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                <$ty>::from(*self) == <$ty>::from(*other)
            }
        }

        impl Eq for $name {}

        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                <$ty>::from(*self).hash(state);
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.as_str() {
                    Some(t) => f.write_str(t),
                    None => write!(f, "{}", <$ty>::from(*self)),
                }
            }
        }
    };
}

codepoint! {
    /// Exchange types (RFC 7296 §3.1).
    ExchangeType: u8 {
    /// IKE_SA_INIT.
    IkeSaInit = 34 => "IKE_SA_INIT",
    /// IKE_AUTH.
    IkeAuth = 35 => "IKE_AUTH",
    /// CREATE_CHILD_SA.
    CreateChildSa = 36 => "CREATE_CHILD_SA",
    /// INFORMATIONAL.
    Informational = 37 => "INFORMATIONAL",
    }
}

codepoint! {
    /// Payload types (RFC 7296 §3.2, RFC 7383 §2.5), named as RFC 7296
    /// writes them in exchange diagrams.
    PayloadType: u8 {
    /// No next payload.
    NoNext = 0 => "NO_NEXT_PAYLOAD",
    /// Security Association.
    Sa = 33 => "SA",
    /// Key Exchange.
    Ke = 34 => "KE",
    /// Identification - Initiator.
    IdI = 35 => "IDi",
    /// Identification - Responder.
    IdR = 36 => "IDr",
    /// Certificate.
    Cert = 37 => "CERT",
    /// Certificate Request.
    CertReq = 38 => "CERTREQ",
    /// Authentication.
    Auth = 39 => "AUTH",
    /// Nonce.
    Nonce = 40 => "Nonce",
    /// Notify.
    Notify = 41 => "N",
    /// Delete.
    Delete = 42 => "D",
    /// Vendor ID.
    VendorId = 43 => "V",
    /// Traffic Selector - Initiator.
    TsI = 44 => "TSi",
    /// Traffic Selector - Responder.
    TsR = 45 => "TSr",
    /// Encrypted and Authenticated.
    Sk = 46 => "SK",
    /// Configuration (not decoded: carried as an unknown payload).
    Cp = 47 => "CP",
    /// Extensible Authentication (not decoded: carried as an unknown payload).
    Eap = 48 => "EAP",
    /// Encrypted and Authenticated Fragment (RFC 7383).
    Skf = 53 => "SKF",
    }
}

/// Protocol IDs in proposals, notifies and deletes.
pub mod protocol {
    /// IKE.
    pub const IKE: u8 = 1;
    /// AH.
    pub const AH: u8 = 2;
    /// ESP.
    pub const ESP: u8 = 3;
    /// Q-ESP (`docs/QESP.md` §7): the first value RFC 7296 §3.3.1
    /// reserves for private use; an ESP-like child SA with 4-byte SPIs.
    pub const QESP: u8 = 201;

    /// A child SA protocol whose SPIs are 4 bytes (AH, ESP, Q-ESP).
    pub const fn is_child(p: u8) -> bool {
        matches!(p, AH | ESP | QESP)
    }
}

/// Transform types (RFC 7296 §3.3.2).
pub mod transform_type {
    /// Encryption algorithm.
    pub const ENCR: u8 = 1;
    /// Pseudorandom function.
    pub const PRF: u8 = 2;
    /// Integrity algorithm.
    pub const INTEG: u8 = 3;
    /// Diffie-Hellman group (Key Exchange Method).
    pub const DH: u8 = 4;
    /// Extended sequence numbers.
    pub const ESN: u8 = 5;
}

/// Encryption transform IDs.
pub mod encr {
    /// 3DES.
    pub const TRIPLE_DES: u16 = 3;
    /// NULL.
    pub const NULL: u16 = 11;
    /// AES-CBC.
    pub const AES_CBC: u16 = 12;
    /// AES-CTR.
    pub const AES_CTR: u16 = 13;
    /// AES-CCM, 8-byte ICV.
    pub const AES_CCM_8: u16 = 14;
    /// AES-CCM, 12-byte ICV.
    pub const AES_CCM_12: u16 = 15;
    /// AES-CCM, 16-byte ICV.
    pub const AES_CCM_16: u16 = 16;
    /// AES-GCM, 8-byte ICV.
    pub const AES_GCM_8: u16 = 18;
    /// AES-GCM, 12-byte ICV.
    pub const AES_GCM_12: u16 = 19;
    /// AES-GCM, 16-byte ICV.
    pub const AES_GCM_16: u16 = 20;
    /// NULL encryption with AES-GMAC.
    pub const NULL_AUTH_AES_GMAC: u16 = 21;
    /// ChaCha20-Poly1305 (RFC 7634).
    pub const CHACHA20_POLY1305: u16 = 28;
}

/// Pseudorandom function transform IDs.
pub mod prf {
    /// HMAC-MD5.
    pub const HMAC_MD5: u16 = 1;
    /// HMAC-SHA1.
    pub const HMAC_SHA1: u16 = 2;
    /// AES128-XCBC.
    pub const AES128_XCBC: u16 = 4;
    /// HMAC-SHA2-256.
    pub const HMAC_SHA2_256: u16 = 5;
    /// HMAC-SHA2-384.
    pub const HMAC_SHA2_384: u16 = 6;
    /// HMAC-SHA2-512.
    pub const HMAC_SHA2_512: u16 = 7;
    /// AES128-CMAC.
    pub const AES128_CMAC: u16 = 8;
}

/// Integrity transform IDs.
pub mod integ {
    /// None (with AEAD ciphers).
    pub const NONE: u16 = 0;
    /// HMAC-MD5-96.
    pub const HMAC_MD5_96: u16 = 1;
    /// HMAC-SHA1-96.
    pub const HMAC_SHA1_96: u16 = 2;
    /// AES-XCBC-96.
    pub const AES_XCBC_96: u16 = 5;
    /// AES-CMAC-96.
    pub const AES_CMAC_96: u16 = 8;
    /// HMAC-SHA2-256-128.
    pub const HMAC_SHA2_256_128: u16 = 12;
    /// HMAC-SHA2-384-192.
    pub const HMAC_SHA2_384_192: u16 = 13;
    /// HMAC-SHA2-512-256.
    pub const HMAC_SHA2_512_256: u16 = 14;
}

/// Diffie-Hellman group (key exchange method) transform IDs.
pub mod dh {
    /// None.
    pub const NONE: u16 = 0;
    /// 1024-bit MODP.
    pub const MODP_1024: u16 = 2;
    /// 1536-bit MODP.
    pub const MODP_1536: u16 = 5;
    /// 2048-bit MODP.
    pub const MODP_2048: u16 = 14;
    /// 3072-bit MODP.
    pub const MODP_3072: u16 = 15;
    /// 4096-bit MODP.
    pub const MODP_4096: u16 = 16;
    /// 256-bit random ECP (P-256).
    pub const ECP_256: u16 = 19;
    /// 384-bit random ECP (P-384).
    pub const ECP_384: u16 = 20;
    /// 521-bit random ECP (P-521).
    pub const ECP_521: u16 = 21;
    /// Curve25519 (RFC 8031).
    pub const CURVE25519: u16 = 31;
    /// Curve448 (RFC 8031).
    pub const CURVE448: u16 = 32;
}

/// Extended sequence number transform IDs.
pub mod esn {
    /// No extended sequence numbers.
    pub const NO: u16 = 0;
    /// Extended sequence numbers.
    pub const YES: u16 = 1;
}

/// Transform attribute types (RFC 7296 §3.3.5).
pub mod attribute {
    /// Key Length in bits (always TV).
    pub const KEY_LENGTH: u16 = 14;
}

codepoint! {
    /// Notify message types (RFC 7296 §3.10.1, RFC 7383, RFC 7427). Types
    /// below 16384 are errors, the others status notifications.
    NotifyType: u16 {
    /// UNSUPPORTED_CRITICAL_PAYLOAD (data: the one-octet payload type).
    UnsupportedCriticalPayload = 1 => "UNSUPPORTED_CRITICAL_PAYLOAD",
    /// INVALID_IKE_SPI.
    InvalidIkeSpi = 4 => "INVALID_IKE_SPI",
    /// INVALID_MAJOR_VERSION.
    InvalidMajorVersion = 5 => "INVALID_MAJOR_VERSION",
    /// INVALID_SYNTAX.
    InvalidSyntax = 7 => "INVALID_SYNTAX",
    /// INVALID_MESSAGE_ID.
    InvalidMessageId = 9 => "INVALID_MESSAGE_ID",
    /// INVALID_SPI.
    InvalidSpi = 11 => "INVALID_SPI",
    /// NO_PROPOSAL_CHOSEN.
    NoProposalChosen = 14 => "NO_PROPOSAL_CHOSEN",
    /// INVALID_KE_PAYLOAD.
    InvalidKePayload = 17 => "INVALID_KE_PAYLOAD",
    /// AUTHENTICATION_FAILED.
    AuthenticationFailed = 24 => "AUTHENTICATION_FAILED",
    /// SINGLE_PAIR_REQUIRED.
    SinglePairRequired = 34 => "SINGLE_PAIR_REQUIRED",
    /// NO_ADDITIONAL_SAS.
    NoAdditionalSas = 35 => "NO_ADDITIONAL_SAS",
    /// INTERNAL_ADDRESS_FAILURE.
    InternalAddressFailure = 36 => "INTERNAL_ADDRESS_FAILURE",
    /// FAILED_CP_REQUIRED.
    FailedCpRequired = 37 => "FAILED_CP_REQUIRED",
    /// TS_UNACCEPTABLE.
    TsUnacceptable = 38 => "TS_UNACCEPTABLE",
    /// INVALID_SELECTORS.
    InvalidSelectors = 39 => "INVALID_SELECTORS",
    /// UNEXPECTED_NAT_DETECTED (RFC 4555): the peer said NO_NATS_ALLOWED,
    /// but its addresses were changed on the way.
    UnexpectedNatDetected = 41 => "UNEXPECTED_NAT_DETECTED",
    /// TEMPORARY_FAILURE.
    TemporaryFailure = 43 => "TEMPORARY_FAILURE",
    /// CHILD_SA_NOT_FOUND.
    ChildSaNotFound = 44 => "CHILD_SA_NOT_FOUND",
    /// TS_MAX_QUEUE (RFC 9611): no more child SAs with these selectors.
    TsMaxQueue = 48 => "TS_MAX_QUEUE",
    /// INITIAL_CONTACT.
    InitialContact = 16384 => "INITIAL_CONTACT",
    /// SET_WINDOW_SIZE.
    SetWindowSize = 16385 => "SET_WINDOW_SIZE",
    /// ADDITIONAL_TS_POSSIBLE.
    AdditionalTsPossible = 16386 => "ADDITIONAL_TS_POSSIBLE",
    /// IPCOMP_SUPPORTED.
    IpcompSupported = 16387 => "IPCOMP_SUPPORTED",
    /// NAT_DETECTION_SOURCE_IP.
    NatDetectionSourceIp = 16388 => "NAT_DETECTION_SOURCE_IP",
    /// NAT_DETECTION_DESTINATION_IP.
    NatDetectionDestinationIp = 16389 => "NAT_DETECTION_DESTINATION_IP",
    /// COOKIE.
    Cookie = 16390 => "COOKIE",
    /// USE_TRANSPORT_MODE.
    UseTransportMode = 16391 => "USE_TRANSPORT_MODE",
    /// HTTP_CERT_LOOKUP_SUPPORTED.
    HttpCertLookupSupported = 16392 => "HTTP_CERT_LOOKUP_SUPPORTED",
    /// REKEY_SA.
    RekeySa = 16393 => "REKEY_SA",
    /// ESP_TFC_PADDING_NOT_SUPPORTED.
    EspTfcPaddingNotSupported = 16394 => "ESP_TFC_PADDING_NOT_SUPPORTED",
    /// NON_FIRST_FRAGMENTS_ALSO.
    NonFirstFragmentsAlso = 16395 => "NON_FIRST_FRAGMENTS_ALSO",
    /// MOBIKE_SUPPORTED (RFC 4555): the sender can move the IKE SA and its
    /// child SAs to other addresses.
    MobikeSupported = 16396 => "MOBIKE_SUPPORTED",
    /// ADDITIONAL_IP4_ADDRESS (RFC 4555).
    AdditionalIp4Address = 16397 => "ADDITIONAL_IP4_ADDRESS",
    /// ADDITIONAL_IP6_ADDRESS (RFC 4555).
    AdditionalIp6Address = 16398 => "ADDITIONAL_IP6_ADDRESS",
    /// NO_ADDITIONAL_ADDRESSES (RFC 4555).
    NoAdditionalAddresses = 16399 => "NO_ADDITIONAL_ADDRESSES",
    /// UPDATE_SA_ADDRESSES (RFC 4555): move the SAs to the addresses this
    /// message came from and went to.
    UpdateSaAddresses = 16400 => "UPDATE_SA_ADDRESSES",
    /// COOKIE2 (RFC 4555): returned unchanged in the response, a return
    /// routability check.
    Cookie2 = 16401 => "COOKIE2",
    /// NO_NATS_ALLOWED (RFC 4555; data: the addresses and ports the sender
    /// used).
    NoNatsAllowed = 16402 => "NO_NATS_ALLOWED",
    /// IKEV2_FRAGMENTATION_SUPPORTED (RFC 7383).
    Ikev2FragmentationSupported = 16430 => "IKEV2_FRAGMENTATION_SUPPORTED",
    /// SIGNATURE_HASH_ALGORITHMS (RFC 7427).
    SignatureHashAlgorithms = 16431 => "SIGNATURE_HASH_ALGORITHMS",
    /// SA_RESOURCE_INFO (RFC 9611): this child SA is one of several with
    /// the same selectors, one per resource (here: per data-plane worker).
    SaResourceInfo = 16444 => "SA_RESOURCE_INFO",
    }
}

impl NotifyType {
    /// An error type (below 16384, RFC 7296 §3.10.1), not a status.
    pub fn is_error(self) -> bool {
        u16::from(self) < 16384
    }
}

/// Identification types (RFC 7296 §3.5).
pub mod id_type {
    /// A single IPv4 address.
    pub const IPV4_ADDR: u8 = 1;
    /// A fully-qualified domain name.
    pub const FQDN: u8 = 2;
    /// An RFC 822 e-mail address.
    pub const RFC822_ADDR: u8 = 3;
    /// A single IPv6 address.
    pub const IPV6_ADDR: u8 = 5;
    /// DER-encoded ASN.1 X.500 Distinguished Name.
    pub const DER_ASN1_DN: u8 = 9;
    /// DER-encoded ASN.1 X.509 GeneralName.
    pub const DER_ASN1_GN: u8 = 10;
    /// An opaque key identifier.
    pub const KEY_ID: u8 = 11;
}

/// Authentication methods (RFC 7296 §3.8, RFC 4754, RFC 7427).
pub mod auth_method {
    /// RSA digital signature (PKCS#1 v1.5 with SHA-1).
    pub const RSA_SIG: u8 = 1;
    /// Shared key message integrity code.
    pub const SHARED_KEY_MIC: u8 = 2;
    /// DSS digital signature.
    pub const DSS_SIG: u8 = 3;
    /// ECDSA with SHA-256 on P-256.
    pub const ECDSA_256: u8 = 9;
    /// ECDSA with SHA-384 on P-384.
    pub const ECDSA_384: u8 = 10;
    /// ECDSA with SHA-512 on P-521.
    pub const ECDSA_521: u8 = 11;
    /// Digital signature (RFC 7427).
    pub const DIGITAL_SIGNATURE: u8 = 14;
}

/// Certificate encodings (RFC 7296 §3.6, RFC 7670).
pub mod cert_encoding {
    /// X.509 certificate - signature.
    pub const X509_SIGNATURE: u8 = 4;
    /// Certificate revocation list.
    pub const CRL: u8 = 7;
    /// Hash and URL of an X.509 certificate.
    pub const HASH_URL_X509: u8 = 12;
    /// Raw public key (RFC 7670).
    pub const RAW_PUBLIC_KEY: u8 = 15;
}

/// Traffic selector types (RFC 7296 §3.13.1).
pub mod ts_type {
    /// IPv4 address range.
    pub const IPV4_ADDR_RANGE: u8 = 7;
    /// IPv6 address range.
    pub const IPV6_ADDR_RANGE: u8 = 8;
}

/// The fields of the IKE header a sender chooses; Next Payload and Length
/// are derived from the payloads on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// IKE SA initiator's SPI.
    pub spi_i: u64,
    /// IKE SA responder's SPI (0 in the first IKE_SA_INIT request).
    pub spi_r: u64,
    /// Minor version (the major version is always 2).
    pub minor_version: u8,
    /// Exchange type.
    pub exchange_type: ExchangeType,
    /// Initiator flag: set by the original initiator of the IKE SA.
    pub initiator: bool,
    /// Version flag: the sender can speak a higher major version.
    pub version: bool,
    /// Response flag.
    pub response: bool,
    /// Message ID.
    pub message_id: u32,
}

const FLAG_I: u8 = 0x08;
const FLAG_V: u8 = 0x10;
const FLAG_R: u8 = 0x20;

impl Header {
    /// Reads the fixed header only (no payload checks): what a dispatcher
    /// needs to find the IKE SA before the whole message is parsed. Returns
    /// the header, the first payload type and the Length field.
    pub fn parse(b: &[u8]) -> IkeResult<(Header, PayloadType, u32)> {
        if b.len() < HEADER_LEN {
            return Err(IkeError::Truncated);
        }
        let ver = b[17];
        if ver >> 4 != 2 {
            return Err(IkeError::UnsupportedMajorVersion(ver >> 4));
        }
        let flags = b[19];
        let h = Header {
            spi_i: u64::from_be_bytes(b[0..8].try_into().map_err(|_| IkeError::Truncated)?),
            spi_r: u64::from_be_bytes(b[8..16].try_into().map_err(|_| IkeError::Truncated)?),
            minor_version: ver & 0x0f,
            exchange_type: ExchangeType::from(b[18]),
            initiator: flags & FLAG_I != 0,
            version: flags & FLAG_V != 0,
            response: flags & FLAG_R != 0,
            message_id: be32(b, 20),
        };
        Ok((h, PayloadType::from(b[16]), be32(b, 24)))
    }

    fn emit(&self, out: &mut Vec<u8>, next_payload: PayloadType, length: u32) {
        out.extend_from_slice(&self.spi_i.to_be_bytes());
        out.extend_from_slice(&self.spi_r.to_be_bytes());
        out.push(u8::from(next_payload));
        out.push(0x20 | (self.minor_version & 0x0f));
        out.push(u8::from(self.exchange_type));
        let mut flags = 0;
        if self.initiator {
            flags |= FLAG_I;
        }
        if self.version {
            flags |= FLAG_V;
        }
        if self.response {
            flags |= FLAG_R;
        }
        out.push(flags);
        out.extend_from_slice(&self.message_id.to_be_bytes());
        out.extend_from_slice(&length.to_be_bytes());
    }
}

/// A transform attribute (RFC 7296 §3.3.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attribute {
    /// Type/Value form (AF bit set): a 16-bit value.
    Tv {
        /// Attribute type (15 bits, without the AF bit).
        attr_type: u16,
        /// Value.
        value: u16,
    },
    /// Type/Length/Value form (AF bit clear).
    Tlv {
        /// Attribute type (15 bits).
        attr_type: u16,
        /// Value bytes.
        value: Vec<u8>,
    },
}

/// A transform substructure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transform {
    /// Transform type (see [`transform_type`]).
    pub transform_type: u8,
    /// Transform ID (meaning depends on the type).
    pub id: u16,
    /// Attributes, in order.
    pub attributes: Vec<Attribute>,
}

impl Transform {
    /// A transform without attributes.
    pub fn new(transform_type: u8, id: u16) -> Self {
        Transform {
            transform_type,
            id,
            attributes: Vec::new(),
        }
    }

    /// A transform with a Key Length attribute (bits).
    pub fn with_key_length(transform_type: u8, id: u16, bits: u16) -> Self {
        Transform {
            transform_type,
            id,
            attributes: vec![Attribute::Tv {
                attr_type: attribute::KEY_LENGTH,
                value: bits,
            }],
        }
    }

    /// The Key Length attribute, if present.
    pub fn key_length(&self) -> Option<u16> {
        self.attributes.iter().find_map(|a| match a {
            Attribute::Tv { attr_type, value } if *attr_type == attribute::KEY_LENGTH => {
                Some(*value)
            }
            _ => None,
        })
    }
}

/// A proposal substructure of an SA payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// Proposal number (1 for the first proposal of an offer).
    pub number: u8,
    /// Protocol ID (see [`protocol`]).
    pub protocol: u8,
    /// SPI (empty in IKE_SA_INIT, 4 bytes for ESP/AH, 8 for IKE rekeying).
    pub spi: Vec<u8>,
    /// Transforms, in order.
    pub transforms: Vec<Transform>,
}

/// Identification payload body (IDi/IDr).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Id {
    /// ID type (see [`id_type`]).
    pub id_type: u8,
    /// Identification data.
    pub data: Vec<u8>,
}

/// Notify payload body (RFC 7296 §3.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notify {
    /// Protocol ID (0 when not about an SA).
    pub protocol: u8,
    /// SPI (empty when not about a child SA).
    pub spi: Vec<u8>,
    /// Notify message type.
    pub notify_type: NotifyType,
    /// Notification data.
    pub data: Vec<u8>,
}

/// Delete payload body (RFC 7296 §3.11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delete {
    /// Deletes the IKE SA of the message (protocol 1, SPI size 0, no SPIs).
    Ike,
    /// Deletes child SAs of an IPsec protocol (4-byte SPIs).
    Child {
        /// [`protocol::AH`], [`protocol::ESP`] or [`protocol::QESP`].
        protocol: u8,
        /// The SPIs, as the receiver of the deleting peer's packets uses them.
        spis: Vec<u32>,
    },
}

/// One traffic selector (RFC 7296 §3.13.1).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TrafficSelector {
    /// TS_IPV4_ADDR_RANGE.
    Ipv4 {
        /// IP protocol (0 = any).
        ip_protocol: u8,
        /// First port.
        start_port: u16,
        /// Last port.
        end_port: u16,
        /// First address.
        start: Ipv4Addr,
        /// Last address.
        end: Ipv4Addr,
    },
    /// TS_IPV6_ADDR_RANGE.
    Ipv6 {
        /// IP protocol (0 = any).
        ip_protocol: u8,
        /// First port.
        start_port: u16,
        /// Last port.
        end_port: u16,
        /// First address.
        start: Ipv6Addr,
        /// Last address.
        end: Ipv6Addr,
    },
    /// Any other selector type, kept raw.
    Other {
        /// TS type.
        ts_type: u8,
        /// The byte after the type (the IP protocol for address ranges).
        ip_protocol: u8,
        /// The bytes after the 4-byte selector header.
        body: Vec<u8>,
    },
}

/// One payload of a message, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Security Association: proposals (at least one).
    Sa(Vec<Proposal>),
    /// Key Exchange.
    Ke {
        /// Diffie-Hellman group number (see [`dh`]).
        group: u16,
        /// Key exchange data (public value).
        data: Vec<u8>,
    },
    /// Identification - Initiator.
    IdI(Id),
    /// Identification - Responder.
    IdR(Id),
    /// Certificate.
    Cert {
        /// Certificate encoding (see [`cert_encoding`]).
        encoding: u8,
        /// Certificate data.
        data: Vec<u8>,
    },
    /// Certificate Request.
    CertReq {
        /// Certificate encoding.
        encoding: u8,
        /// Certification authority data (concatenated SHA-1 key hashes).
        data: Vec<u8>,
    },
    /// Authentication.
    Auth {
        /// Authentication method (see [`auth_method`]).
        method: u8,
        /// Authentication data.
        data: Vec<u8>,
    },
    /// Nonce.
    Nonce(Vec<u8>),
    /// Notify.
    Notify(Notify),
    /// Delete.
    Delete(Delete),
    /// Vendor ID.
    VendorId(Vec<u8>),
    /// Traffic Selector - Initiator (at least one selector).
    TsI(Vec<TrafficSelector>),
    /// Traffic Selector - Responder (at least one selector).
    TsR(Vec<TrafficSelector>),
    /// Encrypted and Authenticated (always last).
    Sk {
        /// Type of the first payload inside (the SK's Next Payload field).
        first_payload: PayloadType,
        /// IV, ciphertext, padding and ICV, still encrypted.
        data: Vec<u8>,
    },
    /// Encrypted and Authenticated Fragment (RFC 7383; always last).
    Skf {
        /// Type of the first inner payload (fragment 1 only; 0 otherwise).
        first_payload: PayloadType,
        /// Fragment number, from 1.
        number: u16,
        /// Total number of fragments.
        total: u16,
        /// IV, ciphertext, padding and ICV of this fragment.
        data: Vec<u8>,
    },
    /// A payload this codec does not decode, with its critical bit.
    Unknown {
        /// Payload type.
        payload_type: PayloadType,
        /// Critical bit: a receiver that does not understand the type must
        /// reject the message with UNSUPPORTED_CRITICAL_PAYLOAD.
        critical: bool,
        /// Payload body (after the generic header).
        body: Vec<u8>,
    },
}

fn is_decoded_type(t: PayloadType) -> bool {
    matches!(u8::from(t), 33..=46 | 53)
}

impl Payload {
    /// The payload type.
    pub fn payload_type(&self) -> PayloadType {
        match self {
            Payload::Sa(_) => PayloadType::Sa,
            Payload::Ke { .. } => PayloadType::Ke,
            Payload::IdI(_) => PayloadType::IdI,
            Payload::IdR(_) => PayloadType::IdR,
            Payload::Cert { .. } => PayloadType::Cert,
            Payload::CertReq { .. } => PayloadType::CertReq,
            Payload::Auth { .. } => PayloadType::Auth,
            Payload::Nonce(_) => PayloadType::Nonce,
            Payload::Notify(_) => PayloadType::Notify,
            Payload::Delete(_) => PayloadType::Delete,
            Payload::VendorId(_) => PayloadType::VendorId,
            Payload::TsI(_) => PayloadType::TsI,
            Payload::TsR(_) => PayloadType::TsR,
            Payload::Sk { .. } => PayloadType::Sk,
            Payload::Skf { .. } => PayloadType::Skf,
            Payload::Unknown { payload_type, .. } => *payload_type,
        }
    }

    fn is_encrypted(&self) -> bool {
        matches!(self, Payload::Sk { .. } | Payload::Skf { .. })
    }

    fn parse_body(
        ptype: PayloadType,
        next: PayloadType,
        critical: bool,
        b: &[u8],
    ) -> IkeResult<Payload> {
        let short = |n: usize| {
            if b.len() < n {
                Err(IkeError::BadPayloadLength(u8::from(ptype)))
            } else {
                Ok(())
            }
        };
        Ok(match ptype {
            PayloadType::Sa => Payload::Sa(parse_proposals(b)?),
            PayloadType::Ke => {
                short(4)?;
                Payload::Ke {
                    group: be16(b, 0),
                    data: b[4..].to_vec(),
                }
            }
            PayloadType::IdI | PayloadType::IdR => {
                short(4)?;
                let id = Id {
                    id_type: b[0],
                    data: b[4..].to_vec(),
                };
                if ptype == PayloadType::IdI {
                    Payload::IdI(id)
                } else {
                    Payload::IdR(id)
                }
            }
            PayloadType::Cert | PayloadType::CertReq => {
                short(1)?;
                let (encoding, data) = (b[0], b[1..].to_vec());
                if ptype == PayloadType::Cert {
                    Payload::Cert { encoding, data }
                } else {
                    Payload::CertReq { encoding, data }
                }
            }
            PayloadType::Auth => {
                short(4)?;
                Payload::Auth {
                    method: b[0],
                    data: b[4..].to_vec(),
                }
            }
            PayloadType::Nonce => Payload::Nonce(b.to_vec()),
            PayloadType::Notify => {
                short(4)?;
                let spi_end = 4 + usize::from(b[1]);
                if spi_end > b.len() {
                    return Err(IkeError::BadNotify);
                }
                Payload::Notify(Notify {
                    protocol: b[0],
                    spi: b[4..spi_end].to_vec(),
                    notify_type: NotifyType::from(be16(b, 2)),
                    data: b[spi_end..].to_vec(),
                })
            }
            PayloadType::Delete => {
                short(4)?;
                let (proto, spi_size, num) = (b[0], b[1], usize::from(be16(b, 2)));
                let spis = &b[4..];
                match (proto, spi_size) {
                    (protocol::IKE, 0) if num == 0 && spis.is_empty() => {
                        Payload::Delete(Delete::Ike)
                    }
                    (p, 4) if protocol::is_child(p) && spis.len() == num * 4 => {
                        Payload::Delete(Delete::Child {
                            protocol: proto,
                            spis: spis.chunks_exact(4).map(|c| be32(c, 0)).collect(),
                        })
                    }
                    _ => return Err(IkeError::BadDelete),
                }
            }
            PayloadType::VendorId => Payload::VendorId(b.to_vec()),
            PayloadType::TsI => Payload::TsI(parse_selectors(b)?),
            PayloadType::TsR => Payload::TsR(parse_selectors(b)?),
            PayloadType::Sk => Payload::Sk {
                first_payload: next,
                data: b.to_vec(),
            },
            PayloadType::Skf => {
                short(4)?;
                let (number, total) = (be16(b, 0), be16(b, 2));
                if number == 0 || number > total {
                    return Err(IkeError::BadFragment);
                }
                Payload::Skf {
                    first_payload: next,
                    number,
                    total,
                    data: b[4..].to_vec(),
                }
            }
            _ => Payload::Unknown {
                payload_type: ptype,
                critical,
                body: b.to_vec(),
            },
        })
    }

    fn emit_body(&self, out: &mut Vec<u8>) -> IkeResult<()> {
        match self {
            Payload::Sa(props) => emit_proposals(props, out)?,
            Payload::Ke { group, data } => {
                out.extend_from_slice(&group.to_be_bytes());
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(data);
            }
            Payload::IdI(id) | Payload::IdR(id) => {
                out.extend_from_slice(&[id.id_type, 0, 0, 0]);
                out.extend_from_slice(&id.data);
            }
            Payload::Cert { encoding, data } | Payload::CertReq { encoding, data } => {
                out.push(*encoding);
                out.extend_from_slice(data);
            }
            Payload::Auth { method, data } => {
                out.extend_from_slice(&[*method, 0, 0, 0]);
                out.extend_from_slice(data);
            }
            Payload::Nonce(d) | Payload::VendorId(d) => out.extend_from_slice(d),
            Payload::Notify(n) => {
                out.push(n.protocol);
                out.push(u8::try_from(n.spi.len()).map_err(|_| IkeError::TooBig)?);
                out.extend_from_slice(&u16::from(n.notify_type).to_be_bytes());
                out.extend_from_slice(&n.spi);
                out.extend_from_slice(&n.data);
            }
            Payload::Delete(Delete::Ike) => out.extend_from_slice(&[protocol::IKE, 0, 0, 0]),
            Payload::Delete(Delete::Child { protocol: p, spis }) => {
                if !protocol::is_child(*p) {
                    return Err(IkeError::Unencodable);
                }
                out.extend_from_slice(&[*p, 4]);
                let n = u16::try_from(spis.len()).map_err(|_| IkeError::TooBig)?;
                out.extend_from_slice(&n.to_be_bytes());
                for s in spis {
                    out.extend_from_slice(&s.to_be_bytes());
                }
            }
            Payload::TsI(ts) | Payload::TsR(ts) => emit_selectors(ts, out)?,
            Payload::Sk { data, .. } => out.extend_from_slice(data),
            Payload::Skf {
                number,
                total,
                data,
                ..
            } => {
                if *number == 0 || number > total {
                    return Err(IkeError::BadFragment);
                }
                out.extend_from_slice(&number.to_be_bytes());
                out.extend_from_slice(&total.to_be_bytes());
                out.extend_from_slice(data);
            }
            Payload::Unknown {
                payload_type, body, ..
            } => {
                if *payload_type == PayloadType::NoNext || is_decoded_type(*payload_type) {
                    return Err(IkeError::Unencodable);
                }
                out.extend_from_slice(body);
            }
        }
        Ok(())
    }
}

fn parse_proposals(mut b: &[u8]) -> IkeResult<Vec<Proposal>> {
    let mut out = Vec::new();
    if b.is_empty() {
        return Err(IkeError::BadProposal);
    }
    while !b.is_empty() {
        if b.len() < 8 {
            return Err(IkeError::BadProposal);
        }
        let last = b[0];
        let len = usize::from(be16(b, 2));
        if len < 8 || len > b.len() {
            return Err(IkeError::BadProposal);
        }
        // "Last Substruc" is 0 on the last proposal and 2 on every other one.
        let is_last = len == b.len();
        if last != if is_last { 0 } else { 2 } {
            return Err(IkeError::BadProposal);
        }
        let spi_end = 8 + usize::from(b[6]);
        if spi_end > len {
            return Err(IkeError::BadProposal);
        }
        let transforms = parse_transforms(&b[spi_end..len], b[7])?;
        out.push(Proposal {
            number: b[4],
            protocol: b[5],
            spi: b[8..spi_end].to_vec(),
            transforms,
        });
        b = &b[len..];
    }
    Ok(out)
}

fn parse_transforms(mut b: &[u8], count: u8) -> IkeResult<Vec<Transform>> {
    let mut out = Vec::with_capacity(usize::from(count));
    while !b.is_empty() {
        if b.len() < 8 || out.len() == usize::from(count) {
            return Err(IkeError::BadTransform);
        }
        let len = usize::from(be16(b, 2));
        if len < 8 || len > b.len() {
            return Err(IkeError::BadTransform);
        }
        let is_last = len == b.len();
        if b[0] != if is_last { 0 } else { 3 } {
            return Err(IkeError::BadTransform);
        }
        out.push(Transform {
            transform_type: b[4],
            id: be16(b, 6),
            attributes: parse_attributes(&b[8..len])?,
        });
        b = &b[len..];
    }
    if out.len() != usize::from(count) {
        return Err(IkeError::BadTransform);
    }
    Ok(out)
}

fn parse_attributes(mut b: &[u8]) -> IkeResult<Vec<Attribute>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < 4 {
            return Err(IkeError::BadAttribute);
        }
        let t = be16(b, 0);
        let v = be16(b, 2);
        if t & 0x8000 != 0 {
            out.push(Attribute::Tv {
                attr_type: t & 0x7fff,
                value: v,
            });
            b = &b[4..];
        } else {
            let end = 4 + usize::from(v);
            if end > b.len() {
                return Err(IkeError::BadAttribute);
            }
            out.push(Attribute::Tlv {
                attr_type: t,
                value: b[4..end].to_vec(),
            });
            b = &b[end..];
        }
    }
    Ok(out)
}

fn patch_len16(out: &mut [u8], start: usize, err: IkeError) -> IkeResult<()> {
    let len = u16::try_from(out.len() - start).map_err(|_| err)?;
    out[start + 2..start + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

fn emit_proposals(props: &[Proposal], out: &mut Vec<u8>) -> IkeResult<()> {
    if props.is_empty() {
        return Err(IkeError::BadProposal);
    }
    for (i, p) in props.iter().enumerate() {
        let start = out.len();
        let last = if i + 1 == props.len() { 0 } else { 2 };
        let spi_len = u8::try_from(p.spi.len()).map_err(|_| IkeError::TooBig)?;
        let n = u8::try_from(p.transforms.len()).map_err(|_| IkeError::TooBig)?;
        out.extend_from_slice(&[last, 0, 0, 0, p.number, p.protocol, spi_len, n]);
        out.extend_from_slice(&p.spi);
        for (j, t) in p.transforms.iter().enumerate() {
            let tstart = out.len();
            let tlast = if j + 1 == p.transforms.len() { 0 } else { 3 };
            out.extend_from_slice(&[tlast, 0, 0, 0, t.transform_type, 0]);
            out.extend_from_slice(&t.id.to_be_bytes());
            for a in &t.attributes {
                match a {
                    Attribute::Tv { attr_type, value } => {
                        if attr_type & 0x8000 != 0 {
                            return Err(IkeError::Unencodable);
                        }
                        out.extend_from_slice(&(attr_type | 0x8000).to_be_bytes());
                        out.extend_from_slice(&value.to_be_bytes());
                    }
                    Attribute::Tlv { attr_type, value } => {
                        if attr_type & 0x8000 != 0 {
                            return Err(IkeError::Unencodable);
                        }
                        let l = u16::try_from(value.len()).map_err(|_| IkeError::TooBig)?;
                        out.extend_from_slice(&attr_type.to_be_bytes());
                        out.extend_from_slice(&l.to_be_bytes());
                        out.extend_from_slice(value);
                    }
                }
            }
            patch_len16(out, tstart, IkeError::TooBig)?;
        }
        patch_len16(out, start, IkeError::TooBig)?;
    }
    Ok(())
}

fn parse_selectors(b: &[u8]) -> IkeResult<Vec<TrafficSelector>> {
    if b.len() < 4 {
        return Err(IkeError::BadTrafficSelector);
    }
    let count = usize::from(b[0]);
    if count == 0 {
        return Err(IkeError::BadTrafficSelector);
    }
    let mut rest = &b[4..];
    let mut out = Vec::with_capacity(count);
    while !rest.is_empty() {
        if rest.len() < 4 || out.len() == count {
            return Err(IkeError::BadTrafficSelector);
        }
        let ts_type = rest[0];
        let ip_protocol = rest[1];
        let len = usize::from(be16(rest, 2));
        if len < 4 || len > rest.len() {
            return Err(IkeError::BadTrafficSelector);
        }
        let s = &rest[..len];
        let ts = match ts_type {
            ts_type::IPV4_ADDR_RANGE => {
                if len != 16 {
                    return Err(IkeError::BadTrafficSelector);
                }
                TrafficSelector::Ipv4 {
                    ip_protocol,
                    start_port: be16(s, 4),
                    end_port: be16(s, 6),
                    start: Ipv4Addr::from(be32(s, 8)),
                    end: Ipv4Addr::from(be32(s, 12)),
                }
            }
            ts_type::IPV6_ADDR_RANGE => {
                if len != 40 {
                    return Err(IkeError::BadTrafficSelector);
                }
                let addr = |at: usize| -> IkeResult<Ipv6Addr> {
                    let a: [u8; 16] = s[at..at + 16]
                        .try_into()
                        .map_err(|_| IkeError::BadTrafficSelector)?;
                    Ok(Ipv6Addr::from(a))
                };
                TrafficSelector::Ipv6 {
                    ip_protocol,
                    start_port: be16(s, 4),
                    end_port: be16(s, 6),
                    start: addr(8)?,
                    end: addr(24)?,
                }
            }
            _ => TrafficSelector::Other {
                ts_type,
                ip_protocol,
                body: s[4..].to_vec(),
            },
        };
        out.push(ts);
        rest = &rest[len..];
    }
    if out.len() != count {
        return Err(IkeError::BadTrafficSelector);
    }
    Ok(out)
}

fn emit_selectors(ts: &[TrafficSelector], out: &mut Vec<u8>) -> IkeResult<()> {
    if ts.is_empty() {
        return Err(IkeError::BadTrafficSelector);
    }
    let n = u8::try_from(ts.len()).map_err(|_| IkeError::TooBig)?;
    out.extend_from_slice(&[n, 0, 0, 0]);
    for t in ts {
        let start = out.len();
        match t {
            TrafficSelector::Ipv4 {
                ip_protocol,
                start_port,
                end_port,
                start: a,
                end: z,
            } => {
                out.extend_from_slice(&[ts_type::IPV4_ADDR_RANGE, *ip_protocol, 0, 0]);
                out.extend_from_slice(&start_port.to_be_bytes());
                out.extend_from_slice(&end_port.to_be_bytes());
                out.extend_from_slice(&a.octets());
                out.extend_from_slice(&z.octets());
            }
            TrafficSelector::Ipv6 {
                ip_protocol,
                start_port,
                end_port,
                start: a,
                end: z,
            } => {
                out.extend_from_slice(&[ts_type::IPV6_ADDR_RANGE, *ip_protocol, 0, 0]);
                out.extend_from_slice(&start_port.to_be_bytes());
                out.extend_from_slice(&end_port.to_be_bytes());
                out.extend_from_slice(&a.octets());
                out.extend_from_slice(&z.octets());
            }
            TrafficSelector::Other {
                ts_type: tt,
                ip_protocol,
                body,
            } => {
                if matches!(*tt, ts_type::IPV4_ADDR_RANGE | ts_type::IPV6_ADDR_RANGE) {
                    return Err(IkeError::Unencodable);
                }
                out.extend_from_slice(&[*tt, *ip_protocol, 0, 0]);
                out.extend_from_slice(body);
            }
        }
        patch_len16(out, start, IkeError::TooBig)?;
    }
    Ok(())
}

/// Parses a payload chain that starts with type `first` and fills `b`
/// exactly: the body of a message, or the decrypted body of an SK payload
/// (`inside_sk`: then an SK/SKF inside is an error). An SK/SKF payload ends
/// the chain and must end at the end of `b`.
pub fn parse_payload_chain(
    first: PayloadType,
    mut b: &[u8],
    inside_sk: bool,
) -> IkeResult<Vec<Payload>> {
    let mut out = Vec::new();
    let mut ptype = first;
    while ptype != PayloadType::NoNext {
        if out.len() == MAX_PAYLOADS {
            return Err(IkeError::TooManyPayloads);
        }
        if b.len() < PAYLOAD_HEADER_LEN {
            return Err(IkeError::BadPayloadLength(u8::from(ptype)));
        }
        let next = PayloadType::from(b[0]);
        let critical = b[1] & CRITICAL != 0;
        let len = usize::from(be16(b, 2));
        if len < PAYLOAD_HEADER_LEN || len > b.len() {
            return Err(IkeError::BadPayloadLength(u8::from(ptype)));
        }
        let p = Payload::parse_body(ptype, next, critical, &b[PAYLOAD_HEADER_LEN..len])?;
        b = &b[len..];
        if p.is_encrypted() {
            if inside_sk || !b.is_empty() {
                return Err(IkeError::MisplacedEncrypted);
            }
            out.push(p);
            return Ok(out);
        }
        out.push(p);
        ptype = next;
    }
    if !b.is_empty() {
        return Err(IkeError::TrailingBytes);
    }
    Ok(out)
}

/// Emits a payload chain (see [`parse_payload_chain`]) and returns the type
/// of its first payload ([`PayloadType::NoNext`] when empty), for the
/// enclosing Next Payload field.
pub fn emit_payload_chain(payloads: &[Payload], out: &mut Vec<u8>) -> IkeResult<PayloadType> {
    if payloads.len() > MAX_PAYLOADS {
        return Err(IkeError::TooManyPayloads);
    }
    for (i, p) in payloads.iter().enumerate() {
        let next = match p {
            Payload::Sk { first_payload, .. } | Payload::Skf { first_payload, .. } => {
                if i + 1 != payloads.len() {
                    return Err(IkeError::MisplacedEncrypted);
                }
                *first_payload
            }
            _ => payloads
                .get(i + 1)
                .map_or(PayloadType::NoNext, Payload::payload_type),
        };
        let flags = match p {
            Payload::Unknown { critical: true, .. } => CRITICAL,
            _ => 0,
        };
        let start = out.len();
        out.extend_from_slice(&[u8::from(next), flags, 0, 0]);
        p.emit_body(out)?;
        patch_len16(out, start, IkeError::TooBig)?;
    }
    Ok(payloads
        .first()
        .map_or(PayloadType::NoNext, Payload::payload_type))
}

/// A whole IKE message: header and payloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Header fields (Next Payload and Length are derived).
    pub header: Header,
    /// Payloads in order; an SK/SKF payload can only be the last one.
    pub payloads: Vec<Payload>,
}

impl Message {
    /// Parses one IKE datagram (after the non-ESP marker on port 4500).
    pub fn parse(b: &[u8]) -> IkeResult<Message> {
        let (header, first, length) = Header::parse(b)?;
        if usize::try_from(length).ok() != Some(b.len()) {
            return Err(IkeError::LengthMismatch {
                header: length,
                datagram: b.len(),
            });
        }
        let payloads = parse_payload_chain(first, &b[HEADER_LEN..], false)?;
        Ok(Message { header, payloads })
    }

    /// Emits the message with every Next Payload and length field computed.
    pub fn emit(&self) -> IkeResult<Vec<u8>> {
        let mut body = Vec::new();
        let first = emit_payload_chain(&self.payloads, &mut body)?;
        let total = u32::try_from(HEADER_LEN + body.len()).map_err(|_| IkeError::TooBig)?;
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        self.header.emit(&mut out, first, total);
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// The type of the first unknown payload with the critical bit set, if
    /// any: the message must then be rejected with an
    /// UNSUPPORTED_CRITICAL_PAYLOAD notify carrying this type (RFC 7296 §2.5).
    pub fn unsupported_critical(&self) -> Option<PayloadType> {
        self.payloads.iter().find_map(|p| match p {
            Payload::Unknown {
                payload_type,
                critical: true,
                ..
            } => Some(*payload_type),
            _ => None,
        })
    }

    /// The payloads of one type, in order.
    pub fn payloads_of(&self, payload_type: PayloadType) -> impl Iterator<Item = &Payload> {
        self.payloads
            .iter()
            .filter(move |p| p.payload_type() == payload_type)
    }

    /// The notifies of the message, in order.
    pub fn notifies(&self) -> impl Iterator<Item = &Notify> {
        self.payloads.iter().filter_map(|p| match p {
            Payload::Notify(n) => Some(n),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests;
