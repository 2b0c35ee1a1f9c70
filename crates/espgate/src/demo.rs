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

use anyhow::{anyhow, bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Runs `cmd`, failing with its stderr.
fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

fn ip(args: &[&str]) -> Result<String> {
    run(Command::new("ip").args(args))
}

fn in_ns(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(args);
    c
}

/// What the demo made, undone on drop.
struct Lab {
    namespaces: Vec<String>,
    children: Vec<(String, Child)>,
    work: PathBuf,
    keep_work: bool,
}

impl Lab {
    fn netns(&mut self, name: &str) -> Result<()> {
        ip(&["netns", "add", name])?;
        self.namespaces.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(())
    }

    fn sysctl(&self, ns: &str, kv: &str) -> Result<()> {
        run(&mut in_ns(ns, &["sysctl", "-qw", kv])).map(drop)
    }

    fn stop_children(&mut self) {
        for (what, c) in self.children.iter_mut().rev() {
            if matches!(c.try_wait(), Ok(None)) {
                // SAFETY: kill(2) on the pid of a child we spawned and have
                // not reaped (try_wait said it is running).
                unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
                let deadline = Instant::now() + Duration::from_secs(10);
                while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if matches!(c.try_wait(), Ok(None)) {
                    eprintln!("demo: {what} did not stop; killing it");
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
        }
        self.children.clear();
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop_children();
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("demo: {e:#}");
            }
        }
        if self.keep_work {
            eprintln!("demo: logs kept in {}", self.work.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.work);
        }
    }
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
        let cpu = if r.cpu.is_empty() {
            "-".to_string()
        } else {
            r.cpu
                .iter()
                .map(|(n, c)| format!("{n} {c:.0}%"))
                .collect::<Vec<_>>()
                .join(", ")
        };
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

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are
    // fields 14 and 15 (1-based), i.e. 12 and 13 after ") ".
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn random_hex(n: usize) -> Result<String> {
    let mut b = vec![0u8; n];
    aws_lc_rs::rand::fill(&mut b).map_err(|_| anyhow!("no random bytes"))?;
    Ok(hex::encode(b))
}

const HOST_A: &str = "10.1.0.10";
const HOST_B: &str = "10.2.0.10";

/// Runs the demo; prints progress and the table to stdout.
pub fn run_demo(opts: &Options) -> Result<Vec<Row>> {
    // SAFETY: installs a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the demo creates network namespaces: run it as root");
    }
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
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let mut lab = Lab {
        namespaces: Vec::new(),
        children: Vec::new(),
        work: work.clone(),
        keep_work: false,
    };
    let mut r = demo_in(&mut lab, &prefix, opts);
    if INTERRUPTED.load(Ordering::SeqCst) {
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
    let (ha, ga, gb, hb) = (
        format!("{prefix}-ha"),
        format!("{prefix}-ga"),
        format!("{prefix}-gb"),
        format!("{prefix}-hb"),
    );
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "espgate demo: host A {HOST_A} -- gateway A -- internet 192.0.2.0/24 -- gateway B -- host B {HOST_B}"
    )?;
    out.flush()?;
    writeln!(out, "namespaces: {ha} {ga} {gb} {hb}")?;
    out.flush()?;
    for ns in [&ha, &ga, &gb, &hb] {
        lab.netns(ns)?;
    }
    // Links: hostA-gwA, gwA-gwB (the internet), gwB-hostB.
    for (a, an, b, bn) in [
        (&ha, "lan", &ga, "lan"),
        (&ga, "wan", &gb, "wan"),
        (&gb, "lan", &hb, "lan"),
    ] {
        ip(&[
            "-n", a, "link", "add", an, "type", "veth", "peer", "name", bn, "netns", b,
        ])?;
    }
    for (ns, dev, addr) in [
        (&ha, "lan", "10.1.0.10/24"),
        (&ga, "lan", "10.1.0.1/24"),
        (&ga, "wan", "192.0.2.1/24"),
        (&gb, "wan", "192.0.2.2/24"),
        (&gb, "lan", "10.2.0.1/24"),
        (&hb, "lan", "10.2.0.10/24"),
    ] {
        ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
        ip(&["-n", ns, "link", "set", dev, "up"])?;
    }
    ip(&["-n", &ha, "route", "add", "default", "via", "10.1.0.1"])?;
    ip(&["-n", &hb, "route", "add", "default", "via", "10.2.0.1"])?;
    for g in [&ga, &gb] {
        lab.sysctl(g, "net.ipv4.ip_forward=1")?;
    }
    check_interrupt()?;

    let (secs, pings) = if opts.short { ("1", "3") } else { ("5", "10") };
    let mut rows = Vec::new();

    // 1. Plain routing.
    ip(&["-n", &ga, "route", "add", "10.2.0.0/24", "via", "192.0.2.2"])?;
    ip(&["-n", &gb, "route", "add", "10.1.0.0/24", "via", "192.0.2.1"])?;
    writeln!(
        out,
        "[1/2] plain routing: ping and a {secs} s iperf3 TCP run"
    )?;
    out.flush()?;
    let mut row = measure(lab, &ha, &hb, secs, pings, &[])?;
    row.path = "plain routing".into();
    rows.push(row);
    ip(&["-n", &ga, "route", "del", "10.2.0.0/24", "via", "192.0.2.2"])?;
    ip(&["-n", &gb, "route", "del", "10.1.0.0/24", "via", "192.0.2.1"])?;
    check_interrupt()?;

    // 2. Through the gateways.
    let (k_ab, k_ba) = (random_hex(20)?, random_hex(20)?);
    let mut daemons = Vec::new();
    for (side, ns, local, remote, lts, rts, spi_in, spi_out, k_in, k_out) in [
        (
            "a",
            &ga,
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
            &gb,
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
        let log = std::fs::File::create(dir.join("log"))?;
        let child = in_ns(
            ns,
            &[
                &opts.exe.to_string_lossy(),
                "up",
                "-c",
                &cfg.to_string_lossy(),
            ],
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting espgate up")?;
        let pid = child.id();
        lab.children.push((format!("gateway {side}"), child));
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
    let mut row = measure(lab, &ha, &hb, secs, pings, &cpu_of)?;
    row.path = "espgate tunnel (aes128gcm16)".into();
    rows.push(row);
    // Show that it went through the SAs.
    let st = crate::gateway::control::request(&daemons[0].2, "sa_list", Duration::from_secs(5))
        .map_err(|e| anyhow!("{e}"))?;
    let sas: Vec<crate::gateway::status::SaStatus> = serde_json::from_value(st["sas"].clone())?;
    writeln!(out, "\ngateway A's SAs (espgate sa list):")?;
    out.flush()?;
    write!(out, "{}", crate::gateway::status::render_sa_list(&sas))?;
    if sas.iter().any(|s| s.packets == 0) {
        bail!("an SA of gateway A carried no packets");
    }
    writeln!(out)?;
    write!(out, "{}", render_table(&rows))?;
    out.flush()?;
    lab.stop_children();
    Ok(rows)
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

fn wait_ready(sock: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        check_interrupt()?;
        match crate::gateway::control::request(sock, "status", Duration::from_secs(2)) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => bail!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
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
    check_interrupt()?;
    let mut server = in_ns(
        hb,
        &[
            "iperf3",
            "-s",
            "-1",
            "--forceflush",
            "-B",
            HOST_B,
            "-p",
            "5201",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .context("starting iperf3 -s")?;
    let stdout = server.stdout.take();
    lab.children.push(("iperf3 server".into(), server));
    // Wait (bounded) for "Server listening".
    if let Some(s) = stdout {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(s).lines();
            let _ = tx.send(lines.next());
            for _ in lines {}
        });
        rx.recv_timeout(Duration::from_secs(5))
            .map_err(|_| anyhow!("iperf3 -s did not start"))?;
    }
    let ticks0: Vec<Option<u64>> = cpu_of.iter().map(|(_, p)| cpu_ticks(*p)).collect();
    let t0 = Instant::now();
    let j = run(&mut in_ns(
        ha,
        &["iperf3", "-c", HOST_B, "-p", "5201", "-t", secs, "-J"],
    ))
    .context("iperf3 from host A to host B")?;
    let wall = t0.elapsed().as_secs_f64();
    let v: serde_json::Value = serde_json::from_str(&j).context("iperf3 -J output")?;
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow!("no end.sum_received in iperf3's output"))?;
    let hz = clock_ticks();
    let cpu = cpu_of
        .iter()
        .zip(ticks0)
        .filter_map(|((n, p), t0)| {
            let d = cpu_ticks(*p)?.checked_sub(t0?)?;
            Some((n.clone(), d as f64 / hz / wall * 100.0))
        })
        .collect();
    // The one-off server exits by itself; reap it.
    lab.children.retain_mut(|(n, c)| {
        if n == "iperf3 server" {
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
            false
        } else {
            true
        }
    });
    check_interrupt()?;
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

    #[test]
    fn own_cpu_ticks_are_readable() {
        assert!(cpu_ticks(std::process::id()).is_some());
        assert!(clock_ticks() > 0.0);
    }
}
