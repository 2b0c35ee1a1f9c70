//! Why a packet was dropped: one vocabulary for the core's packet paths
//! and the daemon's I/O around them.
//!
//! Every reason has a stable, short name ([`DropReason::as_str`]) that
//! counters, metrics and logs are keyed on, so `espgate status` can say
//! *why* packets were lost.

use core::fmt;

/// Why a packet was not processed. Each variant is a counter key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
#[repr(u8)]
pub enum DropReason {
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
    /// A Q-ESP packet's clear ports or transport protocol differ from the
    /// decrypted packet's (`docs/QESP.md` §6: a sender claiming another
    /// flow's ports, e.g. for priority).
    QespPortMismatch,
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
    /// A TUN read whose virtio-net header the data plane cannot use: too
    /// short, an unknown GSO type, or inconsistent with its packet (wrong
    /// GSO type for the IP version or protocol, a zero segment size,
    /// checksum offsets that do not point at the L4 checksum, too many
    /// segments).
    BadOffload,
    /// An outbound packet matched no policy.
    NoPolicy,
    /// An inbound packet was authenticated by SAs that are not exactly one
    /// connection's inbound bundle (e.g. ESP alone where ESP+AH is due).
    PolicyMismatch,
    /// An outbound packet matched a connection that has no outbound SA for
    /// one of its layers (removed by `espgate sa del`, or not negotiated
    /// yet).
    NoSa,
    /// The sequence-number reservation could not be extended in time (the
    /// store refused or lags): the packet is not sent.
    SeqReserve,
    /// Sending the outer packet failed.
    SendError,
    /// Writing the inner packet to the TUN failed.
    TunWrite,
    /// An IKE message on the NAT-T port found the IKE engine's queue full
    /// (a flood; the peer retransmits).
    IkeQueueFull,
    /// A cluster node (seed 003) holds no valid dispatch plan: none yet,
    /// an empty one, or its cluster agent has not confirmed it within the
    /// hold (etcd unreachable). Every node drops the packet after counting
    /// it, rather than risk two nodes sending one sequence number.
    ClusterNoPlan,
    /// The plan gave this packet to this cluster node, but the node's
    /// sequence numbers of the SA are out of step with the others'.
    ClusterOutOfStep,
    /// A clear packet (IPv4 with DF, or IPv6) that would exceed the
    /// tunnel's path MTU once protected: refused, and its sender told so
    /// with ICMP "too big" (RFC 4301 §8.2.1), within the ICMP rate limit.
    PathMtu,
    /// A packet from an address family or socket no connection uses, or an
    /// internal inconsistency.
    Internal,
}

impl DropReason {
    /// All variants, for building counter tables.
    pub const ALL: [DropReason; 32] = [
        DropReason::BadLength,
        DropReason::BadIpVersion,
        DropReason::BadIpHeader,
        DropReason::Fragment,
        DropReason::NotIpsec,
        DropReason::UnknownSpi,
        DropReason::Replay,
        DropReason::Integrity,
        DropReason::BadCiphertextLength,
        DropReason::BadPadding,
        DropReason::BadNextHeader,
        DropReason::SelectorMismatch,
        DropReason::QespPortMismatch,
        DropReason::SaExpired,
        DropReason::SeqExhausted,
        DropReason::SeqNotReserved,
        DropReason::TooBig,
        DropReason::Unsupported,
        DropReason::EcnDrop,
        DropReason::Crypto,
        DropReason::BadOffload,
        DropReason::NoPolicy,
        DropReason::PolicyMismatch,
        DropReason::NoSa,
        DropReason::SeqReserve,
        DropReason::SendError,
        DropReason::TunWrite,
        DropReason::IkeQueueFull,
        DropReason::ClusterNoPlan,
        DropReason::ClusterOutOfStep,
        DropReason::PathMtu,
        DropReason::Internal,
    ];

    /// The reasons an SA's own processing counts (`espgate status` per SA,
    /// `espgate_sa_drops_total`): the packet-processing ones, not the
    /// daemon's I/O or policy reasons.
    pub const PER_SA: [DropReason; 20] = [
        DropReason::BadLength,
        DropReason::BadIpVersion,
        DropReason::BadIpHeader,
        DropReason::Fragment,
        DropReason::NotIpsec,
        DropReason::UnknownSpi,
        DropReason::Replay,
        DropReason::Integrity,
        DropReason::BadCiphertextLength,
        DropReason::BadPadding,
        DropReason::BadNextHeader,
        DropReason::SelectorMismatch,
        DropReason::QespPortMismatch,
        DropReason::SaExpired,
        DropReason::SeqExhausted,
        DropReason::SeqNotReserved,
        DropReason::TooBig,
        DropReason::Unsupported,
        DropReason::EcnDrop,
        DropReason::Crypto,
    ];

    /// Number of reasons (the length of a counter array).
    pub const COUNT: usize = DropReason::ALL.len();

    /// Stable counter name.
    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::BadLength => "bad_length",
            DropReason::BadIpVersion => "bad_ip_version",
            DropReason::BadIpHeader => "bad_ip_header",
            DropReason::Fragment => "fragment",
            DropReason::NotIpsec => "not_ipsec",
            DropReason::UnknownSpi => "unknown_spi",
            DropReason::Replay => "replay",
            DropReason::Integrity => "icv_failure",
            DropReason::BadCiphertextLength => "bad_ciphertext_length",
            DropReason::BadPadding => "bad_padding",
            DropReason::BadNextHeader => "bad_next_header",
            DropReason::SelectorMismatch => "selector_mismatch",
            DropReason::QespPortMismatch => "qesp_port_mismatch",
            DropReason::SaExpired => "sa_expired",
            DropReason::SeqExhausted => "seq_exhausted",
            DropReason::SeqNotReserved => "seq_not_reserved",
            DropReason::TooBig => "too_big",
            DropReason::Unsupported => "unsupported",
            DropReason::EcnDrop => "ecn_drop",
            DropReason::Crypto => "crypto_error",
            DropReason::BadOffload => "bad_offload",
            DropReason::NoPolicy => "no_policy",
            DropReason::PolicyMismatch => "policy_mismatch",
            DropReason::NoSa => "no_sa",
            DropReason::SeqReserve => "seq_reserve_failed",
            DropReason::SendError => "send_error",
            DropReason::TunWrite => "tun_write_error",
            DropReason::IkeQueueFull => "ike_queue_full",
            DropReason::ClusterNoPlan => "cluster_no_plan",
            DropReason::ClusterOutOfStep => "cluster_out_of_step",
            DropReason::PathMtu => "path_mtu_exceeded",
            DropReason::Internal => "internal_error",
        }
    }

    /// Index into a counter array of length `DropReason::ALL.len()`.
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for DropReason {}

/// Result of packet processing.
pub type PResult<T> = Result<T, DropReason>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_discriminant_order_and_names_are_unique() {
        for (i, d) in DropReason::ALL.iter().enumerate() {
            assert_eq!(d.index(), i);
        }
        let mut names: Vec<_> = DropReason::ALL.iter().map(|d| d.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DropReason::ALL.len());
    }
}
