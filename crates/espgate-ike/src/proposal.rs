//! Proposals: strongSwan proposal strings (`aes128gcm16-prfsha256-x25519`)
//! to SA payload proposals and back, and the responder's choice among the
//! proposals offered (RFC 7296 §2.7, §3.3).

use super::dh::Group;
use super::keys::{KeyLens, Prf};
use super::wire::{self, encr, integ as integ_id, protocol, transform_type, Transform};
use espgate_core::crypto::{parse_enc, parse_integ, Enc, Integ, Suite};
use std::fmt;

/// What a proposal is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProposalKind {
    /// The IKE SA: encryption, PRF, integrity (unless AEAD), a group.
    Ike,
    /// An ESP child SA: encryption, integrity (unless AEAD), optional group
    /// (PFS), ESN choice.
    Esp,
}

impl ProposalKind {
    /// The Protocol ID its proposals carry by default: IKE (1) or ESP (3).
    /// A Q-ESP child SA proposal is of kind [`ProposalKind::Esp`] (the
    /// same transforms) with [`protocol::QESP`] instead.
    pub const fn protocol(self) -> u8 {
        match self {
            ProposalKind::Ike => protocol::IKE,
            ProposalKind::Esp => protocol::ESP,
        }
    }
}

/// The proposals among `specs` that Q-ESP can use (`docs/QESP.md` §4: it
/// refuses an SA without encryption), with the integrity-only AES-GMAC
/// algorithms left out; a proposal left without an algorithm is dropped.
pub fn qesp_capable(specs: &[ProposalSpec]) -> Vec<ProposalSpec> {
    specs
        .iter()
        .filter_map(|p| {
            let mut p = p.clone();
            p.encr.retain(|e| !matches!(e, Enc::AesGmac(_)));
            (!p.encr.is_empty()).then_some(p)
        })
        .collect()
}

/// One proposal with possibly several algorithms per transform type, as a
/// strongSwan proposal string lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposalSpec {
    /// IKE or ESP.
    pub kind: ProposalKind,
    /// Encryption algorithms, preferred first.
    pub encr: Vec<Enc>,
    /// Integrity algorithms (empty with AEAD).
    pub integ: Vec<Integ>,
    /// PRFs (IKE only).
    pub prf: Vec<Prf>,
    /// Key exchange groups (IKE: at least one; ESP: PFS groups, may be empty).
    pub dh: Vec<Group>,
    /// Extended sequence numbers offered/accepted (ESP only; `[false]` by default).
    pub esn: Vec<bool>,
}

/// A proposal string that does not describe a usable proposal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposalError(pub String);

impl fmt::Display for ProposalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProposalError {}

fn err<T>(s: impl Into<String>) -> Result<T, ProposalError> {
    Err(ProposalError(s.into()))
}

fn push<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}

impl ProposalSpec {
    /// Parses a strongSwan proposal string: algorithm keywords joined by
    /// `-`, in any order (`aes128gcm16-prfsha256-x25519`,
    /// `aes256-sha256-modp2048`, `aes128gcm16-esn`). For IKE without an
    /// explicit PRF the PRFs follow the integrity algorithms (sha256 →
    /// prfsha256), or prfsha256 with AEAD.
    pub fn parse(kind: ProposalKind, s: &str) -> Result<ProposalSpec, ProposalError> {
        let mut p = ProposalSpec {
            kind,
            encr: Vec::new(),
            integ: Vec::new(),
            prf: Vec::new(),
            dh: Vec::new(),
            esn: Vec::new(),
        };
        let lower = s.trim().to_ascii_lowercase();
        if lower.is_empty() {
            return err("empty proposal");
        }
        for tok in lower.split('-') {
            if let Some(e) = parse_enc(tok) {
                if matches!(e, Enc::Des | Enc::Null)
                    || (kind == ProposalKind::Ike && matches!(e, Enc::AesGmac(_)))
                {
                    return err(format!(
                        "'{tok}' cannot be negotiated by espgate's IKE in a {kind:?} proposal"
                    ));
                }
                push(&mut p.encr, e);
            } else if let Some(i) = parse_integ(tok) {
                if i == Integ::AesXcbc || i == Integ::Md5 {
                    return err(format!("'{tok}' is not supported for IKE-negotiated SAs"));
                }
                push(&mut p.integ, i);
            } else if let Some(f) = Prf::from_name(tok) {
                if kind == ProposalKind::Esp {
                    return err(format!("'{tok}' is a PRF: ESP proposals have none"));
                }
                push(&mut p.prf, f);
            } else if let Some(g) = Group::from_name(tok) {
                push(&mut p.dh, g);
            } else if tok == "esn" || tok == "noesn" {
                if kind == ProposalKind::Ike {
                    return err(format!("'{tok}' applies to ESP proposals only"));
                }
                push(&mut p.esn, tok == "esn");
            } else {
                return err(format!(
                    "unknown algorithm '{tok}' in proposal '{s}' (encryption: aes128gcm16, \
                     aes256gcm16, chacha20poly1305, aes128, aes256; integrity: sha256, sha384, \
                     sha512, sha1; PRF: prfsha256, prfsha384, prfsha512; groups: x25519, ecp256, \
                     ecp384, modp2048, modp3072; esn, noesn)"
                ));
            }
        }
        if p.encr.is_empty() {
            return err(format!("proposal '{s}' has no encryption algorithm"));
        }
        let aead = p.encr.iter().filter(|e| e.is_combined()).count();
        if aead != 0 && aead != p.encr.len() {
            return err(format!(
                "proposal '{s}' mixes AEAD and non-AEAD encryption: write two proposals"
            ));
        }
        if aead != 0 && !p.integ.is_empty() {
            return err(format!(
                "proposal '{s}': an AEAD algorithm authenticates by itself, drop the integrity \
                 algorithm (for IKE write the PRF as prfsha256)"
            ));
        }
        if aead == 0 && p.integ.is_empty() {
            return err(format!(
                "proposal '{s}' needs an integrity algorithm (e.g. sha256)"
            ));
        }
        if kind == ProposalKind::Ike {
            if p.prf.is_empty() {
                for i in &p.integ {
                    let f = match i {
                        Integ::Sha384 => Prf::HmacSha384,
                        Integ::Sha512 => Prf::HmacSha512,
                        _ => Prf::HmacSha256,
                    };
                    push(&mut p.prf, f);
                }
                if p.prf.is_empty() {
                    p.prf.push(Prf::HmacSha256);
                }
            }
            if p.dh.is_empty() {
                return err(format!(
                    "IKE proposal '{s}' needs a key exchange group (x25519, ecp256, ecp384, \
                     modp2048, modp3072)"
                ));
            }
        }
        if kind == ProposalKind::Esp && p.esn.is_empty() {
            p.esn.push(false);
        }
        Ok(p)
    }

    /// Parses a comma-separated list of proposal strings.
    pub fn parse_list(kind: ProposalKind, s: &str) -> Result<Vec<ProposalSpec>, ProposalError> {
        s.split(',')
            .filter(|t| !t.trim().is_empty())
            .map(|t| ProposalSpec::parse(kind, t))
            .collect()
    }

    /// The strongSwan-style string.
    pub fn name(&self) -> String {
        let mut parts: Vec<String> = self.encr.iter().map(|e| e.name().to_string()).collect();
        parts.extend(self.integ.iter().map(|i| i.name().to_string()));
        parts.extend(self.prf.iter().map(|p| p.name().to_string()));
        parts.extend(self.dh.iter().map(|g| g.name().to_string()));
        if self.kind == ProposalKind::Esp && self.esn != [false] {
            parts.extend(
                self.esn
                    .iter()
                    .map(|e| if *e { "esn" } else { "noesn" }.to_string()),
            );
        }
        parts.join("-")
    }

    /// The SA payload proposal with number `number` and SPI `spi`.
    /// `pfs` (ESP): the group list to offer, overriding `dh` (for
    /// IKE_AUTH, whose child SA never has a KE payload, pass `Some(&[])`).
    pub fn to_wire(&self, number: u8, spi: &[u8], pfs: Option<&[Group]>) -> wire::Proposal {
        let mut t = Vec::new();
        for e in &self.encr {
            t.push(enc_transform(*e));
        }
        if self.kind == ProposalKind::Ike {
            for f in &self.prf {
                t.push(Transform::new(transform_type::PRF, f.id()));
            }
        }
        for i in &self.integ {
            t.push(Transform::new(transform_type::INTEG, integ_to_id(*i)));
        }
        let groups = pfs.unwrap_or(&self.dh);
        for g in groups {
            t.push(Transform::new(transform_type::DH, g.id()));
        }
        if self.kind == ProposalKind::Esp {
            for e in &self.esn {
                t.push(Transform::new(
                    transform_type::ESN,
                    if *e { wire::esn::YES } else { wire::esn::NO },
                ));
            }
        }
        wire::Proposal {
            number,
            protocol: self.kind.protocol(),
            spi: spi.to_vec(),
            transforms: t,
        }
    }
}

fn enc_transform(e: Enc) -> Transform {
    match e {
        Enc::AesCbc(bits) => Transform::with_key_length(transform_type::ENCR, encr::AES_CBC, bits),
        Enc::AesGcm16(bits) => {
            Transform::with_key_length(transform_type::ENCR, encr::AES_GCM_16, bits)
        }
        Enc::AesGmac(bits) => {
            Transform::with_key_length(transform_type::ENCR, encr::NULL_AUTH_AES_GMAC, bits)
        }
        Enc::ChaCha20Poly1305 => Transform::new(transform_type::ENCR, encr::CHACHA20_POLY1305),
        Enc::TripleDes => Transform::new(transform_type::ENCR, encr::TRIPLE_DES),
        Enc::Null => Transform::new(transform_type::ENCR, encr::NULL),
        Enc::Des => Transform::new(transform_type::ENCR, 2),
    }
}

fn enc_from_transform(t: &Transform) -> Option<Enc> {
    // Only the Key Length attribute is understood; a transform with any other
    // attribute is not selected (RFC 7296 §3.3.6).
    if t.attributes.len() > usize::from(t.key_length().is_some()) {
        return None;
    }
    let bits = t.key_length();
    let aes_bits = |b: Option<u16>| b.filter(|b| matches!(b, 128 | 192 | 256));
    Some(match t.id {
        encr::AES_CBC => Enc::AesCbc(aes_bits(bits)?),
        encr::AES_GCM_16 => Enc::AesGcm16(aes_bits(bits).filter(|b| *b != 192)?),
        encr::NULL_AUTH_AES_GMAC => Enc::AesGmac(aes_bits(bits).filter(|b| *b != 192)?),
        encr::CHACHA20_POLY1305 if bits.is_none() => Enc::ChaCha20Poly1305,
        encr::TRIPLE_DES if bits.is_none() => Enc::TripleDes,
        _ => return None,
    })
}

fn integ_to_id(i: Integ) -> u16 {
    match i {
        Integ::Md5 => integ_id::HMAC_MD5_96,
        Integ::Sha1 => integ_id::HMAC_SHA1_96,
        Integ::Sha256 => integ_id::HMAC_SHA2_256_128,
        Integ::Sha384 => integ_id::HMAC_SHA2_384_192,
        Integ::Sha512 => integ_id::HMAC_SHA2_512_256,
        Integ::AesXcbc => integ_id::AES_XCBC_96,
    }
}

fn integ_from_id(id: u16) -> Option<Integ> {
    [Integ::Sha1, Integ::Sha256, Integ::Sha384, Integ::Sha512]
        .into_iter()
        .find(|i| integ_to_id(*i) == id)
}

/// The algorithms agreed on: one per transform type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chosen {
    /// Encryption.
    pub encr: Enc,
    /// Integrity (None with AEAD).
    pub integ: Option<Integ>,
    /// PRF (IKE only).
    pub prf: Option<Prf>,
    /// Key exchange group (IKE; ESP with PFS).
    pub dh: Option<Group>,
    /// Extended sequence numbers (ESP).
    pub esn: bool,
}

impl Chosen {
    /// The cipher suite (encryption + integrity).
    pub fn suite(&self) -> Suite {
        Suite {
            enc: Some(self.encr),
            integ: self.integ,
        }
    }

    /// Key lengths for the key derivation.
    pub fn key_lens(&self) -> KeyLens {
        KeyLens {
            enc: self.encr.key_len(),
            integ: self.integ.map_or(0, Integ::key_len),
        }
    }

    /// strongSwan-style name of the agreed algorithms.
    pub fn name(&self) -> String {
        let mut s = self.encr.name().to_string();
        if let Some(i) = self.integ {
            s.push('-');
            s.push_str(i.name());
        }
        if let Some(p) = self.prf {
            s.push('-');
            s.push_str(p.name());
        }
        if let Some(g) = self.dh {
            s.push('-');
            s.push_str(g.name());
        }
        if self.esn {
            s.push_str("-esn");
        }
        s
    }

    /// The one-transform-per-type proposal a responder returns, keeping the
    /// offered proposal's number and with `spi` as SPI, for the kind's
    /// default protocol ([`Chosen::to_wire_as`] for another).
    pub fn to_wire(&self, kind: ProposalKind, number: u8, spi: &[u8]) -> wire::Proposal {
        self.to_wire_as(kind, kind.protocol(), number, spi)
    }

    /// [`Chosen::to_wire`] with Protocol ID `proto` (the offered
    /// proposal's: [`protocol::QESP`] for a Q-ESP child SA).
    pub fn to_wire_as(
        &self,
        kind: ProposalKind,
        proto: u8,
        number: u8,
        spi: &[u8],
    ) -> wire::Proposal {
        let spec = ProposalSpec {
            kind,
            encr: vec![self.encr],
            integ: self.integ.into_iter().collect(),
            prf: self.prf.into_iter().collect(),
            dh: self.dh.into_iter().collect(),
            esn: vec![self.esn],
        };
        let mut w = spec.to_wire(number, spi, None);
        w.protocol = proto;
        w
    }

    /// Reads a one-transform-per-type proposal (a responder's answer) and
    /// checks it against what we offered: its Protocol ID must be the
    /// kind's (IKE or ESP) and every transform one of ours. `None` if the
    /// answer is not a valid choice (the initiator must then fail the
    /// exchange, RFC 7296 §3.3.6).
    pub fn from_answer(
        answer: &wire::Proposal,
        offered: &[ProposalSpec],
        kind: ProposalKind,
        pfs_offered: bool,
    ) -> Option<Chosen> {
        Chosen::from_answer_as(answer, offered, kind, kind.protocol(), pfs_offered)
    }

    /// [`Chosen::from_answer`] for proposals we offered with Protocol ID
    /// `proto` (`offered`: those proposals): an answer with another
    /// Protocol ID is not a choice among them.
    pub fn from_answer_as(
        answer: &wire::Proposal,
        offered: &[ProposalSpec],
        kind: ProposalKind,
        proto: u8,
        pfs_offered: bool,
    ) -> Option<Chosen> {
        if answer.protocol != proto {
            return None;
        }
        let c = single(answer, kind)?;
        let fits = offered.iter().any(|o| {
            o.encr.contains(&c.encr)
                && c.integ.is_none_or(|i| o.integ.contains(&i))
                && c.integ.is_some() != o.integ.is_empty()
                && (kind == ProposalKind::Esp || c.prf.is_some_and(|p| o.prf.contains(&p)))
                && match (kind, c.dh) {
                    (ProposalKind::Ike, Some(g)) => o.dh.contains(&g),
                    (ProposalKind::Esp, Some(g)) => pfs_offered && o.dh.contains(&g),
                    (ProposalKind::Esp, None) => !pfs_offered || o.dh.is_empty(),
                    (ProposalKind::Ike, None) => false,
                }
                && (kind == ProposalKind::Ike || o.esn.contains(&c.esn))
        });
        fits.then_some(c)
    }
}

/// Reads a proposal with exactly one transform of each type present.
pub(crate) fn single(p: &wire::Proposal, kind: ProposalKind) -> Option<Chosen> {
    let one = |tt: u8| -> Option<Option<&Transform>> {
        let mut it = p.transforms.iter().filter(|t| t.transform_type == tt);
        let first = it.next();
        if it.next().is_some() {
            return None;
        }
        Some(first)
    };
    if p.transforms
        .iter()
        .any(|t| !(1..=5).contains(&t.transform_type))
    {
        return None;
    }
    let encr = enc_from_transform(one(transform_type::ENCR)??)?;
    let integ = match one(transform_type::INTEG)? {
        None => None,
        Some(t) if t.id == integ_id::NONE => None,
        Some(t) => Some(integ_from_id(t.id)?),
    };
    if encr.is_combined() == integ.is_some() {
        return None;
    }
    let prf = match one(transform_type::PRF)? {
        None => None,
        Some(t) => Some(Prf::from_id(t.id)?),
    };
    let dh = match one(transform_type::DH)? {
        None => None,
        Some(t) if t.id == wire::dh::NONE => None,
        Some(t) => Some(Group::from_id(t.id)?),
    };
    let esn = match one(transform_type::ESN)? {
        None => false,
        Some(t) => match t.id {
            wire::esn::NO => false,
            wire::esn::YES => true,
            _ => return None,
        },
    };
    match kind {
        ProposalKind::Ike if prf.is_none() || dh.is_none() => None,
        ProposalKind::Esp if prf.is_some() => None,
        _ => Some(Chosen {
            encr,
            integ,
            prf,
            dh,
            esn,
        }),
    }
}

/// The responder's choice (RFC 7296 §2.7): our proposals in our order of
/// preference; for each, the first offered proposal of the right protocol
/// that has, for every transform type, an algorithm we accept; within a
/// type our preferred algorithm wins. `pfs`: ESP only — whether the
/// exchange carries a KE payload (a group must then be chosen; without
/// one, offered groups other than NONE exclude the proposal, RFC 7296 §1.3.1).
/// Returns the offered proposal's number, its SPI and the choice.
/// Only proposals with the kind's Protocol ID (IKE or ESP) are considered
/// ([`select_as`] for another).
pub fn select(
    ours: &[ProposalSpec],
    offered: &[wire::Proposal],
    kind: ProposalKind,
    pfs: bool,
) -> Option<(u8, Vec<u8>, Chosen)> {
    select_as(ours, offered, kind, kind.protocol(), pfs)
}

/// [`select`] among the offered proposals with Protocol ID `proto`
/// ([`protocol::QESP`] for Q-ESP, whose transforms are ESP's); proposals
/// of other protocols are passed over.
pub fn select_as(
    ours: &[ProposalSpec],
    offered: &[wire::Proposal],
    kind: ProposalKind,
    proto: u8,
    pfs: bool,
) -> Option<(u8, Vec<u8>, Chosen)> {
    for o in ours {
        for p in offered.iter().filter(|p| p.protocol == proto) {
            if p.transforms
                .iter()
                .any(|t| !(1..=5).contains(&t.transform_type))
            {
                continue;
            }
            if let Some(c) = match_one(o, p, kind, pfs) {
                return Some((p.number, p.spi.clone(), c));
            }
        }
    }
    None
}

fn match_one(
    o: &ProposalSpec,
    p: &wire::Proposal,
    kind: ProposalKind,
    pfs: bool,
) -> Option<Chosen> {
    let of = |tt: u8| p.transforms.iter().filter(move |t| t.transform_type == tt);
    let encr = o
        .encr
        .iter()
        .copied()
        .find(|e| of(transform_type::ENCR).any(|t| enc_from_transform(t) == Some(*e)))?;
    let offered_integ: Vec<u16> = of(transform_type::INTEG)
        .map(|t| t.id)
        .filter(|id| *id != integ_id::NONE)
        .collect();
    let integ = if encr.is_combined() {
        // An AEAD proposal has no integrity transform, or only NONE.
        if !offered_integ.is_empty() {
            return None;
        }
        None
    } else {
        Some(
            o.integ
                .iter()
                .copied()
                .find(|i| offered_integ.contains(&integ_to_id(*i)))?,
        )
    };
    let prf = match kind {
        ProposalKind::Ike => Some(
            o.prf
                .iter()
                .copied()
                .find(|f| of(transform_type::PRF).any(|t| t.id == f.id()))?,
        ),
        ProposalKind::Esp => {
            if of(transform_type::PRF).next().is_some() {
                return None;
            }
            None
        }
    };
    let offered_dh: Vec<u16> = of(transform_type::DH).map(|t| t.id).collect();
    let dh = match kind {
        ProposalKind::Ike => Some(
            o.dh.iter()
                .copied()
                .find(|g| offered_dh.contains(&g.id()))?,
        ),
        ProposalKind::Esp if pfs => Some(
            o.dh.iter()
                .copied()
                .find(|g| offered_dh.contains(&g.id()))?,
        ),
        ProposalKind::Esp => {
            if offered_dh.iter().any(|g| *g != wire::dh::NONE)
                && !offered_dh.contains(&wire::dh::NONE)
            {
                return None;
            }
            None
        }
    };
    let esn = match kind {
        ProposalKind::Ike => false,
        ProposalKind::Esp => {
            let offered_esn: Vec<u16> = of(transform_type::ESN).map(|t| t.id).collect();
            if offered_esn.is_empty() {
                // RFC 7296 §3.3.3: ESN is mandatory in ESP proposals; accept
                // its absence as "no ESN" when we allow that.
                if !o.esn.contains(&false) {
                    return None;
                }
                false
            } else {
                *o.esn.iter().find(|e| {
                    offered_esn.contains(&if **e { wire::esn::YES } else { wire::esn::NO })
                })?
            }
        }
    };
    Some(Chosen {
        encr,
        integ,
        prf,
        dh,
        esn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strongswan_strings_parse_and_print() {
        let p = ProposalSpec::parse(ProposalKind::Ike, "aes128gcm16-prfsha256-x25519").unwrap();
        assert_eq!(p.encr, [Enc::AesGcm16(128)]);
        assert!(p.integ.is_empty());
        assert_eq!(p.prf, [Prf::HmacSha256]);
        assert_eq!(p.dh, [Group::Curve25519]);
        assert_eq!(p.name(), "aes128gcm16-prfsha256-x25519");

        let p = ProposalSpec::parse(ProposalKind::Ike, "aes256-sha256-modp2048").unwrap();
        assert_eq!(p.encr, [Enc::AesCbc(256)]);
        assert_eq!(p.integ, [Integ::Sha256]);
        assert_eq!(
            p.prf,
            [Prf::HmacSha256],
            "PRF follows the integrity algorithm"
        );
        assert_eq!(p.dh, [Group::Modp2048]);

        let p =
            ProposalSpec::parse(ProposalKind::Esp, "aes128gcm16-aes256gcm16-esn-noesn").unwrap();
        assert_eq!(p.encr.len(), 2);
        assert_eq!(p.esn, [true, false]);
        let p = ProposalSpec::parse(ProposalKind::Esp, "aes256-sha512-ecp384").unwrap();
        assert_eq!(p.dh, [Group::Ecp384]);
        assert_eq!(p.esn, [false]);
    }

    #[test]
    fn bad_strings_are_refused_with_reasons() {
        for (kind, s, needle) in [
            (ProposalKind::Ike, "aes128-x25519", "integrity"),
            (ProposalKind::Ike, "aes128gcm16-sha256-x25519", "AEAD"),
            (ProposalKind::Ike, "aes128-sha256", "group"),
            (
                ProposalKind::Ike,
                "aes128-sha256-modp999",
                "unknown algorithm 'modp999'",
            ),
            (ProposalKind::Esp, "aes128gcm16-prfsha256", "PRF"),
            (ProposalKind::Ike, "aes128gcm16-prfsha256-x25519-esn", "ESP"),
            (
                ProposalKind::Ike,
                "aes128gcm16-aes128-sha256-x25519",
                "mixes",
            ),
            (ProposalKind::Esp, "", "empty"),
        ] {
            let e = ProposalSpec::parse(kind, s).unwrap_err();
            assert!(e.0.contains(needle), "{s}: {e}");
        }
    }

    #[test]
    fn responder_picks_its_preference_among_offered() {
        let ours = ProposalSpec::parse_list(
            ProposalKind::Ike,
            "aes256gcm16-prfsha384-ecp384,aes128gcm16-prfsha256-x25519",
        )
        .unwrap();
        let theirs = [
            ProposalSpec::parse(ProposalKind::Ike, "aes128gcm16-prfsha256-x25519-ecp256")
                .unwrap()
                .to_wire(1, &[], None),
            ProposalSpec::parse(ProposalKind::Ike, "aes256gcm16-prfsha384-prfsha256-ecp384")
                .unwrap()
                .to_wire(2, &[], None),
        ];
        let (num, _, c) = select(&ours, &theirs, ProposalKind::Ike, false).unwrap();
        assert_eq!(num, 2);
        assert_eq!(c.name(), "aes256gcm16-prfsha384-ecp384");
        // The answer reads back as valid against the offer.
        let ans = c.to_wire(ProposalKind::Ike, num, &[]);
        let offer: Vec<ProposalSpec> = [
            "aes128gcm16-prfsha256-x25519-ecp256",
            "aes256gcm16-prfsha384-prfsha256-ecp384",
        ]
        .iter()
        .map(|s| ProposalSpec::parse(ProposalKind::Ike, s).unwrap())
        .collect();
        assert_eq!(
            Chosen::from_answer(&ans, &offer, ProposalKind::Ike, false),
            Some(c)
        );
        // An answer with an algorithm never offered is refused.
        let bogus = ProposalSpec::parse(ProposalKind::Ike, "aes256gcm16-prfsha512-ecp384")
            .unwrap()
            .to_wire(2, &[], None);
        assert_eq!(
            Chosen::from_answer(&bogus, &offer, ProposalKind::Ike, false),
            None
        );
    }

    #[test]
    fn no_common_algorithm_means_no_proposal_chosen() {
        let ours =
            ProposalSpec::parse_list(ProposalKind::Ike, "aes128gcm16-prfsha256-x25519").unwrap();
        let theirs = [
            ProposalSpec::parse(ProposalKind::Ike, "aes256-sha256-modp2048")
                .unwrap()
                .to_wire(1, &[], None),
        ];
        assert!(select(&ours, &theirs, ProposalKind::Ike, false).is_none());
    }

    #[test]
    fn esp_pfs_and_esn_rules() {
        let ours =
            ProposalSpec::parse_list(ProposalKind::Esp, "aes128gcm16-x25519-esn-noesn").unwrap();
        let offer = ProposalSpec::parse(ProposalKind::Esp, "aes128gcm16-x25519-esn").unwrap();
        // With a KE payload the group is chosen.
        let (_, spi, c) = select(
            &ours,
            &[offer.to_wire(1, &[1, 2, 3, 4], None)],
            ProposalKind::Esp,
            true,
        )
        .unwrap();
        assert_eq!(spi, [1, 2, 3, 4]);
        assert_eq!(c.dh, Some(Group::Curve25519));
        assert!(c.esn);
        // In IKE_AUTH (no KE) a proposal offering only a real group is refused ...
        assert!(select(
            &ours,
            &[offer.to_wire(1, &[1, 2, 3, 4], None)],
            ProposalKind::Esp,
            false
        )
        .is_none());
        // ... but the same proposal sent without groups is fine.
        let (_, _, c) = select(
            &ours,
            &[offer.to_wire(1, &[1, 2, 3, 4], Some(&[]))],
            ProposalKind::Esp,
            false,
        )
        .unwrap();
        assert_eq!(c.dh, None);
        // An ESN-only peer against a no-ESN config: no match.
        let noesn = ProposalSpec::parse_list(ProposalKind::Esp, "aes128gcm16").unwrap();
        assert!(select(
            &noesn,
            &[offer.to_wire(1, &[0; 4], Some(&[]))],
            ProposalKind::Esp,
            false
        )
        .is_none());
    }

    #[test]
    fn selection_and_answers_by_protocol_id() {
        let ours =
            ProposalSpec::parse_list(ProposalKind::Esp, "aes128gcm16,aes256-sha256").unwrap();
        let spec = ProposalSpec::parse(ProposalKind::Esp, "aes128gcm16").unwrap();
        let mut qesp = spec.to_wire(1, &[0, 0, 0, 1], Some(&[]));
        qesp.protocol = protocol::QESP;
        let esp = spec.to_wire(2, &[0, 0, 0, 2], Some(&[]));
        let offer = [qesp.clone(), esp.clone()];
        // ESP selection passes over the Q-ESP proposal, and the other way round.
        let (n, spi, c) = select(&ours, &offer, ProposalKind::Esp, false).unwrap();
        assert_eq!((n, spi), (2, vec![0, 0, 0, 2]));
        let (n, spi, q) =
            select_as(&ours, &offer, ProposalKind::Esp, protocol::QESP, false).unwrap();
        assert_eq!((n, spi), (1, vec![0, 0, 0, 1]));
        assert_eq!(c, q);
        assert!(select_as(&ours, &[esp], ProposalKind::Esp, protocol::QESP, false).is_none());
        // The answer carries the protocol it was chosen for, and reads back
        // only against proposals of that protocol.
        let ans = q.to_wire_as(ProposalKind::Esp, protocol::QESP, 1, &[9, 9, 9, 9]);
        assert_eq!(ans.protocol, protocol::QESP);
        assert_eq!(
            Chosen::from_answer_as(&ans, &ours, ProposalKind::Esp, protocol::QESP, false),
            Some(q)
        );
        assert_eq!(
            Chosen::from_answer(&ans, &ours, ProposalKind::Esp, false),
            None,
            "a Q-ESP answer is not an ESP choice"
        );
        let ans = c.to_wire(ProposalKind::Esp, 2, &[9, 9, 9, 9]);
        assert_eq!(
            Chosen::from_answer(&ans, &ours, ProposalKind::Esp, false),
            Some(c)
        );
        assert_eq!(
            Chosen::from_answer_as(&ans, &ours, ProposalKind::Esp, protocol::QESP, false),
            None
        );
        // Q-ESP needs encryption: AES-GMAC is left out of its proposals.
        let mixed =
            ProposalSpec::parse_list(ProposalKind::Esp, "aes128gmac,aes256gcm16-aes128gmac")
                .unwrap();
        let q = qesp_capable(&mixed);
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].encr, [Enc::AesGcm16(256)]);
    }

    #[test]
    fn unknown_transforms_or_attributes_are_not_chosen() {
        let ours = ProposalSpec::parse_list(ProposalKind::Ike, "aes128-sha256-x25519").unwrap();
        let mut p = ProposalSpec::parse(ProposalKind::Ike, "aes128-sha256-x25519")
            .unwrap()
            .to_wire(1, &[], None);
        p.transforms[0].attributes.push(wire::Attribute::Tv {
            attr_type: 99,
            value: 1,
        });
        assert!(select(&ours, &[p.clone()], ProposalKind::Ike, false).is_none());
        p.transforms[0].attributes.pop();
        p.transforms.push(Transform::new(9, 1));
        assert!(select(&ours, &[p], ProposalKind::Ike, false).is_none());
    }
}
