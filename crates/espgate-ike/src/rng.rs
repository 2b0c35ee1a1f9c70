//! Where the IKE engine's randomness comes from.
//!
//! Every random value of IKE — SPIs, nonces, Diffie-Hellman private keys,
//! the cookie secret, rekey jitter — is drawn through the [`Rng`] trait,
//! so that a test can make the engine deterministic (`tests::SeededRng`,
//! test builds only) or make the generator fail. Production uses
//! [`SystemRng`], aws-lc's CSPRNG.
//!
//! Drawing is fallible and callers fail closed: a value that could not be
//! drawn is never replaced by zeros or a constant (see
//! [`crate::engine::Ike`] for what each exchange does then).

use std::fmt;

/// The random generator could not produce bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RngError;

impl fmt::Display for RngError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the random number generator failed")
    }
}

impl std::error::Error for RngError {}

/// A source of cryptographically secure random bytes.
pub trait Rng {
    /// Fills `out` entirely with random bytes, or fails; on failure the
    /// content of `out` is unspecified and must not be used.
    fn fill(&mut self, out: &mut [u8]) -> Result<(), RngError>;
}

/// aws-lc's system CSPRNG (what the daemon uses).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemRng;

impl Rng for SystemRng {
    fn fill(&mut self, out: &mut [u8]) -> Result<(), RngError> {
        aws_lc_rs::rand::fill(out).map_err(|_| RngError)
    }
}

/// `n` random bytes.
pub fn bytes(rng: &mut dyn Rng, n: usize) -> Result<Vec<u8>, RngError> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v)?;
    Ok(v)
}

/// A random `u32`.
pub fn u32(rng: &mut dyn Rng) -> Result<u32, RngError> {
    let mut b = [0u8; 4];
    rng.fill(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

/// A random `u64`.
pub fn u64(rng: &mut dyn Rng) -> Result<u64, RngError> {
    let mut b = [0u8; 8];
    rng.fill(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Generators for tests: deterministic, or failing on demand.
#[cfg(test)]
pub(crate) mod tests {
    use super::{Rng, RngError};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// A deterministic generator for tests only: SHA-256 of the seed and a
    /// block counter. Not a CSPRNG for production (no reseeding, no
    /// prediction resistance); it makes engine runs reproducible.
    pub(crate) struct SeededRng {
        seed: [u8; 32],
        counter: u64,
        block: [u8; 32],
        used: usize,
    }

    impl SeededRng {
        /// A generator whose output depends only on `seed`.
        pub(crate) fn new(seed: u64) -> SeededRng {
            let mut s = [0u8; 32];
            s[..8].copy_from_slice(&seed.to_be_bytes());
            SeededRng {
                seed: s,
                counter: 0,
                block: [0; 32],
                used: 32,
            }
        }
    }

    impl Rng for SeededRng {
        fn fill(&mut self, out: &mut [u8]) -> Result<(), RngError> {
            for b in out {
                if self.used == self.block.len() {
                    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
                    ctx.update(&self.seed);
                    ctx.update(&self.counter.to_be_bytes());
                    self.block.copy_from_slice(ctx.finish().as_ref());
                    self.counter += 1;
                    self.used = 0;
                }
                *b = self.block[self.used];
                self.used += 1;
            }
            Ok(())
        }
    }

    /// A seeded generator that fails while its switch is on.
    pub(crate) struct SwitchRng {
        inner: SeededRng,
        /// On: every draw fails.
        pub(crate) fail: Arc<AtomicBool>,
    }

    impl SwitchRng {
        /// Works until `fail` is set.
        pub(crate) fn new(seed: u64) -> (SwitchRng, Arc<AtomicBool>) {
            let fail = Arc::new(AtomicBool::new(false));
            (
                SwitchRng {
                    inner: SeededRng::new(seed),
                    fail: fail.clone(),
                },
                fail,
            )
        }
    }

    impl Rng for SwitchRng {
        fn fill(&mut self, out: &mut [u8]) -> Result<(), RngError> {
            if self.fail.load(Ordering::SeqCst) {
                // Like a broken generator that wrote nothing useful.
                out.fill(0);
                return Err(RngError);
            }
            self.inner.fill(out)
        }
    }

    #[test]
    fn seeded_is_reproducible_and_seed_dependent() {
        let draw = |seed| {
            let mut r = SeededRng::new(seed);
            let mut a = [0u8; 40];
            let mut b = [0u8; 7];
            r.fill(&mut a).unwrap();
            r.fill(&mut b).unwrap();
            (a.to_vec(), b.to_vec())
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        let (a, b) = draw(1);
        assert_ne!(&a[..7], &b[..], "the stream moves on");
        assert!(a.iter().any(|x| *x != 0));
    }

    #[test]
    fn switch_fails_while_on() {
        let (mut r, fail) = SwitchRng::new(3);
        assert!(super::u64(&mut r).is_ok());
        fail.store(true, Ordering::SeqCst);
        assert_eq!(super::bytes(&mut r, 16), Err(RngError));
        fail.store(false, Ordering::SeqCst);
        assert!(super::u32(&mut r).is_ok());
    }

    #[test]
    fn system_rng_fills() {
        let mut r = super::SystemRng;
        let a = super::bytes(&mut r, 32).unwrap();
        let b = super::bytes(&mut r, 32).unwrap();
        assert_ne!(a, b);
    }
}
