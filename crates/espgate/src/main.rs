//! The `espgate` command.

use anyhow::Result;
use clap::{Parser, Subcommand};
use espgate::gateway::{control, status};
use espgate::{config, pcap_cmd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

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
    /// Run the gateway in the foreground (static SAs from the config file).
    ///
    /// Stops cleanly on SIGINT, SIGTERM or SIGHUP: the TUN device, routes,
    /// rules and the control socket are removed. Not built yet: --daemon,
    /// several data-plane threads, the metrics endpoint, IKE.
    Up {
        /// Configuration file (docs/CONFIG.md).
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
        /// More log output (-v debug, -vv trace); RUST_LOG overrides both
        /// this and gateway.log.
        #[arg(short, long, action = clap::ArgAction::Count)]
        verbose: u8,
    },
    /// Show the running gateway: TUN, connections, SAs, counters, drops.
    Status {
        #[command(flatten)]
        target: ControlArgs,
    },
    /// Manually keyed SAs of the running gateway.
    Sa {
        #[command(subcommand)]
        cmd: SaCmd,
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
    /// Benchmarks (not built yet; use `cargo bench -p espgate-core` today).
    Bench,
    /// Reproduce the seed papers' experiments (not built yet).
    Lab,
}

#[derive(Subcommand)]
enum SaCmd {
    /// One line per SA: SPI, suite, counters, sequence numbers, lifetime.
    /// (`sa add` / `sa del` are not built yet.)
    List {
        #[command(flatten)]
        target: ControlArgs,
    },
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
    /// [,encap=udp|none][,src=IP,dst=IP][,esn=yes][,seq=N][,proto=esp|ah][,window=N][,allow_insecure=yes]
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

fn run_up(path: &Path, verbose: u8) -> ExitCode {
    let cfg = match config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            eprintln!("espgate: the configuration has errors; the gateway did not start");
            return ExitCode::from(2);
        }
    };
    init_logging(cfg.gateway.log, verbose);
    match espgate::gateway::run(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("espgate: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Asks the daemon; prints the JSON document or renders it.
fn run_query(target: &ControlArgs, cmd: &str) -> ExitCode {
    let path = match (&target.socket, &target.config) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) => match config::load(c) {
            Ok(cfg) => cfg.gateway.control_socket,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        },
        (None, None) => PathBuf::from("/run/espgate/espgate.sock"),
    };
    let v = match control::request(&path, cmd, Duration::from_secs(10)) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("espgate: {e}");
            return ExitCode::from(1);
        }
    };
    let key = if cmd == "status" { "status" } else { "sas" };
    let doc = &v[key];
    if target.json {
        let out = if cmd == "status" {
            doc.clone()
        } else {
            serde_json::json!({ "sas": doc })
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&out).unwrap_or_else(|_| out.to_string())
        );
        return ExitCode::SUCCESS;
    }
    let text = if cmd == "status" {
        serde_json::from_value::<status::Status>(doc.clone()).map(|s| status::render_status(&s))
    } else {
        serde_json::from_value::<Vec<status::SaStatus>>(doc.clone())
            .map(|s| status::render_sa_list(&s))
    };
    match text {
        Ok(t) => {
            print!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "espgate: the daemon's answer does not parse ({e}); is it another version? \
                 --json shows it as is"
            );
            ExitCode::from(1)
        }
    }
}

fn run_demo(short: bool, prefix: Option<String>) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("espgate demo: cannot find my own binary: {e}");
            return ExitCode::from(1);
        }
    };
    let opts = espgate::demo::Options { short, prefix, exe };
    match espgate::demo::run_demo(&opts) {
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

fn not_built(what: &str, issue: u32) -> ExitCode {
    eprintln!(
        "espgate {what} is not built yet (tracked in issue {issue}). \
         Available today: espgate up, status, sa list, demo, pcap encrypt|decrypt, suites."
    );
    ExitCode::from(2)
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
        Cmd::Up { config, verbose } => Ok(run_up(&config, verbose)),
        Cmd::Status { target } => Ok(run_query(&target, "status")),
        Cmd::Sa {
            cmd: SaCmd::List { target },
        } => Ok(run_query(&target, "sa_list")),
        Cmd::Demo { short, prefix } => Ok(run_demo(short, prefix)),
        Cmd::Bench => Ok(not_built("bench", 4)),
        Cmd::Lab => Ok(not_built("lab", 4)),
    };
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("espgate: {e:#}");
            ExitCode::from(2)
        }
    }
}
