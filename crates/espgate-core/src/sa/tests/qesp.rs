//! Q-ESP (`docs/QESP.md`): round trips, the clear header, tampering with
//! every clear field and the outer addresses, refused suites, and the
//! sender that lies about its ports.

use super::*;
use crate::wire::qesp::{ClearFields, QespHeader, HEADER_LEN as QESP_HEADER_LEN};

/// The suites Q-ESP allows: encryption with integrity, AEAD or not.
const SUITES: [&str; 8] = [
    "aes128gcm16",
    "aes256gcm16",
    "chacha20poly1305",
    "aes128-sha1",
    "aes256-sha256",
    "aes192-sha384",
    "aes256-sha512",
    "3des-sha1",
];

fn qesp(suite: &str, mode: Mode, outer_v6: bool) -> SaConfig {
    config(suite, Protocol::Qesp, mode, false, outer_v6)
}

fn classifier() -> Classifier {
    Classifier::NAT_T.qesp(253)
}

/// Encapsulates `pkt` on `tx`: the wire packet and where its Q-ESP header is.
fn seal(tx: &mut Sa, pkt: &[u8]) -> (Vec<u8>, Inbound) {
    let mut b = PacketBuf::from_packet(pkt);
    tx.encapsulate(&mut b, T0).unwrap();
    let wire = b.as_slice().to_vec();
    let Classified::Ipsec(inb) = classify(&wire, &classifier()).unwrap() else {
        panic!("not IPsec");
    };
    (wire, inb)
}

fn open(rx: &mut Sa, wire: &[u8], inb: &Inbound) -> PResult<Vec<u8>> {
    let mut b = PacketBuf::from_packet(wire);
    rx.decapsulate(&mut b, inb, T0)?;
    Ok(b.as_slice().to_vec())
}

#[test]
fn every_allowed_suite_mode_and_family_roundtrips() {
    for suite in SUITES {
        for mode in [Mode::Tunnel, Mode::Transport] {
            for outer_v6 in [false, true] {
                for inner_v6 in [false, true] {
                    if mode == Mode::Transport && inner_v6 != outer_v6 {
                        continue;
                    }
                    for esn in [false, true] {
                        let mut c = qesp(suite, mode, outer_v6);
                        c.esn = esn;
                        c.initial_seq = if esn { (7 << 32) + 1 } else { 1 };
                        let (mut tx, mut rx) = pair(&c);
                        for n in [0, 1, 15, 16, 17, 100, 1400, 8900] {
                            let pkt = udp_packet(inner_v6, n, 0);
                            let what = format!(
                                "{suite} {mode:?} v6={outer_v6}/{inner_v6} esn={esn} n={n}"
                            );
                            let (wire, inb) = seal(&mut tx, &pkt);
                            let info = ip::parse(&wire).unwrap();
                            assert_eq!(info.protocol, 253, "{what}");
                            assert_eq!(inb.protocol, Protocol::Qesp, "{what}");
                            let h = QespHeader::new_checked(&wire[inb.offset..]).unwrap();
                            assert_eq!(
                                h.clear(),
                                ClearFields {
                                    sport: 1234,
                                    dport: 5678,
                                    tlp: 17
                                },
                                "{what}"
                            );
                            assert_eq!((h.reserved(), h.spi()), (0, 0x1000_0001), "{what}");
                            // ESP's length plus 8 header bytes, exactly.
                            let mut esp_c = c.clone();
                            esp_c.protocol = Protocol::Esp;
                            esp_c.ip_protocol = proto::ESP;
                            let mut esp_tx = Sa::new(esp_c, T0).unwrap();
                            let mut b = PacketBuf::from_packet(&pkt);
                            esp_tx.encapsulate(&mut b, T0).unwrap();
                            assert_eq!(wire.len(), b.len() + 8, "{what}");
                            assert_eq!(open(&mut rx, &wire, &inb).unwrap(), pkt, "{what}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_clear_fields_follow_the_protected_packet() {
    // ICMP: TLP 1, no ports.
    let mut pkt = udp_packet(false, 40, 0);
    pkt[9] = proto::ICMP;
    let c = qesp("aes128gcm16", Mode::Tunnel, false);
    let (mut tx, mut rx) = pair(&c);
    let (wire, inb) = seal(&mut tx, &pkt);
    let h = QespHeader::new_checked(&wire[inb.offset..]).unwrap();
    assert_eq!(
        h.clear(),
        ClearFields {
            sport: 0,
            dport: 0,
            tlp: 1
        }
    );
    assert_eq!(open(&mut rx, &wire, &inb).unwrap(), pkt);
    // Transport mode over IPv6: the ports behind the IPv6 header.
    let pkt = udp_packet(true, 40, 0);
    let c = qesp("chacha20poly1305", Mode::Transport, true);
    let (mut tx, _) = pair(&c);
    let (wire, inb) = seal(&mut tx, &pkt);
    assert_eq!(inb.offset, 40);
    let h = QespHeader::new_checked(&wire[inb.offset..]).unwrap();
    assert_eq!(
        h.clear(),
        ClearFields {
            sport: 1234,
            dport: 5678,
            tlp: 17
        }
    );
}

#[test]
fn tampering_with_any_clear_field_or_outer_address_fails_the_icv() {
    for suite in ["aes128gcm16", "aes128-sha1"] {
        for outer_v6 in [false, true] {
            let mut c = qesp(suite, Mode::Tunnel, outer_v6);
            c.esn = true;
            let (mut tx, mut rx) = pair(&c);
            let pkt = udp_packet(false, 64, 0);
            for at in 0..QESP_HEADER_LEN {
                for bit in [0x01u8, 0x80] {
                    let (mut wire, inb) = seal(&mut tx, &pkt);
                    wire[inb.offset + at] ^= bit;
                    let r = open(&mut rx, &wire, &inb);
                    let want: &[DropReason] = if at >= 12 {
                        // The sequence number: below the window, or the
                        // ICV fails.
                        &[DropReason::Integrity, DropReason::Replay]
                    } else {
                        &[DropReason::Integrity]
                    };
                    assert!(
                        r.as_ref().is_err_and(|e| want.contains(e)),
                        "{suite} v6={outer_v6} byte {at} bit {bit:#x}: {r:?}"
                    );
                }
            }
            // Either outer address changed (as NAT would): the ICV fails.
            let other: IpAddr = if outer_v6 {
                "2001:db8:ff::99".parse().unwrap()
            } else {
                "192.0.2.99".parse().unwrap()
            };
            for which in [0, 1] {
                let (wire, mut inb) = seal(&mut tx, &pkt);
                if which == 0 {
                    inb.outer.src = other;
                } else {
                    inb.outer.dst = other;
                }
                assert_eq!(open(&mut rx, &wire, &inb), Err(DropReason::Integrity));
            }
            // The untouched packets still pass after all that.
            let (wire, inb) = seal(&mut tx, &pkt);
            assert_eq!(open(&mut rx, &wire, &inb).unwrap(), pkt);
            assert!(rx.stats().drops_for(DropReason::Integrity) > 0);
        }
    }
    // ESP, for contrast, does not authenticate the outer addresses.
    let c = config("aes128gcm16", Protocol::Esp, Mode::Tunnel, false, false);
    let (mut tx, mut rx) = pair(&c);
    let pkt = udp_packet(false, 64, 0);
    let mut b = PacketBuf::from_packet(&pkt);
    tx.encapsulate(&mut b, T0).unwrap();
    let wire = b.as_slice().to_vec();
    let Classified::Ipsec(mut inb) = classify(&wire, &classifier()).unwrap() else {
        panic!()
    };
    inb.outer.src = "192.0.2.99".parse().unwrap();
    assert_eq!(open(&mut rx, &wire, &inb).unwrap(), pkt);
}

#[test]
fn a_sender_claiming_another_flows_ports_is_dropped_and_counted() {
    for mode in [Mode::Tunnel, Mode::Transport] {
        let c = qesp("aes256-sha256", mode, false);
        let (mut tx, mut rx) = pair(&c);
        let pkt = udp_packet(false, 100, 0);
        for lie in [
            ClearFields {
                sport: 1234,
                dport: 5004,
                tlp: 17,
            },
            ClearFields {
                sport: 9,
                dport: 5678,
                tlp: 17,
            },
            ClearFields {
                sport: 1234,
                dport: 5678,
                tlp: 6,
            },
        ] {
            let mut b = PacketBuf::from_packet(&pkt);
            let info = ip::parse(&pkt).unwrap();
            let seq = tx.take_seq(T0).unwrap();
            tx.esp_out_showing::<Qesp, _>(&mut b, &info, seq, lie, &mut NoProbe)
                .unwrap();
            let wire = b.as_slice().to_vec();
            let Classified::Ipsec(inb) = classify(&wire, &classifier()).unwrap() else {
                panic!()
            };
            // The ICV is good (the liar holds the keys); the ports are not.
            assert_eq!(
                open(&mut rx, &wire, &inb),
                Err(DropReason::QespPortMismatch),
                "{mode:?} {lie:?}"
            );
        }
        assert_eq!(rx.stats().drops_for(DropReason::QespPortMismatch), 3);
        // An honest packet after the lies passes.
        let (wire, inb) = seal(&mut tx, &pkt);
        assert_eq!(open(&mut rx, &wire, &inb).unwrap(), pkt);
    }
}

#[test]
fn suites_and_settings_without_qesps_guarantees_are_refused() {
    let err = |c: SaConfig| Sa::new(c, T0).unwrap_err().to_string();
    let e = err(qesp("null-sha256", Mode::Tunnel, false));
    assert!(e.contains("requires encryption"), "{e}");
    let e = err(qesp("aes128gmac", Mode::Tunnel, false));
    assert!(e.contains("requires encryption"), "{e}");
    let e = err(qesp("aes128", Mode::Tunnel, false));
    assert!(e.contains("requires integrity"), "{e}");
    let mut c = qesp("aes128gcm16", Mode::Tunnel, false);
    c.replay_window = 0;
    let e = err(c);
    assert!(e.contains("anti-replay"), "{e}");
    let e = err(config(
        "aes128gcm16",
        Protocol::Qesp,
        Mode::Tunnel,
        true,
        false,
    ));
    assert!(e.contains("UDP-encapsulated"), "{e}");
    let mut c = qesp("aes128gcm16", Mode::Tunnel, false);
    c.ip_protocol = proto::ESP;
    let e = err(c);
    assert!(e.contains("cannot carry Q-ESP"), "{e}");
    // ESP keeps its own number.
    let mut c = config("aes128gcm16", Protocol::Esp, Mode::Tunnel, false, false);
    c.ip_protocol = 253;
    assert!(err(c).contains("IP protocol 50"));
    // Another experimental number works end to end.
    let mut c = qesp("aes128gcm16", Mode::Tunnel, false);
    c.ip_protocol = 254;
    let (mut tx, mut rx) = pair(&c);
    let pkt = udp_packet(false, 10, 0);
    let mut b = PacketBuf::from_packet(&pkt);
    tx.encapsulate(&mut b, T0).unwrap();
    let wire = b.as_slice().to_vec();
    assert_eq!(ip::parse(&wire).unwrap().protocol, 254);
    assert_eq!(
        classify(&wire, &classifier()).unwrap_err(),
        DropReason::NotIpsec
    );
    let Classified::Ipsec(inb) = classify(&wire, &Classifier::new().qesp(254)).unwrap() else {
        panic!()
    };
    assert_eq!(open(&mut rx, &wire, &inb).unwrap(), pkt);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn any_length_roundtrips(suite_i in 0usize..8, n in 0usize..9000, transport in any::<bool>(),
                             v6 in any::<bool>(), esn in any::<bool>()) {
        let mode = if transport { Mode::Transport } else { Mode::Tunnel };
        let mut c = qesp(SUITES[suite_i], mode, v6);
        c.esn = esn;
        let (mut tx, mut rx) = pair(&c);
        let pkt = udp_packet(v6, n, 0);
        let (wire, inb) = seal(&mut tx, &pkt);
        prop_assert_eq!(open(&mut rx, &wire, &inb).unwrap(), pkt);
    }
}

/// One `[[vector]]` of `tests/vectors/qesp.toml`, read by hand (flat
/// `key = value` lines; the core has no TOML dependency).
fn vectors() -> Vec<std::collections::HashMap<String, String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/qesp.toml");
    let text = std::fs::read_to_string(path).expect("tests/vectors/qesp.toml");
    text.split("[[vector]]")
        .skip(1)
        .map(|block| {
            block
                .lines()
                .filter_map(|l| l.split_once(" = "))
                .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
                .collect()
        })
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s).expect("hex in the vectors")
}

fn num(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex number")
}

#[test]
fn known_answer_vectors_from_the_reference() {
    let vs = vectors();
    assert!(vs.len() >= 6);
    for v in vs {
        let name = &v["name"];
        let suite: Suite = v["suite"].parse().unwrap();
        let enc = unhex(&v["enc_key"]);
        let integ = v.get("integ_key").map_or(Vec::new(), |k| unhex(k));
        let mut c = SaConfig::new(num(&v["spi"]) as u32, Protocol::Qesp, suite, &enc, &integ);
        c.mode = if v["mode"] == "tunnel" {
            Mode::Tunnel
        } else {
            Mode::Transport
        };
        if let (Some(s), Some(d)) = (v.get("outer_src"), v.get("outer_dst")) {
            c.tunnel_src = Some(s.parse().unwrap());
            c.tunnel_dst = Some(d.parse().unwrap());
        }
        c.esn = v["esn"] == "true";
        c.allow_insecure = true;
        let seq = num(&v["seq"]);
        c.initial_seq = seq;
        let pkt = unhex(&v["packet"]);
        let want = unhex(&v["qesp"]);
        let (mut tx, mut rx) = pair(&c);
        let (mut wire, inb) = seal(&mut tx, &pkt);
        if suite.enc.is_some_and(|e| e.is_combined()) {
            // The IV is the sequence number: espgate's bytes are the vector's.
            assert_eq!(hex::encode(&wire[inb.offset..]), v["qesp"], "{name}");
        } else {
            // A random IV: same length, and the vector's bytes must open.
            assert_eq!(wire.len() - inb.offset, want.len(), "{name}");
            wire.truncate(inb.offset);
            wire.extend_from_slice(&want);
        }
        assert_eq!(open(&mut rx, &wire, &inb).unwrap(), pkt, "{name}");
    }
}
