//! The Encrypted and Authenticated payload (SK, RFC 7296 §3.14; AEAD per
//! RFC 5282 §5, ChaCha20-Poly1305 per RFC 7634).
//!
//! A protected message is `IKE header | SK header | IV | ciphertext | ICV`,
//! the ciphertext holding the inner payloads, padding and a pad-length
//! byte. The keyed transform is the ESP one ([`espgate_core::crypto::Transform`]):
//! for AEAD the additional data is the IKE header and the SK header; for
//! encryption + integrity the MAC covers everything before the ICV.

use super::wire::{
    emit_payload_chain, parse_payload_chain, Header, IkeError, Payload, PayloadType, HEADER_LEN,
    PAYLOAD_HEADER_LEN,
};
use espgate_core::crypto::{AuthCtx, Suite, SuiteError, Transform};
use std::fmt;

/// Why a protected message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkError {
    /// The message is malformed around the SK payload.
    Wire(IkeError),
    /// The message carries no SK payload first.
    NotEncrypted,
    /// The ICV did not verify (wrong keys, tampering): the message must be
    /// dropped silently (RFC 7296 §2.21.2).
    Integrity,
    /// Lengths do not fit the cipher (block size, padding).
    BadLength,
    /// The message IV counter would wrap (never in practice).
    IvExhausted,
}

impl fmt::Display for SkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkError::Wire(e) => write!(f, "malformed message: {e}"),
            SkError::NotEncrypted => f.write_str("no Encrypted (SK) payload"),
            SkError::Integrity => f.write_str("integrity check failed"),
            SkError::BadLength => f.write_str("bad encrypted payload length"),
            SkError::IvExhausted => f.write_str("IV counter exhausted"),
        }
    }
}

impl std::error::Error for SkError {}

impl From<IkeError> for SkError {
    fn from(e: IkeError) -> Self {
        SkError::Wire(e)
    }
}

/// The SK keys of one IKE SA, one transform per direction.
pub struct SkCrypto {
    out: Transform,
    inp: Transform,
    /// Counter-mode IVs: unique per key because this counter never repeats.
    next_iv: u64,
}

impl fmt::Debug for SkCrypto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SkCrypto")
            .field("suite", &self.out.suite().name())
            .finish_non_exhaustive()
    }
}

impl SkCrypto {
    /// Keys both directions: `(enc, integ)` we send with, and those we
    /// receive with.
    pub fn new(
        suite: Suite,
        out_keys: (&[u8], &[u8]),
        in_keys: (&[u8], &[u8]),
    ) -> Result<SkCrypto, SuiteError> {
        Ok(SkCrypto {
            out: Transform::new(suite, out_keys.0, out_keys.1)?,
            inp: Transform::new(suite, in_keys.0, in_keys.1)?,
            next_iv: 1,
        })
    }

    /// The counter the next message's IV is made from (an IKE SA carried
    /// to another engine must go on past every IV already used).
    pub(crate) fn next_iv(&self) -> u64 {
        self.next_iv
    }

    /// Sets the IV counter ([`SkCrypto::next_iv`]).
    pub(crate) fn set_next_iv(&mut self, n: u64) {
        self.next_iv = n.max(1);
    }

    /// Bytes a protected message adds around its inner payloads at most
    /// (header, SK header, IV, worst padding, pad length, ICV).
    pub fn overhead(&self) -> usize {
        HEADER_LEN
            + PAYLOAD_HEADER_LEN
            + self.out.iv_len()
            + self.out.block_len()
            + self.out.icv_len()
    }

    /// Emits `header` with `inner` payloads encrypted in an SK payload.
    pub fn seal(&mut self, header: &Header, inner: &[Payload]) -> Result<Vec<u8>, SkError> {
        let mut body = Vec::new();
        let first = emit_payload_chain(inner, &mut body)?;
        self.seal_raw(header, first, &body)
    }

    /// [`SkCrypto::seal`] of an already encoded inner payload chain whose
    /// first payload has type `first`.
    pub fn seal_raw(
        &mut self,
        header: &Header,
        first: PayloadType,
        body: &[u8],
    ) -> Result<Vec<u8>, SkError> {
        self.seal_part(header, first, None, body)
    }

    /// One SK message, or with `fragment` = (number, total) one SKF message.
    fn seal_part(
        &mut self,
        header: &Header,
        first: PayloadType,
        fragment: Option<(u16, u16)>,
        body: &[u8],
    ) -> Result<Vec<u8>, SkError> {
        let shell = super::wire::Message {
            header: *header,
            payloads: vec![match fragment {
                None => Payload::Sk {
                    first_payload: first,
                    data: Vec::new(),
                },
                Some((number, total)) => Payload::Skf {
                    first_payload: first,
                    number,
                    total,
                    data: Vec::new(),
                },
            }],
        };
        let mut msg = shell.emit()?;
        let hdr_len = msg.len();
        let iv_len = self.out.iv_len();
        let block = self.out.block_len().max(1);
        // Inner payloads + padding + pad length byte, a multiple of the block.
        let pad = (block - (body.len() + 1) % block) % block;
        msg.resize(hdr_len + iv_len, 0);
        let seq = self.next_iv;
        self.next_iv = self.next_iv.checked_add(1).ok_or(SkError::IvExhausted)?;
        self.out
            .fill_iv(&mut msg[hdr_len..hdr_len + iv_len], seq)
            .map_err(|_| SkError::IvExhausted)?;
        msg.extend_from_slice(body);
        msg.extend(std::iter::repeat_n(0u8, pad));
        msg.push(u8::try_from(pad).map_err(|_| SkError::BadLength)?);
        msg.resize(msg.len() + self.out.icv_len(), 0);
        let total = u32::try_from(msg.len()).map_err(|_| SkError::Wire(IkeError::TooBig))?;
        let sk_len =
            u16::try_from(msg.len() - HEADER_LEN).map_err(|_| SkError::Wire(IkeError::TooBig))?;
        msg[24..28].copy_from_slice(&total.to_be_bytes());
        msg[HEADER_LEN + 2..HEADER_LEN + 4].copy_from_slice(&sk_len.to_be_bytes());
        // RFC 5282 §5.1 / RFC 7383 §2.5.3: the AAD is everything before the
        // IV (IKE header, SK/SKF header, fragment number and total).
        let aad = msg[..hdr_len].to_vec();
        self.out
            .seal(
                &mut msg,
                hdr_len,
                &AuthCtx {
                    aad: &aad,
                    ..AuthCtx::default()
                },
            )
            .map_err(|_| SkError::BadLength)?;
        Ok(msg)
    }

    /// [`SkCrypto::seal`], cut into Encrypted Fragment (SKF) messages of at
    /// most `max_len` bytes each when the whole message would be longer
    /// (RFC 7383 §2.5). A `max_len` too small for a useful fragment is
    /// raised to one that carries 4 cipher blocks.
    pub fn seal_fragments(
        &mut self,
        header: &Header,
        inner: &[Payload],
        max_len: usize,
    ) -> Result<Vec<Vec<u8>>, SkError> {
        let mut body = Vec::new();
        let first = emit_payload_chain(inner, &mut body)?;
        if self.overhead() + body.len() <= max_len {
            return Ok(vec![self.seal_raw(header, first, &body)?]);
        }
        // Room for content in one fragment: the SKF header has 4 more bytes.
        let block = self.out.block_len().max(1);
        let room = max_len.saturating_sub(self.overhead() + 4);
        let chunk = (room / block * block).max(block * 4) - 1;
        let total = body.len().div_ceil(chunk);
        let total16 = u16::try_from(total).map_err(|_| SkError::Wire(IkeError::TooBig))?;
        let mut out = Vec::with_capacity(total);
        for (k, part) in body.chunks(chunk).enumerate() {
            let number = u16::try_from(k + 1).map_err(|_| SkError::Wire(IkeError::TooBig))?;
            let f = if number == 1 {
                first
            } else {
                PayloadType::NoNext
            };
            out.push(self.seal_part(header, f, Some((number, total16)), part)?);
        }
        Ok(out)
    }

    /// Verifies and decrypts one Encrypted Fragment message (RFC 7383):
    /// its header and fragment (number, total, first payload type, the
    /// decrypted piece of the inner payload chain).
    pub fn open_fragment(&self, msg: &[u8]) -> Result<(Header, Fragment), SkError> {
        let (header, first, length) = Header::parse(msg)?;
        if usize::try_from(length).ok() != Some(msg.len()) {
            return Err(SkError::Wire(IkeError::LengthMismatch {
                header: length,
                datagram: msg.len(),
            }));
        }
        if first != PayloadType::Skf {
            return Err(SkError::NotEncrypted);
        }
        let hdr_len = HEADER_LEN + PAYLOAD_HEADER_LEN + 4;
        if msg.len() < hdr_len {
            return Err(SkError::Wire(IkeError::Truncated));
        }
        let inner_first = PayloadType::from(msg[HEADER_LEN]);
        let skf_len = usize::from(u16::from_be_bytes([
            msg[HEADER_LEN + 2],
            msg[HEADER_LEN + 3],
        ]));
        if skf_len != msg.len() - HEADER_LEN {
            return Err(SkError::Wire(IkeError::BadPayloadLength(u8::from(
                PayloadType::Skf,
            ))));
        }
        let number = u16::from_be_bytes([msg[HEADER_LEN + 4], msg[HEADER_LEN + 5]]);
        let total = u16::from_be_bytes([msg[HEADER_LEN + 6], msg[HEADER_LEN + 7]]);
        if number == 0 || number > total {
            return Err(SkError::Wire(IkeError::BadFragment));
        }
        let data = self.decrypt(msg, hdr_len)?;
        Ok((
            header,
            Fragment {
                number,
                total,
                first: inner_first,
                data,
            },
        ))
    }

    /// Verifies and decrypts a protected message: its header and inner
    /// payloads. The SK payload must be the first (and so the only) payload.
    pub fn open(&self, msg: &[u8]) -> Result<(Header, Vec<Payload>), SkError> {
        let (header, first, length) = Header::parse(msg)?;
        if usize::try_from(length).ok() != Some(msg.len()) {
            return Err(SkError::Wire(IkeError::LengthMismatch {
                header: length,
                datagram: msg.len(),
            }));
        }
        if first != PayloadType::Sk {
            return Err(SkError::NotEncrypted);
        }
        let hdr_len = HEADER_LEN + PAYLOAD_HEADER_LEN;
        if msg.len() < hdr_len {
            return Err(SkError::Wire(IkeError::Truncated));
        }
        let inner_first = PayloadType::from(msg[HEADER_LEN]);
        let sk_len = usize::from(u16::from_be_bytes([
            msg[HEADER_LEN + 2],
            msg[HEADER_LEN + 3],
        ]));
        if sk_len != msg.len() - HEADER_LEN {
            return Err(SkError::Wire(IkeError::BadPayloadLength(u8::from(
                PayloadType::Sk,
            ))));
        }
        let inner = self.decrypt(msg, hdr_len)?;
        let payloads = parse_payload_chain(inner_first, &inner, true)?;
        Ok((header, payloads))
    }
}

impl SkCrypto {
    /// Verifies and decrypts `msg` whose IV starts at `hdr_len` (everything
    /// before it is authenticated); returns the plaintext without padding.
    fn decrypt(&self, msg: &[u8], hdr_len: usize) -> Result<Vec<u8>, SkError> {
        let need = hdr_len + self.inp.iv_len() + 1 + self.inp.icv_len();
        if msg.len() < need {
            return Err(SkError::BadLength);
        }
        let mut buf = msg.to_vec();
        let aad = msg[..hdr_len].to_vec();
        self.inp
            .open(
                &mut buf,
                hdr_len,
                &AuthCtx {
                    aad: &aad,
                    ..AuthCtx::default()
                },
            )
            .map_err(|e| match e {
                espgate_core::DropReason::Integrity => SkError::Integrity,
                _ => SkError::BadLength,
            })?;
        let plain = &buf[hdr_len + self.inp.iv_len()..buf.len() - self.inp.icv_len()];
        let (&pad, rest) = plain.split_last().ok_or(SkError::BadLength)?;
        let len = rest
            .len()
            .checked_sub(usize::from(pad))
            .ok_or(SkError::BadLength)?;
        Ok(rest[..len].to_vec())
    }
}

/// One decrypted Encrypted Fragment (RFC 7383).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fragment {
    /// Fragment number, from 1.
    pub number: u16,
    /// Number of fragments of the message.
    pub total: u16,
    /// Type of the first inner payload (meaningful in fragment 1 only).
    pub first: PayloadType,
    /// This fragment's piece of the inner payload chain.
    pub data: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ExchangeType, Notify, NotifyType};

    fn pair(suite: &str) -> (SkCrypto, SkCrypto) {
        let s: Suite = suite.parse().unwrap();
        let e1: Vec<u8> = (0..s.enc_key_len() as u8).collect();
        let e2: Vec<u8> = (100..100 + s.enc_key_len() as u8).collect();
        let a1: Vec<u8> = (0..s.integ_key_len() as u8).map(|x| x ^ 0x5a).collect();
        let a2: Vec<u8> = (0..s.integ_key_len() as u8).map(|x| x ^ 0xa5).collect();
        (
            SkCrypto::new(s, (&e1, &a1), (&e2, &a2)).unwrap(),
            SkCrypto::new(s, (&e2, &a2), (&e1, &a1)).unwrap(),
        )
    }

    fn hdr() -> Header {
        Header {
            spi_i: 1,
            spi_r: 2,
            minor_version: 0,
            exchange_type: ExchangeType::Informational,
            initiator: true,
            version: false,
            response: false,
            message_id: 7,
        }
    }

    #[test]
    fn seal_open_round_trip_every_suite() {
        for suite in [
            "aes128gcm16",
            "aes256gcm16",
            "chacha20poly1305",
            "aes128-sha256",
            "aes256-sha512",
        ] {
            let (mut a, b) = pair(suite);
            let inner = vec![
                Payload::Notify(Notify {
                    protocol: 0,
                    spi: vec![],
                    notify_type: NotifyType::InitialContact,
                    data: vec![],
                }),
                Payload::Nonce(vec![9; 33]),
            ];
            for _ in 0..3 {
                let m = a.seal(&hdr(), &inner).unwrap();
                let (h, p) = b.open(&m).unwrap();
                assert_eq!(h, hdr());
                assert_eq!(p, inner, "{suite}");
                // The outer message parses with the plain codec too.
                assert!(crate::wire::Message::parse(&m).is_ok());
                // Any flipped bit (header, IV, body, ICV) is caught.
                for i in [0, 20, 35, m.len() / 2, m.len() - 1] {
                    let mut t = m.clone();
                    t[i] ^= 1;
                    assert!(b.open(&t).is_err(), "{suite} bit at {i}");
                }
                // The sender's own keys do not open it.
                assert_eq!(a.open(&m).unwrap_err(), SkError::Integrity);
            }
        }
    }

    #[test]
    fn empty_inner_and_truncated() {
        let (mut a, b) = pair("aes128gcm16");
        let m = a.seal(&hdr(), &[]).unwrap();
        assert_eq!(b.open(&m).unwrap().1, vec![]);
        for n in 0..m.len() {
            assert!(b.open(&m[..n]).is_err());
        }
    }

    #[test]
    fn fragments_reassemble_and_each_is_authenticated() {
        for suite in ["aes128gcm16", "aes256-sha256"] {
            let (mut a, b) = pair(suite);
            let inner = vec![
                Payload::Nonce(vec![7; 200]),
                Payload::VendorId(vec![3; 500]),
                Payload::Nonce(vec![8; 100]),
            ];
            let whole = a.seal_fragments(&hdr(), &inner, 2000).unwrap();
            assert_eq!(whole.len(), 1, "small enough: one SK message");
            let frags = a.seal_fragments(&hdr(), &inner, 300).unwrap();
            assert!(frags.len() >= 3, "{}", frags.len());
            // Any order: reassembled by number.
            let mut got: Vec<Fragment> = frags
                .iter()
                .rev()
                .map(|f| {
                    assert!(f.len() <= 300, "{suite}: {} bytes", f.len());
                    assert!(crate::wire::Message::parse(f).is_ok());
                    b.open_fragment(f).unwrap().1
                })
                .collect();
            got.sort_by_key(|f| f.number);
            let mut data = Vec::new();
            for f in &got {
                assert_eq!(usize::from(f.total), frags.len());
                data.extend_from_slice(&f.data);
            }
            let p = parse_payload_chain(got[0].first, &data, true).unwrap();
            assert_eq!(p, inner);
            // Fragment number and total are authenticated.
            let mut t = frags[0].clone();
            t[33] ^= 1;
            assert!(b.open_fragment(&t).is_err());
            // A fragment is not an SK message and vice versa.
            assert_eq!(b.open(&frags[0]).unwrap_err(), SkError::NotEncrypted);
            assert_eq!(
                b.open_fragment(&whole[0]).unwrap_err(),
                SkError::NotEncrypted
            );
        }
    }

    #[test]
    fn counter_ivs_never_repeat() {
        let (mut a, _) = pair("aes128gcm16");
        let m1 = a.seal(&hdr(), &[]).unwrap();
        let m2 = a.seal(&hdr(), &[]).unwrap();
        assert_ne!(m1[32..40], m2[32..40]);
    }
}
