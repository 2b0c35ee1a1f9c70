//! Two engines in memory: full handshakes, rekeys, failures and liveness.

use super::*;
use crate::cert::Identity;
use crate::config::{ChildConfig, IkeConfig, LocalAuth, QespMode, RemoteAuth, Retransmit};
use crate::proposal::ProposalSpec;
use crate::rng::tests::{SeededRng, SwitchRng};
use espgate_core::selector::Prefix;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const A: &str = "192.0.2.1";
const B: &str = "192.0.2.2";

fn pfx(s: &str) -> Prefix {
    let (a, l) = s.split_once('/').unwrap();
    Prefix::new(a.parse().unwrap(), l.parse().unwrap()).unwrap()
}

fn conf(local: &str, remote: &str, ike: &str, esp: &str, lts: &str, rts: &str) -> IkeConfig {
    let psk = Zeroizing::new(b"a test pre-shared key, not secret".to_vec());
    IkeConfig {
        name: "c".into(),
        local: local.parse().unwrap(),
        remote: remote.parse().unwrap(),
        local_id: Identity::parse(local).unwrap(),
        remote_id: Some(Identity::parse(remote).unwrap()),
        local_auth: LocalAuth::Psk(psk.clone()),
        remote_auth: RemoteAuth::Psk(psk),
        proposals: ProposalSpec::parse_list(ProposalKind::Ike, ike).unwrap(),
        child: ChildConfig {
            local_ts: vec![ts::from_prefix(pfx(lts), 0)],
            remote_ts: vec![ts::from_prefix(pfx(rts), 0)],
            mode: Mode::Tunnel,
            proposals: ProposalSpec::parse_list(ProposalKind::Esp, esp).unwrap(),
            qesp: QespMode::Off,
            rekey_time: Duration::ZERO,
            life_time: Duration::ZERO,
            jitter: Duration::ZERO,
            per_cpu_sas: 1,
            more_ts: Vec::new(),
        },
        rekey_time: Duration::ZERO,
        jitter: Duration::ZERO,
        dpd_delay: Duration::ZERO,
        dpd_action: DpdAction::Clear,
        retransmit: Retransmit {
            timeout: Duration::from_secs(1),
            base: 2.0,
            tries: 3,
            limit: Duration::ZERO,
        },
        force_encap: false,
        mobike: true,
    }
}

/// An installed SA: suite name, encryption key, integrity key.
type Keys = (String, Vec<u8>, Vec<u8>);

/// A data plane's SAs by (direction, SPI).
type PlaneSas = BTreeMap<(bool, u32), Keys>;

/// What the data plane of one side holds: SAs by (direction, SPI).
#[derive(Default)]
struct Plane {
    sas: PlaneSas,
    /// The protocol each SA was installed with.
    protocols: BTreeMap<(bool, u32), Protocol>,
    /// The per-CPU slot and the selectors of each outbound SA.
    slots: BTreeMap<u32, (u32, Vec<TrafficSelector>, Vec<TrafficSelector>)>,
    /// The SPI outbound packets use (the last installed outbound SA).
    current_out: Option<u32>,
    log: Vec<String>,
    /// The engine's log lines.
    lines: Vec<(Level, String)>,
    up: u32,
    down: Vec<String>,
}

/// A protected message seen on the way: sent by A (else B), its header and
/// its payloads as the receiver decrypted them.
type Seen = (bool, Header, Vec<Payload>);

struct Pair {
    a: Ike,
    b: Ike,
    pa: Plane,
    pb: Plane,
    now: Duration,
    /// Drop messages from A (or B) while set.
    drop_a: bool,
    drop_b: bool,
    delivered: u32,
    /// When set, every protected message delivered is recorded here.
    seen: Option<Vec<Seen>>,
}

fn apply(e: &mut Ike, p: &mut Plane) {
    while let Some(ev) = e.poll_event() {
        match ev {
            Event::InstallSa(s) => {
                p.log.push(format!(
                    "install {} {:08x}",
                    if s.outbound { "out" } else { "in" },
                    s.spi
                ));
                if s.outbound {
                    // Like the gateway: a new outbound SA replaces the old
                    // one of its per-CPU slot and selectors.
                    p.current_out = Some(s.spi);
                    let slots = &p.slots;
                    p.sas.retain(|(out, spi), _| {
                        !*out
                            || !slots.get(spi).is_some_and(|(k, l, r)| {
                                *k == s.slot
                                    && ts::same(l, &s.local_ts)
                                    && ts::same(r, &s.remote_ts)
                            })
                    });
                    p.slots
                        .insert(s.spi, (s.slot, s.local_ts.clone(), s.remote_ts.clone()));
                }
                p.sas.insert(
                    (s.outbound, s.spi),
                    (s.suite.name(), s.enc_key.to_vec(), s.integ_key.to_vec()),
                );
                p.protocols.insert((s.outbound, s.spi), s.protocol);
            }
            Event::RemoveSa {
                spi,
                outbound,
                protocol,
                ..
            } => {
                assert_eq!(
                    p.protocols.get(&(outbound, spi)),
                    Some(&protocol),
                    "removing {spi:08x} as another protocol than it was installed with"
                );
                p.log.push(format!(
                    "remove {} {:08x}",
                    if outbound { "out" } else { "in" },
                    spi
                ));
                assert!(
                    p.sas.remove(&(outbound, spi)).is_some(),
                    "removing an SA not installed: {spi:08x}"
                );
                if outbound {
                    p.current_out = None;
                }
            }
            Event::IkeUp { .. } => p.up += 1,
            Event::IkeDown { reason, .. } => p.down.push(reason),
            Event::PeerMoved { conn, remote } => p.log.push(format!("moved {conn} {remote}")),
            Event::Log { level, message, .. } => {
                eprintln!("[{level:?}] {message}");
                p.lines.push((level, message));
            }
        }
    }
}

impl Pair {
    fn new(ca: IkeConfig, cb: IkeConfig) -> Pair {
        Pair {
            a: Ike::new(vec![ca], Ports::default()),
            b: Ike::new(vec![cb], Ports::default()),
            pa: Plane::default(),
            pb: Plane::default(),
            now: Duration::from_secs(1000),
            drop_a: false,
            drop_b: false,
            delivered: 0,
            seen: None,
        }
    }

    /// Two engines with seeded generators that fail while their switch
    /// (A's, B's) is on.
    fn with_switches(ca: IkeConfig, cb: IkeConfig) -> (Pair, Arc<AtomicBool>, Arc<AtomicBool>) {
        let mut p = Pair::new(ca.clone(), cb.clone());
        let (ra, fa) = SwitchRng::new(1);
        let (rb, fb) = SwitchRng::new(2);
        p.a = Ike::with_rng(vec![ca], Ports::default(), Box::new(ra));
        p.b = Ike::with_rng(vec![cb], Ports::default(), Box::new(rb));
        (p, fa, fb)
    }

    fn psk(ike: &str, esp: &str) -> Pair {
        Pair::new(
            conf(A, B, ike, esp, "10.1.0.0/16", "10.2.0.0/16"),
            conf(B, A, ike, esp, "10.2.0.0/16", "10.1.0.0/16"),
        )
    }

    /// Delivers messages until both sides are quiet (bounded).
    fn run(&mut self) {
        for _ in 0..200 {
            let mut moved = false;
            while let Some(t) = self.a.poll_transmit() {
                moved = true;
                if !self.drop_a {
                    self.delivered += 1;
                    if let (Some(seen), Some((h, m))) = (&mut self.seen, peek(&self.b, &t.data)) {
                        seen.push((true, h, m));
                    }
                    self.b.handle(self.now, t.remote, t.local, &t.data);
                }
            }
            while let Some(t) = self.b.poll_transmit() {
                moved = true;
                if !self.drop_b {
                    self.delivered += 1;
                    if let (Some(seen), Some((h, m))) = (&mut self.seen, peek(&self.a, &t.data)) {
                        seen.push((false, h, m));
                    }
                    self.a.handle(self.now, t.remote, t.local, &t.data);
                }
            }
            apply(&mut self.a, &mut self.pa);
            apply(&mut self.b, &mut self.pb);
            if !moved {
                return;
            }
        }
        panic!("the engines never went quiet");
    }

    /// Delivers what each side has queued to the other, both queues taken
    /// before either is delivered (so two requests cross); returns how
    /// many A and B had sent.
    fn cross(&mut self) -> (usize, usize) {
        let (ta, tb) = (self.take(true), self.take(false));
        self.deliver(true, &ta);
        self.deliver(false, &tb);
        (ta.len(), tb.len())
    }

    /// What A (`from_a`), else B, has queued, not delivered.
    fn take(&mut self, from_a: bool) -> Vec<Transmit> {
        let e = if from_a { &mut self.a } else { &mut self.b };
        std::iter::from_fn(|| e.poll_transmit()).collect()
    }

    /// Hands `msgs` to B (`to_b`), else A, and applies what follows.
    fn deliver(&mut self, to_b: bool, msgs: &[Transmit]) {
        let (e, plane) = if to_b {
            (&mut self.b, &mut self.pb)
        } else {
            (&mut self.a, &mut self.pa)
        };
        for t in msgs {
            e.handle(self.now, t.remote, t.local, &t.data);
        }
        apply(e, plane);
    }

    /// Advances time to each due timer up to `until`, running exchanges.
    fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        for _ in 0..10_000 {
            let next = [self.a.poll_timeout(), self.b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    self.a.handle_timeout(self.now);
                    self.b.handle_timeout(self.now);
                    self.run();
                }
                _ => {
                    self.now = end;
                    return;
                }
            }
        }
        panic!("timers never settled");
    }

    /// Each side's outbound SA is the other's inbound SA with the same keys.
    fn assert_matched(&self) {
        let (Some(ao), Some(bo)) = (self.pa.current_out, self.pb.current_out) else {
            panic!("no outbound SA: {:?} / {:?}", self.pa.log, self.pb.log);
        };
        assert_eq!(
            self.pa.sas.get(&(true, ao)),
            self.pb.sas.get(&(false, ao)),
            "A->B SA {ao:08x}"
        );
        assert_eq!(
            self.pb.sas.get(&(true, bo)),
            self.pa.sas.get(&(false, bo)),
            "B->A SA {bo:08x}"
        );
        assert_ne!(ao, bo);
    }
}

/// A protected message as `receiver` decrypts it (with whichever of its
/// IKE SAs' keys open it); `None` for clear or fragmented messages.
fn peek(receiver: &Ike, data: &[u8]) -> Option<(Header, Vec<Payload>)> {
    receiver
        .sas
        .iter()
        .find_map(|(_, sa)| sa.sk.as_ref()?.open(data).ok())
}

fn established(e: &Ike) -> usize {
    e.status()
        .iter()
        .filter(|s| s.state == "established")
        .count()
}

#[test]
fn psk_handshake_for_every_group() {
    for (ike, esp) in [
        ("aes128gcm16-prfsha256-x25519", "aes128gcm16"),
        ("aes256-sha256-modp2048", "aes256-sha256"),
        ("aes256gcm16-prfsha384-ecp384", "aes256gcm16-esn"),
        ("chacha20poly1305-prfsha512-ecp256", "chacha20poly1305"),
        ("aes128-sha512-modp3072", "aes128-sha512"),
    ] {
        let mut p = Pair::psk(ike, esp);
        p.a.initiate(p.now, "c").unwrap();
        p.run();
        assert_eq!((established(&p.a), established(&p.b)), (1, 1), "{ike}");
        assert_eq!(p.pa.sas.len(), 2, "{ike}: {:?}", p.pa.log);
        assert_eq!(p.pb.sas.len(), 2);
        p.assert_matched();
        let st = &p.a.status()[0];
        assert_eq!(
            st.algorithms.as_deref(),
            Some(
                ProposalSpec::parse(ProposalKind::Ike, ike)
                    .unwrap()
                    .name()
                    .as_str()
            )
        );
        assert_eq!(st.children.len(), 1);
        assert_eq!(st.peer_id.as_deref(), Some(B));
        let (suite, _, _) = p.pa.sas.values().next().unwrap();
        assert_eq!(
            *suite,
            ProposalSpec::parse(ProposalKind::Esp, esp).unwrap().encr[0]
                .name()
                .to_string()
                + &ProposalSpec::parse(ProposalKind::Esp, esp)
                    .unwrap()
                    .integ
                    .first()
                    .map(|i| format!("-{}", i.name()))
                    .unwrap_or_default()
        );
        // Costs were counted: DH twice per side at least.
        assert!(p.a.costs().ops[&IkeOp::Dh].0 >= 2);
        assert!(p.b.costs().ops[&IkeOp::AuthVerify].0 == 1);
    }
}

#[test]
fn wrong_psk_fails_both_sides() {
    let mut ca = conf(
        A,
        B,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.1.0.0/16",
        "10.2.0.0/16",
    );
    let cb = conf(
        B,
        A,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.2.0.0/16",
        "10.1.0.0/16",
    );
    let other = Zeroizing::new(b"another key".to_vec());
    ca.local_auth = LocalAuth::Psk(other.clone());
    ca.remote_auth = RemoteAuth::Psk(other);
    let mut p = Pair::new(ca, cb);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert!(p.a.status().is_empty() && p.b.status().is_empty());
    assert!(p.pa.sas.is_empty() && p.pb.sas.is_empty());
    assert_eq!(p.b.counter(IkeEvent::AuthFailed), 1);
    assert!(
        p.pa.down
            .iter()
            .any(|r| r.contains("AUTHENTICATION_FAILED")),
        "{:?}",
        p.pa.down
    );
}

#[test]
fn wrong_identity_fails() {
    let mut cb = conf(
        B,
        A,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.2.0.0/16",
        "10.1.0.0/16",
    );
    cb.remote_id = Some(Identity::parse("someone.example").unwrap());
    let ca = conf(
        A,
        B,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.1.0.0/16",
        "10.2.0.0/16",
    );
    let mut p = Pair::new(ca, cb);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert!(p.a.status().is_empty() && p.b.status().is_empty());
    assert_eq!(p.b.counter(IkeEvent::AuthFailed), 1);
}

#[test]
fn no_common_proposal() {
    let mut p = Pair::new(
        conf(
            A,
            B,
            "aes128gcm16-prfsha256-x25519",
            "aes128gcm16",
            "10.1.0.0/16",
            "10.2.0.0/16",
        ),
        conf(
            B,
            A,
            "aes256-sha256-modp2048",
            "aes128gcm16",
            "10.2.0.0/16",
            "10.1.0.0/16",
        ),
    );
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert!(p.a.status().is_empty() && p.b.status().is_empty());
    assert_eq!(p.b.counter(IkeEvent::NoProposalChosen), 1);
    assert!(p.pa.down.iter().any(|r| r.contains("NO_PROPOSAL_CHOSEN")));
}

#[test]
fn invalid_ke_retry_with_the_peers_group() {
    let mut p = Pair::new(
        conf(
            A,
            B,
            "aes128gcm16-prfsha256-x25519-ecp256",
            "aes128gcm16",
            "10.1.0.0/16",
            "10.2.0.0/16",
        ),
        conf(
            B,
            A,
            "aes128gcm16-prfsha256-ecp256",
            "aes128gcm16",
            "10.2.0.0/16",
            "10.1.0.0/16",
        ),
    );
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(p.b.counter(IkeEvent::InvalidKeSent), 1);
    assert_eq!(p.a.counter(IkeEvent::InvalidKeReceived), 1);
    assert_eq!(established(&p.a), 1);
    assert!(p.a.status()[0]
        .algorithms
        .as_deref()
        .unwrap()
        .ends_with("ecp256"));
    p.assert_matched();
}

#[test]
fn cookie_round_trip_under_half_open_pressure() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.b.set_cookie_threshold(0);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(p.b.counter(IkeEvent::CookiesSent), 1);
    assert_eq!(p.a.counter(IkeEvent::CookiesReceived), 1);
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    p.assert_matched();
}

/// An IKE_SA_INIT from an address no connection has is dropped unanswered
/// (no reflection of spoofed floods), and counted.
#[test]
fn init_from_an_unknown_address_is_not_answered() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    let init = p.a.poll_transmit().unwrap();
    let stranger: SocketAddr = "198.51.100.9:500".parse().unwrap();
    for _ in 0..3 {
        p.b.handle(p.now, init.remote, stranger, &init.data);
    }
    assert!(p.b.poll_transmit().is_none());
    assert_eq!(p.b.counter(IkeEvent::DroppedNoConnection), 3);
    assert_eq!(p.b.counter(IkeEvent::CookiesSent), 0);
    // The same request from the configured peer is answered.
    p.b.handle(p.now, init.remote, init.local, &init.data);
    assert!(p.b.poll_transmit().is_some());
}

/// Past the half-open limit, IKE_SA_INIT requests are dropped even with a
/// valid cookie; the initiator's retransmission succeeds once the limit
/// allows it.
#[test]
fn half_open_limit_drops_then_admits() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.b.set_half_open_limit(0);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(p.b.counter(IkeEvent::DroppedHalfOpenLimit), 1);
    assert_eq!(established(&p.b), 0);
    p.b.set_half_open_limit(1);
    p.advance(Duration::from_secs(5));
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    assert!(p.a.counter(IkeEvent::Retransmits) >= 1);
    p.assert_matched();
}

#[test]
fn narrowing_and_ts_unacceptable() {
    // A asks for 10.0.0.0/8 on its side; B accepts only 10.1.0.0/16 there.
    let mut p = Pair::new(
        conf(
            A,
            B,
            "aes128gcm16-prfsha256-x25519",
            "aes128gcm16",
            "10.0.0.0/8",
            "10.2.0.0/16",
        ),
        conf(
            B,
            A,
            "aes128gcm16-prfsha256-x25519",
            "aes128gcm16",
            "10.2.0.0/16",
            "10.1.0.0/16",
        ),
    );
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let ch = &p.a.status()[0].children[0];
    assert_eq!(ch.local_ts, ["10.1.0.0-10.1.255.255"]);
    p.assert_matched();

    let mut p = Pair::new(
        conf(
            A,
            B,
            "aes128gcm16-prfsha256-x25519",
            "aes128gcm16",
            "172.16.0.0/16",
            "10.2.0.0/16",
        ),
        conf(
            B,
            A,
            "aes128gcm16-prfsha256-x25519",
            "aes128gcm16",
            "10.2.0.0/16",
            "10.1.0.0/16",
        ),
    );
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    // The IKE SA stands; no child (§1.2).
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    assert!(p.pa.sas.is_empty() && p.pb.sas.is_empty());
    assert_eq!(p.b.counter(IkeEvent::TsUnacceptable), 1);
}

#[test]
fn lost_response_is_retransmitted_and_replayed() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    // Lose B's IKE_SA_INIT response once.
    while let Some(t) = p.a.poll_transmit() {
        p.b.handle(p.now, t.remote, t.local, &t.data);
    }
    while p.b.poll_transmit().is_some() {}
    p.advance(Duration::from_secs(2));
    assert_eq!(p.a.counter(IkeEvent::Retransmits), 1);
    assert_eq!(p.b.counter(IkeEvent::RetransmittedResponses), 1);
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    // Now lose an IKE_AUTH-era answer: a DPD response.
    let n = p.b.counter(IkeEvent::RetransmittedResponses);
    p.a.sas[0].tasks.push_back(Task::Dpd);
    p.a.kick_now(0, p.now);
    while let Some(t) = p.a.poll_transmit() {
        p.b.handle(p.now, t.remote, t.local, &t.data);
    }
    while p.b.poll_transmit().is_some() {}
    p.advance(Duration::from_secs(2));
    assert_eq!(p.b.counter(IkeEvent::RetransmittedResponses), n + 1);
    assert!(p.a.sas[0].pending.is_none());
}

fn rekeying(ike_rekey: u64, child_rekey: u64) -> Pair {
    let mut ca = conf(
        A,
        B,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16-x25519",
        "10.1.0.0/16",
        "10.2.0.0/16",
    );
    let mut cb = conf(
        B,
        A,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16-x25519",
        "10.2.0.0/16",
        "10.1.0.0/16",
    );
    ca.child.rekey_time = Duration::from_secs(child_rekey);
    ca.child.life_time = Duration::from_secs(child_rekey * 3);
    ca.rekey_time = Duration::from_secs(ike_rekey);
    cb.child.rekey_time = Duration::from_secs(child_rekey * 10);
    cb.child.life_time = Duration::from_secs(child_rekey * 30);
    cb.rekey_time = Duration::from_secs(ike_rekey * 10);
    Pair::new(ca, cb)
}

/// The sizes of every table an engine keeps per SA, SPI or timer.
fn table_sizes(e: &Ike) -> [usize; 9] {
    [
        e.sas.len(),
        e.by_spi.len(),
        e.by_init.len(),
        e.by_conn.iter().map(Vec::len).sum(),
        e.child_spis.len(),
        e.ike_spis.len(),
        e.deadlines.len(),
        e.lingering.len(),
        e.restart_at.len(),
    ]
}

/// Hundreds of child and IKE rekeys leave every table of both engines
/// the size it had after the first few (what a long soak relies on).
#[test]
fn rekeys_leave_no_residue_in_the_tables() {
    let mut p = rekeying(20, 3);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    p.advance(Duration::from_secs(60));
    let (a0, b0) = (table_sizes(&p.a), table_sizes(&p.b));
    let rekeys0 = p.a.counter(IkeEvent::ChildRekeys);
    p.advance(Duration::from_secs(1200));
    assert!(p.a.counter(IkeEvent::ChildRekeys) >= rekeys0 + 300);
    assert!(p.a.counter(IkeEvent::IkeRekeys) >= 50);
    let (a1, b1) = (table_sizes(&p.a), table_sizes(&p.b));
    for (x0, x1) in a0.iter().zip(&a1).chain(b0.iter().zip(&b1)) {
        assert!(
            x1 <= &(x0 + 2),
            "tables grew: A {a0:?} -> {a1:?}, B {b0:?} -> {b1:?}"
        );
    }
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
}

#[test]
fn child_rekey_is_make_before_break() {
    let mut p = rekeying(0, 5);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let old_a_out = p.pa.current_out.unwrap();
    let old_b_out = p.pb.current_out.unwrap();
    p.pb.log.clear();
    for _ in 0..100 {
        if p.a.counter(IkeEvent::ChildRekeys) == 1 {
            break;
        }
        p.advance(Duration::from_millis(100));
    }
    assert_eq!(p.a.counter(IkeEvent::ChildRekeys), 1);
    p.assert_matched();
    assert_ne!(p.pa.current_out, Some(old_a_out));
    assert_ne!(p.pb.current_out, Some(old_b_out));
    // The old child is deleted, but its inbound SAs linger: packets sent
    // on it just before the switch may still be queued behind the Delete.
    assert_eq!(p.pa.sas.len(), 3, "{:?}", p.pa.log);
    assert_eq!(p.pb.sas.len(), 3, "{:?}", p.pb.log);
    assert!(!p.pb.log.iter().any(|x| x.starts_with("remove in")));
    p.advance(REKEYED_INBOUND_LINGER - Duration::from_millis(200));
    assert_eq!(p.pb.sas.len(), 3, "{:?}", p.pb.log);
    p.advance(Duration::from_millis(200));
    // Only the new pair remains on both sides.
    assert_eq!(p.pa.sas.len(), 2, "{:?}", p.pa.log);
    assert_eq!(p.pb.sas.len(), 2, "{:?}", p.pb.log);
    // B (responder) installed its new inbound SA first, switched its
    // outbound only with the deletion of the old SA, then removed the old inbound.
    let l = &p.pb.log;
    assert!(l[0].starts_with("install in "), "{l:?}");
    let out = l.iter().position(|x| x.starts_with("install out")).unwrap();
    let rm = l.iter().position(|x| x.starts_with("remove in")).unwrap();
    assert!(out < rm && out > 0, "{l:?}");
    // PFS: a KE in the rekey means DH operations beyond the handshake.
    assert!(p.a.costs().ops[&IkeOp::Dh].0 >= 4);
    // Many rekeys keep working (seed 001's 5 s lifetime).
    p.advance(Duration::from_secs(60));
    assert!(
        p.a.counter(IkeEvent::ChildRekeys) >= 11,
        "{:?}",
        p.a.counters()
    );
    p.assert_matched();
    assert_eq!(p.pa.sas.len(), 2);
    assert_eq!(p.pb.sas.len(), 2);
}

#[test]
fn ike_rekey_keeps_children() {
    let mut p = rekeying(10, 0);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let spis = (p.a.status()[0].spi_i, p.a.status()[0].spi_r);
    let children_before = p.pa.sas.clone();
    p.advance(Duration::from_secs(11));
    assert_eq!(p.a.counter(IkeEvent::IkeRekeys), 1);
    assert_eq!(p.b.counter(IkeEvent::IkeRekeys), 1);
    let st = p.a.status();
    assert_eq!(st.len(), 1, "old IKE SA deleted");
    assert_ne!((st[0].spi_i, st[0].spi_r), spis);
    assert_eq!(st[0].children.len(), 1);
    assert_eq!(p.pa.sas, children_before, "children untouched");
    assert!(
        p.pa.down.is_empty() && p.pb.down.is_empty(),
        "{:?} {:?}",
        p.pa.down,
        p.pb.down
    );
    // The new SA works: a liveness check and a second rekey.
    p.advance(Duration::from_secs(11));
    assert_eq!(p.a.counter(IkeEvent::IkeRekeys), 2);
    assert_eq!(p.b.status().len(), 1);
}

/// Both sides' child SAs and table sizes before a rekey collision.
struct Before {
    sas: (PlaneSas, PlaneSas),
    sizes: ([usize; 9], [usize; 9]),
}

/// Two engines whose IKE SAs both come up for rekeying 10 s after they
/// are made, and have just sent their rekey requests; with generators
/// seeded from `seed`: the nonces, and so which side's rekey makes the
/// redundant SA in a collision, are reproducible.
fn both_rekey_the_ike_sa(seed: u64) -> (Pair, Before) {
    let mut p = rekeying(10, 0);
    let (ca, mut cb) = (p.a.conns[0].clone(), p.b.conns[0].clone());
    cb.rekey_time = ca.rekey_time;
    p.a = Ike::with_rng(
        vec![ca],
        Ports::default(),
        Box::new(SeededRng::new(2 * seed)),
    );
    p.b = Ike::with_rng(
        vec![cb],
        Ports::default(),
        Box::new(SeededRng::new(2 * seed + 1)),
    );
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let before = Before {
        sas: (p.pa.sas.clone(), p.pb.sas.clone()),
        sizes: (table_sizes(&p.a), table_sizes(&p.b)),
    };
    p.now += Duration::from_secs(10);
    p.a.handle_timeout(p.now);
    p.b.handle_timeout(p.now);
    // No rekey after this one: what is left is what the collision left.
    p.a.conns[0].rekey_time = Duration::ZERO;
    p.b.conns[0].rekey_time = Duration::ZERO;
    (p, before)
}

/// What a rekey collision must leave once the old and redundant SAs are
/// gone: one IKE SA on each side, the same one, holding the child whose
/// SAs are untouched; nothing went down; and no table is larger than it
/// was before, so no SA or reserved SPI leaked.
fn assert_one_ike_sa_left(p: &Pair, before: &Before) {
    let (sa, sb) = (p.a.status(), p.b.status());
    assert_eq!(sa.len(), 1, "A: {sa:#?}");
    assert_eq!(sb.len(), 1, "B: {sb:#?}");
    assert_eq!((sa[0].spi_i, sa[0].spi_r), (sb[0].spi_i, sb[0].spi_r));
    assert_eq!((sa[0].state, sb[0].state), ("established", "established"));
    assert_eq!((sa[0].children.len(), sb[0].children.len()), (1, 1));
    assert_eq!(p.pa.sas, before.sas.0, "A's child SAs changed");
    assert_eq!(p.pb.sas, before.sas.1, "B's child SAs changed");
    assert!(
        p.pa.down.is_empty() && p.pb.down.is_empty(),
        "{:?} {:?}",
        p.pa.down,
        p.pb.down
    );
    let after = (table_sizes(&p.a), table_sizes(&p.b));
    let grown = |x: &[usize; 9], y: &[usize; 9]| x.iter().zip(y).any(|(x, y)| x > y);
    assert!(
        !grown(&after.0, &before.sizes.0) && !grown(&after.1, &before.sizes.1),
        "tables grew: {:?} -> {after:?}",
        before.sizes
    );
}

fn logged(plane: &Plane, what: &str) -> bool {
    plane.lines.iter().any(|(_, l)| l.contains(what))
}

/// RFC 7296 §2.8.2: both sides rekey the IKE SA at once and each sees the
/// other's request before its answer. Each compares the four nonces: the
/// new SA with the lowest is deleted by the side that made it, the other
/// takes the children, and the old SA is deleted. Before, both new SAs
/// stayed (one of them empty) and every later collision doubled them.
#[test]
fn simultaneous_ike_rekey_leaves_one_ike_sa() {
    let (mut ours_lost, mut ours_won) = (0, 0);
    for seed in 0..8 {
        let (mut p, before) = both_rekey_the_ike_sa(seed);
        assert_eq!(p.cross(), (1, 1), "the two rekey requests cross");
        p.run();
        p.advance(OLD_IKE_SA_GRACE + Duration::from_secs(1));
        assert_one_ike_sa_left(&p, &before);
        for (e, plane) in [(&p.a, &p.pa), (&p.b, &p.pb)] {
            assert_eq!(e.counter(IkeEvent::IkeRekeyCollisions), 1);
            assert_eq!(e.counter(IkeEvent::IkeRekeys), 1);
            assert_eq!(plane.up, 2, "one IKE SA up, then one rekey");
        }
        // The two sides agree on whose SA stays.
        let a_lost = logged(&p.pa, "ours lost");
        assert_eq!(a_lost, logged(&p.pb, "ours won"));
        assert_eq!(a_lost, !logged(&p.pa, "ours won"));
        if a_lost {
            ours_lost += 1;
        } else {
            ours_won += 1;
        }
    }
    assert!(ours_lost > 0 && ours_won > 0, "{ours_lost} {ours_won}");
}

/// §2.8.2 when only one side sees the collision: A's rekey finished before
/// B's request reached it, so A refuses B's with TEMPORARY_FAILURE and
/// deletes the old SA; B, which answered A's, keeps A's new SA, whichever
/// of A's refusal and A's Delete reaches it first.
#[test]
fn ike_rekey_collision_seen_by_one_side_leaves_one_ike_sa() {
    for delete_first in [true, false] {
        let (mut p, before) = both_rekey_the_ike_sa(1);
        let (ra, rb) = (p.take(true), p.take(false));
        assert_eq!((ra.len(), rb.len()), (1, 1));
        p.deliver(true, &ra);
        let answer = p.take(false);
        p.deliver(false, &answer);
        // A is done: the old SA's Delete is on its way.
        let delete = p.take(true);
        assert_eq!(delete.len(), 1);
        p.deliver(false, &rb);
        let refusal = p.take(true);
        assert!(
            logged(&p.pa, "refused (TEMPORARY_FAILURE)"),
            "{:?}",
            p.pa.lines
        );
        if delete_first {
            p.deliver(true, &delete);
            p.deliver(true, &refusal);
        } else {
            p.deliver(true, &refusal);
            p.deliver(true, &delete);
        }
        p.run();
        p.advance(OLD_IKE_SA_GRACE + Duration::from_secs(1));
        assert_one_ike_sa_left(&p, &before);
        assert_eq!(p.a.counter(IkeEvent::IkeRekeyCollisions), 0);
    }
}

/// §2.8.2 with the loser's Delete of its redundant SA, or the winner's
/// Delete of the old SA, overtaking the answer to the other rekey: the
/// children stay in place until the collision is decided, so a Delete
/// that arrives early takes none of them down.
#[test]
fn ike_rekey_collision_survives_a_delete_that_overtakes_an_answer() {
    let mut outcomes = BTreeSet::new();
    for seed in 0..8 {
        let (mut p, before) = both_rekey_the_ike_sa(seed);
        assert_eq!(p.cross(), (1, 1));
        // Each side answered the other's request; A gets B's answer first.
        let (answer_a, answer_b) = (p.take(true), p.take(false));
        p.deliver(false, &answer_b);
        let decided = p.take(true);
        assert_eq!(decided.len(), 1, "A deletes one SA");
        // A's Delete reaches B before A's answer to B's rekey.
        p.deliver(true, &decided);
        p.deliver(true, &answer_a);
        p.run();
        p.advance(OLD_IKE_SA_GRACE + Duration::from_secs(1));
        assert_one_ike_sa_left(&p, &before);
        outcomes.insert(logged(&p.pa, "ours lost"));
    }
    assert_eq!(outcomes.len(), 2, "both sides of the nonce comparison");
}

/// Both sides rekey the IKE SA at once; A's request is lost, B's reaches
/// A, which answers it: A's answer (not delivered yet) is returned.
fn a_answers_the_crossing_rekey_only(seed: u64) -> (Pair, Before, Vec<Transmit>) {
    let (mut p, before) = both_rekey_the_ike_sa(seed);
    let (lost, rb) = (p.take(true), p.take(false));
    assert_eq!((lost.len(), rb.len()), (1, 1));
    p.deliver(false, &rb);
    let answer = p.take(true);
    (p, before, answer)
}

/// §2.8.2 when our rekey goes unanswered: the requests cross and A
/// answers B's, but A's request, all its retransmissions and B's Delete of
/// the old SA are lost. When A gives up on its own rekey, the peer is not
/// dead: its rekey, which A answered, stands and takes the children.
/// Before, A declared the peer dead and took the child down.
#[test]
fn unanswered_ike_rekey_crossed_by_the_peers_keeps_the_peers() {
    let (mut p, before, answer) = a_answers_the_crossing_rekey_only(0);
    p.deliver(true, &answer);
    // Nothing gets through until A has given up on its rekey.
    (p.drop_a, p.drop_b) = (true, true);
    p.advance(Duration::from_secs(45));
    assert!(
        logged(&p.pa, "the peer's rekey, which crossed ours, stands"),
        "{:?}",
        p.pa.lines
    );
    (p.drop_a, p.drop_b) = (false, false);
    p.advance(OLD_IKE_SA_GRACE + Duration::from_secs(1));
    assert_one_ike_sa_left(&p, &before);
    // B's Delete of the old SA went unanswered too: that SA had been
    // replaced, so it says nothing about A.
    for e in [&p.a, &p.b] {
        assert_eq!(e.counter(IkeEvent::PeersDead), 0);
    }
}

/// §2.8.2 across a cluster takeover: A dies after answering B's rekey,
/// which crossed its own, and before the answer to its own came. A's
/// request dies with it; the engine that continues A takes B's new SA with
/// the child, so when B, its rekey done, deletes the old SA, the child
/// stays on both sides. Before, the old SA was continued, with the child,
/// and B's Delete of it took the child down.
#[test]
fn a_takeover_during_crossed_ike_rekeys_continues_the_peers_new_sa() {
    for seed in 0..4 {
        let (mut p, before, answer) = a_answers_the_crossing_rekey_only(seed);
        assert_eq!(p.a.status().len(), 2, "the old SA and B's new one");
        p.a.conns[0].rekey_time = Duration::from_secs(3600);
        let snaps = p.a.export(p.now);
        assert_eq!(snaps.len(), 1, "{snaps:?}");
        assert_eq!(snaps[0].children.len(), 1);
        // B's new SA is rekeyed in time, as if it had taken the children
        // here: before, it had no rekey time.
        assert_eq!(snaps[0].rekey_in, Some(Duration::from_secs(3600)));
        p.a.conns[0].rekey_time = Duration::ZERO;
        take_over(&mut p, &snaps[0]);
        p.deliver(true, &answer);
        p.run();
        p.advance(Duration::from_secs(60) + OLD_IKE_SA_GRACE);
        assert_one_ike_sa_left(&p, &before);
        let st = p.a.status();
        assert_eq!((st[0].spi_i, st[0].spi_r), (snaps[0].spi_i, snaps[0].spi_r));
        for e in [&p.a, &p.b] {
            assert_eq!(e.counter(IkeEvent::PeersDead), 0);
        }
        p.assert_matched();
    }
}

/// §2.8.2 across a cluster takeover, both requests through: A dies after
/// answering B's rekey, which crossed its own, and B has A's request too
/// and answers it after the takeover. B compares the nonces. If its own
/// new SA is the redundant one, it keeps A's, which the continued engine
/// cannot finish, and deletes its own, the one the continued engine holds
/// with the children: the continued engine keeps the children and
/// negotiates a new IKE SA at once, whose INITIAL_CONTACT has B drop A's
/// unfinished SA. The old child SAs carry the traffic until the new ones
/// replace them. Before, A took the children down with the deleted SA and
/// B kept an IKE SA that A did not have.
#[test]
fn a_takeover_during_crossed_ike_rekeys_that_the_peer_resolves_for_ours() {
    let mut outcomes = BTreeSet::new();
    for seed in 0..8 {
        let (mut p, before) = both_rekey_the_ike_sa(seed);
        let (ra, rb) = (p.take(true), p.take(false));
        assert_eq!((ra.len(), rb.len()), (1, 1));
        p.deliver(false, &rb);
        let answer = p.take(true);
        let snaps = p.a.export(p.now);
        assert_eq!(snaps.len(), 1, "{snaps:?}");
        assert!(snaps[0].crossed_for.is_some());
        take_over(&mut p, &snaps[0]);
        if seed >= 4 {
            // The continued engine is taken over in turn: what it knows of
            // the crossing goes along.
            let again = p.a.export(p.now);
            assert_eq!(again.len(), 1);
            assert_eq!(again[0].crossed_for, snaps[0].crossed_for);
            take_over(&mut p, &again[0]);
        }
        p.deliver(true, &ra);
        p.deliver(true, &answer);
        p.run();
        p.advance(Duration::from_secs(60) + OLD_IKE_SA_GRACE);
        let ours_kept = logged(&p.pa, "is the one the peer kept");
        outcomes.insert(ours_kept);
        if !ours_kept {
            assert_one_ike_sa_left(&p, &before);
            continue;
        }
        // A new IKE SA, the same on both sides, with one new child each.
        let (sa, sb) = (p.a.status(), p.b.status());
        assert_eq!((sa.len(), sb.len()), (1, 1), "{sa:#?} {sb:#?}");
        assert_eq!((sa[0].spi_i, sa[0].spi_r), (sb[0].spi_i, sb[0].spi_r));
        assert_ne!((sa[0].spi_i, sa[0].spi_r), (snaps[0].spi_i, snaps[0].spi_r));
        assert_eq!((sa[0].children.len(), sb[0].children.len()), (1, 1));
        // B dropped A's unfinished SA and the old one, which A was to
        // delete as its rekey won.
        assert_eq!(p.b.counter(IkeEvent::InitialContactCleared), 2);
        // Nothing went down: the old outbound SA was replaced by the new
        // one, never removed, and the old inbound SA stayed until then.
        assert!(p.pa.down.is_empty() && p.pb.down.is_empty());
        for e in [&p.a, &p.b] {
            assert_eq!(e.counter(IkeEvent::PeersDead), 0);
        }
        assert_replaced_without_gap(&p.pa, 0, &before.sas.0);
        p.assert_matched();
    }
    assert_eq!(outcomes.len(), 2, "both sides of the nonce comparison");
}

/// The child SAs `old` of A's data plane were replaced by new ones
/// without a gap, as A's plane log from entry `from` shows: a new outbound
/// SA installed, the old one never removed (the new one replaced it), and
/// the old inbound SAs kept at least until then.
fn assert_replaced_without_gap(pl: &Plane, from: usize, old: &PlaneSas) {
    let log = &pl.log[from..];
    let at = |what: String| log.iter().position(|l| *l == what);
    let old_out = old.keys().find(|k| k.0).expect("an old outbound SA").1;
    let new_out = pl.current_out.expect("an outbound SA");
    assert_ne!(new_out, old_out, "{log:?}");
    assert_eq!(at(format!("remove out {old_out:08x}")), None, "{log:?}");
    let installed = at(format!("install out {new_out:08x}")).expect("installed");
    for &(_, spi) in old.keys().filter(|k| !k.0) {
        let removed = at(format!("remove in {spi:08x}"));
        assert!(removed.is_none_or(|r| r > installed), "{log:?}");
    }
}

/// The children of the IKE SAs of `e`, by IKE SA.
fn child_counts(e: &Ike) -> Vec<usize> {
    e.status().iter().map(|s| s.children.len()).collect()
}

#[test]
fn ike_rekey_whose_keys_cannot_be_installed_keeps_the_children() {
    // Initiator side: the answer arrives, our new SA cannot be keyed.
    let mut p = rekeying(10, 0);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let st = p.a.status();
    let spis = (st[0].spi_i, st[0].spi_r);
    let planes = (p.pa.sas.clone(), p.pb.sas.clone());
    p.a.fail_key_install = true;
    p.advance(Duration::from_secs(10));
    assert_eq!(p.a.counter(IkeEvent::IkeRekeys), 0);
    let st = p.a.status();
    assert_eq!(st.len(), 1, "{st:?}");
    assert_eq!((st[0].spi_i, st[0].spi_r), spis, "the old SA stays");
    assert_eq!(st[0].state, "established");
    assert_eq!(
        child_counts(&p.a),
        vec![1],
        "the child stays with the old SA"
    );
    assert_eq!(p.pa.sas, planes.0, "no SA removed or lost");
    assert!(p.pa.down.is_empty(), "{:?}", p.pa.down);
    // The rekey is retried later, and then works; the child moves along.
    p.a.fail_key_install = false;
    p.advance(Duration::from_secs(11));
    assert_eq!(p.a.counter(IkeEvent::IkeRekeys), 1);
    assert_eq!(child_counts(&p.a), vec![1]);
    assert_ne!((p.a.status()[0].spi_i, p.a.status()[0].spi_r), spis);
    assert_eq!(p.pa.sas, planes.0);
    assert_eq!(p.pb.sas, planes.1);
    p.assert_matched();

    // Responder side: B cannot key the new SA, so it refuses the rekey
    // (before answering) and keeps its children; A retries.
    let mut p = rekeying(10, 0);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let planes = (p.pa.sas.clone(), p.pb.sas.clone());
    p.b.fail_key_install = true;
    p.advance(Duration::from_secs(10));
    assert_eq!(p.b.counter(IkeEvent::IkeRekeys), 0);
    assert_eq!(p.a.counter(IkeEvent::IkeRekeys), 0);
    assert_eq!(child_counts(&p.b), vec![1]);
    assert_eq!(child_counts(&p.a), vec![1]);
    assert_eq!(p.pb.sas, planes.1);
    p.b.fail_key_install = false;
    p.advance(Duration::from_secs(11));
    assert_eq!(p.b.counter(IkeEvent::IkeRekeys), 1);
    assert_eq!(child_counts(&p.b), vec![1]);
    assert_eq!((p.pa.sas.clone(), p.pb.sas.clone()), planes);
    p.assert_matched();
}

/// Inbound ESP on a child SA counts as hearing from the peer (RFC 7296
/// §2.4): while it keeps coming, no liveness check is sent; once it
/// stops, the checks resume after `dpd_delay`.
#[test]
fn inbound_esp_postpones_liveness_checks() {
    let mut ca = conf(
        A,
        B,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.1.0.0/16",
        "10.2.0.0/16",
    );
    ca.dpd_delay = Duration::from_secs(10);
    let cb = conf(
        B,
        A,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.2.0.0/16",
        "10.1.0.0/16",
    );
    let mut p = Pair::new(ca, cb);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let spi_in = p.a.sas.iter().next().unwrap().1.children[0].spi_in;
    for _ in 0..30 {
        p.advance(Duration::from_secs(1));
        p.a.traffic_received(p.now, &[spi_in]);
    }
    assert_eq!(p.a.counter(IkeEvent::DpdSent), 0);
    // An SPI of no child changes nothing.
    p.advance(Duration::from_secs(11));
    p.a.traffic_received(p.now, &[7]);
    assert_eq!(p.a.counter(IkeEvent::DpdSent), 1);
    assert_eq!(established(&p.a), 1);
}

/// RFC 7296 §2.23: behind a NAT that gives A a new port, B answers A's
/// next request at the new port and reports the move once, so that the
/// data plane sends ESP there too; the float to 4500 during the handshake
/// is not reported.
#[test]
fn a_peer_moved_by_its_nat_is_followed_and_reported() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.conns[0].dpd_delay = Duration::from_secs(10);
    p.a.conns[0].force_encap = true;
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(established(&p.b), 1);
    assert!(
        !p.pb.log.iter().any(|l| l.starts_with("moved")),
        "{:?}",
        p.pb.log
    );
    // The liveness check leaves A from port 4500 and reaches B from 31000.
    p.now += Duration::from_secs(11);
    p.a.handle_timeout(p.now);
    let t = p.a.poll_transmit().expect("a liveness check");
    let nat: SocketAddr = format!("{A}:31000").parse().unwrap();
    p.b.handle(p.now, t.remote, nat, &t.data);
    apply(&mut p.b, &mut p.pb);
    let moved: Vec<&String> = p.pb.log.iter().filter(|l| l.starts_with("moved")).collect();
    assert_eq!(moved, [&format!("moved c {nat}")]);
    let answer = p.b.poll_transmit().expect("the answer");
    assert_eq!(answer.remote, nat);
    // The next message from there is no move.
    p.a.handle(p.now, answer.remote, answer.local, &answer.data);
    p.now += Duration::from_secs(11);
    p.a.handle_timeout(p.now);
    let t = p.a.poll_transmit().expect("the next liveness check");
    p.b.handle(p.now, t.remote, nat, &t.data);
    apply(&mut p.b, &mut p.pb);
    assert_eq!(
        p.pb.log.iter().filter(|l| l.starts_with("moved")).count(),
        1
    );
}

#[test]
fn dpd_detects_a_dead_peer_and_restart_recovers() {
    let mut ca = conf(
        A,
        B,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.1.0.0/16",
        "10.2.0.0/16",
    );
    ca.dpd_delay = Duration::from_secs(10);
    ca.dpd_action = DpdAction::Restart;
    let cb = conf(
        B,
        A,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.2.0.0/16",
        "10.1.0.0/16",
    );
    let mut p = Pair::new(ca, cb);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    p.advance(Duration::from_secs(25));
    assert!(p.a.counter(IkeEvent::DpdSent) >= 2);
    assert_eq!(established(&p.a), 1);
    // B dies (loses its state and stops answering).
    p.b = Ike::new(p.b.conns.clone(), Ports::default());
    p.drop_b = true;
    p.advance(Duration::from_secs(30));
    assert_eq!(p.a.counter(IkeEvent::PeersDead), 1);
    assert!(p.pa.sas.is_empty(), "children removed: {:?}", p.pa.log);
    assert!(p.pa.down.iter().any(|r| r.contains("peer dead")));
    // B comes back: the restart finds it.
    p.drop_b = false;
    p.advance(Duration::from_secs(30));
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    p.assert_matched();
}

#[test]
fn terminate_deletes_both_sides() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert!(
        p.a.initiate(p.now, "c").is_err(),
        "one IKE SA per connection"
    );
    assert!(p.a.terminate(p.now, "nope").is_err());
    p.a.terminate(p.now, "c").unwrap();
    p.run();
    assert!(p.a.status().is_empty() && p.b.status().is_empty());
    assert!(p.pa.sas.is_empty() && p.pb.sas.is_empty());
    assert_eq!(p.pb.down.len(), 1);
}

#[test]
fn simultaneous_child_rekey_leaves_one_pair() {
    for _ in 0..4 {
        let mut p = rekeying(0, 5);
        // Both sides rekey at the same instant.
        p.b.conns[0].child.rekey_time = Duration::from_secs(5);
        p.a.initiate(p.now, "c").unwrap();
        p.run();
        p.now += Duration::from_secs(6);
        p.a.handle_timeout(p.now);
        p.b.handle_timeout(p.now);
        // Cross the two requests before either answer arrives.
        p.cross();
        p.run();
        p.advance(Duration::from_secs(1) + REKEYED_INBOUND_LINGER);
        assert!(
            p.a.counter(IkeEvent::RekeyCollisions) + p.b.counter(IkeEvent::RekeyCollisions) >= 1
        );
        assert_eq!(p.pa.sas.len(), 2, "{:?}", p.pa.log);
        assert_eq!(p.pb.sas.len(), 2, "{:?}", p.pb.log);
        p.assert_matched();
    }
}

#[test]
fn garbage_and_replays_are_counted_not_fatal() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    let first: Vec<Transmit> = std::iter::from_fn(|| p.a.poll_transmit()).collect();
    for t in &first {
        p.b.handle(p.now, t.remote, t.local, &t.data);
    }
    p.run();
    let from = SocketAddr::new(A.parse().unwrap(), 500);
    let to = SocketAddr::new(B.parse().unwrap(), 500);
    for n in 0..200usize {
        let junk: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
        p.b.handle(p.now, to, from, &junk);
    }
    // An old IKE_SA_INIT again: answered from cache or ignored, no new SA.
    p.b.handle(p.now, to, from, &first[0].data);
    assert!(p.b.counter(IkeEvent::DroppedMalformed) > 0);
    assert_eq!(p.b.status().len(), 1);
    assert_eq!(established(&p.b), 1);
}

// ---------------------------------------------------------------------
// Signatures (RFC 7427): raw public keys and certificates
// ---------------------------------------------------------------------

use crate::cert::Certificate;
use crate::sig::{KeyKind, PrivateKey};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/vectors/ike/certs/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn cert(name: &str) -> Certificate {
    Certificate::from_pem(&fixture(name)).unwrap().remove(0)
}

/// A is "moon.example" (P-256 certificate under ca-p256), B is
/// "sun.example" (RSA certificate under ca-rsa); each trusts the other's CA.
fn cert_pair(moon_cert: &str, b_trusts: &str) -> Pair {
    let mut ca = conf(
        A,
        B,
        "aes256gcm16-prfsha384-ecp384",
        "aes256gcm16",
        "10.1.0.0/16",
        "10.2.0.0/16",
    );
    let mut cb = conf(
        B,
        A,
        "aes256gcm16-prfsha384-ecp384",
        "aes256gcm16",
        "10.2.0.0/16",
        "10.1.0.0/16",
    );
    ca.local_id = Identity::parse("moon.example").unwrap();
    ca.remote_id = Some(Identity::parse("sun.example").unwrap());
    cb.local_id = Identity::parse("sun.example").unwrap();
    cb.remote_id = Some(Identity::parse("moon.example").unwrap());
    ca.local_auth = LocalAuth::Signature {
        key: Arc::new(PrivateKey::from_pem(&fixture("p256.key")).unwrap()),
        certs: vec![cert(moon_cert)],
    };
    ca.remote_auth = RemoteAuth::Ca(vec![cert("ca-rsa.crt")]);
    cb.local_auth = LocalAuth::Signature {
        key: Arc::new(PrivateKey::from_pem(&fixture("rsa2048.key")).unwrap()),
        certs: vec![cert("sun-rsa.crt")],
    };
    cb.remote_auth = RemoteAuth::Ca(vec![cert(b_trusts)]);
    let mut p = Pair::new(ca, cb);
    // The fixtures are valid from 2026-11-23 for 100 years: check in 2030.
    p.a.set_unix_time_at_epoch(1_900_000_000);
    p.b.set_unix_time_at_epoch(1_900_000_000);
    p
}

#[test]
fn certificates_under_a_ca() {
    let mut p = cert_pair("moon-p256.crt", "ca-p256.crt");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    assert_eq!(p.a.status()[0].peer_id.as_deref(), Some("sun.example"));
    assert_eq!(p.b.status()[0].peer_id.as_deref(), Some("moon.example"));
    p.assert_matched();
    assert_eq!(p.a.costs().ops[&IkeOp::AuthCreate].0, 1);
    assert_eq!(p.a.costs().ops[&IkeOp::AuthVerify].0, 1);
}

#[test]
fn certificate_of_another_ca_or_identity_is_refused() {
    // moon's certificate from a CA with the right name but another key.
    let mut p = cert_pair("evil-moon.crt", "ca-p256.crt");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert!(p.a.status().is_empty() && p.b.status().is_empty());
    assert_eq!(p.b.counter(IkeEvent::AuthFailed), 1);
    // A valid certificate that does not name the identity A claims.
    let mut p = cert_pair("cnonly-p256.crt", "ca-p256.crt");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert!(p.a.status().is_empty() && p.b.status().is_empty());
    assert_eq!(p.b.counter(IkeEvent::AuthFailed), 1);
}

#[test]
fn raw_public_keys_every_kind() {
    for (ka, kb) in [
        (KeyKind::Ed25519, KeyKind::EcdsaP256),
        (KeyKind::EcdsaP384, KeyKind::Ed25519),
        (KeyKind::EcdsaP256, KeyKind::EcdsaP384),
    ] {
        let (a_key, b_key) = (
            PrivateKey::generate(ka).unwrap(),
            PrivateKey::generate(kb).unwrap(),
        );
        let mut ca = conf(
            A,
            B,
            "aes128gcm16-prfsha256-ecp256",
            "aes128gcm16",
            "10.1.0.0/16",
            "10.2.0.0/16",
        );
        let mut cb = conf(
            B,
            A,
            "aes128gcm16-prfsha256-ecp256",
            "aes128gcm16",
            "10.2.0.0/16",
            "10.1.0.0/16",
        );
        ca.remote_auth = RemoteAuth::PublicKey(b_key.public_key());
        cb.remote_auth = RemoteAuth::PublicKey(a_key.public_key());
        ca.local_auth = LocalAuth::Signature {
            key: Arc::new(a_key),
            certs: vec![],
        };
        cb.local_auth = LocalAuth::Signature {
            key: Arc::new(b_key),
            certs: vec![],
        };
        let mut p = Pair::new(ca, cb);
        p.a.initiate(p.now, "c").unwrap();
        p.run();
        assert_eq!(
            (established(&p.a), established(&p.b)),
            (1, 1),
            "{ka:?}/{kb:?}"
        );
        p.assert_matched();
    }
    // A key B does not expect.
    let mut ca = conf(
        A,
        B,
        "aes128gcm16-prfsha256-ecp256",
        "aes128gcm16",
        "10.1.0.0/16",
        "10.2.0.0/16",
    );
    let mut cb = conf(
        B,
        A,
        "aes128gcm16-prfsha256-ecp256",
        "aes128gcm16",
        "10.2.0.0/16",
        "10.1.0.0/16",
    );
    ca.local_auth = LocalAuth::Signature {
        key: Arc::new(PrivateKey::generate(KeyKind::Ed25519).unwrap()),
        certs: vec![],
    };
    cb.remote_auth =
        RemoteAuth::PublicKey(PrivateKey::generate(KeyKind::Ed25519).unwrap().public_key());
    let mut p = Pair::new(ca, cb);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert!(p.b.status().is_empty());
    assert_eq!(p.b.counter(IkeEvent::AuthFailed), 1);
}

#[test]
fn fragmented_ike_auth_and_rekeys() {
    // Certificates make IKE_AUTH large; a 300-byte fragment size cuts it.
    let mut p = cert_pair("moon-p256.crt", "ca-p256.crt");
    p.a.set_fragment_size(300);
    p.b.set_fragment_size(300);
    p.a.conns[0].child.rekey_time = Duration::from_secs(5);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    assert!(
        p.a.counter(IkeEvent::FragmentedMessagesOut) >= 1,
        "{:?}",
        p.a.counters()
    );
    assert!(p.b.counter(IkeEvent::FragmentedMessagesIn) >= 1);
    assert!(
        p.b.counter(IkeEvent::FragmentedMessagesOut) >= 1,
        "the RSA answer is fragmented too"
    );
    assert!(p.a.counter(IkeEvent::FragmentedMessagesIn) >= 1);
    p.assert_matched();
    p.advance(Duration::from_secs(6));
    assert_eq!(p.a.counter(IkeEvent::ChildRekeys), 1);
    p.assert_matched();

    // A lost fragment of the IKE_AUTH response: A retransmits its request
    // (every fragment), B answers once, from its cache, on fragment 1.
    let mut p = cert_pair("moon-p256.crt", "ca-p256.crt");
    p.a.set_fragment_size(300);
    p.b.set_fragment_size(300);
    p.a.initiate(p.now, "c").unwrap();
    let t = p.a.poll_transmit().unwrap();
    p.b.handle(p.now, t.remote, t.local, &t.data);
    let t = p.b.poll_transmit().unwrap();
    p.a.handle(p.now, t.remote, t.local, &t.data);
    let auth: Vec<Transmit> = std::iter::from_fn(|| p.a.poll_transmit()).collect();
    assert!(auth.len() > 1, "IKE_AUTH request fragmented");
    for t in &auth {
        p.b.handle(p.now, t.remote, t.local, &t.data);
    }
    let answer: Vec<Transmit> = std::iter::from_fn(|| p.b.poll_transmit()).collect();
    assert!(answer.len() > 1, "IKE_AUTH response fragmented");
    for t in &answer[1..] {
        p.a.handle(p.now, t.remote, t.local, &t.data);
    }
    assert_eq!(established(&p.a), 0);
    p.advance(Duration::from_secs(2));
    assert_eq!(p.a.counter(IkeEvent::Retransmits), 1);
    assert_eq!(
        p.b.counter(IkeEvent::RetransmittedResponses),
        1,
        "once, not once per fragment"
    );
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    p.assert_matched();

    // Without fragmentation support on one side, big messages go whole.
    let mut q = cert_pair("moon-p256.crt", "ca-p256.crt");
    q.a.set_fragment_size(300);
    q.b.set_fragment_size(300);
    // B never announces support: strip the notify by having B not see it.
    q.a.initiate(q.now, "c").unwrap();
    let init: Vec<Transmit> = std::iter::from_fn(|| q.a.poll_transmit()).collect();
    let mut m = Message::parse(&init[0].data).unwrap();
    m.payloads.retain(|x| !matches!(x, Payload::Notify(n) if n.notify_type == NotifyType::Ikev2FragmentationSupported));
    // The edited request replaces the original (A's AUTH signs what A sent,
    // so A's stored copy must match: start over from B's answer to it).
    let edited = m.emit().unwrap();
    q.a.sas[0].init_req = edited.clone();
    q.a.sas[0].pending.as_mut().unwrap().data = vec![edited.clone()];
    q.b.handle(q.now, init[0].remote, init[0].local, &edited);
    q.run();
    assert_eq!((established(&q.a), established(&q.b)), (1, 1));
    assert!(q.a.counter(IkeEvent::FragmentedMessagesOut) == 0);
    assert!(q.b.counter(IkeEvent::FragmentedMessagesIn) == 0);
}

// ---------------------------------------------------------------------
// Crafted requests: the error paths behind the integrity check
// ---------------------------------------------------------------------

/// Seals `payloads` as A's next request on its IKE SA and hands it to B;
/// returns B's decrypted answer (None if B did not answer).
fn crafted(
    p: &mut Pair,
    exch: ExchangeType,
    payloads: Vec<Payload>,
    id_offset: u32,
) -> Option<Vec<Payload>> {
    let id = p.a.sas[0].next_out_id + id_offset;
    let h = p.a.sas[0].header(exch, false, id);
    let data = p.a.sas[0].sk.as_mut().unwrap().seal(&h, &payloads).unwrap();
    if id_offset == 0 {
        p.a.sas[0].next_out_id += 1;
    }
    let (local, remote) = (p.a.sas[0].local, p.a.sas[0].remote);
    p.b.handle(p.now, remote, local, &data);
    let t = p.b.poll_transmit()?;
    Some(p.a.sas[0].sk.as_ref().unwrap().open(&t.data).unwrap().1)
}

fn notify_of(p: &[Payload]) -> Option<(NotifyType, Vec<u8>)> {
    p.iter().find_map(|x| match x {
        Payload::Notify(n) => Some((n.notify_type, n.data.clone())),
        _ => None,
    })
}

#[test]
fn crafted_requests_get_the_right_error_notifies() {
    let mut p = rekeying(0, 0);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let a_in = p.a.sas[0].children[0].spi_in;
    let ts = |p: &Pair| {
        (
            Payload::TsI(p.a.conns[0].child.local_ts.clone()),
            Payload::TsR(p.a.conns[0].child.remote_ts.clone()),
        )
    };
    let rekey_notify = |spi: u32| {
        Payload::Notify(Notify {
            protocol: protocol::ESP,
            spi: spi.to_be_bytes().to_vec(),
            notify_type: NotifyType::RekeySa,
            data: vec![],
        })
    };
    let esp = |p: &Pair, spi: u32, pfs: bool| Payload::Sa(p.a.child_proposals(0, spi, pfs));

    let esp_78 = esp(&p, 0x1234_5678, false);
    let esp_79 = esp(&p, 0x1234_5679, true);
    let esp_7a = esp(&p, 0x1234_567a, false);

    // An unknown payload with the critical bit.
    let ans = crafted(
        &mut p,
        ExchangeType::Informational,
        vec![Payload::Unknown {
            payload_type: PayloadType::from(200),
            critical: true,
            body: vec![1],
        }],
        0,
    )
    .unwrap();
    assert_eq!(
        notify_of(&ans),
        Some((NotifyType::UnsupportedCriticalPayload, vec![200]))
    );

    // Rekeying a child SA that does not exist.
    let (tsi, tsr) = ts(&p);
    let ans = crafted(
        &mut p,
        ExchangeType::CreateChildSa,
        vec![
            rekey_notify(0xdead_beef),
            esp_78.clone(),
            Payload::Nonce(vec![5; 32]),
            tsi,
            tsr,
        ],
        0,
    )
    .unwrap();
    assert_eq!(
        notify_of(&ans).map(|n| n.0),
        Some(NotifyType::ChildSaNotFound)
    );

    // A PFS KE payload of a group B does not use: INVALID_KE_PAYLOAD naming x25519.
    let ke = KeyExchange::generate(Group::Ecp256, &mut SystemRng).unwrap();
    let (tsi, tsr) = ts(&p);
    let ans = crafted(
        &mut p,
        ExchangeType::CreateChildSa,
        vec![
            rekey_notify(a_in),
            esp_79.clone(),
            Payload::Nonce(vec![6; 32]),
            Payload::Ke {
                group: Group::Ecp256.id(),
                data: ke.public_value().to_vec(),
            },
            tsi,
            tsr,
        ],
        0,
    )
    .unwrap();
    assert_eq!(
        notify_of(&ans),
        Some((
            NotifyType::InvalidKePayload,
            Group::Curve25519.id().to_be_bytes().to_vec()
        ))
    );

    // Selectors outside B's: TS_UNACCEPTABLE (a new child, not a rekey).
    let other = ts::from_prefix(pfx("172.16.0.0/12"), 0);
    let ans = crafted(
        &mut p,
        ExchangeType::CreateChildSa,
        vec![
            esp_7a.clone(),
            Payload::Nonce(vec![7; 32]),
            Payload::TsI(vec![other.clone()]),
            Payload::TsR(vec![other]),
        ],
        0,
    )
    .unwrap();
    assert_eq!(
        notify_of(&ans).map(|n| n.0),
        Some(NotifyType::TsUnacceptable)
    );

    // No acceptable ESP proposal.
    let chacha = ProposalSpec::parse(ProposalKind::Esp, "chacha20poly1305")
        .unwrap()
        .to_wire(1, &[1, 2, 3, 4], Some(&[]));
    let (tsi, tsr) = ts(&p);
    let ans = crafted(
        &mut p,
        ExchangeType::CreateChildSa,
        vec![
            Payload::Sa(vec![chacha]),
            Payload::Nonce(vec![8; 32]),
            tsi,
            tsr,
        ],
        0,
    )
    .unwrap();
    assert_eq!(
        notify_of(&ans).map(|n| n.0),
        Some(NotifyType::NoProposalChosen)
    );

    // A Delete naming no SA of B: an empty answer, nothing removed.
    let ans = crafted(
        &mut p,
        ExchangeType::Informational,
        vec![Payload::Delete(Delete::Child {
            protocol: protocol::ESP,
            spis: vec![7],
        })],
        0,
    )
    .unwrap();
    assert!(ans.is_empty());
    assert_eq!(p.b.status()[0].children.len(), 1);

    // A message ID ahead of the window: dropped without an answer.
    let before = p.b.counter(IkeEvent::DroppedBadMessageId);
    assert!(crafted(&mut p, ExchangeType::Informational, vec![], 5).is_none());
    assert_eq!(p.b.counter(IkeEvent::DroppedBadMessageId), before + 1);

    // A tampered message: dropped silently (RFC 7296 §2.21.2).
    let id = p.a.sas[0].next_out_id;
    let h = p.a.sas[0].header(ExchangeType::Informational, false, id);
    let mut data = p.a.sas[0].sk.as_mut().unwrap().seal(&h, &[]).unwrap();
    let n = data.len();
    data[n - 1] ^= 1;
    p.b.handle(p.now, p.a.sas[0].remote, p.a.sas[0].local, &data);
    assert!(p.b.poll_transmit().is_none());
    assert_eq!(p.b.counter(IkeEvent::DroppedIntegrity), 1);

    // Through all this the SAs stayed up and in step.
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    p.assert_matched();
}

#[test]
fn child_rekey_invalid_ke_retries_with_the_peers_pfs_group() {
    let mut ca = conf(
        A,
        B,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16-x25519-ecp256",
        "10.1.0.0/16",
        "10.2.0.0/16",
    );
    let cb = conf(
        B,
        A,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16-ecp256",
        "10.2.0.0/16",
        "10.1.0.0/16",
    );
    ca.child.rekey_time = Duration::from_secs(5);
    let mut p = Pair::new(ca, cb);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    p.advance(Duration::from_secs(7));
    assert_eq!(p.a.counter(IkeEvent::InvalidKeReceived), 1);
    assert_eq!(
        p.a.counter(IkeEvent::ChildRekeys),
        1,
        "{:?}",
        p.a.counters()
    );
    assert_eq!(p.a.status()[0].children[0].algorithms, "aes128gcm16-ecp256");
    p.assert_matched();
}

/// Found by the ike_engine fuzzer: `terminate`, then `initiate` while the
/// old IKE SA is still being deleted (its Delete lost), then `terminate`
/// again. The old SA's child must not remove the outbound SA the new child
/// replaced (the harness asserts every removal names an installed SA).
#[test]
fn initiate_while_the_old_sa_is_deleting() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    p.a.terminate(p.now, "c").unwrap();
    p.a.initiate(p.now, "c").unwrap();
    // The Delete is lost; the new IKE_SA_INIT goes through.
    let t: Vec<Transmit> = std::iter::from_fn(|| p.a.poll_transmit()).collect();
    assert_eq!(t.len(), 2);
    p.b.handle(p.now, t[1].remote, t[1].local, &t[1].data);
    p.run();
    assert_eq!(
        p.a.status().len(),
        2,
        "the old SA (deleting) and the new one"
    );
    p.assert_matched();
    p.a.terminate(p.now, "c").unwrap();
    p.run();
    p.advance(Duration::from_secs(60));
    assert!(p.a.status().is_empty());
    assert!(p.pa.sas.is_empty(), "{:?}", p.pa.log);
}

/// A peer that restarted (all state lost) sends INITIAL_CONTACT: the
/// responder drops the stale IKE SA and its children at once instead of
/// waiting for DPD.
#[test]
fn initial_contact_clears_the_stale_sa() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let old = p.b.status()[0].children[0].spi_in;
    // A restarts: a new engine, a fresh data plane.
    p.a = Ike::new(p.a.conns.clone(), Ports::default());
    p.pa = Plane::default();
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let st = p.b.status();
    assert_eq!(st.len(), 1, "only the new IKE SA");
    assert_ne!(st[0].children[0].spi_in, old);
    assert_eq!(p.b.counter(IkeEvent::InitialContactCleared), 1);
    assert_eq!(p.pb.sas.len(), 2, "{:?}", p.pb.log);
    assert!(p.pb.down.is_empty(), "the connection stayed up");
    p.assert_matched();
}

/// The IKE_SA_INIT request or response in `t`, parsed.
fn init_nonce(t: &Transmit) -> Option<Vec<u8>> {
    let m = Message::parse(&t.data).ok()?;
    m.payloads.iter().find_map(|x| match x {
        Payload::Nonce(n) => Some(n.clone()),
        _ => None,
    })
}

/// Warnings among the events queued by `e` (the events are consumed).
fn warnings(e: &mut Ike) -> Vec<String> {
    let mut w = Vec::new();
    while let Some(ev) = e.poll_event() {
        if let Event::Log {
            level: Level::Warn,
            message,
            ..
        } = ev
        {
            w.push(message);
        }
    }
    w
}

#[test]
fn a_failing_random_generator_fails_closed() {
    let (mut p, fail_a, fail_b) = Pair::with_switches(
        conf(
            A,
            B,
            "aes128gcm16-prfsha256-x25519",
            "aes128gcm16",
            "10.1.0.0/16",
            "10.2.0.0/16",
        ),
        conf(
            B,
            A,
            "aes128gcm16-prfsha256-x25519",
            "aes128gcm16",
            "10.2.0.0/16",
            "10.1.0.0/16",
        ),
    );

    // Initiator: no IKE_SA_INIT leaves (not with a zero nonce, not at
    // all), the command says why, the failure is counted and logged.
    fail_a.store(true, Ordering::SeqCst);
    let e = p.a.initiate(p.now, "c").unwrap_err();
    assert!(e.0.contains("random number generator"), "{e}");
    assert!(
        p.a.poll_transmit().is_none(),
        "a message left without randomness"
    );
    assert_eq!(p.a.counter(IkeEvent::RngFailures), 1);
    assert_eq!(p.a.counter(IkeEvent::IkeInitSent), 0);
    assert!(p.a.status().is_empty());
    let w = warnings(&mut p.a);
    assert!(
        w.iter()
            .any(|m| m.contains("random number generator failed")),
        "{w:?}"
    );
    assert_eq!(p.a.poll_timeout(), None, "nothing half-made is left behind");

    // Responder: the request is not answered (the initiator retransmits).
    fail_a.store(false, Ordering::SeqCst);
    fail_b.store(true, Ordering::SeqCst);
    p.a.initiate(p.now, "c").unwrap();
    let t = p.a.poll_transmit().unwrap();
    let ni = init_nonce(&t).unwrap();
    assert!(ni.iter().any(|b| *b != 0), "a zero nonce");
    p.b.handle(p.now, t.remote, t.local, &t.data);
    assert!(
        p.b.poll_transmit().is_none(),
        "an answer left without randomness"
    );
    assert_eq!(p.b.counter(IkeEvent::RngFailures), 1);
    assert_eq!(p.b.counter(IkeEvent::IkeInitAnswered), 0);
    assert!(p.b.status().is_empty());
    // The generator recovers: the retransmission is answered.
    fail_b.store(false, Ordering::SeqCst);
    p.advance(Duration::from_secs(2));
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    p.assert_matched();

    // A CREATE_CHILD_SA request the responder cannot draw a nonce for is
    // refused with TEMPORARY_FAILURE; nothing is installed.
    let a_in = p.a.sas[0].children[0].spi_in;
    let installed_b = p.pb.sas.len();
    fail_b.store(true, Ordering::SeqCst);
    p.a.sas[0].tasks.push_back(Task::RekeyChild(a_in));
    p.a.kick_now(0, p.now);
    p.run();
    assert_eq!(p.b.counter(IkeEvent::RngFailures), 2);
    assert_eq!(p.pb.sas.len(), installed_b);
    assert_eq!(p.a.counter(IkeEvent::ChildRekeys), 0);
    assert_eq!(p.a.sas[0].children[0].state, ChildState::Installed);
    fail_b.store(false, Ordering::SeqCst);

    // Our own rekey without randomness is not sent and is retried later.
    fail_a.store(true, Ordering::SeqCst);
    let sent = p.a.counter(IkeEvent::MessagesOut);
    p.a.sas[0].children[0].rekey_at = None;
    p.a.sas[0].tasks.push_back(Task::RekeyChild(a_in));
    p.a.sas[0].tasks.push_back(Task::RekeyIke);
    p.a.kick_now(0, p.now);
    assert_eq!(
        p.a.counter(IkeEvent::MessagesOut),
        sent,
        "sent without randomness"
    );
    assert_eq!(p.a.counter(IkeEvent::RngFailures), 3);
    assert_eq!(p.a.sas[0].children[0].state, ChildState::Installed);
    assert_eq!(p.a.sas[0].children[0].rekey_at, Some(p.now + RETRY_DELAY));
    assert_eq!(p.a.sas[0].rekey_at, Some(p.now + RETRY_DELAY));
    fail_a.store(false, Ordering::SeqCst);
    p.advance(RETRY_DELAY + Duration::from_secs(1));
    assert_eq!(p.a.counter(IkeEvent::ChildRekeys), 1);
    assert_eq!(p.a.counter(IkeEvent::IkeRekeys), 1);
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    p.assert_matched();
}

/// Deletes every child of `e`'s first IKE SA (our INFORMATIONAL Delete).
fn delete_children(p: &mut Pair, a_side: bool) {
    let e = if a_side { &mut p.a } else { &mut p.b };
    let spis: Vec<u32> = e.sas[0].children.iter().map(|c| c.spi_in).collect();
    for s in spis {
        e.sas[0].tasks.push_back(Task::DeleteChild(s));
    }
    e.kick_now(0, p.now);
    p.run();
}

#[test]
fn a_new_child_sa_on_an_established_ike_sa_with_and_without_pfs() {
    for esp in ["aes128gcm16-x25519", "aes256gcm16-ecp256", "aes128gcm16"] {
        let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", esp);
        p.a.initiate(p.now, "c").unwrap();
        p.run();
        let ike = (p.a.status()[0].spi_i, p.a.status()[0].spi_r);
        // A's child goes (like `swanctl --terminate --child`), then A
        // asks for a new one on the same IKE SA.
        delete_children(&mut p, true);
        assert_eq!(child_counts(&p.a), vec![0], "{esp}");
        assert_eq!(child_counts(&p.b), vec![0], "{esp}");
        assert!(p.pa.sas.is_empty() && p.pb.sas.is_empty(), "{esp}");
        p.a.initiate(p.now, "c").unwrap();
        p.run();
        assert_eq!(p.a.counter(IkeEvent::ChildFailed), 0, "{esp}");
        assert_eq!(p.a.counter(IkeEvent::ChildrenEstablished), 2, "{esp}");
        assert_eq!(p.b.counter(IkeEvent::ChildrenEstablished), 2, "{esp}");
        assert_eq!(child_counts(&p.a), vec![1], "{esp}");
        assert_eq!(child_counts(&p.b), vec![1], "{esp}");
        assert_eq!(
            (p.a.status()[0].spi_i, p.a.status()[0].spi_r),
            ike,
            "same IKE SA"
        );
        // Same keys both ways: with PFS both derived them with the new
        // g^ir (RFC 7296 §2.17), which needs KEr in the answer.
        p.assert_matched();
        // A second initiate while the child lives is refused.
        assert!(p.a.initiate(p.now, "c").is_err());

        // The other way round: B (the IKE responder) creates the child.
        delete_children(&mut p, false);
        assert_eq!(child_counts(&p.a), vec![0], "{esp}");
        p.b.initiate(p.now, "c").unwrap();
        p.run();
        assert_eq!(p.b.counter(IkeEvent::ChildFailed), 0, "{esp}");
        assert_eq!(child_counts(&p.a), vec![1], "{esp}");
        assert_eq!(child_counts(&p.b), vec![1], "{esp}");
        p.assert_matched();
    }
}

#[test]
fn crafted_create_child_sa_without_rekey_sa_gets_nonce_and_ke() {
    let mut p = rekeying(0, 0);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let (tsi, tsr) = (
        Payload::TsI(p.a.conns[0].child.local_ts.clone()),
        Payload::TsR(p.a.conns[0].child.remote_ts.clone()),
    );
    let ke = KeyExchange::generate(Group::Curve25519, &mut SystemRng).unwrap();
    let ni = vec![7u8; 32];
    let sa = Payload::Sa(p.a.child_proposals(0, 0x1234_5679, true));
    let ans = crafted(
        &mut p,
        ExchangeType::CreateChildSa,
        vec![
            sa,
            Payload::Nonce(ni.clone()),
            Payload::Ke {
                group: Group::Curve25519.id(),
                data: ke.public_value().to_vec(),
            },
            tsi.clone(),
            tsr.clone(),
        ],
        0,
    )
    .unwrap();
    assert_eq!(notify_of(&ans), None, "{ans:?}");
    let nr = get_nonce(&ans).expect("Nr (RFC 7296 §1.3.1)").to_vec();
    assert_ne!(nr, ni);
    let (kg, kr) = get_ke(&ans).expect("KEr: the request had KEi");
    assert_eq!(kg, Group::Curve25519.id());
    let g_ir = ke.agree(kr).unwrap();
    let answer = get_sa(&ans).unwrap();
    assert_eq!(answer.len(), 1);
    let b_in = spi4(&answer[0].spi).unwrap();
    assert!(get_ts(&ans).is_some());
    // B installed the child with keys from the new shared secret.
    apply(&mut p.b, &mut p.pb);
    assert_eq!(p.b.counter(IkeEvent::ChildrenEstablished), 2);
    let chosen = p.b.sas[0].chosen.unwrap();
    let child = p.b.sas[0]
        .children
        .iter()
        .find(|c| c.spi_in == b_in)
        .unwrap();
    let keys = derive_child_keys(
        chosen.prf.unwrap(),
        &p.a.sas[0].sk_d,
        Some(&g_ir),
        &ni,
        &nr,
        child.chosen.key_lens(),
    )
    .unwrap();
    let (_, enc, _) = p.pb.sas.get(&(false, b_in)).unwrap();
    assert_eq!(
        enc,
        &keys.enc_i.to_vec(),
        "B's inbound = i->r keys with g^ir"
    );
    let (_, enc_out, _) = p.pb.sas.get(&(true, 0x1234_5679)).unwrap();
    assert_eq!(enc_out, &keys.enc_r.to_vec());

    // Without KEi (B's proposals allow no PFS only if it has no groups:
    // this pair has them, so use one without): Nr, and no KEr.
    let mut q = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    q.a.initiate(q.now, "c").unwrap();
    q.run();
    let sa = Payload::Sa(q.a.child_proposals(0, 0x1234_567a, false));
    let ans = crafted(
        &mut q,
        ExchangeType::CreateChildSa,
        vec![sa, Payload::Nonce(vec![8u8; 32]), tsi, tsr],
        0,
    )
    .unwrap();
    assert_eq!(notify_of(&ans), None, "{ans:?}");
    assert!(get_nonce(&ans).is_some_and(|n| n != [8u8; 32]), "Nr");
    assert!(get_ke(&ans).is_none(), "no KEr without KEi");
    assert_eq!(q.b.counter(IkeEvent::ChildrenEstablished), 2);
}

/// An IKE_SA_INIT request of another initiator at A's address (its own
/// SPI), handed to B at `at`; B's answer is discarded.
fn foreign_init(p: &mut Pair, seed: u64, at: Duration) -> Ike {
    let mut e = Ike::with_rng(
        vec![conf(
            A,
            B,
            "aes128gcm16-prfsha256-x25519",
            "aes128gcm16",
            "10.1.0.0/16",
            "10.2.0.0/16",
        )],
        Ports::default(),
        Box::new(SeededRng::new(seed)),
    );
    e.initiate(at, "c").unwrap();
    let t = e.poll_transmit().unwrap();
    p.b.handle(at, t.remote, t.local, &t.data);
    assert!(p.b.poll_transmit().is_some(), "answered");
    e
}

#[test]
fn sa_handles_stay_put_and_messages_route_by_spi() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    let now = p.now;
    let _others: Vec<Ike> = (0..3).map(|n| foreign_init(&mut p, 10 + n, now)).collect();
    assert_eq!((p.b.sas.len(), p.b.half_open), (3, 3));
    assert_eq!((p.b.by_spi.len(), p.b.by_init.len()), (3, 3));
    let handles: Vec<usize> = p.b.sas.iter().map(|(i, _)| i).collect();
    let spis: Vec<u64> = handles.iter().map(|&h| p.b.sas[h].spi_r).collect();

    // Removing the first SA moves no other: same handles, same index entries.
    p.b.destroy(handles[0], "test".into(), false);
    p.b.rearm_dirty();
    assert!(!p.b.by_spi.contains_key(&spis[0]));
    for (h, spi) in handles.iter().zip(&spis).skip(1) {
        assert_eq!(p.b.by_spi[spi], *h);
        assert_eq!(p.b.sas[*h].spi_r, *spi);
    }
    assert_eq!((p.b.half_open, p.b.by_init.len()), (2, 2));

    // A's handshake runs next to them, each message found by its SPI; the
    // new SA may take the freed slot. A's INITIAL_CONTACT then clears the
    // other half-open SAs of the connection.
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    assert_eq!(p.b.counter(IkeEvent::InitialContactCleared), 2);
    let (h, sa) = p.b.sas.iter().next().unwrap();
    assert_eq!(p.b.sas.len(), 1);
    assert_eq!(p.b.by_spi.get(&sa.spi_r), Some(&h));
    assert_eq!(p.b.by_conn[0], vec![h]);
    assert_eq!(p.b.half_open, 0);
    // A message for a removed SA's SPI is not routed anywhere.
    let mut data = vec![0u8; 28];
    data[0..8].copy_from_slice(&sa.spi_i.wrapping_add(1).to_be_bytes());
    data[8..16].copy_from_slice(&spis[1].to_be_bytes());
    data[17] = 0x20;
    data[18] = u8::from(ExchangeType::Informational);
    data[19] = 0x08;
    data[24..28].copy_from_slice(&28u32.to_be_bytes());
    let before = p.b.counter(IkeEvent::DroppedUnknownSpi);
    p.b.handle(
        p.now,
        p.a.sas[h_a(&p)].remote,
        p.a.sas[h_a(&p)].local,
        &data,
    );
    assert_eq!(p.b.counter(IkeEvent::DroppedUnknownSpi), before + 1);
    p.assert_matched();
}

/// A's only SA.
fn h_a(p: &Pair) -> usize {
    p.a.sas.iter().next().unwrap().0
}

#[test]
fn each_sa_has_its_timers_and_only_due_sas_are_visited() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    let t0 = p.now;
    let s = Duration::from_secs;
    let _others: Vec<Ike> = (0..3)
        .map(|n| foreign_init(&mut p, 20 + n, t0 + s(10 * n)))
        .collect();
    assert_eq!(p.b.poll_timeout(), Some(t0 + HALF_OPEN_TIMEOUT));
    assert_eq!(p.b.deadlines.len(), 3);
    // Nothing due yet: no SA visited.
    p.b.handle_timeout(t0 + s(29));
    assert_eq!(p.b.timer_visits, 0);
    // The first expires alone.
    p.b.handle_timeout(t0 + HALF_OPEN_TIMEOUT);
    assert_eq!(p.b.timer_visits, 1);
    assert_eq!(p.b.counter(IkeEvent::HalfOpenExpired), 1);
    assert_eq!(p.b.sas.len(), 2);
    assert_eq!(p.b.poll_timeout(), Some(t0 + s(10) + HALF_OPEN_TIMEOUT));
    // Both others at once.
    p.b.handle_timeout(t0 + s(60));
    assert_eq!(p.b.timer_visits, 3);
    assert_eq!(p.b.sas.len(), 0);
    assert!(p.b.deadlines.is_empty());
    assert_eq!(p.b.poll_timeout(), None);

    // An established pair with DPD: its deadline follows the traffic.
    let mut ca = conf(
        A,
        B,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.1.0.0/16",
        "10.2.0.0/16",
    );
    ca.dpd_delay = s(20);
    let cb = conf(
        B,
        A,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.2.0.0/16",
        "10.1.0.0/16",
    );
    let mut p = Pair::new(ca, cb);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let h = h_a(&p);
    assert_eq!(p.a.sas[h].timers.get(Timer::Dpd), Some(p.now + s(20)));
    assert_eq!(p.a.poll_timeout(), Some(p.now + s(20)));
    p.advance(s(21));
    assert_eq!(p.a.counter(IkeEvent::DpdSent), 1);
    // The answer moved the deadline on; retransmission is not armed.
    assert_eq!(
        p.a.sas[h].timers.get(Timer::Dpd),
        Some(p.now - s(1) + s(20))
    );
    assert_eq!(p.a.sas[h].timers.get(Timer::Retransmit), None);
}

// ---------------------------------------------------------------------
// Q-ESP child SAs (docs/QESP.md §7)
// ---------------------------------------------------------------------

const Q: u8 = protocol::QESP;
const E: u8 = protocol::ESP;

/// Two PSK connections with two ESP proposals, PFS in rekeys, and `qesp`
/// set to `a` on A and `b` on B; every protected message is recorded.
fn qesp_pair(a: QespMode, b: QespMode) -> Pair {
    let esp = "aes128gcm16-x25519,aes256-sha256-x25519";
    let ike = "aes128gcm16-prfsha256-x25519";
    let mut ca = conf(A, B, ike, esp, "10.1.0.0/16", "10.2.0.0/16");
    let mut cb = conf(B, A, ike, esp, "10.2.0.0/16", "10.1.0.0/16");
    ca.child.qesp = a;
    cb.child.qesp = b;
    let mut p = Pair::new(ca, cb);
    p.seen = Some(Vec::new());
    p
}

/// The protocols of the SAs one side's data plane holds.
fn plane_protocols(pl: &Plane) -> Vec<Protocol> {
    pl.sas.keys().map(|k| pl.protocols[k]).collect()
}

/// The recorded messages of one exchange type, sent by A (`from_a`) or B,
/// requests (`response` false) or responses.
fn seen_of(p: &Pair, exch: ExchangeType, from_a: bool, response: bool) -> Vec<Vec<Payload>> {
    p.seen
        .as_ref()
        .unwrap()
        .iter()
        .filter(|(a, h, _)| *a == from_a && h.exchange_type == exch && h.response == response)
        .map(|(_, _, m)| m.clone())
        .collect()
}

/// The (number, Protocol ID) of each proposal of a message's SA payload.
fn sa_protocols(m: &[Payload]) -> Vec<(u8, u8)> {
    get_sa(m)
        .unwrap_or_default()
        .iter()
        .map(|p| (p.number, p.protocol))
        .collect()
}

fn info_lines(pl: &Plane, needle: &str) -> usize {
    pl.lines
        .iter()
        .filter(|(l, m)| *l == Level::Info && m.contains(needle))
        .count()
}

fn child_protocols(e: &Ike) -> Vec<Protocol> {
    e.status()
        .iter()
        .flat_map(|s| s.children.iter().map(|c| c.protocol))
        .collect()
}

#[test]
fn qesp_prefer_on_both_sides_negotiates_qesp() {
    let mut p = qesp_pair(QespMode::Prefer, QespMode::Prefer);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    // A offers Q-ESP (201) first, then ESP, numbered on across both.
    let req = seen_of(&p, ExchangeType::IkeAuth, true, false);
    assert_eq!(sa_protocols(&req[0]), [(1, Q), (2, Q), (3, E), (4, E)]);
    // B chooses A's first Q-ESP proposal and says so.
    let resp = seen_of(&p, ExchangeType::IkeAuth, false, true);
    assert_eq!(sa_protocols(&resp[0]), [(1, Q)]);
    // Both data planes hold Q-ESP SAs only, keyed alike.
    assert_eq!(plane_protocols(&p.pa), [Protocol::Qesp; 2]);
    assert_eq!(plane_protocols(&p.pb), [Protocol::Qesp; 2]);
    p.assert_matched();
    assert_eq!(child_protocols(&p.a), [Protocol::Qesp]);
    assert_eq!(child_protocols(&p.b), [Protocol::Qesp]);
    assert_eq!(p.a.status()[0].children[0].algorithms, "aes128gcm16");
    assert_eq!(info_lines(&p.pa, "Q-ESP declined"), 0);
    assert_eq!(info_lines(&p.pa, "(Q-ESP aes128gcm16)"), 1);

    // "require" on both sides, or against "prefer": Q-ESP alone is offered
    // by a requiring initiator, and chosen.
    for (a, b) in [
        (QespMode::Require, QespMode::Require),
        (QespMode::Require, QespMode::Prefer),
        (QespMode::Prefer, QespMode::Require),
    ] {
        let mut p = qesp_pair(a, b);
        p.a.initiate(p.now, "c").unwrap();
        p.run();
        let req = seen_of(&p, ExchangeType::IkeAuth, true, false);
        let want: &[(u8, u8)] = if a == QespMode::Require {
            &[(1, Q), (2, Q)]
        } else {
            &[(1, Q), (2, Q), (3, E), (4, E)]
        };
        assert_eq!(sa_protocols(&req[0]), want, "{a:?}/{b:?}");
        assert_eq!(plane_protocols(&p.pa), [Protocol::Qesp; 2], "{a:?}/{b:?}");
        assert_eq!(plane_protocols(&p.pb), [Protocol::Qesp; 2], "{a:?}/{b:?}");
        p.assert_matched();
    }
}

#[test]
fn qesp_prefer_against_off_runs_esp_and_says_so() {
    let mut p = qesp_pair(QespMode::Prefer, QespMode::Off);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    let req = seen_of(&p, ExchangeType::IkeAuth, true, false);
    assert_eq!(sa_protocols(&req[0]), [(1, Q), (2, Q), (3, E), (4, E)]);
    // B ignores the proposals of protocol 201 and picks A's first ESP one.
    let resp = seen_of(&p, ExchangeType::IkeAuth, false, true);
    assert_eq!(sa_protocols(&resp[0]), [(3, E)]);
    assert_eq!(plane_protocols(&p.pa), [Protocol::Esp; 2]);
    assert_eq!(plane_protocols(&p.pb), [Protocol::Esp; 2]);
    p.assert_matched();
    assert_eq!(child_protocols(&p.a), [Protocol::Esp]);
    assert_eq!(info_lines(&p.pa, "Q-ESP declined"), 1, "{:?}", p.pa.lines);
    assert_eq!(p.a.counter(IkeEvent::ChildFailed), 0);
    assert_eq!(p.b.counter(IkeEvent::NoProposalChosen), 0);
}

#[test]
fn qesp_off_initiator_against_prefer_responder_runs_esp() {
    let mut p = qesp_pair(QespMode::Off, QespMode::Prefer);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    // A with qesp = "off" offers exactly what it offered before Q-ESP:
    // the ESP proposals, numbered from 1, protocol 3.
    let req = seen_of(&p, ExchangeType::IkeAuth, true, false);
    let offered = get_sa(&req[0]).unwrap().to_vec();
    let spi = offered[0].spi.clone();
    let before: Vec<wire::Proposal> = p.a.conns[0]
        .child
        .proposals
        .iter()
        .enumerate()
        .map(|(n, s)| s.to_wire(n as u8 + 1, &spi, Some(&[])))
        .collect();
    assert_eq!(offered, before);
    assert_eq!(sa_protocols(&req[0]), [(1, E), (2, E)]);
    assert_eq!(plane_protocols(&p.pa), [Protocol::Esp; 2]);
    assert_eq!(plane_protocols(&p.pb), [Protocol::Esp; 2]);
    p.assert_matched();
    // B would have preferred Q-ESP, and says why it runs ESP.
    assert_eq!(info_lines(&p.pb, "no Q-ESP"), 1, "{:?}", p.pb.lines);
}

#[test]
fn qesp_require_against_off_fails_the_child() {
    for (a, b) in [
        (QespMode::Require, QespMode::Off),
        (QespMode::Off, QespMode::Require),
    ] {
        let mut p = qesp_pair(a, b);
        p.a.initiate(p.now, "c").unwrap();
        p.run();
        // The IKE SA stands; the child SA does not.
        assert_eq!(
            (established(&p.a), established(&p.b)),
            (1, 1),
            "{a:?}/{b:?}"
        );
        assert_eq!(child_counts(&p.a), vec![0]);
        assert_eq!(child_counts(&p.b), vec![0]);
        assert!(p.pa.sas.is_empty() && p.pb.sas.is_empty());
        assert_eq!(p.b.counter(IkeEvent::NoProposalChosen), 1);
        assert_eq!(p.a.counter(IkeEvent::ChildFailed), 1);
        let resp = seen_of(&p, ExchangeType::IkeAuth, false, true);
        assert_eq!(
            notify_of(&resp[0]).map(|n| n.0),
            Some(NotifyType::NoProposalChosen)
        );
        // No retry: "require" never falls back, and "off" has nothing else.
        assert!(seen_of(&p, ExchangeType::CreateChildSa, true, false).is_empty());
        p.advance(Duration::from_secs(60));
        assert_eq!(p.a.counter(IkeEvent::ChildFailed), 1);
    }
}

#[test]
fn qesp_child_rekey_stays_qesp() {
    let mut p = qesp_pair(QespMode::Prefer, QespMode::Prefer);
    p.a.conns[0].child.rekey_time = Duration::from_secs(5);
    p.a.conns[0].child.life_time = Duration::from_secs(15);
    p.b.conns[0].child.rekey_time = Duration::from_secs(50);
    p.b.conns[0].child.life_time = Duration::from_secs(150);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let old_in = p.a.sas[0].children[0].spi_in;
    p.advance(Duration::from_secs(6) + REKEYED_INBOUND_LINGER);
    assert_eq!(p.a.counter(IkeEvent::ChildRekeys), 1);
    // The rekey names the old child with Q-ESP's Protocol ID, offers
    // Q-ESP first again (with PFS), and the new child is Q-ESP.
    let req = seen_of(&p, ExchangeType::CreateChildSa, true, false);
    let rekey = find_notify(&req[0], NotifyType::RekeySa).unwrap();
    assert_eq!((rekey.protocol, spi4(&rekey.spi)), (Q, Some(old_in)));
    assert_eq!(sa_protocols(&req[0]), [(1, Q), (2, Q), (3, E), (4, E)]);
    assert!(get_ke(&req[0]).is_some());
    let resp = seen_of(&p, ExchangeType::CreateChildSa, false, true);
    assert_eq!(sa_protocols(&resp[0]), [(1, Q)]);
    // The old child's Delete is Q-ESP's too.
    let dels: Vec<Delete> = seen_of(&p, ExchangeType::Informational, true, false)
        .into_iter()
        .flatten()
        .filter_map(|x| match x {
            Payload::Delete(d) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(
        dels,
        [Delete::Child {
            protocol: Q,
            spis: vec![old_in]
        }]
    );
    // Only the new pair is left, Q-ESP on both sides, and many rekeys on
    // it stays so.
    assert_eq!(
        plane_protocols(&p.pa),
        [Protocol::Qesp; 2],
        "{:?}",
        p.pa.log
    );
    assert_eq!(
        plane_protocols(&p.pb),
        [Protocol::Qesp; 2],
        "{:?}",
        p.pb.log
    );
    p.assert_matched();
    p.advance(Duration::from_secs(30));
    assert!(p.a.counter(IkeEvent::ChildRekeys) >= 6);
    assert_eq!(plane_protocols(&p.pa), [Protocol::Qesp; 2]);
    assert_eq!(plane_protocols(&p.pb), [Protocol::Qesp; 2]);
    assert_eq!(child_protocols(&p.a), [Protocol::Qesp]);
    p.assert_matched();
    assert_eq!(p.a.counter(IkeEvent::ChildFailed), 0);
    assert_eq!(p.b.counter(IkeEvent::ChildFailed), 0);

    // With "prefer" a rekey may fall back: the peer now runs with "off".
    p.b.conns[0].child.qesp = QespMode::Off;
    p.advance(Duration::from_secs(6));
    assert_eq!(plane_protocols(&p.pa), [Protocol::Esp; 2], "{:?}", p.pa.log);
    assert_eq!(plane_protocols(&p.pb), [Protocol::Esp; 2], "{:?}", p.pb.log);
    assert_eq!(child_protocols(&p.a), [Protocol::Esp]);
    p.assert_matched();
    assert!(info_lines(&p.pa, "Q-ESP declined") >= 1);
}

#[test]
fn qesp_child_delete_carries_protocol_201_and_removes_it_on_the_peer() {
    let mut p = qesp_pair(QespMode::Prefer, QespMode::Prefer);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let (a_in, b_in) = (p.a.sas[0].children[0].spi_in, p.b.sas[0].children[0].spi_in);
    p.seen = Some(Vec::new());
    delete_children(&mut p, true);
    let req = seen_of(&p, ExchangeType::Informational, true, false);
    assert_eq!(
        req,
        [vec![Payload::Delete(Delete::Child {
            protocol: Q,
            spis: vec![a_in]
        })]]
    );
    // B removes its child and answers with its own SPI, as Q-ESP.
    let resp = seen_of(&p, ExchangeType::Informational, false, true);
    assert_eq!(
        resp,
        [vec![Payload::Delete(Delete::Child {
            protocol: Q,
            spis: vec![b_in]
        })]]
    );
    assert_eq!(child_counts(&p.a), vec![0]);
    assert_eq!(child_counts(&p.b), vec![0]);
    assert!(p.pa.sas.is_empty() && p.pb.sas.is_empty());
    assert!(
        p.pb.log.contains(&format!("remove in {b_in:08x}")),
        "{:?}",
        p.pb.log
    );

    // A Delete naming the SPI under ESP's Protocol ID is not this child's.
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(child_protocols(&p.b), [Protocol::Qesp]);
    let a_in = p.a.sas[0].children[0].spi_in;
    let ans = crafted(
        &mut p,
        ExchangeType::Informational,
        vec![Payload::Delete(Delete::Child {
            protocol: E,
            spis: vec![a_in],
        })],
        0,
    )
    .unwrap();
    assert!(ans.is_empty(), "{ans:?}");
    assert_eq!(child_counts(&p.b), vec![1]);
}

#[test]
fn qesp_refused_as_a_whole_falls_back_to_esp() {
    // A peer that does not know Protocol ID 201 may refuse the whole SA
    // payload. Here B sees A's ESP proposals as an unknown protocol too, so
    // it answers IKE_AUTH with NO_PROPOSAL_CHOSEN; A then asks for an ESP
    // child alone.
    let mut p = qesp_pair(QespMode::Prefer, QespMode::Off);
    p.a.initiate(p.now, "c").unwrap();
    let t = p.a.poll_transmit().unwrap();
    p.b.handle(p.now, t.remote, t.local, &t.data);
    let t = p.b.poll_transmit().unwrap();
    p.a.handle(p.now, t.remote, t.local, &t.data);
    let t = p.a.poll_transmit().unwrap();
    let (h, mut payloads) = peek(&p.b, &t.data).unwrap();
    assert_eq!(h.exchange_type, ExchangeType::IkeAuth);
    for x in &mut payloads {
        if let Payload::Sa(props) = x {
            for pr in props.iter_mut().filter(|pr| pr.protocol == E) {
                pr.protocol = 202;
            }
        }
    }
    let ha = h_a(&p);
    let data = p.a.sas[ha]
        .sk
        .as_mut()
        .unwrap()
        .seal(&h, &payloads)
        .unwrap();
    p.b.handle(p.now, t.remote, t.local, &data);
    p.run();
    assert_eq!(p.b.counter(IkeEvent::NoProposalChosen), 1);
    assert_eq!(info_lines(&p.pa, "Q-ESP declined"), 1, "{:?}", p.pa.lines);
    // The retry: a CREATE_CHILD_SA with ESP proposals alone.
    let req = seen_of(&p, ExchangeType::CreateChildSa, true, false);
    assert_eq!(req.len(), 1);
    assert_eq!(sa_protocols(&req[0]), [(1, E), (2, E)]);
    assert_eq!(child_protocols(&p.a), [Protocol::Esp]);
    assert_eq!(plane_protocols(&p.pa), [Protocol::Esp; 2]);
    assert_eq!(plane_protocols(&p.pb), [Protocol::Esp; 2]);
    p.assert_matched();
    assert!(p.a.sas[ha].qesp_declined);
    // Later rekeys of that IKE SA's children propose ESP alone too.
    p.a.sas[ha].children[0].rekey_at = Some(p.now);
    p.a.kick_now(ha, p.now);
    p.advance(Duration::from_secs(1));
    let req = seen_of(&p, ExchangeType::CreateChildSa, true, false);
    assert_eq!(req.len(), 2, "{:?}", p.pa.log);
    assert_eq!(sa_protocols(&req[1]), [(1, E), (2, E)]);
    p.assert_matched();
}

#[test]
fn qesp_is_not_offered_across_a_nat() {
    // force_encap: both sides see a NAT. Q-ESP's ICV covers the outer
    // addresses, so "prefer" offers and accepts ESP alone.
    let mut p = qesp_pair(QespMode::Prefer, QespMode::Prefer);
    p.a.conns[0].force_encap = true;
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert!(p.a.status()[0].nat);
    let req = seen_of(&p, ExchangeType::IkeAuth, true, false);
    assert_eq!(sa_protocols(&req[0]), [(1, E), (2, E)]);
    assert_eq!(plane_protocols(&p.pa), [Protocol::Esp; 2]);
    p.assert_matched();
    // A requiring responder behind the NAT refuses, and says why.
    let mut p = qesp_pair(QespMode::Require, QespMode::Require);
    p.a.conns[0].force_encap = true;
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(child_counts(&p.a), vec![0]);
    assert!(
        p.pb.lines
            .iter()
            .any(|(l, m)| *l == Level::Warn && m.contains("NAT")),
        "{:?}",
        p.pb.lines
    );
}

// ---------------------------------------------------------------------
// IKE SAs continued on another engine (seed 003's cluster takeover)
// ---------------------------------------------------------------------

/// `e`'s only SA.
fn only_sa(e: &Ike) -> usize {
    assert_eq!(e.sas.len(), 1, "{:?}", e.status());
    e.sas.iter().next().unwrap().0
}

/// A's engine dies; a new one with the same configuration continues
/// `snap` (through its JSON, as a cluster carries it). A's data plane
/// stays: it has the child SAs already.
fn take_over(p: &mut Pair, snap: &IkeSnapshot) {
    while p.a.poll_transmit().is_some() {}
    let json = serde_json::to_string(snap).unwrap();
    let snap: IkeSnapshot = serde_json::from_str(&json).unwrap();
    p.a = Ike::new(p.a.conns.clone(), Ports::default());
    p.a.import(p.now, &snap).unwrap();
    apply(&mut p.a, &mut p.pa);
}

/// The data plane events (installs, removals) of a side so far.
fn plane_events(pl: &Plane) -> usize {
    pl.log.len()
}

/// Starts `task` on `e`'s only SA.
fn run_task(p: &mut Pair, a_side: bool, task: Task) {
    let e = if a_side { &mut p.a } else { &mut p.b };
    let i = only_sa(e);
    e.sas[i].tasks.push_back(task);
    e.kick_now(i, p.now);
    p.run();
}

#[test]
fn a_continued_ike_sa_answers_rekeys_and_checks_liveness_without_a_handshake() {
    for (ike, esp, a_initiates) in [
        ("aes128gcm16-prfsha256-x25519", "aes128gcm16-x25519", true),
        ("aes256-sha256-modp2048", "aes256-sha256", false),
        ("chacha20poly1305-prfsha512-ecp256", "aes256gcm16-esn", true),
    ] {
        let mut p = Pair::psk(ike, esp);
        if a_initiates {
            p.a.initiate(p.now, "c").unwrap();
        } else {
            p.b.initiate(p.now, "c").unwrap();
        }
        p.run();
        p.advance(Duration::from_secs(3));
        let snaps = p.a.export(p.now);
        assert_eq!(snaps.len(), 1);
        assert_eq!(snaps[0].initiator, a_initiates);
        assert_eq!(snaps[0].children.len(), 1);
        let events = plane_events(&p.pa);
        let b_inits = p.b.counter(IkeEvent::IkeInitAnswered) + p.b.counter(IkeEvent::IkeInitSent);
        p.advance(Duration::from_secs(2));
        take_over(&mut p, &snaps[0]);
        assert_eq!(p.a.counter(IkeEvent::IkeSasContinued), 1);
        assert!(
            info_lines(&p.pa, "continued from the cluster's previous leader") == 1,
            "{:?}",
            p.pa.lines
        );
        let st = &p.a.status()[0];
        assert_eq!(st.state, "established");
        assert_eq!(st.peer_id.as_deref(), Some(B));
        assert_eq!((st.spi_i, st.spi_r), (snaps[0].spi_i, snaps[0].spi_r));
        assert_eq!(st.children.len(), 1);

        // (i) The liveness check goes out at once and B answers it.
        p.run();
        assert_eq!(p.a.counter(IkeEvent::DpdSent), 1, "{ike}");
        let ha = only_sa(&p.a);
        assert!(p.a.sas[ha].pending.is_none(), "{ike}: DPD unanswered");
        assert!(!p.a.sas[ha].continued);
        assert_eq!(plane_events(&p.pa), events, "{ike}: no SA installed");
        assert_eq!(p.b.counter(IkeEvent::DroppedIntegrity), 0);
        assert_eq!(p.b.counter(IkeEvent::DroppedBadMessageId), 0);
        p.assert_matched();

        // (ii) A child rekey by the new engine, then one by B.
        let spi = p.a.sas[ha].children[0].spi_in;
        run_task(&mut p, true, Task::RekeyChild(spi));
        p.advance(Duration::from_secs(2));
        assert_eq!(
            p.a.counter(IkeEvent::ChildRekeys),
            1,
            "{ike}: {:?}",
            p.pa.lines
        );
        p.assert_matched();
        assert_eq!(p.pa.sas.len(), 2, "{:?}", p.pa.log);
        assert_eq!(p.pb.sas.len(), 2, "{:?}", p.pb.log);
        let hb = only_sa(&p.b);
        let spi = p.b.sas[hb].children[0].spi_in;
        let b_rekeys = p.b.counter(IkeEvent::ChildRekeys);
        run_task(&mut p, false, Task::RekeyChild(spi));
        p.advance(Duration::from_secs(2));
        assert_eq!(p.b.counter(IkeEvent::ChildRekeys), b_rekeys + 1, "{ike}");
        assert_eq!(p.a.counter(IkeEvent::ChildRekeys), 2, "{ike}");
        p.assert_matched();
        assert_eq!(p.pa.sas.len(), 2, "{:?}", p.pa.log);
        assert_eq!(p.pb.sas.len(), 2, "{:?}", p.pb.log);

        // (iii) An IKE SA rekey by the new engine, then one by B.
        run_task(&mut p, true, Task::RekeyIke);
        p.run();
        assert_eq!(
            p.a.counter(IkeEvent::IkeRekeys),
            1,
            "{ike}: {:?}",
            p.pa.lines
        );
        assert_eq!(p.b.status().len(), 1, "{ike}: B's old IKE SA deleted");
        let st = p.a.status();
        assert_eq!(st.len(), 1);
        assert_ne!((st[0].spi_i, st[0].spi_r), (snaps[0].spi_i, snaps[0].spi_r));
        assert_eq!(st[0].children.len(), 1);
        let b_ike_rekeys = p.b.counter(IkeEvent::IkeRekeys);
        run_task(&mut p, false, Task::RekeyIke);
        p.run();
        assert_eq!(p.b.counter(IkeEvent::IkeRekeys), b_ike_rekeys + 1);
        assert_eq!((p.a.status().len(), p.b.status().len()), (1, 1));

        // (iv) B's liveness check is answered.
        let hb = only_sa(&p.b);
        run_task(&mut p, false, Task::Dpd);
        assert!(p.b.sas[hb].pending.is_none());
        p.advance(Duration::from_secs(60));
        assert_eq!(
            p.a.counter(IkeEvent::PeersDead) + p.b.counter(IkeEvent::PeersDead),
            0
        );
        assert!(p.pa.down.is_empty() && p.pb.down.is_empty());
        p.assert_matched();
        // Never a new handshake.
        assert_eq!(
            p.b.counter(IkeEvent::IkeInitAnswered) + p.b.counter(IkeEvent::IkeInitSent),
            b_inits
        );
        assert_eq!(p.a.counter(IkeEvent::IkeInitSent), 0);
    }
}

#[test]
fn a_snapshot_an_exchange_behind_still_continues() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let snap = p.a.export(p.now).remove(0);
    // The old leader goes on for one exchange each way before it dies.
    run_task(&mut p, true, Task::Dpd);
    run_task(&mut p, false, Task::Dpd);
    let hb = only_sa(&p.b);
    assert_eq!(p.b.sas[hb].next_in_id, snap.next_out_id + 1);
    assert_eq!(p.b.sas[hb].next_out_id, snap.next_in_id + 1);
    let cached = p.b.counter(IkeEvent::RetransmittedResponses);
    take_over(&mut p, &snap);
    p.run();
    // Our liveness check reused the ID of the old leader's last request:
    // B answered from its cache, which is the answer.
    assert_eq!(p.b.counter(IkeEvent::RetransmittedResponses), cached + 1);
    let ha = only_sa(&p.a);
    assert!(p.a.sas[ha].pending.is_none());
    assert_eq!(p.a.sas[ha].next_out_id, snap.next_out_id + 1);
    // B's next request is one past what the snapshot expects: taken once.
    run_task(&mut p, false, Task::Dpd);
    assert!(p.b.sas[hb].pending.is_none(), "B's DPD unanswered");
    assert_eq!(p.a.counter(IkeEvent::MessageIdResyncs), 1);
    assert!(!p.a.sas[ha].resync_in);
    assert_eq!(info_lines(&p.pa, "message IDs resynchronised"), 1);
    // Then everything goes on as usual.
    let spi = p.a.sas[ha].children[0].spi_in;
    run_task(&mut p, true, Task::RekeyChild(spi));
    let spi = p.b.sas[hb].children[0].spi_in;
    run_task(&mut p, false, Task::RekeyChild(spi));
    p.advance(Duration::from_secs(2));
    assert_eq!(p.a.counter(IkeEvent::ChildRekeys), 2);
    p.assert_matched();
    assert_eq!(p.pa.sas.len(), 2, "{:?}", p.pa.log);
    run_task(&mut p, true, Task::RekeyIke);
    assert_eq!(p.a.counter(IkeEvent::IkeRekeys), 1);
    run_task(&mut p, false, Task::Dpd);
    assert_eq!(p.a.counter(IkeEvent::MessageIdResyncs), 1);
    assert_eq!(p.a.counter(IkeEvent::DroppedBadMessageId), 0);
    assert!(p.pa.down.is_empty() && p.pb.down.is_empty());
}

#[test]
fn a_stale_snapshot_is_found_out_and_the_connection_negotiated_anew() {
    // dpd_action = clear: a continued SA the peer does not answer is
    // negotiated anew all the same (it stood for that negotiation).
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let snap = p.a.export(p.now).remove(0);
    // Two more exchanges of ours: B no longer has the ID we reuse cached.
    run_task(&mut p, true, Task::Dpd);
    run_task(&mut p, true, Task::Dpd);
    take_over(&mut p, &snap);
    let old = p.pa.sas.clone();
    let events = plane_events(&p.pa);
    p.advance(Duration::from_secs(16));
    assert_eq!(p.a.counter(IkeEvent::PeersDead), 1);
    assert!(p.b.counter(IkeEvent::DroppedBadMessageId) >= 1);
    assert!(
        logged(&p.pa, "is stale or the peer dead"),
        "{:?}",
        p.pa.lines
    );
    // Negotiated anew at once, the continued children kept meanwhile: the
    // new outbound SA replaced the old one, which was never removed, and
    // B dropped its old IKE SA and children for INITIAL_CONTACT. Before,
    // the children went down with the stale SA, 5 s before the new
    // negotiation even started.
    assert_eq!(p.a.counter(IkeEvent::IkeInitSent), 1);
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    assert_eq!(p.b.counter(IkeEvent::InitialContactCleared), 1);
    assert!(p.pa.down.is_empty(), "{:?}", p.pa.down);
    assert_replaced_without_gap(&p.pa, events, &old);
    p.advance(OLD_IKE_SA_GRACE);
    assert_eq!(p.a.status().len(), 1);
    assert!(
        old.keys().all(|k| !p.pa.sas.contains_key(k)),
        "{:?}",
        p.pa.log
    );
    p.assert_matched();
}

/// The state published before the old leader rekeyed the IKE SA: the peer
/// no longer knows the continued SA, but still has its children, moved to
/// the new IKE SA. The new leader negotiates anew and keeps the children
/// until the new ones replace them; the peer drops the SA it had for
/// INITIAL_CONTACT.
#[test]
fn a_snapshot_from_before_an_ike_rekey_keeps_the_children_until_replaced() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let snap = p.a.export(p.now).remove(0);
    run_task(&mut p, true, Task::RekeyIke);
    assert_eq!(p.a.counter(IkeEvent::IkeRekeys), 1);
    let children = p.pa.sas.clone();
    take_over(&mut p, &snap);
    let events = plane_events(&p.pa);
    p.advance(Duration::from_secs(60));
    assert!(
        logged(&p.pa, "is stale or the peer dead"),
        "{:?}",
        p.pa.lines
    );
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    assert_eq!(p.b.counter(IkeEvent::InitialContactCleared), 1);
    assert!(p.pa.down.is_empty(), "{:?}", p.pa.down);
    assert_replaced_without_gap(&p.pa, events, &children);
    p.advance(OLD_IKE_SA_GRACE);
    assert!(children.keys().all(|k| !p.pa.sas.contains_key(k)));
    p.assert_matched();
}

#[test]
fn a_continued_ike_sa_goes_on_with_its_timers() {
    let mut p = rekeying(40, 20);
    p.a.conns[0].dpd_delay = Duration::from_secs(10);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    p.advance(Duration::from_secs(8));
    let snap = p.a.export(p.now).remove(0);
    take_over(&mut p, &snap);
    p.run();
    let ha = only_sa(&p.a);
    // The remaining times, not the whole intervals again.
    assert_eq!(
        p.a.sas[ha].children[0].rekey_at,
        Some(p.now + Duration::from_secs(12))
    );
    assert_eq!(p.a.sas[ha].rekey_at, Some(p.now + Duration::from_secs(32)));
    p.advance(Duration::from_secs(13));
    assert_eq!(p.a.counter(IkeEvent::ChildRekeys), 1);
    p.advance(Duration::from_secs(20));
    assert_eq!(p.a.counter(IkeEvent::IkeRekeys), 1);
    assert!(p.a.counter(IkeEvent::DpdSent) >= 2);
    p.assert_matched();
    assert!(p.pa.down.is_empty() && p.pb.down.is_empty());
}

#[test]
fn import_refuses_what_it_cannot_continue() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let snap = p.a.export(p.now).remove(0);
    // A connection this engine does not have.
    let mut other = p.a.conns[0].clone();
    other.name = "other".into();
    let mut e = Ike::new(vec![other], Ports::default());
    let err = e.import(p.now, &snap).unwrap_err();
    assert!(err.0.contains("no IKE connection named \"c\""), "{err}");
    assert!(e.status().is_empty());
    // The same SA twice, or over an SA of the connection.
    let mut e = Ike::new(p.a.conns.clone(), Ports::default());
    e.import(p.now, &snap).unwrap();
    let err = e.import(p.now, &snap).unwrap_err();
    assert!(err.0.contains("already has an IKE SA"), "{err}");
    assert!(p.a.import(p.now, &snap).is_err());
    // Another connection address, another format.
    let mut moved = p.a.conns[0].clone();
    moved.local = "192.0.2.9".parse().unwrap();
    let mut e = Ike::new(vec![moved], Ports::default());
    assert!(e.import(p.now, &snap).unwrap_err().0.contains("192.0.2.9"));
    let mut future = snap.clone();
    future.version = 2;
    let mut e = Ike::new(p.a.conns.clone(), Ports::default());
    assert!(e
        .import(p.now, &future)
        .unwrap_err()
        .0
        .contains("version 2"));
    assert!(e.status().is_empty() && e.poll_transmit().is_none());
}

#[test]
fn a_snapshot_never_shows_its_keys_and_survives_json() {
    let mut p = Pair::psk("aes256-sha256-modp2048", "aes256-sha256");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let snap = p.a.export(p.now).remove(0);
    let json = serde_json::to_string(&snap).unwrap();
    let back: IkeSnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, snap);
    let debug = format!("{snap:?} {snap:#?}");
    let ha = only_sa(&p.a);
    let sa = &p.a.sas[ha];
    let keys = sa.sk_keys.as_ref().unwrap();
    for k in [
        &sa.sk_d, &sa.sk_pi, &sa.sk_pr, &keys.ei, &keys.er, &keys.ai, &keys.ar,
    ] {
        assert!(k.len() >= 16);
        let hex = hex::encode(&k[..]);
        assert!(json.contains(&hex), "the JSON carries the key");
        assert!(!debug.contains(&hex), "{debug}");
        let bytes = format!("{:?}", &k[..4]);
        assert!(!debug.contains(bytes.trim_end_matches(']')), "{debug}");
    }
    assert!(debug.contains("not shown"));
    assert!(debug.contains("aes256-sha256"));
}

#[test]
fn the_export_generation_follows_what_is_exported() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    assert!(p.a.export(p.now).is_empty());
    let g0 = p.a.export_generation();
    // IKE_SA_INIT done, IKE_AUTH on its way: nothing to export yet.
    p.a.initiate(p.now, "c").unwrap();
    let t = p.a.poll_transmit().unwrap();
    p.b.handle(p.now, t.remote, t.local, &t.data);
    let t = p.b.poll_transmit().unwrap();
    p.a.handle(p.now, t.remote, t.local, &t.data);
    assert_eq!(p.a.status()[0].state, "connecting");
    assert!(p.a.export(p.now).is_empty() && p.b.export(p.now).is_empty());
    assert_eq!(p.a.export_generation(), g0);
    p.run();
    assert_eq!(established(&p.a), 1);
    let g1 = p.a.export_generation();
    assert!(g1 > g0);
    assert_eq!(p.a.export(p.now).len(), 1);
    // Time alone changes nothing; an exchange moves a message ID.
    p.advance(Duration::from_secs(30));
    assert_eq!(p.a.export_generation(), g1);
    run_task(&mut p, false, Task::Dpd);
    let g2 = p.a.export_generation();
    assert!(g2 > g1);
    let snap = p.a.export(p.now).remove(0);
    assert_eq!(snap.next_in_id, 1);
    // A child rekey, an IKE SA rekey, the end: each shows.
    let spi = p.a.sas[only_sa(&p.a)].children[0].spi_in;
    run_task(&mut p, true, Task::RekeyChild(spi));
    let g3 = p.a.export_generation();
    assert!(g3 > g2);
    run_task(&mut p, true, Task::RekeyIke);
    let g4 = p.a.export_generation();
    assert!(g4 > g3);
    assert_ne!(p.a.export(p.now)[0].spi_i, snap.spi_i);
    p.a.terminate(p.now, "c").unwrap();
    p.run();
    assert!(p.a.export_generation() > g4);
    assert!(p.a.export(p.now).is_empty());
}

#[test]
fn the_inbound_sa_a_rekey_left_behind_is_removed_after_a_takeover() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let spi = p.a.sas[only_sa(&p.a)].children[0].spi_in;
    run_task(&mut p, true, Task::RekeyChild(spi));
    // The old child is deleted; its inbound SA lingers in the data plane.
    assert_eq!(p.pa.sas.len(), 3, "{:?}", p.pa.log);
    let snap = p.a.export(p.now).remove(0);
    assert_eq!(snap.children.len(), 1);
    take_over(&mut p, &snap);
    p.run();
    p.advance(Duration::from_secs(2));
    assert_eq!(p.pa.sas.len(), 2, "{:?}", p.pa.log);
    assert!(!p.pa.sas.contains_key(&(false, spi)));
    p.assert_matched();
    assert!(!p.a.child_spis.contains(&spi));
}

#[test]
fn a_held_outbound_sa_of_a_rekey_we_answered_is_installed_after_a_takeover() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    // B rekeys; A answers and holds its new outbound SA back until B
    // deletes the old child. A dies before that Delete arrives.
    let hb = only_sa(&p.b);
    let spi = p.b.sas[hb].children[0].spi_in;
    p.b.sas[hb].tasks.push_back(Task::RekeyChild(spi));
    p.b.kick_now(hb, p.now);
    let req = p.b.poll_transmit().unwrap();
    p.a.handle(p.now, req.remote, req.local, &req.data);
    apply(&mut p.a, &mut p.pa);
    let resp = p.a.poll_transmit().unwrap();
    let snap = p.a.export(p.now).remove(0);
    assert_eq!(snap.children.len(), 2);
    assert_eq!(
        snap.children.iter().filter(|c| c.holds_outbound()).count(),
        1
    );
    take_over(&mut p, &snap);
    p.b.handle(p.now, resp.remote, resp.local, &resp.data);
    p.run();
    p.advance(Duration::from_secs(2));
    assert_eq!(p.b.counter(IkeEvent::ChildRekeys), 1);
    p.assert_matched();
    assert_eq!(p.pa.sas.len(), 2, "{:?}", p.pa.log);
    assert_eq!(p.pb.sas.len(), 2, "{:?}", p.pb.log);
    assert_eq!(child_counts(&p.a), vec![1]);
}

/// A pair whose connection keeps `a` and `b` per-CPU children (RFC 9611)
/// on each side, both steering inbound SPIs over two workers.
fn per_cpu_pair(a: u32, b: u32) -> Pair {
    let mut ca = conf(
        A,
        B,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.1.0.0/16",
        "10.2.0.0/16",
    );
    let mut cb = conf(
        B,
        A,
        "aes128gcm16-prfsha256-x25519",
        "aes128gcm16",
        "10.2.0.0/16",
        "10.1.0.0/16",
    );
    ca.child.per_cpu_sas = a;
    cb.child.per_cpu_sas = b;
    let mut p = Pair::new(ca, cb);
    p.a.set_spi_steering(2);
    p.b.set_spi_steering(2);
    p
}

/// (slot, inbound SPI, outbound SPI) of `e`'s installed children, by slot.
fn slots(e: &Ike) -> Vec<(u32, u32, u32)> {
    let mut v: Vec<(u32, u32, u32)> = e
        .status()
        .iter()
        .flat_map(|s| s.children.clone())
        .filter(|c| c.state == "installed")
        .map(|c| (c.slot, c.spi_in, c.spi_out))
        .collect();
    v.sort_unstable();
    v
}

/// Each side's outbound SA of every slot is the other side's inbound SA
/// with the same keys, and each slot's inbound SPI lands on its worker.
fn assert_slots_matched(p: &Pair, n: usize) {
    let (sa, sb) = (slots(&p.a), slots(&p.b));
    assert_eq!(sa.len(), n, "A {sa:?}");
    assert_eq!(sb.len(), n, "B {sb:?}");
    for (k, (slot, spi_in, spi_out)) in sa.iter().enumerate() {
        assert_eq!(*slot, k as u32);
        assert_eq!(spi_in % 2, slot % 2, "A's slot {slot} SPI {spi_in:08x}");
        assert_eq!(p.pa.slots.get(spi_out).map(|s| &s.0), Some(slot));
        assert_eq!(
            p.pa.sas.get(&(true, *spi_out)),
            p.pb.sas.get(&(false, *spi_out)),
            "A->B SA {spi_out:08x}"
        );
        assert_eq!(
            p.pb.sas.get(&(true, *spi_in)),
            p.pa.sas.get(&(false, *spi_in)),
            "B->A SA {spi_in:08x}"
        );
    }
    for (slot, spi_in, _) in &sb {
        assert_eq!(spi_in % 2, slot % 2, "B's slot {slot} SPI {spi_in:08x}");
    }
    // One outbound SA per slot in each data plane.
    assert_eq!(p.pa.sas.keys().filter(|(o, _)| *o).count(), n);
    assert_eq!(p.pb.sas.keys().filter(|(o, _)| *o).count(), n);
}

/// The notifies of type `t` in the messages of `exch` seen so far.
fn notifies_seen(
    p: &Pair,
    exch: ExchangeType,
    from_a: bool,
    response: bool,
    t: NotifyType,
) -> usize {
    seen_of(p, exch, from_a, response)
        .iter()
        .filter(|m| notify_of_type(m, t))
        .count()
}

fn notify_of_type(m: &[Payload], t: NotifyType) -> bool {
    m.iter()
        .any(|x| matches!(x, Payload::Notify(n) if n.notify_type == t))
}

#[test]
fn per_cpu_children_are_negotiated_with_sa_resource_info() {
    let mut p = per_cpu_pair(2, 2);
    p.seen = Some(Vec::new());
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_slots_matched(&p, 2);
    let info = NotifyType::SaResourceInfo;
    // The notify in the IKE_AUTH request and answer, and in the
    // CREATE_CHILD_SA of the second child and its answer.
    assert_eq!(
        notifies_seen(&p, ExchangeType::IkeAuth, true, false, info),
        1
    );
    assert_eq!(
        notifies_seen(&p, ExchangeType::IkeAuth, false, true, info),
        1
    );
    assert_eq!(
        notifies_seen(&p, ExchangeType::CreateChildSa, true, false, info),
        1
    );
    assert_eq!(
        notifies_seen(&p, ExchangeType::CreateChildSa, false, true, info),
        1
    );
    assert_eq!(p.a.counter(IkeEvent::ChildrenEstablished), 2);
    assert_eq!(p.b.counter(IkeEvent::ChildrenEstablished), 2);
    // Status shows both slots.
    let st = p.a.status();
    let mut shown: Vec<u32> = st[0].children.iter().map(|c| c.slot).collect();
    shown.sort_unstable();
    assert_eq!(shown, [0, 1]);
    // Terminating removes every child on both sides.
    p.a.terminate(p.now, "c").unwrap();
    p.run();
    assert!(
        p.pa.sas.is_empty() && p.pb.sas.is_empty(),
        "{:?} {:?}",
        p.pa.sas.keys(),
        p.pb.sas.keys()
    );
}

#[test]
fn per_cpu_children_fall_back_to_one_against_a_peer_without_them() {
    // A wants two, B (like a peer without RFC 9611) keeps one: B does not
    // answer the notify, and A opens no second child.
    for (a, b) in [(2, 1), (1, 2)] {
        let mut p = per_cpu_pair(a, b);
        p.seen = Some(Vec::new());
        p.a.initiate(p.now, "c").unwrap();
        p.run();
        p.assert_matched();
        assert_eq!(slots(&p.a).len(), 1, "{a}/{b}");
        assert_eq!(slots(&p.b).len(), 1, "{a}/{b}");
        let info = NotifyType::SaResourceInfo;
        assert_eq!(
            notifies_seen(&p, ExchangeType::IkeAuth, false, true, info),
            0
        );
        assert_eq!(
            seen_of(&p, ExchangeType::CreateChildSa, true, false).len(),
            0
        );
        assert_eq!(p.a.counter(IkeEvent::ChildrenEstablished), 1);
        if a == 2 {
            assert_eq!(info_lines(&p.pa, "did not announce SA_RESOURCE_INFO"), 1);
        }
        // The one child serves whatever SPI the single slot got: with one
        // child per connection any SPI is fine (no residue is forced).
        assert_eq!(p.pa.sas.len(), 2);
    }
}

#[test]
fn a_peer_with_fewer_slots_answers_ts_max_queue() {
    // A asks for three children, B keeps two: B refuses the third with
    // TS_MAX_QUEUE and A keeps two without retrying.
    let mut p = per_cpu_pair(3, 2);
    p.seen = Some(Vec::new());
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_slots_matched(&p, 2);
    let refusals = seen_of(&p, ExchangeType::CreateChildSa, false, true)
        .iter()
        .filter(|m| notify_of_type(m, NotifyType::TsMaxQueue))
        .count();
    assert_eq!(refusals, 1);
    assert_eq!(p.a.counter(IkeEvent::ChildrenEstablished), 2);
    p.advance(Duration::from_secs(30));
    assert_eq!(
        seen_of(&p, ExchangeType::CreateChildSa, true, false).len(),
        2
    );
    assert!(
        !p.pa
            .lines
            .iter()
            .any(|(l, m)| *l == Level::Warn && m.contains("TS_MAX_QUEUE")),
        "{:?}",
        p.pa.lines
    );
}

#[test]
fn the_rekey_of_one_of_several_children_keeps_its_slot() {
    for rekeying_side_a in [true, false] {
        let mut p = per_cpu_pair(2, 2);
        p.a.initiate(p.now, "c").unwrap();
        p.run();
        assert_slots_matched(&p, 2);
        let (before_a, before_b) = (slots(&p.a), slots(&p.b));
        // Rekey slot 1 of the side under test.
        let before = if rekeying_side_a {
            &before_a
        } else {
            &before_b
        };
        let old_in = before[1].1;
        run_task(&mut p, rekeying_side_a, Task::RekeyChild(old_in));
        p.advance(REKEYED_INBOUND_LINGER + Duration::from_secs(1));
        assert_slots_matched(&p, 2);
        let (after_a, after_b) = (slots(&p.a), slots(&p.b));
        // Slot 0 untouched, slot 1 new on both sides.
        assert_eq!(after_a[0], before_a[0]);
        assert_eq!(after_b[0], before_b[0]);
        assert_ne!(after_a[1], before_a[1]);
        assert_ne!(after_b[1], before_b[1]);
        assert_eq!(p.a.counter(IkeEvent::ChildRekeys), 1);
        // A rekey's Delete of the old child opens nothing.
        assert_eq!(info_lines(&p.pa, "opening it again"), 0);
        assert_eq!(info_lines(&p.pb, "opening it again"), 0);
        // Nothing of the old slot-1 child is left in either data plane.
        assert_eq!(p.pa.sas.len(), 4, "{:?}", p.pa.log);
        assert_eq!(p.pb.sas.len(), 4, "{:?}", p.pb.log);
    }
}

/// A's and B's data planes, A's first when `a_first`.
fn planes(p: &Pair, a_first: bool) -> (&Plane, &Plane) {
    if a_first {
        (&p.pa, &p.pb)
    } else {
        (&p.pb, &p.pa)
    }
}

#[test]
fn a_per_cpu_child_the_peer_deletes_is_opened_again_once_per_holdoff() {
    for a_deletes in [false, true] {
        let mut p = per_cpu_pair(2, 2);
        p.a.initiate(p.now, "c").unwrap();
        p.run();
        assert_slots_matched(&p, 2);
        let before = slots(&p.a);
        // One side deletes its slot-1 child (not a rekey): the other
        // opens that slot again with new SPIs.
        let deleter = |p: &Pair| if a_deletes { slots(&p.a) } else { slots(&p.b) };
        let spi = deleter(&p)[1].1;
        run_task(&mut p, a_deletes, Task::DeleteChild(spi));
        p.advance(Duration::from_secs(2));
        assert_slots_matched(&p, 2);
        let after = slots(&p.a);
        assert_eq!(after[0], before[0], "slot 0 untouched");
        assert_ne!(after[1], before[1], "slot 1 opened anew");
        // The side that did not delete opens it again, the other not.
        let (reopener, other) = planes(&p, !a_deletes);
        assert_eq!(
            info_lines(reopener, "opening it again"),
            1,
            "{:?}",
            reopener.lines
        );
        assert_eq!(info_lines(other, "opening it again"), 0);
        assert_eq!(p.pa.sas.len(), 4, "{:?}", p.pa.log);
        assert_eq!(p.pb.sas.len(), 4, "{:?}", p.pb.log);
        // Deleted again within the hold-off: left closed, said once.
        let spi = deleter(&p)[1].1;
        run_task(&mut p, a_deletes, Task::DeleteChild(spi));
        p.advance(PER_CPU_REOPEN_HOLDOFF + Duration::from_secs(1));
        assert_eq!(slots(&p.a).len(), 1);
        assert_eq!(slots(&p.b).len(), 1);
        let (reopener, _) = planes(&p, !a_deletes);
        assert_eq!(
            info_lines(reopener, "again within 60 s"),
            1,
            "{:?}",
            reopener.lines
        );
        assert_eq!(info_lines(reopener, "opening it again"), 1);
        assert_slots_matched(&p, 1);
    }
}

#[test]
fn a_per_cpu_child_is_not_reopened_when_the_connection_keeps_one() {
    // Against a peer without RFC 9611 the one child is deleted and not
    // replaced: a child SA of its own is the peer's call, as before.
    let mut p = per_cpu_pair(2, 1);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let spi = slots(&p.b)[0].1;
    run_task(&mut p, false, Task::DeleteChild(spi));
    p.advance(Duration::from_secs(2));
    assert!(slots(&p.a).is_empty() && slots(&p.b).is_empty());
    assert_eq!(info_lines(&p.pa, "opening it again"), 0);
}

#[test]
fn children_with_different_selectors_keep_their_own_outbound_sas() {
    // A asks for 10.2.1/24, then (another child on the same IKE SA) for
    // 10.2.2/24; B's one connection covers 10.2/16 and narrows to each.
    // B keeps both children's outbound SAs (the data plane carries each
    // one's traffic); a rekey replaces its own child's only, and a delete
    // removes only its own.
    let ike = "aes128gcm16-prfsha256-x25519";
    let esp = "aes128gcm16";
    let ca = conf(A, B, ike, esp, "10.1.0.0/16", "10.2.1.0/24");
    let cb = conf(B, A, ike, esp, "10.2.0.0/16", "10.1.0.0/16");
    let mut p = Pair::new(ca, cb);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    p.a.conns[0].child.remote_ts = vec![ts::from_prefix(pfx("10.2.2.0/24"), 0)];
    p.a.sas[0].tasks.push_back(Task::CreateChild(0));
    p.a.kick_now(0, p.now);
    p.run();
    assert_eq!(p.b.counter(IkeEvent::ChildrenEstablished), 2);
    assert_eq!(child_counts(&p.b), vec![2]);
    p.assert_matched();
    let outs =
        |pl: &Plane| -> Vec<u32> { pl.sas.keys().filter(|(o, _)| *o).map(|(_, s)| *s).collect() };
    assert_eq!(outs(&p.pb).len(), 2, "B sends on both children");
    let b_local: Vec<String> = p.b.sas[0]
        .children
        .iter()
        .map(|c| c.local_ts.iter().map(ts::display).collect())
        .collect();
    assert_eq!(
        b_local,
        ["10.2.1.0-10.2.1.255", "10.2.2.0-10.2.2.255"],
        "B narrowed each to what A asked"
    );
    assert!(p.b.sas[0].children.iter().all(|c| c.out_active));
    // B rekeys the first child: its outbound SA is replaced, the second's
    // stays.
    let (x_in, y_out) = {
        let c = &p.b.sas[0].children;
        (c[0].spi_in, c[1].spi_out)
    };
    p.b.sas[0].tasks.push_back(Task::RekeyChild(x_in));
    p.b.kick_now(0, p.now);
    p.run();
    p.assert_matched();
    assert_eq!(child_counts(&p.b), vec![2]);
    let now_out = outs(&p.pb);
    assert_eq!(now_out.len(), 2, "{now_out:08x?}");
    assert!(now_out.contains(&y_out), "the other child's SA stays");
    // A deletes its second child: B removes that child's outbound SA and
    // keeps the first's (the plane refuses a removal of an SA it lacks).
    let y_in_a = p.a.sas[0]
        .children
        .iter()
        .find(|c| c.spi_out == p.b.sas[0].children[1].spi_in)
        .map(|c| c.spi_in)
        .unwrap();
    p.a.sas[0].tasks.push_back(Task::DeleteChild(y_in_a));
    p.a.kick_now(0, p.now);
    p.run();
    assert_eq!(child_counts(&p.b), vec![1]);
    assert_eq!(outs(&p.pb).len(), 1);
    assert!(!outs(&p.pb).contains(&y_out));
}

/// `c` with one more selector set (ours, the peer's).
fn with_set(mut c: IkeConfig, lts: &str, rts: &str) -> IkeConfig {
    c.child.more_ts.push(crate::config::SelectorSet {
        local_ts: vec![ts::from_prefix(pfx(lts), 0)],
        remote_ts: vec![ts::from_prefix(pfx(rts), 0)],
    });
    c
}

/// Each installed child's peer-side selectors, as text, in `e`'s order.
fn child_remote_ts(e: &Ike) -> Vec<String> {
    e.status()
        .iter()
        .flat_map(|s| s.children.clone())
        .filter(|c| c.state == "installed")
        .map(|c| c.remote_ts.join(","))
        .collect()
}

/// A asks for 10.1.0/24 === 10.2.0/24 and 10.1.0/24 === 10.3.0/24; B holds
/// wider mirrored sets and narrows each proposal into its own.
fn two_set_pair(b_has_second: bool) -> Pair {
    let ike = "aes128gcm16-prfsha256-x25519";
    let esp = "aes128gcm16";
    let ca = with_set(
        conf(A, B, ike, esp, "10.1.0.0/24", "10.2.0.0/24"),
        "10.1.0.0/24",
        "10.3.0.0/24",
    );
    let mut cb = conf(B, A, ike, esp, "10.2.0.0/16", "10.1.0.0/16");
    if b_has_second {
        cb = with_set(cb, "10.3.0.0/16", "10.1.0.0/16");
    }
    Pair::new(ca, cb)
}

#[test]
fn each_selector_set_is_a_child_sa_of_its_own() {
    let mut p = two_set_pair(true);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(p.a.counter(IkeEvent::ChildrenEstablished), 2);
    assert_eq!(p.b.counter(IkeEvent::ChildrenEstablished), 2);
    assert_eq!(
        child_remote_ts(&p.a),
        ["10.2.0.0-10.2.0.255", "10.3.0.0-10.3.0.255"]
    );
    // B narrowed each into the set it meets: its own side is 10.2 for the
    // first child and 10.3 for the second.
    let b_local: Vec<String> = p.b.status()[0]
        .children
        .iter()
        .map(|c| c.local_ts.join(","))
        .collect();
    assert_eq!(b_local, ["10.2.0.0-10.2.0.255", "10.3.0.0-10.3.0.255"]);
    p.assert_matched();
    let outs = |pl: &Plane| pl.sas.keys().filter(|(o, _)| *o).count();
    assert_eq!(
        (outs(&p.pa), outs(&p.pb)),
        (2, 2),
        "one outbound SA per child"
    );
    // The log says which set each child is for, on both sides.
    let set1 = "for 10.1.0.0-10.1.0.255 === 10.3.0.0-10.3.0.255";
    assert_eq!(info_lines(&p.pa, set1), 1, "{:?}", p.pa.lines);
    assert_eq!(
        info_lines(&p.pb, "for 10.3.0.0-10.3.0.255 === 10.1.0.0-10.1.0.255"),
        1,
        "{:?}",
        p.pb.lines
    );

    // A rekeys the second child: it keeps its selectors, the first child
    // is untouched.
    let second = |e: &Ike| {
        let i = only_sa(e);
        e.sas[i].children[1].spi_in
    };
    let first_out = p.a.sas[only_sa(&p.a)].children[0].spi_out;
    let rekey = second(&p.a);
    run_task(&mut p, true, Task::RekeyChild(rekey));
    assert_eq!(p.a.counter(IkeEvent::ChildRekeys), 1);
    assert_eq!(child_counts(&p.a), vec![2]);
    let mut now_ts = child_remote_ts(&p.a);
    now_ts.sort();
    assert_eq!(now_ts, ["10.2.0.0-10.2.0.255", "10.3.0.0-10.3.0.255"]);
    assert!(p.pa.sas.contains_key(&(true, first_out)));
    assert_eq!(outs(&p.pa), 2);

    // B deletes the 10.3 child: A is left with one; `initiate` asks for
    // the missing set alone, and then has nothing more to ask for.
    let b_i = only_sa(&p.b);
    let b_second = p.b.sas[b_i]
        .children
        .iter()
        .find(|c| {
            c.local_ts
                .iter()
                .map(ts::display)
                .any(|t| t.starts_with("10.3."))
        })
        .map(|c| c.spi_in)
        .unwrap();
    run_task(&mut p, false, Task::DeleteChild(b_second));
    assert_eq!(child_remote_ts(&p.a), ["10.2.0.0-10.2.0.255"]);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(p.a.counter(IkeEvent::ChildrenEstablished), 3);
    assert_eq!(
        child_remote_ts(&p.a),
        ["10.2.0.0-10.2.0.255", "10.3.0.0-10.3.0.255"]
    );
    let again = p.a.initiate(p.now, "c").unwrap_err();
    assert!(again.0.contains("already has an IKE SA"), "{again}");

    // Established anew, the IKE SA asks for both sets again.
    p.a.terminate(p.now, "c").unwrap();
    p.run();
    assert_eq!(established(&p.a), 0);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(child_counts(&p.a), vec![2]);
    assert_eq!(child_counts(&p.b), vec![2]);
    p.assert_matched();
}

#[test]
fn a_selector_set_the_peer_refuses_leaves_the_others_up() {
    // B covers only the first set: the second gets TS_UNACCEPTABLE, which
    // A logs and does not retry on its own.
    let mut p = two_set_pair(false);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(child_remote_ts(&p.a), ["10.2.0.0-10.2.0.255"]);
    assert_eq!(p.b.counter(IkeEvent::TsUnacceptable), 1);
    assert_eq!(p.a.counter(IkeEvent::ChildFailed), 1);
    p.assert_matched();
    p.advance(Duration::from_secs(120));
    assert_eq!(p.b.counter(IkeEvent::TsUnacceptable), 1, "no retry loop");
    assert_eq!(established(&p.a), 1);
    let refused =
        p.pa.lines
            .iter()
            .filter(|(_, m)| {
                m.contains("new child SA for 10.1.0.0-10.1.0.255 === 10.3.0.0-10.3.0.255 refused")
                    && m.contains("TS_UNACCEPTABLE")
            })
            .count();
    assert_eq!(refused, 1, "{:?}", p.pa.lines);
    // B has one set: its log lines name none.
    assert_eq!(info_lines(&p.pb, "established:"), 1, "{:?}", p.pb.lines);
    assert_eq!(info_lines(&p.pb, " for 10."), 0, "{:?}", p.pb.lines);
    // B's warning names both sides' selectors.
    let b_warn =
        p.pb.lines
            .iter()
            .find(|(l, m)| *l == Level::Warn && m.contains("do not meet ours"))
            .map(|(_, m)| m.clone())
            .unwrap();
    assert!(
        b_warn.contains("10.3.0.0-10.3.0.255") && b_warn.contains("10.1.0.0-10.1.255.255"),
        "{b_warn}"
    );
}

#[test]
fn each_selector_set_keeps_its_own_per_cpu_children() {
    // RFC 9611 with two selector sets: two children per set, slots 0 and
    // 1 in each, slot k's inbound SPI steered to worker k.
    let mut p = two_set_pair(true);
    for e in [&mut p.a, &mut p.b] {
        e.conns[0].child.per_cpu_sas = 2;
        e.set_spi_steering(2);
    }
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let per_set = |e: &Ike, ours: bool| -> Vec<(String, u32)> {
        let mut v: Vec<(String, u32)> = e
            .status()
            .iter()
            .flat_map(|s| s.children.clone())
            .filter(|c| c.state == "installed")
            .map(|c| {
                let ts = if ours { &c.local_ts } else { &c.remote_ts };
                (ts.join(","), c.slot)
            })
            .collect();
        v.sort();
        v
    };
    let want = |a: &str, b: &str| vec![(a.into(), 0), (a.into(), 1), (b.into(), 0), (b.into(), 1)];
    let (s2, s3) = ("10.2.0.0-10.2.0.255", "10.3.0.0-10.3.0.255");
    assert_eq!(per_set(&p.a, false), want(s2, s3), "{:?}", p.pa.lines);
    assert_eq!(per_set(&p.b, true), want(s2, s3), "{:?}", p.pb.lines);
    for (e, pl, other) in [(&p.a, &p.pa, &p.pb), (&p.b, &p.pb, &p.pa)] {
        for c in e.status().iter().flat_map(|s| s.children.clone()) {
            assert_eq!(c.spi_in % 2, c.slot, "{c:?}");
            assert_eq!(
                pl.sas.get(&(true, c.spi_out)),
                other.sas.get(&(false, c.spi_out)),
                "{c:?}"
            );
            assert_eq!(pl.slots.get(&c.spi_out).map(|s| s.0), Some(c.slot));
        }
    }
    // B deletes slot 1 of the second set: A opens that slot again, in
    // that set.
    let gone =
        p.b.status()
            .iter()
            .flat_map(|s| s.children.clone())
            .find(|c| c.slot == 1 && c.local_ts.join(",") == s3)
            .map(|c| c.spi_in)
            .unwrap();
    run_task(&mut p, false, Task::DeleteChild(gone));
    assert_eq!(per_set(&p.a, false), want(s2, s3), "{:?}", p.pa.lines);
    assert_eq!(per_set(&p.b, true), want(s2, s3));
    assert_eq!(
        info_lines(
            &p.pa,
            &format!("slot 1 for 10.1.0.0-10.1.0.255 === {s3}: opening it again")
        ),
        1,
        "{:?}",
        p.pa.lines
    );
}

/// Each side's outbound SAs are the other side's inbound SAs with the same
/// keys, `n` of them on each side.
fn assert_outs_matched(p: &Pair, n: usize) {
    for (pl, other, name) in [(&p.pa, &p.pb, "A"), (&p.pb, &p.pa, "B")] {
        let outs: Vec<u32> = pl.sas.keys().filter(|(o, _)| *o).map(|k| k.1).collect();
        assert_eq!(outs.len(), n, "{name}: {:?}", pl.log);
        for spi in outs {
            assert_eq!(
                pl.sas.get(&(true, spi)),
                other.sas.get(&(false, spi)),
                "{name}'s outbound SA {spi:08x}"
            );
        }
    }
}

/// The inbound SPI of `e`'s installed child whose peer-side (`theirs`) or
/// our-side selectors start with `prefix`.
fn child_spi(e: &Ike, theirs: bool, prefix: &str) -> u32 {
    let i = only_sa(e);
    e.sas[i]
        .children
        .iter()
        .filter(|c| c.state == ChildState::Installed)
        .find(|c| {
            let ts = if theirs { &c.remote_ts } else { &c.local_ts };
            ts.iter().map(ts::display).any(|t| t.starts_with(prefix))
        })
        .map(|c| c.spi_in)
        .unwrap()
}

#[test]
fn rekeys_of_children_of_two_sets_at_once_are_not_taken_for_a_collision() {
    // A rekeys its 10.3 child while B rekeys its 10.2 child, the requests
    // crossing: two rekeys of two children, not a collision (§2.8.1 is
    // about one child). Each set keeps one child whose outbound SA is the
    // peer's inbound one, whichever nonces are lower.
    for round in 0..6 {
        let mut p = two_set_pair(true);
        p.a.initiate(p.now, "c").unwrap();
        p.run();
        assert_outs_matched(&p, 2);
        let a_child = child_spi(&p.a, true, "10.3.");
        let b_child = child_spi(&p.b, false, "10.2.");
        let (ia, ib) = (only_sa(&p.a), only_sa(&p.b));
        p.a.sas[ia].tasks.push_back(Task::RekeyChild(a_child));
        p.b.sas[ib].tasks.push_back(Task::RekeyChild(b_child));
        p.a.kick_now(ia, p.now);
        p.b.kick_now(ib, p.now);
        assert_eq!(p.cross(), (1, 1));
        p.run();
        p.advance(Duration::from_secs(1) + REKEYED_INBOUND_LINGER);
        let collisions =
            p.a.counter(IkeEvent::RekeyCollisions) + p.b.counter(IkeEvent::RekeyCollisions);
        assert_eq!(collisions, 0, "round {round}: {:?}", p.pa.lines);
        // Each side counts the rekey it made and the one it answered.
        assert_eq!(p.a.counter(IkeEvent::ChildRekeys), 2);
        assert_eq!(p.b.counter(IkeEvent::ChildRekeys), 2);
        let mut sets = child_remote_ts(&p.a);
        sets.sort();
        assert_eq!(sets, ["10.2.0.0-10.2.0.255", "10.3.0.0-10.3.0.255"]);
        assert_eq!(child_counts(&p.b), vec![2]);
        // Both rekeyed children were replaced: none of the old SPIs is left.
        assert!(!p.pa.sas.contains_key(&(false, a_child)), "{:?}", p.pa.log);
        assert!(!p.pb.sas.contains_key(&(false, b_child)), "{:?}", p.pb.log);
        assert_outs_matched(&p, 2);
        assert_eq!(p.pa.sas.len(), 4, "{:?}", p.pa.log);
        assert_eq!(p.pb.sas.len(), 4, "{:?}", p.pb.log);
    }
}

#[test]
fn an_ike_rekey_carries_the_child_sas_still_to_open() {
    // A selector set without a child (B deleted it) is queued to be asked
    // for again behind an IKE rekey: the new IKE SA asks for it, the old
    // one (deleted) does not drop it.
    let mut p = two_set_pair(true);
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let gone = child_spi(&p.b, false, "10.3.");
    run_task(&mut p, false, Task::DeleteChild(gone));
    assert_eq!(child_remote_ts(&p.a), ["10.2.0.0-10.2.0.255"]);
    let i = only_sa(&p.a);
    p.a.sas[i].tasks.push_back(Task::RekeyIke);
    p.a.sas[i].tasks.push_back(Task::CreateChild(1));
    p.a.kick_now(i, p.now);
    p.run();
    p.advance(Duration::from_secs(30));
    assert_eq!(p.a.counter(IkeEvent::IkeRekeys), 1);
    assert_eq!((established(&p.a), established(&p.b)), (1, 1));
    let mut sets = child_remote_ts(&p.a);
    sets.sort();
    assert_eq!(sets, ["10.2.0.0-10.2.0.255", "10.3.0.0-10.3.0.255"]);
    assert_eq!(child_counts(&p.a), vec![2]);
    assert_eq!(child_counts(&p.b), vec![2]);
    assert_outs_matched(&p, 2);
}

#[test]
fn per_cpu_children_follow_in_a_set_the_peer_takes_when_it_refused_the_first() {
    // B covers only A's second set: A's IKE_AUTH child (10.2) is refused,
    // so its answer says nothing of RFC 9611. A's request for the 10.3
    // set carries SA_RESOURCE_INFO, B's answer too, and that set gets
    // its two per-CPU children.
    let ike = "aes128gcm16-prfsha256-x25519";
    let esp = "aes128gcm16";
    let mut ca = with_set(
        conf(A, B, ike, esp, "10.1.0.0/24", "10.2.0.0/24"),
        "10.1.0.0/24",
        "10.3.0.0/24",
    );
    let mut cb = conf(B, A, ike, esp, "10.3.0.0/16", "10.1.0.0/16");
    ca.child.per_cpu_sas = 2;
    cb.child.per_cpu_sas = 2;
    let mut p = Pair::new(ca, cb);
    p.a.set_spi_steering(2);
    p.b.set_spi_steering(2);
    p.seen = Some(Vec::new());
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(p.b.counter(IkeEvent::TsUnacceptable), 1);
    let info = NotifyType::SaResourceInfo;
    assert_eq!(
        notifies_seen(&p, ExchangeType::IkeAuth, false, true, info),
        0
    );
    assert_eq!(
        child_remote_ts(&p.a),
        ["10.3.0.0-10.3.0.255", "10.3.0.0-10.3.0.255"],
        "{:?}",
        p.pa.lines
    );
    assert_slots_matched(&p, 2);
    // Every CREATE_CHILD_SA request of A carried the notify: the set's
    // first child and its per-CPU one.
    let creates = seen_of(&p, ExchangeType::CreateChildSa, true, false).len();
    assert_eq!(creates, 2);
    assert_eq!(
        notifies_seen(&p, ExchangeType::CreateChildSa, true, false, info),
        2
    );
}

#[test]
fn each_sets_first_child_announces_per_cpu_children_and_reopens_hold_off_per_set() {
    let mut p = two_set_pair(true);
    for e in [&mut p.a, &mut p.b] {
        e.conns[0].child.per_cpu_sas = 2;
        e.set_spi_steering(2);
    }
    p.seen = Some(Vec::new());
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    // Set 0's per-CPU child, set 1's first and set 1's per-CPU child:
    // each request says SA_RESOURCE_INFO.
    let info = NotifyType::SaResourceInfo;
    let creates = seen_of(&p, ExchangeType::CreateChildSa, true, false).len();
    assert_eq!(creates, 3);
    assert_eq!(
        notifies_seen(&p, ExchangeType::CreateChildSa, true, false, info),
        3
    );
    assert_eq!(child_counts(&p.a), vec![4]);
    // B deletes slot 1 of set 1, then within the minute slot 1 of set 0:
    // A opens both again, since the hold-off counts per set.
    let slot1 = |e: &Ike, prefix: &str| {
        e.status()
            .iter()
            .flat_map(|s| s.children.clone())
            .find(|c| c.slot == 1 && c.state == "installed" && c.local_ts[0].starts_with(prefix))
            .map(|c| c.spi_in)
            .unwrap()
    };
    let spi = slot1(&p.b, "10.3.");
    run_task(&mut p, false, Task::DeleteChild(spi));
    assert_eq!(child_counts(&p.a), vec![4]);
    p.advance(Duration::from_secs(5));
    let spi = slot1(&p.b, "10.2.");
    run_task(&mut p, false, Task::DeleteChild(spi));
    assert_eq!(child_counts(&p.a), vec![4], "{:?}", p.pa.lines);
    assert_eq!(info_lines(&p.pa, "opening it again"), 2, "{:?}", p.pa.lines);
    assert_eq!(info_lines(&p.pa, "again within 60 s"), 0);
    // Set 1's slot deleted a second time within the minute stays closed.
    p.advance(Duration::from_secs(5));
    let spi = slot1(&p.b, "10.3.");
    run_task(&mut p, false, Task::DeleteChild(spi));
    assert_eq!(child_counts(&p.a), vec![3]);
    assert_eq!(
        info_lines(&p.pa, "again within 60 s"),
        1,
        "{:?}",
        p.pa.lines
    );
}

/// A request of A's IKE SA with `payloads`, as B receives it from `from`
/// (A moved there, or a NAT changed it on the way); returns B's answer
/// (where it went, and its payloads as A opens them). B's socket is the
/// wildcard address, as a daemon's is when the packet's destination is
/// not known: B still answers from its own.
fn crafted_from(
    p: &mut Pair,
    payloads: Vec<Payload>,
    from: SocketAddr,
) -> (SocketAddr, Vec<Payload>) {
    let id = p.a.sas[0].next_out_id;
    let h = p.a.sas[0].header(ExchangeType::Informational, false, id);
    let data = p.a.sas[0].sk.as_mut().unwrap().seal(&h, &payloads).unwrap();
    p.a.sas[0].next_out_id += 1;
    let to = p.a.sas[0].remote;
    let wildcard = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), to.port());
    p.b.handle(p.now, wildcard, from, &data);
    let t = p.b.poll_transmit().expect("an answer");
    assert_eq!(t.local, to, "answered from where the request arrived");
    let answer = p.a.sas[0].sk.as_ref().unwrap().open(&t.data).unwrap().1;
    (t.remote, answer)
}

/// UPDATE_SA_ADDRESSES with NAT detection hashes of `src` and `dst`, as
/// the peer sent them (they match what the receiver sees unless a NAT
/// changed the packet on the way).
fn update_sa_addresses(spis: (u64, u64), src: SocketAddr, dst: SocketAddr) -> Vec<Payload> {
    vec![
        notify(NotifyType::UpdateSaAddresses, vec![]),
        notify(
            NotifyType::NatDetectionSourceIp,
            nat_hash(spis.0, spis.1, src),
        ),
        notify(
            NotifyType::NatDetectionDestinationIp,
            nat_hash(spis.0, spis.1, dst),
        ),
    ]
}

/// `answer` carries NAT detection hashes of `src` (the answer's sender)
/// and `dst`.
fn assert_nat_detection(answer: &[Payload], spis: (u64, u64), src: SocketAddr, dst: SocketAddr) {
    let hash = |t| find_notify(answer, t).map(|n| n.data.clone());
    assert_eq!(
        hash(NotifyType::NatDetectionSourceIp),
        Some(nat_hash(spis.0, spis.1, src)),
        "{answer:?}"
    );
    assert_eq!(
        hash(NotifyType::NatDetectionDestinationIp),
        Some(nat_hash(spis.0, spis.1, dst)),
        "{answer:?}"
    );
}

/// RFC 4555 as the responder: a MOBIKE peer's message from another
/// address is answered there without moving anything (it may be testing a
/// path); its UPDATE_SA_ADDRESSES moves the IKE SA and the child SAs
/// (PeerMoved), answered with NAT detection on the new addresses and its
/// COOKIE2; NO_NATS_ALLOWED with addresses changed on the way is refused
/// (UNEXPECTED_NAT_DETECTED) and moves nothing; a move onto a path with a
/// NAT rekeys the children so that the new ones are UDP-encapsulated.
#[test]
fn a_mobike_peer_moves_the_sas_only_when_it_says_so() {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    assert_eq!(established(&p.b), 1);
    let bi = p.b.sas.iter().next().map(|(k, _)| k).unwrap();
    assert!(
        !p.b.sas[bi].mobike,
        "espgate's initiator does not offer MOBIKE"
    );
    assert!(!p.b.status()[0].mobike);
    // As if A had offered it in IKE_AUTH (a strongSwan initiator does).
    p.b.sas[bi].mobike = true;
    let (spi_i, spi_r) = (p.a.sas[0].spi_i, p.a.sas[0].spi_r);
    let old: SocketAddr = format!("{A}:500").parse().unwrap();
    let new: SocketAddr = "192.0.2.9:500".parse().unwrap();
    let b_addr = p.a.sas[0].remote;
    let moves = |p: &Pair| p.pb.log.iter().filter(|l| l.starts_with("moved")).count();

    // 1. A liveness check from the new address: answered there, no move.
    let (to, answer) = crafted_from(&mut p, vec![], new);
    apply(&mut p.b, &mut p.pb);
    assert_eq!((to, answer.len()), (new, 0));
    assert_eq!((p.b.sas[bi].remote, moves(&p)), (old, 0));
    // With NAT detection (a peer behind a NAT checking its mapping): the
    // hashes are of this exchange's addresses, so the peer sees that it
    // arrived from elsewhere; still no move.
    let (to, answer) = crafted_from(
        &mut p,
        vec![
            notify(
                NotifyType::NatDetectionSourceIp,
                nat_hash(spi_i, spi_r, old),
            ),
            notify(
                NotifyType::NatDetectionDestinationIp,
                nat_hash(spi_i, spi_r, b_addr),
            ),
        ],
        new,
    );
    apply(&mut p.b, &mut p.pb);
    assert_eq!(to, new);
    assert_nat_detection(&answer, (spi_i, spi_r), b_addr, new);
    assert_eq!((p.b.sas[bi].remote, moves(&p)), (old, 0));

    // 2. NO_NATS_ALLOWED naming addresses the packet does not have.
    let (to, answer) = crafted_from(
        &mut p,
        vec![
            notify(NotifyType::UpdateSaAddresses, vec![]),
            notify(NotifyType::NoNatsAllowed, no_nats_data(old, b_addr)),
        ],
        new,
    );
    apply(&mut p.b, &mut p.pb);
    assert_eq!(to, new);
    assert_eq!(
        notify_of(&answer).map(|n| n.0),
        Some(NotifyType::UnexpectedNatDetected)
    );
    assert_eq!((p.b.sas[bi].remote, moves(&p)), (old, 0));
    assert_eq!(p.b.counter(IkeEvent::MobikeRefused), 1);

    // 3. The update, no NAT on the way (NAT detection hashes match).
    let cookie2 = b"return routability".to_vec();
    let (to, answer) = crafted_from(
        &mut p,
        [
            update_sa_addresses((spi_i, spi_r), new, b_addr),
            vec![
                notify(NotifyType::NoNatsAllowed, no_nats_data(new, b_addr)),
                notify(NotifyType::Cookie2, cookie2.clone()),
            ],
        ]
        .concat(),
        new,
    );
    apply(&mut p.b, &mut p.pb);
    assert_eq!(to, new);
    assert_nat_detection(&answer, (spi_i, spi_r), b_addr, new);
    assert_eq!(
        find_notify(&answer, NotifyType::Cookie2).map(|n| n.data.clone()),
        Some(cookie2)
    );
    assert_eq!(p.b.sas[bi].remote, new);
    assert!(!p.b.sas[bi].nat);
    assert_eq!(
        p.pb.log
            .iter()
            .filter(|l| l.starts_with("moved"))
            .collect::<Vec<_>>(),
        [&format!("moved c {new}")]
    );
    assert_eq!(p.b.counter(IkeEvent::MobikeUpdates), 1);
    // Nothing rekeyed: the NAT state did not change.
    let sas_before = p.pb.sas.clone();
    assert!(p.b.poll_transmit().is_none());
    // B's own requests go to the new address now.
    p.b.terminate(p.now, "c").unwrap();
    assert_eq!(p.b.poll_transmit().expect("a delete").remote, new);
    // (Delivered nowhere: A is not told; the test ends its IKE SA on B.)
    assert_eq!(p.pb.sas, sas_before);

    // 4. A fresh pair: an update onto a path through a NAT (A's source
    // hash does not match what B sees) rekeys the child.
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let bi = p.b.sas.iter().next().map(|(k, _)| k).unwrap();
    p.b.sas[bi].mobike = true;
    let (spi_i, spi_r) = (p.a.sas[0].spi_i, p.a.sas[0].spi_r);
    let b_addr = p.a.sas[0].remote;
    let nat: SocketAddr = "198.51.100.7:31000".parse().unwrap();
    let children_before = p.b.status()[0].children.len();
    let in_before: Vec<u32> = p.b.status()[0].children.iter().map(|c| c.spi_in).collect();
    let (to, _) = crafted_from(
        &mut p,
        update_sa_addresses((spi_i, spi_r), new, b_addr),
        nat,
    );
    assert_eq!(to, nat);
    assert!(p.b.sas[bi].nat, "a NAT on the new path");
    // B's rekey of the child goes to the new address; A (which did not
    // move in this test) is handed it as if it came from B.
    let t = p.b.poll_transmit().expect("a child rekey");
    assert_eq!(t.remote, nat);
    let a_addr = p.a.sas[0].local;
    p.a.handle(p.now, a_addr, b_addr, &t.data);
    apply(&mut p.b, &mut p.pb);
    let t = p.a.poll_transmit().expect("A's answer");
    p.b.handle(p.now, t.remote, nat, &t.data);
    apply(&mut p.a, &mut p.pa);
    apply(&mut p.b, &mut p.pb);
    let st = &p.b.status()[0];
    assert!(st.nat && st.mobike);
    let in_after: Vec<u32> = st
        .children
        .iter()
        .filter(|c| c.state == "installed")
        .map(|c| c.spi_in)
        .collect();
    assert_eq!(in_after.len(), children_before);
    assert!(
        in_after.iter().all(|s| !in_before.contains(s)),
        "{in_before:?} -> {in_after:?}"
    );
    assert!(
        p.pb.lines
            .iter()
            .any(|(_, l)| l.contains("the new path crosses a NAT: rekeying 1 child SA(s)")),
        "{:?}",
        p.pb.lines
    );
}

/// A rekeys its child; B answers, and the answer is lost with A. Returns
/// the pair and A's snapshot from before the rekey's answer.
fn a_child_rekey_answered_and_lost() -> (Pair, IkeSnapshot) {
    let mut p = Pair::psk("aes128gcm16-prfsha256-x25519", "aes128gcm16");
    p.a.initiate(p.now, "c").unwrap();
    p.run();
    let ha = only_sa(&p.a);
    let spi = p.a.sas[ha].children[0].spi_in;
    p.a.sas[ha].tasks.push_back(Task::RekeyChild(spi));
    p.a.kick_now(ha, p.now);
    let req = p.a.poll_transmit().unwrap();
    apply(&mut p.a, &mut p.pa);
    let snap = p.a.export(p.now).remove(0);
    p.deliver(true, &[req]);
    assert_eq!(p.take(false).len(), 1);
    assert_eq!(child_counts(&p.b), vec![2], "the old child and the new one");
    (p, snap)
}

/// A dies with its rekey of the child in flight: B answered it, the answer
/// died with A. The engine that continues A rekeys the child again (the
/// snapshot cannot carry the exchange). B drops the child of the first
/// rekey, which A never completed, instead of keeping it until its own
/// rekey time and switching its outbound traffic to it at the switch
/// deadline, on an SA A does not have.
#[test]
fn a_child_rekey_lost_with_the_old_leader_leaves_nothing_at_the_peer() {
    let (mut p, snap) = a_child_rekey_answered_and_lost();
    take_over(&mut p, &snap);
    p.run();
    p.advance(Duration::from_secs(60));
    assert!(logged(&p.pb, "was never completed"), "{:?}", p.pb.lines);
    assert_eq!((child_counts(&p.a), child_counts(&p.b)), (vec![1], vec![1]));
    let outs = |pl: &Plane| {
        pl.log
            .iter()
            .filter(|l| l.starts_with("install out"))
            .count()
    };
    assert_eq!(
        outs(&p.pb),
        2,
        "B never sent on the abandoned child: {:?}",
        p.pb.log
    );
    assert_eq!((p.pa.sas.len(), p.pb.sas.len()), (2, 2));
    assert!(p.pa.down.is_empty() && p.pb.down.is_empty());
    p.assert_matched();
}

/// As above, but the new leader's second rekey comes after B's switch
/// deadline: B already sends on the abandoned child, which A never had. B
/// drops that child and sends on the second rekey's child at once, instead
/// of holding it back while every packet it sends is lost.
#[test]
fn a_child_rekey_lost_with_the_old_leader_after_the_switch_deadline_is_dropped_at_once() {
    let (mut p, snap) = a_child_rekey_answered_and_lost();
    // A is gone; B's deadline passes before the new leader speaks.
    take_over(&mut p, &snap);
    p.drop_a = true;
    p.advance(Duration::from_secs(6));
    let b_out = p.pb.current_out.unwrap();
    assert!(
        !p.pa.sas.contains_key(&(false, b_out)),
        "B sends on the abandoned child"
    );
    p.drop_a = false;
    // One message at a time, until B has answered the second rekey.
    let mut answered = false;
    'steps: for _ in 0..100 {
        let next = [p.a.poll_timeout(), p.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        p.now = p.now.max(next.unwrap());
        p.a.handle_timeout(p.now);
        p.b.handle_timeout(p.now);
        apply(&mut p.a, &mut p.pa);
        apply(&mut p.b, &mut p.pb);
        for _ in 0..20 {
            let from_a = p.take(true);
            let from_b = p.take(false);
            if from_a.is_empty() && from_b.is_empty() {
                break;
            }
            p.deliver(false, &from_b);
            for m in from_a {
                p.deliver(true, &[m]);
                if !answered && logged(&p.pb, "was never completed") {
                    answered = true;
                    // Before A has even had the answer (let alone deleted
                    // the old child), B sends on the new child.
                    let new_out = p.pb.current_out.expect("B has an outbound SA");
                    assert_ne!(new_out, b_out);
                    assert!(!p.pa.sas.contains_key(&(false, new_out)));
                }
            }
            if answered {
                break 'steps;
            }
        }
    }
    assert!(answered, "{:?}", p.pb.lines);
    let new_out = p.pb.current_out;
    p.run();
    p.advance(Duration::from_secs(60));
    assert_eq!((child_counts(&p.a), child_counts(&p.b)), (vec![1], vec![1]));
    assert!(p.pa.down.is_empty() && p.pb.down.is_empty());
    assert_eq!(p.pb.current_out, new_out);
    p.assert_matched();
}
