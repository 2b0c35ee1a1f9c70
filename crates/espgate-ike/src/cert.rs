//! X.509 certificates for IKEv2 authentication: identities (IDi/IDr payload
//! contents, RFC 7296 §3.5), reading certificates, binding an identity to a
//! certificate, and validating a chain up to a trusted CA.
//!
//! Chain validation is rustls-webpki with aws-lc-rs signature algorithms;
//! the certificate fields IKE needs (subject, subjectAltName, SPKI) are read
//! by a small strict DER parser here. Nothing reads a clock: the caller
//! passes the time to [`verify_chain`].

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use rustls_pki_types::{CertificateDer, SignatureVerificationAlgorithm, UnixTime};

use rustls_pki_types::pem::PemObject;

use super::sig::der::{self, Reader};
use super::sig::{pem_error, PublicKey, SigError};

/// ID type ID_IPV4_ADDR (RFC 7296 §3.5).
pub const ID_IPV4_ADDR: u8 = 1;
/// ID type ID_FQDN.
pub const ID_FQDN: u8 = 2;
/// ID type ID_RFC822_ADDR.
pub const ID_RFC822_ADDR: u8 = 3;
/// ID type ID_IPV6_ADDR.
pub const ID_IPV6_ADDR: u8 = 5;
/// ID type ID_DER_ASN1_DN.
pub const ID_DER_ASN1_DN: u8 = 9;
/// ID type ID_KEY_ID.
pub const ID_KEY_ID: u8 = 11;

/// Errors from identities, certificate parsing and chain validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    /// The PEM text could not be read or holds no certificate.
    #[error("PEM: {0}")]
    Pem(&'static str),
    /// A DER structure is malformed.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// An identification payload type this implementation does not handle.
    #[error("unsupported identification type {0}")]
    UnsupportedIdType(u8),
    /// Identity text or payload data that is not valid for its type.
    #[error("invalid identity: {0}")]
    InvalidIdentity(String),
    /// The certificate's public key is not usable.
    #[error("certificate public key: {0}")]
    PublicKey(#[from] SigError),
    /// [`verify_chain`] was given no trust anchor.
    #[error("no trust anchor (CA certificate) configured")]
    NoTrustAnchor,
    /// A certificate of the chain has expired at the given time.
    #[error("certificate expired")]
    Expired,
    /// A certificate of the chain is not valid yet at the given time.
    #[error("certificate not valid yet")]
    NotYetValid,
    /// No path leads from the end entity to a trust anchor.
    #[error("issuer not found among the trusted CAs and intermediates")]
    UnknownIssuer,
    /// A certificate's signature does not verify with its issuer's key.
    #[error("certificate signature does not verify")]
    BadSignature,
    /// A certificate is signed with an algorithm that is not accepted.
    #[error("certificate signature algorithm not supported")]
    UnsupportedSignatureAlgorithm,
    /// Another reason for webpki to refuse the chain.
    #[error("certificate rejected: {0}")]
    Rejected(String),
}

/// The identity in an IDi/IDr payload (RFC 7296 §3.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// ID_IPV4_ADDR (1).
    Ipv4(Ipv4Addr),
    /// ID_IPV6_ADDR (5).
    Ipv6(Ipv6Addr),
    /// ID_FQDN (2), e.g. `moon.example`.
    Fqdn(String),
    /// ID_RFC822_ADDR (3), e.g. `carol@example.org`.
    Rfc822(String),
    /// ID_DER_ASN1_DN (9): the DER encoding of an X.501 Name.
    Dn(Vec<u8>),
    /// ID_KEY_ID (11): opaque bytes.
    KeyId(Vec<u8>),
}

impl Identity {
    /// The ID type number (RFC 7296 §3.5): 1, 5, 2, 3, 9 or 11.
    pub fn id_type(&self) -> u8 {
        match self {
            Identity::Ipv4(_) => ID_IPV4_ADDR,
            Identity::Ipv6(_) => ID_IPV6_ADDR,
            Identity::Fqdn(_) => ID_FQDN,
            Identity::Rfc822(_) => ID_RFC822_ADDR,
            Identity::Dn(_) => ID_DER_ASN1_DN,
            Identity::KeyId(_) => ID_KEY_ID,
        }
    }

    /// The identification data of an IDi/IDr payload.
    pub fn data(&self) -> Vec<u8> {
        match self {
            Identity::Ipv4(a) => a.octets().to_vec(),
            Identity::Ipv6(a) => a.octets().to_vec(),
            Identity::Fqdn(s) | Identity::Rfc822(s) => s.as_bytes().to_vec(),
            Identity::Dn(d) | Identity::KeyId(d) => d.clone(),
        }
    }

    /// Reads IDi/IDr payload contents. Addresses must have their exact
    /// length, FQDN and RFC 822 names must be non-empty printable ASCII, a
    /// DN must be one DER Name, a key id must be non-empty.
    pub fn from_payload(id_type: u8, data: &[u8]) -> Result<Identity, CertError> {
        let ascii = |what: &str| -> Result<String, CertError> {
            if data.is_empty() || !data.iter().all(|b| (0x21..=0x7e).contains(b)) {
                return Err(CertError::InvalidIdentity(format!(
                    "{what} must be non-empty printable ASCII"
                )));
            }
            Ok(data.iter().map(|&b| char::from(b)).collect())
        };
        match id_type {
            ID_IPV4_ADDR => <[u8; 4]>::try_from(data)
                .map(|a| Identity::Ipv4(Ipv4Addr::from(a)))
                .map_err(|_| CertError::InvalidIdentity("ID_IPV4_ADDR must be 4 bytes".into())),
            ID_IPV6_ADDR => <[u8; 16]>::try_from(data)
                .map(|a| Identity::Ipv6(Ipv6Addr::from(a)))
                .map_err(|_| CertError::InvalidIdentity("ID_IPV6_ADDR must be 16 bytes".into())),
            ID_FQDN => ascii("ID_FQDN").map(Identity::Fqdn),
            ID_RFC822_ADDR => ascii("ID_RFC822_ADDR").map(Identity::Rfc822),
            ID_DER_ASN1_DN => {
                parse_name(data).ok_or(CertError::Malformed("ID_DER_ASN1_DN (not a DER Name)"))?;
                Ok(Identity::Dn(data.to_vec()))
            }
            ID_KEY_ID if !data.is_empty() => Ok(Identity::KeyId(data.to_vec())),
            ID_KEY_ID => Err(CertError::InvalidIdentity("ID_KEY_ID is empty".into())),
            other => Err(CertError::UnsupportedIdType(other)),
        }
    }

    /// Reads an identity from configuration text, as strongSwan does:
    /// `10.0.0.1` and `fd00::1` are addresses; text with `=` is a DN
    /// (`C=CH, O=strongSwan, CN=moon`); `@#0a1b...` is a hex key id;
    /// `@moon.example` and `moon.example` are FQDNs; `carol@example.org`
    /// is an RFC 822 address.
    pub fn parse(s: &str) -> Result<Identity, CertError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(CertError::InvalidIdentity("empty identity".into()));
        }
        if let Some(key_id) = s.strip_prefix("@#") {
            return hex::decode(key_id)
                .ok()
                .filter(|k| !k.is_empty())
                .map(Identity::KeyId)
                .ok_or_else(|| CertError::InvalidIdentity(format!("bad hex key id {s:?}")));
        }
        if let Some(fqdn) = s.strip_prefix('@') {
            return check_name(fqdn, "FQDN").map(Identity::Fqdn);
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(match ip {
                IpAddr::V4(a) => Identity::Ipv4(a),
                IpAddr::V6(a) => Identity::Ipv6(a),
            });
        }
        if s.contains('=') {
            return dn_from_string(s).map(Identity::Dn);
        }
        if s.contains('@') {
            return check_name(s, "RFC 822 address").map(Identity::Rfc822);
        }
        check_name(s, "FQDN").map(Identity::Fqdn)
    }

    /// True if `other` names the same identity: FQDNs and RFC 822 addresses
    /// compare ASCII-case-insensitively (an FQDN's trailing dot ignored),
    /// DNs attribute by attribute (string types and ASCII case ignored),
    /// the rest byte for byte.
    pub fn matches(&self, other: &Identity) -> bool {
        match (self, other) {
            (Identity::Fqdn(a), Identity::Fqdn(b)) => fqdn_eq(a, b),
            (Identity::Rfc822(a), Identity::Rfc822(b)) => a.eq_ignore_ascii_case(b),
            (Identity::Dn(a), Identity::Dn(b)) => names_equal(a, b),
            _ => self == other,
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Ipv4(a) => write!(f, "{a}"),
            Identity::Ipv6(a) => write!(f, "{a}"),
            // `@` marks an FQDN that would read as something else without
            // it (`@92.0.2.1`, `@a=b`, `@a@b`): the text always parses back
            // to this identity, as a configuration written back must.
            Identity::Fqdn(s) if Identity::parse(s).is_ok_and(|id| id == *self) => f.write_str(s),
            Identity::Fqdn(s) => write!(f, "@{s}"),
            Identity::Rfc822(s) => f.write_str(s),
            Identity::Dn(d) => match dn_to_string(d) {
                Some(s) => f.write_str(&s),
                None => write!(f, "DN:{}", hex::encode(d)),
            },
            Identity::KeyId(k) => write!(f, "@#{}", hex::encode(k)),
        }
    }
}

fn check_name(s: &str, what: &str) -> Result<String, CertError> {
    if s.is_empty() || !s.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(CertError::InvalidIdentity(format!(
            "{what} {s:?} must be non-empty printable ASCII without spaces"
        )));
    }
    Ok(s.to_owned())
}

fn fqdn_eq(a: &str, b: &str) -> bool {
    a.strip_suffix('.')
        .unwrap_or(a)
        .eq_ignore_ascii_case(b.strip_suffix('.').unwrap_or(b))
}

/// Known DN attribute names: (name, dotted OID, preferred string tag when
/// the value is printable).
const DN_ATTRIBUTES: &[(&str, &str, u8)] = &[
    ("C", "2.5.4.6", der::PRINTABLE_STRING),
    ("CN", "2.5.4.3", der::PRINTABLE_STRING),
    ("SN", "2.5.4.4", der::PRINTABLE_STRING),
    ("serialNumber", "2.5.4.5", der::PRINTABLE_STRING),
    ("L", "2.5.4.7", der::PRINTABLE_STRING),
    ("ST", "2.5.4.8", der::PRINTABLE_STRING),
    ("O", "2.5.4.10", der::PRINTABLE_STRING),
    ("OU", "2.5.4.11", der::PRINTABLE_STRING),
    ("T", "2.5.4.12", der::PRINTABLE_STRING),
    ("GN", "2.5.4.42", der::PRINTABLE_STRING),
    ("E", "1.2.840.113549.1.9.1", der::IA5_STRING),
    ("DC", "0.9.2342.19200300.100.1.25", der::IA5_STRING),
    ("UID", "0.9.2342.19200300.100.1.1", der::UTF8_STRING),
];

/// Other spellings accepted in configuration text.
const DN_ALIASES: &[(&str, &str)] = &[
    ("S", "ST"),
    ("title", "T"),
    ("emailAddress", "E"),
    ("Email", "E"),
    ("G", "GN"),
    ("givenName", "GN"),
    ("surname", "SN"),
];

fn is_printable_string(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b" '()+,-./:=?".contains(&b))
}

/// Builds the DER Name for text like `C=CH, O=strongSwan, CN=moon`
/// (RDNs separated by `,`, a `\` escapes the next character).
fn dn_from_string(s: &str) -> Result<Vec<u8>, CertError> {
    let bad = |why: &str| CertError::InvalidIdentity(format!("DN {s:?}: {why}"));
    let mut parts: Vec<String> = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(n) => parts.last_mut().map_or((), |p| p.push(n)),
                None => return Err(bad("trailing backslash")),
            },
            ',' => parts.push(String::new()),
            c => parts.last_mut().map_or((), |p| p.push(c)),
        }
    }
    let mut rdns = Vec::new();
    for part in &parts {
        let (key, value) = part.split_once('=').ok_or_else(|| bad("RDN without '='"))?;
        let (key, value) = (key.trim(), value.trim());
        if value.is_empty() {
            return Err(bad("empty attribute value"));
        }
        let key = DN_ALIASES
            .iter()
            .find(|(alias, _)| alias.eq_ignore_ascii_case(key))
            .map_or(key, |(_, name)| name);
        let (oid, tag) = match DN_ATTRIBUTES
            .iter()
            .find(|(name, _, _)| name.eq_ignore_ascii_case(key))
        {
            Some((_, dotted, tag)) => (der::oid_from_string(dotted), *tag),
            None => (der::oid_from_string(key), der::PRINTABLE_STRING),
        };
        let oid = oid.ok_or_else(|| bad("unknown attribute name"))?;
        let tag = match tag {
            der::PRINTABLE_STRING if is_printable_string(value) => der::PRINTABLE_STRING,
            der::IA5_STRING if value.is_ascii() => der::IA5_STRING,
            _ => der::UTF8_STRING,
        };
        let mut atv = der::write(der::OID, &oid);
        der::write_into(&mut atv, tag, value.as_bytes());
        let rdn = der::write(der::SET, &der::write(der::SEQUENCE, &atv));
        rdns.extend_from_slice(&rdn);
    }
    Ok(der::write(der::SEQUENCE, &rdns))
}

/// One attribute of a DN: OID contents, value tag, value bytes.
type Attribute<'a> = (&'a [u8], u8, &'a [u8]);

/// Parses a DER Name (which must be exactly one element) into its RDNs.
fn parse_name(input: &[u8]) -> Option<Vec<Vec<Attribute<'_>>>> {
    let body = der::single(input, der::SEQUENCE).ok()?;
    let mut r = Reader::new(body);
    let mut rdns = Vec::new();
    while !r.is_empty() {
        let set = r.read(der::SET).ok()?;
        let mut sr = Reader::new(set);
        let mut attrs = Vec::new();
        while !sr.is_empty() {
            let atv = sr.read(der::SEQUENCE).ok()?;
            let mut ar = Reader::new(atv);
            let oid = ar.read(der::OID).ok()?;
            let value = ar.read_any().ok()?;
            ar.finish().ok()?;
            attrs.push((oid, value.tag, value.content));
        }
        if attrs.is_empty() {
            return None;
        }
        rdns.push(attrs);
    }
    Some(rdns)
}

fn is_string_tag(tag: u8) -> bool {
    matches!(
        tag,
        der::UTF8_STRING | der::PRINTABLE_STRING | der::IA5_STRING | der::T61_STRING
    )
}

/// Compares two DER Names attribute by attribute: same OIDs in the same
/// order; string values equal ignoring ASCII case and the string type;
/// other values byte for byte. Unparsable names compare byte for byte.
fn names_equal(a: &[u8], b: &[u8]) -> bool {
    let (Some(na), Some(nb)) = (parse_name(a), parse_name(b)) else {
        return a == b;
    };
    na.len() == nb.len()
        && na.iter().zip(&nb).all(|(ra, rb)| {
            ra.len() == rb.len()
                && ra.iter().zip(rb).all(|(&(oa, ta, va), &(ob, tb, vb))| {
                    oa == ob
                        && if is_string_tag(ta) && is_string_tag(tb) {
                            va.eq_ignore_ascii_case(vb)
                        } else {
                            ta == tb && va == vb
                        }
                })
        })
}

/// Text form of a DER Name: `C=CH, O=strongSwan, CN=moon`.
fn dn_to_string(input: &[u8]) -> Option<String> {
    let rdns = parse_name(input)?;
    let mut out = String::new();
    for (i, rdn) in rdns.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        for (j, &(oid, tag, value)) in rdn.iter().enumerate() {
            if j > 0 {
                out.push_str(" + ");
            }
            let dotted = der::oid_to_string(oid);
            match DN_ATTRIBUTES.iter().find(|(_, d, _)| *d == dotted) {
                Some((name, _, _)) => out.push_str(name),
                None => out.push_str(&dotted),
            }
            out.push('=');
            let text = match tag {
                der::UTF8_STRING | der::PRINTABLE_STRING | der::IA5_STRING => {
                    core::str::from_utf8(value).ok().map(str::to_owned)
                }
                der::T61_STRING => Some(value.iter().map(|&b| char::from(b)).collect()),
                _ => None,
            };
            match text {
                Some(t) => {
                    for c in t.chars() {
                        if c == ',' || c == '\\' {
                            out.push('\\');
                        }
                        out.push(c);
                    }
                }
                None => {
                    out.push('#');
                    out.push_str(&hex::encode(value));
                }
            }
        }
    }
    Some(out)
}

/// A subjectAltName entry this module uses.
#[derive(Clone, Debug, PartialEq, Eq)]
enum AltName {
    Dns(String),
    Email(String),
    Ip(Vec<u8>),
    Dn(Vec<u8>),
}

/// A parsed X.509 certificate; the DER is kept for chain validation and
/// for CERT payloads.
#[derive(Clone, PartialEq, Eq)]
pub struct Certificate {
    der: Vec<u8>,
    issuer: Vec<u8>,
    subject: Vec<u8>,
    spki: Vec<u8>,
    alt_names: Vec<AltName>,
    subject_key_id: Option<Vec<u8>>,
}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |d: &[u8]| dn_to_string(d).unwrap_or_else(|| hex::encode(d));
        f.debug_struct("Certificate")
            .field("subject", &show(&self.subject))
            .field("issuer", &show(&self.issuer))
            .field("alt_names", &self.alt_names)
            .finish_non_exhaustive()
    }
}

const OID_SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
const OID_SUBJECT_KEY_ID: &[u8] = &[0x55, 0x1d, 0x0e];
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

impl Certificate {
    /// Parses one DER certificate (v1 to v3). Signatures and validity are
    /// not checked here; see [`verify_chain`] (webpki).
    ///
    /// Read by hand: webpki's certificate parser accepts v3 only (trust
    /// anchors may be v1) and exposes the subject and issuer but neither
    /// the subjectAltName e-mail, IP address and directory names IKE
    /// identities are matched against, nor the subjectKeyIdentifier.
    pub fn from_der(input: &[u8]) -> Result<Certificate, CertError> {
        use der::{ctx, ctx_prim, BIT_STRING, INTEGER, SEQUENCE};
        const WHAT: &str = "certificate";
        let m = |_| CertError::Malformed(WHAT);
        let body = der::single(input, SEQUENCE).map_err(m)?;
        let mut r = Reader::new(body);
        let tbs = r.read(SEQUENCE).map_err(m)?;
        r.read(SEQUENCE).map_err(m)?; // signatureAlgorithm
        r.read(BIT_STRING).map_err(m)?; // signatureValue
        r.finish().map_err(m)?;

        let mut t = Reader::new(tbs);
        let version = match t.read_optional(ctx(0)).map_err(m)? {
            Some(v) => der::small_uint(der::single(v, INTEGER).map_err(m)?).map_err(m)?,
            None => 0,
        };
        if version > 2 {
            return Err(CertError::Malformed("certificate version"));
        }
        t.read(INTEGER).map_err(m)?; // serialNumber
        t.read(SEQUENCE).map_err(m)?; // signature
        let issuer = t.read_raw(SEQUENCE).map_err(m)?;
        t.read(SEQUENCE).map_err(m)?; // validity
        let subject = t.read_raw(SEQUENCE).map_err(m)?;
        let spki = t.read_raw(SEQUENCE).map_err(m)?;
        t.read_optional(ctx_prim(1)).map_err(m)?; // issuerUniqueID
        t.read_optional(ctx_prim(2)).map_err(m)?; // subjectUniqueID
        let extensions = t.read_optional(ctx(3)).map_err(m)?;
        t.finish().map_err(m)?;
        if parse_name(issuer).is_none() || parse_name(subject).is_none() {
            return Err(CertError::Malformed("certificate name"));
        }

        let mut alt_names = Vec::new();
        let mut subject_key_id = None;
        let mut seen_san = false;
        if let Some(exts) = extensions {
            let list = der::single(exts, SEQUENCE).map_err(m)?;
            let mut er = Reader::new(list);
            while !er.is_empty() {
                let ext = er.read(SEQUENCE).map_err(m)?;
                let mut xr = Reader::new(ext);
                let oid = xr.read(der::OID).map_err(m)?;
                xr.read_optional(der::BOOLEAN).map_err(m)?; // critical
                let value = xr.read(der::OCTET_STRING).map_err(m)?;
                xr.finish().map_err(m)?;
                if oid == OID_SUBJECT_ALT_NAME {
                    if seen_san {
                        return Err(CertError::Malformed(
                            "certificate (two subjectAltName extensions)",
                        ));
                    }
                    seen_san = true;
                    alt_names = parse_alt_names(value)?;
                } else if oid == OID_SUBJECT_KEY_ID {
                    let ski = der::single(value, der::OCTET_STRING)
                        .map_err(|_| CertError::Malformed("subjectKeyIdentifier"))?;
                    subject_key_id = Some(ski.to_vec());
                }
            }
        }
        Ok(Certificate {
            der: input.to_vec(),
            issuer: issuer.to_vec(),
            subject: subject.to_vec(),
            spki: spki.to_vec(),
            alt_names,
            subject_key_id,
        })
    }

    /// Reads every `CERTIFICATE` block of PEM text, in order; other blocks
    /// are skipped. At least one certificate must be present.
    pub fn from_pem(input: &[u8]) -> Result<Vec<Certificate>, CertError> {
        let certs = CertificateDer::pem_slice_iter(input)
            .map(|c| match c {
                Ok(der) => Certificate::from_der(der.as_ref()),
                Err(e) => Err(CertError::Pem(pem_error(
                    input,
                    &e,
                    "no CERTIFICATE block found",
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if certs.is_empty() {
            return Err(CertError::Pem("no CERTIFICATE block found"));
        }
        Ok(certs)
    }

    /// The certificate DER (the CERT payload's data for encoding 4).
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// The subject's public key.
    pub fn public_key(&self) -> Result<PublicKey, CertError> {
        Ok(PublicKey::from_spki_der(&self.spki)?)
    }

    /// The DER subject Name.
    pub fn subject_dn_der(&self) -> &[u8] {
        &self.subject
    }

    /// The DER issuer Name.
    pub fn issuer_dn_der(&self) -> &[u8] {
        &self.issuer
    }

    /// The subject as an ID_DER_ASN1_DN identity (strongSwan's default ID
    /// for a certificate).
    pub fn subject_identity(&self) -> Identity {
        Identity::Dn(self.subject.clone())
    }

    /// The common names of the subject.
    fn common_names(&self) -> Vec<String> {
        parse_name(&self.subject)
            .unwrap_or_default()
            .iter()
            .flatten()
            .filter(|(oid, tag, _)| *oid == OID_COMMON_NAME && is_string_tag(*tag))
            .filter_map(|(_, _, v)| core::str::from_utf8(v).ok().map(str::to_owned))
            .collect()
    }

    /// True if the certificate binds `id`. An IP address, FQDN or RFC 822
    /// identity must appear in subjectAltName; an FQDN may also equal a
    /// subject CN when the certificate has no DNS name in subjectAltName
    /// (as strongSwan accepts). A DN must equal the subject (or a
    /// directoryName alternative name). A key id must equal the
    /// subjectKeyIdentifier, the SHA-1 of the SubjectPublicKeyInfo or the
    /// SHA-1 of the subjectPublicKey bits.
    pub fn matches_identity(&self, id: &Identity) -> bool {
        match id {
            Identity::Ipv4(a) => self
                .alt_names
                .iter()
                .any(|n| matches!(n, AltName::Ip(ip) if ip.as_slice() == a.octets())),
            Identity::Ipv6(a) => self
                .alt_names
                .iter()
                .any(|n| matches!(n, AltName::Ip(ip) if ip.as_slice() == a.octets())),
            Identity::Fqdn(name) => {
                let mut has_dns = false;
                for n in &self.alt_names {
                    if let AltName::Dns(d) = n {
                        has_dns = true;
                        if fqdn_eq(d, name) {
                            return true;
                        }
                    }
                }
                !has_dns && self.common_names().iter().any(|cn| fqdn_eq(cn, name))
            }
            Identity::Rfc822(addr) => self
                .alt_names
                .iter()
                .any(|n| matches!(n, AltName::Email(e) if e.eq_ignore_ascii_case(addr))),
            Identity::Dn(dn) => {
                names_equal(&self.subject, dn)
                    || self
                        .alt_names
                        .iter()
                        .any(|n| matches!(n, AltName::Dn(d) if names_equal(d, dn)))
            }
            Identity::KeyId(k) => {
                self.subject_key_id.as_deref() == Some(k.as_slice())
                    || self.spki_sha1().as_slice() == k.as_slice()
                    || self
                        .public_key_bits_sha1()
                        .is_some_and(|h| h.as_slice() == k.as_slice())
            }
        }
    }

    /// SHA-1 of the subjectPublicKeyInfo DER: the CA identifier carried in
    /// CERTREQ payloads (RFC 7296 §3.7).
    pub fn spki_sha1(&self) -> [u8; 20] {
        sha1(&self.spki)
    }

    /// SHA-1 of the subjectPublicKey BIT STRING contents (RFC 5280
    /// §4.2.1.2 method 1 key identifier).
    fn public_key_bits_sha1(&self) -> Option<[u8; 20]> {
        let body = der::single(&self.spki, der::SEQUENCE).ok()?;
        let mut r = Reader::new(body);
        r.read(der::SEQUENCE).ok()?;
        let bits = r.read(der::BIT_STRING).ok()?;
        Some(sha1(bits.get(1..)?))
    }
}

fn sha1(data: &[u8]) -> [u8; 20] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, data);
    let mut out = [0u8; 20];
    out.copy_from_slice(d.as_ref());
    out
}

/// Parses the GeneralNames of a subjectAltName extension, keeping DNS
/// names, RFC 822 names, IP addresses and directory names.
fn parse_alt_names(value: &[u8]) -> Result<Vec<AltName>, CertError> {
    let m = |_| CertError::Malformed("subjectAltName");
    let list = der::single(value, der::SEQUENCE).map_err(m)?;
    let mut r = Reader::new(list);
    let mut names = Vec::new();
    while !r.is_empty() {
        let gn = r.read_any().map_err(m)?;
        let text = || {
            core::str::from_utf8(gn.content)
                .ok()
                .filter(|s| s.is_ascii())
                .map(str::to_owned)
        };
        match gn.tag {
            t if t == der::ctx_prim(1) => names.extend(text().map(AltName::Email)),
            t if t == der::ctx_prim(2) => names.extend(text().map(AltName::Dns)),
            // Addresses only; 8- and 32-byte values (address + mask) occur in name constraints.
            t if t == der::ctx_prim(7) && matches!(gn.content.len(), 4 | 16) => {
                names.push(AltName::Ip(gn.content.to_vec()));
            }
            t if t == der::ctx(4) => {
                parse_name(gn.content).ok_or(CertError::Malformed("directoryName"))?;
                names.push(AltName::Dn(gn.content.to_vec()));
            }
            _ => {}
        }
    }
    Ok(names)
}

/// Accepts any extended key usage, or none: IKE does not require
/// serverAuth or clientAuth. A malformed extension is still an error.
struct AnyExtendedKeyUsage;

impl webpki::ExtendedKeyUsageValidator for AnyExtendedKeyUsage {
    fn validate(&self, iter: webpki::KeyPurposeIdIter<'_, '_>) -> Result<(), webpki::Error> {
        for purpose in iter {
            purpose?;
        }
        Ok(())
    }
}

/// Certificate signature algorithms accepted in chains (no SHA-1, RSA of
/// at least 2048 bits).
static CHAIN_ALGORITHMS: &[&dyn SignatureVerificationAlgorithm] = &[
    webpki::aws_lc_rs::ED25519,
    webpki::aws_lc_rs::ECDSA_P256_SHA256,
    webpki::aws_lc_rs::ECDSA_P256_SHA384,
    webpki::aws_lc_rs::ECDSA_P256_SHA512,
    webpki::aws_lc_rs::ECDSA_P384_SHA256,
    webpki::aws_lc_rs::ECDSA_P384_SHA384,
    webpki::aws_lc_rs::ECDSA_P384_SHA512,
    webpki::aws_lc_rs::ECDSA_P521_SHA256,
    webpki::aws_lc_rs::ECDSA_P521_SHA384,
    webpki::aws_lc_rs::ECDSA_P521_SHA512,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA256,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA384,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA512,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA256_ABSENT_PARAMS,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA384_ABSENT_PARAMS,
    webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA512_ABSENT_PARAMS,
    webpki::aws_lc_rs::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
    webpki::aws_lc_rs::RSA_PSS_2048_8192_SHA384_LEGACY_KEY,
    webpki::aws_lc_rs::RSA_PSS_2048_8192_SHA512_LEGACY_KEY,
];

fn map_webpki(e: webpki::Error) -> CertError {
    use webpki::Error as E;
    match e {
        E::CertExpired { .. } => CertError::Expired,
        E::CertNotValidYet { .. } => CertError::NotYetValid,
        E::UnknownIssuer => CertError::UnknownIssuer,
        E::InvalidSignatureForPublicKey => CertError::BadSignature,
        E::UnsupportedSignatureAlgorithmContext(_)
        | E::UnsupportedSignatureAlgorithmForPublicKeyContext(_) => {
            CertError::UnsupportedSignatureAlgorithm
        }
        other => CertError::Rejected(format!("{other}")),
    }
}

/// Validates `end_entity` up to one of `trust_anchors` (CA certificates),
/// possibly through `intermediates`, at `now_unix_secs` (the caller passes
/// the time). Signatures are checked with aws-lc-rs (no SHA-1); validity
/// periods, basic constraints, path length and name constraints are
/// enforced; any extended key usage is accepted, and none is required.
/// Revocation is not checked.
pub fn verify_chain(
    end_entity: &Certificate,
    intermediates: &[Certificate],
    trust_anchors: &[Certificate],
    now_unix_secs: u64,
) -> Result<(), CertError> {
    if trust_anchors.is_empty() {
        return Err(CertError::NoTrustAnchor);
    }
    let ee_der = CertificateDer::from(end_entity.der());
    let ee = webpki::EndEntityCert::try_from(&ee_der).map_err(map_webpki)?;
    let anchor_ders: Vec<CertificateDer<'_>> = trust_anchors
        .iter()
        .map(|c| CertificateDer::from(c.der()))
        .collect();
    let anchors = anchor_ders
        .iter()
        .map(|d| webpki::anchor_from_trusted_cert(d).map_err(map_webpki))
        .collect::<Result<Vec<_>, _>>()?;
    let intermediate_ders: Vec<CertificateDer<'_>> = intermediates
        .iter()
        .map(|c| CertificateDer::from(c.der()))
        .collect();
    let time = UnixTime::since_unix_epoch(Duration::from_secs(now_unix_secs));
    ee.verify_for_usage(
        CHAIN_ALGORITHMS,
        &anchors,
        &intermediate_ders,
        time,
        AnyExtendedKeyUsage,
        None,
        None,
    )
    .map_err(map_webpki)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_bytes!(concat!("../tests/vectors/ike/certs/", $name)).as_slice()
        };
    }

    /// 2030-03-17: inside every fixture's validity (2026-11-23 to 2126-10-30).
    const T_VALID: u64 = 1_900_000_000;
    /// 2200-01-01: after every fixture expired.
    const T_EXPIRED: u64 = 7_258_118_400;
    /// 2023-11-14: before any fixture was issued.
    const T_EARLY: u64 = 1_700_000_000;

    fn cert(pem_text: &[u8]) -> Certificate {
        let mut v = Certificate::from_pem(pem_text).expect("fixture certificate");
        assert_eq!(v.len(), 1);
        v.remove(0)
    }

    fn moon() -> Certificate {
        cert(fixture!("moon-p256.crt"))
    }

    fn ca_p256() -> Certificate {
        cert(fixture!("ca-p256.crt"))
    }

    #[test]
    fn valid_chains_are_accepted() {
        // ECDSA P-256, with an EKU of serverAuth + ikeIntermediate.
        assert_eq!(verify_chain(&moon(), &[], &[ca_p256()], T_VALID), Ok(()));
        // No subjectAltName and no extended key usage.
        let cnonly = cert(fixture!("cnonly-p256.crt"));
        assert_eq!(verify_chain(&cnonly, &[], &[ca_p256()], T_VALID), Ok(()));
        // Ed25519 CA and end entity.
        let carol = cert(fixture!("carol-ed25519.crt"));
        let ca_ed = cert(fixture!("ca-ed25519.crt"));
        assert_eq!(verify_chain(&carol, &[], &[ca_ed], T_VALID), Ok(()));
        // RSA CA signing with RSASSA-PSS.
        let sun = cert(fixture!("sun-rsa.crt"));
        let ca_rsa = cert(fixture!("ca-rsa.crt"));
        assert_eq!(
            verify_chain(&sun, &[], std::slice::from_ref(&ca_rsa), T_VALID),
            Ok(())
        );
        // Through an intermediate, with several anchors configured.
        let venus = cert(fixture!("venus-p256.crt"));
        let chain = Certificate::from_pem(fixture!("chain-p256.pem")).unwrap();
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1], ca_p256());
        assert_eq!(
            verify_chain(&venus, &chain[..1], &[ca_rsa, ca_p256()], T_VALID),
            Ok(())
        );
        // Without the intermediate there is no path.
        assert_eq!(
            verify_chain(&venus, &[], &[ca_p256()], T_VALID),
            Err(CertError::UnknownIssuer)
        );
    }

    #[test]
    fn validity_period_is_enforced() {
        assert_eq!(
            verify_chain(&moon(), &[], &[ca_p256()], T_EXPIRED),
            Err(CertError::Expired)
        );
        assert_eq!(
            verify_chain(&moon(), &[], &[ca_p256()], T_EARLY),
            Err(CertError::NotYetValid)
        );
        let venus = cert(fixture!("venus-p256.crt"));
        let int = cert(fixture!("int-p256.crt"));
        assert_eq!(
            verify_chain(&venus, &[int], &[ca_p256()], T_EXPIRED),
            Err(CertError::Expired)
        );
    }

    #[test]
    fn certificates_of_another_ca_are_refused() {
        // A different CA altogether.
        let ca_ed = cert(fixture!("ca-ed25519.crt"));
        assert_eq!(
            verify_chain(&moon(), &[], &[ca_ed], T_VALID),
            Err(CertError::UnknownIssuer)
        );
        // A CA with the same name as ca-p256 but another key signed this one.
        let evil = cert(fixture!("evil-moon.crt"));
        assert_eq!(evil.issuer_dn_der(), ca_p256().subject_dn_der());
        assert!(evil.matches_identity(&Identity::Fqdn("moon.example".into())));
        let r = verify_chain(&evil, &[], &[ca_p256()], T_VALID);
        assert!(
            matches!(r, Err(CertError::BadSignature | CertError::UnknownIssuer)),
            "{r:?}"
        );
        // ... while its own CA accepts it.
        let ca_evil = cert(fixture!("ca-evil.crt"));
        assert_eq!(verify_chain(&evil, &[], &[ca_evil], T_VALID), Ok(()));
        // An end entity cannot act as an intermediate.
        let venus = cert(fixture!("venus-p256.crt"));
        assert!(verify_chain(&venus, &[moon()], &[ca_p256()], T_VALID).is_err());
        // No anchors at all.
        assert_eq!(
            verify_chain(&moon(), &[], &[], T_VALID),
            Err(CertError::NoTrustAnchor)
        );
    }

    /// An identity written as text reads back as the same identity (the
    /// effective configuration writes local_id and remote_id this way).
    /// `@92.0.2.1` used to be written as `92.0.2.1`, an address (found by
    /// the config_parse fuzz target).
    #[test]
    fn identity_text_reads_back_as_the_same_identity() {
        for (text, shown) in [
            ("@92.0.2.1", "@92.0.2.1"),
            ("@fd00::1", "@fd00::1"),
            ("@a=b", "@a=b"),
            ("@carol@example.org", "@carol@example.org"),
            ("@@#0102", "@@#0102"),
            ("@@moon", "@@moon"),
            ("@moon.example", "moon.example"),
            ("moon.example", "moon.example"),
            ("@#0102", "@#0102"),
            ("carol@example.org", "carol@example.org"),
            ("92.0.2.1", "92.0.2.1"),
            ("fd00::1", "fd00::1"),
            ("C=CH, O=strongSwan, CN=moon", "C=CH, O=strongSwan, CN=moon"),
        ] {
            let id = Identity::parse(text).unwrap();
            assert_eq!(id.to_string(), shown, "{text}");
            assert_eq!(Identity::parse(&id.to_string()).unwrap(), id, "{text}");
        }
    }

    #[test]
    fn identity_matching_by_subject_alt_name() {
        let moon = moon();
        let yes = [
            "moon.example",
            "MOON.Example",
            "moon.example.",
            "10.0.0.1",
            "fd00::1",
            "fd00:0:0::1",
            "moon@example.org",
            "C=CH, O=espgate test, CN=moon-cn.example",
            "c=ch,o=ESPGATE TEST,cn=moon-cn.example",
        ];
        for s in yes {
            assert!(moon.matches_identity(&Identity::parse(s).unwrap()), "{s}");
        }
        let no = [
            // The CN does not count when a DNS subjectAltName exists.
            "moon-cn.example",
            "sun.example",
            "oon.example",
            "10.0.0.2",
            "fd00::2",
            "carol@example.org",
            "C=CH, O=espgate test",
            "C=CH, O=espgate test, CN=moon.example",
            "O=espgate test, C=CH, CN=moon-cn.example",
        ];
        for s in no {
            assert!(!moon.matches_identity(&Identity::parse(s).unwrap()), "{s}");
        }
        // An IPv4 address does not match an IPv6 one with the same tail.
        assert!(!moon.matches_identity(&Identity::Ipv6("::ffff:10.0.0.1".parse().unwrap())));

        // Only a CN: the FQDN falls back to it.
        let cnonly = cert(fixture!("cnonly-p256.crt"));
        assert!(cnonly.matches_identity(&Identity::parse("cnonly.example").unwrap()));
        assert!(cnonly.matches_identity(&Identity::parse("@CNONLY.example").unwrap()));
        assert!(!cnonly.matches_identity(&Identity::parse("moon.example").unwrap()));
        assert!(!cnonly.matches_identity(&Identity::parse("cnonly@example").unwrap()));

        // RFC 822 name; the CN "carol" is not an FQDN binding here either.
        let carol = cert(fixture!("carol-ed25519.crt"));
        assert!(carol.matches_identity(&Identity::parse("carol@example.org").unwrap()));
        assert!(carol.matches_identity(&Identity::parse("Carol@Example.org").unwrap()));
        assert!(!carol.matches_identity(&Identity::parse("dave@example.org").unwrap()));
        assert!(carol.matches_identity(&Identity::Fqdn("carol".into())));

        let sun = cert(fixture!("sun-rsa.crt"));
        assert!(sun.matches_identity(&Identity::parse("192.0.2.7").unwrap()));
        assert!(sun.matches_identity(&Identity::parse("sun.example").unwrap()));
        assert!(!sun.matches_identity(&Identity::parse("10.0.0.1").unwrap()));
    }

    #[test]
    fn subject_dn_and_key_ids_match_openssl() {
        let moon = moon();
        // The subject Name as openssl encoded it (PrintableString C,
        // UTF8String O and CN), read from the certificate itself.
        let subject = moon.subject_dn_der();
        assert_eq!(subject[0], 0x30);
        assert!(moon.der().windows(subject.len()).any(|w| w == subject));
        let id = moon.subject_identity();
        assert_eq!(id.to_string(), "C=CH, O=espgate test, CN=moon-cn.example");
        assert!(moon.matches_identity(&id));
        // Our DN text encoding chooses PrintableString, so the bytes differ
        // from openssl's UTF8String, yet the names compare equal.
        let parsed = Identity::parse("C=CH, O=espgate test, CN=moon-cn.example").unwrap();
        assert_ne!(parsed.data(), subject);
        assert!(parsed.matches(&id));
        assert_eq!(
            cert(fixture!("ca-p256.crt")).to_string_subject(),
            "C=CH, O=espgate test, CN=espgate P-256 CA"
        );
        assert_eq!(moon.issuer_dn_der(), ca_p256().subject_dn_der());

        // `openssl x509 -pubkey -noout | openssl pkey -pubin -outform DER | openssl dgst -sha1`
        assert_eq!(
            hex::encode(moon.spki_sha1()),
            "1a9d2cae550bdcc0e4f81bad58b2b1d8e858b155"
        );
        assert_eq!(
            hex::encode(ca_p256().spki_sha1()),
            "b864537f4996fe596d8e15c87fd2a542eb77430e"
        );
        // ID_KEY_ID matches the SPKI hash and openssl's subjectKeyIdentifier
        // (SHA-1 of the key bits), nothing else.
        let ski = hex::decode("955e576a201bc1934fb8323d5d5eedef634e289b").unwrap();
        assert!(moon.matches_identity(&Identity::KeyId(ski)));
        assert!(moon.matches_identity(&Identity::KeyId(moon.spki_sha1().to_vec())));
        assert!(!moon.matches_identity(&Identity::KeyId(ca_p256().spki_sha1().to_vec())));
    }

    impl Certificate {
        fn to_string_subject(&self) -> String {
            self.subject_identity().to_string()
        }
    }

    #[test]
    fn certificate_public_key_verifies_the_holders_signatures() {
        let key = super::super::sig::PrivateKey::from_pem(fixture!("p256.key")).unwrap();
        let moon_key = moon().public_key().unwrap();
        assert_eq!(moon_key, key.public_key());
        let auth = key.sign_auth(None, b"signed octets").unwrap();
        assert!(moon_key.verify_auth(&auth, b"signed octets").is_ok());
        let sun_key = cert(fixture!("sun-rsa.crt")).public_key().unwrap();
        assert_eq!(
            sun_key,
            PublicKey::from_pem(fixture!("rsa2048.pub")).unwrap()
        );
        let carol_key = cert(fixture!("carol-ed25519.crt")).public_key().unwrap();
        assert_eq!(
            carol_key,
            PublicKey::from_pem(fixture!("ed25519.pub")).unwrap()
        );
    }

    #[test]
    fn identity_payload_round_trips() {
        let ids = [
            Identity::Ipv4("10.0.0.1".parse().unwrap()),
            Identity::Ipv6("fd00::1".parse().unwrap()),
            Identity::Fqdn("moon.example".into()),
            Identity::Rfc822("carol@example.org".into()),
            Identity::Dn(moon().subject_dn_der().to_vec()),
            Identity::parse("C=CH, O=strongSwan, CN=moon").unwrap(),
            Identity::KeyId(vec![0x0a, 0x1b, 0x2c]),
        ];
        let types = [1, 5, 2, 3, 9, 9, 11];
        for (id, t) in ids.iter().zip(types) {
            assert_eq!(id.id_type(), t);
            assert_eq!(Identity::from_payload(t, &id.data()).as_ref(), Ok(id));
            // The text form reads back to the same identity.
            assert!(
                Identity::parse(&id.to_string()).unwrap().matches(id),
                "{id}"
            );
        }
        assert_eq!(ids[0].data(), [10, 0, 0, 1]);
        assert_eq!(ids[1].data()[..2], [0xfd, 0x00]);
        assert_eq!(ids[2].data(), b"moon.example");
        assert_eq!(ids[6].to_string(), "@#0a1b2c");
    }

    #[test]
    fn identity_text_forms() {
        let p = |s: &str| Identity::parse(s).unwrap();
        assert_eq!(p("10.0.0.1"), Identity::Ipv4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(p(" fd00::1 "), Identity::Ipv6("fd00::1".parse().unwrap()));
        assert_eq!(p("moon.example"), Identity::Fqdn("moon.example".into()));
        assert_eq!(p("@moon.example"), Identity::Fqdn("moon.example".into()));
        assert_eq!(
            p("carol@example.org"),
            Identity::Rfc822("carol@example.org".into())
        );
        assert_eq!(p("@#00ff"), Identity::KeyId(vec![0, 0xff]));
        assert_eq!(p("@#00FF"), Identity::KeyId(vec![0, 0xff]));
        assert_eq!(p("@#00FF").to_string(), "@#00ff");
        // The subject openssl encodes for -subj "/C=CH/O=strongSwan/CN=moon"
        // with string_mask = default (README.md): PrintableStrings.
        let dn = p("C=CH, O=strongSwan, CN=moon");
        let expected = "3031310b300906035504061302434831133011060355040a130a7374726f6e67\
                        5377616e310d300b060355040313046d6f6f6e";
        assert_eq!(dn.data(), hex::decode(expected).unwrap());
        assert_eq!(dn.to_string(), "C=CH, O=strongSwan, CN=moon");
        // Non-printable values become UTF8String, e-mail addresses IA5String.
        let dn = p("CN=Müller, E=m@example.org, OU=a\\,b");
        assert_eq!(dn.to_string(), "CN=Müller, E=m@example.org, OU=a\\,b");
        let name = parse_name(match &dn {
            Identity::Dn(d) => d,
            _ => unreachable!(),
        })
        .unwrap();
        assert_eq!(name[0][0].1, der::UTF8_STRING);
        assert_eq!(name[1][0].1, der::IA5_STRING);
        assert_eq!(name[2][0].2, b"a,b");
        // Dotted OIDs are accepted as attribute names.
        assert!(p("2.5.4.3=moon").matches(&p("CN=moon")));
        for bad in [
            "",
            "   ",
            "C=CH, X=1",
            "CN=",
            "CN=moon\\",
            "moon example",
            "@#abc",
            "@#zz",
            "@#",
            "@#é0",
            "@",
        ] {
            assert!(Identity::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn identity_payloads_are_validated() {
        assert!(Identity::from_payload(ID_IPV4_ADDR, &[10, 0, 0]).is_err());
        assert!(Identity::from_payload(ID_IPV6_ADDR, &[0; 4]).is_err());
        assert!(Identity::from_payload(ID_FQDN, b"").is_err());
        assert!(Identity::from_payload(ID_FQDN, b"moon example").is_err());
        assert!(Identity::from_payload(ID_RFC822_ADDR, b"caf\xc3\xa9@x").is_err());
        assert!(Identity::from_payload(ID_DER_ASN1_DN, b"\x30\x03\x31\x00").is_err());
        assert!(Identity::from_payload(ID_DER_ASN1_DN, b"moon").is_err());
        assert!(Identity::from_payload(ID_KEY_ID, b"").is_err());
        assert_eq!(
            Identity::from_payload(10, b"\x30\x00"),
            Err(CertError::UnsupportedIdType(10))
        );
        assert_eq!(
            Identity::from_payload(4, &[10, 0, 0, 0, 255, 255, 255, 0]),
            Err(CertError::UnsupportedIdType(4))
        );
        // An empty DN (SEQUENCE {}) is a valid Name.
        assert_eq!(
            Identity::from_payload(ID_DER_ASN1_DN, &[0x30, 0x00]),
            Ok(Identity::Dn(vec![0x30, 0x00]))
        );
    }

    #[test]
    fn identity_matches_is_semantic() {
        let p = |s: &str| Identity::parse(s).unwrap();
        assert!(p("Moon.Example").matches(&p("moon.example.")));
        assert!(p("CAROL@example.org").matches(&p("carol@EXAMPLE.org")));
        assert!(!p("moon.example").matches(&p("moon@example")));
        assert!(p("CN=moon, O=x").matches(&p("cn=MOON,o=X")));
        assert!(!p("CN=moon, O=x").matches(&p("O=x, CN=moon")));
        assert!(!p("10.0.0.1").matches(&p("10.0.0.2")));
    }

    #[test]
    fn pem_and_der_errors() {
        assert!(matches!(Certificate::from_pem(b""), Err(CertError::Pem(_))));
        assert!(matches!(
            Certificate::from_pem(fixture!("p256.pub")),
            Err(CertError::Pem(_))
        ));
        let der = moon().der().to_vec();
        assert!(Certificate::from_der(&der[..der.len() - 1]).is_err());
        let mut trailing = der.clone();
        trailing.push(0);
        assert!(Certificate::from_der(&trailing).is_err());
        assert_eq!(Certificate::from_der(&der).unwrap(), moon());
        assert!(format!("{:?}", moon()).contains("CN=moon-cn.example"));
    }

    proptest::proptest! {
        #[test]
        fn certificate_parser_never_panics(pos in 0usize..2000, byte in proptest::prelude::any::<u8>(), cut in 0usize..2000) {
            let mut der = moon().der().to_vec();
            let pos = pos % der.len();
            der[pos] = byte;
            der.truncate(cut.max(1).min(der.len()));
            if let Ok(c) = Certificate::from_der(&der) {
                let _ = c.public_key();
                let _ = c.matches_identity(&Identity::Fqdn("moon.example".into()));
                let _ = c.subject_identity().to_string();
                let _ = verify_chain(&c, &[], &[ca_p256()], T_VALID);
            }
        }

        #[test]
        fn identity_parsers_never_panic(t in proptest::prelude::any::<u8>(), data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64), s in ".{0,40}") {
            if let Ok(id) = Identity::from_payload(t, &data) {
                let _ = id.to_string();
                proptest::prop_assert_eq!(id.data(), data);
            }
            if let Ok(id) = Identity::parse(&s) {
                let _ = id.to_string();
            }
        }
    }
}
