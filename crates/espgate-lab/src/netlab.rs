//! The network-namespace lab shared by `espgate demo` and `espgate bench
//! tunnel`: two sites joined through two gateways, each in its own network
//! namespace, and the iperf3 measurement between them.
//!
//! ```text
//!   host A 10.1.0.10 ── 10.1.0.1 gateway A 192.0.2.1 ── "internet" ── 192.0.2.2 gateway B 10.2.0.1 ── 10.2.0.10 host B
//! ```
//!
//! A [`Lab`] owns what it made (namespaces, child processes, a work
//! directory) and removes it when dropped, which happens on success, on
//! error and, through [`install_signal_handlers`] and [`check_interrupt`],
//! on SIGINT / SIGTERM.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Host A, behind gateway A.
pub const HOST_A: &str = "10.1.0.10";
/// Host B, behind gateway B.
pub const HOST_B: &str = "10.2.0.10";
/// Gateway A's address on the "internet".
pub const GW_A: &str = "192.0.2.1";
/// Gateway B's address on the "internet".
pub const GW_B: &str = "192.0.2.2";
/// Site A's network.
pub const NET_A: &str = "10.1.0.0/24";
/// Site B's network.
pub const NET_B: &str = "10.2.0.0/24";

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: std::ffi::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// SIGINT and SIGTERM set a flag that [`check_interrupt`] turns into an
/// error, so that the lab unwinds and cleans up.
pub fn install_signal_handlers() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; no other handler is replaced that matters.
        if let Err(e) = unsafe { signal(sig, SigHandler::Handler(on_signal)) } {
            eprintln!("espgate: cannot catch {sig}: {e}; Ctrl-C may leave namespaces behind");
        }
    }
}

/// Whether SIGINT or SIGTERM arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Fails with "interrupted" after SIGINT / SIGTERM.
pub fn check_interrupt() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

/// Fails in the host's own network namespace (the one PID 1 is in): for
/// the lab's helpers that must only ever run inside a test namespace
/// (`what` the helper does, `cmd` its subcommand, `by` the command that
/// starts it there).
pub fn refuse_host_namespace(what: &str, cmd: &str, by: &str) -> Result<()> {
    let ns = |p: &str| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    if let (Ok(me), Ok(host)) = (ns("/proc/self/ns/net"), ns("/proc/1/ns/net")) {
        if me == host {
            bail!(
                "refusing to {what} from the host's network namespace; run it inside a test \
                 namespace (ip netns exec NS espgate {cmd} ...), as {by} does"
            );
        }
    }
    Ok(())
}

/// Fails unless we are root.
pub fn require_root(what: &str) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("{what} creates network namespaces: run it as root");
    }
    Ok(())
}

/// Runs `cmd`, failing with its stderr.
pub fn run(cmd: &mut Command) -> Result<String> {
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

/// The `Udp:` counters of a /proc/net/snmp text.
pub fn parse_snmp_udp(text: &str) -> BTreeMap<String, u64> {
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("Udp:")).collect();
    let [names, values, ..] = lines.as_slice() else {
        return BTreeMap::new();
    };
    names
        .split_whitespace()
        .skip(1)
        .zip(values.split_whitespace().skip(1))
        .filter_map(|(n, v)| Some((n.to_string(), v.parse().ok()?)))
        .collect()
}

/// The `Udp:` counters of namespace `ns` now (its /proc/net/snmp; `None`
/// where it cannot be read).
pub fn ns_udp_counters(ns: &str) -> Option<BTreeMap<String, u64>> {
    let m = parse_snmp_udp(&run(&mut in_ns(ns, &["cat", "/proc/net/snmp"])).ok()?);
    (!m.is_empty()).then_some(m)
}

/// Like [`run`], but kills `cmd` and fails when it takes longer than
/// `limit`, or when SIGINT / SIGTERM arrives.
pub fn run_timeout(cmd: &mut Command, limit: Duration) -> Result<String> {
    let r = run_timeout_raw(cmd, limit)?;
    checked(cmd, r)
}

/// Standard output of a finished command, or an error with its status and
/// standard error (standard output when the error is empty).
fn checked(
    cmd: &Command,
    (status, out, err): (std::process::ExitStatus, String, String),
) -> Result<String> {
    if !status.success() {
        let why = if err.trim().is_empty() {
            out.trim()
        } else {
            err.trim()
        };
        bail!("{cmd:?} failed ({status}): {why}");
    }
    Ok(out)
}

/// Runs `cmd` for at most `limit` (killed after that, or when SIGINT /
/// SIGTERM arrives); its exit status, standard output and error.
pub fn run_timeout_raw(
    cmd: &mut Command,
    limit: Duration,
) -> Result<(std::process::ExitStatus, String, String)> {
    run_bounded(cmd, limit, true)
}

/// Like [`run_timeout`], but lets `cmd` finish (within `limit`) when
/// SIGINT / SIGTERM arrives, for what must not be cut short (apt-get); the
/// caller checks for the interruption afterwards.
pub fn run_to_end(cmd: &mut Command, limit: Duration) -> Result<String> {
    let r = run_bounded(cmd, limit, false)?;
    checked(cmd, r)
}

fn run_bounded(
    cmd: &mut Command,
    limit: Duration,
    interruptible: bool,
) -> Result<(std::process::ExitStatus, String, String)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    let [out, err] = drain_output(&mut child);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() >= deadline || (interruptible && interrupted()) {
            let _ = child.kill();
            let _ = child.wait();
            check_interrupt()?;
            bail!("{cmd:?} did not finish within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let text = |h: std::thread::JoinHandle<Vec<u8>>| {
        h.join()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default()
    };
    Ok((status, text(out), text(err)))
}

/// Reads a child's stdout and stderr to their ends on two threads, so that
/// neither pipe fills and blocks it; join the threads for the bytes (empty
/// for a stream that was not piped).
pub fn drain_output(child: &mut std::process::Child) -> [std::thread::JoinHandle<Vec<u8>>; 2] {
    let reader = |p: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = p {
                let _ = p.read_to_end(&mut v);
            }
            v
        })
    };
    [
        reader(
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ),
        reader(
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ),
    ]
}

/// Whether `tool` is an executable file in a `PATH` directory.
pub fn on_path(tool: &str) -> bool {
    find_on_path(tool).is_some()
}

/// Where `tool` is in the `PATH` directories (the first one that has it).
pub fn find_on_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|f| f.is_file())
}

/// Runs `ip ARGS`.
pub fn ip(args: &[&str]) -> Result<String> {
    run(Command::new("ip").args(args))
}

/// `ip netns exec NS ARGS…`, to be run.
pub fn in_ns(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(args);
    c
}

/// What a lab made, undone on drop.
pub struct Lab {
    /// Prefix of its messages (`demo`, `bench tunnel`).
    who: String,
    namespaces: Vec<String>,
    children: Vec<(String, Child)>,
    /// The work directory (configurations, keys, logs).
    pub work: PathBuf,
    /// Keep the work directory when dropped (and say where it is).
    pub keep_work: bool,
}

impl Lab {
    /// A lab whose messages start with `who`, with an empty work directory
    /// `work` (made anew).
    pub fn new(who: &str, work: PathBuf) -> Result<Lab> {
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        Ok(Lab {
            who: who.to_string(),
            namespaces: Vec::new(),
            children: Vec::new(),
            work,
            keep_work: false,
        })
    }

    /// Creates network namespace `name` (removed on drop) with `lo` up.
    pub fn netns(&mut self, name: &str) -> Result<()> {
        ip(&["netns", "add", name])?;
        self.namespaces.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(())
    }

    /// `sysctl -w KV` in `ns`.
    pub fn sysctl(&self, ns: &str, kv: &str) -> Result<()> {
        run(&mut in_ns(ns, &["sysctl", "-qw", kv])).map(drop)
    }

    /// Starts `cmd` (stopped on drop, or by [`Lab::stop_children`]);
    /// returns its process id.
    pub fn spawn(&mut self, what: &str, cmd: &mut Command) -> Result<u32> {
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {what} ({cmd:?})"))?;
        let pid = child.id();
        self.children.push((what.to_string(), child));
        Ok(pid)
    }

    /// Keeps `child` to stop it on drop.
    pub fn adopt(&mut self, what: &str, child: Child) {
        self.children.push((what.to_string(), child));
    }

    /// The exit status of child `what` if it has exited.
    pub fn exited(&mut self, what: &str) -> Option<std::process::ExitStatus> {
        self.children
            .iter_mut()
            .find(|(n, _)| n == what)
            .and_then(|(_, c)| c.try_wait().ok().flatten())
    }

    /// Waits (at most `limit`) for child `what` to exit by itself, kills it
    /// if it does not, and forgets it.
    pub fn reap(&mut self, what: &str, limit: Duration) {
        self.children.retain_mut(|(n, c)| {
            if n == what {
                let deadline = Instant::now() + limit;
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
    }

    /// SIGTERM to every child still running (newest first), SIGKILL after
    /// 10 s.
    pub fn stop_children(&mut self) {
        for (what, c) in self.children.iter_mut().rev() {
            if matches!(c.try_wait(), Ok(None)) {
                // A child we spawned and have not reaped (try_wait said it
                // is running), so the pid is still its.
                signal(c.id(), rustix::process::Signal::TERM);
                let deadline = Instant::now() + Duration::from_secs(10);
                while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if matches!(c.try_wait(), Ok(None)) {
                    eprintln!("{}: {what} did not stop; killing it", self.who);
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
        }
        self.children.clear();
    }

    /// Stops the children, then ends whatever still runs in the lab's
    /// namespaces (processes they started) and deletes the namespaces.
    pub fn remove_namespaces(&mut self) {
        self.stop_children();
        for ns in self.namespaces.iter().rev() {
            end_processes_in(ns);
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("{}: {e:#}", self.who);
            }
        }
        self.namespaces.clear();
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.remove_namespaces();
        if self.keep_work {
            eprintln!("{}: logs kept in {}", self.who, self.work.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.work);
        }
    }
}

/// The process ids in network namespace `ns` (one of ours).
fn pids_in(ns: &str) -> Vec<u32> {
    ip(&["netns", "pids", ns])
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// SIGTERM to the processes in our namespace `ns`, SIGKILL after 5 s.
fn end_processes_in(ns: &str) {
    let me = std::process::id();
    let pids: Vec<u32> = pids_in(ns).into_iter().filter(|p| *p != me).collect();
    if pids.is_empty() {
        return;
    }
    for p in &pids {
        // A process in a namespace this lab created.
        signal(*p, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline
        && pids
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists())
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in pids_in(ns) {
        if pids.contains(&p) {
            // As above; it ignored SIGTERM.
            signal(p, rustix::process::Signal::KILL);
        }
    }
}

/// The processes in network namespace `ns` (named by `ip netns`): process
/// id and command name.
pub fn processes_in(ns: &str) -> Vec<(u32, String)> {
    let Ok(target) = std::fs::metadata(format!("/run/netns/{ns}")) else {
        return Vec::new();
    };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(m) = std::fs::metadata(format!("/proc/{pid}/ns/net")) else {
            continue;
        };
        if m.ino() == target.ino() && m.dev() == target.dev() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default();
            out.push((pid, comm));
        }
    }
    out.sort();
    out
}

/// `name 45%, other 12%` for CPU shares in % of one core; `-` for none.
pub fn cpu_cell<'a>(cpu: impl IntoIterator<Item = (&'a String, &'a f64)>) -> String {
    let parts: Vec<String> = cpu
        .into_iter()
        .map(|(n, c)| format!("{n} {c:.0}%"))
        .collect();
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(", ")
    }
}

/// Peak resident memory of process `pid` (`VmHWM` in /proc), in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// utime + stime of a process (all its threads), in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are
    // fields 14 and 15 (1-based), i.e. 12 and 13 after ") ".
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Clock ticks per second.
pub fn clock_ticks() -> f64 {
    match rustix::param::clock_ticks_per_second() {
        0 => 100.0,
        t => t as f64,
    }
}

/// Sends `sig` to process `pid` (gone already: nothing to do).
fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// `n` random bytes in hex.
pub fn random_hex(n: usize) -> Result<String> {
    let mut b = vec![0u8; n];
    aws_lc_rs::rand::fill(&mut b).map_err(|_| anyhow!("no random bytes"))?;
    Ok(hex::encode(b))
}

/// Starts `exe up -c cfg` in namespace `ns` as `lab`'s child `what`,
/// stdout and stderr into the file `log`; returns its pid.
pub fn spawn_gateway(
    lab: &mut Lab,
    what: &str,
    ns: &str,
    exe: &Path,
    cfg: &Path,
    log: &Path,
) -> Result<u32> {
    let log = std::fs::File::create(log)?;
    lab.spawn(
        what,
        in_ns(
            ns,
            &[&exe.to_string_lossy(), "up", "-c", &cfg.to_string_lossy()],
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log),
    )
}

/// Writes `text` to `path`, readable by its owner only.
pub fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// Waits (at most 10 s) until the espgate daemon behind control socket
/// `sock` answers.
pub fn wait_ready(sock: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        check_interrupt()?;
        match espgate_api::control::Client::new(sock, Duration::from_secs(2)).status() {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => bail!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The four namespaces of the two-site topology.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Host A's namespace (`<prefix>-ha`).
    pub ha: String,
    /// Gateway A's namespace (`<prefix>-ga`).
    pub ga: String,
    /// Gateway B's namespace (`<prefix>-gb`).
    pub gb: String,
    /// Host B's namespace (`<prefix>-hb`).
    pub hb: String,
}

impl Topology {
    /// The namespace names for `prefix`.
    pub fn names(prefix: &str) -> Topology {
        Topology {
            ha: format!("{prefix}-ha"),
            ga: format!("{prefix}-ga"),
            gb: format!("{prefix}-gb"),
            hb: format!("{prefix}-hb"),
        }
    }

    /// Creates the namespaces, the three veth links (MTU `mtu` when given,
    /// else the kernel's default), addresses, the hosts' default routes and
    /// forwarding on the gateways. The gateways have no route to the other
    /// site: see [`Topology::plain_routes`].
    pub fn create(lab: &mut Lab, prefix: &str, mtu: Option<u32>) -> Result<Topology> {
        let t = Topology::names(prefix);
        let (ha, ga, gb, hb) = (&t.ha, &t.ga, &t.gb, &t.hb);
        for ns in [ha, ga, gb, hb] {
            lab.netns(ns)?;
        }
        // Links: hostA-gwA, gwA-gwB (the internet), gwB-hostB.
        for (a, an, b, bn) in [
            (ha, "lan", ga, "lan"),
            (ga, "wan", gb, "wan"),
            (gb, "lan", hb, "lan"),
        ] {
            ip(&[
                "-n", a, "link", "add", an, "type", "veth", "peer", "name", bn, "netns", b,
            ])?;
        }
        for (ns, dev, addr) in [
            (ha, "lan", "10.1.0.10/24"),
            (ga, "lan", "10.1.0.1/24"),
            (ga, "wan", "192.0.2.1/24"),
            (gb, "wan", "192.0.2.2/24"),
            (gb, "lan", "10.2.0.1/24"),
            (hb, "lan", "10.2.0.10/24"),
        ] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            if let Some(m) = mtu {
                ip(&["-n", ns, "link", "set", dev, "mtu", &m.to_string()])?;
            }
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        ip(&["-n", ha, "route", "add", "default", "via", "10.1.0.1"])?;
        ip(&["-n", hb, "route", "add", "default", "via", "10.2.0.1"])?;
        for g in [ga, gb] {
            lab.sysctl(g, "net.ipv4.ip_forward=1")?;
        }
        Ok(t)
    }

    /// Adds (or deletes) the gateways' routes to the other site over the
    /// "internet", unencrypted: plain routing.
    pub fn plain_routes(&self, add: bool) -> Result<()> {
        let verb = if add { "add" } else { "del" };
        ip(&["-n", &self.ga, "route", verb, NET_B, "via", GW_B])?;
        ip(&["-n", &self.gb, "route", verb, NET_A, "via", GW_A])?;
        Ok(())
    }
}

/// One iperf3 run.
#[derive(Debug, Clone)]
pub struct Iperf {
    /// The client's `-J` document.
    pub json: serde_json::Value,
    /// CPU of each process asked for during the client's run, % of one core.
    pub cpu: Vec<(String, f64)>,
}

/// Runs an iperf3 server (one test) in `server_ns` on `server_addr` and
/// the client in `client_ns` with `-c server_addr -p 5201 -J` and
/// `client_args`; measures the CPU of the `cpu_of` processes (name, pid)
/// during the client's run. The client is given `limit` to finish. With
/// `cpu`, client and server are bound to that CPU (iperf3 `-A`).
#[allow(clippy::too_many_arguments)]
pub fn iperf3(
    lab: &mut Lab,
    client_ns: &str,
    server_ns: &str,
    server_addr: &str,
    client_args: &[&str],
    cpu_of: &[(String, u32)],
    limit: Duration,
    cpu: Option<usize>,
) -> Result<Iperf> {
    let cpu = cpu.map(|c| c.to_string());
    let mut server_args = vec![
        "iperf3",
        "-s",
        "-1",
        "--forceflush",
        "-B",
        server_addr,
        "-p",
        "5201",
    ];
    if let Some(c) = &cpu {
        server_args.extend(["-A", c.as_str()]);
    }
    let mut server = in_ns(server_ns, &server_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 -s")?;
    let stdout = server.stdout.take();
    lab.adopt("iperf3 server", server);
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
    let mut args = vec!["iperf3", "-c", server_addr, "-p", "5201", "-J"];
    if let Some(c) = &cpu {
        args.extend(["-A", c.as_str()]);
    }
    args.extend_from_slice(client_args);
    let j = run_timeout_raw(&mut in_ns(client_ns, &args), limit);
    let wall = t0.elapsed().as_secs_f64();
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
    lab.reap("iperf3 server", Duration::from_secs(5));
    let (status, j, err) =
        j.with_context(|| format!("iperf3 from {client_ns} to {server_addr}"))?;
    let json: serde_json::Value = serde_json::from_str(&j).with_context(|| {
        format!(
            "iperf3 from {client_ns} to {server_addr} ({status}): no -J output: {}",
            err.trim()
        )
    })?;
    if !status.success() {
        bail!(
            "iperf3 from {client_ns} to {server_addr} failed ({status}): {}",
            json["error"].as_str().unwrap_or(err.trim())
        );
    }
    Ok(Iperf { json, cpu })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_ticks_are_readable() {
        assert!(cpu_ticks(std::process::id()).is_some());
        assert!(clock_ticks() > 0.0);
        assert_eq!(cpu_ticks(u32::MAX), None);
        assert!(peak_rss_kib(std::process::id()).is_some_and(|k| k > 0));
        assert_eq!(peak_rss_kib(u32::MAX), None);
    }

    #[test]
    fn run_timeout_returns_output_and_bounds_the_wait() {
        let out = run_timeout(
            Command::new("sh").args(["-c", "echo hello"]),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(out, "hello\n");
        let e = run_timeout(
            Command::new("sh").args(["-c", "echo oops >&2; exit 3"]),
            Duration::from_secs(10),
        )
        .unwrap_err();
        assert!(e.to_string().contains("oops"), "{e}");
        let e =
            run_timeout(Command::new("sleep").arg("5"), Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("did not finish"), "{e}");
    }

    #[test]
    fn topology_names_follow_the_prefix() {
        let t = Topology::names("x-1");
        assert_eq!(
            [t.ha, t.ga, t.gb, t.hb],
            ["x-1-ha", "x-1-ga", "x-1-gb", "x-1-hb"]
        );
    }
}
