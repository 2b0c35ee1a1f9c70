//! IKEv2 (RFC 7296), sans-IO.
//!
//! - [`wire`]: parses a datagram into a typed [`wire::Message`] and emits
//!   one back, with every length checked.
//! - [`proposal`]: strongSwan proposal strings, SA payload proposals and
//!   the responder's choice; [`ts`]: traffic selectors and narrowing.
//! - [`dh`], [`keys`], [`sk`], [`sig`], [`cert`]: key exchange groups, the
//!   PRF and key derivation, the Encrypted payload, signatures, X.509.
//! - [`rng`]: the randomness every SPI, nonce and key is drawn from.
//! - [`engine`]: the state machine ([`engine::Ike`]), configured with
//!   [`config::IkeConfig`]: datagrams and time in, datagrams and events out.
//!
//! Like the rest of the core, nothing here does I/O; unlike the ESP data
//! path, IKE allocates (it is not the packet hot path).

pub mod cert;
pub mod config;
pub mod dh;
pub mod engine;
pub mod keys;
pub mod proposal;
pub mod rng;
pub mod sig;
pub mod sk;
pub mod ts;
pub mod wire;
