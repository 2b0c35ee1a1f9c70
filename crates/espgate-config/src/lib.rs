//! The gateway configuration file (`espgate up -c FILE`): TOML read once
//! into the [`schema`] with the position of every value, validated part
//! by part into typed structs, and each connection turned into the SAs
//! the daemon installs.
//!
//! The only I/O here is reading the configuration file and the key files it
//! names. Every error names the file, the TOML key path
//! (`connection[1].esp.enc_in`, indices from 0, plus the connection's name),
//! the line and column, and the reason. Keys are kept in [`Zeroizing`]
//! buffers and never appear in `Debug` output or error messages.
//!
//! The map of the crate:
//! - [`schema`], the file as written (serde, both ways);
//! - [`diag`], diagnostics and their positions;
//! - [`gateway`], `[gateway]`;
//! - [`connection`], `[[connection]]`, its keying, the checks across
//!   connections;
//! - [`sa`], manual SA pairs and their keys, lifetimes, selectors;
//! - [`ike`], `[connection.ike]`;
//! - [`keygen`], `espgate keygen`.
//!
//! The schema is documented key by key in `docs/CONFIG.md`.
//!
//! [`Zeroizing`]: zeroize::Zeroizing

pub mod cluster;
pub mod connection;
pub mod diag;
mod files;
pub mod gateway;
pub mod ike;
pub mod keygen;
pub mod sa;
pub mod schema;

pub use cluster::Cluster;
pub use connection::{
    ChildSelectors, Connection, ConnectionSas, Ecn, IpProto, Keying, ManualKeys, MssClamp,
};
pub use diag::{ConfigError, Diagnostic};
pub use gateway::{Gateway, IfAddr};
pub use ike::{DEFAULT_ESP_PROPOSALS, DEFAULT_IKE_PROPOSALS};
pub use sa::{KeyText, ManualSa};
pub use schema::{Dscp, Encapsulation, LogLevel, Protocols};

use diag::Validator;
use files::{group_other_readable, read_secret_text, MAX_CONFIG_BYTES};
use schema::{value, ConfigFile};
use std::path::Path;

/// A configuration file, parsed and validated.
#[derive(Debug)]
pub struct LoadedConfig {
    /// The file name used in messages (the path given to [`load`]).
    pub source: String,
    /// The `[gateway]` table.
    pub gateway: Gateway,
    /// The `[[connection]]` tables, in file order.
    pub connections: Vec<Connection>,
    /// `[cluster]`, when this gateway is a cluster node.
    pub cluster: Option<Cluster>,
    /// Problems that do not stop the gateway (for example a key file
    /// readable by other users); the daemon should log them.
    pub warnings: Vec<String>,
}

impl LoadedConfig {
    /// The connection called `name`.
    pub fn connection(&self, name: &str) -> Option<&Connection> {
        self.connections.iter().find(|c| c.name == name)
    }

    /// The effective configuration: the file that says exactly this
    /// configuration, every default filled in, keys as `keys` says.
    pub fn effective(&self, keys: KeyText) -> ConfigFile {
        ConfigFile {
            gateway: Some(value(self.gateway.to_table())),
            connection: self
                .connections
                .iter()
                .map(|c| value(c.to_table(keys)))
                .collect(),
            cluster: self.cluster.as_ref().map(|c| value(c.to_table())),
        }
    }

    /// The effective configuration as TOML, keys redacted
    /// (`espgate config check`).
    pub fn effective_toml(&self) -> String {
        let head = format!(
            "# The effective configuration of {}: every default filled in, keys redacted.\n",
            self.source
        );
        let body = toml::to_string(&self.effective(KeyText::Redacted))
            .unwrap_or_else(|e| format!("# cannot write it as TOML: {e}\n"));
        head + &body
    }

    /// The effective configuration as JSON, keys redacted
    /// (`espgate config check --json`).
    pub fn effective_json(&self) -> String {
        serde_json::to_string_pretty(&self.effective(KeyText::Redacted))
            .unwrap_or_else(|e| format!("{{\"error\": \"cannot write it as JSON: {e}\"}}"))
    }
}

/// Reads and validates a configuration file. Key files are resolved
/// against the file's directory.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let name = path.display().to_string();
    let text = read_secret_text(path, MAX_CONFIG_BYTES)
        .map_err(|e| ConfigError::whole_file(&name, None, format!("cannot read the file: {e}")))?;
    let base = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let (mut cfg, inline_keys) = parse_inner(&text, base, &name)?;
    if inline_keys {
        if let Some(mode) = group_other_readable(path) {
            cfg.warnings.push(format!(
                "{name}: the file holds inline keys and is readable by group/others \
                 (mode {mode:04o}); chmod 600 it, or move the keys to key files"
            ));
        }
    }
    Ok(cfg)
}

/// Parses and validates configuration text. `base_dir` resolves relative
/// key-file and socket paths; `name` is the file name shown in messages.
pub fn parse(text: &str, base_dir: &Path, name: &str) -> Result<LoadedConfig, ConfigError> {
    parse_inner(text, base_dir, name).map(|(c, _)| c)
}

/// [`parse`], and whether a key was given inline.
fn parse_inner(
    text: &str,
    base_dir: &Path,
    name: &str,
) -> Result<(LoadedConfig, bool), ConfigError> {
    let file = schema::read(text, name)?;
    let mut v = Validator::new(base_dir);
    let result = validate(&mut v, &file);
    let inline_keys = v.inline_keys;
    let (errors, warnings) = v.finish(text);
    if !errors.is_empty() {
        return Err(ConfigError {
            file: name.to_string(),
            diagnostics: errors,
        });
    }
    let (gateway, connections, cluster) = result.expect("no errors means a result");
    Ok((
        LoadedConfig {
            source: name.to_string(),
            gateway,
            connections,
            cluster,
            warnings: warnings.iter().map(|d| d.render(name)).collect(),
        },
        inline_keys,
    ))
}

/// Checks the whole file: the gateway, each connection, then the
/// connections against the gateway and against each other.
fn validate(
    v: &mut Validator,
    file: &ConfigFile,
) -> Option<(Gateway, Vec<Connection>, Option<Cluster>)> {
    let gt = file.gateway.as_ref();
    let gateway = gateway::validate(v, gt);
    connection::duplicate_names(v, &file.connection);
    let mut conns = Vec::new();
    let mut all_ok = true;
    for (i, t) in file.connection.iter().enumerate() {
        match connection::validate(v, i, t, gateway.as_ref()) {
            Some(c) => conns.push((i, c)),
            None => all_ok = false,
        }
    }
    if conns.is_empty() && all_ok {
        v.warn(
            diag::At::root(),
            "no [[connection]]: the gateway will carry no traffic",
        );
    }
    if let Some(g) = &gateway {
        connection::gateway_vs_connections(v, g, gt, &conns, &file.connection);
    }
    connection::across_connections(v, &conns, &file.connection);
    let cluster = match &file.cluster {
        Some(t) => {
            let c = cluster::validate(v, t);
            if let Some(g) = &gateway {
                cluster::against_the_rest(v, t, g, gt, &conns, &file.connection);
            }
            Some(c?)
        }
        None => None,
    };
    let gateway = gateway?;
    all_ok.then(|| {
        (
            gateway,
            conns.into_iter().map(|(_, c)| c).collect(),
            cluster,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sa::decode_hex;
    use crate::test_util::*;
    use espgate_core::sa::{Encap, Lifetime, Mode, Protocol, Sa};
    use espgate_core::selector::Prefix;
    use espgate_core::wire::proto;
    use std::time::Duration;

    #[test]
    fn minimal_config_defaults() {
        let c = parse_str(&minimal()).unwrap();
        let g = &c.gateway;
        assert_eq!(g.tun, "espgate0");
        assert_eq!(g.listen, "0.0.0.0:4500".parse().unwrap());
        assert_eq!(g.encap, Encapsulation::Udp);
        assert_eq!((g.workers, g.mtu, g.log), (1, 1500, LogLevel::Info));
        assert_eq!(g.control_socket, Path::new("/run/espgate/espgate.sock"));
        assert_eq!(g.state_dir, Path::new("/var/lib/espgate"));
        assert_eq!((g.metrics, g.fwmark), (None, None));
        assert!(g.offloads && !g.cost_accounting);
        assert_eq!((g.batch, g.socket_buffer), (64, 4 << 20));
        assert_eq!(g.ike_fragment_size, 1200);
        let b = c.connection("b").unwrap();
        assert_eq!(b.remote_port, 4500);
        assert_eq!(b.local_port, 4500);
        assert_eq!(b.mode, Mode::Tunnel);
        assert_eq!(b.protocol(), Protocols::Esp);
        assert_eq!(b.encap, Encapsulation::Udp);
        assert_eq!(b.proto, IpProto::Any);
        assert!(b.routes && b.fragment_inner && !b.esn && !b.allow_insecure);
        assert_eq!(b.mss_clamp, MssClamp::Auto);
        assert_eq!((b.dscp, b.ecn), (Dscp::Copy, Ecn::Normal));
        assert_eq!(b.replay_window, 1024);
        assert_eq!(b.tfc_pad_to, None);
        assert_eq!(b.lifetime, Lifetime::default());
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn examples_load_and_convert() {
        let dir = examples_dir();
        let mut seen = 0;
        for name in [
            "site-to-site.toml",
            "host-to-host.toml",
            "esp-ah-bundle.toml",
        ] {
            let c = load(&dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
            assert!(!c.connections.is_empty(), "{name}");
            for w in &c.warnings {
                // Only permission warnings (git checks files out as 0644).
                assert!(w.contains("chmod 600"), "{name}: unexpected warning {w}");
            }
            for conn in &c.connections {
                let sas = conn.sa_configs();
                let n =
                    usize::from(conn.protocol().has_esp()) + usize::from(conn.protocol().has_ah());
                assert_eq!((sas.inbound.len(), sas.outbound.len()), (n, n), "{name}");
                for cfg in sas.inbound.iter().chain(&sas.outbound) {
                    Sa::new(cfg.clone(), Duration::ZERO).unwrap();
                    cfg.validate_outbound().unwrap();
                }
            }
            seen += 1;
        }
        assert_eq!(seen, 3);

        let s = load(&dir.join("site-to-site.toml")).unwrap();
        let b = s.connection("site-b").unwrap();
        assert_eq!(b.esp().unwrap().enc_in.len(), 36);
        assert_eq!(s.gateway.workers, 0);
        assert!(s.gateway.worker_threads() >= 1);
        assert_eq!(s.gateway.metrics, Some("127.0.0.1:9184".parse().unwrap()));
        // IPv4 and IPv6 inner traffic: two selectors, not four.
        assert_eq!(b.selectors().len(), 2);
        assert_eq!(b.lifetime.soft_bytes, Some(4 << 40));
        assert_eq!(b.lifetime.soft_time, Some(Duration::from_secs(30 * 86400)));

        let h = load(&dir.join("host-to-host.toml")).unwrap();
        let d = &h.connections[0];
        assert_eq!(d.mode, Mode::Transport);
        assert_eq!(h.gateway.fwmark, Some(0x4500));
        assert_eq!(
            d.local_ts,
            vec![Prefix::host("2001:db8::1".parse().unwrap())]
        );
        assert_eq!(
            d.remote_ts,
            vec![Prefix::host("2001:db8::2".parse().unwrap())]
        );
        let sas = d.sa_configs();
        assert_eq!(sas.outbound[0].encap, Encap::None);
        assert_eq!(sas.outbound[0].tunnel_src, None);

        let bundle = load(&dir.join("esp-ah-bundle.toml")).unwrap();
        let lab = bundle.connection("lab-b").unwrap();
        let sas = lab.sa_configs();
        let protos: Vec<_> = sas.outbound.iter().map(|c| (c.protocol, c.mode)).collect();
        assert_eq!(
            protos,
            [
                (Protocol::Esp, Mode::Tunnel),
                (Protocol::Ah, Mode::Transport)
            ]
        );
        let mgmt = bundle.connection("mgmt").unwrap();
        assert_eq!(mgmt.ah().unwrap().integ_in.len(), 64); // split over two lines
        assert_eq!(mgmt.selectors()[0].proto, Some(proto::TCP));
        assert!(!mgmt.sa_configs().outbound[0].copy_dscp);
    }

    #[test]
    fn unknown_keys_are_refused_with_their_path() {
        let e = err(&format!("[gateway]\ncolour = \"red\"\n{}", minimal()));
        assert_has(
            &e,
            &["test.toml:2:1", "gateway.colour", "unknown field `colour`"],
        );
        let e = err(&minimal().replace("name = \"b\"", "name = \"b\"\nremote_prot = 1"));
        assert_has(
            &e,
            &[
                "connection[0].remote_prot",
                "(connection \"b\")",
                "unknown field",
            ],
        );
        let e = err(&minimal().replace("suite =", "enc = \"00\"\nsuite ="));
        assert_has(&e, &["connection[0].esp.enc", "unknown field `enc`"]);
        let e = err(&format!("{}\n[connection.lifetime]\nsoft = 1\n", minimal()));
        assert_has(&e, &["connection[0].lifetime.soft", "unknown field `soft`"]);
        let e = err(&format!("{}\n[extra]\n", minimal()));
        assert_has(&e, &["extra", "unknown field `extra`"]);
    }

    #[test]
    fn wrong_types_name_the_key() {
        let e = err(&format!("[gateway]\nmtu = \"big\"\n{}", minimal()));
        assert_has(&e, &["test.toml:2:7", "gateway.mtu", "invalid type"]);
        let e = err(&minimal().replace("name = \"b\"", "name = \"b\"\nesn = \"yes\""));
        assert_has(
            &e,
            &["connection[0].esn", "invalid type", "expected a boolean"],
        );
        let e = err(&minimal().replace("name = \"b\"", "name = \"b\"\nmode = \"tunel\""));
        assert_has(
            &e,
            &["connection[0].mode", "unknown variant `tunel`", "`tunnel`"],
        );
        let e = err(&minimal().replace("name = \"b\"", "name = \"b\"\nencap = \"tcp\""));
        assert_has(&e, &["connection[0].encap", "unknown variant `tcp`"]);
        let e = err(&format!("[gateway]\nlog = \"loud\"\n{}", minimal()));
        assert_has(&e, &["gateway.log", "unknown variant `loud`"]);
        let e = err(&minimal().replace("name = \"b\"\n", ""));
        assert_has(&e, &["connection[0]", "missing field `name`"]);
        let e = err(&minimal().replace("spi_in = 0x1001\n", ""));
        assert_has(&e, &["connection[0].esp", "missing field `spi_in`"]);
        let e = err("[gateway\n");
        assert_has(&e, &["test.toml:1:", "TOML syntax"]);
        let e = err(&format!("gateway = 5\n{}", minimal()));
        assert_has(
            &e,
            &["test.toml:1:11: gateway: invalid type: integer `5`, expected a table"],
        );
        assert!(!e.contains("GatewayTable"), "{e}");
        let e = err("connection = [1]\n");
        assert_has(&e, &["test.toml:1:15: connection[0]", "expected a table"]);
    }

    #[test]
    fn several_errors_at_once_in_file_order_with_positions() {
        let text = format!(
            "{}{}",
            conn("b", "", &good_esp(0x10, 0x1002)),
            conn("c", "", &good_esp(0x2001, 0x20)).replace("192.0.2.2", "192.0.2.3")
        );
        let e = parse_str(&text).unwrap_err();
        assert_eq!(e.diagnostics.len(), 2, "{e}");
        let s = e.to_string();
        assert!(s.starts_with("2 errors in test.toml:\n"), "{s}");
        assert_eq!(e.diagnostics[0].path, "connection[0].esp.spi_in");
        assert_eq!(e.diagnostics[0].connection.as_deref(), Some("b"));
        let line = text
            .lines()
            .position(|l| l.starts_with("spi_in = 0x10"))
            .unwrap()
            + 1;
        assert_eq!(e.diagnostics[0].position, Some((line, 10)));
        assert_has(&s, &[&format!("test.toml:{line}:10: connection[0].esp.spi_in (connection \"b\"): SPI 0x10 is reserved")]);
        assert_eq!(e.diagnostics[1].path, "connection[1].esp.spi_out");
    }

    #[test]
    fn empty_file_warns_and_load_errors_name_the_file() {
        let c = parse_str("").unwrap();
        assert!(c.connections.is_empty());
        assert_has(&c.warnings.join("\n"), &["no [[connection]]"]);
        let e = load(Path::new("/nonexistent/espgate.toml")).unwrap_err();
        assert_has(
            &e.to_string(),
            &["/nonexistent/espgate.toml: cannot read the file"],
        );
    }

    #[test]
    fn secrets_never_in_debug_or_errors() {
        let c = parse_str(&minimal()).unwrap();
        let dbg = format!("{c:?} {c:#?} {:?}", c.connections[0].sa_configs());
        for k in [K20A, K20B, &K20A[..8], &K20B[..8]] {
            assert!(!dbg.contains(k), "key material in Debug output");
        }
        let key = decode_hex(K20A).unwrap();
        assert!(
            !dbg.contains(&format!("{:?}", &key[..4])),
            "key bytes in Debug output"
        );
        assert!(dbg.contains("<redacted>"));
        let e = err(&minimal().replace(K20A, &K20A[..30]));
        assert!(!e.contains(&K20A[..30]), "{e}");
        let e = parse_str(&minimal().replace(K20A, &K20A[..30])).unwrap_err();
        assert!(!format!("{e:?}").contains(&K20A[..30]));
    }

    #[test]
    fn effective_configuration_has_every_default_and_round_trips() {
        let c = parse_str(&minimal()).unwrap();
        let t = c.effective_toml();
        assert!(
            t.starts_with("# The effective configuration of test.toml"),
            "{t}"
        );
        let v: toml::Table = toml::from_str(&t).unwrap();
        let g = &v["gateway"];
        assert_eq!(
            g["control_socket"].as_str(),
            Some("/run/espgate/espgate.sock")
        );
        assert_eq!(g["state_dir"].as_str(), Some("/var/lib/espgate"));
        assert_eq!(g["listen"].as_str(), Some("0.0.0.0:4500"));
        assert_eq!(g["mtu"].as_integer(), Some(1500));
        assert_eq!(g["log"].as_str(), Some("info"));
        let b = &v["connection"][0];
        assert_eq!(b["remote_port"].as_integer(), Some(4500));
        assert_eq!(b["mode"].as_str(), Some("tunnel"));
        assert_eq!(b["protocol"].as_str(), Some("esp"));
        assert_eq!(b["replay_window"].as_integer(), Some(1024));
        assert_eq!(b["mss_clamp"].as_str(), Some("auto"));
        assert_eq!(b["lifetime"]["hard_time"].as_str(), Some("0s"));
        assert_eq!(b["esp"]["spi_in"].as_integer(), Some(0x1001));
        // Keys are redacted, in TOML and in JSON.
        assert_eq!(b["esp"]["enc_in"].as_str(), Some("<redacted>"));
        assert!(
            b["esp"].get("integ_in").is_none(),
            "aes128gcm16 has no integrity key"
        );
        let j: serde_json::Value = serde_json::from_str(&c.effective_json()).unwrap();
        assert_eq!(j["connection"][0]["esp"]["enc_out"], "<redacted>");
        assert_eq!(j["gateway"]["control_socket"], "/run/espgate/espgate.sock");
        for out in [t, c.effective_json()] {
            for k in [K20A, K20B, &K20A[..8]] {
                assert!(!out.contains(k), "a key in:\n{out}");
            }
        }
        // A redacted key is refused, not taken for a key.
        assert_has(
            &err(&c.effective_toml()),
            &["connection[0].esp.enc_in", "not hex: character 1"],
        );
        // With the keys, it loads to the same configuration.
        crate::assert_effective_round_trips(&c, Path::new("/nonexistent"));
        for name in [
            "site-to-site.toml",
            "host-to-host.toml",
            "esp-ah-bundle.toml",
        ] {
            let c = load(&examples_dir().join(name)).unwrap_or_else(|e| panic!("{e}"));
            crate::assert_effective_round_trips(&c, &examples_dir());
        }
    }

    #[test]
    fn schema_tables_written_by_tools_load() {
        use crate::schema::{value, ConnectionTable, GatewayTable, SaTable, SecretHex};
        use zeroize::Zeroizing;
        let mut c = ConnectionTable::new("tool", "192.0.2.1", "192.0.2.2");
        c.local_ts = Some(value(vec![value("10.1.0.0/16".to_string())]));
        c.remote_ts = Some(value(vec![value("10.2.0.0/16".to_string())]));
        let mut esp = SaTable::new("aes128gcm16", 0x1001, 0x1002);
        esp.enc_in = Some(value(SecretHex::new(Zeroizing::new(K20A.to_string()))));
        esp.enc_out = Some(value(SecretHex::new(Zeroizing::new(K20B.to_string()))));
        let dbg = format!("{esp:?}");
        assert!(
            dbg.contains("<redacted>") && !dbg.contains(&K20A[..8]),
            "{dbg}"
        );
        c.esp = Some(value(esp));
        let file = schema::ConfigFile {
            gateway: Some(value(GatewayTable {
                mtu: Some(value(1400)),
                ..GatewayTable::default()
            })),
            connection: vec![value(c)],
            cluster: None,
        };
        let text = toml::to_string(&file).unwrap();
        assert!(text.contains(K20A), "a tool's file needs its keys:\n{text}");
        let loaded = parse_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(loaded.gateway.mtu, 1400);
        let esp = loaded.connections[0].esp().unwrap();
        assert_eq!((esp.spi_in, esp.enc_out.len()), (0x1001, 20));
    }
}

/// The effective configuration of `c`, with its keys, loaded again from
/// `base_dir`: it must say the same thing.
#[cfg(test)]
pub(crate) fn assert_effective_round_trips(c: &LoadedConfig, base_dir: &Path) {
    let text = toml::to_string(&c.effective(KeyText::Hex)).unwrap();
    let again = parse(&text, base_dir, "effective.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(again.warnings.is_empty(), "{:?}\n{text}", again.warnings);
    assert_eq!(again.gateway, c.gateway);
    assert_eq!(
        format!("{:?}", again.connections),
        format!("{:?}", c.connections)
    );
    for (a, b) in again.connections.iter().zip(&c.connections) {
        let (sa, sb) = (a.sa_configs(), b.sa_configs());
        for (x, y) in sa
            .outbound
            .iter()
            .chain(&sa.inbound)
            .zip(sb.outbound.iter().chain(&sb.inbound))
        {
            assert_eq!(
                (x.spi, &x.enc_key, &x.integ_key),
                (y.spi, &y.enc_key, &y.integ_key)
            );
        }
        assert_eq!(
            format!("{:?}", a.ike_config()),
            format!("{:?}", b.ike_config())
        );
    }
}

/// What the tests of every part share: example files, small
/// configurations, and assertions on messages.
#[cfg(test)]
pub(crate) mod test_util {
    pub use crate::{parse, ConfigError, LoadedConfig};
    pub use std::path::{Path, PathBuf};

    /// A 20-byte key (an aes128gcm16 key with its salt), as hex.
    pub const K20A: &str = "000102030405060708090a0b0c0d0e0f10111213";
    /// Another one.
    pub const K20B: &str = "101112131415161718191a1b1c1d1e1f20212223";

    pub fn examples_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
    }

    /// A fresh empty directory under the system temp dir.
    pub fn temp_dir() -> PathBuf {
        espgate_testkit::temp_dir("config-test")
    }

    pub fn parse_str(text: &str) -> Result<LoadedConfig, ConfigError> {
        parse(text, Path::new("/nonexistent"), "test.toml")
    }

    pub fn err(text: &str) -> String {
        match parse_str(text) {
            Ok(c) => panic!("expected an error, got {c:#?}"),
            Err(e) => e.to_string(),
        }
    }

    pub fn assert_has(msg: &str, parts: &[&str]) {
        for p in parts {
            assert!(msg.contains(p), "{p:?} not in:\n{msg}");
        }
    }

    /// One tunnel-mode ESP connection; `extra` goes into the connection
    /// table, `esp` into its ESP table.
    pub fn conn(name: &str, extra: &str, esp: &str) -> String {
        format!(
            r#"
[[connection]]
name = "{name}"
local = "192.0.2.1"
remote = "192.0.2.2"
local_ts = ["10.1.0.0/16"]
remote_ts = ["10.2.0.0/16"]
{extra}

[connection.esp]
suite = "aes128gcm16"
{esp}
"#
        )
    }

    pub fn good_esp(spi_in: u32, spi_out: u32) -> String {
        format!(
            "spi_in = {spi_in:#x}\nspi_out = {spi_out:#x}\nenc_in = \"{K20A}\"\nenc_out = \"{K20B}\""
        )
    }

    pub fn minimal() -> String {
        conn("b", "", &good_esp(0x1001, 0x1002))
    }

    /// One transport-mode AH connection; `extra` goes into its table.
    pub fn ah_conn(extra: &str) -> String {
        format!(
            r#"
[[connection]]
name = "a"
local = "192.0.2.1"
remote = "192.0.2.2"
mode = "transport"
protocol = "ah"
{extra}
[connection.ah]
suite = "sha1"
spi_in = 0x3001
spi_out = 0x3002
integ_in = "{K20A}"
integ_out = "{K20B}"
"#
        )
    }
}
