//! The daemon side of the agent: what it reads from its node and what it
//! tells it. [`ControlNode`] is the real one (the control socket); tests
//! give a fake.

use anyhow::{Context, Result};
use espgate_api::cluster::{ClusterSas, ClusterStatus, ClusterUpdate};
use espgate_api::control::{Client, Request};
use std::path::PathBuf;
use std::time::Duration;

/// How long the agent waits for one answer of its daemon.
pub const DAEMON_TIMEOUT: Duration = Duration::from_secs(2);

/// The node's daemon as the agent sees it. Every call blocks (the agent
/// makes them off its runtime thread) and should answer within a second
/// or two.
pub trait Node: Send + Sync + 'static {
    /// The cluster part of the node's status: `Ok(None)` when the daemon
    /// runs without `[cluster]`, `Err` when it did not answer.
    fn status(&self) -> Result<Option<ClusterStatus>>;
    /// Tells the node the plan, the leader and the other nodes'
    /// checkpoints.
    fn update(&self, update: ClusterUpdate) -> Result<()>;
    /// The SAs the node shares with the cluster, keys included: those its
    /// IKE negotiated and those it installed from etcd (the leader's agent
    /// publishes them).
    fn export(&self) -> Result<ClusterSas>;
    /// Shares the SA `(spi, outbound)` over the plan (on its owner, once
    /// every other member has it ready): the node picks the counter from
    /// which it is dispatched and answers with the updated list.
    fn share(&self, spi: u32, outbound: bool) -> Result<ClusterSas>;
}

/// A daemon behind its control socket.
#[derive(Debug, Clone)]
pub struct ControlNode {
    client: Client,
}

impl ControlNode {
    /// The daemon whose control socket is `socket`.
    pub fn new(socket: PathBuf) -> ControlNode {
        ControlNode {
            client: Client::new(socket, DAEMON_TIMEOUT),
        }
    }
}

impl Node for ControlNode {
    fn status(&self) -> Result<Option<ClusterStatus>> {
        let s = self
            .client
            .status()
            .context("reading the daemon's status")?;
        Ok(s.cluster)
    }

    fn update(&self, update: ClusterUpdate) -> Result<()> {
        self.client
            .change(&Request::Cluster(update))
            .context("sending the daemon its cluster update")?;
        Ok(())
    }

    fn export(&self) -> Result<ClusterSas> {
        self.client
            .cluster_sas(&Request::ClusterExport)
            .context("reading the daemon's shared SAs")
    }

    fn share(&self, spi: u32, outbound: bool) -> Result<ClusterSas> {
        self.client
            .cluster_sas(&Request::ClusterShare { spi, outbound })
            .with_context(|| format!("asking the daemon to share SA {spi:#010x}"))
    }
}
