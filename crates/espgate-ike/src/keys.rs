//! IKEv2 pseudo-random functions and key derivation (RFC 7296 §2.13,
//! §2.14, §2.17, §2.18).
//!
//! Every secret is returned in a [`Zeroizing`] buffer.

use aws_lc_rs::hmac;
use zeroize::Zeroizing;

/// A negotiated PRF (only the HMAC-SHA2 family: RFC 8247 marks the others
/// as not to be used).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prf {
    /// PRF_HMAC_SHA2_256 (RFC 4868).
    HmacSha256,
    /// PRF_HMAC_SHA2_384.
    HmacSha384,
    /// PRF_HMAC_SHA2_512.
    HmacSha512,
}

impl Prf {
    /// Every supported PRF, strongest last.
    pub const ALL: [Prf; 3] = [Prf::HmacSha256, Prf::HmacSha384, Prf::HmacSha512];

    /// IANA transform ID (type 2).
    pub fn id(self) -> u16 {
        match self {
            Prf::HmacSha256 => super::wire::prf::HMAC_SHA2_256,
            Prf::HmacSha384 => super::wire::prf::HMAC_SHA2_384,
            Prf::HmacSha512 => super::wire::prf::HMAC_SHA2_512,
        }
    }

    /// The PRF with IANA transform ID `id`.
    pub fn from_id(id: u16) -> Option<Prf> {
        Prf::ALL.into_iter().find(|p| p.id() == id)
    }

    /// strongSwan keyword (`prfsha256`).
    pub fn name(self) -> &'static str {
        match self {
            Prf::HmacSha256 => "prfsha256",
            Prf::HmacSha384 => "prfsha384",
            Prf::HmacSha512 => "prfsha512",
        }
    }

    /// Parses a strongSwan keyword.
    pub fn from_name(s: &str) -> Option<Prf> {
        Prf::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
    }

    /// Output length in bytes; also the preferred key length (RFC 7296 §2.13).
    pub fn out_len(self) -> usize {
        match self {
            Prf::HmacSha256 => 32,
            Prf::HmacSha384 => 48,
            Prf::HmacSha512 => 64,
        }
    }

    fn alg(self) -> hmac::Algorithm {
        match self {
            Prf::HmacSha256 => hmac::HMAC_SHA256,
            Prf::HmacSha384 => hmac::HMAC_SHA384,
            Prf::HmacSha512 => hmac::HMAC_SHA512,
        }
    }

    /// `prf(key, parts[0] | parts[1] | ...)`.
    pub fn prf(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        let k = hmac::Key::new(self.alg(), key);
        let mut ctx = hmac::Context::with_key(&k);
        for p in parts {
            ctx.update(p);
        }
        Zeroizing::new(ctx.sign().as_ref().to_vec())
    }

    /// `prf+(key, seed)` cut to `len` bytes (RFC 7296 §2.13):
    /// T1 = prf(K, S | 0x01), Tn = prf(K, Tn-1 | S | n). At most 255
    /// blocks; asking for more returns `None`.
    pub fn prf_plus(self, key: &[u8], seed: &[&[u8]], len: usize) -> Option<Zeroizing<Vec<u8>>> {
        if len > 255 * self.out_len() {
            return None;
        }
        let k = hmac::Key::new(self.alg(), key);
        let mut out = Zeroizing::new(Vec::with_capacity(len + self.out_len()));
        let mut prev_start = None;
        let mut n = 1u8;
        while out.len() < len {
            let mut ctx = hmac::Context::with_key(&k);
            if let Some(s) = prev_start {
                ctx.update(&out[s..]);
            }
            for p in seed {
                ctx.update(p);
            }
            ctx.update(&[n]);
            prev_start = Some(out.len());
            out.extend_from_slice(ctx.sign().as_ref());
            n = n.wrapping_add(1);
        }
        out.truncate(len);
        Some(out)
    }
}

/// The seven IKE SA keys (RFC 7296 §2.14).
pub struct IkeKeys {
    /// Derives child SA keys and the next IKE SA's SKEYSEED.
    pub sk_d: Zeroizing<Vec<u8>>,
    /// Integrity key, initiator to responder (empty for AEAD).
    pub sk_ai: Zeroizing<Vec<u8>>,
    /// Integrity key, responder to initiator.
    pub sk_ar: Zeroizing<Vec<u8>>,
    /// Encryption key (with salt for AEAD), initiator to responder.
    pub sk_ei: Zeroizing<Vec<u8>>,
    /// Encryption key, responder to initiator.
    pub sk_er: Zeroizing<Vec<u8>>,
    /// Key for the initiator's AUTH payload.
    pub sk_pi: Zeroizing<Vec<u8>>,
    /// Key for the responder's AUTH payload.
    pub sk_pr: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for IkeKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IkeKeys(<redacted>)")
    }
}

/// Lengths of the negotiated SK_e and SK_a keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyLens {
    /// Encryption key bytes (AEAD: key + 4-byte salt).
    pub enc: usize,
    /// Integrity key bytes (0 for AEAD).
    pub integ: usize,
}

/// What goes into an IKE SA's keys.
pub struct IkeKeyInput<'a> {
    /// Negotiated PRF.
    pub prf: Prf,
    /// Initiator's nonce.
    pub ni: &'a [u8],
    /// Responder's nonce.
    pub nr: &'a [u8],
    /// The Diffie-Hellman shared secret g^ir.
    pub g_ir: &'a [u8],
    /// Initiator's SPI (of the new IKE SA).
    pub spi_i: u64,
    /// Responder's SPI.
    pub spi_r: u64,
    /// Key lengths of the negotiated transforms.
    pub lens: KeyLens,
}

/// SKEYSEED = prf(Ni | Nr, g^ir) (§2.14), or for an IKE SA rekey (§2.18)
/// SKEYSEED = prf(SK_d (old), g^ir (new) | Ni | Nr) with `old_sk_d` set;
/// then the seven keys from prf+(SKEYSEED, Ni | Nr | SPIi | SPIr).
pub fn derive_ike_keys(input: &IkeKeyInput<'_>, old: Option<(Prf, &[u8])>) -> IkeKeys {
    let skeyseed = match old {
        None => {
            // The PRF key is Ni | Nr. RFC 7296 §2.14 allows a fixed key length
            // only for non-HMAC PRFs; HMAC takes any length.
            let mut key = Zeroizing::new(Vec::with_capacity(input.ni.len() + input.nr.len()));
            key.extend_from_slice(input.ni);
            key.extend_from_slice(input.nr);
            input.prf.prf(&key, &[input.g_ir])
        }
        // The old IKE SA's PRF keys the new SKEYSEED (§2.18).
        Some((old_prf, sk_d)) => old_prf.prf(sk_d, &[input.g_ir, input.ni, input.nr]),
    };
    let p = input.prf.out_len();
    let KeyLens { enc, integ } = input.lens;
    let total = p + 2 * integ + 2 * enc + 2 * p;
    let spi_i = input.spi_i.to_be_bytes();
    let spi_r = input.spi_r.to_be_bytes();
    // 3 * 64 + 2 * 64 + 2 * 36 = 392 bytes at most: far below 255 blocks.
    let km = input
        .prf
        .prf_plus(&skeyseed, &[input.ni, input.nr, &spi_i, &spi_r], total)
        .unwrap_or_default();
    let mut at = 0;
    let mut take = |n: usize| {
        let v = Zeroizing::new(km.get(at..at + n).unwrap_or_default().to_vec());
        at += n;
        v
    };
    IkeKeys {
        sk_d: take(p),
        sk_ai: take(integ),
        sk_ar: take(integ),
        sk_ei: take(enc),
        sk_er: take(enc),
        sk_pi: take(p),
        sk_pr: take(p),
    }
}

/// Keys of one child SA pair (RFC 7296 §2.17): initiator-to-responder
/// first, encryption key before integrity key.
pub struct ChildKeys {
    /// Encryption key of the SA carrying initiator-to-responder traffic.
    pub enc_i: Zeroizing<Vec<u8>>,
    /// Integrity key of that SA.
    pub integ_i: Zeroizing<Vec<u8>>,
    /// Encryption key of the SA carrying responder-to-initiator traffic.
    pub enc_r: Zeroizing<Vec<u8>>,
    /// Integrity key of that SA.
    pub integ_r: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for ChildKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChildKeys(<redacted>)")
    }
}

/// KEYMAT = prf+(SK_d, [g^ir (new) |] Ni | Nr), split into a child pair's
/// keys. `None` if the lengths exceed what prf+ can give.
pub fn derive_child_keys(
    prf: Prf,
    sk_d: &[u8],
    g_ir: Option<&[u8]>,
    ni: &[u8],
    nr: &[u8],
    lens: KeyLens,
) -> Option<ChildKeys> {
    let total = 2 * (lens.enc + lens.integ);
    let km = match g_ir {
        Some(g) => prf.prf_plus(sk_d, &[g, ni, nr], total)?,
        None => prf.prf_plus(sk_d, &[ni, nr], total)?,
    };
    let mut at = 0;
    let mut take = |n: usize| {
        let v = Zeroizing::new(km[at..at + n].to_vec());
        at += n;
        v
    };
    Some(ChildKeys {
        enc_i: take(lens.enc),
        integ_i: take(lens.integ),
        enc_r: take(lens.enc),
        integ_r: take(lens.integ),
    })
}

/// The octets an AUTH payload signs or MACs (RFC 7296 §2.15): the
/// sender's first message, then the peer's nonce, then prf(SK_p, ID'),
/// ID' being the sender's ID payload body (type, 3 reserved bytes, data).
pub fn signed_octets(
    prf: Prf,
    first_message: &[u8],
    peer_nonce: &[u8],
    sk_p: &[u8],
    id_type: u8,
    id_data: &[u8],
) -> Vec<u8> {
    let mac_id = prf.prf(sk_p, &[&[id_type, 0, 0, 0], id_data]);
    let mut out = Vec::with_capacity(first_message.len() + peer_nonce.len() + mac_id.len());
    out.extend_from_slice(first_message);
    out.extend_from_slice(peer_nonce);
    out.extend_from_slice(&mac_id);
    out
}

/// The key pad of shared-key AUTH (RFC 7296 §2.15).
pub const KEY_PAD: &[u8] = b"Key Pad for IKEv2";

/// Shared-key AUTH = prf(prf(Shared Secret, "Key Pad for IKEv2"), signed octets).
pub fn psk_auth(prf: Prf, psk: &[u8], signed: &[u8]) -> Zeroizing<Vec<u8>> {
    let k = prf.prf(psk, &[KEY_PAD]);
    prf.prf(&k, &[signed])
}
