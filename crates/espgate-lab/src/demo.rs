//! `espgate demo`: two sites in network namespaces, first over plain
//! routing, then through two espgate gateways with generated keys, with a
//! table of throughput (iperf3), latency (ping) and gateway CPU.
//!
//! ```text
//!   host A 10.1.0.10 ── 10.1.0.1 gateway A 192.0.2.1 ── "internet" ── 192.0.2.2 gateway B 10.2.0.1 ── 10.2.0.10 host B
//! ```
//!
//! Everything it creates (four namespaces named `<prefix>-ha`, `-ga`,
//! `-gb`, `-hb`, the processes in them, a work directory) is removed when
//! it ends, on error, and on SIGINT / SIGTERM (Ctrl-C).

use crate::netlab::{
    self, in_ns, on_path, random_hex, require_root, run, wait_ready, write_private, Lab, Topology,
    HOST_A, HOST_B,
};
use anyhow::{anyhow, bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Options of `espgate demo`.
#[derive(Debug, Clone)]
pub struct Options {
    /// One-second iperf3 runs and three pings instead of five seconds and ten.
    pub short: bool,
    /// Namespace name prefix (default `egdemo-<pid>`).
    pub prefix: Option<String>,
    /// The espgate binary to run the gateways with (default: this one).
    pub exe: PathBuf,
}

/// A measurement of one path.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// Path name.
    pub path: String,
    /// iperf3 received bits per second.
    pub bits_per_sec: f64,
    /// ping average round trip, ms.
    pub rtt_ms: f64,
    /// CPU of each gateway daemon during the iperf3 run, % of one core.
    pub cpu: Vec<(String, f64)>,
}

/// `12.3 Gbit/s`, `456 Mbit/s`.
pub fn fmt_rate(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.0} Mbit/s", bps / 1e6)
    } else {
        format!("{:.0} kbit/s", bps / 1e3)
    }
}

/// The result table.
pub fn render_table(rows: &[Row]) -> String {
    let w = rows.iter().map(|r| r.path.len()).max().unwrap_or(0).max(4);
    let mut out = format!(
        "{:<w$}  {:>14}  {:>13}  {}\n",
        "path", "throughput", "latency (avg)", "gateway CPU (% of one core)"
    );
    for r in rows {
        let cpu = netlab::cpu_cell(r.cpu.iter().map(|(n, c)| (n, c)));
        out += &format!(
            "{:<w$}  {:>14}  {:>10.3} ms  {cpu}\n",
            r.path,
            fmt_rate(r.bits_per_sec),
            r.rtt_ms
        );
    }
    out
}

/// The `avg` of ping's `rtt min/avg/max/mdev = a/b/c/d ms` line.
pub fn parse_ping_avg(out: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.contains("min/avg/max"))?;
    line.split('=')
        .nth(1)?
        .trim()
        .split('/')
        .nth(1)?
        .parse()
        .ok()
}

/// Runs the demo; prints progress and the table to stdout.
pub fn run_demo(opts: &Options) -> Result<Vec<Row>> {
    netlab::install_signal_handlers();
    require_root("the demo")?;
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("iperf3", "iperf3"),
    ] {
        if !on_path(tool) {
            bail!("the demo needs {tool}: apt-get install {pkg} (scripts/setup.sh does)");
        }
    }
    let prefix = opts
        .prefix
        .clone()
        .unwrap_or_else(|| format!("egdemo-{}", std::process::id()));
    let work = std::env::temp_dir().join(format!("{prefix}-work"));
    let mut lab = Lab::new("demo", work)?;
    let mut r = demo_in(&mut lab, &prefix, opts);
    if netlab::interrupted() {
        // Ctrl-C also reached the children (ping, iperf3, the gateways):
        // whatever failed, the reason is the interruption.
        r = Err(anyhow!("interrupted"));
    } else if r.is_err() {
        lab.keep_work = true;
    }
    drop(lab);
    r
}

fn demo_in(lab: &mut Lab, prefix: &str, opts: &Options) -> Result<Vec<Row>> {
    let names = Topology::names(prefix);
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "espgate demo: host A {HOST_A} -- gateway A -- internet 192.0.2.0/24 -- gateway B -- host B {HOST_B}"
    )?;
    out.flush()?;
    writeln!(
        out,
        "namespaces: {} {} {} {}",
        names.ha, names.ga, names.gb, names.hb
    )?;
    out.flush()?;
    let topo = Topology::create(lab, prefix, None)?;
    let (ha, ga, gb, hb) = (&topo.ha, &topo.ga, &topo.gb, &topo.hb);
    netlab::check_interrupt()?;

    let (secs, pings) = if opts.short { ("1", "3") } else { ("5", "10") };
    let mut rows = Vec::new();

    // 1. Plain routing.
    topo.plain_routes(true)?;
    writeln!(
        out,
        "[1/2] plain routing: ping and a {secs} s iperf3 TCP run"
    )?;
    out.flush()?;
    let mut row = measure(lab, ha, hb, secs, pings, &[])?;
    row.path = "plain routing".into();
    rows.push(row);
    topo.plain_routes(false)?;
    netlab::check_interrupt()?;

    // 2. Through the gateways.
    let (k_ab, k_ba) = (random_hex(20)?, random_hex(20)?);
    let mut daemons = Vec::new();
    for (side, ns, local, remote, lts, rts, spi_in, spi_out, k_in, k_out) in [
        (
            "a",
            ga,
            "192.0.2.1",
            "192.0.2.2",
            "10.1.0.0/24",
            "10.2.0.0/24",
            0x1001,
            0x1002,
            &k_ba,
            &k_ab,
        ),
        (
            "b",
            gb,
            "192.0.2.2",
            "192.0.2.1",
            "10.2.0.0/24",
            "10.1.0.0/24",
            0x1002,
            0x1001,
            &k_ab,
            &k_ba,
        ),
    ] {
        let dir = lab.work.join(format!("gw-{side}"));
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("gw.toml");
        let text = format!(
            "# generated by espgate demo\n[gateway]\ntun = \"espgate0\"\n\
             control_socket = \"ctl.sock\"\nstate_dir = \"state\"\n\n\
             [[connection]]\nname = \"site-{}\"\nlocal = \"{local}\"\nremote = \"{remote}\"\n\
             local_ts = [\"{lts}\"]\nremote_ts = [\"{rts}\"]\n\n\
             [connection.esp]\nsuite = \"aes128gcm16\"\nspi_in = {spi_in:#x}\nspi_out = {spi_out:#x}\n\
             enc_in = \"{k_in}\"\nenc_out = \"{k_out}\"\n",
            if side == "a" { "b" } else { "a" }
        );
        write_private(&cfg, &text)?;
        let pid = netlab::spawn_gateway(
            lab,
            &format!("gateway {side}"),
            ns,
            &opts.exe,
            &cfg,
            &dir.join("log"),
        )?;
        daemons.push((
            format!("gw{}", side.to_uppercase()),
            pid,
            dir.join("ctl.sock"),
        ));
    }
    for (name, _, sock) in &daemons {
        wait_ready(sock).with_context(|| format!("{name} did not come up"))?;
    }
    writeln!(
        out,
        "[2/2] espgate tunnel (ESP-in-UDP, aes128gcm16, generated keys): ping and a {secs} s iperf3 TCP run"
    )?;
    out.flush()?;
    let cpu_of: Vec<(String, u32)> = daemons.iter().map(|(n, p, _)| (n.clone(), *p)).collect();
    let mut row = measure(lab, ha, hb, secs, pings, &cpu_of)?;
    row.path = "espgate tunnel (aes128gcm16)".into();
    rows.push(row);
    // Show that it went through the SAs.
    let sas = espgate_api::control::Client::new(&daemons[0].2, Duration::from_secs(5))
        .sa_list()
        .map_err(|e| anyhow!("{e}"))?;
    writeln!(out, "\ngateway A's SAs (espgate sa list):")?;
    out.flush()?;
    write!(out, "{}", espgate_api::status::render_sa_list(&sas))?;
    if sas.iter().any(|s| s.packets == 0) {
        bail!("an SA of gateway A carried no packets");
    }
    writeln!(out)?;
    write!(out, "{}", render_table(&rows))?;
    out.flush()?;
    lab.stop_children();
    Ok(rows)
}

/// ping and iperf3 from host A to host B; CPU of `cpu_of` processes during
/// the iperf3 run.
fn measure(
    lab: &mut Lab,
    ha: &str,
    hb: &str,
    secs: &str,
    pings: &str,
    cpu_of: &[(String, u32)],
) -> Result<Row> {
    let p = run(&mut in_ns(
        ha,
        &["ping", "-c", pings, "-i", "0.2", "-W", "2", "-q", HOST_B],
    ))
    .context("ping from host A to host B")?;
    let rtt_ms = parse_ping_avg(&p).ok_or_else(|| anyhow!("no rtt in ping output: {p}"))?;
    netlab::check_interrupt()?;
    let r = netlab::iperf3(
        lab,
        ha,
        hb,
        HOST_B,
        &["-t", secs],
        cpu_of,
        Duration::from_secs(secs.parse::<u64>().unwrap_or(5) + 60),
    )
    .context("iperf3 from host A to host B")?;
    let bps = r.json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow!("no end.sum_received in iperf3's output"))?;
    let cpu = r.cpu;
    netlab::check_interrupt()?;
    Ok(Row {
        path: String::new(),
        bits_per_sec: bps,
        rtt_ms,
        cpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_summary() {
        let out = "--- 10.2.0.10 ping statistics ---\n3 packets transmitted, 3 received, 0% packet loss, time 402ms\n\
                   rtt min/avg/max/mdev = 0.061/0.087/0.120/0.025 ms\n";
        assert_eq!(parse_ping_avg(out), Some(0.087));
        assert_eq!(parse_ping_avg("nothing"), None);
    }

    #[test]
    fn table() {
        let rows = [
            Row {
                path: "plain routing".into(),
                bits_per_sec: 41.2e9,
                rtt_ms: 0.05,
                cpu: vec![],
            },
            Row {
                path: "espgate tunnel (aes128gcm16)".into(),
                bits_per_sec: 512e6,
                rtt_ms: 0.2,
                cpu: vec![("gwA".into(), 99.4), ("gwB".into(), 61.0)],
            },
        ];
        let t = render_table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[1].contains("41.20 Gbit/s") && lines[1].ends_with("ms  -"),
            "{t}"
        );
        assert!(
            lines[2].contains("512 Mbit/s") && lines[2].ends_with("gwA 99%, gwB 61%"),
            "{t}"
        );
        assert_eq!(fmt_rate(2500.0), "2 kbit/s");
    }
}
