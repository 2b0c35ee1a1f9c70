//! IKEv2 (RFC 7296) building blocks.
//!
//! Only the message codec lives here so far: [`wire`] parses a datagram into
//! a typed [`wire::Message`] and emits one back, with every length checked.
//! There is no state machine and no cryptography yet: the Encrypted (SK) and
//! Encrypted Fragment (SKF, RFC 7383) payloads are carried as raw bytes, and
//! once decrypted their inner chain is parsed with
//! [`wire::parse_payload_chain`]. Like the rest of the core, nothing here
//! does I/O; unlike the ESP data path, the IKE codec allocates (IKE is not
//! the packet hot path).

pub mod wire;
