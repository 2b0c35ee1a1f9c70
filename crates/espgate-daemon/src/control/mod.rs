//! The control thread: one single-threaded tokio runtime that answers the
//! control socket (`server`), serves the metrics endpoint (`metrics`),
//! runs IKE ([`ike`]), and waits for a stop signal or a worker that failed.
//!
//! Every request is answered by one function, [`Control::handle`]. Status
//! and metrics are built from the counters and SA directories the workers
//! publish ([`crate::status`]): reading them never takes an engine's lock,
//! so a scrape under full load does not slow the packet path. Only
//! commands that change SAs (`sa add`, `sa del`, IKE installs) and
//! `wireshark-keys` lock the engines, briefly.

mod accept;
mod cluster;
pub mod ike;
mod metrics;
mod server;
mod shared;
#[cfg(test)]
mod tests;

use crate::signals::{self, Signals};
use crate::spifilter::SpiFilter;
use crate::status::{self, ConnInfo, Info};
use crate::worker::EngineLock;
use crate::worker::{lock, IkeDatagram};
use anyhow::{Context, Result};
use espgate_api::control::{Change, CostsAction, Proto, Request, Response, SaDir};
use espgate_api::costs::{CostsReport, CostsView};
use espgate_api::status::Status;
use espgate_api::wireshark::SaKeys;
use espgate_core::gateway::{add_sa_all, del_sa_all, Engine, SaChange, SaKeyView, WorkerStats};
use espgate_core::sa::{Encap, Mode, Protocol};
use ike::IkeDriver;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch, Notify};

pub use metrics::MetricsListener;

/// Everything the control thread serves, shared with its tasks.
pub struct Control {
    /// Every worker's engine, worker 0 first.
    pub engines: Vec<EngineLock>,
    stats: Vec<Arc<WorkerStats>>,
    conns: Vec<ConnInfo>,
    info: Info,
    start: Instant,
    costs: Mutex<Vec<CostsView>>,
    ike: Option<Mutex<IkeDriver>>,
    /// Wakes the IKE task after a command gave the engine work.
    ike_kick: Notify,
    /// A worker stopped on an error: the daemon stops.
    pub worker_failed: Notify,
    /// `[cluster]`'s name, on a cluster node.
    cluster_name: Option<String>,
    /// The kernel-side filter of unknown SPIs (engaged during floods).
    spi_filter: Arc<SpiFilter>,
    /// The engine's cluster report as of the last `cluster` request, and
    /// when it was taken.
    cluster_report: Mutex<Option<(espgate_core::gateway::ClusterReport, Duration)>>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("workers", &self.engines.len())
            .field("ike", &self.ike.is_some())
            .finish_non_exhaustive()
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Control {
    /// The control plane over `engines` (with their cost views, in the
    /// same order) and the IKE driver, if any connection uses IKE.
    pub fn new(
        engines: Vec<Engine>,
        costs: Vec<CostsView>,
        info: Info,
        start: Instant,
        ike: Option<IkeDriver>,
        spi_filter: Arc<SpiFilter>,
    ) -> Control {
        let stats = engines.iter().map(|e| e.stats().clone()).collect();
        let conns = engines
            .first()
            .map(|e| e.connections().map(ConnInfo::of).collect())
            .unwrap_or_default();
        let cluster_report = engines
            .first()
            .and_then(|e| e.cluster_report(start.elapsed()))
            .map(|r| (r, start.elapsed()));
        Control {
            cluster_name: info.cluster.clone(),
            cluster_report: Mutex::new(cluster_report),
            engines: engines.into_iter().map(EngineLock::new).collect(),
            stats,
            conns,
            info,
            start,
            costs: Mutex::new(costs),
            ike: ike.map(Mutex::new),
            spi_filter,
            ike_kick: Notify::new(),
            worker_failed: Notify::new(),
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// The status document.
    pub fn status(&self) -> Status {
        let now = self.now();
        let costs = self.costs_report();
        let ike = self.ike.as_ref().map(|i| locked(i).doc(now));
        let mut s = status::document(&self.info, &self.conns, &self.stats, now, costs, ike);
        s.counters
            .insert("udp_socket_drops".into(), self.spi_filter.kernel_drops());
        s.counters
            .insert("spi_filter_engaged".into(), self.spi_filter.engagements());
        s.cluster = self.cluster_status(now);
        s
    }

    fn costs_report(&self) -> Option<CostsReport> {
        let views = locked(&self.costs);
        let mut merged: Option<CostsReport> = None;
        for r in views.iter().filter_map(CostsView::report) {
            match &mut merged {
                Some(m) => m.merge(&r),
                None => merged = Some(r),
            }
        }
        merged
    }

    /// The answer to one request.
    pub fn handle(&self, req: Request) -> Response {
        match req {
            Request::Status => Response::Status(Box::new(self.status())),
            Request::SaList => Response::Sas(
                status::connections(&self.conns, &self.stats, self.now())
                    .into_iter()
                    .flat_map(|c| c.sas)
                    .collect(),
            ),
            Request::SaAdd { conn, dir, spec } => {
                let now = self.now();
                let outbound = dir == SaDir::Out;
                let r = self.with_engines(|e| add_sa_all(e, &conn, outbound, spec.expose(), now));
                self.spi_filter.refresh(&self.engines);
                changed(r, "sa add")
            }
            Request::SaDel {
                spi,
                proto,
                dir,
                conn,
            } => {
                let protocol = proto.map(|p| match p {
                    Proto::Esp => Protocol::Esp,
                    Proto::Ah => Protocol::Ah,
                    Proto::Qesp => Protocol::Qesp,
                });
                let outbound = dir.map(|d| d == SaDir::Out);
                let r =
                    self.with_engines(|e| del_sa_all(e, spi, protocol, outbound, conn.as_deref()));
                changed(r, "sa del")
            }
            Request::WiresharkKeys => Response::Keys(self.sa_keys()),
            Request::Costs { action } => self.costs_command(action),
            Request::Initiate { conn } => self.ike_command(|i, now| i.initiate(now, &conn)),
            Request::Terminate { conn } => self.ike_command(|i, now| i.terminate(now, &conn)),
            Request::Cluster(u) => {
                let r = self.cluster_update(u);
                self.spi_filter.refresh(&self.engines);
                r
            }
            Request::ClusterExport => self.cluster_export(None),
            Request::ClusterShare { spi, outbound } => self.cluster_export(Some((spi, outbound))),
        }
    }

    /// Runs `f` over every worker's engine, all locked (worker 0 first).
    fn with_engines<T>(&self, f: impl FnOnce(&mut [&mut Engine]) -> T) -> T {
        let mut guards = ike::lock_all(&self.engines);
        let mut refs: Vec<&mut Engine> = guards.iter_mut().map(|g| &mut **g).collect();
        f(&mut refs)
    }

    fn ike_command(
        &self,
        f: impl FnOnce(&mut IkeDriver, Duration) -> Result<String, espgate_ike::engine::CommandError>,
    ) -> Response {
        let Some(i) = &self.ike else {
            return Response::error(
                "no connection of this gateway uses IKE (add a [connection.ike] table to the \
                 configuration)",
            );
        };
        let r = f(&mut locked(i), self.now());
        // The engine has messages to send now.
        self.ike_kick.notify_one();
        match r {
            Ok(message) => Response::Changed(Change {
                message,
                warnings: Vec::new(),
            }),
            Err(e) => Response::error(e.to_string()),
        }
    }

    /// The keys of every SA, each once (outbound copies are in every
    /// worker), for `espgate wireshark-keys`.
    fn sa_keys(&self) -> Vec<SaKeys> {
        let mut out: Vec<SaKeys> = Vec::new();
        for e in &self.engines {
            for k in lock(e).sa_keys() {
                let k = sa_keys(&k);
                if !out.contains(&k) {
                    out.push(k);
                }
            }
        }
        tracing::info!(
            "wireshark_keys: {} SA keys handed out on the control socket",
            out.len()
        );
        out
    }

    /// `espgate costs on|off|reset` on every worker; `reset` also zeroes
    /// the IKE per-operation costs.
    fn costs_command(&self, action: CostsAction) -> Response {
        let mut views = locked(&self.costs);
        let on = views.iter().any(CostsView::is_on);
        let message = match (action, on) {
            (CostsAction::On, true) => "cost accounting is already on".to_string(),
            (CostsAction::On, false) => {
                views.iter_mut().for_each(CostsView::switch_on);
                let clock = espgate_api::costs::ClockKind::best().as_str();
                format!("cost accounting on (clock {clock}); `espgate status --costs` shows it")
            }
            (CostsAction::Off, true) => {
                views.iter_mut().for_each(CostsView::switch_off);
                "cost accounting off; its counts are gone".to_string()
            }
            (CostsAction::Off, false) => "cost accounting is already off".to_string(),
            (CostsAction::Reset, true) => {
                views.iter_mut().for_each(CostsView::reset);
                if let Some(i) = &self.ike {
                    locked(i).reset_costs();
                }
                "cost accounting counts reset".to_string()
            }
            (CostsAction::Reset, false) => {
                return Response::error("cost accounting is off; `espgate costs on` starts it")
            }
        };
        tracing::info!("{message}");
        Response::Changed(Change {
            message,
            warnings: Vec::new(),
        })
    }
}

/// The answer (and the log lines) of an SA change.
fn changed(r: Result<SaChange, String>, what: &str) -> Response {
    match r {
        Ok(c) => {
            tracing::info!(
                "{what}: {} (run-time change, not in the configuration file)",
                c.message
            );
            for w in &c.warnings {
                tracing::warn!("{w}");
            }
            Response::Changed(Change {
                message: c.message,
                warnings: c.warnings,
            })
        }
        Err(e) => Response::error(e),
    }
}

/// An SA's keys as the `wireshark_keys` answer carries them.
fn sa_keys(k: &SaKeyView) -> SaKeys {
    let c = &k.config;
    let ports = match c.encap {
        Encap::Udp { src_port, dst_port } => Some((src_port, dst_port)),
        Encap::None => None,
    };
    SaKeys {
        connection: k.connection.clone(),
        direction: if k.outbound { "out" } else { "in" }.into(),
        protocol: c.protocol.name().into(),
        spi: c.spi,
        suite: c.suite.name(),
        mode: match c.mode {
            Mode::Tunnel => "tunnel",
            Mode::Transport => "transport",
        }
        .into(),
        src: k.src.to_string(),
        dst: k.dst.to_string(),
        sport: ports.map(|p| p.0),
        dport: ports.map(|p| p.1),
        esn: c.esn,
        enc_key: hex::encode(&c.enc_key[..]),
        integ_key: hex::encode(&c.integ_key[..]),
    }
}

/// The sockets the control thread serves.
pub struct Listeners {
    /// The control socket (bound, mode 0600).
    pub control: server::ControlSocket,
    /// The metrics endpoint, when `gateway.metrics` is set.
    pub metrics: Option<MetricsListener>,
    /// IKE messages the workers take off the NAT-T socket.
    pub ike_rx: Option<mpsc::Receiver<IkeDatagram>>,
}

pub use server::{check_not_running, ControlSocket};

/// Runs the control plane until a stop signal (returned) or a worker
/// failure (an error).
pub fn run(ctl: Arc<Control>, listeners: Listeners, signals: &Signals) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the control thread's runtime")?;
    rt.block_on(async move {
        let (stop_tx, stop_rx) = watch::channel(false);
        let Listeners {
            mut control,
            metrics,
            ike_rx,
        } = listeners;
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(server::serve(
            control.take_listener()?,
            ctl.clone(),
            stop_rx.clone(),
        ));
        if let Some(m) = metrics {
            tasks.spawn(metrics::serve(m, ctl.clone(), stop_rx.clone()));
        }
        if ctl.ike.is_some() {
            tasks.spawn(ike_task(ctl.clone(), ike_rx, stop_rx.clone()));
        }
        tasks.spawn(spi_filter_task(ctl.clone(), stop_rx.clone()));
        // SAFETY: the descriptor is borrowed from `signals`, which outlives
        // this runtime (and so the registration).
        let sig = unsafe { AsyncFd::register(signals.fd()) }.map_err(|e| {
            anyhow::anyhow!("watching the stop signals: {}", std::io::Error::from(e))
        })?;
        let r = tokio::select! {
            s = wait_signal(&sig, signals) => Ok(s),
            () = ctl.worker_failed.notified() => Err(anyhow::anyhow!(
                "a data-plane worker stopped on an error (see above)"
            )),
        };
        let _ = stop_tx.send(true);
        // The tasks end at the stop; give each client a moment at most.
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        r
    })
}

async fn wait_signal(fd: &AsyncFd<std::os::fd::BorrowedFd<'_>>, signals: &Signals) -> i32 {
    loop {
        let Ok(mut guard) = fd.readable().await else {
            return libc::SIGTERM;
        };
        if let Some(sig) = signals.next() {
            tracing::info!("{}: stopping", signals::name(sig));
            return sig;
        }
        guard.clear_ready();
    }
}

/// Once a second, whether a flood of junk ESP (unknown SPIs, bad ICVs)
/// engages the kernel-side filter, or its end removes it.
async fn spi_filter_task(ctl: Arc<Control>, mut stop: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => ctl.spi_filter.tick(&ctl.engines, &ctl.stats),
            _ = stop.changed() => return,
        }
    }
}

/// Drives the IKE engine: datagrams on UDP 500 and from the NAT-T queue,
/// its timers, and the commands that gave it work.
async fn ike_task(
    ctl: Arc<Control>,
    mut natt: Option<mpsc::Receiver<IkeDatagram>>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(driver) = &ctl.ike else { return };
    let fd = {
        let raw = std::os::fd::AsRawFd::as_raw_fd(&locked(driver).socket().as_fd());
        // SAFETY: the socket is owned by the IKE driver inside `ctl`, which
        // this task holds (an `Arc`) for as long as the registration lives.
        match unsafe { AsyncFd::register(raw) } {
            Ok(fd) => fd,
            Err(e) => {
                tracing::error!("ike: watching the IKE socket: {e}");
                return;
            }
        }
    };
    locked(driver).start(ctl.now());
    locked(driver).pump(&ctl.engines, ctl.now());
    loop {
        // At least once a second: the data plane's inbound traffic counts
        // as hearing from the peer (`IkeDriver::note_traffic`).
        let deadline = locked(driver)
            .next_timeout()
            .map(|t| ctl.start + t)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
            .min(Instant::now() + ike::TRAFFIC_LOOK);
        tokio::select! {
            r = fd.readable() => {
                let Ok(mut guard) = r else { return };
                if !locked(driver).on_readable(ctl.now()) {
                    guard.clear_ready();
                }
            }
            Some((local, remote, data)) = async {
                match natt.as_mut() {
                    Some(q) => q.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                locked(driver).handle(ctl.now(), local, remote, &data);
            }
            () = tokio::time::sleep_until(deadline.into()) => {}
            () = ctl.ike_kick.notified() => {}
            _ = stop.changed() => return,
        }
        let mut d = locked(driver);
        d.note_traffic(&ctl.stats, ctl.now());
        d.pump(&ctl.engines, ctl.now());
    }
}
