//! What each agent publishes about its node at `nodes/ID`.

use espgate_api::cluster::{ClusterStatus, Lockstep, PeerCheckpoint};
use serde::{Deserialize, Serialize};

/// The state a report gives when the daemon did not answer.
pub const DAEMON_UNREACHABLE: &str = "daemon unreachable";
/// The state a report gives when the daemon answered without a cluster
/// part (it runs without `[cluster]`).
pub const NOT_A_CLUSTER_NODE: &str = "not a cluster node";

/// One node's report, published once a second under its lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    /// The node id.
    pub node: u16,
    /// The daemon's cluster state (`processing`, `standby`, `resyncing`,
    /// `waiting for a plan`, `stopped: ...`), or [`DAEMON_UNREACHABLE`] /
    /// [`NOT_A_CLUSTER_NODE`].
    pub state: String,
    /// The daemon answered with its cluster status.
    pub daemon: bool,
    /// Every outbound SA is in step (false when the daemon did not answer).
    pub in_step: bool,
    /// Per outbound SA.
    #[serde(default)]
    pub sas: Vec<SaReport>,
    /// `(spi, outbound)` of every shared SA (negotiated by the leader's
    /// IKE) that is installed here and able to take its share: what the
    /// leader waits for before it shares a new SA over the plan.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ready: Vec<(u32, bool)>,
}

/// One outbound SA of a node's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaReport {
    /// Connection.
    pub conn: String,
    /// SPI.
    pub spi: u32,
    /// The latest checkpoint: (sequence number, inner packet digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<(u64, u64)>,
    /// Packets this node processed.
    pub processed: u64,
    /// Packets this node only counted.
    pub observed: u64,
    /// Lockstep health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lockstep: Option<Lockstep>,
}

impl NodeReport {
    /// The report of node `node` from its daemon's answer: `Ok(Some)` the
    /// cluster part of its status, `Ok(None)` a daemon without one, `Err`
    /// no answer.
    pub fn from_status(node: u16, status: Result<Option<&ClusterStatus>, ()>) -> NodeReport {
        match status {
            Ok(Some(c)) => NodeReport {
                node,
                state: c.state.clone(),
                daemon: true,
                in_step: c.in_step,
                sas: c
                    .sas
                    .iter()
                    .filter(|s| s.outbound)
                    .map(|s| SaReport {
                        conn: s.conn.clone(),
                        spi: s.spi,
                        checkpoint: s.checkpoint,
                        processed: s.processed,
                        observed: s.observed,
                        lockstep: s.lockstep,
                    })
                    .collect(),
                ready: c
                    .sas
                    .iter()
                    .filter(|s| s.shared && s.ready())
                    .map(|s| (s.spi, s.outbound))
                    .collect(),
            },
            Ok(None) => NodeReport {
                node,
                state: NOT_A_CLUSTER_NODE.into(),
                daemon: true,
                in_step: false,
                sas: Vec::new(),
                ready: Vec::new(),
            },
            Err(()) => NodeReport {
                node,
                state: DAEMON_UNREACHABLE.into(),
                daemon: false,
                in_step: false,
                sas: Vec::new(),
                ready: Vec::new(),
            },
        }
    }

    /// Whether the shared SA `(spi, outbound)` is installed and ready here.
    pub fn is_ready(&self, spi: u32, outbound: bool) -> bool {
        self.ready.contains(&(spi, outbound))
    }

    /// This node's checkpoints, one per outbound SA that has one, as
    /// another node's daemon takes them.
    pub fn checkpoints(&self) -> impl Iterator<Item = PeerCheckpoint> + '_ {
        self.sas.iter().filter_map(|s| {
            s.checkpoint.map(|(seq, digest)| PeerCheckpoint {
                node: self.node,
                spi: s.spi,
                seq,
                digest,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_api::cluster::ClusterSa;

    fn sa(spi: u32, outbound: bool, checkpoint: Option<(u64, u64)>) -> ClusterSa {
        ClusterSa {
            conn: "c".into(),
            spi,
            outbound,
            processed: 10,
            observed: 20,
            checkpoint,
            lockstep: outbound.then_some(Lockstep::InStep),
            resyncs: 0,
            shared: false,
            solo: None,
            share_from: None,
        }
    }

    #[test]
    fn a_report_keeps_outbound_sas_and_their_checkpoints() {
        let status = ClusterStatus {
            name: "gw".into(),
            node: 2,
            dispatch: "packet-rr".into(),
            plan: None,
            leader: None,
            plan_age_ms: None,
            state: "standby".into(),
            in_step: true,
            sas: vec![
                sa(1, true, Some((256, 7))),
                sa(2, false, None),
                sa(3, true, None),
            ],
        };
        let r = NodeReport::from_status(2, Ok(Some(&status)));
        assert_eq!(r.sas.iter().map(|s| s.spi).collect::<Vec<_>>(), [1, 3]);
        assert!(r.in_step && r.daemon);
        let cps: Vec<_> = r.checkpoints().collect();
        assert_eq!(
            cps,
            [PeerCheckpoint {
                node: 2,
                spi: 1,
                seq: 256,
                digest: 7
            }]
        );
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<NodeReport>(&text).unwrap(), r);
        let down = NodeReport::from_status(2, Err(()));
        assert!(!down.in_step && !down.daemon);
        assert_eq!(down.state, DAEMON_UNREACHABLE);
        let plain = NodeReport::from_status(2, Ok(None));
        assert!(!plain.in_step && plain.daemon);
        // No shared SA: no `ready` in the report (older agents read it).
        assert!(!text.contains("ready"), "{text}");
    }

    #[test]
    fn a_report_lists_the_shared_sas_ready_here() {
        let shared = |spi, outbound, lockstep| ClusterSa {
            shared: true,
            lockstep,
            ..sa(spi, outbound, None)
        };
        let status = ClusterStatus {
            name: "gw".into(),
            node: 3,
            dispatch: "packet-rr".into(),
            plan: None,
            leader: None,
            plan_age_ms: None,
            state: "processing".into(),
            in_step: true,
            sas: vec![
                // Manual SAs are never listed.
                sa(1, true, None),
                sa(2, false, None),
                // Inbound: ready once installed; outbound: once in step.
                shared(0x10, false, None),
                shared(0x11, true, Some(Lockstep::InStep)),
                shared(0x12, true, Some(Lockstep::Unknown)),
                shared(0x13, true, Some(Lockstep::OutOfStep)),
            ],
        };
        let r = NodeReport::from_status(3, Ok(Some(&status)));
        assert_eq!(r.ready, [(0x10, false), (0x11, true)]);
        assert!(r.is_ready(0x11, true) && !r.is_ready(0x11, false) && !r.is_ready(0x12, true));
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<NodeReport>(&text).unwrap(), r);
        // A report from before `ready` existed still reads.
        let old = r#"{"node":3,"state":"standby","daemon":true,"in_step":true}"#;
        assert!(serde_json::from_str::<NodeReport>(old)
            .unwrap()
            .ready
            .is_empty());
    }
}
