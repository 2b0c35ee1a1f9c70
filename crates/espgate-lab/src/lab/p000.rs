//! Seed 000 (Iatrou, Voyiatzis, Serpanos, SECRYPT 2009): IPsec throughput
//! against plain IP over 10, 100 and 1000 Mbit/s links with a netperf
//! message-size sweep, on weak and strong hosts, then the tuning of the TCP
//! stack, of interrupt handling (NAPI) and of the MTU.
//!
//! Here: iperf3 TCP from one site to the other through two espgate
//! gateways (tunnel) or between the gateways themselves (transport), raw
//! ESP/AH as the paper's kernel used; link rates by `htb`, the weaker
//! hosts by a CPU quota on each gateway.

use super::catalog::{
    at, at_max_x, claim, judge, missing, n, pct, pts, sweep, sweep_plan, tcp, words, Entry, Series,
};
use super::experiment::{Experiment, Finding, PlotKind, PlotSpec, Verdict};
use super::model::{series_names, Point, Results};
use super::rig::{GwSpec, Mode, NetSpec, PathSpec, TcpTuning};
use super::run::{Ctx, Knobs, Plan};
use anyhow::Result;

/// netperf's message sizes in the paper.
pub const SIZES: [u32; 10] = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768];

const THROUGHPUT: PlotSpec = PlotSpec {
    title: "Throughput vs message size",
    kind: PlotKind::Lines,
    unit: "Mbit/s",
    series_prefix: "",
    x_label: "message size (bytes)",
    log_x: true,
};

fn net(rate: Option<u32>) -> NetSpec {
    NetSpec {
        rate_mbit: rate,
        ..NetSpec::default()
    }
}

fn plain(net: &NetSpec) -> Series {
    Series {
        name: "plain IP".into(),
        net: net.clone(),
        path: PathSpec::Plain,
    }
}

fn mode_word(m: Mode) -> &'static str {
    match m {
        Mode::Tunnel => "tunnel",
        Mode::Transport => "transport",
    }
}

/// An espgate series: ESP `esp` and/or AH `ah`, raw IP, `mode`.
fn gw(
    esp: Option<&str>,
    ah: Option<&str>,
    mode: Mode,
    net: &NetSpec,
    quota: Option<u32>,
) -> Series {
    let mut g = GwSpec::esp(esp.unwrap_or("aes128-sha1"), mode);
    g.esp = esp.map(str::to_string);
    g.ah = ah.map(str::to_string);
    g.udp = false;
    g.cpu_quota_pct = quota;
    let what = match (esp, ah) {
        (Some(e), Some(a)) => format!("ESP {e} + AH {a}"),
        (Some(e), None) => format!("ESP {e}"),
        (None, Some(a)) => format!("AH {a}"),
        (None, None) => "none".into(),
    };
    Series {
        name: format!("{what} {}", mode_word(mode)),
        net: net.clone(),
        path: PathSpec::Espgate(g),
    }
}

/// The series list, cut to two in `--quick`.
fn cut(k: &Knobs, mut v: Vec<Series>) -> Vec<Series> {
    if k.quick {
        v.truncate(2);
    }
    v
}

fn sizes(k: &Knobs) -> Vec<u32> {
    k.pick(&SIZES, 4, 1)
}

fn run_sweep(ctx: &mut Ctx, series: Vec<Series>) -> Result<()> {
    let sizes = sizes(ctx.knobs);
    let series = cut(ctx.knobs, series);
    let t = tcp(ctx.knobs);
    ctx.setup("iperf3 TCP, one stream, -l = the message size (netperf's send size)");
    sweep(ctx, &series, &sizes, t, |_| Ok(()))
}

fn plan_of(k: &Knobs, series: usize) -> Plan {
    let s = if k.quick { series.min(2) } else { series };
    sweep_plan(k, s, sizes(k).len())
}

// ── the series of each experiment ───────────────────────────────────────

fn link10() -> Vec<Series> {
    let n = net(Some(10));
    vec![
        plain(&n),
        gw(Some("aes128-sha1"), None, Mode::Transport, &n, None),
        gw(Some("aes128-sha1"), None, Mode::Tunnel, &n, None),
        gw(None, Some("sha1"), Mode::Transport, &n, None),
    ]
}

/// CPU quota (% of one CPU per gateway) standing in for the paper's
/// low-end (Pentium 2), medium (Athlon XP) and Pentium 4 hosts.
const LOWEND_QUOTA: u32 = 10;
const MEDIUM_QUOTA: u32 = 25;
const P4_QUOTA: u32 = 50;

fn link100(quota: Option<u32>) -> Vec<Series> {
    let n = net(Some(100));
    vec![
        plain(&n),
        gw(Some("aes128-sha1"), None, Mode::Tunnel, &n, quota),
        gw(Some("3des-sha1"), None, Mode::Tunnel, &n, quota),
        gw(Some("3des-md5"), None, Mode::Tunnel, &n, quota),
        gw(Some("des-sha1"), None, Mode::Tunnel, &n, quota),
        gw(None, Some("md5"), Mode::Tunnel, &n, quota),
        gw(None, Some("sha1"), Mode::Tunnel, &n, quota),
        gw(Some("aes128-sha1"), None, Mode::Transport, &n, quota),
    ]
}

fn link1000(quota: Option<u32>) -> Vec<Series> {
    let n = net(Some(1000));
    vec![
        plain(&n),
        gw(Some("aes128-sha1"), None, Mode::Tunnel, &n, quota),
        gw(Some("aes128-sha1"), None, Mode::Transport, &n, quota),
        gw(Some("aes128gcm16"), None, Mode::Tunnel, &n, quota),
        gw(Some("3des-sha1"), None, Mode::Tunnel, &n, quota),
    ]
}

fn tuned(tcp: TcpTuning) -> Vec<Series> {
    let n = NetSpec {
        rate_mbit: Some(1000),
        tcp,
        ..NetSpec::default()
    };
    let tag = match tcp {
        TcpTuning::Seed000 => "tuned",
        _ => "untuned",
    };
    let mut v = vec![
        plain(&n),
        gw(None, Some("md5"), Mode::Tunnel, &n, None),
        gw(Some("aes128-sha1"), None, Mode::Tunnel, &n, None),
        gw(Some("3des-sha1"), None, Mode::Tunnel, &n, None),
    ];
    for s in &mut v {
        s.name = format!("{} ({tag})", s.name);
    }
    v
}

fn napi(mtu: u32) -> Vec<Series> {
    let n = NetSpec {
        rate_mbit: Some(1000),
        mtu,
        ..NetSpec::default()
    };
    let mut v = Vec::new();
    for mode in [Mode::Tunnel, Mode::Transport] {
        for batched in [false, true] {
            let mut s = gw(Some("aes128-sha1"), None, mode, &n, None);
            if let PathSpec::Espgate(g) = &mut s.path {
                if !batched {
                    g.batch = Some(1);
                    g.offloads = false;
                }
            }
            s.name = format!(
                "{} ({})",
                s.name,
                if batched {
                    "batched + offloads"
                } else {
                    "batch 1, no offloads"
                }
            );
            v.push(s);
        }
    }
    v
}

fn mtu_series(mtu: u32) -> Vec<Series> {
    let n = NetSpec {
        rate_mbit: Some(1000),
        mtu,
        tcp: TcpTuning::Seed000,
        cross: false,
    };
    let mut v = vec![
        plain(&n),
        gw(None, Some("md5"), Mode::Tunnel, &n, None),
        gw(None, Some("sha1"), Mode::Tunnel, &n, None),
        gw(Some("aes128-sha1"), None, Mode::Tunnel, &n, None),
        gw(Some("3des-sha1"), None, Mode::Tunnel, &n, None),
        gw(Some("aes256-sha1"), Some("sha1"), Mode::Tunnel, &n, None),
    ];
    for s in &mut v {
        s.name = format!("{} (MTU {mtu})", s.name);
    }
    v
}

// ── the entries ─────────────────────────────────────────────────────────

const PAPER_SETUP: &str = "Two Linux 2.6.11 hosts cabled back to back, native IPsec with \
    manual keys between them in transport and tunnel mode; netperf sends one TCP stream for 10 s \
    per message size (64 B to 32 KiB), repeated 4 to 12 times until the 95 % confidence \
    interval is 3 % wide; MTU 1500.";

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
            paper: "000",
            title,
            question,
            paper_setup: PAPER_SETUP,
            our_setup,
            varies,
            measures: "TCP throughput received (Mbit/s); CPU of the host and the gateways",
            seed_tables,
            plots,
            findings,
        },
        plan,
        run,
    }
}

/// The entries of seed 000.
pub fn entries() -> Vec<Entry> {
    vec![
        entry(
            "000-link10-ip-vs-ipsec",
            "IP vs IPsec on a 10 Mbit/s link",
            "On a slow link, does IPsec cost throughput or CPU, and how much does tunnel mode \
             lose against transport mode?",
            "The ga–gb link shaped to 10 Mbit/s (htb); plain IP, ESP aes128-sha1 in transport \
             and tunnel mode, AH sha1 in transport mode (raw IP, manual keys).",
            "message size; plain, ESP/AH, transport/tunnel",
            &["000-fig-1", "000-settings", "000-table-1"],
            &[THROUGHPUT],
            link10_findings,
            |k| plan_of(k, 4),
            |ctx| run_sweep(ctx, link10()),
        ),
        entry(
            "000-link100-lowend",
            "100 Mbit/s, low-end hosts",
            "On a 100 Mbit/s link with a slow CPU, how does the cost of each algorithm show in \
             the throughput, and how does throughput grow with the message size?",
            "100 Mbit/s (htb); each gateway capped at 10 % of one CPU (cgroup CPU quota) to \
             play the Pentium 2; plain, ESP with AES-128, 3DES and DES, AH with MD5 and SHA-1.",
            "message size; algorithm",
            &["000-fig-2", "000-text-4.2-modes"],
            &[THROUGHPUT],
            lowend_findings,
            |k| plan_of(k, 8),
            |ctx| run_sweep(ctx, link100(Some(LOWEND_QUOTA))),
        ),
        entry(
            "000-link100-medium",
            "100 Mbit/s, medium hosts",
            "With a mid-range CPU, which algorithms still fill a 100 Mbit/s link, and how big \
             is the 3DES penalty?",
            "100 Mbit/s (htb); each gateway capped at 25 % of one CPU (the Athlon XP's role).",
            "message size; algorithm",
            &["000-text-4.2-medium", "000-text-4.2-modes"],
            &[THROUGHPUT],
            medium_findings,
            |k| plan_of(k, 8),
            |ctx| run_sweep(ctx, link100(Some(MEDIUM_QUOTA))),
        ),
        entry(
            "000-link100-highend",
            "100 Mbit/s, high-end hosts",
            "Does a fast CPU close the 3DES gap on a 100 Mbit/s link, and how far apart are \
             transport and tunnel mode?",
            "100 Mbit/s (htb); gateways uncapped (the Xeon's role).",
            "message size; algorithm; mode",
            &["000-fig-3", "000-text-4.2-modes"],
            &[THROUGHPUT],
            highend_findings,
            |k| plan_of(k, 8),
            |ctx| run_sweep(ctx, link100(None)),
        ),
        entry(
            "000-link1000-p4",
            "1 Gbit/s, Pentium 4 hosts",
            "On a gigabit link with a CPU too slow to fill it, how much throughput does IPsec \
             lose?",
            "1000 Mbit/s (htb); each gateway capped at 50 % of one CPU (the Pentium 4's role); \
             plain IP is kernel forwarding and not capped.",
            "message size; algorithm",
            &["000-text-4.3-p4"],
            &[THROUGHPUT],
            p4_findings,
            |k| plan_of(k, 5),
            |ctx| run_sweep(ctx, link1000(Some(P4_QUOTA))),
        ),
        entry(
            "000-link1000-xeon",
            "1 Gbit/s, Xeon hosts",
            "On a gigabit link with the fastest hosts, at which message size does plain IP \
             fill the link, how far does IPsec get, and does message size matter for AES?",
            "1000 Mbit/s (htb), gateways uncapped; plain, ESP aes128-sha1 (tunnel and \
             transport), aes128gcm16 (today's default) and 3des-sha1.",
            "message size; algorithm; mode",
            &["000-fig-4"],
            &[THROUGHPUT],
            xeon_findings,
            |k| plan_of(k, 5),
            |ctx| run_sweep(ctx, link1000(None)),
        ),
        entry(
            "000-link1000-cpu",
            "CPU use at 1 Gbit/s",
            "Where does the CPU time go when IPsec runs at gigabit speed: interrupts, softirq, \
             user or system?",
            "1000 Mbit/s (htb), gateways uncapped; /proc/stat shares of the whole machine \
             (all namespaces share it) during each run, and each gateway's user and system \
             time from /proc/PID/stat. The kernel's IPsec ran in softirq; espgate's runs in \
             user space, so its cryptography shows as user time.",
            "algorithm; CPU state",
            &["000-fig-5"],
            &[
                PlotSpec {
                    title: "Machine CPU by state during the run",
                    kind: PlotKind::Stacked,
                    unit: "% CPU",
                    series_prefix: "",
                    x_label: "state",
                    log_x: false,
                },
                THROUGHPUT,
            ],
            cpu_findings,
            |k| {
                let mut p = plan_of(k, 3);
                p.points = p.rigs * if k.quick { 1 } else { 2 };
                p
            },
            run_cpu,
        ),
        entry(
            "000-tune-tcp",
            "TCP stack tuning",
            "How much do TCP timestamps, window scaling, SACK and 4 MiB socket buffers add to \
             plain and IPsec throughput?",
            "1000 Mbit/s (htb); the hosts' TCP first with the three options off and the \
             kernel's default buffers (modern kernels enable them, so the 'before' state is \
             set explicitly), then the paper's values (options on, buffers 87380 / 4194304 / \
             4194304).",
            "message size; TCP settings; algorithm",
            &["000-text-5.1", "000-settings"],
            &[THROUGHPUT],
            tune_tcp_findings,
            |k| plan_of(k, 8),
            |ctx| {
                let mut s = tuned(TcpTuning::Off);
                let mut t = tuned(TcpTuning::Seed000);
                if ctx.knobs.quick {
                    s.truncate(1);
                    t.truncate(1);
                }
                s.extend(t);
                let sizes = sizes(ctx.knobs);
                let tr = tcp(ctx.knobs);
                sweep(ctx, &s, &sizes, tr, |_| Ok(()))
            },
        ),
        entry(
            "000-tune-napi",
            "Interrupt coalescing (NAPI), MTU 1500",
            "Does handling packets in batches (NAPI) instead of one interrupt per packet help \
             IPsec throughput, for small and for large messages?",
            "1000 Mbit/s (htb), MTU 1500. The userspace analogue of NAPI is espgate's batching \
             and offloads: `batch = 1` with offloads off (one packet per system call, like an \
             interrupt per packet) against the default batch with GRO/GSO on.",
            "message size; batching; mode",
            &["000-text-5.2-napi"],
            &[THROUGHPUT],
            napi_findings,
            |k| plan_of(k, 4),
            |ctx| run_sweep(ctx, napi(1500)),
        ),
        entry(
            "000-tune-napi-jumbo",
            "Interrupt coalescing with jumbo frames (MTU 9000)",
            "With jumbo frames, does batching matter more, do results get less stable, and do \
             transport and tunnel mode now differ?",
            "As 000-tune-napi with MTU 9000 on every link and on the gateways' TUN.",
            "message size; batching; mode",
            &["000-text-5.2-jumbo", "000-text-5-intro"],
            &[THROUGHPUT],
            jumbo_findings,
            |k| plan_of(k, 4),
            |ctx| run_sweep(ctx, napi(9000)),
        ),
        entry(
            "000-tune-mtu",
            "The MTU's contribution",
            "After the TCP and NAPI tuning, how much does a jumbo MTU add for AH, ESP and \
             ESP+AH?",
            "1000 Mbit/s (htb), the paper's TCP tuning, default batching; MTU 1500 against \
             9000 for plain, AH md5/sha1, ESP aes128-sha1 and 3des-sha1, ESP aes256-sha1 + AH \
             sha1, all tunnel mode; x = message size.",
            "MTU; algorithm",
            &["000-fig-6", "000-text-5-intro"],
            &[THROUGHPUT],
            mtu_findings,
            |k| plan_of(k, 12),
            |ctx| {
                let mut s = mtu_series(1500);
                let mut j = mtu_series(9000);
                if ctx.knobs.quick {
                    s.truncate(1);
                    j.truncate(1);
                }
                s.extend(j);
                let sizes = ctx.knobs.pick(&SIZES, 2, 1);
                let tr = tcp(ctx.knobs);
                sweep(ctx, &s, &sizes, tr, |_| Ok(()))
            },
        ),
    ]
}

/// 000-link1000-cpu: a sweep that also records the CPU states as points.
fn run_cpu(ctx: &mut Ctx) -> Result<()> {
    let n = net(Some(1000));
    let series = cut(
        ctx.knobs,
        vec![
            plain(&n),
            gw(Some("aes128-sha1"), None, Mode::Tunnel, &n, None),
            gw(Some("3des-sha1"), None, Mode::Tunnel, &n, None),
        ],
    );
    let sizes = ctx.knobs.pick(&[1024u32, 16384], 2, 1);
    let t = tcp(ctx.knobs);
    sweep(ctx, &series, &sizes, t, |_| Ok(()))?;
    // The CPU shares of the throughput points, as their own points.
    let id = ctx.id().to_string();
    let throughput: Vec<_> = ctx_points(ctx, &id);
    for p in throughput {
        for (i, state) in ["user", "system", "irq", "softirq"].iter().enumerate() {
            if let Some(v) = p.extra.get(&format!("cpu.{state}")) {
                ctx.record(
                    &format!("{} {} B", p.series, p.x),
                    i as f64,
                    Some(state),
                    "% CPU",
                    &[*v],
                    Default::default(),
                )?;
            }
        }
    }
    Ok(())
}

fn ctx_points(ctx: &Ctx, id: &str) -> Vec<Point> {
    ctx.points()
        .iter()
        .filter(|p| p.experiment == id && p.unit == "Mbit/s")
        .cloned()
        .collect()
}

// ── findings ────────────────────────────────────────────────────────────

/// Tunnel vs transport: the loss of tunnel mode in percent at the largest
/// size both have, for `suite` (e.g. `ESP aes128-sha1`).
fn mode_gap(p: &[&Point], suite: &str) -> Option<(f64, f64)> {
    let tr = at_max_x(p, &format!("{suite} transport"))?;
    let tu = at(p, &format!("{suite} tunnel"), tr.0)?;
    Some((tr.0, (tr.1 - tu) / tr.1 * 100.0))
}

fn link10_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "000-link10-ip-vs-ipsec");
    let mut v = Vec::new();
    let paper = "IPsec costs almost nothing on a 10 Mbit/s link: every mode fills it, with a \
        small rise in CPU"
        .to_string();
    match at_max_x(&p, "plain IP") {
        Some((x, plain)) => {
            let ipsec: Vec<(String, f64)> = series_names(&p)
                .into_iter()
                .filter(|s| s != "plain IP")
                .filter_map(|s| at(&p, &s, x).map(|m| (s, m)))
                .collect();
            if ipsec.is_empty() {
                v.push(missing(paper, "no IPsec series"));
            } else {
                let worst = ipsec.iter().map(|(_, m)| *m).fold(f64::INFINITY, f64::min);
                v.push(Finding {
                    paper,
                    ours: format!(
                        "at {x} B plain IP gets {} Mbit/s, the IPsec series {} to {} Mbit/s \
                         (worst {} of plain)",
                        n(plain),
                        n(worst),
                        n(ipsec.iter().map(|(_, m)| *m).fold(0.0, f64::max)),
                        pct(plain, worst)
                    ),
                    verdict: if worst >= plain * 0.9 {
                        Verdict::Agrees
                    } else if worst >= plain * 0.7 {
                        Verdict::Partly
                    } else {
                        Verdict::Differs
                    },
                });
            }
        }
        None => v.push(missing(paper, "no plain IP run")),
    }
    let c = claim("000-fig-1", "tunnel-mode");
    let paper = format!(
        "Tunnel mode loses {} of throughput against transport mode (bigger packets)",
        c.as_ref().map(|c| c.amount()).unwrap_or("3 %".into())
    );
    v.push(match (mode_gap(&p, "ESP aes128-sha1"), c) {
        (Some((x, gap)), Some(c)) => Finding {
            paper,
            ours: format!(
                "tunnel mode {} transport mode at {x} B (ESP aes128-sha1)",
                below(gap)
            ),
            verdict: judge(&c, gap),
        },
        _ => missing(paper, "transport or tunnel series"),
    });
    v
}

/// Throughput growth from the smallest to the largest message size per
/// series, as "name ×ratio".
fn growth(p: &[&Point]) -> Vec<(String, f64)> {
    series_names(p)
        .into_iter()
        .filter_map(|s| {
            let v = super::model::series(p, &s);
            let (a, b) = (v.first()?, v.last()?);
            (v.len() > 1 && a.mean > 0.0).then(|| (s.clone(), b.mean / a.mean))
        })
        .collect()
}

fn lowend_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "000-link100-lowend");
    let paper = format!(
        "The cost of the cryptography shows in proportion to its complexity, and throughput \
         grows with message size (nearly logarithmically) except for MD5, SHA-1 and 3DES. {}",
        words("000-fig-2")
    );
    let g = growth(&p);
    let x = p.iter().map(|q| q.x).fold(0.0, f64::max);
    let mut ranked: Vec<(String, f64)> = series_names(&p)
        .into_iter()
        .filter_map(|s| at(&p, &s, x).map(|m| (s, m)))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    if ranked.len() < 2 {
        return vec![missing(paper, "fewer than two series")];
    }
    let slowest = &ranked[ranked.len() - 1];
    let verdict = if slowest.0.contains("3des") {
        Verdict::Agrees
    } else {
        Verdict::Partly
    };
    vec![Finding {
        paper,
        ours: format!(
            "at {x} B (gateways at {LOWEND_QUOTA} % of a CPU): fastest {} ({} Mbit/s), slowest \
             {} ({} Mbit/s); growth from the smallest to the largest message: {}",
            ranked[0].0,
            n(ranked[0].1),
            slowest.0,
            n(slowest.1),
            if g.is_empty() {
                "one size only".into()
            } else {
                g.iter()
                    .map(|(s, r)| format!("{s} ×{}", n(*r)))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
        verdict,
    }]
}

/// The 3DES penalty against plain IP (Mbit/s) and the mean spread over
/// sizes of the 3DES series.
fn des3_penalty(p: &[&Point]) -> Option<(f64, f64)> {
    let x = at_max_x(p, "plain IP")?;
    let d = at(p, "ESP 3des-sha1 tunnel", x.0)?;
    let s = super::model::series(p, "ESP 3des-sha1 tunnel");
    let mean = s.iter().map(|q| q.mean).sum::<f64>() / s.len() as f64;
    let var = s.iter().map(|q| (q.mean - mean).abs()).sum::<f64>() / s.len() as f64;
    Some((x.1 - d, var))
}

fn medium_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "000-link100-medium");
    let c = claim("000-text-4.2-medium", "penalty");
    let paper = format!(
        "Every algorithm but DES+SHA-1 and 3DES keeps the link full; 3DES loses {} against \
         the link",
        c.as_ref()
            .map(|c| c.amount())
            .unwrap_or("40–50 Mbps".into())
    );
    match (des3_penalty(&p), c) {
        (Some((pen, var)), Some(c)) => vec![Finding {
            paper,
            ours: format!(
                "3des-sha1 {} Mbit/s below plain IP at the largest size (gateways at \
                 {MEDIUM_QUOTA} % of a CPU), varying by {} Mbit/s on average over the sizes",
                n(pen),
                n(var)
            ),
            verdict: judge(&c, pen),
        }],
        _ => vec![missing(paper, "no plain or 3DES series")],
    }
}

fn highend_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "000-link100-highend");
    let c = claim("000-fig-3", "gap");
    let paper = format!(
        "A faster CPU narrows the 3DES gap to {}",
        c.as_ref()
            .map(|c| c.amount())
            .unwrap_or("35–40 Mbps".into())
    );
    let mut v = vec![match (des3_penalty(&p), c) {
        (Some((pen, _)), Some(c)) => Finding {
            paper,
            ours: format!(
                "3des-sha1 {} Mbit/s below plain IP, gateways uncapped",
                n(pen)
            ),
            verdict: judge(&c, pen),
        },
        _ => missing(paper, "no plain or 3DES series"),
    }];
    let c = claim("000-text-4.2-modes", "transport vs tunnel");
    let paper = format!(
        "At 100 Mbit/s transport and tunnel mode differ by {}",
        c.as_ref().map(|c| c.amount()).unwrap_or("3–5 %".into())
    );
    v.push(match (mode_gap(&p, "ESP aes128-sha1"), c) {
        (Some((x, gap)), Some(c)) => Finding {
            paper,
            ours: format!("tunnel mode {} transport at {x} B", below(gap)),
            verdict: judge(&c, gap.abs()),
        },
        _ => missing(paper, "transport or tunnel series"),
    });
    v
}

fn p4_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "000-link1000-p4");
    let c = claim("000-text-4.3-p4", "penalty");
    let paper = format!(
        "A Pentium 4 cannot fill a gigabit link; IPsec loses {} of the throughput",
        c.as_ref()
            .map(|c| c.amount())
            .unwrap_or("more than 50 %".into())
    );
    match (at_max_x(&p, "plain IP"), c) {
        (Some((x, plain)), Some(c)) => match at(&p, "ESP aes128-sha1 tunnel", x) {
            Some(e) => {
                let loss = (plain - e) / plain * 100.0;
                vec![Finding {
                    paper,
                    ours: format!(
                        "at {x} B plain IP {} Mbit/s, ESP aes128-sha1 with gateways at {P4_QUOTA} % \
                         of a CPU {} Mbit/s: {} % less",
                        n(plain),
                        n(e),
                        n(loss)
                    ),
                    verdict: judge(&c, loss),
                }]
            }
            None => vec![missing(paper, "no ESP series")],
        },
        _ => vec![missing(paper, "no plain series")],
    }
}

fn xeon_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "000-link1000-xeon");
    let mut v = Vec::new();
    let c = claim("000-fig-4", "saturates");
    let paper = format!(
        "Plain IP fills the gigabit link for messages {} bytes",
        c.as_ref()
            .map(|c| c.amount().replace(" bytes", ""))
            .map(|a| format!("of {a}"))
            .unwrap_or("above 256".into())
    );
    let plain = super::model::series(&p, "plain IP");
    v.push(if plain.is_empty() {
        missing(paper, "no plain series")
    } else {
        let full = plain.iter().find(|q| q.mean >= 900.0);
        Finding {
            paper,
            ours: match full {
                Some(q) => format!("plain IP reaches {} Mbit/s from {} B on", n(q.mean), q.x),
                None => format!(
                    "plain IP stays below 900 Mbit/s at every size measured (best {})",
                    n(plain.iter().map(|q| q.mean).fold(0.0, f64::max))
                ),
            },
            verdict: match (full, &c) {
                (Some(q), Some(c)) if q.x <= c.lo * 2.0 => Verdict::Agrees,
                (Some(_), _) => Verdict::Partly,
                (None, _) => Verdict::Differs,
            },
        }
    });
    let c = claim("000-fig-4", "confidentiality");
    let paper = format!(
        "With encryption and integrity the hosts reach {}",
        c.as_ref()
            .map(|c| c.amount())
            .unwrap_or("up to 300 Mbps".into())
    );
    let best = series_names(&p)
        .into_iter()
        .filter(|s| s.starts_with("ESP"))
        .flat_map(|s| {
            super::model::series(&p, &s)
                .into_iter()
                .map(|q| (s.clone(), q.mean))
                .collect::<Vec<_>>()
        })
        .max_by(|a, b| a.1.total_cmp(&b.1));
    v.push(match (best, c) {
        (Some((s, m)), Some(c)) => Finding {
            paper,
            ours: format!("best IPsec series: {s}, {} Mbit/s", n(m)),
            verdict: judge(&c, m),
        },
        _ => missing(paper, "no ESP series"),
    });
    let c = claim("000-fig-4", "AES128 throughput ratio");
    let paper = format!(
        "AES-128's throughput {} doubles from 64 B to 8 KiB messages",
        c.as_ref().map(|_| "almost").unwrap_or("almost")
    );
    let s = super::model::series(&p, "ESP aes128-sha1 tunnel");
    let small = s.iter().find(|q| q.x <= 64.0);
    let big = s.iter().rev().find(|q| q.x >= 4096.0);
    v.push(match (small, big, c) {
        (Some(a), Some(b), Some(c)) if a.mean > 0.0 => {
            let r = b.mean / a.mean;
            Finding {
                paper,
                ours: format!("ESP aes128-sha1: ×{} from {} B to {} B", n(r), a.x, b.x),
                verdict: judge(&c, r),
            }
        }
        _ => missing(paper, "64 B and ≥ 4 KiB points of ESP aes128-sha1"),
    });
    let paper = "Transport and tunnel mode differ negligibly at 1 Gbit/s".to_string();
    v.push(match mode_gap(&p, "ESP aes128-sha1") {
        Some((x, gap)) => Finding {
            paper,
            ours: format!("tunnel mode {} transport at {x} B", below(gap)),
            verdict: if gap.abs() <= 5.0 {
                Verdict::Agrees
            } else if gap.abs() <= 10.0 {
                Verdict::Partly
            } else {
                Verdict::Differs
            },
        },
        None => missing(paper, "transport or tunnel series"),
    });
    v
}

fn cpu_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "000-link1000-cpu");
    let paper = format!(
        "The CPU is fully used and most of its time is softirq (the kernel's per-packet IPsec), \
         then IRQ. {}",
        words("000-fig-5")
    );
    let cpu: Vec<&&Point> = p
        .iter()
        .filter(|q| q.unit == "% CPU" && q.series.starts_with("ESP"))
        .collect();
    if cpu.is_empty() {
        return vec![missing(paper, "no CPU breakdown of an IPsec run")];
    }
    let mut by_state: std::collections::BTreeMap<String, (f64, usize)> = Default::default();
    for q in &cpu {
        let e = by_state
            .entry(q.x_label.clone().unwrap_or_default())
            .or_default();
        e.0 += q.mean;
        e.1 += 1;
    }
    let mut avg: Vec<(String, f64)> = by_state
        .into_iter()
        .map(|(k, (s, c))| (k, s / c as f64))
        .collect();
    avg.sort_by(|a, b| b.1.total_cmp(&a.1));
    let busy: f64 = avg.iter().map(|a| a.1).sum();
    vec![Finding {
        paper,
        ours: format!(
            "during ESP runs the machine is {} % busy; largest state {} ({} %), then {} ({} %) \
             — espgate's cryptography is user time, not softirq",
            n(busy),
            avg[0].0,
            n(avg[0].1),
            avg.get(1).map(|a| a.0.clone()).unwrap_or_default(),
            n(avg.get(1).map(|a| a.1).unwrap_or(0.0))
        ),
        verdict: if avg[0].0 == "softirq" {
            Verdict::Agrees
        } else {
            Verdict::Differs
        },
    }]
}

/// Gain (Mbit/s) of the `after` series over the `before` series at the
/// largest common size.
fn gain(p: &[&Point], before: &str, after: &str) -> Option<(f64, f64)> {
    let (x, b) = at_max_x(p, before)?;
    let a = at(p, after, x)?;
    Some((x, a - b))
}

fn tune_tcp_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "000-tune-tcp");
    let mut v = Vec::new();
    for (needle, base) in [
        ("plain IP and AH", "plain IP"),
        ("ESP", "ESP aes128-sha1 tunnel"),
    ] {
        let c = claim("000-text-5.1", needle);
        let paper = format!(
            "The TCP tuning adds {} for {needle}",
            c.as_ref()
                .map(|c| c.amount())
                .unwrap_or("some Mbit/s".into())
        );
        v.push(
            match (
                gain(&p, &format!("{base} (untuned)"), &format!("{base} (tuned)")),
                c,
            ) {
                (Some((x, g)), Some(c)) => Finding {
                    paper,
                    ours: format!(
                        "{base}: {} Mbit/s at {x} B",
                        if g >= 0.0 { format!("+{}", n(g)) } else { n(g) }
                    ),
                    verdict: judge(&c, g),
                },
                _ => missing(paper, "untuned or tuned series"),
            },
        );
    }
    v
}

fn napi_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "000-tune-napi");
    let mut v = Vec::new();
    let small = claim("000-text-5.2-napi", "decrease");
    let large = claim("000-text-5.2-napi", "increase");
    let base = "ESP aes128-sha1 tunnel";
    let one = format!("{base} (batch 1, no offloads)");
    let many = format!("{base} (batched + offloads)");
    let s1 = super::model::series(&p, &one);
    let paper = format!(
        "NAPI costs {} for messages under 1 KiB and adds {} for larger ones",
        small
            .as_ref()
            .map(|c| c.amount())
            .unwrap_or("about 10 Mbps".into()),
        large
            .as_ref()
            .map(|c| c.amount())
            .unwrap_or("50 Mbps".into())
    );
    let deltas: Vec<(f64, f64)> = s1
        .iter()
        .filter_map(|q| at(&p, &many, q.x).map(|m| (q.x, m - q.mean)))
        .collect();
    v.push(if deltas.is_empty() {
        missing(paper, "batch 1 or batched series")
    } else {
        let big: Vec<&(f64, f64)> = deltas.iter().filter(|d| d.0 >= 1024.0).collect();
        Finding {
            paper,
            ours: format!(
                "batching changes tunnel throughput by {}",
                deltas
                    .iter()
                    .map(|(x, d)| format!(
                        "{}{} Mbit/s at {x} B",
                        if *d >= 0.0 { "+" } else { "" },
                        n(*d)
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            verdict: if big.iter().all(|d| d.1 > 0.0) && !big.is_empty() {
                Verdict::Agrees
            } else {
                Verdict::Differs
            },
        }
    });
    let paper = "At MTU 1500 transport and tunnel mode differ negligibly with NAPI".to_string();
    let tr = at_max_x(&p, "ESP aes128-sha1 transport (batched + offloads)");
    v.push(
        match tr.and_then(|(x, t)| at(&p, &many, x).map(|u| (x, t, u))) {
            Some((x, t, u)) if t > 0.0 => {
                let gap = (t - u) / t * 100.0;
                Finding {
                    paper,
                    ours: format!("batched: tunnel {} transport at {x} B", below(gap)),
                    verdict: if gap.abs() <= 5.0 {
                        Verdict::Agrees
                    } else {
                        Verdict::Differs
                    },
                }
            }
            _ => missing(paper, "batched transport or tunnel series"),
        },
    );
    v
}

fn jumbo_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "000-tune-napi-jumbo");
    let large = claim("000-text-5.2-jumbo", "increase, larger");
    let paper = format!(
        "With MTU 9000 the batching effect grows ({} for larger messages) and results become \
         unstable",
        large
            .as_ref()
            .map(|c| c.amount())
            .unwrap_or("40–120 Mbps".into())
    );
    let base = "ESP aes128-sha1 tunnel";
    let one = format!("{base} (batch 1, no offloads)");
    let many = format!("{base} (batched + offloads)");
    let mut v = vec![match (gain(&p, &one, &many), large) {
        (Some((x, g)), Some(c)) => {
            let spread = p
                .iter()
                .filter(|q| q.mean > 0.0)
                .map(|q| q.ci95 / q.mean * 100.0)
                .fold(0.0, f64::max);
            Finding {
                paper,
                ours: format!(
                    "batching adds {} Mbit/s at {x} B in tunnel mode; the widest 95 % CI is ±{} % \
                     of its mean",
                    n(g),
                    n(spread)
                ),
                verdict: judge(&c, g),
            }
        }
        _ => missing(paper, "batch 1 or batched series"),
    }];
    let paper = "With jumbo frames tunnel mode gains over transport mode, the only case where \
        the modes differ"
        .to_string();
    let tr = at_max_x(&p, "ESP aes128-sha1 transport (batched + offloads)");
    v.push(
        match tr.and_then(|(x, t)| at(&p, &many, x).map(|u| (x, t, u))) {
            Some((x, t, u)) => Finding {
                paper,
                ours: format!(
                    "batched at {x} B: tunnel {} Mbit/s, transport {} Mbit/s ({})",
                    n(u),
                    n(t),
                    pct(t, u)
                ),
                verdict: if u > t {
                    Verdict::Agrees
                } else {
                    Verdict::Differs
                },
            },
            None => missing(paper, "batched transport or tunnel series"),
        },
    );
    v
}

fn mtu_findings(r: &Results) -> Vec<Finding> {
    let p = pts(r, "000-tune-mtu");
    let mut v = Vec::new();
    let md5 = claim("000-fig-6", "AH MD5 peak");
    let paper = format!(
        "With the larger MTU, AH-MD5 peaks at {} like plain IP",
        md5.as_ref()
            .map(|c| c.amount())
            .unwrap_or("985 Mbps".into())
    );
    let best = |s: &str| {
        super::model::series(&p, s)
            .iter()
            .map(|q| q.mean)
            .fold(f64::NAN, f64::max)
    };
    let (m, pl) = (
        best("AH md5 tunnel (MTU 9000)"),
        best("plain IP (MTU 9000)"),
    );
    v.push(if m.is_nan() || pl.is_nan() {
        missing(paper, "AH md5 or plain at MTU 9000")
    } else {
        Finding {
            paper,
            ours: format!(
                "at MTU 9000 AH md5 peaks at {} Mbit/s, plain IP at {} Mbit/s",
                n(m),
                n(pl)
            ),
            verdict: if m >= pl * 0.9 {
                Verdict::Agrees
            } else if m >= pl * 0.6 {
                Verdict::Partly
            } else {
                Verdict::Differs
            },
        }
    });
    let c = claim("000-fig-6", "combined ESP+AH");
    let paper = format!(
        "ESP+AH (AES-256 + SHA-1) gains {} from the larger MTU",
        c.as_ref().map(|c| c.amount()).unwrap_or("100 Mbps".into())
    );
    let s = "ESP aes256-sha1 + AH sha1 tunnel";
    v.push(
        match (
            gain(&p, &format!("{s} (MTU 1500)"), &format!("{s} (MTU 9000)")),
            c,
        ) {
            (Some((x, g)), Some(c)) => Finding {
                paper,
                ours: format!(
                    "{} Mbit/s at {x} B",
                    if g >= 0.0 { format!("+{}", n(g)) } else { n(g) }
                ),
                verdict: judge(&c, g),
            },
            _ => missing(paper, "ESP+AH at both MTUs"),
        },
    );
    v
}

/// "1.5 % below" for a positive gap (in %), "2.3 % above" for a negative one.
fn below(gap: f64) -> String {
    if gap >= 0.0 {
        format!("{} % below", n(gap))
    } else {
        format!("{} % above", n(-gap))
    }
}
