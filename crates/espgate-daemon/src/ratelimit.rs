//! Rate limiting of per-packet log lines: at most one line per key (a drop
//! reason) per period; the lines not written are counted and reported with
//! the next one, or by [`RateLimiter::flush`] once the period is over.

use std::time::Duration;

/// Per-key "last logged" times and suppressed counts. Keys are the
/// `&'static str` counter names, so a lookup is a short linear scan of
/// pointer-sized keys and nothing is allocated after the first line of
/// each key.
#[derive(Debug)]
pub struct RateLimiter {
    period: Duration,
    slots: Vec<Slot>,
}

#[derive(Debug)]
struct Slot {
    key: &'static str,
    last: Duration,
    suppressed: u64,
}

impl RateLimiter {
    /// One line per key per `period`.
    pub fn new(period: Duration) -> RateLimiter {
        RateLimiter {
            period,
            slots: Vec::new(),
        }
    }

    /// May a line for `key` be written at `now`? `Some(n)`: yes, and `n`
    /// lines were suppressed since the last one; `None`: no (counted).
    pub fn check(&mut self, key: &'static str, now: Duration) -> Option<u64> {
        match self.slots.iter_mut().find(|s| s.key == key) {
            None => {
                self.slots.push(Slot {
                    key,
                    last: now,
                    suppressed: 0,
                });
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
    pub fn flush(&mut self, now: Duration) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        for s in &mut self.slots {
            if s.suppressed > 0 && now.saturating_sub(s.last) >= self.period {
                out.push((s.key, std::mem::take(&mut s.suppressed)));
                s.last = now;
            }
        }
        out
    }
}

/// " (N similar lines suppressed)" or "".
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
}
