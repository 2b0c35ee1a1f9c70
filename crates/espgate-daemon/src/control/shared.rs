//! Seed 003's cluster with IKE: only the leader's daemon runs IKE, and
//! every child SA it negotiates reaches the other nodes through its
//! cluster agent and etcd (encrypted under the cluster key there). This
//! table is the node's side of that: the SAs it shares (those its own IKE
//! negotiated, and those it installed from etcd), the export the leader's
//! agent publishes, the share step, and the reconciliation a follower
//! runs on each update. `docs/CLUSTER.md` §8 has the whole protocol.

use espgate_api::cluster::{ClusterSas, SharedSa};
use espgate_core::cluster::NodeId;
use espgate_core::crypto::Suite;
use espgate_core::gateway::{
    del_sa_all, install_negotiated_all, set_peer_all, Engine, NegotiatedSa,
};
use espgate_core::sa::Protocol;
use espgate_core::selector::TrafficSelector;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use zeroize::Zeroizing;

/// How long an SA installed from etcd lives on after this node's own IKE
/// negotiated a new one for its connection (a new leader re-establishes
/// the tunnel): the peer may still send on the old one for a moment.
pub const RETIRE_AFTER: Duration = Duration::from_secs(2);

/// The least a share point lies ahead of the owner's counter, packets.
pub const SHARE_MARGIN_MIN: u64 = 1024;

/// One shared SA on this node.
#[derive(Debug)]
struct Entry {
    sa: SharedSa,
    /// When it was installed here (engine time).
    installed: Duration,
    /// Installed from etcd (else negotiated by this node's IKE).
    imported: bool,
    /// Removed at this time (an imported SA that this node's own IKE
    /// replaced).
    retire_at: Option<Duration>,
}

/// How many removed SAs a node remembers, so that an etcd list that still
/// names one (the leader has not published its removal yet) does not bring
/// it back.
const GONE_MAX: usize = 256;

/// The SAs a cluster node shares.
#[derive(Debug)]
pub struct SharedSas {
    me: NodeId,
    entries: Vec<Entry>,
    generation: u64,
    /// `(spi, outbound)` of shared SAs removed here (replaced by a newer
    /// outbound SA, deleted by IKE, retired): never installed again.
    gone: std::collections::VecDeque<(u32, bool)>,
}

fn find(engines: &[&mut Engine], spi: u32, outbound: bool) -> bool {
    engines.first().is_some_and(|e| {
        e.cluster_report(Duration::ZERO)
            .is_some_and(|r| r.sas.iter().any(|s| s.spi == spi && s.outbound == outbound))
    })
}

impl SharedSas {
    /// The table of node `me`.
    pub fn new(me: NodeId) -> SharedSas {
        SharedSas {
            me,
            entries: Vec::new(),
            generation: 1,
            gone: std::collections::VecDeque::new(),
        }
    }

    /// This node.
    pub fn node(&self) -> NodeId {
        self.me
    }

    /// Whether `(spi, outbound)` is a shared SA here.
    pub fn has(&self, spi: u32, outbound: bool) -> bool {
        self.entries
            .iter()
            .any(|e| e.sa.spi == spi && e.sa.outbound == outbound)
    }

    /// Connections with an SA installed from etcd (a new leader
    /// re-establishes them).
    pub fn imported_conns(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .entries
            .iter()
            .filter(|e| e.imported)
            .map(|e| e.sa.conn.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// This node's IKE installed `s`: it is processed here alone until the
    /// other nodes have it; imported SAs of the same connection retire.
    pub fn negotiated(&mut self, e: &mut Engine, s: &NegotiatedSa<'_>, now: Duration) {
        if let Err(err) = e.cluster_solo(s.spi, s.outbound, self.me, None) {
            tracing::warn!("cluster: SA {:#010x}: {err}", s.spi);
        }
        for old in self
            .entries
            .iter_mut()
            .filter(|x| x.imported && x.sa.conn == s.conn && x.retire_at.is_none())
        {
            old.retire_at = Some(now + RETIRE_AFTER);
        }
        self.entries
            .retain(|x| !(x.sa.spi == s.spi && x.sa.outbound == s.outbound));
        self.entries.push(Entry {
            sa: SharedSa {
                conn: s.conn.to_string(),
                outbound: s.outbound,
                protocol: s.protocol.name().to_string(),
                spi: s.spi,
                suite: s.suite.name(),
                enc_key: hex::encode(s.enc_key),
                integ_key: hex::encode(s.integ_key),
                esn: s.esn,
                encap: s.encap,
                peer: s.peer,
                owner: self.me,
                share_from: None,
                selectors: s.selectors.iter().map(ToString::to_string).collect(),
            },
            installed: now,
            imported: false,
            retire_at: None,
        });
        self.generation += 1;
    }

    /// IKE saw the peer of `conn` move to `peer` (its NAT mapped it anew;
    /// the daemon has moved this node's SAs already): the shared entries
    /// of the connection say so too, so that the leader's agent publishes
    /// them again and the other nodes' ESP follows at once, not at the
    /// next rekey. Returns how many entries changed.
    pub fn peer_moved(&mut self, conn: &str, peer: SocketAddr) -> usize {
        let mut changed = 0;
        for x in self.entries.iter_mut().filter(|x| x.sa.conn == conn) {
            let Some((ours, port)) = x.sa.encap else {
                continue;
            };
            if port != peer.port() || x.sa.peer != Some(peer.ip()) {
                x.sa.encap = Some((ours, peer.port()));
                x.sa.peer = Some(peer.ip());
                changed += 1;
            }
        }
        if changed > 0 {
            self.generation += 1;
        }
        changed
    }

    /// Drops the entries whose SA is gone from the engine (removed by IKE,
    /// or replaced by a newer outbound SA), and removes the retired ones
    /// that are due.
    pub fn prune(&mut self, engines: &mut [&mut Engine], now: Duration) {
        for x in self
            .entries
            .iter()
            .filter(|x| x.retire_at.is_some_and(|t| t <= now))
        {
            remove(
                engines,
                &x.sa,
                "installed from etcd, replaced by this node's IKE",
            );
        }
        let before = self.entries.len();
        let mut gone = Vec::new();
        self.entries.retain(|x| {
            let keep =
                find(engines, x.sa.spi, x.sa.outbound) && x.retire_at.is_none_or(|t| t > now);
            if !keep {
                gone.push((x.sa.spi, x.sa.outbound));
            }
            keep
        });
        for g in gone {
            self.bury(g);
        }
        if self.entries.len() != before {
            self.generation += 1;
        }
    }

    /// Remembers a removed SA.
    fn bury(&mut self, g: (u32, bool)) {
        if !self.gone.contains(&g) {
            if self.gone.len() == GONE_MAX {
                self.gone.pop_front();
            }
            self.gone.push_back(g);
        }
    }

    /// What the leader's agent publishes (retiring SAs included: the
    /// followers keep them as long as this node does).
    pub fn export(&self) -> ClusterSas {
        ClusterSas {
            generation: self.generation,
            sas: self.entries.iter().map(|x| x.sa.clone()).collect(),
            ike: Vec::new(),
        }
    }

    /// The share step on the owner: from about a second of the SA's
    /// traffic ahead (at least [`SHARE_MARGIN_MIN`] packets), every node
    /// takes its share. `packets`: what the SA has seen so far here.
    pub fn share(
        &mut self,
        e: &mut Engine,
        spi: u32,
        outbound: bool,
        packets: u64,
        now: Duration,
    ) -> Result<u64, String> {
        let x = self
            .entries
            .iter_mut()
            .find(|x| x.sa.spi == spi && x.sa.outbound == outbound)
            .ok_or_else(|| format!("SA {spi:#010x} is not shared by this node"))?;
        let secs = now.saturating_sub(x.installed).as_secs_f64().max(0.1);
        let margin = ((packets as f64 / secs) as u64).max(SHARE_MARGIN_MIN);
        let from = e.cluster_share(spi, outbound, margin)?;
        if x.sa.share_from != Some(from) {
            x.sa.share_from = Some(from);
            self.generation += 1;
            tracing::info!(
                "cluster: {} SA {spi:#010x} of connection \"{}\" is dispatched over the plan \
                 from {from} on",
                if outbound { "outbound" } else { "inbound" },
                x.sa.conn
            );
        }
        Ok(from)
    }

    /// A follower's reconciliation with the list etcd holds: installs the
    /// SAs it lacks, applies share points, removes the shared SAs no longer
    /// listed (never the ones its own IKE negotiated, which the leader —
    /// this node or the one after it — may not have published yet).
    /// Returns warnings for the log.
    pub fn reconcile(
        &mut self,
        engines: &mut [&mut Engine],
        list: &[SharedSa],
        now: Duration,
    ) -> Vec<String> {
        let mut lines = Vec::new();
        for s in list {
            if let Some(x) = self
                .entries
                .iter_mut()
                .find(|x| x.sa.spi == s.spi && x.sa.outbound == s.outbound)
            {
                if x.imported && (x.sa.encap, x.sa.peer) != (s.encap, s.peer) {
                    // The leader's IKE saw the peer's NAT move it.
                    x.sa.encap = s.encap;
                    x.sa.peer = s.peer;
                    self.generation += 1;
                    if let (true, Some((_, port))) = (s.outbound, s.encap) {
                        let addr = s.peer.or_else(|| remote_of(engines, &s.conn));
                        if let Some(peer) = addr.map(|a| SocketAddr::new(a, port)) {
                            match set_peer_all(engines, &s.conn, peer) {
                                Ok(n) => tracing::info!(
                                    "cluster: connection \"{}\": the peer's NAT moved it to \
                                     {peer} (from etcd): {n} outbound SA(s) now send there",
                                    s.conn
                                ),
                                Err(err) => lines.push(format!("cluster: {}: {err}", s.name())),
                            }
                        }
                    }
                }
                if x.imported && x.sa.share_from != s.share_from {
                    x.sa.share_from = s.share_from;
                    self.generation += 1;
                    if let Some(e) = engines.first_mut() {
                        match e.cluster_solo(s.spi, s.outbound, s.owner, s.share_from) {
                            Ok(Some(w)) => lines.push(w),
                            Ok(None) => {}
                            Err(err) => lines.push(format!("cluster: {}: {err}", s.name())),
                        }
                    }
                }
                continue;
            }
            if self.gone.contains(&(s.spi, s.outbound)) || find(engines, s.spi, s.outbound) {
                // Removed here while etcd still lists it for a moment (the
                // leader publishes the removal next), or an SA of the same
                // SPI configured here: not to install. (An SA this node
                // negotiated before a restart is installed again: its
                // lease keeps the per-node IVs fresh.)
                continue;
            }
            match install(engines, s, now) {
                Ok(msg) => {
                    tracing::info!("cluster: {msg} (from etcd; negotiated by node {})", s.owner);
                    if let Some(e) = engines.first_mut() {
                        if let Ok(Some(w)) =
                            e.cluster_solo(s.spi, s.outbound, s.owner, s.share_from)
                        {
                            lines.push(w);
                        }
                    }
                    self.entries.push(Entry {
                        sa: s.clone(),
                        installed: now,
                        imported: true,
                        retire_at: None,
                    });
                    self.generation += 1;
                }
                Err(e) => lines.push(format!("cluster: installing {} from etcd: {e}", s.name())),
            }
        }
        let listed = |x: &Entry| {
            list.iter()
                .any(|s| s.spi == x.sa.spi && s.outbound == x.sa.outbound)
        };
        for x in self.entries.iter().filter(|x| x.imported && !listed(x)) {
            remove(engines, &x.sa, "no longer in etcd");
        }
        let dropped: Vec<(u32, bool)> = self
            .entries
            .iter()
            .filter(|x| x.imported && !listed(x))
            .map(|x| (x.sa.spi, x.sa.outbound))
            .collect();
        self.entries.retain(|x| !x.imported || listed(x));
        if !dropped.is_empty() {
            self.generation += 1;
        }
        for g in dropped {
            self.bury(g);
        }
        lines
    }
}

/// The configured `remote` of connection `conn`.
fn remote_of(engines: &[&mut Engine], conn: &str) -> Option<IpAddr> {
    let e = engines.first()?;
    e.connections().find(|c| c.name == conn).map(|c| c.remote)
}

/// Removes the shared SA `s` from every engine, saying `why` in the log.
fn remove(engines: &mut [&mut Engine], s: &SharedSa, why: &str) {
    match del_sa_all(engines, s.spi, None, Some(s.outbound), Some(&s.conn)) {
        Ok(c) => tracing::info!("cluster: {} ({why})", c.message),
        Err(e) => tracing::debug!("cluster: removing {}: {e}", s.name()),
    }
}

/// The key in the hex text `hex`, decoded into a buffer of its final size
/// (`hex::decode` collects into a growing `Vec`, whose old allocations
/// would be freed with parts of the key in them).
fn key_bytes(hex: &str) -> Option<Zeroizing<Vec<u8>>> {
    let mut out = Zeroizing::new(vec![0u8; hex.len() / 2]);
    hex::decode_to_slice(hex, &mut out[..]).ok()?;
    Some(out)
}

/// Installs the shared SA `s` on every engine.
fn install(engines: &mut [&mut Engine], s: &SharedSa, now: Duration) -> Result<String, String> {
    let protocol = Protocol::from_name(&s.protocol)
        .ok_or_else(|| format!("unknown protocol {:?}", s.protocol))?;
    let suite: Suite = s
        .suite
        .parse()
        .map_err(|e| format!("suite {:?}: {e}", s.suite))?;
    let enc = key_bytes(&s.enc_key).ok_or("bad enc_key hex")?;
    let integ = key_bytes(&s.integ_key).ok_or("bad integ_key hex")?;
    let selectors = s
        .selectors
        .iter()
        .map(|t| t.parse())
        .collect::<Result<Vec<TrafficSelector>, String>>()
        .map_err(|e| format!("selectors: {e}"))?;
    let sa = NegotiatedSa {
        conn: &s.conn,
        outbound: s.outbound,
        protocol,
        spi: s.spi,
        suite,
        enc_key: &enc,
        integ_key: &integ,
        esn: s.esn,
        encap: s.encap,
        peer: s.peer,
        // A cluster node runs one worker and no per-CPU SAs (the
        // configuration refuses them with [cluster]).
        slot: 0,
        selectors: &selectors,
    };
    install_negotiated_all(engines, &sa, now).map(|c| c.message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_core::buf::PacketBuf;
    use espgate_core::cluster::{Dispatch, Plan};
    use espgate_core::gateway::{ClusterOptions, EngineOptions, Layers};
    use espgate_core::sa::Growth;
    use espgate_testkit::{opts, side, udp4, Shape};

    const T: Duration = Duration::from_secs(1);

    /// Site A's node `id` of a cluster keyed by IKE over ESP-in-UDP.
    fn node(id: NodeId) -> Engine {
        let o = EngineOptions {
            cluster: Some(ClusterOptions {
                node: id,
                dispatch: Dispatch::PacketRr,
                hold: Duration::from_secs(10),
            }),
            ..opts()
        };
        let mut c = side(true, Shape::new(Layers::Esp, true));
        c.negotiated = vec![Growth {
            fixed: 98,
            trailer: 2,
            align: 1,
        }];
        let mut e = Engine::new(&[c], &o, T).unwrap();
        e.cluster_plan(Plan::new(1, [1, 2]), Some(1), T);
        e
    }

    /// The outer destination address and UDP port of the next packet `e`
    /// sends (the owner of the SA: the others leave its packets to it
    /// until it shares).
    fn sends_to(e: &mut Engine) -> (IpAddr, u16) {
        let mut buf = PacketBuf::with_capacity(2000);
        buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
        assert_eq!(e.outbound(&mut buf, T), Ok(Some(0)));
        let b = buf.as_slice();
        let dst = std::net::Ipv4Addr::new(b[16], b[17], b[18], b[19]);
        (dst.into(), u16::from_be_bytes([b[22], b[23]]))
    }

    #[test]
    fn a_peer_moved_by_its_nat_is_followed_by_every_node() {
        // The leader (node 1) negotiated a pair with a peer that its NAT
        // showed at port 31000; node 2 installed it from etcd.
        let key = hex::decode(espgate_testkit::keys::K_NEW_AB).unwrap();
        let (mut leader, mut follower) = (node(1), node(2));
        let (mut ls, mut fs) = (SharedSas::new(1), SharedSas::new(2));
        for (outbound, spi) in [(true, 0x4001), (false, 0x4002)] {
            let sa = NegotiatedSa {
                conn: "peer",
                outbound,
                protocol: Protocol::Esp,
                spi,
                suite: "aes128gcm16".parse().unwrap(),
                enc_key: &key,
                integ_key: &[],
                esn: true,
                encap: Some((4500, 31000)),
                peer: None,
                slot: 0,
                selectors: &[],
            };
            install_negotiated_all(&mut [&mut leader], &sa, T).unwrap();
            ls.negotiated(&mut leader, &sa, T);
        }
        let first = ls.export();
        fs.reconcile(&mut [&mut follower], &first.sas, T);
        assert!(fs.has(0x4001, true) && fs.has(0x4002, false));
        let nat = |ip: [u8; 4], port| SocketAddr::from((ip, port));
        assert_eq!(follower.peer_udp(0), Some(nat([192, 0, 2, 2], 31000)));
        assert_eq!(sends_to(&mut leader), ([192, 0, 2, 2].into(), 31000));

        // The NAT mapped the peer anew, from another public address: IKE
        // moved the leader's SAs, and its table says so in a new
        // generation, for both entries.
        let to = nat([192, 0, 2, 9], 32000);
        set_peer_all(&mut [&mut leader], "peer", to).unwrap();
        assert_eq!(ls.peer_moved("peer", to), 2);
        assert_eq!(ls.peer_moved("peer", to), 0, "said once");
        assert_eq!(ls.peer_moved("other", nat([192, 0, 2, 1], 1)), 0);
        let moved = ls.export();
        assert!(moved.generation > first.generation);
        let at = |s: &SharedSa| (s.encap, s.peer);
        let want = (Some((4500, 32000)), Some(to.ip()));
        assert!(moved.sas.iter().all(|s| at(s) == want));
        assert_eq!(sends_to(&mut leader), (to.ip(), 32000));

        // The follower's SA says so from etcd's next list on (its outer
        // header and keepalives come from it), without a rekey; the SAs
        // are the same ones.
        let before = fs.export().generation;
        fs.reconcile(&mut [&mut follower], &moved.sas, T);
        assert_eq!(follower.peer_udp(0), Some(to));
        assert!(fs.has(0x4001, true) && fs.has(0x4002, false));
        let after = fs.export();
        assert!(after.generation > before);
        assert!(after.sas.iter().all(|s| at(s) == want));
        // An older list (etcd lagging behind) does not move this node's
        // own SAs back: only imported entries follow the list.
        ls.reconcile(&mut [&mut leader], &first.sas, T);
        assert_eq!(sends_to(&mut leader), (to.ip(), 32000));
    }
}
