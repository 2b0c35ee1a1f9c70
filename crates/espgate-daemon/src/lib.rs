//! The gateway daemon, `espgate up -c FILE`: static SAs from the
//! configuration, clear traffic on a TUN device, ESP/AH on a UDP socket
//! (RFC 3948) or raw IP sockets, a control socket for `espgate status`
//! and `espgate sa list`.
//!
//! - [`engine`]: SAD + SPD from the configuration, the outbound and
//!   inbound packet paths, counters, status documents (no I/O but the
//!   sequence-number state files);
//! - [`dataplane`]: the single `poll(2)` loop that moves packets between
//!   the TUN and the sockets;
//! - [`setup`]: TUN MTU, addresses, routes and policy rules, through the
//!   undo journal [`crate::netdev::NetChanges`];
//! - [`sockets`] / [`sys`]: the outer sockets and the synthetic outer
//!   headers inbound packets get for the core;
//! - [`seqstate`]: outbound sequence numbers reserved on disk, so that a
//!   restart never reuses a nonce (TCP MSS clamping is
//!   [`espgate_core::mss`]);
//! - [`control`] / [`status`]: the control socket protocol and the
//!   `status` / `sa list` views (`sa add` / `sa del` are
//!   [`engine::Engine::add_sa`] / [`engine::Engine::del_sa`]);
//!   [`wireshark`]: the `esp_sa` keys of `espgate wireshark-keys`;
//!   [`ratelimit`]: per-reason log limiting;
//!   [`signals`]: SIGINT/SIGTERM/SIGHUP as a descriptor;
//! - [`metrics`]: the Prometheus endpoint (`gateway.metrics`), served from
//!   the same loop; [`daemon`]: `espgate up --daemon` (fork, readiness
//!   report to the parent), the pid file, systemd's `READY=1`.
//!
//! Several data-plane workers (`gateway.workers`): one TUN queue, one
//! `SO_REUSEPORT` UDP socket and one engine each; ESP-in-UDP is steered to
//! worker `SPI % n` by a classic BPF program, outbound SA copies share one
//! sequence counter ([`espgate_core::sa::SharedSeq`]). Not built yet: IKE. ICMP "fragmentation needed" / "packet too big"
//! for inner packets larger than the tunnel comes from the kernel, since
//! the TUN MTU is the outer MTU minus the SA overhead.

pub mod alloc_count;
pub mod control;
pub mod daemon;
pub mod dataplane;
pub mod engine;
pub mod ike;
pub mod metrics;
pub mod netdev;
pub mod ratelimit;
pub mod seqstate;
pub mod setup;
pub mod signals;
pub mod sockets;
pub mod sys;

use crate::netdev::{NetChanges, Offloads, Tun};
use anyhow::{Context, Result};
use dataplane::{Info, Sockets, Worker};
use espgate_config::{Encapsulation, LoadedConfig};
use espgate_core::wire::proto;
use std::os::fd::AsFd;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Transmit queue length of the TUN device: packets routed into the
/// tunnel and not read yet.
const TUN_TXQUEUELEN: u32 = 10_000;

/// `fragment_inner = false` (every connection agrees; config checks it):
/// the TUN gets the outer MTU and the kernel fragments oversized outer
/// UDP datagrams instead of the inner packets.
fn fragments_outer(cfg: &LoadedConfig) -> bool {
    cfg.connections.iter().any(|c| !c.fragment_inner)
}

/// Opens the outer sockets of `n` workers: per worker one ESP-in-UDP
/// socket (with several workers, `SO_REUSEPORT` sockets steered by SPI;
/// if the kernel refuses the steering program, fewer sockets come back
/// and the gateway runs one worker) and raw senders; the raw receivers go
/// to worker 0 alone.
fn open_worker_sockets(cfg: &LoadedConfig, n: usize) -> Result<Vec<Sockets>> {
    let mut all = Vec::with_capacity(n);
    for k in 0..n {
        all.push(open_sockets(cfg, k, n > 1)?);
    }
    if n > 1 {
        if let Some(u) = &all[0].udp {
            if let Err(e) = u.steer_by_spi(n as u32) {
                tracing::warn!(
                    "gateway.workers = {n}: the kernel refused the SPI steering program \
                     (SO_ATTACH_REUSEPORT_CBPF: {e}); running one data-plane worker"
                );
                // Close every reuseport socket before binding a plain one.
                all.clear();
                all.push(open_sockets(cfg, 0, false)?);
            }
        }
    }
    Ok(all)
}

/// Opens the outer sockets worker `k` needs.
fn open_sockets(cfg: &LoadedConfig, k: usize, reuseport: bool) -> Result<Sockets> {
    let g = &cfg.gateway;
    let mut s = Sockets::default();
    if cfg
        .connections
        .iter()
        .any(|c| c.encap == Encapsulation::Udp)
    {
        s.udp = Some(
            sockets::UdpSock::open_with(g.listen, g.fwmark, fragments_outer(cfg), reuseport)
                .with_context(|| format!("opening UDP socket on {}", g.listen))?,
        );
    }
    let mut rx: Vec<(bool, u8)> = Vec::new();
    for c in cfg
        .connections
        .iter()
        .filter(|c| c.encap == Encapsulation::None)
    {
        let v6 = c.local.is_ipv6();
        // The outermost header: AH for "ah" and "esp+ah".
        let p = if c.protocol.has_ah() {
            proto::AH
        } else {
            proto::ESP
        };
        if !rx.contains(&(v6, p)) {
            rx.push((v6, p));
        }
        let tx = if v6 { &mut s.raw_tx6 } else { &mut s.raw_tx4 };
        if tx.is_none() {
            *tx =
                Some(sockets::RawTx::open(v6, g.fwmark).with_context(|| {
                    format!("opening raw IPv{} socket", if v6 { 6 } else { 4 })
                })?);
        }
    }
    if k > 0 {
        rx.clear();
    }
    for (v6, p) in rx {
        s.raw_rx.push(sockets::RawRx::open(v6, p).with_context(|| {
            format!(
                "opening raw IPv{} socket for protocol {p}",
                if v6 { 6 } else { 4 }
            )
        })?);
    }
    Ok(s)
}

/// Runs the gateway in the foreground until SIGINT, SIGTERM or SIGHUP,
/// then undoes every network change, removes the control socket and
/// records the exact outbound sequence numbers.
pub fn run(cfg: LoadedConfig) -> Result<()> {
    run_with(cfg, &mut || Ok(()))
}

/// [`run`], calling `on_ready` once everything is up (TUN, routes, rules,
/// sockets, metrics endpoint, control socket), just before the loop
/// starts: `espgate up` writes its pid file and reports readiness there.
/// An error from it stops the gateway the same way as a failed start.
pub fn run_with(cfg: LoadedConfig, on_ready: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    let start = Instant::now();
    let signals = signals::Signals::block().context("blocking SIGINT/SIGTERM/SIGHUP")?;
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    let g = &cfg.gateway;
    // Refuse early, before touching the network, if a daemon runs.
    control::check_not_running(&g.control_socket)?;
    sockets::set_buffer_size(g.socket_buffer);
    // The sockets first: whether several workers are possible depends on
    // the kernel accepting their steering program.
    let worker_sockets = open_worker_sockets(&cfg, g.worker_threads().max(1))?;
    let n = worker_sockets.len();
    let store = seqstate::SeqStore::open(&g.state_dir)?;
    let mut engines = engine::Engine::for_workers(&cfg, Some(&store), Duration::ZERO, n)?;
    let overhead = if fragments_outer(&cfg) {
        tracing::info!(
            "fragment_inner = false: TUN MTU = gateway.mtu; ESP-in-UDP datagrams larger than \
             the path are fragmented by the kernel (outer fragmentation)"
        );
        0
    } else {
        engines[0].max_overhead()
    };
    let plan = setup::plan(&cfg, overhead)?;
    // Dropped in reverse order on any error below: control socket removed,
    // sockets closed, network changes undone, then the TUN deleted.
    let (tun, tun_offloads) = open_tun(&g.tun, g.offloads, n)?;
    // Room for bursts that arrive while the worker waits for a CPU (the
    // default of 500 packets overflows at 64 B on a busy machine).
    if let Err(e) = crate::netdev::netlink::Netlink::open()
        .and_then(|mut nl| nl.set_txqueuelen(tun.name(), TUN_TXQUEUELEN))
    {
        tracing::warn!("{e}; keeping the kernel's default queue length");
    }
    let mut net = NetChanges::new()?;
    setup::apply(&plan, &mut net)?;
    if let Some(w) = setup::rp_filter_warning(&cfg) {
        tracing::warn!("{w}");
    }
    let mut metrics = match g.metrics {
        Some(addr) => Some(
            metrics::MetricsServer::bind(addr)
                .with_context(|| format!("gateway.metrics = \"{addr}\": cannot listen"))?,
        ),
        None => None,
    };
    let mut ike = ike::IkeShell::open(&cfg, worker_sockets[0].udp.as_ref().map(|u| u.local))?;
    if ike.is_some() {
        if let Some(e) = engines.first_mut() {
            e.ike_enabled = true;
        }
    }
    let mut control = control::ControlServer::bind(&g.control_socket)?;
    tracing::info!(
        "espgate {} up: TUN {} mtu {}, {} connection(s), {} SA(s), {} data-plane worker(s), \
         control socket {}{}",
        env!("CARGO_PKG_VERSION"),
        tun.name(),
        plan.mtu,
        engines[0].conns().len(),
        engines.iter().map(|e| e.sad().len()).max().unwrap_or(0),
        n,
        control.path().display(),
        metrics
            .as_ref()
            .map(|m| format!(", metrics on http://{}/metrics", m.local_addr()))
            .unwrap_or_default()
    );
    for d in net.describe() {
        tracing::debug!("{d}");
    }
    let info = Info {
        config: cfg.source.clone(),
        tun: espgate_api::status::TunStatus {
            name: tun.name().to_string(),
            mtu: plan.mtu,
        },
        encap: g.encap.name().to_string(),
        listen: worker_sockets[0].udp.as_ref().map(|u| u.local),
        fwmark: g.fwmark,
        state_dir: store.dir().display().to_string(),
        offloads: tun_offload_names(&tun, tun_offloads),
        offloads_wanted: g.offloads,
    };
    let engines: Vec<Mutex<engine::Engine>> = engines.into_iter().map(Mutex::new).collect();
    let failed = AtomicBool::new(false);
    let vnet = tun.has_vnet_hdr();
    let batch = g.batch;
    let result = on_ready().and_then(|()| {
        // Workers 1.. stop when this pipe's write end closes.
        let (stop_rd, stop_wr) = daemon::pipe().context("creating the workers' stop pipe")?;
        std::thread::scope(|scope| {
            let mut handles = Vec::new();
            let queues = tun.queues().iter().zip(&worker_sockets).enumerate();
            for (k, (tunq, socks)) in queues.skip(1) {
                let (engines, failed, info) = (&engines, &failed, info.clone());
                let stop = stop_rd.as_fd();
                let h = std::thread::Builder::new()
                    .name(format!("espgate-worker-{k}"))
                    .spawn_scoped(scope, move || {
                        Worker {
                            engines,
                            me: k,
                            tun: tunq,
                            vnet,
                            sockets: socks,
                            control: None,
                            metrics: None,
                            signals: None,
                            stop: Some(stop),
                            failed,
                            start,
                            info,
                            batch,
                            gro_allowed: false,
                            ike: None,
                        }
                        .run()
                    })
                    .context("starting a data-plane worker thread")?;
                handles.push(h);
            }
            let r = Worker {
                engines: &engines,
                me: 0,
                tun: &tun.queues()[0],
                vnet,
                sockets: &worker_sockets[0],
                control: Some(&mut control),
                metrics: metrics.as_mut(),
                signals: Some(&signals),
                stop: None,
                failed: &failed,
                start,
                info,
                batch,
                gro_allowed: n == 1,
                ike: ike.as_mut(),
            }
            .run();
            drop(stop_wr);
            for (k, h) in handles.into_iter().enumerate() {
                match h.join() {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::error!("data-plane worker {}: {e:#}", k + 1),
                    Err(_) => tracing::error!("data-plane worker {} panicked", k + 1),
                }
            }
            r.map(drop)
        })
    });
    for e in &engines {
        dataplane::lock(e).release_reservations();
    }
    drop(control);
    drop(metrics);
    drop(worker_sockets);
    let undone = net.undo();
    drop(tun);
    if let Err(e) = &undone {
        tracing::error!("{e}");
    }
    result?;
    undone?;
    tracing::info!("stopped; network changes undone");
    Ok(())
}

/// Opens the TUN device; with `gateway.offloads`, with a vnet header and
/// the checksum and TCP/UDP segmentation offloads the kernel accepts
/// (probed flag by flag). A kernel that refuses the vnet header gets a
/// plain device: offloads are an optimisation, never a reason not to start.
fn open_tun(name: &str, offloads: bool, queues: usize) -> Result<(Tun, Offloads)> {
    let builder = || {
        let b = Tun::builder(name).nonblocking(true);
        if queues > 1 {
            b.multi_queue(queues)
        } else {
            b
        }
    };
    if offloads {
        match builder().vnet_hdr(true).open() {
            Ok(mut tun) => match tun.set_offloads(Offloads::tcp_udp_gso()) {
                Ok(got) => {
                    tracing::debug!("TUN {name}: offloads {got}");
                    return Ok((tun, got));
                }
                Err(e) => {
                    tracing::warn!("{e}; using the TUN device without offloads");
                    return Ok((tun, Offloads::NONE));
                }
            },
            Err(e) => tracing::warn!("{e}; retrying without a vnet header (no TUN offloads)"),
        }
    }
    let tun = builder().open().context("opening the TUN device")?;
    Ok((tun, Offloads::NONE))
}

/// The TUN offloads in use, as `espgate status` lists them: `tun_vnet_hdr`
/// (coalesced TCP written back as one super-segment), `tun_csum`,
/// `tun_tso4`, `tun_tso6`, `tun_uso`.
fn tun_offload_names(tun: &Tun, got: Offloads) -> Vec<String> {
    let mut v = Vec::new();
    if !tun.has_vnet_hdr() {
        return v;
    }
    v.push("tun_vnet_hdr".to_string());
    for (flag, name) in [
        (Offloads::CSUM, "tun_csum"),
        (Offloads::TSO4, "tun_tso4"),
        (Offloads::TSO6, "tun_tso6"),
        (Offloads::USO4 | Offloads::USO6, "tun_uso"),
    ] {
        if got.contains(flag) {
            v.push(name.to_string());
        }
    }
    v
}
