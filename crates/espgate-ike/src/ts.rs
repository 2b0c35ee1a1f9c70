//! Traffic selectors for IKEv2 (RFC 7296 §2.9): configured prefixes to
//! TS payload ranges, and the responder's narrowing (intersection).

use super::wire::TrafficSelector as Ts;
use espgate_core::selector::{PortRange, Prefix, TrafficSelector};
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

/// The prefixes that cover the address range `start..=end` exactly, in
/// order (`v6`: 128-bit addresses, else 32-bit).
fn range_prefixes(v6: bool, mut start: u128, end: u128) -> Vec<Prefix> {
    let bits: u32 = if v6 { 128 } else { 32 };
    let top = if v6 { u128::MAX } else { u128::from(u32::MAX) };
    let mut out = Vec::new();
    while start <= end {
        // The largest aligned block starting at `start` that ends by `end`.
        let mut host_bits = start.trailing_zeros().min(bits);
        let last = loop {
            let host = if host_bits >= 128 {
                u128::MAX
            } else {
                (1u128 << host_bits) - 1
            };
            let last = start | host;
            if last <= end {
                break last;
            }
            host_bits -= 1;
        };
        let addr = if v6 {
            IpAddr::V6(Ipv6Addr::from(start))
        } else {
            IpAddr::V4(Ipv4Addr::from(u32::try_from(start).unwrap_or(0)))
        };
        // `host_bits` ≤ `bits`, so the length is in range.
        if let Some(p) = Prefix::new(addr, (bits - host_bits) as u8) {
            out.push(p);
        }
        if last >= top {
            break;
        }
        start = last + 1;
    }
    out
}

/// The data plane's selectors for a child SA's negotiated selectors:
/// every same-family pair of `local` (ours) × `remote` (the peer's), each
/// range split into the prefixes that cover it exactly, with the two
/// sides' protocols met and their ports. ICMP's type and code (packed in
/// the port fields) are not narrowed: its selectors take any. `None` when
/// more than `max` selectors would be needed (a range far from prefix
/// boundaries); the caller then keeps the configured selectors and says
/// so.
pub fn to_selectors(local: &[Ts], remote: &[Ts], max: usize) -> Option<Vec<TrafficSelector>> {
    let side = |t: &Ts| {
        let (v6, p, (sp, ep), (s, e)) = range(t)?;
        Some((
            v6,
            p,
            PortRange { lo: sp, hi: ep },
            range_prefixes(v6, s, e),
        ))
    };
    let locals: Vec<_> = local.iter().filter_map(side).collect();
    let remotes: Vec<_> = remote.iter().filter_map(side).collect();
    let mut out: Vec<TrafficSelector> = Vec::new();
    for (lv6, lp, lports, lpre) in &locals {
        for (rv6, rp, rports, rpre) in &remotes {
            if lv6 != rv6 {
                continue;
            }
            let Some(p) = proto_meet(*lp, *rp) else {
                continue;
            };
            let icmp = matches!(p, 1 | 58);
            let ports = |r: PortRange| if icmp { PortRange::ANY } else { r };
            for l in lpre {
                for r in rpre {
                    let sel = TrafficSelector {
                        local: *l,
                        remote: *r,
                        proto: (p != 0).then_some(p),
                        local_ports: ports(*lports),
                        remote_ports: ports(*rports),
                    };
                    if !out.contains(&sel) {
                        if out.len() == max {
                            return None;
                        }
                        out.push(sel);
                    }
                }
            }
        }
    }
    Some(out)
}

/// True when two selector lists hold the same selectors, in any order.
pub fn same(a: &[Ts], b: &[Ts]) -> bool {
    espgate_core::selector::same_set(a, b)
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

    #[test]
    fn ranges_split_into_covering_prefixes() {
        let v4 = |a: &str| u128::from(u32::from(a.parse::<Ipv4Addr>().unwrap()));
        let show = |v: Vec<Prefix>| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(
            show(range_prefixes(false, v4("10.1.0.0"), v4("10.1.255.255"))),
            ["10.1.0.0/16"]
        );
        assert_eq!(
            show(range_prefixes(false, v4("10.0.0.1"), v4("10.0.0.6"))),
            ["10.0.0.1/32", "10.0.0.2/31", "10.0.0.4/31", "10.0.0.6/32"]
        );
        assert_eq!(
            show(range_prefixes(false, 0, u128::from(u32::MAX))),
            ["0.0.0.0/0"]
        );
        assert_eq!(show(range_prefixes(true, 0, u128::MAX)), ["::/0"]);
        assert_eq!(
            show(range_prefixes(true, 1, u128::MAX)).len(),
            128,
            "::1 to the end takes one prefix per bit"
        );
        // Every address of a random-looking range is covered once.
        let (s, e) = (v4("10.0.3.7"), v4("10.0.9.200"));
        let got = range_prefixes(false, s, e);
        let mut next = s;
        for p in &got {
            assert_eq!(v4(&p.addr().to_string()), next, "{got:?}");
            next += 1u128 << (32 - u32::from(p.len()));
        }
        assert_eq!(next, e + 1);
    }

    #[test]
    fn negotiated_selectors_become_the_data_planes() {
        let local = vec![
            from_prefix(pfx("10.1.2.0/24"), 0),
            from_prefix(pfx("fd01::/64"), 0),
        ];
        let mut web = from_prefix(pfx("10.2.0.0/16"), 6);
        if let Ts::Ipv4 {
            start_port,
            end_port,
            ..
        } = &mut web
        {
            (*start_port, *end_port) = (443, 443);
        }
        let sels = to_selectors(&local, std::slice::from_ref(&web), 16).unwrap();
        assert_eq!(sels.len(), 1, "the IPv6 local side has no IPv6 partner");
        let s = sels[0];
        assert_eq!(s.local, pfx("10.1.2.0/24"));
        assert_eq!(s.remote, pfx("10.2.0.0/16"));
        assert_eq!(s.proto, Some(6), "protocols meet");
        assert!(s.local_ports.is_any());
        assert_eq!((s.remote_ports.lo, s.remote_ports.hi), (443, 443));
        // A disjoint protocol pair gives nothing.
        let udp = vec![from_prefix(pfx("10.1.2.0/24"), 17)];
        assert_eq!(
            to_selectors(&udp, std::slice::from_ref(&web), 16).unwrap(),
            []
        );
        // Too many prefixes: refused, not truncated.
        let odd = Ts::Ipv4 {
            ip_protocol: 0,
            start_port: 0,
            end_port: 65535,
            start: "10.0.0.1".parse().unwrap(),
            end: "10.0.255.254".parse().unwrap(),
        };
        assert!(to_selectors(std::slice::from_ref(&odd), std::slice::from_ref(&web), 16).is_none());
        assert_eq!(to_selectors(&[odd], &[web], 64).unwrap().len(), 30);
        // The configured selectors come back as they were.
        let conf = [from_prefix(pfx("10.1.0.0/16"), 0)];
        let back = to_selectors(&conf, &[from_prefix(pfx("10.2.0.0/16"), 0)], 16).unwrap();
        assert_eq!(
            back,
            [TrafficSelector::between(
                pfx("10.1.0.0/16"),
                pfx("10.2.0.0/16")
            )]
        );
    }
}
