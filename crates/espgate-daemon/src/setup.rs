//! What the daemon changes in the network namespace, planned from the
//! configuration ([`plan`], pure) and applied through the undo journal
//! [`NetChanges`] ([`apply`]):
//!
//! - the TUN's MTU: `gateway.mtu` minus the largest outbound bundle
//!   overhead, so the kernel fragments inner packets without DF and
//!   answers oversized DF packets with ICMP "fragmentation needed" /
//!   "packet too big" itself;
//! - `gateway.tun_address`, then the link up;
//! - for each connection with `routes = true`, a route per `remote_ts`
//!   prefix of each of its selector sets (its own and those of its
//!   `[[connection.ike.child]]` tables) through the TUN (transport mode:
//!   with `src` = the connection's `local`, the address the SAs protect;
//!   tunnel mode: with a TUN address inside that set's `local_ts` as `src`
//!   when there is one);
//! - beside each of those routes, its fail-closed twin: a `blackhole`
//!   route for the same prefix at a far higher metric
//!   ([`RouteSpec::fail_closed`]), which takes over only when the TUN
//!   route is gone — after a crash or SIGKILL, which undoes nothing — so
//!   the tunnel's traffic is dropped instead of leaving in clear by
//!   another route; a clean stop removes it, and a restart takes over
//!   one left behind;
//! - with `gateway.fwmark`: the routes go into table `fwmark`, the outer
//!   sockets are marked, and one rule per family, `not fwmark M lookup M`,
//!   sends everything else through that table. The rule comes before the
//!   main table so that a route to the peer's own address (host-to-host)
//!   wins over the main table's on-link route, while the daemon's marked
//!   packets skip it; destinations without a route in table M fall through
//!   to the main table. (wg-quick's second rule, `lookup main
//!   suppress_prefixlength 0`, exists for a default route in the tunnel
//!   table and would let the on-link route win here, so it is not added.)

use crate::netdev::{Family, IfAddr, NetChanges, RouteSpec, RuleSpec};
use anyhow::{bail, Context, Result};
use espgate_config::{Connection, LoadedConfig};
use espgate_core::sa::Mode;
use espgate_core::selector::Prefix;
use std::collections::HashSet;

/// Priority of the fwmark rule: before the main table's rule (32766), and
/// distinct from wg-quick's (32764, 32765).
pub const RULE_PRIORITY: u32 = 32760;

/// Everything to configure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetPlan {
    /// TUN device name.
    pub tun: String,
    /// Its MTU.
    pub mtu: u32,
    /// Addresses to add.
    pub addresses: Vec<IfAddr>,
    /// Routes to add, in order, without duplicates.
    pub routes: Vec<RouteSpec>,
    /// Rules to add.
    pub rules: Vec<RuleSpec>,
}

/// Source address for the routes of connection `c` to the remote prefixes
/// of the selector set whose local prefixes are `local_ts`: in tunnel
/// mode a TUN address inside them, so that the gateway's own packets
/// select that set.
fn route_source(
    cfg: &LoadedConfig,
    c: &Connection,
    local_ts: &[Prefix],
    v6: bool,
) -> Option<std::net::IpAddr> {
    match c.mode {
        Mode::Transport => (c.local.is_ipv6() == v6).then_some(c.local),
        Mode::Tunnel => cfg
            .gateway
            .tun_address
            .iter()
            .map(|a| a.addr)
            .find(|a| a.is_ipv6() == v6 && local_ts.iter().any(|p| p.contains(*a))),
    }
}

/// Plans the changes for `cfg` given the largest bundle overhead.
pub fn plan(cfg: &LoadedConfig, overhead: usize) -> Result<NetPlan> {
    let g = &cfg.gateway;
    let mtu = i64::from(g.mtu) - overhead as i64;
    if mtu < 576 {
        bail!(
            "gateway.mtu {} minus the largest SA overhead ({overhead} bytes) leaves a TUN MTU of \
             {mtu}, below 576; raise gateway.mtu",
            g.mtu
        );
    }
    let mtu = mtu as u32;
    if mtu < 1280 && g.tun_address.iter().any(|a| a.addr.is_ipv6()) {
        tracing::warn!(
            "TUN MTU {mtu} is below 1280: the kernel disables IPv6 on {}; raise gateway.mtu",
            g.tun
        );
    }
    let mut addresses = Vec::new();
    for a in &g.tun_address {
        addresses.push(IfAddr::new(&g.tun, a.addr, a.prefix_len)?);
    }
    let mut routes = Vec::new();
    let mut seen = HashSet::new();
    for c in cfg.connections.iter().filter(|c| c.routes) {
        for (local_ts, remote_ts) in c.selector_sets() {
            for p in remote_ts {
                let v6 = p.addr().is_ipv6();
                if !seen.insert((*p, g.fwmark)) {
                    continue;
                }
                let mut r = RouteSpec::new(*p, &g.tun);
                if let Some(m) = g.fwmark {
                    r = r.table(m);
                }
                if let Some(src) = route_source(cfg, c, local_ts, v6) {
                    r = r.source(src);
                }
                let twin = r.fail_closed();
                routes.push(r);
                routes.push(twin);
            }
        }
    }
    let mut rules = Vec::new();
    if let Some(m) = g.fwmark {
        for fam in [Family::V4, Family::V6] {
            if routes.iter().any(|r| Family::of(r.dest.addr()) == fam) {
                rules.push(RuleSpec::not_fwmark_lookup(fam, m, m).priority(RULE_PRIORITY));
            }
        }
    }
    Ok(NetPlan {
        tun: g.tun.clone(),
        mtu,
        addresses,
        routes,
        rules,
    })
}

/// Applies `plan` (the TUN must exist). On error, what was done stays in
/// `net`'s journal for the caller to undo.
pub fn apply(plan: &NetPlan, net: &mut NetChanges) -> Result<()> {
    net.set_mtu(&plan.tun, plan.mtu)?;
    for a in &plan.addresses {
        net.add_address(a)
            .with_context(|| format!("adding address {a}"))?;
    }
    net.set_up(&plan.tun)?;
    for r in &plan.routes {
        if r.blackhole {
            let adopted = net
                .add_or_adopt_route(r)
                .with_context(|| format!("adding route {r}"))?;
            if adopted {
                tracing::info!("route {r} was left by a previous run: kept");
            }
        } else {
            net.add_route(r)
                .with_context(|| format!("adding route {r}"))?;
        }
    }
    for r in &plan.rules {
        match net.add_rule(r) {
            Ok(()) => {}
            Err(e) if e.is_exists() => {
                // The same rule, left by a daemon that was killed.
                tracing::warn!("replacing rule {r}, left over by a previous run");
                net.netlink()
                    .del_rule(r)
                    .with_context(|| format!("removing stale rule {r}"))?;
                net.add_rule(r)
                    .with_context(|| format!("adding rule {r}"))?;
            }
            Err(e) => return Err(e).with_context(|| format!("adding rule {r}")),
        }
    }
    Ok(())
}

/// The name of the interface holding IPv4 address `addr`, if any.
fn ipv4_interface_of(addr: std::net::Ipv4Addr) -> Option<String> {
    nix::ifaddrs::getifaddrs()
        .ok()?
        .find(|ifa| {
            ifa.address
                .as_ref()
                .and_then(|a| a.as_sockaddr_in())
                .is_some_and(|sin| sin.ip() == addr)
        })
        .map(|ifa| ifa.interface_name)
}

fn rp_filter(dev: &str) -> u8 {
    std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{dev}/rp_filter"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Strict reverse-path filtering on the outer interface drops the peer's
/// packets when the route to the peer's own address goes into the TUN
/// (host-to-host): the kernel's reverse lookup (unmarked) finds the TUN,
/// not the interface they came in on. Returns the warning to log.
pub fn rp_filter_warning(cfg: &LoadedConfig) -> Option<String> {
    cfg.gateway.fwmark?;
    for c in cfg.connections.iter().filter(|c| c.routes) {
        let (std::net::IpAddr::V4(local), std::net::IpAddr::V4(_)) = (c.local, c.remote) else {
            continue;
        };
        if !c
            .selector_sets()
            .any(|(_, r)| r.iter().any(|p| p.contains(c.remote)))
        {
            continue;
        }
        let Some(dev) = ipv4_interface_of(local) else {
            continue;
        };
        // The kernel uses the larger of "all" and the device's value.
        if rp_filter("all").max(rp_filter(&dev)) == 1 {
            return Some(format!(
                "connection \"{}\": strict reverse-path filtering on {dev} \
                 (net.ipv4.conf.{{all,{dev}}}.rp_filter = 1) will drop the packets from {} \
                 because its address is routed into the TUN; set it to 2 (loose): \
                 sysctl -w net.ipv4.conf.all.rp_filter=2 net.ipv4.conf.{dev}.rp_filter=2",
                c.name, c.remote
            ));
        }
    }
    None
}

/// A cluster node numbers packets in the order they reach it, and every
/// node must see one order (docs/CLUSTER.md, "Same order on every
/// node"). A shared interface whose frames are received on several
/// queues, or spread from one queue over several CPUs (RPS), handles
/// different flows in parallel, and two nodes may then put two packets in
/// opposite orders. Returns one warning per such interface of the
/// `[cluster]` table, read from `/sys`.
pub fn cluster_order_warnings(cfg: &LoadedConfig) -> Vec<String> {
    let Some(c) = &cfg.cluster else {
        return Vec::new();
    };
    [("inside", &c.inside), ("outside", &c.outside)]
        .into_iter()
        .filter_map(|(role, dev)| {
            let dev = dev.as_deref()?;
            let why = reorder_risk(std::path::Path::new("/sys"), dev)?;
            Some(format!(
                "cluster.{role} = \"{dev}\": {why}, so packets of different flows may reach \
                 this node in another order than the other nodes, which would number them \
                 differently (lost and replayed packets); receive on one queue and one CPU: \
                 ethtool -L {dev} combined 1, and at most one CPU in \
                 /sys/class/net/{dev}/queues/rx-0/rps_cpus"
            ))
        })
        .collect()
}

/// Why interface `dev` (under the sysfs mounted at `sys`) may reorder
/// frames of different flows, or `None` (one receive queue, RPS off or on
/// one CPU, or no such interface).
fn reorder_risk(sys: &std::path::Path, dev: &str) -> Option<String> {
    let queues = sys.join("class/net").join(dev).join("queues");
    let rx: Vec<_> = std::fs::read_dir(queues)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .map(|e| e.path())
        .collect();
    if rx.len() > 1 {
        return Some(format!("{} receive queues", rx.len()));
    }
    // A hexadecimal CPU mask, in comma-separated groups of 32 bits.
    let mask = std::fs::read_to_string(rx.first()?.join("rps_cpus")).ok()?;
    let cpus: u32 = mask
        .trim()
        .split(',')
        .map(|g| u32::from_str_radix(g, 16).map_or(0, u32::count_ones))
        .sum();
    (cpus > 1).then(|| {
        format!(
            "RPS spreads its receive queue over {cpus} CPUs (rps_cpus {})",
            mask.trim()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cfg(gateway: &str, conn: &str) -> LoadedConfig {
        let text = format!(
            "[gateway]\ntun = \"t0\"\n{gateway}\n[[connection]]\nname = \"c\"\n{conn}\n\
             [connection.esp]\nsuite = \"aes128gcm16\"\nspi_in = 0x1001\nspi_out = 0x1002\n\
             enc_in = \"000102030405060708090a0b0c0d0e0f10111213\"\n\
             enc_out = \"101112131415161718191a1b1c1d1e1f20212223\"\n"
        );
        espgate_config::parse(&text, Path::new("/nonexistent"), "t.toml")
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A fake sysfs with interface `dev` and its receive queues' RPS masks.
    fn sysfs(dev: &str, rps: &[&str]) -> std::path::PathBuf {
        let root = espgate_testkit::temp_dir("sysfs");
        for (i, mask) in rps.iter().enumerate() {
            let q = root.join(format!("class/net/{dev}/queues/rx-{i}"));
            std::fs::create_dir_all(&q).unwrap();
            std::fs::write(q.join("rps_cpus"), format!("{mask}\n")).unwrap();
        }
        std::fs::create_dir_all(root.join(format!("class/net/{dev}/queues/tx-0"))).unwrap();
        root
    }

    #[test]
    fn one_queue_on_one_cpu_keeps_the_order_and_more_may_not() {
        // One queue, RPS off or on one CPU: no warning.
        assert_eq!(reorder_risk(&sysfs("in0", &["0"]), "in0"), None);
        assert_eq!(
            reorder_risk(&sysfs("in0", &["00000000,00000004"]), "in0"),
            None
        );
        // Several queues, or one spread over CPUs: the warning says which.
        let why = reorder_risk(&sysfs("in0", &["0", "0", "0", "0"]), "in0").unwrap();
        assert_eq!(why, "4 receive queues");
        let why = reorder_risk(&sysfs("in0", &["00000001,00000003"]), "in0").unwrap();
        assert!(why.contains("over 3 CPUs"), "{why}");
        // An interface that is not there: nothing to say.
        assert_eq!(reorder_risk(&sysfs("in0", &["3"]), "eth9"), None);
    }

    #[test]
    fn only_a_cluster_node_is_warned_about_its_shared_interfaces() {
        let conn = "local = \"192.0.2.1\"\nremote = \"192.0.2.2\"\n\
                    local_ts = [\"10.1.0.0/24\"]\nremote_ts = [\"10.2.0.0/24\"]";
        assert!(cluster_order_warnings(&cfg("", conn)).is_empty());
        // A node whose shared interfaces each have one queue (loopback).
        let cluster = "[cluster]\nname = \"t\"\nnode = 1\netcd = [\"http://127.0.0.1:1\"]\n\
                       inside = \"lo\"\noutside = \"lo\"\n";
        let c = cfg(cluster, conn);
        assert_eq!(c.cluster.as_ref().unwrap().inside.as_deref(), Some("lo"));
        assert!(cluster_order_warnings(&c).is_empty());
    }

    #[test]
    fn site_to_site_routes_in_main_with_tun_source() {
        let c = cfg(
            "tun_address = [\"10.1.0.1/24\", \"2001:db8:1::1/64\"]",
            "local = \"192.0.2.1\"\nremote = \"192.0.2.2\"\n\
             local_ts = [\"10.1.0.0/24\", \"2001:db8:1::/64\"]\n\
             remote_ts = [\"10.2.0.0/24\", \"2001:db8:2::/64\"]",
        );
        let p = plan(&c, 73).unwrap();
        assert_eq!(p.mtu, 1500 - 73);
        assert_eq!(p.addresses.len(), 2);
        let routes: Vec<String> = p.routes.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            routes,
            [
                "10.2.0.0/24 via t0 src 10.1.0.1",
                "blackhole 10.2.0.0/24 metric 4000000000",
                "2001:db8:2::/64 via t0 src 2001:db8:1::1",
                "blackhole 2001:db8:2::/64 metric 4000000000"
            ]
        );
        assert!(p.rules.is_empty());
    }

    #[test]
    fn host_to_host_uses_a_table_and_one_rule_per_family() {
        let c = cfg(
            "fwmark = 0x4500\nencap = \"none\"",
            "local = \"192.0.2.1\"\nremote = \"192.0.2.2\"\nmode = \"transport\"",
        );
        let p = plan(&c, 60).unwrap();
        let routes: Vec<String> = p.routes.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            routes,
            [
                "192.0.2.2/32 via t0 table 17664 src 192.0.2.1",
                "blackhole 192.0.2.2/32 table 17664 metric 4000000000"
            ]
        );
        let rules: Vec<String> = p.rules.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            rules,
            ["pref 32760 not from all fwmark 0x4500 lookup 17664 (IPv4)"]
        );
    }

    #[test]
    fn child_selector_sets_get_routes_with_their_own_source() {
        use std::os::unix::fs::PermissionsExt;
        let dir =
            std::env::temp_dir().join(format!("espgate-setup-children-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let psk = dir.join("psk");
        std::fs::write(&psk, "0123456789abcdefghijklmnopqrstuv\n").unwrap();
        std::fs::set_permissions(&psk, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = "[gateway]\ntun = \"t0\"\ntun_address = [\"10.1.0.1/24\", \"10.1.5.1/24\"]\n\
                    [[connection]]\nname = \"c\"\nlocal = \"192.0.2.1\"\nremote = \"192.0.2.2\"\n\
                    local_ts = [\"10.1.0.0/24\"]\nremote_ts = [\"10.2.0.0/24\"]\n\
                    [connection.ike]\npsk_file = \"psk\"\n\
                    [[connection.ike.child]]\nremote_ts = [\"10.3.0.0/24\"]\n\
                    [[connection.ike.child]]\nlocal_ts = [\"10.1.5.0/24\"]\n\
                    remote_ts = [\"10.4.0.0/24\", \"10.2.0.0/24\"]\n";
        let c = espgate_config::parse(text, &dir, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        std::fs::remove_dir_all(&dir).unwrap();
        let p = plan(&c, 73).unwrap();
        let routes: Vec<String> = p.routes.iter().map(|r| r.to_string()).collect();
        // 10.2.0.0/24 again in the last set: one route, the first set's.
        assert_eq!(
            routes,
            [
                "10.2.0.0/24 via t0 src 10.1.0.1",
                "blackhole 10.2.0.0/24 metric 4000000000",
                "10.3.0.0/24 via t0 src 10.1.0.1",
                "blackhole 10.3.0.0/24 metric 4000000000",
                "10.4.0.0/24 via t0 src 10.1.5.1",
                "blackhole 10.4.0.0/24 metric 4000000000"
            ]
        );
    }

    #[test]
    fn interface_lookup() {
        // Loopback holds 127.0.0.1 wherever the tests run.
        assert_eq!(
            ipv4_interface_of(std::net::Ipv4Addr::LOCALHOST).as_deref(),
            Some("lo")
        );
        assert_eq!(ipv4_interface_of("192.0.2.77".parse().unwrap()), None);
        let c = cfg(
            "fwmark = 0x4500",
            "local = \"192.0.2.77\"\nremote = \"192.0.2.2\"\nmode = \"transport\"",
        );
        assert_eq!(rp_filter_warning(&c), None, "no such local address here");
    }

    #[test]
    fn routes_false_and_tiny_mtu() {
        let c = cfg(
            "mtu = 600",
            "local = \"192.0.2.1\"\nremote = \"192.0.2.2\"\nroutes = false\n\
             local_ts = [\"10.1.0.0/24\"]\nremote_ts = [\"10.2.0.0/24\"]",
        );
        let p = plan(&c, 20).unwrap();
        assert!(p.routes.is_empty() && p.rules.is_empty());
        let e = plan(&c, 100).unwrap_err().to_string();
        assert!(e.contains("below 576"), "{e}");
    }
}
