//! The kernel-side filter on the ESP-in-UDP sockets, engaged during a
//! flood of junk ESP.
//!
//! Junk ESP costs the gateway a socket-queue slot, a copy and a wake-up
//! per datagram before the engine can drop it, and it queues the tunnel's
//! own packets behind it; a profile of a gateway under a bad-ICV flood
//! spends three quarters of its time in the kernel's receive path, not in
//! the failing AES-GCM. A classic BPF socket filter
//! ([`crate::sockets::spi_filter_program`]) drops junk in the kernel's
//! receive path instead, in two modes, each engaged when its drop reason
//! exceeds [`ENGAGE_PER_SEC`]:
//! - **unknown SPIs** (`unknown_spi`): only the inbound SPIs are kept;
//! - **bad ICVs** (`icv_failure`): an inbound SPI's datagrams are kept only
//!   from its peer's address. A flood with a valid SPI from other sources
//!   (a botnet's own addresses, spoofed ones) no longer reaches the
//!   workers; the peer's port may still change (NAT rebinding). The
//!   price: while engaged, a peer that moved to another address is not
//!   heard until the flood ends.
//!
//! In normal operation there is no filter: a stray unknown SPI (a peer with
//! the wrong manual key, a stale SA after a restart) keeps its counter and
//! log line, which is how an operator finds it. While engaged, the junk
//! counts as `udp_socket_drops` (the kernel's count for the socket), and
//! the filter follows every SA change before the peer can use the new SA:
//! the IKE driver refreshes it after installing SAs and before sending its
//! answer, the control requests after `sa add` and cluster updates. Both
//! modes end after [`QUIET_SECS`] seconds in which neither reason nor the
//! kernel's drops reached [`ENGAGE_PER_SEC`].

use crate::sockets::{SpiRule, UdpSock};
use crate::worker::lock;
use espgate_core::gateway::WorkerStats;
use espgate_core::DropReason;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Datagrams a second of one drop reason that engage its mode.
pub const ENGAGE_PER_SEC: u64 = 1000;

/// Seconds in which the drop reasons and the kernel's drops all stay
/// below [`ENGAGE_PER_SEC`] before the filter is removed.
pub const QUIET_SECS: u32 = 10;

#[derive(Debug, Default)]
struct State {
    /// Only inbound SPIs are kept.
    unknown: bool,
    /// Inbound SPIs are kept only from their peer.
    pinned: bool,
    /// The sorted rules and mode the sockets' filters hold.
    applied: Option<(Vec<SpiRule>, bool)>,
    /// Counts at the last tick.
    last_unknown: u64,
    last_icv: u64,
    last_kernel: u64,
    quiet: u32,
    engagements: u64,
}

/// The filter of every worker's ESP-in-UDP socket.
#[derive(Debug)]
pub struct SpiFilter {
    /// Worker order: with several, socket `k` receives the SPIs with
    /// `spi % n == k` (the `SO_REUSEPORT` steering).
    socks: Vec<Arc<UdpSock>>,
    state: Mutex<State>,
}

impl SpiFilter {
    /// The filter of `socks` (none: nothing to filter), disengaged.
    pub fn new(socks: Vec<Arc<UdpSock>>) -> SpiFilter {
        SpiFilter {
            socks,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether either mode is on.
    pub fn engaged(&self) -> bool {
        let st = self.state();
        st.unknown || st.pinned
    }

    /// How many times a flood engaged a mode.
    pub fn engagements(&self) -> u64 {
        self.state().engagements
    }

    /// Datagrams the kernel dropped at the ESP-in-UDP sockets (the
    /// filter's and a full receive buffer's), over all workers.
    pub fn kernel_drops(&self) -> u64 {
        self.socks
            .iter()
            .filter_map(|s| s.kernel_drops().ok())
            .map(u64::from)
            .sum()
    }

    /// Once a second: engages a mode when its drop reason grew by
    /// [`ENGAGE_PER_SEC`] or more since the last tick, ends both after
    /// [`QUIET_SECS`] quiet ones, and follows SA changes meanwhile.
    pub fn tick(&self, engines: &[crate::worker::EngineLock], stats: &[Arc<WorkerStats>]) {
        if self.socks.is_empty() {
            return;
        }
        let count = |d| stats.iter().map(|w| w.counters.drops.get(d)).sum::<u64>();
        let unknown = count(DropReason::UnknownSpi);
        let icv = count(DropReason::Integrity);
        let kernel = self.kernel_drops();
        let mut st = self.state();
        let du = unknown.saturating_sub(st.last_unknown);
        let di = icv.saturating_sub(st.last_icv);
        let dk = kernel.saturating_sub(st.last_kernel);
        (st.last_unknown, st.last_icv, st.last_kernel) = (unknown, icv, kernel);
        if !st.unknown && du >= ENGAGE_PER_SEC {
            st.unknown = true;
            st.engagements += 1;
            tracing::warn!(
                "ESP with unknown SPIs at {du}/s: dropping them in the kernel until the flood \
                 ends (they count as udp_socket_drops meanwhile)"
            );
        }
        if !st.pinned && di >= ENGAGE_PER_SEC {
            st.pinned = true;
            st.engagements += 1;
            tracing::warn!(
                "ESP failing its integrity check at {di}/s: until the flood ends, each SA's \
                 packets are let in only from its peer's address (others count as \
                 udp_socket_drops)"
            );
        }
        if !(st.unknown || st.pinned) {
            return;
        }
        if du < ENGAGE_PER_SEC && di < ENGAGE_PER_SEC && dk < ENGAGE_PER_SEC {
            st.quiet += 1;
        } else {
            st.quiet = 0;
        }
        if st.quiet >= QUIET_SECS {
            (st.unknown, st.pinned, st.quiet) = (false, false, 0);
            tracing::info!("the junk ESP flood has ended ({QUIET_SECS} s quiet): filter removed");
        }
        self.apply(&mut st, engines);
    }

    /// After SAs were added or removed: the filter, if engaged, names the
    /// inbound SAs the engines have now.
    pub fn refresh(&self, engines: &[crate::worker::EngineLock]) {
        let mut st = self.state();
        if st.unknown || st.pinned {
            self.apply(&mut st, engines);
        }
    }

    fn apply(&self, st: &mut State, engines: &[crate::worker::EngineLock]) {
        let want = if st.unknown || st.pinned {
            let mut sas: Vec<(u32, IpAddr)> = Vec::new();
            for e in engines {
                lock(e).udp_inbound_sas(&mut sas);
            }
            let mut rules: Vec<SpiRule> = sas
                .iter()
                .map(|&(spi, peer)| SpiRule {
                    spi,
                    only_from: st.pinned.then_some(peer),
                })
                .collect();
            rules.sort_unstable();
            rules.dedup();
            Some((rules, !st.unknown))
        } else {
            None
        };
        if want == st.applied {
            return;
        }
        let n = self.socks.len() as u32;
        let mut mine = Vec::new();
        for (k, s) in self.socks.iter().enumerate() {
            let r = match &want {
                Some((rules, other)) => {
                    mine.clear();
                    mine.extend(
                        rules
                            .iter()
                            .filter(|r| n <= 1 || r.spi % n == k as u32)
                            .copied(),
                    );
                    s.set_spi_filter(Some((&mine, *other)))
                }
                None => s.set_spi_filter(None),
            };
            if let Err(e) = r {
                tracing::warn!("{e}; junk ESP reaches the workers");
            }
        }
        st.applied = want;
    }
}
