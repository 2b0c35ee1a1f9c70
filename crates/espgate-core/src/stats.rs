//! Counters that the data plane writes and anyone reads, without a lock.
//!
//! Each data-plane worker owns its counters: it is their only writer, so an
//! increment is a relaxed load and store (no locked instruction on the
//! packet path). Readers — `espgate status`, the metrics endpoint — load
//! them from another thread at any time and never stop the worker, as VPP
//! reads its statistics segment out of band. A counter written from two
//! threads at once could lose increments; the types here are only handed
//! to one writer (a worker's engine, an SA in one worker's SAD).
//!
//! [`WorkerCounters`] are a worker's packet counters; [`SaCounters`] are
//! one SA's, published by the SA as it processes packets.

use crate::error::DropReason;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

/// A 64-bit counter with one writer and any number of readers.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n` (the writer only).
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    /// Adds one (the writer only).
    #[inline]
    pub fn incr(&self) {
        self.add(1);
    }

    /// Sets the value (the writer only): for gauges such as a sequence
    /// number.
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }

    /// The current value (any thread).
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Drops by reason, indexed by [`DropReason::index`].
#[derive(Debug)]
pub struct DropCounters([Counter; DropReason::COUNT]);

impl Default for DropCounters {
    fn default() -> DropCounters {
        DropCounters(std::array::from_fn(|_| Counter::default()))
    }
}

impl DropCounters {
    /// Counts one drop (the writer only).
    #[inline]
    pub fn count(&self, d: DropReason) {
        self.0[d.index()].incr();
    }

    /// Drops for `d`.
    pub fn get(&self, d: DropReason) -> u64 {
        self.0[d.index()].get()
    }

    /// Every reason with its count, zeros included, in [`DropReason::ALL`]
    /// order.
    pub fn all(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL.iter().map(|d| (*d, self.get(*d)))
    }
}

/// The packet counters of one data-plane worker.
#[derive(Debug, Default)]
pub struct WorkerCounters {
    /// Packets read from the TUN.
    pub tun_rx: Counter,
    /// Packets written to the TUN.
    pub tun_tx: Counter,
    /// Outer packets received (UDP datagrams and raw ESP/AH).
    pub net_rx: Counter,
    /// Outer packets sent.
    pub net_tx: Counter,
    /// RFC 3948 NAT keepalives received and ignored.
    pub keepalives: Counter,
    /// IKE messages received behind the non-ESP marker (handed to the IKE
    /// engine, or ignored when no connection uses IKE).
    pub ike: Counter,
    /// ESP dummy packets (next header 59) discarded.
    pub dummies: Counter,
    /// Multicast, broadcast and link-local packets from the TUN, which no
    /// SA carries; not logged.
    pub not_unicast: Counter,
    /// TCP SYNs whose MSS option was lowered (`mss_clamp`).
    pub mss_clamped: Counter,
    /// ICMP "too big" messages written to the TUN for clear packets above
    /// the tunnel's path MTU (each also a `path_mtu_exceeded` drop).
    pub icmp_too_big: Counter,
    /// RFC 3948 NAT keepalives sent.
    pub keepalives_sent: Counter,
    /// `UDP_SEGMENT` sends (each carried several datagrams).
    pub gso_sends: Counter,
    /// `sendmmsg` calls that sent several raw ESP/AH packets (raw IP has
    /// no GSO).
    pub raw_batch_sends: Counter,
    /// `sendmmsg` calls that sent several ESP-in-UDP messages (GSO runs or
    /// datagrams) at once: runs to several peers, or cut by a TOS change.
    pub udp_batch_sends: Counter,
    /// UDP reads that returned several datagrams coalesced by `UDP_GRO`.
    pub gro_reads: Counter,
    /// TUN reads that returned a TCP/UDP super-segment, cut before
    /// encryption.
    pub tso_reads: Counter,
    /// TUN writes of a super-segment coalesced from several decrypted TCP
    /// segments of one flow.
    pub tun_gso_writes: Counter,
    /// Batches sent, or coalesced packets written to the TUN, before the
    /// round ended because their first packet had waited the worker's
    /// hold time (a slow cipher such as 3DES, or a worker that lost its CPU
    /// in the middle of a round).
    pub hold_flushes: Counter,
    /// Drops by reason, both directions.
    pub drops: DropCounters,
}

impl WorkerCounters {
    /// Every counter but the drops, by its name in `espgate status`.
    pub fn named(&self) -> [(&'static str, u64); 18] {
        [
            ("tun_rx", self.tun_rx.get()),
            ("tun_tx", self.tun_tx.get()),
            ("net_rx", self.net_rx.get()),
            ("net_tx", self.net_tx.get()),
            ("keepalives", self.keepalives.get()),
            ("ike", self.ike.get()),
            ("dummies", self.dummies.get()),
            ("not_unicast", self.not_unicast.get()),
            ("mss_clamped", self.mss_clamped.get()),
            ("icmp_too_big", self.icmp_too_big.get()),
            ("keepalives_sent", self.keepalives_sent.get()),
            ("gso_sends", self.gso_sends.get()),
            ("raw_batch_sends", self.raw_batch_sends.get()),
            ("udp_batch_sends", self.udp_batch_sends.get()),
            ("gro_reads", self.gro_reads.get()),
            ("tso_reads", self.tso_reads.get()),
            ("tun_gso_writes", self.tun_gso_writes.get()),
            ("hold_flushes", self.hold_flushes.get()),
        ]
    }
}

/// Where an SA stands against its lifetime limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifeState {
    /// No limit reached.
    Ok,
    /// A soft limit reached: a replacement is due.
    SoftExpired,
    /// A hard limit reached: the SA refuses all traffic.
    HardExpired,
}

impl LifeState {
    /// `ok`, `soft_expired` or `hard_expired`.
    pub const fn as_str(self) -> &'static str {
        match self {
            LifeState::Ok => "ok",
            LifeState::SoftExpired => "soft_expired",
            LifeState::HardExpired => "hard_expired",
        }
    }
}

/// One SA's counters, written by the SA (in the one worker that holds that
/// copy) as it processes packets.
#[derive(Debug, Default)]
pub struct SaCounters {
    /// Packets processed successfully.
    pub packets: Counter,
    /// Payload bytes processed successfully.
    pub bytes: Counter,
    /// Dummy (next header 59) packets received and discarded.
    pub dummies: Counter,
    /// Packets whose state this node kept without processing them (seed
    /// 003's cluster: another node did the cryptography).
    pub observed: Counter,
    /// Drops by reason.
    pub drops: DropCounters,
    /// Outbound: the next sequence number (of this copy's own counter; a
    /// counter shared between workers is read from the counter itself).
    pub next_seq: Counter,
    /// Inbound: the highest sequence number authenticated.
    pub replay_top: Counter,
    life: AtomicU8,
}

impl SaCounters {
    /// The lifetime state.
    pub fn life(&self) -> LifeState {
        match self.life.load(Relaxed) {
            0 => LifeState::Ok,
            1 => LifeState::SoftExpired,
            _ => LifeState::HardExpired,
        }
    }

    /// Records a new lifetime state (the writer only).
    pub fn set_life(&self, s: LifeState) {
        self.life.store(
            match s {
                LifeState::Ok => 0,
                LifeState::SoftExpired => 1,
                LifeState::HardExpired => 2,
            },
            Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn one_writer_many_readers() {
        let c = Arc::new(WorkerCounters::default());
        let w = c.clone();
        let t = std::thread::spawn(move || {
            for _ in 0..10_000 {
                w.tun_rx.incr();
                w.drops.count(DropReason::Replay);
            }
            w.net_tx.add(7);
        });
        // Reads while the writer runs see a value between 0 and the end.
        let seen = c.tun_rx.get();
        assert!(seen <= 10_000);
        t.join().unwrap();
        assert_eq!(c.tun_rx.get(), 10_000);
        assert_eq!(c.drops.get(DropReason::Replay), 10_000);
        assert_eq!(c.drops.get(DropReason::Integrity), 0);
        let named = c.named();
        assert_eq!(named[0], ("tun_rx", 10_000));
        assert_eq!(
            named.iter().find(|(k, _)| *k == "net_tx"),
            Some(&("net_tx", 7))
        );
        assert_eq!(c.drops.all().count(), DropReason::COUNT);
    }

    #[test]
    fn life_state_round_trips() {
        let s = SaCounters::default();
        assert_eq!(s.life(), LifeState::Ok);
        for l in [
            LifeState::SoftExpired,
            LifeState::HardExpired,
            LifeState::Ok,
        ] {
            s.set_life(l);
            assert_eq!(s.life(), l);
        }
        assert_eq!(LifeState::HardExpired.as_str(), "hard_expired");
    }
}
