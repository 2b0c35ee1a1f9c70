//! What the IKEv2 engine is told about each connection: identities,
//! authentication, proposals, selectors, lifetimes, liveness and
//! retransmission settings. The gateway's TOML becomes these types in the
//! I/O shell; the engine never reads files.

use super::cert::{Certificate, Identity};
use super::proposal::ProposalSpec;
use super::sig::{PrivateKey, PublicKey};
use super::wire::TrafficSelector;
use espgate_core::sa::Mode;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use zeroize::Zeroizing;

/// How we prove who we are.
#[derive(Clone)]
pub enum LocalAuth {
    /// Pre-shared key (AUTH method 2).
    Psk(Zeroizing<Vec<u8>>),
    /// Digital signature (RFC 7427, AUTH method 14), with our certificate
    /// chain (end entity first) or none for a raw public key.
    Signature {
        /// Our private key.
        key: Arc<PrivateKey>,
        /// Certificates sent in CERT payloads, end entity first.
        certs: Vec<Certificate>,
    },
}

/// How the peer must prove who it is.
#[derive(Clone)]
pub enum RemoteAuth {
    /// The same pre-shared key.
    Psk(Zeroizing<Vec<u8>>),
    /// A signature by this public key (raw public key, configured).
    PublicKey(PublicKey),
    /// A signature by the key of a certificate the peer sends, which must
    /// chain to one of these CA certificates and bind the peer's identity.
    Ca(Vec<Certificate>),
}

impl std::fmt::Debug for LocalAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LocalAuth::Psk(_) => "psk",
            LocalAuth::Signature { .. } => "signature",
        })
    }
}

impl std::fmt::Debug for RemoteAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RemoteAuth::Psk(_) => "psk",
            RemoteAuth::PublicKey(_) => "pubkey",
            RemoteAuth::Ca(_) => "ca",
        })
    }
}

/// What to do when the peer stops answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DpdAction {
    /// Remove the IKE SA and its child SAs.
    Clear,
    /// Remove them, then initiate again until the peer is back.
    Restart,
}

/// Retransmission of unanswered requests (RFC 7296 §2.1): timeouts
/// `min(timeout × base^n, limit)` for n = 0..tries, then the peer is
/// declared dead.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retransmit {
    /// First timeout.
    pub timeout: Duration,
    /// Back-off factor.
    pub base: f64,
    /// Retransmissions before giving up.
    pub tries: u32,
    /// Longest wait between two transmissions (strongSwan's
    /// `retransmit_limit`); zero: no limit.
    pub limit: Duration,
}

impl Default for Retransmit {
    /// 1 s, ×1.8, at most 8 s apart, 7 retransmissions: sends at 0, 1,
    /// 2.8, 6.0, 11.9, 19.9, 27.9 and 35.9 s, the peer declared dead at
    /// 43.9 s. strongSwan's schedule (4 s, ×1.8, no limit, 5 tries) sends
    /// at 0, 4 and 11.2 s: one lost IKE_SA_INIT or cookie exchange (a
    /// flood at the responder, a lossy path) then costs 7 s or more,
    /// while an early retransmission costs the responder only a cached
    /// answer.
    fn default() -> Self {
        Retransmit {
            timeout: Duration::from_secs(1),
            base: 1.8,
            tries: 7,
            limit: Duration::from_secs(8),
        }
    }
}

impl Retransmit {
    /// The wait after transmission number `n` (0 = the first send).
    pub fn wait(&self, n: u32) -> Duration {
        let f = self
            .base
            .max(1.0)
            .powi(i32::try_from(n).unwrap_or(i32::MAX).min(30));
        let w = self.timeout.mul_f64(f.min(1e6));
        if self.limit.is_zero() {
            w
        } else {
            w.min(self.limit)
        }
    }

    /// From the first send until the peer is declared dead.
    pub fn total(&self) -> Duration {
        (0..=self.tries).map(|n| self.wait(n)).sum()
    }
}

/// Whether a connection negotiates Q-ESP child SAs (`docs/QESP.md` §7):
/// proposals with the private-use Protocol ID 201 and ESP's transforms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum QespMode {
    /// ESP only: Q-ESP proposals are neither sent nor accepted.
    #[default]
    Off,
    /// Propose Q-ESP first and ESP second; accept either, Q-ESP preferred.
    Prefer,
    /// Q-ESP only: a peer without it fails the child SA.
    Require,
}

impl QespMode {
    /// The keyword in the configuration (`off`, `prefer`, `require`).
    pub fn name(self) -> &'static str {
        match self {
            QespMode::Off => "off",
            QespMode::Prefer => "prefer",
            QespMode::Require => "require",
        }
    }
}

/// The child SA a connection negotiates.
#[derive(Debug, Clone)]
pub struct ChildConfig {
    /// Our side's selectors (what we propose as TSi when initiating).
    pub local_ts: Vec<TrafficSelector>,
    /// The peer side's selectors.
    pub remote_ts: Vec<TrafficSelector>,
    /// Tunnel or transport.
    pub mode: Mode,
    /// ESP proposals, preferred first; groups in them are PFS groups for
    /// CREATE_CHILD_SA. Q-ESP proposals are these too (those algorithms
    /// Q-ESP refuses, AES-GMAC, left out).
    pub proposals: Vec<ProposalSpec>,
    /// ESP, Q-ESP or either.
    pub qesp: QespMode,
    /// Rekey this long after creation (minus up to `jitter`); zero: never.
    pub rekey_time: Duration,
    /// Delete the SA this long after creation if it was not rekeyed.
    pub life_time: Duration,
    /// Random reduction of `rekey_time`, so that two peers with the same
    /// settings rarely rekey at once.
    pub jitter: Duration,
    /// RFC 9611 per-resource child SAs: with more than 1, this many child
    /// SAs with the same selectors are kept, one per data-plane worker
    /// (slot), when the peer announces SA_RESOURCE_INFO too; 1: one child,
    /// and the notify is never sent.
    pub per_cpu_sas: u32,
    /// Further selector sets, each negotiated as a child SA of its own on
    /// the same IKE SA (an initiator asks for them with CREATE_CHILD_SA
    /// once the first, `local_ts`/`remote_ts`, is up; a responder narrows
    /// a proposal into the first set it meets). Empty: one selector set.
    pub more_ts: Vec<SelectorSet>,
}

/// One selector set of a connection beyond its first ([`ChildConfig::more_ts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorSet {
    /// Our side's selectors (TSi when we initiate).
    pub local_ts: Vec<TrafficSelector>,
    /// The peer side's selectors.
    pub remote_ts: Vec<TrafficSelector>,
}

impl ChildConfig {
    /// How many selector sets: the first plus [`ChildConfig::more_ts`].
    pub fn set_count(&self) -> u32 {
        1 + self.more_ts.len() as u32
    }

    /// Selector set `k` (ours, the peer's): 0 is `local_ts`/`remote_ts`.
    pub fn set(&self, k: u32) -> Option<(&[TrafficSelector], &[TrafficSelector])> {
        match k {
            0 => Some((&self.local_ts, &self.remote_ts)),
            _ => self
                .more_ts
                .get(k as usize - 1)
                .map(|s| (&s.local_ts[..], &s.remote_ts[..])),
        }
    }
}

/// One IKE connection.
#[derive(Debug, Clone)]
pub struct IkeConfig {
    /// Connection name (shared with the data plane's connection).
    pub name: String,
    /// Our address.
    pub local: IpAddr,
    /// The peer's address.
    pub remote: IpAddr,
    /// Our identity (IDi/IDr).
    pub local_id: Identity,
    /// The identity the peer must present; `None` accepts any it can
    /// authenticate.
    pub remote_id: Option<Identity>,
    /// How we authenticate.
    pub local_auth: LocalAuth,
    /// How the peer must authenticate.
    pub remote_auth: RemoteAuth,
    /// IKE proposals, preferred first.
    pub proposals: Vec<ProposalSpec>,
    /// The child SA.
    pub child: ChildConfig,
    /// Rekey the IKE SA this long after creation (minus up to `jitter`);
    /// zero: never.
    pub rekey_time: Duration,
    /// Random reduction of `rekey_time`.
    pub jitter: Duration,
    /// Send a liveness check after this long without hearing from the
    /// peer; zero: never.
    pub dpd_delay: Duration,
    /// What to do with a dead peer.
    pub dpd_action: DpdAction,
    /// Retransmission schedule.
    pub retransmit: Retransmit,
    /// Make both sides see a NAT (a random NAT_DETECTION_SOURCE_IP hash, as
    /// strongSwan's `encap = yes`) so that ESP is UDP-encapsulated and IKE
    /// moves to port 4500.
    pub force_encap: bool,
    /// Answer a peer's MOBIKE_SUPPORTED (RFC 4555), so that it can move
    /// the SAs to its new address with UPDATE_SA_ADDRESSES. Only as the
    /// responder of MOBIKE: we never move ourselves.
    pub mobike: bool,
}
