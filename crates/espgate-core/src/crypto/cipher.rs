//! The keyed ESP transform: encryption plus integrity, or a combined mode.

use super::gcm::{GcmImpl, RingGcmKey};
use super::mac::Mac;
use super::suite::{Enc, Suite, SuiteError};
use super::AuthCtx;
use crate::cost::{NoProbe, Probe, Stage};
use crate::error::{DropReason, PResult};
use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
#[allow(deprecated)]
use aws_lc_rs::cipher::{
    DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext, UnboundCipherKey, AES_128,
    AES_192, AES_256, DES_EDE3_FOR_LEGACY_USE_ONLY, DES_FOR_LEGACY_USE_ONLY,
};
use aws_lc_rs::iv::FixedLength;
use zeroize::Zeroizing;

enum Cipher {
    Null,
    /// Boxed: two AES key schedules would make every `Cipher` large.
    Cbc(Box<CbcKeys>),
    Aead {
        key: LessSafeKey,
        salt: Zeroizing<[u8; 4]>,
    },
    /// AES-GCM through ring ([`GcmImpl`]): sealed and opened in place.
    RingGcm {
        key: RingGcmKey,
        salt: Zeroizing<[u8; 4]>,
    },
    Gmac {
        key: LessSafeKey,
        salt: Zeroizing<[u8; 4]>,
    },
}

struct CbcKeys {
    enc: EncryptingKey,
    dec: DecryptingKey,
    ivs: IvPool,
}

/// CSPRNG output drawn in blocks: one `rand::fill` call per
/// [`IV_POOL`] bytes instead of one per packet (a call costs about as much
/// as encrypting a small packet). Each byte is handed out once; the pool is
/// wiped when dropped. RFC 3602 §3 only asks that CBC IVs be unpredictable.
struct IvPool {
    bytes: Zeroizing<[u8; IV_POOL]>,
    /// Bytes from here on are unused.
    pos: usize,
}

const IV_POOL: usize = 4096;

impl IvPool {
    fn new() -> IvPool {
        IvPool {
            bytes: Zeroizing::new([0; IV_POOL]),
            pos: IV_POOL,
        }
    }

    fn take(&mut self, out: &mut [u8]) -> PResult<()> {
        if out.len() > IV_POOL {
            return aws_lc_rs::rand::fill(out).map_err(|_| DropReason::Crypto);
        }
        if IV_POOL - self.pos < out.len() {
            aws_lc_rs::rand::fill(&mut self.bytes[..]).map_err(|_| DropReason::Crypto)?;
            self.pos = 0;
        }
        let end = self.pos + out.len();
        out.copy_from_slice(&self.bytes[self.pos..end]);
        // Never hand the same bytes out twice, even if they stay in memory.
        self.bytes[self.pos..end].fill(0);
        self.pos = end;
        Ok(())
    }
}

/// A suite with its keys: seals and opens ESP packets in place.
///
/// Keys live inside aws-lc-rs objects, which cleanse them when dropped; the
/// few bytes we hold ourselves (salts, XCBC subkeys) are `Zeroizing`.
pub struct Transform {
    suite: Suite,
    cipher: Cipher,
    mac: Option<Mac>,
    /// The suite's lengths, looked up once: the per-packet path reads them
    /// several times and each lookup is a match on the suite.
    lens: Lens,
}

/// [`Suite::iv_len`], [`Suite::icv_len`] and [`Suite::block_len`], and
/// the alignment outbound padding uses ([`Transform::pad_align`]).
#[derive(Debug, Clone, Copy)]
struct Lens {
    iv: usize,
    icv: usize,
    block: usize,
    pad: usize,
}

/// The alignment of an AES-GCM SA's encrypted body (payload, padding,
/// trailer) on output: whole AES blocks, although RFC 4303 asks only for
/// 4 bytes. Both libraries seal and open whole blocks in their wide loop
/// and a final partial block on a slower path of its own. Measured on the
/// Zen 3 host (2026-11-29, AES-128-GCM seal, one core, median of 7 rounds
/// of 10^6): ring 130-134 ns for a 68-byte body (a 64-byte packet aligned
/// to 4) against 103-108 ns for 80 bytes (aligned to 16), and 335-343 ns
/// at 1404 bytes against 265-299 at 1408; aws-lc 182-215 against
/// 159-187, and 617-621 against 517-573 (`espgate bench crypto --suite
/// aes128gcm16 --size 68,80,1404,1408` shows it on any host; see
/// docs/PERFORMANCE.md, "AES-GCM bodies in whole AES blocks"). The price
/// is up to 12 bytes more per packet (none at the TUN MTU: see
/// [`crate::sa::Growth::fit`]).
/// Receivers accept any padding up to 255 bytes (RFC 4303 §2.4), as
/// espgate's does.
pub const AES_GCM_PAD_ALIGN: usize = 16;

impl std::fmt::Debug for Transform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print keys.
        f.debug_struct("Transform")
            .field("suite", &self.suite.name())
            .finish_non_exhaustive()
    }
}

fn key_len_check(which: &'static str, expected: usize, key: &[u8]) -> Result<(), SuiteError> {
    if key.len() == expected {
        Ok(())
    } else {
        Err(SuiteError::KeyLength {
            which,
            expected,
            got: key.len(),
        })
    }
}

/// How much of the stack [`scrub_stack`] overwrites: far more than the
/// frames of [`Transform::keyed`] and the aws-lc-rs calls under it use.
const SCRUB_STACK: usize = 16 << 10;

/// Overwrites [`SCRUB_STACK`] bytes of the stack below the caller's frame,
/// where the functions it called before kept their temporaries.
///
/// aws-lc-rs builds an AES-CBC/ECB key (`UnboundCipherKey::new`,
/// `EncryptingKey::cbc`, ...) as an `AES_KEY` value on the stack, whose
/// first round keys are the key itself, and moves it by value a few times
/// before it reaches our `Box`; only the last copy is wiped when the key
/// is dropped. The copies left behind in dead stack frames would outlive
/// the SA (found by tests/python/test_secrets.py on the control thread's
/// stack), so the frames are overwritten once the key is built.
#[inline(never)]
fn scrub_stack() {
    let mut area = [0u8; SCRUB_STACK];
    // Volatile writes: not optimised away although never read.
    zeroize::Zeroize::zeroize(&mut area);
    std::hint::black_box(&area);
}

impl Transform {
    /// Keys `suite`. For combined modes `enc_key` ends with the 4-byte salt.
    pub fn new(suite: Suite, enc_key: &[u8], integ_key: &[u8]) -> Result<Transform, SuiteError> {
        Transform::with_gcm(suite, enc_key, integ_key, GcmImpl::current())
    }

    /// [`Transform::new`] with AES-GCM (not GMAC) run by `gcm`'s library
    /// rather than the process's choice ([`GcmImpl::current`]): for tests
    /// and measurements that compare the two.
    pub fn with_gcm(
        suite: Suite,
        enc_key: &[u8],
        integ_key: &[u8],
        gcm: GcmImpl,
    ) -> Result<Transform, SuiteError> {
        let t = Transform::keyed(suite, enc_key, integ_key, gcm);
        // The key objects were built in `keyed`'s frame and below it, now
        // dead: wipe the copies of key schedules left there.
        scrub_stack();
        t
    }

    /// [`Transform::new`], in a frame of its own (never inlined), so that
    /// every stack temporary of the key objects lies below `new`'s frame.
    #[inline(never)]
    fn keyed(
        suite: Suite,
        enc_key: &[u8],
        integ_key: &[u8],
        gcm: GcmImpl,
    ) -> Result<Transform, SuiteError> {
        let enc = suite.enc.unwrap_or(Enc::Null);
        key_len_check("encryption", enc.key_len(), enc_key)?;
        key_len_check("integrity", suite.integ_key_len(), integ_key)?;
        let cipher = match enc {
            Enc::Null => Cipher::Null,
            Enc::AesCbc(bits) => {
                let alg = match bits {
                    128 => &AES_128,
                    192 => &AES_192,
                    _ => &AES_256,
                };
                cbc(alg, enc_key, "AES-CBC")?
            }
            #[allow(deprecated)]
            Enc::TripleDes => cbc(
                &DES_EDE3_FOR_LEGACY_USE_ONLY,
                enc_key,
                "3DES (weak or degenerate key)",
            )?,
            #[allow(deprecated)]
            Enc::Des => cbc(&DES_FOR_LEGACY_USE_ONLY, enc_key, "DES (weak key)")?,
            Enc::AesGcm16(_) if gcm == GcmImpl::Ring => {
                let (k, salt) = split_salt(enc_key);
                let key = RingGcmKey::new(k).ok_or(SuiteError::BadKey("AEAD"))?;
                Cipher::RingGcm { key, salt }
            }
            Enc::AesGcm16(bits) | Enc::AesGmac(bits) => {
                let alg = if bits == 128 {
                    &aead::AES_128_GCM
                } else {
                    &aead::AES_256_GCM
                };
                let (key, salt) = aead_key(alg, enc_key)?;
                if matches!(enc, Enc::AesGmac(_)) {
                    Cipher::Gmac { key, salt }
                } else {
                    Cipher::Aead { key, salt }
                }
            }
            Enc::ChaCha20Poly1305 => {
                let (key, salt) = aead_key(&aead::CHACHA20_POLY1305, enc_key)?;
                Cipher::Aead { key, salt }
            }
        };
        let mac = suite.integ.map(|i| Mac::new(i, integ_key)).transpose()?;
        let lens = Lens {
            iv: suite.iv_len(),
            icv: suite.icv_len(),
            block: suite.block_len(),
            pad: suite.pad_align(),
        };
        Ok(Transform {
            suite,
            cipher,
            mac,
            lens,
        })
    }

    /// The suite.
    pub fn suite(&self) -> Suite {
        self.suite
    }

    /// Explicit IV length.
    #[inline]
    pub fn iv_len(&self) -> usize {
        self.lens.iv
    }

    /// ICV length.
    #[inline]
    pub fn icv_len(&self) -> usize {
        self.lens.icv
    }

    /// The cipher's block alignment of the encrypted body (what a
    /// received body must respect: CBC's block).
    #[inline]
    pub fn block_len(&self) -> usize {
        self.lens.block
    }

    /// The alignment outbound padding gives the encrypted body: the
    /// cipher's block, or whole AES blocks for AES-GCM
    /// ([`AES_GCM_PAD_ALIGN`]).
    #[inline]
    pub fn pad_align(&self) -> usize {
        self.lens.pad
    }

    /// Combined mode (the AAD of [`AuthCtx`] is used, not the MAC fields).
    pub fn is_combined(&self) -> bool {
        matches!(
            self.cipher,
            Cipher::Aead { .. } | Cipher::RingGcm { .. } | Cipher::Gmac { .. }
        )
    }

    /// The integrity algorithm of a non-combined suite (AH uses it directly).
    pub fn mac(&self) -> Option<&Mac> {
        self.mac.as_ref()
    }

    /// Writes the IV for the packet with sequence number `seq`: the sequence
    /// number itself for counter-based modes (unique per SA because sequence
    /// numbers never repeat), CSPRNG output for CBC (RFC 3602 §3), drawn
    /// from a per-SA pool refilled 4 KiB at a time.
    #[inline]
    pub fn fill_iv(&mut self, iv: &mut [u8], seq: u64) -> PResult<()> {
        match &mut self.cipher {
            Cipher::Null => Ok(()),
            Cipher::Aead { .. } | Cipher::RingGcm { .. } | Cipher::Gmac { .. } => {
                iv.copy_from_slice(&seq.to_be_bytes());
                Ok(())
            }
            Cipher::Cbc(k) => k.ivs.take(iv),
        }
    }

    /// Seals `pkt` = `[header (hdr_len) | IV | body | ICV]` in place: the
    /// IV must already be written, the body is plaintext (payload, padding,
    /// trailer) and becomes ciphertext; the ICV field is filled.
    pub fn seal(&self, pkt: &mut [u8], hdr_len: usize, auth: &AuthCtx<'_>) -> PResult<()> {
        self.seal_probed(pkt, hdr_len, auth, &mut NoProbe)
    }

    /// [`Transform::seal`], marking [`Stage::Cipher`] after the encryption
    /// (AEAD, GMAC: after the one combined operation) and
    /// [`Stage::Integrity`] after the MAC of a non-combined suite.
    pub fn seal_probed<P: Probe + ?Sized>(
        &self,
        pkt: &mut [u8],
        hdr_len: usize,
        auth: &AuthCtx<'_>,
        probe: &mut P,
    ) -> PResult<()> {
        let (iv_end, icv_start) = self.layout(pkt.len(), hdr_len)?;
        match &self.cipher {
            Cipher::Null => {}
            Cipher::Cbc(k) => {
                let body = &mut pkt[hdr_len..icv_start];
                let (iv, body) = body.split_at_mut(iv_end - hdr_len);
                let r = k
                    .enc
                    .less_safe_encrypt(body, enc_context(iv)?)
                    .map_err(|_| DropReason::Crypto);
                probe.mark(Stage::Cipher);
                r?;
            }
            Cipher::Aead { key, salt } => {
                let n = nonce(salt, &pkt[hdr_len..iv_end])?;
                // The tag written straight into the ICV field, not
                // returned in a `Tag` and copied there.
                let (body, icv) = pkt[iv_end..].split_at_mut(icv_start - iv_end);
                let r = key
                    .seal_in_place_scatter(n, Aad::from(auth.aad), body, &[], icv)
                    .map_err(|_| DropReason::Crypto);
                probe.mark(Stage::Cipher);
                return r;
            }
            Cipher::RingGcm { key, salt } => {
                let n = nonce_bytes(salt, &pkt[hdr_len..iv_end])?;
                let (body, icv) = pkt[iv_end..].split_at_mut(icv_start - iv_end);
                let r = key.seal(n, auth.aad, body, icv);
                probe.mark(Stage::Cipher);
                return r;
            }
            Cipher::Gmac { key, salt } => {
                let n = nonce(salt, &pkt[hdr_len..iv_end])?;
                let tag = gmac_tag(key, n, auth.aad, &pkt[..icv_start], hdr_len);
                probe.mark(Stage::Cipher);
                pkt[icv_start..].copy_from_slice(tag?.as_ref());
                return Ok(());
            }
        }
        if matches!(self.cipher, Cipher::Null) {
            probe.mark(Stage::Cipher);
        }
        if let Some(mac) = &self.mac {
            let (data, icv) = pkt.split_at_mut(icv_start);
            mac.compute(&[auth.mac_prefix, data, auth.mac_suffix], icv);
            probe.mark(Stage::Integrity);
        }
        Ok(())
    }

    /// Whether this is an AEAD suite (AES-GCM, ChaCha20-Poly1305): one
    /// key, encryption and integrity in one seal.
    #[inline]
    pub fn is_aead(&self) -> bool {
        matches!(self.cipher, Cipher::Aead { .. } | Cipher::RingGcm { .. })
    }

    /// The library that runs this transform's AES-GCM ([`GcmImpl`]);
    /// `None` for other suites (aws-lc).
    #[inline]
    pub fn gcm_impl(&self) -> Option<GcmImpl> {
        match &self.cipher {
            Cipher::RingGcm { .. } => Some(GcmImpl::Ring),
            Cipher::Aead { key, .. } if key.algorithm() != &aead::CHACHA20_POLY1305 => {
                Some(GcmImpl::AwsLc)
            }
            _ => None,
        }
    }

    /// Whether the SA seals this suite with [`Transform::seal_from`]
    /// rather than copying the packet in and sealing in place: AES-GCM.
    /// [`Transform::seal_from`] also takes ChaCha20-Poly1305, but
    /// measured, aws-lc's scattered seal of it (the trailer as extra
    /// input) costs more than the copy it saves: `bench esp`'s `no copy`
    /// against the copying pipeline, 300 against 234 ns per packet at 64 B
    /// and about 780 against 723 ns at 1400 B, where AES-GCM gains
    /// (docs/PERFORMANCE.md). ring has no out-of-place seal, so its
    /// AES-GCM copies too.
    #[inline]
    pub fn seals_from(&self) -> bool {
        self.gcm_impl() == Some(GcmImpl::AwsLc)
    }

    /// [`Transform::seal_probed`] out of place: the body's plaintext is
    /// `clear` followed by `tail` (padding and trailer), read where it lies
    /// and written as ciphertext into `pkt` = `[header (hdr_len) | IV |
    /// body | ICV]`, whose IV must already be written. The same bytes as
    /// copying `clear` and `tail` into the body and sealing in place, minus
    /// the copy: a TSO segment is sealed straight from the TUN read. Only
    /// for suites where [`Transform::seals_from`] holds (`Unsupported`
    /// otherwise); a `pkt` of the wrong length is `BadLength`.
    pub fn seal_from<P: Probe + ?Sized>(
        &self,
        clear: &[u8],
        tail: &[u8],
        pkt: &mut [u8],
        hdr_len: usize,
        auth: &AuthCtx<'_>,
        probe: &mut P,
    ) -> PResult<()> {
        let Cipher::Aead { key, salt } = &self.cipher else {
            return Err(DropReason::Unsupported);
        };
        let (iv_end, icv_start) = self.layout(pkt.len(), hdr_len)?;
        if icv_start - iv_end != clear.len() + tail.len() {
            return Err(DropReason::BadLength);
        }
        let n = nonce(salt, &pkt[hdr_len..iv_end])?;
        let (body, rest) = pkt[iv_end..].split_at_mut(clear.len());
        let r = key
            .seal_out_of_place_scatter(n, Aad::from(auth.aad), clear, body, tail, rest)
            .map_err(|_| DropReason::Crypto);
        probe.mark(Stage::Cipher);
        r
    }

    /// Verifies and opens `pkt` in place (same layout as [`Transform::seal`]).
    /// The ICV is checked in constant time before anything is decrypted; on
    /// success the body holds the plaintext.
    pub fn open(&self, pkt: &mut [u8], hdr_len: usize, auth: &AuthCtx<'_>) -> PResult<()> {
        self.open_probed(pkt, hdr_len, auth, &mut NoProbe)
    }

    /// [`Transform::open`], marking [`Stage::Integrity`] after the ICV check
    /// of a non-combined suite and [`Stage::Cipher`] after the decryption
    /// (AEAD, GMAC: after the one combined operation). A packet whose ICV
    /// fails is marked at the stage that rejected it and goes no further.
    pub fn open_probed<P: Probe + ?Sized>(
        &self,
        pkt: &mut [u8],
        hdr_len: usize,
        auth: &AuthCtx<'_>,
        probe: &mut P,
    ) -> PResult<()> {
        let (iv_end, icv_start) = self.layout(pkt.len(), hdr_len)?;
        match &self.cipher {
            Cipher::Aead { key, salt } => {
                let n = nonce(salt, &pkt[hdr_len..iv_end])?;
                let r = key
                    .open_in_place(n, Aad::from(auth.aad), &mut pkt[iv_end..])
                    .map(|_| ())
                    .map_err(|_| DropReason::Integrity);
                probe.mark(Stage::Cipher);
                return r;
            }
            Cipher::RingGcm { key, salt } => {
                let n = nonce_bytes(salt, &pkt[hdr_len..iv_end])?;
                let r = key.open(n, auth.aad, &mut pkt[iv_end..]);
                probe.mark(Stage::Cipher);
                return r;
            }
            Cipher::Gmac { key, salt } => {
                let n = nonce(salt, &pkt[hdr_len..iv_end])?;
                let r = gmac_tag(key, n, auth.aad, &pkt[..icv_start], hdr_len).and_then(|tag| {
                    aws_lc_rs::constant_time::verify_slices_are_equal(
                        tag.as_ref(),
                        &pkt[icv_start..],
                    )
                    .map_err(|_| DropReason::Integrity)
                });
                probe.mark(Stage::Cipher);
                return r;
            }
            Cipher::Null | Cipher::Cbc(_) => {}
        }
        if let Some(mac) = &self.mac {
            let (data, icv) = pkt.split_at(icv_start);
            let ok = mac.verify(&[auth.mac_prefix, data, auth.mac_suffix], icv);
            probe.mark(Stage::Integrity);
            if !ok {
                return Err(DropReason::Integrity);
            }
        }
        if let Cipher::Cbc(k) = &self.cipher {
            let (iv, body) = pkt[hdr_len..icv_start].split_at_mut(iv_end - hdr_len);
            let r = k
                .dec
                .decrypt(body, dec_context(iv)?)
                .map(|_| ())
                .map_err(|_| DropReason::Crypto);
            probe.mark(Stage::Cipher);
            return r;
        }
        probe.mark(Stage::Cipher);
        Ok(())
    }

    /// [`Transform::open_probed`] out of place: `src` is the packet as
    /// received, `pkt` a buffer of the same length whose header and IV
    /// (`..hdr_len + iv_len`) are already `src`'s. The ICV and body are
    /// read from `src`; on success `pkt`'s body holds the plaintext (its
    /// ICV bytes are left as they were). The same verdict and plaintext as
    /// copying `src` into `pkt` and opening in place, minus the copy, for
    /// an AEAD suite; any other suite copies the body and ICV in and opens
    /// in place. A `src` of another length is `BadLength`.
    pub fn open_from<P: Probe + ?Sized>(
        &self,
        src: &[u8],
        pkt: &mut [u8],
        hdr_len: usize,
        auth: &AuthCtx<'_>,
        probe: &mut P,
    ) -> PResult<()> {
        if src.len() != pkt.len() {
            return Err(DropReason::BadLength);
        }
        let (iv_end, icv_start) = self.layout(pkt.len(), hdr_len)?;
        let Cipher::Aead { key, salt } = &self.cipher else {
            pkt[iv_end..].copy_from_slice(&src[iv_end..]);
            return self.open_probed(pkt, hdr_len, auth, probe);
        };
        let n = nonce(salt, &pkt[hdr_len..iv_end])?;
        let (body, tag) = src[iv_end..].split_at(icv_start - iv_end);
        let r = key
            .open_separate_gather(
                n,
                Aad::from(auth.aad),
                body,
                tag,
                &mut pkt[iv_end..icv_start],
            )
            .map_err(|_| DropReason::Integrity);
        probe.mark(Stage::Cipher);
        r
    }

    /// Checks the ICV of `pkt` (laid out as for [`Transform::open`])
    /// without decrypting where the suite allows it: a separate MAC is
    /// checked alone (in constant time) and the body stays ciphertext. An
    /// AEAD suite verifies its tag only by opening, so its body is
    /// decrypted in place; GMAC has nothing to decrypt. For seed 003's
    /// cluster nodes that keep an SA's replay window without processing
    /// the packet.
    pub fn verify(&self, pkt: &mut [u8], hdr_len: usize, auth: &AuthCtx<'_>) -> PResult<()> {
        match &self.cipher {
            Cipher::Aead { .. } | Cipher::RingGcm { .. } | Cipher::Gmac { .. } => {
                self.open(pkt, hdr_len, auth)
            }
            Cipher::Null | Cipher::Cbc(_) => {
                let (_, icv_start) = self.layout(pkt.len(), hdr_len)?;
                match &self.mac {
                    Some(mac) => {
                        let (data, icv) = pkt.split_at(icv_start);
                        if mac.verify(&[auth.mac_prefix, data, auth.mac_suffix], icv) {
                            Ok(())
                        } else {
                            Err(DropReason::Integrity)
                        }
                    }
                    // Encryption without integrity (legacy, allow_insecure):
                    // nothing to check.
                    None => Ok(()),
                }
            }
        }
    }

    /// Checks lengths and returns (end of IV, start of ICV).
    #[inline]
    fn layout(&self, len: usize, hdr_len: usize) -> PResult<(usize, usize)> {
        let iv_end = hdr_len + self.iv_len();
        let icv_start = len
            .checked_sub(self.icv_len())
            .ok_or(DropReason::BadLength)?;
        if icv_start < iv_end {
            return Err(DropReason::BadLength);
        }
        // CBC first: the length check divides, and only CBC needs it.
        if matches!(self.cipher, Cipher::Cbc(_))
            && !(icv_start - iv_end).is_multiple_of(self.block_len().max(1))
        {
            return Err(DropReason::BadCiphertextLength);
        }
        Ok((iv_end, icv_start))
    }
}

fn cbc(
    alg: &'static aws_lc_rs::cipher::Algorithm,
    key: &[u8],
    what: &'static str,
) -> Result<Cipher, SuiteError> {
    let bad = |_| SuiteError::BadKey(what);
    Ok(Cipher::Cbc(Box::new(CbcKeys {
        enc: EncryptingKey::cbc(UnboundCipherKey::new(alg, key).map_err(bad)?).map_err(bad)?,
        dec: DecryptingKey::cbc(UnboundCipherKey::new(alg, key).map_err(bad)?).map_err(bad)?,
        ivs: IvPool::new(),
    })))
}

fn aead_key(
    alg: &'static aead::Algorithm,
    key: &[u8],
) -> Result<(LessSafeKey, Zeroizing<[u8; 4]>), SuiteError> {
    let (k, salt) = split_salt(key);
    let key = UnboundKey::new(alg, k).map_err(|_| SuiteError::BadKey("AEAD"))?;
    Ok((LessSafeKey::new(key), salt))
}

/// An AEAD's keying material (RFC 4106 §8.1): the key, then the 4-byte
/// salt (the caller has checked the length).
fn split_salt(key: &[u8]) -> (&[u8], Zeroizing<[u8; 4]>) {
    let (k, s) = key.split_at(key.len() - 4);
    let mut salt = Zeroizing::new([0u8; 4]);
    salt.copy_from_slice(s);
    (k, salt)
}

/// RFC 4106 §4 / RFC 7634 §2: nonce = salt (4) || explicit IV (8).
/// Inlined, and the IV taken as one 8-byte value: built out of line, the
/// `Result<Nonce>` was assembled and unpacked byte by byte on each packet.
#[inline]
fn nonce(salt: &[u8; 4], iv: &[u8]) -> PResult<Nonce> {
    nonce_bytes(salt, iv).map(Nonce::assume_unique_for_key)
}

/// [`nonce`]'s 12 bytes, for ring.
#[inline]
fn nonce_bytes(salt: &[u8; 4], iv: &[u8]) -> PResult<[u8; 12]> {
    let iv: [u8; 8] = iv.try_into().map_err(|_| DropReason::BadLength)?;
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(salt);
    n[4..].copy_from_slice(&iv);
    Ok(n)
}

/// RFC 4543 §3.2: GMAC authenticates AAD || IV || payload with nothing to
/// encrypt. `data` is the packet up to the ICV. When the AAD is just the
/// header as it appears in the packet (no ESN), the packet is used directly;
/// with ESN the AAD differs from the wire bytes and is assembled in a buffer.
fn gmac_tag(
    key: &LessSafeKey,
    n: Nonce,
    aad: &[u8],
    data: &[u8],
    hdr_len: usize,
) -> PResult<aead::Tag> {
    let seal = |a: &[u8]| {
        key.seal_in_place_separate_tag(n, Aad::from(a), &mut [])
            .map_err(|_| DropReason::Crypto)
    };
    if data.get(..hdr_len) == Some(aad) {
        seal(data)
    } else {
        let mut buf = Vec::with_capacity(aad.len() + data.len() - hdr_len);
        buf.extend_from_slice(aad);
        buf.extend_from_slice(&data[hdr_len..]);
        seal(&buf)
    }
}

fn enc_context(iv: &[u8]) -> PResult<EncryptionContext> {
    match iv.len() {
        16 => Ok(EncryptionContext::Iv128(FixedLength::from(
            <[u8; 16]>::try_from(iv).map_err(|_| DropReason::BadLength)?,
        ))),
        8 => Ok(EncryptionContext::Iv64(FixedLength::from(
            <[u8; 8]>::try_from(iv).map_err(|_| DropReason::BadLength)?,
        ))),
        _ => Err(DropReason::BadLength),
    }
}

fn dec_context(iv: &[u8]) -> PResult<DecryptionContext> {
    match iv.len() {
        16 => Ok(DecryptionContext::Iv128(FixedLength::from(
            <[u8; 16]>::try_from(iv).map_err(|_| DropReason::BadLength)?,
        ))),
        8 => Ok(DecryptionContext::Iv64(FixedLength::from(
            <[u8; 8]>::try_from(iv).map_err(|_| DropReason::BadLength)?,
        ))),
        _ => Err(DropReason::BadLength),
    }
}

#[cfg(test)]
mod iv_tests {
    use super::*;

    #[test]
    fn the_iv_pool_never_repeats_and_refills() {
        let mut p = IvPool::new();
        let mut seen = std::collections::HashSet::new();
        // Three refills' worth of 16-byte IVs, and an odd size across a refill.
        for _ in 0..3 * IV_POOL / 16 {
            let mut iv = [0u8; 16];
            p.take(&mut iv).unwrap();
            assert!(seen.insert(iv), "an IV came out twice");
        }
        let mut odd = [0u8; 13];
        for _ in 0..400 {
            p.take(&mut odd).unwrap();
        }
        let mut big = vec![0u8; IV_POOL + 1];
        p.take(&mut big).unwrap();
        assert!(big.iter().any(|&b| b != 0));
    }
}
