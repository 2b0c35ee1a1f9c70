//! The parts of a connection that shape its SAs: a manually keyed SA pair
//! ([`ManualSa`], from `[connection.esp]` or `[connection.ah]`, keys in
//! [`Zeroizing`] buffers), the SA lifetime (`[connection.lifetime]`) and the
//! traffic selectors (`local_ts`, `remote_ts`).
//!
//! No message and no `Debug` output holds a key.

use crate::diag::{plural, span, At, Validator};
use crate::files::{group_other_readable, read_secret_text, MAX_KEY_FILE_BYTES};
use crate::schema::{format_duration, value, LifetimeTable, SaTable, Scalar, SecretHex};
use espgate_core::crypto::{Suite, SuiteError};
use espgate_core::sa::{Lifetime, Mode, Protocol};
use espgate_core::selector::Prefix;
use std::fmt;
use std::net::IpAddr;
use std::ops::Range;
use toml::Spanned;
use zeroize::Zeroizing;

/// One manually keyed SA pair (`[connection.esp]` or `[connection.ah]`).
#[derive(Clone)]
pub struct ManualSa {
    /// Algorithms.
    pub suite: Suite,
    /// SPI of the SA we receive on.
    pub spi_in: u32,
    /// SPI of the SA we send on.
    pub spi_out: u32,
    /// Inbound encryption key (with the salt for combined modes).
    pub enc_in: Zeroizing<Vec<u8>>,
    /// Outbound encryption key.
    pub enc_out: Zeroizing<Vec<u8>>,
    /// Inbound integrity key.
    pub integ_in: Zeroizing<Vec<u8>>,
    /// Outbound integrity key.
    pub integ_out: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for ManualSa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualSa")
            .field("suite", &self.suite.name())
            .field("spi_in", &format_args!("{:#010x}", self.spi_in))
            .field("spi_out", &format_args!("{:#010x}", self.spi_out))
            .field("keys", &SecretHex::REDACTED)
            .finish()
    }
}

/// How keys are written into a table made from a validated configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyText {
    /// As [`SecretHex::REDACTED`]: for showing to an operator.
    Redacted,
    /// As hex: for a configuration file that must work.
    Hex,
}

impl ManualSa {
    /// The table that says exactly this SA pair, with the keys inline as
    /// `keys` says (an empty key, one the suite does not take, is left out).
    pub fn to_table(&self, keys: KeyText) -> SaTable {
        let mut t = SaTable::new(&self.suite.name(), self.spi_in, self.spi_out);
        let key = |k: &Zeroizing<Vec<u8>>| {
            (!k.is_empty()).then(|| {
                value(match keys {
                    KeyText::Redacted => SecretHex::redacted(),
                    KeyText::Hex => SecretHex::new(Zeroizing::new(hex::encode(&k[..]))),
                })
            })
        };
        t.enc_in = key(&self.enc_in);
        t.enc_out = key(&self.enc_out);
        t.integ_in = key(&self.integ_in);
        t.integ_out = key(&self.integ_out);
        t
    }
}

/// Hex to bytes, skipping whitespace; an optional `0x` prefix is allowed.
/// Messages never quote the input.
pub(crate) fn decode_hex(s: &str) -> Result<Zeroizing<Vec<u8>>, String> {
    let t = s.trim_start();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    let mut digits = Zeroizing::new(String::with_capacity(t.len()));
    digits.extend(t.chars().filter(|c| !c.is_whitespace()));
    if let Some(i) = digits.chars().position(|c| !c.is_ascii_hexdigit()) {
        return Err(format!(
            "not hex: character {} is not a hex digit (0-9, a-f)",
            i + 1
        ));
    }
    if !digits.len().is_multiple_of(2) {
        return Err(format!(
            "not hex: odd number of hex digits ({})",
            digits.len()
        ));
    }
    let mut out = Zeroizing::new(vec![0u8; digits.len() / 2]);
    hex::decode_to_slice(digits.as_bytes(), &mut out[..]).map_err(|_| "not hex".to_string())?;
    Ok(out)
}

/// An SPI: 256 or above, 32 bits.
fn parse_spi(v: &Scalar) -> Result<u32, String> {
    let n = v.int()?;
    let spi = u32::try_from(n).map_err(|_| format!("{v} does not fit in 32 bits"))?;
    if spi < 256 {
        return Err(format!(
            "SPI {spi:#x} is reserved: SPIs 1-255 are reserved and 0 is invalid \
             (RFC 4301 §4.1); use 256 (0x100) or above"
        ));
    }
    Ok(spi)
}

fn suite_kind_hint() -> &'static str {
    "for example aes128gcm16, aes256gcm16, chacha20poly1305, aes128-sha256, or null-sha256 \
     for integrity only"
}

/// Checks one manual SA table (`at` is the table) and loads its keys.
pub(crate) fn manual_sa(
    v: &mut Validator,
    at: &At,
    protocol: Protocol,
    r: &SaTable,
    allow_insecure: bool,
) -> Option<ManualSa> {
    let before = v.error_count();
    let suite_at = at.key("suite", Some(r.suite.span()));
    let suite_text = r.suite.get_ref();
    let suite = match suite_text.parse::<Suite>() {
        Ok(s) => Some(s),
        Err(e) => {
            v.err(suite_at.clone(), e.to_string());
            None
        }
    };
    if let Some(s) = suite {
        match protocol {
            Protocol::Esp | Protocol::Qesp if s.enc.is_none() => v.err(
                suite_at,
                format!(
                    "\"{suite_text}\" is an integrity-only (AH) suite; ESP needs encryption, {}",
                    suite_kind_hint()
                ),
            ),
            Protocol::Ah if s.enc.is_some() => v.err(
                suite_at,
                format!(
                    "AH takes an integrity algorithm only (sha1, sha256, sha384, sha512, \
                     aesxcbc, md5), not \"{suite_text}\""
                ),
            ),
            _ => {
                if let Err(e) = s.check_policy(allow_insecure) {
                    let mut m = e.to_string();
                    if matches!(e, SuiteError::Insecure(_)) {
                        m.push_str(" (allow_insecure = true on this connection)");
                    }
                    v.err(suite_at, m);
                }
            }
        }
    }
    let spi_in = v.check(
        at.key("spi_in", Some(r.spi_in.span())),
        parse_spi(r.spi_in.get_ref()),
    );
    let spi_out = v.check(
        at.key("spi_out", Some(r.spi_out.span())),
        parse_spi(r.spi_out.get_ref()),
    );

    // A suite of the wrong kind for the protocol (refused above) says
    // nothing about the keys: they are not measured against it, which
    // would only add misleading errors ("AH has no encryption key" at an
    // AH integrity key).
    let fits = |s: &Suite| match protocol {
        Protocol::Esp | Protocol::Qesp => s.enc.is_some(),
        Protocol::Ah => s.enc.is_none(),
    };
    let (enc_len, integ_len) = suite.filter(fits).map_or((None, None), |s| {
        (Some(s.enc_key_len()), Some(s.integ_key_len()))
    });
    let salt = suite.and_then(|s| s.enc).is_some_and(|e| e.is_combined());
    let suite_name = suite.map(|s| s.name()).unwrap_or_default();
    let mut keys: Vec<Option<Zeroizing<Vec<u8>>>> = Vec::new();
    for (k, inline, file, need, what) in [
        ("enc_in", &r.enc_in, &r.enc_in_file, enc_len, "encryption"),
        (
            "enc_out",
            &r.enc_out,
            &r.enc_out_file,
            enc_len,
            "encryption",
        ),
        (
            "integ_in",
            &r.integ_in,
            &r.integ_in_file,
            integ_len,
            "integrity",
        ),
        (
            "integ_out",
            &r.integ_out,
            &r.integ_out_file,
            integ_len,
            "integrity",
        ),
    ] {
        let file_k = format!("{k}_file");
        let given = inline.is_some() || file.is_some();
        let inline_at = at.key(k, span(inline));
        let file_at = at.key(&file_k, span(file));
        // Messages point at whichever form was used.
        let here = if file.is_some() {
            file_at.clone()
        } else {
            inline_at.clone()
        };
        let key = match (inline, file) {
            (Some(_), Some(_)) => {
                v.err(
                    file_at,
                    format!("{k} and {file_k} are both given; keep one"),
                );
                None
            }
            (Some(h), None) => {
                v.inline_keys = true;
                v.check(inline_at, decode_hex(h.get_ref().expose()))
            }
            (None, Some(f)) => key_file(v, file_at, f.get_ref()),
            (None, None) => Some(Zeroizing::new(Vec::new())),
        };
        let (Some(key), Some(need)) = (key, need) else {
            keys.push(None);
            continue;
        };
        let with_salt = if salt && what == "encryption" {
            " including the 4-byte salt"
        } else {
            ""
        };
        if need == 0 && given {
            let why = if protocol == Protocol::Ah {
                "AH has no encryption key".to_string()
            } else if salt {
                format!("{suite_name} authenticates by itself and takes no integrity key")
            } else {
                format!("{suite_name} takes no {what} key")
            };
            v.err(here, format!("{why}; remove {k}"));
            keys.push(None);
        } else if need > 0 && !given {
            v.err(
                here,
                format!(
                    "{k} is required: {suite_name} needs a {need}-byte {what} key{with_salt} \
                     ({} hex digits), as {k} = \"HEX\" or {file_k} = \"PATH\"",
                    need * 2
                ),
            );
            keys.push(None);
        } else if key.len() != need {
            v.err(
                here,
                format!(
                    "{suite_name} needs a {need}-byte {what} key{with_salt} ({} hex digits), \
                     got {} ({} hex digits)",
                    need * 2,
                    plural(key.len(), "byte"),
                    key.len() * 2
                ),
            );
            keys.push(None);
        } else {
            keys.push(Some(key));
        }
    }
    let mut keys = keys.into_iter();
    let (enc_in, enc_out, integ_in, integ_out) =
        (keys.next()??, keys.next()??, keys.next()??, keys.next()??);
    // Same key both ways.
    if v.error_count() == before {
        for (a, b, out_k, out, out_file) in [
            (&enc_in, &enc_out, "enc_out", &r.enc_out, &r.enc_out_file),
            (
                &integ_in,
                &integ_out,
                "integ_out",
                &r.integ_out,
                &r.integ_out_file,
            ),
        ] {
            if a.is_empty() || a[..] != b[..] {
                continue;
            }
            let here = at.key(out_k, span(out).or_else(|| span(out_file)));
            if salt && out_k == "enc_out" {
                v.err(
                    here,
                    "the same key in both directions: both sides start at sequence \
                     number 1, so AES-GCM/ChaCha20 nonces repeat (catastrophic); use \
                     a different key per direction",
                );
            } else {
                v.warn(
                    here,
                    "the same key in both directions lets an attacker reflect our own \
                     packets back to us; use a different key per direction",
                );
            }
        }
    }
    if v.error_count() != before {
        return None;
    }
    Some(ManualSa {
        suite: suite?,
        spi_in: spi_in?,
        spi_out: spi_out?,
        enc_in,
        enc_out,
        integ_in,
        integ_out,
    })
}

/// A key file: hex text, read into a wiped buffer; readable by others
/// draws a warning.
fn key_file(v: &mut Validator, at: At, f: &str) -> Option<Zeroizing<Vec<u8>>> {
    let file = v.base_dir.join(f);
    let text = match read_secret_text(&file, MAX_KEY_FILE_BYTES) {
        Ok(t) => t,
        Err(e) => {
            v.err(at, format!("cannot read key file {}: {e}", file.display()));
            return None;
        }
    };
    if let Some(mode) = group_other_readable(&file) {
        v.warn(
            at.clone(),
            format!(
                "key file {} is readable by group/others (mode {mode:04o}); chmod 600 it",
                file.display()
            ),
        );
    }
    v.check(
        at,
        decode_hex(&text).map_err(|e| format!("key file {}: {e}", file.display())),
    )
}

/// Checks `[connection.lifetime]` (`at` is the table; absent: no limits).
pub(crate) fn lifetime(v: &mut Validator, at: &At, t: Option<&LifetimeTable>) -> Option<Lifetime> {
    let before = v.error_count();
    let empty = LifetimeTable::default();
    let t = t.unwrap_or(&empty);
    let size = |v: &mut Validator, k: &str, s: &Option<Spanned<Scalar>>| -> Option<u64> {
        let s = s.as_ref()?;
        v.check(at.key(k, Some(s.span())), s.get_ref().size())
            .flatten()
    };
    let soft_bytes = size(v, "soft_bytes", &t.soft_bytes);
    let hard_bytes = size(v, "hard_bytes", &t.hard_bytes);
    let soft_packets = size(v, "soft_packets", &t.soft_packets);
    let hard_packets = size(v, "hard_packets", &t.hard_packets);
    let time = |v: &mut Validator, k: &str, s: &Option<Spanned<Scalar>>| {
        let s = s.as_ref()?;
        v.check(at.key(k, Some(s.span())), s.get_ref().duration())
            .flatten()
    };
    let soft_time = time(v, "soft_time", &t.soft_time);
    let hard_time = time(v, "hard_time", &t.hard_time);
    let pairs = [
        (
            "soft_bytes",
            span(&t.soft_bytes),
            soft_bytes.map(u128::from),
            "hard_bytes",
            hard_bytes.map(u128::from),
        ),
        (
            "soft_packets",
            span(&t.soft_packets),
            soft_packets.map(u128::from),
            "hard_packets",
            hard_packets.map(u128::from),
        ),
        (
            "soft_time",
            span(&t.soft_time),
            soft_time.map(|d| u128::from(d.as_secs())),
            "hard_time",
            hard_time.map(|d| u128::from(d.as_secs())),
        ),
    ];
    for (sk, sspan, s, hk, h) in pairs {
        if let (Some(s), Some(h)) = (s, h) {
            if s >= h {
                v.err(
                    at.key(sk, sspan),
                    format!(
                        "the soft limit ({s}) must be below the hard limit {hk} ({h}): \
                         it warns before the SA expires"
                    ),
                );
            }
        }
    }
    (v.error_count() == before).then_some(Lifetime {
        soft_bytes,
        hard_bytes,
        soft_packets,
        hard_packets,
        soft_time,
        hard_time,
    })
}

/// The table that says exactly this lifetime (0: no limit).
pub(crate) fn lifetime_table(l: &Lifetime) -> LifetimeTable {
    let size = |n: Option<u64>| Some(value(Scalar::Int(n.map_or(0, |n| n as i64))));
    let time = |d: Option<std::time::Duration>| {
        Some(value(Scalar::Str(format_duration(d.unwrap_or_default()))))
    };
    LifetimeTable {
        soft_bytes: size(l.soft_bytes),
        hard_bytes: size(l.hard_bytes),
        soft_packets: size(l.soft_packets),
        hard_packets: size(l.hard_packets),
        soft_time: time(l.soft_time),
        hard_time: time(l.hard_time),
    }
}

pub(crate) fn family(a: IpAddr) -> &'static str {
    if a.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

/// The prefixes of one selector list with the place of each (items the
/// file does not have are placed at the list, or at the connection).
struct Selectors {
    list: At,
    prefixes: Vec<Prefix>,
    spans: Vec<Option<Range<usize>>>,
}

impl Selectors {
    fn at(&self, j: usize) -> At {
        self.list.index(j, self.spans.get(j).cloned().flatten())
    }
}

/// Reads one selector list; `None` when an item is not a prefix.
fn selector_list(
    v: &mut Validator,
    conn: &At,
    k: &str,
    list: &Option<Spanned<Vec<Spanned<String>>>>,
) -> Option<Selectors> {
    let at = conn.key(k, span(list));
    let mut out = Selectors {
        list: at.clone(),
        prefixes: Vec::new(),
        spans: Vec::new(),
    };
    let mut ok = true;
    for (j, s) in list.iter().flat_map(|l| l.get_ref()).enumerate() {
        let here = at.index(j, Some(s.span()));
        let text = s.get_ref();
        match text.trim().parse::<Prefix>() {
            Ok(pf) => {
                let given = text.trim().split_once('/').map(|(a, _)| a);
                if given
                    .and_then(|a| a.parse::<IpAddr>().ok())
                    .is_some_and(|a| a != pf.addr())
                {
                    v.warn(here, format!("\"{text}\" has host bits set; it means {pf}"));
                }
                out.prefixes.push(pf);
                out.spans.push(Some(s.span()));
            }
            Err(e) => {
                v.err(
                    here,
                    format!("\"{text}\": {e}; expected a prefix like \"10.1.0.0/16\""),
                );
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

/// Checks `local_ts` and `remote_ts` of the connection at `conn` and fills
/// in transport mode's defaults (the two hosts). Empty lists when either
/// has an error.
pub(crate) fn selectors(
    v: &mut Validator,
    conn: &At,
    mode: Mode,
    (local, remote): (Option<IpAddr>, Option<IpAddr>),
    local_ts: &Option<Spanned<Vec<Spanned<String>>>>,
    remote_ts: &Option<Spanned<Vec<Spanned<String>>>>,
) -> (Vec<Prefix>, Vec<Prefix>) {
    let l = selector_list(v, conn, "local_ts", local_ts);
    let r = selector_list(v, conn, "remote_ts", remote_ts);
    let (Some(mut l), Some(mut r)) = (l, r) else {
        return (Vec::new(), Vec::new());
    };
    match mode {
        Mode::Tunnel => {
            for (k, list, side) in [
                ("local_ts", &l, "the networks behind this gateway"),
                ("remote_ts", &r, "the networks behind the peer"),
            ] {
                if list.prefixes.is_empty() {
                    v.err(
                        list.list.clone(),
                        format!(
                            "tunnel mode needs traffic selectors: set {k} to {side}, \
                             for example {k} = [\"10.{}.0.0/16\"]",
                            if k == "local_ts" { 1 } else { 2 }
                        ),
                    );
                }
            }
        }
        Mode::Transport => {
            // Transport mode protects the two hosts' own traffic.
            if local_ts.is_none() {
                l.prefixes.extend(local.map(Prefix::host));
            }
            if remote_ts.is_none() {
                r.prefixes.extend(remote.map(Prefix::host));
            }
            for (k, list, addr) in [("local_ts", &l, local), ("remote_ts", &r, remote)] {
                let Some(a) = addr else { continue };
                if list.prefixes.is_empty() {
                    v.err(
                        list.list.clone(),
                        "an empty list selects no traffic; omit it for the default",
                    );
                    continue;
                }
                for (j, pf) in list.prefixes.iter().enumerate() {
                    if pf.addr().is_ipv4() != a.is_ipv4() {
                        v.err(
                            list.at(j),
                            format!(
                                "{pf} is {} but transport mode carries the hosts' own {} \
                                 packets (the addresses are not replaced)",
                                family(pf.addr()),
                                family(a)
                            ),
                        );
                    } else if !pf.contains(a) {
                        v.warn(
                            list.at(j),
                            format!(
                                "{pf} does not contain {} {a}: transport mode only carries \
                                 that host's own packets",
                                if k == "local_ts" { "local" } else { "remote" }
                            ),
                        );
                    }
                }
            }
        }
    }
    // Every family on one side needs a partner on the other.
    pair_families(v, &l, &r, "remote_ts");
    pair_families(v, &r, &l, "local_ts");
    (l.prefixes, r.prefixes)
}

/// Each prefix of `mine` needs a prefix of its family in `other` (said
/// `other_k` in the message), unless `other` is empty (an error of its
/// own).
fn pair_families(v: &mut Validator, mine: &Selectors, other: &Selectors, other_k: &str) {
    if other.prefixes.is_empty() {
        return;
    }
    for (j, pf) in mine.prefixes.iter().enumerate() {
        if !other
            .prefixes
            .iter()
            .any(|o| o.addr().is_ipv4() == pf.addr().is_ipv4())
        {
            v.err(
                mine.at(j),
                format!(
                    "{pf} is {} but {other_k} has no {} prefix to pair it with",
                    family(pf.addr()),
                    family(pf.addr())
                ),
            );
        }
    }
}

/// One further selector set of an IKE connection (a
/// `[[connection.ike.child]]` table), negotiated as a child SA of its own;
/// a side the table omits is the connection's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSelectors {
    /// Our side's selectors.
    pub local_ts: Vec<Prefix>,
    /// The peer side's selectors.
    pub remote_ts: Vec<Prefix>,
}

/// Where two selector sets (local prefixes, remote prefixes) overlap: a
/// local prefix of each that meet and a remote prefix of each that meet
/// (two prefixes meet when one contains the other, never across
/// families). `None`: they are disjoint. Identical sets overlap.
pub(crate) fn sets_overlap(
    (al, ar): (&[Prefix], &[Prefix]),
    (bl, br): (&[Prefix], &[Prefix]),
) -> Option<((Prefix, Prefix), (Prefix, Prefix))> {
    let meet = |x: &[Prefix], y: &[Prefix]| {
        x.iter().find_map(|p| {
            y.iter()
                .find(|q| p.contains(q.addr()) || q.contains(p.addr()))
                .map(|q| (*p, *q))
        })
    };
    Some((meet(al, bl)?, meet(ar, br)?))
}

/// Reads `local_ts` and `remote_ts` of one `[[connection.ike.child]]` (at
/// `at`, a tunnel-mode connection's): a side the table omits is the
/// connection's own (`own`). The lists the table gives are checked as the
/// connection's are: a prefix each, not empty, and each prefix with a
/// prefix of its family on the other side. `None` when either has an
/// error.
pub(crate) fn child_selectors(
    v: &mut Validator,
    at: &At,
    (own_local, own_remote): (&[Prefix], &[Prefix]),
    local_ts: &Option<Spanned<Vec<Spanned<String>>>>,
    remote_ts: &Option<Spanned<Vec<Spanned<String>>>>,
) -> Option<(Vec<Prefix>, Vec<Prefix>)> {
    let before = v.error_count();
    let l = selector_list(v, at, "local_ts", local_ts);
    let r = selector_list(v, at, "remote_ts", remote_ts);
    let (Some(mut l), Some(mut r)) = (l, r) else {
        return None;
    };
    for (k, list, given, own) in [
        ("local_ts", &mut l, local_ts.is_some(), own_local),
        ("remote_ts", &mut r, remote_ts.is_some(), own_remote),
    ] {
        if !given {
            list.prefixes = own.to_vec();
        } else if list.prefixes.is_empty() {
            v.err(
                list.list.clone(),
                format!("an empty list selects no traffic; omit {k} for the connection's own"),
            );
        }
    }
    let name = |k: &str, given: bool| {
        if given {
            k.to_string()
        } else {
            format!("the connection's {k} (this child's, as it sets none)")
        }
    };
    if local_ts.is_some() {
        pair_families(v, &l, &r, &name("remote_ts", remote_ts.is_some()));
    }
    if remote_ts.is_some() {
        pair_families(v, &r, &l, &name("local_ts", local_ts.is_some()));
    }
    (v.error_count() == before).then_some((l.prefixes, r.prefixes))
}

#[cfg(test)]
mod tests {
    use super::decode_hex;
    use crate::schema::Scalar;
    use crate::test_util::*;
    use std::path::Path;
    use std::time::Duration;

    #[test]
    fn reserved_and_oversized_spis() {
        let e = err(&conn("b", "", &good_esp(0xff, 0x1002)));
        assert_has(
            &e,
            &[
                "connection[0].esp.spi_in",
                "SPI 0xff is reserved",
                "RFC 4301",
            ],
        );
        let e = err(&minimal().replace("spi_out = 0x1002", "spi_out = 0x100000000"));
        assert_has(
            &e,
            &["connection[0].esp.spi_out", "does not fit in 32 bits"],
        );
        // SPIs may also be strings, as setkey prints them.
        let c =
            parse_str(&minimal().replace("spi_out = 0x1002", "spi_out = \"0xc0ffee02\"")).unwrap();
        assert_eq!(c.connections[0].esp().unwrap().spi_out, 0xc0ffee02);
    }

    #[test]
    fn key_lengths_say_how_many_hex_digits() {
        let e = err(&minimal().replace(K20A, &K20A[..32]));
        assert_has(
            &e,
            &[
                "connection[0].esp.enc_in",
                "aes128gcm16 needs a 20-byte encryption key including the 4-byte salt \
                 (40 hex digits), got 16 bytes (32 hex digits)",
            ],
        );
        let e = err(&minimal()
            .replace("aes128gcm16", "aes128-sha256")
            .replace(K20A, &K20A[..32]));
        assert_has(
            &e,
            &[
                "connection[0].esp.integ_in (connection \"b\"): integ_in is required",
                "32-byte integrity key (64 hex digits)",
            ],
        );
        let e = err(&minimal().replace(
            &format!("enc_out = \"{K20B}\""),
            &format!("enc_out = \"{K20B}\"\ninteg_out = \"{K20A}\""),
        ));
        assert_has(
            &e,
            &[
                "connection[0].esp.integ_out",
                "authenticates by itself",
                "remove integ_out",
            ],
        );
        let e = err(&minimal().replace(&format!("enc_out = \"{K20B}\""), ""));
        assert_has(
            &e,
            &[
                "connection[0].esp.enc_out",
                "enc_out is required",
                "40 hex digits",
            ],
        );
    }

    #[test]
    fn insecure_suites_need_allow_insecure() {
        let des = minimal()
            .replace("aes128gcm16", "3des-sha1")
            .replace(K20A, &format!("{K20A}{}", &K20B[..8]))
            .replace(
                &format!("enc_out = \"{K20B}\""),
                &format!(
                    "enc_out = \"{K20B}{}\"\ninteg_in = \"{K20A}\"\ninteg_out = \"{K20B}\"",
                    &K20A[..8]
                ),
            );
        let e = err(&des);
        assert_has(
            &e,
            &[
                "connection[0].esp.suite",
                "3des encryption is insecure",
                "(allow_insecure = true on this connection)",
            ],
        );
        let ok = des.replace("name = \"b\"", "name = \"b\"\nallow_insecure = true");
        let c = parse_str(&ok).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.connections[0].sa_configs().outbound[0].allow_insecure);
        let e = err(&minimal()
            .replace("aes128gcm16", "aes128")
            .replace(K20A, &K20A[..32])
            .replace(K20B, &K20B[..32]));
        assert_has(
            &e,
            &[
                "esp.suite",
                "aes128 without an integrity algorithm is insecure",
            ],
        );
        let e = err(&minimal().replace("aes128gcm16", "rot13"));
        assert_has(
            &e,
            &["connection[0].esp.suite", "unknown suite keyword 'rot13'"],
        );
        let e = err(&minimal().replace("aes128gcm16", "sha256"));
        assert_has(
            &e,
            &["connection[0].esp.suite", "integrity-only (AH) suite"],
        );
    }

    #[test]
    fn tunnel_mode_needs_selectors() {
        let e = err(&minimal().replace("local_ts = [\"10.1.0.0/16\"]\n", ""));
        assert_has(
            &e,
            &[
                "connection[0].local_ts",
                "tunnel mode needs traffic selectors",
            ],
        );
        let e = err(&minimal().replace("[\"10.2.0.0/16\"]", "[]"));
        assert_has(
            &e,
            &[
                "connection[0].remote_ts",
                "tunnel mode needs traffic selectors",
            ],
        );
        let e = err(&minimal().replace("[\"10.2.0.0/16\"]", "[\"2001:db8::/32\"]"));
        assert_has(
            &e,
            &[
                "connection[0].local_ts[0]",
                "10.1.0.0/16 is IPv4 but remote_ts has no IPv4 prefix",
            ],
        );
        let e = err(&minimal().replace("10.2.0.0/16", "10.2.0.0/40"));
        assert_has(
            &e,
            &["connection[0].remote_ts[0]", "prefix length 40 too long"],
        );
        // Host bits are a warning.
        let c = parse_str(&minimal().replace("10.2.0.0/16", "10.2.3.4/16")).unwrap();
        assert_has(
            &c.warnings.join("\n"),
            &["remote_ts[0]", "host bits set; it means 10.2.0.0/16"],
        );
        // Transport mode defaults to the two hosts.
        let t = minimal().replace(
            "local_ts = [\"10.1.0.0/16\"]\nremote_ts = [\"10.2.0.0/16\"]\n",
            "mode = \"transport\"\n",
        );
        let c = parse_str(&t).unwrap_or_else(|e| panic!("{e}"));
        let s = c.connections[0].selectors();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].local, "192.0.2.1/32".parse().unwrap());
        assert_eq!(s[0].remote, "192.0.2.2/32".parse().unwrap());
        // ...and, without a fwmark, routing the peer into the TUN is flagged.
        assert_has(
            &c.warnings.join("\n"),
            &["contains the peer's outer address 192.0.2.2"],
        );
    }

    #[test]
    fn keys_inline_xor_file_and_files_must_exist() {
        let e = err(&minimal().replace(
            &format!("enc_in = \"{K20A}\""),
            &format!("enc_in = \"{K20A}\"\nenc_in_file = \"k\""),
        ));
        assert_has(
            &e,
            &[
                "connection[0].esp.enc_in_file",
                "enc_in and enc_in_file are both given; keep one",
            ],
        );
        let e = err(&minimal().replace(
            &format!("enc_in = \"{K20A}\""),
            "enc_in_file = \"keys/missing\"",
        ));
        assert_has(
            &e,
            &[
                "connection[0].esp.enc_in_file",
                "cannot read key file /nonexistent/keys/missing",
                "No such file",
            ],
        );
        if Path::new("/dev/zero").exists() {
            let e = err(&minimal().replace(
                &format!("enc_in = \"{K20A}\""),
                "enc_in_file = \"/dev/zero\"",
            ));
            assert_has(
                &e,
                &["esp.enc_in_file", "/dev/zero: larger than 65536 bytes"],
            );
        }
    }

    #[test]
    fn invalid_hex_is_reported_without_the_key() {
        let bad = "00010203040506070809zz0b0c0d0e0f10111213";
        let e = err(&minimal().replace(K20A, bad));
        assert_has(
            &e,
            &[
                "connection[0].esp.enc_in",
                "not hex: character 21 is not a hex digit",
            ],
        );
        assert!(!e.contains(bad) && !e.contains("zz"), "{e}");
        let e = err(&minimal().replace(K20A, &K20A[..39]));
        assert_has(&e, &["esp.enc_in", "odd number of hex digits (39)"]);
        let e = err(&minimal().replace(&format!("\"{K20A}\""), "12345"));
        assert_has(
            &e,
            &[
                "esp.enc_in",
                "a key must be a string of hex digits in quotes",
            ],
        );
        assert!(!e.contains("12345"), "{e}");
        // Whitespace and a 0x prefix are fine.
        let spaced = format!("0x{} {}\\t", &K20A[..20], &K20A[20..]);
        let c = parse_str(&minimal().replace(K20A, &spaced)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.connections[0].esp().unwrap().enc_in[19], 0x13);
        assert_eq!(&decode_hex("0a 0B\n\t0c").unwrap()[..], &[10, 11, 12]);
        // A character that is not ASCII is counted as one character.
        assert_eq!(
            decode_hex("00é1").unwrap_err(),
            "not hex: character 3 is not a hex digit (0-9, a-f)"
        );
    }

    #[cfg(unix)]
    #[test]
    fn key_files_readable_by_others_warn() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir();
        std::fs::create_dir(dir.join("keys")).unwrap();
        let src = examples_dir();
        for f in [
            "esp-ah-bundle.toml",
            "keys/mgmt.integ_in",
            "keys/mgmt.integ_out",
        ] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        let set = |f: &str, mode: u32| {
            std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(mode)).unwrap()
        };
        set("esp-ah-bundle.toml", 0o600);
        set("keys/mgmt.integ_in", 0o600);
        set("keys/mgmt.integ_out", 0o600);
        let c = crate::load(&dir.join("esp-ah-bundle.toml")).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);

        set("keys/mgmt.integ_out", 0o644);
        let c = crate::load(&dir.join("esp-ah-bundle.toml")).unwrap();
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert_has(
            &c.warnings[0],
            &[
                "connection[1].ah.integ_out_file (connection \"mgmt\")",
                "key file ",
                "keys/mgmt.integ_out is readable by group/others (mode 0644); chmod 600 it",
            ],
        );
        // Inline keys make the config file itself a secret.
        set("keys/mgmt.integ_out", 0o600);
        set("esp-ah-bundle.toml", 0o640);
        let c = crate::load(&dir.join("esp-ah-bundle.toml")).unwrap();
        assert_has(
            &c.warnings.join("\n"),
            &["holds inline keys and is readable by group/others (mode 0640)"],
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn same_key_both_ways() {
        let e = err(&minimal().replace(K20B, K20A));
        assert_has(&e, &["connection[0].esp.enc_out", "nonces repeat"]);
        let c = parse_str(&ah_conn("encap = \"none\"").replace(K20B, K20A)).unwrap();
        assert_has(&c.warnings.join("\n"), &["ah.integ_out", "reflect"]);
    }

    #[test]
    fn sizes_and_durations() {
        let s = |v: &str| Scalar::Str(v.into()).size();
        assert_eq!(s("1G"), Ok(Some(1 << 30)));
        assert_eq!(s("512M"), Ok(Some(512 << 20)));
        assert_eq!(s("4k"), Ok(Some(4096)));
        assert_eq!(s("2TiB"), Ok(Some(2 << 40)));
        assert_eq!(s("10KB"), Ok(Some(10 << 10)));
        assert_eq!(s("1000"), Ok(Some(1000)));
        assert_eq!(s("0"), Ok(None));
        assert_eq!(Scalar::Int(5).size(), Ok(Some(5)));
        assert_eq!(Scalar::Int(0).size(), Ok(None));
        for bad in ["", "G", "1X", "1.5G", "-1", "1 G B", "99999999999T"] {
            assert!(s(bad).is_err(), "{bad:?}");
        }
        assert!(Scalar::Int(-1).size().unwrap_err().contains("negative"));

        let d = |v: &str| Scalar::Str(v.into()).duration();
        let secs = |n| Ok(Some(Duration::from_secs(n)));
        assert_eq!(d("90s"), secs(90));
        assert_eq!(d("50m"), secs(3000));
        assert_eq!(d("1h"), secs(3600));
        assert_eq!(d("1d"), secs(86400));
        assert_eq!(d("1h30m"), secs(5400));
        assert_eq!(d("2h 15s"), secs(7215));
        assert_eq!(d("120"), secs(120));
        assert_eq!(d("0s"), Ok(None));
        assert_eq!(Scalar::Int(60).duration(), secs(60));
        for bad in [
            "",
            "1w",
            "h",
            "1.5h",
            "10 minutes",
            "1h30",
            "-5s",
            "99999999999999999999s",
        ] {
            assert!(d(bad).is_err(), "{bad:?}");
        }

        // In a file: errors name the key.
        let life = |l: &str| {
            minimal().replace(
                "name = \"b\"",
                &format!("name = \"b\"\nlifetime = {{ {l} }}"),
            )
        };
        let e = err(&life("soft_bytes = \"1Q\""));
        assert_has(
            &e,
            &["connection[0].lifetime.soft_bytes", "\"1Q\" is not a size"],
        );
        let e = err(&life("hard_time = \"1 fortnight\""));
        assert_has(
            &e,
            &["connection[0].lifetime.hard_time", "is not a duration"],
        );
        let e = err(&life("soft_time = \"2h\", hard_time = \"1h\""));
        assert_has(
            &e,
            &[
                "connection[0].lifetime.soft_time",
                "soft limit (7200) must be below the hard limit hard_time (3600)",
            ],
        );
        let e = err(&life("soft_packets = true"));
        assert_has(
            &e,
            &[
                "connection[0].lifetime.soft_packets",
                "an integer or a string",
            ],
        );
        let c = parse_str(&life("hard_packets = 1000000, soft_time = 60")).unwrap();
        let l = c.connections[0].lifetime;
        assert_eq!(
            (l.hard_packets, l.soft_time),
            (Some(1_000_000), Some(Duration::from_secs(60)))
        );
    }
}
