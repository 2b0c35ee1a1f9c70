//! Traffic selectors for IKEv2 (RFC 7296 §2.9): configured prefixes to
//! TS payload ranges, and the responder's narrowing (intersection).

use super::wire::TrafficSelector as Ts;
use espgate_core::selector::Prefix;
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

/// A selector as numbers: (IPv6?, protocol, ports, addresses).
type Range = (bool, u8, (u16, u16), (u128, u128));

fn range(t: &Ts) -> Option<Range> {
    Some(match t {
        Ts::Ipv4 {
            ip_protocol,
            start_port,
            end_port,
            start,
            end,
        } => (
            false,
            *ip_protocol,
            (*start_port, *end_port),
            (u32::from(*start).into(), u32::from(*end).into()),
        ),
        Ts::Ipv6 {
            ip_protocol,
            start_port,
            end_port,
            start,
            end,
        } => (
            true,
            *ip_protocol,
            (*start_port, *end_port),
            ((*start).into(), (*end).into()),
        ),
        Ts::Other { .. } => return None,
    })
}

/// The intersection of two selectors, if not empty.
pub fn intersect(a: &Ts, b: &Ts) -> Option<Ts> {
    let (v6, pa, (spa, epa), (sa, ea)) = range(a)?;
    let (v6b, pb, (spb, epb), (sb, eb)) = range(b)?;
    if v6 != v6b {
        return None;
    }
    let (start, end) = (sa.max(sb), ea.min(eb));
    let (start_port, end_port) = (spa.max(spb), epa.min(epb));
    if start > end || start_port > end_port {
        return None;
    }
    let ip_protocol = proto_meet(pa, pb)?;
    Some(if v6 {
        Ts::Ipv6 {
            ip_protocol,
            start_port,
            end_port,
            start: Ipv6Addr::from(start),
            end: Ipv6Addr::from(end),
        }
    } else {
        Ts::Ipv4 {
            ip_protocol,
            start_port,
            end_port,
            start: Ipv4Addr::from(u32::try_from(start).ok()?),
            end: Ipv4Addr::from(u32::try_from(end).ok()?),
        }
    })
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
    let Some((v6, p, (sp, ep), (s, e))) = range(ts) else {
        let t = match ts {
            Ts::Other { ts_type, .. } => *ts_type,
            _ => 0,
        };
        return format!("ts-type-{t}");
    };
    let addr = |x: u128| {
        if v6 {
            Ipv6Addr::from(x).to_string()
        } else {
            Ipv4Addr::from(u32::try_from(x).unwrap_or(0)).to_string()
        }
    };
    let (s, e) = (addr(s), addr(e));
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
