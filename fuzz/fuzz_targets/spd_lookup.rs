//! The indexed SPD lookup against linear scans.
//!
//! A fuzz-chosen sequence of `push` / `insert` / `remove` / lookup operations
//! runs against an `Spd` and a plain `Vec<Policy>` model. Asserts after every
//! step that the SPD holds the model's policies in order, and for every
//! lookup (both directions, whatever the op asked for) that `lookup` ==
//! `lookup_linear` == the first matching policy of the model, and that
//! `lookup_memo` gives the same position. `Again` looks the previous flow
//! up once more, after whatever changed in between (new actions too), so
//! that the memo is asked across every kind of change.
//!
//! Addresses come from a few small networks (and sometimes from the
//! policies themselves), so prefixes of many lengths overlap.
#![no_main]

use arbitrary::Arbitrary;
use espgate_core::sad::SaId;
use espgate_core::selector::{PortRange, Prefix, TrafficSelector};
use espgate_core::spd::{Action, Direction, Policy, Spd};
use espgate_core::wire::flow::Flow;
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

#[derive(Arbitrary, Debug, Clone, Copy)]
struct A {
    v6: bool,
    net: u8,
    host: u32,
}

impl A {
    fn ip(self) -> IpAddr {
        let host = if self.net & 0x80 != 0 {
            self.host
        } else {
            self.host & 0xff
        };
        if self.v6 {
            let bases: [u128; 4] = [
                0x2001_0db8_0001_0000_0000_0000_0000_0000,
                0x2001_0db8_0002_0000_0000_0000_0000_0000,
                0xfe80_0000_0000_0000_0000_0000_0000_0000,
                0,
            ];
            let hi = u128::from(self.net & 0x70) << 100;
            IpAddr::V6(Ipv6Addr::from(
                bases[usize::from(self.net & 3)] ^ hi | u128::from(host),
            ))
        } else {
            let bases: [u32; 4] = [0x0a01_0000, 0x0a02_0000, 0xc0a8_0000, 0];
            let hi = u32::from(self.net & 0x70) << 20;
            IpAddr::V4(Ipv4Addr::from(bases[usize::from(self.net & 3)] ^ hi | host))
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Ports {
    any: bool,
    lo: u16,
    hi: u16,
}

impl Ports {
    fn range(self) -> PortRange {
        if self.any {
            PortRange::ANY
        } else {
            // lo > hi is an empty range; keep it, the index must agree anyway.
            PortRange {
                lo: self.lo,
                hi: self.hi,
            }
        }
    }
}

fn protocol(b: u8) -> u8 {
    match b % 8 {
        0 => 6,
        1 => 17,
        2 => 1,
        3 => 58,
        4 => 50,
        _ => b,
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct P {
    local: A,
    local_len: u8,
    remote: A,
    remote_len: u8,
    proto: Option<u8>,
    local_ports: Ports,
    remote_ports: Ports,
    action: u8,
}

impl P {
    fn policy(self) -> Policy {
        let prefix = |a: A, len: u8| {
            let ip = a.ip();
            let max = if ip.is_ipv4() { 33 } else { 129 };
            Prefix::new(ip, len % max).expect("length in range")
        };
        Policy {
            selector: TrafficSelector {
                local: prefix(self.local, self.local_len),
                remote: prefix(self.remote, self.remote_len),
                proto: self.proto.map(protocol),
                local_ports: self.local_ports.range(),
                remote_ports: self.remote_ports.range(),
            },
            action: match self.action % 3 {
                0 => Action::Bypass,
                1 => Action::Discard,
                _ => Action::Protect(vec![SaId(u32::from(self.action))]),
            },
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Addr {
    Free(A),
    /// An address inside policy `idx`'s local or remote prefix.
    OfPolicy {
        idx: u8,
        remote: bool,
        tweak: u32,
    },
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct F {
    src: Addr,
    dst: Addr,
    proto: u8,
    sport: Option<u16>,
    dport: Option<u16>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Push(P),
    Insert(u8, P),
    Remove(u8),
    SetAction(u8, u8),
    Lookup(F),
    Again,
}

fn resolve(a: Addr, model: &[Policy]) -> IpAddr {
    match a {
        Addr::Free(a) => a.ip(),
        Addr::OfPolicy { idx, remote, tweak } => {
            if model.is_empty() {
                return IpAddr::V4(Ipv4Addr::from(tweak));
            }
            let s = &model[usize::from(idx) % model.len()].selector;
            let p = if remote { s.remote } else { s.local };
            // Flip only host bits so the address stays inside the prefix
            // (unless the tweak's top bit asks to step just outside it).
            match p.addr() {
                IpAddr::V4(v) => {
                    let host = if p.len() >= 32 {
                        0
                    } else {
                        u32::MAX >> p.len()
                    };
                    let mut x = u32::from(v) ^ (tweak & host);
                    if tweak >> 31 == 1 && !p.is_empty() {
                        x ^= 1 << (32 - u32::from(p.len()));
                    }
                    IpAddr::V4(x.into())
                }
                IpAddr::V6(v) => {
                    let host = if p.len() >= 128 {
                        0
                    } else {
                        u128::MAX >> p.len()
                    };
                    let t = u128::from(tweak) | (u128::from(tweak) << 64);
                    let mut x = u128::from(v) ^ (t & host);
                    if tweak >> 31 == 1 && !p.is_empty() {
                        x ^= 1 << (128 - u32::from(p.len()));
                    }
                    IpAddr::V6(x.into())
                }
            }
        }
    }
}

fn check(spd: &mut Spd, model: &[Policy], flow: &Flow) {
    for dir in [Direction::Outbound, Direction::Inbound] {
        let fast = spd.lookup(flow, dir);
        let linear = spd.lookup_linear(flow, dir);
        let reference = model
            .iter()
            .position(|p| match dir {
                Direction::Outbound => p.selector.matches_outbound(flow),
                Direction::Inbound => p.selector.matches_inbound(flow),
            })
            .map(|i| (i, &model[i]));
        assert_eq!(
            linear, reference,
            "lookup_linear vs model, {dir:?} {flow:?}"
        );
        assert_eq!(
            fast, linear,
            "indexed lookup vs linear scan, {dir:?} {flow:?}"
        );
        let want = linear.map(|(i, _)| i);
        for _ in 0..2 {
            assert_eq!(
                spd.lookup_memo(flow, dir),
                want,
                "memo vs linear scan, {dir:?} {flow:?}"
            );
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut spd = Spd::new();
    let mut model: Vec<Policy> = Vec::new();
    let mut last: Option<Flow> = None;
    for op in ops.into_iter().take(256) {
        match op {
            Op::Push(p) => {
                let p = p.policy();
                model.push(p.clone());
                spd.push(p);
            }
            Op::Insert(pos, p) => {
                let p = p.policy();
                let pos = usize::from(pos);
                model.insert(pos.min(model.len()), p.clone());
                spd.insert(pos, p);
            }
            Op::Remove(pos) => {
                let pos = usize::from(pos);
                let want = (pos < model.len()).then(|| model.remove(pos));
                assert_eq!(spd.remove(pos), want);
            }
            Op::SetAction(pos, a) => {
                let pos = usize::from(pos);
                let action = match a % 3 {
                    0 => Action::Bypass,
                    1 => Action::Discard,
                    _ => Action::Protect(vec![SaId(u32::from(a))]),
                };
                if let Some(p) = model.get_mut(pos) {
                    p.action = action.clone();
                }
                assert_eq!(spd.set_action(pos, action), pos < model.len());
            }
            Op::Lookup(_) | Op::Again => {
                let flow = match op {
                    Op::Lookup(f) => Flow {
                        src: resolve(f.src, &model),
                        dst: resolve(f.dst, &model),
                        proto: protocol(f.proto),
                        sport: f.sport,
                        dport: f.dport,
                    },
                    _ => match last {
                        Some(f) => f,
                        None => continue,
                    },
                };
                last = Some(flow);
                check(&mut spd, &model, &flow);
                // The same flow reversed, which flips which address is remote.
                let back = Flow {
                    src: flow.dst,
                    dst: flow.src,
                    sport: flow.dport,
                    dport: flow.sport,
                    ..flow
                };
                check(&mut spd, &model, &back);
            }
        }
        assert_eq!(spd.len(), model.len());
        assert!(
            spd.policies() == &model[..],
            "SPD order differs from the model"
        );
    }
});
