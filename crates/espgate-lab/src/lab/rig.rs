//! The lab's network rig: the two-site namespace topology of
//! [`crate::netlab`] with the knobs the papers turned — link rate (`htb`),
//! MTU, TCP options and buffers, a CPU quota on the gateways (cgroup), a
//! flood on a second interface — and espgate gateways written from real
//! configuration files, or plain routing.
//!
//! ```text
//!  ha 10.1.0.10 ── ga 192.0.2.1 ══ 192.0.2.2 gb ── 10.2.0.10 hb
//!                                               └── xf 10.3.0.10 (cross traffic)
//! ```
//! Tunnel mode and plain routing carry iperf3 from `ha` to `hb`; transport
//! mode makes the gateways the hosts and carries it from `ga` to `gb`. The
//! `ga`–`gb` link (`wan`) is the one shaped.

use crate::netlab::{
    self, in_ns, ip, random_hex, run, spawn_gateway, write_private, Lab, Topology, GW_A, GW_B,
    HOST_B, NET_A, NET_B,
};
use anyhow::{anyhow, bail, ensure, Context, Result};
use espgate_config::schema::{
    value, ConfigFile, ConnectionTable, Encapsulation, GatewayTable, IkeTable, ModeName, Protocols,
    SaTable, Scalar, SecretHex, StartAction,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// TCP options and socket buffers of the hosts (seed 000 §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpTuning {
    /// The kernel's defaults, untouched.
    Default,
    /// The "before" state of seed 000 §5.1, set explicitly (modern kernels
    /// enable the options by default): timestamps, window scaling and SACK
    /// off, buffers at the kernel's defaults (4096 87380 212992 / 4096
    /// 16384 212992).
    Off,
    /// Seed 000 §5.1: the three options on, buffers 87380 / 4194304 /
    /// 4194304 for both directions.
    Seed000,
}

/// The network: links, MTU, hosts' TCP.
#[derive(Debug, Clone, PartialEq)]
pub struct NetSpec {
    /// MTU of every veth (the gateways' TUN follows).
    pub mtu: u32,
    /// Rate of the `ga`–`gb` link, Mbit/s, both directions (htb); `None`:
    /// unshaped veth.
    pub rate_mbit: Option<u32>,
    /// The hosts' TCP.
    pub tcp: TcpTuning,
    /// Adds the `xf` namespace on a second interface of `gb` (for a flood).
    pub cross: bool,
}

impl Default for NetSpec {
    fn default() -> Self {
        NetSpec {
            mtu: 1500,
            rate_mbit: None,
            tcp: TcpTuning::Default,
            cross: false,
        }
    }
}

/// IPsec mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Between the sites, gateways `ga` and `gb`.
    Tunnel,
    /// Between the gateways themselves, as hosts.
    Transport,
}

/// IKEv2 keying instead of manual keys.
#[derive(Debug, Clone, PartialEq)]
pub struct IkeSpec {
    /// ESP proposal of the child SA (a PFS group makes each rekey run a
    /// new Diffie-Hellman), e.g. `aes128-sha256-x25519`.
    pub esp_proposal: String,
    /// Child SA rekey time, seconds (`None`: espgate's default).
    pub child_rekey_s: Option<u32>,
}

/// One espgate pair.
#[derive(Debug, Clone, PartialEq)]
pub struct GwSpec {
    /// Tunnel or transport.
    pub mode: Mode,
    /// The ESP suite (strongSwan keyword), if ESP is used.
    pub esp: Option<String>,
    /// The AH algorithm (`sha1`, `md5`, ...), if AH is used.
    pub ah: Option<String>,
    /// ESP in UDP (RFC 3948) rather than raw IP protocol 50/51. AH is
    /// always raw.
    pub udp: bool,
    /// `gateway.batch` (`None`: espgate's default).
    pub batch: Option<u32>,
    /// `gateway.offloads`.
    pub offloads: bool,
    /// `gateway.socket_buffer`, bytes (`None`: espgate's default).
    pub socket_buffer: Option<u64>,
    /// MSS clamping (`auto`) or off.
    pub mss_clamp: bool,
    /// Keyed by IKEv2 (PSK) instead of manual keys.
    pub ike: Option<IkeSpec>,
    /// CPU quota of each gateway (cgroup), % of one CPU.
    pub cpu_quota_pct: Option<u32>,
    /// Q-ESP (seed 002, `docs/QESP.md`) instead of ESP, with the `esp`
    /// suite; raw IP (protocol 253).
    pub qesp: bool,
}

impl GwSpec {
    /// ESP with `suite` in tunnel mode, otherwise espgate's defaults.
    pub fn esp(suite: &str, mode: Mode) -> GwSpec {
        GwSpec {
            mode,
            esp: Some(suite.to_string()),
            ah: None,
            udp: true,
            batch: None,
            offloads: true,
            socket_buffer: None,
            mss_clamp: true,
            ike: None,
            cpu_quota_pct: None,
            qesp: false,
        }
    }

    /// A one-line description for the report.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match (&self.esp, &self.ah) {
            (Some(e), None) if self.qesp => parts.push(format!("Q-ESP {e}")),
            (Some(e), Some(a)) => parts.push(format!("ESP {e} + AH {a}")),
            (Some(e), None) => parts.push(format!("ESP {e}")),
            (None, Some(a)) => parts.push(format!("AH {a}")),
            (None, None) => parts.push("no protocol".into()),
        }
        parts.push(
            match self.mode {
                Mode::Tunnel => "tunnel",
                Mode::Transport => "transport",
            }
            .into(),
        );
        parts.push(
            if self.udp && self.ah.is_none() && !self.qesp {
                "in UDP"
            } else {
                "raw IP"
            }
            .into(),
        );
        if let Some(i) = &self.ike {
            parts.push(format!(
                "IKEv2 PSK, child {}{}",
                i.esp_proposal,
                i.child_rekey_s
                    .map(|s| format!(", rekey every {s} s"))
                    .unwrap_or_default()
            ));
        } else {
            parts.push("manual keys".into());
        }
        if let Some(b) = self.batch {
            parts.push(format!("batch {b}"));
        }
        if !self.offloads {
            parts.push("offloads off".into());
        }
        if let Some(b) = self.socket_buffer {
            parts.push(format!("socket buffers {b} B"));
        }
        if !self.mss_clamp {
            parts.push("no MSS clamp".into());
        }
        if let Some(q) = self.cpu_quota_pct {
            parts.push(format!("CPU quota {q} % per gateway"));
        }
        parts.join(", ")
    }
}

/// What carries the traffic between the sites.
#[derive(Debug, Clone, PartialEq)]
pub enum PathSpec {
    /// Kernel forwarding, no IPsec.
    Plain,
    /// Two espgate gateways.
    Espgate(GwSpec),
}

/// One iperf3 test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    /// UDP (`-u -b`) rather than TCP.
    pub udp: bool,
    /// `-l`: write size (TCP) or datagram payload (UDP), bytes.
    pub len: u32,
    /// `--bidir`: both directions at once.
    pub bidir: bool,
    /// Seconds (`-t`).
    pub secs: f64,
    /// UDP offered rate, bit/s (`-b`); `None`: as fast as it can.
    pub udp_rate_bps: Option<u64>,
}

/// One measured run: the throughput and what was seen beside it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Received throughput, Mbit/s (both directions summed for `bidir`).
    pub mbps: f64,
    /// Side measurements (CPU states, retransmits, loss).
    pub extra: BTreeMap<String, f64>,
}

/// The namespaces, processes and cgroups of one path, removed on drop.
pub struct Rig {
    /// The namespaces and processes.
    pub lab: Lab,
    /// Namespace names.
    pub topo: Topology,
    /// Cross-traffic namespace, when asked for.
    pub xf: Option<String>,
    net: NetSpec,
    path: PathSpec,
    /// (name, pid) of each gateway process.
    gateways: Vec<(String, u32)>,
    /// Control sockets of the gateways.
    pub sockets: Vec<PathBuf>,
    cgroups: Vec<PathBuf>,
    /// Client namespace and server address of iperf3.
    client_ns: String,
    server_ns: String,
    server_addr: String,
    flood: bool,
    prefix: String,
}

/// The cross-traffic namespace's address and `gb`'s on that link.
pub const XF_HOST: &str = "10.3.0.10";
const XF_GW: &str = "10.3.0.1";

impl Rig {
    /// Builds the topology for `path` under `net`, starts what carries the
    /// traffic and checks with ping that it flows.
    pub fn up(prefix: &str, net: &NetSpec, path: &PathSpec, exe: &Path) -> Result<Rig> {
        let work = std::env::temp_dir().join(format!("{prefix}-work"));
        let mut lab = Lab::new(prefix, work)?;
        let topo = Topology::create(&mut lab, prefix, Some(net.mtu))?;
        let transport = matches!(path, PathSpec::Espgate(g) if g.mode == Mode::Transport);
        let (client_ns, server_ns, server_addr) = if transport {
            (topo.ga.clone(), topo.gb.clone(), GW_B.to_string())
        } else {
            (topo.ha.clone(), topo.hb.clone(), HOST_B.to_string())
        };
        let mut rig = Rig {
            lab,
            topo,
            xf: None,
            net: net.clone(),
            path: path.clone(),
            gateways: Vec::new(),
            sockets: Vec::new(),
            cgroups: Vec::new(),
            client_ns,
            server_ns,
            server_addr,
            flood: false,
            prefix: prefix.to_string(),
        };
        if net.cross {
            rig.add_cross()?;
        }
        if let Some(rate) = net.rate_mbit {
            for ns in [rig.topo.ga.clone(), rig.topo.gb.clone()] {
                shape(&ns, "wan", rate)?;
            }
        }
        for ns in [rig.client_ns.clone(), rig.server_ns.clone()] {
            tune_tcp(&rig.lab, &ns, net.tcp)?;
        }
        match path {
            PathSpec::Plain => rig.topo.plain_routes(true)?,
            PathSpec::Espgate(g) => rig.start_gateways(g, exe)?,
        }
        rig.wait_ping()?;
        Ok(rig)
    }

    /// Where iperf3 runs: (client namespace, server namespace, server
    /// address).
    pub fn endpoints(&self) -> (&str, &str, &str) {
        (&self.client_ns, &self.server_ns, &self.server_addr)
    }

    /// The setup lines of this rig for the report.
    pub fn describe(&self) -> Vec<String> {
        let mut v = vec![format!(
            "link ga–gb: {}, MTU {}; hosts' TCP: {}",
            self.net
                .rate_mbit
                .map(|r| format!("htb {r} Mbit/s each way"))
                .unwrap_or_else(|| "unshaped veth".into()),
            self.net.mtu,
            match self.net.tcp {
                TcpTuning::Default => "kernel defaults",
                TcpTuning::Off => "timestamps, window scaling, SACK off",
                TcpTuning::Seed000 => "seed 000 §5.1 (options on, buffers 87380/4194304/4194304)",
            }
        )];
        v.push(match &self.path {
            PathSpec::Plain => "plain: kernel forwarding between the sites, no IPsec".into(),
            PathSpec::Espgate(g) => format!("espgate: {}", g.describe()),
        });
        v
    }

    fn add_cross(&mut self) -> Result<()> {
        let xf = format!("{}-xf", self.prefix);
        self.lab.netns(&xf)?;
        let gb = self.topo.gb.clone();
        ip(&[
            "-n", &gb, "link", "add", "cross", "type", "veth", "peer", "name", "cross", "netns",
            &xf,
        ])?;
        ip(&[
            "-n",
            &gb,
            "addr",
            "add",
            &format!("{XF_GW}/24"),
            "dev",
            "cross",
        ])?;
        ip(&[
            "-n",
            &xf,
            "addr",
            "add",
            &format!("{XF_HOST}/24"),
            "dev",
            "cross",
        ])?;
        for ns in [&gb, &xf] {
            ip(&[
                "-n",
                ns,
                "link",
                "set",
                "cross",
                "mtu",
                &self.net.mtu.to_string(),
            ])?;
            ip(&["-n", ns, "link", "set", "cross", "up"])?;
        }
        self.xf = Some(xf);
        Ok(())
    }

    /// Starts a UDP flood from the cross-traffic namespace to `gb` itself
    /// (traffic outside the tunnel that the receiving gateway must take),
    /// at `mbit` Mbit/s, until the rig is dropped.
    pub fn start_flood(&mut self, mbit: u32) -> Result<()> {
        let xf = self
            .xf
            .clone()
            .ok_or_else(|| anyhow!("the rig has no cross link"))?;
        let gb = self.topo.gb.clone();
        self.lab.spawn(
            "flood sink",
            in_ns(&gb, &["iperf3", "-s", "-B", XF_GW, "-p", "5301"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        )?;
        std::thread::sleep(Duration::from_millis(300));
        self.lab.spawn(
            "flood",
            in_ns(
                &xf,
                &[
                    "iperf3",
                    "-c",
                    XF_GW,
                    "-p",
                    "5301",
                    "-u",
                    "-b",
                    &format!("{mbit}M"),
                    "-l",
                    "1400",
                    "-t",
                    // iperf3's longest test (it refuses more): the rig
                    // stops it long before.
                    "86400",
                ],
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
        )?;
        // A flood that exits at once (a refused argument, no route) would
        // leave the experiment measuring no flood at all.
        std::thread::sleep(Duration::from_millis(500));
        for what in ["flood sink", "flood"] {
            if let Some(st) = self.lab.exited(what) {
                bail!("the {what} (iperf3) exited at once ({st})");
            }
        }
        self.flood = true;
        Ok(())
    }

    /// Polices what enters `gb` on the cross-traffic link to `mbit`
    /// Mbit/s (an nftables `limit` at prerouting, before the stack): the
    /// load the other interface can put on the gateway is bounded, as an
    /// interrupt throttle bounds it. (tc's police action is not available
    /// on every kernel; nftables is.)
    pub fn police_cross(&mut self, mbit: u32) -> Result<()> {
        let gb = self.topo.gb.clone();
        let kbytes = u64::from(mbit) * 1000 / 8;
        let rules = format!(
            "table inet espgate_lab {{\n  chain cross {{\n    type filter hook prerouting priority -300;\n    \
             iifname \"cross\" limit rate over {kbytes} kbytes/second drop\n  }}\n}}\n"
        );
        let path = self.lab.work.join("police.nft");
        std::fs::write(&path, rules)?;
        run(&mut in_ns(&gb, &["nft", "-f", &path.to_string_lossy()]))?;
        Ok(())
    }

    fn start_gateways(&mut self, g: &GwSpec, exe: &Path) -> Result<()> {
        let enc_len = |s: &str| -> Result<(usize, usize)> {
            let s: espgate_core::crypto::Suite = s.parse().map_err(|e| anyhow!("{s}: {e}"))?;
            Ok((s.enc_key_len(), s.integ_key_len()))
        };
        let key = |n: usize| {
            if n == 0 {
                Ok(String::new())
            } else {
                random_hex(n)
            }
        };
        // Keys for each direction: (esp enc, esp integ, ah integ).
        let mut dirs = Vec::new();
        for _ in 0..2 {
            let (e, i) = match &g.esp {
                Some(s) => enc_len(s)?,
                None => (0, 0),
            };
            let ah = match &g.ah {
                Some(a) => ah_key_len(a)?,
                None => 0,
            };
            dirs.push((key(e)?, key(i)?, key(ah)?));
        }
        let psk = random_hex(32)?;
        let (ab, ba) = (&dirs[0], &dirs[1]);
        let mut logs = Vec::new();
        for (side, ns, local, remote, lts, rts, spi, k_in, k_out) in [
            (
                "a",
                self.topo.ga.clone(),
                GW_A,
                GW_B,
                NET_A,
                NET_B,
                (0x1001u32, 0x1002u32),
                ba,
                ab,
            ),
            (
                "b",
                self.topo.gb.clone(),
                GW_B,
                GW_A,
                NET_B,
                NET_A,
                (0x1002, 0x1001),
                ab,
                ba,
            ),
        ] {
            let dir = self.lab.work.join(format!("espgate-{side}"));
            std::fs::create_dir_all(&dir)?;
            if g.ike.is_some() {
                write_private(&dir.join("psk"), &format!("{psk}\n"))?;
            }
            let text = gateway_config(
                g,
                self.net.mtu,
                (local, remote),
                (lts, rts),
                spi,
                k_in,
                k_out,
                side == "a",
            );
            let cfg = dir.join("gw.toml");
            write_private(&cfg, &text)?;
            let log = dir.join("log");
            let what = format!("espgate {side}");
            let pid = spawn_gateway(&mut self.lab, &what, &ns, exe, &cfg, &log)?;
            self.gateways
                .push((format!("gw{}", side.to_uppercase()), pid));
            self.sockets.push(dir.join("ctl.sock"));
            logs.push((what, log));
        }
        for (sock, (what, log)) in self.sockets.clone().iter().zip(&logs) {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                netlab::check_interrupt()?;
                if espgate_api::control::Client::new(sock, Duration::from_secs(2))
                    .status()
                    .is_ok()
                {
                    break;
                }
                if let Some(st) = self.lab.exited(what) {
                    bail!("{what} exited ({st}): {}", tail(log));
                }
                ensure!(
                    Instant::now() < deadline,
                    "{what} did not answer on its control socket within 10 s: {}",
                    tail(log)
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        if let Some(q) = g.cpu_quota_pct {
            for (name, pid) in self.gateways.clone() {
                let cg = cpu_cap(&format!("{}-{name}", self.prefix), q, pid)?;
                self.cgroups.push(cg);
            }
        }
        Ok(())
    }

    fn wait_ping(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let (c, _, s) = (self.client_ns.clone(), (), self.server_addr.clone());
        loop {
            netlab::check_interrupt()?;
            let ok = run(&mut in_ns(&c, &["ping", "-c", "1", "-W", "1", "-q", &s])).is_ok();
            if ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = ["a", "b"]
                    .iter()
                    .map(|s| tail(&self.lab.work.join(format!("espgate-{s}/log"))))
                    .collect();
                bail!(
                    "no ping from {c} to {s} within 20 s{}",
                    if self.gateways.is_empty() {
                        String::new()
                    } else {
                        format!(" (gateway logs: {})", logs.join(" | "))
                    }
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// One iperf3 run with `t`; the CPU of the host (by `/proc/stat`
    /// state, % of all CPUs) and of each gateway process (user and system,
    /// % of one CPU) during it.
    pub fn iperf(&mut self, t: &Traffic) -> Result<Sample> {
        let mut args: Vec<String> = vec![
            "-t".into(),
            format!("{}", t.secs.max(1.0).round() as u64),
            "-l".into(),
            t.len.to_string(),
            "--connect-timeout".into(),
            "5000".into(),
        ];
        if t.udp {
            args.extend([
                "-u".into(),
                "-b".into(),
                t.udp_rate_bps.map(|r| r.to_string()).unwrap_or("0".into()),
            ]);
        }
        if t.bidir {
            args.push("--bidir".into());
        }
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let host0 = host_cpu();
        let gw0: Vec<Option<(u64, u64)>> =
            self.gateways.iter().map(|(_, p)| proc_cpu(*p)).collect();
        let t0 = Instant::now();
        let (c, s, addr) = (
            self.client_ns.clone(),
            self.server_ns.clone(),
            self.server_addr.clone(),
        );
        let limit = Duration::from_secs_f64(t.secs + 20.0);
        let r = netlab::iperf3(&mut self.lab, &c, &s, &addr, &arg_refs, &[], limit, None)?;
        let wall = t0.elapsed().as_secs_f64();
        let mut sample = parse(&r.json, t)?;
        if let (Some(a), Some(b)) = (host0, host_cpu()) {
            for (k, v) in cpu_shares(&a, &b) {
                sample.extra.insert(format!("cpu.{k}"), v);
            }
        }
        let hz = netlab::clock_ticks();
        for ((name, pid), before) in self.gateways.iter().zip(gw0) {
            if let (Some((u0, s0)), Some((u1, s1))) = (before, proc_cpu(*pid)) {
                let pct = |d: u64| d as f64 / hz / wall * 100.0;
                sample
                    .extra
                    .insert(format!("{name}.user"), pct(u1.saturating_sub(u0)));
                sample
                    .extra
                    .insert(format!("{name}.system"), pct(s1.saturating_sub(s0)));
            }
        }
        Ok(sample)
    }

    /// The gateways' control clients.
    pub fn clients(&self) -> Vec<espgate_api::control::Client> {
        self.sockets
            .iter()
            .map(|s| espgate_api::control::Client::new(s, Duration::from_secs(5)))
            .collect()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.lab.stop_children();
        for cg in self.cgroups.drain(..) {
            // The processes are gone, so the group is empty and removable.
            let _ = std::fs::remove_dir(&cg);
        }
        self.lab.remove_namespaces();
    }
}

/// Key bytes of AH algorithm `a`.
fn ah_key_len(a: &str) -> Result<usize> {
    Ok(match a {
        "md5" => 16,
        "sha1" => 20,
        "sha256" => 32,
        "sha384" => 48,
        "sha512" => 64,
        "aesxcbc" => 16,
        other => bail!("unknown AH algorithm {other}"),
    })
}

/// The configuration file of one gateway of the pair.
#[allow(clippy::too_many_arguments)]
pub fn gateway_config(
    g: &GwSpec,
    mtu: u32,
    (local, remote): (&str, &str),
    (lts, rts): (&str, &str),
    spis: (u32, u32),
    keys_in: &(String, String, String),
    keys_out: &(String, String, String),
    initiator: bool,
) -> String {
    let key = |k: &str| {
        (!k.is_empty()).then(|| value(SecretHex::new(zeroize::Zeroizing::new(k.to_string()))))
    };
    let raw = g.ah.is_some() || !g.udp || g.qesp;
    let gateway = GatewayTable {
        tun: Some(value("espgate0".into())),
        control_socket: Some(value("ctl.sock".into())),
        state_dir: Some(value("state".into())),
        mtu: Some(value(mtu.into())),
        offloads: Some(g.offloads),
        batch: g.batch.map(|b| value(b.into())),
        socket_buffer: g.socket_buffer.map(|b| value(b as i64)),
        encap: Some(if raw {
            Encapsulation::None
        } else {
            Encapsulation::Udp
        }),
        fwmark: (g.mode == Mode::Transport).then(|| value(0x4500)),
        ..GatewayTable::default()
    };
    let mut conn = ConnectionTable::new("lab", local, remote);
    conn.mode = Some(match g.mode {
        Mode::Tunnel => ModeName::Tunnel,
        Mode::Transport => ModeName::Transport,
    });
    if g.mode == Mode::Tunnel {
        conn.local_ts = Some(value(vec![value(lts.to_string())]));
        conn.remote_ts = Some(value(vec![value(rts.to_string())]));
    }
    let clamp = if g.mss_clamp { "auto" } else { "off" };
    conn.mss_clamp = Some(value(Scalar::Str(clamp.into())));
    let legacy = |s: &str| {
        ["des", "3des", "md5"]
            .iter()
            .any(|l| s.split('-').any(|p| p == *l))
    };
    if g.esp.as_deref().is_some_and(legacy) || g.ah.as_deref().is_some_and(legacy) {
        conn.allow_insecure = Some(true);
    }
    if let Some(ike) = &g.ike {
        let mut t = IkeTable {
            psk_file: Some(value("psk".into())),
            esp_proposals: Some(value(vec![value(ike.esp_proposal.clone())])),
            start_action: Some(if initiator {
                StartAction::Start
            } else {
                StartAction::None
            }),
            ..IkeTable::default()
        };
        if let Some(s) = ike.child_rekey_s {
            t.child_rekey_time = Some(value(Scalar::Str(format!("{s}s"))));
            t.child_life_time = Some(value(Scalar::Str(format!("{}s", s * 3))));
            t.jitter = Some(value(Scalar::Str("0s".into())));
        }
        conn.ike = Some(value(t));
    } else {
        if let Some(suite) = &g.esp {
            let mut esp = SaTable::new(suite, spis.0, spis.1);
            esp.enc_in = key(&keys_in.0);
            esp.enc_out = key(&keys_out.0);
            esp.integ_in = key(&keys_in.1);
            esp.integ_out = key(&keys_out.1);
            conn.esp = Some(value(esp));
        }
        if let Some(a) = &g.ah {
            let mut ah = SaTable::new(a, spis.0 + 0x1000, spis.1 + 0x1000);
            ah.integ_in = key(&keys_in.2);
            ah.integ_out = key(&keys_out.2);
            conn.ah = Some(value(ah));
        }
        conn.protocol = Some(value(match (&g.esp, &g.ah) {
            (Some(_), Some(_)) => Protocols::EspAh,
            (None, Some(_)) => Protocols::Ah,
            _ if g.qesp => Protocols::Qesp,
            _ => Protocols::Esp,
        }));
    }
    let file = ConfigFile {
        gateway: Some(value(gateway)),
        connection: vec![value(conn)],
        cluster: None,
    };
    let body = toml::to_string(&file).expect("a configuration of strings and integers");
    format!("# written by espgate lab\n{body}")
}

/// The last lines of a log file, on one line.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(4).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" / ")
}

/// `htb` at `mbit` on `dev`'s egress in `ns`.
fn shape(ns: &str, dev: &str, mbit: u32) -> Result<()> {
    let rate = format!("{mbit}mbit");
    // A burst of at least 10 ms at the rate (and ≥ 64 KiB so jumbo frames
    // and GSO pass), so the shaper does not starve a fast link.
    let burst = format!("{}", (u64::from(mbit) * 1_000_000 / 8 / 100).max(65536));
    run(&mut in_ns(
        ns,
        &[
            "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10",
        ],
    ))?;
    run(&mut in_ns(
        ns,
        &[
            "tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate",
            &rate, "ceil", &rate, "burst", &burst, "cburst", &burst,
        ],
    ))?;
    Ok(())
}

/// Sets the TCP options and buffers of namespace `ns`.
fn tune_tcp(lab: &Lab, ns: &str, t: TcpTuning) -> Result<()> {
    let (opt, rmem, wmem) = match t {
        TcpTuning::Default => return Ok(()),
        TcpTuning::Off => ("0", "4096 87380 212992", "4096 16384 212992"),
        TcpTuning::Seed000 => ("1", "87380 4194304 4194304", "87380 4194304 4194304"),
    };
    for k in ["tcp_timestamps", "tcp_window_scaling", "tcp_sack"] {
        lab.sysctl(ns, &format!("net.ipv4.{k}={opt}"))?;
    }
    lab.sysctl(ns, &format!("net.ipv4.tcp_rmem={rmem}"))?;
    lab.sysctl(ns, &format!("net.ipv4.tcp_wmem={wmem}"))?;
    Ok(())
}

/// Puts `pid` (all its threads) in a new CPU cgroup named `name` capped
/// at `pct` % of one CPU: cgroup v1 `cpu.cfs_quota_us` when mounted, else
/// v2 `cpu.max`. Returns the group's directory (removed by the caller).
pub fn cpu_cap(name: &str, pct: u32, pid: u32) -> Result<PathBuf> {
    cpu_cap_period(name, pct, pid, 100_000)
}

/// [`cpu_cap`] with a cfs period of `period` µs (a shorter period makes
/// a throttled process stall for shorter stretches at the same share).
pub fn cpu_cap_period(name: &str, pct: u32, pid: u32, period: u64) -> Result<PathBuf> {
    ensure!(pct > 0, "a CPU quota of 0 % stops the gateway");
    let quota = period * u64::from(pct) / 100;
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    let (dir, files): (PathBuf, Vec<(&str, String)>) = if v1.join("cpu.cfs_quota_us").exists() {
        (
            v1.join(name),
            vec![
                ("cpu.cfs_period_us", period.to_string()),
                ("cpu.cfs_quota_us", quota.to_string()),
            ],
        )
    } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        (
            Path::new("/sys/fs/cgroup").join(name),
            vec![("cpu.max", format!("{quota} {period}"))],
        )
    } else {
        bail!("no CPU cgroup controller (neither /sys/fs/cgroup/cpu nor cgroup v2)");
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let fill = || -> Result<()> {
        for (f, v) in &files {
            std::fs::write(dir.join(f), v)
                .with_context(|| format!("{}/{f} = {v}", dir.display()))?;
        }
        std::fs::write(dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving {pid} into {}", dir.display()))?;
        Ok(())
    };
    if let Err(e) = fill() {
        let _ = std::fs::remove_dir(&dir);
        return Err(e);
    }
    Ok(dir)
}

/// The host's CPU time by state, from the `cpu` line of /proc/stat.
fn host_cpu() -> Option<[u64; 8]> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    parse_proc_stat(&s)
}

/// user, nice, system, idle, iowait, irq, softirq, steal of `cpu ` line.
pub fn parse_proc_stat(s: &str) -> Option<[u64; 8]> {
    let line = s.lines().find(|l| l.starts_with("cpu "))?;
    let mut v = [0u64; 8];
    let mut it = line.split_whitespace().skip(1);
    for x in v.iter_mut() {
        *x = it.next()?.parse().ok()?;
    }
    Some(v)
}

/// The shares (% of all CPU time) of user (with nice), system, irq,
/// softirq and idle (with iowait and steal) between two readings.
pub fn cpu_shares(a: &[u64; 8], b: &[u64; 8]) -> Vec<(&'static str, f64)> {
    let d: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| y.saturating_sub(*x) as f64)
        .collect();
    let total: f64 = d.iter().sum();
    if total <= 0.0 {
        return Vec::new();
    }
    let pct = |x: f64| x / total * 100.0;
    vec![
        ("user", pct(d[0] + d[1])),
        ("system", pct(d[2])),
        ("irq", pct(d[5])),
        ("softirq", pct(d[6])),
        ("idle", pct(d[3] + d[4] + d[7])),
    ]
}

/// (utime, stime) ticks of `pid`, all threads.
fn proc_cpu(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_pid_stat(&s)
}

/// (utime, stime) from a /proc/PID/stat line (fields 14 and 15; the
/// command name in parentheses may hold spaces).
pub fn parse_pid_stat(s: &str) -> Option<(u64, u64)> {
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 -> index 11.
    Some((f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?))
}

/// The receiver's throughput of an iperf3 `-J` document (both directions
/// for `--bidir`), retransmits (TCP) and loss (UDP).
pub fn parse(v: &serde_json::Value, t: &Traffic) -> Result<Sample> {
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let end = &v["end"];
    let mut s = Sample::default();
    let dirs: &[&str] = if t.bidir {
        &["sum_received", "sum_received_bidir_reverse"]
    } else {
        &["sum_received"]
    };
    for d in dirs {
        let rx = &end[*d];
        let bps = rx["bits_per_second"]
            .as_f64()
            .ok_or_else(|| anyhow!("no end.{d}.bits_per_second in iperf3's output"))?;
        s.mbps += bps / 1e6;
        if t.udp {
            if let (Some(p), Some(l)) = (rx["packets"].as_f64(), rx["lost_packets"].as_f64()) {
                if p > 0.0 {
                    *s.extra.entry("loss_pct".into()).or_default() +=
                        l / p * 100.0 / dirs.len() as f64;
                }
            }
        }
    }
    if !t.udp {
        let mut rt = end["sum_sent"]["retransmits"].as_f64().unwrap_or(0.0);
        if t.bidir {
            rt += end["sum_sent_bidir_reverse"]["retransmits"]
                .as_f64()
                .unwrap_or(0.0);
        }
        s.extra.insert("retransmits".into(), rt);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_shares_add_up() {
        let a = parse_proc_stat("cpu  100 0 50 800 0 0 50 0 0 0\ncpu0 1 2 3\n").unwrap();
        let b = parse_proc_stat("cpu  200 0 100 850 0 0 100 0 0 0\n").unwrap();
        let s: BTreeMap<_, _> = cpu_shares(&a, &b).into_iter().collect();
        assert_eq!(s["user"], 40.0);
        assert_eq!(s["system"], 20.0);
        assert_eq!(s["softirq"], 20.0);
        assert_eq!(s["idle"], 20.0);
        assert_eq!(s.values().sum::<f64>(), 100.0);
        assert!(cpu_shares(&a, &a).is_empty());
        assert!(parse_proc_stat("intr 1 2\n").is_none());
    }

    #[test]
    fn pid_stat_reads_utime_and_stime_past_a_name_with_spaces() {
        let line = "42 (esp gate) S 1 42 42 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 3 0 1 2 3";
        assert_eq!(parse_pid_stat(line), Some((1234, 567)));
        assert_eq!(parse_pid_stat("42 (x) S 1"), None);
        let own = proc_cpu(std::process::id());
        assert!(own.is_some());
    }

    #[test]
    fn iperf_documents_give_receiver_rate_retransmits_and_loss() {
        let tcp = serde_json::json!({"end": {
            "sum_received": {"bits_per_second": 9.5e8},
            "sum_sent": {"bits_per_second": 9.6e8, "retransmits": 7}}});
        let t = Traffic {
            udp: false,
            len: 1024,
            bidir: false,
            secs: 1.0,
            udp_rate_bps: None,
        };
        let s = parse(&tcp, &t).unwrap();
        assert_eq!(s.mbps, 950.0);
        assert_eq!(s.extra["retransmits"], 7.0);
        let bidir = serde_json::json!({"end": {
            "sum_received": {"bits_per_second": 1e8},
            "sum_received_bidir_reverse": {"bits_per_second": 2e8},
            "sum_sent": {"retransmits": 1}, "sum_sent_bidir_reverse": {"retransmits": 2}}});
        let s = parse(&bidir, &Traffic { bidir: true, ..t }).unwrap();
        assert_eq!(s.mbps, 300.0);
        assert_eq!(s.extra["retransmits"], 3.0);
        let udp = serde_json::json!({"end": {"sum_received":
            {"bits_per_second": 5e7, "packets": 1000, "lost_packets": 100}}});
        let s = parse(&udp, &Traffic { udp: true, ..t }).unwrap();
        assert_eq!(s.mbps, 50.0);
        assert_eq!(s.extra["loss_pct"], 10.0);
        assert!(parse(&serde_json::json!({"error": "no"}), &t).is_err());
        assert!(parse(&serde_json::json!({"end": {}}), &t).is_err());
    }

    #[test]
    fn configs_are_valid_for_every_kind_of_pair() {
        let mut specs = vec![
            GwSpec::esp("aes128gcm16", Mode::Tunnel),
            GwSpec::esp("3des-md5", Mode::Transport),
        ];
        let mut ah = GwSpec::esp("aes256-sha1", Mode::Tunnel);
        ah.ah = Some("md5".into());
        specs.push(ah);
        let mut ah_only = GwSpec::esp("x", Mode::Transport);
        ah_only.esp = None;
        ah_only.ah = Some("sha1".into());
        specs.push(ah_only);
        let mut ike = GwSpec::esp("aes128-sha256", Mode::Tunnel);
        ike.ike = Some(IkeSpec {
            esp_proposal: "aes128-sha256-x25519".into(),
            child_rekey_s: Some(5),
        });
        ike.batch = Some(1);
        ike.socket_buffer = Some(4 << 20);
        specs.push(ike);
        let dir = std::env::temp_dir().join(format!("espgate-lab-rig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_private(&dir.join("psk"), "0123456789abcdef0123456789abcdef\n").unwrap();
        for g in specs {
            // keys sized for the suite
            // distinct, non-degenerate key bytes (3DES refuses repeated halves)
            let pat = |n: usize, seed: usize| -> String {
                (0..n)
                    .map(|j| format!("{:02x}", (j * 37 + seed * 11 + 1) as u8))
                    .collect()
            };
            let sized = |s: &Option<String>, e: usize, i: usize| -> (String, String) {
                match s
                    .as_deref()
                    .map(|s| s.parse::<espgate_core::crypto::Suite>())
                {
                    Some(Ok(su)) => (pat(su.enc_key_len(), e), pat(su.integ_key_len(), i)),
                    _ => (String::new(), String::new()),
                }
            };
            let ahk = |seed: usize| {
                g.ah.as_deref()
                    .map(|a| pat(ah_key_len(a).unwrap(), seed))
                    .unwrap_or_default()
            };
            let (e, i) = sized(&g.esp, 1, 2);
            let k_in = (e, i, ahk(3));
            let (e, i) = sized(&g.esp, 4, 5);
            let k_out = (e, i, ahk(6));
            let text = gateway_config(
                &g,
                1500,
                (GW_A, GW_B),
                (NET_A, NET_B),
                (0x1001, 0x1002),
                &k_in,
                &k_out,
                true,
            );
            let parsed = espgate_config::parse(&text, &dir, "gw.toml");
            assert!(
                parsed.is_ok(),
                "{}\n{text}\n{:?}",
                g.describe(),
                parsed.err()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
