//! The bad-configuration corpus (issue 16, "Bad input everywhere a user
//! can reach").
//!
//! Two valid, complete configurations (every key of `docs/CONFIG.md`
//! written out at least once: `[gateway]`, manually keyed ESP, AH, ESP+AH
//! and Q-ESP connections with inline keys and key files, IKE connections
//! with a PSK, certificates and raw public keys, and a `[cluster]` table)
//! are taken apart line by line, and from every key this file generates
//! malformed variants:
//!
//! - (a) the value replaced by one of every other TOML type;
//! - (b) out-of-range or unknown values (the [`BAD_VALUES`] table);
//! - (c) the key removed;
//! - (d) an unknown key added to each table;
//! - (e) the files the configuration names missing, a directory,
//!   unreadable, empty, too open (0644 where 0600 is required), too large,
//!   or holding the wrong material;
//! - (f) a connection name, a key, a table header or an SPI given twice;
//! - (g) a TOML syntax error on a key's line.
//!
//! Each variant is written to a file and read with
//! [`espgate_config::load`], the function `espgate up` and `espgate config
//! check` call, inside [`catch_unwind`]. It must not panic, and it must be
//! refused with a message that names the file, a line at the offending key
//! (the table header for a removed key) and the key, unless it is on one
//! of the allow-lists below, each entry with its reason.
//!
//! `cargo test -p espgate-config --test bad_configs -- --nocapture`
//! prints the number of variants per class.

use espgate_config::{load, ConfigError};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::ops::RangeInclusive;
use std::os::unix::fs::PermissionsExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

// ---------------------------------------------------------------------------
// The valid configurations the corpus is made from.

/// `len` bytes of key material as hex, different for each `seed`.
fn hex_key(len: usize, seed: u8) -> String {
    (0..len)
        .map(|i| format!("{:02x}", (i as u8).wrapping_mul(7).wrapping_add(seed)))
        .collect()
}

/// Manual keying: every `[gateway]` key, ESP over UDP from key files with
/// per-CPU SAs and an inline lifetime, ESP+AH with inline keys and a
/// `[connection.lifetime]` table, AH alone in transport mode, Q-ESP, and
/// IPv6 outer addresses.
fn manual_base() -> String {
    include_str!("fixtures/manual-base.toml").to_string()
}

/// IKE keying on a cluster node: every `[connection.ike]` key with a PSK,
/// X.509 certificates, raw public keys, Q-ESP negotiated, and every
/// `[cluster]` key.
fn ike_base() -> String {
    include_str!("fixtures/ike-base.toml").to_string()
}

/// The example key and certificate files the IKE base uses.
fn examples_keys() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/keys")
}

/// Makes the corpus directory: the key files of both bases, mode 0600.
fn make_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("espgate-bad-configs-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("keys")).unwrap();
    let ex = examples_keys();
    let copy = |from: &str, to: &str| fs::copy(ex.join(from), dir.join("keys").join(to)).unwrap();
    copy("moon.key", "moon.key");
    copy("moon.crt", "moon.crt");
    copy("ca.crt", "ca.crt");
    copy("moon-ed25519.key", "moon-ed25519.key");
    copy("venus-ed25519.pub", "venus-ed25519.pub");
    copy("ca.crt", "etcd-ca.crt");
    copy("sun.crt", "etcd.crt");
    copy("sun.key", "etcd.key");
    let write = |name: &str, text: String| {
        fs::write(dir.join("keys").join(name), text).unwrap();
    };
    write("b.enc_in", hex_key(36, 11) + "\n");
    write("b.enc_out", hex_key(36, 12) + "\n");
    write("m.integ_in", hex_key(64, 13) + "\n");
    write("m.integ_out", hex_key(64, 14) + "\n");
    write(
        "site.psk",
        "a pre-shared key of forty-odd characters\n".into(),
    );
    write("etcd.password", "secret\n".into());
    write("cluster.key", hex_key(32, 15) + "\n");
    for e in fs::read_dir(dir.join("keys")).unwrap() {
        let p = e.unwrap().path();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    }
    dir
}

// ---------------------------------------------------------------------------
// The configurations, line by line.

/// One `key = value` line of a base.
#[derive(Debug, Clone)]
struct Entry {
    /// 1-based line.
    line: usize,
    /// The table's path in diagnostics' words: `connection[1].esp`.
    table: String,
    /// The table's kind: `connection.esp` (`""` for the root).
    kind: String,
    /// Line of the table's header (1 for the root).
    header: usize,
    key: String,
    value: toml::Value,
}

/// One table header of a base.
#[derive(Debug, Clone)]
struct Header {
    line: usize,
    table: String,
    kind: String,
    /// `[[...]]`.
    array: bool,
    /// Last line of the table (before the next header, or the file's end).
    end: usize,
}

/// The key lines and headers of a base.
fn entries(text: &str) -> (Vec<Entry>, Vec<Header>) {
    let mut out = Vec::new();
    let mut headers: Vec<Header> = Vec::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let (mut table, mut kind, mut header) = (String::new(), String::new(), 1);
    let n = text.lines().count();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|s| s.strip_suffix("]]")) {
            let c = counts.entry(name.to_string()).or_default();
            table = format!("{name}[{c}]");
            *c += 1;
            kind = name.to_string();
        } else if let Some(name) = t.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            // `[connection.esp]` belongs to the last `[[connection]]`.
            let (first, rest) = name.split_once('.').unwrap_or((name, ""));
            table = match counts.get(first) {
                Some(c) => format!("{first}[{}]", c - 1),
                None => first.to_string(),
            };
            if !rest.is_empty() {
                table = format!("{table}.{rest}");
            }
            kind = name.to_string();
        } else {
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            let parsed: toml::Table =
                toml::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            let (key, value) = parsed.into_iter().next().unwrap();
            out.push(Entry {
                line: i + 1,
                table: table.clone(),
                kind: kind.clone(),
                header,
                key,
                value,
            });
            continue;
        }
        header = i + 1;
        if let Some(h) = headers.last_mut() {
            h.end = i;
        }
        headers.push(Header {
            line: i + 1,
            table: table.clone(),
            kind: kind.clone(),
            array: t.starts_with("[["),
            end: n,
        });
    }
    (out, headers)
}

/// `text` with line `line` (1-based) replaced.
fn replace_line(text: &str, line: usize, new: &str) -> String {
    edit_lines(text, |lines| lines[line - 1] = new.to_string())
}

/// `text` without line `line`.
fn remove_line(text: &str, line: usize) -> String {
    edit_lines(text, |lines| {
        lines.remove(line - 1);
    })
}

/// `text` with `new` inserted as line `line` (1-based; the old line
/// `line` follows it).
fn insert_line(text: &str, line: usize, new: &str) -> String {
    edit_lines(text, |lines| lines.insert(line - 1, new.to_string()))
}

fn edit_lines(text: &str, f: impl FnOnce(&mut Vec<String>)) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    f(&mut lines);
    lines.join("\n") + "\n"
}

// ---------------------------------------------------------------------------
// What is expected of each key.

/// The TOML type names, as the tags of class (a) say them.
fn type_name(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "string",
        toml::Value::Integer(_) => "integer",
        toml::Value::Float(_) => "float",
        toml::Value::Boolean(_) => "boolean",
        toml::Value::Datetime(_) => "datetime",
        toml::Value::Array(_) => "array",
        toml::Value::Table(_) => "table",
    }
}

/// A value of each TOML type, for class (a).
const OTHER_TYPES: &[(&str, &str)] = &[
    ("string", "\"wrong-type\""),
    ("integer", "7"),
    ("float", "1.5"),
    ("boolean", "true"),
    ("datetime", "1979-05-27T07:32:00Z"),
    ("array", "[\"wrong-type\"]"),
    ("table", "{ wrong = \"type\" }"),
];

/// Keys that take an integer or a string by design (`docs/CONFIG.md`,
/// *Value syntax*): a duration in seconds or a string such as `"1h"`, a
/// size, an SPI, a protocol number or name, an MSS or a word. For them
/// an integer in place of a string is a value, not a wrong type: the
/// variant is run, must not panic, and may be accepted (`7` seconds is a
/// duration) or refused by a range check, wherever it is reported. (A
/// string in place of their integer is `"wrong-type"`, refused as usual.)
const EITHER_INT_OR_STRING: &[(&str, &str, &str)] = &[
    ("connection", "proto", "a protocol name or number"),
    ("connection", "mss_clamp", "\"auto\", \"off\" or an MSS"),
    (
        "connection.esp",
        "spi_in",
        "an SPI is an integer or a string",
    ),
    (
        "connection.esp",
        "spi_out",
        "an SPI is an integer or a string",
    ),
    (
        "connection.ah",
        "spi_in",
        "an SPI is an integer or a string",
    ),
    (
        "connection.ah",
        "spi_out",
        "an SPI is an integer or a string",
    ),
    ("connection.lifetime", "soft_bytes", "a size"),
    ("connection.lifetime", "hard_bytes", "a size"),
    ("connection.lifetime", "soft_packets", "a size"),
    ("connection.lifetime", "hard_packets", "a size"),
    ("connection.lifetime", "soft_time", "a duration"),
    ("connection.lifetime", "hard_time", "a duration"),
    ("connection.ike", "rekey_time", "a duration"),
    ("connection.ike", "child_rekey_time", "a duration"),
    ("connection.ike", "child_life_time", "a duration"),
    ("connection.ike", "jitter", "a duration"),
    ("connection.ike", "dpd_delay", "a duration"),
    ("connection.ike", "retransmit_timeout", "a duration"),
    ("connection.ike", "retransmit_limit", "a duration"),
    ("cluster", "lease_ttl", "a duration"),
    ("cluster", "hold", "a duration"),
];

/// Out-of-range and unknown values per key, for class (b), as TOML.
/// Each must be refused at the key's line, naming the key (or, when
/// listed in [`REPORTED_AT`], at the related key that names the conflict).
const BAD_VALUES: &[(&str, &str, &[&str])] = &[
    // [gateway]
    (
        "gateway",
        "tun",
        &[
            "\"\"",
            "\"a-name-of-16-chr\"",
            "\"bad/name\"",
            "\"..\"",
            "\"tun 0\"",
        ],
    ),
    (
        "gateway",
        "tun_address",
        &[
            "[\"10.1.0.1/33\"]",
            "[\"2001:db8::1/129\"]",
            "[\"not-an-address\"]",
            "[\"10.1.0.1/-1\"]",
            "[\"10.1.0.256\"]",
        ],
    ),
    (
        "gateway",
        "listen",
        &[
            "\"0.0.0.0\"",
            "\"0.0.0.0:65536\"",
            "\"0.0.0.0:-1\"",
            "\"localhost:4500\"",
            "\"[::1]\"",
        ],
    ),
    ("gateway", "encap", &["\"tcp\"", "\"UDP\"", "\"\""]),
    ("gateway", "workers", &["-1", "1025", "9223372036854775807"]),
    ("gateway", "batch", &["0", "65", "-1"]),
    ("gateway", "ike_fragment_size", &["299", "65001", "0"]),
    ("gateway", "socket_buffer", &["4095", "1073741825", "-1"]),
    ("gateway", "ike_cookie_threshold", &["1000001", "-1"]),
    ("gateway", "ike_half_open_limit", &["0", "1000001", "-1"]),
    (
        "gateway",
        "qesp_protocol",
        &["0", "50", "51", "255", "256", "-1"],
    ),
    ("gateway", "mtu", &["575", "65536", "0", "-1", "1279"]),
    ("gateway", "control_socket", &[LONG_PATH]),
    (
        "gateway",
        "metrics",
        &[
            "\"127.0.0.1\"",
            "\"127.0.0.1:65536\"",
            "\"localhost:9184\"",
            "\"\"",
        ],
    ),
    ("gateway", "log", &["\"loud\"", "\"INFO\""]),
    (
        "gateway",
        "fwmark",
        &[
            "0",
            "252",
            "255",
            "4294967296",
            "-1",
            "99999999999999999999",
        ],
    ),
    ("gateway", "state_dir", &["\"\"", "\"keys/site.psk\""]),
    // [[connection]]
    (
        "connection",
        "name",
        &["\"\"", "\"with space\"", "\"ünï\"", LONG_NAME],
    ),
    (
        "connection",
        "local",
        &[
            "\"192.0.2.1/32\"",
            "\"not-an-address\"",
            "\"0.0.0.0\"",
            "\"224.0.0.1\"",
            "\"255.255.255.255\"",
            "\"192.0.2.1:500\"",
        ],
    ),
    (
        "connection",
        "remote",
        &[
            "\"198.51.100.2/32\"",
            "\"not-an-address\"",
            "\"::\"",
            "\"ff02::1\"",
            "\"192.0.2.1\"",
            "\"2001:db8::99\"",
        ],
    ),
    ("connection", "remote_port", &["0", "65536", "-1"]),
    ("connection", "mode", &["\"tunel\"", "\"TUNNEL\""]),
    (
        "connection",
        "protocol",
        &["\"gre\"", "\"ESP\"", "\"ah+esp\""],
    ),
    ("connection", "encap", &["\"tcp\"", "\"\""]),
    (
        "connection",
        "local_ts",
        &[
            "[\"10.1.0.0/33\"]",
            "[\"2001:db8::/129\"]",
            "[\"nonsense\"]",
            "[\"10.1.0.0/-1\"]",
            "[]",
        ],
    ),
    (
        "connection",
        "remote_ts",
        &[
            "[\"10.2.0.0/33\"]",
            "[\"2001:db8::/200\"]",
            "[\"10.2.0.0/16/8\"]",
            "[]",
        ],
    ),
    (
        "connection",
        "proto",
        &["\"gre\"", "0", "256", "-1", "\"300\""],
    ),
    (
        "connection",
        "mss_clamp",
        &["87", "65496", "-1", "\"big\"", "0"],
    ),
    ("connection", "dscp", &["\"keep\"", "\"COPY\""]),
    ("connection", "ecn", &["\"compat\"", "\"\""]),
    (
        "connection",
        "replay_window",
        &["-1", "65537", "9223372036854775807"],
    ),
    ("connection", "nat_keepalive", &["-1", "3601"]),
    ("connection", "tfc_pad_to", &["-1", "65536"]),
    ("connection", "per_cpu_sas", &["0", "65", "-1"]),
    (
        "connection",
        "lifetime",
        &[
            "{ soft_bytes = -1 }",
            "{ soft_bytes = \"12X\" }",
            "{ hard_bytes = \"99999999999T\" }",
            "{ soft_packets = \"\" }",
            "{ soft_time = \"1y\" }",
            "{ soft_time = -5 }",
            "{ hard_time = \"99999999999999999999s\" }",
            "{ soft_time = \"2h\", hard_time = \"1h\" }",
        ],
    ),
    // [connection.lifetime]
    (
        "connection.lifetime",
        "soft_bytes",
        &["-1", "\"12X\"", "\"4T\""],
    ),
    (
        "connection.lifetime",
        "hard_bytes",
        &["-1", "\"99999999999T\"", "\"\""],
    ),
    (
        "connection.lifetime",
        "soft_packets",
        &["-1", "\"1 million\"", "\"2M\""],
    ),
    (
        "connection.lifetime",
        "hard_packets",
        &["-1", "\"99999999999999T\""],
    ),
    (
        "connection.lifetime",
        "soft_time",
        &["-1", "\"1y\"", "\"3h\"", "\"h\""],
    ),
    (
        "connection.lifetime",
        "hard_time",
        &["-1", "\"99999999999999999999s\"", "\"1 hour\""],
    ),
    // [connection.esp] and [connection.ah]
    (
        "connection.esp",
        "suite",
        &[
            "\"aes999gcm16\"",
            "\"\"",
            "\"sha256\"",
            "\"des-md5\"",
            "\"aes128gcm16-sha256\"",
        ],
    ),
    (
        "connection.esp",
        "spi_in",
        &["0", "255", "-1", "4294967296", "\"0xzz\"", "\"nope\""],
    ),
    (
        "connection.esp",
        "spi_out",
        &["0", "1", "4294967296", "\"\""],
    ),
    (
        "connection.esp",
        "enc_in",
        &["\"00\"", ZZ_HEX, "\"abc\"", "\"\""],
    ),
    ("connection.esp", "enc_out", &["\"00\"", ZZ_HEX, "\"abc\""]),
    ("connection.esp", "integ_in", &["\"00\"", ZZ_HEX, "\"abc\""]),
    ("connection.esp", "integ_out", &["\"00\"", ZZ_HEX]),
    (
        "connection.ah",
        "suite",
        &["\"aes128gcm16\"", "\"md5\"", "\"sha3\""],
    ),
    (
        "connection.ah",
        "spi_in",
        &["0", "255", "4294967296", "\"nope\""],
    ),
    ("connection.ah", "spi_out", &["0", "-1"]),
    ("connection.ah", "integ_in", &["\"00\"", ZZ_HEX, "\"abc\""]),
    ("connection.ah", "integ_out", &["\"00\"", ZZ_HEX]),
    // [connection.ike]
    (
        "connection.ike",
        "proposals",
        &[
            "[\"aes999-sha256-x25519\"]",
            "[]",
            "[\"aes128gcm16-prfsha256\"]",
            "[\"\"]",
            "[\"aes128-sha256-modp1\"]",
        ],
    ),
    (
        "connection.ike",
        "esp_proposals",
        &["[\"bogus\"]", "[]", "[\"aes128gcm16-modp9\"]", "[\"\"]"],
    ),
    (
        "connection.ike",
        "local_id",
        &["\"%any\"", "\"\"", "\"@#zz\""],
    ),
    ("connection.ike", "remote_id", &["\"\"", "\"@#zz\""]),
    ("connection.ike", "auth", &["\"password\"", "\"PSK\""]),
    ("connection.ike", "remote_auth", &["\"eap\"", "\"\""]),
    ("connection.ike", "start_action", &["\"later\"", "\"trap\""]),
    (
        "connection.ike",
        "rekey_time",
        &[
            "\"1y\"",
            "\"400d\"",
            "-5",
            "\"99999999999999999999s\"",
            "\"\"",
        ],
    ),
    (
        "connection.ike",
        "child_rekey_time",
        &["\"400d\"", "\"2h\"", "\"abc\""],
    ),
    (
        "connection.ike",
        "child_life_time",
        &["\"1s\"", "\"1h\"", "\"366d\"", "\"-1h\""],
    ),
    ("connection.ike", "jitter", &["\"1h\"", "\"30m\"", "\"x\""]),
    (
        "connection.ike",
        "dpd_delay",
        &["\"abc\"", "\"366d\"", "-1"],
    ),
    ("connection.ike", "dpd_action", &["\"hold\"", "\"none\""]),
    (
        "connection.ike",
        "retransmit_timeout",
        &["0", "\"2h\"", "\"0s\""],
    ),
    ("connection.ike", "retransmit_tries", &["-1", "21"]),
    (
        "connection.ike",
        "retransmit_limit",
        &["\"2h\"", "\"never\"", "-1"],
    ),
    ("connection.ike", "qesp", &["\"always\"", "\"on\""]),
    // [cluster]
    ("cluster", "name", &["\"\"", "\"bad name!\"", LONG_NAME]),
    ("cluster", "node", &["0", "65536", "-1"]),
    (
        "cluster",
        "etcd",
        &[
            "[]",
            "[\"ftp://10.0.0.1:2379\"]",
            "[\"https://10.0.0.1\"]",
            "[\"https://:2379\"]",
            "[\"https://10.0.0.1:0\"]",
            "[\"http://10.0.0.1:2379\"]",
        ],
    ),
    ("cluster", "dispatch", &["\"random\"", "\"packet_rr\""]),
    (
        "cluster",
        "inside",
        &["\"\"", "\"a-name-of-16-chr\"", "\"eth 1\""],
    ),
    ("cluster", "outside", &["\"\"", "\"eth/0\""]),
    ("cluster", "lease_ttl", &["1", "61", "\"abc\"", "0"]),
    ("cluster", "hold", &["0", "3601", "\"1y\""]),
];

/// A control socket path longer than a Unix socket path may be.
const LONG_PATH: &str = "\"/run/espgate/a-rather-long-directory-name-for-a-control-socket/and-another-long-one-below-it/and-a-third/espgate.sock\"";
/// 65 characters: one more than a name may have.
const LONG_NAME: &str = "\"n2345678901234567890123456789012345678901234567890123456789012345\"";
/// Not hex.
const ZZ_HEX: &str = "\"zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz\"";

/// Keys without a range: booleans and free text. A wrong type is all
/// that can be wrong with them (class (a)); the conflicts of some booleans
/// with other keys are in [`CONFLICTS`].
const NO_RANGE: &[(&str, &str, &str)] = &[
    ("gateway", "offloads", "a boolean"),
    ("gateway", "cost_accounting", "a boolean"),
    ("connection", "routes", "a boolean"),
    ("connection", "fragment_inner", "a boolean (conflict below)"),
    ("connection", "esn", "a boolean"),
    ("connection", "allow_insecure", "a boolean"),
    (
        "connection.ike",
        "force_encap",
        "a boolean (conflict below)",
    ),
    ("connection.ike", "mobike", "a boolean"),
    ("cluster", "etcd_user", "any user name etcd knows"),
];

/// Keys that name files: class (e) tries their contents and modes.
const FILE_KEYS: &[(&str, &str, FileKind)] = &[
    ("connection.esp", "enc_in_file", FileKind::Hex),
    ("connection.esp", "enc_out_file", FileKind::Hex),
    ("connection.esp", "integ_in_file", FileKind::Hex),
    ("connection.esp", "integ_out_file", FileKind::Hex),
    ("connection.ah", "integ_in_file", FileKind::Hex),
    ("connection.ah", "integ_out_file", FileKind::Hex),
    ("connection.ike", "psk_file", FileKind::Psk),
    ("connection.ike", "private_key", FileKind::PrivateKey),
    ("connection.ike", "cert", FileKind::Cert),
    ("connection.ike", "ca", FileKind::Ca),
    ("connection.ike", "remote_public_key", FileKind::PublicKey),
    ("cluster", "key_file", FileKind::ClusterKey),
    ("cluster", "etcd_password_file", FileKind::Password),
    ("cluster", "etcd_ca", FileKind::EtcdTls),
    ("cluster", "etcd_cert", FileKind::EtcdTls),
    ("cluster", "etcd_key", FileKind::EtcdTls),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileKind {
    /// Hex key material, mode 0600 advised (a warning otherwise).
    Hex,
    /// A PSK, mode 0600 required.
    Psk,
    /// A PEM private key, mode 0600 advised.
    PrivateKey,
    /// Our PEM certificate chain (must hold the private key's public key).
    Cert,
    /// PEM CA certificates.
    Ca,
    /// A PEM public key.
    PublicKey,
    /// The cluster key, 64 hex characters, mode 0600 required.
    ClusterKey,
    /// etcd's password, mode 0600 required.
    Password,
    /// etcd's TLS files: the agent reads them when it connects.
    EtcdTls,
}

/// Keys that must be there (in these bases: the suite's keys, the auth
/// methods' files, the cluster key with IKE connections, tunnel-mode
/// selectors): removing one must be refused at its table's header (or
/// between it and the key's old line), naming the key.
const REQUIRED: &[(&str, &str)] = &[
    ("connection", "name"),
    ("connection", "local"),
    ("connection", "remote"),
    ("connection.esp", "suite"),
    ("connection.esp", "spi_in"),
    ("connection.esp", "spi_out"),
    ("connection.esp", "enc_in"),
    ("connection.esp", "enc_out"),
    ("connection.esp", "integ_in"),
    ("connection.esp", "integ_out"),
    ("connection.esp", "enc_in_file"),
    ("connection.esp", "enc_out_file"),
    ("connection.ah", "suite"),
    ("connection.ah", "spi_in"),
    ("connection.ah", "spi_out"),
    ("connection.ah", "integ_in"),
    ("connection.ah", "integ_out"),
    ("connection.ah", "integ_in_file"),
    ("connection.ah", "integ_out_file"),
    ("connection.ike", "psk_file"),
    ("connection.ike", "private_key"),
    ("connection.ike", "ca"),
    ("connection.ike", "remote_public_key"),
    ("cluster", "name"),
    ("cluster", "node"),
    ("cluster", "key_file"),
];

/// Required only where the connection's other keys make them so: a
/// tunnel needs selectors (a transport connection defaults them).
const REQUIRED_IN_TUNNEL: &[&str] = &["local_ts", "remote_ts"];

/// Optional keys whose removal these bases refuse, because another key
/// they hold depends on the value given: the refusal is reported where
/// the conflict shows (often the other key, or the table's header) and
/// names it. (base, table, key, reason)
const DEPENDENT_REMOVALS: &[(&str, &str, &str, &str)] = &[
    (
        "manual.toml",
        "gateway",
        "listen",
        "connection v6 sends ESP-in-UDP over IPv6; the default 0.0.0.0:4500 is IPv4 only",
    ),
    (
        "manual.toml",
        "connection[1]",
        "protocol",
        "lab has [connection.ah], which the default protocol \"esp\" does not use",
    ),
    (
        "manual.toml",
        "connection[1]",
        "encap",
        "ESP+AH needs encap = \"none\"; the default is gateway.encap = \"udp\"",
    ),
    (
        "manual.toml",
        "connection[2]",
        "mode",
        "the default tunnel mode needs local_ts and remote_ts, which transport mode defaults",
    ),
    (
        "manual.toml",
        "connection[2]",
        "protocol",
        "mgmt has [connection.ah] and no [connection.esp]",
    ),
    (
        "manual.toml",
        "connection[2]",
        "encap",
        "AH needs encap = \"none\"; the default is gateway.encap = \"udp\"",
    ),
    (
        "manual.toml",
        "connection[3]",
        "encap",
        "Q-ESP needs encap = \"none\"; the default is gateway.encap = \"udp\"",
    ),
    (
        "manual.toml",
        "connection[4]",
        "mode",
        "the default tunnel mode needs local_ts and remote_ts, which transport mode defaults",
    ),
    (
        "ike.toml",
        "connection[1].ike",
        "auth",
        "the default auth = \"psk\" needs a psk_file and refuses private_key and cert",
    ),
    (
        "ike.toml",
        "connection[2].ike",
        "auth",
        "the default auth = \"psk\" needs a psk_file and refuses private_key",
    ),
    (
        "ike.toml",
        "connection[3]",
        "encap",
        "qesp = \"prefer\" needs encap = \"none\"; the default is gateway.encap = \"udp\"",
    ),
    (
        "ike.toml",
        "cluster",
        "etcd",
        "the default endpoint is http://, and etcd_ca and etcd_cert need https://",
    ),
    (
        "ike.toml",
        "cluster",
        "etcd_cert",
        "etcd_cert and etcd_key go together",
    ),
    (
        "ike.toml",
        "cluster",
        "etcd_key",
        "etcd_cert and etcd_key go together",
    ),
    (
        "ike.toml",
        "cluster",
        "etcd_user",
        "etcd_user and etcd_password_file go together",
    ),
    (
        "ike.toml",
        "cluster",
        "etcd_password_file",
        "etcd_user and etcd_password_file go together",
    ),
];

/// Class (b) values refused at another key than the one changed: checks
/// of a pair of keys, reported at one of them with both named. (kind,
/// key, value, the key the error is at, reason)
const REPORTED_AT: &[(&str, &str, &str, &str, &str)] = &[(
    "connection.ike",
    "child_rekey_time",
    "\"2h\"",
    "child_life_time",
    "child_life_time must be above child_rekey_time: checked at the lifetime, naming both",
)];

/// Class (b) values that one table of a base legitimately takes. (base,
/// table, key, value, reason)
const VALID_HERE: &[(&str, &str, &str, &str, &str)] = &[(
    "manual.toml",
    "connection[4]",
    "remote",
    "\"2001:db8::99\"",
    "connection v6 has IPv6 outer addresses: an IPv6 remote is of the same family",
)];

/// Class (b) extras: a valid key and value added to a table whose other
/// keys rule it out; refused at the added line, naming the key. (base,
/// table, key, value)
const CONFLICTS: &[(&str, &str, &str, &str)] = &[
    // Raw ESP/AH is never fragmented by the kernel.
    ("manual.toml", "connection[1]", "fragment_inner", "false"),
    // TFC padding is for tunnel-mode ESP; mgmt is transport-mode AH.
    ("manual.toml", "connection[2]", "tfc_pad_to", "100"),
    // Q-ESP requires anti-replay.
    ("manual.toml", "connection[3]", "replay_window", "0"),
    // Per-CPU SAs need ESP over UDP.
    ("manual.toml", "connection[1]", "per_cpu_sas", "2"),
    // Per-CPU SAs are manually keyed.
    ("ike.toml", "connection[0]", "per_cpu_sas", "2"),
    // IKE negotiates ESP, not AH.
    ("ike.toml", "connection[0]", "protocol", "\"esp+ah\""),
    // force_encap needs UDP; q-peer has encap = "none".
    ("ike.toml", "connection[3].ike", "force_encap", "true"),
    // Q-ESP over UDP.
    ("ike.toml", "connection[1].ike", "qesp", "\"require\""),
    // An AH table on an ESP connection.
    (
        "manual.toml",
        "connection[0]",
        "ah",
        "{ suite = \"sha256\", spi_in = 0x7001, spi_out = 0x7002 }",
    ),
    // Manual ESP keys and IKE on one connection.
    (
        "ike.toml",
        "connection[1]",
        "esp",
        "{ suite = \"aes128gcm16\", spi_in = 0x7001, spi_out = 0x7002 }",
    ),
];

// ---------------------------------------------------------------------------
// Variants.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    WrongType,
    OutOfRange,
    Removed,
    UnknownKey,
    Files,
    Duplicates,
    Syntax,
}

impl Class {
    const ALL: [Class; 7] = [
        Class::WrongType,
        Class::OutOfRange,
        Class::Removed,
        Class::UnknownKey,
        Class::Files,
        Class::Duplicates,
        Class::Syntax,
    ];

    fn title(self) -> &'static str {
        match self {
            Class::WrongType => "(a) wrong TOML type",
            Class::OutOfRange => "(b) out of range / unknown word",
            Class::Removed => "(c) key removed",
            Class::UnknownKey => "(d) unknown key or table",
            Class::Files => "(e) referenced files",
            Class::Duplicates => "(f) duplicates",
            Class::Syntax => "(g) TOML syntax on a key's line",
        }
    }
}

/// What a variant must do.
#[derive(Debug, Clone)]
enum Expect {
    /// Refused, with a diagnostic on one of `lines` whose text names `key`.
    Refuse {
        lines: RangeInclusive<usize>,
        key: String,
    },
    /// Loaded, by design (`reason`); with a warning holding `warning`
    /// when given.
    Accept {
        reason: String,
        warning: Option<&'static str>,
    },
    /// Refused (`reason`), at whatever key the conflict shows.
    RefuseSomewhere { reason: String },
    /// Either loaded or refused (`reason`): only no panic and well-placed
    /// diagnostics are checked.
    Either { reason: String },
}

/// A file a variant needs next to the configuration.
#[derive(Debug, Clone)]
struct ExtraFile {
    /// Relative to the corpus directory.
    rel: String,
    contents: Vec<u8>,
    mode: u32,
}

#[derive(Debug, Clone)]
struct Variant {
    class: Class,
    label: String,
    text: String,
    extra: Option<ExtraFile>,
    expect: Expect,
}

fn listed<'a, T>(list: &'a [(&str, &str, T)], kind: &str, key: &str) -> Option<&'a T> {
    list.iter()
        .find(|(k, n, _)| *k == kind && *n == key)
        .map(|(_, _, t)| t)
}

/// The line of key `key` in table `table`, or the table's header.
fn line_of(entries: &[Entry], table: &str, key: &str, header: usize) -> usize {
    entries
        .iter()
        .find(|e| e.table == table && e.key == key)
        .map_or(header, |e| e.line)
}

/// Every variant of one base.
fn variants(dir: &Path, base_name: &str, text: &str) -> Vec<Variant> {
    let (entries, headers) = entries(text);
    let mut out = Vec::new();
    let label =
        |e: &Entry, what: &str| format!("{base_name}:{}: {}.{} {what}", e.line, e.table, e.key);
    let refuse_here = |e: &Entry| Expect::Refuse {
        lines: e.line..=e.line,
        key: e.key.clone(),
    };

    for e in &entries {
        // (a) every other TOML type.
        let own = type_name(&e.value);
        for (ty, lit) in OTHER_TYPES {
            if *ty == own {
                continue;
            }
            // "wrong-type" for an integer is refused everywhere; 7 for a
            // string may be a value.
            let either = listed(EITHER_INT_OR_STRING, &e.kind, &e.key)
                .filter(|_| (own, *ty) == ("string", "integer"));
            out.push(Variant {
                class: Class::WrongType,
                label: label(e, &format!("= {lit} ({ty} for {own})")),
                text: replace_line(text, e.line, &format!("{} = {lit}", e.key)),
                extra: None,
                expect: match either {
                    Some(why) => Expect::Either {
                        reason: format!("takes an integer or a string: {why}"),
                    },
                    None => refuse_here(e),
                },
            });
        }
        // An array of the wrong element type.
        if own == "array" {
            out.push(Variant {
                class: Class::WrongType,
                label: label(e, "= [7] (integer items)"),
                text: replace_line(text, e.line, &format!("{} = [7]", e.key)),
                extra: None,
                expect: refuse_here(e),
            });
        }

        // (b) values out of range.
        for lit in listed(BAD_VALUES, &e.kind, &e.key).copied().unwrap_or(&[]) {
            let valid = VALID_HERE.iter().find(|(b, t, n, v, _)| {
                *b == base_name && *t == e.table && *n == e.key && v == lit
            });
            let expect = match REPORTED_AT
                .iter()
                .find(|(k, n, v, _, _)| *k == e.kind && *n == e.key && v == lit)
            {
                _ if valid.is_some() => Expect::Accept {
                    reason: valid.unwrap().4.to_string(),
                    warning: None,
                },
                Some((_, _, _, at, _)) => Expect::Refuse {
                    lines: {
                        let l = line_of(&entries, &e.table, at, e.header);
                        l..=l
                    },
                    key: at.to_string(),
                },
                None => refuse_here(e),
            };
            out.push(Variant {
                class: Class::OutOfRange,
                label: label(e, &format!("= {lit}")),
                text: replace_line(text, e.line, &format!("{} = {lit}", e.key)),
                extra: None,
                expect,
            });
        }
        // (c) the key removed.
        let tunnel = !entries.iter().any(|x| {
            x.table == e.table && x.key == "mode" && x.value.as_str() == Some("transport")
        });
        let required = REQUIRED.contains(&(e.kind.as_str(), e.key.as_str()))
            || (e.kind == "connection" && tunnel && REQUIRED_IN_TUNNEL.contains(&e.key.as_str()));
        let dependent = DEPENDENT_REMOVALS
            .iter()
            .find(|(b, t, k, _)| *b == base_name && *t == e.table && *k == e.key);
        out.push(Variant {
            class: Class::Removed,
            label: label(e, "removed"),
            text: remove_line(text, e.line),
            extra: None,
            expect: if required {
                Expect::Refuse {
                    lines: e.header..=e.line,
                    key: e.key.clone(),
                }
            } else if let Some((_, _, _, why)) = dependent {
                Expect::RefuseSomewhere {
                    reason: why.to_string(),
                }
            } else {
                Expect::Accept {
                    reason: "optional: the documented default applies".into(),
                    warning: None,
                }
            },
        });

        // (f) the key twice.
        out.push(Variant {
            class: Class::Duplicates,
            label: label(e, "given twice"),
            text: insert_line(text, e.line + 1, &format!("{} = {}", e.key, e.value)),
            extra: None,
            expect: Expect::Refuse {
                lines: e.line + 1..=e.line + 1,
                key: e.key.clone(),
            },
        });

        // (g) syntax errors on the key's line.
        for (what, line) in [
            ("no value", format!("{} =", e.key)),
            ("unterminated string", format!("{} = \"unterminated", e.key)),
            ("bare word", format!("{} = bare-word", e.key)),
        ] {
            out.push(Variant {
                class: Class::Syntax,
                label: label(e, what),
                text: replace_line(text, e.line, &line),
                extra: None,
                expect: refuse_here(e),
            });
        }

        // (e) files.
        if let Some(kind) = listed(FILE_KEYS, &e.kind, &e.key) {
            out.extend(file_variants(dir, base_name, text, e, *kind));
        }
    }

    // (d) an unknown key in each table, and unknown tables.
    for h in &headers {
        out.push(Variant {
            class: Class::UnknownKey,
            label: format!("{base_name}:{}: not_a_key in [{}]", h.line + 1, h.table),
            text: insert_line(text, h.line + 1, "not_a_key = 1"),
            extra: None,
            expect: Expect::Refuse {
                lines: h.line + 1..=h.line + 1,
                key: "not_a_key".into(),
            },
        });
        if h.array {
            // A sub-table the schema does not have, after the connection's keys.
            let l = h.end + 1;
            out.push(Variant {
                class: Class::UnknownKey,
                label: format!("{base_name}:{l}: [{}.not_a_table]", h.kind),
                text: insert_line(text, l, &format!("[{}.not_a_table]", h.kind)),
                extra: None,
                expect: Expect::Refuse {
                    lines: l..=l,
                    key: "not_a_table".into(),
                },
            });
        }
    }
    let n = text.lines().count();
    out.push(Variant {
        class: Class::UnknownKey,
        label: format!("{base_name}:1: not_a_key at the top"),
        text: insert_line(text, 1, "not_a_key = 1"),
        extra: None,
        expect: Expect::Refuse {
            lines: 1..=1,
            key: "not_a_key".into(),
        },
    });
    out.push(Variant {
        class: Class::UnknownKey,
        label: format!("{base_name}:{}: [not_a_table]", n + 1),
        text: format!("{text}[not_a_table]\nx = 1\n"),
        extra: None,
        expect: Expect::Refuse {
            lines: n + 1..=n + 1,
            key: "not_a_table".into(),
        },
    });
    for e in entries.iter().filter(|e| e.value.is_table()) {
        // Inside an inline table.
        let t = format!("{} = {{ not_a_key = 1 }}", e.key);
        out.push(Variant {
            class: Class::UnknownKey,
            label: label(e, "{ not_a_key = 1 }"),
            text: replace_line(text, e.line, &t),
            extra: None,
            expect: Expect::Refuse {
                lines: e.line..=e.line,
                key: "not_a_key".into(),
            },
        });
    }

    // (b) extras: keys that other keys rule out.
    for (b, table, key, lit) in CONFLICTS.iter().filter(|c| c.0 == base_name) {
        let h = headers.iter().find(|h| h.table == *table).unwrap();
        let l = h.line + 1;
        out.push(Variant {
            class: Class::OutOfRange,
            label: format!("{b}:{l}: {table}.{key} = {lit} added (conflict)"),
            text: insert_line(text, l, &format!("{key} = {lit}")),
            extra: None,
            expect: Expect::Refuse {
                lines: l..=l,
                key: key.to_string(),
            },
        });
    }

    // (f) tables, names and SPIs given twice.
    for h in headers.iter().filter(|h| !h.array) {
        let l = h.end + 1;
        out.push(Variant {
            class: Class::Duplicates,
            label: format!("{base_name}:{l}: [{}] twice", h.kind),
            text: insert_line(text, l, &format!("[{}]", h.kind)),
            extra: None,
            expect: Expect::Refuse {
                lines: l..=l,
                key: h.kind.rsplit('.').next().unwrap().to_string(),
            },
        });
    }
    let names: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.kind == "connection" && e.key == "name")
        .collect();
    for e in names.iter().skip(1) {
        out.push(Variant {
            class: Class::Duplicates,
            label: label(
                e,
                &format!("= {} (the first connection's name)", names[0].value),
            ),
            text: replace_line(text, e.line, &format!("name = {}", names[0].value)),
            extra: None,
            expect: refuse_here(e),
        });
    }
    for kind in ["connection.esp", "connection.ah"] {
        let spis: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.kind == kind && e.key == "spi_in")
            .collect();
        for e in spis.iter().skip(1) {
            out.push(Variant {
                class: Class::Duplicates,
                label: label(e, &format!("= {} (an SPI already used)", spis[0].value)),
                text: replace_line(text, e.line, &format!("spi_in = {}", spis[0].value)),
                extra: None,
                expect: refuse_here(e),
            });
        }
    }
    out
}

/// Class (e) for one key naming a file: the path changed to a missing
/// file or a directory, or to a new file (`keys/variant-file`) with other
/// contents or another mode.
fn file_variants(
    dir: &Path,
    base_name: &str,
    text: &str,
    e: &Entry,
    kind: FileKind,
) -> Vec<Variant> {
    let ex = examples_keys();
    let example = |name: &str| fs::read(ex.join(name)).unwrap();
    let original = fs::read(dir.join(e.value.as_str().unwrap())).unwrap();
    let here = Expect::Refuse {
        lines: e.line..=e.line,
        key: e.key.clone(),
    };
    let accept = |reason: &str| Expect::Accept {
        reason: reason.into(),
        warning: None,
    };
    const NOT_READ: &str = "the etcd TLS files are only checked to exist at load time; the \
                            cluster agent reads them when it connects to etcd";
    // (what, the new file's contents and mode, or another path, expectation)
    type Case = (&'static str, Result<(Vec<u8>, u32), &'static str>, Expect);
    let mut cases: Vec<Case> = vec![
        ("missing", Err("keys/does-not-exist"), here.clone()),
        ("a directory", Err("keys"), here.clone()),
        (
            "mode 0000 (unreadable)",
            Ok((original.clone(), 0o000)),
            here.clone(),
        ),
    ];
    let empty = match kind {
        FileKind::Password => {
            accept("an empty password is etcd's to refuse, when the agent logs in")
        }
        FileKind::EtcdTls => accept(NOT_READ),
        _ => here.clone(),
    };
    cases.push(("empty", Ok((Vec::new(), 0o600)), empty));
    let open = match kind {
        FileKind::Psk | FileKind::ClusterKey | FileKind::Password => here.clone(),
        FileKind::Hex | FileKind::PrivateKey => Expect::Accept {
            reason: "a key file readable by others draws a warning (docs/CONFIG.md)".into(),
            warning: Some("chmod 600"),
        },
        FileKind::Cert | FileKind::Ca | FileKind::PublicKey => {
            accept("certificates and public keys are not secret")
        }
        FileKind::EtcdTls => accept(NOT_READ),
    };
    cases.push(("mode 0644", Ok((original.clone(), 0o644)), open));
    let garbage = b"this is not what the key wants\n".to_vec();
    let big = |c: u8| vec![c; 64 * 1024 + 1];
    let mut contents: Vec<(&'static str, Vec<u8>)> = match kind {
        FileKind::Hex => vec![
            ("wrong hex length", b"0011\n".to_vec()),
            (
                "one hex digit short",
                original[..original.trim_ascii_end().len() - 1].to_vec(),
            ),
            (
                "not hex",
                original
                    .iter()
                    .map(|c| if c.is_ascii_hexdigit() { b'z' } else { *c })
                    .collect(),
            ),
            ("larger than 64 KiB", big(b'0')),
        ],
        FileKind::Psk => vec![
            ("0x and not hex", b"0xzz\n".to_vec()),
            ("0x and an odd number of digits", b"0xabc\n".to_vec()),
            ("only a newline", b"\n".to_vec()),
            ("larger than 64 KiB", big(b'a')),
        ],
        FileKind::PrivateKey => vec![
            ("not PEM", garbage.clone()),
            ("a certificate", example("moon.crt")),
            ("a public key", example("venus-ed25519.pub")),
            (
                "a truncated PEM key",
                original[..original.len() / 2].to_vec(),
            ),
        ],
        FileKind::Cert => vec![
            ("not PEM", garbage.clone()),
            ("a private key", example("moon.key")),
            ("the certificate of another key", example("sun.crt")),
        ],
        FileKind::Ca => vec![
            ("not PEM", garbage.clone()),
            ("a private key", example("moon.key")),
            (
                "a truncated certificate",
                original[..original.len() / 2].to_vec(),
            ),
        ],
        FileKind::PublicKey => vec![
            ("not PEM", garbage.clone()),
            ("a private key", example("moon-ed25519.key")),
            ("a certificate", example("moon.crt")),
        ],
        FileKind::ClusterKey => vec![
            (
                "63 hex characters",
                hex_key(32, 1).as_bytes()[..63].to_vec(),
            ),
            (
                "65 hex characters",
                format!("{}0", hex_key(32, 1)).into_bytes(),
            ),
            ("64 characters, not hex", vec![b'g'; 64]),
        ],
        FileKind::Password | FileKind::EtcdTls => Vec::new(),
    };
    if kind == FileKind::EtcdTls {
        contents.push(("not PEM", garbage));
    }
    for (what, data) in contents {
        let expect = if kind == FileKind::EtcdTls {
            accept(NOT_READ)
        } else {
            here.clone()
        };
        cases.push((what, Ok((data, 0o600)), expect));
    }
    cases
        .into_iter()
        .map(|(what, file, expect)| {
            let (path, extra) = match file {
                Err(path) => (path.to_string(), None),
                Ok((contents, mode)) => (
                    VARIANT_FILE.to_string(),
                    Some(ExtraFile {
                        rel: VARIANT_FILE.to_string(),
                        contents,
                        mode,
                    }),
                ),
            };
            Variant {
                class: Class::Files,
                label: format!("{base_name}:{}: {}.{} {what}", e.line, e.table, e.key),
                text: replace_line(text, e.line, &format!("{} = \"{path}\"", e.key)),
                extra,
                expect,
            }
        })
        .collect()
}

/// The file a class (e) variant writes.
const VARIANT_FILE: &str = "keys/variant-file";

// ---------------------------------------------------------------------------
// Running them.

/// How a variant came out.
enum Outcome {
    /// Loaded, with these warnings.
    Loaded(Vec<String>),
    Refused(ConfigError),
    Panicked(String),
}

fn run(path: &Path) -> Outcome {
    match catch_unwind(AssertUnwindSafe(|| load(path))) {
        Ok(Ok(c)) => Outcome::Loaded(c.warnings),
        Ok(Err(e)) => Outcome::Refused(e),
        Err(p) => Outcome::Panicked(
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        ),
    }
}

/// Why the outcome is not what was expected, if it is not.
fn judge(v: &Variant, file: &str, outcome: &Outcome) -> Option<String> {
    if let Outcome::Panicked(m) = outcome {
        return Some(format!("PANIC: {m}"));
    }
    if let Outcome::Refused(e) = outcome {
        // Whatever was expected, a refusal names the file, a line and a key.
        let text = e.to_string();
        if !text.contains(file) {
            return Some(format!("the error does not name the file:\n{text}"));
        }
        for d in &e.diagnostics {
            if d.position.is_none() || d.path.is_empty() {
                return Some(format!("a diagnostic without a line or a key:\n{text}"));
            }
        }
    }
    match (&v.expect, outcome) {
        (Expect::Refuse { lines, key }, Outcome::Refused(e)) => {
            let ok = e.diagnostics.iter().any(|d| {
                d.position.is_some_and(|(l, _)| lines.contains(&l))
                    && d.render(&e.file).contains(key.as_str())
            });
            (!ok).then(|| format!("refused, but not at line {lines:?} naming `{key}`:\n{e}"))
        }
        (Expect::Refuse { .. }, Outcome::Loaded(warnings)) => {
            Some(format!("ACCEPTED (warnings: {warnings:?})"))
        }
        (Expect::Accept { warning, .. }, Outcome::Loaded(warnings)) => match warning {
            Some(w) if !warnings.iter().any(|x| x.contains(w)) => {
                Some(format!("loaded without the warning {w:?}: {warnings:?}"))
            }
            _ => None,
        },
        (Expect::Accept { reason, .. }, Outcome::Refused(e)) => {
            Some(format!("on the allow-list ({reason}) but refused:\n{e}"))
        }
        (Expect::RefuseSomewhere { .. }, Outcome::Refused(_)) => None,
        (Expect::RefuseSomewhere { reason }, Outcome::Loaded(_)) => {
            Some(format!("ACCEPTED, but expected refused: {reason}"))
        }
        (Expect::Either { .. }, _) => None,
        (_, Outcome::Panicked(_)) => unreachable!(),
    }
}

#[derive(Default)]
struct Tally {
    total: usize,
    refused: usize,
    accepted: usize,
    skipped: usize,
}

#[test]
fn every_malformed_configuration_is_refused_with_file_line_and_key() {
    let started = Instant::now();
    let dir = make_dir();
    let bases = [("manual.toml", manual_base()), ("ike.toml", ike_base())];
    // The bases themselves load.
    for (name, text) in &bases {
        let p = dir.join(name);
        fs::write(&p, text).unwrap();
        if let Err(e) = load(&p) {
            panic!("the base {name} does not load:\n{e}");
        }
    }
    // Every key of the bases has a decision in the tables above.
    let mut undecided = BTreeSet::new();
    for (_, text) in &bases {
        for e in entries(text).0 {
            let decided = listed(BAD_VALUES, &e.kind, &e.key).is_some()
                || listed(NO_RANGE, &e.kind, &e.key).is_some()
                || listed(FILE_KEYS, &e.kind, &e.key).is_some();
            if !decided {
                undecided.insert(format!("{}.{}", e.kind, e.key));
            }
        }
    }
    assert!(
        undecided.is_empty(),
        "keys with no out-of-range values and not in NO_RANGE or FILE_KEYS: {undecided:?}"
    );

    // Whether this process reads files whatever their mode (root).
    let privileged = {
        let p = dir.join("mode-0000");
        fs::write(&p, "x").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o000)).unwrap();
        let r = fs::File::open(&p).is_ok();
        fs::remove_file(&p).unwrap();
        r
    };
    // ESPGATE_BAD_CONFIGS_VERBOSE=1 prints every variant and its outcome.
    let verbose = std::env::var_os("ESPGATE_BAD_CONFIGS_VERBOSE").is_some();
    // Every allow-list entry still matches something in the bases.
    for (base, table, key, why) in DEPENDENT_REMOVALS {
        let text = &bases.iter().find(|b| b.0 == *base).unwrap().1;
        assert!(
            entries(text)
                .0
                .iter()
                .any(|e| e.table == *table && e.key == *key),
            "stale DEPENDENT_REMOVALS entry {base} {table}.{key} ({why})"
        );
    }
    for (kind, key, value, _, _) in REPORTED_AT {
        let values = listed(BAD_VALUES, kind, key).copied().unwrap_or(&[]);
        assert!(
            values.contains(value),
            "stale REPORTED_AT entry {kind}.{key} = {value}"
        );
    }
    for (base, table, key, value, _) in VALID_HERE {
        let text = &bases.iter().find(|b| b.0 == *base).unwrap().1;
        let e = entries(text)
            .0
            .into_iter()
            .find(|e| e.table == *table && e.key == *key);
        let values = e.map_or(&[][..], |e| {
            listed(BAD_VALUES, &e.kind, key).copied().unwrap_or(&[])
        });
        assert!(
            values.contains(value),
            "stale VALID_HERE entry {base} {table}.{key} = {value}"
        );
    }

    let file = dir.join("variant.toml");
    let file_name = file.display().to_string();
    let mut tally: BTreeMap<Class, Tally> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut accepted_why: BTreeMap<String, usize> = BTreeMap::new();
    // A panic is reported by the variant that caused it, not by the hook.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for (name, text) in &bases {
        for v in variants(&dir, name, text) {
            let t = tally.entry(v.class).or_default();
            t.total += 1;
            fs::write(&file, &v.text).unwrap();
            if let Some(x) = &v.extra {
                let p = dir.join(&x.rel);
                fs::write(&p, &x.contents).unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(x.mode)).unwrap();
                if x.mode & 0o400 == 0 && privileged {
                    // Root reads a 0000 file: nothing to test.
                    t.skipped += 1;
                    continue;
                }
            }
            let outcome = run(&file);
            if let Some(x) = &v.extra {
                let _ = fs::remove_file(dir.join(&x.rel));
            }
            match &outcome {
                Outcome::Loaded(_) => {
                    t.accepted += 1;
                    if let Expect::Accept { reason, .. } | Expect::Either { reason } = &v.expect {
                        *accepted_why.entry(reason.clone()).or_default() += 1;
                    }
                }
                Outcome::Refused(_) => t.refused += 1,
                Outcome::Panicked(_) => {}
            }
            if verbose {
                let result = match &outcome {
                    Outcome::Loaded(_) => "loaded".to_string(),
                    Outcome::Refused(e) => e.to_string(),
                    Outcome::Panicked(m) => format!("PANIC {m}"),
                };
                println!("{}\n  {}", v.label, result.replace('\n', "\n  "));
            }
            if let Some(why) = judge(&v, &file_name, &outcome) {
                failures.push(format!("{}\n  {}", v.label, why.replace('\n', "\n  ")));
            }
        }
    }
    std::panic::set_hook(hook);

    let mut summary = String::from("\nbad-configuration corpus\n");
    let mut all = Tally::default();
    for c in Class::ALL {
        let t = tally.remove(&c).unwrap_or_default();
        let _ = writeln!(
            summary,
            "  {:<36} {:>5} variants: {:>5} refused, {:>4} accepted (allow-listed), {:>3} skipped",
            c.title(),
            t.total,
            t.refused,
            t.accepted,
            t.skipped
        );
        all.total += t.total;
        all.refused += t.refused;
        all.accepted += t.accepted;
        all.skipped += t.skipped;
    }
    let _ = writeln!(
        summary,
        "  {:<36} {:>5} variants: {:>5} refused, {:>4} accepted (allow-listed), {:>3} skipped; {} failures, {:.1} s",
        "all",
        all.total,
        all.refused,
        all.accepted,
        all.skipped,
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    summary.push_str("  accepted by design, by reason:\n");
    for (why, n) in &accepted_why {
        let _ = writeln!(summary, "    {n:>4}  {why}");
    }
    println!("{summary}");
    let _ = fs::remove_dir_all(&dir);
    assert!(
        failures.is_empty(),
        "{} variants did not come out as expected:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// The gaps the corpus found, each with the message it used to give in a
/// comment: they stay closed.
#[test]
fn the_gaps_the_corpus_found_stay_closed() {
    let manual = |extra: &str, ah: &str| {
        format!(
            "[gateway]\nmtu = 1500\n\n[[connection]]\nname = \"b\"\nlocal = \"192.0.2.1\"\n\
             remote = \"192.0.2.2\"\nmode = \"transport\"\nprotocol = \"ah\"\n\
             encap = \"none\"\n{extra}\n[connection.ah]\nsuite = \"{ah}\"\nspi_in = 0x1001\n\
             spi_out = 0x1002\ninteg_in = \"{}\"\ninteg_out = \"{}\"\n",
            hex_key(32, 1),
            hex_key(32, 2)
        )
    };
    let dir = std::env::temp_dir();
    let err = |text: &str| match espgate_config::parse(text, &dir, "t.toml") {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    };
    let has = |msg: &str, part: &str| assert!(msg.contains(part), "{part:?} not in:\n{msg}");
    assert!(espgate_config::parse(&manual("", "sha256"), &dir, "t.toml").is_ok());

    // A key given twice. Was: "t.toml:12:1: TOML syntax: duplicate key".
    let e = err(&manual("routes = true\nroutes = false", "sha256"));
    has(
        &e,
        "t.toml:12:1: connection[0].routes: TOML syntax: duplicate key: this key is already set",
    );
    // A table given twice. Was: "t.toml:3:2: TOML syntax: duplicate key".
    let e = err(&manual("", "sha256").replace("mtu = 1500", "mtu = 1500\n[gateway]"));
    has(
        &e,
        "t.toml:3:2: gateway: TOML syntax: duplicate key: this table is already defined",
    );
    let e = err(&format!("{}[connection.ah]\n", manual("", "sha256")));
    has(
        &e,
        "t.toml:18:13: connection[0].ah: TOML syntax: duplicate key",
    );
    // A syntax error in a value. Was: "t.toml:13:9: TOML syntax: string
    // values must be quoted, expected literal string".
    let e = err(&manual("", "sha256").replace("suite = \"sha256\"", "suite = sha256"));
    has(
        &e,
        "t.toml:13:9: connection[0].ah.suite: TOML syntax: string values must be quoted",
    );

    // A keyword given a number. Was: "connection[0].dscp (connection \"b\"):
    // wanted string or table".
    let e = err(&manual("dscp = 7", "sha256"));
    has(
        &e,
        "t.toml:11:8: connection[0].dscp (connection \"b\"): invalid type: expected a string",
    );
    // An array for a table. Was: "invalid length 1, expected a table".
    let e = err(&manual("lifetime = [1]", "sha256"));
    has(
        &e,
        "connection[0].lifetime (connection \"b\"): invalid type: array, expected a table",
    );
    // An integer beyond 64 bits. Was: "invalid type: integer
    // `99999999999999999999` as i128, expected an integer".
    let e = err(&manual("", "sha256").replace("mtu = 1500", "mtu = 99999999999999999999"));
    has(
        &e,
        "t.toml:2:7: gateway.mtu: integer `99999999999999999999` is out of range",
    );

    // An ESP suite in AH. Was the suite's error and, at each integrity
    // key, "AH has no encryption key; remove integ_in".
    let text = manual("", "aes128gcm16");
    let e = espgate_config::parse(&text, &dir, "t.toml").unwrap_err();
    assert_eq!(e.diagnostics.len(), 1, "{e}");
    has(&e.to_string(), "t.toml:13:9: connection[0].ah.suite");

    // [cluster] etcd, a key the schema keeps no position of. Was at the
    // [cluster] header: "t.toml:19:1: cluster.etcd: etcd = []: ...".
    let cluster = |keys: &str| {
        format!(
            "{}\n[cluster]\nname = \"c\"\nnode = 1\n{keys}\n",
            manual("", "sha256")
        )
    };
    let e = err(&cluster("etcd = []"));
    has(&e, "t.toml:22:8: cluster.etcd: etcd = []");
    let e = err(&cluster(
        "etcd = [\"http://10.0.0.1:2379\"]\netcd_ca = \".\"",
    ));
    has(
        &e,
        "t.toml:22:8: cluster.etcd: etcd_ca/etcd_cert are set but an endpoint is http://",
    );
    // An absent etcd is still reported at the header: the default
    // endpoint is http://.
    let e = err(&cluster("etcd_ca = \".\""));
    has(&e, "t.toml:19:1: cluster.etcd: etcd_ca/etcd_cert are set");
    // A directory named as an etcd file. Was "etcd_ca DIR: no such file".
    has(&e, "cluster.etcd_ca: etcd_ca ");
    has(&e, ": a directory, not a file");
}
