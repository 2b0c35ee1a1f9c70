//! Seed 003's flat cluster on the control side: the cluster agent's
//! once-a-second `cluster` request installs (or confirms) the plan in the
//! engine and hands it the other nodes' lockstep checkpoints; the status
//! document's `cluster` part is built from the report kept then, plus the
//! per-SA counters the worker publishes, so reading status still never
//! takes the engine's lock.

use super::{locked, Control};
use espgate_api::cluster::{
    ClusterSa, ClusterSas, ClusterStatus, ClusterUpdate, Lockstep, PlanDoc,
};
use espgate_api::control::{Change, Response};
use espgate_core::cluster::Plan;
use espgate_core::gateway::{ClusterReport, Engine, LockState};
use std::time::Duration;

impl Control {
    /// The agent's update: plan, leader, the others' checkpoints.
    pub(super) fn cluster_update(&self, mut u: ClusterUpdate) -> Response {
        if self.cluster_name.is_none() {
            return Response::error("this gateway is not a cluster node (no [cluster] table)");
        }
        let now = self.now();
        let peers: Vec<_> = u
            .checkpoints
            .iter()
            .map(|c| (c.node, c.spi, c.seq, c.digest))
            .collect();
        // IKE first (the driver's lock before the engines', as its task
        // takes them): who runs it, and the SAs the leader shares.
        let mut shared_lines = Vec::new();
        if let Some(i) = &self.ike {
            let mut d = locked(i);
            if let Some(list) = u.ike.take() {
                d.seen_ike(list);
            }
            let kick = d.set_leader(u.leader, now);
            if let (Some(list), Some(c)) = (&u.sas, d.cluster()) {
                let mut guards = super::ike::lock_all(&self.engines);
                let mut refs: Vec<&mut Engine> = guards.iter_mut().map(|g| &mut **g).collect();
                c.shared.prune(&mut refs, now);
                shared_lines = c.shared.reconcile(&mut refs, list, now);
            }
            drop(d);
            if kick {
                self.ike_kick.notify_one();
            }
        }
        // A cluster node runs one worker (the configuration says so).
        let mut e = crate::worker::lock(&self.engines[0]);
        if let Some(p) = &u.plan {
            e.cluster_plan(Plan::new(p.epoch, p.members.iter().copied()), u.leader, now);
        }
        let mut lines = e.cluster_check(&peers);
        lines.extend(shared_lines);
        let report = e.cluster_report(now);
        drop(e);
        for l in &lines {
            tracing::warn!("{l}");
        }
        let old = match &report {
            Some(r) => locked(&self.cluster_report).replace((r.clone(), now)),
            None => None,
        };
        let (was, is) = (
            old.map(|o| o.0.plan.epoch),
            report.as_ref().map(|r| r.plan.epoch),
        );
        if was != is {
            if let Some(r) = &report {
                tracing::info!(
                    "cluster: plan {} in force: members {:?} (this node {}: {})",
                    r.plan.epoch,
                    r.plan.members,
                    r.opts.node,
                    r.state()
                );
            }
        }
        let state = report
            .as_ref()
            .map(ClusterReport::state)
            .unwrap_or_default();
        Response::Changed(Change {
            message: format!(
                "plan {} confirmed: {state}",
                u.plan.as_ref().map_or(0, |p| p.epoch)
            ),
            warnings: lines,
        })
    }

    /// `cluster_export`, and `cluster_share` when `share` names an SA.
    pub(super) fn cluster_export(&self, share: Option<(u32, bool)>) -> Response {
        if self.cluster_name.is_none() {
            return Response::error("this gateway is not a cluster node (no [cluster] table)");
        }
        let Some(i) = &self.ike else {
            // No IKE connection: nothing is negotiated, nothing shared.
            return match share {
                None => Response::ClusterSas(ClusterSas::default()),
                Some((spi, _)) => Response::error(format!(
                    "SA {spi:#010x} is not shared: no connection of this gateway uses IKE"
                )),
            };
        };
        let now = self.now();
        let packets = share.map_or(0, |(spi, outbound)| {
            let (p, o) = self.sa_counters(spi, outbound);
            p + o
        });
        let mut d = locked(i);
        let (ike_generation, ike) = d.export_ike(now);
        let Some(c) = d.cluster() else {
            return Response::error("this gateway is not a cluster node");
        };
        let mut guards = super::ike::lock_all(&self.engines);
        let mut refs: Vec<&mut Engine> = guards.iter_mut().map(|g| &mut **g).collect();
        c.shared.prune(&mut refs, now);
        if let (Some((spi, outbound)), Some(e)) = (share, refs.first_mut()) {
            if let Err(err) = c.shared.share(e, spi, outbound, packets, now) {
                return Response::error(err);
            }
        }
        let mut out = c.shared.export();
        out.generation += ike_generation;
        out.ike = ike;
        Response::ClusterSas(out)
    }

    /// An SA's packets (processed, observed) from the workers' counters.
    fn sa_counters(&self, spi: u32, outbound: bool) -> (u64, u64) {
        self.stats
            .iter()
            .flat_map(|s| s.sas().iter().cloned().collect::<Vec<_>>())
            .find(|e| e.spi == spi && e.outbound == outbound)
            .map(|e| (e.counters.packets.get(), e.counters.observed.get()))
            .unwrap_or_default()
    }

    /// The `cluster` part of the status document.
    pub(super) fn cluster_status(&self, now: Duration) -> Option<ClusterStatus> {
        let name = self.cluster_name.clone()?;
        let (mut r, taken) = locked(&self.cluster_report).clone()?;
        // The plan's age and validity as of now, not of the last update.
        if let Some(age) = r.plan_age {
            let confirmed = taken.saturating_sub(age);
            r.plan_age = Some(now.saturating_sub(confirmed));
            r.plan_valid = r.plan_valid && now <= confirmed + r.opts.hold;
        }
        let counters = |spi: u32, outbound: bool| self.sa_counters(spi, outbound);
        let shared: Vec<(u32, bool)> = match &self.ike {
            Some(i) => {
                let mut d = locked(i);
                d.cluster().map_or_else(Vec::new, |c| {
                    r.sas
                        .iter()
                        .filter(|s| c.shared.has(s.spi, s.outbound))
                        .map(|s| (s.spi, s.outbound))
                        .collect()
                })
            }
            None => Vec::new(),
        };
        let sas = r
            .sas
            .iter()
            .map(|s| {
                let (processed, observed) = counters(s.spi, s.outbound);
                ClusterSa {
                    conn: s.conn.clone(),
                    spi: s.spi,
                    outbound: s.outbound,
                    processed,
                    observed,
                    checkpoint: s.checkpoint,
                    lockstep: s.lockstep.map(|l| match l {
                        LockState::Unknown => Lockstep::Unknown,
                        LockState::InStep => Lockstep::InStep,
                        LockState::OutOfStep => Lockstep::OutOfStep,
                    }),
                    resyncs: s.resyncs,
                    shared: shared.contains(&(s.spi, s.outbound)),
                    solo: s.solo,
                    share_from: s.share_from,
                }
            })
            .collect();
        Some(ClusterStatus {
            name,
            node: r.opts.node,
            dispatch: r.opts.dispatch.name().to_string(),
            plan: (r.plan.epoch > 0).then(|| PlanDoc {
                epoch: r.plan.epoch,
                members: r.plan.members.clone(),
            }),
            leader: r.leader,
            plan_age_ms: r.plan_age.map(|a| a.as_millis() as u64),
            state: r.state(),
            in_step: r.in_step(),
            sas,
        })
    }
}
