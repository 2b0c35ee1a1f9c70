//! RFC 7296 key derivation checked against a second implementation: the
//! vectors in `vectors/ike-keys/keys.json` come from
//! `tests/python/ike_key_vectors.py`, written with Python's hmac module.

use espgate_ike::keys::{derive_child_keys, derive_ike_keys, psk_auth, IkeKeyInput, KeyLens, Prf};
use serde_json::Value;

fn hx(v: &Value) -> Vec<u8> {
    hex::decode(v.as_str().expect("hex string")).expect("hex")
}

fn cases() -> Vec<Value> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/vectors/ike-keys/keys.json"
    ))
    .expect("vector file");
    serde_json::from_str::<Value>(&text)
        .expect("json")
        .as_array()
        .expect("array")
        .clone()
}

fn spi(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap(), 16).unwrap()
}

#[test]
fn ike_sa_keys_match_python_hmac() {
    let cases = cases();
    assert_eq!(cases.len(), 4);
    for c in cases {
        let prf = Prf::from_name(c["prf"].as_str().unwrap()).unwrap();
        let lens = KeyLens {
            enc: c["enc_len"].as_u64().unwrap() as usize,
            integ: c["integ_len"].as_u64().unwrap() as usize,
        };
        let (ni, nr, g_ir) = (hx(&c["ni"]), hx(&c["nr"]), hx(&c["g_ir"]));
        let k = derive_ike_keys(
            &IkeKeyInput {
                prf,
                ni: &ni,
                nr: &nr,
                g_ir: &g_ir,
                spi_i: spi(&c["spi_i"]),
                spi_r: spi(&c["spi_r"]),
                lens,
            },
            None,
        );
        let want: Vec<Vec<u8>> = c["keys"].as_array().unwrap().iter().map(hx).collect();
        let got = [
            &k.sk_d, &k.sk_ai, &k.sk_ar, &k.sk_ei, &k.sk_er, &k.sk_pi, &k.sk_pr,
        ];
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(&g[..], &w[..], "{} key {i}", c["name"]);
        }

        // Child SA KEYMAT, no PFS: aes128gcm16 (16 + 4 salt bytes each way).
        let ck =
            derive_child_keys(prf, &k.sk_d, None, &ni, &nr, KeyLens { enc: 20, integ: 0 }).unwrap();
        let want = hx(&c["child_keymat"]);
        assert_eq!(
            [&ck.enc_i[..], &ck.enc_r[..]].concat(),
            want,
            "{}",
            c["name"]
        );
        assert!(ck.integ_i.is_empty() && ck.integ_r.is_empty());

        // With PFS: aes128-sha256 (16 + 32 bytes each way), encryption first.
        let g_new = hx(&c["g_new"]);
        let ck = derive_child_keys(
            prf,
            &k.sk_d,
            Some(&g_new),
            &ni,
            &nr,
            KeyLens { enc: 16, integ: 32 },
        )
        .unwrap();
        let want = hx(&c["child_keymat_pfs"]);
        assert_eq!(
            [
                &ck.enc_i[..],
                &ck.integ_i[..],
                &ck.enc_r[..],
                &ck.integ_r[..]
            ]
            .concat(),
            want,
            "{}",
            c["name"]
        );

        // IKE SA rekey: SKEYSEED from the old SK_d.
        let (ni2, nr2) = (hx(&c["rekey_ni"]), hx(&c["rekey_nr"]));
        let k2 = derive_ike_keys(
            &IkeKeyInput {
                prf,
                ni: &ni2,
                nr: &nr2,
                g_ir: &g_new,
                spi_i: spi(&c["rekey_spi_i"]),
                spi_r: spi(&c["rekey_spi_r"]),
                lens,
            },
            Some((prf, &k.sk_d)),
        );
        let all = [
            &k2.sk_d, &k2.sk_ai, &k2.sk_ar, &k2.sk_ei, &k2.sk_er, &k2.sk_pi, &k2.sk_pr,
        ]
        .iter()
        .flat_map(|v| v.iter().copied())
        .collect::<Vec<u8>>();
        assert_eq!(all, hx(&c["rekey_keymat"]), "{} rekey", c["name"]);

        // Shared-key AUTH.
        let auth = psk_auth(prf, &hx(&c["psk"]), &hx(&c["signed"]));
        assert_eq!(&auth[..], &hx(&c["psk_auth"])[..]);
    }
}

#[test]
fn prf_plus_refuses_more_than_255_blocks() {
    assert!(Prf::HmacSha256.prf_plus(b"k", &[b"s"], 255 * 32).is_some());
    assert!(Prf::HmacSha256
        .prf_plus(b"k", &[b"s"], 255 * 32 + 1)
        .is_none());
}
