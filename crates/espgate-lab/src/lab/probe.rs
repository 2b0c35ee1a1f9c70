//! A constant-rate UDP probe between two namespaces: what seed 002 used
//! MGEN for (a VoIP-like stream of small datagrams at a fixed rate), with
//! the delivered rate, loss, one-way latency and jitter of the stream.
//!
//! The sender and the receiver are threads of this process that enter
//! their namespaces (`setns`) before opening their sockets, so both read
//! one monotonic clock: the one-way latency is exact, with no clock
//! synchronisation (MGEN needed NTP for it). iperf3 reports jitter and
//! loss but not one-way latency, hence this small tool; it measures one
//! stream and needs nothing installed.

use anyhow::{anyhow, bail, Context, Result};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// What one probe run saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeResult {
    /// Datagrams sent.
    pub sent: u64,
    /// Distinct datagrams received.
    pub received: u64,
    /// Delivered payload rate, kbit/s (received × payload × 8 / duration).
    pub kbps: f64,
    /// Datagrams lost, % of those sent.
    pub loss_pct: f64,
    /// Mean one-way latency of the received datagrams, ms.
    pub latency_ms: f64,
    /// 99th percentile of the one-way latency, ms.
    pub p99_ms: f64,
    /// Interarrival jitter (RFC 3550 §6.4.1), ms.
    pub jitter_ms: f64,
}

/// The stream to send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stream {
    /// UDP payload bytes (at least 16: sequence number and timestamp).
    pub payload: usize,
    /// Datagrams per second.
    pub pps: u32,
    /// Seconds of sending.
    pub secs: f64,
    /// Destination port (what a classifier matches).
    pub port: u16,
}

/// A UDP socket bound to `addr` inside namespace `ns` (the calling
/// thread enters it), with a 50 ms read timeout and, when given, a receive
/// buffer of `rcvbuf` bytes (forced: root may exceed `rmem_max`). The
/// outcome also goes to `ready`, so that the thread that started this one
/// knows when to begin sending.
pub(super) fn bind_in(
    ns: &str,
    addr: SocketAddrV4,
    rcvbuf: Option<usize>,
    ready: &mpsc::Sender<Result<()>>,
) -> Result<UdpSocket> {
    let sock = (|| -> Result<UdpSocket> {
        enter(ns)?;
        let sock = UdpSocket::bind(addr).with_context(|| format!("binding {addr} in {ns}"))?;
        if let Some(n) = rcvbuf {
            rustix::net::sockopt::set_socket_recv_buffer_size_force(&sock, n)?;
        }
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        Ok(sock)
    })();
    let _ = ready.send(sock.as_ref().map(|_| ()).map_err(|e| anyhow!("{e:#}")));
    sock
}

/// Moves the calling thread into network namespace `ns`.
pub(crate) fn enter(ns: &str) -> Result<()> {
    let f = std::fs::File::open(format!("/run/netns/{ns}"))
        .with_context(|| format!("opening namespace {ns}"))?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&f),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .with_context(|| format!("entering namespace {ns}"))
}

/// Sends `s` from namespace `from` to `to_addr` in namespace `to` and
/// measures what arrives.
pub fn run(from: &str, to: &str, to_addr: Ipv4Addr, s: Stream) -> Result<ProbeResult> {
    if s.payload < 16 {
        bail!(
            "a probe datagram carries 16 bytes of its own; {} is too small",
            s.payload
        );
    }
    if s.pps == 0 || s.secs <= 0.0 {
        bail!("the probe needs a rate and a duration");
    }
    let n = (f64::from(s.pps) * s.secs).round().max(1.0) as u64;
    let base = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
    let to_ns = to.to_string();
    let stop_rx = stop.clone();
    let receiver = std::thread::spawn(move || -> Result<Vec<(u64, u64, u64)>> {
        let sock = bind_in(&to_ns, SocketAddrV4::new(to_addr, s.port), None, &ready_tx)?;
        // (sequence, sent ns, received ns), preallocated for the run.
        let mut got = Vec::with_capacity(n as usize + 16);
        let mut buf = [0u8; 2048];
        while !stop_rx.load(Ordering::Relaxed) {
            match sock.recv(&mut buf) {
                Ok(len) if len >= 16 => {
                    let now = base.elapsed().as_nanos() as u64;
                    let seq = u64::from_be_bytes(buf[0..8].try_into().expect("8 bytes"));
                    let sent = u64::from_be_bytes(buf[8..16].try_into().expect("8 bytes"));
                    if got.len() < got.capacity() {
                        got.push((seq, sent, now));
                    }
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(got)
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .map_err(|_| anyhow!("the probe receiver did not start"))??;
    let from_ns = from.to_string();
    let sender = std::thread::spawn(move || -> Result<u64> {
        enter(&from_ns)?;
        let sock = UdpSocket::bind("0.0.0.0:0")?;
        sock.connect(SocketAddrV4::new(to_addr, s.port))
            .with_context(|| format!("connecting to {to_addr}:{} from {from_ns}", s.port))?;
        let mut buf = vec![0u8; s.payload];
        let start = Instant::now();
        let gap = Duration::from_secs_f64(1.0 / f64::from(s.pps));
        // Attempted datagrams: one that the socket refuses is lost.
        let mut sent = 0;
        for i in 0..n {
            if crate::netlab::interrupted() {
                break;
            }
            sent += 1;
            let due = start + gap * u32::try_from(i).unwrap_or(u32::MAX);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            buf[0..8].copy_from_slice(&i.to_be_bytes());
            let ts = base.elapsed().as_nanos() as u64;
            buf[8..16].copy_from_slice(&ts.to_be_bytes());
            // A full queue or an unreachable peer loses the datagram: the
            // receiver counts it lost.
            let _ = sock.send(&buf);
        }
        Ok(sent)
    });
    let sent = sender
        .join()
        .map_err(|_| anyhow!("the probe sender panicked"))??;
    // Late datagrams: half a second after the last one left.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let got = receiver
        .join()
        .map_err(|_| anyhow!("the probe receiver panicked"))??;
    Ok(summarize(sent, s, &got))
}

/// The result of a run from what was received: (sequence, sent ns,
/// received ns) in arrival order.
pub fn summarize(sent: u64, s: Stream, got: &[(u64, u64, u64)]) -> ProbeResult {
    let mut seen = std::collections::HashSet::with_capacity(got.len());
    let mut lat = Vec::with_capacity(got.len());
    let mut jitter = 0.0f64;
    let mut prev_transit: Option<f64> = None;
    for &(seq, tx, rx) in got {
        if seq >= sent || !seen.insert(seq) {
            continue;
        }
        let transit = rx.saturating_sub(tx) as f64 / 1e6;
        lat.push(transit);
        if let Some(p) = prev_transit {
            jitter += ((transit - p).abs() - jitter) / 16.0;
        }
        prev_transit = Some(transit);
    }
    let received = lat.len() as u64;
    lat.sort_by(f64::total_cmp);
    let mean = if lat.is_empty() {
        0.0
    } else {
        lat.iter().sum::<f64>() / lat.len() as f64
    };
    let p99 = if lat.is_empty() {
        0.0
    } else {
        lat[((lat.len() as f64 * 0.99).ceil() as usize).clamp(1, lat.len()) - 1]
    };
    ProbeResult {
        sent,
        received,
        kbps: received as f64 * s.payload as f64 * 8.0 / s.secs / 1000.0,
        loss_pct: if sent == 0 {
            0.0
        } else {
            (sent - received.min(sent)) as f64 / sent as f64 * 100.0
        },
        latency_ms: mean,
        p99_ms: p99,
        jitter_ms: jitter,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_loss_latency_jitter_and_ignores_duplicates() {
        let s = Stream {
            payload: 128,
            pps: 100,
            secs: 1.0,
            port: 5004,
        };
        // 100 sent; 0..90 arrive 2 ms after leaving, seq 5 twice, one
        // sequence number out of range.
        let mut got: Vec<(u64, u64, u64)> = (0..90)
            .map(|i| (i, i * 10_000_000, i * 10_000_000 + 2_000_000))
            .collect();
        got.push((5, 50_000_000, 52_000_000));
        got.push((1000, 0, 1));
        let r = summarize(100, s, &got);
        assert_eq!((r.sent, r.received), (100, 90));
        assert!((r.loss_pct - 10.0).abs() < 1e-9);
        assert!((r.kbps - 90.0 * 128.0 * 8.0 / 1000.0).abs() < 1e-9);
        assert!((r.latency_ms - 2.0).abs() < 1e-9 && (r.p99_ms - 2.0).abs() < 1e-9);
        assert!(r.jitter_ms.abs() < 1e-9, "constant transit: no jitter");
        // Alternating 1 ms and 3 ms transit: jitter grows toward 2 ms.
        let got: Vec<(u64, u64, u64)> = (0..100)
            .map(|i| {
                (
                    i,
                    i * 10_000_000,
                    i * 10_000_000 + if i % 2 == 0 { 1 } else { 3 } * 1_000_000,
                )
            })
            .collect();
        let r = summarize(100, s, &got);
        assert!(r.jitter_ms > 1.9 && r.jitter_ms <= 2.0, "{}", r.jitter_ms);
        assert!((r.p99_ms - 3.0).abs() < 1e-9);
        assert_eq!(summarize(10, s, &[]).loss_pct, 100.0);
    }
}
