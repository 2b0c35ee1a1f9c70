//! The `espgate` command.

use anyhow::Result;
use clap::{Parser, Subcommand};
use espgate::pcap_cmd;
use std::path::PathBuf;
use std::process::ExitCode;

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
    /// Run the gateway (not built yet).
    Up,
    /// Two-site demo in network namespaces (not built yet).
    Demo,
    /// Benchmarks (not built yet; use `cargo bench -p espgate-core` today).
    Bench,
    /// Reproduce the seed papers' experiments (not built yet).
    Lab,
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

fn not_built(what: &str, issue: u32) -> ExitCode {
    eprintln!(
        "espgate {what} is not built yet (tracked in issue {issue}). \
         Available today: espgate pcap encrypt|decrypt, espgate suites."
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
        Cmd::Up => Ok(not_built("up", 3)),
        Cmd::Demo => Ok(not_built("demo", 3)),
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
