//! `espgate keygen`: a private key for IKE signature authentication
//! (Ed25519, ECDSA P-256 or P-384, as unencrypted PKCS#8 PEM) and optionally
//! its public key (`PUBLIC KEY` PEM, the SubjectPublicKeyInfo), or a random
//! pre-shared key.
//!
//! Secret files are created with mode 0600 from the start (never written
//! first and restricted later), and an existing file is kept unless the
//! caller forces: then the new file is written next to it and renamed over
//! it, so the result has mode 0600 whatever the old file had.

use anyhow::{bail, Context, Result};
use espgate_ike::sig::{generate_psk, KeyKind, PrivateKey};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// An Ed25519 key (RFC 8420 signatures).
    Ed25519,
    /// An ECDSA key on P-256.
    EcdsaP256,
    /// An ECDSA key on P-384.
    EcdsaP384,
    /// 32 random bytes, base64 text (44 characters): a pre-shared key used
    /// as text, for `psk_file` here and `secret = "..."` in strongSwan.
    Psk,
}

impl KeyType {
    /// The `--type` keywords, in the order `--help` lists them.
    pub const NAMES: [&'static str; 4] = ["ed25519", "ecdsa-p256", "ecdsa-p384", "psk"];

    /// The `--type` keyword.
    pub fn name(self) -> &'static str {
        match self {
            KeyType::Ed25519 => "ed25519",
            KeyType::EcdsaP256 => "ecdsa-p256",
            KeyType::EcdsaP384 => "ecdsa-p384",
            KeyType::Psk => "psk",
        }
    }

    /// The key kind for signature keys; `None` for a PSK.
    pub fn key_kind(self) -> Option<KeyKind> {
        match self {
            KeyType::Ed25519 => Some(KeyKind::Ed25519),
            KeyType::EcdsaP256 => Some(KeyKind::EcdsaP256),
            KeyType::EcdsaP384 => Some(KeyKind::EcdsaP384),
            KeyType::Psk => None,
        }
    }
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KeyType {
    type Err = String;
    fn from_str(s: &str) -> Result<KeyType, String> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "ed25519" => KeyType::Ed25519,
            "ecdsa-p256" | "p256" | "ecdsa256" => KeyType::EcdsaP256,
            "ecdsa-p384" | "p384" | "ecdsa384" => KeyType::EcdsaP384,
            "psk" => KeyType::Psk,
            _ => {
                return Err(format!(
                    "'{s}' is not a key type: expected {}",
                    KeyType::NAMES.join(", ")
                ))
            }
        })
    }
}

/// `espgate keygen`'s options.
#[derive(Debug, Clone)]
pub struct Options {
    /// What to generate.
    pub kind: KeyType,
    /// The private key or PSK file (created with mode 0600).
    pub out: PathBuf,
    /// Also write the public key here (signature keys only; mode 0644).
    pub public: Option<PathBuf>,
    /// Replace existing files.
    pub force: bool,
}

/// Generates what `opts` asks for and writes the files. Returns one line
/// per file written, saying what it holds (no key material).
pub fn run(opts: &Options) -> Result<Vec<String>> {
    if opts.kind == KeyType::Psk && opts.public.is_some() {
        bail!("--pub is for signature keys: a pre-shared key has no public part");
    }
    if opts.public.as_deref() == Some(opts.out.as_path()) {
        bail!("--out and --pub name the same file");
    }
    // Refuse before writing anything, so no half of a pair is left behind.
    if !opts.force {
        for p in std::iter::once(&opts.out).chain(opts.public.as_ref()) {
            if std::fs::symlink_metadata(p).is_ok() {
                bail!("{} exists; --force replaces it", p.display());
            }
        }
    }
    let mut done = Vec::new();
    match opts.kind.key_kind() {
        None => {
            let psk = generate_psk().context("generating the pre-shared key")?;
            let mut text = zeroize::Zeroizing::new(String::with_capacity(psk.len() + 1));
            text.push_str(&psk);
            text.push('\n');
            write_file(&opts.out, text.as_bytes(), 0o600, opts.force)?;
            done.push(format!(
                "wrote a new pre-shared key (32 random bytes as {} base64 characters, used as \
                 text) to {} (mode 0600)",
                psk.len(),
                opts.out.display()
            ));
        }
        Some(kind) => {
            let key = PrivateKey::generate(kind).context("generating the key")?;
            let pem = key.to_pkcs8_pem().context("encoding the key")?;
            write_file(&opts.out, pem.as_bytes(), 0o600, opts.force)?;
            done.push(format!(
                "wrote a new {kind} private key (PKCS#8 PEM) to {} (mode 0600)",
                opts.out.display()
            ));
            if let Some(p) = &opts.public {
                let pem = public_key_pem(key.public_key().spki_der());
                write_file(p, pem.as_bytes(), 0o644, opts.force)?;
                done.push(format!(
                    "wrote its public key (PUBLIC KEY PEM) to {}",
                    p.display()
                ));
            }
        }
    }
    Ok(done)
}

/// A DER SubjectPublicKeyInfo as `PUBLIC KEY` PEM (RFC 7468 §13): base64
/// in lines of 64 characters.
pub fn public_key_pem(spki_der: &[u8]) -> String {
    let b64 = base64(spki_der);
    let mut out = String::from("-----BEGIN PUBLIC KEY-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END PUBLIC KEY-----\n");
    out
}

/// Standard base64 with padding (RFC 4648 §4). For public data only: it
/// uses table lookups indexed by the data.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Creates `path` with `mode` and writes `data`, synced. Without `force`
/// an existing file (or symbolic link) is an error; with it, the data
/// goes to a new file in the same directory that is then renamed over
/// `path`, so `path` ends up with `mode` and never holds a partial file.
pub fn write_file(path: &Path, data: &[u8], mode: u32, force: bool) -> Result<()> {
    if !force {
        let mut f =
            create_new(path, mode).with_context(|| match std::fs::symlink_metadata(path) {
                Ok(_) => format!("{} exists; --force replaces it", path.display()),
                Err(_) => format!("cannot create {}", path.display()),
            })?;
        return fill(&mut f, data).with_context(|| format!("writing {}", path.display()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a file name", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".espgate-keygen-{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let mut f =
        create_new(&tmp, mode).with_context(|| format!("cannot create {}", tmp.display()))?;
    let r = fill(&mut f, data)
        .with_context(|| format!("writing {}", tmp.display()))
        .and_then(|_| {
            std::fs::rename(&tmp, path)
                .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
        });
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

fn create_new(path: &Path, mode: u32) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let f = o.open(path)?;
    // The umask may have taken bits away, never added any; make it exact.
    #[cfg(unix)]
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    Ok(f)
}

fn fill(f: &mut File, data: &[u8]) -> std::io::Result<()> {
    f.write_all(data)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_ike::sig::PublicKey;
    use std::os::unix::fs::PermissionsExt;

    fn temp_dir() -> PathBuf {
        espgate_testkit::temp_dir("keygen-test")
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn opts(kind: KeyType, out: PathBuf, public: Option<PathBuf>, force: bool) -> Options {
        Options {
            kind,
            out,
            public,
            force,
        }
    }

    #[test]
    fn base64_rfc4648_vectors() {
        // RFC 4648 §10.
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o, "{i:?}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn key_types_parse() {
        for n in KeyType::NAMES {
            assert_eq!(n.parse::<KeyType>().unwrap().name(), n);
        }
        assert!("rsa"
            .parse::<KeyType>()
            .unwrap_err()
            .contains("ed25519, ecdsa-p256"));
    }

    #[test]
    fn signature_keys_round_trip_with_mode_0600() {
        let d = temp_dir();
        for (t, kind) in [
            (KeyType::Ed25519, KeyKind::Ed25519),
            (KeyType::EcdsaP256, KeyKind::EcdsaP256),
            (KeyType::EcdsaP384, KeyKind::EcdsaP384),
        ] {
            let (key, public) = (d.join(format!("{t}.key")), d.join(format!("{t}.pub")));
            let lines = run(&opts(t, key.clone(), Some(public.clone()), false)).unwrap();
            assert_eq!(lines.len(), 2);
            assert!(
                lines[0].contains("PKCS#8") && lines[0].contains("mode 0600"),
                "{lines:?}"
            );
            assert_eq!(mode(&key), 0o600);
            assert_eq!(mode(&public), 0o644);
            let k = PrivateKey::from_pem(&std::fs::read(&key).unwrap()).unwrap();
            assert_eq!(k.kind(), kind);
            let text = std::fs::read_to_string(&key).unwrap();
            assert!(text.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{text}");
            let p = PublicKey::from_pem(&std::fs::read(&public).unwrap()).unwrap();
            assert_eq!(p, k.public_key());
            let ptext = std::fs::read_to_string(&public).unwrap();
            assert!(ptext.lines().all(|l| l.len() <= 64), "{ptext}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// openssl derives the same public key PEM from our private key file.
    #[test]
    fn public_key_pem_matches_openssl() {
        if std::process::Command::new("openssl")
            .arg("version")
            .output()
            .is_err()
        {
            eprintln!("openssl not installed; skipped");
            return;
        }
        let d = temp_dir();
        for t in [KeyType::Ed25519, KeyType::EcdsaP256, KeyType::EcdsaP384] {
            let (key, public) = (d.join(format!("{t}.key")), d.join(format!("{t}.pub")));
            run(&opts(t, key.clone(), Some(public.clone()), false)).unwrap();
            let out = std::process::Command::new("openssl")
                .args(["pkey", "-pubout", "-in"])
                .arg(&key)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8(out.stdout).unwrap(),
                std::fs::read_to_string(&public).unwrap(),
                "{t}"
            );
            let text = std::process::Command::new("openssl")
                .args(["pkey", "-noout", "-text", "-in"])
                .arg(&key)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&text.stdout).to_string();
            let want = match t {
                KeyType::Ed25519 => "ED25519 Private-Key",
                KeyType::EcdsaP256 => "prime256v1",
                _ => "secp384r1",
            };
            assert!(text.contains(want), "{t}: {text}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn psk_is_random_base64_text() {
        let d = temp_dir();
        let (a, b) = (d.join("a.psk"), d.join("b.psk"));
        let lines = run(&opts(KeyType::Psk, a.clone(), None, false)).unwrap();
        assert!(lines[0].contains("pre-shared key"), "{lines:?}");
        run(&opts(KeyType::Psk, b.clone(), None, false)).unwrap();
        assert_eq!(mode(&a), 0o600);
        let (ta, tb) = (
            std::fs::read_to_string(&a).unwrap(),
            std::fs::read_to_string(&b).unwrap(),
        );
        assert_eq!(ta.len(), 45);
        assert!(ta.ends_with("=\n"), "{ta:?}");
        assert_ne!(ta, tb);
        assert!(ta[..44]
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/' || c == b'='));
        let e = run(&opts(
            KeyType::Psk,
            d.join("c"),
            Some(d.join("c.pub")),
            false,
        ))
        .unwrap_err();
        assert!(e.to_string().contains("no public part"), "{e}");
        assert!(!d.join("c").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn existing_files_are_kept_unless_forced() {
        let d = temp_dir();
        let (key, public) = (d.join("k"), d.join("k.pub"));
        std::fs::write(&public, "old").unwrap();
        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o600)).unwrap();
        // The existing --pub stops everything, before the key is written.
        let e = run(&opts(
            KeyType::Ed25519,
            key.clone(),
            Some(public.clone()),
            false,
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("k.pub exists; --force replaces it"), "{e}");
        assert!(!key.exists());
        assert_eq!(std::fs::read_to_string(&public).unwrap(), "old");

        std::fs::write(&key, "old key").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = run(&opts(KeyType::Ed25519, key.clone(), None, false)).unwrap_err();
        assert!(e.to_string().contains("exists"), "{e}");
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "old key");

        // --force replaces both, and the key file ends with mode 0600.
        run(&opts(
            KeyType::EcdsaP256,
            key.clone(),
            Some(public.clone()),
            true,
        ))
        .unwrap();
        assert_eq!(mode(&key), 0o600);
        assert_eq!(mode(&public), 0o644);
        let k = PrivateKey::from_pem(&std::fs::read(&key).unwrap()).unwrap();
        assert_eq!(k.kind(), KeyKind::EcdsaP256);
        assert_eq!(
            PublicKey::from_pem(&std::fs::read(&public).unwrap()).unwrap(),
            k.public_key()
        );
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");

        // A symbolic link is not followed without --force.
        let link = d.join("link");
        std::os::unix::fs::symlink(d.join("nowhere"), &link).unwrap();
        assert!(run(&opts(KeyType::Psk, link.clone(), None, false)).is_err());
        assert!(!d.join("nowhere").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn same_file_twice_is_refused() {
        let d = temp_dir();
        let k = d.join("k");
        let e = run(&opts(KeyType::Ed25519, k.clone(), Some(k.clone()), false)).unwrap_err();
        assert!(e.to_string().contains("same file"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
