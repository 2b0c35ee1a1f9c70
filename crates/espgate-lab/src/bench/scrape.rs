//! A status-and-metrics scrape loop against running gateways, for `bench
//! tunnel --scrape HZ`: while a test runs, one thread per gateway asks for
//! `espgate status` on its control socket and fetches its Prometheus
//! endpoint, HZ times a second, as an operator's monitoring would. The
//! table then shows whether that costs the tunnel anything.

use anyhow::{Context, Result};
use espgate_api::control::Client;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where a gateway's metrics endpoint listens in its namespace.
pub const METRICS: &str = "127.0.0.1:9184";

/// One gateway to scrape: its network namespace and control socket.
#[derive(Debug, Clone)]
pub struct Target {
    /// The gateway's namespace (its metrics endpoint is on loopback there).
    pub ns: String,
    /// Its control socket (a file: reachable from any namespace).
    pub socket: PathBuf,
}

/// Scrapes in progress; [`Scraper::stop`] ends them.
pub struct Scraper {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Result<u64>>>,
}

/// Moves this thread into network namespace `ns` (`ip netns` names it
/// under /var/run/netns).
fn enter_netns(ns: &str) -> Result<()> {
    let path = format!("/var/run/netns/{ns}");
    let f = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    rustix::thread::move_into_link_name_space(
        f.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .with_context(|| format!("entering network namespace {ns}"))
}

/// One `GET /metrics`; the answer must be a 200 (OpenMetrics text, or the
/// 0.0.4 text of older builds).
pub fn fetch_metrics(addr: SocketAddr) -> Result<usize> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: espgate\r\n\r\n")?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    anyhow::ensure!(
        out.starts_with(b"HTTP/1.1 200 ") && out.windows(9).any(|w| w == b"espgate_s"),
        "not a metrics answer ({} bytes)",
        out.len()
    );
    Ok(out.len())
}

impl Scraper {
    /// Starts scraping every target `hz` times a second.
    pub fn start(targets: &[Target], hz: u32) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let period = Duration::from_secs(1) / hz.max(1);
        let threads = targets
            .iter()
            .cloned()
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || -> Result<u64> {
                    enter_netns(&t.ns)?;
                    let client = Client::new(&t.socket, Duration::from_secs(2));
                    let addr: SocketAddr = METRICS.parse()?;
                    let mut done = 0;
                    let mut next = Instant::now();
                    // Bounded by the stop flag, which the caller sets when
                    // its test ends.
                    while !stop.load(Ordering::Relaxed) {
                        client
                            .status()
                            .map_err(|e| anyhow::anyhow!("{}: {e}", t.ns))?;
                        fetch_metrics(addr).with_context(|| format!("{}: metrics", t.ns))?;
                        done += 1;
                        next += period;
                        std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    }
                    Ok(done)
                })
            })
            .collect();
        Scraper { stop, threads }
    }

    /// Stops and returns how many scrapes (status and metrics, per gateway)
    /// were done, or the first failure.
    pub fn stop(self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = 0;
        let mut first_err = None;
        for t in self.threads {
            match t.join() {
                Ok(Ok(n)) => total += n,
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(anyhow::anyhow!("a scrape thread panicked"));
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }
}
