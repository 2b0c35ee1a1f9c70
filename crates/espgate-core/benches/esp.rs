//! ESP pipeline throughput against raw aws-lc-rs AEAD in the same run, SPD
//! lookup with 10 000 policies (and its memo of the last flow), the
//! Internet checksum (which the TCP segmentation and coalescing offloads
//! run over every inner packet), and the engine's work per TSO segment on
//! top of the SA's (`engine_segment`).
//!
//! `cargo bench -p espgate-core --bench esp` (add `-- outbound/aes128gcm16`
//! etc. to filter). Packets are inner IPv4/UDP of the given total size,
//! tunnel mode, raw ESP. Each outbound iteration copies the clear packet into
//! the reused buffer first (what a TUN read does) and encrypts it in place.
//! Inbound runs with the replay window disabled so the same packet can be
//! decrypted repeatedly; the window itself is measured separately.

use aws_lc_rs::aead::{
    Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use espgate_core::crypto::Suite;
use espgate_core::sa::replay::ReplayWindow;
use espgate_core::sa::{classify, Classified, Classifier, Protocol, Sa, SaConfig};
use espgate_core::selector::{PortRange, Prefix, TrafficSelector};
use espgate_core::spd::{Action, Direction, Policy, Spd};
use espgate_core::wire::flow::Flow;
use espgate_core::wire::udp;
use espgate_core::PacketBuf;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

const SIZES: [usize; 4] = [64, 512, 1400, 8192];
const SUITES: [&str; 7] = [
    "aes128gcm16",
    "aes256gcm16",
    "chacha20poly1305",
    "aes128gmac",
    "aes128-sha256",
    "aes256-sha1",
    "null-sha256",
];

fn packet(total: usize) -> Vec<u8> {
    udp::ipv4_packet(
        Ipv4Addr::new(10, 1, 0, 1),
        Ipv4Addr::new(10, 2, 0, 1),
        total,
    )
    .unwrap()
}

fn sa(suite: &str, window: u32) -> Sa {
    let s: Suite = suite.parse().unwrap();
    let mut c = SaConfig::new(
        0x1000,
        Protocol::Esp,
        s,
        &vec![7; s.enc_key_len()],
        &vec![9; s.integ_key_len()],
    );
    c.tunnel_src = Some("192.0.2.1".parse().unwrap());
    c.tunnel_dst = Some("192.0.2.2".parse().unwrap());
    c.esn = true; // a benchmark sends more than 2^32 packets only in theory, but be honest
    c.replay_window = window;
    Sa::new(c, Duration::ZERO).unwrap()
}

fn raw_key(suite: &str) -> Option<LessSafeKey> {
    let (alg, n) = match suite {
        "aes128gcm16" | "aes128gmac" => (&AES_128_GCM, 16),
        "aes256gcm16" => (&AES_256_GCM, 32),
        "chacha20poly1305" => (&CHACHA20_POLY1305, 32),
        _ => return None,
    };
    Some(LessSafeKey::new(
        UnboundKey::new(alg, &vec![7u8; n]).unwrap(),
    ))
}

fn esp(c: &mut Criterion) {
    for suite in SUITES {
        let mut g = c.benchmark_group(format!("esp/{suite}"));
        for size in SIZES {
            g.throughput(Throughput::Bytes(size as u64));
            let clear = packet(size);
            let mut tx = sa(suite, 0);
            let mut buf = PacketBuf::with_capacity(9216);
            g.bench_with_input(BenchmarkId::new("outbound", size), &size, |b, _| {
                b.iter(|| {
                    buf.load(&clear);
                    tx.encapsulate(&mut buf, Duration::ZERO).unwrap();
                    black_box(buf.len())
                })
            });
            let mut enc = PacketBuf::from_packet(&clear);
            sa(suite, 0).encapsulate(&mut enc, Duration::ZERO).unwrap();
            let wire = enc.as_slice().to_vec();
            let Ok(Classified::Ipsec(inb)) = classify(&wire, &Classifier::NAT_T) else {
                panic!()
            };
            let mut rx = sa(suite, 0);
            g.bench_with_input(BenchmarkId::new("inbound", size), &size, |b, _| {
                b.iter(|| {
                    buf.load(&wire);
                    rx.decapsulate(&mut buf, &inb, Duration::ZERO).unwrap();
                    black_box(buf.len())
                })
            });
            if let Some(key) = raw_key(suite) {
                // The cipher alone on the same number of bytes: the ceiling.
                let mut data = vec![0u8; size];
                let gmac = suite.contains("gmac");
                g.bench_with_input(BenchmarkId::new("raw_seal", size), &size, |b, _| {
                    b.iter(|| {
                        let n = Nonce::assume_unique_for_key([1; 12]);
                        let tag = if gmac {
                            key.seal_in_place_separate_tag(n, Aad::from(&data[..]), &mut [])
                        } else {
                            key.seal_in_place_separate_tag(n, Aad::from([0u8; 8]), &mut data)
                        };
                        black_box(tag.unwrap())
                    })
                });
            }
        }
        g.finish();
    }
}

fn replay(c: &mut Criterion) {
    let mut w = ReplayWindow::new(4096, true, 0);
    let mut seq = 0u64;
    c.bench_function("replay/in_order_4096", |b| {
        b.iter(|| {
            seq += 1;
            let s = w.full_seq(seq as u32).unwrap();
            w.check(s).unwrap();
            w.update(s).unwrap();
        })
    });
}

fn checksum(c: &mut Criterion) {
    let mut g = c.benchmark_group("checksum");
    for size in [20usize, 1400, 65000] {
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &data, |b, d| {
            b.iter(|| espgate_core::wire::checksum::sum(0, black_box(d)))
        });
    }
    g.finish();
    // What the coalescer does per appended segment: the copy and the sum
    // as two passes, against the fused loop.
    let mut g = c.benchmark_group("checksum_copy");
    let size = 1400usize;
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
    let mut out = vec![0u8; size];
    g.throughput(Throughput::Bytes(size as u64));
    g.bench_function("copy_then_sum/1400", |b| {
        b.iter(|| {
            out.copy_from_slice(black_box(&data));
            espgate_core::wire::checksum::sum(0, black_box(&out))
        })
    });
    g.bench_function("copy_sum/1400", |b| {
        b.iter(|| espgate_core::wire::checksum::copy_sum(0, black_box(&mut out), black_box(&data)))
    });
    g.finish();
}

/// The receiving gateway's software GRO: 44 TCP segments of 1448 payload
/// bytes (IPv4, timestamps), each verified and merged, then the
/// super-segment taken. The segments are cut from one super-segment by the
/// [`Segmenter`] (full checksums), as the sending gateway does.
fn coalesce(c: &mut Criterion) {
    use espgate_core::offload::{Coalescer, GsoInfo, GsoKind, Push, Segmenter};
    use espgate_core::wire::checksum;
    const MSS: usize = 1448;
    const SEGS: usize = 44;
    let (l4, hdr) = (20usize, 52usize);
    let mut sup = vec![0u8; hdr + SEGS * MSS];
    let total = sup.len() as u16;
    sup[..20].copy_from_slice(&[
        0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 1, 0, 1, 10, 2, 0, 1,
    ]);
    sup[2..4].copy_from_slice(&total.to_be_bytes());
    let ip = checksum::checksum(&sup[..20]);
    sup[10..12].copy_from_slice(&ip.to_be_bytes());
    // Ports, sequence, ack, data offset 8 words, ACK, window, then NOP NOP
    // and a timestamp option.
    let t = &mut sup[l4..hdr];
    t[..4].copy_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
    t[4..8].copy_from_slice(&1000u32.to_be_bytes());
    t[8..12].copy_from_slice(&7u32.to_be_bytes());
    t[12] = 8 << 4;
    t[13] = 0x10;
    t[14..16].copy_from_slice(&512u16.to_be_bytes());
    t[20..32].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 3]);
    for (i, b) in sup[hdr..].iter_mut().enumerate() {
        *b = (i * 13 + 5) as u8;
    }
    let pseudo = checksum::pseudo_header(
        IpAddr::V4(Ipv4Addr::new(10, 1, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(10, 2, 0, 1)),
        6,
        (sup.len() - l4) as u32,
    );
    let partial = !checksum::finish(pseudo);
    sup[l4 + 16..l4 + 18].copy_from_slice(&partial.to_be_bytes());
    let info = GsoInfo {
        kind: GsoKind::TcpV4,
        needs_csum: true,
        hdr_len: hdr as u16,
        gso_size: MSS as u16,
        csum_start: l4 as u16,
        csum_offset: 16,
    };
    let mut seg = Segmenter::new(&sup[..], &info).unwrap();
    let mut segs = Vec::new();
    let mut out = PacketBuf::with_capacity(2048);
    while let Some(r) = seg.next_into(&mut out) {
        r.unwrap();
        segs.push(out.as_slice().to_vec());
    }
    assert_eq!(segs.len(), SEGS);
    // The sending gateway's side: the same super-segment cut in place
    // (each segment's headers written where the previous payload ended;
    // the first header is put back before each round).
    let mut g = c.benchmark_group("segment");
    g.throughput(Throughput::Bytes((SEGS * MSS) as u64));
    let mut work = sup.clone();
    g.bench_function("tcp4_in_place/44x1448", |b| {
        b.iter(|| {
            work[..hdr].copy_from_slice(&sup[..hdr]);
            let mut seg = Segmenter::new(&mut work[..], &info).unwrap();
            let mut n = 0;
            while let Some(r) = seg.next_in_place() {
                black_box(r.unwrap());
                n += 1;
            }
            n
        })
    });
    g.finish();
    let mut co = Coalescer::new();
    let mut g = c.benchmark_group("coalesce");
    g.throughput(Throughput::Bytes((SEGS * MSS) as u64));
    g.bench_function("tcp4/44x1448", |b| {
        b.iter(|| {
            for s in &segs {
                let r = co.push(black_box(s));
                assert_eq!(r, Push::Absorbed);
            }
            let (p, _, n) = co.take().unwrap();
            black_box(p);
            n
        })
    });
    g.finish();
}

fn spd(c: &mut Criterion) {
    // 10 000 site-to-site policies: one /24 remote subnet each, two
    // protocol/port-specific BYPASS rules in front, a catch-all DISCARD last.
    let mut spd = Spd::new();
    let any4: Prefix = "0.0.0.0/0".parse().unwrap();
    for port in [22u16, 179] {
        spd.push(Policy {
            selector: TrafficSelector {
                proto: Some(6),
                remote_ports: PortRange { lo: port, hi: port },
                ..TrafficSelector::between(any4, any4)
            },
            action: Action::Bypass,
        });
    }
    for i in 0..9_997u32 {
        let remote = Prefix::new(IpAddr::V4((0x0a00_0000 | (i << 8)).into()), 24).unwrap();
        spd.push(Policy {
            selector: TrafficSelector::between("172.16.0.0/12".parse().unwrap(), remote),
            action: Action::Protect(vec![]),
        });
    }
    spd.push(Policy {
        selector: TrafficSelector::between(any4, any4),
        action: Action::Discard,
    });
    assert_eq!(spd.len(), 10_000);
    let flows: Vec<Flow> = (0..1024u32)
        .map(|i| Flow {
            src: IpAddr::V4(Ipv4Addr::new(172, 16, 0, 5)),
            dst: IpAddr::V4((0x0a00_0000 | ((i * 9 % 9_997) << 8) | 7).into()),
            proto: 17,
            sport: Some(5000),
            dport: Some(443),
        })
        .collect();
    let mut i = 0;
    let mut g = c.benchmark_group("spd_10000");
    g.bench_function("indexed", |b| {
        b.iter(|| {
            i = (i + 1) & 1023;
            black_box(spd.lookup(&flows[i], Direction::Outbound).unwrap().0)
        })
    });
    g.bench_function("linear_scan", |b| {
        b.iter(|| {
            i = (i + 1) & 1023;
            black_box(spd.lookup_linear(&flows[i], Direction::Outbound).unwrap().0)
        })
    });
    // One flow over and over, as the segments of a TSO read: the index
    // every time, and the memo (`lookup_memo`) after the first.
    g.bench_function("indexed_same_flow", |b| {
        b.iter(|| {
            black_box(
                spd.lookup(black_box(&flows[7]), Direction::Outbound)
                    .unwrap()
                    .0,
            )
        })
    });
    g.bench_function("memo_same_flow", |b| {
        b.iter(|| {
            black_box(
                spd.lookup_memo(black_box(&flows[7]), Direction::Outbound)
                    .unwrap(),
            )
        })
    });
    g.finish();
}

/// The engine's work per packet on top of the SA's, for the segments of
/// a TSO read: `Engine::outbound_from` (flow, policy and SA found for every
/// segment) against the SA's own `encapsulate_from` on the same packet.
/// AES-128-GCM from `espgate-testkit`'s site A, ESP in UDP, 1400 and 64
/// bytes of inner IPv4/UDP (the AES-GCM library is the process's choice).
fn engine(c: &mut Criterion) {
    use espgate_core::gateway::Engine;
    use espgate_core::gateway::Layers;
    use espgate_testkit::{opts, side, udp4, Shape};
    let t = Duration::from_secs(1);
    let mut g = c.benchmark_group("engine_segment");
    for size in [64usize, 1400] {
        g.throughput(Throughput::Elements(1));
        let mut clear = udp4("10.1.0.5", "10.2.0.9", size - 28);
        let spec = side(true, Shape::new(Layers::Esp, true));
        let mut e = Engine::new(std::slice::from_ref(&spec), &opts(), t).unwrap();
        let mut out = PacketBuf::with_capacity(9216);
        g.bench_with_input(
            BenchmarkId::new("engine_outbound_from", size),
            &size,
            |b, _| b.iter(|| black_box(e.outbound_from(&mut clear, &mut out, t).unwrap())),
        );
        let mut sa = Sa::new(spec.outbound[0].clone(), t).unwrap();
        g.bench_with_input(
            BenchmarkId::new("sa_encapsulate_from", size),
            &size,
            |b, _| {
                b.iter(|| {
                    sa.encapsulate_from(&clear, &mut out, t).unwrap();
                    black_box(out.len())
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, esp, replay, spd, checksum, coalesce, engine);
criterion_main!(benches);
