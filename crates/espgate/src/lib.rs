//! espgate: the I/O shell and command line around `espgate-core`.
//!
//! Today this crate holds the packet-capture tools (`espgate pcap`); the
//! gateway daemon, benchmarks and the lab will live here too, each in its
//! own module, depending on the core and never the other way round.

pub mod capture;
pub mod config;
pub mod netdev;
pub mod pcap_cmd;
