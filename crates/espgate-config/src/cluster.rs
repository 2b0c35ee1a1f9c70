//! The `[cluster]` table: seed 003's flat cluster (`docs/CLUSTER.md`).
//! Every node of a cluster has the same connections and the same shared
//! addresses; this table says which cluster it belongs to, which node it
//! is, where the cluster's etcd is and how packets are dispatched.

use crate::diag::{span, At, Validator};
use crate::files::read_secret_bytes;
use crate::schema::{value, ClusterTable, Scalar};
use espgate_core::cluster::{Dispatch, NodeId};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;
use zeroize::Zeroizing;

/// The default etcd endpoint.
pub const DEFAULT_ETCD: &str = "http://127.0.0.1:2379";
/// The default lease TTL (a node unheard of this long leaves the plan).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(3);
/// The default hold: how long a node forwards on its last plan without
/// hearing from etcd before it stops processing.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(10);

/// The largest `key_file` read (the key is 64 hex characters; a little
/// room for whitespace).
const MAX_CLUSTER_KEY_FILE_BYTES: u64 = 4096;

/// The cluster key: 32 bytes shared by every node (from `key_file`). The
/// SAs the leader's IKE negotiates are kept in etcd encrypted under it
/// (AES-256-GCM). Wiped on drop; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey(Zeroizing<[u8; 32]>);

impl ClusterKey {
    /// The key of these bytes.
    pub fn new(bytes: [u8; 32]) -> ClusterKey {
        ClusterKey(Zeroizing::new(bytes))
    }

    /// The key bytes.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Reads a key file: 64 hex characters (surrounding whitespace
    /// ignored), the file not accessible to group or others. The error
    /// names the file and says what is wrong, never what it holds.
    pub fn read(path: &Path) -> Result<ClusterKey, String> {
        let (data, mode) = read_secret_bytes(path, MAX_CLUSTER_KEY_FILE_BYTES)
            .map_err(|e| format!("cannot read key_file {}: {e}", path.display()))?;
        if mode & 0o077 != 0 {
            return Err(format!(
                "key_file {} is readable or writable by group/others (mode {mode:04o}); the \
                 cluster key must be private: chmod 600 it",
                path.display()
            ));
        }
        let text = data.trim_ascii();
        let expected = "expected 64 hex characters (a 32-byte key; `openssl rand -hex 32` \
                        makes one)";
        if text.len() != 64 {
            return Err(format!(
                "key_file {}: {} characters; {expected}",
                path.display(),
                text.len()
            ));
        }
        let mut key = Zeroizing::new([0u8; 32]);
        hex::decode_to_slice(text, &mut key[..])
            .map_err(|_| format!("key_file {}: not hex; {expected}", path.display()))?;
        Ok(ClusterKey(key))
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(not shown)")
    }
}

/// The `[cluster]` table, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// The cluster's name: its etcd keys live under `/espgate/NAME/`.
    pub name: String,
    /// This node's id (also the high 16 bits of its AEAD IVs).
    pub node: NodeId,
    /// etcd endpoints (`http://` or `https://`).
    pub etcd: Vec<String>,
    /// TLS: the CA that signed the etcd servers' certificates.
    pub etcd_ca: Option<PathBuf>,
    /// TLS client certificate and key, for etcd's client-cert auth.
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's key.
    pub etcd_key: Option<PathBuf>,
    /// etcd user name (etcd's password auth).
    pub etcd_user: Option<String>,
    /// File with the etcd user's password (mode 0600).
    pub etcd_password_file: Option<PathBuf>,
    /// File with the cluster key (mode 0600).
    pub key_file: Option<PathBuf>,
    /// The cluster key, read from `key_file` at load time: required when
    /// a connection runs IKE (the leader's negotiated SAs are kept in etcd
    /// encrypted under it).
    pub key: Option<ClusterKey>,
    /// How packets are spread over the live nodes.
    pub dispatch: Dispatch,
    /// The interface on the inside shared segment.
    pub inside: Option<String>,
    /// The interface on the outside shared segment.
    pub outside: Option<String>,
    /// Lease TTL: how long a silent node stays in the plan.
    pub lease_ttl: Duration,
    /// How long a node forwards on its last plan without etcd.
    pub hold: Duration,
}

impl Cluster {
    /// The etcd password, read from its file (the file is checked at
    /// load time; it is read again when the agent connects).
    pub fn etcd_password(&self) -> std::io::Result<Option<Zeroizing<String>>> {
        let Some(f) = &self.etcd_password_file else {
            return Ok(None);
        };
        let (data, _) = read_secret_bytes(f, 4096)?;
        let text = String::from_utf8(data.to_vec())
            .map_err(|_| std::io::Error::other("the password file is not UTF-8"))?;
        Ok(Some(Zeroizing::new(
            text.strip_suffix('\n').unwrap_or(&text).to_string(),
        )))
    }

    /// The table that says exactly this cluster, every key given.
    pub fn to_table(&self) -> ClusterTable {
        let text = |s: &str| Some(value(s.to_string()));
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| value(p.display().to_string()));
        let time = |d: Duration| Some(value(Scalar::Str(crate::schema::format_duration(d))));
        ClusterTable {
            name: text(&self.name),
            node: Some(value(i64::from(self.node))),
            etcd: Some(self.etcd.iter().map(|e| value(e.clone())).collect()),
            etcd_ca: path(&self.etcd_ca),
            etcd_cert: path(&self.etcd_cert),
            etcd_key: path(&self.etcd_key),
            etcd_user: self.etcd_user.as_deref().and_then(text),
            etcd_password_file: path(&self.etcd_password_file),
            key_file: path(&self.key_file),
            dispatch: text(self.dispatch.name()),
            inside: self.inside.as_deref().and_then(text),
            outside: self.outside.as_deref().and_then(text),
            lease_ttl: time(self.lease_ttl),
            hold: time(self.hold),
        }
    }
}

/// Checks `[cluster]`.
pub(crate) fn validate(v: &mut Validator, t: &Spanned<ClusterTable>) -> Option<Cluster> {
    let before = v.error_count();
    let base = At::root().key("cluster", Some(t.span()));
    let c = t.get_ref();
    let name = match &c.name {
        Some(n) => {
            let s = n.get_ref();
            let ok = !s.is_empty()
                && s.len() <= 64
                && s.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_' || ch == '.');
            if !ok {
                v.err(
                    base.key("name", Some(n.span())),
                    format!(
                        "cluster name {s:?}: expected 1-64 letters, digits, '-', '_' or '.' \
                         (it is a part of the etcd keys)"
                    ),
                );
            }
            s.clone()
        }
        None => {
            v.err(
                base.clone(),
                "[cluster] needs name = \"NAME\": the nodes of one cluster share it",
            );
            String::new()
        }
    };
    let node = match &c.node {
        Some(n) => match u16::try_from(*n.get_ref()) {
            Ok(id) if id >= 1 => id,
            _ => {
                v.err(
                    base.key("node", Some(n.span())),
                    format!(
                        "node = {}: expected 1 to 65535 (the node id is also the high 16 \
                         bits of this node's AEAD IVs, so it must be unique in the cluster)",
                        n.get_ref()
                    ),
                );
                0
            }
        },
        None => {
            v.err(
                base.clone(),
                "[cluster] needs node = N: this node's id, 1 to 65535, unique in the cluster",
            );
            0
        }
    };
    let mut etcd = Vec::new();
    match &c.etcd {
        None => etcd.push(DEFAULT_ETCD.to_string()),
        Some(list) if list.is_empty() => v.err(
            base.key("etcd", None),
            "etcd = []: give at least one endpoint, e.g. \"http://127.0.0.1:2379\"",
        ),
        Some(list) => {
            for (i, e) in list.iter().enumerate() {
                let s = e.get_ref();
                let rest = s
                    .strip_prefix("http://")
                    .or_else(|| s.strip_prefix("https://"));
                let ok = rest.is_some_and(|r| {
                    r.rsplit_once(':').is_some_and(|(h, p)| {
                        !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0)
                    })
                });
                if !ok {
                    v.err(
                        base.key("etcd", None).index(i, Some(e.span())),
                        format!(
                            "etcd endpoint {s:?}: expected http://HOST:PORT or https://HOST:PORT"
                        ),
                    );
                }
                etcd.push(s.clone());
            }
        }
    }
    let file = |v: &mut Validator, k: &str, f: &Option<Spanned<String>>| -> Option<PathBuf> {
        let f = f.as_ref()?;
        let p = v.base_dir.join(f.get_ref());
        if !p.is_file() {
            // A directory is not "no such file".
            let why = if p.is_dir() {
                "a directory, not a file"
            } else {
                "no such file"
            };
            v.err(
                base.key(k, Some(f.span())),
                format!("{k} {}: {why}", p.display()),
            );
        }
        Some(p)
    };
    let etcd_ca = file(v, "etcd_ca", &c.etcd_ca);
    let etcd_cert = file(v, "etcd_cert", &c.etcd_cert);
    let etcd_key = file(v, "etcd_key", &c.etcd_key);
    if etcd_cert.is_some() != etcd_key.is_some() {
        v.err(
            base.clone(),
            "etcd_cert and etcd_key go together (a client certificate and its key)",
        );
    }
    let tls = etcd_ca.is_some() || etcd_cert.is_some();
    if tls && etcd.iter().any(|e| e.starts_with("http://")) {
        v.err(
            base.key("etcd", None),
            "etcd_ca/etcd_cert are set but an endpoint is http://: use https:// endpoints with TLS",
        );
    }
    let etcd_password_file = file(v, "etcd_password_file", &c.etcd_password_file);
    if let (Some(p), Some(at)) = (&etcd_password_file, &c.etcd_password_file) {
        if let Ok((_, mode)) = read_secret_bytes(p, 4096) {
            if mode & 0o077 != 0 {
                v.err(
                    base.key("etcd_password_file", Some(at.span())),
                    format!(
                        "etcd_password_file {} is readable or writable by group/others \
                         (mode {mode:04o}): chmod 600 it",
                        p.display()
                    ),
                );
            }
        }
    }
    let (key_file, key) = match &c.key_file {
        None => (None, None),
        Some(f) => {
            let p = v.base_dir.join(f.get_ref());
            let key = v.check(base.key("key_file", Some(f.span())), ClusterKey::read(&p));
            (Some(p), key)
        }
    };
    let etcd_user = c.etcd_user.as_ref().map(|u| u.get_ref().clone());
    if etcd_user.is_some() != etcd_password_file.is_some() {
        v.err(
            base.clone(),
            "etcd_user and etcd_password_file go together (etcd's password authentication)",
        );
    }
    let dispatch = match &c.dispatch {
        None => Dispatch::PacketRr,
        Some(d) => match Dispatch::from_name(d.get_ref()) {
            Some(x) => x,
            None => {
                v.err(
                    base.key("dispatch", Some(d.span())),
                    format!(
                        "dispatch = {:?}: expected packet-rr, packet-sqf, session-rr or session-sqf",
                        d.get_ref()
                    ),
                );
                Dispatch::PacketRr
            }
        },
    };
    let ifname = |v: &mut Validator, k: &str, f: &Option<Spanned<String>>| -> Option<String> {
        let f = f.as_ref()?;
        if let Err(e) = crate::gateway::check_ifname(f.get_ref()) {
            v.err(base.key(k, Some(f.span())), e);
        }
        Some(f.get_ref().clone())
    };
    let inside = ifname(v, "inside", &c.inside);
    let outside = ifname(v, "outside", &c.outside);
    let dur =
        |v: &mut Validator, k: &str, s: &Option<Spanned<Scalar>>, d: Duration, lo: u64, hi: u64| {
            let Some(s) = s else { return d };
            match s.get_ref().duration() {
                Ok(Some(x)) if (lo..=hi).contains(&x.as_secs()) => x,
                Ok(_) => {
                    v.err(
                        base.key(k, Some(s.span())),
                        format!("{k} = {}: expected {lo} to {hi} seconds", s.get_ref()),
                    );
                    d
                }
                Err(e) => {
                    v.err(base.key(k, Some(s.span())), e);
                    d
                }
            }
        };
    let lease_ttl = dur(v, "lease_ttl", &c.lease_ttl, DEFAULT_LEASE_TTL, 2, 60);
    let hold = dur(v, "hold", &c.hold, DEFAULT_HOLD, 1, 3600);
    if hold < lease_ttl {
        v.warn(
            base.key("hold", span(&c.hold)),
            format!(
                "hold ({}s) is shorter than lease_ttl ({}s): a short etcd outage stops \
                 the node before a dead node would even leave the plan",
                hold.as_secs(),
                lease_ttl.as_secs()
            ),
        );
    }
    (v.error_count() == before).then_some(Cluster {
        name,
        node,
        etcd,
        etcd_ca,
        etcd_cert,
        etcd_key,
        etcd_user,
        etcd_password_file,
        key_file,
        key,
        dispatch,
        inside,
        outside,
        lease_ttl,
        hold,
    })
}

/// What a cluster node cannot run (yet, or by design), or needs for what
/// it runs, said per key.
pub(crate) fn against_the_rest(
    v: &mut Validator,
    t: &Spanned<ClusterTable>,
    g: &crate::Gateway,
    gt: Option<&Spanned<crate::schema::GatewayTable>>,
    conns: &[(usize, crate::Connection)],
    tables: &[Spanned<crate::schema::ConnectionTable>],
) {
    if g.workers != 1 {
        v.err(
            crate::gateway::at(gt).key("workers", gt.and_then(|t| span(&t.get_ref().workers))),
            format!(
                "workers = {} with [cluster]: a cluster node runs one data-plane worker, \
                 because the nodes keep each SA's sequence numbers in step by counting the \
                 same packets in the same order (docs/CLUSTER.md); scale with more nodes",
                g.workers
            ),
        );
    }
    if t.get_ref().key_file.is_none() {
        if let Some((_, c)) = conns.iter().find(|(_, c)| c.ike().is_some()) {
            v.err(
                At::root().key("cluster", Some(t.span())),
                format!(
                    "[cluster] needs key_file = \"PATH\" because connection {:?} has \
                     [connection.ike]: the leader's IKE negotiates the child SAs for every \
                     node, and their keys are stored in etcd encrypted under this cluster key \
                     (a file of 64 hex characters, mode 0600, the same on every node; \
                     `openssl rand -hex 32` makes one)",
                    c.name
                ),
            );
        }
    }
    for (i, c) in conns {
        let at = crate::connection::at(*i, &tables[*i]);
        let p = c.protocol();
        if p.has_esp() && p.has_ah() {
            v.err(
                at,
                "protocol = \"esp+ah\" with [cluster]: the lockstep counts one SA per packet; \
                 use ESP (or Q-ESP, or AH) alone",
            );
        }
        if c.per_cpu_sas > 1 {
            let t = tables[*i].get_ref();
            v.err(
                crate::connection::at(*i, &tables[*i])
                    .key("per_cpu_sas", t.per_cpu_sas.as_ref().map(|s| s.span())),
                format!(
                    "per_cpu_sas = {} with [cluster]: a cluster node runs one data-plane \
                     worker, which sends on one SA; scale with more nodes and set \
                     per_cpu_sas = 1",
                    c.per_cpu_sas
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::test_util::*;
    use espgate_core::cluster::Dispatch;
    use std::time::Duration;

    #[test]
    fn a_cluster_table_with_defaults_and_round_trip() {
        let text = format!("{}\n[cluster]\nname = \"gw\"\nnode = 2\n", minimal());
        let c = parse_str(&text).unwrap();
        let k = c.cluster.clone().unwrap();
        assert_eq!((k.name.as_str(), k.node), ("gw", 2));
        assert_eq!(k.etcd, [super::DEFAULT_ETCD]);
        assert_eq!(k.dispatch, Dispatch::PacketRr);
        assert_eq!(
            (k.lease_ttl, k.hold),
            (Duration::from_secs(3), Duration::from_secs(10))
        );
        // The effective table reads back as the same cluster.
        let again =
            parse_str(&toml::to_string(&c.effective(crate::KeyText::Hex)).unwrap()).unwrap();
        assert_eq!(again.cluster, c.cluster);
        let text = format!(
            "{}\n[cluster]\nname = \"gw\"\nnode = 7\ndispatch = \"session-sqf\"\n\
             etcd = [\"http://10.0.0.1:2379\", \"http://10.0.0.2:2379\"]\nlease_ttl = \"5s\"\n\
             hold = \"1m\"\ninside = \"eth1\"\noutside = \"eth0\"\n",
            minimal()
        );
        let k = parse_str(&text).unwrap().cluster.unwrap();
        assert_eq!((k.node, k.dispatch), (7, Dispatch::SessionSqf));
        assert_eq!(k.etcd.len(), 2);
        assert_eq!(
            (k.lease_ttl, k.hold),
            (Duration::from_secs(5), Duration::from_secs(60))
        );
        assert_eq!(
            (k.inside.as_deref(), k.outside.as_deref()),
            (Some("eth1"), Some("eth0"))
        );
    }

    #[test]
    fn bad_cluster_tables_say_why() {
        let bad = |cluster: &str, gw: &str| {
            err(&format!(
                "[gateway]\n{gw}\n{}\n[cluster]\n{cluster}\n",
                minimal()
            ))
        };
        assert_has(&bad("node = 1", ""), &["needs name"]);
        assert_has(
            &bad("name = \"a b\"\nnode = 1", ""),
            &["cluster name", "etcd keys"],
        );
        assert_has(&bad("name = \"x\"", ""), &["needs node"]);
        assert_has(&bad("name = \"x\"\nnode = 0", ""), &["node = 0", "unique"]);
        assert_has(&bad("name = \"x\"\nnode = 70000", ""), &["1 to 65535"]);
        assert_has(
            &bad("name = \"x\"\nnode = 1\ndispatch = \"random\"", ""),
            &["dispatch", "packet-rr, packet-sqf"],
        );
        assert_has(
            &bad("name = \"x\"\nnode = 1\netcd = [\"localhost\"]", ""),
            &["http://HOST:PORT"],
        );
        assert_has(
            &bad("name = \"x\"\nnode = 1\netcd = []", ""),
            &["at least one"],
        );
        assert_has(
            &bad("name = \"x\"\nnode = 1\netcd_user = \"u\"", ""),
            &["etcd_user and etcd_password_file go together"],
        );
        assert_has(
            &bad("name = \"x\"\nnode = 1\netcd_ca = \"nope.pem\"", ""),
            &["no such file"],
        );
        assert_has(
            &bad("name = \"x\"\nnode = 1\nlease_ttl = \"1s\"", ""),
            &["2 to 60 seconds"],
        );
        assert_has(
            &bad("name = \"x\"\nnode = 1", "workers = 2"),
            &["one data-plane worker"],
        );
        let per_cpu = format!(
            "{}\n[cluster]\nname = \"x\"\nnode = 1\n",
            conn("b", "per_cpu_sas = 2", &good_esp(0x1001, 0x2001))
        );
        assert_has(&err(&per_cpu), &["per_cpu_sas = 2 with [cluster]"]);
        assert_has(&bad("name = \"x\"\nnode = 1\ncolour = 3", ""), &["colour"]);
        // An esp+ah bundle: the lockstep counts one SA per packet.
        let bundle = format!(
            "{}[connection.ah]\nsuite = \"sha1\"\nspi_in = 0x3001\nspi_out = 0x3002\n\
             integ_in = \"{K20A}\"\ninteg_out = \"{K20B}\"\n\n[cluster]\nname = \"x\"\nnode = 1\n",
            minimal().replace(
                "name = \"b\"",
                "name = \"b\"\nprotocol = \"esp+ah\"\nencap = \"none\""
            )
        );
        assert_has(&err(&bundle), &["esp+ah", "one SA per packet"]);
    }

    /// A 32-byte cluster key as hex.
    const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn write_mode(dir: &Path, name: &str, data: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A temp dir with a PSK (`psk`) and a cluster key (`cluster.key`,
    /// `key` with `mode`).
    fn key_dir(key: &str, mode: u32) -> PathBuf {
        let d = temp_dir();
        write_mode(
            &d,
            "psk",
            "0x00112233445566778899aabbccddeeff0011223344556677\n",
            0o600,
        );
        write_mode(&d, "cluster.key", key, mode);
        d
    }

    /// An IKE connection and `[cluster]` with `extra`.
    fn ike_cluster(extra: &str) -> String {
        format!(
            r#"
[[connection]]
name = "ik"
local = "192.0.2.1"
remote = "198.51.100.2"
local_ts = ["10.1.0.0/16"]
remote_ts = ["10.2.0.0/16"]

[connection.ike]
psk_file = "psk"

[cluster]
name = "gw"
node = 1
{extra}
"#
        )
    }

    #[test]
    fn ike_with_a_cluster_key_loads_and_never_shows_the_key() {
        let d = key_dir(&format!("  {KEY_HEX}\n\n"), 0o600);
        let c = parse(&ike_cluster("key_file = \"cluster.key\""), &d, "t.toml")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(c.connections[0].ike().is_some());
        let k = c.cluster.as_ref().unwrap();
        assert_eq!(k.key_file.as_deref(), Some(d.join("cluster.key").as_path()));
        let key = k.key.as_ref().expect("the key is read at load");
        assert_eq!(hex::encode(key.bytes()), KEY_HEX);
        let shown = format!("{c:?}");
        assert!(!shown.contains(&KEY_HEX[..16]), "{shown}");
        assert!(shown.contains("ClusterKey(not shown)"), "{shown}");
        let eff = c.effective_toml();
        assert!(
            eff.contains("key_file") && !eff.contains(&KEY_HEX[..16]),
            "{eff}"
        );
        // The effective table names the file, so it reads back the same.
        let again = parse(&eff, &d, "again.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again.cluster, c.cluster);
        // Without IKE the key is optional, and read when given.
        let text = format!(
            "{}\n[cluster]\nname = \"gw\"\nnode = 2\nkey_file = \"cluster.key\"\n",
            minimal()
        );
        let k = parse(&text, &d, "t.toml").unwrap().cluster.unwrap();
        assert!(k.key.is_some());
        assert!(parse_str(&format!(
            "{}\n[cluster]\nname = \"gw\"\nnode = 2\n",
            minimal()
        ))
        .unwrap()
        .cluster
        .unwrap()
        .key
        .is_none());
    }

    #[test]
    fn ike_without_a_cluster_key_is_refused_saying_why() {
        let d = key_dir(KEY_HEX, 0o600);
        let e = parse(&ike_cluster(""), &d, "t.toml")
            .unwrap_err()
            .to_string();
        assert_has(
            &e,
            &[
                "needs key_file",
                "\"ik\"",
                "[connection.ike]",
                "etcd encrypted",
            ],
        );
        assert!(!e.contains("not built yet"), "{e}");
    }

    #[test]
    fn bad_cluster_key_files_are_refused_with_the_path_and_why() {
        let refused = |key: &str, mode: u32, file: &str| {
            let d = key_dir(key, mode);
            let e = parse(
                &ike_cluster(&format!("key_file = \"{file}\"")),
                &d,
                "t.toml",
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(&d.join(file).display().to_string()), "{e}");
            assert!(e.contains("key_file"), "{e}");
            assert!(!e.contains(&KEY_HEX[..16]), "the error shows the key: {e}");
            e
        };
        assert_has(&refused(KEY_HEX, 0o600, "missing.key"), &["cannot read"]);
        assert_has(
            &refused(&KEY_HEX[..62], 0o600, "cluster.key"),
            &["62 characters", "expected 64 hex characters"],
        );
        assert_has(
            &refused(&format!("{KEY_HEX}00"), 0o600, "cluster.key"),
            &["66 characters"],
        );
        let not_hex = format!("{}zz", &KEY_HEX[..62]);
        assert_has(&refused(&not_hex, 0o600, "cluster.key"), &["not hex"]);
        assert_has(
            &refused(KEY_HEX, 0o640, "cluster.key"),
            &["group/others", "mode 0640", "chmod 600"],
        );
        assert_has(&refused(KEY_HEX, 0o604, "cluster.key"), &["mode 0604"]);
        // A directory is not a key file.
        let d = key_dir(KEY_HEX, 0o600);
        std::fs::create_dir(d.join("dir.key")).unwrap();
        let e = parse(&ike_cluster("key_file = \"dir.key\""), &d, "t.toml")
            .unwrap_err()
            .to_string();
        assert_has(&e, &["key_file", "is a directory"]);
    }
}
