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
//!
//! The packet path never writes: each reservation is a [`DiskLease`], the
//! core's [`SeqLease`] — the SA reads its limit (an atomic load) and, past
//! the half-way mark, flags it as wanting more; the [`Extender`] thread
//! writes the new reservation and only then raises the limit. If the disk
//! refuses (full, read-only), the extender retries every second and the SA
//! stops at its limit rather than sending an unreserved number
//! (`seq_not_reserved`), and carries on once the write succeeds.

use crate::ratelimit::RateLimiter;
use anyhow::{anyhow, bail, Context, Result};
use espgate_core::gateway::LeaseSource;
use espgate_core::sa::SeqLease;
use espgate_core::SaConfig;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

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
        // Held while `lock` is open, i.e. as long as the reservation
        // (closing it releases the lock).
        if let Err(e) =
            rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        {
            let e = io::Error::from(e);
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
        r.extend(start).with_context(|| {
            format!(
                "reserving sequence numbers of {} SA {:#010x} (connection \"{connection}\") in \
                 state file {}",
                cfg.protocol.name().to_uppercase(),
                cfg.spi,
                r.path().display()
            )
        })?;
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

/// One outbound SA's reservation as the SA sees it: a limit it reads on
/// every packet, and a flag it raises when it wants the limit moved.
#[derive(Debug)]
pub struct DiskLease {
    file: Mutex<Reservation>,
    /// Numbers below this are on disk: the SA may send them.
    limit: AtomicU64,
    /// Once the next number reaches this, more are wanted.
    low_water: AtomicU64,
    /// The next number, as last wanted.
    wanted: AtomicU64,
    /// Set by the SA, cleared by the extender once written.
    pending: AtomicBool,
    /// Writes of a larger reservation that failed.
    failures: AtomicU64,
    wake: SyncSender<()>,
}

fn lock(r: &Mutex<Reservation>) -> std::sync::MutexGuard<'_, Reservation> {
    // A thread that panicked while holding it left a valid reservation
    // (every write is atomic): keep going.
    r.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SeqLease for DiskLease {
    #[inline]
    fn limit(&self) -> u64 {
        self.limit.load(Ordering::Acquire)
    }

    #[inline]
    fn want(&self, next: u64) {
        if next < self.low_water.load(Ordering::Relaxed) {
            return;
        }
        self.wanted.store(next, Ordering::Relaxed);
        if !self.pending.swap(true, Ordering::AcqRel) {
            // A bounded channel of one slot: never blocks, never
            // allocates; a full slot means the extender is awake already.
            match self.wake.try_send(()) {
                Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
            }
        }
    }

    fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    fn release(&self, next: u64) {
        let mut r = lock(&self.file);
        if let Err(e) = r.release(next) {
            tracing::warn!("writing {}: {e}", r.path().display());
        }
    }
}

impl DiskLease {
    /// Writes the reservation the SA wants (the extender's job). False if
    /// the disk refused: the limit stays, and the next attempt retries.
    fn extend(&self) -> Result<(), String> {
        let mut r = lock(&self.file);
        let next = self.wanted.load(Ordering::Relaxed);
        r.extend(next).map_err(|e| {
            self.failures.fetch_add(1, Ordering::Relaxed);
            format!(
                "cannot reserve sequence numbers in {}: {e}; the SA sends up to {} and then \
                 drops (seq_not_reserved) until the write succeeds",
                r.path().display(),
                r.reserved()
            )
        })?;
        self.low_water.store(r.low_water(), Ordering::Relaxed);
        self.limit.store(r.reserved(), Ordering::Release);
        self.pending.store(false, Ordering::Release);
        Ok(())
    }
}

/// The thread that writes extended reservations, off the packet path.
#[derive(Debug)]
pub struct Extender {
    wake: SyncSender<()>,
    leases: Arc<Mutex<Vec<Weak<DiskLease>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Extender {
    /// Starts the thread.
    pub fn start() -> io::Result<Extender> {
        let (wake, rx) = mpsc::sync_channel(1);
        let leases: Arc<Mutex<Vec<Weak<DiskLease>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (l, st) = (leases.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("espgate-seq".into())
            .spawn(move || extend_loop(&rx, &l, &st))?;
        Ok(Extender {
            wake,
            leases,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Extender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.wake.try_send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long the extender waits between retries after a failed write.
const RETRY: Duration = Duration::from_secs(1);

fn extend_loop(rx: &Receiver<()>, leases: &Mutex<Vec<Weak<DiskLease>>>, stop: &AtomicBool) {
    let mut limiter = RateLimiter::new(Duration::from_secs(10));
    let start = Instant::now();
    loop {
        match rx.recv_timeout(RETRY) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let live: Vec<Arc<DiskLease>> = {
            let mut l = leases.lock().unwrap_or_else(PoisonError::into_inner);
            l.retain(|w| w.strong_count() > 0);
            l.iter().filter_map(Weak::upgrade).collect()
        };
        for lease in live.iter().filter(|l| l.pending.load(Ordering::Acquire)) {
            if let Err(msg) = lease.extend() {
                if let Some(n) = limiter.check("seq_reserve", start.elapsed()) {
                    tracing::warn!("{msg}{}", crate::ratelimit::suppressed_note(n));
                }
            }
        }
    }
}

/// The state directory as the engine's [`LeaseSource`].
#[derive(Debug)]
pub struct DiskLeases {
    store: SeqStore,
    extender: Extender,
}

impl DiskLeases {
    /// Leases in `store`, extended by a new [`Extender`] thread.
    pub fn new(store: SeqStore) -> io::Result<DiskLeases> {
        Ok(DiskLeases {
            store,
            extender: Extender::start()?,
        })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        self.store.dir()
    }
}

impl LeaseSource for DiskLeases {
    fn lease(&self, sa: &SaConfig, conn: &str) -> Result<(u64, Arc<dyn SeqLease>), String> {
        let (start, r) = self.store.reserve(sa, conn).map_err(|e| format!("{e:#}"))?;
        let lease = Arc::new(DiskLease {
            limit: AtomicU64::new(r.reserved()),
            low_water: AtomicU64::new(r.low_water()),
            wanted: AtomicU64::new(start),
            pending: AtomicBool::new(false),
            failures: AtomicU64::new(0),
            wake: self.extender.wake.clone(),
            file: Mutex::new(r),
        });
        self.extender
            .leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::downgrade(&lease));
        Ok((start, lease))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_core::crypto::Suite;
    use espgate_core::sa::Protocol;

    /// A state directory that does not exist yet (the store makes it).
    fn temp_dir() -> PathBuf {
        espgate_testkit::temp_dir("seq-test").join("state")
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

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn leases_grow_off_the_packet_path_and_hold_when_the_disk_refuses() {
        let dir = temp_dir();
        let leases = DiskLeases::new(SeqStore::open(&dir).unwrap()).unwrap();
        let (start, l) = leases.lease(&cfg(9, false), "a").unwrap();
        assert_eq!((start, l.limit()), (1, 1 + STEP));
        // Below the half-way mark nothing is asked for.
        l.want(2);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(l.limit(), 1 + STEP);
        // Past it, the extender writes and raises the limit.
        let half = 1 + STEP - STEP / 2;
        l.want(half);
        wait_until("the extension", || l.limit() == half + STEP);
        let path = dir.join(format!("seq-{}", fingerprint(&cfg(9, false))));
        assert_eq!(
            parse(&fs::read_to_string(&path).unwrap()).unwrap(),
            half + STEP
        );
        // The disk refuses (the directory is gone): the limit holds.
        fs::remove_dir_all(&dir).unwrap();
        let lim = l.limit();
        l.want(lim - STEP / 2 + 1);
        std::thread::sleep(RETRY + Duration::from_millis(500));
        assert_eq!(l.limit(), lim, "no number beyond what is on disk");
        // The failed writes are counted with the SA (its status shows them).
        assert!(l.failures() >= 1);
        // Space again: the retry succeeds.
        fs::create_dir_all(&dir).unwrap();
        wait_until("the retry", || l.limit() > lim);
        l.release(lim + 5);
        assert_eq!(parse(&fs::read_to_string(&path).unwrap()).unwrap(), lim + 5);
        drop(l);
        drop(leases);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Engines A (with its leases in `dir`) and B, mirrored.
    mod with_engines {
        use super::super::*;
        use super::temp_dir;
        use espgate_core::gateway::{Engine, EngineOptions, Layers, Received};
        use espgate_core::PacketBuf;
        use espgate_testkit::{from_a, mirrored, udp4, Shape};

        const T: Duration = Duration::from_secs(1);

        fn opts(leases: Option<Arc<DiskLeases>>) -> EngineOptions {
            EngineOptions {
                leases: leases.map(|l| l as Arc<dyn LeaseSource>),
                cluster: None,
                ..espgate_testkit::opts()
            }
        }

        fn send(a: &mut Engine, b: &mut Engine) -> bool {
            let mut buf = PacketBuf::with_capacity(2000);
            buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
            a.outbound(&mut buf, T).is_ok_and(|c| c.is_some())
                && b.inbound(&mut buf, T, from_a()) == Ok(Received::Packet)
        }

        fn out(e: &Engine) -> espgate_core::gateway::SaEntry {
            e.stats()
                .sas()
                .iter()
                .find(|s| s.outbound)
                .cloned()
                .unwrap()
        }

        #[test]
        fn sequence_numbers_continue_across_engines() {
            let dir = temp_dir();
            let leases = Arc::new(DiskLeases::new(SeqStore::open(&dir).unwrap()).unwrap());
            let (ca, cb) = mirrored(Shape::new(Layers::Esp, true));
            let mut b = Engine::new(&[cb], &opts(None), T).unwrap();
            let new_a = || Engine::new(std::slice::from_ref(&ca), &opts(Some(leases.clone())), T);
            let mut a = new_a().unwrap();
            for _ in 0..5 {
                assert!(send(&mut a, &mut b));
            }
            // A second engine on the same key is refused while A runs.
            let e = new_a().unwrap_err();
            assert!(e.contains("already in use"), "{e}");
            // Clean stop: the restarted A continues at 6, and B (not
            // restarted) accepts it.
            a.release_leases();
            drop(a);
            let mut a = new_a().unwrap();
            assert_eq!(out(&a).next_seq(), 6);
            assert!(send(&mut a, &mut b));
            // Crash (no release): the restart jumps past the reservation.
            let reserved = out(&a).seq_limit().unwrap();
            drop(a);
            let mut a = new_a().unwrap();
            let next = out(&a).next_seq();
            assert_eq!(next, reserved);
            assert!(next > 6);
            assert!(send(&mut a, &mut b));
            let inbound = b
                .stats()
                .sas()
                .iter()
                .find(|s| !s.outbound)
                .cloned()
                .unwrap();
            assert_eq!(inbound.counters.replay_top.get(), next);
            drop(a);
            drop(leases);
            fs::remove_dir_all(&dir).unwrap();
        }

        #[test]
        fn added_outbound_sas_reserve_sequence_numbers_on_disk() {
            let dir = temp_dir();
            let leases = Arc::new(DiskLeases::new(SeqStore::open(&dir).unwrap()).unwrap());
            let (ca, cb) = mirrored(Shape::new(Layers::Esp, true));
            let mut a = Engine::new(&[ca], &opts(Some(leases.clone())), T).unwrap();
            let mut b = Engine::new(&[cb], &opts(None), T).unwrap();
            let k = espgate_testkit::keys::K_NEW_AB;
            let spec = format!("spi=0x3001,suite=aes128gcm16,enc={k}");
            b.add_sa("peer", false, &spec, T).unwrap();
            a.add_sa("peer", true, &spec, T).unwrap();
            assert_eq!(out(&a).next_seq(), 1);
            assert!(out(&a).seq_limit().unwrap() > 1);
            for _ in 0..3 {
                assert!(send(&mut a, &mut b));
            }
            // Removed, then added again: the key continues where it
            // stopped (the state file says 4), it never starts over at 1.
            a.del_sa(0x3001, None, None, None).unwrap();
            let ch = a.add_sa("peer", true, &spec, T).unwrap();
            assert!(
                ch.message.contains("starting at sequence number 4"),
                "{ch:?}"
            );
            assert!(send(&mut a, &mut b));
            // Replacing the configured SA released its reservation (next =
            // 1, nothing sent on it), so that key continues exactly too.
            let old = format!(
                "spi=0x1002,suite=aes128gcm16,enc={}",
                espgate_testkit::keys::K_AB
            );
            let ch = a.add_sa("peer", true, &old, T).unwrap();
            assert!(
                ch.message.contains("starting at sequence number 1"),
                "{ch:?}"
            );
            a.release_leases();
            drop(a);
            drop(leases);
            fs::remove_dir_all(&dir).unwrap();
        }

        #[test]
        fn worker_copies_share_one_lease_on_disk() {
            let dir = temp_dir();
            let leases = Arc::new(DiskLeases::new(SeqStore::open(&dir).unwrap()).unwrap());
            let (ca, cb) = mirrored(Shape::new(Layers::Esp, true));
            let ca = [ca];
            let mut b = Engine::new(&[cb], &opts(None), T).unwrap();
            let mut ws = Engine::for_workers(&ca, &opts(Some(leases.clone())), T, 2).unwrap();
            for i in 0..10 {
                assert!(send(&mut ws[i % 2], &mut b), "packet {i}");
            }
            // A restart after a clean stop continues at 11.
            for w in &mut ws {
                w.release_leases();
            }
            drop(ws);
            let a = Engine::new(&ca, &opts(Some(leases.clone())), T).unwrap();
            assert_eq!(out(&a).next_seq(), 11);
            drop(a);
            drop(leases);
            fs::remove_dir_all(&dir).unwrap();
        }
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
