//! The cluster agent of seed 003's flat cluster (issue 15): the one part
//! of a node that talks to etcd. The daemon never does; the agent reads
//! its node's status and tells it the plan over the control socket
//! (`espgate_api::control`, the `status` and `cluster` requests).
//!
//! # The etcd layout
//!
//! Everything of cluster `NAME` lives under `/espgate/NAME/`:
//!
//! | key | value | lifetime |
//! | --- | --- | --- |
//! | `nodes/ID` | the node's [`NodeReport`] (JSON): daemon state, in step, per outbound SA the checkpoint and counts | attached to the node's lease: gone when the agent stops or dies |
//! | `leader/LEASE` | the node id (decimal), put by etcd's election API (`Campaign` with the lease); the key created first is the leader | attached to the lease |
//! | `plan` | the [`PlanDoc`](espgate_api::cluster::PlanDoc) `{"epoch":N,"members":[...]}` (JSON) | permanent; only the leader writes it |
//! | `sas/0xSPI-in`, `sas/0xSPI-out` | a [`SharedSa`](espgate_api::cluster::SharedSa) negotiated by the leader's IKE, sealed under the cluster key ([`Sealer`]: `{"v":1,"nonce":"HEX","ct":"HEX"}`) | permanent; only the leader writes them, and deletes those its daemon no longer exports |
//! | `ike/CONN` ([`Keys::ike`]: the connection name, odd bytes as `%XX`) | the [`SharedIke`](espgate_api::cluster::SharedIke) state of the IKE SA that the leader's daemon runs for that connection, sealed like an SA | permanent; only the leader writes them, and deletes only its own that its daemon no longer exports |
//!
//! # Timings
//!
//! - Each agent holds one lease of `lease_ttl` (default 3 s), renewed every
//!   `lease_ttl / 3`. A lost lease (etcd says it is gone) is replaced by a
//!   new one; the report and the campaign follow it.
//! - Every second ([`PERIOD`]) the agent reads its daemon's status,
//!   publishes its report, reads `plan`, the leader, `nodes/`, `sas/` and
//!   `ike/` in one transaction (one consistent snapshot), and, only when all of that
//!   worked, sends the daemon a `cluster` update: the plan, the leader and
//!   every other live node's checkpoints. The same cycle runs at once when
//!   the plan changes, a report key is deleted (a node left or its lease
//!   expired) or this node is elected (watches on `plan` and `nodes/`,
//!   the campaign's answer). When etcd cannot be read the
//!   daemon hears nothing; it forwards on its last plan until its `hold`
//!   runs out (the daemon's rule).
//! - A node that stops ([`Agent::stop`]) resigns and revokes its lease, so
//!   it leaves the plan at once (the leader's watch sees its report go);
//!   one that dies leaves it when its lease expires, within `lease_ttl`
//!   (and etcd's expiry check, half a second).
//!
//! # The shared SAs (with `key_file`)
//!
//! Only the leader's daemon runs IKE. The leader's agent publishes its
//! daemon's export (`cluster_export`) under `sas/`: it puts each SA whose
//! entry is missing or holds something else (compared decrypted, so an
//! unchanged SA is not rewritten), deletes the entries the export does not
//! list, and guards every write with its election key as it does the plan's.
//! It looks at the export every [`SA_POLL`] (100 ms) and publishes at once
//! when its generation changed. Every agent reads `sas/` in the cycle's
//! snapshot, opens each entry (one that does not open is skipped, with one
//! warning per entry) and gives its daemon the list (`ClusterUpdate::sas`);
//! a watch on `sas/` runs the cycle at once. Each report lists the shared
//! SAs its daemon has ready (`NodeReport::ready`); when every other member
//! of the plan lists one of the leader's own unshared SAs (at once when the
//! plan names only the leader), the leader calls `cluster_share` and
//! publishes the SA with its `share_from`.
//!
//! The leader's IKE SA states (`ClusterSas::ike`) travel the same way
//! under `ike/`, one entry per connection: put when missing or different
//! (decrypted), each put of a new state at debug level only (it changes
//! with every IKE exchange); an entry is deleted only when its owner is
//! the leader itself and its export no longer has the connection, so a
//! previous leader's state stays until the new leader's daemon continues
//! it and exports it as its own. Every agent gives its daemon the opened
//! states (`ClusterUpdate::ike`); a watch on `ike/` runs the cycle at once.
//!
//! # The plan rule
//!
//! The leader's members are the sorted ids of the nodes that have a report
//! (a live lease) whose daemon answered as a cluster node and says it is
//! in step ([`eligible`]). The leader writes `plan` with `epoch + 1` only
//! when that set differs from the plan's (epoch 1 when there is no plan
//! yet), in a transaction that requires the plan's mod revision to be the
//! one it read and its own election key to be the leader's: two leaders
//! never both write.
//!
//! # Pieces
//!
//! - [`Agent`]: the agent thread ([`Agent::start`] for a daemon's control
//!   socket, [`Agent::start_with`] for any [`Node`]).
//! - [`Node`]: the daemon side, [`ControlNode`] over the control socket.
//! - [`Sealer`]: the shared SAs' encryption under the cluster key.
//! - [`cluster_view`]: a one-shot read for `espgate cluster status`
//!   ([`ClusterView`], with a text rendering).

mod agent;
mod etcd;
mod node;
mod report;
mod sealed;
mod view;

pub use agent::{Agent, PERIOD, SA_POLL};
pub use etcd::{eligible, plan_members, Keys};
pub use node::{ControlNode, Node, DAEMON_TIMEOUT};
pub use report::{NodeReport, SaReport, DAEMON_UNREACHABLE, NOT_A_CLUSTER_NODE};
pub use sealed::Sealer;
pub use view::{cluster_view, ClusterView, VIEW_TIMEOUT};
