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
#![no_main]

use espgate_ike::wire::{
    emit_payload_chain, parse_payload_chain, Message, PayloadType, HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

fn check_message(b: &[u8]) {
    if let Ok(m) = Message::parse(b) {
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
