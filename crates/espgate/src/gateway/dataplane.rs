//! The data-plane thread: one `poll(2)` loop over the signal descriptor,
//! the TUN, the outer sockets and the control socket. Two preallocated
//! [`PacketBuf`]s (one per direction) carry every packet; nothing is
//! allocated per packet on the forwarding path.

use super::control::{error_response, ControlServer, Request};
use super::engine::{Engine, GwDrop};
use super::metrics::MetricsServer;
use super::signals::{self, Signals};
use super::sockets::{push_ipv6_outer, push_udp_outer, RawRx, RawTx, UdpSock};
use super::status::{Status, TunStatus};
use super::sys;
use crate::config::Encapsulation;
use crate::netdev::Tun;
use anyhow::{Context, Result};
use espgate_core::wire::{ip, proto, udp};
use espgate_core::PacketBuf;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

/// Largest packet read from any descriptor (an IPv4/UDP datagram or a TUN
/// packet with the largest MTU).
pub const MAX_PACKET: usize = 65_535;
/// Packets handled per ready descriptor before polling again, so that no
/// direction (or the control socket) starves.
const BATCH: usize = 64;
/// Timer period: SA lifetimes, rate-limited log summaries, control clients.
const TICK: Duration = Duration::from_secs(1);

/// The outer sockets.
#[derive(Debug, Default)]
pub struct Sockets {
    /// ESP-in-UDP, when a connection uses it.
    pub udp: Option<UdpSock>,
    /// Raw ESP/AH receivers.
    pub raw_rx: Vec<RawRx>,
    /// Raw senders for IPv4 and IPv6.
    pub raw_tx4: Option<RawTx>,
    /// See `raw_tx4`.
    pub raw_tx6: Option<RawTx>,
}

/// Static facts shown by `espgate status`.
#[derive(Debug, Clone)]
pub struct Info {
    /// The configuration file.
    pub config: String,
    /// TUN name and MTU.
    pub tun: TunStatus,
    /// `gateway.encap`.
    pub encap: String,
    /// The UDP listen address, when open.
    pub listen: Option<SocketAddr>,
    /// `gateway.fwmark`.
    pub fwmark: Option<u32>,
    /// `gateway.state_dir`.
    pub state_dir: String,
}

/// Everything the loop works on.
pub struct Dataplane<'a> {
    /// Packet logic.
    pub engine: &'a mut Engine,
    /// Clear side.
    pub tun: &'a Tun,
    /// Outer side.
    pub sockets: &'a Sockets,
    /// Control socket.
    pub control: &'a mut ControlServer,
    /// The Prometheus endpoint (`gateway.metrics`), when configured.
    pub metrics: Option<&'a mut MetricsServer>,
    /// Stop signals.
    pub signals: &'a Signals,
    /// When the daemon started (the core's clock is the time since).
    pub start: Instant,
    /// For status answers.
    pub info: Info,
}

impl Dataplane<'_> {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Runs until a stop signal; returns its number.
    pub fn run(&mut self) -> Result<libc::c_int> {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(64);
        let mut out_buf = PacketBuf::with_capacity(MAX_PACKET);
        let mut in_buf = PacketBuf::with_capacity(MAX_PACKET);
        let mut next_tick = Instant::now() + TICK;
        let pfd = |fd: i32| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            fds.clear();
            fds.push(pfd(self.signals.as_fd().as_raw_fd()));
            fds.push(pfd(self.tun.as_raw_fd()));
            let udp_at = fds.len();
            if let Some(u) = &self.sockets.udp {
                fds.push(pfd(u.as_fd().as_raw_fd()));
            }
            let raw_at = fds.len();
            for r in &self.sockets.raw_rx {
                fds.push(pfd(r.as_fd().as_raw_fd()));
            }
            let ctl_at = fds.len();
            self.control.poll_fds(&mut fds);
            let met_at = fds.len();
            if let Some(m) = &self.metrics {
                m.poll_fds(&mut fds);
            }
            let wait = next_tick.saturating_duration_since(Instant::now());
            let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(1000) + 1;
            sys::poll(&mut fds, wait_ms).context("poll")?;

            if fds[0].revents != 0 {
                if let Some(sig) = self.signals.next() {
                    tracing::info!("{}: stopping", signals::name(sig));
                    return Ok(sig);
                }
            }
            if fds[1].revents != 0 {
                self.on_tun(&mut out_buf)?;
            }
            if self.sockets.udp.is_some() && fds[udp_at].revents != 0 {
                self.on_udp(&mut in_buf);
            }
            let sockets = self.sockets;
            for (i, r) in sockets.raw_rx.iter().enumerate() {
                if fds[raw_at + i].revents != 0 {
                    self.on_raw(r, &mut in_buf);
                }
            }
            let ctl = &fds[ctl_at..met_at];
            let now_i = Instant::now();
            let tick = now_i >= next_tick;
            if tick || ctl.iter().any(|p| p.revents != 0) {
                let engine = &mut *self.engine;
                let info = &self.info;
                let now = self.start.elapsed();
                self.control.service(
                    if tick && ctl.iter().all(|p| p.revents == 0) {
                        &[]
                    } else {
                        ctl
                    },
                    |r| answer(engine, info, now, r),
                );
            }
            let met = &fds[met_at..];
            if let Some(m) = self.metrics.as_deref_mut() {
                if tick || met.iter().any(|p| p.revents != 0) {
                    let (engine, info) = (&*self.engine, &self.info);
                    let now = self.start.elapsed();
                    m.service(met, || {
                        super::metrics::render(&status_doc(engine, info, now))
                    });
                }
            }
            if tick {
                self.engine.tick(self.now());
                next_tick = now_i + TICK;
            }
        }
    }

    /// Reads and protects up to [`BATCH`] packets from the TUN. A read
    /// error other than "nothing waiting" means the device is gone (e.g.
    /// deleted by hand): the daemon stops, undoing what it can.
    fn on_tun(&mut self, buf: &mut PacketBuf) -> Result<()> {
        for _ in 0..BATCH {
            let n = match self.tun.read(buf.prepare(MAX_PACKET)) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("reading TUN device {}", self.tun.name()))
                }
            };
            buf.truncate(n);
            let now = self.now();
            if let Some(ci) = self.engine.outbound(buf, now) {
                self.send(ci, buf, now);
            }
        }
        Ok(())
    }

    fn send(&mut self, ci: usize, buf: &PacketBuf, now: Duration) {
        let c = &self.engine.conns()[ci].conn;
        let (encap, remote, port) = (c.encap, c.remote, c.remote_port);
        let pkt = buf.as_slice();
        let sockets = self.sockets;
        let r = match encap {
            Encapsulation::Udp => match (ip::parse(pkt), &sockets.udp) {
                (Ok(info), Some(u)) if info.protocol == proto::UDP => {
                    let at = info.payload_offset + udp::HEADER_LEN;
                    match pkt.get(at..info.packet_len) {
                        Some(payload) => u.send(payload, SocketAddr::new(remote, port), info.tos),
                        None => Err(io::Error::other("bad outer packet")),
                    }
                }
                _ => Err(io::Error::other("no UDP socket or bad outer packet")),
            },
            Encapsulation::None => {
                let tx = if remote.is_ipv6() {
                    &sockets.raw_tx6
                } else {
                    &sockets.raw_tx4
                };
                match tx {
                    Some(tx) => tx.send(pkt, remote),
                    None => Err(io::Error::other("no raw socket for this family")),
                }
            }
        };
        match r {
            Ok(_) => self.engine.counters.net_tx += 1,
            Err(e) => self.engine.gw_drop(GwDrop::SendError, now, || {
                format!("sending to {remote}: {e}")
            }),
        }
    }

    fn write_tun(&mut self, buf: &PacketBuf, now: Duration) {
        match self.tun.write(buf.as_slice()) {
            Ok(_) => self.engine.counters.tun_tx += 1,
            Err(e) => self.engine.gw_drop(GwDrop::TunWrite, now, || {
                format!("writing to {}: {e}", self.tun.name())
            }),
        }
    }

    fn on_udp(&mut self, buf: &mut PacketBuf) {
        let sockets = self.sockets;
        let Some(u) = &sockets.udp else { return };
        let listen = u.local;
        for _ in 0..BATCH {
            let (n, meta) = match u.recv(buf.prepare(MAX_PACKET)) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ICMP errors reported on the socket (port unreachable
                    // from a peer that is down) and the like.
                    tracing::debug!("UDP receive: {e}");
                    continue;
                }
            };
            buf.truncate(n);
            let now = self.now();
            let unspecified = if listen.is_ipv6() {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            } else {
                IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
            };
            let src = meta.src.unwrap_or(SocketAddr::new(unspecified, 0));
            let dst = SocketAddr::new(meta.dst.unwrap_or(listen.ip()), listen.port());
            if let Err(d) = push_udp_outer(buf, src, dst, meta.tos.unwrap_or(0)) {
                self.engine.counters.net_rx += 1;
                self.engine
                    .core_drop(d, now, || format!("datagram from {src} ({n} bytes)"));
                continue;
            }
            if self.engine.inbound(buf, now, src.ip()) {
                self.write_tun(buf, now);
            }
        }
    }

    fn on_raw(&mut self, r: &RawRx, buf: &mut PacketBuf) {
        for _ in 0..BATCH {
            let (n, meta) = match r.recv(buf.prepare(MAX_PACKET)) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("raw receive: {e}");
                    continue;
                }
            };
            buf.truncate(n);
            let now = self.now();
            let from = meta
                .src
                .map_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED), |s| s.ip());
            if r.v6 {
                let v6 = |a: Option<IpAddr>| match a {
                    Some(IpAddr::V6(v)) => v,
                    _ => Ipv6Addr::UNSPECIFIED,
                };
                let dst = v6(meta.dst);
                if let Err(d) =
                    push_ipv6_outer(buf, v6(Some(from)), dst, r.proto, meta.tos.unwrap_or(0))
                {
                    self.engine.counters.net_rx += 1;
                    self.engine
                        .core_drop(d, now, || format!("packet from {from} ({n} bytes)"));
                    continue;
                }
            }
            if self.engine.inbound(buf, now, from) {
                self.write_tun(buf, now);
            }
        }
    }
}

/// The `status` document (`espgate status`, and the metrics endpoint's
/// source).
pub fn status_doc(engine: &Engine, info: &Info, now: Duration) -> Status {
    Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        pid: std::process::id(),
        uptime_secs: now.as_secs(),
        config: info.config.clone(),
        tun: info.tun.clone(),
        encap: info.encap.clone(),
        listen: info.listen.map(|l| l.to_string()),
        fwmark: info.fwmark,
        workers: 1,
        state_dir: info.state_dir.clone(),
        connections: engine.connection_status(now),
        drops: engine.drops(),
        counters: engine.counter_map(),
    }
}

/// The answer to one control request.
pub fn answer(engine: &mut Engine, info: &Info, now: Duration, req: &Request) -> String {
    match req.cmd.as_str() {
        "status" => {
            let s = status_doc(engine, info, now);
            serde_json::json!({"ok": true, "status": s}).to_string()
        }
        "sa_list" => serde_json::json!({"ok": true, "sas": engine.sa_list(now)}).to_string(),
        "sa_add" | "sa_del" | "wireshark_keys" => super::engine::admin_answer(engine, now, req),
        other => error_response(&format!(
            "unknown command {other:?}; the commands are status, sa_list, sa_add, sa_del and \
             wireshark_keys"
        )),
    }
}
