//! Why the engine dropped a packet, with what the log line needs to say
//! so — kept as plain copyable values, formatted only if a line is written
//! (the rate limiter lets one through per second): a flood of bad packets
//! costs a counter increment each, never an allocation.

use super::Engine;
use crate::error::DropReason;
use crate::sa::Protocol;
use crate::sad::MAX_LAYERS;
use std::fmt;
use std::net::IpAddr;

/// A dropped packet: the reason (the counter key) and its context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// Why.
    pub reason: DropReason,
    /// About which packet.
    pub context: DropContext,
    /// The engine left a message for the packet's sender in the buffer
    /// (ICMP "too big"): the shell writes it to the TUN.
    pub reply: bool,
}

/// What a drop's log line says about the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropContext {
    /// A packet from the TUN that does not parse.
    TunUnparsable,
    /// A packet from the TUN that no connection's selectors match.
    NoPolicy {
        /// Inner source.
        src: IpAddr,
        /// Inner destination.
        dst: IpAddr,
        /// Inner protocol.
        proto: u8,
    },
    /// The matching policy is not PROTECT.
    NotProtect,
    /// A connection without a complete outbound bundle.
    NoSa {
        /// Connection index.
        conn: usize,
        /// Inner source.
        src: IpAddr,
        /// Inner destination.
        dst: IpAddr,
        /// The packet is outside every selector set the peer agreed to
        /// (it narrowed the connection's selectors), though inside the
        /// configured ones.
        narrowed: bool,
    },
    /// Outbound processing on a connection failed.
    Outbound {
        /// Connection index.
        conn: usize,
        /// Inner source.
        src: IpAddr,
        /// Inner destination.
        dst: IpAddr,
    },
    /// Inbound: the layers removed are not one connection's inbound
    /// bundle.
    PolicyMismatch {
        /// The sender.
        from: IpAddr,
        /// The layers removed, outermost first (`n` of them).
        layers: [(Protocol, u32); MAX_LAYERS],
        /// How many of `layers` are used.
        n: u8,
    },
    /// Inbound processing failed.
    Inbound {
        /// The sender.
        from: IpAddr,
        /// The SPI, when the header could be read.
        spi: Option<u32>,
        /// The connection of the SA, when one was found.
        conn: Option<usize>,
    },
}

impl Dropped {
    pub(super) fn new(reason: DropReason, context: DropContext) -> Dropped {
        Dropped {
            reason,
            context,
            reply: false,
        }
    }
}

/// A drop's log line; see [`Engine::describe`].
pub struct Describe<'a> {
    pub(super) engine: &'a Engine,
    pub(super) dropped: &'a Dropped,
}

impl fmt::Display for Describe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.engine;
        let name = |c: usize| e.conns.get(c).map_or("?", |c| c.spec.name.as_str());
        match self.dropped.context {
            DropContext::TunUnparsable => f.write_str("unparsable packet from the TUN"),
            DropContext::NoPolicy { src, dst, proto } => write!(
                f,
                "{src} -> {dst} (protocol {proto}) from the TUN matches no connection's selectors"
            ),
            DropContext::NotProtect => f.write_str("the policy is not PROTECT"),
            DropContext::NoSa {
                conn,
                src,
                dst,
                narrowed: true,
            } => write!(
                f,
                "{src} -> {dst} on connection \"{}\": outside the traffic selectors the peer \
                 agreed to (it narrowed ours, or a selector set has no child SA; `espgate \
                 status` shows each child SA's, `espgate initiate` asks again for a set without \
                 one)",
                name(conn)
            ),
            DropContext::NoSa { conn, src, dst, .. } => {
                let c = name(conn);
                write!(f, "{src} -> {dst} on connection \"{c}\": no outbound ")?;
                let mut first = true;
                for p in e.missing_layers(conn) {
                    if !first {
                        f.write_str("+")?;
                    }
                    first = false;
                    f.write_str(&p.name().to_uppercase())?;
                }
                write!(
                    f,
                    " SA (not negotiated yet, or removed by `espgate sa del`; `espgate sa add \
                     --conn {c} --dir out` installs one)"
                )
            }
            DropContext::Outbound { conn, src, dst } => {
                write!(
                    f,
                    "outbound {src} -> {dst} on connection \"{}\"",
                    name(conn)
                )
            }
            DropContext::PolicyMismatch { from, layers, n } => {
                write!(f, "packet from {from} came through ")?;
                for (i, (p, spi)) in layers.iter().take(usize::from(n)).enumerate() {
                    if i > 0 {
                        f.write_str(" + ")?;
                    }
                    write!(f, "{} {spi:#010x}", p.name().to_uppercase())?;
                }
                f.write_str(" but not its connection's whole inbound bundle")
            }
            DropContext::Inbound { from, spi, conn } => {
                write!(f, "inbound from {from}")?;
                if let Some(s) = spi {
                    write!(f, " SPI {s:#010x}")?;
                }
                if let Some(c) = conn {
                    write!(f, " (connection \"{}\")", name(c))?;
                }
                Ok(())
            }
        }
    }
}
