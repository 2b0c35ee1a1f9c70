//! Arbitrary bytes through every inbound parser of espgate-core, checking
//! that each accepted input yields offsets inside the buffer and that the
//! parsers agree with each other. The same bytes, read as (lossy) UTF-8, go
//! through the SA spec, suite and prefix parsers, and the header views'
//! accessors and writers (TCP setters, IPv4/IPv6 header rewrites and
//! builders, the ESP and Q-ESP header layouts) run on them against a
//! direct reading of the bytes.
#![no_main]

use espgate_core::crypto::Suite;
use espgate_core::sa::{self, spec, Classified, Protocol, Sa};
use espgate_core::selector::Prefix;
use espgate_core::wire::esp::{EspAuth, EspLayout, OuterAddrs, Rfc4303};
use espgate_core::wire::qesp::Qesp;
use espgate_core::wire::{ah, checksum, esp, flow, icmp, ip, ipv4, ipv6, proto, qesp, tcp, udp};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn v6(b: &[u8]) -> std::net::Ipv6Addr {
    let mut a = [0u8; 16];
    for (i, x) in a.iter_mut().enumerate() {
        *x = b.get(i).copied().unwrap_or(i as u8);
    }
    a.into()
}

/// The TCP fields read as RFC 9293 §3.1 places them; the setters write
/// exactly their field; a filled checksum verifies (IPv4 and IPv6).
fn tcp_fields(b: &[u8]) {
    let Ok(t) = tcp::Tcp::new_checked(b) else {
        return;
    };
    assert_eq!(
        (t.src_port(), t.dst_port(), t.seq_number(), t.ack_number()),
        (be16(b, 0), be16(b, 2), be32(b, 4), be32(b, 8))
    );
    assert_eq!(
        (t.flags(), t.syn(), t.window(), t.checksum(), t.urgent()),
        (
            b[13],
            b[13] & 0x02 != 0,
            be16(b, 14),
            be16(b, 16),
            be16(b, 18)
        )
    );
    let hl = t.header_len();
    let mut c = b.to_vec();
    let mut w = tcp::Tcp::new_unchecked(&mut c[..]);
    let x = be32(b, b.len() - 4);
    w.set_src_port(x as u16);
    w.set_dst_port((x >> 16) as u16);
    w.set_seq_number(!x);
    w.set_ack_number(x.rotate_left(8));
    w.set_flags(b[12]);
    w.set_window(x as u16 ^ 0x5555);
    w.set_urgent(7);
    w.set_header_len(hl);
    assert_eq!(w.header_len(), hl);
    assert_eq!(
        (w.src_port(), w.dst_port(), w.seq_number(), w.ack_number()),
        (x as u16, (x >> 16) as u16, !x, x.rotate_left(8))
    );
    assert_eq!(
        (w.flags(), w.window(), w.urgent()),
        (b[12], x as u16 ^ 0x5555, 7)
    );
    let (s6, d6) = (
        std::net::IpAddr::V6(v6(&b[..b.len().min(16)])),
        std::net::IpAddr::V6(v6(&b[b.len().saturating_sub(16)..])),
    );
    w.fill_checksum(s6, d6);
    assert!(w.verify_checksum(s6, d6), "filled IPv6 checksum");
    let s4 = std::net::IpAddr::from([10, 0, 0, b[0]]);
    w.fill_checksum(s4, s4);
    assert!(w.verify_checksum(s4, s4), "filled IPv4 checksum");
    let c = w.into_inner();
    assert_eq!(c[20..], b[20..], "a setter wrote outside its field");
    // Mixed families have no pseudo-header: only protocol and length count.
    assert_eq!(
        checksum::pseudo_header(s4, s6, proto::TCP, 0x1_0014),
        u32::from(proto::TCP) + 1 + 0x14
    );
}

/// IPv4 and IPv6 header rewrites and builders.
fn ip_writers(b: &[u8]) {
    // IPv4: the header-only check, by RFC 791's fields.
    let direct = b.len() >= 20
        && b[0] >> 4 == 4
        && usize::from(b[0] & 15) * 4 >= 20
        && usize::from(b[0] & 15) * 4 <= b.len();
    assert_eq!(ipv4::Ipv4::new_header_checked(b).is_ok(), direct);
    if let Ok(h) = ipv4::Ipv4::new_checked(b) {
        assert_eq!((h.ident(), h.ttl()), (be16(b, 4), b[8]));
        let mut c = b.to_vec();
        let mut w = ipv4::Ipv4::new_checked(&mut c[..]).unwrap();
        w.set_tos(!b[1]);
        assert_eq!(w.tos(), !b[1]);
        let c = w.into_inner();
        assert_eq!((&c[..1], &c[2..]), (&b[..1], &b[2..]));
    }
    if b.len() >= ipv6::HEADER_LEN && b[0] >> 4 == 6 {
        let mut c = b.to_vec();
        ipv6::set_traffic_class(&mut c, b[2]);
        ipv6::set_payload_len(&mut c, 0);
        let h = ipv6::Ipv6::new_checked(&c[..]).expect("payload length 0 fits");
        assert_eq!(
            (h.traffic_class(), h.flow_label(), h.payload_len()),
            (b[2], u32::from_be_bytes([0, b[1] & 15, b[2], b[3]]), 0)
        );
    }
    // Builders: fields from the bytes, an output buffer of any length.
    if b.len() >= 8 {
        let payload_len = usize::from(be16(b, 0)) * usize::from(b[7] % 2 + 1);
        let out_len = usize::from(b[2] % 64);
        let mut out = vec![0u8; out_len];
        let r4 = ipv4::Ipv4Repr {
            src: [b[3], b[4], b[5], b[6]].into(),
            dst: [b[6], b[5], b[4], b[3]].into(),
            protocol: b[4],
            tos: b[5],
            ident: be16(b, 1),
            dont_frag: b[6] & 1 != 0,
            ttl: b[7],
            payload_len,
        }
        .emit(&mut out);
        assert_eq!(r4.is_ok(), out_len >= 20 && payload_len + 20 <= 65535);
        if r4.is_ok() {
            let h = ipv4::Ipv4::new_header_checked(&out[..]).unwrap();
            assert!(h.checksum_ok());
            assert_eq!(
                (
                    h.header_len(),
                    h.packet_len(),
                    h.protocol(),
                    h.tos(),
                    h.ttl()
                ),
                (20, payload_len + 20, b[4], b[5], b[7])
            );
            assert_eq!(h.dont_frag(), b[6] & 1 != 0);
        }
        let r6 = ipv6::Ipv6Repr {
            src: v6(b),
            dst: v6(&b[1..]),
            next_header: b[3],
            traffic_class: b[4],
            flow_label: be32(b, 4),
            hop_limit: b[5],
            payload_len,
        }
        .emit(&mut out);
        assert_eq!(r6.is_ok(), out_len >= 40 && payload_len <= 65535);
        if r6.is_ok() {
            assert_eq!(out[0] >> 4, 6);
            assert_eq!(usize::from(be16(&out, 4)), payload_len);
            assert_eq!((out[6], out[7]), (b[3], b[5]));
            assert_eq!(
                u32::from_be_bytes([0, out[1] & 15, out[2], out[3]]),
                be32(b, 4) & 0xfffff
            );
        }
        let total = usize::from(be16(b, 0) % 2048);
        match udp::ipv4_packet([10, 0, 0, 1].into(), [10, 0, 0, 2].into(), total) {
            Ok(p) => {
                assert_eq!(p.len(), total);
                let info = ip::parse(&p).expect("a built packet parses");
                assert_eq!((info.protocol, info.packet_len), (proto::UDP, total));
                let u = udp::Udp::new_checked(&p[20..]).unwrap();
                assert_eq!(u.len(), total - 20);
                assert!(!u.is_empty());
                assert_eq!(u.checksum(), be16(&p, 26));
            }
            Err(_) => assert!(total < 28),
        }
    }
}

/// The ESP and Q-ESP header layouts: parse, emit and the authenticated
/// data, against RFC 4303 / RFC 4106 §5 and docs/QESP.md §4.
fn layouts(b: &[u8]) {
    let outer = OuterAddrs {
        src: std::net::IpAddr::from([192, 0, 2, b.first().copied().unwrap_or(1)]),
        dst: std::net::IpAddr::V6(v6(b)),
    };
    let seq = u64::from(b.len() as u32) << 32 | 0x1234_5678;
    if b.len() >= esp::HEADER_LEN {
        assert_eq!(Rfc4303::parse_header(b), Ok((be32(b, 0), be32(b, 4))));
        assert_eq!(Rfc4303::header_clear(b), Ok(()));
        for esn in [false, true] {
            let a = Rfc4303::auth(b, seq, esn, &outer);
            let ctx = a.auth_ctx();
            let mut want = b[..4].to_vec();
            if esn {
                want.extend_from_slice(&((seq >> 32) as u32).to_be_bytes());
            }
            want.extend_from_slice(&(seq as u32).to_be_bytes());
            assert_eq!(ctx.aad, &want[..]);
            assert!(ctx.mac_prefix.is_empty());
            assert_eq!(ctx.mac_suffix.len(), if esn { 4 } else { 0 });
        }
    }
    match qesp::QespHeader::new_checked(b) {
        Ok(h) => {
            assert_eq!(h.reserved(), u32::from_be_bytes([0, b[5], b[6], b[7]]));
            let clear = h.clear();
            assert_eq!(
                (clear.sport, clear.dport, clear.tlp),
                (h.sport(), h.dport(), h.tlp())
            );
            assert_eq!(Qesp::header_clear(b), Ok(clear));
            assert_eq!(Qesp::parse_header(b), Ok((h.spi(), h.seq())));
            let mut out = [0xffu8; qesp::HEADER_LEN];
            Qesp::emit_header(&mut out, !h.spi(), seq, &clear).unwrap();
            let back = qesp::QespHeader::new_checked(&out).unwrap();
            assert_eq!(back.clear(), clear);
            assert_eq!(
                (back.spi(), back.seq(), back.reserved()),
                (!h.spi(), seq as u32, 0)
            );
            for esn in [false, true] {
                let a = Qesp::auth(b, seq, esn, &outer);
                let ctx = a.auth_ctx();
                let std::net::IpAddr::V4(s) = outer.src else {
                    unreachable!()
                };
                let mut want = s.octets().to_vec();
                want.extend_from_slice(&v6(b).octets());
                let addrs = want.len();
                want.extend_from_slice(&b[..qesp::HEADER_LEN]);
                if esn {
                    want.extend_from_slice(&((seq >> 32) as u32).to_be_bytes());
                }
                assert_eq!(ctx.aad, &want[..]);
                assert_eq!(ctx.mac_prefix, &want[..addrs]);
                assert_eq!(ctx.mac_suffix, &want[addrs + qesp::HEADER_LEN..]);
            }
        }
        Err(_) => {
            assert!(Qesp::parse_header(b).is_err() && Qesp::header_clear(b).is_err());
        }
    }
    if let Some(&n) = b.first() {
        // docs/CONFIG.md, gateway.qesp_protocol: the numbers espgate uses
        // (1, 4, 6, 17, 41, 50, 51, 58), 0 and 255 are refused.
        let refused = [0, 1, 4, 6, 17, 41, 50, 51, 58, 255].contains(&n);
        assert_eq!(qesp::check_ip_protocol(n).is_err(), refused, "{n}");
        let m = n.wrapping_add(1);
        let c = sa::Classifier::new().qesp(n).qesp(m);
        if ![proto::ESP, proto::AH].contains(&m) {
            assert_eq!(c.ip_protocol(m), Some(Protocol::Qesp));
        }
        if ![proto::ESP, proto::AH].contains(&n) {
            assert_eq!(c.ip_protocol(n), None, "a second qesp() replaces");
        }
        let (p, q) = (u16::from(n), u16::from(n) + 256);
        let c = sa::Classifier::default()
            .udp_port(p)
            .udp_port(q)
            .udp_port(p);
        assert_eq!(
            c,
            sa::Classifier::new().udp_port(p).udp_port(q),
            "a port added twice"
        );
        assert!(c.esp_in_udp(q, 1) && c.esp_in_udp(1, p));
        assert_eq!(c.esp_in_udp(1, 2), [1, 2].contains(&p));
    }
    if let Ok(a) = ah::Ah::new_checked(b) {
        assert!(!a.is_empty());
    }
    // An AH header of any length: whole 32-bit words, 3 to 257 of them.
    let len = b.len().min(1100);
    let mut out = vec![0u8; len];
    let ok = ah::emit(&mut out, 17, 0x1234_5678, 9).is_ok();
    assert_eq!(
        ok,
        len.is_multiple_of(4) && (12..=1028).contains(&len),
        "AH of {len} bytes"
    );
    // IPv6's fixed header, by RFC 8200 §3.
    let direct = b.len() >= 40 && b[0] >> 4 == 6 && 40 + usize::from(be16(b, 4)) <= b.len();
    assert_eq!(ipv6::Ipv6::new_checked(b).is_ok(), direct);
}

/// The header views over one slice.
fn headers(b: &[u8]) {
    if let Ok(e) = esp::Esp::new_checked(b) {
        assert!(b.len() >= esp::HEADER_LEN);
        assert_eq!(e.spi(), be32(b, 0));
        assert_eq!(e.seq(), be32(b, 4));
    } else {
        assert!(b.len() < esp::HEADER_LEN);
    }
    match qesp::QespHeader::new_checked(b) {
        Ok(q) => {
            assert!(b.len() >= qesp::HEADER_LEN);
            assert_eq!(q.spi(), be32(b, 8));
            assert_eq!(q.seq(), be32(b, 12));
            assert_eq!(
                (q.sport(), q.dport(), q.tlp()),
                (
                    u16::from_be_bytes([b[0], b[1]]),
                    u16::from_be_bytes([b[2], b[3]]),
                    b[4]
                )
            );
        }
        Err(_) => assert!(b.len() < qesp::HEADER_LEN),
    }
    // The clear fields of any packet ip::parse accepts.
    if let Ok(c) = qesp::ClearFields::of_packet(b) {
        let info = ip::parse(b).expect("clear fields without ip::parse");
        assert_eq!(c.tlp, info.protocol);
        if info.later_fragment {
            assert_eq!((c.sport, c.dport), (0, 0));
        }
    }
    if let Ok(a) = ah::Ah::new_checked(b) {
        let len = a.len();
        assert!(
            len >= ah::FIXED_LEN && len <= b.len(),
            "AH len {len} of {}",
            b.len()
        );
        assert_eq!(len, (usize::from(b[1]) + 2) * 4);
        assert_eq!(a.icv_field().len(), len - ah::FIXED_LEN);
        assert_eq!(a.next_header(), b[0]);
        assert_eq!(a.spi(), be32(b, 4));
        assert_eq!(a.seq(), be32(b, 8));
    }
    if let Ok(u) = udp::Udp::new_checked(b) {
        let len = u.len();
        assert!(len >= udp::HEADER_LEN && len <= b.len());
        let p = u.payload();
        assert_eq!(p.len(), len - udp::HEADER_LEN);
        encap_kind(p);
    }
    encap_kind(b);
    trailer(b);
    tcp_header(b);
}

/// The TCP view: the header and its options stay inside the buffer, the
/// options walk matches a direct reading of RFC 9293 §3.1, and rewriting
/// the MSS keeps a valid checksum valid.
fn tcp_header(b: &[u8]) {
    let Ok(t) = tcp::Tcp::new_checked(b) else {
        assert!(
            b.len() < 20
                || usize::from(b[12] >> 4) * 4 < 20
                || usize::from(b[12] >> 4) * 4 > b.len()
        );
        return;
    };
    let hl = t.header_len();
    assert_eq!(hl, usize::from(b[12] >> 4) * 4);
    assert!(hl >= 20 && hl <= b.len());
    assert_eq!(t.options().len(), hl - 20);
    assert_eq!(t.payload().len(), b.len() - hl);
    let mut mss = None;
    for o in t.option_iter() {
        let Ok(o) = o else { break };
        assert!(o.offset >= 20 && o.offset + 2 + o.data.len() <= hl);
        assert_eq!(b[o.offset], o.kind);
        assert_eq!(usize::from(b[o.offset + 1]), o.data.len() + 2);
        if mss.is_none() && o.kind == 2 && o.data.len() == 2 {
            mss = Some(u16::from_be_bytes([o.data[0], o.data[1]]));
        }
    }
    assert_eq!(t.mss(), mss);
    let (src, dst) = (
        std::net::IpAddr::from([10, 0, 0, 1]),
        std::net::IpAddr::from([10, 0, 0, 2]),
    );
    let valid = t.verify_checksum(src, dst);
    let mut copy = b.to_vec();
    let mut w = tcp::Tcp::new_checked(&mut copy[..]).unwrap();
    assert_eq!(w.set_mss(1000), mss);
    if valid {
        assert!(
            w.verify_checksum(src, dst),
            "set_mss broke a valid checksum"
        );
    }
}

/// RFC 3948 classification, checked against its definition.
fn encap_kind(p: &[u8]) {
    match udp::classify(p) {
        Ok(udp::EncapKind::Keepalive) => assert_eq!(p, [0xff]),
        Ok(udp::EncapKind::Ike) => assert!(p.len() >= 4 && p[..4] == [0, 0, 0, 0]),
        Ok(udp::EncapKind::Esp) => assert!(p.len() >= 8 && p[..4] != [0, 0, 0, 0]),
        Err(_) => assert!(p != [0xff] && p.len() < 8 && !(p.len() >= 4 && p[..4] == [0; 4])),
    }
}

/// ESP trailer parsing against a direct reading of RFC 4303 §2.4.
fn trailer(p: &[u8]) {
    let want = if p.len() < 2 {
        None
    } else {
        let pad = usize::from(p[p.len() - 2]);
        let nh = p[p.len() - 1];
        p.len()
            .checked_sub(2 + pad)
            .filter(|&plen| (0..pad).all(|i| usize::from(p[plen + i]) == i + 1))
            .map(|plen| (plen, nh))
    };
    assert_eq!(esp::parse_trailer(p).ok(), want);
}

fn ip_layer(data: &[u8]) {
    let parsed = ip::parse(data);
    if let Ok(info) = &parsed {
        assert!(
            info.payload_offset <= info.packet_len && info.packet_len <= data.len(),
            "{info:?} for {} bytes",
            data.len()
        );
        assert!(info.nh_field < info.payload_offset);
        assert_eq!(data[info.nh_field], info.protocol, "{info:?}");
        assert_eq!(info.version, data[0] >> 4);
        assert!(!info.later_fragment || info.fragment);
        let l4 = &data[info.payload_offset..info.packet_len];
        headers(l4);
    }
    match data.first().map(|b| b >> 4) {
        Some(4) => {
            let v4 = ipv4::Ipv4::new_checked(data);
            assert_eq!(v4.is_ok(), parsed.is_ok());
            if let Ok(h) = v4 {
                let info = parsed.unwrap();
                assert!(h.header_len() >= ipv4::MIN_HEADER_LEN);
                assert_eq!(h.header_len(), info.payload_offset);
                assert_eq!(h.packet_len(), info.packet_len);
                assert_eq!(h.payload().len(), h.packet_len() - h.header_len());
                assert_eq!(h.header().len(), h.header_len());
                let _ = h.checksum_ok();
                assert_eq!(h.frag_offset() % 8, 0);
                assert_eq!((h.src(), h.dst(), h.tos()), {
                    let f = (info.src, info.dst, info.tos);
                    match f {
                        (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d), t) => (s, d, t),
                        _ => panic!("IPv4 packet with IPv6 addresses"),
                    }
                });
            }
        }
        Some(6) => {
            let v6 = ipv6::Ipv6::new_checked(data);
            let walk = ipv6::walk_ext(data);
            assert!(walk.is_err() || v6.is_ok());
            assert_eq!(parsed.is_ok(), walk.is_ok(), "ip::parse vs walk_ext");
            if let Ok(w) = walk {
                let h = v6.unwrap();
                let end = h.packet_len();
                assert!(end <= data.len());
                assert!(
                    w.offset >= ipv6::HEADER_LEN && w.offset <= end,
                    "{w:?} end {end}"
                );
                assert!(w.nh_field < w.offset);
                assert_eq!(data[w.nh_field], w.protocol);
                assert!(w.insert_offset >= ipv6::HEADER_LEN && w.insert_offset <= w.offset);
                assert!(w.insert_nh_field < w.insert_offset);
                assert!(w.fragment || !w.later_fragment);
                // When the chain is walked to its end, the protocol is not one we skip.
                if !w.later_fragment {
                    assert!(!matches!(
                        w.protocol,
                        proto::HOPOPT
                            | proto::IPV6_ROUTE
                            | proto::IPV6_OPTS
                            | proto::IPV6_FRAG
                            | proto::MOBILITY
                    ));
                }
                let info = parsed.unwrap();
                assert_eq!(
                    (info.protocol, info.payload_offset, info.nh_field),
                    (w.protocol, w.offset, w.nh_field)
                );
                assert_eq!(info.packet_len, end);
                let _ = (
                    h.traffic_class(),
                    h.flow_label(),
                    h.hop_limit(),
                    h.next_header(),
                );
                assert_eq!(h.payload_len() + ipv6::HEADER_LEN, end);
            }
        }
        _ => assert!(parsed.is_err()),
    }

    match flow::of_packet(data) {
        Ok(f) => {
            let info = parsed.expect("flow without ip::parse");
            assert_eq!((f.src, f.dst, f.proto), (info.src, info.dst, info.protocol));
            assert_eq!(f.sport.is_some(), f.dport.is_some());
            if info.later_fragment {
                assert!(f.sport.is_none());
            }
        }
        Err(e) => assert_eq!(Err(e), parsed.map(|_| ())),
    }

    for port in [udp::NAT_T_PORT, 500] {
        match sa::classify(data, &sa::Classifier::new().udp_port(port).qesp(253)) {
            Ok(Classified::Ipsec(inb)) => {
                let outer = ip::parse(data).expect("classified without ip::parse");
                assert_eq!(inb.outer, outer);
                assert!(!outer.fragment);
                let end = outer.packet_len;
                assert!(inb.offset >= outer.payload_offset && inb.offset <= end);
                let hdr = &data[inb.offset..end];
                let at = match inb.protocol {
                    Protocol::Esp => 4,
                    Protocol::Qesp => 12,
                    Protocol::Ah => 8,
                };
                // Every classified header holds its sequence number.
                assert_eq!(inb.wire_seq(data), Some(be32(hdr, at)));
                match inb.protocol {
                    Protocol::Esp => {
                        assert!(hdr.len() >= esp::HEADER_LEN);
                        assert_eq!(inb.spi, be32(hdr, 0));
                        match inb.udp_offset {
                            Some(u) => {
                                assert_eq!(outer.protocol, proto::UDP);
                                assert_eq!(u + udp::HEADER_LEN, inb.offset);
                                let uh = udp::Udp::new_checked(&data[u..end]).unwrap();
                                assert!(uh.src_port() == port || uh.dst_port() == port);
                                assert!(u + uh.len() <= end);
                            }
                            None => assert_eq!(outer.protocol, proto::ESP),
                        }
                    }
                    Protocol::Qesp => {
                        assert_eq!(outer.protocol, 253);
                        assert!(inb.udp_offset.is_none());
                        let q = qesp::QespHeader::new_checked(hdr).unwrap();
                        assert_eq!(inb.spi, q.spi());
                        assert_eq!(q.spi(), be32(hdr, 8));
                    }
                    Protocol::Ah => {
                        assert_eq!(outer.protocol, proto::AH);
                        assert!(inb.udp_offset.is_none());
                        let a = ah::Ah::new_checked(hdr).unwrap();
                        assert!(inb.offset + a.len() <= end);
                        assert_eq!(inb.spi, a.spi());
                    }
                }
            }
            Ok(Classified::Ike) | Ok(Classified::Keepalive) => {
                let outer = ip::parse(data).unwrap();
                assert_eq!(outer.protocol, proto::UDP);
            }
            Err(_) => {}
        }
    }
}

fn text(s: &str) {
    match spec::parse(s) {
        Ok(cfg) => {
            assert_eq!(cfg.tunnel_src.is_some(), cfg.tunnel_dst.is_some());
            assert!(cfg.replay_window <= sa::replay::MAX_WINDOW);
            // Installing may fail (keys, policy) but must not panic; a spec the
            // parser accepts and Sa::new keys is usable for an outbound packet.
            if let Ok(mut sa) = Sa::new(cfg.clone(), Duration::ZERO) {
                let _ = sa.overhead();
                if cfg.validate_outbound().is_ok() {
                    let pkt = espgate_fuzz::udp_packet(
                        espgate_fuzz::addr(false, 1, 1),
                        espgate_fuzz::addr(false, 2, 2),
                        1,
                        2,
                        0,
                        b"spec",
                    );
                    let mut b = espgate_core::PacketBuf::from_packet(&pkt);
                    let _ = sa.encapsulate(&mut b, Duration::ZERO);
                }
            }
        }
        Err(e) => assert!(!e.is_empty()),
    }
    if let Ok(suite) = s.parse::<Suite>() {
        assert_eq!(
            suite.name().parse::<Suite>(),
            Ok(suite),
            "suite name roundtrip"
        );
        if let Some(e) = suite.enc {
            assert!(!(e.is_combined() && suite.integ.is_some()));
        }
        assert!(suite.enc.is_some() || suite.integ.is_some());
        let _ = suite.check_policy(false);
        let _ = suite.to_string();
    }
    if let Ok(p) = s.parse::<Prefix>() {
        let max = if p.addr().is_ipv4() { 32 } else { 128 };
        assert!(p.len() <= max);
        assert!(p.contains(p.addr()));
        assert_eq!(p.to_string().parse::<Prefix>(), Ok(p), "prefix roundtrip");
        assert_eq!(espgate_core::selector::mask(p.addr(), p.len()), p.addr());
    }
}

/// The "too big" answer to any packet: an ICMP error no longer than the
/// family's limit, whose checksums verify, quoting the packet's start.
fn too_big(data: &[u8]) {
    let mut b = espgate_core::PacketBuf::from_packet(data);
    let mtu = data.first().map_or(0, |x| u32::from(*x) << 4);
    if icmp::too_big_in_place(&mut b, mtu).is_err() {
        assert_eq!(b.as_slice(), data, "a refusal leaves the buffer alone");
        return;
    }
    let out = b.as_slice();
    let info = ip::parse(out).expect("the answer parses");
    assert_eq!(info.packet_len, out.len());
    let m = &out[info.payload_offset..];
    if info.version == 4 {
        assert!(out.len() <= 576 && info.protocol == proto::ICMP);
        assert_eq!(checksum::checksum(m), 0);
    } else {
        assert!(out.len() <= 1280 && info.protocol == proto::ICMPV6);
        let acc = checksum::pseudo_header(info.src, info.dst, proto::ICMPV6, m.len() as u32);
        assert_eq!(checksum::finish(checksum::sum(acc, m)), 0);
    }
    assert!(data.starts_with(&m[icmp::HEADER_LEN..]));
}

fuzz_target!(|data: &[u8]| {
    ip_layer(data);
    too_big(data);
    headers(data);
    tcp_fields(data);
    ip_writers(data);
    layouts(data);
    let s = String::from_utf8_lossy(data);
    text(&s);
    // Padding arithmetic on fuzz-chosen sizes.
    if data.len() >= 3 {
        let n = usize::from(u16::from_be_bytes([data[0], data[1]]));
        let align = usize::from(data[2] % 33);
        let pad = esp::pad_len(n, align);
        assert_eq!((n + pad + esp::TRAILER_LEN) % align.max(4), 0);
        assert!(pad < align.max(4));
        let mut t = vec![0xaau8; n % 300 + pad + esp::TRAILER_LEN];
        let plen = n % 300;
        esp::emit_trailer(&mut t[plen..], data[2]);
        assert_eq!(esp::parse_trailer(&t), Ok((plen, data[2])));
        let icv = usize::from(data[0] % 64);
        for v6 in [false, true] {
            let l = ah::header_len(icv, v6);
            assert!(l >= ah::FIXED_LEN + icv && l.is_multiple_of(if v6 { 8 } else { 4 }));
            let mut b = vec![0u8; l];
            if ah::emit(&mut b, data[1], 0x1234_5678, 7).is_ok() {
                let a = ah::Ah::new_checked(&b).unwrap();
                assert_eq!(
                    (a.len(), a.next_header(), a.spi()),
                    (l, data[1], 0x1234_5678)
                );
            }
        }
    }
});
