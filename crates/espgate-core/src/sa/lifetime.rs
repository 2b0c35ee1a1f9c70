//! SA lifetimes (RFC 4301 §4.4.2.1): soft limits ask for a rekey, hard limits
//! retire the SA. Time is an input; the core never reads a clock.

use std::time::Duration;

/// Limits; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lifetime {
    /// Bytes (of protected payload) before a rekey is requested.
    pub soft_bytes: Option<u64>,
    /// Bytes after which the SA is unusable.
    pub hard_bytes: Option<u64>,
    /// Packets before a rekey is requested.
    pub soft_packets: Option<u64>,
    /// Packets after which the SA is unusable.
    pub hard_packets: Option<u64>,
    /// Age before a rekey is requested.
    pub soft_time: Option<Duration>,
    /// Age after which the SA is unusable.
    pub hard_time: Option<Duration>,
}

/// Events an SA raises; each fires at most once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaEvent {
    /// A soft limit was reached: negotiate a replacement.
    SoftExpired,
    /// A hard limit was reached: the SA refuses all traffic.
    HardExpired,
    /// The outbound sequence number space is used up; the SA refuses to send
    /// rather than wrap (which would reuse nonces).
    SeqExhausted,
}

/// Counting state against a [`Lifetime`].
#[derive(Debug, Clone)]
pub struct LifetimeState {
    limits: Lifetime,
    created: Duration,
    /// Bytes counted so far.
    pub bytes: u64,
    /// Packets counted so far.
    pub packets: u64,
    soft: bool,
    hard: bool,
    /// Any limit configured (cached so the per-packet path can skip work).
    any_limit: bool,
    /// Any hard limit configured.
    any_hard: bool,
}

impl LifetimeState {
    /// Starts counting at time `now`.
    pub fn new(limits: Lifetime, now: Duration) -> LifetimeState {
        LifetimeState {
            limits,
            created: now,
            bytes: 0,
            packets: 0,
            soft: false,
            hard: false,
            any_limit: limits != Lifetime::default(),
            any_hard: limits.hard_bytes.is_some()
                || limits.hard_packets.is_some()
                || limits.hard_time.is_some(),
        }
    }

    /// Divides the byte and packet limits by `n` (rounding up, at least
    /// 1): for one of `n` copies of an SA that each count their own traffic.
    pub fn split_volume_limits(&mut self, n: u64) {
        let n = n.max(1);
        let l = &mut self.limits;
        for v in [
            &mut l.soft_bytes,
            &mut l.hard_bytes,
            &mut l.soft_packets,
            &mut l.hard_packets,
        ]
        .into_iter()
        .flatten()
        {
            *v = v.div_ceil(n).max(1);
        }
    }

    /// The limits.
    pub fn limits(&self) -> &Lifetime {
        &self.limits
    }

    /// Hard limit reached.
    pub fn is_hard_expired(&self) -> bool {
        self.hard
    }

    /// Time of installation.
    pub fn created(&self) -> Duration {
        self.created
    }

    /// Counts one packet of `bytes` and returns any newly crossed limit.
    #[inline]
    pub fn account(&mut self, bytes: usize, now: Duration) -> Option<SaEvent> {
        self.bytes = self.bytes.saturating_add(bytes as u64);
        self.packets = self.packets.saturating_add(1);
        self.poll(now)
    }

    /// True when a time limit may still fire (callers skip clock work otherwise).
    pub fn has_pending_time_limit(&self) -> bool {
        (!self.soft && self.limits.soft_time.is_some())
            || (!self.hard && self.limits.hard_time.is_some())
    }

    /// Checks limits without traffic (timers). Returns the most severe new event.
    #[inline]
    pub fn poll(&mut self, now: Duration) -> Option<SaEvent> {
        if self.hard || (self.soft && !self.any_hard) || !self.any_limit {
            // Nothing left that could fire.
            return None;
        }
        self.check(now)
    }

    /// [`LifetimeState::poll`] past its quick exit, out of line: the
    /// per-packet path of an SA without limits stops at that exit.
    #[inline(never)]
    fn check(&mut self, now: Duration) -> Option<SaEvent> {
        let age = now.saturating_sub(self.created);
        let over = |b: Option<u64>, p: Option<u64>, t: Option<Duration>| {
            b.is_some_and(|b| self.bytes >= b)
                || p.is_some_and(|p| self.packets >= p)
                || t.is_some_and(|t| age >= t)
        };
        let l = self.limits;
        if !self.hard && over(l.hard_bytes, l.hard_packets, l.hard_time) {
            self.hard = true;
            self.soft = true;
            return Some(SaEvent::HardExpired);
        }
        if !self.soft && over(l.soft_bytes, l.soft_packets, l.soft_time) {
            self.soft = true;
            return Some(SaEvent::SoftExpired);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_then_hard_once_each() {
        let l = Lifetime {
            soft_packets: Some(2),
            hard_packets: Some(4),
            soft_time: Some(Duration::from_secs(10)),
            ..Default::default()
        };
        let mut s = LifetimeState::new(l, Duration::ZERO);
        let t = Duration::from_secs(1);
        assert_eq!(s.account(100, t), None);
        assert_eq!(s.account(100, t), Some(SaEvent::SoftExpired));
        assert_eq!(s.account(100, t), None);
        assert_eq!(s.account(100, t), Some(SaEvent::HardExpired));
        assert!(s.is_hard_expired());
        assert_eq!(s.account(100, t), None);
        assert_eq!(s.bytes, 500);
    }

    #[test]
    fn time_limits_fire_from_poll() {
        let l = Lifetime {
            soft_time: Some(Duration::from_secs(5)),
            hard_time: Some(Duration::from_secs(8)),
            ..Default::default()
        };
        let mut s = LifetimeState::new(l, Duration::from_secs(100));
        assert_eq!(s.poll(Duration::from_secs(104)), None);
        assert_eq!(s.poll(Duration::from_secs(105)), Some(SaEvent::SoftExpired));
        // The hard limit is 3 s away: not yet at 107.999, at 108.
        assert_eq!(s.poll(Duration::from_millis(107_999)), None);
        assert_eq!(s.poll(Duration::from_secs(108)), Some(SaEvent::HardExpired));
    }
}
