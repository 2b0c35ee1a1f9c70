//! espgate-lab: the measurement side of espgate, run against real
//! gateways in network namespaces and against the protocol core in memory.
//!
//! - [`netlab`]: namespaces, veth links, processes, iperf3 runs;
//! - [`demo`]: `espgate demo`, two sites through two gateways;
//! - [`mod@bench`]: `espgate bench crypto|esp|tunnel|parallel|ike`;
//! - [`lab`]: `espgate lab list|run|report`, the seed papers' experiments;
//! - [`pcap`] and [`capture`]: `espgate pcap encrypt|decrypt` over capture
//!   files.
//!
//! It talks to gateways only through [`espgate_api`] and configuration
//! files, never through the daemon's internals.

pub mod bench;
pub mod capture;
pub mod demo;
pub mod lab;
pub mod netlab;
pub mod pcap;

/// espgate's version, with the git commit of the source tree when the
/// binary runs from one.
pub fn version() -> String {
    let v = env!("CARGO_PKG_VERSION");
    let commit = std::process::Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short",
            "HEAD",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match commit {
        Some(c) if !c.is_empty() => format!("{v} ({c})"),
        _ => v.to_string(),
    }
}
