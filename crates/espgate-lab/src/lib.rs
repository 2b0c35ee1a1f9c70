//! espgate-lab: the measurement side of espgate, run against real
//! gateways in network namespaces and against the protocol core in memory.
//!
//! - [`netlab`]: namespaces, veth links, processes, iperf3 runs;
//! - [`demo`]: `espgate demo`, two sites through two gateways;
//! - [`bench`]: `espgate bench crypto|esp|tunnel|parallel|ike`;
//! - [`pcap`] and [`capture`]: `espgate pcap encrypt|decrypt` over capture
//!   files.
//!
//! It talks to gateways only through [`espgate_api`] and configuration
//! files, never through the daemon's internals.

pub mod bench;
pub mod capture;
pub mod demo;
pub mod netlab;
pub mod pcap;
