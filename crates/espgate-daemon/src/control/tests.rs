//! The control plane's answers, over engines built from the test kit's
//! mirrored connections (no sockets, no TUN).

use super::*;
use espgate_api::control::parse_request;
use espgate_api::costs::{ClockKind, CostCells, Costs, Dir};
use espgate_core::cost::Stage;
use espgate_core::gateway::{Layers, Received};
use espgate_core::PacketBuf;
use espgate_testkit::keys::{I_AB, I_BA, K_AB, K_BA, K_NEW_AB};
use espgate_testkit::{from_a, mirrored, opts, udp4, Shape};

const T: Duration = Duration::from_secs(1);

fn info() -> Info {
    Info {
        config: "test.toml".into(),
        tun: espgate_api::status::TunStatus {
            name: "egt0".into(),
            mtu: 1438,
        },
        encap: "udp".into(),
        listen: None,
        fwmark: None,
        state_dir: "/nonexistent".into(),
        offloads: Vec::new(),
        cluster: None,
    }
}

/// Site A's control plane with `n` workers (and their cost cells), and
/// site B's engine.
fn site_a(n: usize) -> (Control, Vec<Arc<CostCells>>, Engine) {
    let (ca, cb) = mirrored(Shape::new(Layers::Esp, true));
    let engines = Engine::for_workers(&[ca], &opts(), T, n).unwrap();
    let cells: Vec<Arc<CostCells>> = (0..n)
        .map(|_| Arc::new(CostCells::new(ClockKind::Monotonic)))
        .collect();
    let views = cells
        .iter()
        .map(|c| CostsView::new(c.clone(), false))
        .collect();
    let ctl = Control::new(
        engines,
        views,
        info(),
        Instant::now(),
        None,
        Arc::new(crate::spifilter::SpiFilter::new(Vec::new())),
    );
    let b = Engine::new(&[cb], &opts(), T).unwrap();
    (ctl, cells, b)
}

fn ask(ctl: &Control, line: &str) -> Response {
    match parse_request(line.as_bytes()) {
        Ok(r) => ctl.handle(r),
        Err(e) => Response::error(e),
    }
}

fn message(r: &Response) -> String {
    match r {
        Response::Changed(c) => c.message.clone(),
        Response::Error(e) => format!("error: {e}"),
        other => panic!("not a change: {other:?}"),
    }
}

/// A packet from worker `k` of A to B, probed when `costs` is given (as the
/// worker does while accounting is on).
fn send(ctl: &Control, k: usize, b: &mut Engine, costs: Option<&mut Costs>) -> bool {
    let mut buf = PacketBuf::with_capacity(2000);
    buf.load(&udp4("10.1.0.5", "10.2.0.9", 10));
    let mut a = lock(&ctl.engines[k]);
    let r = match costs {
        Some(c) => {
            c.begin(Dir::Outbound);
            a.outbound_probed(&mut buf, T, c)
        }
        None => a.outbound(&mut buf, T),
    };
    r.is_ok_and(|c| c.is_some()) && b.inbound(&mut buf, T, from_a()) == Ok(Received::Packet)
}

#[test]
fn sa_changes_and_keys() {
    let (ctl, _, _) = site_a(1);
    let r = ask(
        &ctl,
        &format!(
            r#"{{"cmd":"sa_add","conn":"peer","dir":"in","spec":"spi=0x3001,suite=aes256-sha1,enc={},integ={}"}}"#,
            &I_AB[..64],
            &I_BA[..40]
        ),
    );
    assert!(message(&r).contains("(aes256-sha1)"), "{r:?}");
    assert!(!r.to_line().contains(&I_AB[..64]), "no keys in the answer");
    let r = ask(
        &ctl,
        r#"{"cmd":"sa_add","conn":"peer","dir":"sideways","spec":"x"}"#,
    );
    assert!(message(&r).contains("unknown variant `sideways`"), "{r:?}");
    let r = ask(&ctl, r#"{"cmd":"sa_add","conn":"peer"}"#);
    assert!(message(&r).contains("missing field `dir`"), "{r:?}");
    let r = ask(&ctl, r#"{"cmd":"sa_del"}"#);
    assert!(message(&r).contains("missing field `spi`"), "{r:?}");
    let r = ask(
        &ctl,
        r#"{"cmd":"sa_add","conn":"nope","dir":"in","spec":"spi=0x3002"}"#,
    );
    assert!(
        message(&r).contains("no connection named \"nope\""),
        "{r:?}"
    );
    let Response::Keys(keys) = ask(&ctl, r#"{"cmd":"wireshark_keys"}"#) else {
        panic!("no keys")
    };
    let got: Vec<(String, u32, String, String, String, String)> = keys
        .iter()
        .map(|k| {
            (
                k.direction.clone(),
                k.spi,
                k.src.clone(),
                k.dst.clone(),
                k.suite.clone(),
                k.enc_key.clone(),
            )
        })
        .collect();
    let s = |x: &str| x.to_string();
    assert_eq!(
        got,
        [
            (
                s("in"),
                0x1001,
                s("192.0.2.2"),
                s("192.0.2.1"),
                s("aes128gcm16"),
                s(K_BA)
            ),
            (
                s("in"),
                0x3001,
                s("192.0.2.2"),
                s("192.0.2.1"),
                s("aes256-sha1"),
                s(&I_AB[..64])
            ),
            (
                s("out"),
                0x1002,
                s("192.0.2.1"),
                s("192.0.2.2"),
                s("aes128gcm16"),
                s(K_AB)
            ),
        ]
    );
    assert_eq!(keys[1].integ_key, &I_BA[..40]);
    assert_eq!((keys[2].sport, keys[2].dport), (Some(4500), Some(4500)));
    let r = ask(
        &ctl,
        r#"{"cmd":"sa_del","spi":12289,"proto":"esp","dir":"in"}"#,
    );
    assert!(
        message(&r).contains("removed inbound ESP SA 0x00003001"),
        "{r:?}"
    );
    let Response::Sas(sas) = ask(&ctl, r#"{"cmd":"sa_list"}"#) else {
        panic!("no SA list")
    };
    assert_eq!(sas.len(), 2);
    // IKE commands without IKE say so.
    let r = ask(&ctl, r#"{"cmd":"initiate","conn":"peer"}"#);
    assert!(
        message(&r).contains("no connection of this gateway uses IKE"),
        "{r:?}"
    );
}

#[test]
fn sa_changes_reach_every_worker() {
    let (ctl, _, mut b) = site_a(2);
    // B first accepts the new key, then A switches its outbound SA: both
    // workers send on it, from one counter.
    b.add_sa(
        "peer",
        false,
        &format!("spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}"),
        T,
    )
    .unwrap();
    let r = ask(
        &ctl,
        &format!(
            r#"{{"cmd":"sa_add","conn":"peer","dir":"out","spec":"spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}"}}"#
        ),
    );
    assert!(message(&r).contains("replaces ESP SA 0x00001002"), "{r:?}");
    for i in 0..6 {
        assert!(send(&ctl, i % 2, &mut b, None), "packet {i}");
    }
    let st = ctl.status();
    let out = st.connections[0]
        .sas
        .iter()
        .find(|s| s.direction == "out")
        .unwrap();
    assert_eq!(
        (out.spi.as_str(), out.packets, out.next_seq),
        ("0x00003001", 6, Some(7))
    );
    // An inbound SA lands in the one worker its SPI is steered to, and
    // goes from there.
    let r = ask(
        &ctl,
        &format!(
            r#"{{"cmd":"sa_add","conn":"peer","dir":"in","spec":"spi=0x3003,suite=aes128gcm16,enc={K_NEW_AB}"}}"#
        ),
    );
    assert!(
        message(&r).contains("added inbound ESP SA 0x00003003"),
        "{r:?}"
    );
    let held: Vec<usize> = ctl
        .stats
        .iter()
        .map(|w| w.sas().iter().filter(|s| s.spi == 0x3003).count())
        .collect();
    assert_eq!(held, [0, 1]);
    let r = ask(&ctl, r#"{"cmd":"sa_del","spi":12291}"#);
    assert!(
        message(&r).contains("removed inbound ESP SA 0x00003003"),
        "{r:?}"
    );
    let r = ask(&ctl, r#"{"cmd":"sa_del","spi":12291}"#);
    assert!(message(&r).contains("no SA with SPI 0x00003003"), "{r:?}");
}

#[test]
fn cost_accounting_switches_and_counts_each_stage() {
    let (ctl, cells, mut b) = site_a(1);
    let mut costs = Costs::over(cells[0].clone());
    let costs_of = |ctl: &Control| ctl.status().costs;
    assert!(costs_of(&ctl).is_none());
    assert!(message(&ask(&ctl, r#"{"cmd":"costs","action":"reset"}"#)).contains("is off"));
    let r = ask(&ctl, r#"{"cmd":"costs","action":"on"}"#);
    assert!(message(&r).starts_with("cost accounting on"), "{r:?}");
    assert!(cells[0].is_on());
    for _ in 0..4 {
        assert!(send(&ctl, 0, &mut b, Some(&mut costs)));
    }
    let out = costs_of(&ctl).unwrap().outbound;
    assert_eq!(out.packets, 4);
    for s in [Stage::Lookup, Stage::Replay, Stage::Encap, Stage::Cipher] {
        assert_eq!(out.stage(s).packets, 4, "{s:?}");
    }
    // AEAD: no separate integrity; no I/O here.
    assert_eq!(out.stage(Stage::Integrity).packets, 0);
    assert_eq!(out.stage(Stage::Send).packets, 0);
    // I/O stages are charged by the worker around its system calls.
    let t = costs.now();
    costs.sent(t, Dir::Outbound, 3);
    assert_eq!(
        costs_of(&ctl).unwrap().outbound.stage(Stage::Send).packets,
        3
    );
    let r = ask(&ctl, r#"{"cmd":"costs","action":"on"}"#);
    assert!(message(&r).contains("already on"), "{r:?}");
    assert_eq!(
        costs_of(&ctl).unwrap().outbound.packets,
        4,
        "on keeps the counts"
    );
    assert!(message(&ask(&ctl, r#"{"cmd":"costs","action":"reset"}"#)).contains("reset"));
    assert_eq!(costs_of(&ctl).unwrap().outbound.packets, 0);
    assert!(message(&ask(&ctl, r#"{"cmd":"costs","action":"off"}"#)).contains("off"));
    assert!(costs_of(&ctl).is_none() && !cells[0].is_on());
    let r = ask(&ctl, r#"{"cmd":"costs","action":"sideways"}"#);
    assert!(
        message(&r).contains("expected one of `on`, `off`, `reset`"),
        "{r:?}"
    );
}

#[test]
fn status_never_waits_for_a_worker() {
    let (ctl, _, mut b) = site_a(1);
    for _ in 0..3 {
        assert!(send(&ctl, 0, &mut b, None));
    }
    let ctl = Arc::new(ctl);
    // A "worker" holds its engine's lock for a long round.
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let c = ctl.clone();
    let holder = std::thread::spawn(move || {
        let _guard = lock(&c.engines[0]);
        held_tx.send(()).unwrap();
        // Released when the status is done, or after 5 s at the latest.
        let _ = done_rx.recv_timeout(Duration::from_secs(5));
    });
    held_rx.recv().unwrap();
    let t = Instant::now();
    let st = ctl.status();
    let text = metrics::render(&st);
    let waited = t.elapsed();
    done_tx.send(()).unwrap();
    holder.join().unwrap();
    assert!(
        waited < Duration::from_secs(2),
        "status waited {waited:?} for the engine"
    );
    assert_eq!(st.counters["tun_rx"], 3);
    let out = st.connections[0]
        .sas
        .iter()
        .find(|s| s.direction == "out")
        .unwrap();
    assert_eq!(out.packets, 3);
    assert!(text.contains("espgate_tun_rx_packets_total 3"), "{text}");
}

mod socket {
    use super::*;
    use espgate_api::control::{Client, ClientError};
    use server::ControlSocket;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::path::PathBuf;

    fn temp_sock() -> PathBuf {
        espgate_testkit::temp_dir("ctl").join("ctl.sock")
    }

    /// Serves `sock` for `ctl` on a runtime of its own while `f` runs.
    fn serving<T>(mut sock: ControlSocket, ctl: Control, f: impl FnOnce() -> T) -> T {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (stop_tx, stop_rx) = watch::channel(false);
        let listener = rt.block_on(async { sock.take_listener() }).unwrap();
        let ctl = Arc::new(ctl);
        let t = std::thread::spawn(move || {
            rt.block_on(server::serve(listener, ctl, stop_rx));
            drop(sock);
        });
        let r = f();
        let _ = stop_tx.send(true);
        t.join().unwrap();
        r
    }

    #[test]
    fn requests_answers_and_cleanup() {
        let path = temp_sock();
        let sock = ControlSocket::bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (ctl, _, _) = site_a(1);
        let p = path.clone();
        let (second, status, bad, all) = serving(sock, ctl, || {
            // A second daemon is refused while this one answers.
            let second = server::check_not_running(&p).unwrap_err().to_string();
            let c = Client::new(&p, Duration::from_secs(5));
            let status = c.status().unwrap();
            let bad = c
                .change(&Request::Initiate { conn: "x".into() })
                .unwrap_err()
                .to_string();
            // Two requests on one connection, a blank line, then garbage
            // and a last request without its newline.
            let mut s = UnixStream::connect(&p).unwrap();
            s.write_all(
                b"{\"cmd\":\"status\"}\n\n{\"cmd\":\"sa_list\"}\nnot json\n{\"cmd\":\"sa_list\"}",
            )
            .unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut all = String::new();
            s.read_to_string(&mut all).unwrap();
            (second, status, bad, all)
        });
        assert!(
            second.contains("another espgate daemon is running"),
            "{second}"
        );
        assert_eq!(status.connections[0].name, "peer");
        assert!(
            bad.contains("the daemon refused") && bad.contains("IKE"),
            "{bad}"
        );
        let lines: Vec<&str> = all.lines().collect();
        assert_eq!(lines.len(), 4, "{all}");
        assert!(lines[1].starts_with(r#"{"ok":true,"sas":["#), "{all}");
        assert!(lines[2].contains("bad request"), "{all}");
        assert!(lines[3].starts_with(r#"{"ok":true,"sas":["#), "{all}");
        assert!(!path.exists(), "socket removed on drop");
        // Nothing running: a clear error naming the path.
        let e = Client::new(&path, Duration::from_secs(1))
            .status()
            .unwrap_err();
        assert!(matches!(e, ClientError::NotRunning(..)));
        assert!(e.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn long_requests_are_refused_and_silent_clients_block_nobody() {
        let path = temp_sock();
        let sock = ControlSocket::bind(&path).unwrap();
        let (ctl, _, _) = site_a(1);
        let p = path.clone();
        let (long, ok) = serving(sock, ctl, || {
            let _silent: Vec<UnixStream> =
                (0..3).map(|_| UnixStream::connect(&p).unwrap()).collect();
            let mut s = UnixStream::connect(&p).unwrap();
            s.write_all(&vec![b'x'; espgate_api::control::MAX_REQUEST + 1000])
                .unwrap();
            let mut long = String::new();
            s.read_to_string(&mut long).unwrap();
            let ok = Client::new(&p, Duration::from_secs(5)).status().is_ok();
            (long, ok)
        });
        let want = format!(
            "request longer than {} bytes",
            espgate_api::control::MAX_REQUEST
        );
        assert!(long.contains(&want), "{long}");
        assert!(ok);
    }

    #[test]
    fn more_silent_clients_than_slots_do_not_lock_out_the_operator() {
        let path = temp_sock();
        let sock = ControlSocket::bind(&path).unwrap();
        let (ctl, _, _) = site_a(1);
        let p = path.clone();
        let ok = serving(sock, ctl, || {
            // More idle connections than there are slots: each is closed
            // after IDLE_TIMEOUT, so the operator waits at most that long
            // (before, the slots stayed taken for CLIENT_TIMEOUT, 10 s).
            let _silent: Vec<UnixStream> = (0..super::server::MAX_CLIENTS + 20)
                .map(|_| UnixStream::connect(&p).unwrap())
                .collect();
            let timeout = super::server::IDLE_TIMEOUT * 2 + Duration::from_secs(1);
            Client::new(&p, timeout).status().map(|_| ())
        });
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn stale_socket_is_replaced_and_other_files_are_not() {
        let path = temp_sock();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // A socket nobody listens on (its listener closed without unlinking).
        drop(UnixListener::bind(&path).unwrap());
        let e = Client::new(&path, Duration::from_secs(1))
            .status()
            .unwrap_err();
        assert!(matches!(e, ClientError::NotRunning(..)), "{e}");
        let sock = ControlSocket::bind(&path).unwrap();
        drop(sock);
        std::fs::write(&path, "not a socket").unwrap();
        let e = ControlSocket::bind(&path).unwrap_err().to_string();
        assert!(e.contains("is not a socket"), "{e}");
        assert!(path.exists());
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}

#[test]
fn the_spi_filter_engages_on_floods_follows_sa_add_and_ends() {
    use crate::sockets::UdpSock;
    use crate::spifilter::{SpiFilter, ENGAGE_PER_SEC, QUIET_SECS};
    use espgate_core::DropReason;
    // Site A with its peer on loopback, its ESP-in-UDP socket there too.
    let (mut ca, _) = mirrored(Shape::new(Layers::Esp, true));
    ca.remote = "127.0.0.1".parse().unwrap();
    for sa in &mut ca.inbound {
        sa.tunnel_src = Some(ca.remote);
    }
    let engines = Engine::for_workers(&[ca], &opts(), T, 1).unwrap();
    let sock = Arc::new(UdpSock::open("127.0.0.1:0".parse().unwrap(), None, false).unwrap());
    let to = sock.local_addr().unwrap();
    let filter = Arc::new(SpiFilter::new(vec![sock.clone()]));
    let cells = Arc::new(CostCells::new(ClockKind::Monotonic));
    let ctl = Control::new(
        engines,
        vec![CostsView::new(cells, false)],
        info(),
        Instant::now(),
        None,
        filter.clone(),
    );
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let other = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
    let esp = |spi: u32| {
        let mut p = spi.to_be_bytes().to_vec();
        p.extend_from_slice(&[0, 0, 0, 1, 0xaa, 0xbb, 0xcc, 0xdd]);
        p
    };
    // Which of `sends` (sender, SPI) reach the socket.
    let arrives = |sends: &[(&std::net::UdpSocket, u32)]| -> Vec<u32> {
        for (s, spi) in sends {
            s.send_to(&esp(*spi), to).unwrap();
        }
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        let deadline = Instant::now() + Duration::from_millis(300);
        while Instant::now() < deadline {
            match sock.recv(&mut buf) {
                Ok((n, _)) if n >= 4 => {
                    got.push(u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]));
                }
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        got.sort_unstable();
        got
    };
    let flood = |d: DropReason| {
        for _ in 0..ENGAGE_PER_SEC {
            ctl.stats[0].counters.drops.count(d);
        }
    };
    ctl.spi_filter.tick(&ctl.engines, &ctl.stats);
    // No flood: no filter, a stray SPI reaches the engine (its counter
    // and log line tell the operator).
    assert_eq!(
        arrives(&[(&peer, 0x1001), (&peer, 0x9999)]),
        [0x1001, 0x9999]
    );
    flood(DropReason::UnknownSpi);
    ctl.spi_filter.tick(&ctl.engines, &ctl.stats);
    assert!(filter.engaged());
    assert_eq!(arrives(&[(&peer, 0x1001), (&peer, 0x9999)]), [0x1001]);
    // An SA added during the flood is let in at once.
    let r = ask(
        &ctl,
        &format!(
            r#"{{"cmd":"sa_add","conn":"peer","dir":"in","spec":"spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}"}}"#
        ),
    );
    assert!(matches!(r, Response::Changed(_)), "{r:?}");
    assert_eq!(arrives(&[(&peer, 0x3001), (&other, 0x9999)]), [0x3001]);
    // Bad ICVs: the SAs' packets only from the peer's address.
    flood(DropReason::Integrity);
    ctl.spi_filter.tick(&ctl.engines, &ctl.stats);
    assert_eq!(
        arrives(&[
            (&peer, 0x1001),
            (&other, 0x1001),
            (&other, 0x3001),
            (&peer, 0x3001)
        ]),
        [0x1001, 0x3001]
    );
    let st = ctl.status();
    assert!(st.counters["udp_socket_drops"] >= 4, "{:?}", st.counters);
    assert_eq!(st.counters["spi_filter_engaged"], 2);
    // Quiet seconds end both modes.
    for _ in 0..QUIET_SECS {
        assert!(filter.engaged());
        ctl.spi_filter.tick(&ctl.engines, &ctl.stats);
    }
    assert!(!filter.engaged());
    assert_eq!(
        arrives(&[(&other, 0x1001), (&peer, 0x9999)]),
        [0x1001, 0x9999]
    );
}
