//! The gateway daemon, `espgate up -c FILE`: clear traffic on a TUN
//! device, ESP/AH on a UDP socket (RFC 3948) or raw IP sockets, SAs from the
//! configuration or negotiated by IKEv2, a control socket and a metrics
//! endpoint.
//!
//! Threads: one per data-plane worker ([`worker`]: its TUN queue, its
//! sockets, its engine — the core's sans-IO [`espgate_core::gateway`]) and
//! the control thread ([`control`]: control socket, metrics, IKE, stop
//! signals), which reads the workers' counters without stopping them.
//!
//! - [`setup`]: TUN MTU, addresses, routes and policy rules, through the
//!   undo journal [`netdev::NetChanges`];
//! - [`sockets`] / [`sys`]: the outer sockets and the synthetic outer
//!   headers inbound packets get for the core;
//! - [`leases`]: outbound sequence numbers reserved on disk and extended off
//!   the packet path, so a restart never reuses a nonce;
//! - [`status`]: the status document from the workers' counters;
//! - [`ratelimit`]: log limiting; [`signals`]: SIGINT/SIGTERM/SIGHUP as a
//!   descriptor; [`daemon`]: `espgate up --daemon` (fork, readiness report
//!   to the parent), the pid file, systemd's `READY=1`; [`alloc_count`]:
//!   hot-path allocation accounting.
//!
//! Several data-plane workers (`gateway.workers`): one TUN queue, one
//! `SO_REUSEPORT` UDP socket and one engine each; ESP-in-UDP is steered to
//! worker `SPI % n` by a classic BPF program, outbound SA copies share one
//! sequence counter. ICMP "fragmentation needed" / "packet too big" for
//! inner packets larger than the tunnel comes from the kernel, since the
//! TUN MTU is the longest packet the SAs keep within the outer MTU.

pub mod alloc_count;
pub mod control;
pub mod daemon;
pub mod leases;
pub mod netdev;
pub mod ratelimit;
pub mod setup;
pub mod signals;
pub mod sockets;
pub mod spifilter;
pub mod status;
pub mod sys;
pub mod worker;

use crate::netdev::{NetChanges, Offloads, Tun};
use anyhow::{Context, Result};
use control::{Control, ControlSocket, Listeners, MetricsListener};
use espgate_api::costs::{ClockKind, CostCells, CostsView};
use espgate_api::status::TunStatus;
use espgate_config::{Encapsulation, LoadedConfig};
use espgate_core::gateway::{Engine, EngineOptions};
use espgate_core::wire::proto;
use espgate_ike::config::QespMode;
use std::os::fd::AsFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use worker::{Sockets, Worker};

/// IKE messages from the NAT-T socket waiting for the IKE engine, at most.
const IKE_QUEUE_MAX: usize = 256;

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
        s.udp = Some(Arc::new(
            sockets::UdpSock::open_with(g.listen, g.fwmark, fragments_outer(cfg), reuseport)
                .with_context(|| format!("opening UDP socket on {}", g.listen))?,
        ));
    }
    let mut rx: Vec<(bool, u8)> = Vec::new();
    for c in cfg
        .connections
        .iter()
        .filter(|c| c.encap == Encapsulation::None)
    {
        let v6 = c.local.is_ipv6();
        // The outermost header: AH for "ah" and "esp+ah"; Q-ESP on the
        // gateway's number for it. An IKE connection receives what it may
        // negotiate: ESP unless qesp = "require", Q-ESP unless "off".
        let qesp = c.ike().map_or(QespMode::Off, |i| i.qesp);
        let protocols: &[u8] = if c.protocol().has_ah() {
            &[proto::AH]
        } else if c.protocol() == espgate_config::Protocols::Qesp {
            &[g.qesp_protocol]
        } else {
            match qesp {
                QespMode::Off => &[proto::ESP],
                QespMode::Prefer => &[proto::ESP, g.qesp_protocol],
                QespMode::Require => &[g.qesp_protocol],
            }
        };
        for &p in protocols {
            if !rx.contains(&(v6, p)) {
                rx.push((v6, p));
            }
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
/// sockets, metrics endpoint, control socket), just before the threads
/// start: `espgate up` writes its pid file and reports readiness there. An
/// error from it stops the gateway the same way as a failed start.
pub fn run_with(cfg: LoadedConfig, on_ready: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    run_hooked(cfg, on_ready, &mut || {})
}

/// [`run_with`], also calling `on_stopping` when a stop was asked for
/// (signal, failed worker) while the workers still forward: a cluster
/// node's agent leaves the cluster there, so that the other nodes take
/// over its share before it stops processing.
pub fn run_hooked(
    cfg: LoadedConfig,
    on_ready: &mut dyn FnMut() -> Result<()>,
    on_stopping: &mut dyn FnMut(),
) -> Result<()> {
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
    let leases = Arc::new(
        leases::DiskLeases::new(leases::SeqStore::open(&g.state_dir)?)
            .context("starting the sequence-number writer")?,
    );
    let specs: Vec<_> = cfg
        .connections
        .iter()
        .map(espgate_config::Connection::spec)
        .collect();
    let opts = EngineOptions {
        mtu: g.mtu,
        classifier: espgate_core::sa::Classifier::new()
            .udp_port(g.listen.port())
            .qesp(g.qesp_protocol),
        leases: Some(leases.clone()),
        cluster: cfg
            .cluster
            .as_ref()
            .map(|c| espgate_core::gateway::ClusterOptions {
                node: c.node,
                dispatch: c.dispatch,
                hold: c.hold,
            }),
    };
    let engines =
        Engine::for_workers(&specs, &opts, Duration::ZERO, n).map_err(anyhow::Error::msg)?;
    drop(specs);
    let overhead = if fragments_outer(&cfg) {
        tracing::info!(
            "fragment_inner = false: TUN MTU = gateway.mtu; ESP-in-UDP datagrams larger than \
             the path are fragmented by the kernel (outer fragmentation)"
        );
        0
    } else {
        // What the tightest bundle takes from gateway.mtu, its padding
        // counted exactly (`Engine::tun_mtu`).
        let outer = cfg.gateway.mtu;
        usize::from(outer).saturating_sub(engines[0].tun_mtu(outer) as usize)
    };
    let plan = setup::plan(&cfg, overhead)?;
    // Dropped in reverse order on any error below: control socket removed,
    // sockets closed, network changes undone, then the TUN deleted.
    let (tun, tun_offloads) = open_tun(&g.tun, g.offloads, n)?;
    // Room for bursts that arrive while the worker waits for a CPU (the
    // default of 500 packets overflows at 64 B on a busy machine).
    if let Err(e) = netdev::netlink::Netlink::open()
        .and_then(|mut nl| nl.set_txqueuelen(tun.name(), TUN_TXQUEUELEN))
    {
        tracing::warn!("{e}; keeping the kernel's default queue length");
    }
    let mut net = NetChanges::new()?;
    setup::apply(&plan, &mut net)?;
    if let Some(w) = setup::rp_filter_warning(&cfg) {
        tracing::warn!("{w}");
    }
    for w in setup::cluster_order_warnings(&cfg) {
        tracing::warn!("{w}");
    }
    let metrics = match g.metrics {
        Some(addr) => Some(
            MetricsListener::bind(addr)
                .with_context(|| format!("gateway.metrics = \"{addr}\": cannot listen"))?,
        ),
        None => None,
    };
    let nat_t = worker_sockets[0].udp.clone();
    let mut ike = control::ike::IkeDriver::open(&cfg, nat_t.clone())?;
    let spi_filter = Arc::new(spifilter::SpiFilter::new(
        worker_sockets
            .iter()
            .filter_map(|s| s.udp.clone())
            .collect(),
    ));
    if let Some(i) = ike.as_mut() {
        i.set_spi_filter(spi_filter.clone());
    }
    let (ike_tx, ike_rx) = match &ike {
        Some(_) => {
            let (tx, rx) = tokio::sync::mpsc::channel(IKE_QUEUE_MAX);
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    let control_socket = ControlSocket::bind(&g.control_socket)?;
    // Batching: GSO on send when offloads are on; GRO on receive with one
    // worker only (the SPI steering of several needs each datagram alone).
    let gso = g.offloads && nat_t.is_some();
    let gro = g.offloads && n == 1 && nat_t.as_ref().is_some_and(|u| u.enable_gro());
    let mut offloads = tun_offload_names(&tun, tun_offloads);
    if gso {
        offloads.push("udp_gso".into());
    }
    if gro {
        offloads.push("udp_gro".into());
    }
    tracing::info!(
        "espgate {} up: TUN {} mtu {}, {} connection(s), {} SA(s), {} data-plane worker(s), \
         control socket {}{}",
        env!("CARGO_PKG_VERSION"),
        tun.name(),
        plan.mtu,
        engines[0].connections().len(),
        engines.iter().map(|e| e.sad().len()).max().unwrap_or(0),
        n,
        control_socket.path().display(),
        metrics
            .as_ref()
            .map(|m| format!(", metrics on http://{}/metrics", m.local_addr()))
            .unwrap_or_default()
    );
    for (name, asked, to) in engines[0].tfc_capped() {
        tracing::info!(
            "connection \"{name}\": TFC padding stops at {to} bytes, the longest packet its \
             SAs keep within gateway.mtu {} (tfc_pad_to = {asked})",
            g.mtu
        );
    }
    tracing::info!(
        "AES-GCM SAs are run by {}",
        espgate_core::crypto::GcmImpl::current().describe()
    );
    for d in net.describe() {
        tracing::debug!("{d}");
    }
    let info = status::Info {
        config: cfg.source.clone(),
        tun: TunStatus {
            name: tun.name().to_string(),
            mtu: plan.mtu,
        },
        encap: g.encap.name().to_string(),
        listen: nat_t.as_ref().map(|u| u.local),
        fwmark: g.fwmark,
        state_dir: leases.dir().display().to_string(),
        offloads,
        cluster: cfg.cluster.as_ref().map(|c| c.name.clone()),
    };
    let clock = ClockKind::best();
    let cells: Vec<Arc<CostCells>> = (0..n).map(|_| Arc::new(CostCells::new(clock))).collect();
    let views = cells
        .iter()
        .map(|c| CostsView::new(c.clone(), g.cost_accounting))
        .collect();
    let keepalives: Vec<Duration> = cfg
        .connections
        .iter()
        .map(|c| {
            if c.encap == Encapsulation::Udp {
                c.nat_keepalive
            } else {
                Duration::ZERO
            }
        })
        .collect();
    let sources = sockets::udp_sources(
        nat_t.as_ref().map(|u| u.local),
        cfg.connections
            .iter()
            .map(|c| (c.name.as_str(), c.local, c.encap == Encapsulation::Udp)),
    );
    let ctl = Arc::new(Control::new(engines, views, info, start, ike, spi_filter));
    let failed = AtomicBool::new(false);
    let vnet = tun.has_vnet_hdr();
    // The kernel takes UDP super-packets (USO): datagrams of one flow are
    // written to the TUN coalesced too.
    let udp_gro = vnet && tun_offloads.contains(Offloads::USO4 | Offloads::USO6);
    let tun_name = tun.name().to_string();
    let result = on_ready().and_then(|()| {
        // The workers stop when this pipe's write end closes.
        let (stop_rd, stop_wr) = daemon::pipe().context("creating the workers' stop pipe")?;
        let on_fail = || ctl.worker_failed.notify_one();
        std::thread::scope(|scope| {
            let mut handles = Vec::new();
            let parts = tun
                .queues()
                .iter()
                .zip(&worker_sockets)
                .zip(&cells)
                .enumerate();
            for (k, ((tunq, socks), cells)) in parts {
                let mut w = Worker {
                    engine: &ctl.engines[k],
                    me: k,
                    tun: tunq,
                    vnet,
                    udp_gro,
                    tun_name: &tun_name,
                    sockets: socks,
                    stop: stop_rd.as_fd(),
                    failed: &failed,
                    on_fail: &on_fail,
                    start,
                    batch: g.batch,
                    mtu: usize::from(g.mtu),
                    gso,
                    costs: cells.clone(),
                    ike: ike_tx.clone(),
                    keepalives: if k == 0 {
                        keepalives.clone()
                    } else {
                        Vec::new()
                    },
                    sources: &sources,
                };
                let h = std::thread::Builder::new()
                    .name(format!("espgate-worker-{k}"))
                    .spawn_scoped(scope, move || w.run())
                    .context("starting a data-plane worker thread");
                match h {
                    Ok(h) => handles.push(h),
                    Err(e) => {
                        drop(stop_wr);
                        return Err(e);
                    }
                }
            }
            drop(ike_tx);
            let listeners = Listeners {
                control: control_socket,
                metrics,
                ike_rx,
            };
            let r = control::run(ctl.clone(), listeners, &signals);
            on_stopping();
            drop(stop_wr);
            for (k, h) in handles.into_iter().enumerate() {
                match h.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!("data-plane worker {k}: {e:#}"),
                    Err(_) => tracing::error!("data-plane worker {k} panicked"),
                }
            }
            r.map(drop)
        })
    });
    for e in &ctl.engines {
        worker::lock(e).release_leases();
    }
    drop(ctl);
    drop(worker_sockets);
    drop(leases);
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
/// `tun_tso4`, `tun_tso6`, `tun_uso` (also: coalesced UDP written back as
/// one super-packet).
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
