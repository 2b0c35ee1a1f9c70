//! Seed 001 (Gabriel, diploma thesis, UPB 2018): a VPN tunnel (OpenVPN,
//! which the thesis calls IPsec) over a 40 Gbit/s link, TCP and UDP in both
//! directions with iperf3 block sizes up to 2 KiB, per cipher, then one
//! tuning knob at a time: no fragmentation, 5 s rekeying, TCP options,
//! interrupt throttling under cross traffic, socket buffers.
//!
//! Here: espgate in tunnel mode (ESP in UDP) between the two sites,
//! `iperf3 --bidir`, unshaped veth (the fast link of the thesis); the
//! thesis' ciphers mapped to ESP suites with HMAC-SHA-512.

use super::catalog::{
    at, at_max_x, claim, judge, missing, n, pct, pts, sweep, sweep_plan, words, Entry, Series,
};
use super::experiment::{Experiment, Finding, PlotKind, PlotSpec, Verdict};
use super::model::{series_names, Results};
use super::rig::{GwSpec, IkeSpec, Mode, NetSpec, PathSpec, TcpTuning, Traffic};
use super::run::{Ctx, Knobs, Plan};
use crate::bench;
use anyhow::Result;
use std::collections::BTreeMap;

/// iperf3 block sizes (the thesis names 1024 and 2048 and stops there).
pub const BLOCKS: [u32; 5] = [128, 256, 512, 1024, 2048];

/// The thesis' OpenVPN ciphers and their ESP counterpart, if any.
pub const CIPHERS: [(&str, Option<&str>); 6] = [
    ("AES-128-CBC", Some("aes128-sha512")),
    ("AES-192-CBC", Some("aes192-sha512")),
    ("AES-256-CBC", Some("aes256-sha512")),
    ("DES-CBC", Some("des-sha512")),
    ("BF-CBC", None),
    ("RC2-64-CBC", None),
];

const PAPER_SETUP: &str = "Two Core i7-4790 machines, OpenVPN (TLS-based, not ESP) over a \
    40 Gbit/s Mellanox link, tunnel MTU 1500; iperf3 TCP or UDP in both directions with block \
    sizes up to 2048 bytes; ciphers DES, Blowfish, RC2 and AES-128/192/256 in CBC mode with \
    SHA-512; ten runs per point, averaged.";

const fn plot(title: &'static str) -> PlotSpec {
    PlotSpec {
        title,
        kind: PlotKind::Lines,
        unit: "Mbit/s",
        series_prefix: "",
        x_label: "iperf3 block size (bytes)",
        log_x: true,
    }
}

const fn bars(title: &'static str) -> PlotSpec {
    PlotSpec {
        title,
        kind: PlotKind::Bars,
        unit: "Mbit/s",
        series_prefix: "",
        x_label: "",
        log_x: false,
    }
}

fn traffic(k: &Knobs, udp: bool) -> Traffic {
    Traffic {
        udp,
        len: 1024,
        bidir: true,
        secs: k.secs(),
        udp_rate_bps: None,
    }
}

fn esp(name: &str, suite: &str, net: &NetSpec) -> Series {
    Series {
        name: name.to_string(),
        net: net.clone(),
        path: PathSpec::Espgate(GwSpec::esp(suite, Mode::Tunnel)),
    }
}

fn blocks(k: &Knobs) -> Vec<u32> {
    k.pick(&BLOCKS, 3, 1)
}

#[allow(clippy::too_many_arguments)]
fn entry(
    id: &'static str,
    title: &'static str,
    question: &'static str,
    our_setup: &'static str,
    varies: &'static str,
    seed_tables: &'static [&'static str],
    plots: &'static [PlotSpec],
    findings: fn(&Results) -> Vec<Finding>,
    plan: fn(&Knobs) -> Plan,
    run: fn(&mut Ctx) -> Result<()>,
) -> Entry {
    Entry {
        exp: Experiment {
            id,
            paper: "001",
            title,
            question,
            paper_setup: PAPER_SETUP,
            our_setup,
            varies,
            measures: "throughput received, both directions summed (Mbit/s)",
            seed_tables,
            plots,
            findings,
        },
        plan,
        run,
    }
}

/// The cipher sweep's series (espgate suites only; the others are noted).
fn cipher_series(k: &Knobs) -> Vec<Series> {
    let n = NetSpec::default();
    let mut v: Vec<Series> = CIPHERS
        .iter()
        .filter_map(|(c, s)| s.map(|s| esp(&format!("{c} ({s})"), s, &n)))
        .collect();
    if k.quick {
        v.truncate(1);
    }
    v
}

fn note_missing_ciphers(ctx: &mut Ctx) {
    for (c, s) in CIPHERS {
        if s.is_none() {
            ctx.note(format!(
                "{c}: not available — espgate has no such ESP transform (the thesis' series is \
                 shown, ours is not substituted)"
            ));
        }
    }
}

/// Runs one tunnel rig per (name, net, gw) and measures each at `blocks`
/// with TCP and/or UDP; series names get " TCP"/" UDP" when both run.
fn run_pairs(ctx: &mut Ctx, series: Vec<Series>, sizes: &[u32], udp: &[bool]) -> Result<()> {
    for s in series {
        for &u in udp {
            let mut one = vec![Series {
                name: if udp.len() > 1 {
                    format!("{} {}", s.name, if u { "UDP" } else { "TCP" })
                } else {
                    s.name.clone()
                },
                net: s.net.clone(),
                path: s.path.clone(),
            }];
            let t = traffic(ctx.knobs, u);
            sweep(ctx, &one, sizes, t, |_| Ok(()))?;
            one.clear();
        }
    }
    Ok(())
}

/// The entries of seed 001.
pub fn entries() -> Vec<Entry> {
    vec![
        entry(
            "001-baseline-plain",
            "No tunnel: the link's own throughput",
            "What does the link carry without any tunnel, as the ceiling for the rest?",
            "Plain routing between the sites, unshaped veth, iperf3 --bidir TCP and UDP (-b 0).",
            "block size; TCP or UDP",
            &["001-fig-11", "001-settings"],
            {
                const P: &[PlotSpec] = &[plot("Plain routing, both directions")];
                P
            },
            baseline_findings,
            |k| sweep_plan(k, if k.quick { 1 } else { 2 }, blocks(k).len()),
            |ctx| {
                let s = vec![Series {
                    name: "plain".into(),
                    net: NetSpec::default(),
                    path: PathSpec::Plain,
                }];
                let sizes = blocks(ctx.knobs);
                let modes: &[bool] = if ctx.knobs.quick {
                    &[false]
                } else {
                    &[false, true]
                };
                run_pairs(ctx, s, &sizes, modes)
            },
        ),
        entry(
            "001-cipher-sweep-tcp",
            "Ciphers over TCP",
            "How much does each cipher cost a TCP tunnel, and which block size is best?",
            "espgate tunnel (ESP in UDP, manual keys) with AES-128/192/256-CBC and DES-CBC, \
             each with HMAC-SHA-512; Blowfish and RC2 have no ESP transform in espgate and are \
             marked not available; iperf3 --bidir TCP.",
            "block size; cipher",
            &["001-fig-12-13"],
            {
                const P: &[PlotSpec] = &[plot("TCP through the tunnel, both directions")];
                P
            },
            tcp_sweep_findings,
            |k| sweep_plan(k, if k.quick { 1 } else { 4 }, blocks(k).len()),
            |ctx| {
                note_missing_ciphers(ctx);
                let s = cipher_series(ctx.knobs);
                let sizes = blocks(ctx.knobs);
                run_pairs(ctx, s, &sizes, &[false])
            },
        ),
        entry(
            "001-cipher-sweep-udp",
            "Ciphers over UDP",
            "How does a UDP flow fare through the tunnel, per cipher and block size, and what \
             happens past the MTU?",
            "As 001-cipher-sweep-tcp with iperf3 --bidir UDP at an unlimited rate (-b 0); the \
             receivers' throughput and loss are reported.",
            "block size; cipher",
            &["001-fig-12-13"],
            {
                const P: &[PlotSpec] = &[plot("UDP through the tunnel, both directions")];
                P
            },
            udp_sweep_findings,
            |k| sweep_plan(k, if k.quick { 1 } else { 4 }, blocks(k).len()),
            |ctx| {
                note_missing_ciphers(ctx);
                let s = cipher_series(ctx.knobs);
                let sizes = blocks(ctx.knobs);
                run_pairs(ctx, s, &sizes, &[true])
            },
        ),
        entry(
            "001-nofrag-mss",
            "No fragmentation (jumbo underlay, MSS)",
            "If the underlay carries big packets so the tunnel never fragments, how much do TCP \
             and UDP gain?",
            "AES-128-CBC (aes128-sha512) tunnel; MTU 1500 everywhere against MTU 65535 on the \
             veth links and the gateways (TUN MTU follows, MSS clamped to it); TCP and UDP at \
             1024 and 2048 B blocks.",
            "MTU; TCP or UDP; block size",
            &["001-fig-14-15", "001-settings"],
            {
                const P: &[PlotSpec] = &[plot("MTU 1500 vs 65535")];
                P
            },
            nofrag_findings,
            |k| sweep_plan(k, if k.quick { 2 } else { 4 }, if k.quick { 1 } else { 2 }),
            |ctx| {
                let sizes = ctx.knobs.pick(&[1024u32, 2048], 2, 1);
                let mut s = Vec::new();
                for mtu in [1500u32, 65535] {
                    let net = NetSpec {
                        mtu,
                        ..NetSpec::default()
                    };
                    s.push(esp(
                        &format!("AES-128-CBC, MTU {mtu}"),
                        "aes128-sha512",
                        &net,
                    ));
                }
                let modes: &[bool] = if ctx.knobs.quick {
                    &[false]
                } else {
                    &[false, true]
                };
                run_pairs(ctx, s, &sizes, modes)
            },
        ),
        entry(
            "001-rekey-5s",
            "Rekeying every 5 seconds",
            "What does a tunnel lose when its keys are renegotiated (with a new Diffie-Hellman) \
             every five seconds?",
            "espgate keyed by IKEv2 (PSK), child SA aes128-sha512 with PFS (x25519); the child \
             rekeyed every 5 s against espgate's default lifetime; TCP --bidir at 1024 B; each \
             run lasts at least 12 s so it spans two rekeys.",
            "rekey interval",
            &["001-fig-16-17", "001-settings"],
            {
                const P: &[PlotSpec] = &[bars("Tunnel throughput, default lifetime vs 5 s rekey")];
                P
            },
            rekey_findings,
            |k| Plan {
                rigs: 2,
                points: 2,
                sample_s: rekey_secs(k),
            },
            run_rekey,
        ),
        entry(
            "001-tune-tcp",
            "TCP tuning",
            "Do larger TCP buffers, SACK and timestamps help the tunnel?",
            "The thesis gives no values; seed 000's documented ones stand in: options on, \
             buffers 87380 / 4194304 / 4194304 against the options off and default buffers, set \
             in the hosts' namespaces; AES-128-CBC tunnel, TCP --bidir.",
            "TCP settings; block size",
            &["001-fig-18", "000-text-5.1"],
            {
                const P: &[PlotSpec] = &[plot("TCP tuning")];
                P
            },
            tune_tcp_findings,
            |k| sweep_plan(k, 2, blocks(k).len()),
            |ctx| {
                let mut s = Vec::new();
                for (tag, t) in [("untuned", TcpTuning::Off), ("tuned", TcpTuning::Seed000)] {
                    let net = NetSpec {
                        tcp: t,
                        ..NetSpec::default()
                    };
                    s.push(esp(&format!("AES-128-CBC ({tag})"), "aes128-sha512", &net));
                }
                let sizes = blocks(ctx.knobs);
                run_pairs(ctx, s, &sizes, &[false])
            },
        ),
        entry(
            "001-itr-cross-traffic",
            "Cross traffic on another interface",
            "When the receiving gateway is flooded by traffic outside the tunnel, how much does \
             the tunnel lose, and does limiting the other interface's load help?",
            "A third namespace floods gateway B over a second veth with UDP (iperf3, 1400 B, \
             2 Gbit/s offered) while the tunnel runs TCP --bidir at 1024 B. veth has no \
             interrupt moderation, so the thesis' InterruptThrottleRate is played by policing \
             the flood at that interface's ingress (tc police, 200 Mbit/s): like the \
             throttle, it bounds how much of the gateway's CPU the other interface takes.",
            "flood; mitigation",
            &["001-fig-19-20", "001-settings"],
            {
                const P: &[PlotSpec] = &[bars("Tunnel throughput under cross traffic")];
                P
            },
            itr_findings,
            |k| Plan {
                rigs: 3,
                points: 3,
                sample_s: k.secs(),
            },
            run_itr,
        ),
        entry(
            "001-socket-buffers",
            "Socket buffers",
            "Do bigger send and receive buffers on the tunnel's sockets help?",
            "espgate's gateway.socket_buffer at its default against 4 MiB (net.core.rmem_max \
             and wmem_max raised in the gateways' namespaces); AES-128-CBC tunnel, TCP and UDP \
             --bidir at 1024 B.",
            "socket buffer; TCP or UDP",
            &["001-fig-21-22", "001-settings"],
            {
                const P: &[PlotSpec] = &[bars("Socket buffers")];
                P
            },
            buffers_findings,
            |k| sweep_plan(k, if k.quick { 2 } else { 4 }, 1),
            |ctx| {
                let net = NetSpec::default();
                let mut s = vec![esp("AES-128-CBC, default buffers", "aes128-sha512", &net)];
                let mut big = esp("AES-128-CBC, 4 MiB buffers", "aes128-sha512", &net);
                if let PathSpec::Espgate(g) = &mut big.path {
                    g.socket_buffer = Some(4 << 20);
                }
                s.push(big);
                let modes: &[bool] = if ctx.knobs.quick {
                    &[false]
                } else {
                    &[false, true]
                };
                run_pairs(ctx, s, &[1024], modes)
            },
        ),
        entry(
            "001-buffers-nofrag",
            "Bigger buffers and no fragmentation together",
            "Do the no-fragmentation and buffer changes add up?",
            "MTU 65535 with 4 MiB socket buffers against MTU 1500 with default buffers; \
             AES-128-CBC tunnel, TCP and UDP --bidir at 2048 B.",
            "MTU and buffers; TCP or UDP",
            &["001-fig-23-24"],
            {
                const P: &[PlotSpec] = &[bars("Combined tuning")];
                P
            },
            combined_findings,
            |k| sweep_plan(k, if k.quick { 2 } else { 4 }, 1),
            |ctx| {
                let base = esp(
                    "AES-128-CBC, MTU 1500, default buffers",
                    "aes128-sha512",
                    &NetSpec::default(),
                );
                let net = NetSpec {
                    mtu: 65535,
                    ..NetSpec::default()
                };
                let mut big = esp(
                    "AES-128-CBC, MTU 65535, 4 MiB buffers",
                    "aes128-sha512",
                    &net,
                );
                if let PathSpec::Espgate(g) = &mut big.path {
                    g.socket_buffer = Some(4 << 20);
                }
                let modes: &[bool] = if ctx.knobs.quick {
                    &[false]
                } else {
                    &[false, true]
                };
                run_pairs(ctx, vec![base, big], &[2048], modes)
            },
        ),
        Entry {
            exp: Experiment {
                id: "001-parallel-crypto",
                paper: "001",
                title: "Parallel crypto workers, in order (the thesis' future work)",
                question: "Would spreading the cryptography over several workers, with the \
                    packets put back in sequence order, raise a tunnel's throughput?",
                paper_setup: "Proposed as future work, not measured: parallel encryption \
                    workers and a scheduler that reorders by sequence number.",
                our_setup: "`bench parallel` in memory: espgate's outbound ESP (aes128gcm16, \
                    1400 B) on 1 serial loop against 1 and 2 crypto threads that deliver in \
                    sequence order, packets per second delivered. This machine has 2 vCPUs.",
                varies: "crypto threads",
                measures: "Gbit/s of inner packets delivered in order",
                seed_tables: &["001-text-cited"],
                plots: &[PlotSpec {
                    title: "In-order delivery with crypto threads",
                    kind: PlotKind::Bars,
                    unit: "Gbit/s",
                    series_prefix: "",
                    x_label: "threads",
                    log_x: false,
                }],
                findings: parallel_findings,
            },
            plan: |k| Plan {
                rigs: 0,
                points: 3,
                sample_s: if k.quick { 0.3 } else { 1.0 },
            },
            run: run_parallel,
        },
    ]
}

// ── special runs ────────────────────────────────────────────────────────

fn rekey_secs(k: &Knobs) -> f64 {
    if k.quick {
        k.secs().max(6.0)
    } else {
        k.secs().max(12.0)
    }
}

fn run_rekey(ctx: &mut Ctx) -> Result<()> {
    let secs = rekey_secs(ctx.knobs);
    for (name, rekey) in [
        ("default lifetime", None),
        ("rekey every 5 s (PFS)", Some(5)),
    ] {
        let mut g = GwSpec::esp("aes128-sha512", Mode::Tunnel);
        g.ike = Some(IkeSpec {
            esp_proposal: "aes128-sha512-x25519".into(),
            child_rekey_s: rekey,
        });
        let net = NetSpec::default();
        let mut rig =
            super::rig::Rig::up(&ctx.prefix, &net, &PathSpec::Espgate(g), &ctx.knobs.exe)?;
        for l in rig.describe() {
            ctx.setup(format!("{name}: {l}"));
        }
        let t = Traffic {
            secs,
            ..traffic(ctx.knobs, false)
        };
        ctx.measure(name, 0.0, Some(name), "Mbit/s", || {
            let r = rig.iperf(&t)?;
            Ok((r.mbps, r.extra))
        })?;
    }
    Ok(())
}

fn run_itr(ctx: &mut Ctx) -> Result<()> {
    let t = traffic(ctx.knobs, false);
    for (i, (name, flood, police)) in [
        ("no flood", false, false),
        ("flood", true, false),
        ("flood, policed", true, true),
    ]
    .into_iter()
    .enumerate()
    {
        let net = NetSpec {
            cross: true,
            ..NetSpec::default()
        };
        let mut rig = super::rig::Rig::up(
            &ctx.prefix,
            &net,
            &PathSpec::Espgate(GwSpec::esp("aes128-sha512", Mode::Tunnel)),
            &ctx.knobs.exe,
        )?;
        if police {
            rig.police_cross(200)?;
        }
        if flood {
            rig.start_flood(2000)?;
        }
        for l in rig.describe() {
            ctx.setup(format!("{name}: {l}"));
        }
        ctx.measure("AES-128-CBC tunnel", i as f64, Some(name), "Mbit/s", || {
            let r = rig.iperf(&t)?;
            Ok((r.mbps, r.extra))
        })?;
    }
    Ok(())
}

fn run_parallel(ctx: &mut Ctx) -> Result<()> {
    let rule = ctx.knobs.rule();
    let secs = if ctx.knobs.quick { 0.05 } else { 0.3 };
    let base = bench::Params::new(&["aes128gcm16".into()], &[1400], secs, 1, "out")?;
    let p = bench::parallel::PParams {
        base,
        threads: vec![1, 2],
        batches: vec![32],
    };
    let mut by: BTreeMap<(String, usize), Vec<f64>> = BTreeMap::new();
    let mut serial = Vec::new();
    while !rule.done(&serial) {
        crate::netlab::check_interrupt()?;
        for r in bench::parallel::run(&p, |_| {})? {
            if r.mode == "serial" {
                serial.push(r.gbps);
            }
            by.entry((r.mode.to_string(), r.threads))
                .or_default()
                .push(r.gbps);
        }
    }
    for (i, ((mode, threads), v)) in by.iter().enumerate() {
        let label = if mode == "serial" {
            "serial loop".to_string()
        } else {
            format!("{threads} crypto thread(s), in order")
        };
        ctx.record(
            "aes128gcm16 1400 B",
            i as f64,
            Some(&label),
            "Gbit/s",
            v,
            BTreeMap::new(),
        )?;
    }
    Ok(())
}

// ── findings ────────────────────────────────────────────────────────────

fn baseline_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "001-baseline-plain");
    let paper = format!(
        "Without the tunnel the link is the practical ceiling. {}",
        words("001-fig-11")
    );
    let best = |s: &str| {
        super::model::series(&p, s)
            .iter()
            .map(|q| q.mean)
            .fold(f64::NAN, f64::max)
    };
    let tcp = best("plain TCP");
    let tcp = if tcp.is_nan() { best("plain") } else { tcp };
    if tcp.is_nan() {
        return vec![missing(paper, "no plain run")];
    }
    let udp = best("plain UDP");
    vec![Finding {
        paper,
        ours: format!(
            "plain routing carries up to {} Mbit/s TCP{} (both directions summed)",
            n(tcp),
            if udp.is_nan() {
                String::new()
            } else {
                format!(" and {} Mbit/s UDP", n(udp))
            }
        ),
        verdict: Verdict::Agrees,
    }]
}

/// The best AES and DES series' throughput and their ratio; the block
/// size of the AES-128 peak and its change from 1024 to 2048.
fn sweep_findings(r: &Results, id: &str, proto: &str) -> Vec<Finding> {
    let p = pts(r, id);
    let mut v = Vec::new();
    let paper = "AES is far ahead of DES, Blowfish and RC2 thanks to AES-NI".to_string();
    let aes = "AES-128-CBC (aes128-sha512)";
    let des = "DES-CBC (des-sha512)";
    v.push(match (at_max_x(&p, aes), at_max_x(&p, des)) {
        (Some((x, a)), Some((_, d))) if d > 0.0 => Finding {
            paper,
            ours: format!(
                "{proto} at {x} B: AES-128 {} Mbit/s, DES {} Mbit/s (×{}); Blowfish and RC2 not \
                 available",
                n(a),
                n(d),
                n(a / d)
            ),
            verdict: if a > d * 1.5 {
                Verdict::Agrees
            } else if a > d {
                Verdict::Partly
            } else {
                Verdict::Differs
            },
        },
        _ => missing(paper, "AES-128 and DES series"),
    });
    let c = claim("001-fig-12-13", "peak");
    let paper = format!(
        "Throughput peaks at {} blocks; 2048-byte blocks exceed the MTU and are fragmented",
        c.as_ref()
            .map(|c| format!("{}-byte", n(c.lo)))
            .unwrap_or("1024-byte".into())
    );
    let s = super::model::series(&p, aes);
    v.push(if s.len() < 2 {
        missing(paper, "fewer than two block sizes")
    } else {
        let peak = s
            .iter()
            .max_by(|a, b| a.mean.total_cmp(&b.mean))
            .expect("non-empty");
        let drop = match (at(&p, aes, 1024.0), at(&p, aes, 2048.0)) {
            (Some(a), Some(b)) => format!("; 1024 → 2048 B: {}", pct(a, b)),
            _ => String::new(),
        };
        Finding {
            paper,
            ours: format!(
                "AES-128 peaks at {} B ({} Mbit/s){drop}",
                peak.x,
                n(peak.mean)
            ),
            verdict: match &c {
                Some(c) if (peak.x - c.lo).abs() < 1.0 => Verdict::Agrees,
                Some(_) => Verdict::Differs,
                None => Verdict::NotMeasured,
            },
        }
    });
    v
}

fn tcp_sweep_findings(r: &Results) -> Vec<Finding> {
    sweep_findings(r, "001-cipher-sweep-tcp", "TCP")
}

fn udp_sweep_findings(r: &Results) -> Vec<Finding> {
    let mut v = sweep_findings(r, "001-cipher-sweep-udp", "UDP");
    let hi = claim("001-fig-12-13", "before the drop");
    let lo = claim("001-fig-12-13", "through the tunnel");
    let paper = format!(
        "UDP through the tunnel falls from {} to {} Gbit/s",
        hi.as_ref().map(|c| n(c.lo)).unwrap_or("8".into()),
        lo.as_ref().map(|c| n(c.lo)).unwrap_or("1".into())
    );
    let base = pts(r, "001-baseline-plain");
    let ours = pts(r, "001-cipher-sweep-udp");
    let best = |p: &[&super::model::Point], s: &str| {
        super::model::series(p, s)
            .iter()
            .map(|q| q.mean)
            .fold(f64::NAN, f64::max)
    };
    let (b, t) = (
        best(&base, "plain UDP"),
        best(&ours, "AES-128-CBC (aes128-sha512)"),
    );
    v.push(if b.is_nan() || t.is_nan() {
        missing(
            paper,
            "plain UDP (001-baseline-plain) and the AES-128 UDP series",
        )
    } else {
        let (ratio_paper, ratio) = (
            match (&hi, &lo) {
                (Some(h), Some(l)) => l.lo / h.lo,
                _ => 0.125,
            },
            t / b,
        );
        Finding {
            paper,
            ours: format!(
                "UDP: plain {} Mbit/s, through espgate {} Mbit/s ({} % of plain; the thesis: {} %)",
                n(b),
                n(t),
                n(ratio * 100.0),
                n(ratio_paper * 100.0)
            ),
            verdict: if ratio < 0.5 {
                Verdict::Agrees
            } else {
                Verdict::Differs
            },
        }
    });
    v
}

fn gain_finding(
    p: &[&super::model::Point],
    paper: String,
    c: Option<super::seeds::Claim>,
    before: &str,
    after: &str,
) -> Finding {
    match (at_max_x(p, before), at_max_x(p, after)) {
        (Some((x, b)), Some((_, a))) if b > 0.0 => {
            let g = (a - b) / b * 100.0;
            Finding {
                paper,
                ours: format!("{after} vs {before} at {x} B: {}", pct(b, a)),
                verdict: c.map(|c| judge(&c, g)).unwrap_or(if g > 0.0 {
                    Verdict::Agrees
                } else {
                    Verdict::Differs
                }),
            }
        }
        _ => missing(paper, &format!("{before} or {after}")),
    }
}

fn nofrag_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "001-nofrag-mss");
    let mut v = Vec::new();
    let c = claim("001-fig-14-15", "AES, TCP");
    v.push(gain_finding(
        &p,
        format!(
            "Without fragmentation TCP gains {} with AES",
            c.as_ref()
                .map(|c| c.amount())
                .unwrap_or("about 13 %".into())
        ),
        c,
        "AES-128-CBC, MTU 1500 TCP",
        "AES-128-CBC, MTU 65535 TCP",
    ));
    let c = claim("001-fig-14-15", "UDP, block size 2048");
    v.push(gain_finding(
        &p,
        format!(
            "UDP gains {} at 2048-byte blocks",
            c.as_ref().map(|c| c.amount()).unwrap_or("40 %".into())
        ),
        c,
        "AES-128-CBC, MTU 1500 UDP",
        "AES-128-CBC, MTU 65535 UDP",
    ));
    v
}

fn rekey_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "001-rekey-5s");
    let c = claim("001-fig-16-17", "decrease");
    let paper = format!(
        "Rekeying every 5 s with a new Diffie-Hellman costs only {} against the basic tunnel",
        c.as_ref().map(|c| c.amount()).unwrap_or("5 %".into())
    );
    let get = |l: &str| p.iter().find(|q| q.series == l).map(|q| q.mean);
    match (get("default lifetime"), get("rekey every 5 s (PFS)"), c) {
        (Some(a), Some(b), Some(c)) if a > 0.0 => {
            let loss = (a - b) / a * 100.0;
            vec![Finding {
                paper,
                ours: format!(
                    "{} Mbit/s with the default lifetime, {} Mbit/s rekeying every 5 s: {}",
                    n(a),
                    n(b),
                    pct(a, b)
                ),
                verdict: if loss.abs() <= 2.0 * c.lo {
                    Verdict::Agrees
                } else if loss > 0.0 {
                    Verdict::Partly
                } else {
                    Verdict::Differs
                },
            }]
        }
        _ => vec![missing(paper, "both lifetimes")],
    }
}

fn tune_tcp_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "001-tune-tcp");
    vec![gain_finding(
        &p,
        "Larger TCP buffers with SACK and timestamps improve the tunnel (the thesis prints no \
         number)"
            .into(),
        None,
        "AES-128-CBC (untuned)",
        "AES-128-CBC (tuned)",
    )]
}

fn itr_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "001-itr-cross-traffic");
    let get = |l: &str| {
        p.iter()
            .find(|q| q.x_label.as_deref() == Some(l))
            .map(|q| q.mean)
    };
    let c1 = claim("001-fig-19-20", "no optimization");
    let c2 = claim("001-fig-19-20", "ITR limited");
    let paper = format!(
        "A flood outside the tunnel costs the tunnel {}; with the other NIC's interrupts \
         throttled only {}",
        c1.as_ref().map(|c| c.amount()).unwrap_or("19 %".into()),
        c2.as_ref().map(|c| c.amount()).unwrap_or("4 %".into())
    );
    match (get("no flood"), get("flood"), get("flood, policed")) {
        (Some(a), Some(b), Some(m)) if a > 0.0 => {
            let (d1, d2) = ((a - b) / a * 100.0, (a - m) / a * 100.0);
            vec![Finding {
                paper,
                ours: format!(
                    "the flood costs the tunnel {} %, with the flood policed {} %",
                    n(d1),
                    n(d2)
                ),
                verdict: if d1 > 0.0 && d2 < d1 {
                    match &c1 {
                        Some(c) if judge(c, d1) == Verdict::Agrees => Verdict::Agrees,
                        _ => Verdict::Partly,
                    }
                } else {
                    Verdict::Differs
                },
            }]
        }
        _ => vec![missing(paper, "the three runs")],
    }
}

fn buffers_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "001-socket-buffers");
    let c = claim("001-fig-21-22", "sndbuf");
    let names = series_names(&p);
    let tcp_names: Vec<&String> = names.iter().filter(|s| !s.ends_with("UDP")).collect();
    let (b, a) = match tcp_names.as_slice() {
        [b, a, ..] => ((*b).clone(), (*a).clone()),
        _ => (String::new(), String::new()),
    };
    vec![gain_finding(
        &p,
        format!(
            "Larger send and receive buffers add {} (fewer retransmissions and losses)",
            c.as_ref().map(|c| c.amount()).unwrap_or("about 4 %".into())
        ),
        c,
        &b,
        &a,
    )]
}

fn combined_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "001-buffers-nofrag");
    let names = series_names(&p);
    let tcp_names: Vec<&String> = names.iter().filter(|s| !s.ends_with("UDP")).collect();
    let (b, a) = match tcp_names.as_slice() {
        [b, a, ..] => ((*b).clone(), (*a).clone()),
        _ => (String::new(), String::new()),
    };
    vec![gain_finding(
        &p,
        format!(
            "Together the changes raise throughput further. {}",
            words("001-fig-23-24")
        ),
        None,
        &b,
        &a,
    )]
}

fn parallel_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "001-parallel-crypto");
    let paper = "Future work: parallel crypto workers with in-order delivery should raise \
        throughput (not measured in the thesis)"
        .to_string();
    let serial = p
        .iter()
        .find(|q| q.x_label.as_deref() == Some("serial loop"));
    let best = p
        .iter()
        .filter(|q| q.x_label.as_deref() != Some("serial loop"))
        .max_by(|a, b| a.mean.total_cmp(&b.mean));
    match (serial, best) {
        (Some(s), Some(b)) if s.mean > 0.0 => vec![Finding {
            paper,
            ours: format!(
                "{}: {} Gbit/s against the serial loop's {} Gbit/s (×{}) on this {}-CPU machine",
                b.x_label.clone().unwrap_or_default(),
                n(b.mean),
                n(s.mean),
                n(b.mean / s.mean),
                r.env.cores
            ),
            verdict: if b.mean > s.mean * 1.1 {
                Verdict::Agrees
            } else {
                Verdict::Differs
            },
        }],
        _ => vec![missing(paper, "no bench parallel run")],
    }
}
