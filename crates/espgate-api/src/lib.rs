//! espgate-api: how programs talk to a running espgate gateway.
//!
//! - [`control`]: the control-socket protocol (requests, answers) and a
//!   blocking client;
//! - [`status`]: the status document (`espgate status`, `sa list`) and its
//!   text rendering; [`ike`]: its IKE part; [`costs`]: per-stage cost
//!   accounting and its report; [`wireshark`]: SA keys for Wireshark;
//! - [`table`]: the text tables every command prints.
//!
//! The command line, the lab and the cluster agent use only this crate to
//! talk to a gateway; the daemon answers with the same types.

#![warn(missing_docs)]

pub mod cluster;
pub mod control;
pub mod costs;
pub mod ike;
pub mod status;
pub mod table;
pub mod wireshark;
