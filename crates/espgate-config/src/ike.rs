//! A connection's `[connection.ike]` table, validated and loaded
//! ([`IkeSettings`], made by [`crate`]), and its translation into
//! the core engine's [`IkeConfig`].
//!
//! The key files the table names are read by the configuration loader;
//! what is kept here is the loaded material (the PSK in a [`Zeroizing`]
//! buffer, the private key behind an [`Arc`](std::sync::Arc), certificates,
//! public keys),
//! so the engine never reads a file. `Debug` shows the kind of each
//! secret, never its value.
//!
//! [`Zeroizing`]: zeroize::Zeroizing

use crate::Connection;
use espgate_core::selector::Prefix;
use espgate_ike::cert::Identity;
use espgate_ike::config::{ChildConfig, DpdAction, IkeConfig, LocalAuth, RemoteAuth, Retransmit};
use espgate_ike::proposal::ProposalSpec;
use espgate_ike::ts;
use serde::Deserialize;
use std::time::Duration;

/// An authentication method as the file names it (`auth`, `remote_auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMethod {
    /// Pre-shared key (`psk_file`).
    Psk,
    /// Signatures: our `private_key` (with `cert`, or as a raw public key);
    /// for the peer, a certificate from `ca` or the `remote_public_key`.
    Pubkey,
}

impl AuthMethod {
    /// The keyword in the file.
    pub fn name(self) -> &'static str {
        match self {
            AuthMethod::Psk => "psk",
            AuthMethod::Pubkey => "pubkey",
        }
    }
}

/// What the daemon does with the connection when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartAction {
    /// Nothing: wait for the peer, or `espgate initiate NAME`.
    None,
    /// Initiate the IKE SA and its child SA at start-up.
    Start,
}

/// The validated `[connection.ike]` table of a connection, with its key
/// material loaded.
#[derive(Debug, Clone)]
pub struct IkeSettings {
    /// IKE proposals, preferred first (`proposals`).
    pub proposals: Vec<ProposalSpec>,
    /// ESP proposals for the child SA, preferred first (`esp_proposals`).
    pub esp_proposals: Vec<ProposalSpec>,
    /// Our identity (`local_id`; default: the connection's `local`).
    pub local_id: Identity,
    /// The identity the peer must present (`remote_id`; default: the
    /// connection's `remote`); `None` for `"%any"`.
    pub remote_id: Option<Identity>,
    /// How we authenticate (`auth` with `psk_file`, or `private_key` and
    /// `cert`), loaded.
    pub local_auth: LocalAuth,
    /// How the peer must authenticate (`remote_auth` with `psk_file`, `ca`
    /// or `remote_public_key`), loaded.
    pub remote_auth: RemoteAuth,
    /// Initiate at start-up or wait.
    pub start_action: StartAction,
    /// IKE SA rekey time; zero: never.
    pub rekey_time: Duration,
    /// Child SA rekey time; zero: never.
    pub child_rekey_time: Duration,
    /// Child SA hard lifetime (deleted if not rekeyed by then); zero: never.
    pub child_life_time: Duration,
    /// Largest random reduction of the rekey times.
    pub jitter: Duration,
    /// Liveness check after this long without hearing from the peer;
    /// zero: off.
    pub dpd_delay: Duration,
    /// What to do with a dead peer.
    pub dpd_action: DpdAction,
    /// Retransmission schedule of unanswered requests.
    pub retransmit: Retransmit,
    /// Make both sides see a NAT, so that ESP is UDP-encapsulated.
    pub force_encap: bool,
}

impl IkeSettings {
    /// The method we authenticate with.
    pub fn auth(&self) -> AuthMethod {
        match self.local_auth {
            LocalAuth::Psk(_) => AuthMethod::Psk,
            LocalAuth::Signature { .. } => AuthMethod::Pubkey,
        }
    }

    /// The method the peer must authenticate with.
    pub fn remote_auth_method(&self) -> AuthMethod {
        match self.remote_auth {
            RemoteAuth::Psk(_) => AuthMethod::Psk,
            RemoteAuth::PublicKey(_) | RemoteAuth::Ca(_) => AuthMethod::Pubkey,
        }
    }
}

/// The IKE engine's configuration of a connection with a
/// `[connection.ike]` table (`None` without one): name, addresses,
/// identities, loaded authentication material, proposals, timers, and the
/// child SA's traffic selectors — every `local_ts` and `remote_ts` prefix
/// as a range selector with the connection's `proto` (ICMP resolved per
/// family, 0 for any) and all ports — and mode.
pub fn ike_config(c: &Connection) -> Option<IkeConfig> {
    let s = c.ike.as_ref()?;
    let selectors = |list: &[Prefix]| {
        list.iter()
            .map(|p| ts::from_prefix(*p, c.proto.for_family(p.addr().is_ipv6()).unwrap_or(0)))
            .collect::<Vec<_>>()
    };
    Some(IkeConfig {
        name: c.name.clone(),
        local: c.local,
        remote: c.remote,
        local_id: s.local_id.clone(),
        remote_id: s.remote_id.clone(),
        local_auth: s.local_auth.clone(),
        remote_auth: s.remote_auth.clone(),
        proposals: s.proposals.clone(),
        child: ChildConfig {
            local_ts: selectors(&c.local_ts),
            remote_ts: selectors(&c.remote_ts),
            mode: c.mode,
            proposals: s.esp_proposals.clone(),
            rekey_time: s.child_rekey_time,
            life_time: s.child_life_time,
            jitter: s.jitter,
        },
        rekey_time: s.rekey_time,
        jitter: s.jitter,
        dpd_delay: s.dpd_delay,
        dpd_action: s.dpd_action,
        retransmit: s.retransmit,
        force_encap: s.force_encap,
    })
}

/// True when the daemon should initiate the connection as it starts
/// (`start_action = "start"`); false for `"none"` and for connections
/// without IKE.
pub fn start_on_boot(c: &Connection) -> bool {
    c.ike
        .as_ref()
        .is_some_and(|s| s.start_action == StartAction::Start)
}
