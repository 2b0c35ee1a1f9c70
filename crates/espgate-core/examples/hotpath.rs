//! Runs the outbound and inbound ESP path N times on one packet size, for
//! instruction-level profiling (`valgrind --tool=callgrind`), which counts
//! work instead of time and so is stable on a shared machine.
//!
//! `cargo run --release -p espgate-core --example hotpath -- SUITE SIZE N [WHAT]`
//! where WHAT is `both` (default), `out`, `from` (outbound sealed from the
//! packet where it lies, [`Sa::encapsulate_from`], as for a TSO segment),
//! `in`, or `raw` (aws-lc-rs seal of the same number of bytes, AEAD suites
//! only). Instruction counts per packet: total from callgrind divided by N,
//! minus a run with N = 0. (Valgrind has no AVX-512, so aws-lc takes its
//! AVX2 path there; use `perf` for where the time goes on such a CPU.)

use aws_lc_rs::aead::{
    Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305,
};
use espgate_core::crypto::Suite;
use espgate_core::sa::{classify, Classified, Classifier, Protocol, Sa, SaConfig};
use espgate_core::wire::udp;
use espgate_core::PacketBuf;
use std::net::Ipv4Addr;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let suite: Suite = args
        .get(1)
        .map_or("aes128gcm16", |s| s.as_str())
        .parse()
        .expect("suite");
    let size: usize = args.get(2).map_or(64, |s| s.parse().expect("size"));
    let n: u64 = args.get(3).map_or(100_000, |s| s.parse().expect("count"));
    let what = args.get(4).map_or("both", |s| s.as_str());
    let clear = udp::ipv4_packet(Ipv4Addr::new(10, 1, 0, 1), Ipv4Addr::new(10, 2, 0, 1), size)
        .expect("size 28..=65535");
    let mut cfg = SaConfig::new(
        0x1000,
        Protocol::Esp,
        suite,
        &vec![7; suite.enc_key_len()],
        &vec![9; suite.integ_key_len()],
    );
    cfg.tunnel_src = Some("192.0.2.1".parse().expect("addr"));
    cfg.tunnel_dst = Some("192.0.2.2".parse().expect("addr"));
    cfg.esn = true;
    cfg.replay_window = 0;
    let mut tx = Sa::new(cfg.clone(), Duration::ZERO).expect("sa");
    let mut rx = Sa::new(cfg, Duration::ZERO).expect("sa");
    let mut buf = PacketBuf::with_capacity(9216);
    let mut sum = 0usize;
    if what == "raw" {
        let (alg, len) = match suite.name().as_str() {
            "aes128gcm16" | "aes128gmac" => (&AES_128_GCM, 16),
            "aes256gcm16" => (&AES_256_GCM, 32),
            "chacha20poly1305" => (&CHACHA20_POLY1305, 32),
            other => panic!("no raw AEAD for {other}"),
        };
        let key = LessSafeKey::new(UnboundKey::new(alg, &vec![7u8; len]).expect("key"));
        let mut data = vec![0u8; size];
        for i in 0..n {
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&i.to_be_bytes());
            let tag = key
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from([0u8; 8]),
                    &mut data,
                )
                .expect("seal");
            sum += tag.as_ref().len();
        }
        println!("{n} raw seals of {size} B: {sum}");
        return;
    }
    if what == "from" {
        for _ in 0..n {
            tx.encapsulate_from(&clear, &mut buf, Duration::ZERO)
                .expect("encapsulate");
            sum += buf.len();
        }
        println!("{n} encapsulations from the packet of {size} B: {sum}");
        return;
    }
    if what == "in" {
        // One ESP packet opened again and again: the receiving SA has no
        // replay window (0 above), so every copy is accepted.
        buf.load(&clear);
        tx.encapsulate(&mut buf, Duration::ZERO)
            .expect("encapsulate");
        let wire = buf.as_slice().to_vec();
        let Ok(Classified::Ipsec(inb)) = classify(&wire, &Classifier::NAT_T) else {
            panic!("not ESP")
        };
        for _ in 0..n {
            buf.load(&wire);
            rx.decapsulate(&mut buf, &inb, Duration::ZERO)
                .expect("decapsulate");
            sum += buf.len();
        }
        println!("{n} decapsulations of {size} B: {sum}");
        return;
    }
    if what == "out" {
        for _ in 0..n {
            buf.load(&clear);
            tx.encapsulate(&mut buf, Duration::ZERO)
                .expect("encapsulate");
            sum += buf.len();
        }
        println!("{n} encapsulations of {size} B: {sum}");
        return;
    }
    for _ in 0..n {
        buf.load(&clear);
        tx.encapsulate(&mut buf, Duration::ZERO)
            .expect("encapsulate");
        let Ok(Classified::Ipsec(inb)) = classify(buf.as_slice(), &Classifier::NAT_T) else {
            panic!("not ESP")
        };
        rx.decapsulate(&mut buf, &inb, Duration::ZERO)
            .expect("decapsulate");
        sum += buf.len();
    }
    println!("{n} round trips of {size} B with {suite}: {sum} bytes out");
}
