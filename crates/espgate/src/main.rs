//! The `espgate` command.

// The doc comments of the argument types below are clap's help text for
// users, written for a terminal: `[cluster]` is a TOML table,
// `[,tfc=N]` an optional part of an argument and `<redacted>` literal
// output, not rustdoc links or HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use anyhow::Result;
use clap::{Parser, Subcommand};
use espgate_api::control::{self, Client, CostsAction, Proto, Request, Response, SaDir};
use espgate_api::{status, wireshark};
use espgate_config as config;
use espgate_lab::pcap as pcap_cmd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Counts allocations on the data plane's hot path (`hot_path_allocs` in
/// `espgate status`); otherwise the system allocator.
#[global_allocator]
static ALLOC: espgate_daemon::alloc_count::CountingAlloc =
    espgate_daemon::alloc_count::CountingAlloc;

#[derive(Parser)]
#[command(
    name = "espgate",
    version,
    about = "Userspace IPsec (ESP/AH) gateway and IPsec performance lab"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Encrypt or decrypt packet captures with manually keyed SAs.
    Pcap {
        #[command(subcommand)]
        dir: PcapCmd,
    },
    /// List the cipher suites espgate implements (strongSwan keywords).
    Suites,
    /// Run the gateway (static SAs from the config file, IKEv2 for
    /// connections with [connection.ike]), in the foreground unless
    /// --daemon.
    ///
    /// Stops cleanly on SIGINT, SIGTERM or SIGHUP: the TUN device, routes,
    /// rules, the control socket and the pid file are removed. Under
    /// systemd (Type=notify) it reports READY=1 once up.
    ///
    /// With a [cluster] table, this process also runs the node's cluster
    /// agent (etcd lease, report, election, plan) from the moment the
    /// control socket listens until the gateway has stopped; see
    /// --no-cluster-agent.
    Up {
        /// Configuration file (docs/CONFIG.md).
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// More log output (-v debug, -vv trace); RUST_LOG overrides both
        /// this and gateway.log.
        #[arg(short, long, action = clap::ArgAction::Count)]
        verbose: u8,
        /// Run in the background: exits 0 once the gateway is fully up
        /// (TUN, routes, sockets, control socket), or 1 with its error
        /// after undoing everything.
        #[arg(short, long)]
        daemon: bool,
        /// Write the daemon's process id here while it runs [default with
        /// --daemon: the control socket's path with extension .pid, e.g.
        /// /run/espgate/espgate.pid].
        #[arg(long, value_name = "PATH")]
        pid_file: Option<PathBuf>,
        /// Where a --daemon's log goes [default: /var/log/espgate/NAME.log
        /// for the configuration file NAME.toml].
        #[arg(long, value_name = "PATH", requires = "daemon")]
        log_file: Option<PathBuf>,
        /// With [cluster]: do not run the cluster agent in this process
        /// (run `espgate cluster agent` separately, or tell the daemon the
        /// plan some other way).
        #[arg(long)]
        no_cluster_agent: bool,
    },
    /// Check a configuration file without running anything.
    Config {
        #[command(subcommand)]
        cmd: ConfigCmd,
    },
    /// Seed 003's flat cluster (a [cluster] table): its state in etcd, or
    /// the cluster agent on its own.
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Show the running gateway: TUN, connections, SAs, counters, drops.
    Status {
        /// Only the per-stage costs (cost accounting: `espgate costs on`
        /// or gateway.cost_accounting = true); with --json the document
        /// {"cost_accounting": true|false, "costs": {...}}.
        #[arg(long)]
        costs: bool,
        /// Only the IKEv2 per-operation costs (DH, signatures, key
        /// derivation, encryption, encoding), over all IKE SAs and per IKE
        /// SA; always on for IKE connections.
        #[arg(long, conflicts_with = "costs")]
        ike_costs: bool,
        #[command(flatten)]
        target: ControlArgs,
    },
    /// Per-stage cost accounting of the running gateway (seed 004's
    /// per-packet breakdown): on, off or reset. Off by default
    /// (gateway.cost_accounting); while on, each packet's stages are timed
    /// and `espgate status --costs` shows them. Off drops the counts.
    Costs {
        /// on, off or reset.
        #[arg(value_parser = ["on", "off", "reset"])]
        action: String,
        #[command(flatten)]
        target: ControlArgs,
    },
    /// Manually keyed SAs of the running gateway: list, add, del.
    Sa {
        #[command(subcommand)]
        cmd: SaCmd,
    },
    /// Print the running gateway's ESP keys for Wireshark: its esp_sa file
    /// (default) or tshark arguments (--tshark).
    ///
    /// The file goes into a Wireshark profile (profiles/NAME/esp_sa; also
    /// set esp.enable_encryption_decode: TRUE there). The tshark form is
    /// one shell-quoted line: eval "tshark -r esp.pcap $(espgate
    /// wireshark-keys --tshark)". Wireshark 4.0 format; SAs it cannot
    /// decrypt (ChaCha20-Poly1305, AES-GMAC) and AH SAs (nothing to
    /// decrypt) are comment lines in the file and notes on stderr with
    /// --tshark. The output holds live keys: keep it private.
    WiresharkKeys {
        /// Print tshark arguments instead of the esp_sa file.
        #[arg(long)]
        tshark: bool,
        #[command(flatten)]
        target: ControlArgs,
    },
    /// Start the IKE SA and child SAs of a connection with [connection.ike]
    /// on the running gateway (as start_action = "start" does at start-up).
    /// With its IKE SA up, it asks for the child SA of each selector set
    /// that has none (deleted or refused by the peer).
    Initiate {
        /// The connection (its name in the configuration).
        #[arg(value_name = "NAME")]
        name: String,
        #[command(flatten)]
        target: ControlArgs,
    },
    /// Delete the IKE SA and child SAs of a connection with
    /// [connection.ike] on the running gateway (the peer is told).
    Terminate {
        /// The connection (its name in the configuration).
        #[arg(value_name = "NAME")]
        name: String,
        #[command(flatten)]
        target: ControlArgs,
    },
    /// Make a private key for IKE signature authentication (PKCS#8 PEM),
    /// and optionally its public key, or a random pre-shared key.
    ///
    /// The key or PSK file is created with mode 0600; an existing file is
    /// kept unless --force. A PSK is 32 random bytes written as 44 base64
    /// characters, which are the key (use the same text as the peer's
    /// secret, e.g. strongSwan's secret = "..."). Certificates are not made
    /// here: have a CA sign a request for the key (openssl req -new -key).
    Keygen {
        /// ed25519, ecdsa-p256, ecdsa-p384 or psk.
        #[arg(long = "type", value_name = "TYPE", value_parser = espgate_config::keygen::KeyType::NAMES)]
        kind: String,
        /// The private key (or PSK) file to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Also write the public key ("PUBLIC KEY" PEM) here, for the
        /// peer's remote_public_key.
        #[arg(long = "pub", value_name = "FILE")]
        public: Option<PathBuf>,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
    /// Two sites in network namespaces, over plain routing and through two
    /// espgate gateways: ping, iperf3 and gateway CPU in a table. Needs
    /// root, iproute2, ping and iperf3; removes everything it made, also on
    /// Ctrl-C.
    Demo {
        /// One-second iperf3 runs and three pings (as the tests run it).
        #[arg(long)]
        short: bool,
        /// Prefix of the namespace names (default egdemo-PID).
        #[arg(long, hide = true)]
        prefix: Option<String>,
    },
    /// Benchmarks you can run on your own hardware (docs/PERFORMANCE.md).
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
    /// The seed papers' experiments on espgate, with the papers' numbers
    /// beside ours, in one report (docs/lab/).
    Lab {
        #[command(subcommand)]
        what: espgate_lab::lab::cli::LabCmd,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// The cluster as etcd holds it: the leader, the plan (epoch and
    /// members) and every live node's state, whether it is in step, and per
    /// outbound SA the packets it processed and only observed.
    Status {
        /// Configuration file with the [cluster] table.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// The JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run this node's cluster agent in the foreground until SIGINT,
    /// SIGTERM or SIGHUP.
    ///
    /// `espgate up` runs the agent itself when the configuration has
    /// [cluster]; this runs it as a separate process instead, beside a
    /// daemon started with `espgate up --no-cluster-agent`.
    Agent {
        /// Configuration file with the [cluster] table.
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// More log output (-v debug, -vv trace); RUST_LOG overrides both
        /// this and gateway.log.
        #[arg(short, long, action = clap::ArgAction::Count)]
        verbose: u8,
    },
}

/// The configuration at `path` and its [cluster] table, or the exit code
/// after saying why not.
fn load_cluster(path: &Path) -> Result<(config::LoadedConfig, config::Cluster), ExitCode> {
    let cfg = match config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!("espgate: the configuration has errors");
            return Err(ExitCode::from(2));
        }
    };
    match cfg.cluster.clone() {
        Some(c) => Ok((cfg, c)),
        None => {
            eprintln!(
                "espgate: {} has no [cluster] table: this gateway is not a cluster node",
                path.display()
            );
            Err(ExitCode::from(2))
        }
    }
}

/// `espgate cluster status`.
fn run_cluster_status(path: &Path, json: bool) -> ExitCode {
    let (_, cluster) = match load_cluster(path) {
        Ok(x) => x,
        Err(code) => return code,
    };
    match espgate_cluster::cluster_view(&cluster) {
        Ok(v) if json => match serde_json::to_string_pretty(&v) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("espgate: encoding the cluster view: {e}");
                ExitCode::from(1)
            }
        },
        Ok(v) => {
            print!("{}", v.render());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("espgate: cluster {}: {e:#}", cluster.name);
            ExitCode::from(1)
        }
    }
}

/// `espgate cluster agent`: the agent until a stop signal.
fn run_cluster_agent(path: &Path, verbose: u8) -> ExitCode {
    use nix::sys::signal::{SigSet, Signal};
    let (cfg, cluster) = match load_cluster(path) {
        Ok(x) => x,
        Err(code) => return code,
    };
    init_logging(cfg.gateway.log, verbose);
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    // Blocked before the agent's thread starts, so that it inherits the
    // mask and the signals wait here for sigwait.
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    if let Err(e) = set.thread_block() {
        eprintln!("espgate: blocking SIGINT/SIGTERM/SIGHUP: {e}");
        return ExitCode::from(1);
    }
    let agent = match espgate_cluster::Agent::start(&cluster, cfg.gateway.control_socket.clone()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("espgate: cluster {}: {e:#}", cluster.name);
            return ExitCode::from(1);
        }
    };
    tracing::info!(
        "cluster {}: node {}'s agent runs beside the daemon on {}",
        cluster.name,
        cluster.node,
        cfg.gateway.control_socket.display()
    );
    let code = match set.wait() {
        Ok(sig) => {
            tracing::info!("{sig}: leaving the cluster");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("waiting for a signal: {e}; leaving the cluster");
            ExitCode::from(1)
        }
    };
    agent.stop();
    code
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Validate the file as `espgate up` does (exit status 2 and every
    /// error when it does not validate), print its warnings on stderr, then
    /// the effective configuration on stdout: every default filled in,
    /// paths made absolute, keys shown as <redacted>.
    Check {
        /// Configuration file (docs/CONFIG.md).
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// JSON instead of TOML.
        #[arg(long)]
        json: bool,
    },
}

/// `espgate config check`.
fn run_config_check(path: &Path, json: bool) -> ExitCode {
    let cfg = match config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!("espgate: the configuration has errors");
            return ExitCode::from(2);
        }
    };
    for w in &cfg.warnings {
        eprintln!("warning: {w}");
    }
    if json {
        println!("{}", cfg.effective_json());
    } else {
        print!("{}", cfg.effective_toml());
    }
    ExitCode::SUCCESS
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Each suite's cipher and MAC alone (aws-lc-rs), seal and open, by size.
    Crypto {
        #[command(flatten)]
        args: BenchArgs,
    },
    /// The in-memory ESP pipeline per suite and size, outbound and inbound,
    /// against the raw cipher and the `null` skeleton measured in the same
    /// run (so the report says what share of the cost is cryptography).
    Esp {
        #[command(flatten)]
        args: BenchArgs,
        /// out, in or both.
        #[arg(long, default_value = "both")]
        direction: String,
        /// Then run each pipeline once more with the per-stage probe on and
        /// print ns per packet of each stage (--json: a "stages" object
        /// per row). The other numbers are measured with the probe off.
        #[arg(long)]
        costs: bool,
        /// esp, or qesp for Q-ESP (docs/QESP.md) on the same suites (its
        /// rows are named "qesp SUITE"; the raw cipher and the skeleton
        /// stay ESP's).
        #[arg(long, default_value = "esp", value_parser = ["esp", "qesp"])]
        proto: String,
    },
    /// iperf3 between two sites in network namespaces through plain
    /// routing, espgate and (--peers) wireguard-go (current, or Debian's
    /// 2022 build), boringtun, strongSwan, OpenVPN, each version printed:
    /// median/min/max Mbit/s, UDP packet rate and loss, ratio to plain
    /// routing, gateway CPU. Needs root and iperf3.
    Tunnel(espgate_lab::bench::tunnel::Args),
    /// One SA's outbound pipeline over N crypto threads with in-order
    /// delivery, against the serial loop: packets/s, Gbit/s, speedup.
    Parallel(espgate_lab::bench::parallel::Args),
    /// Complete IKEv2 handshakes (IKE_SA_INIT + IKE_AUTH, one child SA)
    /// between two engines in memory, per key-exchange group and auth
    /// method: handshakes/s and µs per handshake of each operation (DH,
    /// signatures, key derivation, ...), seed 004's IKE cost table.
    Ike(espgate_lab::bench::ike::Args),
    /// Denial-of-service floods against an espgate gateway in network
    /// namespaces (unknown SPIs, bad ICVs, a closed port, IKE_SA_INIT):
    /// a TCP stream's rate with and without the flood, the junk the
    /// gateway counted, its CPU and memory, IKE set-up times under the
    /// flood. Needs root and iperf3.
    Dos(espgate_lab::bench::dos::Args),
    /// The flood sender `bench dos` runs in a namespace (raw socket,
    /// sendmmsg); prints one JSON line with what it sent.
    #[command(hide = true)]
    Flood(espgate_lab::bench::dos::FloodArgs),
    /// The no-crypto userspace relay `bench tunnel --relay` runs in each
    /// gateway namespace (not a VPN: the ceiling of a userspace UDP
    /// tunnel, for measurement only).
    #[command(hide = true)]
    Relay(espgate_lab::bench::relay::Args),
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Suites (strongSwan keywords), repeatable or comma-separated
    /// [default: aes128gcm16, aes256gcm16, chacha20poly1305, aes128gmac,
    /// aes128-sha256, aes256-sha1, null-sha256].
    #[arg(long, value_delimiter = ',')]
    suite: Vec<String>,
    /// Inner packet sizes in bytes, repeatable or comma-separated
    /// [default: 64, 512, 1400, 8192].
    #[arg(long, value_delimiter = ',')]
    size: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 0.1)]
    seconds: f64,
    /// Repetitions per measurement (interleaved; the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// One JSON list of rows instead of the table.
    #[arg(long)]
    json: bool,
}

fn run_bench(what: BenchCmd) -> Result<ExitCode> {
    use espgate_lab::bench;
    let (args, direction, is_esp, costs, qesp) = match what {
        BenchCmd::Crypto { args } => (args, "both".to_string(), false, false, false),
        BenchCmd::Esp {
            args,
            direction,
            costs,
            proto,
        } => (args, direction, true, costs, proto == "qesp"),
        BenchCmd::Tunnel(a) => return Ok(espgate_lab::bench::tunnel::main(&a)),
        BenchCmd::Parallel(a) => return espgate_lab::bench::parallel::main(&a),
        BenchCmd::Ike(a) => return espgate_lab::bench::ike::main(&a),
        BenchCmd::Dos(a) => return Ok(espgate_lab::bench::dos::main(&a)),
        BenchCmd::Flood(a) => return Ok(espgate_lab::bench::dos::flood_main(&a)),
        BenchCmd::Relay(a) => return Ok(espgate_lab::bench::relay::main(&a)),
    };
    let mut p = bench::Params::new(
        &args.suite,
        &args.size,
        args.seconds,
        args.repeat,
        &direction,
    )?;
    p.costs = costs;
    if qesp {
        p.protocol = espgate_core::sa::Protocol::Qesp;
    }
    let quiet = args.json || !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let progress = |s: &str| {
        if !quiet {
            eprint!("\r\x1b[K{s}");
        }
    };
    let cpu_before = espgate_lab::bench::tunnel::read_cpu_steal_total();
    let rows = if is_esp {
        bench::esp(&p, progress)?
    } else {
        bench::crypto(&p, progress)?
    };
    // The hypervisor's share while this ran: what the spread cannot say.
    let steal = cpu_before
        .zip(espgate_lab::bench::tunnel::read_cpu_steal_total())
        .and_then(|(b, a)| espgate_lab::bench::tunnel::steal_percent(b, a));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        if !quiet {
            eprint!("\r\x1b[K");
        }
        print!("{}", bench::table(&rows));
        if is_esp {
            println!(
                "vs raw: pipeline throughput / the suite's raw seal (outbound) or open (inbound), \
                 as `bench crypto` measures them, in this run; \
                 ceiling (outbound): raw seal / (copy the packet in + raw seal), the best \
                 `vs raw` a pipeline that starts with the TUN read's copy can reach; \
                 no copy (outbound, AEAD): raw seal / the pipeline sealing straight from the \
                 packet where it lies, as a TSO segment is sealed (ESP's own work, no copy); \
                 crypto: share of the time that is cryptography (1 - null skeleton / suite)"
            );
        }
        if rows.iter().any(|r| r.library.is_some()) {
            println!(
                "AES-GCM: {}",
                espgate_core::crypto::GcmImpl::current().describe()
            );
        }
        if let Some(st) = steal {
            println!(
                "CPU steal during the bench: {st:.1} % of all CPU time (time the hypervisor \
                 gave other guests; with much of it, ns/packet and the spread are the host's)"
            );
        }
        if costs {
            println!("\n{}{}", bench::costs_table(&rows), bench::COSTS_NOTES);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Subcommand)]
enum SaCmd {
    /// One line per SA: SPI, suite, counters, sequence numbers, lifetime.
    /// SAs added with `sa add` are marked with a +.
    List {
        #[command(flatten)]
        target: ControlArgs,
    },
    /// Install an SA on a connection of the running gateway (manual
    /// rekeying, like setkey). Run-time only: lost when the daemon
    /// restarts; the configuration file is not changed.
    ///
    /// --dir in: the SA is accepted next to the connection's other inbound
    /// SAs, so the peer can switch to it when it likes (make before
    /// break). --dir out: it replaces the connection's outbound SA of its
    /// protocol for the next packet, starting at the sequence number
    /// reserved on disk for its key (gateway.state_dir). Rekey inbound on
    /// both gateways first, then outbound, then `sa del` the old SAs.
    /// Mode, encapsulation, addresses and ports come from the connection;
    /// spec keys contradicting it are refused.
    Add {
        /// The connection (its name in the configuration).
        #[arg(long, value_name = "NAME")]
        conn: String,
        /// in: an SA the peer sends on; out: the SA this gateway sends on.
        #[arg(long, value_parser = ["in", "out"])]
        dir: String,
        /// The keys, as the SA spec of `espgate pcap`:
        /// spi=0x…,suite=…,enc=HEX[,integ=HEX][,proto=esp|ah|qesp][,esn=yes]
        /// [,window=N][,tfc=N][,allow_insecure=yes] (inbound also [,seq=N]).
        /// `-` reads it from standard input, which keeps the keys out of
        /// the process list and shell history.
        #[arg(value_name = "SPEC")]
        spec: String,
        #[command(flatten)]
        target: ControlArgs,
    },
    /// Remove an SA (configured or added) from the running gateway.
    /// Run-time only, like `sa add`. A connection left without an outbound
    /// SA sends nothing: its packets are dropped and counted as no_sa.
    Del {
        /// SPI, hex (0x…) or decimal.
        #[arg(long, value_parser = parse_spi)]
        spi: u32,
        /// esp, ah or qesp; needed only when SAs of two protocols share the SPI.
        #[arg(long, value_parser = ["esp", "ah", "qesp"])]
        proto: Option<String>,
        /// Refuse unless the SA is of this direction.
        #[arg(long, value_parser = ["in", "out"])]
        dir: Option<String>,
        /// Refuse unless the SA belongs to this connection.
        #[arg(long, value_name = "NAME")]
        conn: Option<String>,
        #[command(flatten)]
        target: ControlArgs,
    },
}

fn parse_spi(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("'{s}' is not a 32-bit SPI (0x… or decimal)"))
}

/// Which daemon to ask.
#[derive(clap::Args)]
struct ControlArgs {
    /// Print the daemon's JSON document instead of a table.
    #[arg(long)]
    json: bool,
    /// Control socket of the daemon [default: /run/espgate/espgate.sock].
    #[arg(short, long, value_name = "PATH", conflicts_with = "config")]
    socket: Option<PathBuf>,
    /// Read the control socket path from this configuration file.
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(clap::Args)]
struct PcapArgs {
    /// SA as key=value pairs: spi=0x…,suite=aes128gcm16,enc=HEX[,integ=HEX][,mode=tunnel|transport]
    /// [,encap=udp|none][,src=IP,dst=IP][,esn=yes][,seq=N][,proto=esp|ah|qesp][,ipproto=N]
    /// [,window=N][,allow_insecure=yes]
    #[arg(long = "sa", required = true)]
    sa: Vec<String>,
    /// Input capture (pcap or pcapng; Ethernet, raw IP or Linux cooked).
    input: PathBuf,
    /// Output capture (pcap, raw IP link type).
    output: PathBuf,
    /// UDP port that carries ESP (RFC 3948).
    #[arg(long, default_value_t = 4500)]
    nat_t_port: u16,
    /// Do not print a line per failed packet.
    #[arg(long, short)]
    quiet: bool,
    /// Exit with status 1 if any packet failed.
    #[arg(long)]
    strict: bool,
}

#[derive(Subcommand)]
enum PcapCmd {
    /// Write the decrypted inner packets of every ESP/AH packet an SA matches.
    Decrypt {
        #[command(flatten)]
        args: PcapArgs,
        /// Also copy packets that are not IPsec to the output.
        #[arg(long)]
        passthrough: bool,
    },
    /// Turn clear IP packets into ESP/AH; several --sa form a bundle, applied in order.
    Encrypt {
        #[command(flatten)]
        args: PcapArgs,
    },
}

fn run_pcap(dir: PcapCmd) -> Result<ExitCode> {
    let (args, passthrough, decrypt) = match dir {
        PcapCmd::Decrypt { args, passthrough } => (args, passthrough, true),
        PcapCmd::Encrypt { args } => (args, false, false),
    };
    pcap_cmd::check_input(&args.input)?;
    let cfgs = pcap_cmd::parse_specs(&args.sa)?;
    let opt = pcap_cmd::Options {
        input: &args.input,
        output: &args.output,
        nat_t_port: args.nat_t_port,
        passthrough,
        quiet: args.quiet,
    };
    let mut err = std::io::stderr();
    let (sum, verb) = if decrypt {
        (pcap_cmd::decrypt(cfgs, &opt, &mut err)?, "decrypted")
    } else {
        (pcap_cmd::encrypt(cfgs, &opt, &mut err)?, "encrypted")
    };
    eprintln!("{}", sum.render(verb));
    Ok(if args.strict && sum.failures() > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn init_logging(level: config::LogLevel, verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => level.as_str(),
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// `espgate up`'s options.
struct UpOpts {
    config: PathBuf,
    verbose: u8,
    daemon: bool,
    pid_file: Option<PathBuf>,
    log_file: Option<PathBuf>,
    no_cluster_agent: bool,
}

/// `path` made absolute (a daemon moves to `/`).
fn absolute(path: &Path) -> std::io::Result<PathBuf> {
    std::path::absolute(path)
}

fn run_up(opts: UpOpts) -> ExitCode {
    use espgate_daemon::daemon::{self, Outcome, PidFile, Role};
    let path = if opts.daemon {
        match absolute(&opts.config) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("espgate: {}: {e}", opts.config.display());
                return ExitCode::from(2);
            }
        }
    } else {
        opts.config.clone()
    };
    let cfg = match config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!("espgate: the configuration has errors; the gateway did not start");
            return ExitCode::from(2);
        }
    };
    let pid_file = match &opts.pid_file {
        Some(p) => Some(p.clone()),
        None if opts.daemon => Some(daemon::default_pid_file(&cfg.gateway.control_socket)),
        None => None,
    };
    let pid_file = match pid_file.as_deref().map(absolute).transpose() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("espgate: pid file: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(p) = &pid_file {
        if let Err(e) = PidFile::check(p) {
            eprintln!("espgate: {e:#}");
            return ExitCode::from(1);
        }
    }
    let mut reporter = None;
    if opts.daemon {
        let log = opts
            .log_file
            .clone()
            .unwrap_or_else(|| daemon::default_log_file(&path));
        let log = match absolute(&log) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("espgate: log file {}: {e}", log.display());
                return ExitCode::from(1);
            }
        };
        match daemon::detach(&log) {
            Err(e) => {
                eprintln!("espgate: {e:#}");
                return ExitCode::from(1);
            }
            Ok(Role::Parent(Outcome::Ready { pid })) => {
                let pf = pid_file
                    .as_deref()
                    .map(|p| format!(", pid file {}", p.display()))
                    .unwrap_or_default();
                println!(
                    "espgate: running in the background, pid {pid}{pf}, log {}",
                    log.display()
                );
                return ExitCode::SUCCESS;
            }
            Ok(Role::Parent(Outcome::Failed { message })) => {
                eprintln!("espgate: {message}");
                eprintln!(
                    "espgate: the gateway did not start (log: {})",
                    log.display()
                );
                return ExitCode::from(1);
            }
            Ok(Role::Daemon(r)) => reporter = Some(r),
        }
    }
    init_logging(cfg.gateway.log, opts.verbose);
    let mut pid_guard = None;
    // With [cluster], this node's cluster agent runs in this process (the
    // one that stays with --daemon) from the moment the control socket
    // listens until the daemon has stopped.
    let cluster = cfg
        .cluster
        .clone()
        .filter(|_| !opts.no_cluster_agent)
        .map(|c| (c, cfg.gateway.control_socket.clone()));
    let agent = std::cell::RefCell::new(None);
    let result = {
        let mut on_ready = || -> Result<()> {
            if let Some(p) = &pid_file {
                pid_guard = Some(PidFile::create(p)?);
            }
            if let Some((c, socket)) = &cluster {
                // Started here, after the daemon blocked its stop signals,
                // so the agent's threads leave them to the daemon's signalfd.
                *agent.borrow_mut() = Some(espgate_cluster::Agent::start(c, socket.clone())?);
            }
            match daemon::sd_notify(&format!("READY=1\nMAINPID={}", std::process::id())) {
                Ok(_) => {}
                Err(e) => tracing::warn!("telling systemd we are up (NOTIFY_SOCKET): {e}"),
            }
            if let Some(r) = reporter.as_mut() {
                r.ready();
            }
            Ok(())
        };
        // Leave the cluster while the workers still forward: the agent
        // revokes its lease and returns once the plan no longer names
        // this node and the others have had a moment to take over its
        // share (bounded by the lease TTL).
        let mut on_stopping = || {
            if let Some(a) = agent.borrow_mut().take() {
                a.stop();
            }
        };
        espgate_daemon::run_hooked(cfg, &mut on_ready, &mut on_stopping)
    };
    if let Some(a) = agent.borrow_mut().take() {
        a.stop();
    }
    // Removed last: once it is gone, everything else is undone.
    drop(pid_guard);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match reporter.as_mut().filter(|r| r.pending()) {
                Some(r) => {
                    tracing::error!("{e:#}");
                    r.failed(&format!("{e:#}"));
                }
                None => eprintln!("espgate: {e:#}"),
            }
            ExitCode::from(1)
        }
    }
}

/// The control socket `target` names.
fn socket_path(target: &ControlArgs) -> Result<PathBuf, ExitCode> {
    Ok(match (&target.socket, &target.config) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) => match config::load(c) {
            Ok(cfg) => cfg.gateway.control_socket,
            Err(e) => {
                eprintln!("{e}");
                return Err(ExitCode::from(2));
            }
        },
        (None, None) => PathBuf::from(control::DEFAULT_SOCKET),
    })
}

/// Sends `req` to the daemon `target` names; a failure is printed.
fn ask(target: &ControlArgs, req: &Request) -> Result<Response, ExitCode> {
    let client = Client::new(socket_path(target)?, Duration::from_secs(10));
    client.call(req).map_err(|e| {
        eprintln!("espgate: {e}");
        ExitCode::from(1)
    })
}

/// A command that changes something (`sa add`, `sa del`, `costs`,
/// `initiate`, `terminate`): prints what changed (stdout) and warnings
/// (stderr).
fn run_change(target: &ControlArgs, req: &Request) -> ExitCode {
    let r = match ask(target, req) {
        Ok(r) => r,
        Err(c) => return c,
    };
    if target.json {
        println!("{}", r.to_pretty());
    }
    let Response::Changed(c) = r else {
        eprintln!("espgate: the daemon's answer is not what was asked; is it another version?");
        return ExitCode::from(1);
    };
    if !target.json {
        println!("{}", c.message);
    }
    for w in &c.warnings {
        eprintln!("espgate: warning: {w}");
    }
    ExitCode::SUCCESS
}

fn run_sa_add(conn: String, dir: String, spec: String, target: &ControlArgs) -> ExitCode {
    let spec = zeroize::Zeroizing::new(if spec == "-" {
        let mut line = String::new();
        if let Err(e) = std::io::stdin().read_line(&mut line) {
            eprintln!("espgate: reading the SA spec from standard input: {e}");
            return ExitCode::from(1);
        }
        let s = line.trim().to_string();
        zeroize::Zeroize::zeroize(&mut line);
        s
    } else {
        spec
    });
    if spec.is_empty() {
        eprintln!("espgate: the SA spec is empty");
        return ExitCode::from(1);
    }
    let req = Request::SaAdd {
        conn,
        dir: if dir == "out" { SaDir::Out } else { SaDir::In },
        spec: control::SecretSpec::new(spec.to_string()),
    };
    run_change(target, &req)
}

fn run_wireshark_keys(tshark: bool, target: &ControlArgs) -> ExitCode {
    let r = match ask(target, &Request::WiresharkKeys) {
        Ok(r) => r,
        Err(c) => return c,
    };
    if target.json {
        println!("{}", r.to_pretty());
        return ExitCode::SUCCESS;
    }
    let Response::Keys(keys) = r else {
        eprintln!("espgate: the daemon's answer is not what was asked; is it another version?");
        return ExitCode::from(1);
    };
    if tshark {
        let (args, notes) = wireshark::tshark_args(&keys);
        for n in notes {
            eprintln!("espgate: {n}");
        }
        let line: Vec<String> = args.iter().map(|a| wireshark::shell_quote(a)).collect();
        println!("{}", line.join(" "));
    } else {
        let source = socket_path(target).map_or_else(|_| "?".into(), |p| p.display().to_string());
        print!("{}", wireshark::render_file(&keys, &source));
    }
    ExitCode::SUCCESS
}

/// The status document of the daemon `target` names.
fn ask_status(target: &ControlArgs) -> Result<status::Status, ExitCode> {
    match ask(target, &Request::Status)? {
        Response::Status(s) => Ok(*s),
        _ => {
            eprintln!(
                "espgate: the daemon's answer is not a status document; is it another version?"
            );
            Err(ExitCode::from(1))
        }
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> ExitCode {
    match serde_json::to_string_pretty(v) {
        Ok(t) => {
            println!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("espgate: encoding the answer: {e}");
            ExitCode::from(1)
        }
    }
}

/// `espgate status`: the document as JSON or rendered.
fn run_status(target: &ControlArgs) -> ExitCode {
    let s = match ask_status(target) {
        Ok(s) => s,
        Err(c) => return c,
    };
    if target.json {
        return print_json(&s);
    }
    print!("{}", status::render_status(&s));
    ExitCode::SUCCESS
}

/// `espgate sa list`.
fn run_sa_list(target: &ControlArgs) -> ExitCode {
    let sas = match ask(target, &Request::SaList) {
        Ok(Response::Sas(s)) => s,
        Ok(_) => {
            eprintln!("espgate: the daemon's answer is not an SA list; is it another version?");
            return ExitCode::from(1);
        }
        Err(c) => return c,
    };
    if target.json {
        #[derive(serde::Serialize)]
        struct Sas<'a> {
            sas: &'a [status::SaStatus],
        }
        return print_json(&Sas { sas: &sas });
    }
    print!("{}", status::render_sa_list(&sas));
    ExitCode::SUCCESS
}

/// `espgate status --ike-costs`: the IKE part's per-operation costs.
fn run_ike_costs_query(target: &ControlArgs) -> ExitCode {
    let s = match ask_status(target) {
        Ok(s) => s,
        Err(c) => return c,
    };
    let Some(ike) = s.ike else {
        if target.json {
            println!("{}", serde_json::json!({"ike": false}));
        } else {
            println!("no connection of this gateway uses IKE");
        }
        return ExitCode::SUCCESS;
    };
    if target.json {
        #[derive(serde::Serialize)]
        struct PerSa<'a> {
            connection: &'a str,
            spis: &'a str,
            costs: &'a [espgate_api::ike::IkeOpCost],
        }
        #[derive(serde::Serialize)]
        struct Out<'a> {
            ike: bool,
            costs: &'a [espgate_api::ike::IkeOpCost],
            per_sa: Vec<PerSa<'a>>,
        }
        return print_json(&Out {
            ike: true,
            costs: &ike.costs,
            per_sa: ike
                .sas
                .iter()
                .map(|sa| PerSa {
                    connection: &sa.connection,
                    spis: &sa.spis,
                    costs: &sa.costs,
                })
                .collect(),
        });
    }
    print!("{}", espgate_api::ike::render_costs(&ike));
    ExitCode::SUCCESS
}

/// `espgate status --costs`: the status document's per-stage costs.
fn run_costs_query(target: &ControlArgs) -> ExitCode {
    let s = match ask_status(target) {
        Ok(s) => s,
        Err(c) => return c,
    };
    match (s.costs, target.json) {
        (None, true) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({"cost_accounting": false}))
                    .unwrap_or_default()
            );
        }
        (None, false) => println!(
            "cost accounting is off: `espgate costs on` (or gateway.cost_accounting = true) \
             starts it"
        ),
        (Some(c), true) => {
            #[derive(serde::Serialize)]
            struct Out<'a> {
                cost_accounting: bool,
                costs: &'a espgate_api::costs::CostsReport,
            }
            return print_json(&Out {
                cost_accounting: true,
                costs: &c,
            });
        }
        (Some(c), false) => print!("{}", espgate_api::costs::render(&c)),
    }
    ExitCode::SUCCESS
}

fn run_demo(short: bool, prefix: Option<String>) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("espgate demo: cannot find my own binary: {e}");
            return ExitCode::from(1);
        }
    };
    let opts = espgate_lab::demo::Options { short, prefix, exe };
    match espgate_lab::demo::run_demo(&opts) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) if e.to_string() == "interrupted" => {
            eprintln!("espgate demo: interrupted; everything it made is removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("espgate demo: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run_keygen(kind: &str, out: PathBuf, public: Option<PathBuf>, force: bool) -> Result<ExitCode> {
    let opts = espgate_config::keygen::Options {
        kind: kind.parse().map_err(anyhow::Error::msg)?,
        out,
        public,
        force,
    };
    for line in espgate_config::keygen::run(&opts)? {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Pcap { dir } => run_pcap(dir),
        Cmd::Suites => {
            for s in espgate_core::crypto::Suite::all() {
                let note = if s.check_policy(false).is_err() {
                    "  (legacy: needs allow_insecure=yes)"
                } else {
                    ""
                };
                println!("{}{note}", s.name());
            }
            println!("AH: sha1 sha256 sha384 sha512 aesxcbc md5");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Up {
            config,
            verbose,
            daemon,
            pid_file,
            log_file,
            no_cluster_agent,
        } => Ok(run_up(UpOpts {
            config,
            verbose,
            daemon,
            pid_file,
            log_file,
            no_cluster_agent,
        })),
        Cmd::Config {
            cmd: ConfigCmd::Check { config, json },
        } => Ok(run_config_check(&config, json)),
        Cmd::Cluster { cmd } => Ok(match cmd {
            ClusterCmd::Status { config, json } => run_cluster_status(&config, json),
            ClusterCmd::Agent { config, verbose } => run_cluster_agent(&config, verbose),
        }),
        Cmd::Status {
            ike_costs: true,
            target,
            ..
        } => Ok(run_ike_costs_query(&target)),
        Cmd::Status {
            costs: false,
            target,
            ..
        } => Ok(run_status(&target)),
        Cmd::Status {
            costs: true,
            target,
            ..
        } => Ok(run_costs_query(&target)),
        Cmd::Costs { action, target } => {
            let action = match action.as_str() {
                "on" => CostsAction::On,
                "off" => CostsAction::Off,
                _ => CostsAction::Reset,
            };
            Ok(run_change(&target, &Request::Costs { action }))
        }
        Cmd::Sa { cmd } => Ok(match cmd {
            SaCmd::List { target } => run_sa_list(&target),
            SaCmd::Add {
                conn,
                dir,
                spec,
                target,
            } => run_sa_add(conn, dir, spec, &target),
            SaCmd::Del {
                spi,
                proto,
                dir,
                conn,
                target,
            } => run_change(
                &target,
                &Request::SaDel {
                    spi,
                    proto: proto.map(|p| match p.as_str() {
                        "ah" => Proto::Ah,
                        "qesp" => Proto::Qesp,
                        _ => Proto::Esp,
                    }),
                    dir: dir.map(|d| if d == "out" { SaDir::Out } else { SaDir::In }),
                    conn,
                },
            ),
        }),
        Cmd::WiresharkKeys { tshark, target } => Ok(run_wireshark_keys(tshark, &target)),
        Cmd::Initiate { name, target } => {
            Ok(run_change(&target, &Request::Initiate { conn: name }))
        }
        Cmd::Terminate { name, target } => {
            Ok(run_change(&target, &Request::Terminate { conn: name }))
        }
        Cmd::Keygen {
            kind,
            out,
            public,
            force,
        } => run_keygen(&kind, out, public, force),
        Cmd::Demo { short, prefix } => Ok(run_demo(short, prefix)),
        Cmd::Bench { what } => run_bench(what),
        Cmd::Lab { what } => espgate_lab::lab::cli::main(&what),
    };
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("espgate: {e:#}");
            ExitCode::from(2)
        }
    }
}
