//! The one-line SA description used by `espgate pcap` and `espgate sa add`:
//!
//! `spi=0x…,suite=aes128gcm16,enc=HEX[,integ=HEX][,mode=tunnel|transport]`
//! `[,encap=udp|none][,src=IP,dst=IP][,esn=yes][,seq=N][,proto=esp|ah|qesp]`
//! `[,ipproto=N][,window=N][,sport=N][,dport=N][,tfc=N][,allow_insecure=yes]`
//!
//! `ipproto` is the IP protocol number of Q-ESP (default 253).

use super::{Encap, Mode, Protocol, SaConfig};
use crate::crypto::Suite;
use crate::wire::udp::NAT_T_PORT;
use std::net::IpAddr;
use zeroize::Zeroizing;

fn parse_u64(key: &str, v: &str) -> Result<u64, String> {
    let r = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse(),
    };
    r.map_err(|_| format!("{key}: '{v}' is not a number"))
}

fn parse_bool(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "yes" | "true" | "1" | "on" => Ok(true),
        "no" | "false" | "0" | "off" => Ok(false),
        _ => Err(format!("{key}: expected yes or no, got '{v}'")),
    }
}

/// Decodes the key `v` (hex digits, optionally `0x`-prefixed, `:` allowed
/// between them). Every copy of key material is `Zeroizing`, and errors
/// say what is wrong without quoting any of `v`.
fn parse_key(key: &str, value: &str) -> Result<Zeroizing<Vec<u8>>, String> {
    let v = value.strip_prefix("0x").unwrap_or(value);
    let mut digits = Zeroizing::new(Vec::with_capacity(v.len()));
    digits.extend(v.bytes().filter(|b| *b != b':'));
    let mut out = Zeroizing::new(vec![0u8; digits.len() / 2]);
    match hex::decode_to_slice(&digits[..], &mut out[..]) {
        Ok(()) => Ok(out),
        Err(hex::FromHexError::OddLength) => Err(format!(
            "{key}: odd number of hex digits ({})",
            digits.len()
        )),
        Err(hex::FromHexError::InvalidHexCharacter { index, .. }) => {
            // `index` counts digits; report the character position in the
            // value as written (1-based, prefix and separators included).
            let prefix = value.len() - v.len();
            let at = v
                .bytes()
                .enumerate()
                .filter(|(_, b)| *b != b':')
                .nth(index)
                .map_or(v.len(), |(i, _)| i)
                + prefix;
            let pos = value.get(..at).map_or(at, |s| s.chars().count()) + 1;
            Err(format!("{key}: not a hex digit at position {pos}"))
        }
        Err(hex::FromHexError::InvalidStringLength) => {
            Err(format!("{key}: {} hex digits do not decode", digits.len()))
        }
    }
}

/// Parses an SA spec. Errors name the offending key; they never quote a
/// key's value (nor an item that is not `key=value`, which may be one).
pub fn parse(spec: &str) -> Result<SaConfig, String> {
    let mut spi = None;
    let mut suite: Option<Suite> = None;
    let mut enc = Zeroizing::new(Vec::new());
    let mut integ = Zeroizing::new(Vec::new());
    let mut mode = Mode::Tunnel;
    let mut udp = false;
    let mut src = None;
    let mut dst = None;
    let mut esn = false;
    let mut seq = 1u64;
    let mut ipproto: Option<u8> = None;
    let mut protocol = Protocol::Esp;
    let mut window = 1024u32;
    let mut sport = NAT_T_PORT;
    let mut dport = NAT_T_PORT;
    let mut tfc = None;
    let mut insecure = false;
    let items = spec.split(',').map(str::trim).filter(|s| !s.is_empty());
    for (n, item) in items.enumerate() {
        // Not quoted: a mistyped `enc`/`integ` item is key material.
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("item {} is not key=value", n + 1))?;
        let (k, v) = (k.trim(), v.trim());
        match k {
            "spi" => {
                let n = parse_u64(k, v)?;
                spi = Some(u32::try_from(n).map_err(|_| format!("spi: {v} does not fit 32 bits"))?);
            }
            "suite" => suite = Some(v.parse().map_err(|e| format!("suite: {e}"))?),
            "enc" => enc = parse_key(k, v)?,
            "integ" | "auth" => integ = parse_key(k, v)?,
            "mode" => {
                mode = match v {
                    "tunnel" => Mode::Tunnel,
                    "transport" => Mode::Transport,
                    _ => return Err(format!("mode: expected tunnel or transport, got '{v}'")),
                }
            }
            "encap" => {
                udp = match v {
                    "udp" => true,
                    "none" | "no" => false,
                    _ => return Err(format!("encap: expected udp or none, got '{v}'")),
                }
            }
            "src" => {
                src = Some(
                    v.parse::<IpAddr>()
                        .map_err(|_| format!("src: '{v}' is not an IP address"))?,
                )
            }
            "dst" => {
                dst = Some(
                    v.parse::<IpAddr>()
                        .map_err(|_| format!("dst: '{v}' is not an IP address"))?,
                )
            }
            "esn" => esn = parse_bool(k, v)?,
            "seq" => seq = parse_u64(k, v)?,
            "proto" => {
                protocol = Protocol::from_name(v)
                    .ok_or_else(|| format!("proto: expected esp, ah or qesp, got '{v}'"))?
            }
            "window" => {
                window =
                    u32::try_from(parse_u64(k, v)?).map_err(|_| "window: too large".to_string())?;
                if window > super::replay::MAX_WINDOW {
                    return Err(format!("window: at most {}", super::replay::MAX_WINDOW));
                }
            }
            "sport" => {
                sport =
                    u16::try_from(parse_u64(k, v)?).map_err(|_| "sport: not a port".to_string())?
            }
            "dport" => {
                dport =
                    u16::try_from(parse_u64(k, v)?).map_err(|_| "dport: not a port".to_string())?
            }
            "tfc" => {
                tfc = Some(
                    u16::try_from(parse_u64(k, v)?).map_err(|_| "tfc: too large".to_string())?,
                )
            }
            "allow_insecure" => insecure = parse_bool(k, v)?,
            "ipproto" => {
                ipproto = Some(
                    u8::try_from(parse_u64(k, v)?)
                        .map_err(|_| "ipproto: not an IP protocol number".to_string())?,
                )
            }
            _ => return Err(format!("unknown key '{k}'")),
        }
    }
    let spi = spi.ok_or("spi is required")?;
    let suite = suite.ok_or("suite is required")?;
    if src.is_some() != dst.is_some() {
        return Err("src and dst go together".into());
    }
    let mut cfg = SaConfig::new(spi, protocol, suite, &enc, &integ);
    cfg.mode = mode;
    cfg.encap = if udp {
        Encap::Udp {
            src_port: sport,
            dst_port: dport,
        }
    } else {
        Encap::None
    };
    cfg.tunnel_src = src;
    cfg.tunnel_dst = dst;
    cfg.esn = esn;
    cfg.initial_seq = seq;
    cfg.replay_window = window;
    cfg.tfc_pad_to = tfc;
    cfg.allow_insecure = insecure;
    if let Some(n) = ipproto {
        if protocol != Protocol::Qesp {
            return Err("ipproto: only Q-ESP (proto=qesp) takes another IP protocol number".into());
        }
        cfg.ip_protocol = n;
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_spec() {
        let c = parse("spi=0x1000,suite=aes128gcm16,enc=000102030405060708090a0b0c0d0e0f10111213,mode=transport,encap=udp,src=10.0.0.1,dst=10.0.0.2,esn=yes,seq=0x100000000").unwrap();
        assert_eq!(c.spi, 0x1000);
        assert_eq!(c.enc_key.len(), 20);
        assert_eq!(c.mode, Mode::Transport);
        assert_eq!(c.encap, Encap::NAT_T);
        assert!(c.esn);
        assert_eq!(c.initial_seq, 1 << 32);
    }

    #[test]
    fn qesp_specs() {
        let c = parse(
            "spi=0x1000,suite=aes128gcm16,enc=000102030405060708090a0b0c0d0e0f10111213,proto=qesp",
        )
        .unwrap();
        assert_eq!((c.protocol, c.ip_protocol), (Protocol::Qesp, 253));
        let c = parse("spi=0x1000,suite=aes128gcm16,enc=000102030405060708090a0b0c0d0e0f10111213,proto=qesp,ipproto=254").unwrap();
        assert_eq!(c.ip_protocol, 254);
        assert!(parse("spi=0x1000,suite=aes128gcm16,proto=esp,ipproto=254")
            .unwrap_err()
            .starts_with("ipproto:"));
        assert!(parse("spi=0x1000,suite=aes128gcm16,proto=qesp,ipproto=999")
            .unwrap_err()
            .starts_with("ipproto:"));
        assert!(parse("spi=0x1000,suite=aes128gcm16,proto=x")
            .unwrap_err()
            .contains("qesp"));
    }

    #[test]
    fn errors_name_the_key() {
        assert!(parse("suite=aes128gcm16").unwrap_err().contains("spi"));
        assert!(parse("spi=0x1000,suite=foo")
            .unwrap_err()
            .starts_with("suite:"));
        assert!(parse("spi=0x1000,suite=aes128gcm16,enc=zz")
            .unwrap_err()
            .starts_with("enc:"));
        assert!(parse("spi=0x1000,suite=aes128gcm16,mode=x")
            .unwrap_err()
            .starts_with("mode:"));
        assert!(parse("spi=0x1000,suite=aes128gcm16,colour=red")
            .unwrap_err()
            .contains("colour"));
        assert!(parse("spi=0x1000,suite=aes128gcm16,src=1.2.3.4")
            .unwrap_err()
            .contains("together"));
        assert!(parse("spi=0x100000000,suite=aes128gcm16")
            .unwrap_err()
            .starts_with("spi:"));
    }

    #[test]
    fn key_errors_never_quote_the_key() {
        let secret = "00112233445566778899aabbccddeeff";
        let cases = [
            (
                format!("enc={secret}zz001122"),
                "enc: not a hex digit at position 33",
            ),
            (
                format!("enc=0x{secret}:g1"),
                "enc: not a hex digit at position 36",
            ),
            (
                format!("enc={secret}0"),
                "enc: odd number of hex digits (33)",
            ),
            (
                format!("integ={secret}\u{e9}"),
                "integ: not a hex digit at position 33",
            ),
            (
                format!("auth={secret}x"),
                "auth: odd number of hex digits (33)",
            ),
            (format!("enc{secret}"), "item 3 is not key=value"),
        ];
        for (item, want) in cases {
            let spec = format!("spi=0x1000,suite=aes128gcm16,{item},mode=tunnel");
            let e = parse(&spec).unwrap_err();
            assert_eq!(e, want, "{item}");
            // No run of the key's digits, however short, is echoed back.
            for w in secret.as_bytes().windows(6) {
                assert!(!e.contains(std::str::from_utf8(w).unwrap()), "{e}");
            }
        }
        // Separators and the 0x prefix are fine.
        let c =
            parse("spi=0x1000,suite=aes128gcm16,enc=0x0001:0203:0405060708090a0b0c0d0e0f10111213")
                .unwrap();
        assert_eq!(&c.enc_key[..], &(0..20).collect::<Vec<u8>>()[..]);
    }

    #[test]
    fn non_ascii_hex_is_an_error_not_a_panic() {
        // Found by fuzzing: a multi-byte character used to split a char.
        let e = parse("spi=0x1000,suite=aes128gcm16,enc=0\u{e9}0").unwrap_err();
        assert!(e.starts_with("enc:"), "{e}");
    }
}
