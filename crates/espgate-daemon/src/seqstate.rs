//! Outbound sequence numbers that survive restarts.
//!
//! With manual keys, an SA that restarted at sequence number 1 would reuse
//! AES-GCM / ChaCha20-Poly1305 / GMAC nonces (the IV *is* the sequence
//! number) under the same key, and the peer's replay window would drop its
//! packets anyway. So before an outbound SA sends a sequence number, a
//! *reservation* covering it is on disk: a small file per outbound key in
//! `gateway.state_dir` holds `reserved = N`, meaning "numbers below N may
//! have been used". At start the SA begins at N (`SaConfig::initial_seq`)
//! and immediately reserves N + [`STEP`]; while running, the reservation is
//! extended (written and fsynced) when half of it is used up, and a packet
//! whose number is not covered is dropped rather than sent. A clean stop
//! writes the exact next number back, so only a crash skips numbers
//! (at most [`STEP`]).
//!
//! The file is named after a hash of the key bytes, not the SPI: the same
//! key under another SPI, suite or connection must not restart its nonces
//! either. A lock file held while the daemon runs keeps two SAs (or two
//! daemons) from using one key at once. The hash (SHA-256 over a domain
//! label and the keys) does not reveal the keys.

use anyhow::{anyhow, bail, Context, Result};
use espgate_core::SaConfig;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Sequence numbers reserved per write.
pub const STEP: u64 = 1 << 20;

/// The state directory.
#[derive(Debug, Clone)]
pub struct SeqStore {
    dir: PathBuf,
}

impl SeqStore {
    /// Uses (and creates, mode 0700) the directory `dir`.
    pub fn open(dir: &Path) -> Result<SeqStore> {
        if !dir.is_dir() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating state directory {}", dir.display()))?;
        }
        Ok(SeqStore {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes the reservation for the outbound SA `cfg` (of connection
    /// `connection`): returns the first sequence number it may use and the
    /// reservation, already extended past it on disk.
    pub fn reserve(&self, cfg: &SaConfig, connection: &str) -> Result<(u64, Reservation)> {
        let name = format!("seq-{}", fingerprint(cfg));
        let path = self.dir.join(&name);
        let lock_path = self.dir.join(format!("{name}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        // SAFETY: flock on a descriptor owned by `lock`, which lives as long
        // as the reservation (closing it releases the lock).
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                bail!(
                    "the outbound key of {} SA {:#010x} (connection \"{connection}\") is already \
                     in use by another SA or another espgate process ({} is locked); one key \
                     on two SAs would reuse nonces",
                    cfg.protocol.name().to_uppercase(),
                    cfg.spi,
                    lock_path.display()
                );
            }
            return Err(e).with_context(|| format!("locking {}", lock_path.display()));
        }
        let max_seq = if cfg.esn {
            u64::MAX
        } else {
            u64::from(u32::MAX)
        };
        let start = match fs::read_to_string(&path) {
            Ok(text) => parse(&text).map_err(|e| {
                anyhow!(
                    "state file {} is unreadable ({e}); if the key of {} SA {:#010x} was \
                     replaced, delete the file",
                    path.display(),
                    cfg.protocol.name().to_uppercase(),
                    cfg.spi
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 1,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        if start > max_seq {
            bail!(
                "{} SA {:#010x} (connection \"{connection}\") has used up its {} sequence numbers \
                 under this key across restarts ({} says {start}); configure new keys{}",
                cfg.protocol.name().to_uppercase(),
                cfg.spi,
                if cfg.esn { "64-bit" } else { "32-bit" },
                path.display(),
                if cfg.esn { "" } else { " (and esn = true)" }
            );
        }
        let mut r = Reservation {
            path,
            dir: self.dir.clone(),
            _lock: lock,
            reserved: start,
            low_water: start,
            limit: max_seq.saturating_add(1),
            spi: cfg.spi,
            connection: connection.to_string(),
        };
        r.extend(start)?;
        Ok((start, r))
    }
}

/// The hex name part for the keys of `cfg`.
pub fn fingerprint(cfg: &SaConfig) -> String {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(b"espgate outbound sequence state v1\0");
    for k in [&cfg.enc_key[..], &cfg.integ_key[..]] {
        ctx.update(&(k.len() as u32).to_be_bytes());
        ctx.update(k);
    }
    hex::encode(&ctx.finish().as_ref()[..16])
}

fn parse(text: &str) -> std::result::Result<u64, String> {
    for line in text.lines() {
        let line = line.trim();
        if let Some(v) = line.strip_prefix("reserved") {
            let v = v
                .trim_start()
                .strip_prefix('=')
                .ok_or("no '=' after reserved")?;
            let n: u64 = v
                .trim()
                .parse()
                .map_err(|_| format!("bad number {:?}", v.trim()))?;
            if n == 0 {
                return Err("reserved = 0".into());
            }
            return Ok(n);
        }
    }
    Err("no reserved = N line".into())
}

/// One outbound SA's reservation; see the module documentation.
#[derive(Debug)]
pub struct Reservation {
    path: PathBuf,
    dir: PathBuf,
    _lock: File,
    /// Numbers below this may have been used (the value on disk).
    reserved: u64,
    /// Extend once the next number reaches this.
    low_water: u64,
    /// One past the largest usable number.
    limit: u64,
    spi: u32,
    connection: String,
}

impl Reservation {
    /// The value on disk.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Extend once the next number to send reaches this.
    pub fn low_water(&self) -> u64 {
        self.low_water
    }

    /// The state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when `next` (the next number to send) is not covered yet: the
    /// reservation must be extended before it is sent.
    pub fn must_extend(&self, next: u64) -> bool {
        next >= self.reserved && self.reserved < self.limit
    }

    /// True when `next` is covered but the reservation is half used up.
    pub fn should_extend(&self, next: u64) -> bool {
        next >= self.low_water && self.reserved < self.limit
    }

    /// True when `next` may be sent.
    pub fn covers(&self, next: u64) -> bool {
        next < self.reserved
    }

    /// Writes a reservation up to `next + STEP` (at most the end of the
    /// sequence space). On failure the old reservation stays, and the
    /// caller may retry later.
    pub fn extend(&mut self, next: u64) -> io::Result<()> {
        let target = next.saturating_add(STEP).min(self.limit).max(self.reserved);
        self.write(target)?;
        self.low_water = target.saturating_sub(STEP / 2).max(next);
        Ok(())
    }

    /// On a clean stop: records exactly `next` (every number sent is
    /// below it), so a restart continues without a gap.
    pub fn release(&mut self, next: u64) -> io::Result<()> {
        let next = next.max(1);
        if next <= self.reserved {
            self.write(next)?;
        }
        Ok(())
    }

    /// Atomically replaces the file with `reserved = value`: a temporary
    /// file, fsync, rename, fsync of the directory.
    fn write(&mut self, value: u64) -> io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        let text = format!(
            "# espgate: outbound sequence numbers below `reserved` may have been sent under\n\
             # this key. Delete this file only together with the key: a restart would then\n\
             # reuse AES-GCM / ChaCha20-Poly1305 nonces.\n\
             reserved = {value}\nspi = {:#010x}\nconnection = {:?}\n",
            self.spi, self.connection
        );
        {
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
        }
        fs::rename(&tmp, &self.path)?;
        File::open(&self.dir)?.sync_all()?;
        self.reserved = value;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_core::crypto::Suite;
    use espgate_core::sa::Protocol;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn temp_dir() -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "espgate-seq-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn cfg(key_byte: u8, esn: bool) -> SaConfig {
        let suite: Suite = "aes128gcm16".parse().unwrap();
        let mut c = SaConfig::new(0x1002, Protocol::Esp, suite, &[key_byte; 20], &[]);
        c.esn = esn;
        c
    }

    fn on_disk(r: &Reservation) -> u64 {
        parse(&fs::read_to_string(r.path()).unwrap()).unwrap()
    }

    #[test]
    fn fresh_start_reserves_ahead_and_extends_at_half() {
        let dir = temp_dir();
        let store = SeqStore::open(&dir).unwrap();
        let (start, mut r) = store.reserve(&cfg(1, false), "a").unwrap();
        assert_eq!(start, 1);
        assert_eq!(on_disk(&r), 1 + STEP);
        assert!(r.covers(STEP) && !r.covers(STEP + 1));
        assert!(!r.should_extend(2) && !r.must_extend(2));
        let half = 1 + STEP - STEP / 2;
        assert!(r.should_extend(half) && !r.must_extend(half));
        r.extend(half).unwrap();
        assert_eq!(on_disk(&r), half + STEP);
        assert!(r.must_extend(half + STEP));
        let text = fs::read_to_string(r.path()).unwrap();
        assert!(text.contains("spi = 0x00001002") && text.contains("connection = \"a\""));
        // Owner-only files.
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(r.path()).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        drop(r);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn restarts_never_go_back() {
        let dir = temp_dir();
        let store = SeqStore::open(&dir).unwrap();
        let c = cfg(2, false);
        // Crash: the process dies holding a reservation; the next start
        // begins at the reserved mark, above anything sent.
        let (_, r) = store.reserve(&c, "a").unwrap();
        let sent_up_to = 1000; // pretend 1..999 were sent
        assert!(r.covers(sent_up_to));
        drop(r);
        let (start, mut r) = store.reserve(&c, "a").unwrap();
        assert_eq!(start, 1 + STEP);
        assert!(start > sent_up_to);
        // Clean stop after sending up to start+41: exact continuation.
        r.release(start + 42).unwrap();
        drop(r);
        let (again, r) = store.reserve(&c, "a").unwrap();
        assert_eq!(again, start + 42);
        // A different key is a different file, starting at 1.
        let (other, _r2) = store.reserve(&cfg(3, false), "b").unwrap();
        assert_eq!(other, 1);
        drop(r);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_key_cannot_be_reserved_twice() {
        let dir = temp_dir();
        let store = SeqStore::open(&dir).unwrap();
        let (_, r) = store.reserve(&cfg(4, false), "a").unwrap();
        let mut other = cfg(4, false);
        other.spi = 0x2002; // same key under another SPI
        let e = store.reserve(&other, "b").unwrap_err().to_string();
        assert!(e.contains("already in use"), "{e}");
        drop(r);
        store.reserve(&other, "b").unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn exhaustion_and_corruption_are_errors() {
        let dir = temp_dir();
        let store = SeqStore::open(&dir).unwrap();
        let c = cfg(5, false);
        let path = dir.join(format!("seq-{}", fingerprint(&c)));
        fs::write(&path, "reserved = 4294967296\n").unwrap();
        let e = store.reserve(&c, "a").unwrap_err().to_string();
        assert!(
            e.contains("used up its 32-bit") && e.contains("esn = true"),
            "{e}"
        );
        // With ESN the same mark is fine, and the cap is 2^64-1.
        let (start, mut r) = store.reserve(&cfg(5, true), "a").unwrap();
        assert_eq!(start, 1 << 32);
        r.extend(u64::MAX - 3).unwrap();
        assert_eq!(r.reserved(), u64::MAX);
        drop(r);
        fs::write(&path, "reserved = lots\n").unwrap();
        let e = store.reserve(&c, "a").unwrap_err().to_string();
        assert!(
            e.contains("unreadable") && e.contains("delete the file"),
            "{e}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn non_esn_reservation_stops_at_the_end_of_the_space() {
        let dir = temp_dir();
        let store = SeqStore::open(&dir).unwrap();
        let (_, mut r) = store.reserve(&cfg(6, false), "a").unwrap();
        r.extend(u64::from(u32::MAX) - 10).unwrap();
        assert_eq!(r.reserved(), 1 << 32);
        assert!(r.covers(u64::from(u32::MAX)));
        assert!(!r.must_extend(1 << 32), "nothing left to reserve");
        drop(r);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fingerprint_depends_on_keys_only() {
        let a = cfg(7, false);
        let mut b = cfg(7, true);
        b.spi = 0x9999;
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&cfg(8, false)));
        assert_eq!(fingerprint(&a).len(), 32);
    }
}
