//! Arbitrary bytes through every inbound parser of espgate-core, checking
//! that each accepted input yields offsets inside the buffer and that the
//! parsers agree with each other. The same bytes, read as (lossy) UTF-8, go
//! through the SA spec, suite and prefix parsers.
#![no_main]

use espgate_core::crypto::Suite;
use espgate_core::sa::{self, spec, Classified, Protocol, Sa};
use espgate_core::selector::Prefix;
use espgate_core::wire::{ah, esp, flow, ip, ipv4, ipv6, proto, qesp, tcp, udp};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
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

fuzz_target!(|data: &[u8]| {
    ip_layer(data);
    headers(data);
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
