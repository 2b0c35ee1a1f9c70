use super::*;
use proptest::prelude::*;

fn hdr(exchange_type: ExchangeType) -> Header {
    Header {
        spi_i: 0x0102_0304_0506_0708,
        spi_r: 0x1112_1314_1516_1718,
        minor_version: 0,
        exchange_type,
        initiator: true,
        version: false,
        response: false,
        message_id: 7,
    }
}

fn sa() -> Payload {
    Payload::Sa(vec![
        Proposal {
            number: 1,
            protocol: protocol::IKE,
            spi: vec![],
            transforms: vec![
                Transform::with_key_length(transform_type::ENCR, encr::AES_GCM_16, 128),
                Transform::new(transform_type::PRF, prf::HMAC_SHA2_256),
                Transform::new(transform_type::DH, dh::CURVE25519),
            ],
        },
        Proposal {
            number: 2,
            protocol: protocol::ESP,
            spi: vec![0xde, 0xad, 0xbe, 0xef],
            transforms: vec![
                Transform {
                    transform_type: transform_type::ENCR,
                    id: encr::AES_CBC,
                    attributes: vec![
                        Attribute::Tv {
                            attr_type: attribute::KEY_LENGTH,
                            value: 256,
                        },
                        Attribute::Tlv {
                            attr_type: 0x1234,
                            value: vec![1, 2, 3],
                        },
                    ],
                },
                Transform::new(transform_type::INTEG, integ::HMAC_SHA2_256_128),
                Transform::new(transform_type::ESN, esn::NO),
            ],
        },
    ])
}

/// Every payload kind except SK/SKF (which must be last).
fn all_plain_payloads() -> Vec<Payload> {
    vec![
        sa(),
        Payload::Ke {
            group: dh::CURVE25519,
            data: vec![0x55; 32],
        },
        Payload::Nonce(vec![0xaa; 32]),
        Payload::IdI(Id {
            id_type: id_type::FQDN,
            data: b"moon.example".to_vec(),
        }),
        Payload::IdR(Id {
            id_type: id_type::IPV4_ADDR,
            data: vec![192, 0, 2, 1],
        }),
        Payload::Cert {
            encoding: cert_encoding::X509_SIGNATURE,
            data: vec![0x30, 0x82, 0, 1, 0],
        },
        Payload::CertReq {
            encoding: cert_encoding::X509_SIGNATURE,
            data: vec![0x11; 20],
        },
        Payload::Auth {
            method: auth_method::DIGITAL_SIGNATURE,
            data: vec![0x99; 40],
        },
        Payload::Notify(Notify {
            protocol: 0,
            spi: vec![],
            notify_type: NotifyType::NatDetectionSourceIp,
            data: vec![0x22; 20],
        }),
        Payload::Notify(Notify {
            protocol: protocol::ESP,
            spi: vec![1, 2, 3, 4],
            notify_type: NotifyType::RekeySa,
            data: vec![],
        }),
        Payload::Delete(Delete::Ike),
        Payload::Delete(Delete::Child {
            protocol: protocol::ESP,
            spis: vec![0xc000_0001, 0xc000_0002],
        }),
        Payload::VendorId(b"espgate".to_vec()),
        Payload::TsI(vec![
            TrafficSelector::Ipv4 {
                ip_protocol: 0,
                start_port: 0,
                end_port: 65535,
                start: Ipv4Addr::new(10, 0, 0, 0),
                end: Ipv4Addr::new(10, 0, 0, 255),
            },
            TrafficSelector::Ipv6 {
                ip_protocol: 17,
                start_port: 500,
                end_port: 4500,
                start: "2001:db8::".parse().unwrap(),
                end: "2001:db8::ffff".parse().unwrap(),
            },
        ]),
        Payload::TsR(vec![TrafficSelector::Other {
            ts_type: 9,
            ip_protocol: 0,
            body: vec![0; 12],
        }]),
        Payload::Unknown {
            payload_type: PayloadType::Cp,
            critical: false,
            body: vec![1, 0, 0, 0],
        },
    ]
}

fn msgs() -> Vec<Message> {
    vec![
        Message {
            header: hdr(ExchangeType::IkeSaInit),
            payloads: all_plain_payloads(),
        },
        Message {
            header: Header {
                response: true,
                initiator: false,
                version: true,
                minor_version: 1,
                ..hdr(ExchangeType::IkeAuth)
            },
            payloads: vec![
                Payload::Notify(Notify {
                    protocol: 0,
                    spi: vec![],
                    notify_type: NotifyType::InitialContact,
                    data: vec![],
                }),
                Payload::Sk {
                    first_payload: PayloadType::IdI,
                    data: vec![0x77; 64],
                },
            ],
        },
        Message {
            header: hdr(ExchangeType::IkeAuth),
            payloads: vec![Payload::Skf {
                first_payload: PayloadType::IdI,
                number: 1,
                total: 3,
                data: vec![0x66; 48],
            }],
        },
        Message {
            header: hdr(ExchangeType::Informational),
            payloads: vec![],
        },
    ]
}

#[test]
fn roundtrip_every_payload_kind() {
    for m in msgs() {
        let b = m.emit().unwrap();
        assert_eq!(be32(&b, 24) as usize, b.len());
        let p = Message::parse(&b).unwrap();
        assert_eq!(p, m);
        assert_eq!(p.emit().unwrap(), b);
    }
    // The kinds are all there.
    let m = &msgs()[0];
    for t in [33u8, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 47] {
        assert!(
            m.payloads_of(PayloadType::from(t)).next().is_some(),
            "payload {t}"
        );
    }
    assert_eq!(m.notifies().count(), 2);
}

#[test]
fn header_layout() {
    let b = msgs()[1].emit().unwrap();
    assert_eq!(&b[0..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(b[16], u8::from(PayloadType::Notify));
    assert_eq!(b[17], 0x21);
    assert_eq!(ExchangeType::from(b[18]), ExchangeType::IkeAuth);
    assert_eq!(b[19], 0x30); // R|V
    assert_eq!(be32(&b, 20), 7);
    // Notify's next payload is SK, SK's next payload is the inner first payload.
    assert_eq!(b[28], u8::from(PayloadType::Sk));
    let sk = 28 + usize::from(be16(&b, 30));
    assert_eq!(b[sk], u8::from(PayloadType::IdI));
    assert_eq!(usize::from(be16(&b, sk + 2)), 4 + 64);
}

#[test]
fn key_length_attribute_is_tv() {
    let m = Message {
        header: hdr(ExchangeType::IkeSaInit),
        payloads: vec![sa()],
    };
    let b = m.emit().unwrap();
    // SA header, proposal header (8), transform header (8), then 0x800e 0x0080.
    let at = 28 + 4 + 8 + 8;
    assert_eq!(&b[at..at + 4], &[0x80, 0x0e, 0x00, 0x80]);
    match &Message::parse(&b).unwrap().payloads[0] {
        Payload::Sa(p) => {
            assert_eq!(p[0].transforms[0].key_length(), Some(128));
            assert_eq!(p[0].transforms[1].key_length(), None);
            assert_eq!(p[1].transforms[0].key_length(), Some(256));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_critical_is_reported() {
    let mut m = Message {
        header: hdr(ExchangeType::IkeAuth),
        payloads: vec![
            Payload::Nonce(vec![1; 16]),
            Payload::Unknown {
                payload_type: PayloadType::from(200),
                critical: false,
                body: vec![9; 3],
            },
            Payload::Unknown {
                payload_type: PayloadType::from(201),
                critical: true,
                body: vec![],
            },
        ],
    };
    let b = m.emit().unwrap();
    let p = Message::parse(&b).unwrap();
    assert_eq!(p, m);
    assert_eq!(p.unsupported_critical(), Some(PayloadType::from(201)));
    m.payloads.pop();
    assert_eq!(
        Message::parse(&m.emit().unwrap())
            .unwrap()
            .unsupported_critical(),
        None
    );
    // The critical bit on a known payload is ignored (RFC 7296 §2.5).
    let mut b = Message {
        header: hdr(ExchangeType::IkeAuth),
        payloads: vec![Payload::Nonce(vec![1; 16])],
    }
    .emit()
    .unwrap();
    b[29] = CRITICAL;
    let p = Message::parse(&b).unwrap();
    assert_eq!(p.unsupported_critical(), None);
    assert_eq!(p.payloads, vec![Payload::Nonce(vec![1; 16])]);
}

/// Every truncation is an error, both with the header length left alone
/// and with it patched to the truncated size (so the payload checks run).
#[test]
fn truncations_are_errors() {
    for m in msgs() {
        let b = m.emit().unwrap();
        for n in 0..b.len() {
            assert!(Message::parse(&b[..n]).is_err(), "prefix {n}");
            if n >= HEADER_LEN {
                let mut t = b[..n].to_vec();
                t[24..28].copy_from_slice(&(n as u32).to_be_bytes());
                // The only valid cut is right after the header of an empty chain.
                let ok = Message::parse(&t);
                assert!(ok.is_err(), "patched prefix {n}: {ok:?}");
            }
        }
    }
}

/// Byte offsets of every 16-bit length field in an emitted message built
/// from `all_plain_payloads` (payloads, proposals, transforms, TLV
/// attributes, selectors), found by walking the known layout.
fn length_field_offsets(b: &[u8]) -> Vec<usize> {
    let mut v = Vec::new();
    let mut at = HEADER_LEN;
    let mut ptype = b[16];
    while ptype != 0 {
        v.push(at + 2);
        let len = usize::from(be16(b, at + 2));
        let body = at + 4;
        if ptype == u8::from(PayloadType::Sa) {
            let mut p = body;
            while p < at + len {
                v.push(p + 2);
                let plen = usize::from(be16(b, p + 2));
                let mut t = p + 8 + usize::from(b[p + 6]);
                while t < p + plen {
                    v.push(t + 2);
                    let tlen = usize::from(be16(b, t + 2));
                    let mut a = t + 8;
                    while a < t + tlen {
                        if b[a] & 0x80 == 0 {
                            v.push(a + 2);
                            a += 4 + usize::from(be16(b, a + 2));
                        } else {
                            a += 4;
                        }
                    }
                    t += tlen;
                }
                p += plen;
            }
        }
        if ptype == u8::from(PayloadType::TsI) || ptype == u8::from(PayloadType::TsR) {
            let mut s = body + 4;
            while s < at + len {
                v.push(s + 2);
                s += usize::from(be16(b, s + 2));
            }
        }
        ptype = if ptype == u8::from(PayloadType::Sk) || ptype == u8::from(PayloadType::Skf) {
            0
        } else {
            b[at]
        };
        at += len;
    }
    v
}

#[test]
fn bad_lengths_at_every_length_field_are_errors() {
    for m in msgs() {
        let b = m.emit().unwrap();
        let offs = length_field_offsets(&b);
        assert!(m.payloads.is_empty() || !offs.is_empty());
        for &o in &offs {
            let orig = be16(&b, o);
            for v in [0u16, 1, 3, orig - 1, orig + 1, orig + 4, 0xffff] {
                if v == orig {
                    continue;
                }
                let mut t = b.clone();
                t[o..o + 2].copy_from_slice(&v.to_be_bytes());
                assert!(
                    Message::parse(&t).is_err(),
                    "length field at {o}: {orig} -> {v} parsed"
                );
            }
        }
    }
    let b = msgs()[0].emit().unwrap();
    // 16 payloads, 2 proposals, 6 transforms, 1 TLV attribute, 3 selectors.
    assert_eq!(length_field_offsets(&b).len(), 16 + 2 + 6 + 1 + 3);
}

#[test]
fn every_byte_mutation_never_panics_and_reparses_stably() {
    for m in msgs() {
        let b = m.emit().unwrap();
        for i in 0..b.len() {
            for x in [0x00u8, 0xff, 0x01, 0x80] {
                let mut t = b.clone();
                t[i] ^= x;
                if let Ok(p) = Message::parse(&t) {
                    let e = p.emit().unwrap();
                    assert_eq!(Message::parse(&e).unwrap(), p);
                }
            }
        }
    }
}

#[test]
fn specific_errors() {
    let good = msgs()[0].emit().unwrap();
    // Version 1.0 and 3.0.
    let mut t = good.clone();
    t[17] = 0x10;
    assert_eq!(
        Message::parse(&t),
        Err(IkeError::UnsupportedMajorVersion(1))
    );
    t[17] = 0x30;
    assert_eq!(
        Message::parse(&t),
        Err(IkeError::UnsupportedMajorVersion(3))
    );
    // Datagram longer than the header says.
    let mut t = good.clone();
    t.push(0);
    assert_eq!(
        Message::parse(&t),
        Err(IkeError::LengthMismatch {
            header: good.len() as u32,
            datagram: good.len() + 1
        })
    );
    // Chain ends early: trailing bytes.
    let mut t = good.clone();
    t[16] = 0;
    assert_eq!(Message::parse(&t), Err(IkeError::TrailingBytes));
    // Proposal count markers: second proposal marked "last" on the first.
    let mut t = good.clone();
    assert_eq!(t[32], 2);
    t[32] = 0;
    assert_eq!(Message::parse(&t), Err(IkeError::BadProposal));
    // Transform count off by one.
    let mut t = good.clone();
    t[32 + 7] = 2;
    assert_eq!(Message::parse(&t), Err(IkeError::BadTransform));
    t[32 + 7] = 4;
    assert_eq!(Message::parse(&t), Err(IkeError::BadTransform));
    // Transform "last" marker wrong.
    let mut t = good.clone();
    assert_eq!(t[40], 3);
    t[40] = 0;
    assert_eq!(Message::parse(&t), Err(IkeError::BadTransform));
    // Proposal SPI size past the proposal.
    let mut t = good.clone();
    t[32 + 6] = 200;
    assert_eq!(Message::parse(&t), Err(IkeError::BadProposal));
}

fn one(p: Payload) -> Vec<u8> {
    Message {
        header: hdr(ExchangeType::Informational),
        payloads: vec![p],
    }
    .emit()
    .unwrap()
}

#[test]
fn qesp_proposals_and_deletes_parse_and_emit() {
    // Q-ESP (private-use protocol 201) proposals, notifies and deletes
    // travel like ESP's: 4-byte SPIs, every byte as given.
    let m = Message {
        header: hdr(ExchangeType::Informational),
        payloads: vec![
            Payload::Sa(vec![
                Proposal {
                    number: 1,
                    protocol: protocol::QESP,
                    spi: vec![1, 2, 3, 4],
                    transforms: vec![
                        Transform::with_key_length(transform_type::ENCR, encr::AES_GCM_16, 128),
                        Transform::new(transform_type::ESN, esn::NO),
                    ],
                },
                Proposal {
                    number: 2,
                    protocol: protocol::ESP,
                    spi: vec![1, 2, 3, 4],
                    transforms: vec![
                        Transform::with_key_length(transform_type::ENCR, encr::AES_GCM_16, 128),
                        Transform::new(transform_type::ESN, esn::NO),
                    ],
                },
            ]),
            Payload::Notify(Notify {
                protocol: protocol::QESP,
                spi: vec![5, 6, 7, 8],
                notify_type: NotifyType::RekeySa,
                data: vec![],
            }),
            Payload::Delete(Delete::Child {
                protocol: protocol::QESP,
                spis: vec![0xc000_0001],
            }),
        ],
    };
    let b = m.emit().unwrap();
    assert_eq!(Message::parse(&b).unwrap(), m);
    // The proposal's protocol byte and the delete's protocol byte are 201.
    assert_eq!(b[28 + 4 + 5], 201);
    let d = b.len() - 8;
    assert_eq!((b[d], b[d + 1], be16(&b, d + 2)), (201, 4, 1));
    // Other unknown protocols in a Delete are still refused.
    let mut t = b.clone();
    t[d] = 99;
    assert_eq!(Message::parse(&t), Err(IkeError::BadDelete));
    assert!(protocol::is_child(protocol::QESP) && !protocol::is_child(protocol::IKE));
}

#[test]
fn payload_specific_errors() {
    // Delete: SPI count disagreeing with the bytes.
    let mut t = one(Payload::Delete(Delete::Child {
        protocol: protocol::ESP,
        spis: vec![1, 2],
    }));
    assert_eq!(be16(&t, 34), 2);
    t[35] = 3;
    assert_eq!(Message::parse(&t), Err(IkeError::BadDelete));
    // Delete IKE with an SPI size.
    let mut t = one(Payload::Delete(Delete::Ike));
    t[33] = 4;
    assert_eq!(Message::parse(&t), Err(IkeError::BadDelete));
    // Notify SPI size past the payload.
    let mut t = one(Payload::Notify(Notify {
        protocol: 3,
        spi: vec![1, 2, 3, 4],
        notify_type: NotifyType::RekeySa,
        data: vec![],
    }));
    t[33] = 5;
    assert_eq!(Message::parse(&t), Err(IkeError::BadNotify));
    // TS count / selector length.
    let ts = one(Payload::TsI(vec![TrafficSelector::Ipv4 {
        ip_protocol: 6,
        start_port: 1,
        end_port: 2,
        start: Ipv4Addr::new(1, 1, 1, 1),
        end: Ipv4Addr::new(1, 1, 1, 2),
    }]));
    for (at, v) in [(32, 0u8), (32, 2), (36, 8)] {
        let mut t = ts.clone();
        t[at] = v;
        assert_eq!(
            Message::parse(&t),
            Err(IkeError::BadTrafficSelector),
            "{at}={v}"
        );
    }
    // SKF fragment numbers.
    let f = one(Payload::Skf {
        first_payload: PayloadType::from(0),
        number: 2,
        total: 2,
        data: vec![1; 16],
    });
    for (num, tot) in [(0u16, 2u16), (3, 2), (1, 0)] {
        let mut t = f.clone();
        t[32..34].copy_from_slice(&num.to_be_bytes());
        t[34..36].copy_from_slice(&tot.to_be_bytes());
        assert_eq!(Message::parse(&t), Err(IkeError::BadFragment));
    }
    // Empty SA payload.
    let mut t = one(Payload::Nonce(vec![]));
    t[16] = u8::from(PayloadType::Sa);
    assert_eq!(Message::parse(&t), Err(IkeError::BadProposal));
}

#[test]
fn encrypted_must_be_last_and_not_nested() {
    let m = Message {
        header: hdr(ExchangeType::IkeAuth),
        payloads: vec![
            Payload::Sk {
                first_payload: PayloadType::from(35),
                data: vec![1; 8],
            },
            Payload::Nonce(vec![1]),
        ],
    };
    assert_eq!(m.emit(), Err(IkeError::MisplacedEncrypted));
    // An SK whose length leaves bytes after it.
    let mut b = msgs()[1].emit().unwrap();
    let sk = 28 + usize::from(be16(&b, 30));
    let l = be16(&b, sk + 2) - 4;
    b[sk + 2..sk + 4].copy_from_slice(&l.to_be_bytes());
    assert_eq!(Message::parse(&b), Err(IkeError::MisplacedEncrypted));
    // A decrypted SK body holding another SK.
    let mut inner = Vec::new();
    let first = emit_payload_chain(
        &[
            Payload::Nonce(vec![1; 4]),
            Payload::Sk {
                first_payload: PayloadType::from(0),
                data: vec![],
            },
        ],
        &mut inner,
    )
    .unwrap();
    assert_eq!(
        parse_payload_chain(first, &inner, true),
        Err(IkeError::MisplacedEncrypted)
    );
    assert_eq!(parse_payload_chain(first, &inner, false).unwrap().len(), 2);
}

#[test]
fn payload_count_is_bounded() {
    let mut m = Message {
        header: hdr(ExchangeType::Informational),
        payloads: vec![Payload::VendorId(vec![]); MAX_PAYLOADS],
    };
    let b = m.emit().unwrap();
    assert_eq!(Message::parse(&b).unwrap().payloads.len(), MAX_PAYLOADS);
    // One more, built by hand since emit refuses it.
    let mut t = b.clone();
    let last = t.len() - 4;
    t[last] = u8::from(PayloadType::VendorId);
    t.extend_from_slice(&[0, 0, 0, 4]);
    let n = t.len() as u32;
    t[24..28].copy_from_slice(&n.to_be_bytes());
    assert_eq!(Message::parse(&t), Err(IkeError::TooManyPayloads));
    m.payloads.push(Payload::VendorId(vec![]));
    assert_eq!(m.emit(), Err(IkeError::TooManyPayloads));
}

#[test]
fn emit_refuses_unencodable_values() {
    let too_big = Payload::Nonce(vec![0; 70_000]);
    assert_eq!(
        Message {
            header: hdr(ExchangeType::IkeSaInit),
            payloads: vec![too_big]
        }
        .emit(),
        Err(IkeError::TooBig)
    );
    for p in [
        Payload::Unknown {
            payload_type: PayloadType::Nonce,
            critical: false,
            body: vec![],
        },
        Payload::Unknown {
            payload_type: PayloadType::from(0),
            critical: false,
            body: vec![],
        },
        Payload::Delete(Delete::Child {
            protocol: protocol::IKE,
            spis: vec![1],
        }),
    ] {
        let m = Message {
            header: hdr(ExchangeType::Informational),
            payloads: vec![p],
        };
        assert_eq!(m.emit(), Err(IkeError::Unencodable));
    }
    let m = Message {
        header: hdr(ExchangeType::Informational),
        payloads: vec![Payload::TsI(vec![])],
    };
    assert_eq!(m.emit(), Err(IkeError::BadTrafficSelector));
}

proptest! {
    #[test]
    fn random_bytes_never_panic(mut body in proptest::collection::vec(any::<u8>(), 0..300), first in 0u8..60) {
        let mut b = msgs()[0].emit().unwrap()[..HEADER_LEN].to_vec();
        b[16] = first;
        b.append(&mut body);
        let n = b.len() as u32;
        b[24..28].copy_from_slice(&n.to_be_bytes());
        if let Ok(m) = Message::parse(&b) {
            let e = m.emit().unwrap();
            prop_assert_eq!(Message::parse(&e).unwrap(), m);
        }
    }
}

#[test]
fn codepoints_convert_both_ways_without_loss() {
    for v in 0..=u8::MAX {
        let e = ExchangeType::from(v);
        assert_eq!(u8::from(e), v);
        assert_eq!(e.as_str().is_some(), (34..=37).contains(&v), "{v}");
    }
    for v in [
        0u16,
        1,
        7,
        14,
        17,
        43,
        100,
        16383,
        16384,
        16393,
        16431,
        40000,
        u16::MAX,
    ] {
        let n = NotifyType::from(v);
        assert_eq!(u16::from(n), v);
        assert_eq!(n.is_error(), v < 16384, "{v}");
    }
    // Known values get their variant and name; Unknown(n) of a known n is
    // the same value.
    assert_eq!(ExchangeType::from(36), ExchangeType::CreateChildSa);
    assert_eq!(ExchangeType::Unknown(36), ExchangeType::CreateChildSa);
    assert_eq!(NotifyType::from(16390), NotifyType::Cookie);
    assert_eq!(NotifyType::Cookie.as_str(), Some("COOKIE"));
    assert_eq!(NotifyType::Cookie.to_string(), "COOKIE");
    assert_eq!(NotifyType::from(40000).to_string(), "40000");
    assert_eq!(NotifyType::from(40000), NotifyType::Unknown(40000));
    assert_eq!(ExchangeType::IkeSaInit.to_string(), "IKE_SA_INIT");
    for v in 0..=u8::MAX {
        let t = PayloadType::from(v);
        assert_eq!(u8::from(t), v);
        assert_eq!(is_decoded_type(t), (33..=46).contains(&v) || v == 53, "{v}");
    }
    assert_eq!(PayloadType::from(47), PayloadType::Cp);
    assert_eq!(PayloadType::Skf.as_str(), Some("SKF"));
    assert_eq!(PayloadType::from(200).to_string(), "200");
    // An unknown exchange type survives parse and emit.
    let m = Message {
        header: hdr(ExchangeType::from(99)),
        payloads: vec![Payload::Notify(Notify {
            protocol: 0,
            spi: vec![],
            notify_type: NotifyType::from(40000),
            data: vec![1],
        })],
    };
    let b = m.emit().unwrap();
    assert_eq!(b[18], 99);
    assert_eq!(Message::parse(&b).unwrap(), m);
}
