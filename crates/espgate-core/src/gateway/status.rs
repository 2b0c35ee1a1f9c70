//! What other threads may read of a running engine: its counters and the
//! directory of its SAs with theirs. The worker writes counters as it
//! goes; the directory is republished only when SAs change (control
//! operations, never the packet path). A reader takes the directory's
//! current snapshot — an `Arc`, cloned under a lock no worker takes on the
//! packet path — and reads the counters behind it.

use crate::crypto::Suite;
use crate::sa::{Encap, Lifetime, Mode, Protocol, Sa, SeqLease, SharedSeq};
use crate::stats::{SaCounters, WorkerCounters};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// One engine's statistics.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// The worker's packet counters.
    pub counters: WorkerCounters,
    sas: Mutex<Arc<[SaEntry]>>,
}

impl WorkerStats {
    /// The SAs of this engine, per connection (in configuration order)
    /// inbound then outbound, as last published.
    pub fn sas(&self) -> Arc<[SaEntry]> {
        self.sas
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn publish(&self, entries: Vec<SaEntry>) {
        *self.sas.lock().unwrap_or_else(PoisonError::into_inner) = entries.into();
    }
}

/// One SA as readers see it: what it is, and its live counters.
#[derive(Debug, Clone)]
pub struct SaEntry {
    /// Index of its connection.
    pub conn: usize,
    /// We send on it.
    pub outbound: bool,
    /// Installed at run time (`espgate sa add`, IKE), not configured.
    pub added: bool,
    /// ESP or AH.
    pub protocol: Protocol,
    /// Its SPI.
    pub spi: u32,
    /// Its suite.
    pub suite: Suite,
    /// Tunnel or transport.
    pub mode: Mode,
    /// UDP encapsulation.
    pub encap: Encap,
    /// The peer's outer address in tunnel mode (outbound: where it sends;
    /// inbound: what it records as its packets' source), which IKE may
    /// have moved away from the connection's `remote` (a NAT's new
    /// mapping); `None` in transport mode.
    pub peer: Option<IpAddr>,
    /// 64-bit sequence numbers.
    pub esn: bool,
    /// Its lifetime limits (this copy's share of them, with several
    /// workers).
    pub limits: Lifetime,
    /// When it was installed.
    pub created: Duration,
    /// Its counters.
    pub counters: Arc<SaCounters>,
    shared_seq: Option<Arc<SharedSeq>>,
    lease: Option<Arc<dyn SeqLease>>,
}

impl SaEntry {
    pub(super) fn of(sa: &Sa, conn: usize, outbound: bool, added: bool) -> SaEntry {
        let c = sa.config();
        SaEntry {
            conn,
            outbound,
            added,
            protocol: c.protocol,
            spi: c.spi,
            suite: c.suite,
            mode: c.mode,
            encap: c.encap,
            peer: if outbound { c.tunnel_dst } else { c.tunnel_src },
            esn: c.esn,
            limits: *sa.lifetime().limits(),
            created: sa.lifetime().created(),
            counters: sa.counters().clone(),
            shared_seq: sa.shared_seq().cloned(),
            lease: sa.lease().cloned(),
        }
    }

    /// Outbound: the next sequence number to send.
    pub fn next_seq(&self) -> u64 {
        match &self.shared_seq {
            Some(s) => s.next(),
            None => self.counters.next_seq.get(),
        }
    }

    /// Outbound: numbers below this are covered by the SA's lease.
    pub fn seq_limit(&self) -> Option<u64> {
        self.lease.as_ref().map(|l| l.limit())
    }

    /// Outbound: failed attempts to extend the SA's lease.
    pub fn seq_reserve_failures(&self) -> u64 {
        self.lease.as_ref().map_or(0, |l| l.failures())
    }

    /// The key the copies of one SA in several workers have in common.
    pub fn key(&self) -> (bool, Protocol, u32) {
        (self.outbound, self.protocol, self.spi)
    }
}
