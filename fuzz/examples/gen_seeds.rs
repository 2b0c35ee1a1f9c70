//! Writes the seed corpora into `fuzz/corpus/<target>/seed-*`:
//!
//! ```sh
//! cd fuzz && cargo +nightly run --example gen_seeds
//! ```
//!
//! Seeds are deterministic except for CBC IVs. The structured targets'
//! input layouts are documented at the top of each target.

use espgate_core::crypto::Suite;
use espgate_core::sa::{Mode, Protocol};
use espgate_core::wire::{esp, ipv6, proto, tcp};
use espgate_core::{PacketBuf, Sa};
use espgate_fuzz::{addr, inbound_configs, ip_packet, sa_ix, stacks, udp_packet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const T0: Duration = Duration::ZERO;

mod seeds {
    #[path = "config.rs"]
    pub mod config;
    #[path = "control.rs"]
    pub mod control;
    #[path = "ike.rs"]
    pub mod ike;
}

fn out_dir(target: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    assert!(bytes.len() <= 4096, "{target}/{name} too long");
    std::fs::write(out_dir(target).join(format!("seed-{name}")), bytes).unwrap();
}

fn v4_udp(n: usize) -> Vec<u8> {
    let payload: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
    udp_packet(
        addr(false, 1, 10),
        addr(false, 2, 20),
        1234,
        5678,
        0,
        &payload,
    )
}

fn v6_udp(n: usize) -> Vec<u8> {
    let payload: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
    udp_packet(
        addr(true, 1, 10),
        addr(true, 2, 20),
        1234,
        5678,
        0,
        &payload,
    )
}

/// IPv6 with hop-by-hop (a PadN option), routing and destination options,
/// then UDP.
fn v6_ext(fragment: bool) -> Vec<u8> {
    let udp = &v6_udp(16)[40..];
    let mut ext = Vec::new();
    // HBH: next = routing, len 0 (8 bytes), PadN of 4.
    ext.extend_from_slice(&[proto::IPV6_ROUTE, 0, 1, 4, 0, 0, 0, 0]);
    // Routing: next = frag or dest opts, len 0.
    let after_rt = if fragment {
        proto::IPV6_FRAG
    } else {
        proto::IPV6_OPTS
    };
    ext.extend_from_slice(&[after_rt, 0, 0, 0, 0, 0, 0, 0]);
    if fragment {
        // Fragment header: next = dest opts, offset 0, M=1.
        ext.extend_from_slice(&[proto::IPV6_OPTS, 0, 0, 1, 0, 0, 0, 42]);
    }
    // Destination options: next = UDP, len 0, Pad1 x6.
    ext.extend_from_slice(&[proto::UDP, 0, 0, 0, 0, 0, 0, 0]);
    ext.extend_from_slice(udp);
    let mut p = ip_packet(addr(true, 1, 10), addr(true, 2, 20), proto::HOPOPT, 0, &ext);
    assert!(p.len() >= ipv6::HEADER_LEN);
    p[6] = proto::HOPOPT;
    p
}

/// IPv4 with a 4-byte option (router alert) then UDP.
fn v4_options() -> Vec<u8> {
    let base = v4_udp(12);
    let mut p = Vec::new();
    p.extend_from_slice(&base[..20]);
    p.extend_from_slice(&[148, 4, 0, 0]);
    p.extend_from_slice(&base[20..]);
    p[0] = 0x46;
    let len = p.len() as u16;
    p[2..4].copy_from_slice(&len.to_be_bytes());
    espgate_fuzz::fix_v4_checksum(&mut p);
    p
}

/// Protects `inner` with the esp_inbound fixture stack `stack` at sequence `seq`.
fn protect(stack: &[usize], seqv: u32, inner: &[u8]) -> Option<Vec<u8>> {
    let mut b = PacketBuf::from_packet(inner);
    for &i in stack {
        let mut c = inbound_configs()[i].clone();
        c.initial_seq = espgate_fuzz::outbound_seq(&c, seqv);
        Sa::new(c, T0).unwrap().encapsulate(&mut b, T0).ok()?;
    }
    Some(b.as_slice().to_vec())
}

fn trailer(mut payload: Vec<u8>, nh: u8, align: usize) -> Vec<u8> {
    let pad = esp::pad_len(payload.len(), align);
    let start = payload.len();
    payload.resize(start + pad + 2, 0);
    esp::emit_trailer(&mut payload[start..], nh);
    payload
}

/// A TCP segment with `opts` (a multiple of 4 bytes) and a valid
/// checksum between `src` and `dst`.
fn tcp_segment(src: std::net::IpAddr, dst: std::net::IpAddr, flags: u8, opts: &[u8]) -> Vec<u8> {
    let hl = 20 + opts.len();
    let mut t = vec![0u8; hl + 6];
    t[..4].copy_from_slice(&[0x04, 0xd2, 0x01, 0xbb]);
    t[4..8].copy_from_slice(&7u32.to_be_bytes());
    t[12] = ((hl / 4) as u8) << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    t[20..hl].copy_from_slice(opts);
    t[hl..].copy_from_slice(b"hello!");
    tcp::Tcp::new_checked(&mut t[..])
        .unwrap()
        .fill_checksum(src, dst);
    t
}

/// wire_parse seeds for the views and layouts the first ones do not reach.
fn wire_extra() {
    let (s4, d4) = (addr(false, 1, 10), addr(false, 2, 20));
    let (s6, d6) = (addr(true, 1, 10), addr(true, 2, 20));
    // A Q-ESP header (clear ports 1234 -> 443, TCP) and a body.
    let mut q = vec![0x04, 0xd2, 0x01, 0xbb, proto::TCP, 0, 0, 0];
    q.extend_from_slice(&0x3001u32.to_be_bytes());
    q.extend_from_slice(&5u32.to_be_bytes());
    q.extend_from_slice(&[0x42; 32]);
    write("wire_parse", "qesp-v4", &ip_packet(s4, d4, 253, 0, &q));
    write("wire_parse", "qesp-v6", &ip_packet(s6, d6, 253, 0, &q));
    write("wire_parse", "qesp-header", &q);
    // TCP SYN: NOP then MSS at an odd offset, window scale, SACK permitted.
    let opts = [1, 2, 4, 0x05, 0xb4, 3, 3, 7, 4, 2, 0, 0];
    let syn4 = tcp_segment(s4, d4, 0x02, &opts);
    write(
        "wire_parse",
        "tcp-syn-v4",
        &ip_packet(s4, d4, proto::TCP, 0, &syn4),
    );
    let syn6 = tcp_segment(s6, d6, 0x12, &[2, 4, 0x05, 0xa0]);
    write(
        "wire_parse",
        "tcp-synack-v6",
        &ip_packet(s6, d6, proto::TCP, 0, &syn6),
    );
    write("wire_parse", "tcp-segment", &syn4);
    // More IPv6 extension headers than the walk follows.
    let mut ext = Vec::new();
    for _ in 0..ipv6::MAX_EXT_HEADERS {
        ext.extend_from_slice(&[proto::IPV6_OPTS, 0, 1, 4, 0, 0, 0, 0]);
    }
    ext.extend_from_slice(&[proto::UDP, 0, 1, 4, 0, 0, 0, 0]);
    ext.extend_from_slice(&v6_udp(4)[40..]);
    let mut p = ip_packet(s6, d6, proto::IPV6_OPTS, 0, &ext);
    p[6] = proto::IPV6_OPTS;
    write("wire_parse", "ipv6-ext-chain-long", &p);
    write(
        "wire_parse",
        "spec-qesp",
        b"spi=0x3001,suite=aes128gcm16,proto=qesp,ipproto=254,enc=000102030405060708090a0b0c0d0e0f10111213,src=192.0.2.1,dst=192.0.2.2",
    );
    write(
        "wire_parse",
        "spec-ipproto-esp",
        b"spi=4097,suite=aes128gcm16,ipproto=253",
    );
    write(
        "wire_parse",
        "spec-ipproto-big",
        b"spi=4097,suite=sha1,proto=ah,ipproto=300",
    );
    write(
        "wire_parse",
        "spec-odd-hex",
        b"spi=4097,suite=null-sha1,integ=abc",
    );
}

fn main() {
    // wire_parse
    let e1 = protect(&[sa_ix::E_CBC_SHA256], 1, &v4_udp(40)).unwrap();
    write("wire_parse", "esp-in-udp-v4", &e1);
    write(
        "wire_parse",
        "esp-raw-v6-tunnel",
        &protect(&[sa_ix::E_GMAC], 1, &v6_udp(20)).unwrap(),
    );
    write(
        "wire_parse",
        "ah-v4",
        &protect(&[sa_ix::A_SHA256], 1, &v4_udp(20)).unwrap(),
    );
    write(
        "wire_parse",
        "ah-over-esp-v6",
        &protect(&[sa_ix::E_NULL_SHA1, sa_ix::A_SHA256], 1, &v6_udp(20)).unwrap(),
    );
    write("wire_parse", "ipv6-ext", &v6_ext(false));
    write("wire_parse", "ipv6-ext-frag", &v6_ext(true));
    write("wire_parse", "ipv4-options", &v4_options());
    let ike = udp_packet(
        addr(false, 1, 1),
        addr(false, 2, 2),
        4500,
        4500,
        0,
        &[0, 0, 0, 0, 0x21, 0x20, 0x22, 0x08],
    );
    write("wire_parse", "ike-marker", &ike);
    let ka = udp_packet(addr(false, 1, 1), addr(false, 2, 2), 4500, 4500, 0, &[0xff]);
    write("wire_parse", "nat-keepalive", &ka);
    write("wire_parse", "trailer", &trailer(b"abc".to_vec(), 4, 16));
    write(
        "wire_parse",
        "spec-full",
        b"spi=0x1000,suite=aes128gcm16,enc=000102030405060708090a0b0c0d0e0f10111213,mode=transport,encap=udp,src=10.0.0.1,dst=10.0.0.2,esn=yes,seq=0x100000000",
    );
    write(
        "wire_parse",
        "spec-ah",
        b"spi=4097,suite=sha256,proto=ah,integ=00:01:02:03:04:05:06:07:08:09:0a:0b:0c:0d:0e:0f:10:11:12:13:14:15:16:17:18:19:1a:1b:1c:1d:1e:1f,mode=tunnel,src=2001:db8::1,dst=2001:db8::2,window=64,tfc=1200,sport=4500,dport=4501,allow_insecure=no",
    );
    write("wire_parse", "suite", b"aes256-sha256");
    write("wire_parse", "suite-3des", b"3DES-MD5");
    write("wire_parse", "prefix-v4", b"10.1.2.3/8");
    write("wire_parse", "prefix-v6", b"2001:db8::/32");

    // esp_inbound: mode 0 (raw valid packets), 1 (mutated), 2 (valid), 3 (crafted).
    let seqv: u32 = 0;
    for (si, stack) in stacks().iter().enumerate() {
        for v6 in [false, true] {
            let inner = if v6 { v6_udp(33) } else { v4_udp(33) };
            if let Some(w) = protect(stack, seqv, &inner) {
                if v6 || si % 3 == 0 {
                    write(
                        "esp_inbound",
                        &format!("raw-stack{si}-v{}", if v6 { 6 } else { 4 }),
                        &[&[0u8][..], &w].concat(),
                    );
                }
            }
            // mode 2: stack, seq (4), flags, tos, nets, inner bytes (a UDP payload).
            let mut s = vec![2u8, si as u8, 0, 0, 0, 0, u8::from(v6), 0, 0];
            s.extend_from_slice(b"hello, espgate");
            write(
                "esp_inbound",
                &format!("valid-stack{si}-v{}", if v6 { 6 } else { 4 }),
                &s,
            );
            // The same through the cluster gate (byte 0 bits 2-3):
            // Observe, ObserveDrop, Process.
            if !v6 && si % 4 == 0 {
                for g in 1..=3u8 {
                    s[0] = 2 | g << 2;
                    write("esp_inbound", &format!("valid-stack{si}-v4-gate{g}"), &s);
                }
                s[0] = 2;
            }
            // Lifetime limits (flags bits 4-5): hard after one packet, soft
            // after one, by time.
            if v6 && si % 5 == 0 {
                for p in 1..=3u8 {
                    s[6] = 1 | p << 4;
                    write("esp_inbound", &format!("valid-stack{si}-v6-life{p}"), &s);
                }
            }
        }
        // mode 1: as mode 2 plus mutation count and one (op, pos, val) flip.
        let mut s = vec![1u8, si as u8, 0, 0, 0, 1, 0, 0x01, 0x55, 0, 0, 0, 7, 1];
        s.extend_from_slice(&v4_udp(24));
        write("esp_inbound", &format!("mutated-stack{si}"), &s);
    }
    write("esp_inbound", "raw-ike", &[&[0u8][..], &ike].concat());
    write("esp_inbound", "raw-keepalive", &[&[0u8][..], &ka].concat());
    write(
        "esp_inbound",
        "valid-ipv6-ext",
        &[
            &[2u8, sa_ix::E_XCBC as u8, 0, 0, 0, 0, 1, 0, 0][..],
            &v6_ext(false),
        ]
        .concat(),
    );
    write(
        "esp_inbound",
        "valid-ipv4-options",
        &[
            &[
                2u8,
                (sa_ix::N_CLASSIC + sa_ix::E_NULL_SHA1) as u8,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
            ][..],
            &v4_options(),
        ]
        .concat(),
    );
    // mode 3: sa, seq (4), flags, tos, nh, plaintext / AH payload.
    for (i, c) in inbound_configs().iter().enumerate().take(sa_ix::N_CLASSIC) {
        let v6 = i % 2 == 1;
        let inner = if v6 { v6_udp(21) } else { v4_udp(21) };
        let (nh, body) = match (c.protocol, c.mode) {
            (Protocol::Esp, Mode::Tunnel) => {
                let nh = if v6 { proto::IPV6 } else { proto::IPV4 };
                (0, trailer(inner.clone(), nh, c.suite.block_len()))
            }
            (Protocol::Esp, Mode::Transport) => (
                0,
                trailer(
                    inner[if v6 { 40 } else { 20 }..].to_vec(),
                    proto::UDP,
                    c.suite.block_len(),
                ),
            ),
            (Protocol::Ah, Mode::Tunnel) => {
                (if v6 { proto::IPV6 } else { proto::IPV4 }, inner.clone())
            }
            (Protocol::Ah, Mode::Transport) => {
                (proto::UDP, inner[if v6 { 40 } else { 20 }..].to_vec())
            }
            (Protocol::Qesp, _) => unreachable!("crafted mode has no Q-ESP SA"),
        };
        let mut s = vec![3u8, i as u8, 0, 0, 0, 0, u8::from(v6), 0, nh];
        s.extend_from_slice(&body);
        write("esp_inbound", &format!("crafted-sa{i}"), &s);
        if i % 3 == 0 {
            s[0] = 3 | 1 << 2;
            write("esp_inbound", &format!("crafted-sa{i}-observe"), &s);
        }
    }
    // Q-ESP (flags bit 5): an honest header, one lying about the ports
    // (bit 4), an IPv6 inner packet over an IPv6 outer one.
    for (name, flags, inner, nh) in [
        ("crafted-qesp", 0x20u8, v4_udp(21), proto::IPV4),
        ("crafted-qesp-lie", 0x30, v4_udp(21), proto::IPV4),
        ("crafted-qesp-v6", 0x21, v6_udp(9), proto::IPV6),
    ] {
        let mut s = vec![3u8, 0, 0, 0, 0, 7, flags, 0, 0];
        s.extend_from_slice(&trailer(inner, nh, 4));
        write("esp_inbound", name, &s);
    }
    // AH over IPv6 with an extension header before it that AH cannot
    // cover (routing, fragment) or that is malformed (raw mode).
    if let Some(ah6) = protect(&[sa_ix::A_SHA256], 1, &v6_udp(20)) {
        for (name, ext) in [
            ("raw-ah-v6-routing", [proto::AH, 0, 0, 0, 0, 0, 0, 0]),
            ("raw-ah-v6-opts-bad", [proto::AH, 0, 1, 9, 0, 0, 0, 0]),
        ] {
            let nh = if name.ends_with("routing") {
                proto::IPV6_ROUTE
            } else {
                proto::IPV6_OPTS
            };
            let mut p = ah6[..40].to_vec();
            p[6] = nh;
            p.extend_from_slice(&ext);
            p.extend_from_slice(&ah6[40..]);
            let len = (p.len() - 40) as u16;
            p[4..6].copy_from_slice(&len.to_be_bytes());
            write("esp_inbound", name, &[&[0u8][..], &p].concat());
        }
    }
    // A dummy (next header 59) packet and a CE-marked outer header.
    let mut s = vec![3u8, sa_ix::E_GCM as u8, 0, 0, 0, 0, 0, 0, 0];
    s.extend_from_slice(&trailer(vec![0; 8], proto::NO_NEXT, 4));
    write("esp_inbound", "crafted-dummy", &s);
    let mut s = vec![3u8, sa_ix::E_GCM as u8, 0, 0, 0, 0, 0, 3, 0];
    let mut ect = v4_udp(5);
    ect[1] = 1;
    espgate_fuzz::fix_v4_checksum(&mut ect);
    s.extend_from_slice(&trailer(ect, proto::IPV4, 4));
    write("esp_inbound", "crafted-ecn-ce", &s);

    // sa_roundtrip: suite, flags, tos, key seed, seq (8), tfc (2), window (2),
    // sport (2), dport (2), packet count, packets.
    let n_suites = Suite::all().len() as u8;
    let cases: [(u8, u8, &str, Vec<u8>); 8] = [
        (0, 0x00, "gcm-tunnel-v4", b"payload".to_vec()),
        (2, 0x3c, "chacha-udp-esn-v6", b"payload".to_vec()),
        (10, 0x02, "cbc-transport-v4", v4_options()),
        (20, 0x22, "transport-v6-ext", v6_ext(false)),
        (3, 0x01, "ah-sha1-tunnel", b"ah".to_vec()),
        (1, 0x23, "ah-sha256-transport-v6", v6_ext(false)),
        (n_suites - 1, 0x80 | 0x10, "tfc-v6-outer", vec![0x41; 100]),
        (30, 0x0c, "esn-udp", vec![0; 1400]),
    ];
    for (suite, flags, name, bytes) in cases {
        let mut s = vec![suite, flags, 0, 7];
        s.extend_from_slice(&1u64.to_be_bytes());
        s.extend_from_slice(&1500u16.to_be_bytes());
        s.extend_from_slice(&64u16.to_be_bytes());
        s.extend_from_slice(&[0x11, 0x94, 0x11, 0x94, 1]);
        s.extend_from_slice(&bytes);
        write("sa_roundtrip", name, &s);
    }
    // Near the ESN and 32-bit sequence limits, two packets each.
    for (name, flags, seq) in [
        ("seq-u32-max", 0u8, u64::from(u32::MAX) - 1),
        ("esn-u64-max", 0x08, u64::MAX - 1),
    ] {
        let mut s = vec![0, flags, 0, 7];
        s.extend_from_slice(&seq.to_be_bytes());
        s.extend_from_slice(&[0, 0, 0, 64, 0, 0, 0, 0, 1]);
        s.extend_from_slice(b"aaaaaaaabbbbbbbb");
        write("sa_roundtrip", name, &s);
    }

    // spd_lookup: arbitrary-decoded, so any bytes do; a few pseudo-random ones.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for n in 0..6 {
        let len = 64 << (n % 4);
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        write("spd_lookup", &format!("random{n}"), &bytes);
    }

    wire_extra();
    for (name, text) in seeds::config::seeds() {
        write("config_parse", &name, text.as_bytes());
    }
    for (name, line) in seeds::control::seeds() {
        write("control_request", name, line.as_bytes());
    }
    for (name, bytes) in seeds::ike::seeds() {
        write("ike_parse", name, &bytes);
    }

    println!("seeds written under {}", out_dir("").display());
}
