//! Per-stage cost accounting hooks (seed 004's per-operation timing of ESP
//! processing), without a clock.
//!
//! The core reads no clock. Its packet paths take a [`Probe`] and call
//! [`Probe::mark`] when a stage ends; the shell's probe reads a clock at
//! each mark and charges the time since the previous one to that stage.
//! The plain entry points ([`crate::Sa::encapsulate`],
//! [`crate::sad::Sad::decapsulate_into`], …) pass [`NoProbe`], whose `mark`
//! is an empty inline function: with accounting off the probed code is the
//! unprobed code, monomorphised away.
//!
//! What the core marks, in order (a stage may be marked more than once per
//! packet; its time adds up):
//!
//! - outbound: [`Stage::Replay`] (sequence number taken), [`Stage::Encap`]
//!   (ESP header, IV, padding, trailer), [`Stage::Cipher`] then
//!   [`Stage::Integrity`] (CBC/CTR + HMAC; an AEAD or GMAC suite marks
//!   only `Cipher`, its one operation), [`Stage::Encap`] again (outer
//!   header, UDP header, counters). AH marks `Encap` (header) and
//!   `Integrity` (ICV).
//! - inbound: [`Stage::Lookup`] (classification and SAD lookup by SPI, per
//!   layer), [`Stage::Replay`] (window check), [`Stage::Integrity`] then
//!   [`Stage::Cipher`] (ICV checked before decryption; AEAD: `Cipher` only),
//!   [`Stage::Replay`] again (window update), [`Stage::Decap`] (trailer,
//!   inner packet, selectors, counters).
//!
//! A packet that fails stops at the stage that refused it: that stage is
//! marked, later ones are not (a replay is marked `Replay`, an ICV
//! failure `Integrity`, or `Cipher` for AEAD). [`Stage::Receive`],
//! [`Stage::Send`] and the outbound [`Stage::Lookup`] (policy) are the
//! caller's: the core has no I/O and no SPD lookup on its packet paths.

/// A step of ESP packet processing whose time is accounted separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Reading the packet (TUN read, socket receive; a buffer copy in
    /// `bench`). Marked by the caller.
    Receive,
    /// Outbound: flow parsing and the SPD lookup (the caller's); inbound:
    /// classification and the SAD lookup by SPI (the core's), then the
    /// inbound policy check (the caller's).
    Lookup,
    /// Outbound: taking the sequence number; inbound: the anti-replay
    /// window check and, after authentication, its update.
    Replay,
    /// Encryption or decryption; for AEAD and GMAC suites also their
    /// authentication (one operation, so `Integrity` stays 0).
    Cipher,
    /// The ICV of non-combined suites (HMAC, XCBC) and of AH.
    Integrity,
    /// Outbound framing: ESP/AH header, IV, padding, trailer, outer IP and
    /// UDP headers.
    Encap,
    /// Inbound unframing: trailer and padding, the inner packet restored,
    /// selector checks.
    Decap,
    /// Sending the packet (socket send, TUN write). Marked by the caller.
    Send,
}

impl Stage {
    /// Every stage, in processing order (outbound framing before inbound).
    pub const ALL: [Stage; 8] = [
        Stage::Receive,
        Stage::Lookup,
        Stage::Replay,
        Stage::Cipher,
        Stage::Integrity,
        Stage::Encap,
        Stage::Decap,
        Stage::Send,
    ];

    /// Number of stages.
    pub const COUNT: usize = Stage::ALL.len();

    /// The stages an outbound packet goes through, in order of first use.
    pub const OUTBOUND: [Stage; 7] = [
        Stage::Receive,
        Stage::Lookup,
        Stage::Replay,
        Stage::Encap,
        Stage::Cipher,
        Stage::Integrity,
        Stage::Send,
    ];

    /// The stages an inbound packet goes through, in order of first use.
    pub const INBOUND: [Stage; 7] = [
        Stage::Receive,
        Stage::Lookup,
        Stage::Replay,
        Stage::Integrity,
        Stage::Cipher,
        Stage::Decap,
        Stage::Send,
    ];

    /// Index into arrays of [`Stage::COUNT`] entries.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Lower-case name (`receive`, `lookup`, …), used as a JSON key and a
    /// metrics label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Receive => "receive",
            Stage::Lookup => "lookup",
            Stage::Replay => "replay",
            Stage::Cipher => "cipher",
            Stage::Integrity => "integrity",
            Stage::Encap => "encap",
            Stage::Decap => "decap",
            Stage::Send => "send",
        }
    }

    /// The stage called `name` ([`Stage::as_str`]).
    pub fn from_name(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// Which way a packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Clear packet in, ESP out.
    Outbound,
    /// ESP in, clear packet out.
    Inbound,
}

impl Dir {
    /// Both directions.
    pub const ALL: [Dir; 2] = [Dir::Outbound, Dir::Inbound];

    /// 0 for outbound, 1 for inbound (an array index).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// `outbound` or `inbound`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dir::Outbound => "outbound",
            Dir::Inbound => "inbound",
        }
    }

    /// The stages of this direction, in processing order.
    pub const fn stages(self) -> &'static [Stage] {
        match self {
            Dir::Outbound => &Stage::OUTBOUND,
            Dir::Inbound => &Stage::INBOUND,
        }
    }
}

/// Receives stage boundaries from the packet paths.
pub trait Probe {
    /// `stage` has just ended: the time since the previous mark (or since
    /// the caller started the packet) belongs to it.
    fn mark(&mut self, stage: Stage);

    /// Whether marks are wanted at all. A path may take a faster way that
    /// marks nothing when they are not ([`NoProbe`]).
    #[inline(always)]
    fn active(&self) -> bool {
        true
    }
}

/// The probe of the unprobed entry points: does nothing, compiled away.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProbe;

impl Probe for NoProbe {
    #[inline(always)]
    fn mark(&mut self, _: Stage) {}

    #[inline(always)]
    fn active(&self) -> bool {
        false
    }
}

impl<P: Probe + ?Sized> Probe for &mut P {
    #[inline(always)]
    fn mark(&mut self, stage: Stage) {
        (**self).mark(stage);
    }

    #[inline(always)]
    fn active(&self) -> bool {
        (**self).active()
    }
}

#[cfg(test)]
mod tests;
