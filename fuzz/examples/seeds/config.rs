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

/// The two complete bases of the bad-configuration test; the seeds take
/// them whole and one piece at a time.
const MANUAL_BASE: &str =
    include_str!("../../../crates/espgate-config/tests/fixtures/manual-base.toml");
const IKE_BASE: &str = include_str!("../../../crates/espgate-config/tests/fixtures/ike-base.toml");

/// The lines of `base` from the one that is `first` up to the next table
/// header that `ends` accepts (or the end), blank lines at the end left
/// out.
fn section(base: &str, first: &str, ends: impl Fn(&str) -> bool) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in base.lines() {
        if inside && ends(line) {
            break;
        }
        inside |= line == first;
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.trim_end().to_string() + "\n"
}

/// `base`'s `[gateway]` table.
fn gateway(base: &str) -> String {
    section(base, "[gateway]", |l| l.starts_with('['))
}

/// `base`'s `[[connection]]` named `name`, with its sub-tables.
fn connection(base: &str, name: &str) -> String {
    let body = section(base, &format!("name = \"{name}\""), |l| {
        l == "[[connection]]" || l == "[cluster]"
    });
    format!("[[connection]]\n{body}")
}

/// `base`'s `[cluster]` table.
fn cluster(base: &str) -> String {
    section(base, "[cluster]", |l| {
        l.starts_with("[[") || l == "[gateway]"
    })
}

fn esp_udp_files() -> String {
    connection(MANUAL_BASE, "site-b")
}

fn esp_ah_inline() -> String {
    connection(MANUAL_BASE, "lab")
}

fn qesp() -> String {
    connection(MANUAL_BASE, "qos")
}

fn v6_transport() -> String {
    connection(MANUAL_BASE, "v6")
}

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
    let gateway_all = &gateway(MANUAL_BASE);
    let ah_transport_files = &connection(MANUAL_BASE, "mgmt");
    let ike_psk_all = &connection(IKE_BASE, "psk-peer");
    let ike_cert = &connection(IKE_BASE, "sun");
    let ike_raw_keys = &connection(IKE_BASE, "venus");
    let ike_qesp = &connection(IKE_BASE, "q-peer");
    let cluster_all = &cluster(IKE_BASE);
    // The two complete bases of the bad-configuration test, as close as
    // 4096 bytes allow.
    add(
        "manual-base",
        format!(
            "{gateway_all}\n{}\n{}\n{ah_transport_files}\n{}\n{}",
            esp_udp_files(),
            esp_ah_inline(),
            qesp(),
            v6_transport()
        ),
    );
    add(
        "ike-base",
        format!(
            "[gateway]\nlisten = \"0.0.0.0:4500\"\nworkers = 1\n\n{ike_psk_all}\n{ike_cert}\n{ike_raw_keys}\n{ike_qesp}\n{cluster_all}"
        ),
    );
    // One connection at a time.
    add(
        "gateway-all-esp-udp",
        format!("{gateway_all}\n{}", esp_udp_files()),
    );
    add("esp-ah-inline", esp_ah_inline());
    add("ah-transport-files", ah_transport_files.to_string());
    add(
        "qesp",
        format!("[gateway]\nqesp_protocol = 254\n{}", qesp()),
    );
    let listen6 = "[gateway]\nlisten = \"[::]:4500\"\n";
    add("v6-transport", format!("{listen6}{}", v6_transport()));
    add("ike-psk", format!("{gw1}{ike_psk_all}"));
    add("ike-cert", format!("{gw1}{ike_cert}"));
    add("ike-raw-keys", format!("{gw1}{ike_raw_keys}"));
    add("ike-qesp", format!("{gw1}{ike_qesp}"));
    // Further selector sets, each a child SA of its own.
    add(
        "ike-children",
        format!(
            "{gw1}{ike_psk_all}\n[[connection.ike.child]]\nremote_ts = [\"10.3.0.0/16\"]\n\n\
             [[connection.ike.child]]\nlocal_ts = [\"10.4.0.0/16\", \"2001:db8:4::/48\"]\n\
             remote_ts = [\"10.5.0.0/16\", \"2001:db8:5::/48\"]\n"
        ),
    );
    add(
        "ike-hex-psk-require",
        format!(
            "{gw1}{}",
            ike_qesp
                .replace("site.psk", "hex.psk")
                .replace("\"prefer\"", "\"require\"")
        ),
    );
    add(
        "cluster-manual",
        format!("{gw1}\n{}\n{cluster_all}", qesp().replace("qesp", "esp")),
    );
    add(
        "cluster-ike",
        format!(
            "{gw1}\n{ike_psk_all}\n{}",
            cluster_all
                .lines()
                .filter(|l| !l.starts_with("etcd_c") && !l.starts_with("etcd_key"))
                .collect::<Vec<_>>()
                .join("\n")
                .replace("https", "http")
        ),
    );
    add("no-connection", gateway_all.to_string());
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
            ike_psk_all
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
        format!("{gateway_all}\n{}", esp_udp_files()),
        esp_ah_inline(),
        format!("{gw1}{ah_transport_files}"),
        format!("{gw1}{ike_psk_all}"),
        format!("{gw1}{ike_cert}"),
        format!("{gw1}{ike_raw_keys}"),
        format!("{gw1}\n{}\n{cluster_all}", qesp().replace("qesp", "esp")),
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
                ah_transport_files.to_string(),
                "per_cpu_sas = 2\ntfc_pad_to = 100"
            )
        ),
    );
    add(
        "combo-ike-protocol-qesp",
        format!(
            "{gw1}{}",
            with(ike_psk_all.to_string(), "protocol = \"qesp\"")
        ),
    );
    add(
        "combo-ike-ah-per-cpu-esn",
        format!(
            "{gw1}{}",
            with(
                ike_psk_all.to_string(),
                "protocol = \"ah\"\nper_cpu_sas = 2\nesn = true"
            )
        ),
    );
    add(
        "combo-ike-qesp-udp",
        format!(
            "{gw1}{}",
            ike_qesp.replace("encap = \"none\"", "encap = \"udp\"")
        ),
    );
    add(
        "combo-ike-qesp-gmac-window0",
        format!(
            "{gw1}{}",
            with(
                ike_qesp.replace("\"prefer\"", "\"require\"").replace(
                    "esp_proposals = [\"aes256gcm16-x25519-esn\", \"aes128-sha256-noesn\"]",
                    "esp_proposals = [\"aes128gmac\"]"
                ),
                "replay_window = 0",
            )
        ),
    );
    add(
        "combo-gateway-workers-ike",
        format!("{gateway_all}\n{ike_psk_all}"),
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
            ike_cert
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
