//! `espgate wireshark-keys`: the running daemon's ESP SAs in Wireshark's
//! `esp_sa` table (a "UAT" file in a Wireshark profile), or as the
//! `-o uat:esp_sa:…` arguments tshark takes.
//!
//! The format is the one of Wireshark 4.0 (Debian bookworm), checked
//! against its tshark: eight quoted columns per SA — address family
//! (`IPv4` / `IPv6`), source, destination, SPI, encryption algorithm,
//! encryption key, authentication algorithm, authentication key — with
//! the algorithm names exactly as Wireshark spells them (below) and keys as
//! `0x…` hex (for AES-GCM the key followed by its 4-byte salt, as espgate
//! holds it). `#` lines are comments. This version has no column for the
//! sequence number length: ESN SAs still decrypt, but Wireshark computes
//! their ICV over 32-bit sequence numbers and reports it as incorrect.
//!
//! Not decodable by Wireshark 4.0 and so never a row: ChaCha20-Poly1305
//! and AES-GMAC ESP (no such algorithm in its ESP table), and AH SAs — AH
//! does not encrypt, so Wireshark shows what it protects without keys.
//! The file output lists them as comment lines; the tshark output leaves
//! them out and the CLI says so on stderr.
//!
//! The key document itself comes from its own control command,
//! `{"cmd":"wireshark_keys"}`, never from `status` or `sa_list`.

use espgate_core::crypto::{Enc, Integ, Suite};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use zeroize::Zeroize;

/// UDP port Wireshark decodes as ESP-in-UDP without being told.
pub const WIRESHARK_NAT_T_PORT: u16 = 4500;

/// One installed SA with its keys (the `wireshark_keys` answer).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaKeys {
    /// Its connection.
    pub connection: String,
    /// `in` or `out`.
    pub direction: String,
    /// `esp` or `ah`.
    pub protocol: String,
    /// SPI.
    pub spi: u32,
    /// strongSwan keyword.
    pub suite: String,
    /// `tunnel` or `transport`.
    pub mode: String,
    /// Outer source address of its packets.
    pub src: String,
    /// Outer destination address of its packets.
    pub dst: String,
    /// UDP source port (ESP-in-UDP only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<u16>,
    /// UDP destination port (ESP-in-UDP only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<u16>,
    /// 64-bit sequence numbers.
    pub esn: bool,
    /// Encryption key in hex (with the salt for AEAD suites).
    pub enc_key: String,
    /// Integrity key in hex (empty for AEAD suites and AH-less ESP).
    pub integ_key: String,
}

impl std::fmt::Debug for SaKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaKeys")
            .field("connection", &self.connection)
            .field("direction", &self.direction)
            .field("protocol", &self.protocol)
            .field("spi", &format_args!("{:#010x}", self.spi))
            .field("suite", &self.suite)
            .finish_non_exhaustive()
    }
}

impl Drop for SaKeys {
    fn drop(&mut self) {
        self.enc_key.zeroize();
        self.integ_key.zeroize();
    }
}

impl SaKeys {
    /// "connection "to-b" in ESP SA 0x00001001 (aes128gcm16)".
    pub fn describe(&self) -> String {
        format!(
            "connection \"{}\" {} {} SA {:#010x} ({}{})",
            self.connection,
            self.direction,
            self.protocol.to_uppercase(),
            self.spi,
            self.suite,
            if self.esn { ", esn" } else { "" }
        )
    }
}

/// Wireshark 4.0's name for an ESP encryption algorithm, or why it has
/// none.
pub fn encryption_name(enc: Enc) -> Result<&'static str, &'static str> {
    match enc {
        Enc::Null => Ok("NULL"),
        Enc::AesCbc(_) => Ok("AES-CBC [RFC3602]"),
        Enc::AesGcm16(_) => Ok("AES-GCM with 16 octet ICV [RFC4106]"),
        Enc::TripleDes => Ok("TripleDES-CBC [RFC2451]"),
        Enc::Des => Ok("DES-CBC [RFC2405]"),
        Enc::ChaCha20Poly1305 => Err("Wireshark 4.0 cannot decrypt ChaCha20-Poly1305 ESP"),
        Enc::AesGmac(_) => Err("Wireshark 4.0 has no AES-GMAC (RFC 4543) for ESP"),
    }
}

/// Wireshark 4.0's name for an ESP integrity algorithm. AES-XCBC is not
/// in its table: the ICV is skipped unchecked (96 bits), the payload still
/// decrypts.
pub fn authentication_name(integ: Option<Integ>) -> &'static str {
    match integ {
        None => "NULL",
        Some(Integ::Sha1) => "HMAC-SHA-1-96 [RFC2404]",
        Some(Integ::Sha256) => "HMAC-SHA-256-128 [RFC4868]",
        Some(Integ::Sha384) => "HMAC-SHA-384-192 [RFC4868]",
        Some(Integ::Sha512) => "HMAC-SHA-512-256 [RFC4868]",
        Some(Integ::Md5) => "HMAC-MD5-96 [RFC2403]",
        Some(Integ::AesXcbc) => "ANY 96 bit authentication [no checking]",
    }
}

fn hex_field(h: &str) -> String {
    if h.is_empty() {
        String::new()
    } else {
        format!("0x{h}")
    }
}

/// The eight `esp_sa` columns of an SA (without quotes), or why Wireshark
/// cannot use it.
pub fn uat_fields(k: &SaKeys) -> Result<[String; 8], String> {
    match k.protocol.as_str() {
        "esp" => {}
        "qesp" => {
            return Err("Q-ESP is not ESP to Wireshark: dist/wireshark/qesp.lua shows its clear                         header; decrypt with `espgate pcap decrypt --sa …,proto=qesp`"
                .into())
        }
        _ => {
            return Err(
                "AH does not encrypt: Wireshark shows what it protects without keys".into(),
            )
        }
    }
    let suite: Suite = k
        .suite
        .parse()
        .map_err(|e| format!("unknown suite {}: {e}", k.suite))?;
    let enc = suite
        .enc
        .ok_or_else(|| format!("ESP suite {} has no encryption algorithm", k.suite))?;
    let enc_name = encryption_name(enc)?;
    let family = if k.src.contains(':') { "IPv6" } else { "IPv4" };
    Ok([
        family.to_string(),
        k.src.clone(),
        k.dst.clone(),
        format!("{:#010x}", k.spi),
        enc_name.to_string(),
        if enc == Enc::Null {
            "0x".to_string()
        } else {
            hex_field(&k.enc_key)
        },
        authentication_name(suite.integ).to_string(),
        hex_field(&k.integ_key),
    ])
}

/// One `esp_sa` line: the fields quoted and comma-separated.
pub fn uat_line(fields: &[String; 8]) -> String {
    fields
        .iter()
        .map(|f| format!("\"{f}\""))
        .collect::<Vec<_>>()
        .join(",")
}

/// UDP ports other than 4500 the SAs' ESP-in-UDP travels on: Wireshark
/// must be told to decode them as `udpencap`.
pub fn extra_udp_ports(keys: &[SaKeys]) -> Vec<u16> {
    let mut ports: Vec<u16> = keys
        .iter()
        .filter(|k| k.protocol == "esp")
        .flat_map(|k| [k.sport, k.dport])
        .flatten()
        .filter(|p| *p != WIRESHARK_NAT_T_PORT)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The `esp_sa` file: a header saying how to use it, one line per ESP SA
/// Wireshark can decrypt (preceded by a comment naming it), and a comment
/// line for each SA it cannot use.
pub fn render_file(keys: &[SaKeys], source: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# espgate wireshark-keys: the ESP SAs of the daemon on {source}.\n\
         # Wireshark 4.0 esp_sa format. Save as the file esp_sa in a Wireshark profile\n\
         # (~/.config/wireshark/profiles/NAME/esp_sa) and set, in that profile's\n\
         # preferences, esp.enable_encryption_decode: TRUE (and, to check ICVs,\n\
         # esp.enable_authentication_check: TRUE). These are live keys: keep the file private."
    );
    for p in extra_udp_ports(keys) {
        let _ = writeln!(
            out,
            "# ESP-in-UDP on port {p}: Decode As UDP port {p} -> UDPENCAP (tshark: -d udp.port=={p},udpencap)"
        );
    }
    if keys.iter().any(|k| k.esn && k.protocol == "esp") {
        let _ = writeln!(
            out,
            "# ESN SAs decrypt, but Wireshark 4.0 has no ESN column: their ICVs show as incorrect."
        );
    }
    for k in keys {
        match uat_fields(k) {
            Ok(f) => {
                let _ = writeln!(out, "# {}\n{}", k.describe(), uat_line(&f));
            }
            Err(why) => {
                let _ = writeln!(out, "# not listed: {}: {why}", k.describe());
            }
        }
    }
    out
}

/// Quotes one argument for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.,:/=@%+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The tshark arguments (ESP decryption and ICV checks on, `-d` for
/// ESP-in-UDP ports other than 4500, one `-o uat:esp_sa:…` per usable SA)
/// and a note per SA left out.
pub fn tshark_args(keys: &[SaKeys]) -> (Vec<String>, Vec<String>) {
    let mut args = vec![
        "-o".to_string(),
        "esp.enable_encryption_decode:TRUE".to_string(),
        "-o".to_string(),
        "esp.enable_authentication_check:TRUE".to_string(),
    ];
    for p in extra_udp_ports(keys) {
        args.push("-d".into());
        args.push(format!("udp.port=={p},udpencap"));
    }
    let mut notes = Vec::new();
    for k in keys {
        match uat_fields(k) {
            Ok(f) => {
                args.push("-o".into());
                args.push(format!("uat:esp_sa:{}", uat_line(&f)));
                if k.esn {
                    notes.push(format!(
                        "{}: ESN; Wireshark 4.0 decrypts it but reports its ICVs as incorrect",
                        k.describe()
                    ));
                }
            }
            Err(why) => notes.push(format!("left out {}: {why}", k.describe())),
        }
    }
    (args, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(suite: &str, protocol: &str, dir: &str) -> SaKeys {
        let (enc, integ) = match suite {
            "aes128gcm16" => ("00".repeat(20), String::new()),
            "aes256-sha1" => ("11".repeat(32), "22".repeat(20)),
            "null-sha256" => (String::new(), "33".repeat(32)),
            _ => ("44".repeat(36), String::new()),
        };
        SaKeys {
            connection: "to-b".into(),
            direction: dir.into(),
            protocol: protocol.into(),
            spi: 0x1001,
            suite: suite.into(),
            mode: "tunnel".into(),
            src: "192.0.2.1".into(),
            dst: "192.0.2.2".into(),
            sport: None,
            dport: None,
            esn: false,
            enc_key: enc,
            integ_key: integ,
        }
    }

    #[test]
    fn rows_use_wireshark_4_0_names() {
        let k = keys("aes128gcm16", "esp", "out");
        assert_eq!(
            uat_line(&uat_fields(&k).unwrap()),
            format!(
                "\"IPv4\",\"192.0.2.1\",\"192.0.2.2\",\"0x00001001\",\
                 \"AES-GCM with 16 octet ICV [RFC4106]\",\"0x{}\",\"NULL\",\"\"",
                "00".repeat(20)
            )
        );
        let f = uat_fields(&keys("aes256-sha1", "esp", "in")).unwrap();
        assert_eq!(f[4], "AES-CBC [RFC3602]");
        assert_eq!(f[6], "HMAC-SHA-1-96 [RFC2404]");
        assert_eq!(f[7], format!("0x{}", "22".repeat(20)));
        let f = uat_fields(&keys("null-sha256", "esp", "in")).unwrap();
        assert_eq!((f[4].as_str(), f[5].as_str()), ("NULL", "0x"));
        let mut v6 = keys("aes128gcm16", "esp", "in");
        v6.src = "2001:db8::2".into();
        v6.dst = "2001:db8::1".into();
        assert_eq!(uat_fields(&v6).unwrap()[0], "IPv6");
    }

    #[test]
    fn what_wireshark_cannot_decode_is_a_comment_or_a_note() {
        let all = vec![
            keys("aes128gcm16", "esp", "in"),
            keys("chacha20poly1305", "esp", "in"),
            keys("sha256", "ah", "out"),
        ];
        let file = render_file(&all, "/run/x.sock");
        let rows: Vec<&str> = file.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(rows.len(), 1, "{file}");
        assert!(file.contains("# not listed: connection \"to-b\" in ESP SA 0x00001001 (chacha20poly1305): Wireshark 4.0 cannot decrypt"), "{file}");
        assert!(
            file.contains("# not listed: connection \"to-b\" out AH SA"),
            "{file}"
        );
        let (args, notes) = tshark_args(&all);
        assert_eq!(
            args.iter().filter(|a| a.starts_with("uat:esp_sa:")).count(),
            1
        );
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(args.contains(&"esp.enable_encryption_decode:TRUE".to_string()));
    }

    #[test]
    fn qesp_sas_point_to_the_lua_dissector() {
        let e = uat_fields(&keys("aes128gcm16", "qesp", "in")).unwrap_err();
        assert!(e.contains("qesp.lua") && e.contains("proto=qesp"), "{e}");
    }

    #[test]
    fn other_udp_ports_get_a_decode_as() {
        let mut k = keys("aes128gcm16", "esp", "out");
        k.sport = Some(4500);
        k.dport = Some(4501);
        let (args, _) = tshark_args(std::slice::from_ref(&k));
        let i = args.iter().position(|a| a == "-d").unwrap();
        assert_eq!(args[i + 1], "udp.port==4501,udpencap");
        assert!(render_file(&[k], "s").contains("UDP port 4501 -> UDPENCAP"));
    }

    #[test]
    fn quoting_survives_a_shell() {
        assert_eq!(shell_quote("-o"), "-o");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
        let k = keys("aes256-sha1", "esp", "out");
        assert!(!format!("{k:?}").contains("1111"), "Debug shows no key");
    }
}
