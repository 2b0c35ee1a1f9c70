//! Arbitrary text as a configuration file: the TOML parse, the schema and
//! every validator. A file that loads has an effective configuration
//! (`espgate config check`) that, written with its keys and loaded again,
//! says the same thing; a refused one has at least one diagnostic, placed
//! inside the text.
//!
//! Relative paths resolve against a directory this target fills on its
//! first run (under the system temporary directory) with the key files
//! of `crates/espgate-config/tests/bad_configs.rs`, all mode 0600: the
//! ESP and AH keys `keys/b.enc_in`, `keys/b.enc_out`, `keys/m.integ_in`,
//! `keys/m.integ_out`, the PSK `keys/site.psk`, `keys/etcd.password`,
//! `keys/cluster.key`, and copies of `examples/keys` (`moon.key`,
//! `moon.crt`, `ca.crt`, `moon-ed25519.key`, `venus-ed25519.pub`,
//! `etcd-ca.crt`, `etcd.crt`, `etcd.key`); plus `keys/open.psk` (mode
//! 0644), `keys/dir` (a directory) and `keys/big` (1.2 MB of hex) for
//! the refusals. So the seeds
//! (`gen_seeds`: the two complete bases of that test and the examples)
//! reach the key-file and IKE validation. `ESPGATE_FUZZ_VERBOSE=1` prints
//! each input's verdict (accepted, or the first diagnostic).
#![no_main]

use espgate_config::{parse, KeyText};
use libfuzzer_sys::fuzz_target;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn hex_key(len: usize, seed: u8) -> String {
    (0..len)
        .map(|i| format!("{:02x}", (i as u8).wrapping_mul(7).wrapping_add(seed)))
        .collect()
}

/// The key directory, made once per process (written to a fresh name and
/// renamed into place, so parallel jobs never see a half-made one).
fn base() -> &'static Path {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = std::env::temp_dir().join("espgate-fuzz-config-v2");
        if dir.join("keys/cluster.key").exists() {
            return dir;
        }
        let tmp =
            std::env::temp_dir().join(format!("espgate-fuzz-config-v2.{}", std::process::id()));
        let keys = tmp.join("keys");
        fs::create_dir_all(keys.join("dir")).expect("key directory");
        let files: [(&str, Vec<u8>); 17] = [
            (
                "moon.key",
                include_bytes!("../../examples/keys/moon.key").to_vec(),
            ),
            (
                "moon.crt",
                include_bytes!("../../examples/keys/moon.crt").to_vec(),
            ),
            (
                "ca.crt",
                include_bytes!("../../examples/keys/ca.crt").to_vec(),
            ),
            (
                "moon-ed25519.key",
                include_bytes!("../../examples/keys/moon-ed25519.key").to_vec(),
            ),
            (
                "venus-ed25519.pub",
                include_bytes!("../../examples/keys/venus-ed25519.pub").to_vec(),
            ),
            (
                "etcd-ca.crt",
                include_bytes!("../../examples/keys/ca.crt").to_vec(),
            ),
            (
                "etcd.crt",
                include_bytes!("../../examples/keys/sun.crt").to_vec(),
            ),
            (
                "etcd.key",
                include_bytes!("../../examples/keys/sun.key").to_vec(),
            ),
            ("b.enc_in", (hex_key(36, 11) + "\n").into_bytes()),
            ("b.enc_out", (hex_key(36, 12) + "\n").into_bytes()),
            ("m.integ_in", (hex_key(64, 13) + "\n").into_bytes()),
            ("m.integ_out", (hex_key(64, 14) + "\n").into_bytes()),
            (
                "site.psk",
                b"a pre-shared key of forty-odd characters\n".to_vec(),
            ),
            (
                "hex.psk",
                b"0x0011223344556677 8899aabbccddeeff00112233\n".to_vec(),
            ),
            ("etcd.password", b"secret\n".to_vec()),
            ("cluster.key", (hex_key(32, 15) + "\n").into_bytes()),
            ("open.psk", b"a pre-shared key readable by all\n".to_vec()),
        ];
        for (name, bytes) in &files {
            let p = keys.join(name);
            fs::write(&p, bytes).expect("key file");
            let mode = if *name == "open.psk" { 0o644 } else { 0o600 };
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod");
        }
        // Over every size limit (key files 64 KiB, certificates 1 MiB).
        fs::write(keys.join("big"), "00".repeat(600 << 10)).expect("big file");
        fs::set_permissions(keys.join("big"), fs::Permissions::from_mode(0o600)).expect("chmod");
        if fs::rename(&tmp, &dir).is_err() {
            // Another job made it first.
            let _ = fs::remove_dir_all(&tmp);
        }
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // A key file named in the text is opened: keep the fuzzer to files it
    // cannot block on (a FIFO or a terminal under /dev, /proc, /sys).
    if ["/dev", "/proc", "/sys", ".."]
        .iter()
        .any(|p| text.contains(p))
    {
        return;
    }
    let base = base();
    let parsed = parse(text, base, "fuzz.toml");
    if std::env::var_os("ESPGATE_FUZZ_VERBOSE").is_some() {
        match &parsed {
            Ok(c) => eprintln!(
                "accepted: {} connection(s), {} warning(s) {:?}",
                c.connections.len(),
                c.warnings.len(),
                c.warnings.first()
            ),
            Err(e) => eprintln!("refused: {}", e.diagnostics[0].render("fuzz.toml")),
        }
    }
    match parsed {
        Ok(c) => {
            let written = toml::to_string(&c.effective(KeyText::Hex))
                .expect("an effective configuration always writes as TOML");
            let again = parse(&written, base, "effective.toml")
                .unwrap_or_else(|e| panic!("{e}\n--- written:\n{written}"));
            assert_eq!(again.gateway, c.gateway);
            assert_eq!(again.cluster, c.cluster);
            assert_eq!(
                format!("{:?}", again.connections),
                format!("{:?}", c.connections)
            );
            // What `espgate config check` prints, and what the daemon
            // takes from each connection.
            let t = c.effective_toml();
            toml::from_str::<toml::Table>(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
            let j = c.effective_json();
            serde_json::from_str::<serde_json::Value>(&j).unwrap_or_else(|e| panic!("{e}\n{j}"));
            for conn in &c.connections {
                assert!(c.connection(&conn.name).is_some());
                let sas = conn.sa_configs();
                let _ = (conn.selectors(), conn.start_on_boot(), conn.spec());
                match conn.ike_config() {
                    Some(_) => assert!(conn.ike().is_some() && sas.inbound.is_empty()),
                    None => assert!(conn.ike().is_none()),
                }
            }
            let _ = c.gateway.worker_threads();
            if let Some(cl) = &c.cluster {
                // The agent reads the password file again when it connects;
                // the cluster key never shows in Debug output.
                if let Ok(p) = cl.etcd_password() {
                    assert_eq!(p.is_some(), cl.etcd_password_file.is_some());
                }
                if let Some(k) = &cl.key {
                    assert_eq!(k.bytes().len(), 32);
                    assert!(!format!("{cl:?}").contains(&format!("{:?}", &k.bytes()[..])));
                }
            }
            for w in &c.warnings {
                assert!(!w.is_empty());
            }
        }
        Err(e) => {
            assert!(!e.diagnostics.is_empty(), "a refusal says why");
            let lines = text.lines().count().max(1) + 1;
            for d in &e.diagnostics {
                if let Some((l, c)) = d.position {
                    assert!(l >= 1 && l <= lines && c >= 1, "{d:?} outside the text");
                }
            }
            assert!(!e.to_string().is_empty());
        }
    }
});
