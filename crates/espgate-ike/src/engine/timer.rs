//! The timers of one IKE SA: a small table with one deadline per kind
//! (after quinn-proto's `connection/timer.rs`).
//!
//! The table is derived from the SA's state by [`super::IkeSa::arm_timers`]
//! each time the engine is done with the SA; the engine keeps each SA's
//! earliest deadline in an ordered set, so that `poll_timeout` is a lookup
//! and `handle_timeout` visits only the SAs that are due.

use std::time::Duration;

/// A kind of deadline of an IKE SA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// Resend the outstanding request, or give the peer up.
    Retransmit,
    /// A responder's half-open SA got no IKE_AUTH in time.
    HalfOpen,
    /// A replaced IKE SA that the peer never deleted is removed.
    Replaced,
    /// Rekey the IKE SA.
    Rekey,
    /// Check the peer's liveness (nothing heard for the DPD delay).
    Dpd,
    /// The earliest deadline of a child SA: rekey, hard expiry, or the
    /// switch to a rekey responder's held outbound SA.
    Child,
}

impl Timer {
    /// Every timer, in the order they are handled when due together.
    pub(super) const VALUES: [Timer; 6] = [
        Timer::HalfOpen,
        Timer::Replaced,
        Timer::Retransmit,
        Timer::Child,
        Timer::Rekey,
        Timer::Dpd,
    ];
}

/// One deadline per [`Timer`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct TimerTable {
    data: [Option<Duration>; 6],
}

impl TimerTable {
    /// Arms `timer` at `at`, or stops it (`None`).
    pub(super) fn set(&mut self, timer: Timer, at: Option<Duration>) {
        self.data[timer as usize] = at;
    }

    /// When `timer` fires, if armed.
    pub(super) fn get(&self, timer: Timer) -> Option<Duration> {
        self.data[timer as usize]
    }

    /// The earliest armed deadline.
    pub(super) fn next(&self) -> Option<Duration> {
        self.data.iter().flatten().min().copied()
    }

    /// `timer` is armed and due at `now`.
    pub(super) fn is_expired(&self, timer: Timer, now: Duration) -> bool {
        self.get(timer).is_some_and(|t| t <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_keeps_one_deadline_per_timer() {
        let s = Duration::from_secs;
        let mut t = TimerTable::default();
        assert_eq!(t.next(), None);
        t.set(Timer::Rekey, Some(s(30)));
        t.set(Timer::Dpd, Some(s(10)));
        t.set(Timer::Retransmit, Some(s(20)));
        assert_eq!(t.next(), Some(s(10)));
        assert!(t.is_expired(Timer::Dpd, s(10)));
        assert!(!t.is_expired(Timer::Rekey, s(29)));
        assert!(!t.is_expired(Timer::HalfOpen, s(1000)), "not armed");
        t.set(Timer::Dpd, None);
        assert_eq!(t.next(), Some(s(20)));
        t.set(Timer::Retransmit, Some(s(40)));
        assert_eq!(t.get(Timer::Retransmit), Some(s(40)));
        assert_eq!(t.next(), Some(s(30)));
        // Every timer has its own slot.
        for (n, x) in Timer::VALUES.iter().enumerate() {
            t.set(*x, Some(s(100 + n as u64)));
        }
        for (n, x) in Timer::VALUES.iter().enumerate() {
            assert_eq!(t.get(*x), Some(s(100 + n as u64)));
        }
    }
}
