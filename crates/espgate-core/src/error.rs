//! Typed reasons for rejecting a packet or an operation.
//!
//! Every drop has a stable, short name ([`Drop::as_str`]) that counters and
//! logs are keyed on, so `espgate status` can say *why* packets were lost.

use core::fmt;

/// Why a packet was not processed. Each variant is a counter key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
#[repr(u8)]
pub enum Drop {
    /// A header is shorter than its fixed part, or a length field points past the end.
    BadLength,
    /// The IP version nibble is neither 4 nor 6.
    BadIpVersion,
    /// IPv4 header checksum or other header field is invalid.
    BadIpHeader,
    /// A fragment arrived where a whole datagram is required.
    Fragment,
    /// The packet is not ESP/AH/UDP-encapsulated ESP.
    NotIpsec,
    /// No SA is installed for this SPI.
    UnknownSpi,
    /// The sequence number was already seen or is left of the replay window.
    Replay,
    /// ICV (integrity check value) verification failed.
    Integrity,
    /// The ESP ciphertext is not a multiple of the cipher's block size.
    BadCiphertextLength,
    /// The ESP padding bytes or pad length are invalid.
    BadPadding,
    /// The decrypted payload's next-header does not fit the SA's mode.
    BadNextHeader,
    /// The decrypted inner packet does not match the SA's traffic selectors.
    SelectorMismatch,
    /// The SA reached its hard lifetime and must not be used.
    SaExpired,
    /// Sending one more packet would wrap the sequence number.
    SeqExhausted,
    /// The sequence number taken from a shared counter
    /// ([`crate::sa::SharedSeq`]) is above the ceiling its owner set (the
    /// numbers reserved on disk): the packet is not sent, so that no number
    /// is ever used twice across a restart.
    SeqNotReserved,
    /// Inner packet too large for the output buffer or protocol limits.
    TooBig,
    /// The packet has an IPv6 routing header that AH cannot protect.
    Unsupported,
    /// ECN decapsulation rules (RFC 6040) say drop (CE outer, Not-ECT inner).
    EcnDrop,
    /// The cipher library refused an operation (should never happen).
    Crypto,
    /// A TUN offload (virtio-net header) is inconsistent with its packet:
    /// wrong GSO type for the IP version or protocol, a zero segment size,
    /// checksum offsets that do not point at the L4 checksum, too many segments.
    BadOffload,
}

impl Drop {
    /// All variants, for building counter tables.
    pub const ALL: [Drop; 20] = [
        Drop::BadLength,
        Drop::BadIpVersion,
        Drop::BadIpHeader,
        Drop::Fragment,
        Drop::NotIpsec,
        Drop::UnknownSpi,
        Drop::Replay,
        Drop::Integrity,
        Drop::BadCiphertextLength,
        Drop::BadPadding,
        Drop::BadNextHeader,
        Drop::SelectorMismatch,
        Drop::SaExpired,
        Drop::SeqExhausted,
        Drop::SeqNotReserved,
        Drop::TooBig,
        Drop::Unsupported,
        Drop::EcnDrop,
        Drop::Crypto,
        Drop::BadOffload,
    ];

    /// Stable counter name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Drop::BadLength => "bad_length",
            Drop::BadIpVersion => "bad_ip_version",
            Drop::BadIpHeader => "bad_ip_header",
            Drop::Fragment => "fragment",
            Drop::NotIpsec => "not_ipsec",
            Drop::UnknownSpi => "unknown_spi",
            Drop::Replay => "replay",
            Drop::Integrity => "icv_failure",
            Drop::BadCiphertextLength => "bad_ciphertext_length",
            Drop::BadPadding => "bad_padding",
            Drop::BadNextHeader => "bad_next_header",
            Drop::SelectorMismatch => "selector_mismatch",
            Drop::SaExpired => "sa_expired",
            Drop::SeqExhausted => "seq_exhausted",
            Drop::SeqNotReserved => "seq_not_reserved",
            Drop::TooBig => "too_big",
            Drop::Unsupported => "unsupported",
            Drop::EcnDrop => "ecn_drop",
            Drop::Crypto => "crypto_error",
            Drop::BadOffload => "offload_mismatch",
        }
    }

    /// Index into a counter array of length `Drop::ALL.len()`.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Drop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for Drop {}

/// Result of packet processing.
pub type PResult<T> = Result<T, Drop>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_discriminant_order_and_names_are_unique() {
        for (i, d) in Drop::ALL.iter().enumerate() {
            assert_eq!(d.index(), i);
        }
        let mut names: Vec<_> = Drop::ALL.iter().map(|d| d.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Drop::ALL.len());
    }
}
