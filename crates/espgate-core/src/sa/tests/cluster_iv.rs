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
