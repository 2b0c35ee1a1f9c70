//! Seed 003's flat cluster: nodes sharing one SA (same keys, same salt)
//! must never seal two packets under one AEAD nonce, even when their
//! lockstep sequence numbers diverge because one missed packets.

use super::*;
use std::collections::HashSet;

fn node_sa(suite: &str, node: Option<u16>, esn: bool) -> Sa {
    let mut c = config(suite, Protocol::Esp, Mode::Tunnel, false, false);
    c.esn = esn;
    if let Some(n) = node {
        c.iv_source = IvSource::PerNode { node: n };
    }
    Sa::new(c, T0).unwrap()
}

/// The 8-byte explicit IV of a raw IPv4 tunnel-mode ESP packet.
fn iv_of(wire: &[u8]) -> [u8; 8] {
    wire[20 + 8..20 + 16].try_into().unwrap()
}

#[test]
fn with_the_sequence_as_iv_a_missed_packet_reuses_a_nonce() {
    // The hazard this guards against: node B missed packet 1, so its
    // packet 2 carries A's packet 1 number and IV, with other content.
    let (mut a, mut b) = (
        node_sa("aes128gcm16", None, false),
        node_sa("aes128gcm16", None, false),
    );
    let mut buf = PacketBuf::from_packet(&udp_packet(false, 10, 0));
    a.encapsulate(&mut buf, T0).unwrap();
    let first = iv_of(buf.as_slice());
    let mut buf = PacketBuf::from_packet(&udp_packet(false, 20, 0));
    b.encapsulate(&mut buf, T0).unwrap();
    assert_eq!(
        iv_of(buf.as_slice()),
        first,
        "same key, same nonce, different plaintext"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Three nodes, each sealing a random subset of the stream (dispatch,
    /// and packets some nodes missed, so their sequence numbers diverge):
    /// no IV repeats across all their packets, and one receiver opens them
    /// all.
    #[test]
    fn per_node_ivs_never_repeat_across_nodes(
        suite in prop_oneof![Just("aes128gcm16"), Just("aes256gcm16"), Just("chacha20poly1305")],
        who in proptest::collection::vec(proptest::collection::vec(any::<bool>(), 3), 1..200),
        esn in any::<bool>(),
    ) {
        let mut nodes: Vec<Sa> = (1..=3).map(|n| node_sa(suite, Some(n), esn)).collect();
        let mut rx = node_sa(suite, None, esn);
        let mut ivs = HashSet::new();
        let mut sealed = 0;
        for (k, sends) in who.iter().enumerate() {
            for (i, node) in nodes.iter_mut().enumerate() {
                if !sends[i] {
                    continue;
                }
                let pkt = udp_packet(false, k % 50, 0);
                let mut buf = PacketBuf::from_packet(&pkt);
                node.encapsulate(&mut buf, T0).unwrap();
                let wire = buf.as_slice().to_vec();
                let iv = iv_of(&wire);
                prop_assert_eq!(u16::from_be_bytes([iv[0], iv[1]]), i as u16 + 1);
                prop_assert!(ivs.insert(iv), "IV {:02x?} twice", iv);
                sealed += 1;
                // The receiver reads the IV from the packet: any unique one
                // opens (duplicate sequence numbers are the replay window's
                // business, not the nonce's).
                let Classified::Ipsec(inb) = classify(&wire, &Classifier::NAT_T).unwrap() else {
                    panic!("not ESP");
                };
                let mut rb = PacketBuf::from_packet(&wire);
                match rx.decapsulate(&mut rb, &inb, T0) {
                    Ok(_) => prop_assert_eq!(rb.as_slice(), &pkt[..]),
                    Err(DropReason::Replay) => {}
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
        }
        prop_assert_eq!(ivs.len(), sealed);
    }
}

/// Two nodes share one outbound SA: node 1 seals odd packets, node 2 even
/// ones, each observes the others. Their counters stay in step, and the
/// peer receives every number once, in order.
#[test]
fn observing_nodes_keep_outbound_numbers_in_step() {
    let mut nodes = [
        node_sa("aes128gcm16", Some(1), false),
        node_sa("aes128gcm16", Some(2), false),
    ];
    let mut rx = node_sa("aes128gcm16", None, false);
    let mut dispatcher = crate::cluster::Dispatcher::new(
        crate::cluster::Dispatch::PacketRr,
        crate::cluster::Plan::new(1, [1, 2]),
    );
    for k in 0..40usize {
        let pkt = udp_packet(false, k, 0);
        let counter = nodes[0].next_seq();
        assert_eq!(counter, nodes[1].next_seq(), "lockstep");
        let who = dispatcher
            .assign(&crate::cluster::Seen {
                counter,
                len: pkt.len() as u32,
                flow: None,
            })
            .unwrap();
        let mut wire = None;
        for (i, sa) in nodes.iter_mut().enumerate() {
            if who == i as u16 + 1 {
                let mut b = PacketBuf::from_packet(&pkt);
                sa.encapsulate(&mut b, T0).unwrap();
                wire = Some(b.as_slice().to_vec());
            } else {
                assert_eq!(sa.observe_outbound(pkt.len(), T0).unwrap(), counter);
            }
        }
        let wire = wire.expect("one node sealed it");
        let Classified::Ipsec(inb) = classify(&wire, &Classifier::NAT_T).unwrap() else {
            panic!()
        };
        let mut b = PacketBuf::from_packet(&wire);
        assert_eq!(rx.decapsulate(&mut b, &inb, T0), Ok(Decapsulated::Packet));
        assert_eq!(rx.replay_top(), counter);
    }
    for sa in &nodes {
        assert_eq!(sa.next_seq(), 41);
        assert_eq!(sa.stats().packets + sa.counters().observed.get(), 40);
    }
}

/// Inbound: the node that does not process a packet still checks its ICV
/// and moves its replay window, so every node's window is the same, and a
/// forged or replayed packet moves no window.
#[test]
fn observing_nodes_keep_replay_windows_in_step_and_refuse_forgeries() {
    for suite in ["aes128gcm16", "aes256-sha256"] {
        let mut tx = node_sa(suite, None, false);
        let mut nodes = [node_sa(suite, None, false), node_sa(suite, None, false)];
        for k in 0..20usize {
            let pkt = udp_packet(false, k + 30, 0);
            let mut b = PacketBuf::from_packet(&pkt);
            tx.encapsulate(&mut b, T0).unwrap();
            let wire = b.as_slice().to_vec();
            let Classified::Ipsec(inb) = classify(&wire, &Classifier::NAT_T).unwrap() else {
                panic!()
            };
            for (i, sa) in nodes.iter_mut().enumerate() {
                let mut b = PacketBuf::from_packet(&wire);
                if k % 2 == i {
                    assert_eq!(sa.decapsulate(&mut b, &inb, T0), Ok(Decapsulated::Packet));
                    assert_eq!(b.as_slice(), &pkt[..]);
                } else {
                    assert_eq!(sa.observe_inbound(&mut b, &inb, T0), Ok(k as u64 + 1));
                    if suite.contains('-') {
                        // A separate MAC is checked without decrypting.
                        assert_eq!(b.as_slice(), &wire[..], "{suite}: body left as it came");
                    }
                }
            }
            assert_eq!(nodes[0].replay_top(), nodes[1].replay_top());
            // The same packet again: a replay on both, processed or not.
            for sa in &mut nodes {
                let mut b = PacketBuf::from_packet(&wire);
                assert_eq!(
                    sa.observe_inbound(&mut b, &inb, T0),
                    Err(DropReason::Replay)
                );
            }
        }
        // A forged packet far ahead moves no window.
        let mut b = PacketBuf::from_packet(&udp_packet(false, 10, 0));
        let mut far = node_sa(suite, None, false);
        for _ in 0..5000 {
            far.observe_outbound(10, T0).unwrap();
        }
        far.encapsulate(&mut b, T0).unwrap();
        let mut forged = b.as_slice().to_vec();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        let Classified::Ipsec(inb) = classify(&forged, &Classifier::NAT_T).unwrap() else {
            panic!()
        };
        for sa in &mut nodes {
            let top = sa.replay_top();
            let mut b = PacketBuf::from_packet(&forged);
            assert_eq!(
                sa.observe_inbound(&mut b, &inb, T0),
                Err(DropReason::Integrity)
            );
            assert_eq!(sa.replay_top(), top, "{suite}: a forgery moved the window");
        }
    }
}
