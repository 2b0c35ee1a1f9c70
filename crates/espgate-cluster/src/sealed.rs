//! The shared SAs and IKE SA states as etcd holds them: each SA under
//! `sas/NAME` ([`SharedSa::name`]), each IKE SA state under `ike/CONN`
//! ([`SharedIke`], see [`Keys::ike`](crate::Keys::ike)), encrypted under
//! the cluster key so that etcd, its backups and anyone who can read its
//! keys never see their keys.
//!
//! The value is `{"v":1,"nonce":"HEX","ct":"HEX"}`: AES-256-GCM under
//! the cluster key, a fresh random 96-bit nonce per write, the full etcd
//! key as associated data (a value moved to another key does not open),
//! and as plaintext the JSON of the [`SharedSa`] or [`SharedIke`]; `ct` is
//! the ciphertext followed by the 16-byte tag. Plaintext buffers are
//! wiped after use.
//!
//! [`SharedSa`]: espgate_api::cluster::SharedSa
//! [`SharedSa::name`]: espgate_api::cluster::SharedSa::name
//! [`SharedIke`]: espgate_api::cluster::SharedIke

use anyhow::{anyhow, bail, Context, Result};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use espgate_config::cluster::ClusterKey;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt;
use zeroize::Zeroizing;

/// The value format's version.
const VERSION: u32 = 1;

/// The AES-GCM tag length.
const TAG_LEN: usize = 16;

/// An etcd value of `sas/` or `ike/`.
#[derive(Debug, Serialize, Deserialize)]
struct Envelope {
    v: u32,
    nonce: String,
    ct: String,
}

/// Where nonces come from: the system's RNG (tests put one that fails).
trait NonceSource: Send + Sync {
    fn fill(&self, dest: &mut [u8]) -> Result<()>;
}

impl NonceSource for SystemRandom {
    fn fill(&self, dest: &mut [u8]) -> Result<()> {
        SecureRandom::fill(self, dest).map_err(|_| anyhow!("the system RNG failed"))
    }
}

/// Seals and opens shared SAs and IKE SA states under the cluster key.
pub struct Sealer {
    key: LessSafeKey,
    rng: Box<dyn NonceSource>,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Sealer(AES-256-GCM, key not shown)")
    }
}

/// Counts the bytes written (to size the plaintext buffer once, so that
/// it is never reallocated and leaves no unwiped copy behind).
struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sealer {
    /// A sealer under the cluster key.
    pub fn new(key: &ClusterKey) -> Result<Sealer> {
        Sealer::with_rng(key, Box::new(SystemRandom::new()))
    }

    fn with_rng(key: &ClusterKey, rng: Box<dyn NonceSource>) -> Result<Sealer> {
        let unbound = UnboundKey::new(&AES_256_GCM, key.bytes())
            .map_err(|_| anyhow!("the cluster key is not an AES-256 key"))?;
        Ok(Sealer {
            key: LessSafeKey::new(unbound),
            rng,
        })
    }

    /// The etcd value of `item` (a shared SA or IKE SA state) at
    /// `etcd_key`. Fails (and nothing should be written) when no nonce can
    /// be drawn.
    pub fn seal<T: Serialize + ?Sized>(&self, etcd_key: &str, item: &T) -> Result<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .with_context(|| format!("drawing a nonce for {etcd_key}"))?;
        let mut count = Count(0);
        serde_json::to_writer(&mut count, item)
            .with_context(|| format!("encoding the value of {etcd_key}"))?;
        let mut buf = Zeroizing::new(Vec::with_capacity(count.0 + TAG_LEN));
        serde_json::to_writer(&mut *buf, item)
            .with_context(|| format!("encoding the value of {etcd_key}"))?;
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(etcd_key.as_bytes()),
                &mut *buf,
            )
            .map_err(|_| anyhow!("sealing the value of {etcd_key} failed"))?;
        let env = Envelope {
            v: VERSION,
            nonce: hex::encode(nonce),
            ct: hex::encode(&*buf),
        };
        serde_json::to_vec(&env).context("encoding a sealed value")
    }

    /// The shared SA or IKE SA state (`T`) in the etcd value `value` at
    /// `etcd_key`. Fails when it is not a sealed value, was sealed under
    /// another key or for another etcd key, was changed, or does not hold
    /// a `T`.
    pub fn open<T: DeserializeOwned>(&self, etcd_key: &str, value: &[u8]) -> Result<T> {
        let env: Envelope =
            serde_json::from_slice(value).context("not a sealed value (expected v, nonce, ct)")?;
        if env.v != VERSION {
            bail!("sealed value version {}, expected {VERSION}", env.v);
        }
        let mut nonce = [0u8; NONCE_LEN];
        hex::decode_to_slice(&env.nonce, &mut nonce)
            .map_err(|_| anyhow!("the nonce is not {NONCE_LEN} bytes of hex"))?;
        let mut buf =
            Zeroizing::new(hex::decode(&env.ct).map_err(|_| anyhow!("the ciphertext is not hex"))?);
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(etcd_key.as_bytes()),
                &mut buf[..],
            )
            .map_err(|_| {
                anyhow!(
                    "does not decrypt under the cluster key (another key_file, or a value \
                     changed or moved from another key)"
                )
            })?;
        // The parser's message may quote the plaintext: say only where.
        serde_json::from_slice(plain).map_err(|e| {
            anyhow!(
                "the decrypted value is not a {} ({:?} error at column {})",
                std::any::type_name::<T>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("value"),
                e.classify(),
                e.column()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_api::cluster::{SharedIke, SharedSa};

    const KEY: &str = "/espgate/gw/sas/0x0000c0de-out";

    fn key(b: u8) -> ClusterKey {
        ClusterKey::new([b; 32])
    }

    fn sa() -> SharedSa {
        SharedSa {
            conn: "site".into(),
            outbound: true,
            protocol: "esp".into(),
            spi: 0xc0de,
            suite: "aes128gcm16".into(),
            enc_key: "00112233445566778899aabbccddeeff01020304".into(),
            integ_key: String::new(),
            esn: true,
            encap: Some((4500, 4500)),
            peer: None,
            owner: 2,
            share_from: Some(70_000),
            selectors: vec!["10.1.0.0/16 10.2.1.0/24 any 0-65535 0-65535".into()],
        }
    }

    #[test]
    fn a_sealed_sa_opens_under_its_key_and_hides_its_keys() {
        let s = Sealer::new(&key(7)).unwrap();
        let value = s.seal(KEY, &sa()).unwrap();
        let text = String::from_utf8(value.clone()).unwrap();
        assert!(!text.contains("00112233"), "{text}");
        assert!(!text.contains("site"), "{text}");
        let env: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(env["v"], 1);
        assert_eq!(env["nonce"].as_str().unwrap().len(), 24);
        assert_eq!(s.open::<SharedSa>(KEY, &value).unwrap(), sa());
        // A fresh nonce every time.
        assert_ne!(s.seal(KEY, &sa()).unwrap(), value);
        assert!(!format!("{s:?}").contains("07"));
    }

    #[test]
    fn a_wrong_key_a_moved_value_or_a_flipped_bit_does_not_open() {
        let s = Sealer::new(&key(7)).unwrap();
        let value = s.seal(KEY, &sa()).unwrap();
        let e = Sealer::new(&key(8))
            .unwrap()
            .open::<SharedSa>(KEY, &value)
            .unwrap_err();
        assert!(format!("{e:#}").contains("does not decrypt"), "{e:#}");
        let e = s
            .open::<SharedSa>("/espgate/gw/sas/0x0000c0df-out", &value)
            .unwrap_err();
        assert!(format!("{e:#}").contains("does not decrypt"), "{e:#}");
        let mut env: Envelope = serde_json::from_slice(&value).unwrap();
        let mut ct = hex::decode(&env.ct).unwrap();
        ct[3] ^= 0x10;
        env.ct = hex::encode(&ct);
        let flipped = serde_json::to_vec(&env).unwrap();
        let e = s.open::<SharedSa>(KEY, &flipped).unwrap_err();
        assert!(format!("{e:#}").contains("does not decrypt"), "{e:#}");
        // A flipped tag bit, a changed nonce, a truncated ciphertext.
        let mut env: Envelope = serde_json::from_slice(&value).unwrap();
        let mut ct = hex::decode(&env.ct).unwrap();
        *ct.last_mut().unwrap() ^= 1;
        env.ct = hex::encode(&ct);
        assert!(s
            .open::<SharedSa>(KEY, &serde_json::to_vec(&env).unwrap())
            .is_err());
        let mut env: Envelope = serde_json::from_slice(&value).unwrap();
        env.nonce = "00".repeat(12);
        assert!(s
            .open::<SharedSa>(KEY, &serde_json::to_vec(&env).unwrap())
            .is_err());
        let mut env: Envelope = serde_json::from_slice(&value).unwrap();
        env.ct = "00".repeat(8);
        assert!(s
            .open::<SharedSa>(KEY, &serde_json::to_vec(&env).unwrap())
            .is_err());
        assert!(s
            .open::<SharedSa>(KEY, b"{\"v\":2,\"nonce\":\"\",\"ct\":\"\"}")
            .is_err());
        assert!(s.open::<SharedSa>(KEY, b"not json").is_err());
    }

    #[test]
    fn an_ike_state_seals_like_an_sa_and_opens_only_as_itself() {
        let s = Sealer::new(&key(7)).unwrap();
        let at = "/espgate/gw/ike/site";
        let ike = SharedIke {
            conn: "site".into(),
            owner: 3,
            state: r#"{"sk_d":"a1b2c3d4e5f6","msg_id":7}"#.into(),
        };
        let value = s.seal(at, &ike).unwrap();
        let text = String::from_utf8(value.clone()).unwrap();
        assert!(!text.contains("a1b2c3d4"), "{text}");
        assert!(!text.contains("site"), "{text}");
        assert_eq!(s.open::<SharedIke>(at, &value).unwrap(), ike);
        assert!(s.open::<SharedIke>(KEY, &value).is_err());
        // An SA's value under an IKE key does not pass for an IKE state.
        let sa_value = s.seal(at, &sa()).unwrap();
        let e = s.open::<SharedIke>(at, &sa_value).unwrap_err();
        assert!(format!("{e:#}").contains("not a SharedIke"), "{e:#}");
    }

    struct Broken;
    impl NonceSource for Broken {
        fn fill(&self, _: &mut [u8]) -> Result<()> {
            bail!("no entropy")
        }
    }

    #[test]
    fn no_nonce_no_value() {
        let s = Sealer::with_rng(&key(7), Box::new(Broken)).unwrap();
        let e = s.seal(KEY, &sa()).unwrap_err();
        assert!(format!("{e:#}").contains("nonce"), "{e:#}");
    }
}
