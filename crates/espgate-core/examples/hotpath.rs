//! Runs the outbound and inbound ESP path N times on one packet size, for
//! instruction-level profiling (`valgrind --tool=callgrind`), which counts
//! work instead of time and so is stable on a shared machine.
//!
//! `cargo run --release -p espgate-core --example hotpath -- SUITE SIZE N`

use espgate_core::crypto::Suite;
use espgate_core::sa::{classify, Classified, Protocol, Sa, SaConfig};
use espgate_core::wire::{ipv4::Ipv4Repr, udp};
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
    let mut clear = vec![0u8; size];
    Ipv4Repr {
        src: Ipv4Addr::new(10, 1, 0, 1),
        dst: Ipv4Addr::new(10, 2, 0, 1),
        protocol: 17,
        tos: 0,
        ident: 1,
        dont_frag: true,
        ttl: 64,
        payload_len: size - 20,
    }
    .emit(&mut clear)
    .expect("header");
    udp::emit(&mut clear[20..], 1, 2, size - 28).expect("udp");
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
    for _ in 0..n {
        buf.load(&clear);
        tx.encapsulate(&mut buf, Duration::ZERO)
            .expect("encapsulate");
        let Ok(Classified::Ipsec(inb)) = classify(buf.as_slice(), 4500) else {
            panic!("not ESP")
        };
        rx.decapsulate(&mut buf, &inb, Duration::ZERO)
            .expect("decapsulate");
        sum += buf.len();
    }
    println!("{n} round trips of {size} B with {suite}: {sum} bytes out");
}
