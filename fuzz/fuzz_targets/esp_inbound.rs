//! `Sad::decapsulate` on a SAD holding inbound SAs for several suites,
//! modes and encapsulations (see `espgate_fuzz::sa_ix`), built fresh for
//! every input so replay state never leaks between runs.
//!
//! Byte 0 picks the mode (its low two bits) and the cluster gate (the next
//! two, see below):
//! - 0 `raw`: the rest is the packet.
//! - 1 `mutated`: a valid packet (a fuzz-chosen inner packet protected by a
//!   fuzz-chosen SA stack, see `espgate_fuzz::stacks`), then byte flips,
//!   truncations and insertions.
//! - 2 `valid`: the same packet unmodified; bits 4-5 of its flags byte
//!   give the SAs lifetime limits (none; hard after one packet; soft after
//!   one packet; soft and hard by time).
//! - 3 `crafted`: an ESP packet whose *plaintext* is fuzz-chosen (padding,
//!   next header, inner packet), sealed with the SA's real keys, or an AH
//!   packet with a fuzz-chosen next header and payload and a correct ICV;
//!   with flags bit 5 a Q-ESP packet (bit 4: its clear header lies about
//!   the inner packet's ports).
//!   This reaches everything behind the ICV check.
//!
//! Gate (`(byte 0 >> 2) & 3`), asked by `Sad::decapsulate_gated` for the
//! outermost layer of the same packet on a fresh SAD, as on a cluster
//! node: 0 none; 1 `Observe`; 2 `ObserveDrop`; 3 `Process`.
//!
//! Asserts:
//! - every mode: an accepted packet has 1..=MAX_LAYERS SAs; a tunnel-mode
//!   result is one whole IP packet; a transport-mode result has IP length
//!   fields equal to its length; IKE / keepalive verdicts agree with
//!   `sa::classify`.
//! - valid: the exact SA list and the exact inner packet (tunnel) or the
//!   original packet (transport, IPv4 checksum recomputed), or
//!   SelectorMismatch when the 3DES SA's selectors do not cover the inner
//!   packet; replaying is refused with Replay (window 0: accepted again).
//!   With lifetime limits: the soft and hard events are raised once each,
//!   and a hard-expired SA refuses the packet again with SaExpired.
//! - every mode: each SA that passed a packet counts it, the SA that
//!   dropped one counts the drop (what `espgate status` shows).
//! - mutated: if the same SAs accept it, the authenticated part of the
//!   result equals the original (tunnel: the inner packet up to ECN bits;
//!   transport: everything after the IP header).
//! - crafted: the result (packet bytes, Dummy, or drop reason) equals a
//!   reference model of RFC 4303 §3.4 / RFC 4302 §3.4 / RFC 6040 written
//!   here independently of the core.
//! - gates: the gate is asked once, with the outermost SA, the sequence
//!   number on the wire and the packet's length. `Process` gives exactly
//!   what `Sad::decapsulate` gives. `Observe` (and `ObserveDrop`, which
//!   then drops with the gate's reason) succeeds whenever processing does;
//!   when it fails, processing fails the same way on the same SA; when it
//!   succeeds, processing never fails that SA's replay or ICV check; and
//!   the observed packet is afterwards a replay (or, with window 0, is
//!   processed as on a fresh SAD).
//! - every mode: `Sad::decapsulate_from_probed` of the packet loaded as the
//!   daemon loads a datagram (the head only, the rest decrypted from the
//!   bytes received), split at its start and halfway, gives exactly what
//!   `Sad::decapsulate` gives: outcome, SAs and bytes.
#![no_main]

use espgate_core::cost::NoProbe;
use espgate_core::crypto::{AuthCtx, Enc, Mac, Transform};
use espgate_core::sa::{self, Classified, Mode, Protocol};
use espgate_core::sa::{Lifetime, SaEvent};
use espgate_core::sad::{
    InGate, InboundError, InboundOutcome, InboundResult, SaId, Sad, MAX_LAYERS,
};
use espgate_core::wire::{ah, esp, flow, ip, proto, qesp, udp};
use espgate_core::{DropReason, PacketBuf, Sa, SaConfig};
use espgate_fuzz::{
    addr, clear_ecn, fix_v4_checksum, inbound_configs, inner_packet, ip_packet, outbound_seq,
    sa_ix, stacks, transport_keep, transport_nh, Cursor,
};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

const T0: Duration = Duration::ZERO;
const NAT_T: u16 = 4500;
/// The classifier, built once at run time as the daemon builds it: raw
/// ESP and AH, ESP-in-UDP on port 4500, raw Q-ESP on protocol 253.
static CLASSIFIER: std::sync::LazyLock<sa::Classifier> = std::sync::LazyLock::new(|| {
    sa::Classifier::default()
        .udp_port(NAT_T)
        .qesp(qesp::DEFAULT_IP_PROTOCOL)
});

type Res = Result<InboundResult, InboundError>;

fn build_sad() -> (Sad, Vec<SaId>) {
    build_sad_with(Lifetime::default())
}

/// Every fixture SA, with lifetime limits `life`.
fn build_sad_with(life: Lifetime) -> (Sad, Vec<SaId>) {
    let mut sad = Sad::new();
    let ids = inbound_configs()
        .iter()
        .map(|c| {
            let mut c = c.clone();
            c.lifetime = life;
            sad.insert(Sa::new(c, T0).expect("fixture SA"))
                .expect("unique SPI")
        })
        .collect();
    (sad, ids)
}

/// When time-based limits expire in the `valid` mode's lifetime profile 3.
const LATER: Duration = Duration::from_secs(60);

/// The lifetime profiles of the `valid` mode (flags bits 4-5): none; hard
/// after one packet; soft after one packet; soft and hard by time.
fn lifetime(profile: u8) -> Lifetime {
    match profile {
        1 => Lifetime {
            hard_packets: Some(1),
            ..Lifetime::default()
        },
        2 => Lifetime {
            soft_packets: Some(1),
            hard_bytes: Some(1 << 40),
            ..Lifetime::default()
        },
        3 => Lifetime {
            soft_time: Some(LATER / 2),
            hard_time: Some(LATER),
            ..Lifetime::default()
        },
        _ => Lifetime::default(),
    }
}

/// After `applied` accepted one packet under lifetime profile `profile`:
/// the events RFC 4301 §4.4.2.1 asks for, raised once each (time limits by
/// the daemon's timer, `Sa::tick`); with a hard limit reached the same
/// packet again is refused as `SaExpired` by the outermost SA, before its
/// replay check. Returns false when the caller's replay check still
/// applies (soft limits only).
fn check_lifetime(sad: &mut Sad, applied: &[SaId], wire: &[u8], profile: u8) -> bool {
    for &id in applied {
        let sa = sad.get_mut(id).unwrap();
        match profile {
            1 => {
                assert_eq!(sa.poll_event(), Some(SaEvent::HardExpired));
                assert!(sa.lifetime().is_hard_expired());
            }
            2 => assert_eq!(sa.poll_event(), Some(SaEvent::SoftExpired)),
            _ => {
                assert_eq!(sa.poll_event(), None, "a time limit fired early");
                sa.tick(LATER / 2);
                assert_eq!(sa.poll_event(), Some(SaEvent::SoftExpired));
                sa.tick(LATER);
                assert_eq!(sa.poll_event(), Some(SaEvent::HardExpired));
            }
        }
        assert_eq!(sa.poll_event(), None, "an event raised twice");
    }
    if profile == 2 {
        return false;
    }
    let (r, _) = decap(sad, wire);
    assert_eq!(
        r.map_err(|e| (e.reason, e.sa)),
        Err((DropReason::SaExpired, Some(applied[0]))),
        "a hard-expired SA accepted a packet"
    );
    true
}

fn decap(sad: &mut Sad, pkt: &[u8]) -> (Res, Vec<u8>) {
    let mut b = PacketBuf::from_packet(pkt);
    let r = sad.decapsulate(&mut b, &CLASSIFIER, T0);
    (r, b.as_slice().to_vec())
}

/// Checks that hold for any input.
fn generic(sad: &Sad, input: &[u8], r: &Res, out: &[u8]) {
    match r {
        Ok(InboundResult::Packet(ids)) => {
            assert!(!ids.is_empty() && ids.len() <= MAX_LAYERS, "{ids:?}");
            let last = sad.get(*ids.last().unwrap()).expect("applied SA exists");
            match last.config().mode {
                Mode::Tunnel => {
                    let info = ip::parse(out).expect("tunnel result is an IP packet");
                    assert_eq!(
                        info.packet_len,
                        out.len(),
                        "tunnel result has trailing bytes"
                    );
                }
                Mode::Transport => match out.first().map(|b| b >> 4) {
                    Some(4) => {
                        assert!(out.len() >= 20);
                        assert_eq!(usize::from(u16::from_be_bytes([out[2], out[3]])), out.len());
                        assert!(usize::from(out[0] & 0xf) * 4 <= out.len());
                    }
                    Some(6) => {
                        assert!(out.len() >= 40);
                        assert_eq!(
                            usize::from(u16::from_be_bytes([out[4], out[5]])) + 40,
                            out.len()
                        );
                    }
                    v => panic!("transport result has IP version {v:?}"),
                },
            }
        }
        Ok(InboundResult::Dummy(_)) => {}
        Ok(InboundResult::Ike) => {
            assert_eq!(sa::classify(input, &CLASSIFIER), Ok(Classified::Ike))
        }
        Ok(InboundResult::Keepalive) => {
            assert_eq!(sa::classify(input, &CLASSIFIER), Ok(Classified::Keepalive))
        }
        Err(e) => {
            // An unknown SPI is reported without an SA.
            if e.reason == DropReason::UnknownSpi {
                assert!(e.spi.is_some() && e.sa.is_none(), "{e:?}");
            }
        }
    }
    // What `espgate status` shows: a packet counted by each SA that
    // passed it on, a drop by the SA that refused it.
    match r {
        Ok(InboundResult::Packet(ids)) => {
            for id in ids {
                assert!(
                    sad.get(*id).unwrap().stats().packets >= 1,
                    "{id:?} did not count"
                );
            }
        }
        // An SA's own refusal (a failure to classify what a transport-mode
        // layer left names that SA too, without an SPI: not its drop).
        Err(InboundError {
            reason,
            sa: Some(id),
            spi: Some(_),
        }) => {
            let st = sad.get(*id).unwrap().stats();
            assert!(
                st.drops_for(*reason) >= 1,
                "{id:?} did not count {reason:?}"
            );
        }
        _ => {}
    }
}

/// What the reference model says `Sad::decapsulate` must return.
#[derive(Debug, PartialEq)]
enum Expect {
    Packet(Vec<SaId>, Vec<u8>),
    Dummy(SaId),
    Err(DropReason),
    /// The model does not predict (e.g. the result is itself IPsec again).
    Unknown,
}

/// After the last transport-mode layer, the SAD classifies the result again:
/// more IPsec is processed; a packet that does not parse as IP, or raw
/// ESP/AH/Q-ESP (an IP protocol the classifier maps to IPsec) that cannot
/// be classified, is dropped; any other well-formed packet (including UDP
/// on the NAT-T port that is not ESP) is the payload.
fn after_transport(ids: Vec<SaId>, out: Vec<u8>) -> Expect {
    match sa::classify(&out, &CLASSIFIER) {
        Ok(Classified::Ipsec(_)) => Expect::Unknown,
        Ok(_) | Err(DropReason::NotIpsec) => Expect::Packet(ids, out),
        Err(d) => match espgate_core::wire::ip::parse(&out) {
            Ok(i) if CLASSIFIER.ip_protocol(i.protocol).is_none() => Expect::Packet(ids, out),
            _ => Expect::Err(d),
        },
    }
}

/// RFC 4303 §2.4 trailer: `(payload_len, next_header)` or the drop.
fn ref_trailer(p: &[u8]) -> Result<(usize, u8), DropReason> {
    let n = p.len();
    if n < 2 {
        return Err(DropReason::BadLength);
    }
    let pad = usize::from(p[n - 2]);
    if pad + 2 > n {
        return Err(DropReason::BadPadding);
    }
    let plen = n - 2 - pad;
    for (i, b) in p[plen..n - 2].iter().enumerate() {
        if usize::from(*b) != i + 1 {
            return Err(DropReason::BadPadding);
        }
    }
    Ok((plen, p[n - 1]))
}

/// Tunnel-mode inner packet checks and RFC 6040 ECN merge.
fn ref_tunnel(
    cfg: &SaConfig,
    payload: &[u8],
    nh: u8,
    outer_tos: u8,
) -> Result<Vec<u8>, DropReason> {
    let want = match nh {
        proto::IPV4 => 4,
        proto::IPV6 => 6,
        _ => return Err(DropReason::BadNextHeader),
    };
    let info = ip::parse(payload).map_err(|_| DropReason::BadNextHeader)?;
    if info.version != want {
        return Err(DropReason::BadNextHeader);
    }
    let mut inner = payload[..info.packet_len].to_vec();
    let (outer_ecn, inner_ecn) = (outer_tos & 3, info.tos & 3);
    if outer_ecn == 3 && inner_ecn != 3 {
        if inner_ecn == 0 {
            return Err(DropReason::EcnDrop);
        }
        if want == 4 {
            inner[1] |= 3;
            fix_v4_checksum(&mut inner);
        } else {
            inner[1] |= 0x30;
        }
    }
    ref_selectors(cfg, &inner)?;
    Ok(inner)
}

fn ref_selectors(cfg: &SaConfig, pkt: &[u8]) -> Result<(), DropReason> {
    if cfg.selectors.is_empty() {
        return Ok(());
    }
    let f = flow::of_packet(pkt)?;
    if cfg.selectors.iter().any(|s| s.matches_inbound(&f)) {
        Ok(())
    } else {
        Err(DropReason::SelectorMismatch)
    }
}

/// Q-ESP's clear fields of an IP packet (docs/QESP.md §3): the transport
/// protocol after any IPv6 extension headers, and the ports when that
/// protocol has them (TCP, UDP, DCCP, SCTP, UDP-Lite) and the packet holds
/// the start of its header; else zero ports.
fn ref_clear(pkt: &[u8]) -> Option<(u16, u16, u8)> {
    let info = ip::parse(pkt).ok()?;
    let l4 = pkt.get(info.payload_offset..info.packet_len).unwrap_or(&[]);
    let ports = [proto::TCP, proto::UDP, 33, 132, 136].contains(&info.protocol)
        && !info.later_fragment
        && l4.len() >= 4;
    Some(if ports {
        (
            u16::from_be_bytes([l4[0], l4[1]]),
            u16::from_be_bytes([l4[2], l4[3]]),
            info.protocol,
        )
    } else {
        (0, 0, info.protocol)
    })
}

/// Transport mode: the kept IP header, next header restored, lengths fixed.
fn ref_transport(hdr: &[u8], payload: &[u8], nh_field: usize, nh: u8) -> Vec<u8> {
    let mut out = [hdr, payload].concat();
    out[nh_field] = nh;
    let len = out.len();
    if out[0] >> 4 == 4 {
        out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        fix_v4_checksum(&mut out);
    } else {
        out[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
    }
    out
}

/// `ESPGATE_FUZZ_VERBOSE=1` prints the model's and the core's verdicts
/// (for checking what the seeds reach, or reading a reproducer).
fn verbose() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var_os("ESPGATE_FUZZ_VERBOSE").is_some())
}

fn check_expect(what: &str, e: &Expect, r: &Res, out: &[u8], input: &[u8]) {
    if verbose() {
        let short = |e: &Expect| match e {
            Expect::Packet(ids, p) => format!("Packet({ids:?}, {} bytes)", p.len()),
            other => format!("{other:?}"),
        };
        eprintln!("{what}: model {} / core {r:?}", short(e));
    }
    let ok = match (e, r) {
        (Expect::Unknown, _) => true,
        (Expect::Packet(ids, want), Ok(InboundResult::Packet(got))) => ids == got && want == out,
        (Expect::Dummy(id), Ok(InboundResult::Dummy(got))) => id == got,
        (Expect::Err(d), Err(got)) => *d == got.reason,
        _ => false,
    };
    if !ok {
        let show = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        panic!(
            "{what}: model says {e:?}\n core says {r:?}\n core output {}\n input {}",
            show(out),
            show(input)
        );
    }
}

/// True when an outcome with the SAs `applied` and the buffer `out` is
/// what `Sad::decapsulate` gave (`reference`, `ref_out`).
fn same_outcome(
    r: &Result<InboundOutcome, InboundError>,
    applied: &[SaId],
    out: &[u8],
    reference: &Res,
    ref_out: &[u8],
) -> bool {
    match (r, reference) {
        (Ok(InboundOutcome::Packet), Ok(InboundResult::Packet(want))) => {
            applied == want && out == ref_out
        }
        (Ok(InboundOutcome::Dummy(a)), Ok(InboundResult::Dummy(w))) => a == w,
        (Ok(InboundOutcome::Ike), Ok(InboundResult::Ike))
        | (Ok(InboundOutcome::Keepalive), Ok(InboundResult::Keepalive)) => true,
        (Err(a), Err(w)) => a == w,
        _ => false,
    }
}

/// The same packet through `Sad::decapsulate_from_probed` on a fresh
/// SAD whose SAs have the lifetime limits `life` (as the reference's), loaded as the daemon loads a datagram: the bytes before `k`
/// (the outer header it adds) copied in, the rest with
/// `PacketBuf::load_head` into a buffer of stale bytes, for `k` at the
/// start and halfway. The outcome, the SAs and the bytes are what
/// `Sad::decapsulate` gave; no stale byte reaches the result.
fn lazily(pkt: &[u8], reference: &Res, ref_out: &[u8], life: Lifetime) {
    for k in [0, pkt.len() / 2] {
        let (mut sad, _) = build_sad_with(life);
        let mut b = PacketBuf::from_packet(&vec![0xa5; pkt.len() + 64]);
        b.load_head(&pkt[k..]);
        b.push_front(k)[..k].copy_from_slice(&pkt[..k]);
        let mut applied = vec![SaId(u32::MAX)];
        let r = sad.decapsulate_from_probed(
            &mut b,
            &pkt[k..],
            &CLASSIFIER,
            T0,
            &mut applied,
            &mut NoProbe,
        );
        let same = same_outcome(&r, &applied, b.as_slice(), reference, ref_out);
        assert!(same, "split at {k}: {r:?} / decapsulate {reference:?}");
    }
}

/// Whether processing `pkt` on a fresh SAD passed its outermost layer (SA
/// `id`) before failing deeper down. A fuzz-chosen inner packet may carry
/// another layer of the same SA (AH behind an IPv6 extension header, with
/// a sequence number already seen), which processing refuses as a replay;
/// an observing node looks at the outermost layer only and accepts it, as
/// processing did, so both leave that SA's window alike.
fn outer_layer_passed(pkt: &[u8], id: SaId, life: Lifetime) -> bool {
    let (mut sad, _) = build_sad_with(life);
    let mut b = PacketBuf::from_packet(pkt);
    let mut applied = Vec::new();
    let _ = sad.decapsulate_into(&mut b, &CLASSIFIER, T0, &mut applied);
    applied.first() == Some(&id)
}

/// The same packet through `Sad::decapsulate_gated` on a fresh SAD (SAs
/// with the lifetime limits `life`, as the reference's), the
/// gate answering as `gate` says; `reference` and `ref_out` are what
/// `Sad::decapsulate` gave on another fresh SAD.
fn gated(pkt: &[u8], reference: &Res, ref_out: &[u8], gate: u8, life: Lifetime) {
    if gate == 0 {
        return;
    }
    let why = DropReason::ClusterOutOfStep;
    let answer = match gate {
        1 => InGate::Observe,
        2 => InGate::ObserveDrop(why),
        _ => InGate::Process,
    };
    let (mut sad, ids) = build_sad_with(life);
    let mut b = PacketBuf::from_packet(pkt);
    // Left over from an earlier packet: must be cleared.
    let mut applied = vec![SaId(u32::MAX); 2];
    let mut asked = Vec::new();
    let r = sad.decapsulate_gated(
        &mut b,
        &CLASSIFIER,
        T0,
        &mut applied,
        &mut NoProbe,
        &mut |id, seq, len| {
            asked.push((id, seq, len));
            answer
        },
    );
    assert!(asked.len() <= 1, "gate asked more than once: {asked:?}");
    if let Some(&(_, seq, len)) = asked.first() {
        assert_eq!(len, pkt.len());
        let Ok(Classified::Ipsec(inb)) = sa::classify(pkt, &CLASSIFIER) else {
            panic!("gate asked for a packet that is not IPsec");
        };
        assert_eq!(Some(seq), inb.wire_seq(pkt));
    }
    let outer = asked.first().map(|a| a.0);
    if gate == 3 {
        let same = same_outcome(&r, &applied, b.as_slice(), reference, ref_out);
        assert!(same, "gated Process {r:?} / decapsulate {reference:?}");
        return;
    }
    match (&r, reference) {
        (Ok(InboundOutcome::Ike), Ok(InboundResult::Ike))
        | (Ok(InboundOutcome::Keepalive), Ok(InboundResult::Keepalive)) => {
            assert!(outer.is_none());
            return;
        }
        (_, Ok(InboundResult::Ike | InboundResult::Keepalive)) => {
            panic!("gated {r:?} for {reference:?}")
        }
        _ => {}
    }
    let observed = match (gate, &r) {
        (1, Ok(InboundOutcome::Observed(id))) => Some(*id),
        (2, Err(e)) if e.reason == why && e.sa == outer && outer.is_some() => e.sa,
        (_, Err(e)) => {
            // Observing failed: processing fails alike on the same SA.
            let Err(w) = reference else {
                panic!("observe failed ({e:?}), processing gave {reference:?}");
            };
            assert_eq!((w.reason, w.sa), (e.reason, e.sa), "observe / process");
            None
        }
        _ => panic!("gate {gate}: {r:?} for {reference:?}"),
    };
    let Some(id) = observed else { return };
    assert_eq!(Some(id), outer);
    if let Err(w) = reference {
        if w.sa == Some(id) && !outer_layer_passed(pkt, id, life) {
            assert!(
                !matches!(w.reason, DropReason::Replay | DropReason::Integrity),
                "observed, but processing failed {w:?}"
            );
        }
    }
    // The observed packet is now a replay for that SA.
    let expired = sad
        .get_mut(id)
        .is_some_and(|sa| sa.lifetime().is_hard_expired());
    let (again, out) = decap(&mut sad, pkt);
    let i = ids.iter().position(|x| *x == id).unwrap();
    if expired {
        // Observing counted the packet against the SA's lifetime, as
        // processing does; a hard limit reached refuses it now, before
        // its replay check.
        assert_eq!(
            again.map_err(|e| (e.reason, e.sa)),
            Err((DropReason::SaExpired, Some(id))),
            "observed up to its hard limit, the SA accepted the packet again"
        );
    } else if inbound_configs()[i].replay_window == 0 {
        assert_eq!(again, *reference, "window 0: observing changed the result");
        if again.is_ok() {
            assert_eq!(out, ref_out);
        }
    } else {
        assert_eq!(
            again.map_err(|e| (e.reason, e.sa)),
            Err((DropReason::Replay, Some(id))),
            "an observed packet was not a replay"
        );
    }
}

/// The SAD's bookkeeping around one SA (`pick`): removed, it is unknown;
/// installed again it is found under its SPI (in the freed slot); a second
/// SA with the same protocol and SPI is refused.
fn sad_bookkeeping(sad: &mut Sad, ids: &[SaId], pick: usize) {
    let n = sad.len();
    assert!(!sad.is_empty() && n == ids.len() && sad.iter().count() == n);
    let id = ids[pick % ids.len()];
    let sa = sad.remove(id).expect("an installed SA");
    let (p, spi) = (sa.config().protocol, sa.config().spi);
    assert!(sad.lookup(p, spi).is_none() && sad.get(id).is_none());
    assert!(sad.remove(id).is_none(), "removed twice");
    assert_eq!(sad.len(), n - 1);
    let again = sad.insert(sa).expect("installed again");
    assert_eq!(
        (again, sad.lookup(p, spi)),
        (id, Some(id)),
        "slot not reused"
    );
    let twin = Sa::new(inbound_configs()[pick % ids.len()].clone(), T0).unwrap();
    assert!(sad.insert(twin).is_err(), "a duplicate SPI was installed");
    assert_eq!(sad.len(), n);
    assert!(sad
        .iter()
        .all(|(i, s)| sad.get(i).unwrap().config().spi == s.config().spi));
}

fn raw(data: &[u8], gate: u8) {
    let (mut sad, ids) = build_sad();
    sad_bookkeeping(&mut sad, &ids, data.len());
    let (r, out) = decap(&mut sad, data);
    generic(&sad, data, &r, &out);
    gated(data, &r, &out, gate, Lifetime::default());
    lazily(data, &r, &out, Lifetime::default());
}

fn stacked(c: &mut Cursor<'_>, mutate: bool, gate: u8) {
    let cfgs = inbound_configs();
    let stack = &stacks()[usize::from(c.u8()) % stacks().len()];
    let seqv = c.u32();
    let flags = c.u8();
    let tos = c.u8();
    let nets = c.u8();
    let muts: Vec<(u8, u16, u8)> = if mutate {
        let n = c.u8() % 8 + 1;
        (0..n).map(|_| (c.u8(), c.u16(), c.u8())).collect()
    } else {
        Vec::new()
    };
    let bytes = std::mem::replace(c, Cursor::new(&[])).rest();
    let (inner, _) = inner_packet(bytes, flags & 1 != 0, tos, nets);

    // Protect: stages[k] is the input of layer k, stages.last() the wire packet.
    let mut stages = vec![inner];
    let mut b = PacketBuf::from_packet(&stages[0]);
    for &i in stack {
        let mut oc = cfgs[i].clone();
        oc.initial_seq = outbound_seq(&oc, seqv);
        let mut sa = Sa::new(oc, T0).expect("outbound fixture SA");
        if sa.encapsulate(&mut b, T0).is_err() {
            return;
        }
        stages.push(b.as_slice().to_vec());
    }
    let wire = stages.last().unwrap().clone();
    let profile = if mutate { 0 } else { (flags >> 4) & 3 };
    let (mut sad, ids) = build_sad_with(lifetime(profile));

    // Model: outermost layer first, until a tunnel-mode layer. A transport-
    // mode ESP layer whose packet had next header 59 ("no next header") is
    // indistinguishable from an RFC 4303 §2.6 dummy packet: it is discarded.
    let mut exp_ids = Vec::new();
    let mut end = None;
    let mut dummy = None;
    for k in (0..stack.len()).rev() {
        let c = &cfgs[stack[k]];
        exp_ids.push(ids[stack[k]]);
        if c.mode == Mode::Tunnel {
            end = Some(k);
            break;
        }
        if c.protocol == Protocol::Esp && transport_nh(&stages[k]) == Some(proto::NO_NEXT) {
            dummy = Some(ids[stack[k]]);
            break;
        }
    }
    let applied = &stack[stack.len() - exp_ids.len()..];
    let tunnel_end = end.is_some();
    let mut exp_out = stages[end.unwrap_or(0)].clone();
    if !tunnel_end {
        fix_v4_checksum(&mut exp_out);
    }
    let selectors_ok = applied
        .iter()
        .zip(stack.len() - applied.len()..)
        .all(|(&i, k)| ref_selectors(&cfgs[i], &stages[k]).is_ok());
    let expect = if let Some(id) = dummy {
        Expect::Dummy(id)
    } else if !selectors_ok {
        Expect::Err(DropReason::SelectorMismatch)
    } else if tunnel_end {
        Expect::Packet(exp_ids.clone(), exp_out.clone())
    } else {
        after_transport(exp_ids.clone(), exp_out.clone())
    };

    if !mutate {
        let (r, out) = decap(&mut sad, &wire);
        generic(&sad, &wire, &r, &out);
        check_expect("valid", &expect, &r, &out, &wire);
        // On SADs with the same lifetime limits: a packet of two layers of
        // one SA with a hard limit of one packet is refused at the second
        // with SaExpired, where no limit would let it on further.
        gated(&wire, &r, &out, gate, lifetime(profile));
        lazily(&wire, &r, &out, lifetime(profile));
        if profile != 0 && expect != Expect::Unknown {
            if let Ok(InboundResult::Packet(ids)) = &r {
                if check_lifetime(&mut sad, ids, &wire, profile) {
                    return;
                }
            }
        }
        if r.is_ok() && expect != Expect::Unknown {
            // Replayed: the first layer with a replay window refuses it.
            let (r2, out2) = decap(&mut sad, &wire);
            if applied.iter().all(|&i| cfgs[i].replay_window == 0) {
                assert_eq!((&r2, &out2), (&r, &out), "window 0: replay differs");
            } else {
                assert_eq!(
                    r2.as_ref().map_err(|e| e.reason),
                    Err(DropReason::Replay),
                    "replay accepted"
                );
            }
        }
        return;
    }

    let mut pkt = wire;
    for (op, pos, v) in muts {
        let at = usize::from(pos) % (pkt.len() + 1);
        match op % 4 {
            0 if at < pkt.len() => pkt[at] ^= v.max(1),
            1 => pkt.truncate(at),
            2 => pkt.insert(at, v),
            3 => pkt.extend(std::iter::repeat_n(v, usize::from(op >> 2) + 1)),
            _ => {}
        }
    }
    let (r, out) = decap(&mut sad, &pkt);
    generic(&sad, &pkt, &r, &out);
    gated(&pkt, &r, &out, gate, Lifetime::default());
    lazily(&pkt, &r, &out, Lifetime::default());
    if let (Expect::Packet(ids, want), Ok(InboundResult::Packet(got))) = (&expect, &r) {
        if ids == got {
            if tunnel_end {
                let (mut a, mut b) = (out.clone(), want.clone());
                clear_ecn(&mut a);
                clear_ecn(&mut b);
                assert!(
                    a == b,
                    "mutated tunnel packet accepted with a different inner packet"
                );
            } else {
                let ka = transport_keep(&out).expect("transport result parses");
                let kb = transport_keep(want).unwrap();
                assert!(
                    out[ka..] == want[kb..],
                    "mutated transport packet accepted with a different payload"
                );
            }
        }
    }
}

fn crafted(c: &mut Cursor<'_>, gate: u8) {
    let cfgs = inbound_configs();
    let i = usize::from(c.u8()) % sa_ix::N_CLASSIC;
    let seqv = c.u32();
    let flags = c.u8();
    let tos = c.u8();
    let nh_b = c.u8();
    let body = std::mem::replace(c, Cursor::new(&[])).rest();
    // Flags bit 5: the Q-ESP SA instead (bit 4: its header lies about the
    // inner packet's ports).
    let i = if flags & 0x20 != 0 { sa_ix::Q_GCM } else { i };
    let cfg = &cfgs[i];
    let seq = outbound_seq(cfg, seqv);
    let v6 = flags & 1 != 0;
    let (src, dst) = (addr(v6, 7, 1), addr(v6, 8, 2));
    let hlen = if v6 { 40 } else { 20 };
    let (mut sad, ids) = build_sad();
    let id = ids[i];

    let (pkt, expect) = match cfg.protocol {
        Protocol::Esp => {
            let mut t = Transform::new(cfg.suite, &cfg.enc_key, &cfg.integ_key).unwrap();
            let cbc = matches!(
                cfg.suite.enc,
                Some(Enc::AesCbc(_) | Enc::TripleDes | Enc::Des)
            );
            let mut plain = body.to_vec();
            if cbc && !plain.len().is_multiple_of(t.block_len()) {
                // Keep the fuzz-chosen trailer at the end.
                let n = t.block_len() - plain.len() % t.block_len();
                plain.splice(0..0, std::iter::repeat_n(0, n));
            }
            let (iv, icv) = (t.iv_len(), t.icv_len());
            let mut e = vec![0u8; esp::HEADER_LEN + iv + plain.len() + icv];
            esp::emit_header(&mut e, cfg.spi, seq);
            t.fill_iv(&mut e[8..8 + iv], seq).unwrap();
            e[8 + iv..8 + iv + plain.len()].copy_from_slice(&plain);
            let mut aad = cfg.spi.to_be_bytes().to_vec();
            let hi = ((seq >> 32) as u32).to_be_bytes();
            if cfg.esn {
                aad.extend_from_slice(&hi);
            }
            aad.extend_from_slice(&(seq as u32).to_be_bytes());
            let auth = AuthCtx {
                aad: &aad,
                mac_prefix: &[],
                mac_suffix: if cfg.esn { &hi } else { &[] },
            };
            t.seal(&mut e, esp::HEADER_LEN, &auth).expect("seal");
            let udp_encap = matches!(cfg.encap, sa::Encap::Udp { .. });
            let (l4, p) = if udp_encap {
                let mut u = vec![0u8; 8];
                udp::emit(&mut u, NAT_T, NAT_T, e.len()).unwrap();
                u.extend_from_slice(&e);
                (u, proto::UDP)
            } else {
                (e, proto::ESP)
            };
            if l4.len() + hlen > 65535 {
                return;
            }
            let pkt = ip_packet(src, dst, p, tos, &l4);
            let expect = match ref_trailer(&plain) {
                Err(d) => Expect::Err(d),
                Ok((_, proto::NO_NEXT)) => Expect::Dummy(id),
                Ok((plen, nh)) => match cfg.mode {
                    Mode::Tunnel => match ref_tunnel(cfg, &plain[..plen], nh, tos) {
                        Ok(inner) => Expect::Packet(vec![id], inner),
                        Err(d) => Expect::Err(d),
                    },
                    Mode::Transport => {
                        let out =
                            ref_transport(&pkt[..hlen], &plain[..plen], if v6 { 6 } else { 9 }, nh);
                        match ref_selectors(cfg, &out) {
                            Ok(()) => after_transport(vec![id], out),
                            Err(d) => Expect::Err(d),
                        }
                    }
                },
            };
            (pkt, expect)
        }
        Protocol::Qesp => {
            // docs/QESP.md: header `sport | dport | tlp | reserved (3) | SPI
            // | seq`, the AEAD's associated data `outer src | outer dst |
            // header`; the header's clear fields must be the inner packet's.
            let mut t = Transform::new(cfg.suite, &cfg.enc_key, &cfg.integ_key).unwrap();
            let plain = body.to_vec();
            let honest = ref_trailer(&plain)
                .ok()
                .and_then(|(plen, _)| ref_clear(&plain[..plen]))
                .unwrap_or((0, 0, 0));
            let clear = if flags & 0x10 != 0 {
                (honest.0 ^ 1, honest.1, honest.2)
            } else {
                honest
            };
            let (iv, icv) = (t.iv_len(), t.icv_len());
            let h = qesp::HEADER_LEN;
            let mut e = vec![0u8; h + iv + plain.len() + icv];
            e[..2].copy_from_slice(&clear.0.to_be_bytes());
            e[2..4].copy_from_slice(&clear.1.to_be_bytes());
            e[4] = clear.2;
            e[8..12].copy_from_slice(&cfg.spi.to_be_bytes());
            e[12..16].copy_from_slice(&(seq as u32).to_be_bytes());
            t.fill_iv(&mut e[h..h + iv], seq).unwrap();
            e[h + iv..h + iv + plain.len()].copy_from_slice(&plain);
            let octets = |a: std::net::IpAddr| match a {
                std::net::IpAddr::V4(a) => a.octets().to_vec(),
                std::net::IpAddr::V6(a) => a.octets().to_vec(),
            };
            let mut aad = [octets(src), octets(dst)].concat();
            aad.extend_from_slice(&e[..h]);
            let auth = AuthCtx {
                aad: &aad,
                mac_prefix: &[],
                mac_suffix: &[],
            };
            t.seal(&mut e, h, &auth).expect("seal");
            if e.len() + hlen > 65535 {
                return;
            }
            let pkt = ip_packet(src, dst, qesp::DEFAULT_IP_PROTOCOL, tos, &e);
            let expect = match ref_trailer(&plain) {
                Err(d) => Expect::Err(d),
                Ok((_, proto::NO_NEXT)) => Expect::Dummy(id),
                Ok((plen, nh)) => match ref_tunnel(cfg, &plain[..plen], nh, tos) {
                    Ok(inner) if ref_clear(&inner) == Some(clear) => {
                        Expect::Packet(vec![id], inner)
                    }
                    Ok(_) => Expect::Err(DropReason::QespPortMismatch),
                    Err(d) => Expect::Err(d),
                },
            };
            (pkt, expect)
        }
        Protocol::Ah => {
            let mac = Mac::new(cfg.suite.integ.unwrap(), &cfg.integ_key).unwrap();
            let icv = mac.icv_len();
            let ah_len = ah::header_len(icv, v6) + 4 * usize::from(flags >> 6);
            let mut a = vec![0u8; ah_len];
            ah::emit(&mut a, nh_b, cfg.spi, seq).unwrap();
            if ah_len + body.len() + hlen > 65535 {
                return;
            }
            let mut pkt = ip_packet(src, dst, proto::AH, tos, &[&a[..], body].concat());
            let mut z = pkt[..hlen].to_vec();
            if v6 {
                z[..4].copy_from_slice(&[0x60, 0, 0, 0]);
                z[7] = 0;
            } else {
                for f in [1, 6, 7, 8, 10, 11] {
                    z[f] = 0;
                }
            }
            let zeros = [0u8; 64];
            let mut tag = vec![0u8; icv];
            let o = hlen;
            mac.compute(
                &[
                    &z,
                    &pkt[o..o + ah::FIXED_LEN],
                    &zeros[..icv],
                    &pkt[o + ah::FIXED_LEN + icv..o + ah_len],
                    &pkt[o + ah_len..],
                ],
                &mut tag,
            );
            pkt[o + ah::FIXED_LEN..o + ah::FIXED_LEN + icv].copy_from_slice(&tag);
            let expect = match cfg.mode {
                Mode::Tunnel => match ref_tunnel(cfg, body, nh_b, tos) {
                    Ok(inner) => Expect::Packet(vec![id], inner),
                    Err(d) => Expect::Err(d),
                },
                Mode::Transport => {
                    let out = ref_transport(&pkt[..hlen], body, if v6 { 6 } else { 9 }, nh_b);
                    let sel = if nh_b == proto::ESP {
                        Ok(())
                    } else {
                        ref_selectors(cfg, &out)
                    };
                    match sel {
                        Ok(()) => after_transport(vec![id], out),
                        Err(d) => Expect::Err(d),
                    }
                }
            };
            (pkt, expect)
        }
    };
    let (r, out) = decap(&mut sad, &pkt);
    generic(&sad, &pkt, &r, &out);
    check_expect("crafted", &expect, &r, &out, &pkt);
    gated(&pkt, &r, &out, gate, Lifetime::default());
    lazily(&pkt, &r, &out, Lifetime::default());
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut c = Cursor::new(rest);
    let gate = (mode >> 2) & 3;
    match mode % 4 {
        0 => raw(rest, gate),
        1 => stacked(&mut c, true, gate),
        2 => stacked(&mut c, false, gate),
        _ => crafted(&mut c, gate),
    }
});
