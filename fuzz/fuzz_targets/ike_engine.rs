//! The IKEv2 engine's input path (`espgate_ike::engine::Ike`) driven
//! by arbitrary operations between an initiator A and a responder B.
//!
//! Input: a sequence of operations, each `kind (1 byte) | len (1 byte) |
//! len bytes`:
//! - 0: the bytes as a datagram from A to B (raw, unauthenticated path);
//! - 1: the bytes as a datagram from B to A;
//! - 2: the bytes as the decrypted payload chain of a request or response
//!   (first byte: first payload type; second: exchange type; third: flags;
//!   fourth: message-ID offset, -2..=2) sealed with A's keys of its IKE SA and
//!   delivered to B: this reaches every handler behind the integrity check;
//! - 3: the same from B to A;
//! - 4: deliver everything queued both ways (a handshake makes progress);
//! - 5: time passes (the first byte in seconds) and timers run;
//! - 6: the next queued datagram of A, with one byte flipped, to B;
//! - 7: A initiates / terminates / B takes its IKE SAs to have negotiated
//!   MOBIKE (first byte % 3 = 0 / 1 / 2); with a first byte of 0xf0 or
//!   more, A's engine dies and a new one continues what it exports (each
//!   snapshot through its JSON), as a cluster's new leader does; A's data
//!   plane and what A had sent stay.
//!
//! In 2 and 3, bit 7 of the third byte delivers the message from another
//! address of the sender (a moved MOBIKE peer, a NAT's new mapping).
//!
//! Asserts: no panic, no endless loop (every loop is bounded), the
//! data-plane events stay consistent (an SA is never installed twice or
//! removed without being installed), the number of IKE SAs stays within a
//! few per operation, and a snapshot's JSON reads back to the same JSON.
#![no_main]

use espgate_core::sa::Mode;
use espgate_core::selector::Prefix;
use espgate_ike::cert::Identity;
use espgate_ike::config::{
    ChildConfig, DpdAction, IkeConfig, LocalAuth, QespMode, RemoteAuth, Retransmit, SelectorSet,
};
use espgate_ike::engine::{Event, Ike, IkeSnapshot, Ports, Transmit};
use espgate_ike::proposal::{ProposalKind, ProposalSpec};
use espgate_ike::ts;
use espgate_ike::wire::TrafficSelector;
use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use zeroize::Zeroizing;

fn conf(local: &str, remote: &str, (lts, rts): (&str, &str), more: (&str, &str)) -> IkeConfig {
    let psk = Zeroizing::new(b"fuzzing pre-shared key".to_vec());
    let p = |s: &str| {
        let (a, l) = s.split_once('/').unwrap();
        ts::from_prefix(
            Prefix::new(a.parse().unwrap(), l.parse().unwrap()).unwrap(),
            0,
        )
    };
    IkeConfig {
        name: "c".into(),
        local: local.parse().unwrap(),
        remote: remote.parse().unwrap(),
        local_id: Identity::parse(local).unwrap(),
        remote_id: Some(Identity::parse(remote).unwrap()),
        local_auth: LocalAuth::Psk(psk.clone()),
        remote_auth: RemoteAuth::Psk(psk),
        proposals: ProposalSpec::parse_list(
            ProposalKind::Ike,
            "aes128gcm16-prfsha256-x25519,aes256-sha256-x25519",
        )
        .unwrap(),
        child: ChildConfig {
            local_ts: vec![p(lts)],
            remote_ts: vec![p(rts)],
            mode: Mode::Tunnel,
            proposals: ProposalSpec::parse_list(
                ProposalKind::Esp,
                "aes128gcm16-x25519,aes256-sha256",
            )
            .unwrap(),
            // Both Q-ESP and ESP proposals, so that both paths are reached.
            qesp: QespMode::Prefer,
            rekey_time: Duration::from_secs(20),
            life_time: Duration::from_secs(60),
            jitter: Duration::from_secs(2),
            // RFC 9611 per-CPU children, so that their paths are reached.
            per_cpu_sas: 2,
            // A second selector set, a child of its own, so that its
            // paths are reached too.
            more_ts: vec![SelectorSet {
                local_ts: vec![p(more.0)],
                remote_ts: vec![p(more.1)],
            }],
        },
        rekey_time: Duration::from_secs(45),
        jitter: Duration::from_secs(2),
        dpd_delay: Duration::from_secs(10),
        dpd_action: DpdAction::Restart,
        retransmit: Retransmit {
            timeout: Duration::from_secs(1),
            base: 2.0,
            tries: 2,
            limit: Duration::ZERO,
        },
        force_encap: false,
        mobike: true,
    }
}

#[derive(Default)]
struct Plane {
    sas: BTreeSet<(bool, u32)>,
    /// The per-CPU slot and the selectors of each outbound SA.
    slots: BTreeMap<u32, (u32, Vec<TrafficSelector>, Vec<TrafficSelector>)>,
}

fn drain(e: &mut Ike, p: &mut Plane) {
    while let Some(ev) = e.poll_event() {
        match ev {
            Event::InstallSa(s) => {
                if s.outbound {
                    // A new outbound SA replaces the connection's current
                    // one of its per-CPU slot and selectors.
                    let slots = &p.slots;
                    p.sas.retain(|(o, spi)| {
                        !*o || !slots.get(spi).is_some_and(|(k, l, r)| {
                            *k == s.slot && ts::same(l, &s.local_ts) && ts::same(r, &s.remote_ts)
                        })
                    });
                    p.slots
                        .insert(s.spi, (s.slot, s.local_ts.clone(), s.remote_ts.clone()));
                }
                assert!(p.sas.insert((s.outbound, s.spi)), "SA installed twice");
            }
            Event::RemoveSa { spi, outbound, .. } => {
                assert!(
                    p.sas.remove(&(outbound, spi)),
                    "removing an SA never installed"
                );
            }
            _ => {}
        }
    }
}

/// A's engine, new.
fn engine_a() -> Ike {
    let mut a = Ike::new(
        vec![conf(
            "192.0.2.1",
            "192.0.2.2",
            ("10.1.0.0/16", "10.2.0.0/16"),
            ("10.1.0.0/16", "10.4.0.0/16"),
        )],
        Ports::default(),
    );
    a.set_spi_steering(2);
    a
}

/// A new engine for A that continues what `old` exports, each snapshot
/// carried through its JSON; an import may refuse.
fn take_over(old: &Ike, now: Duration) -> Ike {
    let mut a = engine_a();
    for snap in old.export(now) {
        let json = serde_json::to_vec(&snap).unwrap();
        let back: IkeSnapshot = serde_json::from_slice(&json).unwrap();
        assert_eq!(serde_json::to_vec(&back).unwrap(), json, "snapshot JSON");
        let _ = a.import(now, &back);
    }
    a
}

fuzz_target!(|data: &[u8]| {
    let mut a = engine_a();
    let mut b = Ike::new(
        vec![conf(
            "192.0.2.2",
            "192.0.2.1",
            ("10.2.0.0/16", "10.1.0.0/16"),
            ("10.4.0.0/16", "10.1.0.0/16"),
        )],
        Ports::default(),
    );
    // Per-CPU children's inbound SPIs spread over two workers.
    b.set_spi_steering(2);
    let (mut pa, mut pb) = (Plane::default(), Plane::default());
    let mut now = Duration::from_secs(100);
    let _ = a.initiate(now, "c");
    let mut qa: VecDeque<Transmit> = VecDeque::new();
    let mut qb: VecDeque<Transmit> = VecDeque::new();
    let mut rest = data;
    let mut ops = 0;
    while rest.len() >= 2 && ops < 64 {
        ops += 1;
        let (kind, len) = (rest[0] % 8, usize::from(rest[1]));
        let body = &rest[2..(2 + len).min(rest.len())];
        rest = &rest[(2 + len).min(rest.len())..];
        while let Some(t) = a.poll_transmit() {
            qa.push_back(t);
        }
        while let Some(t) = b.poll_transmit() {
            qb.push_back(t);
        }
        let from_a = "192.0.2.1:500".parse().unwrap();
        let from_b = "192.0.2.2:500".parse().unwrap();
        match kind {
            0 => b.handle(now, from_b, from_a, body),
            1 => a.handle(now, from_a, from_b, body),
            2 | 3 => {
                if body.len() >= 4 {
                    let (src, dst, to, mut from) = if kind == 2 {
                        (&mut a, &mut b, from_b, from_a)
                    } else {
                        (&mut b, &mut a, from_a, from_b)
                    };
                    if body[2] & 0x80 != 0 {
                        from = "192.0.2.9:4500".parse().unwrap();
                    }
                    let exch = 34 + body[1] % 4;
                    let response = body[2] & 1 == 1;
                    if let Some(t) = src.fuzz_seal(
                        usize::from(body[2] >> 1),
                        exch,
                        response,
                        body[3] % 5,
                        body[0],
                        &body[4..],
                    ) {
                        dst.handle(now, to, from, &t.data);
                    }
                }
            }
            4 => {
                for _ in 0..8 {
                    let mut moved = false;
                    while let Some(t) = qa.pop_front() {
                        moved = true;
                        b.handle(now, from_b, from_a, &t.data);
                    }
                    while let Some(t) = qb.pop_front() {
                        moved = true;
                        a.handle(now, from_a, from_b, &t.data);
                    }
                    while let Some(t) = a.poll_transmit() {
                        qa.push_back(t);
                    }
                    while let Some(t) = b.poll_transmit() {
                        qb.push_back(t);
                    }
                    drain(&mut a, &mut pa);
                    drain(&mut b, &mut pb);
                    if !moved {
                        break;
                    }
                }
            }
            5 => {
                now += Duration::from_secs(u64::from(body.first().copied().unwrap_or(1)));
                a.handle_timeout(now);
                b.handle_timeout(now);
            }
            6 => {
                if let Some(mut t) = qa.pop_front() {
                    if !t.data.is_empty() {
                        let i = usize::from(body.first().copied().unwrap_or(0)) % t.data.len();
                        t.data[i] ^= body.get(1).copied().unwrap_or(1).max(1);
                    }
                    b.handle(now, from_b, from_a, &t.data);
                }
            }
            _ => match body
                .first()
                .map_or(0, |&x| if x >= 0xf0 { 3 } else { x % 3 })
            {
                0 => {
                    let _ = a.initiate(now, "c");
                }
                1 => {
                    let _ = a.terminate(now, "c");
                }
                2 => b.fuzz_mobike(),
                _ => a = take_over(&a, now),
            },
        }
        drain(&mut a, &mut pa);
        drain(&mut b, &mut pb);
        let (sa, sb) = (a.status(), b.status());
        // No operation makes more than a few IKE SAs, legitimately: a
        // count that outgrows the operations is a leak (two rekeys that
        // crossed once left both new SAs, and every later collision
        // doubled them).
        assert!(
            sa.len().max(sb.len()) <= 4 * ops + 4,
            "{} and {} IKE SAs after {ops} operations",
            sa.len(),
            sb.len()
        );
        let _ = a.poll_timeout();
    }
});
