//! The gateway engine, two back to back: site A (10.1/16, outer
//! 192.0.2.1) and site B (10.2/16, outer 192.0.2.2) with mirrored keys
//! (`espgate-testkit`).

use espgate_core::gateway::*;
use espgate_core::sa::{Classifier, Encap, Growth, Mode, Protocol, SaConfig, SaEvent, SeqLease};
use espgate_core::wire::flow::Flow;
use espgate_core::wire::ip;
use espgate_core::{DropReason, PacketBuf};
use espgate_testkit::keys::*;
use espgate_testkit::{drops, from_a, opts, side, tcp_syn4, udp4, Shape, B};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const T: Duration = Duration::from_secs(1);

fn hex(s: &str) -> Vec<u8> {
    ::hex::decode(s).unwrap()
}

/// Mirrored engines A and B.
fn pair(layers: Layers, udp: bool) -> (Engine, Engine) {
    let shape = Shape::new(layers, udp);
    let a = Engine::new(&[side(true, shape)], &opts(), T).unwrap();
    let b = Engine::new(&[side(false, shape)], &opts(), T).unwrap();
    (a, b)
}

fn shaped(layers: Layers, udp: bool, per_cpu: u32, spi_out_a: u32) -> Shape {
    Shape {
        layers,
        udp,
        per_cpu,
        spi_out_a,
    }
}

fn send_one(a: &mut Engine, b: &mut Engine) -> bool {
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
    if a.outbound(&mut buf, T) != Ok(Some(0)) {
        return false;
    }
    b.inbound(&mut buf, T, from_a()) == Ok(Received::Packet)
}

/// `(direction, spi)` of the SAs in `e`'s directory.
fn spis(e: &Engine, outbound: bool) -> Vec<u32> {
    e.stats()
        .sas()
        .iter()
        .filter(|s| s.outbound == outbound)
        .map(|s| s.spi)
        .collect()
}

fn entry(e: &Engine, outbound: bool) -> SaEntry {
    e.stats()
        .sas()
        .iter()
        .find(|s| s.outbound == outbound)
        .cloned()
        .unwrap()
}

#[test]
fn tunnel_round_trip_every_protocol() {
    for (layers, udp) in [
        (Layers::Esp, true),
        (Layers::Esp, false),
        (Layers::Ah, false),
        (Layers::EspAh, false),
    ] {
        let (mut a, mut b) = pair(layers, udp);
        let clear = udp4("10.1.0.5", "10.2.0.9", 100);
        let mut buf = PacketBuf::with_capacity(2000);
        buf.load(&clear);
        assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)));
        let outer = ip::parse(buf.as_slice()).unwrap();
        assert_eq!(outer.src, from_a());
        assert!(buf.len() - clear.len() <= a.max_overhead(), "{layers:?}");
        assert_eq!(
            b.inbound(&mut buf, T, outer.src),
            Ok(Received::Packet),
            "{layers:?}/{udp}: {:?}",
            drops(&b)
        );
        assert_eq!(buf.as_slice(), &clear[..]);
        let sas = b.stats().sas();
        assert!(sas
            .iter()
            .filter(|s| !s.outbound)
            .all(|s| s.counters.packets.get() == 1));
        assert!(drops(&b).is_empty());
        assert!(a
            .stats()
            .sas()
            .iter()
            .filter(|s| s.outbound)
            .all(|s| s.next_seq() == 2));
        assert_eq!(a.stats().counters.tun_rx.get(), 1);
        assert_eq!(b.stats().counters.net_rx.get(), 1);
    }
}

#[test]
fn drops_are_counted_by_reason_with_their_context() {
    let (mut a, mut b) = pair(Layers::Esp, true);
    let mut buf = PacketBuf::with_capacity(2000);
    // No policy: outside the selectors.
    buf.load(&udp4("10.1.0.5", "10.3.0.9", 10));
    let d = a.outbound(&mut buf, T).unwrap_err();
    assert_eq!(d.reason, DropReason::NoPolicy);
    assert_eq!(
        a.describe(&d).to_string(),
        "10.1.0.5 -> 10.3.0.9 (protocol 17) from the TUN matches no connection's selectors"
    );
    // Multicast and link-local: counted apart, not as drops.
    buf.load(&udp4("10.1.0.5", "224.0.0.22", 10));
    assert_eq!(a.outbound(&mut buf, T), Ok(None));
    assert_eq!(a.stats().counters.not_unicast.get(), 1);
    assert_eq!(drops(&a), [("no_policy", 1)]);
    // Replay.
    buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
    a.outbound(&mut buf, T).unwrap();
    let wire = buf.as_slice().to_vec();
    assert_eq!(b.inbound(&mut buf, T, from_a()), Ok(Received::Packet));
    buf.load(&wire);
    let d = b.inbound(&mut buf, T, from_a()).unwrap_err();
    assert_eq!(d.reason, DropReason::Replay);
    assert_eq!(
        b.describe(&d).to_string(),
        "inbound from 192.0.2.1 SPI 0x00001002 (connection \"peer\")"
    );
    // ICV failure, with the next packet.
    buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
    a.outbound(&mut buf, T).unwrap();
    let n = buf.len();
    buf.as_mut_slice()[n - 3] ^= 1;
    assert_eq!(
        b.inbound(&mut buf, T, from_a()).unwrap_err().reason,
        DropReason::Integrity
    );
    // Unknown SPI: no connection to name.
    buf.load(&wire);
    buf.as_mut_slice()[28 + 3] ^= 0x40;
    let d = b.inbound(&mut buf, T, from_a()).unwrap_err();
    assert_eq!(d.reason, DropReason::UnknownSpi);
    assert_eq!(
        b.describe(&d).to_string(),
        "inbound from 192.0.2.1 SPI 0x00001042"
    );
    assert_eq!(
        drops(&b),
        [("unknown_spi", 1), ("replay", 1), ("icv_failure", 1)]
    );
    let inbound = entry(&b, false);
    assert_eq!(inbound.counters.drops.get(DropReason::Replay), 1);
    assert_eq!(inbound.counters.replay_top.get(), 1);
    b.tick(T * 3);
    assert_eq!(b.poll_event(), None);
}

/// `outbound_from` (a clear packet outside the buffer, as a segment of a
/// TSO read is) gives what `outbound` gives on a copy of it: the same
/// result, the same bytes to send, the same drops and counters. Both for
/// packets it seals straight from the caller's bytes (one AES-GCM ESP SA)
/// and for those it leaves to the general path: no policy, multicast, a
/// packet that does not parse, AH around ESP, a learnt path MTU (whose
/// ICMP "too big" lands in the buffer, as `outbound` leaves it).
#[test]
fn outbound_from_the_callers_packet_equals_outbound_on_a_copy() {
    for (layers, udp, pmtu) in [
        (Layers::Esp, true, false),
        (Layers::Esp, false, false),
        (Layers::EspAh, false, false),
        (Layers::Esp, true, true),
    ] {
        let what = format!("{layers:?} udp={udp} pmtu={pmtu}");
        let (mut a1, _) = pair(layers, udp);
        let (mut a2, mut b) = pair(layers, udp);
        if pmtu {
            a1.note_path_mtu(0, 1280, T);
            a2.note_path_mtu(0, 1280, T);
        }
        let pkts = [
            udp4("10.1.0.5", "10.2.0.9", 10),
            udp4("10.1.0.5", "10.2.0.9", 1400),
            udp4("10.1.0.5", "10.2.0.9", 0),
            udp4("10.1.0.5", "10.3.0.9", 10),
            udp4("10.1.0.5", "224.0.0.22", 10),
            tcp_syn4("10.1.0.5", "10.2.0.9", 1460),
            vec![0x45, 0, 0],
        ];
        let mut copy = PacketBuf::with_capacity(2000);
        let mut out = PacketBuf::with_capacity(64);
        let mut sent = 0;
        for p in &pkts {
            copy.load(p);
            let r1 = a1.outbound(&mut copy, T);
            let mut src = p.clone();
            let r2 = a2.outbound_from(&mut src, &mut out, T);
            assert_eq!(r1, r2, "{what}: {p:02x?}");
            if r1.is_ok() && r1 != Ok(None) || r1.as_ref().is_err_and(|d| d.reply) {
                assert_eq!(copy.as_slice(), out.as_slice(), "{what}");
            }
            if r1 == Ok(Some(0)) {
                sent += 1;
                assert_eq!(
                    b.inbound(&mut out, T, from_a()),
                    Ok(Received::Packet),
                    "{what}"
                );
            }
        }
        assert_eq!(drops(&a1), drops(&a2), "{what}");
        let (c1, c2) = (&a1.stats().counters, &a2.stats().counters);
        assert_eq!(c1.tun_rx.get(), c2.tun_rx.get(), "{what}");
        assert_eq!(c1.not_unicast.get(), c2.not_unicast.get(), "{what}");
        assert_eq!(c1.mss_clamped.get(), c2.mss_clamped.get(), "{what}");
        assert_eq!(c1.icmp_too_big.get(), c2.icmp_too_big.get(), "{what}");
        assert_eq!(
            entry(&a1, true).counters.bytes.get(),
            entry(&a2, true).counters.bytes.get()
        );
        // The path MTU of 1280 refuses the 1400-byte packet only.
        assert_eq!(sent, if pmtu { 3 } else { 4 }, "{what}");
    }
}

/// `inbound_from` (the packet's head in the buffer, behind the outer
/// header the daemon synthesises, the rest decrypted from the bytes as
/// received) gives what `inbound` gives on the whole packet: the result,
/// the bytes, the drops and the counters. For ESP in UDP and raw, AH and
/// AH around ESP; for a replay, a flipped byte, an unknown SPI and a
/// packet that does not parse; split where the daemon splits (after the
/// outer IP and UDP headers) and at the start.
#[test]
fn inbound_from_the_received_bytes_equals_inbound_on_a_copy() {
    for (layers, udp) in [
        (Layers::Esp, true),
        (Layers::Esp, false),
        (Layers::Ah, false),
        (Layers::EspAh, false),
    ] {
        let (mut a, _) = pair(layers, udp);
        let mut buf = PacketBuf::with_capacity(2000);
        let mut wires = Vec::new();
        for n in [10, 1400, 0] {
            buf.load(&udp4("10.1.0.5", "10.2.0.9", n));
            assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)));
            let w = buf.as_slice().to_vec();
            wires.push(w.clone());
            wires.push(w.clone());
            let mut bad = w.clone();
            bad[w.len() - 5] ^= 1;
            wires.push(bad);
        }
        let mut other = wires[0].clone();
        other[if udp { 31 } else { 23 }] ^= 0x40;
        wires.push(other);
        wires.push(vec![0x45, 0, 0]);
        for k in [0, if udp { 28 } else { 20 }] {
            let what = format!("{layers:?} udp={udp} k={k}");
            let (_, mut b1) = pair(layers, udp);
            let (_, mut b2) = pair(layers, udp);
            let mut delivered = 0;
            for w in &wires {
                let k = k.min(w.len());
                buf.load(w);
                let r1 = b1.inbound(&mut buf, T, from_a());
                let mut head = PacketBuf::from_packet(&[0xa5; 1600]);
                head.load_head(&w[k..]);
                head.push_front(k)[..k].copy_from_slice(&w[..k]);
                let r2 = b2.inbound_from(&mut head, &w[k..], T, from_a());
                assert_eq!(r1, r2, "{what}");
                if r1 == Ok(Received::Packet) {
                    assert_eq!(buf.as_slice(), head.as_slice(), "{what}");
                    delivered += 1;
                }
            }
            assert_eq!(delivered, 3, "{what}");
            assert_eq!(drops(&b1), drops(&b2), "{what}");
            let (c1, c2) = (&b1.stats().counters, &b2.stats().counters);
            assert_eq!(c1.net_rx.get(), c2.net_rx.get(), "{what}");
            assert_eq!(
                entry(&b1, false).counters.bytes.get(),
                entry(&b2, false).counters.bytes.get(),
                "{what}"
            );
        }
    }
}

#[test]
fn an_incomplete_bundle_is_refused() {
    // B expects AH around ESP; A's ESP SA alone (same keys) must not pass.
    let (_, mut b) = pair(Layers::EspAh, false);
    let (mut a, _) = pair(Layers::Esp, false);
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
    a.outbound(&mut buf, T).unwrap();
    let d = b.inbound(&mut buf, T, from_a()).unwrap_err();
    assert_eq!(d.reason, DropReason::PolicyMismatch);
    assert_eq!(
        b.describe(&d).to_string(),
        "packet from 192.0.2.1 came through ESP 0x00001002 but not its connection's whole \
         inbound bundle"
    );
}

#[test]
fn tcp_syns_are_clamped_both_ways() {
    let (mut a, mut b) = pair(Layers::Esp, true);
    let tun_mtu = a.tun_mtu(1500);
    assert_eq!(tun_mtu, 1438);
    // A SYN with MSS 1460 from 10.1.0.5 to 10.2.0.9 (its checksum is not
    // checked here; mss.rs tests that).
    let syn = tcp_syn4("10.1.0.5", "10.2.0.9", 1460);
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&syn);
    a.outbound(&mut buf, T).unwrap();
    assert_eq!(b.inbound(&mut buf, T, from_a()), Ok(Received::Packet));
    let mss = u16::from_be_bytes([buf.as_slice()[42], buf.as_slice()[43]]);
    assert_eq!(u32::from(mss), tun_mtu - 40);
    assert_eq!(a.stats().counters.mss_clamped.get(), 1);
    assert_eq!(
        b.stats().counters.mss_clamped.get(),
        0,
        "already clamped by A"
    );
}

#[test]
fn hard_lifetime_stops_the_sa_and_shows_in_the_directory() {
    let mut ca = side(true, shaped(Layers::Esp, true, 1, 0x1002));
    for sc in ca.outbound.iter_mut().chain(ca.inbound.iter_mut()) {
        sc.lifetime.hard_packets = Some(3);
        sc.lifetime.soft_packets = Some(2);
    }
    let mut a = Engine::new(&[ca], &opts(), T).unwrap();
    let mut buf = PacketBuf::with_capacity(2000);
    let mut sent = 0;
    for _ in 0..5 {
        buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
        if a.outbound(&mut buf, T).is_ok() {
            sent += 1;
        }
    }
    assert_eq!(sent, 3);
    assert_eq!(drops(&a), [("sa_expired", 2)]);
    let out = entry(&a, true);
    assert_eq!(
        out.counters.life(),
        espgate_core::stats::LifeState::HardExpired
    );
    assert_eq!(out.limits.hard_packets, Some(3));
    assert_eq!(out.counters.packets.get(), 3);
    assert_eq!(out.counters.drops.get(DropReason::SaExpired), 2);
    let inbound = entry(&a, false);
    assert_eq!(inbound.counters.life(), espgate_core::stats::LifeState::Ok);
    // The events (soft, then hard) come out after a tick.
    a.tick(T * 2);
    let mut events = Vec::new();
    while let Some(EngineEvent::Sa {
        event,
        outbound,
        spi,
        ..
    }) = a.poll_event()
    {
        events.push((event, outbound, spi));
    }
    assert_eq!(
        events,
        [
            (SaEvent::SoftExpired, true, 0x1002),
            (SaEvent::HardExpired, true, 0x1002)
        ]
    );
}

/// Leases kept in memory: the limit the test sets, the numbers released.
#[derive(Debug, Default)]
struct MemLeases {
    /// (key, next released or reserved) per outbound SA leased.
    released: Mutex<Vec<(u32, u64)>>,
    limit: Arc<AtomicU64>,
    /// The first number each new lease starts at.
    start: AtomicU64,
}

#[derive(Debug)]
struct MemLease {
    spi: u32,
    limit: Arc<AtomicU64>,
    wanted: AtomicU64,
    owner: Arc<MemLeases>,
}

impl SeqLease for MemLease {
    fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }
    fn want(&self, next: u64) {
        self.wanted.store(next, Ordering::Relaxed);
    }
    fn release(&self, next: u64) {
        self.owner.released.lock().unwrap().push((self.spi, next));
    }
}

struct Source(Arc<MemLeases>);

impl LeaseSource for Source {
    fn lease(&self, sa: &SaConfig, _conn: &str) -> Result<(u64, Arc<dyn SeqLease>), String> {
        let l = MemLease {
            spi: sa.spi,
            limit: self.0.limit.clone(),
            wanted: AtomicU64::new(0),
            owner: self.0.clone(),
        };
        Ok((self.0.start.load(Ordering::Relaxed).max(1), Arc::new(l)))
    }
}

fn leased(leases: &Arc<MemLeases>) -> EngineOptions {
    EngineOptions {
        leases: Some(Arc::new(Source(leases.clone()))),
        cluster: None,
        ..opts()
    }
}

#[test]
fn outbound_numbers_stop_at_the_lease_and_resume_when_it_grows() {
    let leases = Arc::new(MemLeases::default());
    leases.limit.store(4, Ordering::Relaxed);
    leases.start.store(2, Ordering::Relaxed);
    let mut a = Engine::new(
        &[side(true, shaped(Layers::Esp, true, 1, 0x1002))],
        &leased(&leases),
        T,
    )
    .unwrap();
    let mut b = Engine::new(
        &[side(false, shaped(Layers::Esp, true, 1, 0x1002))],
        &opts(),
        T,
    )
    .unwrap();
    // Starts where the lease says; 2 and 3 are covered, 4 is not.
    assert_eq!(entry(&a, true).next_seq(), 2);
    assert_eq!(entry(&a, true).seq_limit(), Some(4));
    assert!(send_one(&mut a, &mut b));
    assert!(send_one(&mut a, &mut b));
    assert!(!send_one(&mut a, &mut b));
    assert_eq!(drops(&a), [("seq_not_reserved", 1)]);
    // The shell extends the lease (off the packet path): sending resumes
    // at the number refused (never used), and the receiver accepts it.
    leases.limit.store(100, Ordering::Relaxed);
    assert!(send_one(&mut a, &mut b), "{:?}", drops(&b));
    assert_eq!(entry(&b, false).counters.replay_top.get(), 4);
    a.release_leases();
    assert_eq!(*leases.released.lock().unwrap(), [(0x1002, 5)]);
}

#[test]
fn worker_engines_share_outbound_numbers_and_split_inbound_sas() {
    let leases = Arc::new(MemLeases::default());
    leases.limit.store(u64::MAX, Ordering::Relaxed);
    let ca = [side(true, shaped(Layers::Esp, true, 1, 0x1002))];
    let mut b = Engine::new(
        &[side(false, shaped(Layers::Esp, true, 1, 0x1002))],
        &opts(),
        T,
    )
    .unwrap();
    let mut ws = Engine::for_workers(&ca, &leased(&leases), T, 2).unwrap();
    // A's inbound SA 0x1001 is steered to worker 1 (0x1001 % 2) and lives
    // there only; both hold the outbound SA 0x1002.
    assert!(spis(&ws[0], false).is_empty());
    assert_eq!(spis(&ws[1], false), [0x1001]);
    for w in &ws {
        assert_eq!(spis(w, true), [0x1002]);
    }
    assert_eq!(worker_of(Encap::NAT_T, 0x1001, 2), 1);
    assert_eq!(worker_of(Encap::None, 0x1001, 2), 0);
    // Packets sent alternately by both workers: the receiver accepts every
    // one (a reused number would be a replay drop).
    for i in 0..10 {
        assert!(send_one(&mut ws[i % 2], &mut b), "packet {i}");
    }
    assert_eq!(entry(&b, false).counters.replay_top.get(), 10);
    assert!(drops(&b).is_empty());
    for w in &ws {
        assert_eq!(entry(w, true).next_seq(), 11);
        // One lease, taken once, shared by both copies.
        assert_eq!(entry(w, true).seq_limit(), Some(u64::MAX));
    }
    // Each copy counts its own packets.
    assert_eq!(entry(&ws[0], true).counters.packets.get(), 5);
    for w in &mut ws {
        w.release_leases();
    }
    assert_eq!(
        *leases.released.lock().unwrap(),
        [(0x1002, 11), (0x1002, 11)]
    );
}

#[test]
fn per_cpu_sas_give_each_worker_its_own_pair() {
    // SPI ranges of two pairs each that do not overlap: A sends on 0x2000,
    // 0x2001 and receives on 0x1001, 0x1002.
    let ca = [side(true, shaped(Layers::Esp, true, 2, 0x2000))];
    let cb = [side(false, shaped(Layers::Esp, true, 2, 0x2000))];
    let mut aw = Engine::for_workers(&ca, &opts(), T, 2).unwrap();
    let mut bw = Engine::for_workers(&cb, &opts(), T, 2).unwrap();
    // Worker w of A sends on 0x2000 + w; B receives 0x2000 + w on worker
    // (0x2000 + w) % 2 = w, with its own key.
    for (w, a) in aw.iter_mut().enumerate() {
        let mut buf = PacketBuf::with_capacity(2000);
        buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
        assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)), "{:?}", drops(a));
        let wire = buf.as_slice().to_vec();
        let spi = u32::from_be_bytes(wire[28..32].try_into().unwrap());
        assert_eq!(spi, 0x2000 + w as u32);
        assert_eq!(bw[w].inbound(&mut buf, T, from_a()), Ok(Received::Packet));
        // The other worker of B does not hold that SA.
        buf.load(&wire);
        assert!(bw[1 - w].inbound(&mut buf, T, from_a()).is_err());
    }
    let outs: Vec<u64> = aw[0]
        .stats()
        .sas()
        .iter()
        .filter(|s| s.outbound)
        .map(|s| s.next_seq())
        .collect();
    // Each pair's counter moved once.
    assert_eq!(outs, [2, 2]);
    let keys = aw[0].sa_keys();
    assert_eq!(
        keys.len(),
        3,
        "two outbound copies, one inbound on worker 0"
    );
    // Pair 1's keys differ from pair 0's.
    assert_ne!(keys[1].config.enc_key, keys[2].config.enc_key);
}

#[test]
fn manual_rekey_make_before_break() {
    let (mut a, mut b) = pair(Layers::Esp, true);
    assert!(send_one(&mut a, &mut b));
    // A packet A sent on the old SA, still in flight during the rekey.
    let mut in_flight = PacketBuf::with_capacity(2000);
    in_flight.load(&udp4("10.1.0.5", "10.2.0.9", 10));
    a.outbound(&mut in_flight, T).unwrap();
    // B accepts a second inbound SA next to the first.
    let spec = format!("spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}");
    let ch = b.add_sa("peer", false, &spec, T).unwrap();
    assert!(ch.message.contains("0x00001002, 0x00003001"), "{ch:?}");
    assert!(ch.warnings.is_empty());
    assert_eq!(spis(&b, false), [0x1002, 0x3001]);
    // A switches its outbound SA: the old one is gone.
    let ch = a.add_sa("peer", true, &spec, T).unwrap();
    assert!(ch.message.contains("replaces ESP SA 0x00001002"), "{ch:?}");
    assert_eq!(spis(&a, true), [0x3001]);
    assert!(a.sad().lookup(Protocol::Esp, 0x1002).is_none());
    let out = entry(&a, true);
    assert!(out.added);
    assert_eq!(out.next_seq(), 1);
    // Both the new SA and the old one (the packet in flight) pass.
    assert!(send_one(&mut a, &mut b), "{:?}", drops(&b));
    assert_eq!(b.inbound(&mut in_flight, T, from_a()), Ok(Received::Packet));
    let inb: Vec<(u32, u64, bool)> = b
        .stats()
        .sas()
        .iter()
        .filter(|s| !s.outbound)
        .map(|s| (s.spi, s.counters.packets.get(), s.added))
        .collect();
    assert_eq!(inb, [(0x1002, 2, false), (0x3001, 1, true)]);
    assert!(drops(&b).is_empty(), "{:?}", drops(&b));
    // Break: B removes the old inbound SA; its packets are unknown now.
    let ch = b.del_sa(0x1002, None, Some(false), Some("peer")).unwrap();
    assert!(ch
        .message
        .contains("removed inbound ESP SA 0x00001002 after 2 packets"));
    assert!(ch.warnings.is_empty());
    assert_eq!(spis(&b, false), [0x3001]);
    assert!(send_one(&mut a, &mut b));
    // The other direction is untouched.
    assert_eq!(spis(&b, true), [0x1001]);
}

#[test]
fn a_connection_without_outbound_sa_counts_its_drops() {
    let (mut a, mut b) = pair(Layers::Esp, true);
    let ch = a.del_sa(0x1002, Some(Protocol::Esp), None, None).unwrap();
    assert!(ch.warnings[0].contains("no_sa"), "{ch:?}");
    assert!(spis(&a, true).is_empty());
    for _ in 0..3 {
        assert!(!send_one(&mut a, &mut b));
    }
    assert_eq!(drops(&a), [("no_sa", 3)]);
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
    let d = a.outbound(&mut buf, T).unwrap_err();
    assert!(
        a.describe(&d)
            .to_string()
            .starts_with("10.1.0.5 -> 10.2.0.9 on connection \"peer\": no outbound ESP SA"),
        "{}",
        a.describe(&d)
    );
    // A new outbound SA (B accepts it first) restores the traffic.
    let spec = format!("spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}");
    b.add_sa("peer", false, &spec, T).unwrap();
    let ch = a.add_sa("peer", true, &spec, T).unwrap();
    assert!(
        ch.message.contains("added outbound ESP SA 0x00003001"),
        "{ch:?}"
    );
    assert!(send_one(&mut a, &mut b));
    // The last inbound SA removed: a warning, and unknown_spi drops.
    b.del_sa(0x1002, None, None, None).unwrap();
    let ch = b.del_sa(0x3001, None, None, None).unwrap();
    assert!(ch.warnings[0].contains("no inbound ESP SA left"), "{ch:?}");
    assert!(!send_one(&mut a, &mut b));
    assert_eq!(drops(&b), [("unknown_spi", 1)]);
}

#[test]
fn bad_sa_changes_are_refused_with_clear_errors() {
    let (mut a, _) = pair(Layers::Esp, true);
    let before: Vec<u32> = a.stats().sas().iter().map(|s| s.spi).collect();
    let good = format!("spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}");
    let err = |a: &mut Engine, conn: &str, out: bool, spec: &str| {
        a.add_sa(conn, out, spec, T).unwrap_err()
    };
    let e = err(&mut a, "nope", false, &good);
    assert!(
        e.contains("no connection named \"nope\"") && e.contains("\"peer\""),
        "{e}"
    );
    // The SPI of an installed SA, either direction.
    let e = err(&mut a, "peer", false, &good.replace("0x3001", "0x1001"));
    assert!(
        e.contains("SPI 0x00001001 is already in use") && e.contains("inbound"),
        "{e}"
    );
    let e = err(&mut a, "peer", true, &good.replace("0x3001", "0x1002"));
    assert!(
        e.contains("already in use") && e.contains("outbound"),
        "{e}"
    );
    let e = err(
        &mut a,
        "peer",
        false,
        "spi=0x3001,suite=aes128gcm16,enc=abc",
    );
    assert!(e.starts_with("bad SA spec: enc:"), "{e}");
    let e = err(
        &mut a,
        "peer",
        false,
        "spi=0x3001,suite=aes128gcm16,enc=0011",
    );
    assert!(e.contains("key must be 20 bytes"), "{e}");
    let e = err(&mut a, "peer", false, &format!("{good},mode=transport"));
    assert!(
        e.starts_with("mode=transport: connection \"peer\" is in tunnel mode"),
        "{e}"
    );
    let e = err(&mut a, "peer", false, &format!("{good},encap=none"));
    assert!(e.contains("uses encap udp"), "{e}");
    let e = err(
        &mut a,
        "peer",
        true,
        &format!("{good},src=192.0.2.2,dst=192.0.2.1"),
    );
    assert!(e.contains("go from 192.0.2.1 to 192.0.2.2"), "{e}");
    let e = err(&mut a, "peer", true, &format!("{good},dport=4501"));
    assert!(e.contains("UDP ports 4500 -> 4500"), "{e}");
    let e = err(&mut a, "peer", true, &format!("{good},seq=5"));
    assert!(e.contains("reserved on disk"), "{e}");
    let e = err(&mut a, "peer", false, &format!("{good},proto=ah"));
    assert!(e.contains("uses esp, not ah"), "{e}");
    // The outbound key in use, under another SPI: nonces would repeat.
    let e = err(
        &mut a,
        "peer",
        true,
        &format!("spi=0x3001,suite=aes128gcm16,enc={K_AB}"),
    );
    assert!(
        e.contains("which it would replace") && e.contains("new keys"),
        "{e}"
    );
    // Nothing changed.
    let after: Vec<u32> = a.stats().sas().iter().map(|s| s.spi).collect();
    assert_eq!(after, before);
    // Keys equal to the connection's are accepted.
    a.add_sa(
        "peer",
        false,
        &format!("{good},encap=udp,mode=tunnel,src=192.0.2.2,dst=192.0.2.1,sport=4500"),
        T,
    )
    .unwrap();
    assert_eq!(a.stats().sas().len(), 3);
    // sa del errors.
    let e = a.del_sa(0x4444, None, None, None).unwrap_err();
    assert!(e.contains("no SA with SPI 0x00004444"), "{e}");
    let e = a.del_sa(0x1001, None, Some(true), None).unwrap_err();
    assert!(e.contains("is not an outbound SA"), "{e}");
    let e = a.del_sa(0x1002, None, None, Some("other")).unwrap_err();
    assert!(e.contains("no connection named \"other\""), "{e}");
    let e = a
        .del_sa(0x1002, Some(Protocol::Ah), None, None)
        .unwrap_err();
    assert!(e.contains("no AH SA with SPI"), "{e}");
    assert_eq!(a.stats().sas().len(), 3);
}

#[test]
fn bundles_accept_any_inbound_sa_per_layer() {
    let (mut a, mut b) = pair(Layers::EspAh, false);
    let esp = format!("spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}");
    let e = b.add_sa("peer", false, &esp, T).unwrap_err();
    assert!(e.contains("say proto=esp or proto=ah"), "{e}");
    b.add_sa("peer", false, &format!("{esp},proto=esp"), T)
        .unwrap();
    a.add_sa("peer", true, &format!("{esp},proto=esp"), T)
        .unwrap();
    // New ESP inside the old AH.
    assert!(send_one(&mut a, &mut b), "{:?}", drops(&b));
    // Then a new AH too.
    let ah = format!("spi=0x3101,suite=sha256,integ={I_BA},proto=ah");
    b.add_sa("peer", false, &ah, T).unwrap();
    a.add_sa("peer", true, &ah, T).unwrap();
    assert_eq!(spis(&a, true), [0x3001, 0x3101]);
    assert!(send_one(&mut a, &mut b), "{:?}", drops(&b));
    // Without its AH layer, A sends nothing (no_sa), never ESP alone.
    a.del_sa(0x3101, None, None, None).unwrap();
    assert!(!send_one(&mut a, &mut b));
    assert_eq!(drops(&a), [("no_sa", 1)]);
    // A B-side SA (outbound at B) on an inbound packet is a mismatch.
    let (mut lone, _) = pair(Layers::Esp, false);
    assert!(!send_one(&mut lone, &mut b));
    assert_eq!(drops(&b), [("policy_mismatch", 1)]);
}

/// The SPI of the ESP-in-UDP packet worker `a` sends for one inner packet.
fn sent_spi(a: &mut Engine) -> u32 {
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
    assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)), "{:?}", drops(a));
    u32::from_be_bytes(buf.as_slice()[28..32].try_into().unwrap())
}

/// An AES-128-GCM ESP SA of "peer" as IKE negotiates it, without ESN.
fn gcm_child<'a>(
    outbound: bool,
    spi: u32,
    key: &'a [u8],
    slot: u32,
    selectors: &'a [espgate_core::selector::TrafficSelector],
) -> NegotiatedSa<'a> {
    NegotiatedSa {
        conn: "peer",
        outbound,
        protocol: Protocol::Esp,
        spi,
        suite: "aes128gcm16".parse().unwrap(),
        enc_key: key,
        integ_key: &[],
        esn: false,
        encap: None,
        peer: None,
        slot,
        selectors,
    }
}

#[test]
fn negotiated_per_cpu_sas_replace_only_their_own_slot() {
    // Two workers on a per-CPU connection (RFC 9611 children, as IKE
    // installs them): each negotiated outbound SA takes its slot, worker w
    // sends on slot w, and a rekey of one slot leaves the other alone.
    let mut spec = side(true, shaped(Layers::Esp, true, 2, 0x2000));
    spec.negotiated = ike_sized();
    let mut aw = Engine::for_workers(&[spec], &opts(), T, 2).unwrap();
    assert_eq!(
        (sent_spi(&mut aw[0]), sent_spi(&mut aw[1])),
        (0x2000, 0x2001)
    );
    let keys: Vec<Vec<u8>> = (1..=4u8).map(|k| vec![k; 20]).collect();
    let install = |aw: &mut [Engine], spi, slot, k: usize| {
        let mut refs: Vec<&mut Engine> = aw.iter_mut().collect();
        let sa = gcm_child(true, spi, &keys[k], slot, &[]);
        install_negotiated_all(&mut refs, &sa, T).unwrap()
    };
    let ch = install(&mut aw, 0x4001, 1, 0);
    assert!(ch.message.contains("replaces ESP SA 0x00002001"), "{ch:?}");
    // Two pairs are two SAs of one layer, not a bundle of two: the TUN
    // MTU sized at start still holds, so no warning.
    assert!(ch.warnings.is_empty(), "{ch:?}");
    assert_eq!(
        (sent_spi(&mut aw[0]), sent_spi(&mut aw[1])),
        (0x2000, 0x4001)
    );
    install(&mut aw, 0x4000, 0, 1);
    assert_eq!(
        (sent_spi(&mut aw[0]), sent_spi(&mut aw[1])),
        (0x4000, 0x4001)
    );
    // The rekey of slot 1.
    let ch = install(&mut aw, 0x4011, 1, 2);
    assert!(ch.message.contains("replaces ESP SA 0x00004001"), "{ch:?}");
    assert_eq!(
        (sent_spi(&mut aw[0]), sent_spi(&mut aw[1])),
        (0x4000, 0x4011)
    );
    assert_eq!(spis(&aw[0], true), [0x4000, 0x4011]);
    // Slot 1 deleted (the peer deleted that child): both workers send on
    // the slot that is left.
    let mut refs: Vec<&mut Engine> = aw.iter_mut().collect();
    del_sa_all(&mut refs, 0x4011, None, Some(true), None).unwrap();
    assert_eq!(
        (sent_spi(&mut aw[0]), sent_spi(&mut aw[1])),
        (0x4000, 0x4000)
    );
    // Without per-CPU SAs every negotiated SA replaces the one outbound SA
    // whatever slot it names.
    let mut plain = side(true, shaped(Layers::Esp, true, 1, 0x2000));
    plain.negotiated = ike_sized();
    let mut one = vec![Engine::new(&[plain], &opts(), T).unwrap()];
    install(&mut one, 0x4021, 1, 3);
    assert_eq!(spis(&one[0], true), [0x4021]);
}

#[test]
fn negotiated_sas_take_the_connection_shape() {
    let (mut a, mut b) = pair(Layers::Esp, true);
    let key = hex(K_NEW_AB);
    let sa = |outbound| NegotiatedSa {
        conn: "peer",
        outbound,
        spi: 0x4001,
        suite: "aes128gcm16".parse().unwrap(),
        enc_key: &key,
        integ_key: &[],
        esn: true,
        encap: None,
        peer: None,
        protocol: Protocol::Esp,
        slot: 0,
        selectors: &[],
    };
    b.install_negotiated(&sa(false), T).unwrap();
    let ch = a.install_negotiated(&sa(true), T).unwrap();
    assert!(ch.message.contains("replaces ESP SA 0x00001002"), "{ch:?}");
    assert!(send_one(&mut a, &mut b), "{:?}", drops(&b));
    let out = entry(&a, true);
    assert!(out.added && out.esn && out.spi == 0x4001);
    assert_eq!(out.encap, Encap::NAT_T);
    let e = a.install_negotiated(
        &NegotiatedSa {
            conn: "x",
            ..sa(true)
        },
        T,
    );
    assert!(e.unwrap_err().contains("no connection named \"x\""));
}

/// The outer IPv4 header's destination address and UDP ports of `buf`,
/// after checking the header's checksum.
fn outer_dst(buf: &PacketBuf) -> (std::net::IpAddr, u16, u16) {
    let p = buf.as_slice();
    let sum: u32 = p[..20]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    assert_eq!(
        (folded & 0xffff) + (folded >> 16),
        0xffff,
        "header checksum"
    );
    let be = |i: usize| u16::from_be_bytes([p[i], p[i + 1]]);
    let dst = std::net::Ipv4Addr::new(p[16], p[17], p[18], p[19]);
    (dst.into(), be(20), be(22))
}

#[test]
fn a_peer_behind_a_nat_is_sent_to_where_ike_found_it() {
    // IKE saw the peer at port 31000 of its NAT: the negotiated SA, the
    // outer header the engine builds and the address the shell's
    // keepalives use all say 31000, not the configured 4500.
    let (mut a, mut b) = pair(Layers::Esp, true);
    let at = |ip: &str, port| std::net::SocketAddr::new(ip.parse().unwrap(), port);
    assert_eq!(a.peer_udp(0), Some(at("192.0.2.2", 4500)));
    let key = hex(K_NEW_AB);
    let sa = NegotiatedSa {
        encap: Some((4500, 31000)),
        ..gcm_child(true, 0x4001, &key, 0, &[])
    };
    a.install_negotiated(&sa, T).unwrap();
    assert_eq!(a.peer_udp(0), Some(at("192.0.2.2", 31000)));
    let mut buf = PacketBuf::with_capacity(2000);
    let send = |a: &mut Engine, buf: &mut PacketBuf| {
        buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
        assert_eq!(a.outbound(buf, T), Ok(Some(0)), "{:?}", drops(a));
        outer_dst(buf)
    };
    assert_eq!(
        send(&mut a, &mut buf),
        ("192.0.2.2".parse().unwrap(), 4500, 31000)
    );
    assert_eq!(a.peer_udp(1), None, "no such connection");
    let (raw, _) = pair(Layers::Esp, false);
    assert_eq!(raw.peer_udp(0), None, "raw ESP has no port");

    // The NAT maps the peer anew, from another public address and port:
    // the outbound SA sends there (its outer header built again, and B
    // still opens it), and the published entries (`sa list`, the kernel
    // filter, wireshark-keys) say so both ways.
    let key_in = hex(K_BA);
    let inbound = NegotiatedSa {
        encap: Some((4500, 31000)),
        ..gcm_child(false, 0x4002, &key_in, 0, &[])
    };
    a.install_negotiated(&inbound, T).unwrap();
    b.install_negotiated(&gcm_child(false, 0x4001, &key, 0, &[]), T)
        .unwrap();
    let moved = at("192.0.2.7", 32000);
    assert_eq!(a.set_peer("peer", moved), Ok(1));
    assert_eq!(a.set_peer("peer", moved), Ok(0), "once");
    assert_eq!(a.peer_udp(0), Some(moved));
    assert_eq!(send(&mut a, &mut buf), (moved.ip(), 4500, 32000));
    let from = moved.ip();
    assert_eq!(
        b.inbound(&mut buf, T, from),
        Ok(Received::Packet),
        "{:?}",
        drops(&b)
    );
    let ports = |spi| {
        let sas = a.stats().sas();
        sas.iter().find(|s| s.spi == spi).map(|s| s.encap)
    };
    let udp = |src_port, dst_port| Some(Encap::Udp { src_port, dst_port });
    assert_eq!(ports(0x4001), udp(4500, 32000));
    assert_eq!(ports(0x4002), udp(32000, 4500), "inbound: peer's first");
    let mut filter = Vec::new();
    a.udp_inbound_sas(&mut filter);
    assert!(filter.contains(&(0x4002, moved.ip())), "{filter:?}");
    let keys = a.sa_keys();
    let k = keys.iter().find(|k| k.config.spi == 0x4001).unwrap();
    assert_eq!(k.dst, moved.ip());

    // An IPv4-mapped address is the IPv4 one; the other family cannot be
    // followed (the outer header would change size) and changes nothing.
    let mapped = at("::ffff:192.0.2.8", 33000);
    assert_eq!(a.set_peer("peer", mapped), Ok(1));
    let moved = at("192.0.2.8", 33000);
    assert_eq!(a.peer_udp(0), Some(moved));
    let e = a.set_peer("peer", at("2001:db8::8", 4500)).unwrap_err();
    assert!(e.contains("not of the family of its remote"), "{e}");
    assert_eq!(a.peer_udp(0), Some(moved));
    assert!(a.set_peer("nobody", moved).is_err());

    // A rekey with the moved peer keeps sending where IKE found it.
    let key_new = hex(K_AB);
    let rekeyed = NegotiatedSa {
        encap: Some((4500, 33000)),
        peer: Some(moved.ip()),
        ..gcm_child(true, 0x4003, &key_new, 0, &[])
    };
    a.install_negotiated(&rekeyed, T).unwrap();
    assert_eq!(send(&mut a, &mut buf), (moved.ip(), 4500, 33000));
}

/// A and B as IKE keys them (`negotiated` not empty) over raw IP, with
/// their first negotiated pair in place: ESP, A sending on 0x1002.
fn ike_pair() -> (Engine, Engine) {
    let shape = Shape::new(Layers::Esp, false);
    let o = EngineOptions {
        classifier: Classifier::NAT_T.qesp(253),
        ..opts()
    };
    let mut sa = side(true, shape);
    let mut sb = side(false, shape);
    sa.negotiated = ike_sized();
    sb.negotiated = ike_sized();
    (
        Engine::new(&[sa], &o, T).unwrap(),
        Engine::new(&[sb], &o, T).unwrap(),
    )
}

fn layers_of(e: &Engine) -> Layers {
    e.connections().next().unwrap().layers
}

#[test]
fn negotiated_qesp_switches_the_layer_and_keeps_the_esp_overlap() {
    let (mut a, mut b) = ike_pair();
    let (k_ab, k_ba) = (hex(K_NEW_AB), hex(K_AB));
    let negotiated = |outbound, protocol, spi, key| NegotiatedSa {
        protocol,
        ..gcm_child(outbound, spi, key, 0, &[])
    };
    // An ESP packet of the old pair, held back (the rekey overlap).
    let mut late = PacketBuf::with_capacity(2000);
    late.load(&udp4("10.1.0.5", "10.2.0.9", 10));
    assert_eq!(a.outbound(&mut late, T), Ok(Some(0)));
    // The rekey negotiated Q-ESP: inbound first at B, then A sends on it.
    b.install_negotiated(&negotiated(false, Protocol::Qesp, 0x5001, &k_ab), T)
        .unwrap();
    assert_eq!(layers_of(&b), Layers::Esp, "inbound SAs switch nothing");
    let ch = a
        .install_negotiated(&negotiated(true, Protocol::Qesp, 0x5001, &k_ab), T)
        .unwrap();
    assert!(ch.message.contains("replaces ESP SA 0x00001002"), "{ch:?}");
    assert_eq!(layers_of(&a), Layers::Qesp);
    let outs: Vec<(Protocol, u32)> = a
        .stats()
        .sas()
        .iter()
        .filter(|s| s.outbound)
        .map(|s| (s.protocol, s.spi))
        .collect();
    assert_eq!(outs, [(Protocol::Qesp, 0x5001)], "one outbound SA, Q-ESP");
    // A's packets are Q-ESP on IP protocol 253, accepted by B (still ESP
    // by its layers) on its Q-ESP inbound SA.
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
    assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)));
    assert_eq!(buf.as_slice()[9], 253);
    assert_eq!(
        b.inbound(&mut buf, T, from_a()),
        Ok(Received::Packet),
        "{:?}",
        drops(&b)
    );
    // B switches too; then the held ESP packet on the old inbound SA is
    // still B's bundle, not a policy mismatch.
    a.install_negotiated(&negotiated(false, Protocol::Qesp, 0x5002, &k_ba), T)
        .unwrap();
    b.install_negotiated(&negotiated(true, Protocol::Qesp, 0x5002, &k_ba), T)
        .unwrap();
    assert_eq!(layers_of(&b), Layers::Qesp);
    assert_eq!(
        b.inbound(&mut late, T, from_a()),
        Ok(Received::Packet),
        "{:?}",
        drops(&b)
    );
    assert!(drops(&b).is_empty(), "{:?}", drops(&b));
    // B to A on Q-ESP both ways.
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&udp4("10.2.0.9", "10.1.0.5", 10));
    assert_eq!(b.outbound(&mut buf, T), Ok(Some(0)));
    assert_eq!(
        a.inbound(&mut buf, T, B.into()),
        Ok(Received::Packet),
        "{:?}",
        drops(&a)
    );
    // The old ESP inbound SA goes; the Q-ESP one is left, no warning.
    let ch = b
        .del_sa(0x1002, Some(Protocol::Esp), Some(false), None)
        .unwrap();
    assert!(ch.warnings.is_empty(), "{ch:?}");
    // A rekey may fall back to ESP: the layer switches back.
    a.install_negotiated(&negotiated(true, Protocol::Esp, 0x6001, &k_ba), T)
        .unwrap();
    assert_eq!(layers_of(&a), Layers::Esp);
    assert_eq!(spis(&a, true), [0x6001]);
    // IKE never negotiates AH.
    let e = a
        .install_negotiated(&negotiated(true, Protocol::Ah, 0x7001, &k_ab), T)
        .unwrap_err();
    assert!(e.contains("not AH"), "{e}");
}

#[test]
fn manually_keyed_connections_keep_esp_and_qesp_apart() {
    // Without IKE (negotiated_overhead 0) a Q-ESP SA is not the ESP layer:
    // it is not installed on an ESP connection, which keeps sending ESP.
    let o = EngineOptions {
        classifier: Classifier::NAT_T.qesp(253),
        ..opts()
    };
    let shape = Shape::new(Layers::Esp, false);
    let mut a = Engine::new(&[side(true, shape)], &o, T).unwrap();
    let mut b = Engine::new(&[side(false, shape)], &o, T).unwrap();
    let key = hex(K_NEW_AB);
    let q = |outbound| NegotiatedSa {
        conn: "peer",
        outbound,
        protocol: Protocol::Qesp,
        spi: 0x5001,
        suite: "aes128gcm16".parse().unwrap(),
        enc_key: &key,
        integ_key: &[],
        esn: false,
        encap: None,
        peer: None,
        slot: 0,
        selectors: &[],
    };
    let e = a.install_negotiated(&q(true), T).unwrap_err();
    assert!(
        e.contains("applies esp: a negotiated QESP SA does not fit it"),
        "{e}"
    );
    assert_eq!(layers_of(&a), Layers::Esp);
    assert!(send_one(&mut a, &mut b), "{:?}", drops(&b));
}

#[test]
fn wireshark_keys_are_every_sa_with_its_addresses() {
    let (mut a, _) = pair(Layers::Esp, true);
    a.add_sa(
        "peer",
        false,
        &format!(
            "spi=0x3001,suite=aes256-sha1,enc={},integ={}",
            &I_AB[..64],
            &I_BA[..40]
        ),
        T,
    )
    .unwrap();
    let got: Vec<(bool, u32, String, String, String, String)> = a
        .sa_keys()
        .iter()
        .map(|k| {
            (
                k.outbound,
                k.config.spi,
                k.src.to_string(),
                k.dst.to_string(),
                k.config.suite.name(),
                ::hex::encode(&k.config.enc_key[..]),
            )
        })
        .collect();
    let s = |x: &str| x.to_string();
    assert_eq!(
        got,
        [
            (
                false,
                0x1001,
                s("192.0.2.2"),
                s("192.0.2.1"),
                s("aes128gcm16"),
                s(K_BA)
            ),
            (
                false,
                0x3001,
                s("192.0.2.2"),
                s("192.0.2.1"),
                s("aes256-sha1"),
                s(&I_AB[..64])
            ),
            (
                true,
                0x1002,
                s("192.0.2.1"),
                s("192.0.2.2"),
                s("aes128gcm16"),
                s(K_AB)
            ),
        ]
    );
    let keys = a.sa_keys();
    assert_eq!(::hex::encode(&keys[1].config.integ_key[..]), &I_BA[..40]);
    assert!(!format!("{:?}", keys[0]).contains(K_BA), "no keys in Debug");
}

#[test]
fn unicast_filter() {
    let f = |s: &str, d: &str| Flow {
        src: s.parse().unwrap(),
        dst: d.parse().unwrap(),
        proto: 17,
        sport: None,
        dport: None,
    };
    assert!(is_unicast(&f("10.1.0.1", "10.2.0.1")));
    assert!(is_unicast(&f("0.0.0.0", "10.2.0.1")));
    assert!(!is_unicast(&f("10.1.0.1", "255.255.255.255")));
    assert!(!is_unicast(&f("10.1.0.1", "239.1.1.1")));
    assert!(!is_unicast(&f("fe80::1", "2001:db8::1")));
    assert!(!is_unicast(&f("::", "ff02::16")));
    assert!(is_unicast(&f("2001:db8::1", "2001:db8:2::1")));
}

#[test]
fn a_learnt_path_mtu_answers_oversized_packets_with_icmp_too_big() {
    let (mut a, mut b) = pair(Layers::Esp, false);
    let big = udp4("10.1.0.5", "10.2.0.9", 1400);
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&big);
    assert_eq!(
        a.outbound(&mut buf, T),
        Ok(Some(0)),
        "no path MTU known yet"
    );
    // The kernel refused a send: the path to B carries 1300 bytes.
    let room = a.note_path_mtu(0, 1300, T).unwrap();
    // Raw ESP, AES-128-GCM: 20 + 8 + 8 + 16 fixed, 1248 bytes (78 AES
    // blocks) of packet, padding and trailer: 1246.
    assert_eq!((room, a.tun_mtu(1300)), (1246, 1246));
    assert_eq!(a.path_mtu(0, T), Some(1300));
    buf.load(&big);
    let d = a.outbound(&mut buf, T).unwrap_err();
    assert_eq!(d.reason, DropReason::PathMtu);
    assert!(d.reply, "the buffer holds the ICMP for the sender");
    let icmp = buf.as_slice();
    let info = ip::parse(icmp).unwrap();
    assert_eq!(info.protocol, 1);
    assert_eq!(
        (info.src.to_string(), info.dst.to_string()),
        ("10.2.0.9".into(), "10.1.0.5".into())
    );
    let m = &icmp[20..];
    assert_eq!(
        &m[..2],
        &[3, 4],
        "destination unreachable, fragmentation needed"
    );
    assert_eq!(u32::from(u16::from_be_bytes([m[6], m[7]])), room);
    assert_eq!(
        &m[8..36],
        &big[..28],
        "the refused packet's header is quoted"
    );
    assert_eq!(a.stats().counters.icmp_too_big.get(), 1);
    assert_eq!(drops(&a), vec![("path_mtu_exceeded", 1)]);
    // What fits still goes, and so does an oversized packet without DF
    // (its outer packet is fragmented on the way).
    buf.load(&udp4("10.1.0.5", "10.2.0.9", room as usize - 27));
    assert_eq!(
        a.outbound(&mut buf, T).unwrap_err().reason,
        DropReason::PathMtu
    );
    buf.load(&udp4("10.1.0.5", "10.2.0.9", room as usize - 28));
    assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)));
    assert_eq!(
        buf.len(),
        1300,
        "the packet that fits fills the path exactly"
    );
    assert_eq!(b.inbound(&mut buf, T, from_a()), Ok(Received::Packet));
    let mut no_df = big.clone();
    no_df[6] &= !0x40;
    no_df[10..12].copy_from_slice(&[0, 0]);
    let c = espgate_core::wire::checksum::checksum(&no_df[..20]);
    no_df[10..12].copy_from_slice(&c.to_be_bytes());
    buf.load(&no_df);
    assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)));
    // ICMP errors are rate-limited: 100 per second, then refusals alone
    // (two answered so far).
    let mut replies = 2;
    for _ in 0..150 {
        buf.load(&big);
        replies += u32::from(a.outbound(&mut buf, T).unwrap_err().reply);
    }
    assert_eq!(replies, ICMP_PER_SECOND);
    buf.load(&big);
    assert!(
        a.outbound(&mut buf, T + Duration::from_secs(1))
            .unwrap_err()
            .reply,
        "a new second"
    );
    // The learnt MTU ages out: full-size packets are tried again.
    let later = T + PATH_MTU_AGE;
    assert_eq!(a.path_mtu(0, later), None);
    buf.load(&big);
    assert_eq!(a.outbound(&mut buf, later), Ok(Some(0)));
}

/// The SPI A sends a packet to `dst` on, or the drop.
fn sent_to(a: &mut Engine, dst: &str) -> Result<u32, DropReason> {
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&udp4("10.1.0.5", dst, 10));
    match a.outbound(&mut buf, T) {
        Ok(Some(0)) => Ok(u32::from_be_bytes(
            buf.as_slice()[28..32].try_into().unwrap(),
        )),
        Ok(other) => panic!("sent on connection {other:?}"),
        Err(d) => Err(d.reason),
    }
}

#[test]
fn children_with_narrowed_selectors_each_carry_their_own_traffic() {
    // The peer agreed to two children inside the connection's 10.1/16 ===
    // 10.2/16, one for 10.2.1/24 and one for 10.2.2/24: each outbound SA
    // carries its own traffic, a rekey replaces only its own child, and
    // what no child covers is dropped as no_sa (the peer would drop it).
    let (mut a, mut b) = pair(Layers::Esp, true);
    let sel = |l: &str, r: &str| {
        espgate_core::selector::TrafficSelector::between(l.parse().unwrap(), r.parse().unwrap())
    };
    let x = [sel("10.1.0.0/16", "10.2.1.0/24")];
    let y = [sel("10.1.0.0/16", "10.2.2.0/24")];
    let keys: Vec<Vec<u8>> = (1..=6u8).map(|k| vec![k; 20]).collect();
    let child =
        |outbound, spi, k: usize, selectors| gcm_child(outbound, spi, &keys[k], 0, selectors);
    // The configured pair carries everything until it goes.
    assert_eq!(sent_to(&mut a, "10.2.3.9"), Ok(0x1002));
    let ch = a
        .install_negotiated(&child(true, 0x5001, 0, &x), T)
        .unwrap();
    assert!(ch.message.contains("added outbound ESP SA"), "{ch:?}");
    a.install_negotiated(&child(true, 0x5002, 1, &y), T)
        .unwrap();
    assert_eq!(sent_to(&mut a, "10.2.1.9"), Ok(0x5001));
    assert_eq!(sent_to(&mut a, "10.2.2.9"), Ok(0x5002));
    assert_eq!(sent_to(&mut a, "10.2.3.9"), Ok(0x1002));
    a.del_sa(0x1002, None, Some(true), None).unwrap();
    assert_eq!(sent_to(&mut a, "10.2.3.9"), Err(DropReason::NoSa));
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&udp4("10.1.0.5", "10.2.3.9", 10));
    let d = a.outbound(&mut buf, T).unwrap_err();
    let said = a.describe(&d).to_string();
    assert!(
        said.contains("outside the traffic selectors the peer agreed to"),
        "{said}"
    );
    assert_eq!(
        sent_to(&mut a, "10.2.1.9"),
        Ok(0x5001),
        "the children still send"
    );
    // A rekey of X replaces X's SA only.
    let ch = a
        .install_negotiated(&child(true, 0x5003, 2, &x), T)
        .unwrap();
    assert!(ch.message.contains("replaces ESP SA 0x00005001"), "{ch:?}");
    assert_eq!(sent_to(&mut a, "10.2.1.9"), Ok(0x5003));
    assert_eq!(sent_to(&mut a, "10.2.2.9"), Ok(0x5002));
    // Y deleted: its traffic has no SA, X's still has.
    a.del_sa(0x5002, None, Some(true), None).unwrap();
    assert_eq!(sent_to(&mut a, "10.2.2.9"), Err(DropReason::NoSa));
    assert_eq!(sent_to(&mut a, "10.2.1.9"), Ok(0x5003));
    // A child with the configured selectors (listed as given) is the
    // connection's own group again: it carries what X does not.
    let all = [sel("10.1.0.0/16", "10.2.0.0/16")];
    a.install_negotiated(&child(true, 0x5004, 3, &all), T)
        .unwrap();
    assert_eq!(sent_to(&mut a, "10.2.2.9"), Ok(0x5004));
    assert_eq!(
        sent_to(&mut a, "10.2.1.9"),
        Ok(0x5003),
        "the narrower child first"
    );

    // B accepts on an inbound SA only what its selectors cover: a packet
    // for 10.2.2/24 on X's SA (from an A that sends all on it) is refused.
    let bx = [sel("10.2.1.0/24", "10.1.0.0/16")];
    b.install_negotiated(&child(false, 0x5003, 2, &bx), T)
        .unwrap();
    let (mut wide, _) = pair(Layers::Esp, true);
    wide.install_negotiated(&child(true, 0x5003, 2, &[]), T)
        .unwrap();
    for (dst, ok) in [("10.2.1.9", true), ("10.2.2.9", false)] {
        let mut buf = PacketBuf::with_capacity(2000);
        buf.load(&udp4("10.1.0.5", dst, 10));
        assert_eq!(wide.outbound(&mut buf, T), Ok(Some(0)));
        let r = b.inbound(&mut buf, T, from_a());
        assert_eq!(r.is_ok(), ok, "{dst}: {r:?}");
    }
    assert_eq!(drops(&b), [("selector_mismatch", 1)]);
}

/// What the configuration sizes an IKE connection for before its first
/// child SA: here one suite adding 100 bytes.
fn ike_sized() -> Vec<Growth> {
    vec![Growth {
        fixed: 98,
        trailer: 2,
        align: 1,
    }]
}

#[test]
fn the_tun_mtu_is_the_longest_packet_each_bundle_keeps_within_the_outer_mtu() {
    // A packet of the TUN MTU leaves within the outer MTU, one byte more
    // does not: the padding is counted exactly, not at its worst.
    let outer_len = |a: &mut Engine, len: usize| {
        let mut buf = PacketBuf::with_capacity(10_000);
        buf.load(&udp4("10.1.0.5", "10.2.0.9", len - 28));
        assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)), "{:?}", drops(a));
        buf.len()
    };
    for (layers, udp) in [
        (Layers::Esp, true),
        (Layers::Esp, false),
        (Layers::Qesp, false),
        (Layers::Ah, false),
        (Layers::EspAh, false),
    ] {
        for per_cpu in [1, 2] {
            if per_cpu == 2 && layers != Layers::Esp {
                continue;
            }
            let spec = [side(true, shaped(layers, udp, per_cpu, 0x2000))];
            let mut aw = Engine::for_workers(&spec, &opts(), T, per_cpu as usize).unwrap();
            for mtu in [1500u16, 1499, 1497, 1400, 1280, 9000] {
                for a in &mut aw {
                    let what = format!("{layers:?} udp={udp} per_cpu={per_cpu} mtu={mtu}");
                    let fit = a.tun_mtu(mtu) as usize;
                    assert!(outer_len(a, fit) <= usize::from(mtu), "{what}");
                    assert!(outer_len(a, fit + 1) > usize::from(mtu), "{what}");
                    assert!(fit + a.max_overhead() >= usize::from(mtu), "{what}");
                }
            }
        }
    }
    // AES-128-GCM in UDP over IPv4, by hand: 20 + 8 + 8 + 8 (IPv4, UDP,
    // ESP header, IV) + 16 (ICV) = 60 fixed; the 1440 left are 90 AES
    // blocks of packet, padding and the 2-byte trailer: 1438.
    let (a, _) = pair(Layers::Esp, true);
    assert_eq!(a.tun_mtu(1500), 1438);
    // Two per-CPU pairs are not a bundle of two.
    let two = Engine::new(
        &[side(true, shaped(Layers::Esp, true, 2, 0x2000))],
        &opts(),
        T,
    );
    assert_eq!(two.unwrap().tun_mtu(1500), 1438);
}

/// TFC padding (RFC 4303 §2.4) brings every inner packet up to
/// `tfc_pad_to`, but never beyond the longest packet the bundle keeps
/// within the path: `65535` makes every outer packet exactly as long as
/// the longest one (the lengths tell an observer nothing), and none
/// exceeds `gateway.mtu` or a path MTU learnt later. The receiver strips
/// the padding.
#[test]
fn tfc_padding_fills_the_path_and_never_exceeds_it() {
    let seal = |a: &mut Engine, b: &mut Engine, len: usize| {
        let clear = udp4("10.1.0.5", "10.2.0.9", len - 28);
        let mut buf = PacketBuf::with_capacity(70_000);
        buf.load(&clear);
        assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)), "{:?}", drops(a));
        let outer = buf.len();
        assert_eq!(
            b.inbound(&mut buf, T, from_a()),
            Ok(Received::Packet),
            "{len}: {:?}",
            drops(b)
        );
        assert_eq!(
            buf.as_slice(),
            &clear[..],
            "the receiver strips the padding"
        );
        outer
    };
    for (layers, udp) in [
        (Layers::Esp, true),
        (Layers::Esp, false),
        (Layers::Qesp, false),
        (Layers::EspAh, false),
    ] {
        for pad_to in [65535u16, 1000] {
            let what = format!("{layers:?} udp={udp} tfc_pad_to={pad_to}");
            let shape = Shape::new(layers, udp);
            let [mut sa, mut sb] = [side(true, shape), side(false, shape)];
            for sc in sa.outbound.iter_mut().chain(&mut sb.outbound) {
                if sc.protocol != Protocol::Ah {
                    sc.tfc_pad_to = Some(pad_to);
                }
            }
            let mut a = Engine::new(&[sa], &opts(), T).unwrap();
            let b_opts = EngineOptions {
                classifier: Classifier::NAT_T.qesp(253),
                ..opts()
            };
            let mut b = Engine::new(&[sb], &b_opts, T).unwrap();
            let mtu = usize::from(opts().mtu);
            let fit = a.tun_mtu(opts().mtu) as usize;
            let target = usize::from(pad_to).min(fit);
            let capped: Vec<_> = (pad_to > 1000)
                .then_some(("peer", pad_to, fit))
                .into_iter()
                .collect();
            assert_eq!(a.tfc_capped(), capped, "{what}");
            let padded = seal(&mut a, &mut b, target);
            assert!(padded <= mtu, "{what}: {padded}");
            for len in [28, 29, 100, 577, 999, target] {
                assert_eq!(seal(&mut a, &mut b, len), padded, "{what}: {len} bytes");
            }
            if pad_to == 65535 {
                // Tunnel-mode padding is exact: the longest packet fills
                // the path to within one padding block.
                assert!(seal(&mut a, &mut b, fit) + 16 > mtu, "{what}");
            } else {
                // Longer packets are not padded further (one padding
                // block longer leaves one block longer).
                assert_eq!(seal(&mut a, &mut b, 1016), padded + 16, "{what}");
            }
            // A narrower path learnt later narrows the padding with it.
            let narrow = a.note_path_mtu(0, 1300, T).unwrap() as usize;
            for len in [28, 500, narrow.min(usize::from(pad_to))] {
                let outer = seal(&mut a, &mut b, len);
                assert!(outer <= 1300, "{what}: {len} bytes leave as {outer}");
                if pad_to == 65535 {
                    assert!(outer + 16 > 1300, "{what}: {len} bytes leave as {outer}");
                }
            }
        }
    }
    // An SA installed at run time (`espgate sa add`, and IKE's children
    // the same way) is capped as it is installed.
    let (mut a, _) = pair(Layers::Esp, true);
    let spec = format!("spi=0x3003,suite=aes128gcm16,enc={K_NEW_AB},proto=esp,tfc=65535");
    let ch = a.add_sa("peer", true, &spec, T).unwrap();
    let fit = a.tun_mtu(opts().mtu);
    // The operator's answer (and the log line) says where it stops.
    assert!(
        ch.message
            .ends_with(&format!("TFC padding stops at {fit} bytes, the longest packet its bundle keeps within the path (tfc_pad_to = 65535)")),
        "{}",
        ch.message
    );
    let mut buf = PacketBuf::with_capacity(70_000);
    buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
    assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)), "{:?}", drops(&a));
    assert_eq!(buf.len(), 1500);
    // A pad that fits is not mentioned.
    let spec = format!(
        "spi=0x3004,suite=aes128gcm16,enc={},proto=esp,tfc=1000",
        "6a".repeat(20)
    );
    let ch = a.add_sa("peer", true, &spec, T).unwrap();
    assert!(!ch.message.contains("TFC"), "{}", ch.message);
}

#[test]
fn an_sa_that_fits_less_than_the_tun_mtu_is_installed_with_a_warning() {
    let (mut a, _) = pair(Layers::Esp, true);
    // AES-256-CBC with HMAC-SHA-512: 16-byte IV and blocks, 32-byte ICV.
    let (enc, integ) = ("11".repeat(32), "22".repeat(64));
    let cbc = format!("spi=0x3001,suite=aes256-sha512,enc={enc},integ={integ},proto=esp");
    let ch = a.add_sa("peer", true, &cbc, T).unwrap();
    // 20 + 8 + 8 + 16 + 32 = 84 fixed, 1408 of body (88 blocks) less 2.
    let w = ch.warnings.join("\n");
    assert!(
        w.contains(
            "packets of up to 1406 bytes within gateway.mtu 1500, 32 fewer than the TUN MTU (1438)"
        ),
        "{ch:?}"
    );
    // An SA of the suite the TUN was sized for: no warning.
    let gcm = format!("spi=0x3002,suite=aes128gcm16,enc={K_NEW_AB},proto=esp");
    let ch = a.add_sa("peer", true, &gcm, T).unwrap();
    assert!(ch.warnings.is_empty(), "{ch:?}");
    // Sized for IKE's proposals, a negotiated SA of one of them does not
    // warn either.
    let aes_gcm: espgate_core::crypto::Suite = "aes128gcm16".parse().unwrap();
    let mut spec = side(true, Shape::new(Layers::Esp, true));
    spec.negotiated = vec![Growth::esp(
        Mode::Tunnel,
        false,
        true,
        Protocol::Esp,
        &aes_gcm,
    )];
    let mut ike = Engine::new(&[spec], &opts(), T).unwrap();
    assert_eq!(ike.tun_mtu(1500), 1438);
    let key = hex(K_NEW_AB);
    let ch = ike.install_negotiated(&gcm_child(true, 0x4001, &key, 0, &[]), T);
    assert!(ch.unwrap().warnings.is_empty());
}
