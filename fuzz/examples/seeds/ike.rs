//! `ike_parse` seeds: IKE datagrams of each exchange, and decrypted SK
//! bodies (`first payload type || payload chain`) with every payload kind
//! the codec decodes, built with `espgate_ike::wire` and emitted by it.

use espgate_ike::wire::{
    attribute, auth_method, cert_encoding, dh, emit_payload_chain, encr, esn, id_type, integ, prf,
    protocol, transform_type, ts_type, Attribute, Delete, ExchangeType, Header, Id, Message,
    Notify, NotifyType, Payload, Proposal, TrafficSelector, Transform,
};

fn header(exchange_type: ExchangeType, response: bool, message_id: u32) -> Header {
    Header {
        spi_i: 0x0102_0304_0506_0708,
        spi_r: if exchange_type == ExchangeType::IkeSaInit && !response {
            0
        } else {
            0x1112_1314_1516_1718
        },
        minor_version: 0,
        exchange_type,
        initiator: !response,
        version: false,
        response,
        message_id,
    }
}

fn t(tt: u8, id: u16) -> Transform {
    Transform::new(tt, id)
}

fn ike_proposals() -> Vec<Proposal> {
    vec![
        Proposal {
            number: 1,
            protocol: protocol::IKE,
            spi: Vec::new(),
            transforms: vec![
                Transform::with_key_length(transform_type::ENCR, encr::AES_GCM_16, 128),
                t(transform_type::PRF, prf::HMAC_SHA2_256),
                t(transform_type::DH, dh::CURVE25519),
            ],
        },
        Proposal {
            number: 2,
            protocol: protocol::IKE,
            spi: Vec::new(),
            transforms: vec![
                Transform::with_key_length(transform_type::ENCR, encr::AES_CBC, 256),
                t(transform_type::INTEG, integ::HMAC_SHA2_256_128),
                t(transform_type::PRF, prf::HMAC_SHA2_256),
                t(transform_type::DH, dh::MODP_2048),
            ],
        },
    ]
}

fn child_proposals(proto: u8) -> Vec<Proposal> {
    vec![
        Proposal {
            number: 1,
            protocol: proto,
            spi: vec![0xc0, 0xff, 0xee, 0x01],
            transforms: vec![
                Transform::with_key_length(transform_type::ENCR, encr::AES_GCM_16, 256),
                t(transform_type::ESN, esn::YES),
                t(transform_type::ESN, esn::NO),
            ],
        },
        Proposal {
            number: 2,
            protocol: proto,
            spi: vec![0xc0, 0xff, 0xee, 0x02],
            transforms: vec![
                Transform {
                    transform_type: transform_type::ENCR,
                    id: encr::CHACHA20_POLY1305,
                    attributes: vec![Attribute::Tlv {
                        attr_type: 0x1234,
                        value: vec![1, 2, 3],
                    }],
                },
                t(transform_type::DH, dh::ECP_256),
            ],
        },
    ]
}

fn notify(nt: NotifyType, data: &[u8]) -> Payload {
    Payload::Notify(Notify {
        protocol: 0,
        spi: Vec::new(),
        notify_type: nt,
        data: data.to_vec(),
    })
}

fn selectors() -> Vec<TrafficSelector> {
    vec![
        TrafficSelector::Ipv4 {
            ip_protocol: 0,
            start_port: 0,
            end_port: 65535,
            start: [10, 1, 0, 0].into(),
            end: [10, 1, 255, 255].into(),
        },
        TrafficSelector::Ipv6 {
            ip_protocol: 6,
            start_port: 443,
            end_port: 443,
            start: "2001:db8:1::".parse().unwrap(),
            end: "2001:db8:1::ffff".parse().unwrap(),
        },
        TrafficSelector::Other {
            ts_type: 9,
            ip_protocol: 17,
            body: vec![0, 0, 0, 0],
        },
    ]
}

fn msg(h: Header, payloads: Vec<Payload>) -> Vec<u8> {
    let m = Message {
        header: h,
        payloads,
    };
    let b = m.emit().expect("seed message emits");
    assert_eq!(Message::parse(&b).expect("seed message parses"), m);
    b
}

fn chain(payloads: Vec<Payload>) -> Vec<u8> {
    let mut out = Vec::new();
    let first = emit_payload_chain(&payloads, &mut out).expect("seed chain emits");
    [&[u8::from(first)][..], &out].concat()
}

/// Every seed as (name, bytes).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let nonce = (0..32).collect::<Vec<u8>>();
    let ke = vec![0x5a; 32];
    let sk = Payload::Sk {
        first_payload: espgate_ike::wire::PayloadType::IdI,
        data: vec![0xaa; 64],
    };
    vec![
        (
            "sa-init-request",
            msg(
                header(ExchangeType::IkeSaInit, false, 0),
                vec![
                    Payload::Sa(ike_proposals()),
                    Payload::Ke {
                        group: dh::CURVE25519,
                        data: ke.clone(),
                    },
                    Payload::Nonce(nonce.clone()),
                    notify(NotifyType::NatDetectionSourceIp, &[1; 20]),
                    notify(NotifyType::NatDetectionDestinationIp, &[2; 20]),
                    notify(NotifyType::Ikev2FragmentationSupported, &[]),
                    notify(NotifyType::SignatureHashAlgorithms, &[0, 2, 0, 3, 0, 4]),
                    Payload::VendorId(b"espgate".to_vec()),
                ],
            ),
        ),
        (
            "sa-init-cookie",
            msg(
                header(ExchangeType::IkeSaInit, true, 0),
                vec![notify(NotifyType::Cookie, &[7; 16])],
            ),
        ),
        (
            "sa-init-response-certreq",
            msg(
                header(ExchangeType::IkeSaInit, true, 0),
                vec![
                    Payload::Sa(ike_proposals()[..1].to_vec()),
                    Payload::Ke {
                        group: dh::CURVE25519,
                        data: ke,
                    },
                    Payload::Nonce(nonce),
                    Payload::CertReq {
                        encoding: cert_encoding::X509_SIGNATURE,
                        data: vec![3; 20],
                    },
                ],
            ),
        ),
        (
            "auth-sk",
            msg(header(ExchangeType::IkeAuth, false, 1), vec![sk.clone()]),
        ),
        (
            "auth-skf",
            msg(
                header(ExchangeType::IkeAuth, false, 1),
                vec![Payload::Skf {
                    first_payload: espgate_ike::wire::PayloadType::IdI,
                    number: 1,
                    total: 2,
                    data: vec![0xbb; 48],
                }],
            ),
        ),
        (
            "informational-sk",
            msg(header(ExchangeType::Informational, true, 9), vec![sk]),
        ),
        (
            "unknown-critical",
            msg(
                header(ExchangeType::CreateChildSa, false, 2),
                vec![Payload::Unknown {
                    payload_type: espgate_ike::wire::PayloadType::Unknown(200),
                    critical: true,
                    body: vec![1, 2, 3, 4],
                }],
            ),
        ),
        (
            "sk-auth-request",
            chain(vec![
                Payload::IdI(Id {
                    id_type: id_type::FQDN,
                    data: b"moon.example".to_vec(),
                }),
                Payload::Cert {
                    encoding: cert_encoding::X509_SIGNATURE,
                    data: vec![0x30, 0x82, 0, 4, 1, 2, 3, 4],
                },
                Payload::CertReq {
                    encoding: cert_encoding::X509_SIGNATURE,
                    data: vec![9; 20],
                },
                notify(NotifyType::InitialContact, &[]),
                Payload::IdR(Id {
                    id_type: id_type::IPV4_ADDR,
                    data: vec![192, 0, 2, 1],
                }),
                Payload::Auth {
                    method: auth_method::DIGITAL_SIGNATURE,
                    data: vec![0x0c; 40],
                },
                Payload::Sa(child_proposals(protocol::ESP)),
                Payload::TsI(selectors()),
                Payload::TsR(selectors()[..2].to_vec()),
                notify(NotifyType::UseTransportMode, &[]),
            ]),
        ),
        (
            "sk-create-child-rekey",
            chain(vec![
                Payload::Notify(Notify {
                    protocol: protocol::ESP,
                    spi: vec![0xc0, 0xff, 0xee, 0x01],
                    notify_type: NotifyType::RekeySa,
                    data: Vec::new(),
                }),
                Payload::Sa(child_proposals(protocol::QESP)),
                Payload::Nonce(vec![4; 32]),
                Payload::Ke {
                    group: dh::ECP_256,
                    data: vec![5; 64],
                },
                Payload::TsI(selectors()[1..2].to_vec()),
                Payload::TsR(selectors()[..1].to_vec()),
            ]),
        ),
        (
            "sk-delete",
            chain(vec![
                Payload::Delete(Delete::Child {
                    protocol: protocol::ESP,
                    spis: vec![0xc0ff_ee01, 0xc0ff_ee02],
                }),
                Payload::Delete(Delete::Ike),
                notify(NotifyType::Unknown(40000), &[1]),
                notify(NotifyType::TsUnacceptable, &[]),
            ]),
        ),
        (
            "sk-auth-psk",
            chain(vec![
                Payload::IdI(Id {
                    id_type: id_type::IPV6_ADDR,
                    data: vec![0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                }),
                Payload::Auth {
                    method: auth_method::SHARED_KEY_MIC,
                    data: vec![0x11; 32],
                },
                Payload::Sa(vec![Proposal {
                    number: 1,
                    protocol: protocol::AH,
                    spi: vec![0, 0, 0x10, 0x01],
                    transforms: vec![
                        t(transform_type::INTEG, integ::HMAC_SHA1_96),
                        Transform {
                            transform_type: transform_type::ENCR,
                            id: encr::AES_CBC,
                            attributes: vec![
                                Attribute::Tv {
                                    attr_type: attribute::KEY_LENGTH,
                                    value: 192,
                                },
                                Attribute::Tv {
                                    attr_type: 15,
                                    value: 1,
                                },
                            ],
                        },
                    ],
                }]),
                Payload::TsI(vec![TrafficSelector::Ipv4 {
                    ip_protocol: 17,
                    start_port: 500,
                    end_port: 4500,
                    start: [192, 0, 2, 1].into(),
                    end: [192, 0, 2, 1].into(),
                }]),
                Payload::TsR(vec![TrafficSelector::Other {
                    ts_type: ts_type::IPV6_ADDR_RANGE + 2,
                    ip_protocol: 0,
                    body: Vec::new(),
                }]),
            ]),
        ),
    ]
}
