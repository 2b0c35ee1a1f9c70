//! Keys of per-CPU SAs (the RFC 9611 idea, manually keyed): a wire
//! contract, since both peers must derive the same keys.

use zeroize::Zeroizing;

/// The key of per-CPU SA `k` made from a configured key: `k = 0` is the
/// key itself; otherwise HMAC-SHA256(key, "espgate per-CPU SA" || k as
/// 4 bytes || block counter as 1 byte) blocks, cut to the key's length.
/// Both espgate peers derive the same keys; every pair has its own, so no
/// two SAs share a key (and so never a nonce). Changing this breaks
/// interoperability with peers running an older espgate.
pub fn per_cpu_key(key: &[u8], k: u32) -> Zeroizing<Vec<u8>> {
    if k == 0 || key.is_empty() {
        return Zeroizing::new(key.to_vec());
    }
    let hk = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
    let mut out = Zeroizing::new(Vec::with_capacity(key.len() + 32));
    let mut block = 1u8;
    while out.len() < key.len() {
        let mut ctx = aws_lc_rs::hmac::Context::with_key(&hk);
        ctx.update(b"espgate per-CPU SA");
        ctx.update(&k.to_be_bytes());
        ctx.update(&[block]);
        out.extend_from_slice(ctx.sign().as_ref());
        block = block.wrapping_add(1);
    }
    out.truncate(key.len());
    out
}

#[cfg(test)]
mod tests {
    use super::per_cpu_key;

    #[test]
    fn per_cpu_keys_are_derived_distinct_and_deterministic() {
        let k = [0x42u8; 20];
        assert_eq!(per_cpu_key(&k, 0).to_vec(), k.to_vec());
        let k1 = per_cpu_key(&k, 1);
        let k2 = per_cpu_key(&k, 2);
        assert_eq!((k1.len(), k2.len()), (20, 20));
        assert_ne!(k1.to_vec(), k.to_vec());
        assert_ne!(k1.to_vec(), k2.to_vec());
        assert_eq!(per_cpu_key(&k, 1).to_vec(), k1.to_vec(), "deterministic");
        // Longer keys than one HMAC block.
        assert_eq!(per_cpu_key(&[1u8; 68], 3).len(), 68);
        assert_eq!(per_cpu_key(&[], 3).len(), 0);
    }

    /// The wire contract: a peer running another build must derive the
    /// very same bytes, so the derivation is pinned to a value computed
    /// independently (Python's hmac: HMAC-SHA256(0x42 * 20,
    /// b"espgate per-CPU SA" + (1).to_bytes(4, "big") + b"\x01")[:20]).
    #[test]
    fn per_cpu_key_is_pinned() {
        let k1 = per_cpu_key(&[0x42u8; 20], 1);
        assert_eq!(hex(&k1), "8d4fb40d65e3db394e9fa740dd916ee5024db0b3");
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
