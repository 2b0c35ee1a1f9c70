//! An established IKE SA carried from one engine to another (seed 003's
//! cluster: a new leader continues the IKE SAs of the one that died).
//!
//! [`Ike::export`] writes every established IKE SA as an [`IkeSnapshot`]:
//! its keys, message IDs, peer and child SAs, with deadlines as durations
//! from the time of the snapshot. [`Ike::import`] makes an engine with the
//! same connections continue it: the IKE SA is established at once, its
//! children are taken as already installed (the data plane has them), its
//! timers are armed, and a liveness check (an empty INFORMATIONAL) goes out
//! at once, so that a snapshot the peer no longer knows is found out within
//! the retransmissions of one request.
//!
//! A snapshot may be behind by an exchange: the old leader may have sent
//! or answered one more request before it died. The message IDs allow for
//! that. A request of ours whose ID the old leader already used is
//! answered by the peer's cached response (RFC 7296 §2.1), which is taken
//! as the answer. The peer's first request may be past the ID the snapshot
//! expects; the continued SA takes it once (within [`RESYNC_WINDOW`]) and is
//! strict from then on. The old leader's request still in flight at the
//! snapshot is left out: its ID is the next one the continued SA sends
//! with. The SK IV counter goes on far past what the old leader can have
//! used ([`IV_SKIP`]): counter IVs (AES-GCM, ChaCha20-Poly1305) must never
//! repeat under a key.
//!
//! A rekey of the IKE SA that the old leader had in flight is not carried
//! over (its Diffie-Hellman secret stays with it). When the peer's rekey
//! crossed it (RFC 7296 §2.8.2), the snapshot is the peer's new SA; if the
//! peer later decides that the old leader's new SA is the one to keep, it
//! deletes that snapshot's SA, and the continued engine keeps the child
//! SAs while it negotiates a new IKE SA ([`Ike::export`]).

use super::{
    protocol, Child, ChildState, CommandError, Event, Ike, IkeEvent, IkeSa, Level, Req, SkCrypto,
    SkKeys, State, Task,
};
use crate::cert::Identity;
use crate::dh::Group;
use crate::proposal::{self, Chosen, ProposalKind};
use crate::wire::{self, TrafficSelector};
use espgate_core::sa::Protocol;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::time::Duration;
use zeroize::Zeroizing;

/// How far the SK IV counter of a continued IKE SA is moved past the
/// snapshot's: beyond any number of messages the old leader can have sent
/// between its last snapshot and its end.
const IV_SKIP: u64 = 1 << 32;

/// Key bytes: hex in a snapshot, wiped on drop, never printed.
#[derive(Clone, PartialEq, Eq, Default)]
struct Secret(Zeroizing<Vec<u8>>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({} bytes, not shown)", self.0.len())
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = Zeroizing::new(hex::encode(&*self.0));
        s.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Zeroizing::new(String::deserialize(d)?);
        // Decoded into a buffer of its final size: `hex::decode` collects
        // into a growing `Vec`, whose old allocations would be freed with
        // parts of the key in them.
        let mut key = Zeroizing::new(vec![0u8; text.len() / 2]);
        hex::decode_to_slice(&*text, &mut key[..]).map_err(serde::de::Error::custom)?;
        Ok(Secret(key))
    }
}

/// Public bytes (nonces, the cached response): hex in a snapshot, their
/// length in its `Debug`.
#[derive(Clone, PartialEq, Eq, Default)]
struct Bytes(Vec<u8>);

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({} bytes)", self.0.len())
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        hex::decode(text)
            .map(Bytes)
            .map_err(serde::de::Error::custom)
    }
}

/// Negotiated algorithms: their name (for people) and the transforms
/// (type, ID, key length in bits) they are read back from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Algorithms {
    name: String,
    transforms: Vec<(u8, u16, Option<u16>)>,
}

impl Algorithms {
    fn of(c: &Chosen, kind: ProposalKind) -> Algorithms {
        Algorithms {
            name: c.name(),
            transforms: c
                .to_wire(kind, 1, &[])
                .transforms
                .iter()
                .map(|t| (t.transform_type, t.id, t.key_length()))
                .collect(),
        }
    }

    fn chosen(&self, kind: ProposalKind) -> Option<Chosen> {
        let p = wire::Proposal {
            number: 1,
            protocol: kind.protocol(),
            spi: Vec::new(),
            transforms: self
                .transforms
                .iter()
                .map(|&(t, id, bits)| match bits {
                    Some(b) => wire::Transform::with_key_length(t, id, b),
                    None => wire::Transform::new(t, id),
                })
                .collect(),
        };
        proposal::single(&p, kind)
    }
}

/// The peer's authenticated identity (IDi/IDr type and data).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PeerId {
    id_type: u8,
    data: Bytes,
}

/// A child SA's state as a snapshot keeps it (one being rekeyed by us is
/// installed: the continued SA rekeys it again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ChildSnapState {
    Installed,
    /// Replaced by a rekey, waiting for its deletion.
    Rekeyed,
    /// Our Delete was sent: the continued SA sends it again.
    Deleting,
}

/// A rekey responder's new outbound SA, not yet in the data plane: it is
/// installed when the peer deletes the old child (or at the deadline).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct HeldOut {
    enc_key: Secret,
    integ_key: Secret,
    /// Time left until it is installed anyway.
    switch_in: Duration,
    /// The inbound SPI of the child whose delete installs it (`None` from
    /// a snapshot written before it was kept: then the delete of any
    /// child does, as it did then).
    #[serde(default)]
    replaces: Option<u32>,
}

/// The inbound SA of a child a rekey replaced, deleted but left in the
/// data plane a little longer (`REKEYED_INBOUND_LINGER`): the continued
/// SA removes it when the old leader would have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct RetiringSa {
    spi: u32,
    /// Protocol ID (3: ESP, 201: Q-ESP).
    protocol: u8,
    remove_in: Duration,
}

fn protocol_of(id: u8) -> Option<Protocol> {
    match id {
        protocol::ESP => Some(Protocol::Esp),
        protocol::QESP => Some(Protocol::Qesp),
        _ => None,
    }
}

/// One child SA of an [`IkeSnapshot`]. Its ESP keys are not in it (the
/// data plane of every node has them), except those of an outbound SA a
/// rekey responder still holds back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildSnapshot {
    /// Our inbound SPI.
    pub spi_in: u32,
    /// Our outbound SPI.
    pub spi_out: u32,
    /// Protocol ID (3: ESP, 201: Q-ESP).
    protocol: u8,
    algorithms: Algorithms,
    local_ts: Vec<TrafficSelector>,
    remote_ts: Vec<TrafficSelector>,
    state: ChildSnapState,
    /// Its outbound SA is the connection's current one.
    out_active: bool,
    /// A newer child took over its traffic.
    replaced: bool,
    /// Time left until it is rekeyed.
    rekey_in: Option<Duration>,
    /// Time left until it expires.
    expire_in: Option<Duration>,
    /// Nonces of the exchange that made it (rekey collisions).
    ni: Bytes,
    nr: Bytes,
    held_out: Option<HeldOut>,
    /// Its per-CPU slot (RFC 9611).
    #[serde(default)]
    slot: u32,
}

/// Everything another engine with the same connection needs to continue an
/// established IKE SA: see the module documentation. Serialize it
/// (JSON) to carry it; it holds the IKE SA's keys: seal it, never log it.
/// Key bytes are wiped on drop and left out of `Debug`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IkeSnapshot {
    /// [`IkeSnapshot::VERSION`] when written.
    pub version: u32,
    /// Connection name.
    pub conn: String,
    /// We are the original initiator.
    pub initiator: bool,
    /// Initiator SPI.
    pub spi_i: u64,
    /// Responder SPI.
    pub spi_r: u64,
    /// Our IKE address and port.
    pub local: SocketAddr,
    /// The peer's.
    pub remote: SocketAddr,
    /// NAT detected or forced (IKE on the NAT-T port, ESP in UDP).
    pub nat: bool,
    algorithms: Algorithms,
    sk_d: Secret,
    sk_ei: Secret,
    sk_er: Secret,
    sk_ai: Secret,
    sk_ar: Secret,
    sk_pi: Secret,
    sk_pr: Secret,
    /// The SK IV counter.
    next_iv: u64,
    ni: Bytes,
    nr: Bytes,
    /// The message ID of our next request.
    pub next_out_id: u32,
    /// The message ID expected of the peer's next request.
    pub next_in_id: u32,
    /// Our last response (its ID, its datagrams), for a retransmitted request.
    last_response: Option<(u32, Vec<Bytes>)>,
    peer_id: Option<PeerId>,
    fragmentation: bool,
    /// MOBIKE (RFC 4555) was negotiated.
    #[serde(default)]
    mobike: bool,
    qesp_declined: bool,
    /// The peer keeps per-CPU children (RFC 9611).
    #[serde(default)]
    per_cpu_peer: bool,
    /// The PFS group the peer asked for.
    pfs_group: Option<u16>,
    /// How long it had been established.
    established_for: Duration,
    /// Time left until it is rekeyed.
    pub(super) rekey_in: Option<Duration>,
    /// Its child SAs.
    pub children: Vec<ChildSnapshot>,
    /// Inbound SAs of the connection's replaced children still to remove.
    #[serde(default)]
    retiring: Vec<RetiringSa>,
    /// Written as the peer's new SA of crossed IKE SA rekeys, ours still
    /// unanswered ([`Ike::export`]): for this long the peer may still
    /// delete it because it kept our new SA instead.
    #[serde(default)]
    pub(super) crossed_for: Option<Duration>,
}

impl ChildSnapshot {
    /// Tests: a rekey responder's new outbound SA is held back.
    #[cfg(test)]
    pub(super) fn holds_outbound(&self) -> bool {
        self.held_out.is_some()
    }
}

impl IkeSnapshot {
    /// The format written; [`Ike::import`] refuses others.
    pub const VERSION: u32 = 1;
}

/// Whether SA `sa` is exported: established and keyed (not being
/// negotiated, not being deleted or replaced).
fn exportable(sa: &IkeSa) -> bool {
    sa.state == State::Established && sa.sk.is_some() && sa.sk_keys.is_some() && sa.chosen.is_some()
}

/// The message ID the continued SA sends its next request with: that of
/// the request still unanswered, if any (the peer may not have it).
fn next_out(sa: &IkeSa) -> u32 {
    sa.pending.as_ref().map_or(sa.next_out_id, |p| p.id)
}

/// A digest of everything [`Ike::export`] writes of SA `sa` but what
/// follows from it (keys, nonces, selectors: they change only with the
/// SA or child they belong to); 0 when it is not exported. Cheap: no
/// allocation, a few words per child.
pub(super) fn fingerprint(sa: &IkeSa) -> u64 {
    if !exportable(sa) {
        return 0;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (sa.serial, sa.spi_i, sa.spi_r, sa.local, sa.remote).hash(&mut h);
    (sa.nat, sa.fragmentation, sa.qesp_declined, sa.per_cpu_peer).hash(&mut h);
    (sa.mobike, sa.crossed_by.is_some()).hash(&mut h);
    sa.pfs_group.map(|g| g.id()).hash(&mut h);
    (next_out(sa), sa.next_in_id, sa.rekey_at).hash(&mut h);
    matches!(
        sa.pending,
        Some(super::Pending {
            what: Req::IkeRekey { .. },
            ..
        })
    )
    .hash(&mut h);
    sa.last_resp.as_ref().map(|r| r.0).hash(&mut h);
    sa.peer_id.is_some().hash(&mut h);
    for c in &sa.children {
        (c.spi_in, c.spi_out, c.state as u8, c.out_active, c.replaced).hash(&mut h);
        (c.rekey_at, c.expire_at, c.pending_out.as_ref().map(|p| p.1)).hash(&mut h);
    }
    h.finish().max(1)
}

fn left(at: Option<Duration>, now: Duration) -> Option<Duration> {
    at.map(|t| t.saturating_sub(now))
}

impl Ike {
    /// Every established IKE SA, as another engine with the same
    /// connections continues it ([`Ike::import`]); deadlines are counted
    /// from `now`. SAs being negotiated, deleted or replaced are left out.
    ///
    /// An IKE SA whose rekey the peer's crossed (RFC 7296 §2.8.2), ours
    /// still unanswered, is written as the peer's new SA holding its
    /// children: an engine continues one IKE SA per connection, and our
    /// request in flight is not carried over (see the module docs). If the
    /// peer never had our request, its rekey stands: it deletes the old
    /// SA, which the continued engine never knew, and keeps the children
    /// on the new one, as the continued engine does. If it had it and our
    /// new SA won, it deletes the one written here instead, within
    /// `crossed_for`: the continued engine then keeps the children and
    /// negotiates a new IKE SA at once.
    pub fn export(&self, now: Duration) -> Vec<IkeSnapshot> {
        let exported = |i: Option<usize>| i.map(|i| &self.sas[i]).filter(|s| exportable(s));
        let mut sas: Vec<(&IkeSa, &IkeSa)> = self
            .sas
            .iter()
            .filter(|&(i, s)| exportable(s) && exported(self.crossing(i)).is_none())
            .map(|(j, s)| (s, exported(self.crossed(j)).unwrap_or(s)))
            .collect();
        sas.sort_by_key(|(s, _)| s.serial);
        sas.into_iter()
            .filter_map(|(sa, children_of)| self.snapshot_of(sa, children_of, now))
            .collect()
    }

    /// A number that grows whenever what [`Ike::export`] returns changes
    /// (but for its remaining times, which only follow the clock): an IKE
    /// SA established, rekeyed or removed, a message ID moved, a child SA
    /// added, rekeyed or removed. A field read.
    pub fn export_generation(&self) -> u64 {
        self.export_gen
    }

    /// SA `sa` with the children of `children_of` (itself but for
    /// crossed rekeys, see [`Ike::export`]).
    fn snapshot_of(&self, sa: &IkeSa, children_of: &IkeSa, now: Duration) -> Option<IkeSnapshot> {
        let chosen = sa.chosen?;
        let keys = sa.sk_keys.as_ref()?;
        let sk = sa.sk.as_ref()?;
        let rekeying_ike = matches!(
            sa.pending,
            Some(super::Pending {
                what: Req::IkeRekey { .. },
                ..
            })
        );
        let secret = |k: &Zeroizing<Vec<u8>>| Secret(k.clone());
        let children = children_of
            .children
            .iter()
            .map(|c| {
                let (state, rekey_in) = match c.state {
                    ChildState::Installed => (ChildSnapState::Installed, left(c.rekey_at, now)),
                    // Our rekey of it is in flight: done again after the
                    // takeover (the peer may not have had the request).
                    ChildState::Rekeying => (ChildSnapState::Installed, Some(Duration::ZERO)),
                    ChildState::Rekeyed => (ChildSnapState::Rekeyed, None),
                    ChildState::Deleting => (ChildSnapState::Deleting, None),
                };
                ChildSnapshot {
                    spi_in: c.spi_in,
                    spi_out: c.spi_out,
                    protocol: super::protocol_id(c.protocol),
                    algorithms: Algorithms::of(&c.chosen, ProposalKind::Esp),
                    local_ts: c.local_ts.clone(),
                    remote_ts: c.remote_ts.clone(),
                    state,
                    out_active: c.out_active,
                    replaced: c.replaced,
                    rekey_in,
                    expire_in: left(c.expire_at, now),
                    ni: Bytes(c.nonces.0.clone()),
                    nr: Bytes(c.nonces.1.clone()),
                    held_out: c.pending_out.as_ref().map(|(out, at)| HeldOut {
                        enc_key: Secret(out.enc_key.clone()),
                        integ_key: Secret(out.integ_key.clone()),
                        switch_in: at.saturating_sub(now),
                        replaces: c.replaces,
                    }),
                    slot: c.slot,
                }
            })
            .collect();
        Some(IkeSnapshot {
            version: IkeSnapshot::VERSION,
            conn: self.conns[sa.conn].name.clone(),
            initiator: sa.initiator,
            spi_i: sa.spi_i,
            spi_r: sa.spi_r,
            local: sa.local,
            remote: sa.remote,
            nat: sa.nat,
            algorithms: Algorithms::of(&chosen, ProposalKind::Ike),
            sk_d: secret(&sa.sk_d),
            sk_ei: secret(&keys.ei),
            sk_er: secret(&keys.er),
            sk_ai: secret(&keys.ai),
            sk_ar: secret(&keys.ar),
            sk_pi: secret(&sa.sk_pi),
            sk_pr: secret(&sa.sk_pr),
            next_iv: sk.next_iv(),
            ni: Bytes(sa.ni.clone()),
            nr: Bytes(sa.nr.clone()),
            next_out_id: next_out(sa),
            next_in_id: sa.next_in_id,
            last_response: sa
                .last_resp
                .as_ref()
                .map(|(id, d)| (*id, d.iter().cloned().map(Bytes).collect())),
            peer_id: sa.peer_id.as_ref().map(|p| PeerId {
                id_type: p.id_type(),
                data: Bytes(p.data()),
            }),
            fragmentation: sa.fragmentation,
            mobike: sa.mobike,
            qesp_declined: sa.qesp_declined,
            per_cpu_peer: sa.per_cpu_peer,
            pfs_group: sa.pfs_group.map(|g| g.id()),
            established_for: sa
                .established_at
                .map_or(Duration::ZERO, |t| now.saturating_sub(t)),
            rekey_in: if rekeying_ike {
                Some(Duration::ZERO)
            } else if !std::ptr::eq(sa, children_of) {
                // The peer's new SA of crossed rekeys has no rekey time
                // until it takes the children: a whole one, as then.
                Some(self.conns[sa.conn].rekey_time).filter(|d| !d.is_zero())
            } else {
                left(sa.rekey_at, now)
            },
            children,
            retiring: self
                .lingering
                .iter()
                .filter_map(|(at, ev)| match ev {
                    Event::RemoveSa {
                        conn,
                        spi,
                        protocol,
                        outbound: false,
                    } if *conn == self.conns[sa.conn].name => Some(RetiringSa {
                        spi: *spi,
                        protocol: super::protocol_id(*protocol),
                        remove_in: at.saturating_sub(now),
                    }),
                    _ => None,
                })
                .collect(),
            crossed_for: if std::ptr::eq(sa, children_of) {
                left(sa.crossed_until, now).filter(|d| !d.is_zero())
            } else {
                Some(super::CROSSED_TAKEOVER_WINDOW)
            },
        })
    }

    /// Continues the established IKE SA of `snap` (made by [`Ike::export`]
    /// of an engine with the same connection): the SA and its children are
    /// taken as they were, without [`super::Event::InstallSa`] (the data
    /// plane has the child SAs), their timers run on from the remaining
    /// times, and a liveness check goes out at once. If the peer never
    /// answers it, the IKE SA is removed and the connection negotiated anew
    /// (whatever its DPD action: the continued SA stood for that
    /// negotiation). Refused when the connection is unknown here, already
    /// has an IKE SA, or the snapshot does not fit.
    pub fn import(&mut self, now: Duration, snap: &IkeSnapshot) -> Result<(), CommandError> {
        let r = self.import_sa(now, snap);
        self.rearm_dirty();
        r
    }

    fn import_sa(&mut self, now: Duration, snap: &IkeSnapshot) -> Result<(), CommandError> {
        let what = format!(
            "IKE SA {:016x}_i {:016x}_r of connection \"{}\"",
            snap.spi_i, snap.spi_r, snap.conn
        );
        let refuse = |why: String| Err(CommandError(format!("{what} cannot be continued: {why}")));
        if snap.version != IkeSnapshot::VERSION {
            return refuse(format!(
                "snapshot version {} (this engine reads version {})",
                snap.version,
                IkeSnapshot::VERSION
            ));
        }
        let ci = match self.conn_index(&snap.conn) {
            Ok(ci) => ci,
            Err(e) => return refuse(e.0),
        };
        if let Some(sa) = self.by_conn[ci]
            .iter()
            .map(|&i| &self.sas[i])
            .find(|s| s.state != State::Deleting)
        {
            return refuse(format!(
                "the connection already has an IKE SA here ({}, {:016x}_i {:016x}_r)",
                sa.state_name(),
                sa.spi_i,
                sa.spi_r
            ));
        }
        let local_spi = if snap.initiator {
            snap.spi_i
        } else {
            snap.spi_r
        };
        if snap.spi_i == 0 || snap.spi_r == 0 {
            return refuse("an SPI is zero".into());
        }
        if self.ike_spis.contains(&local_spi) || self.by_spi.contains_key(&local_spi) {
            return refuse(format!(
                "an IKE SA with our SPI {local_spi:016x} is already here"
            ));
        }
        let c = &self.conns[ci];
        if snap.local.ip() != c.local {
            return refuse(format!(
                "it runs from {}, the connection's address here is {}",
                snap.local.ip(),
                c.local
            ));
        }
        let Some(chosen) = snap
            .algorithms
            .chosen(ProposalKind::Ike)
            .filter(|x| x.prf.is_some())
        else {
            return refuse(format!(
                "its IKE algorithms ({}) are not understood",
                snap.algorithms.name
            ));
        };
        let (out_keys, in_keys) = if snap.initiator {
            ((&snap.sk_ei, &snap.sk_ai), (&snap.sk_er, &snap.sk_ar))
        } else {
            ((&snap.sk_er, &snap.sk_ar), (&snap.sk_ei, &snap.sk_ai))
        };
        let mut sk = match SkCrypto::new(
            chosen.suite(),
            (&out_keys.0 .0, &out_keys.1 .0),
            (&in_keys.0 .0, &in_keys.1 .0),
        ) {
            Ok(sk) => sk,
            Err(e) => return refuse(format!("its SK keys do not fit {}: {e}", chosen.name())),
        };
        sk.set_next_iv(snap.next_iv.saturating_add(IV_SKIP));
        let peer_id = match &snap.peer_id {
            Some(p) => match Identity::from_payload(p.id_type, &p.data.0) {
                Ok(id) => Some(id),
                Err(e) => return refuse(format!("its peer identity: {e}")),
            },
            None => None,
        };
        let pfs_group = match snap.pfs_group {
            Some(g) => match Group::from_id(g) {
                Some(g) => Some(g),
                None => return refuse(format!("unknown PFS group {g}")),
            },
            None => None,
        };
        let mut children = Vec::new();
        let mut spis = HashSet::new();
        for cs in &snap.children {
            let Some(protocol) = protocol_of(cs.protocol) else {
                return refuse(format!(
                    "child SA {:08x}_i has protocol {}",
                    cs.spi_in, cs.protocol
                ));
            };
            let Some(chosen) = cs.algorithms.chosen(ProposalKind::Esp) else {
                return refuse(format!(
                    "the algorithms of child SA {:08x}_i ({}) are not understood",
                    cs.spi_in, cs.algorithms.name
                ));
            };
            if cs.spi_in <= 255 || self.child_spis.contains(&cs.spi_in) || !spis.insert(cs.spi_in) {
                return refuse(format!(
                    "child SA {:08x}_i is already here (or its SPI is invalid)",
                    cs.spi_in
                ));
            }
            children.push(Child {
                spi_in: cs.spi_in,
                spi_out: cs.spi_out,
                protocol,
                chosen,
                local_ts: cs.local_ts.clone(),
                remote_ts: cs.remote_ts.clone(),
                state: match cs.state {
                    ChildSnapState::Installed => ChildState::Installed,
                    ChildSnapState::Rekeyed => ChildState::Rekeyed,
                    ChildSnapState::Deleting => ChildState::Deleting,
                },
                rekey_at: cs.rekey_in.map(|d| now + d),
                expire_at: cs.expire_in.map(|d| now + d),
                pending_out: None,
                out_active: cs.out_active,
                replaced: cs.replaced,
                nonces: (cs.ni.0.clone(), cs.nr.0.clone()),
                slot: cs.slot,
                // With a held outbound SA: set below.
                replaces: None,
            });
        }
        let mut retiring = Vec::new();
        for r in &snap.retiring {
            let Some(protocol) = protocol_of(r.protocol) else {
                return refuse(format!(
                    "retiring SA {:08x} has protocol {}",
                    r.spi, r.protocol
                ));
            };
            // Unless this engine uses the SPI by now (then it is not ours
            // to remove).
            if !self.child_spis.contains(&r.spi) && spis.insert(r.spi) {
                let ev = Event::RemoveSa {
                    conn: snap.conn.clone(),
                    spi: r.spi,
                    protocol,
                    outbound: false,
                };
                retiring.push((now + r.remove_in, ev));
            }
        }
        // Deletes to send again: ours in flight, and those of children our
        // rekeys replaced. A child replaced by the peer's rekey (a held
        // outbound SA waits for it) is the peer's to delete.
        let holding = snap.children.iter().any(|c| c.held_out.is_some());
        let deletes: Vec<u32> = snap
            .children
            .iter()
            .filter(|c| match c.state {
                ChildSnapState::Installed => false,
                ChildSnapState::Rekeyed => !holding,
                ChildSnapState::Deleting => true,
            })
            .map(|c| c.spi_in)
            .collect();

        let mut sa = IkeSa::new(
            ci,
            snap.initiator,
            (snap.spi_i, snap.spi_r),
            State::Established,
            (snap.local, snap.remote),
            now,
        );
        sa.nat = snap.nat;
        sa.chosen = Some(chosen);
        sa.sk = Some(sk);
        sa.sk_keys = Some(SkKeys {
            ei: snap.sk_ei.0.clone(),
            er: snap.sk_er.0.clone(),
            ai: snap.sk_ai.0.clone(),
            ar: snap.sk_ar.0.clone(),
        });
        sa.sk_d = snap.sk_d.0.clone();
        sa.sk_pi = snap.sk_pi.0.clone();
        sa.sk_pr = snap.sk_pr.0.clone();
        sa.ni = snap.ni.0.clone();
        sa.nr = snap.nr.0.clone();
        if let Some(g) = chosen.dh {
            sa.group = g;
        }
        sa.next_out_id = snap.next_out_id;
        sa.next_in_id = snap.next_in_id;
        sa.last_resp = snap
            .last_response
            .as_ref()
            .map(|(id, d)| (*id, d.iter().map(|b| b.0.clone()).collect()));
        sa.children = children;
        sa.established_at = Some(now.saturating_sub(snap.established_for));
        sa.rekey_at = snap.rekey_in.map(|d| now + d);
        sa.peer_id = peer_id;
        sa.fragmentation = snap.fragmentation;
        sa.mobike = snap.mobike;
        sa.qesp_declined = snap.qesp_declined;
        sa.per_cpu_peer = snap.per_cpu_peer;
        sa.pfs_group = pfs_group;
        sa.continued = true;
        sa.resync_in = true;
        sa.crossed_until = snap
            .crossed_for
            .map(|d| now + d.min(super::CROSSED_TAKEOVER_WINDOW));
        // The liveness check first, then the deletes.
        sa.tasks.push_back(Task::Dpd);
        sa.tasks.extend(deletes.into_iter().map(Task::DeleteChild));
        let i = self.insert_sa(sa);
        self.ike_spis.insert(local_spi);
        self.child_spis.extend(spis);
        self.lingering.extend(retiring);
        // Held outbound SAs of a rekey we answered: installed when the
        // peer deletes the old child, as they would have been.
        let mode = self.conns[ci].child.mode;
        for cs in &snap.children {
            let Some(h) = &cs.held_out else { continue };
            let Some(pos) = self.sas[i]
                .children
                .iter()
                .position(|c| c.spi_in == cs.spi_in)
            else {
                continue;
            };
            let c = &self.sas[i].children[pos];
            let out = self.sa_install(
                i,
                true,
                (c.protocol, c.spi_out),
                &c.chosen,
                h.enc_key.0.clone(),
                h.integ_key.0.clone(),
                (&c.local_ts, &c.remote_ts),
                mode,
                c.slot,
            );
            let c = &mut self.sas[i].children[pos];
            c.pending_out = Some((out, now + h.switch_in));
            c.replaces = h.replaces;
        }
        self.restart_at.remove(&ci);
        self.count(IkeEvent::IkeSasContinued);
        let peer = self.sas[i]
            .peer_id
            .as_ref()
            .map(|x| x.to_string())
            .unwrap_or_default();
        self.log(
            Level::Info,
            Some(ci),
            format!(
                "IKE SA {:016x}_i {:016x}_r with {peer} at {} continued from the cluster's \
                 previous leader ({}, {} child SA(s), message IDs {} out, {} in): checking \
                 that the peer answers",
                snap.spi_i,
                snap.spi_r,
                snap.remote,
                chosen.name(),
                snap.children.len(),
                snap.next_out_id,
                snap.next_in_id,
            ),
        );
        self.kick(i, now);
        Ok(())
    }
}
