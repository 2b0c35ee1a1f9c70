//! Seed 003's flat cluster through the engine: three nodes of site A see
//! every packet; exactly one sends each; the ordinary peer B receives one
//! gateway's packets with no replay or ICV drop; a node that misses a
//! packet finds itself out of step from the others' checkpoints and moves.

use espgate_core::buf::PacketBuf;
use espgate_core::cluster::{Dispatch, NodeId, Plan};
use espgate_core::gateway::{ClusterOptions, Engine, EngineOptions, Layers, LockState, Received};
use espgate_testkit::{drops, from_a, opts, side, udp4, Shape};
use std::net::IpAddr;
use std::time::Duration;

const T: Duration = Duration::from_secs(1);

fn node(id: NodeId, scheme: Dispatch) -> Engine {
    let mut e = fresh(id, scheme);
    e.cluster_plan(Plan::new(1, [1, 2, 3]), Some(1), T);
    // The agent's first round: nothing sent yet anywhere, so in step.
    assert!(e.cluster_check(&[]).is_empty());
    e
}

/// A node just started, before the agent's first round.
fn fresh(id: NodeId, scheme: Dispatch) -> Engine {
    let o = EngineOptions {
        cluster: Some(ClusterOptions {
            node: id,
            dispatch: scheme,
            hold: Duration::from_secs(10),
        }),
        ..opts()
    };
    Engine::new(&[side(true, Shape::new(Layers::Esp, true))], &o, T).unwrap()
}

fn peer() -> Engine {
    Engine::new(&[side(false, Shape::new(Layers::Esp, true))], &opts(), T).unwrap()
}

fn pkt(k: u64, flow: u16) -> Vec<u8> {
    let mut p = udp4("10.1.0.5", "10.2.0.9", 40);
    p[4..6].copy_from_slice(&(k as u16).to_be_bytes()); // IP ID
    p[20..22].copy_from_slice(&flow.to_be_bytes()); // source port
    p[28..36].copy_from_slice(&k.to_be_bytes()); // payload
    p
}

fn next_out(e: &Engine) -> u64 {
    e.stats()
        .sas()
        .iter()
        .find(|s| s.outbound)
        .unwrap()
        .next_seq()
}

/// Offers packet `k` to every node (but `skip`); returns the senders and
/// delivers the one sent packet to `b`.
fn offer(
    nodes: &mut [Engine],
    b: &mut Engine,
    k: u64,
    flow: u16,
    skip: Option<usize>,
) -> Vec<usize> {
    let mut senders = Vec::new();
    for (i, n) in nodes.iter_mut().enumerate() {
        if Some(i) == skip {
            continue;
        }
        let mut buf = PacketBuf::with_capacity(2000);
        buf.load(&pkt(k, flow));
        if let Ok(Some(_)) = n.outbound(&mut buf, T) {
            senders.push(i);
            assert_eq!(
                b.inbound(&mut buf, T, from_a()),
                Ok(Received::Packet),
                "packet {k}"
            );
        }
    }
    senders
}

#[test]
fn every_outbound_packet_is_sent_by_exactly_one_node() {
    for scheme in [
        Dispatch::PacketRr,
        Dispatch::PacketSqf,
        Dispatch::SessionRr,
        Dispatch::SessionSqf,
    ] {
        let mut nodes: Vec<Engine> = (1..=3).map(|i| node(i, scheme)).collect();
        let mut b = peer();
        let mut per = [0u32; 3];
        for k in 0..600u64 {
            let s = offer(&mut nodes, &mut b, k, (k % 7) as u16, None);
            assert_eq!(s.len(), 1, "{scheme:?}: packet {k} sent by {s:?}");
            per[s[0]] += 1;
        }
        assert!(drops(&b).is_empty(), "{scheme:?}: {:?}", drops(&b));
        assert!(per.iter().all(|n| *n > 0), "{scheme:?}: {per:?}");
        // Every node holds the same next sequence number.
        let next: Vec<u64> = nodes.iter().map(next_out).collect();
        assert!(next.windows(2).all(|w| w[0] == w[1]), "{next:?}");
    }
}

#[test]
fn every_inbound_packet_is_decrypted_by_exactly_one_node_and_windows_agree() {
    let mut nodes: Vec<Engine> = (1..=3).map(|i| node(i, Dispatch::PacketRr)).collect();
    // B sends to the cluster (B's side is "a=false").
    let mut b = peer();
    for k in 0..300u64 {
        let mut buf = PacketBuf::with_capacity(2000);
        let clear = udp4("10.2.0.9", "10.1.0.5", 200 + (k % 5) as usize);
        buf.load(&clear);
        assert_eq!(b.outbound(&mut buf, T), Ok(Some(0)));
        let wire = buf.as_slice().to_vec();
        let b_addr: IpAddr = espgate_testkit::B.into();
        let mut delivered = 0;
        for (i, n) in nodes.iter_mut().enumerate() {
            let mut x = PacketBuf::from_packet(&[0xa5; 200]);
            // Every other packet as the daemon receives it: the head
            // behind the outer IP and UDP header, the rest left where it
            // was received (the node copies it in to keep its window).
            let r = if (k as usize + i).is_multiple_of(2) {
                x.load(&wire);
                n.inbound(&mut x, T, b_addr)
            } else {
                x.load_head(&wire[28..]);
                x.push_front(28)[..28].copy_from_slice(&wire[..28]);
                n.inbound_from(&mut x, &wire[28..], T, b_addr)
            };
            match r {
                Ok(Received::Packet) => {
                    assert_eq!(x.as_slice(), &clear[..], "packet {k}");
                    delivered += 1;
                }
                Ok(Received::Observed) => {}
                other => panic!("packet {k}: {other:?}"),
            }
        }
        assert_eq!(delivered, 1, "packet {k}");
    }
    for n in &nodes {
        assert!(drops(n).is_empty(), "{:?}", drops(n));
    }
    // A replayed packet is refused by every node, observer or not.
    let tops: Vec<u64> = nodes
        .iter()
        .map(|n| {
            n.stats()
                .sas()
                .iter()
                .find(|s| !s.outbound)
                .unwrap()
                .counters
                .replay_top
                .get()
        })
        .collect();
    assert_eq!(tops, [300, 300, 300]);
}

#[test]
fn a_node_that_missed_a_packet_resyncs_from_the_others_checkpoints() {
    let mut nodes: Vec<Engine> = (1..=3).map(|i| node(i, Dispatch::PacketRr)).collect();
    let mut b = peer();
    let mut lost = 0;
    for k in 0..1000u64 {
        // Node 3 (index 2) misses packet 100.
        let skip = (k == 100).then_some(2);
        let s = offer(&mut nodes, &mut b, k, 1, skip);
        if s.len() != 1 {
            lost += 1;
        }
    }
    // Out of step, node 3 sends numbers the others used (replay drops at
    // B) or leaves gaps: the hazard the checks are for.
    assert!(lost > 0 || !drops(&b).is_empty());
    let cps: Vec<(NodeId, u32, u64, u64)> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| {
            let r = n.cluster_report(T).unwrap();
            let sa = r.sas.iter().find(|s| s.outbound)?;
            let (seq, d) = sa.checkpoint?;
            Some((i as NodeId + 1, sa.spi, seq, d))
        })
        .collect();
    assert_eq!(cps.len(), 3);
    // Nodes 1 and 2 agree with each other and outvote node 3.
    for (i, n) in nodes.iter_mut().enumerate() {
        let lines = n.cluster_check(&cps);
        let r = n.cluster_report(T).unwrap();
        let sa = r.sas.iter().find(|s| s.outbound).unwrap();
        assert_eq!(sa.lockstep, Some(LockState::InStep), "node {}", i + 1);
        if i == 2 {
            assert_eq!(sa.resyncs, 1, "{lines:?}");
            assert!(lines[0].contains("1 packet(s) behind"), "{lines:?}");
        } else {
            assert!(lines.is_empty() && sa.resyncs == 0, "{lines:?}");
        }
    }
    let next: Vec<u64> = nodes.iter().map(next_out).collect();
    assert!(next.windows(2).all(|w| w[0] == w[1]), "{next:?}");
    // From here on exactly one node sends each packet again, and B
    // accepts every one.
    let before = drops(&b);
    for k in 1000..1300u64 {
        assert_eq!(offer(&mut nodes, &mut b, k, 1, None).len(), 1, "packet {k}");
    }
    assert_eq!(drops(&b), before);
}

#[test]
fn without_a_confirmed_plan_nobody_sends_but_state_advances() {
    let mut n = node(1, Dispatch::PacketRr);
    let mut b = peer();
    // Past the 10 s hold without a confirmation.
    let late = T + Duration::from_secs(11);
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&pkt(1, 1));
    let r = n.outbound(&mut buf, late);
    assert_eq!(r.unwrap_err().reason.as_str(), "cluster_no_plan");
    assert_eq!(next_out(&n), 2, "the number was still taken");
    let r = n.cluster_report(late).unwrap();
    assert!(
        !r.plan_valid && r.state().starts_with("stopped"),
        "{}",
        r.state()
    );
    // Confirmed again: it processes its share.
    n.cluster_plan(Plan::new(1, [1]), Some(1), late);
    n.cluster_check(&[]);
    assert_eq!(offer(std::slice::from_mut(&mut n), &mut b, 2, 1, None), [0]);
    assert_eq!(n.cluster_report(late).unwrap().state(), "processing");
}

fn checkpoints(nodes: &[Engine], ids: &[NodeId]) -> Vec<(NodeId, u32, u64, u64)> {
    nodes
        .iter()
        .zip(ids)
        .filter_map(|(n, id)| {
            let r = n.cluster_report(T).unwrap();
            let sa = r.sas.iter().find(|s| s.outbound)?;
            let (seq, d) = sa.checkpoint?;
            Some((*id, sa.spi, seq, d))
        })
        .collect()
}

#[test]
fn a_node_that_starts_late_waits_for_its_first_comparison_then_joins() {
    let mut nodes: Vec<Engine> = (1..=2).map(|i| node(i, Dispatch::PacketRr)).collect();
    let plan12 = Plan::new(2, [1, 2]);
    for n in &mut nodes {
        n.cluster_plan(plan12.clone(), Some(1), T);
    }
    let mut b = peer();
    for k in 0..700u64 {
        assert_eq!(offer(&mut nodes, &mut b, k, 1, None).len(), 1);
    }
    // Node 3 starts now: its numbers begin at 1, the others' at 701.
    let mut late = fresh(3, Dispatch::PacketRr);
    late.cluster_plan(plan12.clone(), Some(1), T);
    let cps = checkpoints(&nodes, &[1, 2]);
    late.cluster_check(&cps);
    let r = late.cluster_report(T).unwrap();
    assert!(!r.in_step() && r.state() == "resyncing", "{}", r.state());
    nodes.push(late);
    for k in 700..1000u64 {
        assert_eq!(offer(&mut nodes, &mut b, k, 1, None).len(), 1, "packet {k}");
    }
    let cps = checkpoints(&nodes, &[1, 2, 3]);
    let lines = nodes[2].cluster_check(&cps);
    assert!(lines[0].contains("behind the other nodes"), "{lines:?}");
    assert!(nodes[2].cluster_report(T).unwrap().in_step());
    // The leader adds it: from the next packet on, three share the work.
    for n in &mut nodes {
        n.cluster_plan(Plan::new(3, [1, 2, 3]), Some(1), T);
    }
    let mut per = [0; 3];
    for k in 1000..1300u64 {
        let s = offer(&mut nodes, &mut b, k, 1, None);
        assert_eq!(s.len(), 1, "packet {k}");
        per[s[0]] += 1;
    }
    assert_eq!(per, [100, 100, 100]);
    assert!(drops(&b).is_empty(), "{:?}", drops(&b));
}

/// The SPI of `e`'s SA in direction `outbound`.
fn spi_of(e: &Engine, outbound: bool) -> u32 {
    let r = e.cluster_report(T).unwrap();
    r.sas.iter().find(|s| s.outbound == outbound).unwrap().spi
}

#[test]
fn a_solo_sa_is_sent_by_its_owner_alone_until_shared_and_late_nodes_catch_up() {
    let mut nodes: Vec<Engine> = (1..=3).map(|i| node(i, Dispatch::PacketRr)).collect();
    let spi = spi_of(&nodes[0], true);
    // Node 1's IKE negotiated it; nodes 2 and 3 install it from etcd, node
    // 3 only after the first 50 packets (it misses them).
    for n in &mut nodes {
        assert_eq!(n.cluster_solo(spi, true, 1, None), Ok(None));
    }
    let mut b = peer();
    for k in 0..400u64 {
        let skip = (k < 50).then_some(2);
        assert_eq!(offer(&mut nodes, &mut b, k, 1, skip), [0], "packet {k}");
    }
    // The followers vote with the owner only: node 3 moves by 50, node 2
    // stays; the owner never moves.
    let cps = checkpoints(&nodes, &[1, 2, 3]);
    assert!(nodes[0].cluster_check(&cps).is_empty());
    assert!(nodes[1].cluster_check(&cps).is_empty());
    let lines = nodes[2].cluster_check(&cps);
    assert!(lines[0].contains("50 packet(s) behind"), "{lines:?}");
    let nexts: Vec<u64> = nodes.iter().map(next_out).collect();
    assert_eq!(nexts, [401, 401, 401]);
    // All are ready: the owner shares from 100 packets ahead.
    let from = nodes[0].cluster_share(spi, true, 100).unwrap();
    assert_eq!(from, 501);
    assert_eq!(nodes[0].cluster_share(spi, true, 7), Ok(501), "shared once");
    for n in &mut nodes[1..] {
        assert_eq!(n.cluster_solo(spi, true, 1, Some(from)), Ok(None));
    }
    let mut per = [0; 3];
    for k in 400..700u64 {
        let s = offer(&mut nodes, &mut b, k, 1, None);
        assert_eq!(s.len(), 1, "packet {k}");
        if k < 500 {
            assert_eq!(s, [0], "packet {k} is before the share");
        }
        per[s[0]] += 1;
    }
    assert_eq!(per, [100 + 67, 67, 66]);
    assert!(drops(&b).is_empty(), "{:?}", drops(&b));
    let r = nodes[1].cluster_report(T).unwrap();
    let sa = r.sas.iter().find(|s| s.outbound).unwrap();
    assert_eq!((sa.solo, sa.share_from), (Some(1), Some(501)));
}

#[test]
fn a_node_that_learns_the_share_too_late_says_what_it_missed() {
    let mut nodes: Vec<Engine> = (1..=2).map(|i| node(i, Dispatch::PacketRr)).collect();
    for n in &mut nodes {
        n.cluster_plan(Plan::new(2, [1, 2]), Some(1), T);
    }
    let spi = spi_of(&nodes[0], false);
    let mut b = peer();
    for n in &mut nodes {
        n.cluster_solo(spi, false, 1, None).unwrap();
    }
    let b_addr: IpAddr = espgate_testkit::B.into();
    let mut send = |nodes: &mut [Engine], k: u64| -> Vec<usize> {
        let mut buf = PacketBuf::with_capacity(2000);
        buf.load(&udp4("10.2.0.9", "10.1.0.5", 40 + (k % 5) as usize));
        assert_eq!(b.outbound(&mut buf, T), Ok(Some(0)));
        let wire = buf.as_slice().to_vec();
        let mut got = Vec::new();
        for (i, n) in nodes.iter_mut().enumerate() {
            let mut x = PacketBuf::with_capacity(2000);
            x.load(&wire);
            if n.inbound(&mut x, T, b_addr) == Ok(Received::Packet) {
                got.push(i);
            }
        }
        got
    };
    for k in 1..=100 {
        assert_eq!(send(&mut nodes, k), [0], "inbound {k} is the owner's");
    }
    // Shared from 110; node 2 hears of it at 120.
    assert_eq!(nodes[0].cluster_share(spi, false, 10), Ok(110));
    for k in 101..=120 {
        let got = send(&mut nodes, k);
        assert!(got.len() <= 1, "{k}: {got:?}");
    }
    let w = nodes[1].cluster_solo(spi, false, 1, Some(110)).unwrap();
    assert!(
        w.as_deref()
            .is_some_and(|w| w.contains("from 110, learnt at 120")),
        "{w:?}"
    );
    for k in 121..=200 {
        assert_eq!(send(&mut nodes, k).len(), 1, "inbound {k}");
    }
}
