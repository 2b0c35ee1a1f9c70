//! The stages the packet paths mark, in order, with a fake probe whose
//! "clock" is a counter: every reading advances it by a different amount,
//! so each stage's total says which readings it got.

use super::*;
use crate::buf::PacketBuf;
use crate::crypto::Suite;
use crate::sa::{Classifier, Encap, Protocol, Sa, SaConfig};
use crate::sad::{InboundOutcome, SaId, Sad};
use crate::wire::udp;
use crate::DropReason;
use std::net::Ipv4Addr;
use std::time::Duration;

const T0: Duration = Duration::ZERO;

/// A probe over a fake clock: reading `k` (k = 1, 2, …) returns the sum
/// of 1..=k, so the k-th mark is charged k ticks. Records the sequence.
#[derive(Default)]
struct FakeProbe {
    reads: u64,
    last: u64,
    seq: Vec<Stage>,
    ticks: [u64; Stage::COUNT],
}

impl FakeProbe {
    fn now(&mut self) -> u64 {
        self.reads += 1;
        self.reads * (self.reads + 1) / 2
    }

    fn take(&mut self) -> Vec<Stage> {
        std::mem::take(&mut self.seq)
    }
}

impl Probe for FakeProbe {
    fn mark(&mut self, stage: Stage) {
        let t = self.now();
        self.ticks[stage.index()] += t - self.last;
        self.last = t;
        self.seq.push(stage);
    }
}

fn key(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(13) ^ seed).collect()
}

fn config(suite: &str, protocol: Protocol, spi: u32) -> SaConfig {
    let suite: Suite = suite.parse().unwrap();
    let mut c = SaConfig::new(
        spi,
        protocol,
        suite,
        &key(suite.enc_key_len(), 3),
        &key(suite.integ_key_len(), 4),
    );
    c.tunnel_src = Some("192.0.2.1".parse().unwrap());
    c.tunnel_dst = Some("192.0.2.2".parse().unwrap());
    c.encap = Encap::NAT_T;
    c
}

fn clear() -> Vec<u8> {
    udp::ipv4_packet(Ipv4Addr::new(10, 1, 0, 1), Ipv4Addr::new(10, 2, 0, 1), 100).unwrap()
}

/// A sending SA and a SAD holding its receiving twin.
fn setup(suite: &str, protocol: Protocol) -> (Sa, Sad) {
    let c = config(suite, protocol, 0x1234);
    let tx = Sa::new(c.clone(), T0).unwrap();
    let mut rx = Sad::new();
    rx.insert(Sa::new(c, T0).unwrap()).unwrap();
    (tx, rx)
}

fn seal(tx: &mut Sa, probe: &mut FakeProbe) -> Vec<u8> {
    let mut b = PacketBuf::from_packet(&clear());
    tx.encapsulate_probed(&mut b, T0, probe).unwrap();
    b.as_slice().to_vec()
}

fn open(rx: &mut Sad, wire: &[u8], probe: &mut FakeProbe) -> Result<Vec<u8>, DropReason> {
    let mut b = PacketBuf::from_packet(wire);
    let mut applied = Vec::new();
    match rx.decapsulate_into_probed(&mut b, &Classifier::NAT_T, T0, &mut applied, probe) {
        Ok(InboundOutcome::Packet) => {
            assert_eq!(applied, [SaId(0)]);
            Ok(b.as_slice().to_vec())
        }
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e.reason),
    }
}

use Stage::*;

#[test]
fn aead_marks_cipher_only_both_ways() {
    let (mut tx, mut rx) = setup("aes128gcm16", Protocol::Esp);
    let mut p = FakeProbe::default();
    let wire = seal(&mut tx, &mut p);
    assert_eq!(p.take(), [Replay, Encap, Cipher, Encap]);
    assert_eq!(open(&mut rx, &wire, &mut p).unwrap(), clear());
    assert_eq!(p.take(), [Lookup, Replay, Cipher, Replay, Decap]);
    assert_eq!(p.ticks[Integrity.index()], 0);
}

#[test]
fn cbc_hmac_marks_cipher_and_integrity_in_their_order() {
    let (mut tx, mut rx) = setup("aes128-sha256", Protocol::Esp);
    let mut p = FakeProbe::default();
    let wire = seal(&mut tx, &mut p);
    // Encrypt, then MAC over the ciphertext.
    assert_eq!(p.take(), [Replay, Encap, Cipher, Integrity, Encap]);
    assert_eq!(open(&mut rx, &wire, &mut p).unwrap(), clear());
    // ICV checked before anything is decrypted.
    assert_eq!(p.take(), [Lookup, Replay, Integrity, Cipher, Replay, Decap]);
}

#[test]
fn each_reading_is_charged_to_the_stage_it_closes() {
    let (mut tx, _) = setup("aes128-sha256", Protocol::Esp);
    let mut p = FakeProbe::default();
    seal(&mut tx, &mut p);
    // Marks 1..=5 are charged 1..=5 ticks: Replay 1, Encap 2 + 5,
    // Cipher 3, Integrity 4; nothing else.
    let want = [(Replay, 1), (Encap, 7), (Cipher, 3), (Integrity, 4)];
    for s in Stage::ALL {
        let w = want.iter().find(|(st, _)| *st == s).map_or(0, |w| w.1);
        assert_eq!(p.ticks[s.index()], w, "{s:?}");
    }
}

#[test]
fn a_replayed_packet_stops_at_replay() {
    for suite in ["aes128gcm16", "aes128-sha256"] {
        let (mut tx, mut rx) = setup(suite, Protocol::Esp);
        let mut p = FakeProbe::default();
        let wire = seal(&mut tx, &mut p);
        open(&mut rx, &wire, &mut p).unwrap();
        p.take();
        assert_eq!(
            open(&mut rx, &wire, &mut p),
            Err(DropReason::Replay),
            "{suite}"
        );
        assert_eq!(p.take(), [Lookup, Replay], "{suite}");
    }
}

#[test]
fn an_icv_failure_stops_where_the_icv_is_checked() {
    for (suite, stops_at) in [("aes128gcm16", Cipher), ("aes128-sha256", Integrity)] {
        let (mut tx, mut rx) = setup(suite, Protocol::Esp);
        let mut p = FakeProbe::default();
        let mut wire = seal(&mut tx, &mut p);
        *wire.last_mut().unwrap() ^= 1;
        p.take();
        assert_eq!(
            open(&mut rx, &wire, &mut p),
            Err(DropReason::Integrity),
            "{suite}"
        );
        assert_eq!(p.take(), [Lookup, Replay, stops_at], "{suite}");
        // The window did not move: the genuine packet still gets through.
        *wire.last_mut().unwrap() ^= 1;
        assert_eq!(open(&mut rx, &wire, &mut p).unwrap(), clear(), "{suite}");
    }
}

#[test]
fn an_unknown_spi_stops_at_lookup() {
    let (_, mut rx) = setup("aes128gcm16", Protocol::Esp);
    let mut other = Sa::new(config("aes128gcm16", Protocol::Esp, 0x9999), T0).unwrap();
    let mut p = FakeProbe::default();
    let wire = seal(&mut other, &mut p);
    p.take();
    assert_eq!(open(&mut rx, &wire, &mut p), Err(DropReason::UnknownSpi));
    assert_eq!(p.take(), [Lookup]);
}

#[test]
fn ah_marks_integrity() {
    let c = {
        let mut c = config("sha256", Protocol::Ah, 0x4321);
        c.encap = Encap::None;
        c
    };
    let mut tx = Sa::new(c.clone(), T0).unwrap();
    let mut rx = Sad::new();
    rx.insert(Sa::new(c, T0).unwrap()).unwrap();
    let mut p = FakeProbe::default();
    let wire = seal(&mut tx, &mut p);
    assert_eq!(p.take(), [Replay, Encap, Integrity, Encap]);
    assert_eq!(open(&mut rx, &wire, &mut p).unwrap(), clear());
    assert_eq!(p.take(), [Lookup, Replay, Integrity, Replay, Decap]);
}

#[test]
fn the_probe_does_not_change_the_packets() {
    // GCM is deterministic for a given key and sequence number: the probed
    // and the unprobed path must produce the same bytes.
    let c = config("aes128gcm16", Protocol::Esp, 0x1234);
    let (mut a, mut b) = (Sa::new(c.clone(), T0).unwrap(), Sa::new(c, T0).unwrap());
    let mut p = FakeProbe::default();
    for _ in 0..3 {
        let probed = seal(&mut a, &mut p);
        let mut buf = PacketBuf::from_packet(&clear());
        b.encapsulate(&mut buf, T0).unwrap();
        assert_eq!(probed, buf.as_slice());
    }
    assert_eq!(a.stats().packets, 3);
}

#[test]
fn stage_names_round_trip_and_direction_lists_cover_their_stages() {
    for s in Stage::ALL {
        assert_eq!(Stage::from_name(s.as_str()), Some(s));
        assert_eq!(Stage::ALL[s.index()], s);
    }
    assert_eq!(Stage::from_name("nope"), None);
    assert!(!Stage::OUTBOUND.contains(&Decap) && Stage::OUTBOUND.contains(&Encap));
    assert!(!Stage::INBOUND.contains(&Encap) && Stage::INBOUND.contains(&Decap));
}
