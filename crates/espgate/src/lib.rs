//! espgate: the I/O shell and command line around `espgate-core`.
//!
//! It holds the gateway daemon (`espgate up`, [`gateway`]), its
//! configuration ([`config`], with the IKE part in [`ikeconf`]) and network
//! plumbing ([`netdev`]), key generation (`espgate keygen`, [`keygen`]), and
//! the packet-capture tools (`espgate pcap`); benchmarks and the lab will live
//! here too, each in its own module, depending on the core and never the
//! other way round.

pub mod alloc_count;
pub mod bench;
pub mod capture;
pub mod config;
pub mod costs;
pub mod demo;
pub mod gateway;
pub mod ikeconf;
pub mod keygen;
pub mod netdev;
pub mod netlab;
pub mod pcap_cmd;
