//! Agents against a real etcd (`/usr/bin/etcd`, started per test on free
//! 127.0.0.1 ports in a temporary directory) and fake daemons: election,
//! the plan rule, leaving, crashing, checkpoints, an etcd outage, and the
//! SAs and IKE SA states of the leader's IKE shared through etcd.

use anyhow::{bail, Result};
use espgate_api::cluster::{
    ClusterSa, ClusterSas, ClusterStatus, ClusterUpdate, Lockstep, SharedIke, SharedSa,
};
use espgate_cluster::{cluster_view, Agent, ClusterView, Keys, Node, Sealer};
use espgate_config::cluster::{Cluster, ClusterKey};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ETCD: &str = "/usr/bin/etcd";
/// The shortest lease the configuration allows.
const TTL: Duration = Duration::from_secs(2);

/// A single-member etcd in a temporary directory; killed and removed on
/// drop.
struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    client: u16,
    peer: u16,
    /// Serves clients over TLS with these files (made by [`make_certs`]).
    tls: Option<Certs>,
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, in
/// PEM files.
#[derive(Clone)]
struct Certs {
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

/// Makes [`Certs`] in `dir` with openssl.
fn make_certs(dir: &std::path::Path) -> Certs {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("running openssl (scripts/setup.sh installs it)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem", "-days", "1"]);
    ca.extend(["-subj", "/CN=espgate test CA"]);
    openssl(&ca);
    for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
        let (key, csr, pem, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        std::fs::write(
            dir.join(&ext),
            format!("subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"),
        )
        .expect("writing an extensions file");
        let cn = format!("/CN={name}");
        let mut req = vec!["req"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr, "-subj", &cn]);
        openssl(&req);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "1",
            "-extfile",
            &ext,
        ]);
    }
    Certs {
        ca: dir.join("ca.pem"),
        server: (dir.join("server.pem"), dir.join("server.key")),
        client: (dir.join("client.pem"), dir.join("client.key")),
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    l.local_addr().expect("its address").port()
}

impl Etcd {
    fn start() -> Etcd {
        Etcd::start_with(false)
    }

    /// etcd serving clients over TLS with client certificates.
    fn start_tls() -> Etcd {
        Etcd::start_with(true)
    }

    fn start_with(tls: bool) -> Etcd {
        assert!(
            std::path::Path::new(ETCD).is_file(),
            "{ETCD} is missing: the cluster agent's tests need etcd (scripts/setup.sh \
             installs etcd-server)"
        );
        let dir = espgate_testkit::temp_dir("etcd");
        let tls = tls.then(|| make_certs(&dir));
        let mut e = Etcd {
            child: None,
            dir,
            client: free_port(),
            peer: free_port(),
            tls,
        };
        e.run();
        e
    }

    fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client)
    }

    /// Starts etcd on this directory and these ports, and waits until it
    /// answers.
    fn run(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .expect("etcd's log");
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let mut cmd = Command::new(ETCD);
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&t.server.0)
                .arg("--key-file")
                .arg(&t.server.1)
                .arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--client-cert-auth");
        }
        let child = cmd
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &self.url()])
            .args(["--advertise-client-urls", &self.url()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .args(["--heartbeat-interval", "50", "--election-timeout", "250"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd's log"))
            .stderr(log)
            .spawn()
            .expect("starting etcd");
        self.child = Some(child);
        let t0 = Instant::now();
        for _ in 0..200 {
            if self.healthy() {
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!(
                        "etcd exited with {st}; see {}",
                        self.dir.join("etcd.log").display()
                    );
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "etcd did not answer within {:?}; see {}",
            t0.elapsed(),
            self.dir.join("etcd.log").display()
        );
    }

    /// `GET /health` says true (with TLS: the port takes connections;
    /// the test then waits for an answer through the agent's client).
    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.client)) else {
            return false;
        };
        if self.tls.is_some() {
            return true;
        }
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text.contains("\"health\":\"true\"")
    }

    /// Kills etcd (SIGKILL) and waits for it.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The SA every fake node shares (as the nodes of a cluster do).
const SPI: u32 = 0x1001;

/// A daemon that answers from flags and records its updates.
struct Fake {
    id: u16,
    in_step: AtomicBool,
    updates: Mutex<Vec<ClusterUpdate>>,
    /// What it exports (as the leader's daemon would: its IKE's SAs).
    export: Mutex<ClusterSas>,
    /// The shared SAs its status says are installed and ready.
    ready: Mutex<Vec<(u32, bool)>>,
    /// The share calls it got.
    shares: Mutex<Vec<(u32, bool)>>,
}

/// The counter a fake daemon shares its SAs from.
const SHARE_FROM: u64 = 5000;

impl Fake {
    fn new(id: u16, in_step: bool) -> Arc<Fake> {
        Arc::new(Fake {
            id,
            in_step: AtomicBool::new(in_step),
            updates: Mutex::new(Vec::new()),
            export: Mutex::new(ClusterSas::default()),
            ready: Mutex::new(Vec::new()),
            shares: Mutex::new(Vec::new()),
        })
    }

    /// Exports `sas` from now on (a new generation).
    fn set_export(&self, sas: Vec<SharedSa>) {
        let mut x = self.export.lock().unwrap();
        x.generation += 1;
        x.sas = sas;
    }

    /// Exports `ike` as its IKE SA states from now on (a new generation).
    fn set_ike(&self, ike: Vec<SharedIke>) {
        let mut x = self.export.lock().unwrap();
        x.generation += 1;
        x.ike = ike;
    }

    fn count(&self) -> usize {
        self.updates.lock().unwrap().len()
    }

    fn last(&self) -> Option<ClusterUpdate> {
        self.updates.lock().unwrap().last().cloned()
    }
}

impl Node for Fake {
    fn status(&self) -> Result<Option<ClusterStatus>> {
        let in_step = self.in_step.load(Ordering::Relaxed);
        Ok(Some(ClusterStatus {
            name: "t".into(),
            node: self.id,
            dispatch: "packet-rr".into(),
            plan: None,
            leader: None,
            plan_age_ms: None,
            state: if in_step { "processing" } else { "resyncing" }.into(),
            in_step,
            sas: std::iter::once(ClusterSa {
                conn: "site".into(),
                spi: SPI,
                outbound: true,
                processed: 10 * u64::from(self.id),
                observed: 100,
                checkpoint: Some((256 * u64::from(self.id), u64::from(self.id))),
                lockstep: Some(if in_step {
                    Lockstep::InStep
                } else {
                    Lockstep::OutOfStep
                }),
                resyncs: 0,
                shared: false,
                solo: None,
                share_from: None,
            })
            .chain(
                self.ready
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|&(spi, outbound)| ClusterSa {
                        conn: "ike".into(),
                        spi,
                        outbound,
                        processed: 0,
                        observed: 0,
                        checkpoint: None,
                        lockstep: outbound.then_some(Lockstep::InStep),
                        resyncs: 0,
                        shared: true,
                        solo: None,
                        share_from: None,
                    }),
            )
            .collect(),
        }))
    }

    fn update(&self, update: ClusterUpdate) -> Result<()> {
        self.updates.lock().unwrap().push(update);
        Ok(())
    }

    fn export(&self) -> Result<ClusterSas> {
        Ok(self.export.lock().unwrap().clone())
    }

    fn share(&self, spi: u32, outbound: bool) -> Result<ClusterSas> {
        self.shares.lock().unwrap().push((spi, outbound));
        let mut x = self.export.lock().unwrap();
        let Some(sa) = x
            .sas
            .iter_mut()
            .find(|s| s.spi == spi && s.outbound == outbound)
        else {
            bail!("SA {spi:#x} is not shared by this node");
        };
        sa.share_from = Some(SHARE_FROM);
        x.generation += 1;
        Ok(x.clone())
    }
}

fn cluster(etcd: &Etcd, name: &str, node: u16) -> Cluster {
    Cluster {
        name: name.into(),
        node,
        etcd: vec![etcd.url()],
        etcd_ca: None,
        etcd_cert: None,
        etcd_key: None,
        etcd_user: None,
        etcd_password_file: None,
        key_file: None,
        key: None,
        dispatch: espgate_core::cluster::Dispatch::PacketRr,
        inside: None,
        outside: None,
        lease_ttl: TTL,
        hold: Duration::from_secs(10),
    }
}

fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "espgate_cluster=info".into()),
        )
        .try_init();
}

/// Polls `f` every 100 ms until it gives `Some`, for at most `limit`.
fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    let tries = limit.as_millis() / 100 + 1;
    for _ in 0..tries {
        if let Some(x) = f() {
            return x;
        }
        if t0.elapsed() > limit {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what}: not within {limit:?}");
}

/// The view once its leader is set and its plan has exactly `members`.
fn wait_for_plan(c: &Cluster, members: &[u16], limit: Duration) -> ClusterView {
    let mut last = None;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&format!("plan {members:?} with a leader"), limit, || {
            let v = cluster_view(c).ok()?;
            last = Some(v.clone());
            (v.leader.is_some() && v.plan.as_ref().is_some_and(|p| p.members == members))
                .then_some(v)
        })
    }));
    match r {
        Ok(v) => v,
        Err(e) => {
            if let Some(v) = last {
                eprintln!("last view:\n{}", v.render());
            }
            std::panic::resume_unwind(e)
        }
    }
}

/// No update any fake ever got carries its own checkpoints (nor shared
/// SAs: these clusters have no key), and the latest one of each live node
/// carries exactly the other live nodes'.
fn check_updates(fakes: &[Arc<Fake>], live: &[u16]) {
    for f in fakes {
        for u in f.updates.lock().unwrap().iter() {
            assert!(
                u.checkpoints.iter().all(|c| c.node != f.id),
                "node {} was sent its own checkpoint: {u:?}",
                f.id
            );
            assert!(u.sas.is_none(), "no cluster key, yet SAs: {u:?}");
            assert!(u.ike.is_none(), "no cluster key, yet IKE states: {u:?}");
        }
    }
    for f in fakes.iter().filter(|f| live.contains(&f.id)) {
        let u = f.last().expect("an update");
        let mut from: Vec<u16> = u.checkpoints.iter().map(|c| c.node).collect();
        from.sort_unstable();
        let others: Vec<u16> = live.iter().copied().filter(|&n| n != f.id).collect();
        assert_eq!(from, others, "node {}'s checkpoints: {u:?}", f.id);
        for c in &u.checkpoints {
            assert_eq!(
                (c.spi, c.seq, c.digest),
                (SPI, 256 * u64::from(c.node), u64::from(c.node))
            );
        }
    }
}

#[test]
fn three_agents_elect_one_leader_and_plan_the_in_step_nodes() {
    logs();
    let etcd = Etcd::start();
    let c: Vec<Cluster> = (1..=3).map(|n| cluster(&etcd, "three", n)).collect();
    // Node 3 starts out of step.
    let fakes = [Fake::new(1, true), Fake::new(2, true), Fake::new(3, false)];
    let mut agents: Vec<Option<Agent>> = c
        .iter()
        .zip(&fakes)
        .map(|(c, f)| Some(Agent::start_with(c, f.clone()).expect("starting an agent")))
        .collect();
    let v = wait_for_plan(&c[0], &[1, 2], Duration::from_secs(10));
    let leader = v.leader.expect("a leader");
    assert!((1..=3).contains(&leader));
    assert_eq!(v.nodes.len(), 3, "{}", v.render());
    let epoch = v.plan.as_ref().unwrap().epoch;

    // Every daemon hears of that plan and of the one leader, with the
    // others' checkpoints (node 3's too: it is live, only not planned).
    wait_for(
        "every node told plan [1, 2]",
        Duration::from_secs(5),
        || {
            fakes
                .iter()
                .all(|f| {
                    f.last().is_some_and(|u| {
                        u.plan.as_ref().is_some_and(|p| p.members == [1, 2])
                            && u.leader == Some(leader)
                            && u.checkpoints.len() == 2
                    })
                })
                .then_some(())
        },
    );
    check_updates(&fakes, &[1, 2, 3]);

    // Node 3 comes into step: it joins, with a higher epoch.
    fakes[2].in_step.store(true, Ordering::Relaxed);
    let v = wait_for_plan(&c[0], &[1, 2, 3], Duration::from_secs(5));
    assert!(v.plan.as_ref().unwrap().epoch > epoch);
    assert_eq!(v.leader, Some(leader), "the leader stays");
    let text = v.render();
    assert!(text.contains(&format!("leader:  node {leader}")), "{text}");

    // A follower stops: it leaves the plan within about a second (its
    // lease is revoked, not left to expire).
    let follower = (1..=3u16).find(|&n| n != leader).unwrap();
    let rest: Vec<u16> = (1..=3).filter(|&n| n != follower).collect();
    let t0 = Instant::now();
    agents[usize::from(follower - 1)].take().unwrap().stop();
    let v = wait_for_plan(&c[0], &rest, TTL + Duration::from_secs(2));
    eprintln!("a stopped follower left the plan in {:?}", t0.elapsed());
    assert_eq!(v.nodes.len(), 2);
    assert_eq!(v.leader, Some(leader));

    // Updates after that carry only the remaining nodes' checkpoints.
    let counts: Vec<usize> = fakes.iter().map(|f| f.count()).collect();
    wait_for("two fresh updates each", Duration::from_secs(5), || {
        rest.iter()
            .all(|&n| fakes[usize::from(n - 1)].count() >= counts[usize::from(n - 1)] + 2)
            .then_some(())
    });
    check_updates(&fakes, &rest);

    // The leader stops: it resigns, the other one leads and plans alone.
    let other = *rest.iter().find(|&&n| n != leader).unwrap();
    agents[usize::from(leader - 1)].take().unwrap().stop();
    let v = wait_for_plan(&c[0], &[other], TTL + Duration::from_secs(2));
    assert_eq!(v.leader, Some(other));
    drop(agents);
}

#[test]
fn a_crashed_leader_is_replaced_within_the_lease_ttl() {
    logs();
    let etcd = Etcd::start();
    let c: Vec<Cluster> = (1..=3).map(|n| cluster(&etcd, "crash", n)).collect();
    let fakes = [Fake::new(1, true), Fake::new(2, true), Fake::new(3, true)];
    let mut agents: Vec<Option<Agent>> = c
        .iter()
        .zip(&fakes)
        .map(|(c, f)| Some(Agent::start_with(c, f.clone()).expect("starting an agent")))
        .collect();
    let v = wait_for_plan(&c[0], &[1, 2, 3], Duration::from_secs(10));
    let leader = v.leader.unwrap();
    let epoch = v.plan.unwrap().epoch;
    let rest: Vec<u16> = (1..=3).filter(|&n| n != leader).collect();
    let t0 = Instant::now();
    // No resign, no revoke: only the lease's expiry tells.
    agents[usize::from(leader - 1)].take().unwrap().abandon();
    let v = wait_for_plan(&c[0], &rest, TTL + Duration::from_secs(3));
    eprintln!("failover took {:?}", t0.elapsed());
    let new = v.leader.unwrap();
    assert!(rest.contains(&new), "leader {new}");
    assert!(v.plan.unwrap().epoch > epoch);
    // The survivors hear the new plan from the new leader.
    wait_for("the survivors told", Duration::from_secs(3), || {
        rest.iter()
            .all(|&n| {
                fakes[usize::from(n - 1)].last().is_some_and(|u| {
                    u.leader == Some(new) && u.plan.is_some_and(|p| p.members == rest)
                })
            })
            .then_some(())
    });
    check_updates(&fakes, &rest);
    drop(agents);
}

#[test]
fn no_updates_without_etcd_and_they_resume_when_it_is_back() {
    logs();
    let mut etcd = Etcd::start();
    let c: Vec<Cluster> = (1..=2).map(|n| cluster(&etcd, "outage", n)).collect();
    let fakes = [Fake::new(1, true), Fake::new(2, true)];
    let agents: Vec<Agent> = c
        .iter()
        .zip(&fakes)
        .map(|(c, f)| Agent::start_with(c, f.clone()).expect("starting an agent"))
        .collect();
    wait_for_plan(&c[0], &[1, 2], Duration::from_secs(10));
    wait_for("updates flowing", Duration::from_secs(5), || {
        fakes.iter().all(|f| f.count() >= 2).then_some(())
    });

    etcd.kill();
    // A cycle already past its etcd read may still deliver.
    std::thread::sleep(Duration::from_millis(1500));
    let before: Vec<usize> = fakes.iter().map(|f| f.count()).collect();
    std::thread::sleep(Duration::from_secs(3));
    let after: Vec<usize> = fakes.iter().map(|f| f.count()).collect();
    assert_eq!(before, after, "updates were sent while etcd was down");
    let err = cluster_view(&c[0]).expect_err("etcd is down");
    eprintln!("etcd down: {err:#}");
    assert!(
        format!("{err:#}").contains(&etcd.url()),
        "the error names the endpoint: {err:#}"
    );

    etcd.run();
    wait_for(
        "updates again after etcd came back",
        Duration::from_secs(15),
        || {
            fakes
                .iter()
                .zip(&after)
                .all(|(f, &n)| f.count() >= n + 2)
                .then_some(())
        },
    );
    let v = wait_for_plan(&c[0], &[1, 2], Duration::from_secs(10));
    assert_eq!(v.nodes.len(), 2, "{}", v.render());
    check_updates(&fakes, &[1, 2]);
    drop(agents);
}

#[test]
fn tls_with_client_certificates() {
    logs();
    let etcd = Etcd::start_tls();
    let certs = etcd.tls.clone().unwrap();
    let mut c = cluster(&etcd, "tls", 1);
    c.etcd_ca = Some(certs.ca.clone());
    c.etcd_cert = Some(certs.client.0.clone());
    c.etcd_key = Some(certs.client.1.clone());
    let fake = Fake::new(1, true);
    let agent = Agent::start_with(&c, fake.clone()).expect("starting an agent");
    let v = wait_for_plan(&c, &[1], Duration::from_secs(10));
    assert_eq!(v.leader, Some(1));
    wait_for("an update over TLS", Duration::from_secs(5), || {
        (fake.count() > 0).then_some(())
    });
    agent.stop();
    // Without the CA the endpoints are refused at once, saying why.
    let mut no_ca = c.clone();
    no_ca.etcd_ca = None;
    let err = cluster_view(&no_ca).expect_err("no CA");
    eprintln!("without etcd_ca: {err:#}");
    assert!(format!("{err:#}").contains("etcd_ca"), "{err:#}");
    // Without a client certificate etcd refuses, and the error names the
    // endpoint.
    let mut no_cert = c.clone();
    no_cert.etcd_cert = None;
    no_cert.etcd_key = None;
    let err = cluster_view(&no_cert).expect_err("no client certificate");
    eprintln!("without a client certificate: {err:#}");
    assert!(format!("{err:#}").contains(&etcd.url()), "{err:#}");
}

/// The cluster key of the SA tests, as hex.
const CLUSTER_KEY: &str = "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf";

fn key(hex_text: &str) -> ClusterKey {
    let mut b = [0u8; 32];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex_text[2 * i..2 * i + 2], 16).unwrap();
    }
    ClusterKey::new(b)
}

fn keyed(etcd: &Etcd, name: &str, node: u16) -> Cluster {
    Cluster {
        key: Some(key(CLUSTER_KEY)),
        ..cluster(etcd, name, node)
    }
}

/// An SA the leader's IKE negotiated.
fn negotiated(owner: u16, spi: u32, outbound: bool, enc_key: &str) -> SharedSa {
    SharedSa {
        conn: "ike-site".into(),
        outbound,
        protocol: "esp".into(),
        spi,
        suite: "aes256gcm16".into(),
        enc_key: enc_key.into(),
        integ_key: String::new(),
        esn: true,
        encap: None,
        peer: None,
        owner,
        share_from: None,
        selectors: Vec::new(),
    }
}

/// Every key under `prefix` in etcd, with its value and mod revision.
fn etcd_entries(etcd: &Etcd, prefix: &str) -> Vec<(String, String, i64)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([etcd.url()], None)
            .await
            .expect("connecting to etcd");
        let r = c
            .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .expect("reading etcd");
        r.kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    String::from_utf8_lossy(kv.value()).into_owned(),
                    kv.mod_revision(),
                )
            })
            .collect()
    })
}

/// Three nodes of cluster `name` with the cluster key, fake daemons and
/// their agents, once the plan names all three: (configurations, fakes,
/// agents, the leader).
fn three_keyed(etcd: &Etcd, name: &str) -> (Vec<Cluster>, [Arc<Fake>; 3], Vec<Agent>, u16) {
    let c: Vec<Cluster> = (1..=3).map(|n| keyed(etcd, name, n)).collect();
    let fakes = [Fake::new(1, true), Fake::new(2, true), Fake::new(3, true)];
    let agents: Vec<Agent> = c
        .iter()
        .zip(&fakes)
        .map(|(c, f)| Agent::start_with(c, f.clone()).expect("starting an agent"))
        .collect();
    let v = wait_for_plan(&c[0], &[1, 2, 3], Duration::from_secs(10));
    (c, fakes, agents, v.leader.unwrap())
}

/// The shared SAs of `f`'s latest update, if it carried them.
fn last_sas(f: &Fake) -> Option<Vec<SharedSa>> {
    f.last().and_then(|u| u.sas)
}

#[test]
fn the_leaders_sas_reach_every_node_encrypted_and_are_shared_when_ready() {
    logs();
    let etcd = Etcd::start();
    let (_c, fakes, agents, leader) = three_keyed(&etcd, "sas");
    let lf = &fakes[usize::from(leader - 1)];
    let followers: Vec<&Arc<Fake>> = fakes.iter().filter(|f| f.id != leader).collect();
    // With a key, every update carries the list (empty so far).
    wait_for("empty SA lists", Duration::from_secs(5), || {
        fakes
            .iter()
            .all(|f| last_sas(f).is_some_and(|l| l.is_empty()))
            .then_some(())
    });

    // The leader's IKE negotiates an outbound and an inbound SA.
    let out_key = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff01020304";
    let in_key = "ffeeddccbbaa99887766554433221100ffeeddccbbaa9988776655443322110005060708";
    let sas = vec![
        negotiated(leader, 0xc0de, true, out_key),
        negotiated(leader, 0xc0df, false, in_key),
    ];
    let t0 = Instant::now();
    lf.set_export(sas.clone());
    wait_for(
        "the followers told the new SAs",
        Duration::from_secs(5),
        || {
            followers
                .iter()
                .all(|f| last_sas(f).is_some_and(|l| l == sas))
                .then_some(())
        },
    );
    eprintln!("a new SA reached the followers in {:?}", t0.elapsed());
    assert!(
        lf.shares.lock().unwrap().is_empty(),
        "shared before the followers were ready"
    );

    // etcd holds them sealed: no key, no connection name in clear.
    let keys = Keys::new("sas");
    let stored = etcd_entries(&etcd, &keys.sas);
    let names: Vec<&str> = stored.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(names, [keys.sa("0x0000c0de-out"), keys.sa("0x0000c0df-in")]);
    for (k, v, _) in &stored {
        for secret in [out_key, in_key, &out_key[..16], &in_key[..16], CLUSTER_KEY] {
            assert!(!v.contains(secret), "{k} shows a key in clear: {v}");
        }
        assert!(!v.contains("ike-site"), "{k}: {v}");
        let doc: serde_json::Value = serde_json::from_str(v).unwrap();
        assert_eq!(doc["v"], 1, "{v}");
        assert!(doc["nonce"].is_string() && doc["ct"].is_string(), "{v}");
    }
    // Published once, not rewritten every second.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(etcd_entries(&etcd, &keys.sas), stored, "rewritten");

    // One follower is ready: still no share. Both are: the leader shares
    // both SAs, and the followers hear share_from.
    let ready = vec![(0xc0de, true), (0xc0df, false)];
    *followers[0].ready.lock().unwrap() = ready.clone();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(lf.shares.lock().unwrap().is_empty(), "shared too early");
    let t0 = Instant::now();
    *followers[1].ready.lock().unwrap() = ready.clone();
    wait_for("both SAs shared", Duration::from_secs(5), || {
        let mut s = lf.shares.lock().unwrap().clone();
        s.sort_unstable();
        (s == [(0xc0de, true), (0xc0df, false)]).then_some(())
    });
    wait_for(
        "the followers told share_from",
        Duration::from_secs(5),
        || {
            followers
                .iter()
                .all(|f| {
                    last_sas(f).is_some_and(|l| {
                        l.len() == 2 && l.iter().all(|s| s.share_from == Some(SHARE_FROM))
                    })
                })
                .then_some(())
        },
    );
    eprintln!("ready to shared on every node in {:?}", t0.elapsed());
    // Each SA was shared once.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(lf.shares.lock().unwrap().len(), 2);
    // The leader's own daemon hears the list too.
    assert!(last_sas(lf).is_some_and(|l| l.iter().all(|s| s.share_from == Some(SHARE_FROM))));

    // A node with another key skips the entries (and says so) and is told
    // an empty list.
    let mut wrong = keyed(&etcd, "sas", 4);
    wrong.key = Some(key(&CLUSTER_KEY.replace('c', "d")));
    let f4 = Fake::new(4, true);
    let a4 = Agent::start_with(&wrong, f4.clone()).expect("starting an agent");
    wait_for("node 4 told", Duration::from_secs(5), || {
        last_sas(&f4).is_some_and(|l| l.is_empty()).then_some(())
    });
    a4.stop();

    // The inbound SA is gone from the leader's daemon: gone from etcd and
    // from the followers' lists.
    let t0 = Instant::now();
    let mut rest = lf.export.lock().unwrap().sas.clone();
    rest.retain(|s| s.outbound);
    lf.set_export(rest.clone());
    wait_for(
        "the followers told the removal",
        Duration::from_secs(5),
        || {
            followers
                .iter()
                .all(|f| last_sas(f).is_some_and(|l| l == rest))
                .then_some(())
        },
    );
    eprintln!("a removal reached the followers in {:?}", t0.elapsed());
    let names: Vec<String> = etcd_entries(&etcd, &keys.sas)
        .into_iter()
        .map(|(k, _, _)| k)
        .collect();
    assert_eq!(names, [keys.sa("0x0000c0de-out")]);
    drop(agents);
}

#[test]
fn a_lone_leader_shares_its_sas_at_once() {
    logs();
    let etcd = Etcd::start();
    let c = keyed(&etcd, "alone", 1);
    let fake = Fake::new(1, true);
    let agent = Agent::start_with(&c, fake.clone()).expect("starting an agent");
    wait_for_plan(&c, &[1], Duration::from_secs(10));
    fake.set_export(vec![negotiated(1, 0xabc, true, "0011")]);
    wait_for("shared", Duration::from_secs(3), || {
        (fake.shares.lock().unwrap().as_slice() == [(0xabc, true)]).then_some(())
    });
    wait_for("the entry says share_from", Duration::from_secs(3), || {
        last_sas(&fake)
            .is_some_and(|l| l.len() == 1 && l[0].share_from == Some(SHARE_FROM) && l[0].owner == 1)
            .then_some(())
    });
    agent.stop();
}

/// Part of every IKE state of the tests: it must never be seen in etcd.
const IKE_SECRET: &str = "5ec2e75ec2e75ec2e75ec2e75ec2e7";

/// The state of the IKE SA of `conn` run by node `owner`, after the
/// exchange with message ID `msg_id`.
fn ike_state(conn: &str, owner: u16, msg_id: u32) -> SharedIke {
    SharedIke {
        conn: conn.into(),
        owner,
        state: format!(r#"{{"spi_i":"0102030405060708","sk_d":"{IKE_SECRET}","msg_id":{msg_id}}}"#),
    }
}

/// The IKE SA states of `f`'s latest update, if it carried them.
fn last_ike(f: &Fake) -> Option<Vec<SharedIke>> {
    f.last().and_then(|u| u.ike)
}

/// Puts `value` at `key` (as someone else than the agents would).
fn etcd_put(etcd: &Etcd, key: &str, value: Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([etcd.url()], None)
            .await
            .expect("connecting to etcd");
        c.put(key, value, None).await.expect("writing etcd");
    })
}

/// The key names under `prefix`.
fn etcd_names(etcd: &Etcd, prefix: &str) -> Vec<String> {
    etcd_entries(etcd, prefix)
        .into_iter()
        .map(|(k, _, _)| k)
        .collect()
}

#[test]
fn the_leaders_ike_state_reaches_every_node_sealed_and_goes_when_dropped() {
    logs();
    let etcd = Etcd::start();
    let (_c, fakes, agents, leader) = three_keyed(&etcd, "ike");
    let lf = &fakes[usize::from(leader - 1)];
    let followers: Vec<&Arc<Fake>> = fakes.iter().filter(|f| f.id != leader).collect();
    let told = |what: &str, want: &[SharedIke]| {
        wait_for(what, Duration::from_secs(5), || {
            followers
                .iter()
                .all(|f| last_ike(f).is_some_and(|l| l == want))
                .then_some(())
        })
    };
    // With a key, every update carries the list (empty so far).
    wait_for("empty IKE lists", Duration::from_secs(5), || {
        fakes
            .iter()
            .all(|f| last_ike(f).is_some_and(|l| l.is_empty()))
            .then_some(())
    });

    // The leader's daemon runs an IKE SA (for a connection whose name has
    // a slash): every follower hears it, decrypted.
    let conn = "site/a";
    let first = vec![ike_state(conn, leader, 1)];
    let t0 = Instant::now();
    lf.set_ike(first.clone());
    told("the followers told the IKE state", &first);
    eprintln!("an IKE state reached the followers in {:?}", t0.elapsed());

    // etcd holds it sealed, under the escaped name.
    let keys = Keys::new("ike");
    let stored = etcd_entries(&etcd, &keys.ike);
    let names: Vec<&str> = stored.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(names, ["/espgate/ike/ike/site%2Fa"]);
    assert_eq!(names, [keys.ike(conn)]);
    for (k, v, _) in &stored {
        for clear in [
            IKE_SECRET,
            &IKE_SECRET[..12],
            "msg_id",
            "sk_d",
            "site",
            CLUSTER_KEY,
        ] {
            assert!(!v.contains(clear), "{k} shows {clear:?} in clear: {v}");
        }
        let doc: serde_json::Value = serde_json::from_str(v).unwrap();
        assert_eq!(doc["v"], 1, "{v}");
        assert!(doc["nonce"].is_string() && doc["ct"].is_string(), "{v}");
    }
    // Written once, not every second (nor every 100 ms poll).
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(etcd_entries(&etcd, &keys.ike), stored, "rewritten");

    // The next exchange changes the state: republished, told again.
    let second = vec![ike_state(conn, leader, 2)];
    let t0 = Instant::now();
    lf.set_ike(second.clone());
    told("the followers told the new state", &second);
    eprintln!(
        "a changed IKE state reached the followers in {:?}",
        t0.elapsed()
    );
    let again = etcd_entries(&etcd, &keys.ike);
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].1, stored[0].1);
    assert!(again[0].2 > stored[0].2);

    // A previous leader's state (node 9) of another connection, and an
    // entry that does not open: the leader deletes neither, though its
    // daemon runs neither; the followers hear the one that opens.
    let sealer = Sealer::new(&key(CLUSTER_KEY)).unwrap();
    let old = ike_state("old", 9, 40);
    let old_key = keys.ike("old");
    etcd_put(&etcd, &old_key, sealer.seal(&old_key, &old).unwrap());
    let junk_key = keys.ike("junk");
    etcd_put(
        &etcd,
        &junk_key,
        sealer.seal(&keys.ike("other"), &old).unwrap(),
    );
    let with_old = vec![old.clone(), second[0].clone()];
    told("the followers told the old leader's state", &with_old);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        etcd_names(&etcd, &keys.ike),
        [junk_key.clone(), old_key.clone(), keys.ike(conn)]
    );
    assert!(last_ike(lf).is_some_and(|l| l == with_old));

    // The leader's daemon continues it: its own state replaces node 9's.
    let taken = ike_state("old", leader, 41);
    lf.set_ike(vec![taken.clone(), second[0].clone()]);
    told(
        "the followers told the state taken over",
        &[taken.clone(), second[0].clone()],
    );

    // Its daemon drops both: both entries go, the one that does not open
    // stays.
    let t0 = Instant::now();
    lf.set_ike(Vec::new());
    told("the followers told the removal", &[]);
    eprintln!("a removal reached the followers in {:?}", t0.elapsed());
    assert_eq!(etcd_names(&etcd, &keys.ike), [junk_key]);
    // Nothing of this touched sas/.
    assert!(etcd_names(&etcd, &keys.sas).is_empty());
    drop(agents);
}
