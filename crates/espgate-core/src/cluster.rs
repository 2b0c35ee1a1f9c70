//! Flat-cluster dispatch (seed 003), sans-IO: every node of the cluster
//! sees every packet, advances the SA state for it (sequence numbers,
//! replay windows) and asks its [`Dispatcher`] whether it is the one node
//! that does the cryptography; the others drop the packet after the
//! state update. No message is exchanged per packet: the decision is a
//! function of what every node sees alike — the packet's lockstep counter
//! (the SA's sequence number), its length, its flow when known — and of
//! the membership [`Plan`] the cluster agent learns from etcd.
//!
//! Schemes (seed 003 §2): by packet or by session, round-robin or
//! shortest-queue-first. A node cannot see the others' real queues
//! without messages, so "shortest queue" is a *virtual* queue every node
//! keeps identically: the bytes assigned to a member minus its fair share
//! (1/n) of the bytes the cluster has seen since. With equal nodes this
//! balances bytes where round-robin balances packets. Session schemes
//! need the inner flow, which an inbound ESP packet hides until it is
//! decrypted (seed 003 says so): inbound packets use the packet scheme of
//! the same policy.
//!
//! Not here: the shared segment, etcd, the agent (the cluster crate).

use std::collections::HashMap;

/// A node's identity in the cluster (also the high bits of its AEAD IVs,
/// see [`crate::sa::IvSource::PerNode`]).
pub type NodeId = u16;

/// How packets are spread over the live nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dispatch {
    /// Packet `k` of an SA to member `k mod n`.
    PacketRr,
    /// Each packet to the member with the shortest virtual queue.
    PacketSqf,
    /// Each new outbound session to the next member in turn, then kept
    /// there; inbound by packet round-robin.
    SessionRr,
    /// Each new outbound session to the member with the shortest virtual
    /// queue, then kept there; inbound by packet shortest-queue-first.
    SessionSqf,
}

impl Dispatch {
    /// `packet-rr`, `packet-sqf`, `session-rr`, `session-sqf`.
    pub fn name(self) -> &'static str {
        match self {
            Dispatch::PacketRr => "packet-rr",
            Dispatch::PacketSqf => "packet-sqf",
            Dispatch::SessionRr => "session-rr",
            Dispatch::SessionSqf => "session-sqf",
        }
    }

    /// The scheme named `s`.
    pub fn from_name(s: &str) -> Option<Dispatch> {
        [
            Dispatch::PacketRr,
            Dispatch::PacketSqf,
            Dispatch::SessionRr,
            Dispatch::SessionSqf,
        ]
        .into_iter()
        .find(|d| d.name() == s)
    }

    fn sqf(self) -> bool {
        matches!(self, Dispatch::PacketSqf | Dispatch::SessionSqf)
    }
}

/// The live members in the order every node agrees on, and the plan's
/// epoch (it grows with every change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Increases with every membership change.
    pub epoch: u64,
    /// Live members, in dispatch order, without duplicates.
    pub members: Vec<NodeId>,
}

impl Plan {
    /// A plan of `members` (sorted and deduplicated, so that every node
    /// builds the same order from the same set).
    pub fn new(epoch: u64, members: impl IntoIterator<Item = NodeId>) -> Plan {
        let mut m: Vec<NodeId> = members.into_iter().collect();
        m.sort_unstable();
        m.dedup();
        Plan { epoch, members: m }
    }
}

/// A flow as the session schemes key it (the outbound inner packet's
/// selector fields, hashed by the caller).
pub type FlowKey = u64;

/// What the dispatcher is told of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The SA's lockstep counter for this packet: the sequence number
    /// every node assigns (outbound) or reads (inbound).
    pub counter: u64,
    /// Bytes of the packet.
    pub len: u32,
    /// The inner flow, outbound only (`None` inbound).
    pub flow: Option<FlowKey>,
}

/// The most sessions remembered; the least recently seen goes first
/// (by the lockstep counter, so every node evicts the same one).
pub const MAX_SESSIONS: usize = 65_536;

/// Every this many packets of an SA (at lockstep counters that are
/// multiples of it), the virtual queues start afresh on every node. Two
/// nodes whose queues differ — one missed a packet, or saw two packets in
/// the other order (docs/CLUSTER.md, "Same order on every node") — name
/// different owners for packets until then: each packet then goes out
/// twice or not at all. A queue holds about a packet's worth of bytes, so
/// starting it afresh this often costs the balance almost nothing and
/// bounds such a split to at most this many packets (it was
/// [`REALIGN_EVERY`] before 2026-11-29).
pub const QUEUE_REALIGN_EVERY: u64 = 256;

/// Every this many packets of an SA (at lockstep counters that are
/// multiples of it), the dispatch state that depends on history — the
/// virtual queues and the session table — starts afresh on every node.
/// Round-robin needs nothing; shortest-queue and session schemes would
/// otherwise stay split for good after a node missed packets (found by
/// the lab under overload: thousands of duplicate sequence numbers).
/// Sessions may change node at these points; at 100,000 packets/s that
/// is every 1.3 s, at 1,000 every two minutes. (Twice the session
/// table, so a full table can live between two of them.)
pub const REALIGN_EVERY: u64 = 2 * MAX_SESSIONS as u64;

/// One node's dispatcher. Every node of a cluster runs one with the same
/// scheme and plan, is shown the same packets, and so reaches the same
/// decisions.
#[derive(Debug, Clone)]
pub struct Dispatcher {
    scheme: Dispatch,
    plan: Plan,
    /// Virtual queue of each member, bytes (index as in `plan.members`).
    backlog: Vec<u64>,
    /// Bytes seen not yet shared out among the members (the remainder of
    /// the division by n).
    carry: u64,
    /// Session → (member, last seen at lockstep counter).
    sessions: HashMap<FlowKey, (NodeId, u64)>,
}

impl Dispatcher {
    /// A dispatcher for `scheme` under `plan`.
    pub fn new(scheme: Dispatch, plan: Plan) -> Dispatcher {
        let n = plan.members.len();
        Dispatcher {
            scheme,
            plan,
            backlog: vec![0; n],
            carry: 0,
            // Room for the usual number of flows up front, so that the
            // packet path seldom grows the table (a session scheme only).
            sessions: if matches!(scheme, Dispatch::SessionRr | Dispatch::SessionSqf) {
                HashMap::with_capacity(4096)
            } else {
                HashMap::new()
            },
        }
    }

    /// The scheme.
    pub fn scheme(&self) -> Dispatch {
        self.scheme
    }

    /// The plan in force.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Installs a new plan. Virtual queues restart at zero; sessions on a
    /// member that left are placed again by the scheme when next seen.
    pub fn set_plan(&mut self, plan: Plan) {
        self.backlog = vec![0; plan.members.len()];
        self.carry = 0;
        self.plan = plan;
    }

    /// Virtual queue of `node`, bytes (`None` when not a member).
    pub fn backlog(&self, node: NodeId) -> Option<u64> {
        let i = self.plan.members.iter().position(|m| *m == node)?;
        Some(self.backlog[i])
    }

    /// The member that processes packet `p`; `None` when the plan is
    /// empty (no node may process: the packet is dropped everywhere).
    pub fn assign(&mut self, p: &Seen) -> Option<NodeId> {
        let n = self.plan.members.len();
        if n == 0 {
            return None;
        }
        if p.counter.is_multiple_of(REALIGN_EVERY) {
            self.realign();
        } else if p.counter.is_multiple_of(QUEUE_REALIGN_EVERY) {
            self.restart_queues();
        }
        let i = match (self.scheme, p.flow) {
            (Dispatch::SessionRr | Dispatch::SessionSqf, Some(f)) => self.session(f, p.counter),
            _ if self.scheme.sqf() => self.shortest(),
            _ => (p.counter % n as u64) as usize,
        };
        self.account(i, p.len);
        Some(self.plan.members[i])
    }

    /// Starts the state that depends on what this node saw afresh: the
    /// virtual queues and the session table (its room is kept). Every
    /// node does it at the same lockstep counter, so a node that missed
    /// packets — and so placed sessions or filled queues differently —
    /// agrees with the others again from there.
    fn realign(&mut self) {
        self.restart();
    }

    /// Forgets what this node saw (virtual queues, sessions) at a counter
    /// every node agrees on: [`REALIGN_EVERY`], and the point from which a
    /// solo SA is shared (its followers saw only part of what came before).
    pub fn restart(&mut self) {
        self.restart_queues();
        self.sessions.clear();
    }

    /// Empties the virtual queues (every [`QUEUE_REALIGN_EVERY`] packets,
    /// and within [`Dispatcher::restart`]).
    fn restart_queues(&mut self) {
        self.backlog.fill(0);
        self.carry = 0;
    }

    /// True when `me` processes packet `p` (see [`Dispatcher::assign`]).
    pub fn is_mine(&mut self, me: NodeId, p: &Seen) -> bool {
        self.assign(p) == Some(me)
    }

    /// The member with the shortest virtual queue (the first in plan
    /// order on a tie).
    fn shortest(&self) -> usize {
        let mut best = 0;
        for (i, b) in self.backlog.iter().enumerate() {
            if *b < self.backlog[best] {
                best = i;
            }
        }
        best
    }

    /// The member index of session `f`, placing it when new (or when its
    /// member left the plan).
    fn session(&mut self, f: FlowKey, counter: u64) -> usize {
        let members = &self.plan.members;
        if let Some((node, last)) = self.sessions.get_mut(&f) {
            if let Some(i) = members.iter().position(|m| m == node) {
                *last = counter;
                return i;
            }
        }
        // Round-robin by the lockstep counter of the session's first
        // packet (not by a count of sessions, which a node that missed a
        // first packet would have wrong).
        let i = if self.scheme.sqf() {
            self.shortest()
        } else {
            (counter % members.len() as u64) as usize
        };
        if self.sessions.len() >= MAX_SESSIONS && !self.sessions.contains_key(&f) {
            // Deterministic eviction: the least recently seen, ties by key.
            // A scan of the table, paid only by a new session once the
            // table is full; an ordered index would make it O(log n) if
            // flow churn at that scale shows up in the cluster's costs.
            if let Some(old) = self
                .sessions
                .iter()
                .min_by_key(|(k, (_, last))| (*last, **k))
                .map(|(k, _)| *k)
            {
                self.sessions.remove(&old);
            }
        }
        self.sessions.insert(f, (members[i], counter));
        i
    }

    /// Adds `len` to member `i`'s queue and drains every queue by its
    /// fair share of `len`.
    fn account(&mut self, i: usize, len: u32) {
        let n = self.backlog.len() as u64;
        self.backlog[i] += u64::from(len);
        let total = self.carry + u64::from(len);
        let share = total / n;
        self.carry = total % n;
        for b in &mut self.backlog {
            *b = b.saturating_sub(share);
        }
    }
}

/// A 64-bit digest of a clear packet, the same on every node: a mix of
/// its length and its first 64 bytes (for IPv4, the header with its ID
/// and checksum, the transport header and the start of the payload).
/// Not a cryptographic hash: it only has to tell apart the packets of
/// one SA within a few thousand of each other. (Written here because it
/// must be identical on every node and build: `std`'s hashers are seeded
/// per process.)
pub fn digest(pkt: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let head = &pkt[..pkt.len().min(64)];
    let mut h = (pkt.len() as u64).wrapping_mul(K);
    let mut chunks = head.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h ^ u64::from_le_bytes(last)).wrapping_mul(K);
    h ^ (h >> 32)
}

/// The session key of an outbound inner packet (addresses, protocol and
/// ports), the same on every node.
pub fn flow_key(f: &crate::wire::flow::Flow) -> FlowKey {
    let mut b = [0u8; 38];
    let put = |b: &mut [u8], a: std::net::IpAddr| match a {
        std::net::IpAddr::V4(v) => b[..4].copy_from_slice(&v.octets()),
        std::net::IpAddr::V6(v) => b[..16].copy_from_slice(&v.octets()),
    };
    put(&mut b[0..16], f.src);
    put(&mut b[16..32], f.dst);
    b[32] = f.proto;
    b[33..35].copy_from_slice(&f.sport.unwrap_or(0).to_be_bytes());
    b[35..37].copy_from_slice(&f.dport.unwrap_or(0).to_be_bytes());
    b[37] = u8::from(f.src.is_ipv6());
    digest(&b)
}

/// Sampled packets remembered per outbound SA for lockstep checks.
pub const LOCKSTEP_RING: usize = 16_384;
/// Past the first [`EARLY`] numbers, one packet in this many is sampled
/// (by its digest, so every node samples the same packets whatever
/// numbers it gave them).
pub const SAMPLE_ONE_IN: u64 = 64;
/// Every packet below this sequence number is sampled (a new SA, or a
/// quiet one, has comparable samples at once).
pub const EARLY: u64 = 256;
/// A lockstep sample stands for this many consecutive packets (see
/// [`Lockstep::record`]).
pub const WINDOW: usize = 8;

/// What a comparison with another node's checkpoint found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// This node gave that packet the same sequence number.
    InStep,
    /// This node gave that packet another number: the sequence number
    /// must move by this much to agree.
    Off(i64),
    /// The packet is not among this node's samples (too old, not yet
    /// seen, or never seen): no conclusion.
    Unknown,
}

/// One outbound SA's recent history on this node: which inner packet got
/// which sequence number, for a sample of the packets. Every node of a
/// flat cluster keeps one; they publish their latest sample as a
/// checkpoint (a number and its packet's digest), and a node that finds
/// the others' packet under another number knows by how much it is out
/// of step — without any per-packet message. The sample is chosen by the
/// packet's digest, so every node samples the same packets; 16,384
/// samples of one packet in 64 cover about 10 s at 100,000 packets/s.
#[derive(Debug, Clone)]
pub struct Lockstep {
    /// (sequence number, window digest), a ring in the order recorded.
    ring: Box<[(u64, u64)]>,
    next: usize,
    checkpoint: Option<(u64, u64)>,
    /// The digests of the last [`WINDOW`] packets recorded (sampled or
    /// not), a ring: packet `k` at `k % WINDOW`.
    recent: [u64; WINDOW],
    recorded: usize,
}

impl Default for Lockstep {
    fn default() -> Self {
        Lockstep::new()
    }
}

impl Lockstep {
    /// An empty history (allocated once, here).
    pub fn new() -> Lockstep {
        Lockstep {
            ring: vec![(0, 0); LOCKSTEP_RING].into_boxed_slice(),
            next: 0,
            checkpoint: None,
            recent: [0; WINDOW],
            recorded: 0,
        }
    }

    /// Sequence number `seq` went to the packet with digest `d`.
    ///
    /// A sample stands for the packet *and the [`WINDOW`] − 1 numbered
    /// just before it*, in that order (one digest of the window). A node
    /// that saw a few packets in another order than the others
    /// (docs/CLUSTER.md, "Same order on every node") numbered the same
    /// packets as they did. Yet a sample of one packet moved by that
    /// reordering would show the node off by its move, and the majority
    /// would then put a node that was in step out of step. As a window,
    /// such a sample is not found, and there is no conclusion, as long as
    /// no packet moved by [`WINDOW`] places or more. A node that missed
    /// packets is still found off by exactly their number, from any
    /// sample whose window it saw whole.
    pub fn record(&mut self, seq: u64, d: u64) {
        self.recent[self.recorded % WINDOW] = d;
        self.recorded = self.recorded.wrapping_add(1);
        if seq < EARLY || d.is_multiple_of(SAMPLE_ONE_IN) {
            let w = self.window_digest();
            self.ring[self.next] = (seq, w);
            self.next = (self.next + 1) % LOCKSTEP_RING;
            self.checkpoint = Some((seq, w));
        }
    }

    /// The digest of the last [`WINDOW`] packets, oldest first (packets
    /// before the first one recorded count as digest 0): the same on
    /// every node that numbered those packets in that order.
    fn window_digest(&self) -> u64 {
        const K: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..WINDOW).fold(0u64, |h, i| {
            let d = self.recent[self.recorded.wrapping_add(i) % WINDOW];
            (h ^ d).wrapping_mul(K).rotate_left(29)
        })
    }

    /// The latest sample: (sequence number, window digest).
    pub fn checkpoint(&self) -> Option<(u64, u64)> {
        self.checkpoint
    }

    /// Compares with another node's checkpoint `(seq, d)`.
    pub fn compare(&self, seq: u64, d: u64) -> Verdict {
        // Where did this node put that packet? The latest match wins.
        let mut best: Option<u64> = None;
        for &(s, x) in self.ring.iter() {
            if s != 0 && x == d && best.is_none_or(|b| s > b) {
                best = Some(s);
            }
        }
        match best {
            Some(s) if s == seq => Verdict::InStep,
            Some(s) => Verdict::Off(seq as i64 - s as i64),
            None => Verdict::Unknown,
        }
    }

    /// The sample of sequence number `seq`, if it is in the ring.
    #[cfg(test)]
    fn sample(&self, seq: u64) -> Option<u64> {
        self.ring.iter().find(|(s, _)| *s == seq).map(|(_, d)| *d)
    }

    /// Forgets the history (after a resync renumbers what follows).
    pub fn clear(&mut self) {
        self.ring.fill((0, 0));
        self.next = 0;
        self.checkpoint = None;
        self.recent = [0; WINDOW];
        self.recorded = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seen(counter: u64, len: u32, flow: Option<u64>) -> Seen {
        Seen { counter, len, flow }
    }

    #[test]
    fn names_round_trip() {
        for d in [
            Dispatch::PacketRr,
            Dispatch::PacketSqf,
            Dispatch::SessionRr,
            Dispatch::SessionSqf,
        ] {
            assert_eq!(Dispatch::from_name(d.name()), Some(d));
        }
        assert_eq!(Dispatch::from_name("random"), None);
        assert_eq!(Plan::new(1, [3, 1, 3, 2]).members, vec![1, 2, 3]);
    }

    #[test]
    fn packet_rr_follows_the_counter() {
        let mut d = Dispatcher::new(Dispatch::PacketRr, Plan::new(1, [10, 20, 30]));
        let got: Vec<_> = (1..=6)
            .map(|k| d.assign(&seen(k, 100, None)).unwrap())
            .collect();
        assert_eq!(got, [20, 30, 10, 20, 30, 10]);
        let mut empty = Dispatcher::new(Dispatch::PacketRr, Plan::new(2, []));
        assert_eq!(empty.assign(&seen(1, 1, None)), None);
    }

    #[test]
    fn sqf_balances_bytes_where_rr_balances_packets() {
        // Alternating 1500 and 64 bytes on two nodes: round-robin gives
        // one node all the big packets; SQF spreads the bytes.
        let lens = |k: u64| if k.is_multiple_of(2) { 1500 } else { 64 };
        let bytes = |scheme| {
            let mut d = Dispatcher::new(scheme, Plan::new(1, [1, 2]));
            let mut per = [0u64; 2];
            for k in 0..1000u64 {
                let node = d.assign(&seen(k, lens(k), None)).unwrap();
                per[usize::from(node - 1)] += u64::from(lens(k));
            }
            per
        };
        let rr = bytes(Dispatch::PacketRr);
        let sqf = bytes(Dispatch::PacketSqf);
        assert!(rr[0].abs_diff(rr[1]) > 700_000, "{rr:?}");
        assert!(sqf[0].abs_diff(sqf[1]) <= 1500, "{sqf:?}");
    }

    #[test]
    fn sqf_picks_the_shortest_virtual_queue() {
        let mut d = Dispatcher::new(Dispatch::PacketSqf, Plan::new(1, [1, 2, 3]));
        assert_eq!(d.assign(&seen(1, 900, None)), Some(1));
        // 1 holds 900 - 300 = 600; 2 and 3 are empty: 2 (first on a tie).
        assert_eq!(d.backlog(1), Some(600));
        assert_eq!(d.assign(&seen(2, 300, None)), Some(2));
        assert_eq!(d.assign(&seen(3, 30, None)), Some(3));
        assert_eq!(d.backlog(9), None);
    }

    #[test]
    fn sessions_stay_on_one_node_and_move_when_it_leaves() {
        let mut d = Dispatcher::new(Dispatch::SessionRr, Plan::new(1, [1, 2, 3]));
        // New sessions by the counter of their first packet.
        let first: Vec<_> = (1..=3)
            .map(|k| d.assign(&seen(k, 100, Some(k))).unwrap())
            .collect();
        assert_eq!(first, [2, 3, 1]);
        for k in 4..34 {
            assert_eq!(d.assign(&seen(k, 100, Some(1))), Some(2));
        }
        // Inbound (no flow): packet round-robin.
        assert_eq!(d.assign(&seen(34, 100, None)), Some(2));
        // Node 2 leaves: its session is placed again, then stays.
        d.set_plan(Plan::new(2, [1, 3]));
        let moved = d.assign(&seen(50, 100, Some(1))).unwrap();
        assert!(moved == 1 || moved == 3);
        for k in 51..60 {
            assert_eq!(d.assign(&seen(k, 100, Some(1))), Some(moved));
        }
    }

    #[test]
    fn the_session_table_is_bounded_and_evicts_alike_everywhere() {
        let mut a = Dispatcher::new(Dispatch::SessionRr, Plan::new(1, [1, 2]));
        let mut b = a.clone();
        // Counters between two realignments.
        for f in 0..(MAX_SESSIONS as u64 + 10) {
            let k = REALIGN_EVERY + 1 + f;
            assert_eq!(
                a.assign(&seen(k, 64, Some(f))),
                b.assign(&seen(k, 64, Some(f)))
            );
        }
        assert_eq!(a.sessions.len(), MAX_SESSIONS);
        assert_eq!(a.sessions.keys().min(), b.sessions.keys().min());
    }

    #[test]
    fn two_packets_swapped_on_one_node_split_the_queues_only_until_the_next_realignment() {
        for scheme in [Dispatch::PacketSqf, Dispatch::SessionSqf] {
            let plan = Plan::new(1, [1, 2, 3]);
            let (mut a, mut b) = (
                Dispatcher::new(scheme, plan.clone()),
                Dispatcher::new(scheme, plan),
            );
            // Inbound (no flow): the session scheme falls back to packet-sqf.
            let len = |k: u64| 64 + (k * 37 % 1400) as u32;
            let pkt = |k: u64, l: u32| seen(k, l, None);
            // B sees packets 100 and 101 in the other order: it numbers
            // them alike but accounts their lengths the other way round.
            let mut split = 0;
            for k in 1..QUEUE_REALIGN_EVERY {
                let (la, lb) = match k {
                    100 => (len(100), len(101)),
                    101 => (len(101), len(100)),
                    _ => (len(k), len(k)),
                };
                if a.assign(&pkt(k, la)) != b.assign(&pkt(k, lb)) {
                    split += 1;
                }
            }
            assert!(
                split > 2,
                "{scheme:?}: the swap should have split them ({split})"
            );
            for k in QUEUE_REALIGN_EVERY..4 * QUEUE_REALIGN_EVERY {
                assert_eq!(
                    a.assign(&pkt(k, len(k))),
                    b.assign(&pkt(k, len(k))),
                    "{scheme:?}, packet {k}"
                );
            }
        }
    }

    #[test]
    fn nodes_that_saw_different_packets_agree_again_after_a_realignment() {
        for scheme in [
            Dispatch::PacketSqf,
            Dispatch::SessionRr,
            Dispatch::SessionSqf,
        ] {
            let plan = Plan::new(1, [1, 2, 3]);
            let (mut a, mut b) = (
                Dispatcher::new(scheme, plan.clone()),
                Dispatcher::new(scheme, plan),
            );
            let pkt = |k: u64| seen(k, 64 + (k * 37 % 1400) as u32, Some(k % 50));
            // B misses one packet in seven before the realignment.
            let mut split = 0;
            for k in 1..REALIGN_EVERY {
                let pa = a.assign(&pkt(k));
                if k % 7 != 0 && b.assign(&pkt(k)) != pa {
                    split += 1;
                }
            }
            assert!(split > 0, "{scheme:?}: the miss should have split them");
            for k in REALIGN_EVERY..REALIGN_EVERY + 5000 {
                assert_eq!(
                    a.assign(&pkt(k)),
                    b.assign(&pkt(k)),
                    "{scheme:?}, packet {k}"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Three nodes number a stream of packets; one node misses random
        /// packets. Comparing its latest sample with the two others finds
        /// exactly how many it missed (the offset of its numbering), or
        /// says nothing — never a wrong offset, and never an offset for a
        /// node that missed nothing.
        #[test]
        fn checkpoint_votes_find_the_exact_offset_or_nothing(
            n in 1u64..3000,
            missed in proptest::collection::btree_set(1u64..3000, 0..40),
        ) {
            let pkt = |k: u64| {
                let mut p = [0u8; 48];
                p[..8].copy_from_slice(&k.to_be_bytes());
                p
            };
            let (mut a, mut b) = (Lockstep::new(), Lockstep::new());
            let mut b_seq = 0;
            for k in 1..=n {
                a.record(k, digest(&pkt(k)));
                if !missed.contains(&k) {
                    b_seq += 1;
                    b.record(b_seq, digest(&pkt(k)));
                }
            }
            let (s, d) = a.checkpoint().unwrap();
            // Missed up to and including the checkpoint's packet.
            let off = missed.iter().filter(|m| **m <= s).count() as i64;
            match b.compare(s, d) {
                Verdict::InStep => prop_assert_eq!(off, 0),
                Verdict::Off(k) => prop_assert_eq!(k, off),
                // Unknown when B missed a packet of the sample's window.
                Verdict::Unknown => prop_assert!(missed.range(s.saturating_sub(WINDOW as u64 - 1)..=s).next().is_some(),
                                                 "B saw the window up to {} but did not find it", s),
            }
            // A, which missed nothing, finds B's checkpoint packet too and
            // sees B behind by exactly the packets B missed before it.
            if let Some((s, d)) = b.checkpoint() {
                let k = (1..=n).filter(|k| !missed.contains(k)).nth(s as usize - 1).unwrap();
                let behind = missed.iter().filter(|m| **m < k).count() as i64;
                let want = if behind == 0 { Verdict::InStep } else { Verdict::Off(-behind) };
                match a.compare(s, d) {
                    // B sampled it for its early number (A numbered it past
                    // the early ones and only samples one in 64 there), or
                    // B missed a packet of its window.
                    Verdict::Unknown => prop_assert!((s < EARLY && k >= EARLY)
                                                     || missed.range(k.saturating_sub(WINDOW as u64 - 1)..k).next().is_some(),
                                                     "{} {}", s, k),
                    v => prop_assert_eq!(v, want),
                }
            }
        }

        /// One node sees the packets in another order than the other: each
        /// block of up to WINDOW packets in its own order (no packet moves
        /// by WINDOW places or more). It numbered the same packets, so a
        /// comparison either way finds it in step or says nothing, never
        /// an offset: a reordering must not move a node out of step.
        #[test]
        fn packets_reordered_by_less_than_a_window_never_move_a_node(
            n in 1u64..3000,
            blocks in proptest::collection::vec((1usize..=WINDOW, any::<u64>()), 1..400),
        ) {
            let pkt = |k: u64| {
                let mut p = [0u8; 48];
                p[..8].copy_from_slice(&k.to_be_bytes());
                p
            };
            // B's order: 1..=n cut into blocks, each shuffled by its seed.
            let mut order: Vec<u64> = (1..=n).collect();
            let mut at = 0;
            for (len, seed) in blocks.iter().cycle() {
                if at >= order.len() {
                    break;
                }
                let block = &mut order[at..(at + len).min(n as usize)];
                let mut r = *seed | 1;
                for i in (1..block.len()).rev() {
                    r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    block.swap(i, (r >> 33) as usize % (i + 1));
                }
                at += len;
            }
            let (mut a, mut b) = (Lockstep::new(), Lockstep::new());
            for k in 1..=n {
                a.record(k, digest(&pkt(k)));
                b.record(k, digest(&pkt(order[k as usize - 1])));
            }
            for (x, y) in [(&a, &b), (&b, &a)] {
                if let Some((s, d)) = x.checkpoint() {
                    let v = y.compare(s, d);
                    prop_assert!(matches!(v, Verdict::InStep | Verdict::Unknown), "{:?} at {}", v, s);
                }
            }
        }

        /// Every node of a cluster, shown the same packets, picks the same
        /// single live member for each: exactly one node processes it.
        #[test]
        fn exactly_one_live_node_processes_each_packet(
            scheme in 0usize..4,
            nodes in proptest::collection::btree_set(0u16..16, 1..6),
            packets in proptest::collection::vec((1u32..9000, proptest::option::of(0u64..20)), 1..300),
            change_at in 0usize..300,
        ) {
            let scheme = [Dispatch::PacketRr, Dispatch::PacketSqf, Dispatch::SessionRr, Dispatch::SessionSqf][scheme];
            let members: Vec<NodeId> = nodes.iter().copied().collect();
            let plan = Plan::new(1, members.clone());
            let mut ds: Vec<Dispatcher> = members.iter().map(|_| Dispatcher::new(scheme, plan.clone())).collect();
            let mut live = members.clone();
            for (k, (len, flow)) in packets.iter().enumerate() {
                if k == change_at && live.len() > 1 {
                    // A member leaves: every node installs the same plan.
                    live.remove(0);
                    for d in &mut ds {
                        d.set_plan(Plan::new(2, live.clone()));
                    }
                }
                let p = seen(k as u64 + 1, *len, *flow);
                let picks: Vec<Option<NodeId>> = ds.iter_mut().map(|d| d.assign(&p)).collect();
                prop_assert!(picks.windows(2).all(|w| w[0] == w[1]), "nodes disagree: {picks:?}");
                let pick = picks[0].unwrap();
                prop_assert!(live.contains(&pick), "{pick} is not live ({live:?})");
            }
        }
    }

    #[test]
    fn lockstep_finds_an_offset_and_agrees_after_it() {
        let pkt = |k: u64| {
            let mut p = vec![0x45u8; 100];
            p[4..12].copy_from_slice(&k.to_be_bytes());
            p
        };
        // Node A saw every packet; node B missed packet 300.
        let (mut a, mut b) = (Lockstep::new(), Lockstep::new());
        let mut b_seq = 1;
        for k in 1..=1000u64 {
            a.record(k, digest(&pkt(k)));
            if k != 300 {
                b.record(b_seq, digest(&pkt(k)));
                b_seq += 1;
            }
        }
        let (s, d) = a.checkpoint().unwrap();
        assert!(s > 900, "{s}");
        assert_eq!(b.compare(s, d), Verdict::Off(1));
        // Before the miss they agree (every early packet is sampled).
        assert_eq!(b.compare(200, a.sample(200).unwrap()), Verdict::InStep);
        assert_eq!(a.compare(s, d), Verdict::InStep);
        assert_eq!(a.compare(5000, 7), Verdict::Unknown);
        b.clear();
        assert_eq!(b.checkpoint(), None);
        assert_eq!(b.compare(s, d), Verdict::Unknown);
    }

    #[test]
    fn digests_and_flow_keys_tell_packets_apart() {
        let a = [1u8; 64];
        let mut b = a;
        b[63] = 2;
        assert_ne!(digest(&a), digest(&b));
        assert_ne!(digest(&a[..10]), digest(&a[..11]));
        assert_eq!(digest(&a), digest(&a));
        let f = |sport| crate::wire::flow::Flow {
            src: "10.1.0.1".parse().unwrap(),
            dst: "10.2.0.1".parse().unwrap(),
            proto: 17,
            sport: Some(sport),
            dport: Some(53),
        };
        assert_ne!(flow_key(&f(1000)), flow_key(&f(1001)));
        assert_eq!(flow_key(&f(1000)), flow_key(&f(1000)));
    }
}
