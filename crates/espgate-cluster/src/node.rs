//! The daemon side of the agent: what it reads from its node and what it
//! tells it. [`ControlNode`] is the real one (the control socket); tests
//! give a fake.

use anyhow::{Context, Result};
use espgate_api::cluster::{ClusterStatus, ClusterUpdate};
use espgate_api::control::{Client, Request};
use std::path::PathBuf;
use std::time::Duration;

/// How long the agent waits for one answer of its daemon.
pub const DAEMON_TIMEOUT: Duration = Duration::from_secs(2);

/// The node's daemon as the agent sees it. Both calls block (the agent
/// makes them off its runtime thread) and should answer within a second
/// or two.
pub trait Node: Send + Sync + 'static {
    /// The cluster part of the node's status: `Ok(None)` when the daemon
    /// runs without `[cluster]`, `Err` when it did not answer.
    fn status(&self) -> Result<Option<ClusterStatus>>;
    /// Tells the node the plan, the leader and the other nodes'
    /// checkpoints.
    fn update(&self, update: ClusterUpdate) -> Result<()>;
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
}
