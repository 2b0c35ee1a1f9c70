//! Test helpers shared by espgate's crates (a dev-dependency only): the
//! mirrored pair of connections two gateways run ([`mirrored`]), fixed
//! test keys ([`keys`]) and clear packets to push through them
//! ([`udp4`], [`tcp_syn4`]), and the engine options they run with
//! ([`opts`]).
//!
//! Site A is 10.1.0.0/16 behind outer address 192.0.2.1, site B is
//! 10.2.0.0/16 behind 192.0.2.2; A receives ESP on SPI 0x1001 and sends on
//! SPI 0x1002 (AH: those plus 0x100), with the keys of [`keys`].

use espgate_core::crypto::Suite;
use espgate_core::gateway::{ConnSpec, Engine, EngineOptions, Layers, MssClamp, SaSettings};
use espgate_core::sa::{per_cpu_key, Classifier, Lifetime, Mode, Protocol, SaConfig};
use espgate_core::selector::{PortRange, Prefix, TrafficSelector};
use espgate_core::wire::{ipv4, proto, udp};
use std::net::{IpAddr, Ipv4Addr};

/// Fixed test keys (hex): never use them for anything else.
pub mod keys {
    /// AES-128-GCM key and salt, A to B.
    pub const K_AB: &str = "000102030405060708090a0b0c0d0e0f10111213";
    /// AES-128-GCM key and salt, B to A.
    pub const K_BA: &str = "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3";
    /// HMAC-SHA-256 key, A to B.
    pub const I_AB: &str = "0001020304050607080900010203040506070809000102030405060708090001";
    /// HMAC-SHA-256 key, B to A.
    pub const I_BA: &str = "1011121314151617181910111213141516171819101112131415161718191011";
    /// A third AES-128-GCM key and salt, for rekeys.
    pub const K_NEW_AB: &str = "5051525354555657585950515253545556575859";
}

/// Outer address of site A.
pub const A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// Outer address of site B.
pub const B: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);

/// How [`side`] builds a connection.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// ESP, AH or both.
    pub layers: Layers,
    /// ESP in UDP (else raw).
    pub udp: bool,
    /// Per-CPU ESP pairs.
    pub per_cpu: u32,
    /// A's outbound ESP SPI (B's inbound one).
    pub spi_out_a: u32,
}

impl Shape {
    /// `layers`, UDP or raw, one pair, A sending on 0x1002.
    pub fn new(layers: Layers, udp: bool) -> Shape {
        Shape {
            layers,
            udp,
            per_cpu: 1,
            spi_out_a: 0x1002,
        }
    }
}

fn hex(s: &str) -> Vec<u8> {
    ::hex::decode(s).expect("test key hex")
}

/// The connection "peer" of site A (`a`) or B to the other, tunnel mode,
/// AES-128-GCM for ESP and HMAC-SHA-256 for AH, MSS clamping on.
pub fn side(a: bool, shape: Shape) -> ConnSpec {
    let (local, remote, lts, rts) = if a {
        (A, B, "10.1.0.0/16", "10.2.0.0/16")
    } else {
        (B, A, "10.2.0.0/16", "10.1.0.0/16")
    };
    let (lts, rts): (Prefix, Prefix) = (lts.parse().unwrap(), rts.parse().unwrap());
    let mut c = ConnSpec {
        name: "peer".into(),
        local: local.into(),
        remote: remote.into(),
        local_port: 4500,
        remote_port: 4500,
        mode: Mode::Tunnel,
        layers: shape.layers,
        qesp_protocol: espgate_core::wire::qesp::DEFAULT_IP_PROTOCOL,
        udp: shape.udp,
        local_ts: vec![lts],
        remote_ts: vec![rts],
        more_ts: Vec::new(),
        selectors: vec![TrafficSelector {
            local: lts,
            remote: rts,
            proto: None,
            local_ports: PortRange::ANY,
            remote_ports: PortRange::ANY,
        }],
        mss_clamp: MssClamp::Auto,
        per_cpu_sas: shape.per_cpu,
        sa: SaSettings {
            esn: false,
            replay_window: 1024,
            lifetime: Lifetime::default(),
            allow_insecure: false,
            tfc_pad_to: None,
            copy_dscp: true,
        },
        inbound: Vec::new(),
        outbound: Vec::new(),
        negotiated: Vec::new(),
    };
    use keys::*;
    let (spi_in, spi_out, k_in, k_out, i_in, i_out) = if a {
        (0x1001, shape.spi_out_a, K_BA, K_AB, I_BA, I_AB)
    } else {
        (shape.spi_out_a, 0x1001, K_AB, K_BA, I_AB, I_BA)
    };
    for protocol in shape.layers.protocols() {
        let (suite, kin, kout, off): (Suite, _, _, u32) = match protocol {
            Protocol::Esp | Protocol::Qesp => {
                ("aes128gcm16".parse().unwrap(), hex(k_in), hex(k_out), 0)
            }
            Protocol::Ah => ("sha256".parse().unwrap(), hex(i_in), hex(i_out), 0x100),
        };
        let copies = if *protocol == Protocol::Esp {
            shape.per_cpu.max(1)
        } else {
            1
        };
        for k in 0..copies {
            for outbound in [false, true] {
                let (spi, key) = if outbound {
                    (spi_out + off + k, per_cpu_key(&kout, k))
                } else {
                    (spi_in + off + k, per_cpu_key(&kin, k))
                };
                let (enc, integ): (&[u8], &[u8]) = match protocol {
                    Protocol::Esp | Protocol::Qesp => (&key, &[]),
                    Protocol::Ah => (&[], &key),
                };
                let mut sc = SaConfig::new(spi, *protocol, suite, enc, integ);
                c.shape_sa(&mut sc, c.mode_of(*protocol), outbound, (4500, 4500));
                if outbound {
                    c.outbound.push(sc);
                } else {
                    c.inbound.push(sc);
                }
            }
        }
    }
    c
}

/// The connections of sites A and B to each other.
pub fn mirrored(shape: Shape) -> (ConnSpec, ConnSpec) {
    (side(true, shape), side(false, shape))
}

/// A clear IPv4/UDP packet from `src` to `dst` (ports 1000 → 2000) with `n`
/// payload bytes.
pub fn udp4(src: &str, dst: &str, n: usize) -> Vec<u8> {
    let mut p = vec![0u8; 28 + n];
    ipv4::Ipv4Repr {
        src: src.parse().expect("test address"),
        dst: dst.parse().expect("test address"),
        protocol: proto::UDP,
        tos: 0,
        ident: 7,
        dont_frag: true,
        ttl: 64,
        payload_len: 8 + n,
    }
    .emit(&mut p)
    .expect("a packet that fits");
    udp::emit(&mut p[20..], 1000, 2000, n).expect("a datagram that fits");
    p
}

/// A TCP SYN from `src` to `dst` with an MSS option of `mss` (its TCP
/// checksum left zero).
pub fn tcp_syn4(src: &str, dst: &str, mss: u16) -> Vec<u8> {
    let mut syn = vec![0u8; 20];
    ipv4::Ipv4Repr {
        src: src.parse().expect("test address"),
        dst: dst.parse().expect("test address"),
        protocol: proto::TCP,
        tos: 0,
        ident: 1,
        dont_frag: true,
        ttl: 64,
        payload_len: 24,
    }
    .emit(&mut syn)
    .expect("a packet that fits");
    let mut tcp = [0u8; 24];
    tcp[12] = 6 << 4; // 24-byte header
    tcp[13] = 0x02; // SYN
    tcp[20..22].copy_from_slice(&[2, 4]);
    tcp[22..24].copy_from_slice(&mss.to_be_bytes());
    syn.extend_from_slice(&tcp);
    syn
}

/// Site A's outer address as an `IpAddr`.
pub fn from_a() -> IpAddr {
    A.into()
}

/// The engine options the tests run with: a 1500-byte MTU, NAT-T
/// classification and no sequence leases (add them with `..opts()`).
pub fn opts() -> EngineOptions {
    EngineOptions {
        mtu: 1500,
        classifier: Classifier::NAT_T,
        leases: None,
        cluster: None,
    }
}

/// The drops of `e` by name, non-zero only.
pub fn drops(e: &Engine) -> Vec<(&'static str, u64)> {
    e.stats()
        .counters
        .drops
        .all()
        .filter(|(_, n)| *n > 0)
        .map(|(d, n)| (d.as_str(), n))
        .collect()
}

/// A fresh, empty directory under the system's temporary directory, named
/// after `tag`, this process and a counter (so tests running in parallel
/// each get their own). Left behind for inspection; the next run with the
/// same process id starts it afresh.
pub fn temp_dir(tag: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "espgate-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("creating a temporary directory");
    d
}
