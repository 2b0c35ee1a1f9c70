//! A connection's `[connection.ike]` table: its checks, and the validated
//! [`IkeSettings`] with their key material loaded. The engine's
//! configuration is made from a connection by
//! [`Connection::ike_config`](crate::Connection::ike_config).
//!
//! The files the table names are read here; what is kept is the loaded
//! material (the PSK in a [`Zeroizing`] buffer, the private key behind an
//! [`Arc`], certificates, public keys), so the engine never reads a file.
//! `Debug` shows the kind of each secret, never its value.

use crate::diag::{span, At, Validator};
use crate::files::{read_secret_bytes, MAX_CERT_FILE_BYTES, MAX_KEY_FILE_BYTES};
use crate::sa::{self, decode_hex, sets_overlap, ChildSelectors};
use crate::schema::{
    format_duration, value, DpdActionName, Encapsulation, IkeTable, QespName, Scalar,
};
pub use crate::schema::{AuthMethod, StartAction};
use espgate_core::crypto::Enc;
use espgate_core::sa::Mode;
use espgate_core::selector::Prefix;
use espgate_ike::cert::{Certificate, Identity};
use espgate_ike::config::{DpdAction, LocalAuth, QespMode, RemoteAuth, Retransmit};
use espgate_ike::proposal::{qesp_capable, ProposalKind, ProposalSpec};
use espgate_ike::sig::{PrivateKey, PublicKey};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use toml::Spanned;
use zeroize::Zeroizing;

/// Default `[connection.ike]` `proposals`.
pub const DEFAULT_IKE_PROPOSALS: &[&str] =
    &["aes128gcm16-prfsha256-x25519", "aes256-sha256-modp2048"];
/// Default `[connection.ike]` `esp_proposals`.
pub const DEFAULT_ESP_PROPOSALS: &[&str] = &["aes128gcm16", "aes256-sha256"];
/// Most `[[connection.ike.child]]` tables of one connection.
pub const MAX_CHILD_TABLES: usize = 16;
/// A pre-shared key shorter than this draws a warning.
const MIN_GOOD_PSK: usize = 20;

/// The validated `[connection.ike]` table of a connection, with its key
/// material loaded.
#[derive(Debug, Clone)]
pub struct IkeSettings {
    /// IKE proposals, preferred first (`proposals`).
    pub proposals: Vec<ProposalSpec>,
    /// ESP proposals for the child SA, preferred first (`esp_proposals`).
    pub esp_proposals: Vec<ProposalSpec>,
    /// Our identity (`local_id`; default: the connection's `local`).
    pub local_id: Identity,
    /// The identity the peer must present (`remote_id`; default: the
    /// connection's `remote`); `None` for `"%any"`.
    pub remote_id: Option<Identity>,
    /// How we authenticate (`auth` with `psk_file`, or `private_key` and
    /// `cert`), loaded.
    pub local_auth: LocalAuth,
    /// How the peer must authenticate (`remote_auth` with `psk_file`, `ca`
    /// or `remote_public_key`), loaded.
    pub remote_auth: RemoteAuth,
    /// Initiate at start-up or wait.
    pub start_action: StartAction,
    /// IKE SA rekey time; zero: never.
    pub rekey_time: Duration,
    /// Child SA rekey time; zero: never.
    pub child_rekey_time: Duration,
    /// Child SA hard lifetime (deleted if not rekeyed by then); zero: never.
    pub child_life_time: Duration,
    /// Largest random reduction of the rekey times.
    pub jitter: Duration,
    /// Liveness check after this long without hearing from the peer;
    /// zero: off.
    pub dpd_delay: Duration,
    /// What to do with a dead peer.
    pub dpd_action: DpdAction,
    /// Retransmission schedule of unanswered requests.
    pub retransmit: Retransmit,
    /// Make both sides see a NAT, so that ESP is UDP-encapsulated.
    pub force_encap: bool,
    /// Let a peer that offers MOBIKE (RFC 4555) move the SAs to its new
    /// address (`mobike`, default true).
    pub mobike: bool,
    /// Whether child SAs are negotiated as Q-ESP (`qesp`).
    pub qesp: QespMode,
    /// What the table said that the loaded values no longer show.
    pub source: IkeSource,
}

/// The proposal strings and file paths of a `[connection.ike]` table, as
/// given or defaulted (paths made absolute against the file's directory):
/// what the effective configuration shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IkeSource {
    /// `proposals`.
    pub proposals: Vec<String>,
    /// `esp_proposals`.
    pub esp_proposals: Vec<String>,
    /// `psk_file`.
    pub psk_file: Option<PathBuf>,
    /// `private_key`.
    pub private_key: Option<PathBuf>,
    /// `cert`.
    pub cert: Option<PathBuf>,
    /// `ca`.
    pub ca: Option<PathBuf>,
    /// `remote_public_key`.
    pub remote_public_key: Option<PathBuf>,
}

impl IkeSettings {
    /// The method we authenticate with.
    pub fn auth(&self) -> AuthMethod {
        match self.local_auth {
            LocalAuth::Psk(_) => AuthMethod::Psk,
            LocalAuth::Signature { .. } => AuthMethod::Pubkey,
        }
    }

    /// The method the peer must authenticate with.
    pub fn remote_auth_method(&self) -> AuthMethod {
        match self.remote_auth {
            RemoteAuth::Psk(_) => AuthMethod::Psk,
            RemoteAuth::PublicKey(_) | RemoteAuth::Ca(_) => AuthMethod::Pubkey,
        }
    }

    /// The table that says exactly these settings, every key given (files
    /// by their paths: no secret is in it).
    pub fn to_table(&self) -> IkeTable {
        let list = |l: &[String]| Some(value(l.iter().map(|s| value(s.clone())).collect()));
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| value(p.display().to_string()));
        let time = |d: Duration| Some(value(Scalar::Str(format_duration(d))));
        IkeTable {
            proposals: list(&self.source.proposals),
            esp_proposals: list(&self.source.esp_proposals),
            local_id: Some(value(id_text(&self.local_id))),
            remote_id: Some(value(
                self.remote_id
                    .as_ref()
                    .map_or_else(|| "%any".to_string(), id_text),
            )),
            auth: Some(self.auth()),
            remote_auth: Some(self.remote_auth_method()),
            psk_file: path(&self.source.psk_file),
            private_key: path(&self.source.private_key),
            cert: path(&self.source.cert),
            ca: path(&self.source.ca),
            remote_public_key: path(&self.source.remote_public_key),
            start_action: Some(self.start_action),
            rekey_time: time(self.rekey_time),
            child_rekey_time: time(self.child_rekey_time),
            child_life_time: time(self.child_life_time),
            jitter: time(self.jitter),
            dpd_delay: time(self.dpd_delay),
            dpd_action: Some(match self.dpd_action {
                DpdAction::Clear => DpdActionName::Clear,
                DpdAction::Restart => DpdActionName::Restart,
            }),
            retransmit_timeout: time(self.retransmit.timeout),
            retransmit_tries: Some(value(self.retransmit.tries.into())),
            retransmit_limit: time(self.retransmit.limit),
            force_encap: Some(value(self.force_encap)),
            mobike: Some(value(self.mobike)),
            qesp: Some(value(match self.qesp {
                QespMode::Off => QespName::Off,
                QespMode::Prefer => QespName::Prefer,
                QespMode::Require => QespName::Require,
            })),
            // The connection's (`Connection::to_table` fills them in).
            child: Vec::new(),
        }
    }
}

/// `%any` (any case): accept whatever identity the peer authenticates.
fn is_any_id(s: &str) -> bool {
    s.trim().eq_ignore_ascii_case("%any")
}

/// An identity as the file writes it: its text, which reads back as the
/// same identity, with `@` in front of an FQDN spelled `%any` (which the
/// file reads as "any identity").
fn id_text(id: &Identity) -> String {
    match id.to_string() {
        t if is_any_id(&t) => format!("@{t}"),
        t => t,
    }
}

fn parse_identity(s: &str) -> Result<Identity, String> {
    Identity::parse(s).map_err(|e| {
        format!(
            "{s:?}: {e} (expected an address, an FQDN such as \"moon.example\", an email \
             address, a DN such as \"C=CH, O=Example, CN=moon\" or \"@#\" and a hex key id)"
        )
    })
}

fn address_identity(a: IpAddr) -> Identity {
    match a {
        IpAddr::V4(a) => Identity::Ipv4(a),
        IpAddr::V6(a) => Identity::Ipv6(a),
    }
}

/// A PSK file's contents: `0x` and hex digits (whitespace ignored), or
/// else the bytes themselves, without one final newline (`\n` or `\r\n`).
/// Messages never quote the input.
fn parse_psk(raw: &[u8]) -> Result<Zeroizing<Vec<u8>>, String> {
    let mut t = raw;
    if let Some(rest) = t.strip_suffix(b"\n") {
        t = rest.strip_suffix(b"\r").unwrap_or(rest);
    }
    let psk = if t.starts_with(b"0x") || t.starts_with(b"0X") {
        let s = std::str::from_utf8(t).map_err(|_| {
            "starts with 0x but is not hex (a text key may not start with 0x)".to_string()
        })?;
        decode_hex(s).map_err(|e| format!("starts with 0x but is {e}"))?
    } else {
        Zeroizing::new(t.to_vec())
    };
    if psk.is_empty() {
        return Err("the pre-shared key is empty".into());
    }
    Ok(psk)
}

/// Checks `[connection.ike]` (`at` is the table) and loads the files it
/// names; `local`, `remote`, `encap` and `replay_window` are the
/// connection's.
pub(crate) fn settings(
    v: &mut Validator,
    at: &At,
    r: &IkeTable,
    (local, remote): (Option<IpAddr>, Option<IpAddr>),
    encap: Encapsulation,
    replay_window: i64,
) -> Option<IkeSettings> {
    let before = v.error_count();
    let key = |k: &str, s: &Option<Spanned<String>>| at.key(k, span(s));
    let file = |f: &Option<Spanned<String>>| f.as_ref().map(|f| v.base_dir.join(f.get_ref()));
    let source_files = (
        file(&r.psk_file),
        file(&r.private_key),
        file(&r.cert),
        file(&r.ca),
        file(&r.remote_public_key),
    );

    let proposals = proposal_list(
        v,
        at,
        "proposals",
        ProposalKind::Ike,
        &r.proposals,
        DEFAULT_IKE_PROPOSALS,
    );
    let esp_proposals = proposal_list(
        v,
        at,
        "esp_proposals",
        ProposalKind::Esp,
        &r.esp_proposals,
        DEFAULT_ESP_PROPOSALS,
    );

    // Identities.
    let local_id_at = key("local_id", &r.local_id);
    let local_id = match r.local_id.as_ref().map(|s| s.get_ref().as_str()) {
        Some(s) if is_any_id(s) => {
            v.err(
                local_id_at,
                "\"%any\" is for remote_id only: we must tell the peer who we are",
            );
            None
        }
        Some(s) => v.check(local_id_at, parse_identity(s)),
        None => local.map(address_identity),
    };
    let remote_id = match r.remote_id.as_ref().map(|s| s.get_ref().as_str()) {
        Some(s) if is_any_id(s) => Some(None),
        Some(s) => v
            .check(key("remote_id", &r.remote_id), parse_identity(s))
            .map(Some),
        None => remote.map(|a| Some(address_identity(a))),
    };

    // Authentication material.
    let auth = r.auth.unwrap_or(AuthMethod::Psk);
    let remote_auth = r.remote_auth.unwrap_or(auth);
    let auth_words = if r.auth.is_some() {
        format!("auth = \"{}\"", auth.name())
    } else {
        format!("auth = \"{}\" (the default)", auth.name())
    };
    let remote_auth_words = if r.remote_auth.is_some() {
        format!("remote_auth = \"{}\"", remote_auth.name())
    } else {
        format!(
            "remote_auth = \"{}\" (the default: as auth)",
            remote_auth.name()
        )
    };
    let uses_psk = auth == AuthMethod::Psk || remote_auth == AuthMethod::Psk;
    let psk = match (&r.psk_file, uses_psk) {
        (Some(f), true) => psk_file(v, key("psk_file", &r.psk_file), f.get_ref()),
        (None, true) => {
            let who = if auth == AuthMethod::Psk {
                &auth_words
            } else {
                &remote_auth_words
            };
            v.err(
                at.clone(),
                format!(
                    "{who} needs psk_file = \"PATH\": a file with mode 0600 holding the \
                     pre-shared key (make one with `espgate keygen --type psk --out PATH`)"
                ),
            );
            None
        }
        (Some(_), false) => {
            v.err(
                key("psk_file", &r.psk_file),
                "psk_file is not used: neither auth nor remote_auth is \"psk\"; remove it",
            );
            None
        }
        (None, false) => None,
    };

    let local_auth = match auth {
        AuthMethod::Psk => {
            for (k, given) in [("private_key", &r.private_key), ("cert", &r.cert)] {
                if given.is_some() {
                    v.err(
                        key(k, given),
                        format!(
                            "{k} is only used with auth = \"pubkey\", but {auth_words}; \
                             set auth = \"pubkey\" or remove {k}"
                        ),
                    );
                }
            }
            psk.clone().map(LocalAuth::Psk)
        }
        AuthMethod::Pubkey => {
            let pkey = match &r.private_key {
                Some(f) => private_key_file(v, key("private_key", &r.private_key), f.get_ref()),
                None => {
                    v.err(
                        at.clone(),
                        "auth = \"pubkey\" needs private_key = \"PATH\", a PEM private key \
                         (make one with `espgate keygen --type ed25519 --out PATH`)",
                    );
                    None
                }
            };
            let certs = match &r.cert {
                Some(f) => cert_file(v, key("cert", &r.cert), f.get_ref()),
                None => Some(Vec::new()),
            };
            if let (Some(pkey), Some(first)) = (&pkey, certs.as_ref().and_then(|c| c.first())) {
                cert_vs_key(v, at, r, first, pkey, local_id.as_ref());
            }
            match (pkey, certs) {
                (Some(pkey), Some(certs)) => Some(LocalAuth::Signature {
                    key: Arc::new(pkey),
                    certs,
                }),
                _ => None,
            }
        }
    };

    let remote_auth = match remote_auth {
        AuthMethod::Psk => {
            for (k, given) in [("ca", &r.ca), ("remote_public_key", &r.remote_public_key)] {
                if given.is_some() {
                    v.err(
                        key(k, given),
                        format!(
                            "{k} is only used with remote_auth = \"pubkey\", but \
                             {remote_auth_words}; set remote_auth = \"pubkey\" or remove {k}"
                        ),
                    );
                }
            }
            psk.map(RemoteAuth::Psk)
        }
        AuthMethod::Pubkey => match (&r.ca, &r.remote_public_key) {
            (Some(_), Some(_)) => {
                v.err(
                    key("remote_public_key", &r.remote_public_key),
                    "ca and remote_public_key are both given: the peer proves who it is \
                     with a certificate issued by a CA in ca, or with the raw public key \
                     remote_public_key; keep one",
                );
                None
            }
            (None, None) => {
                v.err(
                    at.clone(),
                    format!(
                        "{remote_auth_words} needs ca = \"PATH\" (CA certificates, PEM: the \
                         peer's certificate must chain to one) or remote_public_key = \
                         \"PATH\" (the peer's public key, PEM)"
                    ),
                );
                None
            }
            (Some(f), None) => cert_file(v, key("ca", &r.ca), f.get_ref()).map(RemoteAuth::Ca),
            (None, Some(f)) => public_key_file(
                v,
                key("remote_public_key", &r.remote_public_key),
                f.get_ref(),
            )
            .map(RemoteAuth::PublicKey),
        },
    };

    // Timers.
    let dur =
        |v: &mut Validator, k: &str, s: &Option<Spanned<Scalar>>, default: Duration, max: u64| {
            let Some(s) = s else { return Some(default) };
            let here = at.key(k, Some(s.span()));
            let d = v
                .check(here.clone(), s.get_ref().duration())?
                .unwrap_or(Duration::ZERO);
            if d.as_secs() > max {
                v.err(
                    here,
                    format!(
                        "{} is too long: at most {}",
                        s.get_ref(),
                        format_duration(Duration::from_secs(max))
                    ),
                );
                return None;
            }
            Some(d)
        };
    const YEAR: u64 = 365 * 86400;
    let rekey_time = dur(
        v,
        "rekey_time",
        &r.rekey_time,
        Duration::from_secs(4 * 3600),
        YEAR,
    );
    let child_rekey_time = dur(
        v,
        "child_rekey_time",
        &r.child_rekey_time,
        Duration::from_secs(3600),
        YEAR,
    );
    let child_life_time = match child_rekey_time {
        Some(rk) => dur(
            v,
            "child_life_time",
            &r.child_life_time,
            rk + life_margin(rk),
            YEAR,
        ),
        None => None,
    };
    if let (Some(rk), Some(life)) = (child_rekey_time, child_life_time) {
        if !rk.is_zero() && !life.is_zero() && life <= rk {
            v.err(
                at.key("child_life_time", span(&r.child_life_time)),
                format!(
                    "{} is not above child_rekey_time ({}): the child SA would expire \
                     before it is rekeyed",
                    format_duration(life),
                    format_duration(rk)
                ),
            );
        } else if rk.is_zero() && !life.is_zero() {
            v.warn(
                at.key("child_rekey_time", span(&r.child_rekey_time)),
                format!(
                    "0: the child SA is never rekeyed, so it is deleted after \
                     child_life_time ({}) and traffic stops until a new one is negotiated",
                    format_duration(life)
                ),
            );
        }
    }
    let jitter = match (rekey_time, child_rekey_time) {
        (Some(ike_rk), Some(child_rk)) => {
            let smallest = [ike_rk, child_rk]
                .into_iter()
                .filter(|d| !d.is_zero())
                .min();
            let default = smallest.map_or(Duration::ZERO, default_jitter);
            let j = dur(v, "jitter", &r.jitter, default, YEAR);
            if let (Some(j), Some(s)) = (j, smallest) {
                if j >= s / 2 && !j.is_zero() {
                    let which = if s == child_rk {
                        "child_rekey_time"
                    } else {
                        "rekey_time"
                    };
                    v.err(
                        at.key("jitter", span(&r.jitter)),
                        format!(
                            "{} is not below half of {which} ({}): rekeying could come \
                             at any moment; use at most 10-20% of it",
                            format_duration(j),
                            format_duration(s)
                        ),
                    );
                }
            }
            j
        }
        _ => None,
    };
    let dpd_delay = dur(v, "dpd_delay", &r.dpd_delay, Duration::from_secs(30), YEAR);
    let retransmit_timeout = dur(
        v,
        "retransmit_timeout",
        &r.retransmit_timeout,
        Retransmit::default().timeout,
        3600,
    );
    if retransmit_timeout.is_some_and(|d| d.is_zero()) {
        v.err(
            at.key("retransmit_timeout", span(&r.retransmit_timeout)),
            "0: a request needs at least 1 second to be answered (default \"1s\")",
        );
    }
    let retransmit_limit = dur(
        v,
        "retransmit_limit",
        &r.retransmit_limit,
        Retransmit::default().limit,
        3600,
    );
    let retransmit_tries = r
        .retransmit_tries
        .as_ref()
        .map_or(i64::from(Retransmit::default().tries), |n| *n.get_ref());
    if !(0..=20).contains(&retransmit_tries) {
        v.err(
            at.key("retransmit_tries", span(&r.retransmit_tries)),
            format!("{retransmit_tries}: expected 0 to 20 retransmissions"),
        );
    }
    let dpd_action = match r.dpd_action.unwrap_or(DpdActionName::Clear) {
        DpdActionName::Clear => DpdAction::Clear,
        DpdActionName::Restart => DpdAction::Restart,
    };
    let force_encap = match (r.force_encap.as_ref().map(|b| *b.get_ref()), encap) {
        (Some(true), Encapsulation::None) => {
            v.err(
                at.key("force_encap", span(&r.force_encap)),
                "force_encap = true makes the SAs UDP-encapsulated, but this connection \
                 has encap = \"none\" (raw ESP); set encap = \"udp\" or remove force_encap",
            );
            false
        }
        (Some(b), _) => b,
        (None, e) => e == Encapsulation::Udp,
    };

    let qesp = qesp_setting(v, at, r, &esp_proposals, encap, replay_window);

    if v.error_count() != before {
        return None;
    }
    let (proposals, proposal_names) = proposals?;
    let (esp_proposals, esp_proposal_names) = esp_proposals?;
    let (psk_file, private_key, cert, ca, remote_public_key) = source_files;
    Some(IkeSettings {
        proposals,
        esp_proposals,
        local_id: local_id?,
        remote_id: remote_id?,
        local_auth: local_auth?,
        remote_auth: remote_auth?,
        start_action: r.start_action.unwrap_or(StartAction::None),
        rekey_time: rekey_time?,
        child_rekey_time: child_rekey_time?,
        child_life_time: child_life_time?,
        jitter: jitter?,
        dpd_delay: dpd_delay?,
        dpd_action,
        retransmit: Retransmit {
            timeout: retransmit_timeout?,
            tries: retransmit_tries as u32,
            limit: retransmit_limit?,
            ..Retransmit::default()
        },
        force_encap,
        mobike: r.mobike.as_ref().is_none_or(|b| *b.get_ref()),
        qesp,
        source: IkeSource {
            proposals: proposal_names,
            esp_proposals: esp_proposal_names,
            psk_file,
            private_key,
            cert,
            ca,
            remote_public_key,
        },
    })
}

/// Checks the `[[connection.ike.child]]` tables of the IKE table `r` (at
/// `at`) and reads each into a [`ChildSelectors`], an omitted side being
/// the connection's own (`own`: its `local_ts` and `remote_ts`, selector
/// set 0). `mode` is the connection's. Empty without child tables, and
/// when any has an error.
pub(crate) fn children(
    v: &mut Validator,
    at: &At,
    r: &IkeTable,
    mode: Mode,
    own: (&[Prefix], &[Prefix]),
) -> Vec<ChildSelectors> {
    let Some(first) = r.child.first() else {
        return Vec::new();
    };
    let before = v.error_count();
    let list_at = at.key("child", Some(first.span()));
    let child_at = |k: usize| list_at.index(k, r.child.get(k).map(Spanned::span));
    if mode == Mode::Transport {
        v.err(
            list_at.clone(),
            "[[connection.ike.child]] selector sets need mode = \"tunnel\": in transport \
             mode a connection carries the two hosts' own packets, one selector set; \
             remove the child tables or set mode = \"tunnel\"",
        );
        return Vec::new();
    }
    if r.child.len() > MAX_CHILD_TABLES {
        v.err(
            child_at(MAX_CHILD_TABLES),
            format!(
                "{} [[connection.ike.child]] tables: at most {MAX_CHILD_TABLES} per \
                 connection (selector sets beyond its own local_ts/remote_ts)",
                r.child.len()
            ),
        );
    }
    let mut sets: Vec<(usize, ChildSelectors)> = Vec::new();
    for (k, t) in r.child.iter().enumerate() {
        let t = t.get_ref();
        if t.local_ts.is_none() && t.remote_ts.is_none() {
            v.err(
                child_at(k),
                "this [[connection.ike.child]] table sets neither local_ts nor remote_ts: it \
                 would be the connection's own selector set again; give it the selectors of \
                 its child SA (a side left out is the connection's)",
            );
            continue;
        }
        if let Some((local_ts, remote_ts)) =
            sa::child_selectors(v, &child_at(k), own, &t.local_ts, &t.remote_ts)
        {
            sets.push((
                k,
                ChildSelectors {
                    local_ts,
                    remote_ts,
                },
            ));
        }
    }
    // Each packet must select one child: the sets are disjoint, the
    // connection's own (set 0) included. Whole lists are compared, across
    // families (a set's IPv4 side meeting another's while their IPv6
    // sides differ still overlaps): a responder narrows a proposal into
    // the first set whose lists it meets, and only disjoint lists keep a
    // child's rekey from landing in another set.
    for (b, (k, set)) in sets.iter().enumerate() {
        let mine = (&set.local_ts[..], &set.remote_ts[..]);
        let earlier = std::iter::once(("the connection's own local_ts/remote_ts".to_string(), own))
            .chain(
                sets[..b]
                    .iter()
                    .map(|(j, s)| (format!("child[{j}]"), (&s.local_ts[..], &s.remote_ts[..]))),
            );
        for (name, other) in earlier {
            if let Some(((l, ol), (r, or))) = sets_overlap(mine, other) {
                v.err(
                    child_at(*k),
                    format!(
                        "this selector set overlaps {name} (local_ts {l} meets {ol} and \
                         remote_ts {r} meets {or}): the selector sets of one connection \
                         must be disjoint, so that each packet selects one child SA"
                    ),
                );
                break;
            }
        }
    }
    if v.error_count() != before {
        return Vec::new();
    }
    sets.into_iter().map(|(_, s)| s).collect()
}

/// `qesp` (`docs/QESP.md` §7), checked against what Q-ESP needs: raw IP
/// (its ICV covers the outer addresses, which NAT rewrites, so it cannot be
/// UDP-encapsulated), anti-replay, and encryption in the proposals.
fn qesp_setting(
    v: &mut Validator,
    at: &At,
    r: &IkeTable,
    esp_proposals: &Option<(Vec<ProposalSpec>, Vec<String>)>,
    encap: Encapsulation,
    replay_window: i64,
) -> QespMode {
    let Some(q) = &r.qesp else {
        return QespMode::Off;
    };
    let mode = match q.get_ref() {
        QespName::Off => return QespMode::Off,
        QespName::Prefer => QespMode::Prefer,
        QespName::Require => QespMode::Require,
    };
    let here = at.key("qesp", Some(q.span()));
    let said = format!("qesp = \"{}\"", mode.name());
    if encap == Encapsulation::Udp {
        v.err(
            here.clone(),
            format!(
                "{said} needs encap = \"none\": Q-ESP cannot be UDP-encapsulated (its ICV \
                 covers the outer addresses, which NAT rewrites), but this connection's encap \
                 is \"udp\" (given, or gateway.encap); set encap = \"none\" on the connection"
            ),
        );
    }
    if replay_window == 0 {
        v.err(
            here.clone(),
            format!(
                "{said} needs anti-replay (Q-ESP requires it, docs/QESP.md §4), but the \
                 connection has replay_window = 0; remove replay_window = 0"
            ),
        );
    }
    if let Some((specs, _)) = esp_proposals {
        let gmac = specs
            .iter()
            .any(|p| p.encr.iter().any(|e| matches!(e, Enc::AesGmac(_))));
        if mode == QespMode::Require && qesp_capable(specs).is_empty() {
            v.err(
                here,
                format!(
                    "{said} but no esp_proposals can be Q-ESP: Q-ESP requires encryption, \
                     and AES-GMAC is integrity only; add an encrypting proposal (for example \
                     \"aes128gcm16\")"
                ),
            );
        } else if gmac {
            v.warn(
                at.key("esp_proposals", span(&r.esp_proposals)),
                format!(
                    "with {said}, the AES-GMAC algorithms are proposed for ESP only: Q-ESP \
                     requires encryption"
                ),
            );
        }
    }
    mode
}

/// A list of proposal strings (each may hold several, comma-separated),
/// parsed, with the strings as given (or the defaults).
fn proposal_list(
    v: &mut Validator,
    at: &At,
    k: &str,
    kind: ProposalKind,
    list: &Option<Spanned<Vec<Spanned<String>>>>,
    default: &[&str],
) -> Option<(Vec<ProposalSpec>, Vec<String>)> {
    let list_at = at.key(k, span(list));
    let items: Vec<(String, Option<std::ops::Range<usize>>)> = match list {
        Some(l) => l
            .get_ref()
            .iter()
            .map(|s| (s.get_ref().clone(), Some(s.span())))
            .collect(),
        None => default.iter().map(|s| (s.to_string(), None)).collect(),
    };
    if items.is_empty() {
        v.err(
            list_at,
            format!("an empty list offers nothing; omit {k} for the default {default:?}"),
        );
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    for (j, (s, item_span)) in items.iter().enumerate() {
        let here = if list.is_some() {
            list_at.index(j, item_span.clone())
        } else {
            list_at.clone()
        };
        match ProposalSpec::parse_list(kind, s) {
            Ok(p) if p.is_empty() => {
                v.err(here, "an empty proposal");
                ok = false;
            }
            Ok(p) => out.extend(p),
            Err(e) => {
                v.err(here, format!("{s:?}: {e}"));
                ok = false;
            }
        }
    }
    ok.then(|| (out, items.into_iter().map(|(s, _)| s).collect()))
}

/// Reads a file named in `[connection.ike]` (at most `max` bytes) into
/// a buffer wiped on drop, with the file's permission bits.
fn ike_file(
    v: &mut Validator,
    at: &At,
    f: &str,
    what: &str,
    max: u64,
) -> Option<(PathBuf, Zeroizing<Vec<u8>>, u32)> {
    let file = v.base_dir.join(f);
    match read_secret_bytes(&file, max) {
        Ok((data, mode)) => Some((file, data, mode)),
        Err(e) => {
            v.err(
                at.clone(),
                format!("cannot read {what} {}: {e}", file.display()),
            );
            None
        }
    }
}

/// `psk_file`: text (one final newline dropped) or `0x` and hex; the
/// file must not be accessible to group or others.
fn psk_file(v: &mut Validator, at: At, f: &str) -> Option<Zeroizing<Vec<u8>>> {
    let (file, data, mode) = ike_file(v, &at, f, "psk_file", MAX_KEY_FILE_BYTES)?;
    if mode & 0o077 != 0 {
        v.err(
            at,
            format!(
                "psk_file {} is readable or writable by group/others (mode {mode:04o}); \
                 a pre-shared key must be private: chmod 600 it",
                file.display()
            ),
        );
        return None;
    }
    let psk = v.check(
        at.clone(),
        parse_psk(&data).map_err(|e| format!("psk_file {}: {e}", file.display())),
    )?;
    if psk.len() < MIN_GOOD_PSK {
        v.warn(
            at,
            format!(
                "psk_file {}: a {}-byte pre-shared key can be guessed offline from one \
                 captured exchange; use at least {MIN_GOOD_PSK} random bytes (`espgate \
                 keygen --type psk` makes a 32-byte one)",
                file.display(),
                psk.len()
            ),
        );
    }
    Some(psk)
}

fn private_key_file(v: &mut Validator, at: At, f: &str) -> Option<PrivateKey> {
    let (file, data, mode) = ike_file(v, &at, f, "private key file", MAX_KEY_FILE_BYTES)?;
    if mode & 0o077 != 0 {
        v.warn(
            at.clone(),
            format!(
                "private key file {} is readable or writable by group/others (mode \
                 {mode:04o}); chmod 600 it",
                file.display()
            ),
        );
    }
    v.check(
        at,
        PrivateKey::from_pem(&data)
            .map_err(|e| format!("private key file {}: {e}", file.display())),
    )
}

fn cert_file(v: &mut Validator, at: At, f: &str) -> Option<Vec<Certificate>> {
    let (file, data, _) = ike_file(v, &at, f, "certificate file", MAX_CERT_FILE_BYTES)?;
    v.check(
        at,
        Certificate::from_pem(&data)
            .map_err(|e| format!("certificate file {}: {e}", file.display())),
    )
}

fn public_key_file(v: &mut Validator, at: At, f: &str) -> Option<PublicKey> {
    let (file, data, _) = ike_file(v, &at, f, "public key file", MAX_KEY_FILE_BYTES)?;
    v.check(
        at,
        PublicKey::from_pem(&data).map_err(|e| {
            format!(
                "public key file {}: {e} (expected a \"PUBLIC KEY\" PEM block, as \
                 `espgate keygen --pub` or `openssl pkey -pubout` write)",
                file.display()
            )
        }),
    )
}

/// Our certificate must carry our private key's public key, and should
/// bind our identity.
fn cert_vs_key(
    v: &mut Validator,
    at: &At,
    r: &IkeTable,
    cert: &Certificate,
    key: &PrivateKey,
    local_id: Option<&Identity>,
) {
    let cert_at = at.key("cert", span(&r.cert));
    let cert_key = match cert.public_key() {
        Ok(k) => k,
        Err(e) => {
            v.err(cert_at, format!("the first certificate's key: {e}"));
            return;
        }
    };
    if cert_key.spki_der() != key.public_key().spki_der() {
        v.err(
            cert_at,
            format!(
                "the first certificate (the end entity, subject \"{}\") is not for the \
                 {} key in private_key: the peer could not verify our signature",
                cert.subject_identity(),
                key.kind()
            ),
        );
        return;
    }
    if let Some(id) = local_id.filter(|id| !cert.matches_identity(id)) {
        let (here, how) = if r.local_id.is_some() {
            (at.key("local_id", span(&r.local_id)), "")
        } else {
            (cert_at, " (local_id defaults to the local address)")
        };
        v.warn(
            here,
            format!(
                "the certificate does not bind local_id {id}{how}: a peer that checks \
                 it will refuse us; set local_id to a name the certificate holds, for \
                 example its subject: local_id = \"{}\"",
                cert.subject_identity()
            ),
        );
    }
}

/// How much longer than `child_rekey_time` a child SA lives by default:
/// a tenth of it, in whole seconds (see [`default_jitter`]) and at least
/// 1 s, so that a short rekey time still leaves time to rekey; none when
/// it is never rekeyed (0).
fn life_margin(rekey: Duration) -> Duration {
    match rekey.as_secs() {
        0 => Duration::ZERO,
        s => Duration::from_secs((s / 10).max(1)),
    }
}

/// The default `jitter` for a smallest non-zero rekey time `d`: a tenth
/// of it, in whole seconds as every duration of the file is (a default of
/// 2.5 s would be shown by `config check` as "2s", and read back as that),
/// and at least 1 s where that is still below half of `d`, so that peers
/// with short test settings still rarely rekey at once.
fn default_jitter(d: Duration) -> Duration {
    let tenth = d.as_secs() / 10;
    Duration::from_secs(if tenth == 0 && d.as_secs() > 2 {
        1
    } else {
        tenth
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load;
    use crate::sa::decode_hex;
    use crate::test_util::*;
    use espgate_core::sa::Mode;
    use espgate_ike::wire::TrafficSelector as Ts;

    const PSK_HEX: &str = "0x00112233445566778899aabbccddeeff0011223344556677";

    fn write_mode(dir: &Path, name: &str, data: &[u8], mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A temp dir with `psk` (mode 0600) holding PSK_HEX.
    fn ike_dir() -> PathBuf {
        let d = temp_dir();
        write_mode(&d, "psk", format!("{PSK_HEX}\n").as_bytes(), 0o600);
        d
    }

    /// One IKE connection: `extra` in the connection table, `ike` in its
    /// IKE table.
    fn ike_conn(extra: &str, ike: &str) -> String {
        format!(
            r#"
[[connection]]
name = "ik"
local = "192.0.2.1"
remote = "198.51.100.2"
local_ts = ["10.1.0.0/16"]
remote_ts = ["10.2.0.0/16"]
{extra}

[connection.ike]
{ike}
"#
        )
    }

    fn ike_parse(dir: &Path, text: &str) -> Result<LoadedConfig, ConfigError> {
        parse(text, dir, "ike.toml")
    }

    fn ike_ok(dir: &Path, text: &str) -> LoadedConfig {
        ike_parse(dir, text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn ike_err(dir: &Path, text: &str) -> String {
        match ike_parse(dir, text) {
            Ok(c) => panic!("expected an error, got {c:#?}"),
            Err(e) => e.to_string(),
        }
    }

    fn specs(kind: ProposalKind, list: &[&str]) -> Vec<ProposalSpec> {
        list.iter()
            .map(|s| ProposalSpec::parse(kind, s).unwrap())
            .collect()
    }

    #[test]
    fn ike_psk_defaults_and_engine_config() {
        let d = ike_dir();
        let c = ike_ok(&d, &ike_conn("", "psk_file = \"psk\""));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let k = &c.connections[0];
        assert!(k.esp().is_none() && k.ah().is_none());
        let sas = k.sa_configs();
        assert!(sas.inbound.is_empty() && sas.outbound.is_empty());
        let s = k.ike().unwrap();
        assert_eq!(
            s.proposals,
            specs(
                ProposalKind::Ike,
                &["aes128gcm16-prfsha256-x25519", "aes256-sha256-modp2048"]
            )
        );
        assert_eq!(
            s.esp_proposals,
            specs(ProposalKind::Esp, &["aes128gcm16", "aes256-sha256"])
        );
        assert_eq!(s.local_id, Identity::Ipv4("192.0.2.1".parse().unwrap()));
        assert_eq!(
            s.remote_id,
            Some(Identity::Ipv4("198.51.100.2".parse().unwrap()))
        );
        assert_eq!(
            (s.auth(), s.remote_auth_method()),
            (AuthMethod::Psk, AuthMethod::Psk)
        );
        let want_psk = decode_hex(PSK_HEX).unwrap();
        match (&s.local_auth, &s.remote_auth) {
            (LocalAuth::Psk(a), RemoteAuth::Psk(b)) => {
                assert_eq!((&a[..], &b[..]), (&want_psk[..], &want_psk[..]));
                assert_eq!(a.len(), 24);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.start_action, StartAction::None);
        assert_eq!(s.rekey_time, Duration::from_secs(4 * 3600));
        assert_eq!(s.child_rekey_time, Duration::from_secs(3600));
        assert_eq!(s.child_life_time, Duration::from_secs(3960));
        assert_eq!(s.jitter, Duration::from_secs(360));
        assert_eq!(s.dpd_delay, Duration::from_secs(30));
        assert_eq!(s.dpd_action, DpdAction::Clear);
        assert_eq!(
            s.retransmit,
            Retransmit {
                timeout: Duration::from_secs(1),
                base: 1.8,
                tries: 7,
                limit: Duration::from_secs(8),
            }
        );
        assert!(s.force_encap, "encap defaults to udp");
        assert!(s.mobike, "MOBIKE is answered by default");
        assert!(!k.start_on_boot());

        let e = k.ike_config().unwrap();
        assert_eq!(e.name, "ik");
        assert_eq!(e.local, "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(e.remote, "198.51.100.2".parse::<IpAddr>().unwrap());
        assert_eq!(e.local_id, s.local_id);
        assert_eq!(e.remote_id, s.remote_id);
        assert_eq!(e.proposals, s.proposals);
        assert_eq!(e.child.proposals, s.esp_proposals);
        assert_eq!(e.child.mode, Mode::Tunnel);
        assert_eq!(
            e.child.local_ts,
            vec![Ts::Ipv4 {
                ip_protocol: 0,
                start_port: 0,
                end_port: 65535,
                start: "10.1.0.0".parse().unwrap(),
                end: "10.1.255.255".parse().unwrap(),
            }]
        );
        assert_eq!(
            e.child.remote_ts,
            vec![Ts::Ipv4 {
                ip_protocol: 0,
                start_port: 0,
                end_port: 65535,
                start: "10.2.0.0".parse().unwrap(),
                end: "10.2.255.255".parse().unwrap(),
            }]
        );
        assert_eq!(
            (e.child.rekey_time, e.child.life_time, e.child.jitter),
            (s.child_rekey_time, s.child_life_time, s.jitter)
        );
        assert_eq!((e.rekey_time, e.jitter), (s.rekey_time, s.jitter));
        assert_eq!((e.dpd_delay, e.dpd_action), (s.dpd_delay, s.dpd_action));
        assert_eq!((e.retransmit, e.force_encap), (s.retransmit, true));
        assert!(matches!(e.local_auth, LocalAuth::Psk(_)));
        assert!(matches!(e.remote_auth, RemoteAuth::Psk(_)));

        // A connection without IKE has no engine configuration.
        let m = parse_str(&minimal()).unwrap();
        assert!(m.connections[0].ike().is_none());
        assert!(m.connections[0].ike_config().is_none());
        assert!(!m.connections[0].start_on_boot());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ike_values_are_used() {
        let d = ike_dir();
        let c = ike_ok(
            &d,
            &ike_conn(
                "proto = \"icmp\"\nlocal_ts = [\"10.1.0.0/16\", \"2001:db8:1::/48\"]\n\
                 remote_ts = [\"10.2.0.7/32\", \"2001:db8:2::/48\"]\nencap = \"none\"",
                r#"psk_file = "psk"
proposals = ["aes256gcm16-prfsha384-ecp384,chacha20poly1305-prfsha256-x25519"]
esp_proposals = ["aes256gcm16-esn-x25519"]
local_id = "moon.example"
remote_id = "%any"
start_action = "start"
rekey_time = "1d"
child_rekey_time = "10m"
child_life_time = "15m"
jitter = "1m"
dpd_delay = 0
dpd_action = "restart"
retransmit_timeout = "2s"
retransmit_tries = 3"#,
            )
            // Two local_ts/remote_ts keys would be a TOML error: drop the defaults.
            .replacen(
                "local_ts = [\"10.1.0.0/16\"]\nremote_ts = [\"10.2.0.0/16\"]\n",
                "",
                1,
            ),
        );
        crate::assert_effective_round_trips(&c, &d);
        let k = &c.connections[0];
        let s = k.ike().unwrap();
        assert_eq!(
            s.proposals,
            specs(
                ProposalKind::Ike,
                &[
                    "aes256gcm16-prfsha384-ecp384",
                    "chacha20poly1305-prfsha256-x25519"
                ]
            )
        );
        assert_eq!(s.esp_proposals[0].esn, vec![true]);
        assert_eq!(s.local_id, Identity::Fqdn("moon.example".into()));
        assert_eq!(s.remote_id, None);
        assert!(k.start_on_boot());
        assert_eq!(
            (
                s.rekey_time,
                s.child_rekey_time,
                s.child_life_time,
                s.jitter
            ),
            (
                Duration::from_secs(86400),
                Duration::from_secs(600),
                Duration::from_secs(900),
                Duration::from_secs(60)
            )
        );
        assert_eq!(
            (s.dpd_delay, s.dpd_action),
            (Duration::ZERO, DpdAction::Restart)
        );
        assert_eq!(
            (s.retransmit.timeout, s.retransmit.tries),
            (Duration::from_secs(2), 3)
        );
        assert!(!s.force_encap, "encap none: no forced encapsulation");
        let e = k.ike_config().unwrap();
        let protos = |v: &[Ts]| {
            v.iter()
                .map(|t| match t {
                    Ts::Ipv4 { ip_protocol, .. } => (4, *ip_protocol),
                    Ts::Ipv6 { ip_protocol, .. } => (6, *ip_protocol),
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        // ICMP per family: 1 for IPv4, 58 for IPv6.
        assert_eq!(protos(&e.child.local_ts), [(4, 1), (6, 58)]);
        assert_eq!(protos(&e.child.remote_ts), [(4, 1), (6, 58)]);
        assert!(matches!(
            e.child.remote_ts[0],
            Ts::Ipv4 { start, end, .. } if start == end && start == "10.2.0.7".parse::<std::net::Ipv4Addr>().unwrap()
        ));

        // Transport mode: the selectors are the two hosts.
        let c = ike_ok(
            &d,
            &ike_conn("mode = \"transport\"", "psk_file = \"psk\"").replacen(
                "local_ts = [\"10.1.0.0/16\"]\nremote_ts = [\"10.2.0.0/16\"]\n",
                "",
                1,
            ),
        );
        let e = c.connections[0].ike_config().unwrap();
        assert_eq!(e.child.mode, Mode::Transport);
        assert!(matches!(
            e.child.local_ts[..],
            [Ts::Ipv4 { start, end, ip_protocol: 0, .. }] if start == end && start.octets() == [192, 0, 2, 1]
        ));

        // The jitter default follows the smaller rekey time.
        let c = ike_ok(
            &d,
            &ike_conn("", "psk_file = \"psk\"\nrekey_time = \"10m\""),
        );
        assert_eq!(
            c.connections[0].ike().unwrap().jitter,
            Duration::from_secs(60)
        );
        // No rekeying at all: no jitter, no lifetime.
        let c = ike_ok(
            &d,
            &ike_conn(
                "",
                "psk_file = \"psk\"\nrekey_time = 0\nchild_rekey_time = 0",
            ),
        );
        let s = c.connections[0].ike().unwrap();
        assert_eq!(
            (s.jitter, s.child_life_time),
            (Duration::ZERO, Duration::ZERO)
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn psk_files_text_hex_and_permissions() {
        let d = temp_dir();
        let load_psk = |data: &[u8], mode: u32| {
            write_mode(&d, "p", data, mode);
            ike_parse(&d, &ike_conn("", "psk_file = \"p\""))
        };
        let psk_of = |c: &LoadedConfig| match &c.connections[0].ike().unwrap().local_auth {
            LocalAuth::Psk(k) => k.to_vec(),
            other => panic!("{other:?}"),
        };
        let text = b"correct horse battery staple";
        for (data, want) in [
            (&b"correct horse battery staple\n"[..], &text[..]),
            (b"correct horse battery staple\r\n", text),
            (b"correct horse battery staple", text),
            // Only one final newline goes.
            (
                b"correct horse battery staple\n\n",
                b"correct horse battery staple\n",
            ),
            (
                b"0X0001020304050607 08090a0b0c0d0e0f\n10111213\n",
                &[
                    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                ],
            ),
        ] {
            let c = load_psk(data, 0o600).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(psk_of(&c), want, "{:?}", String::from_utf8_lossy(data));
            assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        }
        // Group or other access of any kind is refused.
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o660] {
            let e = load_psk(b"correct horse battery staple", mode)
                .unwrap_err()
                .to_string();
            assert_has(
                &e,
                &[
                    "connection[0].ike.psk_file (connection \"ik\")",
                    "is readable or writable by group/others",
                    &format!("(mode {mode:04o})"),
                    "chmod 600",
                ],
            );
            assert!(!e.contains("horse"), "{e}");
        }
        assert!(load_psk(b"correct horse battery staple", 0o400).is_ok());
        // Empty, bad hex, short.
        for data in [&b""[..], b"\n", b"0x"] {
            let e = load_psk(data, 0o600).unwrap_err().to_string();
            assert_has(&e, &["ike.psk_file", "empty"]);
        }
        let e = load_psk(b"0xsecretsecretsecret", 0o600)
            .unwrap_err()
            .to_string();
        assert_has(&e, &["ike.psk_file", "starts with 0x but is not hex"]);
        assert!(!e.contains("secret"), "{e}");
        let c = load_psk(b"tensecrets", 0o600).unwrap();
        assert_has(
            &c.warnings.join("\n"),
            &["ike.psk_file", "a 10-byte pre-shared key", "at least 20"],
        );
        assert!(!c.warnings.join("\n").contains("tensecrets"));
        // Missing file.
        let e = ike_err(&d, &ike_conn("", "psk_file = \"nope\""));
        assert_has(&e, &["ike.psk_file", "cannot read psk_file", "nope"]);
        // Debug output never shows the key.
        let c = load_psk(b"correct horse battery staple", 0o600).unwrap();
        let dbg = format!("{c:?}");
        assert!(
            !dbg.contains("horse") && !dbg.contains("99, 111, 114"),
            "{dbg}"
        );
        let c = load_psk(PSK_HEX.as_bytes(), 0o600).unwrap();
        let dbg = format!("{c:#?}");
        assert!(
            !dbg.contains("0011223344") && !dbg.contains("136, 153"),
            "{dbg}"
        );
        assert!(dbg.contains("local_auth: psk"), "{dbg}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ike_connection_level_errors() {
        let d = ike_dir();
        // Both [connection.esp] and [connection.ike].
        let text = format!(
            "{}\n[connection.esp]\nsuite = \"aes128gcm16\"\n{}",
            ike_conn("", "psk_file = \"psk\""),
            good_esp(0x1001, 0x1002)
        );
        assert_has(
            &ike_err(&d, &text),
            &["connection[0].esp (connection \"ik\")", "are both given"],
        );
        // Only ESP.
        let e = ike_err(
            &d,
            &ike_conn(
                "protocol = \"esp+ah\"\nencap = \"none\"",
                "psk_file = \"psk\"",
            ),
        );
        assert_has(&e, &["connection[0].protocol", "negotiates ESP SAs only"]);
        assert!(!e.contains("needs a [connection"), "{e}");
        // Per-CPU SAs are negotiated by IKE too (RFC 9611), still over
        // ESP-in-UDP only (the receiver steers by SPI).
        let c = ike_ok(&d, &ike_conn("per_cpu_sas = 4", "psk_file = \"psk\""));
        let conn = &c.connections[0];
        assert_eq!(conn.per_cpu_sas, 4);
        assert_eq!(conn.ike_config().unwrap().child.per_cpu_sas, 4);
        assert_has(
            &ike_err(
                &d,
                &ike_conn("per_cpu_sas = 2\nencap = \"none\"", "psk_file = \"psk\""),
            ),
            &["connection[0].per_cpu_sas", "encap = \"udp\""],
        );
        // Several workers are fine with IKE (the IKE engine runs on worker
        // 0 and installs each SA into every worker).
        let text = format!(
            "[gateway]\nworkers = 2\n{}",
            ike_conn("", "psk_file = \"psk\"")
        );
        ike_ok(&d, &text);
        assert!(parse_str(&format!("[gateway]\nworkers = 2\n{}", minimal())).is_ok());
        // esn is negotiated.
        let c = ike_ok(&d, &ike_conn("esn = true", "psk_file = \"psk\""));
        assert_has(
            &c.warnings.join("\n"),
            &["connection[0].esn", "esp_proposals"],
        );
        // Unknown keys and wrong values are refused with their path.
        assert_has(
            &ike_err(&d, &ike_conn("", "psk_file = \"psk\"\nsecret = \"x\"")),
            &["connection[0].ike.secret", "unknown field `secret`"],
        );
        assert_has(
            &ike_err(&d, &ike_conn("", "psk_file = \"psk\"\nauth = \"cert\"")),
            &[
                "connection[0].ike.auth",
                "unknown variant `cert`",
                "`psk`",
                "`pubkey`",
            ],
        );
        assert_has(
            &ike_err(
                &d,
                &ike_conn("", "psk_file = \"psk\"\nstart_action = \"trap\""),
            ),
            &["connection[0].ike.start_action", "`none`", "`start`"],
        );
        assert_has(
            &ike_err(
                &d,
                &ike_conn("", "psk_file = \"psk\"\ndpd_action = \"hold\""),
            ),
            &["connection[0].ike.dpd_action", "`clear`", "`restart`"],
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ike_value_errors_name_their_key() {
        let d = ike_dir();
        let cases: &[(&str, &[&str])] = &[
            ("", &["connection[0].ike (connection \"ik\")", "auth = \"psk\" (the default) needs psk_file"]),
            (
                "psk_file = \"psk\"\nproposals = [\"aes128gcm16-prfsha256-x25519\", \"aes999-sha256-modp2048\"]",
                &["connection[0].ike.proposals[1]", "unknown algorithm 'aes999'"],
            ),
            (
                "psk_file = \"psk\"\nproposals = [\"aes128gcm16-prfsha256\"]",
                &["ike.proposals[0]", "needs a key exchange group"],
            ),
            ("psk_file = \"psk\"\nproposals = []", &["ike.proposals", "an empty list"]),
            (
                "psk_file = \"psk\"\nesp_proposals = [\"aes128gcm16-prfsha256\"]",
                &["ike.esp_proposals[0]", "is a PRF"],
            ),
            ("psk_file = \"psk\"\nlocal_id = \"%any\"", &["ike.local_id", "for remote_id only"]),
            ("psk_file = \"psk\"\nremote_id = \"@\"", &["ike.remote_id", "\"@\""]),
            (
                "psk_file = \"psk\"\njitter = \"30m\"",
                &["ike.jitter", "30m is not below half of child_rekey_time (1h)"],
            ),
            (
                "psk_file = \"psk\"\nrekey_time = \"20m\"\njitter = \"10m\"",
                &["ike.jitter", "half of rekey_time (20m)"],
            ),
            (
                "psk_file = \"psk\"\nchild_life_time = \"1h\"",
                &["ike.child_life_time", "1h is not above child_rekey_time (1h)"],
            ),
            (
                "psk_file = \"psk\"\nchild_rekey_time = \"2h\"",
                &["ike.child_life_time", "2h12m is not above child_rekey_time (2h)"],
            )
                // The default life is 1.1 × rekey: always above. (Checked below.)
                ,
            ("psk_file = \"psk\"\nrekey_time = \"1x\"", &["ike.rekey_time", "is not a duration"]),
            ("psk_file = \"psk\"\ndpd_delay = \"400d\"", &["ike.dpd_delay", "too long: at most 365d"]),
            ("psk_file = \"psk\"\nretransmit_timeout = 0", &["ike.retransmit_timeout", "at least 1 second"]),
            ("psk_file = \"psk\"\nretransmit_tries = 21", &["ike.retransmit_tries", "0 to 20"]),
            (
                "psk_file = \"psk\"\nca = \"x\"",
                &["ike.ca", "only used with remote_auth = \"pubkey\"", "(the default: as auth)"],
            ),
            (
                "psk_file = \"psk\"\nprivate_key = \"x\"",
                &["ike.private_key", "only used with auth = \"pubkey\""],
            ),
            (
                "psk_file = \"psk\"\ncert = \"x\"",
                &["ike.cert", "only used with auth = \"pubkey\""],
            ),
            (
                "auth = \"pubkey\"\nremote_auth = \"psk\"\npsk_file = \"psk\"",
                &["connection[0].ike (connection \"ik\")", "auth = \"pubkey\" needs private_key"],
            ),
        ];
        for (ike, want) in cases {
            let text = ike_conn("", ike);
            if ike.contains("child_rekey_time = \"2h\"") {
                // Not an error: the default lifetime is 2h12m.
                let c = ike_ok(&d, &text);
                assert_eq!(
                    c.connections[0].ike().unwrap().child_life_time,
                    Duration::from_secs(7920)
                );
                continue;
            }
            assert_has(&ike_err(&d, &text), want);
        }
        // force_encap needs UDP.
        assert_has(
            &ike_err(
                &d,
                &ike_conn("encap = \"none\"", "psk_file = \"psk\"\nforce_encap = true"),
            ),
            &["ike.force_encap", "encap = \"none\""],
        );
        let c = ike_ok(&d, &ike_conn("", "psk_file = \"psk\"\nforce_encap = false"));
        assert!(!c.connections[0].ike().unwrap().force_encap);
        let c = ike_ok(&d, &ike_conn("", "psk_file = \"psk\"\nmobike = false"));
        let ike = c.connections[0].ike().unwrap();
        assert!(!ike.mobike);
        assert!(!c.connections[0].ike_config().unwrap().mobike);
        assert_eq!(
            ike.to_table().mobike.map(|v| v.into_inner()),
            Some(false),
            "the effective configuration says it"
        );
        // child_rekey_time = 0 with a lifetime warns.
        let c = ike_ok(
            &d,
            &ike_conn(
                "",
                "psk_file = \"psk\"\nchild_rekey_time = 0\nchild_life_time = \"1h\"",
            ),
        );
        assert_has(
            &c.warnings.join("\n"),
            &["ike.child_rekey_time", "never rekeyed"],
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ike_qesp_setting_and_its_checks() {
        let d = ike_dir();
        let raw = "encap = \"none\"";
        // The default: off, ESP only, and the engine is told so.
        let c = ike_ok(&d, &ike_conn(raw, "psk_file = \"psk\""));
        let k = &c.connections[0];
        assert_eq!(k.ike().unwrap().qesp, QespMode::Off);
        assert_eq!(k.ike_config().unwrap().child.qesp, QespMode::Off);
        let worst = |k: &crate::Connection| {
            let g = k.spec().negotiated;
            g.iter().map(|g| g.worst()).max().unwrap()
        };
        let esp_overhead = worst(k);
        // prefer and require reach the engine; the TUN is sized for Q-ESP's
        // 8 more header bytes; the effective configuration says them.
        for (word, mode) in [
            ("off", QespMode::Off),
            ("prefer", QespMode::Prefer),
            ("require", QespMode::Require),
        ] {
            let c = ike_ok(
                &d,
                &ike_conn(raw, &format!("psk_file = \"psk\"\nqesp = \"{word}\"")),
            );
            assert!(c.warnings.is_empty(), "{:?}", c.warnings);
            crate::assert_effective_round_trips(&c, &d);
            let k = &c.connections[0];
            assert_eq!(k.ike().unwrap().qesp, mode);
            assert_eq!(k.ike_config().unwrap().child.qesp, mode);
            let extra = if mode == QespMode::Off { 0 } else { 8 };
            assert_eq!(worst(k), esp_overhead + extra, "{word}");
            // The connection still starts as ESP: the layer follows the
            // negotiated SAs.
            assert_eq!(k.protocol(), crate::Protocols::Esp);
        }
        // UDP encapsulation (the default) is refused, at the key.
        let e = ike_err(&d, &ike_conn("", "psk_file = \"psk\"\nqesp = \"require\""));
        assert_has(
            &e,
            &[
                "ike.toml:12:",
                "connection[0].ike.qesp (connection \"ik\")",
                "qesp = \"require\" needs encap = \"none\"",
                "cannot be UDP-encapsulated",
            ],
        );
        // So is force_encap (which needs UDP anyway).
        let e = ike_err(
            &d,
            &ike_conn(
                "encap = \"udp\"",
                "psk_file = \"psk\"\nforce_encap = true\nqesp = \"prefer\"",
            ),
        );
        assert_has(&e, &["ike.qesp", "needs encap = \"none\""]);
        // Anti-replay is required.
        let e = ike_err(
            &d,
            &ike_conn(
                "encap = \"none\"\nreplay_window = 0",
                "psk_file = \"psk\"\nqesp = \"prefer\"",
            ),
        );
        assert_has(&e, &["ike.qesp", "needs anti-replay", "replay_window = 0"]);
        // protocol = "qesp" is manual keying: with IKE say qesp instead.
        let e = ike_err(
            &d,
            &ike_conn(
                "protocol = \"qesp\"\nencap = \"none\"",
                "psk_file = \"psk\"",
            ),
        );
        assert_has(
            &e,
            &[
                "connection[0].protocol",
                "set qesp = \"require\"",
                "in [connection.ike]",
            ],
        );
        // A wrong value names the right ones.
        assert_has(
            &ike_err(&d, &ike_conn(raw, "psk_file = \"psk\"\nqesp = \"yes\"")),
            &["ike.qesp", "`off`", "`prefer`", "`require`"],
        );
        // Q-ESP needs encryption: AES-GMAC alone cannot be required, and
        // is left to ESP with prefer.
        assert_has(
            &ike_err(
                &d,
                &ike_conn(
                    raw,
                    "psk_file = \"psk\"\nqesp = \"require\"\nesp_proposals = [\"aes128gmac\"]",
                ),
            ),
            &["ike.qesp", "no esp_proposals can be Q-ESP"],
        );
        let c = ike_ok(
            &d,
            &ike_conn(
                raw,
                "psk_file = \"psk\"\nqesp = \"prefer\"\nesp_proposals = [\"aes128gcm16\", \"aes128gmac\"]",
            ),
        );
        assert_has(
            &c.warnings.join("\n"),
            &["ike.esp_proposals", "for ESP only"],
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A temp dir with the example key files, secrets at mode 0600.
    fn example_keys_dir() -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let d = temp_dir();
        std::fs::create_dir(d.join("keys")).unwrap();
        let src = examples_dir();
        for f in [
            "ike-psk.toml",
            "ike-cert.toml",
            "keys/ike-psk.secret",
            "keys/ca.crt",
            "keys/moon.key",
            "keys/moon.crt",
            "keys/sun.key",
            "keys/sun.crt",
            "keys/moon-ed25519.key",
            "keys/moon-ed25519.pub",
            "keys/venus-ed25519.key",
            "keys/venus-ed25519.pub",
        ] {
            std::fs::copy(src.join(f), d.join(f)).unwrap();
            let mode = if f.ends_with(".key") || f.ends_with(".secret") {
                0o600
            } else {
                0o644
            };
            std::fs::set_permissions(d.join(f), std::fs::Permissions::from_mode(mode)).unwrap();
        }
        d
    }

    #[test]
    fn ike_examples_load() {
        let d = example_keys_dir();
        let c = load(&d.join("ike-psk.toml")).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        crate::assert_effective_round_trips(&c, &d);
        let b = c.connection("site-b").unwrap();
        let s = b.ike().unwrap();
        assert!(b.start_on_boot());
        assert_eq!(s.dpd_action, DpdAction::Restart);
        match &s.local_auth {
            LocalAuth::Psk(k) => assert_eq!(k.len(), 44),
            other => panic!("{other:?}"),
        }

        let c = load(&d.join("ike-cert.toml")).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        // The effective configuration names the same files and says the
        // same identities, proposals and timers.
        crate::assert_effective_round_trips(&c, &d);
        let t = c.effective_toml();
        assert!(
            t.contains("private_key = \"") && t.contains("moon.key"),
            "{t}"
        );
        assert!(!t.contains("PRIVATE KEY"), "{t}");
        let sun = c.connection("sun").unwrap();
        let s = sun.ike().unwrap();
        assert!(sun.start_on_boot());
        assert_eq!(s.local_id, Identity::Fqdn("moon.example".into()));
        assert_eq!(s.remote_id, Some(Identity::Fqdn("sun.example".into())));
        let moon_crt =
            Certificate::from_pem(&std::fs::read(d.join("keys/moon.crt")).unwrap()).unwrap();
        match &s.local_auth {
            LocalAuth::Signature { key, certs } => {
                assert_eq!(certs, &moon_crt);
                assert_eq!(
                    key.public_key().spki_der(),
                    moon_crt[0].public_key().unwrap().spki_der()
                );
            }
            other => panic!("{other:?}"),
        }
        match &s.remote_auth {
            RemoteAuth::Ca(cas) => {
                assert_eq!(cas.len(), 1);
                let sun_crt =
                    Certificate::from_pem(&std::fs::read(d.join("keys/sun.crt")).unwrap()).unwrap();
                // The example chain verifies (openssl verify agrees, see the example).
                espgate_ike::cert::verify_chain(&sun_crt[0], &[], cas, 1_900_000_000).unwrap();
                assert!(sun_crt[0].matches_identity(s.remote_id.as_ref().unwrap()));
            }
            other => panic!("{other:?}"),
        }
        let venus = c.connection("venus").unwrap();
        let v = venus.ike().unwrap();
        assert!(!venus.start_on_boot());
        let venus_pub =
            PublicKey::from_pem(&std::fs::read(d.join("keys/venus-ed25519.pub")).unwrap()).unwrap();
        match (&v.local_auth, &v.remote_auth) {
            (LocalAuth::Signature { key, certs }, RemoteAuth::PublicKey(p)) => {
                assert!(certs.is_empty());
                assert_eq!(p, &venus_pub);
                let moon_pub =
                    PublicKey::from_pem(&std::fs::read(d.join("keys/moon-ed25519.pub")).unwrap())
                        .unwrap();
                assert_eq!(key.public_key(), moon_pub);
            }
            other => panic!("{other:?}"),
        }
        let e = venus.ike_config().unwrap();
        assert!(matches!(e.remote_auth, RemoteAuth::PublicKey(_)));
        // Nothing secret in Debug.
        let dbg = format!("{c:?}");
        let key_pem = std::fs::read_to_string(d.join("keys/moon.key")).unwrap();
        let body = key_pem.lines().nth(1).unwrap();
        assert!(!dbg.contains(body), "{dbg}");

        // As git checks them out (0644), the PSK example is refused and the
        // key files warn.
        use std::os::unix::fs::PermissionsExt;
        for f in [
            "keys/ike-psk.secret",
            "keys/moon.key",
            "keys/moon-ed25519.key",
        ] {
            std::fs::set_permissions(d.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let e = load(&d.join("ike-psk.toml")).unwrap_err().to_string();
        assert_has(
            &e,
            &["ike-psk.toml:", "connection[0].ike.psk_file", "chmod 600"],
        );
        let c = load(&d.join("ike-cert.toml")).unwrap();
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        for w in &c.warnings {
            assert_has(w, &["ike.private_key", "chmod 600"]);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ike_signature_auth_errors() {
        let d = example_keys_dir();
        let pk = |ike: &str| format!("auth = \"pubkey\"\n{ike}");
        let cases: &[(&str, &[&str])] = &[
            (
                "private_key = \"keys/moon.key\"",
                &[
                    "connection[0].ike (connection \"ik\")",
                    "remote_auth = \"pubkey\" (the default: as auth) needs ca",
                ],
            ),
            (
                "private_key = \"keys/moon.key\"\nca = \"keys/ca.crt\"\nremote_public_key = \"keys/venus-ed25519.pub\"",
                &["ike.remote_public_key", "both given"],
            ),
            (
                "private_key = \"keys/moon.key\"\nca = \"keys/ca.crt\"\npsk_file = \"keys/ike-psk.secret\"",
                &["ike.psk_file", "not used"],
            ),
            (
                "private_key = \"keys/sun.key\"\ncert = \"keys/moon.crt\"\nca = \"keys/ca.crt\"",
                &["ike.cert", "is not for the ECDSA P-256 key in private_key"],
            ),
            (
                "private_key = \"keys/moon.crt\"\nca = \"keys/ca.crt\"",
                &["ike.private_key", "private key file", "no PRIVATE KEY block"],
            ),
            (
                "private_key = \"keys/moon.key\"\nca = \"keys/moon.key\"",
                &["ike.ca", "certificate file", "no CERTIFICATE block"],
            ),
            (
                "private_key = \"keys/moon.key\"\nremote_public_key = \"keys/moon.crt\"",
                &["ike.remote_public_key", "public key file", "PUBLIC KEY"],
            ),
            (
                "private_key = \"keys/moon.key\"\nremote_public_key = \"keys/none.pub\"",
                &["ike.remote_public_key", "cannot read public key file", "none.pub"],
            ),
        ];
        for (ike, want) in cases {
            assert_has(&ike_err(&d, &ike_conn("", &pk(ike))), want);
        }
        // Mixed: we sign, the peer uses the PSK.
        let c = ike_ok(
            &d,
            &ike_conn(
                "",
                "auth = \"pubkey\"\nremote_auth = \"psk\"\nprivate_key = \"keys/moon.key\"\n\
                 psk_file = \"keys/ike-psk.secret\"",
            ),
        );
        let s = c.connections[0].ike().unwrap();
        assert_eq!(
            (s.auth(), s.remote_auth_method()),
            (AuthMethod::Pubkey, AuthMethod::Psk)
        );

        // The certificate binds the default identity (our address is in its
        // subjectAltName)...
        let good =
            "private_key = \"keys/moon.key\"\ncert = \"keys/moon.crt\"\nca = \"keys/ca.crt\"";
        let c = ike_ok(&d, &ike_conn("", &pk(good)));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        // ...but not another address, nor another name.
        let c = ike_ok(
            &d,
            &ike_conn("", &pk(good)).replace("local = \"192.0.2.1\"", "local = \"192.0.2.9\""),
        );
        assert_has(
            &c.warnings.join("\n"),
            &[
                "connection[0].ike.cert",
                "does not bind local_id 192.0.2.9 (local_id defaults to the local address)",
                "local_id = \"C=CH, O=espgate example, CN=moon.example\"",
            ],
        );
        let c = ike_ok(
            &d,
            &ike_conn("", &pk(&format!("{good}\nlocal_id = \"sun.example\""))),
        );
        assert_has(
            &c.warnings.join("\n"),
            &[
                "connection[0].ike.local_id",
                "does not bind local_id sun.example",
            ],
        );
        // The subject DN binds.
        let c = ike_ok(
            &d,
            &ike_conn(
                "",
                &pk(&format!(
                    "{good}\nlocal_id = \"C=CH, O=espgate example, CN=moon.example\""
                )),
            ),
        );
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A range selector of all protocols and ports.
    fn ts4(start: &str, end: &str) -> Ts {
        Ts::Ipv4 {
            ip_protocol: 0,
            start_port: 0,
            end_port: 65535,
            start: start.parse().unwrap(),
            end: end.parse().unwrap(),
        }
    }

    fn prefixes(list: &[&str]) -> Vec<Prefix> {
        list.iter().map(|p| p.parse().unwrap()).collect()
    }

    /// `psk_file` and one `[[connection.ike.child]]` per item (its keys).
    fn with_children(children: &[&str]) -> String {
        let mut s = "psk_file = \"psk\"\n".to_string();
        for c in children {
            s.push_str(&format!("[[connection.ike.child]]\n{c}\n"));
        }
        s
    }

    #[test]
    fn ike_child_selector_sets() {
        let d = ike_dir();
        let text = ike_conn(
            "",
            &with_children(&[
                "remote_ts = [\"10.3.0.0/24\"]",
                "local_ts = [\"10.1.5.0/24\", \"2001:db8:1::/48\"]\n\
                 remote_ts = [\"10.4.0.0/24\", \"2001:db8:4::/48\"]",
            ]),
        );
        let c = ike_ok(&d, &text);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let k = &c.connections[0];
        // An omitted side is the connection's own.
        assert_eq!(
            k.children,
            [
                ChildSelectors {
                    local_ts: prefixes(&["10.1.0.0/16"]),
                    remote_ts: prefixes(&["10.3.0.0/24"]),
                },
                ChildSelectors {
                    local_ts: prefixes(&["10.1.5.0/24", "2001:db8:1::/48"]),
                    remote_ts: prefixes(&["10.4.0.0/24", "2001:db8:4::/48"]),
                },
            ]
        );
        let sets: Vec<_> = k.selector_sets().collect();
        assert_eq!(sets.len(), 3);
        assert_eq!(sets[0], (&k.local_ts[..], &k.remote_ts[..]));
        assert_eq!(
            sets[2].1,
            &prefixes(&["10.4.0.0/24", "2001:db8:4::/48"])[..]
        );

        // The engine gets the further sets, converted as the first.
        let e = k.ike_config().unwrap();
        assert_eq!(e.child.local_ts, [ts4("10.1.0.0", "10.1.255.255")]);
        assert_eq!(e.child.set_count(), 3);
        let more = &e.child.more_ts;
        assert_eq!(more[0].local_ts, [ts4("10.1.0.0", "10.1.255.255")]);
        assert_eq!(more[0].remote_ts, [ts4("10.3.0.0", "10.3.0.255")]);
        assert_eq!(
            more[1].local_ts,
            [
                ts4("10.1.5.0", "10.1.5.255"),
                Ts::Ipv6 {
                    ip_protocol: 0,
                    start_port: 0,
                    end_port: 65535,
                    start: "2001:db8:1::".parse().unwrap(),
                    end: "2001:db8:1:ffff:ffff:ffff:ffff:ffff".parse().unwrap(),
                }
            ]
        );
        assert_eq!(more[1].remote_ts.len(), 2);

        // The data plane's selectors cover every set, each pair once.
        let pairs: Vec<(String, String)> = k
            .selectors()
            .iter()
            .map(|t| (t.local.to_string(), t.remote.to_string()))
            .collect();
        let want = [
            ("10.1.0.0/16", "10.2.0.0/16"),
            ("10.1.0.0/16", "10.3.0.0/24"),
            ("10.1.5.0/24", "10.4.0.0/24"),
            ("2001:db8:1::/48", "2001:db8:4::/48"),
        ];
        assert_eq!(pairs, want.map(|(l, r)| (l.to_string(), r.to_string())));

        // Written back: both sides of each child, loaded to the same.
        let t = k.to_table(crate::KeyText::Hex);
        let child = &t.ike.as_ref().unwrap().get_ref().child;
        assert_eq!(child.len(), 2);
        let local = child[0].get_ref().local_ts.as_ref().unwrap().get_ref();
        assert_eq!(local[0].get_ref(), "10.1.0.0/16");
        let written = toml::to_string(&c.effective(crate::KeyText::Hex)).unwrap();
        assert_eq!(
            written.matches("[[connection.ike.child]]").count(),
            2,
            "{written}"
        );
        crate::assert_effective_round_trips(&c, &d);

        // Without child tables: none, and nothing written.
        let c = ike_ok(&d, &ike_conn("", "psk_file = \"psk\""));
        assert!(c.connections[0].children.is_empty());
        assert!(c.connections[0]
            .ike_config()
            .unwrap()
            .child
            .more_ts
            .is_empty());
        assert_eq!(c.connections[0].selectors().len(), 1);
        let written = toml::to_string(&c.effective(crate::KeyText::Hex)).unwrap();
        assert!(!written.contains("child]]"), "{written}");
        // Manual keys: none either.
        assert!(parse_str(&minimal()).unwrap().connections[0]
            .children
            .is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The defaults derived from rekey times are whole seconds, as every
    /// duration the file can hold: `config check` shows what is in effect,
    /// and that text loads to the same settings. (The config_parse fuzz
    /// target found a rekey time of 8 s giving a jitter of 0.8 s, shown and
    /// read back as "0s".)
    #[test]
    fn derived_rekey_defaults_are_whole_seconds_and_round_trip() {
        let d = ike_dir();
        // (rekey_time, child_rekey_time) -> (jitter, child_life_time)
        let cases = [
            (("8s", "1h"), (1, 3960)),
            (("25s", "25s"), (2, 27)),
            (("5s", "5s"), (1, 6)),
            (("3s", "7s"), (1, 8)),
            (("2s", "1h"), (0, 3960)),
            (("1s", "1s"), (0, 2)),
            (("4h", "95s"), (9, 104)),
            (("0", "0"), (0, 0)),
        ];
        for ((ike_rk, child_rk), (jitter, life)) in cases {
            let c = ike_ok(
                &d,
                &ike_conn(
                    "",
                    &format!(
                        "psk_file = \"psk\"\nrekey_time = \"{ike_rk}\"\n\
                         child_rekey_time = \"{child_rk}\""
                    ),
                ),
            );
            let s = c.connections[0].ike().unwrap();
            assert_eq!(
                (s.jitter, s.child_life_time),
                (Duration::from_secs(jitter), Duration::from_secs(life)),
                "rekey_time {ike_rk}, child_rekey_time {child_rk}"
            );
            crate::assert_effective_round_trips(&c, &d);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Identities the file can name are written back so that they load to
    /// the same: an FQDN that looks like an address, or is spelled `%any`.
    #[test]
    fn identities_round_trip_through_the_effective_configuration() {
        let d = ike_dir();
        for (local, remote) in [
            ("@92.0.2.1", "@%any"),
            ("@a=b", "@fd00::1"),
            ("moon.example", "%any"),
            ("192.0.2.1", "@#0a0b"),
        ] {
            let c = ike_ok(
                &d,
                &ike_conn(
                    "",
                    &format!(
                        "psk_file = \"psk\"\nlocal_id = \"{local}\"\nremote_id = \"{remote}\""
                    ),
                ),
            );
            crate::assert_effective_round_trips(&c, &d);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ike_child_selector_set_errors() {
        let d = ike_dir();
        let bad = |extra: &str, children: &[&str]| {
            ike_err(&d, &ike_conn(extra, &with_children(children)))
        };
        let one = ["remote_ts = [\"10.3.0.0/24\"]"];
        // Transport mode has one selector set.
        assert_has(
            &bad("mode = \"transport\"", &one),
            &[
                "connection[0].ike.child (connection \"ik\")",
                "need mode = \"tunnel\"",
            ],
        );
        // Per-CPU child SAs (RFC 9611) go with every set.
        let c = ike_ok(&d, &ike_conn("per_cpu_sas = 2", &with_children(&one)));
        let ike = c.connections[0].ike_config().unwrap();
        assert_eq!((ike.child.per_cpu_sas, ike.child.more_ts.len()), (2, 1));
        // Prefixes as in the connection's lists.
        assert_has(
            &bad("", &["remote_ts = [\"10.3.0.0/24\", \"10.3.0.0/33\"]"]),
            &[
                "connection[0].ike.child[0].remote_ts[1]",
                "\"10.3.0.0/33\"",
                "expected a prefix like",
            ],
        );
        assert_has(
            &bad("", &[one[0], "local_ts = [\"10.9.0.0/x\"]"]),
            &[
                "connection[0].ike.child[1].local_ts[0]",
                "expected a prefix like",
            ],
        );
        assert_has(
            &bad("", &["local_ts = []\nremote_ts = [\"10.3.0.0/24\"]"]),
            &["connection[0].ike.child[0].local_ts", "empty list"],
        );
        // A set without a same-family pair.
        let e = bad(
            "",
            &["local_ts = [\"2001:db8:1::/48\"]\nremote_ts = [\"10.3.0.0/24\"]"],
        );
        assert_has(
            &e,
            &[
                "connection[0].ike.child[0].local_ts[0]",
                "2001:db8:1::/48 is IPv6 but remote_ts has no IPv6 prefix",
                "connection[0].ike.child[0].remote_ts[0]",
                "10.3.0.0/24 is IPv4 but local_ts has no IPv4 prefix",
            ],
        );
        // ...with the connection's own side.
        assert_has(
            &bad("", &["remote_ts = [\"2001:db8:3::/48\"]"]),
            &[
                "connection[0].ike.child[0].remote_ts[0]",
                "is IPv6 but the connection's local_ts (this child's, as it sets none) \
                 has no IPv6 prefix",
            ],
        );
        // An empty table would be the connection's own set again.
        let e = bad("", &[""]);
        assert_has(
            &e,
            &[
                "connection[0].ike.child[0]",
                "sets neither local_ts nor remote_ts",
            ],
        );
        assert!(!e.contains("overlaps"), "{e}");
        // Overlaps: with the connection's own set (identical, or a part of
        // it), and between two children.
        assert_has(
            &bad("", &["local_ts = [\"10.1.0.0/16\"]"]),
            &[
                "connection[0].ike.child[0]",
                "overlaps the connection's own local_ts/remote_ts",
                "local_ts 10.1.0.0/16 meets 10.1.0.0/16",
                "must be disjoint",
            ],
        );
        assert_has(
            &bad("", &["remote_ts = [\"10.2.5.0/24\"]"]),
            &[
                "connection[0].ike.child[0]",
                "overlaps the connection's own",
            ],
        );
        let e = bad(
            "",
            &[
                "remote_ts = [\"10.3.0.0/16\"]",
                "remote_ts = [\"10.4.0.0/16\"]",
                "local_ts = [\"10.1.7.0/24\"]\nremote_ts = [\"10.9.0.0/16\", \"10.3.1.0/24\"]",
            ],
        );
        assert_has(
            &e,
            &[
                "connection[0].ike.child[2]",
                "overlaps child[0] (local_ts 10.1.7.0/24 meets 10.1.0.0/16 and remote_ts \
                 10.3.1.0/24 meets 10.3.0.0/16)",
            ],
        );
        assert!(!e.contains("child[1]"), "{e}");
        // Disjoint: other locals for the same remotes, another family.
        let c = ike_ok(
            &d,
            &ike_conn(
                "local_ts = [\"10.1.0.0/16\", \"2001:db8:1::/48\"]\n\
                 remote_ts = [\"10.2.0.0/16\", \"2001:db8:2::/48\"]",
                &with_children(&[
                    "local_ts = [\"10.5.0.0/16\"]\nremote_ts = [\"10.2.0.0/16\"]",
                    "local_ts = [\"2001:db8:5::/48\"]\nremote_ts = [\"2001:db8:2::/48\"]",
                    // An inherited dual-stack side pairs with one family.
                    "remote_ts = [\"10.6.0.0/16\"]",
                ]),
            )
            .replacen(
                "local_ts = [\"10.1.0.0/16\"]\nremote_ts = [\"10.2.0.0/16\"]\n",
                "",
                1,
            ),
        );
        assert_eq!(c.connections[0].children.len(), 3);
        // At most 16 child tables.
        let many: Vec<String> = (0..17)
            .map(|k| format!("remote_ts = [\"10.{}.0.0/16\"]", 100 + k))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_has(
            &bad("", &many),
            &[
                "connection[0].ike.child[16]",
                "17 [[connection.ike.child]] tables",
                "at most 16",
            ],
        );
        let c = ike_ok(&d, &ike_conn("", &with_children(&many[..16])));
        assert_eq!(c.connections[0].children.len(), 16);
        // Unknown keys and syntax errors name the child, per connection.
        assert_has(
            &bad("", &["remote_ts = [\"10.3.0.0/24\"]\nproto = \"tcp\""]),
            &["connection[0].ike.child[0].proto", "unknown field `proto`"],
        );
        let two = format!(
            "{}{}",
            ike_conn("", &with_children(&one)),
            ike_conn(
                "",
                &with_children(&[
                    "remote_ts = [\"10.5.0.0/24\"]",
                    "remote_ts = [\"10.3.0.0/24\" \"10.4.0.0/24\"]"
                ])
            )
            .replace("\"ik\"", "\"ik2\"")
            .replace("198.51.100.2", "198.51.100.3")
        );
        // The second connection's second child (its own count).
        assert_has(
            &ike_err(&d, &two),
            &["TOML syntax", "connection[1].ike.child[1].remote_ts:"],
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn ike_child_selector_sets_across_connections() {
        let d = ike_dir();
        // A child's set overlaps another connection's own: warned, naming
        // the child.
        let text = format!(
            "{}{}",
            ike_conn("", &with_children(&["remote_ts = [\"10.3.0.0/24\"]"])),
            conn("m", "", &good_esp(0x1001, 0x1002)).replace("10.2.0.0/16", "10.3.0.0/16")
        );
        let c = ike_ok(&d, &text);
        assert_has(
            &c.warnings.join("\n"),
            &[
                "connection[1].remote_ts",
                "selectors overlap those of connection \"ik\" (connection[0].ike.child[0])",
            ],
        );
        // The other way round: the warning is at the child.
        let text = format!(
            "{}{}",
            conn("m", "", &good_esp(0x1001, 0x1002)).replace("10.2.0.0/16", "10.3.0.0/16"),
            ike_conn("", &with_children(&["remote_ts = [\"10.3.0.0/24\"]"]))
        );
        let c = ike_ok(&d, &text);
        assert_has(
            &c.warnings.join("\n"),
            &[
                "connection[1].ike.child[0].remote_ts",
                "selectors overlap those of connection \"m\" (connection[0])",
            ],
        );
        // Disjoint sets: no warning.
        let text = format!(
            "{}{}",
            ike_conn("", &with_children(&["remote_ts = [\"10.3.0.0/24\"]"])),
            conn("m", "", &good_esp(0x1001, 0x1002)).replace("10.2.0.0/16", "10.4.0.0/16")
        );
        assert!(ike_ok(&d, &text).warnings.is_empty());
        // A child's remote_ts holding the peer: routed into the TUN.
        let c = ike_ok(
            &d,
            &ike_conn("", &with_children(&["remote_ts = [\"198.51.100.0/24\"]"])),
        );
        assert_has(
            &c.warnings.join("\n"),
            &[
                "connection[0].ike.child[0].remote_ts[0]",
                "contains the peer's outer address 198.51.100.2",
            ],
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
