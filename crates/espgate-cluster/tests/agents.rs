//! Agents against a real etcd (`/usr/bin/etcd`, started per test on free
//! 127.0.0.1 ports in a temporary directory) and fake daemons: election,
//! the plan rule, leaving, crashing, checkpoints, an etcd outage.

use anyhow::Result;
use espgate_api::cluster::{ClusterSa, ClusterStatus, ClusterUpdate, Lockstep};
use espgate_cluster::{cluster_view, Agent, ClusterView, Node};
use espgate_config::cluster::Cluster;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "espgate-etcd-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating etcd's directory");
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
}

impl Fake {
    fn new(id: u16, in_step: bool) -> Arc<Fake> {
        Arc::new(Fake {
            id,
            in_step: AtomicBool::new(in_step),
            updates: Mutex::new(Vec::new()),
        })
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
            sas: vec![ClusterSa {
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
            }],
        }))
    }

    fn update(&self, update: ClusterUpdate) -> Result<()> {
        self.updates.lock().unwrap().push(update);
        Ok(())
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

/// No update any fake ever got carries its own checkpoints, and the
/// latest one of each live node carries exactly the other live nodes'.
fn check_updates(fakes: &[Arc<Fake>], live: &[u16]) {
    for f in fakes {
        for u in f.updates.lock().unwrap().iter() {
            assert!(
                u.checkpoints.iter().all(|c| c.node != f.id),
                "node {} was sent its own checkpoint: {u:?}",
                f.id
            );
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
