//! The data-plane thread: one `poll(2)` loop over the signal descriptor,
//! the TUN, the outer sockets and the control socket. Two preallocated
//! [`PacketBuf`]s (one per direction) carry every packet; nothing is
//! allocated per packet on the forwarding path.

use crate::control::{error_response, ControlServer, Request};
use crate::engine::Engine;
use crate::metrics::MetricsServer;
use crate::netdev::{TunQueue, VirtioNetHdr, VNET_HDR_LEN};
use crate::signals::{self, Signals};
use crate::sockets::{push_ipv6_outer, push_udp_outer, RawRx, RawTx, UdpSock};
use crate::sys;
use anyhow::{Context, Result};
use espgate_api::costs::Dir;
use espgate_api::status::{Status, TunStatus};
use espgate_config::Encapsulation;
use espgate_core::offload::{self, GsoInfo, GsoKind, Push, Segmenter, TcpCoalescer};
use espgate_core::wire::{ip, proto, udp};
use espgate_core::DropReason;
use espgate_core::PacketBuf;
use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Largest packet read from any descriptor (an IPv4/UDP datagram or a TUN
/// packet with the largest MTU).
pub const MAX_PACKET: usize = 65_535;
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
    /// Offloads in use (filled in by [`Dataplane::run`]).
    pub offloads: Vec<String>,
    /// `gateway.offloads`.
    pub offloads_wanted: bool,
}

/// Most datagrams in one `UDP_SEGMENT` send (the kernel's limit is 64 on
/// older kernels).
const GSO_MAX: usize = 64;
/// Most bytes in one `UDP_SEGMENT` send (one UDP datagram's worth).
const GSO_BYTES: usize = 65_000;
/// Receive buffer for one (possibly GRO-coalesced) UDP read.
const GRO_BUF: usize = 65_535;

/// Outbound ESP-in-UDP datagrams waiting to leave in one GSO send: the
/// packets stay in their own buffers (no copy), `run` says where each
/// UDP payload lies. All go to `dst` with `tos`; all have `seg` bytes but
/// the last, which may be shorter (then the run is `closed`).
struct TxBatch {
    bufs: Vec<PacketBuf>,
    run: [(usize, usize); GSO_MAX],
    n: usize,
    dst: SocketAddr,
    tos: u8,
    seg: usize,
    bytes: usize,
    closed: bool,
    /// False once the kernel refused a GSO send: one datagram per send.
    gso: bool,
    /// Most datagrams per send (`gateway.batch`, at most [`GSO_MAX`]).
    max: usize,
}

impl TxBatch {
    fn new(gso: bool, max: usize) -> TxBatch {
        TxBatch {
            // Room for a TUN read with its virtio-net header, so that no
            // buffer ever grows on the hot path.
            bufs: (0..GSO_MAX)
                .map(|_| PacketBuf::with_capacity(MAX_PACKET + VNET_HDR_LEN))
                .collect(),
            run: [(0, 0); GSO_MAX],
            n: 0,
            dst: SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
            tos: 0,
            seg: 0,
            bytes: 0,
            closed: false,
            gso,
            max: max.clamp(1, GSO_MAX),
        }
    }

    /// Can the datagram of `len` bytes to `dst`/`tos` join the run?
    fn fits(&self, dst: SocketAddr, tos: u8, len: usize) -> bool {
        self.n == 0
            || (self.gso
                && !self.closed
                && self.n < self.max
                && dst == self.dst
                && tos == self.tos
                && len <= self.seg
                && self.bytes + len <= GSO_BYTES)
    }
}

/// One data-plane worker: its TUN queue and sockets, its engine (locked
/// by it for each round of packets; the control socket locks it briefly to
/// read or change it), and, on worker 0 only, the control socket, the
/// metrics endpoint and the stop signals.
pub struct Worker<'a> {
    /// Every worker's engine; this worker's is `engines[me]`.
    pub engines: &'a [Mutex<Engine>],
    /// This worker's index.
    pub me: usize,
    /// This worker's TUN queue.
    pub tun: &'a TunQueue,
    /// The TUN device carries virtio-net headers.
    pub vnet: bool,
    /// Outer side.
    pub sockets: &'a Sockets,
    /// Control socket (worker 0).
    pub control: Option<&'a mut ControlServer>,
    /// The Prometheus endpoint (`gateway.metrics`; worker 0).
    pub metrics: Option<&'a mut MetricsServer>,
    /// Stop signals (worker 0).
    pub signals: Option<&'a Signals>,
    /// Workers other than 0: becomes readable (hang-up) when they must stop.
    pub stop: Option<BorrowedFd<'a>>,
    /// Set by a worker that failed; worker 0 then stops them all.
    pub failed: &'a AtomicBool,
    /// When the daemon started (the core's clock is the time since).
    pub start: Instant,
    /// For status answers.
    pub info: Info,
    /// Packets per descriptor per round, and most datagrams per GSO send
    /// (`gateway.batch`).
    pub batch: usize,
    /// UDP GRO may be asked for (one worker: the SPI steering of several
    /// needs each datagram on its own).
    pub gro_allowed: bool,
    /// The IKEv2 engine (worker 0, when a connection uses IKE).
    pub ike: Option<&'a mut crate::ike::IkeShell>,
}

/// Locks an engine; one whose holder panicked is still consistent enough
/// to report status and stop.
pub fn lock(e: &Mutex<Engine>) -> MutexGuard<'_, Engine> {
    e.lock().unwrap_or_else(PoisonError::into_inner)
}

/// IKE messages from the NAT-T socket waiting for the IKE engine, at most.
const IKE_QUEUE_MAX: usize = 256;

/// The packet handlers, for one round, with the worker's engine locked.
struct Dataplane<'a> {
    engine: &'a mut Engine,
    tun: &'a TunQueue,
    vnet: bool,
    tun_name: &'a str,
    sockets: &'a Sockets,
    start: Instant,
    batch: usize,
}

impl<'a> Worker<'a> {
    /// The packet handlers over `engine` (this worker's, locked).
    fn handlers<'g>(&self, engine: &'g mut Engine, tun_name: &'g str) -> Dataplane<'g>
    where
        'a: 'g,
    {
        Dataplane {
            engine,
            tun: self.tun,
            vnet: self.vnet,
            tun_name,
            sockets: self.sockets,
            start: self.start,
            batch: self.batch,
        }
    }

    /// Runs until a stop signal (worker 0: returns its number) or, on
    /// other workers, until told to stop (returns 0).
    pub fn run(&mut self) -> Result<libc::c_int> {
        let r = self.run_inner();
        if r.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        r
    }

    fn run_inner(&mut self) -> Result<libc::c_int> {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(64);
        let mut in_buf = PacketBuf::with_capacity(MAX_PACKET);
        let mut gro_buf = vec![0u8; GRO_BUF];
        let offloads = self.info.offloads_wanted;
        let gro = offloads
            && self.gro_allowed
            && self.sockets.udp.as_ref().is_some_and(|u| u.enable_gro());
        let mut tx = TxBatch::new(offloads && self.sockets.udp.is_some(), self.batch);
        // With a vnet header: the super-segment being cut (TSO/USO reads)
        // and the TCP segments being coalesced for the TUN.
        let mut seg_src = PacketBuf::with_capacity(MAX_PACKET + VNET_HDR_LEN);
        let mut co = TcpCoalescer::new();
        // When each connection last sent something (NAT keepalives).
        let mut last_tx = vec![Duration::ZERO; lock(&self.engines[self.me]).conns().len()];
        if tx.gso {
            self.info.offloads.push("udp_gso".into());
        }
        if gro {
            self.info.offloads.push("udp_gro".into());
        }
        let tun_name = self.info.tun.name.clone();
        let mut next_tick = Instant::now() + TICK;
        let pfd = |fd: i32| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            fds.clear();
            let sig_at = fds.len();
            if let Some(s) = self.signals {
                fds.push(pfd(s.as_fd().as_raw_fd()));
            }
            if let Some(s) = self.stop {
                fds.push(pfd(s.as_raw_fd()));
            }
            let tun_at = fds.len();
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
            if let Some(c) = &self.control {
                c.poll_fds(&mut fds);
            }
            let met_at = fds.len();
            if let Some(m) = &self.metrics {
                m.poll_fds(&mut fds);
            }
            let ike_at = fds.len();
            let mut wake = next_tick;
            if let Some(ike) = &self.ike {
                fds.push(pfd(ike.fd().as_raw_fd()));
                if let Some(t) = ike.next_timeout() {
                    wake = wake.min(self.start + t);
                }
            }
            let wait = wake.saturating_duration_since(Instant::now());
            let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(1000) + 1;
            sys::poll(&mut fds, wait_ms).context("poll")?;

            if fds[sig_at].revents != 0 {
                match self.signals {
                    Some(s) => {
                        if let Some(sig) = s.next() {
                            tracing::info!("{}: stopping", signals::name(sig));
                            return Ok(sig);
                        }
                    }
                    None => return Ok(0),
                }
            }
            {
                let mut guard = lock(&self.engines[self.me]);
                let mut dp = self.handlers(&mut guard, &tun_name);
                // The packet handlers are the hot path: allocations in them
                // are counted (`hot_path_allocs`), and there should be none.
                let hot = crate::alloc_count::hot();
                if fds[tun_at].revents != 0 {
                    dp.on_tun(&mut tx, &mut last_tx, &mut seg_src)?;
                }
                if dp.sockets.udp.is_some() && fds[udp_at].revents != 0 {
                    dp.on_udp(&mut gro_buf, &mut in_buf, &mut co);
                }
                let sockets = dp.sockets;
                for (i, r) in sockets.raw_rx.iter().enumerate() {
                    if fds[raw_at + i].revents != 0 {
                        dp.on_raw(r, &mut in_buf, &mut co);
                    }
                }
                drop(hot);
            }
            if let Some(ike) = self.ike.as_deref_mut() {
                let now = self.start.elapsed();
                if fds.get(ike_at).is_some_and(|p| p.revents != 0) {
                    ike.on_readable(now);
                }
                ike.start(now);
                let mut queue = std::mem::take(&mut lock(&self.engines[self.me]).ike_rx);
                ike.pump(&mut queue, self.engines, self.sockets.udp.as_ref(), now);
                // Keep the (empty) queue's allocation.
                lock(&self.engines[self.me]).ike_rx = queue;
            }
            let ctl = &fds[ctl_at..met_at];
            let now_i = Instant::now();
            let tick = now_i >= next_tick;
            if let Some(control) = self.control.as_deref_mut() {
                if tick || ctl.iter().any(|p| p.revents != 0) {
                    let (engines, info) = (self.engines, &self.info);
                    let now = self.start.elapsed();
                    let mut ike = self.ike.as_deref_mut();
                    control.service(
                        if tick && ctl.iter().all(|p| p.revents == 0) {
                            &[]
                        } else {
                            ctl
                        },
                        |r| answer_with_ike(engines, info, ike.as_deref_mut(), now, r),
                    );
                }
            }
            let met = &fds[met_at..ike_at];
            if let Some(m) = self.metrics.as_deref_mut() {
                if tick || met.iter().any(|p| p.revents != 0) {
                    let (engines, info) = (self.engines, &self.info);
                    let now = self.start.elapsed();
                    let ike = self.ike.as_deref();
                    m.service(met, || {
                        let mut s = status_all(engines, info, now);
                        s.ike = ike.map(|i| i.doc(now));
                        crate::metrics::render(&s)
                    });
                }
            }
            if tick {
                let now = self.start.elapsed();
                let mut guard = lock(&self.engines[self.me]);
                guard.tick(now);
                if self.me == 0 {
                    let mut dp = self.handlers(&mut guard, &tun_name);
                    dp.keepalives(&mut last_tx);
                }
                drop(guard);
                if self.signals.is_some() && self.failed.load(Ordering::SeqCst) {
                    anyhow::bail!("a data-plane worker stopped on an error (see above)");
                }
                next_tick = now_i + TICK;
            }
        }
    }
}

impl Dataplane<'_> {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Reads and protects up to `batch` (`gateway.batch`) packets from the TUN. ESP-in-UDP
    /// datagrams to one peer are gathered into GSO runs and leave in one
    /// send each (seed 000's interrupt coalescing, done with system calls);
    /// raw ESP/AH leaves at once. On a vnet-header device one read may be a
    /// TCP/UDP super-segment (TSO/USO): it is cut into MTU-sized packets
    /// here, each protected and batched like a packet read alone. A read
    /// error other than "nothing waiting" means the device is gone (e.g.
    /// deleted by hand): the daemon stops, undoing what it can.
    fn on_tun(
        &mut self,
        tx: &mut TxBatch,
        last_tx: &mut [Duration],
        seg_src: &mut PacketBuf,
    ) -> Result<()> {
        let vnet = self.vnet;
        let room = MAX_PACKET + if vnet { VNET_HDR_LEN } else { 0 };
        let mut result = Ok(());
        for _ in 0..self.batch {
            let buf = &mut tx.bufs[tx.n];
            let t = self.engine.cost_clock();
            let n = match self.tun.read(buf.prepare(room)) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    result =
                        Err(e).with_context(|| format!("reading TUN device {}", self.tun_name));
                    break;
                }
            };
            buf.truncate(n);
            self.engine.cost_received(t, Dir::Outbound);
            if !vnet {
                self.protect(tx, last_tx);
                continue;
            }
            let now = self.now();
            let Some(h) = VirtioNetHdr::parse(buf.as_slice()) else {
                self.engine.counters.tun_rx += 1;
                self.engine.drop_packet(DropReason::BadOffload, now, || {
                    format!("TUN read of {n} bytes: shorter than a virtio-net header")
                });
                continue;
            };
            buf.trim_front(VNET_HDR_LEN);
            let Some(info) = gso_info(&h) else {
                self.engine.counters.tun_rx += 1;
                self.engine.drop_packet(DropReason::BadOffload, now, || {
                    format!("TUN read with an unknown GSO type {:#x}", h.gso_type)
                });
                continue;
            };
            if info.kind == GsoKind::None {
                if info.needs_csum {
                    let (at, off) = (usize::from(info.csum_start), usize::from(info.csum_offset));
                    if let Err(d) = offload::complete_checksum(buf.as_mut_slice(), at, off) {
                        self.engine.counters.tun_rx += 1;
                        self.engine.drop_packet(d, now, || {
                            format!("TUN packet with a partial checksum at {at}+{off}")
                        });
                        continue;
                    }
                }
                self.protect(tx, last_tx);
                continue;
            }
            // A super-segment: cut it from a buffer of its own into the
            // batch's slots.
            std::mem::swap(&mut tx.bufs[tx.n], seg_src);
            let mut segs = match Segmenter::new(seg_src.as_slice(), &info) {
                Ok(s) => s,
                Err(d) => {
                    self.engine.counters.tun_rx += 1;
                    self.engine.drop_packet(d, now, || {
                        format!("TUN super-segment of {} bytes ({h:?})", seg_src.len())
                    });
                    continue;
                }
            };
            self.engine.counters.tso_reads += 1;
            while let Some(r) = segs.next_into(&mut tx.bufs[tx.n]) {
                if let Err(d) = r {
                    self.engine.counters.tun_rx += 1;
                    self.engine
                        .drop_packet(d, now, || "cutting a TUN super-segment".into());
                    break;
                }
                self.protect(tx, last_tx);
            }
        }
        self.flush(tx, self.now());
        result
    }

    /// Protects the clear packet in the batch's next slot and adds it to
    /// the GSO run (or sends it at once: raw ESP/AH, no GSO).
    fn protect(&mut self, tx: &mut TxBatch, last_tx: &mut [Duration]) {
        let buf = &mut tx.bufs[tx.n];
        let now = self.now();
        let Some(ci) = self.engine.outbound(buf, now) else {
            return;
        };
        if let Some(t) = last_tx.get_mut(ci) {
            *t = now;
        }
        let c = &self.engine.conns()[ci].conn;
        let (encap, remote, port) = (c.encap, c.remote, c.remote_port);
        let udp = match (encap, udp_payload(tx.bufs[tx.n].as_slice())) {
            (Encapsulation::Udp, Some(x)) if self.sockets.udp.is_some() => x,
            _ => {
                let i = tx.n;
                self.send_one(encap, remote, port, &tx.bufs[i], now);
                return;
            }
        };
        let ((start, end), tos) = udp;
        let dst = SocketAddr::new(remote, port);
        let len = end - start;
        if !tx.fits(dst, tos, len) {
            // Flush the run; this packet starts the next one in slot 0.
            let i = tx.n;
            self.flush(tx, now);
            tx.bufs.swap(0, i);
        }
        if tx.n == 0 {
            (tx.dst, tx.tos, tx.seg, tx.bytes, tx.closed) = (dst, tos, len, 0, false);
        }
        tx.run[tx.n] = (start, end);
        tx.n += 1;
        tx.bytes += len;
        tx.closed = len < tx.seg;
        if tx.n >= tx.max || !tx.gso {
            self.flush(tx, now);
        }
    }

    /// RFC 3948 §2.3: a one-byte 0xFF datagram to each ESP-in-UDP peer
    /// that has not been sent anything for `nat_keepalive`, so that a NAT
    /// on the way keeps its mapping. The peer ignores it.
    fn keepalives(&mut self, last_tx: &mut [Duration]) {
        let Some(u) = &self.sockets.udp else { return };
        let now = self.now();
        let mut sent = 0;
        for (ci, c) in self.engine.conns().iter().enumerate() {
            let c = &c.conn;
            let every = c.nat_keepalive;
            if c.encap != Encapsulation::Udp || every.is_zero() || ci >= last_tx.len() {
                continue;
            }
            if now.saturating_sub(last_tx[ci]) < every {
                continue;
            }
            last_tx[ci] = now;
            let dst = SocketAddr::new(c.remote, c.remote_port);
            match u.send(&[0xff], dst, 0) {
                Ok(_) => sent += 1,
                Err(e) => tracing::debug!("NAT keepalive to {dst}: {e}"),
            }
        }
        self.engine.counters.keepalives_sent += sent;
    }

    /// Sends the gathered run: one GSO send, or one datagram at a time if
    /// the kernel refuses GSO (then never tried again).
    fn flush(&mut self, tx: &mut TxBatch, now: Duration) {
        let n = std::mem::take(&mut tx.n);
        if n == 0 {
            return;
        }
        let Some(u) = &self.sockets.udp else { return };
        let t = self.engine.cost_clock();
        if n > 1 && tx.gso {
            let mut iov = [io::IoSlice::new(&[]); GSO_MAX];
            for (i, &(s, e)) in tx.run[..n].iter().enumerate() {
                iov[i] = io::IoSlice::new(&tx.bufs[i].as_slice()[s..e]);
            }
            match u.send_gso(&iov[..n], tx.seg as u16, tx.dst, tx.tos) {
                Ok(_) => {
                    self.engine.counters.net_tx += n as u64;
                    self.engine.counters.gso_sends += 1;
                    self.engine.cost_sent(t, Dir::Outbound, n);
                    return;
                }
                // No GSO on this kernel or device: never again.
                Err(e)
                    if e.raw_os_error().is_some_and(|c| {
                        [libc::EIO, libc::ENOPROTOOPT, libc::EOPNOTSUPP].contains(&c)
                    }) =>
                {
                    tracing::warn!(
                        "UDP GSO refused by the kernel ({e}); sending one datagram per call"
                    );
                    tx.gso = false;
                }
                // This run only: e.g. segments larger than the path MTU
                // (fragment_inner = false), which GSO cannot fragment.
                Err(e)
                    if e.raw_os_error()
                        .is_some_and(|c| [libc::EINVAL, libc::EMSGSIZE].contains(&c)) =>
                {
                    tracing::debug!("UDP GSO send refused ({e}); sending this run one by one");
                }
                Err(e) => {
                    let dst = tx.dst;
                    for _ in 0..n {
                        self.engine.drop_packet(DropReason::SendError, now, || {
                            format!("sending to {dst}: {e}")
                        });
                    }
                    return;
                }
            }
        }
        for (i, &(s, e)) in tx.run[..n].iter().enumerate() {
            match u.send(&tx.bufs[i].as_slice()[s..e], tx.dst, tx.tos) {
                Ok(_) => self.engine.counters.net_tx += 1,
                Err(err) => {
                    let dst = tx.dst;
                    self.engine.drop_packet(DropReason::SendError, now, || {
                        format!("sending to {dst}: {err}")
                    })
                }
            }
        }
        self.engine.cost_sent(t, Dir::Outbound, n);
    }

    fn send_one(
        &mut self,
        encap: Encapsulation,
        remote: IpAddr,
        port: u16,
        buf: &PacketBuf,
        now: Duration,
    ) {
        let pkt = buf.as_slice();
        let sockets = self.sockets;
        let t = self.engine.cost_clock();
        let r = match encap {
            Encapsulation::Udp => match (udp_payload(pkt), &sockets.udp) {
                (Some(((s, e), tos)), Some(u)) => {
                    u.send(&pkt[s..e], SocketAddr::new(remote, port), tos)
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
        self.engine.cost_sent(t, Dir::Outbound, 1);
        match r {
            Ok(_) => self.engine.counters.net_tx += 1,
            Err(e) => self.engine.drop_packet(DropReason::SendError, now, || {
                format!("sending to {remote}: {e}")
            }),
        }
    }

    /// Hands a decrypted inner packet to the TUN. On a vnet-header device
    /// consecutive TCP segments of one flow are coalesced into one
    /// super-segment first (written by [`Dataplane::flush_tun`] when the
    /// flow changes or the batch ends): one write, one pass up the kernel's
    /// stack for many segments.
    fn deliver(&mut self, pkt: &[u8], co: &mut TcpCoalescer, now: Duration) {
        if !self.vnet {
            self.write_tun(None, pkt, 1, now);
            return;
        }
        match co.push(pkt) {
            Push::Absorbed => return,
            Push::FlushFirst => {
                self.flush_tun(co, now);
                if co.push(pkt) == Push::Absorbed {
                    return;
                }
            }
            Push::Ineligible => self.flush_tun(co, now),
        }
        self.write_tun(Some(&VirtioNetHdr::default()), pkt, 1, now);
    }

    /// Writes the coalesced super-segment, if any.
    fn flush_tun(&mut self, co: &mut TcpCoalescer, now: Duration) {
        let Some((pkt, info, segs)) = co.take() else {
            return;
        };
        let h = VirtioNetHdr {
            flags: if info.needs_csum {
                VirtioNetHdr::F_NEEDS_CSUM
            } else {
                0
            },
            gso_type: match info.kind {
                GsoKind::None => VirtioNetHdr::GSO_NONE,
                GsoKind::TcpV4 => VirtioNetHdr::GSO_TCPV4,
                GsoKind::TcpV6 => VirtioNetHdr::GSO_TCPV6,
                GsoKind::UdpL4 => VirtioNetHdr::GSO_UDP_L4,
            },
            hdr_len: info.hdr_len,
            gso_size: info.gso_size,
            csum_start: info.csum_start,
            csum_offset: info.csum_offset,
        };
        if segs > 1 {
            self.engine.counters.tun_gso_writes += 1;
        }
        self.write_tun(Some(&h), pkt, segs, now);
    }

    /// One TUN write of `pkt` (`segs` inner packets), after `vnet` on a
    /// vnet-header device.
    fn write_tun(&mut self, vnet: Option<&VirtioNetHdr>, pkt: &[u8], segs: usize, now: Duration) {
        let t = self.engine.cost_clock();
        let r = match vnet {
            Some(h) => {
                let h = h.to_bytes();
                self.tun
                    .write_parts(&[io::IoSlice::new(&h), io::IoSlice::new(pkt)])
            }
            None => self.tun.write(pkt),
        };
        self.engine.cost_sent(t, Dir::Inbound, segs);
        match r {
            Ok(_) => self.engine.counters.tun_tx += segs as u64,
            Err(e) => {
                for _ in 0..segs {
                    self.engine.drop_packet(DropReason::TunWrite, now, || {
                        format!("writing to {}: {e}", self.tun_name)
                    })
                }
            }
        }
    }

    /// Receives up to `batch` (`gateway.batch`) reads from the UDP socket; with `UDP_GRO`
    /// one read may hold many datagrams of one sender, cut at the segment
    /// size the kernel reports. Each is copied into `buf` (which has the
    /// headroom for the synthetic outer header the core expects) and
    /// processed alone.
    fn on_udp(&mut self, gro_buf: &mut [u8], buf: &mut PacketBuf, co: &mut TcpCoalescer) {
        let sockets = self.sockets;
        let Some(u) = &sockets.udp else { return };
        let listen = u.local;
        for _ in 0..self.batch {
            let t = self.engine.cost_clock();
            let (n, meta) = match u.recv(gro_buf) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ICMP errors reported on the socket (port unreachable
                    // from a peer that is down) and the like.
                    tracing::debug!("UDP receive: {e}");
                    continue;
                }
            };
            self.engine.cost_received(t, Dir::Inbound);
            let unspecified = if listen.is_ipv6() {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            } else {
                IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
            };
            let src = meta.src.unwrap_or(SocketAddr::new(unspecified, 0));
            let dst = SocketAddr::new(meta.dst.unwrap_or(listen.ip()), listen.port());
            let seg = meta.gro_size.map_or(n, usize::from).max(1);
            if n > seg {
                self.engine.counters.gro_reads += 1;
            }
            for d in gro_buf[..n].chunks(seg) {
                let now = self.now();
                if self.engine.ike_enabled && d.len() > 4 && d[..4] == [0; 4] {
                    // IKE behind the non-ESP marker (RFC 3948 §2.2): for the
                    // IKE engine (not the hot path; allocating is fine).
                    self.engine.counters.net_rx += 1;
                    self.engine.counters.ike += 1;
                    if self.engine.ike_rx.len() >= IKE_QUEUE_MAX {
                        self.engine.drop_packet(DropReason::IkeQueueFull, now, || {
                            format!("IKE message from {src}: {IKE_QUEUE_MAX} already waiting")
                        });
                        continue;
                    }
                    let src = SocketAddr::new(src.ip().to_canonical(), src.port());
                    let dst = SocketAddr::new(dst.ip().to_canonical(), dst.port());
                    self.engine.ike_rx.push((dst, src, d[4..].to_vec()));
                    continue;
                }
                buf.load(d);
                if let Err(e) = push_udp_outer(buf, src, dst, meta.tos.unwrap_or(0)) {
                    self.engine.counters.net_rx += 1;
                    self.engine.drop_packet(e, now, || {
                        format!("datagram from {src} ({} bytes)", d.len())
                    });
                    continue;
                }
                if self.engine.inbound(buf, now, src.ip()) {
                    self.deliver(buf.as_slice(), co, now);
                }
            }
        }
        self.flush_tun(co, self.now());
    }

    fn on_raw(&mut self, r: &RawRx, buf: &mut PacketBuf, co: &mut TcpCoalescer) {
        for _ in 0..self.batch {
            let t = self.engine.cost_clock();
            let (n, meta) = match r.recv(buf.prepare(MAX_PACKET)) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("raw receive: {e}");
                    continue;
                }
            };
            self.engine.cost_received(t, Dir::Inbound);
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
                        .drop_packet(d, now, || format!("packet from {from} ({n} bytes)"));
                    continue;
                }
            }
            if self.engine.inbound(buf, now, from) {
                self.deliver(buf.as_slice(), co, now);
            }
        }
        self.flush_tun(co, self.now());
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
        per_worker: Vec::new(),
        offloads: info.offloads.clone(),
        state_dir: info.state_dir.clone(),
        connections: engine.connection_status(now),
        drops: engine.drops(),
        counters: engine.counter_map(),
        costs: engine.costs_report(),
        ike: None,
    }
}

/// The status of all workers: worker 0's document with the others'
/// counters, drops and per-SA numbers added ([`Status::merge_worker`]).
pub fn status_all(engines: &[Mutex<Engine>], info: &Info, now: Duration) -> Status {
    let mut s = status_doc(&lock(&engines[0]), info, now);
    let per = |st: &Status| -> BTreeMap<String, u64> {
        ["tun_rx", "net_rx"]
            .iter()
            .map(|k| (k.to_string(), st.counters.get(*k).copied().unwrap_or(0)))
            .collect()
    };
    let mut per_worker = vec![per(&s)];
    for e in &engines[1..] {
        let other = status_doc(&lock(e), info, now);
        per_worker.push(per(&other));
        s.merge_worker(&other);
    }
    if engines.len() > 1 {
        s.per_worker = per_worker;
    }
    // A process-wide count, not a per-worker one.
    s.counters
        .insert("hot_path_allocs".into(), crate::alloc_count::hot_allocs());
    s.workers = engines.len();
    s
}

/// [`answer`], with the IKE commands (`initiate`, `terminate`) and the
/// IKE SAs in `status`.
pub fn answer_with_ike(
    engines: &[Mutex<Engine>],
    info: &Info,
    ike: Option<&mut crate::ike::IkeShell>,
    now: Duration,
    req: &Request,
) -> String {
    match (req.cmd.as_str(), ike) {
        ("initiate" | "terminate", None) => error_response(
            "no connection of this gateway uses IKE (add a [connection.ike] table to the \
             configuration)",
        ),
        ("initiate" | "terminate", Some(ike)) => {
            let Some(name) = req.conn.as_deref() else {
                return error_response("initiate/terminate need \"conn\": the connection's name");
            };
            let r = if req.cmd == "initiate" {
                ike.initiate(now, name)
            } else {
                ike.terminate(now, name)
            };
            match r {
                Ok(message) => serde_json::json!({"ok": true, "message": message}).to_string(),
                Err(e) => error_response(&e.to_string()),
            }
        }
        ("status", Some(ike)) => {
            let mut s = status_all(engines, info, now);
            s.ike = Some(ike.doc(now));
            serde_json::json!({"ok": true, "status": s}).to_string()
        }
        _ => answer(engines, info, now, req),
    }
}

/// The answer to one control request, over every worker's engine.
pub fn answer(engines: &[Mutex<Engine>], info: &Info, now: Duration, req: &Request) -> String {
    if engines.len() == 1 {
        return answer_one(&mut lock(&engines[0]), info, now, req);
    }
    match req.cmd.as_str() {
        "status" => {
            let s = status_all(engines, info, now);
            serde_json::json!({"ok": true, "status": s}).to_string()
        }
        "sa_list" => {
            let s = status_all(engines, info, now);
            let sas: Vec<_> = s.connections.into_iter().flat_map(|c| c.sas).collect();
            serde_json::json!({"ok": true, "sas": sas}).to_string()
        }
        "wireshark_keys" => {
            let mut sas = Vec::new();
            for e in engines {
                for k in lock(e).sa_keys() {
                    if !sas.contains(&k) {
                        sas.push(k);
                    }
                }
            }
            tracing::info!(
                "wireshark_keys: {} SA keys handed out on the control socket",
                sas.len()
            );
            serde_json::json!({"ok": true, "sas": sas}).to_string()
        }
        "sa_add" | "sa_del" | "costs" => change_all(engines, now, req),
        _ => answer_one(&mut lock(&engines[0]), info, now, req),
    }
}

/// `sa_add`, `sa_del`, `costs` on every worker's engine, worker 0 first:
/// its answer is the answer (an added outbound SA then shares worker 0's
/// sequence counter and reservation; an added inbound SA stays only with
/// the worker its SPI is steered to). `sa_del` succeeds when some worker
/// held the SA (an inbound SA lives in one worker only).
fn change_all(engines: &[Mutex<Engine>], now: Duration, req: &Request) -> String {
    let ok = |a: &str| serde_json::from_str::<serde_json::Value>(a).is_ok_and(|v| v["ok"] == true);
    let first = crate::engine::admin_answer(&mut lock(&engines[0]), now, req);
    if req.cmd == "sa_add" && !ok(&first) {
        return first;
    }
    let mut answers = vec![first];
    for e in &engines[1..] {
        answers.push(crate::engine::admin_answer(&mut lock(e), now, req));
    }
    if req.cmd == "sa_add" {
        let n = engines.len();
        if let Some(a) = answers.iter().find(|a| !ok(a)) {
            tracing::error!("sa add: worker engines disagree: {a}");
        }
        let mut guards: Vec<MutexGuard<'_, Engine>> = engines.iter().map(lock).collect();
        for (k, g) in guards.iter_mut().enumerate() {
            g.keep_own_inbound(k, n);
        }
        let (first, rest) = guards.split_at_mut(1);
        let mut rest: Vec<&mut Engine> = rest.iter_mut().map(|g| &mut **g).collect();
        if let Err(e) = first[0].link_worker_refs(&mut rest, None) {
            tracing::error!("sa add: {e:#}");
            return error_response(&format!("{e:#}"));
        }
    }
    if req.cmd == "sa_del" {
        if let Some(a) = answers.iter().find(|a| ok(a)) {
            return a.clone();
        }
    }
    answers.swap_remove(0)
}

/// The answer to one control request, with one engine.
pub fn answer_one(engine: &mut Engine, info: &Info, now: Duration, req: &Request) -> String {
    match req.cmd.as_str() {
        "status" => {
            let s = status_doc(engine, info, now);
            serde_json::json!({"ok": true, "status": s}).to_string()
        }
        "sa_list" => serde_json::json!({"ok": true, "sas": engine.sa_list(now)}).to_string(),
        "sa_add" | "sa_del" | "wireshark_keys" | "costs" => {
            crate::engine::admin_answer(engine, now, req)
        }
        other => error_response(&format!(
            "unknown command {other:?}; the commands are status, sa_list, sa_add, sa_del, \
             wireshark_keys, costs, initiate and terminate"
        )),
    }
}

/// Where the UDP payload of an outer IPv4/IPv6 UDP packet lies, and its
/// DS byte.
fn udp_payload(pkt: &[u8]) -> Option<((usize, usize), u8)> {
    let info = ip::parse(pkt).ok()?;
    if info.protocol != proto::UDP {
        return None;
    }
    let at = info.payload_offset + udp::HEADER_LEN;
    (at <= info.packet_len && info.packet_len <= pkt.len())
        .then_some(((at, info.packet_len), info.tos))
}

/// The core's view of a virtio-net header read from the TUN; `None` for a
/// GSO type the data plane does not handle (UFO, ECN-marked TSO is handled
/// like plain TSO: the CWR flag is in the TCP header it copies).
fn gso_info(h: &VirtioNetHdr) -> Option<GsoInfo> {
    let kind = match h.gso_type & !VirtioNetHdr::GSO_ECN {
        VirtioNetHdr::GSO_NONE => GsoKind::None,
        VirtioNetHdr::GSO_TCPV4 => GsoKind::TcpV4,
        VirtioNetHdr::GSO_TCPV6 => GsoKind::TcpV6,
        VirtioNetHdr::GSO_UDP_L4 => GsoKind::UdpL4,
        _ => return None,
    };
    Some(GsoInfo {
        kind,
        needs_csum: h.flags & VirtioNetHdr::F_NEEDS_CSUM != 0,
        hdr_len: h.hdr_len,
        gso_size: h.gso_size,
        csum_start: h.csum_start,
        csum_offset: h.csum_offset,
    })
}
