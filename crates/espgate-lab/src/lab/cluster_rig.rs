//! Seed 003's flat cluster in network namespaces, as
//! `tests/python/test_cluster.py` builds it: n espgate nodes (1 to 6) that
//! share one outside and one inside address and MAC, on two Linux bridges
//! with learning off on every port (ageing time 0), so that every frame
//! floods to every node. The lab plays the cluster agent: a thread sends
//! every node the plan (members = the nodes of the run) and the other
//! nodes' checkpoints once a second, over the typed control API, as the
//! agent does after each good etcd read (the `[cluster]` etcd endpoints
//! point nowhere).
//!
//! ```text
//!  ho 10.1.0.5 ──┐ swin (floods)    n1..nN: in0 10.1.0.1 (shared MAC)
//!                ├── n1 … nN ──┐    out0 192.168.50.1 (shared MAC)
//!                               └ swout (floods) ── pe 192.168.50.2
//! ```
//!
//! Traffic is the lab's own: a paced UDP generator in `ho` sends to
//! 10.2.0.10 (the peer's inside network), and an ESP counter in `pe`,
//! bound to the peer's UDP port 4500, counts the ESP-in-UDP datagrams the
//! cluster delivers, by distinct sequence number. An AH cluster sends raw
//! AH (IP protocol 51, `encap = "none"`: RFC 3948 encapsulates ESP only),
//! and the counter is then a raw AH socket bound to the peer's address.
//! That is where seed 003 measured (on delivery to the router, after
//! encryption); nothing on this machine decrypts, because one decrypting
//! peer on the same two vCPUs would need as much CPU as the whole cluster
//! and become the bound.
//!
//! Each node's espgate process runs in a CPU cgroup capped at
//! `cpu_pct` % of one vCPU (the node's "hardware"), with a 10 ms period
//! so that a throttled node stalls for milliseconds, not for tens of them
//! (`cpu_pct` 0: no cap).
//!
//! With `etcd_members` > 0 the rig is no agent: it starts an etcd of that
//! many members ([`ETCD`], each in its own namespace on a third bridge,
//! `swmgmt`, 10.99.0.0/24, data in the work directory), the nodes'
//! `[cluster]` tables point at every member with a [`LEASE_TTL`] lease and
//! a [`HOLD`] hold, and each node's `espgate up` runs the real agent, as
//! `test_cluster.py`'s `etcd_cluster()` does.
//!
//! Everything is removed on drop: on success, on error and after Ctrl-C.

use crate::netlab::{self, in_ns, ip, random_hex, spawn_gateway, write_private, Lab};
use anyhow::{anyhow, bail, ensure, Context, Result};
use espgate_api::cluster::{ClusterStatus, ClusterUpdate, PeerCheckpoint, PlanDoc};
use espgate_api::control::{Client, Request, Response};
use espgate_config::schema::{
    value, ClusterTable, ConfigFile, ConnectionTable, Encapsulation, GatewayTable, ModeName,
    Protocols, SaTable, Scalar, SecretHex,
};
use espgate_core::cluster::Dispatch;
use espgate_core::sa::Protocol;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The shared outside MAC.
pub const OUT_MAC: &str = "02:e5:9a:00:00:01";
/// The shared inside MAC.
pub const IN_MAC: &str = "02:e5:9a:00:00:02";
/// The shared outside address (the gateway the peer talks to).
pub const OUTSIDE: &str = "192.168.50.1";
/// The peer's outside address (the ESP counter binds it).
pub const PEER: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);
/// The shared inside address (the hosts' gateway).
pub const INSIDE_GW: &str = "10.1.0.1";
/// The traffic source.
pub const HOST: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 5);
/// Where the generator sends: the peer's inside network.
pub const DEST: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 10);
/// The most nodes a rig has.
pub const MAX_NODES: u16 = 6;
/// The cfs period of a node's quota, µs.
pub const NODE_PERIOD_US: u64 = 10_000;
/// IPv4 + UDP headers of the generator's packets.
pub const IP_UDP: u16 = 28;
/// The outbound SPI (the nodes send on it).
const SPI_OUT: u32 = 0x1002;
const SPI_IN: u32 = 0x1001;
/// MTU of the outside segment and `gateway.mtu`: room for a 1500-byte
/// inner packet with its ESP-in-UDP overhead, so nothing is fragmented.
const OUTSIDE_MTU: u32 = 1600;
/// How long after the last packet the counter keeps counting.
const DRAIN: Duration = Duration::from_millis(300);
/// The etcd server the rig starts (scripts/setup.sh installs etcd-server).
pub const ETCD: &str = "/usr/bin/etcd";
/// `[cluster] lease_ttl` of a rig with etcd.
pub const LEASE_TTL: &str = "2s";
/// `[cluster] hold` of a rig with etcd.
pub const HOLD: &str = "6s";
/// The most etcd members a rig starts.
pub const MAX_ETCD: u16 = 5;

/// The address of etcd member `k` (0-based) on the management bridge.
pub fn etcd_addr(k: u16) -> String {
    format!("10.99.0.{}", 100 + k)
}

/// One cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpec {
    /// Nodes, 1..=[`MAX_NODES`].
    pub nodes: u16,
    /// ESP (in UDP) or AH (raw IP, `encap = "none"`); not Q-ESP.
    pub protocol: Protocol,
    /// The suite (espgate's name: ESP e.g. `3des-md5`, `aes128gcm16`; AH
    /// e.g. `md5`, `sha256`).
    pub suite: String,
    /// `[cluster] dispatch`.
    pub dispatch: Dispatch,
    /// CPU quota of each node's espgate, % of one vCPU (0: none).
    pub cpu_pct: u32,
    /// Members of the etcd the rig starts; 0: no etcd, the rig plays the
    /// agent.
    pub etcd_members: u16,
}

impl ClusterSpec {
    /// A one-line description for the report.
    pub fn describe(&self) -> String {
        let cap = if self.cpu_pct == 0 {
            "no CPU cap on the nodes".to_string()
        } else {
            format!(
                "each node's espgate capped at {} % of one vCPU (cfs quota, {} ms period)",
                self.cpu_pct,
                NODE_PERIOD_US / 1000
            )
        };
        let agent = if self.etcd_members == 0 {
            String::new()
        } else {
            format!(
                ", etcd of {} member(s) and the nodes' own agents (lease_ttl {LEASE_TTL}, \
                 hold {HOLD})",
                self.etcd_members
            )
        };
        let carrier = match self.protocol {
            Protocol::Ah => format!("AH {} on raw IP (encap none)", self.suite),
            _ => format!("ESP {} in UDP", self.suite),
        };
        format!(
            "{} node(s), {carrier}, tunnel mode, manual keys, dispatch {}, {cap}{agent}",
            self.nodes,
            self.dispatch.name(),
        )
    }
}

/// Keys of one direction: (encryption, integrity), hex.
type Keys = (String, String);

fn legacy(suite: &str) -> bool {
    ["des", "3des", "md5"]
        .iter()
        .any(|l| suite.split('-').any(|p| p == *l))
}

/// The configuration file of node `node` (or of an ordinary peer when
/// `node` is `None`, with the directions swapped): `keys_out` seal what
/// the cluster sends, `keys_in` what it receives. ESP goes in UDP with a
/// `[connection.esp]` table; AH on raw IP (`encap = "none"`, as espgate
/// requires for AH) with a `[connection.ah]` table.
pub fn node_config(
    spec: &ClusterSpec,
    node: Option<u16>,
    keys_out: &Keys,
    keys_in: &Keys,
) -> String {
    let key = |k: &str| {
        (!k.is_empty()).then(|| value(SecretHex::new(zeroize::Zeroizing::new(k.to_string()))))
    };
    let ah = spec.protocol == Protocol::Ah;
    let gateway = GatewayTable {
        tun: Some(value("tunc".into())),
        listen: Some(value("0.0.0.0:4500".into())),
        control_socket: Some(value("ctl.sock".into())),
        state_dir: Some(value("state".into())),
        mtu: Some(value(OUTSIDE_MTU.into())),
        encap: Some(if ah {
            Encapsulation::None
        } else {
            Encapsulation::Udp
        }),
        ..GatewayTable::default()
    };
    let (local, remote, lts, rts) = match node {
        Some(_) => (
            OUTSIDE.to_string(),
            PEER.to_string(),
            "10.1.0.0/24",
            "10.2.0.0/24",
        ),
        None => (
            PEER.to_string(),
            OUTSIDE.to_string(),
            "10.2.0.0/24",
            "10.1.0.0/24",
        ),
    };
    let mut conn = ConnectionTable::new("lab", &local, &remote);
    conn.mode = Some(ModeName::Tunnel);
    conn.local_ts = Some(value(vec![value(lts.to_string())]));
    conn.remote_ts = Some(value(vec![value(rts.to_string())]));
    conn.protocol = Some(value(if ah { Protocols::Ah } else { Protocols::Esp }));
    if legacy(&spec.suite) {
        conn.allow_insecure = Some(true);
    }
    let (spis, k_in, k_out) = match node {
        Some(_) => ((SPI_IN, SPI_OUT), keys_in, keys_out),
        None => ((SPI_OUT, SPI_IN), keys_out, keys_in),
    };
    let mut sa = SaTable::new(&spec.suite, spis.0, spis.1);
    sa.enc_in = key(&k_in.0);
    sa.integ_in = key(&k_in.1);
    sa.enc_out = key(&k_out.0);
    sa.integ_out = key(&k_out.1);
    if ah {
        conn.ah = Some(value(sa));
    } else {
        conn.esp = Some(value(sa));
    }
    let cluster = node.map(|id| {
        let (etcd, lease_ttl, hold) = if spec.etcd_members == 0 {
            // Nowhere: the lab is the agent and sends the plan itself.
            (vec![value("http://127.0.0.1:1".into())], None, "10s")
        } else {
            let eps = (0..spec.etcd_members)
                .map(|k| value(format!("http://{}:2379", etcd_addr(k))))
                .collect();
            (eps, Some(value(Scalar::Str(LEASE_TTL.into()))), HOLD)
        };
        value(ClusterTable {
            name: Some(value("lab".into())),
            node: Some(value(id.into())),
            etcd: Some(etcd),
            dispatch: Some(value(spec.dispatch.name().into())),
            inside: Some(value("in0".into())),
            outside: Some(value("out0".into())),
            lease_ttl,
            hold: Some(value(Scalar::Str(hold.into()))),
            ..ClusterTable::default()
        })
    });
    let file = ConfigFile {
        gateway: Some(value(gateway)),
        connection: vec![value(conn)],
        cluster,
    };
    let body = toml::to_string(&file).expect("a configuration of strings and integers");
    format!("# written by espgate lab (cluster rig)\n{body}")
}

/// How long the rig waits for a node's control answer: a margin for a
/// host where six nodes, the generator and the sink share two CPUs
/// (nothing here is timed by it). A node answers in milliseconds even
/// while its worker is flooded, since the worker hands its engine's lock
/// over fairly (`espgate_daemon::worker::EngineLock`); before that, a
/// node under a 3DES flood did not answer within 2 s or at all.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the agent thread shares with the rig.
#[derive(Default)]
struct AgentState {
    rounds: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// One round of the agent: every node's status, then to each node the
/// plan and the other members' latest outbound checkpoints (as
/// `test_cluster.py`'s `plan()` does). Returns the statuses read.
pub fn agent_round(
    clients: &[Client],
    plan: &PlanDoc,
    leader: u16,
) -> Result<Vec<Option<ClusterStatus>>> {
    let docs: Vec<Option<ClusterStatus>> = clients
        .iter()
        .map(|c| c.status().ok().and_then(|s| s.cluster))
        .collect();
    let mut first_err = None;
    for (i, c) in clients.iter().enumerate() {
        let me = i as u16 + 1;
        let checkpoints = checkpoints_for(me, &plan.members, &docs);
        let req = Request::Cluster(ClusterUpdate {
            plan: Some(plan.clone()),
            leader: Some(leader),
            checkpoints,
            sas: None,
            ike: None,
        });
        match c.call(&req) {
            Ok(Response::Changed(_)) => {}
            Ok(_) => {
                first_err.get_or_insert_with(|| format!("node {me}: an unexpected answer"));
            }
            Err(e) => {
                first_err.get_or_insert_with(|| format!("node {me}: {e}"));
            }
        }
    }
    match first_err {
        Some(e) => Err(anyhow!(e)),
        None => Ok(docs),
    }
}

/// The checkpoints node `me` is told: every other member's outbound
/// SAs' latest (node ids are 1-based indices into `docs`).
pub fn checkpoints_for(
    me: u16,
    members: &[u16],
    docs: &[Option<ClusterStatus>],
) -> Vec<PeerCheckpoint> {
    let mut out = Vec::new();
    for (j, doc) in docs.iter().enumerate() {
        let node = j as u16 + 1;
        if node == me || !members.contains(&node) {
            continue;
        }
        for sa in doc.iter().flat_map(|d| &d.sas) {
            if let (true, Some((seq, digest))) = (sa.outbound, sa.checkpoint) {
                out.push(PeerCheckpoint {
                    node,
                    spi: sa.spi,
                    seq,
                    digest,
                });
            }
        }
    }
    out
}

/// When packet `i` is due: the bits before it at `rate_bps`.
pub fn due(bits_before: u64, rate_bps: f64) -> Duration {
    Duration::from_secs_f64(bits_before as f64 / rate_bps.max(1.0))
}

/// One packet to send: destination port (the flow) and IPv4 size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Send {
    /// UDP destination port.
    pub port: u16,
    /// IPv4 packet size, bytes (UDP payload = size − 28).
    pub ip_len: u16,
}

/// What one trial saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trial {
    /// Packets the generator tried to send.
    pub sent: u64,
    /// Of those, refused by the socket (counted lost).
    pub send_errors: u64,
    /// Distinct ESP sequence numbers that reached the peer.
    pub received: u64,
    /// ESP datagrams whose sequence number had already arrived (two
    /// nodes sent the same number: out of step).
    pub duplicates: u64,
    /// IPv4 bits offered.
    pub bits: u64,
    /// The schedule's length, s.
    pub planned_s: f64,
    /// From the first send to the last, s.
    pub actual_s: f64,
}

impl Trial {
    /// Lost, % of sent.
    pub fn loss_pct(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        self.sent.saturating_sub(self.received) as f64 / self.sent as f64 * 100.0
    }

    /// The rate offered, Mbit/s of IPv4 packets: the bits over the longer
    /// of the schedule and the time the generator took (a generator that
    /// fell behind offered less than asked).
    pub fn offered_mbps(&self) -> f64 {
        self.bits as f64 / self.planned_s.max(self.actual_s).max(1e-9) / 1e6
    }

    /// The generator kept to the schedule (within 3 %).
    pub fn on_schedule(&self) -> bool {
        self.actual_s <= self.planned_s * 1.03 + 0.002
    }
}

/// A binary search for the highest rate that passes, with a hint: after
/// a failure, the next rate tried is 95 % of what was delivered (when
/// that lies in the bracket), so an overload at the start costs one step,
/// not a halving per factor of two.
#[derive(Debug, Clone, PartialEq)]
pub struct Search {
    /// Highest rate that passed (0: none yet).
    pub lo: f64,
    /// Lowest rate that failed.
    pub hi: f64,
    next: Option<f64>,
    soft: Option<f64>,
    steps: usize,
    max_steps: usize,
    /// Stop when (hi − lo) / hi is below this.
    resolution: f64,
}

impl Search {
    /// A search that tries `start` first and at most `max_steps` rates.
    pub fn new(start: f64, max_steps: usize, resolution: f64) -> Search {
        Search {
            lo: 0.0,
            hi: start,
            next: Some(start),
            soft: None,
            steps: 0,
            max_steps,
            resolution,
        }
    }

    /// The next rate to try, or `None` when done.
    pub fn next(&self) -> Option<f64> {
        if self.steps >= self.max_steps {
            return None;
        }
        self.next
    }

    /// The outcome at `rate`; `delivered`, the rate that got through.
    pub fn record(&mut self, rate: f64, pass: bool, delivered: f64) {
        self.steps += 1;
        if pass {
            self.lo = self.lo.max(rate);
        } else {
            self.hi = self.hi.min(rate);
        }
        if self.lo >= self.hi || (self.hi - self.lo) / self.hi < self.resolution {
            self.next = None;
            return;
        }
        let hint = delivered * 0.95;
        if !pass && hint > self.lo && hint < rate * 0.9 {
            // Search near what got through first: up to 10 % above it
            // (a soft top, dropped once the passes reach it).
            self.soft = Some((delivered * 1.1).min(self.hi));
            self.next = Some(hint);
            return;
        }
        let mut top = self.hi;
        if let Some(s) = self.soft {
            if s < self.hi && self.lo < s * (1.0 - self.resolution) {
                top = s;
            } else {
                self.soft = None;
            }
        }
        self.next = Some((self.lo + top) / 2.0);
    }

    /// The highest rate that passed.
    pub fn result(&self) -> f64 {
        self.lo
    }
}

/// An ESP datagram at the peer: its sequence number and arrival time.
pub type Arrival = (u32, Instant);
/// A stream's first and last send.
pub type Span = (Instant, Instant);

/// The ESP counter at the peer: each ESP datagram's sequence number and
/// arrival time while armed.
struct Counter {
    armed: AtomicBool,
    seqs: Mutex<Vec<(u32, Instant)>>,
    other: AtomicU64,
}

/// The first arrival of each distinct sequence number, in order of
/// sequence number.
pub fn first_arrivals(arrivals: &[(u32, Instant)]) -> Vec<(u32, Instant)> {
    let mut v = arrivals.to_vec();
    v.sort_unstable();
    v.dedup_by_key(|a| a.0);
    v
}

/// The longest silence at the peer between `from` (the stream's first
/// send) and `to` (its last): the largest interval between consecutive
/// first arrivals of distinct sequence numbers, counting the intervals
/// from `from` to the first arrival and from the last to `to` (arrivals
/// outside the window are not counted; nothing at all: `to − from`).
pub fn longest_gap(arrivals: &[(u32, Instant)], from: Instant, to: Instant) -> Duration {
    let mut times: Vec<Instant> = first_arrivals(arrivals)
        .into_iter()
        .map(|a| a.1)
        .filter(|t| *t >= from && *t <= to)
        .collect();
    times.sort_unstable();
    let mut prev = from;
    let mut gap = Duration::ZERO;
    for t in times.into_iter().chain(std::iter::once(to)) {
        gap = gap.max(t.saturating_duration_since(prev));
        prev = t;
    }
    gap
}

/// The loss window: the sequence numbers missing between the lowest and
/// the highest that arrived, and the time from the arrival of the last
/// number before the first hole to that of the first after the last hole
/// (`None` when nothing is missing). The nodes number every packet in
/// lockstep, so a missing number is a lost packet.
pub fn loss_window(arrivals: &[(u32, Instant)]) -> (u64, Option<Duration>) {
    let v = first_arrivals(arrivals);
    let mut missing = 0u64;
    let (mut before, mut after): (Option<Instant>, Option<Instant>) = (None, None);
    for w in v.windows(2) {
        let hole = u64::from(w[1].0 - w[0].0 - 1);
        if hole > 0 {
            missing += hole;
            before.get_or_insert(w[0].1);
            after = Some(w[1].1);
        }
    }
    let span = before
        .zip(after)
        .map(|(b, a)| a.saturating_duration_since(b));
    (missing, span)
}

/// Seed 003's cluster of n espgate nodes, up and carrying a tunnel.
pub struct ClusterRig {
    /// Namespaces, processes, the work directory.
    pub lab: Lab,
    /// The cluster.
    pub spec: ClusterSpec,
    prefix: String,
    sw: String,
    /// The peer's namespace.
    pub peer: String,
    /// The traffic source's namespace.
    pub host: String,
    /// The nodes' namespaces.
    pub nodes: Vec<String>,
    sockets: Vec<PathBuf>,
    pids: Vec<u32>,
    etcd_pids: Vec<u32>,
    cgroups: Vec<PathBuf>,
    ports: usize,
    plan: PlanDoc,
    stop: Arc<AtomicBool>,
    agent: Option<JoinHandle<()>>,
    agent_state: Arc<AgentState>,
    counter: Arc<Counter>,
    sink: Option<JoinHandle<Result<()>>>,
    /// The last trial's arrivals at the peer and its first and last send.
    last: (Vec<Arrival>, Option<Span>),
}

impl ClusterRig {
    /// Builds the namespaces and bridges, starts the nodes (each in its
    /// cgroup), the ESP counter and the agent thread, and checks that a
    /// short stream gets through.
    pub fn up(prefix: &str, spec: &ClusterSpec, exe: &Path) -> Result<ClusterRig> {
        ensure!(
            (1..=MAX_NODES).contains(&spec.nodes),
            "a cluster rig has 1 to {MAX_NODES} nodes, not {}",
            spec.nodes
        );
        ensure!(
            matches!(spec.protocol, Protocol::Esp | Protocol::Ah),
            "a cluster rig runs ESP or AH, not {:?}",
            spec.protocol
        );
        ensure!(
            spec.etcd_members <= MAX_ETCD,
            "a cluster rig starts at most {MAX_ETCD} etcd members, not {}",
            spec.etcd_members
        );
        if spec.etcd_members > 0 && !Path::new(ETCD).exists() {
            bail!("{ETCD} is missing: scripts/setup.sh installs etcd-server");
        }
        let work = std::env::temp_dir().join(format!("{prefix}-work"));
        let lab = Lab::new(prefix, work)?;
        let members: Vec<u16> = (1..=spec.nodes).collect();
        let mut rig = ClusterRig {
            lab,
            spec: spec.clone(),
            prefix: prefix.to_string(),
            sw: format!("{prefix}-sw"),
            peer: format!("{prefix}-pe"),
            host: format!("{prefix}-ho"),
            nodes: members.iter().map(|i| format!("{prefix}-n{i}")).collect(),
            sockets: Vec::new(),
            pids: Vec::new(),
            etcd_pids: Vec::new(),
            cgroups: Vec::new(),
            ports: 0,
            plan: PlanDoc { epoch: 1, members },
            stop: Arc::new(AtomicBool::new(false)),
            agent: None,
            agent_state: Arc::new(AgentState::default()),
            counter: Arc::new(Counter {
                armed: AtomicBool::new(false),
                seqs: Mutex::new(Vec::new()),
                other: AtomicU64::new(0),
            }),
            sink: None,
            last: (Vec::new(), None),
        };
        rig.build()?;
        if spec.etcd_members > 0 {
            rig.start_etcd()?;
        }
        rig.start_nodes(exe)?;
        rig.start_sink()?;
        if spec.etcd_members > 0 {
            let all: Vec<u16> = (1..=spec.nodes).collect();
            rig.wait_plan(&all, &all, Duration::from_secs(30))?;
        } else {
            rig.start_agent()?;
        }
        rig.wait_flowing()?;
        Ok(rig)
    }

    /// The etcd members, each in its namespace on `swmgmt`, and the
    /// nodes' `mgmt0` ports; returns when every member says it is healthy.
    fn start_etcd(&mut self) -> Result<()> {
        let sw = self.sw.clone();
        ip(&["-n", &sw, "link", "add", "swmgmt", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "swmgmt", "up"])?;
        for (i, ns) in self.nodes.clone().iter().enumerate() {
            self.port(
                ns,
                "mgmt0",
                "swmgmt",
                &format!("10.99.0.{}/24", i + 1),
                None,
                1500,
            )?;
        }
        let k_all = self.spec.etcd_members;
        let initial = (0..k_all)
            .map(|k| format!("e{k}=http://{}:2380", etcd_addr(k)))
            .collect::<Vec<_>>()
            .join(",");
        let mut started = Vec::new();
        for k in 0..k_all {
            let ns = format!("{}-e{k}", self.prefix);
            self.lab.netns(&ns)?;
            let addr = etcd_addr(k);
            self.port(&ns, "eth0", "swmgmt", &format!("{addr}/24"), None, 1500)?;
            let data = self.lab.work.join(format!("etcd-e{k}"));
            let log = std::fs::File::create(self.lab.work.join(format!("etcd-e{k}.log")))?;
            let url = format!("http://{addr}");
            let (client, peer) = (format!("{url}:2379"), format!("{url}:2380"));
            let what = format!("etcd e{k}");
            let pid = self.lab.spawn(
                &what,
                in_ns(
                    &ns,
                    &[
                        ETCD,
                        "--name",
                        &format!("e{k}"),
                        "--data-dir",
                        &data.to_string_lossy(),
                        "--listen-client-urls",
                        &client,
                        "--advertise-client-urls",
                        &client,
                        "--listen-peer-urls",
                        &peer,
                        "--initial-advertise-peer-urls",
                        &peer,
                        "--initial-cluster",
                        &initial,
                        "--heartbeat-interval",
                        "50",
                        "--election-timeout",
                        "500",
                    ],
                )
                .stdin(std::process::Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
            )?;
            self.etcd_pids.push(pid);
            started.push((k, ns, what));
        }
        for (k, ns, what) in started {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                netlab::check_interrupt()?;
                if etcd_healthy(&ns, &etcd_addr(k)) {
                    break;
                }
                let log = self.lab.work.join(format!("etcd-e{k}.log"));
                if let Some(st) = self.lab.exited(&what) {
                    bail!("{what} exited ({st}): {}", tail(&log));
                }
                ensure!(
                    Instant::now() < deadline,
                    "{what} was not healthy within 20 s: {}",
                    tail(&log)
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(())
    }

    /// Waits (at most `limit`) until each node of `asked` has the plan
    /// `members` and is processing; returns their statuses.
    pub fn wait_plan(
        &self,
        asked: &[u16],
        members: &[u16],
        limit: Duration,
    ) -> Result<Vec<ClusterStatus>> {
        let deadline = Instant::now() + limit;
        loop {
            netlab::check_interrupt()?;
            let docs: Vec<Option<ClusterStatus>> = asked
                .iter()
                .map(|id| self.cluster_status(*id).ok())
                .collect();
            let good = docs.iter().all(|d| {
                d.as_ref().is_some_and(|d| {
                    d.state == "processing" && d.plan.as_ref().is_some_and(|p| p.members == members)
                })
            });
            if good {
                return Ok(docs.into_iter().flatten().collect());
            }
            if Instant::now() >= deadline {
                let seen: Vec<String> = docs
                    .iter()
                    .zip(asked)
                    .map(|(d, id)| match d {
                        Some(d) => format!(
                            "node {id}: {} plan {:?}",
                            d.state,
                            d.plan.as_ref().map(|p| &p.members)
                        ),
                        None => format!("node {id}: no status"),
                    })
                    .collect();
                let logs: Vec<String> = asked.iter().map(|id| self.node_log(*id)).collect();
                bail!(
                    "no plan {members:?} on nodes {asked:?} within {} s ({}; node logs: {})",
                    limit.as_secs(),
                    seen.join(", "),
                    logs.join(" | ")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Node `id`'s cluster status.
    pub fn cluster_status(&self, id: u16) -> Result<ClusterStatus> {
        let sock = self
            .sockets
            .get(usize::from(id).wrapping_sub(1))
            .ok_or_else(|| anyhow!("no node {id}"))?;
        Client::new(sock, CONTROL_TIMEOUT)
            .status()
            .map_err(|e| anyhow!("node {id}: {e}"))?
            .cluster
            .ok_or_else(|| anyhow!("node {id} has no cluster status"))
    }

    /// Node `id`'s control socket.
    pub fn socket(&self, id: u16) -> Option<PathBuf> {
        self.sockets.get(usize::from(id).wrapping_sub(1)).cloned()
    }

    /// The process id of node `id`'s espgate (a child of the rig: after a
    /// kill it stays a zombie until the rig reaps it, so the id is not
    /// reused meanwhile).
    pub fn node_pid(&self, id: u16) -> Option<u32> {
        self.pids.get(usize::from(id).wrapping_sub(1)).copied()
    }

    /// The process id of etcd member `k` (0-based), as [`Self::node_pid`].
    pub fn etcd_pid(&self, k: u16) -> Option<u32> {
        self.etcd_pids.get(usize::from(k)).copied()
    }

    /// The last trial's arrivals at the peer (sequence number, time) and
    /// the times of its first and last send.
    pub fn last_arrivals(&self) -> (&[Arrival], Option<Span>) {
        (&self.last.0, self.last.1)
    }

    fn build(&mut self) -> Result<()> {
        let sw = self.sw.clone();
        self.lab.netns(&sw)?;
        for br in ["swout", "swin"] {
            ip(&["-n", &sw, "link", "add", br, "type", "bridge"])?;
            ip(&[
                "-n",
                &sw,
                "link",
                "set",
                br,
                "type",
                "bridge",
                "ageing_time",
                "0",
            ])?;
            ip(&["-n", &sw, "link", "set", br, "up"])?;
        }
        let (peer, host) = (self.peer.clone(), self.host.clone());
        self.lab.netns(&peer)?;
        self.lab.netns(&host)?;
        self.port(
            &peer,
            "eth0",
            "swout",
            &format!("{PEER}/24"),
            None,
            OUTSIDE_MTU,
        )?;
        self.port(&host, "eth0", "swin", &format!("{HOST}/24"), None, 1500)?;
        ip(&["-n", &host, "route", "add", "default", "via", INSIDE_GW])?;
        for ns in self.nodes.clone() {
            self.lab.netns(&ns)?;
            let out = format!("{OUTSIDE}/24");
            self.port(&ns, "out0", "swout", &out, Some(OUT_MAC), OUTSIDE_MTU)?;
            self.port(
                &ns,
                "in0",
                "swin",
                &format!("{INSIDE_GW}/24"),
                Some(IN_MAC),
                1500,
            )?;
            for k in [
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
                "net.ipv4.conf.all.send_redirects=0",
            ] {
                self.lab.sysctl(&ns, k)?;
            }
        }
        Ok(())
    }

    /// A veth from `ns` (named `dev`) to `bridge`, learning off on the
    /// bridge side: every frame is flooded.
    fn port(
        &mut self,
        ns: &str,
        dev: &str,
        bridge: &str,
        addr: &str,
        mac: Option<&str>,
        mtu: u32,
    ) -> Result<()> {
        self.ports += 1;
        let sw = self.sw.clone();
        let peer: String = format!("p{}{dev}", self.ports).chars().take(15).collect();
        let mtu = mtu.to_string();
        ip(&[
            "-n", ns, "link", "add", dev, "mtu", &mtu, "type", "veth", "peer", "name", &peer,
            "mtu", &mtu, "netns", &sw,
        ])?;
        if let Some(m) = mac {
            ip(&["-n", ns, "link", "set", dev, "address", m])?;
        }
        self.lab
            .sysctl(ns, &format!("net.ipv6.conf.{dev}.disable_ipv6=1"))?;
        ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
        ip(&["-n", ns, "link", "set", dev, "up"])?;
        ip(&["-n", &sw, "link", "set", &peer, "master", bridge])?;
        ip(&[
            "-n",
            &sw,
            "link",
            "set",
            &peer,
            "type",
            "bridge_slave",
            "learning",
            "off",
        ])?;
        // Every frame entering the bridge is handled on CPU 0 (RPS), so the
        // bridge floods one frame to every node before the next, as a hub
        // does. Otherwise two frames sent from two CPUs are flooded by both
        // at once and can reach two nodes in opposite orders, and the nodes
        // number them differently (docs/CLUSTER.md, "Same order on every
        // node").
        let rps = format!("/sys/class/net/{peer}/queues/rx-0/rps_cpus");
        netlab::run(&mut in_ns(&sw, &["sh", "-c", &format!("echo 1 > {rps}")]))
            .with_context(|| format!("steering {peer}'s frames to CPU 0 ({rps})"))?;
        ip(&["-n", &sw, "link", "set", &peer, "up"])?;
        Ok(())
    }

    fn start_nodes(&mut self, exe: &Path) -> Result<()> {
        let suite: espgate_core::crypto::Suite = self
            .spec
            .suite
            .parse()
            .map_err(|e| anyhow!("{}: {e}", self.spec.suite))?;
        let keys = |_: ()| -> Result<Keys> {
            let hex = |n: usize| {
                if n == 0 {
                    Ok(String::new())
                } else {
                    random_hex(n)
                }
            };
            Ok((hex(suite.enc_key_len())?, hex(suite.integ_key_len())?))
        };
        let (k_out, k_in) = (keys(())?, keys(())?);
        let mut pids = Vec::new();
        for (i, ns) in self.nodes.clone().iter().enumerate() {
            let id = i as u16 + 1;
            let dir = self.lab.work.join(format!("n{id}"));
            std::fs::create_dir_all(&dir)?;
            let cfg = dir.join("gw.toml");
            write_private(&cfg, &node_config(&self.spec, Some(id), &k_out, &k_in))?;
            let what = format!("espgate node {id}");
            let pid = spawn_gateway(&mut self.lab, &what, ns, exe, &cfg, &dir.join("log"))?;
            pids.push((id, pid));
            self.pids.push(pid);
            self.sockets.push(dir.join("ctl.sock"));
        }
        for (id, _) in &pids {
            let dir = self.lab.work.join(format!("n{id}"));
            let what = format!("espgate node {id}");
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                netlab::check_interrupt()?;
                if Client::new(dir.join("ctl.sock"), Duration::from_secs(2))
                    .status()
                    .is_ok()
                {
                    break;
                }
                if let Some(st) = self.lab.exited(&what) {
                    bail!("{what} exited ({st}): {}", tail(&dir.join("log")));
                }
                ensure!(
                    Instant::now() < deadline,
                    "{what} did not answer on its control socket within 15 s: {}",
                    tail(&dir.join("log"))
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        for (id, pid) in pids {
            if self.spec.cpu_pct == 0 {
                continue;
            }
            let name = format!("{}-n{id}", self.prefix);
            let cg = super::rig::cpu_cap_period(&name, self.spec.cpu_pct, pid, NODE_PERIOD_US)?;
            self.cgroups.push(cg);
        }
        Ok(())
    }

    fn start_sink(&mut self) -> Result<()> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let ns = self.peer.clone();
        let stop = self.stop.clone();
        let counter = self.counter.clone();
        let protocol = self.spec.protocol;
        let h = std::thread::spawn(move || -> Result<()> {
            // 32 MiB: room for a burst while this thread waits for a CPU.
            let sock: OwnedFd = match protocol {
                Protocol::Ah => raw_ah_in(&ns, PEER, 32 << 20, &ready_tx)?,
                _ => super::probe::bind_in(
                    &ns,
                    SocketAddrV4::new(PEER, 4500),
                    Some(32 << 20),
                    &ready_tx,
                )?
                .into(),
            };
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                match rustix::net::recv(&sock, &mut buf, rustix::net::RecvFlags::empty()) {
                    Ok((got, _)) => match seq_of(protocol, &buf[..got]) {
                        Some(seq) => {
                            if counter.armed.load(Ordering::Relaxed) {
                                let at = Instant::now();
                                counter.seqs.lock().expect("counter lock").push((seq, at));
                            }
                        }
                        None => {
                            counter.other.fetch_add(1, Ordering::Relaxed);
                        }
                    },
                    Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(std::io::Error::from(e).into()),
                }
            }
            Ok(())
        });
        self.sink = Some(h);
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| anyhow!("the ESP counter did not start"))?
    }

    fn clients(&self) -> Vec<Client> {
        self.sockets
            .iter()
            .map(|s| Client::new(s, CONTROL_TIMEOUT))
            .collect()
    }

    fn start_agent(&mut self) -> Result<()> {
        // The first round here, so that the nodes have a plan before any
        // traffic; then once a second on a thread.
        agent_round(&self.clients(), &self.plan, 1).context("the first plan")?;
        let clients = self.clients();
        let plan = self.plan.clone();
        let stop = self.stop.clone();
        let st = self.agent_state.clone();
        self.agent = Some(std::thread::spawn(move || {
            let mut next = Instant::now() + Duration::from_secs(1);
            while !stop.load(Ordering::Relaxed) {
                if Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                next += Duration::from_secs(1);
                if let Err(e) = agent_round(&clients, &plan, 1) {
                    st.errors.fetch_add(1, Ordering::Relaxed);
                    *st.last_error.lock().expect("agent lock") = Some(format!("{e:#}"));
                }
                st.rounds.fetch_add(1, Ordering::Relaxed);
            }
        }));
        Ok(())
    }

    /// Agent rounds so far, those with an error, and the last error.
    pub fn agent_stats(&self) -> (u64, u64, Option<String>) {
        let st = &self.agent_state;
        (
            st.rounds.load(Ordering::Relaxed),
            st.errors.load(Ordering::Relaxed),
            st.last_error.lock().expect("agent lock").clone(),
        )
    }

    /// A short stream must get through before anything is measured.
    fn wait_flowing(&mut self) -> Result<()> {
        let sends = vec![
            Send {
                port: 5001,
                ip_len: 500
            };
            200
        ];
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let t = self.trial(&sends, 2e6)?;
            if t.received * 10 >= t.sent * 9 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = (1..=self.spec.nodes)
                    .map(|i| tail(&self.lab.work.join(format!("n{i}/log"))))
                    .collect();
                bail!(
                    "the cluster did not carry a test stream within 20 s ({} of {} arrived; \
                     node logs: {})",
                    t.received,
                    t.sent,
                    logs.join(" | ")
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Sends `sends` from the host at `rate_bps` (bits of IPv4 packets
    /// per second, paced by the bits before each packet) and counts what
    /// reaches the peer until `DRAIN` after the last packet.
    pub fn trial(&mut self, sends: &[Send], rate_bps: f64) -> Result<Trial> {
        netlab::check_interrupt()?;
        ensure!(rate_bps > 0.0, "a trial needs a rate");
        self.counter.seqs.lock().expect("counter lock").clear();
        self.counter.armed.store(true, Ordering::SeqCst);
        let host = self.host.clone();
        let list: Vec<Send> = sends.to_vec();
        let gen = std::thread::spawn(move || -> Result<(Trial, Instant, Instant)> {
            super::probe::enter(&host)?;
            let sock = UdpSocket::bind(SocketAddrV4::new(HOST, 0))?;
            let mut buf = [0u8; 1500];
            let mut t = Trial::default();
            let start = Instant::now();
            let mut bits = 0u64;
            for (i, s) in list.iter().enumerate() {
                if i % 256 == 0 && netlab::interrupted() {
                    break;
                }
                let when = start + due(bits, rate_bps);
                let now = Instant::now();
                if when > now {
                    std::thread::sleep(when - now);
                }
                let payload = usize::from(s.ip_len.saturating_sub(IP_UDP)).max(8);
                // A per-packet number in the first bytes, so that the
                // nodes' lockstep digests tell the packets apart.
                buf[..8].copy_from_slice(&(i as u64).to_be_bytes());
                t.sent += 1;
                if sock
                    .send_to(&buf[..payload], SocketAddrV4::new(DEST, s.port))
                    .is_err()
                {
                    t.send_errors += 1;
                }
                bits += u64::from(s.ip_len) * 8;
            }
            let end = Instant::now();
            t.actual_s = (end - start).as_secs_f64();
            t.bits = bits;
            t.planned_s = bits as f64 / rate_bps;
            Ok((t, start, end))
        });
        let r = gen
            .join()
            .map_err(|_| anyhow!("the generator panicked"))
            .and_then(|r| r);
        std::thread::sleep(DRAIN);
        self.counter.armed.store(false, Ordering::SeqCst);
        let arrivals = std::mem::take(&mut *self.counter.seqs.lock().expect("counter lock"));
        let (mut t, start, end) = r?;
        let mut seqs: Vec<u32> = arrivals.iter().map(|a| a.0).collect();
        self.last = (arrivals, Some((start, end)));
        let all = seqs.len() as u64;
        seqs.sort_unstable();
        seqs.dedup();
        t.received = seqs.len() as u64;
        t.duplicates = all - t.received;
        if self.sink.as_ref().is_some_and(|h| h.is_finished()) {
            let r = self
                .sink
                .take()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("panicked"))));
            bail!(
                "the ESP counter stopped: {}",
                match r {
                    Some(Err(e)) => format!("{e:#}"),
                    _ => "no reason".into(),
                }
            );
        }
        netlab::check_interrupt()?;
        Ok(t)
    }

    /// Each node's outbound SA: (processed, observed) packets.
    pub fn outbound_counts(&self) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        for (i, c) in self.clients().iter().enumerate() {
            let st = c
                .status()
                .map_err(|e| anyhow!("node {}: {e}", i + 1))?
                .cluster
                .ok_or_else(|| anyhow!("node {} has no cluster status", i + 1))?;
            let sa = st
                .sas
                .iter()
                .find(|s| s.outbound)
                .ok_or_else(|| anyhow!("node {} has no outbound SA", i + 1))?;
            out.push((sa.processed, sa.observed));
        }
        Ok(out)
    }

    /// Waits (at most about 8 s) until every node is processing and in
    /// step; after an overload the agent's checkpoints move a node that
    /// missed packets. A trickle of packets gives fresh checkpoints when
    /// the first rounds do not settle it. Returns the nodes not in step
    /// at the end (0: all).
    pub fn settle(&mut self) -> Result<usize> {
        let trickle = vec![
            Send {
                port: 5001,
                ip_len: 200
            };
            600
        ];
        for attempt in 0..3 {
            let deadline = Instant::now() + Duration::from_millis(2500);
            while Instant::now() < deadline {
                netlab::check_interrupt()?;
                if self.not_in_step() == 0 {
                    return Ok(0);
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            if attempt < 2 {
                self.trial(&trickle, 4e6)?;
            }
        }
        Ok(self.not_in_step())
    }

    fn not_in_step(&self) -> usize {
        self.clients()
            .iter()
            .filter(|c| {
                !c.status()
                    .ok()
                    .and_then(|s| s.cluster)
                    .is_some_and(|cl| cl.in_step && cl.state == "processing")
            })
            .count()
    }

    /// The log of node `id` (last lines).
    pub fn node_log(&self, id: u16) -> String {
        tail(&self.lab.work.join(format!("n{id}/log")))
    }
}

impl Drop for ClusterRig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.agent.take() {
            let _ = h.join();
        }
        if let Some(h) = self.sink.take() {
            let _ = h.join();
        }
        self.lab.stop_children();
        for cg in self.cgroups.drain(..) {
            // The processes are gone, so the group is empty and removable.
            let _ = std::fs::remove_dir(&cg);
        }
        self.lab.remove_namespaces();
    }
}

/// The sequence number of what the counter received, if it is the
/// cluster's: for ESP a UDP payload with a non-zero SPI (not a keepalive
/// or an IKE message behind the non-ESP marker); for AH a whole IPv4
/// packet (a raw socket delivers the header) of protocol 51 with a
/// non-zero SPI.
pub fn seq_of(protocol: Protocol, d: &[u8]) -> Option<u32> {
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    match protocol {
        Protocol::Ah => {
            let ihl = usize::from(*d.first()? & 0x0f) * 4;
            let ok = d[0] >> 4 == 4 && ihl >= 20 && d.len() >= ihl + 12 && d[9] == 51;
            (ok && be(&d[ihl + 4..]) != 0).then(|| be(&d[ihl + 8..]))
        }
        _ => (d.len() >= 8 && be(d) != 0).then(|| be(&d[4..])),
    }
}

/// A raw AH socket bound to `addr` inside namespace `ns` (the calling
/// thread enters it), with a 50 ms read timeout and a receive buffer of
/// `rcvbuf` bytes, as [`super::probe::bind_in`] makes the ESP counter's
/// UDP socket; the outcome also goes to `ready`.
fn raw_ah_in(
    ns: &str,
    addr: Ipv4Addr,
    rcvbuf: usize,
    ready: &std::sync::mpsc::Sender<Result<()>>,
) -> Result<OwnedFd> {
    use rustix::net::{sockopt, AddressFamily, SocketType};
    let sock = (|| -> Result<OwnedFd> {
        super::probe::enter(ns)?;
        let fd = rustix::net::socket(
            AddressFamily::INET,
            SocketType::RAW,
            Some(rustix::net::ipproto::AH),
        )
        .with_context(|| format!("a raw AH socket in {ns}"))?;
        rustix::net::bind(&fd, &SocketAddrV4::new(addr, 0))
            .with_context(|| format!("binding the raw AH socket to {addr} in {ns}"))?;
        sockopt::set_socket_recv_buffer_size_force(&fd, rcvbuf)?;
        sockopt::set_socket_timeout(&fd, sockopt::Timeout::Recv, Some(Duration::from_millis(50)))?;
        Ok(fd)
    })();
    let _ = ready.send(sock.as_ref().map(|_| ()).map_err(|e| anyhow!("{e:#}")));
    sock
}

/// The last lines of a log file, on one line.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(4).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" / ")
}

/// An etcd member answers `/health` with `"health":"true"` (a plain
/// HTTP/1.0 request from a thread in its namespace).
fn etcd_healthy(ns: &str, addr: &str) -> bool {
    use std::io::{Read, Write};
    let (ns, addr) = (ns.to_string(), addr.to_string());
    let h = std::thread::spawn(move || -> Result<String> {
        super::probe::enter(&ns)?;
        let sa: std::net::SocketAddr = format!("{addr}:2379").parse()?;
        let mut s = std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
        let mut body = String::new();
        s.take(65536).read_to_string(&mut body)?;
        Ok(body)
    });
    h.join()
        .ok()
        .and_then(|r| r.ok())
        .is_some_and(|b| b.replace(' ', "").contains("\"health\":\"true\""))
}

/// SIGKILL to `pid` (a child of this process, not reaped yet).
pub fn kill9(pid: u32) -> Result<()> {
    let p = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| anyhow!("no process {pid}"))?;
    rustix::process::kill_process(p, rustix::process::Signal::KILL)
        .map_err(|e| anyhow!("kill -9 {pid}: {e}"))
}

/// Runs `cmd` in `ns` (for callers that need a one-off command).
pub fn ns_run(ns: &str, args: &[&str]) -> Result<String> {
    netlab::run(&mut in_ns(ns, args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_api::cluster::ClusterSa;

    #[test]
    fn node_and_peer_configs_parse_for_the_papers_and_todays_suite() {
        let dir = std::env::temp_dir().join(format!("espgate-lab-crig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pat = |n: usize, seed: usize| -> String {
            (0..n)
                .map(|j| format!("{:02x}", (j * 37 + seed * 11 + 1) as u8))
                .collect()
        };
        // Table 4-1's ESP 3DES-MD5, ESP DES-MD5 and AH-MD5, and today's
        // AEAD.
        for (protocol, suite, d, node_etcd) in [
            (Protocol::Esp, "3des-md5", Dispatch::PacketRr, false),
            (Protocol::Esp, "des-md5", Dispatch::PacketRr, false),
            (Protocol::Ah, "md5", Dispatch::PacketRr, true),
            (Protocol::Esp, "aes128gcm16", Dispatch::SessionSqf, true),
        ] {
            let s: espgate_core::crypto::Suite = suite.parse().unwrap();
            let k = |seed| (pat(s.enc_key_len(), seed), pat(s.integ_key_len(), seed + 1));
            let spec = ClusterSpec {
                nodes: 3,
                protocol,
                suite: suite.into(),
                dispatch: d,
                cpu_pct: 25,
                etcd_members: if node_etcd { 3 } else { 0 },
            };
            for node in [Some(1), Some(3), None] {
                let text = node_config(&spec, node, &k(1), &k(5));
                let parsed = espgate_config::parse(&text, &dir, "gw.toml");
                assert!(
                    parsed.is_ok(),
                    "{suite} {node:?}\n{text}\n{:?}",
                    parsed.err()
                );
                // ESP in UDP with [connection.esp]; AH on raw IP with
                // [connection.ah] (espgate has no AH in UDP).
                let ah = protocol == Protocol::Ah;
                assert_eq!(text.contains("[connection.ah]"), ah, "{text}");
                assert_eq!(text.contains("[connection.esp]"), !ah, "{text}");
                assert_eq!(text.contains("protocol = \"ah\""), ah, "{text}");
                assert_eq!(text.contains("encap = \"none\""), ah, "{text}");
                assert_eq!(text.contains("encap = \"udp\""), !ah, "{text}");
                // The paper's suites are legacy ones.
                assert_eq!(
                    text.contains("allow_insecure = true"),
                    suite != "aes128gcm16",
                    "{text}"
                );
                assert!(text.contains(&format!("suite = \"{suite}\"")), "{text}");
                if node.is_some() {
                    assert!(
                        text.contains(d.name()) && text.contains("[cluster]"),
                        "{text}"
                    );
                    // With etcd: every member an endpoint, the lease and hold.
                    assert_eq!(
                        text.contains("http://10.99.0.102:2379")
                            && text.contains("lease_ttl = \"2s\"")
                            && text.contains("hold = \"6s\""),
                        node_etcd,
                        "{text}"
                    );
                    assert_eq!(text.contains("127.0.0.1:1"), !node_etcd, "{text}");
                }
            }
            assert!(spec.describe().contains("25 %"));
            assert_eq!(spec.describe().contains("lease_ttl 2s"), node_etcd);
            let carrier = match protocol {
                Protocol::Ah => format!("AH {suite} on raw IP"),
                _ => format!("ESP {suite} in UDP"),
            };
            assert!(spec.describe().contains(&carrier), "{}", spec.describe());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_counter_reads_esp_in_udp_and_raw_ah_sequence_numbers() {
        // ESP in UDP: SPI, then the sequence number.
        let esp = [0, 0, 0x10, 0x02, 0, 0, 1, 0x2c, 0xaa, 0xbb];
        assert_eq!(seq_of(Protocol::Esp, &esp), Some(300));
        // A keepalive and an IKE message behind the non-ESP marker.
        assert_eq!(seq_of(Protocol::Esp, &[0xff]), None);
        assert_eq!(seq_of(Protocol::Esp, &[0, 0, 0, 0, 1, 2, 3, 4]), None);
        // Raw AH: the IPv4 header (20 bytes, or 24 with an option), then
        // next header, length, reserved, SPI, sequence number.
        let ah = |ihl: u8, proto: u8, spi: u32, seq: u32| {
            let mut p = vec![0u8; usize::from(ihl) * 4];
            p[0] = 0x40 | ihl;
            p[9] = proto;
            p.extend_from_slice(&[4, 4, 0, 0]);
            p.extend_from_slice(&spi.to_be_bytes());
            p.extend_from_slice(&seq.to_be_bytes());
            p.extend_from_slice(&[0x55; 12]);
            p
        };
        assert_eq!(seq_of(Protocol::Ah, &ah(5, 51, SPI_OUT, 7)), Some(7));
        assert_eq!(
            seq_of(Protocol::Ah, &ah(6, 51, SPI_OUT, 70_000)),
            Some(70_000)
        );
        assert_eq!(seq_of(Protocol::Ah, &ah(5, 50, SPI_OUT, 7)), None);
        assert_eq!(seq_of(Protocol::Ah, &ah(5, 51, 0, 7)), None);
        assert_eq!(seq_of(Protocol::Ah, &ah(5, 51, SPI_OUT, 7)[..31]), None);
        assert_eq!(seq_of(Protocol::Ah, &[]), None);
        // An ESP counter does not read AH, nor the other way round.
        assert_eq!(seq_of(Protocol::Ah, &esp), None);
    }

    fn doc(node: u16, cp: Option<(u64, u64)>) -> ClusterStatus {
        ClusterStatus {
            name: "lab".into(),
            node,
            dispatch: "packet-rr".into(),
            plan: None,
            leader: None,
            plan_age_ms: None,
            state: "processing".into(),
            in_step: true,
            sas: vec![
                ClusterSa {
                    conn: "lab".into(),
                    spi: SPI_OUT,
                    outbound: true,
                    processed: 1,
                    observed: 2,
                    checkpoint: cp,
                    lockstep: None,
                    resyncs: 0,
                    shared: false,
                    solo: None,
                    share_from: None,
                },
                ClusterSa {
                    conn: "lab".into(),
                    spi: SPI_IN,
                    outbound: false,
                    processed: 1,
                    observed: 2,
                    checkpoint: Some((9, 9)),
                    lockstep: None,
                    resyncs: 0,
                    shared: false,
                    solo: None,
                    share_from: None,
                },
            ],
        }
    }

    #[test]
    fn each_node_is_told_the_other_members_outbound_checkpoints() {
        let docs = vec![
            Some(doc(1, Some((256, 11)))),
            Some(doc(2, Some((256, 22)))),
            None,
            Some(doc(4, None)),
            Some(doc(5, Some((512, 55)))),
        ];
        let members = [1, 2, 3, 4];
        let cps = checkpoints_for(1, &members, &docs);
        assert_eq!(
            cps,
            vec![PeerCheckpoint {
                node: 2,
                spi: SPI_OUT,
                seq: 256,
                digest: 22
            }]
        );
        // Node 5 is not a member: nobody hears of it.
        assert!(checkpoints_for(2, &members, &docs)
            .iter()
            .all(|c| c.node == 1));
        assert_eq!(checkpoints_for(3, &members, &docs).len(), 2);
    }

    #[test]
    fn the_longest_gap_and_the_loss_window_from_arrivals() {
        let t0 = Instant::now();
        let ms = |m: u64| t0 + Duration::from_millis(m);
        // Every 1 ms, numbers 100.. ; 105..=108 lost (a hole of 4), 103
        // arrived twice (its second arrival does not count), 110 late.
        let mut a: Vec<(u32, Instant)> = (0..20u32)
            .filter(|i| !(5..=8).contains(i))
            .map(|i| (100 + i, ms(10 + u64::from(i))))
            .collect();
        a.push((103, ms(30)));
        a.retain(|x| x.0 != 110);
        a.push((110, ms(40)));
        // Gaps: 10 ms from the start to 100's arrival; 104 at 14 → 109 at
        // 19 is 5 ms; 111 at 21 … but 110 arrives at 40 (after 119 at
        // 29): 29 → 40 is 11 ms; then 40 → the end at 45 is 5 ms.
        assert_eq!(longest_gap(&a, ms(0), ms(45)), Duration::from_millis(11));
        // Without the start's silence and the late one: 5 ms.
        let b: Vec<(u32, Instant)> = a.iter().copied().filter(|x| x.0 != 110).collect();
        assert_eq!(longest_gap(&b, ms(10), ms(29)), Duration::from_millis(5));
        // Nothing arrived: the whole window.
        assert_eq!(longest_gap(&[], ms(0), ms(7)), Duration::from_millis(7));
        // Arrivals outside the window are left out.
        assert_eq!(longest_gap(&b, ms(50), ms(52)), Duration::from_millis(2));
        // The window: from 104 (14 ms) to 109 (19 ms), 4 missing; 110
        // arrived, so no hole there.
        assert_eq!(loss_window(&a), (4, Some(Duration::from_millis(5))));
        // Two holes: from before the first to after the last.
        let mut c = b.clone();
        c.retain(|x| x.0 != 115);
        assert_eq!(loss_window(&c), (6, Some(Duration::from_millis(26 - 14))));
        // Nothing missing.
        let d: Vec<(u32, Instant)> = (0..5).map(|i| (i, ms(u64::from(i)))).collect();
        assert_eq!(loss_window(&d), (0, None));
        assert_eq!(loss_window(&[]), (0, None));
        assert_eq!(first_arrivals(&a).len(), 20 - 4);
    }

    #[test]
    fn pacing_spreads_the_bits_at_the_rate() {
        // 1000 packets of 1250 B at 100 Mbit/s: 10,000 bits each, one
        // every 100 µs; the last is due at 99.9 ms.
        assert_eq!(due(0, 1e8), Duration::ZERO);
        assert_eq!(due(10_000, 1e8), Duration::from_micros(100));
        assert_eq!(due(999 * 10_000, 1e8), Duration::from_micros(99_900));
        // Mixed sizes: the gap after a packet is its own bits.
        let a = due(40 * 8, 1e6);
        let b = due((40 + 1500) * 8, 1e6);
        assert_eq!(b - a, Duration::from_micros(12_000));
    }

    #[test]
    fn a_trial_reports_loss_and_the_rate_offered() {
        let t = Trial {
            sent: 1000,
            send_errors: 0,
            received: 999,
            duplicates: 0,
            bits: 10_000_000,
            planned_s: 0.1,
            actual_s: 0.1,
        };
        assert!((t.loss_pct() - 0.1).abs() < 1e-9);
        assert!((t.offered_mbps() - 100.0).abs() < 1e-9);
        assert!(t.on_schedule());
        // A generator that took twice as long offered half.
        let slow = Trial {
            actual_s: 0.2,
            ..t.clone()
        };
        assert!((slow.offered_mbps() - 50.0).abs() < 1e-9);
        assert!(!slow.on_schedule());
        assert_eq!(Trial::default().loss_pct(), 0.0);
    }

    #[test]
    fn the_search_brackets_the_highest_passing_rate() {
        // Capacity 123: pass at or below it. The hint is what an overload
        // delivers (the capacity itself here).
        let cap = 123.0;
        let mut s = Search::new(1000.0, 12, 0.02);
        let mut tried = Vec::new();
        while let Some(r) = s.next() {
            tried.push(r);
            s.record(r, r <= cap, r.min(cap));
        }
        assert!(s.result() <= cap && s.result() >= cap * 0.97, "{tried:?}");
        // The hint makes the second try 95 % of the delivered rate.
        assert!((tried[1] - cap * 0.95).abs() < 1e-9, "{tried:?}");
        assert!(tried.len() <= 8, "{tried:?}");
        // An overload that delivers less than the capacity: the soft top
        // is dropped once the passes reach it, and the search goes on up.
        let mut s = Search::new(1000.0, 20, 0.02);
        let mut tried = Vec::new();
        while let Some(r) = s.next() {
            tried.push(r);
            s.record(r, r <= cap, if r > cap { 60.0 } else { r });
        }
        assert!(s.result() >= cap * 0.97 && s.result() <= cap, "{tried:?}");
        // Passing at the start ends the search there.
        let mut s = Search::new(50.0, 5, 0.02);
        s.record(50.0, true, 50.0);
        assert_eq!((s.next(), s.result()), (None, 50.0));
        // Bounded in steps, whatever happens.
        let mut s = Search::new(1000.0, 3, 0.0);
        let mut n = 0;
        while let Some(r) = s.next() {
            s.record(r, false, 0.0);
            n += 1;
        }
        assert_eq!((n, s.result()), (3, 0.0));
    }
}
