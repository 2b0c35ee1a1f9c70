//! Link, address, route and policy-rule configuration over rtnetlink, and
//! [`NetChanges`], the journal that undoes what the daemon changed.
//!
//! [`Netlink`] is a synchronous `NETLINK_ROUTE` socket: one request, wait
//! for the kernel's ack (bounded by a 5 s receive timeout), typed
//! [`NetError`] on failure, with the kernel's extended-ack text when it
//! sends one. A netlink socket acts in the network namespace of the thread
//! that opened it, for its whole life.
//!
//! [`NetChanges`] is what the daemon should use: every change made through
//! it is recorded with what is needed to reverse it, and [`NetChanges::undo`]
//! (or dropping it) reverses them newest first, so a SIGTERM path that drops
//! it leaves the routing configuration as it found it.

use super::NetError;
use espgate_core::selector::Prefix;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLMSG_DONE, NLMSG_ERROR, NLM_F_ACK,
    NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage, AddressScope};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleFlags, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::fmt;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// The main routing table (`RT_TABLE_MAIN`).
pub const TABLE_MAIN: u32 = 254;

/// How long to wait for the kernel's answer to one request.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Upper bound on datagrams read for one request (replies here are one
/// message and an ack; this only stops a runaway loop).
const MAX_DATAGRAMS: usize = 256;
/// `nlmsghdr` length.
const NLMSG_HDRLEN: usize = 16;
/// `NLM_F_CAPPED` / `NLM_F_ACK_TLVS` on an `NLMSG_ERROR` message.
const NLM_F_CAPPED: u16 = 0x100;
const NLM_F_ACK_TLVS: u16 = 0x200;
/// `NLMSGERR_ATTR_MSG`: the extended-ack error string.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4 (`AF_INET`).
    V4,
    /// IPv6 (`AF_INET6`).
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    fn af(self) -> AddressFamily {
        match self {
            Family::V4 => AddressFamily::Inet,
            Family::V6 => AddressFamily::Inet6,
        }
    }

    fn max_len(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// What [`Netlink::link`] reports about an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// MTU (0 if the kernel did not say).
    pub mtu: u32,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
}

/// An address on an interface, e.g. `10.1.0.1/24` on `espgate0` (host bits
/// kept, unlike a [`Prefix`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IfAddr {
    /// Interface name.
    pub dev: String,
    /// The address.
    pub addr: IpAddr,
    /// Prefix length of the subnet it implies.
    pub prefix_len: u8,
}

impl IfAddr {
    /// Checks that `prefix_len` fits the family of `addr`.
    pub fn new(dev: &str, addr: IpAddr, prefix_len: u8) -> Result<IfAddr, NetError> {
        let a = IfAddr {
            dev: dev.to_owned(),
            addr,
            prefix_len,
        };
        if prefix_len > Family::of(addr).max_len() {
            return Err(NetError::new(
                format!("address {a}"),
                io::Error::new(io::ErrorKind::InvalidInput, "prefix length too long"),
            ));
        }
        Ok(a)
    }
}

impl fmt::Display for IfAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} on {}", self.addr, self.prefix_len, self.dev)
    }
}

/// A route to `dest` out of interface `dev` (no gateway: TUN is
/// point-to-point), in `table` (main if `None`), optionally with a
/// preferred source address and a metric.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteSpec {
    /// Destination prefix.
    pub dest: Prefix,
    /// Output interface name.
    pub dev: String,
    /// Routing table id; `None` is the main table.
    pub table: Option<u32>,
    /// Preferred source address (`src`), which must be local.
    pub source: Option<IpAddr>,
    /// Route metric (`metric` / priority).
    pub metric: Option<u32>,
    /// A `blackhole` route: packets to `dest` are dropped without an ICMP
    /// answer (`dev` is not used).
    pub blackhole: bool,
}

/// The metric of the blackhole twin of each tunnel route
/// ([`RouteSpec::fail_closed`]): far above the tunnel route's (0 for IPv4,
/// 1024 for IPv6), so it is used only once the tunnel route is gone.
pub const FAIL_CLOSED_METRIC: u32 = 4_000_000_000;

impl RouteSpec {
    /// A route to `dest` via `dev` in the main table.
    pub fn new(dest: Prefix, dev: &str) -> RouteSpec {
        RouteSpec {
            dest,
            dev: dev.to_owned(),
            table: None,
            source: None,
            metric: None,
            blackhole: false,
        }
    }

    /// This route's fail-closed twin: a blackhole for the same prefix in
    /// the same table at [`FAIL_CLOSED_METRIC`]. While the daemon runs, the
    /// route through the TUN wins; when the daemon dies without undoing
    /// its changes (SIGKILL, a crash), the TUN and its routes vanish with
    /// it and the blackhole stays, so traffic for the tunnel is dropped
    /// rather than sent in clear along another route, and a cluster node
    /// stays silent rather than answering with ICMP unreachable.
    pub fn fail_closed(&self) -> RouteSpec {
        RouteSpec {
            dest: self.dest,
            dev: self.dev.clone(),
            table: self.table,
            source: None,
            metric: Some(FAIL_CLOSED_METRIC),
            blackhole: true,
        }
    }

    /// In routing table `table`.
    pub fn table(mut self, table: u32) -> RouteSpec {
        self.table = Some(table);
        self
    }

    /// With preferred source address `src`.
    pub fn source(mut self, src: IpAddr) -> RouteSpec {
        self.source = Some(src);
        self
    }

    /// With metric `metric`.
    pub fn metric(mut self, metric: u32) -> RouteSpec {
        self.metric = Some(metric);
        self
    }

    fn family(&self) -> Family {
        Family::of(self.dest.addr())
    }
}

impl fmt::Display for RouteSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.blackhole {
            write!(f, "blackhole {}", self.dest)?;
        } else {
            write!(f, "{} via {}", self.dest, self.dev)?;
        }
        if let Some(t) = self.table {
            write!(f, " table {}", table_name(t))?;
        }
        if let Some(s) = self.source {
            write!(f, " src {s}")?;
        }
        if let Some(m) = self.metric {
            write!(f, " metric {m}")?;
        }
        Ok(())
    }
}

/// A policy-routing rule that sends matching packets to a table:
/// `[not] from all [fwmark M[/MASK]] lookup T [suppress_prefixlength N]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RuleSpec {
    /// IPv4 or IPv6 rule list.
    pub family: Family,
    /// Rule priority (`pref`). Give one: without it the kernel picks one,
    /// and removal matches the first rule that is otherwise equal.
    pub priority: Option<u32>,
    /// Invert the match (`not`).
    pub invert: bool,
    /// Match this firewall mark.
    pub fwmark: Option<u32>,
    /// Mask for `fwmark` (the kernel's default is all ones).
    pub fwmask: Option<u32>,
    /// Table to look up.
    pub table: u32,
    /// Ignore routes with a prefix this short or shorter from `table`.
    pub suppress_prefixlength: Option<u32>,
}

impl RuleSpec {
    /// `fwmark MARK lookup TABLE`.
    pub fn fwmark_lookup(family: Family, mark: u32, table: u32) -> RuleSpec {
        RuleSpec {
            family,
            priority: None,
            invert: false,
            fwmark: Some(mark),
            fwmask: None,
            table,
            suppress_prefixlength: None,
        }
    }

    /// `not fwmark MARK lookup TABLE`: everything *except* the gateway's own
    /// (marked) packets uses `table` — wg-quick's host-to-host rule.
    pub fn not_fwmark_lookup(family: Family, mark: u32, table: u32) -> RuleSpec {
        RuleSpec {
            invert: true,
            ..RuleSpec::fwmark_lookup(family, mark, table)
        }
    }

    /// `lookup main suppress_prefixlength 0`: use the main table except its
    /// default route; goes before a [`RuleSpec::not_fwmark_lookup`] rule so
    /// that more specific main routes (the LAN) still win.
    pub fn suppress_main(family: Family) -> RuleSpec {
        RuleSpec {
            family,
            priority: None,
            invert: false,
            fwmark: None,
            fwmask: None,
            table: TABLE_MAIN,
            suppress_prefixlength: Some(0),
        }
    }

    /// With priority `pref`.
    pub fn priority(mut self, pref: u32) -> RuleSpec {
        self.priority = Some(pref);
        self
    }
}

impl fmt::Display for RuleSpec {
    /// Like `ip rule`: `pref 100 not from all fwmark 0xca6c lookup 51820 (IPv4)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = self.priority {
            write!(f, "pref {p} ")?;
        }
        if self.invert {
            f.write_str("not ")?;
        }
        f.write_str("from all")?;
        if let Some(m) = self.fwmark {
            write!(f, " fwmark {m:#x}")?;
            if let Some(mask) = self.fwmask {
                write!(f, "/{mask:#x}")?;
            }
        }
        write!(f, " lookup {}", table_name(self.table))?;
        if let Some(n) = self.suppress_prefixlength {
            write!(f, " suppress_prefixlength {n}")?;
        }
        match self.family {
            Family::V4 => f.write_str(" (IPv4)"),
            Family::V6 => f.write_str(" (IPv6)"),
        }
    }
}

fn table_name(t: u32) -> String {
    match t {
        TABLE_MAIN => "main".into(),
        255 => "local".into(),
        253 => "default".into(),
        t => t.to_string(),
    }
}

/// A synchronous rtnetlink socket. Methods that change something are not
/// journalled; use [`NetChanges`] for changes that must be undone.
pub struct Netlink {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl fmt::Debug for Netlink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Netlink")
            .field("fd", &self.sock.as_raw_fd())
            .field("seq", &self.seq)
            .finish()
    }
}

impl Netlink {
    /// Opens a `NETLINK_ROUTE` socket in the calling thread's network
    /// namespace.
    pub fn open() -> Result<Netlink, NetError> {
        let err = |e| NetError::new("opening rtnetlink socket".into(), e);
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(err)?;
        sock.bind_auto().map_err(err)?;
        // Failures come back with the kernel's explanation (ext ack) and
        // without an echo of our whole request.
        sock.set_ext_ack(true).map_err(err)?;
        sock.set_cap_ack(true).map_err(err)?;
        set_rcv_timeout(&sock, REPLY_TIMEOUT).map_err(err)?;
        Ok(Netlink {
            sock,
            seq: 0,
            buf: Vec::with_capacity(64 * 1024),
        })
    }

    /// Looks up interface `name`: index, MTU, up or not.
    pub fn link(&mut self, name: &str) -> Result<LinkInfo, NetError> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_owned()));
        let replies = self.request(RouteNetlinkMessage::GetLink(m), 0, || {
            format!("looking up interface {name}")
        })?;
        for r in replies {
            if let RouteNetlinkMessage::NewLink(l) = r {
                let mut info = LinkInfo {
                    index: l.header.index,
                    name: name.to_owned(),
                    mtu: 0,
                    up: l.header.flags.contains(LinkFlags::Up),
                };
                for a in l.attributes {
                    match a {
                        LinkAttribute::Mtu(m) => info.mtu = m,
                        LinkAttribute::IfName(n) => info.name = n,
                        _ => {}
                    }
                }
                return Ok(info);
            }
        }
        Err(NetError::new(
            format!("looking up interface {name}"),
            io::Error::new(io::ErrorKind::InvalidData, "no link in the kernel's reply"),
        ))
    }

    /// Sets the transmit queue length of `dev` (packets the kernel queues
    /// on it; for a TUN device, packets waiting to be read).
    pub fn set_txqueuelen(&mut self, dev: &str, len: u32) -> Result<(), NetError> {
        let mut m = LinkMessage::default();
        m.header.index = self.index(dev)?;
        m.attributes.push(LinkAttribute::TxQueueLen(len));
        self.request(RouteNetlinkMessage::SetLink(m), 0, || {
            format!("setting txqueuelen {len} on {dev}")
        })
        .map(drop)
    }

    /// Removes a policy-routing rule.
    pub fn del_rule(&mut self, r: &RuleSpec) -> Result<(), NetError> {
        self.rule(r, false)
    }

    fn index(&mut self, dev: &str) -> Result<u32, NetError> {
        Ok(self.link(dev)?.index)
    }

    fn set_mtu_idx(&mut self, index: u32, dev: &str, mtu: u32) -> Result<(), NetError> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::Mtu(mtu));
        self.request(RouteNetlinkMessage::SetLink(m), 0, || {
            format!("setting MTU {mtu} on {dev}")
        })
        .map(drop)
    }

    fn set_up_idx(&mut self, index: u32, dev: &str, up: bool) -> Result<(), NetError> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.flags = if up {
            LinkFlags::Up
        } else {
            LinkFlags::empty()
        };
        m.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(m), 0, || {
            format!("setting {dev} {}", if up { "up" } else { "down" })
        })
        .map(drop)
    }

    fn address_idx(&mut self, a: &IfAddr, index: u32, add: bool) -> Result<(), NetError> {
        let fam = Family::of(a.addr);
        if a.prefix_len > fam.max_len() {
            return Err(NetError::new(
                format!("{} address {a}", if add { "adding" } else { "removing" }),
                io::Error::new(io::ErrorKind::InvalidInput, "prefix length too long"),
            ));
        }
        let mut m = AddressMessage::default();
        m.header.family = fam.af();
        m.header.prefix_len = a.prefix_len;
        m.header.index = index;
        m.header.scope = AddressScope::Universe;
        m.attributes.push(AddressAttribute::Local(a.addr));
        m.attributes.push(AddressAttribute::Address(a.addr));
        if add && fam == Family::V6 {
            // Usable at once: no duplicate detection on a point-to-point TUN.
            m.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        let (msg, flags) = if add {
            (
                RouteNetlinkMessage::NewAddress(m),
                NLM_F_CREATE | NLM_F_EXCL,
            )
        } else {
            (RouteNetlinkMessage::DelAddress(m), 0)
        };
        self.request(msg, flags, || {
            format!("{} address {a}", if add { "adding" } else { "removing" })
        })
        .map(drop)
    }

    fn route_idx(&mut self, r: &RouteSpec, index: u32, add: bool) -> Result<(), NetError> {
        let fam = r.family();
        let table = r.table.unwrap_or(TABLE_MAIN);
        let mut m = RouteMessage::default();
        m.header.address_family = fam.af();
        m.header.destination_prefix_length = r.dest.len();
        // Like iproute2: ids above 255 only fit the RTA_TABLE attribute.
        m.header.table = u8::try_from(table).unwrap_or(0);
        m.header.kind = if r.blackhole {
            RouteType::BlackHole
        } else {
            RouteType::Unicast
        };
        if add {
            m.header.protocol = RouteProtocol::Static;
            m.header.scope = match fam {
                // A gateway-less IPv4 route is on-link, as `ip route` makes it.
                Family::V4 if !r.blackhole => RouteScope::Link,
                _ => RouteScope::Universe,
            };
        } else {
            m.header.protocol = RouteProtocol::Unspec;
            // RT_SCOPE_NOWHERE is the wildcard when deleting.
            m.header.scope = RouteScope::NoWhere;
        }
        if !r.dest.is_empty() {
            m.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(
                    r.dest.addr(),
                )));
        }
        m.attributes.push(RouteAttribute::Table(table));
        if !r.blackhole {
            m.attributes.push(RouteAttribute::Oif(index));
        }
        if let Some(src) = r.source {
            m.attributes
                .push(RouteAttribute::PrefSource(RouteAddress::from(src)));
        }
        if let Some(metric) = r.metric {
            m.attributes.push(RouteAttribute::Priority(metric));
        }
        let (msg, flags) = if add {
            (RouteNetlinkMessage::NewRoute(m), NLM_F_CREATE | NLM_F_EXCL)
        } else {
            (RouteNetlinkMessage::DelRoute(m), 0)
        };
        self.request(msg, flags, || {
            format!("{} route {r}", if add { "adding" } else { "removing" })
        })
        .map(drop)
    }

    fn rule(&mut self, r: &RuleSpec, add: bool) -> Result<(), NetError> {
        let mut m = RuleMessage::default();
        m.header.family = r.family.af();
        m.header.table = u8::try_from(r.table).unwrap_or(0);
        m.header.action = RuleAction::ToTable;
        if r.invert {
            m.header.flags = RuleFlags::Invert;
        }
        if let Some(p) = r.priority {
            m.attributes.push(RuleAttribute::Priority(p));
        }
        if let Some(mark) = r.fwmark {
            m.attributes.push(RuleAttribute::FwMark(mark));
        }
        if let Some(mask) = r.fwmask {
            m.attributes.push(RuleAttribute::FwMask(mask));
        }
        m.attributes.push(RuleAttribute::Table(r.table));
        if let Some(n) = r.suppress_prefixlength {
            m.attributes.push(RuleAttribute::SuppressPrefixLen(n));
        }
        let (msg, flags) = if add {
            (RouteNetlinkMessage::NewRule(m), NLM_F_CREATE | NLM_F_EXCL)
        } else {
            (RouteNetlinkMessage::DelRule(m), 0)
        };
        self.request(msg, flags, || {
            format!("{} rule {r}", if add { "adding" } else { "removing" })
        })
        .map(drop)
    }

    /// Sends one request with `NLM_F_ACK` and collects the messages the
    /// kernel answers with, up to its ack; an error ack becomes a
    /// [`NetError`] described by `action`.
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        action: impl Fn() -> String,
    ) -> Result<Vec<RouteNetlinkMessage>, NetError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut hdr = NetlinkHeader::default();
        hdr.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        hdr.sequence_number = seq;
        let mut nl = NetlinkMessage::new(hdr, NetlinkPayload::InnerMessage(msg));
        nl.finalize();
        let mut out = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut out);
        let kernel = SocketAddr::new(0, 0);
        self.sock
            .send_to(&out, &kernel, 0)
            .map_err(|e| NetError::new(action(), e))?;

        let mut replies = Vec::new();
        for _ in 0..MAX_DATAGRAMS {
            self.buf.clear();
            let n = match self.sock.recv(&mut self.buf, 0) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(NetError::new(
                        action(),
                        io::Error::new(io::ErrorKind::TimedOut, "no answer from the kernel"),
                    ))
                }
                Err(e) => return Err(NetError::new(action(), e)),
            };
            let data = &self.buf[..n.min(self.buf.len())];
            match parse_datagram(data, seq, &mut replies) {
                Ok(Some(Ok(()))) => return Ok(replies),
                Ok(Some(Err((errno, detail)))) => {
                    return Err(NetError::new(action(), io::Error::from_raw_os_error(errno))
                        .with_detail(detail))
                }
                Ok(None) => {}
                Err(e) => return Err(NetError::new(action(), e)),
            }
        }
        Err(NetError::new(
            action(),
            io::Error::new(io::ErrorKind::InvalidData, "no ack from the kernel"),
        ))
    }
}

/// What one netlink exchange ended with: `Ok` for an ack or `NLMSG_DONE`,
/// `Err((errno, ext-ack text))` for a refusal.
type Outcome = Result<(), (i32, Option<String>)>;

/// Walks the netlink messages of one datagram: messages for `seq` are
/// pushed to `replies`; returns the outcome once the ack (or an error, or
/// `NLMSG_DONE`) for `seq` is seen, `None` if more is to come.
fn parse_datagram(
    data: &[u8],
    seq: u32,
    replies: &mut Vec<RouteNetlinkMessage>,
) -> io::Result<Option<Outcome>> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("netlink: {why}"));
    let mut off = 0;
    while off + NLMSG_HDRLEN <= data.len() {
        let u32_at = |i: usize| u32::from_ne_bytes(data[i..i + 4].try_into().expect("4 bytes"));
        let u16_at = |i: usize| u16::from_ne_bytes(data[i..i + 2].try_into().expect("2 bytes"));
        let len = u32_at(off) as usize;
        if len < NLMSG_HDRLEN || off + len > data.len() {
            return Err(bad("truncated message"));
        }
        let kind = u16_at(off + 4);
        let msg_flags = u16_at(off + 6);
        let msg_seq = u32_at(off + 8);
        let msg = &data[off..off + len];
        off += align4(len);
        if msg_seq != seq {
            continue; // a late answer to an earlier request
        }
        match kind {
            NLMSG_ERROR => {
                if msg.len() < NLMSG_HDRLEN + 4 {
                    return Err(bad("short error message"));
                }
                let code = i32::from_ne_bytes(msg[16..20].try_into().expect("4 bytes"));
                if code == 0 {
                    return Ok(Some(Ok(())));
                }
                let detail = ext_ack_message(msg, msg_flags);
                return Ok(Some(Err((code.saturating_neg(), detail))));
            }
            NLMSG_DONE => return Ok(Some(Ok(()))),
            _ => {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(msg)
                    .map_err(|e| bad(&e.to_string()))?;
                if let NetlinkPayload::InnerMessage(inner) = m.payload {
                    replies.push(inner);
                }
            }
        }
    }
    Ok(None)
}

/// The `NLMSGERR_ATTR_MSG` string of an `NLMSG_ERROR` message, if any:
/// after the header and error code come the original request's header
/// (only the header when `NLM_F_CAPPED`), then attributes when
/// `NLM_F_ACK_TLVS`.
fn ext_ack_message(msg: &[u8], flags: u16) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let orig = msg.get(20..)?;
    let orig_len = if flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        u32::from_ne_bytes(orig.get(..4)?.try_into().ok()?) as usize
    };
    let mut tlvs = orig.get(align4(orig_len)..)?;
    while tlvs.len() >= 4 {
        let len = u16::from_ne_bytes([tlvs[0], tlvs[1]]) as usize;
        let kind = u16::from_ne_bytes([tlvs[2], tlvs[3]]) & 0x3fff;
        if len < 4 || len > tlvs.len() {
            return None;
        }
        if kind == NLMSGERR_ATTR_MSG {
            let s = &tlvs[4..len];
            let s = s.split(|&b| b == 0).next().unwrap_or(s);
            return Some(String::from_utf8_lossy(s).into_owned());
        }
        tlvs = tlvs.get(align4(len)..)?;
    }
    None
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn set_rcv_timeout(sock: &Socket, t: Duration) -> io::Result<()> {
    use rustix::net::sockopt::{set_socket_timeout, Timeout};
    Ok(set_socket_timeout(sock, Timeout::Recv, Some(t))?)
}

/// One recorded change and what undoing it needs.
#[derive(Debug, Clone)]
enum Change {
    Mtu {
        index: u32,
        dev: String,
        old: u32,
    },
    Up {
        index: u32,
        dev: String,
        was_up: bool,
    },
    AddedAddress(IfAddr, u32),
    AddedRoute(RouteSpec, u32),
    RemovedRoute(RouteSpec, u32),
    AddedRule(RuleSpec),
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Mtu { dev, old, .. } => write!(f, "changed MTU of {dev} (was {old})"),
            Change::Up { dev, was_up, .. } => {
                write!(f, "set {dev} {}", if *was_up { "down" } else { "up" })
            }
            Change::AddedAddress(a, _) => write!(f, "added address {a}"),
            Change::AddedRoute(r, _) => write!(f, "added route {r}"),
            Change::RemovedRoute(r, _) => write!(f, "removed route {r}"),
            Change::AddedRule(r) => write!(f, "added rule {r}"),
        }
    }
}

/// Some changes could not be undone; the others were.
#[derive(Debug)]
pub struct UndoError {
    /// Each failure, in the order they happened (newest change first).
    pub errors: Vec<NetError>,
}

impl fmt::Display for UndoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "undoing network changes: {} failed", self.errors.len())?;
        for (i, e) in self.errors.iter().enumerate() {
            write!(f, "{} {e}", if i == 0 { ":" } else { ";" })?;
        }
        Ok(())
    }
}

impl std::error::Error for UndoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.errors
            .first()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The journal of network changes the daemon made, undone newest first by
/// [`NetChanges::undo`] or on drop.
///
/// Undo treats "already gone" (`ENOENT`, `ESRCH`, `ENODEV`,
/// `EADDRNOTAVAIL`) as done: e.g. routes and addresses on a TUN device
/// vanish with it when its last queue is closed. Other failures are
/// reported (and logged on drop) after trying every entry.
///
/// Removing something through `remove_*` that this journal added just
/// forgets the entry; removing something it did not add is journalled and
/// re-added on undo.
#[derive(Debug)]
pub struct NetChanges {
    nl: Netlink,
    journal: Vec<Change>,
}

impl NetChanges {
    /// An empty journal over a new netlink socket in the calling thread's
    /// network namespace (all changes go there, whichever thread later
    /// makes or undoes them).
    pub fn new() -> Result<NetChanges, NetError> {
        Ok(NetChanges {
            nl: Netlink::open()?,
            journal: Vec::new(),
        })
    }

    /// The socket, for queries such as [`Netlink::link`]. Changes made
    /// directly through it are not journalled.
    pub fn netlink(&mut self) -> &mut Netlink {
        &mut self.nl
    }

    /// Number of recorded changes.
    pub fn len(&self) -> usize {
        self.journal.len()
    }

    /// True if nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.journal.is_empty()
    }

    /// The recorded changes, oldest first, as text (for logs).
    pub fn describe(&self) -> Vec<String> {
        self.journal.iter().map(|c| c.to_string()).collect()
    }

    /// Sets the MTU of `dev`, recording the old one (nothing is recorded if
    /// it already had that MTU).
    pub fn set_mtu(&mut self, dev: &str, mtu: u32) -> Result<(), NetError> {
        let link = self.nl.link(dev)?;
        if link.mtu == mtu {
            return Ok(());
        }
        self.nl.set_mtu_idx(link.index, dev, mtu)?;
        self.journal.push(Change::Mtu {
            index: link.index,
            dev: dev.to_owned(),
            old: link.mtu,
        });
        Ok(())
    }

    /// Brings `dev` up (recorded unless it already was).
    pub fn set_up(&mut self, dev: &str) -> Result<(), NetError> {
        self.set_state(dev, true)
    }

    fn set_state(&mut self, dev: &str, up: bool) -> Result<(), NetError> {
        let link = self.nl.link(dev)?;
        if link.up == up {
            return Ok(());
        }
        self.nl.set_up_idx(link.index, dev, up)?;
        self.journal.push(Change::Up {
            index: link.index,
            dev: dev.to_owned(),
            was_up: link.up,
        });
        Ok(())
    }

    /// Adds an address to an interface.
    pub fn add_address(&mut self, a: &IfAddr) -> Result<(), NetError> {
        let index = self.nl.index(&a.dev)?;
        self.nl.address_idx(a, index, true)?;
        self.journal.push(Change::AddedAddress(a.clone(), index));
        Ok(())
    }

    /// The interface index a route names (0 for a blackhole, which has
    /// none).
    fn route_index(&mut self, r: &RouteSpec) -> Result<u32, NetError> {
        if r.blackhole {
            Ok(0)
        } else {
            self.nl.index(&r.dev)
        }
    }

    /// Adds a route.
    pub fn add_route(&mut self, r: &RouteSpec) -> Result<(), NetError> {
        let index = self.route_index(r)?;
        self.nl.route_idx(r, index, true)?;
        self.journal.push(Change::AddedRoute(r.clone(), index));
        Ok(())
    }

    /// Adds a route, or takes over the same route left by a daemon that
    /// did not undo its changes (a fail-closed blackhole after a crash):
    /// either way it is removed on undo.
    pub fn add_or_adopt_route(&mut self, r: &RouteSpec) -> Result<bool, NetError> {
        let index = self.route_index(r)?;
        let adopted = match self.nl.route_idx(r, index, true) {
            Ok(()) => false,
            Err(e) if e.is_exists() => true,
            Err(e) => return Err(e),
        };
        self.journal.push(Change::AddedRoute(r.clone(), index));
        Ok(adopted)
    }

    /// Removes a route.
    pub fn remove_route(&mut self, r: &RouteSpec) -> Result<(), NetError> {
        let index = self.route_index(r)?;
        self.nl.route_idx(r, index, false)?;
        let pos = self
            .journal
            .iter()
            .rposition(|c| matches!(c, Change::AddedRoute(x, i) if x == r && *i == index));
        match pos {
            Some(p) => drop(self.journal.remove(p)),
            None => self.journal.push(Change::RemovedRoute(r.clone(), index)),
        }
        Ok(())
    }

    /// Adds a policy-routing rule.
    pub fn add_rule(&mut self, r: &RuleSpec) -> Result<(), NetError> {
        self.nl.rule(r, true)?;
        self.journal.push(Change::AddedRule(r.clone()));
        Ok(())
    }

    /// wg-quick's host-to-host setup: `pref PRIORITY lookup main
    /// suppress_prefixlength 0`, then `pref PRIORITY+1 not fwmark MARK
    /// lookup TABLE`. With a default route via the tunnel in `table` and
    /// the gateway's own sockets marked `MARK` ([`super::set_socket_mark`]),
    /// everything but the tunnel's own packets goes through the tunnel,
    /// while more specific routes of the main table still apply.
    pub fn add_fwmark_bypass_rules(
        &mut self,
        family: Family,
        mark: u32,
        table: u32,
        priority: u32,
    ) -> Result<(), NetError> {
        self.add_rule(&RuleSpec::suppress_main(family).priority(priority))?;
        self.add_rule(
            &RuleSpec::not_fwmark_lookup(family, mark, table).priority(priority.saturating_add(1)),
        )
    }

    /// Reverses every recorded change, newest first, and empties the
    /// journal. Entries whose object is already gone count as undone.
    pub fn undo(&mut self) -> Result<(), UndoError> {
        let mut errors = Vec::new();
        while let Some(c) = self.journal.pop() {
            let r = match &c {
                Change::Mtu { index, dev, old } => self.nl.set_mtu_idx(*index, dev, *old),
                Change::Up { index, dev, was_up } => self.nl.set_up_idx(*index, dev, *was_up),
                Change::AddedAddress(a, i) => self.nl.address_idx(a, *i, false),
                Change::AddedRoute(r, i) => self.nl.route_idx(r, *i, false),
                Change::RemovedRoute(r, i) => self.nl.route_idx(r, *i, true),
                Change::AddedRule(r) => self.nl.rule(r, false),
            };
            match r {
                Ok(()) => tracing::debug!("undone: {c}"),
                Err(e) if e.is_not_found() => tracing::debug!("already gone: {c} ({e})"),
                Err(e) if e.is_exists() && matches!(c, Change::RemovedRoute(..)) => {
                    tracing::debug!("already back: {c}")
                }
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(UndoError { errors })
        }
    }
}

impl Drop for NetChanges {
    fn drop(&mut self) {
        if let Err(e) = self.undo() {
            tracing::warn!("{e}");
        }
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn display() {
        let r = RouteSpec::new("10.2.0.0/16".parse().unwrap(), "espgate0");
        assert_eq!(r.to_string(), "10.2.0.0/16 via espgate0");
        let r = r.table(100).source("10.1.0.1".parse().unwrap()).metric(5);
        assert_eq!(
            r.to_string(),
            "10.2.0.0/16 via espgate0 table 100 src 10.1.0.1 metric 5"
        );
        let rule = RuleSpec::not_fwmark_lookup(Family::V4, 51820, 51820).priority(10);
        assert_eq!(
            rule.to_string(),
            "pref 10 not from all fwmark 0xca6c lookup 51820 (IPv4)"
        );
        assert_eq!(
            RuleSpec::suppress_main(Family::V6).to_string(),
            "from all lookup main suppress_prefixlength 0 (IPv6)"
        );
        let a = IfAddr::new("espgate0", "10.1.0.1".parse().unwrap(), 24).unwrap();
        assert_eq!(a.to_string(), "10.1.0.1/24 on espgate0");
        assert!(IfAddr::new("x", "10.1.0.1".parse().unwrap(), 33).is_err());
    }

    #[test]
    fn error_display() {
        let e = NetError::new(
            format!(
                "adding route {}",
                RouteSpec::new("10.2.0.0/16".parse().unwrap(), "espgate0")
            ),
            io::Error::from_raw_os_error(libc::EEXIST),
        );
        assert!(e
            .to_string()
            .starts_with("adding route 10.2.0.0/16 via espgate0: File exists"));
        assert!(e.is_exists());
    }

    #[test]
    fn parses_ack_error_with_ext_ack() {
        // nlmsghdr(error) + code -EINVAL + capped original header + MSG tlv.
        let text = b"Nexthop device is not up\0";
        let tlv_len = 4 + text.len();
        let total = 16 + 4 + 16 + align4(tlv_len);
        let mut m = Vec::new();
        m.extend_from_slice(&(total as u32).to_ne_bytes());
        m.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m.extend_from_slice(&(NLM_F_CAPPED | NLM_F_ACK_TLVS).to_ne_bytes());
        m.extend_from_slice(&7u32.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&(-libc::EINVAL).to_ne_bytes());
        m.extend_from_slice(&[0u8; 16]);
        m.extend_from_slice(&(tlv_len as u16).to_ne_bytes());
        m.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        m.extend_from_slice(text);
        m.resize(total, 0);
        let mut replies = Vec::new();
        // Wrong sequence number: skipped.
        assert!(parse_datagram(&m, 8, &mut replies).unwrap().is_none());
        let out = parse_datagram(&m, 7, &mut replies).unwrap().unwrap();
        assert_eq!(
            out,
            Err((libc::EINVAL, Some("Nexthop device is not up".to_owned())))
        );
        // Truncated.
        assert!(parse_datagram(&m[..total - 8], 7, &mut replies).is_err());
    }
}
