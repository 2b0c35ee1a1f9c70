//! Tests against the real kernel, each in a network namespace it creates
//! (`espgate-t-…`) and deletes, even on failure. They need root (skipped
//! with a message otherwise), run their body on a dedicated thread that
//! `setns`es into the namespace (the test process stays in its own), and
//! check the result from outside with `ip -n NS -j …`.

use super::*;
use serde_json::Value;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A network namespace made for one test; deleted on drop.
struct TestNs {
    name: String,
}

impl TestNs {
    /// Creates `espgate-t-<pid>-<n>-<nanos>`, or returns why the test must
    /// be skipped.
    fn create() -> Result<TestNs, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("not root".into());
        }
        if !std::path::Path::new("/dev/net/tun").exists() {
            return Err("no /dev/net/tun".into());
        }
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "espgate-t-{}-{}-{nanos:x}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .map_err(|e| format!("cannot run ip: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "ip netns add failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(TestNs { name })
    }

    /// Runs `f` on a new thread that has entered the namespace; a panic in
    /// `f` is re-raised here (after which `self` is dropped as usual).
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                let ns = std::fs::File::open(&path).expect("open netns file");
                // setns(CLONE_NEWNET) moves only this thread, which exits
                // when `f` returns.
                let rc = rustix::thread::move_into_link_name_space(
                    ns.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                );
                assert_eq!(rc, Ok(()), "setns");
                f()
            });
            match h.join() {
                Ok(v) => v,
                Err(p) => std::panic::resume_unwind(p),
            }
        })
    }

    /// `ip -n NS -j ARGS`, parsed; `Null` if `ip` fails (e.g. no such dev).
    fn ip_json(&self, args: &[&str]) -> Value {
        let out = Command::new("ip")
            .args(["-n", &self.name, "-j"])
            .args(args)
            .output()
            .expect("run ip");
        if !out.status.success() {
            return Value::Null;
        }
        let s = String::from_utf8_lossy(&out.stdout);
        if s.trim().is_empty() {
            return Value::Array(vec![]);
        }
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("ip {args:?}: bad JSON {e}: {s}"))
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let ok = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            eprintln!("warning: could not delete netns {}", self.name);
        }
    }
}

/// Creates the namespace or prints why the test is skipped.
fn netns_or_skip(test: &str) -> Option<TestNs> {
    match TestNs::create() {
        Ok(ns) => Some(ns),
        Err(why) => {
            eprintln!("skipping {test}: {why}");
            None
        }
    }
}

fn as_array(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// The `addr_info` entries of `ip -j addr show dev DEV` as "addr/len".
fn addrs(ns: &TestNs, dev: &str) -> Vec<String> {
    let v = ns.ip_json(&["addr", "show", "dev", dev]);
    as_array(&v)
        .iter()
        .flat_map(|l| as_array(&l["addr_info"]).to_vec())
        .filter(|a| a["scope"] != "link")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap_or("?"), a["prefixlen"]))
        .collect()
}

/// `dst` of each route in `table` for family `-4`/`-6` that uses `dev`.
fn routes(ns: &TestNs, fam: &str, table: &str, dev: &str) -> Vec<Value> {
    let v = ns.ip_json(&[fam, "route", "show", "table", table]);
    as_array(&v)
        .iter()
        .filter(|r| r["dev"] == dev)
        .cloned()
        .collect()
}

/// The rules with priority `pref` in family `-4`/`-6`.
fn rules_at(ns: &TestNs, fam: &str, pref: u64) -> Vec<Value> {
    let v = ns.ip_json(&[fam, "rule", "show"]);
    as_array(&v)
        .iter()
        .filter(|r| r["priority"].as_u64() == Some(pref))
        .cloned()
        .collect()
}

fn link(ns: &TestNs, dev: &str) -> Option<Value> {
    let v = ns.ip_json(&["-d", "link", "show", "dev", dev]);
    as_array(&v).first().cloned()
}

#[test]
fn configure_verify_and_undo_in_netns() {
    let Some(ns) = netns_or_skip("configure_verify_and_undo_in_netns") else {
        return;
    };
    const DEV: &str = "egt-cfg0";
    ns.run(|| {
        let tun = Tun::open(DEV).expect("create TUN");
        assert_eq!(tun.name(), DEV);
        let mut net = NetChanges::new().unwrap();
        let a4 = IfAddr::new(DEV, "10.77.0.1".parse().unwrap(), 24).unwrap();
        let a6 = IfAddr::new(DEV, "fd77::1".parse().unwrap(), 64).unwrap();
        let r4 = RouteSpec::new("10.2.0.0/16".parse().unwrap(), DEV)
            .table(100)
            .source(a4.addr);
        let r6 = RouteSpec::new("fd78::/64".parse().unwrap(), DEV).table(100);
        let r_main = RouteSpec::new("10.3.0.0/24".parse().unwrap(), DEV).metric(7);
        let mark_rule = RuleSpec::fwmark_lookup(Family::V4, 0x77, 100).priority(1000);
        let mark_rule6 = RuleSpec::fwmark_lookup(Family::V6, 0x77, 100).priority(1000);

        net.set_mtu(DEV, 1400).unwrap();
        net.add_address(&a4).unwrap();
        net.add_address(&a6).unwrap();
        net.set_up(DEV).unwrap();
        net.add_route(&r4).unwrap();
        net.add_route(&r6).unwrap();
        net.add_route(&r_main).unwrap();
        net.add_rule(&mark_rule).unwrap();
        net.add_rule(&mark_rule6).unwrap();
        net.add_fwmark_bypass_rules(Family::V4, 0x77, 100, 2000)
            .unwrap();
        eprintln!("journal: {:#?}", net.describe());
        assert_eq!(net.len(), 11);

        // Clear, typed errors.
        let e = net.add_route(&r4).unwrap_err();
        eprintln!("duplicate route: {e}");
        assert!(e.is_exists(), "{e}");
        assert!(
            e.to_string().starts_with(
                "adding route 10.2.0.0/16 via egt-cfg0 table 100 src 10.77.0.1: File exists"
            ),
            "{e}"
        );
        let e = net
            .add_route(&RouteSpec::new("10.9.0.0/16".parse().unwrap(), "egt-nope"))
            .unwrap_err();
        eprintln!("missing device: {e}");
        assert_eq!(e.errno(), Some(libc::ENODEV), "{e}");
        let bad_src = RouteSpec::new("10.4.0.0/16".parse().unwrap(), DEV)
            .source("10.99.9.9".parse().unwrap());
        let e = net.add_route(&bad_src).unwrap_err();
        eprintln!("non-local source: {e}");
        assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
        assert!(
            e.detail().is_some(),
            "kernel's extended ack is reported: {e}"
        );
        assert_eq!(net.len(), 11, "failed changes are not journalled");

        // Removing something we added forgets it.
        net.remove_route(&r_main).unwrap();
        assert_eq!(net.len(), 10);

        // What the kernel has, seen from outside.
        let l = link(&ns, DEV).expect("link exists");
        assert_eq!(l["mtu"], 1400);
        assert!(as_array(&l["flags"]).iter().any(|f| f == "UP"), "{l}");
        let have = addrs(&ns, DEV);
        assert!(have.contains(&"10.77.0.1/24".to_string()), "{have:?}");
        assert!(have.contains(&"fd77::1/64".to_string()), "{have:?}");
        let rt = routes(&ns, "-4", "100", DEV);
        assert!(
            rt.iter()
                .any(|r| r["dst"] == "10.2.0.0/16" && r["prefsrc"] == "10.77.0.1"),
            "{rt:?}"
        );
        let rt6 = routes(&ns, "-6", "100", DEV);
        assert!(rt6.iter().any(|r| r["dst"] == "fd78::/64"), "{rt6:?}");
        assert!(
            !routes(&ns, "-4", "main", DEV)
                .iter()
                .any(|r| r["dst"] == "10.3.0.0/24"),
            "removed route is gone"
        );
        let r = rules_at(&ns, "-4", 1000);
        assert!(
            r.len() == 1 && r[0]["fwmark"] == "0x77" && r[0]["table"] == "100",
            "{r:?}"
        );
        assert!(r[0].get("not").is_none(), "{r:?}");
        assert_eq!(rules_at(&ns, "-6", 1000).len(), 1);
        let r = rules_at(&ns, "-4", 2000);
        assert!(
            r.len() == 1 && r[0]["table"] == "main" && r[0]["suppress_prefixlen"] == 0,
            "{r:?}"
        );
        let r = rules_at(&ns, "-4", 2001);
        assert!(
            r.len() == 1
                && r[0].get("not").is_some()
                && r[0]["fwmark"] == "0x77"
                && r[0]["table"] == "100",
            "{r:?}"
        );

        // Dropping the journal undoes it all, while the TUN still exists.
        drop(net);
        let l = link(&ns, DEV).expect("link still exists");
        assert_eq!(l["mtu"], 1500, "MTU restored");
        assert!(
            !as_array(&l["flags"]).iter().any(|f| f == "UP"),
            "down again: {l}"
        );
        assert_eq!(addrs(&ns, DEV), Vec::<String>::new());
        assert!(routes(&ns, "-4", "100", DEV).is_empty());
        assert!(routes(&ns, "-6", "100", DEV).is_empty());
        for pref in [1000, 2000, 2001] {
            assert!(rules_at(&ns, "-4", pref).is_empty(), "rule {pref} left");
            assert!(rules_at(&ns, "-6", pref).is_empty(), "rule {pref} left");
        }

        drop(tun);
        assert!(link(&ns, DEV).is_none(), "TUN device gone with its fd");
    });
}

#[test]
fn undo_by_call_and_tolerates_vanished_device() {
    let Some(ns) = netns_or_skip("undo_by_call_and_tolerates_vanished_device") else {
        return;
    };
    const DEV: &str = "egt-undo0";
    ns.run(|| {
        let tun = Tun::open(DEV).unwrap();
        let mut net = NetChanges::new().unwrap();
        net.add_address(&IfAddr::new(DEV, "10.79.0.1".parse().unwrap(), 24).unwrap())
            .unwrap();
        net.set_up(DEV).unwrap();
        net.add_route(&RouteSpec::new("10.80.0.0/16".parse().unwrap(), DEV))
            .unwrap();
        net.add_rule(&RuleSpec::not_fwmark_lookup(Family::V6, 5, 200).priority(300))
            .unwrap();
        assert_eq!(rules_at(&ns, "-6", 300).len(), 1);
        // The device goes first (as when the data plane exits before the
        // cleanup): its address and route go with it, the rule does not.
        drop(tun);
        net.undo().expect("undo tolerates the vanished device");
        assert!(net.is_empty());
        assert!(rules_at(&ns, "-6", 300).is_empty());
        assert!(link(&ns, DEV).is_none());
    });
}

#[test]
fn fail_closed_twin_outlives_the_tun_and_is_adopted_then_undone() {
    let Some(ns) = netns_or_skip("fail_closed_twin_outlives_the_tun_and_is_adopted_then_undone")
    else {
        return;
    };
    const DEV: &str = "egt-fc0";
    ns.run(|| {
        let blackholes = |fam: &str| -> Vec<String> {
            let v = ns.ip_json(&[fam, "route", "show", "table", "main"]);
            as_array(&v)
                .iter()
                .filter(|r| r["type"] == "blackhole")
                .map(|r| format!("{} {}", r["dst"].as_str().unwrap_or("?"), r["metric"]))
                .collect()
        };
        let tun = Tun::open(DEV).unwrap();
        let mut net = NetChanges::new().unwrap();
        net.set_up(DEV).unwrap();
        let r4 = RouteSpec::new("10.81.0.0/16".parse().unwrap(), DEV);
        let r6 = RouteSpec::new("2001:db8:81::/48".parse().unwrap(), DEV);
        for r in [&r4, &r6] {
            net.add_route(r).unwrap();
            assert!(!net.add_or_adopt_route(&r.fail_closed()).unwrap());
        }
        assert_eq!(blackholes("-4"), ["10.81.0.0/16 4000000000"]);
        assert_eq!(blackholes("-6"), ["2001:db8:81::/48 4000000000"]);
        // A crash: the device goes, nothing is undone; the blackholes stay
        // and now carry the prefixes.
        drop(tun);
        std::mem::forget(net);
        let left = ns.ip_json(&["-4", "route", "show", "10.81.0.0/16"]);
        let left = as_array(&left);
        assert!(
            left.len() == 1 && left[0]["type"] == "blackhole",
            "{left:?}"
        );
        // The next run adopts them, and its clean stop removes them.
        let _tun = Tun::open(DEV).unwrap();
        let mut net = NetChanges::new().unwrap();
        for r in [&r4, &r6] {
            assert!(net.add_or_adopt_route(&r.fail_closed()).unwrap(), "adopted");
        }
        net.undo().unwrap();
        assert!(blackholes("-4").is_empty() && blackholes("-6").is_empty());
    });
}

/// Internet checksum (RFC 1071).
fn csum(data: &[u8]) -> u16 {
    let mut s: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An IPv4 ICMP echo request.
fn echo_request(src: Ipv4Addr, dst: Ipv4Addr, id: u16, seq: u16) -> Vec<u8> {
    let payload = b"espgate netdev test";
    let mut icmp = vec![8, 0, 0, 0];
    icmp.extend_from_slice(&id.to_be_bytes());
    icmp.extend_from_slice(&seq.to_be_bytes());
    icmp.extend_from_slice(payload);
    let c = csum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let total = (20 + icmp.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, 1, 0, 0]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&icmp);
    ip
}

/// True if `p` is the echo reply from `from` to `to` with `id`/`seq`
/// and valid checksums.
fn is_echo_reply(p: &[u8], from: Ipv4Addr, to: Ipv4Addr, id: u16, seq: u16) -> bool {
    if p.len() < 28 || p[0] != 0x45 || p[9] != 1 {
        return false;
    }
    let icmp = &p[20..];
    p[12..16] == from.octets()
        && p[16..20] == to.octets()
        && icmp[0] == 0
        && icmp[4..6] == id.to_be_bytes()
        && icmp[6..8] == seq.to_be_bytes()
        && csum(&p[..20]) == 0
        && csum(icmp) == 0
}

/// Polls `queues` (non-blocking) until a packet satisfying `want` (after
/// stripping `skip` header bytes) arrives, at most 5 s and 10 000 packets.
/// Returns the queue index and the whole packet including the header.
fn await_packet(
    queues: &[&TunQueue],
    skip: usize,
    want: impl Fn(&[u8]) -> bool,
) -> Option<(usize, Vec<u8>)> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = vec![0u8; 65536];
    let mut others = 0;
    for _ in 0..10_000 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut fds: Vec<PollFd<'_>> = queues
            .iter()
            .map(|q| PollFd::new(*q, PollFlags::IN))
            .collect();
        let timeout = Timespec::try_from(left).ok();
        let n = poll(&mut fds, timeout.as_ref()).unwrap_or(0);
        if n == 0 {
            continue;
        }
        for (i, q) in queues.iter().enumerate() {
            if !fds[i].revents().contains(PollFlags::IN) {
                continue;
            }
            match q.read(&mut buf) {
                Ok(len) if len >= skip && want(&buf[skip..len]) => {
                    return Some((i, buf[..len].to_vec()));
                }
                Ok(_) => others += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("read from TUN queue {i}: {e}"),
            }
        }
    }
    eprintln!("no matching packet; {others} others seen");
    None
}

/// Gives `dev` address `local`/24, MTU 1400 and brings it up.
fn bring_up(dev: &str, local: Ipv4Addr) -> NetChanges {
    let mut net = NetChanges::new().unwrap();
    net.set_mtu(dev, 1400).unwrap();
    net.add_address(&IfAddr::new(dev, local.into(), 24).unwrap())
        .unwrap();
    net.set_up(dev).unwrap();
    net
}

#[test]
fn tun_echo_round_trip() {
    let Some(ns) = netns_or_skip("tun_echo_round_trip") else {
        return;
    };
    const DEV: &str = "egt-echo0";
    ns.run(|| {
        let tun = Tun::builder(DEV).nonblocking(true).open().unwrap();
        let local = Ipv4Addr::new(10, 78, 0, 1);
        let peer = Ipv4Addr::new(10, 78, 0, 2);
        let _net = bring_up(DEV, local);
        let req = echo_request(peer, local, 0x4567, 1);
        assert_eq!(tun.write(&req).unwrap(), req.len());
        let got = await_packet(&[&tun.queues()[0]], 0, |p| {
            is_echo_reply(p, local, peer, 0x4567, 1)
        });
        let (_, reply) = got.expect("kernel's echo reply read back from the TUN");
        assert_eq!(reply.len(), req.len());
        assert_eq!(&reply[28..], &req[28..], "payload echoed");
    });
}

#[test]
fn multi_queue_two_queues_one_device() {
    let Some(ns) = netns_or_skip("multi_queue_two_queues_one_device") else {
        return;
    };
    const DEV: &str = "egt-mq0";
    ns.run(|| {
        let tun = Tun::builder(DEV)
            .multi_queue(2)
            .nonblocking(true)
            .open()
            .unwrap();
        assert!(tun.is_multi_queue());
        let q = tun.queues();
        assert_eq!(q.len(), 2);
        assert_ne!(q[0].as_raw_fd(), q[1].as_raw_fd());

        // Exclusive creation: the name is taken now.
        let e = Tun::open(DEV).unwrap_err();
        eprintln!("second create: {e}");
        assert_eq!(e.errno(), Some(libc::EBUSY), "{e}");

        let l = link(&ns, DEV).expect("link exists");
        let info = &l["linkinfo"]["info_data"];
        eprintln!("linkinfo: {info}");
        if !info.is_null() {
            assert_eq!(info["multi_queue"], true, "{info}");
            assert_eq!(info["numqueues"], 2, "{info}");
        }

        // Both queues carry traffic: requests alternate between the queues,
        // and replies to different peers (flows) spread over both.
        let local = Ipv4Addr::new(10, 81, 0, 1);
        let _net = bring_up(DEV, local);
        let mut replied_on = [0u32; 2];
        for k in 0..32u8 {
            let peer = Ipv4Addr::new(10, 81, 0, 2 + k);
            let seq = u16::from(k);
            q[usize::from(k % 2)]
                .write(&echo_request(peer, local, 0x99, seq))
                .unwrap();
            let got = await_packet(&[&q[0], &q[1]], 0, |p| {
                is_echo_reply(p, local, peer, 0x99, seq)
            });
            let (on, _) = got.expect("echo reply via a multi-queue TUN");
            replied_on[on] += 1;
            if k >= 1 && replied_on.iter().all(|&n| n > 0) {
                break;
            }
        }
        eprintln!("replies per queue: {replied_on:?}");
        assert!(replied_on.iter().all(|&n| n > 0), "{replied_on:?}");

        // A single-queue device cannot grow queues.
        let mut single = Tun::open("egt-sq0").unwrap();
        assert!(single.attach_queue().is_err());
    });
}

#[test]
fn offload_probe_falls_back() {
    let Some(ns) = netns_or_skip("offload_probe_falls_back") else {
        return;
    };
    const DEV: &str = "egt-off0";
    ns.run(|| {
        // Without IFF_VNET_HDR offloads are refused up front.
        let mut plain = Tun::open("egt-plain0").unwrap();
        assert!(plain.set_offloads(Offloads::CSUM).is_err());
        assert_eq!(plain.set_offloads(Offloads::NONE).unwrap(), Offloads::NONE);

        let mut tun = Tun::builder(DEV)
            .vnet_hdr(true)
            .nonblocking(true)
            .open()
            .unwrap();
        assert!(tun.has_vnet_hdr());
        let every = Offloads::CSUM
            | Offloads::TSO4
            | Offloads::TSO6
            | Offloads::TSO_ECN
            | Offloads::USO4
            | Offloads::USO6
            | Offloads::UDP_TUNNEL_GSO
            | Offloads::UDP_TUNNEL_GSO_CSUM
            | Offloads::from_bits(0x8000_0000);
        let uso4_alone = Offloads::CSUM | Offloads::TSO4 | Offloads::TSO6 | Offloads::USO4;
        for want in [every, uso4_alone, Offloads::tcp_udp_gso()] {
            let got = tun
                .set_offloads(want)
                .expect("probing falls back, never fails");
            eprintln!("offloads: requested {want}, kernel accepted {got}");
            assert_eq!(got - want, Offloads::NONE, "accepted only what was asked");
            assert_eq!(tun.offloads(), got);
            assert!(
                got.contains(Offloads::CSUM),
                "CSUM is universally supported"
            );
            assert!(!got.contains(Offloads::from_bits(0x8000_0000)));
        }

        // Packets now carry a virtio-net header: echo through it.
        let local = Ipv4Addr::new(10, 82, 0, 1);
        let peer = Ipv4Addr::new(10, 82, 0, 2);
        let _net = bring_up(DEV, local);
        let mut pkt = VirtioNetHdr::default().to_bytes().to_vec();
        pkt.extend_from_slice(&echo_request(peer, local, 0x77, 9));
        tun.write(&pkt).unwrap();
        let got = await_packet(&[&tun.queues()[0]], VNET_HDR_LEN, |p| {
            is_echo_reply(p, local, peer, 0x77, 9)
        });
        let (_, reply) = got.expect("echo reply with a vnet header");
        let hdr = VirtioNetHdr::parse(&reply).unwrap();
        eprintln!("reply header: {hdr:?}");
        assert_eq!(hdr.gso_type, VirtioNetHdr::GSO_NONE);
    });
}

#[test]
fn socket_mark_round_trip() {
    let Some(ns) = netns_or_skip("socket_mark_round_trip") else {
        return;
    };
    ns.run(|| {
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        let sock = rustix::net::socket_with(
            AddressFamily::INET,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            None,
        );
        assert!(sock.is_ok(), "socket: {sock:?}");
        let sock = sock.unwrap();
        set_socket_mark(&sock, 0xca6c).unwrap();
        assert_eq!(socket_mark(&sock).unwrap(), 0xca6c);
    });
}
