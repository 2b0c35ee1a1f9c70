//! What the engine counts: one typed [`IkeEvent`] per thing that happened
//! or reason a message or exchange failed, and a fixed-size table of
//! counts indexed by it.
//!
//! The names ([`IkeEvent::as_str`]) are an interface: `espgate status`
//! prints them ("IKE counters: …") and the Prometheus family
//! `espgate_ike_events_total{event="…"}` labels its series with them.
//! Never rename one; add a variant instead.

macro_rules! ike_events {
    ($($(#[doc = $doc:literal])* $v:ident => $name:literal,)*) => {
        /// Something the IKE engine counts: a message, an exchange, or the
        /// reason one was dropped or failed.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum IkeEvent {
            $($(#[doc = $doc])* $v,)*
        }

        impl IkeEvent {
            /// Every event, in declaration order.
            pub const ALL: &'static [IkeEvent] = &[$(IkeEvent::$v,)*];

            /// The stable name of the counter (status and metrics).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(IkeEvent::$v => $name,)*
                }
            }
        }
    };
}

ike_events! {
    /// A datagram was handed to the engine.
    MessagesIn => "messages_in",
    /// A datagram was queued for sending.
    MessagesOut => "messages_out",
    /// We sent an IKE_SA_INIT request (a new IKE SA).
    IkeInitSent => "ike_init_sent",
    /// We answered an IKE_SA_INIT request.
    IkeInitAnswered => "ike_init_answered",
    /// An IKE SA was authenticated both ways.
    IkeEstablished => "ike_established",
    /// An IKE SA was rekeyed.
    IkeRekeys => "ike_rekeys",
    /// An IKE SA we initiated failed before it was usable.
    IkeFailed => "ike_failed",
    /// A child SA was created (not by rekeying).
    ChildrenEstablished => "children_established",
    /// A child SA was rekeyed.
    ChildRekeys => "child_rekeys",
    /// A child SA negotiation we started failed.
    ChildFailed => "child_failed",
    /// A child SA reached its hard lifetime.
    ChildrenExpired => "children_expired",
    /// Both sides rekeyed the same child SA at once (RFC 7296 §2.8.1).
    RekeyCollisions => "rekey_collisions",
    /// Both sides rekeyed the same IKE SA at once (RFC 7296 §2.8.2).
    IkeRekeyCollisions => "ike_rekey_collisions",
    /// The peer's authentication failed, or it refused ours.
    AuthFailed => "auth_failed",
    /// No proposal of the peer was acceptable.
    NoProposalChosen => "no_proposal_chosen",
    /// The peer's traffic selectors do not meet ours.
    TsUnacceptable => "ts_unacceptable",
    /// We answered INVALID_KE_PAYLOAD (another group).
    InvalidKeSent => "invalid_ke_sent",
    /// The peer answered INVALID_KE_PAYLOAD.
    InvalidKeReceived => "invalid_ke_received",
    /// We demanded a COOKIE (RFC 7296 §2.6).
    CookiesSent => "cookies_sent",
    /// The peer demanded a COOKIE.
    CookiesReceived => "cookies_received",
    /// A request we sent was sent again.
    Retransmits => "retransmits",
    /// A retransmitted request was answered from the cache.
    RetransmittedResponses => "retransmitted_responses",
    /// A liveness check (empty INFORMATIONAL) was sent.
    DpdSent => "dpd_sent",
    /// A peer stopped answering.
    PeersDead => "peers_dead",
    /// A responder's half-open IKE SA got no IKE_AUTH in time.
    HalfOpenExpired => "half_open_expired",
    /// INITIAL_CONTACT removed a restarted peer's stale IKE SA.
    InitialContactCleared => "initial_contact_cleared",
    /// A message went out as RFC 7383 fragments.
    FragmentedMessagesOut => "fragmented_messages_out",
    /// A fragmented message was reassembled.
    FragmentedMessagesIn => "fragmented_messages_in",
    /// A fragment arrived.
    FragmentsIn => "fragments_in",
    /// A message could not be built.
    BuildErrors => "build_errors",
    /// The random number generator failed: an exchange was not started or
    /// not answered (nothing is ever sent with a value that is not random).
    RngFailures => "rng_failures",
    /// Dropped: not a well-formed IKE message.
    DroppedMalformed => "dropped_malformed",
    /// Dropped: the integrity check failed.
    DroppedIntegrity => "dropped_integrity",
    /// Dropped: no IKE SA has these SPIs.
    DroppedUnknownSpi => "dropped_unknown_spi",
    /// Dropped: a message ID out of the window.
    DroppedBadMessageId => "dropped_bad_message_id",
    /// Dropped: a response to no request of ours.
    DroppedUnexpectedResponse => "dropped_unexpected_response",
    /// Dropped: a request not valid in the IKE SA's state.
    DroppedUnexpectedRequest => "dropped_unexpected_request",
    /// Dropped: an IKE_SA_INIT again for an SA past that exchange.
    DroppedDuplicateInit => "dropped_duplicate_init",
    /// Dropped unanswered: an IKE_SA_INIT from an address no connection has.
    DroppedNoConnection => "dropped_no_connection",
    /// Dropped unanswered: an IKE_SA_INIT while the half-open limit was
    /// reached.
    DroppedHalfOpenLimit => "dropped_half_open_limit",
    /// Dropped: an unusable key exchange value.
    DroppedBadKe => "dropped_bad_ke",
    /// Dropped: a message of more fragments than we reassemble.
    DroppedTooManyFragments => "dropped_too_many_fragments",
    /// An IKE SA was continued from another engine's snapshot (a cluster's
    /// new leader took it over without a new handshake).
    IkeSasContinued => "ike_sas_continued",
    /// A continued IKE SA took the peer's request past the message ID its
    /// snapshot expected (the snapshot was behind).
    MessageIdResyncs => "message_id_resyncs",
    /// The peer moved the IKE SA and its child SAs with MOBIKE's
    /// UPDATE_SA_ADDRESSES (RFC 4555).
    MobikeUpdates => "mobike_updates",
    /// An UPDATE_SA_ADDRESSES was refused: the peer said NO_NATS_ALLOWED
    /// and its addresses had been changed on the way.
    MobikeRefused => "mobike_refused",
}

/// How many of each [`IkeEvent`] happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counters([u64; IkeEvent::ALL.len()]);

impl Default for Counters {
    fn default() -> Self {
        Counters([0; IkeEvent::ALL.len()])
    }
}

impl Counters {
    /// Counts one `event`.
    pub fn add(&mut self, event: IkeEvent) {
        let n = &mut self.0[event as usize];
        *n = n.saturating_add(1);
    }

    /// How many `event`s happened.
    pub fn get(&self, event: IkeEvent) -> u64 {
        self.0[event as usize]
    }

    /// The events that happened at least once, with their counts, in
    /// declaration order.
    pub fn nonzero(&self) -> impl Iterator<Item = (IkeEvent, u64)> + '_ {
        IkeEvent::ALL
            .iter()
            .map(|e| (*e, self.get(*e)))
            .filter(|(_, n)| *n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_snake_case_and_indices_dense() {
        let mut seen = HashSet::new();
        for (i, e) in IkeEvent::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i);
            let n = e.as_str();
            assert!(seen.insert(n), "{n} twice");
            assert!(
                n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{n}"
            );
        }
    }

    #[test]
    fn the_names_status_and_metrics_show_never_change() {
        // The names of the string-keyed counters this enum replaced.
        let before = [
            "auth_failed",
            "build_errors",
            "child_failed",
            "child_rekeys",
            "children_established",
            "children_expired",
            "cookies_received",
            "cookies_sent",
            "dpd_sent",
            "dropped_bad_ke",
            "dropped_bad_message_id",
            "dropped_duplicate_init",
            "dropped_integrity",
            "dropped_malformed",
            "dropped_no_connection",
            "dropped_too_many_fragments",
            "dropped_unexpected_request",
            "dropped_unexpected_response",
            "dropped_unknown_spi",
            "fragmented_messages_in",
            "fragmented_messages_out",
            "fragments_in",
            "half_open_expired",
            "ike_established",
            "ike_failed",
            "ike_init_answered",
            "ike_init_sent",
            "ike_rekeys",
            "initial_contact_cleared",
            "invalid_ke_received",
            "invalid_ke_sent",
            "messages_in",
            "messages_out",
            "no_proposal_chosen",
            "peers_dead",
            "rekey_collisions",
            "retransmits",
            "retransmitted_responses",
            "ts_unacceptable",
        ];
        let names: HashSet<&str> = IkeEvent::ALL.iter().map(|e| e.as_str()).collect();
        for n in before {
            assert!(names.contains(n), "{n} lost");
        }
    }

    #[test]
    fn only_what_happened_is_listed() {
        let mut c = Counters::default();
        assert_eq!(c.nonzero().count(), 0);
        c.add(IkeEvent::DroppedIntegrity);
        c.add(IkeEvent::DroppedIntegrity);
        c.add(IkeEvent::MessagesIn);
        assert_eq!(c.get(IkeEvent::DroppedIntegrity), 2);
        assert_eq!(c.get(IkeEvent::MessagesOut), 0);
        let v: Vec<_> = c.nonzero().collect();
        assert_eq!(
            v,
            vec![(IkeEvent::MessagesIn, 1), (IkeEvent::DroppedIntegrity, 2)]
        );
    }
}
