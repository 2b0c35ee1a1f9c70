//! espgate-core: the sans-IO IPsec protocol core.
//!
//! Nothing here opens a socket, reads a clock or spawns a thread. Functions
//! take packet bytes (and the current time as a value) and return packet
//! bytes, verdicts and events. See `docs/ARCHITECTURE.md`.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cost;
pub mod crypto;
pub mod error;
pub mod gateway;
pub mod mss;
pub mod offload;
pub mod wire;

pub use error::{DropReason, PResult};
pub mod buf;
pub mod cluster;
pub mod sa;
pub mod sad;
pub mod selector;
pub mod spd;
pub mod stats;

pub use buf::PacketBuf;
pub use sa::{Sa, SaConfig};
