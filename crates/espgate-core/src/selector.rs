//! Traffic selectors (RFC 4301 §4.4.1): address prefixes, protocol, ports.

use crate::wire::flow::Flow;
use core::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An address prefix such as `10.0.0.0/8` or `2001:db8::/32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    addr: IpAddr,
    len: u8,
}

impl Prefix {
    /// Builds a prefix, masking host bits; `None` if `len` is too long.
    pub fn new(addr: IpAddr, len: u8) -> Option<Prefix> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (len <= max).then(|| Prefix {
            addr: mask(addr, len),
            len,
        })
    }

    /// A host prefix (/32 or /128).
    pub fn host(addr: IpAddr) -> Prefix {
        let len = if addr.is_ipv4() { 32 } else { 128 };
        Prefix { addr, len }
    }

    /// Network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// Prefix length.
    pub fn len(&self) -> u8 {
        self.len
    }

    /// True for a zero-length prefix (matches the whole family).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when `a` is inside the prefix (same family only).
    pub fn contains(&self, a: IpAddr) -> bool {
        a.is_ipv4() == self.addr.is_ipv4() && mask(a, self.len) == self.addr
    }
}

/// Clears the host bits of `a` beyond `len`.
pub fn mask(a: IpAddr, len: u8) -> IpAddr {
    match a {
        IpAddr::V4(v) => {
            let m = if len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(len.min(32)))
            };
            IpAddr::V4((u32::from(v) & m).into())
        }
        IpAddr::V6(v) => {
            let m = if len == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(len.min(128)))
            };
            IpAddr::V6((u128::from(v) & m).into())
        }
    }
}

impl FromStr for Prefix {
    type Err = String;
    fn from_str(s: &str) -> Result<Prefix, String> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("'{a}' is not an IP address"))?;
        match l {
            None => Ok(Prefix::host(addr)),
            Some(l) => {
                let len: u8 = l.parse().map_err(|_| format!("bad prefix length '{l}'"))?;
                Prefix::new(addr, len)
                    .ok_or_else(|| format!("prefix length {len} too long for {addr}"))
            }
        }
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// An inclusive port range; `0..=65535` is ANY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// Lowest port.
    pub lo: u16,
    /// Highest port.
    pub hi: u16,
}

impl PortRange {
    /// Every port, including OPAQUE.
    pub const ANY: PortRange = PortRange {
        lo: 0,
        hi: u16::MAX,
    };

    /// True for ANY.
    pub fn is_any(&self) -> bool {
        *self == PortRange::ANY
    }

    /// Matches a port; an OPAQUE port (`None`) only matches ANY.
    pub fn matches(&self, p: Option<u16>) -> bool {
        match p {
            Some(p) => self.lo <= p && p <= self.hi,
            None => self.is_any(),
        }
    }
}

impl Default for PortRange {
    fn default() -> Self {
        PortRange::ANY
    }
}

/// One selector, from this gateway's point of view: `local` is the
/// protected side behind us, `remote` the side behind the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TrafficSelector {
    /// Our side.
    pub local: Prefix,
    /// The peer's side.
    pub remote: Prefix,
    /// IP protocol, `None` for any.
    pub proto: Option<u8>,
    /// Ports (or ICMP type) on our side.
    pub local_ports: PortRange,
    /// Ports (or ICMP code) on the peer's side.
    pub remote_ports: PortRange,
}

impl TrafficSelector {
    /// Any traffic between two prefixes.
    pub fn between(local: Prefix, remote: Prefix) -> TrafficSelector {
        TrafficSelector {
            local,
            remote,
            proto: None,
            local_ports: PortRange::ANY,
            remote_ports: PortRange::ANY,
        }
    }

    /// Matches a packet we are sending (source is local).
    pub fn matches_outbound(&self, f: &Flow) -> bool {
        self.local.contains(f.src)
            && self.remote.contains(f.dst)
            && self.proto.is_none_or(|p| p == f.proto)
            && self.local_ports.matches(f.sport)
            && self.remote_ports.matches(f.dport)
    }

    /// Matches a packet we received (source is remote).
    pub fn matches_inbound(&self, f: &Flow) -> bool {
        self.remote.contains(f.src)
            && self.local.contains(f.dst)
            && self.proto.is_none_or(|p| p == f.proto)
            && self.remote_ports.matches(f.sport)
            && self.local_ports.matches(f.dport)
    }
}

/// True when two lists of selectors (in the data plane's form or IKE's)
/// hold the same items, in any order.
pub fn same_set<T: PartialEq>(a: &[T], b: &[T]) -> bool {
    a.iter().all(|x| b.contains(x)) && b.iter().all(|x| a.contains(x))
}

/// `10.1.0.0/16 10.2.0.0/16 any 0-65535 0-65535`: our prefix, the peer's,
/// the protocol (`any` or a number) and the two port ranges. The form a
/// cluster node shares a negotiated SA's selectors in.
impl fmt::Display for TrafficSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ", self.local, self.remote)?;
        match self.proto {
            Some(p) => write!(f, "{p}")?,
            None => f.write_str("any")?,
        }
        let (l, r) = (self.local_ports, self.remote_ports);
        write!(f, " {}-{} {}-{}", l.lo, l.hi, r.lo, r.hi)
    }
}

impl FromStr for TrafficSelector {
    type Err = String;
    fn from_str(s: &str) -> Result<TrafficSelector, String> {
        let parts: Vec<&str> = s.split_whitespace().collect();
        let [local, remote, proto, lports, rports] = parts[..] else {
            return Err(format!(
                "'{s}': a selector is 'LOCAL REMOTE PROTO LPORTS RPORTS' \
                 (e.g. '10.1.0.0/16 10.2.0.0/16 any 0-65535 0-65535')"
            ));
        };
        let ports = |r: &str| -> Result<PortRange, String> {
            let (lo, hi) = r
                .split_once('-')
                .ok_or_else(|| format!("'{r}' is not a port range LO-HI"))?;
            let n = |x: &str| x.parse::<u16>().map_err(|_| format!("'{x}' is not a port"));
            let (lo, hi) = (n(lo)?, n(hi)?);
            if lo > hi {
                return Err(format!("port range '{r}' is empty"));
            }
            Ok(PortRange { lo, hi })
        };
        let (local, remote): (Prefix, Prefix) = (local.parse()?, remote.parse()?);
        if local.addr().is_ipv4() != remote.addr().is_ipv4() {
            return Err(format!("'{s}': the two prefixes are of different families"));
        }
        Ok(TrafficSelector {
            local,
            remote,
            proto: match proto {
                "any" => None,
                p => Some(
                    p.parse()
                        .map_err(|_| format!("'{p}' is not an IP protocol"))?,
                ),
            },
            local_ports: ports(lports)?,
            remote_ports: ports(rports)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        let p: Prefix = "10.1.2.3/8".parse().unwrap();
        assert_eq!(p.to_string(), "10.0.0.0/8");
        assert!(p.contains("10.200.0.1".parse().unwrap()));
        assert!(!p.contains("11.0.0.1".parse().unwrap()));
        assert!(!p.contains("::1".parse().unwrap()));
        let any6: Prefix = "::/0".parse().unwrap();
        assert!(any6.contains("2001:db8::1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Prefix>().is_err());
        assert!("nope/3".parse::<Prefix>().is_err());
    }

    #[test]
    fn selector_directions_and_opaque_ports() {
        let mut ts = TrafficSelector::between(
            "10.1.0.0/16".parse().unwrap(),
            "10.2.0.0/16".parse().unwrap(),
        );
        ts.proto = Some(6);
        ts.remote_ports = PortRange { lo: 80, hi: 80 };
        let f = Flow {
            src: "10.1.0.5".parse().unwrap(),
            dst: "10.2.0.9".parse().unwrap(),
            proto: 6,
            sport: Some(40000),
            dport: Some(80),
        };
        assert!(ts.matches_outbound(&f));
        assert!(!ts.matches_inbound(&f));
        let back = Flow {
            src: f.dst,
            dst: f.src,
            sport: f.dport,
            dport: f.sport,
            ..f
        };
        assert!(ts.matches_inbound(&back));
        let opaque = Flow { dport: None, ..f };
        assert!(!ts.matches_outbound(&opaque));
    }

    #[test]
    fn selectors_print_and_parse_back() {
        let mut ts = TrafficSelector::between(
            "10.1.0.0/16".parse().unwrap(),
            "10.2.0.0/24".parse().unwrap(),
        );
        assert_eq!(
            ts.to_string(),
            "10.1.0.0/16 10.2.0.0/24 any 0-65535 0-65535"
        );
        assert_eq!(ts.to_string().parse::<TrafficSelector>().unwrap(), ts);
        ts.proto = Some(17);
        ts.remote_ports = PortRange { lo: 53, hi: 53 };
        assert_eq!(ts.to_string().parse::<TrafficSelector>().unwrap(), ts);
        for bad in [
            "",
            "10.1.0.0/16 10.2.0.0/16 any 0-65535",
            "10.1.0.0/16 fd00::/8 any 0-65535 0-65535",
            "10.1.0.0/16 10.2.0.0/16 tcp 0-65535 0-65535",
            "10.1.0.0/16 10.2.0.0/16 6 9-1 0-65535",
            "10.1.0.0/16 10.2.0.0/16 6 0-70000 0-65535",
        ] {
            assert!(bad.parse::<TrafficSelector>().is_err(), "{bad}");
        }
    }
}
