//! Seed 003's flat cluster on the control socket: what the cluster agent
//! tells a node once a second ([`ClusterUpdate`], the `cluster` request)
//! and what the node says of itself ([`ClusterStatus`], in the status
//! document). The agent holds the etcd side (leases, the leader, the
//! plan key, every node's published state); the daemon holds the data
//! plane and never talks to etcd. `docs/CLUSTER.md` has the whole design.

use serde::{Deserialize, Serialize};

/// The dispatch plan: the live members in dispatch order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanDoc {
    /// Grows with every change of the plan.
    pub epoch: u64,
    /// Node ids, in dispatch order.
    pub members: Vec<u16>,
}

/// Another node's latest lockstep checkpoint of an outbound SA: at
/// sequence number `seq` it saw the inner packet whose digest is `digest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCheckpoint {
    /// The node.
    pub node: u16,
    /// The outbound SA.
    pub spi: u32,
    /// A sequence number (a multiple of the checkpoint interval).
    pub seq: u64,
    /// Digest of the inner packet that got it.
    pub digest: u64,
}

/// The agent's once-a-second word to its node (`{"cmd":"cluster",...}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterUpdate {
    /// The plan in force, as etcd holds it (`None`: none is known yet).
    pub plan: Option<PlanDoc>,
    /// The leader, when one is elected (it breaks ties in lockstep votes).
    #[serde(default)]
    pub leader: Option<u16>,
    /// The other live nodes' latest checkpoints.
    #[serde(default)]
    pub checkpoints: Vec<PeerCheckpoint>,
}

/// Lockstep health of one outbound SA on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lockstep {
    /// No comparison yet (no traffic, or no other node's checkpoint).
    Unknown,
    /// Its sequence numbers agree with the other nodes'.
    InStep,
    /// It disagreed and could not yet find where the others are: it
    /// processes nothing until it has resynchronised.
    OutOfStep,
}

/// One SA of a cluster node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSa {
    /// Connection.
    pub conn: String,
    /// SPI.
    pub spi: u32,
    /// Outbound (we send on it) or inbound.
    pub outbound: bool,
    /// Packets this node processed (encrypted or decrypted).
    pub processed: u64,
    /// Packets this node only counted (state advanced, packet dropped).
    pub observed: u64,
    /// Outbound: the latest checkpoint (sequence number, inner digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<(u64, u64)>,
    /// Outbound: lockstep health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lockstep: Option<Lockstep>,
    /// Outbound: times this node moved its sequence number to the others'.
    #[serde(default)]
    pub resyncs: u64,
}

/// The `cluster` part of a node's status document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// Cluster name.
    pub name: String,
    /// This node.
    pub node: u16,
    /// `packet-rr`, `packet-sqf`, `session-rr` or `session-sqf`.
    pub dispatch: String,
    /// The plan in force.
    pub plan: Option<PlanDoc>,
    /// The leader, as the agent last said.
    pub leader: Option<u16>,
    /// Milliseconds since the agent last confirmed the plan.
    pub plan_age_ms: Option<u64>,
    /// `processing`, `standby` (not in the plan), `resyncing`, `waiting
    /// for a plan` or `stopped: ...` (the hold ran out).
    pub state: String,
    /// Every SA is in step (or has nothing to compare yet).
    pub in_step: bool,
    /// Per SA.
    pub sas: Vec<ClusterSa>,
}
