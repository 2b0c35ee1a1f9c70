//! Seed 003's flat cluster in the engine: before an SA processes a
//! packet, the node asks its per-SA [`Dispatcher`] whether the packet is
//! its own; if not, the SA only advances its state
//! ([`Sa::observe_outbound`] / [`Sa::observe_inbound`]) and the packet
//! goes no further. Outbound, each SA also keeps a [`Lockstep`] history,
//! which the shell compares once a second with the other nodes'
//! checkpoints ([`Engine::cluster_check`]); a node that finds itself off
//! moves its sequence number to the majority's.
//!
//! The plan comes from the shell ([`Engine::cluster_plan`], from the
//! cluster agent and etcd) with a deadline: past `hold` without a renewal
//! the node processes nothing (`cluster_no_plan`), so that a node cut off
//! from etcd cannot keep sending numbers the others have moved past.

use super::{Engine, SaMeta};
use crate::cluster::{
    digest, flow_key, Dispatch, Dispatcher, Lockstep, NodeId, Plan, Seen, Verdict,
};
use crate::error::DropReason;
use crate::sad::SaId;
use std::time::Duration;

/// A cluster node's settings, fixed at start (`[cluster]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterOptions {
    /// This node.
    pub node: NodeId,
    /// The dispatch scheme.
    pub dispatch: Dispatch,
    /// How long a plan stays valid without being confirmed.
    pub hold: Duration,
}

/// Lockstep health of an outbound SA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockState {
    /// Nothing compared yet.
    Unknown,
    /// In step with the others.
    InStep,
    /// Off, and could not move to the others' numbering.
    OutOfStep,
}

/// One SA's cluster state on this node.
#[derive(Debug, Clone)]
struct SaCluster {
    disp: Dispatcher,
    /// Outbound SAs only.
    lockstep: Option<Lockstep>,
    state: LockState,
    resyncs: u64,
    /// Shared by the leader's IKE: the node that negotiated it processes
    /// every packet below `share_from` (all of them while it is `None`),
    /// so that the other nodes can install the SA and catch up first.
    solo: Option<NodeId>,
    share_from: Option<u64>,
}

impl SaCluster {
    /// While the SA is solo at `counter` (and its owner is in the plan):
    /// the owner.
    fn solo_owner(&self, counter: u64, plan: &[NodeId]) -> Option<NodeId> {
        let o = self.solo?;
        (counter < self.share_from.unwrap_or(u64::MAX) && plan.contains(&o)).then_some(o)
    }
}

/// The engine's cluster state.
#[derive(Debug, Clone)]
pub(super) struct ClusterNode {
    opts: ClusterOptions,
    plan: Plan,
    leader: Option<NodeId>,
    /// The plan is valid until then (engine time); `None`: no plan yet.
    valid_until: Option<Duration>,
    confirmed_at: Option<Duration>,
    /// By `SaId.0`.
    sas: Vec<Option<SaCluster>>,
}

/// What the shell reports of one SA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSaReport {
    /// The connection's name.
    pub conn: String,
    /// SPI.
    pub spi: u32,
    /// Outbound or inbound.
    pub outbound: bool,
    /// Outbound: the latest checkpoint (sequence number, digest).
    pub checkpoint: Option<(u64, u64)>,
    /// Outbound: lockstep health.
    pub lockstep: Option<LockState>,
    /// Resynchronisations so far.
    pub resyncs: u64,
    /// Solo: the node that alone processes it (below `share_from`).
    pub solo: Option<NodeId>,
    /// From this counter the SA is dispatched over the plan.
    pub share_from: Option<u64>,
}

/// What the shell reports of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterReport {
    /// Settings.
    pub opts: ClusterOptions,
    /// The plan in force (epoch 0, no members: none yet).
    pub plan: Plan,
    /// The leader, as last told.
    pub leader: Option<NodeId>,
    /// Since the plan was last confirmed.
    pub plan_age: Option<Duration>,
    /// The plan is valid now.
    pub plan_valid: bool,
    /// Per SA.
    pub sas: Vec<ClusterSaReport>,
}

impl ClusterReport {
    /// Every outbound SA is in step, or has had nothing to compare yet
    /// because no packet went through it.
    pub fn in_step(&self) -> bool {
        self.sas
            .iter()
            .all(|s| matches!(s.lockstep, None | Some(LockState::InStep)))
    }

    /// `processing`, `standby`, `resyncing`, `waiting for a plan` or
    /// `stopped: ...`.
    pub fn state(&self) -> String {
        if !self.plan_valid {
            return match self.plan_age {
                None => "waiting for a plan".into(),
                Some(a) => format!(
                    "stopped: the plan was last confirmed {} s ago (hold {} s): etcd or the \
                     cluster agent is unreachable",
                    a.as_secs(),
                    self.opts.hold.as_secs()
                ),
            };
        }
        if !self.in_step() {
            return "resyncing".into();
        }
        if self.plan.members.contains(&self.opts.node) {
            "processing".into()
        } else {
            "standby".into()
        }
    }
}

impl ClusterNode {
    pub(super) fn new(opts: ClusterOptions) -> ClusterNode {
        ClusterNode {
            opts,
            plan: Plan::new(0, []),
            leader: None,
            valid_until: None,
            confirmed_at: None,
            sas: Vec::new(),
        }
    }

    fn sa(&mut self, id: SaId, outbound: bool) -> &mut SaCluster {
        let i = id.0 as usize;
        if self.sas.len() <= i {
            self.sas.resize_with(i + 1, || None);
        }
        let (plan, scheme) = (&self.plan, self.opts.dispatch);
        self.sas[i].get_or_insert_with(|| SaCluster {
            disp: Dispatcher::new(scheme, plan.clone()),
            lockstep: outbound.then(Lockstep::new),
            state: LockState::Unknown,
            resyncs: 0,
            solo: None,
            share_from: None,
        })
    }

    fn plan_valid(&self, now: Duration) -> bool {
        self.valid_until.is_some_and(|t| now <= t) && !self.plan.members.is_empty()
    }
}

fn dir(outbound: bool) -> &'static str {
    if outbound {
        "outbound"
    } else {
        "inbound"
    }
}

/// Whether this node processes a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// Process it.
    Mine,
    /// Another node does: advance the state only.
    Theirs,
    /// Nobody may (no valid plan, or this node is out of step although
    /// the plan names it): advance the state and count the drop.
    Nobody(DropReason),
}

impl ClusterNode {
    /// Outbound: the SA `id` is about to give sequence number `seq` to the
    /// clear packet `pkt` of flow `flow`.
    pub(super) fn outbound(
        &mut self,
        id: SaId,
        seq: u64,
        pkt: &[u8],
        flow: u64,
        now: Duration,
    ) -> Gate {
        let valid = self.plan_valid(now);
        let me = self.opts.node;
        let d = digest(pkt);
        let sa = self.sa(id, true);
        if let Some(l) = &mut sa.lockstep {
            l.record(seq, d);
        }
        let seen = Seen {
            counter: seq,
            len: pkt.len() as u32,
            flow: Some(flow),
        };
        if sa.share_from == Some(seq) {
            sa.disp.restart();
        }
        let owner = sa.disp.assign(&seen);
        if !valid {
            return Gate::Nobody(DropReason::ClusterNoPlan);
        }
        // Solo: the owner sends every packet and numbers them itself (the
        // others count along and catch up through the checkpoints).
        if let Some(o) = sa.solo_owner(seq, &sa.disp.plan().members) {
            return if o == me { Gate::Mine } else { Gate::Theirs };
        }
        match owner {
            // Not known to be in step (out of step, or not compared yet
            // since this node started or the SA appeared): processing
            // could send numbers another node has used.
            Some(o) if o == me && sa.state != LockState::InStep => {
                Gate::Nobody(DropReason::ClusterOutOfStep)
            }
            Some(o) if o == me => Gate::Mine,
            _ => Gate::Theirs,
        }
    }

    /// Inbound: SA `id` received a packet of `len` bytes with the low 32
    /// bits of its sequence number `seq` (read from the wire, so every node
    /// agrees however many packets it missed).
    pub(super) fn inbound(&mut self, id: SaId, seq: u32, len: usize, now: Duration) -> Gate {
        let valid = self.plan_valid(now);
        let me = self.opts.node;
        let sa = self.sa(id, false);
        if sa.share_from == Some(u64::from(seq)) {
            sa.disp.restart();
        }
        let owner = sa.disp.assign(&Seen {
            counter: u64::from(seq),
            len: len as u32,
            flow: None,
        });
        if !valid {
            return Gate::Nobody(DropReason::ClusterNoPlan);
        }
        if let Some(o) = sa.solo_owner(u64::from(seq), &sa.disp.plan().members) {
            return if o == me { Gate::Mine } else { Gate::Theirs };
        }
        if owner == Some(me) {
            Gate::Mine
        } else {
            Gate::Theirs
        }
    }
}

impl Engine {
    /// Installs the plan the cluster agent read from etcd (or confirms
    /// the one in force), valid for the hold from `now`. `leader`: the
    /// elected leader, which breaks ties in lockstep votes.
    pub fn cluster_plan(&mut self, plan: Plan, leader: Option<NodeId>, now: Duration) {
        let Some(c) = self.cluster.as_deref_mut() else {
            return;
        };
        if plan != c.plan {
            for s in c.sas.iter_mut().flatten() {
                s.disp.set_plan(plan.clone());
            }
            c.plan = plan;
        }
        // Every SA's dispatcher and history made now, off the packet path.
        for (i, m) in self.meta.iter().enumerate() {
            if let Some(m) = m {
                c.sa(SaId(i as u32), m.outbound);
            }
        }
        c.leader = leader;
        c.valid_until = Some(now + c.opts.hold);
        c.confirmed_at = Some(now);
    }

    /// Compares each outbound SA's history with the other nodes'
    /// checkpoints `(node, spi, seq, digest)` and moves this node's
    /// sequence numbers where a majority (counting this node; on a tie,
    /// the leader) puts them. Returns one line per change, for the log.
    pub fn cluster_check(&mut self, peers: &[(NodeId, u32, u64, u64)]) -> Vec<String> {
        let mut lines = Vec::new();
        let Some(c) = self.cluster.as_deref_mut() else {
            return lines;
        };
        let me = c.opts.node;
        // No other node in the plan: nobody to be out of step with.
        let alone = c.plan.members.iter().all(|m| *m == me);
        for (i, slot) in c.sas.iter_mut().enumerate() {
            let Some(sc) = slot else { continue };
            let id = SaId(i as u32);
            let Some(sa) = self.sad.get_mut(id) else {
                continue;
            };
            let spi = sa.config().spi;
            // A solo SA is numbered by its owner: the owner never moves,
            // the others follow the owner alone.
            let solo = sc.solo_owner(sa.next_seq(), &c.plan.members);
            let Some(l) = &mut sc.lockstep else { continue };
            if solo == Some(me) {
                sc.state = LockState::InStep;
                continue;
            }
            let counts = |node: NodeId| node != me && solo.is_none_or(|o| o == node);
            // Votes: this node and every peer that saw the packet in step
            // count for "stay"; peers that put it elsewhere vote for an offset.
            let mut stay = 1usize;
            let mut offs: Vec<(i64, usize, bool)> = Vec::new();
            let mut compared = false;
            let heard = peers.iter().any(|p| p.1 == spi && counts(p.0));
            for &(node, _, seq, d) in peers.iter().filter(|p| p.1 == spi && counts(p.0)) {
                match l.compare(seq, d) {
                    Verdict::InStep => {
                        stay += 1;
                        compared = true;
                    }
                    Verdict::Off(k) => {
                        compared = true;
                        let leader = c.leader == Some(node);
                        match offs.iter_mut().find(|o| o.0 == k) {
                            Some(o) => {
                                o.1 += 1;
                                o.2 |= leader;
                            }
                            None => offs.push((k, 1, leader)),
                        }
                    }
                    Verdict::Unknown => {}
                }
            }
            let best = offs.iter().max_by_key(|o| (o.1, o.2)).copied();
            let i_lead = c.leader == Some(me);
            let move_by = match best {
                Some((k, _, _)) if solo.is_some() => Some(k),
                Some((k, n, leader)) if n > stay || (n == stay && leader && !i_lead) => Some(k),
                _ => None,
            };
            match move_by {
                Some(k) => {
                    let next = sa.next_seq() as i64 + k;
                    if next > 0 && sa.resync_seq(next as u64) {
                        l.clear();
                        sc.resyncs += 1;
                        sc.state = LockState::InStep;
                        lines.push(format!(
                            "cluster: outbound SA {spi:#010x} was {} packet(s) {} the other \
                             nodes: its next sequence number is now {next}",
                            k.unsigned_abs(),
                            if k > 0 { "behind" } else { "ahead of" }
                        ));
                    } else {
                        if sc.state != LockState::OutOfStep {
                            lines.push(format!(
                                "cluster: outbound SA {spi:#010x} is out of step by {k} and \
                                 cannot move there; this node processes none of its packets"
                            ));
                        }
                        sc.state = LockState::OutOfStep;
                    }
                }
                None if compared => sc.state = LockState::InStep,
                // Nothing to compare: in step when this node is alone, or
                // when no node (this one included) has sent on the SA yet.
                None if alone || (l.checkpoint().is_none() && !heard) => {
                    sc.state = LockState::InStep
                }
                None => {}
            }
        }
        lines
    }

    /// The SA with `spi` in direction `outbound`.
    fn cluster_find(&self, spi: u32, outbound: bool) -> Option<SaId> {
        self.sad.iter().find_map(|(id, sa)| {
            (sa.config().spi == spi && self.meta_of(id).is_some_and(|m| m.outbound == outbound))
                .then_some(id)
        })
    }

    /// Marks a shared SA (negotiated by `owner`'s IKE) as processed by
    /// `owner` alone below `share_from` (`None`: for now, every packet).
    /// Returns a warning when this node learns `share_from` only after its
    /// counter passed it: the packets the plan gave this node in between
    /// were processed by nobody.
    pub fn cluster_solo(
        &mut self,
        spi: u32,
        outbound: bool,
        owner: NodeId,
        share_from: Option<u64>,
    ) -> Result<Option<String>, String> {
        let (sc, me, counter) = self.cluster_sa(spi, outbound)?;
        let was = sc.share_from;
        sc.solo = Some(owner);
        sc.share_from = share_from;
        Ok(match share_from {
            Some(from) if was.is_none() && owner != me && counter > from => Some(format!(
                "cluster: {} SA {spi:#010x} is dispatched over the plan from {from}, learnt at \
                 {counter}: this node's share of the {} packet(s) in between went unprocessed",
                dir(outbound),
                counter - from
            )),
            _ => None,
        })
    }

    /// The cluster state of the SA `(spi, outbound)`, this node's id and
    /// the SA's dispatch counter.
    fn cluster_sa(
        &mut self,
        spi: u32,
        outbound: bool,
    ) -> Result<(&mut SaCluster, NodeId, u64), String> {
        let id = self
            .cluster_find(spi, outbound)
            .ok_or_else(|| format!("no {} SA {spi:#010x}", dir(outbound)))?;
        let counter = self.cluster_counter(id);
        let c = self
            .cluster
            .as_deref_mut()
            .ok_or("this gateway is not a cluster node")?;
        let me = c.opts.node;
        Ok((c.sa(id, outbound), me, counter))
    }

    /// The counter a shared SA's dispatch runs on: outbound, the next
    /// sequence number; inbound, the highest received.
    fn cluster_counter(&self, id: SaId) -> u64 {
        match (self.sad.get(id), self.meta_of(id)) {
            (Some(sa), Some(m)) if m.outbound => sa.next_seq(),
            (Some(sa), Some(_)) => sa.replay_top() & 0xffff_ffff,
            _ => 0,
        }
    }

    /// On the SA's owner: starts dispatching it over the plan `margin`
    /// packets ahead of its counter now (time for the other nodes to hear
    /// of it), and returns that counter.
    pub fn cluster_share(&mut self, spi: u32, outbound: bool, margin: u64) -> Result<u64, String> {
        let (sc, me, counter) = self.cluster_sa(spi, outbound)?;
        if let Some(from) = sc.share_from {
            return Ok(from);
        }
        let from = counter.saturating_add(margin);
        sc.solo.get_or_insert(me);
        sc.share_from = Some(from);
        Ok(from)
    }

    /// This node's id (`None`: not a cluster node).
    pub fn cluster_node(&self) -> Option<NodeId> {
        self.cluster.as_deref().map(|c| c.opts.node)
    }

    /// The node's cluster state, for status (`None`: not a cluster node).
    pub fn cluster_report(&self, now: Duration) -> Option<ClusterReport> {
        let c = self.cluster.as_deref()?;
        let mut sas = Vec::new();
        for (i, m) in self.meta.iter().enumerate() {
            let Some(SaMeta { conn, outbound, .. }) = *m else {
                continue;
            };
            let Some(sa) = self.sad.get(SaId(i as u32)) else {
                continue;
            };
            let sc = c.sas.get(i).and_then(Option::as_ref);
            sas.push(ClusterSaReport {
                conn: self.conns[conn].spec.name.clone(),
                spi: sa.config().spi,
                outbound,
                checkpoint: sc
                    .and_then(|s| s.lockstep.as_ref())
                    .and_then(Lockstep::checkpoint),
                lockstep: outbound.then(|| sc.map_or(LockState::Unknown, |s| s.state)),
                resyncs: sc.map_or(0, |s| s.resyncs),
                solo: sc.and_then(|s| s.solo),
                share_from: sc.and_then(|s| s.share_from),
            });
        }
        Some(ClusterReport {
            opts: c.opts,
            plan: c.plan.clone(),
            leader: c.leader,
            plan_age: c.confirmed_at.map(|t| now.saturating_sub(t)),
            plan_valid: c.plan_valid(now),
            sas,
        })
    }

    /// Outbound, cluster mode: the gate for the clear packet in `pkt`
    /// about to go out on SA `id`. `None` when not a cluster node.
    pub(super) fn cluster_outbound(
        &mut self,
        id: SaId,
        pkt: &[u8],
        flow: &crate::wire::flow::Flow,
        now: Duration,
    ) -> Option<Gate> {
        let c = self.cluster.as_deref_mut()?;
        let seq = self.sad.get(id)?.next_seq();
        Some(c.outbound(id, seq, pkt, flow_key(flow), now))
    }
}
