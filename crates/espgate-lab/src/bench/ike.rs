//! `espgate bench ike`: what a complete IKEv2 handshake costs on this
//! machine, and where the time goes (seed 004's per-operation breakdown of
//! IKE, for IKEv2).
//!
//! Two [`Ike`] engines run in memory on the calling thread: the initiator
//! sends IKE_SA_INIT, the responder answers, then IKE_AUTH creates the IKE
//! SA and one child SA (no PFS group for the child, so the handshake has
//! exactly one key exchange: two key pairs and two agreements). Datagrams
//! are handed from one engine's [`Ike::poll_transmit`] to the other's
//! [`Ike::handle`] until both are quiet; there is no socket and no network,
//! so the wall time of a handshake is the CPU work of both sides.
//!
//! Each handshake gets a fresh pair of engines (built before the clock
//! starts) with a monotonic clock lent to both ([`Ike::set_cost_clock`]), so
//! [`Ike::costs`] accounts every timed operation of that handshake: key
//! exchange (`dh`), creating and checking AUTH (`auth_create`,
//! `auth_verify`: signatures or the PSK MAC), SKEYSEED and KEYMAT
//! (`key_derivation`), `encrypt`, `decrypt`, `encode`, `decode`. The
//! columns are the engine's own accounting: `encrypt` is encoding and
//! sealing a protected message, `decrypt` opening one and parsing what is
//! inside, `encode` / `decode` building / parsing a clear IKE_SA_INIT
//! message. `other` is the wall time minus all of them: the
//! state machine, allocation, the RNG (SPIs, nonces), the NAT detection
//! hashes, and whatever the engine does not time on its own.
//!
//! Before a combination is timed one warm-up handshake runs (discarded);
//! every handshake, warm-up included, must end with both sides'
//! [`Ike::status`] showing one established IKE SA with one child SA and two
//! installed SAs (one per direction) on each side, or the run fails.
//!
//! Signature keys are generated once per run (one key per side and kind,
//! only for the kinds asked); the peers authenticate each other with raw
//! public keys ([`RemoteAuth::PublicKey`]), so no certificate chain is
//! checked.

use anyhow::{anyhow, bail, ensure, Context, Result};
use espgate_api::table::{Column, Table};
use espgate_core::sa::Mode;
use espgate_core::selector::Prefix;
use espgate_ike::cert::Identity;
use espgate_ike::config::{
    ChildConfig, DpdAction, IkeConfig, LocalAuth, QespMode, RemoteAuth, Retransmit,
};
use espgate_ike::dh::Group;
use espgate_ike::engine::{Event, Ike, IkeCosts, IkeOp, Level, Ports};
use espgate_ike::proposal::{ProposalKind, ProposalSpec};
use espgate_ike::sig::{generate_psk, KeyKind, PrivateKey};
use espgate_ike::ts;
use serde::Serialize;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// Groups run when none is named.
pub const DEFAULT_GROUPS: [&str; 5] = ["x25519", "ecp256", "ecp384", "modp2048", "modp3072"];
/// Authentication methods run when none is named.
pub const DEFAULT_AUTHS: [&str; 5] = ["psk", "ed25519", "ecdsa-p256", "ecdsa-p384", "rsa-3072"];
/// IKE proposal of every handshake, with the group appended.
pub const IKE_CIPHER: &str = "aes128gcm16-prfsha256";
/// ESP proposal of the child SA (no PFS group).
pub const ESP_PROPOSAL: &str = "aes128gcm16";
/// Exchanges delivered per handshake at most before it counts as stuck.
const MAX_ROUNDS: usize = 16;
/// Connection name on both sides.
const CONN: &str = "bench";
const INITIATOR: &str = "192.0.2.1";
const RESPONDER: &str = "192.0.2.2";

const USAGE: &str = "\
One row per group x auth method: complete IKEv2 handshakes (IKE_SA_INIT + IKE_AUTH with one
child SA) between two engines in memory on one thread, a fresh pair per handshake, IKE proposal
aes128gcm16-prfsha256-<group>, child aes128gcm16 without PFS. Every handshake is checked (both
sides established with one child SA) or the run fails.

Columns are microseconds per handshake, both sides summed: dh (key pairs and shared secrets),
auth_create / auth_verify (signature or PSK MAC), key_derivation (SKEYSEED, prf+, child KEYMAT),
encrypt / decrypt (encoding and sealing / opening and parsing protected messages), encode /
decode (building / parsing the clear IKE_SA_INIT messages), other (wall time
minus all of them: state machine, allocation, RNG). DH% and auth% are shares of the wall time.

--json prints one JSON list of rows: group, auth, proposal, handshakes, seconds,
handshakes_per_sec, wall_us, dh_us, auth_create_us, auth_verify_us, key_derivation_us,
encrypt_us, decrypt_us, encode_us, decode_us, other_us, dh_share, auth_share, crypto_share
(dh + auth + key derivation + encrypt + decrypt over wall), messages_per_handshake,
ops_per_handshake (how many times each operation ran, per handshake).";

/// The options of `espgate bench ike`.
#[derive(clap::Args, Debug, Clone)]
#[command(after_long_help = USAGE)]
pub struct Args {
    /// Key-exchange groups, comma-separated [default: x25519, ecp256,
    /// ecp384, modp2048, modp3072].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub groups: Vec<String>,
    /// Authentication methods, comma-separated [default: psk, ed25519,
    /// ecdsa-p256, ecdsa-p384, rsa-3072].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub auth: Vec<String>,
    /// Seconds of handshakes per combination (after one warm-up
    /// handshake).
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    pub seconds: f64,
    /// At least this many handshakes per combination, however long they
    /// take.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub min: u64,
    /// One JSON list of rows instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// How both peers authenticate (the same method on both sides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// A pre-shared key (AUTH method 2).
    Psk,
    /// Signatures with raw public keys of this kind (RFC 7427).
    Signature(KeyKind),
}

impl AuthMethod {
    /// The name used by `--auth` and in the rows.
    pub fn name(self) -> &'static str {
        match self {
            AuthMethod::Psk => "psk",
            AuthMethod::Signature(KeyKind::Ed25519) => "ed25519",
            AuthMethod::Signature(KeyKind::EcdsaP256) => "ecdsa-p256",
            AuthMethod::Signature(KeyKind::EcdsaP384) => "ecdsa-p384",
            AuthMethod::Signature(KeyKind::Rsa) => "rsa-3072",
        }
    }

    /// Parses a name of [`DEFAULT_AUTHS`], case-insensitively.
    pub fn from_name(s: &str) -> Option<AuthMethod> {
        [
            AuthMethod::Psk,
            AuthMethod::Signature(KeyKind::Ed25519),
            AuthMethod::Signature(KeyKind::EcdsaP256),
            AuthMethod::Signature(KeyKind::EcdsaP384),
            AuthMethod::Signature(KeyKind::Rsa),
        ]
        .into_iter()
        .find(|a| a.name().eq_ignore_ascii_case(s))
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Params {
    /// Key-exchange groups.
    pub groups: Vec<Group>,
    /// Authentication methods.
    pub auths: Vec<AuthMethod>,
    /// Time per combination (handshakes continue until it has passed and
    /// `min` have run).
    pub time: Duration,
    /// Handshakes per combination, at least.
    pub min: u64,
}

impl Params {
    /// Parses names and checks the numbers; empty lists mean the defaults.
    pub fn new(groups: &[String], auths: &[String], seconds: f64, min: u64) -> Result<Params> {
        let or_default = |v: &[String], d: &[&str]| -> Vec<String> {
            if v.is_empty() {
                d.iter().map(|s| s.to_string()).collect()
            } else {
                v.to_vec()
            }
        };
        let groups = or_default(groups, &DEFAULT_GROUPS)
            .iter()
            .map(|g| {
                Group::from_name(g).ok_or_else(|| {
                    anyhow!(
                        "--groups {g}: unknown group ({})",
                        DEFAULT_GROUPS.join(", ")
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let auths = or_default(auths, &DEFAULT_AUTHS)
            .iter()
            .map(|a| {
                AuthMethod::from_name(a).ok_or_else(|| {
                    anyhow!("--auth {a}: unknown method ({})", DEFAULT_AUTHS.join(", "))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        ensure!(
            seconds.is_finite() && (0.0..=600.0).contains(&seconds),
            "--seconds {seconds}: between 0 and 600"
        );
        ensure!((1..=1_000_000).contains(&min), "--min {min}: 1 to 1000000");
        Ok(Params {
            groups,
            auths,
            time: Duration::from_secs_f64(seconds),
            min,
        })
    }
}

/// One result row: one group × auth method (`--json` prints a list).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    /// Key-exchange group (strongSwan keyword).
    pub group: String,
    /// Authentication method of both sides.
    pub auth: String,
    /// The IKE proposal negotiated.
    pub proposal: String,
    /// Timed handshakes (the warm-up not counted).
    pub handshakes: u64,
    /// Wall time of the timed handshakes together.
    pub seconds: f64,
    /// Handshakes per second on one thread, both sides' work.
    pub handshakes_per_sec: f64,
    /// Mean wall time of one handshake, µs.
    pub wall_us: f64,
    /// Key pairs and shared secrets, µs per handshake (both sides).
    pub dh_us: f64,
    /// Creating AUTH payloads, µs per handshake.
    pub auth_create_us: f64,
    /// Checking the peer's AUTH payloads, µs per handshake.
    pub auth_verify_us: f64,
    /// SKEYSEED, prf+ and child KEYMAT, µs per handshake.
    pub key_derivation_us: f64,
    /// SK payload encryption, µs per handshake.
    pub encrypt_us: f64,
    /// SK payload decryption, µs per handshake.
    pub decrypt_us: f64,
    /// Building messages, µs per handshake.
    pub encode_us: f64,
    /// Parsing messages, µs per handshake.
    pub decode_us: f64,
    /// Wall time minus every operation above, µs per handshake.
    pub other_us: f64,
    /// `dh_us` / `wall_us`.
    pub dh_share: f64,
    /// (`auth_create_us` + `auth_verify_us`) / `wall_us`.
    pub auth_share: f64,
    /// (dh + auth + key derivation + encrypt + decrypt) / `wall_us`: the
    /// cryptography's share, as seed 004 reports it.
    pub crypto_share: f64,
    /// Datagrams exchanged per handshake (both directions).
    pub messages_per_handshake: f64,
    /// How often each operation ran per handshake, by [`IkeOp::name`].
    pub ops_per_handshake: BTreeMap<&'static str, f64>,
}

impl Row {
    /// µs per handshake of one operation.
    pub fn op_us(&self, op: IkeOp) -> f64 {
        match op {
            IkeOp::Dh => self.dh_us,
            IkeOp::AuthCreate => self.auth_create_us,
            IkeOp::AuthVerify => self.auth_verify_us,
            IkeOp::KeyDerivation => self.key_derivation_us,
            IkeOp::Encrypt => self.encrypt_us,
            IkeOp::Decrypt => self.decrypt_us,
            IkeOp::Encode => self.encode_us,
            IkeOp::Decode => self.decode_us,
        }
    }
}

/// Nanoseconds since the first call, from a monotonic clock (the cost
/// clock lent to the engines).
fn mono_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Credentials of the run: the PSK and, per key kind asked, one private
/// key for each side.
struct Credentials {
    psk: Zeroizing<Vec<u8>>,
    keys: Vec<(KeyKind, Arc<PrivateKey>, Arc<PrivateKey>)>,
}

impl Credentials {
    fn new(auths: &[AuthMethod], mut progress: impl FnMut(&str)) -> Result<Credentials> {
        let psk = generate_psk().map_err(|e| anyhow!("PSK: {e}"))?;
        let mut keys = Vec::new();
        for a in auths {
            let AuthMethod::Signature(kind) = *a else {
                continue;
            };
            if keys.iter().any(|(k, _, _)| *k == kind) {
                continue;
            }
            progress(&format!("generating {} keys", a.name()));
            let gen = || {
                PrivateKey::generate(kind)
                    .map(Arc::new)
                    .map_err(|e| anyhow!("{} key generation: {e}", a.name()))
            };
            keys.push((kind, gen()?, gen()?));
        }
        Ok(Credentials {
            psk: Zeroizing::new(psk.as_bytes().to_vec()),
            keys,
        })
    }

    /// (initiator's, responder's) local and remote authentication.
    fn auth(&self, a: AuthMethod) -> Result<[(LocalAuth, RemoteAuth); 2]> {
        match a {
            AuthMethod::Psk => {
                let side = || {
                    (
                        LocalAuth::Psk(self.psk.clone()),
                        RemoteAuth::Psk(self.psk.clone()),
                    )
                };
                Ok([side(), side()])
            }
            AuthMethod::Signature(kind) => {
                let (_, ki, kr) = self
                    .keys
                    .iter()
                    .find(|(k, _, _)| *k == kind)
                    .ok_or_else(|| anyhow!("no {} key generated", a.name()))?;
                let side = |mine: &Arc<PrivateKey>, theirs: &Arc<PrivateKey>| {
                    (
                        LocalAuth::Signature {
                            key: mine.clone(),
                            certs: vec![],
                        },
                        RemoteAuth::PublicKey(theirs.public_key()),
                    )
                };
                Ok([side(ki, kr), side(kr, ki)])
            }
        }
    }
}

fn selector(s: &str) -> Result<espgate_ike::wire::TrafficSelector> {
    let (a, l) = s.split_once('/').context("prefix")?;
    let p = Prefix::new(a.parse()?, l.parse()?).ok_or_else(|| anyhow!("bad prefix {s}"))?;
    Ok(ts::from_prefix(p, 0))
}

/// One side's connection.
fn config(
    local: &str,
    remote: &str,
    (local_auth, remote_auth): (LocalAuth, RemoteAuth),
    group: Group,
    (lts, rts): (&str, &str),
) -> Result<IkeConfig> {
    let id = |s: &str| Identity::parse(s).map_err(|e| anyhow!("identity {s}: {e}"));
    let ike = format!("{IKE_CIPHER}-{}", group.name());
    Ok(IkeConfig {
        name: CONN.into(),
        local: local.parse()?,
        remote: remote.parse()?,
        local_id: id(local)?,
        remote_id: Some(id(remote)?),
        local_auth,
        remote_auth,
        proposals: ProposalSpec::parse_list(ProposalKind::Ike, &ike)
            .map_err(|e| anyhow!("{ike}: {e}"))?,
        child: ChildConfig {
            local_ts: vec![selector(lts)?],
            remote_ts: vec![selector(rts)?],
            mode: Mode::Tunnel,
            proposals: ProposalSpec::parse_list(ProposalKind::Esp, ESP_PROPOSAL)
                .map_err(|e| anyhow!("{ESP_PROPOSAL}: {e}"))?,
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
        retransmit: Retransmit::default(),
        force_encap: false,
        mobike: true,
    })
}

/// The two sides' connections for one group and auth method.
fn configs(c: &Credentials, group: Group, auth: AuthMethod) -> Result<(IkeConfig, IkeConfig)> {
    let [ai, ar] = c.auth(auth)?;
    Ok((
        config(
            INITIATOR,
            RESPONDER,
            ai,
            group,
            ("10.1.0.0/16", "10.2.0.0/16"),
        )?,
        config(
            RESPONDER,
            INITIATOR,
            ar,
            group,
            ("10.2.0.0/16", "10.1.0.0/16"),
        )?,
    ))
}

/// What one engine said during a handshake.
#[derive(Default)]
struct Seen {
    installs: u32,
    ups: u32,
    warnings: Vec<String>,
}

impl Seen {
    fn drain(&mut self, e: &mut Ike) {
        while let Some(ev) = e.poll_event() {
            match ev {
                Event::InstallSa(_) => self.installs += 1,
                Event::IkeUp { .. } => self.ups += 1,
                Event::IkeDown { reason, .. } => self.warnings.push(format!("down: {reason}")),
                Event::Log {
                    level: Level::Warn,
                    message,
                    ..
                } => self.warnings.push(message),
                _ => {}
            }
        }
    }
}

/// One checked handshake.
struct Handshake {
    wall: Duration,
    /// Both engines' costs.
    costs: IkeCosts,
    messages: u64,
}

/// Runs one handshake between fresh engines and checks that both sides
/// ended established with one child SA.
fn handshake(ci: &IkeConfig, cr: &IkeConfig) -> Result<Handshake> {
    let now = Duration::from_secs(1000);
    let mut a = Ike::new(vec![ci.clone()], Ports::default());
    let mut b = Ike::new(vec![cr.clone()], Ports::default());
    a.set_cost_clock(Some(mono_ns));
    b.set_cost_clock(Some(mono_ns));
    let (mut sa, mut sb) = (Seen::default(), Seen::default());
    let mut messages = 0u64;
    let mut quiet = false;
    let t = Instant::now();
    a.initiate(now, CONN)
        .map_err(|e| anyhow!("initiate: {e}"))?;
    for _ in 0..MAX_ROUNDS {
        let mut moved = false;
        while let Some(m) = a.poll_transmit() {
            moved = true;
            messages += 1;
            b.handle(now, m.remote, m.local, &m.data);
        }
        while let Some(m) = b.poll_transmit() {
            moved = true;
            messages += 1;
            a.handle(now, m.remote, m.local, &m.data);
        }
        sa.drain(&mut a);
        sb.drain(&mut b);
        if !moved {
            quiet = true;
            break;
        }
    }
    let wall = t.elapsed();
    ensure!(
        quiet,
        "the engines still exchanged messages after {MAX_ROUNDS} rounds"
    );
    for (side, e, seen) in [("initiator", &a, &sa), ("responder", &b, &sb)] {
        let st = e.status();
        let ok = st.len() == 1
            && st[0].state == "established"
            && st[0].children.len() == 1
            && seen.installs == 2
            && seen.ups == 1;
        if !ok {
            bail!(
                "the {side} did not reach established with one child SA \
                 (IKE SAs: {:?}, SAs installed: {}, warnings: {:?})",
                st.iter().map(|s| s.state).collect::<Vec<_>>(),
                seen.installs,
                seen.warnings,
            );
        }
    }
    let mut costs = a.costs().clone();
    costs.merge(b.costs());
    Ok(Handshake {
        wall,
        costs,
        messages,
    })
}

/// Builds a row from the sums over `n` handshakes.
fn row(
    group: Group,
    auth: AuthMethod,
    n: u64,
    wall: Duration,
    costs: &IkeCosts,
    messages: u64,
) -> Row {
    let nf = n as f64;
    let per = |op: IkeOp| -> (f64, f64) {
        let (count, ns) = costs.ops.get(&op).copied().unwrap_or((0, 0));
        (count as f64 / nf, ns as f64 / nf / 1e3)
    };
    let wall_us = wall.as_nanos() as f64 / nf / 1e3;
    let us = |op| per(op).1;
    let ops_sum: f64 = IkeOp::ALL.iter().map(|op| us(*op)).sum();
    let auth_us = us(IkeOp::AuthCreate) + us(IkeOp::AuthVerify);
    let crypto_us = us(IkeOp::Dh)
        + auth_us
        + us(IkeOp::KeyDerivation)
        + us(IkeOp::Encrypt)
        + us(IkeOp::Decrypt);
    Row {
        group: group.name().to_string(),
        auth: auth.name().to_string(),
        proposal: format!("{IKE_CIPHER}-{}", group.name()),
        handshakes: n,
        seconds: wall.as_secs_f64(),
        handshakes_per_sec: 1e6 / wall_us,
        wall_us,
        dh_us: us(IkeOp::Dh),
        auth_create_us: us(IkeOp::AuthCreate),
        auth_verify_us: us(IkeOp::AuthVerify),
        key_derivation_us: us(IkeOp::KeyDerivation),
        encrypt_us: us(IkeOp::Encrypt),
        decrypt_us: us(IkeOp::Decrypt),
        encode_us: us(IkeOp::Encode),
        decode_us: us(IkeOp::Decode),
        other_us: wall_us - ops_sum,
        dh_share: us(IkeOp::Dh) / wall_us,
        auth_share: auth_us / wall_us,
        crypto_share: crypto_us / wall_us,
        messages_per_handshake: messages as f64 / nf,
        ops_per_handshake: IkeOp::ALL
            .iter()
            .map(|op| (op.name(), per(*op).0))
            .collect(),
    }
}

/// Handshakes of one group and auth method: one warm-up, then until
/// `p.time` has passed and at least `p.min` have run.
fn measure(c: &Credentials, group: Group, auth: AuthMethod, p: &Params) -> Result<Row> {
    let (ci, cr) = configs(c, group, auth)?;
    handshake(&ci, &cr).with_context(|| format!("{} {} warm-up", group.name(), auth.name()))?;
    let (mut n, mut wall, mut costs, mut messages) = (0u64, Duration::ZERO, IkeCosts::default(), 0);
    let start = Instant::now();
    // Bounded: every handshake ends (MAX_ROUNDS) and time passes.
    while n < p.min || start.elapsed() < p.time {
        let h = handshake(&ci, &cr)
            .with_context(|| format!("{} {} handshake {}", group.name(), auth.name(), n + 1))?;
        n += 1;
        wall += h.wall;
        costs.merge(&h.costs);
        messages += h.messages;
    }
    Ok(row(group, auth, n, wall, &costs, messages))
}

/// Every group × auth method of `p`, one row each (groups outer).
pub fn run(p: &Params, mut progress: impl FnMut(&str)) -> Result<Vec<Row>> {
    let creds = Credentials::new(&p.auths, &mut progress)?;
    let mut rows = Vec::new();
    for &g in &p.groups {
        for &a in &p.auths {
            progress(&format!("ike {} {}", g.name(), a.name()));
            rows.push(measure(&creds, g, a, p)?);
        }
    }
    Ok(rows)
}

/// The rows as an aligned text table: µs per handshake of each operation.
pub fn table(rows: &[Row]) -> String {
    let mut t = Table::new([
        Column::left("group").min_width(9),
        Column::left("auth").min_width(11),
        Column::right("hs/s").min_width(7),
        Column::right("wall µs").min_width(9),
        Column::right("dh").min_width(9),
        Column::right("auth_cr").min_width(9),
        Column::right("auth_vf").min_width(9),
        Column::right("kdf").min_width(7),
        Column::right("enc").min_width(6),
        Column::right("dec").min_width(6),
        Column::right("encode").min_width(6),
        Column::right("decode").min_width(6),
        Column::right("other").min_width(8),
        Column::right("DH%").min_width(4),
        Column::right("auth%").min_width(5),
    ])
    .gap(1);
    for r in rows {
        let us = [
            r.handshakes_per_sec,
            r.wall_us,
            r.dh_us,
            r.auth_create_us,
            r.auth_verify_us,
            r.key_derivation_us,
            r.encrypt_us,
            r.decrypt_us,
            r.encode_us,
            r.decode_us,
            r.other_us,
        ];
        let shares = [r.dh_share, r.auth_share];
        t.row(
            [r.group.clone(), r.auth.clone()]
                .into_iter()
                .chain(us.iter().map(|v| format!("{v:.1}")))
                .chain(shares.iter().map(|v| format!("{:.0}", v * 100.0))),
        );
    }
    t.render()
}

/// What the table's columns are (printed under it).
pub const NOTES: &str = "hs/s: complete handshakes (IKE_SA_INIT + IKE_AUTH, one child SA) per \
second on one thread, both engines in memory; every handshake checked established on both \
sides. Other columns: µs per handshake, both sides summed: dh = 2 key pairs + 2 shared \
secrets, auth_cr / auth_vf = creating / checking AUTH (2 each), kdf = SKEYSEED + child KEYMAT, \
enc = encoding and sealing the protected messages, dec = opening and parsing them, \
encode / decode = building / parsing the clear IKE_SA_INIT messages, other = wall minus all of \
these (state machine, allocation, RNG, NAT detection hashes). DH% and auth% are shares of the \
wall time.";

/// `espgate bench ike` from its options: prints the table (or JSON).
pub fn main(args: &Args) -> Result<ExitCode> {
    let p = Params::new(&args.groups, &args.auth, args.seconds, args.min)?;
    if super::run_and_print(args.json, |progress| run(&p, progress), table)? {
        println!("{NOTES}");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn tiny(groups: &[&str], auths: &[&str]) -> Vec<Row> {
        let p = Params::new(&strings(groups), &strings(auths), 0.0, 1).unwrap();
        run(&p, |_| {}).unwrap()
    }

    /// The operations one IKE_SA_INIT + IKE_AUTH exchange must perform,
    /// both sides together (RFC 7296 §1.2, child without PFS).
    fn assert_sane_counts(r: &Row) {
        let ops = &r.ops_per_handshake;
        let what = format!("{} {}: {ops:?}", r.group, r.auth);
        // Each side: one key pair and one shared secret.
        assert_eq!(ops["dh"], 4.0, "{what}");
        // Each side signs (or MACs) once and checks the peer once.
        assert_eq!(ops["auth_create"], 2.0, "{what}");
        assert_eq!(ops["auth_verify"], 2.0, "{what}");
        // Each side: SKEYSEED/SK_* and the child's KEYMAT.
        assert_eq!(ops["key_derivation"], 4.0, "{what}");
        // One SK payload each way (the IKE_AUTH request and response),
        // each sealed once and opened once.
        assert_eq!(ops["decrypt"], 2.0, "{what}");
        assert_eq!(ops["encrypt"], 2.0, "{what}");
        // The two clear IKE_SA_INIT messages are built and parsed.
        assert_eq!(ops["encode"], 2.0, "{what}");
        assert_eq!(ops["decode"], 2.0, "{what}");
        assert_eq!(r.messages_per_handshake, 4.0, "{what}");
        assert_eq!(ops.len(), IkeOp::ALL.len());
    }

    #[test]
    fn a_tiny_run_performs_the_operations_of_one_handshake() {
        let rows = tiny(&["x25519", "ecp256"], &["psk", "ed25519"]);
        let combos: Vec<_> = rows.iter().map(|r| (&r.group[..], &r.auth[..])).collect();
        assert_eq!(
            combos,
            [
                ("x25519", "psk"),
                ("x25519", "ed25519"),
                ("ecp256", "psk"),
                ("ecp256", "ed25519"),
            ]
        );
        for r in &rows {
            assert_sane_counts(r);
            assert_eq!(r.handshakes, 1, "{r:?}");
            assert!(r.wall_us > 0.0 && r.wall_us.is_finite(), "{r:?}");
            assert!(
                (r.handshakes_per_sec * r.wall_us - 1e6).abs() < 1e-3,
                "{r:?}"
            );
            // The timed operations are disjoint slices of the handshake.
            assert!(r.other_us >= 0.0, "{r:?}");
            let sum: f64 = IkeOp::ALL.iter().map(|op| r.op_us(*op)).sum();
            assert!((sum + r.other_us - r.wall_us).abs() < 1e-6, "{r:?}");
            // Key exchange and AUTH take measurable time.
            assert!(r.dh_us > 0.0 && r.auth_create_us > 0.0 && r.auth_verify_us > 0.0);
            for s in [r.dh_share, r.auth_share, r.crypto_share] {
                assert!((0.0..=1.0).contains(&s), "{r:?}");
            }
            assert!(r.crypto_share >= r.dh_share + r.auth_share - 1e-12);
        }
    }

    #[test]
    fn every_auth_method_and_group_completes() {
        // Each group once and each auth method once (RSA keys are slow to
        // generate, so not the full product).
        for r in tiny(&["modp2048", "ecp384", "modp3072"], &["ecdsa-p384"])
            .iter()
            .chain(&tiny(&["x25519"], &["ecdsa-p256", "rsa-3072"]))
        {
            assert_sane_counts(r);
        }
    }

    #[test]
    fn the_minimum_count_is_honoured() {
        let p = Params::new(&strings(&["x25519"]), &strings(&["psk"]), 0.0, 3).unwrap();
        let rows = run(&p, |_| {}).unwrap();
        assert_eq!(rows[0].handshakes, 3);
        assert_sane_counts(&rows[0]);
    }

    #[test]
    fn a_handshake_that_fails_is_an_error() {
        let p = Params::new(&[], &strings(&["ed25519"]), 0.0, 1).unwrap();
        let creds = Credentials::new(&p.auths, |_| {}).unwrap();
        let (ci, mut cr) = configs(&creds, Group::Curve25519, p.auths[0]).unwrap();
        assert!(handshake(&ci, &cr).is_ok());
        // The responder expects another key than the initiator's.
        let other = PrivateKey::generate(KeyKind::Ed25519).unwrap();
        cr.remote_auth = RemoteAuth::PublicKey(other.public_key());
        let e = handshake(&ci, &cr).err().expect("must fail").to_string();
        assert!(e.contains("did not reach established"), "{e}");
        // Groups that do not match: no proposal chosen.
        let (ci, _) = configs(&creds, Group::Curve25519, p.auths[0]).unwrap();
        let (_, cr) = configs(&creds, Group::Ecp256, p.auths[0]).unwrap();
        assert!(handshake(&ci, &cr).is_err());
    }

    #[test]
    fn table_text_is_pinned() {
        let r = |group: &str, auth: &str, wall_us: f64| Row {
            group: group.into(),
            auth: auth.into(),
            proposal: String::new(),
            handshakes: 10,
            seconds: 1.0,
            handshakes_per_sec: 1e6 / wall_us,
            wall_us,
            dh_us: 250.25,
            auth_create_us: 120.0,
            auth_verify_us: 340.5,
            key_derivation_us: 12.0,
            encrypt_us: 3.25,
            decrypt_us: 2.75,
            encode_us: 1.5,
            decode_us: 1.25,
            other_us: 40.0,
            dh_share: 250.25 / wall_us,
            auth_share: 460.5 / wall_us,
            crypto_share: 0.9,
            messages_per_handshake: 4.0,
            ops_per_handshake: BTreeMap::new(),
        };
        let rows = [r("x25519", "psk", 771.5), r("ecp256", "ecdsa-p256", 1234.0)];
        let want = "\
group     auth           hs/s   wall µs        dh   auth_cr   auth_vf     kdf    enc    dec encode decode    other  DH% auth%
x25519    psk          1296.2     771.5     250.2     120.0     340.5    12.0    3.2    2.8    1.5    1.2     40.0   32    60
ecp256    ecdsa-p256    810.4    1234.0     250.2     120.0     340.5    12.0    3.2    2.8    1.5    1.2     40.0   20    37
";
        let text = table(&rows);
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn table_and_json_have_every_field() {
        let rows = tiny(&["x25519"], &["psk", "ecdsa-p256"]);
        let text = table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + rows.len(), "{text}");
        for h in [
            "group", "auth", "hs/s", "wall µs", "dh", "kdf", "other", "DH%",
        ] {
            assert!(lines[0].contains(h), "{h} missing: {}", lines[0]);
        }
        assert!(lines[1].starts_with("x25519    psk "), "{text}");
        assert!(lines[2].starts_with("x25519    ecdsa-p256 "), "{text}");
        // Every line has the same columns.
        let cols = lines[0].split_whitespace().count() - 1; // "wall µs" is two words
        for l in &lines[1..] {
            assert_eq!(l.split_whitespace().count(), cols, "{l}");
        }
        let v = serde_json::to_value(&rows).unwrap();
        let list = v.as_array().unwrap();
        assert_eq!(list.len(), 2);
        let keys = [
            "group",
            "auth",
            "proposal",
            "handshakes",
            "seconds",
            "handshakes_per_sec",
            "wall_us",
            "dh_us",
            "auth_create_us",
            "auth_verify_us",
            "key_derivation_us",
            "encrypt_us",
            "decrypt_us",
            "encode_us",
            "decode_us",
            "other_us",
            "dh_share",
            "auth_share",
            "crypto_share",
            "messages_per_handshake",
            "ops_per_handshake",
        ];
        for o in list {
            let obj = o.as_object().unwrap();
            assert_eq!(obj.len(), keys.len(), "{o}");
            for k in keys {
                assert!(obj.contains_key(k), "{k} missing in {o}");
            }
            for op in IkeOp::ALL {
                assert!(o["ops_per_handshake"][op.name()].is_number(), "{o}");
            }
            assert_eq!(o["proposal"], "aes128gcm16-prfsha256-x25519");
        }
        // USAGE names every JSON field.
        for k in keys {
            assert!(USAGE.contains(k), "{k} not in USAGE");
        }
    }

    #[test]
    fn bad_parameters_are_refused_with_the_option_named() {
        let e = |g: &[&str], a: &[&str], s: f64, m: u64| {
            Params::new(&strings(g), &strings(a), s, m)
                .unwrap_err()
                .to_string()
        };
        assert!(e(&["modp1024"], &[], 1.0, 5).contains("--groups modp1024"));
        assert!(e(&[], &["rsa-1024"], 1.0, 5).contains("--auth rsa-1024"));
        assert!(e(&[], &[], -1.0, 5).contains("--seconds"));
        assert!(e(&[], &[], f64::NAN, 5).contains("--seconds"));
        assert!(e(&[], &[], 1.0, 0).contains("--min 0"));
        let p = Params::new(&[], &[], 1.0, 5).unwrap();
        assert_eq!(p.groups.len(), 5);
        let names: Vec<_> = p.auths.iter().map(|a| a.name()).collect();
        assert_eq!(names, DEFAULT_AUTHS);
        assert_eq!(
            AuthMethod::from_name("RSA-3072"),
            Some(AuthMethod::Signature(KeyKind::Rsa))
        );
    }
}
