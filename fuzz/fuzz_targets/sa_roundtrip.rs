//! Outbound then inbound on a pair of SAs with the same fuzz-chosen config
//! (suite, ESP/AH, tunnel/transport, UDP encapsulation and ports, ESN,
//! initial sequence number, replay window, TFC padding, DSCP copying,
//! address families) over 1–4 fuzz-chosen packets.
//!
//! Asserts, per packet:
//! - a twin SA on the general outbound path (a probe that wants marks)
//!   returns the same result, bytes (lengths with CBC's random IVs) and
//!   counters as the unprobed path; the twin and the receiver run AES-GCM
//!   in the other library (aws-lc or ring, `GcmImpl`) than the sender;
//! - a well-formed (synthetic UDP) packet is always accepted outbound, except
//!   for TooBig / SeqExhausted;
//! - the protected packet parses, its IP length is its real length, it is no
//!   longer than `inner + Sa::overhead()` (+ TFC padding), it carries the
//!   SA's protocol and SPI and classifies as IPsec;
//! - inbound returns exactly the inner packet (tunnel) or the original packet
//!   with its IPv4 header checksum recomputed (transport);
//! - replaying it is refused with `Replay` (or, with window 0, accepted
//!   again with the same result); the replay top and the outbound sequence
//!   counter advance by one; the inbound packet counter counts successes.
//!
//! Input layout (all big-endian, zeros when the input runs out):
//! `suite | flags | tos | key seed | initial seq (8) | tfc (2) | window (2) |
//!  sport (2) | dport (2) | packet count | packet bytes…`
#![no_main]

use espgate_core::cost::{Probe, Stage};
use espgate_core::crypto::{Enc, GcmImpl, Suite, SuiteError};
use espgate_core::sa::{self, Classified, Decapsulated, Encap, Mode, Protocol, SaError};
use espgate_core::wire::{ip, proto};
use espgate_core::{DropReason, PacketBuf, Sa, SaConfig};
use espgate_fuzz::{fix_v4_checksum, inner_packet, key, transport_nh, Cursor, AH_SUITES};
use libfuzzer_sys::fuzz_target;
use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::Duration;

const T0: Duration = Duration::ZERO;

fn esp_suites() -> &'static [Suite] {
    static S: OnceLock<Vec<Suite>> = OnceLock::new();
    S.get_or_init(Suite::all)
}

fn ah_suites() -> &'static [Suite] {
    static S: OnceLock<Vec<Suite>> = OnceLock::new();
    S.get_or_init(|| AH_SUITES.iter().map(|s| s.parse().unwrap()).collect())
}

/// A probe that wants its marks (and drops them).
struct Active;

impl Probe for Active {
    fn mark(&mut self, _: Stage) {}
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let suite_b = c.u8();
    let flags = c.u8();
    let tos = c.u8();
    let seed = c.u8();
    let seq0 = c.u64();
    let tfc = c.u16();
    let w = c.u16();
    let sport = c.u16();
    let dport = c.u16();
    let npk = usize::from(c.u8() % 4) + 1;
    let rest = c.rest();

    let ah = flags & 0x01 != 0;
    let transport = flags & 0x02 != 0;
    let udp = flags & 0x04 != 0 && !ah;
    let esn = flags & 0x08 != 0;
    let outer_v6 = flags & 0x10 != 0;
    let inner_v6 = flags & 0x20 != 0;
    let copy_dscp = flags & 0x40 != 0;
    let use_tfc = flags & 0x80 != 0;

    let suite = if ah {
        ah_suites()[usize::from(suite_b) % ah_suites().len()]
    } else {
        esp_suites()[usize::from(suite_b) % esp_suites().len()]
    };
    let window = if w & 0x8000 != 0 {
        u32::from(w & 0x7fff) * 2
    } else {
        u32::from(w % 130)
    };
    // Q-ESP (docs/QESP.md) for an odd seed, where its rules allow: raw IP,
    // encryption with integrity, a replay window.
    let qesp = !ah
        && !udp
        && seed & 1 == 1
        && !matches!(suite.enc, None | Some(Enc::Null | Enc::AesGmac(_)))
        && !suite.lacks_integrity()
        && window != 0;
    let protocol = if ah {
        Protocol::Ah
    } else if qesp {
        Protocol::Qesp
    } else {
        Protocol::Esp
    };
    let spi = 0x100 + u32::from(seed) * 0x1_0001;
    let mut cfg = SaConfig::new(
        spi,
        protocol,
        suite,
        &key(suite.enc_key_len(), seed),
        &key(suite.integ_key_len(), seed ^ 0x5a),
    );
    cfg.mode = if transport {
        Mode::Transport
    } else {
        Mode::Tunnel
    };
    // Custom ports when the high bit of the seed byte is set; inbound
    // classification uses the destination port as the NAT-T port.
    let (sport, dport) = if seed & 0x80 != 0 {
        (sport, dport)
    } else {
        (4500, 4500)
    };
    if udp {
        cfg.encap = Encap::Udp {
            src_port: sport,
            dst_port: dport,
        };
    }
    let (tsrc, tdst): (IpAddr, IpAddr) = if outer_v6 {
        (
            "2001:db8:ff::1".parse().unwrap(),
            "2001:db8:ff::2".parse().unwrap(),
        )
    } else {
        ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap())
    };
    cfg.tunnel_src = Some(tsrc);
    cfg.tunnel_dst = Some(tdst);
    cfg.esn = esn;
    cfg.initial_seq = if esn {
        seq0.max(1)
    } else {
        1 + seq0 % u64::from(u32::MAX)
    };
    cfg.replay_window = window;
    cfg.tfc_pad_to = use_tfc.then_some(tfc);
    cfg.copy_dscp = copy_dscp;
    cfg.allow_insecure = true;

    // AES-GCM runs in aws-lc or in ring (GcmImpl): the sender uses this
    // process's library, the receiver and the general-path twin the
    // other one, so both paths are also held to the other library's
    // bytes.
    let other = match cfg.gcm {
        GcmImpl::AwsLc => GcmImpl::Ring,
        GcmImpl::Ring => GcmImpl::AwsLc,
    };
    let mk = |gcm| {
        let mut c = cfg.clone();
        c.gcm = gcm;
        match Sa::new(c, T0) {
            Ok(sa) => Some(sa),
            // Derived keys can be weak DES keys; anything else is a valid config.
            Err(SaError::Suite(SuiteError::BadKey(_))) => None,
            Err(e) => panic!("valid config refused: {e} ({cfg:?})"),
        }
    };
    let (Some(mut out), Some(mut inn), Some(mut general)) = (mk(cfg.gcm), mk(other), mk(other))
    else {
        return;
    };

    // CBC draws a random IV per packet: its twin's bytes differ, so for
    // it the two paths are compared by length only.
    let random_iv = matches!(suite.enc, Some(Enc::AesCbc(_) | Enc::TripleDes | Enc::Des));
    let chunk = rest.len() / npk;
    let mut decapsulated = 0u64;
    for i in 0..npk {
        let bytes = if i + 1 == npk {
            &rest[i * chunk..]
        } else {
            &rest[i * chunk..(i + 1) * chunk]
        };
        let nets = (i as u8).wrapping_mul(0x55) ^ seed;
        let (inner, synthetic) = inner_packet(bytes, inner_v6, tos, nets);
        let inner_info = ip::parse(&inner).expect("inner packet parses");

        let seq = out.next_seq();
        let mut b = PacketBuf::from_packet(&inner);
        let r = out.encapsulate(&mut b, T0);
        // The twin SA on the general path (a probe that wants marks
        // keeps it there): the same result and bytes as the unprobed
        // path, which is one function for the usual tunnel SA.
        let mut g = PacketBuf::from_packet(&inner);
        let rg = general.encapsulate_probed(&mut g, T0, &mut Active);
        assert_eq!(r, rg, "unprobed and general paths disagree ({cfg:?})");
        if r.is_ok() && random_iv {
            assert_eq!(b.len(), g.len(), "unprobed and general lengths ({cfg:?})");
        } else if r.is_ok() {
            assert_eq!(
                b.as_slice(),
                g.as_slice(),
                "unprobed and general bytes ({cfg:?})"
            );
        }
        if let Err(e) = r {
            if synthetic {
                assert!(
                    matches!(e, DropReason::TooBig | DropReason::SeqExhausted),
                    "well-formed {}-byte packet refused outbound: {e} ({cfg:?})",
                    inner.len()
                );
            }
            continue;
        }
        assert_eq!(out.next_seq(), seq.wrapping_add(1), "sequence counter");
        let wire = b.as_slice().to_vec();

        // The protected packet.
        let info = ip::parse(&wire).expect("protected packet parses");
        assert_eq!(info.packet_len, wire.len());
        let tfc_extra = match (protocol, cfg.mode, cfg.tfc_pad_to) {
            (Protocol::Esp | Protocol::Qesp, Mode::Tunnel, Some(t)) => {
                usize::from(t).saturating_sub(inner.len())
            }
            _ => 0,
        };
        assert!(
            wire.len() <= inner.len() + out.overhead() + tfc_extra,
            "{} > {} + overhead {} + tfc {}",
            wire.len(),
            inner.len(),
            out.overhead(),
            tfc_extra
        );
        match cfg.mode {
            Mode::Tunnel => assert_eq!((info.src, info.dst), (tsrc, tdst)),
            Mode::Transport => {
                assert_eq!(
                    (info.version, info.src, info.dst),
                    (inner_info.version, inner_info.src, inner_info.dst)
                );
            }
        }
        let want_proto = match (protocol, udp) {
            (Protocol::Ah, _) => proto::AH,
            (Protocol::Esp, true) => proto::UDP,
            (Protocol::Esp, false) => proto::ESP,
            (Protocol::Qesp, _) => 253,
        };
        assert_eq!(info.protocol, want_proto);
        let classifier = sa::Classifier::new().udp_port(dport).qesp(253);
        let inb = match sa::classify(&wire, &classifier) {
            Ok(Classified::Ipsec(inb)) => inb,
            other => panic!("protected packet classified as {other:?}"),
        };
        assert_eq!((inb.spi, inb.protocol), (spi, protocol));
        assert_eq!(inb.udp_offset.is_some(), udp);

        // Inbound.
        let mut expected = inner.clone();
        if transport {
            fix_v4_checksum(&mut expected);
        }
        let mut rb = PacketBuf::from_packet(&wire);
        let r = inn.decapsulate(&mut rb, &inb, T0);
        if transport && protocol.is_esp_like() && transport_nh(&inner) == Some(proto::NO_NEXT) {
            // Next header 59 marks an RFC 4303 §2.6 dummy packet: a transport-
            // mode packet whose own next header is 59 is discarded inbound.
            assert_eq!(r, Ok(Decapsulated::Dummy));
            assert_eq!(inn.replay_top(), seq);
            continue;
        }
        assert_eq!(
            r,
            Ok(Decapsulated::Packet),
            "inbound refused seq {seq} ({cfg:?})"
        );
        assert!(
            rb.as_slice() == &expected[..],
            "inbound result differs from the original"
        );
        decapsulated += 1;
        assert_eq!(inn.replay_top(), seq);
        assert_eq!(inn.stats().packets, decapsulated);
        assert_eq!(out.stats(), general.stats(), "outbound counters ({cfg:?})");

        // Replay.
        let mut rb2 = PacketBuf::from_packet(&wire);
        let r2 = inn.decapsulate(&mut rb2, &inb, T0);
        if cfg.replay_window == 0 {
            assert_eq!(r2, Ok(Decapsulated::Packet));
            assert!(rb2.as_slice() == &expected[..]);
            decapsulated += 1;
        } else {
            assert_eq!(r2, Err(DropReason::Replay), "replayed packet accepted");
        }
    }
});
