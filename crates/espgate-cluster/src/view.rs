//! `espgate cluster status`: one read of a cluster's etcd keys, as a
//! document (`--json`) and as text.

use crate::etcd::{self, Endpoints, Keys};
use crate::report::NodeReport;
use anyhow::{anyhow, Context, Result};
use espgate_api::cluster::{Lockstep, PlanDoc};
use espgate_api::table::{Column, Table};
use espgate_config::cluster::Cluster;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::time::Duration;

/// How long `cluster status` waits for etcd.
pub const VIEW_TIMEOUT: Duration = Duration::from_secs(3);

/// A cluster as etcd holds it: the leader, the plan and every live node's
/// report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// Cluster name.
    pub name: String,
    /// The etcd endpoints asked.
    pub etcd: Vec<String>,
    /// The elected leader (`None`: no agent runs).
    pub leader: Option<u16>,
    /// The plan (`None`: no leader wrote one yet).
    pub plan: Option<PlanDoc>,
    /// Every node with a live report, by id.
    pub nodes: Vec<NodeReport>,
    /// Keys that could not be read, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// Reads the cluster `cluster` names from its etcd, waiting at most
/// [`VIEW_TIMEOUT`]; the error names the endpoints.
pub fn cluster_view(cluster: &Cluster) -> Result<ClusterView> {
    let endpoints = Endpoints::new(cluster)?;
    let keys = Keys::new(&cluster.name);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime")?;
    let read = async {
        let mut client = endpoints.connect().await?;
        etcd::snapshot(&mut client, &keys).await
    };
    let snap = rt
        .block_on(async { tokio::time::timeout(VIEW_TIMEOUT, read).await })
        .map_err(|_| {
            anyhow!(
                "etcd at {} did not answer within {}s: is it running, and are the \
                 endpoints in [cluster] etcd right?",
                endpoints.list(),
                VIEW_TIMEOUT.as_secs()
            )
        })?
        .with_context(|| format!("etcd at {}", endpoints.list()))?;
    let mut problems: Vec<String> = snap
        .bad
        .into_iter()
        .map(|(k, why)| format!("{k}: {why}"))
        .collect();
    problems.extend(snap.plan_error);
    Ok(ClusterView {
        name: cluster.name.clone(),
        etcd: cluster.etcd.clone(),
        leader: snap.leader.and_then(|l| l.node),
        plan: snap.plan,
        nodes: snap.nodes.into_values().collect(),
        problems,
    })
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn lockstep(l: Option<Lockstep>) -> &'static str {
    match l {
        None => "-",
        Some(Lockstep::Unknown) => "unknown",
        Some(Lockstep::InStep) => "in-step",
        Some(Lockstep::OutOfStep) => "out-of-step",
    }
}

impl ClusterView {
    /// The view as text: the leader and plan, a line per node (plan
    /// members without a report included), then a line per outbound SA
    /// and node with what it processed and only observed.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "cluster {} (etcd {})", self.name, self.etcd.join(", "));
        let _ = match self.leader {
            Some(l) => writeln!(out, "leader:  node {l}"),
            None => writeln!(out, "leader:  none (no agent is running)"),
        };
        let members: &[u16] = self.plan.as_ref().map_or(&[], |p| &p.members);
        let _ = match &self.plan {
            Some(p) if p.members.is_empty() => {
                writeln!(out, "plan:    epoch {}, no members", p.epoch)
            }
            Some(p) => {
                let m: Vec<String> = p.members.iter().map(u16::to_string).collect();
                writeln!(out, "plan:    epoch {}, members {}", p.epoch, m.join(" "))
            }
            None => writeln!(out, "plan:    none yet"),
        };
        out.push('\n');
        let mut t = Table::new([
            Column::right("NODE"),
            Column::left("ROLE"),
            Column::left("IN PLAN"),
            Column::left("IN STEP"),
            Column::left("STATE"),
        ]);
        let mut ids: Vec<u16> = self.nodes.iter().map(|n| n.node).collect();
        ids.extend(members.iter().copied());
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            let role = if self.leader == Some(id) {
                "leader"
            } else {
                ""
            };
            let in_plan = yes_no(members.contains(&id));
            match self.nodes.iter().find(|n| n.node == id) {
                Some(n) => t.row([
                    id.to_string(),
                    role.into(),
                    in_plan.into(),
                    yes_no(n.in_step).into(),
                    n.state.clone(),
                ]),
                None => t.row([
                    id.to_string(),
                    role.into(),
                    in_plan.into(),
                    "-".into(),
                    "no report (its lease expired)".into(),
                ]),
            };
        }
        out.push_str(&t.render());
        let sas = self
            .nodes
            .iter()
            .flat_map(|n| n.sas.iter().map(move |s| (n, s)));
        let mut t = Table::new([
            Column::right("NODE"),
            Column::left("CONN"),
            Column::left("SPI"),
            Column::right("PROCESSED"),
            Column::right("OBSERVED"),
            Column::right("SEEN"),
            Column::right("SHARE"),
            Column::left("LOCKSTEP"),
            Column::left("CHECKPOINT"),
        ]);
        let mut any = false;
        for (n, s) in sas {
            any = true;
            let seen = s.processed.saturating_add(s.observed);
            let share = if seen == 0 {
                "-".to_string()
            } else {
                format!("{:.1}%", s.processed as f64 * 100.0 / seen as f64)
            };
            let cp = s
                .checkpoint
                .map_or("-".to_string(), |(seq, d)| format!("{seq} ({d:016x})"));
            t.row([
                n.node.to_string(),
                s.conn.clone(),
                format!("0x{:08x}", s.spi),
                s.processed.to_string(),
                s.observed.to_string(),
                seen.to_string(),
                share,
                lockstep(s.lockstep).into(),
                cp,
            ]);
        }
        if any {
            out.push_str("\noutbound SAs (seen = processed + observed)\n");
            out.push_str(&t.render());
        }
        for p in &self.problems {
            let _ = writeln!(out, "warning: {p}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::SaReport;

    #[test]
    fn the_text_marks_the_leader_and_the_plan() {
        let node = |id: u16, in_step: bool, state: &str| NodeReport {
            node: id,
            state: state.into(),
            daemon: true,
            in_step,
            sas: vec![SaReport {
                conn: "site".into(),
                spi: 0x1001,
                checkpoint: Some((256, 0xab)),
                processed: 50,
                observed: 150,
                lockstep: Some(Lockstep::InStep),
            }],
            ready: Vec::new(),
        };
        let v = ClusterView {
            name: "gw".into(),
            etcd: vec!["http://127.0.0.1:2379".into()],
            leader: Some(1),
            plan: Some(PlanDoc {
                epoch: 3,
                members: vec![1, 3],
            }),
            nodes: vec![node(1, true, "processing"), node(2, false, "resyncing")],
            problems: vec![],
        };
        let text = v.render();
        assert_eq!(
            text,
            "\
cluster gw (etcd http://127.0.0.1:2379)
leader:  node 1
plan:    epoch 3, members 1 3

NODE  ROLE    IN PLAN  IN STEP  STATE
   1  leader  yes      yes      processing
   2          no       no       resyncing
   3          yes      -        no report (its lease expired)

outbound SAs (seen = processed + observed)
NODE  CONN  SPI         PROCESSED  OBSERVED  SEEN  SHARE  LOCKSTEP  CHECKPOINT
   1  site  0x00001001         50       150   200  25.0%  in-step   256 (00000000000000ab)
   2  site  0x00001001         50       150   200  25.0%  in-step   256 (00000000000000ab)
"
        );
        let json = serde_json::to_string(&v).unwrap();
        assert_eq!(serde_json::from_str::<ClusterView>(&json).unwrap(), v);
    }
}
