//! The IKEv2 message codec (`espgate_ike::wire`) on arbitrary bytes.
//!
//! Input layout: the whole input is one IKE datagram for `Message::parse`.
//! Since random bytes rarely carry a matching Length field and version, the
//! same bytes are parsed a second time with the Length field set to the
//! input length and the major version forced to 2, so the payload checks
//! are reached. The input is also read as `first payload type (1 byte) ||
//! decrypted SK body` for `parse_payload_chain(.., inside_sk = true)`.
//!
//! Asserts: never a panic; whatever parses re-emits without error to bytes
//! that parse to the same value, and re-emitting those gives the same bytes.
//! The accessors the engine uses on a parsed message (`payloads_of`,
//! `notifies`, `unsupported_critical`, a transform's key length, the
//! codepoints' names, equality and hashing) agree with a direct reading of
//! its payloads.
#![no_main]

use espgate_ike::wire::{
    emit_payload_chain, parse_payload_chain, ExchangeType, Message, NotifyType, Payload,
    PayloadType, Transform, HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;
use std::hash::{BuildHasher, RandomState};

/// A codepoint's name is the registry's for a known value, else the number;
/// `Unknown(n)` of a known `n` equals (and hashes as) its variant.
fn codepoint<T, R>(v: T, raw: R, known: T)
where
    T: Copy + Eq + std::hash::Hash + std::fmt::Display + std::fmt::Debug + From<R> + Into<R>,
    R: Copy + PartialEq + std::fmt::Display + std::fmt::Debug,
{
    assert_eq!(v.into(), raw);
    let text = v.to_string();
    assert!(!text.is_empty());
    let h = RandomState::new();
    assert_eq!(T::from(raw), v);
    assert_eq!(h.hash_one(T::from(raw)), h.hash_one(v));
    let k: R = known.into();
    assert_eq!(T::from(k), known);
    assert_eq!(h.hash_one(T::from(k)), h.hash_one(known));
}

fn accessors(m: &Message, b: &[u8]) {
    codepoint(m.header.exchange_type, b[18], ExchangeType::IkeAuth);
    let e = m.header.exchange_type;
    assert_eq!(
        e.to_string(),
        e.as_str().map_or_else(|| b[18].to_string(), str::to_string)
    );
    let mut notifies = 0;
    for p in &m.payloads {
        let t = p.payload_type();
        codepoint(t, u8::from(t), PayloadType::Sa);
        assert!(m.payloads_of(t).all(|q| q.payload_type() == t));
        assert!(m.payloads_of(t).any(|q| q == p));
        match p {
            Payload::Notify(n) => {
                notifies += 1;
                let raw = u16::from(n.notify_type);
                codepoint(n.notify_type, raw, NotifyType::Cookie);
                assert_eq!(n.notify_type.is_error(), raw < 16384);
                assert_eq!(
                    n.notify_type.to_string(),
                    n.notify_type
                        .as_str()
                        .map_or_else(|| raw.to_string(), str::to_string)
                );
            }
            Payload::Sa(props) => {
                for t in props.iter().flat_map(|p| &p.transforms) {
                    let want = t.attributes.iter().find_map(|a| match a {
                        espgate_ike::wire::Attribute::Tv { attr_type, value }
                            if *attr_type == espgate_ike::wire::attribute::KEY_LENGTH =>
                        {
                            Some(*value)
                        }
                        _ => None,
                    });
                    assert_eq!(t.key_length(), want);
                    let rebuilt = match want {
                        Some(bits) => Transform::with_key_length(t.transform_type, t.id, bits),
                        None => Transform::new(t.transform_type, t.id),
                    };
                    assert_eq!(rebuilt.key_length(), want);
                    assert_eq!(
                        (rebuilt.transform_type, rebuilt.id),
                        (t.transform_type, t.id)
                    );
                }
            }
            _ => {}
        }
    }
    assert_eq!(m.notifies().count(), notifies);
    let want = m.payloads.iter().find_map(|p| match p {
        Payload::Unknown {
            payload_type,
            critical: true,
            ..
        } => Some(*payload_type),
        _ => None,
    });
    assert_eq!(m.unsupported_critical(), want);
}

fn check_message(b: &[u8]) {
    let parsed = Message::parse(b);
    if let Err(e) = &parsed {
        assert!(!e.to_string().is_empty());
    }
    if let Ok(m) = parsed {
        accessors(&m, b);
        let e = m.emit().expect("a parsed message must re-emit");
        assert_eq!(e.len(), b.len(), "re-emitted length differs");
        let again = Message::parse(&e).expect("a re-emitted message must parse");
        assert_eq!(again, m);
        assert_eq!(again.emit().unwrap(), e);
        // The dispatcher's header-only read agrees with the full parse.
        let (h, _, len) = espgate_ike::wire::Header::parse(b).unwrap();
        assert_eq!(h, m.header);
        assert_eq!(len as usize, b.len());
    }
}

fuzz_target!(|data: &[u8]| {
    check_message(data);
    if data.len() >= HEADER_LEN {
        let mut b = data.to_vec();
        b[17] = 0x20 | (b[17] & 0x0f);
        let n = b.len() as u32;
        b[24..28].copy_from_slice(&n.to_be_bytes());
        check_message(&b);
    }
    if let Some((&first, body)) = data.split_first() {
        if let Ok(p) = parse_payload_chain(PayloadType::from(first), body, true) {
            let mut out = Vec::new();
            let f = emit_payload_chain(&p, &mut out).expect("a parsed chain must re-emit");
            assert_eq!(out.len(), body.len());
            assert_eq!(parse_payload_chain(f, &out, true).unwrap(), p);
        }
    }
});
