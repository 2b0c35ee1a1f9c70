//! `config_parse` seeds: complete configurations in the shapes of
//! `crates/espgate-config/tests/bad_configs.rs` (whose key files the
//! target recreates under its base directory), one connection of each kind
//! alone, the examples, and a few refusals the fuzzer would take long to
//! spell. Relative key paths name the target's `keys/` directory.

/// `len` bytes of key material as hex, different for each `seed` (the
/// same function as the target's and the bad-configuration test's).
fn hex_key(len: usize, seed: u8) -> String {
    (0..len)
        .map(|i| format!("{:02x}", (i as u8).wrapping_mul(7).wrapping_add(seed)))
        .collect()
}

const GATEWAY_ALL: &str = r#"[gateway]
tun = "espgate0"
tun_address = ["10.1.0.254/32", "2001:db8:1::fe/128"]
listen = "[::]:4500"
encap = "udp"
workers = 2
batch = 32
ike_fragment_size = 1200
ike_cookie_threshold = 32
ike_half_open_limit = 1000
socket_buffer = 4194304
qesp_protocol = 253
mtu = 1500
control_socket = "run/espgate.sock"
metrics = "127.0.0.1:9184"
log = "info"
fwmark = 17664
state_dir = "state"
offloads = true
cost_accounting = false
"#;

fn esp_udp_files() -> String {
    r#"[[connection]]
name = "site-b"
local = "192.0.2.1"
remote = "198.51.100.2"
remote_port = 4500
mode = "tunnel"
protocol = "esp"
encap = "udp"
local_ts = ["10.1.0.0/16", "2001:db8:1::/48"]
remote_ts = ["10.2.0.0/16", "2001:db8:2::/48"]
proto = "any"
routes = true
mss_clamp = "auto"
fragment_inner = true
dscp = "copy"
ecn = "normal"
esn = true
replay_window = 1024
nat_keepalive = 20
allow_insecure = false
tfc_pad_to = 0
per_cpu_sas = 2
lifetime = { soft_bytes = "4T", hard_bytes = "8T", soft_packets = "1G", hard_packets = "2G", soft_time = "30d", hard_time = "60d" }

[connection.esp]
suite = "aes256gcm16"
spi_in = 0xc0ffee01
spi_out = 0xc0ffee11
enc_in_file = "keys/b.enc_in"
enc_out_file = "keys/b.enc_out"
"#
    .to_string()
}

fn esp_ah_inline() -> String {
    format!(
        r#"[[connection]]
name = "lab"
local = "192.0.2.1"
remote = "192.0.2.2"
protocol = "esp+ah"
encap = "none"
local_ts = ["10.3.0.0/16"]
remote_ts = ["10.4.0.0/16"]
proto = "tcp"
mss_clamp = 1360
dscp = "clear"
replay_window = 4096
tfc_pad_to = 1200

[connection.lifetime]
soft_bytes = 1000000
hard_bytes = "1G"
soft_packets = 1000
hard_packets = "1M"
soft_time = "1h"
hard_time = "2h"

[connection.esp]
suite = "aes256-sha1"
spi_in = 0x2001
spi_out = 0x2002
enc_in = "{}"
enc_out = "{}"
integ_in = "{}"
integ_out = "{}"

[connection.ah]
suite = "sha256"
spi_in = 0x3001
spi_out = 0x3002
integ_in = "{}"
integ_out = "{}"
"#,
        hex_key(32, 1),
        hex_key(32, 2),
        hex_key(20, 3),
        hex_key(20, 4),
        hex_key(32, 5),
        hex_key(32, 6)
    )
}

const AH_TRANSPORT_FILES: &str = r#"[[connection]]
name = "mgmt"
local = "192.0.2.1"
remote = "192.0.2.9"
mode = "transport"
protocol = "ah"
encap = "none"
proto = 6

[connection.ah]
suite = "sha512"
spi_in = 0x3101
spi_out = 0x3102
integ_in_file = "keys/m.integ_in"
integ_out_file = "keys/m.integ_out"
"#;

fn qesp() -> String {
    format!(
        r#"[[connection]]
name = "qos"
local = "192.0.2.1"
remote = "192.0.2.10"
protocol = "qesp"
encap = "none"
local_ts = ["10.5.0.0/16"]
remote_ts = ["10.6.0.0/16"]

[connection.esp]
suite = "aes128gcm16"
spi_in = 0x4001
spi_out = 0x4002
enc_in = "{}"
enc_out = "{}"
"#,
        hex_key(20, 7),
        hex_key(20, 8)
    )
}

fn v6_transport() -> String {
    format!(
        r#"[[connection]]
name = "v6"
local = "2001:db8::1"
remote = "2001:db8::2"
mode = "transport"
nat_keepalive = 0

[connection.esp]
suite = "chacha20poly1305"
spi_in = 0x5001
spi_out = 0x5002
enc_in = "{}"
enc_out = "{}"
"#,
        hex_key(36, 9),
        hex_key(36, 10)
    )
}

const IKE_PSK_ALL: &str = r#"[[connection]]
name = "psk-peer"
local = "192.0.2.1"
remote = "198.51.100.2"
local_ts = ["10.1.0.0/16"]
remote_ts = ["10.2.0.0/16"]

[connection.ike]
proposals = ["aes128gcm16-prfsha256-x25519", "aes256-sha256-modp2048"]
esp_proposals = ["aes128gcm16", "aes256-sha256"]
local_id = "192.0.2.1"
remote_id = "peer.example"
auth = "psk"
remote_auth = "psk"
psk_file = "keys/site.psk"
start_action = "start"
rekey_time = "4h"
child_rekey_time = "1h"
child_life_time = "1h10m"
jitter = "5m"
dpd_delay = "30s"
dpd_action = "restart"
retransmit_timeout = "4s"
retransmit_tries = 5
retransmit_limit = "8s"
force_encap = true
qesp = "off"
"#;

const IKE_CERT: &str = r#"[[connection]]
name = "sun"
local = "192.0.2.1"
remote = "198.51.100.3"
local_ts = ["10.1.0.0/16"]
remote_ts = ["10.3.0.0/16"]

[connection.ike]
auth = "pubkey"
private_key = "keys/moon.key"
cert = "keys/moon.crt"
ca = "keys/ca.crt"
local_id = "moon.example"
remote_id = "sun.example"
"#;

const IKE_RAW_KEYS: &str = r#"[[connection]]
name = "venus"
local = "192.0.2.1"
remote = "203.0.113.3"
local_ts = ["10.1.0.0/16", "2001:db8:1::/48"]
remote_ts = ["10.4.0.0/16", "2001:db8:4::/48"]
proto = "icmp"

[connection.ike]
auth = "pubkey"
remote_auth = "pubkey"
private_key = "keys/moon-ed25519.key"
remote_public_key = "keys/venus-ed25519.pub"
local_id = "@#0102030405"
remote_id = "%any"
"#;

const IKE_QESP: &str = r#"[[connection]]
name = "q-peer"
local = "192.0.2.1"
remote = "203.0.113.4"
encap = "none"
local_ts = ["10.1.0.0/16"]
remote_ts = ["10.5.0.0/16"]

[connection.ike]
psk_file = "keys/site.psk"
qesp = "prefer"
esp_proposals = ["aes256gcm16-x25519-esn", "aes128-sha256-noesn"]
"#;

const CLUSTER_ALL: &str = r#"[cluster]
name = "gw"
node = 2
etcd = ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
etcd_ca = "keys/etcd-ca.crt"
etcd_cert = "keys/etcd.crt"
etcd_key = "keys/etcd.key"
etcd_user = "espgate"
etcd_password_file = "keys/etcd.password"
key_file = "keys/cluster.key"
dispatch = "session-sqf"
inside = "eth1"
outside = "eth0"
lease_ttl = "3s"
hold = "10s"
"#;

fn strip_comments(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(|l| match l.find("  #") {
            Some(i) => l[..i].trim_end(),
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The `BAD_VALUES` table of `crates/espgate-config/tests/bad_configs.rs`
/// as (table, key, values): read from its source text (Rust string
/// literals, `\"` and `\\` unescaped), so that the seeds follow the
/// test when values are added there.
fn bad_values() -> Vec<(String, String, Vec<String>)> {
    let src = include_str!("../../../crates/espgate-config/tests/bad_configs.rs");
    let Some(start) = src.find("const BAD_VALUES") else {
        eprintln!("gen_seeds: no BAD_VALUES in bad_configs.rs; skipping those seeds");
        return Vec::new();
    };
    let body = &src[start..];
    let body = &body[..body.find("\n];").unwrap_or(body.len())];
    // Every string literal, in order.
    let mut lits = Vec::new();
    let mut chars = body.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut lit = String::new();
        while let Some((_, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, e)) = chars.next() {
                        lit.push(match e {
                            'n' => '\n',
                            't' => '\t',
                            other => other,
                        });
                    }
                }
                '"' => break,
                other => lit.push(other),
            }
        }
        lits.push(lit);
    }
    // A tuple is (table, key, &[values]): a table name starts a new one.
    let is_table = |s: &str| {
        matches!(
            s,
            "gateway"
                | "connection"
                | "connection.esp"
                | "connection.ah"
                | "connection.lifetime"
                | "connection.ike"
                | "cluster"
        )
    };
    let mut out: Vec<(String, String, Vec<String>)> = Vec::new();
    let mut i = 0;
    while i + 1 < lits.len() {
        if is_table(&lits[i]) && !lits[i + 1].contains(' ') && !lits[i + 1].is_empty() {
            out.push((lits[i].clone(), lits[i + 1].clone(), Vec::new()));
            i += 2;
        } else {
            if let Some(last) = out.last_mut() {
                last.2.push(lits[i].clone());
            }
            i += 1;
        }
    }
    if let Some(last) = out.last_mut() {
        if i < lits.len() {
            last.2.push(lits[i].clone());
        }
    }
    out
}

/// `text` with the line `key = ...` of table `table` (`connection.esp`,
/// …) set to `key = value`, if it has one.
fn with_value(text: &str, table: &str, key: &str, value: &str) -> Option<String> {
    let mut kind = String::new();
    let mut done = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(n) = t.strip_prefix("[[").and_then(|s| s.strip_suffix("]]")) {
            kind = n.to_string();
        } else if let Some(n) = t.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            kind = n.to_string();
        }
        let is_key = t
            .strip_prefix(key)
            .is_some_and(|r| r.trim_start().starts_with('='));
        if !done && kind == table && is_key {
            out.push(format!("{key} = {value}"));
            done = true;
        } else {
            out.push(line.to_string());
        }
    }
    done.then(|| out.join("\n") + "\n")
}

/// Every seed as (name, text).
pub fn seeds() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut add = |name: &str, text: String| out.push((name.to_string(), text));
    let gw1 = "[gateway]\nworkers = 1\n";
    // The two complete bases of the bad-configuration test, as close as
    // 4096 bytes allow.
    add(
        "manual-base",
        format!(
            "{GATEWAY_ALL}\n{}\n{}\n{AH_TRANSPORT_FILES}\n{}\n{}",
            esp_udp_files(),
            esp_ah_inline(),
            qesp(),
            v6_transport()
        ),
    );
    add(
        "ike-base",
        format!(
            "[gateway]\nlisten = \"0.0.0.0:4500\"\nworkers = 1\n\n{IKE_PSK_ALL}\n{IKE_CERT}\n{IKE_RAW_KEYS}\n{IKE_QESP}\n{CLUSTER_ALL}"
        ),
    );
    // One connection at a time.
    add(
        "gateway-all-esp-udp",
        format!("{GATEWAY_ALL}\n{}", esp_udp_files()),
    );
    add("esp-ah-inline", esp_ah_inline());
    add("ah-transport-files", AH_TRANSPORT_FILES.to_string());
    add(
        "qesp",
        format!("[gateway]\nqesp_protocol = 254\n{}", qesp()),
    );
    let listen6 = "[gateway]\nlisten = \"[::]:4500\"\n";
    add("v6-transport", format!("{listen6}{}", v6_transport()));
    add("ike-psk", format!("{gw1}{IKE_PSK_ALL}"));
    add("ike-cert", format!("{gw1}{IKE_CERT}"));
    add("ike-raw-keys", format!("{gw1}{IKE_RAW_KEYS}"));
    add("ike-qesp", format!("{gw1}{IKE_QESP}"));
    add(
        "ike-hex-psk-require",
        format!(
            "{gw1}{}",
            IKE_QESP
                .replace("site.psk", "hex.psk")
                .replace("\"prefer\"", "\"require\"")
        ),
    );
    add(
        "cluster-manual",
        format!("{gw1}\n{}\n{CLUSTER_ALL}", qesp().replace("qesp", "esp")),
    );
    add(
        "cluster-ike",
        format!(
            "{gw1}\n{IKE_PSK_ALL}\n{}",
            CLUSTER_ALL
                .lines()
                .filter(|l| !l.starts_with("etcd_c") && !l.starts_with("etcd_key"))
                .collect::<Vec<_>>()
                .join("\n")
                .replace("https", "http")
        ),
    );
    add("no-connection", GATEWAY_ALL.to_string());
    add("empty", String::new());
    // The examples, comments left out.
    for (name, text) in [
        (
            "example-site-to-site",
            include_str!("../../../examples/site-to-site.toml"),
        ),
        (
            "example-host-to-host",
            include_str!("../../../examples/host-to-host.toml"),
        ),
        (
            "example-esp-ah-bundle",
            include_str!("../../../examples/esp-ah-bundle.toml"),
        ),
        (
            "example-ike-psk",
            include_str!("../../../examples/ike-psk.toml"),
        ),
        (
            "example-ike-cert",
            include_str!("../../../examples/ike-cert.toml"),
        ),
    ] {
        // Key files renamed to the target's.
        let text = strip_comments(text)
            .replace("site-b.enc_", "b.enc_")
            .replace("ike-psk.secret", "site.psk")
            .replace("mgmt.integ_", "m.integ_");
        add(name, text);
    }
    // Refusals that need two consistent parts.
    let same = hex_key(20, 7);
    add(
        "aead-same-key-both-ways",
        qesp()
            .replace(&hex_key(20, 8), &same)
            .replace("qesp", "esp"),
    );
    add(
        "duplicate-names-overlap",
        format!(
            "{listen6}{}\n{}",
            v6_transport(),
            v6_transport().replace("0x500", "0x600")
        ),
    );
    add(
        "psk-open-and-dir",
        format!(
            "{gw1}{}",
            IKE_PSK_ALL
                .replace("keys/site.psk", "keys/open.psk")
                .replace("start_action", "private_key = \"keys/dir\"\nstart_action")
        ),
    );
    add(
        "missing-key-files",
        esp_udp_files()
            .replace("b.enc_in", "nope")
            .replace("b.enc_out", "dir"),
    );
    // Each bad value of the bad-configuration test, in the smallest of
    // these valid configurations that has its key.
    let bases = [
        format!("{GATEWAY_ALL}\n{}", esp_udp_files()),
        esp_ah_inline(),
        format!("{gw1}{AH_TRANSPORT_FILES}"),
        format!("{gw1}{IKE_PSK_ALL}"),
        format!("{gw1}{IKE_CERT}"),
        format!("{gw1}{IKE_RAW_KEYS}"),
        format!("{gw1}\n{}\n{CLUSTER_ALL}", qesp().replace("qesp", "esp")),
    ];
    let mut n_bad = 0;
    for (table, key, values) in bad_values() {
        let mut candidates: Vec<&String> = bases.iter().collect();
        candidates.sort_by_key(|b| b.len());
        for (j, v) in values.iter().enumerate() {
            if let Some(text) = candidates
                .iter()
                .find_map(|b| with_value(b, &table, &key, v))
            {
                add(&format!("bad-{}-{key}-{j}", table.replace('.', "-")), text);
                n_bad += 1;
            }
        }
    }
    assert!(
        n_bad > 100,
        "only {n_bad} bad-value seeds: has bad_configs.rs changed?"
    );
    // Keys that refuse each other (one seed can carry several).
    let with =
        |text: String, extra: &str| text.replacen("\nlocal = ", &format!("\n{extra}\nlocal = "), 1);
    add(
        "combo-qesp-udp-window0",
        with(
            qesp().replace("encap = \"none\"", "encap = \"udp\""),
            "replay_window = 0",
        ),
    );
    add(
        "combo-raw-esp-udp-keys",
        with(
            esp_ah_inline().replace("mss_clamp = 1360", "mss_clamp = \"off\""),
            "fragment_inner = false\nremote_port = 4501\nnat_keepalive = 30",
        ),
    );
    add(
        "combo-ah-per-cpu-tfc",
        format!(
            "{gw1}{}",
            with(
                AH_TRANSPORT_FILES.to_string(),
                "per_cpu_sas = 2\ntfc_pad_to = 100"
            )
        ),
    );
    add(
        "combo-ike-protocol-qesp",
        format!(
            "{gw1}{}",
            with(IKE_PSK_ALL.to_string(), "protocol = \"qesp\"")
        ),
    );
    add(
        "combo-ike-ah-per-cpu-esn",
        format!(
            "{gw1}{}",
            with(
                IKE_PSK_ALL.to_string(),
                "protocol = \"ah\"\nper_cpu_sas = 2\nesn = true"
            )
        ),
    );
    add(
        "combo-ike-qesp-udp",
        format!(
            "{gw1}{}",
            IKE_QESP.replace("encap = \"none\"", "encap = \"udp\"")
        ),
    );
    add(
        "combo-ike-qesp-gmac-window0",
        format!(
            "{gw1}{}",
            with(
                IKE_QESP.replace("\"prefer\"", "\"require\"").replace(
                    "esp_proposals = [\"aes256gcm16-x25519-esn\", \"aes128-sha256-noesn\"]",
                    "esp_proposals = [\"aes128gmac\"]"
                ),
                "replay_window = 0",
            )
        ),
    );
    add(
        "combo-gateway-workers-ike",
        format!("{GATEWAY_ALL}\n{IKE_PSK_ALL}"),
    );
    add(
        "combo-listen-port0-other-address",
        format!("[gateway]\nlisten = \"192.0.2.7:0\"\n{}", esp_udp_files()),
    );
    add(
        "combo-v6-tunnel-selectors",
        format!(
            "{listen6}{}",
            with(
                v6_transport().replace("mode = \"transport\"", "mode = \"tunnel\""),
                "local_ts = [\"2001:db8:1::5/48\", \"10.1.0.0/16\"]\nremote_ts = [\"2001:db8:2::/48\"]",
            )
        ),
    );
    add(
        "combo-transport-selectors-elsewhere",
        format!(
            "{listen6}{}",
            with(
                v6_transport(),
                "local_ts = [\"2001:db8:9::/48\"]\nremote_ts = [\"10.2.0.0/16\"]\nproto = \"icmp\"",
            )
        ),
    );
    add(
        "big-and-dir-key-files",
        format!(
            "{}\n{gw1}{}",
            esp_udp_files()
                .replace("b.enc_in", "big")
                .replace("b.enc_out", "dir"),
            IKE_CERT
                .replace("ca.crt", "big")
                .replace("moon.key", "dir")
                .replace("10.1.0.0/16", "10.9.0.0/16")
        ),
    );
    add(
        "toml-syntax",
        "[gateway]\ntun = \"espgate0\nmtu = 1500\n[[connection]\nname = 1\n".to_string(),
    );
    out
}
