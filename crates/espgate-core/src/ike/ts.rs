//! Traffic selectors for IKEv2 (RFC 7296 §2.9): configured prefixes to
//! TS payload ranges, and the responder's narrowing (intersection).

use super::wire::TrafficSelector as Ts;
use crate::selector::Prefix;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The range TS of a prefix with an IP protocol (0 = any) and all ports.
pub fn from_prefix(p: Prefix, ip_protocol: u8) -> Ts {
    match p.addr() {
        IpAddr::V4(a) => {
            let start = u32::from(a);
            let host = if p.len() >= 32 {
                0
            } else {
                u32::MAX >> p.len()
            };
            Ts::Ipv4 {
                ip_protocol,
                start_port: 0,
                end_port: 65535,
                start: a,
                end: Ipv4Addr::from(start | host),
            }
        }
        IpAddr::V6(a) => {
            let start = u128::from(a);
            let host = if p.len() >= 128 {
                0
            } else {
                u128::MAX >> p.len()
            };
            Ts::Ipv6 {
                ip_protocol,
                start_port: 0,
                end_port: 65535,
                start: a,
                end: Ipv6Addr::from(start | host),
            }
        }
    }
}

fn proto_meet(a: u8, b: u8) -> Option<u8> {
    match (a, b) {
        (0, x) | (x, 0) => Some(x),
        (x, y) if x == y => Some(x),
        _ => None,
    }
}

/// The intersection of two selectors, if not empty.
pub fn intersect(a: &Ts, b: &Ts) -> Option<Ts> {
    match (a, b) {
        (
            Ts::Ipv4 {
                ip_protocol: pa,
                start_port: spa,
                end_port: epa,
                start: sa,
                end: ea,
            },
            Ts::Ipv4 {
                ip_protocol: pb,
                start_port: spb,
                end_port: epb,
                start: sb,
                end: eb,
            },
        ) => {
            let (s, e) = ((*sa).max(*sb), (*ea).min(*eb));
            let (sp, ep) = ((*spa).max(*spb), (*epa).min(*epb));
            (s <= e && sp <= ep).then_some(())?;
            Some(Ts::Ipv4 {
                ip_protocol: proto_meet(*pa, *pb)?,
                start_port: sp,
                end_port: ep,
                start: s,
                end: e,
            })
        }
        (
            Ts::Ipv6 {
                ip_protocol: pa,
                start_port: spa,
                end_port: epa,
                start: sa,
                end: ea,
            },
            Ts::Ipv6 {
                ip_protocol: pb,
                start_port: spb,
                end_port: epb,
                start: sb,
                end: eb,
            },
        ) => {
            let (s, e) = ((*sa).max(*sb), (*ea).min(*eb));
            let (sp, ep) = ((*spa).max(*spb), (*epa).min(*epb));
            (s <= e && sp <= ep).then_some(())?;
            Some(Ts::Ipv6 {
                ip_protocol: proto_meet(*pa, *pb)?,
                start_port: sp,
                end_port: ep,
                start: s,
                end: e,
            })
        }
        _ => None,
    }
}

/// Narrowing: every non-empty intersection of an offered selector with
/// one of ours, without duplicates. Empty means TS_UNACCEPTABLE.
pub fn narrow(offered: &[Ts], ours: &[Ts]) -> Vec<Ts> {
    let mut out: Vec<Ts> = Vec::new();
    for o in offered {
        for c in ours {
            if let Some(x) = intersect(o, c) {
                if !out.contains(&x) {
                    out.push(x);
                }
            }
        }
    }
    out
}

/// True when every selector of `inner` lies within one of `outer` (an
/// initiator checks that the responder only narrowed what it proposed).
pub fn covered(inner: &[Ts], outer: &[Ts]) -> bool {
    inner
        .iter()
        .all(|i| outer.iter().any(|o| intersect(i, o).as_ref() == Some(i)))
}

/// Human-readable form (`10.1.0.0-10.1.255.255`, with `[proto/ports]`
/// when restricted).
pub fn display(ts: &Ts) -> String {
    let (p, sp, ep, s, e) = match ts {
        Ts::Ipv4 {
            ip_protocol,
            start_port,
            end_port,
            start,
            end,
        } => (
            *ip_protocol,
            *start_port,
            *end_port,
            start.to_string(),
            end.to_string(),
        ),
        Ts::Ipv6 {
            ip_protocol,
            start_port,
            end_port,
            start,
            end,
        } => (
            *ip_protocol,
            *start_port,
            *end_port,
            start.to_string(),
            end.to_string(),
        ),
        Ts::Other { ts_type, .. } => return format!("ts-type-{ts_type}"),
    };
    let mut out = if s == e { s } else { format!("{s}-{e}") };
    if p != 0 || sp != 0 || ep != 65535 {
        out.push_str(&format!("[{p}/{sp}-{ep}]"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pfx(s: &str) -> Prefix {
        let (a, l) = s.split_once('/').unwrap();
        Prefix::new(a.parse().unwrap(), l.parse().unwrap()).unwrap()
    }

    #[test]
    fn prefixes_become_ranges() {
        assert_eq!(
            display(&from_prefix(pfx("10.1.0.0/16"), 0)),
            "10.1.0.0-10.1.255.255"
        );
        assert_eq!(
            display(&from_prefix(pfx("10.1.2.3/32"), 6)),
            "10.1.2.3[6/0-65535]"
        );
        assert_eq!(
            display(&from_prefix(pfx("0.0.0.0/0"), 0)),
            "0.0.0.0-255.255.255.255"
        );
        assert_eq!(
            display(&from_prefix(pfx("fd00::/64"), 0)),
            "fd00::-fd00::ffff:ffff:ffff:ffff"
        );
    }

    #[test]
    fn narrowing_intersects_and_refuses_disjoint() {
        let wide = vec![from_prefix(pfx("10.0.0.0/8"), 0)];
        let ours = vec![from_prefix(pfx("10.1.0.0/16"), 0)];
        assert_eq!(narrow(&wide, &ours), ours);
        let other = vec![from_prefix(pfx("192.168.0.0/16"), 0)];
        assert!(narrow(&other, &ours).is_empty());
        let tcp = vec![from_prefix(pfx("10.1.2.0/24"), 6)];
        assert_eq!(narrow(&ours, &tcp), tcp);
        let udp = vec![from_prefix(pfx("10.1.2.0/24"), 17)];
        assert!(narrow(&tcp, &udp).is_empty());
        let v6 = vec![from_prefix(pfx("fd00::/8"), 0)];
        assert!(narrow(&v6, &ours).is_empty(), "families never meet");
        assert!(covered(&tcp, &wide));
        assert!(!covered(&wide, &tcp));
    }
}
