//! Rate limiting of log lines that packets can trigger: at most one line
//! per key per period; the lines not written are counted and reported with
//! the next one, or by [`RateLimiter::flush`] once the period is over.
//!
//! One limiter for every such line: the data plane keys it on drop
//! reasons (`&'static str`), the IKE driver on a message's kind (its
//! connection and first words). Keys live in a hash map bounded at
//! [`MAX_KEYS`]: a flood of distinct keys (spoofed peers) clears it rather
//! than growing it, so memory stays flat.

use rustc_hash::FxHashMap;
use std::hash::Hash;
use std::time::Duration;

/// Most keys remembered; beyond, the map starts afresh.
pub const MAX_KEYS: usize = 4096;

/// Per-key "last logged" times and suppressed counts.
#[derive(Debug)]
pub struct RateLimiter<K = &'static str> {
    period: Duration,
    slots: FxHashMap<K, Slot>,
}

#[derive(Debug)]
struct Slot {
    last: Duration,
    suppressed: u64,
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    /// One line per key per `period`.
    pub fn new(period: Duration) -> RateLimiter<K> {
        RateLimiter {
            period,
            slots: FxHashMap::default(),
        }
    }

    /// Like [`RateLimiter::new`], with room for `keys` keys made up front:
    /// the data plane's limiter knows its keys (the drop reasons), and its
    /// first line of a reason must not allocate on the packet path.
    pub fn with_capacity(period: Duration, keys: usize) -> RateLimiter<K> {
        let mut slots = FxHashMap::default();
        slots.reserve(keys);
        RateLimiter { period, slots }
    }

    /// May a line for `key` be written at `now`? `Some(n)`: yes, and `n`
    /// lines were suppressed since the last one; `None`: no (counted).
    pub fn check(&mut self, key: K, now: Duration) -> Option<u64> {
        if !self.slots.contains_key(&key) && self.slots.len() >= MAX_KEYS {
            self.slots.clear();
        }
        match self.slots.get_mut(&key) {
            None => {
                self.slots.insert(
                    key,
                    Slot {
                        last: now,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
            Some(s) if now.saturating_sub(s.last) >= self.period => {
                s.last = now;
                Some(std::mem::take(&mut s.suppressed))
            }
            Some(s) => {
                s.suppressed += 1;
                None
            }
        }
    }

    /// The keys whose period is over with lines still suppressed, and how
    /// many; each counts as a line written now.
    pub fn flush(&mut self, now: Duration) -> Vec<(K, u64)> {
        let mut out = Vec::new();
        for (k, s) in &mut self.slots {
            if s.suppressed > 0 && now.saturating_sub(s.last) >= self.period {
                out.push((k.clone(), std::mem::take(&mut s.suppressed)));
                s.last = now;
            }
        }
        out
    }
}

/// " (N similar suppressed)" or "".
pub fn suppressed_note(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} similar suppressed)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn one_line_per_key_per_period() {
        let mut r = RateLimiter::new(Duration::from_secs(1));
        assert_eq!(r.check("replay", ms(0)), Some(0));
        assert_eq!(r.check("replay", ms(10)), None);
        assert_eq!(r.check("replay", ms(999)), None);
        // Another key is independent.
        assert_eq!(r.check("icv_failure", ms(500)), Some(0));
        assert_eq!(r.check("replay", ms(1000)), Some(2));
        assert_eq!(r.check("replay", ms(1001)), None);
        assert_eq!(r.check("replay", ms(2500)), Some(1));
        assert_eq!(r.check("replay", ms(3600)), Some(0));
    }

    #[test]
    fn flush_reports_what_was_suppressed_once() {
        let mut r = RateLimiter::new(Duration::from_secs(1));
        assert_eq!(r.check("unknown_spi", ms(0)), Some(0));
        for t in 1..=5 {
            assert_eq!(r.check("unknown_spi", ms(t)), None);
        }
        assert!(r.flush(ms(900)).is_empty(), "period not over");
        assert_eq!(r.flush(ms(1000)), vec![("unknown_spi", 5)]);
        assert!(r.flush(ms(5000)).is_empty(), "nothing new");
        // The flush counted as a line: the next is a period later.
        assert_eq!(r.check("unknown_spi", ms(1500)), None);
        assert_eq!(r.check("unknown_spi", ms(2000)), Some(1));
        assert_eq!(suppressed_note(0), "");
        assert_eq!(suppressed_note(3), " (3 similar suppressed)");
    }

    #[test]
    fn owned_keys_and_a_flood_of_them_stay_bounded() {
        let mut r: RateLimiter<String> = RateLimiter::new(Duration::from_secs(1));
        assert_eq!(r.check("peer a: INIT".into(), ms(0)), Some(0));
        assert_eq!(r.check("peer a: INIT".into(), ms(1)), None);
        for i in 0..(MAX_KEYS as u64 * 3) {
            r.check(format!("spoofed {i}"), ms(2));
        }
        assert!(r.slots.len() <= MAX_KEYS);
    }
}
