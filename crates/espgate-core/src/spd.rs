//! The Security Policy Database (RFC 4301 §4.4.1): an ordered list of
//! policies; the first whose selector matches decides PROTECT, BYPASS or
//! DISCARD.
//!
//! Lookup cost must not grow with the number of policies, so policies are
//! indexed by the *remote* prefix (destination outbound, source inbound):
//! one hash table per distinct prefix length, each mapping a masked address
//! to the policy indices with that prefix in priority order. A lookup probes
//! one table per distinct prefix length (typically a handful), takes the first
//! full match in each bucket, and keeps the lowest index.
//!
//! On top of the index, [`Spd::lookup_memo`] remembers the last flow that
//! matched and its policy. A gateway sees runs of packets of one flow (the
//! tens of segments of a TSO read all carry one 5-tuple), and a repeat then
//! costs one comparison of the flow instead of the hashing and the
//! selector match (measured: `cargo bench -p espgate-core --bench esp --
//! engine_segment`, docs/PERFORMANCE.md).

use crate::sad::SaId;
use crate::selector::{mask, TrafficSelector};
use crate::wire::flow::Flow;
use rustc_hash::FxHashMap;
use std::net::IpAddr;

/// What to do with matching traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Apply these SAs, innermost first (a bundle when more than one).
    Protect(Vec<SaId>),
    /// Let the packet pass in the clear.
    Bypass,
    /// Drop the packet.
    Discard,
}

/// One SPD entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// What it matches.
    pub selector: TrafficSelector,
    /// What it does.
    pub action: Action,
}

/// Packet direction, which decides which address is the remote one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// We are sending: source is local.
    Outbound,
    /// We received: source is remote.
    Inbound,
}

/// Masked remote address bits -> policy indices, ascending.
type Bucket = FxHashMap<u128, Vec<u32>>;

#[derive(Debug, Default)]
struct Table {
    /// One bucket per (is_v6, prefix length).
    buckets: Vec<((bool, u8), Bucket)>,
}

fn bits(a: IpAddr) -> (bool, u128) {
    match a {
        IpAddr::V4(v) => (false, u128::from(u32::from(v))),
        IpAddr::V6(v) => (true, u128::from(v)),
    }
}

impl Table {
    fn add(&mut self, idx: u32, remote: crate::selector::Prefix) {
        let (v6, b) = bits(remote.addr());
        let key = (v6, remote.len());
        let pos = match self.buckets.iter().position(|(k, _)| *k == key) {
            Some(p) => p,
            None => {
                self.buckets.push((key, FxHashMap::default()));
                // Longer prefixes first: they tend to hold the specific policies.
                self.buckets.sort_by_key(|b| std::cmp::Reverse(b.0 .1));
                self.buckets
                    .iter()
                    .position(|(k, _)| *k == key)
                    .unwrap_or(0)
            }
        };
        self.buckets[pos].1.entry(b).or_default().push(idx);
    }
}

/// Ordered policies with an index for fast lookup.
#[derive(Debug, Default)]
pub struct Spd {
    policies: Vec<Policy>,
    index: Table,
    /// The last flow [`Spd::lookup_memo`] found a policy for: its
    /// direction, the flow and the policy's position. Forgotten whenever
    /// the policies move or change (push, insert, remove); a new action
    /// (`set_action`) keeps it, since the selectors, and so the first
    /// match, stay the same.
    memo: Option<(Direction, Flow, u32)>,
}

impl Spd {
    /// An empty SPD (everything is discarded: RFC 4301's default).
    pub fn new() -> Spd {
        Spd::default()
    }

    /// Appends a policy with the lowest priority so far.
    pub fn push(&mut self, p: Policy) {
        let idx = self.policies.len() as u32;
        self.index.add(idx, p.selector.remote);
        self.policies.push(p);
        self.memo = None;
    }

    /// Inserts a policy at `pos` (0 = highest priority) and reindexes.
    pub fn insert(&mut self, pos: usize, p: Policy) {
        self.policies.insert(pos.min(self.policies.len()), p);
        self.reindex();
    }

    /// Removes the policy at `pos`.
    pub fn remove(&mut self, pos: usize) -> Option<Policy> {
        (pos < self.policies.len()).then(|| {
            let p = self.policies.remove(pos);
            self.reindex();
            p
        })
    }

    fn reindex(&mut self) {
        self.memo = None;
        self.index = Table::default();
        for (i, p) in self.policies.iter().enumerate() {
            self.index.add(i as u32, p.selector.remote);
        }
    }

    /// Replaces the action of the policy at `pos` (e.g. the SAs of a
    /// PROTECT policy after a rekey). The selector, and so the index, stay.
    /// `false` when there is no such policy.
    pub fn set_action(&mut self, pos: usize, action: Action) -> bool {
        match self.policies.get_mut(pos) {
            Some(p) => {
                p.action = action;
                true
            }
            None => false,
        }
    }

    /// Policies in priority order.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// Number of policies.
    pub fn len(&self) -> usize {
        self.policies.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// The first matching policy and its position; `None` means no policy
    /// matched, which callers treat as DISCARD.
    pub fn lookup(&self, flow: &Flow, dir: Direction) -> Option<(usize, &Policy)> {
        let remote = match dir {
            Direction::Outbound => flow.dst,
            Direction::Inbound => flow.src,
        };
        let (v6, _) = bits(remote);
        let mut best = u32::MAX;
        for ((bv6, len), map) in &self.index.buckets {
            if *bv6 != v6 {
                continue;
            }
            let masked = bits(mask(remote, *len)).1;
            let Some(cands) = map.get(&masked) else {
                continue;
            };
            for &i in cands {
                if i >= best {
                    break;
                }
                let sel = &self.policies[i as usize].selector;
                let hit = match dir {
                    Direction::Outbound => sel.matches_outbound(flow),
                    Direction::Inbound => sel.matches_inbound(flow),
                };
                if hit {
                    best = i;
                    break;
                }
            }
        }
        (best != u32::MAX).then(|| (best as usize, &self.policies[best as usize]))
    }

    /// [`Spd::lookup`]'s position, remembering the flow that matched: the
    /// same flow again (in the same direction) is answered from the memo.
    /// Flows that match nothing are not remembered.
    #[inline]
    pub fn lookup_memo(&mut self, flow: &Flow, dir: Direction) -> Option<usize> {
        if let Some((d, f, i)) = &self.memo {
            if *d == dir && f == flow {
                return Some(*i as usize);
            }
        }
        let i = self.lookup(flow, dir)?.0;
        self.memo = Some((dir, *flow, i as u32));
        Some(i)
    }

    /// Reference lookup by linear scan (for tests and benchmarks).
    pub fn lookup_linear(&self, flow: &Flow, dir: Direction) -> Option<(usize, &Policy)> {
        self.policies.iter().enumerate().find(|(_, p)| match dir {
            Direction::Outbound => p.selector.matches_outbound(flow),
            Direction::Inbound => p.selector.matches_inbound(flow),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::{PortRange, Prefix};
    use proptest::prelude::*;

    fn v4(a: u32) -> IpAddr {
        IpAddr::V4(a.into())
    }

    fn policy(
        local: (u32, u8),
        remote: (u32, u8),
        proto: Option<u8>,
        ports: Option<(u16, u16)>,
        action: Action,
    ) -> Policy {
        Policy {
            selector: TrafficSelector {
                local: Prefix::new(v4(local.0), local.1).unwrap(),
                remote: Prefix::new(v4(remote.0), remote.1).unwrap(),
                proto,
                local_ports: PortRange::ANY,
                remote_ports: ports.map_or(PortRange::ANY, |(lo, hi)| PortRange { lo, hi }),
            },
            action,
        }
    }

    #[test]
    fn set_action_keeps_the_selector_and_index() {
        let mut spd = Spd::new();
        spd.push(policy(
            (0, 0),
            (0x0a02_0000, 16),
            None,
            None,
            Action::Protect(vec![SaId(0)]),
        ));
        assert!(spd.set_action(0, Action::Protect(vec![SaId(3), SaId(4)])));
        assert!(!spd.set_action(1, Action::Discard));
        let f = Flow {
            src: v4(0x0a01_0001),
            dst: v4(0x0a02_0009),
            proto: 17,
            sport: None,
            dport: None,
        };
        let (i, p) = spd.lookup(&f, Direction::Outbound).unwrap();
        assert_eq!(i, 0);
        assert_eq!(p.action, Action::Protect(vec![SaId(3), SaId(4)]));
    }

    #[test]
    fn first_match_wins_across_prefix_lengths() {
        let mut spd = Spd::new();
        spd.push(policy(
            (0, 0),
            (0x0a02_0000, 16),
            Some(6),
            Some((22, 22)),
            Action::Bypass,
        ));
        spd.push(policy(
            (0, 0),
            (0x0a02_0005, 32),
            None,
            None,
            Action::Discard,
        ));
        spd.push(policy(
            (0, 0),
            (0, 0),
            None,
            None,
            Action::Protect(vec![SaId(0)]),
        ));
        let f = |dst: u32, proto: u8, dport: u16| Flow {
            src: v4(0x0a01_0001),
            dst: v4(dst),
            proto,
            sport: Some(1000),
            dport: Some(dport),
        };
        assert_eq!(
            spd.lookup(&f(0x0a02_0005, 6, 22), Direction::Outbound)
                .unwrap()
                .0,
            0
        );
        assert_eq!(
            spd.lookup(&f(0x0a02_0005, 6, 80), Direction::Outbound)
                .unwrap()
                .0,
            1
        );
        assert_eq!(
            spd.lookup(&f(0x0a03_0005, 17, 53), Direction::Outbound)
                .unwrap()
                .0,
            2
        );
        assert!(spd
            .lookup(&f(0x0a03_0005, 17, 53), Direction::Outbound)
            .is_some());
        let v6 = Flow {
            src: "::1".parse().unwrap(),
            dst: "::2".parse().unwrap(),
            proto: 6,
            sport: None,
            dport: None,
        };
        assert!(spd.lookup(&v6, Direction::Outbound).is_none());
        // Inserting at the front changes the winner.
        spd.insert(0, policy((0, 0), (0, 0), None, None, Action::Discard));
        assert_eq!(
            spd.lookup(&f(0x0a02_0005, 6, 22), Direction::Outbound)
                .unwrap()
                .0,
            0
        );
        spd.remove(0);
        assert_eq!(
            spd.lookup(&f(0x0a02_0005, 6, 22), Direction::Outbound)
                .unwrap()
                .0,
            0
        );
    }

    /// The memo answers as the index does while the policies change
    /// under it: a flow looked up, then policies inserted in front,
    /// removed, appended and given new actions, looked up again each time.
    #[test]
    fn the_memo_follows_every_change_of_the_policies() {
        let mut spd = Spd::new();
        let f = Flow {
            src: v4(0x0a01_0001),
            dst: v4(0x0a02_0005),
            proto: 17,
            sport: Some(1000),
            dport: Some(53),
        };
        let check = |spd: &mut Spd, want: Option<usize>| {
            assert_eq!(spd.lookup(&f, Direction::Outbound).map(|x| x.0), want);
            for _ in 0..2 {
                assert_eq!(spd.lookup_memo(&f, Direction::Outbound), want);
            }
        };
        check(&mut spd, None);
        let protect = |i| Action::Protect(vec![SaId(i)]);
        spd.push(policy((0, 0), (0x0a02_0000, 16), None, None, protect(0)));
        check(&mut spd, Some(0));
        // The other direction is not answered from the outbound memo.
        assert_eq!(spd.lookup_memo(&f, Direction::Inbound), None);
        check(&mut spd, Some(0));
        spd.insert(
            0,
            policy((0, 0), (0x0a02_0005, 32), Some(17), None, Action::Discard),
        );
        check(&mut spd, Some(0));
        assert_eq!(spd.policies()[0].action, Action::Discard);
        spd.insert(
            0,
            policy((0, 0), (0x0a03_0000, 16), None, None, Action::Bypass),
        );
        check(&mut spd, Some(1));
        spd.remove(1);
        check(&mut spd, Some(1));
        spd.remove(0);
        check(&mut spd, Some(0));
        assert!(spd.set_action(0, protect(7)));
        check(&mut spd, Some(0));
        assert_eq!(spd.policies()[0].action, protect(7));
        spd.remove(0);
        check(&mut spd, None);
        spd.push(policy((0, 0), (0, 0), None, None, protect(1)));
        check(&mut spd, Some(0));
        // Another flow, then the first again.
        let g = Flow {
            dst: v4(0x0b00_0001),
            ..f
        };
        assert_eq!(spd.lookup_memo(&g, Direction::Outbound), Some(0));
        check(&mut spd, Some(0));
    }

    proptest! {
        #[test]
        fn index_agrees_with_linear_scan(
            pols in prop::collection::vec((any::<u32>(), prop::sample::select(vec![0u8, 8, 16, 24, 32]),
                                           any::<u32>(), prop::sample::select(vec![0u8, 16, 24]),
                                           prop::option::of(prop::sample::select(vec![6u8, 17])),
                                           prop::option::of((0u16..100, 0u16..100))), 1..60),
            flows in prop::collection::vec((any::<u32>(), any::<u32>(), prop::sample::select(vec![6u8, 17, 1]), 0u16..100), 1..50),
            seed_pick in any::<u8>())
        {
            let mut spd = Spd::new();
            let chosen: Vec<u32> = pols.iter().map(|p| p.0).collect();
            for (i, (r, rl, l, ll, proto, ports)) in pols.iter().enumerate() {
                let ports = ports.map(|(a, b)| (a.min(b), a.max(b)));
                spd.push(policy((*l, *ll), (*r, *rl), *proto, ports, Action::Protect(vec![SaId(i as u32)])));
            }
            for (j, (s, d, proto, dport)) in flows.iter().enumerate() {
                // Half the flows aim at a policy's remote address so buckets are hit.
                let dst = if j % 2 == 0 { chosen[(j + seed_pick as usize) % chosen.len()] } else { *d };
                let f = Flow { src: v4(*s), dst: v4(dst), proto: *proto, sport: Some(7), dport: Some(*dport) };
                let linear = spd.lookup_linear(&f, Direction::Outbound).map(|x| x.0);
                prop_assert_eq!(spd.lookup(&f, Direction::Outbound).map(|x| x.0), linear);
                // Twice: the second answer comes from the memo.
                prop_assert_eq!(spd.lookup_memo(&f, Direction::Outbound), linear);
                prop_assert_eq!(spd.lookup_memo(&f, Direction::Outbound), linear);
                let back = Flow { src: f.dst, dst: f.src, sport: f.dport, dport: f.sport, ..f };
                prop_assert_eq!(spd.lookup(&back, Direction::Inbound).map(|x| x.0),
                                spd.lookup_linear(&back, Direction::Inbound).map(|x| x.0));
            }
        }
    }
}
