//! The engine's packet paths allocate nothing — drop paths included: a
//! flood of bad packets costs a counter increment per packet, never a heap
//! allocation (the context of a drop is a copyable value, formatted only
//! when the shell writes a log line).
//!
//! A counting global allocator counts this thread's allocations while
//! packets go through every path: forwarded both ways, and dropped for no
//! policy, no SA, a replay, an ICV failure, an unknown SPI, an expired
//! SA, an incomplete bundle, garbage, plus keepalives, IKE and multicast.

use espgate_core::gateway::{Engine, Layers, Received};
use espgate_core::{DropReason, PacketBuf};
use espgate_testkit::{from_a, opts, side, udp4, Shape};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    // Per thread: tests run in parallel and must not count each other's.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// wrapper only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: forwarded as is.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ON.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: forwarded as is.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    ON.with(|c| c.set(true));
    f();
    ON.with(|c| c.set(false));
    ALLOCS.with(Cell::get) - before
}

const T: Duration = Duration::from_secs(1);

fn engine(a: bool, shape: Shape) -> Engine {
    Engine::new(&[side(a, shape)], &opts(), T).unwrap()
}

#[test]
fn packet_paths_allocate_nothing_even_when_they_drop() {
    let esp = Shape::new(Layers::Esp, true);
    let (mut a, mut b) = (engine(true, esp), engine(false, esp));
    let mut bundle_b = engine(false, Shape::new(Layers::EspAh, false));
    let mut raw_a = engine(true, Shape::new(Layers::Esp, false));
    let mut no_sa = engine(true, esp);
    no_sa.del_sa(0x1002, None, None, None).unwrap();
    let mut expiring = {
        let mut c = side(true, esp);
        for sc in &mut c.outbound {
            sc.lifetime.hard_packets = Some(1);
        }
        Engine::new(&[c], &opts(), T).unwrap()
    };

    // The outer packets the floods will replay, made before counting.
    let clear = udp4("10.1.0.5", "10.2.0.9", 100);
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&clear);
    a.outbound(&mut buf, T).unwrap();
    let seen = buf.as_slice().to_vec();
    b.inbound(&mut buf, T, from_a()).unwrap();
    // A number ahead of the window (not a replay) with a broken ICV.
    let mut bad_icv = seen.clone();
    bad_icv[32..36].copy_from_slice(&0x0010_0000u32.to_be_bytes());
    let n = bad_icv.len();
    bad_icv[n - 1] ^= 1;
    let mut unknown_spi = seen.clone();
    unknown_spi[31] ^= 0x40;
    // ESP alone where B wants ESP inside AH: fresh numbers each, so each
    // passes the replay check and fails the bundle check.
    let lone_esp: Vec<Vec<u8>> = (0..200)
        .map(|_| {
            buf.load(&clear);
            raw_a.outbound(&mut buf, T).unwrap();
            buf.as_slice().to_vec()
        })
        .collect();
    buf.load(&clear);
    expiring.outbound(&mut buf, T).unwrap();
    // An RFC 3948 NAT keepalive: one 0xff byte to port 4500.
    let mut keepalive = vec![0u8; 29];
    espgate_core::wire::ipv4::Ipv4Repr {
        src: espgate_testkit::A,
        dst: espgate_testkit::B,
        protocol: espgate_core::wire::proto::UDP,
        tos: 0,
        ident: 1,
        dont_frag: true,
        ttl: 64,
        payload_len: 9,
    }
    .emit(&mut keepalive)
    .unwrap();
    espgate_core::wire::udp::emit(&mut keepalive[20..], 4500, 4500, 1).unwrap();
    keepalive[28] = 0xff;
    let no_policy = udp4("10.1.0.5", "10.3.0.9", 100);
    let multicast = udp4("10.1.0.5", "224.0.0.22", 10);
    let garbage = [0x45u8, 0, 0, 3];
    let big = udp4("10.1.0.5", "10.2.0.9", 1000);
    let mut wire = Vec::with_capacity(2000);

    let n = allocations(|| {
        for lone in &lone_esp {
            // Forwarded both ways.
            buf.load(&clear);
            assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)));
            assert!(b.inbound(&mut buf, T, from_a()).is_ok());
            // Received as the daemon receives a datagram: its head behind
            // the outer header, the rest decrypted from where it lies.
            buf.load(&big);
            assert_eq!(a.outbound(&mut buf, T), Ok(Some(0)));
            wire.clear();
            wire.extend_from_slice(buf.as_slice());
            buf.load_head(&wire[28..]);
            buf.push_front(28)[..28].copy_from_slice(&wire[..28]);
            assert_eq!(
                b.inbound_from(&mut buf, &wire[28..], T, from_a()),
                Ok(Received::Packet)
            );
            assert_eq!(buf.as_slice(), &big[..]);
            // Outbound drops and ignores.
            buf.load(&no_policy);
            assert_eq!(
                a.outbound(&mut buf, T).unwrap_err().reason,
                DropReason::NoPolicy
            );
            buf.load(&multicast);
            assert_eq!(a.outbound(&mut buf, T), Ok(None));
            buf.load(&clear);
            assert_eq!(
                no_sa.outbound(&mut buf, T).unwrap_err().reason,
                DropReason::NoSa
            );
            buf.load(&clear);
            assert_eq!(
                expiring.outbound(&mut buf, T).unwrap_err().reason,
                DropReason::SaExpired
            );
            buf.load(&garbage);
            assert!(a.outbound(&mut buf, T).is_err());
            // Inbound drops.
            for (pkt, want) in [
                (&seen[..], DropReason::Replay),
                (&bad_icv[..], DropReason::Integrity),
                (&unknown_spi[..], DropReason::UnknownSpi),
                (&garbage[..], DropReason::BadLength),
            ] {
                buf.load(pkt);
                assert_eq!(b.inbound(&mut buf, T, from_a()).unwrap_err().reason, want);
            }
            buf.load(lone);
            assert_eq!(
                bundle_b.inbound(&mut buf, T, from_a()).unwrap_err().reason,
                DropReason::PolicyMismatch
            );
            buf.load(&keepalive);
            assert!(b.inbound(&mut buf, T, from_a()).is_ok());
        }
    });
    assert_eq!(n, 0, "allocations on the packet paths");
    let drops = &b.stats().counters.drops;
    assert_eq!(drops.get(DropReason::Replay), 200);
    assert_eq!(drops.get(DropReason::UnknownSpi), 200);
    assert_eq!(b.stats().counters.keepalives.get(), 200);
    assert_eq!(
        bundle_b
            .stats()
            .counters
            .drops
            .get(DropReason::PolicyMismatch),
        200
    );
    // Formatting a drop for a log line is where allocation happens — once
    // per line the rate limiter lets through.
    buf.load(&unknown_spi);
    let d = b.inbound(&mut buf, T, from_a()).unwrap_err();
    assert!(allocations(|| drop(b.describe(&d).to_string())) > 0);
}

#[test]
fn cluster_paths_allocate_nothing_observed_processed_or_refused() {
    use espgate_core::cluster::{Dispatch, Plan};
    use espgate_core::gateway::{ClusterOptions, EngineOptions, Received};
    let esp = Shape::new(Layers::Esp, true);
    for dispatch in [
        Dispatch::PacketRr,
        Dispatch::PacketSqf,
        Dispatch::SessionRr,
        Dispatch::SessionSqf,
    ] {
        let o = EngineOptions {
            cluster: Some(ClusterOptions {
                node: 1,
                dispatch,
                hold: Duration::from_secs(10),
            }),
            ..opts()
        };
        let mut a = Engine::new(&[side(true, esp)], &o, T).unwrap();
        a.cluster_plan(Plan::new(1, [1, 2, 3]), Some(1), T);
        a.cluster_check(&[]);
        let mut peer = engine(false, esp);
        // The peer's packets to the cluster, made before counting.
        let mut buf = PacketBuf::with_capacity(2000);
        let inbound: Vec<Vec<u8>> = (0..200)
            .map(|_| {
                buf.load(&udp4("10.2.0.9", "10.1.0.5", 100));
                peer.outbound(&mut buf, T).unwrap();
                buf.as_slice().to_vec()
            })
            .collect();
        // One flow per packet (the source port), so that the session
        // schemes spread them too.
        let clear: Vec<Vec<u8>> = (0..200u16)
            .map(|k| {
                let mut p = udp4("10.1.0.5", "10.2.0.9", 100);
                p[20..22].copy_from_slice(&(1000 + k).to_be_bytes());
                p
            })
            .collect();
        let late = T + Duration::from_secs(60);
        let (mut sent, mut observed) = (0, 0);
        let n = allocations(|| {
            for (k, pkt) in inbound.iter().enumerate() {
                buf.load(&clear[k]);
                match a.outbound(&mut buf, T) {
                    Ok(Some(_)) => sent += 1,
                    Ok(None) => observed += 1,
                    Err(d) => panic!("{d:?}"),
                }
                buf.load(pkt);
                let r = a.inbound(&mut buf, if k < 150 { T } else { late }, from_a());
                match (k < 150, r) {
                    (true, Ok(Received::Packet | Received::Observed)) => {}
                    (false, Err(d)) => assert_eq!(d.reason, DropReason::ClusterNoPlan),
                    (_, r) => panic!("packet {k}: {r:?}"),
                }
                buf.load(&clear[k]);
                assert_eq!(
                    a.outbound(&mut buf, late).unwrap_err().reason,
                    DropReason::ClusterNoPlan
                );
            }
        });
        assert_eq!(n, 0, "{dispatch:?}: allocations on the cluster paths");
        assert!(
            sent > 0 && observed > 0,
            "{dispatch:?}: {sent} sent, {observed} observed"
        );
    }
}
