//! Seed 003's flat cluster on the control socket: what the cluster agent
//! tells a node once a second ([`ClusterUpdate`], the `cluster` request)
//! and what the node says of itself ([`ClusterStatus`], in the status
//! document). The agent holds the etcd side (leases, the leader, the
//! plan key, every node's published state); the daemon holds the data
//! plane and never talks to etcd. `docs/CLUSTER.md` has the whole design.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;
use zeroize::Zeroize;

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
    /// Every SA the leader's IKE negotiated for the cluster, as etcd holds
    /// it (decrypted by the agent): the node installs those it lacks and
    /// removes the shared SAs no longer listed. `None`: the agent did not
    /// read them this time (no change is made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sas: Option<Vec<SharedSa>>,
    /// The leader's IKE SAs as etcd holds them (decrypted by the agent): a
    /// node that becomes the leader continues them instead of negotiating
    /// anew. `None`: not read this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ike: Option<Vec<SharedIke>>,
}

/// The state of one IKE SA of the leader (keys included), as a new leader
/// needs it to continue the IKE SA without a new handshake. Opaque to
/// everything but the IKE engine; sealed in etcd like [`SharedSa`]; wiped
/// on drop and never printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedIke {
    /// The connection (one IKE SA per connection).
    pub conn: String,
    /// The node whose IKE runs it.
    pub owner: u16,
    /// The IKE engine's snapshot: its JSON in hex (nothing to unescape
    /// where it travels inside other JSON, so no parser copies it into a
    /// scratch buffer it frees unwiped).
    pub state: String,
}

impl fmt::Debug for SharedIke {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedIke")
            .field("conn", &self.conn)
            .field("owner", &self.owner)
            .field("state", &"(not shown: keys)")
            .finish()
    }
}

impl Drop for SharedIke {
    fn drop(&mut self) {
        self.state.zeroize();
    }
}

/// An SA negotiated by the leader's IKE and shared with every node of the
/// cluster. It carries the SA's keys: it travels only on the control
/// socket (mode 0600, lines wiped) and, encrypted under the cluster key,
/// in etcd; its keys are wiped on drop and never printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedSa {
    /// The connection (every node runs the same configuration).
    pub conn: String,
    /// We send on it (else we receive on it).
    pub outbound: bool,
    /// `esp` or `qesp`.
    pub protocol: String,
    /// SPI.
    pub spi: u32,
    /// Suite name, as in `espgate sa add` (`aes128gcm16`, ...).
    pub suite: String,
    /// Encryption key in hex (with the salt for AEAD suites).
    pub enc_key: String,
    /// Integrity key in hex (empty for AEAD suites).
    pub integ_key: String,
    /// 64-bit sequence numbers.
    pub esn: bool,
    /// UDP encapsulation ports (ours, the peer's), when NAT-T is in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encap: Option<(u16, u16)>,
    /// The peer's address where the leader's IKE found it (a NAT may have
    /// moved it away from the connection's `remote`); `None`: `remote`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<IpAddr>,
    /// The node whose IKE negotiated it: it alone processes the SA's
    /// packets until `share_from`.
    pub owner: u16,
    /// The counter (outbound: sequence number; inbound: the wire sequence
    /// number) from which the SA's packets are dispatched over the plan
    /// like any other; `None`: not yet (the other nodes are still
    /// installing it and catching up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_from: Option<u64>,
    /// The selectors negotiated for it when the peer narrowed the
    /// configured ones, one per item in the form of
    /// `espgate_core::selector::TrafficSelector`'s `Display`; empty: the
    /// connection's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<String>,
}

impl fmt::Debug for SharedSa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSa")
            .field("conn", &self.conn)
            .field("outbound", &self.outbound)
            .field("protocol", &self.protocol)
            .field("spi", &format_args!("{:#010x}", self.spi))
            .field("suite", &self.suite)
            .field("keys", &"(not shown)")
            .field("esn", &self.esn)
            .field("encap", &self.encap)
            .field("owner", &self.owner)
            .field("share_from", &self.share_from)
            .finish()
    }
}

impl Drop for SharedSa {
    fn drop(&mut self) {
        self.enc_key.zeroize();
        self.integ_key.zeroize();
    }
}

impl SharedSa {
    /// Its key in etcd and in logs: `0x0000c0de-out`.
    pub fn name(&self) -> String {
        format!(
            "{:#010x}-{}",
            self.spi,
            if self.outbound { "out" } else { "in" }
        )
    }
}

/// The SAs a node shares with the cluster (the answer to `cluster_export`
/// and `cluster_share`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ClusterSas {
    /// Grows with every change of the list, so that an agent polling it
    /// often can tell when to write etcd.
    pub generation: u64,
    /// The SAs: those this node's IKE negotiated, and those it installed
    /// from etcd (a new leader keeps publishing them until its own IKE
    /// replaces them).
    pub sas: Vec<SharedSa>,
    /// The IKE SAs this node runs (only while it leads).
    #[serde(default)]
    pub ike: Vec<SharedIke>,
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
    /// Negotiated by the leader's IKE and shared through etcd (else a
    /// manual SA from the configuration).
    #[serde(default)]
    pub shared: bool,
    /// While only this node processes the SA (it was just negotiated): the
    /// node that does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solo: Option<u16>,
    /// The counter from which the SA is dispatched over the plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_from: Option<u64>,
}

impl ClusterSa {
    /// Installed here and able to take its share: inbound at once,
    /// outbound once in step with the others.
    pub fn ready(&self) -> bool {
        !self.outbound || self.lockstep == Some(Lockstep::InStep)
    }
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
